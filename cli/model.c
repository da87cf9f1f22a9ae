/* model.c: `trainctl model RUN [--round R] -o FILE [--format safetensors]`.
 *
 * Reads a run's model from a node ledger, read-only, daemon up or down (the
 * ledgers as cli/history.h finds them), and writes it as safetensors
 * (compute/safetensors.h): the run's kept model (the ledger's `models` row:
 * its final consensus model, or its last one when it was stopped or failed),
 * or with --round R that row or the checkpoint of round R; without a kept
 * model, the newest checkpoint. The tensor names and shapes come from the
 * model spec (td_model_spec_layout), the same layout the daemon trained, and
 * the stored buffer must have exactly its size. Runs on trainctl's thread. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/history.h"
#include "compute/model.h"
#include "compute/safetensors.h"

typedef struct {
  bool found;
  int64_t round;
  char state[32];
  double metric;
  char model[TD__HIST_VALUE_MAX];
  float *blob; /* malloc'd: aligned for floats */
  size_t bytes;
} stored_t;

static bool has_table(sqlite3 *db, const char *name) {
  sqlite3_stmt *st = NULL;
  bool yes = false;
  if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1", -1,
                         &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    yes = sqlite3_step(st) == SQLITE_ROW;
  }
  sqlite3_finalize(st);
  return yes;
}

/* One row (round, state, metric, model, blob) of sql into *out; 1 after an error. */
static int read_row(sqlite3 *db, const char *sql, int64_t run_id, int64_t round, stored_t *out) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__hist_err("cannot read the ledger: %s", sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_int64(st, 2, round);
  int rc = 0, step = sqlite3_step(st);
  if (step == SQLITE_ROW) {
    out->found = true;
    out->round = sqlite3_column_int64(st, 0);
    const char *state = (const char *)sqlite3_column_text(st, 1);
    snprintf(out->state, sizeof out->state, "%s", state ? state : "");
    out->metric = sqlite3_column_type(st, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 2);
    const char *model = (const char *)sqlite3_column_text(st, 3);
    if (model != NULL)
      snprintf(out->model, sizeof out->model, "%s", model);
    out->bytes = (size_t)sqlite3_column_bytes(st, 4);
    const void *blob = sqlite3_column_blob(st, 4);
    out->blob = malloc(out->bytes > 0 ? out->bytes : 1);
    if (out->blob == NULL)
      rc = td__hist_err("out of memory for a %zu-byte model", out->bytes);
    else if (out->bytes > 0)
      memcpy(out->blob, blob, out->bytes);
  } else if (step != SQLITE_DONE) {
    rc = td__hist_err("cannot read the ledger: %s", sqlite3_errmsg(db));
  }
  sqlite3_finalize(st);
  return rc;
}

static int find_model(const td__hist_run_t *r, int64_t round, stored_t *out) {
  sqlite3 *db = r->ledger->db;
  int rc = 0;
  if (has_table(db, "models"))
    rc = read_row(db,
                  round < 0 ? "SELECT round, state, metric, model, blob FROM models"
                              " WHERE run_id = ?1 AND ?2 < 0"
                            : "SELECT round, state, metric, model, blob FROM models"
                              " WHERE run_id = ?1 AND round = ?2",
                  r->run_id, round, out);
  if (rc == 0 && !out->found && has_table(db, "checkpoints"))
    rc = read_row(db,
                  round < 0 ? "SELECT round, 'checkpoint', NULL, NULL, blob FROM checkpoints"
                              " WHERE run_id = ?1 AND ?2 < 0 ORDER BY round DESC LIMIT 1"
                            : "SELECT round, 'checkpoint', NULL, NULL, blob FROM checkpoints"
                              " WHERE run_id = ?1 AND round = ?2",
                  r->run_id, round, out);
  return rc;
}

