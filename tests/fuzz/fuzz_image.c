/* fuzz_image.c: libFuzzer target for the PNG and JPEG decoders
 * (compute/data/image.h); replay_png and replay_jpeg replay it over their
 * own corpora. Every input must be refused with TD_ECORRUPT (or TD_ENOMEM)
 * or probe to a size within the limits; an accepted one is decoded to grey
 * and to RGB into buffers of exactly channels x height x width floats, so a
 * decoder that wrote past the declared size is caught (ASan, valgrind). */
#include <stdint.h>
#include <stdlib.h>

#include "common/error.h"
#include "compute/data/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  td_image_info_t info;
  char why[256];
  int rc = td_image_probe(&info, data, size, "fuzz", why, sizeof why);
  if (rc != 0 && rc != TD_ECORRUPT && rc != TD_ENOMEM)
    abort();
  if (rc != 0)
    return 0;
  if (info.width == 0 || info.height == 0 || info.width > TD_IMAGE_MAX_SIDE ||
      info.height > TD_IMAGE_MAX_SIDE || (uint64_t)info.width * info.height > TD_IMAGE_MAX_PIXELS)
    abort();
  size_t plane = (size_t)info.width * info.height;
  for (int channels = 1; channels <= 3; channels += 2) {
    float *out = malloc(plane * (size_t)channels * sizeof *out);
    if (out == NULL)
      abort();
    rc = td_image_decode(out, channels, info.width, info.height, data, size, "fuzz", why,
                         sizeof why);
    if (rc != 0 && rc != TD_ECORRUPT && rc != TD_ENOMEM)
      abort();
    free(out);
  }
  return 0;
}
