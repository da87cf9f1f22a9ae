/* run_compute.c: the compute thread of a run: everything that runs BLAS.
 *
 * It loads the data (its partition, td_shard_open: rows, or bytes of text
 * for a token model; the test rows only while it evaluates them: a node that
 * evaluates only after the last round frees them until then), plans the
 * rounds (scheduler/steps.h),
 * and then runs each round as a short sequence of phases: begin (fold in what
 * other threads handed over, pick the batch), local steps, post the delta,
 * then one function per mode for what follows a round (sync: wait for the
 * round's average and step the anchor; overlap, in run_overlap.c: swap the
 * previous round's stale delta for its average and pull back toward the
 * anchor; async: fold in the peers' inbox), and end (probe and evaluation).
 * Every phase says whether to go on; a stop request ends the run with
 * STOPPED, an error with FAILED and its reason.
 * On a device backend the model lives on the device during the steps and the
 * host works on its pinned copy (c->params, td_model_host_params): the steps
 * end with td_model_pull() (the round's result comes across once, the host
 * forms the delta from it) and whatever changed the host copy (outer step,
 * merge, reconciliation, a seed) ends with td_model_push(), an asynchronous
 * upload that the next evaluation or steps queue behind. On the CPU both are
 * no-ops and c->params is the model's own buffer.
 * Thread: the compute thread only (td__run_compute_main is its entry); it talks
 * to the loop only through run.c's mailbox and run->mu / run->cv. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/data/dataset.h"
#include "common/error.h"
#include "compute/data/shard.h"
#include "compute/data/text.h"
#include "compute/model.h"
#include "compute/safetensors.h"
#include "compute/scaffold.h"
#include "compute/trainer.h"
#include "daemon/base/clock.h"
#include "daemon/base/memtrim.h"
#include "daemon/run/run_compute.h"
#include "daemon/run/run_internal.h"
#include "scheduler/plan.h"
#include "scheduler/steps.h"

/* Weight of the newest round in the capacity (samples/s) EWMA. */
#define CAPACITY_RHO 0.3

/* ---- what the loop and peers hand over (a fetched model: run_transfer.c) ------------- */

/* Rows per step for `round`: the newest batch plan that has begun, else `current`. */
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

/* ---- setting up ------------------------------------------------------------------------ */

static double trainer_lr_at(const void *tr, unsigned long step) {
  return td_trainer_lr_at(tr, step);
}

/* Whether this node's rank is among the eval_nodes that evaluate every
 * eval_every rounds (0: all). */
static bool periodic_rank(const td_run_t *run) {
  unsigned k = run->spec.eval_nodes;
  return k == 0 || run->rank < k;
}

/* Whether this node evaluates after round `round` (every node after the last). */
static bool evaluates(const td_run_t *run, uint64_t round) {
  return round == run->rounds || (round % run->spec.eval_every == 0 && periodic_rank(run));
}

/* Periodic evaluations on a replica in a thread of their own (run_eval.c), so
 * training does not stop for them: on the CPU backend the run chose itself,
 * when this node evaluates before the last round and the evaluation set is not
 * the training set. Otherwise (a device, whose one stream the replica would
 * share; a backend handed in by the caller; the training rows, which training
 * shuffles; not enough memory for the replica) they run here between rounds. */
static void open_evaluator(td__compute_t *c, const td_trainer_opts_t *opts) {
  td_run_t *run = c->run;
  const td_runspec_t *sp = &run->spec;
  bool periodic = sp->eval_every < run->rounds && periodic_rank(run);
  /* an image run without a test set evaluates its training rows, which the
   * trainer shuffles in place at every epoch: not while it trains */
  bool own_set = c->text || c->test != NULL;
  if (!periodic || !own_set || run->open_backend != NULL || td_backend_device_memory(c->be))
    return;
  char why[TD__COMPUTE_WHY_MAX];
  td_backend_t *be = NULL;
  td_trainer_t *tr = NULL;
  int rc = td_backend_open(&be, "cpu", (int)sp->threads, why, sizeof why);
  if (rc == 0)
    rc = c->text ? td_trainer_open_text(&tr, be, td_text_data(c->data.text_train),
                                        td_text_bytes(c->data.text_train), opts, why, sizeof why)
                 : td_trainer_open(&tr, be, c->train, opts, why, sizeof why);
  const uint8_t *text = c->text ? td_text_data(c->data.text_valid) : NULL;
  size_t text_bytes = c->text ? td_text_bytes(c->data.text_valid) : 0;
  if (rc == 0)
    rc = td__run_eval_open(&c->eval, &be, &tr, c->eval_set, text, text_bytes, why, sizeof why);
  td_trainer_close(&tr);
  td_backend_close(&be);
  (void)rc; /* without the evaluator the run evaluates between rounds: nothing is lost */
}

