/* fuzz_npy.c: libFuzzer target for the .npy header parser and element
 * converters (compute/data/npy.h). Every input must be refused with
 * TD_ECORRUPT or accepted with a header whose data ends exactly at the end
 * of the input; an accepted input is then converted both as features and
 * as labels into buffers of exactly the declared size, so a parser that let
 * a lying shape through reads or writes out of bounds here (ASan,
 * valgrind). */
#include <stdint.h>
#include <stdlib.h>

#include "common/error.h"
#include "compute/data/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  td_npy_header_t h;
  char why[256];
  int rc = td_npy_parse_header(&h, data, size, size, "fuzz.npy", why, sizeof why);
  if (rc != 0 && rc != TD_ECORRUPT)
    abort();
  if (rc != 0)
    return 0;
  if (h.header_bytes + h.data_bytes != size || h.data_bytes != h.rows * h.row_values * h.elem_bytes)
    abort();
  size_t values = (size_t)(h.rows * h.row_values);
  if (values > ((size_t)1 << 22))
    return 0; /* consistent but large: parsing it was the test */
  const uint8_t *src = data + h.header_bytes;
  float *x = malloc(values * sizeof *x + 1);
  int32_t *y = malloc(values * sizeof *y + 1);
  if (x == NULL || y == NULL)
    abort();
  rc = td_npy_features(&h, src, values, 0, x, "fuzz.npy", why, sizeof why);
  if (rc != 0 && rc != TD_ECORRUPT)
    abort();
  int max_label = 0;
  rc = td_npy_labels(&h, src, values, 0, y, &max_label, "fuzz.npy", why, sizeof why);
  if (rc != 0 && rc != TD_ECORRUPT)
    abort();
  free(x);
  free(y);
  return 0;
}
