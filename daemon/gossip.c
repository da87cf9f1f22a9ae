/* gossip.c: membership traffic: hello, welcome, heartbeat and leave.
 *
 * Threads: loop thread. A node introduces itself with a hello; the answer is
 * a welcome listing the members the answering node knows, so one join spreads
 * through the cluster. Every heartbeat carries the sender's peer list, run
 * state, round and capacity; members.c turns silence into suspect and dead.
 * A restarted node says hello to the peers its ledger knew: that is how it
 * comes back. Every change of a member's state goes to the ledger.
 *
 * A hello costs its sender a few bytes and its answer a full member list, so
 * welcomes are rationed per link (WELCOME_BURST, then one per heartbeat): a
 * member that floods hellos gets no more answers than one that says hello
 * once per heartbeat, and the suppressed ones are counted as `flooded` drops;
 * the last suppressed one is answered at the next tick the ration allows, so
 * a hello that merely came close behind others (a join right after a
 * restart's greetings) still gets its welcome.
 * A suppressed hello still says its sender is alive, but its endpoint is not
 * taken: a stream of hellos naming new addresses would make the node redial. */
#include "daemon/internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* Welcomes one link may get at once, and then one per heartbeat interval. */
#define WELCOME_BURST 2.0

/* A peer's address: tcp://..., or none (it accepts no connections: reached
 * over the connections it opens, or through a reachable member). */
static bool tcp_endpoint(const char *ep) {
  return ep != NULL && (strncmp(ep, "tcp://", 6) == 0 || strcmp(ep, TD_LISTEN_NONE) == 0);
}

static void fill_peer_infos(td__node_t *n, Traind__PeerInfo *infos, Traind__PeerInfo **ptrs,
                            size_t *count) {
  size_t k = 0;
  for (size_t i = 0; i < td_members_count(n->members) && k < TD_MEMBERS_MAX; i++) {
    const td_member_t *m = td_members_at(n->members, i);
    if (m->state == TD_PEER_LEFT || m->state == TD_PEER_DEAD)
      continue;
    traind__peer_info__init(&infos[k]);
    infos[k].node_id = m->node_id;
    infos[k].endpoint = (char *)m->endpoint;
    infos[k].state = (uint32_t)m->state;
    infos[k].capacity = m->capacity;
    ptrs[k] = &infos[k];
    k++;
  }
  *count = k;
}

/* Our own entry of a peer list says where this link's peer can reach us. */
static void advertise_self(td__node_t *n, Traind__PeerInfo **ptrs, size_t count,
                           const char *advertised) {
  for (size_t k = 0; k < count; k++)
    if (ptrs[k]->node_id == n->node_id)
      ptrs[k]->endpoint = (char *)advertised;
}

void td__gossip_hello(td__node_t *n, td__link_t *l) {
  Traind__Hello hello = TRAIND__HELLO__INIT;
  /* never hand a peer an address it cannot dial (td__link_advertised logs why) */
  if ((hello.endpoint = (char *)td__link_advertised(n->net, l)) == NULL)
    return;
  /* the key this node signs admissions with: the link authenticates us */
  hello.sign_key.data = (uint8_t *)td__admission_sign_pub(td__access_admission(n->access));
  hello.sign_key.len = TD__SIGN_KEY_BYTES;
  hello.refused_you = td__link_refused_out(n->net, l);
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HELLO;
  env.hello = &hello;
  td__link_send(n->net, l, &env);
}

/* A welcome with `refused` set says no and lists nobody. */
static void send_welcome(td__node_t *n, td__link_t *l, const char *refused) {
  Traind__PeerInfo infos[TD_MEMBERS_MAX], *ptrs[TD_MEMBERS_MAX];
  Traind__Welcome w = TRAIND__WELCOME__INIT;
  if (refused != NULL) {
    w.refused = (char *)refused;
  } else {
    const char *advertised = td__link_advertised(n->net, l);
    if (advertised == NULL)
      return;
    fill_peer_infos(n, infos, ptrs, &w.n_peers);
    advertise_self(n, ptrs, w.n_peers, advertised);
  }
  w.peers = ptrs;
  w.run_round = n->session ? n->session->round : 0;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  env.run_id = n->session ? n->session->run_id : 0;
  td__link_send(n->net, l, &env);
}

