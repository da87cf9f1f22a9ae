/* rounds.c: a round's life: its sample, closing it, and its ledger row.
 *
 * Threads: loop thread, and the libuv work pool for the aggregation. The
 * members' updates come in through inbox.c, which marks each complete in
 * the session's collector (scheduler/round.h). A sync or overlap round closes
 * when our own update is done and sent and every expected peer's update is
 * complete, or at its deadline without the late ones (round_timeout, or the
 * adaptive deadline of deadline.c): the loop bounds each update's sample
 * weight by what the batch plan gave its sender (a member claiming more is
 * cut to its share, counted and recorded), the pool
 * combines the updates by the run's `aggregate` rule into the run's average
 * (scheduler/aggregate.h: the same result on every node, whatever the
 * arrival order), then the loop counts what the rule refused per member
 * (a member refused TD__SUSPECT_ROUNDS rounds in a row is logged, recorded
 * as a member_suspect event and shown by status), writes the round's ledger
 * row, revises the batch plan (capacity.c) and releases the compute thread.
 * So a large update never stalls heartbeats. Each job holds a reference on
 * the session and touches only what it was handed, so results do not depend
 * on which thread ran it. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

static void arm_round_timer(td__session_t *s);
static void cut_at_adaptive_deadline(td__session_t *s);

/* Whether the run samples members (participation < all), in sync mode. */
static bool samples(const td__session_t *s) {
  return s->spec.mode_kind == TD_MODE_SYNC && s->spec.participation != 1;
}

/* Whether a sync round may close before every sampled update is in. */
static bool tolerates_stragglers(const td__session_t *s) {
  return s->spec.mode_kind == TD_MODE_SYNC &&
         (s->spec.min_updates > 0 || s->spec.deadline_mad_c > 0);
}

/* The open round's sample in the ledger: "round R: sampled K of N: ID,ID". */
static void record_sample(td__session_t *s, uint64_t round) {
  char ids[TD_LEDGER_MEMBERS_TEXT];
  size_t used = 0;
  unsigned k = 0;
  for (size_t i = 0; i < s->n_members && i < 64; i++)
    if (s->sample >> i & 1) {
      k++;
      if (used < sizeof ids)
        used += (size_t)snprintf(ids + used, sizeof ids - used, "%s%016" PRIx64,
                                 used ? "," : "", s->members[i]);
    }
  ids[used < sizeof ids ? used : sizeof ids - 1] = '\0';
  td__ledger_event(s->node->ledger, "round_sample", "round %" PRIu64 ": sampled %u of %zu: %s",
                   round, k, s->n_members, ids);
}

/* With virtual clients, the sampled clients instead: "round R: sampled K of
 * M clients: C,C" (client n x clients + j is node n's j-th), shortened with
 * "..." when the ledger's text has no room for them all. */
static void record_client_sample(td__session_t *s, uint64_t round) {
  uint64_t set[TD_SAMPLE_SET_WORDS];
  unsigned k = td_run_sample_clients(s->run, round, set);
  unsigned total = (unsigned)s->n_members * td_run_clients(s->run);
  char ids[400]; /* the ledger keeps 511 bytes of an event's detail */
  size_t used = 0;
  ids[0] = '\0';
  for (unsigned c = 0; c < TD_SAMPLE_MAX_CLIENTS; c++)
    if (set[c / 64] >> (c % 64) & 1) {
      if (used + 16 >= sizeof ids) {
        snprintf(ids + used, sizeof ids - used, ",...");
        break;
      }
      used += (size_t)snprintf(ids + used, sizeof ids - used, "%s%u", used ? "," : "", c);
    }
  td__ledger_event(s->node->ledger, "round_sample",
                   "round %" PRIu64 ": sampled %u of %u clients: %s", round, k, total, ids);
}

void td__rounds_begin(td__session_t *s, uint64_t round) {
  uint64_t peers[TD_MEMBERS_MAX];
  size_t np = td__session_partners(s, round, false, peers, &s->round_all);
  s->round = round;
  s->round_cut = false;
  s->round_set = 0;
  s->round_begun = td_clock_mono_s();
  s->sample = UINT64_MAX;
  s->sample_deferred = false;
  bool clients = td_run_clients(s->run) > 1;
  if (samples(s) && !s->ready && (clients || round > s->rounds)) {
    /* not known yet: the clients that hold rows, or whether a run sized by
     * epochs has this round; both come with READY (td__rounds_sample_ready) */
    s->sample_deferred = true;
  } else if (samples(s) && round <= s->rounds) { /* the others neither train nor send this round */
    s->sample = td_run_sample(s->run, round);
    size_t kept = 0;
    for (size_t p = 0; p < np; p++) {
      size_t i = td__session_member(s, peers[p]);
      if (i < 64 && (s->sample >> i & 1))
        peers[kept++] = peers[p];
    }
    np = kept;
    if (clients)
      record_client_sample(s, round);
    else
      record_sample(s, round);
  }
  td_round_begin(s->collector, round, peers, np);
  s->round_started = td_clock_wall_s();
  arm_round_timer(s);
  if (s->own_done >= round) /* overlap: own update already done */
    s->deadline = s->own[round % TD__RING].done_at + s->spec.round_timeout;
  if (s->on_round_open != NULL)
    s->on_round_open(s); /* readmissions deferred to this round (join.c) */
}

