/* backend_cpu.c: the CPU backend, the reference every other backend is
 * checked against. GEMMs go to OpenBLAS; everything else is a fused,
 * vectorisable pass over memory (bias + ReLU in one pass, ReLU mask + bias
 * gradient in one pass, the whole SGD update in one pass), compiled for
 * AVX-512, AVX2 and baseline x86-64 with run-time dispatch (target_clones), so
 * no -march flag is needed for speed. No call allocates. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/error.h"

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
  void *p = NULL;
  size_t padded = ((bytes ? bytes : 1) + 63) / 64 * 64;
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
  memcpy(dst, src, bytes);
  return 0;
}

static void cpu_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
  (void)be;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

TD_CLONES
static void bias_relu_rows(float *restrict y, const float *restrict bias, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *restrict row = y + (size_t)r * cols;
    for (int c = 0; c < cols; c++) {
      float v = row[c] + bias[c];
      row[c] = v < 0.0f ? 0.0f : v; /* NaN stays NaN, so the loss reports it */
    }
  }
}

TD_CLONES
static void bias_rows(float *restrict y, const float *restrict bias, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *restrict row = y + (size_t)r * cols;
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

TD_CLONES
static void relu_backward_rows(float *restrict dy, const float *restrict y,
                               float *restrict dbias, int rows, int cols) {
  for (int c = 0; c < cols; c++)
    dbias[c] = 0.0f;
  for (int r = 0; r < rows; r++) {
    float *restrict drow = dy + (size_t)r * cols;
    const float *restrict yrow = y + (size_t)r * cols;
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
    const float *restrict drow = dy + (size_t)r * cols;
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

static double cpu_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct) {
  (void)be;
  double total = 0;
  int hits = 0;
  for (int r = 0; r < rows; r++) {
    const float *z = logits + (size_t)r * cols;
    int32_t label = labels[r];
    if (label < 0 || label >= cols)
      return NAN;
    float mx = z[0];
    int arg = 0;
    for (int c = 1; c < cols; c++)
      if (z[c] > mx) {
        mx = z[c];
        arg = c;
      }
    double sum = 0;
    for (int c = 0; c < cols; c++)
      sum += exp((double)(z[c] - mx));
    double log_sum = log(sum);
    total += log_sum - (double)(z[label] - mx);
    hits += arg == label;
    if (dlogits != NULL) {
      float *d = dlogits + (size_t)r * cols;
      float inv = (float)(1.0 / sum);
      for (int c = 0; c < cols; c++)
        d[c] = expf(z[c] - mx) * inv * grad_scale;
      d[label] -= grad_scale;
    }
  }
  if (correct)
    *correct = hits;
  return total;
}

TD_CLONES
static void sgd_momentum(float *restrict w, const float *restrict g, float *restrict v, size_t n,
                         float lr, float mu, float wd, int nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] + wd * w[i];
      float vi = mu * v[i] + gi;
      v[i] = vi;
      w[i] -= lr * (gi + mu * vi);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float vi = mu * v[i] + g[i] + wd * w[i];
      v[i] = vi;
      w[i] -= lr * vi;
    }
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
  if (hp->momentum > 0.0f && v != NULL)
    sgd_momentum(w, g, v, n, hp->lr, hp->momentum, hp->weight_decay, hp->nesterov);
  else
    sgd_plain(w, g, n, hp->lr, hp->weight_decay);
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
};