/* A peer's row goes to disk now, not at the next heartbeat's flush: where the
 * peers are is all a restarted node has to find its way back with, and a
 * node that accepts no connections and lost it can be reached by nobody (it
 * joined, was killed within a heartbeat, and came back knowing no address).
 * Peer rows are rare (a join, a death, a new address), so this costs little. */
static void record_peer(td__node_t *n, const td_member_t *m) {
  td__ledger_peer(n->ledger, m);
  td__ledgerq_flush(n->ledger);
}

static void on_member_event(const td_member_t *m, td_member_event_t ev, void *user) {
  td__node_t *n = user;
  switch (ev) {
  case TD_MEMBER_SUSPECTED:
    td_log_warn("peer %016" PRIx64 " (%s) is suspect", m->node_id, m->endpoint);
    td__ledger_event(n->ledger, "peer_suspect", "%016" PRIx64 " %s", m->node_id, m->endpoint);
    break;
  case TD_MEMBER_DIED:
    td_log_warn("peer %016" PRIx64 " (%s) is dead", m->node_id, m->endpoint);
    td__ledger_event(n->ledger, "peer_dead", "%016" PRIx64 " %s", m->node_id, m->endpoint);
    if (n->session != NULL)
      td__rounds_forget_peer(n->session, m->node_id);
    break;
  default:
    break;
  }
  record_peer(n, m);
}

/* The membership table's reuse hooks: a current run member keeps its slot
 * whatever its state (the run's lists name it), and a member whose slot goes
 * to a new node is logged, written to the ledger and loses its link, so that
 * the link slot is free for the newcomer too. */
static bool pinned_by_run(uint64_t node_id, void *user) {
  td__node_t *n = user;
  for (size_t i = 0; n->session != NULL && i < n->session->n_members; i++)
    if (n->session->members[i] == node_id)
      return true;
  return false;
}

static void on_member_evicted(const td_member_t *m, void *user) {
  td__node_t *n = user;
  double silent_s = td_clock_mono_s() - m->last_heard;
  td_log_info("membership table full: peer %016" PRIx64 " (%s, %s, silent %.0f s) gives its "
              "slot to a new node",
              m->node_id, m->endpoint, td_peer_state_name(m->state), silent_s);
  td__ledger_event(n->ledger, "peer_evicted", "%016" PRIx64 " %s %s %.0f", m->node_id,
                   m->endpoint, td_peer_state_name(m->state), silent_s);
  td__link_close_peer(n->net, m->node_id);
}

void td__gossip_install(td__node_t *n) {
  td_members_set_hooks(n->members, &(td_members_hooks_t){.pinned = pinned_by_run,
                                                          .evicted = on_member_evicted,
                                                          .user = n});
}

/* A full table refuses a new node's hello on a link of its own (the answer
 * says why, so that its `trainctl join` can tell the user). Links are as many
 * as members: the link of a node refused before, never a member, gives its
 * slot to this one. */
static void refuse_full(td__node_t *n, uint64_t joiner, const char *endpoint, const char *why) {
  td__link_t *l = td__link_ensure(n->net, joiner, endpoint);
  for (size_t i = 0; l == NULL && i < td__transport_count(n->net); i++) {
    uint64_t stray = td__link_peer(td__transport_at(n->net, i));
    if (stray != 0 && stray != joiner && td_members_find(n->members, stray) == NULL) {
      td__link_close_peer(n->net, stray);
      l = td__link_ensure(n->net, joiner, endpoint);
    }
  }
  if (l != NULL)
    send_welcome(n, l, why);
}

bool td__gossip_heard(td__node_t *n, uint64_t peer, const char *endpoint) {
  td_member_event_t ev;
  if (td_members_heard(n->members, peer, endpoint, td_clock_mono_s(), &ev) != 0) {
    td_log_warn("membership table full (%d): ignoring %016" PRIx64, TD_MEMBERS_MAX, peer);
    return false;
  }
  td_member_t *m = td_members_find(n->members, peer);
  td__link_t *l = td__link_ensure(n->net, peer, m->endpoint[0] ? m->endpoint : endpoint);
  if (ev == TD_MEMBER_JOINED || ev == TD_MEMBER_REVIVED) {
    td_log_info("peer %016" PRIx64 " at %s %s", peer, m->endpoint,
                ev == TD_MEMBER_JOINED ? "joined" : "is back");
    td__ledger_event(n->ledger, ev == TD_MEMBER_JOINED ? "peer_joined" : "peer_back",
                     "%016" PRIx64 " %s", peer, m->endpoint);
    record_peer(n, m);
    if (l != NULL)
      td__gossip_hello(n, l); /* make sure it knows us too */
  }
  return true;
}

