/* test_backend.c: choosing a backend by name, in any build and on any machine.
 *
 * `backend = auto | cpu | cuda[:INDEX]`: malformed names are TD_ECONFIG with a
 * reason; "cuda" without the backend compiled in, or without a usable GPU, is
 * TD_EDEVICE with a reason (the CUDA error text when it is compiled in); an
 * index past the devices present is TD_EDEVICE; and "auto" opens the GPU when
 * there is one and otherwise the CPU, saying which and why. None of this needs
 * a device: what is asserted adapts to what this machine has, and the op-by-op
 * GPU checks live in test_backend_cuda (which skips without a device).
 *
 * Then the CPU backend's memory and ops against scalar references: the BLAS
 * path against a naive triple loop for every transpose combination, and the
 * fused passes (bias + activation, its backward, softmax cross-entropy)
 * against scalar code in double. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "common/error.h"
#include "compute/rng.h"

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

static td_backend_t *open_cpu(void) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", 1, why, sizeof why) == 0, "%s", why);
  ck_assert_ptr_nonnull(be);
  return be;
}

static void fill_normal(float *a, size_t n, td_rng_t *rng) {
  for (size_t i = 0; i < n; i++)
    a[i] = (float)td_rng_normal(rng);
}

static float *alloc_floats(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- backend: registry and memory --------------------------------------- */

START_TEST(backends_open_by_name_and_say_why_not) {
  char why[256] = "";
  td_backend_t *be = NULL;
  ck_assert(td_backend_available("cpu"));
  ck_assert(!td_backend_available("nope"));
  ck_assert(!td_backend_available(NULL));
  if (!td_backend_available("cuda")) {
    ck_assert_int_eq(td_backend_open(&be, "cuda", 0, why, sizeof why), TD_EDEVICE);
    ck_assert_ptr_null(be);
    ck_assert_ptr_nonnull(strstr(why, "--with-cuda"));
  }
  why[0] = '\0';
  ck_assert_int_eq(td_backend_open(&be, "nope", 0, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(be);
  ck_assert_ptr_nonnull(strstr(why, "nope"));
  ck_assert_int_eq(td_backend_open(&be, NULL, 0, why, sizeof why), TD_ECONFIG);

  be = open_cpu();
  ck_assert_str_eq(td_backend_name(be), "cpu");
  float *dev = td_backend_alloc(be, 37 * sizeof(float));
  ck_assert_ptr_nonnull(dev);
  ck_assert_uint_eq((uintptr_t)dev % 64, 0);
  for (int i = 0; i < 37; i++)
    ck_assert_float_eq(dev[i], 0.0f);
  float host[37], back[37];
  for (int i = 0; i < 37; i++)
    host[i] = (float)i - 0.5f;
  ck_assert_int_eq(td_backend_upload(be, dev, host, sizeof host), 0);
  ck_assert_int_eq(td_backend_download(be, back, dev, sizeof back), 0);
  td_backend_synchronize(be);
  ck_assert_int_eq(memcmp(host, back, sizeof host), 0);
  td_backend_free(be, dev);
  td_backend_free(be, NULL);
  td_backend_close(&be);
  ck_assert_ptr_null(be);
  td_backend_close(&be);
}
END_TEST

/* ---- backend ops against scalar references ------------------------------ */

/* op(X)[i][j] for a row-major X with leading dimension ld. */
static double at(const float *x, int ld, bool trans, int i, int j) {
  return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

START_TEST(gemm_matches_a_naive_loop_for_every_transpose) {
  td_backend_t *be = open_cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  static const int shapes[][3] = {{7, 5, 3}, {33, 17, 9}, {1, 64, 1}, {64, 10, 128}};
  static const float alphas[] = {1.0f, 0.75f}, betas[] = {0.0f, 0.5f};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int ab = 0; ab < 2; ab++) {
          int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
          /* leading dimensions wider than the matrices, the padding poisoned
           * with NaN: a kernel that reads outside op(A) or op(B) fails */
          int a_rows = ta ? k : m, a_cols = ta ? m : k, lda = a_cols + 3;
          int b_rows = tb ? n : k, b_cols = tb ? k : n, ldb = b_cols + 2;
          int ldc = n + 1;
          float *a = alloc_floats((size_t)a_rows * lda), *b = alloc_floats((size_t)b_rows * ldb);
          float *c = alloc_floats((size_t)m * ldc), *c0 = alloc_floats((size_t)m * ldc);
          for (size_t i = 0; i < (size_t)a_rows * lda; i++)
            a[i] = (int)(i % lda) < a_cols ? (float)td_rng_normal(&rng) : NAN;
          for (size_t i = 0; i < (size_t)b_rows * ldb; i++)
            b[i] = (int)(i % ldb) < b_cols ? (float)td_rng_normal(&rng) : NAN;
          for (size_t i = 0; i < (size_t)m * ldc; i++) /* beta = 0 must not read C */
            c0[i] = (int)(i % ldc) == n ? 12345.0f : betas[ab] == 0 ? NAN
                                                                     : (float)td_rng_normal(&rng);
          memcpy(c, c0, (size_t)m * ldc * sizeof *c);
          td_backend_gemm(be, ta, tb, m, n, k, alphas[ab], a, lda, b, ldb, betas[ab], c, ldc);
          for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) {
              double ref = 0, mag = 0;
              for (int p = 0; p < k; p++) {
                ref += at(a, lda, ta, i, p) * at(b, ldb, tb, p, j);
                mag += fabs(at(a, lda, ta, i, p) * at(b, ldb, tb, p, j));
              }
              ref = alphas[ab] * ref + (betas[ab] != 0 ? betas[ab] * c0[(size_t)i * ldc + j] : 0);
              double got = c[(size_t)i * ldc + j];
              ck_assert_msg(fabs(got - ref) <= 1e-4 * (fabs(ref) + mag + 1e-6),
                            "%dx%dx%d ta%d tb%d (%d,%d): %g vs %g", m, n, k, ta, tb, i, j, got,
                            ref);
            }
            ck_assert_float_eq(c[(size_t)i * ldc + n], 12345.0f); /* outside C: untouched */
          }
          free(a);
          free(b);
          free(c);
          free(c0);
        }
  td_backend_close(&be);
}
END_TEST

