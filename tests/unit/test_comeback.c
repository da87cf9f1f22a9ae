/* test_comeback.c: when a member's heartbeat gets it marked away from this
 * node's run (daemon/session/comeback.c), built on a node state with real
 * parts under it (a ledger in a temporary directory, a transport on
 * loopback, the member table) and a session of three members at round 10,
 * whose collector is real.
 *
 * Asserted: a member a round or two behind stays in; one more than
 * TD__BEHIND_ROUNDS behind, or idle (its heartbeat names no run), is marked
 * away and no longer waited for in the open round; nothing is judged within
 * the grace beats after its (re)admission, in the run's first rounds, or
 * near the run's end; async members drift apart by design, so one that is
 * behind but still running is not marked; a heartbeat from a node outside
 * the run, or from a member that refused it, changes nothing. A member
 * marked away more than TD__AWAY_TIMES_MAX times with no update in between
 * is put out of the run for its remainder and never waited for again; this node concludes it fell
 * behind only when a majority of its other members, and more than one of
 * them, say they are ahead (issue 37, rows 5 and 10). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/session/shared.h"
#include "tests/unit/loop_node.h"

#define SELF 1
#define PEER_A 2
#define PEER_B 3
#define RUN 42

typedef struct {
  char dir[64];
  td__node_t n;
  td__session_t s;
  td_layout_t *layout;
} fixture_t;

static fixture_t *fx;

static void setup(void) {
  fx = calloc(1, sizeof *fx);
  ck_assert_ptr_nonnull(fx);
  td__node_t *n = &fx->n;
  loop_node_open(n, fx->dir, sizeof fx->dir, "comeback", SELF);
  n->heartbeat_s = 0.2;
  double now = td_clock_mono_s();
  ck_assert_int_eq(td_members_learn(n->members, PEER_A, "tcp://127.0.0.1:9", now), 1);
  ck_assert_int_eq(td_members_learn(n->members, PEER_B, "tcp://127.0.0.1:8", now), 1);

  /* a sync run of three members at round 10 of 100, everyone in from round 1 */
  td__session_t *s = &fx->s;
  s->node = n;
  s->run_id = RUN;
  s->state = TD__RUN_RUNNING;
  td_runspec_defaults(&s->spec);
  s->spec.mode_kind = TD_MODE_SYNC;
  uint64_t members[] = {SELF, PEER_A, PEER_B};
  memcpy(s->members, members, sizeof members);
  s->n_members = 3;
  for (size_t i = 0; i < 3; i++)
    s->since[i] = 1; /* since_at 0: admitted long ago */
  s->first_round = 1;
  s->round = 10;
  s->rounds = 100;
  s->ready = true;
  uint32_t shape[1] = {16};
  ck_assert_int_eq(td_layout_new(&fx->layout), 0);
  ck_assert_int_eq(td_layout_add(fx->layout, "w", 1, shape), 0);
  ck_assert_int_eq(td_round_open(&s->collector, fx->layout), 0);
  uint64_t peers[] = {PEER_A, PEER_B};
  td_round_begin(s->collector, 10, peers, 2);
  ck_assert_int_eq(td__join_open(&s->join, s), 0);
  n->session = s;
}

static void teardown(void) {
  td__node_t *n = &fx->n;
  n->session = NULL;
  td__join_close(&fx->s.join);
  td_round_close(&fx->s.collector);
  td_layout_free(&fx->layout);
  loop_node_stop(n);
  loop_node_free(n, fx->dir);
  free(fx);
}

/* Is `peer` still waited for in the open round? */
static bool waited_for(uint64_t peer) {
  uint64_t missing[4];
  size_t k = td_round_missing(fx->s.collector, missing, 4);
  for (size_t i = 0; i < k; i++)
    if (missing[i] == peer)
      return true;
  return false;
}

START_TEST(a_member_slightly_behind_stays_in) {
  td__comeback_heard(&fx->n, PEER_A, RUN, 9);
  td__comeback_heard(&fx->n, PEER_A, RUN, 10 - TD__BEHIND_ROUNDS); /* exactly the bound */
  ck_assert(!fx->s.away[1]);
  ck_assert_uint_eq(fx->s.heard_round[1], 10 - TD__BEHIND_ROUNDS);
  ck_assert(waited_for(PEER_A));
}
END_TEST

START_TEST(a_member_far_behind_or_idle_is_away) {
  td__comeback_heard(&fx->n, PEER_A, RUN, 10 - TD__BEHIND_ROUNDS - 1);
  ck_assert(fx->s.away[1]);
  ck_assert(!waited_for(PEER_A));
  ck_assert(waited_for(PEER_B));
  td__comeback_heard(&fx->n, PEER_B, 0, 0); /* idle: it left the run */
  ck_assert(fx->s.away[2]);
  ck_assert(!waited_for(PEER_B));
}
END_TEST

