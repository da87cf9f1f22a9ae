/* dataset.c: IDX (plain or gzip) and CSV readers, normalisation, subsets and
 * in-place shuffling.
 *
 * Files are read through zlib's gzFile, which reads plain files as they are,
 * so one code path serves .gz and raw IDX. Every size in a header is checked
 * against the limits and against the bytes actually present before anything
 * is allocated from it. */
#include "compute/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "compute/error.h"

struct td_dataset {
  size_t rows, dim;
  int classes;
  float *x;
  int32_t *y;
};

static td_dataset_t *dataset_new(size_t rows, size_t dim) {
  td_dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL)
    return NULL;
  ds->rows = rows;
  ds->dim = dim;
  size_t numel = rows * dim;
  ds->x = malloc((numel > 0 ? numel : 1) * sizeof(float));
  ds->y = malloc((rows ? rows : 1) * sizeof(int32_t));
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

/* ---- IDX ------------------------------------------------------------------------ */

typedef struct {
  gzFile gz;
  const char *path;
} reader_t;

static int open_reader(reader_t *r, const char *path, char *why, size_t n) {
  struct stat st;
  r->path = path;
  r->gz = NULL;
  if (stat(path, &st) != 0)
    return td_why(why, n, errno == ENOENT ? TD_ENOENT : TD_EIO, "cannot open %s: %s", path,
                  strerror(errno));
  r->gz = gzopen(path, "rb");
  if (r->gz == NULL)
    return td_why(why, n, TD_EIO, "cannot open %s: %s", path, strerror(errno));
  gzbuffer(r->gz, 1 << 17);
  return 0;
}

