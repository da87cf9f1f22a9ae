/* history.c: run history from the ledgers: trainctl runs and show, and the
 * ledger access that export (cli/export.c) and plot (cli/plot.c) share.
 *
 * Reads node ledgers read-only (cli/history.h says which ones) with plain
 * SQL against the schema of daemon/ledger.c: one row per run in `runs`, the
 * spec as canonical "key = value" lines, rounds/updates/links keyed by
 * run_id, events by time (the events table has no run column: a run's events
 * are those between its start and end, plus any that name its id). Ids are
 * stored as signed 64-bit integers and shown as 16 hex digits, as the daemon
 * logs them. Runs on trainctl's only thread. */
#include "cli/history.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int td__hist_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("trainctl: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

int td__hist_usage(const char *text) {
  fprintf(stderr, "trainctl: error: usage: %s\n", text);
  return 2;
}

const char *td_history_usage(void) {
  return "  runs [--json]                  every run in the ledgers, oldest first\n"
         "  show RUN [--json]              a run's spec and outcome\n"
         "  export RUN [--format csv|json] [--table rounds|updates|links|events]\n"
         "                                 a run's rows (csv: one block per table)\n"
         "  plot RUN... [--x time|round|samples|bytes]\n"
         "       [--y accuracy|loss|bpb|goodput|staleness|idle] [-o FILE.png|FILE.svg]\n"
         "       [--script FILE.gp] [--size WxH]  curves with gnuplot, one per run and node\n"
         "  model RUN [--round R] -o FILE [--format safetensors]\n"
         "                                 the run's kept model (or round R's checkpoint)\n"
         "  (runs/show/export/plot/model read ledgers directly, read-only: --db FILE and\n"
         "  --data-dir DIR, repeatable, or RUN written DB:RUN; default the daemon's\n"
         "  DATA_DIR/traind.db. RUN is a unique prefix of a run id.)\n";
}

bool td_history_handles(const char *cmd) {
  return strcmp(cmd, "runs") == 0 || strcmp(cmd, "show") == 0 || strcmp(cmd, "export") == 0 ||
         strcmp(cmd, "plot") == 0 || strcmp(cmd, "model") == 0;
}

/* ---- ledgers ---------------------------------------------------------------------------- */

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void make_label(td__hist_db_t *d) {
  const char *p = d->path;
  size_t len = strlen(p);
  const char *file = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
  if (strcmp(file, "traind.db") == 0 && file > p) {
    /* the data dir's name */
    const char *end = file - 1; /* the slash */
    const char *start = end;
    while (start > p && start[-1] != '/')
      start--;
    snprintf(d->label, sizeof d->label, "%.*s", (int)(end - start), start);
    if (d->label[0] == '\0')
      snprintf(d->label, sizeof d->label, "/");
  } else {
    snprintf(d->label, sizeof d->label, "%.*s", (int)sizeof d->label - 1, file);
    len = strlen(d->label);
    if (len > 3 && strcmp(d->label + len - 3, ".db") == 0)
      d->label[len - 3] = '\0';
  }
}

