/* test_codec.c: every codec against its invariants.
 *
 * none round-trips exactly and fp16 within half precision; top-k and PowerSGD
 * conserve mass (input + old residual == decoded + new residual, the old
 * residual scaled when the learning rate fell); ternary and
 * QSGD are unbiased within a Monte-Carlo bound; top-k sends exactly the k
 * largest magnitudes; PowerSGD is exact at full rank and on rank-deficient
 * input and never makes NaN; edge cases (1 element, all-zero, constant,
 * NaN/Inf); bits per parameter on the wire; the decoder refuses every
 * truncation and corruption of a valid message without crashing; a bad
 * parameter is named with its range; and a codec defined here, outside
 * compress/, is parsed, formatted, encoded and decoded through the registry
 * like a built-in one (registering it is all it takes); and a slice of the
 * flat buffer (fragments) travels alone and decodes as the whole-vector
 * message with zeros outside it did. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "compress/codec_impl.h"
#include "compress/powersgd.h"
#include "common/error.h"
#include "compute/rng.h"

/* mlp:784-256-10-like layout: a big matrix, a bias, a small matrix */
static td_layout_t *layout_new(void) {
  td_layout_t *l = NULL;
  ck_assert_int_eq(td_layout_new(&l), 0);
  uint32_t w0[2] = {256, 784}, b0[1] = {256}, w1[2] = {10, 256};
  td_layout_add(l, "fc0.weight", 2, w0);
  td_layout_add(l, "fc0.bias", 1, b0);
  td_layout_add(l, "fc1.weight", 2, w1);
  return l;
}

static float *gaussian(size_t n, uint64_t seed, double scale) {
  float *x = td_params_alloc(n);
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(scale * td_rng_normal(&rng));
  return x;
}

static td_codec_spec_t spec_of(const char *text) {
  td_codec_spec_t s;
  char why[256];
  ck_assert_msg(td_codec_parse(&s, text, why, sizeof why) == 0, "%s: %s", text, why);
  return s;
}

static void padding_zero(const td_layout_t *l, float *x) {
  /* the flat buffer's padding floats are always zero */
  size_t prev_end = 0;
  for (size_t t = 0; t < td_layout_count(l); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(l, t);
    for (size_t i = prev_end; i < ti->offset; i++)
      x[i] = 0;
    prev_end = ti->offset + ti->numel;
  }
  for (size_t i = prev_end; i < td_layout_numel(l); i++)
    x[i] = 0;
}

START_TEST(specs_parse_and_refuse) {
  td_codec_spec_t s = spec_of("topk:0.01");
  ck_assert_int_eq(s.id, TD_CODEC_TOPK);
  ck_assert_double_eq(s.density, 0.01);
  char text[32];
  td_codec_format(&s, text, sizeof text);
  ck_assert_str_eq(text, "topk:0.01");
  ck_assert_int_eq(spec_of("powersgd:4").rank, 4);
  ck_assert_int_eq(spec_of("qsgd:7").levels, 7);
  ck_assert(spec_of("ternary:base3").base3);
  static const char *bad[] = {"topk", "topk:0", "topk:1.5", "topk:x", "powersgd:0",
                              "powersgd:", "qsgd:128", "ternary:base4", "fp16:2", "zstd", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char why[256] = "";
    ck_assert_msg(td_codec_parse(&s, bad[i], why, sizeof why) == TD_ECONFIG, "%s", bad[i]);
    ck_assert_str_ne(why, "");
  }
}
END_TEST

/* Encode on a link, decode as a receiver would. */
static float *through(const char *codec, const td_layout_t *l, const float *x, size_t *bytes,
                      td_link_codec_t **keep) {
  td_codec_spec_t s = spec_of(codec);
  td_link_codec_t *lc = NULL;
  ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 1, 2), 0);
  const uint8_t *msg;
  size_t len;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
  float *y = td_params_alloc(td_layout_numel(l));
  char why[256] = "";
  unsigned id = 99;
  ck_assert_msg(td_codec_decode_message(l, msg, len, y, &id, why, sizeof why) == 0, "%s: %s",
                codec, why);
  ck_assert_uint_eq(id, s.id);
  if (bytes)
    *bytes = len;
  if (keep)
    *keep = lc;
  else
    td_link_codec_close(&lc);
  return y;
}

START_TEST(none_is_exact_and_fp16_is_close) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 1, 1.0);
  x[5] = 1e6f; /* beyond half range: clamped, not Inf */
  padding_zero(l, x);
  float *y = through("none", l, x, NULL, NULL);
  ck_assert_int_eq(memcmp(x, y, n * sizeof *x), 0);
  free(y);
  y = through("fp16", l, x, NULL, NULL);
  size_t far = 0;
  for (size_t i = 0; i < n; i++)
    far += i != 5 && !(fabsf(y[i] - x[i]) <= fabsf(x[i]) * (1.0f / 1024) + 1e-7f);
  ck_assert_uint_eq(far, 0);
  ck_assert_float_eq(y[5], 65504.0f);
  free(y);
  free(x);
  td_layout_free(&l);
}
END_TEST

