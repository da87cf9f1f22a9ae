/* test_runspec.c: run keys. Defaults are valid, every bad value is refused
 * with a reason that names the key, INI files and --set flags go through the
 * same table, the canonical text form round-trips through an INI file, and
 * the aggregation keys resolve `auto` and refuse a robust rule without rounds
 * or with a hub for the anchors. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/optim.h"
#include "daemon/run/runspec.h"
#include "scheduler/overlap.h"

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/td-runspec-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static char *write_file(const char *name, const char *text) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return path;
}

START_TEST(defaults_are_valid_and_documented) {
  td_runspec_t rs;
  char why[256] = "";
  td_runspec_defaults(&rs);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_str_eq(rs.model, "mlp:784-256-128-10");
  ck_assert_str_eq(rs.dataset, "auto");
  ck_assert_str_eq(rs.partition, "iid");
  ck_assert_uint_eq(rs.node_rank, 0);
  ck_assert_uint_eq(rs.node_count, 1);
  ck_assert_uint_eq(rs.batch, 64);
  char text[4096];
  size_t need = td_runspec_format(&rs, text, sizeof text);
  ck_assert_uint_lt(need, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "model = mlp:784-256-128-10\n"));
  /* doubles in their shortest round-trip form (not 0.050000000000000003) */
  ck_assert_ptr_nonnull(strstr(text, "lr = 0.05\n"));
}
END_TEST

START_TEST(set_parses_every_type) {
  td_runspec_t rs;
  char why[256];
  td_runspec_defaults(&rs);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "batch=256", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "lr = 0.1", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "nesterov=true", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "seed=18446744073709551615", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "partition=dirichlet:0.5", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "node=2/5", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "lr_schedule=step:2:0.5", why, sizeof why), 0);
  ck_assert_uint_eq(rs.batch, 256);
  ck_assert_double_eq(rs.lr, 0.1);
  ck_assert(rs.nesterov);
  ck_assert_uint_eq(rs.seed, UINT64_MAX);
  ck_assert_str_eq(rs.partition, "dirichlet:0.5");
  ck_assert_uint_eq(rs.node_rank, 2);
  ck_assert_uint_eq(rs.node_count, 5);
}
END_TEST

/* Each bad setting must fail with TD_ECONFIG and a reason naming the key. */
START_TEST(bad_values_are_refused_with_the_key_named) {
  static const char *bad[][2] = {
      {"batch", "0"},          {"batch", "abc"},         {"batch", "-5"},
      {"batch", "99999999"},   {"lr", "nan"},            {"lr", "-1"},
      {"lr", "1e999"},         {"momentum", "1.5"},      {"nesterov", "maybe"},
      {"model", "mlp:784"},    {"model", "cnn:1-2"},     {"model", "mlp:784-0-10"},
      {"partition", "dirichlet:0"}, {"partition", "bogus"}, {"lr_schedule", "bogus"},
      {"node", "3/2"},         {"node", "1"},            {"node", "-1/2"},
      {"dataset", "foo"},      {"backend", "tpu"},       {"epochs", "0"},
      {"threads", "x"},        {"seed", "1.5"},          {"batch", ""},
      {"mode", "async"},       {"mode", "async:-1"},     {"mode", "gossip"},
      {"local_steps", "0"},    {"local_steps", "qsr:0:4"}, {"local_steps", "qsr:0.1"},
      {"local_steps", "qsr:x:4"}, {"codec", "autox"},    {"batching", "fair"},
      {"slowdown", "0.5"},     {"slowdown", "2,,3"},     {"slowdown", "nan"},
      {"outer_lr", "0"},       {"outer_momentum", "1"},  {"staleness_kappa", "-1"},
      {"optimizer", "adam"},   {"optimizer", "SGD"},     {"beta1", "1"},
      {"beta1", "-0.1"},       {"beta2", "1"},           {"beta2", "x"},
      {"eps", "0"},            {"eps", "-1e-8"},         {"eps", "2"},
      {"clip", "-1"},          {"clip", "inf"},          {"dataset", "text:"},
      {"backend", "cuda:x"},   {"backend", "cuda:"},     {"backend", "gpu"},
      {"prox_mu", "-0.1"},     {"prox_mu", "nan"},       {"outer", "fedavg"},
      {"participation", "0"},  {"participation", "4097"},  {"min_updates", "65"},
      {"round_deadline", "adaptive:0.1"}, {"round_deadline", "mad"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    td_runspec_t rs;
    char why[512] = "";
    td_runspec_defaults(&rs);
    int rc = td_runspec_set(&rs, bad[i][0], bad[i][1], why, sizeof why);
    ck_assert_msg(rc == TD_ECONFIG, "%s=%s accepted", bad[i][0], bad[i][1]);
    ck_assert_msg(strstr(why, bad[i][0]) != NULL, "why '%s' does not name %s", why, bad[i][0]);
  }
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert_int_eq(td_runspec_set(&rs, "bogus_key", "1", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "bogus_key"));
  /* a typo: the nearest key suggested, and every key listed, the last too */
  char long_why[1024] = "";
  ck_assert_int_eq(td_runspec_set(&rs, "codc", "topk:0.01", long_why, sizeof long_why),
                   TD_ECONFIG);
  ck_assert_ptr_nonnull(
      strstr(long_why, "unknown key 'codc': did you mean 'codec'? (known: model, "));
  ck_assert_ptr_nonnull(strstr(long_why, ", checkpoint_keep, round_timeout)"));
  /* every name listed is a key, and every key is listed (one help line each) */
  char *list = strstr(long_why, "(known: ") + strlen("(known: ");
  list[strlen(list) - 1] = '\0';
  size_t listed = 0;
  for (char *save = NULL, *name = strtok_r(list, ", ", &save); name != NULL;
       name = strtok_r(NULL, ", ", &save), listed++) {
    char key_why[256] = "";
    td_runspec_set(&rs, name, "", key_why, sizeof key_why);
    ck_assert_msg(strstr(key_why, "unknown key") == NULL, "%s: %s", name, key_why);
  }
  char *help = NULL;
  size_t help_len = 0;
  FILE *mem = open_memstream(&help, &help_len);
  td_runspec_print_help(mem);
  fclose(mem);
  size_t keys = 0;
  for (const char *p = help; *p; p++)
    keys += *p == '\n';
  free(help);
  ck_assert_uint_eq(listed, keys);
  td_runspec_defaults(&rs);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "noequals", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "=1", why, sizeof why), TD_ECONFIG);
  /* cross-key rule */
  td_runspec_set(&rs, "momentum", "0", why, sizeof why);
  td_runspec_set(&rs, "nesterov", "true", why, sizeof why);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "nesterov"));
  td_runspec_defaults(&rs);
  td_runspec_set(&rs, "outer_nesterov", "true", why, sizeof why);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "outer_momentum"));
}
END_TEST

