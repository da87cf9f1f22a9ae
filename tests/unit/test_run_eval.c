/* test_run_eval.c: periodic evaluations off the training path (run_eval.c).
 *
 * On the CPU, a run with a separate evaluation set evaluates every
 * eval_every rounds on a replica in a thread of its own while training goes
 * on. Each case runs the same single-node run twice, with this test acting
 * as the loop thread (each round's average is the node's own delta): once as
 * the daemon opens it (the evaluator), once through the run's open_backend
 * seam with a plain CPU backend (evaluations between rounds, as before), and
 * requires the same evaluations bit for bit (one compute thread, BLAS
 * single-threaded), each round once, in order, FINISHED last. An evaluator
 * that copied the parameters at the wrong time, dropped a result or posted
 * one late after FINISHED fails it. A second case checks eval_nodes: only
 * the ranks below it evaluate before the last round; every rank after it. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/backend.h"
#include "daemon/run/run.h"
#include "tests/unit/run_csv.h"

#define ROUNDS 10

static char train_path[64], test_path[64];

typedef struct {
  double loss[ROUNDS + 1], accuracy[ROUNDS + 1];
  unsigned evals, seen[ROUNDS + 1];
  uint64_t last_round;
} outcome_t;

static void run_once(const char *mode, bool plain, unsigned rank, unsigned nodes,
                     const char *eval_nodes, outcome_t *out) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  char why[512] = "", key[600];
  /* overlap_wait = 0, overlap_early = false: whether an overlap round waits
   * for its own average, and at which step an average arriving during a round
   * is swapped in, depend on timing, and the two runs must repeat each other
   * bit for bit */
  const char *keys[] = {"model=mlp:3-16-3", "batch=8", "local_steps=3", "lr=0.05",
                        "outer_lr=0.7",     "outer_momentum=0.9", "eval_every=2",
                        "threads=1",        "overlap_wait=0",     "overlap_early=false"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(td_runspec_set_arg(&spec, keys[i], why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "dataset=csv:%s,%s", train_path, test_path);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "mode=%s", mode);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "eval_nodes=%s", eval_nodes);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "rounds=%d", ROUNDS);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  td_run_opts_t opts = {.spec = &spec, .rank = rank, .nodes = nodes, .loop = &loop,
                        .open_backend = plain ? run_csv_plain_cpu : NULL};
  td_run_t *run = NULL;
  ck_assert_msg(td_run_start(&run, &opts, why, sizeof why) == 0, "%s", why);
  size_t n = td_run_numel(run);
  bool finished = false;
  while (!finished) {
    td_run_event_t ev;
    if (!td_run_next_event(run, &ev)) {
      usleep(200);
      continue;
    }
    switch (ev.kind) {
    case TD_RUN_ROUND_DONE:
      ck_assert_uint_le(ev.round, ROUNDS);
      memcpy(td_run_avg(run, ev.round), td_run_delta(run, ev.round), n * sizeof(float));
      td_run_release(run, ev.round);
      break;
    case TD_RUN_EVAL:
    case TD_RUN_FINISHED:
      ck_assert_uint_le(ev.round, ROUNDS);
      ck_assert_msg(ev.round > out->last_round, "evaluation of round %u after round %u",
                    (unsigned)ev.round, (unsigned)out->last_round);
      out->last_round = ev.round;
      out->loss[ev.round] = ev.loss;
      out->accuracy[ev.round] = ev.accuracy;
      out->seen[ev.round]++;
      out->evals++;
      finished = ev.kind == TD_RUN_FINISHED;
      ck_assert(!finished || ev.round == ROUNDS);
      break;
    case TD_RUN_FAILED: ck_abort_msg("%s run failed: %s", mode, ev.message); break;
    default: break;
    }
    free(ev.blob);
  }
  td_run_close(&run);
  uv_run(&loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static void check_mode(const char *mode) {
  run_csv_write(train_path, sizeof train_path, 240, 0);
  run_csv_write(test_path, sizeof test_path, 60, 1);
  outcome_t bg = {0}, here = {0};
  run_once(mode, false, 0, 1, "0", &bg);
  run_once(mode, true, 0, 1, "0", &here);
  ck_assert_uint_eq(here.evals, ROUNDS / 2);
  ck_assert_uint_eq(bg.evals, here.evals);
  for (int r = 2; r <= ROUNDS; r += 2) {
    ck_assert_uint_eq(bg.seen[r], 1);
    ck_assert(isfinite(here.loss[r]));
    ck_assert_msg(bg.loss[r] == here.loss[r], "%s round %d: loss %.17g vs %.17g", mode, r,
                  bg.loss[r], here.loss[r]);
    ck_assert_msg(bg.accuracy[r] == here.accuracy[r], "%s round %d: accuracy", mode, r);
  }
  /* and training moved the model between evaluations */
  ck_assert(here.loss[2] != here.loss[ROUNDS]);
  unlink(train_path);
  unlink(test_path);
}

START_TEST(sync_evaluations_off_the_path_match) { check_mode("sync"); }
END_TEST

START_TEST(overlap_evaluations_off_the_path_match) { check_mode("overlap"); }
END_TEST

START_TEST(eval_nodes_limits_the_periodic_evaluations) {
  run_csv_write(train_path, sizeof train_path, 240, 0);
  run_csv_write(test_path, sizeof test_path, 60, 1);
  outcome_t first = {0}, second = {0};
  run_once("sync", false, 0, 2, "1", &first);
  run_once("sync", false, 1, 2, "1", &second);
  ck_assert_uint_eq(first.evals, ROUNDS / 2);
  ck_assert_uint_eq(second.evals, 1); /* the last round only */
  ck_assert_uint_eq(second.seen[ROUNDS], 1);
  unlink(train_path);
  unlink(test_path);
}
END_TEST

int main(void) {
  Suite *s = suite_create("run_eval");
  TCase *tc = tcase_create("eval");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, sync_evaluations_off_the_path_match);
  tcase_add_test(tc, overlap_evaluations_off_the_path_match);
  tcase_add_test(tc, eval_nodes_limits_the_periodic_evaluations);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
