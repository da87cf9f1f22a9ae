/* control_admit.c: the control commands that change who belongs: `join`,
 * `key`, `allow` and `revoke`.
 *
 * Threads: loop thread. A join answers only once it knows how it went: it
 * watches the handshake (joinprobe.c) and waits for the welcome or a refusal;
 * a failed one takes back the key it admitted. A join by invite first
 * presents the invite on the probe's own connection and applies the signed
 * admissions granted (admit.c), then goes on as a join by key. */
#include "daemon/control_admit.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* A join waits JOIN_TIMEOUT_MS for the welcome of the node it asked, or
 * JOIN_SLOW_TIMEOUT_MS once something there took the connection (it may be
 * there, only slow: valgrind, a loaded machine). Without a welcome after
 * JOIN_PROBE_AFTER_MS, a probe (joinprobe.c) watches the handshake; it is read
 * every JOIN_TICK_MS. */
#define JOIN_TIMEOUT_MS 5000
#define JOIN_SLOW_TIMEOUT_MS 20000
#define JOIN_PROBE_AFTER_MS 300
#define JOIN_TICK_MS 50

void td__control_welcome(td__control_t *ctl, uint64_t peer) {
  conn_t *c = ctl != NULL ? ctl->pending_join : NULL;
  if (c == NULL)
    return;
  ctl->pending_join = NULL;
  uv_timer_stop(&c->wait_timer);
  td__joinprobe_close(&c->probe);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "joined", json_object_new_string(c->join_endpoint));
  json_object_object_add(o, "seed_node", td__json_id(peer));
  json_object_object_add(o, "peers", td__status_peers(ctl->n));
  respond_json(c, o);
}

/* A join that failed answers `msg` and takes back what it did here: the key
 * it admitted and the link to that key's node. */
static void join_failed(conn_t *c, int status, const char *msg) {
  td__node_t *n = c->ctl->n;
  if (c->ctl->pending_join == c)
    c->ctl->pending_join = NULL;
  uv_timer_stop(&c->wait_timer);
  td__joinprobe_close(&c->probe);
  if (c->join_admitted[0] != '\0') {
    uint64_t peer = 0;
    char why[256];
    if (td__access_revoke(n->access, c->join_admitted, &peer, why, sizeof why) == 0)
      td_log_info("join of %s failed: key %s no longer admitted", c->join_endpoint,
                  c->join_admitted);
    c->join_admitted[0] = '\0';
  }
  if (c->join_peer != 0 && td_members_find(n->members, c->join_peer) == NULL)
    td__link_close_peer(n->net, c->join_peer);
  td_log_warn("%s", msg);
  respond(c, status, msg, NULL);
}

void td__control_join_refused(td__control_t *ctl, uint64_t peer, const char *reason) {
  conn_t *c = ctl != NULL ? ctl->pending_join : NULL;
  if (c == NULL || (c->join_peer != 0 && c->join_peer != peer))
    return;
  char msg[512];
  int at = snprintf(msg, sizeof msg, "join refused by %s: ", c->join_endpoint);
  snprintf(msg + at, sizeof msg - (size_t)at, "%.300s", reason);
  for (char *p = msg + at; *p != '\0'; p++) /* a peer's text: one printable line */
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  join_failed(c, TD_EINVAL, msg);
}

/* The answer to a handshake that ran out of time: not a wrong key, a node
 * that is not there, not traind, or too busy to finish it (a join storm). */
static void handshake_timed_out(conn_t *c) {
  char msg[600];
  snprintf(msg, sizeof msg, "join failed: the node at %s did not finish a handshake within "
           "%.1f s (check that traind runs there and is reachable from here, then retry the "
           "join: a busy node may be slow to answer)", c->join_endpoint,
           td__joinprobe_failed_after_s(c->probe));
  join_failed(c, TD_EIO, msg);
}

/* A join by invite, while its request is out: a refused handshake, a
 * grant (then the join goes on as a join by key), or the deadline. */
