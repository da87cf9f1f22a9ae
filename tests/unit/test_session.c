/* test_session.c: a run's life on the loop thread (daemon/session/session.c,
 * core.c), on a node state with real parts under it
 * (tests/unit/session_node.h) and sessions started with td__session_start(),
 * whose compute thread trains `mlp:3-3` on a tiny CSV dataset.
 *
 * Asserted: before any run status says idle; a started run is running,
 * found by its id and by no other, and status shows it; a second start while
 * it runs is refused with the running run's id and changes nothing, as is a
 * start by a node that is not a member, on more than TD_MAX_RUN_MEMBERS (64)
 * members or with a spec the policy refuses; a
 * stop for an unknown run is counted as a drop and stops nothing; a stop for
 * the running one ends it `stopped` with its reason; a pool job's reference
 * keeps the ended session alive (its destructor has not run) until the last
 * unref frees it; a new run after it starts afresh; a one-member run runs to
 * `finished` with its rounds and test accuracy; a run whose dataset cannot
 * be read ends `failed` with the reason. */
#include "tests/unit/session_node.h"

#define OTHER_RUN 43

static session_node_t *fx;

static void setup(void) {
  fx = calloc(1, sizeof *fx);
  ck_assert_ptr_nonnull(fx);
  session_node_open(fx, "session");
}

static void teardown(void) {
  session_node_close(fx);
  free(fx);
}

static int start_run(uint64_t run_id, const char *spec, const uint64_t *members, size_t n,
                     char *why, size_t why_len) {
  return td__session_start(&fx->n, run_id, spec, members, n, 1, 0, false, why, why_len);
}

static bool session_ended(void *arg) {
  (void)arg;
  return fx->n.session == NULL;
}
static bool session_ready(void *arg) {
  (void)arg;
  return fx->n.session != NULL && fx->n.session->ready;
}

static void run_stop(uint64_t run_id) {
  Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
  stop.reason = "test";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
  env.run_stop = &stop;
  env.run_id = run_id;
  env.sender = PEER_A;
  td__on_run_stop(&fx->n, &env, NULL, 0);
}

/* The session's destructor as the test sees it: counted, then the real one. */
static unsigned destroyed;
static void (*real_destroy)(td__session_t *s);
static void counting_destroy(td__session_t *s) {
  destroyed++;
  real_destroy(s);
}

START_TEST(start_runs_and_status_shows_it) {
  td__run_stats_t st;
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_IDLE);
  ck_assert_str_eq(st.codec, "none");
  ck_assert_uint_eq(td__session_last_id(&fx->n), 0);

  char why[256] = "";
  char *spec = session_node_spec(fx, "sync", 5, "");
  uint64_t members[] = {SELF, PEER_A, PEER_B};
  ck_assert_msg(start_run(RUN, spec, members, 3, why, sizeof why) == 0, "%s", why);
  td__session_t *s = fx->n.session;
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_eq(td__session_of(&fx->n, RUN), s);
  ck_assert_ptr_null(td__session_of(&fx->n, OTHER_RUN));
  ck_assert_uint_eq(s->refs, 1); /* the node's */
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_RUNNING);
  ck_assert_uint_eq(st.run_id, RUN);
  ck_assert_uint_eq(st.nodes, 3);
  ck_assert_uint_eq(st.rank, 0);
  ck_assert_uint_eq(td__session_last_id(&fx->n), RUN);
  session_node_pump(fx, session_ready, NULL, "the dataset loaded");
  td__session_stats(&fx->n, &st);
  ck_assert_uint_eq(st.rounds, 5);
  ck_assert_str_eq(st.backend, "cpu");

  /* another start while it runs: refused, nothing changed */
  ck_assert_int_ne(start_run(OTHER_RUN, spec, members, 3, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "already running") && strstr(why, "000000000000002a"), "%s", why);
  ck_assert_ptr_eq(fx->n.session, s);
  ck_assert_uint_eq(s->run_id, RUN);
  free(spec);
}
END_TEST

START_TEST(bad_starts_are_refused) {
  char why[256] = "";
  char *spec = session_node_spec(fx, "sync", 5, "");
  uint64_t strangers[] = {PEER_A, PEER_B};
  ck_assert_int_ne(start_run(RUN, spec, strangers, 2, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "not a member") != NULL, "%s", why);
  ck_assert_ptr_null(fx->n.session);

  /* a cluster may hold TD_MAX_NODES, a run only TD_MAX_RUN_MEMBERS (its
   * sampling and reconciliation masks are 64 bits): the start on one more
   * says so, before anything opens */
  uint64_t crowd[TD_MAX_RUN_MEMBERS + 1] = {SELF};
  for (size_t i = 1; i <= TD_MAX_RUN_MEMBERS; i++)
    crowd[i] = 0x1000 + i;
  ck_assert_int_ne(start_run(RUN, spec, crowd, TD_MAX_RUN_MEMBERS + 1, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "a run takes at most 64 members and 65 are alive") != NULL, "%s",
                why);
  ck_assert_ptr_null(fx->n.session);
  free(spec);

  /* a dataset outside the data root: the policy refuses before anything opens */
  uint64_t me[] = {SELF};
  const char *outside = "model = mlp:3-3\ndataset = csv:/etc/passwd\nrounds = 2\n";
  ck_assert_int_ne(start_run(RUN, outside, me, 1, why, sizeof why), 0);
  ck_assert_msg(strstr(why, "is not a file under the data root") != NULL, "%s", why);
  ck_assert_ptr_null(fx->n.session);
  td__run_stats_t st;
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_IDLE);
}
END_TEST

