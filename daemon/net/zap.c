/* zap.c: the ZAP handler (RFC 27) that decides who may connect.
 *
 * Threads: loop thread. libzmq asks the socket bound to
 * inproc://zeromq.zap.01 in the transport's context about every CURVE
 * handshake on the ROUTER; the request carries the client's public key. This
 * file answers from the node's allowlist (access.c): 200 with the key's Z85
 * text as the User-Id, which libzmq then attaches to every message of that
 * connection (transport.c reads it back with zmq_msg_gets), or 400 and the
 * handshake fails. The REP socket is polled through ZMQ_FD on the libuv loop
 * like the ROUTER, drained while ZMQ_EVENTS reports input (edge-triggered).
 *
 * An admitted key may not open connections without end: each key has a
 * bucket of KEY_HANDSHAKE_BURST handshakes refilled at KEY_HANDSHAKES_PER_S,
 * and a handshake beyond it is refused like an unknown key (its connection
 * closes, and libzmq does not dial it again: an honest node that hit the
 * bound is dialed again by its own echo check, linkstats.c). Honest nodes open two
 * connections to a peer and reconnect after a restart, far below that.
 *
 * A refused key that is not listed is remembered by node id (the last
 * REFUSED_KEPT of them, with how many of its handshakes were refused): once
 * the node admits that key, its heartbeats to it carry the count, and the
 * refused node dials again (libzmq does not, and one of its two connections
 * may have been refused while the other got through).
 *
 * A key that is not listed may still be a pending invite's one-time key
 * (admission.h): that one handshake is accepted, with the User-Id
 * "invite:KEY" that transport.c hands only a join request through; a second
 * handshake with the same key, or one after the invite expired, is refused,
 * counted and logged. Strangers without an invite's secret cannot make that
 * handshake, so nothing here grows with them. */
#include "daemon/net/net.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
/* version, request id, domain, address, identity, mechanism, credentials */
#define ZAP_REQUEST_FRAMES 7
#define ZAP_MAX_FRAMES 16
#define REFUSAL_LOGS_IN_FULL 20
/* Handshakes one admitted key may start at once, and per second after. */
#define KEY_HANDSHAKE_BURST 32.0
#define KEY_HANDSHAKES_PER_S 1.0
/* Keys whose bucket is kept; the least recently used one is forgotten. */
#define KEY_BUCKETS 64

typedef struct {
  uint8_t key[TD_KEY_BYTES];
  double tokens, at; /* mono seconds of the last refill; 0: slot unused */
} key_bucket_t;

/* Unknown keys refused, by node id; the least recently refused is forgotten. */
#define REFUSED_KEPT 64
typedef struct {
  uint64_t node_id;
  uint32_t count;
  double at; /* mono seconds of the last refusal; 0: slot unused */
} refused_key_t;

struct td__zap {
  td__access_t *access;
  void *sock;
  uv_poll_t poll;
  bool polling;
  uint64_t refusals;
  uint64_t limited; /* handshakes refused: their key connected too often */
  key_bucket_t buckets[KEY_BUCKETS];
  refused_key_t refused[REFUSED_KEPT];
};

static void note_refused(td__zap_t *z, const uint8_t *key) {
  uint64_t id = td_key_node_id(key);
  refused_key_t *r = NULL, *oldest = &z->refused[0];
  for (size_t i = 0; i < REFUSED_KEPT && r == NULL; i++) {
    if (z->refused[i].at > 0 && z->refused[i].node_id == id)
      r = &z->refused[i];
    else if (z->refused[i].at < oldest->at)
      oldest = &z->refused[i];
  }
  if (r == NULL) {
    r = oldest;
    *r = (refused_key_t){.node_id = id};
  }
  if (r->count < UINT32_MAX)
    r->count++;
  r->at = td_clock_mono_s();
}

