/* inbox.c: the members' updates coming in.
 *
 * Threads: the loop thread moves bytes: update chunks from peers go into the
 * session's collector (scheduler/round.h; async: one inbox per peer), and a
 * complete message is handed to the libuv work pool, which decodes it
 * (decode_work: with fragments = P the round's slice alone, td_run_slice,
 * zeros elsewhere) and, in async mode, adds it into the compute thread's inbox;
 * the loop then marks the update complete, gives it its ledger row (one per
 * member and round) and asks the rounds whether the open one may close
 * (rounds.c). Each job holds a reference on the session and touches only
 * what it was handed, so results do not depend on which thread ran it. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"
#include "scheduler/plan.h"

/* A peer's reported capacity or uplink is believed up to this (samples/s, bytes/s). */
#define MAX_REPORTED_RATE 1e12

/* Member mi's update of `round` may still get its ledger row: that round
 * has none yet, and it is one of the 64 before the member's newest recorded
 * one or newer (updates decoded on the pool may complete out of order). So a
 * member gets at most one row per round however often it sends one again. */
static bool may_record(const td__session_t *s, size_t mi, uint64_t round) {
  if (mi >= TD_MEMBERS_MAX || round == 0)
    return false;
  uint64_t newest = s->recorded_round[mi];
  if (round > newest)
    return true;
  return newest - round < 64 && !(s->recorded_mask[mi] >> (newest - round) & 1);
}

/* Member mi's update of `round` got its row (may_record said it may). */
static void note_recorded(td__session_t *s, size_t mi, uint64_t round) {
  uint64_t newest = s->recorded_round[mi];
  if (round > newest) {
    s->recorded_mask[mi] = round - newest < 64 ? s->recorded_mask[mi] << (round - newest) : 0;
    s->recorded_round[mi] = round;
    newest = round;
  }
  s->recorded_mask[mi] |= UINT64_C(1) << (newest - round);
}

/* The dense size of what an update of `round` carries: its slice with
 * fragments = P (td_run_slice), the whole model otherwise. */
static uint64_t dense_bytes_of(const td__session_t *s, uint64_t round) {
  size_t off, count;
  td_run_slice(s->run, round, &off, &count);
  return (uint64_t)count * sizeof(float);
}

static void record_update(td__session_t *s, uint64_t peer, uint64_t peer_round,
                          int64_t staleness, uint64_t bytes, const char *codec) {
  size_t i = td__session_member(s, peer);
  if (!may_record(s, i, peer_round))
    return;
  note_recorded(s, i, peer_round);
  td_ledger_update_t row = {
      .run_id = s->run_id,
      .round = s->spec.mode_kind == TD_MODE_ASYNC ? s->own_done : s->round,
      .peer = peer, .peer_round = peer_round, .staleness = staleness > 0 ? staleness : 0,
      .bytes = bytes, .ratio = (double)dense_bytes_of(s, peer_round) / (double)bytes,
      .arrived = td_clock_wall_s()};
  s->staleness[i] = row.staleness;
  if (i < 64)
    s->heard |= 1ull << i;
  td__ledger_update(s->node->ledger, &row, codec);
}

/* One peer update, decoded on the pool. */
typedef struct {
  uv_work_t req;
  td__session_t *s; /* one reference */
  uint64_t peer, round, ticket, bytes, samples;
  double loss;
  int64_t staleness;
  size_t member;
  const td_layout_t *layout;
  size_t numel;
  size_t offset, count; /* the range the round exchanges: only it may be in msg */
  uint8_t *msg; /* owned */
  size_t len;
  td_run_t *run;
  double weight; /* async: > 0: add weight * update into the compute thread's inbox */
  float *data;
  unsigned codec;
  /* runs with a coordinator (backfill.c): the origin's signature is checked first */
  bool check, proof, forwarded;
  uint64_t run_id;
  uint8_t sig[TD__BACKFILL_SIG], key[TD__BACKFILL_KEY];
  uint8_t digest[TD__BACKFILL_DIGEST]; /* what sig signs, when check */
  int rc;
  char why[256];
} decode_job_t;

