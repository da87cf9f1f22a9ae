/* runspec.h: the run specification (docs/design.md#a-run) and its one key table.
 *
 * A run is described by `key = value` pairs that come from an INI file (read
 * with inih; keys may sit at top level or in a [run] section) and from
 * `--set key=value` flags, applied in that order. One declarative table drives
 * defaults, parsing, validation, help text and the canonical text form that
 * will be hashed into a run_id, so the four can never disagree (Redis config.c
 * style). Every error names the key, the bad value and what is accepted. */
#ifndef TD_RUNSPEC_H
#define TD_RUNSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/optim.h"
#include "scheduler/aggregate.h"
#include "scheduler/outer.h"
#include "scheduler/topology.h"

#define TD_RUNSPEC_STR_MAX 1024
#define TD_RUNSPEC_MAX_SLOWDOWNS 64

typedef enum {
  TD_MODE_SYNC = 0, /* barrier with a deadline */
  TD_MODE_OVERLAP,  /* one-round-delayed outer update; compute never waits a round */
  TD_MODE_ASYNC,    /* no barrier; updates older than max_staleness are dropped */
} td_mode_t;

typedef struct {
  char model[TD_RUNSPEC_STR_MAX];       /* mlp:784-256-128-10 */
  char dataset[TD_RUNSPEC_STR_MAX];     /* auto | fashion-mnist | idx:... | csv:... | text:... */
  char partition[TD_RUNSPEC_STR_MAX];   /* all | iid | dirichlet:A | shard:K */
  char node[TD_RUNSPEC_STR_MAX];        /* K/N: which partition (standalone) */
  char lr_schedule[TD_RUNSPEC_STR_MAX]; /* constant | cosine | step:E[:G] */
  char backend[TD_RUNSPEC_STR_MAX];     /* cpu | cuda */
  char mode[TD_RUNSPEC_STR_MAX];        /* sync | overlap | async:S */
  char codec[TD_RUNSPEC_STR_MAX];       /* none | ... | auto */
  char local_steps_text[TD_RUNSPEC_STR_MAX]; /* H | qsr:ALPHA:HBASE */
  char batching[TD_RUNSPEC_STR_MAX];    /* weighted | equal */
  char slowdown[TD_RUNSPEC_STR_MAX];    /* F | F0,F1,... by rank */
  unsigned local_steps;                 /* H (H_base under QSR), from local_steps_text */
  double qsr_alpha;                     /* > 0: quadratic synchronization rule */
  td_mode_t mode_kind;                  /* from mode */
  unsigned max_staleness;               /* async:S */
  bool codec_auto;                      /* codec = auto */
  bool weighted_batching;               /* batching = weighted */
  unsigned overlap_fill;                /* overlap: up to this x H steps instead of waiting */
  double overlap_pull;                  /* overlap: anchor pull-back after the delayed swap */
  char overlap_fix[TD_RUNSPEC_STR_MAX]; /* pull | none | eager | dc:LAMBDA */
  unsigned overlap_fix_kind;            /* td_overlap_fix_t (scheduler/overlap.h) */
  double overlap_dc_lambda;             /* dc:LAMBDA (td_overlap_compensate) */
  double overlap_wait;                  /* overlap: exchange / compute ratio from which a round
                                           waits for its own average (0: never) */
  bool overlap_early;                   /* overlap: swap an average in at the first step
                                           boundary after it arrives, not at the round's end */
  unsigned fragments;                   /* Streaming DiLoCo: P fragments on staggered rounds
                                           (scheduler/fragment.h); 1: the whole model each round */
  double fragment_alpha;                /* overlap, fragments > 1: what a node keeps of its own
                                           slice when the slice's average arrives */
  char topology[TD_RUNSPEC_STR_MAX];    /* mesh | gossip:K | groups:M | auto */
  unsigned topology_kind;               /* td_topo_kind_t (scheduler/topology.h) */
  unsigned topology_k;                  /* gossip: peers a round; groups: group size */
  char reconcile[TD_RUNSPEC_STR_MAX];   /* end | off | N */
  bool reconcile_on;                    /* from reconcile: anchors averaged after the last round */
  unsigned reconcile_every;             /* ... and every N rounds (0: only then) */
  char reconcile_via[TD_RUNSPEC_STR_MAX]; /* auto | mesh | hub */
  unsigned reconcile_via_kind;          /* td_recon_via_t (scheduler/recon.h) */
  char aggregate[TD_RUNSPEC_STR_MAX];   /* mean | clip:C | trimmed:B | median */
  char norm_bound[TD_RUNSPEC_STR_MAX];  /* auto | off | R */
  char init[TD_RUNSPEC_STR_MAX];        /* none | FILE.safetensors | RUN[:ROUND]: the weights to
                                          start from */
  char init_hash[TD_RUNSPEC_STR_MAX];   /* none | the init file's BLAKE2b-256 (hex), set by the
                                           starting node; each member checks its own file */
  td_agg_spec_t agg;                    /* from both; norm_bound -1 = auto (td_runspec_agg) */
  double outer_lr, outer_momentum, outer_clip;
  bool outer_nesterov;
  char outer[TD_RUNSPEC_STR_MAX];       /* sgd | adam | yogi | adagrad */
  unsigned outer_kind;                  /* td_outer_kind_t (scheduler/outer.h), from outer */
  double outer_beta1, outer_beta2, outer_tau; /* adam, yogi, adagrad */
  double prox_mu;                       /* FedProx: mu (w - round start) in the gradient */
  char strategy[TD_RUNSPEC_STR_MAX];    /* fedavg | scaffold */
  bool scaffold;                        /* strategy = scaffold: control variates */
  unsigned clients;                     /* virtual clients per node (1: the node is one) */
  double participation;                 /* client sampling: fraction (0, 1] or count N >= 2 */
  unsigned min_updates;                 /* a round closes at this many sampled updates (0: all) */
  char round_deadline[TD_RUNSPEC_STR_MAX]; /* fixed | adaptive[:C] */
  bool client_eval;                     /* evaluate on this node's held-out share too */
  double deadline_mad_c;                /* from round_deadline: C of median + C MAD; 0: fixed */
  double staleness_kappa;               /* async weight (1 + a)^-kappa */
  unsigned budget_ms;                   /* codec=auto: least time budget of a round's exchange */
  char ef_decay[TD_RUNSPEC_STR_MAX];    /* auto | lr | off */
  unsigned ef_decay_kind;               /* td_ef_decay_t, from ef_decay */
  unsigned transfer;                    /* direct knowledge transfer every N rounds, 0 = off */
  double transfer_lambda, transfer_margin;
  unsigned rounds;                      /* 0 = derived from epochs */
  unsigned eval_every;                  /* rounds between evaluations */
  unsigned eval_nodes;                  /* ranks below it evaluate every eval_every (0: all) */
  unsigned checkpoint_every;            /* rounds between checkpoints, 0 = off */
  unsigned checkpoint_keep;             /* newest checkpoints kept per run, 0 = all */
  unsigned verify_every;                /* members compare state hashes every N rounds, 0 = off */
  double round_timeout;                 /* seconds a sync round waits for peers */
  unsigned batch;
  double lr;
  double momentum;
  bool nesterov;
  double weight_decay;                  /* sgd: L2 on the gradient; adamw: decoupled */
  char optimizer[TD_RUNSPEC_STR_MAX];   /* sgd | adamw (the inner, per-node optimizer) */
  unsigned optimizer_kind;              /* td_optim_kind_t (compute/optim.h), from optimizer */
  double beta1, beta2, eps;             /* adamw */
  double clip;                          /* global gradient-norm clip, 0 = off */
  unsigned warmup_steps;
  unsigned epochs;
  uint64_t seed;
  unsigned threads; /* 0 = BLAS default */
  unsigned node_rank, node_count; /* parsed from `node` */
} td_runspec_t;

