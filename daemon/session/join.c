/* join.c: late join: taking a node into a running run, and joining one.
 *
 * Threads: loop thread. A node that joins the cluster while a run is going
 * (trainctl join) is admitted by the run member with the lowest id among
 * those reachable: it picks round R = its open round + TD__JOIN_LEAD_ROUNDS
 * (no member has begun R yet: members are a round or two apart, and R - 1
 * is still ahead of every compute thread) and sends RunStart{members +
 * joiner, join_round R} to the members and to the joiner. From R on every
 * member expects the joiner's update, sends it its own and counts it in the
 * batch split. The admitter asks its compute thread for the anchor once it
 * holds round R - 1; the joiner fetches it (transfer.c: bulk, chunked,
 * resumable) and starts from it at R, its learning-rate schedule moved to
 * where the others are. A member that fell out of the run (comeback.c) is
 * taken back the same way, keeping its place in the member list. RunStart
 * without a join round and RunStop are handled here too: they start and stop
 * whole runs. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* Joiners asking for the seed before the compute thread posted it. */
#define MAX_WAITING 4

struct td__join {
  td__session_t *s;
  /* serving side: the anchor holding round `want`, posted by the compute
   * thread, and the requests that came before it */
  uint64_t want, blob_round, admitted;
  float *blob;
  struct { uint64_t peer, offset; } waiting[MAX_WAITING];
  size_t n_waiting;
  /* readmissions this node, rounds behind the admitter, judges when it
   * reaches the admitter's round (admission_refusal): by member index, the
   * join round (0: none) and the admitter */
  uint64_t deferred_round[TD_MEMBERS_MAX], deferred_sender[TD_MEMBERS_MAX];
};

int td__join_open(td__join_t **out, td__session_t *s) {
  td__join_t *j = calloc(1, sizeof *j);
  if (j == NULL)
    return TD_ENOMEM;
  j->s = s;
  *out = j;
  return 0;
}

void td__join_close(td__join_t **self_p) {
  td__join_t *j = *self_p;
  if (j == NULL)
    return;
  *self_p = NULL;
  free(j->blob);
  free(j);
}

void td__join_stats(const td__join_t *j, td__run_stats_t *out) {
  out->joins_admitted = j ? j->admitted : 0;
}

static void serve_seed(td__session_t *s, td__link_t *l, uint64_t offset) {
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = s->join->blob_round;
  td__xfer_serve(s, l, s->join->blob, td_run_anchor_bytes(s->run), offset, &tmpl, true);
}

void td__join_request(td__session_t *s, td__link_t *l, uint64_t peer,
                      const Traind__SnapshotRequest *rq) {
  td__join_t *j = s->join;
  if (rq->offset >= td_run_anchor_bytes(s->run) || rq->round == 0 ||
      (rq->round != j->blob_round && rq->round != j->want)) {
    td__drop(&s->node->drops, TD__DROP_WRONG_RUN, "join snapshot request for a round we do not hold");
  } else if (j->blob != NULL && rq->round == j->blob_round) {
    serve_seed(s, l, rq->offset);
  } else {
    size_t i = 0;
    while (i < j->n_waiting && j->waiting[i].peer != peer)
      i++;
    if (i < MAX_WAITING) {
      j->waiting[i].peer = peer;
      j->waiting[i].offset = rq->offset;
      if (i == j->n_waiting)
        j->n_waiting++;
    }
  }
}

/* The compute thread posted the anchor a joiner starts from: serve waiters. */
void td__join_anchor(td__session_t *s, td_run_event_t *ev) {
  td__join_t *j = s->join;
  free(j->blob);
  j->blob = ev->blob;
  ev->blob = NULL;
  j->blob_round = ev->round;
  for (size_t i = 0; i < j->n_waiting; i++) {
    td__link_t *l = td__link_find(s->node->net, j->waiting[i].peer);
    if (l != NULL)
      serve_seed(s, l, j->waiting[i].offset);
  }
  j->n_waiting = 0;
}

/* Take `id` into the run from round `from`: a new member at the end of the
 * list, or a member that comes back (comeback.c) in its old place, so its
 * rank and data partition stay its own; its link codec starts over, like its
 * decoder on the other end. */
