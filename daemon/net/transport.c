/* transport.c: the links to the peers, and the sockets under them.
 *
 * Threads: loop thread only. The ROUTER socket receives from every peer; one
 * link per peer holds two DEALERs to it, so control traffic (hello,
 * heartbeats, acks, run start/stop) never queues behind a multi-megabyte
 * update in the same ZeroMQ pipe and TCP stream: on a 2 Mbit/s uplink one
 * dense update takes seconds, long enough to get a healthy peer suspected.
 * Update and bulk frames wait in the link's queue (scheduler/linkq.h) and are
 * paced out by its window; the receiver acks every chunk. ZMQ_FD is
 * edge-triggered, so every wake-up drains the socket while ZMQ_EVENTS reports
 * input, and the heartbeat drains it once more as a safety net. Each link
 * also measures its goodput from update acknowledgements (docs/algorithms.md#per-link-budgets-codec-auto)
 * for the codec budgets (scheduler/budget.h), and its path round-trip time
 * from heartbeat echoes (scheduler/pathrtt.h; each heartbeat carries the
 * sender's clock and echoes the peer's last stamp with how long it was held).
 * Nothing received is trusted: envelopes go through proto/wire.c, then up
 * through the `received` callback given at open (the node's dispatch.c);
 * the transport never calls a part above it by name.
 *
 * --link-delay-ms (an emulated WAN) holds every outgoing frame that long:
 * update and bulk frames in their link queue, control frames in its control
 * class, which the pump sends on the control connection as soon as they are
 * due (they never wait on the window), so acks and heartbeats cross the
 * emulated latency too. At shutdown the control frames still held go at once
 * (a leave must not be lost to the delay).
 *
 * Security (access.c): by default every socket speaks CURVE. The ROUTER is a
 * CURVE server whose ZAP handler (zap.c) admits listed keys only; a link's
 * DEALERs are CURVE clients that authenticate the peer's own key, so a link
 * to node X reaches X or nothing, wherever its endpoint points. A message's
 * sender is the key libzmq authenticated on its connection (the User-Id the
 * ZAP handler set), not the envelope's sender field, which is overwritten.
 *
 * Nodes that accept no connections (--listen none): such a node binds no
 * ROUTER; its links' DEALERs connect out as usual and are also read, since a
 * reachable member answers over the connection the node opened (its ROUTER
 * sends to the routing id that node's frames came with: a REVERSE link). Two
 * such nodes cannot reach each other: a RELAYED link wraps each frame in a
 * Relay envelope signed by the origin's Ed25519 key and sends it to a
 * reachable member both are connected to, which forwards it unchanged; the
 * target checks the signature against the origin's signing key (bound by its
 * admission record or its own hello) before the inner envelope goes up, so a
 * relay can delay or drop what it carries but not alter or invent it. A
 * member relays only what the origin itself handed it, to the target named.
 *
 * Floods and silent connections (inbound.c): the socket monitor on the
 * ROUTER counts every inbound connection against the descriptor shares and
 * sheds the ones over them; the tick closes the long-silent ones. */
#include "daemon/net/net.h"
#include "daemon/net/joinprobe.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sodium.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "daemon/net/advertise.h"
#include "daemon/net/inbound.h"
#include "scheduler/budget.h"
#include "scheduler/pathrtt.h"

#define MAX_LINKS TD_MEMBERS_MAX
/* libzmq refuses larger frames before allocating (our own limit is lower). */
#define ZMQ_MAX_FRAME_BYTES (16 << 20)
#define LINK_SNDHWM_FRAMES 4000
#define ROUTER_RCVHWM_FRAMES 20000
/* libzmq's default is 30 s: a connection that says nothing is closed sooner
 * (joinprobe.h: a joining node's probe uses the same bound). */
#define HANDSHAKE_TIMEOUT_MS TD__HANDSHAKE_TIMEOUT_MS

/* How a link reaches its peer. */
typedef enum {
  LINK_CLOSED = 0, /* a free slot (its key was revoked) */
  LINK_DIRECT,     /* our DEALERs dial the peer's ROUTER */
  LINK_REVERSE,    /* the peer accepts no connections: our ROUTER answers on its own */
  LINK_RELAYED,    /* neither side accepts connections: through a reachable member */
} link_route_t;

/* A DEALER read by a node without a ROUTER (heap: uv_close frees it). */
typedef struct {
  uv_poll_t h;
  struct td__transport *t;
  struct td__link *l;
} dealer_poll_t;

/* The routing id of the last frame an authenticated peer sent to our ROUTER:
 * what a REVERSE link sends back on. */
typedef struct {
  uint64_t peer;
  uint8_t rid[256];
  size_t rid_len;
} reverse_id_t;

typedef struct {
  double sent_at; /* mono seconds; 0 when acked or never sent */
  uint64_t round, bytes;
  char codec[32];
} pending_update_t;

struct td__link {
  uint64_t peer; /* 0 until the node behind `endpoint` introduced itself */
  char endpoint[TD_ENDPOINT_MAX];
  void *sock;     /* update chunks and bulk, paced by q */
  void *ctl_sock; /* everything else */
  td_linkq_t *q;
  uint64_t bytes_sent, bytes_recv, msgs_sent, msgs_recv, send_drops;
  /* updates only: bytes on the wire and the dense fp32 bytes they stand for */
  uint64_t update_wire_sent, update_dense_sent, update_wire_recv, update_dense_recv;
  char codec[32];
  double goodput_bps, ack_s, budget;
  pending_update_t pending[2]; /* updates awaiting their ack, by round % 2 */
  td_pathrtt_t path;           /* path RTT from heartbeat echoes */
  char advertised[TD_ENDPOINT_MAX]; /* what we tell this peer to dial; "" = not chosen yet */
  bool advertise_refused;           /* only loopback to offer a peer off loopback */
  uint64_t echo_us;            /* the peer's last heartbeat stamp (0: none yet) */
  double echo_heard_at;        /* when it came, mono seconds */
  double reply_tokens, reply_at; /* td__link_take_reply's bucket; reply_at 0: full */
  bool reply_owed;
  link_route_t route;
  dealer_poll_t *polls[2]; /* --listen none: sock's and ctl_sock's input */
  uint64_t via;            /* RELAYED: the member that carried the last frame */
};

