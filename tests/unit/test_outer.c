/* test_outer.c: the outer optimizer against hand-computed values. lr 1 and
 * momentum 0 reproduce the plain average exactly; heavy-ball and Nesterov
 * steps over three rounds match the PyTorch-convention recurrences worked out
 * by hand; the clamp bounds the buffer in place. */
#include <check.h>
#include <math.h>

#include "scheduler/outer.h"

START_TEST(plain_average_is_exact) {
  td_outer_opts_t o = {.lr = 1, .momentum = 0};
  float avg[4] = {0.25f, -1.5f, 3e-7f, 0}, step[4];
  ck_assert(!td_outer_needs_buffer(&o));
  td_outer_step(&o, avg, NULL, step, 4);
  for (int i = 0; i < 4; i++)
    ck_assert(step[i] == avg[i]);
}
END_TEST

/* avg = 1, 2, 3 over three rounds, so D = -1, -2, -3; mu = 0.5, lr = 0.7.
 * heavy ball: b = -1, -2.5, -4.25 -> step = 0.7, 1.75, 2.975
 * Nesterov:   d = D + mu b = -1.5, -3.25, -5.125 -> step = 1.05, 2.275, 3.5875 */
START_TEST(momentum_and_nesterov_match_hand_values) {
  const float avg[3] = {1, 2, 3};
  const float heavy[3] = {0.7f, 1.75f, 2.975f}, nest[3] = {1.05f, 2.275f, 3.5875f};
  td_outer_opts_t o = {.lr = 0.7, .momentum = 0.5};
  float b = 0, s;
  for (int t = 0; t < 3; t++) {
    td_outer_step(&o, &avg[t], &b, &s, 1);
    ck_assert_float_eq_tol(s, heavy[t], 1e-6);
  }
  o.nesterov = true;
  b = 0;
  for (int t = 0; t < 3; t++) {
    td_outer_step(&o, &avg[t], &b, &s, 1);
    ck_assert_float_eq_tol(s, nest[t], 1e-6);
  }
}
END_TEST

START_TEST(clamp_bounds_the_buffer_in_place) {
  td_outer_opts_t o = {.lr = 1, .momentum = 0.9, .clip = 0.5};
  float avg[2] = {-4, 0.1f}, b[2] = {0, 0}, s[2];
  ck_assert(td_outer_needs_buffer(&o));
  td_outer_step(&o, avg, b, s, 2);
  ck_assert_float_eq(b[0], 0.5f); /* D = 4 clamped */
  ck_assert_float_eq_tol(b[1], -0.1f, 1e-7);
  ck_assert_float_eq(s[0], -0.5f);
  td_outer_step(&o, avg, b, s, 2); /* 0.9 * 0.5 + 4 clamped again */
  ck_assert_float_eq(b[0], 0.5f);
  ck_assert_float_eq_tol(b[1], -0.19f, 1e-6);
}
END_TEST

int main(void) {
  Suite *s = suite_create("outer");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, plain_average_is_exact);
  tcase_add_test(tc, momentum_and_nesterov_match_hand_values);
  tcase_add_test(tc, clamp_bounds_the_buffer_in_place);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
