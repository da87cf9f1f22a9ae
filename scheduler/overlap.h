/* overlap.h: the arithmetic of overlap mode's one-round-delayed outer step.
 *
 * A node posts round r's delta and computes r + 1 at once; when r's average
 * arrives, it swaps its own stale progress for the global step and then
 * pulls part of its newest round back toward the anchor (Overlap Local SGD's
 * pull-back, which keeps momentum from compounding the nodes' deviations):
 *   swap:  anchor += step_r ; params += step_r - lead
 *   pull:  params -= alpha * own_{r+1} ; lead = (1 - alpha) * own_{r+1}
 * The round start moves with params, so the next delta stays local progress.
 * A node whose exchanges take overlap_wait times its compute waits for its
 * own round's average instead (td_overlap_sync_next). The derivation, the
 * early swap and exchange-bound rounds: docs/algorithms.md#sync-overlap-and-async;
 * the figures behind the defaults: bench/RESULTS.md. Pure arithmetic: any thread. */
#ifndef TD_OVERLAP_H
#define TD_OVERLAP_H

#include <stdbool.h>
#include <stddef.h>

/* Wait for the own round's average from this exchange / compute ratio on... */
#define TD_OVERLAP_WAIT_DEFAULT 4.0
/* ...and overlap again below this fraction of it. */
#define TD_OVERLAP_WAIT_LEAVE 0.75

/* What a node keeps of its own newest round after the delayed swap
 * (overlap_fix): none keeps all of it (the plain delayed swap), pull keeps
 * 1 - overlap_pull, eager keeps its share 1/N of the round's average (Kale,
 * Douillard and Donchev's eager updates: the node's own current outer step
 * stands in for its part of the average in flight, the others' parts arrive
 * a round late, so each node's step counts once); dc keeps what pull keeps
 * and also compensates each stale average for the drift of the anchor since
 * its round began (td_overlap_compensate). */
typedef enum {
  TD_OVERLAP_FIX_PULL = 0,
  TD_OVERLAP_FIX_NONE,
  TD_OVERLAP_FIX_EAGER,
  TD_OVERLAP_FIX_DC
} td_overlap_fix_t;

/* The largest dc:LAMBDA accepted: lambda multiplies a round's delta squared
 * (about (lr H g)^2 per coordinate), so useful values run far above 1. */
#define TD_OVERLAP_DC_LAMBDA_MAX 1e12

/* The pull-back fraction alpha for td_overlap_pull: 0 (none), overlap_pull
 * (pull, dc) or 1 - 1/nodes (eager; nodes 0 counts as 1). */
double td_overlap_pull_fraction(td_overlap_fix_t fix, double overlap_pull, unsigned nodes);

/* params += step - lead ; start += step - lead (n floats each). */
void td_overlap_swap(float *params, float *start, const float *step, const float *lead, size_t n);

/* params -= alpha * own ; start -= alpha * own ; lead = (1 - alpha) * own. */
void td_overlap_pull(float *params, float *start, float *lead, const float *own, double alpha,
                     size_t n);

/* Delay compensation (DC-ASGD's first-order Taylor correction, the diagonal
 * g * g standing in for the Hessian) of a round's average delta, computed at
 * x_then and applied at x_now = x_then + drift: with the outer gradient
 * g = -avg, g + lambda g g drift is the compensated gradient, so
 *   avg -= min(lambda * avg * avg, 1) * drift   (n floats, elementwise).
 * The cap at 1 is traind's: a round's delta can lose at most the whole
 * drift (a round that reaches its quadratic's optimum; beyond, the estimate
 * has outgrown the curvature it stands for, and uncapped the correction is
 * cubic in the delta: lambda 1e4 made the MLP's loss infinite within four
 * rounds). In overlap mode drift is the anchor's step applied since the
 * round began (the previous round's), the same on every node. */
void td_overlap_compensate(float *avg, const float *drift, double lambda, size_t n);

/* Whether the next round waits for its predecessor's average (exchange-bound,
 * above): `now` is the current choice, exchange_s the last exchange's seconds
 * (post to average; overlapped, it includes the compute it hid behind),
 * compute_s the last round's compute, ratio the threshold (overlap_wait; not
 * > 0: never wait). A compute of 0 saves nothing to overlap with; an exchange
 * that is not a positive number leaves the choice as it is. */
bool td_overlap_sync_next(bool now, double exchange_s, double compute_s, double ratio);

#endif