static void add_member(td__session_t *s, uint64_t id, uint64_t from) {
  size_t i = td__session_member(s, id);
  bool back = i != TD_MEMBERS_MAX;
  if (back) {
    if (id == s->node->node_id)
      return;
    td__outbox_reset_member(s->outbox, i);
    td__link_t *l = td__link_find(s->node->net, id);
    if (l != NULL)
      td__link_restart(s->node->net, l);
    s->away[i] = false;
    s->staleness[i] = -1;
  } else {
    if (s->n_members >= TD_MEMBERS_MAX || s->n_members >= TD_ROUND_MAX_PEERS)
      return;
    i = s->n_members;
    s->members[i] = id;
    if (td__outbox_add_member(s->outbox, i) != 0) {
      td_log_warn("out of memory for the link codec of %016" PRIx64 ": not admitted", id);
      return;
    }
    s->n_members++;
  }
  s->since[i] = from;
  s->since_at[i] = td_clock_mono_s();
  s->admitted_in[i] = s->round + 1;
  memset(s->peer_report[i], 0, sizeof s->peer_report[i]);
  if (back && s->round < from) /* it holds no update of a round before `from`: do not wait */
    td__rounds_forget_peer(s, id);
  /* from R on the batch is split evenly again, until the joiner has measured;
   * the rounds before R keep the plan they had (rounds.c's gather switches at
   * R: this member may take the admission in a round before or after another
   * member does, and the weights of a round must not depend on that) */
  unsigned k = (unsigned)s->n_members;
  memset(s->plan_join, 0, sizeof s->plan_join);
  for (size_t m = 0; m < s->n_members; m++)
    s->plan_join[m] = td_run_split_batch(s->spec.batch, (unsigned)m, k);
  if (s->plan_join_from == 0 || from < s->plan_join_from)
    s->plan_join_from = from;
  td_run_set_nodes(s->run, from, k);
  td__verify_at(s, from); /* every node checks that it starts from the members' state */
  td_run_set_batch(s->run, from, s->plan_join[s->rank]);
  td__ledger_event(s->node->ledger, back ? "member_back" : "member_added",
                   "%016" PRIx64 " %s run %016" PRIx64 " at round %" PRIu64, id,
                   back ? "is back in" : "joins", s->run_id, from);
  td_log_info("peer %016" PRIx64 " %s the run at round %" PRIu64 " (%u nodes)", id,
              back ? "is back in" : "joins", from, k);
}

/* A member whose newest update this node recorded is of round s->round -
 * (rounds - 1) or later takes part. The admitter uses 3, a receiver 2: a
 * receiver one round behind the admitter still accepts what it decided. */
#define ADMITTER_RECENT_ROUNDS 3
#define RECEIVER_RECENT_ROUNDS 2
/* A readmission is deferred (admission_refusal) only from an admitter at
 * most this many rounds ahead. */
#define DEFER_MAX_ROUNDS (2 * TD__JOIN_LEAD_ROUNDS + 2)

static bool trained_lately(const td__session_t *s, size_t mi, uint64_t rounds) {
  return s->recorded_round[mi] > 0 && s->recorded_round[mi] + rounds > s->round;
}

/* A member whose readmission this node has deferred, that says in its own
 * heartbeats that it is at its join round or past it (it restarted and
 * started there), and that has no update of the open round here: the open
 * round does not wait for it, since it holds no update of a round before its
 * join round (the admitter already stopped waiting; waiting here would keep
 * this node from ever reaching the round it judges in). Its heartbeats are
 * its own, so an admitter that readmits a member that still trains cannot
 * make anyone stop waiting for it. */
static bool stale_deferred(const td__session_t *s, size_t mi) {
  uint64_t from = s->join->deferred_round[mi];
  return from != 0 && s->heard_round[mi] >= from && s->recorded_round[mi] < s->round;
}

/* The member says in its own heartbeats that it is not in this run (it
 * restarted, or left it), and this node marked it away for that: whatever
 * this node still holds of its last updates came from before, so taking it
 * back forgets no update of a member that trains. An admitter cannot forge
 * another member's heartbeats. (A member killed while sending reaches the
 * survivors with different last rounds, so "the update of this round or the
 * last" alone split them over its readmission.) */
static bool said_it_left(td__node_t *n, const td__session_t *s, size_t mi) {
  const td_member_t *m = td_members_find(n->members, s->members[mi]);
  return s->away[mi] && m != NULL && m->reported && m->run_id != s->run_id;
}

