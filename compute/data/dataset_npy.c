/* dataset_npy.c: the NumPy reader: a features .npy and a labels .npy.
 *
 * compute/data/npy.c parses each header and converts the values; this file
 * checks the pair against each other and the value cap, and streams both
 * files slab by slab into one dataset (uint8 features straight into its
 * byte storage, dataset_internal.h). The files are opened through
 * td_file_open_regular (compute/data/file.h). */
#include "compute/data/dataset_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/file.h"
#include "compute/data/npy.h"

/* The largest .npy file worth opening: the value cap in int64s plus a header. */
#define TD__NPY_MAX_FILE_BYTES (TD__DATASET_MAX_VALUES * 8 + 12 + TD_NPY_MAX_HEADER_BYTES)

/* Read exactly len bytes at the current offset; a short read is truncation
 * (the file shrank since its size was checked). */
static int read_exact(int fd, uint8_t *buf, size_t len, const char *path, char *why,
                      size_t why_len) {
  size_t got = 0;
  while (got < len) {
    ssize_t k = read(fd, buf + got, len - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return td_why(why, why_len, TD_EIO, "%s: read error: %s", path, strerror(errno));
    if (k == 0)
      return td_why(why, why_len, TD_ECORRUPT, "%s: truncated while reading", path);
    got += (size_t)k;
  }
  return 0;
}

/* Open a .npy file and parse its header; on success the descriptor is
 * positioned at the data. */
static int npy_open(int *fd, td_npy_header_t *h, const char *path, char *why, size_t why_len) {
  uint64_t file_bytes;
  int rc = td_file_open_regular(fd, path, TD__NPY_MAX_FILE_BYTES, &file_bytes, why, why_len);
  if (rc != 0)
    return rc;
  size_t prefix = file_bytes < 12 + TD_NPY_MAX_HEADER_BYTES ? (size_t)file_bytes
                                                            : 12 + TD_NPY_MAX_HEADER_BYTES;
  uint8_t *head = malloc(prefix + 1);
  if (head == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (rc == 0)
    rc = read_exact(*fd, head, prefix, path, why, why_len);
  if (rc == 0)
    rc = td_npy_parse_header(h, head, prefix, file_bytes, path, why, why_len);
  free(head);
  if (rc == 0 && lseek(*fd, (off_t)h->header_bytes, SEEK_SET) < 0)
    rc = td_why(why, why_len, TD_EIO, "%s: cannot seek: %s", path, strerror(errno));
  if (rc != 0) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

int td_dataset_load_npy(td_dataset_t **out, const char *x_path, const char *y_path, char *why,
                        size_t why_len) {
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (x_path == NULL || y_path == NULL)
    return td_why(why, why_len, TD_EINVAL, "npy loader needs a features and a labels path");
  int xfd = -1, yfd = -1;
  td_npy_header_t xh, yh;
  td_dataset_t *ds = NULL;
  uint8_t *slab = NULL;
  int rc = npy_open(&xfd, &xh, x_path, why, why_len);
  if (rc == 0 && xh.ndim < 1)
    rc = td_why(why, why_len, TD_ESHAPE, "%s: features must have a row axis, not be a scalar",
                x_path);
  if (rc == 0 && xh.dtype != TD_NPY_F4 && xh.dtype != TD_NPY_U1)
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: features must be float32 ('<f4') or uint8 ('|u1'), not integers", x_path);
  if (rc == 0 && xh.rows * xh.row_values > TD__DATASET_MAX_VALUES)
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: more than %llu values in all", x_path,
                (unsigned long long)TD__DATASET_MAX_VALUES);
  if (rc == 0)
    rc = npy_open(&yfd, &yh, y_path, why, why_len);
  if (rc == 0 && (yh.ndim != 1 || yh.dtype == TD_NPY_F4))
    rc = td_why(why, why_len, TD_ESHAPE,
                "%s: labels must be a 1-D integer array (int64, int32 or uint8) of shape (N,)",
                y_path);
  if (rc == 0 && yh.rows != xh.rows)
    rc = td_why(why, why_len, TD_ESHAPE, "%s has %llu rows but %s has %llu labels", x_path,
                (unsigned long long)xh.rows, y_path, (unsigned long long)yh.rows);
  if (rc != 0)
    goto done;
  /* uint8 features stay bytes (dataset_internal.h), standing for the v / 255.0f
   * td_npy_features would give */
  ds = xh.dtype == TD_NPY_U1 ? td__dataset_new_bytes((size_t)xh.rows, (size_t)xh.row_values)
                             : td__dataset_new((size_t)xh.rows, (size_t)xh.row_values);
  slab = malloc(TD__IDX_SLAB_BYTES);
  if (ds == NULL || slab == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %llu x %llu features",
                (unsigned long long)xh.rows, (unsigned long long)xh.row_values);
    goto done;
  }
  size_t total = ds->rows * ds->dim;
  for (size_t done = 0; done < total && rc == 0;) {
    size_t n = total - done;
    if (n > TD__IDX_SLAB_BYTES / xh.elem_bytes)
      n = TD__IDX_SLAB_BYTES / xh.elem_bytes;
    if (ds->b != NULL) {
      rc = read_exact(xfd, ds->b + done, n, x_path, why, why_len);
      done += n;
      continue;
    }
    rc = read_exact(xfd, slab, n * xh.elem_bytes, x_path, why, why_len);
    if (rc == 0)
      rc = td_npy_features(&xh, slab, n, done, ds->x + done, x_path, why, why_len);
    done += n;
  }
  int max_label = 0;
  for (size_t done = 0; done < ds->rows && rc == 0;) {
    size_t n = ds->rows - done;
    if (n > TD__IDX_SLAB_BYTES / yh.elem_bytes)
      n = TD__IDX_SLAB_BYTES / yh.elem_bytes;
    rc = read_exact(yfd, slab, n * yh.elem_bytes, y_path, why, why_len);
    if (rc == 0)
      rc = td_npy_labels(&yh, slab, n, done, ds->y + done, &max_label, y_path, why, why_len);
    done += n;
  }
  ds->classes = max_label + 1;
done:
  free(slab);
  if (xfd >= 0)
    close(xfd);
  if (yfd >= 0)
    close(yfd);
  if (rc != 0)
    td_dataset_close(&ds);
  *out = ds;
  return rc;
}
