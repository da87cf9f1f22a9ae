/* ternary.c: TernGrad (Wen et al. 2017; docs/algorithms.md#ternary-terngrad).
 *
 * s = min(c * sigma, max|g|) (max|g| when c * sigma is 0), g clipped to [-s, s],
 * each element sent as s * sign(g) with probability |g| / s and 0 otherwise,
 * so E[decoded] = clipped g. Payload: f32 s, u8 form (0: 2-bit, 1: base 3),
 * then 2 bits per element
 * (00 = 0, 01 = +1, 10 = -1, 11 invalid; LSB first) or, with :base3, 5 trits
 * per byte (sum of d_i * 3^i, d in {0: 0, 1: +1, 2: -1}). The random draws
 * come from 16 independent xorshift32 lanes seeded by the link's generator, so
 * the hot loop vectorises. */
#include <math.h>
#include <stdio.h>

#include "compress/codec_impl.h"
#include "common/error.h"

#define LANES 16

static size_t packed_bytes(bool base3, size_t count) {
  return base3 ? (count + 4) / 5 : (count + 3) / 4;
}

static size_t ternary_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  (void)s;
  return 5 + packed_bytes(false, n * m); /* the 2-bit form is the larger */
}

typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));

typedef uint32_t u32x4 __attribute__((vector_size(16)));

/* One step of 16 draws: advance every lane's xorshift32, clip |g| at s, send
 * with probability |g| / s (24 random bits), and return the 16 trit codes
 * (0, 1 = +1, 2 = -1). GCC vector types: one register per operand on
 * AVX-512. */
static inline __attribute__((always_inline)) u8x16 draw_step(u32x16 *x, const float *g,
                                                             const f32x16 *sv, float inv_s) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  f32x16 v;
  memcpy(&v, g, sizeof v);
  f32x16 a = (f32x16)((i32x16)v & 0x7fffffff); /* |v| */
  i32x16 over = a > *sv;                        /* clip at s */
  a = (f32x16)(((i32x16)a & ~over) | ((i32x16)*sv & over));
  f32x16 u = __builtin_convertvector(*x >> 8, f32x16) * (1.0f / 16777216.0f);
  i32x16 send = -(u < a * inv_s); /* 1 or 0 */
  i32x16 neg = -(v < (f32x16){0}); /* 1 or 0 */
  return __builtin_convertvector(send * (1 + neg), u8x16);
}

/* Codes for k elements (k a multiple of LANES; the caller pads), one byte each. */
TD_CODEC_CLONES
static void draw_block(const float *restrict g, size_t k, float s, float inv_s,
                       uint32_t *restrict lanes, uint8_t *restrict code) {
  u32x16 x;
  memcpy(&x, lanes, sizeof x);
  const f32x16 sv = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
  for (size_t base = 0; base < k; base += LANES) {
    u8x16 c = draw_step(&x, g + base, &sv, inv_s);
    memcpy(code + base, &c, sizeof c);
  }
  memcpy(lanes, &x, sizeof x);
}

/* The same draws packed straight into 2-bit codes: the 16 codes of a step,
 * read as four little-endian u32 words of four byte-sized codes, fold into
 * four bytes with two shift-or steps. */
TD_CODEC_CLONES
static void draw_packed(const float *restrict g, size_t k, float s, float inv_s,
                        uint32_t *restrict lanes, uint8_t *restrict packed) {
  u32x16 x;
  memcpy(&x, lanes, sizeof x);
  const f32x16 sv = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
  for (size_t base = 0; base < k; base += LANES) {
    u8x16 c = draw_step(&x, g + base, &sv, inv_s);
    u32x4 w;
    memcpy(&w, &c, sizeof w);
    w |= w >> 6;
    w |= w >> 12;
    uint8_t out4[4] = {(uint8_t)w[0], (uint8_t)w[1], (uint8_t)w[2], (uint8_t)w[3]};
    memcpy(packed + base / 4, out4, 4);
  }
  memcpy(lanes, &x, sizeof x);
}

/* sum, sum of squares and max |x|: 16 float lanes (GCC vector types, one
 * register on AVX-512) over blocks of 4096 elements (at most 256 additions per
 * lane, so fp32 is exact enough), each block's sums added into fp64 totals. */