START_TEST(error_feedback_conserves_mass) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  static const char *codecs[] = {"topk:0.01", "topk:0.3", "powersgd:4", "powersgd:1"};
  for (size_t c = 0; c < 4; c++) {
    td_codec_spec_t s = spec_of(codecs[c]);
    td_link_codec_t *lc = NULL;
    ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 3, 4), 0);
    float *old = td_params_alloc(n), *y = td_params_alloc(n);
    /* a decayed residual (the lr fell) counts keep x old; it applies to one
     * encode only, and keep 0 drops what was held back */
    static const float keeps[] = {1, 0.25f, 1, 0, 1};
    for (int round = 0; round < 5; round++) {
      float *x = gaussian(n, 10 + (uint64_t)round, 0.1);
      padding_zero(l, x);
      memcpy(old, td_link_codec_residual(lc), n * sizeof *old);
      for (size_t i = 0; i < n; i++)
        old[i] *= keeps[round];
      if (round == 1)
        td_link_codec_decay_residual(lc, 7.0f); /* out of range: ignored, then replaced */
      td_link_codec_decay_residual(lc, keeps[round]);
      const uint8_t *msg;
      size_t len;
      ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
      char why[128];
      ck_assert_int_eq(td_codec_decode_message(l, msg, len, y, NULL, why, sizeof why), 0);
      const float *res = td_link_codec_residual(lc);
      double worst = 0;
      for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)x[i] + old[i] - y[i] - res[i]));
      ck_assert_msg(worst < 1e-5, "%s round %d: conservation off by %g", codecs[c], round, worst);
      free(x);
    }
    free(old);
    free(y);
    td_link_codec_close(&lc);
    ck_assert_ptr_null(lc);
  }
  td_layout_free(&l);
}
END_TEST

/* codec = auto: the chosen spec's real message fits the byte budget (or is
 * the 0.01 % top-k floor), less budget never buys a bigger message, a roomy
 * budget sends dense; switching a link from top-k to none flushes the
 * residual with the next delta, so no mass is lost across the switch. */
START_TEST(auto_fits_budget_and_switches_without_loss) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 77, 0.1), *y = td_params_alloc(n), *old = td_params_alloc(n);
  padding_zero(l, x);
  td_codec_spec_t none = spec_of("none");
  double dense = (double)td_codec_message_size(&none, l);
  const double budgets[] = {1e9, dense, dense * 0.6, dense / 10, dense / 50, dense / 400, 10};
  /* no ternary: it keeps no residual, so its noise would stay in the
   * receiver's model; below fp16 the ladder goes to top-k */
  const td_codec_id_t want[] = {TD_CODEC_NONE, TD_CODEC_NONE, TD_CODEC_FP16, TD_CODEC_TOPK,
                                TD_CODEC_TOPK, TD_CODEC_TOPK, TD_CODEC_TOPK};
  size_t prev = SIZE_MAX;
  td_codec_spec_t floor_spec = {.id = TD_CODEC_TOPK, .density = 1e-4};
  size_t floor_bytes = td_codec_message_size(&floor_spec, l);
  for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
    td_codec_spec_t s;
    td_codec_fit_budget(l, budgets[b], &s);
    ck_assert_msg(s.id == want[b], "budget %g: codec %u", budgets[b], s.id);
    td_link_codec_t *lc = NULL;
    ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 1, 2), 0);
    const uint8_t *msg;
    size_t len;
    ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
    ck_assert_msg((double)len <= budgets[b] || len <= floor_bytes, "budget %g: %zu bytes",
                  budgets[b], len);
    ck_assert_msg(len <= prev, "budget %g: %zu bytes > %zu for a larger budget", budgets[b], len,
                  prev);
    /* top-k uses the budget it has: a fiftieth of the dense message still
     * buys a density well above the 0.01 % floor, and most of the bytes */
    if (budgets[b] == dense / 50 || budgets[b] == dense / 400)
      ck_assert_msg(s.density > 5e-4 && (double)len > 0.3 * budgets[b],
                    "budget %g: topk:%g sends only %zu bytes", budgets[b], s.density, len);
    prev = len;
    td_link_codec_close(&lc);
  }
  /* top-k for one round, then none: decoded == delta + what top-k held back */
  td_codec_spec_t topk = spec_of("topk:0.01");
  td_link_codec_t *lc = NULL;
  ck_assert_int_eq(td_link_codec_open(&lc, &topk, l, 1, 2), 0);
  const uint8_t *msg;
  size_t len;
  char why[128];
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
  memcpy(old, td_link_codec_residual(lc), n * sizeof *old);
  ck_assert_int_eq(td_link_codec_set_spec(lc, &none), 0);
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
  ck_assert_int_eq(td_codec_decode_message(l, msg, len, y, NULL, why, sizeof why), 0);
  double worst = 0, res = 0;
  for (size_t i = 0; i < n; i++) {
    worst = fmax(worst, fabs((double)x[i] + old[i] - y[i]));
    res = fmax(res, fabs((double)td_link_codec_residual(lc)[i]));
  }
  ck_assert_msg(worst < 1e-6 && res == 0, "switch lost mass: %g, residual %g", worst, res);
  td_link_codec_close(&lc);
  free(x);
  free(y);
  free(old);
  td_layout_free(&l);
}
END_TEST

START_TEST(topk_sends_exactly_the_largest) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 7, 1.0);
  padding_zero(l, x);
  const td_tensor_info_t *w = td_layout_tensor(l, 0);
  for (size_t i = 0; i < 100; i++) /* ties at the threshold magnitude */
    x[w->offset + 1000 + i] = (i % 2 ? -1.0f : 1.0f) * 2.5f;
  float *y = through("topk:0.01", l, x, NULL, NULL);
  size_t k = (size_t)floor(0.01 * (double)w->numel), sent = 0;
  float min_sent = INFINITY, max_unsent = 0;
  for (size_t i = w->offset; i < w->offset + w->numel; i++) {
    if (y[i] != 0) {
      ck_assert_float_eq(y[i], x[i]); /* values travel exactly */
      sent++;
      min_sent = fminf(min_sent, fabsf(x[i]));
    } else {
      max_unsent = fmaxf(max_unsent, fabsf(x[i]));
    }
  }
  ck_assert_uint_eq(sent, k);
  ck_assert_float_ge(min_sent, max_unsent);
  /* the small tensors travel dense, in fp16 */
  const td_tensor_info_t *b = td_layout_tensor(l, 1);
  for (size_t i = b->offset; i < b->offset + b->numel; i++)
    ck_assert_msg(fabsf(y[i] - x[i]) <= ldexpf(fabsf(x[i]), -11) + 1e-7f, "bias %g sent as %g",
                  x[i], y[i]);
  free(y);
  free(x);
  td_layout_free(&l);
}
END_TEST

