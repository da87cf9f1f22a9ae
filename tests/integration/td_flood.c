/* td_flood.c: connection and hello floods against a traind's peer port, for
 * cluster_flood.sh.
 *
 *   td_flood raw ENDPOINT COUNT SECONDS SRC_IP
 *       hold COUNT plain TCP connections from SRC_IP open for SECONDS, saying
 *       nothing, and open a new one for every one the node closes. Prints
 *       "raw: opened N, closed by the node M, open at the end K".
 *   td_flood idle ENDPOINT SERVER_KEY COUNT SECONDS SRC_IP
 *       the same with COUNT ZeroMQ DEALERs that complete the CURVE handshake
 *       with the admitted pair in TD_PEER_PUBLIC/SECRET (peer_keys.h) and
 *       then stay silent. Prints "idle: COUNT sockets, handshakes N
 *       succeeded, M failed".
 *   td_flood hello ENDPOINT SERVER_KEY COUNT SECONDS
 *       send COUNT hellos (as the admitted pair's node, advertising a ROUTER
 *       of its own), then count the welcomes that come back for SECONDS.
 *       Prints "hello: sent N, welcomes W".
 *
 * The descriptor limit is raised to its hard limit first: the floods need
 * thousands. Exits 0 when it ran, 2 on bad usage, 1 when it could not. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_wire.h"

static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

/* "tcp://HOST:PORT" -> sockaddr; false when it is not that. */
static bool parse_endpoint(const char *ep, struct sockaddr_in *sa) {
  if (strncmp(ep, "tcp://", 6) != 0)
    return false;
  const char *colon = strrchr(ep + 6, ':');
  if (colon == NULL)
    return false;
  char host[64];
  snprintf(host, sizeof host, "%.*s", (int)(colon - ep - 6), ep + 6);
  *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

static int open_raw(const struct sockaddr_in *to, const char *src_ip) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in src = {.sin_family = AF_INET};
  inet_pton(AF_INET, src_ip, &src.sin_addr);
  if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
      connect(fd, (const struct sockaddr *)to, sizeof *to) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int flood_raw(const char *endpoint, int count, double seconds, const char *src_ip) {
  struct sockaddr_in to;
  if (!parse_endpoint(endpoint, &to))
    return 2;
  struct pollfd *fds = calloc((size_t)count, sizeof *fds);
  if (fds == NULL)
    return 1;
  long opened = 0, closed = 0;
  for (int i = 0; i < count; i++) {
    fds[i] = (struct pollfd){.fd = open_raw(&to, src_ip), .events = POLLIN};
    opened += fds[i].fd >= 0;
  }
  double end = peer_now_s() + seconds;
  while (peer_now_s() < end) {
    poll(fds, (nfds_t)count, 100);
    for (int i = 0; i < count; i++) {
      char buf[256];
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
          read(fds[i].fd, buf, sizeof buf) <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        closed++;
      }
      fds[i].revents = 0;
      if (fds[i].fd < 0 && (fds[i].fd = open_raw(&to, src_ip)) >= 0) /* try again */
        opened++;
    }
  }
  int open_now = 0;
  for (int i = 0; i < count; i++)
    if (fds[i].fd >= 0) {
      open_now++;
      close(fds[i].fd);
    }
  printf("raw: opened %ld, closed by the node %ld, open at the end %d\n", opened, closed,
         open_now);
  free(fds);
  return 0;
}

static void count_events(void *mon, long *ok, long *failed) {
  for (int ev; (ev = peer_monitor_event(mon)) >= 0;) {
    if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
      (*ok)++;
    else if (peer_handshake_failed(ev))
      (*failed)++;
  }
}

