/* onnx.c: the model a spec builds, written out as an ONNX inference graph
 * (onnx.h).
 *
 * The spec is built into the same node graph the trainer runs
 * (td__model_build, compute/model_internal.h; no buffers), and each node
 * becomes the ONNX operators that compute what the CPU kernels compute:
 * dense = Gemm (transB) or, on gpt's [batch, T, W] rows, MatMul with the
 * transposed weight + Add; conv = Conv; pools = MaxPool / AveragePool (no
 * padding, floor); layernorm = LayerNormalization (eps 1e-5, over every
 * feature of a sample, or of a position for gpt); groupnorm = Reshape to
 * [batch, G, -1] + InstanceNormalization (eps 1e-5, unit scale) + Reshape back
 * + the per-channel weight and bias; GELU = 0.5 x (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))) from Mul, Add and Tanh; attention = Split of qkv, per-head
 * MatMul scaled by 1/sqrt(d), a causal mask added before Softmax; dropout is
 * the identity at inference. Every ONNX value the builder makes lives in one
 * arena, freed at once; the initializers' bytes are copied little-endian. */
#include "compute/onnx.h"

#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/dataset.h"
#include "compute/model_internal.h"
#include "proto/onnx.pb-c.h"

#define TD__ONNX_IR_VERSION 8 /* the IR of opset 17 (ONNX 1.12) */
#define TD__NORM_EPS 1e-5f    /* as compute/cpu/layer_norm.c */
#define TD__GELU_K 0.7978845608028654f
#define TD__MASKED (-1e9f) /* added to a future position's score: exp() of it is 0 */
#define TD__ONNX_MAX_BYTES ((size_t)2047 << 20) /* protobuf's 2 GiB, less room for the graph */

typedef struct {
  void **blocks; /* every allocation, freed together */
  size_t n_blocks, cap_blocks;
  Onnx__NodeProto **nodes;
  size_t n_nodes, cap_nodes;
  Onnx__TensorProto **inits;
  size_t n_inits, cap_inits;
  unsigned counter; /* for fresh value names */
  bool oom;
} graph_t;

/* arr (of *cap elements of elem bytes) with room for need: arr itself, a
 * larger copy (*cap updated), or NULL (arr untouched) when out of memory. */
static void *grow(void *arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return arr;
  size_t cap2 = *cap ? *cap * 2 : 64;
  void *p = realloc(arr, cap2 * elem);
  if (p != NULL)
    *cap = cap2;
  return p;
}

static void *g_alloc(graph_t *g, size_t bytes) {
  void **blocks =
      g->oom ? NULL : grow(g->blocks, &g->cap_blocks, g->n_blocks + 1, sizeof *g->blocks);
  void *p = NULL;
  if (blocks != NULL) {
    g->blocks = blocks;
    p = calloc(1, bytes > 0 ? bytes : 1);
  }
  if (p == NULL) {
    g->oom = true;
    return NULL;
  }
  g->blocks[g->n_blocks++] = p;
  return p;
}

static void graph_free(graph_t *g) {
  for (size_t i = 0; i < g->n_blocks; i++)
    free(g->blocks[i]);
  free(g->blocks);
  free(g->nodes);
  free(g->inits);
}

__attribute__((format(printf, 2, 3))) static char *g_str(graph_t *g, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *s = g_alloc(g, strlen(buf) + 1);
  if (s != NULL)
    memcpy(s, buf, strlen(buf) + 1);
  return s;
}

/* One node op_type(in...) -> n_out fresh outputs named after stem; the node
 * is the graph's last until the next call (attributes go on it). */
