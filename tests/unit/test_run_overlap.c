/* test_run_overlap.c: overlap mode's early swap and what its evaluations measure.
 *
 * Each case runs a real single-node run (run.c and its compute thread, a CPU
 * backend, a CSV dataset) with this test acting as the loop thread: it
 * answers each ROUND_DONE with an average of its own choosing and releases
 * the round at once, so the average arrives while the next round computes.
 *   - early_swap_keeps_deltas_local: every average is a large constant step
 *     (0.01 on every parameter) and the learning rate is tiny, so a round's
 *     own progress is ~1e-9. With overlap_early the average is swapped in
 *     between the next round's steps (the events say after which step), and
 *     the round start must move with it: every posted delta stays the round's
 *     local progress, under 1e-5, where a swap left in the delta would make it
 *     0.01. Without overlap_early no swap happens during the steps.
 *   - overlap_evaluates_the_anchor: every average is zero, so the anchor stays
 *     the initial model while the local model trains (its deltas are
 *     not small). The periodic evaluations measure the anchor, the members'
 *     consensus: all equal, bit for bit, to the last one (after the last round
 *     the model is the anchor). Evaluating the local model would make them
 *     differ. Both with the evaluator thread and evaluated between rounds.
 *   - overlap_fix_is_the_pull_it_stands_for: with four nodes, eager posts the
 *     deltas of overlap_pull = 0.75 bit for bit and none those of 0. */
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

#define ROUNDS 8
#define STEPS 6

static char train_path[64], test_path[64];

typedef struct {
  double step;                /* every average: this on every parameter */
  const char *lr, *early;     /* run keys */
  const char *fix, *pull;     /* overlap_fix, overlap_pull (NULL: the defaults) */
  unsigned nodes;             /* nodes sharing the batch (0: 1) */
  bool plain;                 /* evaluate between rounds (no evaluator thread) */
  /* outcome */
  double max_delta;           /* largest |delta| posted, over all rounds */
  double delta_sum;           /* sum of (i + 1) x delta[i] over all rounds: a fingerprint */
  unsigned swapped_early;     /* rounds whose steps swapped the predecessor's average in */
  double eval_loss[ROUNDS + 1];
  unsigned evals;
} trial_t;

static void run_trial(trial_t *t) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  char why[512] = "", key[600];
  /* slowdown 200: a step of this tiny model takes milliseconds, as a real one
   * does, so an average released at once lands between the next round's steps */
  const char *keys[] = {"model=mlp:3-16-3", "batch=8",         "mode=overlap",  "lr=0.05",
                        "eval_every=2",     "threads=1",       "overlap_wait=0", "slowdown=200",
                        "momentum=0.9"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(td_runspec_set_arg(&spec, keys[i], why, sizeof why) == 0, "%s", why);
  const char *more[][2] = {{"lr", t->lr},
                           {"overlap_early", t->early},
                           {"overlap_fix", t->fix ? t->fix : "pull"},
                           {"overlap_pull", t->pull ? t->pull : "0.4"}};
  for (size_t i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "%s=%s", more[i][0], more[i][1]);
    ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  }
  snprintf(key, sizeof key, "dataset=csv:%s,%s", train_path, test_path);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "rounds=%d", ROUNDS);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  snprintf(key, sizeof key, "local_steps=%d", STEPS);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  td_run_opts_t opts = {.spec = &spec, .rank = 0, .nodes = t->nodes ? t->nodes : 1, .loop = &loop,
                        .open_backend = t->plain ? run_csv_plain_cpu : NULL};
  td_run_t *run = NULL;
  ck_assert_msg(td_run_start(&run, &opts, why, sizeof why) == 0, "%s", why);
  size_t n = td_run_numel(run);
  bool finished = false;
  while (!finished) {
    td_run_event_t ev;
    if (!td_run_next_event(run, &ev)) {
      usleep(100);
      continue;
    }
    switch (ev.kind) {
    case TD_RUN_ROUND_DONE: {
      ck_assert_uint_le(ev.round, ROUNDS);
      ck_assert_uint_eq(ev.steps, STEPS);
      ck_assert_uint_le(ev.swap_step, ev.steps);
      t->swapped_early += ev.swap_step < ev.steps;
      const float *delta = td_run_delta(run, ev.round);
      float *avg = td_run_avg(run, ev.round);
      for (size_t i = 0; i < n; i++) {
        ck_assert(isfinite(delta[i]));
        t->max_delta = fmax(t->max_delta, fabs(delta[i]));
        t->delta_sum += (double)(i + 1) * delta[i];
        avg[i] = (float)t->step;
      }
      td_run_release(run, ev.round);
      break;
    }
    case TD_RUN_EVAL:
    case TD_RUN_FINISHED:
      ck_assert_uint_le(ev.round, ROUNDS);
      t->eval_loss[ev.round] = ev.loss;
      t->evals++;
      finished = ev.kind == TD_RUN_FINISHED;
      break;
    case TD_RUN_FAILED: ck_abort_msg("run failed: %s", ev.message); break;
    default: break;
    }
    free(ev.blob);
  }
  td_run_close(&run);
  uv_run(&loop, UV_RUN_DEFAULT);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static void with_data(void) {
  run_csv_write(train_path, sizeof train_path, 240, 0);
  run_csv_write(test_path, sizeof test_path, 60, 1);
}

