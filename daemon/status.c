/* status.c: the JSON that trainctl status and peers show.
 *
 * Threads: loop thread. Built from snapshots: the membership table, each
 * link's figures (td__link_stats) and the run's (td__session_stats, kept
 * after a run ends) and the ledger queue's health (td__ledgerq_stats), so no
 * other part's state is read directly here. Figures that do not exist yet
 * (no ack measured, no evaluation) are null. */
#include "daemon/internal.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static json_object *count(uint64_t v) { return json_object_new_int64((int64_t)v); }

static double positive(double v) { return v > 0 ? v : NAN; }

static double ratio(uint64_t dense, uint64_t wire) {
  return wire ? (double)dense / (double)wire : NAN;
}

static void add_link(json_object *p, td__link_t *l) {
  td__link_stats_t st = {.codec = "-"};
  if (l != NULL)
    td__link_stats(l, &st);
  json_object_object_add(p, "bytes_sent", count(st.bytes_sent));
  json_object_object_add(p, "bytes_recv", count(st.bytes_recv));
  json_object_object_add(p, "send_drops", count(st.send_drops));
  json_object_object_add(p, "codec", json_object_new_string(st.codec));
  /* direct, inbound (it accepts no connections) or relayed through `via` */
  json_object_object_add(p, "route", st.route ? json_object_new_string(st.route) : NULL);
  char via[20];
  snprintf(via, sizeof via, "%016" PRIx64, st.via);
  json_object_object_add(p, "via", st.via ? json_object_new_string(via) : NULL);
  json_object_object_add(p, "goodput_bps", td__json_real(positive(st.goodput_bps)));
  json_object_object_add(p, "ack_ms", td__json_real(positive(st.ack_s * 1e3)));
  json_object_object_add(p, "budget_bytes", td__json_real(positive(st.budget_bytes)));
  json_object_object_add(p, "rtt_ms", td__json_real(positive(st.q.rtt_s * 1e3)));
  json_object_object_add(p, "path_rtt_ms", td__json_real(positive(st.path_rtt_s * 1e3)));
  json_object_object_add(p, "window_bytes", count(st.q.window));
  json_object_object_add(p, "in_flight_bytes", count(st.q.in_flight));
  json_object_object_add(p, "queued_bytes", count(st.q.queued_bytes[TD_PRIO_UPDATE]));
  json_object_object_add(p, "update_bytes_sent", count(st.update_wire_sent));
  json_object_object_add(p, "update_bytes_recv", count(st.update_wire_recv));
  json_object_object_add(p, "ratio_sent",
                         td__json_real(ratio(st.update_dense_sent, st.update_wire_sent)));
  json_object_object_add(p, "ratio_recv",
                         td__json_real(ratio(st.update_dense_recv, st.update_wire_recv)));
}

/* What this node tells that peer to dial (null: no link, or refused). */
static void add_advertised(td__node_t *n, json_object *p, td__link_t *l) {
  const char *ep = l != NULL ? td__link_advertised(n->net, l) : NULL;
  json_object_object_add(p, "advertised", ep ? json_object_new_string(ep) : NULL);
}

json_object *td__status_peers(td__node_t *n) {
  json_object *arr = json_object_new_array();
  double now = td_clock_mono_s();
  for (size_t i = 0; i < td_members_count(n->members); i++) {
    const td_member_t *m = td_members_at(n->members, i);
    if (m->self)
      continue;
    json_object *p = json_object_new_object();
    json_object_object_add(p, "node_id", td__json_id(m->node_id));
    json_object_object_add(p, "endpoint", json_object_new_string(m->endpoint));
    json_object_object_add(p, "state", json_object_new_string(td_peer_state_name(m->state)));
    json_object_object_add(p, "last_heard_s", json_object_new_double(now - m->last_heard));
    json_object_object_add(p, "round", count(m->round));
    json_object_object_add(p, "capacity", td__json_real(positive(m->capacity)));
    add_advertised(n, p, td__link_find(n->net, m->node_id));
    add_link(p, td__link_find(n->net, m->node_id));
    json_object_array_add(arr, p);
  }
  return arr;
}

