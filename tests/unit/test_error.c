/* test_error.c: the error table. Every code has a distinct name and message,
 * and td_why() both fills the buffer and passes the code through. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

START_TEST(every_code_has_a_name_and_message) {
  static const int codes[] = {
#define X(name, code, msg) TD_##name,
      TD_ERRNO_MAP(X)
#undef X
  };
  size_t n = sizeof codes / sizeof codes[0];
  ck_assert_uint_ge(n, 10);
  for (size_t i = 0; i < n; i++) {
    ck_assert_int_lt(codes[i], 0);
    ck_assert_str_ne(td_strerror(codes[i]), "unknown error");
    ck_assert_str_ne(td_err_name(codes[i]), "TD_EUNKNOWN");
    for (size_t j = 0; j < i; j++) {
      ck_assert_int_ne(codes[i], codes[j]);
      ck_assert_str_ne(td_strerror(codes[i]), td_strerror(codes[j]));
    }
  }
  ck_assert_str_eq(td_err_name(TD_ECORRUPT), "TD_ECORRUPT");
  ck_assert_str_eq(td_strerror(TD_OK), "success");
  ck_assert_str_eq(td_strerror(12345), "unknown error");
}
END_TEST

START_TEST(why_formats_and_returns_the_code) {
  char why[16];
  ck_assert_int_eq(td_why(why, sizeof why, TD_ECONFIG, "bad %s=%d", "batch", 0), TD_ECONFIG);
  ck_assert_str_eq(why, "bad batch=0");
  /* truncates instead of overflowing */
  td_why(why, sizeof why, TD_ECONFIG, "%s", "0123456789abcdefghij");
  ck_assert_uint_eq(strlen(why), sizeof why - 1);
  /* a NULL buffer is allowed */
  ck_assert_int_eq(td_why(NULL, 0, TD_EIO, "ignored"), TD_EIO);
}
END_TEST

int main(void) {
  Suite *s = suite_create("error");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, every_code_has_a_name_and_message);
  tcase_add_test(tc, why_formats_and_returns_the_code);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
