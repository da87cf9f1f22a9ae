/* test_backend.c: choosing a backend by name, in any build and on any machine.
 *
 * `backend = auto | cpu | cuda[:INDEX]`: malformed names are TD_ECONFIG with a
 * reason; "cuda" without the backend compiled in, or without a usable GPU, is
 * TD_EDEVICE with a reason (the CUDA error text when it is compiled in); an
 * index past the devices present is TD_EDEVICE; and "auto" opens the GPU when
 * there is one and otherwise the CPU, saying which and why. None of this needs
 * a device: what is asserted adapts to what this machine has, and the op-by-op
 * GPU checks live in test_backend_cuda (which skips without a device). */
#include <check.h>
#include <string.h>

#include "compute/backend.h"
#include "common/error.h"

/* Whether this machine has a usable CUDA device (and the backend is built). */
static bool have_gpu(void) {
  td_backend_t *be = NULL;
  if (td_backend_open(&be, "cuda", 1, NULL, 0) != 0)
    return false;
  td_backend_close(&be);
  return true;
}

START_TEST(test_names_are_checked) {
  static const char *const good[] = {"auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:99", "cuda:255"};
  static const char *const bad[] = {"",       "gpu",     "CUDA",    "cuda:",   "cuda:x",
                                    "cuda:-1", "cuda:1x", "cuda:256", "cuda:1000", "cuda0",
                                    "cudax",  "cpu:0",   "auto:1",  " cpu"};
  char why[256];
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    ck_assert_msg(td_backend_check_name(good[i], why, sizeof why) == 0, "%s: %s", good[i], why);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    why[0] = '\0';
    ck_assert_int_eq(td_backend_check_name(bad[i], why, sizeof why), TD_ECONFIG);
    ck_assert_msg(strstr(why, "backend") != NULL, "%s: no reason", bad[i]);
  }
  ck_assert_int_eq(td_backend_check_name(NULL, why, sizeof why), TD_ECONFIG);
}
END_TEST

