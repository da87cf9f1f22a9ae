/* test_relay.c: relayed frames (daemon/net/relay.h) as a target sees them.
 * A frame wrapped and signed by its origin is taken once; the same frame
 * again (a relay replaying it) is refused, as is one older than the window,
 * while frames that arrive out of order inside the window are all taken; a
 * changed byte of the message or of the sequence number breaks the origin's
 * signature; each origin has its own window; and an origin that restarts
 * continues above the numbers it used before. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/net/relay.h"

static char dir[64];

typedef struct {
  td_keypair_t keys;
  td__admission_t *adm;
  td__relays_t *relays;
  uint64_t id;
} node_t;

static void node_open(node_t *n, uint64_t id) {
  char why[256];
  ck_assert_int_eq(zmq_curve_keypair(n->keys.pub, n->keys.secret), 0);
  ck_assert_int_eq(td_key_decode(n->keys.pub, n->keys.pub_raw, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_open(&n->adm, dir, &n->keys, why, sizeof why), 0);
  ck_assert_int_eq(td__relays_open(&n->relays), 0);
  n->id = id;
}

static void node_close(node_t *n) {
  td__relays_close(&n->relays);
  ck_assert_ptr_null(n->relays);
  td__admission_close(&n->adm);
}

/* What the target receives for `text` sent by `from` through a relay. */
static Traind__Envelope *relayed(node_t *from, uint64_t target, const char *text) {
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(td__relay_wrap(from->relays, from->adm, from->id, target, 1,
                                  (const uint8_t *)text, strlen(text), &buf, &len), 0);
  Traind__Envelope *env = NULL;
  td_wire_refusal_t refusal;
  char why[256];
  ck_assert_int_eq(td_wire_unpack_peer(&env, buf, len, &refusal, why, sizeof why), 0);
  free(buf);
  ck_assert_int_eq(env->body_case, TRAIND__ENVELOPE__BODY_RELAY);
  ck_assert_uint_eq(env->relay->origin, from->id);
  ck_assert_uint_eq(env->relay->target, target);
  ck_assert_mem_eq(env->relay->inner.data, text, strlen(text));
  return env;
}

static td__relay_verdict_t accept_at(node_t *to, node_t *from, Traind__Envelope *env) {
  return td__relay_accept(to->relays, env->relay, td__admission_sign_pub(from->adm));
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/td-relay-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

START_TEST(a_replayed_frame_is_refused) {
  node_t origin, target;
  node_open(&origin, 0x1111);
  node_open(&target, 0x2222);
  Traind__Envelope *first = relayed(&origin, target.id, "run start");
  Traind__Envelope *second = relayed(&origin, target.id, "heartbeat");
  ck_assert_uint_eq(second->relay->seq, first->relay->seq + 1);
  ck_assert_int_eq(accept_at(&target, &origin, first), TD__RELAY_OK);
  ck_assert_int_eq(accept_at(&target, &origin, second), TD__RELAY_OK);
  /* the relay sends both again: signed and unchanged, and refused */
  ck_assert_int_eq(accept_at(&target, &origin, first), TD__RELAY_REPLAYED);
  ck_assert_int_eq(accept_at(&target, &origin, second), TD__RELAY_REPLAYED);
  td_wire_free(&first);
  td_wire_free(&second);
  node_close(&origin);
  node_close(&target);
}
END_TEST

START_TEST(out_of_order_inside_the_window_is_taken_once) {
  node_t origin, target;
  node_open(&origin, 0x1111);
  node_open(&target, 0x2222);
  Traind__Envelope *env[5];
  for (int i = 0; i < 5; i++)
    env[i] = relayed(&origin, target.id, "update chunk");
  int order[5] = {4, 0, 2, 1, 3}; /* the bulk connection overtaken by control */
  for (int i = 0; i < 5; i++)
    ck_assert_int_eq(accept_at(&target, &origin, env[order[i]]), TD__RELAY_OK);
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(accept_at(&target, &origin, env[i]), TD__RELAY_REPLAYED);
    td_wire_free(&env[i]);
  }
  node_close(&origin);
  node_close(&target);
}
END_TEST

START_TEST(a_frame_older_than_the_window_is_refused) {
  node_t origin, target;
  node_open(&origin, 0x1111);
  node_open(&target, 0x2222);
  Traind__Envelope *old = relayed(&origin, target.id, "held back by the relay");
  for (int i = 0; i < TD__RELAY_WINDOW; i++) {
    Traind__Envelope *e = relayed(&origin, target.id, "later");
    if (i == TD__RELAY_WINDOW - 1)
      ck_assert_int_eq(accept_at(&target, &origin, e), TD__RELAY_OK);
    td_wire_free(&e);
  }
  ck_assert_int_eq(accept_at(&target, &origin, old), TD__RELAY_REPLAYED);
  td_wire_free(&old);
  node_close(&origin);
  node_close(&target);
}
END_TEST

START_TEST(the_sequence_number_is_signed) {
  node_t origin, target;
  node_open(&origin, 0x1111);
  node_open(&target, 0x2222);
  Traind__Envelope *env = relayed(&origin, target.id, "heartbeat");
  env->relay->seq += 7; /* a relay dressing an old frame up as a new one */
  ck_assert_int_eq(accept_at(&target, &origin, env), TD__RELAY_FORGED);
  env->relay->seq -= 7;
  env->relay->inner.data[0] ^= 0x01;
  ck_assert_int_eq(accept_at(&target, &origin, env), TD__RELAY_FORGED);
  env->relay->inner.data[0] ^= 0x01;
  /* another node's signing key does not verify it either */
  ck_assert_int_eq(td__relay_accept(target.relays, env->relay, td__admission_sign_pub(target.adm)),
                   TD__RELAY_FORGED);
  ck_assert_int_eq(accept_at(&target, &origin, env), TD__RELAY_OK); /* forgeries took no seq */
  td_wire_free(&env);
  node_close(&origin);
  node_close(&target);
}
END_TEST

START_TEST(each_origin_has_its_own_window_and_a_restart_continues_above) {
  node_t a, b, target;
  node_open(&a, 0x1111);
  node_open(&b, 0x3333);
  node_open(&target, 0x2222);
  Traind__Envelope *ea = relayed(&a, target.id, "from a");
  Traind__Envelope *eb = relayed(&b, target.id, "from b");
  ck_assert_int_eq(accept_at(&target, &a, ea), TD__RELAY_OK);
  ck_assert_int_eq(accept_at(&target, &b, eb), TD__RELAY_OK);
  uint64_t last = ea->relay->seq;
  td_wire_free(&ea);
  td_wire_free(&eb);
  /* a restarts: its new relay state starts above every number it used */
  td__relays_close(&a.relays);
  ck_assert_int_eq(td__relays_open(&a.relays), 0);
  ea = relayed(&a, target.id, "from a, restarted");
  ck_assert_uint_gt(ea->relay->seq, last);
  ck_assert_int_eq(accept_at(&target, &a, ea), TD__RELAY_OK);
  td_wire_free(&ea);
  node_close(&a);
  node_close(&b);
  node_close(&target);
}
END_TEST

int main(void) {
  Suite *s = suite_create("relay");
  TCase *tc = tcase_create("relay");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, a_replayed_frame_is_refused);
  tcase_add_test(tc, out_of_order_inside_the_window_is_taken_once);
  tcase_add_test(tc, a_frame_older_than_the_window_is_refused);
  tcase_add_test(tc, the_sequence_number_is_signed);
  tcase_add_test(tc, each_origin_has_its_own_window_and_a_restart_continues_above);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
