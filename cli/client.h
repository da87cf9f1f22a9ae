/* client.h: what trainctl's commands share to talk to traind (cli/client.c).
 *
 * Where the daemon is (its control socket and how long to wait for it), one
 * request and its answer, the one-line error every command prints, and the
 * readers of the answer's JSON fields. The command table (cli/trainctl.c) and
 * the views (cli/views.c) call down into this file, never the other way. */
#ifndef TD_CLI_CLIENT_H
#define TD_CLI_CLIENT_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/control.h"

/* Ask the daemon at socket_path (borrowed for the process's life), giving up
 * after timeout_ms. Set once, before the first request. */
void td__cli_set_target(const char *socket_path, int timeout_ms);
/* The control socket requests go to. */
const char *td__cli_socket(void);
/* "trainctl: error: ..." and a newline on stderr; returns 1 (the exit code). */
int td__cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One request, one response (proto/control.h). On success *json holds the
 * payload (caller frees) and *total (when not NULL) the row count of a paged
 * answer; else 1 with the reason in why (the daemon's refusal, or why it did
 * not answer). */
int td__cli_request(Traind__ControlRequest *req, json_object **json, uint64_t *total, char *why,
                    size_t why_len);
/* td__cli_request(), the reason printed as trainctl's one-line error. */
int td__cli_call_paged(Traind__ControlRequest *req, json_object **json, uint64_t *total);
int td__cli_call(Traind__ControlRequest *req, json_object **json);
/* Field `key` of o as text (borrowed from o); "-" when absent or null. */
const char *td__cli_jstr(json_object *o, const char *key);
/* Field `key` of o as a number; NAN when absent or null. */
double td__cli_jnum(json_object *o, const char *key);
/* v with `decimals` decimals in at most `width` characters (a diverged loss
 * is 1.235e+30, not 31 digits), or "-" when the daemon sent none (NAN). */
void td__cli_fmt_num(char *buf, size_t len, double v, int decimals, int width);

#endif
