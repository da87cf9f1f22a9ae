/* ledgerq.c: the daemon's ledger write queue, and its read queries.
 *
 * Threads: records are queued on the loop thread by one typed call per row
 * kind; ledger_flush() hands the queue to the libuv work pool, which writes
 * it in one transaction, one batch at a time, in order. A rounds query is
 * queued the same way, after the writes before it, and hands its answer back
 * to the loop thread as JSON. The SQLite handle is used under `mu` only, so
 * a query and a batch never share it at once; a work callback touches only
 * the records and arguments it was handed. */
#include "daemon/internal.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/log.h"

typedef enum { OP_RUN_START, OP_RUN_END, OP_PEER, OP_ROUND, OP_UPDATE, OP_EVENT, OP_CKPT, OP_LINK } op_kind_t;

/* One queued row: `kind` says which member of the union holds it. */
typedef struct ledger_op {
  struct ledger_op *next;
  op_kind_t kind;
  double at;
  char *text; /* spec, endpoint, event detail: owned */
  char name[64]; /* state, codec, event kind */
  union {
    struct { uint64_t run_id; double value; } run;
    struct { uint64_t id; double capacity; } peer;
    td_ledger_round_t round;
    td_ledger_update_t update;
    td_ledger_link_t link;
    struct { uint64_t run_id, round; void *blob; size_t bytes; } ckpt;
  } u;
} ledger_op_t;

struct td__ledgerq {
  uv_loop_t *loop;
  td_ledger_t *ledger;
  pthread_mutex_t mu;
  ledger_op_t *head, *tail;
  ledger_op_t *flushing;
  bool in_flight, stopped;
  uv_work_t req;
};

static ledger_op_t *op_new(td__ledgerq_t *q, op_kind_t kind) {
  ledger_op_t *op = calloc(1, sizeof *op);
  if (op == NULL) {
    td_log_error("out of memory: a ledger record is lost");
    return NULL;
  }
  op->kind = kind;
  op->at = td_clock_wall_s();
  if (q->tail)
    q->tail->next = op;
  else
    q->head = op;
  q->tail = op;
  return op;
}

static void apply_op(td_ledger_t *l, ledger_op_t *op) {
  int rc = 0;
  const char *text = op->text ? op->text : "";
  switch (op->kind) {
  case OP_RUN_START: rc = td_ledger_run_start(l, op->u.run.run_id, text, op->at); break;
  case OP_RUN_END:
    rc = td_ledger_run_end(l, op->u.run.run_id, op->name, op->at, op->u.run.value);
    break;
  case OP_PEER:
    rc = td_ledger_peer_seen(l, op->u.peer.id, text, op->at, op->name, op->u.peer.capacity);
    break;
  case OP_ROUND: rc = td_ledger_round_add(l, &op->u.round); break;
  case OP_UPDATE:
    op->u.update.codec = op->name[0] ? op->name : "none";
    rc = td_ledger_update_add(l, &op->u.update);
    break;
  case OP_EVENT: rc = td_ledger_event_add(l, op->at, op->name, text); break;
  case OP_CKPT:
    rc = td_ledger_checkpoint_put(l, op->u.ckpt.run_id, op->u.ckpt.round, op->u.ckpt.blob,
                                  op->u.ckpt.bytes);
    break;
  case OP_LINK:
    op->u.link.codec = op->name;
    rc = td_ledger_link_add(l, &op->u.link);
    break;
  }
  if (rc != 0)
    td_log_warn("ledger write (kind %d) failed: %s", (int)op->kind, td_strerror(rc));
}

static void free_ops(ledger_op_t *op) {
  while (op != NULL) {
    ledger_op_t *next = op->next;
    free(op->text);
    if (op->kind == OP_CKPT)
      free(op->u.ckpt.blob);
    free(op);
    op = next;
  }
}

static void write_ops(td__ledgerq_t *q, ledger_op_t *ops) {
  pthread_mutex_lock(&q->mu);
  td_ledger_begin(q->ledger);
  for (ledger_op_t *op = ops; op != NULL; op = op->next)
    apply_op(q->ledger, op);
  if (td_ledger_commit(q->ledger) != 0)
    td_log_error("ledger commit failed");
  pthread_mutex_unlock(&q->mu);
}

