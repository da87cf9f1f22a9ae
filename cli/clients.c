/* clients.c: the per-client view of a run, read from ledgers (clients.h).
 *
 * Plain SQL against the tables daemon/store/ledger.c creates at schema 6. A
 * client's skew is the total variation distance between its label mix and
 * the run's whole training set's (the sum of every client's counts):
 * half the sum over labels of |p_client(label) - p_all(label)|, 0 for an iid
 * split and 1 for clients that share no label with the rest. Runs on
 * trainctl's only thread. */
#include "cli/clients.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/numfmt.h"

void td__clients_free(td__client_t *c, size_t n) {
  for (size_t i = 0; c != NULL && i < n; i++)
    free(c[i].labels);
  free(c);
}

/* The ledger has the per-client tables (schema 6 on). */
static bool has_tables(sqlite3 *db) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND"
                             " name IN ('client_labels', 'client_evals')",
                         -1, &st, NULL) != SQLITE_OK)
    return false;
  bool ok = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) == 2;
  sqlite3_finalize(st);
  return ok;
}

/* Append a label count to the client (node, client), the last one or a new one. */
static int add_count(td__client_t **list, size_t *n, size_t *cap, int64_t node, int64_t client,
                     int64_t label, int64_t rows) {
  td__client_t *c = *n > 0 ? &(*list)[*n - 1] : NULL;
  if (c == NULL || c->node != node || c->client != client) {
    if (*n == *cap) {
      size_t grown_cap = *cap ? *cap * 2 : 16;
      td__client_t *grown = realloc(*list, grown_cap * sizeof *grown);
      if (grown == NULL)
        return -1;
      *list = grown;
      *cap = grown_cap;
    }
    c = &(*list)[(*n)++];
    *c = (td__client_t){.node = node, .client = client, .accuracy = NAN};
  }
  if (label < 0 || label > 65535 || rows < 0)
    return 0; /* not a row the daemon writes: left out */
  if ((size_t)label >= c->n_labels) {
    int64_t *grown = realloc(c->labels, ((size_t)label + 1) * sizeof *grown);
    if (grown == NULL)
      return -1;
    memset(grown + c->n_labels, 0, ((size_t)label + 1 - c->n_labels) * sizeof *grown);
    c->labels = grown;
    c->n_labels = (size_t)label + 1;
  }
  c->labels[label] = rows;
  c->rows += rows;
  return 0;
}

/* Each client's skew from its counts and the sum of all of them. */
static void set_skew(td__client_t *c, size_t n) {
  size_t labels = 0;
  for (size_t i = 0; i < n; i++)
    labels = c[i].n_labels > labels ? c[i].n_labels : labels;
  double *all = calloc(labels ? labels : 1, sizeof *all), total = 0;
  for (size_t i = 0; all != NULL && i < n; i++)
    for (size_t k = 0; k < c[i].n_labels; k++) {
      all[k] += (double)c[i].labels[k];
      total += (double)c[i].labels[k];
    }
  for (size_t i = 0; i < n; i++) {
    c[i].skew = NAN;
    if (all == NULL || !(total > 0) || c[i].rows <= 0)
      continue;
    double tv = 0;
    for (size_t k = 0; k < labels; k++) {
      double mine = k < c[i].n_labels ? (double)c[i].labels[k] / (double)c[i].rows : 0;
      tv += fabs(mine - all[k] / total);
    }
    c[i].skew = tv / 2;
  }
  free(all);
}

