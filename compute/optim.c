/* optim.c: learning-rate schedules, gradient clipping and the optimizers.
 *
 * A schedule is parsed once from the run spec and is then a pure function of
 * the global step, so every node of a run computes the same rate without
 * talking. An optimizer owns its state buffers on the model's backend and
 * hands each update to the backend's fused sgd_step or adamw_step, one pass
 * over memory; AdamW's bias corrections are computed here in double, once per
 * step, and the clip factor rides along in the same pass (on a device the
 * gradient's norm is taken on a pinned host copy read back for it). Runs on whichever
 * thread owns the model (the compute thread). */
#include "compute/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

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

double td_clip_global_norm(float *g, size_t n, double max_norm) {
  double sq = 0;
  for (size_t i = 0; i < n; i++)
    sq += (double)g[i] * (double)g[i];
  double norm = sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    double scale = max_norm / norm;
    for (size_t i = 0; i < n; i++)
      g[i] = (float)((double)g[i] * scale);
  }
  return norm;
}

#define TD__OPTIM_MAX_STATES 2

struct td_optim {
  td_backend_t *be;
  td_optim_opts_t opts;
  size_t numel;
  size_t n_states;
  float *state[TD__OPTIM_MAX_STATES];
  float *host_g; /* clipping on a device: the gradient read back (pinned), else NULL */
  unsigned long steps;
};

static const char *const optim_names[] = {[TD_OPTIM_SGD] = "sgd", [TD_OPTIM_ADAMW] = "adamw"};

int td_optim_kind_parse(td_optim_kind_t *out, const char *name, char *why, size_t why_len) {
  for (size_t k = 0; k < sizeof optim_names / sizeof optim_names[0]; k++)
    if (name != NULL && strcmp(name, optim_names[k]) == 0) {
      *out = (td_optim_kind_t)k;
      return 0;
    }
  return td_why(why, why_len, TD_ECONFIG, "unknown optimizer '%s' (accepted: sgd, adamw)",
                name ? name : "(null)");
}

const char *td_optim_kind_name(td_optim_kind_t kind) {
  return (unsigned)kind < sizeof optim_names / sizeof optim_names[0] ? optim_names[kind] : "?";
}

static bool in_unit(double x) { return x >= 0.0 && x < 1.0; }

static int optim_check(const td_optim_opts_t *o, char *why, size_t why_len) {
  if (!(o->weight_decay >= 0.0 && isfinite(o->weight_decay)))
    return td_why(why, why_len, TD_ECONFIG, "weight_decay %g is not a finite number >= 0",
                  o->weight_decay);
  if (!(o->clip >= 0.0 && isfinite(o->clip)))
    return td_why(why, why_len, TD_ECONFIG, "clip %g is not a finite number >= 0", o->clip);
  switch (o->kind) {
  case TD_OPTIM_SGD:
    if (!in_unit(o->momentum))
      return td_why(why, why_len, TD_ECONFIG, "momentum %g is not in [0, 1)", o->momentum);
    if (o->nesterov && o->momentum == 0.0)
      return td_why(why, why_len, TD_ECONFIG, "nesterov needs momentum > 0");
    return 0;
  case TD_OPTIM_ADAMW:
    if (!in_unit(o->beta1) || !in_unit(o->beta2))
      return td_why(why, why_len, TD_ECONFIG, "AdamW betas (%g, %g) are not both in [0, 1)",
                    o->beta1, o->beta2);
    if (!(o->eps > 0.0 && isfinite(o->eps)))
      return td_why(why, why_len, TD_ECONFIG, "AdamW eps %g is not a finite number > 0",
                    o->eps);
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG, "unknown optimizer kind %d", (int)o->kind);
}

