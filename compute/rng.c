/* rng.c: xoshiro256** (Blackman and Vigna) seeded through splitmix64, plus the
 * few distributions traind needs: uniform doubles, unbiased bounded integers
 * (Lemire), normals (Box-Muller), gammas (Marsaglia-Tsang) and Fisher-Yates.
 *
 * Only integer arithmetic and correctly rounded libm calls (log, sqrt, cos, pow)
 * touch the stream, so a seed reproduces the same draws on every platform that
 * traind builds on. Nothing here allocates or fails. */
#include "compute/rng.h"

#include <math.h>

#define TD__GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64: a good 64-bit mixer used only to expand seeds into state. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += TD__GOLDEN_GAMMA);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void td_rng_seed(td_rng_t *rng, uint64_t seed) {
  uint64_t x = seed;
  /* splitmix64 never yields four zero words in a row, so the state is valid */
  for (int i = 0; i < 4; i++)
    rng->s[i] = splitmix64(&x);
}

void td_rng_seed2(td_rng_t *rng, uint64_t seed, uint64_t stream) {
  /* Mixing the stream id before the xor keeps (seed, stream) and
   * (seed ^ 1, stream ^ 1)-style neighbours from landing on related states. */
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
  if (n == 0)
    return 0; /* documented as a caller error; answer something harmless */
  /* Lemire's multiply-and-reject: the high half of x * n is uniform in [0, n)
   * once the few low halves below 2^32 mod n are rejected. */
  uint64_t m = (td_rng_next(rng) >> 32) * (uint64_t)n;
  uint32_t low = (uint32_t)m;
  if (low < n) {
    uint32_t threshold = (uint32_t)(-n) % n;
    while (low < threshold) {
      m = (td_rng_next(rng) >> 32) * (uint64_t)n;
      low = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

double td_rng_normal(td_rng_t *rng) {
  /* 1 - U lies in (0, 1], so the logarithm is always finite */
  double u1 = 1.0 - td_rng_uniform(rng);
  double u2 = td_rng_uniform(rng);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double td_rng_gamma(td_rng_t *rng, double shape) {
  if (!(shape > 0))
    return 0; /* also catches NaN */
  if (shape < 1) {
    /* Gamma(a) = Gamma(a + 1) * U^(1/a); for tiny a this underflows to 0,
     * which callers that normalise (Dirichlet) must and do handle. */
    double g = td_rng_gamma(rng, shape + 1.0);
    return g * pow(td_rng_uniform(rng), 1.0 / shape);
  }
  double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = td_rng_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    double u = 1.0 - td_rng_uniform(rng); /* (0, 1]: log(u) is finite */
    if (u < 1.0 - 0.0331 * (x * x) * (x * x))
      return d * v;
    if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
      return d * v;
  }
}

/* Uniform in [0, n) for any size_t n > 0; arrays beyond 2^32 entries fall back
 * to a rejection loop on 64-bit draws. */
static size_t below_size(td_rng_t *rng, size_t n) {
  if (n <= UINT32_MAX)
    return td_rng_below(rng, (uint32_t)n);
  uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n;
  uint64_t r;
  do
    r = td_rng_next(rng);
  while (r >= limit);
  return (size_t)(r % (uint64_t)n);
}

void td_rng_shuffle_u32(td_rng_t *rng, uint32_t *a, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = below_size(rng, i);
    uint32_t t = a[i - 1];
    a[i - 1] = a[j];
    a[j] = t;
  }
}