uint32_t td__zap_refused_of(const td__zap_t *z, uint64_t node_id) {
  if (z == NULL)
    return 0;
  for (size_t i = 0; i < REFUSED_KEPT; i++)
    if (z->refused[i].at > 0 && z->refused[i].node_id == node_id)
      return z->refused[i].count;
  return 0;
}

/* One handshake of `key` now, or false when its bucket is empty. */
static bool take_handshake(td__zap_t *z, const uint8_t *key) {
  double now = td_clock_mono_s();
  key_bucket_t *b = NULL, *oldest = &z->buckets[0];
  for (size_t i = 0; i < KEY_BUCKETS && b == NULL; i++) {
    if (z->buckets[i].at > 0 && memcmp(z->buckets[i].key, key, TD_KEY_BYTES) == 0)
      b = &z->buckets[i];
    else if (z->buckets[i].at < oldest->at)
      oldest = &z->buckets[i];
  }
  if (b == NULL) {
    b = oldest;
    memcpy(b->key, key, TD_KEY_BYTES);
    b->tokens = KEY_HANDSHAKE_BURST;
  } else {
    b->tokens += (now - b->at) * KEY_HANDSHAKES_PER_S;
    if (b->tokens > KEY_HANDSHAKE_BURST)
      b->tokens = KEY_HANDSHAKE_BURST;
  }
  b->at = now;
  if (b->tokens < 1.0)
    return false;
  b->tokens -= 1.0;
  return true;
}

uint64_t td__zap_limited(const td__zap_t *z) { return z != NULL ? z->limited : 0; }

static void send_reply(void *sock, const zmq_msg_t *request_id, const char *code,
                       const char *text, const char *user_id) {
  zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
  if (request_id != NULL)
    zmq_send(sock, zmq_msg_data((zmq_msg_t *)request_id), zmq_msg_size((zmq_msg_t *)request_id),
             ZMQ_SNDMORE);
  else
    zmq_send(sock, "", 0, ZMQ_SNDMORE);
  zmq_send(sock, code, strlen(code), ZMQ_SNDMORE);
  zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
  zmq_send(sock, user_id, strlen(user_id), ZMQ_SNDMORE);
  zmq_send(sock, "", 0, 0);
}

