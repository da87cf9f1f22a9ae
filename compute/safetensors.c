/* safetensors.c: the safetensors writer and its hostile-input reader
 * (compute/safetensors.h says what the format is and what is checked).
 *
 * The writer hands the layout's tensors, in layout order, to the plain
 * format writer in common/safetensors_write.c (which trainctl model uses
 * too, from a ledger row). The reader loads the
 * file into memory once its size is known to be bounded, parses the header
 * with json-c, checks every tensor and the offsets as a whole, and only then
 * exposes them. json-c keeps the last of two equal keys without a word, so
 * the top-level keys of the header text are also counted by a small scanner
 * (over text json-c has already accepted): a count above json-c's is a
 * duplicate name. Runs on the caller's thread; no global state. */
#include "compute/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/safetensors_write.h"

struct td_safetensors {
  uint8_t *file; /* the whole file */
  const uint8_t *data; /* inside file: the data section */
  size_t data_bytes;
  size_t n;
  td_tensor_info_t *tensors; /* offset: in floats from data */
  size_t n_meta;
  char **meta; /* key, value, key, value, ... */
  char hash[TD_SAFETENSORS_HASH_HEX]; /* of the file's bytes; "" when parsed from memory */
};

/* ---- writing (common/safetensors_write.c) ---------------------------------------- */

static uint32_t get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int td_safetensors_write(const char *path, const td_layout_t *layout, const float *params,
                         const td_safetensors_meta_t *meta, size_t n_meta, char *why,
                         size_t why_len) {
  size_t n = td_layout_count(layout);
  td_st_tensor_t *tensors = calloc(n > 0 ? n : 1, sizeof *tensors);
  td_st_meta_t *m = calloc(n_meta > 0 ? n_meta : 1, sizeof *m);
  if (tensors == NULL || m == NULL) {
    free(tensors);
    free(m);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    const td_tensor_info_t *t = td_layout_tensor(layout, i);
    tensors[i] = (td_st_tensor_t){.name = t->name, .ndim = t->ndim, .offset = t->offset,
                                  .numel = t->numel};
    for (uint32_t d = 0; d < t->ndim; d++)
      tensors[i].shape[d] = t->shape[d];
  }
  for (size_t i = 0; i < n_meta; i++)
    m[i] = (td_st_meta_t){.key = meta[i].key, .value = meta[i].value};
  int rc = td_st_write(path, tensors, n, params, m, n_meta, why, why_len);
  free(tensors);
  free(m);
  return rc;
}

/* ---- reading ---------------------------------------------------------------------------- */

void td_safetensors_close(td_safetensors_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_safetensors_t *st = *self_p;
  for (size_t i = 0; i < 2 * st->n_meta; i++)
    free(st->meta[i]);
  free(st->meta);
  free(st->tensors);
  free(st->file);
  free(st);
  *self_p = NULL;
}

/* Top-level keys in a JSON object text json-c has accepted. */
static size_t count_top_keys(const char *s, size_t len) {
  size_t keys = 0;
  int depth = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < len && s[j] != '"')
        j += s[j] == '\\' ? 2 : 1;
      if (depth == 1) {
        size_t k = j + 1;
        while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r'))
          k++;
        if (k < len && s[k] == ':')
          keys++;
      }
      i = j;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  return keys;
}

__attribute__((format(printf, 3, 4))) static int bad(char *why, size_t why_len,
                                                     const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return td_why(why, why_len, TD_ECORRUPT, "%s", msg);
}

static bool json_uint(json_object *v, uint64_t *out) {
  if (v == NULL || !json_object_is_type(v, json_type_int))
    return false;
  errno = 0;
  int64_t x = json_object_get_int64(v);
  if (x < 0 || errno != 0)
    return false;
  uint64_t u = json_object_get_uint64(v);
  if (errno != 0)
    return false;
  *out = u;
  return true;
}

typedef struct {
  uint64_t begin, end;
  size_t index;
} span_t;

