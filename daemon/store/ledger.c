/* ledger.c: SQLite storage for everything a node did and received.
 *
 * Migrations are a list of SQL scripts; script i takes the schema from
 * user_version i to i + 1, so an old database is brought forward in order
 * and a newer one (from a later traind) is refused rather than damaged. Node
 * and run ids are stored as signed 64-bit integers (SQLite's native type) and
 * converted back on read.
 *
 * Faults: an existing file is checked with PRAGMA quick_check before anything
 * else touches it, and a corrupt one is refused with the way to recover it.
 * Every failed call keeps SQLite's result code and message (td_ledger_fault)
 * so the caller can say why a write failed (disk full, I/O error, ...) and
 * decide whether trying the same rows again can help. */
#include "daemon/store/ledger.h"

#include <inttypes.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static const char *const migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE runs (run_id INTEGER PRIMARY KEY, spec TEXT NOT NULL, started REAL NOT NULL,"
    "  ended REAL, state TEXT NOT NULL, test_accuracy REAL);"
    "CREATE TABLE peers (node_id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL,"
    "  first_seen REAL NOT NULL, last_seen REAL NOT NULL, state TEXT NOT NULL, capacity REAL);"
    "CREATE TABLE rounds (run_id INTEGER NOT NULL, round INTEGER NOT NULL,"
    "  started REAL NOT NULL, ended REAL NOT NULL, local_steps INTEGER NOT NULL,"
    "  batch INTEGER NOT NULL, samples INTEGER NOT NULL, loss REAL, eval_acc REAL,"
    "  bytes_sent INTEGER NOT NULL, bytes_recv INTEGER NOT NULL, lr REAL,"
    "  compute_s REAL, wait_s REAL, PRIMARY KEY (run_id, round));"
    "CREATE TABLE updates (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL,"
    "  round INTEGER NOT NULL, peer INTEGER NOT NULL, peer_round INTEGER NOT NULL,"
    "  staleness INTEGER NOT NULL, bytes INTEGER NOT NULL, codec TEXT NOT NULL, ratio REAL,"
    "  arrived REAL NOT NULL);"
    "CREATE INDEX updates_by_round ON updates (run_id, round);"
    "CREATE TABLE links (id INTEGER PRIMARY KEY, peer INTEGER NOT NULL, at REAL NOT NULL,"
    "  goodput_bps REAL, rtt_ms REAL, codec TEXT, budget_bytes REAL);"
    "CREATE TABLE events (id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL,"
    "  detail TEXT);"
    "CREATE TABLE checkpoints (run_id INTEGER NOT NULL, round INTEGER NOT NULL,"
    "  blob BLOB NOT NULL, PRIMARY KEY (run_id, round));",
    /* 1 -> 2: the scheduler's measurements */
    "ALTER TABLE rounds ADD COLUMN capacity REAL;"
    "ALTER TABLE links ADD COLUMN run_id INTEGER;"
    "ALTER TABLE links ADD COLUMN round INTEGER;"
    "ALTER TABLE links ADD COLUMN window_bytes INTEGER;"
    "ALTER TABLE links ADD COLUMN bytes_sent INTEGER;",
    /* 2 -> 3: text runs evaluate in bits per byte, not accuracy */
    "ALTER TABLE rounds ADD COLUMN eval_bpb REAL;",
    /* 3 -> 4: who took part in each round (members: hex node ids; partitions:
     * their ranks, which name their share of the data), and a run's
     * partitions that no round trained */
    "ALTER TABLE rounds ADD COLUMN members TEXT;"
    "ALTER TABLE rounds ADD COLUMN partitions TEXT;"
    "ALTER TABLE runs ADD COLUMN untrained TEXT;",
    /* 4 -> 5: every run's last consensus model, whatever checkpoint_every says */
    "CREATE TABLE models (run_id INTEGER PRIMARY KEY, round INTEGER NOT NULL,"
    "  state TEXT NOT NULL, metric REAL, model TEXT NOT NULL, tensors TEXT NOT NULL,"
    "  blob BLOB NOT NULL);",
    /* 5 -> 6: the per-client view (issue 40): each client's training rows per
     * label, keyed by the node's rank (its partition) and the client's index
     * on the node (0 while a node is one client), and the global model's
     * accuracy on each client's held-out share (client_eval) */
    "CREATE TABLE client_labels (run_id INTEGER NOT NULL, node INTEGER NOT NULL,"
    "  client INTEGER NOT NULL, label INTEGER NOT NULL, rows INTEGER NOT NULL,"
    "  PRIMARY KEY (run_id, node, client, label));"
    "CREATE TABLE client_evals (run_id INTEGER NOT NULL, node INTEGER NOT NULL,"
    "  client INTEGER NOT NULL, round INTEGER NOT NULL, rows INTEGER NOT NULL, loss REAL,"
    "  accuracy REAL, PRIMARY KEY (run_id, node, client, round));",
    /* 6 -> 7: gossip and group runs' consensus distance per round (issue 39) */
    "ALTER TABLE rounds ADD COLUMN consensus REAL;",
};
#define N_MIGRATIONS (sizeof migrations / sizeof migrations[0])

