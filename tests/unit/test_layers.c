/* test_layers.c: the layer engine (compute/layer_*.c through model.c) against
 * references.
 *
 * Whole small models of every family, together using every layer type (dense,
 * conv with stride and padding, max/avg/global pooling, GroupNorm, LayerNorm,
 * residual add, ReLU, GELU, flatten, embedding, causal self-attention, the
 * tied head) are checked against central finite differences of the loss for
 * every parameter tensor, and the same comparison rejects a gradient 10% off.
 * Attention is checked against a naive double-precision reference that builds
 * the full T x T matrix with its causal mask, and a future position is shown
 * to get exactly zero gradient. im2col/col2im are checked as adjoints, dropout
 * against its mask, and the presets against their exact parameter counts.
 * Bad layer lists and bad batches are one-line errors. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "common/error.h"
#include "compute/model.h"
#include "compute/params.h"
#include "compute/rng.h"

static td_backend_t *open_cpu(void) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", 1, why, sizeof why) == 0, "%s", why);
  return be;
}

static td_model_t *open_model(td_backend_t *be, const char *spec, int max_batch) {
  td_model_t *m = NULL;
  char why[256] = "";
  ck_assert_msg(td_model_open(&m, spec, be, max_batch, why, sizeof why) == 0, "%s: %s", spec,
                why);
  return m;
}

/* A batch of random inputs and targets for m. Caller frees the three arrays. */
static td_batch_t random_batch(td_model_t *m, int rows, td_rng_t *rng) {
  td_batch_t b = {.rows = rows};
  int t = td_model_context(m), classes = td_model_classes(m);
  int32_t *targets = malloc(sizeof(int32_t) * (size_t)(rows * t));
  for (int i = 0; i < rows * t; i++)
    targets[i] = (int32_t)td_rng_below(rng, (uint32_t)classes);
  b.targets = targets;
  if (td_model_input_kind(m) == TD_INPUT_TOKENS) {
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(rows * t));
    for (int i = 0; i < rows * t; i++)
      tok[i] = (int32_t)td_rng_below(rng, 256);
    tok[0] = tok[1]; /* a repeated token: its embedding gradient adds twice */
    b.tokens = tok;
  } else {
    size_t n = (size_t)rows * (size_t)td_model_input_dim(m);
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
      x[i] = (float)td_rng_normal(rng);
    b.x = x;
  }
  return b;
}

static void free_batch(td_batch_t *b) {
  free((void *)b->x);
  free((void *)b->tokens);
  free((void *)b->targets);
}

static double mean_loss(td_model_t *m, const td_batch_t *b) {
  double sum = 0;
  int hits = 0;
  ck_assert_int_eq(td_model_eval(m, b, &sum, &hits), 0);
  return sum / (b->rows * td_model_context(m));
}

/* Central differences (step eps) for up to `per_tensor` coordinates of every
 * tensor (spread over the tensor), against the analytic gradient; and the same
 * check must reject the gradient scaled by 1.1. Weight matrices are scaled by
 * boost first where the init (GPT's 0.02) would leave gradients too small to
 * tell apart from the float rounding of the loss. Wide ReLU/max-pool layers
 * take a small eps so that few units or pooling windows switch over the step;
 * the presets have tens of thousands of them, so a few always do, and there
 * the check is `robust`: of the coordinates whose gradient is over 15% of the
 * tensor's largest, at least 90% agree within 3% (+1% of the largest), and at
 * most half still agree when the gradient is 10% off. */
