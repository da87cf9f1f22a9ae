/* fragment.c: the slices of Streaming DiLoCo's fragments, each round's
 * update on its slice and the mixing of an arrived average (fragment.h). */
#include "scheduler/fragment.h"

#include <assert.h>
#include <string.h>

unsigned td_fragment_of(uint64_t round, unsigned parts) {
  assert(parts >= 1);
  return (unsigned)(round % parts);
}

void td_fragment_span(size_t numel, unsigned parts, uint64_t round, size_t *offset,
                      size_t *count) {
  assert(parts >= 1 && parts <= numel);
  size_t f = td_fragment_of(round, parts), base = numel / parts, extra = numel % parts;
  /* the first `extra` slices hold one float more */
  *offset = f * base + (f < extra ? f : extra);
  *count = base + (f < extra ? 1 : 0);
}

void td_fragment_delta(float *update, const float *params, const float *anchor, size_t numel,
                       size_t offset, size_t count) {
  memset(update, 0, offset * sizeof(float));
  for (size_t i = offset; i < offset + count; i++)
    update[i] = params[i] - anchor[i];
  memset(update + offset + count, 0, (numel - offset - count) * sizeof(float));
}

void td_fragment_mix(float *params, const float *anchor, double alpha, size_t n) {
  if (alpha == 0) { /* sync mode: exactly the anchor, no rounding */
    memcpy(params, anchor, n * sizeof(float));
    return;
  }
  const float a = (float)alpha, b = (float)(1.0 - alpha);
  for (size_t i = 0; i < n; i++)
    params[i] = a * params[i] + b * anchor[i];
}