/* States of a run that is still going (or was, when the process died):
 * only its rows may still be written. Every other state (finished, failed,
 * stopped, missed) is final, and no write touches the run's rows again. */
#define OPEN_STATES "('running', 'interrupted')"
/* ?1's run is unknown or still open (for the rows of its rounds). */
#define RUN_OPEN                                                                            \
  "NOT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1 AND state NOT IN " OPEN_STATES ")"

enum {
  ST_RUN_START, ST_RUN_END, ST_PEER, ST_ROUND, ST_UPDATE, ST_LINK, ST_EVENT, ST_CKPT_PUT,
  ST_CKPT_PRUNE, ST_CKPT_GET, ST_ROUNDS, ST_EVAL, ST_RUNS, ST_UNTRAINED, ST_MODEL_PUT,
  ST_CLIENT_LABEL, ST_CLIENT_EVAL, ST_COUNT_
};
static const char *const statements[ST_COUNT_] = {
    /* a run id names one spec forever, and an ended run stays ended: only a
     * run this node was in when its process died (or fell out of) with the
     * same spec is taken up again */
    [ST_RUN_START] = "INSERT INTO runs (run_id, spec, started, state) VALUES (?1, ?2, ?3,"
                     " 'running') ON CONFLICT (run_id) DO UPDATE SET state = 'running', ended = NULL"
                     " WHERE runs.spec = excluded.spec AND runs.state IN " OPEN_STATES,
    [ST_RUN_END] = "UPDATE runs SET state = ?2, ended = ?3, test_accuracy = ?4 WHERE run_id = ?1"
                   " AND state IN " OPEN_STATES,
    [ST_PEER] = "INSERT INTO peers (node_id, endpoint, first_seen, last_seen, state, capacity)"
                " VALUES (?1, ?2, ?3, ?3, ?4, ?5) ON CONFLICT (node_id) DO UPDATE SET"
                " endpoint = ?2, last_seen = ?3, state = ?4, capacity = ?5",
    [ST_ROUND] = "INSERT OR REPLACE INTO rounds (run_id, round, started, ended, local_steps,"
                 " batch, samples, loss, eval_acc, bytes_sent, bytes_recv, lr, compute_s, wait_s,"
                 " capacity, eval_bpb, members, partitions, consensus) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7,"
                 " ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19"
                 " WHERE " RUN_OPEN,
    [ST_UPDATE] = "INSERT INTO updates (run_id, round, peer, peer_round, staleness, bytes,"
                  " codec, ratio, arrived) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 WHERE "
                  RUN_OPEN,
    [ST_LINK] = "INSERT INTO links (peer, at, goodput_bps, rtt_ms, codec, budget_bytes, run_id,"
                " round, window_bytes, bytes_sent) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [ST_EVENT] = "INSERT INTO events (at, kind, detail) VALUES (?1, ?2, ?3)",
    [ST_CKPT_PUT] = "INSERT OR REPLACE INTO checkpoints VALUES (?1, ?2, ?3)",
    /* every checkpoint of the run older than its ?2 newest (none when it has fewer) */
    [ST_CKPT_PRUNE] = "DELETE FROM checkpoints WHERE run_id = ?1 AND round <= (SELECT round FROM"
                      " checkpoints WHERE run_id = ?1 ORDER BY round DESC LIMIT 1 OFFSET ?2)",
    [ST_CKPT_GET] = "SELECT round, blob FROM checkpoints WHERE run_id = ?1"
                    " ORDER BY round DESC LIMIT 1",
    [ST_ROUNDS] = "SELECT * FROM (SELECT run_id, round, started, ended, local_steps, batch,"
                  " samples, loss, eval_acc, bytes_sent, bytes_recv, lr, compute_s, wait_s,"
                  " capacity, eval_bpb, consensus FROM rounds WHERE run_id = ?1"
                  " ORDER BY round DESC LIMIT ?2)"
                  " ORDER BY round ASC",
    /* not held to RUN_OPEN: only the node's own compute thread evaluates,
     * and an evaluation off the training path may land after the run's end */
    [ST_EVAL] = "UPDATE rounds SET eval_acc = ?3, eval_bpb = ?4 WHERE run_id = ?1 AND round = ?2",
    [ST_RUNS] = "SELECT run_id, spec, state FROM runs",
    [ST_UNTRAINED] = "UPDATE runs SET untrained = ?2 WHERE run_id = ?1 AND state IN " OPEN_STATES,
    /* one row per run, replaced while the run is open (written before its end) */
    [ST_MODEL_PUT] = "INSERT OR REPLACE INTO models SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE "
                     RUN_OPEN,
    [ST_CLIENT_LABEL] = "INSERT OR REPLACE INTO client_labels SELECT ?1, ?2, ?3, ?4, ?5 WHERE "
                        RUN_OPEN,
    /* like ST_EVAL: the last evaluation may land after the run's end */
    [ST_CLIENT_EVAL] = "INSERT OR REPLACE INTO client_evals VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
};

