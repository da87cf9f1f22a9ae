/* model.c: multi-layer perceptrons over the flat parameter buffer.
 *
 * Layer l computes Y_l = act(X_l W_lᵀ + b_l), W_l stored (out x in) row-major,
 * with ReLU after every layer but the last, whose outputs are the logits of a
 * softmax cross-entropy loss. A training step is, per layer, one GEMM and one
 * fused bias/ReLU pass forward; one softmax pass that writes the logit
 * gradient straight into the last layer's dY; then, per layer backwards, one
 * fused ReLU-mask/bias-gradient pass and two GEMMs: dW_l = dY_lᵀ X_l written
 * straight into the gradient buffer, and dX_l = dY_l W_l written straight into
 * the previous layer's dY (skipped for the first layer, whose input gradient
 * nobody needs). Every buffer is sized for max_batch at open, so a step
 * allocates nothing and copies nothing; td_model_gemm_only() replays exactly
 * the GEMMs of a step so the non-GEMM overhead can be measured against it.
 *
 * Parameters and gradients are host buffers from td_params_alloc() because the
 * codecs and the network read them in place; activations are backend memory. */
#include "compute/model.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"
#include "compute/rng.h"

#define TD__MLP_FORMS "mlp:IN-H1-...-OUT"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD__CLONES
#endif

typedef struct {
  int in, out;
  size_t weight_offset, bias_offset; /* in floats, into params and grads */
  float *y;  /* max_batch x out: activated output (the logits for the last layer) */
  float *dy; /* max_batch x out: d loss / d pre-activation */
} td__layer_t;

struct td_model {
  td_backend_t *be;
  td_layout_t *layout;
  float *params, *grads;
  float *activations; /* one backend block holding every layer's y and dy */
  int max_batch;
  int n_layers;
  td__layer_t layers[TD_MODEL_MAX_LAYERS];
};

/* Parse "mlp:D0-D1-...-Dn" into widths[0..n]; returns the number of widths
 * (2 .. TD_MODEL_MAX_LAYERS + 1) or TD_ECONFIG with why. Widths are plain
 * decimal digits: no sign, no blanks, no hex, nothing after the last one. */
static int parse_spec(const char *spec, int *widths, char *why, size_t why_len) {
  if (spec == NULL || spec[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG, "empty model spec (supported: " TD__MLP_FORMS ")");
  const char *colon = strchr(spec, ':');
  size_t kind_len = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
  if (kind_len != 3 || strncmp(spec, "mlp", 3) != 0)
    return td_why(why, why_len, TD_ECONFIG, "unknown model '%.*s' (supported: " TD__MLP_FORMS ")",
                  kind_len > 32 ? 32 : (int)kind_len, spec);
  if (colon == NULL)
    return td_why(why, why_len, TD_ECONFIG, "'mlp' needs its layer widths (" TD__MLP_FORMS ")");
  int n = 0;
  const char *p = colon + 1;
  for (;;) {
    size_t len = strcspn(p, "-");
    long width = 0;
    bool digits = len > 0;
    for (size_t i = 0; i < len && digits; i++) {
      if (p[i] < '0' || p[i] > '9')
        digits = false;
      else if (width <= TD_MODEL_MAX_WIDTH) /* stop growing once out of range */
        width = width * 10 + (p[i] - '0');
    }
    if (!digits || width < 1 || width > TD_MODEL_MAX_WIDTH)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad layer width '%.*s' in '%s' (each width is an integer in 1..%d)",
                    len > 32 ? 32 : (int)len, p, spec, TD_MODEL_MAX_WIDTH);
    if (n == TD_MODEL_MAX_LAYERS + 1)
      return td_why(why, why_len, TD_ECONFIG, "'%s' has more than %d layers", spec,
                    TD_MODEL_MAX_LAYERS);
    widths[n++] = (int)width;
    if (p[len] == '\0')
      break;
    p += len + 1;
  }
  if (n < 2)
    return td_why(why, why_len, TD_ECONFIG,
                  "'%s' needs at least an input and an output width (" TD__MLP_FORMS ")", spec);
  return n;
}

