/* run_client_eval.c: the per-client view's evaluation on the compute thread
 * (client_eval = true): the global model on each of this node's clients'
 * held-out shares, posted as CLIENT_EVAL events (run_compute.c calls it at
 * the end of a round; the held-out shares are cut in compute/data/).
 * Thread: the compute thread only; state in td__compute_t (run_compute.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/data/dataset.h"
#include "compute/trainer.h"
#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"

/* The global model (as the run's own evaluation measures it)
 * on this node's held-out share, every eval_every rounds and after the last,
 * on every node whatever eval_nodes says (the share is a slice of the test
 * set, cheap beside the whole), posted before the round's EVAL or FINISHED. */
static td__run_flow_t client_eval_share(td__compute_t *c, uint64_t round,
                                        const td_dataset_t *share, unsigned client,
                                        bool on_anchor);

td__run_flow_t td__compute_client_eval(td__compute_t *c, uint64_t round, bool on_anchor) {
  td_run_t *run = c->run;
  if (round % run->spec.eval_every != 0 && round != run->rounds)
    return TD__RUN_GO_ON;
  if (c->data.heldout != NULL)
    return client_eval_share(c, round, c->data.heldout, 0, on_anchor);
  td__run_flow_t f = TD__RUN_GO_ON;
  for (unsigned j = 0; c->data.client_heldout != NULL && j < c->data.clients &&
                       f == TD__RUN_GO_ON; j++)
    if (c->data.client_heldout[j] != NULL) /* a client with no held-out rows has no score */
      f = client_eval_share(c, round, c->data.client_heldout[j], j, on_anchor);
  return f;
}

/* One held-out share's evaluation (client `client` of this node). */
static td__run_flow_t client_eval_share(td__compute_t *c, uint64_t round,
                                        const td_dataset_t *share, unsigned client,
                                        bool on_anchor) {
  td_run_t *run = c->run;
  td__run_flow_t f;
  bool swap = on_anchor;
  if (swap) { /* the anchor in the model for the evaluation, then back */
    if (c->saved == NULL && (c->saved = malloc(run->numel * sizeof(float))) == NULL) {
      snprintf(c->why, sizeof c->why, "out of memory for the client evaluation");
      return td__compute_fail(c);
    }
    td_backend_synchronize(c->be);
    memcpy(c->saved, c->params, run->numel * sizeof(float));
    memcpy(c->params, run->anchor, run->numel * sizeof(float));
    if ((f = td__compute_push(c)) != TD__RUN_GO_ON)
      return f;
  }
  double loss = NAN, acc = NAN;
  if (td_trainer_evaluate(c->tr, share, &loss, &acc, c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  if (swap) {
    td_backend_synchronize(c->be);
    memcpy(c->params, c->saved, run->numel * sizeof(float));
    if ((f = td__compute_push(c)) != TD__RUN_GO_ON)
      return f;
  }
  td_run_event_t ev = {.kind = TD_RUN_CLIENT_EVAL, .round = round, .loss = loss,
                       .accuracy = acc, .samples = td_dataset_rows(share), .client = client};
  return td__run_post(run, &ev) ? TD__RUN_GO_ON : TD__RUN_STOPPED;
}
