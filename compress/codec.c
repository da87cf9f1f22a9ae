/* codec.c: the codec registry (TD_CODECS plus td__codec_register's), the
 * NAME[:ARG] text of a spec handed to the named codec's own parse and format,
 * message framing, per-link encoders with error feedback, and the message
 * decoder. Nothing here knows a codec's parameters. */
#include "compress/codec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec_impl.h"
#include "common/error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

/* The registry: adding a codec means its file and one X(name) here. */
#define TD_CODECS(X) X(none) X(fp16) X(ternary) X(topk) X(powersgd) X(qsgd)

#define TD_CODEC_DECLARE(name) extern const td_codec_iface_t td__codec_##name;
TD_CODECS(TD_CODEC_DECLARE)
#define TD_CODEC_ENTRY(name) &td__codec_##name,
static const td_codec_iface_t *const builtin[] = {TD_CODECS(TD_CODEC_ENTRY)};
#define BUILTIN_COUNT (sizeof builtin / sizeof builtin[0])

enum { EXTRA_MAX = 8 };
static const td_codec_iface_t *extra[EXTRA_MAX]; /* td__codec_register's */
static size_t extra_count;

/* The i-th codec of builtin followed by extra; NULL past the end. */
static const td_codec_iface_t *codec_at(size_t i) {
  if (i < BUILTIN_COUNT)
    return builtin[i];
  return i - BUILTIN_COUNT < extra_count ? extra[i - BUILTIN_COUNT] : NULL;
}

/* A handful of entries: a scan costs less than one tensor's framing. */
static const td_codec_iface_t *codec_by_id(unsigned id) {
  const td_codec_iface_t *c;
  for (size_t i = 0; (c = codec_at(i)) != NULL; i++)
    if (c->id == id)
      return c;
  return NULL;
}

static const td_codec_iface_t *codec_by_name(const char *name, size_t name_len) {
  const td_codec_iface_t *c;
  for (size_t i = 0; (c = codec_at(i)) != NULL; i++)
    if (strlen(c->name) == name_len && strncmp(c->name, name, name_len) == 0)
      return c;
  return NULL;
}

const td_codec_iface_t *td__codec_find(unsigned id) { return codec_by_id(id); }

int td__codec_register(const td_codec_iface_t *codec) {
  if (extra_count == EXTRA_MAX || codec_by_id(codec->id) != NULL ||
      codec_by_name(codec->name, strlen(codec->name)) != NULL)
    return TD_EINVAL;
  extra[extra_count++] = codec;
  return 0;
}

const char *td_codec_name(unsigned id) {
  const td_codec_iface_t *c = codec_by_id(id);
  return c ? c->name : NULL;
}

int td__codec_parse_real(const char *codec, const char *param, const char *arg, double lo,
                         double hi, double *out, char *why, size_t why_len) {
  if (arg == NULL || *arg == '\0')
    return td_why(why, why_len, TD_ECONFIG, "codec %s needs a %s in (%g, %g], as %s:%g", codec,
                  param, lo, hi, codec, hi / 100);
  char *end;
  errno = 0;
  double v = strtod(arg, &end);
  if (*end != '\0' || errno != 0 || !isfinite(v))
    return td_why(why, why_len, TD_ECONFIG, "codec %s: %s '%s' is not a number in (%g, %g]",
                  codec, param, arg, lo, hi);
  if (!(v > lo && v <= hi))
    return td_why(why, why_len, TD_ECONFIG, "codec %s: %s %s is out of range (%g, %g]", codec,
                  param, arg, lo, hi);
  *out = v;
  return 0;
}

