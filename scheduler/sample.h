/* sample.h: client sampling, which members train a round when only some do.
 *
 * Federated experiments train a fraction of the clients each round (FedAvg's
 * C; docs/algorithms.md#client-sampling-and-stragglers). With nodes as clients, round r's
 * sample is drawn from a PRNG seeded by (run seed, r): every member derives
 * the same sample from the same numbers without a message, and a member that
 * comes back derives the samples of the rounds it missed the same way. A
 * member outside the sample does not train the round and sends nothing; no
 * round waits for it. Pure functions; a sample is a bit mask over member
 * ranks (TD_MEMBERS_MAX <= 64). */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stdint.h>

/* Members a round samples out of `members` (1 to 64): participation in (0, 1]
 * is a fraction, ceil(participation x members) and at least 1 (1: every
 * member); a whole number N >= 2 is N members (every member when N >= members). */
unsigned td_sample_size(double participation, unsigned members);

/* Round `round`'s sample: bit i set for rank i of `members` (1 to 64), k of
 * them (all when k >= members), uniformly among the k-subsets, from a PRNG
 * seeded by (seed, round) (partial Fisher-Yates). */
uint64_t td_sample_draw(uint64_t seed, uint64_t round, unsigned members, unsigned k);

/* Virtual clients (run key `clients`): a round samples among every node's
 * clients, up to TD_SAMPLE_MAX_CLIENTS of them. */
#define TD_SAMPLE_MAX_CLIENTS 4096u
#define TD_SAMPLE_SET_WORDS (TD_SAMPLE_MAX_CLIENTS / 64)

/* Round `round`'s sample of k among the `population` (<= TD_SAMPLE_MAX_CLIENTS)
 * candidates cand[0..population) (client indices < TD_SAMPLE_MAX_CLIENTS):
 * the same partial Fisher-Yates and stream as td_sample_draw over the
 * candidates' positions, so with cand[i] = i and population <= 64 it picks
 * what td_sample_draw picks. Bit c of set (TD_SAMPLE_SET_WORDS words, filled
 * by the call) is client c. How many it picked (k, or all when k >= population). */
unsigned td_sample_draw_set(uint64_t seed, uint64_t round, const uint16_t *cand,
                            unsigned population, unsigned k, uint64_t *set);

#endif
