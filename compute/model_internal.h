/* model_internal.h: the model's graph, shared by compute/model.c (buffers,
 * forward, backward) and compute/model_build.c (spec -> graph), and read by
 * compute/onnx.c (graph -> ONNX operators). Private to those three files:
 * everything else sees the opaque td_model_t of model.h. */
#ifndef TD_MODEL_INTERNAL_H
#define TD_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/backend.h"
#include "compute/model.h"
#include "compute/params.h"

#define TD__FORMS "mlp:IN-H1-...-OUT, cnn, resnet, gpt:LAYERS-WIDTH-HEADS-CONTEXT, layers:..."
#define TD__MAX_NODES 512
#define TD__MAX_TENSORS 512
#define TD__VOCAB 256

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
  float *params, *grads; /* what the ops read and write: host memory from td_params_alloc()
                            on a host backend, device memory on a device */
  /* A device backend only (all NULL on a host backend): */
  bool device;
  float *host;        /* the parameters' host copy, pinned (td_model_pull / td_model_push) */
  void *stage;        /* pinned: a batch on its way to the device */
  float *in_x;        /* the batch on the device: features (feature models) */
  int32_t *in_tokens; /* ... token ids (token models) */
  int32_t *in_targets; /* ... labels or next tokens */
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

static inline size_t td__tensor_f(const td__tensor_t *t) {
  return (size_t)t->c * (size_t)t->h * (size_t)t->w;
}
static inline size_t td__tensor_numel(const td__tensor_t *t) {
  return (size_t)t->t * td__tensor_f(t);
}

/* Build the graph and the parameter layout of `spec` into m (zeroed, with
 * m->layout NULL); allocates the layout only. TD_ECONFIG + why on a bad spec. */
int td__model_build(td_model_t *m, const char *spec, char *why, size_t why_len);

#endif
