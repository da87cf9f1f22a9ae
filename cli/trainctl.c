/* trainctl.c: the command-line client of traind.
 *
 * Each command is one request over the daemon's local control socket (a
 * 4-byte big-endian length, then a protobuf ControlRequest) and one framed
 * ControlResponse back, whose payload is JSON. trainctl renders it as a table,
 * as CSV or as JSON, and exits 0 on success, 1 with a one-line reason when the
 * daemon refuses or is not running, 2 on a usage error. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/history.h"
#include "proto/control.h"
#include "proto/wire.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

static const char *socket_path;
static int timeout_ms = TD_CONTROL_TIMEOUT_MS;

static void usage(FILE *out) {
  fprintf(out,
          "usage: trainctl [--socket PATH] [--timeout S] COMMAND [ARGS]\n"
          "\n"
          "commands:\n"
          "  join ENDPOINT [KEY]            join the cluster of the node at tcp://HOST:PORT\n"
          "                                 whose public key is KEY (needed unless the nodes\n"
          "                                 run --insecure; KEY is admitted here); during a\n"
          "                                 sync or overlap run, also the run: from a later\n"
          "                                 round, on the members' model\n"
          "  key [--json]                   this node's public key (json: and the keys it\n"
          "                                 admits, and security curve|insecure)\n"
          "  allow [--admin] KEY            admit a node's key (admin: it may start and stop\n"
          "                                 runs here)\n"
          "  revoke KEY                     remove a key: its connections and membership end\n"
          "  start [RUN.ini] [--set k=v]... start a run on every live member\n"
          "  status [--json] [--watch [S]]  node, peers and run progress (watch: every S s)\n"
          "  stop                           stop the current run everywhere\n"
          "  peers [--json]                 members and per-link traffic\n"
          "  rounds [--last N] [--csv|--json]  rounds of the current run, from the ledger\n"
          "  leave                          tell the peers and shut this daemon down\n"
          "%s"
          "\n"
          "--socket defaults to $TRAIND_SOCKET, else DATA_DIR/control.sock with DATA_DIR =\n"
          "$TRAIND_DATA_DIR or ~/.local/share/traind (the daemon's defaults).\n"
          "--timeout: give up when traind does not answer within S seconds (default %d).\n",
          td_history_usage(), TD_CONTROL_TIMEOUT_MS / 1000);
}

static int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("trainctl: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

/* One request, one response (proto/control.h). On success *json holds the
 * payload (caller frees) and *total the row count of a paged answer. */
static int call_paged(Traind__ControlRequest *req, json_object **json, uint64_t *total) {
  Traind__ControlResponse *resp = NULL;
  char why[512];
  if (td_control_call(socket_path, req, timeout_ms, &resp, why, sizeof why) != 0)
    return die("%s", why);
  int rc = 0;
  if (resp->status != 0) {
    rc = die("%s", resp->error && resp->error[0] ? resp->error : "request refused");
    td_wire_free_response(&resp);
    return rc;
  }
  *json = json_tokener_parse(resp->json ? resp->json : "null");
  if (total != NULL)
    *total = resp->total;
  td_wire_free_response(&resp);
  if (*json == NULL)
    return die("traind answered with malformed JSON");
  return 0;
}

static int call(Traind__ControlRequest *req, json_object **json) {
  return call_paged(req, json, NULL);
}

static const char *jstr(json_object *o, const char *key) {
  json_object *v;
  if (!json_object_object_get_ex(o, key, &v) || v == NULL)
    return "-";
  return json_object_get_string(v);
}

static double jnum(json_object *o, const char *key) {
  json_object *v;
  if (!json_object_object_get_ex(o, key, &v) || v == NULL)
    return NAN;
  return json_object_get_double(v);
}

static void fmt_num(char *buf, size_t len, double v, int decimals) {
  if (isnan(v))
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.*f", decimals, v);
}

/* Members whose updates the run's aggregation refused; a suspect one is
 * refused round after round (rejected, clipped, or its samples cut). */
