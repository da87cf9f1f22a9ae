/* overlap.h: the arithmetic of overlap mode's one-round-delayed outer step.
 *
 * In overlap mode a node posts round r's delta (own_r, its progress over the
 * round) and computes round r + 1 at once; round r's average arrives during
 * r + 1. At the end of r + 1 the node holds params = anchor + lead + own_{r+1}
 * (lead: what params still hold of round r beyond the anchor) and
 *   swap:  anchor += step_r ; params += step_r - lead
 * (step_r: the outer step on round r's average), so params = anchor + own_{r+1}:
 * its stale own progress is replaced by the global step, the progress made
 * since is kept. Then the pull-back of Overlap Local SGD (Wang, Liang, Joshi,
 * ICASSP'20) with alpha in [0, 1]:
 *   pull:  params -= alpha * own_{r+1} ; lead = (1 - alpha) * own_{r+1}
 * which is params = (1 - alpha) * params + alpha * anchor. Why: every node
 * computes r + 1 from anchor + its own round r, so its deviation from the
 * others' progress (own_r - average_r) stays in its model for a whole round;
 * the inner optimizer reacts to it, and the swap then removes the deviation
 * but not the reaction. With momentum 0.9 the reaction overshoots (the inner
 * optimizer's response over H steps is negative in stiff directions) and the
 * nodes' deviations grow from round to round; pulling back alpha of the own
 * progress before the next round shrinks what they react to. The pulled
 * progress is not lost (the next swap adds that round's global step in
 * full), but the round after it is computed that much behind, which slows
 * the consensus. On a quadratic with momentum 0.9 and H = 8 (the linear
 * round-to-round maps of the deviation and of the consensus): with alpha = 0
 * the deviations grow, up to 1.8x a round, from lr x curvature 0.08 on; with
 * alpha = 0.4 both are stable up to lr x curvature 1.13 and grow by at most
 * 1.04x (deviation) and 1.13x (consensus) a round in narrow bands beyond;
 * a larger alpha slows the consensus (at 0.45 it is unstable from 0.85).
 * Hence overlap_pull's default 0.4; test_overlap checks lr x curvature = 1,
 * where alpha = 0 diverges and 0.4 converges.
 * The round start moves with params in both calls, so the next delta stays
 * pure local progress (fill steps taken before the swap stay in it).
 *
 * Exchange-bound rounds. Overlapping hides a round's exchange (from posting
 * its delta to its average arriving) behind the next round's compute, which
 * saves at most that compute a round; when the exchange takes several times
 * longer, the node mostly waits for it anyway and the one-round delay costs
 * accuracy for almost no time. Then the node waits for its own round's
 * average before computing the next one, as sync does (no delay, nothing to
 * pull back; the round takes its compute longer, at most 1 / (ratio + 1) of
 * it). On the MLP over the WAN bench (5 ms of compute, ~85 ms exchanges)
 * overlap + auto then ends where sync + auto does. The ratio (the run key
 * overlap_wait, default TD_OVERLAP_WAIT_DEFAULT) is checked every round (the
 * exchange just waited for against the compute of the round just taken),
 * with some hysteresis; each node decides for itself: the anchors, hence the
 * consensus, are the same either way. The choice depends on timing, so a run
 * that must repeat bit for bit sets overlap_wait = 0.
 *
 * Early swap (overlap_early; off by default). Round r's average usually lands
 * while round r + 1 is still computing (the exchange takes less than the
 * compute it hides behind). The compute thread then takes r + 1's steps one
 * at a time and makes the swap at the first step boundary after the average
 * is there, rather than at the end of r + 1: the same swap (params and the
 * round start move together, so own_{r+1} stays local progress), the delay
 * shortened to what the exchange took. The pull-back still follows at the
 * end of r + 1. Which step sees the average depends on timing, so such runs
 * do not repeat bit for bit. On the WAN bench's cnn the anchor (what the
 * evaluations measure) reached 0.90 sooner with it; on the MLP of the same
 * WAN, whose rounds mostly wait for their own average, it ended 0.1 point
 * lower (6 runs each), hence off by default.
 * Pure arithmetic: any thread. */
#ifndef TD_OVERLAP_H
#define TD_OVERLAP_H

#include <stdbool.h>
#include <stddef.h>

/* Wait for the own round's average from this exchange / compute ratio on... */
#define TD_OVERLAP_WAIT_DEFAULT 4.0
/* ...and overlap again below this fraction of it. */
#define TD_OVERLAP_WAIT_LEAVE 0.75

/* params += step - lead ; start += step - lead (n floats each). */
void td_overlap_swap(float *params, float *start, const float *step, const float *lead, size_t n);

/* params -= alpha * own ; start -= alpha * own ; lead = (1 - alpha) * own. */
void td_overlap_pull(float *params, float *start, float *lead, const float *own, double alpha,
                     size_t n);

/* Whether the next round waits for its predecessor's average (exchange-bound,
 * above): `now` is the current choice, exchange_s the last exchange's seconds
 * (post to average; overlapped, it includes the compute it hid behind),
 * compute_s the last round's compute, ratio the threshold (overlap_wait; not
 * > 0: never wait). A compute of 0 saves nothing to overlap with; an exchange
 * that is not a positive number leaves the choice as it is. */
bool td_overlap_sync_next(bool now, double exchange_s, double compute_s, double ratio);

#endif