int td__hist_add(td__hist_set_t *set, const char *path) {
  char full[1024];
  if (is_dir(path))
    snprintf(full, sizeof full, "%s/traind.db", path);
  else
    snprintf(full, sizeof full, "%s", path);
  for (size_t i = 0; i < set->n; i++)
    if (strcmp(set->dbs[i]->path, full) == 0)
      return (int)i;
  struct stat st;
  if (stat(full, &st) != 0) {
    td__hist_err("no ledger at %s: %s", full, strerror(errno));
    return -1;
  }
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(full, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    td__hist_err("cannot open ledger %s: %s", full, db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return -1;
  }
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt *st_cols = NULL;
  bool has_runs = false, has_rounds = false;
  char bpb[32] = "";
  if (sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table'", -1, &st_cols,
                         NULL) == SQLITE_OK) {
    while (sqlite3_step(st_cols) == SQLITE_ROW) {
      const char *t = (const char *)sqlite3_column_text(st_cols, 0);
      has_runs |= t && strcmp(t, "runs") == 0;
      has_rounds |= t && strcmp(t, "rounds") == 0;
    }
  }
  sqlite3_finalize(st_cols);
  if (!has_runs || !has_rounds) {
    td__hist_err("%s is not a traind ledger (no runs and rounds tables%s)", full,
                 sqlite3_errcode(db) != SQLITE_OK ? ": unreadable" : "");
    sqlite3_close(db);
    return -1;
  }
  /* a bits-per-byte column, for text models, under any of these names */
  static const char *const bpb_names[] = {"eval_bpb", "bpb", "eval_metric"};
  if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('rounds')", -1, &st_cols,
                         NULL) == SQLITE_OK) {
    while (sqlite3_step(st_cols) == SQLITE_ROW && bpb[0] == '\0') {
      const char *c = (const char *)sqlite3_column_text(st_cols, 0);
      for (size_t i = 0; c && i < sizeof bpb_names / sizeof bpb_names[0]; i++)
        if (strcmp(c, bpb_names[i]) == 0)
          snprintf(bpb, sizeof bpb, "%s", c);
    }
  }
  sqlite3_finalize(st_cols);
  td__hist_db_t **grown = realloc(set->dbs, (set->n + 1) * sizeof *grown);
  td__hist_db_t *d = grown != NULL ? calloc(1, sizeof *d) : NULL;
  if (grown != NULL)
    set->dbs = grown;
  if (d == NULL) {
    sqlite3_close(db);
    td__hist_err("out of memory");
    return -1;
  }
  set->dbs[set->n] = d;
  snprintf(d->path, sizeof d->path, "%s", full);
  d->db = db;
  d->has_eval_bpb = bpb[0] != '\0';
  snprintf(d->bpb_column, sizeof d->bpb_column, "%s", bpb);
  make_label(d);
  return (int)set->n++;
}

int td__hist_default(td__hist_set_t *set) {
  if (set->n > 0)
    return 0;
  char dir[900];
  const char *env = getenv("TRAIND_DATA_DIR"), *home = getenv("HOME");
  if (env != NULL && env[0] != '\0')
    snprintf(dir, sizeof dir, "%s", env);
  else
    snprintf(dir, sizeof dir, "%s/.local/share/traind", home && home[0] ? home : ".");
  return td__hist_add(set, dir) < 0 ? -1 : 0;
}

void td__hist_close(td__hist_set_t *set) {
  for (size_t i = 0; i < set->n; i++) {
    sqlite3_close(set->dbs[i]->db);
    free(set->dbs[i]);
  }
  free(set->dbs);
  set->dbs = NULL;
  set->n = 0;
}

void td__hist_runs_free(td__hist_run_t *runs, size_t n) {
  for (size_t i = 0; runs && i < n; i++)
    free(runs[i].spec);
  free(runs);
}

static double col_double(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

static const char RUN_COLS[] = "run_id, spec, started, ended, state, test_accuracy";

static int fill_run(td__hist_run_t *r, td__hist_db_t *d, sqlite3_stmt *st) {
  memset(r, 0, sizeof *r);
  r->ledger = d;
  r->run_id = sqlite3_column_int64(st, 0);
  snprintf(r->id, sizeof r->id, "%016" PRIx64, (uint64_t)r->run_id);
  const char *spec = (const char *)sqlite3_column_text(st, 1);
  r->spec = strdup(spec ? spec : "");
  r->started = col_double(st, 2);
  r->ended = col_double(st, 3);
  const char *state = (const char *)sqlite3_column_text(st, 4);
  snprintf(r->state, sizeof r->state, "%s", state ? state : "?");
  r->test_accuracy = col_double(st, 5);
  return r->spec ? 0 : td__hist_err("out of memory");
}

/* Every run of one ledger, appended to *runs. */
static int runs_of(td__hist_db_t *d, const char *prefix, td__hist_run_t **runs, size_t *n) {
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT %s FROM runs WHERE ?1 IS NULL OR printf('%%016x', run_id) LIKE ?1 || '%%'"
           " ORDER BY started",
           RUN_COLS);
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(d->db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__hist_err("%s: %s", d->path, sqlite3_errmsg(d->db));
  if (prefix)
    sqlite3_bind_text(st, 1, prefix, -1, SQLITE_TRANSIENT);
  int rc = 0, s;
  while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
    td__hist_run_t *grown = realloc(*runs, (*n + 1) * sizeof *grown);
    if (grown == NULL) {
      rc = td__hist_err("out of memory");
      break;
    }
    *runs = grown;
    rc = fill_run(&(*runs)[*n], d, st);
    (*n)++;
  }
  if (rc == 0 && s != SQLITE_DONE)
    rc = td__hist_err("%s: %s", d->path, sqlite3_errmsg(d->db));
  sqlite3_finalize(st);
  return rc;
}