void td__rounds_sample_ready(td__session_t *s) {
  if (!s->sample_deferred)
    return;
  s->sample_deferred = false;
  if (s->round > s->rounds)
    return;
  s->sample = td_run_sample(s->run, s->round);
  for (size_t i = 0; i < s->n_members && i < 64; i++)
    if (!(s->sample >> i & 1) && s->members[i] != s->node->node_id)
      td_round_forget_peer(s->collector, s->members[i]); /* it neither trains nor sends */
  if (td_run_clients(s->run) > 1)
    record_client_sample(s, s->round);
  else
    record_sample(s, s->round);
}

_Static_assert(TD_LEDGER_MEMBERS_TEXT >= TD_MAX_RUN_MEMBERS * 17 + 1 && TD_MAX_RUN_MEMBERS <= 64,
               "a round row names every member (text) and its partition (bit)");

/* The row of `round`: `took_part` has bit i set for member i (rank and data
 * partition i) whose update is in the round's average, our own included. */
static void round_row(td__session_t *s, uint64_t round, double eval_acc, double started,
                    uint64_t bytes_sent, uint64_t bytes_recv, uint64_t took_part,
                    double consensus) {
  td__own_round_t *o = &s->own[round % TD__RING];
  td__own_round_t none = {.eval_acc = NAN, .eval_bpb = NAN};
  if (o->round != round) /* closed without our own update (a straggler): none of ours */
    o = &none;
  char members[TD_LEDGER_MEMBERS_TEXT];
  size_t used = 0;
  for (size_t i = 0; i < s->n_members && i < 64 && used < sizeof members; i++)
    if (took_part & (1ull << i))
      used += (size_t)snprintf(members + used, sizeof members - used, "%s%016" PRIx64,
                               used ? "," : "", s->members[i]);
  members[used < sizeof members ? used : sizeof members - 1] = '\0';
  s->trained |= took_part;
  double eval_bpb = NAN;
  if (o->round == round)
    eval_bpb = o->eval_bpb; /* overlap: evaluated before the round closed here */
  if (isnan(eval_acc) && o->round == round)
    eval_acc = o->eval_acc; /* overlap: evaluated before the round closed here */
  if (s->late_eval.round == round) { /* evaluated after the ring moved on, before the row */
    eval_acc = s->late_eval.acc;
    eval_bpb = s->late_eval.bpb;
  }
  td_ledger_round_t row = {
      .run_id = s->run_id, .round = round, .started = started,
      .ended = td_clock_wall_s(), .local_steps = o->steps + o->fill_steps, .batch = o->batch,
      .samples = o->samples, .loss = o->loss, .eval_acc = eval_acc, .eval_bpb = eval_bpb,
      .bytes_sent = bytes_sent, .bytes_recv = bytes_recv, .lr = o->lr,
      .compute_s = o->compute_s + o->fill_s, .wait_s = o->idle_s, .capacity = o->capacity,
      .members = members, .partitions = took_part, .has_consensus = !isnan(consensus),
      .consensus = consensus};
  if (round >= s->row_round) { /* what status shows as the last round's traffic */
    s->row_round = round;
    s->row_bytes_sent = bytes_sent;
    s->row_bytes_recv = bytes_recv;
    s->row_mixed = (unsigned)__builtin_popcountll(took_part);
    s->row_consensus = consensus;
  }
  if (o->round == round && o != &none) {
    memcpy(o->members_text, members, sizeof members);
    o->row = row;
    o->row.members = o->members_text;
    o->row_written = true;
  }
  td__ledger_round(s->node->ledger, &row);
}

/* The accuracy (bits per byte for text) belongs to the row of `round`: in
 * overlap mode the compute thread evaluates round r before the loop closes
 * it, so it waits in the ring and round_row() writes it with the row. */