struct td_ledger {
  sqlite3 *db;
  sqlite3_stmt *st[ST_COUNT_];
  int fault_code;          /* primary result code of the last failure; 0: none */
  char fault_detail[256];
};

/* The names SQLite's own documentation uses, for the codes a write can meet. */
static const struct {
  int code;
  const char *name, *cause;
} faults[] = {
    {SQLITE_FULL, "SQLITE_FULL", "disk full"},
    {SQLITE_IOERR, "SQLITE_IOERR", "I/O error"},
    {SQLITE_READONLY, "SQLITE_READONLY", "read-only"},
    {SQLITE_CANTOPEN, "SQLITE_CANTOPEN", "cannot open"},
    {SQLITE_PERM, "SQLITE_PERM", "permission denied"},
    {SQLITE_CORRUPT, "SQLITE_CORRUPT", "corrupt"},
    {SQLITE_NOTADB, "SQLITE_NOTADB", "corrupt"},
    {SQLITE_BUSY, "SQLITE_BUSY", "locked"},
    {SQLITE_LOCKED, "SQLITE_LOCKED", "locked"},
    {SQLITE_NOMEM, "SQLITE_NOMEM", "out of memory"},
    {SQLITE_PROTOCOL, "SQLITE_PROTOCOL", "locking protocol"},
    {SQLITE_CONSTRAINT, "SQLITE_CONSTRAINT", "row refused"},
    {SQLITE_MISMATCH, "SQLITE_MISMATCH", "row refused"},
    {SQLITE_TOOBIG, "SQLITE_TOOBIG", "row refused"},
    {SQLITE_RANGE, "SQLITE_RANGE", "row refused"},
};

static const struct {
  int code;
  const char *name;
} ioerrs[] = {
    {SQLITE_IOERR_READ, "SQLITE_IOERR_READ"},
    {SQLITE_IOERR_SHORT_READ, "SQLITE_IOERR_SHORT_READ"},
    {SQLITE_IOERR_WRITE, "SQLITE_IOERR_WRITE"},
    {SQLITE_IOERR_FSYNC, "SQLITE_IOERR_FSYNC"},
    {SQLITE_IOERR_TRUNCATE, "SQLITE_IOERR_TRUNCATE"},
    {SQLITE_IOERR_FSTAT, "SQLITE_IOERR_FSTAT"},
    {SQLITE_IOERR_SHMOPEN, "SQLITE_IOERR_SHMOPEN"},
    {SQLITE_IOERR_SHMSIZE, "SQLITE_IOERR_SHMSIZE"},
    {SQLITE_IOERR_SHMMAP, "SQLITE_IOERR_SHMMAP"},
    {SQLITE_IOERR_DELETE, "SQLITE_IOERR_DELETE"},
};

const char *td_ledger_cause_name(int code) {
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    if (faults[i].code == (code & 0xff))
      return faults[i].cause;
  return "error";
}

bool td_ledger_fault_is_row(int code) {
  code &= 0xff;
  return code == SQLITE_CONSTRAINT || code == SQLITE_MISMATCH || code == SQLITE_TOOBIG ||
         code == SQLITE_RANGE;
}

/* Keep why the call that returned rc failed: the code's name, SQLite's
 * message and, for the storage's faults, the OS error behind it. */