static void without_data(void) {
  unlink(train_path);
  unlink(test_path);
}

START_TEST(early_swap_keeps_deltas_local) {
  with_data();
  trial_t early = {.step = 0.01, .lr = "1e-9", .early = "true"};
  run_trial(&early);
  /* the first round has no predecessor; the others' averages were released
   * within a millisecond of their posting, while steps take milliseconds */
  ck_assert_msg(early.swapped_early >= ROUNDS / 2, "%u of %d rounds swapped early",
                early.swapped_early, ROUNDS - 1);
  ck_assert_msg(early.max_delta < 1e-5, "a delta of %g: the swap leaked into it",
                early.max_delta);
  trial_t late = {.step = 0.01, .lr = "1e-9", .early = "false"};
  run_trial(&late);
  ck_assert_uint_eq(late.swapped_early, 0);
  ck_assert_msg(late.max_delta < 1e-5, "a delta of %g", late.max_delta);
  without_data();
}
END_TEST

static void check_anchor_evaluated(bool plain, const char *early) {
  trial_t t = {.step = 0, .lr = "0.05", .early = early, .plain = plain};
  run_trial(&t);
  ck_assert_uint_eq(t.evals, ROUNDS / 2);
  /* the local model is the anchor plus (1 - overlap_pull) of its last round
   * when evaluated: that round moved it */
  ck_assert_msg(t.max_delta > 1e-3, "training did not move the model (%g)", t.max_delta);
  for (int r = 2; r < ROUNDS; r += 2)
    ck_assert_msg(t.eval_loss[r] == t.eval_loss[ROUNDS],
                  "round %d evaluated %.17g, the anchor (the last) %.17g", r, t.eval_loss[r],
                  t.eval_loss[ROUNDS]);
}

START_TEST(overlap_evaluates_the_anchor) {
  with_data();
  check_anchor_evaluated(false, "true");  /* the evaluator thread */
  check_anchor_evaluated(true, "true");   /* between rounds, in the compute thread */
  check_anchor_evaluated(true, "false");
  without_data();
}
END_TEST

/* overlap_fix reaches the compute thread: with four nodes sharing the
 * batch, eager posts exactly the deltas of the pull at 1 - 1/4 and none
 * those of the pull at 0 (the runs repeat bit for bit: overlap_wait = 0, no
 * early swap, one thread), and eager differs from the default pull. */
START_TEST(overlap_fix_is_the_pull_it_stands_for) {
  with_data();
  trial_t eager = {.step = 0.001, .lr = "0.05", .early = "false", .fix = "eager", .nodes = 4};
  trial_t pull75 = {.step = 0.001, .lr = "0.05", .early = "false", .pull = "0.75", .nodes = 4};
  trial_t none = {.step = 0.001, .lr = "0.05", .early = "false", .fix = "none", .nodes = 4};
  trial_t pull0 = {.step = 0.001, .lr = "0.05", .early = "false", .pull = "0", .nodes = 4};
  trial_t dflt = {.step = 0.001, .lr = "0.05", .early = "false", .nodes = 4};
  run_trial(&eager);
  run_trial(&pull75);
  run_trial(&none);
  run_trial(&pull0);
  run_trial(&dflt);
  ck_assert_msg(eager.delta_sum == pull75.delta_sum, "eager %.17g, pull 0.75 %.17g",
                eager.delta_sum, pull75.delta_sum);
  ck_assert_msg(none.delta_sum == pull0.delta_sum, "none %.17g, pull 0 %.17g", none.delta_sum,
                pull0.delta_sum);
  ck_assert_msg(eager.delta_sum != dflt.delta_sum, "eager posted the default pull's deltas");
  ck_assert_msg(none.delta_sum != dflt.delta_sum, "none posted the default pull's deltas");
  without_data();
}
END_TEST

int main(void) {
  Suite *s = suite_create("run_overlap");
  TCase *tc = tcase_create("overlap");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, early_swap_keeps_deltas_local);
  tcase_add_test(tc, overlap_evaluates_the_anchor);
  tcase_add_test(tc, overlap_fix_is_the_pull_it_stands_for);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
