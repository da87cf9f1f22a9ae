/* dataset_internal.h: the dataset object as the files that fill it see it:
 * dataset.c (the object, statistics, subsets, shuffling) and the readers,
 * one file a format (dataset_idx.c, dataset_csv.c, dataset_npy.c,
 * dataset_images.c), which dataset_spec.c picks by the `dataset` run key.
 * Everything else sees the opaque td_dataset_t of dataset.h. */
#ifndef TD_DATASET_INTERNAL_H
#define TD_DATASET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "compute/data/dataset.h"

/* Two storages. Floats: x holds rows x dim floats, b is NULL. Bytes (a
 * source of unsigned bytes, such as an IDX ubyte file): b holds rows x dim
 * bytes, x is NULL, and value[v] is the float a byte v stands for: the
 * loader's conversion and every normalisation since, applied to v with the
 * same expressions the float storage applies to each feature, so the floats
 * a batch gathers are bit for bit those the float storage would hold. */
struct td_dataset {
  size_t rows, dim;
  int classes;
  float *x;   /* rows x dim, row-major; NULL while b holds the features */
  uint8_t *b; /* rows x dim, row-major; NULL for float storage */
  float value[256]; /* byte storage: the float each byte value stands for */
  int32_t *y; /* rows */
};

/* Beyond the per-axis limits, a cap on rows x dim: 2^32 floats is 16 GiB. */
#define TD__DATASET_MAX_VALUES ((uint64_t)1 << 32)
/* Bytes converted per read; a multiple of 4 so floats never straddle reads. */
#define TD__IDX_SLAB_BYTES ((size_t)1 << 18)

/* A dataset of rows x dim with its arrays allocated (not filled); NULL when
 * out of memory or when rows x dim overflows. Caller owns it. */
td_dataset_t *td__dataset_new(size_t rows, size_t dim);
/* The same with byte storage (b allocated, not filled; value[v] = v / 255
 * as (float)v / 255.0f, the IDX loader's conversion). */
td_dataset_t *td__dataset_new_bytes(size_t rows, size_t dim);

#endif