static int by_begin(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_tensor(td_tensor_info_t *t, span_t *sp, const char *name, json_object *o,
                        uint64_t data_bytes, char *why, size_t why_len) {
  if (strlen(name) >= TD_TENSOR_NAME_MAX || name[0] == '\0')
    return bad(why, why_len, "tensor name '%.40s' is empty or longer than 31 bytes", name);
  snprintf(t->name, sizeof t->name, "%s", name);
  if (!json_object_is_type(o, json_type_object))
    return bad(why, why_len, "tensor %s: not an object", name);
  json_object *dtype = NULL, *shape = NULL, *offs = NULL;
  json_object_object_get_ex(o, "dtype", &dtype);
  json_object_object_get_ex(o, "shape", &shape);
  json_object_object_get_ex(o, "data_offsets", &offs);
  if (dtype == NULL || !json_object_is_type(dtype, json_type_string))
    return bad(why, why_len, "tensor %s: no dtype", name);
  if (strcmp(json_object_get_string(dtype), "F32") != 0)
    return bad(why, why_len, "tensor %s: dtype %.16s (traind reads F32 only)", name,
               json_object_get_string(dtype));
  if (shape == NULL || !json_object_is_type(shape, json_type_array))
    return bad(why, why_len, "tensor %s: no shape array", name);
  size_t nd = json_object_array_length(shape);
  if (nd > TD_TENSOR_MAX_DIMS)
    return bad(why, why_len, "tensor %s: more than 4 dimensions", name);
  uint64_t numel = 1;
  t->ndim = (uint32_t)nd;
  for (size_t d = 0; d < nd; d++) {
    uint64_t dim;
    if (!json_uint(json_object_array_get_idx(shape, d), &dim) || dim > UINT32_MAX)
      return bad(why, why_len, "tensor %s: a shape entry is not an integer in 0..2^32-1",
                 name);
    if (dim != 0 && numel > UINT64_MAX / 4 / dim)
      return bad(why, why_len, "tensor %s: the shape's product overflows", name);
    numel *= dim;
    t->shape[d] = (uint32_t)dim;
  }
  if (offs == NULL || !json_object_is_type(offs, json_type_array) ||
      json_object_array_length(offs) != 2 ||
      !json_uint(json_object_array_get_idx(offs, 0), &sp->begin) ||
      !json_uint(json_object_array_get_idx(offs, 1), &sp->end))
    return bad(why, why_len, "tensor %s: data_offsets is not [BEGIN, END]", name);
  if (sp->begin > sp->end || sp->end > data_bytes)
    return bad(why, why_len, "tensor %s: data_offsets lie outside the data", name);
  if (sp->end - sp->begin != numel * 4)
    return bad(why, why_len, "tensor %s: data_offsets do not span its shape's F32 bytes",
               name);
  if (sp->begin % 4 != 0)
    return bad(why, why_len, "tensor %s: data does not start on a 4-byte boundary", name);
  t->numel = (size_t)numel;
  t->offset = (size_t)(sp->begin / 4);
  return 0;
}

static int parse_meta(td_safetensors_t *st, json_object *m, char *why, size_t why_len) {
  if (!json_object_is_type(m, json_type_object))
    return td_why(why, why_len, TD_ECORRUPT, "__metadata__ is not an object");
  size_t n = (size_t)json_object_object_length(m);
  st->meta = calloc(2 * n + 1, sizeof *st->meta);
  if (st->meta == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  json_object_object_foreach(m, key, val) {
    if (!json_object_is_type(val, json_type_string))
      return bad(why, why_len, "__metadata__ value of '%.40s' is not a string", key);
    st->meta[2 * st->n_meta] = strdup(key);
    st->meta[2 * st->n_meta + 1] = strdup(json_object_get_string(val));
    st->n_meta++;
    if (st->meta[2 * st->n_meta - 2] == NULL || st->meta[2 * st->n_meta - 1] == NULL)
      return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  return 0;
}

/* Takes ownership of file (len bytes). */
static int parse_owned(td_safetensors_t **out, uint8_t *file, size_t len, char *why,
                       size_t why_len) {
  *out = NULL;
  td_safetensors_t *st = calloc(1, sizeof *st);
  if (st == NULL) {
    free(file);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  st->file = file;
  json_object *root = NULL;
  span_t *spans = NULL;
  int rc = 0;
  uint64_t n = 0;
  if (len < 8) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%zu bytes: too short for the 8-byte header length",
                len);
    goto fail;
  }
  for (int i = 7; i >= 0; i--)
    n = n << 8 | file[i];
  if (n > TD_SAFETENSORS_MAX_HEADER || n > len - 8 || n < 2) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "header length %" PRIu64 " does not fit the file's %zu bytes (or the format's "
                "100 MB limit)",
                n, len);
    goto fail;
  }
  const char *text = (const char *)file + 8;
  if (text[0] != '{' || memchr(text, '\0', (size_t)n) != NULL) {
    rc = td_why(why, why_len, TD_ECORRUPT, "the header is not a JSON object");
    goto fail;
  }
  json_tokener *tok = json_tokener_new();
  if (tok == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    goto fail;
  }
  root = json_tokener_parse_ex(tok, text, (int)n);
  enum json_tokener_error jerr = json_tokener_get_error(tok);
  size_t used = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  bool trailing_ok = true;
  for (size_t i = used; root != NULL && i < (size_t)n; i++)
    trailing_ok &= text[i] == ' ';
  if (root == NULL || jerr != json_tokener_success || !trailing_ok ||
      !json_object_is_type(root, json_type_object)) {
    rc = td_why(why, why_len, TD_ECORRUPT, "the header is not one JSON object (%s)",
                root == NULL ? json_tokener_error_desc(jerr) : "trailing bytes");
    goto fail;
  }
  size_t keys = (size_t)json_object_object_length(root);
  if (count_top_keys(text, used) != keys) {
    rc = td_why(why, why_len, TD_ECORRUPT, "the header names a tensor twice");
    goto fail;
  }
  st->data = file + 8 + n;
  st->data_bytes = len - 8 - (size_t)n;
  if (keys > TD_SAFETENSORS_MAX_TENSORS + 1) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%zu tensors: more than %d", keys,
                TD_SAFETENSORS_MAX_TENSORS);
    goto fail;
  }
  st->tensors = calloc(keys + 1, sizeof *st->tensors);
  spans = calloc(keys + 1, sizeof *spans);
  if (st->tensors == NULL || spans == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    goto fail;
  }
  json_object_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if ((rc = parse_meta(st, val, why, why_len)) != 0)
        goto fail;
      continue;
    }
    if ((rc = parse_tensor(&st->tensors[st->n], &spans[st->n], key, val, st->data_bytes, why,
                           why_len)) != 0)
      goto fail;
    spans[st->n].index = st->n;
    st->n++;
  }
  /* contiguous from 0 to the end of the data, no overlap, no gap */
  qsort(spans, st->n, sizeof *spans, by_begin);
  uint64_t at = 0;
  for (size_t i = 0; i < st->n; i++) {
    const char *name = st->tensors[spans[i].index].name;
    if (spans[i].begin < at) {
      rc = bad(why, why_len, "tensor %s: data_offsets overlap another tensor's", name);
      goto fail;
    }
    if (spans[i].begin > at) {
      rc = bad(why, why_len, "tensor %s: a gap before its data_offsets (not contiguous)",
               name);
      goto fail;
    }
    at = spans[i].end;
  }
  if (at != st->data_bytes) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "the tensors cover %" PRIu64 " of the %zu data bytes (not contiguous)", at,
                st->data_bytes);
    goto fail;
  }
  /* tensors in data order */
  td_tensor_info_t *sorted = calloc(st->n + 1, sizeof *sorted);
  if (sorted == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    goto fail;
  }
  for (size_t i = 0; i < st->n; i++)
    sorted[i] = st->tensors[spans[i].index];
  free(st->tensors);
  st->tensors = sorted;
  free(spans);
  json_object_put(root);
  *out = st;
  return 0;
