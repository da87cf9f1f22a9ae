/* net.h: the links to the other nodes, as the daemon's upper layers see them.
 *
 * daemon/net/ holds the transport (transport.c: one link per peer, ZeroMQ
 * sockets, pacing, goodput), the peer port's flood defences (inbound.c:
 * connection shares, silent connections), who may connect and what they may ask
 * (access.c, zap.c) and the drop counters every refused peer message goes
 * to (drops.c). Nothing here calls a part above it: received envelopes go up
 * through the callback given at open. Loop thread, unless it says otherwise. */
#ifndef TD_DAEMON_NET_H
#define TD_DAEMON_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/base/members.h"
#include "daemon/net/admission.h"
#include "daemon/net/keys.h"
#include "daemon/store/ledger.h"
#include "proto/wire.h"
#include "scheduler/linkq.h"

/* --listen none: no peer port; the endpoint such a node advertises. */
#define TD_LISTEN_NONE "none"

/* A frame never acked (its peer died) gives its window back after this, s. */
#define TD__LINK_EXPIRE_S 30.0

typedef struct td__transport td__transport_t;
typedef struct td__link td__link_t;
typedef struct td__access td__access_t;
typedef struct td__zap td__zap_t;

/* ---- drops: every refused peer message is counted by kind -------------------- */

#define TD__DROPS(X)                                                                        \
  X(MALFORMED, malformed) X(VERSION, version) X(OVERSIZED, oversized)                      \
  X(WRONG_RUN, wrong_run) X(NOT_MEMBER, not_member) X(LATE, late) X(AHEAD, ahead)           \
  X(REJECTED, rejected) X(NONFINITE_LOCAL, nonfinite_local) X(DUPLICATE, duplicate)         \
  X(HANDSHAKE, handshake) X(UNKNOWN_KEY, unknown_key) X(FORBIDDEN, forbidden)             \
  X(REUSED_RUN_ID, reused_run_id) X(FLOODED, flooded) X(BAD_RELAY, bad_relay)           \
  X(CLUSTER_FULL, cluster_full)
#define TD__DROP_ENUM(u, l) TD__DROP_##u,
typedef enum { TD__DROPS(TD__DROP_ENUM) TD__DROP_COUNT } td__drop_t;
#undef TD__DROP_ENUM
/* Counter name of a drop kind ("malformed"), for status. */
const char *td__drop_name(td__drop_t kind);
/* The node's drop counters: one per kind, and how many were logged. */
typedef struct {
  uint64_t count[TD__DROP_COUNT];
  unsigned logged;
} td__drops_t;
/* Count a refused message; log `what` (rate-limited) unless it is NULL. */
void td__drop(td__drops_t *d, td__drop_t kind, const char *what);
/* Log a refusal the caller counted itself, on the same rate limit as td__drop
 * but by `count` (so that one kind's flood cannot hide another's). */
bool td__drop_should_log(uint64_t count);
/* ---- the descriptor budget (descriptors.c) ------------------------------------------ */

/* How the node shares its descriptors: `cap` of `limit` (the soft
 * RLIMIT_NOFILE) are spent, `reserve` of them on its own files and outgoing
 * links, `control_clients` on trainctl; the rest (`inbound`) on connections
 * to the peer port, at most `per_address` from one address and `pending`
 * still in their handshake. tight: the limit is too low to share. */
typedef struct {
  uint64_t limit, cap, reserve, control_clients, inbound, per_address, pending;
  bool tight;
} td__descriptors_t;
/* Raise the soft descriptor limit to the hard one and plan the shares. A
 * failure is not fatal: `note` says what happened ("" when nothing did). */
void td__descriptors_init(td__descriptors_t *d, char *note, size_t note_len);
/* The shares for a soft limit of `limit` descriptors (pure; for tests). */
void td__descriptors_plan(td__descriptors_t *d, uint64_t limit);
/* Descriptors this process has open now (/proc/self/fd); -1 when unknown. */
long td__descriptors_open(void);
/* ---- keys, allowlist and permissions (access.c) ------------------------------------ */

typedef struct {
  bool secure;
  size_t allowed;
  uint64_t refused_keys;   /* connections the ZAP handler refused */
  uint64_t forged_senders; /* messages whose sender field named another node */
  uint64_t forbidden;      /* run starts and stops from keys without `admin` */
} td__access_stats_t;

/* Load (or make, at first start) DATA_DIR/node.key and read the allowlist;
 * insecure: keys are kept but not used. TD_ENOTSUP when libzmq has no CURVE. */
int td__access_open(td__access_t **out, const char *data_dir, bool insecure, char *why,
                    size_t why_len);