START_TEST(test_parse_error_before_device) {
  /* a malformed index is a config error whether or not CUDA is built or present */
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_backend_open(&be, "cuda:x", 1, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(be);
  ck_assert_msg(strstr(why, "cuda:x") != NULL && strstr(why, "INDEX") != NULL, "%s", why);
  ck_assert_int_eq(td_backend_open(&be, "cuda:256", 1, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(be);
  ck_assert(!td_backend_available("cuda:x"));
  ck_assert(td_backend_available("auto"));
  ck_assert(td_backend_available("cpu"));
}
END_TEST

START_TEST(test_cuda_refused_with_reason) {
  td_backend_t *be = NULL;
  char why[256] = "";
  if (!td_backend_available("cuda")) {
    /* a CPU-only build: every cuda name says it is not compiled in */
    ck_assert(!td_backend_available("cuda:3"));
    ck_assert_int_eq(td_backend_open(&be, "cuda", 1, why, sizeof why), TD_EDEVICE);
    ck_assert_msg(strstr(why, "not compiled in") != NULL, "%s", why);
    ck_assert_int_eq(td_backend_open(&be, "cuda:99", 1, why, sizeof why), TD_EDEVICE);
    ck_assert_msg(strstr(why, "not compiled in") != NULL, "%s", why);
    ck_assert_ptr_null(be);
    return;
  }
  ck_assert(td_backend_available("cuda:3")); /* compiled in; says nothing of devices */
  if (!have_gpu()) {
    /* built with CUDA on a machine without a GPU (CI): the CUDA runtime's own
     * words come back, for cuda and every index */
    ck_assert_int_eq(td_backend_open(&be, "cuda", 1, why, sizeof why), TD_EDEVICE);
    ck_assert_ptr_null(be);
    ck_assert_msg(strstr(why, "cudaGetDeviceCount: ") != NULL ||
                      strstr(why, "no CUDA device") != NULL,
                  "%s", why);
    ck_assert_msg(strlen(why) > strlen("no usable CUDA device: cudaGetDeviceCount: "), "%s",
                  why);
    ck_assert_int_eq(td_backend_open(&be, "cuda:99", 1, why, sizeof why), TD_EDEVICE);
    ck_assert_ptr_null(be);
    return;
  }
  /* a GPU machine: an index past the devices is refused by number */
  ck_assert_int_eq(td_backend_open(&be, "cuda:99", 1, why, sizeof why), TD_EDEVICE);
  ck_assert_ptr_null(be);
  ck_assert_msg(strstr(why, "index 99") != NULL, "%s", why);
}
END_TEST

START_TEST(test_auto_says_which_and_why) {
  td_backend_t *be = NULL;
  char reason[512] = "";
  ck_assert_int_eq(td_backend_open_auto(&be, "auto", 1, reason, sizeof reason), 0);
  ck_assert_ptr_nonnull(be);
  if (have_gpu()) {
    ck_assert_str_eq(td_backend_name(be), "cuda");
    ck_assert_msg(strstr(reason, "cuda:0 ") == reason, "%s", reason);
    ck_assert_msg(strstr(reason, "usable GPU was found") != NULL, "%s", reason);
  } else {
    ck_assert_str_eq(td_backend_name(be), "cpu");
    ck_assert_msg(strstr(reason, "cpu (auto: no usable GPU: ") == reason, "%s", reason);
    /* and the reason is the GPU's own refusal */
    const char *expect = td_backend_available("cuda") ? "CUDA device" : "not compiled in";
    ck_assert_msg(strstr(reason, expect) != NULL, "%s", reason);
  }
  ck_assert_int_eq(td_backend_error(be, reason, sizeof reason), 0);
  td_backend_close(&be);
  ck_assert_ptr_null(be);

  /* plain td_backend_open takes "auto" too, so a config's value can go straight in */
  ck_assert_int_eq(td_backend_open(&be, "auto", 1, NULL, 0), 0);
  ck_assert_str_eq(td_backend_name(be), have_gpu() ? "cuda" : "cpu");
  td_backend_close(&be);

  /* a named backend says it was configured; a failure leaves the error in reason */
  ck_assert_int_eq(td_backend_open_auto(&be, "cpu", 1, reason, sizeof reason), 0);
  ck_assert_str_eq(reason, "cpu (as configured)");
  ck_assert_str_eq(td_backend_describe(be), "cpu");
  ck_assert(!td_backend_device_memory(be));
  td_backend_close(&be);
  ck_assert_int_eq(td_backend_open_auto(&be, "tpu", 1, reason, sizeof reason), TD_ECONFIG);
  ck_assert_msg(strstr(reason, "unknown backend 'tpu'") != NULL, "%s", reason);
  ck_assert_ptr_null(be);
}
END_TEST

START_TEST(test_cpu_memory_round_trip) {
  /* the contract every backend keeps: zero-filled alloc, upload, download */
  td_backend_t *be = NULL;
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, NULL, 0), 0);
  float host[37], back[37];
  float *dev = td_backend_alloc(be, sizeof host);
  ck_assert_ptr_nonnull(dev);
  ck_assert_int_eq(td_backend_download(be, back, dev, sizeof back), 0);
  for (int i = 0; i < 37; i++) {
    ck_assert(back[i] == 0.0f);
    host[i] = (float)i - 3.5f;
  }
  ck_assert_int_eq(td_backend_upload(be, dev, host, sizeof host), 0);
  ck_assert_int_eq(td_backend_download(be, back, dev, sizeof back), 0);
  ck_assert(memcmp(host, back, sizeof host) == 0);
  td_backend_free(be, dev);
  td_backend_close(&be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("backend");
  TCase *tc = tcase_create("names");
  tcase_add_test(tc, test_names_are_checked);
  tcase_add_test(tc, test_parse_error_before_device);
  tcase_add_test(tc, test_cuda_refused_with_reason);
  tcase_add_test(tc, test_auto_says_which_and_why);
  tcase_add_test(tc, test_cpu_memory_round_trip);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
