/* model.c: models built from a spec string as a list of layers over one
 * parameter buffer, one gradient buffer and one activation block.
 *
 * A spec (grammar in model.h) becomes a list of nodes over tensors. A tensor
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
 * Parameters and gradients are host buffers from td_params_alloc() because the
 * codecs and the network read them in place; activations are backend memory.
 * One model is used by one thread; a step allocates nothing. */
#include "compute/model.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/rng.h"

#define TD__FORMS "mlp:IN-H1-...-OUT, cnn, resnet, gpt:LAYERS-WIDTH-HEADS-CONTEXT, layers:..."
#define TD__MAX_NODES 512
#define TD__MAX_TENSORS 512
#define TD__VOCAB 256

#define TD__CNN_LAYERS                                                                         \
  "input(1,28,28) conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten " \
  "dense(128) relu dense(10)"
#define TD__RESNET_LAYERS                                                                      \
  "input(1,28,28) conv(32,3,pad=1) groupnorm(8) relu "                                        \
  "[ conv(32,3,pad=1) groupnorm(8) relu conv(32,3,pad=1) groupnorm(8) ] relu "                \
  "conv(64,3,stride=2,pad=1) groupnorm(8) relu "                                              \
  "[ conv(64,3,pad=1) groupnorm(8) relu conv(64,3,pad=1) groupnorm(8) ] relu gap dense(10)"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD__CLONES
#endif

typedef enum {
  N_DENSE,
  N_CONV,
  N_POOL,
  N_LAYERNORM,
  N_GROUPNORM,
  N_ACT,
  N_DROPOUT,
  N_ADD,
  N_EMBED,
  N_ATTN,
} td__kind_t;

typedef enum { INIT_HE, INIT_XAVIER, INIT_TORCH, INIT_GPT, INIT_GPT_PROJ } td__init_t;

typedef struct {
  int t, c, h, w; /* per sample: t rows of f = c*h*w features */
  bool image;     /* c x h x w is a feature map (conv, pool, groupnorm accept it) */
  float *v, *g;   /* max_batch * t * f each */
} td__tensor_t;

typedef struct {
  td__kind_t kind;
  int in, in2, out;       /* tensor indices; in = -1 reads the token ids */
  bool acc, acc2;         /* backward adds into in's (in2's) gradient */
  td_act_t act;           /* fused (dense, conv) or the activation (N_ACT) */
  td_pool_t pool;
  td_conv_geom_t geom;    /* conv and pool geometry */
  int groups, heads;
  float p;                /* dropout probability */
  int w, b, w2;           /* layout tensor indices, -1 for none */
  td__init_t init;
  size_t aux_floats;      /* per sample: im2col columns, statistics, masks, probabilities */
  float *aux, *aux2;
  int32_t *idx;           /* max-pool argmax */
} td__node_t;

struct td_model {
  td_backend_t *be;
  td_layout_t *layout;
  float *params, *grads;
  float *activations; /* one backend block: every tensor's v and g, every node's aux */
  float *work;        /* conv GEMM output / dy in channel-major order; attention backward */
  float *work2;       /* conv column gradients */
  int max_batch;
  td_input_kind_t input;
  int context; /* positions per sample for token models, 1 otherwise */
  int layers;  /* gpt blocks (for the projection init) */
  uint64_t steps;
  int n_nodes, n_tensors;
  td__node_t nodes[TD__MAX_NODES];
  td__tensor_t tensors[TD__MAX_TENSORS];
};

static size_t tensor_f(const td__tensor_t *t) {
  return (size_t)t->c * (size_t)t->h * (size_t)t->w;
}
static size_t tensor_numel(const td__tensor_t *t) { return (size_t)t->t * tensor_f(t); }

static int new_tensor(td_model_t *m, int t, int c, int h, int w, bool image) {
  if (m->n_tensors == TD__MAX_TENSORS)
    return -1;
  m->tensors[m->n_tensors] = (td__tensor_t){.t = t, .c = c, .h = h, .w = w, .image = image};
  return m->n_tensors++;
}

static td__node_t *new_node(td_model_t *m, td__kind_t kind, int in) {
  if (m->n_nodes == TD__MAX_NODES)
    return NULL;
  td__node_t *n = &m->nodes[m->n_nodes++];
  *n = (td__node_t){.kind = kind, .in = in, .in2 = -1, .out = -1, .w = -1, .b = -1, .w2 = -1};
  return n;
}

static int add_param(td_model_t *m, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1,
                     uint32_t d2, uint32_t d3) {
  uint32_t shape[4] = {d0, d1, d2, d3};
  return td_layout_add(m->layout, name, ndim, shape);
}

static float *param(td_model_t *m, int index) {
  return index < 0 ? NULL : m->params + td_layout_tensor(m->layout, (size_t)index)->offset;
}
static float *grad(td_model_t *m, int index) {
  return index < 0 ? NULL : m->grads + td_layout_tensor(m->layout, (size_t)index)->offset;
}

/* ---- builders shared by every form ---- */

