/* pathrtt.h: a link's path round-trip time, from heartbeat echoes.
 *
 * Each heartbeat carries the sender's clock and echoes the peer's last stamp
 * with how long it was held (daemon/gossip.c), so a node measures the round
 * trip of a message a few hundred bytes long: propagation and queueing, next
 * to no serialization. The linkq's RTT (scheduler/linkq.h) is that of 64 KiB
 * update chunks, which on a 2 Mbit/s uplink is mostly the chunk's own
 * serialization. The estimate is the minimum of the samples of the current
 * and the previous window (BBR's min_rtt filter): a sample that waited behind
 * a burst does not raise it, and a minimum older than one to two windows is
 * forgotten, so a path that got longer is seen within that time.
 *
 * Pure arithmetic, no clock: the caller passes the times in. */
#ifndef TD_PATHRTT_H
#define TD_PATHRTT_H

#include <stdint.h>

/* Window of the running minimum, seconds. */
#define TD_PATHRTT_WINDOW_S 10.0

/* Zero-initialize; the fields are private. */
typedef struct {
  double min_s, prev_min_s, window_start_s;
} td_pathrtt_t;

/* A sample (seconds; ignored unless > 0 and finite) taken at now_s. */
void td_pathrtt_sample(td_pathrtt_t *r, double rtt_s, double now_s);
/* The estimate in seconds: 0 until a sample came. */
double td_pathrtt(const td_pathrtt_t *r);

/* The sample an echo gives, in seconds, or 0 when the echo does not check
 * out: our stamp it echoes (echo_us) not in the future and at most
 * max_age_us old, and the peer's hold (hold_us) shorter than the round trip.
 * Microseconds of the same monotonic clock as now_us; 0 is "none". */
double td_pathrtt_echo(uint64_t now_us, uint64_t echo_us, uint64_t hold_us, uint64_t max_age_us);

#endif
