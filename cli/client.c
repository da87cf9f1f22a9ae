/* client.c: trainctl's side of the daemon's control socket, shared by every
 * command that asks traind (cli/trainctl.c) and by the views that print its
 * answers (cli/views.c).
 *
 * A request is one framed protobuf ControlRequest over the local control
 * socket and one framed ControlResponse back, whose payload is JSON
 * (proto/control.h does the framing). A refusal, or a daemon that does not
 * answer within the timeout, becomes trainctl's one-line error. */
#include "cli/client.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/numfmt.h"
#include "proto/wire.h"

static const char *socket_path;
static int timeout_ms = TD_CONTROL_TIMEOUT_MS;

void td__cli_set_target(const char *path, int timeout) {
  socket_path = path;
  timeout_ms = timeout;
}

const char *td__cli_socket(void) { return socket_path; }

int td__cli_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("trainctl: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

int td__cli_request(Traind__ControlRequest *req, json_object **json, uint64_t *total, char *why,
                    size_t why_len) {
  Traind__ControlResponse *resp = NULL;
  if (td_control_call(socket_path, req, timeout_ms, &resp, why, why_len) != 0)
    return 1;
  if (resp->status != 0) {
    snprintf(why, why_len, "%s", resp->error && resp->error[0] ? resp->error : "request refused");
    td_wire_free_response(&resp);
    return 1;
  }
  *json = json_tokener_parse(resp->json ? resp->json : "null");
  if (total != NULL)
    *total = resp->total;
  td_wire_free_response(&resp);
  if (*json == NULL) {
    snprintf(why, why_len, "traind answered with malformed JSON");
    return 1;
  }
  return 0;
}

int td__cli_call_paged(Traind__ControlRequest *req, json_object **json, uint64_t *total) {
  char why[1024];
  return td__cli_request(req, json, total, why, sizeof why) != 0 ? td__cli_die("%s", why) : 0;
}

int td__cli_call(Traind__ControlRequest *req, json_object **json) {
  return td__cli_call_paged(req, json, NULL);
}

const char *td__cli_jstr(json_object *o, const char *key) {
  json_object *v;
  if (!json_object_object_get_ex(o, key, &v) || v == NULL)
    return "-";
  return json_object_get_string(v);
}

double td__cli_jnum(json_object *o, const char *key) {
  json_object *v;
  if (!json_object_object_get_ex(o, key, &v) || v == NULL)
    return NAN;
  return json_object_get_double(v);
}

void td__cli_fmt_num(char *buf, size_t len, double v, int decimals, int width) {
  if (isnan(v))
    snprintf(buf, len, "-");
  else
    td_numfmt_bounded(buf, len, v, decimals, width);
}
