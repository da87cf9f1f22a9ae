/* runspec.c: a run's spec from its keys: defaults, `key=value` arguments and
 * ini files parsed by the one table of runkeys.c, the checks across keys
 * (td_runspec_validate), the canonical text every node hashes and agrees on,
 * and the help. Defaults, parsing, help and formatting all walk that table. */
#include "daemon/run/runspec.h"
#include "daemon/run/runkeys.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/textfile.h"
#include "common/numfmt.h"
#include "common/suggest.h"
#include "compute/optim.h"
#include "compute/data/text.h"
#include "compress/codec.h"
#include "scheduler/overlap.h"
#include "scheduler/recon.h"

#define N_KEYS td__run_keys_n

static const run_key_t *find_key(const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(td__run_keys[i].name, name) == 0)
      return &td__run_keys[i];
  return NULL;
}

static int parse_value(td_runspec_t *rs, const run_key_t *k, const char *value, char *why,
                       size_t n) {
  char *field = (char *)rs + k->offset;
  char *end;
  if (value[0] == '\0')
    return td_why(why, n, TD_ECONFIG, "%s: empty value", k->name);
  switch (k->type) {
  case KEY_STR: {
    if (strlen(value) >= TD_RUNSPEC_STR_MAX)
      return td_why(why, n, TD_ECONFIG, "%s: value longer than %d bytes", k->name,
                    TD_RUNSPEC_STR_MAX - 1);
    if (k->check) {
      char sub[512] = "";
      int rc = k->check(rs, value, sub, sizeof sub);
      if (rc != 0 && strncmp(sub, k->name, strlen(k->name)) == 0) /* it names the key */
        return td_why(why, n, TD_ECONFIG, "%s", sub);
      if (rc != 0)
        return td_why(why, n, TD_ECONFIG, "%s: %s", k->name, sub);
    }
    memmove(field, value, strlen(value) + 1);
    return 0;
  }
  case KEY_UINT:
  case KEY_U64: {
    errno = 0;
    if (value[0] == '-' || value[0] == '+')
      goto bad_int;
    unsigned long long v = strtoull(value, &end, 10);
    if (end == value || *end != '\0' || errno != 0)
      goto bad_int;
    if (k->type == KEY_UINT) {
      if ((double)v < k->min || (double)v > k->max)
        return td_why(why, n, TD_ECONFIG, "%s: %llu is out of range [%.0f, %.0f]", k->name, v,
                      k->min, k->max);
      *(unsigned *)(void *)field = (unsigned)v;
    } else {
      *(uint64_t *)(void *)field = (uint64_t)v;
    }
    return 0;
  bad_int:
    return td_why(why, n, TD_ECONFIG, "%s: '%s' is not a non-negative integer", k->name, value);
  }
  case KEY_DOUBLE: {
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || errno == ERANGE || !isfinite(v))
      return td_why(why, n, TD_ECONFIG, "%s: '%s' is not a finite number", k->name, value);
    if (v < k->min || v > k->max)
      return td_why(why, n, TD_ECONFIG, "%s: %g is out of range [%g, %g]", k->name, v, k->min,
                    k->max);
    *(double *)(void *)field = v;
    return 0;
  }
  case KEY_BOOL:
    if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes") ||
        !strcmp(value, "on")) {
      *(bool *)(void *)field = true;
      return 0;
    }
    if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no") ||
        !strcmp(value, "off")) {
      *(bool *)(void *)field = false;
      return 0;
    }
    return td_why(why, n, TD_ECONFIG, "%s: '%s' is not a boolean (true/false)", k->name, value);
  }
  return td_why(why, n, TD_ECONFIG, "%s: unsupported key type", k->name);
}

void td_runspec_defaults(td_runspec_t *rs) {
  memset(rs, 0, sizeof *rs);
  for (size_t i = 0; i < N_KEYS; i++) {
    int rc = parse_value(rs, &td__run_keys[i], td__run_keys[i].default_value, NULL, 0);
    (void)rc; /* defaults are constants checked by test_runspec */
  }
}

