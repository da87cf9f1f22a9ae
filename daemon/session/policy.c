/* policy.c: this node's own limits over the runs it is asked to take part in
 * (loop thread).
 *
 * Every run spec, whether from this node's `trainctl start` or from a peer's
 * RunStart, is checked here before anything of the run is allocated or opened:
 * the memory the run would take (estimated from the model spec without
 * building it: parameters, gradients, activations, optimizer state, the
 * daemon's per-run copies, the evaluation replica and, with checkpoint_every,
 * the copies of the model its checkpoints pass through) against max_model_mb,
 * the batch against max_batch, the BLAS threads against the cores of this
 * machine, the rounds against max_rounds, the ledger space the run's
 * checkpoints would hold at once against max_checkpoint_mb, and the dataset.
 * Datasets are accepted by name (fashion-mnist, text:fortunes), or as files
 * under the data root the operator configured (--data-root); without one, no
 * path at all. A path is resolved with realpath (relative paths against the
 * root), must stay inside the root and must be a regular file, or a folder
 * for images:DIR (one reason for a path that does not exist and one outside
 * the root); the spec's
 * dataset is rewritten to the resolved paths so the loader opens what was
 * checked. init = FILE is resolved the same way; init = RUN[:ROUND] is read
 * from this node's own ledger and written out under DATA_DIR/models/ (no data
 * root involved), so that it is an init = FILE from there on. A refusal's
 * reason names the key, the asked value and the limit, never anything read
 * from a file. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/safetensors.h"
#include "daemon/session/shared.h"
#include "daemon/store/ledger.h"

/* Share of the machine's memory a run may take when max_model_mb is not set. */
#define DEFAULT_MEMORY_DIVISOR 4
/* Per-run copies of the parameters the daemon keeps besides the model's own:
 * the anchor, the outer momentum, the outgoing update and its encoded form,
 * plus one incoming update per member (the round collector). */
#define RUN_COPIES 4
/* Copies of the parameters a run with checkpoints holds besides: the copy the
 * compute thread posts each checkpoint_every rounds (run_apply.c), held in
 * the ledger's write queue (ledgerq.c) until it is written, and SQLite's
 * record of it while it is inserted (the blob is copied into the record).
 * The compute thread copies the next only once that one is written
 * (session.c): a ledger slower than checkpoint_every slows the run instead
 * of queueing copies (it queued one per round: 833 MiB for a run of 543 MiB
 * at checkpoint_every = 1 with 22 MiB of parameters). While the ledger cannot
 * be written at all its queue is bounded by TD__LEDGERQ_BUFFER_BYTES. */
#define CHECKPOINT_COPIES 2
#define SPEC_QUOTE_MAX 64

int td__policy_init(td__policy_t *p, const td__policy_opts_t *o, char *why, size_t why_len) {
  memset(p, 0, sizeof *p);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  p->max_threads = cores > 0 ? (unsigned)cores : 1;
  if (o->max_model_mb > 0)
    p->max_bytes = (uint64_t)o->max_model_mb << 20;
  else if (pages > 0 && page > 0)
    p->max_bytes = (uint64_t)pages * (uint64_t)page / DEFAULT_MEMORY_DIVISOR;
  else
    return td_why(why, why_len, TD_EIO, "cannot read this machine's memory size: set max_model_mb");
  p->max_batch = o->max_batch > 0 ? o->max_batch : TD_POLICY_DEFAULT_MAX_BATCH;
  p->max_rounds = o->max_rounds > 0 ? o->max_rounds : TD_POLICY_DEFAULT_MAX_ROUNDS;
  p->max_checkpoint_bytes =
      (uint64_t)(o->max_checkpoint_mb > 0 ? o->max_checkpoint_mb
                                          : TD_POLICY_DEFAULT_MAX_CHECKPOINT_MB)
      << 20;
  if (o->data_root != NULL && o->data_root[0] != '\0') {
    struct stat st;
    if (realpath(o->data_root, p->data_root) == NULL)
      return td_why(why, why_len, TD_ENOENT, "data root %s: %s", o->data_root, strerror(errno));
    if (stat(p->data_root, &st) != 0 || !S_ISDIR(st.st_mode))
      return td_why(why, why_len, TD_ECONFIG, "data root %s is not a directory", o->data_root);
  }
  if (o->data_dir != NULL)
    snprintf(p->data_dir, sizeof p->data_dir, "%s", o->data_dir);
  return 0;
}

/* Resolve one dataset path under the root into `out`: a regular file, or a
 * folder when want_dir (images:DIR); 0 or TD_ECONFIG + why. */
