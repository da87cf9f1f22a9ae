/* inbound.h: the peer port's inbound connections, as transport.c uses them
 * (private to daemon/net/; the layers above see td__transport_inbound_stats
 * and td__transport_descriptors in net.h).
 *
 * transport.c opens one td__inbound_t with the descriptor shares, points it
 * at its bound ROUTER (td__inbound_watch) and ticks it; inbound.c never calls
 * back into the transport. Loop thread only. */
#ifndef TD_DAEMON_NET_INBOUND_H
#define TD_DAEMON_NET_INBOUND_H

#include <uv.h>

#include "daemon/net/net.h"

/* An inbound connection silent this long (and TD__IDLE_CLOSE_BEATS
 * heartbeats) is closed; a link's DEALERs ping every quarter of it, so a live
 * traind's connections never look silent. */
#define TD__IDLE_CLOSE_MIN_S 10.0
#define TD__IDLE_CLOSE_BEATS 40.0

typedef struct td__inbound td__inbound_t;

/* Track the inbound connections under `shares` (copied; NULL: those of a
 * 1024-descriptor limit); refusals counted in `drops` (borrowed). Close
 * silent connections after max(TD__IDLE_CLOSE_MIN_S, TD__IDLE_CLOSE_BEATS *
 * heartbeat_s). *out is set whatever happens (td__inbound_close it);
 * TD_ENOMEM when out of memory. */
int td__inbound_open(td__inbound_t **out, uv_loop_t *loop, const td__descriptors_t *shares,
                     double heartbeat_s, td__drops_t *drops);
/* Watch the bound ROUTER `router` of context `zctx` through a socket monitor;
 * listen_port (network order) tells its accepted descriptors from others.
 * When libzmq gives no monitor, nothing is counted or shed. */
void td__inbound_watch(td__inbound_t *in, void *zctx, void *router, int listen_port);
/* Read the monitor's events, then forget closed descriptors and shut the
 * silent ones down (the transport's tick). */
void td__inbound_tick(td__inbound_t *in);
/* The counts (handshake_limited left 0: the ZAP handler keeps that one). */
void td__inbound_stats(const td__inbound_t *in, td__inbound_stats_t *out);
/* The shares enforced (borrowed from `in`). */
const td__descriptors_t *td__inbound_shares(const td__inbound_t *in);
void td__inbound_stop(td__inbound_t *in);           /* close its handle (shutdown) */
void td__inbound_close(td__inbound_t **self_p);     /* before the context ends; NULL-safe */

#endif