static Onnx__NodeProto *g_node(graph_t *g, const char *op_type, const char *stem,
                               const char *const *in, size_t n_in, size_t n_out) {
  Onnx__NodeProto *n = g_alloc(g, sizeof *n);
  char **ins = g_alloc(g, n_in * sizeof *ins), **outs = g_alloc(g, n_out * sizeof *outs);
  Onnx__NodeProto **nodes =
      g->oom ? NULL : grow(g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes);
  if (n == NULL || ins == NULL || outs == NULL || nodes == NULL) {
    g->oom = true;
    return NULL;
  }
  g->nodes = nodes;
  onnx__node_proto__init(n);
  unsigned id = g->counter++;
  for (size_t i = 0; i < n_in; i++) {
    if (in[i] == NULL) { /* an earlier step ran out of memory */
      g->oom = true;
      return NULL;
    }
    ins[i] = (char *)(uintptr_t)in[i];
  }
  for (size_t i = 0; i < n_out; i++)
    outs[i] = n_out == 1 ? g_str(g, "%s_%u", stem, id) : g_str(g, "%s_%u_%zu", stem, id, i);
  n->input = ins;
  n->n_input = n_in;
  n->output = outs;
  n->n_output = n_out;
  n->op_type = (char *)(uintptr_t)op_type;
  n->name = g_str(g, "%s_%u", op_type, id);
  g->nodes[g->n_nodes++] = n;
  return g->oom ? NULL : n;
}

/* op_type(a[, b[, c]]) with one output; its name, or NULL once out of memory. */
static const char *op3(graph_t *g, const char *op_type, const char *stem, const char *a,
                       const char *b, const char *c) {
  const char *in[3] = {a, b, c};
  size_t n_in = c != NULL ? 3 : b != NULL ? 2 : 1;
  Onnx__NodeProto *n = g_node(g, op_type, stem, in, n_in, 1);
  return n != NULL ? n->output[0] : NULL;
}
#define op1(g, type, stem, a) op3(g, type, stem, a, NULL, NULL)
#define op2(g, type, stem, a, b) op3(g, type, stem, a, b, NULL)

static Onnx__AttributeProto *g_attr(graph_t *g, const char *name) {
  Onnx__NodeProto *n = g->n_nodes > 0 && !g->oom ? g->nodes[g->n_nodes - 1] : NULL;
  Onnx__AttributeProto *a = g_alloc(g, sizeof *a);
  Onnx__AttributeProto **list = n != NULL ? g_alloc(g, (n->n_attribute + 1) * sizeof *list) : NULL;
  if (a == NULL || list == NULL)
    return NULL;
  onnx__attribute_proto__init(a);
  a->name = (char *)(uintptr_t)name;
  if (n->n_attribute > 0)
    memcpy(list, n->attribute, n->n_attribute * sizeof *list);
  list[n->n_attribute] = a;
  n->attribute = list;
  n->n_attribute++;
  return a;
}

static void attr_int(graph_t *g, const char *name, int64_t v) {
  Onnx__AttributeProto *a = g_attr(g, name);
  if (a != NULL) {
    a->has_type = a->has_i = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->i = v;
  }
}

static void attr_float(graph_t *g, const char *name, float v) {
  Onnx__AttributeProto *a = g_attr(g, name);
  if (a != NULL) {
    a->has_type = a->has_f = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->f = v;
  }
}

static void attr_ints(graph_t *g, const char *name, size_t n, const int64_t *v) {
  Onnx__AttributeProto *a = g_attr(g, name);
  int64_t *copy = g_alloc(g, n * sizeof *copy);
  if (a != NULL && copy != NULL) {
    memcpy(copy, v, n * sizeof *copy);
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->ints = copy;
    a->n_ints = n;
  }
}

static const Onnx__TensorProto *find_init(const graph_t *g, const char *name) {
  for (size_t i = 0; i < g->n_inits; i++)
    if (strcmp(g->inits[i]->name, name) == 0)
      return g->inits[i];
  return NULL;
}

