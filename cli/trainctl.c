/* trainctl.c: the command-line client of traind.
 *
 * Every command is one row of COMMANDS below: its name, the function that
 * runs it, its argument synopsis and one line of help, and where it reads
 * from (the daemon or the ledgers). The table drives dispatch, `trainctl
 * help`, `trainctl --commands` (which the bash completion calls) and the
 * test that the man page documents every command.
 *
 * A daemon command is one request over the daemon's local control socket (a
 * 4-byte big-endian length, then a protobuf ControlRequest) and one framed
 * ControlResponse back, whose payload is JSON (cli/client.h asks; status,
 * peers and rounds print through cli/views.h). trainctl renders it as a table,
 * as CSV or as JSON, and exits 0 on success, 1 with a one-line reason when the
 * daemon refuses or is not running, 2 on a usage error. The ledger commands
 * (cli/history.h, cli/export.h, cli/plot.h, cli/model.h, cli/predict.h) read ledgers
 * directly; with --socket, the ledger of the daemon at that socket. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/export.h"
#include "cli/history.h"
#include "cli/model.h"
#include "cli/ledgers.h"
#include "cli/plot.h"
#include "cli/predict.h"
#include "cli/views.h"
#include "common/suggest.h"
#include "common/textfile.h"
#include "proto/control.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

static bool socket_given; /* --socket on the command line (not the default) */

/* The largest run file: traind reads run files with the same bound (TD_RUNSPEC_FILE_MAX). */
#define RUN_FILE_MAX_BYTES ((size_t)1 << 20)

/* The run file, whole: a regular file of text (a directory, a device or a
 * NUL byte is an error that says so, never a default run). */
static char *read_file(const char *path, int *rc) {
  char why[600] = "", *text = NULL;
  if (td_textfile_read(path, RUN_FILE_MAX_BYTES, "a run file", &text, why, sizeof why) != 0)
    *rc = td__cli_die("%s", why);
  return text;
}

/* ---- the commands ----------------------------------------------------------------------- */

static int usage_error(const char *name);

/* A key as pasted: one pair of surrounding quotes ('KEY', as `trainctl key`
 * prints it, or "KEY") is dropped; Z85 has no quote characters. */
static char *unquote_key(char *key) {
  size_t n = strlen(key);
  if (n >= 2 && (key[0] == '\'' || key[0] == '"') && key[n - 1] == key[0]) {
    key[n - 1] = '\0';
    return key + 1;
  }
  return key;
}

static int cmd_key(int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  bool json = nargs == 1 && strcmp(args[0], "--json") == 0;
  if (nargs > (json ? 1 : 0))
    return usage_error("key");
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__KEY;
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  if (json) {
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  } else {
    /* single-quoted: Z85 keys hold < > & ( # $ ! that a shell would act on;
     * allow and join take the key with its quotes too */
    printf("'%s'\n", td__cli_jstr(o, "key"));
    if (isatty(STDOUT_FILENO))
      printf("(paste it with its single quotes: a key holds characters such as < > & ( # $ ! "
             "that the shell would act on)\n");
  }
  json_object_put(o);
  return 0;
}

/* Admit one key; 0, or 1 with the daemon's reason in why. */
static int allow_one(const char *key, bool admin, char *node_id, size_t id_len, char *why,
                     size_t why_len) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__ALLOW;
  req.key = (char *)key;
  req.admin = admin;
  json_object *o = NULL;
  if (td__cli_request(&req, &o, NULL, why, why_len) != 0)
    return 1;
  snprintf(node_id, id_len, "%s", td__cli_jstr(o, "node_id"));
  json_object_put(o);
  return 0;
}

/* allow --file: one key per line (quoted or not), blank lines and # comments
 * skipped (a comment is a line whose first word starts with '#' and is no
 * 40-character key: Z85 keys may start with '#'), text after a key only as a
 * # comment. Every line is tried; each refused one is reported with its
 * number. 0 when every key was admitted, else 1. */
