/* run_overlap.c: the compute thread's overlap mode (mode = overlap,
 * scheduler/overlap.h has the math). A round's delta is posted and the next
 * round starts at once; the average of round r is swapped in for what params
 * still hold of r (td_overlap_swap) either at the end of round r + 1 or, with
 * overlap_early, at the first step boundary of r + 1 after it arrives; the
 * round's own progress is then pulled part of the way back toward the anchor.
 * A round whose exchange outlasts a round's compute is ended as a sync round
 * (exchange-bound), and overlap_fill fills the wait for an average with
 * steps. The last round waits for its own average, so every node ends on the
 * consensus.
 * Thread: the compute thread only; state in td__compute_t (run_compute.h). */
#include <string.h>

#include "compute/backend.h"
#include "compute/trainer.h"
#include "daemon/base/clock.h"
#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"
#include "scheduler/overlap.h"

/* ---- the wait for round r's average ------------------------------------------------------ */

/* overlap: wait for round r's average and measure its exchange (post to
 * average); without fill, choose whether the next round waits for its own.
 * The first exchanges also hold the members' start-up skew (the RunStart's
 * trip, loading the data), so a node that started first may wait in a round
 * or two after them; leaving them out measured no better (bench/RESULTS.md). */
static td__run_flow_t wait_exchange(td__compute_t *c, uint64_t r) {
  td__run_flow_t f = td__compute_wait_release(c, r);
  if (f == TD__RUN_GO_ON && c->run->spec.overlap_fill == 0)
    c->fresh = td_overlap_sync_next(c->fresh, td_clock_mono_s() - c->posted_at[r % 2],
                                    c->compute_s, c->run->spec.overlap_wait);
  return f;
}

