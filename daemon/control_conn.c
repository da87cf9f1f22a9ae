/* control_conn.c: a control connection's life and its one answer.
 *
 * Threads: loop thread. libuv frees nothing a handle uses before its close
 * callback, so a connection is freed only when the last close callback has
 * run and no ledger query still refers to it. A client that goes away before
 * it reads the answer is a closed client, nothing more: the daemon ignores
 * SIGPIPE (node.c) and a failed write just closes the connection. */
#include "daemon/control_conn.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "daemon/base/log.h"

void td__control_conn_unref(conn_t *c) {
  if (--c->refs > 0)
    return;
  td__control_t *ctl = c->ctl;
  for (conn_t **p = &ctl->conns; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  td__joinprobe_close(&c->probe);
  free(c->start_text);
  free(c->buf);
  free(c->out);
  free(c);
}

static void on_handle_closed(uv_handle_t *h) { td__control_conn_unref(h->data); }

void td__control_conn_close(conn_t *c) {
  if (c->closing)
    return;
  c->closing = true;
  if (c->ctl->pending_join == c)
    c->ctl->pending_join = NULL;
  td__session_t *s = c->start_text != NULL ? td__session_of(c->ctl->n, c->start_run) : NULL;
  if (s != NULL) { /* trainctl left before the run was announced: nobody else knows it */
    td_log_info("run %016" PRIx64 " stopped: its trainctl start went away", s->run_id);
    td_run_stop(s->run);
  } else if (c->start_run != 0 && !c->start_released &&
             (s = td__session_of(c->ctl->n, c->start_run)) != NULL) {
    td_run_go(s->run); /* announced: it goes on without the answer */
  }
  uv_close((uv_handle_t *)&c->wait_timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
}

static void on_written(uv_write_t *req, int status) {
  (void)status; /* UV_EPIPE: the client left without reading; nothing to do */
  td__control_conn_close(req->data);
}

/* Send one framed response (status 0 with a JSON payload, or an error). */
void td__control_respond_total(conn_t *c, int status, const char *error, const char *json,
                               uint64_t total) {
  if (c->responded || c->closing)
    return;
  c->responded = true;
  Traind__ControlResponse resp = TRAIND__CONTROL_RESPONSE__INIT;
  resp.status = status;
  resp.error = (char *)(error ? error : "");
  resp.json = (char *)(json ? json : "");
  resp.total = total;
  size_t len;
  int rc = td_control_frame_response(&resp, &c->out, &len);
  if (rc == TD_ERANGE) {
    char msg[160];
    snprintf(msg, sizeof msg, "the answer exceeds the %u-byte control limit",
             TD_WIRE_MAX_CONTROL);
    resp = (Traind__ControlResponse)TRAIND__CONTROL_RESPONSE__INIT;
    resp.status = TD_ERANGE;
    resp.error = msg;
    rc = td_control_frame_response(&resp, &c->out, &len);
  }
  uv_buf_t b = uv_buf_init((char *)c->out, (unsigned)len);
  c->write_req.data = c;
  if (rc != 0 || uv_write(&c->write_req, (uv_stream_t *)&c->pipe, &b, 1, on_written) != 0)
    td__control_conn_close(c);
}