/* Model-state agreement: the last round the members voted on and who differed. */
static json_object *verify_json(const td__verify_stats_t *v) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "every", json_object_new_int64(v->every));
  json_object_object_add(o, "off", v->off[0] ? json_object_new_string(v->off) : NULL);
  json_object_object_add(o, "round", count(v->round));
  json_object_object_add(o, "members", count(v->members));
  json_object_object_add(o, "answered", count(v->answered));
  json_object_object_add(o, "agree", count(v->agree));
  json_object_object_add(o, "hash", v->round && v->hash[0] ? json_object_new_string(v->hash)
                                                            : NULL);
  json_object *diverged = json_object_new_array();
  for (size_t i = 0; i < v->n_diverged; i++)
    json_object_array_add(diverged, td__json_id(v->diverged[i]));
  json_object_object_add(o, "diverged", diverged);
  json_object_object_add(o, "checks", count(v->checks));
  json_object_object_add(o, "disagreements", count(v->disagreements));
  json_object_object_add(o, "splits", count(v->splits));
  json_object_object_add(o, "repairs", count(v->repairs));
  json_object_object_add(o, "repairing", count(v->repairing));
  return o;
}

static json_object *run_json(const td__run_stats_t *st) {
  json_object *run = json_object_new_object();
  json_object_object_add(run, "run_id", st->run_id ? td__json_id(st->run_id) : NULL);
  json_object_object_add(run, "state", json_object_new_string(td__run_state_name(st->state)));
  json_object_object_add(run, "round", count(st->rounds_done));
  json_object_object_add(run, "rounds", count(st->rounds));
  json_object_object_add(run, "rank", json_object_new_int((int)st->rank));
  json_object_object_add(run, "codec", json_object_new_string(st->codec[0] ? st->codec : "none"));
  json_object_object_add(run, "nodes", json_object_new_int((int)st->nodes));
  json_object_object_add(run, "loss", td__json_real(st->run_id ? st->loss : NAN));
  json_object_object_add(run, "eval_accuracy", td__json_real(st->eval_accuracy));
  json_object_object_add(run, "test_accuracy", td__json_real(st->test_accuracy));
  /* the final model's test loss: equal on nodes that ended on one model */
  json_object_object_add(run, "test_loss", td__json_real(st->test_loss));
  /* a text run's metric: held-out bits per byte (the accuracies stay null) */
  json_object_object_add(run, "eval_bpb", td__json_real(st->eval_bpb));
  json_object_object_add(run, "test_bpb", td__json_real(st->test_bpb));
  /* the newest round's row: bytes this node sent in it (every run frame) and
   * the update bytes it received that counted for it; null before one (flat
   * keys, none named like the run's own: scripts grep this JSON) */
  bool row = st->row_round > 0;
  json_object_object_add(run, "last_row_round", row ? count(st->row_round) : NULL);
  json_object_object_add(run, "last_row_bytes_sent", row ? count(st->row_bytes_sent) : NULL);
  json_object_object_add(run, "last_row_bytes_recv", row ? count(st->row_bytes_recv) : NULL);
  /* who exchanges with whom (topology) and, in that row, how many members'
   * updates the average held and the consensus distance (gossip, groups) */
  json_object_object_add(run, "topology",
                         st->topology[0] ? json_object_new_string(st->topology) : NULL);
  json_object_object_add(run, "last_row_mixed", row ? count(st->row_mixed) : NULL);
  json_object_object_add(run, "last_row_consensus",
                         td__json_real(row ? st->row_consensus : NAN));
  json_object_object_add(run, "updates_received", count(st->updates_received));
  json_object_object_add(run, "late_peers", count(st->late_peers));
  json_object_object_add(run, "cut_peers", count(st->cut_peers));
  json_object_object_add(run, "transfers", count(st->transfers));
  json_object_object_add(run, "reconciled", count(st->reconciled));
  json_object_object_add(run, "reconciled_partial", count(st->reconciled_partial));
  json_object_object_add(run, "reconciled_via_hub", count(st->reconciled_via_hub));
  json_object_object_add(run, "reconciled_as_hub", count(st->reconciled_as_hub));
  json_object_object_add(run, "first_round", count(st->first_round));
  json_object_object_add(run, "joins_admitted", count(st->joins_admitted));
  json_object_object_add(run, "snapshots_served", count(st->snapshots_served));
  json_object_object_add(run, "capacity", td__json_real(positive(st->capacity)));
  /* the compute backend and why (auto: the GPU it found, or why it fell back) */
  json_object_object_add(run, "backend",
                         st->backend[0] ? json_object_new_string(st->backend) : NULL);
  json_object_object_add(run, "backend_reason", st->backend_reason[0]
                                                    ? json_object_new_string(st->backend_reason)
                                                    : NULL);
  json_object_object_add(run, "error", st->error[0] ? json_object_new_string(st->error) : NULL);
  json_object_object_add(run, "refused",
                         st->refused[0] ? json_object_new_string(st->refused) : NULL);
  /* partitions (ranks) no round of the run trained, with their nodes */
  json_object_object_add(run, "untrained",
                         st->untrained[0] ? json_object_new_string(st->untrained) : NULL);
  json_object_object_add(run, "aggregate",
                         json_object_new_string(st->aggregate[0] ? st->aggregate : "mean"));
  /* members whose updates the aggregation refused (rejected, clipped, or
   * samples cut to the plan) or whose capacity the members heard differently
   * (mismatched: rounds); suspect: TD__SUSPECT_ROUNDS rounds in a row */
  json_object *outliers = json_object_new_array();
  for (size_t i = 0; i < st->n_outliers; i++) {
    const td__outlier_t *ol = &st->outliers[i];
    json_object *m = json_object_new_object();
    json_object_object_add(m, "node_id", td__json_id(st->outlier_id[i]));
    json_object_object_add(m, "rejected", count(ol->rejected));
    json_object_object_add(m, "clipped", count(ol->clipped));
    json_object_object_add(m, "clamped", count(ol->clamped));
    json_object_object_add(m, "mismatched", count(ol->mismatched));
    json_object_object_add(m, "streak", count(ol->streak));
    json_object_object_add(m, "suspect", json_object_new_boolean(ol->suspect));
    json_object_array_add(outliers, m);
  }
  json_object_object_add(run, "outliers", outliers);
  json_object_object_add(run, "verify", verify_json(&st->verify));
  return run;
}

