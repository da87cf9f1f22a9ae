/* td_logits.c: traind's own predictions for model_interop.sh.
 *
 * td_logits MODEL FILE.safetensors DATASET ROWS OUTDIR builds MODEL on the
 * CPU, starts it from the file exactly as `init = FILE` does
 * (td_model_load_safetensors), loads DATASET as a run does (td_shard_open:
 * the same normalisation), and evaluates the first ROWS test rows with
 * td_model_eval. It writes OUTDIR/x.f32 (the normalised inputs, ROWS x F),
 * OUTDIR/y.i32 (labels) and OUTDIR/logits.f32 (ROWS x CLASSES), all
 * little-endian, and prints "rows R correct C loss_sum L" on stdout, so a
 * script can check an independent forward pass against traind's.
 *
 * For a gpt MODEL, DATASET is bytes:FILE: row i is the CONTEXT bytes of FILE
 * from i x CONTEXT, each position's target the byte after it; x.i32 holds the
 * tokens (ROWS x CONTEXT), y.i32 the targets and logits.f32 ROWS x CONTEXT x
 * 256 floats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/model.h"
#include "compute/safetensors.h"
#include "compute/data/shard.h"

static int put(const char *dir, const char *name, const void *p, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  int ok = f != NULL && fwrite(p, 1, bytes, f) == bytes;
  if (f != NULL && fclose(f) != 0)
    ok = 0;
  return ok ? 0 : -1;
}

static int token_logits(td_backend_t *be, char **argv, int rows);

/* ROWS windows of the model's context from a byte file into tokens and
 * targets (malloc'd, the caller frees); 0 or -1 with why. */
static int read_windows(const char *path, int rows, int context, int32_t **tokens,
                        int32_t **targets, char *why, size_t why_len) {
  size_t need = (size_t)rows * (size_t)context + 1;
  unsigned char *buf = malloc(need);
  FILE *f = fopen(path, "rb");
  size_t got = f != NULL && buf != NULL ? fread(buf, 1, need, f) : 0;
  if (f != NULL)
    fclose(f);
  *tokens = malloc((need - 1) * sizeof **tokens);
  *targets = malloc((need - 1) * sizeof **targets);
  if (got != need || *tokens == NULL || *targets == NULL) {
    snprintf(why, why_len, "need %zu bytes of %s", need, path);
    free(buf);
    return -1;
  }
  for (size_t i = 0; i + 1 < need; i++) {
    (*tokens)[i] = buf[i];
    (*targets)[i] = buf[i + 1];
  }
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: td_logits MODEL FILE.safetensors DATASET ROWS OUTDIR\n");
    return 2;
  }
  int rows = atoi(argv[4]);
  char why[512];
  td_backend_t *be = NULL;
  td_model_t *m = NULL;
  td_shard_t data = {0};
  td_shard_opts_t so = {.dataset = argv[3], .partition = "all", .rank = 0, .nodes = 1, .seed = 1};
  int rc = td_backend_open(&be, "cpu", 1, why, sizeof why);
  if (rc == 0 && strncmp(argv[3], "bytes:", 6) == 0 && rows >= 1)
    return token_logits(be, argv, rows);
  td_image_shape_t *as = &so.images_as; /* images:DIR as the model reads it, as in a run */
  if (rc == 0)
    rc = td_model_spec_input_shape(argv[1], &as->channels, &as->height, &as->width, why,
                                   sizeof why);
  if (rc == 0)
    rc = td_shard_open(&data, &so, why, sizeof why);
  if (rc == 0 && (data.test == NULL || rows < 1 || (size_t)rows > td_dataset_rows(data.test))) {
    snprintf(why, sizeof why, "need a test set of at least %d rows", rows);
    rc = -1;
  }
  if (rc == 0)
    rc = td_model_open(&m, argv[1], be, rows, why, sizeof why);
  if (rc == 0)
    rc = td_model_load_safetensors(m, argv[2], NULL, why, sizeof why);
  int correct = 0;
  double loss_sum = 0;
  if (rc == 0)
    rc = td_model_eval_batch(m, td_dataset_features_const(data.test),
                             td_dataset_labels_const(data.test), rows, &loss_sum, &correct);
  if (rc == 0) {
    size_t dim = td_dataset_dim(data.test), classes = (size_t)td_model_classes(m);
    if (put(argv[5], "x.f32", td_dataset_features_const(data.test),
            (size_t)rows * dim * sizeof(float)) != 0 ||
        put(argv[5], "y.i32", td_dataset_labels_const(data.test), (size_t)rows * 4) != 0 ||
        put(argv[5], "logits.f32", td_model_logits(m), (size_t)rows * classes * 4) != 0) {
      snprintf(why, sizeof why, "cannot write into %s", argv[5]);
      rc = -1;
    }
  }
  if (rc == 0)
    printf("rows %d correct %d loss_sum %.9g\n", rows, correct, loss_sum);
  else
    fprintf(stderr, "td_logits: %s\n", why);
  td_model_close(&m);
  td_shard_close(&data);
  td_backend_close(&be);
  return rc == 0 ? 0 : 1;
}

/* main's gpt half: the model on ROWS windows of a byte file. */
static int token_logits(td_backend_t *be, char **argv, int rows) {
  char why[512];
  td_model_t *m = NULL;
  int32_t *tokens = NULL, *targets = NULL;
  int rc = td_model_open(&m, argv[1], be, rows, why, sizeof why);
  if (rc == 0)
    rc = td_model_load_safetensors(m, argv[2], NULL, why, sizeof why);
  int context = rc == 0 ? td_model_context(m) : 0, correct = 0;
  if (rc == 0)
    rc = read_windows(argv[3] + 6, rows, context, &tokens, &targets, why, sizeof why);
  double loss_sum = 0;
  td_batch_t batch = {.rows = rows, .tokens = tokens, .targets = targets};
  if (rc == 0)
    rc = td_model_eval(m, &batch, &loss_sum, &correct);
  size_t n = (size_t)rows * (size_t)context;
  if (rc == 0 && (put(argv[5], "x.i32", tokens, n * 4) != 0 ||
                  put(argv[5], "y.i32", targets, n * 4) != 0 ||
                  put(argv[5], "logits.f32", td_model_logits(m),
                      n * (size_t)td_model_classes(m) * 4) != 0)) {
    snprintf(why, sizeof why, "cannot write into %s", argv[5]);
    rc = -1;
  }
  if (rc == 0)
    printf("rows %d correct %d loss_sum %.9g\n", rows, correct, loss_sum);
  else
    fprintf(stderr, "td_logits: %s\n", why);
  free(tokens);
  free(targets);
  td_model_close(&m);
  td_backend_close(&be);
  return rc == 0 ? 0 : 1;
}