struct td__transport {
  uv_loop_t *loop;
  uint64_t node_id;
  td_members_t *members; /* borrowed: who is reachable (NULL until set) */
  td__drops_t *drops;    /* borrowed */
  td__transport_events_t events;
  uint64_t run_bytes_sent; /* every frame but control, since open */
  void *zctx, *router;
  td__access_t *access;
  td__zap_t *zap; /* NULL when insecure */
  uv_poll_t router_poll;
  uv_timer_t pump_timer; /* next time a queued frame becomes sendable */
  double link_delay_s;
  /* --uplink-kbit: the queued frames of all links share this many bits per
   * second, like a shaped uplink (0: no cap); uplink_free_s is when the
   * emulated wire is free for the next frame. */
  double uplink_bps, uplink_free_s;
  size_t pump_turn; /* the link the pump timer serves first */
  bool stopped;
  uint64_t seq;
  char endpoint[TD_ENDPOINT_MAX];        /* advertised by default (status, endpoint file) */
  char listen_endpoint[TD_ENDPOINT_MAX]; /* what the router is bound to */
  bool advertise_by_route; /* wildcard bound, no --advertise: per peer, by route */
  td__link_t links[MAX_LINKS];
  size_t n_links;
  td__inbound_t *inbound; /* the peer port's inbound connections, under their shares */
  bool no_inbound;        /* --listen none: no ROUTER at all */
  reverse_id_t reverse[MAX_LINKS];
  size_t n_reverse;
  uint64_t relayed_out, relayed_in, relay_forwarded; /* frames, for status */
};

static void drain_dealer(td__transport_t *t, td__link_t *l, void *sock);

const char *td__transport_endpoint(const td__transport_t *t) { return t->endpoint; }
const char *td__transport_listen_endpoint(const td__transport_t *t) { return t->listen_endpoint; }

void td__transport_set_advertise(td__transport_t *t, const char *advertise) {
  snprintf(t->endpoint, sizeof t->endpoint, "%s", advertise);
  t->advertise_by_route = false;
}

int td__transport_advertise_to(const td__transport_t *t, const char *peer_endpoint, char *out,
                               size_t cap, char *why, size_t why_len) {
  char host[TD_ENDPOINT_MAX], port[16];
  if (t->no_inbound || strcmp(peer_endpoint, TD_LISTEN_NONE) == 0) {
    /* nothing to route to (ours or the peer's side has no address) */
    snprintf(out, cap, "%s", t->endpoint);
    return 0;
  }
  if (!t->advertise_by_route ||
      !td_advertise_split(t->listen_endpoint, host, sizeof host, port, sizeof port) ||
      td_advertise_route(peer_endpoint, port, out, cap) != 0)
    snprintf(out, cap, "%s", t->endpoint); /* fixed, or no route: the default */
  if (td_advertise_is_loopback(out) && !td_advertise_is_loopback(peer_endpoint))
    return td_why(why, why_len, TD_ECONFIG,
                  "this node would advertise %s to the peer at %s, which cannot reach this "
                  "machine's loopback: start traind with --advertise tcp://HOST:PORT (an "
                  "address of this machine that peer can dial) or --listen on such an address",
                  out, peer_endpoint);
  return 0;
}

const char *td__link_advertised(td__transport_t *t, td__link_t *l) {
  if (l->advertised[0] == '\0' && !l->advertise_refused) {
    char why[512];
    if (td__transport_advertise_to(t, l->endpoint, l->advertised, sizeof l->advertised, why,
                                   sizeof why) != 0) {
      l->advertise_refused = true;
      td_log_warn("not greeting %s: %s", l->endpoint, why);
    } else if (strcmp(l->advertised, t->endpoint) != 0) {
      td_log_info("advertising %s to the peer at %s", l->advertised, l->endpoint);
    }
  }
  return l->advertise_refused ? NULL : l->advertised;
}
size_t td__transport_count(const td__transport_t *t) { return t->n_links; }
td__link_t *td__transport_at(td__transport_t *t, size_t i) { return &t->links[i]; }
uint64_t td__link_peer(const td__link_t *l) { return l->peer; }

td__link_t *td__link_find(td__transport_t *t, uint64_t peer) {
  if (peer == 0)
    return NULL;
  for (size_t i = 0; i < t->n_links; i++)
    if (t->links[i].peer == peer)
      return &t->links[i];
  return NULL;
}

td__link_t *td__link_by_endpoint(td__transport_t *t, const char *endpoint) {
  td__link_t *l = NULL;
  for (size_t i = 0; i < t->n_links; i++)
    if (strcmp(t->links[i].endpoint, endpoint) == 0)
      l = &t->links[i];
  return l;
}

static void *open_dealer(td__transport_t *t, const char *endpoint, const char *server_key) {
  void *s = zmq_socket(t->zctx, ZMQ_DEALER);
  if (s == NULL)
    return NULL;
  int linger = 0, hwm = LINK_SNDHWM_FRAMES;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  /* pings keep an idle link's connections from looking abandoned to the
   * peer (inbound.c closes silent ones); a late pong is no reason to drop the connection */
  int ping_ms = (int)(TD__IDLE_CLOSE_MIN_S * 1000 / 4),
      pong_ms = (int)(TD__IDLE_CLOSE_MIN_S * 1000 * 4);
  zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ping_ms, sizeof ping_ms);
  zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &pong_ms, sizeof pong_ms);
  if (server_key[0] != '\0') {
    const td_keypair_t *kp = td__access_keypair(t->access);
    if (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, TD_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, kp->pub, TD_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, kp->secret, TD_KEY_Z85_LEN + 1) != 0) {
      td_log_warn("cannot set the CURVE keys of a link to %s: %s", endpoint,
                  zmq_strerror(zmq_errno()));
      zmq_close(s);
      return NULL;
    }
  }
  if (zmq_connect(s, endpoint) != 0) {
    td_log_warn("cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
    zmq_close(s);
    return NULL;
  }
  return s;
}

static void free_dealer_poll(uv_handle_t *h) { free(h->data); }

/* --listen none: read what the peer answers on our own connections. */
static void on_dealer_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  dealer_poll_t *p = h->data;
  drain_dealer(p->t, p->l, p->l->sock);
  drain_dealer(p->t, p->l, p->l->ctl_sock);
}

