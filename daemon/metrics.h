/* metrics.h: the node's state for monitoring, in the Prometheus text format.
 *
 * Two independent halves. td_metrics_format() turns a plain snapshot of the
 * node (td_metrics_stats_t: run progress, per-link traffic, drops, peers,
 * compute and wait time) into the Prometheus text exposition format 0.0.4.
 * td_metrics_open() serves GET /metrics on HOST:PORT with libmicrohttpd (one
 * internal thread of its own; no HTTP parsing here): on each request it calls
 * the caller's `text` callback ON THE SERVER'S THREAD, so the callback must
 * only read state it may read from another thread (e.g. a snapshot the loop
 * thread publishes under a mutex) and return a malloc'd text. Off unless a
 * caller opens it. */
#ifndef TD_METRICS_H
#define TD_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* One link, as the node sees it. */
typedef struct {
  uint64_t peer;             /* node id */
  uint64_t bytes_sent, bytes_recv;
  double goodput_bytes_per_s; /* NaN when not measured yet */
  double rtt_s;              /* update chunks' RTT; NaN when not measured yet */
  double path_rtt_s;         /* heartbeat echoes' (scheduler/pathrtt.h); NaN likewise */
  double staleness_rounds;   /* of the last update received from it; NaN if none */
  const char *codec;         /* the codec the link uses now; NULL if none */
} td_metrics_link_t;

typedef struct {
  const char *name; /* "bad_envelope", "stale_update", ... */
  uint64_t count;
} td_metrics_drop_t;

typedef struct {
  uint64_t node_id;
  const char *version;
  /* the current (or last) run */
  uint64_t run_id;           /* 0 when there was none */
  int running;               /* 1 while a run is in progress */
  uint64_t round;            /* current round */
  uint64_t rounds_total;     /* rounds completed since the daemon started */
  double loss;               /* last training loss; NaN if none */
  double eval_accuracy;      /* last evaluation; NaN if none */
  double eval_bpb;           /* text runs: last held-out bits per byte; NaN otherwise */
  const char *backend;        /* the run's compute backend (cpu, cuda); NULL before one opened */
  const char *backend_reason; /* which backend and why ("cpu (auto: no usable GPU: ...)") */
  double compute_seconds_total, wait_seconds_total;
  uint64_t samples_total;
  uint64_t peers_alive, peers_suspect, peers_dead, peers_left;
  const td_metrics_link_t *links;
  size_t n_links;
  const td_metrics_drop_t *drops;
  size_t n_drops;
  /* the ledger: degraded while its writes fail (rows kept in memory) */
  int ledger_degraded;
  const char *ledger_cause;  /* "disk full", "I/O error", ...; NULL when not degraded */
  uint64_t ledger_pending_rows;
  uint64_t ledger_write_failures_total, ledger_dropped_rows_total;
} td_metrics_stats_t;

/* The exposition text of `s` (HELP and TYPE for every family; counters end in
 * _total; NaN values are left out). Caller frees *text. TD_ENOMEM. */
int td_metrics_format(const td_metrics_stats_t *s, char **text, size_t *len);

/* Check a host_port that td_metrics_open() would take (the host is resolved,
 * nothing is bound). TD_ECONFIG with a reason in why. */
int td_metrics_check_addr(const char *host_port, char *why, size_t why_len);

/* Returns a malloc'd text (NULL: the request gets a 500). Runs on the
 * server's thread. */
typedef char *(*td_metrics_text_fn)(void *arg);

typedef struct td_metrics td_metrics_t;

/* Serve GET/HEAD /metrics on host_port ("127.0.0.1:9100", "[::1]:9100",
 * ":9100" or "*:9100" for every IPv4 address; port 0 picks one, see
 * td_metrics_port). TD_ECONFIG (bad address) or TD_EIO (cannot bind) with a
 * reason in why. Caller owns *out. */
int td_metrics_open(td_metrics_t **out, const char *host_port, td_metrics_text_fn text, void *arg,
                    char *why, size_t why_len);
/* The port it listens on. */
unsigned td_metrics_port(const td_metrics_t *m);
/* Stop serving (waits for a request in progress). NULL-safe. */
void td_metrics_close(td_metrics_t **self_p);

#endif
