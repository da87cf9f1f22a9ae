/* run.h: one training run on this node: the compute thread and its hand-offs.
 * (run.c: lifecycle and mailbox; run_compute.c: the compute thread's rounds,
 * run_overlap.c: overlap mode's part of them, run_compute.h: what those two
 * share; run_recon.c: reconciliation slots; run_internal.h: what they share.)
 *
 * The compute thread loads the dataset, takes partition `rank` of `nodes`,
 * and runs rounds of H local SGD steps (H from `local_steps`, or the QSR).
 * After round r it writes its delta (the round's local progress) into slot
 * r % 2, posts TD_RUN_ROUND_DONE to the loop thread (a queue + uv_async_send),
 * and then, by mode (docs/algorithms.md#sync-overlap-and-async):
 *   sync:    waits until the loop releases r, applies the outer step on the
 *            round average and continues from the new anchor;
 *   overlap: continues at once; at the end of round r + 1 it waits for r's
 *            average (normally long there) and swaps its own stale delta for
 *            the outer step (CO2's one-round-delayed form), so compute never
 *            waits a round for the network; with overlap_early the swap is
 *            made at the first step of r + 1 after the average arrives;
 *   async:S: never waits for a round: peers' deltas are added into an inbox
 *            as they arrive (weighted by sample share and staleness) and folded
 *            in at the end of each round; it only waits when it would run more
 *            than S + 1 rounds ahead of the slowest live peer.
 * Ownership: the loop thread reads td_run_delta(r) until it has packed and
 * aggregated round r, and writes td_run_avg(r) (the weighted mean of every
 * delta of round r) before td_run_release(r); the compute thread touches
 * neither slot until then. The compute thread never touches a socket; the
 * loop thread never runs BLAS. */
#ifndef TD_RUN_H
#define TD_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "compute/backend.h"
#include "compute/params.h"
#include "scheduler/sample.h"
#include "daemon/run/runspec.h"
#include "scheduler/agree.h"

typedef enum {
  TD_RUN_READY = 0,  /* dataset loaded; rounds and samples are known; backend names the
                        compute backend, message says which one and why (auto's choice) */
  TD_RUN_ROUND_DONE, /* local steps of `round` done; delta ready */
  TD_RUN_EVAL,       /* anchor after `round` evaluated */
  TD_RUN_CHECKPOINT, /* blob: a copy of the anchor after `round` (loop owns it) */
  TD_RUN_MODEL,      /* opts.keep_model only; blob: the model the run ends with, after `round` (loop owns it):
                        after the last round before FINISHED, the consensus; before
                        STOPPED, the anchor of the last round applied (round 0: none) */
  TD_RUN_ANCHOR,     /* late join: blob: the anchor holding `round` (then the outer
                        momentum when the run has one), td_run_anchor_bytes(); loop owns it */
  TD_RUN_RECONCILE,  /* the anchor holds `round`, a reconciliation round; blob: anchor -
                        init, td_run_numel() floats, loop owns it */
  TD_RUN_VERIFY,     /* the anchor holds `round`, a verify round: hash is its state hash
                        (scheduler/agree.h); blob: that state, td_run_anchor_bytes() (loop
                        owns it) */
  TD_RUN_PROBE,      /* knowledge transfer: loss on the shared validation subset,
                        blob: a copy of the local model (loop owns it) */
  TD_RUN_FINISHED,   /* all rounds done; final evaluation in accuracy/loss (bpb for text) */
  TD_RUN_FAILED,     /* message says why */
  TD_RUN_STOPPED,    /* stopped on request */
  TD_RUN_MERGE,      /* knowledge transfer: a fetched model was scored on the probe rows
                        before its merge: samples 1 merged, 0 not; loss its score, bpb
                        this node's own (NaN when not scored); message says which */
  TD_RUN_CLIENT_EVAL, /* client_eval: the global model after `round` on this node's held-out
                         share (with clients > 1, client `client`'s): accuracy, loss,
                         samples = its rows (before EVAL/FINISHED) */
} td_run_event_kind_t;

