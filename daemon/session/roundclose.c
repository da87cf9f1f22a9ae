/* roundclose.c: one set of contributors per round, agreed through a coordinator.
 *
 * Threads: loop thread. In sync runs whose rounds may close before every
 * update is in (min_updates, round_deadline = adaptive), each node used to
 * close a round on the updates it had received, so a straggler's update that
 * reached some nodes before their cut and others after it parted their
 * models; in runs with a robust aggregate a member could do the same on
 * purpose, sending its update to some nodes only. Now one member decides:
 * the coordinator, the member of lowest id that takes part (in this node's
 * view). It cuts by the run's rule, closes the round and sends
 * RoundClose{round, members} to the others, who cut exactly the members
 * outside that set (their updates are left out of the average even when they
 * came) and wait for those inside it (backfill.c fetches what does not come).
 * From a member's second round on, a member of lower id holds back another
 * only once it has sent an update in the run: one that never trains (or that
 * only some nodes hear) coordinates nothing.
 * The fixed deadline (round_timeout; longer when the coordinator cuts only
 * there, td__roundclose_grace_s) still holds: a member that hears no
 * RoundClose by then closes on what it has, as before. A RoundClose is taken
 * only for a coordinator that may be one (no member of lower id takes part in
 * this node's view), once per round, for the open round and the next
 * TD__RING - 1. In secure runs it carries the coordinator's signature and is
 * taken only with one that holds, so any member that took it can forward a
 * copy to one that lacks it (td__roundclose_ask, td__roundclose_serve).
 * Where every member gets the same bytes of an update (codec none or fp16)
 * it also names, signed, the digest of each update the coordinator averaged:
 * a member that signed two updates for one round and sent each to some
 * members holds no one to its choice, for a node whose copy differs drops
 * it and takes the coordinator's (backfill.c, td__backfill_match_set).
 * A close naming fewer members than the run's rule needs to outvote one bad
 * member (trimmed:B 2B + 1, median, clip and a norm bound 3; at most a
 * majority of the members taking part) would have every node average what
 * its coordinator chose, its own update alone say: that coordinator is put
 * out of the run, and the signed close goes to every member, each of which
 * puts it out on the same proof (close_refused). A coordinator cuts no
 * straggler below that number (rounds.c, td__roundclose_floor).
 * rounds.c hands this file the message and then closes the round; this file
 * never calls rounds.c. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <sodium.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "daemon/net/admission.h"

_Static_assert(TD_MAX_RUN_MEMBERS <= 64, "a round close's forwards fit one word");

/* What the coordinator signs: BLAKE2b-256 of the label and the close. */
static void close_digest(uint64_t run, uint64_t coordinator, uint64_t round, uint64_t members,
                         uint8_t out[crypto_generichash_BYTES]) {
  static const char label[] = "traind-close1";
  uint8_t ids[32];
  const uint64_t v[4] = {run, coordinator, round, members};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 8; i++)
      ids[8 * k + i] = (uint8_t)(v[k] >> (8 * i));
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
  crypto_generichash_update(&st, ids, sizeof ids);
  crypto_generichash_final(&st, out, crypto_generichash_BYTES);
}

/* What the coordinator signs of the digests of the updates it averaged:
 * BLAKE2b-256 of the label, the close and the digests in member order. */
static void digests_digest(uint64_t run, uint64_t coordinator, uint64_t round, uint64_t members,
                           const uint8_t (*digests)[32], uint8_t out[crypto_generichash_BYTES]) {
  static const char label[] = "traind-close-digests1";
  uint8_t head[crypto_generichash_BYTES];
  close_digest(run, coordinator, round, members, head);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
  crypto_generichash_update(&st, head, sizeof head);
  for (size_t i = 0; i < 64; i++)
    if (members >> i & 1)
      crypto_generichash_update(&st, digests[i], 32);
  crypto_generichash_final(&st, out, crypto_generichash_BYTES);
}

