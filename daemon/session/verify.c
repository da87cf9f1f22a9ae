/* verify.c: model-state agreement on the loop thread: the members compare
 * the hashes of their shared state and a node that differs is repaired.
 *
 * Threads: loop thread. After the outer step of a verify round the compute
 * thread posts its state hash and a copy of the state (run_verify.c); this
 * node sends the hash to every member of the run (StateHash) and collects
 * theirs. When every member that takes part in the round has answered, or
 * round_timeout after our own hash, the round is decided by the majority
 * rule of scheduler/agree.h: a hash held by more than half of the round's
 * voting members is agreed (a member that joined in that round, or is being
 * repaired, is judged but has no vote). Every member whose hash differs is
 * named (status, a state_diverged event); a round with no such majority is a
 * state_split and repairs nobody, unless the run's aggregate is the plain
 * mean: then the largest group's hash is taken (split_winner).
 *
 * When this node is the one that differs it repairs itself through the same
 * machinery a late joiner uses (transfer.c's chunks on the bulk class): it
 * asks every member to hash its state after a round P a few rounds ahead
 * (TD__JOIN_LEAD_ROUNDS, so no compute thread is past it) and tells its own
 * compute thread to wait after P. Once round P is decided it fetches the
 * state of P from the lowest-id member whose hash is the agreed one, hashes
 * what arrived and hands it to the compute thread only when it matches the
 * hash a majority of the members hold; a donor that serves anything else is
 * recorded and the next agreeing member is asked. So a member that lies
 * about its hash is outvoted, and one that lies with its state is caught
 * before anything is adopted. The own state of the newest verify round is
 * kept here until every member agreed on it, to serve such a repair.
 * `trainctl verify` asks for a verify round the same way (td__verify_ask). */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "scheduler/agree.h"

/* Rounds voted on at once (the oldest slot is reused). */
#define VOTE_SLOTS 4
/* A hash or request for a round this far from our open round is refused:
 * verify rounds are asked for TD__JOIN_LEAD_ROUNDS ahead, members are at
 * most two rounds apart. */
#define ROUND_WINDOW (2 * TD__JOIN_LEAD_ROUNDS + 2)

typedef struct {
  uint64_t round; /* 0: free */
  bool own, decided;
  double own_at; /* mono time our own hash came */
  uint8_t own_hash[TD_AGREE_HASH_BYTES];
  bool have[TD_MEMBERS_MAX];
  uint8_t hash[TD_MEMBERS_MAX][TD_AGREE_HASH_BYTES]; /* by member index */
} vote_t;

struct td__verify {
  td__session_t *s;
  vote_t votes[VOTE_SLOTS];
  /* our state of the newest verify round, kept while a member may fetch it;
   * the state of a round a member asked for (a repair's) is kept over newer
   * ones until ROUND_WINDOW rounds later, so that it is there to serve */
  float *state;
  uint64_t state_round, hold_round;
  size_t state_bytes;
  /* the last decided round, for status */
  td__verify_stats_t last;
  /* this node's own repair: round P, the agreed hash of P, the donor */
  uint64_t repair_round;
  bool fetching;
  /* by member index (TD_MEMBERS_MAX: this node): named diverged by the last
   * decided round that judged it; no vote until one finds it agreeing */
  bool diverged[TD_MEMBERS_MAX + 1];
  uint8_t repair_hash[TD_AGREE_HASH_BYTES];
  bool tried[TD_MEMBERS_MAX];
  uint64_t donor, received;
  uint8_t *buf;
  double last_progress;
};

int td__verify_open(td__verify_t **out, td__session_t *s) {
  td__verify_t *v = calloc(1, sizeof *v);
  if (v == NULL)
    return TD_ENOMEM;
  v->s = s;
  v->last.every = s->spec.verify_every;
  char why[sizeof v->last.off];
  if (!td_runspec_verifiable(&s->spec, why, sizeof why))
    snprintf(v->last.off, sizeof v->last.off, "%s", why);
  *out = v;
  return 0;
}

