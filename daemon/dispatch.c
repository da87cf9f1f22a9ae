/* dispatch.c: where each received peer message goes.
 *
 * Threads: loop thread. Every envelope that passed proto/wire.c comes here
 * from the transport, through the `received` callback node.c gives it at
 * open; one table says, per message kind, which part handles it,
 * whether the sender must already be a member (a stranger's message is
 * counted as a drop instead), and whether the message counts as proof that
 * its sender is alive. Update chunks, acks and snapshot chunks count: on a
 * slow uplink a member's heartbeats queue behind them, and must not get it
 * declared dead. Refused messages are counted by kind (net/drops.c). The
 * sender is already the authenticated one (transport.c, access.c); starting
 * or stopping a run here, or being taken into one, needs that sender's key to
 * be an admin. */
#include "daemon/internal.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/error.h"
#include "daemon/base/log.h"

typedef void (*handler_fn)(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                           size_t bytes);

typedef struct {
  handler_fn handle;
  bool member_only; /* a message from a node we do not know is dropped */
  bool liveness;    /* a member's message of this kind shows it is alive */
  const char *stranger; /* why a stranger's message is dropped (NULL: counted silently) */
} route_t;

static const route_t routes[] = {
    [TRAIND__ENVELOPE__BODY_HELLO] = {td__on_hello, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_WELCOME] = {td__on_welcome, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_HEARTBEAT] = {td__on_heartbeat, true, false, NULL},
    [TRAIND__ENVELOPE__BODY_LEAVE] = {td__on_leave, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_RUN_START] = {td__on_run_start, true, false,
                                          "run start from an unknown node"},
    [TRAIND__ENVELOPE__BODY_RUN_STOP] = {td__on_run_stop, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_RUN_REFUSED] = {td__on_run_refused, true, false,
                                            "run refusal from an unknown node"},
    [TRAIND__ENVELOPE__BODY_UPDATE] = {td__on_update, false, true, NULL},
    [TRAIND__ENVELOPE__BODY_ACK] = {td__on_ack, false, true, NULL},
    [TRAIND__ENVELOPE__BODY_EVAL_REPORT] = {td__on_eval_report, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST] = {td__on_snapshot_request, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK] = {td__on_snapshot_chunk, false, true, NULL},
    [TRAIND__ENVELOPE__BODY_STATE_HASH] = {td__session_on_state_hash, false, false, NULL},
    [TRAIND__ENVELOPE__BODY_ROUND_CLOSE] = {td__session_on_round_close, true, true,
                                            "round close from an unknown node"},
    [TRAIND__ENVELOPE__BODY_UPDATE_REQUEST] = {td__session_on_update_request, true, false,
                                               "update request from an unknown node"},
    /* records are checked one by one against the admin keys listed here */
    [TRAIND__ENVELOPE__BODY_ADMISSIONS] = {td__on_admissions, false, false, NULL},
    /* join requests and grants travel only on an invite's connection (transport.c) */
};

/* Run starts and stops are for admin keys; an admission of another node
 * into our run is for a member of that run. */
static bool permitted(td__node_t *n, const Traind__Envelope *env) {
  const char *what = NULL;
  if (env->body_case == TRAIND__ENVELOPE__BODY_RUN_START) {
    const Traind__RunStart *rs = env->run_start;
    if (rs->join_round > 0 && rs->joiner != n->node_id) {
      td__session_t *s = td__session_of(n, env->run_id);
      if (s == NULL || td__session_member(s, env->sender) != TD_MEMBERS_MAX ||
          !td__access_secure(n->access))
        return true; /* join.c drops it if we do not run that run */
      what = "an admission into this node's run from a node outside it";
    } else if (!td__access_may_run(n->access, env->sender)) {
      what = "a run start from a key without admin";
    }
  } else if (env->body_case == TRAIND__ENVELOPE__BODY_RUN_STOP &&
             !td__access_may_run(n->access, env->sender)) {
    what = "a run stop from a key without admin";
  }
  if (what == NULL)
    return true;
  /* counted here, logged on its own budget: a flood of failed handshakes
   * must not hide who tried to start or stop a run */
  td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
  uint64_t k = n->drops.count[TD__DROP_FORBIDDEN];
  if (td__drop_should_log(k))
    td_log_warn("refused %s (node %016" PRIx64 "; trainctl allow --admin KEY grants it; "
                "refused so far: %" PRIu64 ")", what, env->sender, k);
  return false;
}

void td__dispatch(td__node_t *n, const Traind__Envelope *env, size_t bytes) {
  if (env->sender == 0 || env->sender == n->node_id) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "message with a bad sender id");
    return;
  }
  td__link_t *l = td__link_find(n->net, env->sender);
  size_t kind = (size_t)env->body_case;
  const route_t *r = kind < sizeof routes / sizeof routes[0] ? &routes[kind] : NULL;
  if (r == NULL || r->handle == NULL)
    return; /* wire.c refuses messages without a body */
  bool member = td_members_find(n->members, env->sender) != NULL;
  if (r->member_only && !member) {
    td__drop(&n->drops, TD__DROP_NOT_MEMBER, r->stranger);
    return;
  }
  if (!permitted(n, env))
    return;
  if (r->liveness && member)
    td__gossip_heard(n, env->sender, NULL);
  r->handle(n, env, l, bytes);
}