int td__hist_resolve(td__hist_set_t *set, const char *arg, td__hist_run_t **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  const char *prefix = arg;
  const char *colon = strrchr(arg, ':');
  int only = -1;
  if (colon != NULL) {
    char path[1024];
    snprintf(path, sizeof path, "%.*s", (int)(colon - arg), arg);
    if (path[0] == '\0')
      return td__hist_err("'%s': expected DB:RUN with a ledger file or data dir before ':'", arg);
    if ((only = td__hist_add(set, path)) < 0)
      return 1;
    prefix = colon + 1;
  } else if (td__hist_default(set) != 0) {
    return 1;
  }
  size_t len = strlen(prefix);
  if (len == 0 || len > 16 || strspn(prefix, "0123456789abcdefABCDEF") != len)
    return td__hist_err("'%s' is not a run id (1 to 16 hex digits)", prefix);
  char lower[17];
  for (size_t i = 0; i <= len; i++)
    lower[i] = (char)(prefix[i] >= 'A' && prefix[i] <= 'F' ? prefix[i] - 'A' + 'a' : prefix[i]);
  td__hist_run_t *runs = NULL;
  size_t n = 0;
  for (size_t i = 0; i < set->n; i++) {
    if (only >= 0 && (size_t)only != i)
      continue;
    if (runs_of(set->dbs[i], lower, &runs, &n) != 0) {
      td__hist_runs_free(runs, n);
      return 1;
    }
  }
  for (size_t i = 1; i < n; i++)
    if (runs[i].run_id != runs[0].run_id) {
      int rc = td__hist_err("run id prefix '%s' is ambiguous: %s and %s (give more digits)",
                            prefix, runs[0].id, runs[i].id);
      td__hist_runs_free(runs, n);
      return rc;
    }
  if (n == 0) {
    char where[1200];
    if (only >= 0 || set->n == 1)
      snprintf(where, sizeof where, "%s", set->dbs[only >= 0 ? only : 0]->path);
    else
      snprintf(where, sizeof where, "%zu ledgers", set->n);
    return td__hist_err("no run '%s' in %s", prefix, where);
  }
  *out = runs;
  *n_out = n;
  return 0;
}

bool td__hist_spec_get(const char *spec, const char *key, char *buf, size_t len) {
  size_t klen = strlen(key);
  for (const char *p = spec; p && *p;) {
    const char *eol = strchr(p, '\n');
    size_t line = eol ? (size_t)(eol - p) : strlen(p);
    if (line > klen + 3 && strncmp(p, key, klen) == 0 && strncmp(p + klen, " = ", 3) == 0) {
      snprintf(buf, len, "%.*s", (int)(line - klen - 3), p + klen + 3);
      return true;
    }
    p = eol ? eol + 1 : NULL;
  }
  if (len > 0)
    buf[0] = '\0';
  return false;
}

/* ---- per-run figures -------------------------------------------------------------------- */

typedef struct {
  int64_t rounds, samples, bytes_sent, bytes_recv, updates, links;
  double last_round_ended, loss, eval_acc, bpb;
  int64_t eval_round;
  double compute_s, wait_s;
} run_figures_t;

static int one_row(sqlite3 *db, const char *sql, int64_t run_id, sqlite3_stmt **st) {
  if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
    return td__hist_err("ledger query failed: %s", sqlite3_errmsg(db));
  sqlite3_bind_int64(*st, 1, run_id);
  int s = sqlite3_step(*st);
  if (s != SQLITE_ROW && s != SQLITE_DONE) {
    int rc = td__hist_err("ledger query failed: %s", sqlite3_errmsg(db));
    sqlite3_finalize(*st);
    *st = NULL;
    return rc;
  }
  return s == SQLITE_ROW ? 0 : -1;
}

/* The first column of the query's first row into *out (left as it is when
 * there is no row); 0, or 1 after printing why. */
