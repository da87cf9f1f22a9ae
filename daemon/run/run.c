/* run.c: a training run's lifecycle and its hand-offs between threads.
 *
 * Owns starting a run (validate, size the model, allocate its buffers, start
 * the compute thread of run_compute.c) and closing it, and the calls other
 * threads make into a running run: releasing rounds, peer
 * updates (async), merges, batch plans, late-join seeds, stop. Each of those
 * changes state under run->mu and broadcasts run->cv, which is how the
 * compute thread, waiting there, hears of it.
 * The event mailbox from the compute thread back to the loop thread is in
 * run_mailbox.c, below the compute thread's files that post to it.
 * Threads: td_run_start, td_run_join and td_run_close on the loop thread; the
 * rest on any thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "common/error.h"
#include "daemon/run/run_internal.h"
#include "scheduler/fragment.h"
#include "scheduler/overlap.h"
#include "scheduler/steps.h"

uint64_t td_run_round_count(const td_runspec_t *spec, size_t train_rows) {
  td_steps_opts_t o = {.train_rows = train_rows, .batch = spec->batch, .epochs = spec->epochs,
                       .rounds = spec->rounds, .local_steps = spec->local_steps};
  return td_steps_round_count(&o);
}

unsigned td_run_split_batch(unsigned batch, unsigned rank, unsigned nodes) {
  return td_steps_split_batch(batch, rank, nodes);
}

/* ---- start and close ----------------------------------------------------------------- */

static void free_buffers(td_run_t *run) {
  free(run->label_counts);
  free(run->client_cand);
  free(run->anchor);
  free(run->delta[0]);
  free(run->delta[1]);
  free(run->avg[0]);
  free(run->avg[1]);
  free(run->start);
  free(run->inbox);
  free(run->mom);
  free(run->init);
  for (size_t k = 0; k < TD_RUN_REC_SLOTS; k++) {
    free(run->rec[k].own);
    free(run->rec[k].mean);
  }
  free(run->merge);
  free(run->seed);
  free(run->repair_state);
  free(run->steps_of);
}

/* Everything but the async handle, which libuv frees from its close callback. */
static void free_run(td_run_t *run) {
  for (unsigned i = 0; i < run->mailbox_count; i++) /* blobs nobody took */
    free(run->mailbox[(run->mailbox_head + i) % TD_RUN_MAILBOX].blob);
  td_model_close(&run->probe);
  td_backend_close(&run->probe_be);
  free_buffers(run);
  pthread_mutex_destroy(&run->mu);
  pthread_cond_destroy(&run->cv);
  free(run);
}

static void on_async(uv_async_t *h) {
  td_run_t *run = h->data;
  if (run->on_events)
    run->on_events(run, run->user);
}

/* The model's buffers: those every run needs, and those of the features the
 * spec turns on (outer optimizer state, async inbox, reconciliation). */
static int alloc_buffers(td_run_t *run) {
  td_outer_opts_t outer;
  td_runspec_outer_opts(&run->spec, &outer);
  run->outer_floats = td_outer_state_floats(&outer, run->numel);
  bool dc = run->spec.mode_kind == TD_MODE_OVERLAP &&
            run->spec.overlap_fix_kind == TD_OVERLAP_FIX_DC;
  bool scaffold = run->spec.scaffold; /* sync only (td_runspec_validate): never with dc */
  run->mom_floats = run->outer_floats + (dc || scaffold ? run->numel : 0);
  bool need_inbox = run->spec.mode_kind == TD_MODE_ASYNC;
  bool need_rec = td_runspec_reconciles(&run->spec);
  struct {
    float **buf;
    bool needed;
  } bufs[] = {
      {&run->anchor, true},         {&run->delta[0], true},       {&run->delta[1], true},
      {&run->avg[0], true},         {&run->avg[1], true},         {&run->start, true},
      {&run->inbox, need_inbox},    {&run->init, need_rec},
      {&run->rec[0].own, need_rec}, {&run->rec[0].mean, need_rec}, {&run->rec[1].own, need_rec},
      {&run->rec[1].mean, need_rec},
  };
  _Static_assert(TD_RUN_REC_SLOTS == 2, "alloc_buffers lists two reconciliation slots");
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i].needed && (*bufs[i].buf = calloc(run->numel, sizeof(float))) == NULL)
      return TD_ENOMEM;
  if (run->mom_floats > 0) {
    if ((run->mom = malloc(run->mom_floats * sizeof(float))) == NULL)
      return TD_ENOMEM;
    td_outer_state_init(&outer, run->mom, run->numel);
    if (dc) { /* no step before the first round */
      run->dc_drift = run->mom + run->outer_floats;
      memset(run->dc_drift, 0, run->numel * sizeof(float));
    }
    if (scaffold) { /* c = 0 before the first round, as every ci */
      run->scaffold_c = run->mom + run->outer_floats;
      memset(run->scaffold_c, 0, run->numel * sizeof(float));
    }
  }
  return 0;
}