int td_runspec_set(td_runspec_t *rs, const char *key, const char *value, char *why,
                   size_t why_len) {
  const run_key_t *k = find_key(key);
  if (k == NULL) { /* every key (about 780 bytes today), and the nearest first */
    const char *names[TD__RUN_KEYS_MAX];
    for (size_t i = 0; i < N_KEYS; i++)
      names[i] = td__run_keys[i].name;
    char msg[2048];
    return td_why(why, why_len, TD_ECONFIG, "%s",
                  td_suggest_unknown(msg, sizeof msg, "key", key, names, N_KEYS));
  }
  return parse_value(rs, k, value, why, why_len);
}

int td_runspec_set_arg(td_runspec_t *rs, const char *arg, char *why, size_t why_len) {
  const char *eq = strchr(arg, '=');
  if (eq == NULL || eq == arg)
    return td_why(why, why_len, TD_ECONFIG, "expected key=value, got '%s'", arg);
  char key[64];
  size_t klen = (size_t)(eq - arg);
  while (klen > 0 && arg[klen - 1] == ' ')
    klen--;
  if (klen >= sizeof key)
    return td_why(why, why_len, TD_ECONFIG, "key too long in '%s'", arg);
  memcpy(key, arg, klen);
  key[klen] = '\0';
  const char *value = eq + 1;
  while (*value == ' ')
    value++;
  return td_runspec_set(rs, key, value, why, why_len);
}

typedef struct {
  td_runspec_t *rs;
  char *why;
  size_t why_len;
  int rc;
} ini_ctx_t;

static int on_ini_pair(void *user, const char *section, const char *name, const char *value) {
  ini_ctx_t *ctx = user;
  if (ctx->rc != 0)
    return 0;
  if (section[0] != '\0' && strcmp(section, "run") != 0) {
    ctx->rc = td_why(ctx->why, ctx->why_len, TD_ECONFIG,
                     "unknown section [%s] (run keys go at top level or in [run])", section);
    return 0;
  }
  ctx->rc = td_runspec_set(ctx->rs, name, value, ctx->why, ctx->why_len);
  return ctx->rc == 0;
}

/* The result of ini_parse_file / ini_parse_string turned into a reason. */
static int ini_result(int line, const ini_ctx_t *ctx, const char *sub, const char *path,
                      char *why, size_t why_len) {
  if (line == 0)
    return 0;
  if (line < 0)
    return td_why(why, why_len, TD_EIO, "cannot read %s", path);
  if (ctx->rc != 0)
    return td_why(why, why_len, TD_ECONFIG, "%s:%d: %s", path, line, sub);
  return td_why(why, why_len, TD_ECONFIG, "%s:%d: syntax error (expected key = value)", path,
                line);
}

int td_runspec_read_file(const char *path, char **text, char *why, size_t why_len) {
  return td_textfile_read(path, TD_RUNSPEC_FILE_MAX, "a run file", text, why, why_len);
}

int td_runspec_load_ini(td_runspec_t *rs, const char *path, char *why, size_t why_len) {
  char *text;
  int rc = td_runspec_read_file(path, &text, why, why_len);
  if (rc != 0)
    return rc;
  rc = td_runspec_load_ini_text(rs, text, path, why, why_len);
  free(text);
  return rc;
}

int td_runspec_load_ini_text(td_runspec_t *rs, const char *text, const char *origin, char *why,
                             size_t why_len) {
  char sub[768] = "";
  ini_ctx_t ctx = {.rs = rs, .why = sub, .why_len = sizeof sub, .rc = 0};
  int line = ini_parse_string(text, on_ini_pair, &ctx);
  return ini_result(line, &ctx, sub, origin, why, why_len);
}

/* Token models (gpt) read text; every other model reads features. */
static bool token_model(const char *model) { return strncmp(model, "gpt:", 4) == 0; }

const char *td_runspec_dataset(const td_runspec_t *rs) {
  if (strcmp(rs->dataset, "auto") != 0)
    return rs->dataset;
  return token_model(rs->model) ? TD_TEXT_DEFAULT_SPEC : "fashion-mnist";
}

bool td_runspec_ef_decays(const td_runspec_t *rs) {
  if (rs->ef_decay_kind == TD_EF_DECAY_AUTO)
    return rs->optimizer_kind == TD_OPTIM_ADAMW;
  return rs->ef_decay_kind == TD_EF_DECAY_LR;
}

