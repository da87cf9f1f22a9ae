/* dataset.c: IDX (plain or gzip) and CSV readers, the `dataset` run key,
 * statistics, normalisation, subsets and in-place shuffling.
 *
 * IDX files are read through zlib's gzFile, which passes plain files through
 * untouched, so one code path serves .gz and raw files. A file is never
 * trusted: the header's sizes are checked against the TD_DATASET_MAX_* limits
 * and against the bytes the file can actually hold before anything is
 * allocated from them, and the data must end exactly where the header says.
 * Pixels are converted slab by slab from a small scratch buffer, so loading
 * Fashion-MNIST holds the float array plus one megabyte, never two copies.
 * Every file is opened through td_file_open_regular (compute/data/file.h): without
 * blocking, and only if it is a regular file, so a FIFO or a device path fails
 * at once instead of hanging the thread that loads it (the compute thread of a
 * run, which must always see a stop). */
#include "compute/data/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/error.h"
#include "compute/data/file.h"
#include "compute/data/images.h"
#include "compute/data/npy.h"

struct td_dataset {
  size_t rows, dim;
  int classes;
  float *x;   /* rows x dim, row-major */
  int32_t *y; /* rows */
};

/* Beyond the per-axis limits, a cap on rows x dim: 2^32 floats is 16 GiB. */
#define TD__DATASET_MAX_VALUES ((uint64_t)1 << 32)
/* Deflate cannot expand by more than about 1032:1; a gzip file of N bytes
 * therefore cannot hold more than this many bytes of data. */
#define TD__GZIP_MAX_RATIO 1032u
/* Bytes converted per read; a multiple of 4 so floats never straddle reads. */
#define TD__IDX_SLAB_BYTES ((size_t)1 << 20)
#define TD__IDX_UBYTE 0x08
#define TD__IDX_FLOAT 0x0D
/* The largest IDX file worth opening: the value cap in floats plus a header. */
#define TD__IDX_MAX_FILE_BYTES (TD__DATASET_MAX_VALUES * 4 + 4 + 4 * 255)
/* The largest CSV file: 64 GiB of text (the row and value caps bind first). */
#define TD__CSV_MAX_FILE_BYTES ((uint64_t)1 << 36)

