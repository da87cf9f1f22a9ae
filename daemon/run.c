/* run.c: the compute thread of a run and its hand-offs with the loop.
 *
 * Events flow compute -> loop through a mutex-protected ring and
 * uv_async_send (coalescing wake-ups are fine: the loop drains the ring).
 * Rounds flow loop -> compute through `released_round` and a condition
 * variable; batch plans through a small ring of (from_round, batch); async
 * peer updates through the inbox, summed under the same mutex. Stop requests
 * are a flag checked between rounds, while sleeping and while waiting. */
#include "daemon/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/backend.h"
#include "compute/dataset.h"
#include "compute/error.h"
#include "compute/partition.h"
#include "compute/trainer.h"
#include "scheduler/outer.h"
#include "scheduler/plan.h"

#define EVENT_RING 64
#define PLAN_RING 4
#define CAPACITY_RHO 0.3
#define REC_SLOTS 2 /* reconciliations in flight, as in scheduler/recon.h */

struct td_run {
  td_runspec_t spec;
  unsigned rank, nodes, local_batch;
  double slowdown;
  size_t numel;
  td_backend_t *probe_be; /* the layout comes from a batch-1 copy of the model */
  td_model_t *probe;
  uint64_t rounds;
  unsigned *steps_of;  /* H of round r at [r - 1], set before READY */
  float *anchor;       /* consensus model (sync/overlap) */
  float *delta[2];     /* own delta of round r in [r % 2] */
  float *avg[2];       /* average of round r in [r % 2], written by the loop */
  float *start;        /* params at the start of the round (overlap, async) */
  float *mom;          /* outer momentum buffer (NULL when not needed) */
  float *init;         /* the shared initial model (reconciliation measures from it) */
  struct {
    uint64_t round;    /* 0: free */
    float *own;        /* our anchor - init when posted, moved by later corrections */
    float *mean;       /* the members' mean of the same, once have */
    bool have;
  } rec[REC_SLOTS];
  float *inbox;        /* async: weighted peer deltas not yet applied */
  float *merge;        /* knowledge transfer: a better peer's model, pending */
  double merge_lambda; /* > 0 while a merge is pending */
  uint64_t first_round; /* late join: the first round this node takes part in */
  float *seed;          /* late join: anchor (+ momentum) from a member, NULL until given */
  uint64_t want_anchor; /* post TD_RUN_ANCHOR once the anchor holds this round */
  uint64_t nodes_from;  /* from this round on, `nodes_next` nodes share the batch */
  unsigned nodes_next;
  struct { uint64_t from; unsigned batch; } plans[PLAN_RING];
  unsigned n_plans;

  uv_loop_t *loop;
  uv_async_t async;
  void (*on_events)(td_run_t *, void *);
  void *user;

  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  td_run_event_t ring[EVENT_RING];
  unsigned ring_head, ring_count;
  uint64_t released_round;
  bool stop;
};

uint64_t td_run_round_count(const td_runspec_t *spec, size_t train_rows) {
  if (spec->rounds > 0)
    return spec->rounds;
  uint64_t steps_per_epoch = (train_rows + spec->batch - 1) / spec->batch;
  uint64_t steps = steps_per_epoch * spec->epochs;
  uint64_t r = (steps + spec->local_steps - 1) / spec->local_steps;
  return r ? r : 1;
}

/* Round count and per-round H. Under the QSR, H_r = max(H_base,
 * floor((alpha / lr_r)^2)) with lr_r the schedule's rate at the round's first
 * step, H_base during warm-up, capped by the steps left; rounds then follow
 * from the steps of `epochs` passes (or the `rounds` key). */
static int plan_steps(td_run_t *run, const td_trainer_t *tr, size_t full_rows) {
  const td_runspec_t *sp = &run->spec;
  if (sp->qsr_alpha <= 0) {
    run->rounds = td_run_round_count(sp, full_rows);
  } else {
    unsigned long total = (unsigned long)((full_rows + sp->batch - 1) / sp->batch) * sp->epochs;
    unsigned long step = 0;
    run->rounds = 0;
    while (sp->rounds ? run->rounds < sp->rounds : step < total) {
      unsigned long cap = total > step ? total - step : 0;
      step += td_plan_qsr(sp->qsr_alpha, sp->local_steps, td_trainer_lr_at(tr, step),
                          step < sp->warmup_steps, cap);
      run->rounds++;
    }
  }
  run->steps_of = calloc(run->rounds ? run->rounds : 1, sizeof *run->steps_of);
  if (run->steps_of == NULL)
    return TD_ENOMEM;
  unsigned long step = 0;
  unsigned long total = (unsigned long)((full_rows + sp->batch - 1) / sp->batch) * sp->epochs;
  for (uint64_t r = 0; r < run->rounds; r++) {
    unsigned long h = sp->local_steps;
    if (sp->qsr_alpha > 0)
      h = td_plan_qsr(sp->qsr_alpha, sp->local_steps, td_trainer_lr_at(tr, step),
                      step < sp->warmup_steps, total > step ? total - step : 0);
    run->steps_of[r] = (unsigned)(h ? h : 1);
    step += run->steps_of[r];
  }
  return 0;
}

