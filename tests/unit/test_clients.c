/* test_clients.c: virtual clients (compute/clients.h) and what they stand on.
 *
 * - The partition cut into nodes x clients parts: each node's clients, cut
 *   in one pass (td_partition_group), are exactly the parts that
 *   td_partition_indices gives for the global client indices, and over all
 *   nodes they are disjoint and cover the set (iid, dirichlet, shard).
 * - One client's update is its own x - base, bit for bit (a node that hosts
 *   one client sends what it trained).
 * - A node's update with three clients equals the sample-weighted mean of
 *   the three clients' updates, each computed by hand on a trainer of its
 *   own (a naive double-precision reference).
 * - The clients' sample (td_sample_draw_set) is the same for whoever draws
 *   it, picks only candidates, has the size asked for, and over <= 64
 *   candidates picks what the node sample td_sample_draw picks. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/clients.h"
#include "compute/data/partition.h"
#include "scheduler/sample.h"

#define ROWS 6000
#define CLASSES 10

static void make_labels(int32_t *labels) {
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  for (size_t i = 0; i < ROWS; i++)
    labels[i] = (int32_t)td_rng_below(&rng, CLASSES);
}

static void check_rule(const char *spec, unsigned nodes, unsigned k) {
  static int32_t labels[ROWS];
  make_labels(labels);
  td_partition_t p;
  char why[256];
  ck_assert_int_eq(td_partition_parse(&p, spec, why, sizeof why), 0);
  unsigned parts = nodes * k;
  uint8_t *seen = calloc(ROWS, 1);
  uint32_t *part_rows = malloc(parts * sizeof *part_rows);
  size_t *off = malloc((k + 1) * sizeof *off);
  size_t total = 0;
  for (unsigned n = 0; n < nodes; n++) {
    uint32_t *idx = NULL;
    ck_assert_int_eq(td_partition_group(&p, labels, ROWS, CLASSES, n * k, k, parts, 5, &idx, off,
                                        part_rows),
                     0);
    for (unsigned j = 0; j < k; j++) {
      uint32_t *ref = NULL;
      size_t nref = 0;
      ck_assert_int_eq(
          td_partition_indices(&p, labels, ROWS, CLASSES, n * k + j, parts, 5, &ref, &nref), 0);
      ck_assert_msg(off[j + 1] - off[j] == nref, "%s: client %u has %zu rows, the split %zu", spec,
                    n * k + j, off[j + 1] - off[j], nref);
      ck_assert_uint_eq(part_rows[n * k + j], nref);
      if (nref > 0)
        ck_assert_int_eq(memcmp(idx + off[j], ref, nref * sizeof *ref), 0);
      for (size_t i = 0; i < nref; i++) {
        ck_assert_msg(!seen[ref[i]], "%s: row %u in two clients", spec, ref[i]);
        seen[ref[i]] = 1;
      }
      free(ref);
    }
    total += off[k];
    free(idx);
  }
  ck_assert_msg(total == ROWS, "%s: the clients hold %zu of %d rows", spec, total, ROWS);
  free(seen);
  free(part_rows);
  free(off);
}

START_TEST(client_parts_match_the_split_disjoint_and_covering) {
  check_rule("iid", 3, 4);
  check_rule("dirichlet:0.1", 3, 4);
  check_rule("dirichlet:0.5", 4, 250); /* the 1,000-client run's shape */
  check_rule("shard:2", 3, 4);
  static int32_t labels[ROWS];
  make_labels(labels);
  td_partition_t all = {.kind = TD_PARTITION_ALL};
  uint32_t *idx = NULL;
  size_t off[3];
  ck_assert_int_eq(td_partition_group(&all, labels, ROWS, CLASSES, 0, 2, 4, 5, &idx, off, NULL),
                   TD_EINVAL); /* every client would hold every row */
  td_partition_t iid = {.kind = TD_PARTITION_IID};
  ck_assert_int_eq(td_partition_group(&iid, labels, ROWS, CLASSES, 3, 2, 4, 5, &idx, off, NULL),
                   TD_EINVAL); /* clients 3 and 4 of 4 */
}
END_TEST

