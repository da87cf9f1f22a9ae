/* loop_node.h: the small node of real parts that the loop-thread unit tests
 * build by hand (test_dispatch, test_control, test_comeback, and through
 * session_node.h test_rounds and test_session): an access table and a SQLite
 * ledger in a fresh temporary directory, a transport bound on loopback that
 * nobody sends to, and the member table. Each test adds what it needs on top
 * (peers it knows, a control socket, a session). Included by one test file
 * each. */
#ifndef TD_TEST_LOOP_NODE_H
#define TD_TEST_LOOP_NODE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/session/shared.h"

static inline void loop_node_on_received(void *user, const Traind__Envelope *env, size_t bytes) {
  (void)user, (void)env, (void)bytes; /* nothing is sent to this node */
}

/* Open the parts under n in a new directory /tmp/td_TAG.XXXXXX (written to
 * dir). node_id 0: a secure node whose id is its key's; else an insecure
 * node with that id. */
static inline void loop_node_open(td__node_t *n, char *dir, size_t dir_len, const char *tag,
                                  uint64_t node_id) {
  snprintf(dir, dir_len, "/tmp/td_%s.XXXXXX", tag);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char why[256] = "", path[128];
  ck_assert_int_eq(uv_loop_init(&n->loop), 0);
  ck_assert_msg(td__access_open(&n->access, dir, node_id != 0, why, sizeof why) == 0, "%s", why);
  n->node_id = node_id != 0 ? node_id : td__access_node_id(n->access);
  snprintf(path, sizeof path, "%s/traind.db", dir);
  ck_assert_msg(td__ledgerq_open(&n->ledger, &n->loop, path, why, sizeof why) == 0, "%s", why);
  td__transport_opts_t net = {.loop = &n->loop, .node_id = n->node_id, .access = n->access,
                              .drops = &n->drops, .listen = "tcp://127.0.0.1:0",
                              .events = {.received = loop_node_on_received, .user = n}};
  ck_assert_msg(td__transport_open(&n->net, &net, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(td_members_open(&n->members, n->node_id, td__transport_endpoint(n->net), 3.0,
                                   6.0),
                   0);
  td__transport_set_members(n->net, n->members);
}

/* Stop the parts and run the loop until their handles are closed (pool jobs
 * that still hold something end here). */
static inline void loop_node_stop(td__node_t *n) {
  td__transport_stop(n->net);
  td__ledgerq_stop(n->ledger);
  uv_run(&n->loop, UV_RUN_DEFAULT);
}

/* Free what loop_node_open opened (after loop_node_stop) and remove dir. */
static inline void loop_node_free(td__node_t *n, const char *dir) {
  td__transport_close(&n->net);
  td__ledgerq_close(&n->ledger);
  td_members_close(&n->members);
  td__access_close(&n->access);
  uv_loop_close(&n->loop);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

#endif
