/* test_rounds.c: when a round closes (daemon/session/rounds.c), on a node
 * state with real parts under it (tests/unit/session_node.h) and a session
 * of three members started with td__session_start(), whose compute thread
 * trains `mlp:3-3` on a tiny CSV dataset. The two peers are known to the
 * member table but never connect: their updates are handed to td__on_update()
 * as the dispatcher hands them, made by the real link codec.
 *
 * Asserted: a sync round waits for every expected member's update and closes
 * on the last one, handing on the sample-weighted mean of the three deltas
 * as the round's average and its ledger row (round, samples, bytes); it
 * waits for our own update even when every peer's is in (peers a round
 * ahead); a
 * duplicate or late update is counted as a drop and closes nothing twice; a
 * member that refused the run or died is no longer waited for; at its
 * deadline a round closes without the late ones, recorded late, and not
 * before; an overlap round lets the compute thread run ahead before it
 * closes; an async run writes a row per own round without waiting for any
 * peer, and its updates go to the compute thread instead of a round. */
#include "tests/unit/session_node.h"

static session_node_t *fx;

static void setup(void) {
  fx = calloc(1, sizeof *fx);
  ck_assert_ptr_nonnull(fx);
  session_node_open(fx, "rounds");
}

static void teardown(void) {
  session_node_close(fx);
  free(fx);
}

static td__session_t *start(const char *mode, const char *extra) {
  char why[256] = "";
  char *spec = session_node_spec(fx, mode, 5, extra);
  uint64_t members[] = {SELF, PEER_A, PEER_B};
  ck_assert_msg(td__session_start(&fx->n, RUN, spec, members, 3, 1, 0, false, why, sizeof why) == 0,
                "%s", why);
  free(spec);
  ck_assert_ptr_nonnull(fx->n.session);
  return fx->n.session;
}

static bool own_round_sent(void *arg) {
  td__session_t *s = fx->n.session;
  uint64_t r = (uint64_t)(uintptr_t)arg;
  return s->own_done >= r && td__outbox_sent(s->outbox, r);
}
static bool rounds_done_reach(void *arg) {
  return fx->n.session->rounds_done >= (uint64_t)(uintptr_t)arg;
}
static bool updates_reach(void *arg) {
  return fx->n.session->updates_received >= (uint64_t)(uintptr_t)arg;
}
static bool drops_reach(void *arg) {
  const uint64_t *want = arg; /* {kind, count} */
  return fx->n.drops.count[want[0]] >= want[1];
}

static void note_row(const td_ledger_round_t *r, void *user) {
  td_ledger_round_t *found = user;
  if (r->round == found->round)
    *found = *r;
}

/* The row the ledger's writer thread stored for round `round` of RUN, read
 * through a connection of its own; false while it is not there yet. */
static bool ledger_row(uint64_t round, td_ledger_round_t *out) {
  char path[128], why[256] = "";
  snprintf(path, sizeof path, "%s/traind.db", fx->dir);
  td_ledger_t *l = NULL;
  ck_assert_msg(td_ledger_open(&l, path, why, sizeof why) == 0, "%s", why);
  *out = (td_ledger_round_t){.round = round};
  ck_assert_int_eq(td_ledger_rounds(l, RUN, 0, note_row, out), 0);
  td_ledger_close(&l);
  return out->run_id == RUN;
}

static bool ledger_has_round_1(void *arg) { return ledger_row(1, arg); }

static bool waited_for(uint64_t peer) {
  uint64_t missing[4];
  size_t k = td_round_missing(fx->n.session->collector, missing, 4);
  for (size_t i = 0; i < k; i++)
    if (missing[i] == peer)
      return true;
  return false;
}

/* Whether coordinate i of the run's buffers is a parameter (not padding). */
static bool is_param(size_t i) {
  const td_layout_t *layout = td_run_layout(fx->n.session->run);
  for (size_t t = 0; t < td_layout_count(layout); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(layout, t);
    if (i >= ti->offset && i < ti->offset + ti->numel)
      return true;
  }
  return false;
}

