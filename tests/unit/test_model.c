/* test_model.c: the compute core against references.
 *
 * GEMMs against a naive triple loop for every transpose combination; the fused
 * passes against scalar code; the whole backward pass against central finite
 * differences for every parameter tensor (and a check that the comparison
 * would catch a wrong gradient); SGD variants against hand-computed values;
 * LR schedules at known points; init statistics; determinism; bad specs. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/error.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/params.h"
#include "compute/rng.h"

static td_backend_t *cpu(void) {
  td_backend_t *be = NULL;
  char why[128];
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, why, sizeof why), 0);
  return be;
}

static void fill(float *a, size_t n, td_rng_t *rng) {
  for (size_t i = 0; i < n; i++)
    a[i] = (float)td_rng_normal(rng);
}

START_TEST(gemm_matches_naive_for_all_transposes) {
  td_backend_t *be = cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  static const int shapes[][3] = {{7, 5, 3}, {33, 17, 9}, {1, 64, 1}};
  for (size_t s = 0; s < 3; s++) {
    int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        float a[33 * 17], b[33 * 64], c[33 * 64];
        fill(a, (size_t)m * k, &rng);
        fill(b, (size_t)k * n, &rng);
        int lda = ta ? m : k, ldb = tb ? k : n;
        td_backend_gemm(be, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            double ref = 0;
            for (int p = 0; p < k; p++)
              ref += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                     (tb ? b[j * ldb + p] : b[p * ldb + j]);
            ck_assert_msg(fabs(c[i * n + j] - ref) <= 1e-4 * (1 + fabs(ref)),
                          "m%d n%d k%d ta%d tb%d (%d,%d): %g vs %g", m, n, k, ta, tb, i, j,
                          c[i * n + j], ref);
          }
      }
  }
  td_backend_close(&be);
}
END_TEST

START_TEST(fused_passes_match_scalar_code) {
  td_backend_t *be = cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 2);
  enum { R = 5, C = 37 };
  float y[R * C], y0[R * C], bias[C], dy[R * C], dy0[R * C], db[C];
  fill(y0, R * C, &rng);
  fill(bias, C, &rng);
  memcpy(y, y0, sizeof y);
  td_backend_bias_act(be, y, bias, R, C, TD_ACT_RELU);
  for (int i = 0; i < R * C; i++)
    ck_assert_float_eq(y[i], fmaxf(0.0f, y0[i] + bias[i % C]));
  fill(dy0, R * C, &rng);
  memcpy(dy, dy0, sizeof dy);
  td_backend_act_backward(be, dy, y, db, R, C, TD_ACT_RELU);
  for (int c = 0; c < C; c++) {
    double sum = 0;
    for (int r = 0; r < R; r++) {
      float want = y[r * C + c] > 0 ? dy0[r * C + c] : 0.0f;
      ck_assert_float_eq(dy[r * C + c], want);
      sum += want;
    }
    ck_assert_double_eq_tol(db[c], sum, 1e-5);
  }
  /* softmax cross-entropy: loss = -log p_label, gradient = (p - onehot) * scale */
  int32_t labels[R] = {0, 36, 5, 5, 17};
  float d[R * C];
  int hits = -1;
  double loss = td_backend_softmax_xent(be, y0, labels, d, 0.5f, R, C, &hits);
  double ref = 0;
  int ref_hits = 0;
  for (int r = 0; r < R; r++) {
    double mx = -1e30, sum = 0;
    int arg = 0;
    for (int c = 0; c < C; c++)
      if (y0[r * C + c] > mx)
        mx = y0[r * C + c], arg = c;
    for (int c = 0; c < C; c++)
      sum += exp(y0[r * C + c] - mx);
    ref += -(y0[r * C + labels[r]] - mx - log(sum));
    ref_hits += arg == labels[r];
    double row = 0;
    for (int c = 0; c < C; c++) {
      double p = exp(y0[r * C + c] - mx) / sum;
      ck_assert_double_eq_tol(d[r * C + c], 0.5 * (p - (c == labels[r])), 1e-6);
      row += d[r * C + c];
    }
    ck_assert_double_eq_tol(row, 0.0, 1e-6); /* probabilities sum to one */
  }
  ck_assert_double_eq_tol(loss, ref, 1e-5);
  ck_assert_int_eq(hits, ref_hits);
  labels[0] = 99; /* a bad label is reported, not used as an index */
  ck_assert(isnan(td_backend_softmax_xent(be, y0, labels, d, 1, R, C, NULL)));
  td_backend_close(&be);
}
END_TEST

