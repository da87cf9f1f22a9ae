/* test_shard.c: td_shard_open, the one load + normalise + partition sequence
 * that peer runs and the standalone trainer share.
 *
 * Labelled data: every node's rows are normalised with the statistics of the
 * whole training set (not of its own partition), the partitions of all nodes
 * add up to the whole set, and a node left without rows is an error. Text:
 * node k gets the k-th contiguous range of the training bytes and every node
 * the same validation text. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
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

int main(void) {
  Suite *s = suite_create("shard");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, labelled_partitions_share_the_whole_sets_normalisation);
  tcase_add_test(tc, text_partitions_are_byte_ranges_of_the_training_text);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
