/* ledgerq.c: the daemon's ledger write queue, and its read queries.
 *
 * Threads: records are queued on the loop thread by one typed call per row
 * kind; ledger_flush() hands the queue to the libuv work pool, which writes
 * it in one transaction, one batch at a time, in order. A rounds query is
 * queued the same way, after the writes before it, and hands its answer back
 * to the loop thread as JSON. The SQLite handle is used under `mu` only, so
 * a query and a batch never share it at once; a work callback touches only
 * the records and arguments it was handed, and the batch's outcome fields,
 * which the loop thread reads only once the batch is done.
 *
 * Faults: a batch is written whole or not at all. When the storage fails
 * (disk full, I/O error, read-only, locked, corrupt) the transaction is
 * rolled back and the batch goes back to the front of the queue: the ledger
 * is "degraded", the cause is logged once per cause and episode (with the
 * counts when the episode ends) and shown in status, and the queue is tried
 * again with a backoff of 0.5 s doubling to 5 s, on the heartbeat's flush.
 * While degraded the rows kept in memory are bounded (TD__LEDGERQ_BUFFER_BYTES):
 * over the bound the oldest queued checkpoint goes first (a later one
 * supersedes it), then the oldest queued row of any other kind; run start and
 * end rows are never dropped. Every drop is counted by kind and logged. A row
 * SQLite refuses for itself (a constraint) is left out, counted and logged,
 * and the rest of its batch is written. When a batch succeeds again the
 * episode is logged and recorded as a `ledger_degraded` event. The reads
 * (start-up visits, the rounds query) are ledgerq_read.c's. */
#include "daemon/store/ledgerq.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"

typedef enum {
  OP_RUN_START, OP_RUN_END, OP_PEER, OP_ROUND, OP_UPDATE, OP_EVENT, OP_CKPT, OP_LINK, OP_EVAL, OP_MODEL,
  OP_CLIENT_LABELS, OP_CLIENT_EVAL,
  OP_KINDS_ /* the number of kinds: keep it last */
} op_kind_t;

static const char *const op_names[OP_KINDS_] = {
    [OP_RUN_START] = "run start", [OP_RUN_END] = "run end", [OP_PEER] = "peer",
    [OP_ROUND] = "round", [OP_UPDATE] = "update", [OP_EVENT] = "event",
    [OP_CKPT] = "checkpoint", [OP_LINK] = "link", [OP_EVAL] = "evaluation",
    [OP_MODEL] = "model", [OP_CLIENT_LABELS] = "client labels",
    [OP_CLIENT_EVAL] = "client evaluation"};

static const char *op_name(op_kind_t kind) { return op_names[kind] ? op_names[kind] : "other"; }

/* One queued row: `kind` says which member of the union holds it. */
typedef struct ledger_op {
  struct ledger_op *next;
  op_kind_t kind;
  size_t bytes;  /* its share of pending_bytes; 0 until counted */
  bool refused;  /* SQLite refused the row itself (set by the batch's writer) */
  double at;
  char *text; /* spec, endpoint, event detail: owned */
  char name[64]; /* state, codec, event kind */
  union {
    struct { uint64_t run_id; double value; } run;
    struct { uint64_t id; double capacity; } peer;
    td_ledger_round_t round;
    td_ledger_update_t update;
    td_ledger_link_t link;
    struct { uint64_t run_id, round; void *blob; size_t bytes; unsigned keep; } ckpt;
    struct { uint64_t run_id, round; void *blob; size_t bytes; double metric; char *model; } model;
    struct { uint64_t run_id; unsigned node, client, labels; uint64_t *rows; } labels;
    td_ledger_client_eval_t client_eval;
  } u;
} ledger_op_t;

#define MAX_CAUSES 6
#define RETRY_FIRST_S 0.5
#define RETRY_MAX_S 5.0

