/* test_members.c: the failure detector with a fake clock. Silence makes a peer
 * suspect, then dead; hearing from it again readmits it; gossip adds unknown
 * peers only; the live list is sorted and excludes the dead; the table holds
 * 256 members (TD_MAX_NODES) and refuses the 257th, unless a member left or
 * has been dead for TD_MEMBERS_EVICT_AFTER_S: then the newcomer takes its
 * slot (never an alive, suspect or pinned member's). */
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
    ck_assert(td_members_has_room(m, id, 0));
    ck_assert_int_eq(td_members_heard(m, id, "tcp://peer", 0, &ev), 0);
    ck_assert_int_eq(ev, TD_MEMBER_JOINED);
  }
  ck_assert_uint_eq(td_members_count(m), 256);
  ck_assert(!td_members_has_room(m, 257, 0));
  ck_assert_int_eq(td_members_heard(m, 257, "tcp://one-too-many", 0, &ev), TD_ERANGE);
  ck_assert_int_eq(td_members_learn(m, 258, "tcp://gossiped", 0), 0); /* not taken */
  ck_assert_ptr_null(td_members_find(m, 258));
  ck_assert_ptr_null(td_members_find(m, 257));
  ck_assert_uint_eq(td_members_count(m), 256);
  /* a member of a full table is still heard, and may still ask again */
  ck_assert(td_members_has_room(m, 256, 1));
  ck_assert_int_eq(td_members_heard(m, 256, NULL, 1, &ev), 0);
  uint64_t ids[TD_MEMBERS_MAX];
  ck_assert_uint_eq(td_members_live(m, false, ids, TD_MEMBERS_MAX), 256);
  td_members_close(&m);
}
END_TEST

/* Fills a table of this node (1) and peers 2..256, all heard at t = 0. */
static td_members_t *full_table(void) {
  td_members_t *m = NULL;
  ck_assert_int_eq(td_members_open(&m, 1, "tcp://self", 1, 2), 0);
  td_member_event_t ev;
  for (uint64_t id = 2; id <= TD_MEMBERS_MAX; id++)
    ck_assert_int_eq(td_members_heard(m, id, "tcp://peer", 0, &ev), 0);
  ck_assert_uint_eq(td_members_count(m), TD_MEMBERS_MAX);
  return m;
}

typedef struct {
  uint64_t pinned; /* a run member: never evicted */
  uint64_t gone[4];
  td_peer_state_t gone_state[4];
  size_t n_gone;
} reuse_t;

static bool is_pinned(uint64_t node_id, void *user) {
  return node_id == ((reuse_t *)user)->pinned;
}

static void on_evicted(const td_member_t *p, void *user) {
  reuse_t *r = user;
  ck_assert_uint_lt(r->n_gone, 4);
  r->gone_state[r->n_gone] = p->state;
  r->gone[r->n_gone++] = p->node_id;
}

/* A member that left frees its slot at once: the next new node takes it (and
 * only that slot: the table stays at 256 and no one else is touched). */
START_TEST(a_member_that_left_gives_its_slot_at_once) {
  td_members_t *m = full_table();
  reuse_t r = {0};
  td_members_set_hooks(m, &(td_members_hooks_t){.evicted = on_evicted, .user = &r});
  td_member_event_t ev;
  ck_assert(!td_members_has_room(m, 300, 0.5));
  td_members_left(m, 77);
  ck_assert(td_members_has_room(m, 300, 0.5));
  ck_assert_int_eq(td_members_heard(m, 300, "tcp://new", 0.5, &ev), 0);
  ck_assert_int_eq(ev, TD_MEMBER_JOINED);
  ck_assert_uint_eq(td_members_count(m), TD_MEMBERS_MAX);
  ck_assert_ptr_null(td_members_find(m, 77));
  ck_assert_int_eq(td_members_find(m, 300)->state, TD_PEER_ALIVE);
  ck_assert_str_eq(td_members_find(m, 300)->endpoint, "tcp://new");
  ck_assert_uint_eq(r.n_gone, 1);
  ck_assert_uint_eq(r.gone[0], 77);
  ck_assert_int_eq(r.gone_state[0], TD_PEER_LEFT);
  ck_assert_uint_eq(td_members_evictions(m), 1);
  /* the slot is spent: the next one is refused again */
  ck_assert(!td_members_has_room(m, 301, 0.5));
  ck_assert_int_eq(td_members_heard(m, 301, "tcp://late", 0.5, &ev), TD_ERANGE);
  ck_assert_int_eq(td_members_learn(m, 302, "tcp://gossip", 0.5), 0);
  td_members_close(&m);
}
END_TEST

/* Dead members give their slot only once dead for TD_MEMBERS_EVICT_AFTER_S,
 * the one dead longest first; alive, suspect and pinned members never. */
