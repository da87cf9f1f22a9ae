/* inbound.c: the peer port's defences against connection floods.
 *
 * Floods (descriptors.c plans the shares): libzmq accepts every TCP
 * connection itself, so the socket monitor reports each accepted descriptor
 * and its close. Every inbound connection is counted by remote address; one
 * that would take its address past the per-address share, the inbound share,
 * or the handshakes in progress past theirs is shut down at once (shutdown(2)
 * on libzmq's descriptor: libzmq sees the end of the stream and closes it,
 * as if the peer had). An address holding fewer than FEW_PER_ADDRESS
 * connections is not held to the handshake share (only to the inbound one):
 * silent connections from one flooding address would otherwise keep it full
 * and lock out every node that joins or reconnects meanwhile. A handshake that does not finish within the ROUTER's
 * handshake timeout (transport.c) is abandoned by libzmq, so a silent
 * connection holds its descriptor seconds, not forever. The descriptors are
 * checked again on every tick, so a lost event cannot leave a count wrong for
 * long.
 *
 * Idle connections: a link's DEALERs send a ZMTP ping every quarter of
 * TD__IDLE_CLOSE_MIN_S, so a connection of a live traind is never silent that
 * long; an inbound connection that has received nothing for idle_close_s (an
 * authenticated key holding sockets open and saying nothing) is shut down
 * (TCP_INFO tells the kernel's time since the last data arrived).
 *
 * The transport (transport.c) owns one of these and calls down into it; this
 * file never calls the transport. Loop thread only. */
#include "daemon/net/inbound.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/log.h"

#define MONITOR_ENDPOINT "inproc://traind-router-monitor"
/* Connections an address may open past a full handshake share: a node's two
 * links and their reconnects. */
#define FEW_PER_ADDRESS 8
/* Inbound descriptors tracked (by number): those beyond are shed. */
#define INBOUND_FD_MAX (1 << 20)

/* One inbound connection's remote address, by its descriptor number. */
typedef struct {
  uint8_t addr[16]; /* IPv6, or IPv4-mapped */
  bool open;
  bool closing; /* shut down for its silence; its close is still to come */
} inbound_fd_t;

/* How many inbound connections one address holds (a chained hash). */
typedef struct address_count {
  uint8_t addr[16];
  uint64_t count;
  struct address_count *next;
} address_count_t;
#define ADDRESS_BUCKETS 4096

struct td__inbound {
  uv_loop_t *loop;
  td__drops_t *drops; /* borrowed */
  void *monitor;      /* the ROUTER's socket monitor; NULL: none */
  uv_poll_t monitor_poll;
  td__descriptors_t shares;
  int listen_port; /* network order; an accepted descriptor's local port */
  inbound_fd_t *fds; /* by descriptor number, fd_cap of them */
  size_t fd_cap;
  address_count_t *by_address[ADDRESS_BUCKETS];
  uint64_t inbound, addresses, pending, shed;
  uint64_t shed_unsettled; /* shed ones whose failed handshake is still to come */
  double idle_close_s;      /* an inbound connection silent this long is closed */
  uint64_t idle_closed;
};

static size_t address_hash(const uint8_t addr[16]) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < 16; i++)
    h = (h ^ addr[i]) * 1099511628211ull;
  return (size_t)(h % ADDRESS_BUCKETS);
}

static address_count_t **address_slot(td__inbound_t *in, const uint8_t addr[16]) {
  address_count_t **p = &in->by_address[address_hash(addr)];
  while (*p != NULL && memcmp((*p)->addr, addr, 16) != 0)
    p = &(*p)->next;
  return p;
}

static uint64_t address_count(td__inbound_t *in, const uint8_t addr[16]) {
  address_count_t *a = *address_slot(in, addr);
  return a != NULL ? a->count : 0;
}

/* Count one more (true) or one fewer connection from addr. */
static void address_add(td__inbound_t *in, const uint8_t addr[16], bool more) {
  address_count_t **p = address_slot(in, addr);
  if (more) {
    if (*p == NULL) {
      address_count_t *a = calloc(1, sizeof *a);
      if (a == NULL)
        return;
      memcpy(a->addr, addr, 16);
      *p = a;
      in->addresses++;
    }
    (*p)->count++;
  } else if (*p != NULL && --(*p)->count == 0) {
    address_count_t *a = *p;
    *p = a->next;
    free(a);
    in->addresses--;
  }
}

