/* metrics.c: Prometheus text formatting and the /metrics HTTP endpoint.
 *
 * Formatting writes into an open_memstream buffer, one metric family at a
 * time, each with its HELP and TYPE lines (promtool checks both). HTTP is
 * libmicrohttpd's: it parses requests on its own internal thread and calls
 * on_request() there; nothing in this file reads a socket. */
#include "daemon/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/error.h"

struct td_metrics {
  struct MHD_Daemon *mhd;
  td_metrics_text_fn text;
  void *arg;
  unsigned port;
};

/* ---- formatting ------------------------------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *v) {
  fputc('"', f);
  for (; v && *v; v++) {
    if (*v == '\\' || *v == '"')
      fputc('\\', f);
    if (*v == '\n') {
      fputs("\\n", f);
      continue;
    }
    fputc(*v, f);
  }
  fputc('"', f);
}

/* The shortest of %.15g / %.17g that reads back as v (0.0125, not 0.012500000000000001). */
static const char *num(char *buf, size_t len, double v) {
  snprintf(buf, len, "%.15g", v);
  if (strtod(buf, NULL) != v)
    snprintf(buf, len, "%.17g", v);
  return buf;
}

static void sample_double(FILE *f, const char *name, double v) {
  char b[32];
  if (!isnan(v))
    fprintf(f, "%s %s\n", name, num(b, sizeof b, v));
}

static void link_double(FILE *f, const char *name, uint64_t peer, double v) {
  char b[32];
  if (!isnan(v))
    fprintf(f, "%s{peer=\"%016" PRIx64 "\"} %s\n", name, peer, num(b, sizeof b, v));
}

