/* transfer.c: resumable blob transfer, and direct knowledge transfer on it.
 *
 * Threads: loop thread. A blob (a model, a late joiner's seed, a
 * reconciliation message) goes out as SnapshotChunks on the bulk class of
 * the link queue (behind updates), cut by the one chunker of proto/limits.h,
 * in order; the receiver takes them in order and, when one stops coming,
 * asks again from the offset it holds (SnapshotRequest). One incoming
 * transfer at a time.
 *
 * Knowledge transfer (docs/algorithms.md#knowledge-transfer): every `transfer` rounds each node
 * scores its local model on the same validation rows and floods (round,
 * loss) in an EvalReport. A node whose loss exceeds the best recent report by
 * more than transfer_margin fetches that node's model and the compute thread
 * merges it before its next round. snapshots.c routes the messages: requests
 * for a late-join seed and for reconciliation messages go to join.c and
 * reconcile.c, the rest here (td__xfer_on_request, td__xfer_on_chunk).
 *
 * What one member is served is bounded: per kind of blob (a model or seed,
 * a reconciliation message, a hub's mean, a state for a repair) only its newest version, and of
 * that at most TD__SERVE_COPIES times the blob's bytes; a request beyond that
 * (an older version, or the same one asked again and again) is counted as a
 * duplicate and not answered. An honest receiver asks once and resumes from
 * where it stopped, well inside the bound. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* A member's last validation score. */
typedef struct {
  uint64_t round;
  double loss;
  bool have;
} report_t;

/* What one member was served of one kind of blob: its newest version (the
 * round it is of) and the bytes of it so far. */
typedef struct {
  uint64_t round, bytes;
} served_t;

struct td__xfer {
  td__session_t *s;
  /* the incoming transfer */
  bool active, join; /* join: the late-join seed, not a knowledge transfer */
  uint64_t peer, round, total, received;
  uint8_t *buf;
  double last; /* mono time of the last progress */
  /* knowledge transfer */
  report_t reports[TD_MEMBERS_MAX];
  float *probe_blob; /* own model at the last probe, served to laggards */
  uint64_t probe_round;
  double probe_loss;
  uint64_t transfers, snapshots_served;
  uint64_t merge_peer, merge_round; /* the model last handed to the run to merge */
  /* by member index and blob kind (within_budget) */
  served_t served[TD_MEMBERS_MAX][TD__SERVE_KINDS];
};

int td__xfer_open(td__xfer_t **out, td__session_t *s) {
  td__xfer_t *x = calloc(1, sizeof *x);
  if (x == NULL)
    return TD_ENOMEM;
  x->s = s;
  *out = x;
  return 0;
}

static void incoming_reset(td__xfer_t *x) {
  free(x->buf);
  x->buf = NULL;
  x->active = x->join = false;
  x->peer = x->round = x->total = x->received = 0;
}

void td__xfer_close(td__xfer_t **self_p) {
  td__xfer_t *x = *self_p;
  if (x == NULL)
    return;
  *self_p = NULL;
  free(x->buf);
  free(x->probe_blob);
  free(x);
}

void td__xfer_stats(const td__xfer_t *x, td__run_stats_t *out) {
  out->transfers = x ? x->transfers : 0;
  out->snapshots_served = x ? x->snapshots_served : 0;
}

/* May `l`'s peer be served `bytes` more of version `round` of a blob of
 * `total` bytes of the kind tmpl names? Counts them when it may. */
static bool within_budget(td__session_t *s, td__link_t *l, const Traind__SnapshotChunk *tmpl,
                          uint64_t total, uint64_t bytes) {
  size_t i = td__session_member(s, td__link_peer(l));
  if (s->xfer == NULL || i == TD_MEMBERS_MAX)
    return true; /* not a member's request: nothing to bound per member */
  size_t kind = tmpl->repair ? 3 : !tmpl->reconcile ? 0 : tmpl->mean_of == 0 ? 1 : 2;
  served_t *b = &s->xfer->served[i][kind];
  if (tmpl->round > b->round) { /* a newer version: a fresh budget */
    b->round = tmpl->round;
    b->bytes = 0;
  }
  if (tmpl->round < b->round || b->bytes + bytes > TD__SERVE_COPIES * total)
    return false;
  b->bytes += bytes;
  return true;
}

