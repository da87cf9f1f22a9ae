/* fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (compute/safetensors.c). Every input must be refused with TD_ECORRUPT (or
 * TD_ENOMEM) or accepted with tensors that lie inside the data; an accepted
 * file is then loaded into a layout made of its own tensors, which reads
 * every byte of every tensor, so a reader that let an offset or a shape past
 * the data through reads out of bounds here (ASan, valgrind). */
#include <stdint.h>
#include <stdlib.h>

#include "common/error.h"
#include "compute/params.h"
#include "compute/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  td_safetensors_t *st = NULL;
  char why[256];
  int rc = td_safetensors_parse(&st, data, size, why, sizeof why);
  if (rc != 0 && rc != TD_ECORRUPT && rc != TD_ENOMEM)
    abort();
  if (rc != 0)
    return 0;
  td_layout_t *layout = NULL;
  size_t total = 0;
  if (td_layout_new(&layout) != 0)
    abort();
  for (size_t i = 0; i < td_safetensors_count(st); i++) {
    const td_tensor_info_t *t = td_safetensors_tensor(st, i);
    total += t->numel;
    if (total > ((size_t)1 << 24) || td_layout_add(layout, t->name, t->ndim, t->shape) < 0) {
      total = 0; /* a huge (but consistent) file: parsing it was the test */
      break;
    }
  }
  if (total > 0) {
    float *params = td_params_alloc(td_layout_numel(layout));
    if (params != NULL) {
      rc = td_safetensors_load(st, layout, params, "fuzz", why, sizeof why);
      if (rc != 0 && rc != TD_ENUMERIC)
        abort();
    }
    td_params_free(&params);
  }
  td_layout_free(&layout);
  td_safetensors_close(&st);
  return 0;
}
