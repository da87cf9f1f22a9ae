/* trainer.h: local training on one node's partition.
 *
 * A trainer ties a model, an optimizer (td_optim_t: SGD or AdamW, clipping)
 * and a learning-rate schedule to a training set it walks in seeded, shuffled order (rows are permuted in place
 * once per epoch, so a step reads a contiguous batch: no copy, no allocation).
 * The standalone mode drives it epoch by epoch; the daemon's compute thread will
 * drive it H steps at a time. One trainer belongs to one thread. */
#ifndef TD_TRAINER_H
#define TD_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/backend.h"
#include "compute/data/dataset.h"
#include "compute/model.h"
#include "compute/optim.h"

typedef struct {
  const char *model_spec;
  unsigned batch;  /* rows per step */
  unsigned max_batch; /* largest batch td_trainer_set_batch may set later (0: batch) */
  uint64_t seed;   /* init and shuffling */
  double lr;
  const char *lr_schedule; /* constant | cosine | step:E[:G] */
  unsigned long warmup_steps;
  unsigned epochs; /* sizes the schedule (cosine end) */
  unsigned long total_steps; /* overrides epochs * steps per epoch when > 0 */
  td_optim_opts_t optim; /* kind, momentum/nesterov, betas/eps, weight decay, clip */
} td_trainer_opts_t;

typedef struct {
  unsigned long steps;
  unsigned long samples;
  double loss;      /* mean training loss over the steps */
  double accuracy;  /* training accuracy over the steps */
  double seconds;   /* wall time spent computing */
  double lr;        /* learning rate of the last step */
} td_train_stats_t;

typedef struct td_trainer td_trainer_t;

/* train is borrowed and permuted in place; be is borrowed. Checks that the
 * dataset fits the model (features == input width, labels < outputs) and fails
 * with TD_ESHAPE / TD_ECONFIG and a why otherwise. Caller owns *out. */
int td_trainer_open(td_trainer_t **out, td_backend_t *be, td_dataset_t *train,
                    const td_trainer_opts_t *opts, char *why, size_t why_len);
/* A token model (gpt) on text: data[0..bytes) is borrowed; every step draws
 * `batch` windows of CONTEXT+1 bytes at seeded random offsets (tokens are the
 * first CONTEXT bytes, targets the next byte at each position). TD_ESHAPE with
 * why for a feature model or fewer than CONTEXT+1 bytes. Caller owns *out. */
int td_trainer_open_text(td_trainer_t **out, td_backend_t *be, const uint8_t *data,
                         size_t bytes, const td_trainer_opts_t *opts, char *why,
                         size_t why_len);
void td_trainer_close(td_trainer_t **self_p);

/* Steps in one epoch (ceil(rows / batch); text: bytes / (batch * CONTEXT)). */
unsigned long td_trainer_steps_per_epoch(const td_trainer_t *tr);
/* Run n optimizer steps, continuing where the last call stopped and reshuffling at
 * every epoch boundary. TD_ENUMERIC (with why) if the loss stops being finite. */
int td_trainer_steps(td_trainer_t *tr, unsigned long n, td_train_stats_t *stats, char *why,
                     size_t why_len);
/* Like td_trainer_steps, but the learning-rate schedule stays where it is: n
 * extra steps at the current rate (overlap mode fills its wait for the
 * network with them; the schedule keeps following the nominal steps). */
int td_trainer_fill_steps(td_trainer_t *tr, unsigned long n, td_train_stats_t *stats, char *why,
                          size_t why_len);
/* Virtual clients (compute/clients.h): one trainer walks several clients'
 * rows in turn. A client's rows are a contiguous range of the training set;
 * its walk (epoch, cursor) is its own and lives in this struct, which the
 * caller owns. While bound, steps read only [first, first + rows), shuffled
 * within that range at each of the client's epochs with a stream derived
 * from (seed, stream, epoch). */
