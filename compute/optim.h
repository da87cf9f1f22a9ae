/* optim.h: optimizers (SGD with momentum/Nesterov, AdamW), gradient clipping by
 * global norm, and learning-rate schedules.
 *
 * An optimizer owns its state buffers, laid out like the model's flat
 * parameters, and updates them in one fused pass on the model's backend.
 * td_optim_t is the one handle a trainer holds whatever the kind; td_sgd_t
 * stays for callers that want plain SGD. Schedules are pure functions of the
 * global step so every node of a run computes the same learning rate without
 * talking.
 *
 * What is local and what travels. Everything in a td_optim_t (SGD velocity,
 * AdamW's m, v and its step count t) is LOCAL to a node: it never goes on the
 * wire, neither in a round's delta nor in a late-join snapshot nor in anchor
 * reconciliation. It describes one node's own trajectory on its own data
 * (DiLoCo keeps the inner AdamW state per worker across rounds); averaging it
 * would mix unrelated trajectories, and sending it would triple a snapshot.
 * What travels is the shared state of the outer step: the anchor (the
 * global model) and the outer momentum buffer (scheduler/outer.h), which are
 * identical on every member and go in the late-join snapshot together.
 * A late joiner therefore starts with a fresh optimizer (td_optim_reset
 * state: zero buffers, t = 0), and AdamW's bias correction makes its first
 * steps well-scaled from zero state, which is exactly why the state need not
 * travel. A full model replacement (knowledge transfer with lambda = 1)
 * resets it the same way; a partial merge keeps it. */
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

/* Global-norm clipping over the n floats of g (host memory): when the L2 norm
 * (accumulated in double) exceeds max_norm > 0, scale g by max_norm / norm so its
 * norm becomes max_norm; otherwise leave g untouched. max_norm <= 0 only
 * measures. Returns the norm before clipping. */
double td_clip_global_norm(float *g, size_t n, double max_norm);

typedef enum {
  TD_OPTIM_SGD = 0,
  TD_OPTIM_ADAMW,
} td_optim_kind_t;

typedef struct {
  td_optim_kind_t kind;
  double weight_decay; /* >= 0; SGD: L2 added to the gradient; AdamW: decoupled */
  double clip;         /* > 0: clip the gradient to this global L2 norm first; 0: off */
  double momentum;     /* SGD: [0, 1) */
  bool nesterov;       /* SGD: requires momentum > 0 */
  double beta1, beta2; /* AdamW: each in [0, 1) */
  double eps;          /* AdamW: > 0 */
} td_optim_opts_t;

typedef struct td_optim td_optim_t;

/* Parse an optimizer name (sgd | adamw). TD_ECONFIG + why. */
int td_optim_kind_parse(td_optim_kind_t *out, const char *name, char *why, size_t why_len);
const char *td_optim_kind_name(td_optim_kind_t kind);

/* State for numel parameters on backend be (borrowed, must outlive the
 * optimizer), zero-filled. TD_ECONFIG + why for options out of range,
 * TD_ENOMEM. Caller owns *out. */
int td_optim_open(td_optim_t **out, td_backend_t *be, size_t numel, const td_optim_opts_t *opts,
                  char *why, size_t why_len);
/* NULL-safe; sets *self_p to NULL. */
void td_optim_close(td_optim_t **self_p);
/* One step with learning rate lr: clip g to opts.clip (when > 0), then update
 * w and the state in one fused backend pass. g is scratch: its contents after
 * the call are unspecified (SGD scales it in place; AdamW folds the clip factor
 * into the pass). Clipping reads g on the host (on a device backend, a copy
 * read back each step). Returns the gradient's global
 * norm before clipping when clipping is on, else -1 (not measured). */
double td_optim_step(td_optim_t *opt, float *w, float *g, double lr);
/* Zero every state buffer and the step count (late join, a model replaced).
 * Not for the step loop: it stages zeros through a host buffer. TD_ENOMEM. */
int td_optim_reset(td_optim_t *opt);
/* Steps taken since open or the last reset (AdamW's t). */
unsigned long td_optim_steps(const td_optim_t *opt);
td_optim_kind_t td_optim_kind(const td_optim_t *opt);
/* The state buffers, each numel floats on the backend: SGD has one (velocity),
 * AdamW two (0: first moment m, 1: second moment v). Borrowed; NULL when
 * index >= td_optim_state_count(). */
size_t td_optim_state_count(const td_optim_t *opt);
float *td_optim_state(td_optim_t *opt, size_t index);

#endif
