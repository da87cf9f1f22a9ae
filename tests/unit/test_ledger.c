/* test_ledger.c: the SQLite ledger on real files. A fresh file gets the
 * current schema in WAL mode; rounds, updates, peers, events and checkpoints
 * read back exactly; a reopen keeps everything; a database from a newer traind
 * is refused; `last N` returns the newest N rounds in ascending order; runs
 * left running by a node that died become 'interrupted' at its next start.
 * Faults: a write that fails for lack of space or an I/O error says which
 * (td_ledger_fault), the transaction rolls back and the same rows go in
 * whole once writes work again; a row the schema refuses is told apart from
 * the storage failing; a ledger with 8 KiB of garbage in its middle is
 * refused at open, by name, with the way to recover it, and left as it was.
 * The per-client rows (client_labels, client_evals) are replaced by key, and
 * an ended run's label counts are not rewritten. */
#include <check.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/store/ledger.h"
#include "tests/unit/fault_io.h"

static char dir[64], path[128];

static void fresh_path(void) {
  strcpy(dir, "/tmp/td-ledger-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/traind.db", dir);
}

static int64_t pragma_int(const char *sql) {
  sqlite3 *db;
  sqlite3_stmt *st;
  int64_t v = -1;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  if (sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

typedef struct {
  int n;
  uint64_t rounds[16];
  double acc[16];
} collected_t;

static void collect(const td_ledger_round_t *r, void *user) {
  collected_t *c = user;
  c->rounds[c->n] = r->round;
  c->acc[c->n] = r->eval_acc;
  c->n++;
}

START_TEST(rounds_and_updates_are_recorded) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  uint64_t run = 0x8000000000000001ull; /* above INT64_MAX: stored signed, read back */
  ck_assert_int_eq(td_ledger_run_start(l, run, "model = mlp:4-2\n", 100.0), 0);
  ck_assert_int_eq(td_ledger_begin(l), 0);
  for (uint64_t r = 1; r <= 10; r++) {
    td_ledger_round_t row = {.run_id = run, .round = r, .started = 100.0 + r,
                             .ended = 100.5 + r, .local_steps = 8, .batch = 64,
                             .samples = 512, .loss = 1.0 / r, .eval_acc = r % 5 ? NAN : 0.5,
                             .bytes_sent = 1000, .bytes_recv = 2000, .lr = 0.1, .eval_bpb = NAN};
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
    td_ledger_update_t up = {.run_id = run, .round = r, .peer = 7, .peer_round = r - 1,
                             .staleness = 1, .bytes = 999, .codec = "none", .ratio = 1.0,
                             .arrived = 100.2 + r};
    ck_assert_int_eq(td_ledger_update_add(l, &up), 0);
  }
  ck_assert_int_eq(td_ledger_commit(l), 0);
  ck_assert_int_eq(td_ledger_peer_seen(l, 7, "tcp://127.0.0.1:1", 101, "alive", 5e3), 0);
  ck_assert_int_eq(td_ledger_peer_seen(l, 7, "tcp://127.0.0.1:2", 102, "dead", NAN), 0);
  ck_assert_int_eq(td_ledger_event_add(l, 103, "peer_dead", "node 7"), 0);
  ck_assert_int_eq(td_ledger_run_end(l, run, "finished", 200.0, 0.85), 0);
  ck_assert_int_eq(td_ledger_count(l, "rounds"), 10);
  ck_assert_int_eq(td_ledger_count(l, "updates"), 10);
  ck_assert_int_eq(td_ledger_count(l, "peers"), 1);
  ck_assert_int_eq(td_ledger_count(l, "events"), 1);
  ck_assert_int_eq(td_ledger_count(l, "bogus; DROP TABLE runs"), -1);

  collected_t c = {0};
  ck_assert_int_eq(td_ledger_rounds(l, run, 3, collect, &c), 0);
  ck_assert_int_eq(c.n, 3);
  ck_assert_uint_eq(c.rounds[0], 8);
  ck_assert_uint_eq(c.rounds[2], 10);
  ck_assert_double_eq(c.acc[2], 0.5);
  ck_assert(isnan(c.acc[0]));
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(td_ledger_rounds(l, run, 0, collect, &c), 0);
  ck_assert_int_eq(c.n, 10);
  /* an evaluation that finished after its row was written sets that row only;
   * one for a round with no row adds none */
  ck_assert_int_eq(td_ledger_round_eval(l, run, 8, 0.75, NAN), 0);
  ck_assert_int_eq(td_ledger_round_eval(l, run, 99, 0.9, NAN), 0);
  ck_assert_int_eq(td_ledger_count(l, "rounds"), 10);
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(td_ledger_rounds(l, run, 3, collect, &c), 0);
  ck_assert_double_eq(c.acc[0], 0.75);
  ck_assert(isnan(c.acc[1]));
  ck_assert_double_eq(c.acc[2], 0.5);
  td_ledger_close(&l);
  ck_assert_ptr_null(l);

  ck_assert_int_eq(pragma_int("PRAGMA user_version"), TD_LEDGER_SCHEMA_VERSION);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM updates WHERE staleness = 1"), 10);
  ck_assert_int_eq(pragma_int("SELECT state = 'dead' FROM peers WHERE node_id = 7"), 1);
  ck_assert_int_eq(pragma_int("SELECT round(test_accuracy * 100) FROM runs"), 85);

  /* reopening keeps everything and does not migrate twice */
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), 0);
  ck_assert_int_eq(td_ledger_count(l, "rounds"), 10);
  td_ledger_close(&l);
}
END_TEST

