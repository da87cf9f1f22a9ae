/* dataset_impl.h: what the dataset readers of compute/data/ share beyond
 * dataset.h: making a dataset of a known size and setting its class count.
 * Only readers in this folder include it. */
#ifndef TD_DATASET_IMPL_H
#define TD_DATASET_IMPL_H

#include <stddef.h>

#include "compute/data/dataset.h"

/* A dataset of rows x dim uninitialised features and rows labels; NULL when
 * rows x dim floats cannot be allocated (or overflow). Caller owns it. */
td_dataset_t *td__dataset_new(size_t rows, size_t dim);
void td__dataset_set_classes(td_dataset_t *ds, int classes);

#endif