/* Overlap fill: single steps until `round` is released or max_steps are done. */
static td__run_flow_t fill_until(td__compute_t *c, uint64_t round, unsigned max_steps) {
  td_run_t *run = c->run;
  unsigned ran = 0;
  while (c->fill.steps < max_steps) {
    if (td__run_stopping(run) || td__compute_released(run, round))
      break; /* a stop is seen by the wait that follows */
    double t0 = td_clock_mono_s(), cpu0 = td_backend_cpu_seconds(c->be);
    td_train_stats_t st;
    if (td_trainer_fill_steps(c->tr, 1, &st, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
    td__compute_slow_down(c, t0, cpu0);
    c->fill.samples += st.samples;
    c->fill.loss_sum += st.loss * (double)st.samples;
    c->fill.seconds += td_clock_mono_s() - t0;
    c->fill.steps++;
    ran++;
  }
  /* the swap that follows reads the host copy */
  return ran > 0 ? td__compute_pull(c) : TD__RUN_GO_ON;
}

/* ---- the early swap (overlap_early) ------------------------------------------------------ */

/* Whether round `round`'s steps watch for its predecessor's average, to swap
 * it in at the first step boundary after it arrives (overlap_early): an
 * overlapped round whose predecessor's average params do not hold yet. */
bool td__compute_swaps_early(const td__compute_t *c, uint64_t round) {
  const td_run_t *run = c->run;
  return c->lead != NULL && run->spec.overlap_early && round > run->first_round &&
         c->applied < round - 1;
}

/* overlap_early: round r's average, arrived during the next round's steps,
 * swapped in now rather than at that round's end
 * (td__compute_after_round_overlap): the same swap (scheduler/overlap.h),
 * which moves the round start with params, so the round's delta stays its
 * local progress; the exchange it ends is measured as wait_exchange measures
 * it. */
static td__run_flow_t swap_in(td__compute_t *c, uint64_t r) {
  td_run_t *run = c->run;
  td__run_flow_t f = td__compute_pull(c); /* the steps so far, on a device */
  if (f != TD__RUN_GO_ON)
    return f;
  if (run->spec.overlap_fill == 0)
    c->fresh = td_overlap_sync_next(c->fresh, td_clock_mono_s() - c->posted_at[r % 2],
                                    c->compute_s, run->spec.overlap_wait);
  td__compute_apply_round(run, r, c->params, c->lead);
  c->applied = r;
  c->early = r + 1;
  if ((f = td__compute_post_round_extras(c, r, false)) != TD__RUN_GO_ON)
    return f;
  return td__compute_push(c);
}

/* The round's n steps while its predecessor's average is awaited
 * (swaps_early): one at a time until the average is there, then the swap and
 * the rest in one call; `taken`: the round's steps before these. Each step is
 * slowed down to its own end (so that the average is seen at the step it
 * would reach on a device that slow), counted from the first: a late
 * wake-up from one wait is not added to the next, and the swap, which is not
 * a step, is not slowed down (it is not at the round's end either). The
 * steps are those of one call of n. */
td__run_flow_t td__compute_steps_swapping(td__compute_t *c, uint64_t round, unsigned long n,
                                     unsigned taken, td_train_stats_t *st) {
  double loss = 0, acc = 0;
  double t0 = td_clock_mono_s(), cpu0 = td_backend_cpu_seconds(c->be);
  *st = (td_train_stats_t){0};
  for (unsigned long i = 0; i < n;) {
    bool pending = c->applied < round - 1;
    if (pending && td__compute_released(c->run, round - 1)) {
      double s0 = td_clock_mono_s(), scpu0 = td_backend_cpu_seconds(c->be);
      td__run_flow_t f = swap_in(c, round - 1);
      if (f != TD__RUN_GO_ON)
        return f;
      c->swap_step = taken + (unsigned)i;
      t0 += td_clock_mono_s() - s0;
      cpu0 += td_backend_cpu_seconds(c->be) - scpu0;
      pending = false;
    }
    unsigned long k = pending ? 1 : n - i;
    td_train_stats_t some;
    if (td_trainer_steps(c->tr, k, &some, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
    td_backend_synchronize(c->be);
    td__compute_slow_down(c, t0, cpu0);
    loss += some.loss * (double)some.samples;
    acc += some.accuracy * (double)some.samples;
    st->steps += some.steps;
    st->samples += some.samples;
    st->seconds += some.seconds;
    st->lr = some.lr;
    i += k;
  }
  if (st->samples > 0) {
    st->loss = loss / (double)st->samples;
    st->accuracy = acc / (double)st->samples;
  }
  return TD__RUN_GO_ON;
}

/* ---- after the round ---------------------------------------------------------------------- */

/* overlap: go on at once; swap the previous round's stale delta for its
 * average (filling the wait with steps when asked), then pull this round's
 * progress part of the way back to the anchor (overlap_fix). An exchange-bound
 * round (scheduler/overlap.h) instead waits for its own average and starts
 * the next from the consensus, as sync does. The last round waits for its
 * own average and ends on the consensus model. */
td__run_flow_t td__compute_after_round_overlap(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  td__run_flow_t f = TD__RUN_GO_ON;
  memcpy(run->start, c->params, run->numel * sizeof(float));
  /* a late joiner's seed already holds first_round - 1; an exchange-bound
   * round applied its own average already */
  if (round > run->first_round && c->applied < round - 1) {
    if (run->spec.overlap_fill > 0 && round < run->rounds)
      f = fill_until(c, round - 1, run->spec.overlap_fill * td_run_steps_of(run, round + 1));
    if (f == TD__RUN_GO_ON)
      f = wait_exchange(c, round - 1);
    if (f != TD__RUN_GO_ON)
      return f;
    td__compute_apply_round(run, round - 1, c->params, c->lead);
    c->applied = round - 1;
    if ((f = td__compute_post_round_extras(c, round - 1, false)) != TD__RUN_GO_ON)
      return f;
  }
  if (c->fresh && round < run->rounds) { /* measured, then ended as a sync round */
    if ((f = wait_exchange(c, round)) != TD__RUN_GO_ON)
      return f;
    memset(c->lead, 0, run->numel * sizeof(float)); /* params become the new anchor */
    c->applied = round;
    return td__compute_after_round_sync(c, round);
  }
  double alpha = td_overlap_pull_fraction((td_overlap_fix_t)run->spec.overlap_fix_kind,
                                          run->spec.overlap_pull, td__run_nodes_at(run, round));
  td_overlap_pull(c->params, run->start, c->lead, run->delta[round % 2], alpha, run->numel);
  if (round == run->rounds) {
    if ((f = td__compute_wait_release(c, round)) != TD__RUN_GO_ON)
      return f;
    td__compute_apply_round(run, round, c->params, c->lead);
    if ((f = td__compute_verify(c, round)) != TD__RUN_GO_ON ||
        (f = td__compute_reconcile(c, round, true)) != TD__RUN_GO_ON)
      return f;
    memcpy(c->params, run->anchor, run->numel * sizeof(float));
  }
  return TD__RUN_GO_ON;
}
