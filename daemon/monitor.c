/* monitor.c: the node's figures for `traind --metrics HOST:PORT`.
 *
 * Threads: td__monitor_publish() runs on the loop thread (each heartbeat and
 * each closed round): it fills a td_metrics_stats_t from the parts' snapshot
 * calls (td__session_stats, td__link_stats, the membership table, the drop
 * counters, the ledger queue's health and the node's totals) into a back buffer that only it touches,
 * then swaps it with the published one under the mutex. The HTTP server
 * (daemon/metrics.h, libmicrohttpd's own thread) formats the published copy
 * under the same mutex, so it never reads loop-owned state. Closing stops
 * the server before the buffers go. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/internal.h"
#include "daemon/base/log.h"
#include "daemon/metrics.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "dev"
#endif

/* One self-contained snapshot: st's pointers lead into this struct only. */
typedef struct {
  td_metrics_stats_t st;
  td_metrics_link_t links[TD_MEMBERS_MAX];
  char codecs[TD_MEMBERS_MAX][32];
  td_metrics_drop_t drops[TD__DROP_COUNT];
  char ledger_cause[32];
  char backend[16], backend_reason[256];
} snapshot_t;

struct td__monitor {
  td__node_t *node;
  td_metrics_t *http;
  pthread_mutex_t lock;
  snapshot_t *published; /* read by the server under lock */
  snapshot_t *back;      /* the loop thread's; filled unlocked */
  char port_path[600];   /* DATA_DIR/metrics_port, removed at close */
};

static double positive(double v) { return v > 0 ? v : NAN; }

static void fill(td__node_t *n, snapshot_t *p) {
  td__run_stats_t run;
  td__session_stats(n, &run);
  td_metrics_stats_t *st = &p->st;
  *st = (td_metrics_stats_t){
      .node_id = n->node_id, .version = PACKAGE_VERSION, .run_id = run.run_id,
      .running = run.state == TD__RUN_RUNNING, .round = run.rounds_done,
      .rounds_total = n->totals.rounds, .loss = run.run_id ? run.loss : NAN,
      .eval_accuracy = run.eval_accuracy, .eval_bpb = run.eval_bpb, .compute_seconds_total = n->totals.compute_s,
      .wait_seconds_total = n->totals.wait_s, .samples_total = n->totals.samples,
      .links = p->links, .drops = p->drops, .n_drops = TD__DROP_COUNT};
  snprintf(p->backend, sizeof p->backend, "%s", run.backend);
  snprintf(p->backend_reason, sizeof p->backend_reason, "%s", run.backend_reason);
  st->backend = p->backend[0] ? p->backend : NULL;
  st->backend_reason = p->backend_reason;
  for (size_t i = 0; i < td_members_count(n->members); i++) {
    const td_member_t *m = td_members_at(n->members, i);
    if (m->self)
      continue;
    switch (m->state) {
    case TD_PEER_ALIVE: st->peers_alive++; break;
    case TD_PEER_SUSPECT: st->peers_suspect++; break;
    case TD_PEER_DEAD: st->peers_dead++; break;
    case TD_PEER_LEFT: st->peers_left++; break;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < td__transport_count(n->net) && k < TD_MEMBERS_MAX; i++) {
    td__link_t *l = td__transport_at(n->net, i);
    uint64_t peer = td__link_peer(l);
    if (peer == 0) /* not introduced yet: no name to label it with */
      continue;
    td__link_stats_t ls = {.codec = "-"};
    td__link_stats(l, &ls);
    snprintf(p->codecs[k], sizeof p->codecs[k], "%s", ls.codec ? ls.codec : "-");
    p->links[k] = (td_metrics_link_t){
        .peer = peer, .bytes_sent = ls.bytes_sent, .bytes_recv = ls.bytes_recv,
        .goodput_bytes_per_s = positive(ls.goodput_bps), .rtt_s = positive(ls.q.rtt_s),
        .path_rtt_s = positive(ls.path_rtt_s),
        .staleness_rounds = td__session_staleness(n, peer),
        .codec = strcmp(p->codecs[k], "-") != 0 ? p->codecs[k] : NULL};
    k++;
  }
  st->n_links = k;
  for (int d = 0; d < TD__DROP_COUNT; d++)
    p->drops[d] = (td_metrics_drop_t){td__drop_name((td__drop_t)d), n->drops.count[d]};
  td__ledgerq_stats_t lq;
  td__ledgerq_stats(n->ledger, &lq);
  snprintf(p->ledger_cause, sizeof p->ledger_cause, "%s", lq.cause);
  st->ledger_degraded = lq.degraded;
  st->ledger_cause = lq.degraded ? p->ledger_cause : NULL;
  st->ledger_pending_rows = lq.pending_rows;
  st->ledger_write_failures_total = lq.failures_total;
  st->ledger_dropped_rows_total = lq.dropped_rows + lq.refused_rows;
}

void td__monitor_publish(td__monitor_t *m) {
  if (m == NULL)
    return;
  fill(m->node, m->back);
  pthread_mutex_lock(&m->lock);
  snapshot_t *t = m->published;
  m->published = m->back;
  m->back = t;
  pthread_mutex_unlock(&m->lock);
}

/* The server's thread: the published copy, nothing else. */
static char *text(void *arg) {
  td__monitor_t *m = arg;
  char *out = NULL;
  size_t len;
  pthread_mutex_lock(&m->lock);
  int rc = td_metrics_format(&m->published->st, &out, &len);
  pthread_mutex_unlock(&m->lock);
  return rc == 0 ? out : NULL;
}

void td__monitor_close(td__monitor_t **self_p) {
  td__monitor_t *m = *self_p;
  if (m == NULL)
    return;
  if (m->http != NULL)
    unlink(m->port_path);
  td_metrics_close(&m->http); /* no request runs after this */
  pthread_mutex_destroy(&m->lock);
  free(m->published);
  free(m->back);
  free(m);
  *self_p = NULL;
}

int td__monitor_open(td__monitor_t **out, td__node_t *n, const char *host_port, char *why,
                     size_t why_len) {
  *out = NULL;
  td__monitor_t *m = calloc(1, sizeof *m);
  if (m == NULL || (m->published = calloc(1, sizeof *m->published)) == NULL ||
      (m->back = calloc(1, sizeof *m->back)) == NULL) {
    if (m != NULL)
      free(m->published);
    free(m);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  m->node = n;
  pthread_mutex_init(&m->lock, NULL);
  td__monitor_publish(m); /* a first scrape already has figures */
  int rc = td_metrics_open(&m->http, host_port, text, m, why, why_len);
  if (rc != 0) {
    td__monitor_close(&m);
    return rc;
  }
  snprintf(m->port_path, sizeof m->port_path, "%s/metrics_port", n->data_dir);
  FILE *f = fopen(m->port_path, "w");
  if (f != NULL) { /* where it listens, for scripts when the port was 0 */
    fprintf(f, "%u\n", td_metrics_port(m->http));
    fclose(f);
  }
  td_log_info("metrics on %s (port %u), GET /metrics", host_port, td_metrics_port(m->http));
  *out = m;
  return 0;
}
