/* test_control.c: trainctl's commands as the control socket answers them
 * (daemon/control*.c), on a node state with real parts under it (a CURVE
 * access table and a ledger in a temporary directory, a transport on
 * loopback) and a real unix socket. A client thread makes each call with
 * td_control_call(), as trainctl does, while this thread runs the loop.
 *
 * Asserted: status names this node; key gives its public key and says
 * curve; allow refuses a malformed key with a reason and admits nothing,
 * then admits a good one (as admin) and lists it; revoke refuses a key that
 * is not listed and removes one that is; stop without a run says so; leave
 * answers, then shuts the node down through the node's shutdown callback. */
#include <check.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/internal.h"
#include "tests/unit/loop_node.h"
#include "proto/control.h"

typedef struct {
  char dir[64];
  td__node_t n;
  char shutdown_why[64];
} fixture_t;

static fixture_t *fx;

/* The node's shutdown, as the test sees it: noted, and the socket closed. */
static void note_shutdown(td__node_t *n, const char *why) {
  snprintf(fx->shutdown_why, sizeof fx->shutdown_why, "%s", why);
  td__control_stop(n->control);
}

static void setup(void) {
  fx = calloc(1, sizeof *fx);
  ck_assert_ptr_nonnull(fx);
  td__node_t *n = &fx->n;
  loop_node_open(n, fx->dir, sizeof fx->dir, "control", 0);
  n->shutdown = note_shutdown;
  snprintf(n->data_dir, sizeof n->data_dir, "%s", fx->dir);
  snprintf(n->control_path, sizeof n->control_path, "%s/ctl", fx->dir);
  char why[256] = "";
  ck_assert_msg(td__control_open(&n->control, n, why, sizeof why) == 0, "%s", why);
}

static void teardown(void) {
  td__node_t *n = &fx->n;
  td__control_stop(n->control);
  loop_node_stop(n);
  td__control_close(&n->control);
  loop_node_free(n, fx->dir);
  free(fx);
}

typedef struct {
  Traind__ControlRequest *req;
  Traind__ControlResponse *resp;
  int rc;
  char why[256];
  atomic_bool done;
} call_t;

static void *client(void *arg) {
  call_t *c = arg;
  c->rc = td_control_call(fx->n.control_path, c->req, 5000, &c->resp, c->why, sizeof c->why);
  atomic_store(&c->done, true);
  return NULL;
}

/* One request, answered while this thread runs the loop. Caller frees. */
static Traind__ControlResponse *call(Traind__ControlRequest *req) {
  call_t c = {.req = req};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, client, &c), 0);
  while (!atomic_load(&c.done)) {
    uv_run(&fx->n.loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  pthread_join(t, NULL);
  ck_assert_msg(c.rc == 0, "%s", c.why);
  return c.resp;
}

static Traind__ControlResponse *simple(Traind__ControlRequest__Command command, const char *key,
                                      bool admin) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = command;
  req.key = (char *)(key ? key : "");
  req.admin = admin;
  return call(&req);
}

/* The JSON string at `field` of the answer (borrowed until *o is put). */
static const char *field(Traind__ControlResponse *resp, json_object **o, const char *name) {
  *o = json_tokener_parse(resp->json);
  ck_assert_ptr_nonnull(*o);
  json_object *v = NULL;
  ck_assert_msg(json_object_object_get_ex(*o, name, &v), "no %s in %s", name, resp->json);
  return json_object_get_string(v);
}

START_TEST(status_and_key_name_this_node) {
  Traind__ControlResponse *r = simple(TRAIND__CONTROL_REQUEST__COMMAND__STATUS, NULL, false);
  ck_assert_int_eq(r->status, 0);
  json_object *o;
  char id[24];
  snprintf(id, sizeof id, "%016" PRIx64, fx->n.node_id);
  ck_assert_str_eq(field(r, &o, "node_id"), id);
  json_object_put(o);
  td_wire_free_response(&r);

  r = simple(TRAIND__CONTROL_REQUEST__COMMAND__KEY, NULL, false);
  ck_assert_int_eq(r->status, 0);
  ck_assert_str_eq(field(r, &o, "key"), td__access_keypair(fx->n.access)->pub);
  json_object_put(o);
  ck_assert_str_eq(field(r, &o, "security"), "curve");
  json_object_put(o);
  td_wire_free_response(&r);
}
END_TEST

START_TEST(allow_and_revoke_keys) {
  Traind__ControlResponse *r = simple(TRAIND__CONTROL_REQUEST__COMMAND__ALLOW, "abc", true);
  ck_assert_int_ne(r->status, 0);
  ck_assert_str_ne(r->error, "");
  ck_assert_uint_eq(td__access_count(fx->n.access), 0); /* nothing admitted */
  td_wire_free_response(&r);

  char dir[96], why[256] = "";
  snprintf(dir, sizeof dir, "%s/peer", fx->dir);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  td_keypair_t kp;
  ck_assert_msg(td_keypair_load_or_create(dir, &kp, why, sizeof why) == 0, "%s", why);
  r = simple(TRAIND__CONTROL_REQUEST__COMMAND__REVOKE, kp.pub, false);
  ck_assert_int_eq(r->status, TD_ENOENT); /* not listed yet */
  td_wire_free_response(&r);

  r = simple(TRAIND__CONTROL_REQUEST__COMMAND__ALLOW, kp.pub, true);
  ck_assert_int_eq(r->status, 0);
  ck_assert_uint_eq(td__access_count(fx->n.access), 1);
  ck_assert(td__access_may_run(fx->n.access, td_key_node_id(kp.pub_raw)));
  json_object *o;
  ck_assert_str_eq(field(r, &o, "key"), kp.pub);
  json_object_put(o);
  td_wire_free_response(&r);

  r = simple(TRAIND__CONTROL_REQUEST__COMMAND__REVOKE, kp.pub, false);
  ck_assert_int_eq(r->status, 0);
  ck_assert_str_eq(field(r, &o, "revoked"), "true");
  json_object_put(o);
  ck_assert_uint_eq(td__access_count(fx->n.access), 0);
  td_wire_free_response(&r);
}
END_TEST

START_TEST(stop_without_a_run_says_so) {
  Traind__ControlResponse *r = simple(TRAIND__CONTROL_REQUEST__COMMAND__STOP, NULL, false);
  ck_assert_int_eq(r->status, TD_EINVAL);
  ck_assert_str_eq(r->error, "no run is running");
  td_wire_free_response(&r);
}
END_TEST

START_TEST(leave_answers_then_shuts_the_node_down) {
  Traind__ControlResponse *r = simple(TRAIND__CONTROL_REQUEST__COMMAND__LEAVE, NULL, false);
  ck_assert_int_eq(r->status, 0);
  json_object *o;
  char id[24];
  snprintf(id, sizeof id, "%016" PRIx64, fx->n.node_id);
  ck_assert_str_eq(field(r, &o, "left"), id);
  json_object_put(o);
  td_wire_free_response(&r);
  ck_assert_str_eq(fx->shutdown_why, "trainctl leave");
}
END_TEST

int main(void) {
  Suite *s = suite_create("control");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, status_and_key_name_this_node);
  tcase_add_test(tc, allow_and_revoke_keys);
  tcase_add_test(tc, stop_without_a_run_says_so);
  tcase_add_test(tc, leave_answers_then_shuts_the_node_down);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
