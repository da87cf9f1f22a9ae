/* linkstats.c: what each link measures and counts: bytes and messages each
 * way, the goodput fitted from update acknowledgements and the codec budget
 * it allows (docs/algorithms.md#per-link-budgets-codec-auto), the path
 * round-trip time from heartbeat echoes (and, from them, a connection of
 * ours the peer never hears, which transport.c dials again), the token bucket that rations
 * replies to a peer, and the transport's relay, descriptor and inbound
 * counters that status shows. */
#include "daemon/net/transport_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "scheduler/budget.h"

void td__link_note_recv(td__link_t *l, uint64_t bytes) { l->bytes_recv += bytes; }

void td__link_note_update_recv(td__link_t *l, uint64_t wire, uint64_t dense) {
  l->update_wire_recv += wire;
  l->update_dense_recv += dense;
}

void td__link_note_update_sent(td__link_t *l, uint64_t round, uint64_t wire, uint64_t dense,
                               const char *codec) {
  l->update_wire_sent += wire;
  l->update_dense_sent += dense;
  snprintf(l->codec, sizeof l->codec, "%s", codec);
  pending_update_t *p = &l->pending[round % 2];
  p->round = round;
  p->bytes = wire;
  p->sent_at = td_clock_mono_s();
  snprintf(p->codec, sizeof p->codec, "%s", codec);
}

double td__link_fit_budget(td__link_t *l, uint64_t round, double compute_s, double min_s) {
  /* the update two rounds back still unacknowledged (its slot is about to be
   * reused) caps the estimate at what the link delivered since */
  const pending_update_t *old = &l->pending[round % 2];
  double since = old->sent_at > 0 ? td_clock_mono_s() - old->sent_at : 0;
  l->goodput_bps = td_budget_goodput_unacked(l->goodput_bps, old->bytes, since);
  if (!(l->goodput_bps > 0))
    return 0;
  l->budget = td_budget_link_bytes(l->goodput_bps, compute_s, min_s);
  return l->budget;
}

bool td__link_update_acked(td__link_t *l, uint64_t round, uint64_t bytes, td_ledger_link_t *row,
                           char *codec, size_t codec_len) {
  pending_update_t *p = &l->pending[round % 2];
  if (round != p->round || p->sent_at <= 0 || bytes != p->bytes)
    return false; /* stale, duplicate or forged: nothing to learn */
  double dt = td_clock_mono_s() - p->sent_at;
  p->sent_at = 0;
  if (!(dt > 0))
    return false;
  l->ack_s = dt;
  l->goodput_bps = td_budget_goodput_acked(l->goodput_bps, (double)bytes, dt, l->budget);
  td_linkq_stats_t qs;
  td_linkq_stats(l->q, &qs);
  *row = (td_ledger_link_t){.round = round, .peer = l->peer, .at = td_clock_wall_s(),
                            .goodput_bps = l->goodput_bps,
                            .rtt_ms = qs.rtt_s > 0 ? qs.rtt_s * 1e3 : NAN,
                            .budget_bytes = l->budget, .window_bytes = qs.window,
                            .bytes_sent = bytes};
  snprintf(codec, codec_len, "%s", p->codec);
  return true;
}

/* Heartbeat stamps are monotonic microseconds: 0 means none. */
static uint64_t mono_us(double s) { return s > 0 ? (uint64_t)(s * 1e6) : 0; }

void td__link_echo_out(td__link_t *l, uint64_t *stamp_us, uint64_t *echo_us, uint64_t *hold_us) {
  double now = td_clock_mono_s();
  *stamp_us = mono_us(now);
  *echo_us = l->echo_us;
  *hold_us = l->echo_us != 0 ? mono_us(now - l->echo_heard_at) : 0;
}

/* The peer's heartbeats echo the newest of ours it heard. When the echo
 * stays the same for this many of them and this long, our own connection to
 * it is dead while its to us works: libzmq does not dial again after the
 * peer refused the handshake (its ZAP handler did not know our key yet,
 * in a join storm), so the node dials again itself. */
#define ECHO_STALE_HEARTBEATS 4
#define ECHO_STALE_S 2.0

