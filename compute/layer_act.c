/* layer_act.c: CPU kernels of the element-wise layers: ReLU and GELU (tanh
 * form, as GPT-2) forward and backward, the residual add, and inverted
 * dropout. Each is one pass over memory written so gcc vectorises it, with
 * run-time dispatch to AVX-512/AVX2. Runs on the model's thread. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/rng.h"

/* traind never reads the floating-point exception flags, so comparisons may
 * be if-converted into vector selects (the GELU clamps below). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

#define TD__GELU_K 0.7978845608028654f /* sqrt(2/pi) */

TD_CLONES
static void relu_fwd(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] = x[i] < 0.0f ? 0.0f : x[i]; /* a NaN survives */
}

/* exp(x) for the GELU's sigmoid, branch-free so the loops vectorise (libm's
 * tanhf is a call per element and was a third of a GPT step): x = n ln2 + r,
 * |r| <= ln2/2, a degree-6 Taylor polynomial for e^r (relative error < 2e-7)
 * and 2^n built in the exponent bits. Inputs are clamped to [-87, 87], where
 * the sigmoid below has long saturated. */
static inline float exp_fast(float x) {
  x = x > 87.0f ? 87.0f : x; /* a NaN passes both and stays NaN */
  x = x < -87.0f ? -87.0f : x;
  /* round to nearest by the 1.5 * 2^23 trick: no call, no branch. n comes
   * from a NaN-free copy so the integer conversion below is defined; a NaN
   * still reaches r, and so the result. */
  float xn = x == x ? x : 0.0f;
  float n = (xn * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
                     r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 126]: a normal 2^n */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* GELU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = K (x + 0.044715 x^3).
 * A NaN input stays NaN. */
TD_CLONES
static void gelu_fwd(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float s = 1.0f / (1.0f + exp_fast(-2.0f * TD__GELU_K * (v + 0.044715f * v * v * v)));
    y[i] = v * s;
  }
}

void td__cpu_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                         td_act_t act) {
  (void)be;
  if (act == TD_ACT_RELU)
    relu_fwd(out, inp, count);
  else if (act == TD_ACT_GELU)
    gelu_fwd(out, inp, count);
  else if (out != inp)
    memcpy(out, inp, count * sizeof *out);
}

/* d/dx of x sigmoid(2u): with s = sigmoid(2u) (so 0.5(1 + tanh u) = s and
 * 1 - tanh^2 u = 4 s (1 - s)), 0.5(1+t) + 0.5 x (1-t^2) u' = s + 2 x s (1-s) u'. */
static inline float gelu_grad(float v) {
  float s = 1.0f / (1.0f + exp_fast(-2.0f * TD__GELU_K * (v + 0.044715f * v * v * v)));
  return s + 2.0f * v * s * (1.0f - s) * TD__GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
}

TD_CLONES
static void relu_bwd(float *restrict dx, const float *restrict dy, const float *restrict x,
                     size_t n, bool acc) {
  if (acc)
    for (size_t i = 0; i < n; i++)
      dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
  else
    for (size_t i = 0; i < n; i++) {
      float g = dy[i];
      dx[i] = x[i] > 0.0f ? g : 0.0f;
    }
}

TD_CLONES
static void gelu_bwd(float *restrict dx, const float *restrict dy, const float *restrict x,
                     size_t n, bool acc) {
  if (acc)
    for (size_t i = 0; i < n; i++)
      dx[i] += dy[i] * gelu_grad(x[i]);
  else
    for (size_t i = 0; i < n; i++)
      dx[i] = dy[i] * gelu_grad(x[i]);
}

TD_CLONES
static void copy_bwd(float *restrict dx, const float *restrict dy, size_t n, bool acc) {
  if (acc)
    for (size_t i = 0; i < n; i++)
      dx[i] += dy[i];
  else
    memcpy(dx, dy, n * sizeof *dx);
}

void td__cpu_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                           size_t count, td_act_t act, bool acc) {
  (void)be;
  if (act == TD_ACT_RELU)
    relu_bwd(dinp, dout, inp, count, acc);
  else if (act == TD_ACT_GELU)
    gelu_bwd(dinp, dout, inp, count, acc);
  else
    copy_bwd(dinp, dout, count, acc);
}

TD_CLONES
static void add2(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

void td__cpu_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count) {
  (void)be;
  if (b != NULL)
    add2(out, a, b, count); /* out may alias a or b: element i reads before it writes */
  else if (out != a)
    memcpy(out, a, count * sizeof *out);
}

void td__cpu_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                             size_t count, float p, uint64_t seed) {
  (void)be;
  td_rng_t rng;
  td_rng_seed2(&rng, seed, 0x44524f50ull); /* "DROP" */
  float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  uint32_t threshold = (uint32_t)((double)p * 4294967296.0 > 4294967295.0
                                      ? 4294967295.0
                                      : (double)p * 4294967296.0);
  for (size_t i = 0; i < count; i += 2) {
    uint64_t r = td_rng_next(&rng); /* two 32-bit draws per call */
    mask[i] = (uint32_t)r >= threshold ? keep : 0.0f;
    if (i + 1 < count)
      mask[i + 1] = (uint32_t)(r >> 32) >= threshold ? keep : 0.0f;
  }
  for (size_t i = 0; i < count; i++)
    out[i] = inp[i] * mask[i];
}

void td__cpu_dropout_backward(td_backend_t *be, float *dinp, const float *dout,
                              const float *mask, size_t count, bool acc) {
  (void)be;
  for (size_t i = 0; i < count; i++)
    dinp[i] = acc ? dinp[i] + dout[i] * mask[i] : dout[i] * mask[i];
}