/* A delta of `v` in every parameter (padding stays zero). Caller frees. */
static float *filled(float v) {
  size_t numel = td_run_numel(fx->n.session->run);
  float *d = malloc(numel * sizeof *d);
  ck_assert_ptr_nonnull(d);
  for (size_t i = 0; i < numel; i++)
    d[i] = is_param(i) ? v : 0;
  return d;
}

static void send_filled(uint64_t peer, uint64_t round, float v) {
  float *d = filled(v);
  session_node_send_update(fx, peer, round, 2, d);
  free(d);
}

/* Round r's average is the sample-weighted mean of our delta and the peers'
 * constant deltas (each member weighs 2 samples; padding stays zero). */
static void assert_average_of(uint64_t r, const float *peer_values, size_t n_peers) {
  td__session_t *s = fx->n.session;
  const float *own = td_run_delta(s->run, r), *avg = td_run_avg(s->run, r);
  double peer_sum = 0;
  for (size_t j = 0; j < n_peers; j++)
    peer_sum += peer_values[j];
  for (size_t i = 0; i < td_run_numel(s->run); i++) {
    double want = (own[i] + (is_param(i) ? peer_sum : 0)) / (double)(n_peers + 1);
    ck_assert_msg(fabs(avg[i] - want) < 1e-5, "round %" PRIu64 ": avg[%zu] = %g, want %g", r,
                  i, avg[i], want);
  }
}

static void assert_average(const float *peer_values, size_t n_peers) {
  assert_average_of(1, peer_values, n_peers);
}

START_TEST(sync_round_closes_on_the_last_expected_update) {
  td__session_t *s = start("sync", "");
  session_node_pump(fx, own_round_sent, (void *)1, "own round 1");
  ck_assert(waited_for(PEER_A) && waited_for(PEER_B));
  ck_assert_uint_eq(s->rounds_done, 0);

  send_filled(PEER_A, 1, 1.0f);
  session_node_pump(fx, updates_reach, (void *)1, "PEER_A's update decoded");
  session_node_idle(fx, 0.05);
  ck_assert_uint_eq(s->rounds_done, 0); /* PEER_B is still expected */
  ck_assert_uint_eq(s->round, 1);
  ck_assert(!waited_for(PEER_A) && waited_for(PEER_B));
  ck_assert_uint_eq(s->own_done, 1); /* sync: the compute thread waits for the close */

  send_filled(PEER_B, 1, -0.5f);
  session_node_pump(fx, rounds_done_reach, (void *)1, "round 1 closed");
  ck_assert_uint_eq(s->round, 2);
  ck_assert_uint_eq(s->updates_received, 2);
  const float peers[] = {1.0f, -0.5f};
  assert_average(peers, 2);
  /* the ledger row handed on */
  const td__own_round_t *o = &s->own[1 % TD__RING];
  ck_assert(o->row_written);
  ck_assert_uint_eq(o->row.run_id, RUN);
  ck_assert_uint_eq(o->row.round, 1);
  ck_assert_uint_eq(o->row.samples, 2);
  ck_assert_uint_gt(o->row.bytes_recv, 0);
  ck_assert(o->row.ended >= o->row.started);
  td_ledger_round_t stored;
  session_node_pump(fx, ledger_has_round_1, &stored, "round 1's row in the ledger");
  ck_assert_uint_eq(stored.samples, 2);
  ck_assert_uint_eq(stored.bytes_recv, o->row.bytes_recv);
  /* the compute thread was released: it computes round 2 */
  session_node_pump(fx, own_round_sent, (void *)2, "own round 2");
}
END_TEST