void td__verify_close(td__verify_t **self_p) {
  td__verify_t *v = *self_p;
  if (v == NULL)
    return;
  *self_p = NULL;
  free(v->state);
  free(v->buf);
  free(v);
}

void td__verify_stats(const td__verify_t *v, td__run_stats_t *out) {
  if (v != NULL) {
    out->verify = v->last;
    out->verify.repairing = v->repair_round;
  }
}

bool td__verify_pending(const td__verify_t *v, uint64_t round) {
  for (size_t k = 0; v != NULL && k < VOTE_SLOTS; k++)
    if (v->votes[k].round == round && v->votes[k].own && !v->votes[k].decided)
      return true;
  return false;
}

/* The vote of `round`; when there is none and `open`, a new one in the slot
 * of the oldest round. A peer's hash (own false) never takes the slot of a
 * vote our own hash still waits in: members could otherwise push our vote
 * out with hashes of rounds ahead. NULL when there is no such slot. */
static vote_t *vote_of(td__verify_t *v, uint64_t round, bool open, bool own) {
  vote_t *oldest = NULL;
  for (size_t k = 0; k < VOTE_SLOTS; k++) {
    vote_t *vt = &v->votes[k];
    if (vt->round == round)
      return vt;
    bool waiting = vt->own && !vt->decided;
    if ((own || !waiting) && (oldest == NULL || vt->round < oldest->round))
      oldest = vt;
  }
  if (!open || oldest == NULL)
    return NULL;
  memset(oldest, 0, sizeof *oldest);
  oldest->round = round;
  return oldest;
}

static bool in_window(const td__session_t *s, uint64_t round) {
  return round > 0 && round <= s->round + ROUND_WINDOW && round + ROUND_WINDOW >= s->round;
}

/* Send StateHash{round, hash} (hash NULL: a request) to every member in the run. */
static void send_hash(td__session_t *s, uint64_t round, const uint8_t *hash) {
  Traind__StateHash sh = TRAIND__STATE_HASH__INIT;
  sh.round = round;
  sh.hash.data = (uint8_t *)hash;
  sh.hash.len = hash != NULL ? TD_AGREE_HASH_BYTES : 0;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_STATE_HASH;
  env.state_hash = &sh;
  env.run_id = s->run_id;
  td__session_send_all(s, &env);
}

/* Ask every member (and our compute thread) to hash the state after
 * `round`. */
static void ask_round(td__session_t *s, uint64_t round) {
  td_run_want_verify(s->run, round);
  send_hash(s, round, NULL);
}

int td__verify_ask(td__session_t *s, uint64_t *round, char *why, size_t why_len) {
  if (!td_runspec_verifiable(&s->spec, why, why_len))
    return TD_EINVAL;
  if (!s->ready)
    return td_why(why, why_len, TD_EINVAL, "the run is still loading its data; ask again "
                  "once it trains (trainctl status)");
  uint64_t r = s->round + TD__JOIN_LEAD_ROUNDS;
  if (r > s->rounds)
    return td_why(why, why_len, TD_ERANGE, "the run ends at round %" PRIu64 ", too soon to "
                  "verify %d rounds ahead%s", s->rounds, TD__JOIN_LEAD_ROUNDS,
                  s->spec.verify_every > 0 ? " (its last round is verified anyway)" : "");
  ask_round(s, r);
  *round = r;
  return 0;
}

void td__verify_at(td__session_t *s, uint64_t round) {
  if (s->spec.verify_every > 0 && td_runspec_verifiable(&s->spec, NULL, 0))
    td_run_want_verify(s->run, round);
}

