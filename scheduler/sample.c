/* sample.c: the per-round sample of members (client sampling).
 *
 * The draw is a partial Fisher-Yates shuffle of the ranks with the project's
 * one PRNG (compute/rng.h), seeded by the run's seed on a stream named by
 * the round, so it depends on nothing but (seed, round, members, k). */
#include "scheduler/sample.h"

#include <math.h>
#include <string.h>

#include "compute/rng.h"

/* "SAMPLE" in ASCII: keeps the sampling streams apart from the others the
 * run's seed feeds (init, shuffling, partitions). */
#define SAMPLE_STREAM 0x53414D504C45ull

unsigned td_sample_size(double participation, unsigned members) {
  if (members == 0)
    return 0;
  if (!(participation > 0) || participation >= members)
    return members;
  if (participation <= 1) {
    double k = ceil(participation * (double)members - 1e-9); /* 0.1 x 30 is 3, not 4 */
    return k < 1 ? 1 : (unsigned)k;
  }
  return (unsigned)participation;
}

uint64_t td_sample_draw(uint64_t seed, uint64_t round, unsigned members, unsigned k) {
  if (members > 64)
    members = 64;
  if (k >= members)
    return members == 64 ? UINT64_MAX : (UINT64_C(1) << members) - 1;
  td_rng_t rng;
  td_rng_seed2(&rng, seed, SAMPLE_STREAM ^ (round * 0x9E3779B97F4A7C15ull));
  uint32_t rank[64];
  for (unsigned i = 0; i < members; i++)
    rank[i] = i;
  uint64_t mask = 0;
  for (unsigned i = 0; i < k; i++) {
    unsigned j = i + td_rng_below(&rng, members - i);
    uint32_t t = rank[i];
    rank[i] = rank[j];
    rank[j] = t;
    mask |= UINT64_C(1) << rank[i];
  }
  return mask;
}

unsigned td_sample_draw_set(uint64_t seed, uint64_t round, const uint16_t *cand,
                            unsigned population, unsigned k, uint64_t *set) {
  memset(set, 0, TD_SAMPLE_SET_WORDS * sizeof *set);
  if (population > TD_SAMPLE_MAX_CLIENTS)
    population = TD_SAMPLE_MAX_CLIENTS;
  uint16_t pos[TD_SAMPLE_MAX_CLIENTS];
  for (unsigned i = 0; i < population; i++)
    pos[i] = (uint16_t)i;
  if (k >= population) {
    for (unsigned i = 0; i < population; i++)
      set[cand[i] / 64] |= UINT64_C(1) << (cand[i] % 64);
    return population;
  }
  td_rng_t rng;
  td_rng_seed2(&rng, seed, SAMPLE_STREAM ^ (round * 0x9E3779B97F4A7C15ull));
  for (unsigned i = 0; i < k; i++) {
    unsigned j = i + td_rng_below(&rng, population - i);
    uint16_t t = pos[i];
    pos[i] = pos[j];
    pos[j] = t;
    unsigned c = cand[pos[i]] % TD_SAMPLE_MAX_CLIENTS;
    set[c / 64] |= UINT64_C(1) << (c % 64);
  }
  return k;
}