static Onnx__TensorProto *g_init(graph_t *g, const char *name, int32_t type, size_t ndim,
                                 const int64_t *dims, size_t bytes) {
  Onnx__TensorProto *t = g_alloc(g, sizeof *t);
  int64_t *d = g_alloc(g, ndim * sizeof *d);
  uint8_t *raw = g_alloc(g, bytes);
  char *nm = g_str(g, "%s", name);
  Onnx__TensorProto **inits =
      g->oom ? NULL : grow(g->inits, &g->cap_inits, g->n_inits + 1, sizeof *g->inits);
  if (t == NULL || d == NULL || raw == NULL || nm == NULL || inits == NULL) {
    g->oom = true;
    return NULL;
  }
  g->inits = inits;
  onnx__tensor_proto__init(t);
  if (ndim > 0) /* a scalar has no dims (and dims may be NULL) */
    memcpy(d, dims, ndim * sizeof *d);
  t->dims = d;
  t->n_dims = ndim;
  t->has_data_type = true;
  t->data_type = type;
  t->name = nm;
  t->has_raw_data = true;
  t->raw_data.data = raw;
  t->raw_data.len = bytes;
  g->inits[g->n_inits++] = t;
  return t;
}

/* An initializer of float32 values, little-endian whatever the host. */
static const char *init_f32(graph_t *g, const char *name, size_t ndim, const int64_t *dims,
                            const float *v, size_t count) {
  Onnx__TensorProto *t =
      g_init(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims, count * 4);
  if (t == NULL)
    return NULL;
  for (size_t i = 0; i < count; i++) {
    uint32_t u;
    memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; b++)
      t->raw_data.data[4 * i + (size_t)b] = (uint8_t)(u >> (8 * b));
  }
  return t->name;
}

static const char *const_f32(graph_t *g, const char *name, float v) {
  const Onnx__TensorProto *t = find_init(g, name);
  return t != NULL ? t->name : init_f32(g, name, 0, NULL, &v, 1);
}

/* A 1-D int64 constant (a shape, a split), named after its values. */
static const char *const_i64(graph_t *g, size_t n, const int64_t *v) {
  char name[128] = "shape";
  size_t len = strlen(name);
  for (size_t i = 0; i < n && len < sizeof name; i++)
    len += (size_t)snprintf(name + len, sizeof name - len, "_%" PRId64, v[i]);
  if (len >= sizeof name) { /* not reached: at most five small values */
    g->oom = true;
    return NULL;
  }
  const Onnx__TensorProto *t = find_init(g, name);
  if (t != NULL)
    return t->name;
  int64_t dim = (int64_t)n;
  Onnx__TensorProto *nt =
      g_init(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, &dim, n * sizeof(int64_t));
  if (nt == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 8; b++)
      nt->raw_data.data[8 * i + (size_t)b] = (uint8_t)((uint64_t)v[i] >> (8 * b));
  return nt->name;
}

static const char *reshape(graph_t *g, const char *x, size_t n, const int64_t *shape) {
  return op2(g, "Reshape", "reshape", x, const_i64(g, n, shape));
}

static const char *transpose(graph_t *g, const char *x, size_t n, const int64_t *perm) {
  const char *y = op1(g, "Transpose", "transpose", x);
  attr_ints(g, "perm", n, perm);
  return y;
}

static const char *gelu(graph_t *g, const char *x) {
  const char *x3 = op2(g, "Mul", "gelu_x3", op2(g, "Mul", "gelu_x2", x, x), x);
  const char *inner = op2(g, "Add", "gelu_inner", x,
                          op2(g, "Mul", "gelu_cubic", x3, const_f32(g, "gelu_c", 0.044715f)));
  const char *t = op1(g, "Tanh", "gelu_tanh",
                      op2(g, "Mul", "gelu_u", inner, const_f32(g, "gelu_k", TD__GELU_K)));
  return op2(g, "Mul", "gelu", op2(g, "Mul", "gelu_half_x", x, const_f32(g, "half", 0.5f)),
             op2(g, "Add", "gelu_gate", t, const_f32(g, "one", 1.0f)));
}

static const char *activation(graph_t *g, const char *x, td_act_t act) {
  return act == TD_ACT_RELU ? op1(g, "Relu", "relu", x) : act == TD_ACT_GELU ? gelu(g, x) : x;
}

static const char *flat(graph_t *g, const char *x, int *rank) {
  if (*rank != 4)
    return x;
  *rank = 2;
  const char *y = op1(g, "Flatten", "flatten", x);
  attr_int(g, "axis", 1);
  return y;
}

