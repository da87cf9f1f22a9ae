/* dataset_idx.c: the IDX reader (plain or gzip): whole, or only the rows a
 * partition picks with the statistics of the whole file.
 *
 * IDX files are read through zlib's gzFile, which passes plain files through
 * untouched, so one code path serves .gz and raw files. A file is never
 * trusted: the header's sizes are checked against the TD_DATASET_MAX_* limits
 * and against the bytes the file can actually hold before anything is
 * allocated from them, and the data must end exactly where the header says.
 * ubyte pixels stay bytes (the dataset's byte storage, dataset_internal.h:
 * a quarter of the floats' memory), read straight into the dataset; float
 * items are converted slab by slab from a small scratch buffer, so a load
 * holds the array plus one megabyte, never two copies.
 * Every file is opened through td_file_open_regular (compute/data/file.h). */
#include "compute/data/dataset_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/error.h"
#include "compute/data/file.h"

/* Deflate cannot expand by more than about 1032:1; a gzip file of N bytes
 * therefore cannot hold more than this many bytes of data. */
#define TD__GZIP_MAX_RATIO 1032u
#define TD__IDX_UBYTE 0x08
#define TD__IDX_FLOAT 0x0D
/* The largest IDX file worth opening: the value cap in floats plus a header. */
#define TD__IDX_MAX_FILE_BYTES (TD__DATASET_MAX_VALUES * 4 + 4 + 4 * 255)

/* One open IDX file and what its header declared. */
typedef struct {
  gzFile gz;
  const char *path;
  uint64_t file_bytes;   /* size on disk (compressed size for .gz) */
  uint8_t type;          /* 0x08 ubyte, 0x0D float, ... */
  int ndims;
  uint64_t items;        /* dims[0] */
  uint64_t item_values;  /* product of dims[1..] (1 for idx1) */
  uint64_t header_bytes; /* 4 + 4 * ndims */
  uint64_t data_read;    /* bytes of data consumed so far */
} idx_file_t;

static int idx_open(idx_file_t *f, const char *path, char *why, size_t why_len) {
  memset(f, 0, sizeof *f);
  f->path = path;
  int fd;
  int rc = td_file_open_regular(&fd, path, TD__IDX_MAX_FILE_BYTES, &f->file_bytes, why, why_len);
  if (rc != 0)
    return rc;
  f->gz = gzdopen(fd, "rb");
  if (f->gz == NULL) {
    close(fd);
    return td_why(why, why_len, TD_ENOMEM, "cannot read %s: out of memory", path);
  }
  gzbuffer(f->gz, 1u << 17);
  return 0;
}

static void idx_close(idx_file_t *f) {
  if (f->gz != NULL)
    gzclose(f->gz);
  f->gz = NULL;
}

/* zlib's verdict after a short or failed read: an OS error is TD_EIO, a bad
 * stream TD_ECORRUPT; 0 when the stream simply ended. */
static int idx_stream_error(idx_file_t *f, char *why, size_t why_len) {
  int zerr = Z_OK;
  const char *msg = gzerror(f->gz, &zerr);
  if (zerr == Z_ERRNO)
    return td_why(why, why_len, TD_EIO, "%s: read error: %s", f->path, strerror(errno));
  if (zerr == Z_MEM_ERROR)
    return td_why(why, why_len, TD_ENOMEM, "%s: out of memory while decompressing", f->path);
  if (zerr != Z_OK && zerr != Z_BUF_ERROR) /* Z_BUF_ERROR: ended early, reported as truncation */
    return td_why(why, why_len, TD_ECORRUPT, "%s: corrupt gzip data (%s)", f->path, msg);
  return 0;
}

