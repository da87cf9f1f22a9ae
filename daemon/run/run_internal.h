/* run_internal.h: what the files of a run share and nobody else sees: the run
 * object itself and the calls between run.c (lifecycle, the event mailbox and
 * the hand-offs other threads call), run_compute.c and run_overlap.c (the
 * compute thread's rounds) and run_recon.c (reconciliation slots).
 *
 * Threads: every field below `mu` in the struct is guarded by it; the buffers
 * above it follow the ownership rules of run.h (the compute thread owns the
 * anchor, start, delta and avg slots except while the loop holds them by
 * round). Functions named *_locked expect the caller to hold run->mu. */
#ifndef TD_RUN_INTERNAL_H
#define TD_RUN_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "compute/data/dataset.h"
#include "compute/model.h"
#include "compute/trainer.h"
#include "daemon/run/run.h"
#include "scheduler/recon.h"
#include "scheduler/sample.h"

/* Events in flight from the compute thread to the loop. A full mailbox makes
 * the compute thread wait for the loop (see td__run_post), so this bounds
 * memory, not correctness. */
#define TD_RUN_MAILBOX 64
/* Batch plans (from_round, batch) kept; the oldest is forgotten first. */
#define TD_RUN_PLANS 4
/* Reconciliations in flight: one being exchanged while the next is posted. */
#define TD_RUN_REC_SLOTS TD_RECON_SLOTS
/* Verify rounds asked for at once (td_run_want_verify); the oldest is forgotten. */
#define TD_RUN_VERIFY_ASKED 4

struct td_run {
  /* set at start, then read-only */
  td_runspec_t spec;
  unsigned rank, nodes, local_batch;
  double slowdown;
  size_t numel;
  td_backend_t *probe_be; /* the layout comes from a batch-1 copy of the model */
  td_model_t *probe;
  uint64_t first_round; /* late join: the first round this node takes part in */
  uint64_t max_rounds;  /* this node's limit (0: none) */
  uint64_t max_checkpoint_bytes; /* this node's limit (0: none) */
  bool checkpoint_acks;          /* td_run_opts_t.checkpoint_acks */
  bool keep_model;               /* post TD_RUN_MODEL at the end */
  /* set by the compute thread before READY, then read-only */
  uint64_t rounds;
  unsigned *steps_of; /* H of round r at [r - 1] */
  uint64_t *label_counts; /* every node's rows per label (td_run_label_counts); NULL: none */
  unsigned label_nodes;
  int label_classes;
  /* clients > 1: the run's clients that hold rows (the sampling's candidates),
   * ascending, and how many clients the run has in all (nodes x clients) */
  uint16_t *client_cand;
  unsigned n_cand, n_clients;
  /* model state (ownership: run.h) */
  float *anchor;   /* consensus model (sync/overlap) */
  float *delta[2]; /* own delta of round r in [r % 2] */
  float *avg[2];   /* average of round r in [r % 2], written by the loop */
  bool mixes;      /* td_runspec_mixes: delta[] holds the model, avg[] the partners' mixed
                      model (topology gossip, groups) */
  float *start;    /* params at the start of the round (overlap, async) */
  float *mom;      /* outer state (NULL when not needed): the outer optimizer's, sgd's
                      momentum or adam/yogi/adagrad's m then v (scheduler/outer.h), then
                      overlap_fix = dc's last anchor step (dc_drift); a late joiner gets
                      it all with the anchor */
  size_t mom_floats; /* its length: td_outer_state_floats() + numel with dc or scaffold */
  size_t outer_floats; /* the outer optimizer's part: td_outer_state_floats() */
  float *dc_drift; /* overlap_fix = dc: the anchor's last step (in mom; NULL without dc) */
  float *scaffold_c; /* strategy = scaffold: the run's control variate c (in mom, after the
                        outer part, so late joiners, repairs and state hashes carry it) */
  double scaffold_lr_sum[2]; /* scaffold: round r's Σlr in [r % 2] (compute thread) */
  float *init;     /* the shared initial model (reconciliation measures from it) */

  uv_loop_t *loop;
  uv_async_t async;
  void (*on_events)(td_run_t *, void *);
  void *user;
  int (*open_backend)(td_backend_t **, int, char *, size_t); /* tests: see td_run_opts_t */
  pthread_t thread;
  bool thread_started;

  pthread_mutex_t mu;
  pthread_cond_t cv; /* bound to CLOCK_MONOTONIC; every change below broadcasts */
  td_run_event_t mailbox[TD_RUN_MAILBOX];
  unsigned mailbox_head, mailbox_count;
  uint64_t released_round;
  bool checkpoint_out; /* a checkpoint posted and not yet acknowledged (checkpoint_acks) */
  bool stop;    /* td_run_stop(): end at the next step and post STOPPED */
  bool closing; /* td_run_join() or td_run_close(): the loop waits for no more events */
  struct {
    uint64_t round; /* 0: free */
    float *own;     /* our anchor - init when posted, moved by later corrections */
    float *mean;    /* the members' mean of the same, once `have` */
    bool have;
  } rec[TD_RUN_REC_SLOTS];
  float *inbox;         /* async: weighted peer deltas not yet applied */
  float *merge;         /* knowledge transfer: a better peer's model, pending */
  double merge_lambda;  /* > 0 while a merge is pending */
  float *seed;          /* late join: anchor (+ momentum) from a member, NULL until given */
  bool held;            /* after READY, wait for td_run_go() */
  uint64_t want_anchor; /* post TD_RUN_ANCHOR once the anchor holds this round */
  uint64_t verify_asked[TD_RUN_VERIFY_ASKED]; /* verify rounds asked for (0: free) */
  uint64_t repair_round; /* after hashing this round, wait for repair_state (0: none) */
  float *repair_state;   /* the members' state of repair_round, once handed over */
  uint64_t nodes_from;  /* from this round on, `nodes_next` nodes share the batch */
  unsigned nodes_next;
  struct {
    uint64_t from;
    unsigned batch;
  } plans[TD_RUN_PLANS];
  unsigned n_plans;
};

