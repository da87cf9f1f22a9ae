/* ring.h: the arithmetic of a ring all-reduce (run key `topology = ring`):
 * the ring's order from measured link costs, the split of a vector into
 * chunks, and which chunk each position sends and receives at each step of
 * the reduce-scatter and the all-gather.
 *
 * A pipelined ring runs at the pace of its slowest hop, so the order
 * minimises first the largest hop cost and then the sum of the hop costs.
 * Every node computes the same order from the same matrix, bit for bit, on
 * any machine: ties go to the lowest index, nothing is random, and sums are
 * taken in one fixed order. Pure functions; td_ring_order allocates
 * temporaries and frees them before it returns. A position p = 0..n-1 is an
 * index into the tour (order[p] is the member there); p sends to p + 1 and
 * receives from p - 1, mod n. */
#ifndef TD_RING_H
#define TD_RING_H

#include <stddef.h>

#define TD_RING_N_MAX 256u    /* the most positions */
#define TD_RING_EXACT_MAX 10u /* exact tour search up to this many positions; a heuristic above */

/* The ring's order from a cost matrix (borrowed): cost[i * n + j], i != j, is
 * what it costs member i to send one chunk to member j (seconds per byte,
 * say), finite and >= 0; the diagonal is ignored. Writes into order[0..n-1]
 * a permutation of 0..n-1 with order[0] == 0: order[k] sends to
 * order[(k + 1) % n]. Least largest hop first, then least sum. Exact for
 * n <= TD_RING_EXACT_MAX (the least bottleneck by a search over the distinct
 * edge costs, then Held-Karp on the edges no dearer than it); above, the
 * best of nearest-neighbour tours from each of the first 16 members, each
 * improved by or-opt moves (a segment of 1 to 3 members moved elsewhere,
 * direction kept) to a fixed bound, and so never worse than nearest
 * neighbour from 0 or than 0, 1, .., n-1 (about 0.1 s at n = 256; on random
 * 10-member matrices it finds the exact bottleneck 96 times in 100).
 * n == 1 gives {0},
 * n == 2 {0, 1}. 0, or -1 (order untouched) for n == 0, n > TD_RING_N_MAX,
 * a NULL pointer, a NaN, infinite or negative cost off the diagonal, or no
 * memory. */
int td_ring_order(const double *cost, size_t n, size_t *order);

/* A tour's cost under that objective: *bottleneck the largest hop, *sum all
 * hops added in tour order (order[0] -> order[1] first). Both 0 for n < 2. */
void td_ring_tour_cost(const double *cost, size_t n, const size_t *order, double *bottleneck,
                       double *sum);

/* Chunk c of the n chunks of a vector of len elements is [*off, *off + *cnt):
 * the first len % n chunks hold len / n + 1 elements, the rest len / n; they
 * cover the vector exactly, in order. c >= n (or n == 0) gives *off = len,
 * *cnt = 0. */
void td_ring_chunk(size_t len, size_t n, size_t c, size_t *off, size_t *cnt);

/* The schedule: TD_RING_STEPS(n) steps s = 0 .. 2n - 3, all mod n.
 *   reduce-scatter, s < n - 1: p sends chunk p - s and receives chunk
 *     p - s - 1, which it ADDS to its own copy as received + own (the
 *     received partial sum first). Chunk c thus starts at c and is summed
 *     along c, c + 1, .., c + n - 1; after step n - 2 position p holds the
 *     whole sum of chunk p + 1 (td_ring_owned_chunk).
 *   all-gather, s >= n - 1, g = s - (n - 1): p sends chunk p + 1 - g (its
 *     owned chunk at g = 0, then what it received the step before) and
 *     receives chunk p - g, which it COPIES over its own.
 * What p sends at step s is what p + 1 receives at step s. Out of range
 * (p >= n or s >= TD_RING_STEPS(n)) the chunk functions answer n. */
#define TD_RING_STEPS(n) (2u * ((n) - 1u))
size_t td_ring_send_chunk(size_t n, size_t p, size_t step);
size_t td_ring_recv_chunk(size_t n, size_t p, size_t step);
/* 1 for a reduce-scatter step (add what arrives), 0 for an all-gather step (copy it). */
int td_ring_step_adds(size_t n, size_t step);
/* The chunk whose whole sum position p holds after the reduce-scatter: (p + 1) mod n. */
size_t td_ring_owned_chunk(size_t n, size_t p);
/* Where a member is in the tour: the p with order[p] == member, or n if absent. */
size_t td_ring_position(const size_t *order, size_t n, size_t member);

#endif
