/* params.c: tensor layout of the flat parameter buffer and aligned buffers. */
#include "compute/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"

struct td_layout {
  td_tensor_info_t *tensors;
  size_t count, cap;
  size_t numel;       /* padded total */
  size_t param_count; /* real parameters */
};

int td_layout_new(td_layout_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : TD_ENOMEM;
}

int td_layout_add(td_layout_t *l, const char *name, uint32_t ndim, const uint32_t *shape) {
  if (name == NULL || strlen(name) >= TD_TENSOR_NAME_MAX || ndim == 0 ||
      ndim > TD_TENSOR_MAX_DIMS)
    return TD_EINVAL;
  size_t numel = 1;
  for (uint32_t d = 0; d < ndim; d++) {
    if (shape[d] == 0 || numel > SIZE_MAX / 4 / shape[d])
      return TD_EINVAL;
    numel *= shape[d];
  }
  if (l->count == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    td_tensor_info_t *t = realloc(l->tensors, cap * sizeof *t);
    if (t == NULL)
      return TD_ENOMEM;
    l->tensors = t;
    l->cap = cap;
  }
  td_tensor_info_t *t = &l->tensors[l->count];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof *shape);
  t->offset = l->numel;
  t->numel = numel;
  size_t padded = (numel + TD_PARAMS_ALIGN_FLOATS - 1) / TD_PARAMS_ALIGN_FLOATS *
                  TD_PARAMS_ALIGN_FLOATS;
  l->numel += padded;
  l->param_count += numel;
  return (int)l->count++;
}

void td_layout_free(td_layout_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free((*self_p)->tensors);
  free(*self_p);
  *self_p = NULL;
}

size_t td_layout_numel(const td_layout_t *l) { return l->numel; }
size_t td_layout_param_count(const td_layout_t *l) { return l->param_count; }
size_t td_layout_count(const td_layout_t *l) { return l->count; }

const td_tensor_info_t *td_layout_tensor(const td_layout_t *l, size_t i) {
  return i < l->count ? &l->tensors[i] : NULL;
}

float *td_params_alloc(size_t numel) {
  void *p = NULL;
  size_t bytes = (numel ? numel : 1) * sizeof(float);
  bytes = (bytes + 63) / 64 * 64;
  if (posix_memalign(&p, 64, bytes) != 0)
    return NULL;
  memset(p, 0, bytes);
  return p;
}

void td_params_free(float **buf_p) {
  if (buf_p == NULL)
    return;
  free(*buf_p);
  *buf_p = NULL;
}