static int build_dense(td_model_t *m, int in, int units, const char *prefix, int index,
                       char *why, size_t why_len) {
  const td__tensor_t *x = &m->tensors[in];
  int f = (int)tensor_f(x);
  char name[TD_TENSOR_NAME_MAX];
  td__node_t *n = new_node(m, N_DENSE, in);
  if (n == NULL)
    return td_why(why, why_len, TD_ECONFIG, "too many layers (at most %d)", TD__MAX_NODES);
  snprintf(name, sizeof name, "%s%d.weight", prefix, index);
  n->w = add_param(m, name, 2, (uint32_t)units, (uint32_t)f, 0, 0);
  snprintf(name, sizeof name, "%s%d.bias", prefix, index);
  n->b = n->w < 0 ? n->w : add_param(m, name, 1, (uint32_t)units, 0, 0, 0);
  if (n->b < 0)
    return td_why(why, why_len, n->b, "cannot lay out %s%d", prefix, index);
  n->out = new_tensor(m, x->t, units, 1, 1, false);
  n->init = INIT_HE;
  return n->out < 0 ? td_why(why, why_len, TD_ECONFIG, "too many tensors") : n->out;
}

static int simple_node(td_model_t *m, td__kind_t kind, int in, int out, char *why,
                       size_t why_len, td__node_t **np) {
  td__node_t *n = new_node(m, kind, in);
  if (n == NULL || out < 0)
    return td_why(why, why_len, TD_ECONFIG, "too many layers (at most %d)", TD__MAX_NODES);
  n->out = out;
  *np = n;
  return out;
}

static int build_layernorm(td_model_t *m, int in, const char *name, char *why, size_t why_len) {
  const td__tensor_t *x = &m->tensors[in];
  td__node_t *n = NULL;
  int rc = simple_node(m, N_LAYERNORM, in, new_tensor(m, x->t, x->c, x->h, x->w, x->image), why,
                       why_len, &n);
  if (rc < 0)
    return rc;
  char buf[TD_TENSOR_NAME_MAX];
  uint32_t f = (uint32_t)tensor_f(x);
  snprintf(buf, sizeof buf, "%s.weight", name);
  n->w = add_param(m, buf, 1, f, 0, 0, 0);
  snprintf(buf, sizeof buf, "%s.bias", name);
  n->b = n->w < 0 ? n->w : add_param(m, buf, 1, f, 0, 0, 0);
  if (n->b < 0)
    return td_why(why, why_len, n->b, "cannot lay out %s", name);
  n->aux_floats = 2 * (size_t)x->t; /* mean, rstd per row */
  return n->out;
}

/* ---- mlp:IN-H1-...-OUT ---- */

static int build_mlp(td_model_t *m, const char *spec, const char *args, char *why,
                     size_t why_len) {
  int widths[TD_MODEL_MAX_LAYERS + 1];
  int count = 0;
  const char *p = args;
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
    if (count == TD_MODEL_MAX_LAYERS + 1)
      return td_why(why, why_len, TD_ECONFIG, "'%s' has more than %d layers", spec,
                    TD_MODEL_MAX_LAYERS);
    widths[count++] = (int)width;
    if (p[len] == '\0')
      break;
    p += len + 1;
  }
  if (count < 2)
    return td_why(why, why_len, TD_ECONFIG,
                  "'%s' needs at least an input and an output width (mlp:IN-H1-...-OUT)", spec);
  int cur = new_tensor(m, 1, widths[0], 1, 1, false);
  for (int l = 0; l + 1 < count; l++) {
    cur = build_dense(m, cur, widths[l + 1], "fc", l, why, why_len);
    if (cur < 0)
      return cur;
    td__node_t *n = &m->nodes[m->n_nodes - 1];
    if (l + 2 < count)
      n->act = TD_ACT_RELU;
    else
      n->init = INIT_XAVIER;
  }
  return 0;
}

/* ---- layers:ITEM ITEM ... ---- */

typedef struct {
  char name[16];
  double pos[4];
  int npos;
  int stride, pad; /* -1: not given */
  const char *text;
  int len;
} td__item_t;

/* Parse one item "name" or "name(a,b,key=v)" at *p; advances *p. */
static int parse_item(const char **pp, td__item_t *it, char *why, size_t why_len) {
  const char *p = *pp;
  memset(it, 0, sizeof *it);
  it->stride = it->pad = -1;
  it->text = p;
  if (*p == '[' || *p == ']') {
    it->name[0] = *p;
    *pp = p + 1;
    it->len = 1;
    return 0;
  }
  size_t n = 0;
  while (isalnum((unsigned char)p[n]) || p[n] == '_')
    n++;
  if (n == 0 || n >= sizeof it->name)
    return td_why(why, why_len, TD_ECONFIG, "bad layer item at '%.20s'", p);
  memcpy(it->name, p, n);
  p += n;
  if (*p == '(') {
    p++;
    for (;;) {
      while (*p == ' ')
        p++;
      const char *key = NULL;
      size_t kl = strcspn(p, "=,)");
      if (p[kl] == '=') {
        key = p;
        p += kl + 1;
      }
      char *end;
      double v = strtod(p, &end);
      if (end == p || !isfinite(v))
        return td_why(why, why_len, TD_ECONFIG, "bad number in %s(...) at '%.12s'", it->name, p);
      p = end;
      if (key != NULL && kl == 6 && strncmp(key, "stride", 6) == 0)
        it->stride = (int)v;
      else if (key != NULL && kl == 3 && strncmp(key, "pad", 3) == 0)
        it->pad = (int)v;
      else if (key != NULL)
        return td_why(why, why_len, TD_ECONFIG, "unknown option '%.*s' in %s(...)", (int)kl,
                      key, it->name);
      else if (it->npos < 4)
        it->pos[it->npos++] = v;
      else
        return td_why(why, why_len, TD_ECONFIG, "too many arguments to %s(...)", it->name);
      if (key != NULL && (v != floor(v) || v < 0 || v > 64))
        return td_why(why, why_len, TD_ECONFIG, "%s(...): %.*s must be a whole number in 0..64",
                      it->name, (int)kl, key);
      while (*p == ' ')
        p++;
      if (*p == ',') {
        p++;
        continue;
      }
      if (*p == ')') {
        p++;
        break;
      }
      return td_why(why, why_len, TD_ECONFIG, "unclosed '%s(' in the layer list", it->name);
    }
  }
  it->len = (int)(p - it->text);
  *pp = p;
  return 0;
}