/* Read exactly len bytes; a short read is truncation, a zlib error corruption. */
static int read_exact(reader_t *r, void *buf, size_t len, const char *what, char *why, size_t n) {
  size_t got = 0;
  while (got < len) {
    unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
    int k = gzread(r->gz, (uint8_t *)buf + got, chunk);
    if (k < 0) {
      int err;
      const char *msg = gzerror(r->gz, &err);
      return td_why(why, n, TD_ECORRUPT, "%s: corrupt gzip data (%s)", r->path, msg);
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  if (got < len) {
    int err = Z_OK;
    const char *msg = gzerror(r->gz, &err);
    if (err != Z_OK && err != Z_BUF_ERROR)
      return td_why(why, n, TD_ECORRUPT, "%s: corrupt gzip data (%s)", r->path, msg);
    return td_why(why, n, TD_ECORRUPT, "%s: truncated: expected %zu bytes of %s, found %zu",
                  r->path, len, what, got);
  }
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Header: 0 0 type ndims, then ndims big-endian u32 sizes. */
static int read_idx_header(reader_t *r, uint8_t *type, uint32_t *dims, int *ndims, char *why,
                           size_t n) {
  uint8_t magic[4];
  int rc = read_exact(r, magic, 4, "IDX header", why, n);
  if (rc != 0)
    return rc;
  if (magic[0] != 0 || magic[1] != 0 || magic[3] == 0 || magic[3] > 4)
    return td_why(why, n, TD_ECORRUPT, "%s: not an IDX file (bad magic %02x %02x %02x %02x)",
                  r->path, magic[0], magic[1], magic[2], magic[3]);
  *type = magic[2];
  *ndims = magic[3];
  uint8_t raw[16];
  if ((rc = read_exact(r, raw, 4u * magic[3], "IDX dimensions", why, n)) != 0)
    return rc;
  for (int i = 0; i < *ndims; i++)
    dims[i] = be32(raw + 4 * i);
  return 0;
}

/* Any trailing byte after the data means the header lied about the sizes. */
static int expect_end(reader_t *r, char *why, size_t n) {
  uint8_t extra;
  int k = gzread(r->gz, &extra, 1);
  if (k < 0)
    return td_why(why, n, TD_ECORRUPT, "%s: corrupt gzip data", r->path);
  if (k > 0)
    return td_why(why, n, TD_ECORRUPT, "%s: more data than the IDX header declares", r->path);
  return 0;
}

int td_dataset_load_idx(td_dataset_t **out, const char *images_path, const char *labels_path,
                        char *why, size_t why_len) {
  *out = NULL;
  reader_t ri = {0}, rl = {0};
  td_dataset_t *ds = NULL;
  uint8_t *raw = NULL;
  uint8_t type, ltype;
  uint32_t dims[4], ldims[4];
  int nd, lnd;
  int rc = open_reader(&ri, images_path, why, why_len);
  if (rc == 0)
    rc = read_idx_header(&ri, &type, dims, &nd, why, why_len);
  if (rc != 0)
    goto done;
  if (type != 0x08 && type != 0x0D) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: unsupported IDX data type 0x%02x (supported: 0x08 ubyte, 0x0D float)",
                images_path, type);
    goto done;
  }
  size_t rows = dims[0], dim = 1;
  for (int i = 1; i < nd; i++) {
    if (dims[i] == 0 || dim > TD_DATASET_MAX_DIM / dims[i]) {
      dim = TD_DATASET_MAX_DIM + 1;
      break;
    }
    dim *= dims[i];
  }
  if (rows == 0 || rows > TD_DATASET_MAX_ROWS || dim == 0 || dim > TD_DATASET_MAX_DIM ||
      rows * dim > (size_t)1 << 31) {
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: IDX header declares %zu items of %zu values, beyond the limits "
                "(%u items, %u values)",
                images_path, rows, dim, TD_DATASET_MAX_ROWS, TD_DATASET_MAX_DIM);
    goto done;
  }
  if ((rc = open_reader(&rl, labels_path, why, why_len)) != 0 ||
      (rc = read_idx_header(&rl, &ltype, ldims, &lnd, why, why_len)) != 0)
    goto done;
  if (ltype != 0x08 || lnd != 1) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: labels must be a 1-dimensional ubyte IDX file",
                labels_path);
    goto done;
  }
  if (ldims[0] != rows) {
    rc = td_why(why, why_len, TD_ESHAPE, "%s has %zu images but %s has %u labels", images_path,
                rows, labels_path, ldims[0]);
    goto done;
  }
  ds = dataset_new(rows, dim);
  if (ds == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %zu x %zu features", rows, dim);
    goto done;
  }
  /* Read in slabs so at most one small raw buffer exists beside the floats. */
  size_t elem = type == 0x08 ? 1 : 4;
  size_t slab_rows = (1u << 22) / (dim * elem) + 1;
  raw = malloc(slab_rows * dim * elem);
  if (raw == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    goto done;
  }
  for (size_t r0 = 0; r0 < rows; r0 += slab_rows) {
    size_t nr = rows - r0 < slab_rows ? rows - r0 : slab_rows;
    if ((rc = read_exact(&ri, raw, nr * dim * elem, "image data", why, why_len)) != 0)
      goto done;
    float *dst = ds->x + r0 * dim;
    if (type == 0x08) {
      for (size_t i = 0; i < nr * dim; i++)
        dst[i] = (float)raw[i] * (1.0f / 255.0f);
    } else {
      for (size_t i = 0; i < nr * dim; i++) {
        uint32_t bits = be32(raw + 4 * i);
        float v;
        memcpy(&v, &bits, 4);
        if (!isfinite(v)) {
          rc = td_why(why, why_len, TD_ECORRUPT, "%s: non-finite value in item %zu",
                      images_path, r0 + i / dim);
          goto done;
        }
        dst[i] = v;
      }
    }
  }
  if ((rc = expect_end(&ri, why, why_len)) != 0)
    goto done;
  uint8_t *labels = malloc(rows);
  if (labels == NULL) {
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    goto done;
  }
  rc = read_exact(&rl, labels, rows, "labels", why, why_len);
  if (rc == 0)
    rc = expect_end(&rl, why, why_len);
  int maxl = 0;
  for (size_t i = 0; rc == 0 && i < rows; i++) {
    ds->y[i] = labels[i];
    if (labels[i] > maxl)
      maxl = labels[i];
  }
  free(labels);
  ds->classes = maxl + 1;
done:
  free(raw);
  if (ri.gz)
    gzclose(ri.gz);
  if (rl.gz)
    gzclose(rl.gz);
  if (rc != 0)
    td_dataset_close(&ds);
  *out = ds;
  return rc;
}

/* ---- CSV -------------------------------------------------------------------------- */

/* Parse one line into label + values; returns the number of columns or -1. */
static long parse_csv_line(char *line, double *vals, size_t cap) {
  long n = 0;
  char *p = line;
  for (;;) {
    while (*p == ' ' || *p == '\t')
      p++;
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno == ERANGE)
      return -1;
    if ((size_t)n < cap)
      vals[n] = v;
    n++;
    p = end;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
      p++;
    if (*p == '\0')
      return n;
    if (*p != ',')
      return -1;
    p++;
  }
}

