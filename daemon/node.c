/* node.c: the traind event loop: peers, membership, runs, control, ledger.
 *
 * Threads: everything in this file runs on the loop thread except the work
 * callbacks (ledger_flush_work, rounds_query_work, pack_work), which run in the
 * libuv pool and touch only what they were handed. The ROUTER socket receives
 * from every peer; one DEALER per peer sends to it. ZMQ_FD is edge-triggered,
 * so every wake-up drains the socket while ZMQ_EVENTS reports input, and the
 * heartbeat timer drains it once more as a safety net. Nothing received is
 * trusted: envelopes go through proto/wire.c, chunks through
 * scheduler/round.c, and every refusal is counted and logged. */
#include "daemon/node.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#include "compress/codec.h"
#include "compute/error.h"
#include "daemon/ledger.h"
#include "daemon/log.h"
#include "daemon/members.h"
#include "daemon/run.h"
#include "daemon/runspec.h"
#include "proto/wire.h"
#include "scheduler/linkq.h"
#include "scheduler/plan.h"
#include "scheduler/recon.h"
#include "scheduler/round.h"

#define MAX_LINKS TD_MEMBERS_MAX
#define ZMQ_HARD_MAX_MSG (16 << 20)

/* ---- ledger write queue ------------------------------------------------------ */

typedef enum {
  OP_RUN_START, OP_RUN_END, OP_PEER, OP_ROUND, OP_UPDATE, OP_EVENT, OP_CKPT, OP_LINK
} op_kind_t;

typedef struct ledger_op {
  struct ledger_op *next;
  op_kind_t kind;
  uint64_t run_id, id, round;
  double at, value, value2;
  char text[256];
  char *big; /* spec text (owned) */
  void *blob; /* checkpoint (owned) */
  size_t blob_bytes;
  td_ledger_round_t round_row;
  td_ledger_update_t update_row;
  td_ledger_link_t link_row;
} ledger_op_t;

typedef struct {
  double sent_at; /* mono seconds; 0 when acked or never sent */
  uint64_t round, bytes;
  char codec[32];
} pending_update_t;

typedef struct link {
  uint64_t peer; /* 0 until the node behind `endpoint` introduced itself */
  char endpoint[TD_ENDPOINT_MAX];
  /* Two connections per link, so control traffic (hello, heartbeats, acks,
   * run start/stop) never queues behind a multi-megabyte update in the same
   * ZeroMQ pipe and TCP stream: on a 2 Mbit/s uplink one dense update takes
   * seconds, long enough to get a healthy peer suspected. */
  void *sock;     /* update chunks (bulk), paced by q */
  void *ctl_sock; /* everything else */
  td_linkq_t *q;  /* update chunks waiting for the window (scheduler/linkq.h) */
  uint64_t bytes_sent, bytes_recv, msgs_sent, msgs_recv, send_drops;
  /* updates only: bytes on the wire and the dense fp32 bytes they stand for */
  uint64_t update_wire_sent, update_dense_sent, update_wire_recv, update_dense_recv;
  char codec[32];
  /* per-link measurement from update acknowledgements (ALGORITHMS.md 6.2):
   * the receiver acks each complete update; goodput = its bytes over the
   * time from our send to the ack, EWMA. budget = goodput x compute time. */
  double goodput_bps, ack_s, budget;
  pending_update_t pending[2]; /* updates awaiting their ack, by round % 2 */
} link_t;

typedef struct control_conn control_conn_t;

#define OWN_RING 4

/* A member's last validation score (knowledge transfer). */
typedef struct {
  uint64_t round;
  double loss;
  bool have;
} report_t;

/* What the compute thread reported for one of its rounds. */
typedef struct {
  uint64_t round, samples;
  double loss, compute_s, idle_s, lr, capacity, done_at;
  double fill_s; /* overlap: extra steps while waiting (not in compute_s) */
  double uplink; /* bytes/s, as sent with the round's update (own_uplink) */
  unsigned batch, steps, fill_steps;
  double eval_acc;        /* test accuracy evaluated after the round, NAN until then */
  bool row_written;       /* its ledger row exists (row holds it) */
  td_ledger_round_t row;
} own_round_t;

typedef struct node {
  uv_loop_t loop;
  void *zctx, *router, *monitor;
  uv_poll_t router_poll, monitor_poll;
  uv_pipe_t control;
  uv_timer_t heartbeat_timer;
  uv_timer_t pump_timer; /* next time a queued chunk becomes sendable */
  double link_delay_s;
  uv_signal_t sigint, sigterm;
  bool shutting_down;

  uint64_t node_id, seq;
  char endpoint[TD_ENDPOINT_MAX];
  char data_dir[512], control_path[640];
  unsigned threads;
  double heartbeat_s;
  td_members_t *members;
  link_t links[MAX_LINKS];
  size_t n_links;

  td_ledger_t *ledger;
  pthread_mutex_t ledger_mu;
  ledger_op_t *ops_head, *ops_tail;
  bool flush_in_flight;
  uv_work_t flush_req;
  ledger_op_t *flushing;

  struct {
    uint64_t malformed, version, oversized, wrong_run, not_member, late, ahead, rejected,
        duplicate, handshake, nonfinite_local;
  } drops;
  unsigned drop_logs;

  control_conn_t *pending_join;

  struct {
    td_run_t *run;
    uint64_t run_id;
    char *spec_text;
    td_runspec_t spec;
    const char *state; /* idle | running | finished | failed */
    uint64_t members[TD_MEMBERS_MAX];
    size_t n_members;
    unsigned rank;
    td_round_t *collector;            /* sync/overlap: every peer's update of a round */
    td_round_t *peer_inbox[TD_MEMBERS_MAX]; /* async: one collector per peer (by index) */
    float *scratch;                   /* async: a decoded peer update */
    uint64_t peer_round[TD_MEMBERS_MAX]; /* async: newest round received per peer */
    uint64_t round, rounds;           /* open round (sync/overlap); rounds of the run */
    bool ready;
    own_round_t own[OWN_RING];        /* own round r in [r % OWN_RING] */
    uint64_t own_done, packed, pack_pending; /* rounds posted / packed; queued pack */
    double own_loss, lr, capacity;
    double round_started, deadline;
    /* what each member sent with its update of round r, at [r % OWN_RING];
     * 0: not reported (or not finite) */
    struct {
      uint64_t round;
      double capacity, uplink;
    } peer_report[TD_MEMBERS_MAX][OWN_RING];
    unsigned plan[TD_MEMBERS_MAX];    /* current batch plan by member index (0: none) */
    /* direct knowledge transfer (ALGORITHMS.md 6.3) */
    report_t reports[TD_MEMBERS_MAX];
    float *probe_blob;                /* own model at the last probe, served to laggards */
    uint64_t probe_round;
    double probe_loss;
    uint64_t since[TD_MEMBERS_MAX];   /* first round of each member (late joiners > 1) */
    uint64_t first_round;             /* this node's first round (> 1: it joined late) */
    /* late join, serving side: the anchor holding round join_want, posted by
     * the compute thread, and requests that came before it */
    uint64_t join_want, join_blob_round, joins;
    float *join_blob;
    struct { uint64_t peer, offset; } join_waiting[4];
    size_t n_join_waiting;
    struct {
      bool active, join; /* join: the late-join seed, not a knowledge transfer */
      uint64_t peer, round, total, received;
      uint8_t *buf;
      double last; /* mono time of the last progress */
    } xfer;
    uint64_t transfers, snapshots_served;
    /* anchor reconciliation (scheduler/recon.h): NULL when the run has none */
    td_recon_t *recon;
    float *recon_mean;
    uint64_t reconciled, recon_partial, recon_via_hub, recon_as_hub;
    uint64_t plans_applied, stale_dropped;
    uint64_t bytes_sent_round, bytes_recv_round;
    double test_accuracy, test_loss, last_eval_acc;
    double started, ended;
    char error[256];
    uint64_t updates_received, rounds_done, late_peers;
    bool pack_in_flight;
    td_codec_spec_t codec;
    char codec_text[32];
    td_link_codec_t *link_codecs[TD_MEMBERS_MAX]; /* by index in members[]; NULL for self */
  } r;
} node_t;

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ledger_op_t *op_new(node_t *n, op_kind_t kind) {
  ledger_op_t *op = calloc(1, sizeof *op);
  if (op == NULL) {
    td_log_error("out of memory: a ledger record is lost");
    return NULL;
  }
  op->kind = kind;
  op->at = wall_s();
  if (n->ops_tail)
    n->ops_tail->next = op;
  else
    n->ops_head = op;
  n->ops_tail = op;
  return op;
}

static void ledger_event(node_t *n, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void ledger_event(node_t *n, const char *kind, const char *fmt, ...) {
  ledger_op_t *op = op_new(n, OP_EVENT);
  if (op == NULL)
    return;
  snprintf(op->text, sizeof op->text, "%s", kind);
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  op->big = strdup(detail);
}

static void apply_op(td_ledger_t *l, ledger_op_t *op) {
  int rc = 0;
  switch (op->kind) {
  case OP_RUN_START: rc = td_ledger_run_start(l, op->run_id, op->big ? op->big : "", op->at); break;
  case OP_RUN_END: rc = td_ledger_run_end(l, op->run_id, op->text, op->at, op->value); break;
  case OP_PEER:
    rc = td_ledger_peer_seen(l, op->id, op->big ? op->big : "", op->at, op->text, op->value);
    break;
  case OP_ROUND: rc = td_ledger_round_add(l, &op->round_row); break;
  case OP_UPDATE:
    op->update_row.codec = op->text[0] ? op->text : "none";
    rc = td_ledger_update_add(l, &op->update_row);
    break;
  case OP_EVENT: rc = td_ledger_event_add(l, op->at, op->text, op->big ? op->big : ""); break;
  case OP_CKPT: rc = td_ledger_checkpoint_put(l, op->run_id, op->round, op->blob, op->blob_bytes); break;
  case OP_LINK:
    op->link_row.codec = op->text;
    rc = td_ledger_link_add(l, &op->link_row);
    break;
  }
  if (rc != 0)
    td_log_warn("ledger write (kind %d) failed: %s", (int)op->kind, td_strerror(rc));
}

static void free_ops(ledger_op_t *op) {
  while (op != NULL) {
    ledger_op_t *next = op->next;
    free(op->big);
    free(op->blob);
    free(op);
    op = next;
  }
}

static void write_ops(node_t *n, ledger_op_t *ops) {
  pthread_mutex_lock(&n->ledger_mu);
  td_ledger_begin(n->ledger);
  for (ledger_op_t *op = ops; op != NULL; op = op->next)
    apply_op(n->ledger, op);
  if (td_ledger_commit(n->ledger) != 0)
    td_log_error("ledger commit failed");
  pthread_mutex_unlock(&n->ledger_mu);
}

static void ledger_flush_work(uv_work_t *req) {
  node_t *n = req->data;
  write_ops(n, n->flushing);
}

static void ledger_flush(node_t *n);
static void ledger_flush_done(uv_work_t *req, int status) {
  node_t *n = req->data;
  (void)status;
  free_ops(n->flushing);
  n->flushing = NULL;
  n->flush_in_flight = false;
  if (n->ops_head != NULL && !n->shutting_down)
    ledger_flush(n);
}

/* Hand the queued records to the work pool: one transaction per batch. */
static void ledger_flush(node_t *n) {
  if (n->flush_in_flight || n->ops_head == NULL)
    return;
  n->flushing = n->ops_head;
  n->ops_head = n->ops_tail = NULL;
  n->flush_in_flight = true;
  n->flush_req.data = n;
  if (uv_queue_work(&n->loop, &n->flush_req, ledger_flush_work, ledger_flush_done) != 0) {
    write_ops(n, n->flushing); /* cannot happen in practice; never lose records */
    free_ops(n->flushing);
    n->flushing = NULL;
    n->flush_in_flight = false;
  }
}

/* ---- links and sending ------------------------------------------------------- */

static link_t *link_find(node_t *n, uint64_t peer) {
  for (size_t i = 0; i < n->n_links; i++)
    if (n->links[i].peer == peer)
      return &n->links[i];
  return NULL;
}

/* The link to `peer` at `endpoint`, created (DEALER connected) if needed. A
 * link opened by `join` (peer unknown yet) is adopted by endpoint. */
static link_t *link_ensure(node_t *n, uint64_t peer, const char *endpoint) {
  if (peer == n->node_id)
    return NULL;
  link_t *l = peer ? link_find(n, peer) : NULL;
  if (l == NULL && endpoint != NULL)
    for (size_t i = 0; i < n->n_links; i++)
      if (n->links[i].peer == 0 && strcmp(n->links[i].endpoint, endpoint) == 0) {
        l = &n->links[i];
        l->peer = peer;
      }
  if (l != NULL) {
    if (endpoint != NULL && endpoint[0] && strcmp(l->endpoint, endpoint) != 0) {
      /* the peer restarted elsewhere: reconnect */
      zmq_disconnect(l->sock, l->endpoint);
      zmq_disconnect(l->ctl_sock, l->endpoint);
      snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
      zmq_connect(l->sock, l->endpoint);
      zmq_connect(l->ctl_sock, l->endpoint);
    }
    return l;
  }
  if (endpoint == NULL || endpoint[0] == '\0' || n->n_links >= MAX_LINKS)
    return NULL;
  void *s = zmq_socket(n->zctx, ZMQ_DEALER), *c = zmq_socket(n->zctx, ZMQ_DEALER);
  if (s == NULL || c == NULL) {
    if (s)
      zmq_close(s);
    if (c)
      zmq_close(c);
    return NULL;
  }
  int linger = 0, hwm = 4000;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(c, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(c, ZMQ_SNDHWM, &hwm, sizeof hwm);
  if (zmq_connect(s, endpoint) != 0 || zmq_connect(c, endpoint) != 0) {
    td_log_warn("cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
    zmq_close(s);
    zmq_close(c);
    return NULL;
  }
  td_linkq_opts_t qo = {.delay_s = n->link_delay_s};
  td_linkq_t *q = NULL;
  if (td_linkq_open(&q, &qo) != 0) {
    zmq_close(s);
    zmq_close(c);
    return NULL;
  }
  l = &n->links[n->n_links++];
  memset(l, 0, sizeof *l);
  l->peer = peer;
  l->sock = s;
  l->ctl_sock = c;
  l->q = q;
  snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
  td_log_debug("link to %016" PRIx64 " at %s", peer, endpoint);
  return l;
}

static int send_envelope(node_t *n, link_t *l, Traind__Envelope *env) {
  uint8_t *buf;
  size_t len;
  env->sender = n->node_id;
  env->seq = ++n->seq;
  if (td_wire_pack(env, &buf, &len) != 0)
    return TD_EPROTO;
  int rc = zmq_send(l->ctl_sock, buf, len, ZMQ_DONTWAIT);
  free(buf);
  if (rc < 0) {
    l->send_drops++;
    return TD_EIO;
  }
  l->bytes_sent += len;
  l->msgs_sent++;
  return 0;
}

static bool member_reachable(node_t *n, uint64_t peer) {
  td_member_t *m = td_members_find(n->members, peer);
  return m != NULL && !m->self && (m->state == TD_PEER_ALIVE || m->state == TD_PEER_SUSPECT);
}

/* What our uplink carries, bytes/s: the links' measured goodput summed (the
 * updates of a round go out on every link at once, so each link sees its
 * share of the uplink). 0 before any update was acked. Sent with each round's
 * update, so every member plans that round's reconciliation from the same
 * figures. */
static double own_uplink(node_t *n) {
  double sum = 0;
  for (size_t i = 0; i < n->n_links; i++)
    if (n->links[i].peer != 0 && member_reachable(n, n->links[i].peer) &&
        n->links[i].goodput_bps > 0)
      sum += n->links[i].goodput_bps;
  return sum;
}

static void fill_peer_infos(node_t *n, Traind__PeerInfo *infos, Traind__PeerInfo **ptrs,
                            size_t *count) {
  size_t k = 0;
  for (size_t i = 0; i < td_members_count(n->members) && k < TD_WIRE_MAX_PEERS; i++) {
    const td_member_t *m = td_members_at(n->members, i);
    if (m->state == TD_PEER_LEFT || m->state == TD_PEER_DEAD)
      continue;
    traind__peer_info__init(&infos[k]);
    infos[k].node_id = m->node_id;
    infos[k].endpoint = (char *)m->endpoint;
    infos[k].state = (uint32_t)m->state;
    infos[k].capacity = m->capacity;
    ptrs[k] = &infos[k];
    k++;
  }
  *count = k;
}

static void send_hello(node_t *n, link_t *l) {
  Traind__Hello hello = TRAIND__HELLO__INIT;
  hello.endpoint = n->endpoint;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HELLO;
  env.hello = &hello;
  send_envelope(n, l, &env);
}

static void send_welcome(node_t *n, link_t *l) {
  Traind__PeerInfo infos[TD_MEMBERS_MAX], *ptrs[TD_MEMBERS_MAX];
  Traind__Welcome w = TRAIND__WELCOME__INIT;
  fill_peer_infos(n, infos, ptrs, &w.n_peers);
  w.peers = ptrs;
  w.run_round = n->r.round;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  env.run_id = n->r.run ? n->r.run_id : 0;
  send_envelope(n, l, &env);
}

static void broadcast(node_t *n, Traind__Envelope *env) {
  for (size_t i = 0; i < n->n_links; i++)
    if (n->links[i].peer != 0 && member_reachable(n, n->links[i].peer))
      send_envelope(n, &n->links[i], env);
}

/* ---- runs: loop side --------------------------------------------------------- */

static void note_drop(node_t *n, uint64_t *counter, const char *what);
static void xfer_reset(node_t *n);
static void join_reset(node_t *n);

static void close_link_codecs(node_t *n) {
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++)
    td_link_codec_close(&n->r.link_codecs[i]);
}

/* One round's update, encoded for every reachable peer of the run by its own
 * link codec (own residual, own warm start) and cut into packed envelopes. */
typedef struct {
  uint64_t peer;
  td_link_codec_t *codec; /* borrowed: only this job touches it while queued */
  uint8_t **bufs;
  size_t *lens;
  uint32_t chunks;
  size_t msg_bytes;
  int rc;
  char codec_text[32]; /* the spec used, for status and the ledger */
  uint64_t first_seq;  /* link sequence number of chunk 0 (chunk c: first_seq + c) */
} pack_target_t;

typedef struct {
  uv_work_t req;
  node_t *node;
  uint64_t run_id, round, samples, node_id;
  unsigned codec_id, batch;
  double loss, capacity, uplink;
  const float *delta;
  size_t numel;
  size_t n_targets;
  pack_target_t targets[TD_MEMBERS_MAX];
} pack_job_t;

static void try_close_round(node_t *n);

/* Peers of the run we still wait for: members, reachable, not us. */
static size_t run_peers(node_t *n, uint64_t *out) {
  size_t k = 0;
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] != n->node_id && member_reachable(n, n->r.members[i]))
      out[k++] = n->r.members[i];
  return k;
}