static void check_gradients(const char *spec, int rows, size_t per_tensor, uint64_t seed,
                            float eps, float boost, bool robust) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, spec, rows);
  td_model_init(m, seed);
  td_rng_t rng;
  td_rng_seed(&rng, seed + 1);
  float *w = td_model_params(m);
  const td_layout_t *lay = td_model_layout(m);
  /* biases and norm parameters off their init, so they are tested too */
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    for (size_t i = 0; i < ti->numel; i++)
      if (ti->ndim == 1)
        w[ti->offset + i] += 0.1f * (float)td_rng_normal(&rng);
      else
        w[ti->offset + i] *= boost;
  }
  td_batch_t b = random_batch(m, rows, &rng);
  double loss;
  int hits;
  ck_assert_int_eq(td_model_train(m, &b, &loss, &hits), 0);
  ck_assert_double_eq_tol(loss, mean_loss(m, &b), 1e-6);
  size_t numel = td_model_numel(m);
  float *g = malloc(numel * sizeof *g);
  memcpy(g, td_model_grads(m), numel * sizeof *g);
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    size_t step = ti->numel > per_tensor ? ti->numel / per_tensor : 1, count = 0;
    double *fd = malloc(sizeof(double) * (ti->numel / step + 1)), *an = malloc(sizeof(double) * (ti->numel / step + 1));
    for (size_t i = (size_t)td_rng_below(&rng, (uint32_t)step); i < ti->numel; i += step) {
      float *p = &w[ti->offset + i];
      const float keep = *p, up_at = keep + eps, down_at = keep - eps;
      *p = up_at;
      double up = mean_loss(m, &b);
      *p = down_at;
      double down = mean_loss(m, &b);
      *p = keep;
      fd[count] = (up - down) / ((double)up_at - (double)down_at);
      an[count++] = g[ti->offset + i];
    }
    double max_err = 0, max_err_wrong = 0, scale = 1e-3, max_grad = 0;
    for (size_t i = 0; i < count; i++) {
      scale = fmax(scale, fmax(fabs(fd[i]), fabs(an[i])));
      max_grad = fmax(max_grad, fabs(an[i]));
    }
    size_t big = 0, ok = 0, ok_wrong = 0;
    for (size_t i = 0; i < count; i++) {
      max_err = fmax(max_err, fabs(fd[i] - an[i]));
      max_err_wrong = fmax(max_err_wrong, fabs(fd[i] - 1.1 * an[i]));
      if (fabs(an[i]) > 0.15 * scale) {
        big++;
        ok += fabs(fd[i] - an[i]) <= 0.03 * fabs(fd[i]) + 0.01 * scale;
        ok_wrong += fabs(fd[i] - 1.1 * an[i]) <= 0.03 * fabs(fd[i]) + 0.01 * scale;
      }
    }
    ck_assert_msg(max_grad > 1e-4, "%s %s: gradient is ~0, the check would be vacuous", spec,
                  ti->name);
    if (robust) {
      ck_assert_msg(ok >= big * 9 / 10, "%s %s: %zu of %zu coordinates agree", spec, ti->name,
                    ok, big);
      ck_assert_msg(ok_wrong <= big / 2, "%s %s: check too weak (%zu of %zu)", spec, ti->name,
                    ok_wrong, big);
    } else {
      ck_assert_msg(max_err / scale < 3e-2, "%s %s: relative error %g (max grad %g)", spec,
                    ti->name, max_err / scale, max_grad);
      ck_assert_msg(max_err_wrong / scale > 3e-2, "%s %s: check too weak (%g)", spec, ti->name,
                    max_err_wrong / scale);
    }
    free(fd);
    free(an);
  }
  free(g);
  free_batch(&b);
  td_model_close(&m);
  td_backend_close(&be);
}

START_TEST(a_small_cnn_matches_finite_differences) {
  /* conv (pad), fused relu, max-pool, conv (stride 2), avg-pool, unfused relu, flatten, dense */
  check_gradients("layers:input(2,8,8) conv(4,3,pad=1) relu maxpool(2) "
                  "conv(5,3,stride=2,pad=1) avgpool(2) relu flatten dense(6) relu dense(3)",
                  3, 1000, 7, 1e-3f, 1.0f, false);
}
END_TEST

START_TEST(a_small_resnet_matches_finite_differences) {
  /* groupnorm, a residual block, gelu, gap, layernorm. GELU rather than ReLU
   * after the norms: normalised units sit densely around 0, where a ReLU kink
   * inside the step would swamp the comparison (ReLU is checked above and in
   * the presets) */
  check_gradients("layers:input(1,6,6) conv(4,3,pad=1) groupnorm(2) gelu "
                  "[ conv(4,3,pad=1) groupnorm(2) gelu conv(4,1) ] gelu gap layernorm dense(3)",
                  3, 1000, 9, 1e-3f, 1.0f, false);
}
END_TEST

START_TEST(a_small_gpt_matches_finite_differences) {
  /* embedding (token + position), layernorm, attention, gelu MLP, residuals, tied head */
  check_gradients("gpt:2-8-2-5", 2, 400, 3, 1e-3f, 10.0f, false);
}
END_TEST