/* Mean loss of the model on (x, y) in double, for finite differences. */
static double loss_at(td_model_t *m, const float *x, const int32_t *y, int rows) {
  double sum = 0;
  int hits = 0;
  ck_assert_int_eq(td_model_eval_batch(m, x, y, rows, &sum, &hits), 0);
  return sum / rows;
}

START_TEST(backward_matches_finite_differences) {
  td_backend_t *be = cpu();
  td_model_t *m = NULL;
  char why[128];
  ck_assert_int_eq(td_model_open(&m, "mlp:6-5-4-3", be, 4, why, sizeof why), 0);
  td_model_init(m, 11);
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  float x[4 * 6];
  fill(x, 24, &rng);
  int32_t y[4] = {0, 2, 1, 2};
  /* nudge biases off zero so no ReLU sits exactly at its kink */
  float *w = td_model_params(m);
  const td_layout_t *lay = td_model_layout(m);
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    if (ti->ndim == 1)
      for (size_t i = 0; i < ti->numel; i++)
        w[ti->offset + i] = 0.1f * (float)td_rng_normal(&rng);
  }
  double loss;
  int hits;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 4, &loss, &hits), 0);
  size_t numel = td_model_numel(m);
  float *g = malloc(numel * sizeof *g);
  memcpy(g, td_model_grads(m), numel * sizeof *g);
  ck_assert_double_eq_tol(loss, loss_at(m, x, y, 4), 1e-6);
  const float eps = 1e-2f;
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    double max_err = 0, max_err_wrong = 0, scale = 1e-3;
    for (size_t i = 0; i < ti->numel; i++) {
      float *p = &w[ti->offset + i];
      float keep = *p;
      *p = keep + eps;
      double up = loss_at(m, x, y, 4);
      *p = keep - eps;
      double down = loss_at(m, x, y, 4);
      *p = keep;
      double fd = (up - down) / (2 * eps);
      double an = g[ti->offset + i];
      scale = fmax(scale, fmax(fabs(fd), fabs(an)));
      max_err = fmax(max_err, fabs(fd - an));
      max_err_wrong = fmax(max_err_wrong, fabs(fd - 1.1 * an));
    }
    ck_assert_msg(max_err / scale < 2e-2, "%s: relative error %g", ti->name, max_err / scale);
    /* the same comparison flags a gradient that is 10% off */
    ck_assert_msg(max_err_wrong / scale > 2e-2, "%s: check too weak", ti->name);
  }
  free(g);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

