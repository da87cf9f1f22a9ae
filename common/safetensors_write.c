/* safetensors_write.c: the safetensors writer (common/safetensors_write.h says
 * the format). The header is built with json-c, whose objects keep insertion
 * order, so the tensors appear in the order given; the floats are streamed
 * through a small buffer as little-endian bytes. Caller's thread, no state. */
#include "common/safetensors_write.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static char *build_header(const td_st_tensor_t *tensors, size_t n, const td_st_meta_t *meta,
                          size_t n_meta, size_t *len_out) {
  json_object *root = json_object_new_object();
  if (root == NULL)
    return NULL;
  if (n_meta > 0) {
    json_object *m = json_object_new_object();
    json_object_object_add(root, "__metadata__", m);
    for (size_t i = 0; i < n_meta; i++)
      json_object_object_add(m, meta[i].key, json_object_new_string(meta[i].value));
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    const td_st_tensor_t *t = &tensors[i];
    json_object *o = json_object_new_object(), *shape = json_object_new_array(),
                *offs = json_object_new_array();
    json_object_object_add(o, "dtype", json_object_new_string("F32"));
    for (uint32_t d = 0; d < t->ndim && d < TD_ST_MAX_DIMS; d++)
      json_object_array_add(shape, json_object_new_int64((int64_t)t->shape[d]));
    json_object_object_add(o, "shape", shape);
    json_object_array_add(offs, json_object_new_int64((int64_t)offset));
    offset += (uint64_t)t->numel * 4;
    json_object_array_add(offs, json_object_new_int64((int64_t)offset));
    json_object_object_add(o, "data_offsets", offs);
    json_object_object_add(root, t->name, o);
  }
  size_t len = 0;
  const char *text = json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN, &len);
  size_t padded = (len + 7) / 8 * 8;
  char *out = text != NULL ? malloc(padded > 0 ? padded : 1) : NULL;
  if (out != NULL) {
    memcpy(out, text, len);
    memset(out + len, ' ', padded - len);
    *len_out = padded;
  }
  json_object_put(root);
  return out;
}

int td_st_write(const char *path, const td_st_tensor_t *tensors, size_t n, const float *data,
                const td_st_meta_t *meta, size_t n_meta, char *why, size_t why_len) {
  size_t header_len = 0;
  char *header = build_header(tensors, n, meta, n_meta, &header_len);
  if (header == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    int e = errno;
    free(header);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(e));
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (uint8_t)((uint64_t)header_len >> (8 * i));
  bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len;
  free(header);
  uint8_t buf[4096];
  for (size_t i = 0; ok && i < n; i++) {
    const td_st_tensor_t *t = &tensors[i];
    for (size_t j = 0; ok && j < t->numel; j += sizeof buf / 4) {
      size_t k = t->numel - j < sizeof buf / 4 ? t->numel - j : sizeof buf / 4;
      for (size_t q = 0; q < k; q++) {
        uint32_t bits;
        memcpy(&bits, &data[t->offset + j + q], 4);
        put_le32(buf + 4 * q, bits);
      }
      ok = fwrite(buf, 4, k, f) == k;
    }
  }
  int e = ok ? 0 : errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    unlink(path);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path,
                  e ? strerror(e) : "short write");
  }
  return 0;
}
