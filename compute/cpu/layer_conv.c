/* layer_conv.c: CPU kernels of the convolution family: im2col/col2im (the
 * convolution itself is a GEMM over the columns, issued by model.c), the
 * per-channel bias with a fused ReLU, the batch-major <-> channel-major swap
 * that lets one GEMM cover a whole batch, and max/average pooling. Batched
 * ops are split over the backend's thread pool by image, plane or channel,
 * so each output is written by one thread with the arithmetic of the serial
 * loop (bias gradients: by channel, each summed over the batch in order).
 * Called on the thread that owns the model; nothing here allocates. */
#include <stdbool.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/cpu/tpool.h"

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
            const float *restrict shifted = srow - p + kj; /* read only at [lo, hi) */
            for (int ow = 0; ow < lo; ow++)
              row[ow] = 0.0f;
            for (int ow = lo; ow < hi; ow++) /* short rows: a loop, not a memcpy call */
              row[ow] = shifted[ow];
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
          if (s == 1) { /* ow in [lo, hi) lands inside the row: no test per pixel */
            int lo = p - kj > 0 ? p - kj : 0;
            int hi = g->w + p - kj < wo ? g->w + p - kj : wo;
            float *restrict d = drow - p + kj;
            for (int ow = lo; ow < hi; ow++)
              d[ow] += srow[ow];
            continue;
          }
          for (int ow = 0; ow < wo; ow++) {
            int iw = ow * s - p + kj;
            if (iw >= 0 && iw < g->w)
              drow[iw] += srow[ow];
          }
        }
      }
}

typedef struct {
  td_backend_t *be;
  float *out;
  const float *inp;
  const td_conv_geom_t *g;
  bool acc;
} conv_job_t;

static void im2col_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const conv_job_t *j = arg;
  size_t plane = (size_t)j->g->ho * (size_t)j->g->wo;
  size_t in_size = (size_t)j->g->c * (size_t)j->g->h * (size_t)j->g->w;
  for (size_t b = begin; b < end; b++)
    td__cpu_im2col(j->be, j->out + b * plane, j->inp + b * in_size, j->g);
}

void td__cpu_im2col_batch(td_backend_t *be, float *col, const float *img, int n,
                          const td_conv_geom_t *g) {
  conv_job_t j = {.be = be, .out = col, .inp = img, .g = g};
  td_tpool_for(td__cpu_tpool(be), (size_t)n,
               td_tpool_grain((size_t)g->c * g->k * g->k * g->ho * g->wo, 1), im2col_part, &j);
}

static void col2im_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const conv_job_t *j = arg;
  size_t plane = (size_t)j->g->ho * (size_t)j->g->wo;
  size_t in_size = (size_t)j->g->c * (size_t)j->g->h * (size_t)j->g->w;
  for (size_t b = begin; b < end; b++)
    td__cpu_col2im(j->be, j->out + b * in_size, j->inp + b * plane, j->g, j->acc);
}

void td__cpu_col2im_batch(td_backend_t *be, float *img, const float *col, int n,
                          const td_conv_geom_t *g, bool acc) {
  conv_job_t j = {.be = be, .out = img, .inp = col, .g = g, .acc = acc};
  td_tpool_for(td__cpu_tpool(be), (size_t)n,
               td_tpool_grain((size_t)g->c * g->k * g->k * g->ho * g->wo, 1), col2im_part, &j);
}

typedef struct {
  float *out, *dbias;
  const float *inp, *bias;
  int d0, d1, c, hw;
  bool relu;
} plane_job_t;

/* Output block q = j * d0 + i, so each thread writes one contiguous run. */
static void swap01_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const plane_job_t *j = arg;
  size_t row = (size_t)j->hw * sizeof *j->out;
  for (size_t q = begin; q < end; q++) {
    size_t jj = q / (size_t)j->d0, i = q % (size_t)j->d0;
    memcpy(j->out + q * (size_t)j->hw, j->inp + (i * (size_t)j->d1 + jj) * (size_t)j->hw, row);
  }
}

void td__cpu_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner) {
  plane_job_t j = {.out = out, .inp = inp, .d0 = d0, .d1 = d1, .hw = inner};
  td_tpool_for(td__cpu_tpool(be), (size_t)d0 * (size_t)d1, td_tpool_grain((size_t)inner, 1),
               swap01_part, &j);
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

static void channel_bias_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const plane_job_t *j = arg;
  for (size_t pl = begin; pl < end; pl++)
    plane_bias(j->out + pl * (size_t)j->hw, j->bias ? j->bias[pl % (size_t)j->c] : 0.0f, j->hw,
               j->relu);
}

void td__cpu_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c,
                              int hw, td_act_t act) {
  plane_job_t j = {.out = y, .bias = bias, .d0 = n, .c = c, .hw = hw, .relu = act == TD_ACT_RELU};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)c, td_tpool_grain((size_t)hw, 1),
               channel_bias_part, &j);
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

