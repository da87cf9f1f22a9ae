/* shared.h: what the parts of one run on the loop thread share, and the node
 * state they run in.
 *
 * daemon/session/ holds a run's life on the loop thread: session.c (start to
 * finish), core.c (the members, the running session, its reference count),
 * rounds.c (closing rounds), inbox.c (the members' updates coming in),
 * capacity.c (the batch plan), deadline.c (the adaptive round deadline),
 * outbox.c (encoding our updates),
 * transfer.c (resumable blob transfer and knowledge transfer), join.c (late
 * join), reconcile.c (anchor reconciliation), verify.c (model-state
 * agreement: the members compare state hashes, one that differs is
 * repaired), snapshots.c (which of those a snapshot message is for),
 * comeback.c (members that fall out of a run and come back into it), model_keep.c (the model a run leaves in the
 * ledger) and policy.c (this node's limits over run specs). The session's
 * core (members, rounds, the own-round ring) is shared
 * by these parts; their own state (the outbox, the transfer, the join, the
 * reconciliation) is opaque and reached only through the calls declared
 * here. They use the layers below (run/, net/, store/, base/) and never the
 * node's own files above them (daemon/internal.h): the monitor hears of
 * closed rounds through the node's listener. Everything here runs on the
 * loop thread unless it says otherwise. */
#ifndef TD_DAEMON_SESSION_SHARED_H
#define TD_DAEMON_SESSION_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "compress/codec.h"
#include "daemon/base/clock.h"
#include "daemon/base/members.h"
#include "daemon/net/keys.h"
#include "daemon/net/net.h"
#include "daemon/run/run.h"
#include "daemon/run/runspec.h"
#include "daemon/store/ledger.h"
#include "daemon/store/ledgerq.h"
#include "proto/wire.h"
#include "scheduler/round.h"

/* Own rounds (and peers' reports) kept, indexed by round % TD__RING. */
#define TD__RING 4
/* Timeouts, seconds (monotonic). */
#define TD__RECON_STALL_S 3.0  /* a reconciliation message that stops growing is asked again */
#define TD__JOIN_STALL_S 3.0   /* a late-join seed that stops growing is asked again */
#define TD__XFER_STALL_S 10.0  /* a knowledge-transfer model that stops growing */
/* Late join: the admitter starts the joiner at its open round + this. */
#define TD__JOIN_LEAD_ROUNDS 3
/* Coming back (comeback.c): a member whose heartbeats put it more than this
 * many rounds behind the run has fallen out of it (members of a sync or
 * overlap run are at most two rounds apart, a joiner three ahead). */
#define TD__BEHIND_ROUNDS 4
/* ...judged only from heartbeats this many periods after it was (re)admitted,
 * so one sent before it heard of the run does not count. */
#define TD__AWAY_GRACE_BEATS 2
/* ...and a member marked away more than this many times in a row with no
 * update of its own in between is put out of the run for its remainder (it
 * says it is idle and never trains); one that comes back and trains, as a
 * restarted node does, starts the count over. */
#define TD__AWAY_TIMES_MAX 3
/* Snapshot serving (transfer.c): a member is served at most this many copies
 * of the newest version of each kind of blob (model, reconciliation message,
 * hub mean, state for a repair); more is counted as a duplicate request. */
#define TD__SERVE_COPIES 3
#define TD__SERVE_KINDS 4
/* round_deadline = adaptive: the arrival times it takes the median and MAD of
 * (the newest), and how many it needs before it replaces round_timeout. */
#define TD__ARRIVALS 64
#define TD__ARRIVALS_MIN 8
typedef struct td__node td__node_t;
typedef struct td__session td__session_t;
typedef struct td__outbox td__outbox_t;
typedef struct td__xfer td__xfer_t;
typedef struct td__join td__join_t;
typedef struct td__reconcile td__reconcile_t;
typedef struct td__verify td__verify_t;
typedef struct td__backfill td__backfill_t;
typedef struct td__control td__control_t;
/* A coordinator's RoundClose, kept for its round (roundclose.c). */
typedef struct {
  uint64_t round, members; /* round 0: none */
  uint64_t from;           /* the coordinator that closed the round */
  uint8_t sig[64];         /* its signature (secure runs), to forward */
  bool has_sig;
  uint64_t asked;          /* the round this node last asked the others for it */
  uint64_t served;         /* members it was forwarded to (bit: member index) */
  /* runs whose updates are the same bytes for all: the digest of each update
   * averaged (td__backfill_digest), by member index, and the coordinator's
   * signature of them */
  bool has_digests;
  uint8_t digests[64][32];
  uint8_t digests_sig[64];
} td__round_close_t;
/* A set a round averaged (here, or at a member that echoed it), its
 * coordinator and the coordinator's signature of it (roundclose.c) */
