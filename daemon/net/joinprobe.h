/* joinprobe.h: watch one CURVE handshake with the node a `trainctl join`
 * names, so the join can say why that node does not answer.
 *
 * Threads: loop thread (control_admit.c). ZeroMQ answers a refused handshake with
 * nothing the application sees: the link just reconnects. A probe opens one
 * DEALER of its own, in a context of its own, with the same keys as the link,
 * and reads that socket's monitor events: the handshake succeeded, the node
 * refused our key (ZAP status 400: not on its allowlist), or it closed the
 * connection mid-handshake (it could not decrypt our hello: the server key
 * we were given is not its key), or the handshake ran out of time.
 *
 * The last two give the same event (HANDSHAKE_FAILED_NO_DETAIL): a wrong
 * key is dropped as soon as the node reads our hello, a handshake that runs
 * out of time (an overloaded node, something that takes the connection but
 * never speaks ZMTP) only when its timer fires, on either side, after
 * TD__HANDSHAKE_TIMEOUT_MS. So a drop that comes late is a timeout, not a
 * key mismatch. A node that sheds connections under a flood also drops one
 * at once, but not every time: only early drops in a row (libzmq reconnects
 * between them) for TD__PROBE_MISMATCH_S, at least TD__PROBE_MISMATCH_DROPS
 * of them, are read as a wrong key. */
#ifndef TD_DAEMON_JOINPROBE_H
#define TD_DAEMON_JOINPROBE_H

#include <stdbool.h>
#include <stddef.h>

/* How long a ZMTP handshake may take, on a node's ROUTER (transport.c) and
 * on a probe, before the connection is closed (libzmq's default is 30 s). */
#define TD__HANDSHAKE_TIMEOUT_MS 5000
/* A handshake dropped after this share of TD__HANDSHAKE_TIMEOUT_MS since the
 * connection was made ran out of time; a wrong key is dropped at once. */
#define TD__PROBE_TIMEOUT_SHARE 0.8
/* Early drops in a row, and for how long, that make a key mismatch: a wrong
 * key is dropped at every try (libzmq retries every 100 ms); a connection
 * shed under a flood gets through on one of the next tries. */
#define TD__PROBE_MISMATCH_DROPS 3
#define TD__PROBE_MISMATCH_S 1.0

typedef struct td__joinprobe td__joinprobe_t;

typedef enum {
  TD__PROBE_PENDING,      /* no handshake finished yet */
  TD__PROBE_ACCEPTED,     /* the handshake succeeded */
  TD__PROBE_NOT_ADMITTED, /* the node's ZAP handler refused our key */
  TD__PROBE_KEY_MISMATCH, /* the node dropped us mid-handshake: wrong server key */
  TD__PROBE_TIMED_OUT,    /* the handshake did not finish in time (see above) */
} td__probe_state_t;

/* Connect a probe to `endpoint` as CURVE client of `server_key` with our
 * pair (Z85 texts). Returns 0, or -1 when ZeroMQ cannot set it up (the join
 * then goes on without a probe). The caller owns *out. */
int td__joinprobe_open(td__joinprobe_t **out, const char *endpoint, const char *server_key,
                       const char *public_key, const char *secret_key);

/* Read the monitor events that came; the first decisive one stays the answer. */
td__probe_state_t td__joinprobe_poll(td__joinprobe_t *p);

/* Whether a TCP connection was ever made (something listens there). */
bool td__joinprobe_reached(const td__joinprobe_t *p);
/* Seconds from the connection to the failed handshake's end (after
 * TD__PROBE_KEY_MISMATCH or TD__PROBE_TIMED_OUT; 0 before). */
double td__joinprobe_failed_after_s(const td__joinprobe_t *p);

/* Queue one message on the probe's connection (sent once it is up; the
 * probe then stays open when the handshake succeeds). -1 when closed. */
int td__joinprobe_send(td__joinprobe_t *p, const void *data, size_t len);
/* One message that came back, into buf (*len: its whole size, which may be
 * more than cap: truncated); -1 when none is waiting. */
int td__joinprobe_recv(td__joinprobe_t *p, void *buf, size_t cap, size_t *len);

/* Close the sockets and the context; NULL-safe, nulls the caller's pointer. */
void td__joinprobe_close(td__joinprobe_t **self_p);

#endif
