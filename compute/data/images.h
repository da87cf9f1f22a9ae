/* images.h: the folder walk behind the images:DIR[,TEST_DIR] dataset
 * (compute/data/images.c). It hands back plain arrays that dataset_images.c
 * wraps into datasets (td_dataset_load_images in dataset.h), so this file
 * needs nothing of the dataset object and dataset_images.c only calls it. */
#ifndef TD_IMAGES_H
#define TD_IMAGES_H

#include <stddef.h>
#include <stdint.h>

#include "compute/data/dataset.h"

/* Rows of decoded images: x is rows x dim floats, y rows labels (both
 * malloc'd; NULL when rows is 0). */
typedef struct {
  float *x;
  int32_t *y;
  size_t rows;
} td__image_rows_t;

/* Walk, probe and decode as td_dataset_load_images describes. On success
 * *dim is the values per image and *classes the number of class folders;
 * the caller owns (frees) train->x/y and test->x/y. On failure nothing is
 * held and why has one line. */
int td__images_load(td__image_rows_t *train, td__image_rows_t *test, size_t *dim, int *classes,
                    const char *dir, const char *test_dir, const td_image_shape_t *shape, char *why,
                    size_t why_len);

#endif
