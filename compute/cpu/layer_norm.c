/* layer_norm.c: CPU kernels of the batch-independent normalizations,
 * LayerNorm over the columns of a row and GroupNorm over (channels of a
 * group x plane) of one image, with eps = 1e-5 and the biased variance.
 * Forward keeps mean and 1/std for backward; statistics are summed in double.
 * Work is split over the backend's thread pool by row (LayerNorm), by image
 * and group (GroupNorm), and the affine parameters' gradients, sums over the
 * rows, in a second pass split by column or channel, so each sum is one
 * thread's, in row order, whatever the thread count. Called on the model's
 * thread; nothing here allocates. */
#include <math.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/cpu/tpool.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

#define TD__NORM_EPS 1e-5

/* Mean and rstd of n floats. */
TD_CLONES
static void stats(const float *restrict x, size_t n, float *mean, float *rstd) {
  double s = 0.0, ss = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; i++)
    s += x[i];
  double mu = s / (double)n;
#pragma omp simd reduction(+ : ss)
  for (size_t i = 0; i < n; i++) {
    double d = x[i] - mu;
    ss += d * d;
  }
  *mean = (float)mu;
  *rstd = (float)(1.0 / sqrt(ss / (double)n + TD__NORM_EPS));
}

typedef struct {
  float *out, *dweight, *dbias, *mean, *rstd;
  const float *inp, *dout, *weight, *bias, *cmean, *crstd;
  int rows, cols, c, hw, groups;
  bool acc;
} norm_job_t;

TD_CLONES
static void layernorm_rows(float *restrict out, float *restrict mean, float *restrict rstd,
                           const float *restrict inp, const float *restrict weight,
                           const float *restrict bias, size_t r0, size_t r1, int cols) {
  for (size_t r = r0; r < r1; r++) {
    const float *restrict x = inp + r * (size_t)cols;
    float *restrict y = out + r * (size_t)cols;
    float mu, rs;
    stats(x, (size_t)cols, &mu, &rs);
    mean[r] = mu;
    rstd[r] = rs;
    for (int c = 0; c < cols; c++)
      y[c] = (x[c] - mu) * rs * weight[c] + bias[c];
  }
}

static void layernorm_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  layernorm_rows(j->out, j->mean, j->rstd, j->inp, j->weight, j->bias, begin, end, j->cols);
}

void td__cpu_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias,
                               int rows, int cols) {
  norm_job_t j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight,
                  .bias = bias, .rows = rows, .cols = cols};
  td_tpool_for(td__cpu_tpool(be), (size_t)rows, td_tpool_grain((size_t)cols, 1),
               layernorm_forward_part, &j);
}

/* dx of a block of rows: each row needs only its own two sums. */
TD_CLONES
static void layernorm_dx_rows(float *restrict dinp, const float *restrict dout,
                              const float *restrict inp, const float *restrict weight,
                              const float *restrict mean, const float *restrict rstd, size_t r0,
                              size_t r1, int cols, bool acc) {
  for (size_t r = r0; r < r1; r++) {
    const float *restrict x = inp + r * (size_t)cols;
    const float *restrict dy = dout + r * (size_t)cols;
    float *restrict dx = dinp + r * (size_t)cols;
    float mu = mean[r], rs = rstd[r];
    double m1 = 0.0, m2 = 0.0;
#pragma omp simd reduction(+ : m1, m2)
    for (int c = 0; c < cols; c++) {
      float xh = (x[c] - mu) * rs;
      float dxh = dy[c] * weight[c];
      m1 += dxh;
      m2 += dxh * xh;
    }
    float a = (float)(m1 / cols), b = (float)(m2 / cols);
    if (acc)
      for (int c = 0; c < cols; c++) {
        float xh = (x[c] - mu) * rs;
        dx[c] += (dy[c] * weight[c] - a - xh * b) * rs;
      }
    else
      for (int c = 0; c < cols; c++) {
        float xh = (x[c] - mu) * rs;
        dx[c] = (dy[c] * weight[c] - a - xh * b) * rs;
      }
  }
}

static void layernorm_dx_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  layernorm_dx_rows(j->out, j->dout, j->inp, j->weight, j->cmean, j->crstd, begin, end, j->cols,
                    j->acc);
}

/* dweight and dbias of columns [c0, c1), summed over every row in order. */
TD_CLONES
static void layernorm_dparams_cols(float *restrict dweight, float *restrict dbias,
                                   const float *restrict dout, const float *restrict inp,
                                   const float *restrict mean, const float *restrict rstd,
                                   int rows, int cols, size_t c0, size_t c1) {
  for (size_t c = c0; c < c1; c++) {
    dweight[c] = 0.0f;
    dbias[c] = 0.0f;
  }
  for (int r = 0; r < rows; r++) {
    const float *restrict x = inp + (size_t)r * (size_t)cols;
    const float *restrict dy = dout + (size_t)r * (size_t)cols;
    float mu = mean[r], rs = rstd[r];
    for (size_t c = c0; c < c1; c++) {
      dweight[c] += dy[c] * ((x[c] - mu) * rs);
      dbias[c] += dy[c];
    }
  }
}

static void layernorm_dparams_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  layernorm_dparams_cols(j->dweight, j->dbias, j->dout, j->inp, j->cmean, j->crstd, j->rows,
                         j->cols, begin, end);
}

