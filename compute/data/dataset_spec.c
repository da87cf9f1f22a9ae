/* dataset_spec.c: the `dataset` run key: which files it names and in which
 * form (fashion-mnist | idx:... | csv:... | npy:... | images:...), and
 * opening the training and test sets from them, whole or only the rows a
 * partition picks, the test set checked to fit the training set. */
#include "compute/data/dataset_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

#define TD__SPEC_MAX_PATHS 4
#define TD__SPEC_PATH_MAX 4096

/* Split "A,B,..." into at most TD__SPEC_MAX_PATHS non-empty paths; -1 when
 * there are more, or one is empty or too long. */
static int split_paths(const char *list, char parts[TD__SPEC_MAX_PATHS][TD__SPEC_PATH_MAX]) {
  int count = 0;
  const char *p = list;
  for (;;) {
    if (count == TD__SPEC_MAX_PATHS)
      return -1;
    const char *comma = strchr(p, ',');
    size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
    if (len == 0 || len >= TD__SPEC_PATH_MAX)
      return -1;
    memcpy(parts[count], p, len);
    parts[count][len] = '\0';
    count++;
    if (comma == NULL)
      return count;
    p = comma + 1;
  }
}

#define TD__SPEC_FORMS                                                                  \
  "fashion-mnist, idx:TRAIN_IMAGES,TRAIN_LABELS[,TEST_IMAGES,TEST_LABELS], "              \
  "csv:TRAIN[,TEST], npy:TRAIN_X,TRAIN_Y[,TEST_X,TEST_Y], images:DIR[,TEST_DIR]"

/* The forms a `dataset` key takes (besides text, which shard.c reads). */
typedef enum { FORM_IDX, FORM_CSV, FORM_NPY, FORM_IMAGES } spec_form_t;

