/* run_recon.c: a run's reconciliation slots (scheduler/recon.h says when and
 * how the nodes average their anchors; this file is the compute side).
 *
 * After a reconciliation round the compute thread keeps its anchor - init in
 * one of TD_RUN_REC_SLOTS slots and posts a copy (TD_RUN_RECONCILE); the loop
 * thread exchanges it and hands back the members' mean with
 * td_run_reconciled(). Before its next round the compute thread moves its
 * anchor, model and round start by mean - own. Two slots let the exchange of
 * round r overlap the computing of the next reconciliation round; the compute
 * thread waits only when both are still out, and after the last round.
 * Threads: td_run_reconciled() and td_run_reconciles() on any thread; the rest
 * on the compute thread. Slots are guarded by run->mu. */
#include <stdlib.h>
#include <string.h>

#include "daemon/base/clock.h"
#include "daemon/run/run_internal.h"

bool td_run_reconciles(const td_run_t *run, uint64_t round) {
  if (!td_runspec_reconciles(&run->spec) || round == 0 || round > run->rounds)
    return false;
  return round == run->rounds ||
         (run->spec.reconcile_every > 0 && round % run->spec.reconcile_every == 0);
}

void td_run_reconciled(td_run_t *run, uint64_t round, const float *mean) {
  pthread_mutex_lock(&run->mu);
  for (size_t k = 0; k < TD_RUN_REC_SLOTS; k++)
    if (run->rec[k].round == round && round != 0 && !run->rec[k].have) {
      memcpy(run->rec[k].mean, mean, run->numel * sizeof(float));
      run->rec[k].have = true;
    }
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

/* The slot of the oldest reconciliation still out; TD_RUN_REC_SLOTS when none. */
static size_t oldest_slot(const td_run_t *run) {
  size_t k = TD_RUN_REC_SLOTS;
  for (size_t j = 0; j < TD_RUN_REC_SLOTS; j++)
    if (run->rec[j].round != 0 && (k == TD_RUN_REC_SLOTS || run->rec[j].round < run->rec[k].round))
      k = j;
  return k;
}

/* Move the anchor, the model and the round start by mean - own for the
 * reconciliations the loop finished, oldest first and only in round order
 * (a later one waits for an earlier one still out); each also moves the own
 * snapshots still out, which were taken before it, so their corrections do
 * not undo it. After the last round there is nothing to keep: the model
 * becomes exactly init + mean. */
unsigned td__run_apply_reconciled_locked(td_run_t *run, float *params) {
  unsigned applied = 0;
  for (;;) {
    size_t k = oldest_slot(run);
    if (k == TD_RUN_REC_SLOTS || !run->rec[k].have)
      return applied;
    const float *mean = run->rec[k].mean, *own = run->rec[k].own;
    if (run->rec[k].round == run->rounds) {
      for (size_t i = 0; i < run->numel; i++)
        params[i] = run->start[i] = run->anchor[i] = run->init[i] + mean[i];
    } else {
      for (size_t j = 0; j < TD_RUN_REC_SLOTS; j++) {
        float *pending = j != k && run->rec[j].round != 0 ? run->rec[j].own : NULL;
        for (size_t i = 0; pending != NULL && i < run->numel; i++)
          pending[i] += mean[i] - own[i];
      }
      for (size_t i = 0; i < run->numel; i++) {
        float corr = mean[i] - own[i];
        run->anchor[i] += corr;
        params[i] += corr;
        run->start[i] += corr;
      }
    }
    run->rec[k].round = 0;
    run->rec[k].have = false;
    applied++;
  }
}

unsigned td__run_apply_reconciled(td_run_t *run, float *params) {
  pthread_mutex_lock(&run->mu);
  unsigned n = td__run_apply_reconciled_locked(run, params);
  pthread_mutex_unlock(&run->mu);
  return n;
}

td__run_flow_t td__run_post_reconcile(td_run_t *run, uint64_t round, float *params,
                                      double *idle) {
  double t0 = td_clock_mono_s();
  pthread_mutex_lock(&run->mu);
  size_t k;
  for (;;) {
    td__run_apply_reconciled_locked(run, params);
    for (k = 0; k < TD_RUN_REC_SLOTS && run->rec[k].round != 0; k++)
      ;
    if (k < TD_RUN_REC_SLOTS || run->stop)
      break;
    pthread_cond_wait(&run->cv, &run->mu);
  }
  bool stopped = run->stop;
  if (!stopped) {
    for (size_t i = 0; i < run->numel; i++)
      run->rec[k].own[i] = run->anchor[i] - run->init[i];
    run->rec[k].round = round;
    run->rec[k].have = false;
  }
  pthread_mutex_unlock(&run->mu);
  *idle += td_clock_mono_s() - t0;
  if (stopped)
    return TD__RUN_STOPPED;
  /* the slot's own snapshot is ours to read: the loop never writes it */
  td_run_event_t ev = {.kind = TD_RUN_RECONCILE, .round = round};
  return td__run_post_copy(run, &ev, "the reconciliation", run->rec[k].own, run->numel, NULL, 0);
}

td__run_flow_t td__run_wait_reconciled(td_run_t *run, uint64_t round, float *params) {
  pthread_mutex_lock(&run->mu);
  for (;;) {
    td__run_apply_reconciled_locked(run, params);
    bool pending = false;
    for (size_t k = 0; k < TD_RUN_REC_SLOTS; k++)
      pending |= run->rec[k].round != 0 && run->rec[k].round <= round;
    if (!pending || run->stop)
      break;
    pthread_cond_wait(&run->cv, &run->mu);
  }
  bool stopped = run->stop;
  pthread_mutex_unlock(&run->mu);
  return stopped ? TD__RUN_STOPPED : TD__RUN_GO_ON;
}