/* Mean of K decodes of v against the expectation, per element. */
static void check_unbiased(const char *codec, const float *v, size_t count, const float *expect,
                           const float *var_per_elem, int draws) {
  td_layout_t *l = NULL;
  td_layout_new(&l);
  uint32_t shape[2] = {(uint32_t)(count / 64), 64};
  td_layout_add(l, "w", 2, shape);
  td_codec_spec_t s = spec_of(codec);
  td_link_codec_t *lc = NULL;
  ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 5, 6), 0);
  double *sum = calloc(count, sizeof *sum);
  float *y = td_params_alloc(td_layout_numel(l));
  for (int d = 0; d < draws; d++) {
    const uint8_t *msg;
    size_t len;
    ck_assert_int_eq(td_link_codec_encode(lc, v, &msg, &len), 0);
    char why[128];
    ck_assert_int_eq(td_codec_decode_message(l, msg, len, y, NULL, why, sizeof why), 0);
    for (size_t i = 0; i < count; i++)
      sum[i] += y[i];
  }
  for (size_t i = 0; i < count; i++) {
    double mean = sum[i] / draws;
    double bound = 4 * sqrt(var_per_elem[i] / draws) + 1e-6 * fabs(expect[i]) + 1e-7;
    ck_assert_msg(fabs(mean - expect[i]) <= bound, "%s elem %zu: mean %g expected %g (bound %g)",
                  codec, i, mean, expect[i], bound);
  }
  free(sum);
  free(y);
  td_link_codec_close(&lc);
  td_layout_free(&l);
}

START_TEST(ternary_and_qsgd_are_unbiased) {
  enum { COUNT = 1024, DRAWS = 4000 };
  float *v = gaussian(COUNT, 21, 1.0);
  v[3] = 8.0f; /* an outlier that clipping cuts */
  static float expect[COUNT], var[COUNT];
  /* ternary: E = clip(v, -s, s), var = s|v~| - v~^2 */
  double sum = 0, sum2 = 0, maxabs = 0;
  for (int i = 0; i < COUNT; i++) {
    sum += v[i];
    sum2 += (double)v[i] * v[i];
    maxabs = fmax(maxabs, fabs(v[i]));
  }
  double mean = sum / COUNT, sigma = sqrt(sum2 / COUNT - mean * mean);
  float s = (float)fmin(2.5 * sigma, maxabs);
  ck_assert_float_lt(s, 8.0f);
  for (int i = 0; i < COUNT; i++) {
    float c = fmaxf(-s, fminf(s, v[i]));
    expect[i] = c;
    var[i] = s * fabsf(c) - c * c;
  }
  check_unbiased("ternary", v, COUNT, expect, var, DRAWS);
  check_unbiased("ternary:base3", v, COUNT, expect, var, DRAWS);
  /* qsgd: E = v, per-element var <= (nu/s)^2 / 4 */
  for (int b = 0; b < COUNT; b += 512) {
    double n2 = 0;
    for (int i = b; i < b + 512; i++)
      n2 += (double)v[i] * v[i];
    for (int i = b; i < b + 512; i++) {
      expect[i] = v[i];
      var[i] = (float)(n2 / (7.0 * 7.0) / 4.0);
    }
  }
  check_unbiased("qsgd:7", v, COUNT, expect, var, DRAWS);
  free(v);
}
END_TEST

START_TEST(powersgd_exact_at_full_rank_and_on_rank_deficient_input) {
  enum { N = 40, M = 24 };
  td_rng_t rng;
  td_rng_seed(&rng, 8);
  float a[N * M], approx[N * M], q[M * M], p[N * M];
  /* full rank r = min(n, m): P Pᵀ M == M */
  for (int i = 0; i < N * M; i++)
    a[i] = (float)td_rng_normal(&rng);
  for (int i = 0; i < M * M; i++)
    q[i] = (float)td_rng_normal(&rng);
  td__powersgd_step(a, N, M, M, q, p, approx);
  float maxa = 0, err = 0;
  for (int i = 0; i < N * M; i++) {
    maxa = fmaxf(maxa, fabsf(a[i]));
    err = fmaxf(err, fabsf(approx[i] - a[i]));
  }
  ck_assert_msg(err <= 1e-4f * maxa, "full rank error %g", err);
  /* columns of P are orthonormal */
  for (int c = 0; c < M; c++)
    for (int d = 0; d < M; d++) {
      double dot = 0;
      for (int i = 0; i < N; i++)
        dot += (double)p[i * M + c] * p[i * M + d];
      ck_assert_double_eq_tol(dot, c == d ? 1.0 : 0.0, 1e-5);
    }
  /* rank 2 input with columns of zeros, rank 4 codec: exact, no NaN */
  td_layout_t *l = NULL;
  td_layout_new(&l);
  uint32_t shape[2] = {64, 48};
  td_layout_add(l, "w", 2, shape);
  float *x = td_params_alloc(64 * 48);
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 48; j++)
      x[i * 48 + j] = j < 10 ? 0.0f : (float)((i + 1) * (j % 3) + (i % 5) * (j - 20));
  size_t bytes;
  float *y = through("powersgd:4", l, x, &bytes, NULL);
  ck_assert_uint_lt(bytes, 64 * 48 * 4 / 2); /* it did compress */
  float xm = 0, e2 = 0;
  for (int i = 0; i < 64 * 48; i++) {
    ck_assert(isfinite(y[i]));
    xm = fmaxf(xm, fabsf(x[i]));
    e2 = fmaxf(e2, fabsf(y[i] - x[i]));
  }
  ck_assert_msg(e2 <= 1e-4f * xm, "rank-deficient error %g", e2);
  free(y);
  memset(x, 0, 64 * 48 * sizeof *x); /* all zero: zeros back, never NaN */
  y = through("powersgd:4", l, x, NULL, NULL);
  for (int i = 0; i < 64 * 48; i++)
    ck_assert_float_eq(y[i], 0.0f);
  free(y);
  free(x);
  td_layout_free(&l);
}
END_TEST