int td__model_main(int argc, char **argv) {
  static const char use[] = "trainctl model RUN [--round R] -o FILE [--format safetensors] "
                            "[--db FILE | --data-dir DIR]...";
  td__hist_set_t set = {0};
  const char *arg = NULL, *path = NULL, *format = "safetensors", *round_text = NULL;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__hist_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 1)
      continue;
    else if ((strcmp(argv[a], "-o") == 0 || strcmp(argv[a], "--output") == 0) && a + 1 < argc)
      path = argv[++a];
    else if (strcmp(argv[a], "--round") == 0 && a + 1 < argc)
      round_text = argv[++a];
    else if (strcmp(argv[a], "--format") == 0 && a + 1 < argc)
      format = argv[++a];
    else if (strncmp(argv[a], "--format=", 9) == 0)
      format = argv[a] + 9;
    else if (argv[a][0] != '-' && arg == NULL)
      arg = argv[a];
    else
      rc = td__hist_usage(use);
  }
  if (rc == 0 && (arg == NULL || path == NULL))
    rc = td__hist_usage(use);
  if (rc == 0 && strcmp(format, "safetensors") != 0) {
    fprintf(stderr, "trainctl: error: unknown model format '%s' (safetensors)\n", format);
    rc = 2;
  }
  int64_t round = -1;
  if (rc == 0 && round_text != NULL) {
    char *end;
    long long v = strtoll(round_text, &end, 10);
    if (*round_text == '\0' || *end != '\0' || v < 1) {
      fprintf(stderr, "trainctl: error: --round takes a round number (1, 2, ...), not '%s'\n",
              round_text);
      rc = 2;
    }
    round = v;
  }
  td__hist_run_t *r = NULL;
  if (rc == 0)
    rc = td__hist_one_run(&set, arg, &r);
  stored_t m = {.metric = NAN};
  if (rc == 0)
    rc = find_model(r, round, &m);
  if (rc == 0 && !m.found && round >= 0)
    rc = td__hist_err("run %s has no model of round %" PRId64 " in %s (its kept model and "
                      "checkpoints: trainctl model %s -o FILE without --round)",
                      r->id, round, r->ledger->path, r->id);
  else if (rc == 0 && !m.found)
    rc = td__hist_err("no model stored for run %s in %s (a run keeps its model when it ends; "
                      "this one %s)",
                      r->id, r->ledger->path,
                      strcmp(r->state, "running") == 0 ? "is still running"
                                                       : "ended before keeping one");
  if (rc == 0 && m.model[0] == '\0' && !td__hist_spec_get(r->spec, "model", m.model,
                                                           sizeof m.model))
    rc = td__hist_err("run %s: its spec names no model", r->id);
  td_layout_t *layout = NULL;
  char why[512];
  if (rc == 0 && td_model_spec_layout(m.model, &layout, why, sizeof why) != 0)
    rc = td__hist_err("run %s: model '%s': %s", r->id, m.model, why);
  if (rc == 0 && m.bytes != td_layout_numel(layout) * sizeof(float))
    rc = td__hist_err("run %s: the stored model has %zu bytes, %s has %zu: the ledger row is "
                      "damaged",
                      r->id, m.bytes, m.model, td_layout_numel(layout) * sizeof(float));
  if (rc == 0) {
    char round_s[32], metric_s[32];
    snprintf(round_s, sizeof round_s, "%" PRId64, m.round);
    snprintf(metric_s, sizeof metric_s, "%.9g", m.metric);
    bool text = strncmp(m.model, "gpt:", 4) == 0;
    td_safetensors_meta_t meta[] = {
        {"format", "pt"},        {"producer", "traind"}, {"model", m.model},
        {"run_id", r->id},       {"round", round_s},      {"state", m.state},
        {text ? "test_bpb" : "test_accuracy", metric_s}};
    size_t n_meta = sizeof meta / sizeof meta[0] - (isnan(m.metric) ? 1 : 0);
    if (td_safetensors_write(path, layout, m.blob, meta, n_meta, why, sizeof why) != 0)
      rc = td__hist_err("%s", why);
    else
      printf("wrote %s: model %s of run %s, round %" PRId64 " (%s), %zu tensors, %zu "
             "parameters\n",
             path, m.model, r->id, m.round, m.state, td_layout_count(layout),
             td_layout_param_count(layout));
  }
  td_layout_free(&layout);
  free(m.blob);
  td__hist_runs_free(r, r ? 1 : 0);
  td__hist_close(&set);
  return rc;
}
