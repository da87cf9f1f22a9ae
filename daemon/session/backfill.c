/* backfill.c: a member's update that a node lacks, fetched from one that holds it.
 *
 * Threads: loop thread. In runs with a coordinator (roundclose.c) every node
 * averages the coordinator's set, so a member that sends its update to some
 * nodes and withholds it from others would leave those without it holding a
 * set they cannot average: at the fixed deadline they used to close without
 * it, and the honest models parted. Now a node that took the set and lacks an
 * update in it asks a member that holds it (the coordinator, which averaged
 * it; when the update missing is the coordinator's own, the lowest other
 * member of the set) with an UpdateRequest: when nothing of it came
 * EARLY_ASK of round_timeout after the set, when the one that came was
 * refused, or at the deadline; it waits up to a further round_timeout (at
 * least TD__ASK_WAIT_MIN_S) and averages the copy it gets as if the member
 * had sent it.
 *
 * The forwarder cannot alter or invent that copy: in these runs every update
 * carries its origin's Ed25519 signature (outbox.c signs, with the key its
 * admission binds) over td__backfill_digest, and an update is taken,
 * whoever brings it, only with a signature that the origin's known key
 * verifies (inbox.c checks it on the work pool): no member gets an update
 * into the set that others could not check in a copy. What a node
 * keeps to answer with: each member's update of the last two rounds, as it
 * came (its message and signature), so the memory is bounded by the run's
 * members; a request is answered once per asker, member and round (one for
 * an update that has not come here yet either, of the open round or the
 * next, when it does), and a forwarded copy is taken only from the member it
 * was asked of, for the open round. inbox.c hands this file the chunks and
 * messages; this file never calls inbox.c or rounds.c.
 *
 * A member can also sign two updates for one round and send each to some
 * members. Where every member gets the same bytes of an update (codec none
 * or fp16), the coordinator's set names the digest of each update it
 * averaged (roundclose.c); a node holding another copy drops it and asks
 * the coordinator for its own at once, as for a copy that was refused. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"

#define SIG_BYTES crypto_sign_BYTES
#define WORDS (TD_MAX_RUN_MEMBERS / 64)
_Static_assert(TD_MAX_RUN_MEMBERS % 64 == 0, "askers fit whole words");
_Static_assert(SIG_BYTES == TD__BACKFILL_SIG && crypto_sign_PUBLICKEYBYTES == TD__BACKFILL_KEY,
               "Ed25519 sizes");

/* A member's update as it came, to forward (round 0: none). */
typedef struct {
  uint64_t round, samples;
  double loss;
  uint8_t *msg; /* owned */
  size_t len;
  uint8_t sig[SIG_BYTES];
  bool has_sig;
  uint64_t served[WORDS]; /* askers answered (bit: member index) */
} kept_t;

/* The signature chunk 0 of a member's update carried (round 0: none). */
typedef struct {
  uint64_t round;
  uint8_t sig[SIG_BYTES];
} signed_t;

/* The digest of a member's update this node holds (round 0: none). */
typedef struct {
  uint64_t round;
  uint8_t digest[TD__BACKFILL_DIGEST];
} held_t;

struct td__backfill {
  kept_t kept[TD_MAX_RUN_MEMBERS][2]; /* by member index and round % 2 */
  signed_t sigs[TD_MAX_RUN_MEMBERS][2];
  held_t held[TD_MAX_RUN_MEMBERS][2];
  uint64_t mismatched; /* updates held that were not the ones the coordinator averaged */
  uint64_t asked_round;                   /* the round the asks below are of (0: none) */
  uint64_t asked_of[TD_MAX_RUN_MEMBERS];  /* who was asked for member i's update (0: none) */
  double until;                           /* mono time the asks are waited for */
  double set_at;                          /* mono time the round's set was first seen */
  uint64_t asked, served, taken, forged;  /* counts, for the log and the ledger */
  /* asks this node could not answer yet: member i's update of round
   * pending_round[i], by the askers of pending[i] (bit: member index),
   * answered when it comes (td__backfill_keep) */
  uint64_t pending_round[TD_MAX_RUN_MEMBERS];
  uint64_t pending[TD_MAX_RUN_MEMBERS][WORDS];
  /* once retired (td__backfill_retire): whose run this was, and until when
   * it answers */
  uint64_t run_id;
  uint64_t members[TD_MAX_RUN_MEMBERS];
  size_t n_members;
  td__round_close_t closes[TD__RING];
  double expires;
};

