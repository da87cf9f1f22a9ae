/* reconcile.c: anchor reconciliation on the loop thread.
 *
 * Threads: loop thread. Every `reconcile` rounds and after the last
 * (sync/overlap, lossy codec) the compute thread posts anchor - init; it is
 * encoded in fp16 and the members' messages are collected
 * (scheduler/recon.h). Mesh: pushed to every member of that round over the
 * bulk class (transfer.c). Through a hub (reconcile_via; auto when the
 * uplinks sent with that round's updates make it faster): pushed to the hub
 * only, which sends the fp32 mean back to those that asked. A message that
 * stops growing for TD__RECON_STALL_S is asked for again from its offset (a
 * member waiting on a hub asks every member once the hub's expected time has
 * passed); after round_timeout the mean goes out with the messages that
 * came. The compute thread moves its anchor by mean - own. Under a robust
 * aggregate the anchors are combined by the run's rule, always over the mesh
 * (td_recon_set_rule): a member whose anchor it refuses is logged and
 * recorded (anchor_outlier). */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "scheduler/recon.h"

/* Stalled messages asked again per heartbeat, at most. */
#define MAX_STALLS_PER_TICK 8
/* A member waits this many times the hub's expected time before asking the members. */
#define HUB_PATIENCE 2.0

struct td__reconcile {
  td__session_t *s;
  td_recon_t *recon;
  float *mean;
  uint64_t reconciled, partial, via_hub, as_hub;
};

int td__reconcile_open(td__reconcile_t **out, td__session_t *s) {
  *out = NULL;
  if (!td_runspec_reconciles(&s->spec))
    return 0;
  td__reconcile_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return TD_ENOMEM;
  r->s = s;
  *out = r;
  int rc = td_recon_open(&r->recon, td_run_layout(s->run));
  if (rc == 0 && (r->mean = malloc(td_run_numel(s->run) * sizeof(float))) == NULL)
    rc = TD_ENOMEM;
  if (rc == 0) { /* a robust run's rule holds for the anchors too */
    td_agg_spec_t agg;
    td_runspec_agg(&s->spec, &agg);
    td_recon_set_rule(r->recon, &agg);
  }
  return rc;
}

void td__reconcile_close(td__reconcile_t **self_p) {
  td__reconcile_t *r = *self_p;
  if (r == NULL)
    return;
  *self_p = NULL;
  td_recon_close(&r->recon);
  free(r->mean);
  free(r);
}

void td__reconcile_stats(const td__reconcile_t *r, td__run_stats_t *out) {
  out->reconciled = r ? r->reconciled : 0;
  out->reconciled_partial = r ? r->partial : 0;
  out->reconciled_via_hub = r ? r->via_hub : 0;
  out->reconciled_as_hub = r ? r->as_hub : 0;
}

static void serve(td__session_t *s, td__link_t *l, const uint8_t *msg, size_t len,
                  uint64_t round, uint64_t offset) {
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = round;
  tmpl.reconcile = true;
  td__xfer_serve(s, l, msg, len, offset, &tmpl, false);
}

/* We are the hub of t->round: the mean goes back to those that asked. */
static unsigned send_mean(td__reconcile_t *r, const td_recon_taken_t *t) {
  td__session_t *s = r->s;
  const uint8_t *msg;
  size_t len;
  unsigned sent = 0;
  if (td_recon_encode_mean(r->recon, r->mean, &msg, &len) != 0)
    return 0;
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = t->round;
  tmpl.reconcile = true;
  tmpl.mean_of = t->used;
  tmpl.mean_expected = t->expected;
  for (size_t i = 0; i < s->n_members; i++) {
    td__link_t *l = (t->want_mean >> i & 1) && td_members_reachable(s->node->members, s->members[i])
                        ? td__link_find(s->node->net, s->members[i])
                        : NULL;
    if (l != NULL) {
      td__xfer_serve(s, l, msg, len, 0, &tmpl, false);
      sent++;
    }
  }
  return sent;
}