/* Read up to len bytes; *got says how many arrived before the stream ended. */
static int idx_read(idx_file_t *f, void *buf, size_t len, size_t *got, char *why,
                    size_t why_len) {
  *got = 0;
  while (*got < len) {
    size_t want = len - *got;
    unsigned chunk = want > (1u << 30) ? (1u << 30) : (unsigned)want;
    int k = gzread(f->gz, (uint8_t *)buf + *got, chunk);
    if (k < 0) {
      int rc = idx_stream_error(f, why, why_len);
      return rc != 0 ? rc : td_why(why, why_len, TD_ECORRUPT, "%s: unreadable data", f->path);
    }
    if (k == 0)
      return idx_stream_error(f, why, why_len);
    *got += (size_t)k;
  }
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Header: 0 0 type ndims, then ndims big-endian u32 sizes. Checks the sizes
 * against the TD_DATASET_MAX_* limits; idx_check_size() then checks them
 * against the bytes present. */
static int idx_read_header(idx_file_t *f, char *why, size_t why_len) {
  uint8_t magic[4], raw[4 * 255];
  size_t got;
  int rc = idx_read(f, magic, 4, &got, why, why_len);
  if (rc != 0)
    return rc;
  if (got < 4)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: truncated: expected 4 bytes of IDX magic, found %zu", f->path, got);
  if (magic[0] != 0 || magic[1] != 0 || magic[3] == 0)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: not an IDX file (magic %02x %02x %02x %02x, expected 00 00 TYPE NDIMS)",
                  f->path, magic[0], magic[1], magic[2], magic[3]);
  f->type = magic[2];
  f->ndims = magic[3];
  f->header_bytes = 4 + 4 * (uint64_t)f->ndims;
  size_t dims_len = 4 * (size_t)f->ndims;
  if ((rc = idx_read(f, raw, dims_len, &got, why, why_len)) != 0)
    return rc;
  if (got < dims_len)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: truncated: expected %zu bytes of IDX dimensions, found %zu", f->path,
                  dims_len, got);
  f->items = be32(raw);
  f->item_values = 1;
  for (int i = 1; i < f->ndims; i++) {
    uint64_t d = be32(raw + 4 * i);
    /* saturate instead of overflowing; the limit check below rejects it */
    f->item_values = d == 0 ? 0
                     : f->item_values > TD_DATASET_MAX_DIM ? f->item_values
                                                            : f->item_values * d;
  }
  if (f->items == 0 || f->item_values == 0)
    return td_why(why, why_len, TD_ECORRUPT, "%s: IDX header declares an empty array", f->path);
  if (f->items > TD_DATASET_MAX_ROWS || f->item_values > TD_DATASET_MAX_DIM ||
      f->items * f->item_values > TD__DATASET_MAX_VALUES)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: IDX header declares %llu items of %llu values, beyond the limits "
                  "(%u items, %u values per item, %llu values in all)",
                  f->path, (unsigned long long)f->items, (unsigned long long)f->item_values,
                  TD_DATASET_MAX_ROWS, TD_DATASET_MAX_DIM,
                  (unsigned long long)TD__DATASET_MAX_VALUES);
  return 0;
}

static uint64_t idx_elem_bytes(const idx_file_t *f) { return f->type == TD__IDX_FLOAT ? 4 : 1; }
static uint64_t idx_data_bytes(const idx_file_t *f) {
  return f->items * f->item_values * idx_elem_bytes(f);
}

/* Before allocating: can this file hold the data its header declares? A plain
 * file must hold exactly that many bytes; a gzip file at least its share of
 * them at deflate's best ratio (the exact check happens while reading). */
static int idx_check_size(const idx_file_t *f, char *why, size_t why_len) {
  uint64_t need = idx_data_bytes(f);
  if (gzdirect(f->gz)) {
    uint64_t have = f->file_bytes > f->header_bytes ? f->file_bytes - f->header_bytes : 0;
    if (have < need)
      return td_why(why, why_len, TD_ECORRUPT,
                    "%s: truncated: expected %llu bytes of data, found %llu", f->path,
                    (unsigned long long)need, (unsigned long long)have);
    if (have > need)
      return td_why(why, why_len, TD_ECORRUPT,
                    "%s: %llu bytes after the %llu bytes of data the IDX header declares",
                    f->path, (unsigned long long)(have - need), (unsigned long long)need);
  } else if (need / TD__GZIP_MAX_RATIO > f->file_bytes) {
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: truncated: expected %llu bytes of data, more than a %llu-byte gzip "
                  "file can hold",
                  f->path, (unsigned long long)need, (unsigned long long)f->file_bytes);
  }
  return 0;
}

