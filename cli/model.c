/* model.c: `trainctl model RUN [--round R] -o FILE [--format safetensors|onnx]`.
 *
 * Reads a run's model from a node ledger, read-only, daemon up or down (the
 * ledgers as cli/ledgers.h finds them), and writes it as safetensors
 * (common/safetensors_write.h) or as an ONNX inference graph
 * (compute/onnx.h): the run's kept model (the ledger's `models` row: its
 * final consensus model, or its last one when it was stopped or failed), or
 * with --round R that row or the checkpoint of round R. The tensor names,
 * shapes and offsets come from the row's `tensors` JSON, which the daemon
 * wrote from the layout it trained, so safetensors needs no model code; ONNX
 * needs the graph, which compute/onnx.c builds from the row's model spec
 * after checking the stored tensors against it, and the input normalisation
 * the run applied, which it computes from the run's dataset again. The ledger
 * is not trusted: every tensor must lie inside the stored buffer. Runs on
 * trainctl's thread. */
#include "cli/model.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ledgers.h"
#include "common/safetensors_write.h"
#include "compute/onnx.h"

#define MAX_TENSORS 4096 /* as the safetensors reader's limit */

typedef struct {
  bool found;
  int64_t round;
  char state[32];
  double metric;
  char model[TD__LEDGERS_VALUE_MAX];
  char *tensors; /* the models row's JSON; owned; NULL: none */
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

/* One row (round, state, metric, model, tensors, blob) of sql into *out; 1
 * after an error. A row that was found replaces what *out held. */
static int read_row(sqlite3 *db, const char *sql, int64_t run_id, int64_t round, stored_t *out) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("cannot read the ledger: %s", sqlite3_errmsg(db));
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
    const char *tensors = (const char *)sqlite3_column_text(st, 4);
    if (tensors != NULL) {
      free(out->tensors);
      out->tensors = strdup(tensors);
    }
    free(out->blob);
    out->bytes = (size_t)sqlite3_column_bytes(st, 5);
    const void *blob = sqlite3_column_blob(st, 5);
    out->blob = malloc(out->bytes > 0 ? out->bytes : 1);
    if (out->blob == NULL || (tensors != NULL && out->tensors == NULL))
      rc = td__ledgers_err("out of memory for a %zu-byte model", out->bytes);
    else if (out->bytes > 0)
      memcpy(out->blob, blob, out->bytes);
  } else if (step != SQLITE_DONE) {
    rc = td__ledgers_err("cannot read the ledger: %s", sqlite3_errmsg(db));
  }
  sqlite3_finalize(st);
  return rc;
}

/* The run's kept model, or (round >= 1 and not the kept one) the checkpoint
 * of that round with the kept model's tensors. Without a models row there is
 * no layout to name the tensors by: nothing is found. */
static int find_model(const td__ledgers_run_t *r, int64_t round, stored_t *out) {
  sqlite3 *db = r->ledger->db;
  if (!has_table(db, "models"))
    return 0;
  int rc = read_row(db,
                    "SELECT round, state, metric, model, tensors, blob FROM models"
                    " WHERE run_id = ?1 AND ?2 = ?2",
                    r->run_id, round, out);
  if (rc != 0 || !out->found || round < 0 || out->round == round)
    return rc;
  out->found = false;
  out->metric = NAN;
  rc = read_row(db,
                "SELECT round, 'checkpoint', NULL, NULL, NULL, blob FROM checkpoints"
                " WHERE run_id = ?1 AND round = ?2",
                r->run_id, round, out);
  return rc;
}

/* The tensors of a models row's JSON ([{"name", "shape", "offset"}]) into
 * out[] (names borrowed from *root, which the caller puts), each checked to
 * lie inside a buffer of `floats`. 0, or 1 after printing why. */
