/* ledgers.c: the ledger reader of trainctl's history commands (ledgers.h).
 *
 * Plain SQL against the schema of daemon/ledger.c: one row per run in `runs`,
 * the spec as canonical "key = value" lines, rounds/updates/links keyed by
 * run_id, events by time (the events table has no run column: a run's events
 * are those between its start and end, plus any that name its id; its end,
 * with the reason of a failure, is the `run_end` event "run ID STATE: WHY").
 * Ids are stored as signed 64-bit integers and shown as 16 hex digits, as the
 * daemon logs them. Runs on trainctl's only thread. */
#include "cli/ledgers.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/numfmt.h"

int td__ledgers_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("trainctl: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

int td__ledgers_usage(const char *text) {
  fprintf(stderr, "trainctl: error: usage: %s\n", text);
  return 2;
}

/* ---- ledgers ---------------------------------------------------------------------------- */

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void make_label(td__ledgers_db_t *d) {
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

int td__ledgers_add(td__ledgers_set_t *set, const char *path) {
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
    td__ledgers_err("no ledger at %s: %s", full, strerror(errno));
    return -1;
  }
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(full, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    td__ledgers_err("cannot open ledger %s: %s", full, db ? sqlite3_errmsg(db) : "out of memory");
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
    td__ledgers_err("%s is not a traind ledger (no runs and rounds tables%s)", full,
                 sqlite3_errcode(db) != SQLITE_OK ? ": unreadable" : "");
    sqlite3_close(db);
    return -1;
  }
  /* a bits-per-byte column, for text models, under any of these names */
  static const char *const bpb_names[] = {"eval_bpb", "bpb", "eval_metric"};
  bool has_consensus = false; /* schema 7 on: gossip and group runs' consensus distance */
  if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('rounds')", -1, &st_cols,
                         NULL) == SQLITE_OK) {
    while (sqlite3_step(st_cols) == SQLITE_ROW) {
      const char *c = (const char *)sqlite3_column_text(st_cols, 0);
      if (c != NULL && strcmp(c, "consensus") == 0)
        has_consensus = true;
      if (bpb[0] != '\0')
        continue;
      for (size_t i = 0; c && i < sizeof bpb_names / sizeof bpb_names[0]; i++)
        if (strcmp(c, bpb_names[i]) == 0)
          snprintf(bpb, sizeof bpb, "%s", c);
    }
  }
  sqlite3_finalize(st_cols);
  td__ledgers_db_t **grown = realloc(set->dbs, (set->n + 1) * sizeof *grown);
  td__ledgers_db_t *d = grown != NULL ? calloc(1, sizeof *d) : NULL;
  if (grown != NULL)
    set->dbs = grown;
  if (d == NULL) {
    sqlite3_close(db);
    td__ledgers_err("out of memory");
    return -1;
  }
  set->dbs[set->n] = d;
  snprintf(d->path, sizeof d->path, "%s", full);
  d->db = db;
  d->has_eval_bpb = bpb[0] != '\0';
  d->has_consensus = has_consensus;
  snprintf(d->bpb_column, sizeof d->bpb_column, "%s", bpb);
  make_label(d);
  return (int)set->n++;
}

static char daemon_data_dir[900]; /* the data dir of the daemon at --socket, if asked */

void td__ledgers_use_data_dir(const char *dir) {
  snprintf(daemon_data_dir, sizeof daemon_data_dir, "%s", dir);
}

int td__ledgers_default(td__ledgers_set_t *set) {
  if (set->n > 0)
    return 0;
  char dir[900];
  const char *env = getenv("TRAIND_DATA_DIR"), *home = getenv("HOME");
  if (daemon_data_dir[0] != '\0')
    snprintf(dir, sizeof dir, "%s", daemon_data_dir);
  else if (env != NULL && env[0] != '\0')
    snprintf(dir, sizeof dir, "%s", env);
  else
    snprintf(dir, sizeof dir, "%s/.local/share/traind", home && home[0] ? home : ".");
  return td__ledgers_add(set, dir) < 0 ? -1 : 0;
}

void td__ledgers_close(td__ledgers_set_t *set) {
  for (size_t i = 0; i < set->n; i++) {
    sqlite3_close(set->dbs[i]->db);
    free(set->dbs[i]);
  }
  free(set->dbs);
  set->dbs = NULL;
  set->n = 0;
}

void td__ledgers_runs_free(td__ledgers_run_t *runs, size_t n) {
  for (size_t i = 0; runs && i < n; i++)
    free(runs[i].spec);
  free(runs);
}

