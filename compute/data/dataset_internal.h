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

struct td_dataset {
  size_t rows, dim;
  int classes;
  float *x;   /* rows x dim, row-major */
  int32_t *y; /* rows */
};

/* Beyond the per-axis limits, a cap on rows x dim: 2^32 floats is 16 GiB. */
#define TD__DATASET_MAX_VALUES ((uint64_t)1 << 32)
/* Bytes converted per read; a multiple of 4 so floats never straddle reads. */
#define TD__IDX_SLAB_BYTES ((size_t)1 << 20)

/* A dataset of rows x dim with its arrays allocated (not filled); NULL when
 * out of memory or when rows x dim overflows. Caller owns it. */
td_dataset_t *td__dataset_new(size_t rows, size_t dim);

#endif