unsigned td_run_steps_of(const td_run_t *run, uint64_t round) {
  if (run->steps_of == NULL || round == 0 || round > run->rounds)
    return run->spec.local_steps;
  return run->steps_of[round - 1];
}

unsigned td_run_split_batch(unsigned batch, unsigned rank, unsigned nodes) {
  unsigned b = batch / nodes + (rank < batch % nodes ? 1 : 0);
  return b ? b : 1;
}

static bool post(td_run_t *run, const td_run_event_t *ev) {
  pthread_mutex_lock(&run->mu);
  bool ok = run->ring_count < EVENT_RING;
  if (ok) {
    run->ring[(run->ring_head + run->ring_count) % EVENT_RING] = *ev;
    run->ring_count++;
  }
  pthread_mutex_unlock(&run->mu);
  uv_async_send(&run->async);
  return ok;
}

/* A copy of the anchor for the ledger, every checkpoint_every rounds. */
static void post_checkpoint(td_run_t *run, uint64_t round) {
  if (run->spec.checkpoint_every == 0 || round % run->spec.checkpoint_every != 0)
    return;
  td_run_event_t ev = {.kind = TD_RUN_CHECKPOINT, .round = round};
  if ((ev.blob = malloc(run->numel * sizeof(float))) == NULL)
    return;
  memcpy(ev.blob, run->spec.mode_kind == TD_MODE_ASYNC ? run->start : run->anchor,
         run->numel * sizeof(float));
  if (!post(run, &ev))
    free(ev.blob);
}

static void post_failed(td_run_t *run, const char *why) {
  td_run_event_t ev = {.kind = TD_RUN_FAILED};
  snprintf(ev.message, sizeof ev.message, "%s", why);
  post(run, &ev);
}

static bool stopping(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  bool s = run->stop;
  pthread_mutex_unlock(&run->mu);
  return s;
}

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait until the loop released `round` (true) or a stop was requested; adds
 * the time blocked to *idle. */
static bool wait_release(td_run_t *run, uint64_t round, double *idle) {
  double t0 = mono_now();
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->released_round < round)
    pthread_cond_wait(&run->cv, &run->mu);
  bool ok = !run->stop;
  pthread_mutex_unlock(&run->mu);
  *idle += mono_now() - t0;
  return ok;
}

/* Overlap fill (overlap_fill = F > 0): up to F x H local steps while round
 * `round`'s average is still in flight, so compute waits less for a slow
 * network (bench_wan.sh: idle 99 % -> 2-4 % with F = 1000). They belong to the
 * next round (its delta, samples and loss) and do not move the learning-rate
 * schedule, which keeps following the nominal H steps per round. Off by
 * default: the larger deltas make the delayed swap noisier where the network
 * is fast anyway (loopback, inner momentum 0.9: a 5-node run ended at 0.807
 * with F = 1000 against 0.826 without), and under lossy codecs they make the
 * anchors drift apart faster, which `reconcile` undoes. */
typedef struct {
  uint64_t samples;
  double loss_sum, seconds;
  unsigned steps;
} fill_t;

static void sleep_for(td_run_t *run, double seconds);

static int fill_until(td_run_t *run, td_trainer_t *tr, uint64_t round, unsigned max_steps,
                      fill_t *f, char *why, size_t why_len) {
  while (f->steps < max_steps) {
    pthread_mutex_lock(&run->mu);
    bool done = run->stop || run->released_round >= round;
    pthread_mutex_unlock(&run->mu);
    if (done)
      return 0;
    double t0 = mono_now();
    td_train_stats_t st;
    int rc = td_trainer_fill_steps(tr, 1, &st, why, why_len);
    if (rc != 0)
      return rc;
    sleep_for(run, (run->slowdown - 1) * (mono_now() - t0));
    f->samples += st.samples;
    f->loss_sum += st.loss * (double)st.samples;
    f->seconds += mono_now() - t0;
    f->steps++;
  }
  return 0;
}

/* slowdown = F: stay idle (F - 1) times the compute time, so the node's
 * throughput is F times lower without burning a core another node needs. */
static void sleep_for(td_run_t *run, double seconds) {
  if (seconds <= 0)
    return;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  double t = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + seconds;
  until.tv_sec = (time_t)t;
  until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  pthread_mutex_lock(&run->mu);
  while (!run->stop) {
    if (pthread_cond_timedwait(&run->cv, &run->mu, &until) != 0)
      break;
  }
  pthread_mutex_unlock(&run->mu);
}