typedef struct {
  uint64_t round, members, by; /* round 0: none */
  bool has_sig;
  uint8_t sig[64];
} td__set_note_t;
typedef struct td__monitor td__monitor_t;

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
  const char *data_dir;  /* the node's own: its ledger, and the models init = RUN writes out */
} td__policy_opts_t;

typedef struct {
  uint64_t max_bytes;
  uint64_t max_checkpoint_bytes; /* a run's checkpoints held in the ledger at once */
  unsigned max_batch, max_threads, max_rounds;
  char data_root[4096]; /* realpath of --data-root; "" = none */
  char data_dir[4096];  /* the node's data directory; "": no ledger (init = RUN refused) */
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
/* init = RUN[:ROUND]: the model the ledger in data_dir keeps of that run (or
 * that round's checkpoint), written out as data_dir/models/RUN-rROUND.safetensors
 * with metadata that depends on the weights alone (model, run, round), so
 * that nodes holding the same weights hold byte-identical files and the
 * init_hash check of init = FILE applies; spec->init becomes that path.
 * Nothing happens for another init. 0, or TD_ENOENT / TD_ESHAPE / TD_EIO + why. */
int td__policy_init_from_run(const char *data_dir, td_runspec_t *spec, char *why, size_t why_len);
/* ---- the node's shared state (node.c owns it) -------------------------------------- *
 * The parts of this layer and the ones above take the node as their context;
 * the node's own parts (control socket, monitor) are opaque to them. */

typedef struct {
  void (*fn)(void *user);
  void *user;
} td__listener_t;

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
  td__backfill_t *retired; /* the last run's updates and closes, kept a while after it ended
                              for members still closing its last round (backfill.c) */
  uint64_t ended_run;     /* the last run that ended here (heartbeats say so); 0: none */
  unsigned regreet_ticks; /* --listen none: heartbeats since the last re-greeting */
  unsigned redial_ticks;  /* heartbeats since the dead members' links were dialed again */
  td__control_t *control;
  td__monitor_t *monitor; /* --metrics; NULL when off */
  struct {                /* since the daemon started, every run (monitoring) */
    uint64_t rounds, samples;
    double compute_s, wait_s;
  } totals;
  td__drops_t drops;
  /* Set by the node's own files for the ones beside them, so that none calls
   * another by name in a circle: */
  void (*shutdown)(td__node_t *n, const char *why); /* node.c: leave, close */
  void (*welcomed)(td__control_t *c, uint64_t peer); /* control_admit.c's: answers `join` */
  void (*join_refused)(td__control_t *c, uint64_t peer, const char *reason); /* ...fails it */
  td__listener_t figures_changed; /* a round closed, a heartbeat: the monitor's feed */
  uv_timer_t heartbeat_timer;
  uv_timer_t round_timer; /* rounds.c arms it for a sync round's adaptive deadline */
  uv_signal_t sigint, sigterm;
};

/* Tell the listener that the node's figures changed (NULL-safe if none). */
static inline void td__node_figures_changed(td__node_t *n) {
  if (n->figures_changed.fn != NULL)
    n->figures_changed.fn(n->figures_changed.user);
}

/* ---- the run session (session.c) ------------------------------------------------------- */

/* MISSED: the run ended on its other members while this node was away (a
 * pause, a suspended machine) before it trained a round of it. */
typedef enum {
  TD__RUN_IDLE = 0, TD__RUN_RUNNING, TD__RUN_FINISHED, TD__RUN_FAILED, TD__RUN_STOPPED,
  TD__RUN_MISSED
} td__run_state_t;
const char *td__run_state_name(td__run_state_t s);

/* What the compute thread reported for one of its rounds. */
typedef struct {
  uint64_t round, samples;
  double loss, compute_s, idle_s, lr, capacity, done_at;
  double fill_s;  /* overlap: extra steps while waiting (not in compute_s) */
  double uplink;  /* bytes/s, as sent with the round's update */
  double heard[TD_MEMBERS_MAX]; /* capacities of round - 1 echoed with the update (by rank) */
  unsigned batch, steps, fill_steps;
  double eval_acc;  /* test accuracy evaluated after the round, NAN until then */
  double eval_bpb;  /* text runs: held-out bits per byte after the round, NAN until then */
  bool row_written; /* its ledger row exists (row holds it) */
  td_ledger_round_t row; /* its members point into members_text */
  char members_text[TD_LEDGER_MEMBERS_TEXT];
} td__own_round_t;

/* What a member sent with its update of a round; 0: not reported. heard:
 * the capacities of round - 1 it echoed, by member rank (agreed capacities,
 * capacity.c). */
typedef struct {
  uint64_t round;
  double capacity, uplink;
  double heard[TD_MAX_RUN_MEMBERS];
} td__peer_report_t;