/* Second-hand news of peers (welcome, heartbeat gossip). */
static void learn_peers(td__node_t *n, Traind__PeerInfo **peers, size_t count) {
  for (size_t i = 0; i < count; i++) {
    Traind__PeerInfo *p = peers[i];
    if (p->node_id == 0 || p->node_id == n->node_id || !tcp_endpoint(p->endpoint) ||
        !td__access_known(n->access, p->node_id))
      continue; /* secure: a node whose key we have not admitted takes no slot */
    td_member_t *known = td_members_find(n->members, p->node_id);
    if (known != NULL && known->state == TD_PEER_DEAD)
      known->vouched = true; /* alive to the sender: worth dialing again (redial_dead) */
    if (td_members_learn(n->members, p->node_id, p->endpoint, td_clock_mono_s()) == 1) {
      td__link_t *l = td__link_ensure(n->net, p->node_id, p->endpoint);
      if (l != NULL)
        td__gossip_hello(n, l);
      td_log_info("learned of peer %016" PRIx64 " at %s", p->node_id, p->endpoint);
      record_peer(n, td_members_find(n->members, p->node_id));
    }
  }
}

/* Our heartbeat to one link (`only`) or to every link of a member that has not
 * left (only == NULL). */
static void send_heartbeat(td__node_t *n, td__link_t *only) {
  Traind__PeerInfo infos[TD_MEMBERS_MAX], *ptrs[TD_MEMBERS_MAX];
  Traind__Heartbeat hb = TRAIND__HEARTBEAT__INIT;
  fill_peer_infos(n, infos, ptrs, &hb.n_peers);
  hb.peers = ptrs;
  td__session_t *s = n->session;
  hb.round = s ? s->round : 0;
  hb.run_state = s == NULL ? 0 : s->ready ? 2 : 1;
  hb.capacity = s ? s->capacity : 0; /* samples/s EWMA (weighted batching) */
  hb.ended_run = n->ended_run;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = &hb;
  env.run_id = s ? s->run_id : 0;
  if (only != NULL) {
    if (td__link_advertised(n->net, only) == NULL)
      return;
    advertise_self(n, ptrs, hb.n_peers, td__link_advertised(n->net, only));
    td__link_echo_out(only, &hb.stamp_us, &hb.echo_us, &hb.echo_hold_us);
    hb.refused_you = td__link_refused_out(n->net, only);
    td__link_send(n->net, only, &env);
    return;
  }
  /* dead peers get heartbeats too, so a restarted one finds its way back */
  for (size_t i = 0; i < td__transport_count(n->net); i++) {
    td__link_t *l = td__transport_at(n->net, i);
    td_member_t *m = td__link_peer(l) ? td_members_find(n->members, td__link_peer(l)) : NULL;
    if (m != NULL && m->state != TD_PEER_LEFT && td__link_advertised(n->net, l) != NULL) {
      advertise_self(n, ptrs, hb.n_peers, td__link_advertised(n->net, l));
      td__link_echo_out(l, &hb.stamp_us, &hb.echo_us, &hb.echo_hold_us);
      hb.refused_you = td__link_refused_out(n->net, l);
      td__link_send(n->net, l, &env);
    }
  }
}