START_TEST(a_round_waits_for_our_own_update) {
  td__session_t *s = start("sync", "");
  session_node_pump(fx, own_round_sent, (void *)1, "own round 1");
  /* both peers are a round ahead: their round 2 updates are in before round 1
   * closes, while our compute thread still waits for round 1's average */
  send_filled(PEER_A, 2, 0.25f);
  send_filled(PEER_B, 2, 0.25f);
  send_filled(PEER_A, 1, 1.0f);
  send_filled(PEER_B, 1, -0.5f);
  session_node_pump(fx, rounds_done_reach, (void *)2, "rounds 1 and 2 closed");
  ck_assert_uint_eq(s->updates_received, 4);
  const td__own_round_t *o = &s->own[2 % TD__RING];
  ck_assert(o->row_written);
  ck_assert_uint_eq(o->row.round, 2);
  ck_assert_uint_eq(o->row.samples, 2); /* round 2 closed with our own update in it */
  const float peers[] = {0.25f, 0.25f};
  assert_average_of(2, peers, 2);
}
END_TEST

START_TEST(duplicate_and_late_updates_close_nothing_twice) {
  td__session_t *s = start("sync", "");
  session_node_pump(fx, own_round_sent, (void *)1, "own round 1");
  send_filled(PEER_A, 1, 1.0f);
  session_node_pump(fx, updates_reach, (void *)1, "PEER_A's update decoded");
  send_filled(PEER_A, 1, 1.0f); /* the same update again */
  uint64_t dup[] = {TD__DROP_DUPLICATE, 1};
  session_node_pump(fx, drops_reach, dup, "the duplicate counted");
  session_node_idle(fx, 0.05);
  ck_assert_uint_eq(s->updates_received, 1);
  ck_assert_uint_eq(s->rounds_done, 0);
  ck_assert(waited_for(PEER_B));

  send_filled(PEER_B, 1, -0.5f);
  session_node_pump(fx, rounds_done_reach, (void *)1, "round 1 closed");
  /* round 1's updates once more, after it closed: late, counted, nothing closes */
  send_filled(PEER_A, 1, 1.0f);
  send_filled(PEER_B, 1, 1.0f);
  uint64_t late[] = {TD__DROP_LATE, 2};
  session_node_pump(fx, drops_reach, late, "the late updates counted");
  session_node_idle(fx, 0.1);
  ck_assert_uint_eq(s->rounds_done, 1);
  ck_assert_uint_eq(s->round, 2);
  ck_assert_uint_eq(s->updates_received, 2);
  ck_assert(waited_for(PEER_A) && waited_for(PEER_B)); /* round 2 expects both */
}
END_TEST

START_TEST(a_member_that_refused_or_died_is_not_waited_for) {
  td__session_t *s = start("sync", "");
  session_node_pump(fx, own_round_sent, (void *)1, "own round 1");
  send_filled(PEER_A, 1, 1.0f);
  session_node_pump(fx, updates_reach, (void *)1, "PEER_A's update decoded");
  /* PEER_B will not run it: the refusal a member sends */
  Traind__RunRefused rr = TRAIND__RUN_REFUSED__INIT;
  rr.reason = "dataset missing";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_REFUSED;
  env.run_refused = &rr;
  env.run_id = RUN;
  env.sender = PEER_B;
  td__on_run_refused(&fx->n, &env, NULL, 0);
  session_node_pump(fx, rounds_done_reach, (void *)1, "round 1 closed without PEER_B");
  const float peers[] = {1.0f};
  assert_average(peers, 1);
  ck_assert_ptr_nonnull(strstr(s->refused, "dataset missing"));
  ck_assert(waited_for(PEER_A) && !waited_for(PEER_B)); /* nor in the next round */

  /* round 2: PEER_A leaves (gossip on its Leave or its death: the member
   * table, then the round forgets it) */
  session_node_pump(fx, own_round_sent, (void *)2, "own round 2");
  td_members_left(fx->n.members, PEER_A);
  td__rounds_forget_peer(s, PEER_A);
  session_node_pump(fx, rounds_done_reach, (void *)2, "round 2 closed without anyone");
  ck_assert_uint_eq(s->round, 3);
  ck_assert(!waited_for(PEER_A));
  ck_assert_uint_eq(s->late_peers, 0); /* forgotten, not late */
}
END_TEST

