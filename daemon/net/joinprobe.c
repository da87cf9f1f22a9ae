/* joinprobe.c: a throwaway CURVE client whose socket monitor tells a join why
 * the node it asked does not answer (joinprobe.h).
 *
 * Threads: loop thread; polled by control_admit.c's join timer, never blocking
 * (every receive is ZMQ_DONTWAIT). The probe has its own ZeroMQ context so
 * the node's transport, its links and its ZAP handler stay untouched; the
 * context's two threads live only as long as a pending join. A join by
 * invite also carries its one request and answer on the probe's DEALER
 * (td__joinprobe_send/recv), whose CURVE keys are then the invite's. */
#include "daemon/net/joinprobe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "daemon/base/clock.h"

#define PROBE_MONITOR "inproc://traind-join-probe"
/* ZMTP handshake events come as a 6-byte frame: event (16 bits), value (32). */
#define EVENT_FRAME_BYTES 6

struct td__joinprobe {
  void *ctx, *dealer, *monitor;
  td__probe_state_t state;
  bool reached;
  bool carries; /* a message was sent on it: keep it open once accepted */
  double connected_at; /* monotonic s of the last TCP connection (open time before) */
  double failed_after_s;
  int early_drops;        /* handshakes dropped at once, in a row */
  double first_drop_at;   /* monotonic s of the first of them */
};

static void close_sockets(td__joinprobe_t *p) {
  if (p->dealer != NULL)
    zmq_close(p->dealer);
  if (p->monitor != NULL)
    zmq_close(p->monitor);
  p->dealer = p->monitor = NULL;
}

int td__joinprobe_open(td__joinprobe_t **out, const char *endpoint, const char *server_key,
                       const char *public_key, const char *secret_key) {
  *out = NULL;
  td__joinprobe_t *p = calloc(1, sizeof *p);
  if (p == NULL || (p->ctx = zmq_ctx_new()) == NULL) {
    free(p);
    return -1;
  }
  int linger = 0, handshake_ms = TD__HANDSHAKE_TIMEOUT_MS;
  p->connected_at = td_clock_mono_s();
  p->dealer = zmq_socket(p->ctx, ZMQ_DEALER);
  p->monitor = zmq_socket(p->ctx, ZMQ_PAIR);
  bool ok = p->dealer != NULL && p->monitor != NULL &&
            zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof linger) == 0 &&
            zmq_setsockopt(p->dealer, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms) ==
                0 &&
            zmq_setsockopt(p->dealer, ZMQ_CURVE_SERVERKEY, server_key, strlen(server_key) + 1) ==
                0 &&
            zmq_setsockopt(p->dealer, ZMQ_CURVE_PUBLICKEY, public_key, strlen(public_key) + 1) ==
                0 &&
            zmq_setsockopt(p->dealer, ZMQ_CURVE_SECRETKEY, secret_key, strlen(secret_key) + 1) ==
                0 &&
            zmq_socket_monitor(p->dealer, PROBE_MONITOR,
                               ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0 &&
            zmq_setsockopt(p->monitor, ZMQ_LINGER, &linger, sizeof linger) == 0 &&
            zmq_connect(p->monitor, PROBE_MONITOR) == 0 && zmq_connect(p->dealer, endpoint) == 0;
  if (!ok) {
    td__joinprobe_close(&p);
    return -1;
  }
  *out = p;
  return 0;
}

/* One event, its frames read whole; false when none is waiting. */
static bool next_event(td__joinprobe_t *p, uint16_t *event, uint32_t *value) {
  zmq_msg_t frame;
  zmq_msg_init(&frame);
  if (zmq_msg_recv(&frame, p->monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&frame);
    return false;
  }
  *event = 0;
  *value = 0;
  if (zmq_msg_size(&frame) >= EVENT_FRAME_BYTES) {
    memcpy(event, zmq_msg_data(&frame), sizeof *event);
    memcpy(value, (const uint8_t *)zmq_msg_data(&frame) + sizeof *event, sizeof *value);
  }
  bool more = zmq_msg_more(&frame);
  zmq_msg_close(&frame);
  while (more) { /* the endpoint frame */
    zmq_msg_init(&frame);
    more = zmq_msg_recv(&frame, p->monitor, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&frame);
    zmq_msg_close(&frame);
  }
  return true;
}

td__probe_state_t td__joinprobe_poll(td__joinprobe_t *p) {
  uint16_t event;
  uint32_t value;
  while (p->monitor != NULL && p->state == TD__PROBE_PENDING && next_event(p, &event, &value)) {
    if (event == ZMQ_EVENT_CONNECTED) {
      p->reached = true;
      p->connected_at = td_clock_mono_s();
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
      p->state = TD__PROBE_ACCEPTED;
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      p->state = TD__PROBE_NOT_ADMITTED; /* the ZAP status: 300, 400 or 500 */
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
             event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      /* the events carry no time: the loop reads them every few tens of ms */
      p->failed_after_s = td_clock_mono_s() - p->connected_at;
      bool late = p->failed_after_s >= TD__PROBE_TIMEOUT_SHARE * TD__HANDSHAKE_TIMEOUT_MS / 1e3;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && late)
        p->state = TD__PROBE_TIMED_OUT;
      else if (p->early_drops++ == 0)
        p->first_drop_at = td_clock_mono_s();
      else if (p->early_drops >= TD__PROBE_MISMATCH_DROPS &&
               td_clock_mono_s() - p->first_drop_at >= TD__PROBE_MISMATCH_S)
        p->state = TD__PROBE_KEY_MISMATCH;
      /* else libzmq reconnects: a node shedding a flood may take the next */
    }
  }
  if (p->state != TD__PROBE_PENDING && !(p->carries && p->state == TD__PROBE_ACCEPTED))
    close_sockets(p); /* no reconnecting to a node that answered */
  return p->state;
}

bool td__joinprobe_reached(const td__joinprobe_t *p) { return p->reached; }

double td__joinprobe_failed_after_s(const td__joinprobe_t *p) { return p->failed_after_s; }

int td__joinprobe_send(td__joinprobe_t *p, const void *data, size_t len) {
  if (p->dealer == NULL || zmq_send(p->dealer, data, len, ZMQ_DONTWAIT) < 0)
    return -1;
  p->carries = true;
  return 0;
}

int td__joinprobe_recv(td__joinprobe_t *p, void *buf, size_t cap, size_t *len) {
  if (p->dealer == NULL)
    return -1;
  int n = zmq_recv(p->dealer, buf, cap, ZMQ_DONTWAIT);
  if (n < 0)
    return -1;
  *len = (size_t)n; /* may exceed cap: truncated, and the caller refuses it */
  return 0;
}

void td__joinprobe_close(td__joinprobe_t **self_p) {
  td__joinprobe_t *p = *self_p;
  if (p == NULL)
    return;
  *self_p = NULL;
  close_sockets(p);
  if (p->ctx != NULL)
    zmq_ctx_term(p->ctx);
  free(p);
}