void td__join_heard(td__session_t *s, size_t mi) {
  if (s->join != NULL && mi < s->n_members && stale_deferred(s, mi))
    td__rounds_forget_peer(s, s->members[mi]);
}

/* Run membership by rule (issue 37): why this member must not apply the
 * admission by `sender` of `joiner` into its run s from round `from`, or
 * NULL when it may. Every member judges from the same inputs (its
 * allowlist, the run's member list, who takes part, the joiner's own
 * heartbeats), so one voice can neither invent members nor push an honest
 * one out:
 *  - the joiner's key must be on this node's allowlist (no phantom ids);
 *  - the sender must be an admin key here, or the run's admitter: no member
 *    with a lower id takes part (join_tick's rule), the joiner aside (a
 *    member that comes back may be the lowest);
 *  - a member whose update of this round or the last this node holds takes
 *    part and is never "readmitted" (that would forget its updates), unless
 *    its own heartbeats say it left the run (said_it_left); the admitter
 *    itself waits until a member's last update is older by one round more
 *    (join_tick), so that members a round apart agree; `*defer` (when not
 *    NULL) is set instead while this node is before the round ahead of the
 *    join round: it judges again from the admitter's round (from -
 *    TD__JOIN_LEAD_ROUNDS) on, by when what it holds may be as old as the
 *    admitter's rule asks (an overlap run's members may be two rounds
 *    apart, and refusing at once split them), or the member's heartbeats may
 *    say it left;
 *  - at most one admission per member and round. */
static const char *admission_refusal(td__node_t *n, const td__session_t *s, uint64_t sender,
                                     uint64_t joiner, uint64_t from, size_t mi, bool *defer) {
  if (td__access_secure(n->access) && !td__access_known(n->access, joiner))
    return "names a node whose key is not on this node's allowlist";
  if (!td__access_is_admin(n->access, sender)) {
    for (size_t i = 0; i < s->n_members; i++) {
      uint64_t id = s->members[i];
      if (id >= sender || id == joiner)
        continue;
      if (id == n->node_id || td__session_takes_part((td__session_t *)s, i, 0))
        return "comes from a member that is not the run's admitter (a member with a lower id "
               "takes part) and has no admin key";
    }
  }
  if (mi != TD_MEMBERS_MAX && trained_lately(s, mi, RECEIVER_RECENT_ROUNDS) &&
      !said_it_left(n, s, mi)) {
    uint64_t decided = from > TD__JOIN_LEAD_ROUNDS ? from - TD__JOIN_LEAD_ROUNDS : 0;
    if (defer != NULL && from > s->round + 1 && decided <= s->round + DEFER_MAX_ROUNDS) {
      *defer = true;
      return NULL;
    }
    return "readmits a member that takes part in the run (this node holds its update of "
           "this round or the last)";
  }
  if (mi != TD_MEMBERS_MAX && s->admitted_in[mi] == s->round + 1)
    return "admits a member a second time in one round";
  return NULL;
}

/* Count (drop kind `forbidden`) and log an admission the rule refused; the
 * log is rate-limited per run, so each run names its first refusals. */
static void refuse_admission(td__node_t *n, td__session_t *s, uint64_t sender, uint64_t joiner,
                             const char *why) {
  td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
  uint64_t k = ++s->admissions_refused;
  if (td__drop_should_log(k))
    td_log_warn("refused an admission of %016" PRIx64 " into run %016" PRIx64 " from %016" PRIx64
                ": it %s (refused in this run so far: %" PRIu64 ")", joiner, s->run_id, sender,
                why, k);
}

/* A round began: judge the readmissions deferred until this node is one
 * round behind the round their admitter decided in (admission_refusal). */
