/* none.c: the identity codec, fp32 little-endian. Also carries the small and
 * 1-D tensors of every other codec. */
#include "compress/codec_impl.h"
#include "common/error.h"

static size_t none_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  (void)s;
  return n * m * 4;
}

static int none_encode(const td_codec_spec_t *s, td_codec_tensor_state_t *st, td_rng_t *rng,
                       const float *in, size_t n, size_t m, uint8_t *out, size_t cap,
                       size_t *len, float *decoded) {
  (void)s;
  (void)st;
  (void)rng;
  size_t bytes = n * m * 4;
  if (bytes > cap)
    return TD_ERANGE;
  memcpy(out, in, bytes);
  if (decoded)
    memcpy(decoded, in, bytes);
  *len = bytes;
  return 0;
}

static int none_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  if (len != n * m * 4)
    return TD_EPROTO;
  memcpy(out, in, len);
  return 0;
}

const td_codec_iface_t td__codec_none = {
    .name = "none", .syntax = "none", .id = TD_CODEC_NONE, .version = 1, .error_feedback = false,
    .bound = none_bound, .encode = none_encode, .decode = none_decode,
};