START_TEST(the_presets_match_finite_differences_on_a_sample) {
  check_gradients("cnn", 1, 30, 5, 1e-3f, 1.0f, true);
  check_gradients("resnet", 1, 30, 6, 1e-3f, 1.0f, true);
  check_gradients("gpt:1-16-4-16", 2, 40, 8, 1e-3f, 10.0f, false);
}
END_TEST

START_TEST(presets_have_the_documented_shapes) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "cnn", 4);
  ck_assert_uint_eq(td_layout_param_count(td_model_layout(m)),
                    32 * 9 + 32 + 64 * 32 * 9 + 64 + 3136 * 128 + 128 + 128 * 10 + 10);
  ck_assert_uint_eq(td_layout_param_count(td_model_layout(m)), 421642);
  const td_tensor_info_t *conv = td_layout_tensor(td_model_layout(m), 2);
  ck_assert_str_eq(conv->name, "conv1.weight"); /* [out, in, k, k] */
  ck_assert_uint_eq(conv->ndim, 4);
  ck_assert_uint_eq(conv->shape[0], 64);
  ck_assert_uint_eq(conv->shape[1], 32);
  ck_assert_uint_eq(conv->shape[2], 3);
  ck_assert_int_eq(td_model_input_dim(m), 784);
  ck_assert_int_eq(td_model_classes(m), 10);
  ck_assert_int_eq(td_model_input_kind(m), TD_INPUT_FEATURES);
  td_model_close(&m);
  m = open_model(be, "gpt:4-128-4-128", 2);
  ck_assert_uint_eq(td_layout_param_count(td_model_layout(m)), 842496);
  ck_assert_int_eq(td_model_input_kind(m), TD_INPUT_TOKENS);
  ck_assert_int_eq(td_model_context(m), 128);
  ck_assert_int_eq(td_model_classes(m), 256);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

/* The naive reference: out[b][i][h] = sum_j P[i][j] v[j], P = softmax over
 * j <= i of q_i . k_j / sqrt(d), in double, with the full T x T matrix. */
static void naive_attention(double *out, const float *qkv, int n, int t, int c, int heads) {
  int d = c / heads;
  double *s = malloc(sizeof(double) * (size_t)(t * t));
  for (int b = 0; b < n; b++)
    for (int h = 0; h < heads; h++) {
      const float *base = qkv + (size_t)b * t * 3 * c + h * d;
      for (int i = 0; i < t; i++)
        for (int j = 0; j < t; j++) {
          double dot = 0;
          for (int e = 0; e < d; e++)
            dot += (double)base[i * 3 * c + e] * base[j * 3 * c + c + e];
          s[i * t + j] = j > i ? -INFINITY : dot / sqrt((double)d);
        }
      for (int i = 0; i < t; i++) {
        double max = -INFINITY, sum = 0;
        for (int j = 0; j < t; j++)
          max = fmax(max, s[i * t + j]);
        for (int j = 0; j < t; j++)
          sum += s[i * t + j] = exp(s[i * t + j] - max);
        for (int e = 0; e < d; e++) {
          double acc = 0;
          for (int j = 0; j < t; j++)
            acc += s[i * t + j] / sum * base[j * 3 * c + 2 * c + e];
          out[((size_t)b * t + i) * c + h * d + e] = acc;
        }
      }
    }
  free(s);
}

/* Forward against the naive reference, backward against its central
 * differences, the mask exact; `at`: the one position given a gradient,
 * whose later keys and values must get exactly 0. */
