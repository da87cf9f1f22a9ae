/* control_conn.h: one connection of the control socket, as the files of
 * the control socket share it: control.c (the socket, reading a request and
 * sending it to its command), control_admit.c (join, key, allow, revoke) and
 * control_run.c (start, stop, verify). control_conn.c owns a connection's
 * life and its one answer. Nothing outside these files includes this one.
 *
 * Threads: loop thread. A connection owns two libuv handles (its pipe and
 * the timer of a pending `join` or `start`) and may have one ledger query in
 * flight; `refs` counts them, and the connection is freed when the last
 * one lets go. */
#ifndef TD_DAEMON_CONTROL_CONN_H
#define TD_DAEMON_CONTROL_CONN_H

#include <json-c/json.h>

#include "daemon/internal.h"
#include "daemon/net/joinprobe.h"
#include "proto/control.h"

typedef struct conn {
  struct conn *next; /* the control's list of open connections */
  td__control_t *ctl;
  uv_pipe_t pipe;
  uv_timer_t wait_timer;
  unsigned refs; /* open handles + a query in flight */
  bool closing, responded;
  /* a whole request was read: the client is being served and is never
   * closed to make room for another */
  bool requested;
  /* when it was accepted or last sent bytes, on the control's activity count */
  uint64_t active_seq;
  uint8_t *buf;
  size_t len, cap;
  uv_write_t write_req;
  uint8_t *out;
  char join_endpoint[TD_ENDPOINT_MAX];
  /* a pending join: the key it admitted here (empty when it was listed
   * already, or insecure), the key the node must hold (empty: insecure), the
   * node it stands for, when it began on the loop clock, and its handshake
   * probe (opened once, when the welcome is slow) */
  char join_admitted[TD_KEY_Z85_LEN + 1], join_key[TD_KEY_Z85_LEN + 1];
  uint64_t join_peer, join_began_ms;
  bool join_probed, join_accepted;
  td__joinprobe_t *probe;
  /* a join by invite: first its request and grant on the probe's connection */
  bool join_by_invite;
  /* a pending start: its run, the RunStart spec text until it is sent, the
   * members, and when the start began on the loop clock */
  uint64_t start_run, start_began_ms, start_announced_ms;
  bool start_released;
  char *start_text;
  uint64_t start_members[TD_MEMBERS_MAX];
  size_t start_n;
} conn_t;

struct td__control {
  td__node_t *n;
  uv_pipe_t server;
  bool listening, bound, stopped;
  conn_t *conns;
  conn_t *pending_join;
  /* the clients' share (control.c): every accept or read takes the next
   * activity number; evicted and refused count the clients let go when the
   * share was full, and crowded_ms is when that last happened (loop clock) */
  uint64_t activity_seq, evicted, refused, crowded_ms;
};

/* Drop one reference (a closed handle, a finished query); the last frees
 * the connection and unlinks it from its control. */
void td__control_conn_unref(conn_t *c);
/* Close both handles (once): a start not yet announced is stopped, an
 * announced one goes on without its answer. */
void td__control_conn_close(conn_t *c);
/* Send one framed response (status 0 with a JSON payload, or an error) and
 * close the connection once it is written; only the first call answers. */
void td__control_respond_total(conn_t *c, int status, const char *error, const char *json,
                               uint64_t total);

/* The short spellings every command uses. respond_json consumes `o`. */
static inline void respond(conn_t *c, int status, const char *error, const char *json) {
  td__control_respond_total(c, status, error, json, 0);
}

static inline void respond_json(conn_t *c, json_object *o) {
  respond(c, 0, NULL, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  json_object_put(o);
}

#endif