/* What a phase of the compute thread tells the round loop. */
typedef enum {
  TD__RUN_GO_ON = 0, /* go on with the next phase */
  TD__RUN_STOPPED,   /* a stop was requested, or the run is closing: end (STOPPED) */
  TD__RUN_FAILED,    /* the phase posted FAILED with its reason: end */
} td__run_flow_t;

/* run.c: queue an event for the loop thread and wake it. When the mailbox is
 * full, waits until the loop drains it: an event is never dropped (a lost
 * ROUND_DONE would wedge a sync run, a lost STOPPED leave it "running"). Fails
 * (false) only when the mailbox is full once td_run_join() or td_run_close()
 * began: the loop waits for nothing more, ev->blob is freed, and the compute
 * thread ends. Compute thread only. */
bool td__run_post(td_run_t *run, td_run_event_t *ev);
/* run.c: post ev with a malloc'd copy of n floats of src (then n2 of src2
 * when src2 != NULL) as its blob. Out of memory posts FAILED naming `what`
 * (TD__RUN_FAILED); a failed td__run_post() gives TD__RUN_STOPPED. */
td__run_flow_t td__run_post_copy(td_run_t *run, td_run_event_t *ev, const char *what,
                                 const float *src, size_t n, const float *src2, size_t n2);
/* run.c: post FAILED with `why`; TD__RUN_FAILED. */
td__run_flow_t td__run_fail(td_run_t *run, const char *why);
/* run.c: whether td_run_stop(), td_run_join() or td_run_close() was called. */
bool td__run_stopping(td_run_t *run);

/* run_compute.c: the compute thread's body (pthread entry). */
void *td__run_compute_main(void *arg);

/* run_eval.c: evaluations on a replica, off the training path (see the file). */
typedef struct td__run_eval td__run_eval_t;
typedef struct {
  uint64_t round;
  int rc; /* 0, or the error with why */
  double loss, accuracy, bpb;
  char why[256];
} td__run_eval_result_t;
/* Start the evaluator on a replica: *be (a CPU backend of its own) and *tr (a
 * trainer of the run's model on it) become the evaluator's and are set to
 * NULL; it evaluates `set`, or the held-out `text` when text != NULL (both
 * borrowed). TD_ENOMEM + why, the replica still the caller's. */
int td__run_eval_open(td__run_eval_t **out, td_backend_t **be, td_trainer_t **tr,
                      const td_dataset_t *set, const uint8_t *text, size_t text_bytes,
                      char *why, size_t why_len);
/* Wait until no evaluation is running; the wait (by `clock`) is added to *idle_s. */
void td__run_eval_wait(td__run_eval_t *e, double *idle_s, double (*clock)(void));
/* A finished evaluation not taken yet: true and *out, once per evaluation. */
bool td__run_eval_take(td__run_eval_t *e, td__run_eval_result_t *out);
/* Evaluate a copy of `params` (numel floats, host memory) as round `round`.
 * Take the last result first: an untaken one is replaced. */
void td__run_eval_submit(td__run_eval_t *e, uint64_t round, const float *params);
/* Stop the thread (after the evaluation it is in) and free the replica. */
void td__run_eval_close(td__run_eval_t **self_p);

/* run_verify.c: model-state agreement's hand-offs (see the file). */
/* Whether the loop asked for a repair after `round` (td_run_want_repair). */
bool td__run_repairs(td_run_t *run, uint64_t round);
/* Wait until the loop hands over the members' state of `round` (returned,
 * td_run_anchor_bytes(), the caller owns it) or cancels (NULL), or a stop
 * (NULL, *stopped). */
float *td__run_wait_repair(td_run_t *run, uint64_t round, bool *stopped);

/* run_recon.c: reconciliation slots (see the file). */
/* Fold the finished reconciliations into the anchor, params and round start,
 * oldest first; the number applied. Caller holds run->mu. */
unsigned td__run_apply_reconciled_locked(td_run_t *run, float *params);
/* The same, taking run->mu; how many it applied. */
unsigned td__run_apply_reconciled(td_run_t *run, float *params);
/* The anchor holds `round`, a reconciliation round: keep anchor - init in a
 * free slot (waiting for one; the wait is added to *idle) and post
 * TD_RUN_RECONCILE. */
td__run_flow_t td__run_post_reconcile(td_run_t *run, uint64_t round, float *params,
                                      double *idle);
/* After the last round: wait until every reconciliation up to `round` is
 * applied, so every node ends on the same model. */
td__run_flow_t td__run_wait_reconciled(td_run_t *run, uint64_t round, float *params);

/* Round `round`'s sample of `nodes` members (td_run_sample; the compute
 * thread and the loop compute it alike). */
static inline uint64_t td__run_sample_of(const td_runspec_t *spec, uint64_t round,
                                         unsigned nodes) {
  nodes = nodes < 64 ? nodes : 64;
  return td_sample_draw(spec->seed, round, nodes, td_sample_size(spec->participation, nodes));
}

#endif
