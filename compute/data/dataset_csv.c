/* dataset_csv.c: the CSV reader: one row per sample, the label first.
 *
 * A first line that does not parse as numbers is a header; every other line
 * must have the same columns, a label that is an integer in range and finite
 * features, or the file is refused with the line and column that failed.
 * The file is opened through td_file_open_regular (compute/data/file.h). */
#include "compute/data/dataset_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/file.h"

/* The largest CSV file: 64 GiB of text (the row and value caps bind first). */
#define TD__CSV_MAX_FILE_BYTES ((uint64_t)1 << 36)

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