static void invite_tick(conn_t *c, uint64_t waited) {
  td__node_t *n = c->ctl->n;
  const char *ep = c->join_endpoint;
  char msg[600];
  td__probe_state_t st = td__joinprobe_poll(c->probe);
  if (st == TD__PROBE_NOT_ADMITTED) {
    snprintf(msg, sizeof msg, "join refused by %s: the invite was used already, has expired or "
             "was not made there (ask an admin for a new one: trainctl invite)", ep);
    join_failed(c, TD_EINVAL, msg);
    return;
  }
  if (st == TD__PROBE_KEY_MISMATCH) {
    snprintf(msg, sizeof msg, "join failed: the node at %s does not hold the key the invite "
             "names (is the endpoint right?)", ep);
    join_failed(c, TD_ECONFIG, msg);
    return;
  }
  if (st == TD__PROBE_TIMED_OUT) {
    handshake_timed_out(c);
    return;
  }
  size_t len = 0;
  uint8_t *buf = malloc(TD_WIRE_MAX_MESSAGE);
  bool got = buf != NULL && td__joinprobe_recv(c->probe, buf, TD_WIRE_MAX_MESSAGE, &len) == 0;
  if (got) {
    Traind__Envelope *env = NULL;
    char why[256];
    bool bad = len > TD_WIRE_MAX_MESSAGE || td_wire_unpack(&env, buf, len, why, sizeof why) != 0 ||
               env->body_case != TRAIND__ENVELOPE__BODY_JOIN_GRANT;
    free(buf);
    if (bad) {
      td_wire_free(&env);
      snprintf(msg, sizeof msg, "join failed: %s answered the invite with something else "
               "than a grant", ep);
      join_failed(c, TD_EPROTO, msg);
      return;
    }
    if (env->join_grant->refused != NULL && env->join_grant->refused[0] != '\0') {
      int at = snprintf(msg, sizeof msg, "join refused by %s: ", ep);
      snprintf(msg + at, sizeof msg - (size_t)at, "%.300s", env->join_grant->refused);
      for (char *p = msg + at; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
          *p = '?';
      td_wire_free(&env);
      join_failed(c, TD_EINVAL, msg);
      return;
    }
    size_t applied = td__admit_apply_grant(n, env->join_grant, c->join_peer);
    td_log_info("invite accepted by %s: %zu admission record(s) applied", ep, applied);
    td_wire_free(&env);
    td__joinprobe_close(&c->probe);
    c->join_by_invite = false;
    c->join_probed = false; /* the join by key may probe its own handshake */
    c->join_admitted[0] = '\0'; /* the inviter stays listed: it admitted us */
    c->join_accepted = true; /* it answered: a slow welcome (a join storm) is not a dead node */
    c->join_began_ms = uv_now(&n->loop);
    td__link_t *l = td__link_ensure(n->net, c->join_peer, ep);
    if (l == NULL) {
      join_failed(c, TD_EIO, "cannot open a link to that endpoint");
      return;
    }
    td__gossip_hello(n, l);
    return;
  }
  free(buf);
  if (waited >= JOIN_SLOW_TIMEOUT_MS) {
    snprintf(msg, sizeof msg, "no answer to the invite from %s within %.0f s %s", ep,
             JOIN_SLOW_TIMEOUT_MS / 1000.0,
             td__joinprobe_reached(c->probe) ? "(see that node's log)"
                                             : "(is traind listening there?)");
    join_failed(c, TD_EIO, msg);
  }
}

/* Every JOIN_TICK_MS of a pending join: what the probe saw, then the deadline. */
static void on_join_tick(uv_timer_t *t) {
  conn_t *c = t->data;
  td__node_t *n = c->ctl->n;
  const char *ep = c->join_endpoint;
  char msg[512];
  uint64_t waited = uv_now(t->loop) - c->join_began_ms;
  if (c->join_by_invite) {
    invite_tick(c, waited);
    return;
  }
  if (!c->join_probed && c->join_key[0] != '\0' && waited >= JOIN_PROBE_AFTER_MS) {
    const td_keypair_t *kp = td__access_keypair(n->access);
    c->join_probed = true;
    if (td__joinprobe_open(&c->probe, ep, c->join_key, kp->pub, kp->secret) != 0)
      td_log_warn("cannot watch the handshake with %s: a refusal will show as a timeout", ep);
  }
  td__probe_state_t st = c->probe != NULL ? td__joinprobe_poll(c->probe) : TD__PROBE_PENDING;
  if (st == TD__PROBE_NOT_ADMITTED) {
    snprintf(msg, sizeof msg, "join refused by %s: this node's key is not admitted there "
             "(on that node run: trainctl allow '%s')", ep, td__access_keypair(n->access)->pub);
    join_failed(c, TD_EINVAL, msg);
    return;
  }
  if (st == TD__PROBE_KEY_MISMATCH) {
    snprintf(msg, sizeof msg, "join failed: %s dropped the handshake: the server key given "
             "does not match that node's key (run 'trainctl key' there)", ep);
    join_failed(c, TD_ECONFIG, msg);
    return;
  }
  if (st == TD__PROBE_TIMED_OUT) {
    handshake_timed_out(c);
    return;
  }
  if (st == TD__PROBE_ACCEPTED) {
    c->join_accepted = true; /* the welcome (or a refusal) is on its way */
    td__joinprobe_close(&c->probe);
  }
  bool reached = c->join_accepted || (c->probe != NULL && td__joinprobe_reached(c->probe));
  if (waited < (reached ? JOIN_SLOW_TIMEOUT_MS : JOIN_TIMEOUT_MS))
    return;
  if (c->join_accepted)
    snprintf(msg, sizeof msg, "no welcome from %s within %.0f s, though it accepted this "
             "node's key (see that node's log)", ep, JOIN_SLOW_TIMEOUT_MS / 1000.0);
  else if (reached)
    snprintf(msg, sizeof msg, "no answer from %s within %.0f s: something takes connections "
             "there but does not finish the handshake (is traind listening there?)", ep,
             JOIN_SLOW_TIMEOUT_MS / 1000.0);
  else
    snprintf(msg, sizeof msg, "no answer from %s within %.0f s %s", ep,
             JOIN_TIMEOUT_MS / 1000.0,
             c->probe != NULL ? "(nothing accepts connections there: is traind listening there?)"
                              : "(is traind listening there?)");
  join_failed(c, TD_EIO, msg);
}

/* Secure join: the node at `endpoint` must prove it holds `key`; the key is
 * admitted here (as a plain member unless already listed) since the
 * operator named it. The link is then the one to the key's node id. */
static td__link_t *join_link(conn_t *c, const char *endpoint, const char *key) {
  td__node_t *n = c->ctl->n;
  char why[256];
  uint8_t raw[TD_KEY_BYTES];
  if (key == NULL || key[0] == '\0') {
    respond(c, TD_ECONFIG, "join needs the public key of the node at that endpoint "
            "(trainctl key there): trainctl join tcp://HOST:PORT KEY", NULL);
    return NULL;
  }
  if (td_key_decode(key, raw, why, sizeof why) != 0) {
    respond(c, TD_ECONFIG, why, NULL);
    return NULL;
  }
  int rc = 0;
  bool listed = false;
  for (size_t i = 0; i < td__access_count(n->access) && !listed; i++)
    listed = strcmp(td__access_at(n->access, i)->z85, key) == 0;
  if (!listed && (rc = td__access_allow(n->access, key, false, why, sizeof why)) != 0) {
    respond(c, rc, why, NULL);
    return NULL;
  }
  if (!listed)
    snprintf(c->join_admitted, sizeof c->join_admitted, "%s", key);
  c->join_peer = td_key_node_id(raw);
  snprintf(c->join_key, sizeof c->join_key, "%s", key);
  td__link_t *l = td__link_ensure(n->net, c->join_peer, endpoint);
  if (l == NULL)
    join_failed(c, TD_EIO, "cannot open a link to that endpoint");
  return l;
}

/* A join would hand the peer our address: refuse one it cannot dial. */
static bool advertisable_to(conn_t *c, const char *endpoint) {
  char advertised[TD_ENDPOINT_MAX], why[512];
  int rc = td__transport_advertise_to(c->ctl->n->net, endpoint, advertised, sizeof advertised,
                                      why, sizeof why);
  if (rc != 0)
    respond(c, rc, why, NULL);
  return rc == 0;
}

/* Join by invite: list the inviter as admin (it will sign our admission),
 * then present the invite's one-time key and our request on a connection of
 * its own (invite_tick goes on from there). */
static void cmd_join_invite(conn_t *c, const char *invite) {
  td__node_t *n = c->ctl->n;
  char why[256], endpoint[TD_ENDPOINT_MAX], inviter[TD_KEY_Z85_LEN + 1];
  uint8_t inviter_raw[TD_KEY_BYTES], inviter_sign[TD__SIGN_KEY_BYTES], secret[TD_KEY_BYTES],
      invite_pub[TD_KEY_BYTES];
  const td_keypair_t *kp = td__access_keypair(n->access);
  if (!td__access_secure(n->access)) {
    respond(c, TD_EINVAL, "this node runs --insecure: invites need CURVE keys", NULL);
    return;
  }
  if (td__join_string_parse(invite, endpoint, sizeof endpoint, inviter_raw, inviter_sign, secret,
                            why, sizeof why) != 0) {
    respond(c, TD_ECONFIG, why, NULL);
    return;
  }
  if (memcmp(inviter_raw, kp->pub_raw, TD_KEY_BYTES) == 0) {
    respond(c, TD_ECONFIG, "this invite was made by this node: use it on the new node", NULL);
    return;
  }
  if (c->ctl->pending_join != NULL) {
    respond(c, TD_EINVAL, "another join is in progress", NULL);
    return;
  }
  if (!advertisable_to(c, endpoint))
    return;
  zmq_z85_encode(inviter, inviter_raw, TD_KEY_BYTES);
  const td_allowed_key_t *listed = NULL;
  for (size_t i = 0; i < td__access_count(n->access) && listed == NULL; i++)
    if (strcmp(td__access_at(n->access, i)->z85, inviter) == 0)
      listed = td__access_at(n->access, i);
  int rc = 0;
  if (listed == NULL || !listed->admin)
    rc = td__access_allow(n->access, inviter, true, why, sizeof why);
  if (rc != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  if (listed == NULL)
    snprintf(c->join_admitted, sizeof c->join_admitted, "%s", inviter);
  td__admission_t *adm = td__access_admission(n->access);
  td__admission_bind(adm, inviter_raw, inviter_sign);
  snprintf(c->join_endpoint, sizeof c->join_endpoint, "%s", endpoint);
  snprintf(c->join_key, sizeof c->join_key, "%s", inviter);
  c->join_peer = td_key_node_id(inviter_raw);
  c->join_by_invite = c->join_probed = true;
  crypto_scalarmult_base(invite_pub, secret);
  char invite_pub_z85[TD_KEY_Z85_LEN + 1], secret_z85[TD_KEY_Z85_LEN + 1];
  zmq_z85_encode(invite_pub_z85, invite_pub, TD_KEY_BYTES);
  zmq_z85_encode(secret_z85, secret, TD_KEY_BYTES);
  sodium_memzero(secret, sizeof secret);
  uint8_t proof_msg[TD__JOIN_PROOF_BYTES], proof[TD__SIGNATURE_BYTES];
  td__join_proof_message(invite_pub, kp->pub_raw, proof_msg);
  td__admission_sign_message(adm, proof_msg, sizeof proof_msg, proof);
  Traind__JoinRequest jr = TRAIND__JOIN_REQUEST__INIT;
  jr.key = (ProtobufCBinaryData){.len = TD_KEY_BYTES, .data = (uint8_t *)kp->pub_raw};
  jr.sign_key = (ProtobufCBinaryData){.len = TD__SIGN_KEY_BYTES,
                                      .data = (uint8_t *)td__admission_sign_pub(adm)};
  jr.proof = (ProtobufCBinaryData){.len = sizeof proof, .data = proof};
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_JOIN_REQUEST;
  env.join_request = &jr;
  env.sender = n->node_id;
  uint8_t *buf = NULL;
  size_t len = 0;
  rc = td_wire_pack(&env, &buf, &len);
  if (rc == 0)
    rc = td__joinprobe_open(&c->probe, endpoint, inviter, invite_pub_z85, secret_z85);
  if (rc == 0)
    rc = td__joinprobe_send(c->probe, buf, len);
  free(buf);
  sodium_memzero(secret_z85, sizeof secret_z85);
  c->ctl->pending_join = c;
  if (rc != 0) {
    join_failed(c, TD_EIO, "cannot open a connection to present the invite");
    return;
  }
  c->join_began_ms = uv_now(&n->loop);
  uv_timer_start(&c->wait_timer, on_join_tick, JOIN_TICK_MS, JOIN_TICK_MS);
}

void td__control_cmd_join(conn_t *c, const char *endpoint, const char *key, const char *invite) {
  td__node_t *n = c->ctl->n;
  if (invite != NULL && invite[0] != '\0') {
    cmd_join_invite(c, invite);
    return;
  }
  if (endpoint == NULL || strncmp(endpoint, "tcp://", 6) != 0 ||
      strlen(endpoint) >= TD_ENDPOINT_MAX || strchr(endpoint + 6, ':') == NULL) {
    respond(c, TD_ECONFIG, "join needs an endpoint of the form tcp://HOST:PORT, or a join "
            "string from trainctl invite (ti1,...)", NULL);
    return;
  }
  if (strcmp(endpoint, td__transport_endpoint(n->net)) == 0) {
    respond(c, TD_ECONFIG, "that is this node's own endpoint", NULL);
    return;
  }
  if (c->ctl->pending_join != NULL) {
    respond(c, TD_EINVAL, "another join is in progress", NULL);
    return;
  }
  if (!advertisable_to(c, endpoint))
    return;
  td__link_t *l;
  snprintf(c->join_endpoint, sizeof c->join_endpoint, "%s", endpoint);
  if (td__access_secure(n->access)) {
    if ((l = join_link(c, endpoint, key)) == NULL)
      return;
  } else {
    l = td__link_by_endpoint(n->net, endpoint);
    if (l == NULL)
      l = td__link_ensure(n->net, 0, endpoint);
    if (l == NULL) {
      respond(c, TD_EIO, "cannot open a link to that endpoint", NULL);
      return;
    }
  }
  c->ctl->pending_join = c;
  c->join_began_ms = uv_now(&n->loop);
  uv_timer_start(&c->wait_timer, on_join_tick, JOIN_TICK_MS, JOIN_TICK_MS);
  td__gossip_hello(n, l);
}

static json_object *key_json(const char *z85, uint64_t node_id, bool admin) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "key", json_object_new_string(z85));
  json_object_object_add(o, "node_id", td__json_id(node_id));
  json_object_object_add(o, "admin", json_object_new_boolean(admin));
  return o;
}

