/* test_outer.c: the outer optimizer against hand-computed values. lr 1 and
 * momentum 0 reproduce the plain average exactly; heavy-ball and Nesterov
 * steps over three rounds match the PyTorch-convention recurrences worked out
 * by hand; the clamp bounds the buffer in place. FedAdam, FedYogi and
 * FedAdagrad follow a naive double-precision transcription of Reddi et al.'s
 * Algorithm 2 over many rounds, and their state starts at m = 0, v = tau^2. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

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

/* Reddi et al. 2021, Algorithm 2, written the way the paper prints it, one
 * coordinate at a time in double: Delta is the round average, m_-1 = 0,
 * v_-1 = tau^2, no bias correction. */
static double ref_step(td_outer_kind_t kind, double delta, double *m, double *v, double lr,
                       double beta1, double beta2, double tau) {
  *m = beta1 * *m + (1 - beta1) * delta;
  double d2 = delta * delta;
  if (kind == TD_OUTER_ADAGRAD)
    *v = *v + d2;
  else if (kind == TD_OUTER_ADAM)
    *v = beta2 * *v + (1 - beta2) * d2;
  else /* yogi */
    *v = *v - (1 - beta2) * d2 * (*v - d2 > 0 ? 1 : (*v - d2 < 0 ? -1 : 0));
  return lr * *m / (sqrt(*v) + tau);
}

/* 40 rounds of 64 coordinates with averages of mixed signs and scales
 * (1e-4 to 1), so yogi's sign flips and adagrad's growth are both exercised. */
START_TEST(adaptive_kinds_match_the_published_update) {
  enum { N = 64, ROUNDS = 40 };
  const td_outer_kind_t kinds[3] = {TD_OUTER_ADAM, TD_OUTER_YOGI, TD_OUTER_ADAGRAD};
  for (int k = 0; k < 3; k++) {
    td_outer_opts_t o = {.kind = kinds[k], .lr = 0.03, .beta1 = 0.9, .beta2 = 0.99,
                         .tau = 1e-3};
    ck_assert(td_outer_needs_buffer(&o));
    ck_assert_uint_eq(td_outer_state_floats(&o, N), 2 * N);
    float state[2 * N], avg[N], step[N];
    double m[N], v[N];
    td_outer_state_init(&o, state, N);
    for (int i = 0; i < N; i++) {
      ck_assert(state[i] == 0);
      ck_assert_float_eq_tol(state[N + i], 1e-6f, 1e-12f);
      m[i] = 0;
      v[i] = o.tau * o.tau;
    }
    srand(7 + k);
    for (int r = 0; r < ROUNDS; r++) {
      for (int i = 0; i < N; i++) {
        double scale = pow(10.0, -(double)(i % 5)); /* 1 .. 1e-4 */
        avg[i] = (float)(scale * ((double)rand() / RAND_MAX - 0.4));
      }
      td_outer_step(&o, avg, state, step, N);
      for (int i = 0; i < N; i++) {
        double want = ref_step(o.kind, avg[i], &m[i], &v[i], o.lr, o.beta1, o.beta2, o.tau);
        /* float against double: m cancels across rounds, so the error is
         * relative to the step size lr, not to a step that nearly cancelled */
        ck_assert_msg(fabs(step[i] - want) <= 1e-5 * (fabs(want) + o.lr),
                      "kind %d round %d coord %d: step %.9g, reference %.9g", (int)o.kind, r, i,
                      (double)step[i], want);
        ck_assert_msg(fabs(state[N + i] - v[i]) <= 1e-5 * v[i] + 1e-12, "v drifts");
      }
    }
  }
}
END_TEST

/* Hand values for one coordinate, avg = 0.5 then -1 (exact in binary), lr 1,
 * beta1 0.5, beta2 0.5, tau 0.5 (v starts at 0.25):
 *   m = 0.25, then -0.375 for every kind;
 *   adam:    v = 0.25 -> 0.25 / (0.5 + 0.5);     v = 0.625 -> -0.375 / (sqrt 0.625 + 0.5)
 *   yogi:    v = d2, sign 0, v stays 0.25 -> 0.25; v - d2 < 0: v = 0.75 -> / (sqrt 0.75 + 0.5)
 *   adagrad: v = 0.5 -> 0.25 / (sqrt 0.5 + 0.5); v = 1.5 -> -0.375 / (sqrt 1.5 + 0.5) */
START_TEST(adaptive_kinds_match_hand_values) {
  const float avg[2] = {0.5f, -1.0f};
  const double want[3][2] = {{0.25, -0.375 / (sqrt(0.625) + 0.5)},
                             {0.25, -0.375 / (sqrt(0.75) + 0.5)},
                             {0.25 / (sqrt(0.5) + 0.5), -0.375 / (sqrt(1.5) + 0.5)}};
  const td_outer_kind_t kinds[3] = {TD_OUTER_ADAM, TD_OUTER_YOGI, TD_OUTER_ADAGRAD};
  for (int k = 0; k < 3; k++) {
    td_outer_opts_t o = {.kind = kinds[k], .lr = 1, .beta1 = 0.5, .beta2 = 0.5, .tau = 0.5};
    float state[2], s;
    td_outer_state_init(&o, state, 1);
    for (int t = 0; t < 2; t++) {
      td_outer_step(&o, &avg[t], state, &s, 1);
      ck_assert_float_eq_tol(s, want[k][t], 1e-5);
    }
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("outer");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, plain_average_is_exact);
  tcase_add_test(tc, momentum_and_nesterov_match_hand_values);
  tcase_add_test(tc, clamp_bounds_the_buffer_in_place);
  tcase_add_test(tc, adaptive_kinds_match_the_published_update);
  tcase_add_test(tc, adaptive_kinds_match_hand_values);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
