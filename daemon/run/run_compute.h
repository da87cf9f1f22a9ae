/* run_compute.h: what the compute thread's files share and nobody else sees:
 * its state between the phases of a round (td__compute_t) and the calls
 * between run_compute.c (set-up, the phases every mode has, evaluation),
 * run_apply.c (device copies, waits, the outer step on a round's average and
 * what follows it, sync's end of a round) and run_overlap.c (overlap mode:
 * the delayed swap, the early swap during the next round's steps, fill
 * steps) and run_fragment.c (fragments > 1, both modes). run_compute.c calls
 * the others, run_overlap.c and run_fragment.c call run_apply.c.
 * Thread: the compute thread only; every call takes its state. */
#ifndef TD_RUN_COMPUTE_H
#define TD_RUN_COMPUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "compute/backend.h"
#include "compute/clients.h"
#include "compute/data/dataset.h"
#include "compute/data/shard.h"
#include "compute/trainer.h"
#include "daemon/run/run_internal.h"

/* Room for a failure's reason. */
#define TD__COMPUTE_WHY_MAX 512

/* Overlap fill (overlap_fill = F > 0): up to F x H local steps taken while the
 * previous round's average is still in flight, so compute waits less for a
 * slow network. They belong to the next round (its delta, samples and loss)
 * and do not move the learning-rate schedule, which keeps following the
 * nominal H steps per round. Off by default: larger deltas make the delayed
 * swap noisier where the network is fast anyway, and under lossy codecs the
 * anchors drift apart faster (which `reconcile` undoes). */
typedef struct {
  uint64_t samples;
  double loss_sum, seconds;
  unsigned steps;
} td__compute_fill_t;

/* The compute thread's state between phases. */
typedef struct {
  td_run_t *run;
  td_backend_t *be;
  char backend_why[sizeof ((td_run_event_t *)0)->message]; /* which backend and why (READY) */
  td_shard_t data;                  /* the node's partition: rows, or bytes of text */
  td_dataset_t *train, *test, *val; /* borrowed from data; val: knowledge transfer's probe
                                       rows (owned), or NULL */
  const td_dataset_t *eval_set;     /* NULL while test_dropped */
  bool test_dropped;                /* the test rows are freed until the last evaluation */
  bool text;                        /* a token model on text: evaluation in bits per byte */
  size_t probe_bytes;               /* text: knowledge transfer's probe prefix, 0 = none */
  td_trainer_t *tr;
  float *params; /* the trainer's model */
  td_clients_t *clients; /* clients > 1: the node's virtual clients; NULL: it is one */
  unsigned *which;       /* ...and room for a round's sampled ones (clients slots) */
  bool delta_ready;      /* the round's delta is in its slot already (virtual clients) */
  float *scaffold_ci;    /* strategy = scaffold: the ci of this node's clients (K x numel) */
  float *scaffold_corr;  /* ...and the round's correction c - ci the trainer adds */
  unsigned batch;  /* rows per step now */
  double capacity; /* samples/s, EWMA, measured on the run's backend */
  bool warm;       /* the backend has taken a step (device: its one-time costs are paid) */
  double idle;     /* seconds blocked since the last ROUND_DONE */
  td__compute_fill_t fill;     /* overlap fill steps since the last ROUND_DONE */
  float *lead;     /* overlap: what params hold of the last posted round beyond the
                      anchor (scheduler/overlap.h); NULL in the other modes */
  float *saved;    /* overlap, evaluated here: params while the anchor is evaluated */
  double posted_at[2];  /* when round r's delta was posted, in [r % 2] (mono seconds) */
  double compute_s;     /* the last round's compute (slowdown included, fill not) */
  uint64_t applied;     /* overlap: the last round whose average params hold */
  uint64_t early;       /* overlap: the round whose steps swapped its predecessor's average in
                           (overlap_early), 0 before any */
  unsigned swap_step;   /* ...and after how many of them (the event's swap_step) */
  bool fresh;           /* overlap: the next round waits for its predecessor's average
                           (exchange-bound, scheduler/overlap.h) */
  td__run_eval_t *eval; /* periodic evaluations off the training path (run_eval.c), or
                           NULL: evaluated here, between rounds */
  char why[TD__COMPUTE_WHY_MAX];
} td__compute_t;

/* run_apply.c */

/* The run fails with c->why (TD__RUN_FAILED). */
td__run_flow_t td__compute_fail(td__compute_t *c);
/* The host copy of the parameters from the device, after steps (no-op on the CPU). */
td__run_flow_t td__compute_pull(td__compute_t *c);
/* The host copy to the device, after the host changed it (no-op on the CPU). */
td__run_flow_t td__compute_push(td__compute_t *c);
/* Knowledge transfer (run_transfer.c): the probe rows (c->val or
 * c->probe_bytes; none without memory), set up once the eval set is open. */
