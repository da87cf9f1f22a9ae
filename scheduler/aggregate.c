/* aggregate.c: the mean, norm-clipped mean, coordinate-wise trimmed mean and
 * median of a round's updates (aggregate.h).
 *
 * Order of work: sort the inputs by id; norms (double); the median norm over
 * the eligible inputs (positive weight, finite norm); rejection by the norm
 * bound; clipping factors; then one pass over the coordinates. The trimmed
 * mean and the median gather the k values of a coordinate on the stack and
 * insertion-sort them (k <= 33), ties broken by input position, so equal
 * inputs give equal outputs everywhere. */
#include "scheduler/aggregate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static bool parse_number(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !(v >= lo && v <= hi))
    return false;
  *out = v;
  return true;
}

int td_agg_parse(td_agg_spec_t *out, const char *text, char *why, size_t why_len) {
  double v = 0;
  if (strcmp(text, "mean") == 0) {
    out->kind = TD_AGG_MEAN;
  } else if (strcmp(text, "median") == 0) {
    out->kind = TD_AGG_MEDIAN;
  } else if (strncmp(text, "clip:", 5) == 0 && parse_number(text + 5, 1, 1000, &v)) {
    out->kind = TD_AGG_CLIP;
    out->clip = v;
  } else if (strncmp(text, "trimmed:", 8) == 0 && text[8] >= '0' && text[8] <= '9' &&
             parse_number(text + 8, 1, TD_AGG_MAX_TRIM, &v) && v == floor(v)) {
    out->kind = TD_AGG_TRIMMED;
    out->trim = (unsigned)v;
  } else {
    return td_why(why, why_len, TD_ECONFIG,
                  "unknown aggregate '%s' (accepted: mean, clip:C with C in [1, 1000], "
                  "trimmed:B with B in [1, %d], median)", text, TD_AGG_MAX_TRIM);
  }
  return 0;
}

int td_agg_parse_norm_bound(double *out, const char *text, char *why, size_t why_len) {
  double v;
  if (strcmp(text, "auto") == 0)
    *out = -1;
  else if (strcmp(text, "off") == 0)
    *out = 0;
  else if (parse_number(text, 1, 1e6, &v))
    *out = v;
  else
    return td_why(why, why_len, TD_ECONFIG,
                  "bad norm_bound '%s' (accepted: auto, off, or R in [1, 1e6])", text);
  return 0;
}

void td_agg_resolve(td_agg_spec_t *spec) {
  if (spec->norm_bound < 0)
    spec->norm_bound = spec->kind == TD_AGG_TRIMMED || spec->kind == TD_AGG_MEDIAN
                           ? TD_AGG_AUTO_NORM_BOUND
                           : 0;
}

void td_agg_format(const td_agg_spec_t *spec, char *buf, size_t len) {
  char kind[32];
  switch (spec->kind) {
  case TD_AGG_CLIP: snprintf(kind, sizeof kind, "clip:%g", spec->clip); break;
  case TD_AGG_TRIMMED: snprintf(kind, sizeof kind, "trimmed:%u", spec->trim); break;
  case TD_AGG_MEDIAN: snprintf(kind, sizeof kind, "median"); break;
  default: snprintf(kind, sizeof kind, "mean"); break;
  }
  if (spec->norm_bound > 0)
    snprintf(buf, len, "%s, norm bound %g", kind, spec->norm_bound);
  else
    snprintf(buf, len, "%s", kind);
}

static int by_id(const void *a, const void *b) {
  uint64_t x = ((const td_agg_input_t *)a)->id, y = ((const td_agg_input_t *)b)->id;
  return (x > y) - (x < y);
}

static double l2_norm(const float *x, size_t numel) {
  double acc = 0;
  for (size_t i = 0; i < numel; i++)
    acc += (double)x[i] * (double)x[i];
  return sqrt(acc);
}

