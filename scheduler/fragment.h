/* fragment.h: Streaming DiLoCo's fragments (Douillard et al. 2025, arXiv
 * 2501.18512) for sync and overlap mode (run keys fragments = P and
 * fragment_alpha; docs/algorithms.md#streaming-fragments).
 *
 * The flat parameter vector is cut into P contiguous slices of equal length
 * (the first numel % P one float longer), which every node derives from the
 * model's size alone. Round r synchronises fragment r mod P only: the node's
 * update is params - anchor on that slice (zero elsewhere; only the slice
 * travels, as a codec message of that range), which covers
 * every local step since the fragment's last synchronisation, and the outer
 * step moves that slice of the anchor. In sync mode the slice of params then
 * becomes the anchor's; in overlap mode the average arrives a round later
 * and is mixed in, params <- alpha params + (1 - alpha) anchor on the slice.
 * P = 1 is not this rule: the run keeps overlap mode's delayed swap and
 * sync mode's whole-model step unchanged. Pure arithmetic: any thread. */
#ifndef TD_FRAGMENT_H
#define TD_FRAGMENT_H

#include <stddef.h>
#include <stdint.h>

/* The most fragments a run may cut its model into. */
#define TD_FRAGMENTS_MAX 64
/* fragment_alpha's default: the paper's mixing factor. */
#define TD_FRAGMENT_ALPHA_DEFAULT 0.5

/* The slice that round `round` synchronises of `numel` floats cut into
 * `parts` (1 <= parts <= numel): its first float in *offset, its length in
 * *count (>= 1). parts 1 gives the whole vector. */
void td_fragment_span(size_t numel, unsigned parts, uint64_t round, size_t *offset,
                      size_t *count);

/* The fragment index of `round`: round mod parts. */
unsigned td_fragment_of(uint64_t round, unsigned parts);

/* update[i] = params[i] - anchor[i] on [offset, offset + count), 0 elsewhere
 * (numel floats each). */
void td_fragment_delta(float *update, const float *params, const float *anchor, size_t numel,
                       size_t offset, size_t count);

/* params[i] = alpha params[i] + (1 - alpha) anchor[i] for the n floats given
 * (the slice's start in each); alpha 0 copies the anchor. */
void td_fragment_mix(float *params, const float *anchor, double alpha, size_t n);

#endif