/* Schema 2: per-link measurements and round capacity; a version-1 file
 * (as an older traind left it) is migrated forward and keeps its rows. */
START_TEST(links_capacity_and_migration_from_v1) {
  fresh_path();
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  /* the exact version-1 tables the scheduler columns are added to */
  ck_assert_int_eq(sqlite3_exec(db,
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
      "CREATE TABLE links (id INTEGER PRIMARY KEY, peer INTEGER NOT NULL, at REAL NOT NULL,"
      "  goodput_bps REAL, rtt_ms REAL, codec TEXT, budget_bytes REAL);"
      "CREATE TABLE events (id INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL,"
      "  detail TEXT);"
      "CREATE TABLE checkpoints (run_id INTEGER NOT NULL, round INTEGER NOT NULL,"
      "  blob BLOB NOT NULL, PRIMARY KEY (run_id, round));"
      "INSERT INTO rounds VALUES (5, 1, 1, 2, 8, 64, 512, 0.5, NULL, 1, 2, 0.1, 0.2, 0.3);"
      "PRAGMA user_version = 1;", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  td_ledger_round_t row = {.run_id = 5, .round = 2, .started = 3, .ended = 4, .local_steps = 8,
                           .batch = 40, .samples = 320, .loss = 0.4, .eval_acc = NAN,
                           .eval_bpb = 2.5, .compute_s = 0.25, .wait_s = 0.01, .capacity = 1280};
  ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  td_ledger_link_t k = {.run_id = 5, .round = 2, .peer = 9, .at = 4, .goodput_bps = 2.5e5,
                        .rtt_ms = 12, .codec = "topk:0.01", .budget_bytes = 5e4,
                        .window_bytes = 0, .bytes_sent = 48000};
  ck_assert_int_eq(td_ledger_link_add(l, &k), 0);
  td_ledger_close(&l);
  ck_assert_int_eq(pragma_int("PRAGMA user_version"), TD_LEDGER_SCHEMA_VERSION);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM rounds WHERE run_id = 5"), 2);
  /* 2 -> 3: the bits-per-byte column, NULL for the old row */
  ck_assert_int_eq(pragma_int("SELECT eval_bpb * 10 FROM rounds WHERE round = 2"), 25);
  ck_assert_int_eq(pragma_int("SELECT eval_bpb IS NULL FROM rounds WHERE round = 1"), 1);
  ck_assert_int_eq(pragma_int("SELECT capacity FROM rounds WHERE round = 2"), 1280);
  ck_assert_int_eq(pragma_int("SELECT capacity IS NULL FROM rounds WHERE round = 1"), 1);
  ck_assert_int_eq(pragma_int("SELECT bytes_sent FROM links WHERE peer = 9 AND round = 2"
                              " AND codec = 'topk:0.01' AND budget_bytes = 5e4"), 48000);
}
END_TEST

/* checkpoint_keep: each put leaves the run's `keep` newest and no other run's rows touched;
 * keep 0 deletes nothing. */
START_TEST(checkpoints_keep_the_newest) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256];
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), 0);
  float x[16] = {0};
  for (unsigned r = 1; r <= 4; r++)
    ck_assert_int_eq(td_ledger_checkpoint_put(l, 2, r * 10, x, sizeof x, 0), 0);
  for (unsigned r = 1; r <= 6; r++) {
    x[0] = (float)r;
    ck_assert_int_eq(td_ledger_checkpoint_put(l, 1, r * 10, x, sizeof x, 3), 0);
    ck_assert_int_eq(pragma_int("SELECT count(*) FROM checkpoints WHERE run_id = 1"),
                     r < 3 ? (int)r : 3);
  }
  ck_assert_int_eq(pragma_int("SELECT min(round) FROM checkpoints WHERE run_id = 1"), 40);
  ck_assert_int_eq(pragma_int("SELECT max(round) FROM checkpoints WHERE run_id = 1"), 60);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM checkpoints WHERE run_id = 2"), 4);
  /* the same round again replaces it and keeps three */
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 1, 60, x, sizeof x, 3), 0);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM checkpoints WHERE run_id = 1"), 3);
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 2, 50, x, sizeof x, 1), 0);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM checkpoints WHERE run_id = 2"), 1);
  uint64_t round;
  void *blob;
  size_t bytes;
  ck_assert_int_eq(td_ledger_checkpoint_latest(l, 1, &round, &blob, &bytes), 0);
  ck_assert_uint_eq(round, 60);
  ck_assert_float_eq(((float *)blob)[0], 6.0f);
  free(blob);
  td_ledger_close(&l);
}
END_TEST

