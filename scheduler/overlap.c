/* overlap.c: overlap mode's delayed swap, anchor pull-back and delay
 * compensation (overlap.h), one pass over the vectors each, the pull-back
 * fraction of each overlap_fix, and the choice of waiting for an
 * exchange-bound round's own average. */
#include "scheduler/overlap.h"

#include <math.h>

void td_overlap_swap(float *params, float *start, const float *step, const float *lead,
                     size_t n) {
  for (size_t i = 0; i < n; i++) {
    float s = step[i] - lead[i];
    params[i] += s;
    start[i] += s;
  }
}

void td_overlap_pull(float *params, float *start, float *lead, const float *own, double alpha,
                     size_t n) {
  const float a = (float)alpha;
  for (size_t i = 0; i < n; i++) {
    float back = a * own[i];
    params[i] -= back;
    start[i] -= back;
    lead[i] = own[i] - back;
  }
}

void td_overlap_compensate(float *avg, const float *drift, double lambda, size_t n) {
  const float l = (float)lambda;
  for (size_t i = 0; i < n; i++) {
    float k = avg[i] * avg[i] * l; /* the Hessian's diagonal, in units of one round's map */
    avg[i] -= (k < 1 ? k : 1) * drift[i];
  }
}

double td_overlap_pull_fraction(td_overlap_fix_t fix, double overlap_pull, unsigned nodes) {
  switch (fix) {
  case TD_OVERLAP_FIX_NONE:
    return 0;
  case TD_OVERLAP_FIX_EAGER:
    return nodes > 1 ? 1.0 - 1.0 / nodes : 0;
  case TD_OVERLAP_FIX_PULL:
  case TD_OVERLAP_FIX_DC:
  default:
    return overlap_pull;
  }
}

bool td_overlap_sync_next(bool now, double exchange_s, double compute_s, double ratio) {
  if (!(ratio > 0))
    return false;
  if (!(exchange_s > 0) || isinf(exchange_s) || isnan(compute_s))
    return now;
  if (!(compute_s > 0))
    return true; /* nothing to hide the exchange behind */
  double r = exchange_s / compute_s;
  return now ? r >= TD_OVERLAP_WAIT_LEAVE * ratio : r >= ratio;
}
