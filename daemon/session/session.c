/* session.c: one training run on this node, from start to finish.
 *
 * Threads: loop thread. A session is allocated when a run starts (trainctl
 * start, a RunStart from a peer, an admission as a late joiner) and holds
 * everything the run needs on the loop side: the compute thread's handle
 * (daemon/run/run.h), the members, the round collectors, and the parts' own
 * state (outbox, transfer, join, reconciliation). It is reference counted:
 * the node holds one reference while the run runs, and every work-pool job
 * that borrows the run's buffers holds one more (an encode job reads the
 * delta, the layout and the link codecs; a decode job the layout; an
 * aggregation the delta, the peers' updates and the round's average). Finishing a run drops the node's
 * reference and keeps a snapshot of its figures for status; the memory, the
 * td_run_t included, goes with the last reference, so a stop while an
 * update is being encoded, decoded or aggregated frees nothing the job
 * still reads. A new run
 * gets a new session: nothing is reset by hand. The compute thread's events
 * arrive here and go to the part they concern. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* The partitions (ranks) of the run that no round trained, "2 (node ID)":
 * the members whose share of the data the model never saw. Empty while none
 * or before the run closed a round. */
static void untrained_text(const td__session_t *s, char *out, size_t len, bool with_nodes) {
  size_t used = 0;
  out[0] = '\0';
  if (s->rounds_done == 0)
    return;
  for (size_t i = 0; i < s->n_members && i < 64 && used < len; i++) {
    if (s->trained & (1ull << i))
      continue;
    if (with_nodes)
      used += (size_t)snprintf(out + used, len - used, "%s%zu (node %016" PRIx64 ")",
                               used ? ", " : "", i, s->members[i]);
    else
      used += (size_t)snprintf(out + used, len - used, "%s%zu", used ? "," : "", i);
  }
}

static void session_stats(const td__session_t *s, td__run_stats_t *out) {
  *out = (td__run_stats_t){.run_id = s->run_id, .state = s->state, .rounds_done = s->rounds_done,
                           .rounds = s->rounds, .first_round = s->first_round, .rank = s->rank,
                           .nodes = s->n_members, .loss = s->own_loss,
                           .eval_accuracy = s->last_eval_acc, .test_accuracy = s->test_accuracy,
                           .test_loss = s->state == TD__RUN_FINISHED ? s->test_loss : NAN,
                           .eval_bpb = s->last_eval_bpb, .test_bpb = s->test_bpb,
                           .capacity = s->capacity, .updates_received = s->updates_received,
                           .late_peers = s->late_peers, .cut_peers = s->cut_peers,
                           .row_round = s->row_round, .row_bytes_sent = s->row_bytes_sent,
                           .row_bytes_recv = s->row_bytes_recv,
                           .row_mixed = s->row_mixed, .row_consensus = s->row_consensus};
  snprintf(out->topology, sizeof out->topology, "%.31s", s->spec.topology);
  snprintf(out->codec, sizeof out->codec, "%s", td__outbox_codec(s->outbox));
  snprintf(out->error, sizeof out->error, "%s", s->error);
  snprintf(out->refused, sizeof out->refused, "%s", s->refused);
  untrained_text(s, out->untrained, sizeof out->untrained, true);
  snprintf(out->backend, sizeof out->backend, "%s", s->backend);
  snprintf(out->backend_reason, sizeof out->backend_reason, "%s", s->backend_reason);
  td_agg_spec_t agg;
  td_runspec_agg(&s->spec, &agg);
  td_agg_format(&agg, out->aggregate, sizeof out->aggregate);
  for (size_t i = 0; i < s->n_members; i++) {
    const td__outlier_t *o = &s->outlier[i];
    if (o->rejected + o->clipped + o->clamped + o->mismatched > 0) {
      out->outlier_id[out->n_outliers] = s->members[i];
      out->outliers[out->n_outliers++] = *o;
    }
  }
  td__xfer_stats(s->xfer, out);
  td__join_stats(s->join, out);
  td__reconcile_stats(s->recon, out);
  td__verify_stats(s->verify, out);
}

