/* topk.c: top-k sparsification with error feedback (docs/algorithms.md#top-k-with-error-feedback).
 *
 * k = max(1, floor(density * numel)) entries of largest magnitude are sent,
 * exactly: a 1% sample bounds the threshold from below, one pass collects the
 * candidates above that bound, and a quickselect among them finds the exact
 * k-th largest (falling back to all entries when the sample misjudged); ties
 * at that value go to the lower indices. Indices are coded whichever way is
 * smallest for this tensor, computed exactly: delta + LEB128 varint gaps, a
 * bitmap, or no indices at all (dense values). Payload: u8 coding (0 varint,
 * 1 bitmap, 2 dense), u32 k, indices, then the k values as f32. What was not
 * sent stays in the link's residual (error feedback). */
#include <math.h>
#include <stdio.h>

#include "compress/codec_impl.h"
#include "common/error.h"

enum { CODING_VARINT = 0, CODING_BITMAP = 1, CODING_DENSE = 2 };

static size_t topk_bound(const td_codec_spec_t *s, size_t n, size_t m) {
  size_t count = n * m, dense = 5 + count * 4;
  if (s->density > 0 && s->density < 1) {
    /* the encoder's smallest coding, bounded: k varint gaps (at most 5 bytes
     * each) or a bitmap, plus k values; or dense. codec=auto sizes by this. */
    size_t k = (size_t)floor(s->density * (double)count);
    k = k ? k : 1;
    size_t varint = 5 + k * 9, bitmap = 5 + (count + 7) / 8 + 4 * k;
    size_t sparse = varint < bitmap ? varint : bitmap;
    return sparse < dense ? sparse : dense;
  }
  /* any density (the receiver's check) */
  size_t varint = 5 + count * 9;
  return varint > dense ? varint : dense;
}

static size_t varint_len(uint32_t v) {
  size_t k = 1;
  while (v >= 0x80) {
    v >>= 7;
    k++;
  }
  return k;
}

/* k-th largest of a[0..n) (1 <= k <= n), reordering a: quickselect with a
 * three-way partition, so runs of equal magnitudes cost nothing extra. */
static float select_kth_largest(float *a, size_t n, size_t k) {
  ptrdiff_t lo = 0, hi = (ptrdiff_t)n - 1, want = (ptrdiff_t)k - 1;
  while (lo < hi) {
    float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
    float pivot = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
    ptrdiff_t lt = lo, i = lo, gt = hi;
    while (i <= gt) {
      float v = a[i];
      if (v > pivot) {
        a[i++] = a[lt];
        a[lt++] = v;
      } else if (v < pivot) {
        a[i] = a[gt];
        a[gt--] = v;
      } else {
        i++;
      }
    }
    /* [lo, lt) > pivot, [lt, gt] == pivot, (gt, hi] < pivot */
    if (want < lt)
      hi = lt - 1;
    else if (want > gt)
      lo = gt + 1;
    else
      return pivot;
  }
  return a[want];
}

TD_CODEC_CLONES
static void magnitudes(const float *restrict in, float *restrict mag, size_t n) {
  for (size_t i = 0; i < n; i++)
    mag[i] = fabsf(in[i]);
}

/* Candidates for the top k: every entry at or above a threshold taken from a
 * strided 1% sample (a lower quantile than k/n, so the true k-th largest is
 * almost always above it). One pass over the data collects them in index
 * order; the exact k-th largest is then selected among the candidates only.
 * When the sample misjudged (fewer than k candidates) the caller falls back to
 * a full selection. Returns the number of candidates. */
TD_CODEC_CLONES
static size_t collect_candidates(const float *restrict in, size_t count, float lo,
                                 uint32_t *restrict idx) {
  size_t c = 0;
  for (size_t i = 0; i < count; i++) {
    idx[c] = (uint32_t)i;
    c += fabsf(in[i]) >= lo;
  }
  return c;
}

