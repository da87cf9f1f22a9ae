/* ledger.h: the node's SQLite ledger (<data_dir>/traind.db).
 *
 * One database per node in WAL mode, its schema versioned with PRAGMA
 * user_version and migrated forward on open. It records runs, peers, every
 * round (with the members and partitions whose updates it averaged), every
 * update received (with its staleness), link measurements, events,
 * checkpoints and each run's last model (models). History is append-only:
 * an ended run's rows are final. Statements are prepared once; callers group the
 * writes of one round in td_ledger_begin()/td_ledger_commit() so a round costs
 * one transaction. A ledger handle is used by one thread at a time (the
 * daemon's work pool serialises its writes). */
#ifndef TD_LEDGER_H
#define TD_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/limits.h"

#define TD_LEDGER_SCHEMA_VERSION 7
/* Room for the node ids of a round's members as text ("id,id,..." in hex):
 * TD_MAX_RUN_MEMBERS (proto/limits.h) ids of 16 digits and a comma each. */
#define TD_LEDGER_MEMBERS_TEXT (TD_MAX_RUN_MEMBERS * 17 + 1)

typedef struct td_ledger td_ledger_t;

typedef struct {
  uint64_t run_id;
  uint64_t round;
  double started, ended; /* unix seconds */
  uint32_t local_steps;
  uint32_t batch;
  uint64_t samples;
  double loss;
  double eval_acc;       /* NaN when the round was not evaluated */
  double eval_bpb;       /* text runs: held-out bits per byte; NaN otherwise */
  uint64_t bytes_sent, bytes_recv;
  double lr;
  double compute_s;      /* seconds computing the round (slowdown included) */
  double wait_s;         /* seconds compute was blocked before the round's steps */
  double capacity;       /* samples/s EWMA after the round */
  /* who took part: the members whose update is in the round's average (own
   * included), as hex node ids ("id,id": borrowed for the call), and their
   * partitions (ranks) as a bit set; NULL or "" and 0: not recorded (NULL) */
  const char *members;
  uint64_t partitions;
  /* topology gossip or groups: the node's estimate of the squared consensus
   * distance after the round; has_consensus false: not recorded (NULL) */
  bool has_consensus;
  double consensus;
} td_ledger_round_t;

/* One per-link measurement, taken once per round per peer. */
typedef struct {
  uint64_t run_id, round, peer;
  double at;             /* unix seconds */
  double goodput_bps;    /* bytes/s delivered (EWMA of acknowledged delivery rate) */
  double rtt_ms;         /* EWMA of chunk round-trip times */
  const char *codec;     /* the codec the link used this round */
  double budget_bytes;   /* per-round byte budget of the link */
  uint64_t window_bytes, bytes_sent;
} td_ledger_link_t;

typedef struct {
  uint64_t run_id;
  uint64_t round;      /* receiver's round when it arrived */
  uint64_t peer;       /* sender node id */
  uint64_t peer_round; /* round the update was made in */
  int64_t staleness;   /* round - peer_round */
  uint64_t bytes;
  const char *codec;
  double ratio;        /* dense fp32 bytes / bytes on the wire */
  double arrived;      /* unix seconds */
} td_ledger_update_t;

/* Open or create the database; migrates older schemas, refuses newer ones
 * (TD_ECONFIG). An existing file is checked first (PRAGMA quick_check): a
 * corrupt one is refused with TD_ECORRUPT and a why that names the file and
 * says how to recover it, and is left as it was. Caller owns *out. */
int td_ledger_open(td_ledger_t **out, const char *path, char *why, size_t why_len);
void td_ledger_close(td_ledger_t **self_p);

/* begin/commit group writes in one transaction. After a write failed inside
 * one, td_ledger_rollback() undoes what the transaction wrote (a no-op when no
 * transaction is open) so the same rows can be tried again later. */
int td_ledger_begin(td_ledger_t *l);
int td_ledger_commit(td_ledger_t *l);
int td_ledger_rollback(td_ledger_t *l);

/* Why the last failed call on this handle failed. Write calls return TD_EIO
 * (TD_ENOMEM for SQLite's out of memory); this says which kind of failure it
 * was, for logs and status. */
typedef struct {
  int code;          /* SQLite's primary result code (SQLITE_FULL, SQLITE_IOERR, ...); 0: none */
  const char *cause; /* static: "disk full", "I/O error", "read-only", "corrupt", ... */
  char detail[256];  /* SQLite's message, and the OS error when there was one */
} td_ledger_fault_t;
void td_ledger_fault(const td_ledger_t *l, td_ledger_fault_t *out);
/* The cause phrase of a SQLite primary result code (static; never NULL). */
const char *td_ledger_cause_name(int code);
/* True when the fault is about one row only (a constraint or a value the
 * schema refuses): the row will never be written, but the rest of its batch
 * can be. False for faults of the storage (disk full, I/O error, read-only,
 * locked, corrupt), which may clear when tried again later. */
bool td_ledger_fault_is_row(int code);

int td_ledger_run_start(td_ledger_t *l, uint64_t run_id, const char *spec, double started);
/* state: "finished", "failed", "stopped" ("interrupted": see below); test_accuracy
 * may be NaN. */
int td_ledger_run_end(td_ledger_t *l, uint64_t run_id, const char *state, double ended,
                      double test_accuracy);
/* The partitions (ranks) of a still open run that no round trained, "2,3";
 * call before td_ledger_run_end (an ended run is not changed). */