/* Virtual clients: this node's clients over its rows (consecutive by
 * client, td_shard_t), and the run's clients that hold rows, which every
 * node samples from alike (td_run_sample_clients). */
static td__run_flow_t open_clients(td__compute_t *c) {
  td_run_t *run = c->run;
  const td_shard_t *d = &c->data;
  unsigned total = run->nodes * d->clients;
  if (td_clients_open(&c->clients, d->client_offsets, d->clients, run->rank * d->clients) != 0 ||
      (c->which = malloc(d->clients * sizeof *c->which)) == NULL ||
      (run->client_cand = malloc((size_t)total * sizeof *run->client_cand)) == NULL) {
    snprintf(c->why, sizeof c->why, "out of memory for %u clients", d->clients);
    return td__compute_fail(c);
  }
  run->n_cand = 0;
  for (unsigned k = 0; k < total; k++)
    if (d->client_rows[k] > 0)
      run->client_cand[run->n_cand++] = (uint16_t)k;
  run->n_clients = total;
  return TD__RUN_GO_ON;
}

/* Backend, data, trainer and round plan; the model starts identical on every
 * node (same seed), the anchor with it. Posts READY. */
static td__run_flow_t set_up(td__compute_t *c) {
  td_run_t *run = c->run;
  const td_runspec_t *sp = &run->spec;
  /* auto says why it chose: status shows it (and a GPU that was passed over) */
  int rc = run->open_backend != NULL
               ? run->open_backend(&c->be, (int)sp->threads, c->why, sizeof c->why)
               : td_backend_open_auto(&c->be, sp->backend, (int)sp->threads, c->why,
                                      sizeof c->why);
  if (rc != 0)
    return td__compute_fail(c);
  if (run->open_backend != NULL)
    snprintf(c->why, sizeof c->why, "%s (opened by the caller)", td_backend_describe(c->be));
  snprintf(c->backend_why, sizeof c->backend_why, "%.*s", (int)sizeof c->backend_why - 1, c->why);
  c->why[0] = '\0';
  td_shard_opts_t shard = {.dataset = td_runspec_dataset(sp), .partition = sp->partition,
                           .rank = run->rank, .nodes = run->nodes, .seed = sp->seed,
                           .client_eval = sp->client_eval, .clients = sp->clients};
  if (sp->clients > 1 && run->first_round > 1) {
    snprintf(c->why, sizeof c->why,
             "clients = %u: a node cannot join a run with virtual clients late (their "
             "partition is cut for the members that started it); start it with every node",
             sp->clients);
    return td__compute_fail(c);
  }
  /* images:DIR becomes what the model reads (input(C,H,W)) */
  td_image_shape_t *as = &shard.images_as;
  if (td_model_spec_input_shape(sp->model, &as->channels, &as->height, &as->width, c->why,
                                sizeof c->why) != 0 ||
      td_shard_open(&c->data, &shard, c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  c->train = c->data.train;
  c->test = c->data.test;
  c->text = c->data.text_train != NULL;
  if (sp->client_eval && c->data.heldout == NULL && c->data.client_heldout == NULL) {
    snprintf(c->why, sizeof c->why,
             "client_eval = true needs a labelled dataset with a test set (%s has none); "
             "set client_eval = false or name a test set",
             td_runspec_dataset(sp));
    return td__compute_fail(c);
  }
  if (sp->clients > 1 && open_clients(c) != TD__RUN_GO_ON)
    return TD__RUN_FAILED;
  /* every node's label counts, for the ledger (the loop reads them after READY) */
  run->label_counts = c->data.label_counts;
  run->label_nodes = c->data.count_nodes;
  run->label_classes = c->data.classes;
  c->data.label_counts = NULL;
  /* a text epoch is bytes / (batch x CONTEXT) steps: the plan counts windows */
  size_t samples = c->data.full_count;
  if (c->text)
    samples /= (size_t)td_model_context(run->probe);
  td_steps_opts_t plan = {.train_rows = samples, .batch = sp->batch, .epochs = sp->epochs,
                          .rounds = sp->rounds, .local_steps = sp->local_steps,
                          .qsr_alpha = sp->qsr_alpha, .warmup_steps = sp->warmup_steps,
                          .lr_at = trainer_lr_at};
  /* rounds from epochs, checked before anything is planned or built: the fixed-H
   * count, a bound under the QSR too (H_r >= H_base) */
  uint64_t bound = td_steps_round_count(&plan);
  if (run->max_rounds > 0 && bound > run->max_rounds) {
    snprintf(c->why, sizeof c->why,
             "epochs %u make %" PRIu64 " rounds, over this node's limit %" PRIu64 " (--max-rounds)",
             sp->epochs, bound, run->max_rounds);
    return td__compute_fail(c);
  }
  /* a run that keeps every checkpoint: now that its rounds are known */
  if (sp->rounds == 0 && sp->checkpoint_keep == 0 && run->max_checkpoint_bytes > 0 &&
      td_runspec_check_checkpoints(sp, bound, run->numel, run->max_checkpoint_bytes, c->why,
                                   sizeof c->why) != 0)
    return td__compute_fail(c);
  td_trainer_opts_t opts = {
      .model_spec = sp->model,
      .batch = run->local_batch,
      .max_batch = sp->batch,
      .seed = sp->seed,
      .lr = sp->lr,
      .lr_schedule = sp->lr_schedule,
      .warmup_steps = sp->warmup_steps,
      .epochs = 1,
      .total_steps = td_steps_lr_horizon(&plan),
  };
  td_runspec_optim_opts(sp, &opts.optim);
  rc = c->text ? td_trainer_open_text(&c->tr, c->be, td_text_data(c->data.text_train),
                                     td_text_bytes(c->data.text_train), &opts, c->why,
                                     sizeof c->why)
              : td_trainer_open(&c->tr, c->be, c->train, &opts, c->why, sizeof c->why);
  if (rc != 0 ||
      (c->test != NULL && td_trainer_check_dataset(c->tr, c->test, c->why, sizeof c->why) != 0))
    return td__compute_fail(c);
  if (c->text && td_text_check_window(c->data.text_valid, td_model_context(run->probe),
                                      "held-out text", c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  plan.lr_ctx = c->tr;
  rc = td_steps_plan(&plan, &run->rounds, &run->steps_of);
  if (rc != 0) {
    snprintf(c->why, sizeof c->why, "cannot plan the rounds: %s", td_strerror(rc));
    return td__compute_fail(c);
  }
  td_model_t *model = td_trainer_model(c->tr);
  if (td_model_numel(model) != run->numel) {
    snprintf(c->why, sizeof c->why, "model size changed between planning and training");
    return td__compute_fail(c);
  }
  c->params = td_model_host_params(model); /* the model's own buffer on the CPU */
  size_t clients = sp->clients > 1 ? sp->clients : 1; /* a ci per client */
  if (sp->scaffold && ((c->scaffold_ci = calloc(clients * run->numel, sizeof(float))) == NULL ||
                       (c->scaffold_corr = malloc(run->numel * sizeof(float))) == NULL)) {
    snprintf(c->why, sizeof c->why, "out of memory for SCAFFOLD's control variates (%zu x %zu "
             "floats)", clients, run->numel);
    return td__compute_fail(c);
  }
  if (sp->scaffold && c->clients != NULL)
    td_clients_set_scaffold(c->clients, run->scaffold_c, c->scaffold_ci, c->scaffold_corr);
  if (strcmp(sp->init, "none") != 0 &&
      td_model_load_safetensors(model, sp->init, sp->init_hash, c->why, sizeof c->why) != 0) {
    char why[sizeof c->why];
    snprintf(why, sizeof why, "init: %s", c->why);
    snprintf(c->why, sizeof c->why, "%s", why);
    return td__compute_fail(c);
  }
  memcpy(run->anchor, c->params, run->numel * sizeof(float));
  memcpy(run->start, c->params, run->numel * sizeof(float));
  if (run->init != NULL)
    memcpy(run->init, c->params, run->numel * sizeof(float));
  c->eval_set = c->test != NULL ? c->test : c->train;
  open_evaluator(c, &opts);
  if (sp->transfer > 0)
    td__compute_open_probe_rows(c);
  /* a node that evaluates only after its last round holds no test rows until then */
  if (c->test != NULL && c->eval == NULL && c->val == NULL &&
      !(periodic_rank(run) && sp->eval_every < run->rounds)) {
    td_shard_drop_test(&c->data);
    c->test = NULL;
    c->eval_set = NULL;
    c->test_dropped = true;
  }
  c->batch = run->local_batch;
  /* fragments: params hold local progress beyond the anchor after a round too */
  bool evaluates_anchor = sp->mode_kind == TD_MODE_OVERLAP || sp->fragments > 1;
  if ((sp->mode_kind == TD_MODE_OVERLAP &&
       (c->lead = calloc(run->numel, sizeof(float))) == NULL) ||
      (evaluates_anchor && c->eval == NULL &&
       (c->saved = malloc(run->numel * sizeof(float))) == NULL)) {
    snprintf(c->why, sizeof c->why, "out of memory for the overlap swap");
    return td__compute_fail(c);
  }
  td_run_event_t ready = {.kind = TD_RUN_READY, .round = run->rounds,
                          .samples = c->text ? 0 : td_dataset_rows(c->train)};
  snprintf(ready.backend, sizeof ready.backend, "%s", td_backend_name(c->be));
  snprintf(ready.message, sizeof ready.message, "%s", c->backend_why);
  return td__run_post(run, &ready) ? TD__RUN_GO_ON : TD__RUN_STOPPED;
}

/* A held run (td_run_go) waits after READY until the node that started
 * it has told the members. */
static td__run_flow_t wait_release(td__compute_t *c) {
  td_run_t *run = c->run;
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->held)
    pthread_cond_wait(&run->cv, &run->mu);
  bool stopped = run->stop;
  pthread_mutex_unlock(&run->mu);
  return stopped ? TD__RUN_STOPPED : TD__RUN_GO_ON;
}

/* Late join, joining side: wait for the members' model, start from it, and
 * put the learning-rate schedule where the others are at the first round. */
static td__run_flow_t wait_seed(td__compute_t *c) {
  td_run_t *run = c->run;
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->seed == NULL)
    pthread_cond_wait(&run->cv, &run->mu);
  bool stopped = run->stop;
  if (!stopped) {
    memcpy(run->anchor, run->seed, run->numel * sizeof(float));
    if (run->mom)
      memcpy(run->mom, run->seed + run->numel, run->mom_floats * sizeof(float));
  }
  pthread_mutex_unlock(&run->mu);
  if (stopped)
    return TD__RUN_STOPPED;
  memcpy(c->params, run->anchor, run->numel * sizeof(float));
  memcpy(run->start, c->params, run->numel * sizeof(float));
  td__run_flow_t f = td__compute_push(c);
  if (f != TD__RUN_GO_ON)
    return f;
  if (run->scaffold_c != NULL) /* a new client with ci = c keeps c the mean of all ci */
    memcpy(c->scaffold_ci, run->scaffold_c, run->numel * sizeof(float));
  /* the optimizer state is local and never travels: a joiner starts it from
   * zero on the members' model (compute/optim.h) */
  if (td_trainer_reset_optim(c->tr) != 0) {
    snprintf(c->why, sizeof c->why, "out of memory resetting the optimizer");
    return td__compute_fail(c);
  }
  unsigned long step = 0;
  for (uint64_t r = 1; r < run->first_round && r <= run->rounds; r++)
    step += td_run_steps_of(run, r);
  td_trainer_seek(c->tr, step);
  return TD__RUN_GO_ON;
}

/* ---- the phases of a round --------------------------------------------------------------- */

/* Before the steps: async waits when it would run too far ahead; then what
 * other threads handed over is folded in, and the round's batch set. */
static td__run_flow_t round_begin(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  if (td__run_stopping(run))
    return TD__RUN_STOPPED;
  unsigned ahead = run->spec.max_staleness + 1;
  if (run->spec.mode_kind == TD_MODE_ASYNC && round > ahead &&
      td__compute_wait_release(c, round - ahead) != TD__RUN_GO_ON)
    return TD__RUN_STOPPED;
  td_backend_synchronize(c->be); /* the last push is done with the host copy */
  td__run_flow_t f = TD__RUN_GO_ON;
  bool changed = td__compute_apply_merge(c, &f);
  if (f != TD__RUN_GO_ON)
    return f;
  changed |= td__run_apply_reconciled(run, c->params) > 0;
  f = changed ? td__compute_push(c) : TD__RUN_GO_ON;
  if (f != TD__RUN_GO_ON)
    return f;
  c->batch = batch_for(run, round, c->batch);
  td_trainer_set_batch(c->tr, c->batch);
  /* linear scaling below the even share: per-sample steps stay the same */
  double even = (double)run->spec.batch / td__run_nodes_at(run, round);
  td_trainer_set_lr_scale(c->tr, c->batch < even ? c->batch / even : 1);
  return TD__RUN_GO_ON;
}

/* The round's local steps, slowed down when asked; the last wait's fill steps
 * count as this round's progress too. The capacity (samples/s) is measured on
 * the backend the run trains on, once its queued work is done. A device pays
 * one-time costs in its first step (lazy kernel loading, library workspaces,
 * first allocations), so on a device the run's first step is taken untimed
 * and left out of the measure: a GPU node reports its real rate from its first
 * round, and weighted batching gives it its share at once. The steps are the
 * same either way (one call of n steps or 1 + (n - 1)). */
static td__run_flow_t round_steps_clients(td__compute_t *c, uint64_t round,
                                          td_train_stats_t *st, double *compute_s);

static td__run_flow_t round_steps(td__compute_t *c, uint64_t round, td_train_stats_t *st,
                                  double *compute_s) {
  td_run_t *run = c->run;
  unsigned long n = td_run_steps_of(run, round);
  if (c->clients != NULL)
    return round_steps_clients(c, round, st, compute_s);
  unsigned long step0 = td_trainer_global_step(c->tr);
  if (run->spec.scaffold) /* every node alike (batching = equal): the c update needs it */
    run->scaffold_lr_sum[round % 2] = td_trainer_lr_sum(c->tr, step0, n);
  if (run->rank >= 64 || !(td__run_sample_of(&run->spec, round, td__run_nodes_at(run, round)) >>
                           run->rank & 1)) {
    /* client sampling: not this round's; no steps, an empty update (no
     * samples, so no weight), and the schedule keeps pace with the others */
    td_trainer_seek(c->tr, td_trainer_global_step(c->tr) + n);
    *st = (td_train_stats_t){.lr = td_trainer_lr_at(c->tr, td_trainer_global_step(c->tr))};
    *compute_s = 0;
    return TD__RUN_GO_ON;
  }
  td_train_stats_t first = {0};
  if (!c->warm && n > 1 && td_backend_device_memory(c->be)) {
    if (td_trainer_steps(c->tr, 1, &first, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
    td_backend_synchronize(c->be);
    n--;
  }
  c->warm = true;
  if (run->spec.prox_mu > 0) { /* FedProx pulls toward the model the delta is taken from */
    const float *x = run->spec.mode_kind == TD_MODE_SYNC ? run->anchor : run->start;
    if (td_trainer_set_prox(c->tr, run->spec.prox_mu, x, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
  }
  if (run->spec.scaffold) { /* g - ci + c (sync: x is the anchor) */
    td_scaffold_correction(c->scaffold_corr, run->scaffold_c, c->scaffold_ci, run->numel);
    if (td_trainer_set_correction(c->tr, c->scaffold_corr, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
  }
  c->swap_step = (unsigned)td_run_steps_of(run, round);
  double t0 = td_clock_mono_s(), cpu0 = td_backend_cpu_seconds(c->be);
  if (td__compute_swaps_early(c, round)) {
    td__run_flow_t f = td__compute_steps_swapping(c, round, n, (unsigned)first.steps, st);
    if (f != TD__RUN_GO_ON)
      return f;
  } else {
    if (td_trainer_steps(c->tr, n, st, c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
    td_backend_synchronize(c->be);
    td__compute_slow_down_round(c, t0, cpu0, round);
  }
  *compute_s = td_clock_mono_s() - t0;
  if (*compute_s > 0)
    c->capacity = td_plan_ewma(c->capacity, (double)st->samples / *compute_s, CAPACITY_RHO);
  if (first.samples > 0) { /* the untimed warm-up step is part of the round all the same */
    st->loss = (st->loss * (double)st->samples + first.loss * (double)first.samples) /
               (double)(st->samples + first.samples);
    st->samples += first.samples;
    st->steps += first.steps;
    *compute_s += first.seconds;
  }
  if (c->fill.samples > 0) {
    st->loss = (st->loss * (double)st->samples + c->fill.loss_sum) /
               (double)(st->samples + c->fill.samples);
    st->samples += c->fill.samples;
  }
  td__run_flow_t f = td__compute_pull(c); /* the round's result, for its delta */
  if (f == TD__RUN_GO_ON && run->spec.scaffold) /* option II: ci += -c + (x - y) / Σlr */
    td_scaffold_client_update(c->scaffold_ci, run->scaffold_c, run->anchor, c->params,
                              run->scaffold_lr_sum[round % 2], run->numel);
  return f;
}

/* Virtual clients (sync only): this node's sampled clients that hold rows
 * train one after another from the anchor (compute/clients.h), their
 * weighted mean straight into the round's delta slot. A node with none of
 * them in the sample does what an unsampled node does: no steps, an empty
 * update, the schedule kept in pace. */
static td__run_flow_t round_steps_clients(td__compute_t *c, uint64_t round,
                                          td_train_stats_t *st, double *compute_s) {
  td_run_t *run = c->run;
  unsigned long n = td_run_steps_of(run, round), step = td_trainer_global_step(c->tr);
  uint64_t set[TD_SAMPLE_SET_WORDS];
  td_run_sample_clients(run, round, set);
  unsigned k = td_clients_count(c->clients), m = 0;
  for (unsigned j = 0; j < k; j++) {
    unsigned id = run->rank * k + j;
    if ((set[id / 64] >> (id % 64) & 1) && td_clients_rows(c->clients, j) > 0)
      c->which[m++] = j;
  }
  *compute_s = 0;
  if (run->spec.scaffold) /* every node alike (batching = equal): the c update needs it */
    run->scaffold_lr_sum[round % 2] = td_trainer_lr_sum(c->tr, step, n);
  if (m == 0) {
    td_trainer_seek(c->tr, step + n);
    *st = (td_train_stats_t){.lr = td_trainer_lr_at(c->tr, td_trainer_global_step(c->tr))};
    return TD__RUN_GO_ON;
  }
  if (run->spec.prox_mu > 0 &&
      td_trainer_set_prox(c->tr, run->spec.prox_mu, run->anchor, c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  c->swap_step = (unsigned)n;
  c->warm = true;
  double t0 = td_clock_mono_s(), cpu0 = td_backend_cpu_seconds(c->be);
  if (td_clients_train(c->clients, c->tr, c->which, m, run->anchor, step, n,
                       run->delta[round % 2], st, c->why, sizeof c->why) != 0)
    return td__compute_fail(c);
  td_backend_synchronize(c->be);
  td__compute_slow_down_round(c, t0, cpu0, round);
  *compute_s = td_clock_mono_s() - t0;
  if (*compute_s > 0)
    c->capacity = td_plan_ewma(c->capacity, (double)st->samples / *compute_s, CAPACITY_RHO);
  c->delta_ready = true;
  return TD__RUN_GO_ON;
}

/* The round's delta (from the anchor in sync, the round start otherwise) into
 * its slot, and ROUND_DONE. */
static td__run_flow_t round_post_delta(td__compute_t *c, uint64_t round, const td_train_stats_t *st,
                                       double compute_s) {
  td_run_t *run = c->run;
  float *delta = run->delta[round % 2];
  const float *base = run->spec.mode_kind == TD_MODE_SYNC ? run->anchor : run->start;
  if (c->delta_ready) /* the clients' weighted mean (clients.c) is in place */
    ;
  else if (run->spec.fragments > 1)
    td__compute_fragment_delta(run, round, c->params);
  else
    for (size_t i = 0; i < run->numel; i++)
      delta[i] = c->params[i] - base[i];
  if (c->delta_ready && run->mixes) /* the clients' mean moved the anchor: a model again */
    for (size_t i = 0; i < run->numel; i++)
      delta[i] += run->anchor[i];
  else if (run->mixes) /* gossip, groups: the message is the model itself */
    memcpy(delta, c->params, run->numel * sizeof(float));
  c->delta_ready = false;
  td_run_event_t ev = {.kind = TD_RUN_ROUND_DONE, .round = round, .samples = st->samples,
                       .loss = st->loss, .compute_s = compute_s, .idle_s = c->idle,
                       .capacity = c->capacity, .batch = c->batch,
                       .steps = td_run_steps_of(run, round), .fill_steps = c->fill.steps,
                       .fill_s = c->fill.seconds, .lr = st->lr,
                       .fresh = c->lead != NULL && round > run->first_round &&
                                c->applied + 1 == round && c->early != round,
                       .swap_step = c->swap_step};
  c->posted_at[round % 2] = td_clock_mono_s();
  c->compute_s = compute_s;
  c->idle = 0;
  c->fill = (td__compute_fill_t){0};
  return td__run_post(run, &ev) ? TD__RUN_GO_ON : TD__RUN_STOPPED;
}

/* async: own progress counts with its sample share; the peers' deltas that
 * arrived in the inbox are added; the result is the next round's start. */
static td__run_flow_t after_round_async(td__compute_t *c, uint64_t round,
                                        const td_train_stats_t *st) {
  td_run_t *run = c->run;
  double share = (double)st->samples / ((double)run->spec.batch * td_run_steps_of(run, round));
  float keep = (float)(share < 1 ? share : 1);
  const float *delta = run->delta[round % 2];
  pthread_mutex_lock(&run->mu);
  for (size_t i = 0; i < run->numel; i++) {
    c->params[i] += (keep - 1.0f) * delta[i] + run->inbox[i];
    run->inbox[i] = 0;
  }
  pthread_mutex_unlock(&run->mu);
  memcpy(run->start, c->params, run->numel * sizeof(float));
  return td__compute_post_checkpoint(run, round);
}

/* Post an evaluation of `round` (FINISHED after the last round). */
static td__run_flow_t post_eval(td__compute_t *c, uint64_t round, double loss, double acc,
                                double bpb) {
  td_run_event_t ev = {.kind = round == c->run->rounds ? TD_RUN_FINISHED : TD_RUN_EVAL,
                       .round = round, .loss = loss, .accuracy = acc, .bpb = bpb};
  return td__run_post(c->run, &ev) ? TD__RUN_GO_ON : TD__RUN_STOPPED;
}

/* The evaluator's finished result, if there is one, posted; `wait`: wait for
 * the one running first. An evaluation that failed fails the run, as here. */
static td__run_flow_t collect_eval(td__compute_t *c, bool wait) {
  if (c->eval == NULL)
    return TD__RUN_GO_ON;
  if (wait)
    td__run_eval_wait(c->eval, &c->idle, td_clock_mono_s);
  td__run_eval_result_t r;
  if (!td__run_eval_take(c->eval, &r))
    return TD__RUN_GO_ON;
  if (r.rc != 0) {
    snprintf(c->why, sizeof c->why, "%s", r.why);
    return td__compute_fail(c);
  }
  return post_eval(c, r.round, r.loss, r.accuracy, r.bpb);
}

/* Whether the evaluation of `round` measures the anchor rather than params:
 * in overlap mode before the last round, params hold this node's own
 * progress not yet averaged (the delayed swap, scheduler/overlap.h) on top of
 * the members' consensus, the anchor; what the cluster has trained is that
 * consensus, as DiLoCo evaluates its global model, not a worker's. In sync
 * mode params are the anchor after a round, in async there is no consensus,
 * and after the last round params are the consensus in every mode. With
 * fragments (scheduler/fragment.h) params keep local progress on the other
 * slices after a sync round too: the anchor is measured in both modes. */
static bool consensus(const td__compute_t *c, uint64_t round) {
  return (c->lead != NULL || c->run->spec.fragments > 1) && round < c->run->rounds;
}

/* After the round: the transfer probe, and the evaluation every eval_every
 * rounds (on the nodes eval_nodes names) and after the last (FINISHED). A
 * periodic one goes to the evaluator when there is one; the last one is
 * taken here, after the evaluator's, so FINISHED is the last event. */
static td__run_flow_t round_end(td__compute_t *c, uint64_t round) {
  td_run_t *run = c->run;
  td__run_flow_t f = TD__RUN_GO_ON;
  bool probes = c->val != NULL || c->probe_bytes > 0;
  if (probes && round % run->spec.transfer == 0 && round < run->rounds &&
      (f = td__compute_post_probe(c, round)) != TD__RUN_GO_ON)
    return f;
  if ((f = td__compute_client_eval(c, round, consensus(c, round))) != TD__RUN_GO_ON)
    return f;
  bool last = round == run->rounds;
  if ((f = collect_eval(c, last)) != TD__RUN_GO_ON || !evaluates(run, round))
    return f;
  if (c->eval != NULL && !last) {
    if ((f = collect_eval(c, true)) != TD__RUN_GO_ON) /* one at a time, none dropped */
      return f;
    td__run_eval_submit(c->eval, round, consensus(c, round) ? run->anchor : c->params);
    return TD__RUN_GO_ON;
  }
  double loss = NAN, acc = NAN, bpb = NAN;
  if (c->test_dropped) { /* the test rows, read again for the last evaluation */
    if (td_shard_reload_test(&c->data, td_runspec_dataset(&run->spec), c->why, sizeof c->why) != 0)
      return td__compute_fail(c);
    c->test = c->data.test;
    c->eval_set = c->test != NULL ? c->test : c->train;
    c->test_dropped = false;
  }
  if (consensus(c, round)) { /* the anchor in the model for the evaluation, then back */
    td_backend_synchronize(c->be); /* the last push is done with the host copy */
    memcpy(c->saved, c->params, run->numel * sizeof(float));
    memcpy(c->params, run->anchor, run->numel * sizeof(float));
    if ((f = td__compute_push(c)) != TD__RUN_GO_ON)
      return f;
  }
  int rc = c->text ? td_trainer_evaluate_text(c->tr, td_text_data(c->data.text_valid),
                                              td_text_bytes(c->data.text_valid), &bpb, c->why,
                                              sizeof c->why)
                   : td_trainer_evaluate(c->tr, c->eval_set, &loss, &acc, c->why, sizeof c->why);
  if (rc != 0)
    return td__compute_fail(c);
  if (consensus(c, round)) {
    td_backend_synchronize(c->be);
    memcpy(c->params, c->saved, run->numel * sizeof(float));
    if ((f = td__compute_push(c)) != TD__RUN_GO_ON)
      return f;
  }
  if (c->text)
    loss = bpb * log(2.0); /* mean cross-entropy in nats, like the classes' test loss */
  return post_eval(c, round, loss, acc, bpb);
}

static td__run_flow_t run_round(td__compute_t *c, uint64_t round) {
  td_train_stats_t st = {0};
  double compute_s = 0;
  td__run_flow_t f = round_begin(c, round);
  if (f == TD__RUN_GO_ON)
    f = round_steps(c, round, &st, &compute_s);
  if (f == TD__RUN_GO_ON)
    f = round_post_delta(c, round, &st, compute_s);
  if (f == TD__RUN_GO_ON) {
    if (c->run->spec.fragments > 1) { /* sync or overlap (runspec.c refuses async) */
      f = td__compute_after_round_fragments(c, round);
    } else {
      switch (c->run->spec.mode_kind) {
      case TD_MODE_SYNC: f = td__compute_after_round_sync(c, round); break;
      case TD_MODE_OVERLAP: f = td__compute_after_round_overlap(c, round); break;
      case TD_MODE_ASYNC: f = after_round_async(c, round, &st); break;
      }
    }
  }
  if (f == TD__RUN_GO_ON)
    f = td__compute_push(c); /* the host copy changed: the evaluation and next steps use it */
  if (f == TD__RUN_GO_ON && round == c->run->rounds && c->run->keep_model) { /* its model */
    td_run_event_t ev = {.kind = TD_RUN_MODEL, .round = round};
    f = td__run_post_copy(c->run, &ev, "the final model", c->params, c->run->numel, NULL, 0);
  }
  if (f == TD__RUN_GO_ON)
    f = round_end(c, round);
  return f;
}

void *td__run_compute_main(void *arg) {
  td__compute_t c = {.run = arg};
  td_run_t *run = c.run;
  td__run_flow_t f = set_up(&c);
  td_memtrim_now(); /* the loaders' scratch, freed, before training allocates */
  if (f == TD__RUN_GO_ON)
    f = wait_release(&c);
  if (f == TD__RUN_GO_ON && run->first_round > 1)
    f = wait_seed(&c);
  uint64_t applied = 0; /* the last round whose outer step the anchor holds */
  for (uint64_t round = run->first_round; f == TD__RUN_GO_ON && round <= run->rounds; round++)
    if ((f = run_round(&c, round)) == TD__RUN_GO_ON)
      applied = round;
  td__run_eval_close(&c.eval); /* before STOPPED: nothing of the run outlives it */
  if (f == TD__RUN_STOPPED && applied > 0 && run->keep_model) { /* not after a failure */
    const float *model = run->spec.mode_kind == TD_MODE_ASYNC ? run->start : run->anchor;
    td_run_event_t ev = {.kind = TD_RUN_MODEL, .round = applied};
    td__run_post_copy(run, &ev, "the last model", model, run->numel, NULL, 0);
  }
  if (f == TD__RUN_STOPPED) {
    td_run_event_t ev = {.kind = TD_RUN_STOPPED};
    td__run_post(run, &ev); /* fails only when closing: nobody to tell */
  }
  free(c.lead);
  free(c.saved);
  free(c.which);
  free(c.scaffold_ci);
  free(c.scaffold_corr);
  td_clients_close(&c.clients);
  td_dataset_close(&c.val);
  td_trainer_close(&c.tr);
  td_shard_close(&c.data);
  td_backend_close(&c.be);
  return NULL;
}
