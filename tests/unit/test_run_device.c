/* test_run_device.c: the daemon's compute thread on a device-resident model.
 *
 * On a device the compute thread keeps the model on the device during the
 * steps and works on a pinned host copy between them: it pulls the round's
 * result before forming the delta and pushes the host copy back after the
 * outer step (and the overlap swap and pull) changed it. A missing or
 * misplaced pull or push makes the next round train from the wrong
 * parameters. Each case runs the same single-node run twice, on the CPU and
 * on the CPU posing as a device (td__backend_open_cpu_as_device, through the
 * run's open_backend seam), with this test acting as the loop thread (each
 * round's average is the node's own delta, released at once), and requires
 * the two to agree bit for bit: every checkpoint of the anchor (each round;
 * overlap posts none for its last) and every evaluation. An outer learning
 * rate of 0.7 with momentum makes the anchor differ from the local result
 * every round, so the push matters; dropping the push or the pull makes both
 * cases fail at round 1 or 2. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/backend_impl.h"
#include "daemon/run/run.h"

#define ROUNDS 8

static char csv_path[64];

static void write_dataset(void) {
  snprintf(csv_path, sizeof csv_path, "/tmp/td-test-run-device-XXXXXX");
  int fd = mkstemp(csv_path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 96; i++)
    fprintf(f, "%d,%d.5,%d.25,%d\n", i % 3, i % 3 * 2, i % 5, i % 7);
  fclose(f);
}

typedef struct {
  float *checkpoint[ROUNDS + 1]; /* the anchor after each round */
  double loss[ROUNDS + 1], accuracy[ROUNDS + 1];
  uint64_t samples[ROUNDS + 1]; /* ROUND_DONE: samples trained */
  double train_loss[ROUNDS + 1], capacity[ROUNDS + 1];
  unsigned evals;
  size_t numel;
  char backend_why[256];
} outcome_t;

