/* test_pathrtt.c: the path RTT from heartbeat echoes. An echo gives the
 * round trip less the peer's hold, and nothing when it cannot be one of our
 * stamps (future, too old, a hold longer than the trip); the estimate is the
 * minimum over the current and the previous window, so a sample queued
 * behind a burst does not raise it and a longer path is seen after a window
 * or two. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "scheduler/pathrtt.h"

START_TEST(an_echo_is_the_round_trip_less_the_hold) {
  /* our stamp at 1 s, echoed after the peer held it 400 ms, back at 1.5015 s */
  ck_assert_double_eq_tol(td_pathrtt_echo(1501500, 1000000, 400000, 60000000), 0.1015, 1e-9);
  /* no echo yet */
  ck_assert_double_eq(td_pathrtt_echo(1501500, 0, 0, 60000000), 0);
  /* a stamp from the future, or older than allowed: not ours */
  ck_assert_double_eq(td_pathrtt_echo(1501500, 1601500, 0, 60000000), 0);
  ck_assert_double_eq(td_pathrtt_echo(70000000, 1000000, 0, 60000000), 0);
  /* a hold as long as the trip or longer: a lie or a clock gone wrong */
  ck_assert_double_eq(td_pathrtt_echo(1501500, 1000000, 501500, 60000000), 0);
  ck_assert_double_eq(td_pathrtt_echo(1501500, 1000000, UINT64_MAX, 60000000), 0);
}
END_TEST

START_TEST(the_estimate_is_a_windowed_minimum) {
  td_pathrtt_t r = {0};
  ck_assert_double_eq(td_pathrtt(&r), 0);
  td_pathrtt_sample(&r, 0.12, 100.0);
  td_pathrtt_sample(&r, 0.10, 101.0);
  td_pathrtt_sample(&r, 0.30, 102.0); /* queued behind a burst: not the path */
  ck_assert_double_eq(td_pathrtt(&r), 0.10);
  /* bad samples change nothing */
  td_pathrtt_sample(&r, 0, 103.0);
  td_pathrtt_sample(&r, -1, 103.0);
  td_pathrtt_sample(&r, NAN, 103.0);
  td_pathrtt_sample(&r, INFINITY, 103.0);
  ck_assert_double_eq(td_pathrtt(&r), 0.10);
  /* the path gets longer: the old minimum holds one more window... */
  td_pathrtt_sample(&r, 0.20, 100.0 + TD_PATHRTT_WINDOW_S + 1);
  ck_assert_double_eq(td_pathrtt(&r), 0.10);
  /* ...and is forgotten after it */
  td_pathrtt_sample(&r, 0.21, 100.0 + 2 * TD_PATHRTT_WINDOW_S + 2);
  ck_assert_double_eq(td_pathrtt(&r), 0.20);
  /* a shorter path is taken at once */
  td_pathrtt_sample(&r, 0.05, 100.0 + 2 * TD_PATHRTT_WINDOW_S + 3);
  ck_assert_double_eq(td_pathrtt(&r), 0.05);
}
END_TEST

int main(void) {
  Suite *s = suite_create("pathrtt");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, an_echo_is_the_round_trip_less_the_hold);
  tcase_add_test(tc, the_estimate_is_a_windowed_minimum);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