static void check_attention(int N, int T, int C, int H, int at) {
  td_backend_t *be = open_cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 21);
  size_t nq = (size_t)N * T * 3 * C, no = (size_t)N * T * C, na = (size_t)N * H * T * T;
  float *qkv = malloc(nq * sizeof *qkv), *out = malloc(no * sizeof *out);
  float *att = malloc(na * sizeof *att), *datt = malloc(na * sizeof *datt);
  float *dout = malloc(no * sizeof *dout), *dqkv = malloc(nq * sizeof *dqkv);
  double *ref = malloc(no * sizeof *ref), *r = malloc(no * sizeof *r);
  for (size_t i = 0; i < nq; i++)
    qkv[i] = (float)td_rng_normal(&rng);
  for (size_t i = 0; i < no; i++)
    r[i] = td_rng_normal(&rng);
  td_backend_attention_forward(be, out, att, qkv, N, T, C, H);
  naive_attention(ref, qkv, N, T, C, H);
  for (size_t i = 0; i < no; i++)
    ck_assert_double_eq_tol(out[i], ref[i], 1e-5);
  for (size_t i = 0; i < na; i++) /* masked entries are exactly 0 */
    if (i % (size_t)T > (i / (size_t)T) % (size_t)T)
      ck_assert_float_eq(att[i], 0.0f);
  /* backward of L = sum(out * r) against central differences of the reference */
  for (size_t i = 0; i < no; i++)
    dout[i] = (float)r[i];
  td_backend_attention_backward(be, dqkv, datt, dout, qkv, att, N, T, C, H);
  double max_err = 0, max_wrong = 0, scale = 1e-3;
  for (size_t i = 0; i < nq; i++) {
    float keep = qkv[i];
    double up = 0, down = 0;
    qkv[i] = keep + 1e-2f;
    naive_attention(ref, qkv, N, T, C, H);
    for (size_t j = 0; j < no; j++)
      up += ref[j] * r[j];
    qkv[i] = keep - 1e-2f;
    naive_attention(ref, qkv, N, T, C, H);
    for (size_t j = 0; j < no; j++)
      down += ref[j] * r[j];
    qkv[i] = keep;
    double fd = (up - down) / 2e-2;
    scale = fmax(scale, fabs(fd));
    max_err = fmax(max_err, fabs(fd - dqkv[i]));
    max_wrong = fmax(max_wrong, fabs(fd - 1.1 * dqkv[i]));
  }
  ck_assert_msg(max_err / scale < 1e-3, "attention T=%d backward: relative error %g", T,
                max_err / scale);
  ck_assert_msg(max_wrong / scale > 1e-2, "check too weak");
  /* a gradient only at position `at`: keys and values of later positions get exactly 0 */
  memset(dout, 0, no * sizeof *dout);
  for (int e = 0; e < C; e++)
    dout[(size_t)at * C + e] = 1.0f;
  td_backend_attention_backward(be, dqkv, datt, dout, qkv, att, N, T, C, H);
  for (int pos = at + 1; pos < T; pos++)
    for (int e = 0; e < 3 * C; e++)
      ck_assert_float_eq(dqkv[(size_t)pos * 3 * C + e], 0.0f);
  ck_assert_float_ne(dqkv[0 * 3 * C + C], 0.0f); /* an earlier key does get gradient */
  free(qkv);
  free(out);
  free(att);
  free(datt);
  free(dout);
  free(dqkv);
  free(ref);
  free(r);
  td_backend_close(&be);
}

START_TEST(attention_matches_a_naive_masked_reference) {
  check_attention(2, 5, 8, 2, 1);
  /* longer rows (the vectorised softmax loops run past their first vector),
   * the gradient at a position in the middle */
  check_attention(2, 34, 8, 2, 18);
}
END_TEST

START_TEST(im2col_and_col2im_are_adjoint) {
  td_backend_t *be = open_cpu();
  td_conv_geom_t g = {.c = 2, .h = 7, .w = 6, .k = 3, .stride = 2, .pad = 1};
  g.ho = (g.h + 2 * g.pad - g.k) / g.stride + 1;
  g.wo = (g.w + 2 * g.pad - g.k) / g.stride + 1;
  int nimg = g.c * g.h * g.w, ncol = g.c * g.k * g.k * g.ho * g.wo;
  float *x = malloc(sizeof(float) * (size_t)nimg), *dx = malloc(sizeof(float) * (size_t)nimg);
  float *col = malloc(sizeof(float) * (size_t)ncol), *dc = malloc(sizeof(float) * (size_t)ncol);
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  for (int i = 0; i < nimg; i++)
    x[i] = (float)td_rng_normal(&rng);
  for (int i = 0; i < ncol; i++)
    dc[i] = (float)td_rng_normal(&rng);
  td_backend_im2col(be, col, x, &g);
  /* one entry by hand: channel 1, ki=0, kj=2, output (1, 2) reads x[1][1][5] */
  ck_assert_float_eq(col[((1 * 3 + 0) * 3 + 2) * g.ho * g.wo + 1 * g.wo + 2], x[42 + 6 + 5]);
  td_backend_col2im(be, dx, dc, &g, false);
  double a = 0, b = 0;
  for (int i = 0; i < ncol; i++)
    a += (double)col[i] * dc[i];
  for (int i = 0; i < nimg; i++)
    b += (double)x[i] * dx[i];
  ck_assert_double_eq_tol(a, b, 1e-4);
  td_backend_col2im(be, dx, dc, &g, true); /* acc adds a second copy */
  double c2 = 0;
  for (int i = 0; i < nimg; i++)
    c2 += (double)x[i] * dx[i];
  ck_assert_double_eq_tol(c2, 2 * b, 1e-4);
  free(x);
  free(dx);
  free(col);
  free(dc);
  td_backend_close(&be);
}
END_TEST