static int parse_tensors(const char *run, const char *text, size_t floats, json_object **root,
                         td_st_tensor_t **out, size_t *n_out, size_t *params) {
  *root = json_tokener_parse(text);
  size_t n = *root != NULL && json_object_is_type(*root, json_type_array)
                 ? json_object_array_length(*root)
                 : 0;
  if (n == 0 || n > MAX_TENSORS)
    return td__ledgers_err("run %s: the ledger's tensor list of its model is damaged", run);
  td_st_tensor_t *t = calloc(n, sizeof *t);
  if (t == NULL)
    return td__ledgers_err("out of memory");
  *params = 0;
  for (size_t i = 0; i < n; i++) {
    json_object *o = json_object_array_get_idx(*root, i), *name, *shape, *offset;
    bool ok = json_object_object_get_ex(o, "name", &name) &&
              json_object_is_type(name, json_type_string) &&
              json_object_object_get_ex(o, "shape", &shape) &&
              json_object_is_type(shape, json_type_array) &&
              json_object_array_length(shape) <= TD_ST_MAX_DIMS &&
              json_object_object_get_ex(o, "offset", &offset) &&
              json_object_is_type(offset, json_type_int) && json_object_get_int64(offset) >= 0;
    t[i].name = ok ? json_object_get_string(name) : NULL;
    t[i].ndim = ok ? (uint32_t)json_object_array_length(shape) : 0;
    t[i].offset = ok ? (size_t)json_object_get_int64(offset) : 0;
    t[i].numel = 1;
    for (uint32_t d = 0; ok && d < t[i].ndim; d++) {
      json_object *dim = json_object_array_get_idx(shape, d);
      int64_t v = json_object_is_type(dim, json_type_int) ? json_object_get_int64(dim) : -1;
      ok = v > 0 && (uint64_t)v <= floats && t[i].numel <= floats / (size_t)v;
      t[i].shape[d] = ok ? (uint64_t)v : 0;
      t[i].numel *= ok ? (size_t)v : 1;
    }
    if (!ok || t[i].offset > floats || t[i].numel > floats - t[i].offset) {
      free(t);
      return td__ledgers_err("run %s: the ledger's tensor list of its model is damaged "
                             "(tensor %zu does not fit the stored %zu floats)",
                             run, i, floats);
    }
    *params += t[i].numel;
  }
  *out = t;
  *n_out = n;
  return 0;
}

#define TD__STR2(x) #x
#define TD__STR(x) TD__STR2(x)

/* The ONNX file of the stored model: its graph from the row's model spec,
 * checked tensor by tensor against the stored list, and the input
 * normalisation of the run's dataset. 0, or 1 after printing why. */
static int write_onnx(const td__ledgers_run_t *r, const stored_t *m, const td_st_tensor_t *tensors,
                      size_t n_tensors, const td_st_meta_t *meta, size_t n_meta,
                      const char *path) {
  char dataset[TD__LEDGERS_VALUE_MAX] = "auto", why[512];
  if (!td__ledgers_spec_get(r->spec, "dataset", dataset, sizeof dataset))
    snprintf(dataset, sizeof dataset, "auto");
  td_onnx_opts_t o = {.spec = m->model,
                      .tensors = tensors,
                      .n_tensors = n_tensors,
                      .params = m->blob,
                      .floats = m->bytes / sizeof(float),
                      .meta = meta,
                      .n_meta = n_meta};
  if (td_onnx_check(&o, why, sizeof why) != 0)
    return td__ledgers_err("run %s: %s", r->id, why);
  if (td_onnx_input_stats(m->model, dataset, &o.normalize, &o.mean, &o.std, why, sizeof why) !=
      0)
    return td__ledgers_err("run %s: cannot find the input normalisation its training applied "
                           "(the ONNX graph starts with it): %s",
                           r->id, why);
  if (td_onnx_write(path, &o, why, sizeof why) != 0)
    return td__ledgers_err("run %s: %s", r->id, why);
  return 0;
}

int td__model_stored(td__ledgers_set_t *set, const char *arg, int64_t round,
                     td__model_stored_t *out) {
  memset(out, 0, sizeof *out);
  td__ledgers_run_t *r = NULL;
  int rc = td__ledgers_one_run(set, arg, &r);
  stored_t m = {.metric = NAN};
  if (rc == 0)
    rc = find_model(r, round, &m);
  if (rc == 0 && !m.found && round >= 0)
    rc = td__ledgers_err("run %s has no model of round %" PRId64 " in %s", r->id, round,
                         r->ledger->path);
  else if (rc == 0 && !m.found)
    rc = td__ledgers_err("no model stored for run %s in %s (this one %s)", r->id,
                         r->ledger->path,
                         strcmp(r->state, "running") == 0 ? "is still running"
                                                          : "ended before keeping one");
  if (rc == 0 && m.model[0] == '\0' &&
      !td__ledgers_spec_get(r->spec, "model", m.model, sizeof m.model))
    rc = td__ledgers_err("run %s: its spec names no model", r->id);
  if (rc == 0) {
    char batch[32];
    snprintf(out->model, sizeof out->model, "%s", m.model);
    snprintf(out->id, sizeof out->id, "%s", r->id);
    out->round = m.round;
    out->batch = td__ledgers_spec_get(r->spec, "batch", batch, sizeof batch)
                     ? (unsigned)strtoul(batch, NULL, 10)
                     : 0;
    out->metric = m.metric;
    out->blob = m.blob;
    out->bytes = m.bytes;
    m.blob = NULL;
  }
  free(m.tensors);
  free(m.blob);
  td__ledgers_runs_free(r, r ? 1 : 0);
  return rc;
}