/* Peers that take part in `round`: run_peers() less late joiners not in yet. */
static size_t run_peers_at(node_t *n, uint64_t round, uint64_t *out) {
  size_t k = 0;
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] != n->node_id && n->r.since[i] <= round &&
        member_reachable(n, n->r.members[i]))
      out[k++] = n->r.members[i];
  return k;
}

static td_link_codec_t *link_codec_of(node_t *n, uint64_t peer) {
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] == peer)
      return n->r.link_codecs[i];
  return NULL;
}

static void pack_target(pack_job_t *job, pack_target_t *t) {
  const uint8_t *msg = NULL;
  size_t total = 0;
  t->rc = td_link_codec_encode(t->codec, job->delta, &msg, &total);
  if (t->rc != 0)
    return;
  t->msg_bytes = total;
  t->chunks = td_round_chunk_count(total);
  t->bufs = calloc(t->chunks, sizeof *t->bufs);
  t->lens = calloc(t->chunks, sizeof *t->lens);
  if (t->bufs == NULL || t->lens == NULL) {
    t->rc = TD_ENOMEM;
    return;
  }
  for (uint32_t c = 0; c < t->chunks && t->rc == 0; c++) {
    uint64_t off = (uint64_t)c * TD_ROUND_CHUNK_BYTES;
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = job->round;
    up.base_round = job->round - 1;
    up.samples = job->samples;
    up.codec = job->codec_id;
    up.chunk = c;
    up.chunks = t->chunks;
    up.total_bytes = total;
    up.payload.data = (uint8_t *)msg + off;
    up.payload.len = c + 1 < t->chunks ? TD_ROUND_CHUNK_BYTES : (size_t)(total - off);
    up.loss = job->loss;
    up.capacity = job->capacity;
    up.uplink = job->uplink;
    up.batch = job->batch;
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.run_id = job->run_id;
    env.sender = job->node_id;
    env.seq = t->first_seq + c; /* echoed by the receiver's chunk ack */
    t->rc = td_wire_pack(&env, &t->bufs[c], &t->lens[c]);
  }
}

/* Work pool: encode per link, cut into chunks, pack one envelope per chunk. */
static void pack_work(uv_work_t *req) {
  pack_job_t *job = req->data;
  for (size_t i = 0; i < job->n_targets; i++)
    pack_target(job, &job->targets[i]);
}

static void start_pack(node_t *n, uint64_t round);
static void pump(node_t *n, link_t *l);

static void on_pump_timer(uv_timer_t *t) {
  node_t *n = t->data;
  for (size_t i = 0; i < n->n_links; i++)
    pump(n, &n->links[i]);
}

/* Arm the pump timer for the earliest chunk that waits on time (delay). */
static void arm_pump(node_t *n) {
  double next = INFINITY;
  for (size_t i = 0; i < n->n_links; i++)
    next = fmin(next, td_linkq_next_ready(n->links[i].q));
  if (isfinite(next) && !n->shutting_down) {
    double ms = ceil((next - mono_s()) * 1e3);
    uv_timer_start(&n->pump_timer, on_pump_timer, ms > 1 ? (uint64_t)ms : 1, 0);
  }
}

/* Hand the link's socket every chunk its window and delay allow now. */
static void pump(node_t *n, link_t *l) {
  td_linkq_frame_t f;
  double now = mono_s();
  while (td_linkq_pop(l->q, now, &f)) {
    if (zmq_send(l->sock, f.frame, f.len, ZMQ_DONTWAIT) < 0) {
      l->send_drops++; /* counted; its window share comes back at expiry */
    } else {
      l->bytes_sent += f.len;
      l->msgs_sent++;
      if (n->r.run != NULL)
        n->r.bytes_sent_round += f.len;
    }
    free(f.frame);
  }
  arm_pump(n);
}

static void pack_done(uv_work_t *req, int status) {
  pack_job_t *job = req->data;
  node_t *n = job->node;
  n->r.pack_in_flight = false;
  bool same_run = status == 0 && n->r.run != NULL && n->r.run_id == job->run_id;
  for (size_t i = 0; i < job->n_targets; i++) {
    pack_target_t *t = &job->targets[i];
    link_t *l = link_find(n, t->peer);
    if (t->rc == TD_ENUMERIC) {
      note_drop(n, &n->drops.nonfinite_local, "own update holds NaN or Inf; not sent");
    } else if (t->rc != 0) {
      td_log_error("cannot encode the round %" PRIu64 " update for %016" PRIx64 ": %s",
                   job->round, t->peer, td_strerror(t->rc));
    } else if (same_run && l != NULL && member_reachable(n, t->peer)) {
      double now = mono_s();
      for (uint32_t c = 0; c < t->chunks; c++) { /* the link queue takes the buffers */
        uint64_t seq = td_linkq_push_seq(l->q, TD_PRIO_UPDATE, t->bufs[c], t->lens[c], true, now,
                                         t->first_seq + c);
        t->bufs[c] = NULL;
        if (seq == 0)
          l->send_drops++; /* refused (out of memory) */
      }
      pump(n, l);
      l->update_wire_sent += t->msg_bytes;
      l->update_dense_sent += job->numel * sizeof(float);
      snprintf(l->codec, sizeof l->codec, "%s", t->codec_text);
      l->pending[job->round % 2].round = job->round;
      l->pending[job->round % 2].bytes = t->msg_bytes;
      l->pending[job->round % 2].sent_at = mono_s();
      snprintf(l->pending[job->round % 2].codec, sizeof l->codec, "%s", t->codec_text);
    }
    for (uint32_t c = 0; t->bufs && c < t->chunks; c++)
      free(t->bufs[c]);
    free(t->bufs);
    free(t->lens);
  }
  if (same_run && job->round > n->r.packed)
    n->r.packed = job->round;
  free(job);
  if (same_run && n->r.pack_pending > n->r.packed) {
    uint64_t next = n->r.pack_pending;
    n->r.pack_pending = 0;
    start_pack(n, next);
  }
  try_close_round(n);
}

/* codec = auto: the link's byte budget is what its measured goodput carries
 * in the time the round computed (80 %, leaving room for control traffic),
 * so the exchange hides behind the next round's compute; the least lossy
 * codec that fits is used. A round that computes for milliseconds cannot hide
 * any exchange and would starve every update down to the top-k floor, so the
 * time is at least budget_ms. Until the first ack measured the link, ternary
 * (16x) is the cautious start. */
static void fit_link_codec(node_t *n, link_t *l, td_link_codec_t *lc, const own_round_t *o) {
  td_codec_spec_t spec = {.id = TD_CODEC_TERNARY, .clip = 2.5};
  double t_min = n->r.spec.budget_ms / 1000.0;
  /* the update two rounds back still unacknowledged (its slot is about to be
   * reused): the link delivered less than its bytes over the time since, so
   * the estimate comes down to that. Without it an overestimate (a burst
   * through a token bucket) locks itself in: updates too big for the link
   * never get acked in time to correct it. */
  const pending_update_t *old = l != NULL ? &l->pending[o->round % 2] : NULL;
  double since = old != NULL && old->sent_at > 0 ? mono_s() - old->sent_at : 0;
  if (since > 0 && old->bytes > 0 && (double)old->bytes / since < l->goodput_bps)
    l->goodput_bps = (double)old->bytes / since;
  if (l != NULL && l->goodput_bps > 0) {
    l->budget = 0.8 * l->goodput_bps * (o->compute_s > t_min ? o->compute_s : t_min);
    td_codec_fit_budget(td_run_layout(n->r.run), l->budget, &spec);
  }
  td_link_codec_set_spec(lc, &spec);
}

/* Acks: kind 0 for a complete update (round, message bytes), kind 1 for
 * every chunk (its Envelope.seq), which opens the sender's window. */
static void send_ack(node_t *n, uint64_t peer, unsigned kind, uint64_t seq, uint64_t bytes) {
  link_t *l = link_find(n, peer);
  if (l == NULL)
    return;
  Traind__Ack ack = TRAIND__ACK__INIT;
  ack.ack_seq = seq;
  ack.bytes = bytes;
  ack.kind = kind;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ACK;
  env.ack = &ack;
  env.run_id = n->r.run_id;
  send_envelope(n, l, &env);
}

/* An ack for the update we sent last on this link: one goodput sample. */
static void on_ack(node_t *n, const Traind__Envelope *env, link_t *l) {
  const Traind__Ack *a = env->ack;
  if (l != NULL && a->kind == 1) {
    if (td_linkq_ack(l->q, a->ack_seq, mono_s()))
      pump(n, l);
    return;
  }
  if (l == NULL || n->r.run == NULL || env->run_id != n->r.run_id)
    return;
  pending_update_t *p = &l->pending[a->ack_seq % 2];
  if (a->ack_seq != p->round || p->sent_at <= 0 || a->bytes != p->bytes)
    return; /* stale, duplicate or forged: nothing to learn */
  double dt = mono_s() - p->sent_at;
  p->sent_at = 0;
  if (!(dt > 0))
    return;
  l->ack_s = dt;
  double sample = (double)a->bytes / dt;
  /* A message well under the budget was app-limited: its time is mostly
   * latency, so it may raise the estimate but never lower it (BBR's rule);
   * otherwise small budgets would shrink themselves round after round. */
  if (l->budget > 0 && (double)a->bytes < 0.5 * l->budget)
    l->goodput_bps = sample > l->goodput_bps ? sample : l->goodput_bps;
  else
    l->goodput_bps = td_plan_ewma(l->goodput_bps, sample, 0.3);
  td_linkq_stats_t qs;
  td_linkq_stats(l->q, &qs);
  ledger_op_t *op = op_new(n, OP_LINK);
  if (op != NULL) {
    op->link_row = (td_ledger_link_t){.run_id = n->r.run_id, .round = a->ack_seq,
                                      .peer = l->peer, .at = wall_s(),
                                      .goodput_bps = l->goodput_bps,
                                      .rtt_ms = qs.rtt_s > 0 ? qs.rtt_s * 1e3 : NAN,
                                      .budget_bytes = n->r.spec.codec_auto ? l->budget : NAN,
                                      .window_bytes = qs.window, .bytes_sent = a->bytes};
    snprintf(op->text, sizeof op->text, "%s", p->codec);
  }
}

/* Encode and send own round `round` to every reachable peer, one job at a
 * time (overlap and async modes can post the next round while one packs). */
static void start_pack(node_t *n, uint64_t round) {
  if (n->r.pack_in_flight) {
    n->r.pack_pending = round;
    return;
  }
  const own_round_t *o = &n->r.own[round % OWN_RING];
  pack_job_t *job = calloc(1, sizeof *job);
  if (job == NULL) {
    n->r.packed = round; /* nothing sent; peers see a late update */
    return;
  }
  job->node = n;
  job->node_id = n->node_id;
  job->run_id = n->r.run_id;
  job->round = round;
  job->samples = o->samples;
  job->loss = o->loss;
  job->capacity = o->capacity;
  job->uplink = n->r.own[round % OWN_RING].uplink = own_uplink(n);
  job->batch = o->batch;
  job->codec_id = n->r.codec.id;
  job->delta = td_run_delta(n->r.run, round);
  job->numel = td_run_numel(n->r.run);
  uint64_t peers[TD_MEMBERS_MAX];
  size_t np = run_peers_at(n, round, peers);
  for (size_t p = 0; p < np; p++) {
    td_link_codec_t *lc = link_codec_of(n, peers[p]);
    link_t *l = link_find(n, peers[p]);
    if (lc == NULL || l == NULL)
      continue;
    if (n->r.spec.codec_auto)
      fit_link_codec(n, l, lc, o);
    pack_target_t *t = &job->targets[job->n_targets++];
    /* the chunks are stamped on the worker while other frames (acks,
     * snapshot chunks) may be queued: their numbers are reserved now */
    size_t most = td_round_chunk_count(td_codec_message_bound(td_run_layout(n->r.run)));
    *t = (pack_target_t){.peer = peers[p], .codec = lc, .first_seq = td_linkq_reserve(l->q, most)};
    td_codec_format(td_link_codec_spec(lc), t->codec_text, sizeof t->codec_text);
  }
  job->req.data = job;
  if (uv_queue_work(&n->loop, &job->req, pack_work, pack_done) == 0) {
    n->r.pack_in_flight = true;
  } else {
    free(job);
    n->r.packed = round;
  }
}

static void begin_round(node_t *n, uint64_t round) {
  uint64_t peers[TD_MEMBERS_MAX];
  size_t np = run_peers_at(n, round, peers);
  n->r.round = round;
  td_round_begin(n->r.collector, round, peers, np);
  n->r.round_started = wall_s();
  n->r.bytes_sent_round = n->r.bytes_recv_round = 0;
  if (n->r.own_done >= round) /* overlap: own update already done */
    n->r.deadline = n->r.own[round % OWN_RING].done_at + n->r.spec.round_timeout;
}