void td__compute_open_probe_rows(td__compute_t *c);
/* The probe every `transfer` rounds: a PROBE event with the loss on the probe
 * rows and a copy of the local model; a model that cannot be scored is skipped. */
td__run_flow_t td__compute_post_probe(td__compute_t *c, uint64_t round);
/* Before a round: a fetched model pending (td_run_merge) is scored on the
 * probe rows and merged into params only when it beats this node's own; one
 * MERGE event says which. Whether params went through the device (push them
 * again); *flow is set on a failure or stop. */
bool td__compute_apply_merge(td__compute_t *c, td__run_flow_t *flow);
/* client_eval (run_client_eval.c): every eval_every rounds and after the
 * last, the global model on each held-out client share, posted as
 * CLIENT_EVAL; on_anchor: the model to score is the anchor (swapped into
 * params for the evaluation, then back). */
td__run_flow_t td__compute_client_eval(td__compute_t *c, uint64_t round, bool on_anchor);
/* Sleep so that the work since (t0, cpu0) ends `slowdown` times its cost after t0. */
void td__compute_slow_down(const td__compute_t *c, double t0, double cpu0);
/* The same, cut short when the loop releases `round` without waiting for
 * this node (a sync round closed by min_updates or round_deadline). */
void td__compute_slow_down_round(const td__compute_t *c, double t0, double cpu0,
                                 uint64_t round);
/* Nodes sharing the global batch in `round` (late joins raise it). */
unsigned td__run_nodes_at(td_run_t *run, uint64_t round);
/* Whether the loop has released `round` (no wait). */
bool td__compute_released(td_run_t *run, uint64_t round);
/* Wait until the loop released `round` or a stop was requested (c->idle grows). */
td__run_flow_t td__compute_wait_release(td__compute_t *c, uint64_t round);
/* Outer step on round r's average into the anchor; params follow it (sync:
 * lead NULL, params become the anchor; overlap: the swap of scheduler/overlap.h). */
void td__compute_apply_round(td_run_t *run, uint64_t r, float *params, const float *lead);
/* A copy of the model (async: the round start) for the ledger on checkpoint rounds. */
td__run_flow_t td__compute_post_checkpoint(td_run_t *run, uint64_t round);
/* Round r's reconciliation when it has one; `settle`: wait until it is applied. */
td__run_flow_t td__compute_reconcile(td__compute_t *c, uint64_t r, bool settle);
/* Round r's state hash when it is a verify round (TD_RUN_VERIFY, run_verify.c),
 * and the repair the loop asked for at r, waited for and adopted. */
td__run_flow_t td__compute_verify(td__compute_t *c, uint64_t round);
/* After round r's outer step: its state hash, reconciliation, late-join anchor
 * and checkpoint. */
td__run_flow_t td__compute_post_round_extras(td__compute_t *c, uint64_t r, bool settle);
/* sync: wait for the round's average, step the anchor and start from it. */
td__run_flow_t td__compute_after_round_sync(td__compute_t *c, uint64_t round);

/* run_overlap.c */

/* Whether the round's steps watch for its predecessor's average (overlap_early). */
bool td__compute_swaps_early(const td__compute_t *c, uint64_t round);
/* The round's n steps, swapping the predecessor's average in at the first
 * step boundary after it arrives; `taken`: the round's steps before these. */
td__run_flow_t td__compute_steps_swapping(td__compute_t *c, uint64_t round, unsigned long n,
                                          unsigned taken, td_train_stats_t *st);
/* What follows an overlapped round: the delayed swap and the pull-back. */
td__run_flow_t td__compute_after_round_overlap(td__compute_t *c, uint64_t round);

/* run_fragment.c (fragments > 1, scheduler/fragment.h) */
/* Round `round`'s update into its delta slot: params - anchor on the round's
 * fragment, zero elsewhere. */
void td__compute_fragment_delta(td_run_t *run, uint64_t round, const float *params);
/* Outer step on round r's average, on r's fragment only: that slice of the
 * anchor (and of the outer momentum) moves, and params' slice becomes
 * alpha params + (1 - alpha) anchor. */
void td__compute_apply_fragment(td_run_t *run, uint64_t r, float *params, double alpha);
/* What follows a round with fragments, sync or overlap: the fragment's
 * average applied (overlap: the previous round's, mixed by fragment_alpha),
 * what the round owes after it, and after the last round the anchor. */
td__run_flow_t td__compute_after_round_fragments(td__compute_t *c, uint64_t round);

#endif
