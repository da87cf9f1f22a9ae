/* internal.h: the declarations the daemon's parts share, and nothing else.
 *
 * The peer daemon (node.h) is one libuv loop thread plus the work pool and a
 * run's compute thread. Its parts each own one job and keep their state
 * private to their file: node.c (start-up, shutdown, the heartbeat that calls
 * every part's tick), transport.c (links, sockets, pacing, goodput),
 * dispatch.c (which handler a received message goes to), gossip.c
 * (membership traffic), session.c (one run: its life from start to finish),
 * rounds.c (collecting and closing rounds), outbox.c (encoding our updates),
 * transfer.c (resumable blob transfer and knowledge transfer), join.c (late
 * join), comeback.c (members that fall out of a run and come back into it),
 * reconcile.c (anchor reconciliation), ledgerq.c (the ledger write
 * queue), control.c and status.c (trainctl's commands and their JSON),
 * monitor.c (the figures `--metrics` serves), access.c (keys, allowlist,
 * who a message is from and what it may ask) and zap.c (the ZAP handler).
 *
 * The node holds pointers to the parts. The run session's core (members,
 * rounds, the own-round ring) is shared by the run-side parts below; their
 * own state (the outbox, the transfer, the join, the reconciliation) is
 * opaque and reached only through the calls declared here. Everything here
 * runs on the loop thread unless it says otherwise. */
#ifndef TD_DAEMON_INTERNAL_H
#define TD_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "compress/codec.h"
#include "daemon/clock.h"
#include "daemon/keys.h"
#include "daemon/ledger.h"
#include "daemon/members.h"
#include "daemon/run.h"
#include "daemon/runspec.h"
#include "proto/wire.h"
#include "scheduler/linkq.h"
#include "scheduler/round.h"

/* Own rounds (and peers' reports) kept, indexed by round % TD__RING. */
#define TD__RING 4
/* Timeouts, seconds (monotonic). */
#define TD__RECON_STALL_S 3.0  /* a reconciliation message that stops growing is asked again */
#define TD__JOIN_STALL_S 3.0   /* a late-join seed that stops growing is asked again */
#define TD__XFER_STALL_S 10.0  /* a knowledge-transfer model that stops growing */
#define TD__LINK_EXPIRE_S 30.0 /* a frame never acked (its peer died) gives its window back */
/* Late join: the admitter starts the joiner at its open round + this. */
#define TD__JOIN_LEAD_ROUNDS 3
/* Coming back (comeback.c): a member whose heartbeats put it more than this
 * many rounds behind the run has fallen out of it (members of a sync or
 * overlap run are at most two rounds apart, a joiner three ahead). */
#define TD__BEHIND_ROUNDS 4
/* ...judged only from heartbeats this many periods after it was (re)admitted,
 * so one sent before it heard of the run does not count. */
#define TD__AWAY_GRACE_BEATS 2

typedef struct td__node td__node_t;
typedef struct td__transport td__transport_t;
typedef struct td__link td__link_t;
typedef struct td__ledgerq td__ledgerq_t;
typedef struct td__session td__session_t;
typedef struct td__outbox td__outbox_t;
typedef struct td__xfer td__xfer_t;
typedef struct td__join td__join_t;
typedef struct td__reconcile td__reconcile_t;
typedef struct td__control td__control_t;
typedef struct td__monitor td__monitor_t;
typedef struct td__access td__access_t;
typedef struct td__zap td__zap_t;

/* ---- drops: every refused peer message is counted by kind -------------------- */

#define TD__DROPS(X)                                                                        \
  X(MALFORMED, malformed) X(VERSION, version) X(OVERSIZED, oversized)                      \
  X(WRONG_RUN, wrong_run) X(NOT_MEMBER, not_member) X(LATE, late) X(AHEAD, ahead)           \
  X(REJECTED, rejected) X(NONFINITE_LOCAL, nonfinite_local) X(DUPLICATE, duplicate)         \
  X(HANDSHAKE, handshake) X(UNKNOWN_KEY, unknown_key) X(FORBIDDEN, forbidden)
#define TD__DROP_ENUM(u, l) TD__DROP_##u,
typedef enum { TD__DROPS(TD__DROP_ENUM) TD__DROP_COUNT } td__drop_t;
#undef TD__DROP_ENUM
/* Counter name of a drop kind ("malformed"), for status. */
const char *td__drop_name(td__drop_t kind);
/* Count a refused message; log `what` (rate-limited) unless it is NULL. */
void td__drop(td__node_t *n, td__drop_t kind, const char *what);

