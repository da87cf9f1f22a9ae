/* run.c: the compute thread of a run and its two hand-offs with the loop.
 *
 * Events flow compute -> loop through a mutex-protected ring and
 * uv_async_send (coalescing wake-ups are fine: the loop drains the ring).
 * Rounds flow loop -> compute through `released_round` and a condition
 * variable. Stop requests are a flag checked between steps and while waiting. */
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

#define EVENT_RING 64

struct td_run {
  td_runspec_t spec;
  unsigned rank, nodes, local_batch;
  size_t numel;
  td_backend_t *probe_be; /* the layout comes from a batch-1 copy of the model */
  td_model_t *probe;
  uint64_t rounds;
  float *anchor, *delta;

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

unsigned td_run_split_batch(unsigned batch, unsigned rank, unsigned nodes) {
  unsigned b = batch / nodes + (rank < batch % nodes ? 1 : 0);
  return b ? b : 1;
}

static void post(td_run_t *run, const td_run_event_t *ev) {
  pthread_mutex_lock(&run->mu);
  if (run->ring_count < EVENT_RING) {
    run->ring[(run->ring_head + run->ring_count) % EVENT_RING] = *ev;
    run->ring_count++;
  }
  pthread_mutex_unlock(&run->mu);
  uv_async_send(&run->async);
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

/* Wait until the loop released `round` (true) or a stop was requested. */
static bool wait_release(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->released_round < round)
    pthread_cond_wait(&run->cv, &run->mu);
  bool ok = !run->stop;
  pthread_mutex_unlock(&run->mu);
  return ok;
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

static void *compute_main(void *arg) {
  td_run_t *run = arg;
  char why[512] = "";
  td_backend_t *be = NULL;
  td_dataset_t *train = NULL, *test = NULL;
  td_trainer_t *tr = NULL;
  size_t full_rows = 0;
  int rc = td_backend_open(&be, run->spec.backend, (int)run->spec.threads, why, sizeof why);
  if (rc == 0)
    rc = load_partition(run, &train, &test, &full_rows, why, sizeof why);
  if (rc != 0) {
    post_failed(run, why);
    goto done;
  }
  run->rounds = td_run_round_count(&run->spec, full_rows);
  td_trainer_opts_t opts = {
      .model_spec = run->spec.model,
      .batch = run->local_batch,
      .seed = run->spec.seed,
      .lr = run->spec.lr,
      .lr_schedule = run->spec.lr_schedule,
      .warmup_steps = run->spec.warmup_steps,
      .epochs = 1,
      .total_steps = (unsigned long)(run->rounds * run->spec.local_steps),
      .sgd = {.momentum = run->spec.momentum, .nesterov = run->spec.nesterov,
              .weight_decay = run->spec.weight_decay},
  };
  if ((rc = td_trainer_open(&tr, be, train, &opts, why, sizeof why)) != 0 ||
      (test != NULL && (rc = td_trainer_check_dataset(tr, test, why, sizeof why)) != 0)) {
    post_failed(run, why);
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
  td_run_event_t ready = {.kind = TD_RUN_READY, .round = run->rounds};
  post(run, &ready);

  const td_dataset_t *eval_set = test != NULL ? test : train;
  double loss = NAN, acc = NAN;
  for (uint64_t round = 1; round <= run->rounds; round++) {
    td_train_stats_t st = {0};
    if (stopping(run))
      break;
    rc = td_trainer_steps(tr, run->spec.local_steps, &st, why, sizeof why);
    if (rc != 0) {
      post_failed(run, why);
      goto done;
    }
    for (size_t i = 0; i < run->numel; i++)
      run->delta[i] = params[i] - run->anchor[i];
    td_run_event_t ev = {.kind = TD_RUN_ROUND_DONE, .round = round, .samples = st.samples,
                         .loss = st.loss, .compute_s = st.seconds, .lr = st.lr};
    post(run, &ev);
    if (!wait_release(run, round))
      break;
    memcpy(params, run->anchor, run->numel * sizeof(float));
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
  if (stopping(run)) {
    td_run_event_t ev = {.kind = TD_RUN_STOPPED};
    post(run, &ev);
  }
done:
  td_trainer_close(&tr);
  td_dataset_close(&train);
  td_dataset_close(&test);
  td_backend_close(&be);
  return NULL;
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
  run->local_batch = td_run_split_batch(run->spec.batch, run->rank, run->nodes);
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
  run->anchor = calloc(run->numel, sizeof(float));
  run->delta = calloc(run->numel, sizeof(float));
  if (run->anchor == NULL || run->delta == NULL ||
      uv_async_init(run->loop, &run->async, on_async) != 0) {
    td_model_close(&run->probe);
    td_backend_close(&run->probe_be);
    free(run->anchor);
    free(run->delta);
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
  td_model_close(&run->probe);
  td_backend_close(&run->probe_be);
  free(run->anchor);
  free(run->delta);
  pthread_mutex_destroy(&run->mu);
  pthread_cond_destroy(&run->cv);
  free(run);
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
const float *td_run_delta(const td_run_t *run) { return run->delta; }
float *td_run_anchor(td_run_t *run) { return run->anchor; }
uint64_t td_run_rounds(const td_run_t *run) { return run->rounds; }
unsigned td_run_local_steps(const td_run_t *run) { return run->spec.local_steps; }
unsigned td_run_local_batch(const td_run_t *run) { return run->local_batch; }

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