static int last_double(sqlite3 *db, const char *sql, int64_t run_id, double *out) {
  sqlite3_stmt *st = NULL;
  int rc = one_row(db, sql, run_id, &st);
  if (rc > 0)
    return rc;
  if (rc == 0)
    *out = col_double(st, 0);
  sqlite3_finalize(st);
  return 0;
}

static int figures(const td__hist_run_t *r, run_figures_t *f) {
  memset(f, 0, sizeof *f);
  f->loss = f->eval_acc = f->bpb = f->last_round_ended = NAN;
  sqlite3 *db = r->ledger->db;
  sqlite3_stmt *st = NULL;
  int rc = one_row(db,
                   "SELECT count(*), total(samples), total(bytes_sent), total(bytes_recv),"
                   " max(ended), total(compute_s), total(wait_s) FROM rounds WHERE run_id = ?1",
                   r->run_id, &st);
  if (rc > 0)
    return rc;
  if (rc == 0) {
    f->rounds = sqlite3_column_int64(st, 0);
    f->samples = (int64_t)sqlite3_column_double(st, 1);
    f->bytes_sent = (int64_t)sqlite3_column_double(st, 2);
    f->bytes_recv = (int64_t)sqlite3_column_double(st, 3);
    f->last_round_ended = col_double(st, 4);
    f->compute_s = sqlite3_column_double(st, 5);
    f->wait_s = sqlite3_column_double(st, 6);
  }
  sqlite3_finalize(st);
  if ((rc = last_double(db, "SELECT loss FROM rounds WHERE run_id = ?1 AND loss IS NOT NULL"
                            " ORDER BY round DESC LIMIT 1", r->run_id, &f->loss)) != 0)
    return rc;
  rc = one_row(db, "SELECT eval_acc, round FROM rounds WHERE run_id = ?1 AND eval_acc IS NOT NULL"
                   " ORDER BY round DESC LIMIT 1", r->run_id, &st);
  if (rc > 0)
    return rc;
  if (rc == 0) {
    f->eval_acc = col_double(st, 0);
    f->eval_round = sqlite3_column_int64(st, 1);
  }
  sqlite3_finalize(st);
  if (r->ledger->has_eval_bpb) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT \"%s\" FROM rounds WHERE run_id = ?1 AND \"%s\" IS NOT NULL"
             " ORDER BY round DESC LIMIT 1", r->ledger->bpb_column, r->ledger->bpb_column);
    if ((rc = last_double(db, sql, r->run_id, &f->bpb)) != 0)
      return rc;
  }
  rc = one_row(db, "SELECT (SELECT count(*) FROM updates WHERE run_id = ?1),"
                   " (SELECT count(*) FROM links WHERE run_id = ?1)", r->run_id, &st);
  if (rc > 0)
    return rc;
  if (rc == 0) {
    f->updates = sqlite3_column_int64(st, 0);
    f->links = sqlite3_column_int64(st, 1);
  }
  sqlite3_finalize(st);
  return 0;
}

static double duration_s(const td__hist_run_t *r, const run_figures_t *f) {
  double end = !isnan(r->ended) ? r->ended : f->last_round_ended;
  return isnan(end) ? NAN : end - r->started;
}

/* The run's final metric: test accuracy, else the last evaluated accuracy,
 * else the last bits per byte. */
static void final_metric(const td__hist_run_t *r, const run_figures_t *f, const char **name,
                         double *value) {
  *name = NULL;
  *value = NAN;
  if (!isnan(r->test_accuracy)) {
    *name = "test_accuracy";
    *value = r->test_accuracy;
  } else if (!isnan(f->eval_acc)) {
    *name = "eval_accuracy";
    *value = f->eval_acc;
  } else if (!isnan(f->bpb)) {
    *name = "bpb";
    *value = f->bpb;
  }
}