int td__codec_parse_uint(const char *codec, const char *param, const char *arg, unsigned lo,
                         unsigned hi, unsigned *out, char *why, size_t why_len) {
  if (arg == NULL || *arg == '\0')
    return td_why(why, why_len, TD_ECONFIG, "codec %s needs a %s in [%u, %u], as %s:%u", codec,
                  param, lo, hi, codec, lo);
  char *end;
  errno = 0;
  unsigned long v = strtoul(arg, &end, 10);
  if (*arg < '0' || *arg > '9' || *end != '\0' || errno != 0)
    return td_why(why, why_len, TD_ECONFIG, "codec %s: %s '%s' is not a whole number in [%u, %u]",
                  codec, param, arg, lo, hi);
  if (v < lo || v > hi)
    return td_why(why, why_len, TD_ECONFIG, "codec %s: %s %s is out of range [%u, %u]", codec,
                  param, arg, lo, hi);
  *out = (unsigned)v;
  return 0;
}

void td_codec_list(char *buf, size_t len) {
  const td_codec_iface_t *c;
  size_t used = 0;
  if (len > 0)
    buf[0] = '\0';
  for (size_t i = 0; (c = codec_at(i)) != NULL && used < len; i++) {
    int k = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", c->syntax ? c->syntax : c->name);
    if (k < 0)
      break;
    used += (size_t)k;
  }
}

bool td_codec_known(const char *text) {
  const char *colon = strchr(text, ':');
  return codec_by_name(text, colon ? (size_t)(colon - text) : strlen(text)) != NULL;
}

int td_codec_parse(td_codec_spec_t *out, const char *text, char *why, size_t why_len) {
  memset(out, 0, sizeof *out);
  out->clip = TD_CODEC_CLIP_SIGMA;
  const char *colon = strchr(text, ':');
  const td_codec_iface_t *c = codec_by_name(text, colon ? (size_t)(colon - text) : strlen(text));
  if (c == NULL) {
    char known[256];
    td_codec_list(known, sizeof known);
    return td_why(why, why_len, TD_ECONFIG, "unknown codec '%s' (known: %s)", text, known);
  }
  out->id = (td_codec_id_t)c->id;
  const char *arg = colon ? colon + 1 : NULL;
  if (c->parse != NULL)
    return c->parse(out, arg, why, why_len);
  if (arg != NULL)
    return td_why(why, why_len, TD_ECONFIG, "codec %s takes no parameter: write %s, not %s",
                  c->name, c->name, text);
  return 0;
}

void td_codec_format(const td_codec_spec_t *s, char *buf, size_t len) {
  const td_codec_iface_t *c = codec_by_id(s->id);
  char arg[64] = "";
  if (c == NULL) {
    snprintf(buf, len, "codec %u", (unsigned)s->id);
    return;
  }
  if (c->format != NULL)
    c->format(s, arg, sizeof arg);
  snprintf(buf, len, "%s%s%s", c->name, arg[0] ? ":" : "", arg);
}

bool td_codec_uses_error_feedback(const td_codec_spec_t *spec) {
  const td_codec_iface_t *c = codec_by_id(spec->id);
  return c != NULL && c->error_feedback;
}

bool td_codec_slices_feedback(const td_codec_spec_t *spec) {
  const td_codec_iface_t *c = codec_by_id(spec->id);
  return c != NULL && (!c->error_feedback || c->sliceable_feedback);
}

static void matrix_shape(const td_tensor_info_t *t, size_t *n, size_t *m) {
  *n = t->shape[0];
  *m = t->numel / t->shape[0];
}

/* The part of a tensor that a message of the range [offset, offset + count)
 * of the flat buffer carries: its first float (in the buffer), its length,
 * and the n x m matrix the codec sees. A whole tensor keeps its own shape; a
 * part of one is a single row, 1 x numel. */
typedef struct {
  size_t start, numel, n, m;
} piece_t;

/* Whether tensor t holds any float of the range; its piece in *pc if so. */
static bool piece_of(const td_tensor_info_t *t, size_t offset, size_t count, piece_t *pc) {
  size_t end = t->offset + t->numel, range_end = offset + count;
  size_t lo = t->offset > offset ? t->offset : offset, hi = end < range_end ? end : range_end;
  if (lo >= hi)
    return false;
  pc->start = lo;
  pc->numel = hi - lo;
  if (pc->numel == t->numel) {
    matrix_shape(t, &pc->n, &pc->m);
  } else {
    pc->n = 1;
    pc->m = pc->numel;
  }
  return true;
}