static const char LABEL[] = "traind-update1";

/* Nothing of an update of the set came this fraction of round_timeout after
 * the set did: ask for it before the deadline. */
#define EARLY_ASK 0.25

static void serve_pending(td__session_t *s, size_t mi, uint64_t round);

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

void td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                         const uint8_t *msg, size_t len, uint8_t out[TD__BACKFILL_DIGEST]) {
  uint8_t ids[32];
  put_u64(ids, run);
  put_u64(ids + 8, origin);
  put_u64(ids + 16, round);
  put_u64(ids + 24, samples);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, TD__BACKFILL_DIGEST);
  crypto_generichash_update(&st, (const uint8_t *)LABEL, sizeof LABEL - 1);
  crypto_generichash_update(&st, ids, sizeof ids);
  crypto_generichash_update(&st, msg, len);
  crypto_generichash_final(&st, out, TD__BACKFILL_DIGEST);
}

int td__backfill_open(td__backfill_t **out) {
  *out = calloc(1, sizeof **out);
  return *out == NULL ? TD_ENOMEM : 0;
}

void td__backfill_close(td__backfill_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td__backfill_t *b = *self_p;
  for (size_t i = 0; i < TD_MAX_RUN_MEMBERS; i++)
    for (int k = 0; k < 2; k++)
      free(b->kept[i][k].msg);
  free(b);
  *self_p = NULL;
}

bool td__backfill_on(const td__session_t *s) {
  return s->backfill != NULL && td__roundclose_coordinated(s);
}

const td__admission_t *td__backfill_signer(td__session_t *s) {
  return td__backfill_on(s) && td__access_secure(s->node->access)
             ? td__access_admission(s->node->access)
             : NULL;
}

void td__backfill_note_signature(td__session_t *s, size_t mi, uint64_t round,
                                 const uint8_t *sig, size_t len) {
  if (!td__backfill_on(s) || mi >= TD_MAX_RUN_MEMBERS || len != SIG_BYTES)
    return;
  signed_t *g = &s->backfill->sigs[mi][round % 2];
  g->round = round;
  memcpy(g->sig, sig, SIG_BYTES);
}

static const signed_t *signature_of(const td__backfill_t *b, size_t mi, uint64_t round) {
  const signed_t *g = &b->sigs[mi][round % 2];
  return g->round == round ? g : NULL;
}

bool td__backfill_proof(td__session_t *s, size_t mi, uint64_t round,
                        uint8_t sig[TD__BACKFILL_SIG], uint8_t key[TD__BACKFILL_KEY]) {
  const uint8_t *k = td__access_sign_key_of(s->node->access, s->members[mi]);
  const signed_t *g = signature_of(s->backfill, mi, round);
  if (k == NULL || g == NULL)
    return false;
  memcpy(sig, g->sig, SIG_BYTES);
  memcpy(key, k, TD__BACKFILL_KEY);
  return true;
}

bool td__backfill_verify(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                         const uint8_t *msg, size_t len, const uint8_t sig[TD__BACKFILL_SIG],
                         const uint8_t key[TD__BACKFILL_KEY],
                         uint8_t digest_out[TD__BACKFILL_DIGEST]) {
  uint8_t digest[TD__BACKFILL_DIGEST];
  td__backfill_digest(run, origin, round, samples, msg, len, digest);
  if (digest_out != NULL)
    memcpy(digest_out, digest, sizeof digest);
  return crypto_sign_verify_detached(sig, digest, sizeof digest, key) == 0;
}

void td__backfill_note_digest(td__session_t *s, size_t mi, uint64_t round,
                              const uint8_t digest[TD__BACKFILL_DIGEST]) {
  if (!td__backfill_on(s) || mi >= TD_MAX_RUN_MEMBERS || round == 0)
    return;
  held_t *h = &s->backfill->held[mi][round % 2];
  h->round = round;
  memcpy(h->digest, digest, TD__BACKFILL_DIGEST);
}