void td__rounds_eval(td__session_t *s, uint64_t round, double accuracy, double bpb) {
  td__own_round_t *o = &s->own[round % TD__RING];
  if (o->round != round || (!o->row_written && round < s->round && s->round_cut_any)) {
    /* evaluated off the training path and finished rounds later: the row is
     * most likely written (then this sets it); if not, round_row() takes it.
     * A straggler's own round that closed without it has its row already. */
    s->late_eval.round = round;
    s->late_eval.acc = accuracy;
    s->late_eval.bpb = bpb;
    td__ledger_eval(s->node->ledger, s->run_id, round, accuracy, bpb);
    return;
  }
  o->eval_acc = accuracy;
  o->eval_bpb = bpb;
  if (o->row_written) {
    td_ledger_round_t row = o->row;
    row.eval_acc = accuracy;
    row.eval_bpb = bpb;
    td__ledger_round(s->node->ledger, &row);
  }
}


/* One round's aggregation, on the pool. */
typedef struct {
  uv_work_t req;
  td__session_t *s; /* one reference */
  uint64_t round, bytes_sent, bytes_recv;
  double started;
  td_agg_spec_t spec;
  td_agg_input_t in[TD_AGG_MAX_INPUTS]; /* the round's deltas, noted on the loop thread */
  bool clamped[TD_MEMBERS_MAX];         /* its samples were cut to the plan (by member) */
  size_t n, numel;
  td_agg_result_t res;
  float *avg;
  bool mixes;        /* td_runspec_mixes: the inputs are models, own among them */
  const float *own;  /* mixes: our own model of the round (the run's delta slot) */
  size_t population; /* mixes: the members the round's topology placed */
  double consensus;  /* mixes: estimated consensus distance (NaN: none) */
} aggregate_job_t;

/* Gossip and groups: the squared consensus distance (1/N) sum_i |x_i - mean|^2
 * estimated from this node's view: |x_i - g|^2 with g the mean of the G
 * models mixed, times G/(G-1) (N-1)/N, which makes it unbiased when the
 * partners are drawn at random (docs/algorithms.md#topologies). */
static double consensus_estimate(const aggregate_job_t *job) {
  size_t g = job->res.used, n = job->population;
  if (job->own == NULL || g < 2 || n < 2)
    return NAN;
  double d2 = 0;
  for (size_t i = 0; i < job->numel; i++) {
    double d = (double)job->avg[i] - (double)job->own[i];
    d2 += d * d;
  }
  return d2 * (double)g / (double)(g - 1) * (double)(n - 1) / (double)n;
}

static void aggregate_work(uv_work_t *req) {
  aggregate_job_t *job = req->data;
  td_agg_apply(&job->spec, job->in, job->n, job->numel, job->avg, &job->res);
  job->consensus = job->mixes ? consensus_estimate(job) : NAN;
}

/* Samples member i may claim for round r: its batch in the plans that were in
 * force for r (sync: the current one; overlap: the one before; a late join
 * or a new plan may have changed it since) times the round's local steps and
 * overlap fill steps. Every node holds the same plans, so every node clamps
 * the same way. */
static uint64_t planned_samples(const td__session_t *s, size_t i, uint64_t r) {
  unsigned batch = s->plan[i];
  for (uint64_t back = 1; back <= 2 && back < r; back++) {
    unsigned k = (unsigned)((r - back) % TD__RING);
    if (s->plan_hist_round[k] == r - back && s->plan_hist[k][i] > batch)
      batch = s->plan_hist[k][i];
  }
  if (batch == 0) /* not in the plan (it was unreachable when planned): the global batch */
    batch = s->spec.batch;
  uint64_t steps = td_run_steps_of(s->run, r), next = td_run_steps_of(s->run, r + 1);
  steps = (steps ? steps : 1) + (uint64_t)s->spec.overlap_fill * (next > steps ? next : steps);
  return (uint64_t)batch * steps;
}

static void note_outlier(td__session_t *s, size_t i, uint64_t r, bool refused, bool used) {
  td__outlier_t *o = &s->outlier[i];
  if (!refused) {
    if (used)
      o->streak = 0;
    return;
  }
  if (++o->streak == TD__SUSPECT_ROUNDS && !o->suspect) {
    o->suspect = true;
    td_log_warn("member %016" PRIx64 ": updates refused %d rounds in a row (round %" PRIu64
                "; %" PRIu64 " rejected, %" PRIu64 " clipped, %" PRIu64 " samples clamped)",
                s->members[i], TD__SUSPECT_ROUNDS, r, o->rejected, o->clipped, o->clamped);
    td__ledger_event(s->node->ledger, "member_suspect",
                     "%016" PRIx64 " round %" PRIu64 ": refused %d rounds in a row: %" PRIu64
                     " rejected, %" PRIu64 " clipped, %" PRIu64 " samples clamped",
                     s->members[i], r, TD__SUSPECT_ROUNDS, o->rejected, o->clipped, o->clamped);
  }
}