void td__session_stats(td__node_t *n, td__run_stats_t *out) {
  if (n->session != NULL) {
    session_stats(n->session, out);
  } else if (n->last_run != NULL) {
    *out = *n->last_run;
  } else {
    *out = (td__run_stats_t){.state = TD__RUN_IDLE, .codec = "none", .loss = NAN,
                             .eval_accuracy = NAN, .test_accuracy = NAN, .test_loss = NAN,
                             .capacity = NAN,
                             .eval_bpb = NAN, .test_bpb = NAN};
  }
}

/* The session's destructor (core.c calls it with the last reference). */
static void session_free(td__session_t *s) {
  td__outbox_close(&s->outbox);
  td__xfer_close(&s->xfer);
  td__join_close(&s->join);
  td__reconcile_close(&s->recon);
  td__verify_close(&s->verify);
  td__backfill_close(&s->backfill);
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++)
    td_round_close(&s->peer_inbox[i]);
  td_round_close(&s->collector);
  td_run_close(&s->run); /* last: the layout the collectors borrow */
  free(s->spec_text);
  free(s->kept_model);
  free(s);
}


void td__session_finish(td__node_t *n, td__run_state_t state, double test_accuracy,
                        const char *error) {
  td__session_t *s = n->session;
  if (s == NULL)
    return;
  const char *name = td__run_state_name(state);
  s->state = state;
  if (error)
    snprintf(s->error, sizeof s->error, "%s", error);
  char untrained[192], who[256];
  untrained_text(s, untrained, sizeof untrained, false);
  untrained_text(s, who, sizeof who, true);
  td__model_keep(n, s, name, isnan(s->test_bpb) ? test_accuracy : s->test_bpb);
  td__ledger_run_end_untrained(n->ledger, s->run_id, name, test_accuracy, untrained);
  n->ended_run = s->run_id;
  if (who[0] != '\0' && state != TD__RUN_MISSED) {
    td_log_warn("run %016" PRIx64 " %s with partitions no round trained: %s", s->run_id, name,
                who);
    td__ledger_event(n->ledger, "partition_untrained", "run %016" PRIx64 ": %s", s->run_id, who);
  }
  td__ledger_event(n->ledger, "run_end", "run %016" PRIx64 " %s%s%s", s->run_id, name,
                   error ? ": " : "", error ? error : "");
  td_log_info("run %016" PRIx64 " %s after %" PRIu64 " rounds%s%s", s->run_id, name,
              s->rounds_done, error ? ": " : "", error ? error : "");
  if (n->last_run != NULL || (n->last_run = malloc(sizeof *n->last_run)) != NULL)
    session_stats(s, n->last_run);
  /* the compute thread ends now (a new run's must not overlap it); the
   * run's memory goes with the last reference to s */
  td_run_join(s->run);
  td__backfill_retire(n, s); /* members still closing the last round may ask it */
  n->session = NULL;
  td__session_unref(&s);
  td__ledgerq_flush(n->ledger);
}

void td__session_settle(td__node_t *n) {
  td__session_t *s = n->session;
  if (s != NULL && s->finish_pending && !td__verify_pending(s->verify, s->rounds))
    td__session_finish(n, TD__RUN_FINISHED, s->test_accuracy, NULL);
}

void td__session_on_state_hash(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                               size_t bytes) {
  td__on_state_hash(n, env, l, bytes);
  td__session_settle(n);
}

void td__session_abandon(td__node_t *n, const char *why) {
  td__session_t *s = n->session;
  if (s == NULL)
    return;
  /* rounds below the open one have their ledger rows; none at all when it
   * fell behind before closing one */
  uint64_t last = s->rounds_done > 0 ? s->round - 1 : s->first_round - 1;
  if (n->rejoin.run_id == s->run_id && s->rounds_done == 0)
    last = n->rejoin.last_round;
  n->rejoin.run_id = s->run_id;
  n->rejoin.last_round = last;
  td_log_warn("run %016" PRIx64 ": %s; leaving it at round %" PRIu64 " to be taken back from "
              "the members' model", s->run_id, why, s->round);
  td__ledger_event(n->ledger, "run_behind", "run %016" PRIx64 " at round %" PRIu64 ": %s",
                   s->run_id, s->round, why);
  /* what it sent before the pause may never be acked: free the windows for
   * what it will send once it is back */
  for (size_t i = 0; i < s->n_members; i++) {
    td__link_t *l = s->members[i] != n->node_id ? td__link_find(n->net, s->members[i]) : NULL;
    if (l != NULL)
      td__link_restart(n->net, l);
  }
  s->state = TD__RUN_IDLE; /* not ended: the run goes on, this node goes back into it */
  if (n->last_run != NULL || (n->last_run = malloc(sizeof *n->last_run)) != NULL)
    session_stats(s, n->last_run);
  td_run_join(s->run);
  n->session = NULL;
  td__session_unref(&s);
  td__ledgerq_flush(n->ledger);
}

