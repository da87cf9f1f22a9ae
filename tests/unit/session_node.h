/* session_node.h: what the session tests (test_rounds, test_session) share:
 * a node state with real parts under it (an access table and a ledger in a
 * temporary directory, a transport on loopback, the member table knowing two
 * peers at endpoints nobody listens on, a policy whose data root is that
 * directory), a tiny CSV dataset written there, a run spec for `mlp:3-3` on
 * it, the loop pumped until a condition holds, and a peer's update message
 * made with the real link codec. Sessions are started with
 * td__session_start(), so their compute thread (daemon/run/) is real too.
 * Included by one test file each. */
#ifndef TD_TEST_SESSION_NODE_H
#define TD_TEST_SESSION_NODE_H

#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/session/shared.h"
#include "proto/limits.h"
#include "tests/unit/loop_node.h"

#define SELF 1
#define PEER_A 2
#define PEER_B 3
#define RUN 42
/* Generous bound on waiting for the compute thread or the work pool: a
 * guard against a hang (valgrind, a loaded machine), never a timing check. */
#define PUMP_LIMIT_S 120.0

typedef struct {
  char dir[64];
  td__node_t n;
} session_node_t;

static inline void session_node_write_csv(const char *dir, const char *name, int rows, int salt) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < rows; i++) /* three classes, three features */
    fprintf(f, "%d,%d.5,%d.25,%d\n", i % 3, (i + salt) % 3 * 2, (i + salt) % 5, i % 7);
  fclose(f);
}

static inline void session_node_open(session_node_t *sn, const char *tag) {
  td__node_t *n = &sn->n;
  loop_node_open(n, sn->dir, sizeof sn->dir, tag, SELF);
  session_node_write_csv(sn->dir, "train.csv", 60, 0);
  session_node_write_csv(sn->dir, "test.csv", 30, 1);
  char why[256] = "";
  n->heartbeat_s = 0.2;
  n->threads = 1;
  td__policy_opts_t po = {.data_root = sn->dir};
  ck_assert_msg(td__policy_init(&n->policy, &po, why, sizeof why) == 0, "%s", why);
  double now = td_clock_mono_s();
  ck_assert_int_eq(td_members_learn(n->members, PEER_A, "tcp://127.0.0.1:9", now), 1);
  ck_assert_int_eq(td_members_learn(n->members, PEER_B, "tcp://127.0.0.1:8", now), 1);
}

static inline void session_node_close(session_node_t *sn) {
  td__node_t *n = &sn->n;
  if (n->session != NULL)
    td__session_finish(n, TD__RUN_STOPPED, NAN, "the test ended");
  loop_node_stop(n); /* pool jobs still holding the session end here */
  free(n->last_run);
  n->last_run = NULL;
  loop_node_free(n, sn->dir);
}

/* The spec text of a run on the fixture's dataset: 3 features, 3 classes,
 * one local step of a global batch of 6 per round (2 rows per member of 3),
 * plus `extra` ("key = value" lines, may be ""). Caller frees. */
static inline char *session_node_spec(const session_node_t *sn, const char *mode, unsigned rounds,
                               const char *extra) {
  char *text = malloc(1024);
  ck_assert_ptr_nonnull(text);
  snprintf(text, 1024,
           "model = mlp:3-3\ndataset = csv:%s/train.csv,%s/test.csv\nbatch = 6\n"
           "local_steps = 1\nlr = 0.05\nrounds = %u\nmode = %s\nthreads = 1\n"
           "batching = equal\n%s",
           sn->dir, sn->dir, rounds, mode, extra);
  return text;
}

/* Run the loop until cond(arg) holds; fail the test past PUMP_LIMIT_S. */
static inline void session_node_pump(session_node_t *sn, bool (*cond)(void *arg), void *arg,
                              const char *what) {
  double until = td_clock_mono_s() + PUMP_LIMIT_S;
  while (!cond(arg)) {
    ck_assert_msg(td_clock_mono_s() < until, "gave up waiting for %s", what);
    uv_run(&sn->n.loop, UV_RUN_NOWAIT);
    usleep(500);
  }
}

/* Run the loop for about `seconds` whatever happens (for checks that
 * something did NOT happen in that time). */
static inline void session_node_idle(session_node_t *sn, double seconds) {
  double until = td_clock_mono_s() + seconds;
  while (td_clock_mono_s() < until) {
    uv_run(&sn->n.loop, UV_RUN_NOWAIT);
    usleep(500);
  }
}

/* Hand `delta` (the run's numel floats) to the node as `peer`'s update of
 * `round`, the way the dispatcher does: envelopes of the real wire format,
 * encoded by a link codec with codec `none`. */
static inline void session_node_send_update(session_node_t *sn, uint64_t peer, uint64_t round,
                                     uint64_t samples, const float *delta) {
  td__session_t *s = sn->n.session;
  ck_assert_ptr_nonnull(s);
  td_codec_spec_t none = {.id = TD_CODEC_NONE};
  td_link_codec_t *lc = NULL;
  ck_assert_int_eq(td_link_codec_open(&lc, &none, td_run_layout(s->run), 7, peer), 0);
  const uint8_t *msg = NULL;
  size_t total = 0;
  ck_assert_int_eq(td_link_codec_encode(lc, delta, &msg, &total), 0);
  uint32_t chunks = td_chunk_count(total);
  uint64_t off = 0;
  for (uint32_t c = 0; c < chunks; c++) {
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = round;
    up.base_round = round - 1;
    up.samples = samples;
    up.codec = TD_CODEC_NONE;
    up.chunk = c;
    up.chunks = chunks;
    up.total_bytes = total;
    up.payload.data = (uint8_t *)msg + off;
    up.payload.len = td_chunk_len(total, off);
    up.loss = 1.0;
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.run_id = s->run_id;
    env.sender = peer;
    env.seq = c + 1;
    td__on_update(&sn->n, &env, NULL, up.payload.len);
    off += up.payload.len;
  }
  td_link_codec_close(&lc);
}

#endif