static void fmt_time(char *buf, size_t len, double t) {
  if (isnan(t)) {
    snprintf(buf, len, "-");
    return;
  }
  time_t s = (time_t)t;
  struct tm tm;
  localtime_r(&s, &tm);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

/* v with `decimals` digits and a suffix, or "-" for NaN. */
static void fmt_opt(char *buf, size_t len, double v, int decimals, const char *suffix) {
  if (isnan(v))
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.*f%s", decimals, v, suffix);
}

static json_object *jdouble(double v) { return isnan(v) ? NULL : json_object_new_double(v); }

static json_object *spec_json(const char *spec) {
  json_object *o = json_object_new_object();
  for (const char *p = spec; p && *p;) {
    const char *eol = strchr(p, '\n');
    size_t line = eol ? (size_t)(eol - p) : strlen(p);
    const char *eq = memchr(p, '=', line);
    if (eq != NULL) {
      const char *ke = eq;
      while (ke > p && ke[-1] == ' ')
        ke--;
      const char *vs = eq + 1;
      while (vs < p + line && *vs == ' ')
        vs++;
      char key[128];
      snprintf(key, sizeof key, "%.*s", (int)(ke - p), p);
      json_object_object_add(o, key, json_object_new_string_len(vs, (int)(p + line - vs)));
    }
    p = eol ? eol + 1 : NULL;
  }
  return o;
}

static json_object *run_json(const td__hist_run_t *r, const run_figures_t *f, bool with_spec) {
  json_object *o = json_object_new_object();
  char v[TD__HIST_VALUE_MAX];
  json_object_object_add(o, "run_id", json_object_new_string(r->id));
  json_object_object_add(o, "ledger", json_object_new_string(r->ledger->path));
  json_object_object_add(o, "state", json_object_new_string(r->state));
  json_object_object_add(o, "started", jdouble(r->started));
  json_object_object_add(o, "ended", jdouble(r->ended));
  static const char *const keys[] = {"model", "mode", "codec", "topology"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (td__hist_spec_get(r->spec, keys[i], v, sizeof v))
      json_object_object_add(o, keys[i], json_object_new_string(v));
  json_object_object_add(o, "rounds", json_object_new_int64(f->rounds));
  json_object_object_add(o, "samples", json_object_new_int64(f->samples));
  json_object_object_add(o, "bytes_sent", json_object_new_int64(f->bytes_sent));
  json_object_object_add(o, "bytes_recv", json_object_new_int64(f->bytes_recv));
  json_object_object_add(o, "duration_s", jdouble(duration_s(r, f)));
  json_object_object_add(o, "loss", jdouble(f->loss));
  json_object_object_add(o, "eval_accuracy", jdouble(f->eval_acc));
  json_object_object_add(o, "test_accuracy", jdouble(r->test_accuracy));
  if (r->ledger->has_eval_bpb)
    json_object_object_add(o, "bpb", jdouble(f->bpb));
  const char *mname;
  double mval;
  final_metric(r, f, &mname, &mval);
  json_object_object_add(o, "metric", mname ? json_object_new_string(mname) : NULL);
  json_object_object_add(o, "metric_value", jdouble(mval));
  double busy = f->compute_s + f->wait_s;
  json_object_object_add(o, "idle_fraction", jdouble(busy > 0 ? f->wait_s / busy : NAN));
  json_object_object_add(o, "updates", json_object_new_int64(f->updates));
  json_object_object_add(o, "links", json_object_new_int64(f->links));
  if (with_spec)
    json_object_object_add(o, "spec", spec_json(r->spec));
  return o;
}

int td__hist_run_summary(const td__hist_run_t *r, json_object **out) {
  run_figures_t f;
  int rc = figures(r, &f);
  *out = rc == 0 ? run_json(r, &f, true) : NULL;
  return rc;
}

/* ---- option parsing shared by the commands ---------------------------------------------- */

/* Takes --db FILE / --data-dir DIR at args[*a]; 1 if taken, 0 if not, -1 on error. */
int td__hist_take_db_opt(td__hist_set_t *set, int argc, char **argv, int *a) {
  const char *o = argv[*a];
  if ((strcmp(o, "--db") == 0 || strcmp(o, "--data-dir") == 0) && *a + 1 < argc) {
    (*a)++;
    return td__hist_add(set, argv[*a]) < 0 ? -1 : 1;
  }
  if (strncmp(o, "--db=", 5) == 0)
    return td__hist_add(set, o + 5) < 0 ? -1 : 1;
  if (strncmp(o, "--data-dir=", 11) == 0)
    return td__hist_add(set, o + 11) < 0 ? -1 : 1;
  return 0;
}

/* ---- runs ------------------------------------------------------------------------------- */

static int cmp_started(const void *a, const void *b) {
  const td__hist_run_t *x = a, *y = b;
  return x->started < y->started ? -1 : x->started > y->started ? 1 : strcmp(x->id, y->id);
}

static int cmd_runs(int argc, char **argv) {
  td__hist_set_t set = {0};
  bool json = false;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__hist_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 0 && strcmp(argv[a], "--json") == 0)
      json = true;
    else if (t == 0)
      rc = td__hist_usage("trainctl runs [--json] [--db FILE | --data-dir DIR]...");
  }
  if (rc == 0 && td__hist_default(&set) != 0)
    rc = 1;
  td__hist_run_t *runs = NULL;
  size_t n = 0;
  for (size_t i = 0; rc == 0 && i < set.n; i++)
    rc = runs_of(set.dbs[i], NULL, &runs, &n);
  if (rc == 0)
    qsort(runs, n, sizeof *runs, cmp_started);
  run_figures_t *figs = calloc(n ? n : 1, sizeof *figs);
  if (figs == NULL && rc == 0)
    rc = td__hist_err("out of memory");
  bool topology = false;
  char v[TD__HIST_VALUE_MAX];
  for (size_t i = 0; rc == 0 && i < n; i++) {
    rc = figures(&runs[i], &figs[i]);
    topology |= td__hist_spec_get(runs[i].spec, "topology", v, sizeof v);
  }
  if (rc == 0 && json) {
    json_object *arr = json_object_new_array();
    for (size_t i = 0; i < n; i++)
      json_object_array_add(arr, run_json(&runs[i], &figs[i], false));
    printf("%s\n", json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PLAIN));
    json_object_put(arr);
  } else if (rc == 0) {
    bool many = set.n > 1;
    printf("%-16s  %-19s  %-24s  %-10s  %-14s  ", "RUN", "STARTED", "MODEL", "MODE", "CODEC");
    if (topology)
      printf("%-12s  ", "TOPOLOGY");
    printf("%6s  %-8s  %-20s  %12s  %10s%s\n", "ROUNDS", "STATE", "METRIC", "BYTES_SENT",
           "DURATION_S", many ? "  LEDGER" : "");
    for (size_t i = 0; i < n; i++) {
      const td__hist_run_t *r = &runs[i];
      char started[32], metric[64], dur[32], model[64], mode[32], codec[48], topo[32];
      fmt_time(started, sizeof started, r->started);
      const char *mname;
      double mval;
      final_metric(r, &figs[i], &mname, &mval);
      if (mname)
        snprintf(metric, sizeof metric, "%s %.4f",
                 strcmp(mname, "bpb") == 0 ? "bpb" : strcmp(mname, "test_accuracy") == 0 ? "test" : "eval",
                 mval);
      else
        snprintf(metric, sizeof metric, "-");
      fmt_opt(dur, sizeof dur, duration_s(r, &figs[i]), 1, "");
      if (!td__hist_spec_get(r->spec, "model", model, sizeof model))
        snprintf(model, sizeof model, "-");
      if (!td__hist_spec_get(r->spec, "mode", mode, sizeof mode))
        snprintf(mode, sizeof mode, "-");
      if (!td__hist_spec_get(r->spec, "codec", codec, sizeof codec))
        snprintf(codec, sizeof codec, "-");
      printf("%-16s  %-19s  %-24s  %-10s  %-14s  ", r->id, started, model, mode, codec);
      if (topology) {
        if (!td__hist_spec_get(r->spec, "topology", topo, sizeof topo))
          snprintf(topo, sizeof topo, "-");
        printf("%-12s  ", topo);
      }
      printf("%6" PRId64 "  %-8s  %-20s  %12" PRId64 "  %10s%s%s\n", figs[i].rounds, r->state,
             metric, figs[i].bytes_sent, dur, many ? "  " : "", many ? r->ledger->label : "");
    }
    if (n == 0)
      printf("(no runs in %s)\n", set.n == 1 ? set.dbs[0]->path : "these ledgers");
  }
  free(figs);
  td__hist_runs_free(runs, n);
  td__hist_close(&set);
  return rc;
}