static ledger_op_t *round_row(node_t *n, uint64_t round, double eval_acc) {
  ledger_op_t *op = op_new(n, OP_ROUND);
  if (op == NULL)
    return NULL;
  own_round_t *o = &n->r.own[round % OWN_RING];
  double now = wall_s();
  if (isnan(eval_acc) && o->round == round)
    eval_acc = o->eval_acc; /* overlap: evaluated before the round closed here */
  op->round_row = (td_ledger_round_t){
      .run_id = n->r.run_id, .round = round, .started = n->r.round_started,
      .ended = now, .local_steps = o->steps + o->fill_steps, .batch = o->batch, .samples = o->samples,
      .loss = o->loss, .eval_acc = eval_acc, .bytes_sent = n->r.bytes_sent_round,
      .bytes_recv = n->r.bytes_recv_round, .lr = o->lr, .compute_s = o->compute_s + o->fill_s,
      .wait_s = o->idle_s, .capacity = o->capacity};
  if (o->round == round) {
    o->row = op->round_row;
    o->row_written = true;
  }
  return op;
}

/* Weighted dynamic batching (ALGORITHMS.md 6.1): split the global batch over
 * the live members in proportion to the capacities they reported with round
 * `round` (the last known value for one whose update is missing). Every node
 * holds the same reports once the round closed, so every node computes the
 * same plan; only our own share is applied, from round `from` on. */
static void replan(node_t *n, uint64_t round, uint64_t from) {
  if (!n->r.spec.weighted_batching || n->r.n_members < 2)
    return;
  double caps[TD_MEMBERS_MAX];
  size_t idx[TD_MEMBERS_MAX], k = 0, me = 0;
  for (size_t i = 0; i < n->r.n_members; i++) {
    uint64_t id = n->r.members[i];
    double c;
    if (id == n->node_id) {
      c = n->r.own[round % OWN_RING].capacity;
      me = k;
    } else if (member_reachable(n, id)) {
      c = n->r.peer_report[i][round % OWN_RING].round == round
              ? n->r.peer_report[i][round % OWN_RING].capacity
              : 0;
      if (c <= 0) { /* not reported with this round: newest report we have */
        for (unsigned j = 0; j < OWN_RING; j++)
          if (n->r.peer_report[i][j].capacity > c)
            c = n->r.peer_report[i][j].capacity;
      }
    } else {
      continue;
    }
    if (!(c > 0))
      return; /* someone has not measured yet: keep the current plan */
    caps[k] = c;
    idx[k++] = i;
  }
  unsigned split[TD_MEMBERS_MAX], old[TD_MEMBERS_MAX];
  /* no node below a quarter of the even share: tiny batches are all noise */
  unsigned b_min = n->r.spec.batch / (4 * (unsigned)k);
  if (td_plan_split_batch(caps, k, n->r.spec.batch, b_min > 2 ? b_min : 2, NULL, split) != 0 &&
      td_plan_split_batch(caps, k, n->r.spec.batch, 1, NULL, split) != 0)
    return;
  bool have_old = true;
  for (size_t j = 0; j < k; j++)
    if ((old[j] = n->r.plan[idx[j]]) == 0)
      have_old = false;
  if (have_old && !td_plan_should_replan(old, split, k, 0.1))
    return;
  memset(n->r.plan, 0, sizeof n->r.plan);
  for (size_t j = 0; j < k; j++)
    n->r.plan[idx[j]] = split[j];
  n->r.plans_applied++;
  td_run_set_batch(n->r.run, from, split[me]);
  td_log_debug("round %" PRIu64 ": batch plan from round %" PRIu64 ": own %u of %u "
               "(%.0f samples/s)", round, from, split[me], n->r.spec.batch, caps[me]);
}

static void close_round(node_t *n) {
  td_run_t *run = n->r.run;
  uint64_t r = n->r.round;
  const own_round_t *o = &n->r.own[r % OWN_RING];
  float *avg = td_run_avg(run, r);
  memset(avg, 0, td_run_numel(run) * sizeof(float));
  size_t used = td_round_aggregate(n->r.collector, td_run_delta(run, r), o->samples, avg);
  round_row(n, r, NAN);
  td_log_debug("round %" PRIu64 "/%" PRIu64 " closed with %zu peer updates, loss %.4f", r,
               n->r.rounds, used, o->loss);
  /* sync: the compute thread waits on this round, so the plan is used from
   * the next one; overlap: it is already computing r + 1 */
  replan(n, r, r + (n->r.spec.mode_kind == TD_MODE_SYNC ? 1 : 2));
  n->r.rounds_done++;
  begin_round(n, r + 1);
  td_run_release(run, r);
  ledger_flush(n);
}

static void try_close_round(node_t *n) {
  if (n->r.run == NULL || n->r.spec.mode_kind == TD_MODE_ASYNC)
    return;
  while (n->r.run != NULL && n->r.own_done >= n->r.round && n->r.packed >= n->r.round &&
         n->r.round <= n->r.rounds && td_round_complete(n->r.collector))
    close_round(n);
}

/* Deadline: peers that have not delivered are recorded late and not waited for. */
static void check_deadline(node_t *n) {
  if (n->r.run == NULL || n->r.spec.mode_kind == TD_MODE_ASYNC ||
      n->r.own_done < n->r.round || mono_s() < n->r.deadline)
    return;
  uint64_t missing[TD_MEMBERS_MAX];
  size_t k = td_round_missing(n->r.collector, missing, TD_MEMBERS_MAX);
  for (size_t i = 0; i < k; i++) {
    td_log_warn("round %" PRIu64 ": peer %016" PRIx64 " is late (deadline %.1f s)", n->r.round,
                missing[i], n->r.spec.round_timeout);
    ledger_event(n, "late", "round %" PRIu64 " peer %016" PRIx64, n->r.round, missing[i]);
    td_round_forget_peer(n->r.collector, missing[i]);
    n->r.late_peers++;
  }
  try_close_round(n);
}

/* async: release the compute thread up to the slowest live peer's round. */
static void async_release(node_t *n) {
  uint64_t slowest = UINT64_MAX;
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] != n->node_id && member_reachable(n, n->r.members[i]) &&
        n->r.peer_round[i] < slowest)
      slowest = n->r.peer_round[i];
  td_run_release(n->r.run, slowest);
}

static void close_async_inboxes(node_t *n) {
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++)
    td_round_close(&n->r.peer_inbox[i]);
  td_params_free(&n->r.scratch);
}

static void finish_run(node_t *n, const char *state, double test_accuracy, const char *error) {
  n->r.state = state;
  n->r.ended = wall_s();
  if (error)
    snprintf(n->r.error, sizeof n->r.error, "%s", error);
  ledger_op_t *op = op_new(n, OP_RUN_END);
  if (op) {
    op->run_id = n->r.run_id;
    snprintf(op->text, sizeof op->text, "%s", state);
    op->value = test_accuracy;
  }
  ledger_event(n, "run_end", "run %016" PRIx64 " %s%s%s", n->r.run_id, state,
               error ? ": " : "", error ? error : "");
  td_log_info("run %016" PRIx64 " %s after %" PRIu64 " rounds%s%s", n->r.run_id, state,
              n->r.rounds_done, error ? ": " : "", error ? error : "");
  td_run_close(&n->r.run);
  td_round_close(&n->r.collector);
  td_recon_close(&n->r.recon);
  free(n->r.recon_mean);
  n->r.recon_mean = NULL;
  close_async_inboxes(n);
  free(n->r.probe_blob);
  n->r.probe_blob = NULL;
  join_reset(n);
  xfer_reset(n);
  if (!n->r.pack_in_flight) /* else the next start_run closes them */
    close_link_codecs(n);
  ledger_flush(n);
}

/* ---- direct knowledge transfer ----------------------------------------------------
 * Every `transfer` rounds each node scores its local model on the same
 * validation rows and floods (round, loss) in an EvalReport. A node whose loss
 * exceeds the best recent report by more than transfer_margin asks that node
 * for its model (SnapshotRequest); the model comes back in 64 KiB
 * SnapshotChunks on the bulk class of the link queue (behind updates), in
 * order, resumable from the received offset, and is merged by the compute
 * thread before its next round. One transfer at a time. */

static void xfer_reset(node_t *n) {
  free(n->r.xfer.buf);
  memset(&n->r.xfer, 0, sizeof n->r.xfer);
}

static void join_reset(node_t *n) {
  free(n->r.join_blob);
  n->r.join_blob = NULL;
  n->r.join_want = n->r.join_blob_round = 0;
  n->r.n_join_waiting = 0;
}

/* Ask l for a snapshot of `round` from `offset` (a model, a late-join seed or
 * a reconciliation message). */
static void send_snapshot_request(node_t *n, link_t *l, uint64_t round, uint64_t offset,
                                  bool join, bool reconcile) {
  Traind__SnapshotRequest rq = TRAIND__SNAPSHOT_REQUEST__INIT;
  rq.round = round;
  rq.offset = offset;
  rq.join = join;
  rq.reconcile = reconcile;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST;
  env.snapshot_request = &rq;
  env.run_id = n->r.run_id;
  send_envelope(n, l, &env);
}

static void request_snapshot(node_t *n) {
  link_t *l = link_find(n, n->r.xfer.peer);
  if (l == NULL)
    return;
  send_snapshot_request(n, l, n->r.xfer.round, n->r.xfer.received, n->r.xfer.join, false);
  n->r.xfer.last = mono_s();
}

static void decide_transfer(node_t *n) {
  if (n->r.xfer.active || n->r.run == NULL)
    return;
  size_t best = TD_MEMBERS_MAX;
  for (size_t i = 0; i < n->r.n_members; i++) {
    if (!n->r.reports[i].have ||
        n->r.reports[i].round + n->r.spec.transfer < n->r.probe_round) /* too old */
      continue;
    if (best == TD_MEMBERS_MAX || n->r.reports[i].loss < n->r.reports[best].loss ||
        (n->r.reports[i].loss == n->r.reports[best].loss && n->r.members[i] < n->r.members[best]))
      best = i;
  }
  if (best == TD_MEMBERS_MAX || n->r.members[best] == n->node_id ||
      !member_reachable(n, n->r.members[best]) ||
      !(n->r.probe_loss > (1 + n->r.spec.transfer_margin) * n->r.reports[best].loss))
    return;
  n->r.xfer.total = td_run_numel(n->r.run) * sizeof(float);
  if ((n->r.xfer.buf = malloc(n->r.xfer.total)) == NULL)
    return;
  n->r.xfer.active = true;
  n->r.xfer.peer = n->r.members[best];
  n->r.xfer.round = n->r.reports[best].round;
  td_log_info("round %" PRIu64 ": validation loss %.4f lags %016" PRIx64 "'s %.4f: fetching its "
              "model", n->r.probe_round, n->r.probe_loss, n->r.xfer.peer,
              n->r.reports[best].loss);
  request_snapshot(n);
}

static void on_probe(node_t *n, const td_run_event_t *ev) {
  free(n->r.probe_blob);
  n->r.probe_blob = ev->blob;
  n->r.probe_round = ev->round;
  n->r.probe_loss = ev->loss;
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] == n->node_id)
      n->r.reports[i] = (report_t){.round = ev->round, .loss = ev->loss, .have = true};
  Traind__EvalReport rep = TRAIND__EVAL_REPORT__INIT;
  rep.round = ev->round;
  rep.loss = ev->loss;
  rep.accuracy = ev->accuracy;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_EVAL_REPORT;
  env.eval_report = &rep;
  env.run_id = n->r.run_id;
  uint64_t peers[TD_MEMBERS_MAX];
  size_t np = run_peers(n, peers);
  for (size_t p = 0; p < np; p++) {
    link_t *l = link_find(n, peers[p]);
    if (l != NULL)
      send_envelope(n, l, &env);
  }
  decide_transfer(n);
}

static void on_anchor(node_t *n, td_run_event_t *ev);
static void on_reconcile_own(node_t *n, td_run_event_t *ev);

static void on_run_events(td_run_t *run, void *user) {
  node_t *n = user;
  td_run_event_t ev;
  while (n->r.run == run && td_run_next_event(run, &ev)) {
    switch (ev.kind) {
    case TD_RUN_READY:
      n->r.rounds = td_run_rounds(run);
      n->r.ready = true;
      td_log_info("run %016" PRIx64 ": dataset ready, %" PRIu64 " rounds of %u steps%s, "
                  "mode %s, local batch %u (%s), rank %u of %zu",
                  n->r.run_id, n->r.rounds, td_run_steps_of(run, 1),
                  n->r.spec.qsr_alpha > 0 ? " (QSR)" : "", n->r.spec.mode,
                  td_run_local_batch(run), n->r.spec.batching, n->r.rank, n->r.n_members);
      break;
    case TD_RUN_ROUND_DONE: {
      own_round_t *o = &n->r.own[ev.round % OWN_RING];
      *o = (own_round_t){.round = ev.round, .samples = ev.samples, .loss = ev.loss,
                         .compute_s = ev.compute_s, .idle_s = ev.idle_s, .lr = ev.lr,
                         .capacity = ev.capacity, .done_at = mono_s(), .batch = ev.batch,
                         .steps = ev.steps, .fill_steps = ev.fill_steps, .fill_s = ev.fill_s,
                         .eval_acc = NAN};
      n->r.own_done = ev.round;
      n->r.own_loss = ev.loss;
      n->r.lr = ev.lr;
      n->r.capacity = ev.capacity;
      if (ev.round == n->r.round)
        n->r.deadline = o->done_at + n->r.spec.round_timeout;
      start_pack(n, ev.round);
      if (n->r.spec.mode_kind == TD_MODE_ASYNC) {
        n->r.round_started = wall_s();
        round_row(n, ev.round, NAN);
        n->r.rounds_done++;
        replan(n, ev.round, ev.round + 1);
        async_release(n);
        ledger_flush(n);
      }
      try_close_round(n);
      break;
    }
    case TD_RUN_PROBE:
      on_probe(n, &ev);
      break;
    case TD_RUN_ANCHOR:
      on_anchor(n, &ev);
      break;
    case TD_RUN_RECONCILE:
      on_reconcile_own(n, &ev);
      break;
    case TD_RUN_CHECKPOINT: {
      ledger_op_t *ck = op_new(n, OP_CKPT);
      if (ck != NULL) {
        ck->run_id = n->r.run_id;
        ck->round = ev.round;
        ck->blob = ev.blob;
        ck->blob_bytes = td_run_numel(run) * sizeof(float);
      } else {
        free(ev.blob);
      }
      ledger_flush(n);
      break;
    }
    case TD_RUN_EVAL:
    case TD_RUN_FINISHED: {
      n->r.last_eval_acc = ev.accuracy;
      n->r.test_loss = ev.loss;
      /* the accuracy belongs to the row of ev.round: in overlap mode the
       * compute thread evaluates round r before the loop closes it, so it
       * waits in the ring and round_row() writes it with the row */
      own_round_t *o = &n->r.own[ev.round % OWN_RING];
      if (o->round == ev.round) {
        o->eval_acc = ev.accuracy;
        ledger_op_t *op = o->row_written ? op_new(n, OP_ROUND) : NULL;
        if (op != NULL) {
          op->round_row = o->row;
          op->round_row.eval_acc = ev.accuracy;
        }
      }
      td_log_info("round %" PRIu64 "/%" PRIu64 ": test accuracy %.4f, test loss %.4f",
                  ev.round, n->r.rounds, ev.accuracy, ev.loss);
      if (ev.kind == TD_RUN_FINISHED) {
        n->r.test_accuracy = ev.accuracy;
        finish_run(n, "finished", ev.accuracy, NULL);
        return;
      }
      break;
    }
    case TD_RUN_FAILED:
      finish_run(n, "failed", NAN, ev.message);
      return;
    case TD_RUN_STOPPED:
      finish_run(n, "stopped", n->r.last_eval_acc, "stopped on request");
      return;
    }
  }
}

