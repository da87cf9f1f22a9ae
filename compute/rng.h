/* rng.h: the one portable PRNG of traind (xoshiro256** seeded by splitmix64).
 *
 * Everything random in traind (initialisation, shuffling, partitions, stochastic
 * codecs) draws from this generator so a seed reproduces a run bit for bit on any
 * platform; the C library rand() is never used. td_rng_t is a small value type and
 * is therefore public; it owns no memory. */
#ifndef TD_RNG_H
#define TD_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint64_t s[4];
} td_rng_t;

/* Seed from one 64-bit value (expanded with splitmix64). */
void td_rng_seed(td_rng_t *rng, uint64_t seed);
/* Seed from a base seed and a stream id, for independent per-purpose streams. */
void td_rng_seed2(td_rng_t *rng, uint64_t seed, uint64_t stream);
uint64_t td_rng_next(td_rng_t *rng);
/* Uniform double in [0, 1) with 53 random bits. */
double td_rng_uniform(td_rng_t *rng);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint32_t td_rng_below(td_rng_t *rng, uint32_t n);
/* Standard normal (Box-Muller; no cached second value, so streams stay simple). */
double td_rng_normal(td_rng_t *rng);
/* Gamma(shape, 1) for shape > 0 (Marsaglia-Tsang, boosted for shape < 1). */
double td_rng_gamma(td_rng_t *rng, double shape);
/* Fisher-Yates shuffle of an index array. */
void td_rng_shuffle_u32(td_rng_t *rng, uint32_t *a, size_t n);

#endif
