/* layer_conv.c: CPU kernels of the convolution family: im2col/col2im (the
 * convolution itself is a GEMM over the columns, issued by model.c), the
 * per-channel bias with a fused ReLU, the batch-major <-> channel-major swap
 * that lets one GEMM cover a whole batch, and max/average pooling. Runs on the
 * thread that owns the model; nothing here allocates. */
#include <stdbool.h>
#include <string.h>

#include "compute/backend_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

void td__cpu_im2col(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g) {
  (void)be;
  int k = g->k, s = g->stride, p = g->pad, ho = g->ho, wo = g->wo;
  size_t plane = g->ld > 0 ? (size_t)g->ld : (size_t)ho * (size_t)wo;
  for (int ci = 0; ci < g->c; ci++)
    for (int ki = 0; ki < k; ki++)
      for (int kj = 0; kj < k; kj++) {
        float *restrict dst = col + ((size_t)(ci * k + ki) * (size_t)k + (size_t)kj) * plane;
        const float *src = img + (size_t)ci * (size_t)g->h * (size_t)g->w;
        for (int oh = 0; oh < ho; oh++) {
          int ih = oh * s - p + ki;
          float *restrict row = dst + (size_t)oh * (size_t)wo;
          if (ih < 0 || ih >= g->h) {
            memset(row, 0, (size_t)wo * sizeof *row);
            continue;
          }
          const float *srow = src + (size_t)ih * (size_t)g->w;
          if (s == 1) {
            int lo = p - kj > 0 ? p - kj : 0;           /* first ow with iw >= 0 */
            int hi = g->w + p - kj < wo ? g->w + p - kj : wo; /* first ow with iw >= w */
            if (hi < lo)
              hi = lo;
            for (int ow = 0; ow < lo; ow++)
              row[ow] = 0.0f;
            if (hi > lo)
              memcpy(row + lo, srow + lo - p + kj, (size_t)(hi - lo) * sizeof *row);
            for (int ow = hi; ow < wo; ow++)
              row[ow] = 0.0f;
          } else {
            for (int ow = 0; ow < wo; ow++) {
              int iw = ow * s - p + kj;
              row[ow] = iw >= 0 && iw < g->w ? srow[iw] : 0.0f;
            }
          }
        }
      }
}

void td__cpu_col2im(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                    bool acc) {
  (void)be;
  int k = g->k, s = g->stride, p = g->pad, ho = g->ho, wo = g->wo;
  size_t plane = g->ld > 0 ? (size_t)g->ld : (size_t)ho * (size_t)wo;
  if (!acc)
    memset(img, 0, (size_t)g->c * (size_t)g->h * (size_t)g->w * sizeof *img);
  for (int ci = 0; ci < g->c; ci++)
    for (int ki = 0; ki < k; ki++)
      for (int kj = 0; kj < k; kj++) {
        const float *src = col + ((size_t)(ci * k + ki) * (size_t)k + (size_t)kj) * plane;
        float *dst = img + (size_t)ci * (size_t)g->h * (size_t)g->w;
        for (int oh = 0; oh < ho; oh++) {
          int ih = oh * s - p + ki;
          if (ih < 0 || ih >= g->h)
            continue;
          float *restrict drow = dst + (size_t)ih * (size_t)g->w;
          const float *restrict srow = src + (size_t)oh * (size_t)wo;
          for (int ow = 0; ow < wo; ow++) {
            int iw = ow * s - p + kj;
            if (iw >= 0 && iw < g->w)
              drow[iw] += srow[ow];
          }
        }
      }
}

void td__cpu_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner) {
  (void)be;
  size_t row = (size_t)inner * sizeof *out;
  for (int i = 0; i < d0; i++)
    for (int j = 0; j < d1; j++)
      memcpy(out + ((size_t)j * (size_t)d0 + (size_t)i) * (size_t)inner,
             inp + ((size_t)i * (size_t)d1 + (size_t)j) * (size_t)inner, row);
}

TD_CLONES
static void plane_bias(float *restrict y, float b, int hw, bool relu) {
  if (relu)
    for (int i = 0; i < hw; i++) {
      float v = y[i] + b;
      y[i] = v < 0.0f ? 0.0f : v; /* NaN survives, as in bias_act */
    }
  else
    for (int i = 0; i < hw; i++)
      y[i] += b;
}

void td__cpu_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c,
                              int hw, td_act_t act) {
  (void)be;
  for (int b = 0; b < n; b++)
    for (int ch = 0; ch < c; ch++)
      plane_bias(y + ((size_t)b * (size_t)c + (size_t)ch) * (size_t)hw, bias ? bias[ch] : 0.0f,
                 hw, act == TD_ACT_RELU);
}

