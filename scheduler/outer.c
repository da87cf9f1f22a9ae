/* outer.c: the outer SGD step (momentum, Nesterov, clamp) on a round average.
 *
 * Written as one pass over the vectors with the branches hoisted out of the
 * loop, so the common plain-average case is a scaled copy. */
#include "scheduler/outer.h"

bool td_outer_needs_buffer(const td_outer_opts_t *o) {
  return o->momentum > 0 || o->clip > 0;
}

void td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                   size_t n) {
  const float lr = (float)o->lr, mu = (float)o->momentum, c = (float)o->clip;
  if (!td_outer_needs_buffer(o) || buf == NULL) {
    for (size_t i = 0; i < n; i++)
      step[i] = lr * avg[i];
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float g = -avg[i];
    float b = mu * buf[i] + g;
    if (c > 0)
      b = b > c ? c : (b < -c ? -c : b);
    buf[i] = b;
    float d = o->nesterov ? g + mu * b : b;
    step[i] = -lr * d;
  }
}