int td_ledger_run_untrained(td_ledger_t *l, uint64_t run_id, const char *partitions);
int td_ledger_peer_seen(td_ledger_t *l, uint64_t node_id, const char *endpoint, double at,
                        const char *state, double capacity);
int td_ledger_round_add(td_ledger_t *l, const td_ledger_round_t *r);
/* Set the evaluation of a round row already written (NaN: NULL); no row, no change. */
int td_ledger_round_eval(td_ledger_t *l, uint64_t run_id, uint64_t round, double eval_acc,
                         double eval_bpb);
int td_ledger_update_add(td_ledger_t *l, const td_ledger_update_t *u);

/* The per-client view. A client is keyed by (run, node, client): node is the
 * node's rank in the run (the partition it trains on, as rounds.partitions
 * names it), client its index on that node (0 while a node is one client). */
/* One row per label: rows[c] training rows of label c, c < labels (an open
 * run's rows are replaced; an ended run's are left as they are). */
int td_ledger_client_labels(td_ledger_t *l, uint64_t run_id, unsigned node, unsigned client,
                            const uint64_t *rows, unsigned labels);
typedef struct {
  uint64_t run_id, round;
  unsigned node, client;
  uint64_t rows;       /* the client's held-out rows evaluated */
  double loss, accuracy; /* the global model's on them; NaN: NULL */
} td_ledger_client_eval_t;
/* Record (replace) a client's evaluation of a round. */
int td_ledger_client_eval(td_ledger_t *l, const td_ledger_client_eval_t *e);
int td_ledger_link_add(td_ledger_t *l, const td_ledger_link_t *k);
int td_ledger_event_add(td_ledger_t *l, double at, const char *kind, const char *detail);
/* Store round's checkpoint of a run, then delete the run's checkpoints older than its `keep`
 * newest (0: keep them all). */
int td_ledger_checkpoint_put(td_ledger_t *l, uint64_t run_id, uint64_t round, const void *blob,
                             size_t bytes, unsigned keep);
/* Latest checkpoint of a run: TD_ENOENT when there is none. Caller owns *blob. */
int td_ledger_checkpoint_latest(td_ledger_t *l, uint64_t run_id, uint64_t *round, void **blob,
                                size_t *bytes);

/* A run's model as it ended (or its last checkpoint's), one row per run. */
typedef struct {
  uint64_t run_id, round;
  const char *state;   /* the run's end state, or "running" at a checkpoint */
  double metric;       /* test accuracy, or bits per byte for a text run; NaN: none */
  const char *model;   /* the model spec (the run key `model`) */
  const char *tensors; /* JSON: [{"name", "shape", "offset"}] in layout order */
  const void *blob;    /* the flat parameter buffer, layout order, padding included */
  size_t bytes;
} td_ledger_model_t;
/* Store (replace) the run's model row. All fields borrowed. */
int td_ledger_model_put(td_ledger_t *l, const td_ledger_model_t *m);

/* A model this ledger keeps, read for `init = RUN[:ROUND]`: the run's models
 * row (round 0: whatever round it holds), or with round >= 1 that row when
 * it is of that round, else that round's checkpoint. Reads the file at
 * db_path through a read-only connection of its own, so any thread may call
 * it while the daemon's handle writes. 0 with *out filled (caller frees
 * out->model and out->blob), or TD_ENOENT / TD_EIO / TD_ENOMEM + why. */
typedef struct {
  uint64_t round;
  char *model; /* the model spec the row names */
  void *blob;  /* the flat parameter buffer, layout order, padding included */
  size_t bytes;
} td_ledger_stored_model_t;
int td_ledger_model_read(const char *db_path, uint64_t run_id, uint64_t round,
                         td_ledger_stored_model_t *out, char *why, size_t why_len);

/* Rounds of a run in ascending order, the last `last` of them (0 = all). */
typedef void (*td_ledger_round_fn)(const td_ledger_round_t *r, void *user);
int td_ledger_rounds(td_ledger_t *l, uint64_t run_id, unsigned last, td_ledger_round_fn fn,
                     void *user);
/* Every peer ever seen (node id, last endpoint, last state). */
typedef void (*td_ledger_peer_fn)(uint64_t node_id, const char *endpoint, const char *state,
                                  void *user);
int td_ledger_peers(td_ledger_t *l, td_ledger_peer_fn fn, void *user);

/* Every run the ledger holds: its id, spec and state ("running", "finished",
 * "interrupted", ...). The strings are borrowed for the call only. A run that
 * is not 'running' or 'interrupted' is final: no later write changes its
 * runs row (its spec included: the same id with another spec leaves the row
 * as it was), and no round or update row is added to it or replaced (the
 * node's own late evaluations still land on its rounds). */
typedef void (*td_ledger_run_seen_fn)(uint64_t run_id, const char *spec, const char *state,
                                      void *user);
int td_ledger_runs(td_ledger_t *l, td_ledger_run_seen_fn fn, void *user);

/* Runs the ledger still holds as 'running' when the node starts again: the
 * process died during them. fn sees each (newest first) with the last round
 * it recorded (0: none); then they become 'interrupted', ended at `at`. fn
 * must not use the ledger. */
typedef void (*td_ledger_run_fn)(uint64_t run_id, uint64_t last_round, void *user);
int td_ledger_runs_interrupt(td_ledger_t *l, double at, td_ledger_run_fn fn, void *user);

/* Number of rows in a table ("rounds", "updates", ...), for status and tests. */
int64_t td_ledger_count(td_ledger_t *l, const char *table);

#endif