static void on_round_done(td__session_t *s, const td_run_event_t *ev) {
  td__own_round_t *o = &s->own[ev->round % TD__RING];
  *o = (td__own_round_t){.round = ev->round, .samples = ev->samples, .loss = ev->loss,
                         .compute_s = ev->compute_s, .idle_s = ev->idle_s, .lr = ev->lr,
                         .capacity = ev->capacity, .done_at = td_clock_mono_s(),
                         .batch = ev->batch, .steps = ev->steps, .fill_steps = ev->fill_steps,
                         .fill_s = ev->fill_s, .eval_acc = NAN,
                         .eval_bpb = NAN};
  s->own_done = ev->round;
  s->own_loss = ev->loss;
  s->node->totals.samples += ev->samples;
  s->node->totals.compute_s += ev->compute_s + ev->fill_s; /* as the ledger's rounds row */
  s->node->totals.wait_s += ev->idle_s;
  s->lr = ev->lr;
  s->capacity = ev->capacity;
  if (ev->fresh != s->own_fresh) /* overlap's exchange-bound rounds: scheduler/overlap.h */
    td_log_info("run %016" PRIx64 ": %s from round %" PRIu64, s->run_id,
                ev->fresh ? "exchanges take several times the compute: rounds start from "
                            "their predecessor's average (no delay)"
                          : "rounds overlap their predecessor's exchange again",
                ev->round);
  s->own_fresh = ev->fresh;
  if (ev->round == s->round)
    s->deadline = o->done_at + s->spec.round_timeout;
  td__rounds_heard(s, ev->round, o->heard); /* echoed with the update (capacity.c) */
  td__outbox_send(s->outbox, ev->round);
  td__rounds_own_done(s, ev->round);
}

/* The compute thread copies the model for a checkpoint only once the last
 * one left the ledger's queue (written, or the ledger cannot be written and
 * holds it within its bound): one copy at a time is on its way, which is
 * what the policy's memory estimate counts (policy.c). */
static void checkpoints_settled(void *user) {
  td__node_t *n = user;
  td__session_t *s = n->session;
  if (s != NULL && s->checkpoint_out && td__ledgerq_checkpoints_settled(n->ledger)) {
    s->checkpoint_out = false;
    td_run_checkpoint_written(s->run);
  }
}

/* The per-client view: every client's training rows per label (client 0 of
 * each node while a node is one client; with clients = K, node k / K's
 * client k % K), known to every node alike. */
static void record_label_counts(td__session_t *s, td_run_t *run) {
  unsigned parts, per_node = td_run_clients(run);
  int classes;
  const uint64_t *counts = td_run_label_counts(run, &parts, &classes);
  for (unsigned k = 0; counts != NULL && k < parts; k++)
    td__ledger_client_labels(s->node->ledger, s->run_id, k / per_node, k % per_node,
                             counts + (size_t)k * (size_t)classes, (unsigned)classes);
}

/* The compute thread's events, on the loop thread. Stops at the end of the
 * run: the events left are freed with the run. */