bool td__roundclose_coordinated(const td__session_t *s) {
  return s->n_members > 1 && s->spec.mode_kind == TD_MODE_SYNC &&
         (s->spec.min_updates > 0 || s->spec.deadline_mad_c > 0 ||
          (s->spec.agg.kind != TD_AGG_MEAN && !td_runspec_mixes(&s->spec)));
}

/* Whether member i holds back a coordinator of higher id: it takes part
 * and, past its first round, has sent an update in this run (a member that
 * never trains, or that only some nodes hear, coordinates nothing: the
 * members that hear it would otherwise wait for closes it never sends and
 * refuse those of the member the others follow). */
static bool ranks_first(td__session_t *s, size_t i) {
  /* since: 0 for a member from the run's start (this node's first round) */
  uint64_t first = s->since[i] > s->first_round ? s->since[i] : s->first_round;
  return td__session_takes_part(s, i, 0) &&
         (s->round <= first || i >= 64 || (s->sent_once >> i & 1));
}

/* Whether `id` may coordinate: no member of lower id ranks first (this node
 * counts as one that does). */
static bool may_coordinate(td__session_t *s, uint64_t id) {
  size_t ci = td__session_member(s, id);
  if (s->node->node_id < id || (ci != TD_MEMBERS_MAX && s->out[ci]))
    return false;
  for (size_t i = 0; i < s->n_members; i++)
    if (s->members[i] < id && ranks_first(s, i))
      return false;
  return true;
}

double td__roundclose_grace_s(const td__session_t *s) {
  if (s->spec.min_updates > 0 || s->spec.deadline_mad_c > 0)
    return 0;
  return s->spec.round_timeout > TD__ASK_WAIT_MIN_S ? s->spec.round_timeout : TD__ASK_WAIT_MIN_S;
}

bool td__roundclose_coordinates(td__session_t *s) {
  return td__roundclose_coordinated(s) && may_coordinate(s, s->node->node_id);
}

bool td__roundclose_agreed_by(const td__session_t *s, uint64_t round, uint64_t *members,
                              uint64_t *from) {
  const td__round_close_t *c = &s->closes[round % TD__RING];
  if (round == 0 || c->round != round)
    return false;
  *members = c->members;
  *from = c->from;
  return true;
}

bool td__roundclose_agreed(const td__session_t *s, uint64_t round, uint64_t *members) {
  uint64_t from;
  return td__roundclose_agreed_by(s, round, members, &from);
}

/* The close c of run run_id as a message from this node (a coordinator's
 * own, or a copy): on link `to`, or to every member of s. */
static void send_close(td__node_t *n, td__session_t *s, uint64_t run_id,
                       const td__round_close_t *c, td__link_t *to) {
  Traind__RoundClose rc = TRAIND__ROUND_CLOSE__INIT;
  rc.round = c->round;
  rc.members = c->members;
  rc.coordinator = c->from;
  if (c->has_sig)
    rc.signature = (ProtobufCBinaryData){.len = sizeof c->sig, .data = (uint8_t *)c->sig};
  uint8_t digests[sizeof c->digests];
  size_t held = 0;
  for (size_t i = 0; c->has_digests && i < 64; i++)
    if (c->members >> i & 1)
      memcpy(digests + 32 * held++, c->digests[i], 32);
  if (c->has_digests) {
    rc.digests = (ProtobufCBinaryData){.len = 32 * held, .data = digests};
    rc.digests_signature = (ProtobufCBinaryData){.len = sizeof c->digests_sig,
                                                 .data = (uint8_t *)c->digests_sig};
  }
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ROUND_CLOSE;
  env.round_close = &rc;
  env.run_id = run_id;
  if (to != NULL)
    td__link_send(n->net, to, &env);
  else
    td__session_send_all(s, &env);
}

void td__roundclose_forward(td__node_t *n, uint64_t run_id, const td__round_close_t *c,
                            td__link_t *l) {
  send_close(n, NULL, run_id, c, l);
}