/* init = RUN[:ROUND] reads a kept model, or a checkpoint named by the kept
 * model's spec, through a connection of its own while the writer's is open. */
START_TEST(kept_models_are_read_by_run_and_round) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256];
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), 0);
  float kept[4] = {1, 2, 3, 4}, ckpt[4] = {5, 6, 7, 8};
  td_ledger_model_t m = {.run_id = 7, .round = 3, .state = "finished", .metric = 0.5,
                         .model = "mlp:2-1-2", .tensors = "[]", .blob = kept,
                         .bytes = sizeof kept};
  ck_assert_int_eq(td_ledger_model_put(l, &m), 0);
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 7, 2, ckpt, sizeof ckpt, 0), 0);
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 8, 1, ckpt, sizeof ckpt, 0), 0);
  td_ledger_stored_model_t got;
  ck_assert_int_eq(td_ledger_model_read(path, 7, 0, &got, why, sizeof why), 0);
  ck_assert_uint_eq(got.round, 3);
  ck_assert_str_eq(got.model, "mlp:2-1-2");
  ck_assert_uint_eq(got.bytes, sizeof kept);
  ck_assert_int_eq(memcmp(got.blob, kept, sizeof kept), 0);
  free(got.model);
  free(got.blob);
  ck_assert_int_eq(td_ledger_model_read(path, 7, 3, &got, why, sizeof why), 0);
  ck_assert_int_eq(memcmp(got.blob, kept, sizeof kept), 0);
  free(got.model);
  free(got.blob);
  ck_assert_int_eq(td_ledger_model_read(path, 7, 2, &got, why, sizeof why), 0);
  ck_assert_uint_eq(got.round, 2);
  ck_assert_str_eq(got.model, "mlp:2-1-2");
  ck_assert_int_eq(memcmp(got.blob, ckpt, sizeof ckpt), 0);
  free(got.model);
  free(got.blob);
  ck_assert_int_eq(td_ledger_model_read(path, 7, 5, &got, why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "no model of run 0000000000000007 round 5"));
  ck_assert_ptr_null(got.blob);
  /* a checkpoint without a kept model has no spec to name it by */
  ck_assert_int_eq(td_ledger_model_read(path, 8, 1, &got, why, sizeof why), TD_ENOENT);
  ck_assert_int_eq(td_ledger_model_read(path, 9, 0, &got, why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "keeps no model of run 0000000000000009"));
  ck_assert_int_eq(td_ledger_model_read("/nonexistent/traind.db", 7, 0, &got, why, sizeof why),
                   TD_EIO);
  td_ledger_close(&l);
}
END_TEST