static int allow_file(const char *path, bool admin) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return td__cli_die("cannot open %s: %s", path, strerror(errno));
  char line[512], why[1024], node[32];
  unsigned lineno = 0, admitted = 0, refused = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    if (strchr(line, '\n') == NULL && !feof(f)) { /* longer than any key: skip the rest */
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n')
        ;
      td__cli_die("%s:%u: line too long (one key of 40 characters per line)", path, lineno);
      refused++;
      continue;
    }
    char *word = line + strspn(line, " \t\r\n");
    size_t len = strcspn(word, " \t\r\n");
    char *rest = word + len;
    rest += strspn(rest, " \t\r\n");
    word[len] = '\0';
    if (len == 0)
      continue;
    char *key = unquote_key(word);
    if (word[0] == '#' && strlen(key) != 40)
      continue;
    if (*rest != '\0' && *rest != '#') {
      td__cli_die("%s:%u: expected one key per line (then at most a # comment)", path, lineno);
      refused++;
    } else if (allow_one(key, admin, node, sizeof node, why, sizeof why) != 0) {
      td__cli_die("%s:%u: %s", path, lineno, why);
      refused++;
    } else {
      printf("admitted key of node %s%s (%s:%u)\n", node, admin ? " (admin)" : "", path, lineno);
      admitted++;
    }
  }
  bool read_error = ferror(f) != 0;
  fclose(f);
  if (read_error)
    return td__cli_die("cannot read %s: %s", path, strerror(errno));
  if (admitted + refused == 0)
    return td__cli_die("%s holds no key (one per line; # starts a comment)", path);
  if (refused > 0)
    return td__cli_die("%u of %u keys in %s refused (see the lines above); the others are admitted",
               refused, admitted + refused, path);
  return 0;
}

static int allow_or_revoke(bool allow, int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  bool admin = false;
  const char *file = NULL;
  char *key = NULL;
  int given = 0;
  for (int a = 0; a < nargs; a++) {
    if (allow && strcmp(args[a], "--admin") == 0) {
      admin = true;
    } else if (allow && strcmp(args[a], "--file") == 0 && a + 1 < nargs && file == NULL) {
      file = args[++a];
    } else if (allow && strncmp(args[a], "--file=", 7) == 0 && file == NULL) {
      file = args[a] + 7;
    } else {
      key = args[a];
      given++;
    }
  }
  if (file != NULL && given == 0)
    return allow_file(file, admin);
  if (key == NULL || given != 1 || file != NULL)
    return usage_error(allow ? "allow" : "revoke");
  req.command = allow ? TRAIND__CONTROL_REQUEST__COMMAND__ALLOW
                      : TRAIND__CONTROL_REQUEST__COMMAND__REVOKE;
  req.key = unquote_key(key);
  req.admin = admin;
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  json_object *spread = NULL;
  json_object_object_get_ex(o, "spread", &spread);
  printf("%s key of node %s%s%s\n", allow ? "admitted" : "revoked", td__cli_jstr(o, "node_id"),
         admin ? " (admin)" : "",
         spread && json_object_get_boolean(spread) ? "; signed revocation sent to every member"
                                                   : "");
  json_object_put(o);
  return 0;
}

static int cmd_allow(int nargs, char **args) { return allow_or_revoke(true, nargs, args); }

static int cmd_revoke(int nargs, char **args) { return allow_or_revoke(false, nargs, args); }

/* "30", "30s", "10m", "1h", "2d" -> seconds; 0 on anything else. */
static uint32_t parse_duration_s(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  double unit = strcmp(end, "") == 0 || strcmp(end, "s") == 0 ? 1
                : strcmp(end, "m") == 0                     ? 60
                : strcmp(end, "h") == 0                     ? 3600
                : strcmp(end, "d") == 0                     ? 86400
                                                            : 0;
  if (errno != 0 || end == s || !(v > 0) || unit == 0 || v * unit > 4e9)
    return 0;
  return v * unit < 1 ? 1 : (uint32_t)(v * unit);
}