typedef struct {
  td_run_event_kind_t kind;
  uint64_t round;
  uint64_t samples;     /* ROUND_DONE: samples used in the round; READY: the training rows
                           this node holds (0 for text) */
  double loss;          /* ROUND_DONE: mean training loss; EVAL/FINISHED: test loss */
  double accuracy;      /* EVAL/FINISHED: test accuracy (NaN for a text run) */
  double bpb;           /* EVAL/FINISHED of a text run: held-out bits per byte, also in
                           loss; PROBE of a text run: the probe's bits per byte (NaN for
                           a run on classes) */
  double compute_s;     /* ROUND_DONE: seconds computing (slowdown included) */
  double idle_s;        /* ROUND_DONE: seconds blocked between the previous round and this one */
  double capacity;      /* ROUND_DONE: samples/s, EWMA over rounds */
  unsigned batch;       /* ROUND_DONE: rows per step in the round */
  unsigned client;      /* CLIENT_EVAL: the node's client (0 to clients - 1) */
  unsigned steps;       /* ROUND_DONE: local steps in the round (H) */
  unsigned fill_steps;  /* ROUND_DONE: overlap: extra steps taken while waiting, included
                           in samples and loss but not in compute_s */
  double fill_s;        /* ROUND_DONE: seconds of those fill steps */
  double lr;
  bool fresh;           /* ROUND_DONE: overlap: computed from its predecessor's average (an
                           exchange-bound round waited for it; scheduler/overlap.h) */
  unsigned swap_step;   /* ROUND_DONE: overlap: the steps taken before the predecessor's
                           average was swapped in (overlap_early); `steps` when it was not
                           swapped in during the steps (at the round's end, or before it) */
  uint8_t hash[TD_AGREE_HASH_BYTES]; /* VERIFY: the state hash */
  float *blob;          /* CHECKPOINT, MODEL: td_run_numel() floats, malloc'd, owned by the receiver */
  char backend[16];     /* READY: the compute backend's name (cpu, cuda) */
  char message[256];    /* FAILED: why; READY: the backend and why it was chosen */
} td_run_event_t;

typedef struct td_run td_run_t;

typedef struct {
  const td_runspec_t *spec; /* copied */
  unsigned rank, nodes;
  /* Late join: > 1 when this node joins a running run at this round; the
   * compute thread loads the data, then waits for td_run_seed(). */
  uint64_t first_round;
  /* Held: after READY the compute thread waits for td_run_go() before
   * its first round (the node that starts a run tells the members only once
   * its own data and backend are ready, and lets its first round go once
   * they have heard). */
  bool held;
  /* This node's limit on the rounds of a run (0: none): a run whose rounds,
   * derived from epochs once the dataset's size is known, exceed it fails
   * before its plan is allocated. */
  uint64_t max_rounds;
  /* This node's limit on the ledger space a run's checkpoints hold at once
   * (0: none), checked here for a run sized by epochs that keeps every one,
   * whose rounds the node's policy could not count (daemon/session/policy.c). */
  uint64_t max_checkpoint_bytes;
  /* The caller acknowledges each checkpoint once it is written (or let go)
   * with td_run_checkpoint_written(); the compute thread copies the model
   * for the next one only then, so one checkpoint copy at most is on its way
   * to the ledger, whatever checkpoint_every asks. false: never waits. */
  bool checkpoint_acks;
  /* Post TD_RUN_MODEL (the model the run ends with) before FINISHED and STOPPED. */
  bool keep_model;
  uv_loop_t *loop;
  /* Called on the loop thread whenever events are queued; drain them with
   * td_run_next_event(). */
  void (*on_events)(td_run_t *run, void *user);
  void *user;
  /* Tests only: opens the compute backend in place of the spec's `backend`
   * name (NULL: td_backend_open_auto on that name), e.g. the CPU posing as a
   * device, so the device-resident path runs on a machine without a GPU. */
  int (*open_backend)(td_backend_t **out, int threads, char *why, size_t why_len);
} td_run_opts_t;

/* Validate the spec against what this version supports, size the model, and
 * start the compute thread. Caller owns *out; close with td_run_close() after a
 * FINISHED, FAILED or STOPPED event (or after td_run_stop()). */