struct td__ledgerq {
  uv_loop_t *loop;
  td_ledger_t *ledger;
  char path[600];
  pthread_mutex_t mu;
  ledger_op_t *head, *tail;
  ledger_op_t *flushing;
  bool in_flight, stopped;
  uv_work_t req;
  /* the batch's outcome: written by its writer, read after it is done */
  bool batch_failed;
  td_ledger_fault_t batch_fault, refused_fault;
  /* loop thread only */
  size_t buffer_bytes;                 /* the bound while degraded */
  uint64_t pending_rows, pending_bytes; /* queued + in flight */
  uint64_t queued_ckpts;               /* checkpoints in head..tail */
  bool degraded;
  td_ledger_fault_t fault; /* the cause of the last failure */
  double degraded_since;   /* wall clock */
  double retry_at, backoff_s; /* monotonic */
  uint64_t episode_failures;
  struct { int code; const char *cause; uint64_t n; } causes[MAX_CAUSES];
  uint64_t failures_total, episodes, dropped_total, refused_total;
  uint64_t dropped[OP_KINDS_], episode_dropped;
  int refused_codes[MAX_CAUSES];
  /* every run id this node has recorded, with its spec's hash and whether it
   * ended (loop thread; loaded at open): a run id names one spec forever */
  struct seen_run { uint64_t run_id, spec_hash; bool ended; } *seen;
  size_t n_seen, cap_seen;
  uint64_t unwritten_ckpts; /* checkpoints queued or being written (loop thread) */
  void (*on_batch)(void *user); /* after every batch, written or not (loop thread) */
  void *on_batch_user;
};

/* FNV-1a, 64 bits, over a spec's text: two specs with one hash are taken
 * for the same spec (the odds are 2^-64 per pair). */
