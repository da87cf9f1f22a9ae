/* backend_cuda_layers.cu: the CUDA layer ops of backend interface version 3.
 *
 * They follow the CPU kernels in compute/layer_*.c op by op (checked in
 * tests/unit/test_backend_cuda.c): im2col/col2im and the batch/channel swap
 * for convolutions as GEMMs, per-channel bias and activation, pooling (the
 * backward gathers per input pixel, no atomics), LayerNorm and GroupNorm (one
 * block per row or group, fixed reduction order), GELU/ReLU, residual add,
 * dropout (mask drawn on the host from the CPU's generator), embedding (the
 * token gradient adds atomically) and causal attention (each image's heads
 * as one strided-batched GEMM). Every op runs on the backend's stream;
 * failures are kept by td_cuda::keep_error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda/backend_cuda.cuh"

extern "C" {
#include "common/error.h"
#include "compute/rng.h"
}

namespace {

using namespace td_cuda;

/* ---- layer ops (iface version 3) --------------------------------------- */

/* Sum over one block of kThreads threads, in a fixed tree order; every
 * thread gets the total. `shared` holds kThreads values. */
template <typename T> __device__ T block_sum(T v, T *shared) {
  __syncthreads(); /* shared may still be read from a previous call */
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

#define GRID_STRIDE(i, n)                                                                      \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                      \
       i += (size_t)gridDim.x * blockDim.x)

/* Rows of the column matrix are g.ld apart (0: ho*wo), so a batch of images
 * can sit side by side for one GEMM. */
__device__ size_t col_ld(const td_conv_geom_t &g) {
  return g.ld > 0 ? (size_t)g.ld : (size_t)g.ho * (size_t)g.wo;
}

__global__ void im2col_kernel(float *col, const float *img, td_conv_geom_t g) {
  size_t plane = (size_t)g.ho * (size_t)g.wo, ld = col_ld(g);
  size_t n = (size_t)g.c * g.k * g.k * plane;
  GRID_STRIDE(i, n) {
    size_t row = i / plane, o = i % plane;
    int kj = (int)(row % g.k), ki = (int)(row / g.k % g.k), ci = (int)(row / g.k / g.k);
    int oh = (int)(o / g.wo), ow = (int)(o % g.wo);
    int ih = oh * g.stride - g.pad + ki, iw = ow * g.stride - g.pad + kj;
    bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
    col[row * ld + o] = inside ? img[((size_t)ci * g.h + ih) * g.w + iw] : 0.0f;
  }
}

/* Gather form: one thread per image pixel sums the columns that read it, in
 * the CPU's (ki, kj) order, so there are no atomics and no races. */
__global__ void col2im_kernel(float *img, const float *col, td_conv_geom_t g, bool acc) {
  size_t ld = col_ld(g);
  size_t n = (size_t)g.c * g.h * g.w;
  GRID_STRIDE(i, n) {
    int iw = (int)(i % g.w), ih = (int)(i / g.w % g.h), ci = (int)(i / g.w / g.h);
    float sum = acc ? img[i] : 0.0f;
    for (int ki = 0; ki < g.k; ki++) {
      int oh_s = ih + g.pad - ki;
      if (oh_s < 0 || oh_s % g.stride != 0 || oh_s / g.stride >= g.ho)
        continue;
      for (int kj = 0; kj < g.k; kj++) {
        int ow_s = iw + g.pad - kj;
        if (ow_s < 0 || ow_s % g.stride != 0 || ow_s / g.stride >= g.wo)
          continue;
        size_t row = ((size_t)ci * g.k + ki) * g.k + kj;
        sum += col[row * ld + (size_t)(oh_s / g.stride) * g.wo + ow_s / g.stride];
      }
    }
    img[i] = sum;
  }
}