/* What the aggregation refused of one member's updates (rounds.c). */
typedef struct {
  uint64_t rejected; /* rounds its update was rejected: norm bound, or did not decode */
  uint64_t clipped;  /* ... scaled down (aggregate = clip:C) */
  uint64_t clamped;  /* ... claimed more samples than its batch plan gave it */
  uint64_t mismatched; /* rounds the members heard different capacities from it */
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
  void (*destroy)(td__session_t *s); /* session.c's: frees the parts with the last reference */
  void (*on_round_open)(td__session_t *s); /* join.c's (session.c sets it): rounds.c calls it
                                            once a round is open */
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
  bool refused_by[TD_MEMBERS_MAX]; /* it refused the run (RunRefused, not for an end): its
                                      own end later says nothing about the run's */
  bool away[TD_MEMBERS_MAX]; /* reachable but out of the run (comeback.c) until readmitted */
  unsigned away_times[TD_MEMBERS_MAX]; /* times each member was marked away since its last
                                          update (comeback.c; inbox.c resets it) */
  bool out[TD_MEMBERS_MAX]; /* away too often: out for the rest of the run, never readmitted */
  /* the round (+ 1; 0: never) in which each member was last admitted or
   * readmitted here: at most one admission per member and round (join.c) */
  uint64_t admitted_in[TD_MEMBERS_MAX];
  uint64_t admissions_refused; /* admissions the rule refused in this run (join.c) */
  uint64_t recorded_round[TD_MEMBERS_MAX]; /* newest round of each member's with an update
                                              row (inbox.c): one row per member and round */
  uint64_t recorded_mask[TD_MEMBERS_MAX]; /* bit k: round recorded_round - k has its row */
  uint64_t heard_round[TD_MEMBERS_MAX]; /* the round each member's last heartbeat in this
                                           run named (comeback.c) */
  size_t n_members;
  unsigned rank;
  uint64_t first_round; /* this node's first round (> 1: it joined late) */
  uint64_t round, rounds; /* open round (sync/overlap); rounds of the run */
  bool round_all; /* the open round is the mesh: every member's update in the average
                     (td__session_partners); else equal weights over the round's partners */
  bool ready;
  bool unannounced; /* started here, RunStart not sent yet (control_run.c): a failure
                       before READY refuses to nobody */
  td__own_round_t own[TD__RING];
  struct { /* an evaluation that came after its round left the ring (rounds.c) */
    uint64_t round; /* 0: none */
    double acc, bpb;
  } late_eval;
  uint64_t own_done;
  bool own_fresh; /* overlap: the last own round waited for its predecessor's average */
  double own_loss, lr, capacity, round_started, deadline;
  /* by member index: a run has at most TD_MAX_RUN_MEMBERS (td__session_start),
   * and each report echoes as many, so this is sized by the run, not the cluster */
  td__peer_report_t peer_report[TD_MAX_RUN_MEMBERS][TD__RING];
  unsigned plan[TD_MEMBERS_MAX]; /* current batch plan by member index (0: none) */
  unsigned plan_hist[TD__RING][TD_MEMBERS_MAX]; /* plan in force when round r closed */
  uint64_t plan_hist_round[TD__RING];           /* ... that r (by r % TD__RING) */
  /* a late join's (or comeback's) plan, the even split over the new member
   * list: it bounds the weights of rounds from plan_join_from on (0: none
   * pending). Members take the admission in at different rounds of theirs,
   * so it replaces `plan` only when that round closes, the same on all. */
  unsigned plan_join[TD_MEMBERS_MAX];
  uint64_t plan_join_from;
  td__outlier_t outlier[TD_MEMBERS_MAX];        /* by member index */
  uint64_t refused_round[TD_MEMBERS_MAX];       /* last round a member's update did not decode */
  /* History of who trained (bit i: member i, whose rank and data partition
   * are i): every round's row records its members; a run that ends with a
   * partition no round trained says so. heard: async updates since the last
   * row. */
  uint64_t trained, heard;
  bool ended_by[TD_MEMBERS_MAX]; /* the member says it already ended this run */
  bool missed;                   /* stopping because the run ended elsewhere */
  bool finish_pending;           /* FINISHED came while the last round's state vote was
                                    open: the run ends once it is decided (verify.c) */
  bool checkpoint_out;           /* the compute thread waits for this checkpoint's write */
  td_round_t *collector;                 /* sync/overlap: every peer's update of a round */
  td_round_t *peer_inbox[TD_MEMBERS_MAX]; /* async: one collector per peer */
  uint64_t peer_round[TD_MEMBERS_MAX];    /* async: newest round received per peer */
  uint64_t bytes_sent_mark;  /* the transport's run bytes sent when this round began */
  uint64_t bytes_recv_round; /* update bytes received that counted for this round */
  uint64_t row_round;        /* the newest round whose row was written (0: none yet)... */
  uint64_t row_bytes_sent, row_bytes_recv; /* ...and the bytes it recorded */
  unsigned row_mixed;    /* ...the updates in its average (own included) */
  double row_consensus;  /* ...its consensus distance (NaN: none) */
  bool closing; /* the open round's aggregation runs on the pool */
  /* Client sampling and stragglers (rounds.c; sync mode): */
  uint64_t sample;     /* members sampled for the open round (bit i: member i) */
  bool sample_deferred; /* the open round began before READY, when its sample could not
                           be drawn (virtual clients not listed yet, or a run sized by
                           epochs whose rounds were not known); drawn at READY */
  bool round_cut;      /* min_updates or the adaptive deadline closed the open round's list:
                          the missing were cut, and it may close without our own update */
  double round_begun;  /* monotonic time the open round began here */
  double arrival_s[TD__ARRIVALS]; /* recent peer updates' arrival times into their rounds */
  size_t arrivals;                /* how many arrived in all (the ring holds the newest) */
  uint64_t cut_peers;             /* sampled updates cut by min_updates */
  uint64_t sent_once;             /* members with an update (a chunk) in this run (bit i) */
  bool own_sent_once;             /* this node sent an update of this run (the others then
                                     cut it when it straggles; until then they wait for it) */
  bool round_cut_any;             /* some round was cut (a straggler's own row may precede it) */
  /* The coordinator's sets (roundclose.c), by round; and the open round's
   * (bit i: member i; 0: none taken yet), which its average keeps to */
  td__round_close_t closes[TD__RING];
  td__set_note_t applied[TD__RING]; /* the set each round averaged here, by round */
  td__set_note_t echoes[TD_MEMBERS_MAX]; /* each member's last echo of a round this node had
                                            not closed yet when it came */
  uint64_t false_echoes; /* echoes of another set without its coordinator's signature */
  uint64_t close_waiters_round, close_waiters; /* members that asked for that round's close
                                                  before it came here (bit i: member i) */
  uint64_t round_set;
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
  td__verify_t *verify;
  td__backfill_t *backfill;
  float *kept_model;   /* the model the run would keep now (model_keep.c), owned; NULL: none */
  uint64_t kept_round; /* ... the round it holds */
};