void td__access_close(td__access_t **self_p);
bool td__access_secure(const td__access_t *a);
const td_keypair_t *td__access_keypair(const td__access_t *a);
/* This node's id: derived from its public key. */
uint64_t td__access_node_id(const td__access_t *a);
/* The key a link to `peer` must authenticate; NULL when insecure or not admitted. */
const char *td__access_key_of(const td__access_t *a, uint64_t peer);
/* `peer` is admitted here (always true when insecure). */
bool td__access_known(const td__access_t *a, uint64_t peer);
/* ZAP: may this key connect? (a refusal is counted) */
bool td__access_admits(td__access_t *a, const uint8_t raw[TD_KEY_BYTES]);
/* Who sent a message that came on a connection authenticated as user_id
 * (Z85 key; NULL: none): its key's node id, 0 when that key is not admitted
 * (any more). A sender field that disagrees is counted and logged. Insecure:
 * `claimed`. */
uint64_t td__access_sender(td__access_t *a, const char *user_id, uint64_t claimed);
/* `peer`'s key is marked admin here (secure mode only; nothing counted). */
bool td__access_is_admin(const td__access_t *a, uint64_t peer);
/* May `peer` start or stop runs on this node? (a refusal is counted) */
bool td__access_may_run(td__access_t *a, uint64_t peer);
/* Admit a key (admin: may start and stop runs) and save the allowlist. */
int td__access_allow(td__access_t *a, const char *z85, bool admin, char *why, size_t why_len);
/* Remove a key and save; *node_id says whose it was. TD_ENOENT when not listed. */
int td__access_revoke(td__access_t *a, const char *z85, uint64_t *node_id, char *why,
                      size_t why_len);
void td__access_stats(const td__access_t *a, td__access_stats_t *out);
/* Plain TCP (insecure) only on a loopback listen address, unless forced. */
int td__access_check_listen(const char *listen, bool insecure, bool force, char *why,
                            size_t why_len);
size_t td__access_count(const td__access_t *a);
/* `raw` is on the allowlist (nothing counted). */
bool td__access_listed(const td__access_t *a, const uint8_t raw[TD_KEY_BYTES]);
/* The node's admission records and invites (borrowed for the access's life). */
td__admission_t *td__access_admission(td__access_t *a);
/* This node may admit and revoke for its cluster: secure, and no record says
 * it was admitted without admin (a node nobody admitted founded its cluster). */
bool td__access_self_admin(const td__access_t *a);
/* The Ed25519 key `peer` signs with, once bound (its admission record, its
 * join string or its own hello); NULL when not admitted or not known yet. */
const uint8_t *td__access_sign_key_of(const td__access_t *a, uint64_t peer);
/* `peer` said over its own authenticated connection that it signs with `sign`. */
void td__access_bind_sign(td__access_t *a, uint64_t peer, const uint8_t *sign, size_t len);
typedef enum {
  TD__RECORD_APPLIED,        /* the allowlist (or this node's own standing) changed */
  TD__RECORD_DUPLICATE,      /* held already: nothing to do, nothing to count */
  TD__RECORD_STALE,          /* older than the record held about that key: a replay */
  TD__RECORD_FORGED,         /* bad signature, or signed by a key without admin */
  TD__RECORD_UNKNOWN_SIGNER, /* signer not listed here, or its signing key not known yet */
  TD__RECORD_FAILED,         /* the allowlist or the record file cannot be written */
} td__record_result_t;
/* Check a record (fresh, signed by an admin key listed here whose signing key
 * is known, signature good) and apply it: list or unlist its subject and keep
 * the record. *subject: the subject's node id. Anything but APPLIED and
 * DUPLICATE comes with a one-line why; nothing is counted here. */
td__record_result_t td__access_apply_record(td__access_t *a, const td__record_t *r,
                                            uint64_t *subject, char *why, size_t why_len);
const td_allowed_key_t *td__access_at(const td__access_t *a, size_t i);

/* The User-Id prefix of a connection authenticated by an invite's key. */
#define TD__INVITE_USER_ID "invite:"
/* ZAP handler (zap.c) on inproc://zeromq.zap.01 of the transport's context. */
int td__zap_open(td__zap_t **out, void *zctx, uv_loop_t *loop, td__access_t *access, char *why,
                 size_t why_len);
void td__zap_drain(td__zap_t *z); /* NULL-safe: answer every pending request */
/* Handshakes the ZAP handler refused because their key connected too often. */
uint64_t td__zap_limited(const td__zap_t *z);
/* Handshakes of node_id's key refused while the key was unknown (0: none
 * remembered; NULL-safe). */
uint32_t td__zap_refused_of(const td__zap_t *z, uint64_t node_id);
void td__zap_stop(td__zap_t *z);  /* close its handle (shutdown) */
void td__zap_close(td__zap_t **self_p);
/* ---- transport (transport.c) -------------------------------------------------------- */

typedef enum { TD__ACK_UPDATE = 0, TD__ACK_CHUNK = 1 } td__ack_kind_t;

