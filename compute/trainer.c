/* trainer.c: the local SGD loop over a shuffled in-memory partition.
 *
 * The training set is permuted in place at the start of every epoch with a
 * stream derived from (seed, epoch), so the order is reproducible and a batch
 * is a contiguous slice of the feature array. Timing covers compute only. */
#include "compute/trainer.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "compute/error.h"

struct td_trainer {
  td_backend_t *be;
  td_dataset_t *train;
  td_model_t *model;
  td_sgd_t *sgd;
  td_lr_schedule_t schedule;
  unsigned batch, max_batch;
  double lr_scale; /* multiplies the schedule (1 unless set) */
  uint64_t seed;
  unsigned long step;  /* global step */
  unsigned long epoch; /* epochs started */
  size_t cursor;       /* next row in the current epoch */
  size_t rows;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int td_trainer_check_dataset(const td_trainer_t *tr, const td_dataset_t *ds, char *why,
                             size_t why_len) {
  int in = td_model_input_dim(tr->model), out = td_model_classes(tr->model);
  if (td_dataset_dim(ds) != (size_t)in)
    return td_why(why, why_len, TD_ESHAPE,
                  "dataset has %zu features per sample but the model's input width is %d",
                  td_dataset_dim(ds), in);
  if (td_dataset_classes(ds) > out)
    return td_why(why, why_len, TD_ESHAPE,
                  "dataset has %d classes but the model has only %d outputs",
                  td_dataset_classes(ds), out);
  return 0;
}

int td_trainer_open(td_trainer_t **out, td_backend_t *be, td_dataset_t *train,
                    const td_trainer_opts_t *opts, char *why, size_t why_len) {
  int rc;
  *out = NULL;
  if (opts->batch == 0 || opts->batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %u out of range [1, %d]", opts->batch,
                  TD_MODEL_MAX_BATCH);
  if (td_dataset_rows(train) == 0)
    return td_why(why, why_len, TD_ECONFIG, "the training partition is empty");
  td_trainer_t *tr = calloc(1, sizeof *tr);
  if (tr == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  tr->be = be;
  tr->train = train;
  tr->rows = td_dataset_rows(train);
  tr->batch = opts->batch < tr->rows ? opts->batch : (unsigned)tr->rows;
  unsigned mb = opts->max_batch > opts->batch ? opts->max_batch : opts->batch;
  if (mb > TD_MODEL_MAX_BATCH)
    mb = TD_MODEL_MAX_BATCH;
  tr->max_batch = mb < tr->rows ? mb : (unsigned)tr->rows;
  tr->seed = opts->seed;
  tr->lr_scale = 1;
  rc = td_model_open(&tr->model, opts->model_spec, be, (int)tr->max_batch, why, why_len);
  if (rc != 0)
    goto fail;
  rc = td_trainer_check_dataset(tr, train, why, why_len);
  if (rc != 0)
    goto fail;
  td_model_init(tr->model, opts->seed);
  rc = td_sgd_open(&tr->sgd, be, td_model_numel(tr->model), &opts->sgd);
  if (rc != 0) {
    td_why(why, why_len, rc, "cannot create the optimizer: %s", td_strerror(rc));
    goto fail;
  }
  unsigned long spe = td_trainer_steps_per_epoch(tr);
  rc = td_lr_schedule_parse(&tr->schedule, opts->lr_schedule, opts->lr, opts->warmup_steps, spe,
                            opts->total_steps ? opts->total_steps
                                                 : spe * (opts->epochs ? opts->epochs : 1),
                            why, why_len);
  if (rc != 0)
    goto fail;
  tr->cursor = tr->rows; /* forces the first epoch's shuffle */
  *out = tr;
  return 0;
fail:
  td_trainer_close(&tr);
  return rc;
}

void td_trainer_close(td_trainer_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_trainer_t *tr = *self_p;
  td_sgd_close(&tr->sgd);
  td_model_close(&tr->model);
  free(tr);
  *self_p = NULL;
}

int td_trainer_set_batch(td_trainer_t *tr, unsigned batch) {
  if (batch == 0)
    return TD_EINVAL;
  if (batch > tr->rows)
    batch = (unsigned)tr->rows;
  if (batch > tr->max_batch)
    return TD_EINVAL;
  tr->batch = batch;
  return 0;
}

unsigned td_trainer_batch(const td_trainer_t *tr) { return tr->batch; }

void td_trainer_set_lr_scale(td_trainer_t *tr, double scale) {
  tr->lr_scale = isfinite(scale) && scale > 0 ? scale : 1;
}

double td_trainer_lr_at(const td_trainer_t *tr, unsigned long step) {
  return td_lr_at(&tr->schedule, step);
}

unsigned long td_trainer_steps_per_epoch(const td_trainer_t *tr) {
  return (unsigned long)((tr->rows + tr->batch - 1) / tr->batch);
}

static int run_steps(td_trainer_t *tr, unsigned long n, bool advance, td_train_stats_t *stats,
                     char *why, size_t why_len) {
  size_t dim = td_dataset_dim(tr->train);
  double loss_sum = 0, t0 = now_s();
  unsigned long correct = 0, samples = 0;
  double lr = 0;
  for (unsigned long i = 0; i < n; i++) {
    if (tr->cursor >= tr->rows) {
      td_rng_t rng;
      td_rng_seed2(&rng, tr->seed, 0x5348554646ull + tr->epoch); /* "SHUFF" + epoch */
      td_dataset_shuffle(tr->train, &rng);
      tr->cursor = 0;
      tr->epoch++;
    }
    size_t rows = tr->rows - tr->cursor < tr->batch ? tr->rows - tr->cursor : tr->batch;
    const float *x = td_dataset_features(tr->train) + tr->cursor * dim;
    const int32_t *y = td_dataset_labels(tr->train) + tr->cursor;
    double loss;
    int hits;
    int rc = td_model_train_batch(tr->model, x, y, (int)rows, &loss, &hits);
    if (rc != 0)
      return td_why(why, why_len, rc,
                    rc == TD_ENUMERIC ? "training diverged: the loss is not finite at step %lu "
                                        "(learning rate too high?)"
                                      : "training step %lu failed",
                    tr->step + 1);
    lr = td_lr_at(&tr->schedule, tr->step) * tr->lr_scale;
    td_sgd_step(tr->sgd, td_model_params(tr->model), td_model_grads(tr->model), lr);
    tr->cursor += rows;
    tr->step += advance;
    loss_sum += loss * (double)rows;
    correct += (unsigned long)hits;
    samples += rows;
  }
  if (stats != NULL) {
    stats->steps = n;
    stats->samples = samples;
    stats->loss = samples ? loss_sum / (double)samples : 0;
    stats->accuracy = samples ? (double)correct / (double)samples : 0;
    stats->seconds = now_s() - t0;
    stats->lr = lr;
  }
  return 0;
}

int td_trainer_steps(td_trainer_t *tr, unsigned long n, td_train_stats_t *stats, char *why,
                     size_t why_len) {
  return run_steps(tr, n, true, stats, why, why_len);
}

int td_trainer_fill_steps(td_trainer_t *tr, unsigned long n, td_train_stats_t *stats, char *why,
                          size_t why_len) {
  return run_steps(tr, n, false, stats, why, why_len);
}

int td_trainer_evaluate(td_trainer_t *tr, const td_dataset_t *ds, double *loss,
                        double *accuracy, char *why, size_t why_len) {
  int rc = td_trainer_check_dataset(tr, ds, why, why_len);
  if (rc != 0)
    return rc;
  size_t rows = td_dataset_rows(ds), dim = td_dataset_dim(ds);
  size_t chunk = (size_t)td_model_max_batch(tr->model);
  double loss_sum = 0;
  int correct_total = 0;
  for (size_t r = 0; r < rows; r += chunk) {
    size_t n = rows - r < chunk ? rows - r : chunk;
    int hits = 0;
    rc = td_model_eval_batch(tr->model, td_dataset_features_const(ds) + r * dim,
                             td_dataset_labels_const(ds) + r, (int)n, &loss_sum, &hits);
    if (rc != 0)
      return td_why(why, why_len, rc, "evaluation failed: %s", td_strerror(rc));
    correct_total += hits;
  }
  *loss = rows ? loss_sum / (double)rows : 0;
  *accuracy = rows ? (double)correct_total / (double)rows : 0;
  if (!isfinite(*loss))
    return td_why(why, why_len, TD_ENUMERIC, "evaluation loss is not finite");
  return 0;
}

td_model_t *td_trainer_model(td_trainer_t *tr) { return tr->model; }
unsigned long td_trainer_global_step(const td_trainer_t *tr) { return tr->step; }

void td_trainer_seek(td_trainer_t *tr, unsigned long step) { tr->step = step; }