/* The verdicts of round r's aggregation: counted per member, each refused
 * update an event, and a member refused TD__SUSPECT_ROUNDS rounds in a row
 * reported. */
static void note_verdicts(td__session_t *s, const aggregate_job_t *job) {
  bool seen[TD_MEMBERS_MAX] = {false};
  uint64_t r = job->round;
  double m = job->res.median_norm;
  for (size_t j = 0; j < job->n; j++) {
    const td_agg_input_t *in = &job->in[j];
    size_t i = td__session_member(s, in->id);
    if (i >= TD_MEMBERS_MAX)
      continue;
    seen[i] = true;
    td__outlier_t *o = &s->outlier[i];
    bool refused = job->clamped[i] || in->verdict != TD_AGG_USED;
    if (in->verdict == TD_AGG_REJECTED && !isfinite(in->norm)) { /* only our own can be */
      o->rejected++;
      td__ledger_event(s->node->ledger, "update_outlier",
                       "%016" PRIx64 " round %" PRIu64 ": rejected: not finite", in->id, r);
    } else if (in->verdict == TD_AGG_REJECTED) {
      o->rejected++;
      td__ledger_event(s->node->ledger, "update_outlier",
                       "%016" PRIx64 " round %" PRIu64 ": rejected: norm %.3g > %g x median %.3g",
                       in->id, r, in->norm, job->spec.norm_bound, m);
    } else if (in->verdict == TD_AGG_CLIPPED) {
      o->clipped++;
      td__ledger_event(s->node->ledger, "update_outlier",
                       "%016" PRIx64 " round %" PRIu64 ": clipped: norm %.3g > %g x median %.3g",
                       in->id, r, in->norm, job->spec.clip, m);
    }
    note_outlier(s, i, r, refused, in->verdict != TD_AGG_REJECTED);
  }
  /* a member whose update did not decode this round has no input above */
  for (size_t i = 0; i < s->n_members; i++)
    if (!seen[i] && s->refused_round[i] == r)
      note_outlier(s, i, r, true, false);
}

static void aggregate_done(uv_work_t *req, int status) {
  aggregate_job_t *job = req->data;
  td__session_t *s = job->s;
  uint64_t r = job->round;
  (void)status;
  s->closing = false;
  if (s->node->session == s) {
    note_verdicts(s, job);
    uint64_t took_part = 0; /* whose update is in the average */
    for (size_t j = 0; j < job->n; j++) {
      size_t i = td__session_member(s, job->in[j].id);
      if (i < TD_MEMBERS_MAX && i < 64 && job->in[j].verdict != TD_AGG_REJECTED)
        took_part |= 1ull << i;
    }
    round_row(s, r, NAN, job->started, job->bytes_sent, job->bytes_recv, took_part,
              job->consensus);
    td_log_debug("round %" PRIu64 "/%" PRIu64 " closed with %zu of %zu updates, loss %.4f", r,
                 s->rounds, job->res.used, job->n, s->own[r % TD__RING].loss);
    /* sync: the compute thread waits on this round, so the plan is used from
     * the next one; overlap: it is already computing r + 1 */
    td__rounds_replan(s, r, r + (s->spec.mode_kind == TD_MODE_SYNC ? 1 : 2));
    s->rounds_done++;
    s->node->totals.rounds++;
    td__rounds_begin(s, r + 1);
    td_run_release(s->run, r);
    td__ledgerq_flush(s->node->ledger);
    td__node_figures_changed(s->node);
    td__rounds_try_close(s);
  }
  free(job);
  td__session_unref(&s);
}

/* The round's inputs: our delta and every complete peer update, each weight
 * bounded by the member's plan (counted and recorded when cut). Sync, and
 * overlap without fill: each weighs what the plan gave its sender, whatever
 * it claims, so a member that claims other samples to each node cannot part
 * their averages (the plan is the same on every node: agreed capacities). */