static double col_double(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

static const char RUN_COLS[] = "run_id, spec, started, ended, state, test_accuracy";

/* Ledgers written before the daemon printed doubles in their shortest form
 * hold spec values as %.17g (lr = 0.050000000000000003): such a value is
 * rewritten, in place, to the shortest form that reads back the same. */
static void shorten_spec_numbers(char *spec) {
  char *out = spec;
  for (char *p = spec; *p;) {
    char *eol = strchr(p, '\n');
    size_t line = eol ? (size_t)(eol - p) + 1 : strlen(p);
    char *eq = memchr(p, '=', line);
    char *value = eq ? eq + 1 + strspn(eq + 1, " ") : NULL;
    size_t vlen = value ? (size_t)(p + line - value) - (eol ? 1 : 0) : 0;
    char num[40], copy[64], *end = NULL;
    double v = 0;
    if (value != NULL && vlen >= 17 && vlen < sizeof copy) {
      memcpy(copy, value, vlen);
      copy[vlen] = '\0';
      v = strtod(copy, &end);
    }
    size_t head = value ? (size_t)(value - p) : line;
    memmove(out, p, head);
    out += head;
    if (end != NULL && *end == '\0' && isfinite(v) && strpbrk(copy, ".eE") != NULL &&
        strlen(td_numfmt_exact(num, sizeof num, v)) < vlen) {
      memcpy(out, num, strlen(num));
      out += strlen(num);
      if (eol)
        *out++ = '\n';
    } else if (value != NULL) {
      memmove(out, value, line - head);
      out += line - head;
    }
    p += line;
  }
  *out = '\0';
}

static int fill_run(td__ledgers_run_t *r, td__ledgers_db_t *d, sqlite3_stmt *st) {
  memset(r, 0, sizeof *r);
  r->ledger = d;
  r->run_id = sqlite3_column_int64(st, 0);
  snprintf(r->id, sizeof r->id, "%016" PRIx64, (uint64_t)r->run_id);
  const char *spec = (const char *)sqlite3_column_text(st, 1);
  r->spec = strdup(spec ? spec : "");
  if (r->spec != NULL)
    shorten_spec_numbers(r->spec);
  r->started = col_double(st, 2);
  r->ended = col_double(st, 3);
  const char *state = (const char *)sqlite3_column_text(st, 4);
  snprintf(r->state, sizeof r->state, "%s", state ? state : "?");
  r->test_accuracy = col_double(st, 5);
  return r->spec ? 0 : td__ledgers_err("out of memory");
}

int td__ledgers_runs_of(td__ledgers_db_t *d, const char *prefix, td__ledgers_run_t **runs,
                        size_t *n) {
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT %s FROM runs WHERE ?1 IS NULL OR printf('%%016x', run_id) LIKE ?1 || '%%'"
           " ORDER BY started",
           RUN_COLS);
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(d->db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("%s: %s", d->path, sqlite3_errmsg(d->db));
  if (prefix)
    sqlite3_bind_text(st, 1, prefix, -1, SQLITE_TRANSIENT);
  int rc = 0, s;
  while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
    td__ledgers_run_t *grown = realloc(*runs, (*n + 1) * sizeof *grown);
    if (grown == NULL) {
      rc = td__ledgers_err("out of memory");
      break;
    }
    *runs = grown;
    rc = fill_run(&(*runs)[*n], d, st);
    (*n)++;
  }
  if (rc == 0 && s != SQLITE_DONE)
    rc = td__ledgers_err("%s: %s", d->path, sqlite3_errmsg(d->db));
  sqlite3_finalize(st);
  return rc;
}