/* The codec a piece of tensor t actually travels with: small pieces and
 * 1-D tensors go dense, in fp32 under none and in fp16 under every lossy
 * codec. */
static td_codec_id_t codec_for(const td_codec_spec_t *spec, const td_tensor_info_t *t,
                               const piece_t *pc) {
  if (t->ndim < 2 || pc->numel < TD_CODEC_MIN_NUMEL)
    return spec->id == TD_CODEC_NONE ? TD_CODEC_NONE : TD_CODEC_FP16;
  return spec->id;
}

size_t td_codec_message_bound(const td_layout_t *layout) {
  /* the largest payload any codec can declare for each tensor */
  size_t total = 0;
  for (size_t i = 0; i < td_layout_count(layout); i++) {
    const td_tensor_info_t *t = td_layout_tensor(layout, i);
    size_t n, m, b = 0;
    matrix_shape(t, &n, &m);
    const td_codec_iface_t *c;
    for (size_t k = 0; (c = codec_at(k)) != NULL; k++) {
      td_codec_spec_t any = {.id = (td_codec_id_t)c->id}; /* zero parameters: any spec */
      size_t bytes = c->bound(&any, n, m);
      b = bytes > b ? bytes : b;
    }
    total += TD_CODEC_HEADER_BYTES + b;
  }
  return total;
}

/* ---- per-link encoder ------------------------------------------------------------- */

struct td_link_codec {
  td_codec_spec_t spec;
  const td_layout_t *layout;
  /* numel floats each, allocated by the first encode that needs them: a
   * link of a codec without error feedback never does, so a node with many
   * members holds no model-sized buffer per link (only the message while it
   * is borrowed) */
  float *residual; /* what error feedback has not sent yet; NULL: nothing */
  float *decoded;  /* what the receiver will see, scratch of EF codecs */
  td_codec_tensor_state_t *state; /* one per tensor */
  td_rng_t rng;
  size_t bound;
  uint8_t *msg; /* bound bytes, from an encode until td_link_codec_release_message */
  bool residual_dirty; /* an EF codec left mass in residual */
  float residual_keep;  /* the next encode scales the residual by this first */
};

int td_link_codec_open(td_link_codec_t **out, const td_codec_spec_t *spec,
                       const td_layout_t *layout, uint64_t seed, uint64_t link_id) {
  *out = NULL;
  if (codec_by_id(spec->id) == NULL)
    return TD_EINVAL;
  td_link_codec_t *lc = calloc(1, sizeof *lc);
  if (lc == NULL)
    return TD_ENOMEM;
  size_t numel = td_layout_numel(layout);
  lc->spec = *spec;
  lc->layout = layout;
  lc->residual_keep = 1.0f;
  if (td_codec_uses_error_feedback(spec)) /* the residual is read before the first encode */
    lc->residual = td_params_alloc(numel);
  lc->state = calloc(td_layout_count(layout) + 1, sizeof *lc->state);
  lc->bound = td_codec_message_bound(layout);
  if ((td_codec_uses_error_feedback(spec) && lc->residual == NULL) || lc->state == NULL) {
    td_link_codec_close(&lc);
    return TD_ENOMEM;
  }
  td_rng_seed2(&lc->rng, seed, link_id);
  *out = lc;
  return 0;
}

void td_link_codec_close(td_link_codec_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_link_codec_t *lc = *self_p;
  if (lc->state != NULL)
    for (size_t i = 0; i < td_layout_count(lc->layout); i++) {
      free(lc->state[i].q);
      free(lc->state[i].scratch);
    }
  free(lc->state);
  free(lc->msg);
  td_params_free(&lc->residual);
  td_params_free(&lc->decoded);
  free(lc);
  *self_p = NULL;
}

const float *td_link_codec_residual(const td_link_codec_t *lc) { return lc->residual; }

void td_link_codec_release_message(td_link_codec_t *lc) {
  free(lc->msg);
  lc->msg = NULL;
}

size_t td_link_codec_numel(const td_link_codec_t *lc) { return td_layout_numel(lc->layout); }