static void print_outliers(json_object *run) {
  json_object *arr = NULL;
  if (!json_object_object_get_ex(run, "outliers", &arr) || arr == NULL)
    return;
  size_t n = json_object_array_length(arr);
  if (n > 0 || strcmp(jstr(run, "aggregate"), "mean") != 0)
    printf("aggregate %s\n", jstr(run, "aggregate"));
  for (size_t i = 0; i < n; i++) {
    json_object *m = json_object_array_get_idx(arr, i), *suspect = NULL;
    bool is_suspect = json_object_object_get_ex(m, "suspect", &suspect) &&
                      json_object_get_boolean(suspect);
    printf("%s %s: %.0f rejected, %.0f clipped, %.0f samples clamped (%.0f rounds in a row)\n",
           is_suspect ? "suspect" : "outlier", jstr(m, "node_id"), jnum(m, "rejected"),
           jnum(m, "clipped"), jnum(m, "clamped"), jnum(m, "streak"));
  }
}

static void print_peers(json_object *peers) {
  printf("%-16s  %-24s  %-7s  %7s  %7s  %12s  %12s  %-12s  %10s  %10s\n", "NODE", "ENDPOINT",
         "STATE", "HEARD_S", "RTT_MS", "BYTES_SENT", "BYTES_RECV", "CODEC", "RATIO_SENT",
         "RATIO_RECV");
  size_t n = json_object_array_length(peers);
  for (size_t i = 0; i < n; i++) {
    json_object *p = json_object_array_get_idx(peers, i);
    char rs[32], rr[32], rtt[32];
    fmt_num(rs, sizeof rs, jnum(p, "ratio_sent"), 1);
    fmt_num(rr, sizeof rr, jnum(p, "ratio_recv"), 1);
    fmt_num(rtt, sizeof rtt, jnum(p, "path_rtt_ms"), 1);
    printf("%-16s  %-24s  %-7s  %7.1f  %7s  %12.0f  %12.0f  %-12s  %9sx  %9sx\n",
           jstr(p, "node_id"), jstr(p, "endpoint"), jstr(p, "state"), jnum(p, "last_heard_s"), rtt,
           jnum(p, "bytes_sent"), jnum(p, "bytes_recv"), jstr(p, "codec"), rs, rr);
  }
  if (n == 0)
    printf("(no peers: trainctl join tcp://HOST:PORT)\n");
}

static void run_line(json_object *run, char *buf, size_t len) {
  char loss[32], acc[32], test[32];
  fmt_num(loss, sizeof loss, jnum(run, "loss"), 4);
  fmt_num(acc, sizeof acc, jnum(run, "eval_accuracy"), 4);
  fmt_num(test, sizeof test, jnum(run, "test_accuracy"), 4);
  char rounds[32];
  fmt_num(rounds, sizeof rounds, jnum(run, "rounds") > 0 ? jnum(run, "rounds") : NAN, 0);
  if (!isnan(jnum(run, "eval_bpb"))) { /* a text run: bits per byte, no accuracy */
    fmt_num(acc, sizeof acc, jnum(run, "eval_bpb"), 4);
    fmt_num(test, sizeof test, jnum(run, "test_bpb"), 4);
    snprintf(buf, len, "run %s  %-8s  round %.0f/%s  loss %s  eval_bpb %s  test_bpb %s",
             jstr(run, "run_id"), jstr(run, "state"), jnum(run, "round"), rounds, loss, acc, test);
    return;
  }
  snprintf(buf, len, "run %s  %-8s  round %.0f/%s  loss %s  eval_acc %s  test_acc %s",
           jstr(run, "run_id"), jstr(run, "state"), jnum(run, "round"), rounds, loss, acc, test);
}

/* "ledger  ok", or degraded with the cause and what is kept in memory. */
static void ledger_line(json_object *o) {
  json_object *l = NULL;
  if (!json_object_object_get_ex(o, "ledger", &l) || l == NULL)
    return;
  double dropped = jnum(l, "dropped_rows"), refused = jnum(l, "refused_rows");
  char lost[128] = "";
  if (dropped > 0 || refused > 0)
    snprintf(lost, sizeof lost, "; %.0f rows dropped, %.0f refused since start", dropped, refused);
  if (strcmp(jstr(l, "state"), "degraded") != 0) {
    printf("ledger  ok%s\n", lost);
    return;
  }
  printf("ledger  degraded: %s for %.0f s (%s), %.0f failed writes; %.0f rows kept in memory"
         " (%.1f of %.0f MiB)%s\n",
         jstr(l, "cause"), jnum(l, "degraded_s"), jstr(l, "detail"), jnum(l, "failed_writes"),
         jnum(l, "pending_rows"), jnum(l, "pending_bytes") / 1048576.0,
         jnum(l, "buffer_bytes") / 1048576.0, lost);
}