int td__ledgers_resolve(td__ledgers_set_t *set, const char *arg, td__ledgers_run_t **out,
                        size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  const char *prefix = arg;
  const char *colon = strrchr(arg, ':');
  int only = -1;
  if (colon != NULL) {
    char path[1024];
    snprintf(path, sizeof path, "%.*s", (int)(colon - arg), arg);
    if (path[0] == '\0')
      return td__ledgers_err("'%s': expected DB:RUN with a ledger file or data dir before ':'",
                             arg);
    if ((only = td__ledgers_add(set, path)) < 0)
      return 1;
    prefix = colon + 1;
  } else if (td__ledgers_default(set) != 0) {
    return 1;
  }
  size_t len = strlen(prefix);
  if (len == 0 || len > 16 || strspn(prefix, "0123456789abcdefABCDEF") != len)
    return td__ledgers_err("'%s' is not a run id (1 to 16 hex digits)", prefix);
  char lower[17];
  for (size_t i = 0; i <= len; i++)
    lower[i] = (char)(prefix[i] >= 'A' && prefix[i] <= 'F' ? prefix[i] - 'A' + 'a' : prefix[i]);
  td__ledgers_run_t *runs = NULL;
  size_t n = 0;
  for (size_t i = 0; i < set->n; i++) {
    if (only >= 0 && (size_t)only != i)
      continue;
    if (td__ledgers_runs_of(set->dbs[i], lower, &runs, &n) != 0) {
      td__ledgers_runs_free(runs, n);
      return 1;
    }
  }
  for (size_t i = 1; i < n; i++)
    if (runs[i].run_id != runs[0].run_id) {
      int rc = td__ledgers_err("run id prefix '%s' is ambiguous: %s and %s (give more digits)",
                            prefix, runs[0].id, runs[i].id);
      td__ledgers_runs_free(runs, n);
      return rc;
    }
  if (n == 0) {
    char where[1200];
    if (only >= 0 || set->n == 1)
      snprintf(where, sizeof where, "%s", set->dbs[only >= 0 ? only : 0]->path);
    else
      snprintf(where, sizeof where, "%zu ledgers", set->n);
    return td__ledgers_err("no run '%s' in %s", prefix, where);
  }
  *out = runs;
  *n_out = n;
  return 0;
}