static void run_once(const char *mode, bool device, outcome_t *out) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  char why[512] = "", key[600];
  /* overlap_wait = 0, overlap_early = false: an overlap round's choice of
   * waiting for its own average, and the step at which an average arriving
   * during a round is swapped in, depend on timing, which differs between the
   * device and the CPU */
  const char *keys[] = {"model=mlp:3-8-3", "batch=8",        "local_steps=3",
                        "optimizer=adamw", "clip=0.5",       "lr=0.02",
                        "outer_lr=0.7",    "outer_momentum=0.9", "eval_every=2",
                        "checkpoint_every=1", "threads=1",   "overlap_wait=0",
                        "overlap_early=false"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    ck_assert_msg(td_runspec_set_arg(&spec, keys[i], why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "dataset=csv:%s", csv_path);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "mode=%s", mode);
  ck_assert_msg(td_runspec_set_arg(&spec, key, why, sizeof why) == 0, "%s", why);
  snprintf(key, sizeof key, "rounds=%d", ROUNDS);
  ck_assert(td_runspec_set_arg(&spec, key, why, sizeof why) == 0);
  td_run_opts_t opts = {.spec = &spec, .rank = 0, .nodes = 1, .loop = &loop,
                        .open_backend = device ? td__backend_open_cpu_as_device : NULL};
  td_run_t *run = NULL;
  ck_assert_msg(td_run_start(&run, &opts, why, sizeof why) == 0, "%s", why);
  size_t n = out->numel = td_run_numel(run);
  bool finished = false;
  while (!finished) {
    td_run_event_t ev;
    if (!td_run_next_event(run, &ev)) {
      usleep(500);
      continue;
    }
    switch (ev.kind) {
    case TD_RUN_READY:
      snprintf(out->backend_why, sizeof out->backend_why, "%s", ev.message);
      break;
    case TD_RUN_ROUND_DONE: /* one node: the round's average is its own delta */
      ck_assert_uint_le(ev.round, ROUNDS);
      out->samples[ev.round] = ev.samples;
      out->train_loss[ev.round] = ev.loss;
      out->capacity[ev.round] = ev.capacity;
      memcpy(td_run_avg(run, ev.round), td_run_delta(run, ev.round), n * sizeof(float));
      td_run_release(run, ev.round);
      break;
    case TD_RUN_CHECKPOINT:
      ck_assert_uint_le(ev.round, ROUNDS);
      out->checkpoint[ev.round] = ev.blob; /* ours now */
      ev.blob = NULL;
      break;
    case TD_RUN_EVAL:
    case TD_RUN_FINISHED:
      out->loss[ev.round] = ev.loss;
      out->accuracy[ev.round] = ev.accuracy;
      out->evals++;
      finished = ev.kind == TD_RUN_FINISHED;
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
  write_dataset();
  outcome_t cpu = {0}, dev = {0};
  run_once(mode, false, &cpu);
  run_once(mode, true, &dev);
  ck_assert_str_eq(cpu.backend_why, "cpu (as configured)");
  ck_assert_msg(strstr(dev.backend_why, "as a device") != NULL, "%s", dev.backend_why);
  ck_assert_uint_eq(cpu.evals, ROUNDS / 2);
  ck_assert_uint_eq(dev.evals, cpu.evals);
  ck_assert_uint_eq(cpu.numel, dev.numel);
  size_t bytes = cpu.numel * sizeof(float);
  /* overlap checkpoints round r with r + 1's swap: the last round has none */
  int last = strcmp(mode, "overlap") == 0 ? ROUNDS - 1 : ROUNDS;
  for (int r = 1; r <= last; r++) { /* every round's anchor equal, bit for bit */
    ck_assert_msg(cpu.checkpoint[r] != NULL && dev.checkpoint[r] != NULL, "round %d", r);
    ck_assert_msg(memcmp(cpu.checkpoint[r], dev.checkpoint[r], bytes) == 0,
                  "%s round %d: the anchors differ", mode, r);
  }
  /* a device's first step is taken untimed (run_compute.c): the round still
   * counts its samples and loss, and the capacity is measured all the same */
  for (int r = 1; r <= ROUNDS; r++) {
    ck_assert_uint_eq(cpu.samples[r], 24); /* 3 steps of 8 */
    ck_assert_uint_eq(dev.samples[r], cpu.samples[r]);
    /* the same steps; the mean is summed in another order (1 + 2 steps) */
    ck_assert_msg(fabs(cpu.train_loss[r] - dev.train_loss[r]) <= 1e-12 * (1 + cpu.train_loss[r]),
                  "%s round %d: training loss %.17g vs %.17g", mode, r, cpu.train_loss[r],
                  dev.train_loss[r]);
    ck_assert(cpu.capacity[r] > 0 && dev.capacity[r] > 0);
  }
  /* and the rounds did move it */
  ck_assert_int_ne(memcmp(cpu.checkpoint[1], cpu.checkpoint[last], bytes), 0);
  for (int r = 2; r <= ROUNDS; r += 2) {
    ck_assert_msg(cpu.loss[r] == dev.loss[r], "%s round %d: loss %.17g vs %.17g", mode, r,
                  cpu.loss[r], dev.loss[r]);
    ck_assert_msg(cpu.accuracy[r] == dev.accuracy[r], "%s round %d: accuracy", mode, r);
    ck_assert(isfinite(cpu.loss[r]));
  }
  for (int r = 1; r <= ROUNDS; r++) {
    free(cpu.checkpoint[r]);
    free(dev.checkpoint[r]);
  }
  unlink(csv_path);
}

START_TEST(sync_run_on_a_device_matches_cpu) { check_mode("sync"); }
END_TEST

START_TEST(overlap_run_on_a_device_matches_cpu) { check_mode("overlap"); }
END_TEST

int main(void) {
  Suite *s = suite_create("run_device");
  TCase *tc = tcase_create("device");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, sync_run_on_a_device_matches_cpu);
  tcase_add_test(tc, overlap_run_on_a_device_matches_cpu);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
