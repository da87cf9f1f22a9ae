/* dataset.h: labelled datasets held in memory as features + int32 labels.
 *
 * Features are floats, or, where the source is unsigned bytes (IDX ubyte,
 * Fashion-MNIST, uint8 .npy), bytes with the float each byte value stands
 * for: a quarter of the memory, converted a batch at a time
 * (td_dataset_rows_floats) to exactly the floats the float storage holds.
 *
 * Loads IDX files (plain or gzip, via zlib), CSV files (label first), NumPy
 * .npy pairs and folders of PNG/JPEG images, resolves the run key `dataset`
 * (fashion-mnist | idx:... | csv:... | npy:... | images:...), normalises features
 * and shuffles rows in place so a training step reads a contiguous batch (with
 * no copy from float storage, one conversion from bytes). A dataset owns its
 * feature and label arrays. Nothing here trusts a file: sizes in headers are
 * checked against the bytes actually present. */
#ifndef TD_DATASET_H
#define TD_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/rng.h"

/* Where Debian's dataset-fashion-mnist installs its files. The environment
 * variable TRAIND_FASHION_MNIST_DIR overrides it (used by tests). */
#define TD_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define TD_FASHION_MNIST_PKG "dataset-fashion-mnist"

/* Hard limits that bound what a hostile file can make us allocate. */
#define TD_DATASET_MAX_ROWS 100000000u
#define TD_DATASET_MAX_DIM 1048576u
#define TD_DATASET_MAX_CLASSES 65536

typedef struct td_dataset td_dataset_t;

/* Load an IDX image file (idx3 ubyte or float, any number of dims >= 1: each
 * item is flattened) and an idx1 ubyte label file; plain or .gz (detected by the
 * gzip magic, not by the name). ubyte pixels are scaled to [0, 1]. On failure
 * returns TD_ENOENT / TD_EIO / TD_ECORRUPT / TD_ENOMEM and fills why. Caller
 * owns *out and closes it with td_dataset_close(). */
int td_dataset_load_idx(td_dataset_t **out, const char *images_path, const char *labels_path,
                        char *why, size_t why_len);

/* Load a CSV file: one row per sample, label (integer >= 0) first, then the
 * features; a first line that does not parse as numbers is taken as a header.
 * Every row must have the same number of columns. Caller owns *out. */
int td_dataset_load_csv(td_dataset_t **out, const char *path, char *why, size_t why_len);

/* Load a NumPy pair: X.npy (float32 or uint8, shape (N, ...): each item is
 * flattened; uint8 is scaled to [0, 1]) and Y.npy (int64, int32 or uint8,
 * shape (N,)); formats v1 and v2, little-endian, C order (compute/data/npy.h).
 * Errors as td_dataset_load_idx. Caller owns *out. */
int td_dataset_load_npy(td_dataset_t **out, const char *x_path, const char *y_path, char *why,
                        size_t why_len);

/* What the images of an images:DIR dataset become: channels (1 grey or 3
 * RGB) x height x width, channels first. All zero: taken from the files. */
typedef struct {
  int channels, height, width;
} td_image_shape_t;

/* Load an images dataset (compute/data/images.c): DIR holds one folder per
 * class (class ids = the folders' names in byte order), each holding PNG or
 * JPEG files; hidden names (".x") are skipped, anything else that is not a
 * folder / regular file (a symbolic link, a stray file at the top) is
 * refused. Every image must be exactly shape's height x width; channels
 * converts colour to grey or grey to RGB. With a zero shape the first image
 * sets the size, and the set is RGB if any image is in colour, else grey.
 * With test_dir (same class folders) it is the test set; without, the test
 * set is every fifth file of each class in name order (index % 5 == 4),
 * NULL when that is none. Caller owns both results. */
int td_dataset_load_images(td_dataset_t **train, td_dataset_t **test, const char *dir,
                           const char *test_dir, const td_image_shape_t *shape, char *why,
                           size_t why_len);

/* Resolve a `dataset` run key into a train and a test set:
 *   fashion-mnist                         Debian's package (TD_FASHION_MNIST_DIR)
 *   idx:TRAIN_IMAGES,TRAIN_LABELS[,TEST_IMAGES,TEST_LABELS]
 *   csv:TRAIN_PATH[,TEST_PATH]
 *   npy:TRAIN_X,TRAIN_Y[,TEST_X,TEST_Y]
 *   images:DIR[,TEST_DIR]
 * Without a test set, *test is set to NULL. A missing fashion-mnist file names
 * the path and the Debian package in why. Caller owns both results. */
int td_dataset_open(td_dataset_t **train, td_dataset_t **test, const char *spec, char *why,
                    size_t why_len);
/* td_dataset_open, with the shape images:DIR datasets are converted to
 * (NULL or all zero: taken from the files); the other forms ignore it. */