START_TEST(bias_act_adds_the_bias_then_relu) {
  td_backend_t *be = open_cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 2);
  enum { R = 5, C = 37 }; /* odd widths exercise the vector loops' tails */
  float y0[R * C], y[R * C], bias[C];
  fill_normal(y0, R * C, &rng);
  fill_normal(bias, C, &rng);
  memcpy(y, y0, sizeof y);
  td_backend_bias_act(be, y, bias, R, C, TD_ACT_RELU);
  for (int i = 0; i < R * C; i++) {
    float v = y0[i] + bias[i % C];
    ck_assert_float_eq(y[i], v > 0 ? v : 0.0f);
  }
  memcpy(y, y0, sizeof y);
  td_backend_bias_act(be, y, bias, R, C, TD_ACT_NONE);
  for (int i = 0; i < R * C; i++)
    ck_assert_float_eq(y[i], y0[i] + bias[i % C]);
  /* a NaN is not hidden by the ReLU, so the loss can report it */
  memcpy(y, y0, sizeof y);
  y[7] = NAN;
  td_backend_bias_act(be, y, bias, R, C, TD_ACT_RELU);
  ck_assert(isnan(y[7]));
  td_backend_close(&be);
}
END_TEST

START_TEST(act_backward_masks_and_sums_columns) {
  td_backend_t *be = open_cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  enum { R = 9, C = 19 };
  float y[R * C], dy0[R * C], dy[R * C], dbias[C];
  fill_normal(y, R * C, &rng);
  for (int i = 0; i < R * C; i += 4)
    y[i] = 0.0f; /* an activated output of exactly 0: the ReLU was off */
  fill_normal(dy0, R * C, &rng);
  for (int act = TD_ACT_NONE; act <= TD_ACT_RELU; act++) {
    memcpy(dy, dy0, sizeof dy);
    for (int c = 0; c < C; c++)
      dbias[c] = 99.0f; /* overwritten, not accumulated */
    td_backend_act_backward(be, dy, y, dbias, R, C, (td_act_t)act);
    for (int c = 0; c < C; c++) {
      double sum = 0;
      for (int r = 0; r < R; r++) {
        float want = act == TD_ACT_RELU && !(y[r * C + c] > 0) ? 0.0f : dy0[r * C + c];
        ck_assert_float_eq(dy[r * C + c], want);
        sum += want;
      }
      ck_assert_double_eq_tol(dbias[c], sum, 1e-5);
    }
  }
  td_backend_close(&be);
}
END_TEST