TD_CODEC_CLONES
static void tensor_stats(const float *restrict x, size_t n, double *sum, double *sum2,
                         double *maxabs) {
  double total = 0, total2 = 0;
  f32x16 mx = {0};
  size_t i = 0;
  while (i + 16 <= n) {
    f32x16 sv = {0}, qv = {0};
    size_t end = i + 4096 < n ? i + 4096 : n - (n - i) % 16;
    for (; i < end; i += 16) {
      f32x16 v;
      memcpy(&v, x + i, sizeof v);
      sv += v;
      qv += v * v;
      f32x16 a = (f32x16)((i32x16)v & 0x7fffffff);
      i32x16 bigger = a > mx;
      mx = (f32x16)(((i32x16)a & bigger) | ((i32x16)mx & ~bigger));
    }
    for (int j = 0; j < 16; j++) {
      total += sv[j];
      total2 += qv[j];
    }
  }
  float m = 0;
  for (int j = 0; j < 16; j++)
    m = mx[j] > m ? mx[j] : m;
  /* NaN never wins a comparison: count it in the sums instead, which it poisons */
  for (; i < n; i++) {
    total += x[i];
    total2 += (double)x[i] * x[i];
    m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
  }
  *sum = total;
  *sum2 = total2;
  *maxabs = m;
}

/* four 2-bit codes per byte, LSB first */
TD_CODEC_CLONES
static void pack2(const uint8_t *restrict code, uint8_t *restrict out, size_t k) {
  for (size_t i = 0; i < k / 4; i++)
    out[i] = (uint8_t)(code[4 * i] | code[4 * i + 1] << 2 | code[4 * i + 2] << 4 |
                       code[4 * i + 3] << 6);
}

static int ternary_encode(const td_codec_spec_t *spec, td_codec_tensor_state_t *st,
                          td_rng_t *rng, const float *in, size_t n, size_t m, uint8_t *out,
                          size_t cap, size_t *len, float *decoded) {
  (void)st;
  size_t count = n * m;
  size_t need = 5 + packed_bytes(spec->base3, count);
  if (need > cap)
    return TD_ERANGE;
  double sum = 0, sum2 = 0, maxabs = 0;
  tensor_stats(in, count, &sum, &sum2, &maxabs);
  if (!isfinite(sum2) || !isfinite(maxabs)) /* a NaN or Inf anywhere shows here */
    return TD_ENUMERIC;
  double mean = count ? sum / (double)count : 0;
  double var = count ? sum2 / (double)count - mean * mean : 0;
  double cs = spec->clip * sqrt(var > 0 ? var : 0);
  float s = (float)(cs > 0 ? (cs < maxabs ? cs : maxabs) : maxabs);
  td__put_f32(out, s);
  out[4] = spec->base3 ? 1 : 0;
  uint8_t *packed = out + 5;
  memset(packed, 0, need - 5);
  if (s > 0) {
    uint32_t lanes[LANES];
    for (int j = 0; j < LANES; j++) {
      lanes[j] = (uint32_t)td_rng_next(rng);
      if (lanes[j] == 0)
        lanes[j] = 0x9e3779b9u;
    }
    uint8_t code[256];
    float tail[256];
    float inv_s = 1.0f / s;
    size_t fast = 0;
    if (!spec->base3 && decoded == NULL) { /* the common case: one fused pass */
      fast = count / LANES * LANES;
      draw_packed(in, fast, s, inv_s, lanes, packed);
    }
    for (size_t base = fast; base < count; base += 240) { /* multiple of 4, 5 and 16 */
      size_t k = count - base < 240 ? count - base : 240;
      if (k == 240) {
        draw_block(in + base, 240, s, inv_s, lanes, code);
      } else { /* pad the last block with zeros (never sent) */
        size_t padded = (k + LANES - 1) / LANES * LANES;
        memcpy(tail, in + base, k * sizeof *tail);
        memset(tail + k, 0, (padded - k) * sizeof *tail);
        draw_block(tail, padded, s, inv_s, lanes, code);
      }
      if (spec->base3) {
        for (size_t i = 0; i < k; i += 5) {
          unsigned b = 0, mul = 1;
          for (size_t t = 0; t < 5 && i + t < k; t++, mul *= 3)
            b += code[i + t] * mul;
          packed[(base + i) / 5] = (uint8_t)b;
        }
      } else if (k % 4 == 0) { /* base is a multiple of 240, so of 4 */
        pack2(code, packed + base / 4, k);
      } else {
        for (size_t i = 0; i < k; i++)
          packed[(base + i) >> 2] |= (uint8_t)(code[i] << (2 * ((base + i) & 3)));
      }
      if (decoded)
        for (size_t i = 0; i < k; i++)
          decoded[base + i] = code[i] == 0 ? 0.0f : code[i] == 1 ? s : -s;
    }
  } else if (decoded) {
    memset(decoded, 0, count * sizeof *decoded);
  }
  *len = need;
  return 0;
}

