/* run_apply.c: the compute thread's side of a round's exchange, shared by
 * its modes (run_compute.c, run_overlap.c). The host copy of a device model
 * (pull after steps, push after the host changed it) and the run's failure;
 * the waits: the emulated slowdown and the loop's release of a round (its
 * average is in); then the outer step on that average, which moves the
 * anchor and, per mode, params (sync: onto the anchor; overlap: the swap of
 * scheduler/overlap.h), and what the round owes after it: its state hash
 * (and a repair, run_verify.c), its reconciliation, a late joiner's anchor,
 * a checkpoint; and the nodes sharing a round. Sync mode's end of a round is
 * those in a row.
 * Thread: the compute thread only; state in td__compute_t (run_compute.h). */
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/model.h"
#include "compute/scaffold.h"
#include "compute/trainer.h"
#include "daemon/base/clock.h"
#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"
#include "scheduler/agree.h"
#include "scheduler/outer.h"
#include "scheduler/overlap.h"
#include "scheduler/plan.h"

/* ---- the thread's device copy -------------------------------------------------------- */

td__run_flow_t td__compute_fail(td__compute_t *c) { return td__run_fail(c->run, c->why); }

/* The host copy of the parameters from the device, after steps (no-op on the CPU). */
td__run_flow_t td__compute_pull(td__compute_t *c) {
  if (td_model_pull(td_trainer_model(c->tr), c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  return TD__RUN_GO_ON;
}

/* The host copy to the device, after the host changed it (no-op on the CPU). */
td__run_flow_t td__compute_push(td__compute_t *c) {
  if (td_model_push(td_trainer_model(c->tr), c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  return TD__RUN_GO_ON;
}

/* ---- waiting ------------------------------------------------------------------------- */

/* Stay idle for `seconds` (slowdown's part of a step), without burning a
 * core another node needs. A stop ends the wait, and so does the release of
 * `round` (> 0) by the loop: the round closed without this node's update
 * (min_updates, round_deadline), so the rest of the wait is for nothing. */
static void sleep_for(td_run_t *run, double seconds, uint64_t round) {
  if (!(seconds > 0))
    return;
  struct timespec until = td_clock_timespec(td_clock_mono_s() + seconds);
  pthread_mutex_lock(&run->mu);
  while (!run->stop && !(round > 0 && run->released_round >= round) &&
         pthread_cond_timedwait(&run->cv, &run->mu, &until) == 0)
    ;
  pthread_mutex_unlock(&run->mu);
}

/* slowdown = F emulates a device F times slower than this machine's core:
 * the work since (t0, cpu0) ends F times its cost after t0, its cost being
 * CPU seconds where the backend can tell (td_backend_cpu_seconds), else wall
 * seconds (td_plan_slowdown_wait). Emulated nodes sharing this machine's
 * cores also wait for each other's CPU, which no separate device would see:
 * that wait falls inside the F times (counted in wall time, it would be
 * multiplied by F; added to them, it would still stretch every contended
 * step). */
void td__compute_slow_down(const td__compute_t *c, double t0, double cpu0) {
  td__compute_slow_down_round(c, t0, cpu0, 0);
}

void td__compute_slow_down_round(const td__compute_t *c, double t0, double cpu0,
                                 uint64_t round) {
  double wall = td_clock_mono_s() - t0, cpu = td_backend_cpu_seconds(c->be) - cpu0;
  sleep_for(c->run, td_plan_slowdown_wait(c->run->slowdown, wall, cpu), round);
}

/* Nodes sharing the global batch in `round` (late joins raise it). */
unsigned td__run_nodes_at(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  unsigned k = run->nodes_from && round >= run->nodes_from ? run->nodes_next : run->nodes;
  pthread_mutex_unlock(&run->mu);
  return k;
}

/* Whether the loop has released `round` (no wait). */
bool td__compute_released(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  bool done = run->released_round >= round;
  pthread_mutex_unlock(&run->mu);
  return done;
}

/* Wait until the loop released `round` or a stop was requested; adds the time
 * blocked to c->idle. */
td__run_flow_t td__compute_wait_release(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  double t0 = td_clock_mono_s();
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->released_round < round)
    pthread_cond_wait(&run->cv, &run->mu);
  bool stopped = run->stop;
  pthread_mutex_unlock(&run->mu);
  c->idle += td_clock_mono_s() - t0;
  return stopped ? TD__RUN_STOPPED : TD__RUN_GO_ON;
}

/* ---- a round's average, and what the round owes after it ---------------------------- */

/* SCAFFOLD's c after round r, from its average alone (docs/algorithms.md#scaffold):
 * every sampled node's ci moved by -c + (x - y_i) / Σlr with the same Σlr, so
 * their mean moved by -c - avg / Σlr, and c by that times sampled / all. */
static void scaffold_round(td_run_t *run, uint64_t r, const float *avg) {
  double frac, lr_sum = run->scaffold_lr_sum[r % 2];
  if (run->spec.clients > 1) { /* virtual clients: sampled among those with rows */
    uint64_t set[TD_SAMPLE_SET_WORDS];
    frac = run->n_cand > 0 ? (double)td_run_sample_clients(run, r, set) / run->n_cand : 0;
  } else {
    unsigned nodes = td__run_nodes_at(run, r), drawn = nodes < 64 ? nodes : 64;
    frac = (double)__builtin_popcountll(td__run_sample_of(&run->spec, r, nodes)) / drawn;
  }
  if (frac > 0 && lr_sum > 0)
    td_scaffold_server_update(run->scaffold_c, avg, lr_sum, frac > 1 ? 1 : frac, run->numel);
}

/* Outer step on round r's average: anchor += step and, in overlap mode
 * (lead != NULL), params += step - lead (swap what params still hold of round
 * r for the global step, keeping the progress made since; scheduler/overlap.h).
 * With overlap_fix = dc the average is first compensated for the anchor's
 * step since round r began: the previous round's step, on every node, also
 * after a round that waited for its own average (that choice is each node's
 * own, the anchors must not depend on it). With topology gossip or groups
 * (run->mixes) the average is the partners' mixed model: the step is its
 * distance from the anchor, and the plain outer step takes it as it is. */
void td__compute_apply_round(td_run_t *run, uint64_t r, float *params, const float *lead) {
  td_outer_opts_t o;
  td_runspec_outer_opts(&run->spec, &o);
  float *avg = run->avg[r % 2];
  if (run->mixes && o.kind == TD_OUTER_SGD && o.lr == 1 && o.momentum == 0 && o.clip == 0) {
    /* the plain outer step: the mixed model itself, bit for bit (anchor + (m - anchor)
     * would round differently on each partner) */
    memcpy(run->anchor, avg, run->numel * sizeof(float));
    memcpy(params, run->anchor, run->numel * sizeof(float));
    return;
  }
  if (run->mixes) /* the partners' mixed model: its distance from the anchor is the step */
    for (size_t i = 0; i < run->numel; i++)
      avg[i] -= run->anchor[i];
  if (run->scaffold_c != NULL && lead == NULL) /* before the outer step: the plain mean */
    scaffold_round(run, r, avg);
  if (run->dc_drift != NULL)
    td_overlap_compensate(avg, run->dc_drift, run->spec.overlap_dc_lambda, run->numel);
  td_outer_step(&o, avg, run->outer_floats > 0 ? run->mom : NULL, avg,
                run->numel); /* avg becomes the step */
  if (run->dc_drift != NULL)
    memcpy(run->dc_drift, avg, run->numel * sizeof(float));
  for (size_t i = 0; i < run->numel; i++)
    run->anchor[i] += avg[i];
  if (lead != NULL)
    td_overlap_swap(params, run->start, avg, lead, run->numel);
  else
    memcpy(params, run->anchor, run->numel * sizeof(float));
}

/* A copy of the model for the ledger, every checkpoint_every rounds. */
td__run_flow_t td__compute_post_checkpoint(td_run_t *run, uint64_t round) {
  if (run->spec.checkpoint_every == 0 || round % run->spec.checkpoint_every != 0)
    return TD__RUN_GO_ON;
  if (run->checkpoint_acks) { /* one copy on its way to the ledger at a time */
    pthread_mutex_lock(&run->mu);
    while (run->checkpoint_out && !run->stop && !run->closing)
      pthread_cond_wait(&run->cv, &run->mu);
    bool go = !run->stop && !run->closing;
    run->checkpoint_out = go;
    pthread_mutex_unlock(&run->mu);
    if (!go)
      return TD__RUN_STOPPED;
  }
  td_run_event_t ev = {.kind = TD_RUN_CHECKPOINT, .round = round};
  const float *model = run->spec.mode_kind == TD_MODE_ASYNC ? run->start : run->anchor;
  return td__run_post_copy(run, &ev, "the checkpoint", model, run->numel, NULL, 0);
}

/* Late join, serving side: a copy of the anchor (and the outer state) once
 * it holds `round`, for a node that joins from round + 1. */
static td__run_flow_t post_anchor(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  bool want = run->want_anchor == round;
  pthread_mutex_unlock(&run->mu);
  if (!want)
    return TD__RUN_GO_ON;
  td_run_event_t ev = {.kind = TD_RUN_ANCHOR, .round = round};
  return td__run_post_copy(run, &ev, "the late-join anchor", run->anchor, run->numel, run->mom,
                           run->mom_floats);
}

/* Adopt the members' state of a repair: the anchor and the momentum become
 * theirs exactly; params and the round start move with the anchor (sync:
 * they are the anchor). */
static td__run_flow_t adopt_state(td__compute_t *c, float *state) {
  td_run_t *run = c->run;
  bool sync = run->spec.mode_kind == TD_MODE_SYNC || c->lead == NULL;
  for (size_t i = 0; i < run->numel; i++) {
    if (sync) {
      c->params[i] = run->start[i] = state[i];
    } else {
      float moved = state[i] - run->anchor[i];
      c->params[i] += moved;
      run->start[i] += moved;
    }
    run->anchor[i] = state[i];
  }
  if (run->mom != NULL)
    memcpy(run->mom, state + run->numel, run->mom_floats * sizeof(float));
  free(state);
  return td__compute_push(c);
}

td__run_flow_t td__compute_verify(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  if (!td_run_verifies(run, round))
    return TD__RUN_GO_ON;
  td_run_event_t ev = {.kind = TD_RUN_VERIFY, .round = round};
  if (td_agree_hash(td_model_layout(run->probe), run->anchor, run->mom, ev.hash) != 0)
    return TD__RUN_GO_ON; /* libsodium would not start: nothing to compare, training goes on */
  td__run_flow_t f = td__run_post_copy(run, &ev, "the verified state", run->anchor, run->numel,
                                       run->mom, run->mom_floats);
  if (f != TD__RUN_GO_ON || !td__run_repairs(run, round))
    return f;
  bool stopped = false;
  float *state = td__run_wait_repair(run, round, &stopped);
  if (stopped)
    return TD__RUN_STOPPED;
  return state != NULL ? adopt_state(c, state) : TD__RUN_GO_ON;
}

/* Round r's reconciliation when it has one; `settle`: also wait until it
 * is applied (after the last round, so every node ends on the same model). */
td__run_flow_t td__compute_reconcile(td__compute_t *c, uint64_t r, bool settle) {
  if (!td_run_reconciles(c->run, r))
    return TD__RUN_GO_ON;
  td__run_flow_t f = td__run_post_reconcile(c->run, r, c->params, &c->idle);
  if (f == TD__RUN_GO_ON && settle)
    f = td__run_wait_reconciled(c->run, r, c->params);
  return f;
}

/* After round r's outer step: the state hash (and a repair), the
 * reconciliation, late-join anchor and checkpoint that round r owes, in that
 * order. */
td__run_flow_t td__compute_post_round_extras(td__compute_t *c, uint64_t r, bool settle) {
  td__run_flow_t f = td__compute_verify(c, r);
  if (f == TD__RUN_GO_ON)
    f = td__compute_reconcile(c, r, settle);
  if (f == TD__RUN_GO_ON)
    f = post_anchor(c->run, r);
  if (f == TD__RUN_GO_ON)
    f = td__compute_post_checkpoint(c->run, r);
  return f;
}

/* sync: wait for the round's average, step the anchor and start from it. */
td__run_flow_t td__compute_after_round_sync(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  td__run_flow_t f = td__compute_wait_release(c, round);
  if (f != TD__RUN_GO_ON)
    return f;
  td__compute_apply_round(run, round, c->params, NULL);
  f = td__compute_post_round_extras(c, round, round == run->rounds);
  memcpy(run->start, c->params, run->numel * sizeof(float));
  return f;
}