static void note_fault(td_ledger_t *l, int rc) {
  int code = rc & 0xff;
  const char *name = "SQLITE_ERROR";
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    if (faults[i].code == code)
      name = faults[i].name;
  l->fault_code = code;
  /* which I/O failed (SQLITE_IOERR_WRITE, _FSYNC, ...), as SQLite numbers it */
  char ext[24] = "";
  int extended = sqlite3_extended_errcode(l->db);
  if ((extended & 0xff) == code && extended != code)
    snprintf(ext, sizeof ext, " (extended code %d)", extended);
  if (code == SQLITE_IOERR)
    for (size_t i = 0; i < sizeof ioerrs / sizeof ioerrs[0]; i++)
      if (ioerrs[i].code == extended)
        name = ioerrs[i].name, ext[0] = '\0';
  int os = sqlite3_system_errno(l->db);
  if (os != 0 && (code == SQLITE_IOERR || code == SQLITE_CANTOPEN || code == SQLITE_READONLY ||
                  code == SQLITE_PERM))
    snprintf(l->fault_detail, sizeof l->fault_detail, "%s%s: %s (%s)", name, ext,
             sqlite3_errmsg(l->db), strerror(os));
  else
    snprintf(l->fault_detail, sizeof l->fault_detail, "%s%s: %s", name, ext,
             sqlite3_errmsg(l->db));
}

void td_ledger_fault(const td_ledger_t *l, td_ledger_fault_t *out) {
  out->code = l->fault_code;
  out->cause = l->fault_code ? td_ledger_cause_name(l->fault_code) : "none";
  snprintf(out->detail, sizeof out->detail, "%s", l->fault_code ? l->fault_detail : "");
}

static int failed(td_ledger_t *l, int rc) {
  note_fault(l, rc);
  return (rc & 0xff) == SQLITE_NOMEM ? TD_ENOMEM : TD_EIO;
}

static int exec(td_ledger_t *l, const char *sql) {
  int rc = sqlite3_exec(l->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? 0 : failed(l, rc);
}

/* PRAGMA quick_check on the file as found: TD_ECORRUPT with the way back
 * when SQLite finds damage (or cannot read the file as a database at all). */
static int check_file(td_ledger_t *l, const char *path, char *why, size_t n) {
  sqlite3_stmt *st = NULL;
  char first[160] = "";
  int problems = 0;
  int rc = sqlite3_prepare_v2(l->db, "PRAGMA quick_check(8)", -1, &st, NULL);
  if (rc == SQLITE_OK) {
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      const char *line = (const char *)sqlite3_column_text(st, 0);
      if (line != NULL && strcmp(line, "ok") != 0 && problems++ == 0)
        snprintf(first, sizeof first, "%s", line);
    }
  }
  if (rc != SQLITE_DONE && rc != SQLITE_OK && problems == 0)
    snprintf(first, sizeof first, "%s", sqlite3_errmsg(l->db));
  sqlite3_finalize(st);
  for (char *c = first; *c; c++) /* its report spans lines; the error is one */
    if (*c == '\n' || *c == '\r')
      *c = ' ';
  int code = rc & 0xff;
  if (problems == 0 && code != SQLITE_CORRUPT && code != SQLITE_NOTADB) {
    if (rc == SQLITE_DONE || rc == SQLITE_OK)
      return 0;
    return td_why(why, n, TD_EIO, "cannot check ledger %s: %s", path, first);
  }
  /* `.recover` salvages what is readable into a new file; moving the file
   * aside starts an empty ledger. Either way the daemon must not write on. */
  return td_why(why, n, TD_ECORRUPT,
                "ledger %s is corrupt (quick_check: %s%s); traind will not start on it. Move "
                "%s (with any -wal and -shm beside it) aside to start with a new, empty "
                "ledger, or salvage its rows first: sqlite3 %s .recover | sqlite3 %s.recovered,"
                " then move %s.recovered to %s (traind(8), LEDGER FAULTS)",
                path, first, problems > 1 ? ", ..." : "", path, path, path, path, path);
}