static int topk_encode(const td_codec_spec_t *spec, td_codec_tensor_state_t *st, td_rng_t *rng,
                       const float *in, size_t n, size_t m, uint8_t *out, size_t cap,
                       size_t *len, float *decoded) {
  (void)rng;
  size_t count = n * m;
  size_t k = (size_t)floor(spec->density * (double)count);
  if (k < 1)
    k = 1;
  if (k > count)
    k = count;
  /* scratch: count floats of magnitudes, then count + 1 candidate indices */
  float *mag = td__codec_scratch(st, 2 * count + 1);
  if (mag == NULL)
    return TD_ENOMEM;
  uint32_t *idx = (uint32_t *)(void *)(mag + count);
  size_t ncand = 0;
  float thr;
  size_t sample = count / 100;
  if (k < count / 4 && sample >= 1024) {
    for (size_t j = 0; j < sample; j++)
      mag[j] = fabsf(in[(j * count) / sample]);
    size_t ks = (size_t)(1.5 * (double)k * (double)sample / (double)count) + 16;
    float lo = ks < sample ? select_kth_largest(mag, sample, ks) : 0.0f;
    ncand = collect_candidates(in, count, lo, idx);
  }
  if (ncand >= k) {
    for (size_t j = 0; j < ncand; j++)
      mag[j] = fabsf(in[idx[j]]);
    thr = select_kth_largest(mag, ncand, k);
  } else { /* small tensor, dense-ish k, or the sample misjudged: every entry is a candidate */
    magnitudes(in, mag, count);
    thr = select_kth_largest(mag, count, k);
    for (size_t i = 0; i < count; i++)
      idx[i] = (uint32_t)i;
    ncand = count;
  }
  /* the selection, in index order: everything above thr, then ties at thr
   * for the lowest indices until there are k */
  size_t above = 0;
  for (size_t j = 0; j < ncand; j++)
    above += fabsf(in[idx[j]]) > thr;
  size_t ties_left = k - above, taken = 0, prev = 0, varint_bytes = 0;
  for (size_t j = 0; j < ncand && taken < k; j++) {
    uint32_t i = idx[j];
    float a = fabsf(in[i]);
    if (a > thr || (a == thr && ties_left > 0)) {
      if (!(a > thr))
        ties_left--;
      varint_bytes += varint_len((uint32_t)(i - (taken ? prev + 1 : 0)));
      idx[taken++] = i; /* compact the chosen ones in place (taken <= j) */
      prev = i;
    }
  }
  size_t bitmap_bytes = (count + 7) / 8;
  size_t size_varint = 5 + varint_bytes + 4 * k, size_bitmap = 5 + bitmap_bytes + 4 * k;
  size_t size_dense = 5 + 4 * count;
  int coding = CODING_VARINT;
  size_t need = size_varint;
  if (size_bitmap < need) {
    coding = CODING_BITMAP;
    need = size_bitmap;
  }
  if (size_dense <= need) {
    coding = CODING_DENSE;
    need = size_dense;
  }
  if (need > cap)
    return TD_ERANGE;
  out[0] = (uint8_t)coding;
  /* residual in place: decoded holds the input; what is sent becomes zero */
  if (coding == CODING_DENSE) {
    td__put_u32(out + 1, (uint32_t)count);
    memcpy(out + 5, in, 4 * count);
    if (decoded)
      memset(decoded, 0, 4 * count);
    *len = need;
    return 0;
  }
  td__put_u32(out + 1, (uint32_t)k);
  uint8_t *ip = out + 5;
  uint8_t *vals = out + 5 + (coding == CODING_VARINT ? varint_bytes : bitmap_bytes);
  if (coding == CODING_BITMAP)
    memset(ip, 0, bitmap_bytes);
  for (size_t j = 0; j < k; j++) {
    uint32_t i = idx[j];
    if (coding == CODING_VARINT) {
      uint32_t gap = i - (j ? idx[j - 1] + 1 : 0);
      while (gap >= 0x80) {
        *ip++ = (uint8_t)(gap | 0x80);
        gap >>= 7;
      }
      *ip++ = (uint8_t)gap;
    } else {
      ip[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    td__put_f32(vals + 4 * j, in[i]);
    if (decoded)
      decoded[i] = 0.0f;
  }
  *len = need;
  return 0;
}

static int topk_decode(const uint8_t *in, size_t len, size_t n, size_t m, float *out) {
  size_t count = n * m;
  if (len < 5)
    return TD_EPROTO;
  unsigned coding = in[0];
  size_t k = td__get_u32(in + 1);
  if (k == 0 || k > count)
    return TD_EPROTO;
  memset(out, 0, count * sizeof *out);
  if (coding == CODING_DENSE) {
    if (k != count || len != 5 + 4 * count)
      return TD_EPROTO;
    memcpy(out, in + 5, 4 * count);
    return 0;
  }
  if (coding == CODING_BITMAP) {
    size_t bitmap_bytes = (count + 7) / 8;
    if (len != 5 + bitmap_bytes + 4 * k)
      return TD_EPROTO;
    const uint8_t *bits = in + 5, *vals = in + 5 + bitmap_bytes;
    size_t j = 0;
    for (size_t i = 0; i < count; i++)
      if (bits[i >> 3] & (1u << (i & 7))) {
        if (j == k)
          return TD_EPROTO;
        out[i] = td__get_f32(vals + 4 * j++);
      }
    if (j != k || ((count & 7) && (bits[bitmap_bytes - 1] >> (count & 7))))
      return TD_EPROTO;
    return 0;
  }
  if (coding != CODING_VARINT || len < 5 + 4 * k)
    return TD_EPROTO;
  const uint8_t *p = in + 5, *end = in + len - 4 * k;
  size_t next = 0; /* smallest index the next entry may take */
  for (size_t j = 0; j < k; j++) {
    uint64_t gap = 0;
    for (int shift = 0;; shift += 7) {
      if (p >= end || shift > 28)
        return TD_EPROTO;
      uint8_t b = *p++;
      gap |= (uint64_t)(b & 0x7f) << shift;
      if (!(b & 0x80))
        break;
    }
    uint64_t i = next + gap;
    if (i >= count)
      return TD_EPROTO;
    out[i] = td__get_f32(end + 4 * j);
    next = (size_t)i + 1;
  }
  return p == end ? 0 : TD_EPROTO;
}

/* topk:DENSITY, the fraction of entries sent, in (0, 1] */
static int topk_parse(td_codec_spec_t *out, const char *arg, char *why, size_t why_len) {
  return td__codec_parse_real("topk", "density", arg, 0, 1, &out->density, why, why_len);
}

static void topk_format(const td_codec_spec_t *spec, char *buf, size_t len) {
  snprintf(buf, len, "%g", spec->density);
}

const td_codec_iface_t td__codec_topk = {
    .name = "topk", .syntax = "topk:DENSITY", .id = TD_CODEC_TOPK, .version = 1,
    .parse = topk_parse, .format = topk_format, .error_feedback = true, .residual_in_place = true,
    .sliceable_feedback = true,
    .bound = topk_bound, .encode = topk_encode, .decode = topk_decode,
};
