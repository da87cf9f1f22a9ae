/* test_dispatch.c: which received peer messages reach their handler
 * (daemon/dispatch.c), built on the node state of daemon/session/shared.h
 * with real parts under it: a CURVE access table and ledger in a temporary
 * directory and a transport listening on loopback. Nothing is sent; each
 * test hands td__dispatch() an envelope as the transport would and reads the
 * node's drop counters and member table.
 *
 * Asserted: a message with no sender or with our own id is dropped as
 * malformed; a member-only kind (heartbeat, run refusal) from a stranger is
 * dropped as not_member and reaches no handler; any other kind from a
 * stranger does reach its handler; a run stop or start from a member whose
 * key is not admitted, or admitted without admin, is refused as forbidden
 * before its handler, and the same stop from an admin key reaches it; an update ack from a member counts
 * as proof that it is alive. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "tests/unit/loop_node.h"

typedef struct {
  char dir[64];
  td__node_t n;
  uint64_t member; /* a known peer (alive), not admitted */
} fixture_t;

static fixture_t *fx;

static void setup(void) {
  fx = calloc(1, sizeof *fx);
  ck_assert_ptr_nonnull(fx);
  td__node_t *n = &fx->n;
  loop_node_open(n, fx->dir, sizeof fx->dir, "dispatch", 0);
  fx->member = 0x1111222233334444ull;
  ck_assert_int_eq(td_members_learn(n->members, fx->member, "tcp://127.0.0.1:9", td_clock_mono_s()),
                   1);
}

static void teardown(void) {
  loop_node_stop(&fx->n);
  loop_node_free(&fx->n, fx->dir);
  free(fx);
}

static uint64_t drops(td__drop_t kind) { return fx->n.drops.count[kind]; }

static void dispatch_eval_report(uint64_t sender) {
  Traind__EvalReport report = TRAIND__EVAL_REPORT__INIT;
  report.round = 1;
  report.loss = 0.5;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.sender = sender;
  env.run_id = 77;
  env.body_case = TRAIND__ENVELOPE__BODY_EVAL_REPORT;
  env.eval_report = &report;
  td__dispatch(&fx->n, &env, 64);
}

static void dispatch_run_stop(uint64_t sender) {
  Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.sender = sender;
  env.run_id = 77;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
  env.run_stop = &stop;
  td__dispatch(&fx->n, &env, 64);
}

/* A new key pair (in DIR/name), admitted here and known as a member. */
static uint64_t admitted_member(const char *name, bool admin) {
  char dir[96], why[256] = "";
  snprintf(dir, sizeof dir, "%s/%s", fx->dir, name);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  td_keypair_t kp;
  ck_assert_msg(td_keypair_load_or_create(dir, &kp, why, sizeof why) == 0, "%s", why);
  uint64_t id = td_key_node_id(kp.pub_raw);
  ck_assert_int_eq(td_members_learn(fx->n.members, id, "tcp://127.0.0.1:8", td_clock_mono_s()), 1);
  ck_assert_msg(td__access_allow(fx->n.access, kp.pub, admin, why, sizeof why) == 0, "%s", why);
  return id;
}

START_TEST(a_bad_sender_id_is_malformed) {
  dispatch_eval_report(0);
  ck_assert_uint_eq(drops(TD__DROP_MALFORMED), 1);
  dispatch_eval_report(fx->n.node_id); /* our own id: forged or looped back */
  ck_assert_uint_eq(drops(TD__DROP_MALFORMED), 2);
  ck_assert_uint_eq(drops(TD__DROP_WRONG_RUN), 0); /* no handler ran */
}
END_TEST

START_TEST(member_only_kinds_from_a_stranger_are_dropped) {
  uint64_t stranger = 0x5555666677778888ull;
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.sender = stranger;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  td__dispatch(&fx->n, &env, 32);
  ck_assert_uint_eq(drops(TD__DROP_NOT_MEMBER), 1);
  Traind__RunRefused refused = TRAIND__RUN_REFUSED__INIT;
  refused.reason = "no";
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_REFUSED;
  env.run_refused = &refused;
  td__dispatch(&fx->n, &env, 32);
  ck_assert_uint_eq(drops(TD__DROP_NOT_MEMBER), 2);
  ck_assert_ptr_null(td_members_find(fx->n.members, stranger)); /* not learned either */
}
END_TEST

START_TEST(other_kinds_from_a_stranger_reach_their_handler) {
  dispatch_eval_report(0x5555666677778888ull);
  /* the handler ran: it refuses an eval report for a run this node is not in */
  ck_assert_uint_eq(drops(TD__DROP_WRONG_RUN), 1);
  ck_assert_uint_eq(drops(TD__DROP_NOT_MEMBER), 0);
}
END_TEST

START_TEST(run_start_and_stop_need_an_admin_key) {
  dispatch_run_stop(fx->member);
  ck_assert_uint_eq(drops(TD__DROP_FORBIDDEN), 1);
  ck_assert_uint_eq(drops(TD__DROP_WRONG_RUN), 0); /* refused before the handler */
  Traind__RunStart start = TRAIND__RUN_START__INIT;
  start.spec = "model = mlp:784-10-10";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.sender = fx->member;
  env.run_id = 78;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &start;
  td__dispatch(&fx->n, &env, 64);
  ck_assert_uint_eq(drops(TD__DROP_FORBIDDEN), 2);
  ck_assert_ptr_null(fx->n.session); /* nothing started */

  /* a member whose key is admitted without admin: still refused */
  uint64_t plain = admitted_member("plain", false);
  dispatch_run_stop(plain);
  ck_assert_uint_eq(drops(TD__DROP_FORBIDDEN), 3);
  ck_assert_uint_eq(drops(TD__DROP_WRONG_RUN), 0);
  /* the same stop from a member whose key is admitted with admin */
  uint64_t admin = admitted_member("admin", true);
  dispatch_run_stop(admin);
  ck_assert_uint_eq(drops(TD__DROP_FORBIDDEN), 3);
  ck_assert_uint_eq(drops(TD__DROP_WRONG_RUN), 1); /* its handler: no such run here */
}
END_TEST

START_TEST(an_update_ack_from_a_member_proves_it_alive) {
  td_member_t *m = td_members_find(fx->n.members, fx->member);
  m->last_heard -= 100; /* long silent */
  double before = m->last_heard;
  Traind__Ack ack = TRAIND__ACK__INIT;
  ack.kind = TD__ACK_UPDATE;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.sender = fx->member;
  env.body_case = TRAIND__ENVELOPE__BODY_ACK;
  env.ack = &ack;
  td__dispatch(&fx->n, &env, 32);
  ck_assert(m->last_heard > before + 50);
  /* an eval report is not such proof */
  m->last_heard -= 100;
  before = m->last_heard;
  dispatch_eval_report(fx->member);
  ck_assert(m->last_heard == before);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dispatch");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, a_bad_sender_id_is_malformed);
  tcase_add_test(tc, member_only_kinds_from_a_stranger_are_dropped);
  tcase_add_test(tc, other_kinds_from_a_stranger_reach_their_handler);
  tcase_add_test(tc, run_start_and_stop_need_an_admin_key);
  tcase_add_test(tc, an_update_ack_from_a_member_proves_it_alive);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