static int cmd_status(bool json, bool watch, double every_s) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  char last[512] = "";
  for (;;) {
    json_object *o = NULL;
    int rc = call(&req, &o);
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
        alive += strcmp(jstr(json_object_array_get_idx(peers, i), "state"), "alive") == 0;
      double dropped = 0;
      json_object_object_foreach(drops, k, v) {
        (void)k;
        dropped += json_object_get_double(v);
      }
      char line[512];
      run_line(run, line, sizeof line);
      printf("node    %s  %s  security %s\n", jstr(o, "node_id"), jstr(o, "endpoint"),
             jstr(o, "security"));
      printf("peers   %zu (%zu alive)\n", np, alive);
      printf("%s\n", line);
      if (strcmp(jstr(run, "backend_reason"), "-") != 0)
        printf("backend %s\n", jstr(run, "backend_reason"));
      if (strcmp(jstr(run, "error"), "-") != 0)
        printf("error   %s\n", jstr(run, "error"));
      if (strcmp(jstr(run, "refused"), "-") != 0)
        printf("refused %s\n", jstr(run, "refused"));
      print_outliers(run);
      printf("drops   %.0f bad or unexpected peer messages\n", dropped);
      ledger_line(o);
      if (np > 0) {
        printf("\n");
        print_peers(peers);
      }
    }
    fflush(stdout);
    const char *state = jstr(run, "state");
    bool running = strcmp(state, "running") == 0;
    json_object_put(o);
    if (!watch || !running)
      return 0;
    struct timespec ts = {.tv_sec = (time_t)every_s,
                          .tv_nsec = (long)((every_s - (double)(time_t)every_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

static int cmd_rounds(unsigned last, bool csv, bool json) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS;
  req.last = last;
  req.page_size = TD_CONTROL_ROUNDS_PAGE;
  json_object *arr = json_object_new_array();
  for (uint64_t total = 1; req.page_from < total;) { /* page by page: no answer too large */
    json_object *page = NULL;
    int rc = call_paged(&req, &page, &total);
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
  } else if (csv) {
    static const char *cols[] = {"run_id",  "round",    "started",    "ended",
                                 "local_steps", "batch", "samples",   "loss",
                                 "eval_acc", "bytes_sent", "bytes_recv", "compute_s",
                                 "wait_s"};
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
      printf("%s%s", c ? "," : "", cols[c]);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
      json_object *r = json_object_array_get_idx(arr, i);
      for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        json_object *v = NULL;
        json_object_object_get_ex(r, cols[c], &v);
        printf("%s%s", c ? "," : "", v ? json_object_get_string(v) : "");
      }
      printf("\n");
    }
  } else {
    printf("%6s  %8s  %8s  %8s  %12s  %12s  %9s  %8s\n", "ROUND", "SAMPLES", "LOSS", "EVAL_ACC",
           "BYTES_SENT", "BYTES_RECV", "COMPUTE_S", "WAIT_S");
    for (size_t i = 0; i < n; i++) {
      json_object *r = json_object_array_get_idx(arr, i);
      char loss[32], acc[32];
      fmt_num(loss, sizeof loss, jnum(r, "loss"), 4);
      fmt_num(acc, sizeof acc, jnum(r, "eval_acc"), 4);
      printf("%6.0f  %8.0f  %8s  %8s  %12.0f  %12.0f  %9.3f  %8.3f\n", jnum(r, "round"),
             jnum(r, "samples"), loss, acc, jnum(r, "bytes_sent"), jnum(r, "bytes_recv"),
             jnum(r, "compute_s"), jnum(r, "wait_s"));
    }
    if (n == 0)
      printf("(no rounds recorded yet)\n");
  }
  json_object_put(arr);
  return 0;
}