/* Model-state agreement (verify.c): the last round the members voted on. */
typedef struct {
  unsigned every;          /* verify_every (0: only on trainctl verify) */
  char off[192];           /* why the run cannot be verified ("" when it can) */
  uint64_t round;          /* the last round decided (0: none yet) */
  size_t members, answered, agree; /* the round's members, hashes in, holders of the agreed */
  char hash[17];           /* the agreed state hash, first 8 bytes in hex; "": no majority */
  size_t n_diverged;       /* members whose hash differed from the agreed one */
  uint64_t diverged[TD_MEMBERS_MAX];
  uint64_t checks, disagreements, splits, repairs; /* rounds decided, members that differed,
                                                       rounds with no majority, own repairs */
  uint64_t repairing;      /* the round this node's repair waits for (0: none) */
} td__verify_stats_t;

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
  uint64_t cut_peers; /* sampled updates cut by min_updates */
  uint64_t reconciled, reconciled_partial, reconciled_via_hub, reconciled_as_hub;
  uint64_t row_round, row_bytes_sent, row_bytes_recv; /* the newest round's row (0: none) */
  unsigned row_mixed;  /* ... how many members' updates its average held, own included */
  double row_consensus; /* ... and its consensus distance (gossip, groups; NaN: none) */
  char topology[32];    /* the run key as given (mesh, gossip:K, groups:M, auto) */
  char error[256];
  char refused[512];
  char untrained[256];      /* partitions (ranks) no round trained: "2 (node ID)"; "" */
  char backend[16];         /* "" until the compute thread opened its backend */
  char backend_reason[256]; /* which backend and why (auto's choice) */
  char aggregate[64];   /* "trimmed:1, norm bound 5" */
  size_t n_outliers;    /* members with anything refused, and their counts */
  uint64_t outlier_id[TD_MEMBERS_MAX];
  td__outlier_t outliers[TD_MEMBERS_MAX];
  td__verify_stats_t verify;
} td__run_stats_t;

/* Start run `run_id` as one of `members`: a late joiner (first_round > 1)
 * fetches the model from `sponsor` first. The spec is checked against this
 * node's policy before anything is allocated. why says what went wrong.
 * `held`: the run is started here before the members hear of it (control_run.c):
 * it is unannounced and its first round waits for td_run_go(). */
int td__session_start(td__node_t *n, uint64_t run_id, const char *spec_text,
                      const uint64_t *members, size_t n_members, uint64_t first_round,
                      uint64_t sponsor, bool held, char *why, size_t why_len);
/* The run finished while its last round's state vote was still open
 * (finish_pending): end it once the vote is decided. Call after anything
 * that can decide a vote (a state hash, the heartbeat's timeouts). */
