/* standalone.h: `traind --standalone`, the N = 1 baseline every experiment is
 * compared with: load the dataset, take partition K of N, train for the given
 * epochs with per-epoch progress on stdout, and optionally end with one JSON
 * object holding the final figures. */
#ifndef TD_STANDALONE_H
#define TD_STANDALONE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/run/runspec.h"

#include "compute/model.h"

/* One epoch as the ledger records a peer run's round. */
typedef struct {
  double started, ended; /* unix seconds */
  uint64_t steps, samples;
  double loss;           /* mean training loss */
  double eval_acc;       /* the evaluation after it; NaN for text */
  double eval_bpb;       /* text: held-out bits per byte; NaN otherwise */
  double lr;             /* the learning rate at its last step */
  double seconds;        /* time in training steps */
} td_standalone_epoch_t;

/* What a finished standalone run hands its keeper: the trained model, its
 * epochs and its final figures. The keeper stores the model where the caller
 * wants it (the ledger, a file) and names what it kept in kept_as, which the
 * summary prints (and --json carries as run_id). */
typedef struct {
  td_model_t *model; /* the trained model, borrowed for the call (host copy current) */
  unsigned epochs;
  const td_standalone_epoch_t *epoch; /* [epochs], borrowed for the call */
  double metric;     /* the last evaluation: accuracy, or bits per byte for text */
  double started;    /* unix seconds when training began */
  char kept_as[17];  /* written by the keeper: the run id it kept the model as ("": none) */
} td_standalone_end_t;
/* 0, or a TD_E* code with a one-line why: the run then fails. */
typedef int (*td_standalone_keep_fn)(td_standalone_end_t *end, void *user, char *why,
                                     size_t why_len);

/* Train as the spec says, printing progress to out; at the end keep (when not
 * NULL) is called once with the trained model, before the --json line.
 * Returns 0, or a TD_E* code with a one-line reason in why (bad data, shape
 * mismatch, divergence, a model that could not be kept...). */
int td_standalone_run(const td_runspec_t *rs, bool json, FILE *out, td_standalone_keep_fn keep,
                      void *keep_user, char *why, size_t why_len);

#endif