static uint64_t fnv1a64(const void *data, size_t len, uint64_t h) {
  const uint8_t *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* Start run `run_id` as one of `members`. A late joiner (first_round > 1)
 * takes part from first_round on and fetches the consensus model from
 * `sponsor` first. */
static int start_run(node_t *n, uint64_t run_id, const char *spec_text, const uint64_t *members,
                     size_t n_members, uint64_t first_round, uint64_t sponsor, char *why,
                     size_t why_len) {
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  int rc = 0;
  /* the spec travels as canonical "key = value" lines */
  char *copy = strdup(spec_text);
  if (copy == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  for (char *line = strtok(copy, "\n"); line != NULL && rc == 0; line = strtok(NULL, "\n"))
    rc = td_runspec_set_arg(&spec, line, why, why_len);
  free(copy);
  if (rc != 0)
    return rc;
  if (n->threads)
    spec.threads = n->threads;
  size_t rank = n_members;
  for (size_t i = 0; i < n_members; i++)
    if (members[i] == n->node_id)
      rank = i;
  if (rank == n_members)
    return td_why(why, why_len, TD_EINVAL, "this node is not a member of run %016" PRIx64,
                  run_id);
  if (n->r.run != NULL)
    return td_why(why, why_len, TD_EINVAL, "run %016" PRIx64 " is already running",
                  n->r.run_id);
  if (first_round > 1 && spec.mode_kind == TD_MODE_ASYNC)
    return td_why(why, why_len, TD_EINVAL, "late join is for sync and overlap runs");
  td_run_opts_t opts = {.spec = &spec, .rank = (unsigned)rank, .nodes = (unsigned)n_members,
                        .first_round = first_round, .loop = &n->loop,
                        .on_events = on_run_events, .user = n};
  td_run_t *run = NULL;
  if ((rc = td_run_start(&run, &opts, why, why_len)) != 0)
    return rc;
  td_codec_spec_t codec;
  if ((rc = td_codec_parse(&codec, spec.codec_auto ? "none" : spec.codec, why, why_len)) != 0) {
    td_run_close(&run);
    return rc;
  }
  close_link_codecs(n);
  close_async_inboxes(n);
  /* updates and snapshots still queued for the last run (a stopped one) are
   * of no use to anyone now, and would go out ahead of this run's */
  for (size_t i = 0; i < n->n_links; i++) {
    td_linkq_drop_class(n->links[i].q, TD_PRIO_UPDATE);
    td_linkq_drop_class(n->links[i].q, TD_PRIO_BULK);
  }
  td_round_close(&n->r.collector);
  rc = td_round_open(&n->r.collector, td_run_layout(run));
  td_recon_close(&n->r.recon);
  free(n->r.recon_mean);
  n->r.recon_mean = NULL;
  if (rc == 0 && td_runspec_reconciles(&spec)) {
    rc = td_recon_open(&n->r.recon, td_run_layout(run));
    if (rc == 0 && (n->r.recon_mean = malloc(td_run_numel(run) * sizeof(float))) == NULL)
      rc = TD_ENOMEM;
  }
  if (rc == 0 && spec.mode_kind == TD_MODE_ASYNC) {
    if ((n->r.scratch = td_params_alloc(td_run_numel(run))) == NULL)
      rc = TD_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n_members; i++)
      if (members[i] != n->node_id)
        rc = td_round_open(&n->r.peer_inbox[i], td_run_layout(run));
  }
  for (size_t i = 0; rc == 0 && i < n_members; i++)
    if (members[i] != n->node_id)
      rc = td_link_codec_open(&n->r.link_codecs[i], &codec, td_run_layout(run), spec.seed,
                              members[i] ^ (n->node_id * 0x9e3779b97f4a7c15ull));
  if (rc != 0) {
    close_link_codecs(n);
    close_async_inboxes(n);
    td_round_close(&n->r.collector);
    td_run_close(&run);
    return td_why(why, why_len, TD_ENOMEM, "out of memory for the update buffers");
  }
  n->r.codec = codec;
  td_codec_format(&codec, n->r.codec_text, sizeof n->r.codec_text);
  free(n->r.spec_text);
  n->r.spec_text = strdup(spec_text);
  n->r.spec = spec;
  n->r.run = run;
  n->r.run_id = run_id;
  n->r.state = "running";
  memcpy(n->r.members, members, n_members * sizeof *members);
  n->r.n_members = n_members;
  n->r.rank = (unsigned)rank;
  n->r.rounds = spec.rounds; /* 0 (unknown) until the dataset is loaded */
  n->r.own_loss = NAN;
  n->r.ready = false;
  n->r.test_accuracy = n->r.last_eval_acc = n->r.test_loss = NAN;
  n->r.started = wall_s();
  n->r.ended = 0;
  n->r.error[0] = '\0';
  n->r.updates_received = n->r.rounds_done = n->r.late_peers = 0;
  n->r.own_done = n->r.packed = n->r.pack_pending = 0;
  n->r.capacity = 0;
  n->r.plans_applied = n->r.stale_dropped = 0;
  memset(n->r.own, 0, sizeof n->r.own);
  memset(n->r.peer_report, 0, sizeof n->r.peer_report);
  memset(n->r.peer_round, 0, sizeof n->r.peer_round);
  memset(n->r.plan, 0, sizeof n->r.plan);
  memset(n->r.reports, 0, sizeof n->r.reports);
  free(n->r.probe_blob);
  n->r.probe_blob = NULL;
  xfer_reset(n);
  join_reset(n);
  n->r.transfers = n->r.snapshots_served = n->r.joins = 0;
  n->r.reconciled = n->r.recon_partial = n->r.recon_via_hub = n->r.recon_as_hub = 0;
  first_round = first_round > 1 ? first_round : 1;
  n->r.first_round = first_round;
  memset(n->r.since, 0, sizeof n->r.since);
  n->r.since[rank] = first_round;
  n->r.own_done = n->r.packed = first_round - 1;
  for (size_t i = 0; i < n_members; i++)
    n->r.plan[i] = td_run_split_batch(spec.batch, (unsigned)i, (unsigned)n_members);
  begin_round(n, first_round);
  if (first_round > 1) { /* fetch the members' model before the first round */
    n->r.xfer.total = td_run_anchor_bytes(run);
    if ((n->r.xfer.buf = malloc(n->r.xfer.total)) != NULL) {
      n->r.xfer.active = n->r.xfer.join = true;
      n->r.xfer.peer = sponsor;
      n->r.xfer.round = first_round - 1;
      request_snapshot(n);
    }
  }
  ledger_op_t *op = op_new(n, OP_RUN_START);
  if (op) {
    op->run_id = run_id;
    op->big = strdup(spec_text);
  }
  ledger_event(n, "run_start", "run %016" PRIx64 " rank %zu of %zu, from round %" PRIu64,
               run_id, rank, n_members, first_round);
  td_log_info("run %016" PRIx64 " started: rank %zu of %zu, model %s, dataset %s%s", run_id, rank,
              n_members, spec.model, spec.dataset, first_round > 1 ? " (late join)" : "");
  ledger_flush(n);
  return 0;
}

/* ---- membership ---------------------------------------------------------------- */

static void record_peer(node_t *n, const td_member_t *m) {
  ledger_op_t *op = op_new(n, OP_PEER);
  if (op == NULL)
    return;
  op->id = m->node_id;
  op->big = strdup(m->endpoint);
  snprintf(op->text, sizeof op->text, "%s", td_peer_state_name(m->state));
  op->value = m->capacity;
}

static void on_member_event(const td_member_t *m, td_member_event_t ev, void *user) {
  node_t *n = user;
  switch (ev) {
  case TD_MEMBER_SUSPECTED:
    td_log_warn("peer %016" PRIx64 " (%s) is suspect", m->node_id, m->endpoint);
    ledger_event(n, "peer_suspect", "%016" PRIx64 " %s", m->node_id, m->endpoint);
    break;
  case TD_MEMBER_DIED:
    td_log_warn("peer %016" PRIx64 " (%s) is dead", m->node_id, m->endpoint);
    ledger_event(n, "peer_dead", "%016" PRIx64 " %s", m->node_id, m->endpoint);
    if (n->r.run != NULL)
      td_round_forget_peer(n->r.collector, m->node_id);
    break;
  default:
    break;
  }
  record_peer(n, m);
}

/* Direct evidence that `peer` is alive; handles join/readmission. */
static void heard_from(node_t *n, uint64_t peer, const char *endpoint) {
  td_member_event_t ev;
  if (td_members_heard(n->members, peer, endpoint, mono_s(), &ev) != 0) {
    td_log_warn("membership table full (%d): ignoring %016" PRIx64, TD_MEMBERS_MAX, peer);
    return;
  }
  td_member_t *m = td_members_find(n->members, peer);
  link_t *l = link_ensure(n, peer, m->endpoint[0] ? m->endpoint : endpoint);
  if (ev == TD_MEMBER_JOINED || ev == TD_MEMBER_REVIVED) {
    td_log_info("peer %016" PRIx64 " at %s %s", peer, m->endpoint,
                ev == TD_MEMBER_JOINED ? "joined" : "is back");
    ledger_event(n, ev == TD_MEMBER_JOINED ? "peer_joined" : "peer_back", "%016" PRIx64 " %s",
                 peer, m->endpoint);
    record_peer(n, m);
    if (l != NULL)
      send_hello(n, l); /* make sure it knows us too */
  }
}

/* Second-hand news of peers (welcome, heartbeat gossip). */
static void learn_peers(node_t *n, Traind__PeerInfo **peers, size_t count) {
  for (size_t i = 0; i < count; i++) {
    Traind__PeerInfo *p = peers[i];
    if (p->node_id == 0 || p->node_id == n->node_id || p->endpoint == NULL ||
        strncmp(p->endpoint, "tcp://", 6) != 0)
      continue;
    if (td_members_learn(n->members, p->node_id, p->endpoint, mono_s()) == 1) {
      link_t *l = link_ensure(n, p->node_id, p->endpoint);
      if (l != NULL)
        send_hello(n, l);
      td_member_t *m = td_members_find(n->members, p->node_id);
      td_log_info("learned of peer %016" PRIx64 " at %s", p->node_id, p->endpoint);
      record_peer(n, m);
    }
  }
}

static void note_drop(node_t *n, uint64_t *counter, const char *what) {
  (*counter)++;
  n->drop_logs++;
  if (n->drop_logs <= 20 || n->drop_logs % 1000 == 0)
    td_log_warn("dropped a peer message: %s (drops so far: %u)", what, n->drop_logs);
}

static size_t member_index(node_t *n, uint64_t peer) {
  for (size_t i = 0; i < n->r.n_members; i++)
    if (n->r.members[i] == peer)
      return i;
  return TD_MEMBERS_MAX;
}

static void record_update(node_t *n, uint64_t peer, uint64_t peer_round, int64_t staleness,
                          uint64_t bytes, const char *codec) {
  ledger_op_t *op = op_new(n, OP_UPDATE);
  if (op == NULL)
    return;
  op->update_row = (td_ledger_update_t){
      .run_id = n->r.run_id,
      .round = n->r.spec.mode_kind == TD_MODE_ASYNC ? n->r.own_done : n->r.round,
      .peer = peer, .peer_round = peer_round, .staleness = staleness > 0 ? staleness : 0,
      .bytes = bytes, .ratio = (double)td_run_numel(n->r.run) * 4.0 / (double)bytes,
      .arrived = wall_s()};
  snprintf(op->text, sizeof op->text, "%s", codec);
}

/* async: a peer's update of round j arrives while we are at own_done; it
 * weighs its sample share of a global round times (1 + a)^-kappa with
 * a = own_done - j, and is dropped (and counted) when a > S. */
static void async_update_done(node_t *n, size_t mi, const td_update_info_t *info) {
  td_round_t *c = n->r.peer_inbox[mi];
  int64_t a = (int64_t)n->r.own_done - (int64_t)info->round;
  double w = td_plan_staleness_weight(a, n->r.spec.max_staleness, n->r.spec.staleness_kappa);
  record_update(n, info->peer, info->round, a, info->bytes, td_codec_name(info->codec));
  if (info->round > n->r.peer_round[mi])
    n->r.peer_round[mi] = info->round;
  if (w <= 0) {
    n->r.stale_dropped++;
    note_drop(n, &n->drops.late, "async update older than the staleness bound");
  } else {
    unsigned steps = td_run_steps_of(n->r.run, info->round);
    double share = (double)info->samples / ((double)n->r.spec.batch * (steps ? steps : 1));
    memset(n->r.scratch, 0, td_run_numel(n->r.run) * sizeof(float));
    td_round_aggregate(c, NULL, 0, n->r.scratch);
    td_run_async_add(n->r.run, n->r.scratch, w * (share < 1 ? share : 1));
    n->r.updates_received++;
  }
  uint64_t peer = info->peer;
  td_round_begin(c, info->round + 1, &peer, 1);
  async_release(n);
}

static void on_update(node_t *n, const Traind__Envelope *env, link_t *l, size_t bytes) {
  const Traind__UpdateChunk *up = env->update;
  /* every chunk frees the sender's window, whatever becomes of it: one left
   * unacked (a stopped run's, say) held the window shut until it expired */
  send_ack(n, env->sender, 1, env->seq, up->payload.len);
  if (n->r.run == NULL || env->run_id != n->r.run_id) {
    note_drop(n, &n->drops.wrong_run, "update for a run this node is not running");
    return;
  }
  size_t mi = member_index(n, env->sender);
  if (mi == TD_MEMBERS_MAX) {
    note_drop(n, &n->drops.not_member, "update from a node outside the run");
    return;
  }
  n->r.peer_report[mi][up->round % OWN_RING].round = up->round;
  n->r.peer_report[mi][up->round % OWN_RING].capacity =
      isfinite(up->capacity) && up->capacity > 0 && up->capacity < 1e12 ? up->capacity : 0;
  n->r.peer_report[mi][up->round % OWN_RING].uplink =
      isfinite(up->uplink) && up->uplink > 0 && up->uplink < 1e12 ? up->uplink : 0;
  bool async = n->r.spec.mode_kind == TD_MODE_ASYNC;
  td_round_t *collector = async ? n->r.peer_inbox[mi] : n->r.collector;
  if (collector == NULL)
    return;
  if (async && up->round >= td_round_current(collector) + TD_ROUND_SLOTS) {
    uint64_t peer = env->sender; /* the peer skipped ahead: follow it */
    td_round_begin(collector, up->round, &peer, 1);
  }
  td_chunk_result_t res;
  td_update_info_t info;
  char why[256] = "";
  int rc = td_round_add_chunk(collector, env->sender, up->round, up->samples, up->chunk,
                              up->chunks, up->total_bytes, up->payload.data, up->payload.len,
                              up->loss, &res, &info, why, sizeof why);
  if (rc != 0) {
    note_drop(n, &n->drops.malformed, "update chunk inconsistent with the model");
    return;
  }
  if (l != NULL)
    l->bytes_recv += bytes;
  switch (res) {
  case TD_CHUNK_ACCEPTED:
    n->r.bytes_recv_round += bytes;
    break;
  case TD_CHUNK_DUPLICATE: n->drops.duplicate++; break;
  case TD_CHUNK_AHEAD: note_drop(n, &n->drops.ahead, "update beyond the round window"); break;
  case TD_CHUNK_LATE:
    /* count and record only the first chunk of a late update */
    if (up->chunk == 0) {
      n->drops.late++;
      record_update(n, env->sender, up->round, (int64_t)n->r.round - (int64_t)up->round,
                    up->total_bytes, n->r.codec_text);
    }
    break;
  case TD_CHUNK_REJECTED:
  case TD_CHUNK_COMPLETED: {
    n->r.bytes_recv_round += bytes;
    if (res == TD_CHUNK_REJECTED) {
      char what[320];
      snprintf(what, sizeof what, "update from %016" PRIx64 " rejected: %s", env->sender, why);
      note_drop(n, &n->drops.rejected, what);
      ledger_event(n, "update_rejected", "peer %016" PRIx64 " round %" PRIu64 ": %s",
                   env->sender, up->round, why);
      if (async) {
        uint64_t peer = env->sender;
        td_round_begin(collector, up->round + 1, &peer, 1);
      }
      try_close_round(n);
      break;
    }
    double dense = (double)td_run_numel(n->r.run) * 4.0;
    if (l != NULL) {
      l->update_wire_recv += info.bytes;
      l->update_dense_recv += (uint64_t)dense;
    }
    send_ack(n, env->sender, 0, info.round, info.bytes);
    if (async) {
      async_update_done(n, mi, &info);
      break;
    }
    n->r.updates_received++;
    record_update(n, env->sender, info.round, (int64_t)n->r.round - (int64_t)info.round,
                  info.bytes, td_codec_name(info.codec));
    try_close_round(n);
    break;
  }
  }
}

static void on_eval_report(node_t *n, const Traind__Envelope *env) {
  size_t mi = n->r.run != NULL && env->run_id == n->r.run_id ? member_index(n, env->sender)
                                                              : TD_MEMBERS_MAX;
  if (mi == TD_MEMBERS_MAX || !isfinite(env->eval_report->loss) || env->eval_report->loss < 0) {
    note_drop(n, &n->drops.wrong_run, "eval report outside the run or not finite");
    return;
  }
  n->r.reports[mi] = (report_t){.round = env->eval_report->round,
                                .loss = env->eval_report->loss, .have = true};
}

/* Queue `blob` (total bytes) from `offset` as bulk chunks on the link queue,
 * each a copy of `tmpl` (round, reconciliation fields) with its own slice. A
 * resumed request supersedes what is still queued (`supersede`); a
 * reconciliation message queues behind whatever bulk is waiting. */
static void serve_blob_as(node_t *n, link_t *l, const void *blob, uint64_t total,
                          uint64_t offset, const Traind__SnapshotChunk *tmpl, bool supersede) {
  double now = mono_s();
  if (supersede)
    td_linkq_drop_class(l->q, TD_PRIO_BULK);
  const uint8_t *src = blob;
  for (uint64_t off = offset; off < total; off += TD_WIRE_MAX_CHUNK) {
    Traind__SnapshotChunk ch = *tmpl;
    ch.offset = off;
    ch.total_bytes = total;
    ch.payload.data = (uint8_t *)src + off;
    ch.payload.len = total - off < TD_WIRE_MAX_CHUNK ? (size_t)(total - off) : TD_WIRE_MAX_CHUNK;
    Traind__Envelope out = TRAIND__ENVELOPE__INIT;
    out.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK;
    out.snapshot_chunk = &ch;
    out.run_id = n->r.run_id;
    out.sender = n->node_id;
    out.seq = td_linkq_reserve(l->q, 1);
    uint8_t *buf;
    size_t len;
    if (td_wire_pack(&out, &buf, &len) != 0)
      break;
    td_linkq_push_seq(l->q, TD_PRIO_BULK, buf, len, true, now, out.seq);
  }
  n->r.snapshots_served++;
  pump(n, l);
}

static void serve_blob(node_t *n, link_t *l, const void *blob, uint64_t total, uint64_t round,
                       uint64_t offset, bool recon, bool supersede) {
  Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
  tmpl.round = round;
  tmpl.reconcile = recon;
  serve_blob_as(n, l, blob, total, offset, &tmpl, supersede);
}

/* A peer asks for our probed model (knowledge transfer) or, with `join`, for
 * the anchor a late joiner starts from (served when the compute thread has
 * posted it; a request that comes first waits for it). */
static void on_snapshot_request(node_t *n, const Traind__Envelope *env, link_t *l) {
  const Traind__SnapshotRequest *rq = env->snapshot_request;
  bool member = n->r.run != NULL && env->run_id == n->r.run_id &&
                member_index(n, env->sender) != TD_MEMBERS_MAX;
  if (rq->reconcile) {
    const uint8_t *msg;
    size_t len;
    if (l == NULL || !member || n->r.recon == NULL ||
        !td_recon_own_message(n->r.recon, rq->round, &msg, &len) || rq->offset >= len) {
      note_drop(n, &n->drops.wrong_run, "reconciliation request for a round we do not hold");
      return;
    }
    serve_blob(n, l, msg, len, rq->round, rq->offset, true, false);
    return;
  }
  if (l != NULL && member && rq->join) {
    uint64_t total = td_run_anchor_bytes(n->r.run);
    if (rq->offset >= total || rq->round == 0 ||
        (rq->round != n->r.join_blob_round && rq->round != n->r.join_want)) {
      note_drop(n, &n->drops.wrong_run, "join snapshot request for a round we do not hold");
    } else if (n->r.join_blob != NULL && rq->round == n->r.join_blob_round) {
      serve_blob(n, l, n->r.join_blob, total, rq->round, rq->offset, false, true);
    } else {
      size_t i = 0;
      while (i < n->r.n_join_waiting && n->r.join_waiting[i].peer != env->sender)
        i++;
      if (i < sizeof n->r.join_waiting / sizeof n->r.join_waiting[0]) {
        n->r.join_waiting[i].peer = env->sender;
        n->r.join_waiting[i].offset = rq->offset;
        if (i == n->r.n_join_waiting)
          n->r.n_join_waiting++;
      }
    }
    return;
  }
  uint64_t total = n->r.run ? td_run_numel(n->r.run) * sizeof(float) : 0;
  if (l == NULL || !member || n->r.probe_blob == NULL || rq->offset >= total) {
    note_drop(n, &n->drops.wrong_run, "snapshot request we cannot serve");
    return;
  }
  serve_blob(n, l, n->r.probe_blob, total, n->r.probe_round, rq->offset, false, true);
}

static void on_recon_chunk(node_t *n, const Traind__Envelope *env);

static void on_snapshot_chunk(node_t *n, const Traind__Envelope *env) {
  const Traind__SnapshotChunk *ch = env->snapshot_chunk;
  send_ack(n, env->sender, 1, env->seq, ch->payload.len); /* frees the sender's window */
  if (ch->reconcile) {
    on_recon_chunk(n, env);
    return;
  }
  if (!n->r.xfer.active || env->sender != n->r.xfer.peer || env->run_id != n->r.run_id ||
      ch->total_bytes != n->r.xfer.total || ch->offset != n->r.xfer.received ||
      ch->payload.len == 0) {
    n->drops.duplicate++; /* a stale or out-of-order chunk: the resume asks again */
    return;
  }
  memcpy(n->r.xfer.buf + ch->offset, ch->payload.data, ch->payload.len);
  n->r.xfer.received += ch->payload.len;
  n->r.xfer.last = mono_s();
  if (n->r.xfer.received < n->r.xfer.total)
    return;
  const float *x = (const float *)(const void *)n->r.xfer.buf;
  size_t numel = n->r.xfer.total / sizeof(float), bad = 0;
  for (size_t i = 0; i < numel; i++)
    bad += !isfinite(x[i]);
  if (n->r.xfer.join) {
    if (bad) { /* ask again: the serving node's copy cannot hold NaN */
      note_drop(n, &n->drops.rejected, "join snapshot holds NaN/Inf; fetching it again");
      n->r.xfer.received = 0;
      request_snapshot(n);
      return;
    }
    td_run_seed(n->r.run, x, n->r.xfer.total);
    ledger_event(n, "joined", "run %016" PRIx64 " from round %" PRIu64 " with the model of %016"
                 PRIx64 " (%" PRIu64 " bytes)", n->r.run_id, n->r.first_round, n->r.xfer.peer,
                 n->r.xfer.total);
    td_log_info("joined run %016" PRIx64 " at round %" PRIu64 " with the model of %016" PRIx64
                " (%" PRIu64 " KiB)", n->r.run_id, n->r.first_round, n->r.xfer.peer,
                n->r.xfer.total / 1024);
    xfer_reset(n);
    return;
  }
  if (bad) {
    note_drop(n, &n->drops.rejected, "transferred model holds NaN/Inf; not merged");
  } else {
    td_run_merge(n->r.run, x, n->r.spec.transfer_lambda);
    n->r.transfers++;
    ledger_event(n, "transfer", "merged the model of %016" PRIx64 " (round %" PRIu64
                 ", lambda %.2f)", n->r.xfer.peer, ch->round, n->r.spec.transfer_lambda);
    td_log_info("merged the model of %016" PRIx64 " (lambda %.2f)", n->r.xfer.peer,
                n->r.spec.transfer_lambda);
  }
  xfer_reset(n);
}

/* ---- anchor reconciliation ---------------------------------------------------------
 * Every `reconcile` rounds and after the last (sync/overlap, lossy codec) the
 * compute thread posts anchor - init; we encode it in fp16 and collect the
 * members' (scheduler/recon.h). Mesh: pushed to every member of that round
 * over the bulk class. Through a hub (reconcile_via; auto when the uplinks
 * sent with that round's updates make it faster): pushed to the hub only, which sends
 * the fp32 mean back to those that asked. A message that stops growing for
 * 3 s is asked for again from its offset (a member waiting on a hub asks every
 * member once the hub's expected time has passed); after round_timeout the
 * mean goes out with the messages that came. The compute thread moves its
 * anchor by mean - own. */

static void recon_deliver(node_t *n) {
  td_recon_taken_t t;
  while (n->r.recon != NULL &&
         td_recon_take(n->r.recon, mono_s(), n->r.spec.round_timeout, n->r.recon_mean, &t)) {
    char via[64] = "";
    if (t.hub != TD_RECON_MESH) {
      uint64_t id = t.hub < n->r.n_members ? n->r.members[t.hub] : 0;
      snprintf(via, sizeof via, ", mean from hub %016" PRIx64, id);
      n->r.recon_via_hub++;
    } else if (t.want_mean != 0) { /* we are their hub: the mean goes back to them */
      const uint8_t *msg;
      size_t len;
      unsigned sent = 0;
      if (td_recon_encode_mean(n->r.recon, n->r.recon_mean, &msg, &len) == 0) {
        Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
        tmpl.round = t.round;
        tmpl.reconcile = true;
        tmpl.mean_of = t.used;
        tmpl.mean_expected = t.expected;
        for (size_t i = 0; i < n->r.n_members; i++) {
          link_t *l = (t.want_mean >> i & 1) && member_reachable(n, n->r.members[i])
                          ? link_find(n, n->r.members[i])
                          : NULL;
          if (l != NULL) {
            serve_blob_as(n, l, msg, len, 0, &tmpl, false);
            sent++;
          }
        }
      }
      snprintf(via, sizeof via, ", hub: mean sent to %u", sent);
      n->r.recon_as_hub++;
    }
    td_run_reconciled(n->r.run, t.round, n->r.recon_mean);
    n->r.reconciled++;
    if (t.used < t.expected) {
      n->r.recon_partial++;
      td_log_warn("round %" PRIu64 ": anchors reconciled from %u of %u members (timeout)%s",
                  t.round, t.used, t.expected, via);
    } else {
      td_log_info("round %" PRIu64 ": anchors of %u members reconciled%s", t.round, t.used, via);
    }
    ledger_event(n, "reconciled", "round %" PRIu64 ": %u of %u anchors%s", t.round, t.used,
                 t.expected, via);
  }
}

static void on_reconcile_own(node_t *n, td_run_event_t *ev) {
  uint64_t expected = 0, r = ev->round;
  double uplink[TD_RECON_MAX_MEMBERS] = {0};
  for (size_t i = 0; i < n->r.n_members && i < TD_RECON_MAX_MEMBERS; i++) {
    bool self = n->r.members[i] == n->node_id;
    if (n->r.since[i] <= r && (self || member_reachable(n, n->r.members[i])))
      expected |= (uint64_t)1 << i;
    /* the figures every member got with this round's updates: one plan for all */
    if (self && n->r.own[r % OWN_RING].round == r)
      uplink[i] = n->r.own[r % OWN_RING].uplink;
    else if (!self && n->r.peer_report[i][r % OWN_RING].round == r)
      uplink[i] = n->r.peer_report[i][r % OWN_RING].uplink;
  }
  const uint8_t *msg;
  size_t len;
  char why[256];
  int rc = n->r.recon == NULL ? TD_EINVAL
                              : td_recon_own(n->r.recon, ev->round, ev->blob, n->r.rank,
                                             expected, mono_s(), &msg, &len, why, sizeof why);
  if (rc != 0) { /* the compute thread must not wait for it: its own mean, no move */
    td_log_warn("round %" PRIu64 ": no anchor reconciliation: %s", ev->round,
                n->r.recon == NULL ? "not set up" : why);
    td_run_reconciled(n->r.run, ev->round, ev->blob);
  }
  free(ev->blob);
  ev->blob = NULL;
  if (rc != 0)
    return;
  double hub_s;
  size_t hub = td_recon_plan(uplink, expected, (td_recon_via_t)n->r.spec.reconcile_via_kind,
                             len, &hub_s);
  link_t *hl = hub != TD_RECON_MESH && hub != n->r.rank ? link_find(n, n->r.members[hub]) : NULL;
  if (hl != NULL) { /* to the hub only; the others' messages come only if it fails */
    Traind__SnapshotChunk tmpl = TRAIND__SNAPSHOT_CHUNK__INIT;
    tmpl.round = ev->round;
    tmpl.reconcile = true;
    tmpl.to_hub = true;
    serve_blob_as(n, hl, msg, len, 0, &tmpl, false);
    td_recon_quiet(n->r.recon, ev->round, mono_s(), 2.0 * hub_s);
    td_log_debug("round %" PRIu64 ": anchor to hub %016" PRIx64 " (expected %.2f s)", ev->round,
                 n->r.members[hub], hub_s);
  } else if (hub == TD_RECON_MESH || hub != n->r.rank) {
    uint64_t peers[TD_MEMBERS_MAX];
    size_t k = run_peers_at(n, ev->round, peers);
    for (size_t i = 0; i < k; i++) {
      link_t *l = link_find(n, peers[i]);
      if (l != NULL)
        serve_blob(n, l, msg, len, ev->round, 0, true, false);
    }
  } /* else: we are the hub; the members' messages come to us */
  recon_deliver(n);
}

static void on_recon_chunk(node_t *n, const Traind__Envelope *env) {
  const Traind__SnapshotChunk *ch = env->snapshot_chunk;
  size_t mi = member_index(n, env->sender);
  if (n->r.recon == NULL || env->run_id != n->r.run_id || mi == TD_MEMBERS_MAX) {
    note_drop(n, &n->drops.wrong_run, "reconciliation chunk outside our run");
    return;
  }
  td_recon_result_t res;
  char why[256];
  int rc = ch->mean_of > 0
               ? td_recon_mean_chunk(n->r.recon, ch->round, mi, ch->offset, ch->total_bytes,
                                     ch->payload.data, ch->payload.len, ch->mean_of,
                                     ch->mean_expected, mono_s(), &res, why, sizeof why)
               : td_recon_chunk(n->r.recon, ch->round, mi, ch->offset, ch->total_bytes,
                                ch->payload.data, ch->payload.len, ch->to_hub, mono_s(), &res,
                                why, sizeof why);
  if (rc == TD_EPROTO) {
    note_drop(n, &n->drops.malformed, why);
    return;
  }
  if (rc != 0 || res == TD_RECON_REJECTED) {
    note_drop(n, &n->drops.rejected, rc != 0 ? td_strerror(rc) : why);
  } else if (res == TD_RECON_DUPLICATE || res == TD_RECON_LATE) {
    n->drops.duplicate++;
  } else if (res == TD_RECON_AHEAD) {
    n->drops.ahead++;
  }
  recon_deliver(n);
}

/* Heartbeat: ask again for messages that stopped growing; time out rounds. */
static void recon_tick(node_t *n) {
  if (n->r.recon == NULL)
    return;
  td_recon_stall_t st[8];
  size_t k = td_recon_stalled(n->r.recon, mono_s(), 3.0, st, 8);
  for (size_t i = 0; i < k; i++) {
    if (st[i].member >= n->r.n_members || !member_reachable(n, n->r.members[st[i].member]))
      continue;
    link_t *l = link_find(n, n->r.members[st[i].member]);
    if (l != NULL)
      send_snapshot_request(n, l, st[i].round, st[i].offset, false, true);
  }
  recon_deliver(n);
}

/* ---- late join ---------------------------------------------------------------------
 * A node that joins the cluster while a run is going (trainctl join) is
 * admitted by the run member with the lowest id among those reachable: it
 * picks round R = its open round + 3 (no member has begun R yet: members are
 * at most one round apart, and R - 1 is still ahead of every compute thread)
 * and sends RunStart{members + joiner, join_round R} to the members and to
 * the joiner. From R on every member expects the joiner's update, sends it
 * its own and counts it in the batch split. The admitter asks its compute
 * thread for the anchor once it holds round R - 1; the joiner fetches it
 * (bulk, chunked, resumable: SnapshotRequest{join}) and starts from it at R,
 * its learning-rate schedule moved to where the others are. */

static void add_member(node_t *n, uint64_t id, uint64_t from) {
  if (member_index(n, id) != TD_MEMBERS_MAX || n->r.n_members >= TD_MEMBERS_MAX ||
      n->r.n_members >= TD_ROUND_MAX_PEERS)
    return;
  size_t i = n->r.n_members;
  if (td_link_codec_open(&n->r.link_codecs[i], &n->r.codec, td_run_layout(n->r.run),
                         n->r.spec.seed, id ^ (n->node_id * 0x9e3779b97f4a7c15ull)) != 0) {
    td_log_warn("out of memory for the link codec of %016" PRIx64 ": not admitted", id);
    return;
  }
  n->r.members[i] = id;
  n->r.since[i] = from;
  n->r.n_members++;
  memset(n->r.peer_report[i], 0, sizeof n->r.peer_report[i]);
  /* from R on the batch is split evenly again, until the joiner has measured */
  unsigned k = (unsigned)n->r.n_members;
  for (size_t j = 0; j < n->r.n_members; j++)
    n->r.plan[j] = td_run_split_batch(n->r.spec.batch, (unsigned)j, k);
  td_run_set_nodes(n->r.run, from, k);
  td_run_set_batch(n->r.run, from, n->r.plan[n->r.rank]);
  ledger_event(n, "member_added", "%016" PRIx64 " joins run %016" PRIx64 " at round %" PRIu64,
               id, n->r.run_id, from);
  td_log_info("peer %016" PRIx64 " joins the run at round %" PRIu64 " (%u nodes)", id, from, k);
}

/* RunStart with join_round: as a member, take the joiner in; as the joiner,
 * start the run from join_round. */
static void on_admission(node_t *n, const Traind__Envelope *env) {
  const Traind__RunStart *rs = env->run_start;
  size_t k = rs->n_members;
  if (k < 2 || k > TD_MEMBERS_MAX || rs->joiner == 0 || rs->members[k - 1] != rs->joiner) {
    note_drop(n, &n->drops.malformed, "run admission with a bad member list");
    return;
  }
  if (rs->joiner == n->node_id) {
    if (n->r.run != NULL) {
      if (n->r.run_id != env->run_id)
        note_drop(n, &n->drops.wrong_run, "admission into a run while running another");
      return; /* or a repeat of the admission we acted on */
    }
    char why[512] = "";
    if (start_run(n, env->run_id, rs->spec, rs->members, k, rs->join_round, env->sender, why,
                  sizeof why) != 0) {
      td_log_warn("cannot join run %016" PRIx64 ": %s", env->run_id, why);
      ledger_event(n, "run_refused", "run %016" PRIx64 ": %s", env->run_id, why);
    }
    return;
  }
  if (n->r.run == NULL || n->r.run_id != env->run_id) {
    note_drop(n, &n->drops.wrong_run, "admission into a run this node is not running");
    return;
  }
  if (member_index(n, rs->joiner) != TD_MEMBERS_MAX)
    return; /* already in */
  /* the list must be ours plus the joiner, or the members would disagree */
  bool same = k == n->r.n_members + 1;
  for (size_t i = 0; same && i + 1 < k; i++)
    same = rs->members[i] == n->r.members[i];
  if (!same || rs->join_round <= n->r.round) {
    td_log_warn("admission of %016" PRIx64 " at round %" PRIu64 " does not fit this node's run "
                "(round %" PRIu64 ", %zu members): ignored", rs->joiner, rs->join_round,
                n->r.round, n->r.n_members);
    n->drops.wrong_run++;
    return;
  }
  add_member(n, rs->joiner, rs->join_round);
}

/* Heartbeat tick: admit one idle, alive node that is not in the run. */
static void maybe_admit(node_t *n) {
  if (n->r.run == NULL || !n->r.ready || n->r.spec.mode_kind == TD_MODE_ASYNC ||
      n->r.round <= n->r.first_round || n->r.round + 4 > n->r.rounds ||
      n->r.n_members >= TD_MEMBERS_MAX || n->r.n_members >= TD_ROUND_MAX_PEERS ||
      (n->r.join_want != 0 && n->r.join_blob_round != n->r.join_want))
    return;
  for (size_t i = 0; i < n->r.n_members; i++) /* the lowest reachable id admits */
    if (n->r.members[i] < n->node_id && member_reachable(n, n->r.members[i]))
      return;
  uint64_t joiner = 0;
  for (size_t i = 0; i < n->n_links && joiner == 0; i++) {
    td_member_t *m = n->links[i].peer ? td_members_find(n->members, n->links[i].peer) : NULL;
    if (m != NULL && m->state == TD_PEER_ALIVE && m->reported && m->run_id == 0 &&
        member_index(n, m->node_id) == TD_MEMBERS_MAX)
      joiner = m->node_id;
  }
  if (joiner == 0)
    return;
  uint64_t R = n->r.round + 3;
  uint64_t members[TD_MEMBERS_MAX];
  memcpy(members, n->r.members, n->r.n_members * sizeof *members);
  members[n->r.n_members] = joiner;
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = n->r.spec_text;
  rs.members = members;
  rs.n_members = n->r.n_members + 1;
  rs.join_round = R;
  rs.joiner = joiner;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = n->r.run_id;
  for (size_t i = 0; i < rs.n_members; i++) {
    link_t *l = members[i] != n->node_id ? link_find(n, members[i]) : NULL;
    if (l != NULL)
      send_envelope(n, l, &env);
  }
  add_member(n, joiner, R);
  n->r.joins++;
  free(n->r.join_blob);
  n->r.join_blob = NULL;
  n->r.join_blob_round = 0;
  n->r.join_want = R - 1;
  td_run_want_anchor(n->r.run, R - 1);
}

/* The compute thread posted the anchor a joiner starts from: serve waiters. */
static void on_anchor(node_t *n, td_run_event_t *ev) {
  free(n->r.join_blob);
  n->r.join_blob = ev->blob;
  n->r.join_blob_round = ev->round;
  for (size_t i = 0; i < n->r.n_join_waiting; i++) {
    link_t *l = link_find(n, n->r.join_waiting[i].peer);
    if (l != NULL)
      serve_blob(n, l, n->r.join_blob, td_run_anchor_bytes(n->r.run), ev->round,
                 n->r.join_waiting[i].offset, false, true);
  }
  n->r.n_join_waiting = 0;
}

static void on_envelope(node_t *n, Traind__Envelope *env, size_t bytes) {
  if (env->sender == 0 || env->sender == n->node_id) {
    note_drop(n, &n->drops.malformed, "message with a bad sender id");
    return;
  }
  link_t *l = link_find(n, env->sender);
  if (l != NULL)
    l->msgs_recv++;
  switch (env->body_case) {
  case TRAIND__ENVELOPE__BODY_HELLO:
    if (env->hello->endpoint == NULL || strncmp(env->hello->endpoint, "tcp://", 6) != 0) {
      note_drop(n, &n->drops.malformed, "hello without a tcp:// endpoint");
      return;
    }
    heard_from(n, env->sender, env->hello->endpoint);
    if ((l = link_find(n, env->sender)) != NULL)
      send_welcome(n, l);
    break;
  case TRAIND__ENVELOPE__BODY_WELCOME: {
    const char *ep = NULL;
    for (size_t i = 0; i < env->welcome->n_peers; i++)
      if (env->welcome->peers[i]->node_id == env->sender)
        ep = env->welcome->peers[i]->endpoint;
    heard_from(n, env->sender, ep);
    learn_peers(n, env->welcome->peers, env->welcome->n_peers);
    if (n->pending_join != NULL) {
      extern void td__control_join_done(node_t * n, uint64_t peer);
      td__control_join_done(n, env->sender);
    }
    break;
  }
  case TRAIND__ENVELOPE__BODY_HEARTBEAT: {
    if (td_members_find(n->members, env->sender) == NULL) {
      /* a stranger's heartbeat: ask it to introduce itself instead of trusting it */
      n->drops.not_member++;
      return;
    }
    heard_from(n, env->sender, NULL);
    td_member_t *m = td_members_find(n->members, env->sender);
    if (isfinite(env->heartbeat->capacity) && env->heartbeat->capacity >= 0)
      m->capacity = env->heartbeat->capacity;
    m->round = env->heartbeat->round;
    m->run_id = env->heartbeat->run_state ? env->run_id : 0;
    m->reported = true;
    learn_peers(n, env->heartbeat->peers, env->heartbeat->n_peers);
    break;
  }
  case TRAIND__ENVELOPE__BODY_LEAVE:
    td_log_info("peer %016" PRIx64 " leaves: %s", env->sender,
                env->leave->reason ? env->leave->reason : "");
    td_members_left(n->members, env->sender);
    ledger_event(n, "peer_left", "%016" PRIx64, env->sender);
    if (n->r.run != NULL)
      td_round_forget_peer(n->r.collector, env->sender);
    if (td_members_find(n->members, env->sender))
      record_peer(n, td_members_find(n->members, env->sender));
    try_close_round(n);
    break;
  case TRAIND__ENVELOPE__BODY_RUN_START: {
    if (td_members_find(n->members, env->sender) == NULL) {
      note_drop(n, &n->drops.not_member, "run start from an unknown node");
      return;
    }
    const Traind__RunStart *rs = env->run_start;
    if (rs->join_round > 0) {
      on_admission(n, env);
      return;
    }
    if (n->r.run != NULL && n->r.run_id == env->run_id)
      return; /* already running it */
    char why[512] = "";
    if (start_run(n, env->run_id, rs->spec, rs->members, rs->n_members, 1, 0, why,
                  sizeof why) != 0) {
      td_log_warn("cannot start run %016" PRIx64 " from %016" PRIx64 ": %s", env->run_id,
                  env->sender, why);
      ledger_event(n, "run_refused", "run %016" PRIx64 ": %s", env->run_id, why);
    }
    break;
  }
  case TRAIND__ENVELOPE__BODY_RUN_STOP:
    if (n->r.run != NULL && env->run_id == n->r.run_id) {
      td_log_info("run %016" PRIx64 " stopped by %016" PRIx64, n->r.run_id, env->sender);
      td_run_stop(n->r.run);
    } else {
      note_drop(n, &n->drops.wrong_run, "stop for a run this node is not running");
    }
    break;
  case TRAIND__ENVELOPE__BODY_UPDATE:
    /* a member's update chunks are proof of life: on a slow uplink its
     * heartbeats queue behind them, and must not get it declared dead */
    if (td_members_find(n->members, env->sender) != NULL)
      heard_from(n, env->sender, NULL);
    on_update(n, env, l, bytes);
    break;
  case TRAIND__ENVELOPE__BODY_ACK:
    if (td_members_find(n->members, env->sender) != NULL)
      heard_from(n, env->sender, NULL);
    on_ack(n, env, l);
    break;
  case TRAIND__ENVELOPE__BODY_EVAL_REPORT:
    on_eval_report(n, env);
    break;
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST:
    on_snapshot_request(n, env, l);
    break;
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK:
    if (td_members_find(n->members, env->sender) != NULL)
      heard_from(n, env->sender, NULL);
    on_snapshot_chunk(n, env);
    break;
  default:
    break; /* ack, snapshots, eval reports: used by the scheduler milestone */
  }
}

/* Drain the ROUTER while ZMQ_EVENTS reports input (ZMQ_FD is edge-triggered). */
static void drain_router(node_t *n) {
  for (;;) {
    int events = 0;
    size_t sz = sizeof events;
    if (zmq_getsockopt(n->router, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN))
      return;
    zmq_msg_t id, msg;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, n->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&id);
      return;
    }
    bool more = zmq_msg_more(&id);
    zmq_msg_close(&id);
    if (!more) {
      note_drop(n, &n->drops.malformed, "message without a routing frame");
      continue;
    }
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, n->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      continue;
    }
    bool extra = zmq_msg_more(&msg);
    size_t len = zmq_msg_size(&msg);
    if (extra) {
      /* swallow the remaining frames of a multi-frame message */
      while (extra) {
        zmq_msg_t rest;
        zmq_msg_init(&rest);
        if (zmq_msg_recv(&rest, n->router, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&rest);
          break;
        }
        extra = zmq_msg_more(&rest);
        zmq_msg_close(&rest);
      }
      note_drop(n, &n->drops.malformed, "multi-frame message");
    } else if (len > TD_WIRE_MAX_MESSAGE) {
      note_drop(n, &n->drops.oversized, "oversized message");
    } else {
      Traind__Envelope *env = NULL;
      char why[256] = "";
      if (td_wire_unpack(&env, zmq_msg_data(&msg), len, why, sizeof why) != 0) {
        note_drop(n, strstr(why, "version") ? &n->drops.version : &n->drops.malformed, why);
      } else {
        on_envelope(n, env, len);
        td_wire_free(&env);
      }
    }
    zmq_msg_close(&msg);
  }
}