START_TEST(layout_init_and_determinism) {
  td_backend_t *be = cpu();
  td_model_t *a = NULL, *b = NULL, *c = NULL;
  char why[128];
  ck_assert_int_eq(td_model_open(&a, "mlp:784-256-128-10", be, 8, why, sizeof why), 0);
  const td_layout_t *lay = td_model_layout(a);
  ck_assert_uint_eq(td_layout_param_count(lay), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  ck_assert_uint_eq(td_layout_count(lay), 6);
  for (size_t t = 0; t < td_layout_count(lay); t++)
    ck_assert_uint_eq(td_layout_tensor(lay, t)->offset % TD_PARAMS_ALIGN_FLOATS, 0);
  ck_assert_str_eq(td_layout_tensor(lay, 0)->name, "fc0.weight");
  ck_assert_uint_eq(td_layout_tensor(lay, 0)->shape[0], 256);
  ck_assert_uint_eq(td_layout_tensor(lay, 0)->shape[1], 784);
  td_model_init(a, 5);
  const float *w = td_model_params(a);
  double s2 = 0;
  for (size_t i = 0; i < 784 * 256; i++)
    s2 += (double)w[i] * w[i];
  double std = sqrt(s2 / (784 * 256));
  ck_assert_double_eq_tol(std, sqrt(2.0 / 784), 0.1 * sqrt(2.0 / 784)); /* He */
  const td_tensor_info_t *out = td_layout_tensor(lay, 4);
  double limit = sqrt(6.0 / (128 + 10));
  for (size_t i = 0; i < out->numel; i++)
    ck_assert(fabs(w[out->offset + i]) <= limit); /* Xavier bound */
  for (size_t i = 0; i < 256; i++)
    ck_assert_float_eq(w[td_layout_tensor(lay, 1)->offset + i], 0.0f);

  /* same seed, same data: bit-identical after 20 steps; another seed differs */
  ck_assert_int_eq(td_model_open(&b, "mlp:784-256-128-10", be, 8, why, sizeof why), 0);
  ck_assert_int_eq(td_model_open(&c, "mlp:784-256-128-10", be, 8, why, sizeof why), 0);
  td_model_init(b, 5);
  td_model_init(c, 6);
  td_sgd_t *oa = NULL, *ob = NULL;
  td_sgd_opts_t so = {.momentum = 0.9};
  td_sgd_open(&oa, be, td_model_numel(a), &so);
  td_sgd_open(&ob, be, td_model_numel(b), &so);
  td_rng_t rng;
  td_rng_seed(&rng, 9);
  float x[8 * 784];
  int32_t y[8];
  for (int step = 0; step < 20; step++) {
    fill(x, 8 * 784, &rng);
    for (int i = 0; i < 8; i++)
      y[i] = (int32_t)td_rng_below(&rng, 10);
    double la, lb;
    int h;
    td_model_train_batch(a, x, y, 8, &la, &h);
    td_sgd_step(oa, td_model_params(a), td_model_grads(a), 0.01);
    td_model_train_batch(b, x, y, 8, &lb, &h);
    td_sgd_step(ob, td_model_params(b), td_model_grads(b), 0.01);
  }
  size_t bytes = td_model_numel(a) * sizeof(float);
  ck_assert_int_eq(memcmp(td_model_params(a), td_model_params(b), bytes), 0);
  ck_assert_int_ne(memcmp(td_model_params(a), td_model_params(c), bytes), 0);
  td_sgd_close(&oa);
  td_sgd_close(&ob);
  td_model_close(&a);
  td_model_close(&b);
  td_model_close(&c);
  ck_assert_ptr_null(a);
  td_backend_close(&be);
}
END_TEST

START_TEST(sgd_variants_match_hand_computation) {
  td_backend_t *be = cpu();
  static const struct { double mu, wd; bool nesterov; } cases[] = {
      {0, 0, false}, {0.9, 0, false}, {0.9, 0.1, false}, {0.9, 0.1, true}, {0, 0.1, false}};
  for (size_t k = 0; k < 5; k++) {
    td_sgd_t *o = NULL;
    td_sgd_opts_t so = {.momentum = cases[k].mu, .nesterov = cases[k].nesterov,
                        .weight_decay = cases[k].wd};
    ck_assert_int_eq(td_sgd_open(&o, be, 3, &so), 0);
    float w[3] = {1.0f, -2.0f, 0.5f};
    double rw[3] = {1.0, -2.0, 0.5}, rv[3] = {0, 0, 0};
    const float grads[3][3] = {{0.1f, 0.2f, -0.3f}, {-0.5f, 0.0f, 0.25f}, {1.0f, -1.0f, 0.0f}};
    for (int step = 0; step < 3; step++) {
      td_sgd_step(o, w, grads[step], 0.1);
      for (int i = 0; i < 3; i++) {
        double g = grads[step][i] + cases[k].wd * rw[i];
        if (cases[k].mu > 0) {
          rv[i] = cases[k].mu * rv[i] + g;
          rw[i] -= 0.1 * (cases[k].nesterov ? g + cases[k].mu * rv[i] : rv[i]);
        } else {
          rw[i] -= 0.1 * g;
        }
      }
    }
    for (int i = 0; i < 3; i++)
      ck_assert_msg(fabs(w[i] - rw[i]) < 1e-6, "case %zu w[%d] %g vs %g", k, i, w[i], rw[i]);
    td_sgd_close(&o);
  }
  td_sgd_t *o = NULL;
  td_sgd_opts_t bad = {.momentum = 1.0};
  ck_assert_int_eq(td_sgd_open(&o, be, 3, &bad), TD_ECONFIG);
  td_backend_close(&be);
}
END_TEST

START_TEST(lr_schedules_at_known_points) {
  td_lr_schedule_t s;
  char why[256] = "";
  ck_assert_int_eq(td_lr_schedule_parse(&s, "constant", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq(td_lr_at(&s, 0), 0.1);
  ck_assert_double_eq(td_lr_at(&s, 99), 0.1);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "cosine", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 0), 0.1, 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 50), 0.05, 1e-9);
  ck_assert_double_eq_tol(td_lr_at(&s, 100), 0.0, 1e-12);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:1:0.5", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 9), 0.1, 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 25), 0.025, 1e-12);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:2", 1.0, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 20), 0.1, 1e-12); /* gamma defaults to 0.1 */
  /* warm-up: linear ramp, then the schedule over the remaining steps */
  ck_assert_int_eq(td_lr_schedule_parse(&s, "cosine", 0.1, 10, 10, 110, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 0), 0.01, 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 4), 0.05, 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 10), 0.1, 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 60), 0.05, 1e-9);
  static const char *bad[] = {"linear", "step:", "step:0", "step:2:0", "step:2:1.5", "step:x",
                              "cosine2", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_int_eq(td_lr_schedule_parse(&s, bad[i], 0.1, 0, 10, 100, why, sizeof why),
                     TD_ECONFIG);
    ck_assert_str_ne(why, "");
  }
}
END_TEST

