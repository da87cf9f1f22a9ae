/* deadline.c: the adaptive round deadline (round_deadline = adaptive:C).
 *
 * Threads: loop thread. The peers' updates of the open round note their
 * arrival times into it (inbox.c); the deadline is their median plus C
 * times their median absolute deviation, at most round_timeout. rounds.c
 * arms the round timer for it and cuts the missing updates when it passes. */
#include "daemon/session/shared.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A peer's update of the open round arrived: its time into the round, for
 * the adaptive deadline. Our own is not one: it comes after the compute
 * alone, the peers' after the compute and the network, and mixing the two
 * would widen the spread until no straggler ever looks late. */
void td__rounds_note_arrival(td__session_t *s) {
  double t = td_clock_mono_s() - s->round_begun;
  s->arrival_s[s->arrivals++ % TD__ARRIVALS] = t > 0 ? t : 0;
}

/* round_deadline = adaptive:C: median + C x MAD of the newest arrival times,
 * at most round_timeout; 0 until TD__ARRIVALS_MIN arrived. */
double td__rounds_adaptive_deadline_s(const td__session_t *s) {
  size_t n = s->arrivals < TD__ARRIVALS ? s->arrivals : TD__ARRIVALS;
  if (n < TD__ARRIVALS_MIN)
    return 0;
  double t[TD__ARRIVALS], dev[TD__ARRIVALS];
  memcpy(t, s->arrival_s, n * sizeof *t);
  qsort(t, n, sizeof *t, cmp_double);
  double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  for (size_t i = 0; i < n; i++)
    dev[i] = fabs(t[i] - median);
  qsort(dev, n, sizeof *dev, cmp_double);
  double mad = n % 2 ? dev[n / 2] : (dev[n / 2 - 1] + dev[n / 2]) / 2;
  /* MAD floored at a tenth of the median: near-identical arrival times must
   * not put the deadline on the median itself, cutting half the punctual */
  double d = median + s->spec.deadline_mad_c * (mad > median / 10 ? mad : median / 10);
  return d < s->spec.round_timeout ? d : s->spec.round_timeout;
}
