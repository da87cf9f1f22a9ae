/* images.c: the images:DIR[,TEST_DIR] dataset, folders of PNG and JPEG
 * files, one folder per class (images.h; td_dataset_load_images in
 * dataset.h wraps what it returns).
 *
 * The folders are listed first, names sorted in byte order (strcmp), so the
 * class ids and the row order never depend on the file system. Entries are
 * examined with fstatat(AT_SYMLINK_NOFOLLOW): a symbolic link is refused, so
 * a dataset whose DIR the run's policy resolved under --data-root cannot
 * reach outside it; hidden names are skipped (editors' and file managers'
 * droppings). Then every image's header is probed (compute/data/image.h)
 * and its size checked against the dataset's before one byte of feature
 * memory is allocated, and only then are the images decoded, each straight
 * into its row. Files are read whole (at most TD_IMAGE_MAX_FILE_BYTES)
 * through td_file_read_all_nofollow: non-blocking, regular files only, and
 * a link swapped in after the listing is refused when it is opened. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/file.h"
#include "compute/data/image.h"
#include "compute/data/images.h"

/* Without a TEST_DIR, file i of each class (name order) is a test image
 * when i % TD__IMAGES_TEST_EVERY == TD__IMAGES_TEST_EVERY - 1: 20 %. */
#define TD__IMAGES_TEST_EVERY 5

typedef struct {
  char *path;
  int label;
  int test;
} image_entry_t;

typedef struct {
  char **names;
  size_t count, cap;
} name_list_t;

static void names_free(name_list_t *l) {
  for (size_t i = 0; i < l->count; i++)
    free(l->names[i]);
  free(l->names);
  memset(l, 0, sizeof *l);
}

