/* model.h: trainctl model, a run's kept model (or a checkpoint) from a
 * ledger, written as safetensors (cli/model.c). */
#ifndef TD_CLI_MODEL_H
#define TD_CLI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "cli/ledgers.h"

/* `trainctl model RUN ARGS...`; returns the exit code (0, 1 with a one-line
 * error, 2 on a usage error). */
int td_model_main(int argc, char **argv);

/* A run's stored model, for trainctl predict and generate. */
typedef struct {
  char model[TD__LEDGERS_VALUE_MAX]; /* the model spec */
  char id[17];      /* the run id */
  int64_t round;
  unsigned batch;   /* the run's batch (its evaluations' chunk); 0: not in its spec */
  double metric;    /* the stored final metric; NaN: none */
  float *blob;      /* layout order, padding included; caller frees */
  size_t bytes;
} td__model_stored_t;
/* The model the ledgers in set keep for run `arg` (a unique prefix of its
 * id), or with round >= 1 that round's checkpoint. 0, or 1 after printing
 * one line (no such run, no model kept). */
int td__model_stored(td__ledgers_set_t *set, const char *arg, int64_t round,
                     td__model_stored_t *out);

#endif