bool td_runspec_is_text(const td_runspec_t *rs) {
  return strncmp(td_runspec_dataset(rs), "text:", 5) == 0;
}

void td_runspec_optim_opts(const td_runspec_t *rs, td_optim_opts_t *out) {
  *out = (td_optim_opts_t){.kind = (td_optim_kind_t)rs->optimizer_kind,
                           .weight_decay = rs->weight_decay,
                           .clip = rs->clip,
                           .momentum = rs->momentum,
                           .nesterov = rs->nesterov,
                           .beta1 = rs->beta1,
                           .beta2 = rs->beta2,
                           .eps = rs->eps};
}

void td_runspec_outer_opts(const td_runspec_t *rs, td_outer_opts_t *out) {
  *out = (td_outer_opts_t){.kind = (td_outer_kind_t)rs->outer_kind,
                           .lr = rs->outer_lr,
                           .momentum = rs->outer_momentum,
                           .nesterov = rs->outer_nesterov,
                           .clip = rs->outer_clip,
                           .beta1 = rs->outer_beta1,
                           .beta2 = rs->outer_beta2,
                           .tau = rs->outer_tau};
}

/* fragments > 1 (scheduler/fragment.h) with what it cannot split: each
 * refusal says what to change. */
static int check_fragments(const td_runspec_t *rs, char *why, size_t why_len) {
  if (rs->fragments <= 1)
    return 0;
  unsigned p = rs->fragments;
  if (rs->mode_kind == TD_MODE_ASYNC)
    return td_why(why, why_len, TD_ECONFIG,
                  "fragments = %u: needs rounds (mode sync or overlap); async adds each update "
                  "as it arrives", p);
  if (rs->outer_kind != TD_OUTER_SGD)
    return td_why(why, why_len, TD_ECONFIG,
                  "fragments = %u: needs outer = sgd (outer = %s keeps its moments in two "
                  "halves that do not split by fragment yet); set fragments = 1", p, rs->outer);
  td_codec_spec_t codec;
  if (rs->codec_auto || (td_codec_parse(&codec, rs->codec, NULL, 0) == 0 &&
                         !td_codec_slices_feedback(&codec)))
    return td_why(why, why_len, TD_ECONFIG,
                  "fragments = %u: codec %s keeps each link's error feedback over whole "
                  "tensors (or switches codecs), which does not split by fragment; use codec "
                  "none, fp16, ternary, qsgd or topk", p, rs->codec);
  if (rs->mode_kind == TD_MODE_OVERLAP) {
    if (rs->overlap_fix_kind != TD_OVERLAP_FIX_PULL)
      return td_why(why, why_len, TD_ECONFIG,
                    "fragments = %u: overlap_fix = %s does not apply; a fragment's late "
                    "average is mixed in by fragment_alpha instead (leave overlap_fix unset)",
                    p, rs->overlap_fix);
    if (rs->overlap_early || rs->overlap_fill > 0)
      return td_why(why, why_len, TD_ECONFIG,
                    "fragments = %u: %s is not supported with fragments; set fragments = 1",
                    p, rs->overlap_early ? "overlap_early" : "overlap_fill");
  }
  return 0;
}

/* strategy = scaffold with what it was not built for: each refusal says
 * what to change (docs/algorithms.md#scaffold says why each is needed). */