int td__clients_read(const td__ledgers_run_t *r, td__client_t **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  sqlite3 *db = r->ledger->db;
  if (!has_tables(db))
    return 0;
  td__client_t *list = NULL;
  size_t n = 0, cap = 0;
  sqlite3_stmt *st;
  int rc = 0;
  if (sqlite3_prepare_v2(db, "SELECT node, client, label, rows FROM client_labels"
                             " WHERE run_id = ?1 ORDER BY node, client, label",
                         -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, r->run_id);
  int s;
  while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW)
    if (add_count(&list, &n, &cap, sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                  sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3)) != 0)
      rc = td__ledgers_err("out of memory");
  sqlite3_finalize(st);
  /* each client's last evaluation this ledger holds */
  if (rc == 0 && sqlite3_prepare_v2(db, "SELECT node, client, round, rows, accuracy FROM"
                                        " client_evals WHERE run_id = ?1 AND accuracy IS NOT"
                                        " NULL ORDER BY round",
                                    -1, &st, NULL) != SQLITE_OK)
    rc = td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  if (rc == 0) {
    sqlite3_bind_int64(st, 1, r->run_id);
    while (sqlite3_step(st) == SQLITE_ROW)
      for (size_t i = 0; i < n; i++)
        if (list[i].node == sqlite3_column_int64(st, 0) &&
            list[i].client == sqlite3_column_int64(st, 1)) {
          list[i].eval_round = sqlite3_column_int64(st, 2);
          list[i].eval_rows = sqlite3_column_int64(st, 3);
          list[i].accuracy = sqlite3_column_double(st, 4);
        }
    sqlite3_finalize(st);
  }
  if (rc != 0) {
    td__clients_free(list, n);
    return rc;
  }
  set_skew(list, n);
  *out = list;
  *n_out = n;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_of(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The q-quantile (0 <= q <= 1) of n > 0 values already sorted, linearly
 * interpolated between the two nearest ranks. */
static double quantile_of_sorted(const double *v, size_t n, double q) {
  double at = q * (double)(n - 1);
  size_t lo = (size_t)at;
  return lo + 1 < n ? v[lo] + (at - (double)lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}

void td__clients_print(FILE *f, const td__client_t *c, size_t n) {
  if (n == 0)
    return;
  double *skews = malloc(n * sizeof *skews);
  size_t have = 0;
  for (size_t i = 0; skews != NULL && i < n; i++)
    if (!isnan(c[i].skew))
      skews[have++] = c[i].skew;
  char num[40];
  fprintf(f, "clients    %zu; label skew (total variation from the whole set's mix) median %s\n",
          n, have ? td_numfmt_bounded(num, sizeof num, median_of(skews, have), 3, 8) : "-");
  free(skews);
  for (size_t i = 0; i < n; i++) {
    fprintf(f, "  node %" PRId64 " client %" PRId64 "  %7" PRId64 " rows  skew %s", c[i].node,
            c[i].client, c[i].rows,
            isnan(c[i].skew) ? "-" : td_numfmt_bounded(num, sizeof num, c[i].skew, 3, 8));
    if (!isnan(c[i].accuracy))
      fprintf(f, "  acc %s (round %" PRId64 ", %" PRId64 " held out)",
              td_numfmt_bounded(num, sizeof num, c[i].accuracy, 4, 8), c[i].eval_round,
              c[i].eval_rows);
    fprintf(f, "  labels");
    for (size_t k = 0; k < c[i].n_labels; k++)
      fprintf(f, " %" PRId64, c[i].labels[k]);
    fputc('\n', f);
  }
}

json_object *td__clients_json(const td__client_t *c, size_t n) {
  json_object *arr = json_object_new_array();
  for (size_t i = 0; i < n; i++) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "node", json_object_new_int64(c[i].node));
    json_object_object_add(o, "client", json_object_new_int64(c[i].client));
    json_object_object_add(o, "rows", json_object_new_int64(c[i].rows));
    json_object_object_add(o, "skew", isnan(c[i].skew) ? NULL : json_object_new_double(c[i].skew));
    json_object *labels = json_object_new_array();
    for (size_t k = 0; k < c[i].n_labels; k++)
      json_object_array_add(labels, json_object_new_int64(c[i].labels[k]));
    json_object_object_add(o, "labels", labels);
    bool evaluated = !isnan(c[i].accuracy);
    json_object_object_add(o, "accuracy",
                           evaluated ? json_object_new_double(c[i].accuracy) : NULL);
    json_object_object_add(o, "eval_round",
                           evaluated ? json_object_new_int64(c[i].eval_round) : NULL);
    json_object_array_add(arr, o);
  }
  return arr;
}

