/* test_shard.c: td_shard_open, the one load + normalise + partition sequence
 * that peer runs and the standalone trainer share.
 *
 * Labelled data: every node's rows are normalised with the statistics of the
 * whole training set (not of its own partition), the partitions of all nodes
 * add up to the whole set, and a node left without rows is an error. An IDX
 * set is read row by row (only the node's rows are held): its rows are bit
 * for bit those of the whole set loaded, normalised and subset. Text:
 * node k gets the k-th contiguous range of the training bytes and every node
 * the same validation text. Every node's label counts come with the shard,
 * and with client_eval the node's held-out share of the test set. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/partition.h"
#include "compute/data/shard.h"

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/td-shard-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

/* 60 rows, label i % 3, one feature = i (mean 29.5 over all rows). */
static const char *write_csv(void) {
  static char path[128];
  snprintf(path, sizeof path, "%s/train.csv", tmpdir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 60; i++)
    fprintf(f, "%d,%d\n", i % 3, i);
  fclose(f);
  return path;
}

START_TEST(labelled_partitions_share_the_whole_sets_normalisation) {
  make_tmpdir();
  char spec[256], why[512] = "";
  snprintf(spec, sizeof spec, "csv:%s", write_csv());
  double mean = 29.5, sq = 0;
  for (int i = 0; i < 60; i++)
    sq += (i - mean) * (i - mean);
  double std = sqrt(sq / 60);
  size_t total = 0;
  for (unsigned k = 0; k < 2; k++) {
    td_shard_t s;
    td_shard_opts_t o = {.dataset = spec, .partition = "iid", .rank = k, .nodes = 2, .seed = 4};
    ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
    ck_assert_ptr_null(s.text_train);
    ck_assert_ptr_null(s.test);
    ck_assert_uint_eq(s.full_count, 60);
    ck_assert_uint_eq(td_dataset_rows(s.train), 30);
    const float *x = td_dataset_features_const(s.train);
    const int32_t *y = td_dataset_labels_const(s.train);
    for (size_t r = 0; r < 30; r++) {
      double raw = x[r] * std + mean; /* undo the whole-set normalisation */
      ck_assert_msg(fabs(raw - round(raw)) < 1e-4, "row %zu: %g", r, raw);
      ck_assert_int_eq(y[r], (int)round(raw) % 3);
    }
    total += td_dataset_rows(s.train);
    td_shard_close(&s);
    td_shard_close(&s); /* idempotent */
  }
  ck_assert_uint_eq(total, 60);

  /* a single node, or `all`, keeps every row */
  td_shard_t s;
  td_shard_opts_t all = {.dataset = spec, .partition = "all", .rank = 1, .nodes = 3, .seed = 4};
  ck_assert_int_eq(td_shard_open(&s, &all, why, sizeof why), 0);
  ck_assert_uint_eq(td_dataset_rows(s.train), 60);
  td_shard_close(&s);

  /* more nodes than rows: someone gets nothing, and says so */
  td_shard_opts_t many = {.dataset = spec, .partition = "iid", .rank = 0, .nodes = 100};
  ck_assert_int_eq(td_shard_open(&s, &many, why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "partition iid leaves node 0 of 100 without samples");
  ck_assert_ptr_null(s.train);
  remove_tmpdir();
}
END_TEST

static void put_be32(FILE *f, uint32_t v) {
  uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  fwrite(b, 1, 4, f);
}

/* An IDX pair of `rows` ubyte images of 3 x 5 and their labels (4 classes). */
static void write_idx(const char *images, const char *labels, uint32_t rows) {
  FILE *f = fopen(images, "wb");
  ck_assert_ptr_nonnull(f);
  put_be32(f, 0x0803);
  put_be32(f, rows);
  put_be32(f, 3);
  put_be32(f, 5);
  for (uint32_t i = 0; i < rows * 15; i++)
    fputc((int)((i * 37 + i / 15 * 11) % 256), f);
  fclose(f);
  f = fopen(labels, "wb");
  ck_assert_ptr_nonnull(f);
  put_be32(f, 0x0801);
  put_be32(f, rows);
  for (uint32_t i = 0; i < rows; i++)
    fputc((int)((i * 7) % 4), f);
  fclose(f);
}

/* The reference: the whole set loaded, normalised with its statistics, and
 * node k's rows copied, as nodes did before they read only their rows. */
static td_dataset_t *reference_rows(const char *spec, const char *partition, unsigned k,
                                    unsigned nodes, uint64_t seed) {
  td_dataset_t *train = NULL, *test = NULL, *sub = NULL;
  char why[512] = "";
  ck_assert_msg(td_dataset_open(&train, &test, spec, why, sizeof why) == 0, "%s", why);
  double mean, std;
  td_dataset_stats(train, &mean, &std);
  td_dataset_normalize(train, mean, std);
  td_partition_t part;
  ck_assert_int_eq(td_partition_parse(&part, partition, why, sizeof why), 0);
  uint32_t *idx = NULL;
  size_t n = 0;
  ck_assert_int_eq(td_partition_indices(&part, td_dataset_labels_const(train),
                                        td_dataset_rows(train), td_dataset_classes(train), k,
                                        nodes, seed, &idx, &n),
                   0);
  ck_assert_int_eq(td_dataset_subset(&sub, train, idx, n), 0);
  free(idx);
  td_dataset_close(&train);
  td_dataset_close(&test);
  return sub;
}

static void same_rows(const td_dataset_t *a, const td_dataset_t *b) {
  ck_assert_uint_eq(td_dataset_rows(a), td_dataset_rows(b));
  ck_assert_uint_eq(td_dataset_dim(a), td_dataset_dim(b));
  ck_assert_int_eq(td_dataset_classes(a), td_dataset_classes(b));
  size_t n = td_dataset_rows(a) * td_dataset_dim(a);
  ck_assert_mem_eq(td_dataset_features_const(a), td_dataset_features_const(b), n * sizeof(float));
  ck_assert_mem_eq(td_dataset_labels_const(a), td_dataset_labels_const(b),
                   td_dataset_rows(a) * sizeof(int32_t));
}

START_TEST(idx_partitions_are_read_row_by_row_bit_for_bit) {
  make_tmpdir();
  char images[128], labels[128], spec[300], why[512] = "";
  snprintf(images, sizeof images, "%s/img.idx", tmpdir);
  snprintf(labels, sizeof labels, "%s/lab.idx", tmpdir);
  write_idx(images, labels, 97);
  snprintf(spec, sizeof spec, "idx:%s,%s", images, labels);
  const char *parts[] = {"iid", "dirichlet:0.5", "shard:2"};
  for (size_t p = 0; p < 3; p++) {
    size_t total = 0;
    for (unsigned k = 0; k < 3; k++) {
      td_shard_t s;
      td_shard_opts_t o = {.dataset = spec, .partition = parts[p], .rank = k, .nodes = 3,
                           .seed = 11};
      ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s: %s", parts[p], why);
      ck_assert_uint_eq(s.full_count, 97);
      td_dataset_t *ref = reference_rows(spec, parts[p], k, 3, 11);
      same_rows(s.train, ref);
      total += td_dataset_rows(s.train);
      td_dataset_close(&ref);
      td_shard_close(&s);
    }
    ck_assert_uint_eq(total, 97);
  }
  remove_tmpdir();
}
END_TEST

/* A node that evaluates only at the end frees its test rows and reads them
 * again then: the same rows, normalised the same way. */
START_TEST(test_rows_dropped_and_read_again_are_the_same) {
  make_tmpdir();
  char images[128], labels[128], timages[128], tlabels[128], spec[600], why[512] = "";
  snprintf(images, sizeof images, "%s/img.idx", tmpdir);
  snprintf(labels, sizeof labels, "%s/lab.idx", tmpdir);
  snprintf(timages, sizeof timages, "%s/timg.idx", tmpdir);
  snprintf(tlabels, sizeof tlabels, "%s/tlab.idx", tmpdir);
  write_idx(images, labels, 60);
  write_idx(timages, tlabels, 13);
  snprintf(spec, sizeof spec, "idx:%s,%s,%s,%s", images, labels, timages, tlabels);
  for (unsigned nodes = 1; nodes <= 2; nodes++) { /* the whole set, and a partition */
    td_shard_t s;
    td_shard_opts_t o = {.dataset = spec, .partition = "iid", .rank = 0, .nodes = nodes};
    ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(td_dataset_rows(s.test), 13);
    size_t bytes = 13 * td_dataset_dim(s.test) * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, td_dataset_features_const(s.test), bytes);
    td_shard_drop_test(&s);
    ck_assert_ptr_null(s.test);
    ck_assert_msg(td_shard_reload_test(&s, spec, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(td_dataset_rows(s.test), 13);
    ck_assert_mem_eq(td_dataset_features_const(s.test), before, bytes);
    free(before);
    td_shard_close(&s);
  }
  remove_tmpdir();
}
END_TEST

/* The same on the real Fashion-MNIST files, when the package is installed:
 * a node of 4 holds 15000 rows, equal to the rows of the whole set. */
START_TEST(fashion_mnist_partition_equals_the_whole_sets_rows) {
  const char *dir = getenv("TRAIND_FASHION_MNIST_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz",
           dir != NULL && dir[0] != '\0' ? dir : TD_FASHION_MNIST_DIR);
  if (access(path, R_OK) != 0) {
    printf("fashion_mnist_partition_equals_the_whole_sets_rows: %s not installed\n", path);
    return;
  }
  td_shard_t s;
  char why[512] = "";
  td_shard_opts_t o = {.dataset = "fashion-mnist", .partition = "iid", .rank = 2, .nodes = 4,
                       .seed = 3};
  ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(s.full_count, 60000);
  ck_assert_uint_eq(td_dataset_rows(s.train), 15000);
  ck_assert_uint_eq(td_dataset_rows(s.test), 10000);
  td_dataset_t *ref = reference_rows("fashion-mnist", "iid", 2, 4, 3);
  same_rows(s.train, ref);
  td_dataset_close(&ref);
  td_shard_close(&s);
}
END_TEST

START_TEST(text_partitions_are_byte_ranges_of_the_training_text) {
  make_tmpdir();
  char path[128], spec[256], why[512] = "";
  snprintf(path, sizeof path, "%s/corpus", tmpdir);
  FILE *f = fopen(path, "wb");
  for (int i = 0; i < 1000; i++)
    fputc(i % 200, f);
  fclose(f);
  snprintf(spec, sizeof spec, "text:%s", path);
  td_shard_t s;
  td_shard_opts_t o = {.dataset = spec, .partition = "iid", .rank = 1, .nodes = 2, .seed = 1};
  ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
  ck_assert_ptr_null(s.train);
  ck_assert_uint_eq(s.full_count, 900); /* the last 100 bytes are held out */
  ck_assert_uint_eq(td_text_bytes(s.text_train), 450);
  ck_assert_uint_eq(td_text_data(s.text_train)[0], 450 % 200);
  ck_assert_uint_eq(td_text_bytes(s.text_valid), 100);
  ck_assert_uint_eq(td_text_data(s.text_valid)[0], 900 % 200);
  td_shard_close(&s);

  td_shard_opts_t d = {.dataset = spec, .partition = "dirichlet:0.1", .rank = 0, .nodes = 2};
  ck_assert_int_eq(td_shard_open(&s, &d, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "text has no classes"));
  ck_assert_ptr_null(s.text_train);
  ck_assert_ptr_null(s.text_valid);
  td_shard_opts_t bad = {.dataset = spec, .partition = "iid:3", .rank = 0, .nodes = 2};
  ck_assert_int_eq(td_shard_open(&s, &bad, why, sizeof why), TD_ECONFIG);
  remove_tmpdir();
}
END_TEST

/* The per-client view: every node's label counts (each node's own row equal
 * to the labels of the rows it holds, the same table on every node), and with
 * client_eval the node's held-out share of the test set: test rows, as
 * normalised as the test set, the shares of the nodes adding up to it. */
START_TEST(label_counts_and_heldout_shares) {
  make_tmpdir();
  char images[128], labels[128], timages[128], tlabels[128], spec[600], why[512] = "";
  snprintf(images, sizeof images, "%s/img.idx", tmpdir);
  snprintf(labels, sizeof labels, "%s/lab.idx", tmpdir);
  snprintf(timages, sizeof timages, "%s/timg.idx", tmpdir);
  snprintf(tlabels, sizeof tlabels, "%s/tlab.idx", tmpdir);
  write_idx(images, labels, 80);
  write_idx(timages, tlabels, 40);
  snprintf(spec, sizeof spec, "idx:%s,%s,%s,%s", images, labels, timages, tlabels);
  uint64_t first[3 * 4];
  size_t held = 0;
  for (unsigned k = 0; k < 3; k++) {
    td_shard_t s;
    td_shard_opts_t o = {.dataset = spec, .partition = "dirichlet:0.5", .rank = k, .nodes = 3,
                         .seed = 9, .client_eval = true};
    ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
    ck_assert_ptr_nonnull(s.label_counts);
    ck_assert_uint_eq(s.count_nodes, 3);
    ck_assert_int_eq(s.classes, 4);
    if (k == 0)
      memcpy(first, s.label_counts, sizeof first);
    else
      ck_assert_mem_eq(first, s.label_counts, sizeof first);
    uint64_t own[4] = {0};
    const int32_t *y = td_dataset_labels_const(s.train);
    for (size_t r = 0; r < td_dataset_rows(s.train); r++)
      own[y[r]]++;
    for (int c = 0; c < 4; c++)
      ck_assert_uint_eq(s.label_counts[k * 4 + c], own[c]);
    /* every held-out row is a row of the test set, features and label */
    ck_assert_ptr_nonnull(s.heldout);
    size_t dim = td_dataset_dim(s.test);
    for (size_t r = 0; r < td_dataset_rows(s.heldout); r++) {
      const float *row = td_dataset_features_const(s.heldout) + r * dim;
      bool found = false;
      for (size_t t = 0; t < td_dataset_rows(s.test) && !found; t++)
        found = memcmp(row, td_dataset_features_const(s.test) + t * dim, dim * sizeof *row) == 0 &&
                td_dataset_labels_const(s.heldout)[r] == td_dataset_labels_const(s.test)[t];
      ck_assert_msg(found, "node %u: held-out row %zu is no test row", k, r);
    }
    held += td_dataset_rows(s.heldout);
    td_shard_close(&s);
  }
  ck_assert_uint_eq(held, 40);
  /* without client_eval no share is cut */
  td_shard_t s;
  td_shard_opts_t o = {.dataset = spec, .partition = "iid", .rank = 0, .nodes = 2};
  ck_assert_msg(td_shard_open(&s, &o, why, sizeof why) == 0, "%s", why);
  ck_assert_ptr_null(s.heldout);
  ck_assert_ptr_nonnull(s.label_counts);
  td_shard_close(&s);
  remove_tmpdir();
}
END_TEST

int main(void) {
  Suite *s = suite_create("shard");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, labelled_partitions_share_the_whole_sets_normalisation);
  tcase_add_test(tc, idx_partitions_are_read_row_by_row_bit_for_bit);
  tcase_add_test(tc, fashion_mnist_partition_equals_the_whole_sets_rows);
  tcase_add_test(tc, test_rows_dropped_and_read_again_are_the_same);
  tcase_add_test(tc, label_counts_and_heldout_shares);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, text_partitions_are_byte_ranges_of_the_training_text);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
