/* layer_act.c: CPU kernels of the element-wise layers: ReLU and GELU (tanh
 * form, as GPT-2) forward and backward, the residual add, and inverted
 * dropout. Each is one pass over memory written so gcc vectorises it, with
 * run-time dispatch to AVX-512/AVX2, and split into contiguous chunks over
 * the backend's thread pool (element i is computed the same way on any
 * thread; dropout draws its mask from one stream per fixed block of
 * elements, so the mask does not depend on the thread count either). Called
 * on the model's thread. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/rng.h"
#include "compute/cpu/tpool.h"
#include "compute/cpu/vecmath.h"

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

/* GELU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = K (x + 0.044715 x^3).
 * A NaN input stays NaN. */
TD_CLONES
static void gelu_fwd(float *restrict y, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    float s = 1.0f / (1.0f + td__exp_fast(-2.0f * TD__GELU_K * (v + 0.044715f * v * v * v)));
    y[i] = v * s;
  }
}

typedef struct {
  float *out, *out2;
  const float *a, *b;
  td_act_t act;
  bool acc;
  float p;
  uint64_t seed;
} elem_job_t;

static void act_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const elem_job_t *j = arg;
  size_t n = end - begin;
  if (j->act == TD_ACT_RELU)
    relu_fwd(j->out + begin, j->a + begin, n);
  else if (j->act == TD_ACT_GELU)
    gelu_fwd(j->out + begin, j->a + begin, n);
  else if (j->out != j->a)
    memcpy(j->out + begin, j->a + begin, n * sizeof *j->out);
}

/* Chunks of whole cache lines, so no two threads write one line. */
#define TD__GRAIN 16

void td__cpu_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                         td_act_t act) {
  elem_job_t j = {.out = out, .a = inp, .act = act};
  td_tpool_for(td__cpu_tpool(be), count, td_tpool_grain(1, TD__GRAIN), act_forward_part, &j);
}

/* d/dx of x sigmoid(2u): with s = sigmoid(2u) (so 0.5(1 + tanh u) = s and
 * 1 - tanh^2 u = 4 s (1 - s)), 0.5(1+t) + 0.5 x (1-t^2) u' = s + 2 x s (1-s) u'. */
static inline float gelu_grad(float v) {
  float s = 1.0f / (1.0f + td__exp_fast(-2.0f * TD__GELU_K * (v + 0.044715f * v * v * v)));
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

static void act_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const elem_job_t *j = arg;
  size_t n = end - begin;
  if (j->act == TD_ACT_RELU)
    relu_bwd(j->out + begin, j->a + begin, j->b + begin, n, j->acc);
  else if (j->act == TD_ACT_GELU)
    gelu_bwd(j->out + begin, j->a + begin, j->b + begin, n, j->acc);
  else
    copy_bwd(j->out + begin, j->a + begin, n, j->acc);
}

void td__cpu_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                           size_t count, td_act_t act, bool acc) {
  elem_job_t j = {.out = dinp, .a = dout, .b = inp, .act = act, .acc = acc};
  td_tpool_for(td__cpu_tpool(be), count, td_tpool_grain(1, TD__GRAIN), act_backward_part, &j);
}

TD_CLONES
static void add2(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

static void add_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const elem_job_t *j = arg;
  if (j->b != NULL) /* out may alias a or b: element i reads before it writes */
    add2(j->out + begin, j->a + begin, j->b + begin, end - begin);
  else
    memcpy(j->out + begin, j->a + begin, (end - begin) * sizeof *j->out);
}

void td__cpu_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count) {
  if (b == NULL && out == a)
    return;
  elem_job_t j = {.out = out, .a = a, .b = b};
  td_tpool_for(td__cpu_tpool(be), count, td_tpool_grain(1, TD__GRAIN), add_part, &j);
}

/* Elements [i * TD__DROP_BLOCK, (i + 1) * TD__DROP_BLOCK) draw from stream i
 * of the seed, so any chunking of whole blocks gives the same mask. */
#define TD__DROP_BLOCK 4096

static void dropout_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const elem_job_t *j = arg;
  float *mask = j->out, *out = j->out2;
  float p = j->p, keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  uint32_t threshold = (uint32_t)((double)p * 4294967296.0 > 4294967295.0
                                      ? 4294967295.0
                                      : (double)p * 4294967296.0);
  for (size_t block = begin / TD__DROP_BLOCK; block * TD__DROP_BLOCK < end; block++) {
    td_rng_t rng;
    td_rng_seed2(&rng, j->seed, 0x44524f5000000000ull + block); /* "DROP" */
    size_t hi = (block + 1) * TD__DROP_BLOCK < end ? (block + 1) * TD__DROP_BLOCK : end;
    for (size_t i = block * TD__DROP_BLOCK; i < hi; i += 2) {
      uint64_t r = td_rng_next(&rng); /* two 32-bit draws per call */
      mask[i] = (uint32_t)r >= threshold ? keep : 0.0f;
      if (i + 1 < hi)
        mask[i + 1] = (uint32_t)(r >> 32) >= threshold ? keep : 0.0f;
    }
  }
  for (size_t i = begin; i < end; i++)
    out[i] = j->a[i] * mask[i];
}

void td__cpu_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                             size_t count, float p, uint64_t seed) {
  elem_job_t j = {.out = mask, .out2 = out, .a = inp, .p = p, .seed = seed};
  td_tpool_for(td__cpu_tpool(be), count, td_tpool_grain(1, TD__DROP_BLOCK), dropout_forward_part,
               &j);
}

TD_CLONES
static void dropout_bwd(float *restrict dx, const float *restrict dy, const float *restrict mask,
                        size_t n, bool acc) {
  if (acc)
    for (size_t i = 0; i < n; i++)
      dx[i] += dy[i] * mask[i];
  else
    for (size_t i = 0; i < n; i++)
      dx[i] = dy[i] * mask[i];
}

static void dropout_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const elem_job_t *j = arg;
  dropout_bwd(j->out + begin, j->a + begin, j->b + begin, end - begin, j->acc);
}

void td__cpu_dropout_backward(td_backend_t *be, float *dinp, const float *dout,
                              const float *mask, size_t count, bool acc) {
  elem_job_t j = {.out = dinp, .a = dout, .b = mask, .acc = acc};
  td_tpool_for(td__cpu_tpool(be), count, td_tpool_grain(1, TD__GRAIN), dropout_backward_part,
               &j);
}
