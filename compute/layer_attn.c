/* layer_attn.c: CPU kernels of the transformer family: token + position
 * embedding and causal multi-head self-attention.
 *
 * Attention runs per (image of the batch, head) as strided GEMMs straight on
 * the packed qkv rows (lda = 3C, no gather copy): S = Q K^T / sqrt(d) into
 * the saved probability block, a causal row softmax in place (entries j > i
 * are exactly 0, so they never pass gradient back), O = P V written into its
 * head's columns of out. Backward: dV = P^T dO, dP = dO V^T, dS = P (dP -
 * rowsum(dP P)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d). Runs on the
 * model's thread; BLAS may use more. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "compute/backend_impl.h"

void td__cpu_embed_forward(td_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int n, int t, int c) {
  (void)be;
  for (int b = 0; b < n; b++)
    for (int i = 0; i < t; i++) {
      const float *restrict e = wte + (size_t)tokens[b * t + i] * (size_t)c;
      const float *restrict p = wpe + (size_t)i * (size_t)c;
      float *restrict y = out + ((size_t)b * (size_t)t + (size_t)i) * (size_t)c;
      for (int j = 0; j < c; j++)
        y[j] = e[j] + p[j];
    }
}

void td__cpu_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int n, int t, int c) {
  (void)be;
  memset(dwpe, 0, (size_t)t * (size_t)c * sizeof *dwpe);
  for (int b = 0; b < n; b++)
    for (int i = 0; i < t; i++) {
      const float *restrict dy = dout + ((size_t)b * (size_t)t + (size_t)i) * (size_t)c;
      float *restrict de = dwte + (size_t)tokens[b * t + i] * (size_t)c;
      float *restrict dp = dwpe + (size_t)i * (size_t)c;
      for (int j = 0; j < c; j++) {
        de[j] += dy[j];
        dp[j] += dy[j];
      }
    }
}

void td__cpu_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv, int n,
                               int t, int c, int heads) {
  (void)be;
  int d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  for (int b = 0; b < n; b++)
    for (int h = 0; h < heads; h++) {
      const float *q = qkv + (size_t)b * (size_t)t * (size_t)ld + (size_t)h * (size_t)d;
      const float *k = q + c, *v = q + 2 * c;
      float *p = att + ((size_t)b * (size_t)heads + (size_t)h) * (size_t)t * (size_t)t;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, q, ld, k, ld, 0.0f, p,
                  t);
      for (int i = 0; i < t; i++) {
        float *row = p + (size_t)i * (size_t)t;
        float max = row[0];
        for (int j = 1; j <= i; j++)
          max = row[j] > max ? row[j] : max;
        float sum = 0.0f;
        for (int j = 0; j <= i; j++) {
          row[j] = expf(row[j] - max);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= i; j++)
          row[j] *= inv;
        for (int j = i + 1; j < t; j++)
          row[j] = 0.0f;
      }
      float *o = out + (size_t)b * (size_t)t * (size_t)c + (size_t)h * (size_t)d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, p, t, v, ld, 0.0f, o,
                  c);
    }
}

void td__cpu_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                                const float *qkv, const float *att, int n, int t, int c,
                                int heads) {
  (void)be;
  int d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  for (int b = 0; b < n; b++)
    for (int h = 0; h < heads; h++) {
      size_t base = (size_t)b * (size_t)t * (size_t)ld + (size_t)h * (size_t)d;
      const float *q = qkv + base, *k = q + c, *v = q + 2 * c;
      float *dq = dqkv + base, *dk = dq + c, *dv = dq + 2 * c;
      const float *p = att + ((size_t)b * (size_t)heads + (size_t)h) * (size_t)t * (size_t)t;
      float *dp = datt + ((size_t)b * (size_t)heads + (size_t)h) * (size_t)t * (size_t)t;
      const float *dO = dout + (size_t)b * (size_t)t * (size_t)c + (size_t)h * (size_t)d;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, p, t, dO, c, 0.0f, dv,
                  ld);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, dO, c, v, ld, 0.0f, dp,
                  t);
      for (int i = 0; i < t; i++) {
        const float *pr = p + (size_t)i * (size_t)t;
        float *dr = dp + (size_t)i * (size_t)t;
        float dot = 0.0f;
        for (int j = 0; j <= i; j++)
          dot += dr[j] * pr[j];
        for (int j = 0; j <= i; j++)
          dr[j] = pr[j] * (dr[j] - dot);
        for (int j = i + 1; j < t; j++)
          dr[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, scale, dp, t, k, ld, 0.0f,
                  dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, scale, dp, t, q, ld, 0.0f,
                  dk, ld);
    }
}
