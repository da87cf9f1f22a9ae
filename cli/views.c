/* views.c: how trainctl prints what traind answers to status, peers and
 * rounds: the node's summary, its peers' table and the rounds' table (or the
 * JSON as it came, or the ledger's CSV), and status --watch's one line per
 * change. The command table (cli/trainctl.c) parses the arguments and calls
 * these; they ask the daemon through cli/client.h. */
#include "cli/views.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "cli/export.h"
#include "proto/control.h"

/* Members whose updates the run's aggregation refused, or whose capacity
 * the members heard differently; a suspect one is refused round after round
 * (rejected, clipped, or its samples cut). */
static void print_outliers(json_object *run) {
  json_object *arr = NULL;
  if (!json_object_object_get_ex(run, "outliers", &arr) || arr == NULL)
    return;
  size_t n = json_object_array_length(arr);
  if (n > 0 || strcmp(td__cli_jstr(run, "aggregate"), "mean") != 0)
    printf("aggregate %s\n", td__cli_jstr(run, "aggregate"));
  for (size_t i = 0; i < n; i++) {
    json_object *m = json_object_array_get_idx(arr, i), *suspect = NULL;
    bool is_suspect = json_object_object_get_ex(m, "suspect", &suspect) &&
                      json_object_get_boolean(suspect);
    printf("%s %s: %.0f rejected, %.0f clipped, %.0f samples clamped (%.0f rounds in a row)",
           is_suspect ? "suspect" : "outlier", td__cli_jstr(m, "node_id"),
           td__cli_jnum(m, "rejected"), td__cli_jnum(m, "clipped"), td__cli_jnum(m, "clamped"),
           td__cli_jnum(m, "streak"));
    double mismatched = td__cli_jnum(m, "mismatched"); /* NAN from an older daemon */
    if (mismatched > 0)
      printf("; capacity heard differently in %.0f rounds", mismatched);
    printf("\n");
  }
}

void td__views_verify(json_object *run) {
  json_object *v = NULL, *diverged = NULL;
  if (!json_object_object_get_ex(run, "verify", &v) || v == NULL)
    return;
  double round = td__cli_jnum(v, "round");
  if (round > 0 && strcmp(td__cli_jstr(v, "hash"), "-") != 0)
    printf("verify  round %.0f: %.0f of %.0f members agree on state %s\n", round,
           td__cli_jnum(v, "agree"), td__cli_jnum(v, "members"), td__cli_jstr(v, "hash"));
  else if (round > 0)
    printf("verify  round %.0f: no state held by a majority of the %.0f members (%.0f at most "
           "agree)\n", round, td__cli_jnum(v, "members"), td__cli_jnum(v, "agree"));
  if (json_object_object_get_ex(v, "diverged", &diverged) && diverged != NULL)
    for (size_t i = 0; i < json_object_array_length(diverged); i++)
      printf("diverged %s: its state differs from the agreed one at round %.0f\n",
             json_object_get_string(json_object_array_get_idx(diverged, i)), round);
  if (td__cli_jnum(v, "repairing") > 0)
    printf("repair  this node fetches the members' state of round %.0f\n",
           td__cli_jnum(v, "repairing"));
}