int td_run_start(td_run_t **out, const td_run_opts_t *opts, char *why, size_t why_len);
/* Stop, join the compute thread and free everything. NULL-safe. */
void td_run_close(td_run_t **self_p);
/* Stop and join the compute thread, keeping the buffers (td_run_delta(),
 * td_run_layout()) for jobs that still read them until td_run_close(). Events
 * already queued can still be read; a compute thread that finds the mailbox
 * full from then on gives up instead of waiting. Two compute threads never
 * overlap: BLAS state is process-wide. Loop thread. */
void td_run_join(td_run_t *run);

/* Pop the next queued event; false when none. Loop thread only. */
bool td_run_next_event(td_run_t *run, td_run_event_t *ev);
/* Flat buffers of td_run_numel() floats (see the ownership note above). */
size_t td_run_numel(const td_run_t *run);
/* The model's tensor layout (borrowed for the run's lifetime). */
const td_layout_t *td_run_layout(const td_run_t *run);
const float *td_run_delta(const td_run_t *run, uint64_t round);
/* The range of td_run_delta(round) that round exchanges: with fragments = P
 * the round's slice (scheduler/fragment.h; the delta is zero outside it),
 * otherwise the whole vector. Any thread: it depends on the spec alone. */
void td_run_slice(const td_run_t *run, uint64_t round, size_t *offset, size_t *count);
/* The last checkpoint posted is written (or the caller let it go): the
 * compute thread may copy the next (td_run_opts_t.checkpoint_acks). */
void td_run_checkpoint_written(td_run_t *run);
/* Where the loop writes round's average (sync and overlap). */
float *td_run_avg(td_run_t *run, uint64_t round);
/* sync/overlap: round's average is final. async: every live peer has sent
 * rounds up to `round` (UINT64_MAX when no peer is left). */
void td_run_release(td_run_t *run, uint64_t round);
/* Client sampling (participation; scheduler/sample.h): the mask of the
 * member ranks that train `round` (bit i: rank i), drawn from (seed, round)
 * over the nodes counted at that round (td_run_set_nodes), so every member
 * holds the same one; every member with participation 1. Any thread. */
uint64_t td_run_sample(td_run_t *run, uint64_t round);
bool td_run_in_sample(td_run_t *run, uint64_t round, unsigned rank);
/* Virtual clients (run key clients = K > 1; compute/clients.h): round's
 * sample among the run's clients (client n x K + j is node n's j-th), drawn
 * from (seed, round) among those that hold rows, so every member derives
 * the same one; a node is in td_run_sample()'s mask when one of its clients
 * is. Fills set (TD_SAMPLE_SET_WORDS words, bit c: client c) and returns how
 * many were sampled; 0 (set empty) with K = 1 or before READY. Any thread. */
unsigned td_run_sample_clients(td_run_t *run, uint64_t round, uint64_t *set);
/* The clients of node `rank` in round's sample (K = 1: 1 when the node is
 * in the sample, else 0). Any thread. */
unsigned td_run_sampled_of(td_run_t *run, uint64_t round, unsigned rank);
/* Virtual clients per node (the run key clients; 1: the node is one client). */
unsigned td_run_clients(const td_run_t *run);
/* async: add weight * delta (a peer's update) into the inbox (any thread). */
void td_run_async_add(td_run_t *run, const float *delta, double weight);
/* Knowledge transfer: merge params = (1 - lambda) params + lambda x (x is
 * copied) before the next round's steps. Any thread. */
void td_run_merge(td_run_t *run, const float *x, double lambda);
/* Rows per step from round `from_round` on (weighted batching); ignored when
 * outside [1, global batch]. */
void td_run_set_batch(td_run_t *run, uint64_t from_round, unsigned batch);
/* Late join. The consensus state is the anchor and, with outer momentum or an
 * adaptive outer optimizer, that optimizer's state (scheduler/outer.h):
 * td_run_anchor_bytes() bytes. A member asks for it with
 * td_run_want_anchor(run, R - 1) (a TD_RUN_ANCHOR event once the anchor holds
 * round R - 1); the joiner starts from it with td_run_seed() (copied; TD_EINVAL
 * for a wrong size), and every node counts `nodes` sharers of the batch from
 * round R on with td_run_set_nodes(). Any thread. */
