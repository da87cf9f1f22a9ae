/* budget.c: the per-link byte budget of codec = auto; see budget.h. */
#include "scheduler/budget.h"

#include <math.h>

#include "scheduler/plan.h"

double td_budget_link_bytes(double goodput_bps, double compute_s, double min_s) {
  if (!(goodput_bps > 0))
    return 0;
  double t = compute_s > min_s ? compute_s : min_s;
  return TD_BUDGET_SHARE * goodput_bps * t;
}

double td_budget_goodput_acked(double goodput_bps, double bytes, double seconds,
                               double budget) {
  if (!(seconds > 0))
    return goodput_bps;
  double sample = bytes / seconds;
  if (budget > 0 && bytes < TD_BUDGET_APP_LIMITED * budget)
    return sample > goodput_bps ? sample : goodput_bps;
  return td_plan_ewma(goodput_bps, sample, TD_BUDGET_EWMA);
}

double td_budget_goodput_unacked(double goodput_bps, uint64_t bytes, double since_s) {
  if (!(since_s > 0) || bytes == 0)
    return goodput_bps;
  double cap = (double)bytes / since_s;
  return goodput_bps > 0 && goodput_bps <= cap ? goodput_bps : cap;
}