void td__views_peers(json_object *peers) {
  printf("%-16s  %-24s  %-7s  %7s  %7s  %12s  %12s  %-12s  %10s  %10s  %s\n", "NODE",
         "ENDPOINT", "STATE", "HEARD_S", "RTT_MS", "BYTES_SENT", "BYTES_RECV", "CODEC",
         "RATIO_SENT", "RATIO_RECV", "ROUTE");
  size_t n = json_object_array_length(peers);
  for (size_t i = 0; i < n; i++) {
    json_object *p = json_object_array_get_idx(peers, i);
    char rs[32], rr[32], rtt[32];
    td__cli_fmt_num(rs, sizeof rs, td__cli_jnum(p, "ratio_sent"), 1, 9);
    td__cli_fmt_num(rr, sizeof rr, td__cli_jnum(p, "ratio_recv"), 1, 9);
    td__cli_fmt_num(rtt, sizeof rtt, td__cli_jnum(p, "path_rtt_ms"), 1, 7);
    /* direct (we dial it), inbound (it dials us: it accepts no connections),
     * or relayed via the member that carries it */
    char route[48];
    const char *how = td__cli_jstr(p, "route");
    if (strcmp(how, "relayed") == 0)
      snprintf(route, sizeof route, "relayed via %s", td__cli_jstr(p, "via"));
    else
      snprintf(route, sizeof route, "%s", how);
    printf("%-16s  %-24s  %-7s  %7.1f  %7s  %12.0f  %12.0f  %-12s  %9sx  %9sx  %s\n",
           td__cli_jstr(p, "node_id"), td__cli_jstr(p, "endpoint"), td__cli_jstr(p, "state"),
           td__cli_jnum(p, "last_heard_s"), rtt, td__cli_jnum(p, "bytes_sent"),
           td__cli_jnum(p, "bytes_recv"), td__cli_jstr(p, "codec"), rs, rr, route);
  }
  if (n == 0)
    printf("(no peers: trainctl join tcp://HOST:PORT)\n");
}

static void run_line(json_object *run, char *buf, size_t len) {
  char loss[32], acc[32], test[32];
  td__cli_fmt_num(loss, sizeof loss, td__cli_jnum(run, "loss"), 4, 10);
  td__cli_fmt_num(acc, sizeof acc, td__cli_jnum(run, "eval_accuracy"), 4, 10);
  td__cli_fmt_num(test, sizeof test, td__cli_jnum(run, "test_accuracy"), 4, 10);
  char rounds[32];
  td__cli_fmt_num(rounds, sizeof rounds,
                  td__cli_jnum(run, "rounds") > 0 ? td__cli_jnum(run, "rounds") : NAN, 0, 12);
  if (!isnan(td__cli_jnum(run, "eval_bpb"))) { /* a text run: bits per byte, no accuracy */
    td__cli_fmt_num(acc, sizeof acc, td__cli_jnum(run, "eval_bpb"), 4, 10);
    td__cli_fmt_num(test, sizeof test, td__cli_jnum(run, "test_bpb"), 4, 10);
    snprintf(buf, len, "run %s  %-8s  round %.0f/%s  loss %s  eval_bpb %s  test_bpb %s",
             td__cli_jstr(run, "run_id"), td__cli_jstr(run, "state"), td__cli_jnum(run, "round"),
             rounds, loss, acc, test);
    return;
  }
  snprintf(buf, len, "run %s  %-8s  round %.0f/%s  loss %s  eval_acc %s  test_acc %s",
           td__cli_jstr(run, "run_id"), td__cli_jstr(run, "state"), td__cli_jnum(run, "round"),
           rounds, loss, acc, test);
}

/* "bytes   round 12: 1000.0 kB sent, 40.0 kB of updates received" (the newest round's row;
 * nothing before one). */
static void round_bytes_line(json_object *run) {
  if (isnan(td__cli_jnum(run, "last_row_round")))
    return;
  printf("bytes   round %.0f: %.1f kB sent, %.1f kB of updates received",
         td__cli_jnum(run, "last_row_round"), td__cli_jnum(run, "last_row_bytes_sent") / 1e3,
         td__cli_jnum(run, "last_row_bytes_recv") / 1e3);
  const char *topo = td__cli_jstr(run, "topology");
  double consensus = td__cli_jnum(run, "last_row_consensus");
  if (topo[0] != '\0' && strcmp(topo, "mesh") != 0 && strcmp(topo, "-") != 0)
    printf(" (%s: %.0f in its average%s", topo, td__cli_jnum(run, "last_row_mixed"),
           isnan(consensus) ? ")" : "");
  if (!isnan(consensus))
    printf(", consensus distance %.3g)", consensus);
  printf("\n");
}