START_TEST(softmax_xent_matches_a_double_reference) {
  td_backend_t *be = open_cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  enum { R = 6, C = 37 };
  float z[R * C], d[R * C];
  fill_normal(z, R * C, &rng);
  for (int c = 0; c < C; c++) /* the last row is huge: only a max-shifted softmax survives */
    z[(R - 1) * C + c] = 1000.0f - (float)c;
  int32_t labels[R] = {0, 36, 5, 5, 17, 0};
  int hits = -1;
  double loss = td_backend_softmax_xent(be, z, labels, d, 1.0f, R, C, &hits);
  double ref_loss = 0;
  int ref_hits = 0;
  for (int r = 0; r < R; r++) {
    const float *row = z + r * C;
    double max = row[0], sum = 0, p_sum = 0;
    int argmax = 0;
    for (int c = 1; c < C; c++)
      if (row[c] > max) {
        max = row[c];
        argmax = c;
      }
    for (int c = 0; c < C; c++)
      sum += exp(row[c] - max);
    ref_loss += -log(exp(row[labels[r]] - max) / sum); /* -log p_label */
    ref_hits += argmax == labels[r];
    for (int c = 0; c < C; c++) {
      double p = exp(row[c] - max) / sum;
      ck_assert_double_eq_tol(d[r * C + c], p - (c == labels[r]), 1e-6);
      p_sum += d[r * C + c] + (c == labels[r]); /* dlogits + onehot = softmax */
    }
    ck_assert_double_eq_tol(p_sum, 1.0, 1e-5);
  }
  ck_assert(isfinite(loss));
  ck_assert_double_eq_tol(loss, ref_loss, 1e-5 * ref_loss);
  ck_assert_int_eq(hits, ref_hits);
  ck_assert_int_ge(hits, 1); /* the huge row is a hit, so argmax is exercised */

  /* grad_scale multiplies the whole gradient; evaluation needs no dlogits */
  float d_half[R * C];
  double loss_half = td_backend_softmax_xent(be, z, labels, d_half, 0.5f, R, C, NULL);
  ck_assert_double_eq_tol(loss_half, loss, 1e-12);
  for (int i = 0; i < R * C; i++)
    ck_assert_double_eq_tol(d_half[i], 0.5 * d[i], 1e-7);
  hits = -1;
  ck_assert_double_eq_tol(td_backend_softmax_xent(be, z, labels, NULL, 0, R, C, &hits), loss,
                          1e-9);
  ck_assert_int_eq(hits, ref_hits);

  /* a label outside [0, cols) is reported as a NaN loss, not used as an index */
  labels[2] = C;
  ck_assert(isnan(td_backend_softmax_xent(be, z, labels, d, 1, R, C, NULL)));
  labels[2] = -1;
  ck_assert(isnan(td_backend_softmax_xent(be, z, labels, NULL, 1, R, C, NULL)));
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

  TCase *ops = tcase_create("cpu");
  tcase_add_test(ops, backends_open_by_name_and_say_why_not);
  tcase_add_test(ops, gemm_matches_a_naive_loop_for_every_transpose);
  tcase_add_test(ops, bias_act_adds_the_bias_then_relu);
  tcase_add_test(ops, act_backward_masks_and_sums_columns);
  tcase_add_test(ops, softmax_xent_matches_a_double_reference);
  suite_add_tcase(s, ops);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