START_TEST(wal_mode_and_checkpoints) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256];
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), 0);
  uint64_t round;
  void *blob;
  size_t bytes;
  ck_assert_int_eq(td_ledger_checkpoint_latest(l, 1, &round, &blob, &bytes), TD_ENOENT);
  float a[100], b[100];
  for (int i = 0; i < 100; i++)
    a[i] = (float)i, b[i] = (float)-i;
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 1, 5, a, sizeof a, 0), 0);
  ck_assert_int_eq(td_ledger_checkpoint_put(l, 1, 9, b, sizeof b, 0), 0);
  ck_assert_int_eq(td_ledger_checkpoint_latest(l, 1, &round, &blob, &bytes), 0);
  ck_assert_uint_eq(round, 9);
  ck_assert_uint_eq(bytes, sizeof b);
  ck_assert_int_eq(memcmp(blob, b, sizeof b), 0);
  free(blob);
  td_ledger_close(&l);
  sqlite3 *db;
  sqlite3_stmt *st;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL);
  ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
  ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}
END_TEST

START_TEST(newer_schema_and_bad_paths_are_refused) {
  fresh_path();
  sqlite3 *db;
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL);
  sqlite3_close(db);
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(l);
  ck_assert_ptr_nonnull(strstr(why, "newer"));
  ck_assert_int_eq(td_ledger_open(&l, "/nonexistent/dir/traind.db", why, sizeof why), TD_EIO);
  ck_assert_ptr_nonnull(strstr(why, "/nonexistent/dir"));
  /* garbage where the database should be */
  fresh_path();
  FILE *f = fopen(path, "w");
  for (int i = 0; i < 4096; i++)
    fputc(i * 7, f);
  fclose(f);
  ck_assert_int_ne(td_ledger_open(&l, path, why, sizeof why), 0);
  ck_assert_ptr_null(l);
}
END_TEST

static td_ledger_round_t round_row(uint64_t run, uint64_t r) {
  return (td_ledger_round_t){.run_id = run, .round = r, .started = r, .ended = r + 0.5,
                             .local_steps = 4, .batch = 64, .samples = 256, .loss = 1.0 / r,
                             .eval_acc = NAN, .eval_bpb = NAN, .lr = 0.1};
}

/* Rounds 1..3 in, then a disk that is full (ENOSPC) and one that fails
 * (EIO): each failure is named, rolled back, and the same rows go in whole
 * when the disk works again. */