static void watch_dealers(td__transport_t *t, td__link_t *l) {
  void *socks[2] = {l->sock, l->ctl_sock};
  for (int i = 0; i < 2; i++) {
    int fd;
    size_t sz = sizeof fd;
    dealer_poll_t *p = calloc(1, sizeof *p);
    if (p == NULL || zmq_getsockopt(socks[i], ZMQ_FD, &fd, &sz) != 0) {
      free(p);
      continue; /* the tick still drains it */
    }
    *p = (dealer_poll_t){.t = t, .l = l};
    uv_poll_init(t->loop, &p->h, fd);
    p->h.data = p;
    uv_poll_start(&p->h, UV_READABLE, on_dealer_readable);
    l->polls[i] = p;
  }
}

/* Close a link's sockets and their watchers (the queue stays). */
static void close_link_sockets(td__link_t *l) {
  for (int i = 0; i < 2; i++)
    if (l->polls[i] != NULL) {
      uv_poll_stop(&l->polls[i]->h);
      uv_close((uv_handle_t *)&l->polls[i]->h, free_dealer_poll);
      l->polls[i] = NULL;
    }
  if (l->sock != NULL)
    zmq_close(l->sock);
  if (l->ctl_sock != NULL)
    zmq_close(l->ctl_sock);
  l->sock = l->ctl_sock = NULL;
}

/* Route `l` to `endpoint`: dial it, or (TD_LISTEN_NONE) answer on the peer's
 * connections or relay. False when the sockets cannot be made. */
static bool route_link(td__transport_t *t, td__link_t *l, const char *endpoint, const char *key) {
  close_link_sockets(l);
  snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
  if (strcmp(endpoint, TD_LISTEN_NONE) == 0) {
    l->route = t->no_inbound ? LINK_RELAYED : LINK_REVERSE;
    return true;
  }
  l->sock = open_dealer(t, endpoint, key ? key : "");
  l->ctl_sock = l->sock != NULL ? open_dealer(t, endpoint, key ? key : "") : NULL;
  if (l->ctl_sock == NULL) {
    close_link_sockets(l);
    l->route = LINK_CLOSED;
    return false;
  }
  l->route = LINK_DIRECT;
  if (t->no_inbound)
    watch_dealers(t, l);
  return true;
}

td__link_t *td__link_ensure(td__transport_t *t, uint64_t peer, const char *endpoint) {
  if (peer == t->node_id)
    return NULL;
  bool secure = td__access_secure(t->access);
  const char *key = td__access_key_of(t->access, peer);
  if (secure && key == NULL)
    return NULL; /* no link to a node whose key this node has not admitted */
  td__link_t *l = td__link_find(t, peer);
  if (l == NULL && endpoint != NULL && !secure) /* links opened by endpoint: insecure only */
    for (size_t i = 0; i < t->n_links; i++)
      if (t->links[i].peer == 0 && t->links[i].route != LINK_CLOSED &&
          strcmp(t->links[i].endpoint, endpoint) == 0) {
        l = &t->links[i];
        l->peer = peer;
      }
  if (l != NULL) {
    if (endpoint != NULL && endpoint[0] && strcmp(l->endpoint, endpoint) != 0) {
      /* the peer restarted elsewhere, or with(out) inbound connections */
      if (l->route == LINK_DIRECT && strcmp(endpoint, TD_LISTEN_NONE) != 0) {
        zmq_disconnect(l->sock, l->endpoint);
        zmq_disconnect(l->ctl_sock, l->endpoint);
        snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
        zmq_connect(l->sock, l->endpoint);
        zmq_connect(l->ctl_sock, l->endpoint);
      } else if (!route_link(t, l, endpoint, key)) {
        td_log_warn("cannot reach %016" PRIx64 " at %s", peer, endpoint);
      }
      l->advertised[0] = '\0'; /* another address may route to it */
      l->advertise_refused = false;
    }
    return l;
  }
  size_t slot = t->n_links;
  for (size_t i = 0; i < t->n_links; i++)
    if (t->links[i].route == LINK_CLOSED) /* closed when its key was revoked */
      slot = i;
  if (endpoint == NULL || endpoint[0] == '\0' || slot >= MAX_LINKS)
    return NULL;
  td__link_t fresh = {.peer = peer};
  td_linkq_opts_t qo = {.delay_s = t->link_delay_s};
  if (!route_link(t, &fresh, endpoint, key))
    return NULL;
  if (td_linkq_open(&fresh.q, &qo) != 0) {
    close_link_sockets(&fresh);
    return NULL;
  }
  l = &t->links[slot];
  if (slot == t->n_links)
    t->n_links++;
  else /* a revoked link's slot: its queue holds nothing for the new peer */
    td_linkq_close(&l->q);
  *l = fresh;
  for (int i = 0; i < 2; i++) /* the watchers point at the slot, not the local copy */
    if (l->polls[i] != NULL)
      l->polls[i]->l = l;
  td_log_debug("link to %016" PRIx64 " at %s", peer, endpoint);
  return l;
}

static const reverse_id_t *reverse_of(const td__transport_t *t, uint64_t peer) {
  for (size_t i = 0; i < t->n_reverse; i++)
    if (t->reverse[i].peer == peer)
      return &t->reverse[i];
  return NULL;
}

/* Remember the routing id an authenticated peer's frame came with. */
static void note_reverse(td__transport_t *t, uint64_t peer, const zmq_msg_t *rid) {
  size_t len = zmq_msg_size((zmq_msg_t *)rid);
  if (len == 0 || len > sizeof t->reverse[0].rid)
    return;
  reverse_id_t *r = (reverse_id_t *)reverse_of(t, peer);
  if (r == NULL) {
    if (t->n_reverse < MAX_LINKS)
      r = &t->reverse[t->n_reverse++];
    else /* full: the slot of a peer we no longer link to */
      for (size_t i = 0; i < t->n_reverse && r == NULL; i++)
        if (td__link_find(t, t->reverse[i].peer) == NULL)
          r = &t->reverse[i];
    if (r == NULL)
      return;
  }
  r->peer = peer;
  memcpy(r->rid, zmq_msg_data((zmq_msg_t *)rid), len);
  r->rid_len = len;
}

/* The digest a relayed frame's signature covers. */
static void relay_digest(uint64_t origin, uint64_t target, const uint8_t *inner, size_t len,
                         uint8_t out[crypto_generichash_BYTES]) {
  static const char label[] = "traind-relay1";
  uint8_t ids[16];
  for (int i = 0; i < 8; i++) {
    ids[i] = (uint8_t)(origin >> (56 - 8 * i));
    ids[8 + i] = (uint8_t)(target >> (56 - 8 * i));
  }
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
  crypto_generichash_update(&st, ids, sizeof ids);
  crypto_generichash_update(&st, inner, len);
  crypto_generichash_final(&st, out, crypto_generichash_BYTES);
}