/* fragments = P: every slice must hold a parameter, or its round's update
 * would be an empty message (a slice of a tiny model can fall in the
 * padding between tensors, params.h). */
static int check_slices(const td_run_t *run, char *why, size_t why_len) {
  const td_layout_t *layout = td_model_layout(run->probe);
  for (unsigned f = 0; run->spec.fragments > 1 && f < run->spec.fragments; f++) {
    size_t off, count;
    bool holds = false;
    td_fragment_span(run->numel, run->spec.fragments, f, &off, &count);
    for (size_t t = 0; t < td_layout_count(layout) && !holds; t++) {
      const td_tensor_info_t *ti = td_layout_tensor(layout, t);
      holds = ti->offset < off + count && off < ti->offset + ti->numel;
    }
    if (!holds)
      return td_why(why, why_len, TD_ECONFIG,
                    "fragments = %u: slice %u of model %s holds only padding; use fewer "
                    "fragments", run->spec.fragments, f, run->spec.model);
  }
  return 0;
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
    return td_why(why, why_len, TD_ENOMEM, "out of memory for the run");
  run->spec = *opts->spec;
  run->rank = opts->rank;
  run->nodes = opts->nodes;
  run->first_round = opts->first_round > 1 ? opts->first_round : 1;
  run->held = opts->held;
  run->max_rounds = opts->max_rounds;
  run->max_checkpoint_bytes = opts->max_checkpoint_bytes;
  run->checkpoint_acks = opts->checkpoint_acks;
  run->keep_model = opts->keep_model;
  run->local_batch = td_steps_split_batch(run->spec.batch, run->rank, run->nodes);
  run->slowdown = td_runspec_slowdown(&run->spec, run->rank);
  run->loop = opts->loop;
  run->on_events = opts->on_events;
  run->user = opts->user;
  run->open_backend = opts->open_backend;
  pthread_mutex_init(&run->mu, NULL);
  pthread_condattr_t attr; /* deadlines (slowdown) on the monotonic clock */
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&run->cv, &attr);
  pthread_condattr_destroy(&attr);

  /* Size the model here (cheap) so the loop can collect updates before the
   * dataset is loaded. This batch-1 copy only gives the layout, the size and
   * the context, which do not depend on the backend: it lives in host memory
   * on the CPU whatever the run's backend, so a GPU run does not open a second
   * device context on the loop thread. The capacity that weighted batching
   * uses is measured by the compute thread on the run's own backend
   * (run_compute.c, round_steps). */
  rc = td_backend_open(&run->probe_be, "cpu", 1, why, why_len);
  if (rc == 0)
    rc = td_model_open(&run->probe, run->spec.model, run->probe_be, 1, why, why_len);
  if (rc != 0) {
    free_run(run);
    return rc;
  }
  run->numel = td_model_numel(run->probe);
  run->mixes = td_runspec_mixes(&run->spec);
  if (run->spec.fragments > run->numel) { /* before any buffer is sized */
    td_why(why, why_len, TD_ECONFIG, "fragments = %u: model %s has only %zu parameters",
           run->spec.fragments, run->spec.model, run->numel);
    free_run(run);
    return TD_ECONFIG;
  }
  if ((rc = check_slices(run, why, why_len)) != 0) {
    free_run(run);
    return rc;
  }
  if ((rc = alloc_buffers(run)) != 0) {
    free_run(run);
    return td_why(why, why_len, rc, "out of memory for the model's buffers (%zu floats each)",
                  run->numel);
  }
  if ((rc = uv_async_init(run->loop, &run->async, on_async)) != 0) {
    free_run(run);
    return td_why(why, why_len, TD_EIO, "cannot wake the loop from the compute thread: %s",
                  uv_strerror(rc));
  }
  run->async.data = run;
  if ((rc = pthread_create(&run->thread, NULL, td__run_compute_main, run)) != 0) {
    td_why(why, why_len, TD_ENOMEM, "cannot start the compute thread: %s", strerror(rc));
    td_run_close(&run);
    return TD_ENOMEM;
  }
  run->thread_started = true;
  *out = run;
  return 0;
}

