/* test_steps.c: how long a run is. Total steps and round counts follow the
 * ceil formulas; the batch split sums to the global batch with shares at most
 * one apart, the remainder to the lowest ranks; a fixed-H plan repeats H; a
 * QSR plan matches a naive evaluation of H_r = max(H_base, (alpha / lr_r)^2)
 * round by round, keeps H_base through warm-up, and covers exactly the steps
 * of the run (or exactly the `rounds` key). */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "common/error.h"
#include "scheduler/steps.h"

START_TEST(totals_and_round_counts) {
  td_steps_opts_t o = {.train_rows = 1000, .batch = 64, .epochs = 3, .local_steps = 8};
  ck_assert_uint_eq(td_steps_total(&o), 16 * 3); /* ceil(1000 / 64) = 16 */
  ck_assert_uint_eq(td_steps_round_count(&o), 6);
  ck_assert_uint_eq(td_steps_lr_horizon(&o), 6 * 8);
  o.local_steps = 5; /* 48 steps in rounds of 5: 10 rounds, the schedule spans 50 */
  ck_assert_uint_eq(td_steps_round_count(&o), 10);
  ck_assert_uint_eq(td_steps_lr_horizon(&o), 50);
  o.rounds = 7; /* the key wins */
  ck_assert_uint_eq(td_steps_round_count(&o), 7);
  ck_assert_uint_eq(td_steps_lr_horizon(&o), 35);
  td_steps_opts_t tiny = {.train_rows = 3, .batch = 64, .epochs = 1, .local_steps = 100};
  ck_assert_uint_eq(td_steps_round_count(&tiny), 1);
  tiny.qsr_alpha = 0.1; /* under the QSR the schedule spans the data's steps */
  ck_assert_uint_eq(td_steps_lr_horizon(&tiny), 1);
}
END_TEST

START_TEST(split_batch_sums_and_is_even) {
  for (unsigned batch = 1; batch <= 300; batch += 7)
    for (unsigned nodes = 1; nodes <= 40; nodes++) {
      unsigned sum = 0, lo = ~0u, hi = 0, prev = ~0u;
      for (unsigned r = 0; r < nodes; r++) {
        unsigned b = td_steps_split_batch(batch, r, nodes);
        ck_assert_uint_ge(b, 1);
        ck_assert_uint_le(b, prev); /* the remainder goes to the lowest ranks */
        prev = b;
        sum += b;
        lo = b < lo ? b : lo;
        hi = b > hi ? b : hi;
      }
      if (batch >= nodes)
        ck_assert_uint_eq(sum, batch);
      else
        ck_assert_uint_eq(sum, nodes); /* one row each: never an empty step */
      ck_assert_uint_le(hi - lo, 1);
    }
  ck_assert_uint_eq(td_steps_split_batch(10, 0, 4), 3);
  ck_assert_uint_eq(td_steps_split_batch(10, 1, 4), 3);
  ck_assert_uint_eq(td_steps_split_batch(10, 2, 4), 2);
}
END_TEST

START_TEST(fixed_plan_repeats_h) {
  td_steps_opts_t o = {.train_rows = 6000, .batch = 100, .epochs = 2, .local_steps = 7};
  uint64_t rounds;
  unsigned *h;
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), 0);
  ck_assert_uint_eq(rounds, 18); /* ceil(120 / 7) */
  for (uint64_t r = 0; r < rounds; r++)
    ck_assert_uint_eq(h[r], 7);
  free(h);
}
END_TEST

/* a cosine schedule from 0.1 over 400 steps, with a 20-step linear warm-up */
static double cosine_lr(const void *ctx, unsigned long step) {
  (void)ctx;
  if (step < 20)
    return 0.1 * (double)(step + 1) / 20.0;
  double t = (double)(step - 20) / 380.0;
  return t >= 1 ? 0 : 0.05 * (1 + cos(M_PI * t));
}

START_TEST(qsr_plan_matches_naive_rule) {
  td_steps_opts_t o = {.train_rows = 400 * 32, .batch = 32, .epochs = 1, .local_steps = 4,
                       .qsr_alpha = 0.2, .warmup_steps = 20, .lr_at = cosine_lr};
  uint64_t rounds;
  unsigned *h;
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), 0);
  unsigned long step = 0, grew = 0;
  for (uint64_t r = 0; r < rounds; r++) {
    unsigned long want = 4, left = 400 - step;
    double lr = cosine_lr(NULL, step);
    if (step >= 20 && lr > 0 && floor((0.2 / lr) * (0.2 / lr)) > 4)
      want = (unsigned long)floor((0.2 / lr) * (0.2 / lr));
    if (want > left)
      want = left;
    ck_assert_uint_eq(h[r], want);
    if (step < 20)
      ck_assert_uint_eq(h[r], 4); /* warm-up keeps H_base */
    grew += h[r] > 4;
    step += h[r];
  }
  ck_assert_uint_eq(step, 400); /* exactly the run's steps, the last round capped */
  ck_assert_uint_gt(grew, 0);   /* the rule did lengthen rounds as the rate fell */
  ck_assert_uint_eq(td_steps_lr_horizon(&o), 400);
  free(h);
  o.rounds = 200; /* the key: exactly that many rounds, past the data's steps */
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), 0);
  ck_assert_uint_eq(rounds, 200);
  for (uint64_t r = 0; r < rounds; r++)
    ck_assert_uint_ge(h[r], 1);
  free(h);
}
END_TEST

START_TEST(plan_refuses_bad_input) {
  uint64_t rounds = 9;
  unsigned *h = (unsigned *)&rounds;
  td_steps_opts_t o = {.train_rows = 100, .batch = 0, .epochs = 1, .local_steps = 4};
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), TD_EINVAL);
  ck_assert(h == NULL && rounds == 0);
  o.batch = 10;
  o.qsr_alpha = 0.1; /* the QSR needs the schedule */
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), TD_EINVAL);
  o.qsr_alpha = 0;
  o.local_steps = 0;
  ck_assert_int_eq(td_steps_plan(&o, &rounds, &h), TD_EINVAL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("steps");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, totals_and_round_counts);
  tcase_add_test(tc, split_batch_sums_and_is_even);
  tcase_add_test(tc, fixed_plan_repeats_h);
  tcase_add_test(tc, qsr_plan_matches_naive_rule);
  tcase_add_test(tc, plan_refuses_bad_input);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
