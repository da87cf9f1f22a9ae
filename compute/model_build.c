/* model_build.c: a model spec becomes a graph of nodes over tensors.
 *
 * The forms (model.h): `mlp:` widths, the `cnn` and `resnet` presets, which
 * are layer lists, `gpt:L-W-H-T`, and `layers:` with its grammar. Each item is
 * checked as it is read, and a list that does not connect is refused with one
 * line naming the item. Building lays out the parameter tensors (names and
 * shapes the codecs see: a conv weight is [OUT, C, K, K]) and the per-sample
 * activation shapes, and marks which backward writes must add; it allocates
 * no buffer, so td_model_check_spec() and td_model_estimate() can build a
 * graph of any size to look at it. Runs on the caller's thread. */
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/model_internal.h"

#define TD__CNN_LAYERS                                                                         \
  "input(1,28,28) conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten " \
  "dense(128) relu dense(10)"
#define TD__RESNET_LAYERS                                                                      \
  "input(1,28,28) conv(32,3,pad=1) groupnorm(8) relu "                                        \
  "[ conv(32,3,pad=1) groupnorm(8) relu conv(32,3,pad=1) groupnorm(8) ] relu "                \
  "conv(64,3,stride=2,pad=1) groupnorm(8) relu "                                              \
  "[ conv(64,3,pad=1) groupnorm(8) relu conv(64,3,pad=1) groupnorm(8) ] relu gap dense(10)"

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

/* ---- builders shared by every form ---- */

static int build_dense(td_model_t *m, int in, int units, const char *prefix, int index,
                       char *why, size_t why_len) {
  const td__tensor_t *x = &m->tensors[in];
  int f = (int)td__tensor_f(x);
  char name[TD_TENSOR_NAME_MAX];
  td__node_t *n = new_node(m, N_DENSE, in);
  if (n == NULL)
    return td_why(why, why_len, TD_ECONFIG, "too many layers (at most %d)", TD__MAX_NODES);
  char num[16] = ""; /* index < 0: the prefix is the whole name */
  if (index >= 0)
    snprintf(num, sizeof num, "%d", index);
  snprintf(name, sizeof name, "%s%s.weight", prefix, num);
  n->w = add_param(m, name, 2, (uint32_t)units, (uint32_t)f, 0, 0);
  snprintf(name, sizeof name, "%s%s.bias", prefix, num);
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
  uint32_t f = (uint32_t)td__tensor_f(x);
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
    int f = (int)td__tensor_f(x);
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
      n->aux_floats = td__tensor_f(x);
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
  embed->w = add_param(m, "wte.weight", 2, TD__VOCAB, (uint32_t)c, 0, 0);
  embed->w2 = embed->w < 0 ? embed->w : add_param(m, "wpe.weight", 2, (uint32_t)t, (uint32_t)c, 0, 0);
  if (embed->w2 < 0)
    return td_why(why, why_len, embed->w2, "cannot lay out the embeddings");
  embed->init = INIT_GPT;
  int wte = embed->w;
  char name[TD_TENSOR_NAME_MAX];
  for (int l = 0; l < layers; l++) {
    snprintf(name, sizeof name, "blocks.%d.ln1", l);
    int h = build_layernorm(m, x, name, why, why_len);
    if (h < 0)
      return h;
    snprintf(name, sizeof name, "blocks.%d.attn.qkv", l);
    int qkv = build_dense(m, h, 3 * c, name, -1, why, why_len);
    if (qkv < 0)
      return qkv;
    m->nodes[m->n_nodes - 1].init = INIT_GPT;
    int a = simple_node(m, N_ATTN, qkv, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (a < 0)
      return a;
    n->heads = (int)heads;
    n->aux_floats = (size_t)heads * (size_t)t * (size_t)t;
    snprintf(name, sizeof name, "blocks.%d.attn.proj", l);
    int pr = build_dense(m, a, c, name, -1, why, why_len);
    if (pr < 0)
      return pr;
    m->nodes[m->n_nodes - 1].init = INIT_GPT_PROJ;
    int x2 = simple_node(m, N_ADD, x, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (x2 < 0)
      return x2;
    n->in2 = pr;
    snprintf(name, sizeof name, "blocks.%d.ln2", l);
    int h2 = build_layernorm(m, x2, name, why, why_len);
    if (h2 < 0)
      return h2;
    snprintf(name, sizeof name, "blocks.%d.mlp.fc", l);
    int fc = build_dense(m, h2, 4 * c, name, -1, why, why_len);
    if (fc < 0)
      return fc;
    m->nodes[m->n_nodes - 1].init = INIT_GPT;
    int gl = simple_node(m, N_ACT, fc, new_tensor(m, t, 4 * c, 1, 1, false), why, why_len, &n);
    if (gl < 0)
      return gl;
    n->act = TD_ACT_GELU;
    snprintf(name, sizeof name, "blocks.%d.mlp.proj", l);
    int fp = build_dense(m, gl, c, name, -1, why, why_len);
    if (fp < 0)
      return fp;
    m->nodes[m->n_nodes - 1].init = INIT_GPT_PROJ;
    x = simple_node(m, N_ADD, x2, new_tensor(m, t, c, 1, 1, false), why, why_len, &n);
    if (x < 0)
      return x;
    n->in2 = fp;
  }
  int hf = build_layernorm(m, x, "ln_f", why, why_len);
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
int td__model_build(td_model_t *m, const char *spec, char *why, size_t why_len) {
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
  int rc = td__model_build(m, spec, why, why_len);
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
}

int td_model_spec_layout(const char *spec, td_layout_t **out, char *why, size_t why_len) {
  *out = NULL;
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td__model_build(m, spec, why, why_len);
  if (rc >= 0) {
    *out = m->layout;
    m->layout = NULL;
  }
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
}

int td_model_spec_input_shape(const char *spec, int *channels, int *height, int *width,
                              char *why, size_t why_len) {
  *channels = *height = *width = 0;
  td_model_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td__model_build(m, spec, why, why_len);
  if (rc >= 0 && m->input == TD_INPUT_FEATURES && m->n_tensors > 0 && m->tensors[0].image) {
    *channels = m->tensors[0].c;
    *height = m->tensors[0].h;
    *width = m->tensors[0].w;
  }
  td_layout_free(&m->layout);
  free(m);
  return rc < 0 ? rc : 0;
}