int td_model_main(int argc, char **argv) {
  static const char use[] = "trainctl model RUN [--round R] -o FILE [--format safetensors|onnx] "
                            "[--db FILE | --data-dir DIR]...";
  td__ledgers_set_t set = {0};
  const char *arg = NULL, *path = NULL, *format = "safetensors", *round_text = NULL;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__ledgers_take_db_opt(&set, argc, argv, &a);
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
      rc = td__ledgers_usage(use);
  }
  if (rc == 0 && (arg == NULL || path == NULL))
    rc = td__ledgers_usage(use);
  bool onnx = strcmp(format, "onnx") == 0;
  if (rc == 0 && !onnx && strcmp(format, "safetensors") != 0) {
    fprintf(stderr, "trainctl: error: unknown model format '%s' (safetensors, onnx)\n", format);
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
  td__ledgers_run_t *r = NULL;
  if (rc == 0)
    rc = td__ledgers_one_run(&set, arg, &r);
  stored_t m = {.metric = NAN};
  if (rc == 0)
    rc = find_model(r, round, &m);
  if (rc == 0 && !m.found && round >= 0)
    rc = td__ledgers_err("run %s has no model of round %" PRId64 " in %s (its kept model and "
                           "checkpoints: trainctl model %s -o FILE without --round)",
                           r->id, round, r->ledger->path, r->id);
  else if (rc == 0 && !m.found)
    rc = td__ledgers_err("no model stored for run %s in %s (a run keeps its model, tensor "
                           "names and shapes with it, when it ends; "
                           "this one %s)",
                           r->id, r->ledger->path,
                      strcmp(r->state, "running") == 0 ? "is still running"
                                                            : "ended before keeping one");
  if (rc == 0 && m.model[0] == '\0' && !td__ledgers_spec_get(r->spec, "model", m.model,
                                                           sizeof m.model))
    rc = td__ledgers_err("run %s: its spec names no model", r->id);
  json_object *root = NULL;
  td_st_tensor_t *tensors = NULL;
  size_t n_tensors = 0, params = 0;
  if (rc == 0 && m.tensors == NULL)
    rc = td__ledgers_err("run %s: the ledger holds no tensor list for its model", r->id);
  if (rc == 0)
    rc = parse_tensors(r->id, m.tensors, m.bytes / sizeof(float), &root, &tensors, &n_tensors,
                       &params);
  if (rc == 0) {
    char round_s[32], metric_s[32], why[512];
    snprintf(round_s, sizeof round_s, "%" PRId64, m.round);
    snprintf(metric_s, sizeof metric_s, "%.9g", m.metric);
    bool text = strncmp(m.model, "gpt:", 4) == 0;
    td_st_meta_t meta[] = {
        {"format", "pt"},        {"producer", "traind"}, {"model", m.model},
        {"run_id", r->id},       {"round", round_s},      {"state", m.state},
        {text ? "test_bpb" : "test_accuracy", metric_s}};
    size_t n_meta = sizeof meta / sizeof meta[0] - (isnan(m.metric) ? 1 : 0);
    if (onnx) /* the metadata less "format: pt", which is safetensors' own */
      rc = write_onnx(r, &m, tensors, n_tensors, meta + 1, n_meta - 1, path);
    else if (td_st_write(path, tensors, n_tensors, m.blob, meta, n_meta, why, sizeof why) != 0)
      rc = td__ledgers_err("%s", why);
    if (rc == 0)
      printf("wrote %s: model %s of run %s, round %" PRId64 " (%s), %zu tensors, %zu "
             "parameters%s\n",
             path, m.model, r->id, m.round, m.state, n_tensors, params,
             onnx ? ", ONNX opset " TD__STR(TD_ONNX_OPSET) : "");
  }
  free(tensors);
  json_object_put(root);
  free(m.tensors);
  free(m.blob);
  td__ledgers_runs_free(r, r ? 1 : 0);
  td__ledgers_close(&set);
  return rc;
}
