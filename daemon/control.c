/* control.c: the control socket: it takes trainctl's connections, reads one
 * framed request on each (proto/control.h) and hands it to its command.
 *
 * Threads: loop thread; a rounds query reads the ledger on the work pool
 * (ledgerq.c) and answers from its done callback. One connection carries one
 * request and one response (control_conn.c). The commands that change who
 * belongs (join, key, allow, revoke) are in control_admit.c, those about the
 * run (start, stop, verify) in control_run.c; the rest answer here. */
#include "daemon/control_admit.h"
#include "daemon/control_conn.h"
#include "daemon/control_run.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/error.h"

#define LISTEN_BACKLOG 16
/* Smallest read buffer offered to libuv. */
#define READ_CHUNK 4096

static void rounds_answered(char *json, uint64_t total, void *user) {
  conn_t *c = user;
  if (json == NULL)
    respond(c, TD_ENOMEM, "out of memory", NULL);
  else
    td__control_respond_total(c, 0, NULL, json, total);
  free(json);
  td__control_conn_unref(c); /* the query's reference */
}

static void cmd_rounds(conn_t *c, const Traind__ControlRequest *req) {
  td__node_t *n = c->ctl->n;
  uint64_t run_id = td__session_last_id(n);
  if (run_id == 0) {
    respond(c, 0, NULL, "[]");
    return;
  }
  uint64_t limit = req->page_size ? req->page_size : UINT64_MAX;
  c->refs++;
  if (td__ledger_rounds_query(n->ledger, run_id, req->last, req->page_from, limit,
                              rounds_answered, c) != 0) {
    c->refs--;
    respond(c, TD_EIO, "cannot query the ledger", NULL);
  }
}

static void handle_request(conn_t *c, const uint8_t *frame, size_t len) {
  td__node_t *n = c->ctl->n;
  Traind__ControlRequest *req = NULL;
  char why[256];
  if (td_wire_unpack_request(&req, frame, len, why, sizeof why) != 0) {
    respond(c, TD_EPROTO, why, NULL);
    return;
  }
  switch (req->command) {
  case TRAIND__CONTROL_REQUEST__COMMAND__STATUS: respond_json(c, td__status_json(n)); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__JOIN:
    td__control_cmd_join(c, req->endpoint, req->key, req->invite);
    break;
  case TRAIND__CONTROL_REQUEST__COMMAND__INVITE: {
    json_object *o = NULL;
    int rc = td__admit_invite(n, req->admin, req->ttl_s ? req->ttl_s : TD__INVITE_TTL_DEFAULT_S,
                              req->count ? req->count : 1, &o, why, sizeof why);
    if (rc != 0)
      respond(c, rc, why, NULL);
    else
      respond_json(c, o);
    break;
  }
  case TRAIND__CONTROL_REQUEST__COMMAND__KEY: td__control_cmd_key(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__ALLOW:
    td__control_cmd_allow(c, req->key, req->admin);
    break;
  case TRAIND__CONTROL_REQUEST__COMMAND__REVOKE: td__control_cmd_revoke(c, req->key); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__START: td__control_cmd_start(c, req); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__STOP: td__control_cmd_stop(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__VERIFY: td__control_cmd_verify(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__PEERS: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "node_id", td__json_id(n->node_id));
    json_object_object_add(o, "endpoint", json_object_new_string(td__transport_endpoint(n->net)));
    json_object_object_add(o, "peers", td__status_peers(n));
    respond_json(c, o);
    break;
  }
  case TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS: cmd_rounds(c, req); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__LEAVE: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "left", td__json_id(n->node_id));
    respond_json(c, o);
    n->shutdown(n, "trainctl leave");
    break;
  }
  default: respond(c, TD_EINVAL, "unknown command", NULL); break;
  }
  td_wire_free_request(&req);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)suggested;
  if (c->cap - c->len < READ_CHUNK) {
    size_t cap = c->cap ? c->cap * 2 : 2 * READ_CHUNK;
    uint8_t *nb = cap <= TD_WIRE_MAX_CONTROL + 2 * TD_CONTROL_HEADER_BYTES ? realloc(c->buf, cap)
                                                                          : NULL;
    if (nb == NULL) {
      *buf = uv_buf_init(NULL, 0);
      return;
    }
    c->buf = nb;
    c->cap = cap;
  }
  *buf = uv_buf_init((char *)c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void conn_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = s->data;
  (void)buf;
  if (nread < 0) { /* the client left (or sent too much): nothing to answer */
    td__control_conn_close(c);
    return;
  }
  c->len += (size_t)nread;
  if (c->len < TD_CONTROL_HEADER_BYTES || c->responded)
    return;
  size_t frame = td_control_frame_len(c->buf);
  if (frame > TD_WIRE_MAX_CONTROL) {
    respond(c, TD_EPROTO, "control request too large", NULL);
    return;
  }
  if (c->len < frame + TD_CONTROL_HEADER_BYTES)
    return;
  uv_read_stop(s);
  handle_request(c, c->buf + TD_CONTROL_HEADER_BYTES, frame);
}

static void on_connection(uv_stream_t *server, int status) {
  td__control_t *ctl = server->data;
  if (status < 0 || ctl->stopped)
    return;
  conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return;
  c->ctl = ctl;
  c->next = ctl->conns;
  ctl->conns = c;
  uv_pipe_init(&ctl->n->loop, &c->pipe, 0);
  uv_timer_init(&ctl->n->loop, &c->wait_timer);
  c->pipe.data = c->wait_timer.data = c;
  c->refs = 2; /* the two handles */
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 ||
      uv_read_start((uv_stream_t *)&c->pipe, conn_alloc, conn_read) != 0)
    td__control_conn_close(c);
}

int td__control_open(td__control_t **out, td__node_t *n, char *why, size_t why_len) {
  struct sockaddr_un addr;
  if (strlen(n->control_path) >= sizeof addr.sun_path)
    return td_why(why, why_len, TD_ECONFIG, "--control path is longer than %zu bytes: %s",
                  sizeof addr.sun_path - 1, n->control_path);
  td__control_t *ctl = calloc(1, sizeof *ctl);
  if (ctl == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  ctl->n = n;
  *out = ctl;
  uv_pipe_init(&n->loop, &ctl->server, 0);
  ctl->server.data = ctl;
  ctl->listening = true;
  unlink(n->control_path); /* a stale socket from a crashed daemon */
  mode_t old = umask(0177); /* the socket is created 0600 */
  int rc = uv_pipe_bind(&ctl->server, n->control_path);
  umask(old);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&ctl->server, LISTEN_BACKLOG, on_connection);
  if (rc != 0)
    return td_why(why, why_len, TD_EIO, "cannot listen on %s: %s", n->control_path,
                  uv_strerror(rc));
  chmod(n->control_path, 0600);
  ctl->bound = true;
  return 0;
}

/* Stop listening and close every connection (shutdown); a write in flight
 * finishes first, as libuv cancels it at close. */
void td__control_stop(td__control_t *ctl) {
  if (ctl == NULL || ctl->stopped)
    return;
  ctl->stopped = true;
  if (ctl->listening)
    uv_close((uv_handle_t *)&ctl->server, NULL);
  for (conn_t *c = ctl->conns; c != NULL; c = c->next)
    if (!c->responded)
      td__control_conn_close(c);
}

void td__control_close(td__control_t **self_p) {
  td__control_t *ctl = *self_p;
  if (ctl == NULL)
    return;
  *self_p = NULL;
  if (ctl->bound)
    unlink(ctl->n->control_path);
  free(ctl);
}
