/* ledgerq_read.c: reading the daemon's ledger while its write queue runs:
 * the start-up visits (known peers, runs left running) on the calling thread,
 * and the rounds query on the libuv work pool, behind every write queued
 * before it, answered on the loop thread as JSON. Each read holds the
 * queue's lock (td__ledgerq_lock) for its SQLite calls only. */
#include "daemon/store/ledgerq.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/json.h"

void td__ledger_peers(td__ledgerq_t *q, td_ledger_peer_fn fn, void *user) {
  td_ledger_peers(td__ledgerq_lock(q), fn, user);
  td__ledgerq_unlock(q);
}

int td__ledger_runs_interrupt(td__ledgerq_t *q, double at, td_ledger_run_fn fn, void *user) {
  int rc = td_ledger_runs_interrupt(td__ledgerq_lock(q), at, fn, user);
  td__ledgerq_unlock(q);
  return rc;
}

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
  json_object_object_add(o, "run_id", td__json_id(r->run_id));
  json_object_object_add(o, "round", json_object_new_int64((int64_t)r->round));
  json_object_object_add(o, "started", json_object_new_double(r->started));
  json_object_object_add(o, "ended", json_object_new_double(r->ended));
  json_object_object_add(o, "local_steps", json_object_new_int64(r->local_steps));
  json_object_object_add(o, "batch", json_object_new_int64(r->batch));
  json_object_object_add(o, "samples", json_object_new_int64((int64_t)r->samples));
  json_object_object_add(o, "loss", td__json_real(r->loss));
  json_object_object_add(o, "eval_acc", td__json_real(r->eval_acc));
  json_object_object_add(o, "eval_bpb", td__json_real(r->eval_bpb));
  json_object_object_add(o, "bytes_sent", json_object_new_int64((int64_t)r->bytes_sent));
  json_object_object_add(o, "bytes_recv", json_object_new_int64((int64_t)r->bytes_recv));
  json_object_object_add(o, "compute_s", td__json_real(r->compute_s));
  json_object_object_add(o, "wait_s", td__json_real(r->wait_s));
  if (r->has_consensus)
    json_object_object_add(o, "consensus", td__json_real(r->consensus));
  json_object_array_add(rq->arr, o);
}

/* Work pool: only the query's own arguments and the ledger (under mu). */
static void rounds_work(uv_work_t *req) {
  rounds_query_t *rq = req->data;
  rq->arr = json_object_new_array();
  td_ledger_rounds(td__ledgerq_lock(rq->q), rq->run_id, rq->last, round_to_json, rq);
  td__ledgerq_unlock(rq->q);
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
  if (uv_queue_work(td__ledgerq_loop(q), &rq->req, rounds_work, rounds_done) != 0) {
    free(rq);
    return TD_EIO;
  }
  return 0;
}
