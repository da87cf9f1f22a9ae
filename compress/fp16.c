/* fp16.c: IEEE half precision, round to nearest even, values beyond the half
 * range clamped to +-65504 (so a large but finite update never becomes Inf).
 * The conversion loops are compiled for x86-64-v3 (F16C) with a fallback. */
#include <math.h>
#include <stdbool.h>

#include "compress/codec_impl.h"
#include "common/error.h"

static size_t fp16_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  (void)s;
  return n * m * 2;
}

/* Payloads sit at any byte offset in a message, so halves are staged in an
 * aligned block and moved with memcpy. */
#define BLOCK 2048

#ifndef __FLT16_MAX__
/* No _Float16 in this compiler (clang 14 on x86): IEEE binary16 by hand,
 * round to nearest even, the same bits _Float16 produces. */
typedef uint16_t half_t;
static half_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x47800000u) /* beyond half range (inputs are clamped first) or NaN */
    return (half_t)(sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (mag < 0x38800000u) { /* subnormal half or zero */
    float a;
    memcpy(&a, &mag, 4);
    uint32_t v = (uint32_t)lrintf(a * 16777216.0f); /* a / 2^-24, ties to even */
    return (half_t)(sign | v);
  }
  uint32_t rounded = mag + 0xfffu + ((mag >> 13) & 1u) - 0x38000000u;
  return (half_t)(sign | (rounded >> 13));
}
static float half_to_float(half_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  uint32_t x = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  memcpy(&f, &x, 4);
  return f;
}
#define TO_HALF(v) float_to_half(v)
#define FROM_HALF(h) half_to_float(h)
#else
typedef _Float16 half_t;
#define TO_HALF(v) ((_Float16)(v))
#define FROM_HALF(h) ((float)(h))
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_F16C_PATH 1
/* Eight conversions per instruction (F16C); used when the CPU has it. */
__attribute__((target("avx2,f16c"))) static void to_half_f16c(const float *restrict in,
                                                               uint8_t *restrict out,
                                                               float *restrict back, size_t n) {
  const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(in + i), lo), hi);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), h);
    if (back)
      _mm256_storeu_ps(back + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; i++) {
    float v = in[i] > 65504.0f ? 65504.0f : in[i] < -65504.0f ? -65504.0f : in[i];
    __m128i h = _mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    uint16_t bits = (uint16_t)_mm_extract_epi16(h, 0);
    memcpy(out + 2 * i, &bits, 2);
    if (back)
      back[i] = _mm_cvtss_f32(_mm_cvtph_ps(h));
  }
}

__attribute__((target("avx2,f16c"))) static void from_half_f16c(const uint8_t *restrict in,
                                                                 float *restrict out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + 2 * i))));
  for (; i < n; i++) {
    uint16_t bits;
    memcpy(&bits, in + 2 * i, 2);
    out[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
  }
}

static bool has_f16c(void) {
  static int cached = -1;
  if (cached < 0)
    cached = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return cached;
}
#endif

TD_CODEC_CLONES
static void to_half(const float *restrict in, uint8_t *restrict out, float *restrict back,
                    size_t n) {
  half_t h[BLOCK];
  for (size_t base = 0; base < n; base += BLOCK) {
    size_t k = n - base < BLOCK ? n - base : BLOCK;
    for (size_t i = 0; i < k; i++) {
      float v = in[base + i];
      v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
      h[i] = TO_HALF(v);
    }
    memcpy(out + 2 * base, h, 2 * k);
    if (back)
      for (size_t i = 0; i < k; i++)
        back[base + i] = FROM_HALF(h[i]);
  }
}

TD_CODEC_CLONES
static void from_half(const uint8_t *restrict in, float *restrict out, size_t n) {
  half_t h[BLOCK];
  for (size_t base = 0; base < n; base += BLOCK) {
    size_t k = n - base < BLOCK ? n - base : BLOCK;
    memcpy(h, in + 2 * base, 2 * k);
    for (size_t i = 0; i < k; i++)
      out[base + i] = FROM_HALF(h[i]);
  }
}

static int fp16_encode(const td_codec_spec_t *s, td_codec_tensor_state_t *st, td_rng_t *rng,
                       const float *in, size_t n, size_t m, uint8_t *out, size_t cap,
                       size_t *len, float *decoded) {
  (void)s;
  (void)st;
  (void)rng;
  size_t count = n * m;
  if (count * 2 > cap)
    return TD_ERANGE;
#ifdef HAVE_F16C_PATH
  if (has_f16c()) {
    to_half_f16c(in, out, decoded, count);
    *len = count * 2;
    return 0;
  }
#endif
  to_half(in, out, decoded, count);
  *len = count * 2;
  return 0;
}

static int fp16_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  if (len != n * m * 2)
    return TD_EPROTO;
#ifdef HAVE_F16C_PATH
  if (has_f16c()) {
    from_half_f16c(in, out, n * m);
    return 0;
  }
#endif
  from_half(in, out, n * m);
  return 0;
}

const td_codec_iface_t td__codec_fp16 = {
    .name = "fp16", .syntax = "fp16", .id = TD_CODEC_FP16, .version = 1, .error_feedback = false,
    .bound = fp16_bound, .encode = fp16_encode, .decode = fp16_decode,
};
