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
 *
 * Threads: open(threads = N > 0) starts a pool of N threads (compute/cpu/tpool.h)
 * and sets OpenBLAS to one thread; every op then splits its work over the
 * pool itself, a large GEMM included (into row or column blocks, each one
 * single-threaded sgemm), so exactly N threads compute and none of them
 * waits on or competes with a second set of BLAS threads. Outside the GEMMs
 * the split never changes what one output element sums, or in which order
 * (reductions such as bias gradients are split over their outputs, not their
 * terms), so those ops give the bits of one thread; a split GEMM and the
 * reported loss (a double summed per chunk) may differ in the last bits.
 * threads <= 0 leaves OpenBLAS at its default and runs the rest on the
 * caller's thread.
 * Nothing here allocates after open, and memory is plain host memory, so
 * upload and download are memcpy. */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/cpu/tpool.h"
#include "compute/cpu/vecmath.h"
#include "common/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

/* Below this many multiply-adds a GEMM runs on one thread: splitting it
 * would cost more in hand-off than it saves (about 20 us of work). */
#define TD__GEMM_SPLIT_MACS (1u << 19)

static int cpu_open(td_backend_t *be, int threads, char *why, size_t why_len) {
  if (threads <= 0)
    return 0;
  openblas_set_num_threads(1);
  td_tpool_t *pool = NULL;
  int rc = td_tpool_open(&pool, threads);
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot start %d compute threads: %s", threads,
                  td_strerror(rc));
  be->context = be->cpu_pool = pool;
  return 0;
}

static void cpu_close(td_backend_t *be) {
  td_tpool_t *pool = be->context;
  td_tpool_close(&pool);
  be->context = be->cpu_pool = NULL;
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

typedef struct {
  bool ta, tb, split_rows;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const float *a, *b;
  float *c;
} gemm_job_t;

/* One block of rows (or columns) of C: the same sgemm on a slice of op(A)
 * (or op(B)), so every element of C sums the same k products. */
static void gemm_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const gemm_job_t *j = arg;
  int lo = (int)begin, len = (int)(end - begin);
  if (j->split_rows)
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, len, j->n, j->k, j->alpha,
                j->a + (j->ta ? (size_t)lo : (size_t)lo * (size_t)j->lda), j->lda, j->b, j->ldb,
                j->beta, j->c + (size_t)lo * (size_t)j->ldc, j->ldc);
  else
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, j->m, len, j->k, j->alpha, j->a, j->lda,
                j->b + (j->tb ? (size_t)lo * (size_t)j->ldb : (size_t)lo), j->ldb, j->beta,
                j->c + lo, j->ldc);
}

/* A large GEMM is split into blocks of rows of C when it has many rows, in
 * multiples of 24: that keeps OpenBLAS's register tiles (12 rows of a
 * row-major C on AVX2) where the unsplit call has them, and so, on AVX2, its
 * bits. OpenBLAS picks its kernel by size, though: on AVX-512 (a Zen 4 runs
 * as Cooper Lake in 0.3.21) a block may go to a small-matrix kernel that
 * sums in another order than the whole, and the last bits differ.
 * With few rows it is split into blocks of 16 columns (a convolution's
 * output, its column gradients), or of 8 rows when it is narrow as well (a
 * convolution's weight gradient: few rows and columns, a long sum); those
 * splits move the tile grid and change the last bits of some sums. Either
 * way it is float rounding only: tests/unit/test_threads.c holds every split
 * to the a-priori rounding bound of the one call. */
#define TD__GEMM_ROW_GRAIN 24
#define TD__GEMM_COL_GRAIN 16
#define TD__GEMM_NARROW_GRAIN 8

static void cpu_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
  td_tpool_t *pool = td__cpu_tpool(be);
  if (td_tpool_threads(pool) == 1 || (double)m * n * k < TD__GEMM_SPLIT_MACS) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  bool many_rows = m >= 4 * TD__GEMM_ROW_GRAIN, wide = n >= 2 * TD__GEMM_COL_GRAIN;
  bool rows = many_rows || !wide;
  gemm_job_t j = {.ta = ta, .tb = tb, .split_rows = rows, .m = m, .n = n, .k = k,
                  .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta,
                  .a = a, .b = b, .c = c};
  size_t grain = many_rows ? TD__GEMM_ROW_GRAIN
                 : wide    ? TD__GEMM_COL_GRAIN
                           : TD__GEMM_NARROW_GRAIN;
  td_tpool_for(pool, (size_t)(rows ? m : n), grain, gemm_part, &j);
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

typedef struct {
  float *y, *dbias;
  const float *bias, *cy;
  int rows, cols;
  td_act_t act;
} rows_job_t;

