/* settings.c: daemon settings, one table for defaults, parsing and help, and
 * the data directory's lock (one traind per directory). Main thread only. */
#include "daemon/settings.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/suggest.h"
#include "daemon/base/log.h"
#include "daemon/net/advertise.h"
#include "daemon/metrics.h"
#include "daemon/node.h"

#define TD_STR_(x) #x
#define TD_STR(x) TD_STR_(x)

typedef struct {
  const char *name;
  const char *help;
} config_key_t;

static const config_key_t keys[] = {
    {"data_dir", "node id, ledger (traind.db) and control socket (default ~/.local/share/traind)"},
    {"listen", "peer endpoint tcp://HOST:PORT, port 0 = ephemeral (default " TD_NODE_DEFAULT_LISTEN "); none: accept no connections, connect out to reachable members"},
    {"advertise", "endpoint tcp://HOST:PORT peers dial to reach this node (NAT, a port "
                  "forward, one of several addresses); default: the listen address, or with a "
                  "wildcard listen address the address of the interface that routes to each peer"},
    {"control", "control socket path, mode 0600 (default DATA_DIR/control.sock)"},
    {"log_level", "error | warn | info | debug (default info)"},
    {"threads", "compute threads for training: N runs the kernels on N threads, BLAS single-threaded inside them (default 0 = BLAS library default, kernels on one thread)"},
    {"heartbeat_ms", "heartbeat period; suspect after 3 missed, dead after 6 (default "
                     TD_STR(TD_NODE_DEFAULT_HEARTBEAT_MS) ")"},
    {"link_delay_ms", "added one-way latency of every outgoing frame (updates, snapshots, acks,"
                      " heartbeats), held in user space (emulated WAN; default 0)"},
    {"uplink_kbit", "cap on this node's update and snapshot traffic in kbit/s, paced in user space"
                    " (emulated WAN without root; default 0 = no cap)"},
    {"metrics", "serve Prometheus metrics on HOST:PORT (GET /metrics); port 0 = ephemeral"
                " (default off)"},
    {"max_model_mb", "most memory a run may take here (model, gradients, optimizer state, "
                     "activations, and their replica for evaluations), in MiB; a run over it "
                     "is refused (default 1/4 of RAM)"},
    {"max_batch", "largest run batch this node accepts (default 8192)"},
    {"max_rounds", "most rounds of a run this node accepts (default 1000000)"},
    {"max_checkpoint_mb", "most ledger space a run's checkpoints may hold at once, in MiB "
                          "(checkpoint_keep of them, or every one with checkpoint_keep = 0); a "
                          "run over it is refused (default 2048)"},
    {"data_root", "directory whose regular files runs may name as datasets (csv:, idx:, "
                  "npy:, text:PATH) and whose folders images:DIR may name; default none: "
                  "only fashion-mnist and text:fortunes"},
    {"insecure", "true: plain TCP between peers, no keys, ids not authenticated; refused "
                 "unless listen is a loopback address (default false: CURVE)"},
    {"insecure_force", "true: allow insecure on a non-loopback address (default false)"},
};

void td_settings_defaults(td_settings_t *c) {
  memset(c, 0, sizeof *c);
  td_node_default_data_dir(c->data_dir, sizeof c->data_dir);
  snprintf(c->listen, sizeof c->listen, "%s", TD_NODE_DEFAULT_LISTEN);
  snprintf(c->log_level, sizeof c->log_level, "info");
  c->heartbeat_ms = TD_NODE_DEFAULT_HEARTBEAT_MS;
}

static int set_uint(unsigned *out, const char *key, const char *v, unsigned lo, unsigned hi,
                    char *why, size_t n) {
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (v[0] == '-' || end == v || *end != '\0' || errno != 0 || x < lo || x > hi)
    return td_why(why, n, TD_ECONFIG, "%s: '%s' is not an integer in [%u, %u]", key, v, lo, hi);
  *out = (unsigned)x;
  return 0;
}

static int set_str(char *dst, size_t cap, const char *key, const char *v, char *why, size_t n) {
  if (v[0] == '\0' || strlen(v) >= cap)
    return td_why(why, n, TD_ECONFIG, "%s: empty or longer than %zu bytes", key, cap - 1);
  memcpy(dst, v, strlen(v) + 1);
  return 0;
}

