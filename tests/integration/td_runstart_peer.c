/* td_runstart_peer.c: a member that starts a run without checking it, for the
 * policy tests. It listens on a ROUTER of its own, says Hello to every node
 * (which makes it a member), sends each of them one RunStart with the given
 * spec and with itself and the nodes as the run's members, then prints every
 * RunRefused that comes back within WAIT_S seconds, one line each:
 *   refused NODE_ID_HEX REASON
 * Usage: td_runstart_peer SPEC WAIT_S NODE_ID_HEX=tcp://HOST:PORT[,KEY] ...
 * SPEC is "key = value" lines, separated by ';' on the command line. With a
 * node's KEY and a pair in TD_PEER_PUBLIC/SECRET (peer_keys.h) it speaks
 * CURVE, as an admitted member; `--keygen` prints a pair. TD_PEER_RUN_ID
 * (hex) names the run id to send, 0 and ids of past runs included (a replay);
 * without it the id is made from the time.
 * Exits 0 when everything was sent (whatever the answers). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_wire.h"

#define MAX_NODES 8
static uint64_t SELF_ID = 0x5e1f5e1f5e1f5e1full;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (peer_keys_self_id() != 0)
    SELF_ID = peer_keys_self_id();
  if (argc < 4 || argc - 3 > MAX_NODES) {
    fprintf(stderr, "usage: td_runstart_peer SPEC WAIT_S NODE_ID_HEX=tcp://HOST:PORT ...\n");
    return 2;
  }
  char *spec = strdup(argv[1]);
  for (char *p = spec; *p; p++)
    if (*p == ';')
      *p = '\n';
  double wait_s = atof(argv[2]);
  size_t n = (size_t)argc - 3;
  void *ctx = zmq_ctx_new();
  char me[256];
  void *router = peer_listen(ctx, -1, 100, me, sizeof me);
  if (router == NULL)
    return 1;
  uint64_t members[MAX_NODES + 1];
  void *dealer[MAX_NODES];
  members[0] = SELF_ID;
  for (size_t i = 0; i < n; i++) {
    char *eq = strchr(argv[3 + i], '=');
    if (eq == NULL)
      return 2;
    members[1 + i] = strtoull(argv[3 + i], NULL, 16);
    char *comma = strchr(eq, ',');
    if (comma != NULL)
      *comma = '\0';
    if ((dealer[i] = peer_dial(ctx, eq + 1, comma != NULL ? comma + 1 : NULL, 1000, 0)) == NULL)
      return 1;
    peer_hello(dealer[i], me, SELF_ID, 0);
  }
  struct timespec pause = {0, 500 * 1000 * 1000}; /* the nodes take us in */
  nanosleep(&pause, NULL);
  qsort(members, n + 1, sizeof *members, cmp_u64);
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = spec;
  rs.members = members;
  rs.n_members = n + 1;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  const char *run_id = getenv("TD_PEER_RUN_ID");
  env.run_id = run_id != NULL ? strtoull(run_id, NULL, 16)
                              : 0x9011c9011c9011cull ^ (uint64_t)time(NULL);
  for (size_t i = 0; i < n; i++)
    peer_send(dealer[i], &env, SELF_ID, 0);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, router, 0) >= 0 && zmq_msg_more(&id) &&
        zmq_msg_recv(&body, router, 0) >= 0) {
      Traind__Envelope *got = NULL;
      char why[128];
      if (td_wire_unpack(&got, zmq_msg_data(&body), zmq_msg_size(&body), why, sizeof why) == 0 &&
          got->body_case == TRAIND__ENVELOPE__BODY_RUN_REFUSED && got->run_id == env.run_id) {
        printf("refused %016llx %s\n", (unsigned long long)got->sender,
               got->run_refused->reason ? got->run_refused->reason : "");
        fflush(stdout);
      }
      td_wire_free(&got);
    }
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < wait_s);
  for (size_t i = 0; i < n; i++)
    zmq_close(dealer[i]);
  zmq_close(router);
  zmq_ctx_term(ctx);
  free(spec);
  return 0;
}