typedef struct {
  uint64_t bytes_sent, bytes_recv, send_drops;
  uint64_t update_wire_sent, update_dense_sent, update_wire_recv, update_dense_recv;
  const char *codec; /* of the last update sent; "-" before */
  double goodput_bps, ack_s, budget_bytes;
  double path_rtt_s; /* from heartbeat echoes; 0 until measured */
  /* how the link reaches its peer: "direct" (we dial it), "inbound" (it
   * accepts no connections: we answer on the ones it opened), "relayed"
   * (through `via`, 0 before the first frame) */
  const char *route;
  uint64_t via;
  td_linkq_stats_t q;
} td__link_stats_t;

/* Where the answer to a join request goes: the connection it came on
 * (borrowed for the `invite` call only). */
typedef struct {
  td__transport_t *transport;
  const void *rid;
  size_t rid_len;
} td__invite_reply_t;

/* What the transport hands up, given at open (the node's dispatch): the
 * transport never calls a part above it by name. */
typedef struct {
  /* An envelope that passed proto/wire.c, its sender the authenticated one
   * (`bytes` on the wire); borrowed for the call. */
  void (*received)(void *user, const Traind__Envelope *env, size_t bytes);
  /* A join request on a connection an invite's one-time key authenticated
   * (invite_key: that key); answer it with td__transport_reply. */
  void (*invite)(void *user, const uint8_t invite_key[TD_KEY_BYTES],
                 const Traind__Envelope *env, td__invite_reply_t *reply);
  void *user;
} td__transport_events_t;

/* Send `env` back on the invite connection a request came on; TD_EIO when
 * that connection is gone. */
int td__transport_reply(td__invite_reply_t *reply, Traind__Envelope *env);

typedef struct {
  uv_loop_t *loop;
  uint64_t node_id;       /* ours: never linked to, stamped as the sender */
  td__access_t *access;   /* borrowed: who may connect, who sent what */
  td__drops_t *drops;     /* borrowed: refused frames are counted there */
  const char *listen;     /* tcp://HOST:PORT */
  double link_delay_s;    /* user-space latency on outgoing update chunks */
  double uplink_bps;      /* > 0: pace every link queue's frames to this in total */
  const td__descriptors_t *descriptors; /* the inbound shares (copied) */
  double heartbeat_s;     /* an inbound connection silent 40 of these (>= 10 s) is closed */
  td__transport_events_t events;
} td__transport_opts_t;

/* Inbound connections to the peer port, as the socket monitor saw them. */
typedef struct {
  uint64_t inbound;   /* open now */
  uint64_t pending;   /* of which still in their handshake */
  uint64_t addresses; /* distinct remote addresses among them */
  uint64_t shed;      /* closed at accept: over a share of the budget */
  uint64_t idle_closed; /* closed after a long silence */
  uint64_t handshake_limited; /* handshakes refused: one key connecting too often */
} td__inbound_stats_t;

/* Frames this node relayed out (its own, signed), took in (verified) and
 * passed on for others (a reachable member). */
void td__transport_relay_stats(const td__transport_t *t, uint64_t *out, uint64_t *in,
                               uint64_t *forwarded);
/* Bind and start receiving; TD_EIO + why when the address is unusable. */
int td__transport_open(td__transport_t **out, const td__transport_opts_t *opts, char *why,
                       size_t why_len);
/* The member table that says who is reachable (borrowed; set once it exists). */
void td__transport_set_members(td__transport_t *t, td_members_t *members);
/* Bytes of run traffic (updates, snapshots: every frame but control) sent
 * since the transport opened; the rounds take their share by difference. */
uint64_t td__transport_run_bytes_sent(const td__transport_t *t);
void td__transport_inbound_stats(const td__transport_t *t, td__inbound_stats_t *out);
/* The descriptor shares the transport enforces (borrowed). */
const td__descriptors_t *td__transport_descriptors(const td__transport_t *t);
void td__transport_stop(td__transport_t *t); /* close its handles (shutdown) */
void td__transport_close(td__transport_t **self_p); /* after the loop ended */
/* The endpoint this node advertises by default (--advertise, the listen
 * address, or with a wildcard one its first non-loopback interface). */
const char *td__transport_endpoint(const td__transport_t *t);
/* The endpoint the peer socket is bound to (may be a wildcard). */
const char *td__transport_listen_endpoint(const td__transport_t *t);
/* Advertise `advertise` (checked by td_advertise_check) to every peer. */
void td__transport_set_advertise(td__transport_t *t, const char *advertise);
/* The endpoint this node advertises to the peer at peer_endpoint, into out.
 * TD_ECONFIG + a one-line why (set --advertise) when that would be a loopback
 * address and the peer is not on loopback. */
int td__transport_advertise_to(const td__transport_t *t, const char *peer_endpoint, char *out,
                               size_t cap, char *why, size_t why_len);
