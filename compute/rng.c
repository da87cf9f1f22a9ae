/* rng.c: xoshiro256** (Blackman and Vigna) seeded through splitmix64, plus
 * the few distributions traind needs. Deterministic on every platform. */
#include "compute/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void td_rng_seed(td_rng_t *rng, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    rng->s[i] = splitmix64(&x);
}

void td_rng_seed2(td_rng_t *rng, uint64_t seed, uint64_t stream) {
  uint64_t x = stream;
  td_rng_seed(rng, seed ^ splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t td_rng_next(td_rng_t *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double td_rng_uniform(td_rng_t *rng) { return (double)(td_rng_next(rng) >> 11) * 0x1.0p-53; }

uint32_t td_rng_below(td_rng_t *rng, uint32_t n) {
  /* Lemire's multiply-and-reject: unbiased without a division per draw */
  uint64_t m = (uint64_t)(uint32_t)(td_rng_next(rng) >> 32) * n;
  uint32_t low = (uint32_t)m;
  if (low < n) {
    uint32_t threshold = (uint32_t)(-n) % n;
    while (low < threshold) {
      m = (uint64_t)(uint32_t)(td_rng_next(rng) >> 32) * n;
      low = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

double td_rng_normal(td_rng_t *rng) {
  double u1 = td_rng_uniform(rng), u2 = td_rng_uniform(rng);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double td_rng_gamma(td_rng_t *rng, double shape) {
  if (!(shape > 0))
    return 0;
  if (shape < 1) {
    double u = td_rng_uniform(rng);
    return td_rng_gamma(rng, shape + 1.0) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
  }
  double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = td_rng_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    double u = td_rng_uniform(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x)
      return d * v;
    if (log(u > 0 ? u : 1e-300) < 0.5 * x * x + d * (1.0 - v + log(v)))
      return d * v;
  }
}

void td_rng_shuffle_u32(td_rng_t *rng, uint32_t *a, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = td_rng_below(rng, (uint32_t)i);
    uint32_t t = a[i - 1];
    a[i - 1] = a[j];
    a[j] = t;
  }
}