static void on_router_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_router(h->data);
}

/* Socket monitor: count connections that fail the ZMTP handshake (random
 * bytes, wrong protocol) — libzmq drops them before any message exists. */
static void drain_monitor(node_t *n) {
  if (n->monitor == NULL)
    return;
  for (;;) {
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(n->monitor, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
      return;
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, n->monitor, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&frame);
      return;
    }
    uint16_t event = 0;
    if (zmq_msg_size(&frame) >= 2)
      memcpy(&event, zmq_msg_data(&frame), 2);
    bool more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    while (more) {
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, n->monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&frame);
        break;
      }
      more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
        event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      note_drop(n, &n->drops.handshake, "connection failed the ZMTP handshake");
  }
}

static void on_monitor_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_monitor(h->data);
}

/* ---- heartbeats and timers ------------------------------------------------------ */

static void on_heartbeat(uv_timer_t *t) {
  node_t *n = t->data;
  drain_router(n);
  drain_monitor(n);
  td_members_tick(n->members, mono_s(), on_member_event, n);
  Traind__PeerInfo infos[TD_MEMBERS_MAX], *ptrs[TD_MEMBERS_MAX];
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  fill_peer_infos(n, infos, ptrs, &hb.n_peers);
  hb.peers = ptrs;
  hb.round = n->r.run ? n->r.round : 0;
  hb.run_state = n->r.run ? 1 : 0;
  hb.capacity = n->r.run ? n->r.capacity : 0; /* samples/s EWMA (weighted batching) */
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  env.run_id = n->r.run ? n->r.run_id : 0;
  /* dead peers get heartbeats too, so a restarted one finds its way back */
  for (size_t i = 0; i < n->n_links; i++) {
    td_member_t *m = n->links[i].peer ? td_members_find(n->members, n->links[i].peer) : NULL;
    if (m != NULL && m->state != TD_PEER_LEFT)
      send_envelope(n, &n->links[i], &env);
  }
  for (size_t i = 0; i < n->n_links; i++) { /* acks lost with a dead peer */
    if (td_linkq_expire(n->links[i].q, mono_s(), 30.0) > 0)
      pump(n, &n->links[i]);
  }
  if (n->r.run != NULL && n->r.xfer.active &&
      mono_s() - n->r.xfer.last > (n->r.xfer.join ? 3.0 : 10.0)) {
    if (member_reachable(n, n->r.xfer.peer)) {
      request_snapshot(n); /* resume from what arrived */
    } else if (n->r.xfer.join) {
      td_log_error("run %016" PRIx64 ": the member serving the model to join from is gone; "
                   "giving up the run", n->r.run_id);
      td_run_stop(n->r.run);
      xfer_reset(n);
    } else {
      xfer_reset(n);
    }
  }
  maybe_admit(n);
  if (n->r.run != NULL) {
    recon_tick(n);
    check_deadline(n);
    try_close_round(n);
  }
  ledger_flush(n);
}