void td__xfer_serve(td__session_t *s, td__link_t *l, const void *blob, uint64_t total,
                    uint64_t offset, const Traind__SnapshotChunk *tmpl, bool supersede) {
  if (offset >= total || !within_budget(s, l, tmpl, total, total - offset)) {
    td__drop(&s->node->drops, TD__DROP_DUPLICATE, NULL); /* asked more than it may be served */
    return;
  }
  if (supersede)
    td__link_drop_class(l, TD_PRIO_BULK);
  const uint8_t *src = blob;
  for (uint64_t off = offset; off < total; off += td_chunk_len(total, off)) {
    Traind__SnapshotChunk ch = *tmpl;
    ch.offset = off;
    ch.total_bytes = total;
    ch.payload.data = (uint8_t *)src + off;
    ch.payload.len = td_chunk_len(total, off);
    Traind__Envelope out = TRAIND__ENVELOPE__INIT;
    out.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK;
    out.snapshot_chunk = &ch;
    out.run_id = s->run_id;
    out.sender = s->node->node_id;
    out.seq = td__link_reserve(l, 1);
    uint8_t *buf;
    size_t len;
    if (td_wire_pack(&out, &buf, &len) != 0)
      break;
    td__link_queue(l, TD_PRIO_BULK, buf, len, out.seq);
  }
  if (s->xfer != NULL)
    s->xfer->snapshots_served++;
  td__link_pump(s->node->net, l);
}

static void serve_model(td__session_t *s, td__link_t *l, const void *blob, uint64_t total,
                        uint64_t round, uint64_t offset) {
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = round;
  td__xfer_serve(s, l, blob, total, offset, &tmpl, true);
}

void td__xfer_request(td__session_t *s, td__link_t *l, uint64_t round, uint64_t offset,
                      bool join, bool reconcile) {
  Traind__SnapshotRequest rq = TRAIND__SNAPSHOT_REQUEST__INIT;
  rq.round = round;
  rq.offset = offset;
  rq.join = join;
  rq.reconcile = reconcile;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST;
  env.snapshot_request = &rq;
  env.run_id = s->run_id;
  td__link_send(s->node->net, l, &env);
}

/* Ask for the rest of the incoming transfer. */
static void resume(td__xfer_t *x) {
  td__link_t *l = td__link_find(x->s->node->net, x->peer);
  if (l == NULL)
    return;
  td__xfer_request(x->s, l, x->round, x->received, x->join, false);
  x->last = td_clock_mono_s();
}

static bool begin_incoming(td__xfer_t *x, uint64_t peer, uint64_t round, uint64_t bytes,
                           bool join) {
  if ((x->buf = malloc(bytes)) == NULL)
    return false;
  x->total = bytes;
  x->received = 0;
  x->active = true;
  x->join = join;
  x->peer = peer;
  x->round = round;
  resume(x);
  return true;
}

void td__xfer_fetch_seed(td__xfer_t *x, uint64_t sponsor, uint64_t round, uint64_t bytes) {
  if (!begin_incoming(x, sponsor, round, bytes, true))
    td_log_error("out of memory for the %" PRIu64 "-byte model to join from", bytes);
}

static void decide_transfer(td__xfer_t *x) {
  td__session_t *s = x->s;
  if (x->active)
    return;
  size_t best = TD_MEMBERS_MAX;
  for (size_t i = 0; i < s->n_members; i++) {
    const report_t *r = &x->reports[i];
    if (!r->have || r->round + s->spec.transfer < x->probe_round) /* too old */
      continue;
    if (best == TD_MEMBERS_MAX || r->loss < x->reports[best].loss ||
        (r->loss == x->reports[best].loss && s->members[i] < s->members[best]))
      best = i;
  }
  if (best == TD_MEMBERS_MAX || s->members[best] == s->node->node_id ||
      !td_members_reachable(s->node->members, s->members[best]) ||
      !(x->probe_loss > (1 + s->spec.transfer_margin) * x->reports[best].loss))
    return;
  td_log_info("round %" PRIu64 ": validation loss %.4f lags %016" PRIx64 "'s %.4f: fetching its "
              "model", x->probe_round, x->probe_loss, s->members[best], x->reports[best].loss);
  begin_incoming(x, s->members[best], x->reports[best].round,
                 td_run_numel(s->run) * sizeof(float), false);
}

void td__xfer_probe(td__session_t *s, td_run_event_t *ev) {
  td__xfer_t *x = s->xfer;
  free(x->probe_blob);
  x->probe_blob = ev->blob;
  ev->blob = NULL;
  x->probe_round = ev->round;
  x->probe_loss = ev->loss;
  x->reports[s->rank] = (report_t){.round = ev->round, .loss = ev->loss, .have = true};
  Traind__EvalReport rep = TRAIND__EVAL_REPORT__INIT;
  rep.round = ev->round;
  rep.loss = ev->loss;
  rep.accuracy = ev->accuracy;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_EVAL_REPORT;
  env.eval_report = &rep;
  env.run_id = s->run_id;
  td__session_send_all(s, &env);
  decide_transfer(x);
}

/* Heartbeat: resume a transfer that stalled; give up when its peer is gone. */
void td__xfer_tick(td__session_t *s) {
  td__xfer_t *x = s->xfer;
  if (!x->active ||
      td_clock_mono_s() - x->last <= (x->join ? TD__JOIN_STALL_S : TD__XFER_STALL_S))
    return;
  if (td_members_reachable(s->node->members, x->peer)) {
    resume(x); /* from what arrived */
  } else if (x->join) {
    td_log_error("run %016" PRIx64 ": the member serving the model to join from is gone; "
                 "giving up the run", s->run_id);
    td_run_stop(s->run);
    incoming_reset(x);
  } else {
    incoming_reset(x);
  }
}