/* out[j][i][:] = inp[i][j][:] for inp d0 x d1 x inner. */
__global__ void swap01_kernel(float *out, const float *inp, size_t d0, size_t d1, size_t inner) {
  GRID_STRIDE(e, d0 * d1 * inner) {
    size_t x = e % inner, ij = e / inner, i = ij / d1, j = ij % d1;
    out[(j * d0 + i) * inner + x] = inp[e];
  }
}

__global__ void channel_bias_act_kernel(float *y, const float *bias, size_t n, int c, int hw,
                                        bool relu) {
  GRID_STRIDE(i, n) {
    float v = y[i] + (bias != NULL ? bias[i / hw % c] : 0.0f);
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

/* One block per channel: mask dy over every image's plane and sum it. */
__global__ void channel_act_backward_kernel(float *dy, const float *y, float *dbias, int n, int c,
                                            int hw, bool relu) {
  __shared__ float shared[kThreads];
  int ch = blockIdx.x;
  size_t per = (size_t)n * hw;
  float sum = 0.0f;
  for (size_t e = threadIdx.x; e < per; e += blockDim.x) {
    size_t i = ((e / hw) * c + ch) * hw + e % hw;
    float g = dy[i];
    if (relu) {
      g = y[i] > 0.0f ? g : 0.0f;
      dy[i] = g;
    }
    sum += g;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0 && dbias != NULL)
    dbias[ch] = sum;
}

__global__ void pool_forward_kernel(float *out, int32_t *idx, const float *inp, size_t planes,
                                    td_conv_geom_t g, bool max) {
  size_t out_plane = (size_t)g.ho * g.wo, in_plane = (size_t)g.h * g.w;
  float inv = 1.0f / (float)(g.k * g.k);
  GRID_STRIDE(i, planes * out_plane) {
    size_t pl = i / out_plane, o = i % out_plane;
    int oh = (int)(o / g.wo), ow = (int)(o % g.wo);
    const float *x = inp + pl * in_plane;
    int base = oh * g.stride * g.w + ow * g.stride;
    if (max) {
      int best = base;
      for (int ki = 0; ki < g.k; ki++)
        for (int kj = 0; kj < g.k; kj++) {
          int at = base + ki * g.w + kj;
          if (x[at] > x[best] || x[at] != x[at]) /* a NaN wins so it is reported */
            best = at;
        }
      out[i] = x[best];
      idx[i] = best;
    } else {
      float sum = 0.0f;
      for (int ki = 0; ki < g.k; ki++)
        for (int kj = 0; kj < g.k; kj++)
          sum += x[base + ki * g.w + kj];
      out[i] = sum * inv;
    }
  }
}

/* Gather form again: one thread per input pixel visits the windows that
 * cover it (max: those whose argmax it is). */
__global__ void pool_backward_kernel(float *dinp, const float *dout, const int32_t *idx,
                                     size_t planes, td_conv_geom_t g, bool max, bool acc) {
  size_t out_plane = (size_t)g.ho * g.wo, in_plane = (size_t)g.h * g.w;
  float inv = 1.0f / (float)(g.k * g.k);
  GRID_STRIDE(i, planes * in_plane) {
    size_t pl = i / in_plane;
    int at = (int)(i % in_plane), ih = at / g.w, iw = at % g.w;
    int oh_lo = ih - g.k + 1 > 0 ? (ih - g.k + 1 + g.stride - 1) / g.stride : 0;
    int ow_lo = iw - g.k + 1 > 0 ? (iw - g.k + 1 + g.stride - 1) / g.stride : 0;
    int oh_hi = min(ih / g.stride, g.ho - 1), ow_hi = min(iw / g.stride, g.wo - 1);
    float sum = acc ? dinp[i] : 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; oh++)
      for (int ow = ow_lo; ow <= ow_hi; ow++) {
        size_t o = pl * out_plane + (size_t)oh * g.wo + ow;
        if (max)
          sum += idx[o] == at ? dout[o] : 0.0f;
        else
          sum += dout[o] * inv;
      }
    dinp[i] = sum;
  }
}

/* Mean and 1/std of n floats at x (biased variance, eps 1e-5, sums in
 * double, two passes as on the CPU); every thread of the block gets them. */
__device__ void block_stats(const float *x, size_t n, double *shared, float *mean, float *rstd) {
  double s = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x)
    s += x[i];
  double mu = block_sum(s, shared) / (double)n;
  double ss = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    double d = x[i] - mu;
    ss += d * d;
  }
  ss = block_sum(ss, shared);
  *mean = (float)mu;
  *rstd = (float)(1.0 / sqrt(ss / (double)n + 1e-5));
}

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int cols) {
  __shared__ double shared[kThreads];
  size_t r = blockIdx.x;
  const float *x = inp + r * cols;
  float *y = out + r * cols;
  float mu, rs;
  block_stats(x, (size_t)cols, shared, &mu, &rs);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[c] = (x[c] - mu) * rs * weight[c] + bias[c];
}