/* Three well-separated Gaussian blobs in 8 dimensions, labels 0..2. */
static const char *synthetic_csv(void) {
  static char path[64];
  strcpy(path, "/tmp/td-clients-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  td_rng_t rng;
  td_rng_seed(&rng, 7);
  for (int i = 0; i < 240; i++) {
    int label = i % 3;
    fprintf(f, "%d", label);
    for (int d = 0; d < 8; d++)
      fprintf(f, ",%.5f", (d % 3 == label ? 2.0 : 0.0) + 0.5 * td_rng_normal(&rng));
    fputc('\n', f);
  }
  fclose(f);
  return path;
}

static td_trainer_t *open_trainer(td_backend_t *be, td_dataset_t **ds, const char *csv) {
  char why[256] = "";
  ck_assert_int_eq(td_dataset_load_csv(ds, csv, why, sizeof why), 0);
  td_trainer_opts_t o = {.model_spec = "mlp:8-16-3", .batch = 16, .seed = 3, .lr = 0.05,
                         .lr_schedule = "cosine", .total_steps = 100,
                         .optim = {.momentum = 0.9}};
  td_trainer_t *tr = NULL;
  ck_assert_msg(td_trainer_open(&tr, be, *ds, &o, why, sizeof why) == 0, "%s", why);
  return tr;
}

/* Client j's rows: [off[j], off[j + 1]) of the 240 (sizes 50, 80, 110, 0). */
static const size_t off[5] = {0, 50, 130, 240, 240};

START_TEST(one_client_update_is_its_own_delta_bit_for_bit) {
  td_backend_t *be = NULL;
  char why[256];
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, why, sizeof why), 0);
  const char *csv = synthetic_csv();
  td_dataset_t *d1 = NULL, *d2 = NULL;
  td_trainer_t *a = open_trainer(be, &d1, csv), *b = open_trainer(be, &d2, csv);
  size_t numel = td_model_numel(td_trainer_model(a));
  float *base = malloc(numel * sizeof *base), *delta = malloc(numel * sizeof *delta);
  memcpy(base, td_model_host_params(td_trainer_model(a)), numel * sizeof *base);
  td_clients_t *cl = NULL;
  ck_assert_int_eq(td_clients_open(&cl, off, 4, 8), 0);
  unsigned which[] = {1};
  td_train_stats_t st;
  ck_assert_int_eq(td_clients_train(cl, a, which, 1, base, 7, 12, delta, &st, why, sizeof why), 0);
  ck_assert_uint_eq(td_trainer_global_step(a), 19);
  ck_assert_uint_eq(st.steps, 12);
  /* by hand: client 1 (global 9) from base at step 7 with a fresh optimizer */
  td_trainer_rows_t w;
  td_trainer_rows_init(&w, 50, 80, 8 + 1 + 1);
  td_trainer_seek(b, 7);
  ck_assert_int_eq(td_trainer_bind_rows(b, &w), 0);
  td_train_stats_t sb;
  ck_assert_int_eq(td_trainer_steps(b, 12, &sb, why, sizeof why), 0);
  const float *x = td_model_host_params(td_trainer_model(b));
  for (size_t i = 0; i < numel; i++)
    ck_assert_msg(delta[i] == x[i] - base[i], "coordinate %zu: %.9g vs %.9g", i, delta[i],
                  x[i] - base[i]);
  ck_assert_uint_eq(st.samples, sb.samples);
  ck_assert_double_eq(st.loss, sb.loss);
  td_clients_close(&cl);
  td_clients_close(&cl); /* NULL-safe */
  free(base);
  free(delta);
  td_trainer_close(&a);
  td_trainer_close(&b);
  td_dataset_close(&d1);
  td_dataset_close(&d2);
  td_backend_close(&be);
  unlink(csv);
}
END_TEST

