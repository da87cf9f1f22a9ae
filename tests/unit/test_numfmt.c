/* test_numfmt.c: doubles as people read them: the shortest form that reads
 * back exactly, and a table cell that never outgrows its column. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/numfmt.h"

START_TEST(exact_is_shortest_round_trip) {
  char b[40];
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, 0.05), "0.05");
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, 30), "30");
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, 1e-3), "0.001");
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, 0.1 + 0.2), "0.30000000000000004");
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, NAN), "nan");
  ck_assert_str_eq(td_numfmt_exact(b, sizeof b, -INFINITY), "-inf");
  /* every value reads back as itself */
  for (double v = 1e-9; v < 1e12; v *= 3.7) {
    td_numfmt_exact(b, sizeof b, v);
    ck_assert(strtod(b, NULL) == v);
  }
}
END_TEST

START_TEST(bounded_fits_its_width) {
  char b[64];
  ck_assert_str_eq(td_numfmt_bounded(b, sizeof b, 0.69314, 4, 8), "0.6931");
  ck_assert_str_eq(td_numfmt_bounded(b, sizeof b, 1.2345678e30, 4, 8), "1.23e+30");
  ck_assert_str_eq(td_numfmt_bounded(b, sizeof b, INFINITY, 4, 8), "inf");
  ck_assert_str_eq(td_numfmt_bounded(b, sizeof b, NAN, 4, 8), "nan");
  ck_assert_uint_le(strlen(td_numfmt_bounded(b, sizeof b, -9.87654321e-300, 4, 8)), 10);
}
END_TEST

int main(void) {
  Suite *s = suite_create("numfmt");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, exact_is_shortest_round_trip);
  tcase_add_test(tc, bounded_fits_its_width);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