__global__ void layernorm_backward_rows(float *dinp, const float *dout, const float *inp,
                                        const float *weight, const float *mean, const float *rstd,
                                        int cols, bool acc) {
  __shared__ double shared[kThreads];
  size_t r = blockIdx.x;
  const float *x = inp + r * cols, *dy = dout + r * cols;
  float *dx = dinp + r * cols;
  float mu = mean[r], rs = rstd[r];
  double m1 = 0.0, m2 = 0.0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float xh = (x[c] - mu) * rs;
    float dxh = dy[c] * weight[c];
    m1 += dxh;
    m2 += dxh * xh;
  }
  m1 = block_sum(m1, shared);
  m2 = block_sum(m2, shared);
  float a = (float)(m1 / cols), b = (float)(m2 / cols);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float xh = (x[c] - mu) * rs;
    float v = (dy[c] * weight[c] - a - xh * b) * rs;
    dx[c] = acc ? dx[c] + v : v;
  }
}

/* dweight and dbias of LayerNorm: column sums over the rows, 32 x 8 tiles. */
__global__ void layernorm_backward_cols(float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *mean, const float *rstd,
                                        int rows, int cols) {
  __shared__ float pw[kTileRows][kTileCols], pb[kTileRows][kTileCols];
  int c = blockIdx.x * kTileCols + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < cols)
    for (int r = threadIdx.y; r < rows; r += kTileRows) {
      size_t i = (size_t)r * cols + c;
      float xh = (inp[i] - mean[r]) * rstd[r];
      sw += dout[i] * xh;
      sb += dout[i];
    }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tw = 0.0f, tb = 0.0f;
    for (int j = 0; j < kTileRows; j++) {
      tw += pw[j][threadIdx.x];
      tb += pb[j][threadIdx.x];
    }
    dweight[c] = tw;
    dbias[c] = tb;
  }
}

/* One block per (image, group): its cg x hw floats are contiguous. */
__global__ void groupnorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int c, int hw,
                                         int groups) {
  __shared__ double shared[kThreads];
  int bg = blockIdx.x, g = bg % groups, cg = c / groups;
  size_t gsize = (size_t)cg * hw, off = (size_t)bg * gsize;
  float mu, rs;
  block_stats(inp + off, gsize, shared, &mu, &rs);
  if (threadIdx.x == 0) {
    mean[bg] = mu;
    rstd[bg] = rs;
  }
  for (size_t e = threadIdx.x; e < gsize; e += blockDim.x) {
    int ch = g * cg + (int)(e / hw);
    float sc = rs * weight[ch], sh = bias[ch] - mu * rs * weight[ch];
    out[off + e] = inp[off + e] * sc + sh;
  }
}