fail:
  free(spans);
  json_object_put(root);
  td_safetensors_close(&st);
  return rc;
}

int td_safetensors_parse(td_safetensors_t **out, const uint8_t *buf, size_t len, char *why,
                         size_t why_len) {
  uint8_t *copy = malloc(len > 0 ? len : 1);
  if (copy == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (len > 0)
    memcpy(copy, buf, len);
  return parse_owned(out, copy, len, why, why_len);
}

int td_safetensors_open(td_safetensors_t **out, const char *path, char *why, size_t why_len) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return td_why(why, why_len, errno == ENOENT ? TD_ENOENT : TD_EIO, "cannot read %s: %s", path,
                  strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return td_why(why, why_len, TD_EIO, "%s is not a regular file", path);
  }
  if ((uint64_t)sb.st_size > TD_SAFETENSORS_MAX_FILE) {
    close(fd);
    return td_why(why, why_len, TD_ECORRUPT, "%s: %lld bytes, more than the %llu GiB limit",
                  path, (long long)sb.st_size, TD_SAFETENSORS_MAX_FILE >> 30);
  }
  size_t len = (size_t)sb.st_size;
  uint8_t *file = malloc(len > 0 ? len : 1);
  if (file == NULL) {
    close(fd);
    return td_why(why, why_len, TD_ENOMEM, "%s: out of memory for %zu bytes", path, len);
  }
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, file + got, len - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      close(fd);
      free(file);
      return td_why(why, why_len, TD_EIO, "cannot read %s: %s", path,
                    e ? strerror(e) : "it shrank while read");
    }
    got += (size_t)r;
  }
  close(fd);
  unsigned char digest[32];
  if (sodium_init() < 0 || crypto_generichash(digest, sizeof digest, file, len, NULL, 0) != 0) {
    free(file);
    return td_why(why, why_len, TD_EIO, "%s: cannot hash it (libsodium)", path);
  }
  char inner[256];
  int rc = parse_owned(out, file, len, inner, sizeof inner);
  if (rc != 0)
    td_why(why, why_len, rc, "%s: %s", path, inner);
  else
    sodium_bin2hex((*out)->hash, sizeof (*out)->hash, digest, sizeof digest);
  return rc;
}

