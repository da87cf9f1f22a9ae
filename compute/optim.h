/* optim.h: SGD (momentum, Nesterov, weight decay) and learning-rate schedules.
 *
 * The optimizer owns one velocity buffer laid out like the model's flat
 * parameters and updates them in one fused pass on the model's backend.
 * Schedules are pure functions of the global step so every node of a run
 * computes the same learning rate without talking. */
#ifndef TD_OPTIM_H
#define TD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "compute/backend.h"

typedef enum {
  TD_LR_CONSTANT = 0,
  TD_LR_COSINE,
  TD_LR_STEP,
} td_lr_kind_t;

typedef struct {
  td_lr_kind_t kind;
  double base_lr;
  double gamma;             /* step: factor applied every step_every_steps */
  unsigned long step_every; /* step: in steps (> 0) */
  unsigned long warmup_steps;
  unsigned long total_steps; /* cosine: decays to 0 at total_steps */
} td_lr_schedule_t;

/* Parse `lr_schedule`: constant | cosine | step:EPOCHS[:GAMMA] (GAMMA defaults to
 * 0.1, EPOCHS >= 1). steps_per_epoch converts epochs to steps; base_lr,
 * warmup_steps and total_steps are filled from the arguments. TD_ECONFIG + why. */
int td_lr_schedule_parse(td_lr_schedule_t *out, const char *spec, double base_lr,
                         unsigned long warmup_steps, unsigned long steps_per_epoch,
                         unsigned long total_steps, char *why, size_t why_len);
/* Learning rate at 0-based global step: linear warm-up from base_lr/warmup to
 * base_lr over warmup_steps, then the schedule (cosine over the remaining steps). */
double td_lr_at(const td_lr_schedule_t *s, unsigned long step);

typedef struct {
  double momentum;     /* [0, 1) */
  bool nesterov;       /* requires momentum > 0 */
  double weight_decay; /* >= 0 */
} td_sgd_opts_t;

typedef struct td_sgd td_sgd_t;

/* Velocity buffer of numel floats on backend be (borrowed). Caller owns *out. */
int td_sgd_open(td_sgd_t **out, td_backend_t *be, size_t numel, const td_sgd_opts_t *opts);
void td_sgd_close(td_sgd_t **self_p);
/* w -= update(g) with learning rate lr; see td_backend_sgd_step(). */
void td_sgd_step(td_sgd_t *opt, float *w, const float *g, double lr);
/* Velocity buffer (borrowed), e.g. to reset it after a model merge. */
float *td_sgd_velocity(td_sgd_t *opt);

#endif