__global__ void groupnorm_backward_groups(float *dinp, const float *dout, const float *inp,
                                          const float *weight, const float *mean,
                                          const float *rstd, int c, int hw, int groups,
                                          bool acc) {
  __shared__ double shared[kThreads];
  int bg = blockIdx.x, g = bg % groups, cg = c / groups;
  size_t gsize = (size_t)cg * hw, off = (size_t)bg * gsize;
  float mu = mean[bg], rs = rstd[bg];
  double m1 = 0.0, m2 = 0.0;
  for (size_t e = threadIdx.x; e < gsize; e += blockDim.x) {
    float w = weight[g * cg + (int)(e / hw)];
    float xh = (inp[off + e] - mu) * rs;
    m1 += (double)dout[off + e] * w;
    m2 += (double)(dout[off + e] * xh) * w;
  }
  m1 = block_sum(m1, shared);
  m2 = block_sum(m2, shared);
  float a = (float)(m1 / (double)gsize), bb = (float)(m2 / (double)gsize);
  for (size_t e = threadIdx.x; e < gsize; e += blockDim.x) {
    float w = weight[g * cg + (int)(e / hw)];
    float xh = (inp[off + e] - mu) * rs;
    float v = (dout[off + e] * w - a - xh * bb) * rs;
    dinp[off + e] = acc ? dinp[off + e] + v : v;
  }
}

/* dweight and dbias of GroupNorm: one block per channel, over images and plane. */
__global__ void groupnorm_backward_channels(float *dweight, float *dbias, const float *dout,
                                            const float *inp, const float *mean,
                                            const float *rstd, int n, int c, int hw, int groups) {
  __shared__ float shared[kThreads];
  int ch = blockIdx.x, g = ch / (c / groups);
  float sw = 0.0f, sb = 0.0f;
  size_t per = (size_t)n * hw;
  for (size_t e = threadIdx.x; e < per; e += blockDim.x) {
    size_t b = e / hw, i = (b * c + ch) * hw + e % hw;
    float xh = (inp[i] - mean[b * groups + g]) * rstd[b * groups + g];
    sw += dout[i] * xh;
    sb += dout[i];
  }
  sw = block_sum(sw, shared);
  sb = block_sum(sb, shared);
  if (threadIdx.x == 0) {
    dweight[ch] = sw;
    dbias[ch] = sb;
  }
}

constexpr float kGeluK = 0.7978845608028654f; /* sqrt(2/pi) */

__global__ void act_forward_kernel(float *out, const float *inp, size_t n, bool gelu) {
  GRID_STRIDE(i, n) {
    float v = inp[i];
    out[i] = gelu ? 0.5f * v * (1.0f + tanhf(kGeluK * (v + 0.044715f * v * v * v)))
                  : (v < 0.0f ? 0.0f : v);
  }
}

__global__ void act_backward2_kernel(float *dinp, const float *dout, const float *inp, size_t n,
                                     int kind, bool acc) {
  GRID_STRIDE(i, n) {
    float v = inp[i], g = dout[i];
    if (kind == 1) {
      g = v > 0.0f ? g : 0.0f;
    } else if (kind == 2) {
      float t = tanhf(kGeluK * (v + 0.044715f * v * v * v));
      g *= 0.5f * (1.0f + t) +
           0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * 0.044715f * v * v);
    }
    dinp[i] = acc ? dinp[i] + g : g;
  }
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void mul_kernel(float *out, const float *a, const float *b, size_t n, bool acc) {
  GRID_STRIDE(i, n) out[i] = acc ? out[i] + a[i] * b[i] : a[i] * b[i];
}

__global__ void embed_forward_kernel(float *out, const int32_t *tokens, const float *wte,
                                     const float *wpe, size_t rows, int t, int c) {
  GRID_STRIDE(i, rows * c) {
    size_t row = i / c;
    int j = (int)(i % c);
    out[i] = wte[(size_t)tokens[row] * c + j] + wpe[(row % t) * c + j];
  }
}