static void flush_work(uv_work_t *req) {
  td__ledgerq_t *q = req->data;
  write_ops(q, q->flushing);
}

static void flush_done(uv_work_t *req, int status) {
  td__ledgerq_t *q = req->data;
  (void)status;
  free_ops(q->flushing);
  q->flushing = NULL;
  q->in_flight = false;
  if (q->head != NULL && !q->stopped)
    td__ledgerq_flush(q);
}

void td__ledgerq_flush(td__ledgerq_t *q) {
  if (q->in_flight || q->head == NULL || q->stopped)
    return;
  q->flushing = q->head;
  q->head = q->tail = NULL;
  q->in_flight = true;
  q->req.data = q;
  if (uv_queue_work(q->loop, &q->req, flush_work, flush_done) != 0) {
    write_ops(q, q->flushing); /* never lose records */
    free_ops(q->flushing);
    q->flushing = NULL;
    q->in_flight = false;
  }
}

void td__ledgerq_stop(td__ledgerq_t *q) { q->stopped = true; }

int td__ledgerq_open(td__ledgerq_t **out, uv_loop_t *loop, const char *path, char *why,
                     size_t why_len) {
  td__ledgerq_t *q = calloc(1, sizeof *q);
  if (q == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = td_ledger_open(&q->ledger, path, why, why_len);
  if (rc != 0) {
    free(q);
    return rc;
  }
  pthread_mutex_init(&q->mu, NULL);
  q->loop = loop;
  *out = q;
  return 0;
}

void td__ledgerq_close(td__ledgerq_t **self_p) {
  td__ledgerq_t *q = *self_p;
  if (q == NULL)
    return;
  *self_p = NULL;
  if (q->head != NULL) /* the loop has ended: write what is left here */
    write_ops(q, q->head);
  free_ops(q->head);
  td_ledger_close(&q->ledger);
  pthread_mutex_destroy(&q->mu);
  free(q);
}

void td__ledger_run_start(td__ledgerq_t *q, uint64_t run_id, const char *spec_text) {
  ledger_op_t *op = op_new(q, OP_RUN_START);
  if (op != NULL) {
    op->u.run.run_id = run_id;
    op->text = strdup(spec_text);
  }
}

void td__ledger_run_end(td__ledgerq_t *q, uint64_t run_id, const char *state,
                        double test_accuracy) {
  ledger_op_t *op = op_new(q, OP_RUN_END);
  if (op != NULL) {
    op->u.run.run_id = run_id;
    op->u.run.value = test_accuracy;
    snprintf(op->name, sizeof op->name, "%s", state);
  }
}

void td__ledger_peer(td__ledgerq_t *q, const td_member_t *m) {
  ledger_op_t *op = op_new(q, OP_PEER);
  if (op != NULL) {
    op->u.peer.id = m->node_id;
    op->u.peer.capacity = m->capacity;
    op->text = strdup(m->endpoint);
    snprintf(op->name, sizeof op->name, "%s", td_peer_state_name(m->state));
  }
}

void td__ledger_round(td__ledgerq_t *q, const td_ledger_round_t *row) {
  ledger_op_t *op = op_new(q, OP_ROUND);
  if (op != NULL)
    op->u.round = *row;
}

void td__ledger_update(td__ledgerq_t *q, const td_ledger_update_t *row, const char *codec) {
  ledger_op_t *op = op_new(q, OP_UPDATE);
  if (op != NULL) {
    op->u.update = *row;
    snprintf(op->name, sizeof op->name, "%s", codec);
  }
}

void td__ledger_link(td__ledgerq_t *q, const td_ledger_link_t *row, const char *codec) {
  ledger_op_t *op = op_new(q, OP_LINK);
  if (op != NULL) {
    op->u.link = *row;
    snprintf(op->name, sizeof op->name, "%s", codec);
  }
}

void td__ledger_checkpoint(td__ledgerq_t *q, uint64_t run_id, uint64_t round, void *blob,
                           size_t bytes) {
  ledger_op_t *op = op_new(q, OP_CKPT);
  if (op == NULL) {
    free(blob);
    return;
  }
  op->u.ckpt.run_id = run_id;
  op->u.ckpt.round = round;
  op->u.ckpt.blob = blob;
  op->u.ckpt.bytes = bytes;
}

void td__ledger_event(td__ledgerq_t *q, const char *kind, const char *fmt, ...) {
  ledger_op_t *op = op_new(q, OP_EVENT);
  if (op == NULL)
    return;
  snprintf(op->name, sizeof op->name, "%s", kind);
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  op->text = strdup(detail);
}

void td__ledger_peers(td__ledgerq_t *q, td_ledger_peer_fn fn, void *user) {
  pthread_mutex_lock(&q->mu);
  td_ledger_peers(q->ledger, fn, user);
  pthread_mutex_unlock(&q->mu);
}

int td__ledger_runs_interrupt(td__ledgerq_t *q, double at, td_ledger_run_fn fn, void *user) {
  pthread_mutex_lock(&q->mu);
  int rc = td_ledger_runs_interrupt(q->ledger, at, fn, user);
  pthread_mutex_unlock(&q->mu);
  return rc;
}

/* ---- rounds query ------------------------------------------------------------------ */

typedef struct {
  uv_work_t req;
  td__ledgerq_t *q;
  uint64_t run_id, from, limit, total; /* arguments, then the row count */
  unsigned last;
  json_object *arr;
  char *json;
  td__rounds_done_fn done;
  void *user;
} rounds_query_t;

static void round_to_json(const td_ledger_round_t *r, void *user) {
  rounds_query_t *rq = user;
  uint64_t index = rq->total++;
  if (index < rq->from || index - rq->from >= rq->limit)
    return;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__status_id(r->run_id));
  json_object_object_add(o, "round", json_object_new_int64((int64_t)r->round));
  json_object_object_add(o, "started", json_object_new_double(r->started));
  json_object_object_add(o, "ended", json_object_new_double(r->ended));
  json_object_object_add(o, "local_steps", json_object_new_int64(r->local_steps));
  json_object_object_add(o, "batch", json_object_new_int64(r->batch));
  json_object_object_add(o, "samples", json_object_new_int64((int64_t)r->samples));
  json_object_object_add(o, "loss", td__status_real(r->loss));
  json_object_object_add(o, "eval_acc", td__status_real(r->eval_acc));
  json_object_object_add(o, "eval_bpb", td__status_real(r->eval_bpb));
  json_object_object_add(o, "bytes_sent", json_object_new_int64((int64_t)r->bytes_sent));
  json_object_object_add(o, "bytes_recv", json_object_new_int64((int64_t)r->bytes_recv));
  json_object_object_add(o, "compute_s", td__status_real(r->compute_s));
  json_object_object_add(o, "wait_s", td__status_real(r->wait_s));
  json_object_array_add(rq->arr, o);
}