/* The median of v[0..k) (sorted here). */
static double median_of(double *v, size_t k) {
  for (size_t i = 1; i < k; i++) {
    double x = v[i];
    size_t j = i;
    for (; j > 0 && v[j - 1] > x; j--)
      v[j] = v[j - 1];
    v[j] = x;
  }
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

typedef struct {
  float value;
  unsigned pos; /* input position: the tie-break */
} coord_t;

static void sort_coords(coord_t *c, size_t k) {
  for (size_t i = 1; i < k; i++) {
    coord_t x = c[i];
    size_t j = i;
    for (; j > 0 && (c[j - 1].value > x.value ||
                     (c[j - 1].value == x.value && c[j - 1].pos > x.pos));
         j--)
      c[j] = c[j - 1];
    c[j] = x;
  }
}

size_t td_agg_apply(const td_agg_spec_t *spec, td_agg_input_t *in, size_t n, size_t numel,
                    float *out, td_agg_result_t *res) {
  td_agg_result_t r = {.median_norm = 0};
  if (n > TD_AGG_MAX_INPUTS)
    n = TD_AGG_MAX_INPUTS;
  qsort(in, n, sizeof *in, by_id);
  double norms[TD_AGG_MAX_INPUTS];
  size_t eligible = 0;
  for (size_t j = 0; j < n; j++) {
    in[j].norm = l2_norm(in[j].delta, numel);
    in[j].verdict = TD_AGG_USED;
    if (!(in[j].weight > 0) || !isfinite(in[j].norm) || !isfinite(in[j].weight))
      in[j].verdict = TD_AGG_REJECTED;
    else
      norms[eligible++] = in[j].norm;
  }
  r.median_norm = eligible ? median_of(norms, eligible) : 0;
  double m = r.median_norm;
  /* factor by which each kept input is scaled (clip), and the kept inputs */
  double scale[TD_AGG_MAX_INPUTS];
  const td_agg_input_t *kept[TD_AGG_MAX_INPUTS];
  double weight[TD_AGG_MAX_INPUTS];
  size_t k = 0;
  double total = 0;
  for (size_t j = 0; j < n; j++) {
    if (in[j].verdict == TD_AGG_REJECTED)
      continue;
    if (spec->norm_bound > 0 && m > 0 && in[j].norm > spec->norm_bound * m) {
      in[j].verdict = TD_AGG_REJECTED;
      continue;
    }
    scale[k] = 1;
    if (spec->kind == TD_AGG_CLIP && m > 0 && in[j].norm > spec->clip * m) {
      scale[k] = spec->clip * m / in[j].norm;
      in[j].verdict = TD_AGG_CLIPPED;
      r.clipped++;
    }
    kept[k] = &in[j];
    weight[k] = in[j].weight;
    total += in[j].weight;
    k++;
  }
  r.used = k;
  r.rejected = n - k;
  if (res != NULL)
    *res = r;
  if (k == 0) {
    memset(out, 0, numel * sizeof *out);
    return 0;
  }
  switch (spec->kind) {
  case TD_AGG_MEAN:
  case TD_AGG_CLIP: {
    double w[TD_AGG_MAX_INPUTS];
    for (size_t j = 0; j < k; j++)
      w[j] = weight[j] * scale[j] / total;
    for (size_t i = 0; i < numel; i++) {
      double acc = 0;
      for (size_t j = 0; j < k; j++)
        acc += w[j] * (double)kept[j]->delta[i];
      out[i] = (float)acc;
    }
    break;
  }
  case TD_AGG_TRIMMED: {
    /* B bounds the bad inputs; those rejected outright are already gone */
    size_t b = spec->trim > r.rejected ? spec->trim - r.rejected : 0;
    if (k < 2 * b + 1)
      b = (k - 1) / 2;
    coord_t c[TD_AGG_MAX_INPUTS];
    for (size_t i = 0; i < numel; i++) {
      for (size_t j = 0; j < k; j++)
        c[j] = (coord_t){.value = kept[j]->delta[i], .pos = (unsigned)j};
      sort_coords(c, k);
      double acc = 0, wsum = 0;
      for (size_t j = b; j < k - b; j++) {
        acc += weight[c[j].pos] * (double)c[j].value;
        wsum += weight[c[j].pos];
      }
      out[i] = (float)(acc / wsum);
    }
    break;
  }
  case TD_AGG_MEDIAN: {
    double v[TD_AGG_MAX_INPUTS];
    for (size_t i = 0; i < numel; i++) {
      for (size_t j = 0; j < k; j++)
        v[j] = kept[j]->delta[i];
      out[i] = (float)median_of(v, k);
    }
    break;
  }
  }
  return k;
}
