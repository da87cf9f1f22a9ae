/* td_hostile.c: a hostile peer for integration tests. It sends, to the traind
 * at ENDPOINT, everything a broken or malicious peer could: raw bytes that are
 * not ZMTP at all, random frames, every truncation of a valid envelope, an
 * oversized frame, a multi-frame message, a wrong protocol version, a NaN-free
 * but wrongly sized update, and updates for a run the node is not running.
 * Usage: td_hostile tcp://127.0.0.1:PORT [RUN_ID_HEX [SERVER_KEY]]. With the
 * node's SERVER_KEY and a pair admitted there in TD_PEER_PUBLIC/SECRET
 * (peer_keys.h) the garbage comes over CURVE, from an authenticated but
 * broken member; without, the daemon refuses it at the handshake.
 * Exits 0 when all sent. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "compute/rng.h"
#include "proto/wire.h"
#include "tests/integration/peer_keys.h"

static int send_raw_tcp(const char *endpoint) {
  const char *hostport = endpoint + 6;
  const char *colon = strrchr(hostport, ':');
  if (colon == NULL)
    return -1;
  char host[64];
  snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &addr.sin_addr);
  for (int i = 0; i < 3; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
      if (fd >= 0)
        close(fd);
      return -1;
    }
    char junk[512];
    for (size_t k = 0; k < sizeof junk; k++)
      junk[k] = (char)(k * 131 + 7 + i);
    if (i == 2) {
      /* a well-formed ZMTP 3.0 greeting asking for a security mechanism
       * nobody speaks: libzmq fails the handshake and reports it */
      memset(junk, 0, 64);
      junk[0] = (char)0xff;
      junk[9] = 0x7f;
      junk[10] = 3;
      memcpy(junk + 12, "JUNK", 4);
    }
    if (write(fd, junk, i == 2 ? 64 : sizeof junk) < 0) {
      close(fd);
      return -1;
    }
    usleep(100000);
    close(fd);
  }
  return 0;
}

static void send_env(void *s, Traind__Envelope *env, uint32_t version) {
  uint8_t buf[1 << 17];
  env->version = version;
  size_t len = traind__envelope__pack(env, buf);
  zmq_send(s, buf, len, 0);
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (argc < 2 || strncmp(argv[1], "tcp://", 6) != 0) {
    fprintf(stderr, "usage: td_hostile tcp://HOST:PORT [RUN_ID_HEX]\n");
    return 2;
  }
  uint64_t run_id = argc > 2 ? strtoull(argv[2], NULL, 16) : 0x1234;
  if (send_raw_tcp(argv[1]) != 0)
    fprintf(stderr, "td_hostile: raw tcp connection failed\n");
  void *ctx = zmq_ctx_new();
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 2000;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  peer_keys_client(s, argc > 3 ? argv[3] : NULL);
  if (zmq_connect(s, argv[1]) != 0)
    return 1;
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  uint8_t buf[4096];
  int sent = 0;
  /* random frames */
  for (int i = 0; i < 200; i++) {
    size_t len = td_rng_below(&rng, sizeof buf);
    for (size_t k = 0; k < len; k++)
      buf[k] = (uint8_t)td_rng_next(&rng);
    zmq_send(s, buf, len, 0);
    sent++;
  }
  /* every truncation of a valid heartbeat */
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  hb.round = 5;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  env.sender = 0xbadbadbadull;
  env.version = TD_WIRE_VERSION;
  size_t full = traind__envelope__pack(&env, buf);
  for (size_t cut = 1; cut < full; cut++, sent++)
    zmq_send(s, buf, cut, 0);
  /* oversized frame */
  size_t big = TD_WIRE_MAX_MESSAGE + 4096;
  uint8_t *huge = calloc(1, big);
  zmq_send(s, huge, big, 0);
  free(huge);
  /* a multi-frame message */
  zmq_send(s, "a", 1, ZMQ_SNDMORE);
  zmq_send(s, "b", 1, 0);
  /* wrong protocol version */
  send_env(s, &env, TD_WIRE_VERSION + 7);
  /* updates for a run that is not running (or with the wrong shape) */
  static uint8_t payload[1000];
  Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
  up.round = 1;
  up.samples = 10;
  up.chunk = 0;
  up.chunks = 1;
  up.total_bytes = sizeof payload;
  up.payload.data = payload;
  up.payload.len = sizeof payload;
  env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
  env.update = &up;
  env.run_id = 0xdeadbeefull;
  send_env(s, &env, TD_WIRE_VERSION);
  env.run_id = run_id; /* right run, but a sender outside it and a wrong size */
  send_env(s, &env, TD_WIRE_VERSION);
  /* a run start from a node nobody knows */
  uint64_t members[1] = {0xbadbadbadull};
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = "model = mlp:784-10\n";
  rs.members = members;
  rs.n_members = 1;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  send_env(s, &env, TD_WIRE_VERSION);
  zmq_close(s);
  zmq_ctx_term(ctx);
  printf("td_hostile: sent %d garbage frames and 6 crafted messages\n", sent);
  return 0;
}