/* Read the next len data bytes; a short read is reported as truncation with
 * the totals (expected and found) for the whole data section. */
static int idx_read_data(idx_file_t *f, void *buf, size_t len, char *why, size_t why_len) {
  size_t got;
  int rc = idx_read(f, buf, len, &got, why, why_len);
  f->data_read += got;
  if (rc == 0 && got < len)
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: truncated: expected %llu bytes of data, found %llu",
                f->path, (unsigned long long)idx_data_bytes(f),
                (unsigned long long)f->data_read);
  return rc;
}

/* The data must end where the header says; reading past it also makes zlib
 * verify the gzip trailer (CRC and length). */
static int idx_expect_end(idx_file_t *f, char *why, size_t why_len) {
  uint8_t extra[64];
  size_t got;
  int rc = idx_read(f, extra, sizeof extra, &got, why, why_len);
  if (rc != 0)
    return rc;
  if (got > 0)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: more data than the %llu bytes the IDX header declares", f->path,
                  (unsigned long long)idx_data_bytes(f));
  return 0;
}

/* The next n values of the image data (n * element bytes at most one slab)
 * into dst as floats; `done`: values read before, `dim`: values per item (for
 * the error's item number). */
static int idx_convert(idx_file_t *f, uint8_t *slab, float *dst, size_t n, size_t done,
                       size_t dim, char *why, size_t why_len) {
  int rc = idx_read_data(f, slab, n * (size_t)idx_elem_bytes(f), why, why_len);
  if (rc != 0)
    return rc;
  if (f->type == TD__IDX_UBYTE) {
    /* v / 255.0f exactly (a multiply by 1/255 is off by an ulp for some v) */
    float ubyte_scale[256];
    for (int v = 0; v < 256; v++)
      ubyte_scale[v] = (float)v / 255.0f;
    for (size_t i = 0; i < n; i++)
      dst[i] = ubyte_scale[slab[i]];
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = be32(slab + 4 * i);
    float v;
    memcpy(&v, &bits, sizeof v);
    if (!isfinite(v))
      return td_why(why, why_len, TD_ECORRUPT, "%s: non-finite value in item %zu", f->path,
                    (done + i) / dim);
    dst[i] = v;
  }
  return 0;
}

/* Values per slab: TD__IDX_SLAB_BYTES of the file's elements. */
static size_t idx_slab_values(const idx_file_t *f) {
  return TD__IDX_SLAB_BYTES / (size_t)idx_elem_bytes(f);
}

/* Stream the image data into ds: ubyte straight into its bytes, floats
 * converted as they come. */
static int idx_read_images(idx_file_t *f, td_dataset_t *ds, uint8_t *slab, char *why,
                           size_t why_len) {
  size_t total = ds->rows * ds->dim, done = 0;
  while (done < total) {
    size_t n = total - done < idx_slab_values(f) ? total - done : idx_slab_values(f);
    int rc = ds->b != NULL ? idx_read_data(f, ds->b + done, n, why, why_len)
                           : idx_convert(f, slab, ds->x + done, n, done, ds->dim, why, why_len);
    if (rc != 0)
      return rc;
    done += n;
  }
  return idx_expect_end(f, why, why_len);
}

static int idx_read_label_array(idx_file_t *f, int32_t *y, size_t rows, int *classes,
                                 uint8_t *slab, char *why, size_t why_len) {
  int max_label = 0;
  for (size_t done = 0; done < rows;) {
    size_t n = rows - done;
    if (n > TD__IDX_SLAB_BYTES)
      n = TD__IDX_SLAB_BYTES;
    int rc = idx_read_data(f, slab, n, why, why_len);
    if (rc != 0)
      return rc;
    for (size_t i = 0; i < n; i++) {
      y[done + i] = slab[i];
      if (slab[i] > max_label)
        max_label = slab[i];
    }
    done += n;
  }
  *classes = max_label + 1;
  return idx_expect_end(f, why, why_len);
}

static int idx_read_labels(idx_file_t *f, td_dataset_t *ds, uint8_t *slab, char *why,
                           size_t why_len) {
  return idx_read_label_array(f, ds->y, ds->rows, &ds->classes, slab, why, why_len);
}