static void stop_repair(td__verify_t *v, const char *why) {
  td__session_t *s = v->s;
  if (v->repair_round == 0)
    return;
  td_log_warn("round %" PRIu64 ": state repair given up: %s", v->repair_round, why);
  td__ledger_event(s->node->ledger, "state_repair_failed", "%016" PRIx64 " round %" PRIu64
                   ": %s", s->node->node_id, v->repair_round, why);
  td_run_repair_cancel(s->run, v->repair_round);
  v->repair_round = 0;
  v->fetching = false;
  free(v->buf);
  v->buf = NULL;
}

/* This node differs at `round`: ask for round P's state hashes, and have
 * the compute thread wait after P for the members' state. */
static void start_repair(td__verify_t *v, uint64_t round, size_t holders, size_t members) {
  td__session_t *s = v->s;
  if (v->repair_round != 0)
    return; /* one at a time: the one under way ends with its own round */
  uint64_t p = s->round + TD__JOIN_LEAD_ROUNDS;
  if (p > s->rounds) {
    td_log_warn("round %" PRIu64 ": this node's state differs from %zu of %zu members, too "
                "near the end of the run to repair it", round, holders, members);
    return;
  }
  v->repair_round = p;
  memset(v->tried, 0, sizeof v->tried);
  td_run_want_repair(s->run, p);
  send_hash(s, p, NULL);
  td_log_warn("round %" PRIu64 ": this node's state differs from the one %zu of %zu members "
              "hold: fetching theirs of round %" PRIu64, round, holders, members, p);
  td__ledger_event(s->node->ledger, "state_repair", "%016" PRIx64 " round %" PRIu64 ": differs "
                   "from %zu of %zu members; fetching their state of round %" PRIu64,
                   s->node->node_id, round, holders, members, p);
}

/* Ask the next member that holds the agreed state of the repair round for it. */
static void next_donor(td__verify_t *v, const vote_t *vt) {
  td__session_t *s = v->s;
  size_t best = TD_MEMBERS_MAX;
  for (size_t i = 0; i < s->n_members; i++)
    if (vt->have[i] && !v->tried[i] && td__session_takes_part(s, i, 0) &&
        memcmp(vt->hash[i], v->repair_hash, TD_AGREE_HASH_BYTES) == 0 &&
        (best == TD_MEMBERS_MAX || s->members[i] < s->members[best]))
      best = i;
  td__link_t *l = best != TD_MEMBERS_MAX ? td__link_find(s->node->net, s->members[best]) : NULL;
  if (l == NULL) {
    stop_repair(v, "no member that holds the agreed state is left to fetch it from");
    return;
  }
  size_t bytes = td_run_anchor_bytes(s->run);
  if (v->buf == NULL && (v->buf = malloc(bytes)) == NULL) {
    stop_repair(v, "out of memory for the members' state");
    return;
  }
  v->tried[best] = true;
  v->fetching = true;
  v->donor = s->members[best];
  v->received = 0;
  v->last_progress = td_clock_mono_s();
  Traind__SnapshotRequest rq = TRAIND__SNAPSHOT_REQUEST__INIT;
  rq.round = v->repair_round;
  rq.repair = true;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST;
  env.snapshot_request = &rq;
  env.run_id = s->run_id;
  td__link_send(s->node->net, l, &env);
}

/* Whether member i (TD_MEMBERS_MAX: this node) votes on round r. Not when
 * it joined or came back at r: its state there grew from a copy of its
 * donor's, and the donor's vote counts once; nor while the last decided
 * round named it diverged and no later one found it agreeing: it is being
 * repaired. Both are judged all the same. Without this a donor that had
 * drifted (a killed member's last update reached some members only) and its
 * joiner, or two members under repair, tied the others 2 against 2 and
 * nobody was repaired. */
static bool votes_at(const td__verify_t *v, size_t i, uint64_t r) {
  const td__session_t *s = v->s;
  uint64_t from = i == TD_MEMBERS_MAX ? s->first_round : s->since[i];
  return (r <= 1 || from != r) && !v->diverged[i];
}