static void check_heard_back(td__link_t *l, uint64_t echo_us, double now) {
  if (echo_us != l->echo_back || l->echo_back_at == 0) {
    l->echo_back = echo_us;
    l->echo_back_at = now;
    l->echo_stale = 0;
    return;
  }
  if (++l->echo_stale < ECHO_STALE_HEARTBEATS || now - l->echo_back_at < ECHO_STALE_S ||
      l->route != LINK_DIRECT)
    return;
  td_log_warn("%016" PRIx64 " has not heard this node for %.0f s while it is heard: dialing "
              "%s again", l->peer, now - l->echo_back_at, l->endpoint);
  td__link_redial(l);
  l->echo_back_at = now;
  l->echo_stale = 0;
}

/* The peer's heartbeats also say how many of our handshakes it refused
 * before it knew our key. Both of our connections to it may be refused, or
 * only one: then its heartbeats reach us and ours reach it, the echo moves,
 * and only this count tells that our other connection is dead. */
void td__link_refused_in(td__link_t *l, uint32_t refused) {
  double now = td_clock_mono_s();
  if (refused <= l->refused_seen || l->route != LINK_DIRECT ||
      (l->refused_redial_at > 0 && now - l->refused_redial_at < ECHO_STALE_S))
    return;
  td_log_warn("%016" PRIx64 " refused %" PRIu32 " handshakes of this node before it knew its "
              "key: dialing %s again", l->peer, refused - l->refused_seen, l->endpoint);
  l->refused_seen = refused;
  l->refused_redial_at = now;
  td__link_redial(l);
}

void td__link_echo_in(td__link_t *l, uint64_t stamp_us, uint64_t echo_us, uint64_t hold_us) {
  double now = td_clock_mono_s();
  l->echo_us = stamp_us; /* the peer's own clock: echoed back as it is, never read */
  l->echo_heard_at = now;
  check_heard_back(l, echo_us, now);
  /* an echo of our stamp (under a minute old) is an RTT sample */
  td_pathrtt_sample(&l->path, td_pathrtt_echo(mono_us(now), echo_us, hold_us, 60000000u), now);
}

void td__link_stats(td__link_t *l, td__link_stats_t *out) {
  *out = (td__link_stats_t){.bytes_sent = l->bytes_sent, .bytes_recv = l->bytes_recv,
                            .send_drops = l->send_drops,
                            .update_wire_sent = l->update_wire_sent,
                            .update_dense_sent = l->update_dense_sent,
                            .update_wire_recv = l->update_wire_recv,
                            .update_dense_recv = l->update_dense_recv,
                            .codec = l->codec[0] ? l->codec : "-",
                            .goodput_bps = l->goodput_bps, .ack_s = l->ack_s,
                            .budget_bytes = l->budget, .path_rtt_s = td_pathrtt(&l->path),
                            .route = l->route == LINK_REVERSE   ? "inbound"
                                     : l->route == LINK_RELAYED ? "relayed"
                                                                : "direct",
                            .via = l->route == LINK_RELAYED ? l->via : 0};
  td_linkq_stats(l->q, &out->q);
}

bool td__link_take_reply(td__link_t *l, double per_s, double burst) {
  double now = td_clock_mono_s();
  if (l->reply_at <= 0)
    l->reply_tokens = burst;
  else
    l->reply_tokens = fmin(burst, l->reply_tokens + (now - l->reply_at) * per_s);
  l->reply_at = now;
  if (l->reply_tokens < 1.0)
    return false;
  l->reply_tokens -= 1.0;
  return true;
}

void td__link_set_reply_owed(td__link_t *l, bool owed) { l->reply_owed = owed; }
bool td__link_reply_owed(const td__link_t *l) { return l->reply_owed; }

void td__transport_relay_stats(const td__transport_t *t, uint64_t *out, uint64_t *in,
                               uint64_t *forwarded) {
  *out = t->relayed_out;
  *in = t->relayed_in;
  *forwarded = t->relay_forwarded;
}

const td__descriptors_t *td__transport_descriptors(const td__transport_t *t) {
  return td__inbound_shares(t->inbound);
}

void td__transport_inbound_stats(const td__transport_t *t, td__inbound_stats_t *out) {
  td__inbound_stats(t->inbound, out);
  out->handshake_limited = td__zap_limited(t->zap);
}


