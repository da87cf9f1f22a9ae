/* test_plan.c: the scheduler's rules. The batch split sums exactly to the
 * global batch, follows capacity within one sample of the exact share, breaks
 * ties toward lower ids and respects bounds; per-node mean gradients weighted
 * by b_i / B equal the global-batch mean gradient; staleness weights and drops
 * and QSR values for a known learning-rate schedule are as specified. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "common/error.h"
#include "compute/rng.h"
#include "scheduler/plan.h"

START_TEST(split_sums_exactly_and_follows_capacity) {
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  for (int trial = 0; trial < 2000; trial++) {
    size_t n = 1 + td_rng_below(&rng, 16);
    unsigned global = (unsigned)(n + td_rng_below(&rng, 4096));
    double cap[16], total = 0;
    unsigned out[16];
    for (size_t i = 0; i < n; i++)
      total += cap[i] = 1.0 + 1000.0 * td_rng_uniform(&rng);
    ck_assert_int_eq(td_plan_split_batch(cap, n, global, 0, NULL, out), 0);
    unsigned long sum = 0;
    int far = 0;
    for (size_t i = 0; i < n; i++) {
      sum += out[i];
      far += fabs((double)out[i] - global * cap[i] / total) >= 1.0;
    }
    ck_assert_uint_eq(sum, global);
    ck_assert_int_eq(far, 0); /* within one sample of the exact share */
  }
  double cap[4] = {3, 1, 1, 3};
  unsigned out[4];
  ck_assert_int_eq(td_plan_split_batch(cap, 4, 256, 1, NULL, out), 0);
  ck_assert(out[0] == 96 && out[1] == 32 && out[2] == 32 && out[3] == 96);
  double even[4] = {5, 5, 5, 5};
  ck_assert_int_eq(td_plan_split_batch(even, 4, 10, 1, NULL, out), 0);
  ck_assert(out[0] == 3 && out[1] == 3 && out[2] == 2 && out[3] == 2); /* ties: lower ids */
  double zero[3] = {0, 0, 0};
  ck_assert_int_eq(td_plan_split_batch(zero, 3, 9, 1, NULL, out), 0);
  ck_assert(out[0] == 3 && out[1] == 3 && out[2] == 3);
}
END_TEST

START_TEST(split_respects_bounds_and_refuses_the_impossible) {
  double cap[3] = {100, 1, 1};
  unsigned out[3], b_max[3] = {50, 1000, 1000};
  /* the fast node is capped by memory; the excess goes to the others */
  ck_assert_int_eq(td_plan_split_batch(cap, 3, 120, 4, b_max, out), 0);
  ck_assert_uint_eq(out[0], 50);
  ck_assert_uint_eq(out[0] + out[1] + out[2], 120);
  ck_assert(out[1] >= 4 && out[2] >= 4);
  /* slow nodes are lifted to b_min, taken from the fast one */
  ck_assert_int_eq(td_plan_split_batch(cap, 3, 64, 8, NULL, out), 0);
  ck_assert(out[1] == 8 && out[2] == 8 && out[0] == 48);
  ck_assert_int_eq(td_plan_split_batch(cap, 3, 10, 4, NULL, out), TD_ERANGE);
  unsigned tiny[3] = {1, 1, 1};
  ck_assert_int_eq(td_plan_split_batch(cap, 3, 10, 0, tiny, out), TD_ERANGE);
  double bad[2] = {1, NAN};
  ck_assert_int_eq(td_plan_split_batch(bad, 2, 10, 0, NULL, out), TD_EINVAL);
  ck_assert_int_eq(td_plan_split_batch(cap, 0, 10, 0, NULL, out), TD_EINVAL);
}
END_TEST

/* Per-node mean gradients combined with w_i = b_i / B equal the mean over the
 * whole global batch: the invariant weighted batching relies on. */
START_TEST(weighted_means_equal_the_global_mean) {
  td_rng_t rng;
  td_rng_seed(&rng, 8);
  enum { B = 200, D = 5 };
  double g[B][D], global_mean[D] = {0}, combined[D] = {0};
  for (int s = 0; s < B; s++)
    for (int d = 0; d < D; d++) {
      g[s][d] = td_rng_normal(&rng);
      global_mean[d] += g[s][d] / B;
    }
  double cap[3] = {5, 1, 2};
  unsigned b[3];
  ck_assert_int_eq(td_plan_split_batch(cap, 3, B, 1, NULL, b), 0);
  int s = 0;
  for (int node = 0; node < 3; node++) {
    double mean[D] = {0};
    for (unsigned k = 0; k < b[node]; k++, s++)
      for (int d = 0; d < D; d++)
        mean[d] += g[s][d] / b[node];
    for (int d = 0; d < D; d++)
      combined[d] += (double)b[node] / B * mean[d];
  }
  for (int d = 0; d < D; d++)
    ck_assert_double_eq_tol(combined[d], global_mean[d], 1e-12);
}
END_TEST

