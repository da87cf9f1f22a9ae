/* powersgd.c: low-rank compression, the sender-side (P, Q) form for
 * decentralized exchange (docs/algorithms.md#powersgd-sender-side).
 *
 * For an n x m tensor M and rank r = min(n, m, RANK): P = orth(M Q) with the
 * link's warm-started Q (seeded Gaussian the first time), then Q = Mᵀ P; the
 * receiver rebuilds P Qᵀ = P Pᵀ M, exact whenever rank(M) <= r. The residual
 * M - P Qᵀ stays on the link. Gram-Schmidt zeroes a column whose norm collapses
 * under projection, so rank-deficient and all-zero input never make NaN.
 * A tensor that would not shrink at least 2x ((n + m) r * 2 >= n m) goes
 * dense. Payload: u8 mode (0 dense fp32, 1 low rank), then for mode 1 u32 r,
 * P (n x r) and Qᵀ (r x m), row-major f32. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "compress/codec_impl.h"
#include "compress/powersgd.h"
#include "common/error.h"

enum { MAX_RANK = 256 };

static unsigned effective_rank(unsigned rank, size_t n, size_t m) {
  size_t r = rank;
  r = r < n ? r : n;
  r = r < m ? r : m;
  return (unsigned)r;
}

static bool worth_it(size_t n, size_t m, unsigned r) { return (n + m) * r * 2 < n * m; }

static size_t powersgd_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  unsigned r = effective_rank(s->rank ? s->rank : MAX_RANK, n, m); /* 0: any rank */
  size_t low = 5 + 4 * (size_t)r * (n + m), dense = 1 + 4 * n * m;
  return low > dense ? low : dense;
}

void td__powersgd_orthogonalize(float *p, size_t n, unsigned r) {
  for (unsigned c = 0; c < r; c++) {
    double before = 0;
    for (size_t i = 0; i < n; i++)
      before += (double)p[i * r + c] * p[i * r + c];
    for (unsigned j = 0; j < c; j++) {
      double dot = 0;
      for (size_t i = 0; i < n; i++)
        dot += (double)p[i * r + j] * p[i * r + c];
      for (size_t i = 0; i < n; i++)
        p[i * r + c] -= (float)dot * p[i * r + j];
    }
    double after = 0;
    for (size_t i = 0; i < n; i++)
      after += (double)p[i * r + c] * p[i * r + c];
    after = sqrt(after);
    if (after < 1e-6 * sqrt(before) || after < 1e-30) {
      for (size_t i = 0; i < n; i++)
        p[i * r + c] = 0.0f;
    } else {
      float inv = (float)(1.0 / after);
      for (size_t i = 0; i < n; i++)
        p[i * r + c] *= inv;
    }
  }
}

void td__powersgd_step(const float *mat, size_t n, size_t m, unsigned r, float *q, float *p,
                       float *approx) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)r, (int)m, 1.0f, mat,
              (int)m, q, (int)r, 0.0f, p, (int)r);
  td__powersgd_orthogonalize(p, n, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)r, (int)n, 1.0f, mat, (int)m,
              p, (int)r, 0.0f, q, (int)r);
  if (approx != NULL)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)r, 1.0f, p, (int)r,
                q, (int)r, 0.0f, approx, (int)m);
}

static int powersgd_encode(const td_codec_spec_t *spec, td_codec_tensor_state_t *st,
                           td_rng_t *rng, const float *in, size_t n, size_t m, uint8_t *out,
                           size_t cap, size_t *len, float *decoded) {
  unsigned r = effective_rank(spec->rank, n, m);
  if (!worth_it(n, m, r)) {
    if (1 + 4 * n * m > cap)
      return TD_ERANGE;
    out[0] = 0;
    memcpy(out + 1, in, 4 * n * m);
    if (decoded) /* residual in place: everything was sent */
      memset(decoded, 0, 4 * n * m);
    *len = 1 + 4 * n * m;
    return 0;
  }
  size_t need = 5 + 4 * (size_t)r * (n + m);
  if (need > cap)
    return TD_ERANGE;
  if (st->q == NULL || st->q_rank != r) { /* first use or new rank: fresh Gaussian Q */
    free(st->q);
    st->q = malloc(m * r * sizeof *st->q);
    if (st->q == NULL)
      return TD_ENOMEM;
    st->q_rank = r;
    for (size_t i = 0; i < m * r; i++)
      st->q[i] = (float)td_rng_normal(rng);
  }
  float *p = td__codec_scratch(st, n * r);
  if (p == NULL)
    return TD_ENOMEM;
  td__powersgd_step(in, n, m, r, st->q, p, NULL);
  if (decoded) /* residual in place: M - P Qᵀ, with decoded == in */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)r, -1.0f, p,
                (int)r, st->q, (int)r, 1.0f, decoded, (int)m);
  out[0] = 1;
  td__put_u32(out + 1, r);
  memcpy(out + 5, p, 4 * n * r);
  uint8_t *qt = out + 5 + 4 * n * r; /* Qᵀ, so the receiver reads rows */
  for (unsigned k = 0; k < r; k++)
    for (size_t j = 0; j < m; j++)
      td__put_f32(qt + 4 * (k * m + j), st->q[j * r + k]);
  *len = need;
  return 0;
}

TD_CODEC_CLONES
static void axpy_row(float *restrict dst, const float *restrict src, float a, size_t m) {
  for (size_t j = 0; j < m; j++)
    dst[j] += a * src[j];
}

static int powersgd_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  if (len < 1)
    return TD_EPROTO;
  if (in[0] == 0) {
    if (len != 1 + 4 * n * m)
      return TD_EPROTO;
    memcpy(out, in + 1, 4 * n * m);
    return 0;
  }
  if (in[0] != 1 || len < 5)
    return TD_EPROTO;
  uint32_t r = td__get_u32(in + 1);
  if (r < 1 || r > MAX_RANK || r > n || r > m || len != 5 + 4 * (size_t)r * (n + m))
    return TD_EPROTO;
  float *p = malloc(4 * n * r), *qt = malloc(4 * (size_t)r * m);
  if (p == NULL || qt == NULL) {
    free(p);
    free(qt);
    return TD_ENOMEM;
  }
  memcpy(p, in + 5, 4 * n * r);
  memcpy(qt, in + 5 + 4 * n * r, 4 * (size_t)r * m);
  memset(out, 0, 4 * n * m);
  for (size_t i = 0; i < n; i++)
    for (uint32_t k = 0; k < r; k++)
      axpy_row(out + i * m, qt + (size_t)k * m, p[i * r + k], m);
  free(p);
  free(qt);
  return 0;
}

/* powersgd:RANK, RANK in [1, MAX_RANK] */
static int powersgd_parse(td_codec_spec_t *out, const char *arg, char *why, size_t why_len) {
  return td__codec_parse_uint("powersgd", "rank", arg, 1, MAX_RANK, &out->rank, why, why_len);
}

static void powersgd_format(const td_codec_spec_t *spec, char *buf, size_t len) {
  snprintf(buf, len, "%u", spec->rank);
}

const td_codec_iface_t td__codec_powersgd = {
    .name = "powersgd", .syntax = "powersgd:RANK", .id = TD_CODEC_POWERSGD, .version = 1,
    .parse = powersgd_parse, .format = powersgd_format, .error_feedback = true, .residual_in_place = true,
    .bound = powersgd_bound, .encode = powersgd_encode, .decode = powersgd_decode,
};