START_TEST(write_faults_are_named_and_rolled_back) {
  fresh_path();
  fault_io_install();
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  td_ledger_fault_t f;
  td_ledger_fault(l, &f);
  ck_assert_int_eq(f.code, 0);
  ck_assert_int_eq(td_ledger_begin(l), 0);
  for (uint64_t r = 1; r <= 3; r++) {
    td_ledger_round_t row = round_row(1, r);
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  }
  ck_assert_int_eq(td_ledger_commit(l), 0);

  static const struct { int err, code; const char *cause, *detail; } cases[] = {
      {ENOSPC, SQLITE_FULL, "disk full", "SQLITE_FULL"},
      {EIO, SQLITE_IOERR, "I/O error", "SQLITE_IOERR_WRITE"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    fault_io_errno = cases[c].err;
    int rc = td_ledger_begin(l);
    for (uint64_t r = 4; r <= 6 && rc == 0; r++) {
      td_ledger_round_t row = round_row(1, r);
      rc = td_ledger_round_add(l, &row);
    }
    if (rc == 0)
      td_ledger_event_add(l, 7, "round_note", "kept in the transaction");
    if (rc == 0)
      rc = td_ledger_commit(l);
    ck_assert_int_eq(rc, TD_EIO);
    td_ledger_fault(l, &f);
    ck_assert_int_eq(f.code, cases[c].code);
    ck_assert_str_eq(f.cause, cases[c].cause);
    ck_assert_msg(strstr(f.detail, cases[c].detail) != NULL, "detail: %s", f.detail);
    ck_assert(!td_ledger_fault_is_row(f.code));
    ck_assert_int_eq(td_ledger_rollback(l), 0);
    fault_io_errno = 0;
    ck_assert_int_eq(td_ledger_count(l, "rounds"), 3); /* nothing half-written */
    ck_assert_int_eq(td_ledger_count(l, "events"), 0);
  }
  /* the disk works again: the same rows go in, once each */
  ck_assert_int_eq(td_ledger_begin(l), 0);
  for (uint64_t r = 4; r <= 6; r++) {
    td_ledger_round_t row = round_row(1, r);
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  }
  ck_assert_int_eq(td_ledger_event_add(l, 7, "round_note", "kept in the transaction"), 0);
  ck_assert_int_eq(td_ledger_commit(l), 0);
  td_ledger_fault(l, &f);
  ck_assert_int_eq(f.code, 0);
  ck_assert_int_eq(td_ledger_count(l, "rounds"), 6);
  ck_assert_int_eq(td_ledger_count(l, "events"), 1);

  /* a row the schema refuses (an event without a kind) is the row's fault */
  ck_assert_int_eq(td_ledger_begin(l), 0);
  ck_assert_int_eq(td_ledger_event_add(l, 8, NULL, "no kind"), TD_EIO);
  td_ledger_fault(l, &f);
  ck_assert_int_eq(f.code, SQLITE_CONSTRAINT);
  ck_assert(td_ledger_fault_is_row(f.code));
  ck_assert_int_eq(td_ledger_event_add(l, 9, "after", "the rest still goes in"), 0);
  ck_assert_int_eq(td_ledger_commit(l), 0);
  ck_assert_int_eq(td_ledger_count(l, "events"), 2);
  td_ledger_close(&l);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM rounds WHERE round BETWEEN 1 AND 6"), 6);
}
END_TEST

static void file_bytes(const char *p, unsigned char **buf, long *len) {
  FILE *f = fopen(p, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  rewind(f);
  *buf = malloc((size_t)*len);
  ck_assert_ptr_nonnull(*buf);
  ck_assert_int_eq(fread(*buf, 1, (size_t)*len, f), (size_t)*len);
  fclose(f);
}

START_TEST(corrupt_ledger_is_refused_at_open) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[1024] = "";
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), 0);
  ck_assert_int_eq(td_ledger_begin(l), 0);
  for (int i = 0; i < 4000; i++)
    ck_assert_int_eq(td_ledger_event_add(l, i, "filler",
                                         "a hundred bytes of detail, a hundred bytes of detail,"
                                         " a hundred bytes of detail, a hundred bytes"), 0);
  ck_assert_int_eq(td_ledger_commit(l), 0);
  td_ledger_close(&l); /* the last close folds the WAL into the file */

  /* 8 KiB of garbage (xorshift) over two pages in the middle of the file */
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  ck_assert_int_gt(size, 64 * 4096);
  fseek(f, size / 2 / 4096 * 4096, SEEK_SET);
  uint32_t x = 2463534242u;
  for (int i = 0; i < 8192; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    fputc((int)(x & 0xff), f);
  }
  fclose(f);
  unsigned char *before, *after;
  long n_before, n_after;
  file_bytes(path, &before, &n_before);

  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_null(l);
  ck_assert_msg(strstr(why, path) != NULL, "%s", why);
  ck_assert_msg(strstr(why, "is corrupt (quick_check: ") != NULL, "%s", why);
  ck_assert_msg(strstr(why, ".recover") != NULL && strstr(why, "aside") != NULL, "%s", why);
  ck_assert_ptr_null(strchr(why, '\n')); /* one line */
  file_bytes(path, &after, &n_after);
  ck_assert_int_eq(n_after, n_before);
  ck_assert_int_eq(memcmp(before, after, (size_t)n_before), 0); /* left as it was */
  free(before);
  free(after);

  /* a file that is not a database at all is refused the same way */
  fresh_path();
  f = fopen(path, "w");
  for (int i = 0; i < 8192; i++)
    fputc(i * 7, f);
  fclose(f);
  ck_assert_int_eq(td_ledger_open(&l, path, why, sizeof why), TD_ECORRUPT);
  ck_assert_msg(strstr(why, path) != NULL, "%s", why);
}
END_TEST

typedef struct {
  int n;
  uint64_t run[4], last[4];
} interrupted_t;