int td_model_check_spec(const char *spec, char *why, size_t why_len) {
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int n = parse_spec(spec, widths, why, why_len);
  return n < 0 ? n : 0;
}

/* Floats of one activation buffer, rounded so the next one stays 64-byte aligned. */
static size_t activation_floats(int max_batch, int width) {
  size_t n = (size_t)max_batch * (size_t)width;
  return (n + TD_PARAMS_ALIGN_FLOATS - 1) / TD_PARAMS_ALIGN_FLOATS * TD_PARAMS_ALIGN_FLOATS;
}

static uint64_t padded_floats(uint64_t n) {
  return (n + TD_PARAMS_ALIGN_FLOATS - 1) / TD_PARAMS_ALIGN_FLOATS * TD_PARAMS_ALIGN_FLOATS;
}

int td_model_estimate(const char *spec, int batch, uint64_t *params, uint64_t *bytes, char *why,
                      size_t why_len) {
  if (params == NULL || bytes == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output for the estimate");
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int n = parse_spec(spec, widths, why, why_len);
  if (n < 0)
    return n;
  if (batch < 1 || batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", batch,
                  TD_MODEL_MAX_BATCH);
  /* widths <= 65536 and <= 16 layers: every sum below stays far from 2^64 */
  uint64_t numel = 0, activations = 0;
  for (int l = 0; l + 1 < n; l++) {
    numel += padded_floats((uint64_t)widths[l] * (uint64_t)widths[l + 1]);
    numel += padded_floats((uint64_t)widths[l + 1]);
    activations += 2 * activation_floats(batch, widths[l + 1]);
  }
  uint64_t input = (uint64_t)batch * (uint64_t)widths[0] * sizeof(float) +
                   (uint64_t)batch * sizeof(int32_t);
  *params = numel;
  *bytes = 2 * numel * sizeof(float) + activations * sizeof(float) + input;
  return 0;
}

int td_model_open(td_model_t **out, const char *spec, td_backend_t *be, int max_batch,
                  char *why, size_t why_len) {
  if (out == NULL || be == NULL)
    return td_why(why, why_len, TD_EINVAL, "no model pointer or backend");
  *out = NULL;
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int n_widths = parse_spec(spec, widths, why, why_len);
  if (n_widths < 0)
    return n_widths;
  if (max_batch < 1 || max_batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", max_batch,
                  TD_MODEL_MAX_BATCH);
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  m->be = be;
  m->max_batch = max_batch;
  m->n_layers = n_widths - 1;
  int rc = td_layout_new(&m->layout);
  size_t activation_total = 0;
  for (int l = 0; rc == 0 && l < m->n_layers; l++) {
    td__layer_t *layer = &m->layers[l];
    layer->in = widths[l];
    layer->out = widths[l + 1];
    char name[TD_TENSOR_NAME_MAX];
    uint32_t weight_shape[2] = {(uint32_t)layer->out, (uint32_t)layer->in};
    uint32_t bias_shape[1] = {(uint32_t)layer->out};
    snprintf(name, sizeof name, "fc%d.weight", l);
    int weight = td_layout_add(m->layout, name, 2, weight_shape);
    snprintf(name, sizeof name, "fc%d.bias", l);
    int bias = weight < 0 ? weight : td_layout_add(m->layout, name, 1, bias_shape);
    if (bias < 0) {
      rc = bias;
      break;
    }
    layer->weight_offset = td_layout_tensor(m->layout, (size_t)weight)->offset;
    layer->bias_offset = td_layout_tensor(m->layout, (size_t)bias)->offset;
    activation_total += 2 * activation_floats(max_batch, layer->out);
  }
  if (rc == 0) {
    m->params = td_params_alloc(td_layout_numel(m->layout));
    m->grads = td_params_alloc(td_layout_numel(m->layout));
    m->activations = td_backend_alloc(be, activation_total * sizeof(float));
    if (m->params == NULL || m->grads == NULL || m->activations == NULL)
      rc = TD_ENOMEM;
  }
  if (rc != 0) {
    td_model_close(&m);
    return td_why(why, why_len, rc, "cannot build '%s' for batch %d: %s", spec, max_batch,
                  td_strerror(rc));
  }
  float *next = m->activations;
  for (int l = 0; l < m->n_layers; l++) {
    size_t floats = activation_floats(max_batch, m->layers[l].out);
    m->layers[l].y = next;
    m->layers[l].dy = next + floats;
    next += 2 * floats;
  }
  *out = m;
  return 0;
}

void td_model_close(td_model_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_model_t *m = *self_p;
  td_backend_free(m->be, m->activations);
  td_params_free(&m->params);
  td_params_free(&m->grads);
  td_layout_free(&m->layout);
  free(m);
  *self_p = NULL;
}

/* Draws in a fixed order (layer by layer, each weight matrix row-major) from
 * one stream, so the seed alone fixes every bit. Biases and padding are zero. */
void td_model_init(td_model_t *m, uint64_t seed) {
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  memset(m->params, 0, td_layout_numel(m->layout) * sizeof(float));
  for (int l = 0; l < m->n_layers; l++) {
    const td__layer_t *layer = &m->layers[l];
    float *w = m->params + layer->weight_offset;
    size_t n = (size_t)layer->in * (size_t)layer->out;
    if (l + 1 < m->n_layers) { /* followed by a ReLU: He-normal */
      double std = sqrt(2.0 / layer->in);
      for (size_t i = 0; i < n; i++)
        w[i] = (float)(std * td_rng_normal(&rng));
    } else { /* the output layer: Xavier-uniform in [-limit, limit) */
      double limit = sqrt(6.0 / (layer->in + layer->out));
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

static td_act_t layer_act(const td_model_t *m, int l) {
  return l + 1 < m->n_layers ? TD_ACT_RELU : TD_ACT_NONE;
}

static void forward(td_model_t *m, const float *x, int rows) {
  const float *in = x;
  for (int l = 0; l < m->n_layers; l++) {
    td__layer_t *layer = &m->layers[l];
    td_backend_gemm(m->be, false, true, rows, layer->out, layer->in, 1.0f, in, layer->in,
                    m->params + layer->weight_offset, layer->in, 0.0f, layer->y, layer->out);
    td_backend_bias_act(m->be, layer->y, m->params + layer->bias_offset, rows, layer->out,
                        layer_act(m, l));
    in = layer->y;
  }
}

/* Whether n floats are all finite: one branch-free pass (an exponent of all
 * ones, Inf or NaN, carries into the top bit) that vectorises to a few
 * instructions per 64 bytes, about 1% of a training step. */
TD__CLONES
static bool all_finite(const float *restrict x, size_t n) {
  uint32_t carry = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], sizeof bits);
    carry |= (bits & 0x7f800000u) + 0x00800000u;
  }
  return (carry & 0x80000000u) == 0;
}

/* Batches come from datasets and peers, so they are checked before any work:
 * a label outside [0, classes) is TD_ERANGE rather than an out-of-bounds write
 * in the loss, and a NaN or Inf input is TD_ENUMERIC even where every ReLU
 * would clip it and leave the loss finite (0 * Inf in dW would still turn the
 * gradient, and then the parameters of every peer, into NaN). */
static int check_batch(const td_model_t *m, const float *x, const int32_t *y, int rows) {
  if (m == NULL || x == NULL || y == NULL || rows < 1 || rows > m->max_batch)
    return TD_EINVAL;
  int classes = td_model_classes(m);
  for (int r = 0; r < rows; r++)
    if (y[r] < 0 || y[r] >= classes)
      return TD_ERANGE;
  if (!all_finite(x, (size_t)rows * (size_t)m->layers[0].in))
    return TD_ENUMERIC;
  return 0;
}

int td_model_train_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                         double *loss, int *correct) {
  int rc = check_batch(m, x, y, rows);
  if (rc != 0)
    return rc;
  forward(m, x, rows);
  td__layer_t *last = &m->layers[m->n_layers - 1];
  int hits = 0;
  double loss_sum = td_backend_softmax_xent(m->be, last->y, y, last->dy, 1.0f / (float)rows,
                                            rows, last->out, &hits);
  if (!isfinite(loss_sum))
    return TD_ENUMERIC;
  for (int l = m->n_layers - 1; l >= 0; l--) {
    td__layer_t *layer = &m->layers[l];
    const float *in = l > 0 ? m->layers[l - 1].y : x;
    td_backend_act_backward(m->be, layer->dy, layer->y, m->grads + layer->bias_offset, rows,
                            layer->out, layer_act(m, l));
    td_backend_gemm(m->be, true, false, layer->out, layer->in, rows, 1.0f, layer->dy,
                    layer->out, in, layer->in, 0.0f, m->grads + layer->weight_offset,
                    layer->in);
    if (l > 0)
      td_backend_gemm(m->be, false, false, rows, layer->in, layer->out, 1.0f, layer->dy,
                      layer->out, m->params + layer->weight_offset, layer->in, 0.0f,
                      m->layers[l - 1].dy, layer->in);
  }
  if (loss != NULL)
    *loss = loss_sum / rows;
  if (correct != NULL)
    *correct = hits;
  return 0;
}

