/* params.h: the flat parameter buffer and its per-tensor views.
 *
 * A model's parameters live in ONE contiguous float array; gradients, momentum,
 * anchors, deltas and error-feedback residuals are more arrays of the same
 * length and layout. The layout lists the tensors (name, shape, offset) so the
 * codecs and the network can work per tensor or on the whole buffer at once.
 * Each tensor starts on a 64-byte boundary (offsets are multiples of
 * TD_PARAMS_ALIGN_FLOATS); padding floats are always zero. */
#ifndef TD_PARAMS_H
#define TD_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#define TD_PARAMS_ALIGN_FLOATS 16
#define TD_TENSOR_MAX_DIMS 4
#define TD_TENSOR_NAME_MAX 32

typedef struct {
  char name[TD_TENSOR_NAME_MAX];
  uint32_t ndim;
  uint32_t shape[TD_TENSOR_MAX_DIMS];
  size_t offset; /* in floats from the start of the buffer */
  size_t numel;
} td_tensor_info_t;

typedef struct td_layout td_layout_t;

/* Empty layout. Caller owns *out. */
int td_layout_new(td_layout_t **out);
/* Append a tensor; returns its index (>= 0) or a negative TD_E* code. */
int td_layout_add(td_layout_t *layout, const char *name, uint32_t ndim, const uint32_t *shape);
void td_layout_free(td_layout_t **self_p);

/* Total floats of a buffer with this layout, padding included. */
size_t td_layout_numel(const td_layout_t *layout);
/* Floats that are real parameters (padding excluded). */
size_t td_layout_param_count(const td_layout_t *layout);
size_t td_layout_count(const td_layout_t *layout);
/* Borrowed; NULL when i is out of range. */
const td_tensor_info_t *td_layout_tensor(const td_layout_t *layout, size_t i);

/* 64-byte aligned, zero-filled float buffer of numel floats; NULL on failure.
 * Release with td_params_free(). */
float *td_params_alloc(size_t numel);
/* NULL-safe; sets *buf_p to NULL. */
void td_params_free(float **buf_p);

#endif