static int migrate(td_ledger_t *l, char *why, size_t n) {
  sqlite3_stmt *st;
  int version = 0;
  if (sqlite3_prepare_v2(l->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
    return td_why(why, n, TD_EIO, "cannot read the schema version: %s", sqlite3_errmsg(l->db));
  if (sqlite3_step(st) == SQLITE_ROW)
    version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (version > (int)N_MIGRATIONS)
    return td_why(why, n, TD_ECONFIG,
                  "ledger schema version %d is newer than this traind understands (%zu)",
                  version, N_MIGRATIONS);
  for (int v = version; v < (int)N_MIGRATIONS; v++) {
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", v + 1);
    if (exec(l, "BEGIN") != 0 || exec(l, migrations[v]) != 0 || exec(l, pragma) != 0 ||
        exec(l, "COMMIT") != 0) {
      int rc = td_why(why, n, TD_EIO, "schema migration %d -> %d failed: %s", v, v + 1,
                      sqlite3_errmsg(l->db));
      exec(l, "ROLLBACK");
      return rc;
    }
  }
  return 0;
}

int td_ledger_open(td_ledger_t **out, const char *path, char *why, size_t why_len) {
  *out = NULL;
  td_ledger_t *l = calloc(1, sizeof *l);
  if (l == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc;
  if (sqlite3_open_v2(path, &l->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
      SQLITE_OK) {
    rc = td_why(why, why_len, TD_EIO, "cannot open ledger %s: %s", path,
                l->db ? sqlite3_errmsg(l->db) : "out of memory");
    goto fail;
  }
  sqlite3_busy_timeout(l->db, 5000);
  if ((rc = check_file(l, path, why, why_len)) != 0)
    goto fail;
  if (exec(l, "PRAGMA journal_mode = WAL") != 0 || exec(l, "PRAGMA synchronous = NORMAL") != 0) {
    rc = td_why(why, why_len, TD_EIO, "ledger %s: %s", path, sqlite3_errmsg(l->db));
    goto fail;
  }
  if ((rc = migrate(l, why, why_len)) != 0)
    goto fail;
  for (int i = 0; i < ST_COUNT_; i++)
    if (sqlite3_prepare_v3(l->db, statements[i], -1, SQLITE_PREPARE_PERSISTENT, &l->st[i],
                           NULL) != SQLITE_OK) {
      rc = td_why(why, why_len, TD_EIO, "ledger statement %d: %s", i, sqlite3_errmsg(l->db));
      goto fail;
    }
  *out = l;
  return 0;
fail:
  td_ledger_close(&l);
  return rc;
}

void td_ledger_close(td_ledger_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_ledger_t *l = *self_p;
  for (int i = 0; i < ST_COUNT_; i++)
    sqlite3_finalize(l->st[i]);
  sqlite3_close(l->db);
  free(l);
  *self_p = NULL;
}

int td_ledger_begin(td_ledger_t *l) {
  l->fault_code = 0;
  /* a transaction a failed COMMIT left open would make BEGIN fail for good */
  if (!sqlite3_get_autocommit(l->db) && td_ledger_rollback(l) != 0)
    return TD_EIO;
  return exec(l, "BEGIN");
}

int td_ledger_commit(td_ledger_t *l) { return exec(l, "COMMIT"); }

/* SQLite may already have rolled the transaction back (after SQLITE_FULL,
 * SQLITE_IOERR, ...): then there is nothing left to undo. The fault of the
 * write that failed is kept, not replaced by this call's. */
int td_ledger_rollback(td_ledger_t *l) {
  if (sqlite3_get_autocommit(l->db))
    return 0;
  int code = l->fault_code;
  char detail[sizeof l->fault_detail];
  memcpy(detail, l->fault_detail, sizeof detail);
  int rc = exec(l, "ROLLBACK");
  if (code != 0) {
    l->fault_code = code;
    memcpy(l->fault_detail, detail, sizeof detail);
  }
  return rc;
}

/* Run a prepared write statement whose parameters are bound; reset it. */
static int step_done(td_ledger_t *l, int which) {
  sqlite3_stmt *st = l->st[which];
  int rc = sqlite3_step(st);
  int ret = rc == SQLITE_DONE ? 0 : failed(l, rc); /* the message before reset */
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return ret;
}

static void bind_real_or_null(sqlite3_stmt *st, int i, double v) {
  if (isfinite(v))
    sqlite3_bind_double(st, i, v);
  else
    sqlite3_bind_null(st, i);
}

int td_ledger_run_start(td_ledger_t *l, uint64_t run_id, const char *spec, double started) {
  sqlite3_stmt *st = l->st[ST_RUN_START];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_text(st, 2, spec, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 3, started);
  return step_done(l, ST_RUN_START);
}

int td_ledger_run_end(td_ledger_t *l, uint64_t run_id, const char *state, double ended,
                      double test_accuracy) {
  sqlite3_stmt *st = l->st[ST_RUN_END];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 3, ended);
  bind_real_or_null(st, 4, test_accuracy);
  return step_done(l, ST_RUN_END);
}

int td_ledger_run_untrained(td_ledger_t *l, uint64_t run_id, const char *partitions) {
  sqlite3_stmt *st = l->st[ST_UNTRAINED];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  if (partitions != NULL && partitions[0] != '\0')
    sqlite3_bind_text(st, 2, partitions, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 2);
  return step_done(l, ST_UNTRAINED);
}

int td_ledger_peer_seen(td_ledger_t *l, uint64_t node_id, const char *endpoint, double at,
                        const char *state, double capacity) {
  sqlite3_stmt *st = l->st[ST_PEER];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)node_id);
  sqlite3_bind_text(st, 2, endpoint, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 3, at);
  sqlite3_bind_text(st, 4, state, -1, SQLITE_STATIC);
  bind_real_or_null(st, 5, capacity);
  return step_done(l, ST_PEER);
}

int td_ledger_round_add(td_ledger_t *l, const td_ledger_round_t *r) {
  sqlite3_stmt *st = l->st[ST_ROUND];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)r->run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)r->round);
  sqlite3_bind_double(st, 3, r->started);
  sqlite3_bind_double(st, 4, r->ended);
  sqlite3_bind_int64(st, 5, r->local_steps);
  sqlite3_bind_int64(st, 6, r->batch);
  sqlite3_bind_int64(st, 7, (sqlite3_int64)r->samples);
  bind_real_or_null(st, 8, r->loss);
  bind_real_or_null(st, 9, r->eval_acc);
  sqlite3_bind_int64(st, 10, (sqlite3_int64)r->bytes_sent);
  sqlite3_bind_int64(st, 11, (sqlite3_int64)r->bytes_recv);
  bind_real_or_null(st, 12, r->lr);
  bind_real_or_null(st, 13, r->compute_s);
  bind_real_or_null(st, 14, r->wait_s);
  bind_real_or_null(st, 15, r->capacity);
  bind_real_or_null(st, 16, r->eval_bpb);
  if (r->members != NULL && r->members[0] != '\0')
    sqlite3_bind_text(st, 17, r->members, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 17);
  char partitions[64 * 3] = ""; /* "0,1,2": the ranks of the set bits */
  size_t used = 0;
  for (unsigned i = 0; i < 64 && used < sizeof partitions; i++)
    if (r->partitions & (1ull << i))
      used += (size_t)snprintf(partitions + used, sizeof partitions - used, "%s%u",
                               used ? "," : "", i);
  if (used > 0)
    sqlite3_bind_text(st, 18, partitions, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, 18);
  if (r->has_consensus)
    bind_real_or_null(st, 19, r->consensus);
  else
    sqlite3_bind_null(st, 19);
  return step_done(l, ST_ROUND);
}