/* "ledger  ok", or degraded with the cause and what is kept in memory. */
static void ledger_line(json_object *o) {
  json_object *l = NULL;
  if (!json_object_object_get_ex(o, "ledger", &l) || l == NULL)
    return;
  double dropped = td__cli_jnum(l, "dropped_rows"), refused = td__cli_jnum(l, "refused_rows");
  char lost[128] = "";
  if (dropped > 0 || refused > 0)
    snprintf(lost, sizeof lost, "; %.0f rows dropped, %.0f refused since start", dropped, refused);
  if (strcmp(td__cli_jstr(l, "state"), "degraded") != 0) {
    printf("ledger  ok%s\n", lost);
    return;
  }
  printf("ledger  degraded: %s for %.0f s (%s), %.0f failed writes; %.0f rows kept in memory"
         " (%.1f of %.0f MiB)%s\n",
         td__cli_jstr(l, "cause"), td__cli_jnum(l, "degraded_s"), td__cli_jstr(l, "detail"),
         td__cli_jnum(l, "failed_writes"), td__cli_jnum(l, "pending_rows"),
         td__cli_jnum(l, "pending_bytes") / 1048576.0, td__cli_jnum(l, "buffer_bytes") / 1048576.0,
         lost);
}

/* "descriptors 23 of 65536 open, cap 61440; peer port 4 connections (cap 60992), 12 shed" */
static void descriptors_line(json_object *o) {
  json_object *d = NULL;
  if (!json_object_object_get_ex(o, "descriptors", &d) || d == NULL)
    return; /* an older traind */
  printf("descriptors %s of %s open, cap %s; peer port %s connections (cap %s, %s per address), "
         "%s shed\n",
         td__cli_jstr(d, "open"), td__cli_jstr(d, "limit"), td__cli_jstr(d, "cap"),
         td__cli_jstr(d, "inbound"), td__cli_jstr(d, "inbound_cap"),
         td__cli_jstr(d, "per_address_cap"), td__cli_jstr(d, "shed"));
}