/* outer = adam | yogi | adagrad: parsed into the outer step's options;
 * sgd's own keys and async mode are refused with the key named. */
START_TEST(outer_optimizer_keys_parse_and_refuse_mixtures) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  td_outer_opts_t o;
  td_runspec_outer_opts(&rs, &o);
  ck_assert_int_eq(o.kind, TD_OUTER_SGD);
  ck_assert(!td_outer_needs_buffer(&o)); /* the default is plain averaging */
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer=yogi", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_lr=0.03", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_beta2=0.999", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_tau=1e-4", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  td_runspec_outer_opts(&rs, &o);
  ck_assert_int_eq(o.kind, TD_OUTER_YOGI);
  ck_assert(o.lr == 0.03 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.tau == 1e-4);
  ck_assert_uint_eq(td_outer_state_floats(&o, 10), 20);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer=Adam", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why,
                   "outer: 'Adam' is not an outer optimizer (accepted: sgd, adam, yogi, adagrad)");
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_tau=0", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "outer_tau"));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_beta1=1", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer_momentum=0.9", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "outer_momentum: applies to outer = sgd"));
  td_runspec_defaults(&rs);
  td_runspec_set_arg(&rs, "outer=adagrad", why, sizeof why);
  td_runspec_set_arg(&rs, "mode=async:2", why, sizeof why);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "outer = adagrad: needs rounds"));
}
END_TEST

/* strategy = scaffold: accepted with batching = equal and momentum 0 (and
 * participation, outer = adam, clients), refused one line each where the derivation of c from the
 * round's average does not hold or what it was not built for. */