/* Fold a pending knowledge-transfer merge into params (and the round start,
 * so the merge is not mistaken for local progress). */
static void apply_merge(td_run_t *run, float *params) {
  pthread_mutex_lock(&run->mu);
  if (run->merge_lambda > 0) {
    float l = (float)run->merge_lambda;
    for (size_t i = 0; i < run->numel; i++) {
      params[i] = (1.0f - l) * params[i] + l * run->merge[i];
      run->start[i] = params[i];
    }
    run->merge_lambda = 0;
  }
  pthread_mutex_unlock(&run->mu);
}

/* Loss on the fixed validation subset and a copy of the local model, so the
 * loop can compare with peers and serve the model to a lagging one. */
static void post_probe(td_run_t *run, td_trainer_t *tr, const td_dataset_t *val, uint64_t round,
                       const float *params) {
  double loss = NAN, acc = NAN;
  char why[256];
  if (td_trainer_evaluate(tr, val, &loss, &acc, why, sizeof why) != 0 || !isfinite(loss))
    return;
  td_run_event_t ev = {.kind = TD_RUN_PROBE, .round = round, .loss = loss, .accuracy = acc};
  if ((ev.blob = malloc(run->numel * sizeof(float))) == NULL)
    return;
  memcpy(ev.blob, params, run->numel * sizeof(float));
  if (!post(run, &ev))
    free(ev.blob);
}

static unsigned batch_for(td_run_t *run, uint64_t round, unsigned current) {
  pthread_mutex_lock(&run->mu);
  uint64_t best = 0;
  unsigned b = current;
  for (unsigned i = 0; i < run->n_plans; i++)
    if (run->plans[i].from <= round && run->plans[i].from >= best) {
      best = run->plans[i].from;
      b = run->plans[i].batch;
    }
  pthread_mutex_unlock(&run->mu);
  return b;
}

/* Outer step on round r's average: anchor += step and, in overlap mode,
 * params += step - own delta of r (swap the stale own progress for the
 * global step, keeping the progress made since). */
static void apply_round(td_run_t *run, uint64_t r, float *params, bool overlap) {
  td_outer_opts_t o = {.lr = run->spec.outer_lr, .momentum = run->spec.outer_momentum,
                       .nesterov = run->spec.outer_nesterov, .clip = run->spec.outer_clip};
  float *avg = run->avg[r % 2];
  td_outer_step(&o, avg, run->mom, avg, run->numel); /* avg becomes the step */
  const float *own = run->delta[r % 2];
  for (size_t i = 0; i < run->numel; i++) {
    run->anchor[i] += avg[i];
    if (overlap) { /* the round start moves with params: fill steps stay progress */
      float swap = avg[i] - own[i];
      params[i] += swap;
      run->start[i] += swap;
    } else {
      params[i] = run->anchor[i];
    }
  }
}

static int load_partition(td_run_t *run, td_dataset_t **train, td_dataset_t **test,
                          size_t *full_rows, char *why, size_t n) {
  int rc = td_dataset_open(train, test, run->spec.dataset, why, n);
  if (rc != 0)
    return rc;
  double mean, std;
  td_dataset_stats(*train, &mean, &std);
  td_dataset_normalize(*train, mean, std);
  if (*test != NULL)
    td_dataset_normalize(*test, mean, std);
  *full_rows = td_dataset_rows(*train);
  td_partition_t part;
  if ((rc = td_partition_parse(&part, run->spec.partition, why, n)) != 0)
    return rc;
  if (part.kind == TD_PARTITION_ALL || run->nodes == 1)
    return 0;
  uint32_t *idx = NULL;
  size_t count = 0;
  rc = td_partition_indices(&part, td_dataset_labels_const(*train), td_dataset_rows(*train),
                            td_dataset_classes(*train), run->rank, run->nodes, run->spec.seed,
                            &idx, &count);
  if (rc == 0 && count == 0)
    rc = td_why(why, n, TD_ECONFIG, "partition %s leaves node %u of %u without samples",
                run->spec.partition, run->rank, run->nodes);
  td_dataset_t *sub = NULL;
  if (rc == 0)
    rc = td_dataset_subset(&sub, *train, idx, count);
  free(idx);
  if (rc != 0)
    return why[0] ? rc : td_why(why, n, rc, "cannot partition the dataset: %s", td_strerror(rc));
  td_dataset_close(train);
  *train = sub;
  return 0;
}

static unsigned nodes_at(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  unsigned k = run->nodes_from && round >= run->nodes_from ? run->nodes_next : run->nodes;
  pthread_mutex_unlock(&run->mu);
  return k;
}

