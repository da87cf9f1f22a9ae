/* clock.h: the daemon's two clocks, for every thread.
 *
 * Wall time (seconds since the epoch) is what the ledger records; monotonic
 * time (seconds since an arbitrary start) is what every timeout, deadline and
 * goodput sample is measured in, so a clock step never fires or stalls one.
 * Both are safe from any thread. */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <time.h>

static inline double td_clock_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double td_clock_mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* `seconds` of either clock as a timespec, e.g. a pthread_cond_timedwait
 * deadline on a condition variable bound to CLOCK_MONOTONIC. */
static inline struct timespec td_clock_timespec(double seconds) {
  struct timespec ts;
  if (!(seconds > 0))
    seconds = 0;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) { /* rounding reached a whole second */
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

#endif