START_TEST(scaffold_is_accepted_where_built_and_refused_elsewhere) {
  static const char *const refused[][2] = {
      {"batching", "weighted"}, {"lr_schedule", "step:1"}, {"codec", "fp16"},
      {"codec", "topk:0.1"},    {"aggregate", "median"},
      {"mode", "overlap"},      {"min_updates", "1"},      {"prox_mu", "0.1"},
      {"backend", "cuda"},      {"fragments", "2"},        {"momentum", "0.9"},
      {"optimizer", "adamw"},   {"clip", "1"}};
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert(!rs.scaffold);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "strategy=fedprox", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "accepted: fedavg, scaffold"));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "strategy=scaffold", why, sizeof why), 0);
  ck_assert(rs.scaffold);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG); /* weighted batching */
  ck_assert_int_eq(td_runspec_set_arg(&rs, "batching=equal", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG); /* momentum 0.9 */
  ck_assert_ptr_nonnull(strstr(why, "needs optimizer = sgd with momentum = 0"));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "momentum=0", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "participation=0.5", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "outer=adam", why, sizeof why), 0);
  ck_assert_msg(td_runspec_validate(&rs, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "clients=8", why, sizeof why), 0); /* a ci each */
  ck_assert_msg(td_runspec_validate(&rs, why, sizeof why) == 0, "%s", why);
  td_runspec_set_arg(&rs, "clients=1", why, sizeof why);
  td_runspec_set_arg(&rs, "participation=1", why, sizeof why); /* its own refusal outside sync */
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    td_runspec_t bad = rs;
    char one[512] = "";
    ck_assert_int_eq(td_runspec_set(&bad, refused[i][0], refused[i][1], one, sizeof one), 0);
    ck_assert_msg(td_runspec_validate(&bad, one, sizeof one) == TD_ECONFIG &&
                      strstr(one, "scaffold") != NULL && strchr(one, '\n') == NULL,
                  "%s = %s: '%s'", refused[i][0], refused[i][1], one);
  }
}
END_TEST

/* participation, min_updates, round_deadline: parsed, and refused outside
 * sync mode or as a fraction above 1. */
START_TEST(sampling_and_straggler_keys) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert(rs.participation == 1 && rs.min_updates == 0 && rs.deadline_mad_c == 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "round_deadline=adaptive", why, sizeof why), 0);
  ck_assert(rs.deadline_mad_c == 3);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "round_deadline=adaptive:2.5", why, sizeof why), 0);
  ck_assert(rs.deadline_mad_c == 2.5);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "participation=0.1", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "min_updates=3", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "participation=2.5", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "participation: 2.5 is neither a fraction"));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "participation=3", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "mode=overlap", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "participation: needs mode = sync (rounds that wait for their average)");
  td_runspec_defaults(&rs);
  td_runspec_set_arg(&rs, "mode=async:2", why, sizeof why);
  td_runspec_set_arg(&rs, "min_updates=2", why, sizeof why);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "min_updates: needs mode = sync"));
}
END_TEST

/* The scheduler keys fill their parsed fields, and slowdown lists are per rank. */
/* optimizer keys: defaults, parsed kind, and the cross-key rule for nesterov */
/* `--set codec=topk:2`: the codec's own parser names the parameter and its
 * range; an unknown codec lists every one, auto included. */
START_TEST(codec_with_a_bad_parameter_names_it_and_its_range) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "codec=topk:2", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "codec topk: density 2 is out of range (0, 1]");
  ck_assert_int_eq(td_runspec_set_arg(&rs, "codec=powersgd:x", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "codec powersgd: rank 'x' is not a whole number in [1, 256]");
  ck_assert_int_eq(td_runspec_set_arg(&rs, "codec=zstd", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "codec 'zstd' is unknown (accepted: auto, none, fp16, ternary[:base3], "
                        "topk:DENSITY, powersgd:RANK, qsgd:LEVELS)");
}
END_TEST

/* overlap_fix: pull by default, each choice parsed to its kind and written
 * back (peers get the spec as text), dc's lambda parsed and range-checked,
 * anything else refused naming them. */
START_TEST(overlap_fix_defaults_parses_and_refuses) {
  td_runspec_t rs;
  char why[512] = "", text[8192];
  td_runspec_defaults(&rs);
  ck_assert_str_eq(rs.overlap_fix, "pull");
  ck_assert_uint_eq(rs.overlap_fix_kind, TD_OVERLAP_FIX_PULL);
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "none", why, sizeof why), 0);
  ck_assert_uint_eq(rs.overlap_fix_kind, TD_OVERLAP_FIX_NONE);
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "eager", why, sizeof why), 0);
  ck_assert_uint_eq(rs.overlap_fix_kind, TD_OVERLAP_FIX_EAGER);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  td_runspec_format(&rs, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "overlap_fix = eager\n"));
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "guess", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "overlap_fix: unknown fix 'guess' (accepted: pull, none, eager, "
                        "dc:LAMBDA with LAMBDA >= 0)");
  /* the refused value changed nothing */
  ck_assert_uint_eq(rs.overlap_fix_kind, TD_OVERLAP_FIX_EAGER);
  /* dc:LAMBDA */
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "dc:2.5e6", why, sizeof why), 0);
  ck_assert_uint_eq(rs.overlap_fix_kind, TD_OVERLAP_FIX_DC);
  ck_assert(rs.overlap_dc_lambda == 2.5e6);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  td_runspec_format(&rs, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "overlap_fix = dc:2.5e6\n"));
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "dc:0", why, sizeof why), 0);
  ck_assert(rs.overlap_dc_lambda == 0 && rs.overlap_fix_kind == TD_OVERLAP_FIX_DC);
  const char *bad[] = {"dc:", "dc:-1", "dc:1e13", "dc:nan", "dc:inf", "dc:3x", "dc: "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "dc:7", why, sizeof why), 0);
    ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", bad[i], why, sizeof why), TD_ECONFIG);
    ck_assert_ptr_nonnull(strstr(why, "dc:LAMBDA needs a number LAMBDA in [0, 1e+12]"));
    ck_assert(rs.overlap_dc_lambda == 7); /* unchanged */
  }
  ck_assert_int_eq(td_runspec_set(&rs, "overlap_fix", "pull", why, sizeof why), 0);
  ck_assert(rs.overlap_dc_lambda == 0 && rs.overlap_fix_kind == TD_OVERLAP_FIX_PULL);
}
END_TEST