/* By channel: one thread masks a channel's planes of every image and sums
 * its bias gradient over the batch in image order. */
static void channel_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const plane_job_t *j = arg;
  for (size_t ch = begin; ch < end; ch++) {
    float sum = 0.0f;
    for (int b = 0; b < j->d0; b++) {
      size_t off = ((size_t)b * (size_t)j->c + ch) * (size_t)j->hw;
      sum += plane_backward(j->out + off, j->inp + off, j->hw, j->relu);
    }
    if (j->dbias != NULL)
      j->dbias[ch] = sum;
  }
}

void td__cpu_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                  int n, int c, int hw, td_act_t act) {
  plane_job_t j = {.out = dy, .inp = y, .dbias = dbias, .d0 = n, .c = c, .hw = hw,
                   .relu = act == TD_ACT_RELU};
  td_tpool_for(td__cpu_tpool(be), (size_t)c, td_tpool_grain((size_t)n * (size_t)hw, 1),
               channel_backward_part, &j);
}

/* One output row of a 2x2, stride-2 max pool over the input rows at r0 and
 * r0 + w of the plane x: select by select (ties: the first; a NaN wins so
 * the loss reports it), so gcc vectorises it. */
TD_CLONES
static void maxpool2_row(float *restrict y, int32_t *restrict ix, const float *restrict x, int r0,
                         int w, int wo) {
  const float *restrict a = x + r0, *restrict b = x + r0 + w;
  for (int ow = 0; ow < wo; ow++) {
    float best = a[2 * ow];
    int32_t at = r0 + 2 * ow, best_at = at;
    float v = a[2 * ow + 1];
    bool take = v > best || v != v;
    best_at = take ? at + 1 : best_at;
    best = take ? v : best;
    v = b[2 * ow];
    take = v > best || v != v;
    best_at = take ? at + w : best_at;
    best = take ? v : best;
    v = b[2 * ow + 1];
    take = v > best || v != v;
    best_at = take ? at + w + 1 : best_at;
    best = take ? v : best;
    y[ow] = best;
    ix[ow] = best_at;
  }
}

typedef struct {
  float *out;
  int32_t *idx;
  const int32_t *cidx;
  const float *inp;
  const td_conv_geom_t *g;
  td_pool_t kind;
  bool acc;
} pool_job_t;

static void pool_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const pool_job_t *j = arg;
  const td_conv_geom_t *g = j->g;
  float *out = j->out;
  int32_t *idx = j->idx;
  const float *inp = j->inp;
  td_pool_t kind = j->kind;
  int k = g->k, s = g->stride;
  size_t in_plane = (size_t)g->h * (size_t)g->w, out_plane = (size_t)g->ho * (size_t)g->wo;
  float inv = 1.0f / (float)(k * k);
  for (size_t pl = begin; pl < end; pl++) {
    const float *x = inp + pl * in_plane;
    float *y = out + pl * out_plane;
    int32_t *ix = idx != NULL ? idx + pl * out_plane : NULL;
    if (kind == TD_POOL_MAX && k == 2 && s == 2) { /* the common case, vectorised */
      for (int oh = 0; oh < g->ho; oh++)
        maxpool2_row(y + (size_t)oh * (size_t)g->wo, ix + (size_t)oh * (size_t)g->wo, x,
                     2 * oh * g->w, g->w, g->wo);
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

void td__cpu_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                          const td_conv_geom_t *g, td_pool_t kind) {
  pool_job_t j = {.out = out, .idx = idx, .inp = inp, .g = g, .kind = kind};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)g->c,
               td_tpool_grain((size_t)g->h * (size_t)g->w, 1), pool_forward_part, &j);
}

static void pool_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const pool_job_t *j = arg;
  const td_conv_geom_t *g = j->g;
  float *dinp = j->out;
  const float *dout = j->inp;
  const int32_t *idx = j->cidx;
  int k = g->k, s = g->stride;
  size_t in_plane = (size_t)g->h * (size_t)g->w, out_plane = (size_t)g->ho * (size_t)g->wo;
  float inv = 1.0f / (float)(k * k);
  if (!j->acc)
    memset(dinp + begin * in_plane, 0, (end - begin) * in_plane * sizeof *dinp);
  for (size_t pl = begin; pl < end; pl++) {
    float *dx = dinp + pl * in_plane;
    const float *dy = dout + pl * out_plane;
    if (j->kind == TD_POOL_MAX) {
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

void td__cpu_pool_backward(td_backend_t *be, float *dinp, const float *dout, const int32_t *idx,
                           int n, const td_conv_geom_t *g, td_pool_t kind, bool acc) {
  pool_job_t j = {.out = dinp, .cidx = idx, .inp = dout, .g = g, .kind = kind, .acc = acc};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)g->c,
               td_tpool_grain((size_t)g->h * (size_t)g->w, 1), pool_backward_part, &j);
}