/* A conv layer's tensors: PowerSGD sees the weight [OUT, C, K, K] as an
 * OUT x C*K*K matrix (first dimension by the rest), so a weight of rank 2 in
 * that view is exact at rank 2 (as (OUT*C) x (K*K), say, it has rank 9 and
 * would not be); the bias and a norm weight (1-D) and a small matrix (under
 * TD_CODEC_MIN_NUMEL) travel dense, in fp16 (exact to half precision). */
START_TEST(powersgd_sees_a_conv_weight_as_out_by_the_rest) {
  enum { O = 16, C = 8, K = 3, CKK = C * K * K };
  td_layout_t *l = NULL;
  ck_assert_int_eq(td_layout_new(&l), 0);
  uint32_t w[4] = {O, C, K, K}, b[1] = {O}, g[1] = {64}, small[2] = {16, 8};
  td_layout_add(l, "conv.weight", 4, w);
  td_layout_add(l, "conv.bias", 1, b);
  td_layout_add(l, "norm.weight", 1, g);
  td_layout_add(l, "head.weight", 2, small);
  float *x = gaussian(td_layout_numel(l), 21, 1.0);
  padding_zero(l, x);
  const td_tensor_info_t *tw = td_layout_tensor(l, 0);
  td_rng_t rng;
  td_rng_seed(&rng, 22);
  float u[2][O], v[2][CKK];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < O; i++)
      u[r][i] = (float)td_rng_normal(&rng);
    for (int j = 0; j < CKK; j++)
      v[r][j] = (float)td_rng_normal(&rng);
  }
  for (int i = 0; i < O; i++)
    for (int j = 0; j < CKK; j++)
      x[tw->offset + (size_t)i * CKK + (size_t)j] = u[0][i] * v[0][j] + u[1][i] * v[1][j];
  size_t bytes;
  float *y = through("powersgd:2", l, x, &bytes, NULL);
  ck_assert_uint_lt(bytes, td_layout_param_count(l) * sizeof(float)); /* it did compress */
  for (size_t t = 0; t < td_layout_count(l); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(l, t);
    float xm = 0, err = 0;
    for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
      xm = fmaxf(xm, fabsf(x[i]));
      err = fmaxf(err, fabsf(y[i] - x[i]));
    }
    ck_assert_msg(t == 0 ? err <= 1e-4f * xm : err <= ldexpf(xm, -11), "%s: error %g of max %g",
                  ti->name, err, xm);
  }
  free(y);
  free(x);
  td_layout_free(&l);
}
END_TEST

START_TEST(edge_cases_one_element_zero_constant_nan) {
  static const char *codecs[] = {"none", "fp16", "ternary", "ternary:base3", "topk:0.01",
                                 "powersgd:4", "qsgd:7"};
  for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
    td_codec_spec_t s = spec_of(codecs[c]);
    const td_codec_iface_t *impl = td__codec_find(s.id);
    td_codec_tensor_state_t st = {0};
    td_rng_t rng;
    td_rng_seed(&rng, 1);
    uint8_t buf[1 << 16];
    size_t len;
    float dec[2048], back[2048];
    /* one element, then all-zero and constant tensors of 2048. `sent` is what
     * the sender believes it sent: `dec` for most codecs, input - residual for
     * the codecs that update their residual in place. */
    float zero[2048] = {0}, constant[2048], sent[2048];
    for (int i = 0; i < 2048; i++)
      constant[i] = 0.5f;
    static const struct { size_t n, m; } shapes[3] = {{1, 1}, {32, 64}, {32, 64}};
    const float one = 0.75f;
    const float *inputs[3] = {&one, zero, constant};
    for (int k = 0; k < 3; k++) {
      size_t count = shapes[k].n * shapes[k].m;
      const float *in = inputs[k];
      if (impl->residual_in_place) {
        memcpy(dec, in, count * sizeof *dec);
        in = dec;
      }
      ck_assert_int_eq(impl->encode(&s, &st, &rng, in, shapes[k].n, shapes[k].m, buf, sizeof buf,
                                    &len, dec), 0);
      ck_assert_int_eq(impl->decode(buf, len, shapes[k].n, shapes[k].m, back), 0);
      size_t mismatch = 0;
      for (size_t i = 0; i < count; i++) {
        sent[i] = impl->residual_in_place ? inputs[k][i] - dec[i] : dec[i];
        mismatch += !isfinite(back[i]) || fabsf(back[i] - sent[i]) > 1e-6f;
        if (k == 1)
          mismatch += back[i] != 0.0f;
      }
      ck_assert_msg(mismatch == 0, "%s: input %d: %zu elements differ from what was sent",
                    codecs[c], k, mismatch);
    }
    if (s.id == TD_CODEC_TERNARY) /* sigma = 0 must not zero a constant tensor */
      ck_assert_float_eq(back[0], 0.5f);
    free(st.q);
    free(st.scratch);
  }
  /* NaN or Inf in the input: nothing is sent and the residual is untouched */
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 2, 1.0);
  padding_zero(l, x);
  td_codec_spec_t s = spec_of("topk:0.01");
  td_link_codec_t *lc = NULL;
  td_link_codec_open(&lc, &s, l, 1, 1);
  const uint8_t *msg;
  size_t len;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
  float *before = td_params_alloc(n);
  memcpy(before, td_link_codec_residual(lc), n * sizeof *before);
  x[17] = NAN;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), TD_ENUMERIC);
  ck_assert_ptr_null(msg);
  x[17] = INFINITY;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), TD_ENUMERIC);
  ck_assert_int_eq(memcmp(before, td_link_codec_residual(lc), n * sizeof *before), 0);
  td_link_codec_close(&lc);
  free(before);
  /* the same for codecs that find NaN/Inf in their own statistics pass */
  static const char *scanning[] = {"ternary", "ternary:base3", "qsgd:7", "fp16", "powersgd:4"};
  for (size_t c = 0; c < sizeof scanning / sizeof scanning[0]; c++) {
    td_codec_spec_t sc = spec_of(scanning[c]);
    td_link_codec_open(&lc, &sc, l, 1, 1);
    x[17] = c % 2 ? INFINITY : NAN;
    ck_assert_msg(td_link_codec_encode(lc, x, &msg, &len) == TD_ENUMERIC, "%s", scanning[c]);
    x[td_layout_tensor(l, 0)->numel + 3] = NAN; /* in the dense bias, too */
    x[17] = 0.5f;
    ck_assert_msg(td_link_codec_encode(lc, x, &msg, &len) == TD_ENUMERIC, "%s bias", scanning[c]);
    x[td_layout_tensor(l, 0)->numel + 3] = 0.0f;
    td_link_codec_close(&lc);
  }
  free(x);
  td_layout_free(&l);
}
END_TEST