static void gather(td__session_t *s, aggregate_job_t *job) {
  uint64_t r = job->round;
  uint64_t own_samples = s->own[r % TD__RING].round == r ? s->own[r % TD__RING].samples : 0;
  bool weigh_by_plan = s->spec.mode_kind != TD_MODE_ASYNC && s->spec.overlap_fill == 0;
  if (s->plan_join_from != 0 && r >= s->plan_join_from) {
    /* a join's plan bounds the rounds from its first on, on every member at
     * this same round; the plans before it bound none of them (every member
     * computes those rounds with the join's batches, td_run_set_batch) */
    memcpy(s->plan, s->plan_join, sizeof s->plan);
    memset(s->plan_hist_round, 0, sizeof s->plan_hist_round);
    s->plan_join_from = 0;
  }
  job->n = td_round_collect(s->collector, job->in, TD_AGG_MAX_INPUTS - 1);
  /* a member put out of the run is averaged no more, even with an update
   * that came before (one of a round still ahead when it was put out); with
   * the coordinator's set, what came from outside it is left out too */
  size_t kept = 0;
  for (size_t j = 0; j < job->n; j++) {
    size_t i = td__session_member(s, job->in[j].id);
    if (i < TD_MEMBERS_MAX && s->out[i])
      continue;
    if (s->round_set == 0 || (i < 64 && (s->round_set >> i & 1)))
      job->in[kept++] = job->in[j];
  }
  job->n = kept;
  if (s->round_set != 0 && (s->rank >= 64 || !(s->round_set >> s->rank & 1)))
    own_samples = 0;
  if (own_samples > 0 || job->mixes) { /* mixes: our model stays in even when untrained */
    job->own = td_run_delta(s->run, r);
    job->in[job->n++] = (td_agg_input_t){.id = s->node->node_id, .delta = job->own,
                                         .weight = own_samples > 0 ? (double)own_samples : 1};
  }
  for (size_t j = 0; j < job->n; j++) {
    size_t i = td__session_member(s, job->in[j].id);
    if (i >= TD_MEMBERS_MAX)
      continue;
    uint64_t bound = planned_samples(s, i, r);
    if (td_run_clients(s->run) > 1) /* each sampled client trains the plan's share */
      bound *= td_run_sampled_of(s->run, r, (unsigned)i);
    if (job->in[j].weight > (double)bound) {
      td__ledger_event(s->node->ledger, "samples_clamped",
                       "%016" PRIx64 " round %" PRIu64 ": claimed %.0f samples, plan gives %"
                       PRIu64, job->in[j].id, r, job->in[j].weight, bound);
      job->in[j].weight = (double)bound;
      job->clamped[i] = true;
      s->outlier[i].clamped++;
    }
    if (weigh_by_plan)
      job->in[j].weight = (double)bound;
    if (job->mixes && !s->round_all) /* doubly stochastic: equal weights (topology.h) */
      job->in[j].weight = 1;
  }
  unsigned k = (unsigned)(r % TD__RING);
  memcpy(s->plan_hist[k], s->plan, sizeof s->plan);
  s->plan_hist_round[k] = r;
}

/* The run bytes the transport sent since the last call: the round's share
 * (the transport counts them once; the round takes the difference). */
static uint64_t take_bytes_sent(td__session_t *s) {
  uint64_t now = td__transport_run_bytes_sent(s->node->net);
  uint64_t sent = now - s->bytes_sent_mark;
  s->bytes_sent_mark = now;
  return sent;
}

/* The members whose updates are in the job (bit i: member i). */
static uint64_t contributors(const td__session_t *s, const aggregate_job_t *job) {
  uint64_t set = 0;
  for (size_t j = 0; j < job->n; j++) {
    size_t i = td__session_member(s, job->in[j].id);
    if (i < 64)
      set |= 1ull << i;
  }
  return set;
}

static void close_round(td__session_t *s) {
  aggregate_job_t *job = calloc(1, sizeof *job);
  if (job == NULL) { /* the round waits for the next tick */
    td_log_error("out of memory to close round %" PRIu64, s->round);
    return;
  }
  uint64_t r = s->round;
  job->s = s;
  job->round = r;
  job->started = s->round_started;
  job->bytes_sent = take_bytes_sent(s);
  job->bytes_recv = s->bytes_recv_round;
  job->avg = td_run_avg(s->run, r);
  job->numel = td_run_numel(s->run);
  td_runspec_agg(&s->spec, &job->spec);
  job->mixes = td_runspec_mixes(&s->spec);
  for (size_t i = 0; job->mixes && i < s->n_members; i++)
    job->population += s->since[i] != UINT64_MAX && s->since[i] <= r;
  s->bytes_recv_round = 0; /* what comes now is the next round's */
  gather(s, job);
  uint64_t applied = 0, by = 0;
  if (td__roundclose_coordinates(s)) { /* the others average exactly these */
    applied = contributors(s, job);
    by = s->node->node_id;
    /* where each member got the same bytes of an update, the close names
     * each one averaged: a member that signed two cannot part the others */
    uint8_t digests[64][TD__BACKFILL_DIGEST];
    bool named = td__outbox_same_bytes(s->outbox) &&
                 td__backfill_digests_of(s, r, applied, digests);
    td__roundclose_send(s, r, applied, named ? (const uint8_t(*)[32])digests : NULL);
  } else if (s->round_set != 0) {
    td__roundclose_agreed_by(s, r, &applied, &by);
  }
  td__roundclose_applied(s, r, applied, by); /* echoed with our next update */
  job->req.data = job;
  td__session_ref(s);
  s->closing = true;
  if (uv_queue_work(&s->node->loop, &job->req, aggregate_work, aggregate_done) != 0) {
    aggregate_work(&job->req); /* cannot happen in practice; never lose a round */
    aggregate_done(&job->req, 0);
  }
}

