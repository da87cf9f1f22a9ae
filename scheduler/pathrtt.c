/* pathrtt.c: a link's path RTT as a windowed minimum; see pathrtt.h. */
#include "scheduler/pathrtt.h"

#include <math.h>

void td_pathrtt_sample(td_pathrtt_t *r, double rtt_s, double now_s) {
  if (!(rtt_s > 0) || !isfinite(rtt_s))
    return;
  if (!(r->min_s > 0) || now_s - r->window_start_s > TD_PATHRTT_WINDOW_S) {
    r->prev_min_s = r->min_s;
    r->min_s = rtt_s;
    r->window_start_s = now_s;
  } else if (rtt_s < r->min_s) {
    r->min_s = rtt_s;
  }
}

double td_pathrtt(const td_pathrtt_t *r) {
  if (r->prev_min_s > 0 && r->prev_min_s < r->min_s)
    return r->prev_min_s;
  return r->min_s > 0 ? r->min_s : 0;
}

double td_pathrtt_echo(uint64_t now_us, uint64_t echo_us, uint64_t hold_us, uint64_t max_age_us) {
  if (echo_us == 0 || echo_us > now_us || now_us - echo_us > max_age_us ||
      hold_us >= now_us - echo_us)
    return 0;
  return (double)(now_us - echo_us - hold_us) / 1e6;
}