/* ---- control socket (trainctl) --------------------------------------------------- */

struct control_conn {
  uv_pipe_t pipe;
  node_t *node;
  uint8_t *buf;
  size_t len, cap;
  bool responded;
  uv_write_t write_req;
  uint8_t *out;
  uv_timer_t join_timer;
  bool join_timer_active;
  char join_endpoint[TD_ENDPOINT_MAX];
  uv_work_t work;
  unsigned last;
  char *work_json;
};

static void conn_free(uv_handle_t *h) {
  control_conn_t *c = h->data;
  free(c->buf);
  free(c->out);
  free(c->work_json);
  free(c);
}

static void conn_close(control_conn_t *c) {
  if (c->join_timer_active) {
    c->join_timer_active = false;
    uv_close((uv_handle_t *)&c->join_timer, NULL);
  }
  if (!uv_is_closing((uv_handle_t *)&c->pipe))
    uv_close((uv_handle_t *)&c->pipe, conn_free);
}

static void on_written(uv_write_t *req, int status) {
  (void)status;
  conn_close(req->data);
}

/* Send one framed response (status 0 with a JSON payload, or an error). */
static void respond(control_conn_t *c, int status, const char *error, const char *json) {
  if (c->responded)
    return;
  c->responded = true;
  Traind__ControlResponse resp = TRAIND__CONTROL_RESPONSE__INIT;
  resp.status = status;
  resp.error = (char *)(error ? error : "");
  resp.json = (char *)(json ? json : "");
  uint8_t *body;
  size_t len;
  if (td_wire_pack_response(&resp, &body, &len) != 0) {
    conn_close(c);
    return;
  }
  c->out = malloc(len + 4);
  if (c->out == NULL) {
    free(body);
    conn_close(c);
    return;
  }
  c->out[0] = (uint8_t)(len >> 24);
  c->out[1] = (uint8_t)(len >> 16);
  c->out[2] = (uint8_t)(len >> 8);
  c->out[3] = (uint8_t)len;
  memcpy(c->out + 4, body, len);
  free(body);
  uv_buf_t b = uv_buf_init((char *)c->out, (unsigned)(len + 4));
  c->write_req.data = c;
  if (uv_write(&c->write_req, (uv_stream_t *)&c->pipe, &b, 1, on_written) != 0)
    conn_close(c);
}