START_TEST(stop_ends_the_run_and_a_job_keeps_it_alive) {
  char why[256] = "";
  char *spec = session_node_spec(fx, "sync", 5, "");
  uint64_t members[] = {SELF, PEER_A, PEER_B};
  ck_assert_msg(start_run(RUN, spec, members, 3, why, sizeof why) == 0, "%s", why);
  td__session_t *s = fx->n.session, *job = s;
  session_node_pump(fx, session_ready, NULL, "the dataset loaded");

  /* a stop for a run this node does not run: counted, nothing stops */
  uint64_t wrong = fx->n.drops.count[TD__DROP_WRONG_RUN];
  run_stop(OTHER_RUN);
  ck_assert_uint_eq(fx->n.drops.count[TD__DROP_WRONG_RUN], wrong + 1);
  session_node_idle(fx, 0.05);
  ck_assert_ptr_eq(fx->n.session, s);
  ck_assert(!td_run_stopping(s->run));

  /* a job holds the session, as an encode or decode on the pool does */
  real_destroy = s->destroy;
  s->destroy = counting_destroy;
  destroyed = 0;
  td__session_ref(job);
  run_stop(RUN);
  session_node_pump(fx, session_ended, NULL, "the run stopped");
  ck_assert_uint_eq(destroyed, 0); /* the job's reference keeps it */
  ck_assert_int_eq(job->state, TD__RUN_STOPPED);
  ck_assert_uint_eq(job->refs, 1);
  td__run_stats_t st;
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_STOPPED);
  ck_assert_uint_eq(st.run_id, RUN);
  ck_assert_str_eq(st.error, "stopped on request");
  ck_assert_uint_eq(td__session_last_id(&fx->n), RUN);
  ck_assert_ptr_null(td__session_of(&fx->n, RUN));
  td__session_unref(&job); /* the job ends: the last reference */
  ck_assert_ptr_null(job);
  ck_assert_uint_eq(destroyed, 1);

  /* the next run starts afresh on a new session */
  ck_assert_msg(start_run(OTHER_RUN, spec, members, 3, why, sizeof why) == 0, "%s", why);
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_RUNNING);
  ck_assert_uint_eq(st.run_id, OTHER_RUN);
  ck_assert_uint_eq(st.rounds_done, 0);
  free(spec);
}
END_TEST

START_TEST(a_lone_run_finishes) {
  char why[256] = "";
  char *spec = session_node_spec(fx, "sync", 3, "");
  uint64_t me[] = {SELF};
  ck_assert_msg(start_run(RUN, spec, me, 1, why, sizeof why) == 0, "%s", why);
  session_node_pump(fx, session_ended, NULL, "the run finished");
  td__run_stats_t st;
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_FINISHED);
  ck_assert_uint_eq(st.run_id, RUN);
  ck_assert_uint_eq(st.rounds_done, 3);
  ck_assert(st.test_accuracy >= 0 && st.test_accuracy <= 1);
  ck_assert_str_eq(st.error, "");
  free(spec);
}
END_TEST

START_TEST(a_run_that_cannot_read_its_data_fails) {
  char path[128], why[256] = "", spec[512];
  snprintf(path, sizeof path, "%s/bad.csv", fx->dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("not,a,number\n", f);
  fclose(f);
  snprintf(spec, sizeof spec, "model = mlp:3-3\ndataset = csv:%s\nrounds = 2\nthreads = 1\n",
           path);
  uint64_t me[] = {SELF};
  ck_assert_msg(start_run(RUN, spec, me, 1, why, sizeof why) == 0, "%s", why);
  session_node_pump(fx, session_ended, NULL, "the run failed");
  td__run_stats_t st;
  td__session_stats(&fx->n, &st);
  ck_assert_int_eq(st.state, TD__RUN_FAILED);
  ck_assert_msg(st.error[0] != '\0', "a failed run says why");
  ck_assert_str_eq(td__run_state_name(st.state), "failed");
}
END_TEST

int main(void) {
  Suite *s = suite_create("session");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, start_runs_and_status_shows_it);
  tcase_add_test(tc, bad_starts_are_refused);
  tcase_add_test(tc, stop_ends_the_run_and_a_job_keeps_it_alive);
  tcase_add_test(tc, a_lone_run_finishes);
  tcase_add_test(tc, a_run_that_cannot_read_its_data_fails);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