const char *td_safetensors_hash(const td_safetensors_t *st) { return st->hash; }

int td_safetensors_file_hash(const char *path, char hex[TD_SAFETENSORS_HASH_HEX], char *why,
                             size_t why_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return td_why(why, why_len, errno == ENOENT ? TD_ENOENT : TD_EIO, "cannot read %s: %s", path,
                  strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return td_why(why, why_len, TD_EIO, "%s is not a regular file", path);
  }
  crypto_generichash_state state;
  unsigned char digest[32], buf[1 << 16];
  if (sodium_init() < 0 || crypto_generichash_init(&state, NULL, 0, sizeof digest) != 0) {
    close(fd);
    return td_why(why, why_len, TD_EIO, "%s: cannot hash it (libsodium)", path);
  }
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      return td_why(why, why_len, TD_EIO, "cannot read %s: %s", path, strerror(e));
    }
    if (r == 0)
      break;
    crypto_generichash_update(&state, buf, (unsigned long long)r);
  }
  close(fd);
  crypto_generichash_final(&state, digest, sizeof digest);
  sodium_bin2hex(hex, TD_SAFETENSORS_HASH_HEX, digest, sizeof digest);
  return 0;
}

size_t td_safetensors_count(const td_safetensors_t *st) { return st->n; }