/* The member a RELAYED link goes through: the one used last while it stays
 * reachable, else the first reachable member we dial directly. */
static td__link_t *relay_for(td__transport_t *t, td__link_t *l) {
  td__link_t *v = l->via != 0 ? td__link_find(t, l->via) : NULL;
  if (t->members == NULL)
    return NULL;
  if (v != NULL && v->route == LINK_DIRECT && td_members_reachable(t->members, v->peer))
    return v;
  for (size_t i = 0; i < t->n_links; i++) {
    v = &t->links[i];
    if (v->route == LINK_DIRECT && v->peer != 0 &&
        td_members_reachable(t->members, v->peer)) {
      l->via = v->peer;
      return v;
    }
  }
  return NULL;
}

/* Send one packed frame (its sender and seq stamped) to l's peer by l's
 * route; -1 when it cannot go now. */
static int send_frame(td__transport_t *t, td__link_t *l, bool control, const uint8_t *buf,
                      size_t len) {
  switch (l->route) {
  case LINK_DIRECT:
    return zmq_send(control ? l->ctl_sock : l->sock, buf, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
  case LINK_REVERSE: {
    const reverse_id_t *r = reverse_of(t, l->peer);
    if (r == NULL || t->router == NULL ||
        zmq_send(t->router, r->rid, r->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
      return -1;
    return zmq_send(t->router, buf, len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
  }
  case LINK_RELAYED: {
    td__link_t *v = relay_for(t, l);
    if (v == NULL || l->peer == 0 || len > TD_WIRE_MAX_RELAYED)
      return -1;
    uint8_t digest[crypto_generichash_BYTES], sig[TD__SIGNATURE_BYTES];
    relay_digest(t->node_id, l->peer, buf, len, digest);
    td__admission_sign_message(td__access_admission(t->access), digest, sizeof digest, sig);
    Traind__Relay relay = TRAIND__RELAY__INIT;
    relay.origin = t->node_id;
    relay.target = l->peer;
    relay.inner = (ProtobufCBinaryData){.len = len, .data = (uint8_t *)buf};
    relay.signature = (ProtobufCBinaryData){.len = sizeof sig, .data = sig};
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_RELAY;
    env.relay = &relay;
    env.sender = t->node_id;
    env.seq = ++t->seq;
    uint8_t *out;
    size_t out_len;
    if (td_wire_pack(&env, &out, &out_len) != 0)
      return -1;
    int rc = zmq_send(control ? v->ctl_sock : v->sock, out, out_len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
    free(out);
    t->relayed_out += rc == 0;
    return rc;
  }
  case LINK_CLOSED:
  default:
    return -1;
  }
}

int td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env) {
  uint8_t *buf;
  size_t len;
  if (l->route == LINK_CLOSED)
    return TD_EINVAL;
  env->sender = t->node_id;
  env->seq = ++t->seq;
  if (td_wire_pack(env, &buf, &len) != 0)
    return TD_EPROTO;
  if (t->link_delay_s > 0 && !t->stopped) { /* held like the updates; the pump sends it */
    if (td_linkq_push(l->q, TD_PRIO_CONTROL, buf, len, false, td_clock_mono_s()) == 0) {
      l->send_drops++;
      return TD_ENOMEM;
    }
    td__link_pump(t, l);
    return 0;
  }
  int rc = send_frame(t, l, true, buf, len);
  free(buf);
  if (rc < 0) {
    l->send_drops++;
    return TD_EIO;
  }
  l->bytes_sent += len;
  l->msgs_sent++;
  return 0;
}

/* Acks: TD__ACK_UPDATE for a complete update (round, message bytes),
 * TD__ACK_CHUNK for every chunk (its Envelope.seq), which opens the
 * sender's window. */
int td__link_send_ack(td__transport_t *t, uint64_t peer, uint64_t run_id, td__ack_kind_t kind,
                      uint64_t seq, uint64_t bytes) {
  td__link_t *l = td__link_find(t, peer);
  if (l == NULL)
    return TD_EINVAL;
  Traind__Ack ack = TRAIND__ACK__INIT;
  ack.ack_seq = seq;
  ack.bytes = bytes;
  ack.kind = (uint32_t)kind;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ACK;
  env.ack = &ack;
  env.run_id = run_id;
  return td__link_send(t, l, &env);
}

void td__transport_broadcast(td__transport_t *t, Traind__Envelope *env) {
  for (size_t i = 0; i < t->n_links; i++)
    if (t->links[i].peer != 0 && td_members_reachable(t->members, t->links[i].peer))
      td__link_send(t, &t->links[i], env);
}

double td__transport_uplink(td__transport_t *t) {
  double sum = 0;
  for (size_t i = 0; i < t->n_links; i++)
    if (t->links[i].peer != 0 && td_members_reachable(t->members, t->links[i].peer) &&
        t->links[i].goodput_bps > 0)
      sum += t->links[i].goodput_bps;
  return sum;
}

uint64_t td__link_reserve(td__link_t *l, size_t count) { return td_linkq_reserve(l->q, count); }

void td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len, uint64_t seq) {
  if (td_linkq_push_seq(l->q, prio, frame, len, true, td_clock_mono_s(), seq) == 0)
    l->send_drops++; /* refused (out of memory) */
}

void td__link_drop_class(td__link_t *l, td_prio_t prio) { td_linkq_drop_class(l->q, prio); }

void td__link_restart(td__transport_t *t, td__link_t *l) {
  td_linkq_expire(l->q, td_clock_mono_s() + 1.0, 0); /* every frame in flight */
  td_linkq_drop_class(l->q, TD_PRIO_UPDATE);
  td_linkq_drop_class(l->q, TD_PRIO_BULK);
  td__link_pump(t, l);
}

void td__transport_drop_run_traffic(td__transport_t *t) {
  for (size_t i = 0; i < t->n_links; i++) {
    td_linkq_drop_class(t->links[i].q, TD_PRIO_UPDATE);
    td_linkq_drop_class(t->links[i].q, TD_PRIO_BULK);
  }
}

static void on_pump_timer(uv_timer_t *timer) {
  td__transport_t *t = timer->data;
  /* Under an uplink cap one timer lets about one frame out: start at the
   * next link each time so every link gets its turn on the shared wire. */
  size_t first = t->n_links > 0 ? t->pump_turn++ % t->n_links : 0;
  for (size_t i = 0; i < t->n_links; i++)
    td__link_pump(t, &t->links[(first + i) % t->n_links]);
}

/* Arm the pump timer for the earliest frame that waits on time (delay). */
static void arm_pump(td__transport_t *t) {
  double next = INFINITY;
  for (size_t i = 0; i < t->n_links; i++)
    next = fmin(next, td_linkq_next_ready(t->links[i].q));
  if (isfinite(next) && t->uplink_bps > 0)
    next = fmax(next, t->uplink_free_s); /* nothing leaves before the wire is free */
  if (isfinite(next) && !t->stopped) {
    double ms = ceil((next - td_clock_mono_s()) * 1e3);
    uv_timer_start(&t->pump_timer, on_pump_timer, ms > 1 ? (uint64_t)ms : 1, 0);
  }
}

void td__link_pump(td__transport_t *t, td__link_t *l) {
  td_linkq_frame_t f;
  double now = td_clock_mono_s();
  if (l->route == LINK_CLOSED)
    return;
  while ((t->uplink_bps <= 0 || now >= t->uplink_free_s) && td_linkq_pop(l->q, now, &f)) {
    if (t->uplink_bps > 0)
      t->uplink_free_s = fmax(now, t->uplink_free_s) + (double)f.len * 8.0 / t->uplink_bps;
    bool control = f.prio == TD_PRIO_CONTROL; /* held by --link-delay-ms */
    if (send_frame(t, l, control, f.frame, f.len) < 0) {
      l->send_drops++; /* counted; its window share comes back at expiry */
    } else {
      l->bytes_sent += f.len;
      l->msgs_sent++;
      if (!control)
        t->run_bytes_sent += f.len;
    }
    free(f.frame);
  }
  arm_pump(t);
}

void td__link_chunk_acked(td__transport_t *t, td__link_t *l, uint64_t seq) {
  if (td_linkq_ack(l->q, seq, td_clock_mono_s()))
    td__link_pump(t, l);
}

void td__link_close_peer(td__transport_t *t, uint64_t peer) {
  td__link_t *l = td__link_find(t, peer);
  if (l == NULL)
    return;
  close_link_sockets(l);
  td_linkq_drop_class(l->q, TD_PRIO_CONTROL);
  td_linkq_drop_class(l->q, TD_PRIO_UPDATE);
  td_linkq_drop_class(l->q, TD_PRIO_BULK);
  /* the slot is reused by the next new link; until then its empty queue
   * keeps the loops over all links simple */
  td_linkq_t *q = l->q;
  *l = (td__link_t){.q = q};
}

void td__link_note_recv(td__link_t *l, uint64_t bytes) { l->bytes_recv += bytes; }

void td__link_note_update_recv(td__link_t *l, uint64_t wire, uint64_t dense) {
  l->update_wire_recv += wire;
  l->update_dense_recv += dense;
}

void td__link_note_update_sent(td__link_t *l, uint64_t round, uint64_t wire, uint64_t dense,
                               const char *codec) {
  l->update_wire_sent += wire;
  l->update_dense_sent += dense;
  snprintf(l->codec, sizeof l->codec, "%s", codec);
  pending_update_t *p = &l->pending[round % 2];
  p->round = round;
  p->bytes = wire;
  p->sent_at = td_clock_mono_s();
  snprintf(p->codec, sizeof p->codec, "%s", codec);
}

double td__link_fit_budget(td__link_t *l, uint64_t round, double compute_s, double min_s) {
  /* the update two rounds back still unacknowledged (its slot is about to be
   * reused) caps the estimate at what the link delivered since */
  const pending_update_t *old = &l->pending[round % 2];
  double since = old->sent_at > 0 ? td_clock_mono_s() - old->sent_at : 0;
  l->goodput_bps = td_budget_goodput_unacked(l->goodput_bps, old->bytes, since);
  if (!(l->goodput_bps > 0))
    return 0;
  l->budget = td_budget_link_bytes(l->goodput_bps, compute_s, min_s);
  return l->budget;
}

bool td__link_update_acked(td__link_t *l, uint64_t round, uint64_t bytes, td_ledger_link_t *row,
                           char *codec, size_t codec_len) {
  pending_update_t *p = &l->pending[round % 2];
  if (round != p->round || p->sent_at <= 0 || bytes != p->bytes)
    return false; /* stale, duplicate or forged: nothing to learn */
  double dt = td_clock_mono_s() - p->sent_at;
  p->sent_at = 0;
  if (!(dt > 0))
    return false;
  l->ack_s = dt;
  l->goodput_bps = td_budget_goodput_acked(l->goodput_bps, (double)bytes, dt, l->budget);
  td_linkq_stats_t qs;
  td_linkq_stats(l->q, &qs);
  *row = (td_ledger_link_t){.round = round, .peer = l->peer, .at = td_clock_wall_s(),
                            .goodput_bps = l->goodput_bps,
                            .rtt_ms = qs.rtt_s > 0 ? qs.rtt_s * 1e3 : NAN,
                            .budget_bytes = l->budget, .window_bytes = qs.window,
                            .bytes_sent = bytes};
  snprintf(codec, codec_len, "%s", p->codec);
  return true;
}

/* Heartbeat stamps are monotonic microseconds: 0 means none. */
static uint64_t mono_us(double s) { return s > 0 ? (uint64_t)(s * 1e6) : 0; }

void td__link_echo_out(td__link_t *l, uint64_t *stamp_us, uint64_t *echo_us, uint64_t *hold_us) {
  double now = td_clock_mono_s();
  *stamp_us = mono_us(now);
  *echo_us = l->echo_us;
  *hold_us = l->echo_us != 0 ? mono_us(now - l->echo_heard_at) : 0;
}

void td__link_echo_in(td__link_t *l, uint64_t stamp_us, uint64_t echo_us, uint64_t hold_us) {
  double now = td_clock_mono_s();
  l->echo_us = stamp_us; /* the peer's own clock: echoed back as it is, never read */
  l->echo_heard_at = now;
  /* an echo of our stamp (under a minute old) is an RTT sample */
  td_pathrtt_sample(&l->path, td_pathrtt_echo(mono_us(now), echo_us, hold_us, 60000000u), now);
}

void td__link_stats(td__link_t *l, td__link_stats_t *out) {
  *out = (td__link_stats_t){.bytes_sent = l->bytes_sent, .bytes_recv = l->bytes_recv,
                            .send_drops = l->send_drops,
                            .update_wire_sent = l->update_wire_sent,
                            .update_dense_sent = l->update_dense_sent,
                            .update_wire_recv = l->update_wire_recv,
                            .update_dense_recv = l->update_dense_recv,
                            .codec = l->codec[0] ? l->codec : "-",
                            .goodput_bps = l->goodput_bps, .ack_s = l->ack_s,
                            .budget_bytes = l->budget, .path_rtt_s = td_pathrtt(&l->path),
                            .route = l->route == LINK_REVERSE   ? "inbound"
                                     : l->route == LINK_RELAYED ? "relayed"
                                                                : "direct",
                            .via = l->route == LINK_RELAYED ? l->via : 0};
  td_linkq_stats(l->q, &out->q);
}

bool td__link_take_reply(td__link_t *l, double per_s, double burst) {
  double now = td_clock_mono_s();
  if (l->reply_at <= 0)
    l->reply_tokens = burst;
  else
    l->reply_tokens = fmin(burst, l->reply_tokens + (now - l->reply_at) * per_s);
  l->reply_at = now;
  if (l->reply_tokens < 1.0)
    return false;
  l->reply_tokens -= 1.0;
  return true;
}

void td__link_set_reply_owed(td__link_t *l, bool owed) { l->reply_owed = owed; }
bool td__link_reply_owed(const td__link_t *l) { return l->reply_owed; }

void td__transport_relay_stats(const td__transport_t *t, uint64_t *out, uint64_t *in,
                               uint64_t *forwarded) {
  *out = t->relayed_out;
  *in = t->relayed_in;
  *forwarded = t->relay_forwarded;
}

const td__descriptors_t *td__transport_descriptors(const td__transport_t *t) {
  return td__inbound_shares(t->inbound);
}

void td__transport_inbound_stats(const td__transport_t *t, td__inbound_stats_t *out) {
  td__inbound_stats(t->inbound, out);
  out->handshake_limited = td__zap_limited(t->zap);
}


/* ---- receiving --------------------------------------------------------------------- */

/* A connection an invite's one-time key authenticated carries one join
 * request and nothing else; the answer goes back on it (routing id `rid`). */
static void on_invite_frame(td__transport_t *t, const Traind__Envelope *env, const char *user_id,
                            const zmq_msg_t *rid) {
  uint8_t key[TD_KEY_BYTES];
  const char *z85 = user_id + strlen(TD__INVITE_USER_ID);
  if (strlen(z85) != TD_KEY_Z85_LEN || zmq_z85_decode(key, z85) == NULL ||
      env->body_case != TRAIND__ENVELOPE__BODY_JOIN_REQUEST || t->events.invite == NULL) {
    td__drop(t->drops, TD__DROP_UNKNOWN_KEY, "a message other than a join request on an "
             "invite's connection");
    return;
  }
  td__invite_reply_t reply = {.transport = t, .rid = zmq_msg_data((zmq_msg_t *)rid),
                              .rid_len = zmq_msg_size((zmq_msg_t *)rid)};
  t->events.invite(t->events.user, key, env, &reply);
}

int td__transport_reply(td__invite_reply_t *reply, Traind__Envelope *env) {
  td__transport_t *t = reply->transport;
  uint8_t *buf;
  size_t len;
  env->sender = t->node_id;
  env->seq = ++t->seq;
  if (td_wire_pack(env, &buf, &len) != 0)
    return TD_EPROTO;
  int rc = zmq_send(t->router, reply->rid, reply->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
                   zmq_send(t->router, buf, len, ZMQ_DONTWAIT) < 0
               ? TD_EIO
               : 0;
  free(buf);
  return rc;
}

__attribute__((format(printf, 2, 3))) static void relay_drop(td__transport_t *t,
                                                              const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  td__drop(t->drops, TD__DROP_BAD_RELAY, what);
}

/* A member passes on what a node without inbound connections hands it for
 * another such node (the origin must be the sender: nobody relays for a third
 * party). The outer envelope is stamped as ours; the inner bytes and the
 * origin's signature go on unchanged. */
static void forward_relay(td__transport_t *t, Traind__Envelope *env, uint64_t sender) {
  Traind__Relay *r = env->relay;
  td__link_t *to = td__link_find(t, r->target);
  if (r->origin != sender || t->no_inbound || to == NULL || to->route == LINK_RELAYED) {
    relay_drop(t, "a relay request from %016" PRIx64 " for %016" PRIx64 " this node cannot or "
               "may not carry (not the origin, or no link to the target)", sender, r->target);
    return;
  }
  env->sender = t->node_id;
  env->seq = ++t->seq;
  uint8_t *buf;
  size_t len;
  if (td_wire_pack(env, &buf, &len) != 0)
    return;
  if (send_frame(t, to, true, buf, len) == 0)
    t->relay_forwarded++;
  else
    to->send_drops++;
  free(buf);
}

/* A frame relayed to us: it goes up only if its origin's signature holds. */
static void on_relay(td__transport_t *t, Traind__Envelope *env, uint64_t sender) {
  Traind__Relay *r = env->relay;
  if (r->target != t->node_id) {
    forward_relay(t, env, sender);
    return;
  }
  if (td__access_secure(t->access)) {
    const uint8_t *sign = td__access_sign_key_of(t->access, r->origin);
    if (sign == NULL) {
      relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 ": its origin is not "
                 "admitted here or its signing key is not known yet", r->origin, sender);
      return;
    }
    uint8_t digest[crypto_generichash_BYTES];
    relay_digest(r->origin, r->target, r->inner.data, r->inner.len, digest);
    if (crypto_sign_verify_detached(r->signature.data, digest, sizeof digest, sign) != 0) {
      relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 " fails its origin's "
                 "signature (altered on the way): rejected", r->origin, sender);
      return;
    }
  }
  Traind__Envelope *in = NULL;
  td_wire_refusal_t refusal;
  char why[256] = "";
  if (td_wire_unpack_peer(&in, r->inner.data, r->inner.len, &refusal, why, sizeof why) != 0) {
    td__drop(t->drops, TD__DROP_MALFORMED, why);
    return;
  }
  if (in->sender != r->origin || in->body_case == TRAIND__ENVELOPE__BODY_RELAY ||
      in->body_case == TRAIND__ENVELOPE__BODY_JOIN_REQUEST ||
      in->body_case == TRAIND__ENVELOPE__BODY_JOIN_GRANT) {
    relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 " names another sender "
               "or carries what no relay may", r->origin, sender);
    td_wire_free(&in);
    return;
  }
  td__link_t *l = td__link_find(t, r->origin);
  if (l != NULL && l->route == LINK_RELAYED)
    l->via = sender;
  t->relayed_in++;
  t->events.received(t->events.user, in, r->inner.len);
  td_wire_free(&in);
}

static void on_frame(td__transport_t *t, const void *data, size_t len, const char *user_id,
                     const zmq_msg_t *rid) {
  if (len > TD_WIRE_MAX_MESSAGE) {
    td__drop(t->drops, TD__DROP_OVERSIZED, "oversized message");
    return;
  }
  Traind__Envelope *env = NULL;
  td_wire_refusal_t refusal;
  char why[256] = "";
  if (td_wire_unpack_peer(&env, data, len, &refusal, why, sizeof why) != 0) {
    td__drop(t->drops, refusal == TD_WIRE_BAD_VERSION ? TD__DROP_VERSION : TD__DROP_MALFORMED, why);
    return;
  }
  if (user_id != NULL && strncmp(user_id, TD__INVITE_USER_ID, strlen(TD__INVITE_USER_ID)) == 0) {
    on_invite_frame(t, env, user_id, rid);
    td_wire_free(&env);
    return;
  }
  /* the sender is who the connection authenticated, whatever the field says */
  uint64_t sender = td__access_sender(t->access, user_id, env->sender);
  if (sender == 0) {
    td__drop(t->drops, TD__DROP_UNKNOWN_KEY, "message on a connection whose key is not admitted");
    td_wire_free(&env);
    return;
  }
  if (rid != NULL)
    note_reverse(t, sender, rid);
  env->sender = sender;
  if (env->body_case == TRAIND__ENVELOPE__BODY_RELAY)
    on_relay(t, env, sender);
  else
    t->events.received(t->events.user, env, len);
  td_wire_free(&env);
}

/* --listen none: the frames a peer answers on a link's own connection
 * (authenticated as the link's peer by the CURVE handshake we made). */
static void drain_dealer(td__transport_t *t, td__link_t *l, void *sock) {
  while (sock != NULL && (sock == l->sock || sock == l->ctl_sock)) {
    int events = 0;
    size_t sz = sizeof events;
    if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN))
      return;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return;
    }
    if (zmq_msg_more(&msg)) {
      td__drop(t->drops, TD__DROP_MALFORMED, "multi-frame message");
      while (zmq_msg_more(&msg) && zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) >= 0)
        ;
    } else {
      on_frame(t, zmq_msg_data(&msg), zmq_msg_size(&msg),
               td__access_key_of(t->access, l->peer), NULL);
    }
    zmq_msg_close(&msg);
  }
}