static uint64_t spec_hash(const char *text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

static bool state_is_final(const char *state) {
  return state != NULL && strcmp(state, "running") != 0 && strcmp(state, "interrupted") != 0;
}

static struct seen_run *seen_find(td__ledgerq_t *q, uint64_t run_id) {
  for (size_t i = q->n_seen; i-- > 0;) /* the newest are asked about most */
    if (q->seen[i].run_id == run_id)
      return &q->seen[i];
  return NULL;
}

static struct seen_run *seen_add(td__ledgerq_t *q, uint64_t run_id, const char *spec) {
  if (q->n_seen == q->cap_seen) {
    size_t cap = q->cap_seen ? q->cap_seen * 2 : 64;
    struct seen_run *grown = realloc(q->seen, cap * sizeof *grown);
    if (grown == NULL)
      return NULL;
    q->seen = grown;
    q->cap_seen = cap;
  }
  struct seen_run *r = &q->seen[q->n_seen++];
  *r = (struct seen_run){.run_id = run_id, .spec_hash = spec_hash(spec ? spec : "")};
  return r;
}

static void seen_load(uint64_t run_id, const char *spec, const char *state, void *user) {
  struct seen_run *r = seen_add(user, run_id, spec);
  if (r != NULL)
    r->ended = state_is_final(state);
}

static size_t op_bytes(const ledger_op_t *op) {
  size_t n = sizeof *op + (op->text ? strlen(op->text) + 1 : 0);
  if (op->kind == OP_MODEL)
    return n + op->u.model.bytes + strlen(op->u.model.model) + 1;
  if (op->kind == OP_CLIENT_LABELS)
    return n + op->u.labels.labels * sizeof *op->u.labels.rows;
  return op->kind == OP_CKPT ? n + op->u.ckpt.bytes : n;
}

static void free_op(ledger_op_t *op) {
  free(op->text);
  if (op->kind == OP_CKPT)
    free(op->u.ckpt.blob);
  if (op->kind == OP_MODEL) {
    free(op->u.model.blob);
    free(op->u.model.model);
  }
  if (op->kind == OP_CLIENT_LABELS)
    free(op->u.labels.rows);
  free(op);
}

static void free_ops(ledger_op_t *op) {
  while (op != NULL) {
    ledger_op_t *next = op->next;
    free_op(op);
    op = next;
  }
}

static void uncount(td__ledgerq_t *q, ledger_op_t *op) {
  if (op->bytes == 0)
    return;
  q->pending_rows--;
  q->pending_bytes -= op->bytes;
  op->bytes = 0;
}

/* Unlink `op` (after `prev`, NULL: the head) from the queue, count and log the drop. */
static void drop_queued(td__ledgerq_t *q, ledger_op_t *prev, ledger_op_t *op) {
  if (prev != NULL)
    prev->next = op->next;
  else
    q->head = op->next;
  if (q->tail == op)
    q->tail = prev;
  if (op->kind == OP_CKPT) {
    q->queued_ckpts--;
    q->unwritten_ckpts--;
  }
  uncount(q, op);
  if (q->episode_dropped++ == 0)
    td_log_error("ledger %s: more than %g MiB of rows kept in memory while it cannot be "
                 "written: dropping the oldest (checkpoints first; run start and end rows are "
                 "kept), first a %s row; the drops are counted in status",
                 q->path, (double)q->buffer_bytes / 1048576, op_name(op->kind));
  q->dropped[op->kind]++;
  q->dropped_total++;
  free_op(op);
}

/* While degraded: drop the oldest droppable rows until the bound holds. */
static void trim(td__ledgerq_t *q) {
  while (q->degraded && q->pending_bytes > q->buffer_bytes) {
    ledger_op_t *prev = NULL, *op = q->head;
    for (; op != NULL; prev = op, op = op->next) {
      if (q->queued_ckpts > 0 ? op->kind == OP_CKPT
                              : op->kind != OP_RUN_START && op->kind != OP_RUN_END)
        break;
    }
    if (op == NULL)
      return; /* only run start and end rows are left to drop: keep them */
    drop_queued(q, prev, op);
  }
}

/* Count the newest row (complete once its typed call returned) and hold the bound. */
static void settle(td__ledgerq_t *q) {
  ledger_op_t *op = q->tail;
  if (op == NULL || op->bytes != 0)
    return;
  op->bytes = op_bytes(op);
  q->pending_rows++;
  q->pending_bytes += op->bytes;
  if (op->kind == OP_CKPT)
    q->queued_ckpts++;
  trim(q);
}

static ledger_op_t *op_new(td__ledgerq_t *q, op_kind_t kind) {
  settle(q);
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

static int apply_op(td_ledger_t *l, ledger_op_t *op) {
  const char *text = op->text ? op->text : "";
  switch (op->kind) {
  case OP_RUN_START: return td_ledger_run_start(l, op->u.run.run_id, text, op->at);
  case OP_RUN_END: {
    int rc = td_ledger_run_untrained(l, op->u.run.run_id, op->text);
    return rc != 0 ? rc : td_ledger_run_end(l, op->u.run.run_id, op->name, op->at,
                                            op->u.run.value);
  }
  case OP_PEER:
    return td_ledger_peer_seen(l, op->u.peer.id, text, op->at, op->name, op->u.peer.capacity);
  case OP_ROUND:
    op->u.round.members = op->text;
    return td_ledger_round_add(l, &op->u.round);
  case OP_EVAL:
    return td_ledger_round_eval(l, op->u.round.run_id, op->u.round.round, op->u.round.eval_acc,
                                op->u.round.eval_bpb);
  case OP_UPDATE:
    op->u.update.codec = op->name[0] ? op->name : "none";
    return td_ledger_update_add(l, &op->u.update);
  case OP_EVENT: return td_ledger_event_add(l, op->at, op->name, text);
  case OP_CKPT:
    return td_ledger_checkpoint_put(l, op->u.ckpt.run_id, op->u.ckpt.round, op->u.ckpt.blob,
                                    op->u.ckpt.bytes, op->u.ckpt.keep);
  case OP_MODEL: {
    td_ledger_model_t m = {.run_id = op->u.model.run_id, .round = op->u.model.round,
                           .state = op->name, .metric = op->u.model.metric,
                           .model = op->u.model.model, .tensors = text,
                           .blob = op->u.model.blob, .bytes = op->u.model.bytes};
    return td_ledger_model_put(l, &m);
  }
  case OP_LINK:
    op->u.link.codec = op->name;
    return td_ledger_link_add(l, &op->u.link);
  case OP_CLIENT_LABELS:
    return td_ledger_client_labels(l, op->u.labels.run_id, op->u.labels.node,
                                   op->u.labels.client, op->u.labels.rows, op->u.labels.labels);
  case OP_CLIENT_EVAL: return td_ledger_client_eval(l, &op->u.client_eval);
  case OP_KINDS_: break;
  }
  return TD_EINVAL;
}

/* Write a batch in one transaction (any thread, under mu). A row SQLite
 * refuses for itself is marked and skipped; any other failure rolls the
 * whole batch back (batch_failed) so it can be tried again as it is. */
static void write_ops(td__ledgerq_t *q, ledger_op_t *ops) {
  pthread_mutex_lock(&q->mu);
  q->batch_failed = false;
  q->refused_fault.code = 0;
  int rc = td_ledger_begin(q->ledger);
  for (ledger_op_t *op = ops; op != NULL && rc == 0; op = op->next) {
    op->refused = false;
    int r = apply_op(q->ledger, op);
    td_ledger_fault_t f;
    td_ledger_fault(q->ledger, &f);
    if (r != 0 && td_ledger_fault_is_row(f.code)) {
      op->refused = true;
      q->refused_fault = f;
    } else {
      rc = r;
    }
  }
  if (rc == 0)
    rc = td_ledger_commit(q->ledger);
  if (rc != 0) {
    td_ledger_fault(q->ledger, &q->batch_fault);
    if (q->batch_fault.code == 0)
      q->batch_fault = (td_ledger_fault_t){.cause = "error"};
    td_ledger_rollback(q->ledger);
    q->batch_failed = true;
  }
  pthread_mutex_unlock(&q->mu);
}

static void flush_work(uv_work_t *req) {
  td__ledgerq_t *q = req->data;
  write_ops(q, q->flushing);
}

static uint64_t *cause_count(td__ledgerq_t *q, const td_ledger_fault_t *f, bool *first) {
  *first = false;
  for (int i = 0; i < MAX_CAUSES; i++) {
    if (q->causes[i].n > 0 && q->causes[i].code == f->code)
      return &q->causes[i].n;
    if (q->causes[i].n == 0) {
      *first = true;
      q->causes[i].code = f->code;
      q->causes[i].cause = f->cause;
      return &q->causes[i].n;
    }
  }
  return &q->causes[MAX_CAUSES - 1].n; /* more causes than slots: counted with the last */
}

/* The batch could not be written: back to the front of the queue, in order. */
static void batch_failed(td__ledgerq_t *q, ledger_op_t *batch) {
  ledger_op_t *last = batch;
  for (ledger_op_t *op = batch; op != NULL; op = op->next) {
    q->queued_ckpts += op->kind == OP_CKPT;
    last = op;
  }
  last->next = q->head;
  q->head = batch;
  if (q->tail == NULL)
    q->tail = last;
  double now = td_clock_mono_s();
  if (!q->degraded) {
    q->degraded = true;
    q->episodes++;
    q->degraded_since = td_clock_wall_s();
    q->episode_failures = q->episode_dropped = 0;
    memset(q->causes, 0, sizeof q->causes);
    q->backoff_s = RETRY_FIRST_S;
  }
  q->fault = q->batch_fault;
  q->failures_total++;
  q->episode_failures++;
  bool first;
  (*cause_count(q, &q->fault, &first))++;
  if (first)
    td_log_error("ledger %s degraded: %s (%s); %" PRIu64 " rows kept in memory (at most %g MiB)"
                 " and written when it works again; trying every %.0f s at most",
                 q->path, q->fault.cause, q->fault.detail, q->pending_rows,
                 (double)q->buffer_bytes / 1048576, RETRY_MAX_S);
  q->retry_at = now + q->backoff_s;
  q->backoff_s = q->backoff_s * 2 < RETRY_MAX_S ? q->backoff_s * 2 : RETRY_MAX_S;
  trim(q);
}

/* "disk full: 37, I/O error: 2" */
static void causes_text(const td__ledgerq_t *q, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < MAX_CAUSES && q->causes[i].n > 0 && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%s: %" PRIu64, i ? ", " : "",
                           q->causes[i].cause, q->causes[i].n);
}

/* The end of a degraded episode, in the log (and, when the ledger can take
 * it, as an event): its causes with their counts and what was kept or lost. */
static void episode_summary(td__ledgerq_t *q, uint64_t written, char *detail, size_t len) {
  char causes[256];
  causes_text(q, causes, sizeof causes);
  snprintf(detail, len,
           "%.1f s from %.3f, %" PRIu64 " failed writes (%s); %" PRIu64
           " rows kept in memory were written, %" PRIu64 " dropped",
           td_clock_wall_s() - q->degraded_since, q->degraded_since, q->episode_failures,
           causes, written, q->episode_dropped);
}

/* The batch is in the ledger: count its refused rows, end a degraded episode. */
static void batch_written(td__ledgerq_t *q, ledger_op_t *batch, bool queue_event) {
  uint64_t written = 0;
  for (ledger_op_t *op = batch; op != NULL; op = op->next) {
    uncount(q, op);
    q->unwritten_ckpts -= op->kind == OP_CKPT;
    if (!op->refused) {
      written++;
      continue;
    }
    q->refused_total++;
    int i = 0;
    while (i < MAX_CAUSES - 1 && q->refused_codes[i] != 0 &&
           q->refused_codes[i] != q->refused_fault.code)
      i++;
    if (q->refused_codes[i] == 0) { /* once per cause; the count is in status */
      q->refused_codes[i] = q->refused_fault.code;
      td_log_error("ledger %s refused a %s row and left it out: %s", q->path,
                   op_name(op->kind), q->refused_fault.detail);
    }
  }
  free_ops(batch);
  if (!q->degraded)
    return;
  char detail[512];
  episode_summary(q, written, detail, sizeof detail);
  td_log_warn("ledger %s works again after being degraded %s", q->path, detail);
  q->degraded = false;
  q->fault = (td_ledger_fault_t){.cause = "none"};
  if (queue_event)
    td__ledger_event(q, "ledger_degraded", "%s", detail);
}

static void flush_done(uv_work_t *req, int status) {
  td__ledgerq_t *q = req->data;
  (void)status;
  ledger_op_t *batch = q->flushing;
  q->flushing = NULL;
  q->in_flight = false;
  if (q->batch_failed)
    batch_failed(q, batch);
  else
    batch_written(q, batch, true);
  if (q->head != NULL && !q->stopped)
    td__ledgerq_flush(q);
  if (q->on_batch != NULL)
    q->on_batch(q->on_batch_user);
}

void td__ledgerq_on_batch(td__ledgerq_t *q, void (*fn)(void *user), void *user) {
  q->on_batch = fn;
  q->on_batch_user = user;
}

bool td__ledgerq_checkpoints_settled(const td__ledgerq_t *q) {
  return q->unwritten_ckpts == 0 || q->degraded;
}

void td__ledgerq_flush(td__ledgerq_t *q) {
  settle(q);
  if (q->in_flight || q->head == NULL || q->stopped)
    return;
  if (q->degraded && td_clock_mono_s() < q->retry_at)
    return; /* the heartbeat's flush tries again once the backoff is over */
  q->flushing = q->head;
  q->head = q->tail = NULL;
  q->queued_ckpts = 0;
  q->in_flight = true;
  q->req.data = q;
  if (uv_queue_work(q->loop, &q->req, flush_work, flush_done) != 0) {
    write_ops(q, q->flushing); /* never lose records */
    flush_done(&q->req, 0);
  }
}

void td__ledgerq_stop(td__ledgerq_t *q) { q->stopped = true; }

void td__ledgerq_stats(const td__ledgerq_t *q, td__ledgerq_stats_t *out) {
  *out = (td__ledgerq_stats_t){
      .degraded = q->degraded, .since = q->degraded ? q->degraded_since : NAN,
      .failed_writes = q->degraded ? q->episode_failures : 0,
      .failures_total = q->failures_total, .episodes = q->episodes,
      .pending_rows = q->pending_rows, .pending_bytes = q->pending_bytes,
      .buffer_bytes = q->buffer_bytes, .dropped_rows = q->dropped_total,
      .refused_rows = q->refused_total};
  snprintf(out->cause, sizeof out->cause, "%s", q->degraded ? q->fault.cause : "");
  snprintf(out->detail, sizeof out->detail, "%s", q->degraded ? q->fault.detail : "");
  if (q->degraded)
    causes_text(q, out->causes, sizeof out->causes);
}

void td__ledgerq_set_buffer(td__ledgerq_t *q, size_t bytes) {
  q->buffer_bytes = bytes;
  trim(q);
}

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
  if (td_ledger_runs(q->ledger, seen_load, q) != 0) {
    td_ledger_close(&q->ledger);
    free(q->seen);
    free(q);
    return td_why(why, why_len, TD_EIO, "cannot read the runs of ledger %s", path);
  }
  pthread_mutex_init(&q->mu, NULL);
  q->loop = loop;
  snprintf(q->path, sizeof q->path, "%s", path);
  q->buffer_bytes = TD__LEDGERQ_BUFFER_BYTES;
  q->fault.cause = "none";
  *out = q;
  return 0;
}