void td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members,
                         const uint8_t (*digests)[32]) {
  td__round_close_t *c = &s->closes[round % TD__RING];
  *c = (td__round_close_t){.round = round, .members = members, .from = s->node->node_id};
  if (td__access_secure(s->node->access)) {
    uint8_t digest[crypto_generichash_BYTES];
    close_digest(s->run_id, c->from, round, members, digest);
    td__admission_sign_message(td__access_admission(s->node->access), digest, sizeof digest,
                               c->sig);
    c->has_sig = true;
    /* the updates averaged, named by digest: a member that signed two
     * updates for this round, each sent to some members, is then averaged
     * alike everywhere */
    if (digests != NULL) {
      memcpy(c->digests, digests, sizeof c->digests);
      digests_digest(s->run_id, c->from, round, members, digests, digest);
      td__admission_sign_message(td__access_admission(s->node->access), digest, sizeof digest,
                                 c->digests_sig);
      c->has_digests = true;
    }
  }
  send_close(s->node, s, s->run_id, c, NULL);
  s->close_waiters_round = s->close_waiters = 0; /* it went to every member */
}

void td__roundclose_ask(td__session_t *s) {
  td__round_close_t *c = &s->closes[s->round % TD__RING];
  if (c->round == s->round || c->asked == s->round)
    return;
  c->asked = s->round;
  Traind__UpdateRequest rq = TRAIND__UPDATE_REQUEST__INIT;
  rq.round = s->round;
  rq.close = true;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_UPDATE_REQUEST;
  env.update_request = &rq;
  env.run_id = s->run_id;
  td__session_send_all(s, &env);
  td_log_warn("round %" PRIu64 ": no round close from the coordinator while the others moved "
              "on: asking the members for a copy", s->round);
  td__ledger_event(s->node->ledger, "backfill", "round %" PRIu64 ": asked the members for the "
                   "round close", s->round);
}

/* The close of `round` is held now: sent to each member that asked for it
 * before it came here. */
static void serve_waiters(td__session_t *s, uint64_t round) {
  td__round_close_t *c = &s->closes[round % TD__RING];
  if (s->close_waiters_round != round || c->round != round ||
      (td__access_secure(s->node->access) && !c->has_sig))
    return;
  for (size_t i = 0; i < s->n_members && i < 64; i++) {
    td__link_t *l = (s->close_waiters >> i & 1) && !(c->served >> i & 1)
                        ? td__link_find(s->node->net, s->members[i])
                        : NULL;
    if (l == NULL)
      continue;
    c->served |= UINT64_C(1) << i;
    send_close(s->node, s, s->run_id, c, l);
  }
  s->close_waiters_round = s->close_waiters = 0;
}

void td__roundclose_serve(td__session_t *s, size_t asker, uint64_t round, td__link_t *l) {
  td__round_close_t *c = &s->closes[round % TD__RING];
  if (c->round != round && asker < 64 && round >= s->round && round <= s->round + 1) {
    /* not come here yet either: sent when it comes, once */
    if (s->close_waiters_round != round) {
      s->close_waiters_round = round;
      s->close_waiters = 0;
    }
    s->close_waiters |= UINT64_C(1) << asker;
    return;
  }
  if (c->round != round || asker >= 64 || (c->served >> asker & 1) ||
      (td__access_secure(s->node->access) && !c->has_sig)) {
    td__drop(&s->node->drops, TD__DROP_DUPLICATE, NULL); /* none held, or sent once */
    return;
  }
  c->served |= UINT64_C(1) << asker;
  send_close(s->node, s, s->run_id, c, l);
}

/* Whether sig is coordinator by's signature of `members` for `round`. */
static bool close_signed(td__session_t *s, uint64_t by, uint64_t round, uint64_t members,
                         const uint8_t *sig, size_t sig_len) {
  const uint8_t *key = td__access_sign_key_of(s->node->access, by);
  uint8_t digest[crypto_generichash_BYTES];
  if (key == NULL || sig == NULL || sig_len != crypto_sign_BYTES)
    return false;
  close_digest(s->run_id, by, round, members, digest);
  return crypto_sign_verify_detached(sig, digest, sizeof digest, key) == 0;
}

