/* test_sample.c: client sampling. The sample of a round has the size the
 * participation asks for, is the same whoever draws it (four "nodes" drawing
 * independently from the same numbers), changes from round to round and with
 * the seed, and over many rounds picks every member about equally often. */
#include <check.h>
#include <stdint.h>

#include "scheduler/sample.h"

START_TEST(size_follows_the_fraction_or_the_count) {
  ck_assert_uint_eq(td_sample_size(1, 4), 4);
  ck_assert_uint_eq(td_sample_size(0.5, 4), 2);
  ck_assert_uint_eq(td_sample_size(0.1, 30), 3); /* not 4 by rounding error */
  ck_assert_uint_eq(td_sample_size(0.1, 25), 3); /* ceil(2.5) */
  ck_assert_uint_eq(td_sample_size(0.01, 4), 1); /* at least one */
  ck_assert_uint_eq(td_sample_size(2, 4), 2);    /* a whole number is a count */
  ck_assert_uint_eq(td_sample_size(7, 4), 4);
  ck_assert_uint_eq(td_sample_size(0.05, 64), 4);
}
END_TEST

START_TEST(every_node_draws_the_same_sample_of_the_right_size) {
  const unsigned sizes[][2] = {{4, 1}, {4, 2}, {4, 3}, {10, 3}, {64, 5}, {64, 63}, {5, 5}};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    unsigned n = sizes[t][0], k = sizes[t][1];
    uint64_t differs = 0, first = td_sample_draw(42, 1, n, k);
    for (uint64_t round = 1; round <= 500; round++) {
      uint64_t node[4];
      for (int i = 0; i < 4; i++) /* four members, each on its own */
        node[i] = td_sample_draw(42, round, n, k);
      for (int i = 1; i < 4; i++)
        ck_assert_msg(node[i] == node[0], "n %u k %u round %lu: nodes disagree", n, k,
                      (unsigned long)round);
      ck_assert_int_eq(__builtin_popcountll(node[0]), (int)k);
      ck_assert_msg(n == 64 || node[0] >> n == 0, "a rank beyond the members is sampled");
      differs |= node[0] ^ first;
    }
    ck_assert_msg(k == n || differs != 0, "n %u k %u: the same sample every round", n, k);
  }
  ck_assert(td_sample_draw(1, 3, 10, 3) != td_sample_draw(2, 3, 10, 3) ||
            td_sample_draw(1, 4, 10, 3) != td_sample_draw(2, 4, 10, 3)); /* the seed matters */
}
END_TEST

/* 10 members, 3 a round, 6000 rounds: each is drawn 1800 times on average
 * (binomial sd about 35); every count within 6 sd. */
START_TEST(every_member_is_sampled_about_equally) {
  unsigned count[10] = {0};
  for (uint64_t round = 1; round <= 6000; round++) {
    uint64_t m = td_sample_draw(7, round, 10, 3);
    for (unsigned i = 0; i < 10; i++)
      count[i] += (unsigned)(m >> i & 1);
  }
  for (unsigned i = 0; i < 10; i++)
    ck_assert_msg(count[i] > 1800 - 215 && count[i] < 1800 + 215, "member %u: %u of 6000", i,
                  count[i]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sample");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, size_follows_the_fraction_or_the_count);
  tcase_add_test(tc, every_node_draws_the_same_sample_of_the_right_size);
  tcase_add_test(tc, every_member_is_sampled_about_equally);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
