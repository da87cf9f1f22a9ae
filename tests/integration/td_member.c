/* td_member.c: a hostile run member with an admitted key, for
 * cluster_member.sh. It speaks the peer protocol to the traind at ENDPOINT
 * (public key SERVER_KEY) from a DEALER, listens on a ROUTER of its own that
 * it names as its endpoint (so the node takes it into the runs it starts),
 * acks every chunk the node sends it (so the node's window to it stays open,
 * as an honest member's would) and never trains. What else it does is the
 * ATTACK, for SECONDS:
 *
 *   idle     heartbeats that say it runs nothing, whatever it is admitted to
 *            (it is taken back again and again: issue 37, row 5)
 *   stale    heartbeats as a member at the node's round, and update chunks of
 *            the run's past rounds (1 up to the node's round - 1, round robin)
 *            at RATE a second (row 6)
 *   snap     heartbeats as a member, and SnapshotRequests for the node's
 *            model at RATE a second (row 7)
 *   ahead    heartbeats that claim the node's round + 1000 (row 10)
 *
 * SIGTERM ends it early, with the same report. RATE is TD_MEMBER_RATE (default 2000). Its key pair comes from
 * TD_PEER_PUBLIC / TD_PEER_SECRET (peer_keys.h; `--keygen` makes one). At the
 * end it prints:
 *   key_id HEX           (its node id)
 *   run HEX              (the run it was taken into; 0: none)
 *   sent N               (attack messages sent)
 *   snapshot_bytes N     (snapshot payload bytes the node sent it)
 * Exits 0 when it ran, 2 on bad arguments, 1 when it cannot set up. */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_wire.h"

/* A stale update's payload: any bytes (it is refused or dropped unread). */
#define STALE_PAYLOAD 256
#define BEAT_S 0.2
#define AHEAD_BY 1000

static uint64_t self_id;
static volatile sig_atomic_t stopping;

static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

static void send_env(void *s, Traind__Envelope *env) {
  peer_send(s, env, self_id, ZMQ_DONTWAIT);
}

/* What the node told us: the run it took us into and its round. */
typedef struct {
  uint64_t run_id, round, snapshot_bytes;
} heard_t;

static void ack_chunk(void *dealer, uint64_t run_id, uint64_t seq, uint64_t bytes) {
  Traind__Ack ack = TRAIND__ACK__INIT;
  ack.ack_seq = seq;
  ack.bytes = bytes;
  ack.kind = 1;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ACK;
  env.ack = &ack;
  env.run_id = run_id;
  send_env(dealer, &env);
}

/* Take one message body off the ROUTER (its identity frame skipped): note
 * the run and round, ack chunks. Returns false when nothing was waiting. */
static bool receive_one(void *router, void *dealer, heard_t *h) {
  static uint8_t buf[1 << 22];
  int len = zmq_recv(router, buf, sizeof buf, 0);
  if (len < 0)
    return false;
  int more = 0;
  size_t sz = sizeof more;
  zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz);
  if (more) { /* that was the identity: the body follows */
    len = zmq_recv(router, buf, sizeof buf, 0);
    if (len < 0 || (size_t)len > sizeof buf)
      return true;
  }
  Traind__Envelope *env = NULL;
  char why[256];
  if (td_wire_unpack(&env, buf, (size_t)len, why, sizeof why) != 0)
    return true;
  if (env->body_case == TRAIND__ENVELOPE__BODY_RUN_START && env->run_id != 0)
    h->run_id = env->run_id;
  if (env->body_case == TRAIND__ENVELOPE__BODY_HEARTBEAT && env->heartbeat->run_state != 0) {
    h->run_id = env->run_id;
    h->round = env->heartbeat->round;
  }
  if (env->body_case == TRAIND__ENVELOPE__BODY_UPDATE)
    ack_chunk(dealer, env->run_id, env->seq, env->update->payload.len);
  if (env->body_case == TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK) {
    h->snapshot_bytes += env->snapshot_chunk->payload.len;
    ack_chunk(dealer, env->run_id, env->seq, env->snapshot_chunk->payload.len);
  }
  td_wire_free(&env);
  return true;
}

