/* test_ledgerq.c: the daemon's ledger write queue when the disk fails. On a
 * real file and a real libuv loop, with SQLite's writes failed on demand
 * (fault_io.h): a batch that cannot be written is kept, the queue says it is
 * degraded and why (disk full, I/O error), it is not tried again before its
 * backoff, and once writes work every kept row is written exactly once and
 * the episode is recorded as an event. Over the memory bound, the oldest
 * checkpoints go first, then the oldest rows; run start and end rows stay;
 * every drop is counted and the rows that stay are the newest. */
#include <check.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/internal.h"
#include "tests/unit/fault_io.h"

static char dir[64], path[128];
static uv_loop_t loop;

static td__ledgerq_t *open_queue(void) {
  strcpy(dir, "/tmp/td-ledgerq-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/traind.db", dir);
  ck_assert_int_eq(uv_loop_init(&loop), 0);
  td__ledgerq_t *q = NULL;
  char why[512] = "";
  ck_assert_msg(td__ledgerq_open(&q, &loop, path, why, sizeof why) == 0, "%s", why);
  return q;
}

static void close_queue(td__ledgerq_t **q) {
  td__ledgerq_close(q);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[160];
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* Hand the queue to the work pool and run the loop until the batch (and any
 * batch its completion queued) is done. */
static void flush(td__ledgerq_t *q) {
  td__ledgerq_flush(q);
  uv_run(&loop, UV_RUN_DEFAULT);
}

/* Wait out the backoff (0.5 s after the first failure of an episode, 1 s
 * after the second) so the next flush tries again. */
static void after_backoff(double seconds) { usleep((useconds_t)((seconds + 0.1) * 1e6)); }

static int64_t query_int(const char *sql) {
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

static void add_rounds(td__ledgerq_t *q, uint64_t from, uint64_t to) {
  for (uint64_t r = from; r <= to; r++) {
    td_ledger_round_t row = {.run_id = 9, .round = r, .started = r, .ended = r + 0.5,
                             .local_steps = 4, .batch = 64, .samples = 256, .loss = 0.5,
                             .eval_acc = NAN, .eval_bpb = NAN, .lr = 0.1};
    td__ledger_round(q, &row);
  }
}

START_TEST(failed_batches_are_kept_and_written_when_the_disk_works) {
  fault_io_install();
  td__ledgerq_t *q = open_queue();
  td__ledgerq_stats_t st;
  td__ledger_run_start(q, 9, "model = mlp:4-2\n");
  add_rounds(q, 1, 5);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert(!st.degraded);
  ck_assert_uint_eq(st.pending_rows, 0);
  ck_assert_int_eq(query_int("SELECT count(*) FROM rounds"), 5);

  fault_io_errno = ENOSPC; /* the disk is full */
  add_rounds(q, 6, 10);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert(st.degraded);
  ck_assert_str_eq(st.cause, "disk full");
  ck_assert_msg(strstr(st.detail, "SQLITE_FULL") != NULL, "%s", st.detail);
  ck_assert_uint_eq(st.failed_writes, 1);
  ck_assert_uint_eq(st.pending_rows, 5);
  ck_assert_uint_gt(st.pending_bytes, 5 * sizeof(td_ledger_round_t));
  ck_assert_uint_eq(st.dropped_rows, 0);
  ck_assert_str_eq(st.causes, "disk full: 1");
  ck_assert(isfinite(st.since));

  /* within the backoff nothing is tried */
  add_rounds(q, 11, 12);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert_uint_eq(st.failed_writes, 1);
  ck_assert_uint_eq(st.pending_rows, 7);

  /* an I/O error is another cause, counted on its own */
  fault_io_errno = EIO;
  after_backoff(0.5);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert_str_eq(st.cause, "I/O error");
  ck_assert_uint_eq(st.failed_writes, 2);
  ck_assert_str_eq(st.causes, "disk full: 1, I/O error: 1");
  ck_assert_int_eq(query_int("SELECT count(*) FROM rounds"), 5);

  /* space is back: everything kept goes in, once, in order */
  fault_io_errno = 0;
  after_backoff(1.0);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert(!st.degraded);
  ck_assert_uint_eq(st.pending_rows, 0);
  ck_assert_uint_eq(st.pending_bytes, 0);
  ck_assert_uint_eq(st.failures_total, 2);
  ck_assert_uint_eq(st.episodes, 1);
  ck_assert_int_eq(query_int("SELECT count(*) FROM rounds"), 12);
  ck_assert_int_eq(query_int("SELECT count(DISTINCT round) || max(round) FROM rounds"), 1212);
  /* the episode is in the ledger, with its causes and counts */
  ck_assert_int_eq(query_int("SELECT count(*) FROM events WHERE kind = 'ledger_degraded' AND"
                             " detail LIKE '%2 failed writes (disk full: 1, I/O error: 1)%'"
                             " AND detail LIKE '%7 rows kept in memory were written, 0 dropped'"),
                   1);
  close_queue(&q);
}
END_TEST

START_TEST(over_the_bound_the_oldest_go_first) {
  fault_io_install();
  td__ledgerq_t *q = open_queue();
  td__ledgerq_stats_t st;
  fault_io_errno = ENOSPC;
  td__ledger_run_start(q, 9, "model = mlp:4-2\n");
  for (uint64_t r = 1; r <= 3; r++) {
    void *blob = calloc(1, 4000);
    ck_assert_ptr_nonnull(blob);
    td__ledger_checkpoint(q, 9, r * 10, blob, 4000, 0);
  }
  add_rounds(q, 1, 40);
  flush(q); /* fails: degraded, every row kept so far */
  td__ledgerq_stats(q, &st);
  ck_assert(st.degraded);
  ck_assert_uint_eq(st.pending_rows, 44);
  uint64_t row_bytes = (st.pending_bytes - 3 * 4000) / 44; /* what one row costs here */

  /* room for about 20 rows: the three checkpoints go, then the oldest rounds */
  size_t bound = (size_t)(20 * row_bytes + row_bytes / 2);
  td__ledgerq_set_buffer(q, bound);
  td__ledgerq_stats(q, &st);
  ck_assert_uint_le(st.pending_bytes, bound);
  ck_assert_uint_eq(st.pending_rows, 20);
  ck_assert_uint_eq(st.dropped_rows, 44 - 20);
  /* new rows push out the oldest rounds; run start and end rows stay */
  add_rounds(q, 41, 45);
  td__ledger_run_end(q, 9, "finished", 0.9);
  td__ledgerq_flush(q); /* within the backoff: counts the last row, tries nothing */
  td__ledgerq_stats(q, &st);
  ck_assert_uint_le(st.pending_bytes, bound);
  ck_assert_uint_eq(st.dropped_rows, 44 - 20 + 6);

  fault_io_errno = 0;
  after_backoff(0.5);
  flush(q);
  td__ledgerq_stats(q, &st);
  ck_assert(!st.degraded);
  ck_assert_uint_eq(st.pending_rows, 0);
  ck_assert_int_eq(query_int("SELECT count(*) FROM checkpoints"), 0);
  /* run start and end survived; the rounds kept are the newest, without a gap */
  ck_assert_int_eq(query_int("SELECT count(*) FROM runs WHERE run_id = 9 AND state = 'finished'"),
                   1);
  int64_t kept = query_int("SELECT count(*) FROM rounds");
  ck_assert_int_eq(kept, 45 - (int64_t)(st.dropped_rows - 3));
  ck_assert_int_eq(query_int("SELECT max(round) FROM rounds"), 45);
  ck_assert_int_eq(query_int("SELECT max(round) - min(round) + 1 FROM rounds"), kept);
  ck_assert_int_eq(query_int("SELECT count(*) FROM events WHERE kind = 'ledger_degraded'"
                             " AND detail LIKE '%, 30 dropped'"),
                   1);
  close_queue(&q);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ledgerq");
  TCase *tc = tcase_create("faults");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, failed_batches_are_kept_and_written_when_the_disk_works);
  tcase_add_test(tc, over_the_bound_the_oldest_go_first);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
