/* model.h: models built from a spec string, over the flat parameter buffer.
 *
 * Spec forms (the run key `model`):
 *   mlp:IN-H1-...-OUT   dense layers with ReLU between them
 *   cnn                 = layers:input(1,28,28) conv(32,3,pad=1) relu maxpool(2)
 *                         conv(64,3,pad=1) relu maxpool(2) flatten dense(128) relu dense(10)
 *                         (421,642 parameters)
 *   resnet              a small residual CNN for 28x28 images (GroupNorm, two residual blocks,
 *                         global average pool)
 *   gpt:L-W-H-T         byte-level GPT: vocabulary 256, token + learned position embeddings,
 *                         L pre-LayerNorm blocks of causal H-head self-attention and a 4W GELU
 *                         MLP, final LayerNorm, head tied to the token table, cross-entropy at
 *                         every one of the T positions (gpt:4-128-4-128: 842,496 parameters)
 *   layers:ITEM ITEM ...  a layer list, items separated by blanks:
 *     input(F) | input(C,H,W)     first, optional (default input(1,28,28)); channels-first
 *     conv(OUT,K[,stride=S][,pad=P])  K x K convolution, weight [OUT, C, K, K] + bias
 *     maxpool(K[,stride=S]) avgpool(K[,stride=S])  no padding, stride defaults to K
 *     gap                         global average pool (C x H x W -> C)
 *     groupnorm(G) layernorm      GroupNorm over G groups of channels; LayerNorm over features
 *     relu gelu dropout(P)        element-wise (dropout: inverted, training only)
 *     flatten                     read the map as flat features (dense also accepts a map)
 *     dense(UNITS)                weight [UNITS, IN] + bias
 *     [ ... ]                     a residual block: its output is added to its input
 *   and must end with dense(CLASSES), the logits of a softmax cross-entropy.
 * A list that does not connect (conv after flatten, a window larger than its
 * input, groups that do not divide the channels, a residual block that changes
 * the shape) is TD_ECONFIG with a one-line why naming the item.
 *
 * Tensor names say the layer: dense layers fcN.weight [OUT, IN] / fcN.bias,
 * convolutions convN.weight [OUT, C, K, K] / convN.bias, gnN and lnN
 * (.weight, .bias) for the norms, N counting each kind from 0 in list order
 * (mlp: fc0 ... fcL); gpt: wte.weight [256, W], wpe.weight [T, W],
 * blocks.I.ln1, blocks.I.attn.qkv [3W, W], blocks.I.attn.proj [W, W],
 * blocks.I.ln2, blocks.I.mlp.fc [4W, W], blocks.I.mlp.proj [W, 4W] (.weight,
 * .bias each) and ln_f; the head is wte itself (tied), so it has no tensor.
 * The qkv output is q, k, v in that order, each W wide, head h at h*W/H.
 *
 * Weights are (out x in) row-major (a conv weight out x in x k x k, so it is
 * also the out x in*k*k matrix of its GEMM), each followed by its bias, in one
 * td_layout. The model owns its parameters, gradients and activation buffers
 * (sized for max_batch at open, so a training step allocates nothing), on
 * the backend's device when it has one (then a batch is uploaded by the
 * step, and the host sees the parameters through a pinned copy). Image
 * and MLP models read float features (rows x F); gpt reads int32 token ids
 * and int32 targets (rows x CONTEXT each). One model is used by one thread. */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "compute/backend.h"
#include "compute/params.h"

#define TD_MODEL_MAX_LAYERS 16
#define TD_MODEL_MAX_WIDTH 65536
#define TD_MODEL_MAX_BATCH 65536

typedef struct td_model td_model_t;

typedef enum {
  TD_INPUT_FEATURES = 0, /* float features, one int32 label per row */
  TD_INPUT_TOKENS,       /* int32 token ids and targets, CONTEXT per row */
} td_input_kind_t;

/* One batch: rows samples; x (rows x input dim) for feature models, tokens
 * (rows x context) for token models; targets: one label per row, or one
 * next token per position. */
typedef struct {
  int rows;
  const float *x;
  const int32_t *tokens;
  const int32_t *targets;
} td_batch_t;

/* The parameter layout (names, shapes, offsets) of the model `spec` builds,
 * without its buffers. Caller owns *out. TD_ECONFIG + why on a bad spec. */
int td_model_spec_layout(const char *spec, td_layout_t **out, char *why, size_t why_len);
/* The input shape of the model `spec` builds: *channels, *height, *width
 * for an image input (layers:, cnn, resnet), all 0 for flat features (mlp,
 * input(F)) and token input (gpt). TD_ECONFIG + why on a bad spec. */
int td_model_spec_input_shape(const char *spec, int *channels, int *height, int *width,
                              char *why, size_t why_len);
