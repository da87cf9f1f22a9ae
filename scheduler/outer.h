/* outer.h: the outer optimizer applied to the averaged round update.
 *
 * After a round the peers' deltas (params - anchor) are averaged into `avg`;
 * the pseudo-gradient is its negation, D = -avg (DiLoCo;
 * docs/algorithms.md#local-sgd-and-the-outer-optimizer). Two families:
 *
 * sgd follows PyTorch's SGD convention:
 *   b <- mu * b + D ;  b <- clamp(b, -clip, clip) when clip > 0
 *   d <- nesterov ? D + mu * b : b ;  anchor <- anchor - lr * d
 * With lr = 1 and mu = 0 the step is exactly avg (plain periodic averaging).
 * The clamp is element-wise and in place (CO2's outer momentum clipping,
 * whose reference code drops the clamp's result).
 *
 * adam, yogi and adagrad are Reddi et al.'s adaptive server optimizers
 * (ICLR'21, "Adaptive Federated Optimization", Algorithm 2), on avg itself:
 *   m <- beta1 m + (1 - beta1) avg
 *   v <- v + avg^2                                   (adagrad)
 *   v <- beta2 v + (1 - beta2) avg^2                 (adam)
 *   v <- v - (1 - beta2) avg^2 sign(v - avg^2)       (yogi)
 *   anchor <- anchor + lr m / (sqrt(v) + tau)
 * with m = 0 and v = tau^2 at the start (the paper's v_-1 >= tau^2) and no
 * bias correction, as published.
 *
 * Pure arithmetic in one fixed order: every peer applies the same step to
 * the same average and holds the same state, which travels with the anchor
 * to a late joiner. */
#ifndef TD_OUTER_H
#define TD_OUTER_H

#include <stdbool.h>
#include <stddef.h>

/* In the order of the run key's names: sgd, adam, yogi, adagrad. */
typedef enum { TD_OUTER_SGD = 0, TD_OUTER_ADAM, TD_OUTER_YOGI, TD_OUTER_ADAGRAD } td_outer_kind_t;

typedef struct {
  td_outer_kind_t kind;
  double lr;       /* outer learning rate eta (sgd: 1 = take the average as is) */
  double momentum; /* sgd: mu in [0, 1) */
  bool nesterov;   /* sgd */
  double clip;     /* sgd: element-wise clamp of b; 0 = off */
  double beta1;    /* adam, yogi, adagrad: first-moment decay in [0, 1) */
  double beta2;    /* adam, yogi: second-moment decay in [0, 1) */
  double tau;      /* adam, yogi, adagrad: adaptivity floor (> 0) */
} td_outer_opts_t;

/* Whether the step keeps state: sgd with momentum > 0 or clip > 0, and
 * every adaptive kind. */
bool td_outer_needs_buffer(const td_outer_opts_t *o);

/* Floats of state the step keeps for n parameters: 0 (plain sgd), n (sgd's
 * b) or 2n (m, then v, for the adaptive kinds). */
size_t td_outer_state_floats(const td_outer_opts_t *o, size_t n);

/* Put the state of n parameters (td_outer_state_floats(o, n) floats) where
 * the first round expects it: zeros, and v = tau^2 for the adaptive kinds. */
void td_outer_state_init(const td_outer_opts_t *o, float *state, size_t n);

/* step[i] = what the anchor moves by, for the average avg of n elements;
 * state is td_outer_state_floats(o, n) floats set by td_outer_state_init
 * (NULL allowed when td_outer_needs_buffer() is false), updated in place.
 * step may alias avg. */
void td_outer_step(const td_outer_opts_t *o, const float *avg, float *state, float *step,
                   size_t n);

#endif