/* dwpe[t][j] = sum over images (overwritten), in image order. */
__global__ void embed_backward_positions(float *dwpe, const float *dout, int n, int t, int c) {
  GRID_STRIDE(i, (size_t)t * c) {
    float sum = 0.0f;
    for (int b = 0; b < n; b++)
      sum += dout[(size_t)b * t * c + i];
    dwpe[i] = sum;
  }
}

/* dwte[token] += the row: a token may repeat, so atomically (the order of
 * the adds, and so the last bits, may vary from run to run). */
__global__ void embed_backward_tokens(float *dwte, const float *dout, const int32_t *tokens,
                                      size_t rows, int c) {
  GRID_STRIDE(i, rows * c) atomicAdd(&dwte[(size_t)tokens[i / c] * c + i % c], dout[i]);
}

/* Causal softmax in place over the t x t score blocks: one block per row i,
 * entries j > i set to exactly 0. */
__global__ void causal_softmax_kernel(float *att, int t) {
  __shared__ float shared[kThreads];
  size_t row = blockIdx.x;
  int i = (int)(row % t);
  float *p = att + row * t;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x)
    m = fmaxf(m, p[j]);
  /* max as a block reduction on the same tree */
  __syncthreads();
  shared[threadIdx.x] = m;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  m = shared[0];
  float s = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    float e = expf(p[j] - m);
    p[j] = e;
    s += e;
  }
  float inv = 1.0f / block_sum(s, shared);
  for (int j = threadIdx.x; j < t; j += blockDim.x)
    p[j] = j <= i ? p[j] * inv : 0.0f;
}

/* dS = P (dP - rowsum(dP P)) in place over dP, causal. */
__global__ void causal_softmax_backward_kernel(float *datt, const float *att, int t) {
  __shared__ float shared[kThreads];
  size_t row = blockIdx.x;
  int i = (int)(row % t);
  const float *p = att + row * t;
  float *d = datt + row * t;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x)
    dot += d[j] * p[j];
  dot = block_sum(dot, shared);
  for (int j = threadIdx.x; j < t; j += blockDim.x)
    d[j] = j <= i ? p[j] * (d[j] - dot) : 0.0f;
}

/* Row-major strided-batched GEMM (the transposition trick of cuda_gemm,
 * batch items stride_* floats apart): the attention heads of one image. */
void gemm_batched(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                  const float *a, int lda, long long stride_a, const float *b, int ldb,
                  long long stride_b, float beta, float *c, int ldc, long long stride_c,
                  int batch) {
  blas_ok(be,
          cublasSgemmStridedBatched(ctx_of(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                    stride_b, a, lda, stride_a, &beta, c, ldc, stride_c, batch),
          "cublasSgemmStridedBatched");
}

void cuda_im2col(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g) {
  size_t n = (size_t)g->c * g->k * g->k * g->ho * g->wo;
  if (n == 0 || !enter(be))
    return;
  im2col_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(col, img, *g);
  launched(be, "im2col");
}

void cuda_col2im(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                 bool acc) {
  size_t n = (size_t)g->c * g->h * g->w;
  if (n == 0 || !enter(be))
    return;
  col2im_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(img, col, *g, acc);
  launched(be, "col2im");
}

void cuda_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner) {
  size_t n = (size_t)d0 * d1 * inner;
  if (n == 0 || !enter(be))
    return;
  swap01_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(out, inp, (size_t)d0,
                                                                    (size_t)d1, (size_t)inner);
  launched(be, "swap01");
}

void cuda_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c, int hw,
                           td_act_t act) {
  size_t count = (size_t)n * c * hw;
  if (count == 0 || !enter(be))
    return;
  channel_bias_act_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(
      y, bias, count, c, hw, act == TD_ACT_RELU);
  launched(be, "channel_bias_act");
}

void cuda_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int n,
                               int c, int hw, td_act_t act) {
  if (c < 1 || !enter(be))
    return;
  channel_act_backward_kernel<<<c, kThreads, 0, ctx_of(be)->stream>>>(dy, y, dbias, n, c, hw,
                                                                       act == TD_ACT_RELU);
  launched(be, "channel_act_backward");
}