static int names_push(name_list_t *l, const char *name) {
  if (l->count == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char **grown = realloc(l->names, cap * sizeof *grown);
    if (grown == NULL)
      return -1;
    l->names = grown;
    l->cap = cap;
  }
  if ((l->names[l->count] = strdup(name)) == NULL)
    return -1;
  l->count++;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The visible entries of dir that are folders (want_dirs) or regular files,
 * sorted; anything else is refused. limit bounds how many are taken. */
static int list_dir(name_list_t *out, const char *dir, int want_dirs, size_t limit, char *why,
                    size_t why_len) {
  memset(out, 0, sizeof *out);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (d == NULL) {
    int err = errno;
    if (fd >= 0)
      close(fd);
    if (err == ELOOP)
      return td_why(why, why_len, TD_EIO,
                    "%s is a symbolic link; an images dataset reads only "
                    "real folders and files",
                    dir);
    return td_why(why, why_len, err == ENOENT || err == ENOTDIR ? TD_ENOENT : TD_EIO,
                  "cannot open the folder %s: %s", dir, strerror(err));
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      rc = td_why(why, why_len, TD_EIO, "cannot stat %s/%s: %s", dir, e->d_name, strerror(errno));
    else if (S_ISLNK(st.st_mode))
      rc = td_why(why, why_len, TD_EIO,
                  "%s/%s is a symbolic link; an images dataset reads only real folders and "
                  "files",
                  dir, e->d_name);
    else if (want_dirs && !S_ISDIR(st.st_mode))
      rc = td_why(why, why_len, TD_ECORRUPT,
                  "%s/%s is not a folder: an images dataset holds one folder per class and "
                  "nothing else",
                  dir, e->d_name);
    else if (!want_dirs && !S_ISREG(st.st_mode))
      rc = td_why(why, why_len, TD_ECORRUPT, "%s/%s is not a regular file", dir, e->d_name);
    else if (out->count == limit)
      rc = td_why(why, why_len, TD_ECORRUPT, "%s holds more than %zu %s", dir, limit,
                  want_dirs ? "class folders" : "images");
    else if (names_push(out, e->d_name) != 0)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory listing %s", dir);
  }
  closedir(d);
  if (rc != 0)
    names_free(out);
  else if (out->count > 1)
    qsort(out->names, out->count, sizeof *out->names, by_name);
  return rc;
}

typedef struct {
  image_entry_t *items;
  size_t count, cap;
  size_t n_test;
} entry_list_t;

static void entries_free(entry_list_t *l) {
  for (size_t i = 0; i < l->count; i++)
    free(l->items[i].path);
  free(l->items);
  memset(l, 0, sizeof *l);
}

/* Append every image of dir/class for every class; split marks every fifth
 * of each class as test, test_set marks all of them test. */
static int collect(entry_list_t *out, const char *dir, const name_list_t *classes, int split,
                   int test_set, char *why, size_t why_len) {
  for (size_t c = 0; c < classes->count; c++) {
    char folder[PATH_MAX];
    if (snprintf(folder, sizeof folder, "%s/%s", dir, classes->names[c]) >= (int)sizeof folder)
      return td_why(why, why_len, TD_ECONFIG, "%s/%s: path too long", dir, classes->names[c]);
    name_list_t files;
    int rc = list_dir(&files, folder, 0, TD_DATASET_MAX_ROWS - out->count, why, why_len);
    if (rc != 0)
      return rc;
    if (files.count == 0) {
      names_free(&files);
      return td_why(why, why_len, TD_ECORRUPT, "class folder %s holds no images", folder);
    }
    for (size_t i = 0; i < files.count && rc == 0; i++) {
      if (out->count == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        image_entry_t *grown = realloc(out->items, cap * sizeof *grown);
        if (grown == NULL) {
          rc = td_why(why, why_len, TD_ENOMEM, "out of memory listing %s", folder);
          break;
        }
        out->items = grown;
        out->cap = cap;
      }
      image_entry_t *e = &out->items[out->count];
      size_t len = strlen(folder) + 1 + strlen(files.names[i]) + 1;
      if (len > PATH_MAX || (e->path = malloc(len)) == NULL) {
        rc = td_why(why, why_len, len > PATH_MAX ? TD_ECONFIG : TD_ENOMEM,
                    "%s/%s: path too long or out of memory", folder, files.names[i]);
        break;
      }
      snprintf(e->path, len, "%s/%s", folder, files.names[i]);
      e->label = (int)c;
      e->test = test_set || (split && i % TD__IMAGES_TEST_EVERY == TD__IMAGES_TEST_EVERY - 1);
      out->n_test += (size_t)e->test;
      out->count++;
    }
    names_free(&files);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Pass 1: every header, checked against one size. With a zero shape, the
 * first image sets the size and colour anywhere makes the set RGB. */
static int probe_all(const entry_list_t *l, td_image_shape_t *shape, char *why, size_t why_len) {
  int from_files = shape->channels == 0;
  int any_color = 0;
  for (size_t i = 0; i < l->count; i++) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    td_image_info_t info;
    int rc = td_file_read_all_nofollow(l->items[i].path, TD_IMAGE_MAX_FILE_BYTES, &bytes, &len, why,
                                       why_len);
    if (rc == 0)
      rc = td_image_probe(&info, bytes, len, l->items[i].path, why, why_len);
    free(bytes);
    if (rc != 0)
      return rc;
    if (from_files && i == 0) {
      shape->width = (int)info.width;
      shape->height = (int)info.height;
    }
    if (info.width != (uint32_t)shape->width || info.height != (uint32_t)shape->height)
      return td_why(why, why_len, TD_ESHAPE,
                    "%s: %ux%u pixels, but %s %dx%d (width x height); resize the images first "
                    "(images are not resized)",
                    l->items[i].path, info.width, info.height,
                    from_files ? "the first image of the dataset is" : "the model reads",
                    shape->width, shape->height);
    any_color |= info.color;
  }
  if (from_files)
    shape->channels = any_color ? 3 : 1;
  return 0;
}

/* Pass 2: decode each image into its row of train or test. */
static int decode_all(const entry_list_t *l, const td_image_shape_t *shape, td__image_rows_t *train,
                      td__image_rows_t *test, char *why, size_t why_len) {
  size_t dim = (size_t)shape->channels * (size_t)shape->height * (size_t)shape->width;
  size_t train_row = 0, test_row = 0;
  for (size_t i = 0; i < l->count; i++) {
    const image_entry_t *e = &l->items[i];
    td__image_rows_t *set = e->test ? test : train;
    size_t row = e->test ? test_row++ : train_row++;
    uint8_t *bytes = NULL;
    size_t len = 0;
    int rc =
        td_file_read_all_nofollow(e->path, TD_IMAGE_MAX_FILE_BYTES, &bytes, &len, why, why_len);
    if (rc == 0)
      rc = td_image_decode(set->x + row * dim, shape->channels, (uint32_t)shape->width,
                           (uint32_t)shape->height, bytes, len, e->path, why, why_len);
    free(bytes);
    if (rc != 0)
      return rc;
    set->y[row] = e->label;
  }
  return 0;
}

/* rows x dim floats and rows labels; 0, or -1 when they cannot be had. */
static int rows_alloc(td__image_rows_t *set, size_t rows, size_t dim) {
  memset(set, 0, sizeof *set);
  if (rows == 0)
    return 0;
  if (dim == 0 || rows > SIZE_MAX / sizeof(float) / dim)
    return -1;
  set->x = malloc(rows * dim * sizeof(float));
  set->y = malloc(rows * sizeof(int32_t));
  set->rows = rows;
  return set->x != NULL && set->y != NULL ? 0 : -1;
}

static void rows_free(td__image_rows_t *set) {
  free(set->x);
  free(set->y);
  memset(set, 0, sizeof *set);
}

static int same_classes(const name_list_t *a, const char *dir_a, const name_list_t *b,
                        const char *dir_b, char *why, size_t why_len) {
  for (size_t i = 0; i < a->count || i < b->count; i++)
    if (i >= a->count || i >= b->count || strcmp(a->names[i], b->names[i]) != 0)
      return td_why(why, why_len, TD_ESHAPE,
                    "the class folders differ: %s has '%s' where %s has '%s' (both need the "
                    "same class folders)",
                    dir_a, i < a->count ? a->names[i] : "(nothing)", dir_b,
                    i < b->count ? b->names[i] : "(nothing)");
  return 0;
}

int td__images_load(td__image_rows_t *train, td__image_rows_t *test, size_t *dim, int *classes_out,
                    const char *dir, const char *test_dir, const td_image_shape_t *shape, char *why,
                    size_t why_len) {
  memset(train, 0, sizeof *train);
  memset(test, 0, sizeof *test);
  *dim = 0;
  *classes_out = 0;
  if (dir == NULL)
    return td_why(why, why_len, TD_EINVAL, "images loader needs a folder");
  td_image_shape_t want = {0, 0, 0};
  if (shape != NULL && shape->channels != 0) {
    want = *shape;
    if ((want.channels != 1 && want.channels != 3) || want.height <= 0 || want.width <= 0)
      return td_why(why, why_len, TD_ESHAPE,
                    "images become 1 (grey) or 3 (RGB) channels, but the model reads %d "
                    "channels of %dx%d",
                    want.channels, want.width, want.height);
  }
  name_list_t classes = {0}, test_classes = {0};
  entry_list_t entries = {0};
  int rc = list_dir(&classes, dir, 1, TD_DATASET_MAX_CLASSES, why, why_len);
  if (rc == 0 && classes.count == 0)
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s holds no class folders (an images dataset is one folder per class)", dir);
  if (rc == 0 && test_dir != NULL) {
    rc = list_dir(&test_classes, test_dir, 1, TD_DATASET_MAX_CLASSES, why, why_len);
    if (rc == 0)
      rc = same_classes(&classes, dir, &test_classes, test_dir, why, why_len);
  }
  if (rc == 0)
    rc = collect(&entries, dir, &classes, test_dir == NULL, 0, why, why_len);
  if (rc == 0 && test_dir != NULL)
    rc = collect(&entries, test_dir, &test_classes, 0, 1, why, why_len);
  if (rc == 0)
    rc = probe_all(&entries, &want, why, why_len);
  if (rc == 0 &&
      (uint64_t)want.channels * (uint64_t)want.height * (uint64_t)want.width > TD_DATASET_MAX_DIM)
    rc = td_why(why, why_len, TD_ESHAPE, "%d x %d x %d values per image, more than %u",
                want.channels, want.height, want.width, TD_DATASET_MAX_DIM);
  size_t n_train = entries.count - entries.n_test;
  if (rc == 0 && n_train == 0)
    rc = td_why(why, why_len, TD_ECORRUPT, "%s leaves no training images", dir);
  if (rc == 0) {
    *dim = (size_t)want.channels * (size_t)want.height * (size_t)want.width;
    if (rows_alloc(train, n_train, *dim) != 0 || rows_alloc(test, entries.n_test, *dim) != 0)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %zu images of %zu values",
                  entries.count, *dim);
  }
  if (rc == 0)
    rc = decode_all(&entries, &want, train, test, why, why_len);
  *classes_out = (int)classes.count;
  entries_free(&entries);
  names_free(&classes);
  names_free(&test_classes);
  if (rc != 0) {
    rows_free(train);
    rows_free(test);
    *dim = 0;
    *classes_out = 0;
  }
  return rc;
}