size_t td_run_anchor_bytes(const td_run_t *run);
int td_run_seed(td_run_t *run, const float *x, size_t bytes);
void td_run_want_anchor(td_run_t *run, uint64_t round);
void td_run_set_nodes(td_run_t *run, uint64_t from_round, unsigned nodes);
/* Anchor reconciliation (scheduler/recon.h): whether the nodes average their
 * anchors after `round` (every `reconcile` rounds and the last, sync and
 * overlap with a lossy codec). The compute thread posts TD_RUN_RECONCILE when
 * its anchor holds such a round and goes on; td_run_reconciled() hands it the
 * members' mean of anchor - init (copied), and it moves its anchor by mean -
 * own before its next round. After the last round it waits for it, so every
 * node ends on the same model. Any thread. */
bool td_run_reconciles(const td_run_t *run, uint64_t round);
void td_run_reconciled(td_run_t *run, uint64_t round, const float *mean);
/* Model-state agreement (daemon/run/run_verify.c). td_run_verifies: whether
 * the compute thread hashes its state after `round` (TD_RUN_VERIFY): every
 * verify_every rounds and the last, and a round asked for with
 * td_run_want_verify() before its outer step (a joiner's first round,
 * trainctl verify, a repair); never when the run is not verifiable
 * (td_runspec_verifiable). td_run_want_repair: after hashing `round` the
 * compute thread waits for td_run_repair() (the members' state of that
 * round, td_run_anchor_bytes(), copied; TD_EINVAL for a wrong size or round)
 * or td_run_repair_cancel(), then goes on from it. Any thread. */
bool td_run_verifies(td_run_t *run, uint64_t round);
void td_run_want_verify(td_run_t *run, uint64_t round);
void td_run_want_repair(td_run_t *run, uint64_t round);
int td_run_repair(td_run_t *run, uint64_t round, const float *state, size_t bytes);
void td_run_repair_cancel(td_run_t *run, uint64_t round);
/* Ask the compute thread to stop at the next step; it posts TD_RUN_STOPPED.
 * Events are never dropped: when the loop falls behind, the compute thread
 * waits for room in its mailbox (until td_run_join() or td_run_close()). */
void td_run_stop(td_run_t *run);
/* Let a held run (td_run_opts_t.held) go on to its first round; idempotent.
 * Any thread. */
void td_run_go(td_run_t *run);
/* Whether td_run_stop() was called (the thread may still be winding down). */
bool td_run_stopping(td_run_t *run);

uint64_t td_run_rounds(const td_run_t *run);     /* known after READY */
unsigned td_run_local_batch(const td_run_t *run); /* the initial (even) split */
/* Every node's label counts under the run's partition rule, counts[k *
 * classes + c] for node rank k < *nodes (compute/data/partition.h); with
 * clients = K > 1, for every client k (node k / K's client k % K) of *nodes
 * = nodes x K; NULL for a text run. Set before READY, then read-only: borrowed until the run closes. */
const uint64_t *td_run_label_counts(const td_run_t *run, unsigned *nodes, int *classes);
/* Local steps of round r (1-based): local_steps, or the QSR value; the same on
 * every node because it depends only on the shared schedule. Valid after READY. */
unsigned td_run_steps_of(const td_run_t *run, uint64_t round);

/* Rounds of a fixed-H run: ceil(epochs * ceil(train_rows / batch) / local_steps),
 * or the `rounds` key when it is set; the same on every node
 * (td_steps_round_count() of scheduler/steps.h on the spec's numbers). */
uint64_t td_run_round_count(const td_runspec_t *spec, size_t train_rows);
/* Local batch of node `rank` of `nodes`: the global batch split evenly, the
 * remainder going to the lowest ranks, so the local batches sum to `batch`
 * (td_steps_split_batch()). */
unsigned td_run_split_batch(unsigned batch, unsigned rank, unsigned nodes);

#endif