/* No hash has a majority of the round's members: in a run whose aggregate
 * is the plain mean, and when every voter answered (so every member decides
 * from the same hashes), the largest group of equal hashes is taken, and of
 * equally large groups the one holding the lowest member id. There a member
 * can already move the model as it likes with its update, so this gives a
 * liar no power it lacked; honest members part three ways when a member
 * killed in mid-send reached each with different rounds, and without this
 * none of them was repaired. Under a robust rule neither side gives way.
 * The index in hashes of a member of the group taken, or TD_AGREE_NONE. */
static size_t split_winner(const td__session_t *s, const uint8_t (*hashes)[TD_AGREE_HASH_BYTES],
                           const size_t *who, size_t k, size_t members, size_t *holders) {
  td_agg_spec_t agg;
  td_runspec_agg(&s->spec, &agg);
  if (agg.kind != TD_AGG_MEAN || agg.norm_bound > 0 || k != members || k < 2)
    return TD_AGREE_NONE;
  size_t best = TD_AGREE_NONE, best_n = 0;
  uint64_t best_low = 0;
  for (size_t j = 0; j < k; j++) {
    size_t same = 0;
    uint64_t low = UINT64_MAX;
    for (size_t l = 0; l < k; l++)
      if (memcmp(hashes[l], hashes[j], TD_AGREE_HASH_BYTES) == 0) {
        uint64_t id = who[l] == TD_MEMBERS_MAX ? s->node->node_id : s->members[who[l]];
        same++;
        low = id < low ? id : low;
      }
    if (same > best_n || (same == best_n && low < best_low)) {
      best = j;
      best_n = same;
      best_low = low;
    }
  }
  *holders = best_n;
  return best;
}

