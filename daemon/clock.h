/* clock.h: the daemon's clocks, in seconds as doubles. Monotonic time measures
 * durations and sets deadlines (immune to clock steps); wall time is only for
 * what a person reads (logs, the ledger). Any thread. */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: compare, never print). */
double td_clock_mono_s(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME). */
double td_clock_wall_s(void);
/* `seconds` (of either clock) as a timespec, e.g. a pthread_cond_timedwait
 * deadline on a condition variable bound to CLOCK_MONOTONIC. */
struct timespec td_clock_timespec(double seconds);

#endif
