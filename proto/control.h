/* control.h: the framing of the local control socket, for traind and trainctl.
 *
 * One request, one response per connection: each a 4-byte big-endian
 * length, then a protobuf ControlRequest / ControlResponse (proto/wire.h
 * packs and checks them) of at most TD_WIRE_MAX_CONTROL bytes. The daemon
 * frames its answers with td_control_frame_response(); trainctl makes its
 * calls with td_control_call(), which gives up after a timeout instead of
 * waiting forever on a daemon that does not answer. */
#ifndef TD_CONTROL_H
#define TD_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

#define TD_CONTROL_HEADER_BYTES 4
/* How long trainctl waits for an answer by default. */
#define TD_CONTROL_TIMEOUT_MS 30000
/* Rows of `trainctl rounds` asked for per request. */
#define TD_CONTROL_ROUNDS_PAGE 2000

/* Length of the frame whose header is hdr. */
size_t td_control_frame_len(const uint8_t hdr[TD_CONTROL_HEADER_BYTES]);
/* Pack resp with its header. Caller owns *out (free()); TD_ERANGE when it
 * exceeds TD_WIRE_MAX_CONTROL, TD_EPROTO when it cannot be packed. */
int td_control_frame_response(Traind__ControlResponse *resp, uint8_t **out, size_t *len);

/* Connect to the daemon at `path`, send req and read its answer, waiting at
 * most timeout_ms for each read and write. Caller owns *out (free it with
 * td_wire_free_response()). TD_ENOENT when no daemon listens there, TD_EIO
 * (closed, truncated, timed out) and TD_EPROTO otherwise, each with why. */
int td_control_call(const char *path, Traind__ControlRequest *req, int timeout_ms,
                    Traind__ControlResponse **out, char *why, size_t why_len);

#endif
