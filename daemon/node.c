/* node.c: the peer daemon's start-up, heartbeat and shutdown.
 *
 * Threads: loop thread. td_node_main() makes the data directory, the key
 * pair and the node id, opens the parts (the ledger queue, the transport, membership, the
 * control socket, the metrics endpoint when asked for) and runs the libuv
 * loop until SIGINT, SIGTERM or `trainctl leave`. The heartbeat timer calls each part's tick in turn; everything else
 * happens in the parts' own callbacks (internal.h lists them). Shutdown says
 * goodbye to the peers, finishes the run, closes every handle and lets the
 * loop end once the last pool job has finished, so nothing a job borrows is
 * freed under it. */
#include "daemon/node.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/net/advertise.h"
#include "daemon/internal.h"
#include "daemon/base/log.h"
#include "daemon/base/memtrim.h"

/* Failure detection: suspect after this many heartbeats of silence, dead after... */
#define SUSPECT_AFTER_BEATS 3
#define DEAD_AFTER_BEATS 6

void td_node_default_data_dir(char *buf, size_t len) {
  const char *env = getenv("TRAIND_DATA_DIR");
  const char *home = getenv("HOME");
  if (env != NULL && env[0] != '\0')
    snprintf(buf, len, "%s", env);
  else
    snprintf(buf, len, "%s/.local/share/traind", home && home[0] ? home : ".");
}

/* The node id is derived from the node's public key (access.c), so it
 * survives restarts with the key and cannot be claimed without it. It is
 * also written to DATA_DIR/node_id for scripts. */
static int set_node_id(td__node_t *n, char *why, size_t why_len) {
  n->node_id = td__access_node_id(n->access);
  char path[600];
  snprintf(path, sizeof path, "%s/node_id", n->data_dir);
  FILE *f = fopen(path, "r");
  if (f != NULL) {
    char line[64] = "";
    uint64_t old = fgets(line, sizeof line, f) != NULL ? strtoull(line, NULL, 16) : 0;
    fclose(f);
    if (old == n->node_id)
      return 0;
    if (old != 0) /* node.key was lost or replaced: a new pair was made */
      td_log_warn("this node's identity changed: node id %016" PRIx64 " is now %016" PRIx64
                  " (%s/" TD_KEY_FILE " is not the key it had: a new key pair was made, public "
                  "key %s). Peers that admitted the old key will refuse this node until each "
                  "of them admits the new one (trainctl allow '%s'), and its runs take it for a "
                  "new member; to keep the old identity, stop traind and put the old "
                  TD_KEY_FILE " back", old, n->node_id, n->data_dir,
                  td__access_keypair(n->access)->pub, td__access_keypair(n->access)->pub);
  }
  f = fopen(path, "w");
  if (f == NULL)
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(errno));
  fprintf(f, "%016" PRIx64 "\n", n->node_id);
  fclose(f);
  return 0;
}

static void write_endpoint_file(td__node_t *n) {
  char path[600];
  snprintf(path, sizeof path, "%s/endpoint", n->data_dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%s\n", td__transport_endpoint(n->net));
    fclose(f);
  }
}

/* How often free memory goes back to the system (memtrim.h): as often as
 * when idle while the model is small, for what a trim costs a round is the
 * refaulting of the buffers it frees, about the model's size each. */
static double memtrim_period(const td__node_t *n) {
  const td__session_t *s = n->session;
  bool small = s == NULL || s->run == NULL ||
               td_run_numel(s->run) * sizeof(float) <= TD_MEMTRIM_SMALL_MODEL;
  return small ? TD_MEMTRIM_IDLE_S : TD_MEMTRIM_BUSY_S;
}

static void on_heartbeat(uv_timer_t *t) {
  td__node_t *n = t->data;
  td__transport_tick(n->net);
  td__gossip_tick(n);
  if (n->session != NULL) {
    td__session_t *s = n->session;
    td__xfer_tick(s);
    td__join_tick(s);
    td__reconcile_tick(s);
    td__verify_tick(s);
    td__session_settle(n);
    if (n->session == s)
      td__rounds_tick(s);
  }
  td__ledgerq_flush(n->ledger);
  td__node_figures_changed(n);
  td_memtrim_tick(memtrim_period(n));
}

void td__node_shutdown(td__node_t *n, const char *why) {
  if (n->shutting_down)
    return;
  n->shutting_down = true;
  td_log_info("shutting down: %s", why);
  td__gossip_leave(n, why);
  if (n->session != NULL)
    td__session_finish(n, TD__RUN_STOPPED, n->session->last_eval_acc, "the node shut down");
  td__ledger_event(n->ledger, "shutdown", "%s", why);
  td__ledgerq_stop(n->ledger); /* what is queued now is written at close */
  uv_close((uv_handle_t *)&n->heartbeat_timer, NULL);
  uv_close((uv_handle_t *)&n->round_timer, NULL);
  uv_close((uv_handle_t *)&n->sigint, NULL);
  uv_close((uv_handle_t *)&n->sigterm, NULL);
  td__transport_stop(n->net);
  td__control_stop(n->control);
}

