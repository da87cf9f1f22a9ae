/* comeback.c: members that fall out of their run, and how they come back.
 *
 * Threads: loop thread. A member falls out of a run when its process dies
 * (kill -9, a power cut) and is started again on its data directory, or when
 * it stops for longer than the failure detector waits (SIGSTOP, a suspended
 * laptop) while the others carry on. Either way it comes back through late
 * join (join.c): the member that admits takes it in again from a later round
 * R, in its old place in the member list (so its rank and data partition stay
 * its own), and it starts from the consensus state of round R - 1 (the
 * anchor, and the outer momentum when the run has one) fetched from the
 * admitter. That state is the run itself: every member of a sync or overlap
 * run holds it after each round. The checkpoint in the returning node's own
 * ledger is older by every round it missed, and starting from it would put
 * the node off the consensus, so it is not read here: checkpoints stay for
 * people (and a run whose every node died stays 'interrupted').
 *
 * This file decides who is out and when:
 *  - start-up: runs the ledger left 'running' (the process died in them)
 *    become 'interrupted', with a run_interrupted event naming the last round
 *    recorded; the newest is the run this node expects to be taken back into;
 *  - heartbeats from the members: one that says it is idle (it restarted),
 *    in another run, or more than TD__BEHIND_ROUNDS behind (it was paused;
 *    more with topology gossip or groups, whose members drift apart) is
 *    *away*: no round waits for it, no update or plan counts it, until it is
 *    readmitted, and the admitter takes it back at once (td__join_tick);
 *  - heartbeats that put this node itself that far behind (it was the one
 *    paused): it abandons its session without ending the run, reports idle,
 *    and is taken back like a restarted node;
 *  - a member marked away more than TD__AWAY_TIMES_MAX times with no update
 *    of its own in between (one that says it is idle and never trains, taken
 *    back and away in a loop) is put out of the run for its remainder: never
 *    readmitted, never waited for. A member that comes back and trains (a
 *    restarted node) starts the count over with its first update (inbox.c);
 *  - readmission: a run_rejoined event records the gap (the rounds missed),
 *    and the ledger's run is 'running' again, its rounds continuing.
 * Like any late joiner, the returning node must have started its session
 * (from the admitter's RunStart) before the members' first update of round
 * R reaches it: one that comes earlier is dropped as for a run it does not
 * run, and round R then waits for its deadline. The 3 lead rounds leave it
 * that long; runs whose rounds last a few milliseconds can lose the race. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* Interrupted runs named one by one in the ledger at start-up; more are only counted. */
#define MAX_NAMED 8

typedef struct {
  size_t count;
  struct {
    uint64_t run_id, last_round;
  } runs[MAX_NAMED];
} interrupted_t;

static void note_interrupted(uint64_t run_id, uint64_t last_round, void *user) {
  interrupted_t *it = user;
  if (it->count < MAX_NAMED) {
    it->runs[it->count].run_id = run_id;
    it->runs[it->count].last_round = last_round;
  }
  it->count++;
}

void td__comeback_start(td__node_t *n) {
  interrupted_t it = {0};
  int rc = td__ledger_runs_interrupt(n->ledger, td_clock_wall_s(), note_interrupted, &it);
  if (rc != 0)
    td_log_warn("cannot mark the runs this node stopped in as interrupted: %s", td_strerror(rc));
  for (size_t i = 0; i < it.count && i < MAX_NAMED; i++) {
    td_log_warn("run %016" PRIx64 " was running when this node stopped (last round %" PRIu64
                "): marked interrupted", it.runs[i].run_id, it.runs[i].last_round);
    td__ledger_event(n->ledger, "run_interrupted",
                     "run %016" PRIx64 " interrupted after round %" PRIu64
                     ": this node stopped during it", it.runs[i].run_id, it.runs[i].last_round);
  }
  if (it.count > MAX_NAMED)
    td__ledger_event(n->ledger, "run_interrupted", "%zu more runs interrupted",
                     it.count - MAX_NAMED);
  if (it.count > 0) { /* the newest: the others ended long ago */
    n->rejoin.run_id = it.runs[0].run_id;
    n->rejoin.last_round = it.runs[0].last_round;
  }
}

bool td__comeback_fell_behind(size_t others, size_t ahead) {
  return ahead >= 2 && ahead * 2 > others + 1;
}

/* How far behind a member may be before it counts as fallen behind: with
 * topology gossip or groups there is no barrier across the run, only each
 * node's wait for its round's partners, and the members drift apart by up to
 * the rounds news takes to cross the run (at most ceil(log2 N) hops of the
 * exponential graph, or the grid's dimensions), so the bound grows by twice
 * that. */
static uint64_t behind_rounds(const td__session_t *s) {
  if (!td_runspec_mixes(&s->spec))
    return TD__BEHIND_ROUNDS;
  uint64_t hops = 0;
  while (((size_t)1 << hops) < s->n_members)
    hops++;
  return TD__BEHIND_ROUNDS + 2 * hops;
}