/* The remote address of `fd` when it is a TCP connection accepted on our
 * peer port (the number may name another file by the time an event is read). */
static bool inbound_address(const td__inbound_t *in, int fd, uint8_t addr[16]) {
  struct stat st;
  struct sockaddr_storage local, remote;
  socklen_t llen = sizeof local, rlen = sizeof remote;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      getsockname(fd, (struct sockaddr *)&local, &llen) != 0 ||
      getpeername(fd, (struct sockaddr *)&remote, &rlen) != 0)
    return false;
  int port = local.ss_family == AF_INET    ? ((struct sockaddr_in *)&local)->sin_port
             : local.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&local)->sin6_port
                                           : -1;
  if (port != in->listen_port)
    return false;
  memset(addr, 0, 16);
  if (remote.ss_family == AF_INET) {
    addr[10] = addr[11] = 0xff;
    memcpy(addr + 12, &((struct sockaddr_in *)&remote)->sin_addr, 4);
  } else if (remote.ss_family == AF_INET6) {
    memcpy(addr, &((struct sockaddr_in6 *)&remote)->sin6_addr, 16);
  } else {
    return false;
  }
  return true;
}

static void forget_inbound(td__inbound_t *in, int fd) {
  if (fd < 0 || (size_t)fd >= in->fd_cap || !in->fds[fd].open)
    return;
  in->fds[fd].open = false;
  address_add(in, in->fds[fd].addr, false);
  in->inbound--;
}

/* libzmq accepted `fd`: count it, or shut it down when over a share. */
static void on_accepted(td__inbound_t *in, int fd) {
  uint8_t addr[16];
  forget_inbound(in, fd); /* its close went unreported: the number is reused */
  if (!inbound_address(in, fd, addr))
    return; /* gone already */
  const char *over = NULL;
  if ((size_t)fd >= in->fd_cap)
    over = "descriptor number";
  else if (in->inbound >= in->shares.inbound)
    over = "inbound connections";
  else if (address_count(in, addr) >= in->shares.per_address)
    over = "connections from one address";
  else if (in->pending >= in->shares.pending && address_count(in, addr) >= FEW_PER_ADDRESS)
    over = "handshakes in progress";
  if (over != NULL) {
    shutdown(fd, SHUT_RDWR);
    in->shed++;
    in->shed_unsettled++;
    if (td__drop_should_log(in->shed))
      td_log_warn("closed an incoming connection at once: over the budget of %s (inbound %" PRIu64
                  " of %" PRIu64 ", in handshake %" PRIu64 " of %" PRIu64 ", %" PRIu64
                  " per address; closed so far: %" PRIu64 ")",
                  over, in->inbound, in->shares.inbound, in->pending, in->shares.pending,
                  in->shares.per_address, in->shed);
    return;
  }
  in->fds[fd] = (inbound_fd_t){.open = true};
  memcpy(in->fds[fd].addr, addr, 16);
  address_add(in, addr, true);
  in->inbound++;
  in->pending++;
}

/* Has this connection received nothing for idle_close_s? */
static bool silent_too_long(const td__inbound_t *in, int fd) {
  struct tcp_info info;
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || len < sizeof info)
    return false;
  return info.tcpi_last_data_recv > (uint32_t)(in->idle_close_s * 1000);
}

/* Tick: forget descriptors that are closed or reused without an event, and
 * close the ones that have been silent too long. */
static void recheck_inbound(td__inbound_t *in) {
  uint8_t addr[16];
  size_t seen = 0;
  for (size_t fd = 0; fd < in->fd_cap && seen < in->inbound; fd++) {
    if (!in->fds[fd].open)
      continue;
    seen++;
    if (!inbound_address(in, (int)fd, addr) || memcmp(addr, in->fds[fd].addr, 16) != 0) {
      forget_inbound(in, (int)fd);
    } else if (!in->fds[fd].closing && silent_too_long(in, (int)fd)) {
      shutdown((int)fd, SHUT_RDWR); /* its DISCONNECTED event forgets it */
      in->fds[fd].closing = true;
      in->idle_closed++;
      if (td__drop_should_log(in->idle_closed))
        td_log_warn("closed an incoming connection silent for %.0f s (closed so far: %" PRIu64
                    ")", in->idle_close_s, in->idle_closed);
    }
  }
  if (in->pending > in->inbound)
    in->pending = in->inbound;
  if (in->inbound == 0)
    in->shed_unsettled = 0;
}

