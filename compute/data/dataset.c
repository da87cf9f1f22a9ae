/* dataset.c: the dataset object: its arrays, statistics, normalisation,
 * subsets and in-place shuffling, over either storage (dataset_internal.h):
 * floats, or bytes with the table of the float each byte stands for, so a
 * Fashion-MNIST node holds a quarter of the memory and converts a batch's
 * rows only when the batch is formed (td_dataset_rows_floats).
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
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* A dataset of rows x dim features of `elem` bytes each (4: floats in x, 1:
 * bytes in b) and rows labels; NULL when it overflows or memory runs out. */
static td_dataset_t *dataset_new(size_t rows, size_t dim, size_t elem) {
  if (dim != 0 && rows > SIZE_MAX / elem / dim)
    return NULL;
  td_dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL)
    return NULL;
  ds->rows = rows;
  ds->dim = dim;
  size_t bytes = (rows * dim > 0 ? rows * dim : 1) * elem;
  void *features = malloc(bytes);
  if (elem == sizeof(float))
    ds->x = features;
  else
    ds->b = features;
  ds->y = malloc((rows > 0 ? rows : 1) * sizeof(int32_t));
  if (features == NULL || ds->y == NULL) {
    td_dataset_close(&ds);
    return NULL;
  }
  return ds;
}

td_dataset_t *td__dataset_new(size_t rows, size_t dim) {
  return dataset_new(rows, dim, sizeof(float));
}

td_dataset_t *td__dataset_new_bytes(size_t rows, size_t dim) {
  td_dataset_t *ds = dataset_new(rows, dim, 1);
  if (ds == NULL)
    return NULL;
  for (int v = 0; v < 256; v++) /* v / 255.0f exactly, as the IDX loader converts */
    ds->value[v] = (float)v / 255.0f;
  return ds;
}

void td_dataset_close(td_dataset_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free((*self_p)->x);
  free((*self_p)->b);
  free((*self_p)->y);
  free(*self_p);
  *self_p = NULL;
}

size_t td_dataset_rows(const td_dataset_t *ds) { return ds->rows; }
size_t td_dataset_dim(const td_dataset_t *ds) { return ds->dim; }
int td_dataset_classes(const td_dataset_t *ds) { return ds->classes; }
bool td_dataset_holds_bytes(const td_dataset_t *ds) { return ds->b != NULL; }

/* Byte storage to float storage, in place: x[i] = value[b[i]]. */
static float *expand_to_floats(td_dataset_t *ds) {
  if (ds->b == NULL)
    return ds->x;
  size_t values = ds->rows * ds->dim;
  float *x = values <= SIZE_MAX / sizeof *x ? malloc((values > 0 ? values : 1) * sizeof *x) : NULL;
  if (x == NULL)
    return NULL;
  for (size_t i = 0; i < values; i++)
    x[i] = ds->value[ds->b[i]];
  free(ds->b);
  ds->b = NULL;
  ds->x = x;
  return x;
}

float *td_dataset_features(td_dataset_t *ds) { return expand_to_floats(ds); }
const float *td_dataset_features_const(const td_dataset_t *ds) {
  /* the object is never defined const: the callers' datasets are malloc'd */
  return expand_to_floats((td_dataset_t *)ds);
}

const float *td_dataset_rows_floats(const td_dataset_t *ds, size_t first, size_t n,
                                    float *scratch) {
  if (first > ds->rows || n > ds->rows - first)
    return NULL;
  size_t dim = ds->dim;
  if (ds->b == NULL)
    return ds->x + first * dim;
  const uint8_t *b = ds->b + first * dim;
  for (size_t i = 0, values = n * dim; i < values; i++)
    scratch[i] = ds->value[b[i]];
  return scratch;
}

/* Feature i (row-major) as a float, from either storage. */
static inline float feature_at(const td_dataset_t *ds, size_t i) {
  return ds->b != NULL ? ds->value[ds->b[i]] : ds->x[i];
}
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
    sum += feature_at(ds, i);
  double m = sum / (double)n, sq = 0;
  for (size_t i = 0; i < n; i++) {
    double d = feature_at(ds, i) - m;
    sq += d * d;
  }
  *mean = m;
  *std = sqrt(sq / (double)n);
}

void td_dataset_normalize(td_dataset_t *ds, double mean, double std) {
  double inv = std > 0 && isfinite(std) ? 1.0 / std : 1.0;
  if (ds->b != NULL) { /* every byte's float, by the expression below */
    for (int v = 0; v < 256; v++)
      ds->value[v] = (float)(((double)ds->value[v] - mean) * inv);
    return;
  }
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
  bool bytes = src->b != NULL;
  td_dataset_t *ds = bytes ? td__dataset_new_bytes(n, src->dim) : td__dataset_new(n, src->dim);
  if (ds == NULL)
    return TD_ENOMEM;
  size_t row_bytes = src->dim * (bytes ? 1 : sizeof(float));
  uint8_t *to = bytes ? ds->b : (uint8_t *)ds->x;
  const uint8_t *from = bytes ? src->b : (const uint8_t *)src->x;
  for (size_t i = 0; i < n; i++) {
    memcpy(to + i * row_bytes, from + (size_t)idx[i] * row_bytes, row_bytes);
    ds->y[i] = src->y[idx[i]];
  }
  if (bytes)
    memcpy(ds->value, src->value, sizeof ds->value);
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

/* Swap two rows of len bytes through a fixed stack buffer, a chunk at a
 * time, so shuffling never allocates and one memcpy per chunk stays
 * cache-friendly. */
static void swap_rows(uint8_t *a, uint8_t *b, size_t len) {
  uint8_t scratch[4096];
  for (size_t off = 0; off < len; off += sizeof scratch) {
    size_t n = len - off < sizeof scratch ? len - off : sizeof scratch;
    memcpy(scratch, a + off, n);
    memcpy(a + off, b + off, n);
    memcpy(b + off, scratch, n);
  }
}

void td_dataset_shuffle(td_dataset_t *ds, td_rng_t *rng) {
  td_dataset_shuffle_rows(ds, 0, ds->rows, rng);
}

void td_dataset_shuffle_rows(td_dataset_t *ds, size_t first, size_t n, td_rng_t *rng) {
  if (first > ds->rows || n > ds->rows - first)
    return;
  size_t row_bytes = ds->dim * (ds->b != NULL ? 1 : sizeof(float));
  uint8_t *x = (ds->b != NULL ? ds->b : (uint8_t *)ds->x) + first * row_bytes;
  int32_t *y = ds->y + first;
  for (size_t i = n; i > 1; i--) {
    size_t j = shuffle_below(rng, i), last = i - 1;
    if (j == last)
      continue;
    swap_rows(x + last * row_bytes, x + j * row_bytes, row_bytes);
    int32_t t = y[last];
    y[last] = y[j];
    y[j] = t;
  }
}