int td_link_codec_set_spec(td_link_codec_t *lc, const td_codec_spec_t *spec) {
  if (codec_by_id(spec->id) == NULL)
    return TD_EINVAL;
  if (spec->id != lc->spec.id || spec->rank != lc->spec.rank)
    for (size_t i = 0; i < td_layout_count(lc->layout); i++) { /* warm starts no longer fit */
      free(lc->state[i].q);
      free(lc->state[i].scratch);
      memset(&lc->state[i], 0, sizeof lc->state[i]);
    }
  lc->spec = *spec;
  return 0;
}

size_t td_codec_message_size(const td_codec_spec_t *spec, const td_layout_t *layout) {
  size_t total = 0;
  for (size_t t = 0; t < td_layout_count(layout); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(layout, t);
    piece_t whole = {.start = ti->offset, .numel = ti->numel};
    matrix_shape(ti, &whole.n, &whole.m);
    total += TD_CODEC_HEADER_BYTES +
             codec_by_id(codec_for(spec, ti, &whole))->bound(spec, whole.n, whole.m);
  }
  return total;
}

/* The ladder of docs/algorithms.md#per-link-budgets-codec-auto (no ternary:
 * codec.h says why): dense
 * fp32, fp16, then top-k with the largest density that fits (binary search:
 * the size is monotone in k), never below 0.01 % so every round makes
 * progress. */
void td_codec_fit_budget(const td_layout_t *layout, double budget_bytes, td_codec_spec_t *out) {
  static const td_codec_id_t ladder[] = {TD_CODEC_NONE, TD_CODEC_FP16};
  for (size_t i = 0; i < sizeof ladder / sizeof ladder[0]; i++) {
    *out = (td_codec_spec_t){.id = ladder[i], .clip = TD_CODEC_CLIP_SIGMA};
    if ((double)td_codec_message_size(out, layout) <= budget_bytes)
      return;
  }
  double lo = 1e-4, hi = 0.25;
  *out = (td_codec_spec_t){.id = TD_CODEC_TOPK, .density = lo};
  for (int it = 0; it < 40; it++) {
    td_codec_spec_t mid = {.id = TD_CODEC_TOPK, .density = 0.5 * (lo + hi)};
    if ((double)td_codec_message_size(&mid, layout) <= budget_bytes) {
      lo = mid.density;
      *out = mid;
    } else {
      hi = mid.density;
    }
  }
}
const td_codec_spec_t *td_link_codec_spec(const td_link_codec_t *lc) { return &lc->spec; }

void td_link_codec_decay_residual(td_link_codec_t *lc, float keep) {
  lc->residual_keep = keep >= 0.0f && keep < 1.0f ? keep : 1.0f;
}

/* NaN and Inf are the floats whose exponent bits are all ones; an integer
 * OR-reduction vectorises where a float sum would be a serial chain. */
TD_CODEC_CLONES
static bool all_finite(const float *x, size_t n) {
  const uint32_t *bits = (const uint32_t *)(const void *)x;
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad |= (uint32_t)((bits[i] & 0x7f800000u) == 0x7f800000u);
  return bad == 0;
}

/* acc = a + keep x acc; keep 1 is exact (1 x acc == acc, fused or not). */
TD_CODEC_CLONES
static void add_scaled_into(float *acc, const float *restrict a, float keep, size_t n) {
  for (size_t i = 0; i < n; i++)
    acc[i] = a[i] + keep * acc[i];
}

TD_CODEC_CLONES
static void sub_into(float *out, const float *a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] - b[i];
}

int td_link_codec_encode(td_link_codec_t *lc, const float *delta, const uint8_t **msg,
                         size_t *len) {
  return td_link_codec_encode_range(lc, delta, 0, td_layout_numel(lc->layout), msg, len);
}