bool td__backfill_digest_of(const td__session_t *s, size_t mi, uint64_t round,
                            uint8_t out[TD__BACKFILL_DIGEST]) {
  if (s->backfill == NULL || mi >= TD_MAX_RUN_MEMBERS || round == 0)
    return false;
  const held_t *h = &s->backfill->held[mi][round % 2];
  if (h->round != round)
    return false;
  memcpy(out, h->digest, TD__BACKFILL_DIGEST);
  return true;
}

bool td__backfill_digests_of(const td__session_t *s, uint64_t round, uint64_t members,
                             uint8_t out[64][TD__BACKFILL_DIGEST]) {
  for (size_t i = 0; i < 64; i++)
    if ((members >> i & 1) && !td__backfill_digest_of(s, i, round, out[i]))
      return false;
  return true;
}

void td__backfill_match_set(td__session_t *s) {
  uint64_t set, coordinator;
  if (!td__backfill_on(s) || td__roundclose_coordinates(s) || s->round_set == 0 ||
      !td__roundclose_agreed_by(s, s->round, &set, &coordinator))
    return;
  for (size_t mi = 0; mi < s->n_members && mi < 64; mi++) {
    const uint8_t *want = td__roundclose_digest_of(s, s->round, mi);
    uint8_t have[TD__BACKFILL_DIGEST];
    if (want == NULL || s->members[mi] == s->node->node_id ||
        td_round_peer_state(s->collector, s->members[mi]) != TD_PEER_HAVE ||
        !td__backfill_digest_of(s, mi, s->round, have) ||
        memcmp(have, want, TD__BACKFILL_DIGEST) == 0 ||
        !td_round_refuse_peer(s->collector, s->members[mi]))
      continue;
    s->backfill->mismatched++;
    td_log_warn("round %" PRIu64 ": the update of %016" PRIx64 " held here is not the one "
                "coordinator %016" PRIx64 " averaged (that member signed two for this round): "
                "dropped for the coordinator's copy (%" PRIu64 " so far)", s->round,
                s->members[mi], coordinator, s->backfill->mismatched);
    td__ledger_event(s->node->ledger, "update_mismatch", "round %" PRIu64 " peer %016" PRIx64
                     ": its update held here differs from the one %016" PRIx64 " averaged",
                     s->round, s->members[mi], coordinator);
  }
}

void td__backfill_note_forged(td__session_t *s, size_t mi, uint64_t round) {
  s->backfill->forged++;
  td_log_warn("run %016" PRIx64 ": the round %" PRIu64 " update of %016" PRIx64 " forwarded "
              "by %016" PRIx64 " does not carry its origin's signature: rejected", s->run_id,
              round, s->members[mi], s->backfill->asked_of[mi]);
}

void td__backfill_keep(td__session_t *s, size_t mi, uint64_t round, uint64_t samples,
                       double loss, uint8_t **msg, size_t len) {
  if (!td__backfill_on(s) || mi >= TD_MAX_RUN_MEMBERS || round == 0)
    return;
  kept_t *k = &s->backfill->kept[mi][round % 2];
  const signed_t *g = signature_of(s->backfill, mi, round);
  bool secure = td__access_secure(s->node->access);
  if (secure && g == NULL)
    return; /* nothing to prove it by: not forwarded */
  free(k->msg);
  *k = (kept_t){.round = round, .samples = samples, .loss = loss, .msg = *msg, .len = len,
                .has_sig = g != NULL};
  if (g != NULL)
    memcpy(k->sig, g->sig, SIG_BYTES);
  *msg = NULL;
  serve_pending(s, mi, round);
}

/* Forward k, the update of `origin` in run run_id, to the asker on link l,
 * with the figures the origin told this node with it (rep; NULL: none). */
