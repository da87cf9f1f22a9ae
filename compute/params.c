/* params.c: the layout of the flat parameter buffer, and the buffers themselves.
 *
 * A layout is a growing array of td_tensor_info_t. Each tensor starts at an
 * offset that is a multiple of TD_PARAMS_ALIGN_FLOATS (64 bytes), so every
 * tensor of a 64-byte aligned buffer is itself aligned for vector loads, and
 * the padding between tensors is part of the buffer (td_layout_numel) but not
 * of the model (td_layout_param_count). Names must be unique and non-empty;
 * a bad name, rank or zero dimension is TD_EINVAL, a size that would overflow
 * is TD_ERANGE, checked before anything is allocated. */
#include "compute/params.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

struct td_layout {
  td_tensor_info_t *tensors;
  size_t count, capacity;
  size_t numel;       /* floats of a buffer with this layout, padding included */
  size_t param_count; /* floats that are parameters */
};

/* A buffer's size in bytes must fit a size_t, so cap the floats at that. */
#define TD__PARAMS_MAX_FLOATS (SIZE_MAX / sizeof(float) - TD_PARAMS_ALIGN_FLOATS)

int td_layout_new(td_layout_t **out) {
  if (out == NULL)
    return TD_EINVAL;
  *out = calloc(1, sizeof **out);
  return *out != NULL ? 0 : TD_ENOMEM;
}

static bool name_taken(const td_layout_t *layout, const char *name) {
  for (size_t i = 0; i < layout->count; i++)
    if (strcmp(layout->tensors[i].name, name) == 0)
      return true;
  return false;
}

int td_layout_add(td_layout_t *layout, const char *name, uint32_t ndim, const uint32_t *shape) {
  if (layout == NULL || name == NULL || shape == NULL)
    return TD_EINVAL;
  size_t name_len = strlen(name);
  if (name_len == 0 || name_len >= TD_TENSOR_NAME_MAX || name_taken(layout, name))
    return TD_EINVAL;
  if (ndim < 1 || ndim > TD_TENSOR_MAX_DIMS)
    return TD_EINVAL;
  size_t numel = 1;
  for (uint32_t d = 0; d < ndim; d++) {
    if (shape[d] == 0)
      return TD_EINVAL;
    if (numel > TD__PARAMS_MAX_FLOATS / shape[d])
      return TD_ERANGE;
    numel *= shape[d];
  }
  size_t padded = (numel + TD_PARAMS_ALIGN_FLOATS - 1) / TD_PARAMS_ALIGN_FLOATS *
                  TD_PARAMS_ALIGN_FLOATS;
  if (padded > TD__PARAMS_MAX_FLOATS - layout->numel || layout->count >= (size_t)INT32_MAX)
    return TD_ERANGE;
  if (layout->count == layout->capacity) {
    size_t capacity = layout->capacity ? layout->capacity * 2 : 8;
    td_tensor_info_t *grown = realloc(layout->tensors, capacity * sizeof *grown);
    if (grown == NULL)
      return TD_ENOMEM;
    layout->tensors = grown;
    layout->capacity = capacity;
  }
  td_tensor_info_t *t = &layout->tensors[layout->count];
  memset(t, 0, sizeof *t);
  memcpy(t->name, name, name_len + 1);
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof *shape);
  t->offset = layout->numel;
  t->numel = numel;
  layout->numel += padded;
  layout->param_count += numel;
  return (int)layout->count++;
}

void td_layout_free(td_layout_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free((*self_p)->tensors);
  free(*self_p);
  *self_p = NULL;
}

size_t td_layout_numel(const td_layout_t *layout) { return layout->numel; }
size_t td_layout_param_count(const td_layout_t *layout) { return layout->param_count; }
size_t td_layout_count(const td_layout_t *layout) { return layout->count; }

const td_tensor_info_t *td_layout_tensor(const td_layout_t *layout, size_t i) {
  return i < layout->count ? &layout->tensors[i] : NULL;
}

float *td_params_alloc(size_t numel) {
  if (numel > TD__PARAMS_MAX_FLOATS)
    return NULL;
  /* Round up to whole cache lines so vector loops may touch the last line. */
  size_t bytes = ((numel ? numel : 1) * sizeof(float) + 63) / 64 * 64;
  void *buf = NULL;
  if (posix_memalign(&buf, 64, bytes) != 0)
    return NULL;
  memset(buf, 0, bytes);
  return buf;
}

void td_params_free(float **buf_p) {
  if (buf_p == NULL)
    return;
  free(*buf_p);
  *buf_p = NULL;
}