START_TEST(the_deadline_closes_a_round_without_the_late_ones) {
  td__session_t *s = start("sync", "round_timeout = 3600\n");
  session_node_pump(fx, own_round_sent, (void *)1, "own round 1");
  send_filled(PEER_A, 1, 1.0f);
  session_node_pump(fx, updates_reach, (void *)1, "PEER_A's update decoded");
  td__rounds_tick(s); /* an hour before the deadline: nothing happens */
  session_node_idle(fx, 0.05);
  ck_assert_uint_eq(s->rounds_done, 0);
  ck_assert_uint_eq(s->late_peers, 0);
  ck_assert_double_eq_tol(s->deadline - s->own[1].done_at, 3600, 1e-6);

  s->deadline = td_clock_mono_s(); /* the hour is over */
  td__rounds_tick(s);
  session_node_pump(fx, rounds_done_reach, (void *)1, "round 1 closed at its deadline");
  ck_assert_uint_eq(s->late_peers, 1);
  const float peers[] = {1.0f};
  assert_average(peers, 1);
  /* PEER_B's update after the deadline is late: counted, nothing closes again */
  send_filled(PEER_B, 1, 1.0f);
  uint64_t late[] = {TD__DROP_LATE, 1};
  session_node_pump(fx, drops_reach, late, "the late update counted");
  ck_assert_uint_eq(s->rounds_done, 1);
  ck_assert(waited_for(PEER_B)); /* late once, still expected in round 2 */
}
END_TEST

START_TEST(overlap_computes_ahead_of_the_open_round) {
  td__session_t *s = start("overlap", "");
  /* round 1 waits for both peers while the compute thread goes on to round 2 */
  session_node_pump(fx, own_round_sent, (void *)2, "own round 2 before round 1 closed");
  ck_assert_uint_eq(s->rounds_done, 0);
  ck_assert_uint_eq(s->round, 1);
  send_filled(PEER_A, 1, 1.0f);
  send_filled(PEER_B, 1, -0.5f);
  session_node_pump(fx, rounds_done_reach, (void *)1, "round 1 closed");
  ck_assert_uint_eq(s->round, 2);
  /* round 2's own update is already done: its deadline runs from then */
  ck_assert_double_eq_tol(s->deadline, s->own[2].done_at + s->spec.round_timeout, 1e-6);
}
END_TEST

START_TEST(async_rounds_wait_for_nobody) {
  td__session_t *s = start("async:2", "");
  session_node_pump(fx, rounds_done_reach, (void *)1, "an async round's row");
  const td__own_round_t *o = &s->own[1 % TD__RING];
  ck_assert(o->row_written);
  ck_assert_uint_eq(o->row.round, 1);
  ck_assert_uint_eq(s->updates_received, 0);
  td__rounds_tick(s); /* no deadline in async: nobody is late */
  ck_assert_uint_eq(s->late_peers, 0);
  /* a peer's update goes to the compute thread's inbox, not into a round */
  send_filled(PEER_A, 1, 1.0f);
  session_node_pump(fx, updates_reach, (void *)1, "PEER_A's async update");
  ck_assert_uint_eq(s->peer_round[td__session_member(s, PEER_A)], 1);
  ck_assert_uint_eq(s->peer_round[td__session_member(s, PEER_B)], 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rounds");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, sync_round_closes_on_the_last_expected_update);
  tcase_add_test(tc, a_round_waits_for_our_own_update);
  tcase_add_test(tc, duplicate_and_late_updates_close_nothing_twice);
  tcase_add_test(tc, a_member_that_refused_or_died_is_not_waited_for);
  tcase_add_test(tc, the_deadline_closes_a_round_without_the_late_ones);
  tcase_add_test(tc, overlap_computes_ahead_of_the_open_round);
  tcase_add_test(tc, async_rounds_wait_for_nobody);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