static int resolve_path(const td__policy_t *p, const char *what, const char *path, size_t len,
                        bool want_dir, char *out, char *why, size_t why_len) {
  char joined[PATH_MAX * 2];
  int q = len > SPEC_QUOTE_MAX ? SPEC_QUOTE_MAX : (int)len;
  if (len == 0 || len >= PATH_MAX)
    return td_why(why, why_len, TD_ECONFIG, "%s path '%.*s' is empty or too long", what, q, path);
  if (path[0] == '/')
    snprintf(joined, sizeof joined, "%.*s", (int)len, path);
  else
    snprintf(joined, sizeof joined, "%s/%.*s", p->data_root, (int)len, path);
  size_t root_len = strlen(p->data_root);
  struct stat st;
  /* realpath only stats and reads links: nothing is opened. A path that
   * does not resolve and one that resolves outside the root get one answer,
   * so a refusal never tells a peer whether something exists out there. */
  if (realpath(joined, out) == NULL ||
      strncmp(out, p->data_root, root_len) != 0 ||
      (out[root_len] != '/' && !(root_len == 1 && p->data_root[0] == '/')))
    return td_why(why, why_len, TD_ECONFIG, "%s path '%.*s' is not a file under the data root %s",
                  what, q, path, p->data_root);
  if (want_dir && (stat(out, &st) != 0 || !S_ISDIR(st.st_mode)))
    return td_why(why, why_len, TD_ECONFIG, "%s path '%.*s' is not a folder", what, q, path);
  if (!want_dir && (stat(out, &st) != 0 || !S_ISREG(st.st_mode)))
    return td_why(why, why_len, TD_ECONFIG, "%s path '%.*s' is not a regular file", what, q, path);
  return 0;
}

