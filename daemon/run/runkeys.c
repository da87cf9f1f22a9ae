/* runkeys.c: what each run key accepts and means: the checkers of structured
 * values (model, partition, schedule, codec, overlap_fix...), the table of
 * keys (runkeys.h), and the helpers that read what a checked value means
 * (the aggregation rule, a node's slowdown, whether a spec reconciles or can
 * be verified). Parsing, files, defaults and formatting are runspec.c's. */
#include "daemon/run/runkeys.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "compute/backend.h"
#include "common/error.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/data/partition.h"
#include "compute/data/text.h"
#include "scheduler/overlap.h"
#include "scheduler/fragment.h"

static int check_model(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  return td_model_check_spec(v, why, n);
}

bool td_runspec_init_run(const char *init, uint64_t *run_id, uint64_t *round) {
  if (strspn(init, "0123456789abcdef") != 16 || (init[16] != '\0' && init[16] != ':'))
    return false;
  char hex[17];
  memcpy(hex, init, 16);
  hex[16] = '\0';
  *run_id = strtoull(hex, NULL, 16);
  *round = 0;
  if (init[16] == '\0')
    return *run_id != 0;
  const char *r = init + 17;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(r, &end, 10);
  if (r[0] < '1' || r[0] > '9' || *end != '\0' || errno != 0)
    return false;
  *round = v;
  return *run_id != 0;
}

static int check_init(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  size_t len = strlen(v), ext = strlen(".safetensors");
  uint64_t run_id, round;
  if (strcmp(v, "none") == 0 || (len > ext && strcmp(v + len - ext, ".safetensors") == 0) ||
      td_runspec_init_run(v, &run_id, &round))
    return 0;
  return td_why(why, n, TD_ECONFIG,
                "'%.64s' is neither none, a FILE.safetensors (trainctl model RUN -o "
                "FILE.safetensors writes one) nor RUN[:ROUND] (a run id of 16 hex digits, "
                "as trainctl runs lists them)",
                v);
}

static int check_init_hash(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  size_t len = strlen(v);
  if (strcmp(v, "none") == 0 || (len == 64 && strspn(v, "0123456789abcdef") == 64))
    return 0;
  return td_why(why, n, TD_ECONFIG, "'%.80s' is neither none nor 64 lowercase hex digits", v);
}

static int check_partition(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_partition_t p;
  (void)rs;
  return td_partition_parse(&p, v, why, n);
}

static int check_schedule(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_lr_schedule_t s;
  (void)rs;
  return td_lr_schedule_parse(&s, v, 0.1, 0, 1, 1, why, n);
}

static int check_backend(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  return td_backend_check_name(v, why, n);
}

static int check_dataset(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  if (strcmp(v, "auto") == 0 || strcmp(v, "fashion-mnist") == 0 ||
      (strncmp(v, "idx:", 4) == 0 && v[4] != '\0') ||
      (strncmp(v, "csv:", 4) == 0 && v[4] != '\0') ||
      (strncmp(v, "npy:", 4) == 0 && v[4] != '\0') ||
      (strncmp(v, "images:", 7) == 0 && v[7] != '\0') ||
      (strncmp(v, "text:", 5) == 0 && v[5] != '\0'))
    return 0;
  return td_why(why, n, TD_ECONFIG,
                "unknown dataset '%s' (accepted: auto, fashion-mnist, idx:TRAIN_IMAGES,TRAIN_LABELS"
                "[,TEST_IMAGES,TEST_LABELS], csv:TRAIN[,TEST], npy:TRAIN_X,TRAIN_Y[,TEST_X,"
                "TEST_Y], images:DIR[,TEST_DIR], text:fortunes, text:PATH[,VALID_PATH])",
                v);
}

static int check_optimizer(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_optim_kind_t kind;
  int rc = td_optim_kind_parse(&kind, v, why, n);
  if (rc == 0)
    rs->optimizer_kind = (unsigned)kind;
  return rc;
}