void td__session_settle(td__node_t *n);
/* A peer's StateHash: the vote (verify.c), then td__session_settle(). */
void td__session_on_state_hash(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                               size_t bytes);
/* A peer's RoundClose (rounds.c): kept for its round (roundclose.c), then
 * the open round tries to close. */
void td__session_on_round_close(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                                size_t bytes);
/* This node will not run `run_id` (why): log it, record it in the ledger and
 * send RunRefused to every other one of `members`. */
void td__session_refuse(td__node_t *n, uint64_t run_id, const uint64_t *members,
                        size_t n_members, const char *why);
/* End the running session: ledger rows, stats kept, n->session = NULL. */
void td__session_finish(td__node_t *n, td__run_state_t state, double test_accuracy,
                        const char *error);
void td__session_ref(td__session_t *s);
void td__session_unref(td__session_t **s_p);
/* Member `peer` says it already ended our run (its heartbeat, or its refusal
 * to be taken back into it): it is never taken back into it. When this node
 * has trained no round of the run (it slept through its start), the member
 * is not waited for, and once most of the other members say so the run is
 * missed: stopped here and recorded so. */
void td__session_heard_end(td__node_t *n, uint64_t peer);
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
/* Of the peers td__session_peers gives for `round`, those this node
 * exchanges with under the run's topology (scheduler/topology.h): with
 * `sends` those it sends its update to, otherwise those whose updates it
 * mixes. Positions are the members that joined by `round` (away ones
 * included) in rank order; the run's last round is the mesh. The mesh keeps
 * every peer. Returns how many are left in out; *all (may be NULL): whether
 * the round is the mesh (every member's update in every average). */
size_t td__session_partners(td__session_t *s, uint64_t round, bool sends, uint64_t *out,
                            bool *all);
/* Send env to every member taking part (td__session_peers at any round)
 * that has a link; env stays the caller's. */
void td__session_send_all(td__session_t *s, Traind__Envelope *env);
/* Member index i is another node, reachable and in the run (neither away nor
 * refused) at `round` (0: any round). */
bool td__session_takes_part(td__session_t *s, size_t i, uint64_t round);
/* This node fell behind its run (comeback.c): end the session without ending
 * the run in the ledger, so the members take it back from their model. */
void td__session_abandon(td__node_t *n, const char *why);
/* Seed of the link codec between this node and `peer` (the same on both ends). */
uint64_t td__session_codec_seed(const td__session_t *s, uint64_t peer);
/* This node was admitted into run_id from `round`: a gap event when it is the
 * run it fell out of (n->rejoin, which comeback.c set at start-up). */
void td__session_rejoined(td__node_t *n, uint64_t run_id, uint64_t round);
/* Staleness (rounds) of the last update the running run got from `peer`; NaN if none. */
double td__session_staleness(td__node_t *n, uint64_t peer);
/* ---- rounds (rounds.c, capacity.c, deadline.c, inbox.c) --------------------------------- */

void td__rounds_begin(td__session_t *s, uint64_t round);
/* The sample of a round begun before READY (s->sample_deferred), once the
 * compute thread has listed the clients (td_run_sample_clients) and the
 * rounds are known; the members outside it are no longer waited for. */
void td__rounds_sample_ready(td__session_t *s);
void td__rounds_own_done(td__session_t *s, uint64_t round);
/* Fills heard[i] (i < n_members) with the capacity member i sent with its
 * update of round - 1 as this node holds it (its own for itself), 0 where
 * unknown: what this node echoes with its update of `round`. */
void td__rounds_heard(const td__session_t *s, uint64_t round, double *heard);
void td__rounds_try_close(td__session_t *s);

/* ---- roundclose.c: the round's contributors, agreed through a coordinator ---- */

/* The fewest members a close of `round` may name: under a robust rule
 * enough to outvote one bad member (trimmed:B 2B + 1; median, clip and a
 * norm bound 3), never more than a majority of the round's sampled members
 * that take part in this node's view (this node counted), nor more than
 * min_updates; plain mean: 1. A coordinator cuts no straggler below it; a
 * member puts out the coordinator of a signed close under it. */
unsigned td__roundclose_floor(td__session_t *s, uint64_t round);
/* Whether the run's rounds close on the coordinator's set (sync runs of
 * more than one member that tolerate stragglers). */
bool td__roundclose_coordinated(const td__session_t *s);
/* The least a member waits for what it asked of the others (a round's close,
 * an update of its set) before it closes without it: closing without it parts
 * the models, so a loaded machine's slow answer must not (seconds). */
#define TD__ASK_WAIT_MIN_S 10.0
/* How long past its fixed deadline a member that follows the coordinator
 * waits for its set: round_timeout, and at least TD__ASK_WAIT_MIN_S, when
 * the coordinator itself cuts only at that deadline (robust runs without
 * min_updates or an adaptive deadline), so a set sent at it is not missed;
 * 0 otherwise. */