int td_dataset_load_csv(td_dataset_t **out, const char *path, char *why, size_t why_len) {
  *out = NULL;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return td_why(why, why_len, errno == ENOENT ? TD_ENOENT : TD_EIO, "cannot open %s: %s", path,
                  strerror(errno));
  char *line = NULL;
  size_t line_cap = 0;
  ssize_t len;
  size_t rows = 0, cap_rows = 0;
  long cols = -1;
  float *x = NULL;
  int32_t *y = NULL;
  double *vals = NULL;
  int rc = 0, maxl = 0;
  unsigned long lineno = 0;
  while ((len = getline(&line, &line_cap, f)) >= 0) {
    lineno++;
    if (len == 0 || line[0] == '\n' || (line[0] == '\r' && line[1] == '\n'))
      continue;
    if (cols < 0 && vals == NULL) {
      size_t commas = 1;
      for (char *p = line; *p; p++)
        commas += *p == ',';
      vals = malloc(commas * sizeof *vals);
      if (vals == NULL) {
        rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
        break;
      }
    }
    long n = parse_csv_line(line, vals, cols < 0 ? (size_t)-1 : (size_t)cols);
    if (n < 0) {
      if (rows == 0 && cols < 0 && lineno == 1)
        continue; /* a header line */
      rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: not a row of numbers", path, lineno);
      break;
    }
    if (cols < 0) {
      cols = n;
      if (cols < 2 || (size_t)(cols - 1) > TD_DATASET_MAX_DIM) {
        rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: %ld columns (need a label and 1..%u features)",
                    path, lineno, cols, TD_DATASET_MAX_DIM);
        break;
      }
    } else if (n != cols) {
      rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: %ld columns, expected %ld", path, lineno,
                  n, cols);
      break;
    }
    double label = vals[0];
    if (!(label >= 0) || label >= TD_DATASET_MAX_CLASSES || label != floor(label)) {
      rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: label %g is not an integer in [0, %d)",
                  path, lineno, label, TD_DATASET_MAX_CLASSES);
      break;
    }
    if (rows == cap_rows) {
      if (rows >= TD_DATASET_MAX_ROWS) {
        rc = td_why(why, why_len, TD_ECORRUPT, "%s: more than %u rows", path, TD_DATASET_MAX_ROWS);
        break;
      }
      cap_rows = cap_rows ? cap_rows * 2 : 1024;
      float *nx = realloc(x, cap_rows * (size_t)(cols - 1) * sizeof *x);
      int32_t *ny = nx ? realloc(y, cap_rows * sizeof *y) : NULL;
      if (nx)
        x = nx;
      if (ny)
        y = ny;
      if (nx == NULL || ny == NULL) {
        rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
        break;
      }
    }
    for (long c = 1; c < cols; c++) {
      if (!isfinite(vals[c])) {
        rc = td_why(why, why_len, TD_ECORRUPT, "%s:%lu: non-finite feature", path, lineno);
        break;
      }
      x[rows * (size_t)(cols - 1) + (size_t)(c - 1)] = (float)vals[c];
    }
    if (rc != 0)
      break;
    y[rows] = (int32_t)label;
    if (y[rows] > maxl)
      maxl = y[rows];
    rows++;
  }
  if (rc == 0 && ferror(f))
    rc = td_why(why, why_len, TD_EIO, "%s: read error", path);
  if (rc == 0 && rows == 0)
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: no data rows", path);
  fclose(f);
  free(line);
  free(vals);
  if (rc != 0) {
    free(x);
    free(y);
    return rc;
  }
  td_dataset_t *ds = calloc(1, sizeof *ds);
  if (ds == NULL) {
    free(x);
    free(y);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  ds->rows = rows;
  ds->dim = (size_t)(cols - 1);
  ds->x = x;
  ds->y = y;
  ds->classes = maxl + 1;
  *out = ds;
  return 0;
}

/* ---- the `dataset` run key ------------------------------------------------------ */

static int split_paths(const char *list, char parts[4][1024], int *count) {
  *count = 0;
  const char *p = list;
  while (*count < 4) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0 || len >= 1024)
      return -1;
    memcpy(parts[*count], p, len);
    parts[*count][len] = '\0';
    (*count)++;
    if (comma == NULL)
      return 0;
    p = comma + 1;
  }
  return -1;
}