int td_ledger_round_eval(td_ledger_t *l, uint64_t run_id, uint64_t round, double eval_acc,
                         double eval_bpb) {
  sqlite3_stmt *st = l->st[ST_EVAL];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)round);
  bind_real_or_null(st, 3, eval_acc);
  bind_real_or_null(st, 4, eval_bpb);
  return step_done(l, ST_EVAL);
}

int td_ledger_client_labels(td_ledger_t *l, uint64_t run_id, unsigned node, unsigned client,
                            const uint64_t *rows, unsigned labels) {
  sqlite3_stmt *st = l->st[ST_CLIENT_LABEL];
  for (unsigned c = 0; c < labels; c++) {
    sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
    sqlite3_bind_int64(st, 2, node);
    sqlite3_bind_int64(st, 3, client);
    sqlite3_bind_int64(st, 4, c);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)rows[c]);
    int rc = step_done(l, ST_CLIENT_LABEL);
    if (rc != 0)
      return rc;
  }
  return 0;
}

int td_ledger_client_eval(td_ledger_t *l, const td_ledger_client_eval_t *e) {
  sqlite3_stmt *st = l->st[ST_CLIENT_EVAL];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)e->run_id);
  sqlite3_bind_int64(st, 2, e->node);
  sqlite3_bind_int64(st, 3, e->client);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)e->round);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)e->rows);
  bind_real_or_null(st, 6, e->loss);
  bind_real_or_null(st, 7, e->accuracy);
  return step_done(l, ST_CLIENT_EVAL);
}

int td_ledger_update_add(td_ledger_t *l, const td_ledger_update_t *u) {
  sqlite3_stmt *st = l->st[ST_UPDATE];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)u->run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)u->round);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)u->peer);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)u->peer_round);
  sqlite3_bind_int64(st, 5, u->staleness);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)u->bytes);
  sqlite3_bind_text(st, 7, u->codec ? u->codec : "none", -1, SQLITE_STATIC);
  bind_real_or_null(st, 8, u->ratio);
  sqlite3_bind_double(st, 9, u->arrived);
  return step_done(l, ST_UPDATE);
}

int td_ledger_link_add(td_ledger_t *l, const td_ledger_link_t *k) {
  sqlite3_stmt *st = l->st[ST_LINK];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)k->peer);
  sqlite3_bind_double(st, 2, k->at);
  bind_real_or_null(st, 3, k->goodput_bps);
  bind_real_or_null(st, 4, k->rtt_ms);
  sqlite3_bind_text(st, 5, k->codec ? k->codec : "", -1, SQLITE_STATIC);
  bind_real_or_null(st, 6, k->budget_bytes);
  sqlite3_bind_int64(st, 7, (sqlite3_int64)k->run_id);
  sqlite3_bind_int64(st, 8, (sqlite3_int64)k->round);
  sqlite3_bind_int64(st, 9, (sqlite3_int64)k->window_bytes);
  sqlite3_bind_int64(st, 10, (sqlite3_int64)k->bytes_sent);
  return step_done(l, ST_LINK);
}