const td_tensor_info_t *td_safetensors_tensor(const td_safetensors_t *st, size_t i) {
  return i < st->n ? &st->tensors[i] : NULL;
}

const char *td_safetensors_meta(const td_safetensors_t *st, const char *key) {
  for (size_t i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta[2 * i], key) == 0)
      return st->meta[2 * i + 1];
  return NULL;
}

static void shape_text(char *buf, size_t len, const td_tensor_info_t *t) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (uint32_t d = 0; d < t->ndim && at < len; d++)
    at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu32, d ? "," : "", t->shape[d]);
  if (at < len)
    snprintf(buf + at, len - at, "]");
}

static const td_tensor_info_t *find(const td_safetensors_t *st, const char *name) {
  for (size_t i = 0; i < st->n; i++)
    if (strcmp(st->tensors[i].name, name) == 0)
      return &st->tensors[i];
  return NULL;
}

int td_safetensors_load(const td_safetensors_t *st, const td_layout_t *layout, float *params,
                        const char *label, char *why, size_t why_len) {
  size_t count = td_layout_count(layout);
  for (size_t i = 0; i < count; i++) {
    const td_tensor_info_t *want = td_layout_tensor(layout, i);
    const td_tensor_info_t *have = find(st, want->name);
    char a[96], b[96];
    shape_text(b, sizeof b, want);
    if (have == NULL)
      return td_why(why, why_len, TD_ESHAPE, "tensor %s %s is not in %s", want->name, b, label);
    shape_text(a, sizeof a, have);
    if (strcmp(a, b) != 0)
      return td_why(why, why_len, TD_ESHAPE, "tensor %s has shape %s in %s, the model wants %s",
                    want->name, a, label, b);
  }
  for (size_t i = 0; i < st->n; i++) {
    bool known = false;
    for (size_t j = 0; j < count && !known; j++)
      known = strcmp(td_layout_tensor(layout, j)->name, st->tensors[i].name) == 0;
    if (!known)
      return td_why(why, why_len, TD_ESHAPE, "%s has tensor %s, which the model does not have",
                    label, st->tensors[i].name);
  }
  for (size_t i = 0; i < st->n; i++) { /* all finite before anything is written */
    const uint8_t *p = st->data + 4 * st->tensors[i].offset;
    for (size_t j = 0; j < st->tensors[i].numel; j++) {
      uint32_t bits = get_le32(p + 4 * j);
      float v;
      memcpy(&v, &bits, 4);
      if (!isfinite(v))
        return td_why(why, why_len, TD_ENUMERIC, "tensor %s in %s holds a NaN or Inf",
                      st->tensors[i].name, label);
    }
  }
  for (size_t i = 0; i < count; i++) {
    const td_tensor_info_t *want = td_layout_tensor(layout, i);
    const td_tensor_info_t *have = find(st, want->name);
    const uint8_t *p = st->data + 4 * have->offset;
    for (size_t j = 0; j < want->numel; j++) {
      uint32_t bits = get_le32(p + 4 * j);
      memcpy(&params[want->offset + j], &bits, 4);
    }
  }
  return 0;
}

int td_model_load_safetensors(td_model_t *m, const char *path, const char *want_hash, char *why,
                              size_t why_len) {
  td_safetensors_t *st = NULL;
  int rc = td_safetensors_open(&st, path, why, why_len);
  if (rc == 0 && want_hash != NULL && strcmp(want_hash, "none") != 0 &&
      strcmp(want_hash, st->hash) != 0)
    rc = td_why(why, why_len, TD_ECONFIG,
                "%s is not the file the run was started with (BLAKE2b-256 %.16s... here, "
                "%.16s... on the starting node): every member needs the same file",
                path, st->hash, want_hash);
  if (rc == 0)
    rc = td_safetensors_load(st, td_model_layout(m), td_model_host_params(m), path, why,
                             why_len);
  td_safetensors_close(&st);
  if (rc == 0)
    rc = td_model_push(m, why, why_len);
  return rc;
}