/* ---- this node's limits over run specs (policy.c) -------------------------------- */

#define TD_POLICY_DEFAULT_MAX_BATCH 8192
#define TD_POLICY_DEFAULT_MAX_ROUNDS 1000000
#define TD_POLICY_DEFAULT_MAX_CHECKPOINT_MB 2048

typedef struct {
  unsigned max_model_mb; /* 0: a quarter of the machine's memory */
  unsigned max_batch;    /* 0: TD_POLICY_DEFAULT_MAX_BATCH */
  unsigned max_rounds;   /* 0: TD_POLICY_DEFAULT_MAX_ROUNDS */
  unsigned max_checkpoint_mb; /* 0: TD_POLICY_DEFAULT_MAX_CHECKPOINT_MB */
  const char *data_root; /* NULL or "": named datasets only */
} td__policy_opts_t;

typedef struct {
  uint64_t max_bytes;
  uint64_t max_checkpoint_bytes; /* a run's checkpoints held in the ledger at once */
  unsigned max_batch, max_threads, max_rounds;
  char data_root[4096]; /* realpath of --data-root; "" = none */
} td__policy_t;

/* Limits from the options and this machine (cores, memory); TD_ENOENT or
 * TD_ECONFIG + why for a data root that is not a directory. */
int td__policy_init(td__policy_t *p, const td__policy_opts_t *o, char *why, size_t why_len);
/* Check a run spec for a run of n_members nodes before anything is allocated
 * or opened: TD_ERANGE (a limit) or TD_ECONFIG (the dataset) + a one-line why
 * that never quotes a file. On success, file datasets in spec->dataset are
 * rewritten to their resolved paths under the data root. */
int td__policy_check(const td__policy_t *p, td_runspec_t *spec, size_t n_members, char *why,
                     size_t why_len);

/* ---- keys, allowlist and permissions (access.c) ------------------------------------ */

typedef struct {
  bool secure;
  size_t allowed;
  uint64_t refused_keys;   /* connections the ZAP handler refused */
  uint64_t forged_senders; /* messages whose sender field named another node */
  uint64_t forbidden;      /* run starts and stops from keys without `admin` */
} td__access_stats_t;

/* Load (or make, at first start) DATA_DIR/node.key and read the allowlist;
 * insecure: keys are kept but not used. TD_ENOTSUP when libzmq has no CURVE. */
int td__access_open(td__access_t **out, const char *data_dir, bool insecure, char *why,
                    size_t why_len);
void td__access_close(td__access_t **self_p);
bool td__access_secure(const td__access_t *a);
const td_keypair_t *td__access_keypair(const td__access_t *a);
/* This node's id: derived from its public key. */
uint64_t td__access_node_id(const td__access_t *a);
/* The key a link to `peer` must authenticate; NULL when insecure or not admitted. */
const char *td__access_key_of(const td__access_t *a, uint64_t peer);
/* `peer` is admitted here (always true when insecure). */
bool td__access_known(const td__access_t *a, uint64_t peer);
/* ZAP: may this key connect? (a refusal is counted) */
bool td__access_admits(td__access_t *a, const uint8_t raw[TD_KEY_BYTES]);
/* Who sent a message that came on a connection authenticated as user_id
 * (Z85 key; NULL: none): its key's node id, 0 when that key is not admitted
 * (any more). A sender field that disagrees is counted and logged. Insecure:
 * `claimed`. */
uint64_t td__access_sender(td__access_t *a, const char *user_id, uint64_t claimed);
/* May `peer` start or stop runs on this node? (a refusal is counted) */
bool td__access_may_run(td__access_t *a, uint64_t peer);
/* Admit a key (admin: may start and stop runs) and save the allowlist. */
int td__access_allow(td__access_t *a, const char *z85, bool admin, char *why, size_t why_len);
/* Remove a key and save; *node_id says whose it was. TD_ENOENT when not listed. */
int td__access_revoke(td__access_t *a, const char *z85, uint64_t *node_id, char *why,
                      size_t why_len);
void td__access_stats(const td__access_t *a, td__access_stats_t *out);
/* Plain TCP (insecure) only on a loopback listen address, unless forced. */
int td__access_check_listen(const char *listen, bool insecure, bool force, char *why,
                            size_t why_len);
size_t td__access_count(const td__access_t *a);
const td_allowed_key_t *td__access_at(const td__access_t *a, size_t i);

