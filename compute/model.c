/* model.c: multi-layer perceptrons over the flat parameter buffer.
 *
 * Layer l computes Y_l = act(X_l W_lᵀ + b_l) with W_l stored (out x in). The
 * forward pass is one GEMM plus one fused bias/ReLU pass per layer; the
 * backward pass is one fused ReLU-mask/bias-gradient pass and two GEMMs per
 * layer (dW straight into the gradient buffer, dX into the previous layer's
 * gradient buffer), the first layer's dX being skipped. All buffers are sized
 * for max_batch at open: a training step allocates and copies nothing. */
#include "compute/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"
#include "compute/rng.h"

typedef struct {
  int in, out;
  size_t w_off, b_off;
  float *y;  /* max_batch x out: activated output (logits for the last layer) */
  float *dy; /* max_batch x out: gradient w.r.t. the pre-activation */
} layer_t;

struct td_model {
  td_backend_t *be;
  td_layout_t *layout;
  float *params, *grads;
  int max_batch;
  int n_layers;
  layer_t layers[TD_MODEL_MAX_LAYERS];
};

/* Parse "mlp:D0-D1-...-Dn" into widths; returns the number of widths. */
static int parse_spec(const char *spec, int *widths, char *why, size_t why_len) {
  if (spec == NULL || strncmp(spec, "mlp:", 4) != 0) {
    char kind[32] = "";
    const char *colon = spec ? strchr(spec, ':') : NULL;
    if (spec && colon && colon - spec < (long)sizeof kind)
      snprintf(kind, sizeof kind, "%.*s", (int)(colon - spec), spec);
    else if (spec)
      snprintf(kind, sizeof kind, "%.31s", spec);
    return td_why(why, why_len, TD_ECONFIG, "unknown model '%s' (supported: mlp:IN-H1-...-OUT)",
                  kind);
  }
  const char *p = spec + 4;
  int n = 0;
  for (;;) {
    if (*p < '0' || *p > '9')
      return td_why(why, why_len, TD_ECONFIG, "bad layer width in '%s' (expected digits)", spec);
    char *end;
    errno = 0;
    long w = strtol(p, &end, 10);
    if (errno != 0 || w < 1 || w > TD_MODEL_MAX_WIDTH)
      return td_why(why, why_len, TD_ECONFIG, "layer width in '%s' must be in [1, %d]", spec,
                    TD_MODEL_MAX_WIDTH);
    if (n >= TD_MODEL_MAX_LAYERS + 1)
      return td_why(why, why_len, TD_ECONFIG, "'%s' has more than %d layers", spec,
                    TD_MODEL_MAX_LAYERS);
    widths[n++] = (int)w;
    if (*end == '\0')
      break;
    if (*end != '-')
      return td_why(why, why_len, TD_ECONFIG, "unexpected '%c' in '%s'", *end, spec);
    p = end + 1;
  }
  if (n < 2)
    return td_why(why, why_len, TD_ECONFIG,
                  "'%s' needs at least an input and an output width (mlp:IN-...-OUT)", spec);
  return n;
}

int td_model_check_spec(const char *spec, char *why, size_t why_len) {
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int n = parse_spec(spec, widths, why, why_len);
  return n < 0 ? n : 0;
}