/* The files a `dataset` key names: count paths into path[], *form. */
static int resolve_spec(const char *spec, char (*path)[TD__SPEC_PATH_MAX], int *count,
                        spec_form_t *form, char *why, size_t why_len) {
  int rc = 0;
  *form = FORM_IDX;
  *count = 0;
  if (spec == NULL || spec[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG, "no dataset given (accepted: " TD__SPEC_FORMS ")");
  if (strcmp(spec, "fashion-mnist") == 0) {
    const char *dir = getenv("TRAIND_FASHION_MNIST_DIR");
    if (dir == NULL || dir[0] == '\0')
      dir = TD_FASHION_MNIST_DIR;
    static const char *const files[4] = {
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    *count = 4;
    for (int i = 0; i < 4 && rc == 0; i++) {
      struct stat st;
      snprintf(path[i], TD__SPEC_PATH_MAX, "%s/%s", dir, files[i]);
      if (stat(path[i], &st) != 0)
        rc = td_why(why, why_len, TD_ENOENT,
                    "dataset file %s not found: install the Debian package %s "
                    "(apt-get install %s)",
                    path[i], TD_FASHION_MNIST_PKG, TD_FASHION_MNIST_PKG);
    }
  } else if (strncmp(spec, "idx:", 4) == 0) {
    *count = split_paths(spec + 4, path);
    if (*count != 2 && *count != 4)
      rc = td_why(why, why_len, TD_ECONFIG,
                  "dataset '%s': expected idx:TRAIN_IMAGES,TRAIN_LABELS[,TEST_IMAGES,TEST_LABELS]",
                  spec);
  } else if (strncmp(spec, "csv:", 4) == 0) {
    *form = FORM_CSV;
    *count = split_paths(spec + 4, path);
    if (*count != 1 && *count != 2)
      rc = td_why(why, why_len, TD_ECONFIG, "dataset '%s': expected csv:TRAIN[,TEST]", spec);
  } else if (strncmp(spec, "npy:", 4) == 0) {
    *form = FORM_NPY;
    *count = split_paths(spec + 4, path);
    if (*count != 2 && *count != 4)
      rc = td_why(why, why_len, TD_ECONFIG,
                  "dataset '%s': expected npy:TRAIN_X,TRAIN_Y[,TEST_X,TEST_Y]", spec);
  } else if (strncmp(spec, "images:", 7) == 0) {
    *form = FORM_IMAGES;
    *count = split_paths(spec + 7, path);
    if (*count != 1 && *count != 2)
      rc = td_why(why, why_len, TD_ECONFIG, "dataset '%s': expected images:DIR[,TEST_DIR]",
                  spec);
  } else {
    rc = td_why(why, why_len, TD_ECONFIG, "unknown dataset '%s' (accepted: " TD__SPEC_FORMS ")",
                spec);
  }
  return rc;
}

/* The training set whole; an images folder yields its test set with it. */
static int load_train(td_dataset_t **train, td_dataset_t **test, spec_form_t form,
                      char (*path)[TD__SPEC_PATH_MAX], int count,
                      const td_image_shape_t *images_as, char *why, size_t why_len) {
  switch (form) {
  case FORM_CSV:
    return td_dataset_load_csv(train, path[0], why, why_len);
  case FORM_NPY:
    return td_dataset_load_npy(train, path[0], path[1], why, why_len);
  case FORM_IMAGES:
    return td_dataset_load_images(train, test, path[0], count == 2 ? path[1] : NULL, images_as,
                                  why, why_len);
  case FORM_IDX:
    break;
  }
  return td_dataset_load_idx(train, path[0], path[1], why, why_len);
}

/* The test set named apart from the training set (none for images:, whose
 * test set load_train gives). */
static int load_test(td_dataset_t **test, spec_form_t form, char (*path)[TD__SPEC_PATH_MAX],
                     int count, char *why, size_t why_len) {
  switch (form) {
  case FORM_CSV:
    return count == 2 ? td_dataset_load_csv(test, path[1], why, why_len) : 0;
  case FORM_NPY:
    return count == 4 ? td_dataset_load_npy(test, path[2], path[3], why, why_len) : 0;
  case FORM_IMAGES:
    return 0;
  case FORM_IDX:
    break;
  }
  return count == 4 ? td_dataset_load_idx(test, path[2], path[3], why, why_len) : 0;
}

/* The test set must fit the training set: the same features, one label space. */
static int match_test(td_dataset_t *train, td_dataset_t *test, const char *spec, char *why,
                      size_t why_len) {
  if (test == NULL)
    return 0;
  if (test->dim != train->dim)
    return td_why(why, why_len, TD_ESHAPE,
                  "dataset '%s': the test set has %zu features per row, the training set %zu",
                  spec, test->dim, train->dim);
  /* one label space for both, so a model sized from train fits test */
  int classes = train->classes > test->classes ? train->classes : test->classes;
  train->classes = test->classes = classes;
  return 0;
}

/* Load the training set whole (picked: only the rows pick chooses, its
 * statistics those of the whole set) and the test set. */
static int open_sets(td_dataset_t **train, td_dataset_t **test, const char *spec,
                     const td_image_shape_t *images_as, td_dataset_pick_fn pick, void *user,
                     double *mean, double *std, size_t *full_rows, char *why, size_t why_len) {
  if (train == NULL || test == NULL)
    return TD_EINVAL;
  *train = *test = NULL;
  /* 16 KiB of paths: too much for some thread stacks, so on the heap */
  char(*path)[TD__SPEC_PATH_MAX] = malloc(TD__SPEC_MAX_PATHS * sizeof *path);
  if (path == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int count;
  spec_form_t form;
  int rc = resolve_spec(spec, path, &count, &form, why, why_len);
  if (rc == 0 && pick != NULL && form == FORM_IDX) {
    rc = td_dataset_load_idx_rows(train, path[0], path[1], pick, user, mean, std, full_rows,
                                  why, why_len);
  } else if (rc == 0) {
    rc = load_train(train, test, form, path, count, images_as, why, why_len);
    if (rc == 0 && pick != NULL) { /* other forms: the whole file, then the rows */
      uint32_t *idx = NULL;
      size_t n = 0;
      td_dataset_t *sub = NULL;
      td_dataset_stats(*train, mean, std);
      *full_rows = (*train)->rows;
      rc = pick((*train)->y, (*train)->rows, (*train)->classes, user, &idx, &n, why, why_len);
      if (rc == 0 && (rc = td_dataset_subset(&sub, *train, idx, n)) != 0)
        td_why(why, why_len, rc, "cannot copy the partition: %s", td_strerror(rc));
      free(idx);
      td_dataset_close(train);
      *train = sub;
    }
  }
  if (rc == 0)
    rc = load_test(test, form, path, count, why, why_len);
  if (rc == 0)
    rc = match_test(*train, *test, spec, why, why_len);
  free(path);
  if (rc != 0) {
    td_dataset_close(train);
    td_dataset_close(test);
  }
  return rc;
}

int td_dataset_open(td_dataset_t **train, td_dataset_t **test, const char *spec, char *why,
                    size_t why_len) {
  return open_sets(train, test, spec, NULL, NULL, NULL, NULL, NULL, NULL, why, why_len);
}

int td_dataset_open_as(td_dataset_t **train, td_dataset_t **test, const char *spec,
                       const td_image_shape_t *images_as, char *why, size_t why_len) {
  return open_sets(train, test, spec, images_as, NULL, NULL, NULL, NULL, NULL, why, why_len);
}

int td_dataset_open_test(td_dataset_t **test, const char *spec,
                         const td_image_shape_t *images_as, char *why, size_t why_len) {
  if (test == NULL)
    return TD_EINVAL;
  *test = NULL;
  char(*path)[TD__SPEC_PATH_MAX] = malloc(TD__SPEC_MAX_PATHS * sizeof *path);
  if (path == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int count;
  spec_form_t form;
  int rc = resolve_spec(spec, path, &count, &form, why, why_len);
  if (rc == 0 && form == FORM_IMAGES) { /* the folder walk yields both sets */
    td_dataset_t *train = NULL;
    rc = load_train(&train, test, form, path, count, images_as, why, why_len);
    td_dataset_close(&train);
  } else if (rc == 0) {
    rc = load_test(test, form, path, count, why, why_len);
  }
  free(path);
  return rc;
}

int td_dataset_open_rows(td_dataset_t **train, td_dataset_t **test, const char *spec,
                         const td_image_shape_t *images_as, td_dataset_pick_fn pick, void *user,
                         double *mean, double *std, size_t *full_rows, char *why,
                         size_t why_len) {
  if (pick == NULL || mean == NULL || std == NULL || full_rows == NULL)
    return TD_EINVAL;
  return open_sets(train, test, spec, images_as, pick, user, mean, std, full_rows, why,
                   why_len);
}
