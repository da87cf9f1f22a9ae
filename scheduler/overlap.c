/* overlap.c: overlap mode's delayed swap and anchor pull-back (overlap.h),
 * one pass over the vectors each. */
#include "scheduler/overlap.h"

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