static void on_signal(uv_signal_t *h, int signum) {
  td__node_shutdown(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* The transport's upcall: a received envelope goes to dispatch.c. */
static void on_received(void *user, const Traind__Envelope *env, size_t bytes) {
  td__dispatch(user, env, bytes);
}

/* The node's figures listener: the monitor takes a fresh snapshot. */
static void publish_figures(void *monitor) { td__monitor_publish(monitor); }


/* What peers are told to dial: the operator's --advertise, the bound
 * address, or with a wildcard one the address that routes to each peer. */
static void log_listening(td__node_t *n) {
  const char *listen = td__transport_listen_endpoint(n->net);
  const char *shown = td__transport_endpoint(n->net);
  const char *how = strcmp(listen, shown) == 0 ? ""
                    : td_advertise_is_wildcard(listen)
                        ? " (to each peer: the address of the interface that routes to it)"
                        : " (--advertise)";
  td_log_info("node %016" PRIx64 " listening on %s, advertising %s%s, control socket %s, "
              "data in %s",
              n->node_id, listen, shown, how, n->control_path, n->data_dir);
}

/* The descriptor budget the transport enforces (daemon/net/descriptors.c). */
static void log_descriptors(td__node_t *n) {
  const td__descriptors_t *fds = td__transport_descriptors(n->net);
  td_log_info("descriptors: limit %" PRIu64 ", cap %" PRIu64 " (%" PRIu64 " kept for the ledger, "
              "control, metrics and outgoing links, %" PRIu64 " for control clients, %" PRIu64
              " for incoming peer connections: %" PRIu64 " per address, %" PRIu64
              " in their handshake)",
              fds->limit, fds->cap, fds->reserve, fds->control_clients, fds->inbound,
              fds->per_address, fds->pending);
  if (fds->tight)
    td_log_warn("the descriptor limit (%" PRIu64 ") is too low to serve a full cluster and "
                "withstand a connection flood: raise it (LimitNOFILE= in the systemd unit, "
                "ulimit -n, or prlimit --nofile)", fds->limit);
}

/* Open the parts, in the order they depend on each other. */
static int node_open(td__node_t *n, const td_node_opts_t *opts, char *why, size_t why_len) {
  td__policy_opts_t policy = {.max_model_mb = opts->max_model_mb, .max_batch = opts->max_batch,
                              .max_rounds = opts->max_rounds,
                              .max_checkpoint_mb = opts->max_checkpoint_mb,
                              .data_root = opts->data_root, .data_dir = n->data_dir};
  const char *listen = opts->listen ? opts->listen : TD_NODE_DEFAULT_LISTEN;
  int rc = td__access_check_listen(listen, opts->insecure, opts->insecure_force, why, why_len);
  if (rc == 0 && opts->advertise != NULL && strcmp(listen, TD_LISTEN_NONE) == 0)
    rc = td_why(why, why_len, TD_ECONFIG,
                "--advertise %s with --listen none: a node that accepts no connections has "
                "nothing to advertise; drop one of the two", opts->advertise);
  if (rc == 0)
    rc = td__policy_init(&n->policy, &policy, why, why_len);
  if (rc == 0)
    rc = td__access_open(&n->access, n->data_dir, opts->insecure, why, why_len);
  if (rc == 0)
    rc = set_node_id(n, why, why_len);
  if (rc != 0)
    return rc;
  char dbpath[600];
  snprintf(dbpath, sizeof dbpath, "%s/traind.db", n->data_dir);
  if ((rc = td__ledgerq_open(&n->ledger, &n->loop, dbpath, why, why_len)) != 0)
    return rc;
  td__descriptors_t fds;
  char note[256];
  td__descriptors_init(&fds, note, sizeof note);
  if (note[0] != '\0')
    td_log_warn("%s", note);
  td__transport_opts_t net = {.loop = &n->loop, .node_id = n->node_id, .access = n->access,
                              .drops = &n->drops, .listen = listen, .descriptors = &fds,
                              .heartbeat_s = n->heartbeat_s,
                              .link_delay_s = opts->link_delay_ms / 1000.0,
                              .uplink_bps = opts->uplink_kbit * 1000.0,
                              .events = {.received = on_received,
                                         .invite = td__admit_on_invite,
                                         .user = n}};
  if ((rc = td__transport_open(&n->net, &net, why, why_len)) != 0)
    return rc;
  if (opts->advertise != NULL)
    td__transport_set_advertise(n->net, opts->advertise);
  if ((rc = td_members_open(&n->members, n->node_id, td__transport_endpoint(n->net),
                            SUSPECT_AFTER_BEATS * n->heartbeat_s,
                            DEAD_AFTER_BEATS * n->heartbeat_s)) != 0)
    return td_why(why, why_len, rc, "cannot open the membership table: %s", td_strerror(rc));
  td__transport_set_members(n->net, n->members);
  td__gossip_install(n);
  if ((rc = td__control_open(&n->control, n, why, why_len)) != 0)
    return rc;
  n->welcomed = td__control_welcome;
  n->join_refused = td__control_join_refused;
  if (opts->metrics == NULL)
    return 0;
  if ((rc = td__monitor_open(&n->monitor, n, opts->metrics, why, why_len)) != 0)
    return rc;
  n->figures_changed = (td__listener_t){.fn = publish_figures, .user = n->monitor};
  return 0;
}

int td_node_main(const td_node_opts_t *opts, char *why, size_t why_len) {
  td__node_t *n = calloc(1, sizeof *n);
  if (n == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  /* a control client that leaves before reading its answer is not fatal:
   * the write fails with EPIPE and the connection is closed */
  signal(SIGPIPE, SIG_IGN);
  n->threads = opts->threads;
  n->heartbeat_s = (opts->heartbeat_ms ? opts->heartbeat_ms : TD_NODE_DEFAULT_HEARTBEAT_MS) / 1000.0;
  if (opts->data_dir != NULL)
    snprintf(n->data_dir, sizeof n->data_dir, "%s", opts->data_dir);
  else
    td_node_default_data_dir(n->data_dir, sizeof n->data_dir);
  if (opts->control_path != NULL)
    snprintf(n->control_path, sizeof n->control_path, "%s", opts->control_path);
  else
    snprintf(n->control_path, sizeof n->control_path, "%s/control.sock", n->data_dir);
  uv_loop_init(&n->loop);
  n->shutdown = td__node_shutdown;
  int rc = node_open(n, opts, why, why_len);
  if (rc == 0) {
    uv_timer_init(&n->loop, &n->heartbeat_timer);
    n->heartbeat_timer.data = n;
    uv_timer_init(&n->loop, &n->round_timer);
    n->round_timer.data = n;
    uint64_t hb_ms = (uint64_t)(n->heartbeat_s * 1000);
    uv_timer_start(&n->heartbeat_timer, on_heartbeat, hb_ms, hb_ms);
    uv_signal_init(&n->loop, &n->sigint);
    uv_signal_init(&n->loop, &n->sigterm);
    n->sigint.data = n->sigterm.data = n;
    uv_signal_start(&n->sigint, on_signal, SIGINT);
    uv_signal_start(&n->sigterm, on_signal, SIGTERM);
    char tag[64];
    snprintf(tag, sizeof tag, "traind[%.6" PRIx64 "]", n->node_id >> 40);
    td_log_set_tag(tag);
    write_endpoint_file(n);
    log_listening(n);
    log_descriptors(n);
    if (td__access_secure(n->access))
      td_log_info("security: curve; key %s; %zu key(s) admitted (%s/" TD_ALLOWLIST_FILE ")",
                  td__access_keypair(n->access)->pub, td__access_count(n->access), n->data_dir);
    else
      td_log_warn("security: insecure (--insecure): plain TCP, peers are not authenticated");
    td__ledger_event(n->ledger, "start", "node %016" PRIx64 " at %s", n->node_id,
                     td__transport_endpoint(n->net));
    td__comeback_start(n);     /* runs it died in: interrupted, the newest to go back into */
    td__gossip_greet_known(n); /* a restarted node rejoins by saying hello */
    td__ledgerq_flush(n->ledger);
    /* ends after shutdown, once the last handle is closed and the last pool
     * job (an encode, a ledger batch, a query) is done */
    uv_run(&n->loop, UV_RUN_DEFAULT);
  }
  uv_walk(&n->loop, close_walk, NULL); /* what a failed start-up left open */
  uv_run(&n->loop, UV_RUN_DEFAULT);
  uv_loop_close(&n->loop);
  td__monitor_close(&n->monitor); /* stops its server first: nothing reads the node after */
  td__control_close(&n->control);
  td__transport_close(&n->net);
  td_members_close(&n->members);
  td__access_close(&n->access);
  td__ledgerq_close(&n->ledger); /* writes what is left */
  free(n->last_run);
  td__backfill_close(&n->retired);
  if (rc == 0)
    td_log_info("stopped cleanly");
  free(n);
  return rc;
}