void td__join_round_begun(td__session_t *s) {
  td__join_t *j = s->join;
  for (size_t mi = 0; j != NULL && mi < s->n_members; mi++) {
    uint64_t from = j->deferred_round[mi];
    if (from == 0)
      continue;
    if (s->round + 1 + TD__JOIN_LEAD_ROUNDS < from) {
      if (stale_deferred(s, mi))
        td_round_forget_peer(s->collector, s->members[mi]); /* rounds.c closes when it may */
      continue;
    }
    uint64_t id = s->members[mi];
    if (from <= s->round || s->out[mi]) {
      j->deferred_round[mi] = 0;
      td_log_warn("readmission of %016" PRIx64 " at round %" PRIu64 " no longer fits this "
                  "node's run (round %" PRIu64 "): dropped", id, from, s->round);
      continue;
    }
    /* until the round before its join round the member's heartbeats may yet
     * say it left: deferred again while they do not */
    bool again = false;
    const char *why = admission_refusal(s->node, s, j->deferred_sender[mi], id, from, mi, &again);
    if (again)
      continue;
    j->deferred_round[mi] = 0;
    if (why != NULL)
      refuse_admission(s->node, s, j->deferred_sender[mi], id, why);
    else
      add_member(s, id, from);
  }
}

/* RunStart with join_round: as a member, take the joiner in; as the joiner,
 * start the run from join_round. */
static void on_admission(td__node_t *n, const Traind__Envelope *env) {
  const Traind__RunStart *rs = env->run_start;
  size_t k = rs->n_members, at = k;
  for (size_t i = 0; i < k && i < TD_MEMBERS_MAX; i++)
    if (rs->members[i] == rs->joiner)
      at = i;
  /* a new joiner comes last; a member that comes back keeps its place */
  if (k < 2 || k > TD_MEMBERS_MAX || rs->joiner == 0 || at == k) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "run admission with a bad member list");
    return;
  }
  if (rs->joiner == n->node_id) {
    if (n->session != NULL) {
      if (n->session->run_id != env->run_id)
        td__drop(&n->drops, TD__DROP_WRONG_RUN, "admission into a run while running another");
      return; /* or a repeat of the admission we acted on */
    }
    char why[512] = "";
    if (td__session_start(n, env->run_id, rs->spec, rs->members, k, rs->join_round, env->sender,
                          false, why, sizeof why) != 0)
      td__session_refuse(n, env->run_id, rs->members, k, why);
    return;
  }
  td__session_t *s = td__session_of(n, env->run_id);
  if (s == NULL) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "admission into a run this node is not running");
    return;
  }
  size_t mi = td__session_member(s, rs->joiner);
  if (mi != TD_MEMBERS_MAX && s->out[mi]) { /* away too often (comeback.c): not taken back */
    td__drop(&n->drops, TD__DROP_FORBIDDEN, "admission of a member put out of the run");
    return;
  }
  if (mi != TD_MEMBERS_MAX && s->since[mi] >= rs->join_round && s->since[mi] != UINT64_MAX &&
      !s->away[mi])
    return; /* already in, or a repeat of the admission */
  /* the list must be ours (plus the joiner when it is new), or the members
   * would disagree */
  bool same = k == s->n_members + (mi == TD_MEMBERS_MAX) && (mi != TD_MEMBERS_MAX || at == k - 1);
  for (size_t i = 0; same && i < s->n_members; i++)
    same = rs->members[i] == s->members[i];
  if (!same || rs->join_round <= s->round) {
    td_log_warn("admission of %016" PRIx64 " at round %" PRIu64 " does not fit this node's run "
                "(round %" PRIu64 ", %zu members): ignored", rs->joiner, rs->join_round,
                s->round, s->n_members);
    td__drop(&n->drops, TD__DROP_WRONG_RUN, NULL);
    return;
  }
  bool defer = false;
  const char *why = admission_refusal(n, s, env->sender, rs->joiner, rs->join_round, mi, &defer);
  if (why != NULL) {
    refuse_admission(n, s, env->sender, rs->joiner, why);
    return;
  }
  if (defer) { /* judged again rounds later; the newest admission of a member counts */
    s->join->deferred_round[mi] = rs->join_round;
    s->join->deferred_sender[mi] = env->sender;
    uint64_t at = rs->join_round > TD__JOIN_LEAD_ROUNDS + 1
                      ? rs->join_round - TD__JOIN_LEAD_ROUNDS - 1 : 0;
    td_log_info("admission of %016" PRIx64 " at round %" PRIu64 " from %016" PRIx64 ": judged "
                "again from round %" PRIu64 " (by round %" PRIu64 ")", rs->joiner, rs->join_round,
                env->sender, at > s->round ? at : s->round + 1, rs->join_round - 1);
    if (stale_deferred(s, mi))
      td__rounds_forget_peer(s, rs->joiner);
    return;
  }
  add_member(s, rs->joiner, rs->join_round);
}