typedef struct {
  size_t first, rows;  /* the client's rows: [first, first + rows) */
  uint64_t stream;     /* names the client's shuffles (e.g. its global index) */
  unsigned long epoch; /* the client's epochs started */
  size_t cursor;       /* next row of its epoch (== rows: shuffle first) */
} td_trainer_rows_t;
/* A fresh walk over [first, first + rows) named by stream. */
void td_trainer_rows_init(td_trainer_rows_t *w, size_t first, size_t rows, uint64_t stream);
/* Steps from now on walk w (borrowed until unbound; NULL unbinds: the whole
 * set and the trainer's own walk again, exactly as before binding).
 * TD_EINVAL for a text trainer, an empty range or one past the set. */
int td_trainer_bind_rows(td_trainer_t *tr, td_trainer_rows_t *w);
/* FedProx (Li et al. 2020): from now on every step adds mu (w - center) to
 * the gradient before the optimizer sees it, the gradient of (mu/2)|w - center|^2.
 * center is td_model_numel() host floats, copied. mu <= 0 turns it off (the
 * steps are then exactly those without it). TD_ECONFIG with why on a backend
 * without the kernel (td_backend_supports_prox), TD_ENOMEM, TD_EDEVICE. */
int td_trainer_set_prox(td_trainer_t *tr, double mu, const float *center, char *why,
                        size_t why_len);
/* SCAFFOLD (compute/scaffold.h): from now on every step adds correction
 * (td_model_numel() host floats, c - ci, borrowed until replaced) to the
 * gradient, after FedProx's term and before the optimizer. NULL turns it
 * off (the steps are then exactly those without it). TD_ECONFIG with why on
 * a backend that keeps gradients in device memory. */
int td_trainer_set_correction(td_trainer_t *tr, const float *correction, char *why,
                              size_t why_len);
/* The sum of the learning rates steps [step, step + n) take: the schedule's
 * rate times the current scale (td_trainer_set_lr_scale), SCAFFOLD's Σlr. */
double td_trainer_lr_sum(const td_trainer_t *tr, unsigned long step, unsigned long n);
/* Change the rows per step (weighted dynamic batching), within
 * [1, max_batch] of the options (clamped to the partition size). TD_EINVAL
 * outside. The learning-rate schedule keeps counting steps. */
int td_trainer_set_batch(td_trainer_t *tr, unsigned batch);
unsigned td_trainer_batch(const td_trainer_t *tr);
/* Multiply the scheduled learning rate by scale (> 0; anything else means 1).
 * Weighted batching scales a shrunken local batch's rate down linearly, so a
 * slow node's tiny batches take proportionally small steps. */
void td_trainer_set_lr_scale(td_trainer_t *tr, double scale);
/* Learning rate the schedule gives at global step `step` (for the QSR). */
double td_trainer_lr_at(const td_trainer_t *tr, unsigned long step);
/* Loss and accuracy on a dataset (batched forward passes, no state change). */
int td_trainer_evaluate(td_trainer_t *tr, const td_dataset_t *ds, double *loss,
                        double *accuracy, char *why, size_t why_len);
/* Held-out loss of a token model in bits per byte (mean cross-entropy / ln 2)
 * over at most TD_TRAINER_EVAL_WINDOWS fixed windows spread evenly over
 * data[0..bytes): the same windows on every call. */
#define TD_TRAINER_EVAL_WINDOWS 256
int td_trainer_evaluate_text(td_trainer_t *tr, const uint8_t *data, size_t bytes,
                             double *bits_per_byte, char *why, size_t why_len);
/* Check that a dataset fits the model (a feature dataset on a token model is TD_ESHAPE). */
int td_trainer_check_dataset(const td_trainer_t *tr, const td_dataset_t *ds, char *why,
                             size_t why_len);
td_model_t *td_trainer_model(td_trainer_t *tr);
/* The trainer's optimizer (borrowed; its state is local to the node). */
td_optim_t *td_trainer_optim(td_trainer_t *tr);
/* Zero the optimizer state and its step count (td_optim_reset): where the
 * model is replaced wholesale (a late joiner's seed, knowledge transfer with
 * lambda 1) the old trajectory's momentum no longer belongs to it. TD_ENOMEM. */
int td_trainer_reset_optim(td_trainer_t *tr);
unsigned long td_trainer_global_step(const td_trainer_t *tr);
/* Put the learning-rate schedule at global step `step` (a node joining a
 * running run continues where the others are). */
void td_trainer_seek(td_trainer_t *tr, unsigned long step);

#endif
