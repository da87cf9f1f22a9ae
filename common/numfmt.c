/* numfmt.c: the exact and the bounded forms of numfmt.h. */
#include "common/numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *non_finite(char *buf, size_t len, double v) {
  snprintf(buf, len, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
  return buf;
}

const char *td_numfmt_exact(char *buf, size_t len, double v) {
  if (buf == NULL || len == 0)
    return "";
  if (!isfinite(v))
    return non_finite(buf, len, v);
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(buf, len, "%.*g", digits, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  return buf;
}

const char *td_numfmt_bounded(char *buf, size_t len, double v, int decimals, int width) {
  if (buf == NULL || len == 0)
    return "";
  if (!isfinite(v))
    return non_finite(buf, len, v);
  int n = snprintf(buf, len, "%.*f", decimals, v);
  for (int digits = decimals > 0 ? decimals : 1; n > width && digits >= 1; digits--)
    n = snprintf(buf, len, "%.*g", digits, v);
  return buf;
}
