/* run_fragment.c: the compute thread's rounds with fragments = P > 1
 * (Streaming DiLoCo, scheduler/fragment.h has the arithmetic). Round r's
 * update is params - anchor on fragment r mod P and zero elsewhere; only
 * the slice travels (td_run_slice: the session encodes and decodes that
 * range alone), and a received update is zero outside it too, so the
 * aggregation and every node's average need nothing new; the
 * outer step then moves only that slice of the anchor and of the outer
 * momentum, in the same order on every node, so the anchors (and the state
 * hashes of run_verify.c) agree exactly as they do without fragments. In sync
 * mode the slice of params becomes the anchor's when the round closes; in
 * overlap mode the next round starts at once, and the slice's average, in a
 * round later, is mixed in with fragment_alpha. The last round waits for its
 * own average and every node ends on the anchor, the consensus.
 * Thread: the compute thread only; state in td__compute_t (run_compute.h). */
#include <string.h>

#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"
#include "scheduler/fragment.h"
#include "scheduler/outer.h"

void td__compute_fragment_delta(td_run_t *run, uint64_t round, const float *params) {
  size_t off, count;
  td_fragment_span(run->numel, run->spec.fragments, round, &off, &count);
  td_fragment_delta(run->delta[round % 2], params, run->anchor, run->numel, off, count);
}

void td__compute_apply_fragment(td_run_t *run, uint64_t r, float *params, double alpha) {
  size_t off, count;
  td_fragment_span(run->numel, run->spec.fragments, r, &off, &count);
  td_outer_opts_t o;
  td_runspec_outer_opts(&run->spec, &o); /* sgd (runspec.c): its one buffer splits by slice */
  float *step = run->avg[r % 2] + off;
  td_outer_step(&o, step, run->outer_floats > 0 ? run->mom + off : NULL, step, count);
  for (size_t i = off; i < off + count; i++)
    run->anchor[i] += step[i - off];
  td_fragment_mix(params + off, run->anchor + off, alpha, count);
}

/* After the fragment of `round` is applied on the last round: every node
 * ends on the anchor, the consensus. */
static void end_on_anchor(td_run_t *run, float *params) {
  memcpy(params, run->anchor, run->numel * sizeof(float));
  memcpy(run->start, params, run->numel * sizeof(float));
}

td__run_flow_t td__compute_after_round_fragments(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  bool last = round == run->rounds;
  td__run_flow_t f = TD__RUN_GO_ON;
  if (run->spec.mode_kind == TD_MODE_SYNC) {
    if ((f = td__compute_wait_release(c, round)) != TD__RUN_GO_ON)
      return f;
    td__compute_apply_fragment(run, round, c->params, 0);
    f = td__compute_post_round_extras(c, round, last);
    if (last)
      end_on_anchor(run, c->params);
    memcpy(run->start, c->params, run->numel * sizeof(float));
    return f;
  }
  /* overlap: the previous round's slice, which the round just computed hid
   * (a late joiner's seed already holds first_round - 1) */
  if (round > run->first_round && c->applied < round - 1) {
    if ((f = td__compute_wait_release(c, round - 1)) != TD__RUN_GO_ON)
      return f;
    td__compute_apply_fragment(run, round - 1, c->params, run->spec.fragment_alpha);
    c->applied = round - 1;
    if ((f = td__compute_post_round_extras(c, round - 1, false)) != TD__RUN_GO_ON)
      return f;
  }
  memcpy(run->start, c->params, run->numel * sizeof(float));
  if (!last)
    return TD__RUN_GO_ON;
  /* the last round waits for its own average, as overlap mode's does */
  if ((f = td__compute_wait_release(c, round)) != TD__RUN_GO_ON)
    return f;
  td__compute_apply_fragment(run, round, c->params, 0);
  if ((f = td__compute_verify(c, round)) != TD__RUN_GO_ON ||
      (f = td__compute_reconcile(c, round, true)) != TD__RUN_GO_ON)
    return f;
  end_on_anchor(run, c->params);
  return TD__RUN_GO_ON;
}