/* Coordinator ci proved itself hostile with a close it signed: out of the run
 * for its remainder (its updates are averaged no more, and the member of
 * next lowest id coordinates). */
static void put_out(td__session_t *s, size_t ci, const char *why) {
  s->out[ci] = true;
  s->away[ci] = false;
  s->since[ci] = UINT64_MAX;
  td_round_forget_peer(s->collector, s->members[ci]);
  size_t used = strlen(s->refused);
  snprintf(s->refused + used, sizeof s->refused - used, "%snode %016" PRIx64 " put out: %s",
           used ? "; " : "", s->members[ci], why);
}

/* The check of td__roundclose_check_echo, for a round this node closed. */
static void check_echo(td__session_t *s, size_t mi, uint64_t round, uint64_t members,
                       uint64_t by, const uint8_t *sig, size_t sig_len) {
  uint64_t mine, mine_by;
  const uint8_t *mine_sig;
  size_t ci = td__session_member(s, by);
  if (ci == TD_MEMBERS_MAX || s->out[ci] ||
      !td__roundclose_applied_of(s, round, &mine, &mine_by, &mine_sig) || mine_by != by ||
      mine == members)
    return;
  if (!close_signed(s, by, round, members, sig, sig_len)) { /* proves nothing */
    td__drop(&s->node->drops, TD__DROP_FORBIDDEN, NULL);
    if (td__drop_should_log(++s->false_echoes))
      td_log_warn("run %016" PRIx64 ": %016" PRIx64 " says it averaged another set for round "
                  "%" PRIu64 " than %016" PRIx64 " closed it on here, without that "
                  "coordinator's signature of it: ignored", s->run_id, s->members[mi], round, by);
    return;
  }
  td_log_warn("run %016" PRIx64 " round %" PRIu64 ": coordinator %016" PRIx64 " closed it on "
              "%016" PRIx64 " here and on %016" PRIx64 " at %016" PRIx64 ": two signed sets for "
              "one round; out of the run for its remainder", s->run_id, round, by, mine, members,
              s->members[mi]);
  td__ledger_event(s->node->ledger, "close_mismatch", "%016" PRIx64 " round %" PRIu64 ": set "
                   "%016" PRIx64 " here, %016" PRIx64 " at %016" PRIx64 "; out of the run", by,
                   round, mine, members, s->members[mi]);
  char why[64];
  snprintf(why, sizeof why, "two round closes for round %" PRIu64, round);
  put_out(s, ci, why);
}

void td__roundclose_applied(td__session_t *s, uint64_t round, uint64_t members, uint64_t by) {
  const td__round_close_t *c = &s->closes[round % TD__RING];
  td__set_note_t *a = &s->applied[round % TD__RING];
  a->round = round;
  a->members = members;
  a->by = by;
  a->has_sig = by != 0 && c->round == round && c->from == by && c->has_sig;
  if (a->has_sig)
    memcpy(a->sig, c->sig, sizeof a->sig);
  for (size_t i = 0; by != 0 && i < s->n_members; i++) /* echoes that came first */
    if (s->echoes[i].round == round) {
      s->echoes[i].round = 0;
      check_echo(s, i, round, s->echoes[i].members, s->echoes[i].by, s->echoes[i].sig,
                 sizeof s->echoes[i].sig);
    }
}

const uint8_t *td__roundclose_digest_of(const td__session_t *s, uint64_t round, size_t mi) {
  const td__round_close_t *c = &s->closes[round % TD__RING];
  if (round == 0 || c->round != round || !c->has_digests || mi >= 64 || !(c->members >> mi & 1))
    return NULL;
  return c->digests[mi];
}

bool td__roundclose_applied_of(const td__session_t *s, uint64_t round, uint64_t *members,
                               uint64_t *by, const uint8_t **sig) {
  const td__set_note_t *a = &s->applied[round % TD__RING];
  if (round == 0 || a->round != round || a->by == 0)
    return false;
  *members = a->members;
  *by = a->by;
  *sig = a->has_sig ? a->sig : NULL;
  return true;
}