static int flood_idle(const char *endpoint, const char *server_key, int count, double seconds,
                      const char *src_ip) {
  void *ctx = zmq_ctx_new();
  zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 3 * count + 16); /* each: a DEALER, its monitor, our PAIR */
  char via[300];
  snprintf(via, sizeof via, "tcp://%s:0;%s", src_ip, endpoint + 6);
  void **socks = calloc((size_t)count, sizeof *socks);
  void **mons = calloc((size_t)count, sizeof *mons);
  if (socks == NULL || mons == NULL)
    return 1;
  int made = 0;
  int linger = 0, reconnect_ms = 1000;
  for (int i = 0; i < count; i++) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    if (s == NULL)
      break;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &reconnect_ms, sizeof reconnect_ms);
    if (!peer_keys_client(s, server_key)) {
      fprintf(stderr, "td_flood idle: set TD_PEER_PUBLIC and TD_PEER_SECRET\n");
      return 2;
    }
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://td-flood-%d", i);
    zmq_socket_monitor(s, mon_ep, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
    mons[i] = zmq_socket(ctx, ZMQ_PAIR);
    zmq_connect(mons[i], mon_ep);
    if (zmq_connect(s, via) != 0) {
      fprintf(stderr, "td_flood idle: cannot connect to %s: %s\n", via, zmq_strerror(errno));
      return 1;
    }
    socks[i] = s;
    made++;
  }
  long ok = 0, failed = 0;
  double end = peer_now_s() + seconds;
  while (peer_now_s() < end) {
    for (int i = 0; i < made; i++)
      count_events(mons[i], &ok, &failed);
    usleep(100000);
  }
  printf("idle: %d sockets, handshakes %ld succeeded, %ld failed\n", made, ok, failed);
  for (int i = 0; i < made; i++) {
    zmq_close(mons[i]);
    zmq_close(socks[i]);
  }
  free(socks);
  free(mons);
  zmq_ctx_term(ctx);
  return 0;
}

static int flood_hello(const char *endpoint, const char *server_key, int count, double seconds) {
  uint64_t me = peer_keys_self_id();
  if (me == 0) {
    fprintf(stderr, "td_flood hello: set TD_PEER_PUBLIC and TD_PEER_SECRET\n");
    return 2;
  }
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER);
  int linger = 0, timeout = 50, hwm = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
  zmq_setsockopt(router, ZMQ_RCVHWM, &hwm, sizeof hwm);
  peer_keys_server(router);
  if (zmq_bind(router, "tcp://127.0.0.1:*") != 0)
    return 1;
  char mine[256];
  size_t len = sizeof mine;
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, mine, &len);
  void *dealer = zmq_socket(ctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(dealer, ZMQ_SNDHWM, &hwm, sizeof hwm);
  peer_keys_client(dealer, server_key);
  if (zmq_connect(dealer, endpoint) != 0)
    return 1;
  Traind__Hello hello = TRAIND__HELLO__INIT;
  hello.endpoint = mine;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HELLO;
  env.hello = &hello;
  env.version = TD_WIRE_VERSION;
  env.sender = me;
  long sent = 0, welcomes = 0;
  for (int i = 0; i < count; i++) {
    uint8_t *buf = NULL;
    size_t n = 0;
    env.seq = (uint64_t)i + 1;
    if (td_wire_pack(&env, &buf, &n) == 0 && zmq_send(dealer, buf, n, 0) >= 0)
      sent++;
    free(buf);
  }
  double end = peer_now_s() + seconds;
  while (peer_now_s() < end) {
    zmq_msg_t id, msg;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, router, 0) < 0) {
      zmq_msg_close(&id);
      continue;
    }
    zmq_msg_close(&id);
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, router, 0) >= 0) {
      Traind__Envelope *got = NULL;
      td_wire_refusal_t refusal;
      char why[128];
      if (td_wire_unpack_peer(&got, zmq_msg_data(&msg), zmq_msg_size(&msg), &refusal, why,
                              sizeof why) == 0) {
        welcomes += got->body_case == TRAIND__ENVELOPE__BODY_WELCOME;
        td_wire_free(&got);
      }
    }
    zmq_msg_close(&msg);
  }
  printf("hello: sent %ld, welcomes %ld\n", sent, welcomes);
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(ctx);
  return 0;
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  raise_nofile();
  if (argc == 6 && strcmp(argv[1], "raw") == 0)
    return flood_raw(argv[2], atoi(argv[3]), atof(argv[4]), argv[5]);
  if (argc == 7 && strcmp(argv[1], "idle") == 0)
    return flood_idle(argv[2], argv[3], atoi(argv[4]), atof(argv[5]), argv[6]);
  if (argc == 6 && strcmp(argv[1], "hello") == 0)
    return flood_hello(argv[2], argv[3], atoi(argv[4]), atof(argv[5]));
  fprintf(stderr, "usage: td_flood raw ENDPOINT COUNT SECONDS SRC_IP\n"
                  "       td_flood idle ENDPOINT SERVER_KEY COUNT SECONDS SRC_IP\n"
                  "       td_flood hello ENDPOINT SERVER_KEY COUNT SECONDS\n");
  return 2;
}