static int check_scaffold(const td_runspec_t *rs, const td_agg_spec_t *agg, char *why,
                          size_t why_len) {
  if (!rs->scaffold)
    return 0;
  const char *no = NULL;
  if (rs->mode_kind != TD_MODE_SYNC)
    no = "needs mode = sync (the control variates move with each round's average)";
  else if (rs->weighted_batching)
    no = "needs batching = equal (c is derived from the round's average only when every "
         "node's steps have the same learning-rate sum)";
  else if (rs->optimizer_kind != TD_OPTIM_SGD || rs->momentum > 0 || rs->clip > 0)
    no = "needs optimizer = sgd with momentum = 0 and clip = 0 (option II reads a round's "
         "displacement over its learning-rate sum as the mean gradient; momentum scales it by "
         "about 1/(1 - momentum), AdamW and clipping change it per step)";
  else if (strncmp(rs->lr_schedule, "step", 4) == 0)
    no = "needs lr_schedule = constant or cosine (step:E counts each node's own epochs, so "
         "the learning-rate sums differ between nodes)";
  else if (strcmp(rs->backend, "cuda") == 0)
    no = "needs backend = cpu (the correction is not built for device memory)";
  else if (rs->fragments > 1)
    no = "needs fragments = 1 (c is derived from the whole model's average)";
  else if (agg->kind != TD_AGG_MEAN || agg->norm_bound > 0)
    no = "needs aggregate = mean and no norm_bound (c is derived from the plain mean)";
  else if (strcmp(rs->codec, "none") != 0)
    no = "needs codec = none (a lossy codec's error would build up between the nodes' ci and "
         "the c derived from the decoded average; docs/algorithms.md#scaffold)";
  else if (rs->min_updates > 0 || rs->deadline_mad_c > 0)
    no = "needs round_deadline = fixed and no min_updates (c counts the sampled nodes as "
         "the round's contributors)";
  else if (rs->prox_mu > 0)
    no = "with prox_mu > 0 is not built; use one of the two";
  if (no != NULL)
    return td_why(why, why_len, TD_ECONFIG, "strategy = scaffold: %s", no);
  return 0;
}

int td_runspec_validate(const td_runspec_t *rs, char *why, size_t why_len) {
  bool text = td_runspec_is_text(rs);
  if (token_model(rs->model) && !text)
    return td_why(why, why_len, TD_ECONFIG,
                  "model %s reads byte tokens but dataset %s has image or CSV features "
                  "(use text:PATH, text:fortunes or leave dataset unset)",
                  rs->model, rs->dataset);
  if (!token_model(rs->model) && text)
    return td_why(why, why_len, TD_ECONFIG,
                  "model %s reads float features but dataset %s is text "
                  "(use a gpt:L-W-H-T model)",
                  rs->model, td_runspec_dataset(rs));
  if (rs->nesterov && rs->optimizer_kind != TD_OPTIM_SGD)
    return td_why(why, why_len, TD_ECONFIG, "nesterov: applies to optimizer = sgd, not %s",
                  rs->optimizer);
  if (rs->nesterov && rs->momentum <= 0)
    return td_why(why, why_len, TD_ECONFIG, "nesterov: needs momentum > 0");
  if (rs->outer_nesterov && rs->outer_momentum <= 0)
    return td_why(why, why_len, TD_ECONFIG, "outer_nesterov: needs outer_momentum > 0");
  if (rs->outer_kind != TD_OUTER_SGD &&
      (rs->outer_momentum > 0 || rs->outer_nesterov || rs->outer_clip > 0))
    return td_why(why, why_len, TD_ECONFIG,
                  "%s: applies to outer = sgd; outer = %s keeps its own first moment "
                  "(outer_beta1)",
                  rs->outer_momentum > 0 ? "outer_momentum"
                  : rs->outer_nesterov   ? "outer_nesterov"
                                         : "outer_clip",
                  rs->outer);
  if (rs->participation > 1 && rs->participation != floor(rs->participation))
    return td_why(why, why_len, TD_ECONFIG,
                  "participation: %g is neither a fraction in (0, 1] nor a whole number of "
                  "members", rs->participation);
  bool samples = rs->participation != 1, straggles = rs->min_updates > 0 || rs->deadline_mad_c > 0;
  if ((samples || straggles) && rs->mode_kind != TD_MODE_SYNC)
    return td_why(why, why_len, TD_ECONFIG,
                  "%s: needs mode = sync (rounds that wait for their average)",
                  samples ? "participation" : rs->min_updates > 0 ? "min_updates"
                                                                  : "round_deadline");
  if (rs->clients > 1 && rs->mode_kind != TD_MODE_SYNC)
    return td_why(why, why_len, TD_ECONFIG,
                  "clients = %u: needs mode = sync (a node trains its clients in turn within "
                  "a round that waits for its average)",
                  rs->clients);
  if (rs->clients > 1 && rs->fragments > 1)
    return td_why(why, why_len, TD_ECONFIG,
                  "clients = %u with fragments = %u: not built (a client's update covers the "
                  "whole model); use one of the two",
                  rs->clients, rs->fragments);
  if (rs->clients > 1 && strcmp(rs->partition, "all") == 0)
    return td_why(why, why_len, TD_ECONFIG,
                  "clients = %u: needs a partition that splits the data (iid, dirichlet:A or "
                  "shard:S), not all",
                  rs->clients);
  if (rs->outer_kind != TD_OUTER_SGD && rs->mode_kind == TD_MODE_ASYNC)
    return td_why(why, why_len, TD_ECONFIG,
                  "outer = %s: needs rounds (mode sync or overlap); async adds each update as "
                  "it arrives, with no round average to step on",
                  rs->outer);
  td_agg_spec_t agg;
  td_runspec_agg(rs, &agg);
  if (rs->mode_kind == TD_MODE_ASYNC && (agg.kind != TD_AGG_MEAN || agg.norm_bound > 0))
    return td_why(why, why_len, TD_ECONFIG,
                  "%s = %s: needs rounds (mode sync or overlap); async adds each update as "
                  "it arrives", agg.kind != TD_AGG_MEAN ? "aggregate" : "norm_bound",
                  agg.kind != TD_AGG_MEAN ? rs->aggregate : rs->norm_bound);
  if ((agg.kind != TD_AGG_MEAN || agg.norm_bound > 0) && td_runspec_reconciles(rs) &&
      rs->reconcile_via_kind == TD_RECON_VIA_HUB)
    return td_why(why, why_len, TD_ECONFIG,
                  "reconcile_via = hub: every member would take the hub's mean on trust, "
                  "which %s = %s is there to prevent; use mesh or auto (which reconcile "
                  "through the mesh under a robust rule)",
                  agg.kind != TD_AGG_MEAN ? "aggregate" : "norm_bound",
                  agg.kind != TD_AGG_MEAN ? rs->aggregate : rs->norm_bound);
  int rc = check_scaffold(rs, &agg, why, why_len);
  if (rc != 0)
    return rc;
  rc = check_fragments(rs, why, why_len);
  return rc != 0 ? rc : td_runspec_check_topology(rs, why, why_len);
}