void td__roundclose_check_echo(td__session_t *s, size_t mi, uint64_t round, uint64_t members,
                               uint64_t by, const uint8_t *sig, size_t sig_len) {
  if (members == 0 || by == s->node->node_id || mi >= s->n_members ||
      !td__access_secure(s->node->access))
    return;
  if (round >= s->round && s->applied[round % TD__RING].round != round) {
    if (sig_len == sizeof s->echoes[mi].sig) { /* not closed here yet: checked when it is */
      s->echoes[mi].round = round;
      s->echoes[mi].members = members;
      s->echoes[mi].by = by;
      s->echoes[mi].has_sig = true;
      memcpy(s->echoes[mi].sig, sig, sig_len);
    }
    return;
  }
  check_echo(s, mi, round, members, by, sig, sig_len);
}

unsigned td__roundclose_floor(td__session_t *s, uint64_t round) {
  td_agg_spec_t agg;
  td_runspec_agg(&s->spec, &agg);
  unsigned rule = agg.kind == TD_AGG_TRIMMED ? 2 * agg.trim + 1
                  : agg.kind != TD_AGG_MEAN || agg.norm_bound > 0 ? 3
                                                                  : 1;
  unsigned live = 0;
  for (size_t i = 0; i < s->n_members && i < 64; i++)
    if ((i == s->rank || td__session_takes_part(s, i, round)) &&
        td_run_in_sample(s->run, round, (unsigned)i))
      live++;
  unsigned majority = live / 2 + 1, least = rule < majority ? rule : majority;
  if (s->spec.min_updates > 0 && s->spec.min_updates < least)
    least = s->spec.min_updates; /* what the operator allowed a round to close on */
  return least;
}

/* A signed close that names fewer members than the rule needs: its
 * coordinator would have every node average what it chose (its own update
 * alone, say). It is put out, and the close goes to every member as the
 * proof, so that each puts it out from the same signed words. */
static bool refuse_small_set(td__node_t *n, td__session_t *s, const Traind__RoundClose *rc,
                             uint64_t coordinator) {
  unsigned named = (unsigned)__builtin_popcountll(rc->members), need = td__roundclose_floor(s, rc->round);
  size_t ci = td__session_member(s, coordinator);
  if (named >= need || ci == TD_MEMBERS_MAX)
    return false;
  td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
  td_log_warn("run %016" PRIx64 " round %" PRIu64 ": coordinator %016" PRIx64 " closed it on "
              "%u member(s) (set %016" PRIx64 "), under the %u that aggregate = %s needs; out of "
              "the run for its remainder", s->run_id, rc->round, coordinator, named, rc->members,
              need, s->spec.aggregate);
  td__ledger_event(n->ledger, "close_refused", "%016" PRIx64 " round %" PRIu64 ": set %016" PRIx64
                   " names %u member(s), under %u; out of the run", coordinator, rc->round,
                   rc->members, named, need);
  char why[96];
  snprintf(why, sizeof why, "round %" PRIu64 " closed on %u member(s), under %u", rc->round,
           named, need);
  put_out(s, ci, why);
  td__round_close_t proof = {.round = rc->round, .members = rc->members, .from = coordinator,
                             .has_sig = rc->signature.len == crypto_sign_BYTES};
  if (proof.has_sig) {
    memcpy(proof.sig, rc->signature.data, sizeof proof.sig);
    send_close(n, s, s->run_id, &proof, NULL);
  }
  return true;
}

