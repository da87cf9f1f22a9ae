/* qsgd.c: QSGD (Alistarh et al. 2017; docs/algorithms.md#qsgd).
 *
 * Buckets of 512 elements, nu = ||v||_2 per bucket; each element becomes
 * sign(v) * level / s * nu with level = floor(s |v| / nu) + Bernoulli(frac),
 * unbiased. Payload per bucket: f32 nu, then one sign bit and
 * ceil(log2(s + 1)) level bits per element, LSB first, padded to a byte. */
#include <math.h>
#include <stdio.h>

#include "compress/codec_impl.h"
#include "common/error.h"

enum { MAX_LEVELS = 127 }; /* a level and its sign fit in a byte */

#define BUCKET 512

static unsigned level_bits(unsigned s) {
  unsigned b = 0;
  while ((1u << b) < s + 1)
    b++;
  return b;
}

static size_t bucket_bytes(size_t k, unsigned s) { return 4 + (k * (1 + level_bits(s)) + 7) / 8; }

static size_t payload_bytes(size_t count, unsigned s) {
  size_t full = count / BUCKET, rest = count % BUCKET;
  return 1 + full * bucket_bytes(BUCKET, s) + (rest ? bucket_bytes(rest, s) : 0);
}

static size_t qsgd_bound(const td_codec_spec_t *spec, size_t n, size_t m) {
  return payload_bytes(n * m, spec->levels ? spec->levels : MAX_LEVELS); /* 0: any */
}

static void put_bits(uint8_t *buf, size_t *bitpos, unsigned value, unsigned nbits) {
  for (unsigned b = 0; b < nbits; b++, (*bitpos)++)
    if (value & (1u << b))
      buf[*bitpos >> 3] |= (uint8_t)(1u << (*bitpos & 7));
}

static unsigned get_bits(const uint8_t *buf, size_t *bitpos, unsigned nbits) {
  unsigned v = 0;
  for (unsigned b = 0; b < nbits; b++, (*bitpos)++)
    v |= (unsigned)((buf[*bitpos >> 3] >> (*bitpos & 7)) & 1) << b;
  return v;
}

static int qsgd_encode(const td_codec_spec_t *spec, td_codec_tensor_state_t *st, td_rng_t *rng,
                       const float *in, size_t n, size_t m, uint8_t *out, size_t cap,
                       size_t *len, float *decoded) {
  (void)st;
  size_t count = n * m;
  unsigned s = spec->levels, lb = level_bits(s);
  size_t need = payload_bytes(count, s);
  if (need > cap)
    return TD_ERANGE;
  memset(out, 0, need);
  out[0] = (uint8_t)s;
  uint8_t *p = out + 1;
  for (size_t base = 0; base < count; base += BUCKET) {
    size_t k = count - base < BUCKET ? count - base : BUCKET;
    double norm2 = 0;
    for (size_t i = 0; i < k; i++)
      norm2 += (double)in[base + i] * in[base + i];
    float nu = (float)sqrt(norm2);
    td__put_f32(p, nu);
    size_t bit = 0;
    uint8_t *codes = p + 4;
    for (size_t i = 0; i < k; i++) {
      float v = in[base + i];
      unsigned level = 0;
      if (nu > 0) {
        double y = (double)s * fabs(v) / nu;
        double fl = floor(y);
        level = (unsigned)fl + (td_rng_uniform(rng) < y - fl);
        if (level > s)
          level = s;
      }
      put_bits(codes, &bit, v < 0 && level > 0, 1);
      put_bits(codes, &bit, level, lb);
      if (decoded)
        decoded[base + i] = (v < 0 ? -1.0f : 1.0f) * nu * (float)level / (float)s;
    }
    p += bucket_bytes(k, s);
  }
  *len = need;
  return 0;
}

static int qsgd_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  size_t count = n * m;
  if (len < 1)
    return TD_EPROTO;
  unsigned s = in[0];
  if (s < 1 || s > MAX_LEVELS || len != payload_bytes(count, s))
    return TD_EPROTO;
  unsigned lb = level_bits(s);
  const uint8_t *p = in + 1;
  for (size_t base = 0; base < count; base += BUCKET) {
    size_t k = count - base < BUCKET ? count - base : BUCKET;
    float nu = td__get_f32(p);
    if (!isfinite(nu) || nu < 0)
      return TD_EPROTO;
    size_t bit = 0;
    const uint8_t *codes = p + 4;
    for (size_t i = 0; i < k; i++) {
      unsigned neg = get_bits(codes, &bit, 1), level = get_bits(codes, &bit, lb);
      if (level > s || (neg && level == 0))
        return TD_EPROTO;
      out[base + i] = (neg ? -1.0f : 1.0f) * nu * (float)level / (float)s;
    }
    p += bucket_bytes(k, s);
  }
  return 0;
}

/* qsgd:LEVELS, LEVELS in [1, MAX_LEVELS] */
static int qsgd_parse(td_codec_spec_t *out, const char *arg, char *why, size_t why_len) {
  return td__codec_parse_uint("qsgd", "levels", arg, 1, MAX_LEVELS, &out->levels, why, why_len);
}

static void qsgd_format(const td_codec_spec_t *spec, char *buf, size_t len) {
  snprintf(buf, len, "%u", spec->levels);
}

const td_codec_iface_t td__codec_qsgd = {
    .name = "qsgd", .syntax = "qsgd:LEVELS", .id = TD_CODEC_QSGD, .version = 1,
    .parse = qsgd_parse, .format = qsgd_format, .error_feedback = false,
    .bound = qsgd_bound, .encode = qsgd_encode, .decode = qsgd_decode,
};