/* Fill every key with its default. */
void td_runspec_defaults(td_runspec_t *rs);
/* Set one key from text. TD_ECONFIG + why for an unknown key or a bad value. */
int td_runspec_set(td_runspec_t *rs, const char *key, const char *value, char *why,
                   size_t why_len);
/* Set from "key=value" (a --set argument). */
int td_runspec_set_arg(td_runspec_t *rs, const char *key_eq_value, char *why, size_t why_len);
/* Apply an INI file. TD_ENOENT if it cannot be opened, TD_ECONFIG (with the
 * line number) for a syntax error or a bad key/value. */
int td_runspec_load_ini(td_runspec_t *rs, const char *path, char *why, size_t why_len);
/* Read a run file whole into *text (caller frees): a regular file of at most
 * TD_RUNSPEC_FILE_MAX bytes of text. TD_ENOENT or TD_EIO when it cannot be
 * opened or read, TD_ECONFIG for a directory or other non-file, a file too
 * large, or a NUL byte (with its line: the rest would be dropped unseen). */
#define TD_RUNSPEC_FILE_MAX (1u << 20)
int td_runspec_read_file(const char *path, char **text, char *why, size_t why_len);
/* Apply INI text held in memory (what trainctl start sends); `origin` names it
 * in errors. TD_ECONFIG (with the line number) + why. */