/* Work pool: the job's own message and output, the (borrowed) layout. */
static void decode_work(uv_work_t *req) {
  decode_job_t *job = req->data;
  if (job->check && (!job->proof || !td__backfill_verify(job->run_id, job->peer, job->round,
                                                          job->samples, job->msg, job->len,
                                                          job->sig, job->key, job->digest))) {
    job->rc = td_why(job->why, sizeof job->why, TD_EPROTO, "%s",
                     job->proof ? "its origin's signature does not hold"
                                : "it carries no signature (runs with a coordinator need one)");
    return;
  }
  if ((job->data = td_params_alloc(job->numel)) == NULL) {
    job->rc = td_why(job->why, sizeof job->why, TD_ENOMEM, "out of memory for a decoded update");
    return;
  }
  job->rc = td_codec_decode_range(job->layout, job->offset, job->count, job->msg, job->len,
                                  job->data, &job->codec, job->why, sizeof job->why);
  if (job->rc == 0 && job->weight > 0)
    td_run_async_add(job->run, job->data, job->weight);
}

static void update_rejected(td__session_t *s, uint64_t peer, uint64_t round, const char *why) {
  char what[320];
  size_t i = td__session_member(s, peer);
  if (i < TD_MEMBERS_MAX) {
    s->refused_round[i] = round; /* sync/overlap: in its streak when the round closes */
    s->outlier[i].rejected++;
  }
  snprintf(what, sizeof what, "update from %016" PRIx64 " rejected: %s", peer, why);
  td__drop(&s->node->drops, TD__DROP_REJECTED, what);
  td__ledger_event(s->node->ledger, "update_rejected", "peer %016" PRIx64 " round %" PRIu64 ": %s",
                   peer, round, why);
}

static void decode_done(uv_work_t *req, int status) {
  decode_job_t *job = req->data;
  td__session_t *s = job->s;
  (void)status;
  if (job->rc == 0 && s->node->session == s) /* to forward to a member that lacks it */
    td__backfill_keep(s, job->member, job->round, job->samples, job->loss, &job->msg, job->len);
  free(job->msg);
  if (s->node->session == s && s->spec.mode_kind == TD_MODE_ASYNC) {
    if (job->rc != 0) {
      update_rejected(s, job->peer, job->round, job->why);
    } else {
      s->updates_received++;
      s->away_times[job->member] = 0; /* it trains: its away count starts over */
      record_update(s, job->peer, job->round, job->staleness, job->bytes,
                    td_codec_name(job->codec));
    }
    if (job->round > s->peer_round[job->member])
      s->peer_round[job->member] = job->round;
    td__rounds_async_release(s);
  } else if (s->node->session == s) {
    td_chunk_result_t res;
    td_update_info_t info;
    td_round_put_decoded(s->collector, job->round, job->peer, job->ticket, &job->data,
                         job->codec, job->rc == 0, &res, &info);
    if (res == TD_CHUNK_REJECTED && job->forwarded) {
      td__backfill_note_forged(s, job->member, job->round); /* the forwarder's doing */
      td__drop(&s->node->drops, TD__DROP_FORBIDDEN, NULL);
    } else if (res == TD_CHUNK_REJECTED) {
      update_rejected(s, job->peer, job->round, job->why);
    } else if (res == TD_CHUNK_COMPLETED) {
      if (job->check) /* the update held, to match against the coordinator's set */
        td__backfill_note_digest(s, job->member, job->round, job->digest);
      if (job->forwarded)
        td__backfill_note_taken(s, job->member, job->round);
      s->updates_received++;
      s->away_times[job->member] = 0; /* it trains: its away count starts over */
      record_update(s, job->peer, info.round, (int64_t)s->round - (int64_t)info.round,
                    info.bytes, td_codec_name(info.codec));
      if (info.round == s->round)
        td__rounds_note_arrival(s);
    } /* LATE: its round closed without it while it decoded */
    td__rounds_try_close(s);
  }
  td_params_free(&job->data);
  free(job);
  td__session_unref(&s);
}

/* async: a peer's update of round j arrives while we are at own_done; it
 * weighs its sample share of a global round times (1 + a)^-kappa with
 * a = own_done - j, and is dropped (and counted) when a > S. */