static int cmd_invite(int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__INVITE;
  req.count = 1;
  for (int a = 0; a < nargs; a++) {
    if (strcmp(args[a], "--admin") == 0) {
      req.admin = true;
    } else if (strcmp(args[a], "--ttl") == 0 && a + 1 < nargs) {
      if ((req.ttl_s = parse_duration_s(args[++a])) == 0) {
        fprintf(stderr, "trainctl: error: --ttl takes a duration such as 90s, 30m, 1h or 2d\n");
        return 2;
      }
    } else if (strcmp(args[a], "--count") == 0 && a + 1 < nargs) {
      char *end;
      unsigned long v = strtoul(args[++a], &end, 10);
      if (*end != '\0' || v == 0 || v > 64) {
        fprintf(stderr, "trainctl: error: --count takes 1 to 64 (one invite per new node)\n");
        return 2;
      }
      req.count = (uint32_t)v;
    } else {
      return usage_error("invite");
    }
  }
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  json_object *list = NULL;
  json_object_object_get_ex(o, "invites", &list);
  for (size_t i = 0; list != NULL && i < json_object_array_length(list); i++)
    printf("%s\n", json_object_get_string(json_object_array_get_idx(list, i)));
  json_object_put(o);
  return 0;
}

static int cmd_join(int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  bool by_invite = nargs == 1 && strncmp(args[0], "ti1,", 4) == 0; /* trainctl invite's */
  if (nargs != 1 && nargs != 2) {
    fprintf(stderr, "trainctl: error: usage: trainctl join tcp://HOST:PORT [KEY] | "
                    "trainctl join INVITE\n");
    return 2;
  }
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__JOIN;
  req.endpoint = by_invite ? "" : args[0];
  req.invite = by_invite ? args[0] : "";
  req.key = nargs == 2 ? unquote_key(args[1]) : "";
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  json_object *peers = NULL;
  json_object_object_get_ex(o, "peers", &peers);
  printf("joined %s (node %s); %zu peers known\n", td__cli_jstr(o, "joined"),
         td__cli_jstr(o, "seed_node"), peers ? json_object_array_length(peers) : 0);
  json_object_put(o);
  return 0;
}

static int cmd_start(int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
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
    rc = td__cli_call(&req, &o);
    if (rc == 0) { /* one line: who runs it, who refused and why, who is not ready yet */
      int nodes = (int)td__cli_jnum(o, "nodes"), ready = (int)td__cli_jnum(o, "ready");
      int waiting = (int)td__cli_jnum(o, "waiting");
      const char *refused = td__cli_jstr(o, "refused");
      if (ready == nodes)
        printf("started run %s on %d nodes", td__cli_jstr(o, "run_id"), nodes);
      else
        printf("started run %s on %d of %d nodes", td__cli_jstr(o, "run_id"), ready, nodes);
      if (refused[0] != '\0' && strcmp(refused, "-") != 0)
        printf("; it goes on without those that refused: %s", refused);
      if (waiting > 0)
        printf("; %d not ready after %.0f s (trainctl status follows them)", waiting,
               td__cli_jnum(o, "wait_s"));
      printf("\n");
      json_object_put(o);
    }
  }
  free(ini);
  free(settings);
  return rc;
}

static int cmd_status(int nargs, char **args) {
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
      return usage_error("status");
    }
  }
  return td__views_status(json, watch, every);
}

static int cmd_rounds(int nargs, char **args) {
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
      return usage_error("rounds");
    }
  }
  return td__views_rounds(last, csv, json);
}

/* peers, stop and leave: one request, [--json] the only option. */
static int simple_request(const char *name, Traind__ControlRequest__Command command, int nargs,
                          char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  bool json = nargs == 1 && strcmp(args[0], "--json") == 0;
  if (nargs > (json ? 1 : 0))
    return usage_error(name);
  req.command = command;
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  if (json) {
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  } else if (command == TRAIND__CONTROL_REQUEST__COMMAND__PEERS) {
    json_object *peers = NULL;
    json_object_object_get_ex(o, "peers", &peers);
    td__views_peers(peers);
  } else if (command == TRAIND__CONTROL_REQUEST__COMMAND__STOP) {
    printf("stopping run %s\n", td__cli_jstr(o, "stopping"));
  } else {
    printf("node %s left the cluster and is shutting down\n", td__cli_jstr(o, "left"));
  }
  json_object_put(o);
  return 0;
}