int td_metrics_format(const td_metrics_stats_t *s, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  FILE *f = open_memstream(text, len);
  if (f == NULL)
    return TD_ENOMEM;
  char id[17], run[17];
  snprintf(id, sizeof id, "%016" PRIx64, s->node_id);
  snprintf(run, sizeof run, "%016" PRIx64, s->run_id);

  family(f, "traind_info", "gauge", "The node's id and traind version (always 1).");
  fprintf(f, "traind_info{node_id=\"%s\",version=", id);
  label_value(f, s->version ? s->version : "");
  fputs("} 1\n", f);

  family(f, "traind_run_running", "gauge", "1 while a run is in progress.");
  fprintf(f, "traind_run_running{run_id=\"%s\"} %d\n", run, s->running ? 1 : 0);
  family(f, "traind_run_round", "gauge", "Current round of the current (or last) run.");
  fprintf(f, "traind_run_round %" PRIu64 "\n", s->round);
  family(f, "traind_rounds_total", "counter", "Rounds completed since the daemon started.");
  fprintf(f, "traind_rounds_total %" PRIu64 "\n", s->rounds_total);
  family(f, "traind_samples_total", "counter", "Samples trained since the daemon started.");
  fprintf(f, "traind_samples_total %" PRIu64 "\n", s->samples_total);
  family(f, "traind_run_loss", "gauge", "Training loss of the last round.");
  sample_double(f, "traind_run_loss", s->loss);
  family(f, "traind_run_eval_accuracy", "gauge", "Accuracy of the last evaluation.");
  sample_double(f, "traind_run_eval_accuracy", s->eval_accuracy);
  family(f, "traind_run_eval_bpb", "gauge",
         "Held-out loss in bits per byte of the last evaluation (text runs).");
  sample_double(f, "traind_run_eval_bpb", s->eval_bpb);
  family(f, "traind_run_backend_info", "gauge",
         "The run's compute backend and why it was chosen (always 1; present once the run "
         "opened it).");
  if (s->backend != NULL) {
    fputs("traind_run_backend_info{backend=", f);
    label_value(f, s->backend);
    fputs(",reason=", f);
    label_value(f, s->backend_reason ? s->backend_reason : "");
    fputs("} 1\n", f);
  }
  family(f, "traind_compute_seconds_total", "counter",
         "Seconds spent computing rounds (slowdown included).");
  sample_double(f, "traind_compute_seconds_total", s->compute_seconds_total);
  family(f, "traind_wait_seconds_total", "counter",
         "Seconds compute was blocked waiting for the network.");
  sample_double(f, "traind_wait_seconds_total", s->wait_seconds_total);

  family(f, "traind_peers", "gauge", "Members by liveness state.");
  fprintf(f, "traind_peers{state=\"alive\"} %" PRIu64 "\n", s->peers_alive);
  fprintf(f, "traind_peers{state=\"suspect\"} %" PRIu64 "\n", s->peers_suspect);
  fprintf(f, "traind_peers{state=\"dead\"} %" PRIu64 "\n", s->peers_dead);
  fprintf(f, "traind_peers{state=\"left\"} %" PRIu64 "\n", s->peers_left);

  family(f, "traind_link_sent_bytes_total", "counter", "Bytes sent to the peer.");
  for (size_t i = 0; i < s->n_links; i++)
    fprintf(f, "traind_link_sent_bytes_total{peer=\"%016" PRIx64 "\"} %" PRIu64 "\n",
            s->links[i].peer, s->links[i].bytes_sent);
  family(f, "traind_link_received_bytes_total", "counter", "Bytes received from the peer.");
  for (size_t i = 0; i < s->n_links; i++)
    fprintf(f, "traind_link_received_bytes_total{peer=\"%016" PRIx64 "\"} %" PRIu64 "\n",
            s->links[i].peer, s->links[i].bytes_recv);
  family(f, "traind_link_goodput_bytes_per_second", "gauge",
         "Measured delivery rate to the peer (EWMA).");
  for (size_t i = 0; i < s->n_links; i++)
    link_double(f, "traind_link_goodput_bytes_per_second", s->links[i].peer,
                s->links[i].goodput_bytes_per_s);
  family(f, "traind_link_rtt_seconds", "gauge",
         "Round-trip time of update chunks to the peer (EWMA).");
  for (size_t i = 0; i < s->n_links; i++)
    link_double(f, "traind_link_rtt_seconds", s->links[i].peer, s->links[i].rtt_s);
  family(f, "traind_link_path_rtt_seconds", "gauge",
         "Path round-trip time to the peer (smallest heartbeat echo of the last 10-20 s).");
  for (size_t i = 0; i < s->n_links; i++)
    link_double(f, "traind_link_path_rtt_seconds", s->links[i].peer, s->links[i].path_rtt_s);
  family(f, "traind_link_staleness_rounds", "gauge",
         "Staleness of the last update received from the peer.");
  for (size_t i = 0; i < s->n_links; i++)
    link_double(f, "traind_link_staleness_rounds", s->links[i].peer, s->links[i].staleness_rounds);
  family(f, "traind_link_codec_info", "gauge", "The codec the link uses now (always 1).");
  for (size_t i = 0; i < s->n_links; i++) {
    if (s->links[i].codec == NULL)
      continue;
    fprintf(f, "traind_link_codec_info{peer=\"%016" PRIx64 "\",codec=", s->links[i].peer);
    label_value(f, s->links[i].codec);
    fputs("} 1\n", f);
  }

  family(f, "traind_dropped_messages_total", "counter",
         "Peer messages dropped, by reason (bad, unexpected or stale).");
  for (size_t i = 0; i < s->n_drops; i++) {
    fputs("traind_dropped_messages_total{kind=", f);
    label_value(f, s->drops[i].name);
    fprintf(f, "} %" PRIu64 "\n", s->drops[i].count);
  }

  family(f, "traind_ledger_degraded", "gauge",
         "1 while ledger writes fail and rows are kept in memory.");
  fprintf(f, "traind_ledger_degraded %d\n", s->ledger_degraded ? 1 : 0);
  family(f, "traind_ledger_fault_info", "gauge",
         "Why the ledger is degraded (always 1; present only while it is).");
  if (s->ledger_degraded && s->ledger_cause != NULL) {
    fputs("traind_ledger_fault_info{cause=", f);
    label_value(f, s->ledger_cause);
    fputs("} 1\n", f);
  }
  family(f, "traind_ledger_pending_rows", "gauge", "Ledger rows waiting in memory.");
  fprintf(f, "traind_ledger_pending_rows %" PRIu64 "\n", s->ledger_pending_rows);
  family(f, "traind_ledger_write_failures_total", "counter",
         "Ledger batches that could not be written (each is kept and tried again).");
  fprintf(f, "traind_ledger_write_failures_total %" PRIu64 "\n", s->ledger_write_failures_total);
  family(f, "traind_ledger_dropped_rows_total", "counter",
         "Ledger rows dropped: over the memory bound while degraded, or refused by SQLite.");
  fprintf(f, "traind_ledger_dropped_rows_total %" PRIu64 "\n", s->ledger_dropped_rows_total);
  if (fclose(f) != 0) {
    free(*text);
    *text = NULL;
    *len = 0;
    return TD_ENOMEM;
  }
  return 0;
}

