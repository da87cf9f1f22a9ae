/* codec_impl.h: what one codec provides (private to compress/).
 *
 * A codec sees one tensor as an n x m matrix (n = shape[0], m = numel / n) and
 * works on it alone. encode writes the payload and, when `decoded` is not
 * NULL, exactly what the receiver will decode (the link uses it for error
 * feedback) — or, for codecs marked residual_in_place, turns `decoded` (then
 * the same buffer as `in`) into the residual directly. decode validates the
 * payload completely and writes numel floats. parse and format turn the text
 * after "name:" into the spec's fields and back, so codec.c knows no codec's
 * parameters.
 *
 * Adding a codec means one file that defines its td_codec_iface_t and one
 * line in TD_CODECS (codec.c). Its wire id is its own (.id); the built-in ids
 * are listed in codec.h because the daemon names some of them. */
#ifndef TD_CODEC_IMPL_H
#define TD_CODEC_IMPL_H

#include <string.h>

#include "compress/codec.h"
#include "compute/rng.h"

/* Per-link, per-tensor state a codec may keep (PowerSGD's warm-start Q). */
typedef struct {
  float *q;         /* m x r, owned */
  unsigned q_rank;  /* r the buffer was made for */
  float *scratch;   /* codec scratch, owned */
  size_t scratch_floats;
} td_codec_tensor_state_t;

typedef struct {
  const char *name;
  /* how a user writes it, for error messages: "topk:DENSITY" */
  const char *syntax;
  uint8_t id; /* on the wire (the record's codec byte); unique */
  uint8_t version;
  bool error_feedback;
  /* encode returns TD_ENUMERIC by itself on NaN/Inf input, and decode never
   * produces a non-finite value: the framing skips its own scans */
  bool checks_finite;
  /* error feedback in place: encode gets decoded == in (the link's residual
   * holding input + old residual) and leaves there exactly what it did not
   * send, saving a dense decoded buffer and a subtraction pass */
  bool residual_in_place;
  /* error feedback that splits by range: encode keeps no state shaped by
   * the whole tensor, so a slice (fragments) adds into and keeps the residual
   * of its own range alone */
  bool sliceable_feedback;
  /* arg is the text after "name:" (NULL without a colon); fills the codec's
   * fields of out (id and defaults are set already). TD_ECONFIG + a one-line
   * why that names the parameter and its range. NULL: takes no parameter. */
  int (*parse)(td_codec_spec_t *out, const char *arg, char *why, size_t why_len);
  /* the text after "name:" for this spec ("" for none); NULL: never any */
  void (*format)(const td_codec_spec_t *spec, char *buf, size_t len);
  /* upper bound of the payload for an n x m tensor; a spec whose parameter
   * fields are all zero asks for the bound of any spec of this codec */
  size_t (*bound)(const td_codec_spec_t *spec, size_t n, size_t m);
  int (*encode)(const td_codec_spec_t *spec, td_codec_tensor_state_t *st, td_rng_t *rng,
                const float *in, size_t n, size_t m, uint8_t *out, size_t cap, size_t *len,
                float *decoded);
  /* TD_EPROTO on any inconsistency; out gets n * m floats */
  int (*decode)(const uint8_t *in, size_t len, size_t n, size_t m, float *out);
} td_codec_iface_t;

/* Adds a codec beside the built-in ones (TD_CODECS), for tests and codecs
 * kept outside compress/. Call it before any other td_codec_ or
 * td_link_codec_ call, from one thread; codec is borrowed for good.
 * TD_EINVAL when its id or name is taken or the table (8 extra) is full. */
int td__codec_register(const td_codec_iface_t *codec);

/* The codec with this wire id, or NULL. */
const td_codec_iface_t *td__codec_find(unsigned id);

/* Parameter parsers for parse slots. The why they write reads
 * "codec NAME: PARAM VALUE is out of range RANGE", and names the parameter
 * when arg is missing or not a number. A real in (lo, hi]: */
int td__codec_parse_real(const char *codec, const char *param, const char *arg, double lo,
                         double hi, double *out, char *why, size_t why_len);
/* An integer in [lo, hi]: */
int td__codec_parse_uint(const char *codec, const char *param, const char *arg, unsigned lo,
                         unsigned hi, unsigned *out, char *why, size_t why_len);

/* Grow st->scratch to at least n floats; NULL on failure. */
float *td__codec_scratch(td_codec_tensor_state_t *st, size_t n);

static inline void td__put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t td__get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
         ((uint32_t)p[3] << 24);
}
static inline void td__put_f32(uint8_t *p, float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  td__put_u32(p, v);
}
static inline float td__get_f32(const uint8_t *p) {
  uint32_t v = td__get_u32(p);
  float f;
  memcpy(&f, &v, 4);
  return f;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CODEC_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TD_CODEC_CLONES
#endif

#endif
