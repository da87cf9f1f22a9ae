/* npy.h: NumPy's .npy format (versions 1 and 2), read strictly.
 *
 * A .npy file is the magic "\x93NUMPY", a major and a minor version byte, a
 * little-endian header length (2 bytes in v1, 4 in v2), a header that is a
 * Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}
 * padded with blanks and ending in a newline, then the raw array. The header
 * parser accepts exactly those three keys, each once, with the values below,
 * and checks that the file holds exactly the bytes the shape declares before
 * the caller allocates anything. The npy:X,Y dataset (td_dataset_load_npy in
 * dataset.h) reads its files through it; the fuzz target feeds it memory. */
#ifndef TD_NPY_H
#define TD_NPY_H

#include <stddef.h>
#include <stdint.h>

#define TD_NPY_MAX_DIMS 8
/* Longest header read: NumPy writes a few hundred bytes at most. */
#define TD_NPY_MAX_HEADER_BYTES 65536u

/* The element types read: little-endian float32 ('<f4'), uint8 ('|u1'),
 * int32 ('<i4') and int64 ('<i8'). */
typedef enum { TD_NPY_F4 = 1, TD_NPY_U1, TD_NPY_I4, TD_NPY_I8 } td_npy_dtype_t;

typedef struct {
  td_npy_dtype_t dtype;
  unsigned elem_bytes;
  int ndim; /* 0 for a scalar */
  uint64_t shape[TD_NPY_MAX_DIMS];
  uint64_t rows;         /* shape[0] (1 for a scalar) */
  uint64_t row_values;   /* product of shape[1..] (1 when ndim <= 1) */
  uint64_t header_bytes; /* where the data starts */
  uint64_t data_bytes;   /* rows * row_values * elem_bytes */
} td_npy_header_t;

/* Parse the header at the start of bytes[0..len) of a file of file_bytes
 * bytes (len may be less than file_bytes: the prefix read so far, which
 * must hold the whole header). Rejects with TD_ECORRUPT + why (one line that
 * names `name`): a bad magic or version, a header that lies about its length
 * or is not the strict dict, fortran_order True, a big-endian or unsupported
 * dtype, more than TD_NPY_MAX_DIMS dimensions, rows beyond
 * TD_DATASET_MAX_ROWS, values per row beyond TD_DATASET_MAX_DIM (products
 * are computed without overflow), and a file whose data is not exactly
 * data_bytes long. */
int td_npy_parse_header(td_npy_header_t *h, const uint8_t *bytes, size_t len, uint64_t file_bytes,
                        const char *name, char *why, size_t why_len);

/* Convert count values of a features array starting at value index `first`
 * from their file bytes (src, count * elem_bytes) into floats: float32 as
 * is (non-finite values refused: TD_ECORRUPT naming the row), uint8 / 255.
 * Integer dtypes are TD_ECORRUPT. */
int td_npy_features(const td_npy_header_t *h, const uint8_t *src, size_t count, uint64_t first,
                    float *dst, const char *name, char *why, size_t why_len);

/* Convert count labels (integer dtypes) starting at row `first` into int32;
 * a label outside [0, TD_DATASET_MAX_CLASSES) is TD_ECORRUPT naming the row.
 * *max_label grows to the largest label seen. */
int td_npy_labels(const td_npy_header_t *h, const uint8_t *src, size_t count, uint64_t first,
                  int32_t *dst, int *max_label, const char *name, char *why, size_t why_len);

#endif
