/* optim.c: learning-rate schedules and the SGD optimizer.
 *
 * A schedule is parsed once from the run spec and is then a pure function of
 * the global step, so every node of a run computes the same rate without
 * talking. The optimizer owns one velocity buffer on the model's backend and
 * hands each update to the backend's fused sgd_step, one pass over memory. */
#include "compute/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"

#define TD__LR_FORMS \
  "constant, cosine, step:EPOCHS[:GAMMA] with EPOCHS an integer >= 1 and GAMMA in (0, 1]"
#define TD__LR_MAX_EPOCHS 1000000ul

/* Strict decimal integer: digits only, at least one, no overflow past max.
 * Returns the first character after the digits, NULL when there are none. */
static const char *parse_ulong(const char *p, unsigned long max, unsigned long *value) {
  unsigned long v = 0;
  const char *start = p;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned digit = (unsigned)(*p - '0');
    if (v > (max - digit) / 10)
      return NULL;
    v = v * 10 + digit;
  }
  if (p == start)
    return NULL;
  *value = v;
  return p;
}

/* Strict decimal fraction: digits with at most one '.', at least one digit;
 * no sign, blanks, exponent, hex, inf or nan (which strtod would all take). */
static const char *parse_decimal(const char *p, double *value) {
  const char *start = p;
  bool dot = false, digit = false;
  for (; (*p >= '0' && *p <= '9') || (*p == '.' && !dot); p++) {
    dot |= *p == '.';
    digit |= *p != '.';
  }
  if (!digit || p - start > 32)
    return NULL;
  char buf[40];
  memcpy(buf, start, (size_t)(p - start));
  buf[p - start] = '\0';
  *value = strtod(buf, NULL);
  return p;
}

int td_lr_schedule_parse(td_lr_schedule_t *out, const char *spec, double base_lr,
                         unsigned long warmup_steps, unsigned long steps_per_epoch,
                         unsigned long total_steps, char *why, size_t why_len) {
  if (out == NULL)
    return td_why(why, why_len, TD_EINVAL, "no schedule to fill");
  memset(out, 0, sizeof *out);
  if (spec == NULL)
    return td_why(why, why_len, TD_ECONFIG, "no learning-rate schedule (accepted: %s)",
                  TD__LR_FORMS);
  if (!isfinite(base_lr) || base_lr < 0)
    return td_why(why, why_len, TD_ECONFIG, "learning rate %g is not a finite number >= 0",
                  base_lr);
  out->base_lr = base_lr;
  out->warmup_steps = warmup_steps;
  out->total_steps = total_steps;
  out->gamma = 1.0;
  out->step_every = 1;
  if (strcmp(spec, "constant") == 0) {
    out->kind = TD_LR_CONSTANT;
    return 0;
  }
  if (strcmp(spec, "cosine") == 0) {
    out->kind = TD_LR_COSINE;
    return 0;
  }
  if (strncmp(spec, "step:", 5) == 0) {
    unsigned long epochs = 0;
    double gamma = 0.1;
    const char *end = parse_ulong(spec + 5, TD__LR_MAX_EPOCHS, &epochs);
    if (end == NULL || epochs < 1)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad EPOCHS in learning-rate schedule '%s' (an integer in 1..%lu)", spec,
                    TD__LR_MAX_EPOCHS);
    if (*end == ':') {
      end = parse_decimal(end + 1, &gamma);
      if (end == NULL || !(gamma > 0.0 && gamma <= 1.0))
        return td_why(why, why_len, TD_ECONFIG,
                      "bad GAMMA in learning-rate schedule '%s' (a decimal in (0, 1])", spec);
    }
    if (*end != '\0')
      return td_why(why, why_len, TD_ECONFIG,
                    "trailing characters in learning-rate schedule '%s' (accepted: %s)", spec,
                    TD__LR_FORMS);
    unsigned long per_epoch = steps_per_epoch ? steps_per_epoch : 1;
    if (epochs > (unsigned long)-1 / per_epoch)
      return td_why(why, why_len, TD_ECONFIG, "'%s' decays after too many steps", spec);
    out->kind = TD_LR_STEP;
    out->gamma = gamma;
    out->step_every = epochs * per_epoch;
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG, "unknown learning-rate schedule '%s' (accepted: %s)",
                spec, TD__LR_FORMS);
}

double td_lr_at(const td_lr_schedule_t *s, unsigned long step) {
  if (step < s->warmup_steps)
    return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
  switch (s->kind) {
  case TD_LR_CONSTANT:
    return s->base_lr;
  case TD_LR_COSINE: {
    unsigned long span = s->total_steps > s->warmup_steps ? s->total_steps - s->warmup_steps : 1;
    unsigned long t = step - s->warmup_steps;
    if (t > span)
      t = span;
    return s->base_lr * 0.5 * (1.0 + cos(M_PI * (double)t / (double)span));
  }
  case TD_LR_STEP: {
    unsigned long every = s->step_every ? s->step_every : 1;
    return s->base_lr * pow(s->gamma, (double)(step / every));
  }
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
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (be == NULL || opts == NULL || numel > SIZE_MAX / sizeof(float))
    return TD_EINVAL;
  if (!(opts->momentum >= 0.0 && opts->momentum < 1.0) ||
      !(opts->weight_decay >= 0.0 && isfinite(opts->weight_decay)) ||
      (opts->nesterov && opts->momentum == 0.0))
    return TD_ECONFIG;
  td_sgd_t *opt = calloc(1, sizeof *opt);
  if (opt == NULL)
    return TD_ENOMEM;
  opt->be = be;
  opt->numel = numel;
  opt->opts = *opts;
  opt->velocity = td_backend_alloc(be, numel * sizeof(float));
  if (opt->velocity == NULL) {
    free(opt);
    return TD_ENOMEM;
  }
  *out = opt;
  return 0;
}

void td_sgd_close(td_sgd_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_backend_free((*self_p)->be, (*self_p)->velocity);
  free(*self_p);
  *self_p = NULL;
}

void td_sgd_step(td_sgd_t *opt, float *w, const float *g, double lr) {
  td_sgd_hparams_t hp = {
      .lr = (float)lr,
      .momentum = (float)opt->opts.momentum,
      .weight_decay = (float)opt->opts.weight_decay,
      .nesterov = opt->opts.nesterov,
  };
  td_backend_sgd_step(opt->be, w, g, opt->velocity, opt->numel, &hp);
}

float *td_sgd_velocity(td_sgd_t *opt) { return opt->velocity; }