int td_dataset_open_as(td_dataset_t **train, td_dataset_t **test, const char *spec,
                       const td_image_shape_t *images_as, char *why, size_t why_len);

/* Chooses a node's rows from the labels of the whole training set (rows of
 * them, labels in [0, classes)): *idx (malloc'd, the caller of the loader
 * frees it) holds *count distinct row numbers, in the order the rows are to
 * be kept. Non-zero + why to refuse (the loader returns it). */
typedef int (*td_dataset_pick_fn)(const int32_t *labels, size_t rows, int classes, void *user,
                                  uint32_t **idx, size_t *count, char *why, size_t why_len);

/* The rows of an IDX training set that `pick` chooses, read without ever
 * holding the others: the labels first, then the images streamed twice (a
 * .gz is decompressed twice), once for the mean and once for the deviations
 * and the kept rows. *mean and *std are those td_dataset_stats() gives for
 * the whole set, bit for bit, and *full_rows its row count; features are
 * not normalised. Errors as td_dataset_load_idx(), or pick's. Caller owns *out. */
int td_dataset_load_idx_rows(td_dataset_t **out, const char *images_path,
                             const char *labels_path, td_dataset_pick_fn pick, void *user,
                             double *mean, double *std, size_t *full_rows, char *why,
                             size_t why_len);

/* td_dataset_open() for a node that trains only on some rows: *train holds
 * the rows pick chooses (IDX: read as td_dataset_load_idx_rows() reads them;
 * the other forms: loaded whole, then the rows copied; images_as as for
 * td_dataset_open_as), *test the whole test set; *mean, *std and *full_rows
 * are the whole training set's. */
int td_dataset_open_rows(td_dataset_t **train, td_dataset_t **test, const char *spec,
                         const td_image_shape_t *images_as, td_dataset_pick_fn pick, void *user,
                         double *mean, double *std, size_t *full_rows, char *why,
                         size_t why_len);

/* The test set alone of a `dataset` key (*test NULL when it names none),
 * not normalised (an images: folder is walked whole for it). Caller owns it. */
int td_dataset_open_test(td_dataset_t **test, const char *spec,
                         const td_image_shape_t *images_as, char *why, size_t why_len);

/* NULL-safe; sets *self_p to NULL. */
void td_dataset_close(td_dataset_t **self_p);

size_t td_dataset_rows(const td_dataset_t *ds);
size_t td_dataset_dim(const td_dataset_t *ds);
/* Number of classes = max label + 1. */
int td_dataset_classes(const td_dataset_t *ds);
/* Row-major rows x dim features; borrowed, valid until close. A dataset
 * held as bytes is first expanded to floats in place (4 bytes a feature
 * from then on; not thread-safe), NULL when out of memory for that: for
 * tests and tools; training and evaluation read td_dataset_rows_floats(). */
float *td_dataset_features(td_dataset_t *ds);
const float *td_dataset_features_const(const td_dataset_t *ds);
/* True while the features are held as bytes (td_dataset_rows_floats then
 * converts into its scratch). */
bool td_dataset_holds_bytes(const td_dataset_t *ds);
/* Rows [first, first + n) as row-major floats: a pointer into the dataset
 * (float storage) or scratch, the caller's n x dim floats, filled with the
 * rows converted (byte storage), bit for bit the floats td_dataset_features
 * would hold. Valid until the dataset or scratch changes; NULL when the rows
 * are out of range. */
const float *td_dataset_rows_floats(const td_dataset_t *ds, size_t first, size_t n,
                                    float *scratch);
/* rows labels; borrowed. */
int32_t *td_dataset_labels(td_dataset_t *ds);
const int32_t *td_dataset_labels_const(const td_dataset_t *ds);

/* Scalar mean and standard deviation over all features (computed in double). */
void td_dataset_stats(const td_dataset_t *ds, double *mean, double *std);
/* x = (x - mean) / std for every feature; std <= 0 is treated as 1. */
void td_dataset_normalize(td_dataset_t *ds, double mean, double std);

/* New dataset holding copies of rows idx[0..n) of src (in that order); classes
 * is inherited from src so a subset never shrinks the label space. Indices out of
 * range give TD_ERANGE. Caller owns *out. */
int td_dataset_subset(td_dataset_t **out, const td_dataset_t *src, const uint32_t *idx, size_t n);

/* Permute the rows in place (features and labels together), Fisher-Yates. */
void td_dataset_shuffle(td_dataset_t *ds, td_rng_t *rng);
/* The same over rows [first, first + n) only (virtual clients shuffle their
 * own rows); a range outside the set does nothing. td_dataset_shuffle is
 * this over every row. */
void td_dataset_shuffle_rows(td_dataset_t *ds, size_t first, size_t n, td_rng_t *rng);

#endif