int td_model_eval_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                        double *loss_sum, int *correct) {
  int rc = check_batch(m, x, y, rows);
  if (rc != 0)
    return rc;
  forward(m, x, rows);
  const td__layer_t *last = &m->layers[m->n_layers - 1];
  int hits = 0;
  double sum = td_backend_softmax_xent(m->be, last->y, y, NULL, 0.0f, rows, last->out, &hits);
  if (!isfinite(sum))
    return TD_ENUMERIC;
  if (loss_sum != NULL)
    *loss_sum += sum;
  if (correct != NULL)
    *correct += hits;
  return 0;
}

double td_model_train_gemm_flops(const td_model_t *m, int rows) {
  double flops = 0.0;
  for (int l = 0; l < m->n_layers; l++) {
    double one_gemm = 2.0 * rows * m->layers[l].in * m->layers[l].out;
    flops += one_gemm * (l > 0 ? 3 : 2); /* forward, dW, and dX except for the first layer */
  }
  return flops;
}

void td_model_gemm_only(td_model_t *m, const float *x, int rows) {
  if (m == NULL || x == NULL || rows < 1 || rows > m->max_batch)
    return;
  const float *in = x;
  for (int l = 0; l < m->n_layers; l++) {
    td__layer_t *layer = &m->layers[l];
    td_backend_gemm(m->be, false, true, rows, layer->out, layer->in, 1.0f, in, layer->in,
                    m->params + layer->weight_offset, layer->in, 0.0f, layer->y, layer->out);
    in = layer->y;
  }
  for (int l = m->n_layers - 1; l >= 0; l--) {
    td__layer_t *layer = &m->layers[l];
    const float *layer_in = l > 0 ? m->layers[l - 1].y : x;
    td_backend_gemm(m->be, true, false, layer->out, layer->in, rows, 1.0f, layer->dy,
                    layer->out, layer_in, layer->in, 0.0f, m->grads + layer->weight_offset,
                    layer->in);
    if (l > 0)
      td_backend_gemm(m->be, false, false, rows, layer->in, layer->out, 1.0f, layer->dy,
                      layer->out, m->params + layer->weight_offset, layer->in, 0.0f,
                      m->layers[l - 1].dy, layer->in);
  }
}
