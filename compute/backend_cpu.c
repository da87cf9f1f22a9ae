/* backend_cpu.c: the CPU backend, the reference every other backend is
 * checked against.
 *
 * GEMMs go to OpenBLAS (row-major cblas_sgemm). Everything else is one fused
 * pass over memory: bias + ReLU in one pass, ReLU mask + bias gradient in one
 * pass, softmax + loss + gradient in one pass per row, the whole SGD or AdamW
 * update in one pass. The elementwise loops are written so gcc -O3 vectorises them
 * (restrict, unit stride, no calls, branch-free selects) and are compiled for
 * AVX-512, AVX2 and baseline x86-64 with run-time dispatch (target_clones), so
 * no -march flag is needed for speed and the binary still runs anywhere.
 * Nothing here allocates after open, and memory is plain host memory, so
 * upload and download are memcpy. */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "common/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

static int cpu_open(td_backend_t *be, int threads, char *why, size_t why_len) {
  (void)be;
  (void)why;
  (void)why_len;
  if (threads > 0)
    openblas_set_num_threads(threads);
  return 0;
}

static void *cpu_alloc(td_backend_t *be, size_t bytes) {
  (void)be;
  if (bytes > SIZE_MAX - 64)
    return NULL;
  /* Whole cache lines, so a vector loop may read the tail of the last one. */
  size_t padded = ((bytes ? bytes : 1) + 63) / 64 * 64;
  void *p = NULL;
  if (posix_memalign(&p, 64, padded) != 0)
    return NULL;
  memset(p, 0, padded);
  return p;
}

static void cpu_free(td_backend_t *be, void *p) {
  (void)be;
  free(p);
}

static int cpu_copy(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes != 0)
    memmove(dst, src, bytes);
  return 0;
}

static void cpu_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
  (void)be;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* y = relu(y + bias). `v < 0 ? 0 : v` rather than fmaxf or `v > 0 ? v : 0`:
 * a NaN must survive the ReLU so that the loss reports it (TD_ENUMERIC)
 * instead of the network silently training on zeros. */
TD_CLONES
static void bias_relu_rows(float *restrict y, const float *restrict bias, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *restrict row = y + (size_t)r * (size_t)cols;
    for (int c = 0; c < cols; c++) {
      float v = row[c] + bias[c];
      row[c] = v < 0.0f ? 0.0f : v;
    }
  }
}

TD_CLONES
static void bias_rows(float *restrict y, const float *restrict bias, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *restrict row = y + (size_t)r * (size_t)cols;
    for (int c = 0; c < cols; c++)
      row[c] += bias[c];
  }
}

static void cpu_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                         td_act_t act) {
  (void)be;
  if (act == TD_ACT_RELU)
    bias_relu_rows(y, bias, rows, cols);
  else
    bias_rows(y, bias, rows, cols);
}

/* One pass over the rows: mask dy by relu'(y) (y is the activated output, so
 * y > 0 exactly where the pre-activation was positive) and add the masked row
 * into the bias gradient, which stays in L1 across rows. */
TD_CLONES
static void relu_backward_rows(float *restrict dy, const float *restrict y,
                               float *restrict dbias, int rows, int cols) {
  for (int c = 0; c < cols; c++)
    dbias[c] = 0.0f;
  for (int r = 0; r < rows; r++) {
    float *restrict drow = dy + (size_t)r * (size_t)cols;
    const float *restrict yrow = y + (size_t)r * (size_t)cols;
    for (int c = 0; c < cols; c++) {
      float g = yrow[c] > 0.0f ? drow[c] : 0.0f;
      drow[c] = g;
      dbias[c] += g;
    }
  }
}

TD_CLONES
static void column_sums(const float *restrict dy, float *restrict dbias, int rows, int cols) {
  for (int c = 0; c < cols; c++)
    dbias[c] = 0.0f;
  for (int r = 0; r < rows; r++) {
    const float *restrict drow = dy + (size_t)r * (size_t)cols;
    for (int c = 0; c < cols; c++)
      dbias[c] += drow[c];
  }
}

static void cpu_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                             int cols, td_act_t act) {
  (void)be;
  if (act == TD_ACT_RELU)
    relu_backward_rows(dy, y, dbias, rows, cols);
  else
    column_sums(dy, dbias, rows, cols);
}

/* Per row: max and argmax in one scan, then exp(z - max) once, summed in
 * double and, when training, stored into dlogits and rescaled in place to
 * (p - onehot) * grad_scale. A NaN or Inf logit makes that row's loss NaN,
 * and so does a label outside [0, cols): the labels come from datasets and
 * peers, so a bad one is reported (the caller checks isfinite), never used as
 * an index. */