void td__ledgerq_close(td__ledgerq_t **self_p) {
  td__ledgerq_t *q = *self_p;
  if (q == NULL)
    return;
  *self_p = NULL;
  settle(q);
  if (q->head != NULL) { /* the loop has ended: write what is left here */
    write_ops(q, q->head);
    if (q->batch_failed) {
      char causes[256] = "";
      if (q->degraded)
        causes_text(q, causes, sizeof causes);
      td_log_error("ledger %s: %" PRIu64 " rows could not be written before exit and are lost:"
                   " %s (%s)%s%s", q->path, q->pending_rows, q->batch_fault.cause,
                   q->batch_fault.detail, causes[0] ? "; failed writes before: " : "", causes);
      free_ops(q->head);
    } else {
      bool was_degraded = q->degraded;
      char detail[512];
      if (was_degraded)
        episode_summary(q, q->pending_rows, detail, sizeof detail);
      batch_written(q, q->head, false);
      if (was_degraded) /* the loop is gone: the event goes straight in */
        td_ledger_event_add(q->ledger, td_clock_wall_s(), "ledger_degraded", detail);
    }
    q->head = q->tail = NULL;
  }
  td_ledger_close(&q->ledger);
  pthread_mutex_destroy(&q->mu);
  free(q->seen);
  free(q);
}