static size_t anchor_floats(const td_run_t *run) { return run->numel * (run->mom ? 2 : 1); }

/* Late join, serving side: a copy of the anchor (and the outer momentum) once
 * it holds `round`, for a node that joins from round + 1. */
static void post_anchor(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  bool want = run->want_anchor == round;
  pthread_mutex_unlock(&run->mu);
  if (!want)
    return;
  td_run_event_t ev = {.kind = TD_RUN_ANCHOR, .round = round};
  if ((ev.blob = malloc(anchor_floats(run) * sizeof(float))) == NULL)
    return;
  memcpy(ev.blob, run->anchor, run->numel * sizeof(float));
  if (run->mom)
    memcpy(ev.blob + run->numel, run->mom, run->numel * sizeof(float));
  if (!post(run, &ev))
    free(ev.blob);
}

/* Late join, joining side: wait for the members' model, start from it, and
 * put the learning-rate schedule where the others are at round `first`. */
static bool wait_seed(td_run_t *run, td_trainer_t *tr, float *params, uint64_t first) {
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->seed == NULL)
    pthread_cond_wait(&run->cv, &run->mu);
  bool ok = !run->stop;
  if (ok) {
    memcpy(run->anchor, run->seed, run->numel * sizeof(float));
    if (run->mom)
      memcpy(run->mom, run->seed + run->numel, run->numel * sizeof(float));
  }
  pthread_mutex_unlock(&run->mu);
  if (!ok)
    return false;
  memcpy(params, run->anchor, run->numel * sizeof(float));
  memcpy(run->start, params, run->numel * sizeof(float));
  unsigned long step = 0;
  for (uint64_t r = 1; r < first && r <= run->rounds; r++)
    step += td_run_steps_of(run, r);
  td_trainer_seek(tr, step);
  return true;
}

bool td_run_reconciles(const td_run_t *run, uint64_t round) {
  if (!td_runspec_reconciles(&run->spec) || round == 0 || round > run->rounds)
    return false;
  return round == run->rounds ||
         (run->spec.reconcile_every > 0 && round % run->spec.reconcile_every == 0);
}

/* Move the anchor, the model and the round start by mean - own for the
 * reconciliations the loop finished, oldest first and only in round order
 * (a later one waits for an earlier one still out); each also moves the own
 * snapshots still out, which were taken before it, so their corrections do
 * not undo it. Returns the number applied. Caller holds run->mu. */
static unsigned apply_reconciled_locked(td_run_t *run, float *params) {
  unsigned n = 0;
  for (;;) {
    size_t k = REC_SLOTS;
    for (size_t j = 0; j < REC_SLOTS; j++)
      if (run->rec[j].round != 0 && (k == REC_SLOTS || run->rec[j].round < run->rec[k].round))
        k = j;
    if (k == REC_SLOTS || !run->rec[k].have)
      return n;
    const float *mean = run->rec[k].mean, *own = run->rec[k].own;
    size_t other = 1 - k;
    float *pend = run->rec[other].round != 0 ? run->rec[other].own : NULL;
    bool last = run->rec[k].round == run->rounds; /* nothing after it: the exact mean */
    for (size_t i = 0; last && i < run->numel; i++)
      params[i] = run->start[i] = run->anchor[i] = run->init[i] + mean[i];
    for (size_t i = 0; !last && i < run->numel; i++) {
      float corr = mean[i] - own[i];
      run->anchor[i] += corr;
      params[i] += corr;
      run->start[i] += corr;
      if (pend != NULL)
        pend[i] += corr;
    }
    run->rec[k].round = 0;
    run->rec[k].have = false;
    n++;
  }
}

static void apply_reconciled(td_run_t *run, float *params) {
  pthread_mutex_lock(&run->mu);
  apply_reconciled_locked(run, params);
  pthread_mutex_unlock(&run->mu);
}

/* The anchor holds `round`, a reconciliation round: keep anchor - init and
 * post a copy for the loop to send. Waits (idle) when both slots are still
 * out; false on stop or out of memory. */
static bool post_reconcile(td_run_t *run, uint64_t round, float *params, double *idle) {
  double t0 = mono_now();
  pthread_mutex_lock(&run->mu);
  size_t k;
  for (;;) {
    apply_reconciled_locked(run, params);
    for (k = 0; k < REC_SLOTS && run->rec[k].round != 0; k++)
      ;
    if (k < REC_SLOTS || run->stop)
      break;
    pthread_cond_wait(&run->cv, &run->mu);
  }
  bool ok = !run->stop;
  if (ok) {
    for (size_t i = 0; i < run->numel; i++)
      run->rec[k].own[i] = run->anchor[i] - run->init[i];
    run->rec[k].round = round;
    run->rec[k].have = false;
  }
  pthread_mutex_unlock(&run->mu);
  *idle += mono_now() - t0;
  if (!ok)
    return false;
  td_run_event_t ev = {.kind = TD_RUN_RECONCILE, .round = round};
  if ((ev.blob = malloc(run->numel * sizeof(float))) == NULL)
    return false;
  memcpy(ev.blob, run->rec[k].own, run->numel * sizeof(float));
  if (!post(run, &ev)) {
    free(ev.blob);
    return false;
  }
  return true;
}

