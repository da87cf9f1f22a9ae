/* relay.h: the frames one node that accepts no connections sends another
 * through a reachable member: wrapped and signed by the origin, checked by
 * the target (its signature, then its sequence number against a replay
 * window). See relay.c. Loop thread only. */
#ifndef TD_DAEMON_NET_RELAY_H
#define TD_DAEMON_NET_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/net/admission.h"
#include "proto/wire.h"

/* The sequence numbers one origin's frames are checked against: the newest
 * taken and this many before it. */
#define TD__RELAY_WINDOW 4096

typedef struct td__relays td__relays_t;

typedef enum {
  TD__RELAY_OK = 0,   /* take it: its seq is now recorded as taken */
  TD__RELAY_FORGED,   /* the origin's signature does not hold (altered on the way) */
  TD__RELAY_REPLAYED, /* its seq was taken before, or is older than the window */
} td__relay_verdict_t;

/* One node's relay state: its own next sequence number (from the wall clock
 * in microseconds, so a restarted node continues above what it sent before)
 * and a window per origin. TD_ENOMEM; the caller owns *out. */
int td__relays_open(td__relays_t **out);
void td__relays_close(td__relays_t **self_p);

/* Pack `frame` (origin's own packed envelope, 1..TD_WIRE_MAX_RELAYED bytes)
 * into a Relay envelope for `target`, signed by `adm` with the next sequence
 * number; the outer envelope's sender is `origin`, its seq `env_seq`. *out is
 * the caller's to free; TD_EPROTO when it cannot be packed. */
int td__relay_wrap(td__relays_t *r, const td__admission_t *adm, uint64_t origin, uint64_t target,
                   uint64_t env_seq, const uint8_t *frame, size_t len, uint8_t **out,
                   size_t *out_len);

/* A Relay addressed to this node: the signature against the origin's signing
 * key `sign` (NULL: an insecure cluster, nothing is checked), then its
 * sequence number, which is recorded only when both hold. */
td__relay_verdict_t td__relay_accept(td__relays_t *r, const Traind__Relay *relay,
                                     const uint8_t *sign);

#endif
