/* outbox.c: encoding our own update of each round for every peer.
 *
 * Threads: the loop thread queues one encode job at a time on the libuv work
 * pool; the job (encode_work) encodes the round's delta for each reachable
 * peer with that link's own codec (own residual, own warm start), cuts it
 * into chunks and packs one envelope per chunk, touching only what it was
 * handed; encode_done puts the frames on the links' queues on the loop
 * thread. A job holds a reference on its session: the delta, the layout and
 * the link codecs it reads live as long as the job. With fragments = P only
 * the round's slice of the delta is encoded (td_run_slice): the receiver
 * derives the same slice from the round's number and decodes it alone. With codec = auto each
 * link's codec is refitted before the job to the byte budget its measured
 * goodput allows (scheduler/budget.h), the least lossy that fits. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "daemon/net/admission.h"

struct td__outbox {
  td__session_t *s; /* borrowed: the outbox is part of it */
  void (*sent_cb)(td__session_t *s); /* told when an update is on its way (rounds.c's) */
  td_codec_spec_t codec;
  char codec_text[32];
  td_link_codec_t *link_codecs[TD_MEMBERS_MAX]; /* by member index; NULL for us */
  bool reset[TD_MEMBERS_MAX]; /* reopen this link codec before the next encode */
  double last_lr[TD_MEMBERS_MAX]; /* lr of the last round each link encoded (0: none) */
  bool in_flight;
  uint64_t sent, pending; /* rounds handed to the links; next round to encode (0: none) */
};

/* One peer's copy of the update. */
typedef struct {
  uint64_t peer;
  td_link_codec_t *codec; /* borrowed from the session: only this job uses it while queued */
  uint8_t **bufs;
  size_t *lens;
  uint32_t chunks;
  size_t msg_bytes;
  int rc;
  char codec_text[32]; /* the spec used, for status and the ledger */
  uint64_t first_seq;  /* link sequence number of chunk 0 (chunk c: first_seq + c) */
  bool signed_copy;    /* digest below is what this copy's signature covers */
  uint8_t digest[TD__BACKFILL_DIGEST];
} encode_target_t;

typedef struct {
  uv_work_t req;
  td__session_t *s; /* one reference, dropped in encode_done */
  uint64_t run_id, round, samples, node_id;
  unsigned codec_id, batch;
  double loss, capacity, uplink;
  double heard[TD_MEMBERS_MAX]; /* capacities of round - 1 as this node holds them */
  size_t n_heard;
  const float *delta;
  size_t offset, count; /* the range of delta the round exchanges (td_run_slice) */
  const td__admission_t *signer; /* borrowed: signs each copy (backfill.c); NULL: unsigned */
  uint64_t applied, applied_by;  /* the set round - 1 averaged here, and its coordinator */
  bool applied_signed;
  uint8_t applied_sig[64]; /* the coordinator's signature of that set */
  size_t n_targets;
  encode_target_t targets[TD_MEMBERS_MAX];
} encode_job_t;

int td__outbox_open(td__outbox_t **out, td__session_t *s, const td_codec_spec_t *codec,
                    void (*sent)(td__session_t *s)) {
  td__outbox_t *o = calloc(1, sizeof *o);
  if (o == NULL)
    return TD_ENOMEM;
  o->s = s;
  o->sent_cb = sent;
  o->codec = *codec;
  td_codec_format(codec, o->codec_text, sizeof o->codec_text);
  *out = o;
  for (size_t i = 0; i < s->n_members; i++) {
    int rc = s->members[i] != s->node->node_id ? td__outbox_add_member(o, i) : 0;
    if (rc != 0)
      return rc;
  }
  return 0;
}

void td__outbox_close(td__outbox_t **self_p) {
  td__outbox_t *o = *self_p;
  if (o == NULL)
    return;
  *self_p = NULL;
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++)
    td_link_codec_close(&o->link_codecs[i]);
  free(o);
}

int td__outbox_add_member(td__outbox_t *o, size_t i) {
  td__session_t *s = o->s;
  o->last_lr[i] = 0;
  return td_link_codec_open(&o->link_codecs[i], &o->codec, td_run_layout(s->run), s->spec.seed,
                            td__session_codec_seed(s, s->members[i]));
}