/* After the last round: wait for its reconciliation, so every node ends on
 * the same model. */
static bool wait_reconciled(td_run_t *run, uint64_t round, float *params) {
  pthread_mutex_lock(&run->mu);
  for (;;) {
    apply_reconciled_locked(run, params);
    bool pending = false;
    for (size_t k = 0; k < REC_SLOTS; k++)
      pending |= run->rec[k].round != 0 && run->rec[k].round <= round;
    if (!pending || run->stop)
      break;
    pthread_cond_wait(&run->cv, &run->mu);
  }
  bool ok = !run->stop;
  pthread_mutex_unlock(&run->mu);
  return ok;
}

static void *compute_main(void *arg) {
  td_run_t *run = arg;
  char why[512] = "";
  td_backend_t *be = NULL;
  td_dataset_t *train = NULL, *test = NULL, *val = NULL;
  td_trainer_t *tr = NULL;
  size_t full_rows = 0;
  int rc = td_backend_open(&be, run->spec.backend, (int)run->spec.threads, why, sizeof why);
  if (rc == 0)
    rc = load_partition(run, &train, &test, &full_rows, why, sizeof why);
  if (rc != 0) {
    post_failed(run, why);
    goto done;
  }
  td_trainer_opts_t opts = {
      .model_spec = run->spec.model,
      .batch = run->local_batch,
      .max_batch = run->spec.batch,
      .seed = run->spec.seed,
      .lr = run->spec.lr,
      .lr_schedule = run->spec.lr_schedule,
      .warmup_steps = run->spec.warmup_steps,
      .epochs = 1,
      .total_steps = run->spec.qsr_alpha > 0
                         ? (unsigned long)((full_rows + run->spec.batch - 1) / run->spec.batch) *
                               run->spec.epochs
                         : (unsigned long)(td_run_round_count(&run->spec, full_rows) *
                                           run->spec.local_steps),
      .sgd = {.momentum = run->spec.momentum, .nesterov = run->spec.nesterov,
              .weight_decay = run->spec.weight_decay},
  };
  if ((rc = td_trainer_open(&tr, be, train, &opts, why, sizeof why)) != 0 ||
      (test != NULL && (rc = td_trainer_check_dataset(tr, test, why, sizeof why)) != 0)) {
    post_failed(run, why);
    goto done;
  }
  if (plan_steps(run, tr, full_rows) != 0) {
    post_failed(run, "out of memory for the round plan");
    goto done;
  }
  td_model_t *model = td_trainer_model(tr);
  float *params = td_model_params(model);
  if (td_model_numel(model) != run->numel) {
    post_failed(run, "model size changed between planning and training");
    goto done;
  }
  /* Every node initialises from the same seed: the anchor starts identical. */
  memcpy(run->anchor, params, run->numel * sizeof(float));
  memcpy(run->start, params, run->numel * sizeof(float));
  if (run->init != NULL)
    memcpy(run->init, params, run->numel * sizeof(float));
  td_run_event_t ready = {.kind = TD_RUN_READY, .round = run->rounds};
  post(run, &ready);

  const td_dataset_t *eval_set = test != NULL ? test : train;
  const td_mode_t mode = run->spec.mode_kind;
  /* knowledge transfer compares every node on the same first rows of the
   * test set (1000 at most), so the scores are comparable */
  if (run->spec.transfer > 0) {
    size_t nv = td_dataset_rows(eval_set) < 1000 ? td_dataset_rows(eval_set) : 1000;
    uint32_t *idx = malloc(nv * sizeof *idx);
    for (size_t i = 0; idx != NULL && i < nv; i++)
      idx[i] = (uint32_t)i;
    if (idx == NULL || td_dataset_subset(&val, eval_set, idx, nv) != 0)
      val = NULL;
    free(idx);
  }
  uint64_t first = run->first_round;
  if (first > 1 && !wait_seed(run, tr, params, first))
    goto stopped;
  double loss = NAN, acc = NAN, capacity = 0, idle = 0;
  fill_t fill = {0};
  unsigned batch = run->local_batch;
  for (uint64_t round = first; round <= run->rounds; round++) {
    td_train_stats_t st = {0};
    if (stopping(run))
      break;
    if (mode == TD_MODE_ASYNC && round > run->spec.max_staleness + 1 &&
        !wait_release(run, round - 1 - run->spec.max_staleness, &idle))
      break;
    apply_merge(run, params);
    apply_reconciled(run, params);
    batch = batch_for(run, round, batch);
    td_trainer_set_batch(tr, batch);
    /* linear scaling below the even share: per-sample steps stay the same */
    double even = (double)run->spec.batch / nodes_at(run, round);
    td_trainer_set_lr_scale(tr, batch < even ? batch / even : 1);
    double t0 = mono_now();
    rc = td_trainer_steps(tr, td_run_steps_of(run, round), &st, why, sizeof why);
    if (rc != 0) {
      post_failed(run, why);
      goto done;
    }
    sleep_for(run, (run->slowdown - 1) * (mono_now() - t0));
    double compute_s = mono_now() - t0;
    if (compute_s > 0)
      capacity = td_plan_ewma(capacity, (double)st.samples / compute_s, CAPACITY_RHO);
    if (fill.samples > 0) { /* last wait's fill steps are this round's progress too */
      st.loss = (st.loss * (double)st.samples + fill.loss_sum) / (double)(st.samples + fill.samples);
      st.samples += fill.samples;
    }
    float *delta = run->delta[round % 2];
    const float *base = mode == TD_MODE_SYNC ? run->anchor : run->start;
    for (size_t i = 0; i < run->numel; i++)
      delta[i] = params[i] - base[i];
    td_run_event_t ev = {.kind = TD_RUN_ROUND_DONE, .round = round, .samples = st.samples,
                         .loss = st.loss, .compute_s = compute_s, .idle_s = idle,
                         .capacity = capacity, .batch = batch,
                         .steps = td_run_steps_of(run, round), .fill_steps = fill.steps,
                         .fill_s = fill.seconds, .lr = st.lr};
    post(run, &ev);
    idle = 0;
    fill = (fill_t){0};
    if (mode == TD_MODE_SYNC) {
      if (!wait_release(run, round, &idle))
        break;
      apply_round(run, round, params, false);
      if (td_run_reconciles(run, round) && !post_reconcile(run, round, params, &idle))
        break;
      if (round == run->rounds && td_run_reconciles(run, round) &&
          !wait_reconciled(run, round, params))
        break;
      post_anchor(run, round);
      post_checkpoint(run, round);
    } else if (mode == TD_MODE_OVERLAP) {
      memcpy(run->start, params, run->numel * sizeof(float));
      if (round > first) { /* a late joiner's seed already holds round first - 1 */
        if (run->spec.overlap_fill > 0 && round < run->rounds &&
            (rc = fill_until(run, tr, round - 1,
                             run->spec.overlap_fill * td_run_steps_of(run, round + 1), &fill,
                             why, sizeof why)) != 0) {
          post_failed(run, why);
          goto done;
        }
        if (!wait_release(run, round - 1, &idle))
          break;
        apply_round(run, round - 1, params, true);
        if (td_run_reconciles(run, round - 1) && !post_reconcile(run, round - 1, params, &idle))
          break;
        post_anchor(run, round - 1);
        post_checkpoint(run, round - 1);
      }
      if (round == run->rounds) { /* the last average, then the consensus model */
        if (!wait_release(run, round, &idle))
          break;
        apply_round(run, round, params, true);
        if (td_run_reconciles(run, round) && (!post_reconcile(run, round, params, &idle) ||
                                             !wait_reconciled(run, round, params)))
          break;
        memcpy(params, run->anchor, run->numel * sizeof(float));
      }
    } else {
      /* own progress counts with its sample share; peers' arrive in the inbox */
      double share = (double)st.samples / ((double)run->spec.batch * ev.steps);
      float keep = (float)(share < 1 ? share : 1);
      pthread_mutex_lock(&run->mu);
      for (size_t i = 0; i < run->numel; i++) {
        params[i] += (keep - 1.0f) * delta[i] + run->inbox[i];
        run->inbox[i] = 0;
      }
      pthread_mutex_unlock(&run->mu);
      memcpy(run->start, params, run->numel * sizeof(float));
      post_checkpoint(run, round);
    }
    if (mode == TD_MODE_SYNC) /* overlap moved its start with the swap */
      memcpy(run->start, params, run->numel * sizeof(float));
    if (val != NULL && round % run->spec.transfer == 0 && round < run->rounds)
      post_probe(run, tr, val, round, params);
    if (round % run->spec.eval_every == 0 || round == run->rounds) {
      rc = td_trainer_evaluate(tr, eval_set, &loss, &acc, why, sizeof why);
      if (rc != 0) {
        post_failed(run, why);
        goto done;
      }
      td_run_event_t e2 = {.kind = round == run->rounds ? TD_RUN_FINISHED : TD_RUN_EVAL,
                           .round = round, .loss = loss, .accuracy = acc};
      post(run, &e2);
    }
  }
stopped:
  if (stopping(run)) {
    td_run_event_t ev = {.kind = TD_RUN_STOPPED};
    post(run, &ev);
  }
done:
  td_dataset_close(&val);
  td_trainer_close(&tr);
  td_dataset_close(&train);
  td_dataset_close(&test);
  td_backend_close(&be);
  return NULL;
}