/* Causal multi-head attention on qkv [batch, T, 3C] (q, k, v in that order,
 * head h at h*C/H of each), as compute/cpu/layer_attn.c: softmax(q k^T /
 * sqrt(d) over j <= i) v, back to [batch, T, C]. */
static const char *attention(graph_t *g, const char *qkv, int t, int c, int heads) {
  int64_t d = c / heads;
  Onnx__NodeProto *split = g_node(g, "Split", "qkv", &qkv, 1, 3);
  if (split == NULL)
    return NULL;
  attr_int(g, "axis", 2);
  const int64_t heads_shape[4] = {0, t, heads, d}, to_heads[4] = {0, 2, 1, 3},
                k_perm[4] = {0, 2, 3, 1}, back[3] = {0, t, c};
  const char *q = transpose(g, reshape(g, split->output[0], 4, heads_shape), 4, to_heads);
  const char *k = transpose(g, reshape(g, split->output[1], 4, heads_shape), 4, k_perm);
  const char *v = transpose(g, reshape(g, split->output[2], 4, heads_shape), 4, to_heads);
  char name[32];
  snprintf(name, sizeof name, "causal_mask_%d", t);
  const char *mask = find_init(g, name) != NULL ? find_init(g, name)->name : NULL;
  if (mask == NULL) {
    float *m = malloc((size_t)t * (size_t)t * sizeof *m);
    if (m == NULL) {
      g->oom = true;
      return NULL;
    }
    for (int i = 0; i < t; i++)
      for (int j = 0; j < t; j++)
        m[(size_t)i * (size_t)t + (size_t)j] = j <= i ? 0.0f : TD__MASKED;
    const int64_t dims[2] = {t, t};
    mask = init_f32(g, name, 2, dims, m, (size_t)t * (size_t)t);
    free(m);
  }
  char scale_name[32];
  snprintf(scale_name, sizeof scale_name, "attn_scale_%" PRId64, d);
  const char *scores = op2(g, "Mul", "scores", op2(g, "MatMul", "qk", q, k),
                           const_f32(g, scale_name, 1.0f / sqrtf((float)d)));
  const char *p = op1(g, "Softmax", "probs", op2(g, "Add", "masked", scores, mask));
  attr_int(g, "axis", -1);
  const char *y = op2(g, "MatMul", "pv", p, v);
  return reshape(g, transpose(g, y, 4, to_heads), 3, back);
}

/* The stored tensor list must be the spec's layout: same names, shapes and
 * order, every tensor inside the buffer. */
static int check_tensors(const td_layout_t *layout, const td_onnx_opts_t *o, char *why,
                         size_t why_len) {
  size_t n = td_layout_count(layout);
  if (o->n_tensors != n)
    return td_why(why, why_len, TD_ESHAPE,
                  "the stored model has %zu tensors, the model '%s' lays out %zu", o->n_tensors,
                  o->spec, n);
  for (size_t i = 0; i < n; i++) {
    const td_tensor_info_t *want = td_layout_tensor(layout, i);
    const td_st_tensor_t *have = &o->tensors[i];
    bool same =
        have->name != NULL && strcmp(have->name, want->name) == 0 && have->ndim == want->ndim;
    for (uint32_t d = 0; same && d < want->ndim; d++)
      same = have->shape[d] == want->shape[d];
    char a[96] = "", b[96] = "";
    size_t la = 0, lb = 0;
    for (uint32_t d = 0; !same && d < have->ndim && d < TD_ST_MAX_DIMS && la < sizeof a; d++)
      la += (size_t)snprintf(a + la, sizeof a - la, "%s%" PRIu64, d ? "," : "", have->shape[d]);
    for (uint32_t d = 0; !same && d < want->ndim && lb < sizeof b; d++)
      lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%u", d ? "," : "", want->shape[d]);
    if (!same)
      return td_why(why, why_len, TD_ESHAPE,
                    "stored tensor %zu is %s [%s], the model '%s' wants %s [%s] there", i,
                    have->name ? have->name : "(unnamed)", a, o->spec, want->name, b);
    if (have->offset > o->floats || want->numel > o->floats - have->offset)
      return td_why(why, why_len, TD_ESHAPE,
                    "stored tensor %s lies past the end of the stored %zu floats", want->name,
                    o->floats);
  }
  return 0;
}