/* ---- the endpoint ----------------------------------------------------------------------- */

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, char *body,
                              enum MHD_ResponseMemoryMode mode, const char *type) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, mode);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
  td_metrics_t *m = cls;
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)req_cls;
  static const char plain[] = "text/plain; charset=utf-8";
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n", MHD_RESPMEM_PERSISTENT,
                  plain);
  if (strcmp(url, "/metrics") != 0)
    return answer(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n", MHD_RESPMEM_PERSISTENT,
                  plain);
  char *text = m->text(m->arg);
  if (text == NULL)
    return answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "no metrics\n", MHD_RESPMEM_PERSISTENT,
                  plain);
  return answer(c, MHD_HTTP_OK, text, MHD_RESPMEM_MUST_FREE,
                "text/plain; version=0.0.4; charset=utf-8");
}

/* "HOST:PORT", "[V6]:PORT", ":PORT", "*:PORT" -> an address to bind. */
static int parse_addr(const char *hp, struct sockaddr_storage *ss, bool *v6, unsigned *port,
                      char *why, size_t n) {
  const char *colon = strrchr(hp, ':');
  if (colon == NULL || colon[1] == '\0')
    return td_why(why, n, TD_ECONFIG, "metrics address '%s': expected HOST:PORT", hp);
  char *end;
  errno = 0;
  unsigned long p = strtoul(colon + 1, &end, 10);
  if (*end != '\0' || errno != 0 || p > 65535 || colon[1] == '-')
    return td_why(why, n, TD_ECONFIG, "metrics address '%s': bad port", hp);
  char host[256];
  size_t hl = (size_t)(colon - hp);
  if (hl >= sizeof host)
    return td_why(why, n, TD_ECONFIG, "metrics address '%s': host too long", hp);
  memcpy(host, hp, hl);
  host[hl] = '\0';
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  memset(ss, 0, sizeof *ss);
  *port = (unsigned)p;
  if (host[0] == '\0' || strcmp(host, "*") == 0) {
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons((uint16_t)p);
    *v6 = false;
    return 0;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
  int g = getaddrinfo(host, NULL, &hints, &res);
  if (g != 0 || res == NULL)
    return td_why(why, n, TD_ECONFIG, "metrics address '%s': %s", hp, gai_strerror(g));
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  *v6 = ss->ss_family == AF_INET6;
  if (*v6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)p);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)p);
  return 0;
}

int td_metrics_check_addr(const char *host_port, char *why, size_t why_len) {
  struct sockaddr_storage ss;
  bool v6 = false;
  unsigned port = 0;
  return parse_addr(host_port, &ss, &v6, &port, why, why_len);
}

int td_metrics_open(td_metrics_t **out, const char *host_port, td_metrics_text_fn text, void *arg,
                    char *why, size_t why_len) {
  *out = NULL;
  struct sockaddr_storage ss;
  bool v6 = false;
  unsigned port = 0;
  int rc = parse_addr(host_port, &ss, &v6, &port, why, why_len);
  if (rc != 0)
    return rc;
  td_metrics_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  m->text = text;
  m->arg = arg;
  errno = 0;
  m->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | (v6 ? MHD_USE_IPv6 : 0),
                            (uint16_t)port, NULL, NULL, on_request, m,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  if (m->mhd == NULL) {
    int e = errno;
    free(m);
    return td_why(why, why_len, TD_EIO, "cannot serve metrics on %s: %s", host_port,
                  e ? strerror(e) : "the address is in use or not local");
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
  m->port = info ? info->port : port;
  *out = m;
  return 0;
}

unsigned td_metrics_port(const td_metrics_t *m) { return m->port; }

void td_metrics_close(td_metrics_t **self_p) {
  td_metrics_t *m = *self_p;
  if (m == NULL)
    return;
  MHD_stop_daemon(m->mhd);
  free(m);
  *self_p = NULL;
}