void cuda_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                       const td_conv_geom_t *g, td_pool_t kind) {
  size_t planes = (size_t)n * g->c, count = planes * g->ho * g->wo;
  if (count == 0 || !enter(be))
    return;
  pool_forward_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(
      out, idx, inp, planes, *g, kind == TD_POOL_MAX);
  launched(be, "pool_forward");
}

void cuda_pool_backward(td_backend_t *be, float *dinp, const float *dout, const int32_t *idx,
                        int n, const td_conv_geom_t *g, td_pool_t kind, bool acc) {
  size_t planes = (size_t)n * g->c, count = planes * g->h * g->w;
  if (count == 0 || !enter(be))
    return;
  pool_backward_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(
      dinp, dout, idx, planes, *g, kind == TD_POOL_MAX, acc);
  launched(be, "pool_backward");
}

void cuda_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int rows,
                            int cols) {
  if (rows < 1 || cols < 1 || !enter(be))
    return;
  layernorm_forward_kernel<<<rows, kThreads, 0, ctx_of(be)->stream>>>(out, mean, rstd, inp,
                                                                       weight, bias, cols);
  launched(be, "layernorm_forward");
}

void cuda_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int rows, int cols, bool acc) {
  if (cols < 1 || !enter(be))
    return;
  cudaStream_t stream = ctx_of(be)->stream;
  if (rows > 0) {
    layernorm_backward_rows<<<rows, kThreads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd,
                                                           cols, acc);
    launched(be, "layernorm_backward");
  }
  dim3 block(kTileCols, kTileRows);
  layernorm_backward_cols<<<(cols + kTileCols - 1) / kTileCols, block, 0, stream>>>(
      dweight, dbias, dout, inp, mean, rstd, rows, cols);
  launched(be, "layernorm_backward");
}

void cuda_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int n,
                            int c, int hw, int groups) {
  if (n < 1 || groups < 1 || c < 1 || hw < 1 || !enter(be))
    return;
  groupnorm_forward_kernel<<<n * groups, kThreads, 0, ctx_of(be)->stream>>>(
      out, mean, rstd, inp, weight, bias, c, hw, groups);
  launched(be, "groupnorm_forward");
}

void cuda_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int n, int c, int hw,
                             int groups, bool acc) {
  if (groups < 1 || c < 1 || !enter(be))
    return;
  cudaStream_t stream = ctx_of(be)->stream;
  if (n > 0 && hw > 0) {
    groupnorm_backward_groups<<<n * groups, kThreads, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                   rstd, c, hw, groups, acc);
    launched(be, "groupnorm_backward");
  }
  groupnorm_backward_channels<<<c, kThreads, 0, stream>>>(dweight, dbias, dout, inp, mean, rstd,
                                                          n, c, hw, groups);
  launched(be, "groupnorm_backward");
}

/* A device-to-device copy on the stream (out == inp: nothing to do). */
void copy_on_stream(td_backend_t *be, float *out, const float *inp, size_t count,
                    const char *what) {
  if (out != inp)
    cuda_ok(be,
            cudaMemcpyAsync(out, inp, count * sizeof(float), cudaMemcpyDeviceToDevice,
                            ctx_of(be)->stream),
            what);
}

void cuda_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                      td_act_t act) {
  if (count == 0 || !enter(be))
    return;
  if (act != TD_ACT_RELU && act != TD_ACT_GELU) {
    copy_on_stream(be, out, inp, count, "act_forward");
    return;
  }
  act_forward_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(
      out, inp, count, act == TD_ACT_GELU);
  launched(be, "act_forward");
}

void cuda_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                        size_t count, td_act_t act, bool acc) {
  if (count == 0 || !enter(be))
    return;
  int kind = act == TD_ACT_RELU ? 1 : act == TD_ACT_GELU ? 2 : 0;
  act_backward2_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(
      dinp, dout, inp, count, kind, acc);
  launched(be, "act_backward2");
}