double td__roundclose_grace_s(const td__session_t *s);
/* Whether this node is the coordinator now (see roundclose.c). */
bool td__roundclose_coordinates(td__session_t *s);
/* A peer's RoundClose for run session s (NULL: none here): checked (see
 * roundclose.c; a refusal is a counted drop) and kept for its round. True
 * when kept: the open round may then close (rounds.c). */
bool td__roundclose_take(td__node_t *n, td__session_t *s, const Traind__Envelope *env);
/* The coordinator's set for `round` into *members; false when none came. */
bool td__roundclose_agreed(const td__session_t *s, uint64_t round, uint64_t *members);
/* The same, with the coordinator that sent it into *from. */
bool td__roundclose_agreed_by(const td__session_t *s, uint64_t round, uint64_t *members,
                              uint64_t *from);
/* Send RoundClose{round, members} to every member taking part (signed in
 * secure runs), and keep it to forward. digests (by member index; NULL:
 * none): the digest of each update averaged, named in the close, signed,
 * in secure runs. */
void td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members,
                         const uint8_t (*digests)[32]);
/* A member that follows the coordinator and has no set for the open round
 * while the others moved on (or its deadline passed) asks every other member
 * for a copy of it, once a round. */
void td__roundclose_ask(td__session_t *s);
/* A member's UpdateRequest for `round`'s close: the signed copy this node
 * took (or sent), once per asker and round, on link l. */
void td__roundclose_serve(td__session_t *s, size_t asker, uint64_t round, td__link_t *l);
/* Round `round` closed here on `members`, the set of coordinator `by` (0, 0:
 * on what came, without one); echoed with the next round's update, with the
 * coordinator's signature of it. Echoes of that round kept from members
 * whose updates came first are checked now (td__roundclose_check_echo). */
void td__roundclose_applied(td__session_t *s, uint64_t round, uint64_t members, uint64_t by);
/* What td__roundclose_applied noted for `round`; false when nothing. *sig:
 * the coordinator's signature of it (borrowed from s), NULL when unsigned. */
bool td__roundclose_applied_of(const td__session_t *s, uint64_t round, uint64_t *members,
                               uint64_t *by, const uint8_t **sig);
/* Member mi says it averaged `members`, the set of coordinator `by`, for
 * `round` (its next update's echo), with by's signature of it (sig_len
 * bytes): when this node averaged another set of the same coordinator and
 * the signature holds, that coordinator signed two sets for one round. It is
 * put out of the run (logged, a close_mismatch event) and no longer
 * coordinates (secure runs only: elsewhere a close proves nothing). An echo
 * without a valid signature proves nothing and is dropped, so no member can
 * put a coordinator out by saying so. An echo of a round this node has not
 * closed yet is kept and checked when it does. */
void td__roundclose_check_echo(td__session_t *s, size_t mi, uint64_t round, uint64_t members,
                               uint64_t by, const uint8_t *sig, size_t sig_len);
/* The digest of member mi's update that `round`'s close names (borrowed from
 * s); NULL when the close holds none (no close, or one without digests). */
const uint8_t *td__roundclose_digest_of(const td__session_t *s, uint64_t round, size_t mi);
/* Send the close c of run run_id, as this node holds it, on link l. */
void td__roundclose_forward(td__node_t *n, uint64_t run_id, const td__round_close_t *c,
                            td__link_t *l);

/* ---- backfill.c: an update of the coordinator's set that has not come ---------- */

#define TD__BACKFILL_DIGEST 32
/* What an update's origin signs (BLAKE2b-256, see proto/traind.proto). */
void td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                         const uint8_t *msg, size_t len, uint8_t out[TD__BACKFILL_DIGEST]);
int td__backfill_open(td__backfill_t **out);
void td__backfill_close(td__backfill_t **self_p);
/* Whether the run keeps, signs and forwards updates: it has a coordinator. */
bool td__backfill_on(const td__session_t *s);
/* The key this node signs its updates with (borrowed), NULL when they are
 * not signed (no coordinator, or insecure). */
const td__admission_t *td__backfill_signer(td__session_t *s);
/* Chunk 0 of member mi's update of `round` carried this signature. */
void td__backfill_note_signature(td__session_t *s, size_t mi, uint64_t round,
                                 const uint8_t *sig, size_t len);
#define TD__BACKFILL_SIG 64
#define TD__BACKFILL_KEY 32
/* What proves member mi's update of `round` (secure runs): the signature its
 * chunk 0 carried and the member's signing key; false when either is missing. */
bool td__backfill_proof(td__session_t *s, size_t mi, uint64_t round,
                        uint8_t sig[TD__BACKFILL_SIG], uint8_t key[TD__BACKFILL_KEY]);