static void bias_act_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const rows_job_t *j = arg;
  float *y = j->y + begin * (size_t)j->cols;
  if (j->act == TD_ACT_RELU)
    bias_relu_rows(y, j->bias, (int)(end - begin), j->cols);
  else
    bias_rows(y, j->bias, (int)(end - begin), j->cols);
}

static void cpu_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                         td_act_t act) {
  rows_job_t j = {.y = y, .bias = bias, .rows = rows, .cols = cols, .act = act};
  td_tpool_for(td__cpu_tpool(be), (size_t)rows, td_tpool_grain((size_t)cols, 1), bias_act_part,
               &j);
}

/* One pass over the rows of a block of `width` columns (rows ld apart): mask
 * dy by relu'(y) (y is the activated output, so y > 0 exactly where the
 * pre-activation was positive) and add the masked row into the bias
 * gradient, which stays in L1 across rows. */
TD_CLONES
static void relu_backward_rows(float *restrict dy, const float *restrict y,
                               float *restrict dbias, int rows, int width, int ld) {
  for (int c = 0; c < width; c++)
    dbias[c] = 0.0f;
  for (int r = 0; r < rows; r++) {
    float *restrict drow = dy + (size_t)r * (size_t)ld;
    const float *restrict yrow = y + (size_t)r * (size_t)ld;
    for (int c = 0; c < width; c++) {
      float g = yrow[c] > 0.0f ? drow[c] : 0.0f;
      drow[c] = g;
      dbias[c] += g;
    }
  }
}

TD_CLONES
static void column_sums(const float *restrict dy, float *restrict dbias, int rows, int width,
                        int ld) {
  for (int c = 0; c < width; c++)
    dbias[c] = 0.0f;
  for (int r = 0; r < rows; r++) {
    const float *restrict drow = dy + (size_t)r * (size_t)ld;
    for (int c = 0; c < width; c++)
      dbias[c] += drow[c];
  }
}

/* Split over columns: each bias gradient is summed over every row, in row
 * order, by one thread. */
static void act_backward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const rows_job_t *j = arg;
  int width = (int)(end - begin);
  if (j->act == TD_ACT_RELU)
    relu_backward_rows(j->y + begin, j->cy + begin, j->dbias + begin, j->rows, width, j->cols);
  else
    column_sums(j->y + begin, j->dbias + begin, j->rows, width, j->cols);
}

static void cpu_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                             int cols, td_act_t act) {
  rows_job_t j = {.y = dy, .cy = y, .dbias = dbias, .rows = rows, .cols = cols, .act = act};
  td_tpool_for(td__cpu_tpool(be), (size_t)cols, td_tpool_grain((size_t)rows, 16),
               act_backward_part, &j);
}

/* One row of logits z: max, then exp(z - max) once (td__exp_fast, so the
 * pass vectorises), summed in double and, when training, stored into d and
 * rescaled in place to (p - onehot) * grad_scale. The argmax (first of the
 * ties) is found after the max. A NaN or Inf logit makes the loss NaN. */
TD_CLONES
static double xent_row(const float *restrict z, float *restrict d, int32_t label, int cols,
                       float grad_scale, int *hit) {
  float max = z[0];
#pragma omp simd reduction(max : max)
  for (int c = 0; c < cols; c++)
    max = z[c] > max ? z[c] : max;
  int argmax = 0;
  while (argmax < cols - 1 && !(z[argmax] == max))
    argmax++;
  double sum = 0.0;
  if (d != NULL) {
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < cols; c++) {
      float e = td__exp_fast(z[c] - max);
      d[c] = e;
      sum += e;
    }
    float scale = (float)(grad_scale / sum);
    for (int c = 0; c < cols; c++)
      d[c] *= scale;
    d[label] -= grad_scale;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < cols; c++)
      sum += td__exp_fast(z[c] - max);
  }
  *hit = argmax == label;
  return log(sum) - (double)(z[label] - max);
}

/* Rows [r0, r1). The labels come from datasets and peers, so one outside
 * [0, cols) is reported (NaN loss, the caller checks isfinite), never used
 * as an index. */
static double softmax_xent_rows(const float *logits, const int32_t *labels, float *dlogits,
                                float grad_scale, int r0, int r1, int cols, int *correct) {
  double total = 0.0;
  int hits = 0;
  for (int r = r0; r < r1; r++) {
    int32_t label = labels[r];
    if (label < 0 || label >= cols) {
      total = NAN;
      break;
    }
    int hit;
    total += xent_row(logits + (size_t)r * (size_t)cols,
                      dlogits != NULL ? dlogits + (size_t)r * (size_t)cols : NULL, label, cols,
                      grad_scale, &hit);
    hits += hit;
  }
  *correct = hits;
  return total;
}

