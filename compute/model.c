/* model.c: models built from a spec string as a list of layers over one
 * parameter buffer, one gradient buffer and one activation block.
 *
 * A spec (grammar in model.h) becomes a list of nodes over tensors
 * (compute/model_build.c; the graph's types are in model_internal.h). A tensor
 * is the per-sample activation t x f (t positions of f features; an image is
 * t = 1, f = c*h*w, channels-first); it owns a value and a gradient slice of
 * the activation block, sized for max_batch at open. Each node is one layer
 * family call through the backend (compute/layer_*.c on the CPU): forward in
 * list order, then softmax cross-entropy on the last tensor writes the logit
 * gradient straight into that tensor's gradient, then backward in reverse
 * order. A node overwrites its input's gradient unless a later node (earlier
 * in backward) already wrote it: the residual stream and other shared inputs
 * are marked `acc` once at build, so no gradient is cleared per step. Dense
 * and conv layers followed by a ReLU fuse it into their bias pass, exactly as
 * the MLP always did, so `mlp:` models compute bit for bit what they did.
 * Parameter gradients are overwritten each step; the tied GPT head writes the
 * token table's gradient first (it is the last layer) and the embedding adds
 * its scatter to it.
 *
 * Memory. On a host backend (the CPU) parameters and gradients are host
 * buffers from td_params_alloc(), which the codecs and the network read in
 * place, and a batch is read where the caller keeps it. On a device backend
 * (td_backend_device_memory) everything a step touches lives on the device:
 * parameters, gradients, activations and the optimizer's state (compute/optim.c
 * allocates it on the same backend); a batch is copied into a pinned staging
 * buffer and uploaded asynchronously on the backend's stream (the previous
 * step's loss, which the host waits for, guarantees the staging buffer is
 * free again), and the parameters have a pinned host copy that moves only
 * when the caller asks: td_model_pull() after a round's steps, td_model_push()
 * (asynchronous) after the caller changed it. Activations are backend memory
 * either way. One model is used by one thread; a step allocates nothing. */
#include "compute/model.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/model_internal.h"
#include "compute/rng.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD__CLONES
#endif


static float *param(td_model_t *m, int index) {
  return index < 0 ? NULL : m->params + td_layout_tensor(m->layout, (size_t)index)->offset;
}
static float *grad(td_model_t *m, int index) {
  return index < 0 ? NULL : m->grads + td_layout_tensor(m->layout, (size_t)index)->offset;
}

static size_t round_up(size_t n) {
  return (n + TD_PARAMS_ALIGN_FLOATS - 1) / TD_PARAMS_ALIGN_FLOATS * TD_PARAMS_ALIGN_FLOATS;
}

/* Floats of the buffers a built graph needs for batches of max_batch: one
 * activation block (tensor values and gradients, not the input's, then every
 * node's aux), and the two work areas. */
static void plan_buffers(const td_model_t *m, int max_batch, size_t *total_out, size_t *work_out,
                         size_t *work2_out) {
  size_t total = 0, work = 1, work2 = 1;
  for (int i = 1; i < m->n_tensors; i++)
    total += 2 * round_up((size_t)max_batch * td__tensor_numel(&m->tensors[i]));
  for (int i = 0; i < m->n_nodes; i++) {
    const td__node_t *n = &m->nodes[i];
    size_t a = round_up((size_t)max_batch * n->aux_floats);
    total += a;
    if (n->kind == N_CONV) {
      size_t out = (size_t)max_batch * td__tensor_numel(&m->tensors[n->out]);
      work = out > work ? out : work;
      work2 = a > work2 ? a : work2;
    }
    if (n->kind == N_ATTN)
      work = a > work ? a : work;
  }
  *total_out = total;
  *work_out = work;
  *work2_out = work2;
}