/* Whether sig is origin's signature of that update (any thread); the digest
 * it signs (td__backfill_digest) into digest_out unless NULL. */
bool td__backfill_verify(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                         const uint8_t *msg, size_t len, const uint8_t sig[TD__BACKFILL_SIG],
                         const uint8_t key[TD__BACKFILL_KEY],
                         uint8_t digest_out[TD__BACKFILL_DIGEST]);
/* A forwarded copy of member mi's update failed its signature: logged, counted. */
void td__backfill_note_forged(td__session_t *s, size_t mi, uint64_t round);
/* The digest of member mi's update of `round` that this node holds (this
 * node's own included), noted when it decoded (signed runs only). */
void td__backfill_note_digest(td__session_t *s, size_t mi, uint64_t round,
                              const uint8_t digest[TD__BACKFILL_DIGEST]);
/* Copies what td__backfill_note_digest noted into out; false when nothing. */
bool td__backfill_digest_of(const td__session_t *s, size_t mi, uint64_t round,
                            uint8_t out[TD__BACKFILL_DIGEST]);
/* The digests of the updates of `round` of every member of `members` (bit:
 * member index) into out, by member index; false when one is not held. */
bool td__backfill_digests_of(const td__session_t *s, uint64_t round, uint64_t members,
                             uint8_t out[64][TD__BACKFILL_DIGEST]);
/* A member that follows the coordinator's set for the open round drops each
 * update it holds whose digest is not the one the set names (a member that
 * signed two updates for one round, each sent to some members): the copy
 * the coordinator averaged is then asked for at once (td__backfill_ask),
 * so every member averages the same updates. Logged, an update_mismatch
 * event, counted. */
void td__backfill_match_set(td__session_t *s);
/* Keep member mi's decoded update of `round` to forward: takes *msg
 * (set to NULL) when kept; otherwise it stays the caller's. */
void td__backfill_keep(td__session_t *s, size_t mi, uint64_t round, uint64_t samples,
                       double loss, uint8_t **msg, size_t len);
/* A peer's UpdateRequest: answered once per asker, member and round. */
void td__session_on_update_request(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                                   size_t bytes);
/* The open round's updates of the coordinator's set that have not come are
 * asked of a member that holds them: with `all`, every one (the deadline
 * passed); otherwise those of which nothing came (withheld, or lost). */
void td__backfill_ask(td__session_t *s, bool all);
/* Whether asks of the open round are still waited for (a further
 * round_timeout from the first). */
bool td__backfill_waiting(td__session_t *s);
/* A chunk with an origin other than its sender: the origin's member index
 * when it answers this node's ask, TD_MEMBERS_MAX otherwise. */
size_t td__backfill_take_chunk(td__session_t *s, uint64_t sender, const Traind__UpdateChunk *up);
/* Whether member mi's update of `round` was asked of another member (its
 * own chunks are then not taken: the copy asked for comes instead). */
bool td__backfill_asked_elsewhere(const td__session_t *s, size_t mi, uint64_t round);
/* A forwarded update of member mi was taken: logged and in the ledger. */
void td__backfill_note_taken(td__session_t *s, size_t mi, uint64_t round);
/* The run of s ends here: what it keeps to forward moves to n->retired (the
 * one before is freed), to answer the members that still close its last
 * round for a while (twice round_timeout and TD__ASK_WAIT_MIN_S). */
void td__backfill_retire(td__node_t *n, td__session_t *s);

void td__rounds_forget_peer(td__session_t *s, uint64_t peer);
void td__rounds_tick(td__session_t *s);
void td__rounds_eval(td__session_t *s, uint64_t round, double accuracy, double bpb);
/* async: let the compute thread go up to the slowest member's newest round. */
void td__rounds_async_release(td__session_t *s);
/* The batch plan from capacity.c: revised with the capacities of `round`,
 * own share applied from round `from` on. */
void td__rounds_replan(td__session_t *s, uint64_t round, uint64_t from);
/* deadline.c: note a peer update's arrival time into the open round; the
 * adaptive deadline (s from the round's start, 0: none yet) they make. */
void td__rounds_note_arrival(td__session_t *s);
double td__rounds_adaptive_deadline_s(const td__session_t *s);
/* inbox.c: one chunk of a peer's update. */
void td__on_update(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);

/* ---- outbox (outbox.c) ----------------------------------------------------------------- */

/* `sent` is told each time an own update is on its way (session.c gives it
 * td__rounds_try_close), so the outbox never calls the rounds by name. */
int td__outbox_open(td__outbox_t **out, td__session_t *s, const td_codec_spec_t *codec,
                    void (*sent)(td__session_t *s));
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
/* Whether every member gets the same bytes of this node's update (codec none
 * or fp16, not auto): a digest of one copy then names them all. */