static void on_run_events(td_run_t *run, void *user) {
  td__session_t *s = user;
  td__node_t *n = s->node;
  td_run_event_t ev;
  while (n->session == s && td_run_next_event(run, &ev)) {
    switch (ev.kind) {
    case TD_RUN_READY:
      s->rounds = td_run_rounds(run);
      s->ready = true;
      snprintf(s->backend, sizeof s->backend, "%s", ev.backend);
      snprintf(s->backend_reason, sizeof s->backend_reason, "%s", ev.message);
      td_log_info("run %016" PRIx64 ": backend %s", s->run_id, s->backend_reason);
      td_log_info("run %016" PRIx64 ": dataset ready, %" PRIu64 " rounds of %u steps%s, "
                  "mode %s, local batch %u (%s), rank %u of %zu",
                  s->run_id, s->rounds, td_run_steps_of(run, 1),
                  s->spec.qsr_alpha > 0 ? " (QSR)" : "", s->spec.mode,
                  td_run_local_batch(run), s->spec.batching, s->rank, s->n_members);
      if (ev.samples > 0)
        td_log_info("run %016" PRIx64 ": partition %s: %" PRIu64 " training rows on rank %u",
                    s->run_id, s->spec.partition, ev.samples, s->rank);
      record_label_counts(s, run);
      td__rounds_sample_ready(s);
      break;
    case TD_RUN_CLIENT_EVAL: {
      td_ledger_client_eval_t row = {.run_id = s->run_id, .round = ev.round, .node = s->rank,
                                     .client = ev.client, .rows = ev.samples, .loss = ev.loss,
                                     .accuracy = ev.accuracy};
      td__ledger_client_eval(n->ledger, &row);
      break;
    }
    case TD_RUN_ROUND_DONE: on_round_done(s, &ev); break;
    case TD_RUN_PROBE: td__xfer_probe(s, &ev); break;
    case TD_RUN_MERGE: td__xfer_merged(s, &ev); break;
    case TD_RUN_ANCHOR: td__join_anchor(s, &ev); break;
    case TD_RUN_RECONCILE: td__reconcile_own(s, &ev); break;
    case TD_RUN_VERIFY: td__verify_own(s, &ev); break;
    case TD_RUN_MODEL: td__model_hold(s, ev.round, ev.blob); break;
    case TD_RUN_CHECKPOINT: {
      size_t bytes = td_run_numel(run) * sizeof(float);
      float *copy = malloc(bytes); /* a failed run keeps its last checkpoint's model */
      if (copy != NULL) {
        memcpy(copy, ev.blob, bytes);
        td__model_hold(s, ev.round, copy);
      }
      td__ledger_checkpoint(n->ledger, s->run_id, ev.round, ev.blob, bytes,
                            s->spec.checkpoint_keep);
      s->checkpoint_out = true;
      td__ledgerq_flush(n->ledger);
      checkpoints_settled(n);
      break;
    }
    case TD_RUN_EVAL:
    case TD_RUN_FINISHED:
      s->last_eval_acc = ev.accuracy;
      s->last_eval_bpb = ev.bpb;
      s->test_loss = ev.loss;
      td__rounds_eval(s, ev.round, ev.accuracy, ev.bpb);
      if (isnan(ev.bpb))
        td_log_info("round %" PRIu64 "/%" PRIu64 ": test accuracy %.4f, test loss %.4f",
                    ev.round, s->rounds, ev.accuracy, ev.loss);
      else
        td_log_info("round %" PRIu64 "/%" PRIu64 ": held-out %.4f bits per byte", ev.round,
                    s->rounds, ev.bpb);
      if (ev.kind == TD_RUN_FINISHED) {
        s->test_accuracy = ev.accuracy;
        s->test_bpb = ev.bpb;
        /* the members' hashes of the last round may still be on their way:
         * the run ends once its last vote is decided (td__session_settle) */
        s->finish_pending = td__verify_pending(s->verify, ev.round);
        if (!s->finish_pending)
          td__session_finish(n, TD__RUN_FINISHED, ev.accuracy, NULL);
        return;
      }
      break;
    case TD_RUN_FAILED:
      if (!s->ready && !s->unannounced) /* it cannot take part (data, limits): nobody waits */
        td__session_refuse(n, s->run_id, s->members, s->n_members, ev.message);
      td__session_finish(n, TD__RUN_FAILED, NAN, ev.message);
      return;
    case TD_RUN_STOPPED:
      if (s->missed)
        td__session_finish(n, TD__RUN_MISSED, NAN,
                           "the run ended on its other members while this node was away");
      else
        td__session_finish(n, TD__RUN_STOPPED, s->last_eval_acc, "stopped on request");
      return;
    }
  }
}

