/* model.h: models built from a spec string, over the flat parameter buffer.
 *
 * `mlp:784-256-128-10` is a stack of dense layers with ReLU between them and a
 * softmax cross-entropy head. Weights are (out x in) row-major (the linear-layer
 * convention), each followed by its bias, in one td_layout. The model owns its
 * parameters, gradients and activation buffers (sized for max_batch at open, so
 * a training step allocates nothing). One model is used by one thread. */
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
 * output layer, zero biases. Same seed -> bit-identical parameters. */
void td_model_init(td_model_t *m, uint64_t seed);

const td_layout_t *td_model_layout(const td_model_t *m);
size_t td_model_numel(const td_model_t *m);
/* Flat buffers of td_model_numel() floats; borrowed for the model's lifetime. */
float *td_model_params(td_model_t *m);
float *td_model_grads(td_model_t *m);
int td_model_input_dim(const td_model_t *m);
int td_model_classes(const td_model_t *m);
int td_model_max_batch(const td_model_t *m);

/* Forward + backward on rows (<= max_batch) samples: grads = d(mean loss)/dparams
 * (overwritten, not accumulated). *loss = mean loss, *correct = argmax hits.
 * Returns TD_EINVAL for a bad row count, TD_ERANGE for a label outside
 * [0, classes) (checked before any work), TD_ENUMERIC for NaN/Inf in the input
 * or a loss that is not finite. */
int td_model_train_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                         double *loss, int *correct);
/* Forward only; adds the SUM of losses to *loss_sum and hits to *correct. */
int td_model_eval_batch(td_model_t *m, const float *x, const int32_t *y, int rows,
                        double *loss_sum, int *correct);

/* Floating-point operations of the GEMMs in one train step of `rows` samples
 * (2*m*n*k each), the yardstick for compute efficiency. */
double td_model_train_gemm_flops(const td_model_t *m, int rows);
/* Replay exactly the GEMM calls (shapes, transposes) of one train step on the
 * model's own buffers, nothing else: the OpenBLAS reference for efficiency. */
void td_model_gemm_only(td_model_t *m, const float *x, int rows);

#endif