bool td__outbox_same_bytes(const td__outbox_t *o);
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
/* The compute thread scored a fetched model (TD_RUN_MERGE): count, log and
 * record whether it was merged. */
void td__xfer_merged(td__session_t *s, const td_run_event_t *ev);
void td__xfer_tick(td__session_t *s);
void td__xfer_stats(const td__xfer_t *x, td__run_stats_t *out);
void td__on_eval_report(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t b);
/* A request for our probed model (member: its sender is one of the run's). */
void td__xfer_on_request(td__session_t *s, bool member, const Traind__SnapshotRequest *rq,
                         td__link_t *l, td__drops_t *drops);
/* A chunk of the blob being fetched (s: NULL when not our run). */
void td__xfer_on_chunk(td__session_t *s, uint64_t sender, const Traind__SnapshotChunk *ch,
                       td__drops_t *drops);

/* ---- snapshot messages (snapshots.c): to join, reconcile or transfer ---------------- */

void td__on_snapshot_request(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                             size_t bytes);
void td__on_snapshot_chunk(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                           size_t bytes);

/* ---- late join (join.c) ------------------------------------------------------------------ */

int td__join_open(td__join_t **out, td__session_t *s);
void td__join_close(td__join_t **self_p);
void td__join_tick(td__session_t *s);
void td__join_round_begun(td__session_t *s);
/* comeback.c heard member mi's heartbeat: a member whose readmission this
 * node deferred and that says it restarted is not waited for (join.c). */
void td__join_heard(td__session_t *s, size_t mi);
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
/* Does this node conclude it fell behind its run, when `ahead` of its
 * `others` fellow members say they are more than TD__BEHIND_ROUNDS ahead? Only
 * when they are more than half of the run, this node counted, and more than
 * one: no single member's claim suffices, nor half of the run's. */
bool td__comeback_fell_behind(size_t others, size_t ahead);

/* ---- anchor reconciliation (reconcile.c) ------------------------------------------------ */

/* NULL in *out when the run does not reconcile. */
int td__reconcile_open(td__reconcile_t **out, td__session_t *s);
void td__reconcile_close(td__reconcile_t **self_p);
void td__reconcile_own(td__session_t *s, td_run_event_t *ev);
void td__reconcile_request(td__session_t *s, td__link_t *l, const Traind__SnapshotRequest *rq);
void td__reconcile_chunk(td__session_t *s, const Traind__Envelope *env);
void td__reconcile_tick(td__session_t *s);
void td__reconcile_stats(const td__reconcile_t *r, td__run_stats_t *out);

/* ---- model-state agreement (verify.c) ---------------------------------------------------- */

int td__verify_open(td__verify_t **out, td__session_t *s);
void td__verify_close(td__verify_t **self_p);
/* The compute thread hashed its state after ev->round (TD_RUN_VERIFY; the
 * state in ev->blob is taken): send the hash to the members and vote. */
void td__verify_own(td__session_t *s, td_run_event_t *ev);
/* trainctl verify: ask every member to hash its state a few rounds ahead;
 * that round in *round, or an error and a one-line why (the run cannot be
 * verified, is not training yet, or ends too soon). */
int td__verify_ask(td__session_t *s, uint64_t *round, char *why, size_t why_len);
/* A member joins or comes back from `round`: every node hashes its state
 * after it (when the run verifies at all). */
void td__verify_at(td__session_t *s, uint64_t round);
/* A member asks for our state of rq->round to repair its own (snapshots.c routed it). */
void td__verify_request(td__session_t *s, td__link_t *l, const Traind__SnapshotRequest *rq);
/* A chunk of the state this node fetches to repair its own (s: NULL when not our run). */
void td__verify_chunk(td__session_t *s, uint64_t sender, const Traind__SnapshotChunk *ch);
/* Heartbeat: decide rounds whose time is up; resume a stalled fetch. */
void td__verify_tick(td__session_t *s);
void td__verify_stats(const td__verify_t *v, td__run_stats_t *out);
/* Whether this node's own hash of `round` is still waiting for the members'. */
bool td__verify_pending(const td__verify_t *v, uint64_t round);
void td__on_state_hash(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes);

/* ---- the model a run keeps (model_keep.c) ------------------------------------------------ */

/* Hold `blob` (taken; the previous one is freed) as the model of `round` the
 * run would keep if it ended now. */
void td__model_hold(td__session_t *s, uint64_t round, float *blob);
/* The session ends in `state` with `metric`: queue the held model (if any)
 * as the run's models row, named and shaped by the run's layout. */
void td__model_keep(td__node_t *n, td__session_t *s, const char *state, double metric);
/* A layout's tensors as JSON ([{"name", "shape", "offset"}]); caller frees;
 * NULL when out of memory. */
char *td__layout_json(const td_layout_t *layout);
#endif