/* The spec travels as canonical "key = value" lines. */
static int parse_spec(td__node_t *n, const char *spec_text, size_t n_members,
                      td_runspec_t *spec, char *why, size_t why_len) {
  td_runspec_defaults(spec);
  char *copy = strdup(spec_text);
  if (copy == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = 0;
  for (char *line = strtok(copy, "\n"); line != NULL && rc == 0; line = strtok(NULL, "\n"))
    rc = td_runspec_set_arg(spec, line, why, why_len);
  free(copy);
  if (rc == 0) /* the spec as asked, before this node's own threads replace it */
    rc = td__policy_check(&n->policy, spec, n_members, why, why_len);
  if (rc == 0 && n->threads)
    spec->threads = n->threads;
  return rc;
}

/* The loop-side buffers of a run whose compute thread has started. */
static int open_parts(td__session_t *s, const td_codec_spec_t *codec, char *why,
                      size_t why_len) {
  const td_layout_t *layout = td_run_layout(s->run);
  const char *what = "the round collector";
  /* updates decode on the pool (inbox.c); gossip and group partners drift apart */
  int rc = td_round_open_window(&s->collector, layout,
                                td_runspec_mixes(&s->spec) ? TD_ROUND_SLOTS_MAX : TD_ROUND_SLOTS);
  if (rc == 0 && s->spec.mode_kind == TD_MODE_ASYNC) {
    what = "the async inboxes";
    for (size_t i = 0; rc == 0 && i < s->n_members; i++)
      if (s->members[i] != s->node->node_id)
        rc = td_round_open(&s->peer_inbox[i], layout);
  }
  if (rc == 0 && (rc = td__outbox_open(&s->outbox, s, codec, td__rounds_try_close)) != 0)
    what = "the link codecs";
  if (rc == 0 && (rc = td__xfer_open(&s->xfer, s)) != 0)
    what = "the transfer state";
  if (rc == 0 && (rc = td__join_open(&s->join, s)) != 0)
    what = "the late-join state";
  if (rc == 0 && (rc = td__reconcile_open(&s->recon, s)) != 0)
    what = "the reconciliation buffers";
  if (rc == 0 && (rc = td__verify_open(&s->verify, s)) != 0)
    what = "the state agreement";
  if (rc == 0 && (rc = td__backfill_open(&s->backfill)) != 0)
    what = "the forwarding of updates";
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot set up %s: %s", what, td_strerror(rc));
  return 0;
}

/* History is append-only: a run id names one spec forever on this node, and
 * a run that ended here (or was missed) is never started again, whoever asks:
 * starting it would rewrite its rows in the ledger. Id 0 names no run. A run
 * this node was in when it died or fell behind (same spec, still open) may be
 * taken up again: that is coming back (comeback.c). */
static int check_run_id(td__node_t *n, uint64_t run_id, const char *spec_text, char *why,
                        size_t why_len) {
  const char *what = NULL;
  if (run_id == 0)
    what = "run id 0 names no run";
  else switch (td__ledger_run_seen(n->ledger, run_id, spec_text)) {
    case TD__RUN_OTHER_SPEC: what = "this node already recorded that run id with another spec"; break;
    case TD__RUN_ENDED_HERE: what = "this node already recorded that run as ended"; break;
    default: return 0;
  }
  td__drop(&n->drops, TD__DROP_REUSED_RUN_ID, NULL);
  return td_why(why, why_len, TD_EINVAL, "run %016" PRIx64 ": %s; its record stays as it is "
                "(a run id names one run: start a new run instead)", run_id, what);
}

int td__session_start(td__node_t *n, uint64_t run_id, const char *spec_text,
                      const uint64_t *members, size_t n_members, uint64_t first_round,
                      uint64_t sponsor, bool held, char *why, size_t why_len) {
  if (n_members > TD_MAX_RUN_MEMBERS) /* sampling and reconciliation keep 64-bit masks */
    return td_why(why, why_len, TD_EINVAL, "a run takes at most %d members and %zu are alive: "
                  "start it on a cluster of at most %d nodes (trainctl leave on the others)",
                  TD_MAX_RUN_MEMBERS, n_members, TD_MAX_RUN_MEMBERS);
  int rc = check_run_id(n, run_id, spec_text, why, why_len);
  if (rc != 0)
    return rc;
  td_runspec_t spec;
  rc = parse_spec(n, spec_text, n_members, &spec, why, why_len);
  if (rc != 0)
    return rc;
  size_t rank = n_members;
  for (size_t i = 0; i < n_members; i++)
    if (members[i] == n->node_id)
      rank = i;
  if (rank == n_members || n_members > TD_MEMBERS_MAX)
    return td_why(why, why_len, TD_EINVAL, "this node is not a member of run %016" PRIx64,
                  run_id);
  if (n->session != NULL)
    return td_why(why, why_len, TD_EINVAL, "run %016" PRIx64 " is already running",
                  n->session->run_id);
  if (first_round > 1 && spec.mode_kind == TD_MODE_ASYNC)
    return td_why(why, why_len, TD_EINVAL, "late join is for sync and overlap runs");
  if (first_round > 1 && n->last_run != NULL && n->last_run->run_id == run_id &&
      n->rejoin.run_id != run_id) /* it failed or was stopped here: taking it back loops */
    return td_why(why, why_len, TD_EINVAL, "this node already ended run %016" PRIx64 " (%s)",
                  run_id, td__run_state_name(n->last_run->state));
  td_codec_spec_t codec;
  if ((rc = td_codec_parse(&codec, spec.codec_auto ? "none" : spec.codec, why, why_len)) != 0)
    return rc;
  td__session_t *s = calloc(1, sizeof *s);
  if (s == NULL || (s->spec_text = strdup(spec_text)) == NULL) {
    free(s);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  first_round = first_round > 1 ? first_round : 1;
  s->refs = 1;
  s->destroy = session_free;
  s->on_round_open = td__join_round_begun;
  s->node = n;
  s->bytes_sent_mark = td__transport_run_bytes_sent(n->net);
  s->state = TD__RUN_RUNNING;
  s->run_id = run_id;
  s->spec = spec;
  memcpy(s->members, members, n_members * sizeof *members);
  s->n_members = n_members;
  s->rank = (unsigned)rank;
  s->rounds = spec.rounds; /* 0 (unknown) until the dataset is loaded */
  s->own_loss = s->test_accuracy = s->last_eval_acc = s->test_loss = NAN;
  s->test_bpb = s->last_eval_bpb = NAN;
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++)
    s->staleness[i] = -1;
  s->first_round = first_round;
  s->unannounced = held;
  s->since[rank] = first_round;
  for (size_t i = 0; i < n_members; i++)
    s->since_at[i] = td_clock_mono_s();
  s->own_done = first_round - 1;
  td_run_opts_t opts = {.spec = &spec, .rank = (unsigned)rank, .nodes = (unsigned)n_members,
                        .first_round = first_round, .held = held,
                        .max_rounds = n->policy.max_rounds,
                        .max_checkpoint_bytes = n->policy.max_checkpoint_bytes,
                        .checkpoint_acks = true, .keep_model = true, .loop = &n->loop,
                        .on_events = on_run_events, .user = s};
  if ((rc = td_run_start(&s->run, &opts, why, why_len)) != 0 ||
      (rc = open_parts(s, &codec, why, why_len)) != 0) {
    td__session_unref(&s);
    return rc;
  }
  /* updates and snapshots still queued for the last run (a stopped one) are
   * of no use to anyone now, and would go out ahead of this run's */
  td__transport_drop_run_traffic(n->net);
  td__ledgerq_on_batch(n->ledger, checkpoints_settled, n);
  for (size_t i = 0; i < n_members; i++)
    s->plan[i] = td_run_split_batch(spec.batch, (unsigned)i, (unsigned)n_members);
  td__outbox_skip_to(s->outbox, first_round - 1);
  td__backfill_close(&n->retired); /* the last run's members are done with it */
  n->session = s;
  td__rounds_begin(s, first_round);
  if (first_round > 1) { /* fetch the members' model before the first round */
    td__xfer_fetch_seed(s->xfer, sponsor, first_round - 1, td_run_anchor_bytes(s->run));
    td__verify_at(s, first_round); /* ...and check with them that it holds it */
  }
  td__ledger_run_start(n->ledger, run_id, spec_text);
  if (first_round > 1)
    td__session_rejoined(n, run_id, first_round);
  td__ledger_event(n->ledger, "run_start",
                   "run %016" PRIx64 " rank %zu of %zu, from round %" PRIu64, run_id, rank,
                   n_members, first_round);
  td_log_info("run %016" PRIx64 " started: rank %zu of %zu, model %s, dataset %s%s", run_id, rank,
              n_members, spec.model, spec.dataset, first_round > 1 ? " (late join)" : "");
  td__ledgerq_flush(n->ledger);
  return 0;
}

void td__session_refuse(td__node_t *n, uint64_t run_id, const uint64_t *members,
                        size_t n_members, const char *why) {
  td_log_warn("refusing run %016" PRIx64 ": %s", run_id, why);
  td__ledger_event(n->ledger, "run_refused", "run %016" PRIx64 ": %s", run_id, why);
  Traind__RunRefused rr = TRAIND__RUN_REFUSED__INIT;
  rr.reason = (char *)why;
  rr.run_ended = td__ledger_run_ended(n->ledger, run_id);
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_REFUSED;
  env.run_refused = &rr;
  env.run_id = run_id;
  for (size_t i = 0; i < n_members && i < TD_MEMBERS_MAX; i++) {
    td__link_t *l = members[i] != n->node_id ? td__link_find(n->net, members[i]) : NULL;
    if (l != NULL)
      td__link_send(n->net, l, &env);
  }
}

/* A member will not run ours: it is not waited for from now on (its first
 * round moves past every round), and status names it with its reason. */
void td__on_run_refused(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                        size_t bytes) {
  (void)l;
  (void)bytes;
  td__session_t *s = td__session_of(n, env->run_id);
  size_t i = s != NULL ? td__session_member(s, env->sender) : TD_MEMBERS_MAX;
  if (i == TD_MEMBERS_MAX || env->sender == n->node_id) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "refusal of a run this node is not running with the sender");
    return;
  }
  if (env->run_refused->run_ended)
    td__session_heard_end(n, env->sender);
  else
    s->refused_by[i] = true;
  if (s->since[i] == UINT64_MAX)
    return; /* already heard */
  char reason[200];
  const char *r = env->run_refused->reason ? env->run_refused->reason : "";
  size_t k = 0;
  for (; r[k] != '\0' && k + 1 < sizeof reason; k++) /* one printable line */
    reason[k] = (unsigned char)r[k] < 0x20 || r[k] == 0x7f ? ' ' : r[k];
  reason[k] = '\0';
  s->since[i] = UINT64_MAX;
  size_t used = strlen(s->refused);
  snprintf(s->refused + used, sizeof s->refused - used, "%snode %016" PRIx64 " refused: %s",
           used ? "; " : "", env->sender, reason);
  td_log_warn("node %016" PRIx64 " refused run %016" PRIx64 ": %s; the run goes on without it",
              env->sender, env->run_id, reason);
  td__ledger_event(n->ledger, "peer_refused", "%016" PRIx64 " refused run %016" PRIx64 ": %s",
                   env->sender, env->run_id, reason);
  td__rounds_forget_peer(s, env->sender);
}

