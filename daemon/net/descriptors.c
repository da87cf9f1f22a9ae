/* descriptors.c: the node's descriptor budget.
 *
 * Every TCP connection to the peer port costs a descriptor the moment libzmq
 * accepts it, before any handshake says who is on the other end. With the
 * default soft limit of 1,024 a thousand idle connections from anyone were
 * enough to leave no descriptor for SQLite, the control socket or a new
 * member. At start traind raises its soft RLIMIT_NOFILE to the hard limit
 * (the systemd unit sets LimitNOFILE) and splits what it got: a reserve for
 * itself (the ledger, the control socket and the metrics listener, the
 * outgoing links' sockets, libzmq's own mailboxes, logs), a share for
 * control clients, and the rest for inbound peer connections, of which one
 * address may hold a bounded number and unauthenticated ones (handshake not
 * finished) a smaller one. The transport sheds connections beyond those
 * (transport.c). Called once at start, before any thread exists. */
#include "daemon/net/net.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* Descriptors kept out of every share: for emergencies and libraries. */
#define HEADROOM_MIN 32
/* Our own: SQLite (db, journal, wal), the control socket, metrics, the
 * ZAP/monitor/router sockets and libzmq's mailboxes, logs, /proc reads. */
#define RESERVE_BASE 64
/* Each outgoing link holds two DEALERs: a TCP descriptor and a mailbox each. */
#define RESERVE_PER_MEMBER 4
#define CONTROL_CLIENTS_MAX 64
/* Inbound connections from one address: a few nodes behind one NAT (two
 * connections each to us) and their reconnects. */
#define PER_ADDRESS_MAX (4 * TD_MEMBERS_MAX)
/* Handshakes in progress at once: honest peers need two each, briefly. */
#define PENDING_MAX 256
/* Below this many inbound connections a node cannot serve a full cluster. */
#define INBOUND_MIN (4 * TD_MEMBERS_MAX)

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

void td__descriptors_plan(td__descriptors_t *d, uint64_t limit) {
  uint64_t headroom = limit / 16 > HEADROOM_MIN ? limit / 16 : HEADROOM_MIN;
  uint64_t reserve = RESERVE_BASE + RESERVE_PER_MEMBER * TD_MEMBERS_MAX;
  uint64_t cap = limit > headroom ? limit - headroom : 0;
  uint64_t control = min_u64(CONTROL_CLIENTS_MAX, cap / 16);
  uint64_t inbound = cap > reserve + control ? cap - reserve - control : 0;
  *d = (td__descriptors_t){.limit = limit, .cap = cap, .reserve = reserve,
                           .control_clients = control, .tight = inbound < INBOUND_MIN};
  if (d->tight) /* too few to share: keep serving a cluster, shed the rest */
    inbound = INBOUND_MIN;
  d->inbound = inbound;
  d->per_address = min_u64(PER_ADDRESS_MAX, inbound);
  d->pending = min_u64(PENDING_MAX, inbound / 2);
}

void td__descriptors_init(td__descriptors_t *d, char *note, size_t note_len) {
  struct rlimit rl;
  note[0] = '\0';
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    snprintf(note, note_len, "cannot read RLIMIT_NOFILE (%s): assuming 1024", strerror(errno));
    td__descriptors_plan(d, 1024);
    return;
  }
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      rl.rlim_cur = was;
      snprintf(note, note_len, "cannot raise the descriptor limit from %llu to %llu (%s)",
               (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
    }
  }
  /* RLIM_INFINITY: treat as a large finite limit */
  uint64_t limit = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : (uint64_t)rl.rlim_cur;
  td__descriptors_plan(d, limit);
}

long td__descriptors_open(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (dir == NULL)
    return -1;
  long n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(dir);
  return n > 0 ? n - 1 : n; /* not the directory's own descriptor */
}