static void note_interrupted(uint64_t run_id, uint64_t last_round, void *user) {
  interrupted_t *it = user;
  ck_assert_int_lt(it->n, 4);
  it->run[it->n] = run_id;
  it->last[it->n++] = last_round;
}

/* A node that died during runs finds them 'running' at its next start: they
 * become 'interrupted' (newest first, with the last round recorded), once;
 * ended runs are left alone; a run taken up again is 'running' and not
 * ended. */
START_TEST(runs_left_running_are_interrupted) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(td_ledger_run_start(l, 1, "a", 10.0), 0);
  ck_assert_int_eq(td_ledger_run_end(l, 1, "finished", 11.0, 0.5), 0);
  ck_assert_int_eq(td_ledger_run_start(l, 2, "b", 20.0), 0);
  ck_assert_int_eq(td_ledger_run_start(l, 0x8000000000000003ull, "c", 30.0), 0);
  for (uint64_t r = 1; r <= 7; r++) {
    td_ledger_round_t row = {.run_id = 0x8000000000000003ull, .round = r, .started = 30 + r,
                             .ended = 30.5 + r, .loss = 1, .eval_acc = NAN, .eval_bpb = NAN};
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  }
  interrupted_t it = {0};
  ck_assert_int_eq(td_ledger_runs_interrupt(l, 40.0, note_interrupted, &it), 0);
  ck_assert_int_eq(it.n, 2);
  ck_assert_uint_eq(it.run[0], 0x8000000000000003ull); /* newest first */
  ck_assert_uint_eq(it.last[0], 7);
  ck_assert_uint_eq(it.run[1], 2);
  ck_assert_uint_eq(it.last[1], 0); /* no round recorded */
  memset(&it, 0, sizeof it);
  ck_assert_int_eq(td_ledger_runs_interrupt(l, 50.0, note_interrupted, &it), 0);
  ck_assert_int_eq(it.n, 0);
  ck_assert_int_eq(td_ledger_run_start(l, 2, "b", 60.0), 0); /* taken back into run 2 */
  td_ledger_close(&l);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM runs WHERE state = 'interrupted'"
                              " AND ended = 40"), 1);
  ck_assert_int_eq(pragma_int("SELECT state = 'finished' FROM runs WHERE run_id = 1"), 1);
  ck_assert_int_eq(pragma_int("SELECT state = 'running' AND ended IS NULL AND started = 20"
                              " FROM runs WHERE run_id = 2"), 1);
}
END_TEST

typedef struct {
  int n;
  uint64_t run[4];
  char state[4][16];
} seen_t;

static void note_seen(uint64_t run_id, const char *spec, const char *state, void *user) {
  seen_t *seen = user;
  (void)spec;
  ck_assert_int_lt(seen->n, 4);
  seen->run[seen->n] = run_id;
  snprintf(seen->state[seen->n++], sizeof seen->state[0], "%s", state);
}

/* History is append-only: once a run ended (finished, stopped, failed,
 * missed) no write changes its runs row, adds or replaces a round or an
 * update of it, or ends it again; a run id started again with another
 * spec keeps its first spec. A run still open takes its rows as before. */