static void deliver(td__reconcile_t *r) {
  td__session_t *s = r->s;
  td_recon_taken_t t;
  while (td_recon_take(r->recon, td_clock_mono_s(), s->spec.round_timeout, r->mean, &t)) {
    char via[64] = "";
    if (t.hub != TD_RECON_MESH) {
      uint64_t id = t.hub < s->n_members ? s->members[t.hub] : 0;
      snprintf(via, sizeof via, ", mean from hub %016" PRIx64, id);
      r->via_hub++;
    } else if (t.want_mean != 0) {
      snprintf(via, sizeof via, ", hub: mean sent to %u", send_mean(r, &t));
      r->as_hub++;
    }
    for (size_t i = 0; i < s->n_members && t.refused != 0; i++)
      if (t.refused >> i & 1) {
        td_log_warn("round %" PRIu64 ": the anchor of %016" PRIx64 " is refused by the "
                    "run's aggregate rule (reconciliation)", t.round, s->members[i]);
        td__ledger_event(s->node->ledger, "anchor_outlier",
                         "%016" PRIx64 " round %" PRIu64 ": anchor refused", s->members[i],
                         t.round);
      }
    td_run_reconciled(s->run, t.round, r->mean);
    r->reconciled++;
    if (t.used < t.expected) {
      r->partial++;
      td_log_warn("round %" PRIu64 ": anchors reconciled from %u of %u members (timeout)%s",
                  t.round, t.used, t.expected, via);
    } else {
      td_log_info("round %" PRIu64 ": anchors of %u members reconciled%s", t.round, t.used, via);
    }
    td__ledger_event(s->node->ledger, "reconciled", "round %" PRIu64 ": %u of %u anchors%s",
                     t.round, t.used, t.expected, via);
  }
}

void td__reconcile_own(td__session_t *s, td_run_event_t *ev) {
  td__reconcile_t *r = s->recon;
  uint64_t expected = 0, round = ev->round;
  double uplink[TD_RECON_MAX_MEMBERS] = {0};
  for (size_t i = 0; i < s->n_members && i < TD_RECON_MAX_MEMBERS; i++) {
    bool self = s->members[i] == s->node->node_id;
    if (self ? s->since[i] <= round : td__session_takes_part(s, i, round))
      expected |= (uint64_t)1 << i;
    /* the figures every member got with this round's updates: one plan for all */
    if (self && s->own[round % TD__RING].round == round)
      uplink[i] = s->own[round % TD__RING].uplink;
    else if (!self && s->peer_report[i][round % TD__RING].round == round)
      uplink[i] = s->peer_report[i][round % TD__RING].uplink;
  }
  const uint8_t *msg;
  size_t len;
  char why[256];
  int rc = r == NULL ? TD_EINVAL
                     : td_recon_own(r->recon, round, ev->blob, s->rank, expected,
                                    td_clock_mono_s(), &msg, &len, why, sizeof why);
  if (rc != 0) { /* the compute thread must not wait for it: its own mean, no move */
    td_log_warn("round %" PRIu64 ": no anchor reconciliation: %s", round,
                r == NULL ? "not set up" : why);
    td_run_reconciled(s->run, round, ev->blob);
  }
  free(ev->blob);
  ev->blob = NULL;
  if (rc != 0)
    return;
  double hub_s;
  td_recon_via_t via = td_recon_robust(r->recon) ? TD_RECON_VIA_MESH /* no hub on trust */
                                                 : (td_recon_via_t)s->spec.reconcile_via_kind;
  size_t hub = td_recon_plan(uplink, expected, via, len, &hub_s);
  td__link_t *hl = hub != TD_RECON_MESH && hub != s->rank
                       ? td__link_find(s->node->net, s->members[hub])
                       : NULL;
  if (hl != NULL) { /* to the hub only; the others' messages come only if it fails */
    Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
    tmpl.round = round;
    tmpl.reconcile = true;
    tmpl.to_hub = true;
    td__xfer_serve(s, hl, msg, len, 0, &tmpl, false);
    td_recon_quiet(r->recon, round, td_clock_mono_s(), HUB_PATIENCE * hub_s);
    td_log_debug("round %" PRIu64 ": anchor to hub %016" PRIx64 " (expected %.2f s)", round,
                 s->members[hub], hub_s);
  } else if (hub == TD_RECON_MESH || hub != s->rank) {
    uint64_t peers[TD_MEMBERS_MAX];
    size_t k = td__session_peers(s, round, peers);
    for (size_t i = 0; i < k; i++) {
      td__link_t *l = td__link_find(s->node->net, peers[i]);
      if (l != NULL)
        serve(s, l, msg, len, round, 0);
    }
  } /* else: we are the hub; the members' messages come to us */
  deliver(r);
}