/* ---- plot ------------------------------------------------------------------------------- */

typedef struct {
  int64_t round, node, client;
  double accuracy;
} point_t;

static int cmp_point(const void *a, const void *b) {
  const point_t *x = a, *y = b;
  if (x->round != y->round)
    return x->round < y->round ? -1 : 1;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  return x->client < y->client ? -1 : x->client > y->client;
}

/* Every client evaluation of the run in one ledger, appended. */
static int read_points(const td__ledgers_run_t *r, point_t **pts, size_t *n, size_t *cap) {
  sqlite3 *db = r->ledger->db;
  if (!has_tables(db))
    return 0;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, "SELECT round, node, client, accuracy FROM client_evals"
                             " WHERE run_id = ?1 AND accuracy IS NOT NULL",
                         -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, r->run_id);
  int rc = 0;
  while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
    if (*n == *cap) {
      size_t grown_cap = *cap ? *cap * 2 : 64;
      point_t *grown = realloc(*pts, grown_cap * sizeof *grown);
      if (grown == NULL) {
        rc = td__ledgers_err("out of memory");
        break;
      }
      *pts = grown;
      *cap = grown_cap;
    }
    (*pts)[(*n)++] = (point_t){.round = sqlite3_column_int64(st, 0),
                               .node = sqlite3_column_int64(st, 1),
                               .client = sqlite3_column_int64(st, 2),
                               .accuracy = sqlite3_column_double(st, 3)};
  }
  sqlite3_finalize(st);
  return rc;
}

/* One run's spread as datablock $cK; 0, or 1 after printing why. */
static int write_run_spread(FILE *gp, const td__ledgers_run_t *series, size_t n, size_t first,
                            size_t k) {
  point_t *pts = NULL;
  size_t np = 0, cap = 0;
  int rc = 0;
  for (size_t i = first; rc == 0 && i < n; i++)
    if (series[i].run_id == series[first].run_id)
      rc = read_points(&series[i], &pts, &np, &cap);
  if (rc == 0 && np == 0)
    rc = td__ledgers_err("run %s has no client evaluations in these ledgers (start it with"
                         " client_eval = true, and name every node's ledger with --data-dir)",
                         series[first].id);
  double *acc = rc == 0 ? malloc(np * sizeof *acc) : NULL;
  if (rc == 0 && acc == NULL)
    rc = td__ledgers_err("out of memory");
  if (rc == 0) {
    qsort(pts, np, sizeof *pts, cmp_point);
    fprintf(gp, "# round; min, median and max accuracy over the clients; how many; the 10th and\n"
                "# 90th percentiles (a client with a held-out share of a few rows scores 0 or 1,\n"
                "# so with many clients min and max say little)\n");
    fprintf(gp, "$c%zu << EOD\n", k);
    for (size_t i = 0; i < np;) {
      size_t m = 0, j = i;
      for (; j < np && pts[j].round == pts[i].round; j++)
        if (j == i || cmp_point(&pts[j], &pts[j - 1]) != 0) /* a client in two ledgers: once */
          acc[m++] = pts[j].accuracy;
      double med = median_of(acc, m); /* sorts acc */
      fprintf(gp, "%" PRId64 " %.10g %.10g %.10g %zu %.10g %.10g\n", pts[i].round, acc[0], med,
              acc[m - 1], m, quantile_of_sorted(acc, m, 0.1), quantile_of_sorted(acc, m, 0.9));
      i = j;
    }
    fprintf(gp, "EOD\n");
  }
  free(acc);
  free(pts);
  return rc;
}

int td__clients_write_spread(FILE *gp, const td__ledgers_run_t *series, size_t n, size_t *runs,
                             size_t *blocks) {
  *blocks = 0;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = series[j].run_id == series[i].run_id;
    if (seen)
      continue;
    int rc = write_run_spread(gp, series, n, i, *blocks);
    if (rc != 0)
      return rc;
    runs[(*blocks)++] = i;
  }
  return 0;
}
