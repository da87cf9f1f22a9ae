/* test_members.c: the failure detector with a fake clock. Silence makes a peer
 * suspect, then dead; hearing from it again readmits it; gossip adds unknown
 * peers only; the live list is sorted and excludes the dead; the table holds
 * 256 members (TD_MAX_NODES) and refuses the 257th. */
#include <check.h>
#include <stdlib.h>

#include "common/error.h"
#include "daemon/base/members.h"

typedef struct {
  int suspected, died;
  uint64_t last;
} seen_t;

static void on_event(const td_member_t *p, td_member_event_t ev, void *user) {
  seen_t *s = user;
  s->suspected += ev == TD_MEMBER_SUSPECTED;
  s->died += ev == TD_MEMBER_DIED;
  s->last = p->node_id;
}

START_TEST(silence_suspects_then_kills_and_a_return_revives) {
  td_members_t *m = NULL;
  ck_assert_int_eq(td_members_open(&m, 50, "tcp://127.0.0.1:1", 1.5, 3.0), 0);
  td_member_event_t ev;
  ck_assert_int_eq(td_members_heard(m, 20, "tcp://127.0.0.1:2", 0.0, &ev), 0);
  ck_assert_int_eq(ev, TD_MEMBER_JOINED);
  ck_assert_int_eq(td_members_heard(m, 90, "tcp://127.0.0.1:3", 0.0, &ev), 0);
  seen_t s = {0};
  td_members_tick(m, 1.0, on_event, &s);
  ck_assert_int_eq(s.suspected + s.died, 0);
  td_members_heard(m, 90, NULL, 1.0, &ev); /* 90 keeps talking, 20 goes quiet */
  ck_assert_int_eq(ev, TD_MEMBER_NOCHANGE);
  td_members_tick(m, 1.6, on_event, &s);
  ck_assert_int_eq(s.suspected, 1);
  ck_assert_uint_eq(s.last, 20);
  ck_assert_int_eq(td_members_find(m, 20)->state, TD_PEER_SUSPECT);
  uint64_t ids[8];
  ck_assert_uint_eq(td_members_live(m, false, ids, 8), 2);
  ck_assert_uint_eq(td_members_live(m, true, ids, 8), 3);
  ck_assert_uint_eq(ids[0], 20); /* sorted */
  ck_assert_uint_eq(ids[2], 90);
  td_members_heard(m, 90, NULL, 3.0, &ev);
  td_members_tick(m, 3.1, on_event, &s);
  ck_assert_int_eq(s.died, 1);
  ck_assert_int_eq(td_members_find(m, 20)->state, TD_PEER_DEAD);
  td_members_tick(m, 10.0, on_event, &s); /* dead stays dead, no repeat event */
  ck_assert_int_eq(s.died, 2);            /* ... but 90 went quiet too */
  ck_assert_int_eq(td_members_heard(m, 20, "tcp://127.0.0.1:4", 11.0, &ev), 0);
  ck_assert_int_eq(ev, TD_MEMBER_REVIVED);
  ck_assert_str_eq(td_members_find(m, 20)->endpoint, "tcp://127.0.0.1:4");
  ck_assert_uint_eq(td_members_live(m, false, ids, 8), 2); /* self + 20 */
  td_members_close(&m);
  ck_assert_ptr_null(m);
}
END_TEST

START_TEST(gossip_self_leave_and_capacity) {
  td_members_t *m = NULL;
  ck_assert_int_eq(td_members_open(&m, 1, "tcp://a", 1, 2), 0);
  ck_assert_int_eq(td_members_learn(m, 2, "tcp://b", 0), 1);
  ck_assert_int_eq(td_members_learn(m, 2, "tcp://other", 0), 0);
  ck_assert_str_eq(td_members_find(m, 2)->endpoint, "tcp://b");
  td_member_event_t ev;
  td_members_heard(m, 1, "tcp://spoof", 0, &ev); /* the local node never changes */
  ck_assert_str_eq(td_members_find(m, 1)->endpoint, "tcp://a");
  td_members_tick(m, 100, NULL, NULL);
  ck_assert_int_eq(td_members_find(m, 1)->state, TD_PEER_ALIVE);
  td_members_left(m, 2);
  ck_assert_int_eq(td_members_find(m, 2)->state, TD_PEER_LEFT);
  for (uint64_t id = 10; id < 10 + TD_MEMBERS_MAX; id++)
    td_members_learn(m, id, "tcp://x", 0);
  ck_assert_uint_eq(td_members_count(m), TD_MEMBERS_MAX);
  ck_assert_int_eq(td_members_heard(m, 999, "tcp://full", 0, &ev), TD_ERANGE);
  ck_assert_str_eq(td_peer_state_name(TD_PEER_SUSPECT), "suspect");
  td_members_close(&m);
}
END_TEST

/* 256 members fit (this node and 255 peers); the 257th is refused whether it
 * says hello or is gossiped, and a member already in keeps its place. */
START_TEST(the_257th_node_is_refused) {
  ck_assert_int_eq(TD_MEMBERS_MAX, 256);
  td_members_t *m = NULL;
  ck_assert_int_eq(td_members_open(&m, 1, "tcp://self", 1, 2), 0);
  td_member_event_t ev;
  for (uint64_t id = 2; id <= 256; id++) {
    ck_assert(td_members_has_room(m, id));
    ck_assert_int_eq(td_members_heard(m, id, "tcp://peer", 0, &ev), 0);
    ck_assert_int_eq(ev, TD_MEMBER_JOINED);
  }
  ck_assert_uint_eq(td_members_count(m), 256);
  ck_assert(!td_members_has_room(m, 257));
  ck_assert_int_eq(td_members_heard(m, 257, "tcp://one-too-many", 0, &ev), TD_ERANGE);
  ck_assert_int_eq(td_members_learn(m, 258, "tcp://gossiped", 0), 0); /* not taken */
  ck_assert_ptr_null(td_members_find(m, 258));
  ck_assert_ptr_null(td_members_find(m, 257));
  ck_assert_uint_eq(td_members_count(m), 256);
  /* a member of a full table is still heard, and may still ask again */
  ck_assert(td_members_has_room(m, 256));
  ck_assert_int_eq(td_members_heard(m, 256, NULL, 1, &ev), 0);
  uint64_t ids[TD_MEMBERS_MAX];
  ck_assert_uint_eq(td_members_live(m, false, ids, TD_MEMBERS_MAX), 256);
  td_members_close(&m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("members");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, silence_suspects_then_kills_and_a_return_revives);
  tcase_add_test(tc, gossip_self_leave_and_capacity);
  tcase_add_test(tc, the_257th_node_is_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
