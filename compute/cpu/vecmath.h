/* vecmath.h: small math helpers for the CPU kernels that gcc vectorises
 * (inline, branch-free, no libm call), shared by compute/layer_*.c and
 * compute/cpu/backend_cpu.c. Private to compute/. */
#ifndef TD_VECMATH_H
#define TD_VECMATH_H

#include <stdint.h>
#include <string.h>

/* exp(x), branch-free so the loops that call it vectorise (libm's expf and
 * tanhf are a call per element; tanhf was a third of a GPT step): x = n ln2 + r,
 * |r| <= ln2/2, a degree-6 Taylor polynomial for e^r (relative error < 2e-7)
 * and 2^n built in the exponent bits. Inputs are clamped to [-87, 87]: a
 * sigmoid has long saturated there, and e^-87 (1.6e-38) is 0 to a softmax's
 * float sums. */
static inline float td__exp_fast(float x) {
  x = x > 87.0f ? 87.0f : x; /* a NaN passes both and stays NaN */
  x = x < -87.0f ? -87.0f : x;
  /* round to nearest by the 1.5 * 2^23 trick: no call, no branch. n comes
   * from a NaN-free copy so the integer conversion below is defined; a NaN
   * still reaches r, and so the result. */
  float xn = x == x ? x : 0.0f;
  float n = (xn * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
                     r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 126]: a normal 2^n */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#endif
