/* test_rng.c: the random generator (compute/rng.h), as a reader would use it.
 *
 * Every stream is reproducible from its seed (and seed2's named streams are
 * independent), and each distribution has the moments it promises: uniform,
 * normal, gamma, bounded integers without bias, and shuffles that are
 * reproducible permutations. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "compute/rng.h"

START_TEST(rng_same_seed_gives_same_stream) {
  td_rng_t a, b, c;
  td_rng_seed(&a, 42);
  td_rng_seed(&b, 42);
  td_rng_seed(&c, 43);
  int differ = 0;
  for (int i = 0; i < 1000; i++) {
    uint64_t x = td_rng_next(&a);
    ck_assert_uint_eq(x, td_rng_next(&b));
    differ += x != td_rng_next(&c);
  }
  ck_assert_int_gt(differ, 990);
  /* seed2: one seed, independent named streams, each reproducible */
  td_rng_seed2(&a, 42, 1);
  td_rng_seed2(&b, 42, 1);
  td_rng_seed2(&c, 42, 2);
  uint64_t x = td_rng_next(&a);
  ck_assert_uint_eq(x, td_rng_next(&b));
  ck_assert_uint_ne(x, td_rng_next(&c));
}
END_TEST

START_TEST(rng_uniform_has_the_moments_of_u01) {
  td_rng_t rng;
  td_rng_seed(&rng, 7);
  const int n = 1000000;
  double sum = 0, sum_sq = 0;
  int outside = 0; /* counted, not asserted per draw: each ck_assert costs a syscall */
  for (int i = 0; i < n; i++) {
    double u = td_rng_uniform(&rng);
    outside += !(u >= 0.0 && u < 1.0);
    sum += u;
    sum_sq += (u - 0.5) * (u - 0.5);
  }
  ck_assert_int_eq(outside, 0);
  /* five standard errors: mean sd sqrt(1/12/n), variance sd sqrt(1/180/n) */
  ck_assert_double_eq_tol(sum / n, 0.5, 5 * sqrt(1.0 / 12 / n));
  ck_assert_double_eq_tol(sum_sq / n, 1.0 / 12, 5 * sqrt(1.0 / 180 / n));
}
END_TEST

START_TEST(rng_normal_has_the_moments_of_n01) {
  td_rng_t rng;
  td_rng_seed(&rng, 8);
  const int n = 1000000;
  double m1 = 0, m2 = 0, m4 = 0;
  int non_finite = 0;
  for (int i = 0; i < n; i++) {
    double z = td_rng_normal(&rng);
    non_finite += !isfinite(z);
    m1 += z;
    m2 += z * z;
    m4 += z * z * z * z;
  }
  ck_assert_int_eq(non_finite, 0);
  /* E z = 0 (sd 1/sqrt n), E z^2 = 1 (sd sqrt(2/n)), E z^4 = 3 (sd sqrt(96/n)) */
  ck_assert_double_eq_tol(m1 / n, 0.0, 5 / sqrt(n));
  ck_assert_double_eq_tol(m2 / n, 1.0, 5 * sqrt(2.0 / n));
  ck_assert_double_eq_tol(m4 / n, 3.0, 5 * sqrt(96.0 / n));
}
END_TEST

START_TEST(rng_gamma_mean_and_variance_equal_the_shape) {
  static const double shapes[] = {0.1, 0.5, 1.0, 2.5, 10.0};
  td_rng_t rng;
  td_rng_seed(&rng, 9);
  const int n = 400000;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    double k = shapes[s], sum = 0, sum_sq = 0;
    int invalid = 0;
    for (int i = 0; i < n; i++) {
      double g = td_rng_gamma(&rng, k);
      invalid += !(g >= 0 && isfinite(g));
      sum += g;
      sum_sq += (g - k) * (g - k);
    }
    ck_assert_int_eq(invalid, 0);
    /* Gamma(k, 1): mean k, variance k, Var((X - k)^2) = 2k^2 + 6k */
    ck_assert_msg(fabs(sum / n - k) < 5 * sqrt(k / n), "shape %g: mean %g", k, sum / n);
    ck_assert_msg(fabs(sum_sq / n - k) < 5 * sqrt((2 * k * k + 6 * k) / n), "shape %g: var %g",
                  k, sum_sq / n);
  }
}
END_TEST

START_TEST(rng_below_stays_in_range_without_bias) {
  td_rng_t rng;
  td_rng_seed(&rng, 10);
  enum { N = 7, DRAWS = 700000 };
  int count[N + 1] = {0}; /* count[N]: out of range */
  for (int i = 0; i < DRAWS; i++) {
    uint32_t r = td_rng_below(&rng, N);
    count[r < N ? r : N]++;
  }
  ck_assert_int_eq(count[N], 0);
  double expect = (double)DRAWS / N, sd = sqrt(expect * (1.0 - 1.0 / N));
  for (int i = 0; i < N; i++)
    ck_assert_msg(fabs(count[i] - expect) < 5 * sd, "value %d drawn %d times", i, count[i]);
  uint32_t any = 0;
  for (int i = 0; i < 100; i++)
    any |= td_rng_below(&rng, 1);
  ck_assert_uint_eq(any, 0);
  /* near 2^32, where a modulo would be most biased: the top half of [0, n)
   * must come up about half the time */
  const uint32_t big = 3000000001u;
  int upper = 0, beyond = 0;
  for (int i = 0; i < 100000; i++) {
    uint32_t r = td_rng_below(&rng, big);
    beyond += r >= big;
    upper += r >= big / 2;
  }
  ck_assert_int_eq(beyond, 0);
  ck_assert_int_lt(abs(upper - 50000), 5 * 159);
}
END_TEST

START_TEST(rng_shuffle_is_a_reproducible_permutation) {
  uint32_t a[100], b[100];
  td_rng_t ra, rb;
  for (uint32_t i = 0; i < 100; i++)
    a[i] = b[i] = i;
  td_rng_seed(&ra, 11);
  td_rng_seed(&rb, 11);
  td_rng_shuffle_u32(&ra, a, 100);
  td_rng_shuffle_u32(&rb, b, 100);
  ck_assert_mem_eq(a, b, sizeof a);
  int seen[100] = {0}, moved = 0;
  for (uint32_t i = 0; i < 100; i++) {
    ck_assert_uint_lt(a[i], 100);
    seen[a[i]]++;
    moved += a[i] != i;
  }
  for (int i = 0; i < 100; i++)
    ck_assert_int_eq(seen[i], 1);
  ck_assert_int_gt(moved, 80);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rng");

  TCase *rng = tcase_create("rng");
  tcase_set_timeout(rng, 60);
  tcase_add_test(rng, rng_same_seed_gives_same_stream);
  tcase_add_test(rng, rng_uniform_has_the_moments_of_u01);
  tcase_add_test(rng, rng_normal_has_the_moments_of_n01);
  tcase_add_test(rng, rng_gamma_mean_and_variance_equal_the_shape);
  tcase_add_test(rng, rng_below_stays_in_range_without_bias);
  tcase_add_test(rng, rng_shuffle_is_a_reproducible_permutation);
  suite_add_tcase(s, rng);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
