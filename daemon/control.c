/* control.c: the control socket and the commands trainctl sends on it.
 *
 * Threads: loop thread; a rounds query reads the ledger on the work pool
 * (ledgerq.c) and answers from its done callback. One connection carries one
 * framed request (proto/control.h) and one framed response. A connection
 * owns two libuv handles (its pipe and the timer of a pending `join` or
 * `start`) and may have one ledger query in flight; it is freed only when the
 * last close callback has run and no query still refers to it (libuv frees
 * nothing a handle uses before its close callback). A client that goes away
 * before it reads the answer is a closed client, nothing more: the daemon
 * ignores SIGPIPE (node.c) and a failed write just closes the connection.
 *
 * Both `join` and `start` answer only once they know how it went. A join
 * watches the handshake (joinprobe.c) and waits for the welcome or a refusal;
 * a failed one takes back the key it admitted. A join by invite first
 * presents the invite on the probe's own connection and applies the signed
 * admissions granted (admit.c), then goes on as a join by key. A start runs here first,
 * unannounced, until its data and backend are ready, so a mistake this node
 * can see (model vs dataset, a missing backend, its limits) starts nothing
 * anywhere; then the members are told, and the answer waits until each has
 * said ready (heartbeat run_state 2) or refused (RunRefused), bounded. */
#include "daemon/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "daemon/net/joinprobe.h"
#include "compute/safetensors.h"
#include "proto/control.h"

/* A join waits JOIN_TIMEOUT_MS for the welcome of the node it asked, or
 * JOIN_SLOW_TIMEOUT_MS once something there took the connection (it may be
 * there, only slow: valgrind, a loaded machine). Without a welcome after
 * JOIN_PROBE_AFTER_MS, a probe (joinprobe.c) watches the handshake; it is read
 * every JOIN_TICK_MS. */
#define JOIN_TIMEOUT_MS 5000
#define JOIN_SLOW_TIMEOUT_MS 20000
#define JOIN_PROBE_AFTER_MS 300
#define JOIN_TICK_MS 50
/* A start waits at most START_LOCAL_MS for this node's own data and backend
 * before it tells the members anyway, and answers within START_WAIT_MS (under
 * trainctl's 30 s) whether or not every member has said ready or refused. */
#define START_LOCAL_MS 12000
#define START_WAIT_MS 25000
/* Once told, the members have this long to show (heartbeat) that they hold
 * the run before this node's first round goes anyway: an update of a run a
 * node does not hold yet is dropped. */
#define START_HOLD_MS 3000
#define START_TICK_MS 100
#define LISTEN_BACKLOG 16
/* Smallest read buffer offered to libuv. */
#define READ_CHUNK 4096

typedef struct conn {
  struct conn *next; /* the control's list of open connections */
  td__control_t *ctl;
  uv_pipe_t pipe;
  uv_timer_t wait_timer;
  unsigned refs; /* open handles + a query in flight */
  bool closing, responded;
  uint8_t *buf;
  size_t len, cap;
  uv_write_t write_req;
  uint8_t *out;
  char join_endpoint[TD_ENDPOINT_MAX];
  /* a pending join: the key it admitted here (empty when it was listed
   * already, or insecure), the key the node must hold (empty: insecure), the
   * node it stands for, when it began on the loop clock, and its handshake
   * probe (opened once, when the welcome is slow) */
  char join_admitted[TD_KEY_Z85_LEN + 1], join_key[TD_KEY_Z85_LEN + 1];
  uint64_t join_peer, join_began_ms;
  bool join_probed, join_accepted;
  td__joinprobe_t *probe;
  /* a join by invite: first its request and grant on the probe's connection */
  bool join_by_invite;
  /* a pending start: its run, the RunStart spec text until it is sent, the
   * members, and when the start began on the loop clock */
  uint64_t start_run, start_began_ms, start_announced_ms;
  bool start_released;
  char *start_text;
  uint64_t start_members[TD_MEMBERS_MAX];
  size_t start_n;
} conn_t;

