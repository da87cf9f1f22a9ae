/* td_logits.c: traind's own predictions for model_interop.sh.
 *
 * td_logits MODEL FILE.safetensors DATASET ROWS OUTDIR builds MODEL on the
 * CPU, starts it from the file exactly as `init = FILE` does
 * (td_model_load_safetensors), loads DATASET as a run does (td_shard_open:
 * the same normalisation), and evaluates the first ROWS test rows with
 * td_model_eval. It writes OUTDIR/x.f32 (the normalised inputs, ROWS x F),
 * OUTDIR/y.i32 (labels) and OUTDIR/logits.f32 (ROWS x CLASSES), all
 * little-endian, and prints "rows R correct C loss_sum L" on stdout, so a
 * script can check an independent forward pass against traind's. */
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
