/* ledgerq.h: the ledger's write queue (ledgerq.c), the loop thread's way to
 * the ledger: rows are queued on the loop thread and written by the work
 * pool, one transaction per batch, in order. */
#ifndef TD_DAEMON_LEDGERQ_H
#define TD_DAEMON_LEDGERQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/base/members.h"
#include "daemon/store/ledger.h"

typedef struct td__ledgerq td__ledgerq_t;

/* ---- ledger write queue (ledgerq.c) ------------------------------------------------
 * Records are queued on the loop thread and written by the work pool, one
 * transaction per batch, in order. Strings and blobs are copied (blob: taken). */

int td__ledgerq_open(td__ledgerq_t **out, uv_loop_t *loop, const char *path, char *why,
                     size_t why_len);
/* Writes what is still queued on the calling thread, then closes. */
void td__ledgerq_close(td__ledgerq_t **self_p);
void td__ledgerq_flush(td__ledgerq_t *q);
/* The ledger under the queue's lock, for a read between batches (any
 * thread); td__ledgerq_unlock() releases it. The loop the queue runs on. */
td_ledger_t *td__ledgerq_lock(td__ledgerq_t *q);
void td__ledgerq_unlock(td__ledgerq_t *q);
uv_loop_t *td__ledgerq_loop(const td__ledgerq_t *q);
/* fn(user) after every batch the pool finished, written or not (one hook). */
void td__ledgerq_on_batch(td__ledgerq_t *q, void (*fn)(void *user), void *user);
/* No checkpoint is queued or being written, or the ledger cannot be written
 * now (then its rows are held to TD__LEDGERQ_BUFFER_BYTES, oldest
 * checkpoints dropped first, and waiting for it would stall the run). */
bool td__ledgerq_checkpoints_settled(const td__ledgerq_t *q);
void td__ledgerq_stop(td__ledgerq_t *q); /* no new batches go to the pool */

/* While the ledger cannot be written (disk full, I/O error, ...) its rows are
 * kept in memory up to this many bytes; over it the oldest are dropped and
 * counted (ledgerq.c says which go first). */
#define TD__LEDGERQ_BUFFER_BYTES ((size_t)64 << 20)
void td__ledgerq_set_buffer(td__ledgerq_t *q, size_t bytes);

/* The queue's health, for status and metrics (loop thread). */
typedef struct {
  bool degraded;            /* the last write failed; rows are kept in memory */
  char cause[32];           /* "disk full", "I/O error", ...; "" when not degraded */
  char detail[256];         /* SQLite's code and message, the OS error */
  char causes[256];         /* this episode's causes with counts: "disk full: 37" */
  double since;             /* wall clock of the episode's first failure; NaN if none */
  uint64_t failed_writes;   /* failed attempts in this episode */
  uint64_t failures_total, episodes; /* since the daemon started */
  uint64_t pending_rows, pending_bytes, buffer_bytes;
  uint64_t dropped_rows;    /* over the bound, since start */
  uint64_t refused_rows;    /* rows SQLite refused for themselves, since start */
} td__ledgerq_stats_t;
void td__ledgerq_stats(const td__ledgerq_t *q, td__ledgerq_stats_t *out);
/* What this node's ledger holds of run_id (loop thread, no I/O): nothing, the
 * run with spec_text still open (running, or interrupted by a crash), the run
 * with spec_text ended (finished, failed, stopped, missed: final), or the id
 * with another spec. */
typedef enum {
  TD__RUN_UNSEEN = 0, TD__RUN_OPEN_HERE, TD__RUN_ENDED_HERE, TD__RUN_OTHER_SPEC
} td__run_seen_t;
td__run_seen_t td__ledger_run_seen(td__ledgerq_t *q, uint64_t run_id, const char *spec_text);
void td__ledger_run_start(td__ledgerq_t *q, uint64_t run_id, const char *spec_text);
void td__ledger_run_end(td__ledgerq_t *q, uint64_t run_id, const char *state,
                        double test_accuracy);
/* ...with the run's partitions no round trained ("2,3"; NULL or "": none). */
void td__ledger_run_end_untrained(td__ledgerq_t *q, uint64_t run_id, const char *state,
                                  double test_accuracy, const char *untrained);
/* The ledger holds run_id as ended (whatever its spec). */
bool td__ledger_run_ended(td__ledgerq_t *q, uint64_t run_id);
void td__ledger_peer(td__ledgerq_t *q, const td_member_t *m);
void td__ledger_round(td__ledgerq_t *q, const td_ledger_round_t *row);
/* The evaluation of a round whose row is already written (an evaluation that
 * finished rounds later, off the training path). */
void td__ledger_eval(td__ledgerq_t *q, uint64_t run_id, uint64_t round, double eval_acc,
                     double eval_bpb);
void td__ledger_update(td__ledgerq_t *q, const td_ledger_update_t *row, const char *codec);
/* A client's training rows per label (rows[0 .. labels), copied). */
void td__ledger_client_labels(td__ledgerq_t *q, uint64_t run_id, unsigned node, unsigned client,
                              const uint64_t *rows, unsigned labels);
void td__ledger_client_eval(td__ledgerq_t *q, const td_ledger_client_eval_t *row);
void td__ledger_link(td__ledgerq_t *q, const td_ledger_link_t *row, const char *codec);
/* Takes `blob` (bytes) whatever happens. Once it is written, the run keeps its `keep` newest
 * checkpoints (0: all). */
void td__ledger_checkpoint(td__ledgerq_t *q, uint64_t run_id, uint64_t round, void *blob,
                           size_t bytes, unsigned keep);
/* The run's model row (one per run, replaced while the run is open): takes
 * `blob` (bytes) whatever happens; model and tensors (JSON) are copied. */
void td__ledger_model(td__ledgerq_t *q, uint64_t run_id, uint64_t round, const char *state,
                      double metric, const char *model, const char *tensors, void *blob,
                      size_t bytes);
void td__ledger_event(td__ledgerq_t *q, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Visit the known peers now, on this thread (start-up). */
void td__ledger_peers(td__ledgerq_t *q, td_ledger_peer_fn fn, void *user);
/* Mark the runs left 'running' interrupted, now, on this thread (start-up). */
int td__ledger_runs_interrupt(td__ledgerq_t *q, double at, td_ledger_run_fn fn, void *user);
/* Rounds of run_id (the last `last`, 0: all) from index `from` on, at most
 * `limit`, read on the work pool after every queued write. done() runs on the
 * loop thread with the rows as a JSON array (NULL when out of memory) and the
 * total row count; it owns json. */
typedef void (*td__rounds_done_fn)(char *json, uint64_t total, void *user);
int td__ledger_rounds_query(td__ledgerq_t *q, uint64_t run_id, unsigned last, uint64_t from,
                            uint64_t limit, td__rounds_done_fn done, void *user);
#endif