/* ---- show ------------------------------------------------------------------------------- */

/* Resolve ARG to exactly one run (one ledger). */
int td__hist_one_run(td__hist_set_t *set, const char *arg, td__hist_run_t **run) {
  size_t n;
  int rc = td__hist_resolve(set, arg, run, &n);
  if (rc != 0)
    return rc;
  if (n > 1) {
    rc = td__hist_err("run %s is in %zu ledgers (%s, %s%s): name one with --db or DB:RUN",
                      (*run)[0].id, n, (*run)[0].ledger->path, (*run)[1].ledger->path,
                      n > 2 ? ", ..." : "");
    td__hist_runs_free(*run, n);
    *run = NULL;
  }
  return rc;
}

static int cmd_show(int argc, char **argv) {
  static const char use[] = "trainctl show RUN [--json] [--db FILE | --data-dir DIR]...";
  td__hist_set_t set = {0};
  bool json = false;
  const char *arg = NULL;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__hist_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 0 && strcmp(argv[a], "--json") == 0)
      json = true;
    else if (t == 0 && argv[a][0] != '-' && arg == NULL)
      arg = argv[a];
    else if (t == 0)
      rc = td__hist_usage(use);
  }
  if (rc == 0 && arg == NULL)
    rc = td__hist_usage(use);
  td__hist_run_t *r = NULL;
  if (rc == 0)
    rc = td__hist_one_run(&set, arg, &r);
  run_figures_t f;
  if (rc == 0)
    rc = figures(r, &f);
  if (rc == 0 && json) {
    json_object *o = run_json(r, &f, true);
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
  } else if (rc == 0) {
    char t0[32], t1[32], buf[64];
    fmt_time(t0, sizeof t0, r->started);
    fmt_time(t1, sizeof t1, r->ended);
    printf("run        %s\n", r->id);
    printf("ledger     %s\n", r->ledger->path);
    printf("state      %s\n", r->state);
    printf("started    %s\n", t0);
    printf("ended      %s\n", t1);
    fmt_opt(buf, sizeof buf, duration_s(r, &f), 1, " s");
    printf("duration   %s\n", buf);
    printf("rounds     %" PRId64 " (%" PRId64 " samples)\n", f.rounds, f.samples);
    printf("bytes      %" PRId64 " sent, %" PRId64 " received\n", f.bytes_sent, f.bytes_recv);
    fmt_opt(buf, sizeof buf, f.loss, 4, "");
    printf("loss       %s (last round)\n", buf);
    fmt_opt(buf, sizeof buf, f.eval_acc, 4, "");
    if (!isnan(f.eval_acc))
      printf("eval_acc   %s (round %" PRId64 ")\n", buf, f.eval_round);
    else
      printf("eval_acc   -\n");
    if (r->ledger->has_eval_bpb) {
      fmt_opt(buf, sizeof buf, f.bpb, 4, "");
      printf("bpb        %s (last evaluation)\n", buf);
    }
    fmt_opt(buf, sizeof buf, r->test_accuracy, 4, "");
    printf("test_acc   %s\n", buf);
    double busy = f.compute_s + f.wait_s;
    fmt_opt(buf, sizeof buf, busy > 0 ? 100.0 * f.wait_s / busy : NAN, 1, "%");
    printf("idle       %s of compute time waiting (%.1f s computing, %.1f s waiting)\n", buf,
           f.compute_s, f.wait_s);
    printf("updates    %" PRId64 " received; %" PRId64 " link measurements\n", f.updates, f.links);
    printf("spec\n");
    for (const char *p = r->spec; *p;) {
      const char *eol = strchr(p, '\n');
      int line = eol ? (int)(eol - p) : (int)strlen(p);
      printf("  %.*s\n", line, p);
      p = eol ? eol + 1 : p + line;
    }
  }
  td__hist_runs_free(r, r ? 1 : 0);
  td__hist_close(&set);
  return rc;
}

int td_history_main(const char *cmd, int argc, char **argv) {
  if (strcmp(cmd, "runs") == 0)
    return cmd_runs(argc, argv);
  if (strcmp(cmd, "show") == 0)
    return cmd_show(argc, argv);
  if (strcmp(cmd, "export") == 0)
    return td__export_main(argc, argv);
  if (strcmp(cmd, "plot") == 0)
    return td__plot_main(argc, argv);
  if (strcmp(cmd, "model") == 0)
    return td__model_main(argc, argv);
  fprintf(stderr, "trainctl: error: unknown command '%s'\n", cmd);
  return 2;
}
