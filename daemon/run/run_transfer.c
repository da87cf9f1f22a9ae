/* run_transfer.c: knowledge transfer on the compute thread (transfer = N):
 * the probe rows every node scores its model on, the probe posted every N
 * rounds (a loss and a copy of the local model, for the loop to report and
 * serve), and the merge of a model fetched from a better-scoring member,
 * which is scored on the same rows first and merged only when it is better
 * (the loop's side is daemon/session/transfer.c). Thread: the compute thread
 * only; state in td__compute_t (run_compute.h). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/data/dataset.h"
#include "compute/model.h"
#include "compute/trainer.h"
#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"

/* Knowledge transfer compares every node on the same first rows of the eval
 * set, at most this many, so the scores are comparable and cheap (text: the
 * same first windows of the held-out text). */
#define TRANSFER_PROBE_ROWS 1000
#define TRANSFER_PROBE_WINDOWS 64

/* The local model's loss on knowledge transfer's probe rows (bits per byte
 * for text) and its accuracy (NaN for text); 0, or -1 when it cannot be
 * scored (no probe rows, an error, a loss that is not finite). */
static int probe_loss(td__compute_t *c, double *loss, double *acc) {
  double bpb = NAN;
  char why[TD__COMPUTE_WHY_MAX];
  *loss = *acc = NAN;
  int rc = c->text ? (c->probe_bytes > 0
                          ? td_trainer_evaluate_text(c->tr, td_text_data(c->data.text_valid),
                                                     c->probe_bytes, &bpb, why, sizeof why)
                          : -1)
                   : (c->val != NULL ? td_trainer_evaluate(c->tr, c->val, loss, acc, why,
                                                           sizeof why)
                                     : -1);
  if (c->text)
    *loss = bpb; /* lower is better either way: the transfer compares losses */
  return rc == 0 && isfinite(*loss) ? 0 : -1;
}

/* Fold a pending knowledge-transfer merge into params (and the round start,
 * so the merge is not mistaken for local progress); whether params changed.
 * The peer's reported loss is only its word: the fetched model is scored on
 * the same probe rows as this node's own, and merged only when it scores
 * lower, so a member that reports a loss of 0 and serves a bad model is
 * refused (one TD_RUN_MERGE event either way). A merge with lambda 1
 * replaces the model wholesale: the optimizer state of the old trajectory is
 * reset with it (compute/optim.h), a partial merge keeps it. */
bool td__compute_apply_merge(td__compute_t *c, td__run_flow_t *flow) {
  td_run_t *run = c->run;
  float *params = c->params, *fetched = NULL;
  double lambda = 0;
  pthread_mutex_lock(&run->mu);
  if (run->merge_lambda > 0) { /* take the fetched model over; td_run_merge makes another */
    fetched = run->merge;
    lambda = run->merge_lambda;
    run->merge = NULL;
    run->merge_lambda = 0;
  }
  pthread_mutex_unlock(&run->mu);
  if (fetched == NULL)
    return false;
  size_t bytes = run->numel * sizeof(float);
  float *own = malloc(bytes);
  double own_loss = NAN, fetched_loss = NAN, acc;
  bool scored = false;
  if (own != NULL && probe_loss(c, &own_loss, &acc) == 0) {
    memcpy(own, params, bytes);
    memcpy(params, fetched, bytes);
    *flow = td__compute_push(c);
    scored = *flow == TD__RUN_GO_ON && probe_loss(c, &fetched_loss, &acc) == 0;
    memcpy(params, own, bytes);
  }
  bool merge = scored && fetched_loss < own_loss;
  if (merge) {
    float l = (float)lambda;
    for (size_t i = 0; i < run->numel; i++)
      params[i] = (1.0f - l) * params[i] + l * fetched[i];
    pthread_mutex_lock(&run->mu);
    memcpy(run->start, params, bytes);
    pthread_mutex_unlock(&run->mu);
    if (lambda >= 1)
      td_trainer_reset_optim(c->tr); /* TD_ENOMEM keeps the old state: still a valid optimizer */
  }
  td_run_event_t ev = {.kind = TD_RUN_MERGE, .samples = merge, .loss = fetched_loss,
                       .bpb = own_loss};
  if (merge)
    snprintf(ev.message, sizeof ev.message, "merged (lambda %.2f): it scored %.4g on the probe "
             "rows, this node's model %.4g", lambda, fetched_loss, own_loss);
  else if (scored)
    snprintf(ev.message, sizeof ev.message, "not merged: it scored %.4g on the probe rows, no "
             "better than this node's model (%.4g), whatever its reported loss", fetched_loss,
             own_loss);
  else
    snprintf(ev.message, sizeof ev.message, "not merged: %s", own == NULL ? "out of memory to "
             "score it" : "it could not be scored on the probe rows");
  free(own);
  free(fetched);
  if (*flow == TD__RUN_GO_ON && !td__run_post(run, &ev))
    *flow = TD__RUN_STOPPED;
  return true; /* params went to the device and back: push them again */
}

/* Loss on the fixed validation subset and a copy of the local model, so the
 * loop can compare with peers and serve the model to a lagging one. A probe
 * that cannot be evaluated is skipped: the next one will do. */
td__run_flow_t td__compute_post_probe(td__compute_t *c, uint64_t round) {
  double loss, acc;
  if (probe_loss(c, &loss, &acc) != 0)
    return TD__RUN_GO_ON;
  td_run_event_t ev = {.kind = TD_RUN_PROBE, .round = round, .loss = loss, .accuracy = acc,
                       .bpb = c->text ? loss : NAN};
  return td__run_post_copy(c->run, &ev, "the transfer probe", c->params, c->run->numel, NULL, 0);
}

/* Knowledge transfer's probe rows: the first rows of the eval set. Without
 * memory for them the run goes on without probes. */
void td__compute_open_probe_rows(td__compute_t *c) {
  if (c->text) {
    size_t window = (size_t)td_model_context(td_trainer_model(c->tr)) + 1;
    size_t want = TRANSFER_PROBE_WINDOWS * window, have = td_text_bytes(c->data.text_valid);
    c->probe_bytes = have < want ? have : want;
    return;
  }
  size_t rows = td_dataset_rows(c->eval_set);
  size_t nv = rows < TRANSFER_PROBE_ROWS ? rows : TRANSFER_PROBE_ROWS;
  uint32_t *idx = malloc(nv * sizeof *idx);
  for (size_t i = 0; idx != NULL && i < nv; i++)
    idx[i] = (uint32_t)i;
  if (idx == NULL || td_dataset_subset(&c->val, c->eval_set, idx, nv) != 0)
    c->val = NULL;
  free(idx);
}