struct td__control {
  td__node_t *n;
  uv_pipe_t server;
  bool listening, bound, stopped;
  conn_t *conns;
  conn_t *pending_join;
};

static void conn_unref(conn_t *c) {
  if (--c->refs > 0)
    return;
  td__control_t *ctl = c->ctl;
  for (conn_t **p = &ctl->conns; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  td__joinprobe_close(&c->probe);
  free(c->start_text);
  free(c->buf);
  free(c->out);
  free(c);
}

static void on_handle_closed(uv_handle_t *h) { conn_unref(h->data); }

static void conn_close(conn_t *c) {
  if (c->closing)
    return;
  c->closing = true;
  if (c->ctl->pending_join == c)
    c->ctl->pending_join = NULL;
  td__session_t *s = c->start_text != NULL ? td__session_of(c->ctl->n, c->start_run) : NULL;
  if (s != NULL) { /* trainctl left before the run was announced: nobody else knows it */
    td_log_info("run %016" PRIx64 " stopped: its trainctl start went away", s->run_id);
    td_run_stop(s->run);
  } else if (c->start_run != 0 && !c->start_released &&
             (s = td__session_of(c->ctl->n, c->start_run)) != NULL) {
    td_run_go(s->run); /* announced: it goes on without the answer */
  }
  uv_close((uv_handle_t *)&c->wait_timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
}

static void on_written(uv_write_t *req, int status) {
  (void)status; /* UV_EPIPE: the client left without reading; nothing to do */
  conn_close(req->data);
}

/* Send one framed response (status 0 with a JSON payload, or an error). */
static void respond_total(conn_t *c, int status, const char *error, const char *json,
                          uint64_t total) {
  if (c->responded || c->closing)
    return;
  c->responded = true;
  Traind__ControlResponse resp = TRAIND__CONTROL_RESPONSE__INIT;
  resp.status = status;
  resp.error = (char *)(error ? error : "");
  resp.json = (char *)(json ? json : "");
  resp.total = total;
  size_t len;
  int rc = td_control_frame_response(&resp, &c->out, &len);
  if (rc == TD_ERANGE) {
    char msg[160];
    snprintf(msg, sizeof msg, "the answer exceeds the %u-byte control limit",
             TD_WIRE_MAX_CONTROL);
    resp = (Traind__ControlResponse)TRAIND__CONTROL_RESPONSE__INIT;
    resp.status = TD_ERANGE;
    resp.error = msg;
    rc = td_control_frame_response(&resp, &c->out, &len);
  }
  uv_buf_t b = uv_buf_init((char *)c->out, (unsigned)len);
  c->write_req.data = c;
  if (rc != 0 || uv_write(&c->write_req, (uv_stream_t *)&c->pipe, &b, 1, on_written) != 0)
    conn_close(c);
}

static void respond(conn_t *c, int status, const char *error, const char *json) {
  respond_total(c, status, error, json, 0);
}

static void respond_json(conn_t *c, json_object *o) {
  respond(c, 0, NULL, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  json_object_put(o);
}

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

static void cmd_join(conn_t *c, const char *endpoint, const char *key, const char *invite) {
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

/* A run id nobody else picks: FNV-1a over the spec, our id and the time. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull
static uint64_t fnv1a64(const void *data, size_t len, uint64_t h) {
  const uint8_t *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= FNV_PRIME;
  }
  return h;
}

/* Tell the members about the run started here (the RunStart kept until now). */
static void announce(conn_t *c, td__session_t *s) {
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = c->start_text;
  rs.members = c->start_members;
  rs.n_members = c->start_n;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = c->start_run;
  td__node_t *n = c->ctl->n;
  td__transport_broadcast(n->net, &env);
  /* a member silent now (stopped, suspended, stalled past the dead mark while
   * this node set the run up) still gets the run: its connection holds the
   * message until it resumes, and it then learns the run's fate from us */
  for (size_t i = 0; i < c->start_n; i++) {
    uint64_t id = c->start_members[i];
    td__link_t *l = id != n->node_id && !td_members_reachable(n->members, id)
                        ? td__link_find(n->net, id) : NULL;
    if (l != NULL)
      td__link_send(n->net, l, &env);
  }
  s->unannounced = false;
  free(c->start_text);
  c->start_text = NULL;
  c->start_announced_ms = uv_now(&c->ctl->n->loop);
}

/* The answer to a start once each member has said ready or refused (or the
 * wait is over): a run nobody else takes part in is stopped and refused. */
static void answer_start(conn_t *c, td__session_t *s, size_t ready, size_t refused,
                         size_t waiting) {
  uv_timer_stop(&c->wait_timer);
  char msg[768];
  if (refused > 0 && refused == s->n_members - 1) {
    snprintf(msg, sizeof msg, "no other member can run it, so run %016" PRIx64 " is stopped: %s",
             s->run_id, s->refused);
    td_run_stop(s->run);
    respond(c, TD_EINVAL, msg, NULL);
    return;
  }
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(s->run_id));
  json_object_object_add(o, "nodes", json_object_new_int((int)s->n_members));
  json_object_object_add(o, "ready", json_object_new_int((int)ready + 1));
  json_object_object_add(o, "waiting", json_object_new_int((int)waiting));
  json_object_object_add(o, "wait_s", json_object_new_double(START_WAIT_MS / 1000.0));
  json_object_object_add(o, "refused", json_object_new_string(s->refused));
  respond_json(c, o);
}

/* The answer to a start whose run finished before every member answered. */
static void answer_ended(conn_t *c, const td__run_stats_t *last) {
  size_t refused = 0;
  for (const char *p = last->refused; (p = strstr(p, " refused: ")) != NULL; p++)
    refused++;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(last->run_id));
  json_object_object_add(o, "nodes", json_object_new_int((int)last->nodes));
  json_object_object_add(o, "ready", json_object_new_int((int)(last->nodes - refused)));
  json_object_object_add(o, "waiting", json_object_new_int(0));
  json_object_object_add(o, "refused", json_object_new_string(last->refused));
  respond_json(c, o);
}

/* Every START_TICK_MS of a pending start: first this node's own set-up (a
 * failure there is the answer, and nobody else heard of the run), then the
 * members' heartbeats (ready) and refusals. */
static void on_start_tick(uv_timer_t *t) {
  conn_t *c = t->data;
  td__node_t *n = c->ctl->n;
  td__session_t *s = td__session_of(n, c->start_run);
  uint64_t waited = uv_now(t->loop) - c->start_began_ms;
  char msg[768];
  if (s == NULL) { /* the run ended here before the answer */
    uv_timer_stop(t);
    const td__run_stats_t *last = n->last_run;
    bool ours = last != NULL && last->run_id == c->start_run;
    if (ours && c->start_text == NULL && last->state == TD__RUN_FINISHED) {
      answer_ended(c, last); /* a short run, over already */
      return;
    }
    snprintf(msg, sizeof msg, "%s%s",
             c->start_text != NULL ? "run not started: " : "the run ended at once: ",
             ours && last->error[0] ? last->error : "it ended before it began");
    respond(c, TD_ECONFIG, msg, NULL);
    return;
  }
  if (c->start_text != NULL) {
    if (!s->ready && waited < START_LOCAL_MS)
      return;
    announce(c, s);
  }
  size_t ready = 0, refused = 0, waiting = 0, unheard = 0;
  for (size_t i = 0; i < s->n_members; i++) {
    const td_member_t *m = td_members_find(n->members, s->members[i]);
    if (s->members[i] == n->node_id)
      continue;
    if (s->since[i] == UINT64_MAX)
      refused++;
    else if (m != NULL && m->run_id == s->run_id && m->run_ready)
      ready++;
    else
      waiting++;
    if (s->since[i] != UINT64_MAX && (m == NULL || m->run_id != s->run_id))
      unheard++;
  }
  if (!c->start_released &&
      (unheard == 0 || uv_now(t->loop) - c->start_announced_ms >= START_HOLD_MS)) {
    c->start_released = true;
    td_run_go(s->run);
  }
  if (c->start_released && (waiting == 0 || waited >= START_WAIT_MS))
    answer_start(c, s, ready, refused, waiting);
}

/* init = FILE: the spec carries this node's file's hash, so that every member
 * checks it holds the same file (the path resolved as its policy does). */
static int init_hash(td__node_t *n, td_runspec_t *spec, char *why, size_t why_len) {
  if (strcmp(spec->init, "none") == 0 || strcmp(spec->init_hash, "none") != 0)
    return 0;
  td_runspec_t resolved = *spec;
  int rc = td__policy_check(&n->policy, &resolved, 1, why, why_len);
  char hex[TD_SAFETENSORS_HASH_HEX];
  if (rc == 0)
    rc = td_safetensors_file_hash(resolved.init, hex, why, why_len);
  if (rc == 0)
    snprintf(spec->init_hash, sizeof spec->init_hash, "%s", hex);
  return rc;
}

static void cmd_start(conn_t *c, const Traind__ControlRequest *req) {
  td__node_t *n = c->ctl->n;
  char why[768] = "";
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  int rc = 0;
  if (req->ini_text != NULL && req->ini_text[0] != '\0') /* parsed in memory, no disk */
    rc = td_runspec_load_ini_text(&spec, req->ini_text, "run file", why, sizeof why);
  for (size_t i = 0; rc == 0 && i < req->n_settings; i++)
    rc = td_runspec_set_arg(&spec, req->settings[i], why, sizeof why);
  if (rc == 0)
    rc = td_runspec_validate(&spec, why, sizeof why);
  if (rc != 0) {
    respond(c, TD_ECONFIG, why, NULL);
    return;
  }
  if (n->session != NULL) {
    if (td_run_stopping(n->session->run))
      snprintf(why, sizeof why, "run %016" PRIx64 " is still stopping; start again in a moment",
               n->session->run_id);
    else
      snprintf(why, sizeof why, "run %016" PRIx64 " is still running (trainctl stop first)",
               n->session->run_id);
    respond(c, TD_EINVAL, why, NULL);
    return;
  }
  if ((rc = init_hash(n, &spec, why, sizeof why)) != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  size_t need = td_runspec_format(&spec, NULL, 0) + 1;
  char *text = malloc(need);
  if (text == NULL) {
    respond(c, TD_ENOMEM, "out of memory", NULL);
    return;
  }
  td_runspec_format(&spec, text, need);
  uint64_t members[TD_MEMBERS_MAX];
  size_t nm = td_members_live(n->members, false, members, TD_MEMBERS_MAX);
  double now = td_clock_wall_s();
  uint64_t run_id = fnv1a64(text, strlen(text), FNV_OFFSET);
  run_id = fnv1a64(&n->node_id, sizeof n->node_id, run_id);
  run_id = fnv1a64(&now, sizeof now, run_id);
  if (run_id == 0)
    run_id = 1;
  rc = td__session_start(n, run_id, text, members, nm, 1, 0, true, why, sizeof why);
  if (rc != 0) {
    free(text);
    respond(c, rc, why, NULL);
    return;
  }
  c->start_run = run_id;
  c->start_text = text;
  memcpy(c->start_members, members, nm * sizeof *members);
  c->start_n = nm;
  c->start_began_ms = uv_now(&n->loop);
  uv_timer_start(&c->wait_timer, on_start_tick, START_TICK_MS, START_TICK_MS);
}

static void cmd_stop(conn_t *c) {
  td__node_t *n = c->ctl->n;
  td__session_t *s = n->session;
  if (s == NULL) {
    respond(c, TD_EINVAL, "no run is running", NULL);
    return;
  }
  Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
  stop.reason = "trainctl stop";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
  env.run_stop = &stop;
  env.run_id = s->run_id;
  td__transport_broadcast(n->net, &env);
  td_run_stop(s->run);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "stopping", td__json_id(s->run_id));
  respond_json(c, o);
}

/* trainctl verify: every member hashes its state a few rounds ahead; the
 * answer names that round, and status shows the vote once it is decided. */
static void cmd_verify(conn_t *c) {
  td__node_t *n = c->ctl->n;
  td__session_t *s = n->session;
  char why[256];
  uint64_t round = 0;
  if (s == NULL) {
    respond(c, TD_EINVAL, "no run is running: there is no shared model to verify", NULL);
    return;
  }
  int rc = td__verify_ask(s, &round, why, sizeof why);
  if (rc != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  td_log_info("trainctl verify: the members hash their state after round %" PRIu64, round);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(s->run_id));
  json_object_object_add(o, "round", json_object_new_int64((int64_t)round));
  respond_json(c, o);
}

static json_object *key_json(const char *z85, uint64_t node_id, bool admin) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "key", json_object_new_string(z85));
  json_object_object_add(o, "node_id", td__json_id(node_id));
  json_object_object_add(o, "admin", json_object_new_boolean(admin));
  return o;
}