START_TEST(an_ended_run_is_never_rewritten) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(td_ledger_run_start(l, 7, "model = a\n", 10.0), 0);
  for (uint64_t r = 1; r <= 3; r++) {
    td_ledger_round_t row = round_row(7, r);
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  }
  td_ledger_round_t again = round_row(7, 2); /* an open run's row may be written again */
  again.loss = 0.25;
  ck_assert_int_eq(td_ledger_round_add(l, &again), 0);
  ck_assert_int_eq(td_ledger_run_end(l, 7, "finished", 11.0, 0.75), 0);
  /* every write below succeeds and changes nothing */
  ck_assert_int_eq(td_ledger_run_start(l, 7, "model = b\n", 20.0), 0);
  ck_assert_int_eq(td_ledger_run_start(l, 7, "model = a\n", 21.0), 0);
  ck_assert_int_eq(td_ledger_run_end(l, 7, "stopped", 22.0, 0.1), 0);
  for (uint64_t r = 1; r <= 5; r++) {
    td_ledger_round_t row = round_row(7, r);
    row.loss = 9;
    ck_assert_int_eq(td_ledger_round_add(l, &row), 0);
  }
  td_ledger_update_t u = {.run_id = 7, .round = 3, .peer = 9, .peer_round = 3, .bytes = 10,
                          .codec = "none", .ratio = 1, .arrived = 23};
  ck_assert_int_eq(td_ledger_update_add(l, &u), 0);
  seen_t seen = {0};
  ck_assert_int_eq(td_ledger_runs(l, note_seen, &seen), 0);
  ck_assert_int_eq(seen.n, 1);
  ck_assert_uint_eq(seen.run[0], 7);
  ck_assert_str_eq(seen.state[0], "finished");
  td_ledger_close(&l);
  ck_assert_int_eq(pragma_int("SELECT state = 'finished' AND spec = 'model = a' || char(10)"
                              " AND started = 10 AND ended = 11 AND test_accuracy = 0.75"
                              " FROM runs WHERE run_id = 7"), 1);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM rounds WHERE run_id = 7"), 3);
  ck_assert_int_eq(pragma_int("SELECT loss = 0.25 FROM rounds WHERE run_id = 7 AND round = 2"), 1);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM rounds WHERE loss = 9"), 0);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM updates"), 0);
}
END_TEST

START_TEST(client_rows_are_recorded_and_an_ended_runs_labels_kept) {
  fresh_path();
  td_ledger_t *l = NULL;
  char why[256] = "";
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  uint64_t run = 42;
  ck_assert_int_eq(td_ledger_run_start(l, run, "model = mlp:4-2\n", 100.0), 0);
  uint64_t node0[3] = {5, 0, 7}, node1[3] = {1, 9, 0};
  ck_assert_int_eq(td_ledger_client_labels(l, run, 0, 0, node0, 3), 0);
  ck_assert_int_eq(td_ledger_client_labels(l, run, 1, 0, node1, 3), 0);
  ck_assert_int_eq(td_ledger_client_labels(l, run, 1, 0, node1, 3), 0); /* replaced, not added */
  ck_assert_int_eq(td_ledger_count(l, "client_labels"), 6);
  td_ledger_client_eval_t e = {.run_id = run, .round = 2, .node = 1, .client = 0, .rows = 30,
                               .loss = 0.7, .accuracy = 0.6};
  ck_assert_int_eq(td_ledger_client_eval(l, &e), 0);
  e.accuracy = 0.65; /* the same round again: the newer value */
  ck_assert_int_eq(td_ledger_client_eval(l, &e), 0);
  ck_assert_int_eq(td_ledger_count(l, "client_evals"), 1);
  ck_assert_int_eq(td_ledger_run_end(l, run, "finished", 200.0, 0.8), 0);
  /* an ended run's counts stay as they were; its last evaluation still lands */
  uint64_t other[3] = {0, 0, 0};
  ck_assert_int_eq(td_ledger_client_labels(l, run, 0, 0, other, 3), 0);
  e.round = 4;
  ck_assert_int_eq(td_ledger_client_eval(l, &e), 0);
  td_ledger_close(&l);
  ck_assert_int_eq(pragma_int("SELECT sum(rows) FROM client_labels WHERE node = 0"), 12);
  ck_assert_int_eq(pragma_int("SELECT sum(rows) FROM client_labels WHERE node = 1"), 10);
  ck_assert_int_eq(pragma_int("SELECT count(*) FROM client_evals WHERE accuracy = 0.65"), 2);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ledger");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, rounds_and_updates_are_recorded);
  tcase_add_test(tc, links_capacity_and_migration_from_v1);
  tcase_add_test(tc, wal_mode_and_checkpoints);
  tcase_add_test(tc, checkpoints_keep_the_newest);
  tcase_add_test(tc, newer_schema_and_bad_paths_are_refused);
  tcase_add_test(tc, write_faults_are_named_and_rolled_back);
  tcase_add_test(tc, corrupt_ledger_is_refused_at_open);
  tcase_add_test(tc, runs_left_running_are_interrupted);
  tcase_add_test(tc, an_ended_run_is_never_rewritten);
  tcase_add_test(tc, kept_models_are_read_by_run_and_round);
  tcase_add_test(tc, client_rows_are_recorded_and_an_ended_runs_labels_kept);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
