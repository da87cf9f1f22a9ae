/* node.h: the peer daemon (`traind` without --standalone).
 *
 * One libuv loop owns the ZeroMQ sockets (integrated through ZMQ_FD +
 * uv_poll), the control socket, the timers (heartbeats, failure detection,
 * round deadlines) and the membership table; a run's compute thread trains
 * (daemon/run.h); the libuv work pool packs updates and writes the ledger. */
#ifndef TD_NODE_H
#define TD_NODE_H

#include <stddef.h>

typedef struct {
  const char *data_dir;     /* created if missing; holds node_id, traind.db */
  const char *listen;       /* tcp://HOST:PORT, port 0 = ephemeral */
  const char *control_path; /* local socket, mode 0600; NULL = DATA_DIR/control.sock */
  unsigned threads;         /* BLAS threads for runs (0 = library default) */
  unsigned heartbeat_ms;    /* heartbeat period; suspect after 3, dead after 6 */
  unsigned link_delay_ms;   /* user-space latency added to outgoing update chunks */
} td_node_opts_t;

/* Run the daemon until SIGINT/SIGTERM or `trainctl leave`. Returns 0 after a
 * clean shutdown, or a TD_E* code with why when it cannot start. */
int td_node_main(const td_node_opts_t *opts, char *why, size_t why_len);

/* Default data directory: $TRAIND_DATA_DIR, else $HOME/.local/share/traind. */
void td_node_default_data_dir(char *buf, size_t len);

#endif
