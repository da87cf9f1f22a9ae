/* dataset.c: the dataset object: its arrays, statistics, normalisation,
 * subsets and in-place shuffling.
 *
 * The readers fill it, one file a format: dataset_idx.c (IDX, plain or
 * gzip), dataset_csv.c, dataset_npy.c and dataset_images.c (images:DIR);
 * dataset_spec.c resolves the `dataset` run key to one of them. Every file
 * is opened through td_file_open_regular (compute/data/file.h): without
 * blocking, and only if it is a regular file, so a FIFO or a device path
 * fails at once instead of hanging the thread that loads it (the compute
 * thread of a run, which must always see a stop). */
#include "compute/data/dataset_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

td_dataset_t *td__dataset_new(size_t rows, size_t dim) {
  if (dim != 0 && rows > SIZE_MAX / sizeof(float) / dim)
    return NULL;
  td_dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL)
    return NULL;
  ds->rows = rows;
  ds->dim = dim;
  size_t values = rows * dim;
  ds->x = malloc((values > 0 ? values : 1) * sizeof(float));
  ds->y = malloc((rows > 0 ? rows : 1) * sizeof(int32_t));
  if (ds->x == NULL || ds->y == NULL) {
    td_dataset_close(&ds);
    return NULL;
  }
  return ds;
}

void td_dataset_close(td_dataset_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free((*self_p)->x);
  free((*self_p)->y);
  free(*self_p);
  *self_p = NULL;
}

size_t td_dataset_rows(const td_dataset_t *ds) { return ds->rows; }
size_t td_dataset_dim(const td_dataset_t *ds) { return ds->dim; }
int td_dataset_classes(const td_dataset_t *ds) { return ds->classes; }
float *td_dataset_features(td_dataset_t *ds) { return ds->x; }
const float *td_dataset_features_const(const td_dataset_t *ds) { return ds->x; }
int32_t *td_dataset_labels(td_dataset_t *ds) { return ds->y; }
const int32_t *td_dataset_labels_const(const td_dataset_t *ds) { return ds->y; }
/* ---- transformations ------------------------------------------------------------- */

void td_dataset_stats(const td_dataset_t *ds, double *mean, double *std) {
  size_t n = ds->rows * ds->dim;
  if (n == 0) {
    *mean = 0;
    *std = 0;
    return;
  }
  /* two passes: the textbook E[x^2] - E[x]^2 loses digits when |mean| >> std */
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += ds->x[i];
  double m = sum / (double)n, sq = 0;
  for (size_t i = 0; i < n; i++) {
    double d = ds->x[i] - m;
    sq += d * d;
  }
  *mean = m;
  *std = sqrt(sq / (double)n);
}

void td_dataset_normalize(td_dataset_t *ds, double mean, double std) {
  double inv = std > 0 && isfinite(std) ? 1.0 / std : 1.0;
  size_t n = ds->rows * ds->dim;
  for (size_t i = 0; i < n; i++)
    ds->x[i] = (float)(((double)ds->x[i] - mean) * inv);
}

int td_dataset_subset(td_dataset_t **out, const td_dataset_t *src, const uint32_t *idx,
                      size_t n) {
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (src == NULL || (idx == NULL && n > 0))
    return TD_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (idx[i] >= src->rows)
      return TD_ERANGE;
  td_dataset_t *ds = td__dataset_new(n, src->dim);
  if (ds == NULL)
    return TD_ENOMEM;
  size_t row_bytes = src->dim * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    memcpy(ds->x + i * src->dim, src->x + (size_t)idx[i] * src->dim, row_bytes);
    ds->y[i] = src->y[idx[i]];
  }
  ds->classes = src->classes;
  *out = ds;
  return 0;
}

/* Uniform in [0, n); datasets are capped far below 2^32 rows, but a subset
 * built with repeated indices need not be. */
static size_t shuffle_below(td_rng_t *rng, size_t n) {
  if (n <= UINT32_MAX)
    return td_rng_below(rng, (uint32_t)n);
  return (size_t)(td_rng_next(rng) % (uint64_t)n);
}

/* Swap two rows through a fixed stack buffer, a chunk at a time, so shuffling
 * never allocates and one memcpy per chunk stays cache-friendly. */
static void swap_rows(float *a, float *b, size_t dim) {
  float scratch[1024];
  for (size_t off = 0; off < dim; off += 1024) {
    size_t n = dim - off < 1024 ? dim - off : 1024;
    memcpy(scratch, a + off, n * sizeof(float));
    memcpy(a + off, b + off, n * sizeof(float));
    memcpy(b + off, scratch, n * sizeof(float));
  }
}

void td_dataset_shuffle(td_dataset_t *ds, td_rng_t *rng) {
  td_dataset_shuffle_rows(ds, 0, ds->rows, rng);
}

void td_dataset_shuffle_rows(td_dataset_t *ds, size_t first, size_t n, td_rng_t *rng) {
  if (first > ds->rows || n > ds->rows - first)
    return;
  size_t dim = ds->dim;
  float *x = ds->x + first * dim;
  int32_t *y = ds->y + first;
  for (size_t i = n; i > 1; i--) {
    size_t j = shuffle_below(rng, i), last = i - 1;
    if (j == last)
      continue;
    swap_rows(x + last * dim, x + j * dim, dim);
    int32_t t = y[last];
    y[last] = y[j];
    y[j] = t;
  }
}