START_TEST(bits_per_parameter_on_the_wire) {
  td_layout_t *l = NULL;
  td_layout_new(&l);
  uint32_t shape[2] = {784, 256};
  td_layout_add(l, "w", 2, shape);
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 4, 0.01);
  static const struct { const char *codec; double max_bits; } cases[] = {
      {"ternary", 2.1}, {"ternary:base3", 1.7}, {"topk:0.01", 0.5}, {"powersgd:4", 0.7},
      {"fp16", 16.01}, {"qsgd:7", 4.2}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t bytes;
    float *y = through(cases[c].codec, l, x, &bytes, NULL);
    double bits = 8.0 * (double)bytes / (784.0 * 256.0);
    ck_assert_msg(bits <= cases[c].max_bits, "%s: %.3f bits/param", cases[c].codec, bits);
    free(y);
  }
  free(x);
  td_layout_free(&l);
}
END_TEST

START_TEST(decoder_refuses_every_corruption) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 3, 1.0);
  padding_zero(l, x);
  float *y = td_params_alloc(n);
  static const char *codecs[] = {"none", "fp16", "ternary", "ternary:base3", "topk:0.01",
                                 "topk:0.5", "powersgd:2", "qsgd:7"};
  td_rng_t rng;
  td_rng_seed(&rng, 77);
  for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
    td_codec_spec_t s = spec_of(codecs[c]);
    td_link_codec_t *lc = NULL;
    td_link_codec_open(&lc, &s, l, 1, 1);
    const uint8_t *msg;
    size_t len;
    ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
    char why[256];
    /* the last 64 truncations and 100 spread over the rest */
    for (size_t k = 0; k < 164 && k < len; k++) {
      size_t cut = k < 64 ? len - 1 - k : (size_t)td_rng_below(&rng, (uint32_t)len);
      ck_assert_msg(td_codec_decode_message(l, msg, cut, y, NULL, why, sizeof why) != 0,
                    "%s: truncation to %zu accepted", codecs[c], cut);
    }
    /* random byte flips: either refused or decoded to finite values */
    uint8_t *copy = malloc(len);
    for (int trial = 0; trial < 100; trial++) {
      memcpy(copy, msg, len);
      for (int f = 0; f < 4; f++)
        copy[td_rng_below(&rng, (uint32_t)len)] ^= (uint8_t)(1u << td_rng_below(&rng, 8));
      if (td_codec_decode_message(l, copy, len, y, NULL, why, sizeof why) == 0) {
        size_t bad = 0; /* one assertion per trial: Check reports every call */
        for (size_t i = 0; i < n; i++)
          bad += !isfinite(y[i]);
        ck_assert_uint_eq(bad, 0);
      }
    }
    /* a repeated tensor, a wrong element count, an unknown codec */
    uint8_t *twice = malloc(2 * len);
    memcpy(twice, msg, len);
    memcpy(twice + len, msg, len);
    ck_assert_int_eq(td_codec_decode_message(l, twice, 2 * len, y, NULL, why, sizeof why),
                     TD_EPROTO);
    memcpy(copy, msg, len);
    copy[8] ^= 1; /* numel of tensor 0 */
    ck_assert_int_eq(td_codec_decode_message(l, copy, len, y, NULL, why, sizeof why), TD_EPROTO);
    memcpy(copy, msg, len);
    copy[4] = 200;
    ck_assert_int_eq(td_codec_decode_message(l, copy, len, y, NULL, why, sizeof why), TD_EPROTO);
    free(twice);
    free(copy);
    td_link_codec_close(&lc);
  }
  /* NaN inside a dense payload is refused */
  x[3] = NAN;
  td_codec_spec_t none = spec_of("none");
  td_link_codec_t *lc = NULL;
  td_link_codec_open(&lc, &none, l, 1, 1);
  const uint8_t *msg;
  size_t len;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), TD_ENUMERIC);
  x[3] = 1;
  ck_assert_int_eq(td_link_codec_encode(lc, x, &msg, &len), 0);
  uint8_t *bad = malloc(len);
  memcpy(bad, msg, len);
  float nan = NAN;
  memcpy(bad + TD_CODEC_HEADER_BYTES + 12, &nan, 4);
  char why[256];
  ck_assert_int_eq(td_codec_decode_message(l, bad, len, y, NULL, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "NaN"));
  free(bad);
  td_link_codec_close(&lc);
  free(x);
  free(y);
  td_layout_free(&l);
}
END_TEST

