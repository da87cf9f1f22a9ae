/* optim.c: learning-rate schedules (pure functions of the step) and the SGD
 * optimizer that owns the velocity buffer. */
#include "compute/optim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"

int td_lr_schedule_parse(td_lr_schedule_t *out, const char *spec, double base_lr,
                         unsigned long warmup_steps, unsigned long steps_per_epoch,
                         unsigned long total_steps, char *why, size_t why_len) {
  memset(out, 0, sizeof *out);
  out->base_lr = base_lr;
  out->warmup_steps = warmup_steps;
  out->total_steps = total_steps;
  out->gamma = 1.0;
  if (strcmp(spec, "constant") == 0) {
    out->kind = TD_LR_CONSTANT;
    return 0;
  }
  if (strcmp(spec, "cosine") == 0) {
    out->kind = TD_LR_COSINE;
    return 0;
  }
  if (strncmp(spec, "step:", 5) == 0) {
    const char *p = spec + 5;
    char *end;
    errno = 0;
    if (*p < '0' || *p > '9')
      goto bad;
    unsigned long epochs = strtoul(p, &end, 10);
    if (errno != 0 || epochs < 1 || epochs > 1000000)
      goto bad;
    double gamma = 0.1;
    if (*end == ':') {
      const char *g = end + 1;
      gamma = strtod(g, &end);
      if (end == g || !(gamma > 0 && gamma <= 1))
        goto bad;
    }
    if (*end != '\0')
      goto bad;
    out->kind = TD_LR_STEP;
    out->gamma = gamma;
    out->step_every = epochs * (steps_per_epoch ? steps_per_epoch : 1);
    return 0;
  }
bad:
  return td_why(why, why_len, TD_ECONFIG,
                "bad learning-rate schedule '%s' (accepted: constant, cosine, "
                "step:EPOCHS[:GAMMA] with EPOCHS >= 1 and GAMMA in (0, 1])",
                spec);
}

double td_lr_at(const td_lr_schedule_t *s, unsigned long step) {
  if (step < s->warmup_steps)
    return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
  switch (s->kind) {
  case TD_LR_CONSTANT: return s->base_lr;
  case TD_LR_COSINE: {
    double span = s->total_steps > s->warmup_steps ? (double)(s->total_steps - s->warmup_steps) : 1;
    double t = (double)(step - s->warmup_steps);
    if (t > span)
      t = span;
    return s->base_lr * 0.5 * (1.0 + cos(M_PI * t / span));
  }
  case TD_LR_STEP:
    return s->base_lr * pow(s->gamma, (double)(step / (s->step_every ? s->step_every : 1)));
  }
  return s->base_lr;
}

struct td_sgd {
  td_backend_t *be;
  float *velocity;
  size_t numel;
  td_sgd_opts_t opts;
};

int td_sgd_open(td_sgd_t **out, td_backend_t *be, size_t numel, const td_sgd_opts_t *opts) {
  *out = NULL;
  if (!(opts->momentum >= 0 && opts->momentum < 1) || !(opts->weight_decay >= 0))
    return TD_ECONFIG;
  td_sgd_t *o = calloc(1, sizeof *o);
  if (o == NULL)
    return TD_ENOMEM;
  o->be = be;
  o->numel = numel;
  o->opts = *opts;
  o->velocity = td_backend_alloc(be, numel * sizeof(float));
  if (o->velocity == NULL) {
    free(o);
    return TD_ENOMEM;
  }
  *out = o;
  return 0;
}

void td_sgd_close(td_sgd_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_backend_free((*self_p)->be, (*self_p)->velocity);
  free(*self_p);
  *self_p = NULL;
}

void td_sgd_step(td_sgd_t *o, float *w, const float *g, double lr) {
  td_sgd_hparams_t hp = {.lr = (float)lr, .momentum = (float)o->opts.momentum,
                         .weight_decay = (float)o->opts.weight_decay,
                         .nesterov = o->opts.nesterov};
  td_backend_sgd_step(o->be, w, g, o->velocity, o->numel, &hp);
}

float *td_sgd_velocity(td_sgd_t *o) { return o->velocity; }
