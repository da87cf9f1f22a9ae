/* test_metrics.c: the Prometheus text of daemon/metrics.h and its endpoint.
 *
 * Formatting is checked line by line (families, labels, escaping, NaN left
 * out); the endpoint is fetched over loopback with a plain HTTP/1.0 request
 * (status, content type, body = the callback's text, 404 and 405 for other
 * paths and methods), counters move between two scrapes, and when promtool
 * (Debian prometheus) is installed, `promtool check metrics` accepts the body. */
#include <arpa/inet.h>
#include <check.h>
#include <stdbool.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/metrics.h"

static td_metrics_link_t links[2] = {
    {.peer = 0xfeed000000000001ull, .bytes_sent = 1000, .bytes_recv = 2000,
     .goodput_bytes_per_s = 250000.0, .rtt_s = 0.0125, .path_rtt_s = 0.1015, .staleness_rounds = 1,
     .codec = "topk:0.01"},
    {.peer = 0xfeed000000000002ull, .bytes_sent = 10, .bytes_recv = 20, .goodput_bytes_per_s = NAN,
     .rtt_s = NAN, .path_rtt_s = NAN, .staleness_rounds = NAN, .codec = "we\"ird\\"},
};
static td_metrics_drop_t drops[2] = {{"bad_envelope", 3}, {"stale_update", 7}};

static td_metrics_stats_t sample_stats(void) {
  return (td_metrics_stats_t){
      .node_id = 0xabcdef0123456789ull, .version = "0.1.0", .run_id = 0x1234ull, .running = 1,
      .round = 42, .rounds_total = 40, .loss = 0.5, .eval_accuracy = NAN,
      .eval_bpb = 3.25, .backend = "cpu",
      .backend_reason = "cpu (auto: no usable GPU: no \"device\")",
      .compute_seconds_total = 12.5, .wait_seconds_total = 2.25, .samples_total = 64000,
      .peers_alive = 2, .peers_suspect = 0, .peers_dead = 1, .peers_left = 4, .links = links,
      .n_links = 2, .drops = drops, .n_drops = 2, .ledger_degraded = 1,
      .ledger_cause = "disk full", .ledger_pending_rows = 17, .ledger_write_failures_total = 3,
      .ledger_dropped_rows_total = 2};
}

static bool has_line(const char *text, const char *line) {
  size_t n = strlen(line);
  for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
    if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
      return true;
  return false;
}

START_TEST(format_families_and_values) {
  td_metrics_stats_t s = sample_stats();
  char *text;
  size_t len;
  ck_assert_int_eq(td_metrics_format(&s, &text, &len), 0);
  ck_assert_uint_eq(len, strlen(text));
  ck_assert(has_line(text, "# TYPE traind_rounds_total counter"));
  ck_assert(has_line(text, "traind_rounds_total 40"));
  ck_assert(has_line(text, "traind_run_round 42"));
  ck_assert(has_line(text, "traind_info{node_id=\"abcdef0123456789\",version=\"0.1.0\"} 1"));
  ck_assert(has_line(text, "traind_run_running{run_id=\"0000000000001234\"} 1"));
  ck_assert(has_line(text, "traind_run_loss 0.5"));
  ck_assert(has_line(text, "traind_run_eval_bpb 3.25"));
  ck_assert(has_line(text, "traind_compute_seconds_total 12.5"));
  ck_assert(has_line(text, "traind_wait_seconds_total 2.25"));
  ck_assert(has_line(text, "traind_peers{state=\"dead\"} 1"));
  ck_assert(has_line(text, "traind_peers{state=\"left\"} 4"));
  ck_assert(has_line(text, "traind_link_sent_bytes_total{peer=\"feed000000000001\"} 1000"));
  ck_assert(has_line(text, "traind_link_received_bytes_total{peer=\"feed000000000002\"} 20"));
  ck_assert(has_line(text, "traind_link_rtt_seconds{peer=\"feed000000000001\"} 0.0125"));
  ck_assert(has_line(text, "traind_link_path_rtt_seconds{peer=\"feed000000000001\"} 0.1015"));
  ck_assert(has_line(text, "traind_dropped_messages_total{kind=\"stale_update\"} 7"));
  ck_assert(has_line(text, "traind_ledger_degraded 1"));
  ck_assert(has_line(text, "traind_ledger_fault_info{cause=\"disk full\"} 1"));
  ck_assert(has_line(text, "traind_ledger_pending_rows 17"));
  ck_assert(has_line(text, "# TYPE traind_run_backend_info gauge"));
  ck_assert(has_line(text, "traind_run_backend_info{backend=\"cpu\",reason=\"cpu (auto: no usable "
                           "GPU: no \\\"device\\\")\"} 1"));
  ck_assert(has_line(text, "traind_ledger_write_failures_total 3"));
  ck_assert(has_line(text, "traind_ledger_dropped_rows_total 2"));
  /* label values escaped */
  ck_assert(has_line(text, "traind_link_codec_info{peer=\"feed000000000002\",codec=\"we\\\"ird\\\\\"} 1"));
  /* NaN: left out, the family's HELP/TYPE stay */
  ck_assert_ptr_null(strstr(text, "\ntraind_run_eval_accuracy "));
  ck_assert(has_line(text, "# TYPE traind_run_eval_accuracy gauge"));
  ck_assert_ptr_null(strstr(text, "traind_link_rtt_seconds{peer=\"feed000000000002\"}"));
  ck_assert_ptr_null(strstr(text, "traind_link_path_rtt_seconds{peer=\"feed000000000002\"}"));
  ck_assert_ptr_null(strstr(text, "NaN"));
  /* every sample line belongs to a family declared before it */
  char *healthy;
  s.ledger_degraded = 0;
  s.ledger_cause = NULL;
  s.backend = NULL; /* no run has opened a backend yet */
  ck_assert_int_eq(td_metrics_format(&s, &healthy, &len), 0);
  ck_assert_ptr_null(strstr(healthy, "traind_run_backend_info{"));
  ck_assert(has_line(healthy, "traind_ledger_degraded 0"));
  ck_assert_ptr_null(strstr(healthy, "traind_ledger_fault_info{"));
  free(healthy);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
    ck_assert(line[0] == '#' || strncmp(line, "traind_", 7) == 0);
  free(text);
}
END_TEST