/* Round vt->round is decided: name who differs, and repair ourselves. */
static void decide(td__verify_t *v, vote_t *vt) {
  td__session_t *s = v->s;
  td__node_t *n = s->node;
  /* the voters' hashes first (k of them), then the others' (to kj); when
   * none of the round's members votes, all do */
  uint8_t hashes[TD_MEMBERS_MAX + 1][TD_AGREE_HASH_BYTES];
  size_t who[TD_MEMBERS_MAX + 1], k = 0, kj, members = 0;
  size_t judged[TD_MEMBERS_MAX + 1], nj = 0;
  bool any = votes_at(v, TD_MEMBERS_MAX, vt->round);
  for (size_t i = 0; i < s->n_members && !any; i++)
    any = td__session_takes_part(s, i, vt->round) && votes_at(v, i, vt->round);
  if (!any || votes_at(v, TD_MEMBERS_MAX, vt->round)) {
    memcpy(hashes[k], vt->own_hash, TD_AGREE_HASH_BYTES);
    who[k++] = TD_MEMBERS_MAX; /* ourselves */
    members++;
  } else {
    judged[nj++] = TD_MEMBERS_MAX;
  }
  for (size_t i = 0; i < s->n_members; i++) {
    if (!td__session_takes_part(s, i, vt->round))
      continue;
    if (any && !votes_at(v, i, vt->round)) {
      if (vt->have[i])
        judged[nj++] = i;
      continue;
    }
    members++;
    if (vt->have[i]) {
      memcpy(hashes[k], vt->hash[i], TD_AGREE_HASH_BYTES);
      who[k++] = i;
    }
  }
  kj = k;
  for (size_t j = 0; j < nj; j++) {
    memcpy(hashes[kj], judged[j] == TD_MEMBERS_MAX ? vt->own_hash : vt->hash[judged[j]],
           TD_AGREE_HASH_BYTES);
    who[kj++] = judged[j];
  }
  vt->decided = true;
  size_t holders = 0;
  size_t agreed = td_agree_decide((const uint8_t(*)[TD_AGREE_HASH_BYTES])hashes, k, members,
                                  &holders);
  td__verify_stats_t *last = &v->last;
  last->round = vt->round;
  last->members = members;
  last->answered = k;
  last->agree = holders;
  last->n_diverged = 0;
  last->checks++;
  char own[17];
  td_agree_short(vt->own_hash, own);
  bool tie = false;
  if (agreed == TD_AGREE_NONE) {
    agreed = split_winner(s, (const uint8_t(*)[TD_AGREE_HASH_BYTES])hashes, who, k, members,
                          &holders);
    tie = agreed != TD_AGREE_NONE;
    last->agree = holders;
  }
  if (agreed == TD_AGREE_NONE) {
    last->hash[0] = '\0';
    last->splits++;
    td_log_warn("round %" PRIu64 ": no state is held by a majority of the %zu members (%zu of "
                "them answered, at most %zu agree)", vt->round, members, k, holders);
    td__ledger_event(n->ledger, "state_split", "round %" PRIu64 ": no state held by a majority: "
                     "%zu of %zu members answered, at most %zu agree; ours %s", vt->round, k,
                     members, holders, own);
    if (vt->round == v->repair_round)
      stop_repair(v, "no state is held by a majority of the members");
    return;
  }
  const uint8_t *good = hashes[agreed];
  td_agree_short(good, last->hash);
  if (tie) {
    last->splits++;
    td_log_warn("round %" PRIu64 ": no state is held by a majority of the %zu members: the "
                "largest group's (%zu, with the lowest id) %s is taken (aggregate = mean)",
                vt->round, members, holders, last->hash);
    td__ledger_event(n->ledger, "state_split", "round %" PRIu64 ": no state held by a majority "
                     "of %zu members; the largest group's (%zu) %s taken; ours %s", vt->round,
                     members, holders, last->hash, own);
  }
  bool own_ok = memcmp(good, vt->own_hash, TD_AGREE_HASH_BYTES) == 0;
  for (size_t j = 0; j < kj; j++) {
    v->diverged[who[j]] = memcmp(hashes[j], good, TD_AGREE_HASH_BYTES) != 0;
    if (!v->diverged[who[j]])
      continue;
    uint64_t id = who[j] == TD_MEMBERS_MAX ? n->node_id : s->members[who[j]];
    char theirs[17];
    td_agree_short(hashes[j], theirs);
    last->diverged[last->n_diverged++] = id;
    last->disagreements++;
    td_log_warn("round %" PRIu64 ": member %016" PRIx64 "%s holds state %s, not the %s that %zu "
                "of %zu members hold", vt->round, id, id == n->node_id ? " (this node)" : "",
                theirs, last->hash, holders, members);
    td__ledger_event(n->ledger, "state_diverged", "%016" PRIx64 " round %" PRIu64 ": state %s, "
                     "not the %s that %zu of %zu members hold", id, vt->round, theirs,
                     last->hash, holders, members);
  }
  if (last->n_diverged == 0 && k == members) {
    td_log_info("round %" PRIu64 ": the %zu members agree on state %s", vt->round, members,
                last->hash);
    td__ledger_event(n->ledger, "state_agreed", "round %" PRIu64 ": %zu of %zu members hold "
                     "state %s", vt->round, holders, members, last->hash);
    if (v->state_round == vt->round) { /* nobody will ask for it */
      free(v->state);
      v->state = NULL;
      v->state_round = 0;
    }
  }
  if (vt->round == v->repair_round) {
    if (own_ok) {
      td_run_repair_cancel(s->run, v->repair_round);
      v->repair_round = 0;
      td_log_info("round %" PRIu64 ": this node's state agrees again: no repair", vt->round);
    } else {
      memcpy(v->repair_hash, good, TD_AGREE_HASH_BYTES);
      next_donor(v, vt);
    }
  } else if (!own_ok) {
    start_repair(v, vt->round, holders, members);
  }
}

