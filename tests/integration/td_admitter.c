/* td_admitter.c: a hostile run member with an admitted key and no admin that
 * tries to decide the run's membership by itself, for cluster_runmember.sh
 * (issue 37, rows 1 and 2).
 *
 *   td_admitter phantom - SECONDS ENDPOINT KEY [ENDPOINT KEY]...
 *       admission RunStarts naming ids that have no key (one new phantom each
 *       time, at most PHANTOMS), to every node given (row 1)
 *   td_admitter readmit VICTIM SECONDS ENDPOINT KEY [ENDPOINT KEY]...
 *       readmissions of member VICTIM (hex node id), a few each round, to
 *       every node given (row 2)
 *   td_admitter noop - SECONDS ENDPOINT KEY [ENDPOINT KEY]...
 *       nothing but what every attack does (below): the reference run
 *
 * It says hello to each node, listens on a ROUTER of its own (so the nodes
 * take it into the runs they start and it hears their RunStarts and
 * heartbeats); it refuses each run it is taken into (RunRefused) and says in
 * its heartbeats that it runs nothing, so no round waits for it and nobody
 * readmits it, yet it stays on the run's member list. Each phantom goes out on the member list a node that obeyed
 * every phantom before would hold, and on the run's list as the nodes last
 * sent it, so one of them fits each node. Its CURVE pair comes from
 * TD_PEER_PUBLIC / TD_PEER_SECRET (peer_keys.h; --keygen makes one). At the
 * end it prints `key_id HEX`, `run HEX` and `sent N` (admissions sent to each
 * node; SIGTERM ends it early with the same report). Exits 0 when it ran, 2 on
 * bad arguments. */
#include <inttypes.h>
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

#define MAX_TARGETS 8
#define MAX_LIST 64
#define PHANTOMS 29
#define BEAT_S 0.2
#define ATTACK_S 0.05
#define LEAD_ROUNDS 50 /* its round is a heartbeat old: well ahead, so it fits */

static uint64_t self_id;
static volatile sig_atomic_t stopping;

static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

static void send_env(void *s, Traind__Envelope *env) {
  peer_send(s, env, self_id, ZMQ_DONTWAIT);
}

/* What the nodes told it: the run, its spec and member list, the round. */
typedef struct {
  uint64_t run_id, round;
  uint64_t members[MAX_LIST];
  size_t n_members;
  char spec[TD_WIRE_MAX_SPEC + 1];
} run_t;

static bool receive_one(void *router, run_t *r) {
  static uint8_t buf[1 << 22];
  int len = zmq_recv(router, buf, sizeof buf, 0);
  if (len < 0)
    return false;
  int more = 0;
  size_t sz = sizeof more;
  zmq_getsockopt(router, ZMQ_RCVMORE, &more, &sz);
  if (more) { /* the identity frame: the body follows */
    len = zmq_recv(router, buf, sizeof buf, 0);
    if (len < 0 || (size_t)len > sizeof buf)
      return true;
  }
  Traind__Envelope *env = NULL;
  char why[256];
  if (td_wire_unpack(&env, buf, (size_t)len, why, sizeof why) != 0)
    return true;
  if (env->body_case == TRAIND__ENVELOPE__BODY_RUN_START && env->run_id != 0 &&
      env->run_start->n_members <= MAX_LIST &&
      (env->run_start->join_round == 0 || env->run_id == r->run_id)) {
    r->run_id = env->run_id;
    r->n_members = env->run_start->n_members;
    memcpy(r->members, env->run_start->members, r->n_members * sizeof *r->members);
    snprintf(r->spec, sizeof r->spec, "%s", env->run_start->spec ? env->run_start->spec : "");
  }
  if (env->body_case == TRAIND__ENVELOPE__BODY_HEARTBEAT && env->heartbeat->run_state != 0 &&
      env->run_id == r->run_id && env->heartbeat->round > r->round)
    r->round = env->heartbeat->round;
  td_wire_free(&env);
  return true;
}

/* Refuse the run (it never trains): the members stop waiting for it, and it
 * stays on the run's member list, where its admissions come from. */
static void send_refusal(void *dealer, uint64_t run_id) {
  Traind__RunRefused rr = TRAIND__RUN_REFUSED__INIT;
  rr.reason = "this member does not train";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_REFUSED;
  env.run_refused = &rr;
  env.run_id = run_id;
  send_env(dealer, &env);
}

static void send_idle_beat(void *dealer) {
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  send_env(dealer, &env);
}