int td__views_status(bool json, bool watch, double every_s) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  char last[512] = "";
  for (;;) {
    json_object *o = NULL;
    int rc = td__cli_call(&req, &o);
    if (rc != 0)
      return rc;
    json_object *run = NULL, *peers = NULL, *drops = NULL;
    json_object_object_get_ex(o, "run", &run);
    json_object_object_get_ex(o, "peers", &peers);
    json_object_object_get_ex(o, "drops", &drops);
    if (json) {
      printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    } else if (watch) {
      char line[512];
      run_line(run, line, sizeof line);
      if (strcmp(line, last) != 0) {
        time_t t = time(NULL);
        char ts[16];
        strftime(ts, sizeof ts, "%H:%M:%S", localtime(&t));
        printf("%s  %s\n", ts, line);
        snprintf(last, sizeof last, "%s", line);
      }
    } else {
      size_t np = peers ? json_object_array_length(peers) : 0, alive = 0;
      for (size_t i = 0; i < np; i++)
        alive += strcmp(td__cli_jstr(json_object_array_get_idx(peers, i), "state"), "alive") == 0;
      double dropped = 0;
      json_object_object_foreach(drops, k, v) {
        (void)k;
        dropped += json_object_get_double(v);
      }
      char line[512];
      run_line(run, line, sizeof line);
      printf("node    %s  %s  security %s\n", td__cli_jstr(o, "node_id"),
             td__cli_jstr(o, "endpoint"), td__cli_jstr(o, "security"));
      const char *listen = td__cli_jstr(o, "listen");
      if (strcmp(listen, "-") != 0 && strcmp(listen, td__cli_jstr(o, "endpoint")) != 0)
        printf("listen  %s (advertising %s)\n", listen, td__cli_jstr(o, "endpoint"));
      printf("peers   %zu (%zu alive)\n", np, alive);
      printf("%s\n", line);
      round_bytes_line(run);
      if (strcmp(td__cli_jstr(run, "backend_reason"), "-") != 0)
        printf("backend %s\n", td__cli_jstr(run, "backend_reason"));
      if (strcmp(td__cli_jstr(run, "error"), "-") != 0)
        printf("error   %s\n", td__cli_jstr(run, "error"));
      if (strcmp(td__cli_jstr(run, "refused"), "-") != 0)
        printf("refused %s\n", td__cli_jstr(run, "refused"));
      if (strcmp(td__cli_jstr(run, "untrained"), "-") != 0)
        printf("untrained partitions no round trained: %s\n", td__cli_jstr(run, "untrained"));
      print_outliers(run);
      td__views_verify(run);
      printf("drops   %.0f bad or unexpected peer messages\n", dropped);
      descriptors_line(o);
      ledger_line(o);
      if (np > 0) {
        printf("\n");
        td__views_peers(peers);
      }
    }
    if (fflush(stdout) != 0 || ferror(stdout)) { /* `| head` closed it: end quietly */
      json_object_put(o);
      return 0;
    }
    const char *state = td__cli_jstr(run, "state");
    bool running = strcmp(state, "running") == 0;
    rc = 0;
    if (watch && strcmp(state, "failed") == 0) /* a script waiting on the run learns it failed */
      rc = strcmp(td__cli_jstr(run, "error"), "-") != 0
               ? td__cli_die("run %s failed: %s", td__cli_jstr(run, "run_id"),
                             td__cli_jstr(run, "error"))
               : td__cli_die("run %s failed (traind gave no reason: see its log)",
                             td__cli_jstr(run, "run_id"));
    json_object_put(o);
    if (!watch || !running)
      return rc;
    struct timespec ts = {.tv_sec = (time_t)every_s,
                          .tv_nsec = (long)((every_s - (double)(time_t)every_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

/* rounds --csv: the ledger's own columns, as `trainctl export RUN --table
 * rounds` writes them, read from the ledger in the daemon's data dir. */
static int rounds_csv(unsigned last) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  json_object *o = NULL, *run = NULL;
  int rc = td__cli_call(&req, &o);
  if (rc != 0)
    return rc;
  json_object_object_get_ex(o, "run", &run);
  const char *id = td__cli_jstr(run, "run_id");
  rc = td_export_rounds_csv(td__cli_jstr(o, "data_dir"), strcmp(id, "-") != 0 ? id : NULL, last);
  json_object_put(o);
  return rc;
}

int td__views_rounds(unsigned last, bool csv, bool json) {
  if (csv)
    return rounds_csv(last);
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS;
  req.last = last;
  req.page_size = TD_CONTROL_ROUNDS_PAGE;
  json_object *arr = json_object_new_array();
  for (uint64_t total = 1; req.page_from < total;) { /* page by page: no answer too large */
    json_object *page = NULL;
    int rc = td__cli_call_paged(&req, &page, &total);
    if (rc != 0) {
      json_object_put(arr);
      return rc;
    }
    size_t got = json_object_array_length(page);
    for (size_t i = 0; i < got; i++)
      json_object_array_add(arr, json_object_get(json_object_array_get_idx(page, i)));
    json_object_put(page);
    if (got == 0)
      break;
    req.page_from += got;
  }
  size_t n = json_object_array_length(arr);
  if (json) {
    printf("%s\n", json_object_to_json_string_ext(arr, JSON_C_TO_STRING_PLAIN));
  } else {
    printf("%6s  %8s  %8s  %8s  %12s  %12s  %9s  %8s\n", "ROUND", "SAMPLES", "LOSS", "EVAL_ACC",
           "BYTES_SENT", "BYTES_RECV", "COMPUTE_S", "WAIT_S");
    for (size_t i = 0; i < n; i++) {
      json_object *r = json_object_array_get_idx(arr, i);
      char loss[32], acc[32];
      td__cli_fmt_num(loss, sizeof loss, td__cli_jnum(r, "loss"), 4, 8);
      td__cli_fmt_num(acc, sizeof acc, td__cli_jnum(r, "eval_acc"), 4, 8);
      printf("%6.0f  %8.0f  %8s  %8s  %12.0f  %12.0f  %9.3f  %8.3f\n", td__cli_jnum(r, "round"),
             td__cli_jnum(r, "samples"), loss, acc, td__cli_jnum(r, "bytes_sent"),
             td__cli_jnum(r, "bytes_recv"), td__cli_jnum(r, "compute_s"),
             td__cli_jnum(r, "wait_s"));
    }
    if (n == 0)
      printf("(no rounds recorded yet)\n");
  }
  json_object_put(arr);
  return 0;
}