static void send_beat(void *dealer, const char *attack, const heard_t *h) {
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  if (strcmp(attack, "idle") != 0 && h->run_id != 0) {
    env.run_id = h->run_id;
    hb.run_state = 1; /* running */
    hb.round = h->round + (strcmp(attack, "ahead") == 0 ? AHEAD_BY : 0);
  }
  send_env(dealer, &env);
}

static void send_stale(void *dealer, const heard_t *h, uint64_t i) {
  static uint8_t payload[STALE_PAYLOAD];
  Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
  up.round = 1 + i % (h->round - 1);
  up.samples = 32;
  up.chunk = 0;
  up.chunks = 1;
  up.total_bytes = sizeof payload;
  up.payload.data = payload;
  up.payload.len = sizeof payload;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
  env.update = &up;
  env.run_id = h->run_id;
  env.seq = i + 1;
  send_env(dealer, &env);
}

static void send_snapshot_request(void *dealer, const heard_t *h) {
  Traind__SnapshotRequest rq = TRAIND__SNAPSHOT_REQUEST__INIT;
  rq.round = h->round;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST;
  env.snapshot_request = &rq;
  env.run_id = h->run_id;
  send_env(dealer, &env);
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (argc != 5 || strncmp(argv[1], "tcp://", 6) != 0 || atof(argv[4]) <= 0) {
    fprintf(stderr, "usage: td_member tcp://HOST:PORT SERVER_KEY idle|stale|snap|ahead SECONDS\n");
    return 2;
  }
  const char *attack = argv[3];
  if (strcmp(attack, "idle") != 0 && strcmp(attack, "stale") != 0 &&
      strcmp(attack, "snap") != 0 && strcmp(attack, "ahead") != 0) {
    fprintf(stderr, "td_member: unknown attack %s (idle, stale, snap or ahead)\n", attack);
    return 2;
  }
  if ((self_id = peer_keys_self_id()) == 0) {
    fprintf(stderr, "td_member: set TD_PEER_PUBLIC and TD_PEER_SECRET (td_member --keygen)\n");
    return 2;
  }
  double seconds = atof(argv[4]);
  double rate = getenv("TD_MEMBER_RATE") ? atof(getenv("TD_MEMBER_RATE")) : 2000;

  void *ctx = zmq_ctx_new();
  char me[256];
  void *router = peer_listen(ctx, 0, 1, me, sizeof me);
  void *dealer = peer_dial(ctx, argv[1], argv[2], 0, 100000);
  if (router == NULL || dealer == NULL)
    return 1;
  peer_hello(dealer, me, self_id, ZMQ_DONTWAIT);

  heard_t h = {0};
  bool floods = strcmp(attack, "stale") == 0 || strcmp(attack, "snap") == 0;
  uint64_t sent = 0;
  double start = peer_now_s(), end = start + seconds, next_beat = start, armed_at = 0;
  signal(SIGTERM, on_term);
  while (peer_now_s() < end && !stopping) {
    for (int k = 0; k < 64 && receive_one(router, dealer, &h); k++) {
    }
    double t = peer_now_s();
    if (t >= next_beat) {
      send_beat(dealer, attack, &h);
      next_beat += BEAT_S;
    }
    if (armed_at == 0 && h.run_id != 0 && h.round >= 2) /* the run is under way */
      armed_at = t;
    for (uint64_t due = armed_at > 0 && floods ? (uint64_t)((t - armed_at) * rate) : 0;
         sent < due; sent++) {
      if (strcmp(attack, "stale") == 0)
        send_stale(dealer, &h, sent);
      else
        send_snapshot_request(dealer, &h);
    }
  }
  printf("key_id %016llx\n", (unsigned long long)self_id);
  printf("run %016llx\n", (unsigned long long)h.run_id);
  printf("sent %llu\n", (unsigned long long)sent);
  printf("snapshot_bytes %llu\n", (unsigned long long)h.snapshot_bytes);
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(ctx);
  return 0;
}