int td_model_open(td_model_t **out, const char *spec, td_backend_t *be, int max_batch,
                  char *why, size_t why_len) {
  *out = NULL;
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int nw = parse_spec(spec, widths, why, why_len);
  if (nw < 0)
    return nw;
  if (max_batch < 1 || max_batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", max_batch,
                  TD_MODEL_MAX_BATCH);
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  m->be = be;
  m->max_batch = max_batch;
  m->n_layers = nw - 1;
  int rc = td_layout_new(&m->layout);
  for (int l = 0; rc == 0 && l < m->n_layers; l++) {
    char name[TD_TENSOR_NAME_MAX];
    uint32_t wshape[2] = {(uint32_t)widths[l + 1], (uint32_t)widths[l]};
    uint32_t bshape[1] = {(uint32_t)widths[l + 1]};
    snprintf(name, sizeof name, "fc%d.weight", l);
    int wi = td_layout_add(m->layout, name, 2, wshape);
    snprintf(name, sizeof name, "fc%d.bias", l);
    int bi = td_layout_add(m->layout, name, 1, bshape);
    if (wi < 0 || bi < 0) {
      rc = wi < 0 ? wi : bi;
      break;
    }
    layer_t *L = &m->layers[l];
    L->in = widths[l];
    L->out = widths[l + 1];
    L->w_off = td_layout_tensor(m->layout, (size_t)wi)->offset;
    L->b_off = td_layout_tensor(m->layout, (size_t)bi)->offset;
    size_t act = (size_t)max_batch * (size_t)L->out * sizeof(float);
    L->y = td_backend_alloc(be, act);
    L->dy = td_backend_alloc(be, act);
    if (L->y == NULL || L->dy == NULL)
      rc = TD_ENOMEM;
  }
  if (rc == 0) {
    size_t bytes = td_layout_numel(m->layout) * sizeof(float);
    m->params = td_backend_alloc(be, bytes);
    m->grads = td_backend_alloc(be, bytes);
    if (m->params == NULL || m->grads == NULL)
      rc = TD_ENOMEM;
  }
  if (rc != 0) {
    td_model_close(&m);
    return td_why(why, why_len, rc, "cannot build %s: %s", spec, td_strerror(rc));
  }
  *out = m;
  return 0;
}

void td_model_close(td_model_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_model_t *m = *self_p;
  for (int l = 0; l < m->n_layers; l++) {
    td_backend_free(m->be, m->layers[l].y);
    td_backend_free(m->be, m->layers[l].dy);
  }
  td_backend_free(m->be, m->params);
  td_backend_free(m->be, m->grads);
  td_layout_free(&m->layout);
  free(m);
  *self_p = NULL;
}

void td_model_init(td_model_t *m, uint64_t seed) {
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  memset(m->params, 0, td_layout_numel(m->layout) * sizeof(float));
  for (int l = 0; l < m->n_layers; l++) {
    layer_t *L = &m->layers[l];
    float *w = m->params + L->w_off;
    size_t n = (size_t)L->in * (size_t)L->out;
    if (l + 1 < m->n_layers) { /* followed by ReLU: He-normal */
      double std = sqrt(2.0 / L->in);
      for (size_t i = 0; i < n; i++)
        w[i] = (float)(std * td_rng_normal(&rng));
    } else { /* output layer: Xavier-uniform */
      double limit = sqrt(6.0 / (L->in + L->out));
      for (size_t i = 0; i < n; i++)
        w[i] = (float)(limit * (2.0 * td_rng_uniform(&rng) - 1.0));
    }
  }
}

const td_layout_t *td_model_layout(const td_model_t *m) { return m->layout; }
size_t td_model_numel(const td_model_t *m) { return td_layout_numel(m->layout); }
float *td_model_params(td_model_t *m) { return m->params; }
float *td_model_grads(td_model_t *m) { return m->grads; }
int td_model_input_dim(const td_model_t *m) { return m->layers[0].in; }
int td_model_classes(const td_model_t *m) { return m->layers[m->n_layers - 1].out; }
int td_model_max_batch(const td_model_t *m) { return m->max_batch; }

static void forward(td_model_t *m, const float *x, int rows) {
  const float *in = x;
  for (int l = 0; l < m->n_layers; l++) {
    layer_t *L = &m->layers[l];
    td_backend_gemm(m->be, false, true, rows, L->out, L->in, 1.0f, in, L->in,
                    m->params + L->w_off, L->in, 0.0f, L->y, L->out);
    td_backend_bias_act(m->be, L->y, m->params + L->b_off, rows, L->out,
                        l + 1 < m->n_layers ? TD_ACT_RELU : TD_ACT_NONE);
    in = L->y;
  }
}