/* The open round's sampled updates this node holds: the complete peer
 * updates, and its own once done (when it is in the sample). */
static unsigned contributions(const td__session_t *s) {
  unsigned k = (unsigned)td_round_received(s->collector);
  bool own_in = s->rank < 64 && (s->sample >> s->rank & 1);
  return k + (own_in && s->own_done >= s->round && s->own[s->round % TD__RING].samples > 0);
}

/* The sampled members the open round waits for, our own included. */
static unsigned sampled_count(const td__session_t *s) {
  unsigned k = 0;
  for (size_t i = 0; i < s->n_members && i < 64; i++)
    k += (unsigned)(s->sample >> i & 1);
  return k;
}

/* Whether every member the open round still waits for has sent an update of
 * this run before: one that has not is starting (loading its data) or
 * unreachable, not a straggler, and the rounds wait for it (up to the
 * deadline) rather than run away from it. */
static bool missing_have_started(const td__session_t *s) {
  uint64_t missing[TD_MEMBERS_MAX];
  size_t k = td_round_missing(s->collector, missing, TD_MEMBERS_MAX);
  for (size_t i = 0; i < k; i++) {
    size_t mi = td__session_member(s, missing[i]);
    if (mi >= 64 || !(s->sent_once >> mi & 1))
      return false;
  }
  return true;
}

/* Whether we coordinate the open round and hold fewer updates than its set
 * must name (td__roundclose_floor): no straggler is cut then, for the
 * members would refuse the close. */
static bool below_floor(td__session_t *s) {
  return td__roundclose_coordinates(s) && contributions(s) < td__roundclose_floor(s, s->round);
}

/* Stop waiting for the open round's missing updates: each is recorded (`kind`
 * late: a deadline; cut: min_updates), and the round may close without our
 * own update too (a straggler's); not while below_floor. */
static void cut_missing(td__session_t *s, const char *kind, const char *why) {
  if (below_floor(s))
    return;
  uint64_t missing[TD_MEMBERS_MAX];
  size_t k = td_round_missing(s->collector, missing, TD_MEMBERS_MAX);
  for (size_t i = 0; i < k; i++) {
    td_log_info("round %" PRIu64 ": peer %016" PRIx64 " %s (%s)", s->round, missing[i],
                kind, why);
    td__ledger_event(s->node->ledger, kind, "round %" PRIu64 " peer %016" PRIx64 ": %s",
                     s->round, missing[i], why);
    td_round_forget_peer(s->collector, missing[i]);
    if (strcmp(kind, "cut") == 0)
      s->cut_peers++;
    else
      s->late_peers++;
  }
  if (s->own_done < s->round && s->rank < 64 && (s->sample >> s->rank & 1))
    td__ledger_event(s->node->ledger, kind, "round %" PRIu64 " peer %016" PRIx64 " (this "
                     "node): %s", s->round, s->node->node_id, why);
  s->round_cut = true;
  s->round_cut_any = true;
}

/* Whether our own part of the open round is settled: done and sent, or not
 * done in a round that was cut, as long as the compute thread already holds
 * the round before it (so the closing round's average never overwrites one
 * it has not applied: the run keeps two) and this node sent an update
 * before (the others wait for one that never did: missing_have_started). */
static bool own_settled(const td__session_t *s) {
  if (s->own_done >= s->round)
    return td__outbox_sent(s->outbox, s->round);
  return s->round_cut && s->own_done + 1 >= s->round && s->own_sent_once;
}

/* min_updates: once that many sampled updates are in (ours counted), the
 * missing are cut. */
static void cut_at_min_updates(td__session_t *s) {
  if (!tolerates_stragglers(s) || s->round_cut || s->spec.min_updates == 0 ||
      td_round_complete(s->collector) ||
      (td__roundclose_coordinated(s) && !td__roundclose_coordinates(s)))
    return;
  unsigned want = s->spec.min_updates, sampled = sampled_count(s);
  if (contributions(s) >= (want < sampled ? want : sampled) && missing_have_started(s)) {
    char why[64];
    snprintf(why, sizeof why, "min_updates %u reached", want);
    cut_missing(s, "cut", why);
  }
}

