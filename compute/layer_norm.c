/* layer_norm.c: CPU kernels of the batch-independent normalizations,
 * LayerNorm over the columns of a row and GroupNorm over (channels of a
 * group x plane) of one image, with eps = 1e-5 and the biased variance.
 * Forward keeps mean and 1/std for backward; statistics are summed in double.
 * Runs on the model's thread; nothing here allocates. */
#include <math.h>
#include <string.h>

#include "compute/backend_impl.h"

#define TD__NORM_EPS 1e-5

/* Mean and rstd of n floats. */
static void stats(const float *x, size_t n, float *mean, float *rstd) {
  double s = 0.0, ss = 0.0;
  for (size_t i = 0; i < n; i++)
    s += x[i];
  double mu = s / (double)n;
  for (size_t i = 0; i < n; i++) {
    double d = x[i] - mu;
    ss += d * d;
  }
  *mean = (float)mu;
  *rstd = (float)(1.0 / sqrt(ss / (double)n + TD__NORM_EPS));
}

void td__cpu_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias,
                               int rows, int cols) {
  (void)be;
  for (int r = 0; r < rows; r++) {
    const float *restrict x = inp + (size_t)r * (size_t)cols;
    float *restrict y = out + (size_t)r * (size_t)cols;
    float mu, rs;
    stats(x, (size_t)cols, &mu, &rs);
    mean[r] = mu;
    rstd[r] = rs;
    for (int c = 0; c < cols; c++)
      y[c] = (x[c] - mu) * rs * weight[c] + bias[c];
  }
}

void td__cpu_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int rows, int cols,
                                bool acc) {
  (void)be;
  memset(dweight, 0, (size_t)cols * sizeof *dweight);
  memset(dbias, 0, (size_t)cols * sizeof *dbias);
  for (int r = 0; r < rows; r++) {
    const float *restrict x = inp + (size_t)r * (size_t)cols;
    const float *restrict dy = dout + (size_t)r * (size_t)cols;
    float *restrict dx = dinp + (size_t)r * (size_t)cols;
    float mu = mean[r], rs = rstd[r];
    double m1 = 0.0, m2 = 0.0;
    for (int c = 0; c < cols; c++) {
      float xh = (x[c] - mu) * rs;
      float dxh = dy[c] * weight[c];
      m1 += dxh;
      m2 += dxh * xh;
      dweight[c] += dy[c] * xh;
      dbias[c] += dy[c];
    }
    float a = (float)(m1 / cols), b = (float)(m2 / cols);
    for (int c = 0; c < cols; c++) {
      float xh = (x[c] - mu) * rs;
      float v = (dy[c] * weight[c] - a - xh * b) * rs;
      dx[c] = acc ? dx[c] + v : v;
    }
  }
}

void td__cpu_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int n,
                               int c, int hw, int groups) {
  (void)be;
  int cg = c / groups;
  size_t gsize = (size_t)cg * (size_t)hw;
  for (int b = 0; b < n; b++)
    for (int g = 0; g < groups; g++) {
      size_t off = ((size_t)b * (size_t)groups + (size_t)g) * gsize;
      float mu, rs;
      stats(inp + off, gsize, &mu, &rs);
      mean[b * groups + g] = mu;
      rstd[b * groups + g] = rs;
      for (int ci = 0; ci < cg; ci++) {
        int ch = g * cg + ci;
        float sc = rs * weight[ch], sh = bias[ch] - mu * rs * weight[ch];
        const float *restrict x = inp + off + (size_t)ci * (size_t)hw;
        float *restrict y = out + off + (size_t)ci * (size_t)hw;
        for (int i = 0; i < hw; i++)
          y[i] = x[i] * sc + sh;
      }
    }
}

void td__cpu_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int n, int c, int hw,
                                int groups, bool acc) {
  (void)be;
  int cg = c / groups;
  size_t gsize = (size_t)cg * (size_t)hw;
  memset(dweight, 0, (size_t)c * sizeof *dweight);
  memset(dbias, 0, (size_t)c * sizeof *dbias);
  for (int b = 0; b < n; b++)
    for (int g = 0; g < groups; g++) {
      size_t off = ((size_t)b * (size_t)groups + (size_t)g) * gsize;
      float mu = mean[b * groups + g], rs = rstd[b * groups + g];
      double m1 = 0.0, m2 = 0.0;
      for (int ci = 0; ci < cg; ci++) {
        int ch = g * cg + ci;
        const float *restrict x = inp + off + (size_t)ci * (size_t)hw;
        const float *restrict dy = dout + off + (size_t)ci * (size_t)hw;
        float sw = 0.0f, sb = 0.0f, s1 = 0.0f, s2 = 0.0f;
        for (int i = 0; i < hw; i++) {
          float xh = (x[i] - mu) * rs;
          sw += dy[i] * xh;
          sb += dy[i];
          s1 += dy[i];
          s2 += dy[i] * xh;
        }
        dweight[ch] += sw;
        dbias[ch] += sb;
        m1 += (double)s1 * weight[ch];
        m2 += (double)s2 * weight[ch];
      }
      float a = (float)(m1 / (double)gsize), bb = (float)(m2 / (double)gsize);
      for (int ci = 0; ci < cg; ci++) {
        int ch = g * cg + ci;
        const float *restrict x = inp + off + (size_t)ci * (size_t)hw;
        const float *restrict dy = dout + off + (size_t)ci * (size_t)hw;
        float *restrict dx = dinp + off + (size_t)ci * (size_t)hw;
        for (int i = 0; i < hw; i++) {
          float xh = (x[i] - mu) * rs;
          float v = (dy[i] * weight[ch] - a - xh * bb) * rs;
          dx[i] = acc ? dx[i] + v : v;
        }
      }
    }
}
