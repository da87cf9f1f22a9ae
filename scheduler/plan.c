/* plan.c: batching, staleness and QSR arithmetic (see plan.h). */
#include "scheduler/plan.h"

#include <math.h>
#include <stdlib.h>

#include "common/error.h"

/* The QSR's H is capped here: (alpha / lr)^2 explodes as the rate nears 0,
 * and this keeps it exact in a double and within an unsigned long. */
#define QSR_MAX_STEPS 1e15
/* Keeps a zero capacity from dividing by zero when taking units back. */
#define CAPACITY_FLOOR 1e-12

int td_plan_split_batch(const double *capacity, size_t n, unsigned global, unsigned b_min,
                        const unsigned *b_max, unsigned *out) {
  if (n == 0)
    return TD_EINVAL;
  double total = 0;
  unsigned long long max_sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(capacity[i]) || capacity[i] < 0)
      return TD_EINVAL;
    total += capacity[i];
    unsigned hi = b_max ? b_max[i] : global;
    if (hi < b_min)
      return TD_ERANGE;
    max_sum += hi;
  }
  if ((unsigned long long)b_min * n > global || max_sum < global)
    return TD_ERANGE;
  /* proportional shares, floors, largest remainders (ties to lower index) */
  double *frac = malloc(n * sizeof *frac);
  if (frac == NULL)
    return TD_ENOMEM;
  unsigned assigned = 0;
  for (size_t i = 0; i < n; i++) {
    double share = total > 0 ? (double)global * capacity[i] / total : (double)global / (double)n;
    out[i] = (unsigned)floor(share);
    frac[i] = share - floor(share);
    assigned += out[i];
  }
  while (assigned < global) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
      if (frac[i] > frac[best])
        best = i;
    out[best]++;
    frac[best] = -1; /* each node gets at most one remainder unit */
    assigned++;
  }
  free(frac);
  /* clamp, then water-fill the difference onto nodes that still have room,
   * in proportion to capacity (one unit at a time, most capacity first) */
  long long excess = 0; /* > 0: units to place; < 0: units to take back */
  for (size_t i = 0; i < n; i++) {
    unsigned hi = b_max ? b_max[i] : global;
    if (out[i] < b_min) {
      excess -= b_min - out[i];
      out[i] = b_min;
    } else if (out[i] > hi) {
      excess += out[i] - hi;
      out[i] = hi;
    }
  }
  while (excess != 0) {
    size_t best = n;
    double best_score = -1;
    for (size_t i = 0; i < n; i++) {
      unsigned hi = b_max ? b_max[i] : global;
      bool room = excess > 0 ? out[i] < hi : out[i] > b_min;
      if (!room)
        continue;
      /* place where capacity per unit is highest; take where it is lowest */
      double c = total > 0 ? capacity[i] : 1.0;
      double score = excess > 0 ? c / (double)(out[i] + 1) : (double)out[i] / (c + CAPACITY_FLOOR);
      if (score > best_score) {
        best_score = score;
        best = i;
      }
    }
    if (best == n)
      return TD_ERANGE; /* cannot happen when the bounds were feasible */
    if (excess > 0) {
      out[best]++;
      excess--;
    } else {
      out[best]--;
      excess++;
    }
  }
  return 0;
}

bool td_plan_should_replan(const unsigned *old_split, const unsigned *new_split, size_t n,
                           double fraction) {
  for (size_t i = 0; i < n; i++) {
    double old = old_split[i] ? (double)old_split[i] : 1.0;
    if (fabs((double)new_split[i] - (double)old_split[i]) / old > fraction)
      return true;
  }
  return false;
}

double td_plan_ewma(double current, double sample, double rho) {
  if (!isfinite(sample) || sample < 0)
    return current;
  if (!(current > 0))
    return sample;
  return (1.0 - rho) * current + rho * sample;
}

double td_plan_slowdown_wait(double factor, double wall_s, double cpu_s) {
  double cost = isfinite(cpu_s) && cpu_s >= 0 && cpu_s < wall_s ? cpu_s : wall_s;
  double wait = factor * cost - wall_s;
  return wait > 0 ? wait : 0;
}

double td_plan_staleness_weight(long staleness, unsigned max_staleness, double kappa) {
  if (staleness < 0)
    staleness = 0;
  if ((unsigned long)staleness > max_staleness)
    return 0.0;
  return pow(1.0 + (double)staleness, -kappa);
}

unsigned long td_plan_qsr(double alpha, unsigned long h_base, double lr, bool in_warmup,
                          unsigned long cap) {
  unsigned long h = h_base;
  if (!in_warmup && lr > 0 && isfinite(lr) && alpha > 0) {
    double q = floor((alpha / lr) * (alpha / lr));
    if (q > (double)h)
      h = q >= QSR_MAX_STEPS ? (unsigned long)QSR_MAX_STEPS : (unsigned long)q;
  }
  if (cap > 0 && h > cap)
    h = cap;
  return h ? h : 1;
}