static int cmd_peers(int nargs, char **args) {
  return simple_request("peers", TRAIND__CONTROL_REQUEST__COMMAND__PEERS, nargs, args);
}

static int cmd_stop(int nargs, char **args) {
  return simple_request("stop", TRAIND__CONTROL_REQUEST__COMMAND__STOP, nargs, args);
}

static int cmd_leave(int nargs, char **args) {
  return simple_request("leave", TRAIND__CONTROL_REQUEST__COMMAND__LEAVE, nargs, args);
}

/* verify: the members hash their state a few rounds ahead (the daemon
 * answers which round); then status is read until that round is decided.
 * Exit 0 when every member agrees, 1 when one differs, there is no majority,
 * or the run ends first. */
static int cmd_verify(int nargs, char **args) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  json_object *o = NULL;
  int rc;
  bool json = nargs == 1 && strcmp(args[0], "--json") == 0;
  if (nargs > (json ? 1 : 0))
    return usage_error("verify");
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__VERIFY;
  if ((rc = td__cli_call(&req, &o)) != 0)
    return rc;
  double want = td__cli_jnum(o, "round");
  char run_id[32];
  snprintf(run_id, sizeof run_id, "%s", td__cli_jstr(o, "run_id"));
  json_object_put(o);
  Traind__ControlRequest st = TRAIND__CONTROL_REQUEST__INIT;
  st.command = TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  for (;;) {
    json_object *run = NULL, *v = NULL;
    if ((rc = td__cli_call(&st, &o)) != 0)
      return rc;
    json_object_object_get_ex(o, "run", &run);
    json_object_object_get_ex(run, "verify", &v);
    bool same_run = strcmp(td__cli_jstr(run, "run_id"), run_id) == 0;
    bool decided = same_run && td__cli_jnum(v, "round") >= want;
    if (decided || !same_run || strcmp(td__cli_jstr(run, "state"), "running") != 0) {
      if (json && decided) {
        printf("%s\n", json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
      } else if (!decided) {
        json_object_put(o);
        return td__cli_die("run %s ended before round %.0f was verified", run_id, want);
      } else {
        td__views_verify(run);
      }
      json_object *diverged = NULL;
      json_object_object_get_ex(v, "diverged", &diverged);
      bool agree = strcmp(td__cli_jstr(v, "hash"), "-") != 0 &&
                   (diverged == NULL || json_object_array_length(diverged) == 0) &&
                   td__cli_jnum(v, "agree") == td__cli_jnum(v, "members");
      json_object_put(o);
      return agree ? 0 : 1;
    }
    json_object_put(o);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 200000000};
    nanosleep(&ts, NULL);
  }
}

static int cmd_help(int nargs, char **args);

/* ---- the table -------------------------------------------------------------------------- */

typedef enum {
  ASKS_DAEMON,  /* a request over the control socket */
  READS_LEDGER, /* reads ledgers directly; --socket S: the ledger of the daemon at S */
  LOCAL,        /* neither */
} command_source_t;

typedef struct {
  const char *name;
  int (*run)(int nargs, char **args); /* the arguments after the name; returns the exit code */
  const char *synopsis;               /* its arguments, as `trainctl help` shows them */
  const char *help;                   /* one line */
  command_source_t source;
} command_t;