int td_model_estimate(const char *spec, int batch, uint64_t *params, uint64_t *bytes, char *why,
                      size_t why_len) {
  if (params == NULL || bytes == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output for the estimate");
  if (batch < 1 || batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", batch,
                  TD_MODEL_MAX_BATCH);
  /* build() lays out the graph and the parameter tensors (a few KiB); the
   * buffers it would size are only counted */
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td__model_build(m, spec, why, why_len);
  if (rc >= 0) {
    size_t total, work, work2;
    plan_buffers(m, batch, &total, &work, &work2);
    uint64_t numel = td_layout_numel(m->layout);
    uint64_t input = (uint64_t)batch * td__tensor_numel(&m->tensors[0]) * sizeof(float) +
                     (uint64_t)batch * (uint64_t)m->context * sizeof(int32_t);
    *params = numel;
    *bytes = 2 * numel * sizeof(float) + ((uint64_t)total + work + work2) * sizeof(float) + input;
  }
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
}

/* Floats of one sample's features and int32s of its tokens and targets. */
static size_t input_floats(const td_model_t *m) {
  return m->input == TD_INPUT_FEATURES ? td__tensor_f(&m->tensors[0]) : 0;
}
static size_t input_ints(const td_model_t *m) {
  return m->input == TD_INPUT_TOKENS ? (size_t)m->context : 0;
}

/* A device model's batch buffers: on the device, and their pinned staging
 * (features, then tokens, then targets, max_batch rows each). */
static int alloc_inputs(td_model_t *m) {
  size_t rows = (size_t)m->max_batch, x = rows * input_floats(m) * sizeof(float);
  size_t tok = rows * input_ints(m) * sizeof(int32_t);
  size_t tgt = rows * (size_t)m->context * sizeof(int32_t);
  m->stage = td_backend_host_alloc(m->be, x + tok + tgt);
  m->in_x = x ? td_backend_alloc(m->be, x) : NULL;
  m->in_tokens = tok ? td_backend_alloc(m->be, tok) : NULL;
  m->in_targets = td_backend_alloc(m->be, tgt);
  return m->stage == NULL || (x && m->in_x == NULL) || (tok && m->in_tokens == NULL) ||
                 m->in_targets == NULL
             ? TD_ENOMEM
             : 0;
}

/* The batch the ops read: b itself on a host backend; on a device, b copied
 * into the staging buffer and queued for upload (the step's loss waits for
 * it). b was checked. */
static const td_batch_t *stage_batch(td_model_t *m, const td_batch_t *b, td_batch_t *dev) {
  if (!m->device)
    return b;
  size_t rows = (size_t)b->rows, x = rows * input_floats(m) * sizeof(float);
  size_t tok = rows * input_ints(m) * sizeof(int32_t);
  size_t tgt = rows * (size_t)m->context * sizeof(int32_t);
  char *s = m->stage;
  size_t s_tok = (size_t)m->max_batch * input_floats(m) * sizeof(float);
  size_t s_tgt = s_tok + (size_t)m->max_batch * input_ints(m) * sizeof(int32_t);
  *dev = (td_batch_t){.rows = b->rows};
  if (x && b->x != NULL) {
    memcpy(s, b->x, x);
    td_backend_upload_async(m->be, m->in_x, s, x);
    dev->x = m->in_x;
  }
  if (tok && b->tokens != NULL) {
    memcpy(s + s_tok, b->tokens, tok);
    td_backend_upload_async(m->be, m->in_tokens, s + s_tok, tok);
    dev->tokens = m->in_tokens;
  }
  if (b->targets != NULL) {
    memcpy(s + s_tgt, b->targets, tgt);
    td_backend_upload_async(m->be, m->in_targets, s + s_tgt, tgt);
    dev->targets = m->in_targets;
  }
  return dev;
}

int td_model_open(td_model_t **out, const char *spec, td_backend_t *be, int max_batch,
                  char *why, size_t why_len) {
  if (out == NULL || be == NULL)
    return td_why(why, why_len, TD_EINVAL, "no model pointer or backend");
  *out = NULL;
  if (max_batch < 1 || max_batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", max_batch,
                  TD_MODEL_MAX_BATCH);
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  m->be = be;
  m->max_batch = max_batch;
  int rc = td__model_build(m, spec, why, why_len);
  if (rc < 0) {
    td_model_close(&m);
    return rc;
  }
  bool layers = false;
  for (int i = 0; i < m->n_nodes; i++)
    layers |= m->nodes[i].kind != N_DENSE;
  if (layers && !td_backend_supports_layers(be)) {
    td_model_close(&m);
    return td_why(why, why_len, TD_EDEVICE, "the %s backend has no layer ops for '%s'",
                  td_backend_name(be), spec);
  }
  size_t total, work, work2;
  plan_buffers(m, max_batch, &total, &work, &work2);
  size_t numel = td_layout_numel(m->layout);
  m->device = td_backend_device_memory(be);
  bool device_ok = true;
  if (m->device) {
    m->params = td_backend_alloc(be, numel * sizeof(float));
    m->grads = td_backend_alloc(be, numel * sizeof(float));
    m->host = td_backend_host_alloc(be, numel * sizeof(float));
    device_ok = m->host != NULL && alloc_inputs(m) == 0;
  } else {
    m->params = td_params_alloc(numel);
    m->grads = td_params_alloc(numel);
  }
  m->activations = td_backend_alloc(be, total * sizeof(float));
  m->work = td_backend_alloc(be, work * sizeof(float));
  m->work2 = td_backend_alloc(be, work2 * sizeof(float));
  if (m->params == NULL || m->grads == NULL || m->activations == NULL || m->work == NULL ||
      m->work2 == NULL || !device_ok) {
    td_model_close(&m);
    return td_why(why, why_len, TD_ENOMEM, "cannot build '%s' for batch %d: %s", spec,
                  max_batch, td_strerror(TD_ENOMEM));
  }
  float *next = m->activations;
  for (int i = 1; i < m->n_tensors; i++) {
    size_t floats = round_up((size_t)max_batch * td__tensor_numel(&m->tensors[i]));
    m->tensors[i].v = next;
    m->tensors[i].g = next + floats;
    next += 2 * floats;
  }
  for (int i = 0; i < m->n_nodes; i++) {
    td__node_t *n = &m->nodes[i];
    size_t per = n->aux_floats;
    size_t a = round_up((size_t)max_batch * per);
    if (n->kind == N_POOL && n->pool == TD_POOL_MAX)
      n->idx = (int32_t *)next;
    else if (n->kind == N_LAYERNORM || n->kind == N_GROUPNORM) {
      n->aux = next;
      n->aux2 = next + (size_t)max_batch * per / 2;
    } else
      n->aux = next;
    next += a;
  }
  *out = m;
  return 0;
}

void td_model_close(td_model_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_model_t *m = *self_p;
  if (m->be != NULL) {
    td_backend_free(m->be, m->activations);
    td_backend_free(m->be, m->work);
    td_backend_free(m->be, m->work2);
  }
  if (m->device) {
    td_backend_free(m->be, m->params);
    td_backend_free(m->be, m->grads);
    td_backend_free(m->be, m->in_x);
    td_backend_free(m->be, m->in_tokens);
    td_backend_free(m->be, m->in_targets);
    td_backend_host_free(m->be, m->host);
    td_backend_host_free(m->be, m->stage);
  } else {
    td_params_free(&m->params);
    td_params_free(&m->grads);
  }
  td_layout_free(&m->layout);
  free(m);
  *self_p = NULL;
}

/* Draws in a fixed order (node by node, each weight tensor row-major) from
 * one stream, so the seed alone fixes every bit. Padding is zero, norm scales
 * one. mlp: He-normal, Xavier-uniform for the output layer, zero biases (as
 * it always was). Layer lists (cnn, resnet): PyTorch's default for conv and
 * linear layers, weight and bias U(+-1/sqrt(fan_in)), the init the PyTorch
 * reference recipes were measured with. gpt: N(0, 0.02) for weights and
 * embeddings (0.02 / sqrt(2 LAYERS) for the projections into the residual
 * stream), zero biases. */
void td_model_init(td_model_t *m, uint64_t seed) {
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  float *ops_params = m->params; /* drawn into the host copy, then uploaded */
  m->params = td_model_host_params(m);
  memset(m->params, 0, td_layout_numel(m->layout) * sizeof(float));
  for (int i = 0; i < m->n_nodes; i++) {
    const td__node_t *n = &m->nodes[i];
    if (n->kind == N_LAYERNORM || n->kind == N_GROUPNORM) {
      float *w = param(m, n->w);
      size_t len = td_layout_tensor(m->layout, (size_t)n->w)->numel;
      for (size_t j = 0; j < len; j++)
        w[j] = 1.0f;
      continue;
    }
    if (n->w < 0 || (n->kind == N_DENSE && m->input == TD_INPUT_TOKENS && i == m->n_nodes - 1))
      continue; /* no weights, or the tied head */
    int tensors[2] = {n->w, n->w2};
    for (int k = 0; k < 2 && tensors[k] >= 0; k++) {
      const td_tensor_info_t *ti = td_layout_tensor(m->layout, (size_t)tensors[k]);
      float *w = param(m, tensors[k]);
      size_t len = ti->numel, fan_in = len / ti->shape[0];
      if (n->init == INIT_HE) {
        double std = sqrt(2.0 / (double)fan_in);
        for (size_t j = 0; j < len; j++)
          w[j] = (float)(std * td_rng_normal(&rng));
      } else if (n->init == INIT_TORCH) { /* weight and bias U(+-1/sqrt(fan_in)) */
        double bound = 1.0 / sqrt((double)fan_in);
        for (size_t j = 0; j < len; j++)
          w[j] = (float)(bound * (2.0 * td_rng_uniform(&rng) - 1.0));
        float *bias = param(m, n->b);
        for (size_t j = 0; bias != NULL && j < ti->shape[0]; j++)
          bias[j] = (float)(bound * (2.0 * td_rng_uniform(&rng) - 1.0));
      } else if (n->init == INIT_XAVIER) {
        double limit = sqrt(6.0 / (double)(fan_in + ti->shape[0]));
        for (size_t j = 0; j < len; j++)
          w[j] = (float)(limit * (2.0 * td_rng_uniform(&rng) - 1.0));
      } else {
        double std = n->init == INIT_GPT ? 0.02 : 0.02 / sqrt(2.0 * m->layers);
        for (size_t j = 0; j < len; j++)
          w[j] = (float)(std * td_rng_normal(&rng));
      }
    }
  }
  m->params = ops_params;
  /* a device failure is kept by the backend and reported by the next transfer */
  if (m->device)
    td_backend_upload(m->be, m->params, m->host, td_layout_numel(m->layout) * sizeof(float));
}

float *td_model_host_params(td_model_t *m) { return m->device ? m->host : m->params; }

int td_model_pull(td_model_t *m, char *why, size_t why_len) {
  if (!m->device)
    return 0;
  int rc = td_backend_download(m->be, m->host, m->params,
                               td_layout_numel(m->layout) * sizeof(float));
  return rc != 0 ? td_backend_error(m->be, why, why_len) : 0;
}

int td_model_push(td_model_t *m, char *why, size_t why_len) {
  if (!m->device)
    return 0;
  int rc = td_backend_upload_async(m->be, m->params, m->host,
                                   td_layout_numel(m->layout) * sizeof(float));
  return rc != 0 ? td_backend_error(m->be, why, why_len) : 0;
}

const td_layout_t *td_model_layout(const td_model_t *m) { return m->layout; }
size_t td_model_numel(const td_model_t *m) { return td_layout_numel(m->layout); }
float *td_model_params(td_model_t *m) { return m->params; }
float *td_model_grads(td_model_t *m) { return m->grads; }
int td_model_input_dim(const td_model_t *m) {
  return m->input == TD_INPUT_TOKENS ? m->context : (int)td__tensor_f(&m->tensors[0]);
}
int td_model_classes(const td_model_t *m) {
  return (int)td__tensor_f(&m->tensors[m->nodes[m->n_nodes - 1].out]);
}
int td_model_max_batch(const td_model_t *m) { return m->max_batch; }
td_input_kind_t td_model_input_kind(const td_model_t *m) { return m->input; }
int td_model_context(const td_model_t *m) { return m->context; }

/* ---- forward and backward ---- */

/* A convolution is one GEMM over the whole batch: the columns of every image
 * side by side (K x rows*P, K = c*k*k, P = ho*wo), so y = W cols comes out
 * channel-major (cout x rows x P) in the workspace and one swap puts it back
 * batch-major. Backward swaps dy the other way and runs dW = dy cols^T and
 * dcols = W^T dy as two more GEMMs of the same size: large GEMMs that BLAS
 * runs well on one thread and splits well over several. */
static void conv_forward(td_model_t *m, td__node_t *n, const float *x, float *y, int rows) {
  td_conv_geom_t g = n->geom;
  int k = g.c * g.k * g.k, plane = g.ho * g.wo, cout = m->tensors[n->out].c;
  int cols = rows * plane;
  g.ld = cols;
  td_backend_im2col_batch(m->be, n->aux, x, rows, &g);
  td_backend_gemm(m->be, false, false, cout, cols, k, 1.0f, param(m, n->w), k, n->aux, cols,
                  0.0f, m->work, cols);
  td_backend_swap01(m->be, y, m->work, cout, rows, plane);
  td_backend_channel_bias_act(m->be, y, param(m, n->b), rows, cout, plane, n->act);
}

static void conv_backward(td_model_t *m, td__node_t *n, float *dx, float *dy, const float *y,
                          int rows) {
  td_conv_geom_t g = n->geom;
  int k = g.c * g.k * g.k, plane = g.ho * g.wo, cout = m->tensors[n->out].c;
  int cols = rows * plane;
  g.ld = cols;
  td_backend_channel_act_backward(m->be, dy, y, grad(m, n->b), rows, cout, plane, n->act);
  td_backend_swap01(m->be, m->work, dy, rows, cout, plane);
  td_backend_gemm(m->be, false, true, cout, k, cols, 1.0f, m->work, cols, n->aux, cols, 0.0f,
                  grad(m, n->w), k);
  if (dx == NULL)
    return;
  td_backend_gemm(m->be, true, false, k, cols, cout, 1.0f, param(m, n->w), k, m->work, cols,
                  0.0f, m->work2, cols);
  td_backend_col2im_batch(m->be, dx, m->work2, rows, &g, n->acc);
}

static void forward(td_model_t *m, const td_batch_t *batch, bool train) {
  int rows = batch->rows;
  m->tensors[0].v = (float *)batch->x; /* read only: no node writes its input */
  for (int i = 0; i < m->n_nodes; i++) {
    td__node_t *n = &m->nodes[i];
    td__tensor_t *o = &m->tensors[n->out];
    const float *x = n->in >= 0 ? m->tensors[n->in].v : NULL;
    size_t count = (size_t)rows * td__tensor_numel(o);
    int r = rows * o->t;
    switch (n->kind) {
    case N_DENSE: {
      int in = (int)td__tensor_f(&m->tensors[n->in]), units = o->c;
      td_backend_gemm(m->be, false, true, r, units, in, 1.0f, x, in, param(m, n->w), in, 0.0f,
                      o->v, units);
      if (n->b >= 0)
        td_backend_bias_act(m->be, o->v, param(m, n->b), r, units, n->act);
      break;
    }
    case N_CONV:
      conv_forward(m, n, x, o->v, rows);
      break;
    case N_ATTN:
      td_backend_attention_forward(m->be, o->v, n->aux, x, rows, o->t, o->c, n->heads);
      break;
    default:
      switch (n->kind) {
      case N_POOL:
        td_backend_pool_forward(m->be, o->v, n->idx, x, rows, &n->geom, n->pool);
        break;
      case N_LAYERNORM:
        td_backend_layernorm_forward(m->be, o->v, n->aux, n->aux2, x, param(m, n->w),
                                     param(m, n->b), r, o->c * o->h * o->w);
        break;
      case N_GROUPNORM:
        td_backend_groupnorm_forward(m->be, o->v, n->aux, n->aux2, x, param(m, n->w),
                                     param(m, n->b), rows, o->c, o->h * o->w, n->groups);
        break;
      case N_ACT:
        td_backend_act_forward(m->be, o->v, x, count, n->act);
        break;
      case N_DROPOUT:
        if (train && n->p > 0.0f)
          td_backend_dropout_forward(m->be, o->v, n->aux, x, count, n->p,
                                     m->steps * 0x9E3779B97F4A7C15ull + (uint64_t)i);
        else
          td_backend_add(m->be, o->v, x, NULL, count);
        break;
      case N_ADD:
        td_backend_add(m->be, o->v, x, m->tensors[n->in2].v, count);
        break;
      case N_EMBED:
        td_backend_embed_forward(m->be, o->v, batch->tokens, param(m, n->w), param(m, n->w2),
                                 rows, o->t, o->c);
        break;
      default:
        break;
      }
    }
  }
}

static void backward(td_model_t *m, const td_batch_t *batch) {
  int rows = batch->rows;
  for (int i = m->n_nodes - 1; i >= 0; i--) {
    td__node_t *n = &m->nodes[i];
    td__tensor_t *o = &m->tensors[n->out];
    const float *x = n->in >= 0 ? m->tensors[n->in].v : NULL;
    float *dx = n->in > 0 ? m->tensors[n->in].g : NULL; /* tensor 0 is data: no gradient */
    size_t count = (size_t)rows * td__tensor_numel(o);
    int r = rows * o->t;
    switch (n->kind) {
    case N_DENSE: {
      int in = (int)td__tensor_f(&m->tensors[n->in]), units = o->c;
      if (n->b >= 0)
        td_backend_act_backward(m->be, o->g, o->v, grad(m, n->b), r, units, n->act);
      td_backend_gemm(m->be, true, false, units, in, r, 1.0f, o->g, units, x, in, 0.0f,
                      grad(m, n->w), in);
      if (dx != NULL)
        td_backend_gemm(m->be, false, false, r, in, units, 1.0f, o->g, units, param(m, n->w),
                        in, n->acc ? 1.0f : 0.0f, dx, in);
      break;
    }
    case N_CONV:
      conv_backward(m, n, dx, o->g, o->v, rows);
      break;
    case N_ATTN:
      td_backend_attention_backward(m->be, dx, m->work, o->g, x, n->aux, rows, o->t, o->c,
                                    n->heads);
      break;
    default:
      switch (n->kind) {
      case N_POOL:
        if (dx != NULL)
          td_backend_pool_backward(m->be, dx, o->g, n->idx, rows, &n->geom, n->pool, n->acc);
        break;
      case N_LAYERNORM:
        td_backend_layernorm_backward(m->be, dx, grad(m, n->w), grad(m, n->b), o->g, x,
                                      param(m, n->w), n->aux, n->aux2, r, o->c * o->h * o->w,
                                      n->acc);
        break;
      case N_GROUPNORM:
        td_backend_groupnorm_backward(m->be, dx, grad(m, n->w), grad(m, n->b), o->g, x,
                                      param(m, n->w), n->aux, n->aux2, rows, o->c, o->h * o->w,
                                      n->groups, n->acc);
        break;
      case N_ACT:
        if (dx != NULL)
          td_backend_act_backward2(m->be, dx, o->g, x, count, n->act, n->acc);
        break;
      case N_DROPOUT:
        if (dx != NULL && n->p > 0.0f)
          td_backend_dropout_backward(m->be, dx, o->g, n->aux, count, n->acc);
        else if (dx != NULL)
          td_backend_add(m->be, dx, o->g, n->acc ? dx : NULL, count);
        break;
      case N_ADD:
        if (dx != NULL)
          td_backend_add(m->be, dx, o->g, n->acc ? dx : NULL, count);
        if (n->in2 > 0)
          td_backend_add(m->be, m->tensors[n->in2].g, o->g,
                         n->acc2 ? m->tensors[n->in2].g : NULL, count);
        break;
      case N_EMBED:
        td_backend_embed_backward(m->be, grad(m, n->w), grad(m, n->w2), o->g, batch->tokens,
                                  rows, o->t, o->c);
        break;
      default:
        break;
      }
    }
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
 * a label or token outside its range is TD_ERANGE rather than an out-of-bounds
 * access, and a NaN or Inf input is TD_ENUMERIC even where every ReLU would
 * clip it and leave the loss finite (0 * Inf in dW would still turn the
 * gradient, and then the parameters of every peer, into NaN). */
static int check_batch(const td_model_t *m, const td_batch_t *b) {
  if (m == NULL || b == NULL || b->targets == NULL || b->rows < 1 || b->rows > m->max_batch)
    return TD_EINVAL;
  int classes = td_model_classes(m);
  size_t positions = (size_t)b->rows * (size_t)m->context;
  for (size_t r = 0; r < positions; r++)
    if (b->targets[r] < 0 || b->targets[r] >= classes)
      return TD_ERANGE;
  if (m->input == TD_INPUT_TOKENS) {
    if (b->tokens == NULL)
      return TD_EINVAL;
    for (size_t r = 0; r < positions; r++)
      if (b->tokens[r] < 0 || b->tokens[r] >= TD__VOCAB)
        return TD_ERANGE;
    return 0;
  }
  if (b->x == NULL)
    return TD_EINVAL;
  if (!all_finite(b->x, (size_t)b->rows * td__tensor_f(&m->tensors[0])))
    return TD_ENUMERIC;
  return 0;
}

int td_model_train(td_model_t *m, const td_batch_t *batch, double *loss, int *correct) {
  int rc = check_batch(m, batch);
  if (rc != 0)
    return rc;
  td_batch_t staged;
  batch = stage_batch(m, batch, &staged);
  forward(m, batch, true);
  m->steps++;
  td__tensor_t *last = &m->tensors[m->nodes[m->n_nodes - 1].out];
  int positions = batch->rows * m->context, hits = 0;
  double loss_sum = td_backend_softmax_xent(m->be, last->v, batch->targets, last->g,
                                            1.0f / (float)positions, positions, last->c, &hits);
  if (!isfinite(loss_sum))
    return TD_ENUMERIC;
  backward(m, batch);
  if (loss != NULL)
    *loss = loss_sum / positions;
  if (correct != NULL)
    *correct = hits;
  return 0;
}

int td_model_eval(td_model_t *m, const td_batch_t *batch, double *loss_sum, int *correct) {
  int rc = check_batch(m, batch);
  if (rc != 0)
    return rc;
  td_batch_t staged;
  batch = stage_batch(m, batch, &staged);
  forward(m, batch, false);
  const td__tensor_t *last = &m->tensors[m->nodes[m->n_nodes - 1].out];
  int hits = 0;
  double sum = td_backend_softmax_xent(m->be, last->v, batch->targets, NULL, 0.0f,
                                       batch->rows * m->context, last->c, &hits);
  if (!isfinite(sum))
    return TD_ENUMERIC;
  if (loss_sum != NULL)
    *loss_sum += sum;
  if (correct != NULL)
    *correct += hits;
  return 0;
}

const float *td_model_logits(const td_model_t *m) {
  return m->device ? NULL : m->tensors[m->nodes[m->n_nodes - 1].out].v;
}

int td_model_train_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                         double *loss, int *correct) {
  if (m != NULL && m->input != TD_INPUT_FEATURES)
    return TD_EINVAL;
  td_batch_t b = {.rows = rows, .x = x, .targets = y};
  return td_model_train(m, &b, loss, correct);
}

int td_model_eval_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                        double *loss_sum, int *correct) {
  if (m != NULL && m->input != TD_INPUT_FEATURES)
    return TD_EINVAL;
  td_batch_t b = {.rows = rows, .x = x, .targets = y};
  return td_model_eval(m, &b, loss_sum, correct);
}

/* A GEMM made once on packed operands. */
static td_model_gemm_t packed(bool trans_a, bool trans_b, int m, int n, int k) {
  return (td_model_gemm_t){.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                           .lda = trans_a ? m : k, .ldb = trans_b ? k : n, .ldc = n,
                           .repeat = 1};
}

static void add_gemm(td_model_gemm_t *out, size_t cap, size_t *count, td_model_gemm_t g) {
  if (*count < cap)
    out[*count] = g;
  (*count)++;
}

/* The calls of forward() and backward() above, in their order; attention's
 * kernel makes its six per (image, head) itself (2 forward, 4 backward). */
size_t td_model_train_gemms(const td_model_t *m, int rows, td_model_gemm_t *out, size_t cap) {
  size_t count = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < m->n_nodes; j++) {
      const td__node_t *n = &m->nodes[pass == 0 ? j : m->n_nodes - 1 - j];
      const td__tensor_t *o = &m->tensors[n->out];
      bool dx = n->in > 0; /* tensor 0 is data: no gradient */
      if (n->kind == N_DENSE) {
        int r = rows * o->t, in = (int)td__tensor_f(&m->tensors[n->in]), units = o->c;
        if (pass == 0) {
          add_gemm(out, cap, &count, packed(false, true, r, units, in));
          continue;
        }
        add_gemm(out, cap, &count, packed(true, false, units, in, r));
        if (dx)
          add_gemm(out, cap, &count, packed(false, false, r, in, units));
      } else if (n->kind == N_CONV) {
        int k = n->geom.c * n->geom.k * n->geom.k, cols = rows * n->geom.ho * n->geom.wo;
        if (pass == 0) {
          add_gemm(out, cap, &count, packed(false, false, o->c, cols, k));
          continue;
        }
        add_gemm(out, cap, &count, packed(false, true, o->c, k, cols));
        if (dx)
          add_gemm(out, cap, &count, packed(true, false, k, cols, o->c));
      } else if (n->kind == N_ATTN && pass == 1) {
        /* per head: scores from q and k (rows of qkv, 3c apart), p v, then
         * dv, dp, dq and dk, as the kernel splits them over (image, head) */
        int t = o->t, c = o->c, d = c / n->heads, ld = 3 * c;
        size_t pairs = (size_t)rows * (size_t)n->heads;
        td_model_gemm_t attn[6] = {
            {false, true, t, t, d, ld, ld, t, pairs},  {false, false, t, d, t, t, ld, c, pairs},
            {true, false, t, d, t, t, c, ld, pairs},   {false, true, t, t, d, c, ld, t, pairs},
            {false, false, t, d, t, t, ld, ld, pairs}, {true, false, t, d, t, t, ld, ld, pairs},
        };
        for (int g = 0; g < 6; g++)
          add_gemm(out, cap, &count, attn[g]);
      }
    }
  return count;
}

double td_model_train_gemm_flops(const td_model_t *m, int rows) {
  size_t count = td_model_train_gemms(m, rows, NULL, 0);
  td_model_gemm_t *list = malloc(count * sizeof *list);
  double flops = 0.0;
  if (list == NULL)
    return 0.0;
  td_model_train_gemms(m, rows, list, count);
  for (size_t i = 0; i < count; i++)
    flops += 2.0 * list[i].m * list[i].n * list[i].k * (double)list[i].repeat;
  free(list);
  return flops;
}