START_TEST(bad_parameters_name_the_parameter_and_its_range) {
  static const struct {
    const char *text, *why;
  } cases[] = {
      {"topk:2", "codec topk: density 2 is out of range (0, 1]"},
      {"topk:0", "codec topk: density 0 is out of range (0, 1]"},
      {"topk:x", "codec topk: density 'x' is not a number in (0, 1]"},
      {"topk", "codec topk needs a density in (0, 1], as topk:0.01"},
      {"powersgd:0", "codec powersgd: rank 0 is out of range [1, 256]"},
      {"qsgd:128", "codec qsgd: levels 128 is out of range [1, 127]"},
      {"qsgd:-1", "codec qsgd: levels '-1' is not a whole number in [1, 127]"},
      {"ternary:base4",
       "codec ternary: packing 'base4' is not one of (base3), as ternary:base3 or ternary"},
      {"fp16:2", "codec fp16 takes no parameter: write fp16, not fp16:2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    td_codec_spec_t s;
    char why[256] = "";
    ck_assert_int_eq(td_codec_parse(&s, cases[i].text, why, sizeof why), TD_ECONFIG);
    ck_assert_str_eq(why, cases[i].why);
  }
  char why[256] = "";
  td_codec_spec_t s;
  ck_assert_int_eq(td_codec_parse(&s, "zstd", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "unknown codec 'zstd' (known: none, fp16, ternary[:base3], "
                                    "topk:DENSITY, powersgd:RANK, qsgd:LEVELS"));
  ck_assert(td_codec_known("topk:2") && !td_codec_known("zstd:1"));
}
END_TEST

/* ---- a codec that lives in this file only ------------------------------------------ */

/* shift:BITS sends every float scaled by 2^BITS (exact both ways for these
 * values) after one byte that says BITS, with BITS in [0, 8] kept in
 * spec->levels: just enough of a codec to show that parse, format, bound,
 * encode and decode all reach it through the registry, codec.c untouched. */
enum { SHIFT_CODEC_ID = 240, SHIFT_MAX_BITS = 8 };

static int shift_parse(td_codec_spec_t *out, const char *arg, char *why, size_t why_len) {
  return td__codec_parse_uint("shift", "bits", arg, 0, SHIFT_MAX_BITS, &out->levels, why,
                              why_len);
}

static void shift_format(const td_codec_spec_t *spec, char *buf, size_t len) {
  snprintf(buf, len, "%u", spec->levels);
}

static size_t shift_bound(const td_codec_spec_t *spec, size_t n, size_t m) {
  (void)spec;
  return 1 + 4 * n * m;
}

static int shift_encode(const td_codec_spec_t *spec, td_codec_tensor_state_t *st, td_rng_t *rng,
                        const float *in, size_t n, size_t m, uint8_t *out, size_t cap,
                        size_t *len, float *decoded) {
  (void)st;
  (void)rng;
  (void)decoded; /* no error feedback */
  if (1 + 4 * n * m > cap)
    return TD_EINVAL;
  out[0] = (uint8_t)spec->levels;
  for (size_t i = 0; i < n * m; i++)
    td__put_f32(out + 1 + 4 * i, ldexpf(in[i], (int)spec->levels));
  *len = 1 + 4 * n * m;
  return 0;
}

static int shift_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  if (len != 1 + 4 * n * m || in[0] > SHIFT_MAX_BITS)
    return TD_EPROTO;
  for (size_t i = 0; i < n * m; i++)
    out[i] = ldexpf(td__get_f32(in + 1 + 4 * i), -(int)in[0]);
  return 0;
}

static const td_codec_iface_t shift_codec = {
    .name = "shift", .syntax = "shift:BITS", .id = SHIFT_CODEC_ID, .version = 1,
    .parse = shift_parse, .format = shift_format, .bound = shift_bound,
    .encode = shift_encode, .decode = shift_decode,
};