static double async_weight(td__session_t *s, const td_update_info_t *info, int64_t *staleness) {
  *staleness = (int64_t)s->own_done - (int64_t)info->round;
  double w = td_plan_staleness_weight(*staleness, s->spec.max_staleness, s->spec.staleness_kappa);
  if (w <= 0)
    return 0;
  unsigned steps = td_run_steps_of(s->run, info->round);
  double share = (double)info->samples / ((double)s->spec.batch * (steps ? steps : 1));
  return w * (share < 1 ? share : 1);
}

/* Every chunk of an update is in: decode it on the pool. */
static void assembled(td__session_t *s, size_t mi, td_round_t *collector,
                      const td_update_info_t *info, bool forwarded) {
  bool async = s->spec.mode_kind == TD_MODE_ASYNC;
  decode_job_t *job = calloc(1, sizeof *job);
  int rc = job == NULL ? TD_ENOMEM
                       : td_round_take_message(collector, info->round, info->peer, &job->msg,
                                               &job->len, &job->ticket);
  if (rc == 0) {
    /* runs with a coordinator: only a signed update may be averaged (or forwarded) */
    job->check = td__backfill_on(s) && td__access_secure(s->node->access);
    if (job->check)
      job->proof = td__backfill_proof(s, mi, info->round, job->sig, job->key);
    job->run_id = s->run_id;
    job->forwarded = forwarded;
    job->s = s;
    job->peer = info->peer;
    job->round = info->round;
    job->bytes = info->bytes;
    job->samples = info->samples;
    job->loss = info->loss;
    job->member = mi;
    job->layout = td_run_layout(s->run);
    job->numel = td_round_numel(collector);
    td_run_slice(s->run, info->round, &job->offset, &job->count);
    job->run = s->run;
    if (async)
      job->weight = async_weight(s, info, &job->staleness);
  }
  if (async) { /* the inbox moves on to the peer's next round at once */
    uint64_t peer = info->peer;
    td_round_begin(collector, info->round + 1, &peer, 1);
    if (rc == 0 && !(job->weight > 0)) {
      s->stale_dropped++;
      td__drop(&s->node->drops, TD__DROP_LATE, "async update older than the staleness bound");
      record_update(s, info->peer, info->round, job->staleness, info->bytes,
                    td__outbox_codec(s->outbox));
      if (info->round > s->peer_round[mi])
        s->peer_round[mi] = info->round;
      td__rounds_async_release(s);
      free(job->msg);
      free(job);
      return;
    }
  }
  job->req.data = job;
  if (rc == 0) {
    td__session_ref(s);
    if (uv_queue_work(&s->node->loop, &job->req, decode_work, decode_done) == 0)
      return;
    decode_work(&job->req); /* cannot happen in practice: decode here rather than lose it */
    decode_done(&job->req, 0);
    return;
  }
  td_log_error("cannot decode the round %" PRIu64 " update of %016" PRIx64 ": %s", info->round,
               info->peer, td_strerror(rc));
  if (job != NULL)
    free(job->msg);
  free(job);
}

static double finite_rate(double v) { return isfinite(v) && v > 0 && v < MAX_REPORTED_RATE ? v : 0; }

/* The figures member mi's update chunk reports: its capacity and uplink,
 * and the capacities it echoes. */
static void note_report(td__session_t *s, size_t mi, const Traind__UpdateChunk *up) {
  td__peer_report_t *rep = &s->peer_report[mi][up->round % TD__RING];
  *rep = (td__peer_report_t){.round = up->round, .capacity = finite_rate(up->capacity),
                             .uplink = finite_rate(up->uplink)};
  /* member indices stay (a joiner comes last, a member back keeps its
   * place), so a sender that took a late join in before or after this node
   * did echoes one member more or fewer: the members both know keep their
   * figures (each member must count the same echoes, or their plans part),
   * the rest are unknown */
  size_t echoed = up->n_heard_capacity < s->n_members ? up->n_heard_capacity : s->n_members;
  for (size_t i = 0; i < echoed; i++)
    rep->heard[i] = finite_rate(up->heard_capacity[i]);
}