void cuda_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count) {
  if (count == 0 || !enter(be))
    return;
  if (b == NULL) {
    copy_on_stream(be, out, a, count, "add");
    return;
  }
  add_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(out, a, b, count);
  launched(be, "add");
}

/* The mask is drawn on the host from the CPU's stream (td_rng, seed2 "DROP",
 * two 32-bit draws per call), so a seed drops the same units on every
 * backend, then copied up through a pinned buffer and applied on the device. */
void cuda_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                          size_t count, float p, uint64_t seed) {
  if (count == 0 || !enter(be))
    return;
  cuda_ctx *ctx = ctx_of(be);
  /* the previous dropout's copy may still read the staging buffer */
  if (!cuda_ok(be, cudaStreamSynchronize(ctx->stream), "dropout_forward"))
    return;
  if (count > ctx->mask_cap) {
    cudaFreeHost(ctx->host_mask);
    ctx->host_mask = NULL;
    ctx->mask_cap = 0;
    if (!cuda_ok(be, cudaMallocHost(&ctx->host_mask, count * sizeof(float)), "cudaMallocHost"))
      return;
    ctx->mask_cap = count;
  }
  td_rng_t rng;
  td_rng_seed2(&rng, seed, 0x44524f50ull); /* "DROP" */
  float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  double scaled = (double)p * 4294967296.0;
  uint32_t threshold = (uint32_t)(scaled > 4294967295.0 ? 4294967295.0 : scaled);
  float *hm = ctx->host_mask;
  for (size_t i = 0; i < count; i += 2) {
    uint64_t r = td_rng_next(&rng);
    hm[i] = (uint32_t)r >= threshold ? keep : 0.0f;
    if (i + 1 < count)
      hm[i + 1] = (uint32_t)(r >> 32) >= threshold ? keep : 0.0f;
  }
  if (!cuda_ok(be,
               cudaMemcpyAsync(mask, hm, count * sizeof(float), cudaMemcpyHostToDevice,
                               ctx->stream),
               "dropout_forward"))
    return;
  mul_kernel<<<blocks_for(count), kThreads, 0, ctx->stream>>>(out, inp, mask, count, false);
  launched(be, "dropout_forward");
}

void cuda_dropout_backward(td_backend_t *be, float *dinp, const float *dout, const float *mask,
                           size_t count, bool acc) {
  if (count == 0 || !enter(be))
    return;
  mul_kernel<<<blocks_for(count), kThreads, 0, ctx_of(be)->stream>>>(dinp, dout, mask, count,
                                                                      acc);
  launched(be, "dropout_backward");
}

void cuda_embed_forward(td_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                        const float *wpe, int n, int t, int c) {
  size_t rows = (size_t)n * t;
  if (rows == 0 || c < 1 || !enter(be))
    return;
  embed_forward_kernel<<<blocks_for(rows * c), kThreads, 0, ctx_of(be)->stream>>>(
      out, tokens, wte, wpe, rows, t, c);
  launched(be, "embed_forward");
}

void cuda_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tokens, int n, int t, int c) {
  size_t rows = (size_t)n * t;
  if (t < 1 || c < 1 || !enter(be))
    return;
  cudaStream_t stream = ctx_of(be)->stream;
  embed_backward_positions<<<blocks_for((size_t)t * c), kThreads, 0, stream>>>(dwpe, dout, n, t,
                                                                              c);
  launched(be, "embed_backward");
  if (rows == 0)
    return;
  embed_backward_tokens<<<blocks_for(rows * c), kThreads, 0, stream>>>(dwte, dout, tokens, rows,
                                                                      c);
  launched(be, "embed_backward");
}

/* Per image b, the heads are one strided batch (head h starts h*d columns
 * into the packed q | k | v rows, its t x t block h*t*t floats into att). */
