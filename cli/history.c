/* history.c: trainctl runs and show: the run history, read from ledgers.
 *
 * The ledgers are opened and read through cli/ledgers.h; this file only
 * chooses what to read and prints it (a table or JSON). Runs on trainctl's
 * only thread. */
#include "cli/history.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/clients.h"
#include "cli/ledgers.h"
#include "common/numfmt.h"

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

/* v with `decimals` digits (in at most 12 characters: a diverged loss is
 * 1.235e+30, not 31 digits) and a suffix, or "-" for NaN. */
static void fmt_opt(char *buf, size_t len, double v, int decimals, const char *suffix) {
  char num[40];
  if (isnan(v))
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%s%s", td_numfmt_bounded(num, sizeof num, v, decimals, 12), suffix);
}

/* ---- runs ------------------------------------------------------------------------------- */

static int cmp_started(const void *a, const void *b) {
  const td__ledgers_run_t *x = a, *y = b;
  return x->started < y->started ? -1 : x->started > y->started ? 1 : strcmp(x->id, y->id);
}

int td_history_runs(int argc, char **argv) {
  td__ledgers_set_t set = {0};
  bool json = false;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__ledgers_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 0 && strcmp(argv[a], "--json") == 0)
      json = true;
    else if (t == 0)
      rc = td__ledgers_usage("trainctl runs [--json] [--db FILE | --data-dir DIR]...");
  }
  if (rc == 0 && td__ledgers_default(&set) != 0)
    rc = 1;
  td__ledgers_run_t *runs = NULL;
  size_t n = 0;
  for (size_t i = 0; rc == 0 && i < set.n; i++)
    rc = td__ledgers_runs_of(set.dbs[i], NULL, &runs, &n);
  if (rc == 0)
    qsort(runs, n, sizeof *runs, cmp_started);
  td__ledgers_figures_t *figs = calloc(n ? n : 1, sizeof *figs);
  if (figs == NULL && rc == 0)
    rc = td__ledgers_err("out of memory");
  bool topology = false;
  char v[TD__LEDGERS_VALUE_MAX];
  for (size_t i = 0; rc == 0 && i < n; i++) {
    rc = td__ledgers_figures(&runs[i], &figs[i]);
    topology |= td__ledgers_spec_get(runs[i].spec, "topology", v, sizeof v);
  }
  if (rc == 0 && json) {
    json_object *arr = json_object_new_array();
    for (size_t i = 0; i < n; i++)
      json_object_array_add(arr, td__ledgers_run_json(&runs[i], &figs[i], false));
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
      const td__ledgers_run_t *r = &runs[i];
      char started[32], metric[64], dur[32], model[64], mode[32], codec[48], topo[32], num[40];
      fmt_time(started, sizeof started, r->started);
      const char *mname;
      double mval;
      td__ledgers_final_metric(r, &figs[i], &mname, &mval);
      if (mname)
        snprintf(metric, sizeof metric, "%s %s",
                 strcmp(mname, "bpb") == 0             ? "bpb"
                 : strcmp(mname, "test_accuracy") == 0 ? "test"
                                                       : "eval",
                 td_numfmt_bounded(num, sizeof num, mval, 4, 9));
      else
        snprintf(metric, sizeof metric, "-");
      fmt_opt(dur, sizeof dur, td__ledgers_duration_s(r, &figs[i]), 1, "");
      if (!td__ledgers_spec_get(r->spec, "model", model, sizeof model))
        snprintf(model, sizeof model, "-");
      if (!td__ledgers_spec_get(r->spec, "mode", mode, sizeof mode))
        snprintf(mode, sizeof mode, "-");
      if (!td__ledgers_spec_get(r->spec, "codec", codec, sizeof codec))
        snprintf(codec, sizeof codec, "-");
      printf("%-16s  %-19s  %-24s  %-10s  %-14s  ", r->id, started, model, mode, codec);
      if (topology) {
        if (!td__ledgers_spec_get(r->spec, "topology", topo, sizeof topo))
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
  td__ledgers_runs_free(runs, n);
  td__ledgers_close(&set);
  return rc;
}

/* ---- show ------------------------------------------------------------------------------- */

int td_history_show(int argc, char **argv) {
  static const char use[] = "trainctl show RUN [--json] [--db FILE | --data-dir DIR]...";
  td__ledgers_set_t set = {0};
  bool json = false;
  const char *arg = NULL;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__ledgers_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 0 && strcmp(argv[a], "--json") == 0)
      json = true;
    else if (t == 0 && argv[a][0] != '-' && arg == NULL)
      arg = argv[a];
    else if (t == 0)
      rc = td__ledgers_usage(use);
  }
  if (rc == 0 && arg == NULL)
    rc = td__ledgers_usage(use);
  td__ledgers_run_t *r = NULL;
  if (rc == 0)
    rc = td__ledgers_one_run(&set, arg, &r);
  td__ledgers_figures_t f;
  if (rc == 0)
    rc = td__ledgers_figures(r, &f);
  td__client_t *clients = NULL; /* the per-client view (client_labels, client_evals) */
  size_t n_clients = 0;
  if (rc == 0)
    rc = td__clients_read(r, &clients, &n_clients);
  if (rc == 0 && json) {
    json_object *o = td__ledgers_run_json(r, &f, true);
    if (n_clients > 0)
      json_object_object_add(o, "clients", td__clients_json(clients, n_clients));
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
  } else if (rc == 0) {
    char t0[32], t1[32], buf[64];
    fmt_time(t0, sizeof t0, r->started);
    fmt_time(t1, sizeof t1, r->ended);
    printf("run        %s\n", r->id);
    printf("ledger     %s\n", r->ledger->path);
    printf("state      %s\n", r->state);
    if (f.reason[0] != '\0')
      printf("reason     %s\n", f.reason);
    printf("started    %s\n", t0);
    printf("ended      %s\n", t1);
    fmt_opt(buf, sizeof buf, td__ledgers_duration_s(r, &f), 1, " s");
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
    sqlite3_stmt *st = NULL; /* ledgers before schema 4 have no such column: no line */
    if (sqlite3_prepare_v2(r->ledger->db, "SELECT untrained FROM runs WHERE run_id = ?1", -1, &st,
                           NULL) == SQLITE_OK) {
      sqlite3_bind_int64(st, 1, r->run_id);
      if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != NULL)
        printf("untrained  partitions %s: no round trained them\n",
               (const char *)sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    double busy = f.compute_s + f.wait_s;
    fmt_opt(buf, sizeof buf, busy > 0 ? 100.0 * f.wait_s / busy : NAN, 1, "%");
    printf("idle       %s of compute time waiting (%.1f s computing, %.1f s waiting)\n", buf,
           f.compute_s, f.wait_s);
    printf("updates    %" PRId64 " received; %" PRId64 " link measurements\n", f.updates, f.links);
    td__clients_print(stdout, clients, n_clients);
    printf("spec\n");
    for (const char *p = r->spec; *p;) {
      const char *eol = strchr(p, '\n');
      int line = eol ? (int)(eol - p) : (int)strlen(p);
      printf("  %.*s\n", line, p);
      p = eol ? eol + 1 : p + line;
    }
  }
  td__clients_free(clients, n_clients);
  td__ledgers_runs_free(r, r ? 1 : 0);
  td__ledgers_close(&set);
  return rc;
}
