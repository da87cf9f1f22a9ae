/* dataset_images.c: an images:DIR[,TEST_DIR] dataset: the folder walk
 * (compute/data/images.c) hands back plain arrays, and this file wraps them
 * into a training and a test set. */
#include "compute/data/dataset_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/data/images.h"

/* A dataset that takes over rows (NULL when it has none). */
static td_dataset_t *dataset_adopt(td__image_rows_t *rows, size_t dim, int classes) {
  if (rows->rows == 0)
    return NULL;
  td_dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL)
    return NULL;
  ds->rows = rows->rows;
  ds->dim = dim;
  ds->classes = classes;
  ds->x = rows->x;
  ds->y = rows->y;
  memset(rows, 0, sizeof *rows);
  return ds;
}

int td_dataset_load_images(td_dataset_t **train, td_dataset_t **test, const char *dir,
                           const char *test_dir, const td_image_shape_t *shape, char *why,
                           size_t why_len) {
  if (train == NULL || test == NULL)
    return TD_EINVAL;
  *train = *test = NULL;
  td__image_rows_t train_rows, test_rows;
  size_t dim;
  int classes;
  int rc = td__images_load(&train_rows, &test_rows, &dim, &classes, dir, test_dir, shape, why,
                           why_len);
  if (rc != 0)
    return rc;
  *train = dataset_adopt(&train_rows, dim, classes);
  *test = dataset_adopt(&test_rows, dim, classes);
  if (*train == NULL || (test_rows.rows > 0 && *test == NULL)) {
    td_dataset_close(train);
    td_dataset_close(test);
    free(train_rows.x);
    free(train_rows.y);
    free(test_rows.x);
    free(test_rows.y);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  return 0;
}