/* Validate a spec without building anything; TD_ECONFIG + why on error. */
int td_model_check_spec(const char *spec, char *why, size_t why_len);
/* What td_model_open(spec, batch) would allocate, computed from the spec alone
 * (nothing is built): *params = td_model_numel() of that model (padding
 * included), *bytes = its parameters + gradients + activation buffers for
 * `batch` rows + one input batch (floats and labels). Optimizer state and any
 * caller-side copies are the caller's to add (params floats each). TD_ECONFIG +
 * why for a bad spec or a batch outside [1, TD_MODEL_MAX_BATCH]. */
int td_model_estimate(const char *spec, int batch, uint64_t *params, uint64_t *bytes, char *why,
                      size_t why_len);
/* Build the model for batches of at most max_batch rows on backend be
 * (borrowed; must outlive the model). Parameters start at zero; call
 * td_model_init(). Caller owns *out. */
int td_model_open(td_model_t **out, const char *spec, td_backend_t *be, int max_batch,
                  char *why, size_t why_len);
void td_model_close(td_model_t **self_p);

/* Seeded init: He-normal for layers followed by ReLU, Xavier-uniform for the
 * output layer, zero biases. Same seed -> bit-identical parameters. On a
 * device they are drawn into the host copy and uploaded (blocking). */
void td_model_init(td_model_t *m, uint64_t seed);

const td_layout_t *td_model_layout(const td_model_t *m);
size_t td_model_numel(const td_model_t *m);
/* Flat buffers of td_model_numel() floats that the backend's ops read and
 * write; borrowed for the model's lifetime. Host memory on a host backend; on
 * a device backend (td_backend_device_memory), device memory: the host reads
 * and writes the parameters through td_model_host_params() with
 * td_model_pull() and td_model_push() (or td_backend_download/upload). */
float *td_model_params(td_model_t *m);
float *td_model_grads(td_model_t *m);
/* The parameters as the host sees them: td_model_params() itself on a host
 * backend; on a device, a pinned host copy, current after td_model_init() and
 * td_model_pull(), and sent to the device by td_model_push(). */
float *td_model_host_params(td_model_t *m);
/* Device -> host copy of the parameters, once the queued steps are done
 * (blocking). 0 and nothing to do on a host backend; TD_EDEVICE with the
 * backend's message when the device failed (now or in an earlier op). */
int td_model_pull(td_model_t *m, char *why, size_t why_len);
/* Host copy -> device, queued on the backend's stream (asynchronous: steps
 * issued after it run after it, and the host copy must not be written until a
 * step, td_model_pull() or td_backend_synchronize() has waited for it). 0 and
 * nothing to do on a host backend; TD_EDEVICE as above. */
int td_model_push(td_model_t *m, char *why, size_t why_len);
/* Features per sample (feature models) or the context (token models). */
int td_model_input_dim(const td_model_t *m);
td_input_kind_t td_model_input_kind(const td_model_t *m);
/* Positions per sample: CONTEXT for gpt, 1 otherwise. */
int td_model_context(const td_model_t *m);
int td_model_classes(const td_model_t *m);
int td_model_max_batch(const td_model_t *m);

/* Forward + backward on rows (<= max_batch) samples: grads = d(mean loss over
 * the rows x context positions)/dparams (overwritten, not accumulated).
 * *loss = mean loss, *correct = argmax hits. Returns TD_EINVAL for a bad row
 * count or a missing input, TD_ERANGE for a target outside [0, classes) or a
 * token outside [0, 256) (checked before any work), TD_ENUMERIC for NaN/Inf in
 * the input or a loss that is not finite. */
int td_model_train(td_model_t *m, const td_batch_t *batch, double *loss, int *correct);
/* Forward only; adds the SUM of per-position losses to *loss_sum and hits to *correct. */
int td_model_eval(td_model_t *m, const td_batch_t *batch, double *loss_sum, int *correct);
/* The logits of the last td_model_eval() (rows x context x classes floats,
 * row-major), borrowed until the next step; NULL on a device backend. */
const float *td_model_logits(const td_model_t *m);
/* The feature-model forms of the two above (TD_EINVAL on a token model). */
int td_model_train_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                         double *loss, int *correct);
int td_model_eval_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                        double *loss_sum, int *correct);

/* One GEMM shape of a train step: C (m x n) = op(A) (m x k) op(B) (k x n),
 * row-major with these leading dimensions, made `repeat` times on separate
 * operands (attention: once per image and head). */
typedef struct {
  bool trans_a, trans_b;
  int m, n, k;
  int lda, ldb, ldc;
  size_t repeat;
} td_model_gemm_t;

/* The GEMMs one train step of `rows` samples makes, in order (the attention
 * kernel's own included): writes the first cap to out and returns how many
 * there are. What the bench replays as the OpenBLAS reference. */
size_t td_model_train_gemms(const td_model_t *m, int rows, td_model_gemm_t *out, size_t cap);
/* Floating-point operations of those GEMMs (2*m*n*k*repeat each), the
 * yardstick for compute efficiency; 0 when out of memory. */
double td_model_train_gemm_flops(const td_model_t *m, int rows);

#endif