void td__outbox_reset_member(td__outbox_t *o, size_t i) {
  if (i < TD_MEMBERS_MAX)
    o->reset[i] = true;
}

/* Between encode jobs no job holds a link codec: reopen the ones asked for. */
static void apply_resets(td__outbox_t *o) {
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++) {
    if (!o->reset[i])
      continue;
    o->reset[i] = false;
    td_link_codec_close(&o->link_codecs[i]);
    if (td__outbox_add_member(o, i) != 0)
      td_log_warn("out of memory for the link codec of %016" PRIx64 ": not sent to",
                  o->s->members[i]);
  }
}

const char *td__outbox_codec(const td__outbox_t *o) {
  return o != NULL && o->codec_text[0] ? o->codec_text : "none";
}

bool td__outbox_same_bytes(const td__outbox_t *o) {
  return o != NULL && !o->s->spec.codec_auto &&
         (o->codec.id == TD_CODEC_NONE || o->codec.id == TD_CODEC_FP16);
}

bool td__outbox_sent(const td__outbox_t *o, uint64_t round) { return o->sent >= round; }
void td__outbox_skip_to(td__outbox_t *o, uint64_t round) { o->sent = round; }

static void encode_target(encode_job_t *job, encode_target_t *t) {
  const uint8_t *msg = NULL;
  size_t total = 0;
  t->rc = td_link_codec_encode_range(t->codec, job->delta, job->offset, job->count, &msg, &total);
  if (t->rc != 0)
    return;
  t->msg_bytes = total;
  uint8_t sig[TD__SIGNATURE_BYTES];
  if (job->signer != NULL) { /* so that a member may forward it (backfill.c) */
    td__backfill_digest(job->run_id, job->node_id, job->round, job->samples, msg, total,
                        t->digest);
    td__admission_sign_message(job->signer, t->digest, sizeof t->digest, sig);
    t->signed_copy = true;
  }
  t->chunks = td_chunk_count(total);
  t->bufs = calloc(t->chunks, sizeof *t->bufs);
  t->lens = calloc(t->chunks, sizeof *t->lens);
  if (t->bufs == NULL || t->lens == NULL) {
    t->rc = TD_ENOMEM;
    return;
  }
  uint64_t off = 0;
  for (uint32_t c = 0; c < t->chunks && t->rc == 0; c++) {
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = job->round;
    up.base_round = job->round - 1;
    up.samples = job->samples;
    up.codec = job->codec_id;
    up.chunk = c;
    up.chunks = t->chunks;
    up.total_bytes = total;
    up.payload.data = (uint8_t *)msg + off;
    up.payload.len = td_chunk_len(total, off);
    up.loss = job->loss;
    up.capacity = job->capacity;
    up.uplink = job->uplink;
    up.batch = job->batch;
    up.heard_capacity = job->heard;
    up.n_heard_capacity = job->n_heard;
    if (c == 0 && job->signer != NULL)
      up.signature = (ProtobufCBinaryData){.len = sizeof sig, .data = sig};
    if (c == 0) {
      up.applied_members = job->applied;
      up.applied_by = job->applied_by;
      if (job->applied_signed)
        up.applied_signature = (ProtobufCBinaryData){.len = sizeof job->applied_sig,
                                                     .data = job->applied_sig};
    }
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.run_id = job->run_id;
    env.sender = job->node_id;
    env.seq = t->first_seq + c; /* echoed by the receiver's chunk ack */
    t->rc = td_wire_pack(&env, &t->bufs[c], &t->lens[c]);
    off += up.payload.len;
  }
}

/* Work pool: the job's own fields, its session's delta and link codecs.
 * Once a target's envelopes hold their copies its link's message buffer goes
 * back, so a node keeps none per member between rounds. */
static void encode_work(uv_work_t *req) {
  encode_job_t *job = req->data;
  for (size_t i = 0; i < job->n_targets; i++) {
    encode_target(job, &job->targets[i]);
    td_link_codec_release_message(job->targets[i].codec);
  }
}

