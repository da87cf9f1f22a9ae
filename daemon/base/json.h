/* json.h: the daemon's JSON values for ids and measures, as trainctl reads
 * them (status, rounds): ids as 16 hex digits, measures as numbers or null. */
#ifndef TD_DAEMON_JSON_H
#define TD_DAEMON_JSON_H

#include <stdint.h>

typedef struct json_object json_object;
/* A node or run id as a 16-digit hex string; caller owns it. */
json_object *td__json_id(uint64_t id);
/* v as a number, or NULL (JSON null) when it is not finite; caller owns it. */
json_object *td__json_real(double v);

#endif
