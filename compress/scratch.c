/* scratch.c: the per-tensor scratch buffer that codecs borrow while they
 * encode (top-k's magnitudes, PowerSGD's factors). Kept apart from codec.c,
 * the registry that lists the codecs, so that a codec using it does not call
 * back into the file that registers it. */
#include <stdlib.h>

#include "compress/codec_impl.h"

float *td__codec_scratch(td_codec_tensor_state_t *st, size_t n) {
  if (st->scratch_floats < n) {
    float *p = realloc(st->scratch, n * sizeof *p);
    if (p == NULL)
      return NULL;
    st->scratch = p;
    st->scratch_floats = n;
  }
  return st->scratch;
}