static const command_t COMMANDS[] = {
    {"join", cmd_join, "tcp://HOST:PORT [KEY] | INVITE",
     "join the cluster of the node at that endpoint, whose public key is KEY, or by an invite "
     "from trainctl invite", ASKS_DAEMON},
    {"invite", cmd_invite, "[--admin] [--ttl 1h] [--count N]",
     "print N one-time join strings for new nodes (admin: they may start runs and invite)",
     ASKS_DAEMON},
    {"start", cmd_start, "[RUN.ini] [--set key=value]...", "start a run on every live member",
     ASKS_DAEMON},
    {"status", cmd_status, "[--json] [--watch [S]]",
     "node, peers and run progress (watch: every S s until the run ends; exit 1 if it fails)",
     ASKS_DAEMON},
    {"stop", cmd_stop, "", "stop the current run everywhere", ASKS_DAEMON},
    {"verify", cmd_verify, "[--json]",
     "the members compare hashes of their model a few rounds ahead; exit 1 if one differs",
     ASKS_DAEMON},
    {"peers", cmd_peers, "[--json]", "members and per-link traffic", ASKS_DAEMON},
    {"rounds", cmd_rounds, "[--last N] [--csv|--json]",
     "rounds of the current run, from the ledger (csv: the columns of export)", ASKS_DAEMON},
    {"leave", cmd_leave, "", "tell the peers and shut this daemon down", ASKS_DAEMON},
    {"key", cmd_key, "[--json]", "this node's public key, single-quoted for the shell",
     ASKS_DAEMON},
    {"allow", cmd_allow, "[--admin] KEY | [--admin] --file FILE",
     "admit a node's key, or every key listed in FILE (admin: it may start and stop runs)",
     ASKS_DAEMON},
    {"revoke", cmd_revoke, "KEY", "remove a key: its connections and membership end",
     ASKS_DAEMON},
    {"runs", td_history_runs, "[--json]", "every run in the ledgers, oldest first", READS_LEDGER},
    {"show", td_history_show, "RUN [--json]", "a run's spec and outcome, and why it failed",
     READS_LEDGER},
    {"export", td_export_main, "RUN [--format csv|json] [--table rounds|updates|links|events]",
     "a run's rows (csv: one block per table)", READS_LEDGER},
    {"plot", td_plot_main,
     "RUN... [--x time|round|samples|bytes]"
     " [--y accuracy|loss|bpb|goodput|staleness|idle|bytes|bytes_recv|client_accuracy|consensus]"
     " [-o FILE.png|FILE.svg] [--script FILE.gp] [--size WxH]",
     "curves with gnuplot, one per run and node", READS_LEDGER},
    {"model", td_model_main, "RUN [--round R] -o FILE [--format safetensors|onnx]",
     "the run's kept model (or round R's checkpoint) as safetensors or ONNX", READS_LEDGER},
    {"predict", td_predict_main,
     "MODEL --data DATASET [-o FILE.csv] [--json] [--round R] [--model SPEC] [--batch B]",
     "a run's model (or a safetensors file) over a dataset's test split: accuracy and loss "
     "(bits per byte for a gpt), a CSV row per example",
     READS_LEDGER},
    {"generate", td_generate_main,
     "MODEL --prompt TEXT [--tokens N] [--temperature T] [--seed S] [--round R]",
     "text sampled from a gpt (a run's model or a file): temperature 0 is greedy, a seed "
     "gives the same text",
     READS_LEDGER},
    {"help", cmd_help, "[COMMAND]", "every command, or one command's usage", LOCAL},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

static const command_t *find_command(const char *name) {
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(COMMANDS[i].name, name) == 0)
      return &COMMANDS[i];
  return NULL;
}

/* "unknown command 'X': did you mean 'Y'? (...)": one line, exit 2. */
static int unknown_command(const char *name) {
  const char *names[N_COMMANDS];
  for (size_t i = 0; i < N_COMMANDS; i++)
    names[i] = COMMANDS[i].name;
  const char *near = td_suggest_nearest(name, names, N_COMMANDS);
  if (near != NULL)
    fprintf(stderr, "trainctl: error: unknown command '%.64s': did you mean '%s'? "
                    "(trainctl help lists every command)\n", name, near);
  else
    fprintf(stderr, "trainctl: error: unknown command '%.64s' (trainctl help lists every "
                    "command)\n", name);
  return 2;
}

static int usage_error(const char *name) {
  const command_t *c = find_command(name);
  fprintf(stderr, "trainctl: error: usage: trainctl %s%s%s (trainctl help %s)\n", name,
          c->synopsis[0] ? " " : "", c->synopsis, name);
  return 2;
}