static void forward(td__node_t *n, uint64_t run_id, uint64_t origin, td__link_t *l,
                    const kept_t *k, const td__peer_report_t *rep, size_t n_members) {
  uint32_t chunks = td_chunk_count(k->len);
  uint64_t first = td__link_reserve(l, chunks), off = 0;
  for (uint32_t c = 0; c < chunks; c++) {
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = k->round;
    up.base_round = k->round - 1;
    up.samples = k->samples;
    up.chunk = c;
    up.chunks = chunks;
    up.total_bytes = k->len;
    up.payload.data = k->msg + off;
    up.payload.len = td_chunk_len(k->len, off);
    up.loss = k->loss;
    up.origin = origin;
    if (rep != NULL && rep->round == k->round) { /* what the origin told this node with it */
      up.capacity = rep->capacity;
      up.uplink = rep->uplink;
      up.heard_capacity = (double *)rep->heard;
      up.n_heard_capacity = n_members;
    }
    if (c == 0 && k->has_sig)
      up.signature = (ProtobufCBinaryData){.len = SIG_BYTES, .data = (uint8_t *)k->sig};
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.run_id = run_id;
    env.sender = n->node_id;
    env.seq = first + c;
    uint8_t *buf;
    size_t blen;
    if (td_wire_pack(&env, &buf, &blen) != 0)
      return;
    /* bulk, not the update class: an update of ours being packed on the pool
     * holds lower sequence numbers, and a class takes them in order */
    td__link_queue(l, TD_PRIO_BULK, buf, blen, first + c);
    off += up.payload.len;
  }
  td__link_pump(n->net, l);
}

static size_t index_of(const uint64_t *members, size_t n, uint64_t id) {
  for (size_t i = 0; i < n && i < TD_MAX_RUN_MEMBERS; i++)
    if (members[i] == id)
      return i;
  return TD_MEMBERS_MAX;
}

/* One copy of member mi's kept update of `round` for the asker, at most:
 * the kept one to forward, or NULL (not held, or sent to it already). */
static kept_t *to_serve(td__backfill_t *b, size_t mi, size_t asker, uint64_t round) {
  kept_t *k = mi < TD_MAX_RUN_MEMBERS ? &b->kept[mi][round % 2] : NULL;
  if (k == NULL || k->round != round || k->msg == NULL || mi == asker ||
      (k->served[asker / 64] >> (asker % 64) & 1))
    return NULL;
  k->served[asker / 64] |= UINT64_C(1) << (asker % 64);
  b->served++;
  return k;
}

/* A request for the run that ended here last (n->retired), while it answers. */
static void serve_retired(td__node_t *n, const Traind__Envelope *env, td__link_t *l) {
  const Traind__UpdateRequest *rq = env->update_request;
  if (n->retired != NULL && td_clock_mono_s() >= n->retired->expires)
    td__backfill_close(&n->retired);
  td__backfill_t *b = n->retired;
  size_t asker = b != NULL ? index_of(b->members, b->n_members, env->sender) : TD_MEMBERS_MAX;
  if (b == NULL || b->run_id != env->run_id || asker >= TD_MAX_RUN_MEMBERS || l == NULL) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "update request outside our run");
    return;
  }
  if (rq->close) {
    td__round_close_t *c = &b->closes[rq->round % TD__RING];
    if (c->round != rq->round || !c->has_sig || (c->served >> asker & 1)) {
      td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
      return;
    }
    c->served |= UINT64_C(1) << asker;
    td__roundclose_forward(n, b->run_id, c, l);
    return;
  }
  size_t mi = index_of(b->members, b->n_members, rq->member);
  kept_t *k = to_serve(b, mi, asker, rq->round);
  if (k == NULL) {
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    return;
  }
  td_log_info("run %016" PRIx64 " (ended here) round %" PRIu64 ": forwarding the update of "
              "%016" PRIx64 " to %016" PRIx64 ", which lacks it", b->run_id, rq->round,
              rq->member, env->sender);
  forward(n, b->run_id, rq->member, l, k, NULL, b->n_members);
}

void td__backfill_retire(td__node_t *n, td__session_t *s) {
  if (s->backfill == NULL || !td__backfill_on(s))
    return;
  td__backfill_close(&n->retired);
  td__backfill_t *b = s->backfill;
  s->backfill = NULL;
  b->run_id = s->run_id;
  b->n_members = s->n_members < TD_MAX_RUN_MEMBERS ? s->n_members : TD_MAX_RUN_MEMBERS;
  memcpy(b->members, s->members, b->n_members * sizeof b->members[0]);
  memcpy(b->closes, s->closes, sizeof b->closes);
  b->expires = td_clock_mono_s() + 2 * s->spec.round_timeout + 2 * TD__ASK_WAIT_MIN_S;
  n->retired = b;
}