/* One request (all its frames are there once the first is). */
static bool handle_one(td__zap_t *z) {
  zmq_msg_t f[ZAP_MAX_FRAMES];
  size_t n = 0;
  bool more = true;
  while (more) {
    zmq_msg_t tmp;
    zmq_msg_init(&tmp);
    if (zmq_msg_recv(&tmp, z->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&tmp);
      if (n == 0)
        return false;
      break;
    }
    more = zmq_msg_more(&tmp);
    if (n < ZAP_MAX_FRAMES)
      f[n++] = tmp;
    else
      zmq_msg_close(&tmp);
  }
  char peer_addr[64] = "?";
  if (n >= 4)
    snprintf(peer_addr, sizeof peer_addr, "%.*s", (int)zmq_msg_size(&f[3]),
             (const char *)zmq_msg_data(&f[3]));
  bool curve = n == ZAP_REQUEST_FRAMES && zmq_msg_size(&f[5]) == 5 &&
               memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
               zmq_msg_size(&f[6]) == TD_KEY_BYTES && zmq_msg_size(&f[0]) == 3 &&
               memcmp(zmq_msg_data(&f[0]), "1.0", 3) == 0;
  if (!curve) {
    send_reply(z->sock, n >= 2 ? &f[1] : NULL, "400", "CURVE only", "");
  } else {
    const uint8_t *key = zmq_msg_data(&f[6]);
    char z85[TD_KEY_Z85_LEN + 1];
    zmq_z85_encode(z85, key, TD_KEY_BYTES);
    td__invite_check_t invite = td__access_listed(z->access, key)
                                    ? TD__INVITE_NONE
                                    : td__admission_invite_handshake(
                                          td__access_admission(z->access), key);
    if (invite == TD__INVITE_OK) {
      char user_id[8 + TD_KEY_Z85_LEN + 1];
      snprintf(user_id, sizeof user_id, TD__INVITE_USER_ID "%s", z85);
      td_log_info("accepted the handshake of invite key %s from %s (its only one)", z85,
                  peer_addr);
      send_reply(z->sock, &f[1], "200", "OK", user_id);
    } else if (invite != TD__INVITE_NONE) {
      td__admission_stats_t st;
      td__admission_stats(td__access_admission(z->access), &st);
      uint64_t count = invite == TD__INVITE_USED ? st.invites_refused_used
                                                 : st.invites_refused_expired;
      if (td__drop_should_log(count))
        td_log_warn("refused a connection from %s: invite key %s %s (refused so far: %" PRIu64
                    "; make a new one with trainctl invite)", peer_addr, z85,
                    invite == TD__INVITE_USED ? "was used already" : "has expired", count);
      send_reply(z->sock, &f[1], "400", invite == TD__INVITE_USED ? "invite used" :
                 "invite expired", "");
    } else if (td__access_admits(z->access, key)) {
      if (take_handshake(z, key)) {
        send_reply(z->sock, &f[1], "200", "OK", z85);
      } else {
        z->limited++;
        if (td__drop_should_log(z->limited))
          td_log_warn("refused a connection from %s: key %s connects too often (more than "
                      "%.0f handshakes at once, %.0f a second after; refused so far: %" PRIu64
                      ")", peer_addr, z85, KEY_HANDSHAKE_BURST, KEY_HANDSHAKES_PER_S,
                      z->limited);
        send_reply(z->sock, &f[1], "400", "too many connections", "");
      }
    } else {
      z->refusals++;
      note_refused(z, key);
      if (z->refusals <= REFUSAL_LOGS_IN_FULL || z->refusals % 1000 == 0)
        td_log_warn("refused a connection from %s: key %s is not on the allowlist "
                    "(refused so far: %" PRIu64 ")", peer_addr, z85, z->refusals);
      send_reply(z->sock, &f[1], "400", "key not admitted", "");
    }
  }
  for (size_t i = 0; i < n; i++)
    zmq_msg_close(&f[i]);
  return true;
}

void td__zap_drain(td__zap_t *z) {
  if (z == NULL || z->sock == NULL)
    return;
  for (;;) {
    int events = 0;
    size_t sz = sizeof events;
    if (zmq_getsockopt(z->sock, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN))
      return;
    if (!handle_one(z))
      return;
  }
}

static void on_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  td__zap_drain(h->data);
}

int td__zap_open(td__zap_t **out, void *zctx, uv_loop_t *loop, td__access_t *access, char *why,
                 size_t why_len) {
  *out = NULL;
  td__zap_t *z = calloc(1, sizeof *z);
  if (z == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  z->access = access;
  z->sock = zmq_socket(zctx, ZMQ_REP);
  int linger = 0;
  if (z->sock != NULL)
    zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof linger);
  if (z->sock == NULL || zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
    int rc = td_why(why, why_len, TD_EIO, "cannot start the ZAP handler on %s: %s",
                    ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
    if (z->sock != NULL)
      zmq_close(z->sock);
    free(z);
    return rc;
  }
  int fd;
  size_t sz = sizeof fd;
  zmq_getsockopt(z->sock, ZMQ_FD, &fd, &sz);
  uv_poll_init(loop, &z->poll, fd);
  z->poll.data = z;
  uv_poll_start(&z->poll, UV_READABLE, on_readable);
  z->polling = true;
  *out = z;
  return 0;
}

void td__zap_stop(td__zap_t *z) {
  if (z == NULL || !z->polling)
    return;
  z->polling = false;
  uv_close((uv_handle_t *)&z->poll, NULL);
}

void td__zap_close(td__zap_t **self_p) {
  td__zap_t *z = *self_p;
  if (z == NULL)
    return;
  *self_p = NULL;
  if (z->sock != NULL)
    zmq_close(z->sock);
  free(z);
}
