/* td_intruder.c: a peer that tries what an attacker reaching the listen port
 * would, for td_intruder.sh. One attack per run, sent to the traind at
 * ENDPOINT (whose public key is SERVER_KEY), from a DEALER; the intruder also
 * listens on a ROUTER of its own and names it as its endpoint, so it sees
 * whether the node ever links to it. With a pair in TD_PEER_PUBLIC/SECRET
 * (peer_keys.h) it speaks CURVE with that key, else plain ZMTP.
 *
 *   hello                       Hello: make me a member
 *   start MEMBER_HEX...         RunStart (spec with seed = 7355608421), me + them
 *   stop RUN_ID_HEX             RunStop of that run
 *   inject RUN_ID_HEX ROUND ID  an update of ROUND claiming to be from node ID
 *   spoof ID_HEX                Hello claiming node ID, with my endpoint
 *   fill COUNT                  COUNT Hellos with invented ids
 *   linger                      Hello, then a heartbeat every 0.2 s while it waits
 *
 * Every message carries `sender` = SENDER_HEX when TD_INTRUDER_SENDER is set
 * (a forged field), else the id of its key (or an invented one). After
 * sending it waits WAIT_S (TD_INTRUDER_WAIT_S, default 2) and prints:
 *   key_id HEX          (the node id its key stands for)
 *   handshake succeeded|refused
 *   received N          (messages on its ROUTER: links the node opened to it)
 * Exits 0 when it ran, 2 on bad arguments. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_wire.h"

#define MAX_MEMBERS 16
#define MONITOR_ENDPOINT "inproc://td-intruder-monitor"

static uint64_t sender_id;

static void send_env(void *s, Traind__Envelope *env) {
  peer_send(s, env, sender_id, 0);
}

static void send_hello(void *s, const char *me, uint64_t as) {
  peer_hello(s, me, as != 0 ? as : sender_id, 0);
}

/* Read the DEALER's monitor: did a handshake ever succeed? */
static void read_monitor(void *mon, int *succeeded, int *failed) {
  for (int ev; (ev = peer_monitor_event(mon)) >= 0;) {
    if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
      (*succeeded)++;
    else if (peer_handshake_failed(ev) || ev == ZMQ_EVENT_DISCONNECTED)
      (*failed)++;
  }
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (argc < 4 || strncmp(argv[1], "tcp://", 6) != 0) {
    fprintf(stderr, "usage: td_intruder tcp://HOST:PORT SERVER_KEY ATTACK [ARGS]\n");
    return 2;
  }
  const char *attack = argv[3];
  sender_id = peer_keys_self_id() ? peer_keys_self_id() : 0x1badc0de1badc0deull;
  const char *forged = getenv("TD_INTRUDER_SENDER");
  if (forged != NULL)
    sender_id = strtoull(forged, NULL, 16);
  double wait_s = getenv("TD_INTRUDER_WAIT_S") ? atof(getenv("TD_INTRUDER_WAIT_S")) : 2.0;

  void *ctx = zmq_ctx_new();
  char me[256];
  int linger = 500;
  void *router = peer_listen(ctx, linger, 50, me, sizeof me);
  if (router == NULL)
    return 1;
  void *dealer = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
  peer_keys_client(dealer, argv[2]);
  zmq_socket_monitor(dealer, MONITOR_ENDPOINT, ZMQ_EVENT_ALL);
  void *mon = zmq_socket(ctx, ZMQ_PAIR);
  zmq_connect(mon, MONITOR_ENDPOINT);
  if (zmq_connect(dealer, argv[1]) != 0)
    return 1;

  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  if (strcmp(attack, "hello") == 0) {
    send_hello(dealer, me, 0);
  } else if (strcmp(attack, "start") == 0 && argc > 4) {
    uint64_t members[MAX_MEMBERS + 1];
    size_t n = 0;
    members[n++] = sender_id;
    for (int i = 4; i < argc && n <= MAX_MEMBERS; i++)
      members[n++] = strtoull(argv[i], NULL, 16);
    send_hello(dealer, me, 0);
    Traind__RunStart rs = TRAIND__RUN_START__INIT;
    rs.spec = "model = mlp:784-10\nrounds = 3\nseed = 7355608421\n";
    rs.members = members;
    rs.n_members = n;
    env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
    env.run_start = &rs;
    env.run_id = 0x1ead1ead1ead1eadull;
    send_env(dealer, &env);
  } else if (strcmp(attack, "stop") == 0 && argc > 4) {
    Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
    stop.reason = "td_intruder";
    env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
    env.run_stop = &stop;
    env.run_id = strtoull(argv[4], NULL, 16);
    send_env(dealer, &env);
  } else if (strcmp(attack, "inject") == 0 && argc > 6) {
    static uint8_t payload[4096];
    memset(payload, 0x7f, sizeof payload); /* huge floats */
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = strtoull(argv[5], NULL, 10);
    up.samples = 1000000000;
    up.chunk = 0;
    up.chunks = 1;
    up.total_bytes = sizeof payload;
    up.payload.data = payload;
    up.payload.len = sizeof payload;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.run_id = strtoull(argv[4], NULL, 16);
    env.sender = strtoull(argv[6], NULL, 16);
    for (int r = 0; r < 5; r++, up.round++)
      send_env(dealer, &env);
  } else if (strcmp(attack, "spoof") == 0 && argc > 4) {
    for (int i = 0; i < 5; i++)
      send_hello(dealer, me, strtoull(argv[4], NULL, 16));
  } else if (strcmp(attack, "linger") == 0) {
    send_hello(dealer, me, 0);
  } else if (strcmp(attack, "fill") == 0 && argc > 4) {
    long count = atol(argv[4]);
    for (long i = 0; i < count; i++)
      send_hello(dealer, me, 0xf111000000000000ull + (uint64_t)i + 1);
  } else {
    fprintf(stderr, "td_intruder: unknown attack or missing arguments: %s\n", attack);
    return 2;
  }

  int succeeded = 0, failed = 0;
  long received = 0;
  double until = peer_now_s() + wait_s, next_beat = peer_now_s() + 0.2;
  while (peer_now_s() < until) {
    if (strcmp(attack, "linger") == 0 && peer_now_s() >= next_beat) {
      Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
      Traind__Envelope beat = TRAIND__ENVELOPE__INIT;
      beat.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
      beat.heartbeat = &hb;
      send_env(dealer, &beat);
      next_beat += 0.2;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, router, 0) >= 0 && !zmq_msg_more(&m))
      received++; /* count bodies, not routing frames */
    zmq_msg_close(&m);
    read_monitor(mon, &succeeded, &failed);
  }
  printf("key_id %016llx\n", (unsigned long long)(peer_keys_self_id() ? peer_keys_self_id()
                                                                      : 0x1badc0de1badc0deull));
  printf("handshake %s\n", succeeded > 0 ? "succeeded" : "refused");
  printf("received %ld\n", received);
  zmq_socket_monitor(dealer, NULL, 0);
  zmq_close(mon);
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(ctx);
  return 0;
}
