/* scaffold.h: SCAFFOLD's control variates (Karimireddy et al. 2020, option II),
 * the arithmetic only: the client's corrected-gradient offset, the client's
 * control-variate update after a round, and the global control variate
 * derived from the round's average delta. docs/algorithms.md#scaffold says
 * why the global update needs nothing on the wire. Pure functions over
 * caller-owned float arrays of n elements; any thread. */
#ifndef TD_SCAFFOLD_H
#define TD_SCAFFOLD_H

#include <stddef.h>

/* What each local step adds to its gradient: corr = c - ci (so the step
 * descends g - ci + c). */
void td_scaffold_correction(float *corr, const float *c, const float *ci, size_t n);

/* Option II, after a client went from x to y in steps whose learning rates
 * sum to lr_sum (> 0): ci += -c + (x - y) / lr_sum. */
void td_scaffold_client_update(float *ci, const float *c, const float *x, const float *y,
                               double lr_sum, size_t n);

/* The global control variate after a round whose participating clients' mean
 * update (y_i - x) is avg_delta, all with the same lr_sum (> 0), frac being
 * participating / all clients: c += frac * (-c - avg_delta / lr_sum), which
 * is c + frac * mean_i(ci_new - ci_old) for those clients. */
void td_scaffold_server_update(float *c, const float *avg_delta, double lr_sum, double frac,
                               size_t n);

#endif
