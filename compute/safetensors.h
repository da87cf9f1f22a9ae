/* safetensors.h: a model's parameters in the safetensors format, written and read.
 *
 * The format (https://huggingface.co/docs/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON (one object: per tensor
 * {"dtype", "shape", "data_offsets": [begin, end)} relative to the data that
 * follows, and an optional "__metadata__" map of strings; padded with spaces
 * to a multiple of 8), then the raw little-endian data. traind writes F32
 * tensors in its layout order (compute/params.h), contiguous, without the
 * layout's alignment padding; shapes are the layout's own (a dense weight
 * [out, in] as PyTorch's nn.Linear, a conv weight [OUT, C, K, K]), so
 * nothing is transposed either way.
 *
 * The reader treats the file as hostile: a regular file of bounded size, a
 * header length inside the file and at most TD_SAFETENSORS_MAX_HEADER, JSON
 * parsed by json-c, every tensor F32 with a shape whose product cannot
 * overflow, offsets inside the data, contiguous, covering it and not
 * overlapping, names unique. Anything else is TD_ECORRUPT with one line. */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "compute/model.h"
#include "compute/params.h"

#define TD_SAFETENSORS_MAX_HEADER (100u << 20) /* the format's own limit: 100 MB */
#define TD_SAFETENSORS_MAX_FILE (16ull << 30)  /* 16 GiB: no model traind builds is larger */
#define TD_SAFETENSORS_MAX_TENSORS 4096

typedef struct {
  const char *key, *value;
} td_safetensors_meta_t;

/* Write the tensors of `layout` from the flat buffer `params` (layout order,
 * padding skipped) to `path`, with the metadata strings. 0, or TD_EIO /
 * TD_ENOMEM with why ("cannot write PATH: ..."). A partial file is removed. */
int td_safetensors_write(const char *path, const td_layout_t *layout, const float *params,
                         const td_safetensors_meta_t *meta, size_t n_meta, char *why,
                         size_t why_len);

typedef struct td_safetensors td_safetensors_t;

/* Parse a whole file held in memory (copied; buf may be freed after). Caller
 * owns *out. TD_ECORRUPT + why for anything the format does not allow. */
int td_safetensors_parse(td_safetensors_t **out, const uint8_t *buf, size_t len, char *why,
                         size_t why_len);
/* Read and parse `path`: a regular file of at most TD_SAFETENSORS_MAX_FILE
 * bytes. TD_ENOENT / TD_EIO / TD_ECORRUPT + why naming the file. */
int td_safetensors_open(td_safetensors_t **out, const char *path, char *why, size_t why_len);
void td_safetensors_close(td_safetensors_t **self_p);

/* The tensors in data order; info's offset counts floats from the data's start.
 * Borrowed; NULL when i is out of range. */
size_t td_safetensors_count(const td_safetensors_t *st);
const td_tensor_info_t *td_safetensors_tensor(const td_safetensors_t *st, size_t i);
/* A metadata value (borrowed), NULL when absent. */
const char *td_safetensors_meta(const td_safetensors_t *st, const char *key);

/* Copy the file's tensors into `params` (a flat buffer of `layout`), checked
 * tensor by tensor in layout order: the first tensor missing from the file
 * or of another shape, or a file tensor the model lacks, is TD_ESHAPE with
 * one line ("tensor fc1.weight has shape [32,784] in LABEL, the model wants
 * [64,784]"). Non-finite values are TD_ENUMERIC. params is untouched on error. */
int td_safetensors_load(const td_safetensors_t *st, const td_layout_t *layout, float *params,
                        const char *label, char *why, size_t why_len);

#define TD_SAFETENSORS_HASH_HEX 65 /* BLAKE2b-256 in hex, and its NUL */

/* The file's BLAKE2b-256 (libsodium's crypto_generichash, 32 bytes) in
 * lowercase hex, of the bytes td_safetensors_open() read. */
const char *td_safetensors_hash(const td_safetensors_t *st);
/* The same hash of the file at path, streamed (nothing parsed): a regular
 * file only. 0, or TD_ENOENT / TD_EIO + why naming the file. */
int td_safetensors_file_hash(const char *path, char hex[TD_SAFETENSORS_HASH_HEX], char *why,
                             size_t why_len);

/* Start model m from the file at path (`init = FILE`): read, its hash
 * compared with want_hash (hex; NULL or "none": not checked), checked against
 * m's layout, copied into its host parameters and pushed to its device. 0, or
 * TD_ECONFIG for another hash, or the reader's or td_safetensors_load()'s
 * error, with a why that names the file. */
int td_model_load_safetensors(td_model_t *m, const char *path, const char *want_hash, char *why,
                              size_t why_len);

#endif
