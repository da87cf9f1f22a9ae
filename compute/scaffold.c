/* scaffold.c: SCAFFOLD's control-variate arithmetic (scaffold.h). Sums are
 * taken in double and rounded once per element, so every node that feeds
 * the same inputs gets the same floats. */
#include "compute/scaffold.h"

void td_scaffold_correction(float *corr, const float *c, const float *ci, size_t n) {
  for (size_t i = 0; i < n; i++)
    corr[i] = c[i] - ci[i];
}

void td_scaffold_client_update(float *ci, const float *c, const float *x, const float *y,
                               double lr_sum, size_t n) {
  for (size_t i = 0; i < n; i++)
    ci[i] = (float)((double)ci[i] - (double)c[i] + ((double)x[i] - (double)y[i]) / lr_sum);
}

void td_scaffold_server_update(float *c, const float *avg_delta, double lr_sum, double frac,
                               size_t n) {
  for (size_t i = 0; i < n; i++)
    c[i] = (float)((double)c[i] + frac * (-(double)c[i] - (double)avg_delta[i] / lr_sum));
}