int td_link_codec_encode_range(td_link_codec_t *lc, const float *delta, size_t offset,
                               size_t count, const uint8_t **msg, size_t *len) {
  size_t numel = td_layout_numel(lc->layout);
  *msg = NULL;
  *len = 0;
  if (offset > numel || count > numel - offset)
    return TD_EINVAL;
  const td_codec_iface_t *main_codec = codec_by_id(lc->spec.id);
  bool ef = main_codec->error_feedback;
  /* after a switch away from an EF codec, what it held back goes out now */
  bool carry = !ef && lc->residual_dirty;
  /* a slice under error feedback adds into and keeps the residual of its own
   * range (the rest waits for its slice's round); what a codec switch leaves
   * behind covers the whole model and goes out with a whole one only, as does
   * a codec whose state is shaped by whole tensors */
  if ((carry || (ef && !main_codec->sliceable_feedback)) && count != numel)
    return TD_EINVAL;
  if (!main_codec->checks_finite && !all_finite(delta + offset, count))
    return TD_ENUMERIC;
  if ((ef && lc->residual == NULL && (lc->residual = td_params_alloc(numel)) == NULL) ||
      (ef && lc->decoded == NULL && (lc->decoded = td_params_alloc(numel)) == NULL) ||
      (lc->msg == NULL && (lc->msg = malloc(lc->bound)) == NULL))
    return TD_ENOMEM;
  const float *src = delta;
  if (ef || carry) { /* a = delta + residual, built in the residual buffer itself */
    add_scaled_into(lc->residual + offset, delta + offset, lc->residual_keep, count);
    src = lc->residual;
  }
  lc->residual_keep = 1.0f;
  uint8_t *buf = lc->msg;
  size_t used = 0;
  for (size_t t = 0; t < td_layout_count(lc->layout); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lc->layout, t);
    piece_t pc;
    if (!piece_of(ti, offset, count, &pc))
      continue;
    td_codec_id_t id = codec_for(&lc->spec, ti, &pc);
    const td_codec_iface_t *c = id == lc->spec.id ? main_codec : codec_by_id(id);
    size_t plen = 0;
    uint8_t *hdr = buf + used;
    float *dec = NULL;
    if (ef)
      dec = c->residual_in_place ? lc->residual + pc.start : lc->decoded + pc.start;
    int rc = c->encode(&lc->spec, &lc->state[t], &lc->rng, src + pc.start, pc.n, pc.m,
                       hdr + TD_CODEC_HEADER_BYTES, lc->bound - used - TD_CODEC_HEADER_BYTES,
                       &plen, dec);
    if (rc != 0)
      return rc;
    if (c != main_codec && main_codec->checks_finite && !all_finite(src + pc.start, pc.numel))
      return TD_ENUMERIC; /* a dense side tensor the main codec did not scan */
    if (ef && !c->residual_in_place) /* what was not sent stays on the link */
      sub_into(lc->residual + pc.start, lc->residual + pc.start, dec, pc.numel);
    td__put_u32(hdr, (uint32_t)t);
    hdr[4] = (uint8_t)id;
    hdr[5] = c->version;
    hdr[6] = hdr[7] = 0;
    td__put_u32(hdr + 8, (uint32_t)pc.numel);
    td__put_u32(hdr + 12, (uint32_t)plen);
    used += TD_CODEC_HEADER_BYTES + plen;
  }
  if (carry)
    memset(lc->residual, 0, numel * sizeof(float));
  lc->residual_dirty = ef;
  *msg = buf;
  *len = used;
  return 0;
}

/* ---- decoder ---------------------------------------------------------------------- */

int td_codec_decode_message(const td_layout_t *layout, const uint8_t *msg, size_t len,
                            float *out, unsigned *codec_id, char *why, size_t why_len) {
  return td_codec_decode_range(layout, 0, td_layout_numel(layout), msg, len, out, codec_id, why,
                               why_len);
}

/* Zero every float of out that no piece of the range covers: the padding,
 * and what lies outside the range. */
static void zero_outside_pieces(const td_layout_t *layout, size_t offset, size_t count,
                                float *out) {
  size_t prev_end = 0;
  piece_t pc;
  for (size_t t = 0; t < td_layout_count(layout); t++) {
    if (!piece_of(td_layout_tensor(layout, t), offset, count, &pc))
      continue;
    if (pc.start > prev_end)
      memset(out + prev_end, 0, (pc.start - prev_end) * sizeof *out);
    prev_end = pc.start + pc.numel;
  }
  size_t numel = td_layout_numel(layout);
  if (numel > prev_end)
    memset(out + prev_end, 0, (numel - prev_end) * sizeof *out);
}