/* ZAP handler (zap.c) on inproc://zeromq.zap.01 of the transport's context. */
int td__zap_open(td__zap_t **out, void *zctx, uv_loop_t *loop, td__access_t *access, char *why,
                 size_t why_len);
void td__zap_drain(td__zap_t *z); /* NULL-safe: answer every pending request */
void td__zap_stop(td__zap_t *z);  /* close its handle (shutdown) */
void td__zap_close(td__zap_t **self_p);

/* ---- the node (node.c) ------------------------------------------------------------ */

struct td__node {
  uv_loop_t loop;
  uint64_t node_id;
  char data_dir[512], control_path[640];
  unsigned threads;       /* compute threads for runs (0: BLAS default, no pool) */
  td__policy_t policy;    /* what this node accepts of a run spec */
  td__access_t *access;   /* keys, allowlist, permissions */
  double heartbeat_s;
  bool shutting_down;
  td_members_t *members;
  td__transport_t *net;
  td__ledgerq_t *ledger;
  td__session_t *session; /* the running run; NULL when none runs */
  struct {                /* a run this node fell out of (crash, pause): it goes back */
    uint64_t run_id;      /* 0: none */
    uint64_t last_round;  /* the last round its ledger holds */
  } rejoin;
  struct td__run_stats *last_run; /* figures of the last run that ended (status) */
  td__control_t *control;
  td__monitor_t *monitor; /* --metrics; NULL when off */
  struct {                /* since the daemon started, every run (monitoring) */
    uint64_t rounds, samples;
    double compute_s, wait_s;
  } totals;
  uint64_t drops[TD__DROP_COUNT];
  unsigned drop_logs;
  uv_timer_t heartbeat_timer;
  uv_signal_t sigint, sigterm;
};

/* Leave the cluster and close every handle; the loop ends when the last
 * borrowed job is done. Idempotent. */
void td__node_shutdown(td__node_t *n, const char *why);
/* The member is alive or suspect, and not us. */
bool td__node_reachable(td__node_t *n, uint64_t peer);

/* ---- ledger write queue (ledgerq.c) ------------------------------------------------
 * Records are queued on the loop thread and written by the work pool, one
 * transaction per batch, in order. Strings and blobs are copied (blob: taken). */

int td__ledgerq_open(td__ledgerq_t **out, uv_loop_t *loop, const char *path, char *why,
                     size_t why_len);
/* Writes what is still queued on the calling thread, then closes. */
void td__ledgerq_close(td__ledgerq_t **self_p);
void td__ledgerq_flush(td__ledgerq_t *q);
void td__ledgerq_stop(td__ledgerq_t *q); /* no new batches go to the pool */

/* While the ledger cannot be written (disk full, I/O error, ...) its rows are
 * kept in memory up to this many bytes; over it the oldest are dropped and
 * counted (ledgerq.c says which go first). */
#define TD__LEDGERQ_BUFFER_BYTES ((size_t)64 << 20)
void td__ledgerq_set_buffer(td__ledgerq_t *q, size_t bytes);

/* The queue's health, for status and metrics (loop thread). */
typedef struct {
  bool degraded;            /* the last write failed; rows are kept in memory */
  char cause[32];           /* "disk full", "I/O error", ...; "" when not degraded */
  char detail[256];         /* SQLite's code and message, the OS error */
  char causes[256];         /* this episode's causes with counts: "disk full: 37" */
  double since;             /* wall clock of the episode's first failure; NaN if none */
  uint64_t failed_writes;   /* failed attempts in this episode */
  uint64_t failures_total, episodes; /* since the daemon started */
  uint64_t pending_rows, pending_bytes, buffer_bytes;
  uint64_t dropped_rows;    /* over the bound, since start */
  uint64_t refused_rows;    /* rows SQLite refused for themselves, since start */
} td__ledgerq_stats_t;
void td__ledgerq_stats(const td__ledgerq_t *q, td__ledgerq_stats_t *out);
void td__ledger_run_start(td__ledgerq_t *q, uint64_t run_id, const char *spec_text);
void td__ledger_run_end(td__ledgerq_t *q, uint64_t run_id, const char *state,
                        double test_accuracy);
void td__ledger_peer(td__ledgerq_t *q, const td_member_t *m);
void td__ledger_round(td__ledgerq_t *q, const td_ledger_round_t *row);
/* The evaluation of a round whose row is already written (an evaluation that
 * finished rounds later, off the training path). */