void td__session_on_update_request(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                                   size_t bytes) {
  (void)bytes;
  const Traind__UpdateRequest *rq = env->update_request;
  td__session_t *s = td__session_of(n, env->run_id);
  if (s == NULL) {
    serve_retired(n, env, l);
    return;
  }
  size_t asker = td__session_member(s, env->sender);
  if (asker >= TD_MAX_RUN_MEMBERS || !td__backfill_on(s) || l == NULL) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "update request outside our run");
    return;
  }
  if (rq->close) { /* the round's close, which this node took or sent */
    td__roundclose_serve(s, asker, rq->round, l);
    return;
  }
  size_t mi = td__session_member(s, rq->member);
  td__backfill_t *b = s->backfill;
  if (mi < TD_MAX_RUN_MEMBERS && mi != asker && rq->round >= s->round &&
      rq->round <= s->round + 1 && b->kept[mi][rq->round % 2].round != rq->round) {
    /* not come here yet either: answered when it comes, once */
    if (b->pending_round[mi] != rq->round) {
      b->pending_round[mi] = rq->round;
      memset(b->pending[mi], 0, sizeof b->pending[mi]);
    }
    b->pending[mi][asker / 64] |= UINT64_C(1) << (asker % 64);
    return;
  }
  kept_t *k = to_serve(b, mi, asker, rq->round);
  if (k == NULL) {
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL); /* not held (any more), or sent once */
    return;
  }
  td_log_info("round %" PRIu64 ": forwarding the update of %016" PRIx64 " to %016" PRIx64
              ", which lacks it", rq->round, rq->member, env->sender);
  forward(n, s->run_id, rq->member, l, k, &s->peer_report[mi][rq->round % TD__RING],
          s->n_members);
}

/* Member mi's update of `round` is kept now: forwarded to each member that
 * asked for it before it came here. */
static void serve_pending(td__session_t *s, size_t mi, uint64_t round) {
  td__backfill_t *b = s->backfill;
  if (b->pending_round[mi] != round)
    return;
  b->pending_round[mi] = 0;
  for (size_t asker = 0; asker < s->n_members && asker < TD_MAX_RUN_MEMBERS; asker++) {
    if (!(b->pending[mi][asker / 64] >> (asker % 64) & 1))
      continue;
    td__link_t *l = td__link_find(s->node->net, s->members[asker]);
    kept_t *k = l != NULL ? to_serve(b, mi, asker, round) : NULL;
    if (k == NULL)
      continue;
    td_log_info("round %" PRIu64 ": forwarding the update of %016" PRIx64 " to %016" PRIx64
                ", which asked for it before it came here", round, s->members[mi],
                s->members[asker]);
    forward(s->node, s->run_id, s->members[mi], l, k, &s->peer_report[mi][round % TD__RING],
            s->n_members);
  }
  memset(b->pending[mi], 0, sizeof b->pending[mi]);
}

/* Whom to ask for member mi's update of the open round: the coordinator,
 * unless the update missing is its own; then the lowest member of the set
 * other than it and this node that takes part. */
static uint64_t helper_for(td__session_t *s, size_t mi, uint64_t set, uint64_t coordinator) {
  if (coordinator != 0 && coordinator != s->members[mi] && coordinator != s->node->node_id)
    return coordinator;
  uint64_t best = 0;
  for (size_t j = 0; j < s->n_members && j < 64; j++)
    if (j != mi && (set >> j & 1) && s->members[j] != s->node->node_id &&
        td__session_takes_part(s, j, 0) && (best == 0 || s->members[j] < best))
      best = s->members[j];
  return best;
}