/* RunStart{members, join_round = round + LEAD_ROUNDS, joiner} to one node. */
static void send_admission(void *dealer, const run_t *r, const uint64_t *members, size_t n,
                           uint64_t joiner) {
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = (char *)r->spec;
  rs.members = (uint64_t *)members;
  rs.n_members = n;
  rs.join_round = r->round + LEAD_ROUNDS;
  rs.joiner = joiner;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = r->run_id;
  send_env(dealer, &env);
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (argc < 6 || (argc - 4) % 2 != 0 || (argc - 4) / 2 > MAX_TARGETS || atof(argv[3]) <= 0 ||
      (strcmp(argv[1], "phantom") != 0 && strcmp(argv[1], "readmit") != 0 &&
       strcmp(argv[1], "noop") != 0)) {
    fprintf(stderr, "usage: td_admitter phantom|readmit|noop VICTIM|- SECONDS ENDPOINT KEY...\n");
    return 2;
  }
  bool phantom = strcmp(argv[1], "phantom") == 0, readmit = strcmp(argv[1], "readmit") == 0;
  uint64_t victim = readmit ? strtoull(argv[2], NULL, 16) : 0;
  if ((self_id = peer_keys_self_id()) == 0 || (readmit && victim == 0)) {
    fprintf(stderr, "td_admitter: set TD_PEER_PUBLIC and TD_PEER_SECRET, and a victim id\n");
    return 2;
  }
  double seconds = atof(argv[3]);
  size_t n_targets = (size_t)(argc - 4) / 2;

  void *ctx = zmq_ctx_new();
  char me[256];
  void *router = peer_listen(ctx, 0, 1, me, sizeof me);
  if (router == NULL)
    return 1;
  void *dealers[MAX_TARGETS];
  for (size_t t = 0; t < n_targets; t++) {
    if ((dealers[t] = peer_dial(ctx, argv[4 + 2 * t], argv[5 + 2 * t], 0, 0)) == NULL)
      return 1;
    peer_hello(dealers[t], me, self_id, ZMQ_DONTWAIT);
  }

  run_t r = {0};
  uint64_t obeyed[MAX_LIST];
  size_t n_obeyed = 0;
  uint64_t sent = 0, refused_run = 0, rng = self_id ^ (uint64_t)time(NULL);
  double start = peer_now_s(), end = start + seconds, next_beat = start, next_attack = start;
  signal(SIGTERM, on_term);
  while (peer_now_s() < end && !stopping) {
    for (int k = 0; k < 64 && receive_one(router, &r); k++) {
    }
    double t = peer_now_s();
    if (r.run_id != 0 && r.run_id != refused_run) {
      for (size_t i = 0; i < n_targets; i++)
        send_refusal(dealers[i], r.run_id);
      refused_run = r.run_id;
    }
    if (t >= next_beat) {
      for (size_t i = 0; i < n_targets; i++)
        send_idle_beat(dealers[i]);
      next_beat += BEAT_S;
    }
    if (t < next_attack || r.run_id == 0 || r.round < 2)
      continue;
    next_attack = t + ATTACK_S;
    if (phantom && n_obeyed == 0) { /* the run's own list, as the nodes sent it */
      memcpy(obeyed, r.members, r.n_members * sizeof *obeyed);
      n_obeyed = r.n_members;
    }
    if (phantom && sent < PHANTOMS && n_obeyed < MAX_LIST) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      uint64_t id = rng | 1, list[MAX_LIST];
      /* the list a node that obeyed every phantom before holds, and the
       * run's list as the nodes last sent it: one of them fits each node */
      memcpy(list, obeyed, n_obeyed * sizeof *list);
      list[n_obeyed] = id;
      for (size_t i = 0; i < n_targets; i++)
        send_admission(dealers[i], &r, list, n_obeyed + 1, id);
      if (n_obeyed != r.n_members || memcmp(obeyed, r.members, n_obeyed * sizeof *list) != 0) {
        memcpy(list, r.members, r.n_members * sizeof *list);
        list[r.n_members] = id;
        for (size_t i = 0; i < n_targets; i++)
          send_admission(dealers[i], &r, list, r.n_members + 1, id);
      }
      obeyed[n_obeyed++] = id;
      sent++;
    } else if (readmit) {
      for (size_t i = 0; i < n_targets; i++)
        send_admission(dealers[i], &r, r.members, r.n_members, victim);
      sent++;
    }
  }
  printf("key_id %016" PRIx64 "\n", self_id);
  printf("run %016" PRIx64 "\n", r.run_id);
  printf("sent %" PRIu64 "\n", sent);
  for (size_t t = 0; t < n_targets; t++)
    zmq_close(dealers[t]);
  zmq_close(router);
  zmq_ctx_term(ctx);
  return 0;
}
