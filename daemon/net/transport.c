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
 * input, and the heartbeat drains it once more as a safety net (the reading
 * is transport_recv.c's). Each link also measures its goodput from update
 * acknowledgements for the codec budgets, and its path round-trip time from
 * heartbeat echoes (linkstats.c). Nothing received is trusted: envelopes go
 * through proto/wire.c, then up through the `received` callback given at
 * open (the node's dispatch.c); the transport never calls a part above it by
 * name. The three files share transport_int.h.
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
 * Relay envelope signed by the origin's Ed25519 key (relay.c) and sends it to
 * a reachable member both are connected to, which forwards it unchanged; the
 * target checks the signature against the origin's signing key (bound by its
 * admission record or its own hello) and the frame's sequence number against
 * that origin's replay window before the inner envelope goes up, so a relay
 * can delay or drop what it carries but not alter, invent or replay it. A
 * member relays only what the origin itself handed it, to the target named.
 *
 * Floods and silent connections (inbound.c): the socket monitor on the
 * ROUTER counts every inbound connection against the descriptor shares and
 * sheds the ones over them; the tick closes the long-silent ones. */
#include "daemon/net/transport_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "daemon/net/advertise.h"
#include "daemon/net/inbound.h"
#include "daemon/net/relay.h"
#include "scheduler/pathrtt.h"


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
  td__transport_drain_dealer(p->t, p->l, p->l->sock);
  td__transport_drain_dealer(p->t, p->l, p->l->ctl_sock);
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

void td__link_redial(td__link_t *l) {
  if (l->route != LINK_DIRECT)
    return;
  zmq_disconnect(l->sock, l->endpoint);
  zmq_disconnect(l->ctl_sock, l->endpoint);
  zmq_connect(l->sock, l->endpoint);
  zmq_connect(l->ctl_sock, l->endpoint);
}

uint32_t td__link_refused_out(const td__transport_t *t, const td__link_t *l) {
  return l->peer != 0 ? td__zap_refused_of(t->zap, l->peer) : 0;
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
void td__transport_note_reverse(td__transport_t *t, uint64_t peer, const zmq_msg_t *rid) {
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
int td__transport_send_frame(td__transport_t *t, td__link_t *l, bool control,
                             const uint8_t *buf, size_t len) {
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
    uint8_t *out;
    size_t out_len;
    if (td__relay_wrap(t->relays, td__access_admission(t->access), t->node_id, l->peer, ++t->seq,
                       buf, len, &out, &out_len) != 0)
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
  int rc = td__transport_send_frame(t, l, true, buf, len);
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
    if (td__transport_send_frame(t, l, control, f.frame, f.len) < 0) {
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
  int relays_rc = td__relays_open(&t->relays);
  const char *listen = opts->listen;
  t->zctx = zmq_ctx_new();
  *out = t; /* closed by td__transport_close() whatever happens */
  if (inbound_rc != 0 || relays_rc != 0)
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
    poll_socket(t, t->router, &t->router_poll, td__transport_on_router_readable);
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
        td__transport_send_frame(t, l, true, f.frame, f.len);
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
  td__relays_close(&t->relays);
  if (t->router)
    zmq_close(t->router);
  td__zap_close(&t->zap);
  if (t->zctx)
    zmq_ctx_term(t->zctx);
  free(t);
}