static char *read_file(const char *path, int *rc) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    *rc = die("cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  size_t r;
  while (buf != NULL && (r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += r;
    if (len + 1 >= cap) {
      if (cap >= TD_WIRE_MAX_SPEC * 4) {
        free(buf);
        buf = NULL;
        *rc = die("%s is too large for a run file", path);
        break;
      }
      char *nb = realloc(buf, cap *= 2);
      if (nb == NULL) {
        free(buf);
        buf = NULL;
      }
      buf = nb;
    }
  }
  fclose(f);
  if (buf != NULL)
    buf[len] = '\0';
  return buf;
}

int main(int argc, char **argv) {
  static char default_socket[700];
  const char *env = getenv("TRAIND_SOCKET");
  if (env != NULL && env[0] != '\0') {
    socket_path = env;
  } else {
    const char *dd = getenv("TRAIND_DATA_DIR"), *home = getenv("HOME");
    if (dd != NULL && dd[0] != '\0')
      snprintf(default_socket, sizeof default_socket, "%s/control.sock", dd);
    else
      snprintf(default_socket, sizeof default_socket, "%s/.local/share/traind/control.sock",
               home ? home : ".");
    socket_path = default_socket;
  }
  signal(SIGPIPE, SIG_IGN);
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (strncmp(argv[i], "--socket=", 9) == 0) {
      socket_path = argv[i] + 9;
    } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      char *end;
      double s = strtod(argv[++i], &end);
      if (*end != '\0' || !(s > 0) || s > 86400) {
        fprintf(stderr, "trainctl: error: --timeout wants seconds in (0, 86400], got %s\n",
                argv[i]);
        return 2;
      }
      timeout_ms = (int)ceil(s * 1000);
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
#ifdef PACKAGE_VERSION
      printf("trainctl %s\n", PACKAGE_VERSION);
#endif
      return 0;
    } else {
      fprintf(stderr, "trainctl: error: unknown option %s (see trainctl --help)\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[i++];
  int nargs = argc - i;
  char **args = argv + i;
  if (td_history_handles(cmd))
    return td_history_main(cmd, nargs, args);
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;

  if (strcmp(cmd, "key") == 0) {
    bool json = nargs == 1 && strcmp(args[0], "--json") == 0;
    if (nargs > (json ? 1 : 0)) {
      fprintf(stderr, "trainctl: error: usage: trainctl key [--json]\n");
      return 2;
    }
    req.command = TRAIND__CONTROL_REQUEST__COMMAND__KEY;
    if ((rc = call(&req, &o)) != 0)
      return rc;
    if (json) {
      printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    } else {
      printf("%s\n", jstr(o, "key")); /* alone, for $(trainctl key) */
    }
    json_object_put(o);
    return 0;
  }
  if (strcmp(cmd, "allow") == 0 || strcmp(cmd, "revoke") == 0) {
    bool allow = cmd[0] == 'a', admin = false;
    const char *key = NULL;
    for (int a = 0; a < nargs; a++) {
      if (allow && strcmp(args[a], "--admin") == 0)
        admin = true;
      else if (key == NULL)
        key = args[a];
      else
        key = NULL, a = nargs;
    }
    if (key == NULL || nargs > (admin ? 2 : 1)) {
      fprintf(stderr, "trainctl: error: usage: trainctl %s\n",
              allow ? "allow [--admin] KEY" : "revoke KEY");
      return 2;
    }
    req.command = allow ? TRAIND__CONTROL_REQUEST__COMMAND__ALLOW
                        : TRAIND__CONTROL_REQUEST__COMMAND__REVOKE;
    req.key = (char *)key;
    req.admin = admin;
    if ((rc = call(&req, &o)) != 0)
      return rc;
    printf("%s key of node %s%s\n", allow ? "admitted" : "revoked", jstr(o, "node_id"),
           admin ? " (admin)" : "");
    json_object_put(o);
    return 0;
  }
  if (strcmp(cmd, "join") == 0) {
    if (nargs != 1 && nargs != 2) {
      fprintf(stderr, "trainctl: error: usage: trainctl join tcp://HOST:PORT [KEY]\n");
      return 2;
    }
    req.command = TRAIND__CONTROL_REQUEST__COMMAND__JOIN;
    req.endpoint = args[0];
    req.key = nargs == 2 ? args[1] : "";
    if ((rc = call(&req, &o)) != 0)
      return rc;
    json_object *peers = NULL;
    json_object_object_get_ex(o, "peers", &peers);
    printf("joined %s (node %s); %zu peers known\n", jstr(o, "joined"), jstr(o, "seed_node"),
           peers ? json_object_array_length(peers) : 0);
    json_object_put(o);
    return 0;
  }
  if (strcmp(cmd, "start") == 0) {
    char **settings = calloc((size_t)nargs + 1, sizeof *settings);
    char *ini = NULL;
    size_t ns = 0;
    rc = 0;
    for (int a = 0; a < nargs && rc == 0; a++) {
      if (strcmp(args[a], "--set") == 0 && a + 1 < nargs) {
        settings[ns++] = args[++a];
      } else if (strncmp(args[a], "--set=", 6) == 0) {
        settings[ns++] = args[a] + 6;
      } else if (args[a][0] != '-' && ini == NULL) {
        ini = read_file(args[a], &rc);
        if (ini == NULL && rc == 0)
          rc = 1;
      } else {
        fprintf(stderr, "trainctl: error: usage: trainctl start [RUN.ini] [--set key=value]...\n");
        rc = 2;
      }
    }
    if (rc == 0) {
      req.command = TRAIND__CONTROL_REQUEST__COMMAND__START;
      req.settings = settings;
      req.n_settings = ns;
      req.ini_text = ini ? ini : "";
      rc = call(&req, &o);
      if (rc == 0) { /* one line: who runs it, who refused and why, who is not ready yet */
        int nodes = (int)jnum(o, "nodes"), ready = (int)jnum(o, "ready");
        int waiting = (int)jnum(o, "waiting");
        const char *refused = jstr(o, "refused");
        if (ready == nodes)
          printf("started run %s on %d nodes", jstr(o, "run_id"), nodes);
        else
          printf("started run %s on %d of %d nodes", jstr(o, "run_id"), ready, nodes);
        if (refused[0] != '\0' && strcmp(refused, "-") != 0)
          printf("; it goes on without those that refused: %s", refused);
        if (waiting > 0)
          printf("; %d not ready after %.0f s (trainctl status follows them)", waiting,
                 jnum(o, "wait_s"));
        printf("\n");
        json_object_put(o);
      }
    }
    free(ini);
    free(settings);
    return rc;
  }
  if (strcmp(cmd, "status") == 0) {
    bool json = false, watch = false;
    double every = 1.0;
    for (int a = 0; a < nargs; a++) {
      if (strcmp(args[a], "--json") == 0) {
        json = true;
      } else if (strcmp(args[a], "--watch") == 0) {
        watch = true;
        if (a + 1 < nargs && args[a + 1][0] != '-') {
          char *end;
          every = strtod(args[++a], &end);
          if (*end != '\0' || !(every >= 0.05 && every <= 3600)) {
            fprintf(stderr, "trainctl: error: --watch SECONDS must be in [0.05, 3600]\n");
            return 2;
          }
        }
      } else {
        fprintf(stderr, "trainctl: error: usage: trainctl status [--json] [--watch [SECONDS]]\n");
        return 2;
      }
    }
    return cmd_status(json, watch, every);
  }
  if (strcmp(cmd, "rounds") == 0) {
    unsigned last = 0;
    bool csv = false, json = false;
    for (int a = 0; a < nargs; a++) {
      if (strcmp(args[a], "--csv") == 0) {
        csv = true;
      } else if (strcmp(args[a], "--json") == 0) {
        json = true;
      } else if (strcmp(args[a], "--last") == 0 && a + 1 < nargs) {
        char *end;
        unsigned long v = strtoul(args[++a], &end, 10);
        if (*end != '\0' || args[a][0] == '-' || v == 0 || v > 100000000) {
          fprintf(stderr, "trainctl: error: --last N needs a positive integer\n");
          return 2;
        }
        last = (unsigned)v;
      } else {
        fprintf(stderr, "trainctl: error: usage: trainctl rounds [--last N] [--csv|--json]\n");
        return 2;
      }
    }
    return cmd_rounds(last, csv, json);
  }
  if (strcmp(cmd, "peers") == 0 || strcmp(cmd, "stop") == 0 || strcmp(cmd, "leave") == 0) {
    bool json = nargs == 1 && strcmp(args[0], "--json") == 0;
    if (nargs > (json ? 1 : 0)) {
      fprintf(stderr, "trainctl: error: %s takes no arguments\n", cmd);
      return 2;
    }
    req.command = cmd[0] == 'p'   ? TRAIND__CONTROL_REQUEST__COMMAND__PEERS
                  : cmd[0] == 's' ? TRAIND__CONTROL_REQUEST__COMMAND__STOP
                                  : TRAIND__CONTROL_REQUEST__COMMAND__LEAVE;
    if ((rc = call(&req, &o)) != 0)
      return rc;
    if (json) {
      printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    } else if (cmd[0] == 'p') {
      json_object *peers = NULL;
      json_object_object_get_ex(o, "peers", &peers);
      print_peers(peers);
    } else if (cmd[0] == 's') {
      printf("stopping run %s\n", jstr(o, "stopping"));
    } else {
      printf("node %s left the cluster and is shutting down\n", jstr(o, "left"));
    }
    json_object_put(o);
    return 0;
  }
  fprintf(stderr, "trainctl: error: unknown command '%s' (see trainctl --help)\n", cmd);
  return 2;
}
