/* node.h: the peer daemon (`traind` without --standalone).
 *
 * One libuv loop owns the ZeroMQ sockets (integrated through ZMQ_FD +
 * uv_poll), the control socket, the timers (heartbeats, failure detection,
 * round deadlines) and the membership table; a run's compute thread trains
 * (daemon/run/run.h); the libuv work pool encodes updates and writes the ledger.
 * daemon/internal.h maps the parts. */
#ifndef TD_NODE_H
#define TD_NODE_H

#include <stdbool.h>
#include <stddef.h>

/* Where a node listens and how often it beats when not told otherwise. */
#define TD_NODE_DEFAULT_LISTEN "tcp://127.0.0.1:7070"
#define TD_NODE_DEFAULT_HEARTBEAT_MS 500

typedef struct {
  const char *data_dir;     /* exists, locked by the caller (td_settings_lock_data_dir) */
  const char *listen;       /* tcp://HOST:PORT, port 0 = ephemeral */
  const char *advertise;    /* tcp://HOST:PORT peers dial (checked); NULL = derived (advertise.h) */
  const char *control_path; /* local socket, mode 0600; NULL = DATA_DIR/control.sock */
  unsigned threads;         /* compute threads for runs (0: BLAS default, no pool) */
  unsigned heartbeat_ms;    /* heartbeat period; suspect after 3, dead after 6 */
  unsigned link_delay_ms;   /* user-space latency added to outgoing update chunks */
  unsigned uplink_kbit;     /* user-space cap on queued (update, bulk) traffic; 0 = none */
  const char *metrics;      /* HOST:PORT serving GET /metrics; NULL = off */
  /* This node's limits over every run spec (daemon/session/policy.c); 0 / NULL = default */
  unsigned max_model_mb;    /* memory a run may take; default a quarter of the machine's */
  unsigned max_batch;       /* default 8192 */
  unsigned max_rounds;      /* default 1000000 */
  unsigned max_checkpoint_mb; /* a run's checkpoints in the ledger at once; default 2048 */
  const char *data_root;    /* file datasets only under here; NULL = named datasets only */
  bool insecure;            /* plain TCP, ids not authenticated (loopback only ...) */
  bool insecure_force;      /* ... unless this is set too */
} td_node_opts_t;

/* Run the daemon until SIGINT/SIGTERM or `trainctl leave`. Returns 0 after a
 * clean shutdown, or a TD_E* code with why when it cannot start. */
int td_node_main(const td_node_opts_t *opts, char *why, size_t why_len);

/* Default data directory: $TRAIND_DATA_DIR, else $HOME/.local/share/traind. */
void td_node_default_data_dir(char *buf, size_t len);

#endif
