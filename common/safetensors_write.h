/* safetensors_write.h: the safetensors file format, written from plain
 * tensor descriptions (name, shape, offset into a flat float buffer), with no
 * knowledge of models. compute/safetensors.c writes a model's layout with it;
 * trainctl model (cli/model.c) writes a ledger row's tensors with it, so the
 * two produce the same bytes. The format: an 8-byte little-endian header
 * length N, N bytes of JSON padded with spaces to a multiple of 8
 * ({"__metadata__": {...}, NAME: {"dtype": "F32", "shape", "data_offsets"}}
 * in the order given), then each tensor's floats, little-endian, contiguous. */
#ifndef TD_COMMON_SAFETENSORS_WRITE_H
#define TD_COMMON_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#define TD_ST_MAX_DIMS 8

typedef struct {
  const char *name;
  uint32_t ndim;
  uint64_t shape[TD_ST_MAX_DIMS];
  size_t offset; /* in floats, into the caller's flat buffer */
  size_t numel;  /* the product of shape (1 for a scalar) */
} td_st_tensor_t;

typedef struct {
  const char *key, *value;
} td_st_meta_t;

/* Write the n tensors, their floats read from `data` at each offset, and the
 * metadata strings to `path`. The caller has checked that every offset+numel
 * lies inside data. 0, or TD_EIO / TD_ENOMEM with why ("cannot write PATH:
 * ..."); a partial file is removed. */
int td_st_write(const char *path, const td_st_tensor_t *tensors, size_t n, const float *data,
                const td_st_meta_t *meta, size_t n_meta, char *why, size_t why_len);

#endif