void td__reconcile_request(td__session_t *s, td__link_t *l, const Traind__SnapshotRequest *rq) {
  const uint8_t *msg;
  size_t len;
  if (s->recon == NULL || !td_recon_own_message(s->recon->recon, rq->round, &msg, &len) ||
      rq->offset >= len) {
    td__drop(&s->node->drops, TD__DROP_WRONG_RUN, "reconciliation request for a round we do not hold");
    return;
  }
  serve(s, l, msg, len, rq->round, rq->offset);
}

void td__reconcile_chunk(td__session_t *s, const Traind__Envelope *env) {
  const Traind__SnapshotChunk *ch = env->snapshot_chunk;
  td__reconcile_t *r = s->recon;
  size_t mi = td__session_member(s, env->sender);
  if (r == NULL || mi == TD_MEMBERS_MAX) {
    td__drop(&s->node->drops, TD__DROP_WRONG_RUN, "reconciliation chunk outside our run");
    return;
  }
  td_recon_result_t res;
  char why[256];
  double now = td_clock_mono_s();
  int rc = ch->mean_of > 0
               ? td_recon_mean_chunk(r->recon, ch->round, mi, ch->offset, ch->total_bytes,
                                     ch->payload.data, ch->payload.len, ch->mean_of,
                                     ch->mean_expected, now, &res, why, sizeof why)
               : td_recon_chunk(r->recon, ch->round, mi, ch->offset, ch->total_bytes,
                                ch->payload.data, ch->payload.len, ch->to_hub, now, &res, why,
                                sizeof why);
  if (rc == TD_EPROTO) {
    td__drop(&s->node->drops, TD__DROP_MALFORMED, why);
    return;
  }
  if (rc != 0 || res == TD_RECON_REJECTED)
    td__drop(&s->node->drops, TD__DROP_REJECTED, rc != 0 ? td_strerror(rc) : why);
  else if (res == TD_RECON_DUPLICATE || res == TD_RECON_LATE)
    td__drop(&s->node->drops, TD__DROP_DUPLICATE, NULL);
  else if (res == TD_RECON_AHEAD)
    td__drop(&s->node->drops, TD__DROP_AHEAD, NULL);
  deliver(r);
}

/* Heartbeat: ask again for messages that stopped growing; time out rounds. */
void td__reconcile_tick(td__session_t *s) {
  td__reconcile_t *r = s->recon;
  if (r == NULL)
    return;
  td_recon_stall_t st[MAX_STALLS_PER_TICK];
  size_t k = td_recon_stalled(r->recon, td_clock_mono_s(), TD__RECON_STALL_S, st,
                              MAX_STALLS_PER_TICK);
  for (size_t i = 0; i < k; i++) {
    if (st[i].member >= s->n_members || !td_members_reachable(s->node->members, s->members[st[i].member]))
      continue;
    td__link_t *l = td__link_find(s->node->net, s->members[st[i].member]);
    if (l != NULL)
      td__xfer_request(s, l, st[i].round, st[i].offset, false, true);
  }
  deliver(r);
}
