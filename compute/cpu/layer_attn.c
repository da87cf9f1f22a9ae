/* layer_attn.c: CPU kernels of the transformer family: token + position
 * embedding and causal multi-head self-attention.
 *
 * Attention runs per (image of the batch, head) as strided GEMMs straight on
 * the packed qkv rows (lda = 3C, no gather copy): S = Q K^T / sqrt(d) into
 * the saved probability block, a causal row softmax in place (entries j > i
 * are exactly 0, so they never pass gradient back), O = P V written into its
 * head's columns of out. Backward: dV = P^T dO, dP = dO V^T, dS = P (dP -
 * rowsum(dP P)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d). The (image,
 * head) pairs are split over the backend's thread pool, each pair's GEMMs a
 * single-threaded sgemm on its thread (the backend keeps BLAS at one thread
 * when it has a pool). The embedding splits positions forward and columns
 * backward, so the scatter-add into the token table never races and sums in
 * position order. Called on the model's thread. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/cpu/tpool.h"
#include "compute/cpu/vecmath.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

typedef struct {
  float *out, *dwte, *dwpe, *att, *datt;
  const float *wte, *wpe, *dout, *qkv, *catt;
  const int32_t *tokens;
  int n, t, c, heads;
} attn_job_t;

static void embed_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const attn_job_t *j = arg;
  int c = j->c;
  for (size_t r = begin; r < end; r++) { /* r = b * t + i */
    const float *restrict e = j->wte + (size_t)j->tokens[r] * (size_t)c;
    const float *restrict p = j->wpe + (r % (size_t)j->t) * (size_t)c;
    float *restrict y = j->out + r * (size_t)c;
    for (int k = 0; k < c; k++)
      y[k] = e[k] + p[k];
  }
}

void td__cpu_embed_forward(td_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int n, int t, int c) {
  attn_job_t j = {.out = out, .tokens = tokens, .wte = wte, .wpe = wpe, .n = n, .t = t, .c = c};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)t, td_tpool_grain((size_t)c, 1),
               embed_forward_part, &j);
}

/* Columns [begin, end) of both tables, every position in order. */
static void embed_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const attn_job_t *j = arg;
  size_t c = (size_t)j->c, w = end - begin;
  for (int i = 0; i < j->t; i++)
    memset(j->dwpe + (size_t)i * c + begin, 0, w * sizeof *j->dwpe);
  for (int b = 0; b < j->n; b++)
    for (int i = 0; i < j->t; i++) {
      size_t r = (size_t)b * (size_t)j->t + (size_t)i;
      const float *restrict dy = j->dout + r * c + begin;
      float *restrict de = j->dwte + (size_t)j->tokens[r] * c + begin;
      float *restrict dp = j->dwpe + (size_t)i * c + begin;
      for (size_t k = 0; k < w; k++) {
        de[k] += dy[k];
        dp[k] += dy[k];
      }
    }
}

void td__cpu_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int n, int t, int c) {
  attn_job_t j = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .tokens = tokens, .n = n, .t = t,
                  .c = c};
  td_tpool_for(td__cpu_tpool(be), (size_t)c, td_tpool_grain((size_t)n * (size_t)t, 16),
               embed_backward_part, &j);
}

/* Row i of the t x t scores s in place: softmax over columns 0..i, 0 after
 * (exactly: a future position gets no probability and passes no gradient). */
TD_CLONES
static void causal_softmax(float *restrict s, int t) {
  for (int i = 0; i < t; i++) {
    float *restrict row = s + (size_t)i * (size_t)t;
    float max = row[0];
#pragma omp simd reduction(max : max)
    for (int j = 0; j <= i; j++)
      max = row[j] > max ? row[j] : max;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; j++) {
      float e = td__exp_fast(row[j] - max);
      row[j] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j <= i; j++)
      row[j] *= inv;
    for (int j = i + 1; j < t; j++)
      row[j] = 0.0f;
  }
}

/* dS = P (dP - rowsum(dP P)) in place over dP, 0 above the diagonal. */
TD_CLONES
static void causal_softmax_backward(float *restrict dp, const float *restrict p, int t) {
  for (int i = 0; i < t; i++) {
    const float *restrict pr = p + (size_t)i * (size_t)t;
    float *restrict dr = dp + (size_t)i * (size_t)t;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j <= i; j++)
      dot += dr[j] * pr[j];
    for (int j = 0; j <= i; j++)
      dr[j] = pr[j] * (dr[j] - dot);
    for (int j = i + 1; j < t; j++)
      dr[j] = 0.0f;
  }
}

/* Pairs [begin, end) of (image b, head h), pair = b * heads + h. */
static void attention_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const attn_job_t *j = arg;
  int t = j->t, c = j->c, heads = j->heads, d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  for (size_t pair = begin; pair < end; pair++) {
    size_t b = pair / (size_t)heads, h = pair % (size_t)heads;
    const float *q = j->qkv + b * (size_t)t * (size_t)ld + h * (size_t)d;
    const float *k = q + c, *v = q + 2 * c;
    float *p = j->att + pair * (size_t)t * (size_t)t;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, q, ld, k, ld, 0.0f, p,
                t);
    causal_softmax(p, t);
    float *o = j->out + b * (size_t)t * (size_t)c + h * (size_t)d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, p, t, v, ld, 0.0f, o,
                c);
  }
}

void td__cpu_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv, int n,
                               int t, int c, int heads) {
  attn_job_t j = {.out = out, .att = att, .qkv = qkv, .n = n, .t = t, .c = c, .heads = heads};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)heads, 1, attention_forward_part, &j);
}

static void attention_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const attn_job_t *j = arg;
  int t = j->t, c = j->c, heads = j->heads, d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  for (size_t pair = begin; pair < end; pair++) {
    size_t b = pair / (size_t)heads, h = pair % (size_t)heads;
    size_t base = b * (size_t)t * (size_t)ld + h * (size_t)d;
    const float *q = j->qkv + base, *k = q + c, *v = q + 2 * c;
    float *dq = j->out + base, *dk = dq + c, *dv = dq + 2 * c;
    const float *p = j->catt + pair * (size_t)t * (size_t)t;
    float *dp = j->datt + pair * (size_t)t * (size_t)t;
    const float *dO = j->dout + b * (size_t)t * (size_t)c + h * (size_t)d;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, p, t, dO, c, 0.0f, dv,
                ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, dO, c, v, ld, 0.0f, dp,
                t);
    causal_softmax_backward(dp, p, t);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, scale, dp, t, k, ld, 0.0f,
                dq, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, scale, dp, t, q, ld, 0.0f, dk,
                ld);
  }
}

void td__cpu_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                                const float *qkv, const float *att, int n, int t, int c,
                                int heads) {
  attn_job_t j = {.out = dqkv, .datt = datt, .dout = dout, .qkv = qkv, .catt = att, .n = n,
                  .t = t, .c = c, .heads = heads};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)heads, 1, attention_backward_part, &j);
}