static void free_buffers(td_run_t *run) {
  free(run->anchor);
  free(run->delta[0]);
  free(run->delta[1]);
  free(run->avg[0]);
  free(run->avg[1]);
  free(run->start);
  free(run->inbox);
  free(run->mom);
  free(run->init);
  for (size_t k = 0; k < REC_SLOTS; k++) {
    free(run->rec[k].own);
    free(run->rec[k].mean);
  }
  free(run->merge);
  free(run->seed);
  free(run->steps_of);
}

static void on_async(uv_async_t *h) {
  td_run_t *run = h->data;
  if (run->on_events)
    run->on_events(run, run->user);
}

int td_run_start(td_run_t **out, const td_run_opts_t *opts, char *why, size_t why_len) {
  *out = NULL;
  if (opts->nodes == 0 || opts->rank >= opts->nodes)
    return td_why(why, why_len, TD_EINVAL, "rank %u of %u nodes", opts->rank, opts->nodes);
  int rc = td_runspec_validate(opts->spec, why, why_len);
  if (rc != 0)
    return rc;
  td_run_t *run = calloc(1, sizeof *run);
  if (run == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  run->spec = *opts->spec;
  run->rank = opts->rank;
  run->nodes = opts->nodes;
  run->first_round = opts->first_round > 1 ? opts->first_round : 1;
  run->local_batch = td_run_split_batch(run->spec.batch, run->rank, run->nodes);
  run->slowdown = td_runspec_slowdown(&run->spec, run->rank);
  run->loop = opts->loop;
  run->on_events = opts->on_events;
  run->user = opts->user;
  pthread_mutex_init(&run->mu, NULL);
  pthread_cond_init(&run->cv, NULL);

  /* Size the model here (cheap) so the loop can collect updates before the
   * dataset is loaded. */
  rc = td_backend_open(&run->probe_be, "cpu", 1, why, why_len);
  if (rc == 0)
    rc = td_model_open(&run->probe, run->spec.model, run->probe_be, 1, why, why_len);
  if (rc == 0)
    run->numel = td_model_numel(run->probe);
  if (rc != 0) {
    td_model_close(&run->probe);
    td_backend_close(&run->probe_be);
    pthread_mutex_destroy(&run->mu);
    pthread_cond_destroy(&run->cv);
    free(run);
    return rc;
  }
  bool need_mom = run->spec.outer_momentum > 0 || run->spec.outer_clip > 0;
  bool need_rec = td_runspec_reconciles(&run->spec);
  float **bufs[] = {&run->anchor, &run->delta[0], &run->delta[1], &run->avg[0], &run->avg[1],
                    &run->start, &run->inbox, &run->mom, &run->init,
                    &run->rec[0].own, &run->rec[0].mean, &run->rec[1].own, &run->rec[1].mean};
  bool ok = true;
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    if (bufs[i] == &run->mom && !need_mom)
      continue;
    if (bufs[i] == &run->inbox && run->spec.mode_kind != TD_MODE_ASYNC)
      continue;
    if (!need_rec && (bufs[i] == &run->init || bufs[i] == &run->rec[0].own ||
                      bufs[i] == &run->rec[0].mean || bufs[i] == &run->rec[1].own ||
                      bufs[i] == &run->rec[1].mean))
      continue;
    if ((*bufs[i] = calloc(run->numel, sizeof(float))) == NULL)
      ok = false;
  }
  if (!ok || uv_async_init(run->loop, &run->async, on_async) != 0) {
    td_model_close(&run->probe);
    td_backend_close(&run->probe_be);
    free_buffers(run);
    pthread_mutex_destroy(&run->mu);
    pthread_cond_destroy(&run->cv);
    free(run);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  run->async.data = run;
  if (pthread_create(&run->thread, NULL, compute_main, run) != 0) {
    td_why(why, why_len, TD_ENOMEM, "cannot start the compute thread");
    run->thread_started = false;
    td_run_close(&run);
    return TD_ENOMEM;
  }
  run->thread_started = true;
  *out = run;
  return 0;
}

static void free_after_close(uv_handle_t *h) {
  td_run_t *run = h->data;
  for (unsigned i = 0; i < run->ring_count; i++) /* checkpoints nobody took */
    if (run->ring[(run->ring_head + i) % EVENT_RING].blob != NULL)
      free(run->ring[(run->ring_head + i) % EVENT_RING].blob);
  td_model_close(&run->probe);
  td_backend_close(&run->probe_be);
  free_buffers(run);
  pthread_mutex_destroy(&run->mu);
  pthread_cond_destroy(&run->cv);
  free(run);
}

void td_run_join(td_run_t *run) {
  td_run_stop(run);
  if (run->thread_started)
    pthread_join(run->thread, NULL);
  run->thread_started = false;
}

void td_run_close(td_run_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_run_t *run = *self_p;
  *self_p = NULL;
  td_run_stop(run);
  if (run->thread_started)
    pthread_join(run->thread, NULL);
  /* the async handle is freed from its close callback (libuv rule) */
  uv_close((uv_handle_t *)&run->async, free_after_close);
}

bool td_run_next_event(td_run_t *run, td_run_event_t *ev) {
  pthread_mutex_lock(&run->mu);
  bool any = run->ring_count > 0;
  if (any) {
    *ev = run->ring[run->ring_head];
    run->ring_head = (run->ring_head + 1) % EVENT_RING;
    run->ring_count--;
  }
  pthread_mutex_unlock(&run->mu);
  return any;
}

size_t td_run_numel(const td_run_t *run) { return run->numel; }
const td_layout_t *td_run_layout(const td_run_t *run) { return td_model_layout(run->probe); }
const float *td_run_delta(const td_run_t *run, uint64_t round) { return run->delta[round % 2]; }
float *td_run_avg(td_run_t *run, uint64_t round) { return run->avg[round % 2]; }
uint64_t td_run_rounds(const td_run_t *run) { return run->rounds; }
unsigned td_run_local_batch(const td_run_t *run) { return run->local_batch; }

void td_run_async_add(td_run_t *run, const float *delta, double weight) {
  if (run->inbox == NULL || !(weight > 0))
    return;
  float w = (float)weight;
  pthread_mutex_lock(&run->mu);
  for (size_t i = 0; i < run->numel; i++)
    run->inbox[i] += w * delta[i];
  pthread_mutex_unlock(&run->mu);
}

void td_run_merge(td_run_t *run, const float *x, double lambda) {
  if (!(lambda > 0) || lambda > 1)
    return;
  pthread_mutex_lock(&run->mu);
  if (run->merge == NULL)
    run->merge = malloc(run->numel * sizeof(float));
  if (run->merge != NULL) {
    memcpy(run->merge, x, run->numel * sizeof(float));
    run->merge_lambda = lambda;
  }
  pthread_mutex_unlock(&run->mu);
}

size_t td_run_anchor_bytes(const td_run_t *run) { return anchor_floats(run) * sizeof(float); }

int td_run_seed(td_run_t *run, const float *x, size_t bytes) {
  if (bytes != td_run_anchor_bytes(run))
    return TD_EINVAL;
  float *copy = malloc(bytes);
  if (copy == NULL)
    return TD_ENOMEM;
  memcpy(copy, x, bytes);
  pthread_mutex_lock(&run->mu);
  free(run->seed);
  run->seed = copy;
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
  return 0;
}

void td_run_reconciled(td_run_t *run, uint64_t round, const float *mean) {
  pthread_mutex_lock(&run->mu);
  for (size_t k = 0; k < REC_SLOTS; k++)
    if (run->rec[k].round == round && round != 0 && !run->rec[k].have) {
      memcpy(run->rec[k].mean, mean, run->numel * sizeof(float));
      run->rec[k].have = true;
    }
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

void td_run_want_anchor(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  run->want_anchor = round;
  pthread_mutex_unlock(&run->mu);
}

void td_run_set_nodes(td_run_t *run, uint64_t from_round, unsigned nodes) {
  if (nodes == 0)
    return;
  pthread_mutex_lock(&run->mu);
  run->nodes_from = from_round;
  run->nodes_next = nodes;
  pthread_mutex_unlock(&run->mu);
}

void td_run_set_batch(td_run_t *run, uint64_t from_round, unsigned batch) {
  if (batch == 0 || batch > run->spec.batch)
    return;
  pthread_mutex_lock(&run->mu);
  if (run->n_plans == PLAN_RING) { /* forget the oldest plan */
    unsigned oldest = 0;
    for (unsigned i = 1; i < PLAN_RING; i++)
      if (run->plans[i].from < run->plans[oldest].from)
        oldest = i;
    run->plans[oldest] = run->plans[--run->n_plans];
  }
  run->plans[run->n_plans].from = from_round;
  run->plans[run->n_plans++].batch = batch;
  pthread_mutex_unlock(&run->mu);
}

void td_run_release(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  if (round > run->released_round)
    run->released_round = round;
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

void td_run_stop(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  run->stop = true;
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}