int td_ledger_event_add(td_ledger_t *l, double at, const char *kind, const char *detail) {
  sqlite3_stmt *st = l->st[ST_EVENT];
  sqlite3_bind_double(st, 1, at);
  sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, detail, -1, SQLITE_STATIC);
  return step_done(l, ST_EVENT);
}

int td_ledger_checkpoint_put(td_ledger_t *l, uint64_t run_id, uint64_t round, const void *blob,
                             size_t bytes, unsigned keep) {
  sqlite3_stmt *st = l->st[ST_CKPT_PUT];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)round);
  sqlite3_bind_blob64(st, 3, blob, bytes, SQLITE_STATIC);
  int rc = step_done(l, ST_CKPT_PUT);
  if (rc != 0 || keep == 0)
    return rc;
  st = l->st[ST_CKPT_PRUNE];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)keep);
  return step_done(l, ST_CKPT_PRUNE);
}

int td_ledger_model_put(td_ledger_t *l, const td_ledger_model_t *m) {
  sqlite3_stmt *st = l->st[ST_MODEL_PUT];
  sqlite3_reset(st);
  sqlite3_bind_int64(st, 1, (sqlite3_int64)m->run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)m->round);
  sqlite3_bind_text(st, 3, m->state, -1, SQLITE_STATIC);
  bind_real_or_null(st, 4, m->metric);
  sqlite3_bind_text(st, 5, m->model, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 6, m->tensors, -1, SQLITE_STATIC);
  sqlite3_bind_blob64(st, 7, m->blob, m->bytes, SQLITE_STATIC);
  return step_done(l, ST_MODEL_PUT);
}

int td_ledger_checkpoint_latest(td_ledger_t *l, uint64_t run_id, uint64_t *round, void **blob,
                                size_t *bytes) {
  sqlite3_stmt *st = l->st[ST_CKPT_GET];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  int rc = sqlite3_step(st);
  int ret = TD_ENOENT;
  if (rc == SQLITE_ROW) {
    size_t n = (size_t)sqlite3_column_bytes(st, 1);
    void *copy = malloc(n ? n : 1);
    if (copy == NULL) {
      ret = TD_ENOMEM;
    } else {
      if (n)
        memcpy(copy, sqlite3_column_blob(st, 1), n);
      *round = (uint64_t)sqlite3_column_int64(st, 0);
      *blob = copy;
      *bytes = n;
      ret = 0;
    }
  } else if (rc != SQLITE_DONE) {
    ret = TD_EIO;
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return ret;
}

/* One row (round, model, blob) of sql for run_id and round into *out; 1 when
 * found, 0 when not, a negative error. */
static int stored_row(sqlite3 *db, const char *sql, uint64_t run_id, uint64_t round,
                      td_ledger_stored_model_t *out) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return TD_EIO;
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)round);
  int step = sqlite3_step(st), rc = step == SQLITE_DONE ? 0 : TD_EIO;
  if (step == SQLITE_ROW) {
    const char *model = (const char *)sqlite3_column_text(st, 1);
    size_t n = (size_t)sqlite3_column_bytes(st, 2);
    out->round = (uint64_t)sqlite3_column_int64(st, 0);
    out->model = strdup(model != NULL ? model : "");
    out->blob = malloc(n ? n : 1);
    out->bytes = n;
    rc = out->model != NULL && out->blob != NULL ? 1 : TD_ENOMEM;
    if (rc == 1 && n)
      memcpy(out->blob, sqlite3_column_blob(st, 2), n);
  }
  sqlite3_finalize(st);
  return rc;
}