void td__control_cmd_key(conn_t *c) {
  td__node_t *n = c->ctl->n;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "key", json_object_new_string(td__access_keypair(n->access)->pub));
  json_object_object_add(o, "node_id", td__json_id(n->node_id));
  json_object_object_add(o, "security", json_object_new_string(
                                            td__access_secure(n->access) ? "curve" : "insecure"));
  json_object *list = json_object_new_array();
  for (size_t i = 0; i < td__access_count(n->access); i++) {
    const td_allowed_key_t *k = td__access_at(n->access, i);
    json_object_array_add(list, key_json(k->z85, k->node_id, k->admin));
  }
  json_object_object_add(o, "allowed", list);
  respond_json(c, o);
}

void td__control_cmd_allow(conn_t *c, const char *key, bool admin) {
  td__node_t *n = c->ctl->n;
  char why[256];
  uint8_t raw[TD_KEY_BYTES];
  int rc = td_key_decode(key ? key : "", raw, why, sizeof why);
  if (rc == 0)
    rc = td__access_allow(n->access, key, admin, why, sizeof why);
  if (rc != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  td_log_info("admitted key %s (node %016" PRIx64 ")%s", key, td_key_node_id(raw),
              admin ? " as admin" : "");
  td__ledger_event(n->ledger, "key_allowed", "%s %016" PRIx64 "%s", key, td_key_node_id(raw),
                   admin ? " admin" : "");
  respond_json(c, key_json(key, td_key_node_id(raw), admin));
}

/* The revoked key's messages are dropped from now on (access.c); its
 * membership ends and our link to it closes. */
void td__control_cmd_revoke(conn_t *c, const char *key) {
  td__node_t *n = c->ctl->n;
  char why[256];
  uint64_t peer = 0;
  int rc = td__access_revoke(n->access, key ? key : "", &peer, why, sizeof why);
  if (rc != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  td_log_info("revoked key %s (node %016" PRIx64 ")", key, peer);
  td__ledger_event(n->ledger, "key_revoked", "%s %016" PRIx64, key, peer);
  td__admit_forget(n, peer);
  /* an admin's revocation is signed and ends that member on every node */
  uint8_t raw[TD_KEY_BYTES];
  bool spread = td__access_self_admin(n->access) &&
                td_key_decode(key, raw, why, sizeof why) == 0;
  if (spread)
    td__admit_spread_revoke(n, raw);
  json_object *o = key_json(key, peer, false);
  json_object_object_add(o, "revoked", json_object_new_boolean(true));
  json_object_object_add(o, "spread", json_object_new_boolean(spread));
  respond_json(c, o);
}