static void print_command(FILE *out, const command_t *c) {
  fprintf(out, "  %s%s%s\n      %s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis, c->help);
}

static void print_usage(FILE *out) {
  static const struct {
    command_source_t source;
    const char *title;
  } groups[] = {
      {ASKS_DAEMON, "commands that ask traind, over its control socket:"},
      {READS_LEDGER, "commands that read ledgers directly (read-only; traind may be down):"},
      {LOCAL, "and:"},
  };
  fprintf(out, "usage: trainctl [--socket PATH] [--timeout S] COMMAND [ARGS]\n");
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    fprintf(out, "\n%s\n", groups[g].title);
    for (size_t i = 0; i < N_COMMANDS; i++)
      if (COMMANDS[i].source == groups[g].source)
        print_command(out, &COMMANDS[i]);
  }
  fprintf(out,
          "\n"
          "The ledger commands read --db FILE and --data-dir DIR (repeatable), or RUN\n"
          "written DB:RUN; by default the ledger of the daemon at --socket, else\n"
          "DATA_DIR/traind.db. RUN is a unique prefix of a run id.\n"
          "--socket defaults to $TRAIND_SOCKET, else DATA_DIR/control.sock with DATA_DIR =\n"
          "$TRAIND_DATA_DIR or ~/.local/share/traind (the daemon's defaults).\n"
          "--timeout: give up when traind does not answer within S seconds (default %d).\n"
          "--commands: the command names, one per line (for shell completion).\n"
          "trainctl help COMMAND: one command; man trainctl: the details.\n",
          TD_CONTROL_TIMEOUT_MS / 1000);
}

static int cmd_help(int nargs, char **args) {
  if (nargs == 0) {
    print_usage(stdout);
    return 0;
  }
  if (nargs > 1)
    return usage_error("help");
  const command_t *c = find_command(args[0]);
  if (c == NULL)
    return unknown_command(args[0]);
  printf("usage: trainctl %s%s%s\n  %s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis,
         c->help);
  if (c->source == READS_LEDGER)
    printf("  (reads ledgers: --db FILE | --data-dir DIR, repeatable; default the ledger of the"
           " daemon at --socket, else DATA_DIR/traind.db)\n");
  return 0;
}

/* --socket S with a ledger command: read the ledger of the daemon at S,
 * wherever its data dir is (its status says). */
static int use_daemon_ledger(void) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  json_object *o = NULL;
  int rc = td__cli_call(&req, &o);
  if (rc != 0)
    return rc;
  const char *dir = td__cli_jstr(o, "data_dir");
  if (strcmp(dir, "-") == 0)
    rc = td__cli_die("traind at %s did not say where its data dir is", td__cli_socket());
  else
    td__ledgers_use_data_dir(dir);
  json_object_put(o);
  return rc;
}

/* Whether stdout is a pipe whose reader has gone (`trainctl export RUN |
 * head`): not an error, the reader has what it wanted. errno cannot tell
 * once stdio has retried, the pipe can: its write end polls POLLERR. */
static bool stdout_reader_gone(void) {
  struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}

int main(int argc, char **argv) {
  static char default_socket[700];
  const char *socket_path;
  int timeout_ms = TD_CONTROL_TIMEOUT_MS;
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
  /* a closed socket or pipe is an EPIPE to handle, not a death; a closed
   * stdout (`trainctl export RUN | head`) ends trainctl quietly */
  signal(SIGPIPE, SIG_IGN);
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      socket_path = argv[++i];
      socket_given = true;
    } else if (strncmp(argv[i], "--socket=", 9) == 0) {
      socket_path = argv[i] + 9;
      socket_given = true;
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
      print_usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--commands") == 0) {
      for (size_t c = 0; c < N_COMMANDS; c++)
        printf("%s\n", COMMANDS[c].name);
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
  td__cli_set_target(socket_path, timeout_ms);
  if (i >= argc) {
    fprintf(stderr, "trainctl: error: no command given (trainctl help lists every command; "
                    "trainctl status shows this node)\n");
    return 2;
  }
  const command_t *c = find_command(argv[i]);
  if (c == NULL)
    return unknown_command(argv[i]);
  if (c->source == READS_LEDGER && socket_given) {
    int rc = use_daemon_ledger();
    if (rc != 0)
      return rc;
  }
  int rc = c->run(argc - i - 1, argv + i + 1);
  if ((fflush(stdout) != 0 || ferror(stdout)) && !stdout_reader_gone() && rc == 0)
    rc = td__cli_die("cannot write to stdout: %s", strerror(errno));
  return rc;
}
