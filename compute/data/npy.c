/* npy.c: the strict .npy header parser and the element converters (npy.h).
 *
 * The header dict is parsed by a small hand-written scanner, not by any
 * general evaluator: keys and string values in single or double quotes
 * without escapes, True/False, a tuple of decimal integers (a trailing comma
 * allowed, as NumPy writes "(5,)"), commas between entries and an optional
 * one before the closing brace, then only blanks up to the final newline.
 * Anything else is refused. Values are decoded from little-endian bytes one
 * by one, so the result does not depend on the host's byte order and no
 * unaligned access happens. */
#include "compute/data/npy.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#include "common/error.h"
#include "compute/data/dataset.h"

#define TD__NPY_PREFIX_V1 10 /* magic 6 + version 2 + length 2 */
#define TD__NPY_PREFIX_V2 12 /* magic 6 + version 2 + length 4 */

typedef struct {
  const char *p, *end;
} scan_t;

static void skip_blanks(scan_t *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'))
    s->p++;
}

static int take(scan_t *s, char c) {
  skip_blanks(s);
  if (s->p < s->end && *s->p == c) {
    s->p++;
    return 1;
  }
  return 0;
}

/* A quoted string without escapes into out (NUL-terminated); 0 on failure. */
static int take_string(scan_t *s, char *out, size_t out_len) {
  skip_blanks(s);
  if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
    return 0;
  char quote = *s->p++;
  size_t n = 0;
  while (s->p < s->end && *s->p != quote) {
    if (*s->p == '\\' || n + 1 >= out_len || !isprint((unsigned char)*s->p))
      return 0;
    out[n++] = *s->p++;
  }
  if (s->p >= s->end)
    return 0;
  s->p++;
  out[n] = '\0';
  return 1;
}

static int take_word(scan_t *s, const char *word) {
  skip_blanks(s);
  size_t n = strlen(word);
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
    return 0;
  s->p += n;
  return 1;
}

/* A decimal integer of at most 18 digits (so it cannot overflow). */
static int take_uint(scan_t *s, uint64_t *v) {
  skip_blanks(s);
  int digits = 0;
  *v = 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
    if (++digits > 18)
      return 0;
    *v = *v * 10 + (uint64_t)(*s->p++ - '0');
  }
  return digits > 0;
}

static int take_shape(scan_t *s, td_npy_header_t *h) {
  if (!take(s, '('))
    return 0;
  h->ndim = 0;
  if (take(s, ')'))
    return 1;
  for (;;) {
    if (h->ndim == TD_NPY_MAX_DIMS || !take_uint(s, &h->shape[h->ndim]))
      return 0;
    h->ndim++;
    if (take(s, ')'))
      return h->ndim > 1; /* "(5)" is an int in Python, not a tuple */
    if (!take(s, ','))
      return 0;
    if (take(s, ')'))
      return 1;
  }
}

static int set_dtype(td_npy_header_t *h, const char *descr) {
  static const struct {
    const char *descr;
    td_npy_dtype_t dtype;
    unsigned bytes;
  } known[] = {{"<f4", TD_NPY_F4, 4},
               {"|u1", TD_NPY_U1, 1},
               {"<u1", TD_NPY_U1, 1},
               {"<i4", TD_NPY_I4, 4},
               {"<i8", TD_NPY_I8, 8}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(descr, known[i].descr) == 0) {
      h->dtype = known[i].dtype;
      h->elem_bytes = known[i].bytes;
      return 1;
    }
  return 0;
}

/* The dict itself; on failure why says which part is wrong. */
static int parse_dict(td_npy_header_t *h, scan_t *s, const char *name, char *why, size_t why_len) {
  int have_descr = 0, have_order = 0, have_shape = 0;
  char key[32], descr[32];
  if (!take(s, '{'))
    return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header is not a dict", name);
  while (!take(s, '}')) {
    if (!take_string(s, key, sizeof key) || !take(s, ':'))
      return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header: expected a quoted key", name);
    if (strcmp(key, "descr") == 0 && !have_descr) {
      if (!take_string(s, descr, sizeof descr))
        return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header: 'descr' is not a string", name);
      if (!set_dtype(h, descr))
        return td_why(why, why_len, TD_ECORRUPT,
                      "%s: .npy dtype '%s' is not read (accepted: '<f4' float32, '|u1' uint8, "
                      "'<i4' int32, '<i8' int64, all little-endian)",
                      name, descr);
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
      if (take_word(s, "True"))
        return td_why(why, why_len, TD_ECORRUPT,
                      "%s: .npy array is in Fortran order; save it C-ordered "
                      "(numpy.ascontiguousarray)",
                      name);
      if (!take_word(s, "False"))
        return td_why(why, why_len, TD_ECORRUPT,
                      "%s: .npy header: 'fortran_order' is neither True nor False", name);
      have_order = 1;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      if (!take_shape(s, h))
        return td_why(why, why_len, TD_ECORRUPT,
                      "%s: .npy header: 'shape' is not a tuple of at most %d whole numbers", name,
                      TD_NPY_MAX_DIMS);
      have_shape = 1;
    } else {
      return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header: unexpected or repeated key '%s'",
                    name, key);
    }
    if (!take(s, ',')) {
      if (!take(s, '}'))
        return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header: expected ',' or '}' after '%s'",
                      name, key);
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header lacks '%s'", name,
                  !have_descr   ? "descr"
                  : !have_order ? "fortran_order"
                                : "shape");
  skip_blanks(s);
  if (s->p + 1 != s->end || *s->p != '\n')
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: .npy header: text after the dict, or no final newline", name);
  return 0;
}