START_TEST(a_codec_outside_compress_joins_by_registering) {
  /* main registered it; its id and name are now taken */
  ck_assert_int_eq(td__codec_register(&shift_codec), TD_EINVAL);
  char list[256];
  td_codec_list(list, sizeof list);
  ck_assert_ptr_nonnull(strstr(list, ", shift:BITS"));
  ck_assert_str_eq(td_codec_name(SHIFT_CODEC_ID), "shift");

  td_codec_spec_t s = spec_of("shift:3");
  ck_assert_uint_eq(s.id, SHIFT_CODEC_ID);
  ck_assert_uint_eq(s.levels, 3);
  ck_assert(!td_codec_uses_error_feedback(&s));
  char text[32];
  td_codec_format(&s, text, sizeof text);
  ck_assert_str_eq(text, "shift:3");
  char why[256] = "";
  ck_assert_int_eq(td_codec_parse(&s, "shift:9", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "codec shift: bits 9 is out of range [0, 8]");

  /* a weight it carries, and a bias that travels dense in fp16 as under any lossy codec */
  td_layout_t *l = NULL;
  ck_assert_int_eq(td_layout_new(&l), 0);
  uint32_t w[2] = {64, 32}, b[1] = {64};
  td_layout_add(l, "fc.weight", 2, w);
  td_layout_add(l, "fc.bias", 1, b);
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 7, 1.0);
  padding_zero(l, x);
  size_t bytes = 0;
  float *y = through("shift:3", l, x, &bytes, NULL); /* asserts the main codec id too */
  ck_assert_uint_eq(bytes, td_codec_message_size(&s, l));
  ck_assert_uint_eq(bytes, 2 * TD_CODEC_HEADER_BYTES + 1 + 4 * 64 * 32 + 2 * 64);
  const td_tensor_info_t *wt = td_layout_tensor(l, 0), *bt = td_layout_tensor(l, 1);
  for (size_t i = 0; i < wt->numel; i++)
    ck_assert_float_eq(y[wt->offset + i], x[wt->offset + i]);
  for (size_t i = 0; i < bt->numel; i++)
    ck_assert_float_eq_tol(y[bt->offset + i], x[bt->offset + i], 1e-2);
  td_params_free(&y);
  td_params_free(&x);
  td_layout_free(&l);
}
END_TEST

/* x with everything outside [off, off + count) zeroed: the whole-vector
 * update fragments sent before they sent their slice alone. */
static float *masked(const float *x, size_t n, size_t off, size_t count) {
  float *z = td_params_alloc(n);
  memcpy(z + off, x + off, count * sizeof *x);
  return z;
}

/* fragments = P send the slice [off, off + count) of the flat buffer alone
 * (td_link_codec_encode_range): under none and fp16 the receiver decodes
 * exactly what the whole-vector message with zeros outside the slice gave,
 * bit for bit, while the message holds only the slice (a tensor split by a
 * slice's edge costs one header more); under ternary the slice decodes to
 * zeros outside it; the whole range is the plain encode byte for byte; a
 * message read against another slice, or the whole model, is refused; a
 * range past the model, or a part of it on a PowerSGD link (its residual
 * and factors follow whole tensors), is TD_EINVAL. */
START_TEST(a_slice_travels_alone) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  float *x = gaussian(n, 11, 0.5);
  padding_zero(l, x);
  char why[256];
  static const char *codecs[] = {"none", "fp16"};
  static const unsigned parts[] = {2, 3, 7};
  for (size_t c = 0; c < 2; c++) {
    td_codec_spec_t s = spec_of(codecs[c]);
    size_t whole_len;
    free(through(codecs[c], l, x, &whole_len, NULL));
    for (size_t p = 0; p < 3; p++) {
      size_t sum = 0, off = 0;
      for (unsigned k = 0; k < parts[p]; k++) {
        size_t count = n / parts[p] + (k < n % parts[p]); /* fragment.h's cut */
        td_link_codec_t *lc = NULL;
        ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 1, 2), 0);
        const uint8_t *msg;
        size_t len;
        ck_assert_int_eq(td_link_codec_encode_range(lc, x, off, count, &msg, &len), 0);
        ck_assert_uint_le(len, count * sizeof(float) + 3 * TD_CODEC_HEADER_BYTES);
        sum += len;
        float *y = td_params_alloc(n), *z = masked(x, n, off, count);
        for (size_t i = 0; i < n; i++)
          y[i] = 7; /* every float is written */
        ck_assert_msg(td_codec_decode_range(l, off, count, msg, len, y, NULL, why, sizeof why) ==
                          0, "%s P=%u k=%u: %s", codecs[c], parts[p], k, why);
        float *ref = through(codecs[c], l, z, NULL, NULL);
        ck_assert_msg(memcmp(y, ref, n * sizeof *y) == 0, "%s P=%u k=%u differs", codecs[c],
                      parts[p], k);
        /* read as another slice, or as the whole model: refused, all zeros */
        size_t other = off == 0 ? count : 0;
        ck_assert_int_eq(td_codec_decode_range(l, other, count - 1, msg, len, y, NULL, why,
                                               sizeof why), TD_EPROTO);
        ck_assert_int_eq(td_codec_decode_message(l, msg, len, y, NULL, why, sizeof why),
                         TD_EPROTO);
        for (size_t i = 0; i < n; i++)
          ck_assert_float_eq(y[i], 0);
        td_params_free(&y);
        td_params_free(&z);
        free(ref);
        td_link_codec_close(&lc);
        off += count;
      }
      /* the slices together: the whole message and a header per split */
      ck_assert_uint_ge(sum, whole_len);
      ck_assert_uint_le(sum, whole_len + 2 * (parts[p] - 1) * TD_CODEC_HEADER_BYTES);
    }
  }
  /* ternary on a slice: zeros outside it, about half the whole message */
  td_codec_spec_t t = spec_of("ternary");
  td_link_codec_t *a = NULL, *b = NULL;
  ck_assert_int_eq(td_link_codec_open(&a, &t, l, 3, 4), 0);
  ck_assert_int_eq(td_link_codec_open(&b, &t, l, 3, 4), 0);
  const uint8_t *ma, *mb;
  size_t la, lb, half = n / 2;
  ck_assert_int_eq(td_link_codec_encode(a, x, &ma, &la), 0);
  ck_assert_int_eq(td_link_codec_encode_range(b, x, 0, n, &mb, &lb), 0);
  ck_assert_uint_eq(la, lb); /* the whole range is the plain encode */
  ck_assert_int_eq(memcmp(ma, mb, la), 0);
  ck_assert_int_eq(td_link_codec_encode_range(b, x, half, n - half, &mb, &lb), 0);
  ck_assert(lb > la * 4 / 10 && lb < la * 6 / 10);
  float *y = td_params_alloc(n);
  ck_assert_int_eq(td_codec_decode_range(l, half, n - half, mb, lb, y, NULL, why, sizeof why), 0);
  size_t outside = 0, inside = 0;
  for (size_t i = 0; i < n; i++) {
    outside += i < half && y[i] != 0;
    inside += i >= half && y[i] != 0;
  }
  ck_assert_uint_eq(outside, 0);
  ck_assert_uint_gt(inside, 0);
  /* a range past the model; a part of it on an error-feedback link */
  ck_assert_int_eq(td_link_codec_encode_range(b, x, half, n, &mb, &lb), TD_EINVAL);
  ck_assert_int_eq(td_codec_decode_range(l, n, 1, ma, la, y, NULL, why, sizeof why), TD_EINVAL);
  td_link_codec_close(&a);
  td_codec_spec_t k = spec_of("powersgd:2");
  ck_assert_int_eq(td_link_codec_open(&a, &k, l, 3, 4), 0);
  ck_assert_int_eq(td_link_codec_encode_range(a, x, 0, half, &ma, &la), TD_EINVAL);
  ck_assert_int_eq(td_link_codec_encode_range(a, x, 0, n, &ma, &la), 0);
  td_link_codec_close(&a);
  td_link_codec_close(&b);
  td_params_free(&y);
  td_params_free(&x);
  td_layout_free(&l);
}
END_TEST