int td_optim_open(td_optim_t **out, td_backend_t *be, size_t numel, const td_optim_opts_t *opts,
                  char *why, size_t why_len) {
  if (out == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output pointer");
  *out = NULL;
  if (be == NULL || opts == NULL || numel > SIZE_MAX / sizeof(float))
    return td_why(why, why_len, TD_EINVAL, "no backend, no options or too many parameters");
  int rc = optim_check(opts, why, why_len);
  if (rc != 0)
    return rc;
  td_optim_t *opt = calloc(1, sizeof *opt);
  if (opt == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  opt->be = be;
  opt->opts = *opts;
  opt->numel = numel;
  opt->n_states = opts->kind == TD_OPTIM_ADAMW ? 2 : 1;
  for (size_t i = 0; i < opt->n_states; i++)
    if ((opt->state[i] = td_backend_alloc(be, numel * sizeof(float))) == NULL) {
      td_optim_close(&opt);
      return td_why(why, why_len, TD_ENOMEM, "out of memory for %zu optimizer floats", numel);
    }
  if (opts->clip > 0 && td_backend_device_memory(be) &&
      (opt->host_g = td_backend_host_alloc(be, numel * sizeof(float))) == NULL) {
    td_optim_close(&opt);
    return td_why(why, why_len, TD_ENOMEM, "out of memory for %zu gradient floats", numel);
  }
  *out = opt;
  return 0;
}

void td_optim_close(td_optim_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_optim_t *opt = *self_p;
  for (size_t i = 0; i < opt->n_states; i++)
    td_backend_free(opt->be, opt->state[i]);
  td_backend_host_free(opt->be, opt->host_g);
  free(opt);
  *self_p = NULL;
}

/* td_clip_global_norm() on g wherever it lives: on a device the gradient is
 * read back into the pinned copy (and sent back when it was scaled), so the
 * norm is the same double-precision sum as on the host. A failed read gives
 * NaN (no clipping); the backend keeps the error for the caller to report. */
static double clip_norm(td_optim_t *opt, float *g, double max_norm) {
  if (opt->host_g == NULL)
    return td_clip_global_norm(g, opt->numel, max_norm);
  size_t bytes = opt->numel * sizeof(float);
  if (td_backend_download(opt->be, opt->host_g, g, bytes) != 0)
    return NAN;
  double norm = td_clip_global_norm(opt->host_g, opt->numel, max_norm);
  if (max_norm > 0 && norm > max_norm)
    td_backend_upload_async(opt->be, g, opt->host_g, bytes);
  return norm;
}

double td_optim_step(td_optim_t *opt, float *w, float *g, double lr) {
  const td_optim_opts_t *o = &opt->opts;
  double norm = -1;
  opt->steps++;
  if (o->kind == TD_OPTIM_SGD) {
    if (o->clip > 0)
      norm = clip_norm(opt, g, o->clip);
    td_sgd_hparams_t hp = {
        .lr = (float)lr,
        .momentum = (float)o->momentum,
        .weight_decay = (float)o->weight_decay,
        .nesterov = o->nesterov,
    };
    td_backend_sgd_step(opt->be, w, g, opt->state[0], opt->numel, &hp);
    return norm;
  }
  double scale = 1;
  if (o->clip > 0) {
    norm = clip_norm(opt, g, 0); /* measure only: the pass scales */
    if (norm > o->clip)
      scale = o->clip / norm;
  }
  double t = (double)opt->steps;
  td_adamw_hparams_t hp = {
      .lr = (float)lr,
      .beta1 = (float)o->beta1,
      .beta2 = (float)o->beta2,
      .eps = (float)o->eps,
      .weight_decay = (float)o->weight_decay,
      .bias1 = (float)(1.0 - pow(o->beta1, t)),
      .bias2 = (float)(1.0 - pow(o->beta2, t)),
      .grad_scale = (float)scale,
  };
  td_backend_adamw_step(opt->be, w, g, opt->state[0], opt->state[1], opt->numel, &hp);
  return norm;
}

int td_optim_reset(td_optim_t *opt) {
  size_t bytes = opt->numel * sizeof(float);
  float *zeros = calloc(1, bytes ? bytes : 1);
  if (zeros == NULL)
    return TD_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < opt->n_states && rc == 0; i++)
    rc = td_backend_upload(opt->be, opt->state[i], zeros, bytes);
  free(zeros);
  if (rc == 0)
    opt->steps = 0;
  return rc;
}

unsigned long td_optim_steps(const td_optim_t *opt) { return opt->steps; }
td_optim_kind_t td_optim_kind(const td_optim_t *opt) { return opt->opts.kind; }
size_t td_optim_state_count(const td_optim_t *opt) { return opt->n_states; }

float *td_optim_state(td_optim_t *opt, size_t index) {
  return index < opt->n_states ? opt->state[index] : NULL;
}