static double cpu_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct) {
  (void)be;
  double total = 0.0;
  int hits = 0;
  for (int r = 0; r < rows; r++) {
    const float *restrict z = logits + (size_t)r * (size_t)cols;
    int32_t label = labels[r];
    if (label < 0 || label >= cols) {
      total = NAN;
      break;
    }
    float max = z[0];
    int argmax = 0;
    for (int c = 1; c < cols; c++)
      if (z[c] > max) {
        max = z[c];
        argmax = c;
      }
    double sum = 0.0;
    if (dlogits != NULL) {
      float *restrict d = dlogits + (size_t)r * (size_t)cols;
      for (int c = 0; c < cols; c++) {
        float e = expf(z[c] - max);
        d[c] = e;
        sum += e;
      }
      float scale = (float)(grad_scale / sum);
      for (int c = 0; c < cols; c++)
        d[c] *= scale;
      d[label] -= grad_scale;
    } else {
      for (int c = 0; c < cols; c++)
        sum += expf(z[c] - max);
    }
    total += log(sum) - (double)(z[label] - max);
    hits += argmax == label;
  }
  if (correct != NULL)
    *correct = hits;
  return total;
}

/* g' = g + wd*w; v = mu*v + g'; w -= lr * (nesterov ? g' + mu*v : v). */
TD_CLONES
static void sgd_momentum(float *restrict w, const float *restrict g, float *restrict v, size_t n,
                         float lr, float mu, float wd) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + wd * w[i];
    float vi = mu * v[i] + gi;
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

TD_CLONES
static void sgd_nesterov(float *restrict w, const float *restrict g, float *restrict v, size_t n,
                         float lr, float mu, float wd) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + wd * w[i];
    float vi = mu * v[i] + gi;
    v[i] = vi;
    w[i] -= lr * (gi + mu * vi);
  }
}

TD_CLONES
static void sgd_plain(float *restrict w, const float *restrict g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; i++)
    w[i] -= lr * (g[i] + wd * w[i]);
}

static void cpu_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                         const td_sgd_hparams_t *hp) {
  (void)be;
  if (hp->momentum == 0.0f) { /* no velocity: v is untouched and may be NULL */
    sgd_plain(w, g, n, hp->lr, hp->weight_decay);
    return;
  }
  assert(v != NULL);
  if (hp->nesterov)
    sgd_nesterov(w, g, v, n, hp->lr, hp->momentum, hp->weight_decay);
  else
    sgd_momentum(w, g, v, n, hp->lr, hp->momentum, hp->weight_decay);
}

/* The bias corrections are folded into two per-pass constants, so the loop is
 * m, v, w in and out with one sqrt and one divide per element. gcc keeps it
 * scalar while math-errno is on (sqrtf may set errno; neither the optimize
 * attribute nor the pragma lift that under target_clones in gcc 12); building
 * with -fno-math-errno vectorises it. */
TD_CLONES
static void adamw_fused(float *restrict w, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float lr, float b1, float b2, float eps,
                        float wd, float inv_bias1, float inv_bias2, float scale) {
  for (size_t i = 0; i < n; i++) {
    float gi = scale * g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= lr * ((mi * inv_bias1) / (sqrtf(vi * inv_bias2) + eps) + wd * w[i]);
  }
}

static void cpu_adamw_step(td_backend_t *be, float *w, const float *g, float *m, float *v,
                           size_t n, const td_adamw_hparams_t *hp) {
  (void)be;
  adamw_fused(w, g, m, v, n, hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
              1.0f / hp->bias1, 1.0f / hp->bias2, hp->grad_scale);
}

const td_backend_iface_t td__backend_cpu = {
    .version = TD_BACKEND_IFACE_VERSION,
    .name = "cpu",
    .open = cpu_open,
    .close = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = NULL,
    .gemm = cpu_gemm,
    .bias_act = cpu_bias_act,
    .act_backward = cpu_act_backward,
    .softmax_xent = cpu_softmax_xent,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .im2col = td__cpu_im2col,
    .col2im = td__cpu_col2im,
    .swap01 = td__cpu_swap01,
    .channel_bias_act = td__cpu_channel_bias_act,
    .channel_act_backward = td__cpu_channel_act_backward,
    .pool_forward = td__cpu_pool_forward,
    .pool_backward = td__cpu_pool_backward,
    .layernorm_forward = td__cpu_layernorm_forward,
    .layernorm_backward = td__cpu_layernorm_backward,
    .groupnorm_forward = td__cpu_groupnorm_forward,
    .groupnorm_backward = td__cpu_groupnorm_backward,
    .act_forward = td__cpu_act_forward,
    .act_backward2 = td__cpu_act_backward2,
    .add = td__cpu_add,
    .dropout_forward = td__cpu_dropout_forward,
    .dropout_backward = td__cpu_dropout_backward,
    .embed_forward = td__cpu_embed_forward,
    .embed_backward = td__cpu_embed_backward,
    .attention_forward = td__cpu_attention_forward,
    .attention_backward = td__cpu_attention_backward,
};