START_TEST(node_update_is_the_weighted_mean_of_its_clients) {
  td_backend_t *be = NULL;
  char why[256];
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, why, sizeof why), 0);
  const char *csv = synthetic_csv();
  td_dataset_t *d1 = NULL, *d2 = NULL;
  td_trainer_t *a = open_trainer(be, &d1, csv), *b = open_trainer(be, &d2, csv);
  size_t numel = td_model_numel(td_trainer_model(a));
  float *base = malloc(numel * sizeof *base), *delta = malloc(numel * sizeof *delta);
  memcpy(base, td_model_host_params(td_trainer_model(a)), numel * sizeof *base);
  td_clients_t *cl = NULL;
  ck_assert_int_eq(td_clients_open(&cl, off, 4, 0), 0);
  ck_assert_uint_eq(td_clients_count(cl), 4);
  ck_assert_uint_eq(td_clients_rows(cl, 2), 110);
  ck_assert_uint_eq(td_clients_rows(cl, 3), 0);
  /* 7 steps of 16: client 0 (50 rows) wraps its epoch with short batches */
  unsigned which[] = {0, 1, 2};
  td_train_stats_t st;
  ck_assert_int_eq(td_clients_train(cl, a, which, 3, base, 0, 7, delta, &st, why, sizeof why), 0);
  /* the naive reference: each client alone from base, then sum w_j d_j / sum w_j */
  double *ref = calloc(numel, sizeof *ref), wsum = 0;
  unsigned long samples = 0;
  for (unsigned j = 0; j < 3; j++) {
    memcpy(td_model_host_params(td_trainer_model(b)), base, numel * sizeof *base);
    ck_assert_int_eq(td_trainer_reset_optim(b), 0);
    td_trainer_seek(b, 0);
    td_trainer_rows_t w;
    td_trainer_rows_init(&w, off[j], off[j + 1] - off[j], j + 1);
    ck_assert_int_eq(td_trainer_bind_rows(b, &w), 0);
    td_train_stats_t sj;
    ck_assert_int_eq(td_trainer_steps(b, 7, &sj, why, sizeof why), 0);
    const float *x = td_model_host_params(td_trainer_model(b));
    for (size_t i = 0; i < numel; i++)
      ref[i] += (double)sj.samples * ((double)x[i] - (double)base[i]);
    wsum += (double)sj.samples;
    samples += sj.samples;
  }
  /* 16,16,16,2 then 16,16,16 (50 rows); 7 x 16 (80); 6 x 16 + 14 (110) */
  ck_assert_uint_eq(samples, 98 + 112 + 110);
  ck_assert_uint_eq(st.samples, samples);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < numel; i++) {
    ref[i] /= wsum;
    double err = fabs((double)delta[i] - ref[i]);
    worst = err > worst ? err : worst;
    scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
  }
  ck_assert_double_gt(scale, 1e-3); /* the clients did move the model */
  ck_assert_msg(worst <= 1e-6 * scale + 1e-9, "worst %.3g of %.3g", worst, scale);
  /* an empty or unknown client is refused */
  unsigned empty[] = {3}, unknown[] = {4};
  ck_assert_int_eq(td_clients_train(cl, a, empty, 1, base, 0, 1, delta, &st, why, sizeof why),
                   TD_EINVAL);
  ck_assert_int_eq(td_clients_train(cl, a, unknown, 1, base, 0, 1, delta, &st, why, sizeof why),
                   TD_EINVAL);
  free(ref);
  free(base);
  free(delta);
  td_clients_close(&cl);
  td_trainer_close(&a);
  td_trainer_close(&b);
  td_dataset_close(&d1);
  td_dataset_close(&d2);
  td_backend_close(&be);
  unlink(csv);
}
END_TEST

START_TEST(client_sample_is_shared_sized_and_matches_the_node_draw) {
  uint16_t cand[1000];
  unsigned n = 0;
  for (unsigned c = 0; c < 1000; c++)
    if (c % 7 != 3) /* the clients that hold rows */
      cand[n++] = (uint16_t)c;
  for (uint64_t round = 1; round <= 50; round++) {
    uint64_t a[TD_SAMPLE_SET_WORDS], b[TD_SAMPLE_SET_WORDS];
    unsigned k = td_sample_size(0.05, n);
    ck_assert_uint_eq(k, 43); /* ceil(0.05 x 857) */
    ck_assert_uint_eq(td_sample_draw_set(9, round, cand, n, k, a), k);
    ck_assert_uint_eq(td_sample_draw_set(9, round, cand, n, k, b), k);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    unsigned bits = 0;
    for (unsigned c = 0; c < TD_SAMPLE_MAX_CLIENTS; c++)
      if (a[c / 64] >> (c % 64) & 1) {
        bits++;
        ck_assert_msg(c < 1000 && c % 7 != 3, "client %u is no candidate", c);
      }
    ck_assert_uint_eq(bits, k);
    uint16_t ident[64];
    for (unsigned i = 0; i < 64; i++)
      ident[i] = (uint16_t)i;
    for (unsigned members = 1; members <= 64; members += 9) {
      unsigned kk = td_sample_size(0.5, members);
      td_sample_draw_set(9, round, ident, members, kk, a);
      ck_assert_uint_eq(a[0], td_sample_draw(9, round, members, kk));
    }
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("clients");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, client_parts_match_the_split_disjoint_and_covering);
  tcase_add_test(tc, one_client_update_is_its_own_delta_bit_for_bit);
  tcase_add_test(tc, node_update_is_the_weighted_mean_of_its_clients);
  tcase_add_test(tc, client_sample_is_shared_sized_and_matches_the_node_draw);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