/* Open an image file and its label file and check both headers and sizes,
 * before anything large is allocated. On failure both are closed. */
static int idx_open_pair(idx_file_t *img, idx_file_t *lab, const char *images_path,
                         const char *labels_path, char *why, size_t why_len) {
  memset(lab, 0, sizeof *lab);
  int rc = idx_open(img, images_path, why, why_len);
  if (rc == 0)
    rc = idx_read_header(img, why, why_len);
  if (rc != 0)
    goto fail;
  if (img->type != TD__IDX_UBYTE && img->type != TD__IDX_FLOAT) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: unsupported IDX data type 0x%02x (supported: 0x08 ubyte, 0x0D float)",
                images_path, img->type);
    goto fail;
  }
  if ((rc = idx_check_size(img, why, why_len)) != 0)
    goto fail;
  /* the label header too is checked before the big allocation */
  if ((rc = idx_open(lab, labels_path, why, why_len)) != 0 ||
      (rc = idx_read_header(lab, why, why_len)) != 0)
    goto fail;
  if (lab->type != TD__IDX_UBYTE || lab->ndims != 1) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: labels must be an idx1 ubyte file (type 0x08, 1 dimension), found type "
                "0x%02x with %d dimensions",
                labels_path, lab->type, lab->ndims);
    goto fail;
  }
  if (lab->items != img->items) {
    rc = td_why(why, why_len, TD_ESHAPE, "%s has %llu images but %s has %llu labels",
                images_path, (unsigned long long)img->items, labels_path,
                (unsigned long long)lab->items);
    goto fail;
  }
  if ((rc = idx_check_size(lab, why, why_len)) != 0)
    goto fail;
  return 0;
fail:
  idx_close(img);
  idx_close(lab);
  return rc;
}

int td_dataset_load_idx(td_dataset_t **out, const char *images_path, const char *labels_path,
                        char *why, size_t why_len) {
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (images_path == NULL || labels_path == NULL)
    return td_why(why, why_len, TD_EINVAL, "IDX loader needs an image and a label path");
  idx_file_t img, lab;
  int rc = idx_open_pair(&img, &lab, images_path, labels_path, why, why_len);
  if (rc != 0)
    return rc;
  td_dataset_t *ds = img.type == TD__IDX_UBYTE
                         ? td__dataset_new_bytes((size_t)img.items, (size_t)img.item_values)
                         : td__dataset_new((size_t)img.items, (size_t)img.item_values);
  uint8_t *slab = malloc(TD__IDX_SLAB_BYTES);
  if (ds == NULL || slab == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %llu x %llu features",
                (unsigned long long)img.items, (unsigned long long)img.item_values);
  if (rc == 0)
    rc = idx_read_images(&img, ds, slab, why, why_len);
  if (rc == 0)
    rc = idx_read_labels(&lab, ds, slab, why, why_len);
  free(slab);
  idx_close(&img);
  idx_close(&lab);
  if (rc != 0)
    td_dataset_close(&ds);
  *out = ds;
  return rc;
}

/* What td_dataset_load_idx_rows needs while it streams the images twice. */
typedef struct {
  idx_file_t img;
  uint8_t *slab;
  float *vals;        /* one slab of converted values */
  const int64_t *pos; /* by row: its place in the result, -1 when not kept */
  td_dataset_t *ds;   /* the kept rows */
} rows_load_t;

/* One pass over every value of the image file: the sum (pass 1, mean NAN),
 * or the squared deviations from `mean` with the kept rows copied (pass 2),
 * in the order td_dataset_stats() adds them, so the figures are its. */