static bool whole(double v, double lo, double hi) { return v == floor(v) && v >= lo && v <= hi; }

static int build_layers(td_model_t *m, const char *list, char *why, size_t why_len) {
  const char *p = list;
  int cur = -1, item_no = 0, counts[8] = {0};
  int residual_from = -1;
  td__item_t it;
  for (;;) {
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\0')
      break;
    int rc = parse_item(&p, &it, why, why_len);
    if (rc < 0)
      return rc;
    item_no++;
    if (*p != '\0' && *p != ' ' && *p != '\t' && *p != '[' && *p != ']' && it.name[0] != '[' &&
        it.name[0] != ']')
      return td_why(why, why_len, TD_ECONFIG, "layer %d: unexpected '%c' after '%.*s'", item_no,
                    *p, it.len, it.text);
#define BAD(...)                                                                              \
  do {                                                                                        \
    char msg_[160];                                                                           \
    snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                 \
    return td_why(why, why_len, TD_ECONFIG, "layer %d '%.*s': %s", item_no,                   \
                  it.len > 40 ? 40 : it.len, it.text, msg_);                                 \
  } while (0)
    if (strcmp(it.name, "input") == 0) {
      if (cur >= 0)
        BAD("input(...) must come first");
      if (it.npos == 1 && whole(it.pos[0], 1, TD_MODEL_MAX_WIDTH))
        cur = new_tensor(m, 1, (int)it.pos[0], 1, 1, false);
      else if (it.npos == 3 && whole(it.pos[0], 1, 4096) && whole(it.pos[1], 1, 4096) &&
               whole(it.pos[2], 1, 4096) && it.pos[0] * it.pos[1] * it.pos[2] <= 1 << 24)
        cur = new_tensor(m, 1, (int)it.pos[0], (int)it.pos[1], (int)it.pos[2], true);
      else
        BAD("takes input(FEATURES) or input(C,H,W), whole numbers, at most 16M in all");
      continue;
    }
    if (cur < 0)
      cur = new_tensor(m, 1, 1, 28, 28, true); /* default: one 28x28 image */
    td__tensor_t *x = &m->tensors[cur];
    int f = (int)tensor_f(x);
    td__node_t *n = NULL;
    if (strcmp(it.name, "[") == 0) {
      if (residual_from >= 0)
        BAD("residual blocks do not nest");
      residual_from = cur;
    } else if (strcmp(it.name, "]") == 0) {
      if (residual_from < 0)
        BAD("']' without '['");
      td__tensor_t *a = &m->tensors[residual_from];
      if (a->c != x->c || a->h != x->h || a->w != x->w)
        BAD("the residual block maps %dx%dx%d to %dx%dx%d; the add needs equal shapes", a->c,
            a->h, a->w, x->c, x->h, x->w);
      rc = simple_node(m, N_ADD, residual_from, new_tensor(m, 1, x->c, x->h, x->w, x->image),
                       why, why_len, &n);
      if (rc < 0)
        return rc;
      n->in2 = cur;
      residual_from = -1;
      cur = rc;
    } else if (strcmp(it.name, "dense") == 0) {
      if (it.npos != 1 || !whole(it.pos[0], 1, TD_MODEL_MAX_WIDTH))
        BAD("takes dense(UNITS), UNITS in 1..%d", TD_MODEL_MAX_WIDTH);
      if ((double)f * it.pos[0] > 1e8)
        BAD("%d x %d weights is too many", f, (int)it.pos[0]);
      rc = build_dense(m, cur, (int)it.pos[0], "fc", counts[0]++, why, why_len);
      if (rc < 0)
        return rc;
      m->nodes[m->n_nodes - 1].init = INIT_TORCH;
      cur = rc;
    } else if (strcmp(it.name, "conv") == 0) {
      if (!x->image)
        BAD("needs an image (C x H x W) input but gets %d flat features", f);
      if (it.npos != 2 || !whole(it.pos[0], 1, 4096) || !whole(it.pos[1], 1, 15))
        BAD("takes conv(OUT,K[,stride=S][,pad=P]), OUT in 1..4096, K in 1..15");
      td_conv_geom_t g = {.c = x->c, .h = x->h, .w = x->w, .k = (int)it.pos[1],
                          .stride = it.stride < 0 ? 1 : it.stride, .pad = it.pad < 0 ? 0 : it.pad};
      if (g.stride < 1 || g.stride > 15 || g.pad >= g.k)
        BAD("stride must be in 1..15 and pad smaller than K");
      if (g.h + 2 * g.pad < g.k || g.w + 2 * g.pad < g.k)
        BAD("a %dx%d window does not fit the %dx%d input (pad %d)", g.k, g.k, g.h, g.w, g.pad);
      g.ho = (g.h + 2 * g.pad - g.k) / g.stride + 1;
      g.wo = (g.w + 2 * g.pad - g.k) / g.stride + 1;
      int cout = (int)it.pos[0];
      rc = simple_node(m, N_CONV, cur, new_tensor(m, 1, cout, g.ho, g.wo, true), why, why_len, &n);
      if (rc < 0)
        return rc;
      n->geom = g;
      n->init = INIT_TORCH;
      char name[TD_TENSOR_NAME_MAX];
      snprintf(name, sizeof name, "conv%d.weight", counts[1]);
      n->w = add_param(m, name, 4, (uint32_t)cout, (uint32_t)g.c, (uint32_t)g.k, (uint32_t)g.k);
      snprintf(name, sizeof name, "conv%d.bias", counts[1]++);
      n->b = n->w < 0 ? n->w : add_param(m, name, 1, (uint32_t)cout, 0, 0, 0);
      if (n->b < 0)
        return td_why(why, why_len, n->b, "cannot lay out %s", name);
      n->aux_floats = (size_t)g.c * (size_t)g.k * (size_t)g.k * (size_t)g.ho * (size_t)g.wo;
      cur = rc;
    } else if (strcmp(it.name, "maxpool") == 0 || strcmp(it.name, "avgpool") == 0 ||
               strcmp(it.name, "gap") == 0) {
      bool gap = it.name[0] == 'g';
      if (!x->image)
        BAD("needs an image (C x H x W) input but gets %d flat features", f);
      if (gap ? it.npos != 0 : (it.npos != 1 || !whole(it.pos[0], 1, 64)))
        BAD(gap ? "takes no arguments" : "takes %s(K[,stride=S]), K in 1..64", it.name);
      if (gap && x->h != x->w)
        BAD("needs a square map, gets %dx%d", x->h, x->w);
      td_conv_geom_t g = {.c = x->c, .h = x->h, .w = x->w, .k = gap ? x->h : (int)it.pos[0]};
      g.stride = gap ? 1 : it.stride < 0 ? g.k : it.stride;
      if (g.stride < 1 || it.pad > 0)
        BAD("stride must be >= 1; pooling takes no padding");
      if (g.k > g.h || g.k > g.w)
        BAD("a %dx%d window does not fit the %dx%d input", g.k, g.k, g.h, g.w);
      g.ho = (g.h - g.k) / g.stride + 1;
      g.wo = (g.w - g.k) / g.stride + 1;
      rc = simple_node(m, N_POOL, cur, new_tensor(m, 1, g.c, g.ho, g.wo, !gap), why, why_len,
                       &n);
      if (rc < 0)
        return rc;
      n->geom = g;
      n->pool = it.name[0] == 'm' ? TD_POOL_MAX : TD_POOL_AVG;
      if (n->pool == TD_POOL_MAX)
        n->aux_floats = (size_t)g.c * (size_t)g.ho * (size_t)g.wo; /* int32 argmax */
      cur = rc;
    } else if (strcmp(it.name, "groupnorm") == 0) {
      if (!x->image)
        BAD("needs an image (C x H x W) input but gets %d flat features", f);
      if (it.npos != 1 || !whole(it.pos[0], 1, 4096) || x->c % (int)it.pos[0] != 0)
        BAD("takes groupnorm(G) with G dividing the %d channels", x->c);
      rc = simple_node(m, N_GROUPNORM, cur, new_tensor(m, 1, x->c, x->h, x->w, true), why,
                       why_len, &n);
      if (rc < 0)
        return rc;
      n->groups = (int)it.pos[0];
      char name[TD_TENSOR_NAME_MAX];
      snprintf(name, sizeof name, "gn%d.weight", counts[2]);
      n->w = add_param(m, name, 1, (uint32_t)x->c, 0, 0, 0);
      snprintf(name, sizeof name, "gn%d.bias", counts[2]++);
      n->b = n->w < 0 ? n->w : add_param(m, name, 1, (uint32_t)m->tensors[cur].c, 0, 0, 0);
      if (n->b < 0)
        return td_why(why, why_len, n->b, "cannot lay out %s", name);
      n->aux_floats = 2 * (size_t)n->groups;
      cur = rc;
    } else if (strcmp(it.name, "layernorm") == 0) {
      if (it.npos != 0)
        BAD("takes no arguments");
      char name[TD_TENSOR_NAME_MAX];
      snprintf(name, sizeof name, "ln%d", counts[3]++);
      rc = build_layernorm(m, cur, name, why, why_len);
      if (rc < 0)
        return rc;
      m->tensors[rc].image = false; /* normalised over all features */
      cur = rc;
    } else if (strcmp(it.name, "relu") == 0 || strcmp(it.name, "gelu") == 0) {
      if (it.npos != 0)
        BAD("takes no arguments");
      td_act_t act = it.name[0] == 'r' ? TD_ACT_RELU : TD_ACT_GELU;
      td__node_t *prev = m->n_nodes > 0 ? &m->nodes[m->n_nodes - 1] : NULL;
      if (act == TD_ACT_RELU && prev != NULL && prev->out == cur &&
          (prev->kind == N_DENSE || prev->kind == N_CONV) && prev->act == TD_ACT_NONE &&
          residual_from != cur) {
        prev->act = TD_ACT_RELU; /* fused into the bias pass */
        continue;
      }
      rc = simple_node(m, N_ACT, cur, new_tensor(m, 1, x->c, x->h, x->w, x->image), why,
                       why_len, &n);
      if (rc < 0)
        return rc;
      n->act = act;
      cur = rc;
    } else if (strcmp(it.name, "dropout") == 0) {
      if (it.npos != 1 || !(it.pos[0] >= 0.0 && it.pos[0] < 1.0))
        BAD("takes dropout(P), P in [0, 1)");
      rc = simple_node(m, N_DROPOUT, cur, new_tensor(m, 1, x->c, x->h, x->w, x->image), why,
                       why_len, &n);
      if (rc < 0)
        return rc;
      n->p = (float)it.pos[0];
      n->aux_floats = tensor_f(x);
      cur = rc;
    } else if (strcmp(it.name, "flatten") == 0) {
      if (it.npos != 0)
        BAD("takes no arguments");
      x->image = false; /* same memory, read as flat features from here on */
    } else {
      BAD("unknown layer (known: input conv dense maxpool avgpool gap groupnorm layernorm "
          "relu gelu dropout flatten, and [ ] around a residual block)");
    }
#undef BAD
  }
  if (residual_from >= 0)
    return td_why(why, why_len, TD_ECONFIG, "'[' without ']' in the layer list");
  if (m->n_nodes == 0 || m->nodes[m->n_nodes - 1].kind != N_DENSE)
    return td_why(why, why_len, TD_ECONFIG,
                  "the layer list must end with dense(CLASSES), the logits of the loss");
  if (m->nodes[m->n_nodes - 1].act != TD_ACT_NONE)
    return td_why(why, why_len, TD_ECONFIG,
                  "the last dense layer gives the logits: no activation after it");
  return 0;
}

