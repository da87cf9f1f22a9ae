/* json.c: ids and measures as the daemon's JSON answers carry them (json.h). */
#include "daemon/base/json.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>

#include "common/numfmt.h"

json_object *td__json_id(uint64_t id) {
  char b[24];
  snprintf(b, sizeof b, "%016" PRIx64, id);
  return json_object_new_string(b);
}

/* Written in its shortest round-trip form (0.05, not json-c's %.17g 0.050000000000000003). */
json_object *td__json_real(double v) {
  char num[40];
  return isfinite(v) ? json_object_new_double_s(v, td_numfmt_exact(num, sizeof num, v)) : NULL;
}