void td__ledger_eval(td__ledgerq_t *q, uint64_t run_id, uint64_t round, double eval_acc,
                     double eval_bpb);
void td__ledger_update(td__ledgerq_t *q, const td_ledger_update_t *row, const char *codec);
void td__ledger_link(td__ledgerq_t *q, const td_ledger_link_t *row, const char *codec);
/* Takes `blob` (bytes) whatever happens. Once it is written, the run keeps its `keep` newest
 * checkpoints (0: all). */
void td__ledger_checkpoint(td__ledgerq_t *q, uint64_t run_id, uint64_t round, void *blob,
                           size_t bytes, unsigned keep);
/* model_keep.c: the run's last model, held (takes blob) and written at the
 * end of the session with its state and final metric; tensors as JSON
 * ([{"name", "shape", "offset"}], caller frees; NULL: out of memory). */
void td__model_hold(td__session_t *s, uint64_t round, float *blob);
void td__model_keep(td__node_t *n, td__session_t *s, const char *state, double metric);
char *td__layout_json(const td_layout_t *layout);
/* The run's model row (one per run, replaced): takes `blob` (bytes) whatever
 * happens; model and tensors (JSON) are copied. */
void td__ledger_model(td__ledgerq_t *q, uint64_t run_id, uint64_t round, const char *state,
                      double metric, const char *model, const char *tensors, void *blob,
                      size_t bytes);
void td__ledger_event(td__ledgerq_t *q, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Visit the known peers now, on this thread (start-up). */
void td__ledger_peers(td__ledgerq_t *q, td_ledger_peer_fn fn, void *user);
/* Mark the runs left 'running' interrupted, now, on this thread (start-up). */
int td__ledger_runs_interrupt(td__ledgerq_t *q, double at, td_ledger_run_fn fn, void *user);
/* Rounds of run_id (the last `last`, 0: all) from index `from` on, at most
 * `limit`, read on the work pool after every queued write. done() runs on the
 * loop thread with the rows as a JSON array (NULL when out of memory) and the
 * total row count; it owns json. */
typedef void (*td__rounds_done_fn)(char *json, uint64_t total, void *user);
int td__ledger_rounds_query(td__ledgerq_t *q, uint64_t run_id, unsigned last, uint64_t from,
                            uint64_t limit, td__rounds_done_fn done, void *user);

/* ---- transport (transport.c) -------------------------------------------------------- */

typedef enum { TD__ACK_UPDATE = 0, TD__ACK_CHUNK = 1 } td__ack_kind_t;

typedef struct {
  uint64_t bytes_sent, bytes_recv, send_drops;
  uint64_t update_wire_sent, update_dense_sent, update_wire_recv, update_dense_recv;
  const char *codec; /* of the last update sent; "-" before */
  double goodput_bps, ack_s, budget_bytes;
  double path_rtt_s; /* from heartbeat echoes; 0 until measured */
  td_linkq_stats_t q;
} td__link_stats_t;

/* uplink_bps > 0 paces the frames of every link queue (updates, snapshots)
 * to that many bits per second in total, like a shaped uplink. */
int td__transport_open(td__transport_t **out, td__node_t *n, const char *listen,
                       double link_delay_s, double uplink_bps, char *why, size_t why_len);
void td__transport_stop(td__transport_t *t); /* close its handles (shutdown) */
void td__transport_close(td__transport_t **self_p); /* after the loop ended */
const char *td__transport_endpoint(const td__transport_t *t);
void td__transport_tick(td__transport_t *t);
/* Drop every queued update and bulk frame (a new run starts). */
void td__transport_drop_run_traffic(td__transport_t *t);
size_t td__transport_count(const td__transport_t *t);
td__link_t *td__transport_at(td__transport_t *t, size_t i);
/* Uplink bytes/s: the measured goodput of the links to reachable members. */
double td__transport_uplink(td__transport_t *t);
/* Send on the control connection of every link to a reachable member. */
void td__transport_broadcast(td__transport_t *t, Traind__Envelope *env);

td__link_t *td__link_find(td__transport_t *t, uint64_t peer);
/* Close the link to `peer` (its key was revoked); its slot is reused. */
void td__link_close_peer(td__transport_t *t, uint64_t peer);
td__link_t *td__link_by_endpoint(td__transport_t *t, const char *endpoint);
/* The link to `peer` at `endpoint`, connected if new; NULL for ourselves,
 * when the table is full, or (secure) when peer's key is not admitted. A link
 * opened by endpoint alone (peer 0: insecure only) is adopted. */
td__link_t *td__link_ensure(td__transport_t *t, uint64_t peer, const char *endpoint);
uint64_t td__link_peer(const td__link_t *l);
/* Stamp (sender, seq) and send on the control connection. */
int td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env);
int td__link_send_ack(td__transport_t *t, uint64_t peer, uint64_t run_id, td__ack_kind_t kind,
                      uint64_t seq, uint64_t bytes);