#define TD__MAX_PARTS 256

typedef struct {
  const float *logits;
  const int32_t *labels;
  float *dlogits;
  float grad_scale;
  int cols;
  double loss[TD__MAX_PARTS];
  int hits[TD__MAX_PARTS];
} xent_job_t;

static void xent_part(void *arg, size_t begin, size_t end, int part) {
  xent_job_t *j = arg;
  j->loss[part] = softmax_xent_rows(j->logits, j->labels, j->dlogits, j->grad_scale, (int)begin,
                                    (int)end, j->cols, &j->hits[part]);
}

static double cpu_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct) {
  xent_job_t j = {.logits = logits, .labels = labels, .dlogits = dlogits,
                  .grad_scale = grad_scale, .cols = cols};
  int parts = td_tpool_threads(td__cpu_tpool(be));
  for (int p = 0; p < parts; p++)
    j.hits[p] = 0;
  td_tpool_for(td__cpu_tpool(be), (size_t)rows, td_tpool_grain((size_t)cols, 1), xent_part, &j);
  double total = 0.0;
  int hits = 0;
  for (int p = 0; p < parts; p++) {
    total += j.loss[p];
    hits += j.hits[p];
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

typedef struct {
  float *w, *m, *v;
  const float *g;
  const td_sgd_hparams_t *sgd;
  const td_adamw_hparams_t *adamw;
} optim_job_t;

static void sgd_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const optim_job_t *j = arg;
  const td_sgd_hparams_t *hp = j->sgd;
  size_t n = end - begin;
  if (hp->momentum == 0.0f) /* no velocity: v is untouched and may be NULL */
    sgd_plain(j->w + begin, j->g + begin, n, hp->lr, hp->weight_decay);
  else if (hp->nesterov)
    sgd_nesterov(j->w + begin, j->g + begin, j->v + begin, n, hp->lr, hp->momentum,
                 hp->weight_decay);
  else
    sgd_momentum(j->w + begin, j->g + begin, j->v + begin, n, hp->lr, hp->momentum,
                 hp->weight_decay);
}

static void cpu_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                         const td_sgd_hparams_t *hp) {
  assert(hp->momentum == 0.0f || v != NULL);
  optim_job_t j = {.w = w, .g = g, .v = v, .sgd = hp};
  td_tpool_for(td__cpu_tpool(be), n, td_tpool_grain(1, 16), sgd_part, &j);
}

typedef struct {
  float *g;
  const float *w, *center;
  float mu;
} prox_job_t;

static void prox_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const prox_job_t *j = arg;
  for (size_t i = begin; i < end; i++)
    j->g[i] += j->mu * (j->w[i] - j->center[i]);
}

static void cpu_prox_grad(td_backend_t *be, float *g, const float *w, const float *center,
                          float mu, size_t n) {
  prox_job_t j = {.g = g, .w = w, .center = center, .mu = mu};
  td_tpool_for(td__cpu_tpool(be), n, td_tpool_grain(1, 16), prox_part, &j);
}

/* The bias corrections are folded into two per-pass constants, so the loop is
 * m, v, w in and out with one sqrt and one divide per element. gcc keeps it
 * scalar while math-errno is on (sqrtf may set errno; neither the optimize
 * attribute nor the pragma lift that under target_clones in gcc 12), so the
 * CPU kernels are built with -fno-math-errno (compute/Makemodule.am). */
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

static void adamw_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const optim_job_t *j = arg;
  const td_adamw_hparams_t *hp = j->adamw;
  adamw_fused(j->w + begin, j->g + begin, j->m + begin, j->v + begin, end - begin, hp->lr,
              hp->beta1, hp->beta2, hp->eps, hp->weight_decay, 1.0f / hp->bias1,
              1.0f / hp->bias2, hp->grad_scale);
}

/* Also the portable fallback of backends without an adamw slot (backend.c),
 * which hands it their own be: td__cpu_tpool() is NULL there, one thread. */
static void cpu_adamw_step(td_backend_t *be, float *w, const float *g, float *m, float *v,
                           size_t n, const td_adamw_hparams_t *hp) {
  optim_job_t j = {.w = w, .g = g, .m = m, .v = v, .adamw = hp};
  td_tpool_for(td__cpu_tpool(be), n, td_tpool_grain(1, 16), adamw_part, &j);
}

const td_backend_iface_t td__backend_cpu = {
    .version = TD_BACKEND_IFACE_VERSION,
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
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
    .im2col_batch = td__cpu_im2col_batch,
    .col2im_batch = td__cpu_col2im_batch,
    .prox_grad = cpu_prox_grad,
};