bool td__ledger_run_ended(td__ledgerq_t *q, uint64_t run_id) {
  const struct seen_run *r = seen_find(q, run_id);
  return r != NULL && r->ended;
}

td__run_seen_t td__ledger_run_seen(td__ledgerq_t *q, uint64_t run_id, const char *spec_text) {
  const struct seen_run *r = seen_find(q, run_id);
  if (r == NULL)
    return TD__RUN_UNSEEN;
  if (r->spec_hash != spec_hash(spec_text ? spec_text : ""))
    return TD__RUN_OTHER_SPEC;
  return r->ended ? TD__RUN_ENDED_HERE : TD__RUN_OPEN_HERE;
}

void td__ledger_run_start(td__ledgerq_t *q, uint64_t run_id, const char *spec_text) {
  if (seen_find(q, run_id) == NULL)
    seen_add(q, run_id, spec_text);
  ledger_op_t *op = op_new(q, OP_RUN_START);
  if (op != NULL) {
    op->u.run.run_id = run_id;
    op->text = strdup(spec_text);
  }
}

void td__ledger_run_end(td__ledgerq_t *q, uint64_t run_id, const char *state,
                        double test_accuracy) {
  td__ledger_run_end_untrained(q, run_id, state, test_accuracy, NULL);
}

void td__ledger_run_end_untrained(td__ledgerq_t *q, uint64_t run_id, const char *state,
                                  double test_accuracy, const char *untrained) {
  struct seen_run *r = seen_find(q, run_id);
  if (r != NULL && state_is_final(state))
    r->ended = true;
  ledger_op_t *op = op_new(q, OP_RUN_END);
  if (op != NULL) {
    op->u.run.run_id = run_id;
    op->u.run.value = test_accuracy;
    snprintf(op->name, sizeof op->name, "%s", state);
    op->text = untrained != NULL && untrained[0] != '\0' ? strdup(untrained) : NULL;
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
  if (op != NULL) {
    op->u.round = *row;
    op->u.round.members = NULL; /* borrowed: the copy in text is the op's own */
    op->text = row->members != NULL && row->members[0] != '\0' ? strdup(row->members) : NULL;
  }
}

void td__ledger_eval(td__ledgerq_t *q, uint64_t run_id, uint64_t round, double eval_acc,
                     double eval_bpb) {
  ledger_op_t *op = op_new(q, OP_EVAL);
  if (op != NULL)
    op->u.round = (td_ledger_round_t){.run_id = run_id, .round = round, .eval_acc = eval_acc,
                                      .eval_bpb = eval_bpb};
}

void td__ledger_client_labels(td__ledgerq_t *q, uint64_t run_id, unsigned node, unsigned client,
                              const uint64_t *rows, unsigned labels) {
  uint64_t *copy = malloc((labels ? labels : 1) * sizeof *copy);
  ledger_op_t *op = copy != NULL ? op_new(q, OP_CLIENT_LABELS) : NULL;
  if (op == NULL) {
    if (copy == NULL)
      td_log_error("out of memory: a ledger record is lost");
    free(copy);
    return;
  }
  memcpy(copy, rows, labels * sizeof *copy);
  op->u.labels.run_id = run_id;
  op->u.labels.node = node;
  op->u.labels.client = client;
  op->u.labels.labels = labels;
  op->u.labels.rows = copy;
}

void td__ledger_client_eval(td__ledgerq_t *q, const td_ledger_client_eval_t *row) {
  ledger_op_t *op = op_new(q, OP_CLIENT_EVAL);
  if (op != NULL)
    op->u.client_eval = *row;
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
                           size_t bytes, unsigned keep) {
  ledger_op_t *op = op_new(q, OP_CKPT);
  if (op == NULL) {
    free(blob);
    return;
  }
  q->unwritten_ckpts++;
  op->u.ckpt.run_id = run_id;
  op->u.ckpt.round = round;
  op->u.ckpt.blob = blob;
  op->u.ckpt.bytes = bytes;
  op->u.ckpt.keep = keep;
}

void td__ledger_model(td__ledgerq_t *q, uint64_t run_id, uint64_t round, const char *state,
                      double metric, const char *model, const char *tensors, void *blob,
                      size_t bytes) {
  char *model_copy = strdup(model), *tensors_copy = strdup(tensors);
  ledger_op_t *op = model_copy && tensors_copy ? op_new(q, OP_MODEL) : NULL;
  if (op == NULL) {
    free(blob);
    free(model_copy);
    free(tensors_copy);
    return;
  }
  op->u.model.run_id = run_id;
  op->u.model.round = round;
  op->u.model.blob = blob;
  op->u.model.bytes = bytes;
  op->u.model.metric = metric;
  op->u.model.model = model_copy;
  op->text = tensors_copy;
  snprintf(op->name, sizeof op->name, "%s", state);
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

td_ledger_t *td__ledgerq_lock(td__ledgerq_t *q) {
  pthread_mutex_lock(&q->mu);
  return q->ledger;
}

void td__ledgerq_unlock(td__ledgerq_t *q) { pthread_mutex_unlock(&q->mu); }

uv_loop_t *td__ledgerq_loop(const td__ledgerq_t *q) { return q->loop; }