static void cmd_key(conn_t *c) {
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

static void cmd_allow(conn_t *c, const char *key, bool admin) {
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
static void cmd_revoke(conn_t *c, const char *key) {
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

static void rounds_answered(char *json, uint64_t total, void *user) {
  conn_t *c = user;
  if (json == NULL)
    respond(c, TD_ENOMEM, "out of memory", NULL);
  else
    respond_total(c, 0, NULL, json, total);
  free(json);
  conn_unref(c); /* the query's reference */
}

static void cmd_rounds(conn_t *c, const Traind__ControlRequest *req) {
  td__node_t *n = c->ctl->n;
  uint64_t run_id = td__session_last_id(n);
  if (run_id == 0) {
    respond(c, 0, NULL, "[]");
    return;
  }
  uint64_t limit = req->page_size ? req->page_size : UINT64_MAX;
  c->refs++;
  if (td__ledger_rounds_query(n->ledger, run_id, req->last, req->page_from, limit,
                              rounds_answered, c) != 0) {
    c->refs--;
    respond(c, TD_EIO, "cannot query the ledger", NULL);
  }
}

static void handle_request(conn_t *c, const uint8_t *frame, size_t len) {
  td__node_t *n = c->ctl->n;
  Traind__ControlRequest *req = NULL;
  char why[256];
  if (td_wire_unpack_request(&req, frame, len, why, sizeof why) != 0) {
    respond(c, TD_EPROTO, why, NULL);
    return;
  }
  switch (req->command) {
  case TRAIND__CONTROL_REQUEST__COMMAND__STATUS: respond_json(c, td__status_json(n)); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__JOIN:
    cmd_join(c, req->endpoint, req->key, req->invite);
    break;
  case TRAIND__CONTROL_REQUEST__COMMAND__INVITE: {
    json_object *o = NULL;
    int rc = td__admit_invite(n, req->admin, req->ttl_s ? req->ttl_s : TD__INVITE_TTL_DEFAULT_S,
                              req->count ? req->count : 1, &o, why, sizeof why);
    if (rc != 0)
      respond(c, rc, why, NULL);
    else
      respond_json(c, o);
    break;
  }
  case TRAIND__CONTROL_REQUEST__COMMAND__KEY: cmd_key(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__ALLOW: cmd_allow(c, req->key, req->admin); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__REVOKE: cmd_revoke(c, req->key); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__START: cmd_start(c, req); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__STOP: cmd_stop(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__VERIFY: cmd_verify(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__PEERS: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "node_id", td__json_id(n->node_id));
    json_object_object_add(o, "endpoint", json_object_new_string(td__transport_endpoint(n->net)));
    json_object_object_add(o, "peers", td__status_peers(n));
    respond_json(c, o);
    break;
  }
  case TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS: cmd_rounds(c, req); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__LEAVE: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "left", td__json_id(n->node_id));
    respond_json(c, o);
    n->shutdown(n, "trainctl leave");
    break;
  }
  default: respond(c, TD_EINVAL, "unknown command", NULL); break;
  }
  td_wire_free_request(&req);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)suggested;
  if (c->cap - c->len < READ_CHUNK) {
    size_t cap = c->cap ? c->cap * 2 : 2 * READ_CHUNK;
    uint8_t *nb = cap <= TD_WIRE_MAX_CONTROL + 2 * TD_CONTROL_HEADER_BYTES ? realloc(c->buf, cap)
                                                                          : NULL;
    if (nb == NULL) {
      *buf = uv_buf_init(NULL, 0);
      return;
    }
    c->buf = nb;
    c->cap = cap;
  }
  *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void conn_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = s->data;
  (void)buf;
  if (nread < 0) { /* the client left (or sent too much): nothing to answer */
    conn_close(c);
    return;
  }
  c->len += (size_t)nread;
  if (c->len < TD_CONTROL_HEADER_BYTES || c->responded)
    return;
  size_t frame = td_control_frame_len(c->buf);
  if (frame > TD_WIRE_MAX_CONTROL) {
    respond(c, TD_EPROTO, "control request too large", NULL);
    return;
  }
  if (c->len < frame + TD_CONTROL_HEADER_BYTES)
    return;
  uv_read_stop(s);
  handle_request(c, c->buf + TD_CONTROL_HEADER_BYTES, frame);
}

static void on_connection(uv_stream_t *server, int status) {
  td__control_t *ctl = server->data;
  if (status < 0 || ctl->stopped)
    return;
  conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return;
  c->ctl = ctl;
  c->next = ctl->conns;
  ctl->conns = c;
  uv_pipe_init(&ctl->n->loop, &c->pipe, 0);
  uv_timer_init(&ctl->n->loop, &c->wait_timer);
  c->pipe.data = c->wait_timer.data = c;
  c->refs = 2; /* the two handles */
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 ||
      uv_read_start((uv_stream_t *)&c->pipe, conn_alloc, conn_read) != 0)
    conn_close(c);
}