/* four codes per byte; code 3 is invalid. Returns -1 if any is. A 256-entry
 * table maps each byte to its four floats, so a byte costs one 16-byte copy. */
static int unpack2(const uint8_t *restrict p, size_t count, const float value[3],
                   float *restrict out) {
  float table[256][4];
  uint8_t invalid_byte[256];
  const float lut[4] = {value[0], value[1], value[2], 0.0f};
  for (unsigned b = 0; b < 256; b++) {
    invalid_byte[b] = 0;
    for (unsigned t = 0; t < 4; t++) {
      unsigned c = (b >> (2 * t)) & 3;
      table[b][t] = lut[c];
      invalid_byte[b] |= c == 3;
    }
  }
  unsigned invalid = 0;
  size_t full = count / 4;
  for (size_t b = 0; b < full; b++) {
    invalid |= invalid_byte[p[b]];
    memcpy(out + 4 * b, table[p[b]], sizeof table[0]);
  }
  for (size_t i = full * 4; i < count; i++) {
    unsigned c = (p[i >> 2] >> (2 * (i & 3))) & 3;
    invalid |= c == 3;
    out[i] = lut[c];
  }
  return invalid ? -1 : 0;
}

static int ternary_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  size_t count = n * m;
  if (len < 5 || in[4] > 1)
    return TD_EPROTO;
  bool base3 = in[4] == 1;
  if (len != 5 + packed_bytes(base3, count))
    return TD_EPROTO;
  float s = td__get_f32(in);
  if (!isfinite(s) || s < 0)
    return TD_EPROTO;
  const float value[3] = {0.0f, s, -s};
  const uint8_t *p = in + 5;
  if (base3) {
    for (size_t i = 0; i < count; i += 5) {
      unsigned b = p[i / 5];
      size_t k = count - i < 5 ? count - i : 5;
      static const unsigned pow3[6] = {1, 3, 9, 27, 81, 243};
      if (b >= pow3[k]) /* 243+ is invalid; unused trits must be zero */
        return TD_EPROTO;
      for (size_t t = 0; t < k; t++, b /= 3)
        out[i + t] = value[b % 3];
    }
    return 0;
  }
  if (unpack2(p, count, value, out) != 0)
    return TD_EPROTO;
  if (count & 3) /* unused bit pairs of the last byte must be zero */
    if (p[count >> 2] >> (2 * (count & 3)))
      return TD_EPROTO;
  return 0;
}

/* ternary | ternary:base3 */
static int ternary_parse(td_codec_spec_t *out, const char *arg, char *why, size_t why_len) {
  if (arg == NULL)
    return 0;
  if (strcmp(arg, "base3") == 0) {
    out->base3 = true;
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG,
                "codec ternary: packing '%s' is not one of (base3), as ternary:base3 or ternary",
                arg);
}

static void ternary_format(const td_codec_spec_t *spec, char *buf, size_t len) {
  snprintf(buf, len, "%s", spec->base3 ? "base3" : "");
}

const td_codec_iface_t td__codec_ternary = {
    .name = "ternary", .syntax = "ternary[:base3]", .id = TD_CODEC_TERNARY, .version = 1,
    .error_feedback = false, .checks_finite = true,
    .parse = ternary_parse, .format = ternary_format,
    .bound = ternary_bound, .encode = ternary_encode, .decode = ternary_decode,
};