void cuda_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv, int n,
                            int t, int c, int heads) {
  if (n < 1 || t < 1 || heads < 1 || !enter(be))
    return;
  int d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  long long tt = (long long)t * t;
  for (int b = 0; b < n; b++) {
    const float *q = qkv + (size_t)b * t * ld, *k = q + c;
    float *p = att + (size_t)b * heads * tt;
    gemm_batched(be, false, true, t, t, d, scale, q, ld, d, k, ld, d, 0.0f, p, t, tt, heads);
  }
  causal_softmax_kernel<<<(unsigned)((size_t)n * heads * t), kThreads, 0, ctx_of(be)->stream>>>(
      att, t);
  launched(be, "attention_forward");
  for (int b = 0; b < n; b++) {
    const float *v = qkv + (size_t)b * t * ld + 2 * c;
    const float *p = att + (size_t)b * heads * tt;
    float *o = out + (size_t)b * t * c;
    gemm_batched(be, false, false, t, d, t, 1.0f, p, t, tt, v, ld, d, 0.0f, o, c, d, heads);
  }
}

void cuda_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                             const float *qkv, const float *att, int n, int t, int c, int heads) {
  if (n < 1 || t < 1 || heads < 1 || !enter(be))
    return;
  int d = c / heads, ld = 3 * c;
  float scale = 1.0f / sqrtf((float)d);
  long long tt = (long long)t * t;
  for (int b = 0; b < n; b++) {
    size_t base = (size_t)b * t * ld;
    const float *v = qkv + base + 2 * c;
    float *dv = dqkv + base + 2 * c;
    const float *p = att + (size_t)b * heads * tt;
    float *dp = datt + (size_t)b * heads * tt;
    const float *dO = dout + (size_t)b * t * c;
    gemm_batched(be, true, false, t, d, t, 1.0f, p, t, tt, dO, c, d, 0.0f, dv, ld, d, heads);
    gemm_batched(be, false, true, t, t, d, 1.0f, dO, c, d, v, ld, d, 0.0f, dp, t, tt, heads);
  }
  causal_softmax_backward_kernel<<<(unsigned)((size_t)n * heads * t), kThreads, 0,
                                   ctx_of(be)->stream>>>(datt, att, t);
  launched(be, "attention_backward");
  for (int b = 0; b < n; b++) {
    size_t base = (size_t)b * t * ld;
    const float *q = qkv + base, *k = q + c;
    float *dq = dqkv + base, *dk = dq + c;
    const float *dp = datt + (size_t)b * heads * tt;
    gemm_batched(be, false, false, t, d, t, scale, dp, t, tt, k, ld, d, 0.0f, dq, ld, d, heads);
    gemm_batched(be, true, false, t, d, t, scale, dp, t, tt, q, ld, d, 0.0f, dk, ld, d, heads);
  }
}

} // namespace

void td_cuda::fill_layer_ops(td_backend_iface_t *t) {
  t->im2col = cuda_im2col;
  t->col2im = cuda_col2im;
  t->swap01 = cuda_swap01;
  t->channel_bias_act = cuda_channel_bias_act;
  t->channel_act_backward = cuda_channel_act_backward;
  t->pool_forward = cuda_pool_forward;
  t->pool_backward = cuda_pool_backward;
  t->layernorm_forward = cuda_layernorm_forward;
  t->layernorm_backward = cuda_layernorm_backward;
  t->groupnorm_forward = cuda_groupnorm_forward;
  t->groupnorm_backward = cuda_groupnorm_backward;
  t->act_forward = cuda_act_forward;
  t->act_backward2 = cuda_act_backward2;
  t->add = cuda_add;
  t->dropout_forward = cuda_dropout_forward;
  t->dropout_backward = cuda_dropout_backward;
  t->embed_forward = cuda_embed_forward;
  t->embed_backward = cuda_embed_backward;
  t->attention_forward = cuda_attention_forward;
  t->attention_backward = cuda_attention_backward;
}