/* "ok", or "degraded" with why and what is kept in memory meanwhile. */
static json_object *ledger_json(td__node_t *n) {
  td__ledgerq_stats_t st;
  td__ledgerq_stats(n->ledger, &st);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "state", json_object_new_string(st.degraded ? "degraded" : "ok"));
  json_object_object_add(o, "cause", st.degraded ? json_object_new_string(st.cause) : NULL);
  json_object_object_add(o, "detail", st.degraded ? json_object_new_string(st.detail) : NULL);
  json_object_object_add(o, "causes", st.degraded ? json_object_new_string(st.causes) : NULL);
  json_object_object_add(o, "degraded_s",
                         td__json_real(st.degraded ? td_clock_wall_s() - st.since : NAN));
  json_object_object_add(o, "failed_writes", count(st.failed_writes));
  json_object_object_add(o, "failures_total", count(st.failures_total));
  json_object_object_add(o, "pending_rows", count(st.pending_rows));
  json_object_object_add(o, "pending_bytes", count(st.pending_bytes));
  json_object_object_add(o, "buffer_bytes", count(st.buffer_bytes));
  json_object_object_add(o, "dropped_rows", count(st.dropped_rows));
  json_object_object_add(o, "refused_rows", count(st.refused_rows));
  return o;
}