START_TEST(nothing_is_judged_in_the_grace_beats_first_rounds_or_near_the_end) {
  fx->s.since_at[1] = td_clock_mono_s(); /* just (re)admitted */
  td__comeback_heard(&fx->n, PEER_A, 0, 0);
  ck_assert(!fx->s.away[1]);
  fx->s.since_at[1] = 0;
  fx->s.round = 1; /* the first round: everyone is waited for */
  td__comeback_heard(&fx->n, PEER_A, 0, 0);
  ck_assert(!fx->s.away[1]);
  fx->s.round = 10;
  fx->s.rounds = 10 + TD__JOIN_LEAD_ROUNDS; /* a finished member says it is idle */
  td__comeback_heard(&fx->n, PEER_A, 0, 0);
  ck_assert(!fx->s.away[1]);
  ck_assert(waited_for(PEER_A));
}
END_TEST

START_TEST(async_members_drift_apart) {
  fx->s.spec.mode_kind = TD_MODE_ASYNC;
  fx->s.own_done = 20;
  td__comeback_heard(&fx->n, PEER_A, RUN, 3); /* far behind, still running */
  ck_assert(!fx->s.away[1]);
  ck_assert_uint_eq(fx->s.heard_round[1], 3);
}
END_TEST

START_TEST(strangers_and_refusers_change_nothing) {
  td__comeback_heard(&fx->n, 99, 0, 0);
  fx->s.since[2] = UINT64_MAX; /* PEER_B refused the run */
  td__comeback_heard(&fx->n, PEER_B, 0, 0);
  td__comeback_heard(&fx->n, PEER_B, RUN, 3);
  ck_assert(!fx->s.away[1] && !fx->s.away[2]);
  ck_assert_uint_eq(fx->s.heard_round[2], 0); /* not even its round is noted */
  ck_assert(waited_for(PEER_A) && waited_for(PEER_B));
}
END_TEST

START_TEST(a_member_away_too_often_is_put_out) {
  td__session_t *s = &fx->s;
  for (unsigned k = 1; k <= TD__AWAY_TIMES_MAX; k++) {
    td__comeback_heard(&fx->n, PEER_A, 0, 0); /* idle again */
    ck_assert_msg(s->away[1] && !s->out[1], "away %u", k);
    s->away[1] = false; /* taken back (join.c's add_member) at an earlier round */
    s->since[1] = 5;
    td_round_begin(s->collector, 10, (uint64_t[]){PEER_A, PEER_B}, 2);
  }
  td__comeback_heard(&fx->n, PEER_A, 0, 0); /* once more than allowed */
  ck_assert(s->out[1]);
  ck_assert(!s->away[1]); /* so the admitter never takes it back */
  ck_assert_uint_eq(s->since[1], UINT64_MAX);
  ck_assert_uint_eq(s->away_times[1], TD__AWAY_TIMES_MAX + 1);
  ck_assert(!td__session_takes_part(s, 1, 0));
  ck_assert(!waited_for(PEER_A));
  ck_assert(waited_for(PEER_B));
  ck_assert_ptr_nonnull(strstr(s->refused, "put out"));
  td__comeback_heard(&fx->n, PEER_A, 0, 0); /* nothing changes any more */
  ck_assert_uint_eq(s->away_times[1], TD__AWAY_TIMES_MAX + 1);
}
END_TEST

START_TEST(ahead_needs_a_majority_of_more_than_one) {
  ck_assert(!td__comeback_fell_behind(1, 1)); /* a run of two: the other's word alone */
  ck_assert(!td__comeback_fell_behind(2, 1));
  ck_assert(td__comeback_fell_behind(2, 2)); /* both others of three */
  ck_assert(!td__comeback_fell_behind(3, 2)); /* two colluders of four: half, not more */
  ck_assert(td__comeback_fell_behind(3, 3));
  ck_assert(!td__comeback_fell_behind(4, 2));
  ck_assert(td__comeback_fell_behind(4, 3)); /* three of five: a majority of the run */
  ck_assert(!td__comeback_fell_behind(5, 3)); /* three of six: half */
  ck_assert(td__comeback_fell_behind(5, 4));
  ck_assert(!td__comeback_fell_behind(0, 0));
}
END_TEST

START_TEST(one_member_claiming_far_ahead_does_not_push_the_node_out) {
  fx->s.n_members = 2; /* a run of this node and PEER_A */
  td__comeback_heard(&fx->n, PEER_A, RUN, 10 + 1000);
  ck_assert_ptr_eq(fx->n.session, &fx->s); /* the session goes on */
  ck_assert_uint_eq(fx->s.heard_round[1], 1010);
  fx->s.n_members = 3; /* of three: one of two others is not a majority */
  td__comeback_heard(&fx->n, PEER_A, RUN, 10 + 1000);
  ck_assert_ptr_eq(fx->n.session, &fx->s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("comeback");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, a_member_slightly_behind_stays_in);
  tcase_add_test(tc, a_member_far_behind_or_idle_is_away);
  tcase_add_test(tc, nothing_is_judged_in_the_grace_beats_first_rounds_or_near_the_end);
  tcase_add_test(tc, async_members_drift_apart);
  tcase_add_test(tc, strangers_and_refusers_change_nothing);
  tcase_add_test(tc, a_member_away_too_often_is_put_out);
  tcase_add_test(tc, ahead_needs_a_majority_of_more_than_one);
  tcase_add_test(tc, one_member_claiming_far_ahead_does_not_push_the_node_out);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