int td_npy_parse_header(td_npy_header_t *h, const uint8_t *bytes, size_t len, uint64_t file_bytes,
                        const char *name, char *why, size_t why_len) {
  memset(h, 0, sizeof *h);
  if (len > file_bytes)
    len = (size_t)file_bytes;
  if (len < TD__NPY_PREFIX_V1 || memcmp(bytes, "\x93NUMPY", 6) != 0)
    return td_why(why, why_len, TD_ECORRUPT, "%s: not a .npy file (no \\x93NUMPY magic)", name);
  unsigned major = bytes[6];
  uint64_t header_len, prefix;
  if (major == 1) {
    prefix = TD__NPY_PREFIX_V1;
    header_len = (uint64_t)bytes[8] | (uint64_t)bytes[9] << 8;
  } else if (major == 2) {
    if (len < TD__NPY_PREFIX_V2)
      return td_why(why, why_len, TD_ECORRUPT, "%s: truncated .npy header", name);
    prefix = TD__NPY_PREFIX_V2;
    header_len = (uint64_t)bytes[8] | (uint64_t)bytes[9] << 8 | (uint64_t)bytes[10] << 16 |
                 (uint64_t)bytes[11] << 24;
  } else {
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: .npy format version %u.%u is not read (versions 1 and 2 are)", name, major,
                  bytes[7]);
  }
  if (header_len > TD_NPY_MAX_HEADER_BYTES)
    return td_why(why, why_len, TD_ECORRUPT, "%s: .npy header of %llu bytes, over the limit %u",
                  name, (unsigned long long)header_len, TD_NPY_MAX_HEADER_BYTES);
  if (prefix + header_len > len)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: truncated: the .npy header declares %llu bytes, the file holds %llu", name,
                  (unsigned long long)header_len, (unsigned long long)(file_bytes - prefix));
  scan_t s = {(const char *)bytes + prefix, (const char *)bytes + prefix + header_len};
  int rc = parse_dict(h, &s, name, why, why_len);
  if (rc != 0)
    return rc;
  h->header_bytes = prefix + header_len;
  h->rows = h->ndim > 0 ? h->shape[0] : 1;
  h->row_values = 1;
  for (int i = 1; i < h->ndim; i++) {
    /* both factors are at most MAX_DIM (2^20) here, so no overflow */
    if (h->shape[i] > TD_DATASET_MAX_DIM) {
      h->row_values = (uint64_t)TD_DATASET_MAX_DIM + 1;
      break;
    }
    h->row_values *= h->shape[i];
    if (h->row_values > TD_DATASET_MAX_DIM)
      break;
  }
  if (h->rows == 0 || h->row_values == 0)
    return td_why(why, why_len, TD_ECORRUPT, "%s: the .npy array is empty", name);
  if (h->rows > TD_DATASET_MAX_ROWS || h->row_values > TD_DATASET_MAX_DIM)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: .npy shape is beyond the limits (%u rows, %u values per row)", name,
                  TD_DATASET_MAX_ROWS, TD_DATASET_MAX_DIM);
  /* rows < 2^27, row_values <= 2^20, elem_bytes <= 8: below 2^51 */
  h->data_bytes = h->rows * h->row_values * h->elem_bytes;
  uint64_t have = file_bytes - h->header_bytes;
  if (have != h->data_bytes)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: the .npy shape declares %llu bytes of data, the file holds %llu%s", name,
                  (unsigned long long)h->data_bytes, (unsigned long long)have,
                  have < h->data_bytes ? " (truncated)" : "");
  return 0;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

int td_npy_features(const td_npy_header_t *h, const uint8_t *src, size_t count, uint64_t first,
                    float *dst, const char *name, char *why, size_t why_len) {
  if (h->dtype == TD_NPY_U1) {
    for (size_t i = 0; i < count; i++)
      dst[i] = (float)src[i] / 255.0f;
    return 0;
  }
  if (h->dtype != TD_NPY_F4)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: features must be float32 ('<f4') or uint8 ('|u1'), not integers", name);
  for (size_t i = 0; i < count; i++) {
    uint32_t bits = le32(src + 4 * i);
    float v;
    memcpy(&v, &bits, sizeof v);
    if (!isfinite(v))
      return td_why(why, why_len, TD_ECORRUPT, "%s: non-finite value in row %llu", name,
                    (unsigned long long)((first + i) / h->row_values));
    dst[i] = v;
  }
  return 0;
}

int td_npy_labels(const td_npy_header_t *h, const uint8_t *src, size_t count, uint64_t first,
                  int32_t *dst, int *max_label, const char *name, char *why, size_t why_len) {
  if (h->dtype == TD_NPY_F4)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: labels must be integers (int64, int32 or uint8), not float32", name);
  for (size_t i = 0; i < count; i++) {
    int64_t v = h->dtype == TD_NPY_U1   ? (int64_t)src[i]
                : h->dtype == TD_NPY_I4 ? (int64_t)(int32_t)le32(src + 4 * i)
                                        : (int64_t)le64(src + 8 * i);
    if (v < 0 || v >= TD_DATASET_MAX_CLASSES)
      return td_why(why, why_len, TD_ECORRUPT, "%s: label %lld in row %llu is outside [0, %d)",
                    name, (long long)v, (unsigned long long)(first + i), TD_DATASET_MAX_CLASSES);
    dst[i] = (int32_t)v;
    if (dst[i] > *max_label)
      *max_label = dst[i];
  }
  return 0;
}