/* Reserve `count` link sequence numbers for frames stamped later. */
uint64_t td__link_reserve(td__link_t *l, size_t count);
/* Queue a packed frame (taken) on the paced bulk connection. */
void td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len,
                    uint64_t seq);
void td__link_drop_class(td__link_t *l, td_prio_t prio);
/* The peer comes back into the run as a new process, or after a long pause:
 * frames in flight to it give their window back and queued updates and
 * snapshots (meant for what it was) are dropped. */
void td__link_restart(td__transport_t *t, td__link_t *l);
/* Hand the socket every frame the window allows now. */
void td__link_pump(td__transport_t *t, td__link_t *l);
void td__link_note_recv(td__link_t *l, uint64_t bytes);
void td__link_note_update_recv(td__link_t *l, uint64_t wire, uint64_t dense);
/* An update of `round` (wire bytes, dense bytes, codec) went into the queue. */
void td__link_note_update_sent(td__link_t *l, uint64_t round, uint64_t wire, uint64_t dense,
                               const char *codec);
/* Byte budget for this round's update (codec = auto) from the link's goodput. */
double td__link_fit_budget(td__link_t *l, uint64_t round, double compute_s, double min_s);
/* An ack of update `round`: true and the ledger row when it was one goodput sample. */
bool td__link_update_acked(td__link_t *l, uint64_t round, uint64_t bytes, td_ledger_link_t *row,
                           char *codec, size_t codec_len);
void td__link_chunk_acked(td__transport_t *t, td__link_t *l, uint64_t seq);
/* Heartbeat echo (path RTT): the fields our next heartbeat to the link's peer
 * carries (our clock, and the peer's last stamp with how long we held it),
 * and what the peer's heartbeat carried (any values: checked here). */
void td__link_echo_out(td__link_t *l, uint64_t *stamp_us, uint64_t *echo_us, uint64_t *hold_us);
void td__link_echo_in(td__link_t *l, uint64_t stamp_us, uint64_t echo_us, uint64_t hold_us);
void td__link_stats(td__link_t *l, td__link_stats_t *out);

/* ---- receiving (dispatch.c) -------------------------------------------------------- */

/* One envelope from the ROUTER (`bytes` on the wire), already validated. */
void td__dispatch(td__node_t *n, const Traind__Envelope *env, size_t bytes);

/* ---- gossip (gossip.c) ----------------------------------------------------------------- */

