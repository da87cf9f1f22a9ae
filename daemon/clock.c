/* clock.c: monotonic and wall clocks in seconds (see clock.h). */
#include "daemon/clock.h"

#define NS_PER_S 1e9

static double seconds_of(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / NS_PER_S;
}

double td_clock_mono_s(void) { return seconds_of(CLOCK_MONOTONIC); }
double td_clock_wall_s(void) { return seconds_of(CLOCK_REALTIME); }

struct timespec td_clock_timespec(double seconds) {
  struct timespec ts;
  if (!(seconds > 0))
    seconds = 0;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * NS_PER_S);
  if (ts.tv_nsec >= (long)NS_PER_S) { /* rounding up to a whole second */
    ts.tv_sec++;
    ts.tv_nsec -= (long)NS_PER_S;
  }
  return ts;
}