int td_ledger_model_read(const char *db_path, uint64_t run_id, uint64_t round,
                         td_ledger_stored_model_t *out, char *why, size_t why_len) {
  *out = (td_ledger_stored_model_t){0};
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    return td_why(why, why_len, TD_EIO, "cannot read the ledger %s", db_path);
  }
  sqlite3_busy_timeout(db, 5000);
  int rc = stored_row(db,
                      "SELECT round, model, blob FROM models WHERE run_id = ?1"
                      " AND (?2 = 0 OR round = ?2)",
                      run_id, round, out);
  char *model = NULL;
  if (rc == 0 && round > 0) { /* a checkpoint, named by the kept model's spec */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT model FROM models WHERE run_id = ?1", -1, &st, NULL) ==
            SQLITE_OK) {
      sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
      if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != NULL)
        model = strdup((const char *)sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    if (model != NULL)
      rc = stored_row(db,
                      "SELECT round, NULL, blob FROM checkpoints WHERE run_id = ?1 AND round = ?2",
                      run_id, round, out);
    if (rc == 1) {
      free(out->model);
      out->model = model;
      model = NULL;
    }
  }
  free(model);
  sqlite3_close(db);
  if (rc == 1)
    return 0;
  free(out->model);
  free(out->blob);
  *out = (td_ledger_stored_model_t){0};
  if (rc == 0 && round > 0)
    return td_why(why, why_len, TD_ENOENT,
                  "this node's ledger holds no model of run %016" PRIx64 " round %" PRIu64
                  " (trainctl model %016" PRIx64 " --round %" PRIu64 " looks for it too)",
                  run_id, round, run_id, round);
  if (rc == 0)
    return td_why(why, why_len, TD_ENOENT,
                  "this node's ledger keeps no model of run %016" PRIx64
                  " (trainctl runs lists the runs it holds)",
                  run_id);
  return td_why(why, why_len, rc, "cannot read run %016" PRIx64 "'s model from %s: %s", run_id,
                db_path, td_strerror(rc));
}

static double column_real(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

int td_ledger_rounds(td_ledger_t *l, uint64_t run_id, unsigned last, td_ledger_round_fn fn,
                     void *user) {
  sqlite3_stmt *st = l->st[ST_ROUNDS];
  sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
  sqlite3_bind_int64(st, 2, last ? (sqlite3_int64)last : -1);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    td_ledger_round_t r = {
        .run_id = (uint64_t)sqlite3_column_int64(st, 0),
        .round = (uint64_t)sqlite3_column_int64(st, 1),
        .started = sqlite3_column_double(st, 2),
        .ended = sqlite3_column_double(st, 3),
        .local_steps = (uint32_t)sqlite3_column_int64(st, 4),
        .batch = (uint32_t)sqlite3_column_int64(st, 5),
        .samples = (uint64_t)sqlite3_column_int64(st, 6),
        .loss = column_real(st, 7),
        .eval_acc = column_real(st, 8),
        .bytes_sent = (uint64_t)sqlite3_column_int64(st, 9),
        .bytes_recv = (uint64_t)sqlite3_column_int64(st, 10),
        .lr = column_real(st, 11),
        .compute_s = column_real(st, 12),
        .wait_s = column_real(st, 13),
        .capacity = column_real(st, 14),
        .eval_bpb = column_real(st, 15),
        .consensus = column_real(st, 16),
    };
    r.has_consensus = !isnan(r.consensus);
    fn(&r, user);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return rc == SQLITE_DONE ? 0 : TD_EIO;
}

int td_ledger_peers(td_ledger_t *l, td_ledger_peer_fn fn, void *user) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(l->db, "SELECT node_id, endpoint, state FROM peers", -1, &st, NULL) !=
      SQLITE_OK)
    return TD_EIO;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    fn((uint64_t)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
       (const char *)sqlite3_column_text(st, 2), user);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? 0 : TD_EIO;
}

int td_ledger_runs(td_ledger_t *l, td_ledger_run_seen_fn fn, void *user) {
  sqlite3_stmt *st = l->st[ST_RUNS];
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    fn((uint64_t)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
       (const char *)sqlite3_column_text(st, 2), user);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? 0 : TD_EIO;
}

int td_ledger_runs_interrupt(td_ledger_t *l, double at, td_ledger_run_fn fn, void *user) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(l->db,
                         "SELECT run_id, (SELECT max(round) FROM rounds r WHERE r.run_id ="
                         " runs.run_id) FROM runs WHERE state = 'running' ORDER BY started DESC",
                         -1, &st, NULL) != SQLITE_OK)
    return TD_EIO;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    fn((uint64_t)sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1), user);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return TD_EIO;
  if (sqlite3_prepare_v2(l->db, "UPDATE runs SET state = 'interrupted', ended = ?1"
                                " WHERE state = 'running'", -1, &st, NULL) != SQLITE_OK)
    return TD_EIO;
  sqlite3_bind_double(st, 1, at);
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? 0 : TD_EIO;
}

int64_t td_ledger_count(td_ledger_t *l, const char *table) {
  static const char *const known[] = {"runs", "peers", "rounds", "updates", "links", "events",
                                      "checkpoints", "models", "client_labels",
                                      "client_evals"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (strcmp(table, known[i]) != 0)
      continue;
    char sql[64];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", known[i]);
    sqlite3_stmt *st;
    int64_t n = -1;
    if (sqlite3_prepare_v2(l->db, sql, -1, &st, NULL) == SQLITE_OK) {
      if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
      sqlite3_finalize(st);
    }
    return n;
  }
  return -1;
}