static void respond_json(control_conn_t *c, json_object *o) {
  respond(c, 0, NULL, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  json_object_put(o);
}

static void hex_id(char *buf, size_t len, uint64_t id) { snprintf(buf, len, "%016" PRIx64, id); }

static json_object *json_id(uint64_t id) {
  char b[24];
  hex_id(b, sizeof b, id);
  return json_object_new_string(b);
}

static json_object *json_real(double v) {
  return isfinite(v) ? json_object_new_double(v) : NULL;
}

static json_object *peers_json(node_t *n) {
  json_object *arr = json_object_new_array();
  double now = mono_s();
  for (size_t i = 0; i < td_members_count(n->members); i++) {
    const td_member_t *m = td_members_at(n->members, i);
    if (m->self)
      continue;
    json_object *p = json_object_new_object();
    json_object_object_add(p, "node_id", json_id(m->node_id));
    json_object_object_add(p, "endpoint", json_object_new_string(m->endpoint));
    json_object_object_add(p, "state", json_object_new_string(td_peer_state_name(m->state)));
    json_object_object_add(p, "last_heard_s", json_object_new_double(now - m->last_heard));
    json_object_object_add(p, "round", json_object_new_int64((int64_t)m->round));
    json_object_object_add(p, "capacity", json_real(m->capacity > 0 ? m->capacity : NAN));
    link_t *l = link_find(n, m->node_id);
    json_object_object_add(p, "bytes_sent", json_object_new_int64(l ? (int64_t)l->bytes_sent : 0));
    json_object_object_add(p, "bytes_recv", json_object_new_int64(l ? (int64_t)l->bytes_recv : 0));
    json_object_object_add(p, "send_drops", json_object_new_int64(l ? (int64_t)l->send_drops : 0));
    json_object_object_add(p, "codec", json_object_new_string(l && l->codec[0] ? l->codec : "-"));
    json_object_object_add(p, "goodput_bps", json_real(l && l->goodput_bps > 0 ? l->goodput_bps : NAN));
    json_object_object_add(p, "ack_ms", json_real(l && l->ack_s > 0 ? l->ack_s * 1e3 : NAN));
    json_object_object_add(p, "budget_bytes", json_real(l && l->budget > 0 ? l->budget : NAN));
    td_linkq_stats_t qs = {0};
    if (l != NULL)
      td_linkq_stats(l->q, &qs);
    json_object_object_add(p, "rtt_ms", json_real(qs.rtt_s > 0 ? qs.rtt_s * 1e3 : NAN));
    json_object_object_add(p, "window_bytes", json_object_new_int64((int64_t)qs.window));
    json_object_object_add(p, "in_flight_bytes", json_object_new_int64((int64_t)qs.in_flight));
    json_object_object_add(p, "queued_bytes",
                           json_object_new_int64((int64_t)qs.queued_bytes[TD_PRIO_UPDATE]));
    json_object_object_add(p, "update_bytes_sent",
                           json_object_new_int64(l ? (int64_t)l->update_wire_sent : 0));
    json_object_object_add(p, "update_bytes_recv",
                           json_object_new_int64(l ? (int64_t)l->update_wire_recv : 0));
    json_object_object_add(p, "ratio_sent",
                           json_real(l && l->update_wire_sent
                                         ? (double)l->update_dense_sent / (double)l->update_wire_sent
                                         : NAN));
    json_object_object_add(p, "ratio_recv",
                           json_real(l && l->update_wire_recv
                                         ? (double)l->update_dense_recv / (double)l->update_wire_recv
                                         : NAN));
    json_object_array_add(arr, p);
  }
  return arr;
}

static json_object *status_json(node_t *n) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "node_id", json_id(n->node_id));
  json_object_object_add(o, "endpoint", json_object_new_string(n->endpoint));
  json_object_object_add(o, "data_dir", json_object_new_string(n->data_dir));
  json_object_object_add(o, "peers", peers_json(n));
  json_object *run = json_object_new_object();
  json_object_object_add(run, "run_id", n->r.run_id ? json_id(n->r.run_id) : NULL);
  json_object_object_add(run, "state", json_object_new_string(n->r.state ? n->r.state : "idle"));
  json_object_object_add(run, "round", json_object_new_int64((int64_t)n->r.rounds_done));
  json_object_object_add(run, "rounds", json_object_new_int64((int64_t)n->r.rounds));
  json_object_object_add(run, "rank", json_object_new_int((int)n->r.rank));
  json_object_object_add(run, "codec", json_object_new_string(n->r.codec_text[0] ? n->r.codec_text : "none"));
  json_object_object_add(run, "nodes", json_object_new_int((int)n->r.n_members));
  json_object_object_add(run, "loss", json_real(n->r.run_id ? n->r.own_loss : NAN));
  json_object_object_add(run, "eval_accuracy", json_real(n->r.last_eval_acc));
  json_object_object_add(run, "test_accuracy", json_real(n->r.test_accuracy));
  json_object_object_add(run, "updates_received",
                         json_object_new_int64((int64_t)n->r.updates_received));
  json_object_object_add(run, "late_peers", json_object_new_int64((int64_t)n->r.late_peers));
  json_object_object_add(run, "transfers", json_object_new_int64((int64_t)n->r.transfers));
  json_object_object_add(run, "reconciled", json_object_new_int64((int64_t)n->r.reconciled));
  json_object_object_add(run, "reconciled_partial",
                         json_object_new_int64((int64_t)n->r.recon_partial));
  json_object_object_add(run, "reconciled_via_hub",
                         json_object_new_int64((int64_t)n->r.recon_via_hub));
  json_object_object_add(run, "reconciled_as_hub",
                         json_object_new_int64((int64_t)n->r.recon_as_hub));
  json_object_object_add(run, "first_round", json_object_new_int64((int64_t)n->r.first_round));
  json_object_object_add(run, "joins_admitted", json_object_new_int64((int64_t)n->r.joins));
  json_object_object_add(run, "snapshots_served",
                         json_object_new_int64((int64_t)n->r.snapshots_served));
  json_object_object_add(run, "capacity", json_real(n->r.capacity > 0 ? n->r.capacity : NAN));
  json_object_object_add(run, "error", n->r.error[0] ? json_object_new_string(n->r.error) : NULL);
  json_object_object_add(o, "run", run);
  json_object *d = json_object_new_object();
#define DROP(name) json_object_object_add(d, #name, json_object_new_int64((int64_t)n->drops.name))
  DROP(malformed);
  DROP(version);
  DROP(oversized);
  DROP(wrong_run);
  DROP(not_member);
  DROP(late);
  DROP(ahead);
  DROP(rejected);
  DROP(nonfinite_local);
  DROP(duplicate);
  DROP(handshake);
#undef DROP
  json_object_object_add(o, "drops", d);
  return o;
}

void td__control_join_done(node_t *n, uint64_t peer);
void td__control_join_done(node_t *n, uint64_t peer) {
  control_conn_t *c = n->pending_join;
  if (c == NULL)
    return;
  n->pending_join = NULL;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "joined", json_object_new_string(c->join_endpoint));
  json_object_object_add(o, "seed_node", json_id(peer));
  json_object_object_add(o, "peers", peers_json(n));
  respond_json(c, o);
}

static void on_join_timeout(uv_timer_t *t) {
  control_conn_t *c = t->data;
  node_t *n = c->node;
  if (n->pending_join == c)
    n->pending_join = NULL;
  char msg[512];
  snprintf(msg, sizeof msg, "no answer from %s within 5 s (is traind listening there?)",
           c->join_endpoint);
  respond(c, TD_EIO, msg, NULL);
}

static void cmd_join(control_conn_t *c, const char *endpoint) {
  node_t *n = c->node;
  if (endpoint == NULL || strncmp(endpoint, "tcp://", 6) != 0 ||
      strlen(endpoint) >= TD_ENDPOINT_MAX || strchr(endpoint + 6, ':') == NULL) {
    respond(c, TD_ECONFIG, "join needs an endpoint of the form tcp://HOST:PORT", NULL);
    return;
  }
  if (strcmp(endpoint, n->endpoint) == 0) {
    respond(c, TD_ECONFIG, "that is this node's own endpoint", NULL);
    return;
  }
  if (n->pending_join != NULL) {
    respond(c, TD_EINVAL, "another join is in progress", NULL);
    return;
  }
  link_t *l = NULL;
  for (size_t i = 0; i < n->n_links; i++)
    if (strcmp(n->links[i].endpoint, endpoint) == 0)
      l = &n->links[i];
  if (l == NULL)
    l = link_ensure(n, 0, endpoint);
  if (l == NULL) {
    respond(c, TD_EIO, "cannot open a link to that endpoint", NULL);
    return;
  }
  snprintf(c->join_endpoint, sizeof c->join_endpoint, "%s", endpoint);
  n->pending_join = c;
  uv_timer_init(&n->loop, &c->join_timer);
  c->join_timer.data = c;
  c->join_timer_active = true;
  uv_timer_start(&c->join_timer, on_join_timeout, 5000, 0);
  send_hello(n, l);
}

static void cmd_start(control_conn_t *c, const Traind__ControlRequest *req) {
  node_t *n = c->node;
  char why[768] = "";
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  int rc = 0;
  if (req->ini_text != NULL && req->ini_text[0] != '\0') /* parsed in memory, no disk */
    rc = td_runspec_load_ini_text(&spec, req->ini_text, "run file", why, sizeof why);
  for (size_t i = 0; rc == 0 && i < req->n_settings; i++)
    rc = td_runspec_set_arg(&spec, req->settings[i], why, sizeof why);
  if (rc == 0)
    rc = td_runspec_validate(&spec, why, sizeof why);
  if (rc != 0) {
    respond(c, TD_ECONFIG, why, NULL);
    return;
  }
  if (n->r.run != NULL) {
    snprintf(why, sizeof why, "run %016" PRIx64 " is still running (trainctl stop first)",
             n->r.run_id);
    respond(c, TD_EINVAL, why, NULL);
    return;
  }
  size_t need = td_runspec_format(&spec, NULL, 0) + 1;
  char *text = malloc(need);
  if (text == NULL) {
    respond(c, TD_ENOMEM, "out of memory", NULL);
    return;
  }
  td_runspec_format(&spec, text, need);
  uint64_t members[TD_MEMBERS_MAX];
  size_t nm = td_members_live(n->members, false, members, TD_MEMBERS_MAX);
  double now = wall_s();
  uint64_t run_id = fnv1a64(text, strlen(text), 0xcbf29ce484222325ull);
  run_id = fnv1a64(&n->node_id, sizeof n->node_id, run_id);
  run_id = fnv1a64(&now, sizeof now, run_id);
  if (run_id == 0)
    run_id = 1;
  rc = start_run(n, run_id, text, members, nm, 1, 0, why, sizeof why);
  if (rc != 0) {
    free(text);
    respond(c, rc, why, NULL);
    return;
  }
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = text;
  rs.members = members;
  rs.n_members = nm;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = run_id;
  broadcast(n, &env);
  free(text);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", json_id(run_id));
  json_object_object_add(o, "nodes", json_object_new_int((int)nm));
  respond_json(c, o);
}

static void cmd_stop(control_conn_t *c) {
  node_t *n = c->node;
  if (n->r.run == NULL) {
    respond(c, TD_EINVAL, "no run is running", NULL);
    return;
  }
  Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
  stop.reason = "trainctl stop";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
  env.run_stop = &stop;
  env.run_id = n->r.run_id;
  broadcast(n, &env);
  td_run_stop(n->r.run);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "stopping", json_id(n->r.run_id));
  respond_json(c, o);
}

static void round_to_json(const td_ledger_round_t *r, void *user) {
  json_object *arr = user, *o = json_object_new_object();
  json_object_object_add(o, "run_id", json_id(r->run_id));
  json_object_object_add(o, "round", json_object_new_int64((int64_t)r->round));
  json_object_object_add(o, "started", json_object_new_double(r->started));
  json_object_object_add(o, "ended", json_object_new_double(r->ended));
  json_object_object_add(o, "local_steps", json_object_new_int64(r->local_steps));
  json_object_object_add(o, "batch", json_object_new_int64(r->batch));
  json_object_object_add(o, "samples", json_object_new_int64((int64_t)r->samples));
  json_object_object_add(o, "loss", json_real(r->loss));
  json_object_object_add(o, "eval_acc", json_real(r->eval_acc));
  json_object_object_add(o, "bytes_sent", json_object_new_int64((int64_t)r->bytes_sent));
  json_object_object_add(o, "bytes_recv", json_object_new_int64((int64_t)r->bytes_recv));
  json_object_object_add(o, "compute_s", json_real(r->compute_s));
  json_object_object_add(o, "wait_s", json_real(r->wait_s));
  json_object_array_add(arr, o);
}

