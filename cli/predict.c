/* predict.c: `trainctl predict` and `trainctl generate`, a trained model put
 * to use in trainctl's own process (compute/predict.h), daemon up or down.
 *
 * MODEL is a safetensors file (a path that ends in .safetensors or names an
 * existing file; its model spec is the file's `model` metadata, which trainctl model
 * writes, or --model SPEC) or a run in the ledgers (a unique prefix of its
 * id, as the other ledger commands take it, with --round R for a
 * checkpoint): the run's kept model, and the run's batch as the chunk of the
 * evaluation, so that predict reproduces the run's own test accuracy. The
 * dataset is named as the run key `dataset` names it; paths are the caller's
 * own (trainctl reads them with the caller's rights; no data root applies).
 *
 * predict's CSV has one row per example of the split it evaluated: index
 * (0-based, in the split's order), predicted (argmax of the logits), label,
 * then logit_0 ... logit_{C-1}, the model's raw outputs before the softmax,
 * printed with 9 significant digits (float32 round-trips). */
#include "cli/predict.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/ledgers.h"
#include "cli/model.h"
#include "compute/predict.h"
#include "compute/safetensors.h"

#define MAX_TOKENS 1000000u

typedef struct {
  td__ledgers_set_t set;
  const char *arg, *model_spec, *round_text;
  int threads;
  td__model_stored_t stored;
  char file_model[TD__LEDGERS_VALUE_MAX];
  td_predict_model_t source;
} model_arg_t;

static bool names_file(const char *arg) {
  size_t len = strlen(arg), ext = strlen(".safetensors");
  struct stat st;
  return (len > ext && strcmp(arg + len - ext, ".safetensors") == 0) ||
         (stat(arg, &st) == 0 && S_ISREG(st.st_mode));
}

/* Resolve MODEL into m->source: a file and its spec, or a run's stored model.
 * 0, or 1 after one line. */
static int resolve_model(model_arg_t *m) {
  m->source.threads = m->threads;
  int64_t round = -1;
  if (m->round_text != NULL) {
    char *end;
    errno = 0;
    long long v = strtoll(m->round_text, &end, 10);
    if (*m->round_text == '\0' || *end != '\0' || v < 1 || errno != 0)
      return td__ledgers_err("--round takes a round number (1, 2, ...), not '%s'", m->round_text);
    round = v;
  }
  if (names_file(m->arg)) {
    if (round >= 0)
      return td__ledgers_err("--round picks a run's checkpoint; %s is a file", m->arg);
    m->source.file = m->arg;
    if (m->model_spec == NULL) {
      td_safetensors_t *st = NULL;
      char why[512];
      if (td_safetensors_open(&st, m->arg, why, sizeof why) != 0)
        return td__ledgers_err("%s", why);
      const char *spec = td_safetensors_meta(st, "model");
      if (spec != NULL)
        snprintf(m->file_model, sizeof m->file_model, "%s", spec);
      td_safetensors_close(&st);
      if (spec == NULL)
        return td__ledgers_err("%s names no model in its metadata: give --model SPEC (the run "
                               "key model it was trained with)",
                               m->arg);
      m->model_spec = m->file_model;
    }
    m->source.model_spec = m->model_spec;
    return 0;
  }
  if (td__model_stored(&m->set, m->arg, round, &m->stored) != 0)
    return 1;
  m->source.model_spec = m->model_spec != NULL ? m->model_spec : m->stored.model;
  m->source.blob = m->stored.blob;
  m->source.blob_bytes = m->stored.bytes;
  return 0;
}

/* The options every model command shares; 1: taken, 0: not one, -1: error. */
static int take_model_opt(model_arg_t *m, int argc, char **argv, int *a) {
  int t = td__ledgers_take_db_opt(&m->set, argc, argv, a);
  if (t != 0)
    return t;
  if (strcmp(argv[*a], "--round") == 0 && *a + 1 < argc)
    m->round_text = argv[++*a];
  else if (strcmp(argv[*a], "--model") == 0 && *a + 1 < argc)
    m->model_spec = argv[++*a];
  else if (strcmp(argv[*a], "--threads") == 0 && *a + 1 < argc) {
    m->threads = atoi(argv[++*a]);
    if (m->threads < 1 || m->threads > 256) {
      td__ledgers_err("--threads takes 1 to 256, not '%s'", argv[*a]);
      return -1;
    }
  } else
    return 0;
  return 1;
}