/* Drain the ROUTER while ZMQ_EVENTS reports input (ZMQ_FD is edge-triggered). */
static void drain_router(td__transport_t *t) {
  while (t->router != NULL) {
    int events = 0;
    size_t sz = sizeof events;
    if (zmq_getsockopt(t->router, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN))
      return;
    zmq_msg_t id, msg;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, t->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&id);
      return;
    }
    bool more = zmq_msg_more(&id);
    if (!more) {
      zmq_msg_close(&id);
      td__drop(t->drops, TD__DROP_MALFORMED, "message without a routing frame");
      continue;
    }
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, t->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      zmq_msg_close(&id);
      continue;
    }
    bool extra = zmq_msg_more(&msg);
    if (extra) { /* swallow the remaining frames of a multi-frame message */
      while (extra) {
        zmq_msg_t rest;
        zmq_msg_init(&rest);
        if (zmq_msg_recv(&rest, t->router, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&rest);
          break;
        }
        extra = zmq_msg_more(&rest);
        zmq_msg_close(&rest);
      }
      td__drop(t->drops, TD__DROP_MALFORMED, "multi-frame message");
    } else {
      on_frame(t, zmq_msg_data(&msg), zmq_msg_size(&msg), zmq_msg_gets(&msg, "User-Id"), &id);
    }
    zmq_msg_close(&msg);
    zmq_msg_close(&id);
  }
}