typedef struct {
  node_t *node;
  uint64_t run_id;
} rounds_args_t;

static void rounds_work(uv_work_t *req) {
  control_conn_t *c = req->data;
  node_t *n = c->node;
  json_object *arr = json_object_new_array();
  pthread_mutex_lock(&n->ledger_mu);
  td_ledger_rounds(n->ledger, n->r.run_id, c->last, round_to_json, arr);
  pthread_mutex_unlock(&n->ledger_mu);
  c->work_json = strdup(json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PLAIN));
  json_object_put(arr);
}

static void rounds_done(uv_work_t *req, int status) {
  control_conn_t *c = req->data;
  (void)status;
  if (c->work_json == NULL)
    respond(c, TD_ENOMEM, "out of memory", NULL);
  else
    respond(c, 0, NULL, c->work_json);
}

static void cmd_rounds(control_conn_t *c, unsigned last) {
  node_t *n = c->node;
  if (n->r.run_id == 0) {
    respond(c, 0, NULL, "[]");
    return;
  }
  ledger_flush(n); /* the query is queued behind the pending writes */
  c->last = last;
  c->work.data = c;
  if (uv_queue_work(&n->loop, &c->work, rounds_work, rounds_done) != 0)
    respond(c, TD_EIO, "cannot query the ledger", NULL);
}

static void node_shutdown(node_t *n, const char *why);

static void handle_request(control_conn_t *c, const uint8_t *frame, size_t len) {
  Traind__ControlRequest *req = NULL;
  char why[256];
  if (td_wire_unpack_request(&req, frame, len, why, sizeof why) != 0) {
    respond(c, TD_EPROTO, why, NULL);
    return;
  }
  switch (req->command) {
  case TRAIND__CONTROL_REQUEST__COMMAND__STATUS: respond_json(c, status_json(c->node)); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__JOIN: cmd_join(c, req->endpoint); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__START: cmd_start(c, req); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__STOP: cmd_stop(c); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__PEERS: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "node_id", json_id(c->node->node_id));
    json_object_object_add(o, "endpoint", json_object_new_string(c->node->endpoint));
    json_object_object_add(o, "peers", peers_json(c->node));
    respond_json(c, o);
    break;
  }
  case TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS: cmd_rounds(c, req->last); break;
  case TRAIND__CONTROL_REQUEST__COMMAND__LEAVE: {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "left", json_id(c->node->node_id));
    respond_json(c, o);
    node_shutdown(c->node, "trainctl leave");
    break;
  }
  default: respond(c, TD_EINVAL, "unknown command", NULL); break;
  }
  td_wire_free_request(&req);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  control_conn_t *c = h->data;
  (void)suggested;
  if (c->cap - c->len < 4096) {
    size_t cap = c->cap ? c->cap * 2 : 8192;
    uint8_t *nb = cap <= TD_WIRE_MAX_CONTROL + 8 ? realloc(c->buf, cap) : NULL;
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
  control_conn_t *c = s->data;
  (void)buf;
  if (nread < 0) {
    if (c->node->pending_join == c)
      c->node->pending_join = NULL;
    if (!c->responded)
      conn_close(c);
    return;
  }
  c->len += (size_t)nread;
  if (c->len < 4 || c->responded)
    return;
  size_t frame = ((size_t)c->buf[0] << 24) | ((size_t)c->buf[1] << 16) |
                 ((size_t)c->buf[2] << 8) | c->buf[3];
  if (frame > TD_WIRE_MAX_CONTROL) {
    respond(c, TD_EPROTO, "control request too large", NULL);
    return;
  }
  if (c->len < frame + 4)
    return;
  uv_read_stop(s);
  handle_request(c, c->buf + 4, frame);
}

static void on_control_connection(uv_stream_t *server, int status) {
  node_t *n = server->data;
  if (status < 0 || n->shutting_down)
    return;
  control_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return;
  c->node = n;
  uv_pipe_init(&n->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 ||
      uv_read_start((uv_stream_t *)&c->pipe, conn_alloc, conn_read) != 0)
    conn_close(c);
}

/* ---- start-up and shutdown -------------------------------------------------------- */

void td_node_default_data_dir(char *buf, size_t len) {
  const char *env = getenv("TRAIND_DATA_DIR");
  const char *home = getenv("HOME");
  if (env != NULL && env[0] != '\0')
    snprintf(buf, len, "%s", env);
  else
    snprintf(buf, len, "%s/.local/share/traind", home && home[0] ? home : ".");
}

static int mkdir_p(const char *path) {
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return -1;
      *p = '/';
    }
  return mkdir(tmp, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* The node id survives restarts: a restarted node is the same member. */
static int load_node_id(node_t *n, char *why, size_t why_len) {
  char path[600];
  snprintf(path, sizeof path, "%s/node_id", n->data_dir);
  FILE *f = fopen(path, "r");
  if (f != NULL) {
    char line[64] = "";
    char *end;
    if (fgets(line, sizeof line, f) != NULL) {
      n->node_id = strtoull(line, &end, 16);
      if (end == line || (*end != '\n' && *end != '\0'))
        n->node_id = 0;
    }
    fclose(f);
    if (n->node_id != 0)
      return 0;
    td_log_warn("%s is unreadable; making a new node id", path);
  }
  int fd = open("/dev/urandom", O_RDONLY);
  if (fd < 0 || read(fd, &n->node_id, sizeof n->node_id) != (ssize_t)sizeof n->node_id) {
    if (fd >= 0)
      close(fd);
    return td_why(why, why_len, TD_EIO, "cannot read /dev/urandom");
  }
  close(fd);
  if (n->node_id == 0)
    n->node_id = 1;
  f = fopen(path, "w");
  if (f == NULL)
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(errno));
  fprintf(f, "%016" PRIx64 "\n", n->node_id);
  fclose(f);
  return 0;
}

/* tcp://HOST:0 binds an ephemeral port; the real endpoint is read back. */
static int bind_router(node_t *n, const char *listen, char *why, size_t why_len) {
  char ep[TD_ENDPOINT_MAX];
  size_t len = strlen(listen);
  if (strncmp(listen, "tcp://", 6) != 0 || len >= sizeof ep - 1 || strrchr(listen, ':') == listen + 3)
    return td_why(why, why_len, TD_ECONFIG, "--listen: expected tcp://HOST:PORT, got '%s'", listen);
  snprintf(ep, sizeof ep, "%s", listen);
  if (len >= 2 && strcmp(ep + len - 2, ":0") == 0)
    strcpy(ep + len - 1, "*");
  n->router = zmq_socket(n->zctx, ZMQ_ROUTER);
  int64_t maxmsg = ZMQ_HARD_MAX_MSG;
  int hwm = 20000, linger = 0;
  zmq_setsockopt(n->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  zmq_setsockopt(n->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(n->router, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(n->router, ep) != 0)
    return td_why(why, why_len, TD_EIO, "cannot listen on %s: %s", listen,
                  zmq_strerror(zmq_errno()));
  size_t sz = sizeof n->endpoint;
  zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, n->endpoint, &sz);
  /* a wildcard address is no use to peers: advertise loopback instead */
  if (strncmp(n->endpoint, "tcp://0.0.0.0:", 14) == 0) {
    char port[16];
    snprintf(port, sizeof port, "%s", n->endpoint + 14);
    snprintf(n->endpoint, sizeof n->endpoint, "tcp://127.0.0.1:%s", port);
  }
  if (zmq_socket_monitor(n->router, "inproc://traind-router-monitor",
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
    n->monitor = zmq_socket(n->zctx, ZMQ_PAIR);
    if (zmq_connect(n->monitor, "inproc://traind-router-monitor") != 0) {
      zmq_close(n->monitor);
      n->monitor = NULL;
    }
  }
  return 0;
}

static int open_control(node_t *n, char *why, size_t why_len) {
  struct sockaddr_un_probe { char path[108]; };
  if (strlen(n->control_path) >= sizeof(struct sockaddr_un_probe))
    return td_why(why, why_len, TD_ECONFIG, "--control path is longer than 107 bytes: %s",
                  n->control_path);
  uv_pipe_init(&n->loop, &n->control, 0);
  n->control.data = n;
  unlink(n->control_path); /* a stale socket from a crashed daemon */
  mode_t old = umask(0177); /* the socket is created 0600 */
  int rc = uv_pipe_bind(&n->control, n->control_path);
  umask(old);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&n->control, 16, on_control_connection);
  if (rc != 0)
    return td_why(why, why_len, TD_EIO, "cannot listen on %s: %s", n->control_path,
                  uv_strerror(rc));
  chmod(n->control_path, 0600);
  return 0;
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static void node_shutdown(node_t *n, const char *why) {
  if (n->shutting_down)
    return;
  n->shutting_down = true;
  td_log_info("shutting down: %s", why);
  Traind__Leave leave = TRAIND__LEAVE__INIT;
  leave.reason = (char *)why;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_LEAVE;
  env.leave = &leave;
  broadcast(n, &env);
  if (n->r.run != NULL) {
    n->r.state = "stopped";
    ledger_op_t *op = op_new(n, OP_RUN_END);
    if (op) {
      op->run_id = n->r.run_id;
      snprintf(op->text, sizeof op->text, "stopped");
      op->value = n->r.last_eval_acc;
    }
    td_run_close(&n->r.run);
  }
  ledger_event(n, "shutdown", "%s", why);
  uv_timer_stop(&n->heartbeat_timer);
  uv_close((uv_handle_t *)&n->heartbeat_timer, NULL);
  uv_close((uv_handle_t *)&n->router_poll, NULL);
  if (n->monitor)
    uv_close((uv_handle_t *)&n->monitor_poll, NULL);
  uv_close((uv_handle_t *)&n->control, NULL);
  uv_close((uv_handle_t *)&n->sigint, NULL);
  uv_close((uv_handle_t *)&n->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
  node_shutdown(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void greet_known_peer(uint64_t node_id, const char *endpoint, const char *state,
                             void *user) {
  node_t *n = user;
  if (node_id == n->node_id || endpoint == NULL || strcmp(state ? state : "", "left") == 0)
    return;
  link_t *l = link_ensure(n, node_id, endpoint);
  if (l != NULL) {
    td_log_info("saying hello to known peer %016" PRIx64 " at %s", node_id, endpoint);
    send_hello(n, l);
  }
}

int td_node_main(const td_node_opts_t *opts, char *why, size_t why_len) {
  node_t *n = calloc(1, sizeof *n);
  if (n == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = 0;
  pthread_mutex_init(&n->ledger_mu, NULL);
  n->r.state = "idle";
  n->r.test_accuracy = n->r.last_eval_acc = n->r.test_loss = NAN;
  n->threads = opts->threads;
  n->heartbeat_s = (opts->heartbeat_ms ? opts->heartbeat_ms : 500) / 1000.0;
  n->link_delay_s = opts->link_delay_ms / 1000.0;
  if (opts->data_dir != NULL)
    snprintf(n->data_dir, sizeof n->data_dir, "%s", opts->data_dir);
  else
    td_node_default_data_dir(n->data_dir, sizeof n->data_dir);
  if (opts->control_path != NULL)
    snprintf(n->control_path, sizeof n->control_path, "%s", opts->control_path);
  else
    snprintf(n->control_path, sizeof n->control_path, "%s/control.sock", n->data_dir);
  if (mkdir_p(n->data_dir) != 0) {
    rc = td_why(why, why_len, TD_EIO, "cannot create data directory %s: %s", n->data_dir,
                strerror(errno));
    goto out;
  }
  if ((rc = load_node_id(n, why, why_len)) != 0)
    goto out;
  char dbpath[600];
  snprintf(dbpath, sizeof dbpath, "%s/traind.db", n->data_dir);
  if ((rc = td_ledger_open(&n->ledger, dbpath, why, why_len)) != 0)
    goto out;
  uv_loop_init(&n->loop);
  n->zctx = zmq_ctx_new();
  if ((rc = bind_router(n, opts->listen ? opts->listen : "tcp://127.0.0.1:7070", why, why_len)) != 0)
    goto out_loop;
  if ((rc = td_members_open(&n->members, n->node_id, n->endpoint, 3 * n->heartbeat_s,
                            6 * n->heartbeat_s)) != 0)
    goto out_loop;
  if ((rc = open_control(n, why, why_len)) != 0)
    goto out_loop;

  int fd;
  size_t sz = sizeof fd;
  zmq_getsockopt(n->router, ZMQ_FD, &fd, &sz);
  uv_poll_init(&n->loop, &n->router_poll, fd);
  n->router_poll.data = n;
  uv_poll_start(&n->router_poll, UV_READABLE, on_router_readable);
  if (n->monitor) {
    sz = sizeof fd;
    zmq_getsockopt(n->monitor, ZMQ_FD, &fd, &sz);
    uv_poll_init(&n->loop, &n->monitor_poll, fd);
    n->monitor_poll.data = n;
    uv_poll_start(&n->monitor_poll, UV_READABLE, on_monitor_readable);
  }
  uv_timer_init(&n->loop, &n->heartbeat_timer);
  n->heartbeat_timer.data = n;
  uv_timer_init(&n->loop, &n->pump_timer);
  n->pump_timer.data = n;
  uint64_t hb_ms = (uint64_t)(n->heartbeat_s * 1000);
  uv_timer_start(&n->heartbeat_timer, on_heartbeat, hb_ms, hb_ms);
  uv_signal_init(&n->loop, &n->sigint);
  uv_signal_init(&n->loop, &n->sigterm);
  n->sigint.data = n->sigterm.data = n;
  uv_signal_start(&n->sigint, on_signal, SIGINT);
  uv_signal_start(&n->sigterm, on_signal, SIGTERM);

  char tag[64];
  snprintf(tag, sizeof tag, "traind[%.6" PRIx64 "]", n->node_id >> 40);
  td_log_set_tag(tag);
  {
    char path[600];
    snprintf(path, sizeof path, "%s/endpoint", n->data_dir);
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "%s\n", n->endpoint);
      fclose(f);
    }
  }
  td_log_info("node %016" PRIx64 " listening on %s, control socket %s, data in %s", n->node_id,
              n->endpoint, n->control_path, n->data_dir);
  ledger_event(n, "start", "node %016" PRIx64 " at %s", n->node_id, n->endpoint);

  /* A restarted node says hello to the peers it knew: that is how it rejoins. */
  pthread_mutex_lock(&n->ledger_mu);
  td_ledger_peers(n->ledger, greet_known_peer, n);
  pthread_mutex_unlock(&n->ledger_mu);
  ledger_flush(n);
  uv_run(&n->loop, UV_RUN_DEFAULT);

  /* Everything is closed; write what is left on this thread. */
  if (n->ops_head != NULL) {
    write_ops(n, n->ops_head);
    free_ops(n->ops_head);
    n->ops_head = n->ops_tail = NULL;
  }
  unlink(n->control_path);
  td_log_info("stopped cleanly");
out_loop:
  uv_walk(&n->loop, close_walk, NULL);
  uv_run(&n->loop, UV_RUN_DEFAULT);
  uv_loop_close(&n->loop);
  for (size_t i = 0; i < n->n_links; i++) {
    zmq_close(n->links[i].sock);
    zmq_close(n->links[i].ctl_sock);
    td_linkq_close(&n->links[i].q);
  }
  if (n->monitor)
    zmq_close(n->monitor);
  if (n->router)
    zmq_close(n->router);
  if (n->zctx)
    zmq_ctx_term(n->zctx);
out:
  close_link_codecs(n);
  td_round_close(&n->r.collector);
  td_members_close(&n->members);
  td_ledger_close(&n->ledger);
  free(n->r.spec_text);
  pthread_mutex_destroy(&n->ledger_mu);
  free(n);
  return rc;
}