int td_dataset_open(td_dataset_t **train, td_dataset_t **test, const char *spec, char *why,
                    size_t why_len) {
  *train = *test = NULL;
  char parts[4][1024];
  int count = 0, rc;
  if (strcmp(spec, "fashion-mnist") == 0) {
    const char *dir = getenv("TRAIND_FASHION_MNIST_DIR");
    if (dir == NULL || dir[0] == '\0')
      dir = TD_FASHION_MNIST_DIR;
    static const char *files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                   "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) {
      snprintf(parts[i], sizeof parts[i], "%s/%s", dir, files[i]);
      struct stat st;
      if (stat(parts[i], &st) != 0)
        return td_why(why, why_len, TD_ENOENT,
                      "dataset file %s not found: install the Debian package %s "
                      "(apt-get install %s)",
                      parts[i], TD_FASHION_MNIST_PKG, TD_FASHION_MNIST_PKG);
    }
    count = 4;
  } else if (strncmp(spec, "idx:", 4) == 0) {
    if (split_paths(spec + 4, parts, &count) != 0 || (count != 2 && count != 4))
      return td_why(why, why_len, TD_ECONFIG,
                    "dataset '%s': expected idx:TRAIN_IMAGES,TRAIN_LABELS[,TEST_IMAGES,TEST_LABELS]",
                    spec);
  } else if (strncmp(spec, "csv:", 4) == 0) {
    if (split_paths(spec + 4, parts, &count) != 0 || count > 2)
      return td_why(why, why_len, TD_ECONFIG, "dataset '%s': expected csv:TRAIN[,TEST]", spec);
    if ((rc = td_dataset_load_csv(train, parts[0], why, why_len)) != 0)
      return rc;
    if (count == 2 && (rc = td_dataset_load_csv(test, parts[1], why, why_len)) != 0) {
      td_dataset_close(train);
      return rc;
    }
    goto check;
  } else {
    return td_why(why, why_len, TD_ECONFIG,
                  "unknown dataset '%s' (accepted: fashion-mnist, idx:TRAIN_IMAGES,TRAIN_LABELS"
                  "[,TEST_IMAGES,TEST_LABELS], csv:TRAIN[,TEST])",
                  spec);
  }
  if ((rc = td_dataset_load_idx(train, parts[0], parts[1], why, why_len)) != 0)
    return rc;
  if (count == 4 && (rc = td_dataset_load_idx(test, parts[2], parts[3], why, why_len)) != 0) {
    td_dataset_close(train);
    return rc;
  }
check:
  if (*test != NULL) {
    if ((*test)->dim != (*train)->dim) {
      rc = td_why(why, why_len, TD_ESHAPE, "test set has %zu features, training set %zu",
                  (*test)->dim, (*train)->dim);
      td_dataset_close(train);
      td_dataset_close(test);
      return rc;
    }
    int classes = (*train)->classes > (*test)->classes ? (*train)->classes : (*test)->classes;
    (*train)->classes = (*test)->classes = classes;
  }
  return 0;
}

/* ---- transformations ---------------------------------------------------------------- */

void td_dataset_stats(const td_dataset_t *ds, double *mean, double *std) {
  size_t n = ds->rows * ds->dim;
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) {
    double v = ds->x[i];
    s += v;
    s2 += v * v;
  }
  double m = n ? s / (double)n : 0;
  double var = n ? s2 / (double)n - m * m : 0;
  *mean = m;
  *std = var > 0 ? sqrt(var) : 0;
}

void td_dataset_normalize(td_dataset_t *ds, double mean, double std) {
  float m = (float)mean, inv = (float)(std > 0 ? 1.0 / std : 1.0);
  size_t n = ds->rows * ds->dim;
  for (size_t i = 0; i < n; i++)
    ds->x[i] = (ds->x[i] - m) * inv;
}

int td_dataset_subset(td_dataset_t **out, const td_dataset_t *src, const uint32_t *idx,
                      size_t n) {
  *out = NULL;
  for (size_t i = 0; i < n; i++)
    if (idx[i] >= src->rows)
      return TD_ERANGE;
  td_dataset_t *ds = dataset_new(n, src->dim);
  if (ds == NULL)
    return TD_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    memcpy(ds->x + i * src->dim, src->x + (size_t)idx[i] * src->dim, src->dim * sizeof(float));
    ds->y[i] = src->y[idx[i]];
  }
  ds->classes = src->classes;
  *out = ds;
  return 0;
}

void td_dataset_shuffle(td_dataset_t *ds, td_rng_t *rng) {
  size_t dim = ds->dim;
  float stack[1024];
  float *tmp = dim <= 1024 ? stack : malloc(dim * sizeof(float));
  if (tmp == NULL)
    return; /* cannot happen for sane dims; leave the order as it is */
  for (size_t i = ds->rows; i > 1; i--) {
    size_t j = td_rng_below(rng, (uint32_t)i);
    size_t a = i - 1;
    if (j == a)
      continue;
    memcpy(tmp, ds->x + a * dim, dim * sizeof(float));
    memcpy(ds->x + a * dim, ds->x + j * dim, dim * sizeof(float));
    memcpy(ds->x + j * dim, tmp, dim * sizeof(float));
    int32_t t = ds->y[a];
    ds->y[a] = ds->y[j];
    ds->y[j] = t;
  }
  if (tmp != stack)
    free(tmp);
}
