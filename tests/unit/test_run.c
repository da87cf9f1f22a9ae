/* test_run.c: the compute thread's mailbox to the loop. A run whose loop does
 * not drain its events (a busy loop thread) fills the bounded mailbox; the
 * compute thread then waits for room instead of dropping events, so every
 * ROUND_DONE still arrives, in order, and the run ends with FINISHED. A run
 * joined while its compute thread waits for room ends at once, its queued
 * events stay readable, and the checkpoint copies left in the mailbox at
 * close are freed (the sanitizer and valgrind builds check that). Reading how full the mailbox is uses the internal
 * header: the test waits until it is full, so the overflow is certain, not a
 * matter of timing. Where an event is lost, FINISHED never comes and the
 * case fails on its timeout. And a run with more fragments than its model has
 * parameters (its tensors padded: 32 for mlp:2-2), or with a slice that
 * holds only padding, is refused before anything is sized. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/run/run.h"
#include "daemon/run/run_internal.h"

#define ROUNDS 200 /* more than three mailboxes' worth of ROUND_DONE */

static char csv_path[64];

static void write_dataset(void) {
  snprintf(csv_path, sizeof csv_path, "/tmp/td-test-run-XXXXXX");
  int fd = mkstemp(csv_path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 64; i++)
    fprintf(f, "%d,%d.5,%d.25\n", i % 2, i % 2 * 3, i % 5);
  fclose(f);
}

/* A single-node async run that never waits for the loop (staleness 1000). */
static td_run_t *start_run(uv_loop_t *loop, unsigned checkpoint_every) {
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  char why[512] = "", key[600];
  const char *keys[] = {"model=mlp:2-4-2", "batch=8", "local_steps=1", "mode=async:1000",
                        "eval_every=100000000"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(td_runspec_set_arg(&spec, keys[i], why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "dataset=csv:%s", csv_path);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "rounds=%d", ROUNDS);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  snprintf(key, sizeof key, "checkpoint_every=%u", checkpoint_every);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  td_run_opts_t opts = {.spec = &spec, .rank = 0, .nodes = 1, .loop = loop};
  td_run_t *run = NULL;
  ck_assert_msg(td_run_start(&run, &opts, why, sizeof why) == 0, "%s", why);
  return run;
}

static void wait_mailbox_full(td_run_t *run) {
  for (;;) {
    pthread_mutex_lock(&run->mu);
    unsigned n = run->mailbox_count;
    pthread_mutex_unlock(&run->mu);
    if (n == TD_RUN_MAILBOX)
      return;
    usleep(1000);
  }
}

START_TEST(full_mailbox_loses_no_event) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  write_dataset();
  td_run_t *run = start_run(&loop, 0);
  wait_mailbox_full(run); /* the loop is "busy": nothing was drained yet */
  unsigned ready = 0, rounds = 0, finished = 0, other = 0;
  uint64_t expect = 1;
  td_run_event_t ev;
  while (finished == 0) {
    if (!td_run_next_event(run, &ev)) {
      usleep(1000);
      continue;
    }
    switch (ev.kind) {
    case TD_RUN_READY: /* names the backend (cpu, the spec's default) and why */
      ck_assert_str_eq(ev.backend, "cpu");
      ck_assert_str_eq(ev.message, "cpu (as configured)");
      ready++;
      break;
    case TD_RUN_ROUND_DONE:
      ck_assert_uint_eq(ev.round, expect); /* in order, none missing */
      expect++;
      rounds++;
      break;
    case TD_RUN_FINISHED: finished++; break;
    case TD_RUN_FAILED: ck_abort_msg("run failed: %s", ev.message); break;
    default: other++; break;
    }
  }
  ck_assert_uint_eq(ready, 1);
  ck_assert_uint_eq(rounds, ROUNDS);
  ck_assert_uint_eq(other, 0);
  td_run_close(&run);
  ck_assert_ptr_null(run);
  uv_run(&loop, UV_RUN_DEFAULT); /* the async handle's close callback frees the run */
  ck_assert_int_eq(uv_loop_close(&loop), 0);
  unlink(csv_path);
}
END_TEST

START_TEST(join_with_full_mailbox_ends_the_compute_thread) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  write_dataset();
  td_run_t *run = start_run(&loop, 1); /* every event after READY carries a blob */
  wait_mailbox_full(run);
  td_run_join(run); /* the compute thread must stop waiting for room */
  td_run_event_t ev; /* what was queued before stays readable */
  for (unsigned i = 0; i < TD_RUN_MAILBOX / 2; i++) {
    ck_assert(td_run_next_event(run, &ev));
    free(ev.blob); /* the receiver owns it */
  }
  pthread_mutex_lock(&run->mu); /* the thread ended without queueing more */
  ck_assert_uint_eq(run->mailbox_count, TD_RUN_MAILBOX - TD_RUN_MAILBOX / 2);
  pthread_mutex_unlock(&run->mu);
  td_run_close(&run); /* frees the blobs nobody took */
  uv_run(&loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
  unlink(csv_path);
}
END_TEST

/* fragments = P above the model's parameter count (mlp:2-2: 32 floats, its
 * tensors padded): refused with a reason before any buffer is sized or a
 * thread started. */
START_TEST(more_fragments_than_parameters_are_refused) {
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  char why[512] = "";
  const char *keys[] = {"model=mlp:2-2", "batch=8", "fragments=64"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(td_runspec_set_arg(&spec, keys[i], why, sizeof why) == 0, "%s", why);
  uv_loop_t loop;
  uv_loop_init(&loop);
  td_run_opts_t opts = {.spec = &spec, .rank = 0, .nodes = 1, .loop = &loop};
  td_run_t *run = (td_run_t *)&opts; /* set to NULL on failure */
  ck_assert_int_eq(td_run_start(&run, &opts, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(run);
  ck_assert_str_eq(why, "fragments = 64: model mlp:2-2 has only 32 parameters");
  /* 4 slices of 8: the second lies in the weight's padding and would send
   * an empty update every fourth round */
  ck_assert_int_eq(td_runspec_set_arg(&spec, "fragments=4", why, sizeof why), 0);
  run = (td_run_t *)&opts;
  ck_assert_int_eq(td_run_start(&run, &opts, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(run);
  ck_assert_str_eq(why, "fragments = 4: slice 1 of model mlp:2-2 holds only padding; use fewer "
                        "fragments");
  ck_assert_int_eq(uv_loop_close(&loop), 0); /* nothing was left on the loop */
}
END_TEST

int main(void) {
  Suite *s = suite_create("run");
  TCase *tc = tcase_create("mailbox");
  /* each case takes well under a second; a lost FINISHED would hang it */
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, full_mailbox_loses_no_event);
  tcase_add_test(tc, join_with_full_mailbox_ends_the_compute_thread);
  tcase_add_test(tc, more_fragments_than_parameters_are_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