static void encode_start(td__outbox_t *o, uint64_t round);

static void encode_done(uv_work_t *req, int status) {
  encode_job_t *job = req->data;
  td__session_t *s = job->s;
  td__node_t *n = s->node;
  bool live = status == 0 && n->session == s, noted = false;
  for (size_t i = 0; i < job->n_targets; i++) {
    encode_target_t *t = &job->targets[i];
    if (live && !noted && t->rc == 0 && t->signed_copy && td__outbox_same_bytes(s->outbox)) {
      /* what the coordinator names in its set when it averages our update */
      td__backfill_note_digest(s, td__session_member(s, n->node_id), job->round, t->digest);
      noted = true;
    }
    td__link_t *l = td__link_find(n->net, t->peer);
    if (t->rc == TD_ENUMERIC) {
      td__drop(&n->drops, TD__DROP_NONFINITE_LOCAL, "own update holds NaN or Inf; not sent");
    } else if (t->rc != 0) {
      td_log_error("cannot encode the round %" PRIu64 " update for %016" PRIx64 ": %s",
                   job->round, t->peer, td_strerror(t->rc));
    } else if (live && l != NULL && td_members_reachable(n->members, t->peer)) {
      for (uint32_t c = 0; c < t->chunks; c++) { /* the link queue takes the buffers */
        td__link_queue(l, TD_PRIO_UPDATE, t->bufs[c], t->lens[c], t->first_seq + c);
        t->bufs[c] = NULL;
      }
      td__link_pump(n->net, l);
      td__link_note_update_sent(l, job->round, t->msg_bytes, job->count * sizeof(float),
                                t->codec_text);
    }
    for (uint32_t c = 0; t->bufs && c < t->chunks; c++)
      free(t->bufs[c]);
    free(t->bufs);
    free(t->lens);
  }
  if (live) {
    td__outbox_t *o = s->outbox;
    o->in_flight = false;
    if (job->round > o->sent)
      o->sent = job->round;
    if (o->pending > o->sent) {
      uint64_t next = o->pending;
      o->pending = 0;
      encode_start(o, next);
    }
    o->sent_cb(s);
  }
  free(job);
  td__session_unref(&s); /* may free the run: nothing of it is used past here */
}

/* codec = auto: the link's byte budget is what its measured goodput carries
 * in the time the round computed (at least budget_ms), so the exchange hides
 * behind the next round's compute. Until the first ack measured the link,
 * the cautious start is a sixteenth of the dense message (top-k, about 4 %). */
static void fit_link_codec(td__session_t *s, td__link_t *l, td_link_codec_t *lc,
                           const td__own_round_t *own) {
  const td_layout_t *layout = td_run_layout(s->run);
  td_codec_spec_t spec, dense = {.id = TD_CODEC_NONE};
  double budget = td__link_fit_budget(l, own->round, own->compute_s, s->spec.budget_ms / 1000.0);
  if (!(budget > 0))
    budget = (double)td_codec_message_size(&dense, layout) / 16;
  td_codec_fit_budget(layout, budget, &spec);
  td_link_codec_set_spec(lc, &spec);
}

/* ef_decay: what an error-feedback link holds back was computed at the
 * learning rate of the rounds that made it; it goes out at today's. Scaling
 * it by lr_now / lr_then whenever the rate falls keeps it in proportion to
 * what a step is worth now, so at the end of a schedule nothing old is
 * applied. Why only under AdamW by default:
 * docs/algorithms.md#error-feedback-and-ef_decay; measured: bench/RESULTS.md. */
static void decay_residual(td__outbox_t *o, size_t mi, td_link_codec_t *lc, double lr) {
  if (!td_runspec_ef_decays(&o->s->spec))
    return;
  if (o->last_lr[mi] > 0 && lr < o->last_lr[mi])
    td_link_codec_decay_residual(lc, (float)(lr / o->last_lr[mi]));
  o->last_lr[mi] = lr;
}

