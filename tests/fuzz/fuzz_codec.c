/* fuzz_codec.c: libFuzzer target for the update decoder. The input is taken
 * as a compressed update message for a small fixed model (one compressible
 * 32 x 64 matrix, one dense 10 x 32 matrix, two biases) and must either decode
 * to finite values or be refused, and the same when read as either half of
 * the model (a fragments = 2 slice: zeros outside it); it may never crash,
 * hang or read out of bounds. `make check` replays the corpus in tests/fuzz/corpus/codec. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "compress/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static td_layout_t *fuzz_layout(void) {
  static td_layout_t *layout;
  if (layout == NULL) {
    uint32_t w0[2] = {32, 64}, b0[1] = {32}, w1[2] = {10, 32}, b1[1] = {10};
    td_layout_new(&layout);
    td_layout_add(layout, "fc0.weight", 2, w0);
    td_layout_add(layout, "fc0.bias", 1, b0);
    td_layout_add(layout, "fc1.weight", 2, w1);
    td_layout_add(layout, "fc1.bias", 1, b1);
  }
  return layout;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  td_layout_t *layout = fuzz_layout();
  size_t n = td_layout_numel(layout);
  float *out = td_params_alloc(n);
  char why[256];
  if (td_codec_decode_message(layout, data, size, out, NULL, why, sizeof why) == 0)
    for (size_t i = 0; i < n; i++)
      if (!isfinite(out[i]))
        abort(); /* the decoder promised finite values */
  /* the same bytes as either half of the model (fragments = 2's slices, the
   * first cutting fc0.weight): finite inside, zero outside, or refused */
  const size_t offs[2] = {0, n / 2 + n % 2}, counts[2] = {n / 2 + n % 2, n / 2};
  for (int h = 0; h < 2; h++)
    if (td_codec_decode_range(layout, offs[h], counts[h], data, size, out, NULL, why,
                              sizeof why) == 0)
      for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i]) ||
            ((i < offs[h] || i >= offs[h] + counts[h]) && out[i] != 0))
          abort();
  td_params_free(&out);
  return 0;
}