void td__cpu_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int rows, int cols,
                                bool acc) {
  norm_job_t j = {.out = dinp, .dweight = dweight, .dbias = dbias, .dout = dout, .inp = inp,
                  .weight = weight, .cmean = mean, .crstd = rstd, .rows = rows, .cols = cols,
                  .acc = acc};
  td_tpool_t *pool = td__cpu_tpool(be);
  td_tpool_for(pool, (size_t)cols, td_tpool_grain((size_t)rows, 16), layernorm_dparams_part, &j);
  if (dinp != NULL)
    td_tpool_for(pool, (size_t)rows, td_tpool_grain((size_t)cols, 1), layernorm_dx_part, &j);
}

static void groupnorm_forward_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  int cg = j->c / j->groups, hw = j->hw;
  size_t gsize = (size_t)cg * (size_t)hw;
  for (size_t bg = begin; bg < end; bg++) { /* image b, group g: bg = b * groups + g */
    size_t off = bg * gsize;
    int g = (int)(bg % (size_t)j->groups);
    float mu, rs;
    stats(j->inp + off, gsize, &mu, &rs);
    j->mean[bg] = mu;
    j->rstd[bg] = rs;
    for (int ci = 0; ci < cg; ci++) {
      int ch = g * cg + ci;
      float sc = rs * j->weight[ch], sh = j->bias[ch] - mu * rs * j->weight[ch];
      const float *restrict x = j->inp + off + (size_t)ci * (size_t)hw;
      float *restrict y = j->out + off + (size_t)ci * (size_t)hw;
      for (int i = 0; i < hw; i++)
        y[i] = x[i] * sc + sh;
    }
  }
}

void td__cpu_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int n,
                               int c, int hw, int groups) {
  norm_job_t j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight,
                  .bias = bias, .rows = n, .c = c, .hw = hw, .groups = groups};
  td_tpool_for(td__cpu_tpool(be), (size_t)n * (size_t)groups,
               td_tpool_grain((size_t)(c / groups) * (size_t)hw, 1), groupnorm_forward_part, &j);
}

/* The plane sums of one channel of one image: sum dy * xhat and sum dy. */
static void plane_sums(const float *restrict x, const float *restrict dy, int hw, float mu,
                       float rs, float *sw, float *sb) {
  float w = 0.0f, b = 0.0f;
  for (int i = 0; i < hw; i++) {
    float xh = (x[i] - mu) * rs;
    w += dy[i] * xh;
    b += dy[i];
  }
  *sw = w;
  *sb = b;
}

static void groupnorm_dx_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  int cg = j->c / j->groups, hw = j->hw;
  size_t gsize = (size_t)cg * (size_t)hw;
  for (size_t bg = begin; bg < end; bg++) {
    size_t off = bg * gsize;
    int g = (int)(bg % (size_t)j->groups);
    float mu = j->cmean[bg], rs = j->crstd[bg];
    double m1 = 0.0, m2 = 0.0;
    for (int ci = 0; ci < cg; ci++) {
      int ch = g * cg + ci;
      float sw, sb;
      plane_sums(j->inp + off + (size_t)ci * (size_t)hw, j->dout + off + (size_t)ci * (size_t)hw,
                 hw, mu, rs, &sw, &sb);
      m1 += (double)sb * j->weight[ch];
      m2 += (double)sw * j->weight[ch];
    }
    float a = (float)(m1 / (double)gsize), bb = (float)(m2 / (double)gsize);
    for (int ci = 0; ci < cg; ci++) {
      int ch = g * cg + ci;
      const float *restrict x = j->inp + off + (size_t)ci * (size_t)hw;
      const float *restrict dy = j->dout + off + (size_t)ci * (size_t)hw;
      float *restrict dx = j->out + off + (size_t)ci * (size_t)hw;
      float wch = j->weight[ch];
      for (int i = 0; i < hw; i++) {
        float xh = (x[i] - mu) * rs;
        float v = (dy[i] * wch - a - xh * bb) * rs;
        dx[i] = j->acc ? dx[i] + v : v;
      }
    }
  }
}

/* dweight and dbias of channels [begin, end), each summed over the images in order. */
static void groupnorm_dparams_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const norm_job_t *j = arg;
  int cg = j->c / j->groups, hw = j->hw;
  for (size_t ch = begin; ch < end; ch++) {
    float dw = 0.0f, db = 0.0f;
    for (int b = 0; b < j->rows; b++) {
      size_t bg = (size_t)b * (size_t)j->groups + ch / (size_t)cg;
      size_t off = ((size_t)b * (size_t)j->c + ch) * (size_t)hw;
      float sw, sb;
      plane_sums(j->inp + off, j->dout + off, hw, j->cmean[bg], j->crstd[bg], &sw, &sb);
      dw += sw;
      db += sb;
    }
    j->dweight[ch] = dw;
    j->dbias[ch] = db;
  }
}

void td__cpu_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int n, int c, int hw,
                                int groups, bool acc) {
  norm_job_t j = {.out = dinp, .dweight = dweight, .dbias = dbias, .dout = dout, .inp = inp,
                  .weight = weight, .cmean = mean, .crstd = rstd, .rows = n, .c = c, .hw = hw,
                  .groups = groups, .acc = acc};
  td_tpool_t *pool = td__cpu_tpool(be);
  td_tpool_for(pool, (size_t)c, td_tpool_grain((size_t)n * (size_t)hw, 1), groupnorm_dparams_part,
               &j);
  if (dinp != NULL)
    td_tpool_for(pool, (size_t)n * (size_t)groups,
                 td_tpool_grain((size_t)(c / groups) * (size_t)hw, 1), groupnorm_dx_part, &j);
}