/* fragments: 1 by default (the whole model every round), bounded by the
 * table, and refused in one line with what it cannot split. */
START_TEST(fragments_default_bound_and_refusals) {
  td_runspec_t rs;
  char why[512] = "", text[8192];
  td_runspec_defaults(&rs);
  ck_assert_uint_eq(rs.fragments, 1);
  ck_assert_double_eq(rs.fragment_alpha, 0.5);
  ck_assert_int_eq(td_runspec_set(&rs, "fragments", "0", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_runspec_set(&rs, "fragments", "65", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_runspec_set(&rs, "fragment_alpha", "1.5", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_runspec_set(&rs, "fragments", "4", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "fragment_alpha", "0.25", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0); /* sync */
  ck_assert_int_eq(td_runspec_set(&rs, "mode", "overlap", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  td_runspec_format(&rs, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "fragments = 4\nfragment_alpha = 0.25\n"));
  const struct {
    const char *key, *value, *says;
  } refused[] = {
      {"mode", "async:2", "fragments = 4: needs rounds (mode sync or overlap)"},
      {"outer", "adam", "fragments = 4: needs outer = sgd"},
      {"codec", "powersgd:2", "codec powersgd:2 keeps each link's error feedback"},
      {"codec", "auto", "codec auto keeps each link's error feedback"},
      {"overlap_fix", "dc:1e4", "overlap_fix = dc:1e4 does not apply"},
      {"overlap_early", "true", "overlap_early is not supported with fragments"},
      {"overlap_fill", "1", "overlap_fill is not supported with fragments"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    td_runspec_t bad = rs;
    ck_assert_int_eq(td_runspec_set(&bad, refused[i].key, refused[i].value, why, sizeof why), 0);
    ck_assert_int_eq(td_runspec_validate(&bad, why, sizeof why), TD_ECONFIG);
    ck_assert_msg(strstr(why, refused[i].says) != NULL, "%s = %s: %s", refused[i].key,
                  refused[i].value, why);
    ck_assert_ptr_null(strchr(why, '\n')); /* one line */
    ck_assert_int_eq(td_runspec_set(&bad, "fragments", "1", why, sizeof why), 0);
    ck_assert_int_eq(td_runspec_validate(&bad, why, sizeof why), 0); /* fine without */
  }
  /* stateless codecs, top-k (its residual splits by range) and the
   * sync-mode keys are fine */
  ck_assert_int_eq(td_runspec_set(&rs, "codec", "fp16", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "codec", "topk:0.01", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
}
END_TEST

START_TEST(optimizer_keys_default_parse_and_check) {
  td_runspec_t rs;
  char why[512] = "", text[8192];
  td_runspec_defaults(&rs);
  ck_assert_str_eq(rs.optimizer, "sgd");
  ck_assert_uint_eq(rs.optimizer_kind, TD_OPTIM_SGD);
  ck_assert_double_eq(rs.beta1, 0.9);
  ck_assert_double_eq(rs.beta2, 0.95);
  ck_assert_double_eq(rs.eps, 1e-8);
  ck_assert_double_eq(rs.clip, 0);
  ck_assert_int_eq(td_runspec_set(&rs, "optimizer", "adamw", why, sizeof why), 0);
  ck_assert_uint_eq(rs.optimizer_kind, TD_OPTIM_ADAMW);
  ck_assert_int_eq(td_runspec_set(&rs, "beta2", "0.999", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "clip", "1", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  td_runspec_format(&rs, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "optimizer = adamw\n"));
  ck_assert_ptr_nonnull(strstr(text, "beta2 = 0.999\n"));
  ck_assert_ptr_nonnull(strstr(text, "clip = 1\n"));
  /* Nesterov is an SGD option: asking for it with AdamW is a mistake */
  ck_assert_int_eq(td_runspec_set(&rs, "nesterov", "true", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "nesterov: applies to optimizer = sgd, not adamw");
  ck_assert_int_eq(td_runspec_set(&rs, "optimizer", "sgd", why, sizeof why), 0);
  ck_assert_uint_eq(rs.optimizer_kind, TD_OPTIM_SGD);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "optimizer", "adam", why, sizeof why), TD_ECONFIG);
  ck_assert_str_eq(why, "optimizer: unknown optimizer 'adam' (accepted: sgd, adamw)");
  ck_assert_int_eq(td_runspec_set(&rs, "dataset", "text:fortunes", why, sizeof why), 0);
}
END_TEST

/* DiLoCo (Douillard et al. 2023) in run keys: H inner AdamW steps per round,
 * then an outer Nesterov step on the averaged delta (the README's recipe). */
/* ef_decay: auto decays the residual under adamw only; lr and off force it
 * either way whatever the optimizer; anything else is refused by name. */
START_TEST(ef_decay_follows_the_optimizer_or_the_operator) {
  td_runspec_t rs;
  char why[256];
  td_runspec_defaults(&rs);
  ck_assert_str_eq(rs.ef_decay, "auto");
  ck_assert(!td_runspec_ef_decays(&rs)); /* sgd */
  ck_assert_int_eq(td_runspec_set_arg(&rs, "optimizer=adamw", why, sizeof why), 0);
  ck_assert(td_runspec_ef_decays(&rs));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "ef_decay=off", why, sizeof why), 0);
  ck_assert(!td_runspec_ef_decays(&rs));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "optimizer=sgd", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "ef_decay=lr", why, sizeof why), 0);
  ck_assert(td_runspec_ef_decays(&rs));
  ck_assert_int_eq(td_runspec_set_arg(&rs, "ef_decay=half", why, sizeof why), TD_ECONFIG);
  ck_assert_msg(strstr(why, "ef_decay") != NULL, "%s", why);
  ck_assert(td_runspec_ef_decays(&rs)); /* the refused value changed nothing */
}
END_TEST

START_TEST(diloco_recipe_is_expressible) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  const char *ini = "[run]\n"
                    "optimizer = adamw\nlr = 4e-4\nweight_decay = 0.1\n"
                    "beta1 = 0.9\nbeta2 = 0.95\nclip = 1\nwarmup_steps = 1000\n"
                    "local_steps = 500\n"
                    "outer_lr = 0.7\nouter_momentum = 0.9\nouter_nesterov = true\n";
  ck_assert_msg(td_runspec_load_ini_text(&rs, ini, "diloco.ini", why, sizeof why) == 0, "%s",
                why);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  ck_assert_uint_eq(rs.optimizer_kind, TD_OPTIM_ADAMW);
  ck_assert_double_eq(rs.lr, 4e-4);
  ck_assert_double_eq(rs.clip, 1);
  ck_assert_uint_eq(rs.local_steps, 500);
  ck_assert_double_eq(rs.outer_lr, 0.7);
  ck_assert_double_eq(rs.outer_momentum, 0.9);
  ck_assert(rs.outer_nesterov);
}
END_TEST

START_TEST(scheduler_keys_fill_parsed_fields) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert_int_eq(rs.mode_kind, TD_MODE_SYNC);
  ck_assert(rs.weighted_batching);
  ck_assert_uint_eq(rs.local_steps, 8);
  ck_assert(rs.qsr_alpha == 0);
  ck_assert(td_runspec_slowdown(&rs, 3) == 1);
  ck_assert_int_eq(td_runspec_set(&rs, "mode", "async:4", why, sizeof why), 0);
  ck_assert_int_eq(rs.mode_kind, TD_MODE_ASYNC);
  ck_assert_uint_eq(rs.max_staleness, 4);
  ck_assert_int_eq(td_runspec_set(&rs, "mode", "overlap", why, sizeof why), 0);
  ck_assert_int_eq(rs.mode_kind, TD_MODE_OVERLAP);
  ck_assert_int_eq(td_runspec_set(&rs, "local_steps", "qsr:0.0175:4", why, sizeof why), 0);
  ck_assert_uint_eq(rs.local_steps, 4);
  ck_assert_double_eq_tol(rs.qsr_alpha, 0.0175, 1e-12);
  ck_assert_int_eq(td_runspec_set(&rs, "local_steps", "16", why, sizeof why), 0);
  ck_assert(rs.qsr_alpha == 0);
  ck_assert_int_eq(td_runspec_set(&rs, "codec", "auto", why, sizeof why), 0);
  ck_assert(rs.codec_auto);
  ck_assert_int_eq(td_runspec_set(&rs, "codec", "topk:0.1", why, sizeof why), 0);
  ck_assert(!rs.codec_auto);
  ck_assert_int_eq(td_runspec_set(&rs, "batching", "equal", why, sizeof why), 0);
  ck_assert(!rs.weighted_batching);
  ck_assert_int_eq(td_runspec_set(&rs, "slowdown", "3", why, sizeof why), 0);
  ck_assert(td_runspec_slowdown(&rs, 0) == 3 && td_runspec_slowdown(&rs, 7) == 3);
  ck_assert_int_eq(td_runspec_set(&rs, "slowdown", "1,1,3,2.5", why, sizeof why), 0);
  ck_assert(td_runspec_slowdown(&rs, 1) == 1 && td_runspec_slowdown(&rs, 2) == 3);
  ck_assert(td_runspec_slowdown(&rs, 3) == 2.5 && td_runspec_slowdown(&rs, 4) == 1);
}
END_TEST

START_TEST(aggregate_keys_resolve_and_need_rounds) {
  td_runspec_t rs;
  char why[512] = "";
  td_agg_spec_t agg;
  td_runspec_defaults(&rs);
  td_runspec_agg(&rs, &agg);
  ck_assert_int_eq(agg.kind, TD_AGG_MEAN);
  ck_assert(agg.norm_bound == 0); /* auto: none for mean */
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "trimmed:2", why, sizeof why), 0);
  td_runspec_agg(&rs, &agg);
  ck_assert_int_eq(agg.kind, TD_AGG_TRIMMED);
  ck_assert_uint_eq(agg.trim, 2);
  ck_assert(agg.norm_bound == TD_AGG_AUTO_NORM_BOUND);
  /* the two keys are independent whatever their order */
  ck_assert_int_eq(td_runspec_set(&rs, "norm_bound", "off", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "clip:2", why, sizeof why), 0);
  td_runspec_agg(&rs, &agg);
  ck_assert(agg.kind == TD_AGG_CLIP && agg.clip == 2 && agg.norm_bound == 0);
  ck_assert_int_eq(td_runspec_set(&rs, "norm_bound", "8", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "median", why, sizeof why), 0);
  td_runspec_agg(&rs, &agg);
  ck_assert(agg.kind == TD_AGG_MEDIAN && agg.norm_bound == 8);
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "trimmed:0", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "aggregate"));
  ck_assert_int_eq(td_runspec_set(&rs, "norm_bound", "0.5", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "norm_bound"));
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  /* async adds updates one by one: no round to be robust over */
  ck_assert_int_eq(td_runspec_set(&rs, "mode", "async:2", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "aggregate = median"));
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "mean", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "norm_bound = 8"));
  ck_assert_int_eq(td_runspec_set(&rs, "norm_bound", "auto", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
  /* a hub's mean of the anchors would be taken on trust: refused under a
   * robust rule where anchors are reconciled (a lossy codec), not elsewhere */
  ck_assert_int_eq(td_runspec_set(&rs, "mode", "sync", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "reconcile_via", "hub", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0); /* mean */
  ck_assert_int_eq(td_runspec_set(&rs, "aggregate", "trimmed:1", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0); /* codec none: no anchors */
  ck_assert_int_eq(td_runspec_set(&rs, "codec", "fp16", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "reconcile_via = hub"));
  ck_assert_int_eq(td_runspec_set(&rs, "reconcile_via", "auto", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_validate(&rs, why, sizeof why), 0);
}
END_TEST

START_TEST(ini_files_use_the_same_table) {
  make_tmpdir();
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  const char *p = write_file("good.ini", "; a comment\nbatch = 128\n[run]\nepochs = 3\n");
  ck_assert_int_eq(td_runspec_load_ini(&rs, p, why, sizeof why), 0);
  ck_assert_uint_eq(rs.batch, 128);
  ck_assert_uint_eq(rs.epochs, 3);

  p = write_file("badval.ini", "batch = 128\nlr = fast\n");
  ck_assert_int_eq(td_runspec_load_ini(&rs, p, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":2:"));
  ck_assert_ptr_nonnull(strstr(why, "lr"));

  p = write_file("syntax.ini", "batch = 1\nthis line has no equals sign\n");
  ck_assert_int_eq(td_runspec_load_ini(&rs, p, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":2:"));

  p = write_file("section.ini", "[network]\nbatch = 1\n");
  ck_assert_int_eq(td_runspec_load_ini(&rs, p, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "network"));

  ck_assert_int_eq(td_runspec_load_ini(&rs, "/nonexistent/run.ini", why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "/nonexistent/run.ini"));
  /* the same parser on text in memory (what trainctl start sends the daemon) */
  ck_assert_int_eq(td_runspec_load_ini_text(&rs, "[run]\nbatch = 32\n", "run file", why,
                                            sizeof why), 0);
  ck_assert_uint_eq(rs.batch, 32);
  ck_assert_int_eq(td_runspec_load_ini_text(&rs, "batch = 8\nlr = fast\n", "run file", why,
                                            sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "run file:2:"));
}
END_TEST

START_TEST(canonical_text_round_trips) {
  make_tmpdir();
  td_runspec_t a, b;
  char why[512] = "", ta[4096], tb[4096];
  td_runspec_defaults(&a);
  td_runspec_set_arg(&a, "lr=0.1234567890123", why, sizeof why);
  td_runspec_set_arg(&a, "partition=shard:2", why, sizeof why);
  td_runspec_set_arg(&a, "nesterov=on", why, sizeof why);
  td_runspec_format(&a, ta, sizeof ta);
  const char *p = write_file("canon.ini", ta);
  td_runspec_defaults(&b);
  ck_assert_int_eq(td_runspec_load_ini(&b, p, why, sizeof why), 0);
  td_runspec_format(&b, tb, sizeof tb);
  ck_assert_str_eq(ta, tb);
  ck_assert_double_eq(a.lr, b.lr);
  /* a short buffer reports the length it needs and stays terminated */
  char small[8];
  size_t need = td_runspec_format(&a, small, sizeof small);
  ck_assert_uint_eq(need, strlen(ta));
  ck_assert_uint_lt(strlen(small), sizeof small);
}
END_TEST

/* The checkpoints a run holds at once against a byte limit: checkpoint_keep
 * of them, or rounds / checkpoint_every with keep 0; the boundary exact. */
START_TEST(init_names_a_file_or_a_run_and_round) {
  td_runspec_t rs;
  char why[256] = "";
  uint64_t run_id, round;
  td_runspec_defaults(&rs);
  ck_assert(td_runspec_init_run("2fc66ac0f38cbcc7", &run_id, &round));
  ck_assert_uint_eq(run_id, 0x2fc66ac0f38cbcc7ull);
  ck_assert_uint_eq(round, 0);
  ck_assert(td_runspec_init_run("2fc66ac0f38cbcc7:12", &run_id, &round));
  ck_assert_uint_eq(round, 12);
  const char *not_runs[] = {"2fc66ac0f38cbcc", "2fc66ac0f38cbcc7:", "2fc66ac0f38cbcc7:0",
                            "2fc66ac0f38cbcc7:01", "2fc66ac0f38cbcc7:1x", "2FC66AC0F38CBCC7",
                            "0000000000000000", "2fc66ac0f38cbcc7x",
                            "2fc66ac0f38cbcc7:99999999999999999999999"};
  for (size_t i = 0; i < sizeof not_runs / sizeof *not_runs; i++) {
    ck_assert_msg(!td_runspec_init_run(not_runs[i], &run_id, &round), "%s", not_runs[i]);
    ck_assert_int_eq(td_runspec_set(&rs, "init", not_runs[i], why, sizeof why), TD_ECONFIG);
    ck_assert_ptr_nonnull(strstr(why, "RUN[:ROUND]"));
  }
  ck_assert_int_eq(td_runspec_set(&rs, "init", "2fc66ac0f38cbcc7:3", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set(&rs, "init", "base.safetensors", why, sizeof why), 0);
}
END_TEST

START_TEST(checkpoint_space_is_held_to_the_limit) {
  td_runspec_t rs;
  char why[512] = "";
  const uint64_t mib = 1u << 20, floats = mib / 4; /* 1 MiB a checkpoint */
  td_runspec_defaults(&rs);
  /* checkpoints off: nothing is held, whatever the rounds */
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, UINT64_MAX, floats, mib, why, sizeof why), 0);
  td_runspec_set_arg(&rs, "checkpoint_every=10", why, sizeof why);
  td_runspec_set_arg(&rs, "checkpoint_keep=0", why, sizeof why);
  /* 640 rounds / 10 = 64 checkpoints of 1 MiB: exactly 64 MiB passes, 63 does not */
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, 640, floats, 64 * mib, why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, 640, floats, 63 * mib, why, sizeof why),
                   TD_ERANGE);
  ck_assert_msg(strstr(why, "checkpoints: 64 of 1.0 MiB each (checkpoint_keep 0, "
                            "checkpoint_every 10) would hold 64 MiB") != NULL, "%s", why);
  ck_assert_msg(strstr(why, "limit of 63 MiB (--max-checkpoint-mb)") != NULL, "%s", why);
  /* rounds under one interval write none */
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, 9, floats, 0, why, sizeof why), 0);
  /* held x size past 2^64 is refused, not wrapped */
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, UINT64_MAX, UINT64_MAX / 4, 64 * mib, why,
                                                sizeof why),
                   TD_ERANGE);
  /* checkpoint_keep caps what is held, however long the run */
  td_runspec_set_arg(&rs, "checkpoint_keep=3", why, sizeof why);
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, UINT64_MAX, floats, 3 * mib, why, sizeof why),
                   0);
  ck_assert_int_eq(td_runspec_check_checkpoints(&rs, UINT64_MAX, floats, 2 * mib, why, sizeof why),
                   TD_ERANGE);
  ck_assert_msg(strstr(why, "checkpoints: 3 of") != NULL, "%s", why);
}
END_TEST