bool td__ledgers_spec_get(const char *spec, const char *key, char *buf, size_t len) {
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

static int one_row(sqlite3 *db, const char *sql, int64_t run_id, sqlite3_stmt **st) {
  if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK)
    return td__ledgers_err("ledger query failed: %s", sqlite3_errmsg(db));
  sqlite3_bind_int64(*st, 1, run_id);
  int s = sqlite3_step(*st);
  if (s != SQLITE_ROW && s != SQLITE_DONE) {
    int rc = td__ledgers_err("ledger query failed: %s", sqlite3_errmsg(db));
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

int td__ledgers_figures(const td__ledgers_run_t *r, td__ledgers_figures_t *f) {
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
  /* why it ended, when it says: "run ID failed: WHY" (daemon/session.c) */
  char like[64];
  snprintf(like, sizeof like, "run %s %s: %%", r->id, r->state);
  sqlite3_stmt *ev = NULL;
  if (sqlite3_prepare_v2(db, "SELECT substr(detail, ?2) FROM events WHERE kind = 'run_end'"
                             " AND detail LIKE ?1 ORDER BY id DESC LIMIT 1", -1, &ev,
                         NULL) != SQLITE_OK)
    return td__ledgers_err("ledger query failed: %s", sqlite3_errmsg(db));
  sqlite3_bind_text(ev, 1, like, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(ev, 2, (int)strlen(like)); /* 1-based: just past "...: " */
  if (sqlite3_step(ev) == SQLITE_ROW && sqlite3_column_text(ev, 0) != NULL)
    snprintf(f->reason, sizeof f->reason, "%s", (const char *)sqlite3_column_text(ev, 0));
  sqlite3_finalize(ev);
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

int td__ledgers_run_nodes(const td__ledgers_run_t *r, unsigned *nodes) {
  *nodes = 0;
  sqlite3 *db = r->ledger->db;
  char like[64]; /* daemon/session/session.c: "run ID rank R of N, from round F" */
  snprintf(like, sizeof like, "run %s rank %% of %%", r->id);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "SELECT detail FROM events WHERE kind = 'run_start'"
                             " AND detail LIKE ?1", -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("ledger query failed: %s", sqlite3_errmsg(db));
  sqlite3_bind_text(st, 1, like, -1, SQLITE_TRANSIENT);
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    const char *detail = (const char *)sqlite3_column_text(st, 0);
    const char *of = detail ? strstr(detail, " of ") : NULL;
    if (of == NULL || of[4] < '0' || of[4] > '9')
      continue;
    unsigned long v = strtoul(of + 4, NULL, 10);
    if (v > *nodes && v <= 1000000)
      *nodes = (unsigned)v;
  }
  sqlite3_finalize(st);
  if (s != SQLITE_DONE)
    return td__ledgers_err("ledger query failed: %s", sqlite3_errmsg(db));
  /* each round's members ("id,id,..."), a column since ledger schema 4: an
   * older ledger fails to prepare this and has only the events */
  if (sqlite3_prepare_v2(db, "SELECT max(length(members) - length(replace(members, ',', '')) + 1)"
                             " FROM rounds WHERE run_id = ?1 AND members <> ''", -1, &st,
                         NULL) != SQLITE_OK)
    return 0;
  sqlite3_bind_int64(st, 1, r->run_id);
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_INTEGER) {
    int64_t most = sqlite3_column_int64(st, 0);
    if (most > (int64_t)*nodes && most <= 1000000)
      *nodes = (unsigned)most;
  }
  sqlite3_finalize(st);
  return 0;
}

double td__ledgers_duration_s(const td__ledgers_run_t *r, const td__ledgers_figures_t *f) {
  double end = !isnan(r->ended) ? r->ended : f->last_round_ended;
  return isnan(end) ? NAN : end - r->started;
}

void td__ledgers_final_metric(const td__ledgers_run_t *r, const td__ledgers_figures_t *f,
                              const char **name, double *value) {
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

/* A number in its shortest round-trip form (json-c alone writes %.17g). */
static json_object *jdouble(double v) {
  char num[40];
  return isnan(v) ? NULL : json_object_new_double_s(v, td_numfmt_exact(num, sizeof num, v));
}

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

json_object *td__ledgers_run_json(const td__ledgers_run_t *r, const td__ledgers_figures_t *f,
                                  bool with_spec) {
  json_object *o = json_object_new_object();
  char v[TD__LEDGERS_VALUE_MAX];
  json_object_object_add(o, "run_id", json_object_new_string(r->id));
  json_object_object_add(o, "ledger", json_object_new_string(r->ledger->path));
  json_object_object_add(o, "state", json_object_new_string(r->state));
  json_object_object_add(o, "reason", f->reason[0] ? json_object_new_string(f->reason) : NULL);
  json_object_object_add(o, "started", jdouble(r->started));
  json_object_object_add(o, "ended", jdouble(r->ended));
  static const char *const keys[] = {"model", "mode", "codec", "topology"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (td__ledgers_spec_get(r->spec, keys[i], v, sizeof v))
      json_object_object_add(o, keys[i], json_object_new_string(v));
  json_object_object_add(o, "rounds", json_object_new_int64(f->rounds));
  json_object_object_add(o, "samples", json_object_new_int64(f->samples));
  json_object_object_add(o, "bytes_sent", json_object_new_int64(f->bytes_sent));
  json_object_object_add(o, "bytes_recv", json_object_new_int64(f->bytes_recv));
  json_object_object_add(o, "duration_s", jdouble(td__ledgers_duration_s(r, f)));
  json_object_object_add(o, "loss", jdouble(f->loss));
  json_object_object_add(o, "eval_accuracy", jdouble(f->eval_acc));
  json_object_object_add(o, "test_accuracy", jdouble(r->test_accuracy));
  if (r->ledger->has_eval_bpb)
    json_object_object_add(o, "bpb", jdouble(f->bpb));
  const char *mname;
  double mval;
  td__ledgers_final_metric(r, f, &mname, &mval);
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

int td__ledgers_run_summary(const td__ledgers_run_t *r, json_object **out) {
  td__ledgers_figures_t f;
  int rc = td__ledgers_figures(r, &f);
  *out = rc == 0 ? td__ledgers_run_json(r, &f, true) : NULL;
  return rc;
}

/* ---- which ledgers, which run: what every command parses -------------------------------- */

int td__ledgers_take_db_opt(td__ledgers_set_t *set, int argc, char **argv, int *a) {
  const char *o = argv[*a];
  if ((strcmp(o, "--db") == 0 || strcmp(o, "--data-dir") == 0) && *a + 1 < argc) {
    (*a)++;
    return td__ledgers_add(set, argv[*a]) < 0 ? -1 : 1;
  }
  if (strncmp(o, "--db=", 5) == 0)
    return td__ledgers_add(set, o + 5) < 0 ? -1 : 1;
  if (strncmp(o, "--data-dir=", 11) == 0)
    return td__ledgers_add(set, o + 11) < 0 ? -1 : 1;
  return 0;
}

int td__ledgers_one_run(td__ledgers_set_t *set, const char *arg, td__ledgers_run_t **run) {
  size_t n;
  int rc = td__ledgers_resolve(set, arg, run, &n);
  if (rc != 0)
    return rc;
  if (n > 1) {
    rc = td__ledgers_err("run %s is in %zu ledgers (%s, %s%s): name one with --db or DB:RUN",
                      (*run)[0].id, n, (*run)[0].ledger->path, (*run)[1].ledger->path,
                      n > 2 ? ", ..." : "");
    td__ledgers_runs_free(*run, n);
    *run = NULL;
  }
  return rc;
}