int td_runspec_load_ini_text(td_runspec_t *rs, const char *text, const char *origin, char *why,
                             size_t why_len);
/* The dataset the run trains on: the `dataset` key, where `auto` (the
 * default) means text:fortunes (TD_TEXT_DEFAULT_SPEC) for a gpt model and
 * fashion-mnist for every other. Every node resolves it the same way. */
const char *td_runspec_dataset(const td_runspec_t *rs);
/* The trainer's optimizer options from optimizer, momentum, nesterov,
 * weight_decay, beta1, beta2, eps and clip. */
void td_runspec_optim_opts(const td_runspec_t *rs, td_optim_opts_t *out);
/* ef_decay, in the order of its names. */
typedef enum { TD_EF_DECAY_AUTO, TD_EF_DECAY_LR, TD_EF_DECAY_OFF } td_ef_decay_t;
/* Whether a link's error-feedback residual is scaled by lr_now / lr_then
 * when the learning rate falls (ef_decay; auto: with adamw). */
bool td_runspec_ef_decays(const td_runspec_t *rs);
/* Whether that dataset is text (bits per byte) rather than classes (accuracy). */
bool td_runspec_is_text(const td_runspec_t *rs);
/* Whether init names a run's kept model, "RUN" or "RUN:ROUND" (a nonzero run
 * id of 16 lowercase hex digits, a round >= 1); *round is 0 without one. */
bool td_runspec_init_run(const char *init, uint64_t *run_id, uint64_t *round);
/* The outer step's options from outer, outer_lr, outer_momentum,
 * outer_nesterov, outer_clip, outer_beta1, outer_beta2 and outer_tau. */
void td_runspec_outer_opts(const td_runspec_t *rs, td_outer_opts_t *out);
/* Cross-key checks (e.g. nesterov needs momentum > 0, a gpt model needs text
 * and every other model features). */
int td_runspec_validate(const td_runspec_t *rs, char *why, size_t why_len);
/* Canonical "key = value\n" lines in table order; returns the length that the
 * full text needs (snprintf semantics). */
size_t td_runspec_format(const td_runspec_t *rs, char *buf, size_t len);
/* Slowdown factor (>= 1) of the node of `rank`: the single value of `slowdown`
 * for every rank, or its rank-th entry (1 past the end of the list). */
double td_runspec_slowdown(const td_runspec_t *rs, unsigned rank);
/* Whether the run reconciles anchors at all (scheduler/recon.h): `reconcile`
 * not off, sync or overlap (async has no shared anchor), a lossy codec (with
 * none every node applies the same exact averages). */
bool td_runspec_reconciles(const td_runspec_t *rs);
/* The run's topology (scheduler/topology.h): what `topology` says, with
 * `auto` the mesh where the run cannot mix models (td_runspec_mixes). */
td_topology_t td_runspec_topology(const td_runspec_t *rs);
/* Whether the run's messages are models that each node mixes with its
 * round's partners' (topology gossip, groups, or auto with a codec and mode
 * that allow it), rather than deltas from one shared anchor (the mesh). */
bool td_runspec_mixes(const td_runspec_t *rs);
/* Whether the members hold one shared state bit for bit that they can hash
 * and compare (scheduler/agree.h): sync or overlap with codec none. NULL or
 * true; else false and a one-line why (async: no shared model; a lossy
 * codec: the anchors differ by design between reconciliations). */
bool td_runspec_verifiable(const td_runspec_t *rs, char *why, size_t why_len);
/* The ledger space the run's checkpoints would hold at once, with `rounds`
 * rounds of a model of `floats` floats: checkpoint_keep of them, or every one
 * its rounds take with checkpoint_keep = 0. TD_ERANGE + a one-line why when
 * that is over max_bytes (the node's --max-checkpoint-mb), else 0. */
int td_runspec_check_checkpoints(const td_runspec_t *rs, uint64_t rounds, uint64_t floats,
                                 uint64_t max_bytes, char *why, size_t why_len);
/* How the run combines a round's updates: `aggregate` and `norm_bound` with
 * auto resolved (scheduler/aggregate.h). */
void td_runspec_agg(const td_runspec_t *rs, td_agg_spec_t *out);
/* One line per key: name, default, meaning, and for numeric keys "(range MIN to MAX)";
 * man/traind-run.5 documents the same (tests/integration/runkeys_doc.sh). */
void td_runspec_print_help(FILE *out);

#endif