void td__on_hello(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  if (!tcp_endpoint(env->hello->endpoint)) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "hello without a tcp:// endpoint (or none)");
    return;
  }
  td__access_bind_sign(n->access, env->sender, env->hello->sign_key.data,
                       env->hello->sign_key.len);
  double per_s = 1.0 / n->heartbeat_s;
  td__link_t *known = td__link_find(n->net, env->sender);
  if (known != NULL && td_members_find(n->members, env->sender) != NULL &&
      !td__link_take_reply(known, per_s, WELCOME_BURST)) {
    /* a hello flood: counted, not answered, and its endpoint is not taken
     * (each new one would make the link reconnect) */
    td__gossip_heard(n, env->sender, NULL);
    td__drop(&n->drops, TD__DROP_FLOODED, NULL);
    td__link_set_reply_owed(known, true); /* the last one is answered at a later tick */
    return;
  }
  char why[128];
  if (!td__admit_room(n, env->sender, "hello", why, sizeof why)) {
    refuse_full(n, env->sender, env->hello->endpoint, why);
    return;
  }
  if (!td__gossip_heard(n, env->sender, env->hello->endpoint))
    return; /* (not reached: admitted above) */
  if ((l = td__link_find(n->net, env->sender)) == NULL)
    return;
  if (l != known) /* a new link: its first welcome counts too */
    td__link_take_reply(l, per_s, WELCOME_BURST);
  /* it refused our handshakes before it knew us: dial again, then welcome */
  td__link_refused_in(l, env->hello->refused_you);
  td__link_set_reply_owed(l, false);
  send_welcome(n, l, NULL);
  td__admit_send_all(n, l); /* the signed admissions it may have missed */
}

void td__on_welcome(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  if (env->welcome->refused != NULL && env->welcome->refused[0] != '\0') {
    td_log_warn("peer %016" PRIx64 " does not take this node in: %s", env->sender,
                env->welcome->refused);
    if (n->join_refused != NULL)
      n->join_refused(n->control, env->sender, env->welcome->refused);
    return;
  }
  const char *ep = NULL;
  for (size_t i = 0; i < env->welcome->n_peers; i++)
    if (env->welcome->peers[i]->node_id == env->sender)
      ep = env->welcome->peers[i]->endpoint;
  td__gossip_heard(n, env->sender, ep);
  learn_peers(n, env->welcome->peers, env->welcome->n_peers);
  if (n->welcomed != NULL)
    n->welcomed(n->control, env->sender);
  /* say at once what we run: a restarted member of a run is taken back on it
   * (comeback.c) without waiting a heartbeat period */
  if ((l = td__link_find(n->net, env->sender)) != NULL)
    send_heartbeat(n, l);
}

void td__on_heartbeat(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)bytes;
  td__gossip_heard(n, env->sender, NULL);
  if (l != NULL) {
    td__link_echo_in(l, env->heartbeat->stamp_us, env->heartbeat->echo_us,
                     env->heartbeat->echo_hold_us);
    td__link_refused_in(l, env->heartbeat->refused_you);
  }
  td_member_t *m = td_members_find(n->members, env->sender);
  if (isfinite(env->heartbeat->capacity) && env->heartbeat->capacity >= 0)
    m->capacity = env->heartbeat->capacity;
  m->round = env->heartbeat->round;
  m->run_id = env->heartbeat->run_state ? env->run_id : 0;
  m->run_ready = env->heartbeat->run_state == 2;
  m->reported = true;
  m->ended_run = env->heartbeat->ended_run;
  /* (a node that died in a run and finds it ended keeps it 'interrupted':
   * the members never take it back into an ended run) */
  if (m->ended_run != 0 && n->session != NULL && n->session->run_id == m->ended_run)
    td__session_heard_end(n, env->sender);
  td__comeback_heard(n, env->sender, m->run_id, m->round);
  learn_peers(n, env->heartbeat->peers, env->heartbeat->n_peers);
}

void td__on_leave(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  td_log_info("peer %016" PRIx64 " leaves: %s", env->sender,
              env->leave->reason ? env->leave->reason : "");
  td_members_left(n->members, env->sender);
  td__ledger_event(n->ledger, "peer_left", "%016" PRIx64, env->sender);
  const td_member_t *m = td_members_find(n->members, env->sender);
  if (m != NULL)
    record_peer(n, m);
  if (n->session != NULL)
    td__rounds_forget_peer(n->session, env->sender);
}

/* --listen none: a reachable member that left or died cannot call this node
 * back when it returns (it has no address to dial), so every few heartbeats
 * this node says hello again to the members it dials that it does not hear. */
