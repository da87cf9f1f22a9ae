/* transport_recv.c: what comes in on the peer port and the links' own
 * connections. Every readable socket is drained while ZMQ_EVENTS reports
 * input (ZMQ_FD is edge-triggered; the tick drains once more as a safety
 * net). Each frame goes through proto/wire.c; its sender is the key libzmq
 * authenticated on its connection, never the envelope's field. A frame on an
 * invite's one-time key carries a join request and nothing else; a Relay is
 * checked against its origin's signing key and replay window (relay.c) and
 * forwarded only as the origin asked; everything else goes up through the
 * `received` callback given at open. */
#include "daemon/net/transport_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"

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
  if (td__transport_send_frame(t, to, true, buf, len) == 0)
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
  const uint8_t *sign = NULL;
  if (td__access_secure(t->access) &&
      (sign = td__access_sign_key_of(t->access, r->origin)) == NULL) {
    relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 ": its origin is not "
               "admitted here or its signing key is not known yet", r->origin, sender);
    return;
  }
  switch (td__relay_accept(t->relays, r, sign)) {
  case TD__RELAY_FORGED:
    relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 " fails its origin's "
               "signature (altered on the way): rejected", r->origin, sender);
    return;
  case TD__RELAY_REPLAYED:
    relay_drop(t, "a message relayed from %016" PRIx64 " by %016" PRIx64 " repeats one this "
               "node took before or is too old (sequence %" PRIu64 "): a replay, rejected",
               r->origin, sender, r->seq);
    return;
  case TD__RELAY_OK:
    break;
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
    td__transport_note_reverse(t, sender, rid);
  env->sender = sender;
  if (env->body_case == TRAIND__ENVELOPE__BODY_RELAY)
    on_relay(t, env, sender);
  else
    t->events.received(t->events.user, env, len);
  td_wire_free(&env);
}

/* --listen none: the frames a peer answers on a link's own connection
 * (authenticated as the link's peer by the CURVE handshake we made). */
void td__transport_drain_dealer(td__transport_t *t, td__link_t *l, void *sock) {
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

void td__transport_on_router_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_router(h->data);
}


void td__transport_tick(td__transport_t *t) {
  td__zap_drain(t->zap);
  drain_router(t);
  td__inbound_tick(t->inbound);
  for (size_t i = 0; i < t->n_links && t->no_inbound; i++) { /* ZMQ_FD is edge-triggered */
    td__transport_drain_dealer(t, &t->links[i], t->links[i].sock);
    td__transport_drain_dealer(t, &t->links[i], t->links[i].ctl_sock);
  }
  for (size_t i = 0; i < t->n_links; i++) /* acks lost with a dead peer */
    if (td_linkq_expire(t->links[i].q, td_clock_mono_s(), TD__LINK_EXPIRE_S) > 0)
      td__link_pump(t, &t->links[i]);
}
