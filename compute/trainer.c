/* trainer.c: the local training loop (td_optim_t: SGD or AdamW) over a
 * shuffled in-memory partition or a byte range of text.
 *
 * Feature data: the training set is permuted in place at the start of every
 * epoch with a stream derived from (seed, epoch), so the order is reproducible
 * and a batch is a contiguous slice of the feature array (a dataset held as
 * bytes, compute/data/dataset.h, converts that slice into a batch-sized
 * buffer, the floats unchanged). Text (token models):
 * every step draws `batch` windows of CONTEXT+1 bytes at offsets from a stream
 * derived from the seed, into token/target buffers sized at open; an epoch is
 * bytes / (batch * CONTEXT) steps, so each byte is seen about once. Timing
 * covers compute only. On a device backend the model uploads each batch and
 * keeps parameters, gradients and optimizer state on the device; a device
 * failure (kept by the backend) fails the steps or the evaluation with its
 * message. */
#include "compute/trainer.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/error.h"
#include "compute/data/text.h"

struct td_trainer {
  td_backend_t *be;
  td_dataset_t *train;
  td_model_t *model;
  td_optim_t *optim;
  td_lr_schedule_t schedule;
  unsigned batch, max_batch;
  double lr_scale; /* multiplies the schedule (1 unless set) */
  uint64_t seed;
  unsigned long step;  /* global step */
  unsigned long epoch; /* epochs started */
  size_t cursor;       /* next row in the current epoch */
  size_t rows;
  const uint8_t *text; /* token models: the byte range windows are drawn from */
  size_t text_bytes;
  int32_t *tokens, *targets; /* max_batch x context each */
  td_rng_t text_rng;
  float prox_mu;       /* FedProx: > 0 adds prox_mu (w - prox_center) to each gradient */
  float *prox_center;  /* backend memory, numel floats (NULL until the first set_prox) */
  td_trainer_rows_t *bound; /* a virtual client's walk, or NULL: the whole set */
  const float *correction;  /* SCAFFOLD: host floats added to each gradient, or NULL */
  float *rows_scratch;      /* a byte dataset's rows as floats: rows_capacity x dim */
  size_t rows_capacity;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int td_trainer_check_dataset(const td_trainer_t *tr, const td_dataset_t *ds, char *why,
                             size_t why_len) {
  int in = td_model_input_dim(tr->model), out = td_model_classes(tr->model);
  if (td_model_input_kind(tr->model) != TD_INPUT_FEATURES)
    return td_why(why, why_len, TD_ESHAPE,
                  "the model reads byte tokens (a text dataset, text:PATH) but the dataset has "
                  "%zu float features per sample",
                  td_dataset_dim(ds));
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

/* Everything but the data: model, init, optimizer, schedule. */
static int open_common(td_trainer_t *tr, td_backend_t *be, const td_trainer_opts_t *opts,
                       char *why, size_t why_len) {
  tr->be = be;
  tr->seed = opts->seed;
  tr->lr_scale = 1;
  int rc = td_model_open(&tr->model, opts->model_spec, be, (int)tr->max_batch, why, why_len);
  if (rc != 0)
    return rc;
  if (tr->text != NULL) {
    if (td_model_input_kind(tr->model) != TD_INPUT_TOKENS)
      return td_why(why, why_len, TD_ESHAPE,
                    "the model '%s' reads float features (an image or CSV dataset) but the "
                    "dataset is text",
                    opts->model_spec);
    int context = td_model_context(tr->model);
    if (tr->text_bytes < (size_t)context + 1)
      return td_why(why, why_len, TD_ESHAPE,
                    "the text has %zu bytes, fewer than one window of context %d + 1",
                    tr->text_bytes, context);
    size_t n = (size_t)tr->max_batch * (size_t)context;
    tr->tokens = malloc(n * sizeof *tr->tokens);
    tr->targets = malloc(n * sizeof *tr->targets);
    if (tr->tokens == NULL || tr->targets == NULL)
      return td_why(why, why_len, TD_ENOMEM, "out of memory");
    td_rng_seed2(&tr->text_rng, opts->seed, 0x54455854ull); /* "TEXT" */
  } else {
    rc = td_trainer_check_dataset(tr, tr->train, why, why_len);
    if (rc != 0)
      return rc;
  }
  td_model_init(tr->model, opts->seed);
  rc = td_optim_open(&tr->optim, be, td_model_numel(tr->model), &opts->optim, why, why_len);
  if (rc != 0)
    return rc; /* why says which option or what ran out */
  unsigned long spe = td_trainer_steps_per_epoch(tr);
  rc = td_lr_schedule_parse(&tr->schedule, opts->lr_schedule, opts->lr, opts->warmup_steps, spe,
                            opts->total_steps ? opts->total_steps
                                                 : spe * (opts->epochs ? opts->epochs : 1),
                            why, why_len);
  if (rc != 0)
    return rc;
  tr->cursor = tr->rows; /* forces the first epoch's shuffle */
  return 0;
}

static unsigned clamp_batch(unsigned want, size_t rows) {
  if (want > TD_MODEL_MAX_BATCH)
    want = TD_MODEL_MAX_BATCH;
  return want < rows ? want : (unsigned)rows;
}

int td_trainer_open(td_trainer_t **out, td_backend_t *be, td_dataset_t *train,
                    const td_trainer_opts_t *opts, char *why, size_t why_len) {
  *out = NULL;
  if (opts->batch == 0 || opts->batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %u out of range [1, %d]", opts->batch,
                  TD_MODEL_MAX_BATCH);
  if (td_dataset_rows(train) == 0)
    return td_why(why, why_len, TD_ECONFIG, "the training partition is empty");
  td_trainer_t *tr = calloc(1, sizeof *tr);
  if (tr == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  tr->train = train;
  tr->rows = td_dataset_rows(train);
  tr->batch = clamp_batch(opts->batch, tr->rows);
  tr->max_batch =
      clamp_batch(opts->max_batch > opts->batch ? opts->max_batch : opts->batch, tr->rows);
  int rc = open_common(tr, be, opts, why, why_len);
  if (rc != 0) {
    td_trainer_close(&tr);
    return rc;
  }
  *out = tr;
  return 0;
}

int td_trainer_open_text(td_trainer_t **out, td_backend_t *be, const uint8_t *data,
                         size_t bytes, const td_trainer_opts_t *opts, char *why,
                         size_t why_len) {
  *out = NULL;
  if (opts->batch == 0 || opts->batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %u out of range [1, %d]", opts->batch,
                  TD_MODEL_MAX_BATCH);
  if (data == NULL || bytes == 0)
    return td_why(why, why_len, TD_ECONFIG, "the training text is empty");
  td_trainer_t *tr = calloc(1, sizeof *tr);
  if (tr == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  tr->text = data;
  tr->text_bytes = bytes;
  tr->rows = SIZE_MAX; /* windows never run out */
  tr->batch = opts->batch;
  tr->max_batch = clamp_batch(opts->max_batch > opts->batch ? opts->max_batch : opts->batch,
                              SIZE_MAX);
  int rc = open_common(tr, be, opts, why, why_len);
  if (rc != 0) {
    td_trainer_close(&tr);
    return rc;
  }
  *out = tr;
  return 0;
}

void td_trainer_close(td_trainer_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_trainer_t *tr = *self_p;
  if (tr->prox_center != NULL)
    td_backend_free(tr->be, tr->prox_center);
  td_optim_close(&tr->optim);
  td_model_close(&tr->model);
  free(tr->tokens);
  free(tr->targets);
  free(tr->rows_scratch);
  free(tr);
  *self_p = NULL;
}

int td_trainer_set_prox(td_trainer_t *tr, double mu, const float *center, char *why,
                        size_t why_len) {
  if (!(mu > 0)) {
    tr->prox_mu = 0;
    return 0;
  }
  if (!td_backend_supports_prox(tr->be))
    return td_why(why, why_len, TD_ECONFIG,
                  "prox_mu: the %s backend has no proximal-term kernel; use backend = cpu or "
                  "prox_mu = 0",
                  td_backend_name(tr->be));
  size_t bytes = td_model_numel(tr->model) * sizeof(float);
  if (tr->prox_center == NULL && (tr->prox_center = td_backend_alloc(tr->be, bytes)) == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory for FedProx's centre");
  int rc = td_backend_upload(tr->be, tr->prox_center, center, bytes);
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot copy FedProx's centre to the device");
  tr->prox_mu = (float)mu;
  return 0;
}

int td_trainer_set_correction(td_trainer_t *tr, const float *correction, char *why,
                              size_t why_len) {
  if (correction != NULL && td_backend_device_memory(tr->be))
    return td_why(why, why_len, TD_ECONFIG,
                  "strategy = scaffold: the %s backend keeps gradients on the device, where "
                  "the control-variate correction is not built; use backend = cpu",
                  td_backend_name(tr->be));
  tr->correction = correction;
  return 0;
}

double td_trainer_lr_sum(const td_trainer_t *tr, unsigned long step, unsigned long n) {
  double sum = 0;
  for (unsigned long s = step; s < step + n; s++)
    sum += td_lr_at(&tr->schedule, s) * tr->lr_scale;
  return sum;
}

void td_trainer_rows_init(td_trainer_rows_t *w, size_t first, size_t rows, uint64_t stream) {
  *w = (td_trainer_rows_t){.first = first, .rows = rows, .stream = stream, .cursor = rows};
}

int td_trainer_bind_rows(td_trainer_t *tr, td_trainer_rows_t *w) {
  if (w != NULL && (tr->text != NULL || w->rows == 0 || w->first > tr->rows ||
                    w->rows > tr->rows - w->first))
    return TD_EINVAL;
  tr->bound = w;
  return 0;
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
  if (tr->text != NULL) {
    size_t per_step = (size_t)tr->batch * (size_t)td_model_context(tr->model);
    size_t steps = tr->text_bytes / per_step;
    return steps > 0 ? (unsigned long)steps : 1;
  }
  return (unsigned long)((tr->rows + tr->batch - 1) / tr->batch);
}

/* A device keeps its first failure (ops return nothing): 0 on a host
 * backend, else the failure with the CUDA message, once the queue is done. */
static int device_error(td_trainer_t *tr, char *why, size_t why_len) {
  return td_backend_device_memory(tr->be) ? td_backend_error(tr->be, why, why_len) : 0;
}

/* *x = rows [first, first + n) of ds as floats, through rows_scratch (grown
 * to hold n rows) when ds holds bytes. TD_ENOMEM or TD_ERANGE + why. */
static int rows_floats(td_trainer_t *tr, const td_dataset_t *ds, size_t first, size_t n,
                       const float **x, char *why, size_t why_len) {
  size_t dim = td_dataset_dim(ds);
  if (td_dataset_holds_bytes(ds) && n * dim > tr->rows_capacity) {
    float *grown = realloc(tr->rows_scratch, n * dim * sizeof *grown);
    if (grown == NULL)
      return td_why(why, why_len, TD_ENOMEM, "out of memory for a batch of %zu rows", n);
    tr->rows_scratch = grown;
    tr->rows_capacity = n * dim;
  }
  *x = td_dataset_rows_floats(ds, first, n, tr->rows_scratch);
  if (*x == NULL)
    return td_why(why, why_len, TD_ERANGE, "rows %zu..%zu are outside the dataset", first,
                  first + n);
  return 0;
}

static int run_steps(td_trainer_t *tr, unsigned long n, bool advance, td_train_stats_t *stats,
                     char *why, size_t why_len) {
  double loss_sum = 0, t0 = now_s();
  unsigned long correct = 0, samples = 0;
  double lr = 0;
  for (unsigned long i = 0; i < n; i++) {
    size_t rows;
    double loss;
    int hits, rc;
    if (tr->text != NULL) {
      rows = tr->batch;
      td_text_windows(tr->text, tr->text_bytes, td_model_context(tr->model), (int)rows,
                      &tr->text_rng, tr->tokens, tr->targets);
      td_batch_t b = {.rows = (int)rows, .tokens = tr->tokens, .targets = tr->targets};
      rc = td_model_train(tr->model, &b, &loss, &hits);
    } else if (tr->bound != NULL) { /* a virtual client's rows only */
      td_trainer_rows_t *w = tr->bound;
      if (w->cursor >= w->rows) {
        td_rng_t rng;
        td_rng_seed2(&rng, tr->seed ^ (w->stream * 0x9E3779B97F4A7C15ull),
                     0x434C49454E54ull + w->epoch); /* "CLIENT" + epoch */
        td_dataset_shuffle_rows(tr->train, w->first, w->rows, &rng);
        w->cursor = 0;
        w->epoch++;
      }
      rows = w->rows - w->cursor < tr->batch ? w->rows - w->cursor : tr->batch;
      const float *x;
      if ((rc = rows_floats(tr, tr->train, w->first + w->cursor, rows, &x, why, why_len)) != 0)
        return rc;
      const int32_t *y = td_dataset_labels(tr->train) + w->first + w->cursor;
      rc = td_model_train_batch(tr->model, x, y, (int)rows, &loss, &hits);
      w->cursor += rows;
    } else {
      if (tr->cursor >= tr->rows) {
        td_rng_t rng;
        td_rng_seed2(&rng, tr->seed, 0x5348554646ull + tr->epoch); /* "SHUFF" + epoch */
        td_dataset_shuffle(tr->train, &rng);
        tr->cursor = 0;
        tr->epoch++;
      }
      rows = tr->rows - tr->cursor < tr->batch ? tr->rows - tr->cursor : tr->batch;
      const float *x;
      if ((rc = rows_floats(tr, tr->train, tr->cursor, rows, &x, why, why_len)) != 0)
        return rc;
      const int32_t *y = td_dataset_labels(tr->train) + tr->cursor;
      rc = td_model_train_batch(tr->model, x, y, (int)rows, &loss, &hits);
      tr->cursor += rows;
    }
    if (rc != 0 && device_error(tr, why, why_len) != 0)
      return TD_EDEVICE; /* a NaN loss from a failed device says nothing of the model */
    if (rc != 0)
      return td_why(why, why_len, rc,
                    rc == TD_ENUMERIC ? "training diverged: the loss is not finite at step %lu "
                                        "(learning rate too high?)"
                                      : "training step %lu failed",
                    tr->step + 1);
    lr = td_lr_at(&tr->schedule, tr->step) * tr->lr_scale;
    if (tr->prox_mu > 0) /* before the optimizer, so clipping and momentum see it */
      td_backend_prox_grad(tr->be, td_model_grads(tr->model), td_model_params(tr->model),
                           tr->prox_center, tr->prox_mu, td_model_numel(tr->model));
    if (tr->correction != NULL) { /* SCAFFOLD: g - ci + c, host memory (checked at set) */
      float *g = td_model_grads(tr->model);
      for (size_t k = 0, numel = td_model_numel(tr->model); k < numel; k++)
        g[k] += tr->correction[k];
    }
    td_optim_step(tr->optim, td_model_params(tr->model), td_model_grads(tr->model), lr);
    tr->step += advance;
    loss_sum += loss * (double)rows;
    correct += (unsigned long)hits;
    samples += rows;
  }
  int rc = device_error(tr, why, why_len);
  if (rc != 0)
    return rc;
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
  size_t rows = td_dataset_rows(ds);
  size_t chunk = (size_t)td_model_max_batch(tr->model);
  double loss_sum = 0;
  int correct_total = 0;
  for (size_t r = 0; r < rows; r += chunk) {
    size_t n = rows - r < chunk ? rows - r : chunk;
    int hits = 0;
    const float *x;
    if ((rc = rows_floats(tr, ds, r, n, &x, why, why_len)) != 0)
      return rc;
    rc = td_model_eval_batch(tr->model, x, td_dataset_labels_const(ds) + r, (int)n, &loss_sum,
                             &hits);
    if (rc != 0 && device_error(tr, why, why_len) != 0)
      return TD_EDEVICE;
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

int td_trainer_evaluate_text(td_trainer_t *tr, const uint8_t *data, size_t bytes,
                             double *bits_per_byte, char *why, size_t why_len) {
  if (td_model_input_kind(tr->model) != TD_INPUT_TOKENS)
    return td_why(why, why_len, TD_ESHAPE,
                  "the model reads float features (an image or CSV dataset), not text");
  int context = td_model_context(tr->model);
  if (data == NULL || bytes < (size_t)context + 1)
    return td_why(why, why_len, TD_ESHAPE,
                  "the held-out text has %zu bytes, fewer than one window of context %d + 1",
                  bytes, context);
  /* fixed windows spread evenly over the range: the same ones every call */
  size_t span = bytes - (size_t)context - 1; /* last valid offset */
  size_t windows = bytes / ((size_t)context + 1);
  if (windows > TD_TRAINER_EVAL_WINDOWS)
    windows = TD_TRAINER_EVAL_WINDOWS;
  if (windows < 1)
    windows = 1;
  int chunk = (int)tr->max_batch;
  double loss_sum = 0;
  for (size_t w = 0; w < windows; w += (size_t)chunk) {
    int rows = windows - w < (size_t)chunk ? (int)(windows - w) : chunk;
    for (int r = 0; r < rows; r++) {
      size_t o = windows > 1 ? span * (w + (size_t)r) / (windows - 1) : 0;
      for (int t = 0; t < context; t++) {
        tr->tokens[(size_t)r * (size_t)context + (size_t)t] = data[o + (size_t)t];
        tr->targets[(size_t)r * (size_t)context + (size_t)t] = data[o + (size_t)t + 1];
      }
    }
    td_batch_t b = {.rows = rows, .tokens = tr->tokens, .targets = tr->targets};
    int rc = td_model_eval(tr->model, &b, &loss_sum, NULL);
    if (rc != 0 && device_error(tr, why, why_len) != 0)
      return TD_EDEVICE;
    if (rc != 0)
      return td_why(why, why_len, rc, "evaluation failed: %s", td_strerror(rc));
  }
  *bits_per_byte = loss_sum / ((double)windows * context) / log(2.0);
  return 0;
}

td_model_t *td_trainer_model(td_trainer_t *tr) { return tr->model; }
td_optim_t *td_trainer_optim(td_trainer_t *tr) { return tr->optim; }
int td_trainer_reset_optim(td_trainer_t *tr) { return td_optim_reset(tr->optim); }
unsigned long td_trainer_global_step(const td_trainer_t *tr) { return tr->step; }

void td_trainer_seek(td_trainer_t *tr, unsigned long step) { tr->step = step; }
