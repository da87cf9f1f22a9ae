/* capacity.c: the batch plan, and the agreed capacities it is made of.
 *
 * Threads: loop thread (rounds.c calls td__rounds_replan when a round
 * closes). Weighted batching splits the global batch over the members in
 * proportion to their capacities (docs/algorithms.md#weighted-dynamic-batching).
 * In sync and overlap mode those are the agreed capacities
 * (docs/algorithms.md#agreed-capacities): each member echoes with its update
 * what it heard every other member report, and the lower median of the
 * echoes is the figure, so every node computes the same plan whatever a
 * member told each. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "scheduler/plan.h"

/* Weighted batching: no node below this fraction of the even share. */
#define MIN_SHARE_DIVISOR 4
/* ...and never below this many rows. */
#define MIN_BATCH_ROWS 2
/* A new plan is applied only when some share moves by more than this. */
#define REPLAN_FRACTION 0.1

/* Capacity member i reported with `round`, else its newest report (async). */
static double reported_capacity(const td__session_t *s, size_t i, uint64_t round) {
  const td__peer_report_t *r = s->peer_report[i];
  double c = r[round % TD__RING].round == round ? r[round % TD__RING].capacity : 0;
  for (unsigned j = 0; c <= 0 && j < TD__RING; j++)
    if (r[j].capacity > c)
      c = r[j].capacity;
  return c;
}

void td__rounds_heard(const td__session_t *s, uint64_t round, double *heard) {
  uint64_t q = round - 1;
  unsigned k = (unsigned)(q % TD__RING);
  for (size_t i = 0; i < s->n_members && i < TD_MEMBERS_MAX; i++) {
    if (round < 2)
      heard[i] = 0;
    else if (s->members[i] == s->node->node_id)
      heard[i] = s->own[k].round == q ? s->own[k].capacity : 0;
    else
      heard[i] = s->peer_report[i][k].round == q ? s->peer_report[i][k].capacity : 0;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Agreed capacities (docs/algorithms.md#agreed-capacities): the capacity of
 * member i for round `round` - 1 is the lower median of what every *other*
 * member echoed with its update of `round` (our own echo is what we sent),
 * unknown (0) echoes left out. Honest members echo the same bits to every
 * node, and i's own word is not among them, so a member that told nodes
 * different things gets one figure on all of them; with one liar among four
 * or more members an honest member's figure is its own. A disagreement among
 * the echoes is counted, and logged and recorded the first time. Returns 0
 * when no member echoed a figure for i. */
static double agreed_capacity(td__session_t *s, size_t i, uint64_t round) {
  double v[TD_MEMBERS_MAX];
  size_t n = 0;
  unsigned k = (unsigned)(round % TD__RING);
  for (size_t j = 0; j < s->n_members; j++) {
    if (j == i)
      continue;
    double c = 0;
    if (s->members[j] == s->node->node_id)
      c = s->own[k].round == round ? s->own[k].heard[i] : 0;
    else if (s->peer_report[j][k].round == round && !s->out[j])
      c = s->peer_report[j][k].heard[i];
    if (c > 0)
      v[n++] = c;
  }
  if (n == 0)
    return 0;
  qsort(v, n, sizeof *v, cmp_double);
  double agreed = v[(n - 1) / 2];
  if (v[0] != v[n - 1]) {
    td__outlier_t *o = &s->outlier[i];
    if (o->mismatched++ == 0) {
      td_log_warn("member %016" PRIx64 ": the members heard different capacities from it for "
                  "round %" PRIu64 " (%.3g to %.3g samples/s): it, or a member that echoed "
                  "them, tells members different things; batch plans use the median, %.3g",
                  s->members[i], round - 1, v[0], v[n - 1], agreed);
      td__ledger_event(s->node->ledger, "capacity_mismatch",
                       "%016" PRIx64 " round %" PRIu64 ": members heard %.3g to %.3g "
                       "samples/s; the plan uses %.3g", s->members[i], round - 1, v[0],
                       v[n - 1], agreed);
    }
  }
  return agreed;
}

/* Split the global batch over the live members in proportion to their
 * capacities: sync and overlap, the agreed capacities of `round` - 1 (the
 * same figures on every node whatever a member told each); async, the ones
 * they reported with `round` (async plans set only the own batch: no node
 * bounds another's samples by them). So every node computes the same plan;
 * only our own share is applied, from round `from` on. */
void td__rounds_replan(td__session_t *s, uint64_t round, uint64_t from) {
  if (!s->spec.weighted_batching || s->n_members < 2)
    return;
  if (s->plan_join_from != 0 && from >= s->plan_join_from)
    return; /* a join's even split holds from then until the joiner has measured */
  double caps[TD_MEMBERS_MAX];
  size_t idx[TD_MEMBERS_MAX], k = 0, me = 0;
  bool agreed = s->spec.mode_kind != TD_MODE_ASYNC;
  for (size_t i = 0; i < s->n_members; i++) {
    uint64_t id = s->members[i];
    double c;
    if (s->since[i] > from)
      continue; /* a joiner admitted from a later round: not in this plan, whether or not
                   this member took the admission in yet (every member plans alike) */
    if (agreed && (id == s->node->node_id || td__session_takes_part(s, i, 0))) {
      c = agreed_capacity(s, i, round);
      if (id == s->node->node_id)
        me = k;
    } else if (id == s->node->node_id) {
      c = s->own[round % TD__RING].capacity;
      me = k;
    } else if (td__session_takes_part(s, i, 0)) { /* not one that refused or is away; a
                                                     joiner counts (every node's plan agrees) */
      c = reported_capacity(s, i, round);
    } else {
      continue;
    }
    if (!(c > 0))
      return; /* someone has not measured yet: keep the current plan */
    caps[k] = c;
    idx[k++] = i;
  }
  unsigned split[TD_MEMBERS_MAX], old[TD_MEMBERS_MAX];
  unsigned b_min = s->spec.batch / (MIN_SHARE_DIVISOR * (unsigned)k);
  if (td_plan_split_batch(caps, k, s->spec.batch, b_min > MIN_BATCH_ROWS ? b_min : MIN_BATCH_ROWS,
                          NULL, split) != 0 &&
      td_plan_split_batch(caps, k, s->spec.batch, 1, NULL, split) != 0)
    return;
  bool have_old = true;
  for (size_t j = 0; j < k; j++)
    if ((old[j] = s->plan[idx[j]]) == 0)
      have_old = false;
  if (have_old && !td_plan_should_replan(old, split, k, REPLAN_FRACTION))
    return;
  memset(s->plan, 0, sizeof s->plan);
  for (size_t j = 0; j < k; j++)
    s->plan[idx[j]] = split[j];
  s->plans_applied++;
  td_run_set_batch(s->run, from, split[me]);
  td_log_debug("round %" PRIu64 ": batch plan from round %" PRIu64 ": own %u of %u "
               "(%.0f samples/s)", round, from, split[me], s->spec.batch, caps[me]);
}