static void encode_start(td__outbox_t *o, uint64_t round) {
  td__session_t *s = o->s;
  if (o->in_flight) {
    o->pending = round;
    return;
  }
  /* sync: not in the round's sample (it trained nothing), or the round
   * closed without it (a straggler cut by min_updates or the adaptive
   * deadline): nobody waits for it, so nothing is sent */
  if (s->spec.mode_kind == TD_MODE_SYNC &&
      (round < s->round || !td_run_in_sample(s->run, round, s->rank))) {
    if (round > o->sent)
      o->sent = round;
    return;
  }
  apply_resets(o);
  td__own_round_t *own = &s->own[round % TD__RING];
  encode_job_t *job = calloc(1, sizeof *job);
  if (job == NULL) {
    o->sent = round; /* nothing sent; peers see a late update */
    return;
  }
  s->own_sent_once = true;
  own->uplink = td__transport_uplink(s->node->net);
  *job = (encode_job_t){.s = s, .node_id = s->node->node_id, .run_id = s->run_id,
                        .round = round, .samples = own->samples, .loss = own->loss,
                        .capacity = own->capacity, .uplink = own->uplink, .batch = own->batch,
                        .codec_id = o->codec.id, .delta = td_run_delta(s->run, round),
                        .n_heard = s->n_members, .signer = td__backfill_signer(s)};
  td_run_slice(s->run, round, &job->offset, &job->count);
  const uint8_t *applied_sig;
  if (!td__roundclose_applied_of(s, round - 1, &job->applied, &job->applied_by, &applied_sig))
    job->applied = job->applied_by = 0;
  else if (applied_sig != NULL) {
    job->applied_signed = true;
    memcpy(job->applied_sig, applied_sig, sizeof job->applied_sig);
  }
  /* the capacities echoed: what session.c noted when the round was done */
  memcpy(job->heard, own->heard, sizeof job->heard);
  /* the chunks are stamped on the worker while other frames (acks, snapshot
   * chunks) may be queued: their numbers are reserved now */
  size_t most = td_chunk_count(td_codec_message_bound(td_run_layout(s->run)));
  uint64_t peers[TD_MEMBERS_MAX];
  size_t np = td__session_partners(s, round, true, peers, NULL);
  for (size_t p = 0; p < np; p++) {
    size_t mi = td__session_member(s, peers[p]);
    td_link_codec_t *lc = mi < TD_MEMBERS_MAX ? o->link_codecs[mi] : NULL;
    td__link_t *l = td__link_find(s->node->net, peers[p]);
    if (lc == NULL || l == NULL)
      continue;
    if (s->spec.codec_auto)
      fit_link_codec(s, l, lc, own);
    decay_residual(o, mi, lc, own->lr);
    encode_target_t *t = &job->targets[job->n_targets++];
    *t = (encode_target_t){.peer = peers[p], .codec = lc, .first_seq = td__link_reserve(l, most)};
    td_codec_format(td_link_codec_spec(lc), t->codec_text, sizeof t->codec_text);
  }
  job->req.data = job;
  td__session_ref(s);
  if (uv_queue_work(&s->node->loop, &job->req, encode_work, encode_done) == 0) {
    o->in_flight = true;
  } else {
    td__session_unref(&job->s);
    free(job);
    o->sent = round;
  }
}

void td__outbox_send(td__outbox_t *o, uint64_t round) { encode_start(o, round); }

/* An ack of a complete update we sent: one goodput sample for its link. */
void td__on_ack(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)bytes;
  const Traind__Ack *a = env->ack;
  if (l == NULL)
    return;
  if (a->kind == TD__ACK_CHUNK) {
    td__link_chunk_acked(n->net, l, a->ack_seq);
    return;
  }
  td__session_t *s = td__session_of(n, env->run_id);
  td_ledger_link_t row;
  char codec[32];
  if (s == NULL || a->kind != TD__ACK_UPDATE ||
      !td__link_update_acked(l, a->ack_seq, a->bytes, &row, codec, sizeof codec))
    return;
  row.run_id = s->run_id;
  if (!s->spec.codec_auto)
    row.budget_bytes = NAN;
  td__ledger_link(n->ledger, &row, codec);
}