void td__backfill_ask(td__session_t *s, bool all) {
  uint64_t set, coordinator;
  if (!td__backfill_on(s) || td__roundclose_coordinates(s) || s->round_set == 0 ||
      !td__roundclose_agreed_by(s, s->round, &set, &coordinator))
    return;
  td__backfill_t *b = s->backfill;
  double now = td_clock_mono_s();
  if (b->asked_round != s->round) {
    b->asked_round = s->round;
    memset(b->asked_of, 0, sizeof b->asked_of);
    b->until = 0;
    b->set_at = now;
  }
  /* an update of which nothing came is asked for once the set is a while
   * old: one that is merely slower (its sender's uplink carries it to each
   * member in turn) usually comes by then, and is not sent twice. One that
   * came and did not decode, or whose signature failed, is asked for at once:
   * the coordinator averaged a copy that did */
  bool early = now >= b->set_at + s->spec.round_timeout * EARLY_ASK;
  for (size_t mi = 0; mi < s->n_members && mi < 64; mi++) {
    if (!(set >> mi & 1) || s->members[mi] == s->node->node_id || b->asked_of[mi] != 0)
      continue;
    td_round_peer_state_t st = td_round_peer_state(s->collector, s->members[mi]);
    bool ask = st == TD_PEER_REFUSED || (st == TD_PEER_NONE && (all || early)) ||
               (st == TD_PEER_PARTIAL && all);
    if (!ask)
      continue;
    uint64_t helper = helper_for(s, mi, set, coordinator);
    td__link_t *l = helper != 0 ? td__link_find(s->node->net, helper) : NULL;
    if (l == NULL || !td_round_restart_peer(s->collector, s->members[mi]))
      continue;
    Traind__UpdateRequest rq = TRAIND__UPDATE_REQUEST__INIT;
    rq.round = s->round;
    rq.member = s->members[mi];
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE_REQUEST;
    env.update_request = &rq;
    env.run_id = s->run_id;
    if (td__link_send(s->node->net, l, &env) != 0)
      continue;
    if (b->until == 0)
      b->until = now + (s->spec.round_timeout > TD__ASK_WAIT_MIN_S ? s->spec.round_timeout
                                                                     : TD__ASK_WAIT_MIN_S);
    b->asked_of[mi] = helper;
    b->asked++;
    td_log_warn("round %" PRIu64 ": the update of %016" PRIx64 " is in the coordinator's set "
                "but %s: asking %016" PRIx64 " for it", s->round, s->members[mi],
                st == TD_PEER_REFUSED ? "the one that came was refused"
                : all                 ? "has not come by the deadline"
                                      : "none of it came",
                helper);
    td__ledger_event(s->node->ledger, "backfill", "round %" PRIu64 " peer %016" PRIx64
                     ": asked %016" PRIx64 " for its update", s->round, s->members[mi], helper);
  }
}

bool td__backfill_waiting(td__session_t *s) {
  td__backfill_t *b = s->backfill;
  if (!td__backfill_on(s) || b->asked_round != s->round || td_clock_mono_s() >= b->until)
    return false;
  uint64_t missing[TD_MEMBERS_MAX];
  size_t k = td_round_missing(s->collector, missing, TD_MEMBERS_MAX);
  for (size_t j = 0; j < k; j++) {
    size_t mi = td__session_member(s, missing[j]);
    if (mi < TD_MAX_RUN_MEMBERS && b->asked_of[mi] != 0)
      return true;
  }
  return false;
}

size_t td__backfill_take_chunk(td__session_t *s, uint64_t sender, const Traind__UpdateChunk *up) {
  if (!td__backfill_on(s) || s->backfill->asked_round != up->round || up->round != s->round)
    return TD_MEMBERS_MAX;
  size_t mi = td__session_member(s, up->origin);
  if (mi >= TD_MAX_RUN_MEMBERS || s->backfill->asked_of[mi] != sender)
    return TD_MEMBERS_MAX;
  return mi;
}

bool td__backfill_asked_elsewhere(const td__session_t *s, size_t mi, uint64_t round) {
  return s->backfill != NULL && mi < TD_MAX_RUN_MEMBERS && s->backfill->asked_round == round &&
         s->backfill->asked_of[mi] != 0;
}

void td__backfill_note_taken(td__session_t *s, size_t mi, uint64_t round) {
  s->backfill->taken++;
  td_log_info("round %" PRIu64 ": took the update of %016" PRIx64 " forwarded by %016" PRIx64,
              round, s->members[mi], s->backfill->asked_of[mi]);
  td__ledger_event(s->node->ledger, "backfill", "round %" PRIu64 " peer %016" PRIx64
                   ": its update came from %016" PRIx64, round, s->members[mi],
                   s->backfill->asked_of[mi]);
}
