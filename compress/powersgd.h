/* powersgd.h: PowerSGD's building blocks, exposed for tests and benchmarks.
 * The codec itself is used through compress/codec.h. */
#ifndef TD_POWERSGD_H
#define TD_POWERSGD_H

#include <stddef.h>

/* Modified Gram-Schmidt on the r columns of p (n x r, row-major); a column
 * whose norm collapses below 1e-6 of its norm before projection (or 1e-30)
 * becomes zero instead of NaN. */
void td__powersgd_orthogonalize(float *p, size_t n, unsigned r);
/* One power step on mat (n x m): p = orth(mat q), q = matᵀ p, and, when approx
 * is not NULL, approx = p qᵀ. q (m x r) is read and overwritten (warm start). */
void td__powersgd_step(const float *mat, size_t n, size_t m, unsigned r, float *q, float *p,
                       float *approx);

#endif