static void on_router_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_router(h->data);
}


void td__transport_tick(td__transport_t *t) {
  td__zap_drain(t->zap);
  drain_router(t);
  td__inbound_tick(t->inbound);
  for (size_t i = 0; i < t->n_links && t->no_inbound; i++) { /* ZMQ_FD is edge-triggered */
    drain_dealer(t, &t->links[i], t->links[i].sock);
    drain_dealer(t, &t->links[i], t->links[i].ctl_sock);
  }
  for (size_t i = 0; i < t->n_links; i++) /* acks lost with a dead peer */
    if (td_linkq_expire(t->links[i].q, td_clock_mono_s(), TD__LINK_EXPIRE_S) > 0)
      td__link_pump(t, &t->links[i]);
}

/* ---- start-up and shutdown ----------------------------------------------------------- */

/* The endpoint shown before any peer is known (status, the endpoint file,
 * the log). A wildcard address is no use to peers: each link then gets the
 * address that routes to its peer (td__link_advertised), and this default is
 * the first non-loopback interface, or loopback on a machine without one. */
static void choose_default_advertised(td__transport_t *t) {
  snprintf(t->listen_endpoint, sizeof t->listen_endpoint, "%s", t->endpoint);
  char host[TD_ENDPOINT_MAX], port[16];
  if (!td_advertise_is_wildcard(t->endpoint) ||
      !td_advertise_split(t->endpoint, host, sizeof host, port, sizeof port))
    return;
  t->advertise_by_route = true;
  if (td_advertise_first_interface(port, t->endpoint, sizeof t->endpoint) != 0)
    snprintf(t->endpoint, sizeof t->endpoint, "tcp://127.0.0.1:%s", port);
}