/* This node is the one left behind only when more than half of the run's
 * members, this node counted (with those not refused or put out, already in
 * by our round), last said they are that far ahead, and more than one of
 * them: the node's own round counts against the claims as a member's does.
 * So a single member's claim, true or not, cannot push an honest node out of
 * its run (in a run of two, nothing can: the node goes on at its deadlines),
 * and neither can colluders who are half of the run or fewer (two of four:
 * the honest two stay), while a node that all the others, or a majority of
 * the run, left behind still leaves and comes back. */
static bool most_are_ahead(const td__session_t *s) {
  size_t others = 0, ahead = 0;
  for (size_t i = 0; i < s->n_members; i++) {
    if (s->members[i] == s->node->node_id || s->since[i] == UINT64_MAX || s->since[i] > s->round)
      continue;
    others++;
    if (s->heard_round[i] > s->round + behind_rounds(s))
      ahead++;
  }
  return td__comeback_fell_behind(others, ahead);
}

/* Member i was marked away once more than TD__AWAY_TIMES_MAX times without
 * an update in between: out of the run for its remainder, never readmitted,
 * and no round waits for it. */
static void put_out(td__session_t *s, size_t i, uint64_t at) {
  td__node_t *n = s->node;
  s->out[i] = true;
  s->away[i] = false;
  s->since[i] = UINT64_MAX;
  td_log_warn("round %" PRIu64 ": member %016" PRIx64 " was away %u times without an update: "
              "out of the run for its remainder", at, s->members[i], s->away_times[i]);
  td__ledger_event(n->ledger, "member_out", "%016" PRIx64 " was away %u times without an "
                   "update: out of run %016" PRIx64 " from round %" PRIu64, s->members[i],
                   s->away_times[i], s->run_id, at);
  size_t used = strlen(s->refused);
  snprintf(s->refused + used, sizeof s->refused - used, "%snode %016" PRIx64 " put out: away %u "
           "times", used ? "; " : "", s->members[i], s->away_times[i]);
}

void td__comeback_heard(td__node_t *n, uint64_t peer, uint64_t run_id, uint64_t round) {
  td__session_t *s = n->session;
  size_t i = s != NULL ? td__session_member(s, peer) : TD_MEMBERS_MAX;
  if (i == TD_MEMBERS_MAX || peer == n->node_id || s->since[i] == UINT64_MAX)
    return;
  /* async members drift apart by design: only an idle one is out of the run */
  bool lockstep = s->spec.mode_kind != TD_MODE_ASYNC;
  if (run_id == s->run_id) {
    s->heard_round[i] = round;
    td__join_heard(s, i); /* a deferred readmission's member that restarted */
  }
  /* (a joiner, whose first round is still ahead, is ahead by design) */
  if (lockstep && s->ready && run_id == s->run_id && s->since[i] <= s->round &&
      round > s->round + behind_rounds(s) && most_are_ahead(s)) {
    char why[160];
    snprintf(why, sizeof why, "member %016" PRIx64 " is at round %" PRIu64 ", %" PRIu64
             " rounds ahead, as are most members", peer, round, round - s->round);
    td__session_abandon(n, why);
    return;
  }
  bool idle = run_id != s->run_id;
  if (s->away[i]) { /* fell behind, and now says it left: take it back */
    if (idle)
      td__join_tick(s);
    return;
  }
  /* judged from the round after its first one (every member of a run is
   * waited for in its first round), and not on a heartbeat it may have sent
   * before it heard of its (re)admission */
  uint64_t at = lockstep ? s->round : s->own_done; /* async does not open rounds */
  if (at <= (s->since[i] > 1 ? s->since[i] : 1) ||
      td_clock_mono_s() < s->since_at[i] + TD__AWAY_GRACE_BEATS * n->heartbeat_s)
    return;
  /* near the end a member that finished says it is idle while its last update
   * may still be on its way (on another connection than the heartbeat), and
   * nobody is taken back there any more: the deadline decides */
  if (lockstep && s->rounds > 0 && at + TD__JOIN_LEAD_ROUNDS + 1 > s->rounds)
    return;
  if (!idle && !(lockstep && round + behind_rounds(s) < s->round))
    return;
  s->away[i] = true;
  if (++s->away_times[i] > TD__AWAY_TIMES_MAX) {
    put_out(s, i, at);
    td__rounds_forget_peer(s, peer);
    return;
  }
  char state[64];
  if (idle)
    snprintf(state, sizeof state, "not in the run");
  else
    snprintf(state, sizeof state, "at round %" PRIu64, round);
  td_log_warn("round %" PRIu64 ": member %016" PRIx64 " is %s: not waited for until it is back",
              at, peer, state);
  td__ledger_event(n->ledger, "member_away", "%016" PRIx64 " is %s (run %016" PRIx64
                   " at round %" PRIu64 ")", peer, state, s->run_id, at);
  td__rounds_forget_peer(s, peer);
  if (n->session == s)
    td__join_tick(s); /* the admitter takes it back as soon as it says it is idle */
}
