/* test_params.c: the flat parameter buffer and its layout
 * (compute/params.h), as a reader would use them: every tensor starts
 * aligned, the padding between tensors is counted apart from the parameters,
 * and the buffer comes back zeroed and aligned. (A model's own layout is
 * tested in test_model.c.) */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/params.h"

/* ---- params: the flat buffer and its layout ----------------------------- */

START_TEST(layout_aligns_every_tensor_and_counts_padding_apart) {
  td_layout_t *l = NULL;
  ck_assert_int_eq(td_layout_new(&l), 0);
  const uint32_t w[2] = {3, 5}, b[1] = {3}, t[4] = {2, 3, 1, 7};
  ck_assert_int_eq(td_layout_add(l, "w", 2, w), 0); /* returns the index */
  ck_assert_int_eq(td_layout_add(l, "b", 1, b), 1);
  ck_assert_int_eq(td_layout_add(l, "t", 4, t), 2);
  ck_assert_uint_eq(td_layout_count(l), 3);
  size_t sum = 0;
  for (size_t i = 0; i < td_layout_count(l); i++) {
    const td_tensor_info_t *ti = td_layout_tensor(l, i);
    ck_assert_uint_eq(ti->offset % TD_PARAMS_ALIGN_FLOATS, 0);
    if (i > 0) /* tensors never overlap */
      ck_assert_uint_ge(ti->offset, td_layout_tensor(l, i - 1)->offset +
                                        td_layout_tensor(l, i - 1)->numel);
    sum += ti->numel;
  }
  ck_assert_uint_eq(td_layout_tensor(l, 0)->numel, 15);
  ck_assert_uint_eq(td_layout_tensor(l, 2)->numel, 42);
  ck_assert_uint_eq(td_layout_param_count(l), sum);
  ck_assert_uint_eq(td_layout_numel(l), 16 + 16 + 48); /* 15, 3 and 42 floats, padded */
  ck_assert_ptr_null(td_layout_tensor(l, 3));

  /* bad tensors are refused and leave the layout as it was */
  const uint32_t zero[2] = {4, 0}, huge[4] = {UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX};
  char long_name[TD_TENSOR_NAME_MAX + 1];
  memset(long_name, 'x', TD_TENSOR_NAME_MAX);
  long_name[TD_TENSOR_NAME_MAX] = '\0';
  ck_assert_int_eq(td_layout_add(l, "z", 2, zero), TD_EINVAL);
  ck_assert_int_eq(td_layout_add(l, "r0", 0, w), TD_EINVAL);
  ck_assert_int_eq(td_layout_add(l, "r5", TD_TENSOR_MAX_DIMS + 1, t), TD_EINVAL);
  ck_assert_int_eq(td_layout_add(l, long_name, 1, b), TD_EINVAL);
  ck_assert_int_eq(td_layout_add(l, "", 1, b), TD_EINVAL);
  ck_assert_int_eq(td_layout_add(l, "w", 1, b), TD_EINVAL); /* names are unique */
  ck_assert_int_eq(td_layout_add(l, "huge", 4, huge), TD_ERANGE);
  ck_assert_uint_eq(td_layout_count(l), 3);
  ck_assert_uint_eq(td_layout_param_count(l), sum);

  /* buffers: 64-byte aligned and zero-filled, padding included */
  float *buf = td_params_alloc(td_layout_numel(l));
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq((uintptr_t)buf % 64, 0);
  for (size_t i = 0; i < td_layout_numel(l); i++)
    ck_assert_float_eq(buf[i], 0.0f);
  td_params_free(&buf);
  ck_assert_ptr_null(buf);
  td_params_free(&buf); /* NULL-safe */
  ck_assert_ptr_null(td_params_alloc(SIZE_MAX / 2));
  td_layout_free(&l);
  ck_assert_ptr_null(l);
  td_layout_free(&l);
}
END_TEST

int main(void) {
  Suite *s = suite_create("params");
  TCase *params = tcase_create("params");
  tcase_add_test(params, layout_aligns_every_tensor_and_counts_padding_apart);
  suite_add_tcase(s, params);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
