/* plan.h: the scheduler's pure rules — weighted dynamic batching, staleness
 * weights and the quadratic synchronization rule (docs/algorithms.md:
 * #weighted-dynamic-batching, #sync-overlap-and-async and
 * #rounds-and-the-quadratic-synchronization-rule).
 *
 * Every function here is deterministic arithmetic on values all peers share,
 * so each node computes the same plan without negotiating. Nothing here
 * touches a socket or a clock; the daemon feeds it measurements. */
#ifndef TD_PLAN_H
#define TD_PLAN_H

#include <stdbool.h>
#include <stddef.h>

/* Split a global batch across n nodes in proportion to their capacities
 * (samples/s): floor of each share, the remainder to the largest fractional
 * parts (ties to the lower index), then clamped to [b_min, b_max[i]] with the
 * excess re-distributed by water-filling. The result always sums to `global`
 * when that is feasible (n * b_min <= global <= sum b_max); TD_ERANGE
 * otherwise, TD_EINVAL for n == 0 or a capacity that is not finite and >= 0
 * (all-zero capacities split evenly). b_max may be NULL (no upper bound). */
int td_plan_split_batch(const double *capacity, size_t n, unsigned global, unsigned b_min,
                        const unsigned *b_max, unsigned *out);

/* Apply a new split only if some node's batch moves by more than `fraction`
 * (e.g. 0.1) of its old value, so measurement noise does not churn plans. */
bool td_plan_should_replan(const unsigned *old_split, const unsigned *new_split, size_t n,
                           double fraction);

/* One capacity measurement folded into an EWMA: c = (1 - rho) c + rho x. The
 * first sample (c <= 0) is taken as it is; non-finite samples are ignored. */
double td_plan_ewma(double current, double sample, double rho);

/* slowdown = F (an emulated device F times slower than this core): how long
 * to stay idle after work that took wall_s seconds and cpu_s CPU seconds
 * (NAN when the CPU time is unknown) so that it ends F times its cost after
 * it began. The cost is cpu_s when known and below wall_s, else wall_s; so a
 * wait for a core shared with other emulated nodes (wall_s > cpu_s) falls
 * inside the F times instead of adding to them. Never negative. */
double td_plan_slowdown_wait(double factor, double wall_s, double cpu_s);

/* Weight of an update that is `staleness` rounds old: (1 + a)^-kappa, and 0
 * (drop) when a > max_staleness. Negative staleness counts as 0. */
double td_plan_staleness_weight(long staleness, unsigned max_staleness, double kappa);

/* Quadratic synchronization rule: H = max(H_base, floor((alpha / lr)^2)),
 * capped at `cap` (e.g. the steps left) when cap > 0; H_base during warm-up
 * or when lr is not positive. */
unsigned long td_plan_qsr(double alpha, unsigned long h_base, double lr, bool in_warmup,
                          unsigned long cap);

#endif