static void model_arg_free(model_arg_t *m) {
  free(m->stored.blob);
  td__ledgers_close(&m->set);
}

typedef struct {
  FILE *f;
  bool header;
} csv_t;

static int write_row(void *user, size_t index, const float *logits, int classes, int32_t label) {
  csv_t *c = user;
  if (!c->header) {
    fprintf(c->f, "index,predicted,label");
    for (int k = 0; k < classes; k++)
      fprintf(c->f, ",logit_%d", k);
    fputc('\n', c->f);
    c->header = true;
  }
  int best = 0;
  for (int k = 1; k < classes; k++)
    if (logits[k] > logits[best])
      best = k;
  fprintf(c->f, "%zu,%d,%d", index, best, (int)label);
  for (int k = 0; k < classes; k++)
    fprintf(c->f, ",%.9g", (double)logits[k]);
  return fputc('\n', c->f) == EOF ? -1 : 0;
}

int td_predict_main(int argc, char **argv) {
  static const char use[] = "trainctl predict MODEL --data DATASET [-o FILE.csv] [--json] "
                            "[--round R] [--model SPEC] [--batch B] [--threads N] "
                            "[--db FILE | --data-dir DIR]...";
  model_arg_t m = {0};
  const char *dataset = NULL, *out_path = NULL;
  bool json = false;
  long batch = 0;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = take_model_opt(&m, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 1)
      continue;
    else if (strcmp(argv[a], "--data") == 0 && a + 1 < argc)
      dataset = argv[++a];
    else if ((strcmp(argv[a], "-o") == 0 || strcmp(argv[a], "--output") == 0) && a + 1 < argc)
      out_path = argv[++a];
    else if (strcmp(argv[a], "--batch") == 0 && a + 1 < argc) {
      char *end;
      batch = strtol(argv[++a], &end, 10);
      if (*end != '\0' || batch < 1 || batch > 65536)
        rc = td__ledgers_err("--batch takes 1 to 65536, not '%s'", argv[a]);
    } else if (strcmp(argv[a], "--json") == 0)
      json = true;
    else if (argv[a][0] != '-' && m.arg == NULL)
      m.arg = argv[a];
    else
      rc = td__ledgers_usage(use);
  }
  if (rc == 0 && (m.arg == NULL || dataset == NULL))
    rc = td__ledgers_usage(use);
  if (rc == 0)
    rc = resolve_model(&m);
  csv_t csv = {0};
  if (rc == 0 && out_path != NULL && (csv.f = fopen(out_path, "w")) == NULL)
    rc = td__ledgers_err("cannot write %s: %s", out_path, strerror(errno));
  td_predict_result_t res;
  char why[768];
  if (rc == 0) {
    td_predict_opts_t po = {.model = m.source, .dataset = dataset,
                            .batch = batch > 0 ? (unsigned)batch : m.stored.batch,
                            .row = csv.f != NULL ? write_row : NULL, .user = &csv};
    if (td_predict(&po, &res, why, sizeof why) != 0)
      rc = td__ledgers_err("predict: %s", why);
    else if (res.text && csv.f != NULL)
      rc = td__ledgers_err("-o: a gpt's predictions are not rows of a table; predict prints "
                           "its bits per byte without -o");
  }
  if (csv.f != NULL && fclose(csv.f) != 0 && rc == 0)
    rc = td__ledgers_err("cannot write %s: %s", out_path, strerror(errno));
  if (rc != 0 && out_path != NULL && csv.f != NULL)
    remove(out_path);
  const char *source = m.source.file != NULL ? m.source.file : m.stored.id;
  if (rc == 0 && json) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "model", json_object_new_string(m.source.model_spec));
    json_object_object_add(o, "source", json_object_new_string(source));
    json_object_object_add(o, "dataset", json_object_new_string(dataset));
    if (res.text) {
      json_object_object_add(o, "test_bpb", json_object_new_double(res.bits_per_byte));
    } else {
      json_object_object_add(o, "split", json_object_new_string(res.test_split ? "test" : "train"));
      json_object_object_add(o, "rows", json_object_new_int64((int64_t)res.rows));
      json_object_object_add(o, "accuracy", json_object_new_double(res.accuracy));
      json_object_object_add(o, "loss", json_object_new_double(res.loss));
    }
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
  } else if (rc == 0 && res.text) {
    printf("%s (%s) on the held-out text of %s: %.6f bits per byte\n", source,
           m.source.model_spec, dataset, res.bits_per_byte);
  } else if (rc == 0) {
    printf("%s (%s) on the %s split of %s: %zu rows, accuracy %.4f, loss %.6f%s%s\n", source,
           m.source.model_spec, res.test_split ? "test" : "training", dataset, res.rows,
           res.accuracy, res.loss, out_path ? "; predictions in " : "", out_path ? out_path : "");
  }
  model_arg_free(&m);
  return rc;
}