static int check_dataset(const td__policy_t *p, td_runspec_t *spec, char *why, size_t why_len) {
  const char *d = spec->dataset;
  if (strcmp(d, "fashion-mnist") == 0 || strcmp(d, "text:fortunes") == 0)
    return 0;
  const char *colon = strchr(d, ':');
  if (colon == NULL) /* not a path form: the loader names what it accepts */
    return 0;
  if (p->data_root[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG,
                  "dataset '%.*s' names files, and this node takes only named datasets "
                  "(fashion-mnist, text:fortunes): its operator set no --data-root",
                  SPEC_QUOTE_MAX, d);
  char resolved[TD_RUNSPEC_STR_MAX];
  size_t used = (size_t)(colon - d) + 1;
  /* images:DIR[,TEST_DIR] names folders; the loader refuses symbolic links
   * inside them, so what it reads stays under the root too */
  bool images = strncmp(d, "images:", 7) == 0;
  memcpy(resolved, d, used);
  const char *s = colon + 1;
  for (;;) {
    size_t len = strcspn(s, ",");
    char real[PATH_MAX];
    int rc = resolve_path(p, "dataset", s, len, images, real, why, why_len);
    if (rc != 0)
      return rc;
    int w = snprintf(resolved + used, sizeof resolved - used, "%s%s", real,
                     s[len] == ',' ? "," : "");
    if (w < 0 || (size_t)w >= sizeof resolved - used)
      return td_why(why, why_len, TD_ECONFIG, "dataset paths are too long once resolved");
    used += (size_t)w;
    if (s[len] == '\0')
      break;
    s += len + 1;
  }
  memcpy(spec->dataset, resolved, used + 1);
  return 0;
}

int td__policy_init_from_run(const char *data_dir, td_runspec_t *spec, char *why, size_t why_len) {
  uint64_t run_id, round;
  if (!td_runspec_init_run(spec->init, &run_id, &round))
    return 0;
  char path[PATH_MAX];
  if (data_dir == NULL || data_dir[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG, "init: %s names a run, and no ledger is at hand",
                  spec->init);
  snprintf(path, sizeof path, "%s/traind.db", data_dir);
  td_ledger_stored_model_t m;
  char inner[512];
  int rc = td_ledger_model_read(path, run_id, round, &m, inner, sizeof inner);
  if (rc != 0)
    return td_why(why, why_len, rc, "init: %s", inner);
  td_layout_t *layout = NULL;
  if ((rc = td_model_spec_layout(m.model, &layout, inner, sizeof inner)) != 0)
    td_why(why, why_len, rc, "init: run %016" PRIx64 "'s model '%.64s': %s", run_id, m.model,
           inner);
  else if (m.bytes != td_layout_numel(layout) * sizeof(float) || m.bytes % sizeof(float) != 0)
    rc = td_why(why, why_len, TD_ECORRUPT,
                "init: the ledger's model of run %016" PRIx64 " has %zu bytes, its model %.64s "
                "needs %zu",
                run_id, m.bytes, m.model, td_layout_numel(layout) * sizeof(float));
  char run_s[17], round_s[24];
  snprintf(run_s, sizeof run_s, "%016" PRIx64, run_id);
  snprintf(round_s, sizeof round_s, "%" PRIu64, m.round);
  if (rc == 0 && snprintf(path, sizeof path, "%s/models", data_dir) > 0 &&
      mkdir(path, 0700) != 0 && errno != EEXIST)
    rc = td_why(why, why_len, TD_EIO, "init: cannot make %s: %s", path, strerror(errno));
  if (rc == 0 &&
      (size_t)snprintf(path, sizeof path, "%s/models/%s-r%s.safetensors", data_dir, run_s,
                       round_s) >= sizeof spec->init)
    rc = td_why(why, why_len, TD_ECONFIG, "init: the data directory's path is too long");
  if (rc == 0) { /* only what the weights decide: equal weights, equal bytes */
    td_safetensors_meta_t meta[] = {{"format", "pt"}, {"producer", "traind"},
                                    {"model", m.model}, {"run_id", run_s}, {"round", round_s}};
    rc = td_safetensors_write(path, layout, (const float *)m.blob, meta,
                              sizeof meta / sizeof *meta, why, why_len); /* malloc'd: aligned */
  }
  if (rc == 0) /* its length was checked above */
    memcpy(spec->init, path, strlen(path) + 1);
  td_layout_free(&layout);
  free(m.model);
  free(m.blob);
  return rc;
}

/* init = FILE: a file under the data root like a dataset's, resolved in
 * place; init = RUN[:ROUND]: this node's ledger's model, written out. */
static int check_init(const td__policy_t *p, td_runspec_t *spec, char *why, size_t why_len) {
  uint64_t run_id, round;
  if (strcmp(spec->init, "none") == 0)
    return 0;
  if (td_runspec_init_run(spec->init, &run_id, &round))
    return td__policy_init_from_run(p->data_dir, spec, why, why_len);
  if (p->data_root[0] == '\0')
    return td_why(why, why_len, TD_ECONFIG,
                  "init '%.*s' names a file, and this node reads no files for runs: its "
                  "operator set no --data-root",
                  SPEC_QUOTE_MAX, spec->init);
  char real[PATH_MAX];
  int rc = resolve_path(p, "init", spec->init, strlen(spec->init), false, real, why, why_len);
  if (rc != 0)
    return rc;
  if (strlen(real) >= sizeof spec->init)
    return td_why(why, why_len, TD_ECONFIG, "the init path is too long once resolved");
  snprintf(spec->init, sizeof spec->init, "%s", real);
  return 0;
}

/* The checkpoints a run would hold in the ledger at once. A run sized by
 * epochs that keeps every checkpoint (checkpoint_keep = 0) has no round count
 * until its dataset is loaded: the run checks it then, before its first round
 * (run_compute.c), as it checks those rounds against max_rounds. */
static int check_checkpoints(const td__policy_t *p, const td_runspec_t *spec, uint64_t params,
                             char *why, size_t why_len) {
  if (spec->rounds == 0 && spec->checkpoint_keep == 0)
    return 0;
  uint64_t rounds = spec->rounds > 0 ? spec->rounds : UINT64_MAX;
  return td_runspec_check_checkpoints(spec, rounds, params, p->max_checkpoint_bytes, why, why_len);
}

int td__policy_check(const td__policy_t *p, td_runspec_t *spec, size_t n_members, char *why,
                     size_t why_len) {
  if (spec->batch > p->max_batch)
    return td_why(why, why_len, TD_ERANGE, "batch %u is over this node's limit %u (--max-batch)",
                  spec->batch, p->max_batch);
  if (spec->threads > p->max_threads)
    return td_why(why, why_len, TD_ERANGE, "threads %u is more than this node's %u cores",
                  spec->threads, p->max_threads);
  if (spec->rounds > p->max_rounds)
    return td_why(why, why_len, TD_ERANGE, "rounds %u is over this node's limit %u (--max-rounds)",
                  spec->rounds, p->max_rounds);
  uint64_t params = 0, bytes = 0;
  int rc = td_model_estimate(spec->model, (int)spec->batch, &params, &bytes, why, why_len);
  if (rc != 0)
    return rc;
  uint64_t states = spec->optimizer_kind == TD_OPTIM_ADAMW ? 2 : 1;
  /* x 2: the model and its optimizer state once more for the replica that
   * evaluates beside training (run_eval.c); whether this node will open one
   * (its rank, its backend) is not known yet, so it is always counted */
  uint64_t copies = RUN_COPIES + n_members + (spec->checkpoint_every > 0 ? CHECKPOINT_COPIES : 0);
  td_agg_spec_t agg;
  td_runspec_agg(spec, &agg);
  if (td_runspec_reconciles(spec) && (agg.kind != TD_AGG_MEAN || agg.norm_bound > 0))
    copies += (3 * n_members + 1) / 2; /* a robust reconciliation: each anchor in fp16, then fp32 */
  bytes = 2 * (bytes + params * sizeof(float) * states) + params * sizeof(float) * copies;
  if (bytes > p->max_bytes)
    return td_why(why, why_len, TD_ERANGE,
                  "model %.*s at batch %u needs about %" PRIu64 " MiB (%" PRIu64
                  " parameters), over this node's limit of %" PRIu64 " MiB (--max-model-mb)",
                  SPEC_QUOTE_MAX, spec->model, spec->batch, (bytes + (1u << 20) - 1) >> 20,
                  params, p->max_bytes >> 20);
  if ((rc = check_checkpoints(p, spec, params, why, why_len)) != 0)
    return rc;
  if ((rc = check_init(p, spec, why, why_len)) != 0)
    return rc;
  return check_dataset(p, spec, why, why_len);
}
