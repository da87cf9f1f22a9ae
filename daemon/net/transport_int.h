/* transport_int.h: what the transport's three files share, and nothing
 * outside daemon/net/ sees: the link and transport structures, and the few
 * functions one file calls in another. transport.c owns the links and their
 * sockets (open, route, send, pump, shut down); transport_recv.c reads the
 * sockets and hands each checked envelope up; linkstats.c keeps each link's
 * measurements (goodput, budgets, path RTT, reply bucket) and the counters
 * status shows. All of it runs on the loop thread. */
#ifndef TD_DAEMON_NET_TRANSPORT_INT_H
#define TD_DAEMON_NET_TRANSPORT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <zmq.h>

#include "daemon/net/net.h"
#include "daemon/net/inbound.h"
#include "daemon/net/joinprobe.h"
#include "daemon/net/relay.h"
#include "scheduler/pathrtt.h"

#define MAX_LINKS TD_MEMBERS_MAX
/* libzmq refuses larger frames before allocating (our own limit is lower). */
#define ZMQ_MAX_FRAME_BYTES (16 << 20)
#define LINK_SNDHWM_FRAMES 4000
#define ROUTER_RCVHWM_FRAMES 20000
/* libzmq's default is 30 s: a connection that says nothing is closed sooner
 * (joinprobe.h: a joining node's probe uses the same bound). */
#define HANDSHAKE_TIMEOUT_MS TD__HANDSHAKE_TIMEOUT_MS

/* How a link reaches its peer. */
typedef enum {
  LINK_CLOSED = 0, /* a free slot (its key was revoked) */
  LINK_DIRECT,     /* our DEALERs dial the peer's ROUTER */
  LINK_REVERSE,    /* the peer accepts no connections: our ROUTER answers on its own */
  LINK_RELAYED,    /* neither side accepts connections: through a reachable member */
} link_route_t;

/* A DEALER read by a node without a ROUTER (heap: uv_close frees it). */
typedef struct {
  uv_poll_t h;
  struct td__transport *t;
  struct td__link *l;
} dealer_poll_t;

/* The routing id of the last frame an authenticated peer sent to our ROUTER:
 * what a REVERSE link sends back on. */
typedef struct {
  uint64_t peer;
  uint8_t rid[256];
  size_t rid_len;
} reverse_id_t;

typedef struct {
  double sent_at; /* mono seconds; 0 when acked or never sent */
  uint64_t round, bytes;
  char codec[32];
} pending_update_t;

struct td__link {
  uint64_t peer; /* 0 until the node behind `endpoint` introduced itself */
  char endpoint[TD_ENDPOINT_MAX];
  void *sock;     /* update chunks and bulk, paced by q */
  void *ctl_sock; /* everything else */
  td_linkq_t *q;
  uint64_t bytes_sent, bytes_recv, msgs_sent, msgs_recv, send_drops;
  /* updates only: bytes on the wire and the dense fp32 bytes they stand for */
  uint64_t update_wire_sent, update_dense_sent, update_wire_recv, update_dense_recv;
  char codec[32];
  double goodput_bps, ack_s, budget;
  pending_update_t pending[2]; /* updates awaiting their ack, by round % 2 */
  td_pathrtt_t path;           /* path RTT from heartbeat echoes */
  char advertised[TD_ENDPOINT_MAX]; /* what we tell this peer to dial; "" = not chosen yet */
  bool advertise_refused;           /* only loopback to offer a peer off loopback */
  uint64_t echo_us;            /* the peer's last heartbeat stamp (0: none yet) */
  double echo_heard_at;        /* when it came, mono seconds */
  uint64_t echo_back;          /* the peer's last echo of our own stamp (0: it heard none) */
  double echo_back_at;         /* when that echo last changed, mono seconds (0: not yet) */
  unsigned echo_stale;         /* the peer's heartbeats since, with the same echo */
  uint32_t refused_seen;       /* the largest count of refused handshakes it told us */
  double refused_redial_at;    /* when that made us dial again, mono seconds (0: never) */
  double reply_tokens, reply_at; /* td__link_take_reply's bucket; reply_at 0: full */
  bool reply_owed;
  link_route_t route;
  dealer_poll_t *polls[2]; /* --listen none: sock's and ctl_sock's input */
  uint64_t via;            /* RELAYED: the member that carried the last frame */
};

struct td__transport {
  uv_loop_t *loop;
  uint64_t node_id;
  td_members_t *members; /* borrowed: who is reachable (NULL until set) */
  td__drops_t *drops;    /* borrowed */
  td__transport_events_t events;
  uint64_t run_bytes_sent; /* every frame but control, since open */
  void *zctx, *router;
  td__access_t *access;
  td__zap_t *zap; /* NULL when insecure */
  uv_poll_t router_poll;
  uv_timer_t pump_timer; /* next time a queued frame becomes sendable */
  double link_delay_s;
  /* --uplink-kbit: the queued frames of all links share this many bits per
   * second, like a shaped uplink (0: no cap); uplink_free_s is when the
   * emulated wire is free for the next frame. */
  double uplink_bps, uplink_free_s;
  size_t pump_turn; /* the link the pump timer serves first */
  bool stopped;
  uint64_t seq;
  char endpoint[TD_ENDPOINT_MAX];        /* advertised by default (status, endpoint file) */
  char listen_endpoint[TD_ENDPOINT_MAX]; /* what the router is bound to */
  bool advertise_by_route; /* wildcard bound, no --advertise: per peer, by route */
  td__link_t links[MAX_LINKS];
  size_t n_links;
  td__inbound_t *inbound; /* the peer port's inbound connections, under their shares */
  bool no_inbound;        /* --listen none: no ROUTER at all */
  reverse_id_t reverse[MAX_LINKS];
  size_t n_reverse;
  uint64_t relayed_out, relayed_in, relay_forwarded; /* frames, for status */
  td__relays_t *relays; /* what we relay out, and the replay windows of what comes in */
};

/* transport.c: send one packed frame to l's peer by l's route (-1 when it
 * cannot go now); remember the routing id an authenticated peer's frame came
 * with, for a REVERSE link. */
int td__transport_send_frame(td__transport_t *t, td__link_t *l, bool control,
                             const uint8_t *buf, size_t len);
void td__transport_note_reverse(td__transport_t *t, uint64_t peer, const zmq_msg_t *rid);

/* transport_recv.c: read every frame waiting on a link's DEALER (a node
 * without a ROUTER hears its peers there), and on the ROUTER. */
void td__transport_drain_dealer(td__transport_t *t, td__link_t *l, void *sock);
void td__transport_on_router_readable(uv_poll_t *h, int status, int events);

#endif