static void regreet_silent(td__node_t *n) {
  if (strcmp(td__transport_endpoint(n->net), TD_LISTEN_NONE) != 0 || ++n->regreet_ticks < 5)
    return;
  n->regreet_ticks = 0;
  for (size_t i = 0; i < td__transport_count(n->net); i++) {
    td__link_t *l = td__transport_at(n->net, i);
    td_member_t *m = td__link_peer(l) ? td_members_find(n->members, td__link_peer(l)) : NULL;
    td__link_stats_t st;
    td__link_stats(l, &st);
    if (m != NULL && (m->state == TD_PEER_LEFT || m->state == TD_PEER_DEAD) &&
        st.route != NULL && strcmp(st.route, "direct") == 0)
      td__gossip_hello(n, l);
  }
}

/* A member dead to this node while another member lists it alive may have
 * had our connection to it refused (its ZAP handler did not know our key yet,
 * in a join storm): libzmq never dials again after that, so every few
 * heartbeats this node does, a few times after each death (keys spread
 * within seconds; a member that is really gone, which nobody lists, is left
 * to libzmq's own reconnecting). Once the member hears us, it sees that we
 * never heard it (the echo in our heartbeats) and dials again too
 * (linkstats.c). */
#define REDIAL_DEAD_TICKS 6
#define REDIAL_DEAD_MAX 4

static void redial_dead(td__node_t *n) {
  if (strcmp(td__transport_endpoint(n->net), TD_LISTEN_NONE) == 0 ||
      ++n->redial_ticks < REDIAL_DEAD_TICKS)
    return;
  n->redial_ticks = 0;
  for (size_t i = 0; i < td__transport_count(n->net); i++) {
    td__link_t *l = td__transport_at(n->net, i);
    td_member_t *m = td__link_peer(l) ? td_members_find(n->members, td__link_peer(l)) : NULL;
    if (m == NULL)
      continue;
    if (m->state != TD_PEER_DEAD) {
      m->redials = 0;
      m->vouched = false;
    } else if (m->vouched && m->redials < REDIAL_DEAD_MAX) {
      m->redials++;
      m->vouched = false;
      td__link_redial(l);
    }
  }
}

/* Heartbeat: failure detection, then our own heartbeat to every link. */
void td__gossip_tick(td__node_t *n) {
  td_members_tick(n->members, td_clock_mono_s(), on_member_event, n);
  send_heartbeat(n, NULL);
  regreet_silent(n);
  redial_dead(n);
  /* a hello that came while the ration was spent (a join right after a
   * restart's greetings) still gets its welcome, one per link and tick */
  for (size_t i = 0; i < td__transport_count(n->net); i++) {
    td__link_t *l = td__transport_at(n->net, i);
    if (td__link_reply_owed(l) && td__link_take_reply(l, 1.0 / n->heartbeat_s, WELCOME_BURST)) {
      td__link_set_reply_owed(l, false);
      send_welcome(n, l, NULL);
    }
  }
}

void td__gossip_leave(td__node_t *n, const char *why) {
  Traind__Leave leave = TRAIND__LEAVE__INIT;
  leave.reason = (char *)why;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_LEAVE;
  env.leave = &leave;
  td__transport_broadcast(n->net, &env);
}

typedef struct {
  td__node_t *n;
  size_t dialled; /* known peers with an address this node can dial */
} greeting_t;

static void greet_known_peer(uint64_t node_id, const char *endpoint, const char *state,
                             void *user) {
  greeting_t *g = user;
  td__node_t *n = g->n;
  if (node_id == n->node_id || endpoint == NULL || strcmp(state ? state : "", "left") == 0)
    return;
  td__link_t *l = td__link_ensure(n->net, node_id, endpoint);
  if (l != NULL) {
    td_log_info("saying hello to known peer %016" PRIx64 " at %s", node_id, endpoint);
    td__gossip_hello(n, l);
    g->dialled += strcmp(endpoint, TD_LISTEN_NONE) != 0;
  }
}

void td__gossip_greet_known(td__node_t *n) {
  greeting_t g = {.n = n};
  td__ledger_peers(n->ledger, greet_known_peer, &g);
  /* nobody can call a node without a peer port: with no address to dial it
   * stays alone until it is told one */
  if (g.dialled == 0 && strcmp(td__transport_endpoint(n->net), TD_LISTEN_NONE) == 0 &&
      td__access_count(n->access) > 0)
    td_log_warn("this node accepts no connections (--listen none) and knows the address of no "
                "reachable member: give it one with trainctl join tcp://HOST:PORT KEY (a member's "
                "endpoint and key) or a new invite");
}