START_TEST(bad_specs_and_inputs_are_refused) {
  td_backend_t *be = cpu();
  char why[256];
  static const char *bad[] = {"mlp:784", "mlp:784-0-10", "mlp:a-b", "cnn:1-2", "mlp:784-256-10x",
                              "mlp:", "mlp:784--10", "mlp:99999999-10", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(td_model_check_spec(bad[i], why, sizeof why) == TD_ECONFIG, "%s", bad[i]);
    ck_assert_str_ne(why, "");
  }
  td_model_check_spec("cnn:1-2", why, sizeof why);
  ck_assert_ptr_nonnull(strstr(why, "unknown model 'cnn'"));
  td_model_t *m = NULL;
  ck_assert_int_eq(td_model_open(&m, "mlp:4-3-2", be, 0, why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_model_open(&m, "mlp:4-3-2", be, 2, why, sizeof why), 0);
  td_model_init(m, 1);
  float x[3 * 4] = {0};
  int32_t y[3] = {0, 1, 1};
  double loss;
  int hits;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 3, &loss, &hits), TD_EINVAL); /* > max_batch */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 0, &loss, &hits), TD_EINVAL);
  x[1] = NAN;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ENUMERIC);
  x[1] = 0;
  y[0] = 7;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ERANGE);
  td_model_close(&m);
  td_backend_t *gpu = NULL;
  ck_assert_int_eq(td_backend_open(&gpu, "cuda", 0, why, sizeof why), TD_EDEVICE);
  ck_assert_ptr_null(gpu);
  ck_assert_int_eq(td_backend_open(&gpu, "nope", 0, why, sizeof why), TD_ECONFIG);
  ck_assert(td_backend_available("cpu"));
  td_backend_close(&be);
}
END_TEST

START_TEST(a_small_model_learns) {
  td_backend_t *be = cpu();
  td_model_t *m = NULL;
  char why[128];
  ck_assert_int_eq(td_model_open(&m, "mlp:2-16-2", be, 32, why, sizeof why), 0);
  td_model_init(m, 3);
  td_sgd_t *o = NULL;
  td_sgd_opts_t so = {.momentum = 0.9};
  td_sgd_open(&o, be, td_model_numel(m), &so);
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  float x[64];
  int32_t y[32];
  int hits = 0;
  for (int step = 0; step < 300; step++) {
    for (int i = 0; i < 32; i++) {
      x[2 * i] = (float)td_rng_normal(&rng);
      x[2 * i + 1] = (float)td_rng_normal(&rng);
      y[i] = x[2 * i] + 0.5f * x[2 * i + 1] > 0;
    }
    double loss;
    td_model_train_batch(m, x, y, 32, &loss, &hits);
    td_sgd_step(o, td_model_params(m), td_model_grads(m), 0.05);
  }
  ck_assert_int_ge(hits, 30); /* >= 94% of the last batch */
  td_sgd_close(&o);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, gemm_matches_naive_for_all_transposes);
  tcase_add_test(tc, fused_passes_match_scalar_code);
  tcase_add_test(tc, backward_matches_finite_differences);
  tcase_add_test(tc, layout_init_and_determinism);
  tcase_add_test(tc, sgd_variants_match_hand_computation);
  tcase_add_test(tc, lr_schedules_at_known_points);
  tcase_add_test(tc, bad_specs_and_inputs_are_refused);
  tcase_add_test(tc, a_small_model_learns);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