/* ---- gpt:LAYERS-WIDTH-HEADS-CONTEXT ---- */

static int build_gpt(td_model_t *m, const char *spec, const char *args, char *why,
                     size_t why_len) {
  long v[4];
  int count = 0;
  const char *p = args;
  while (count < 4) {
    char *end;
    if (!isdigit((unsigned char)*p))
      break;
    v[count++] = strtol(p, &end, 10);
    p = end;
    if (*p != '-')
      break;
    p++;
  }
  if (count != 4 || *p != '\0')
    return td_why(why, why_len, TD_ECONFIG,
                  "'%s': gpt takes gpt:LAYERS-WIDTH-HEADS-CONTEXT, e.g. gpt:4-128-4-128", spec);
  long layers = v[0], width = v[1], heads = v[2], context = v[3];
  if (layers < 1 || layers > 48 || heads < 1 || heads > 64 || width < 8 || width > 4096 ||
      width % heads != 0 || context < 2 || context > 4096)
    return td_why(why, why_len, TD_ECONFIG,
                  "'%s': LAYERS in 1..48, HEADS in 1..64, WIDTH in 8..4096 and a multiple of "
                  "HEADS, CONTEXT in 2..4096",
                  spec);
  int c = (int)width, t = (int)context;
  m->input = TD_INPUT_TOKENS;
  m->context = t;
  m->layers = (int)layers;
  td__node_t *n = NULL;
  if (new_tensor(m, t, 1, 1, 1, false) != 0) /* tensor 0: the token ids, read by the embedding */
    return td_why(why, why_len, TD_EINVAL, "a gpt model starts empty");
  int x = simple_node(m, N_EMBED, -1, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
  if (x < 0)
    return x;
  td__node_t *embed = n;
  embed->w = add_param(m, "wte", 2, TD__VOCAB, (uint32_t)c, 0, 0);
  embed->w2 = embed->w < 0 ? embed->w : add_param(m, "wpe", 2, (uint32_t)t, (uint32_t)c, 0, 0);
  if (embed->w2 < 0)
    return td_why(why, why_len, embed->w2, "cannot lay out the embeddings");
  embed->init = INIT_GPT;
  int wte = embed->w;
  char name[TD_TENSOR_NAME_MAX];
  for (int l = 0; l < layers; l++) {
    snprintf(name, sizeof name, "h%d.ln1", l);
    int h = build_layernorm(m, x, name, why, why_len);
    if (h < 0)
      return h;
    snprintf(name, sizeof name, "h%d.qkv", l);
    int qkv = build_dense(m, h, 3 * c, name, 0, why, why_len);
    if (qkv < 0)
      return qkv;
    m->nodes[m->n_nodes - 1].init = INIT_GPT;
    int a = simple_node(m, N_ATTN, qkv, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (a < 0)
      return a;
    n->heads = (int)heads;
    n->aux_floats = (size_t)heads * (size_t)t * (size_t)t;
    snprintf(name, sizeof name, "h%d.proj", l);
    int pr = build_dense(m, a, c, name, 0, why, why_len);
    if (pr < 0)
      return pr;
    m->nodes[m->n_nodes - 1].init = INIT_GPT_PROJ;
    int x2 = simple_node(m, N_ADD, x, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (x2 < 0)
      return x2;
    n->in2 = pr;
    snprintf(name, sizeof name, "h%d.ln2", l);
    int h2 = build_layernorm(m, x2, name, why, why_len);
    if (h2 < 0)
      return h2;
    snprintf(name, sizeof name, "h%d.fc", l);
    int fc = build_dense(m, h2, 4 * c, name, 0, why, why_len);
    if (fc < 0)
      return fc;
    m->nodes[m->n_nodes - 1].init = INIT_GPT;
    int gl = simple_node(m, N_ACT, fc, new_tensor(m, t, 4 * c, 1, 1, false), why, why_len, &n);
    if (gl < 0)
      return gl;
    n->act = TD_ACT_GELU;
    snprintf(name, sizeof name, "h%d.fcproj", l);
    int fp = build_dense(m, gl, c, name, 0, why, why_len);
    if (fp < 0)
      return fp;
    m->nodes[m->n_nodes - 1].init = INIT_GPT_PROJ;
    x = simple_node(m, N_ADD, x2, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (x < 0)
      return x;
    n->in2 = fp;
  }
  int hf = build_layernorm(m, x, "lnf", why, why_len);
  if (hf < 0)
    return hf;
  /* the head: logits = h wte^T, the token table tied, no bias */
  int logits = simple_node(m, N_DENSE, hf, new_tensor(m, t, TD__VOCAB, 1, 1, false), why,
                           why_len, &n);
  if (logits < 0)
    return logits;
  n->w = wte;
  n->init = INIT_GPT; /* not drawn again: the table belongs to the embedding */
  return 0;
}

/* Parse and lay out; no buffers yet. */
static int build(td_model_t *m, const char *spec, char *why, size_t why_len) {
  if (spec == NULL || spec[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG, "empty model spec (supported: " TD__FORMS ")");
  m->input = TD_INPUT_FEATURES;
  m->context = 1;
  int rc = td_layout_new(&m->layout);
  if (rc != 0)
    return td_why(why, why_len, rc, "out of memory");
  const char *colon = strchr(spec, ':');
  size_t kind_len = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
  const char *args = colon != NULL ? colon + 1 : NULL;
#define IS(word) (kind_len == strlen(word) && strncmp(spec, word, kind_len) == 0)
  if (IS("mlp")) {
    if (args == NULL)
      return td_why(why, why_len, TD_ECONFIG, "'mlp' needs its layer widths (mlp:IN-H1-...-OUT)");
    rc = build_mlp(m, spec, args, why, why_len);
  } else if (IS("cnn") || IS("resnet")) {
    if (args != NULL)
      return td_why(why, why_len, TD_ECONFIG, "'%.*s' is a preset and takes no arguments",
                    (int)kind_len, spec);
    rc = build_layers(m, IS("cnn") ? TD__CNN_LAYERS : TD__RESNET_LAYERS, why, why_len);
  } else if (IS("gpt")) {
    if (args == NULL)
      return td_why(why, why_len, TD_ECONFIG,
                    "'gpt' needs gpt:LAYERS-WIDTH-HEADS-CONTEXT, e.g. gpt:4-128-4-128");
    rc = build_gpt(m, spec, args, why, why_len);
  } else if (IS("layers")) {
    rc = build_layers(m, args != NULL ? args : "", why, why_len);
  } else {
    return td_why(why, why_len, TD_ECONFIG, "unknown model '%.*s' (supported: " TD__FORMS ")",
                  kind_len > 32 ? 32 : (int)kind_len, spec);
  }
#undef IS
  if (rc < 0)
    return rc;
  /* backward order decides who overwrites and who adds into a gradient */
  bool written[TD__MAX_TENSORS] = {false};
  for (int i = m->n_nodes - 1; i >= 0; i--) {
    td__node_t *n = &m->nodes[i];
    if (n->in >= 0) {
      n->acc = written[n->in];
      written[n->in] = true;
    }
    if (n->in2 >= 0) {
      n->acc2 = written[n->in2];
      written[n->in2] = true;
    }
  }
  return 0;
}

int td_model_check_spec(const char *spec, char *why, size_t why_len) {
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = build(m, spec, why, why_len);
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
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
    total += 2 * round_up((size_t)max_batch * tensor_numel(&m->tensors[i]));
  for (int i = 0; i < m->n_nodes; i++) {
    const td__node_t *n = &m->nodes[i];
    size_t a = round_up((size_t)max_batch * n->aux_floats);
    total += a;
    if (n->kind == N_CONV) {
      size_t out = (size_t)max_batch * tensor_numel(&m->tensors[n->out]);
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
  int rc = build(m, spec, why, why_len);
  if (rc >= 0) {
    size_t total, work, work2;
    plan_buffers(m, batch, &total, &work, &work2);
    uint64_t numel = td_layout_numel(m->layout);
    uint64_t input = (uint64_t)batch * tensor_numel(&m->tensors[0]) * sizeof(float) +
                     (uint64_t)batch * (uint64_t)m->context * sizeof(int32_t);
    *params = numel;
    *bytes = 2 * numel * sizeof(float) + ((uint64_t)total + work + work2) * sizeof(float) + input;
  }
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
}

int td_model_open(td_model_t **out, const char *spec, td_backend_t *be, int max_batch,
                  char *why, size_t why_len) {
  if (out == NULL || be == NULL)
    return td_why(why, why_len, TD_EINVAL, "no model pointer or backend");
  *out = NULL;
  /* Parameters, gradients and batches are host buffers (the codecs and the
   * network read them in place); a backend whose memory the host cannot
   * address would be handed host pointers. The CUDA ops are verified op by op
   * (tests/unit/test_backend_cuda.c); a device-resident model is not built. */
  if (td_backend_device_memory(be))
    return td_why(why, why_len, TD_EDEVICE,
                  "backend %s: models train with host memory only (use backend = cpu)",
                  td_backend_name(be));
  if (max_batch < 1 || max_batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ECONFIG, "batch %d out of range [1, %d]", max_batch,
                  TD_MODEL_MAX_BATCH);
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  m->be = be;
  m->max_batch = max_batch;
  int rc = build(m, spec, why, why_len);
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
  m->params = td_params_alloc(td_layout_numel(m->layout));
  m->grads = td_params_alloc(td_layout_numel(m->layout));
  m->activations = td_backend_alloc(be, total * sizeof(float));
  m->work = td_backend_alloc(be, work * sizeof(float));
  m->work2 = td_backend_alloc(be, work2 * sizeof(float));
  if (m->params == NULL || m->grads == NULL || m->activations == NULL || m->work == NULL ||
      m->work2 == NULL) {
    td_model_close(&m);
    return td_why(why, why_len, TD_ENOMEM, "cannot build '%s' for batch %d: %s", spec,
                  max_batch, td_strerror(TD_ENOMEM));
  }
  float *next = m->activations;
  for (int i = 1; i < m->n_tensors; i++) {
    size_t floats = round_up((size_t)max_batch * tensor_numel(&m->tensors[i]));
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
  td_params_free(&m->params);
  td_params_free(&m->grads);
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
}

const td_layout_t *td_model_layout(const td_model_t *m) { return m->layout; }
size_t td_model_numel(const td_model_t *m) { return td_layout_numel(m->layout); }
float *td_model_params(td_model_t *m) { return m->params; }
float *td_model_grads(td_model_t *m) { return m->grads; }
int td_model_input_dim(const td_model_t *m) {
  return m->input == TD_INPUT_TOKENS ? m->context : (int)tensor_f(&m->tensors[0]);
}
int td_model_classes(const td_model_t *m) {
  return (int)tensor_f(&m->tensors[m->nodes[m->n_nodes - 1].out]);
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
static void conv_forward(td_model_t *m, td__node_t *n, const float *x, float *y, int rows,
                         bool gemm_only) {
  td_conv_geom_t g = n->geom;
  int k = g.c * g.k * g.k, plane = g.ho * g.wo, cout = m->tensors[n->out].c;
  int cols = rows * plane;
  g.ld = cols;
  size_t in_size = (size_t)g.c * (size_t)g.h * (size_t)g.w;
  for (int b = 0; b < rows && !gemm_only; b++)
    td_backend_im2col(m->be, n->aux + (size_t)b * (size_t)plane, x + (size_t)b * in_size, &g);
  td_backend_gemm(m->be, false, false, cout, cols, k, 1.0f, param(m, n->w), k, n->aux, cols,
                  0.0f, m->work, cols);
  if (gemm_only)
    return;
  td_backend_swap01(m->be, y, m->work, cout, rows, plane);
  td_backend_channel_bias_act(m->be, y, param(m, n->b), rows, cout, plane, n->act);
}

static void conv_backward(td_model_t *m, td__node_t *n, float *dx, float *dy, const float *y,
                          int rows, bool gemm_only) {
  td_conv_geom_t g = n->geom;
  int k = g.c * g.k * g.k, plane = g.ho * g.wo, cout = m->tensors[n->out].c;
  int cols = rows * plane;
  g.ld = cols;
  size_t in_size = (size_t)g.c * (size_t)g.h * (size_t)g.w;
  if (!gemm_only) {
    td_backend_channel_act_backward(m->be, dy, y, grad(m, n->b), rows, cout, plane, n->act);
    td_backend_swap01(m->be, m->work, dy, rows, cout, plane);
  }
  td_backend_gemm(m->be, false, true, cout, k, cols, 1.0f, m->work, cols, n->aux, cols, 0.0f,
                  grad(m, n->w), k);
  if (dx == NULL)
    return;
  td_backend_gemm(m->be, true, false, k, cols, cout, 1.0f, param(m, n->w), k, m->work, cols,
                  0.0f, m->work2, cols);
  for (int b = 0; b < rows && !gemm_only; b++)
    td_backend_col2im(m->be, dx + (size_t)b * in_size, m->work2 + (size_t)b * (size_t)plane, &g,
                      n->acc);
}

/* The GEMMs of attention, issued through the backend (for gemm_only). */
static void attention_gemms(td_model_t *m, const td__node_t *n, int rows) {
  const td__tensor_t *o = &m->tensors[n->out];
  int t = o->t, c = o->c, d = c / n->heads, ld = 3 * c;
  const float *qkv = m->tensors[n->in].v;
  float *dqkv = m->tensors[n->in].g;
  for (int b = 0; b < rows; b++)
    for (int h = 0; h < n->heads; h++) {
      size_t base = (size_t)b * (size_t)t * (size_t)ld + (size_t)h * (size_t)d;
      float *p = n->aux + ((size_t)b * (size_t)n->heads + (size_t)h) * (size_t)t * (size_t)t;
      float *dp = m->work + ((size_t)b * (size_t)n->heads + (size_t)h) * (size_t)t * (size_t)t;
      float *out = o->v + (size_t)b * (size_t)t * (size_t)c + (size_t)h * (size_t)d;
      float *dout = o->g + (size_t)b * (size_t)t * (size_t)c + (size_t)h * (size_t)d;
      td_backend_gemm(m->be, false, true, t, t, d, 1.0f, qkv + base, ld, qkv + base + c, ld,
                      0.0f, p, t);
      td_backend_gemm(m->be, false, false, t, d, t, 1.0f, p, t, qkv + base + 2 * c, ld, 0.0f,
                      out, c);
      td_backend_gemm(m->be, true, false, t, d, t, 1.0f, p, t, dout, c, 0.0f, dqkv + base + 2 * c,
                      ld);
      td_backend_gemm(m->be, false, true, t, t, d, 1.0f, dout, c, qkv + base + 2 * c, ld, 0.0f,
                      dp, t);
      td_backend_gemm(m->be, false, false, t, d, t, 1.0f, dp, t, qkv + base + c, ld, 0.0f,
                      dqkv + base, ld);
      td_backend_gemm(m->be, true, false, t, d, t, 1.0f, dp, t, qkv + base, ld, 0.0f,
                      dqkv + base + c, ld);
    }
}

static void forward(td_model_t *m, const td_batch_t *batch, bool train, bool gemm_only) {
  int rows = batch->rows;
  m->tensors[0].v = (float *)batch->x; /* read only: no node writes its input */
  for (int i = 0; i < m->n_nodes; i++) {
    td__node_t *n = &m->nodes[i];
    td__tensor_t *o = &m->tensors[n->out];
    const float *x = n->in >= 0 ? m->tensors[n->in].v : NULL;
    size_t count = (size_t)rows * tensor_numel(o);
    int r = rows * o->t;
    switch (n->kind) {
    case N_DENSE: {
      int in = (int)tensor_f(&m->tensors[n->in]), units = o->c;
      td_backend_gemm(m->be, false, true, r, units, in, 1.0f, x, in, param(m, n->w), in, 0.0f,
                      o->v, units);
      if (!gemm_only && n->b >= 0)
        td_backend_bias_act(m->be, o->v, param(m, n->b), r, units, n->act);
      break;
    }
    case N_CONV:
      conv_forward(m, n, x, o->v, rows, gemm_only);
      break;
    case N_ATTN:
      if (!gemm_only)
        td_backend_attention_forward(m->be, o->v, n->aux, x, rows, o->t, o->c, n->heads);
      break;
    default:
      if (gemm_only)
        break;
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

static void backward(td_model_t *m, const td_batch_t *batch, bool gemm_only) {
  int rows = batch->rows;
  for (int i = m->n_nodes - 1; i >= 0; i--) {
    td__node_t *n = &m->nodes[i];
    td__tensor_t *o = &m->tensors[n->out];
    const float *x = n->in >= 0 ? m->tensors[n->in].v : NULL;
    float *dx = n->in > 0 ? m->tensors[n->in].g : NULL; /* tensor 0 is data: no gradient */
    size_t count = (size_t)rows * tensor_numel(o);
    int r = rows * o->t;
    switch (n->kind) {
    case N_DENSE: {
      int in = (int)tensor_f(&m->tensors[n->in]), units = o->c;
      if (!gemm_only && n->b >= 0)
        td_backend_act_backward(m->be, o->g, o->v, grad(m, n->b), r, units, n->act);
      td_backend_gemm(m->be, true, false, units, in, r, 1.0f, o->g, units, x, in, 0.0f,
                      grad(m, n->w), in);
      if (dx != NULL)
        td_backend_gemm(m->be, false, false, r, in, units, 1.0f, o->g, units, param(m, n->w),
                        in, n->acc ? 1.0f : 0.0f, dx, in);
      break;
    }
    case N_CONV:
      conv_backward(m, n, dx, o->g, o->v, rows, gemm_only);
      break;
    case N_ATTN:
      if (gemm_only)
        attention_gemms(m, n, rows);
      else
        td_backend_attention_backward(m->be, dx, m->work, o->g, x, n->aux, rows, o->t, o->c,
                                      n->heads);
      break;
    default:
      if (gemm_only)
        break;
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
  if (!all_finite(b->x, (size_t)b->rows * tensor_f(&m->tensors[0])))
    return TD_ENUMERIC;
  return 0;
}

int td_model_train(td_model_t *m, const td_batch_t *batch, double *loss, int *correct) {
  int rc = check_batch(m, batch);
  if (rc != 0)
    return rc;
  forward(m, batch, true, false);
  m->steps++;
  td__tensor_t *last = &m->tensors[m->nodes[m->n_nodes - 1].out];
  int positions = batch->rows * m->context, hits = 0;
  double loss_sum = td_backend_softmax_xent(m->be, last->v, batch->targets, last->g,
                                            1.0f / (float)positions, positions, last->c, &hits);
  if (!isfinite(loss_sum))
    return TD_ENUMERIC;
  backward(m, batch, false);
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
  forward(m, batch, false, false);
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

double td_model_train_gemm_flops(const td_model_t *m, int rows) {
  double flops = 0.0;
  for (int i = 0; i < m->n_nodes; i++) {
    const td__node_t *n = &m->nodes[i];
    const td__tensor_t *o = &m->tensors[n->out];
    int gemms = n->in > 0 ? 3 : 2; /* forward, dW, and dX unless the input is data */
    if (n->kind == N_DENSE)
      flops += gemms * 2.0 * rows * o->t * tensor_f(&m->tensors[n->in]) * o->c;
    else if (n->kind == N_CONV)
      flops += gemms * 2.0 * rows * o->c * o->h * o->w *
               (double)(n->geom.c * n->geom.k * n->geom.k);
    else if (n->kind == N_ATTN) /* 2 forward, 4 backward, each t x t x d per head */
      flops += 6 * 2.0 * rows * (double)o->t * o->t * o->c;
  }
  return flops;
}

void td_model_gemm_only(td_model_t *m, const float *x, int rows) {
  if (m == NULL || rows < 1 || rows > m->max_batch)
    return;
  td_batch_t b = {.rows = rows, .x = x};
  forward(m, &b, false, true);
  backward(m, &b, true);
}