static td_dataset_t *dataset_new(size_t rows, size_t dim) {
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

/* ---- IDX --------------------------------------------------------------------- */

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

/* Stream the image data into ds->x, converting as it goes. */
static int idx_read_images(idx_file_t *f, td_dataset_t *ds, uint8_t *slab, char *why,
                           size_t why_len) {
  size_t total = ds->rows * ds->dim, done = 0;
  while (done < total) {
    size_t n = total - done < idx_slab_values(f) ? total - done : idx_slab_values(f);
    int rc = idx_convert(f, slab, ds->x + done, n, done, ds->dim, why, why_len);
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
  td_dataset_t *ds = dataset_new((size_t)img.items, (size_t)img.item_values);
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
      if (p >= 0)
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
  if (rc == 0 && (r.ds = dataset_new(count, dim)) == NULL)
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

/* ---- CSV ------------------------------------------------------------------------ */

static size_t csv_columns(const char *line) {
  size_t n = 1;
  for (const char *p = line; *p != '\0'; p++)
    n += *p == ',';
  return n;
}

/* Parse a line of exactly `cols` comma-separated numbers into vals. Returns 0,
 * or the 1-based column that is not a number. Overflow parses as +-inf and is
 * caught by the finiteness check; underflow to a tiny value is accepted. */
static size_t csv_parse(char *line, double *vals, size_t cols) {
  char *p = line;
  for (size_t c = 0; c < cols; c++) {
    char *end;
    vals[c] = strtod(p, &end);
    if (end == p)
      return c + 1;
    p = end;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
      p++;
    if (c + 1 < cols ? *p != ',' : *p != '\0')
      return c + 1;
    p++;
  }
  return 0;
}

static int csv_is_blank(const char *line) {
  return line[strspn(line, " \t\r\n")] == '\0';
}

int td_dataset_load_csv(td_dataset_t **out, const char *path, char *why, size_t why_len) {
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (path == NULL)
    return td_why(why, why_len, TD_EINVAL, "CSV loader needs a path");
  int fd;
  uint64_t file_bytes;
  int open_rc = td_file_open_regular(&fd, path, TD__CSV_MAX_FILE_BYTES, &file_bytes, why,
                                     why_len);
  if (open_rc != 0)
    return open_rc;
  FILE *f = fdopen(fd, "r");
  if (f == NULL) {
    close(fd);
    return td_why(why, why_len, TD_ENOMEM, "cannot read %s: out of memory", path);
  }
  char *line = NULL;
  size_t line_cap = 0, rows = 0, row_cap = 0, cols = 0, vals_cap = 0;
  double *vals = NULL;
  float *x = NULL;
  int32_t *y = NULL;
  int rc = 0, max_label = 0, seen_content = 0;
  unsigned long lineno = 0;
  while (getline(&line, &line_cap, f) >= 0) {
    lineno++;
    if (csv_is_blank(line))
      continue;
    int first = !seen_content;
    seen_content = 1;
    size_t n = csv_columns(line);
    if (cols != 0 && n != cols) {
      rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: %zu columns, expected %zu", path,
                  lineno, n, cols);
      break;
    }
    if (n > vals_cap) {
      double *grown = realloc(vals, n * sizeof *vals);
      if (grown == NULL) {
        rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
        break;
      }
      vals = grown;
      vals_cap = n;
    }
    size_t bad_col = csv_parse(line, vals, n);
    if (bad_col != 0) {
      if (first)
        continue; /* a header line */
      rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: column %zu is not a number", path,
                  lineno, bad_col);
      break;
    }
    if (cols == 0) {
      if (n < 2 || n - 1 > TD_DATASET_MAX_DIM) {
        rc = td_why(why, why_len, TD_ECORRUPT,
                    "%s:%lu: %zu columns; need a label and 1..%u features", path, lineno, n,
                    TD_DATASET_MAX_DIM);
        break;
      }
      cols = n;
    }
    double label = vals[0];
    if (!(label >= 0) || label >= TD_DATASET_MAX_CLASSES || label != floor(label)) {
      rc = td_why(why, why_len, TD_ECORRUPT,
                  "%s:%lu: label %g is not an integer in [0, %d)", path, lineno, label,
                  TD_DATASET_MAX_CLASSES);
      break;
    }
    for (size_t c = 1; c < cols && rc == 0; c++)
      if (!isfinite(vals[c]))
        rc = td_why(why, why_len, TD_ECORRUPT,
                    "%s:%lu: column %zu: non-finite feature %g", path, lineno, c + 1,
                    vals[c]);
    if (rc != 0)
      break;
    size_t dim = cols - 1;
    if (rows == row_cap) {
      if (rows >= TD_DATASET_MAX_ROWS) {
        rc = td_why(why, why_len, TD_ECORRUPT, "%s: more than %u rows", path,
                    TD_DATASET_MAX_ROWS);
        break;
      }
      size_t new_cap = row_cap ? row_cap * 2 : 1024;
      if (new_cap > TD_DATASET_MAX_ROWS)
        new_cap = TD_DATASET_MAX_ROWS;
      float *nx = realloc(x, new_cap * dim * sizeof *x);
      if (nx != NULL)
        x = nx;
      int32_t *ny = nx != NULL ? realloc(y, new_cap * sizeof *y) : NULL;
      if (ny != NULL)
        y = ny;
      if (nx == NULL || ny == NULL) {
        rc = td_why(why, why_len, TD_ENOMEM, "out of memory after %zu rows of %s", rows, path);
        break;
      }
      row_cap = new_cap;
    }
    for (size_t c = 0; c < dim; c++)
      x[rows * dim + c] = (float)vals[c + 1];
    y[rows] = (int32_t)label;
    if (y[rows] > max_label)
      max_label = y[rows];
    rows++;
  }
  if (rc == 0 && ferror(f))
    rc = td_why(why, why_len, TD_EIO, "%s: read error", path);
  if (rc == 0 && rows == 0)
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: no data rows", path);
  fclose(f);
  free(line);
  free(vals);
  td_dataset_t *ds = rc == 0 ? calloc(1, sizeof *ds) : NULL;
  if (rc == 0 && ds == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (rc != 0) {
    free(x);
    free(y);
    return rc;
  }
  /* give back the growth slack; failing to shrink is harmless */
  float *fx = realloc(x, rows * (cols - 1) * sizeof *x);
  int32_t *fy = realloc(y, rows * sizeof *y);
  ds->rows = rows;
  ds->dim = cols - 1;
  ds->x = fx != NULL ? fx : x;
  ds->y = fy != NULL ? fy : y;
  ds->classes = max_label + 1;
  *out = ds;
  return 0;
}

/* ---- NumPy .npy ------------------------------------------------------------------ */

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
  ds = dataset_new((size_t)xh.rows, (size_t)xh.row_values);
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

/* ---- images:DIR (the folder walk is images.c) --------------------------------------- */

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

/* ---- the `dataset` run key ----------------------------------------------------- */

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
  td_dataset_t *ds = dataset_new(n, src->dim);
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
  size_t dim = ds->dim;
  for (size_t i = ds->rows; i > 1; i--) {
    size_t j = shuffle_below(rng, i), last = i - 1;
    if (j == last)
      continue;
    swap_rows(ds->x + last * dim, ds->x + j * dim, dim);
    int32_t t = ds->y[last];
    ds->y[last] = ds->y[j];
    ds->y[j] = t;
  }
}