void td__on_eval_report(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t b) {
  (void)l;
  (void)b;
  td__session_t *s = td__session_of(n, env->run_id);
  size_t mi = s != NULL ? td__session_member(s, env->sender) : TD_MEMBERS_MAX;
  if (mi == TD_MEMBERS_MAX || !isfinite(env->eval_report->loss) || env->eval_report->loss < 0) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "eval report outside the run or not finite");
    return;
  }
  s->xfer->reports[mi] = (report_t){.round = env->eval_report->round,
                                    .loss = env->eval_report->loss, .have = true};
}

/* A peer asks for our probed model (snapshots.c routed it here). */
void td__xfer_on_request(td__session_t *s, bool member, const Traind__SnapshotRequest *rq,
                         td__link_t *l, td__drops_t *drops) {
  uint64_t total = s != NULL ? td_run_numel(s->run) * sizeof(float) : 0;
  if (l == NULL || !member || s->xfer->probe_blob == NULL || rq->offset >= total) {
    td__drop(drops, TD__DROP_WRONG_RUN, "snapshot request we cannot serve");
    return;
  }
  serve_model(s, l, s->xfer->probe_blob, total, s->xfer->probe_round, rq->offset);
}

void td__xfer_merged(td__session_t *s, const td_run_event_t *ev) {
  td__xfer_t *x = s->xfer;
  td__node_t *n = s->node;
  if (x == NULL)
    return;
  if (ev->samples > 0) {
    x->transfers++;
    td__ledger_event(n->ledger, "transfer", "the model of %016" PRIx64 " (round %" PRIu64
                     "): %s", x->merge_peer, x->merge_round, ev->message);
    td_log_info("the model of %016" PRIx64 ": %s", x->merge_peer, ev->message);
    return;
  }
  td__drop(&n->drops, TD__DROP_REJECTED, "a transferred model scored no better than ours");
  td__ledger_event(n->ledger, "transfer_refused", "the model of %016" PRIx64 " (round %" PRIu64
                   "): %s", x->merge_peer, x->merge_round, ev->message);
  td_log_warn("the model of %016" PRIx64 ": %s", x->merge_peer, ev->message);
}

/* A whole blob arrived: seed the run (join) or hand the model to the run,
 * which scores it before it merges it (td__xfer_merged). */
static void incoming_done(td__xfer_t *x, uint64_t round) {
  td__session_t *s = x->s;
  td__node_t *n = s->node;
  const float *model = (const float *)(const void *)x->buf;
  size_t numel = x->total / sizeof(float), bad = 0;
  for (size_t i = 0; i < numel; i++)
    bad += !isfinite(model[i]);
  if (x->join) {
    if (bad) { /* ask again: the serving node's copy cannot hold NaN */
      td__drop(&n->drops, TD__DROP_REJECTED, "join snapshot holds NaN/Inf; fetching it again");
      x->received = 0;
      resume(x);
      return;
    }
    td_run_seed(s->run, model, x->total);
    td__ledger_event(n->ledger, "joined", "run %016" PRIx64 " from round %" PRIu64
                     " with the model of %016" PRIx64 " (%" PRIu64 " bytes)", s->run_id,
                     s->first_round, x->peer, x->total);
    td_log_info("joined run %016" PRIx64 " at round %" PRIu64 " with the model of %016" PRIx64
                " (%" PRIu64 " KiB)", s->run_id, s->first_round, x->peer, x->total / 1024);
  } else if (bad) {
    td__drop(&n->drops, TD__DROP_REJECTED, "transferred model holds NaN/Inf; not merged");
  } else {
    td_run_merge(s->run, model, s->spec.transfer_lambda); /* scored first: td__xfer_merged */
    x->merge_peer = x->peer;
    x->merge_round = round;
    td_log_info("fetched the model of %016" PRIx64 " (round %" PRIu64 "); it is scored on "
                "the probe rows before a merge", x->peer, round);
  }
  incoming_reset(x);
}

void td__xfer_on_chunk(td__session_t *s, uint64_t sender, const Traind__SnapshotChunk *ch,
                       td__drops_t *drops) {
  td__xfer_t *x = s != NULL ? s->xfer : NULL;
  if (x == NULL || !x->active || sender != x->peer || ch->total_bytes != x->total ||
      ch->offset != x->received || ch->payload.len == 0 ||
      ch->payload.len > x->total - x->received) {
    td__drop(drops, TD__DROP_DUPLICATE, NULL); /* stale or out of order: the resume asks again */
    return;
  }
  memcpy(x->buf + ch->offset, ch->payload.data, ch->payload.len);
  x->received += ch->payload.len;
  x->last = td_clock_mono_s();
  if (x->received == x->total)
    incoming_done(x, ch->round);
}