static int rows_pass(rows_load_t *r, double mean, double *acc, char *why, size_t why_len) {
  idx_file_t *f = &r->img;
  size_t dim = (size_t)f->item_values, total = (size_t)f->items * dim, done = 0;
  double sum = 0;
  while (done < total) {
    size_t n = total - done < idx_slab_values(f) ? total - done : idx_slab_values(f);
    int rc = idx_convert(f, r->slab, r->vals, n, done, dim, why, why_len);
    if (rc != 0)
      return rc;
    for (size_t i = 0; i < n; i++) {
      if (isnan(mean)) {
        sum += r->vals[i];
        continue;
      }
      double d = r->vals[i] - mean;
      sum += d * d;
      size_t at = done + i;
      int64_t p = r->pos[at / dim];
      if (p >= 0 && r->ds->b != NULL) /* ubyte: the byte, which stands for vals[i] */
        r->ds->b[(size_t)p * dim + at % dim] = r->slab[i];
      else if (p >= 0)
        r->ds->x[(size_t)p * dim + at % dim] = r->vals[i];
    }
    done += n;
  }
  *acc = sum;
  return idx_expect_end(f, why, why_len);
}

int td_dataset_load_idx_rows(td_dataset_t **out, const char *images_path,
                             const char *labels_path, td_dataset_pick_fn pick, void *user,
                             double *mean, double *std, size_t *full_rows, char *why,
                             size_t why_len) {
  if (out == NULL || pick == NULL || mean == NULL || std == NULL || full_rows == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (images_path == NULL || labels_path == NULL)
    return td_why(why, why_len, TD_EINVAL, "IDX loader needs an image and a label path");
  rows_load_t r = {0};
  idx_file_t lab;
  int rc = idx_open_pair(&r.img, &lab, images_path, labels_path, why, why_len);
  if (rc != 0)
    return rc;
  size_t rows = (size_t)r.img.items, dim = (size_t)r.img.item_values, count = 0;
  int32_t *labels = malloc((rows ? rows : 1) * sizeof *labels);
  int64_t *pos = malloc((rows ? rows : 1) * sizeof *pos);
  uint32_t *idx = NULL;
  int classes = 0;
  r.slab = malloc(TD__IDX_SLAB_BYTES);
  r.vals = malloc(idx_slab_values(&r.img) * sizeof(float));
  r.pos = pos;
  if (labels == NULL || pos == NULL || r.slab == NULL || r.vals == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %zu labels", rows);
  if (rc == 0)
    rc = idx_read_label_array(&lab, labels, rows, &classes, r.slab, why, why_len);
  idx_close(&lab);
  if (rc == 0)
    rc = pick(labels, rows, classes, user, &idx, &count, why, why_len);
  for (size_t i = 0; rc == 0 && i < rows; i++)
    pos[i] = -1;
  for (size_t k = 0; rc == 0 && k < count; k++) {
    if (idx[k] >= rows || pos[idx[k]] >= 0) /* a row twice: not a partition */
      rc = td_why(why, why_len, TD_EINVAL, "row %u picked twice or out of range", idx[k]);
    else
      pos[idx[k]] = (int64_t)k;
  }
  if (rc == 0 && (r.ds = r.img.type == TD__IDX_UBYTE ? td__dataset_new_bytes(count, dim)
                                                      : td__dataset_new(count, dim)) == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %zu x %zu features", count, dim);
  double sum = 0, sq = 0;
  if (rc == 0)
    rc = rows_pass(&r, NAN, &sum, why, why_len);
  double m = rows * dim > 0 ? sum / (double)(rows * dim) : 0;
  if (rc == 0) { /* the second pass reads the file from its start again */
    idx_close(&r.img);
    rc = idx_open(&r.img, images_path, why, why_len);
    if (rc == 0)
      rc = idx_read_header(&r.img, why, why_len);
    if (rc == 0 && ((size_t)r.img.items != rows || (size_t)r.img.item_values != dim))
      rc = td_why(why, why_len, TD_ECORRUPT, "%s changed while it was read", images_path);
  }
  if (rc == 0)
    rc = rows_pass(&r, m, &sq, why, why_len);
  if (rc == 0) {
    for (size_t k = 0; k < count; k++)
      r.ds->y[k] = labels[idx[k]];
    r.ds->classes = classes;
    *mean = m;
    *std = rows * dim > 0 ? sqrt(sq / (double)(rows * dim)) : 0;
    *full_rows = rows;
  }
  idx_close(&r.img);
  free(labels);
  free(pos);
  free(idx);
  free(r.slab);
  free(r.vals);
  if (rc != 0)
    td_dataset_close(&r.ds);
  *out = r.ds;
  return rc;
}