START_TEST(replan_hysteresis_and_ewma) {
  unsigned a[3] = {100, 50, 50}, b[3] = {105, 48, 47}, c[3] = {120, 40, 40};
  ck_assert(!td_plan_should_replan(a, b, 3, 0.1));
  ck_assert(td_plan_should_replan(a, c, 3, 0.1));
  ck_assert_double_eq(td_plan_ewma(0, 500, 0.2), 500); /* first sample */
  ck_assert_double_eq_tol(td_plan_ewma(500, 1000, 0.2), 600, 1e-9);
  ck_assert_double_eq(td_plan_ewma(500, NAN, 0.2), 500);
  ck_assert_double_eq(td_plan_ewma(500, -3, 0.2), 500);
}
END_TEST

START_TEST(staleness_weights_and_drops) {
  ck_assert_double_eq(td_plan_staleness_weight(0, 4, 0.5), 1.0);
  ck_assert_double_eq_tol(td_plan_staleness_weight(3, 4, 0.5), 0.5, 1e-12);
  ck_assert_double_eq_tol(td_plan_staleness_weight(1, 4, 1.0), 0.5, 1e-12);
  ck_assert_double_eq(td_plan_staleness_weight(4, 4, 0.5), 1.0 / sqrt(5.0));
  ck_assert_double_eq(td_plan_staleness_weight(5, 4, 0.5), 0.0); /* older than S: dropped */
  ck_assert_double_eq(td_plan_staleness_weight(-2, 4, 0.5), 1.0);
  ck_assert_double_eq(td_plan_staleness_weight(0, 0, 0.5), 1.0); /* S = 0: only fresh ones */
  ck_assert_double_eq(td_plan_staleness_weight(1, 0, 0.5), 0.0);
}
END_TEST

/* QSR on the schedule of the paper's example: H_base 4, alpha 0.0175, peak lr
 * 0.008 decaying by cosine to 0 over 1000 steps. */
START_TEST(qsr_follows_the_learning_rate) {
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.008, false, 0), 4);    /* (2.19)^2 = 4.8 */
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.004, false, 0), 19);   /* 4.375^2 = 19.1 */
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.001, false, 0), 306);  /* 17.5^2 = 306.25 */
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.001, false, 100), 100); /* capped: steps left */
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.0001, true, 0), 4);    /* warm-up: H_base */
  ck_assert_uint_eq(td_plan_qsr(0.0175, 4, 0.0, false, 0), 4);      /* lr 0: H_base */
  /* H never shrinks as a cosine schedule decays */
  unsigned long prev = 0;
  for (int step = 0; step < 1000; step += 50) {
    double lr = 0.008 * 0.5 * (1 + cos(M_PI * step / 1000.0));
    unsigned long h = td_plan_qsr(0.0175, 4, lr, false, 0);
    ck_assert_uint_ge(h, prev);
    prev = h;
  }
}
END_TEST

START_TEST(slowdown_ends_work_at_f_times_its_cpu_time) {
  /* alone on a core (wall = CPU): idle (F - 1) x the work */
  ck_assert_double_eq_tol(td_plan_slowdown_wait(4, 1.0, 1.0), 3.0, 1e-12);
  /* waited 0.5 s for a core shared with other nodes: the wait falls inside
   * the 4 x 1 s (the old rule idled 3 s after it: 4.5 s in all) */
  ck_assert_double_eq_tol(td_plan_slowdown_wait(4, 1.5, 1.0), 2.5, 1e-12);
  /* waited longer than F x the work: no idle at all */
  ck_assert_double_eq(td_plan_slowdown_wait(4, 5.0, 1.0), 0);
  /* CPU time unknown (a device, BLAS threads): wall time is the cost */
  ck_assert_double_eq_tol(td_plan_slowdown_wait(4, 2.0, NAN), 6.0, 1e-12);
  /* CPU time above wall (pool workers counted): wall time is the cost */
  ck_assert_double_eq_tol(td_plan_slowdown_wait(3, 1.0, 1.8), 2.0, 1e-12);
  /* F = 1: never idle */
  ck_assert_double_eq(td_plan_slowdown_wait(1, 1.5, 1.0), 0);
  ck_assert_double_eq(td_plan_slowdown_wait(1, 1.0, 1.0), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, split_sums_exactly_and_follows_capacity);
  tcase_add_test(tc, split_respects_bounds_and_refuses_the_impossible);
  tcase_add_test(tc, weighted_means_equal_the_global_mean);
  tcase_add_test(tc, replan_hysteresis_and_ewma);
  tcase_add_test(tc, staleness_weights_and_drops);
  tcase_add_test(tc, qsr_follows_the_learning_rate);
  tcase_add_test(tc, slowdown_ends_work_at_f_times_its_cpu_time);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