static int check_labels(const td_model_t *m, const int32_t *y, int rows) {
  int classes = td_model_classes(m);
  for (int r = 0; r < rows; r++)
    if (y[r] < 0 || y[r] >= classes)
      return TD_ERANGE;
  return 0;
}

int td_model_train_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                         double *loss, int *correct) {
  if (rows < 1 || rows > m->max_batch)
    return TD_EINVAL;
  if (check_labels(m, y, rows) != 0)
    return TD_ERANGE;
  forward(m, x, rows);
  layer_t *last = &m->layers[m->n_layers - 1];
  int hits = 0;
  double sum = td_backend_softmax_xent(m->be, last->y, y, last->dy, 1.0f / (float)rows, rows,
                                       last->out, &hits);
  if (!isfinite(sum))
    return TD_ENUMERIC;
  for (int l = m->n_layers - 1; l >= 0; l--) {
    layer_t *L = &m->layers[l];
    const float *in = l > 0 ? m->layers[l - 1].y : x;
    td_backend_act_backward(m->be, L->dy, L->y, m->grads + L->b_off, rows, L->out,
                            l + 1 < m->n_layers ? TD_ACT_RELU : TD_ACT_NONE);
    td_backend_gemm(m->be, true, false, L->out, L->in, rows, 1.0f, L->dy, L->out, in, L->in,
                    0.0f, m->grads + L->w_off, L->in);
    if (l > 0)
      td_backend_gemm(m->be, false, false, rows, L->in, L->out, 1.0f, L->dy, L->out,
                      m->params + L->w_off, L->in, 0.0f, m->layers[l - 1].dy, L->in);
  }
  *loss = sum / rows;
  if (correct)
    *correct = hits;
  return 0;
}

int td_model_eval_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                        double *loss_sum, int *correct) {
  if (rows < 1 || rows > m->max_batch)
    return TD_EINVAL;
  if (check_labels(m, y, rows) != 0)
    return TD_ERANGE;
  forward(m, x, rows);
  layer_t *last = &m->layers[m->n_layers - 1];
  int hits = 0;
  double sum = td_backend_softmax_xent(m->be, last->y, y, NULL, 0.0f, rows, last->out, &hits);
  if (!isfinite(sum))
    return TD_ENUMERIC;
  *loss_sum += sum;
  if (correct)
    *correct += hits;
  return 0;
}

double td_model_train_gemm_flops(const td_model_t *m, int rows) {
  double flops = 0;
  for (int l = 0; l < m->n_layers; l++) {
    double mnk = 2.0 * rows * m->layers[l].in * m->layers[l].out;
    flops += mnk * (l > 0 ? 3 : 2);
  }
  return flops;
}

void td_model_gemm_only(td_model_t *m, const float *x, int rows) {
  const float *in = x;
  for (int l = 0; l < m->n_layers; l++) {
    layer_t *L = &m->layers[l];
    td_backend_gemm(m->be, false, true, rows, L->out, L->in, 1.0f, in, L->in,
                    m->params + L->w_off, L->in, 0.0f, L->y, L->out);
    in = L->y;
  }
  for (int l = m->n_layers - 1; l >= 0; l--) {
    layer_t *L = &m->layers[l];
    const float *lin = l > 0 ? m->layers[l - 1].y : x;
    td_backend_gemm(m->be, true, false, L->out, L->in, rows, 1.0f, L->dy, L->out, lin, L->in,
                    0.0f, m->grads + L->w_off, L->in);
    if (l > 0)
      td_backend_gemm(m->be, false, false, rows, L->in, L->out, 1.0f, L->dy, L->out,
                      m->params + L->w_off, L->in, 0.0f, m->layers[l - 1].dy, L->in);
  }
}