/* Strict unsigned integer in [lo, hi] spanning the whole of [s, end). */
static bool parse_uint_span(const char *s, const char *end, unsigned long lo, unsigned long hi,
                            unsigned long *out) {
  if (s == end || *s < '0' || *s > '9')
    return false;
  char *stop;
  errno = 0;
  unsigned long v = strtoul(s, &stop, 10);
  if (stop != end || errno != 0 || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

static int check_mode(td_runspec_t *rs, const char *v, char *why, size_t n) {
  unsigned long s = 0;
  if (strcmp(v, "sync") == 0) {
    rs->mode_kind = TD_MODE_SYNC;
  } else if (strcmp(v, "overlap") == 0) {
    rs->mode_kind = TD_MODE_OVERLAP;
  } else if (strncmp(v, "async:", 6) == 0 && parse_uint_span(v + 6, v + strlen(v), 0, 1000, &s)) {
    rs->mode_kind = TD_MODE_ASYNC;
    rs->max_staleness = (unsigned)s;
  } else {
    return td_why(why, n, TD_ECONFIG,
                  "unknown mode '%s' (accepted: sync, overlap, async:S with S in [0, 1000])", v);
  }
  return 0;
}

static int check_codec(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_codec_spec_t spec;
  if (strcmp(v, "auto") == 0) {
    rs->codec_auto = true;
    return 0;
  }
  if (!td_codec_known(v)) {
    char known[256];
    td_codec_list(known, sizeof known);
    return td_why(why, n, TD_ECONFIG, "codec '%s' is unknown (accepted: auto, %s)", v, known);
  }
  int rc = td_codec_parse(&spec, v, why, n); /* its why names the bad parameter */
  if (rc == 0)
    rs->codec_auto = false;
  return rc;
}

/* local_steps = H | qsr:ALPHA:HBASE */
static int check_local_steps(td_runspec_t *rs, const char *v, char *why, size_t n) {
  unsigned long h = 0;
  if (parse_uint_span(v, v + strlen(v), 1, 1000000, &h)) {
    rs->local_steps = (unsigned)h;
    rs->qsr_alpha = 0;
    return 0;
  }
  if (strncmp(v, "qsr:", 4) == 0) {
    char *end;
    errno = 0;
    double alpha = strtod(v + 4, &end);
    if (end != v + 4 && *end == ':' && errno == 0 && isfinite(alpha) && alpha > 0 &&
        parse_uint_span(end + 1, v + strlen(v), 1, 1000000, &h)) {
      rs->local_steps = (unsigned)h;
      rs->qsr_alpha = alpha;
      return 0;
    }
  }
  return td_why(why, n, TD_ECONFIG,
                "bad local_steps '%s' (accepted: H in [1, 1000000], or qsr:ALPHA:HBASE with "
                "ALPHA > 0)", v);
}

static int check_batching(td_runspec_t *rs, const char *v, char *why, size_t n) {
  if (strcmp(v, "weighted") == 0 || strcmp(v, "equal") == 0) {
    rs->weighted_batching = v[0] == 'w';
    return 0;
  }
  return td_why(why, n, TD_ECONFIG, "unknown batching '%s' (accepted: weighted, equal)", v);
}

/* overlap_fix = pull | none | eager | dc:LAMBDA (scheduler/overlap.h) */
static int check_overlap_fix(td_runspec_t *rs, const char *v, char *why, size_t n) {
  static const struct {
    const char *name;
    td_overlap_fix_t kind;
  } fixes[] = {{"pull", TD_OVERLAP_FIX_PULL},
               {"none", TD_OVERLAP_FIX_NONE},
               {"eager", TD_OVERLAP_FIX_EAGER}};
  for (size_t i = 0; i < sizeof fixes / sizeof fixes[0]; i++)
    if (strcmp(v, fixes[i].name) == 0) {
      rs->overlap_fix_kind = (unsigned)fixes[i].kind;
      rs->overlap_dc_lambda = 0;
      return 0;
    }
  if (strncmp(v, "dc:", 3) == 0) {
    char *end;
    errno = 0;
    double lambda = strtod(v + 3, &end);
    if (end != v + 3 && *end == '\0' && errno == 0 && lambda >= 0 &&
        lambda <= TD_OVERLAP_DC_LAMBDA_MAX) {
      rs->overlap_fix_kind = TD_OVERLAP_FIX_DC;
      rs->overlap_dc_lambda = lambda;
      return 0;
    }
    return td_why(why, n, TD_ECONFIG,
                  "bad overlap_fix '%s': dc:LAMBDA needs a number LAMBDA in [0, %g]", v,
                  TD_OVERLAP_DC_LAMBDA_MAX);
  }
  return td_why(why, n, TD_ECONFIG,
                "unknown fix '%s' (accepted: pull, none, eager, dc:LAMBDA with LAMBDA >= 0)", v);
}

/* topology = mesh | gossip:K | groups:M | auto (scheduler/topology.h) */
static int check_topology(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_topology_t t;
  if (td_topology_parse(&t, v, why, n) != 0)
    return TD_ECONFIG;
  rs->topology_kind = (unsigned)t.kind;
  rs->topology_k = t.k;
  return 0;
}

/* reconcile = end | off | N (rounds, >= 1) */
static int check_reconcile(td_runspec_t *rs, const char *v, char *why, size_t n) {
  char *end;
  errno = 0;
  unsigned long every = strtoul(v, &end, 10);
  if (strcmp(v, "end") == 0 || strcmp(v, "off") == 0) {
    rs->reconcile_on = v[0] == 'e';
    rs->reconcile_every = 0;
    return 0;
  }
  if (end != v && *end == '\0' && errno == 0 && v[0] != '-' && every >= 1 &&
      every <= 100000000) {
    rs->reconcile_on = true;
    rs->reconcile_every = (unsigned)every;
    return 0;
  }
  return td_why(why, n, TD_ECONFIG,
                "bad reconcile '%s' (accepted: end, off, or every N rounds, N in [1, 1e8])", v);
}

/* aggregate = mean | clip:C | trimmed:B | median (norm_bound kept) */
static int check_aggregate(td_runspec_t *rs, const char *v, char *why, size_t n) {
  td_agg_spec_t agg = rs->agg;
  int rc = td_agg_parse(&agg, v, why, n);
  if (rc == 0)
    rs->agg = agg;
  return rc;
}

/* norm_bound = auto | off | R */
static int check_norm_bound(td_runspec_t *rs, const char *v, char *why, size_t n) {
  return td_agg_parse_norm_bound(&rs->agg.norm_bound, v, why, n);
}

void td_runspec_agg(const td_runspec_t *rs, td_agg_spec_t *out) {
  *out = rs->agg;
  td_agg_resolve(out);
}

/* A key whose value is one of three names: *kind = its index, or TD_ECONFIG. */
static int pick_name(const char *key, const char *const names[3], const char *v,
                     unsigned *kind, char *why, size_t n) {
  for (unsigned i = 0; i < 3; i++)
    if (strcmp(v, names[i]) == 0) {
      *kind = i;
      return 0;
    }
  return td_why(why, n, TD_ECONFIG, "unknown %s '%s' (accepted: %s, %s, %s)", key, v, names[0],
                names[1], names[2]);
}

/* reconcile_via = auto | mesh | hub (the order of td_recon_via_t) */
static int check_reconcile_via(td_runspec_t *rs, const char *v, char *why, size_t n) {
  static const char *const names[3] = {"auto", "mesh", "hub"};
  return pick_name("reconcile_via", names, v, &rs->reconcile_via_kind, why, n);
}

/* ef_decay = auto | lr | off (the order of td_ef_decay_t) */
static int check_outer(td_runspec_t *rs, const char *v, char *why, size_t n) {
  static const char *const names[] = {"sgd", "adam", "yogi", "adagrad"};
  _Static_assert(TD_OUTER_SGD == 0 && TD_OUTER_ADAM == 1 && TD_OUTER_YOGI == 2 &&
                     TD_OUTER_ADAGRAD == 3, "check_outer lists the kinds in enum order");
  for (unsigned i = 0; i < 4; i++)
    if (strcmp(v, names[i]) == 0) {
      rs->outer_kind = i;
      return 0;
    }
  return td_why(why, n, TD_ECONFIG,
                "'%s' is not an outer optimizer (accepted: sgd, adam, yogi, adagrad)", v);
}

/* strategy = fedavg | scaffold */
static int check_strategy(td_runspec_t *rs, const char *v, char *why, size_t n) {
  if (strcmp(v, "fedavg") != 0 && strcmp(v, "scaffold") != 0)
    return td_why(why, n, TD_ECONFIG, "'%s' is not a strategy (accepted: fedavg, scaffold)", v);
  rs->scaffold = v[0] == 's';
  return 0;
}

/* round_deadline = fixed | adaptive | adaptive:C, C in [0.5, 100] (3 by default) */
static int check_round_deadline(td_runspec_t *rs, const char *v, char *why, size_t n) {
  if (strcmp(v, "fixed") == 0) {
    rs->deadline_mad_c = 0;
    return 0;
  }
  if (strcmp(v, "adaptive") == 0) {
    rs->deadline_mad_c = 3;
    return 0;
  }
  if (strncmp(v, "adaptive:", 9) == 0) {
    char *end;
    errno = 0;
    double c = strtod(v + 9, &end);
    if (end != v + 9 && *end == '\0' && errno == 0 && c >= 0.5 && c <= 100) {
      rs->deadline_mad_c = c;
      return 0;
    }
  }
  return td_why(why, n, TD_ECONFIG,
                "bad round_deadline '%s' (expected fixed, adaptive or adaptive:C with C in "
                "[0.5, 100])", v);
}

static int check_ef_decay(td_runspec_t *rs, const char *v, char *why, size_t n) {
  static const char *const names[3] = {"auto", "lr", "off"};
  return pick_name("ef_decay", names, v, &rs->ef_decay_kind, why, n);
}

/* slowdown = F or F0,F1,... : each a finite number in [1, 1000] */
static int check_slowdown(td_runspec_t *rs, const char *v, char *why, size_t n) {
  (void)rs;
  const char *p = v;
  for (unsigned i = 0;; i++) {
    char *end;
    errno = 0;
    double f = strtod(p, &end);
    if (end == p || errno != 0 || !isfinite(f) || f < 1 || f > 1000 ||
        i >= TD_RUNSPEC_MAX_SLOWDOWNS || (*end != ',' && *end != '\0'))
      return td_why(why, n, TD_ECONFIG,
                    "bad slowdown '%s' (accepted: F or F0,F1,... per rank, each in [1, 1000],"
                    " at most %d)", v, TD_RUNSPEC_MAX_SLOWDOWNS);
    if (*end == '\0')
      return 0;
    p = end + 1;
  }
}

bool td_runspec_reconciles(const td_runspec_t *rs) {
  if (!rs->reconcile_on || rs->mode_kind == TD_MODE_ASYNC)
    return false;
  td_codec_spec_t codec;
  return rs->codec_auto || (td_codec_parse(&codec, rs->codec, NULL, 0) == 0 &&
                            codec.id != TD_CODEC_NONE);
}

/* Why topology = gossip or groups cannot take this spec, or NULL. */
static const char *mix_refusal(const td_runspec_t *rs) {
  td_codec_spec_t codec;
  td_agg_spec_t agg;
  td_runspec_agg(rs, &agg);
  if (rs->mode_kind != TD_MODE_SYNC)
    return "needs mode = sync (overlap and async step from one shared anchor)";
  if (rs->codec_auto || td_codec_parse(&codec, rs->codec, NULL, 0) != 0 ||
      (codec.id != TD_CODEC_NONE && codec.id != TD_CODEC_FP16))
    return "needs codec none or fp16 (nodes exchange models, which a sparse or low-rank "
           "codec cannot carry without CHOCO's per-neighbour copies, not built)";
  if (agg.kind != TD_AGG_MEAN || agg.norm_bound > 0)
    return "needs aggregate = mean and no norm_bound (a robust rule needs the whole "
           "round's updates; a partner's model is not a delta to bound)";
  if (rs->fragments > 1)
    return "needs fragments = 1";
  if (rs->participation != 1)
    return "needs participation = 1 (a member outside the sample sends nothing its "
           "partners could mix)";
  if (rs->scaffold)
    return "is not built with strategy = scaffold (its c is derived from a global mean)";
  if (rs->min_updates > 0 || rs->deadline_mad_c > 0)
    return "needs round_deadline = fixed and no min_updates (each node waits for its own "
           "round's partners)";
  return NULL;
}

td_topology_t td_runspec_topology(const td_runspec_t *rs) {
  td_topology_t t = {.kind = (td_topo_kind_t)rs->topology_kind, .k = rs->topology_k};
  if (t.kind == TD_TOPO_AUTO && mix_refusal(rs) != NULL)
    t = (td_topology_t){.kind = TD_TOPO_MESH};
  return t;
}

bool td_runspec_mixes(const td_runspec_t *rs) {
  return td_runspec_topology(rs).kind != TD_TOPO_MESH;
}

int td_runspec_check_topology(const td_runspec_t *rs, char *why, size_t why_len) {
  if (rs->topology_kind != TD_TOPO_GOSSIP && rs->topology_kind != TD_TOPO_GROUPS)
    return 0;
  const char *no = mix_refusal(rs);
  return no == NULL ? 0 : td_why(why, why_len, TD_ECONFIG, "topology = %s: %s", rs->topology, no);
}

bool td_runspec_verifiable(const td_runspec_t *rs, char *why, size_t why_len) {
  td_codec_spec_t codec;
  if (td_runspec_mixes(rs)) {
    td_why(why, why_len, TD_EINVAL, "with topology %s each node's model differs from the "
           "others' by design until the last round; the ledger's consensus column measures "
           "how far (rounds.consensus)", rs->topology);
    return false;
  }
  if (rs->mode_kind == TD_MODE_ASYNC) {
    td_why(why, why_len, TD_EINVAL, "an async run holds no shared model: each node's is its own");
    return false;
  }
  if (rs->codec_auto || td_codec_parse(&codec, rs->codec, NULL, 0) != 0 ||
      codec.id != TD_CODEC_NONE) {
    td_why(why, why_len, TD_EINVAL, "with codec %s each node's anchor differs from the others' "
           "by design until reconciled; state hashes agree only with codec none", rs->codec);
    return false;
  }
  return true;
}

int td_runspec_check_checkpoints(const td_runspec_t *rs, uint64_t rounds, uint64_t floats,
                                 uint64_t max_bytes, char *why, size_t why_len) {
  if (rs->checkpoint_every == 0)
    return 0;
  uint64_t held = rounds / rs->checkpoint_every;
  if (rs->checkpoint_keep > 0 && rs->checkpoint_keep < held)
    held = rs->checkpoint_keep;
  uint64_t each = floats * sizeof(float);
  if (held == 0 || each == 0 || held <= max_bytes / each)
    return 0;
  /* in doubles: held x each can pass 2^64 for allowed rounds and models */
  return td_why(why, why_len, TD_ERANGE,
                "checkpoints: %" PRIu64 " of %.1f MiB each (checkpoint_keep %u, checkpoint_every "
                "%u) would hold %.0f MiB in the ledger, over this node's limit of %" PRIu64
                " MiB (--max-checkpoint-mb); keep fewer",
                held, (double)each / (1u << 20), rs->checkpoint_keep, rs->checkpoint_every,
                (double)held * (double)each / (1u << 20), max_bytes >> 20);
}

double td_runspec_slowdown(const td_runspec_t *rs, unsigned rank) {
  const char *p = rs->slowdown;
  double f = 1;
  unsigned i = 0;
  for (;; i++) {
    char *end;
    f = strtod(p, &end);
    if (end == p)
      return 1;
    if (i == rank || (i == 0 && *end == '\0'))
      return f >= 1 && isfinite(f) ? f : 1;
    if (*end != ',')
      return 1;
    p = end + 1;
  }
}

/* node = K/N with 0 <= K < N <= 4096 */
static int check_node(td_runspec_t *rs, const char *v, char *why, size_t n) {
  char *end;
  errno = 0;
  unsigned long k = strtoul(v, &end, 10);
  if (end == v || *end != '/' || v[0] == '-')
    goto bad;
  const char *ns = end + 1;
  unsigned long count = strtoul(ns, &end, 10);
  if (end == ns || *end != '\0' || ns[0] == '-' || errno != 0 || count == 0 || count > 4096 ||
      k >= count)
    goto bad;
  rs->node_rank = (unsigned)k;
  rs->node_count = (unsigned)count;
  return 0;
bad:
  return td_why(why, n, TD_ECONFIG, "bad node '%s' (expected K/N with 0 <= K < N <= 4096)", v);
}

#define F(field) offsetof(td_runspec_t, field)
const run_key_t td__run_keys[] = {
    {"model", KEY_STR, F(model), "mlp:784-256-128-10", 0, 0, check_model,
     "model spec: mlp:IN-H1-...-OUT | cnn | resnet | gpt:L-W-H-T | layers:..."},
    {"init", KEY_STR, F(init), "none", 0, 0, check_init,
     "start from these weights instead of the seed's: a safetensors file with every tensor of "
     "the model (trainctl model writes one), or RUN[:ROUND], the model this node's ledger "
     "keeps of run RUN (that round's checkpoint); a peer run reads the file under each node's "
     "data root, the run in each node's ledger, and every member must hold the same weights"},
    {"init_hash", KEY_STR, F(init_hash), "none", 0, 0, check_init_hash,
     "the init file's BLAKE2b-256 in hex: the node that starts a peer run sets it from its "
     "own file, and every member refuses a file with another"},
    {"dataset", KEY_STR, F(dataset), "auto", 0, 0, check_dataset,
     "auto (text:fortunes for a gpt model, else fashion-mnist) | fashion-mnist"
     " | idx:TRAIN_IMAGES,TRAIN_LABELS[,TEST_IMAGES,TEST_LABELS] | csv:TRAIN[,TEST]"
     " | npy:TRAIN_X,TRAIN_Y[,TEST_X,TEST_Y] | images:DIR[,TEST_DIR] (a folder per class of"
     " PNG/JPEG, converted to the model's input(C,H,W), never resized)"
     " | text:fortunes | text:PATH[,VALID_PATH] (bytes as tokens; 10% held out without "
     "VALID_PATH)"},
    {"partition", KEY_STR, F(partition), "iid", 0, 0, check_partition,
     "all | iid | dirichlet:ALPHA | shard:K"},
    {"node", KEY_STR, F(node), "0/1", 0, 0, check_node,
     "K/N: train on partition K of N (standalone baselines)"},
    {"batch", KEY_UINT, F(batch), "64", 1, TD_MODEL_MAX_BATCH, NULL, "global batch per step"},
    {"lr", KEY_DOUBLE, F(lr), "0.05", 1e-12, 1e30, NULL, "base learning rate"},
    {"optimizer", KEY_STR, F(optimizer), "sgd", 0, 0, check_optimizer,
     "sgd | adamw: the local (inner) optimizer; its state never leaves the node"},
    {"momentum", KEY_DOUBLE, F(momentum), "0.9", 0, 0.999999, NULL, "SGD momentum in [0, 1)"},
    {"nesterov", KEY_BOOL, F(nesterov), "false", 0, 0, NULL, "Nesterov momentum (sgd)"},
    {"weight_decay", KEY_DOUBLE, F(weight_decay), "0", 0, 1, NULL,
     "weight decay: sgd adds wd*w to the gradient (L2); adamw decays w by lr*wd (decoupled)"},
    {"beta1", KEY_DOUBLE, F(beta1), "0.9", 0, 0.999999, NULL, "adamw: first-moment decay"},
    {"beta2", KEY_DOUBLE, F(beta2), "0.95", 0, 0.999999, NULL,
     "adamw: second-moment decay (0.95 as for GPT-style models and DiLoCo; 0.999 is "
     "PyTorch's default)"},
    {"eps", KEY_DOUBLE, F(eps), "1e-8", 1e-30, 1, NULL, "adamw: added to sqrt(v_hat)"},
    {"clip", KEY_DOUBLE, F(clip), "0", 0, 1e30, NULL,
     "clip each step's gradient to this global L2 norm (0: off)"},
    {"lr_schedule", KEY_STR, F(lr_schedule), "cosine", 0, 0, check_schedule,
     "constant | cosine | step:EPOCHS[:GAMMA]"},
    {"warmup_steps", KEY_UINT, F(warmup_steps), "0", 0, 100000000, NULL,
     "linear learning-rate warm-up, in steps"},
    {"epochs", KEY_UINT, F(epochs), "1", 1, 100000, NULL, "passes over the local partition"},
    {"seed", KEY_U64, F(seed), "1", 0, 0, NULL, "seed for init, shuffling and partitions"},
    {"threads", KEY_UINT, F(threads), "0", 0, 1024, NULL, "compute threads (0 = BLAS default, kernels on one thread)"},
    {"backend", KEY_STR, F(backend), "cpu", 0, 0, check_backend, "auto | cpu | cuda[:INDEX]"},
    {"local_steps", KEY_STR, F(local_steps_text), "8", 0, 0, check_local_steps,
     "H local steps per round, or qsr:ALPHA:HBASE (H = max(HBASE, (ALPHA/lr)^2))"},
    {"rounds", KEY_UINT, F(rounds), "0", 0, 100000000, NULL,
     "rounds of a peer run (0: from epochs)"},
    {"mode", KEY_STR, F(mode), "sync", 0, 0, check_mode,
     "sync (barrier) | overlap (one-round-delayed update; see overlap_wait) | "
     "async:S (staleness <= S)"},
    {"codec", KEY_STR, F(codec), "none", 0, 0, check_codec,
     "none | fp16 | ternary[:base3] | topk:DENSITY | powersgd:RANK | qsgd:LEVELS | auto"},
    {"batching", KEY_STR, F(batching), "weighted", 0, 0, check_batching,
     "weighted (local batch follows measured capacity) | equal"},
    {"slowdown", KEY_STR, F(slowdown), "1", 0, 0, check_slowdown,
     "F or F0,F1,... by rank: make nodes F times slower (experiments): each step ends F "
     "times its CPU time after it began (its wall time on a GPU or with threads = 0)"},
    {"overlap_fill", KEY_UINT, F(overlap_fill), "0", 0, 1000, NULL,
     "overlap: up to this many times H extra local steps while the last average is in flight"},
    {"overlap_pull", KEY_DOUBLE, F(overlap_pull), "0.4", 0, 1, NULL,
     "overlap: after the delayed swap, pull the local model this fraction back to the anchor"},
    {"overlap_fix", KEY_STR, F(overlap_fix), "pull", 0, 0, check_overlap_fix,
     "overlap: what stands in for the average in flight: pull (own round, overlap_pull "
     "pulled back) | none (own round) | eager (own round weighted 1/N, its share of the "
     "average) | dc:LAMBDA (as pull, and each late average delay-compensated: "
     "avg -= min(LAMBDA avg^2, 1) (anchor's drift since its round began))"},
    {"overlap_wait", KEY_DOUBLE, F(overlap_wait), "4", 0, 1e6, NULL,
     "overlap: a node whose exchanges take this many times its compute waits for each "
     "round's average before the next round (no delay), until under 3/4 of it; 0 = never"},
    {"overlap_early", KEY_BOOL, F(overlap_early), "false", 0, 0, NULL,
     "overlap: swap the last round's average in at the first step after it arrives, not at "
     "the end of the round (less delay; timing decides the step)"},
    {"fragments", KEY_UINT, F(fragments), "1", 1, TD_FRAGMENTS_MAX, NULL,
     "sync/overlap: Streaming DiLoCo: the parameters cut into P equal contiguous slices, "
     "round r synchronising slice r mod P only (its update covers the local steps since "
     "that slice's last round); 1: the whole model every round"},
    {"fragment_alpha", KEY_DOUBLE, F(fragment_alpha), "0.5", 0, 1, NULL,
     "overlap with fragments > 1: when a slice's average arrives (a round late), the local "
     "slice becomes alpha x local + (1 - alpha) x global (0.5, the paper's; 0: the global)"},
    {"topology", KEY_STR, F(topology), "mesh", 0, 0, check_topology,
     "sync: who exchanges with whom each round: mesh (every member with every other) | "
     "gossip:K (K peers a round on the one-peer exponential graph; nodes mix models) | "
     "groups:M (Moshpit groups of M on a virtual grid, averaged inside each) | auto (mesh "
     "up to 8 members, groups:4 above); gossip and groups need codec none or fp16, "
     "aggregate = mean; the last round is the mesh, so every node ends on one model"},
    {"reconcile", KEY_STR, F(reconcile), "end", 0, 0, check_reconcile,
     "sync/overlap with a lossy codec: nodes average their anchors (fp16) so they end on one "
     "model: end (after the last round) | N (also every N rounds) | off"},
    {"reconcile_via", KEY_STR, F(reconcile_via), "auto", 0, 0, check_reconcile_via,
     "how anchors travel: mesh (each to every member) | hub (each to the best uplink, which "
     "sends the mean back) | auto (hub when the measured uplinks make it faster)"},
    {"aggregate", KEY_STR, F(aggregate), "mean", 0, 0, check_aggregate,
     "sync/overlap: how a round's updates are combined (the same on every node): mean "
     "(sample-weighted) | clip:C (updates longer than C x the round's median norm are scaled "
     "down to it) | trimmed:B (per coordinate, the B largest and smallest values dropped, "
     "less the updates the norm bound rejected) | "
     "median (per coordinate); samples are always bounded by the member's batch plan"},
    {"norm_bound", KEY_STR, F(norm_bound), "auto", 0, 0, check_norm_bound,
     "reject outright an update longer than R x the round's median norm: R | off | auto "
     "(5 with trimmed and median, off with mean and clip)"},
    {"outer", KEY_STR, F(outer), "sgd", 0, 0, check_outer,
     "the outer (server) optimizer on each round's average, the same on every node: sgd "
     "(outer_momentum, outer_nesterov, outer_clip) | adam | yogi | adagrad (Reddi et al. "
     "2021: outer_beta1, outer_beta2, outer_tau; steps of about outer_lr per coordinate, so "
     "outer_lr 0.001 to 0.1)"},
    {"outer_lr", KEY_DOUBLE, F(outer_lr), "1", 1e-6, 100, NULL,
     "outer learning rate on the round average (sgd: 1 = plain averaging)"},
    {"outer_momentum", KEY_DOUBLE, F(outer_momentum), "0", 0, 0.999999, NULL,
     "outer momentum in [0, 1)"},
    {"outer_nesterov", KEY_BOOL, F(outer_nesterov), "false", 0, 0, NULL,
     "Nesterov outer momentum"},
    {"outer_clip", KEY_DOUBLE, F(outer_clip), "0", 0, 1e30, NULL,
     "element-wise clamp of the outer momentum buffer (0: off)"},
    {"outer_beta1", KEY_DOUBLE, F(outer_beta1), "0.9", 0, 0.999999, NULL,
     "outer = adam, yogi, adagrad: decay of the first moment of the round averages"},
    {"outer_beta2", KEY_DOUBLE, F(outer_beta2), "0.99", 0, 0.999999, NULL,
     "outer = adam, yogi: decay of the second moment"},
    {"outer_tau", KEY_DOUBLE, F(outer_tau), "0.001", 1e-9, 10, NULL,
     "outer = adam, yogi, adagrad: added to the root of the second moment (adaptivity)"},
    {"prox_mu", KEY_DOUBLE, F(prox_mu), "0", 0, 1000, NULL,
     "FedProx: each local step's gradient gains prox_mu (w - x), x the model the round "
     "started from (sync: the anchor), pulling a node's steps back toward it on skewed data "
     "(try 0.001 to 1); 0: off, FedAvg bit for bit. CPU backend"},
    {"strategy", KEY_STR, F(strategy), "fedavg", 0, 0, check_strategy,
     "fedavg | scaffold: SCAFFOLD's control variates (Karimireddy et al. 2020, option II): "
     "each local gradient becomes g - ci + c, ci the node's and c the run's control variate, "
     "c derived on every node from the round's average (nothing new on the wire); sync, "
     "batching = equal, sgd with momentum = 0, codec = none, aggregate = mean, CPU backend; "
     "with clients > 1 a ci per virtual client"},
    {"clients", KEY_UINT, F(clients), "1", 1, 4096, NULL,
     "sync: virtual clients per node, each with its own part of the data (the partition "
     "cuts nodes x clients parts; client j of node n is client n x clients + j), trained one "
     "after another from the round's model; the node sends their weighted mean, so the mesh "
     "sees nodes. participation samples among all the clients. 1: the node is one client"},
    {"participation", KEY_DOUBLE, F(participation), "1", 1e-6, 4096, NULL,
     "sync: client sampling: the members (with clients > 1: the clients) that train each "
     "round, a fraction in (0, 1] (ceil(F x members), 1: all) or a whole number N >= 2, drawn from (seed, round) so every "
     "node derives the same sample; the others neither train nor send, and no round waits "
     "for them"},
    {"min_updates", KEY_UINT, F(min_updates), "0", 0, 64, NULL,
     "sync: a round closes once this many of its sampled members' updates are in on the run's "
     "coordinator (its lowest id), the rest cut; 0: wait for every one (up to the deadline)"},
    {"round_deadline", KEY_STR, F(round_deadline), "fixed", 0, 0, check_round_deadline,
     "sync: fixed (round_timeout after this node's own update) | adaptive[:C] (median + C x "
     "MAD of the recent updates' arrival times in their rounds, C 3 by default, at most "
     "round_timeout)"},
    {"client_eval", KEY_BOOL, F(client_eval), "false", 0, 0, NULL,
     "per-client view: every node also evaluates the global model on its own held-out share "
     "of the test set (the test rows cut class by class in proportion to each node's "
     "training rows of the class, so the share has the node's label skew), every eval_every "
     "rounds and after the last, into the ledger (client_evals); needs a test set"},
    {"staleness_kappa", KEY_DOUBLE, F(staleness_kappa), "0.5", 0, 100, NULL,
     "async: an update a rounds old weighs (1 + a)^-kappa"},
    {"ef_decay", KEY_STR, F(ef_decay), "auto", 0, 0, check_ef_decay,
     "error-feedback codecs: when the learning rate falls, scale what each link holds back "
     "by the same ratio: lr | off | auto (lr with adamw, off with sgd)"},
    {"budget_ms", KEY_UINT, F(budget_ms), "200", 0, 3600000, NULL,
     "codec=auto: a link's bytes per round = goodput x max(round compute time, this)"},
    {"transfer", KEY_UINT, F(transfer), "0", 0, 100000000, NULL,
     "direct knowledge transfer: every N rounds peers compare validation loss; 0 = off"},
    {"transfer_lambda", KEY_DOUBLE, F(transfer_lambda), "0.5", 1e-6, 1, NULL,
     "a lagging node merges x = (1 - lambda) x + lambda x_best"},
    {"transfer_margin", KEY_DOUBLE, F(transfer_margin), "0.02", 0, 100, NULL,
     "a node lags when its loss exceeds the best by this fraction"},
    {"eval_every", KEY_UINT, F(eval_every), "10", 1, 100000000, NULL,
     "rounds between test evaluations (peer runs); on the CPU they run on a copy of the model "
     "in a thread of their own while training goes on"},
    {"eval_nodes", KEY_UINT, F(eval_nodes), "1", 0, TD_MAX_RUN_MEMBERS, NULL,
     "how many nodes (the lowest ranks) evaluate every eval_every rounds; 0: every node. Every "
     "node evaluates after the last round. One keeps the others' CPU for training"},
    {"verify_every", KEY_UINT, F(verify_every), "10", 0, 100000000, NULL,
     "sync/overlap with codec none: every N rounds (and after the last, and after a late "
     "join) the members compare a BLAKE2b hash of their shared model; one that differs from "
     "the majority is named and fetches the state from members that agree; 0 = off"},
    {"checkpoint_every", KEY_UINT, F(checkpoint_every), "0", 0, 100000000, NULL,
     "rounds between checkpoints in the ledger (0: off)"},
    {"checkpoint_keep", KEY_UINT, F(checkpoint_keep), "3", 0, 100000000, NULL,
     "checkpoints of a run the ledger keeps, the newest (0: every one)"},
    {"round_timeout", KEY_DOUBLE, F(round_timeout), "30", 0.1, 86400, NULL,
     "seconds a sync round waits for late peers"},
};
#undef F
const size_t td__run_keys_n = sizeof td__run_keys / sizeof td__run_keys[0];
_Static_assert(sizeof td__run_keys / sizeof td__run_keys[0] <= TD__RUN_KEYS_MAX,
               "runspec.c sizes its list of key names by TD__RUN_KEYS_MAX");