/* fragments = P under top-k: a slice adds into the residual of its own range
 * and keeps there exactly what it did not send (input + old residual =
 * decoded + new residual, per coordinate), the residual outside the slice is
 * left as it was for that slice's own round, the receiver gets zeros outside
 * the slice, and the message is about a slice's share of the whole one. */
START_TEST(topk_residual_splits_by_slice) {
  td_layout_t *l = layout_new();
  size_t n = td_layout_numel(l);
  char why[256];
  static const unsigned parts[] = {2, 3};
  for (size_t p = 0; p < 2; p++) {
    td_codec_spec_t s = spec_of("topk:0.05");
    td_link_codec_t *lc = NULL, *whole = NULL;
    ck_assert_int_eq(td_link_codec_open(&lc, &s, l, 3, 4), 0);
    ck_assert_int_eq(td_link_codec_open(&whole, &s, l, 3, 4), 0);
    float *old = td_params_alloc(n), *y = td_params_alloc(n);
    for (unsigned round = 0; round < 3 * parts[p]; round++) {
      unsigned k = round % parts[p];
      size_t off = 0, count = 0;
      for (unsigned j = 0; j <= k; j++) { /* fragment.h's cut */
        off += count;
        count = n / parts[p] + (j < n % parts[p]);
      }
      float *x = gaussian(n, 40 + round, 0.1);
      padding_zero(l, x);
      memcpy(old, td_link_codec_residual(lc), n * sizeof *old);
      const uint8_t *msg, *wmsg;
      size_t len, wlen;
      ck_assert_int_eq(td_link_codec_encode_range(lc, x, off, count, &msg, &len), 0);
      ck_assert_int_eq(td_link_codec_encode(whole, x, &wmsg, &wlen), 0);
      ck_assert_msg(len < wlen * 1.5 / parts[p] && len > wlen * 0.5 / parts[p],
                    "P=%u: slice %zu bytes, whole %zu", parts[p], len, wlen);
      ck_assert_msg(td_codec_decode_range(l, off, count, msg, len, y, NULL, why, sizeof why) ==
                        0, "P=%u round %u: %s", parts[p], round, why);
      const float *res = td_link_codec_residual(lc);
      double worst = 0;
      size_t sent = 0;
      for (size_t i = 0; i < n; i++) {
        if (i >= off && i < off + count) {
          worst = fmax(worst, fabs((double)x[i] + old[i] - y[i] - res[i]));
          sent += y[i] != 0;
        } else {
          ck_assert_float_eq(y[i], 0);
          ck_assert_float_eq(res[i], old[i]); /* untouched until its slice's round */
        }
      }
      ck_assert_msg(worst < 1e-5, "P=%u round %u: conservation off by %g", parts[p], round,
                    worst);
      ck_assert_uint_gt(sent, 0);
      free(x);
    }
    td_params_free(&old);
    td_params_free(&y);
    td_link_codec_close(&lc);
    td_link_codec_close(&whole);
  }
  td_layout_free(&l);
}
END_TEST

int main(void) {
  /* before any other codec call, as td__codec_register asks */
  if (td__codec_register(&shift_codec) != 0)
    return 1;
  Suite *s = suite_create("codec");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, specs_parse_and_refuse);
  tcase_add_test(tc, powersgd_sees_a_conv_weight_as_out_by_the_rest);
  tcase_add_test(tc, none_is_exact_and_fp16_is_close);
  tcase_add_test(tc, error_feedback_conserves_mass);
  tcase_add_test(tc, topk_residual_splits_by_slice);
  tcase_add_test(tc, topk_sends_exactly_the_largest);
  tcase_add_test(tc, auto_fits_budget_and_switches_without_loss);
  tcase_add_test(tc, ternary_and_qsgd_are_unbiased);
  tcase_add_test(tc, powersgd_exact_at_full_rank_and_on_rank_deficient_input);
  tcase_add_test(tc, edge_cases_one_element_zero_constant_nan);
  tcase_add_test(tc, bits_per_parameter_on_the_wire);
  tcase_add_test(tc, decoder_refuses_every_corruption);
  tcase_add_test(tc, bad_parameters_name_the_parameter_and_its_range);
  tcase_add_test(tc, a_codec_outside_compress_joins_by_registering);
  tcase_add_test(tc, a_slice_travels_alone);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
