/* internal.h: what the node's own files share: node.c (start-up, shutdown,
 * the heartbeat that calls every part's tick), dispatch.c (which handler a
 * received message goes to), gossip.c (membership traffic), admit.c
 * (admission by invite, signed admissions and revocations), control*.c and
 * status.c (trainctl's commands and their JSON) and monitor.c (the figures
 * `--metrics` serves).
 *
 * The layers below have their own headers: daemon/session/shared.h (a run
 * on the loop thread, and the node state it runs in), daemon/net/net.h,
 * daemon/store/ledgerq.h, daemon/run/run.h, daemon/base/. Nothing below
 * includes this file (scripts/layering checks it). */
#ifndef TD_DAEMON_INTERNAL_H
#define TD_DAEMON_INTERNAL_H

#include "daemon/base/json.h"
#include "daemon/session/shared.h"

/* Leave the cluster and close every handle; the loop ends when the last
 * borrowed job is done. Idempotent. */
void td__node_shutdown(td__node_t *n, const char *why);

/* ---- receiving (dispatch.c) -------------------------------------------------------- */

/* One envelope from the ROUTER (`bytes` on the wire), already validated. */
void td__dispatch(td__node_t *n, const Traind__Envelope *env, size_t bytes);
/* ---- gossip (gossip.c) ----------------------------------------------------------------- */

void td__gossip_hello(td__node_t *n, td__link_t *l);
void td__gossip_greet_known(td__node_t *n);
void td__gossip_tick(td__node_t *n);
/* Gives the membership table its reuse hooks (run members pinned, evictions
 * logged and their links closed); once, after the table opens. */
void td__gossip_install(td__node_t *n);
void td__gossip_leave(td__node_t *n, const char *why);
/* Direct evidence that `peer` is alive (endpoint NULL: unchanged). Returns
 * false when a new peer finds the membership table full. */
bool td__gossip_heard(td__node_t *n, uint64_t peer, const char *endpoint);
void td__on_hello(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_welcome(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_heartbeat(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_leave(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
/* ---- admissions by invite, spread by signed records (admit.c) ---------------------------- */
/* Whether `joiner` may join (it is a member already or the membership table
 * has room); when not, the refusal is counted (drop cluster_full), logged
 * with `how` it asked, and `why` gets the one line its trainctl prints. */
bool td__admit_room(td__node_t *n, uint64_t joiner, const char *how, char *why, size_t why_len);

/* Records from a peer: each checked and applied, the new ones passed on. */
void td__on_admissions(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
/* The transport's upcall for a join request on an invite's connection (user: the node). */
void td__admit_on_invite(void *user, const uint8_t invite_key[TD_KEY_BYTES],
                         const Traind__Envelope *env, td__invite_reply_t *reply);
/* Every record held, to one link (after a welcome). */
void td__admit_send_all(td__node_t *n, td__link_t *l);
/* A joining node applies the records its inviter granted; returns how many applied. */
size_t td__admit_apply_grant(td__node_t *n, const Traind__JoinGrant *g, uint64_t from);
/* Sign and spread a revocation of `key` (only when this node is an admin). */
void td__admit_spread_revoke(td__node_t *n, const uint8_t key[TD_KEY_BYTES]);
/* A revoked key's member ends here: left, out of the run, link closed. */
void td__admit_forget(td__node_t *n, uint64_t peer);
/* `count` one-time join strings ({"invites": [...]}, caller owns *out);
 * TD_EINVAL + why when this node is no admin or an argument is out of range. */
int td__admit_invite(td__node_t *n, bool admin, uint32_t ttl_s, uint32_t count,
                     json_object **out, char *why, size_t why_len);
json_object *td__admit_status(td__node_t *n);
/* ---- control socket (control.c) and its JSON (status.c) -------------------------------- */

int td__control_open(td__control_t **out, td__node_t *n, char *why, size_t why_len);
void td__control_stop(td__control_t *c);
void td__control_close(td__control_t **self_p);
/* A welcome from `peer` answers a pending `trainctl join` (control_admit.c). */
void td__control_welcome(td__control_t *c, uint64_t peer);
/* `peer` refused to take this node in (one line, from its welcome): the
 * pending `trainctl join` fails with it and admits nothing. */
void td__control_join_refused(td__control_t *c, uint64_t peer, const char *reason);

json_object *td__status_json(td__node_t *n);
json_object *td__status_peers(td__node_t *n);
/* ---- monitoring (monitor.c): `traind --metrics HOST:PORT` ------------------------------ */

/* Serve the node's figures on host_port (daemon/metrics.h); TD_EIO when the
 * port is busy, with why. */
int td__monitor_open(td__monitor_t **out, td__node_t *n, const char *host_port, char *why,
                     size_t why_len);
/* Publish a fresh snapshot (heartbeat, closed round). NULL-safe. */
void td__monitor_publish(td__monitor_t *m);
/* Stop the server, then free the snapshots. NULL-safe. */
void td__monitor_close(td__monitor_t **self_p);

#endif