/* Decide a round once every member of it has answered (or `force`: its time is up). */
static void try_decide(td__verify_t *v, vote_t *vt, bool force) {
  td__session_t *s = v->s;
  if (vt->round == 0 || vt->decided || !vt->own)
    return;
  bool all = true;
  for (size_t i = 0; i < s->n_members && all; i++)
    all = !td__session_takes_part(s, i, vt->round) || vt->have[i];
  if (all || force)
    decide(v, vt);
}

void td__verify_own(td__session_t *s, td_run_event_t *ev) {
  td__verify_t *v = s->verify;
  vote_t *vt = vote_of(v, ev->round, true, true);
  vt->own = true;
  vt->own_at = td_clock_mono_s();
  memcpy(vt->own_hash, ev->hash, TD_AGREE_HASH_BYTES);
  bool held = v->state != NULL && v->state_round == v->hold_round && ev->round != v->hold_round &&
              ev->round <= v->hold_round + ROUND_WINDOW;
  if (!held) { /* the newest verify round's state replaces the last one */
    free(v->state);
    v->state = ev->blob;
    ev->blob = NULL;
    v->state_round = ev->round;
    v->state_bytes = td_run_anchor_bytes(s->run);
  }
  free(ev->blob); /* (held: this round's copy is not kept) */
  ev->blob = NULL;
  send_hash(s, ev->round, ev->hash);
  try_decide(v, vt, false);
}

void td__on_state_hash(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  td__session_t *s = td__session_of(n, env->run_id);
  size_t mi = s != NULL ? td__session_member(s, env->sender) : TD_MEMBERS_MAX;
  const Traind__StateHash *sh = env->state_hash;
  if (s == NULL && env->run_id != 0 && env->run_id == n->ended_run)
    return; /* the last round's hashes of slower members, after this node finished */
  if (mi == TD_MEMBERS_MAX || s->verify == NULL || s->out[mi] || !in_window(s, sh->round) ||
      !td_runspec_verifiable(&s->spec, NULL, 0)) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "state hash outside our run or its rounds");
    return;
  }
  if (sh->hash.len == 0) { /* a request: hash the state after that round if still ahead */
    if (sh->round >= s->round) {
      td_run_want_verify(s->run, sh->round);
      s->verify->hold_round = sh->round; /* a repair may fetch it */
    } else
      td__drop(&n->drops, TD__DROP_LATE, NULL);
    return;
  }
  vote_t *vt = vote_of(s->verify, sh->round, true, false);
  if (vt == NULL || vt->decided || vt->have[mi]) { /* one hash per member and round: the first counts */
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    return;
  }
  vt->have[mi] = true;
  memcpy(vt->hash[mi], sh->hash.data, TD_AGREE_HASH_BYTES);
  try_decide(s->verify, vt, false);
}

void td__verify_request(td__session_t *s, td__link_t *l, const Traind__SnapshotRequest *rq) {
  td__verify_t *v = s->verify;
  if (v == NULL || v->state == NULL || rq->round != v->state_round ||
      rq->offset >= v->state_bytes) {
    td__drop(&s->node->drops, TD__DROP_WRONG_RUN, "state request for a round we do not hold");
    return;
  }
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = v->state_round;
  tmpl.repair = true;
  td__xfer_serve(s, l, v->state, v->state_bytes, rq->offset, &tmpl, false);
  td_log_info("round %" PRIu64 ": serving this node's state to %016" PRIx64 " (it differs)",
              v->state_round, td__link_peer(l));
}