int td_codec_decode_range(const td_layout_t *layout, size_t offset, size_t count,
                          const uint8_t *msg, size_t len, float *out, unsigned *codec_id,
                          char *why, size_t why_len) {
  size_t numel = td_layout_numel(layout), count_t = td_layout_count(layout);
  if (offset > numel || count > numel - offset)
    return td_why(why, why_len, TD_EINVAL, "range [%zu, +%zu) is outside the model's %zu floats",
                  offset, count, numel);
  /* every piece is written by its decoder; only the floats between them are zeroed */
  zero_outside_pieces(layout, offset, count, out);
  uint8_t seen[256];
  uint8_t *seen_heap = count_t > sizeof seen ? calloc(count_t, 1) : NULL;
  uint8_t *mark = count_t > sizeof seen ? seen_heap : seen;
  if (mark == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (mark == seen)
    memset(seen, 0, sizeof seen);
  size_t pos = 0, biggest = 0;
  unsigned main_codec = TD_CODEC_NONE;
  int rc = 0;
  piece_t pc;
  while (pos < len) {
    if (len - pos < TD_CODEC_HEADER_BYTES) {
      rc = td_why(why, why_len, TD_EPROTO, "truncated tensor header at byte %zu", pos);
      break;
    }
    const uint8_t *h = msg + pos;
    uint32_t tid = td__get_u32(h), pnumel = td__get_u32(h + 8), plen = td__get_u32(h + 12);
    unsigned id = h[4], version = h[5];
    if (tid >= count_t || mark[tid]) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor id %u unknown or repeated", tid);
      break;
    }
    const td_tensor_info_t *ti = td_layout_tensor(layout, tid);
    if (!piece_of(ti, offset, count, &pc)) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor %u lies outside the update's range", tid);
      break;
    }
    if (pnumel != pc.numel) {
      rc = pc.numel == ti->numel
               ? td_why(why, why_len, TD_EPROTO, "tensor %u: %u elements, the model has %zu",
                        tid, pnumel, ti->numel)
               : td_why(why, why_len, TD_EPROTO,
                        "tensor %u: %u elements, the update's range holds %zu of it", tid,
                        pnumel, pc.numel);
      break;
    }
    const td_codec_iface_t *codec = codec_by_id(id);
    if (codec == NULL || version != codec->version) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor %u: codec %u version %u unknown", tid, id,
                  version);
      break;
    }
    td_codec_spec_t any = {.id = (td_codec_id_t)id}; /* zero parameters: any spec */
    if (plen > len - pos - TD_CODEC_HEADER_BYTES || plen > codec->bound(&any, pc.n, pc.m)) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor %u: payload of %u bytes does not fit", tid,
                  plen);
      break;
    }
    if (codec->decode(h + TD_CODEC_HEADER_BYTES, plen, pc.n, pc.m, out + pc.start) != 0) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor %u: malformed %s payload", tid,
                  codec->name);
      break;
    }
    if (!codec->checks_finite && !all_finite(out + pc.start, pc.numel)) {
      rc = td_why(why, why_len, TD_EPROTO, "tensor %u: NaN or Inf in the update", tid);
      break;
    }
    mark[tid] = 1;
    if (pc.numel > biggest) {
      biggest = pc.numel;
      main_codec = id;
    }
    pos += TD_CODEC_HEADER_BYTES + plen;
  }
  for (size_t t = 0; rc == 0 && t < count_t; t++)
    if (!mark[t] && piece_of(td_layout_tensor(layout, t), offset, count, &pc))
      rc = td_why(why, why_len, TD_EPROTO, "tensor %zu is missing from the update", t);
  free(seen_heap);
  if (rc != 0)
    memset(out, 0, numel * sizeof *out);
  else if (codec_id != NULL)
    *codec_id = main_codec;
  return rc;
}