void td__gossip_hello(td__node_t *n, td__link_t *l);
void td__gossip_greet_known(td__node_t *n);
void td__gossip_tick(td__node_t *n);
void td__gossip_leave(td__node_t *n, const char *why);
/* Direct evidence that `peer` is alive (endpoint NULL: unchanged). */
void td__gossip_heard(td__node_t *n, uint64_t peer, const char *endpoint);
void td__on_hello(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_welcome(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_heartbeat(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_leave(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);

/* ---- the run session (session.c) ------------------------------------------------------- */

typedef enum {
  TD__RUN_IDLE = 0, TD__RUN_RUNNING, TD__RUN_FINISHED, TD__RUN_FAILED, TD__RUN_STOPPED
} td__run_state_t;
const char *td__run_state_name(td__run_state_t s);

/* What the compute thread reported for one of its rounds. */
typedef struct {
  uint64_t round, samples;
  double loss, compute_s, idle_s, lr, capacity, done_at;
  double fill_s;  /* overlap: extra steps while waiting (not in compute_s) */
  double uplink;  /* bytes/s, as sent with the round's update */
  unsigned batch, steps, fill_steps;
  double eval_acc;  /* test accuracy evaluated after the round, NAN until then */
  double eval_bpb;  /* text runs: held-out bits per byte after the round, NAN until then */
  bool row_written; /* its ledger row exists (row holds it) */
  td_ledger_round_t row;
} td__own_round_t;

/* What a member sent with its update of a round; 0: not reported. */
typedef struct {
  uint64_t round;
  double capacity, uplink;
} td__peer_report_t;

/* What the aggregation refused of one member's updates (rounds.c). */
typedef struct {
  uint64_t rejected; /* rounds its update was rejected: norm bound, or did not decode */
  uint64_t clipped;  /* ... scaled down (aggregate = clip:C) */
  uint64_t clamped;  /* ... claimed more samples than its batch plan gave it */
  uint64_t streak;   /* rounds in a row with one of those */
  bool suspect;      /* the streak reached TD__SUSPECT_ROUNDS once */
} td__outlier_t;
/* A member whose updates are refused this many rounds in a row is reported. */
#define TD__SUSPECT_ROUNDS 3

/* The session's core, shared by the run-side parts (rounds, outbox,
 * transfer, join, reconcile). Allocated when a run starts; freed when the
 * last reference goes: the node's at finish, and one per pool job that
 * borrows the run's buffers (td__session_ref). */
struct td__session {
  unsigned refs;
  td__node_t *node;
  td__run_state_t state; /* RUNNING until finish */
  td_run_t *run;
  uint64_t run_id;
  char *spec_text;
  td_runspec_t spec;
  uint64_t members[TD_MEMBERS_MAX];
  uint64_t since[TD_MEMBERS_MAX]; /* first round of each member (late joiners > 1;
                                     UINT64_MAX: it refused the run) */
  double since_at[TD_MEMBERS_MAX]; /* monotonic time since[] was set (0: the start) */
  bool away[TD_MEMBERS_MAX]; /* reachable but out of the run (comeback.c) until readmitted */
  uint64_t heard_round[TD_MEMBERS_MAX]; /* the round each member's last heartbeat in this
                                           run named (comeback.c) */
  size_t n_members;
  unsigned rank;
  uint64_t first_round; /* this node's first round (> 1: it joined late) */
  uint64_t round, rounds; /* open round (sync/overlap); rounds of the run */
  bool ready;
  td__own_round_t own[TD__RING];
  struct { /* an evaluation that came after its round left the ring (rounds.c) */
    uint64_t round; /* 0: none */
    double acc, bpb;
  } late_eval;
  uint64_t own_done;
  bool own_fresh; /* overlap: the last own round waited for its predecessor's average */
  double own_loss, lr, capacity, round_started, deadline;
  td__peer_report_t peer_report[TD_MEMBERS_MAX][TD__RING];
  unsigned plan[TD_MEMBERS_MAX]; /* current batch plan by member index (0: none) */
  unsigned plan_hist[TD__RING][TD_MEMBERS_MAX]; /* plan in force when round r closed */
  uint64_t plan_hist_round[TD__RING];           /* ... that r (by r % TD__RING) */
  td__outlier_t outlier[TD_MEMBERS_MAX];        /* by member index */
  uint64_t refused_round[TD_MEMBERS_MAX];       /* last round a member's update did not decode */
  td_round_t *collector;                 /* sync/overlap: every peer's update of a round */
  td_round_t *peer_inbox[TD_MEMBERS_MAX]; /* async: one collector per peer */
  uint64_t peer_round[TD_MEMBERS_MAX];    /* async: newest round received per peer */
  uint64_t bytes_sent_round, bytes_recv_round;
  bool closing; /* the open round's aggregation runs on the pool */
  double test_accuracy, test_loss, last_eval_acc;
  double test_bpb, last_eval_bpb; /* text runs (bits per byte); NAN otherwise */
  uint64_t updates_received, rounds_done, late_peers, plans_applied, stale_dropped;
  int64_t staleness[TD_MEMBERS_MAX]; /* of each member's last update; -1: none yet */
  char error[256];
  char refused[512]; /* "node ID refused: reason; ..." of members that will not run it */
  char backend[16];         /* the compute backend (cpu, cuda) once the run is ready */
  char backend_reason[256]; /* which backend and why: "cpu (auto: no usable GPU: ...)" */
  td__outbox_t *outbox;
  td__xfer_t *xfer;
  td__join_t *join;
  td__reconcile_t *recon;
  float *kept_model;   /* the model the run would keep now (model_keep.c), owned; NULL: none */
  uint64_t kept_round; /* ... the round it holds */
};

/* A snapshot of a run's figures, for status (kept after the run ended). */
typedef struct td__run_stats {
  uint64_t run_id;
  td__run_state_t state;
  uint64_t rounds_done, rounds, first_round;
  unsigned rank;
  size_t nodes;
  char codec[32];
  double loss, eval_accuracy, test_accuracy, test_loss, capacity;
  double eval_bpb, test_bpb; /* text runs: bits per byte instead of accuracy; NAN otherwise */
  uint64_t updates_received, late_peers, transfers, snapshots_served, joins_admitted;
  uint64_t reconciled, reconciled_partial, reconciled_via_hub, reconciled_as_hub;
  char error[256];
  char refused[512];
  char backend[16];         /* "" until the compute thread opened its backend */
  char backend_reason[256]; /* which backend and why (auto's choice) */
  char aggregate[64];   /* "trimmed:1, norm bound 5" */
  size_t n_outliers;    /* members with anything refused, and their counts */
  uint64_t outlier_id[TD_MEMBERS_MAX];
  td__outlier_t outliers[TD_MEMBERS_MAX];
} td__run_stats_t;

/* Start run `run_id` as one of `members`: a late joiner (first_round > 1)
 * fetches the model from `sponsor` first. The spec is checked against this
 * node's policy before anything is allocated. why says what went wrong. */
int td__session_start(td__node_t *n, uint64_t run_id, const char *spec_text,
                      const uint64_t *members, size_t n_members, uint64_t first_round,
                      uint64_t sponsor, char *why, size_t why_len);
/* This node will not run `run_id` (why): log it, record it in the ledger and
 * send RunRefused to every other one of `members`. */
void td__session_refuse(td__node_t *n, uint64_t run_id, const uint64_t *members,
                        size_t n_members, const char *why);
/* End the running session: ledger rows, stats kept, n->session = NULL. */
void td__session_finish(td__node_t *n, td__run_state_t state, double test_accuracy,
                        const char *error);
void td__session_ref(td__session_t *s);
void td__session_unref(td__session_t **s_p);
/* The running session if it is run_id, else NULL. */
td__session_t *td__session_of(td__node_t *n, uint64_t run_id);
/* Status figures: the running session's, or the last one's. */
void td__session_stats(td__node_t *n, td__run_stats_t *out);
/* The running run's id, or the last run's (0: none yet). */
uint64_t td__session_last_id(td__node_t *n);
/* Index of `peer` in the run's members, TD_MEMBERS_MAX when it is not one. */
size_t td__session_member(const td__session_t *s, uint64_t peer);
/* Reachable peers of the run (not us), taking part in `round` (0: any). */
size_t td__session_peers(td__session_t *s, uint64_t round, uint64_t *out);
/* Member index i is another node, reachable and in the run (neither away nor
 * refused) at `round` (0: any round). */
bool td__session_takes_part(td__session_t *s, size_t i, uint64_t round);
/* This node fell behind its run (comeback.c): end the session without ending
 * the run in the ledger, so the members take it back from their model. */
void td__session_abandon(td__node_t *n, const char *why);
/* Seed of the link codec between this node and `peer` (the same on both ends). */
uint64_t td__session_codec_seed(const td__session_t *s, uint64_t peer);
void td__session_note_sent(td__session_t *s, uint64_t bytes);
/* Staleness (rounds) of the last update the running run got from `peer`; NaN if none. */
double td__session_staleness(td__node_t *n, uint64_t peer);

/* ---- rounds (rounds.c) ------------------------------------------------------------------ */

void td__rounds_begin(td__session_t *s, uint64_t round);
void td__rounds_own_done(td__session_t *s, uint64_t round);
void td__rounds_try_close(td__session_t *s);
void td__rounds_forget_peer(td__session_t *s, uint64_t peer);
void td__rounds_tick(td__session_t *s);
void td__rounds_eval(td__session_t *s, uint64_t round, double accuracy, double bpb);
void td__on_update(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);

/* ---- outbox (outbox.c) ----------------------------------------------------------------- */

int td__outbox_open(td__outbox_t **out, td__session_t *s, const td_codec_spec_t *codec);
void td__outbox_close(td__outbox_t **self_p);
/* Open the link codec of member index `i` (a late joiner). */
int td__outbox_add_member(td__outbox_t *o, size_t i);
/* Member i comes back with a fresh decoder: its link codec (residual, warm
 * start) starts over before the next encode. */
void td__outbox_reset_member(td__outbox_t *o, size_t i);
/* Encode own round `round` for every peer on the pool, then queue it. */
void td__outbox_send(td__outbox_t *o, uint64_t round);
/* Every own round up to `round` is on its way. */
bool td__outbox_sent(const td__outbox_t *o, uint64_t round);
void td__outbox_skip_to(td__outbox_t *o, uint64_t round);
const char *td__outbox_codec(const td__outbox_t *o);
void td__on_ack(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);

/* ---- blob transfer and knowledge transfer (transfer.c) ------------------------------ */

int td__xfer_open(td__xfer_t **out, td__session_t *s);
void td__xfer_close(td__xfer_t **self_p);
/* Queue `blob` (total bytes) from `offset` as bulk SnapshotChunks on l, each
 * a copy of `tmpl` with its own slice; `supersede` drops what is still queued. */
void td__xfer_serve(td__session_t *s, td__link_t *l, const void *blob, uint64_t total,
                    uint64_t offset, const Traind__SnapshotChunk *tmpl, bool supersede);
void td__xfer_request(td__session_t *s, td__link_t *l, uint64_t round, uint64_t offset,
                      bool join, bool reconcile);
/* Late joiner: fetch the members' anchor of `round` (bytes) from `sponsor`. */
void td__xfer_fetch_seed(td__xfer_t *x, uint64_t sponsor, uint64_t round, uint64_t bytes);
void td__xfer_probe(td__session_t *s, td_run_event_t *ev);
void td__xfer_tick(td__session_t *s);
void td__xfer_stats(const td__xfer_t *x, td__run_stats_t *out);
void td__on_eval_report(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t b);
void td__on_snapshot_request(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                             size_t bytes);
void td__on_snapshot_chunk(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                           size_t bytes);

/* ---- late join (join.c) ------------------------------------------------------------------ */

int td__join_open(td__join_t **out, td__session_t *s);
void td__join_close(td__join_t **self_p);
void td__join_tick(td__session_t *s);
void td__join_anchor(td__session_t *s, td_run_event_t *ev);
/* A joiner asks for the anchor of rq->round: serve it or keep the request. */
void td__join_request(td__session_t *s, td__link_t *l, uint64_t peer,
                      const Traind__SnapshotRequest *rq);
void td__join_stats(const td__join_t *j, td__run_stats_t *out);
void td__on_run_start(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_run_stop(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);
void td__on_run_refused(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                        size_t bytes);

/* ---- coming back (comeback.c) ---------------------------------------------------------- */

/* Start-up: runs the ledger left running are marked interrupted; the newest
 * is the one this node asks to go back into. */
void td__comeback_start(td__node_t *n);
/* A heartbeat from `peer` says it runs run_id (0: none) at `round`. */
void td__comeback_heard(td__node_t *n, uint64_t peer, uint64_t run_id, uint64_t round);
/* This node was admitted into run_id from `round`: a gap event when it is the
 * run it fell out of. */
void td__comeback_rejoined(td__node_t *n, uint64_t run_id, uint64_t round);

/* ---- anchor reconciliation (reconcile.c) ------------------------------------------------ */

/* NULL in *out when the run does not reconcile. */
int td__reconcile_open(td__reconcile_t **out, td__session_t *s);
void td__reconcile_close(td__reconcile_t **self_p);
void td__reconcile_own(td__session_t *s, td_run_event_t *ev);
void td__reconcile_request(td__session_t *s, td__link_t *l, const Traind__SnapshotRequest *rq);
void td__reconcile_chunk(td__session_t *s, const Traind__Envelope *env);
void td__reconcile_tick(td__session_t *s);
void td__reconcile_stats(const td__reconcile_t *r, td__run_stats_t *out);

/* ---- control socket (control.c) and its JSON (status.c) -------------------------------- */

int td__control_open(td__control_t **out, td__node_t *n, char *why, size_t why_len);
void td__control_stop(td__control_t *c);
void td__control_close(td__control_t **self_p);
/* A welcome from `peer` answers a pending `trainctl join`. */
void td__control_welcome(td__control_t *c, uint64_t peer);

typedef struct json_object json_object;
json_object *td__status_json(td__node_t *n);
json_object *td__status_peers(td__node_t *n);
json_object *td__status_id(uint64_t id);
json_object *td__status_real(double v);

/* ---- monitoring (monitor.c): `traind --metrics HOST:PORT` ------------------------------ */

/* Serve the node's figures on host_port (daemon/metrics.h); TD_EIO when the
 * port is busy, with why. */
int td__monitor_open(td__monitor_t **out, td__node_t *n, const char *host_port, char *why,
                     size_t why_len);
/* Publish a fresh snapshot (heartbeat, closed round). NULL-safe. */
void td__monitor_publish(td__monitor_t *m);
/* Stop the server, then free the snapshots. NULL-safe. */
void td__monitor_close(td__monitor_t **self_p);

#endif
