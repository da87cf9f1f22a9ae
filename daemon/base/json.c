/* json.c: ids and measures as the daemon's JSON answers carry them (json.h). */
#include "daemon/base/json.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>

json_object *td__json_id(uint64_t id) {
  char b[24];
  snprintf(b, sizeof b, "%016" PRIx64, id);
  return json_object_new_string(b);
}

json_object *td__json_real(double v) { return isfinite(v) ? json_object_new_double(v) : NULL; }
