/* fp16.c: IEEE half precision, round to nearest even, values beyond the half
 * range clamped to +-65504 (so a large but finite update never becomes Inf).
 * The conversion loops are compiled for x86-64-v3 (F16C) with a fallback. */
#include "compress/codec_impl.h"
#include "compute/error.h"

static size_t fp16_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  (void)s;
  return n * m * 2;
}

/* Payloads sit at any byte offset in a message, so halves are staged in an
 * aligned block and moved with memcpy. */
#define BLOCK 2048

TD_CODEC_CLONES
static void to_half(const float *restrict in, uint8_t *restrict out, float *restrict back,
                    size_t n) {
  _Float16 h[BLOCK];
  for (size_t base = 0; base < n; base += BLOCK) {
    size_t k = n - base < BLOCK ? n - base : BLOCK;
    for (size_t i = 0; i < k; i++) {
      float v = in[base + i];
      v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
      h[i] = (_Float16)v;
    }
    memcpy(out + 2 * base, h, 2 * k);
    if (back)
      for (size_t i = 0; i < k; i++)
        back[base + i] = (float)h[i];
  }
}

TD_CODEC_CLONES
static void from_half(const uint8_t *restrict in, float *restrict out, size_t n) {
  _Float16 h[BLOCK];
  for (size_t base = 0; base < n; base += BLOCK) {
    size_t k = n - base < BLOCK ? n - base : BLOCK;
    memcpy(h, in + 2 * base, 2 * k);
    for (size_t i = 0; i < k; i++)
      out[base + i] = (float)h[i];
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
  to_half(in, out, decoded, count);
  *len = count * 2;
  return 0;
}

static int fp16_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  if (len != n * m * 2)
    return TD_EPROTO;
  from_half(in, out, n * m);
  return 0;
}

const td_codec_iface_t td__codec_fp16 = {
    .name = "fp16", .version = 1, .error_feedback = false,
    .bound = fp16_bound, .encode = fp16_encode, .decode = fp16_decode,
};
