/* peer_wire.h: what every test peer (td_admitter, td_member, td_intruder,
 * td_runstart_peer, td_flood) does before its own attack: a clock, sending one
 * envelope, a ROUTER of its own for the nodes' answers, a CURVE DEALER to a
 * node that says hello, and reading handshake events off a socket monitor.
 * Header-only, like peer_keys.h, so each peer stays one file to build. */
#ifndef TD_TEST_PEER_WIRE_H
#define TD_TEST_PEER_WIRE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_keys.h"

/* Seconds on the monotonic clock. */
static inline double peer_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Pack env (version set; sender set to `sender` unless env already names one)
 * and send it on s with zmq flags `flags`; a packing failure sends nothing. */
static inline void peer_send(void *s, Traind__Envelope *env, uint64_t sender, int flags) {
  uint8_t *buf = NULL;
  size_t len = 0;
  env->version = TD_WIRE_VERSION;
  if (env->sender == 0)
    env->sender = sender;
  if (td_wire_pack(env, &buf, &len) == 0)
    zmq_send(s, buf, len, flags);
  free(buf);
}

/* A Hello from `as` that names `me` as where the node answers. */
static inline void peer_hello(void *s, const char *me, uint64_t as, int flags) {
  Traind__Hello hello = TRAIND__HELLO__INIT;
  hello.endpoint = (char *)me;
  hello.incarnation = (uint64_t)time(NULL);
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HELLO;
  env.hello = &hello;
  peer_send(s, &env, as, flags);
}

/* A CURVE-server ROUTER bound to a free loopback port, its endpoint written to
 * me (me_len bytes); NULL when the bind fails. linger_ms < 0 keeps zmq's. */
static inline void *peer_listen(void *ctx, int linger_ms, int timeout_ms, char *me, size_t me_len) {
  void *router = zmq_socket(ctx, ZMQ_ROUTER);
  if (linger_ms >= 0)
    zmq_setsockopt(router, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  peer_keys_server(router);
  if (zmq_bind(router, "tcp://127.0.0.1:*") != 0) {
    zmq_close(router);
    return NULL;
  }
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, me, &me_len);
  return router;
}

/* A DEALER that is a CURVE client of the node at endpoint (server_key NULL:
 * plain ZMTP), its send high-water mark sndhwm (<= 0 keeps zmq's); NULL when
 * the connect fails. */
static inline void *peer_dial(void *ctx, const char *endpoint, const char *server_key,
                              int linger_ms, int sndhwm) {
  void *dealer = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  if (sndhwm > 0)
    zmq_setsockopt(dealer, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
  peer_keys_client(dealer, server_key);
  if (zmq_connect(dealer, endpoint) != 0) {
    zmq_close(dealer);
    return NULL;
  }
  return dealer;
}

/* The next event waiting on a socket monitor (its frames all read), or -1
 * when none is waiting. */
static inline int peer_monitor_event(void *mon) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&f);
    return -1;
  }
  uint16_t ev = 0;
  if (zmq_msg_size(&f) >= 2)
    memcpy(&ev, zmq_msg_data(&f), 2);
  bool more = zmq_msg_more(&f);
  zmq_msg_close(&f);
  while (more) {
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, mon, 0) < 0) {
      zmq_msg_close(&f);
      break;
    }
    more = zmq_msg_more(&f);
    zmq_msg_close(&f);
  }
  return ev;
}

/* Whether a monitor event is a failed CURVE/ZMTP handshake. */
static inline bool peer_handshake_failed(int ev) {
  return ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
         ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
}

#endif