/* Model-state agreement needs one shared state bit for bit: sync or overlap
 * with codec none; the others say why not. */
START_TEST(verifiable_runs_hold_one_state) {
  td_runspec_t rs;
  char why[512] = "";
  td_runspec_defaults(&rs);
  ck_assert_uint_eq(rs.verify_every, 10);
  ck_assert(td_runspec_verifiable(&rs, why, sizeof why));
  ck_assert(td_runspec_verifiable(&rs, NULL, 0));
  td_runspec_set_arg(&rs, "mode=overlap", why, sizeof why);
  ck_assert(td_runspec_verifiable(&rs, why, sizeof why));
  td_runspec_set_arg(&rs, "codec=fp16", why, sizeof why);
  ck_assert(!td_runspec_verifiable(&rs, why, sizeof why));
  ck_assert_msg(strstr(why, "codec fp16") != NULL && strstr(why, "codec none") != NULL, "%s", why);
  td_runspec_set_arg(&rs, "codec=auto", why, sizeof why);
  ck_assert(!td_runspec_verifiable(&rs, why, sizeof why));
  td_runspec_defaults(&rs);
  td_runspec_set_arg(&rs, "mode=async:2", why, sizeof why);
  ck_assert(!td_runspec_verifiable(&rs, why, sizeof why));
  ck_assert_msg(strstr(why, "async") != NULL, "%s", why);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "verify_every=0", why, sizeof why), 0);
  ck_assert_int_eq(td_runspec_set_arg(&rs, "verify_every=-1", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "verify_every"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("runspec");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, defaults_are_valid_and_documented);
  tcase_add_test(tc, set_parses_every_type);
  tcase_add_test(tc, bad_values_are_refused_with_the_key_named);
  tcase_add_test(tc, outer_optimizer_keys_parse_and_refuse_mixtures);
  tcase_add_test(tc, sampling_and_straggler_keys);
  tcase_add_test(tc, codec_with_a_bad_parameter_names_it_and_its_range);
  tcase_add_test(tc, ini_files_use_the_same_table);
  tcase_add_test(tc, canonical_text_round_trips);
  tcase_add_test(tc, scheduler_keys_fill_parsed_fields);
  tcase_add_test(tc, aggregate_keys_resolve_and_need_rounds);
  tcase_add_test(tc, overlap_fix_defaults_parses_and_refuses);
  tcase_add_test(tc, fragments_default_bound_and_refusals);
  tcase_add_test(tc, optimizer_keys_default_parse_and_check);
  tcase_add_test(tc, diloco_recipe_is_expressible);
  tcase_add_test(tc, ef_decay_follows_the_optimizer_or_the_operator);
  tcase_add_test(tc, checkpoint_space_is_held_to_the_limit);
  tcase_add_test(tc, init_names_a_file_or_a_run_and_round);
  tcase_add_test(tc, verifiable_runs_hold_one_state);
  tcase_add_test(tc, scaffold_is_accepted_where_built_and_refused_elsewhere);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