int td__control_open(td__control_t **out, td__node_t *n, char *why, size_t why_len) {
  struct sockaddr_un addr;
  if (strlen(n->control_path) >= sizeof addr.sun_path)
    return td_why(why, why_len, TD_ECONFIG, "--control path is longer than %zu bytes: %s",
                  sizeof addr.sun_path - 1, n->control_path);
  td__control_t *ctl = calloc(1, sizeof *ctl);
  if (ctl == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  ctl->n = n;
  *out = ctl;
  uv_pipe_init(&n->loop, &ctl->server, 0);
  ctl->server.data = ctl;
  ctl->listening = true;
  unlink(n->control_path); /* a stale socket from a crashed daemon */
  mode_t old = umask(0177); /* the socket is created 0600 */
  int rc = uv_pipe_bind(&ctl->server, n->control_path);
  umask(old);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&ctl->server, LISTEN_BACKLOG, on_connection);
  if (rc != 0)
    return td_why(why, why_len, TD_EIO, "cannot listen on %s: %s", n->control_path,
                  uv_strerror(rc));
  chmod(n->control_path, 0600);
  ctl->bound = true;
  return 0;
}

/* Stop listening and close every connection (shutdown); a write in flight
 * finishes first, as libuv cancels it at close. */
void td__control_stop(td__control_t *ctl) {
  if (ctl == NULL || ctl->stopped)
    return;
  ctl->stopped = true;
  if (ctl->listening)
    uv_close((uv_handle_t *)&ctl->server, NULL);
  for (conn_t *c = ctl->conns; c != NULL; c = c->next)
    if (!c->responded)
      conn_close(c);
}

void td__control_close(td__control_t **self_p) {
  td__control_t *ctl = *self_p;
  if (ctl == NULL)
    return;
  *self_p = NULL;
  if (ctl->bound)
    unlink(ctl->n->control_path);
  free(ctl);
}