bool td__roundclose_take(td__node_t *n, td__session_t *s, const Traind__Envelope *env) {
  const Traind__RoundClose *rc = env->round_close;
  if (s == NULL || td__session_member(s, env->sender) == TD_MEMBERS_MAX ||
      !td__roundclose_coordinated(s)) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "round close outside our run");
    return false;
  }
  if (rc->round < s->round) {
    td__drop(&n->drops, TD__DROP_LATE, NULL);
    return false;
  }
  if (rc->round >= s->round + TD__RING || rc->round > s->rounds) {
    td__drop(&n->drops, TD__DROP_AHEAD, NULL);
    return false;
  }
  uint64_t all = s->n_members >= 64 ? UINT64_MAX : (1ull << s->n_members) - 1;
  if ((rc->members & ~all) != 0) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "round close naming members the run lacks");
    return false;
  }
  /* a copy forwarded by another member names its coordinator */
  uint64_t coordinator = rc->coordinator != 0 ? rc->coordinator : env->sender;
  if (!may_coordinate(s, coordinator) || coordinator == s->node->node_id) {
    td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
    if (td__drop_should_log(n->drops.count[TD__DROP_FORBIDDEN]))
      td_log_warn("run %016" PRIx64 ": refused round %" PRIu64 "'s close from %016" PRIx64
                  ": a member of lower id coordinates", s->run_id, rc->round, coordinator);
    return false;
  }
  td__round_close_t *c = &s->closes[rc->round % TD__RING];
  if (c->round == rc->round && c->members == rc->members) { /* the first close counts */
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    return false;
  }
  bool secure = td__access_secure(n->access);
  if (secure || coordinator != env->sender) { /* secure: only a signed close, forwardable */
    const uint8_t *key = td__access_sign_key_of(n->access, coordinator);
    uint8_t digest[crypto_generichash_BYTES];
    close_digest(s->run_id, coordinator, rc->round, rc->members, digest);
    if (!secure || key == NULL || rc->signature.len != crypto_sign_BYTES ||
        crypto_sign_verify_detached(rc->signature.data, digest, sizeof digest, key) != 0) {
      td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
      td_log_warn("run %016" PRIx64 ": refused round %" PRIu64 "'s close of %016" PRIx64
                  " from %016" PRIx64 ": it does not carry the coordinator's signature",
                  s->run_id, rc->round, coordinator, env->sender);
      return false;
    }
  }
  if (refuse_small_set(n, s, rc, coordinator))
    return false;
  if (c->round == rc->round) { /* the first close of a round counts */
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    return false;
  }
  uint8_t digests[64][32];
  if (secure && rc->digests.len > 0) { /* signed, or the close is not taken (wire.c: sizes) */
    const uint8_t *key = td__access_sign_key_of(n->access, coordinator);
    uint8_t digest[crypto_generichash_BYTES];
    size_t k = 0;
    for (size_t i = 0; i < 64; i++)
      if (rc->members >> i & 1)
        memcpy(digests[i], rc->digests.data + 32 * k++, 32);
    digests_digest(s->run_id, coordinator, rc->round, rc->members,
                   (const uint8_t(*)[32])digests, digest);
    if (key == NULL || rc->digests_signature.len != crypto_sign_BYTES ||
        crypto_sign_verify_detached(rc->digests_signature.data, digest, sizeof digest, key) !=
            0) {
      td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
      td_log_warn("run %016" PRIx64 ": refused round %" PRIu64 "'s close of %016" PRIx64
                  " from %016" PRIx64 ": its update digests do not carry the coordinator's "
                  "signature", s->run_id, rc->round, coordinator, env->sender);
      return false;
    }
  }
  uint64_t asked = c->asked;
  *c = (td__round_close_t){.round = rc->round, .members = rc->members, .from = coordinator,
                           .has_sig = rc->signature.len == crypto_sign_BYTES, .asked = asked,
                           .has_digests = secure && rc->digests.len > 0};
  if (c->has_sig)
    memcpy(c->sig, rc->signature.data, crypto_sign_BYTES);
  if (c->has_digests) {
    memcpy(c->digests, digests, sizeof digests);
    memcpy(c->digests_sig, rc->digests_signature.data, crypto_sign_BYTES);
  }
  if (coordinator != env->sender)
    td__ledger_event(n->ledger, "backfill", "round %" PRIu64 ": the round close of %016" PRIx64
                     " came from %016" PRIx64, rc->round, coordinator, env->sender);
  serve_waiters(s, rc->round);
  return true;
}