/* A member that does not coordinate keeps to the coordinator's set for the
 * open round: the missing outside it are cut, and it waits for those inside
 * it (backfill.c asks for what does not come). When the others moved on a
 * quarter of round_timeout after its own update, or its deadline passed,
 * without the set, it asks the members for a copy. True once the set
 * is taken, or when none came by the fixed deadline (and the coordinator's
 * own, td__roundclose_grace_s, when it cuts only there): the round then
 * closes on what came, as without a coordinator. */
static bool follow_agreed_set(td__session_t *s) {
  if (s->round_set != 0)
    return true;
  uint64_t set;
  if (!td__roundclose_agreed(s, s->round, &set)) {
    double now = td_clock_mono_s();
    if (s->own_done >= s->round &&
        (now >= s->deadline || (td_round_moved_on(s->collector) &&
                                now >= s->deadline - s->spec.round_timeout * 0.75)))
      td__roundclose_ask(s); /* the others closed the round: one of them has its close */
    if (s->own_done < s->round || now < s->deadline + td__roundclose_grace_s(s))
      return false;
    if (!s->round_cut) {
      td_log_warn("round %" PRIu64 ": no round close from the coordinator within %.1f s: "
                  "closing on the updates that came", s->round, s->spec.round_timeout);
      td__ledger_event(s->node->ledger, "late", "round %" PRIu64 ": no round close from the "
                       "coordinator", s->round);
      s->round_cut = true;
    }
    return true;
  }
  s->round_set = set;
  uint64_t missing[TD_MEMBERS_MAX];
  size_t k = td_round_missing(s->collector, missing, TD_MEMBERS_MAX);
  for (size_t j = 0; j < k; j++) {
    size_t i = td__session_member(s, missing[j]);
    if (i < 64 && (set >> i & 1))
      continue;
    td_log_info("round %" PRIu64 ": peer %016" PRIx64 " cut (not in the coordinator's set)",
                s->round, missing[j]);
    td__ledger_event(s->node->ledger, "cut", "round %" PRIu64 " peer %016" PRIx64 ": not in "
                     "the coordinator's set", s->round, missing[j]);
    td_round_forget_peer(s->collector, missing[j]);
    s->cut_peers++;
  }
  if (s->rank >= 64 || !(set >> s->rank & 1)) { /* closes without our own update */
    if (s->own_done < s->round && s->rank < 64 && (s->sample >> s->rank & 1))
      td__ledger_event(s->node->ledger, "cut", "round %" PRIu64 " peer %016" PRIx64 " (this "
                       "node): not in the coordinator's set", s->round, s->node->node_id);
    s->round_cut = true;
    s->round_cut_any = true;
  }
  return true;
}

void td__rounds_try_close(td__session_t *s) {
  if (s->spec.mode_kind == TD_MODE_ASYNC)
    return;
  while (s->node->session == s && !s->closing && s->round <= s->rounds) {
    if (td__roundclose_coordinated(s) && !td__roundclose_coordinates(s)) {
      if (!follow_agreed_set(s))
        return;
      td__backfill_match_set(s); /* an update held that is not the one the set names */
      td__backfill_ask(s, false); /* what of the set did not come, or was refused */
    } else {
      cut_at_adaptive_deadline(s); /* an update after the deadline is the first one in */
      cut_at_min_updates(s);
    }
    if (!own_settled(s) || !td_round_complete(s->collector))
      return;
    close_round(s);
  }
}

void td__session_on_round_close(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                                size_t bytes) {
  (void)l;
  (void)bytes;
  td__session_t *s = td__session_of(n, env->run_id);
  if (td__roundclose_take(n, s, env))
    td__rounds_try_close(s);
}

void td__rounds_async_release(td__session_t *s) {
  uint64_t slowest = UINT64_MAX;
  for (size_t i = 0; i < s->n_members; i++) /* one that refused or is away sends nothing */
    if (td__session_takes_part(s, i, 0) && s->peer_round[i] < slowest)
      slowest = s->peer_round[i];
  td_run_release(s->run, slowest);
}


void td__rounds_own_done(td__session_t *s, uint64_t round) {
  if (s->spec.mode_kind == TD_MODE_ASYNC) {
    s->round_started = td_clock_wall_s();
    /* async: our own update and every member's that arrived since the last row */
    round_row(s, round, NAN, s->round_started, take_bytes_sent(s), s->bytes_recv_round,
              s->heard | 1ull << s->rank, NAN);
    s->heard = 0;
    s->bytes_recv_round = 0;
    s->rounds_done++;
    s->node->totals.rounds++;
    td__rounds_replan(s, round, round + 1);
    td__rounds_async_release(s);
    td__ledgerq_flush(s->node->ledger);
    td__node_figures_changed(s->node);
  }
  td__rounds_try_close(s);
}