void td__session_heard_end(td__node_t *n, uint64_t peer) {
  td__session_t *s = n->session;
  size_t i = s != NULL ? td__session_member(s, peer) : TD_MEMBERS_MAX;
  if (i == TD_MEMBERS_MAX || peer == n->node_id || s->ended_by[i])
    return; /* a node outside the run has no say in it */
  s->ended_by[i] = true; /* never taken back into the run (join.c) */
  td__ledger_event(n->ledger, "peer_ended_run", "%016" PRIx64 " ended run %016" PRIx64, peer,
                   s->run_id);
  /* Only a node that has trained no round of the run slept through it: one
   * that trained rounds is in the run (a member that finished a moment
   * before may still send its last update, on the bulk connection; members
   * that failed leave it to finish or stop on its own), and comeback.c
   * handles one that fell behind. */
  if (s->rounds_done > 0)
    return;
  if (s->since[i] != UINT64_MAX) { /* it sends nothing more of this run: not waited for */
    s->since[i] = UINT64_MAX;
    td__rounds_forget_peer(s, peer);
    if (n->session != s)
      return;
  }
  size_t others = 0, ended = 0; /* members that refused the run are not in it */
  for (size_t k = 0; k < s->n_members; k++)
    if (s->members[k] != n->node_id && !s->refused_by[k]) {
      others++;
      ended += s->ended_by[k];
    }
  /* one member's word does not end a run here; a run stopping here (a
   * RunStop came first) ends as stopped */
  if (s->missed || 2 * ended <= others || td_run_stopping(s->run))
    return;
  s->missed = true;
  td_log_warn("run %016" PRIx64 " already ended on %zu of its %zu other members while this node "
              "was away: not starting it again; it is recorded here as missed", s->run_id, ended,
              others);
  td_run_stop(s->run);
}