START_TEST(dropout_masks_and_scales) {
  enum { N = 4000 };
  td_backend_t *be = open_cpu();
  static float x[N], y[N], mask[N], dy[N], dx[N];
  for (int i = 0; i < N; i++)
    x[i] = dy[i] = 1.0f + (float)i / N;
  td_backend_dropout_forward(be, y, mask, x, N, 0.25f, 99);
  int zeros = 0;
  for (int i = 0; i < N; i++) {
    ck_assert(mask[i] == 0.0f || fabsf(mask[i] - 1.0f / 0.75f) < 1e-6f);
    ck_assert_float_eq(y[i], x[i] * mask[i]);
    zeros += mask[i] == 0.0f;
  }
  ck_assert_int_gt(zeros, N / 4 - 150);
  ck_assert_int_lt(zeros, N / 4 + 150);
  td_backend_dropout_backward(be, dx, dy, mask, N, false);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(dx[i], dy[i] * mask[i]);
  static float again[N];
  td_backend_dropout_forward(be, y, again, x, N, 0.25f, 99); /* same seed, same mask */
  ck_assert_int_eq(memcmp(again, mask, sizeof again), 0);
  /* a model with dropout trains and evaluates (identity at eval) */
  td_model_t *m = open_model(be, "layers:input(6) dense(8) relu dropout(0.5) dense(3)", 4);
  td_model_init(m, 1);
  td_rng_t rng;
  td_rng_seed(&rng, 2);
  td_batch_t b = random_batch(m, 4, &rng);
  double loss, sum1 = 0, sum2 = 0;
  ck_assert_int_eq(td_model_train(m, &b, &loss, NULL), 0);
  ck_assert_int_eq(td_model_eval(m, &b, &sum1, NULL), 0);
  ck_assert_int_eq(td_model_eval(m, &b, &sum2, NULL), 0);
  ck_assert_double_eq(sum1, sum2);
  free_batch(&b);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

/* GELU (computed as x sigmoid(2u) with a polynomial exp) against the tanh
 * form in double, and ReLU's NaN passes through both. */
START_TEST(gelu_matches_the_tanh_form) {
  enum { N = 20001 };
  td_backend_t *be = open_cpu();
  static float x[N], y[N], d[N], dy[N];
  for (int i = 0; i < N; i++) {
    x[i] = -20.0f + (float)i * 0.002f;
    dy[i] = 1.0f;
  }
  td_backend_act_forward(be, y, x, N, TD_ACT_GELU);
  td_backend_act_backward2(be, d, dy, x, N, TD_ACT_GELU, false);
  for (int i = 0; i < N; i++) {
    double v = x[i], k = 0.7978845608028654, t = tanh(k * (v + 0.044715 * v * v * v));
    ck_assert_double_eq_tol(y[i], 0.5 * v * (1 + t), 2e-6);
    ck_assert_double_eq_tol(d[i], 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k *
                                      (1 + 3 * 0.044715 * v * v), 1e-5);
  }
  td_backend_act_backward2(be, d, dy, x, N, TD_ACT_GELU, true); /* acc adds */
  ck_assert_double_eq_tol(d[N - 1], 2.0, 1e-5);
  float nan = NAN, out = 0;
  td_backend_act_forward(be, &out, &nan, 1, TD_ACT_GELU);
  ck_assert(isnan(out));
  td_backend_act_forward(be, &out, &nan, 1, TD_ACT_RELU);
  ck_assert(isnan(out));
  td_backend_close(&be);
}
END_TEST

START_TEST(bad_layer_lists_are_one_line_errors) {
  static const struct {
    const char *spec, *says;
  } bad[] = {
      {"layers:conv(8,3) pool(2) dense(10)", "unknown layer"},
      {"layers:input(1,28,28) flatten conv(8,3) dense(10)", "needs an image"},
      {"layers:input(1,4,4) conv(8,5) dense(10)", "does not fit"},
      {"layers:input(3,8,8) groupnorm(2) dense(10)", "dividing the 3 channels"},
      {"layers:input(1,8,8) [ conv(4,3,pad=1) ] dense(10)", "equal shapes"},
      {"layers:input(1,8,8) [ conv(1,3,pad=1) dense(10)", "without ']'"},
      {"layers:input(1,8,8) conv(4,3)", "must end with dense"},
      {"layers:input(1,8,8) dense(10) relu", "no activation"},
      {"layers:input(1,8,8) conv(0,3) dense(10)", "OUT in 1..4096"},
      {"layers:input(1,8,8) conv(4,3,bogus=1) dense(10)", "unknown option"},
      {"layers:input(1,8,8) dense(10) input(4)", "must come first"},
      {"layers:input(1,8,8) dropout(1.5) dense(10)", "P in [0, 1)"},
      {"layers:input(1,8,8) maxpool(9) dense(10)", "does not fit"},
      {"gpt:4-128-3-128", "multiple of"},
      {"gpt:4-128", "LAYERS-WIDTH-HEADS-CONTEXT"},
      {"cnn:3", "takes no arguments"},
  };
  char why[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(td_model_check_spec(bad[i].spec, why, sizeof why) == TD_ECONFIG,
                  "'%s' accepted", bad[i].spec);
    ck_assert_msg(strstr(why, bad[i].says) != NULL, "'%s': why '%s' lacks '%s'", bad[i].spec,
                  why, bad[i].says);
    ck_assert_msg(strchr(why, '\n') == NULL, "'%s': not one line", bad[i].spec);
  }
  static const char *good[] = {"cnn", "resnet", "gpt:1-8-1-2", "layers:input(5) dense(2)",
                               "layers:conv(4,3) relu gap dense(10)"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(td_model_check_spec(good[i], why, sizeof why) == 0, "'%s': %s", good[i], why);
}
END_TEST

START_TEST(bad_token_batches_are_errors) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "gpt:1-8-2-4", 2);
  td_model_init(m, 1);
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
  td_batch_t b = {.rows = 2, .tokens = tok, .targets = tgt};
  double loss;
  ck_assert_int_eq(td_model_train(m, &b, &loss, NULL), 0);
  ck_assert_double_eq_tol(loss, log(256.0), 0.05); /* near-uniform at init: 8 bits */
  tok[3] = 256;
  ck_assert_int_eq(td_model_train(m, &b, &loss, NULL), TD_ERANGE);
  tok[3] = 4;
  tgt[5] = -1;
  ck_assert_int_eq(td_model_train(m, &b, &loss, NULL), TD_ERANGE);
  tgt[5] = 7;
  b.tokens = NULL;
  ck_assert_int_eq(td_model_train(m, &b, &loss, NULL), TD_EINVAL);
  float x[8] = {0};
  /* features given to a token model: refused */
  ck_assert_int_eq(td_model_train_batch(m, x, tgt, 2, &loss, NULL), TD_EINVAL);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("layers");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, a_small_cnn_matches_finite_differences);
  tcase_add_test(tc, a_small_resnet_matches_finite_differences);
  tcase_add_test(tc, a_small_gpt_matches_finite_differences);
  tcase_add_test(tc, the_presets_match_finite_differences_on_a_sample);
  tcase_add_test(tc, presets_have_the_documented_shapes);
  tcase_add_test(tc, attention_matches_a_naive_masked_reference);
  tcase_add_test(tc, im2col_and_col2im_are_adjoint);
  tcase_add_test(tc, dropout_masks_and_scales);
  tcase_add_test(tc, gelu_matches_the_tanh_form);
  tcase_add_test(tc, bad_layer_lists_are_one_line_errors);
  tcase_add_test(tc, bad_token_batches_are_errors);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