/* tcp://HOST:0 binds an ephemeral port; the real endpoint is read back. */
static int bind_router(td__transport_t *t, const char *listen, char *why, size_t why_len) {
  char ep[TD_ENDPOINT_MAX];
  size_t len = strlen(listen);
  if (strncmp(listen, "tcp://", 6) != 0 || len >= sizeof ep - 1 ||
      strrchr(listen, ':') == listen + 3)
    return td_why(why, why_len, TD_ECONFIG, "--listen: expected tcp://HOST:PORT, got '%s'",
                  listen);
  snprintf(ep, sizeof ep, "%s", listen);
  if (len >= 2 && strcmp(ep + len - 2, ":0") == 0)
    strcpy(ep + len - 1, "*");
  t->router = zmq_socket(t->zctx, ZMQ_ROUTER);
  if (td__access_secure(t->access)) {
    /* the ZAP handler must exist before the first handshake: without one,
     * libzmq would let every CURVE client in */
    int rc = td__zap_open(&t->zap, t->zctx, t->loop, t->access, why, why_len);
    if (rc != 0)
      return rc;
    int server = 1;
    const td_keypair_t *kp = td__access_keypair(t->access);
    if (zmq_setsockopt(t->router, ZMQ_CURVE_SERVER, &server, sizeof server) != 0 ||
        zmq_setsockopt(t->router, ZMQ_CURVE_SECRETKEY, kp->secret, TD_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(t->router, ZMQ_ZAP_DOMAIN, "traind", 6) != 0)
      return td_why(why, why_len, TD_EIO, "cannot make the peer socket a CURVE server: %s",
                    zmq_strerror(zmq_errno()));
  }
  int64_t maxmsg = ZMQ_MAX_FRAME_BYTES;
  int hwm = ROUTER_RCVHWM_FRAMES, linger = 0, handshake_ms = HANDSHAKE_TIMEOUT_MS;
  zmq_setsockopt(t->router, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms);
  zmq_setsockopt(t->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  zmq_setsockopt(t->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(t->router, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(t->router, ep) != 0)
    return td_why(why, why_len, TD_EIO, "cannot listen on %s: %s", listen,
                  zmq_strerror(zmq_errno()));
  size_t sz = sizeof t->endpoint;
  zmq_getsockopt(t->router, ZMQ_LAST_ENDPOINT, t->endpoint, &sz);
  choose_default_advertised(t);
  char host[TD_ENDPOINT_MAX], port[16];
  int listen_port = 0;
  if (td_advertise_split(t->listen_endpoint, host, sizeof host, port, sizeof port))
    listen_port = (int)htons((uint16_t)atoi(port));
  td__inbound_watch(t->inbound, t->zctx, t->router, listen_port);
  return 0;
}

static void poll_socket(td__transport_t *t, void *sock, uv_poll_t *h, uv_poll_cb cb) {
  int fd;
  size_t sz = sizeof fd;
  zmq_getsockopt(sock, ZMQ_FD, &fd, &sz);
  uv_poll_init(t->loop, h, fd);
  h->data = t;
  uv_poll_start(h, UV_READABLE, cb);
}

void td__transport_set_members(td__transport_t *t, td_members_t *members) {
  t->members = members;
}

uint64_t td__transport_run_bytes_sent(const td__transport_t *t) { return t->run_bytes_sent; }

int td__transport_open(td__transport_t **out, const td__transport_opts_t *opts, char *why,
                       size_t why_len) {
  td__transport_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  t->loop = opts->loop;
  t->node_id = opts->node_id;
  t->access = opts->access;
  t->drops = opts->drops;
  t->events = opts->events;
  t->link_delay_s = opts->link_delay_s;
  t->uplink_bps = opts->uplink_bps > 0 ? opts->uplink_bps : 0;
  int inbound_rc =
      td__inbound_open(&t->inbound, t->loop, opts->descriptors, opts->heartbeat_s, t->drops);
  const char *listen = opts->listen;
  t->zctx = zmq_ctx_new();
  *out = t; /* closed by td__transport_close() whatever happens */
  if (inbound_rc != 0)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (strcmp(listen, TD_LISTEN_NONE) == 0) {
    /* no peer port: every connection is one this node opens */
    t->no_inbound = true;
    snprintf(t->endpoint, sizeof t->endpoint, "%s", TD_LISTEN_NONE);
    snprintf(t->listen_endpoint, sizeof t->listen_endpoint, "%s", TD_LISTEN_NONE);
  } else {
    int rc = bind_router(t, listen, why, why_len);
    if (rc != 0)
      return rc;
    poll_socket(t, t->router, &t->router_poll, on_router_readable);
  }
  uv_timer_init(t->loop, &t->pump_timer);
  t->pump_timer.data = t;
  return 0;
}

/* Shutdown: the control frames --link-delay-ms still holds go now. */
static void flush_control(td__transport_t *t) {
  td_linkq_frame_t f;
  double later = td_clock_mono_s() + t->link_delay_s + 1;
  for (size_t i = 0; i < t->n_links; i++) {
    td__link_t *l = &t->links[i];
    while (l->route != LINK_CLOSED && td_linkq_pop(l->q, later, &f)) {
      bool control = f.prio == TD_PRIO_CONTROL;
      if (control)
        send_frame(t, l, true, f.frame, f.len);
      free(f.frame);
      if (!control)
        break; /* the classes below control: not worth sending now */
    }
  }
}

void td__transport_stop(td__transport_t *t) {
  if (t == NULL || t->stopped)
    return;
  if (t->link_delay_s > 0)
    flush_control(t);
  t->stopped = true;
  td__zap_stop(t->zap);
  if (t->router != NULL)
    uv_close((uv_handle_t *)&t->router_poll, NULL);
  for (size_t i = 0; i < t->n_links; i++)
    for (int k = 0; k < 2; k++)
      if (t->links[i].polls[k] != NULL) {
        uv_close((uv_handle_t *)&t->links[i].polls[k]->h, free_dealer_poll);
        t->links[i].polls[k] = NULL;
      }
  td__inbound_stop(t->inbound);
  uv_close((uv_handle_t *)&t->pump_timer, NULL);
}

void td__transport_close(td__transport_t **self_p) {
  td__transport_t *t = *self_p;
  if (t == NULL)
    return;
  *self_p = NULL;
  for (size_t i = 0; i < t->n_links; i++) {
    close_link_sockets(&t->links[i]); /* its watchers were closed at stop */
    td_linkq_close(&t->links[i].q);
  }
  td__inbound_close(&t->inbound); /* its monitor socket, before the context ends */
  if (t->router)
    zmq_close(t->router);
  td__zap_close(&t->zap);
  if (t->zctx)
    zmq_ctx_term(t->zctx);
  free(t);
}