/* The whole state of the repair round arrived: adopt it if it is the agreed one. */
static void fetched(td__verify_t *v) {
  td__session_t *s = v->s;
  td__node_t *n = s->node;
  size_t numel = td_run_numel(s->run), bytes = td_run_anchor_bytes(s->run);
  const float *state = (const float *)(const void *)v->buf;
  uint8_t got[TD_AGREE_HASH_BYTES];
  char got_text[17], want_text[17];
  bool mom = bytes > numel * sizeof(float);
  int rc = td_agree_hash(td_run_layout(s->run), state, mom ? state + numel : NULL, got);
  td_agree_short(got, got_text);
  td_agree_short(v->repair_hash, want_text);
  v->fetching = false;
  if (rc != 0 || memcmp(got, v->repair_hash, TD_AGREE_HASH_BYTES) != 0) {
    td_log_warn("round %" PRIu64 ": %016" PRIx64 " served a state that hashes to %s, not the "
                "agreed %s: not adopted", v->repair_round, v->donor, got_text, want_text);
    td__ledger_event(n->ledger, "state_repair_refused", "%016" PRIx64 " round %" PRIu64
                     ": served state %s, not the agreed %s", v->donor, v->repair_round,
                     got_text, want_text);
    vote_t *vt = vote_of(v, v->repair_round, false, false);
    if (vt != NULL)
      next_donor(v, vt);
    else
      stop_repair(v, "the round's hashes are gone");
    return;
  }
  if (td_run_repair(s->run, v->repair_round, state, bytes) != 0) {
    stop_repair(v, "the compute thread no longer waits for it");
    return;
  }
  v->last.repairs++;
  td_log_warn("round %" PRIu64 ": adopted the state of %016" PRIx64 " (%s, the agreed one)",
              v->repair_round, v->donor, got_text);
  td__ledger_event(n->ledger, "state_repaired", "%016" PRIx64 " round %" PRIu64 ": adopted "
                   "the state of %016" PRIx64 " (%s, held by a majority)", n->node_id,
                   v->repair_round, v->donor, got_text);
  v->repair_round = 0;
  free(v->buf);
  v->buf = NULL;
}

void td__verify_chunk(td__session_t *s, uint64_t sender, const Traind__SnapshotChunk *ch) {
  td__verify_t *v = s != NULL ? s->verify : NULL;
  size_t bytes = s != NULL ? td_run_anchor_bytes(s->run) : 0;
  if (v == NULL || !v->fetching || sender != v->donor || ch->round != v->repair_round ||
      ch->total_bytes != bytes || ch->offset != v->received || ch->payload.len == 0 ||
      ch->payload.len > bytes - v->received) {
    if (s != NULL)
      td__drop(&s->node->drops, TD__DROP_DUPLICATE, NULL); /* stale: the resume asks again */
    return;
  }
  memcpy(v->buf + ch->offset, ch->payload.data, ch->payload.len);
  v->received += ch->payload.len;
  v->last_progress = td_clock_mono_s();
  if (v->received == bytes)
    fetched(v);
}

void td__verify_tick(td__session_t *s) {
  td__verify_t *v = s->verify;
  if (v == NULL)
    return;
  double now = td_clock_mono_s();
  for (size_t k = 0; k < VOTE_SLOTS; k++) /* a member that does not answer is not waited for */
    if (v->votes[k].own && !v->votes[k].decided &&
        now > v->votes[k].own_at + s->spec.round_timeout)
      try_decide(v, &v->votes[k], true);
  if (!v->fetching || now - v->last_progress <= TD__JOIN_STALL_S)
    return;
  td__link_t *l = td_members_reachable(s->node->members, v->donor)
                      ? td__link_find(s->node->net, v->donor)
                      : NULL;
  vote_t *vt = vote_of(v, v->repair_round, false, false);
  if (l == NULL) { /* gone: the next member that holds the state */
    v->fetching = false;
    if (vt != NULL)
      next_donor(v, vt);
    else
      stop_repair(v, "the round's hashes are gone");
    return;
  }
  v->last_progress = now; /* stalled: from what arrived */
  Traind__SnapshotRequest rq = TRAIND__SNAPSHOT_REQUEST__INIT;
  rq.round = v->repair_round;
  rq.offset = v->received;
  rq.repair = true;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST;
  env.snapshot_request = &rq;
  env.run_id = s->run_id;
  td__link_send(s->node->net, l, &env);
}