int td_settings_set(td_settings_t *c, const char *key, const char *v, char *why, size_t n) {
  if (strcmp(key, "data_dir") == 0)
    return set_str(c->data_dir, sizeof c->data_dir, key, v, why, n);
  if (strcmp(key, "listen") == 0) {
    if (strcmp(v, "none") != 0 && (strncmp(v, "tcp://", 6) != 0 || strrchr(v, ':') == v + 3))
      return td_why(why, n, TD_ECONFIG,
                    "listen: expected tcp://HOST:PORT, or none (no inbound connections), got "
                    "'%s'", v);
    return set_str(c->listen, sizeof c->listen, key, v, why, n);
  }
  if (strcmp(key, "advertise") == 0) {
    int rc = td_advertise_check(v, why, n); /* "advertise: ..." */
    return rc != 0 ? rc : set_str(c->advertise, sizeof c->advertise, key, v, why, n);
  }
  if (strcmp(key, "control") == 0) {
    if (strlen(v) > 107)
      return td_why(why, n, TD_ECONFIG, "control: socket paths are limited to 107 bytes");
    return set_str(c->control, sizeof c->control, key, v, why, n);
  }
  if (strcmp(key, "log_level") == 0) {
    if (td_log_parse_level(v) < 0)
      return td_why(why, n, TD_ECONFIG, "log_level: '%s' (accepted: error, warn, info, debug)", v);
    return set_str(c->log_level, sizeof c->log_level, key, v, why, n);
  }
  if (strcmp(key, "threads") == 0)
    return set_uint(&c->threads, key, v, 0, 1024, why, n);
  if (strcmp(key, "heartbeat_ms") == 0)
    return set_uint(&c->heartbeat_ms, key, v, 20, 60000, why, n);
  if (strcmp(key, "link_delay_ms") == 0)
    return set_uint(&c->link_delay_ms, key, v, 0, 60000, why, n);
  if (strcmp(key, "max_model_mb") == 0)
    return set_uint(&c->max_model_mb, key, v, 1, 16u << 20, why, n);
  if (strcmp(key, "max_batch") == 0)
    return set_uint(&c->max_batch, key, v, 1, 65536, why, n);
  if (strcmp(key, "max_rounds") == 0)
    return set_uint(&c->max_rounds, key, v, 1, 100000000, why, n);
  if (strcmp(key, "max_checkpoint_mb") == 0)
    return set_uint(&c->max_checkpoint_mb, key, v, 1, 1u << 30, why, n);
  if (strcmp(key, "data_root") == 0)
    return set_str(c->data_root, sizeof c->data_root, key, v, why, n);
  if (strcmp(key, "insecure") == 0 || strcmp(key, "insecure_force") == 0) {
    bool *dst = key[8] == '\0' ? &c->insecure : &c->insecure_force;
    if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
      *dst = true;
    else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
      *dst = false;
    else
      return td_why(why, n, TD_ECONFIG, "%s: '%s' is not true or false", key, v);
    return 0;
  }
  if (strcmp(key, "uplink_kbit") == 0)
    return set_uint(&c->uplink_kbit, key, v, 0, 100000000, why, n);
  if (strcmp(key, "metrics") == 0) {
    int rc = td_metrics_check_addr(v, why, n); /* "metrics address '...': reason" */
    return rc != 0 ? rc : set_str(c->metrics, sizeof c->metrics, key, v, why, n);
  }
  static const char *const known[] = {
      "data_dir", "listen", "advertise", "control", "log_level", "threads", "heartbeat_ms", "link_delay_ms",
      "uplink_kbit", "metrics", "max_model_mb", "max_batch", "max_rounds", "max_checkpoint_mb",
      "data_root", "insecure", "insecure_force"};
  char msg[512];
  return td_why(why, n, TD_ECONFIG, "%s",
                td_suggest_unknown(msg, sizeof msg, "key", key, known,
                                   sizeof known / sizeof known[0]));
}

typedef struct {
  td_settings_t *c;
  char *why;
  size_t n;
  int rc;
} ctx_t;

static int on_pair(void *user, const char *section, const char *name, const char *value) {
  ctx_t *ctx = user;
  if (ctx->rc != 0)
    return 0;
  if (section[0] != '\0' && strcmp(section, "daemon") != 0) {
    ctx->rc = td_why(ctx->why, ctx->n, TD_ECONFIG, "unknown section [%s] (use [daemon])", section);
    return 0;
  }
  ctx->rc = td_settings_set(ctx->c, name, value, ctx->why, ctx->n);
  return ctx->rc == 0;
}

int td_settings_load(td_settings_t *c, const char *path, char *why, size_t why_len) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return td_why(why, why_len, TD_ENOENT, "cannot open %s: %s", path, strerror(errno));
  char sub[512] = "";
  ctx_t ctx = {.c = c, .why = sub, .n = sizeof sub};
  int line = ini_parse_file(f, on_pair, &ctx);
  fclose(f);
  if (line == 0)
    return 0;
  if (ctx.rc != 0)
    return td_why(why, why_len, TD_ECONFIG, "%s:%d: %s", path, line, sub);
  return td_why(why, why_len, TD_ECONFIG, "%s:%d: syntax error (expected key = value)", path, line);
}

void td_settings_print_help(FILE *out) {
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    fprintf(out, "  %-13s %s\n", keys[i].name, keys[i].help);
}

#define LOCK_FILE "traind.lock"

static int mkdir_parents(const char *path) {
  char tmp[sizeof ((td_settings_t *)0)->data_dir];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return -1;
      *p = '/';
    }
  return mkdir(tmp, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int td_settings_make_data_dir(const char *data_dir, char *why, size_t why_len) {
  if (mkdir_parents(data_dir) != 0)
    return td_why(why, why_len, TD_EIO, "cannot create data directory %s: %s", data_dir,
                  strerror(errno));
  return 0;
}

int td_settings_lock_data_dir(const char *data_dir, int *fd_out, char *why, size_t why_len) {
  *fd_out = -1;
  int rc = td_settings_make_data_dir(data_dir, why, why_len);
  if (rc != 0)
    return rc;
  char path[sizeof ((td_settings_t *)0)->data_dir + sizeof LOCK_FILE + 1];
  snprintf(path, sizeof path, "%s/" LOCK_FILE, data_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    return td_why(why, why_len, TD_EIO, "cannot open %s: %s", path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char pid[32] = "";
    ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
    pid[got > 0 ? got : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    close(fd);
    if (err == EWOULDBLOCK)
      return td_why(why, why_len, TD_EIO,
                    "data directory %s is in use by another traind (pid %s); "
                    "give each daemon its own --data-dir",
                    data_dir, pid[0] ? pid : "unknown");
    return td_why(why, why_len, TD_EIO, "cannot lock %s: %s", path, strerror(err));
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    int err = errno;
    close(fd);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(err));
  }
  *fd_out = fd;
  return 0;
}
