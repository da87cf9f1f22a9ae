/* control.c: the control socket: it takes trainctl's connections, reads one
 * framed request on each (proto/control.h) and hands it to its command.
 *
 * Threads: loop thread; a rounds query reads the ledger on the work pool
 * (ledgerq.c) and answers from its done callback. One connection carries one
 * request and one response (control_conn.c). The commands that change who
 * belongs (join, key, allow, revoke) are in control_admit.c, those about the
 * run (start, stop, verify) in control_run.c; the rest answer here.
 *
 * The clients hold at most their share of the descriptor budget
 * (descriptors.c plans `control_clients`, at most 64). A client accepted
 * while the share is full makes room by closing the open client that has been
 * idle longest (no whole request read yet; the least recently accepted or
 * heard from), so that whoever holds idle connections cannot lock the
 * operator out: a new `trainctl status` always evicts one of them. A client
 * with a request in flight is never closed for another; when all of them
 * have one, the newcomer is told the socket is busy and closed. */
#include "daemon/control_admit.h"
#include "daemon/control_conn.h"
#include "daemon/control_run.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/base/log.h"

#define LISTEN_BACKLOG 16
/* Smallest read buffer offered to libuv. */
#define READ_CHUNK 4096
/* A share that overflows again after this long is a new burst, logged anew. */
#define CROWDED_LOG_GAP_MS 10000

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

/* status's JSON, with the clients of this socket in its descriptors object
 * beside their share (status.c plans nothing of them: they are counted here):
 * how many are open, how many idle ones were closed to make room, how many
 * newcomers were turned away because every open one had a request in flight */
static json_object *status_json(td__control_t *ctl) {
  json_object *o = td__status_json(ctl->n), *d = NULL;
  if (!json_object_object_get_ex(o, "descriptors", &d) || d == NULL)
    return o;
  int64_t open = 0;
  for (const conn_t *c = ctl->conns; c != NULL; c = c->next)
    open += !c->closing;
  json_object_object_add(d, "control_clients", json_object_new_int64(open));
  json_object_object_add(d, "control_evicted", json_object_new_int64((int64_t)ctl->evicted));
  json_object_object_add(d, "control_refused", json_object_new_int64((int64_t)ctl->refused));
  return o;
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
  case TRAIND__CONTROL_REQUEST__COMMAND__STATUS: respond_json(c, status_json(c->ctl)); break;
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
  if (nread > 0)
    c->active_seq = ++c->ctl->activity_seq;
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
  c->requested = true;
  handle_request(c, c->buf + TD_CONTROL_HEADER_BYTES, frame);
}

/* The clients' share of the descriptor budget; never 0, or none could talk. */
static uint64_t control_share(const td__control_t *ctl) {
  uint64_t share = td__transport_descriptors(ctl->n->net)->control_clients;
  return share > 0 ? share : 1;
}

static void note_crowded(td__control_t *ctl, uint64_t open, const char *what) {
  uint64_t now = uv_now(&ctl->n->loop);
  bool first = ctl->evicted + ctl->refused == 1;
  if (first || now - ctl->crowded_ms >= CROWDED_LOG_GAP_MS)
    td_log_warn("control socket: %" PRIu64 " clients fill their share of descriptors: %s "
                "(the rest of this burst is counted in status, not logged: %" PRIu64
                " evicted, %" PRIu64 " refused so far)",
                open, what, ctl->evicted, ctl->refused);
  ctl->crowded_ms = now;
}

/* Bytes a client sent that the loop has not read yet: a client accepted in a
 * burst may hold its whole request there, unseen, while more clients come. */
static bool has_unread(conn_t *c) {
  uv_os_fd_t fd;
  int unread = 0;
  return uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 && ioctl(fd, FIONREAD, &unread) == 0 &&
         unread > 0;
}

/* Keep the open clients within their share as `fresh` comes in: close the
 * idle one heard from least recently (one whose request waits unread is
 * spared while another will do), or, when every other one is being served,
 * answer `fresh` that the socket is busy. False when `fresh` was turned away. */
static bool make_room(td__control_t *ctl, conn_t *fresh) {
  uint64_t share = control_share(ctl), open = 0;
  for (conn_t *c = ctl->conns; c != NULL; c = c->next)
    open += c != fresh && !c->closing;
  if (open < share)
    return true;
  conn_t *idlest = NULL, *silent = NULL;
  for (conn_t *c = ctl->conns; c != NULL; c = c->next) {
    if (c == fresh || c->closing || c->requested || c->responded)
      continue;
    if (idlest == NULL || c->active_seq < idlest->active_seq)
      idlest = c;
    if ((silent == NULL || c->active_seq < silent->active_seq) && !has_unread(c))
      silent = c;
  }
  if (silent != NULL)
    idlest = silent;
  if (idlest != NULL) {
    ctl->evicted++;
    note_crowded(ctl, open, "closed the client idle longest to let a new one in");
    td__control_conn_close(idlest);
    return true;
  }
  ctl->refused++;
  note_crowded(ctl, open, "each has a request in flight, so a new client was told to retry");
  char why[160];
  snprintf(why, sizeof why,
           "the control socket is busy: %" PRIu64 " clients have requests in flight; try again",
           open);
  respond(fresh, TD_EIO, why, NULL);
  return false;
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
  c->active_seq = ++ctl->activity_seq;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) {
    td__control_conn_close(c);
    return;
  }
  if (make_room(ctl, c) && uv_read_start((uv_stream_t *)&c->pipe, conn_alloc, conn_read) != 0)
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