static void free_after_close(uv_handle_t *h) { free_run(h->data); }

void td_run_join(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  run->stop = true;
  run->closing = true; /* a compute thread waiting for room in the mailbox gives up */
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
  if (run->thread_started)
    pthread_join(run->thread, NULL);
  run->thread_started = false;
}

void td_run_close(td_run_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_run_t *run = *self_p;
  *self_p = NULL;
  td_run_join(run);
  /* the async handle is freed from its close callback (libuv rule) */
  uv_close((uv_handle_t *)&run->async, free_after_close);
}

/* ---- hand-offs from other threads ---------------------------------------------------- */

size_t td_run_numel(const td_run_t *run) { return run->numel; }
const td_layout_t *td_run_layout(const td_run_t *run) { return td_model_layout(run->probe); }
const float *td_run_delta(const td_run_t *run, uint64_t round) { return run->delta[round % 2]; }
void td_run_slice(const td_run_t *run, uint64_t round, size_t *offset, size_t *count) {
  td_fragment_span(run->numel, run->spec.fragments > 1 ? run->spec.fragments : 1, round, offset,
                   count);
}
float *td_run_avg(td_run_t *run, uint64_t round) { return run->avg[round % 2]; }
uint64_t td_run_rounds(const td_run_t *run) { return run->rounds; }
unsigned td_run_local_batch(const td_run_t *run) { return run->local_batch; }
const uint64_t *td_run_label_counts(const td_run_t *run, unsigned *nodes, int *classes) {
  *nodes = run->label_nodes;
  *classes = run->label_classes;
  return run->label_counts;
}
size_t td_run_anchor_bytes(const td_run_t *run) {
  return (run->numel + run->mom_floats) * sizeof(float);
}

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
  if (run->merge != NULL) { /* out of memory: this merge is skipped, the next may fit */
    memcpy(run->merge, x, run->numel * sizeof(float));
    run->merge_lambda = lambda;
  }
  pthread_mutex_unlock(&run->mu);
}

void td_run_go(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  run->held = false;
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

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
  if (run->n_plans == TD_RUN_PLANS) { /* forget the oldest plan */
    unsigned oldest = 0;
    for (unsigned i = 1; i < TD_RUN_PLANS; i++)
      if (run->plans[i].from < run->plans[oldest].from)
        oldest = i;
    run->plans[oldest] = run->plans[--run->n_plans];
  }
  run->plans[run->n_plans].from = from_round;
  run->plans[run->n_plans++].batch = batch;
  pthread_mutex_unlock(&run->mu);
}

void td_run_checkpoint_written(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  run->checkpoint_out = false;
  pthread_cond_broadcast(&run->cv);
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

bool td_run_stopping(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  bool stop = run->stop;
  pthread_mutex_unlock(&run->mu);
  return stop;
}