int td_onnx_check(const td_onnx_opts_t *o, char *why, size_t why_len) {
  if (o == NULL || o->spec == NULL || (o->n_tensors > 0 && o->tensors == NULL))
    return td_why(why, why_len, TD_EINVAL, "nothing to check");
  td_layout_t *layout = NULL;
  int rc = td_model_spec_layout(o->spec, &layout, why, why_len);
  if (rc == 0)
    rc = check_tensors(layout, o, why, why_len);
  td_layout_free(&layout);
  return rc;
}

static Onnx__ValueInfoProto *value_info(graph_t *g, const char *name, int32_t elem, size_t ndim,
                                        const int64_t *dims, const char *doc) {
  Onnx__ValueInfoProto *vi = g_alloc(g, sizeof *vi);
  Onnx__TypeProto *type = g_alloc(g, sizeof *type);
  Onnx__TypeProto__Tensor *tt = g_alloc(g, sizeof *tt);
  Onnx__TensorShapeProto *shape = g_alloc(g, sizeof *shape);
  Onnx__TensorShapeProto__Dimension **dim = g_alloc(g, ndim * sizeof *dim);
  if (vi == NULL || type == NULL || tt == NULL || shape == NULL || dim == NULL)
    return NULL;
  onnx__value_info_proto__init(vi);
  onnx__type_proto__init(type);
  onnx__type_proto__tensor__init(tt);
  onnx__tensor_shape_proto__init(shape);
  for (size_t i = 0; i < ndim; i++) {
    dim[i] = g_alloc(g, sizeof *dim[i]);
    if (dim[i] == NULL)
      return NULL;
    onnx__tensor_shape_proto__dimension__init(dim[i]);
    if (i == 0) { /* the batch: any size */
      dim[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      dim[i]->dim_param = (char *)"batch";
    } else {
      dim[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dim[i]->dim_value = dims[i];
    }
  }
  shape->dim = dim;
  shape->n_dim = ndim;
  tt->has_elem_type = true;
  tt->elem_type = elem;
  tt->shape = shape;
  type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  type->tensor_type = tt;
  vi->name = (char *)(uintptr_t)name;
  vi->type = type;
  vi->doc_string = doc != NULL ? g_str(g, "%s", doc) : NULL;
  return vi;
}

/* The graph of m into g: its input and output value infos into *in / *out. */
static void build_graph(graph_t *g, const td_model_t *m, const td_onnx_opts_t *o,
                        const char **param_name, Onnx__ValueInfoProto **in,
                        Onnx__ValueInfoProto **out) {
  const char *val[TD__MAX_TENSORS] = {NULL};
  int rank[TD__MAX_TENSORS] = {0};
  size_t n_params = td_layout_count(m->layout);
  const char **transposed = g_alloc(g, n_params * sizeof *transposed);
  if (transposed == NULL)
    return;
  bool tokens = m->input == TD_INPUT_TOKENS;
  const td__tensor_t *x0 = &m->tensors[0];
  char doc[512];
  if (tokens) {
    const int64_t dims[2] = {0, m->context};
    snprintf(doc, sizeof doc,
             "byte ids (0..255), int64, [batch, %d]: %d positions; causal, so a shorter text may "
             "be padded at the end and read at its own positions",
             m->context, m->context);
    *in = value_info(g, "tokens", ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 2, dims, doc);
    val[0] = "tokens";
    rank[0] = 2;
  } else {
    const int64_t image[4] = {0, x0->c, x0->h, x0->w},
                  flat_dims[2] = {0, (int64_t)td__tensor_f(x0)};
    size_t len = (size_t)snprintf(
        doc, sizeof doc, "float32 %s as the dataset reader yields them (IDX pixels: byte / 255)",
        x0->image ? "images [batch, C, H, W]" : "features [batch, F]");
    if (o->normalize)
      snprintf(doc + len, sizeof doc - len,
               "; the graph first applies the training set's normalisation (x - %.9g) / %.9g "
               "(metadata input_mean, input_std)",
               o->mean, o->std);
    *in = value_info(g, "input", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, x0->image ? 4 : 2,
                     x0->image ? image : flat_dims, doc);
    val[0] = "input";
    rank[0] = x0->image ? 4 : 2;
    if (o->normalize) {
      double std = o->std > 0 && isfinite(o->std) ? o->std : 1.0; /* as td_dataset_normalize */
      val[0] =
          op2(g, "Div", "input_normalized",
              op2(g, "Sub", "input_centered", "input", const_f32(g, "input_mean", (float)o->mean)),
              const_f32(g, "input_std", (float)std));
    }
  }
  for (int i = 0; i < m->n_nodes && !g->oom; i++) {
    const td__node_t *n = &m->nodes[i];
    const char *x = n->in >= 0 ? val[n->in] : NULL, *y = NULL;
    int r = n->in >= 0 ? rank[n->in] : 0;
    const char *w = n->w >= 0 ? param_name[n->w] : NULL, *b = n->b >= 0 ? param_name[n->b] : NULL;
    const td__tensor_t *ot = &m->tensors[n->out];
    switch (n->kind) {
    case N_DENSE:
      if (r == 3) { /* gpt rows: x [batch, T, IN] times W^T */
        if (transposed[n->w] == NULL) {
          static const int64_t swap[2] = {1, 0};
          transposed[n->w] = transpose(g, w, 2, swap);
        }
        y = op2(g, "MatMul", "dense", x, transposed[n->w]);
        if (b != NULL)
          y = op2(g, "Add", "dense_bias", y, b);
      } else {
        y = op3(g, "Gemm", "dense", flat(g, x, &r), w, b);
        attr_int(g, "transB", 1);
        r = 2;
      }
      y = activation(g, y, n->act);
      break;
    case N_CONV: {
      const td_conv_geom_t *c = &n->geom;
      y = op3(g, "Conv", "conv", x, w, b);
      const int64_t k[2] = {c->k, c->k}, s[2] = {c->stride, c->stride},
                    p[4] = {c->pad, c->pad, c->pad, c->pad};
      attr_ints(g, "kernel_shape", 2, k);
      attr_ints(g, "strides", 2, s);
      attr_ints(g, "pads", 4, p);
      y = activation(g, y, n->act);
      r = 4;
      break;
    }
    case N_POOL: {
      const td_conv_geom_t *c = &n->geom;
      y = op1(g, n->pool == TD_POOL_MAX ? "MaxPool" : "AveragePool", "pool", x);
      const int64_t k[2] = {c->k, c->k}, s[2] = {c->stride, c->stride};
      attr_ints(g, "kernel_shape", 2, k);
      attr_ints(g, "strides", 2, s);
      r = 4;
      break;
    }
    case N_LAYERNORM:
      y = op3(g, "LayerNormalization", "layernorm", flat(g, x, &r), w, b);
      attr_int(g, "axis", -1);
      attr_float(g, "epsilon", TD__NORM_EPS);
      break;
    case N_GROUPNORM: {
      /* InstanceNormalization's own scale and bias: 1 and 0 per group */
      char ones_name[32], zeros_name[32];
      snprintf(ones_name, sizeof ones_name, "ones_%d", n->groups);
      snprintf(zeros_name, sizeof zeros_name, "zeros_%d", n->groups);
      const char *ones = find_init(g, ones_name) ? find_init(g, ones_name)->name : NULL;
      const char *zeros = find_init(g, zeros_name) ? find_init(g, zeros_name)->name : NULL;
      if (ones == NULL) {
        float *v = calloc((size_t)n->groups, sizeof *v);
        if (v == NULL) {
          g->oom = true;
          break;
        }
        const int64_t dims[1] = {n->groups};
        zeros = init_f32(g, zeros_name, 1, dims, v, (size_t)n->groups);
        for (int j = 0; j < n->groups; j++)
          v[j] = 1.0f;
        ones = init_f32(g, ones_name, 1, dims, v, (size_t)n->groups);
        free(v);
      }
      const int64_t grouped[3] = {0, n->groups, -1}, image[4] = {0, ot->c, ot->h, ot->w},
                    per_channel[3] = {ot->c, 1, 1};
      y = op3(g, "InstanceNormalization", "groupnorm", reshape(g, x, 3, grouped), ones, zeros);
      attr_float(g, "epsilon", TD__NORM_EPS);
      y = reshape(g, y, 4, image);
      y = op2(g, "Mul", "groupnorm_scaled", y, reshape(g, w, 3, per_channel));
      y = op2(g, "Add", "groupnorm_shifted", y, reshape(g, b, 3, per_channel));
      r = 4;
      break;
    }
    case N_ACT:
      y = activation(g, x, n->act);
      break;
    case N_DROPOUT: /* inverted dropout: the identity at inference */
      y = x;
      break;
    case N_ADD: {
      const char *x2 = val[n->in2];
      int r2 = rank[n->in2];
      if (r != r2) { /* a residual block that read its map as flat features */
        x = flat(g, x, &r);
        x2 = flat(g, x2, &r2);
      }
      y = op2(g, "Add", "residual", x, x2);
      break;
    }
    case N_EMBED:
      y = op2(g, "Gather", "embed", w, val[0]);
      attr_int(g, "axis", 0);
      y = op2(g, "Add", "embed_pos", y, param_name[n->w2]);
      r = 3;
      break;
    case N_ATTN:
      y = attention(g, x, ot->t, ot->c, n->heads);
      r = 3;
      break;
    }
    val[n->out] = y;
    rank[n->out] = r;
  }
  if (g->oom || g->n_nodes == 0) {
    g->oom = true;
    return;
  }
  /* the last node makes the logits: name its output so */
  Onnx__NodeProto *last = g->nodes[g->n_nodes - 1];
  last->output[0] = (char *)"logits";
  const td__tensor_t *lt = &m->tensors[m->nodes[m->n_nodes - 1].out];
  const int64_t dims3[3] = {0, m->context, lt->c}, dims2[2] = {0, lt->c};
  *out = value_info(g, "logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, tokens ? 3 : 2,
                    tokens ? dims3 : dims2,
                    tokens ? "float32 [batch, T, 256]: next-byte logits at every position "
                             "(softmax gives the probabilities)"
                           : "float32 [batch, CLASSES]: class logits (softmax gives the "
                             "probabilities)");
}

static int write_file(const char *path, const uint8_t *buf, size_t len, char *why, size_t why_len) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(errno));
  bool ok = fwrite(buf, 1, len, f) == len;
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlink(path);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(err));
  }
  return 0;
}