void td__on_update(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  const Traind__UpdateChunk *up = env->update;
  td__session_t *s = td__session_of(n, env->run_id);
  /* every chunk frees the sender's window, whatever becomes of it: one left
   * unacked (a stopped run's, say) held the window shut until it expired */
  td__link_send_ack(n->net, env->sender, env->run_id, TD__ACK_CHUNK, env->seq, up->payload.len);
  if (s == NULL) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "update for a run this node is not running");
    return;
  }
  /* a member's update forwarded by another, which this node asked for (backfill.c) */
  bool forwarded = up->origin != 0 && up->origin != env->sender;
  uint64_t peer = forwarded ? up->origin : env->sender;
  size_t mi = forwarded ? td__backfill_take_chunk(s, env->sender, up)
                        : td__session_member(s, env->sender);
  if (forwarded && mi == TD_MEMBERS_MAX) {
    td__drop(&n->drops, TD__DROP_FORBIDDEN, "a forwarded update this node did not ask for");
    return;
  }
  if (mi == TD_MEMBERS_MAX || s->out[mi]) { /* out: put out of the run (comeback.c) */
    td__drop(&n->drops, TD__DROP_NOT_MEMBER, mi == TD_MEMBERS_MAX
                                                 ? "update from a node outside the run"
                                                 : NULL);
    return;
  }
  if (!forwarded && td__backfill_asked_elsewhere(s, mi, up->round)) {
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL); /* its copy comes from the one asked */
    return;
  }
  if (mi < 64)
    s->sent_once |= UINT64_C(1) << mi;
  if (up->chunk == 0 && up->signature.len > 0)
    td__backfill_note_signature(s, mi, up->round, up->signature.data, up->signature.len);
  if (up->chunk == 0 && !forwarded && td__roundclose_coordinated(s) && up->round > 1)
    td__roundclose_check_echo(s, mi, up->round - 1, up->applied_members, up->applied_by,
                              up->applied_signature.data, up->applied_signature.len);
  note_report(s, mi, up); /* a copy carries what its origin told the forwarder */
  bool async = s->spec.mode_kind == TD_MODE_ASYNC;
  td_round_t *collector = async ? s->peer_inbox[mi] : s->collector;
  if (collector == NULL)
    return;
  if (async && up->round >= td_round_current(collector) + TD_ROUND_SLOTS)
    td_round_begin(collector, up->round, &peer, 1); /* the peer skipped ahead: follow it */
  td_chunk_result_t res;
  td_update_info_t info;
  if (td_round_add_chunk(collector, peer, up->round, up->samples, up->chunk, up->chunks,
                         up->total_bytes, up->payload.data, up->payload.len, up->loss, &res,
                         &info) != 0) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "update chunk inconsistent with the model");
    return;
  }
  if (l != NULL)
    td__link_note_recv(l, bytes);
  switch (res) {
  case TD_CHUNK_ACCEPTED: s->bytes_recv_round += bytes; break;
  case TD_CHUNK_DUPLICATE: td__drop(&n->drops, TD__DROP_DUPLICATE, NULL); break;
  case TD_CHUNK_AHEAD: td__drop(&n->drops, TD__DROP_AHEAD, "update beyond the round window"); break;
  case TD_CHUNK_LATE:
    /* the first chunk of a member's late update of a round is counted late
     * and recorded; any chunk again of that round or an older one is only
     * counted (a member sending past rounds over and over adds no rows) */
    if (!may_record(s, mi, up->round)) {
      td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    } else if (up->chunk == 0) {
      td__drop(&n->drops, TD__DROP_LATE, NULL);
      record_update(s, peer, up->round, (int64_t)s->round - (int64_t)up->round,
                    up->total_bytes, td__outbox_codec(s->outbox));
    }
    break;
  case TD_CHUNK_COMPLETED: /* td_round_put_decoded reports these two, when the pool */
  case TD_CHUNK_REJECTED:  /* has decoded the message (decode_done) */
    break;
  case TD_CHUNK_ASSEMBLED:
    s->bytes_recv_round += bytes;
    if (l != NULL && !forwarded) {
      td__link_note_update_recv(l, info.bytes, dense_bytes_of(s, info.round));
      /* the network's part is done: the ack measures the link, not our decoder */
      td__link_send_ack(n->net, env->sender, s->run_id, TD__ACK_UPDATE, info.round, info.bytes);
    }
    assembled(s, mi, collector, &info, forwarded);
    break;
  }
}