/* The same for a link, chosen once per peer address (logged when it differs
 * from the default); NULL when refused (logged once as a warning). */
const char *td__link_advertised(td__transport_t *t, td__link_t *l);
void td__transport_tick(td__transport_t *t);
/* Drop every queued update and bulk frame (a new run starts). */
void td__transport_drop_run_traffic(td__transport_t *t);
size_t td__transport_count(const td__transport_t *t);
td__link_t *td__transport_at(td__transport_t *t, size_t i);
/* Uplink bytes/s: the measured goodput of the links to reachable members. */
double td__transport_uplink(td__transport_t *t);
/* Send on the control connection of every link to a reachable member. */
void td__transport_broadcast(td__transport_t *t, Traind__Envelope *env);

td__link_t *td__link_find(td__transport_t *t, uint64_t peer);
/* Close the link to `peer` (its key was revoked); its slot is reused. */
void td__link_close_peer(td__transport_t *t, uint64_t peer);
td__link_t *td__link_by_endpoint(td__transport_t *t, const char *endpoint);
/* The link to `peer` at `endpoint`, connected if new; NULL for ourselves,
 * when the table is full, or (secure) when peer's key is not admitted. A link
 * opened by endpoint alone (peer 0: insecure only) is adopted. */
td__link_t *td__link_ensure(td__transport_t *t, uint64_t peer, const char *endpoint);
uint64_t td__link_peer(const td__link_t *l);
/* Stamp (sender, seq) and send on the control connection. */
int td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env);
int td__link_send_ack(td__transport_t *t, uint64_t peer, uint64_t run_id, td__ack_kind_t kind,
                      uint64_t seq, uint64_t bytes);
/* Reserve `count` link sequence numbers for frames stamped later. */
uint64_t td__link_reserve(td__link_t *l, size_t count);
/* Queue a packed frame (taken) on the paced bulk connection. */
void td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len,
                    uint64_t seq);
void td__link_drop_class(td__link_t *l, td_prio_t prio);
/* The peer comes back into the run as a new process, or after a long pause:
 * frames in flight to it give their window back and queued updates and
 * snapshots (meant for what it was) are dropped. */
void td__link_restart(td__transport_t *t, td__link_t *l);
/* Dial l's peer again on both sockets, when the link is direct (libzmq
 * gives up on a connection whose handshake the peer refused). */
void td__link_redial(td__link_t *l);
/* For l's heartbeat: how many of its peer's handshakes this node refused
 * before it knew the peer's key (0 when insecure or none). */
uint32_t td__link_refused_out(const td__transport_t *t, const td__link_t *l);
/* The peer's heartbeat says it refused `refused` of our handshakes: dial it
 * again when that count grew (at most once per ECHO_STALE_S). */
void td__link_refused_in(td__link_t *l, uint32_t refused);
/* Hand the socket every frame the window allows now. */
void td__link_pump(td__transport_t *t, td__link_t *l);
void td__link_note_recv(td__link_t *l, uint64_t bytes);
void td__link_note_update_recv(td__link_t *l, uint64_t wire, uint64_t dense);
/* An update of `round` (wire bytes, dense bytes, codec) went into the queue. */
void td__link_note_update_sent(td__link_t *l, uint64_t round, uint64_t wire, uint64_t dense,
                               const char *codec);
/* Byte budget for this round's update (codec = auto) from the link's goodput. */
double td__link_fit_budget(td__link_t *l, uint64_t round, double compute_s, double min_s);
/* An ack of update `round`: true and the ledger row when it was one goodput sample. */
bool td__link_update_acked(td__link_t *l, uint64_t round, uint64_t bytes, td_ledger_link_t *row,
                           char *codec, size_t codec_len);
void td__link_chunk_acked(td__transport_t *t, td__link_t *l, uint64_t seq);
/* Heartbeat echo (path RTT): the fields our next heartbeat to the link's peer
 * carries (our clock, and the peer's last stamp with how long we held it),
 * and what the peer's heartbeat carried (any values: checked here). */
void td__link_echo_out(td__link_t *l, uint64_t *stamp_us, uint64_t *echo_us, uint64_t *hold_us);
void td__link_echo_in(td__link_t *l, uint64_t stamp_us, uint64_t echo_us, uint64_t hold_us);
void td__link_stats(td__link_t *l, td__link_stats_t *out);
/* May this link get one more reply that its peer can ask for at will (a
 * welcome)? At most `burst`, refilled at `per_s`; false: suppress it. */
bool td__link_take_reply(td__link_t *l, double per_s, double burst);
/* A suppressed request still wants one answer, sent when the ration allows
 * (however many were suppressed). */
void td__link_set_reply_owed(td__link_t *l, bool owed);
bool td__link_reply_owed(const td__link_t *l);

#endif