START_TEST(the_member_dead_longest_is_evicted_past_the_bound) {
  td_members_t *m = full_table();
  reuse_t r = {.pinned = 10};
  td_members_set_hooks(m, &(td_members_hooks_t){.pinned = is_pinned, .evicted = on_evicted,
                                                .user = &r});
  td_member_event_t ev;
  /* everyone but 10, 20 and 30 keeps talking; 30 stops later than 10 and 20 */
  double t = 100;
  for (uint64_t id = 2; id <= TD_MEMBERS_MAX; id++)
    if (id != 10 && id != 20 && id != 30)
      td_members_heard(m, id, NULL, t, &ev);
  td_members_heard(m, 30, NULL, 50, &ev);
  td_members_tick(m, t, NULL, NULL);
  ck_assert_int_eq(td_members_find(m, 20)->state, TD_PEER_DEAD);
  ck_assert_int_eq(td_members_find(m, 30)->state, TD_PEER_DEAD);
  /* dead, but not for long enough */
  ck_assert(!td_members_has_room(m, 400, t));
  ck_assert_int_eq(td_members_heard(m, 400, "tcp://new", t, &ev), TD_ERANGE);
  /* past the bound for 10 (pinned) and 20, not yet for 30 (heard at 50) */
  t = 2 + TD_MEMBERS_EVICT_AFTER_S + 10;
  for (uint64_t id = 2; id <= TD_MEMBERS_MAX; id++)
    if (id != 10 && id != 20 && id != 30)
      td_members_heard(m, id, NULL, t, &ev);
  td_members_tick(m, t, NULL, NULL);
  ck_assert(td_members_has_room(m, 400, t));
  ck_assert_int_eq(td_members_heard(m, 400, "tcp://new", t, &ev), 0);
  ck_assert_int_eq(ev, TD_MEMBER_JOINED);
  ck_assert_uint_eq(r.n_gone, 1);
  ck_assert_uint_eq(r.gone[0], 20);
  ck_assert_int_eq(r.gone_state[0], TD_PEER_DEAD);
  ck_assert_ptr_null(td_members_find(m, 20));
  ck_assert_ptr_nonnull(td_members_find(m, 10)); /* a run member keeps its slot */
  ck_assert_ptr_nonnull(td_members_find(m, 400));
  /* 30 is next once it too passes the bound; the pinned 10 never */
  ck_assert_int_eq(td_members_heard(m, 401, "tcp://new", t, &ev), TD_ERANGE);
  t = 50 + 2 + TD_MEMBERS_EVICT_AFTER_S;
  ck_assert_int_eq(td_members_learn(m, 401, "tcp://gossip", t), 1);
  ck_assert_uint_eq(r.gone[1], 30);
  ck_assert_int_eq(td_members_heard(m, 402, "tcp://new", t + 1e6, &ev), TD_ERANGE);
  ck_assert_ptr_nonnull(td_members_find(m, 10));
  ck_assert_uint_eq(td_members_evictions(m), 2);
  /* the newcomer is a member like any other: alive, and in the live list */
  uint64_t ids[TD_MEMBERS_MAX];
  size_t live = td_members_live(m, false, ids, TD_MEMBERS_MAX);
  bool has_400 = false;
  for (size_t i = 0; i < live; i++)
    has_400 |= ids[i] == 400;
  ck_assert(has_400);
  td_members_close(&m);
}
END_TEST

/* Nothing alive or suspect is ever evicted, however long the table is full. */
START_TEST(alive_and_suspect_members_are_never_evicted) {
  td_members_t *m = full_table();
  td_member_event_t ev;
  double t = 1.5; /* after suspect_after_s, before dead_after_s: all suspect */
  td_members_tick(m, t, NULL, NULL);
  ck_assert_int_eq(td_members_find(m, 2)->state, TD_PEER_SUSPECT);
  ck_assert_int_eq(td_members_heard(m, 500, "tcp://new", 1e9, &ev), TD_ERANGE);
  ck_assert_int_eq(td_members_find(m, 2)->state, TD_PEER_SUSPECT);
  for (uint64_t id = 2; id <= TD_MEMBERS_MAX; id++)
    td_members_heard(m, id, NULL, 1e9, &ev);
  ck_assert(!td_members_has_room(m, 500, 1e9));
  ck_assert_uint_eq(td_members_evictions(m), 0);
  td_members_close(&m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("members");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, silence_suspects_then_kills_and_a_return_revives);
  tcase_add_test(tc, gossip_self_leave_and_capacity);
  tcase_add_test(tc, the_257th_node_is_refused);
  tcase_add_test(tc, a_member_that_left_gives_its_slot_at_once);
  tcase_add_test(tc, the_member_dead_longest_is_evicted_past_the_bound);
  tcase_add_test(tc, alive_and_suspect_members_are_never_evicted);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