typedef struct {
  td_metrics_stats_t s;
  int calls;
} scrape_t;

static char *produce(void *arg) {
  scrape_t *sc = arg;
  sc->calls++;
  sc->s.rounds_total += 5; /* counters move between scrapes */
  sc->s.compute_seconds_total += 1.5;
  char *text;
  size_t len;
  return td_metrics_format(&sc->s, &text, &len) == 0 ? text : NULL;
}

/* One HTTP/1.0 request; the whole response (caller frees). */
static char *fetch(unsigned port, const char *method, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[256];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
  ck_assert_int_eq(write(fd, req, (size_t)n), n);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while ((r = read(fd, buf + len, cap - len - 1)) > 0)
    len += (size_t)r;
  buf[len] = '\0';
  close(fd);
  return buf;
}

static const char *body_of(const char *resp) {
  const char *b = strstr(resp, "\r\n\r\n");
  ck_assert_ptr_nonnull(b);
  return b + 4;
}

START_TEST(endpoint_serves_metrics) {
  scrape_t sc = {.s = sample_stats()};
  td_metrics_t *m = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_metrics_open(&m, "127.0.0.1:0", produce, &sc, why, sizeof why), 0);
  unsigned port = td_metrics_port(m);
  ck_assert_uint_gt(port, 0);

  char *r1 = fetch(port, "GET", "/metrics");
  ck_assert_msg(strncmp(r1, "HTTP/1.", 7) == 0 && strstr(r1, " 200 ") != NULL, "%.80s", r1);
  ck_assert_ptr_nonnull(strcasestr(r1, "Content-Type: text/plain; version=0.0.4"));
  ck_assert(has_line(body_of(r1), "traind_rounds_total 45"));
  char *r2 = fetch(port, "GET", "/metrics");
  ck_assert(has_line(body_of(r2), "traind_rounds_total 50"));
  ck_assert(has_line(body_of(r2), "traind_compute_seconds_total 15.5"));
  ck_assert_int_eq(sc.calls, 2);

  /* promtool, when installed, accepts the text */
  if (access("/usr/bin/promtool", X_OK) == 0) {
    char path[] = "/tmp/td-metrics-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *body = body_of(r2);
    ck_assert_int_eq(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < %s", path);
    int st = system(cmd);
    unlink(path);
    ck_assert_msg(st == 0, "promtool check metrics failed (%d)", st);
  } else {
    fprintf(stderr, "test_metrics: promtool not installed (Debian prometheus): format check skipped\n");
  }

  char *r3 = fetch(port, "GET", "/other");
  ck_assert_ptr_nonnull(strstr(r3, " 404 "));
  char *r4 = fetch(port, "POST", "/metrics");
  ck_assert_ptr_nonnull(strstr(r4, " 405 "));
  ck_assert_int_eq(sc.calls, 2);
  free(r1);
  free(r2);
  free(r3);
  free(r4);
  td_metrics_close(&m);
  ck_assert_ptr_null(m);
  td_metrics_close(&m); /* idempotent */
}
END_TEST

START_TEST(bad_addresses_are_refused) {
  td_metrics_t *m = NULL;
  char why[256];
  ck_assert_int_eq(td_metrics_open(&m, "9100", produce, NULL, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "HOST:PORT"));
  ck_assert_int_eq(td_metrics_open(&m, "127.0.0.1:99999", produce, NULL, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_int_eq(td_metrics_open(&m, "no.such.host.invalid:9100", produce, NULL, why, sizeof why),
                   TD_ECONFIG);
  /* the same verdicts without binding (settings validate --metrics with it) */
  ck_assert_int_eq(td_metrics_check_addr("9100", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_metrics_check_addr("127.0.0.1:-1", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_metrics_check_addr("127.0.0.1:9100", why, sizeof why), 0);
  ck_assert_int_eq(td_metrics_check_addr("[::1]:0", why, sizeof why), 0);
  ck_assert_int_eq(td_metrics_check_addr(":9100", why, sizeof why), 0);
  /* a port already taken */
  scrape_t sc = {.s = sample_stats()};
  td_metrics_t *a = NULL;
  ck_assert_int_eq(td_metrics_open(&a, "127.0.0.1:0", produce, &sc, why, sizeof why), 0);
  char taken[64];
  snprintf(taken, sizeof taken, "127.0.0.1:%u", td_metrics_port(a));
  ck_assert_int_eq(td_metrics_open(&m, taken, produce, &sc, why, sizeof why), TD_EIO);
  ck_assert_ptr_null(m);
  ck_assert_ptr_nonnull(strstr(why, taken));
  td_metrics_close(&a);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, format_families_and_values);
  tcase_add_test(tc, endpoint_serves_metrics);
  tcase_add_test(tc, bad_addresses_are_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