TD_CLONES
static float plane_backward(float *restrict dy, const float *restrict y, int hw, bool relu) {
  float sum = 0.0f;
  if (relu)
    for (int i = 0; i < hw; i++) {
      float g = y[i] > 0.0f ? dy[i] : 0.0f;
      dy[i] = g;
      sum += g;
    }
  else
    for (int i = 0; i < hw; i++)
      sum += dy[i];
  return sum;
}

void td__cpu_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                  int n, int c, int hw, td_act_t act) {
  (void)be;
  if (dbias != NULL)
    memset(dbias, 0, (size_t)c * sizeof *dbias);
  for (int b = 0; b < n; b++)
    for (int ch = 0; ch < c; ch++) {
      size_t off = ((size_t)b * (size_t)c + (size_t)ch) * (size_t)hw;
      float s = plane_backward(dy + off, y + off, hw, act == TD_ACT_RELU);
      if (dbias != NULL)
        dbias[ch] += s;
    }
}

void td__cpu_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                          const td_conv_geom_t *g, td_pool_t kind) {
  (void)be;
  int k = g->k, s = g->stride;
  size_t in_plane = (size_t)g->h * (size_t)g->w, out_plane = (size_t)g->ho * (size_t)g->wo;
  float inv = 1.0f / (float)(k * k);
  for (size_t pl = 0; pl < (size_t)n * (size_t)g->c; pl++) {
    const float *x = inp + pl * in_plane;
    float *y = out + pl * out_plane;
    int32_t *ix = idx != NULL ? idx + pl * out_plane : NULL;
    if (kind == TD_POOL_MAX && k == 2 && s == 2) { /* the common case, select by select */
      for (int oh = 0; oh < g->ho; oh++) {
        int r0 = 2 * oh * g->w, r1 = r0 + g->w;
        for (int ow = 0; ow < g->wo; ow++) {
          int at = r0 + 2 * ow, best_at = at;
          float best = x[at];
          int cand[3] = {at + 1, r1 + 2 * ow, r1 + 2 * ow + 1};
          for (int q = 0; q < 3; q++) {
            float v = x[cand[q]];
            bool take = v > best || v != v; /* ties: first; a NaN wins */
            best_at = take ? cand[q] : best_at;
            best = take ? v : best;
          }
          y[oh * g->wo + ow] = best;
          ix[oh * g->wo + ow] = best_at;
        }
      }
      continue;
    }
    for (int oh = 0; oh < g->ho; oh++)
      for (int ow = 0; ow < g->wo; ow++) {
        int base = oh * s * g->w + ow * s;
        size_t o = (size_t)oh * (size_t)g->wo + (size_t)ow;
        if (kind == TD_POOL_MAX) {
          int best = base;
          for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
              int at = base + ki * g->w + kj;
              if (x[at] > x[best] || x[at] != x[at]) /* a NaN wins so it is reported */
                best = at;
            }
          y[o] = x[best];
          ix[o] = best;
        } else {
          float sum = 0.0f;
          for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++)
              sum += x[base + ki * g->w + kj];
          y[o] = sum * inv;
        }
      }
  }
}

void td__cpu_pool_backward(td_backend_t *be, float *dinp, const float *dout, const int32_t *idx,
                           int n, const td_conv_geom_t *g, td_pool_t kind, bool acc) {
  (void)be;
  int k = g->k, s = g->stride;
  size_t in_plane = (size_t)g->h * (size_t)g->w, out_plane = (size_t)g->ho * (size_t)g->wo;
  float inv = 1.0f / (float)(k * k);
  if (!acc)
    memset(dinp, 0, (size_t)n * (size_t)g->c * in_plane * sizeof *dinp);
  for (size_t pl = 0; pl < (size_t)n * (size_t)g->c; pl++) {
    float *dx = dinp + pl * in_plane;
    const float *dy = dout + pl * out_plane;
    if (kind == TD_POOL_MAX) {
      const int32_t *ix = idx + pl * out_plane;
      for (size_t o = 0; o < out_plane; o++)
        dx[ix[o]] += dy[o];
      continue;
    }
    for (int oh = 0; oh < g->ho; oh++)
      for (int ow = 0; ow < g->wo; ow++) {
        float v = dy[(size_t)oh * (size_t)g->wo + (size_t)ow] * inv;
        int base = oh * s * g->w + ow * s;
        for (int ki = 0; ki < k; ki++)
          for (int kj = 0; kj < k; kj++)
            dx[base + ki * g->w + kj] += v;
      }
  }
}