int td_onnx_write(const char *path, const td_onnx_opts_t *o, char *why, size_t why_len) {
  if (path == NULL || o == NULL || o->spec == NULL || o->params == NULL ||
      (o->n_tensors > 0 && o->tensors == NULL))
    return td_why(why, why_len, TD_EINVAL, "nothing to write");
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td__model_build(m, o->spec, why, why_len);
  if (rc == 0)
    rc = check_tensors(m->layout, o, why, why_len);
  size_t n_params = rc == 0 ? td_layout_count(m->layout) : 0, bytes = 0;
  for (size_t i = 0; i < n_params; i++)
    bytes += td_layout_tensor(m->layout, i)->numel * sizeof(float);
  if (rc == 0 && bytes > TD__ONNX_MAX_BYTES)
    rc = td_why(why, why_len, TD_ERANGE,
                "the model's %zu MiB of parameters do not fit one ONNX file (2 GiB): export "
                "it as safetensors",
                bytes >> 20);
  graph_t g = {0};
  const char **param_name = rc == 0 ? g_alloc(&g, (n_params + 1) * sizeof *param_name) : NULL;
  for (size_t i = 0; rc == 0 && i < n_params; i++) {
    const td_tensor_info_t *t = td_layout_tensor(m->layout, i);
    int64_t dims[TD_TENSOR_MAX_DIMS];
    for (uint32_t d = 0; d < t->ndim; d++)
      dims[d] = t->shape[d];
    param_name[i] =
        init_f32(&g, t->name, t->ndim, dims, o->params + o->tensors[i].offset, t->numel);
  }
  Onnx__ValueInfoProto *input = NULL, *output = NULL;
  if (rc == 0 && !g.oom)
    build_graph(&g, m, o, param_name, &input, &output);
  Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsets[1] = {&opset};
  Onnx__StringStringEntryProto **props =
      rc == 0 ? g_alloc(&g, (o->n_meta + 2) * sizeof *props) : NULL;
  size_t n_props = 0;
  for (size_t i = 0; rc == 0 && props != NULL && i < o->n_meta + 2; i++) {
    Onnx__StringStringEntryProto *e = g_alloc(&g, sizeof *e);
    if (e == NULL)
      break;
    onnx__string_string_entry_proto__init(e);
    if (i < o->n_meta) {
      e->key = (char *)(uintptr_t)o->meta[i].key;
      e->value = (char *)(uintptr_t)o->meta[i].value;
    } else if (!o->normalize) {
      continue;
    } else {
      e->key = i == o->n_meta ? (char *)"input_mean" : (char *)"input_std";
      e->value = g_str(&g, "%.9g", i == o->n_meta ? o->mean : o->std);
    }
    props[n_props++] = e;
  }
  if (rc == 0 && (g.oom || input == NULL || output == NULL || props == NULL))
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory building the ONNX graph");
  uint8_t *buf = NULL;
  if (rc == 0) {
    Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
    graph.name = g_str(&g, "%s", o->spec);
    graph.doc_string = g_str(&g, "traind model %s: inference graph", o->spec);
    graph.node = g.nodes;
    graph.n_node = g.n_nodes;
    graph.initializer = g.inits;
    graph.n_initializer = g.n_inits;
    graph.input = &input;
    graph.n_input = 1;
    graph.output = &output;
    graph.n_output = 1;
    opset.domain = (char *)"";
    opset.has_version = true;
    opset.version = TD_ONNX_OPSET;
    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    model.has_ir_version = true;
    model.ir_version = TD__ONNX_IR_VERSION;
    model.producer_name = (char *)"traind";
    model.producer_version = (char *)PACKAGE_VERSION;
    model.doc_string = g_str(&g, "%s", o->spec);
    model.graph = &graph;
    model.opset_import = opsets;
    model.n_opset_import = 1;
    model.metadata_props = props;
    model.n_metadata_props = n_props;
    size_t len = g.oom ? 0 : protobuf_c_message_get_packed_size(&model.base);
    buf = len > 0 ? malloc(len) : NULL;
    if (buf == NULL)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory for a %zu-byte ONNX file", len);
    else if (protobuf_c_message_pack(&model.base, buf) != len)
      rc = td_why(why, why_len, TD_EINVAL, "the ONNX graph did not pack");
    else
      rc = write_file(path, buf, len, why, why_len);
  }
  free(buf);
  graph_free(&g);
  td_layout_free(&m->layout);
  free(m);
  return rc;
}

int td_onnx_input_stats(const char *spec, const char *dataset, bool *normalize, double *mean,
                        double *std, char *why, size_t why_len) {
  *normalize = false;
  *mean = 0;
  *std = 1;
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td__model_build(m, spec, why, why_len);
  bool tokens = m->input == TD_INPUT_TOKENS;
  td_layout_free(&m->layout);
  free(m);
  if (rc != 0 || tokens)
    return rc;
  if (dataset == NULL || dataset[0] == '\0' || strcmp(dataset, "auto") == 0)
    dataset = "fashion-mnist";
  td_dataset_t *train = NULL, *test = NULL;
  td_image_shape_t as; /* images:DIR as the run read it: the model's input(C,H,W) */
  rc = td_model_spec_input_shape(spec, &as.channels, &as.height, &as.width, why, why_len);
  if (rc == 0)
    rc = td_dataset_open_as(&train, &test, dataset, &as, why, why_len);
  if (rc == 0) {
    td_dataset_stats(train, mean, std);
    *normalize = true;
  }
  td_dataset_close(&train);
  td_dataset_close(&test);
  return rc;
}