size_t td_runspec_format(const td_runspec_t *rs, char *buf, size_t len) {
  size_t used = 0;
  for (size_t i = 0; i < N_KEYS; i++) {
    const run_key_t *k = &td__run_keys[i];
    const char *field = (const char *)rs + k->offset;
    char *dst = buf ? buf + (used < len ? used : len) : NULL;
    size_t room = used < len ? len - used : 0;
    int w = 0;
    switch (k->type) {
    case KEY_STR: w = snprintf(dst, room, "%s = %s\n", k->name, field); break;
    case KEY_UINT:
      w = snprintf(dst, room, "%s = %u\n", k->name, *(const unsigned *)(const void *)field);
      break;
    case KEY_U64:
      w = snprintf(dst, room, "%s = %" PRIu64 "\n", k->name,
                   *(const uint64_t *)(const void *)field);
      break;
    case KEY_DOUBLE: { /* shortest round-trip: lr = 0.05, not 0.050000000000000003 */
      char num[40];
      w = snprintf(dst, room, "%s = %s\n", k->name,
                   td_numfmt_exact(num, sizeof num, *(const double *)(const void *)field));
      break;
    }
    case KEY_BOOL:
      w = snprintf(dst, room, "%s = %s\n", k->name,
                   *(const bool *)(const void *)field ? "true" : "false");
      break;
    }
    used += (size_t)(w > 0 ? w : 0);
  }
  return used;
}

void td_runspec_print_help(FILE *out) {
  for (size_t i = 0; i < N_KEYS; i++) {
    const run_key_t *k = &td__run_keys[i];
    fprintf(out, "  %-16s %-20s %s", k->name, k->default_value, k->help);
    if (k->type == KEY_UINT) /* the ranges parse_value enforces, as its errors print them */
      fprintf(out, " (range %.0f to %.0f)", k->min, k->max);
    else if (k->type == KEY_DOUBLE)
      fprintf(out, " (range %g to %g)", k->min, k->max);
    fputc('\n', out);
  }
}