void td__on_run_start(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  const Traind__RunStart *rs = env->run_start;
  if (rs->join_round > 0) {
    on_admission(n, env);
    return;
  }
  td__session_t *s = td__session_of(n, env->run_id);
  if (s != NULL) { /* already running it; the same id with another spec is refused */
    if (rs->spec == NULL || strcmp(rs->spec, s->spec_text) != 0) {
      td__drop(&n->drops, TD__DROP_REUSED_RUN_ID, NULL);
      td_log_warn("refused a start of run %016" PRIx64 " (the run this node runs) with another "
                  "spec from %016" PRIx64, env->run_id, env->sender);
    }
    return;
  }
  char why[512] = "";
  if (td__session_start(n, env->run_id, rs->spec, rs->members, rs->n_members, 1, 0, false, why,
                        sizeof why) != 0)
    td__session_refuse(n, env->run_id, rs->members, rs->n_members, why);
}

void td__on_run_stop(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  td__session_t *s = td__session_of(n, env->run_id);
  if (s == NULL) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "stop for a run this node is not running");
    return;
  }
  td_log_info("run %016" PRIx64 " stopped by %016" PRIx64, s->run_id, env->sender);
  td_run_stop(s->run);
}

/* Heartbeat (and comeback.c, when a member falls out): admit one idle, alive
 * node: a member that fell out of the run first, else one not in it yet. */
void td__join_tick(td__session_t *s) {
  td__node_t *n = s->node;
  td__join_t *j = s->join;
  if (!s->ready || s->spec.mode_kind == TD_MODE_ASYNC || s->round <= s->first_round ||
      s->round + TD__JOIN_LEAD_ROUNDS + 1 > s->rounds ||
      (j->want != 0 && j->blob_round != j->want))
    return;
  for (size_t i = 0; i < s->n_members; i++) /* the lowest id among those in the run admits */
    if (s->members[i] < n->node_id && td__session_takes_part(s, i, 0))
      return;
  uint64_t joiner = 0;
  for (size_t i = 0; i < s->n_members && joiner == 0; i++) { /* members that come back first */
    td_member_t *m = s->away[i] ? td_members_find(n->members, s->members[i]) : NULL;
    if (m != NULL && m->state == TD_PEER_ALIVE && m->reported && m->run_id == 0 &&
        m->ended_run != s->run_id && !s->ended_by[i] && /* it ended the run: never back in */
        !trained_lately(s, i, ADMITTER_RECENT_ROUNDS)) /* the members would refuse it */
      joiner = m->node_id;
  }
  bool full = s->n_members >= TD_MEMBERS_MAX || s->n_members >= TD_ROUND_MAX_PEERS;
  for (size_t i = 0; !full && i < td__transport_count(n->net) && joiner == 0; i++) {
    uint64_t peer = td__link_peer(td__transport_at(n->net, i));
    td_member_t *m = peer ? td_members_find(n->members, peer) : NULL;
    if (m != NULL && m->state == TD_PEER_ALIVE && m->reported && m->run_id == 0 &&
        m->ended_run != s->run_id && td__session_member(s, m->node_id) == TD_MEMBERS_MAX)
      joiner = m->node_id;
  }
  if (joiner == 0)
    return;
  uint64_t R = s->round + TD__JOIN_LEAD_ROUNDS;
  uint64_t members[TD_MEMBERS_MAX];
  size_t k = s->n_members;
  memcpy(members, s->members, k * sizeof *members);
  if (td__session_member(s, joiner) == TD_MEMBERS_MAX)
    members[k++] = joiner;
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = s->spec_text;
  rs.members = members;
  rs.n_members = k;
  rs.join_round = R;
  rs.joiner = joiner;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = s->run_id;
  for (size_t i = 0; i < rs.n_members; i++) {
    td__link_t *l = members[i] != n->node_id ? td__link_find(n->net, members[i]) : NULL;
    if (l != NULL)
      td__link_send(n->net, l, &env);
  }
  add_member(s, joiner, R);
  j->admitted++;
  free(j->blob);
  j->blob = NULL;
  j->blob_round = 0;
  j->want = R - 1;
  td_run_want_anchor(s->run, R - 1);
}
