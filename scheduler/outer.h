/* outer.h: the outer optimizer applied to the averaged round update.
 *
 * After a round the peers' deltas (params - anchor) are averaged into `avg`;
 * the pseudo-gradient is its negation, D = -avg (DiLoCo;
 * docs/algorithms.md#local-sgd-and-the-outer-optimizer). The outer step follows PyTorch's SGD convention:
 *   b <- mu * b + D ;  b <- clamp(b, -clip, clip) when clip > 0
 *   d <- nesterov ? D + mu * b : b ;  anchor <- anchor - lr * d
 * With lr = 1 and mu = 0 the step is exactly avg (plain periodic averaging).
 * The clamp is element-wise and in place (CO2's outer momentum clipping,
 * whose reference code drops the clamp's result). Pure arithmetic:
 * every peer applies the same step to the same average. */
#ifndef TD_OUTER_H
#define TD_OUTER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  double lr;       /* outer learning rate eta (1 = take the average as is) */
  double momentum; /* mu in [0, 1) */
  bool nesterov;
  double clip;     /* element-wise clamp of b; 0 = off */
} td_outer_opts_t;

/* Whether the step needs a momentum buffer (momentum > 0 or clip > 0). */
bool td_outer_needs_buffer(const td_outer_opts_t *o);

/* step[i] = -lr * d[i] for the average avg of n elements; buf is the momentum
 * buffer b (n floats, zero before the first round; NULL allowed when
 * td_outer_needs_buffer() is false). step may alias avg. */
void td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                   size_t n);

#endif