void td__rounds_forget_peer(td__session_t *s, uint64_t peer) {
  td_round_forget_peer(s->collector, peer);
  if (s->spec.mode_kind == TD_MODE_ASYNC) /* a compute thread held back by it goes on */
    td__rounds_async_release(s);
  td__rounds_try_close(s);
}


/* round_deadline = adaptive: once the open round is older than the
 * deadline and something of it is in, the missing are late. Only a node
 * whose own part is in judges that (a straggler would cut the punctual), or
 * the coordinator, whose set every member keeps to (roundclose.c);
 * a straggler closes the round when a peer's update of the next one shows
 * that the others closed it. */
static void cut_at_adaptive_deadline(td__session_t *s) {
  if (s->spec.deadline_mad_c <= 0 || s->round_cut || s->round > s->rounds || s->closing ||
      td_round_complete(s->collector) ||
      (td__roundclose_coordinated(s) && !td__roundclose_coordinates(s)))
    return; /* (a member that follows a coordinator keeps to its set) */
  bool own_in = s->own_done >= s->round || !(s->rank < 64 && (s->sample >> s->rank & 1));
  if (!own_in && !td__roundclose_coordinates(s)) { /* a coordinator judges for all */
    if (td_round_moved_on(s->collector))
      cut_missing(s, "late", "the others closed the round (an update of the next is in)");
    return;
  }
  double adaptive = td__rounds_adaptive_deadline_s(s);
  if (adaptive > 0 && contributions(s) > 0 && td_clock_mono_s() - s->round_begun >= adaptive &&
      missing_have_started(s)) {
    char why[96];
    snprintf(why, sizeof why, "adaptive deadline %.2f s (median + %g MAD)", adaptive,
             s->spec.deadline_mad_c);
    cut_missing(s, "late", why);
  }
}

/* The node's round timer: the open round's adaptive deadline passed (or
 * nearly: it may fire a little early; then it is armed for the rest). */
static void on_round_timer(uv_timer_t *t) {
  td__node_t *n = t->data;
  td__session_t *s = n->session;
  if (s == NULL)
    return;
  td__rounds_tick(s);
  if (n->session == s && !s->round_cut)
    arm_round_timer(s);
}

static void arm_round_timer(td__session_t *s) {
  double adaptive = s->spec.deadline_mad_c > 0 ? td__rounds_adaptive_deadline_s(s) : 0;
  if (!(adaptive > 0) || s->round > s->rounds)
    return;
  double left = s->round_begun + adaptive - td_clock_mono_s();
  if (left <= 0) /* passed: arrivals and our own update re-check it (try_close) */
    return;
  uv_update_time(&s->node->loop);
  uv_timer_start(&s->node->round_timer, on_round_timer, (uint64_t)(left * 1e3) + 1, 0);
}

/* Deadline: peers that have not delivered are recorded late and not waited
 * for, except those of the coordinator's set, which are first asked of a
 * member that holds them (backfill.c) and waited for a further round_timeout. */
void td__rounds_tick(td__session_t *s) {
  if (s->spec.mode_kind == TD_MODE_ASYNC)
    return;
  cut_at_adaptive_deadline(s);
  double now = td_clock_mono_s();
  if (s->own_done >= s->round && now >= s->deadline) {
    if (td__roundclose_coordinated(s) && !td__roundclose_coordinates(s) && s->round_set == 0 &&
        now < s->deadline + td__roundclose_grace_s(s)) {
      td__rounds_try_close(s); /* the coordinator's set is still waited for */
      return;
    }
    uint64_t missing[TD_MEMBERS_MAX];
    size_t k = below_floor(s) ? 0 : td_round_missing(s->collector, missing, TD_MEMBERS_MAX);
    if (k > 0) {
      td__backfill_ask(s, true);
      if (td__backfill_waiting(s))
        k = 0; /* updates of the coordinator's set asked of a member that holds them */
    }
    for (size_t i = 0; i < k; i++) {
      td_log_warn("round %" PRIu64 ": peer %016" PRIx64 " is late (deadline %.1f s)", s->round,
                  missing[i], s->spec.round_timeout);
      td__ledger_event(s->node->ledger, "late", "round %" PRIu64 " peer %016" PRIx64, s->round,
                       missing[i]);
      td_round_forget_peer(s->collector, missing[i]);
      s->late_peers++;
    }
  }
  td__rounds_try_close(s);
}
