/* test_budget.c: the per-link byte budget of codec = auto. The budget is the
 * share of what the measured goodput carries in the round's compute time,
 * never less than the floor time; acks move the goodput estimate by the EWMA,
 * except that an app-limited update may only raise it; an update left
 * unacknowledged caps the estimate at what the link delivered since. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "scheduler/budget.h"

START_TEST(budget_is_the_share_of_goodput_times_compute) {
  /* 1 MB/s over 2 s of compute: 0.8 of 2 MB */
  ck_assert_double_eq_tol(td_budget_link_bytes(1e6, 2.0, 0.1), TD_BUDGET_SHARE * 2e6, 1e-6);
  /* a round of 10 ms is budgeted as the floor time, 0.5 s */
  ck_assert_double_eq_tol(td_budget_link_bytes(1e6, 0.01, 0.5), TD_BUDGET_SHARE * 0.5e6, 1e-6);
  /* unmeasured link: no budget */
  ck_assert_double_eq(td_budget_link_bytes(0, 2.0, 0.5), 0);
  ck_assert_double_eq(td_budget_link_bytes(NAN, 2.0, 0.5), 0);
}
END_TEST

START_TEST(acks_feed_the_goodput_ewma) {
  /* first sample taken as it is */
  ck_assert_double_eq_tol(td_budget_goodput_acked(0, 1e6, 1.0, 0), 1e6, 1e-6);
  /* a full-size update: EWMA toward the sample, in both directions */
  double g = td_budget_goodput_acked(1e6, 2e6, 1.0, 2e6);
  ck_assert_double_eq_tol(g, (1 - TD_BUDGET_EWMA) * 1e6 + TD_BUDGET_EWMA * 2e6, 1e-6);
  g = td_budget_goodput_acked(1e6, 1e6, 2.0, 1e6);
  ck_assert_double_eq_tol(g, (1 - TD_BUDGET_EWMA) * 1e6 + TD_BUDGET_EWMA * 0.5e6, 1e-6);
  /* app-limited (under half the budget): a slow ack does not lower it... */
  ck_assert_double_eq_tol(td_budget_goodput_acked(1e6, 1e3, 1.0, 1e6), 1e6, 1e-6);
  /* ...a fast one raises it to the sample */
  ck_assert_double_eq_tol(td_budget_goodput_acked(1e6, 4e5, 0.1, 1e6), 4e6, 1e-6);
  /* no time elapsed: unchanged */
  ck_assert_double_eq(td_budget_goodput_acked(1e6, 1e6, 0, 1e6), 1e6);
}
END_TEST

START_TEST(an_unacked_update_caps_the_estimate) {
  /* 1 MB out for 4 s, no ack: the link delivered under 250 kB/s */
  ck_assert_double_eq_tol(td_budget_goodput_unacked(1e6, 1000000, 4.0), 2.5e5, 1e-6);
  /* within what the estimate allows: unchanged */
  ck_assert_double_eq(td_budget_goodput_unacked(1e6, 1000000, 0.5), 1e6);
  /* nothing pending */
  ck_assert_double_eq(td_budget_goodput_unacked(1e6, 0, 4.0), 1e6);
  ck_assert_double_eq(td_budget_goodput_unacked(1e6, 1000, 0), 1e6);
  /* a link never measured: the bound is its first estimate (else the first,
   * cautious codec may saturate the link for good, its acks always late) */
  ck_assert_double_eq_tol(td_budget_goodput_unacked(0, 107511, 1.0), 107511, 1e-6);
  ck_assert_double_eq_tol(td_budget_goodput_unacked(NAN, 107511, 2.0), 53755.5, 1e-6);
  ck_assert_double_eq(td_budget_goodput_unacked(0, 0, 2.0), 0);
  ck_assert_double_eq(td_budget_goodput_unacked(0, 1000, 0), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("budget");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, budget_is_the_share_of_goodput_times_compute);
  tcase_add_test(tc, acks_feed_the_goodput_ewma);
  tcase_add_test(tc, an_unacked_update_caps_the_estimate);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