/* Work pool: only the query's own arguments and the ledger (under mu). */
static void rounds_work(uv_work_t *req) {
  rounds_query_t *rq = req->data;
  rq->arr = json_object_new_array();
  pthread_mutex_lock(&rq->q->mu);
  td_ledger_rounds(rq->q->ledger, rq->run_id, rq->last, round_to_json, rq);
  pthread_mutex_unlock(&rq->q->mu);
  rq->json = strdup(json_object_to_json_string_ext(rq->arr, JSON_C_TO_STRING_PLAIN));
  json_object_put(rq->arr);
}

static void rounds_done(uv_work_t *req, int status) {
  rounds_query_t *rq = req->data;
  (void)status;
  rq->done(rq->json, rq->total, rq->user);
  free(rq);
}

int td__ledger_rounds_query(td__ledgerq_t *q, uint64_t run_id, unsigned last, uint64_t from,
                            uint64_t limit, td__rounds_done_fn done, void *user) {
  rounds_query_t *rq = calloc(1, sizeof *rq);
  if (rq == NULL)
    return TD_ENOMEM;
  *rq = (rounds_query_t){.q = q, .run_id = run_id, .last = last, .from = from,
                         .limit = limit, .done = done, .user = user};
  td__ledgerq_flush(q); /* the query runs behind the pending writes */
  rq->req.data = rq;
  if (uv_queue_work(q->loop, &rq->req, rounds_work, rounds_done) != 0) {
    free(rq);
    return TD_EIO;
  }
  return 0;
}