int td_generate_main(int argc, char **argv) {
  static const char use[] = "trainctl generate MODEL --prompt TEXT [--tokens N] "
                            "[--temperature T] [--seed S] [--round R] [--model SPEC] "
                            "[--threads N] [--db FILE | --data-dir DIR]...";
  model_arg_t m = {0};
  const char *prompt = NULL;
  unsigned long tokens = 200, seed = 1;
  double temperature = 1.0;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = take_model_opt(&m, argc, argv, &a);
    char *end = NULL;
    if (t < 0)
      rc = 1;
    else if (t == 1)
      continue;
    else if (strcmp(argv[a], "--prompt") == 0 && a + 1 < argc)
      prompt = argv[++a];
    else if (strcmp(argv[a], "--tokens") == 0 && a + 1 < argc) {
      tokens = strtoul(argv[++a], &end, 10);
      if (*end != '\0' || argv[a][0] == '-' || tokens > MAX_TOKENS)
        rc = td__ledgers_err("--tokens takes 0 to %u, not '%s'", MAX_TOKENS, argv[a]);
    } else if (strcmp(argv[a], "--temperature") == 0 && a + 1 < argc) {
      temperature = strtod(argv[++a], &end);
      if (*end != '\0' || !isfinite(temperature) || temperature < 0 || temperature > 100)
        rc = td__ledgers_err("--temperature takes a number from 0 (greedy) to 100, not '%s'",
                             argv[a]);
    } else if (strcmp(argv[a], "--seed") == 0 && a + 1 < argc) {
      errno = 0;
      seed = strtoul(argv[++a], &end, 10);
      if (*end != '\0' || argv[a][0] == '-' || errno != 0)
        rc = td__ledgers_err("--seed takes a whole number, not '%s'", argv[a]);
    } else if (argv[a][0] != '-' && m.arg == NULL)
      m.arg = argv[a];
    else
      rc = td__ledgers_usage(use);
  }
  if (rc == 0 && (m.arg == NULL || prompt == NULL))
    rc = td__ledgers_usage(use);
  if (rc == 0 && prompt[0] == '\0')
    rc = td__ledgers_err("--prompt is empty: generate continues at least one byte of text");
  if (rc == 0)
    rc = resolve_model(&m);
  uint8_t *text = NULL;
  char why[768];
  if (rc == 0) {
    td_generate_opts_t go = {.model = m.source, .prompt = (const uint8_t *)prompt,
                             .prompt_len = strlen(prompt), .tokens = (unsigned)tokens,
                             .temperature = temperature, .seed = seed};
    if (td_generate(&go, &text, why, sizeof why) != 0)
      rc = td__ledgers_err("generate: %s", why);
  }
  if (rc == 0) {
    fputs(prompt, stdout);
    fwrite(text, 1, tokens, stdout);
    fputc('\n', stdout);
  }
  free(text);
  model_arg_free(&m);
  return rc;
}
