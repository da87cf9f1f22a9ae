/* outer.c: the outer step on a round average: SGD (momentum, Nesterov,
 * clamp) or an adaptive server optimizer (FedAdam, FedYogi, FedAdagrad).
 *
 * Written as one pass over the vectors with the branches hoisted out of the
 * loop, so the common plain-average case is a scaled copy. The adaptive
 * kinds compute in float with sqrtf (correctly rounded), so every node that
 * runs this code on the same average gets the same bits. */
#include <math.h>

#include "scheduler/outer.h"

bool td_outer_needs_buffer(const td_outer_opts_t *o) {
  return o->kind != TD_OUTER_SGD || o->momentum > 0 || o->clip > 0;
}

size_t td_outer_state_floats(const td_outer_opts_t *o, size_t n) {
  if (o->kind != TD_OUTER_SGD)
    return 2 * n;
  return td_outer_needs_buffer(o) ? n : 0;
}

void td_outer_state_init(const td_outer_opts_t *o, float *state, size_t n) {
  size_t floats = td_outer_state_floats(o, n);
  for (size_t i = 0; i < floats; i++)
    state[i] = 0;
  if (o->kind == TD_OUTER_SGD)
    return;
  const float tau2 = (float)(o->tau * o->tau);
  for (size_t i = 0; i < n; i++)
    state[n + i] = tau2;
}

static void sgd_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
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

/* One kind per loop, so the branch on the kind is outside the loop. */
static void adaptive_step(const td_outer_opts_t *o, const float *avg, float *m, float *v,
                          float *step, size_t n) {
  const float lr = (float)o->lr, b1 = (float)o->beta1, b2 = (float)o->beta2;
  const float tau = (float)o->tau;
  for (size_t i = 0; i < n; i++)
    m[i] = b1 * m[i] + (1 - b1) * avg[i];
  switch (o->kind) {
  case TD_OUTER_ADAGRAD:
    for (size_t i = 0; i < n; i++)
      v[i] += avg[i] * avg[i];
    break;
  case TD_OUTER_ADAM:
    for (size_t i = 0; i < n; i++)
      v[i] = b2 * v[i] + (1 - b2) * (avg[i] * avg[i]);
    break;
  case TD_OUTER_YOGI:
    for (size_t i = 0; i < n; i++) {
      float d2 = avg[i] * avg[i];
      float sign = v[i] > d2 ? 1.0f : (v[i] < d2 ? -1.0f : 0.0f);
      v[i] -= (1 - b2) * d2 * sign;
    }
    break;
  case TD_OUTER_SGD: break; /* not reached: td_outer_step dispatches sgd */
  }
  for (size_t i = 0; i < n; i++)
    step[i] = lr * m[i] / (sqrtf(v[i]) + tau);
}

void td_outer_step(const td_outer_opts_t *o, const float *avg, float *state, float *step,
                   size_t n) {
  if (o->kind == TD_OUTER_SGD)
    sgd_step(o, avg, state, step, n);
  else
    adaptive_step(o, avg, state, state + n, step, n);
}