/* The descriptor budget (daemon/net/descriptors.c) and what uses it now. */
static json_object *descriptors_json(td__node_t *n) {
  const td__descriptors_t *d = td__transport_descriptors(n->net);
  td__inbound_stats_t in;
  td__transport_inbound_stats(n->net, &in);
  long open_now = td__descriptors_open();
  json_object *o = json_object_new_object();
  json_object_object_add(o, "open", open_now >= 0 ? count((uint64_t)open_now) : NULL);
  json_object_object_add(o, "limit", count(d->limit));
  json_object_object_add(o, "cap", count(d->cap));
  json_object_object_add(o, "reserve", count(d->reserve));
  json_object_object_add(o, "control_clients_cap", count(d->control_clients));
  json_object_object_add(o, "inbound", count(in.inbound));
  json_object_object_add(o, "inbound_cap", count(d->inbound));
  json_object_object_add(o, "per_address_cap", count(d->per_address));
  json_object_object_add(o, "pending", count(in.pending));
  json_object_object_add(o, "pending_cap", count(d->pending));
  json_object_object_add(o, "addresses", count(in.addresses));
  json_object_object_add(o, "shed", count(in.shed));
  json_object_object_add(o, "idle_closed", count(in.idle_closed));
  json_object_object_add(o, "handshakes_limited", count(in.handshake_limited));
  return o;
}

json_object *td__status_json(td__node_t *n) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "node_id", td__json_id(n->node_id));
  json_object_object_add(o, "endpoint", json_object_new_string(td__transport_endpoint(n->net)));
  json_object_object_add(o, "listen",
                         json_object_new_string(td__transport_listen_endpoint(n->net)));
  uint64_t relayed_out, relayed_in, relay_forwarded;
  td__transport_relay_stats(n->net, &relayed_out, &relayed_in, &relay_forwarded);
  json_object *relay = json_object_new_object();
  json_object_object_add(relay, "sent", count(relayed_out));
  json_object_object_add(relay, "received", count(relayed_in));
  json_object_object_add(relay, "forwarded", count(relay_forwarded));
  json_object_object_add(o, "relay", relay);
  /* absolute, so that trainctl --socket S runs finds the ledger from any directory */
  char data_dir[PATH_MAX];
  json_object_object_add(o, "data_dir", json_object_new_string(realpath(n->data_dir, data_dir)
                                                                   ? data_dir
                                                                   : n->data_dir));
  td__access_stats_t as;
  td__access_stats(n->access, &as);
  json_object_object_add(o, "security", json_object_new_string(as.secure ? "curve" : "insecure"));
  json_object_object_add(o, "public_key",
                         json_object_new_string(td__access_keypair(n->access)->pub));
  json_object *acc = json_object_new_object();
  json_object_object_add(acc, "admitted_keys", count(as.allowed));
  json_object_object_add(acc, "refused_connections", count(as.refused_keys));
  json_object_object_add(acc, "forged_senders", count(as.forged_senders));
  json_object_object_add(acc, "forbidden_requests", count(as.forbidden));
  json_object_object_add(acc, "admission", td__admit_status(n));
  json_object_object_add(o, "access", acc);
  json_object_object_add(o, "peers", td__status_peers(n));
  /* members whose slot a new node took in a full table (members.h) */
  json_object_object_add(o, "members_evicted", count(td_members_evictions(n->members)));
  td__run_stats_t st;
  td__session_stats(n, &st);
  json_object_object_add(o, "run", run_json(&st));
  json_object *d = json_object_new_object();
  for (int k = 0; k < TD__DROP_COUNT; k++)
    json_object_object_add(d, td__drop_name((td__drop_t)k), count(n->drops.count[k]));
  json_object_object_add(o, "drops", d);
  json_object_object_add(o, "descriptors", descriptors_json(n));
  json_object_object_add(o, "ledger", ledger_json(n));
  return o;
}
