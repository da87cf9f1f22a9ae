/* layer_act.c: CPU kernels of the element-wise layers: ReLU and GELU (tanh
 * form, as GPT-2) forward and backward, the residual add, and inverted
 * dropout. Each is one pass over memory written so gcc vectorises it, with
 * run-time dispatch to AVX-512/AVX2. Runs on the model's thread. */
#include <math.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/rng.h"

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

TD_CLONES
static void gelu_fwd(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(TD__GELU_K * (v + 0.044715f * v * v * v)));
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

static inline float gelu_grad(float v) {
  float t = tanhf(TD__GELU_K * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * TD__GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
}

TD_CLONES
static void act_bwd(float *restrict dx, const float *restrict dy, const float *restrict x,
                    size_t n, int kind, bool acc) {
  for (size_t i = 0; i < n; i++) {
    float g = kind == 1 ? (x[i] > 0.0f ? dy[i] : 0.0f)
                        : (kind == 2 ? dy[i] * gelu_grad(x[i]) : dy[i]);
    dx[i] = acc ? dx[i] + g : g;
  }
}

void td__cpu_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                           size_t count, td_act_t act, bool acc) {
  (void)be;
  act_bwd(dinp, dout, inp, count, act == TD_ACT_RELU ? 1 : act == TD_ACT_GELU ? 2 : 0, acc);
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
