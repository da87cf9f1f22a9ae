/* test_suggest.c: the edit distance and the nearest-name suggestion that
 * trainctl's commands and the run and daemon keys use for "did you mean". */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/suggest.h"

START_TEST(distance_counts_edits) {
  ck_assert_uint_eq(td_suggest_distance("codec", "codec"), 0);
  ck_assert_uint_eq(td_suggest_distance("codc", "codec"), 1);    /* a deletion */
  ck_assert_uint_eq(td_suggest_distance("stauts", "status"), 1); /* a swap */
  ck_assert_uint_eq(td_suggest_distance("", "abc"), 3);
  ck_assert_uint_eq(td_suggest_distance("kitten", "sitting"), 3);
  char longer[80];
  memset(longer, 'a', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  ck_assert_uint_eq(td_suggest_distance(longer, "a"), (size_t)-1);
}
END_TEST

START_TEST(nearest_only_when_close) {
  static const char *const names[] = {"status", "stop", "start", "show", "runs"};
  ck_assert_str_eq(td_suggest_nearest("stauts", names, 5), "status");
  ck_assert_str_eq(td_suggest_nearest("strat", names, 5), "start");
  ck_assert_str_eq(td_suggest_nearest("run", names, 5), "runs");
  ck_assert_ptr_null(td_suggest_nearest("frobnicate", names, 5));
  ck_assert_ptr_null(td_suggest_nearest("x", names, 0));
}
END_TEST

START_TEST(unknown_lists_every_name) {
  static const char *const names[] = {"model", "codec", "rounds"};
  char buf[128];
  ck_assert_str_eq(td_suggest_unknown(buf, sizeof buf, "key", "codc", names, 3),
                   "unknown key 'codc': did you mean 'codec'? (known: model, codec, rounds)");
  ck_assert_str_eq(td_suggest_unknown(buf, sizeof buf, "key", "zzzzzzzz", names, 3),
                   "unknown key 'zzzzzzzz' (known: model, codec, rounds)");
  char small[20]; /* cut, never overrun */
  td_suggest_unknown(small, sizeof small, "key", "codc", names, 3);
  ck_assert_uint_eq(strlen(small), sizeof small - 1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("suggest");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, distance_counts_edits);
  tcase_add_test(tc, nearest_only_when_close);
  tcase_add_test(tc, unknown_lists_every_name);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