/* Socket monitor: count connections that fail the ZMTP handshake (random
 * bytes, wrong protocol): libzmq drops them before any message exists. */
static void drain_monitor(td__inbound_t *in) {
  if (in->monitor == NULL)
    return;
  for (;;) {
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(in->monitor, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
      return;
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, in->monitor, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&frame);
      return;
    }
    uint16_t event = 0;
    uint32_t value = 0;
    if (zmq_msg_size(&frame) >= 6) {
      memcpy(&event, zmq_msg_data(&frame), 2);
      memcpy(&value, (const uint8_t *)zmq_msg_data(&frame) + 2, 4);
    }
    bool more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    while (more) {
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, in->monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&frame);
        break;
      }
      more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
    }
    if (event == ZMQ_EVENT_ACCEPTED) {
      on_accepted(in, (int)value);
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      forget_inbound(in, (int)value);
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      in->pending -= in->pending > 0;
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      if (in->shed_unsettled > 0) /* one we shut down: never counted in progress */
        in->shed_unsettled--;
      else
        in->pending -= in->pending > 0;
      td__drop(in->drops, TD__DROP_HANDSHAKE, "connection failed the ZMTP handshake");
    }
  }
}

static void on_monitor_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_monitor(h->data);
}

void td__inbound_tick(td__inbound_t *in) {
  drain_monitor(in);
  recheck_inbound(in);
}

int td__inbound_open(td__inbound_t **out, uv_loop_t *loop, const td__descriptors_t *shares,
                     double heartbeat_s, td__drops_t *drops) {
  td__inbound_t *in = calloc(1, sizeof *in);
  *out = in;
  if (in == NULL)
    return TD_ENOMEM;
  in->loop = loop;
  in->drops = drops;
  in->idle_close_s = fmax(TD__IDLE_CLOSE_MIN_S, TD__IDLE_CLOSE_BEATS * heartbeat_s);
  if (shares != NULL)
    in->shares = *shares;
  else
    td__descriptors_plan(&in->shares, 1024);
  in->fd_cap = in->shares.limit < INBOUND_FD_MAX ? (size_t)in->shares.limit : INBOUND_FD_MAX;
  in->fds = calloc(in->fd_cap, sizeof *in->fds);
  return in->fds != NULL ? 0 : TD_ENOMEM;
}

void td__inbound_watch(td__inbound_t *in, void *zctx, void *router, int listen_port) {
  in->listen_port = listen_port;
  if (zmq_socket_monitor(router, MONITOR_ENDPOINT,
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                             ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    return;
  in->monitor = zmq_socket(zctx, ZMQ_PAIR);
  /* libzmq's I/O thread blocks on a full monitor pipe: never let it fill */
  int unlimited = 0;
  if (in->monitor != NULL)
    zmq_setsockopt(in->monitor, ZMQ_RCVHWM, &unlimited, sizeof unlimited);
  if (in->monitor == NULL || zmq_connect(in->monitor, MONITOR_ENDPOINT) != 0) {
    zmq_close(in->monitor);
    in->monitor = NULL;
    return;
  }
  int fd;
  size_t sz = sizeof fd;
  zmq_getsockopt(in->monitor, ZMQ_FD, &fd, &sz);
  uv_poll_init(in->loop, &in->monitor_poll, fd);
  in->monitor_poll.data = in;
  uv_poll_start(&in->monitor_poll, UV_READABLE, on_monitor_readable);
}

void td__inbound_stats(const td__inbound_t *in, td__inbound_stats_t *out) {
  *out = (td__inbound_stats_t){.inbound = in->inbound, .pending = in->pending,
                               .addresses = in->addresses, .shed = in->shed,
                               .idle_closed = in->idle_closed};
}

const td__descriptors_t *td__inbound_shares(const td__inbound_t *in) { return &in->shares; }

void td__inbound_stop(td__inbound_t *in) {
  if (in != NULL && in->monitor != NULL)
    uv_close((uv_handle_t *)&in->monitor_poll, NULL);
}

void td__inbound_close(td__inbound_t **self_p) {
  td__inbound_t *in = *self_p;
  if (in == NULL)
    return;
  *self_p = NULL;
  if (in->monitor)
    zmq_close(in->monitor);
  for (size_t b = 0; b < ADDRESS_BUCKETS; b++)
    while (in->by_address[b] != NULL) {
      address_count_t *a = in->by_address[b];
      in->by_address[b] = a->next;
      free(a);
    }
  free(in->fds);
  free(in);
}
