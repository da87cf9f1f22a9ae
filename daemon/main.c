/* main.c: the traind command line.
 *
 * Without --standalone, traind is the peer daemon (daemon/node.h), configured
 * by an optional --config INI file and then flags of the same names. With
 * --standalone it trains one node alone, the N = 1 baseline: an optional
 * RUN.ini, then any number of --set key=value (applied after the file). A
 * standalone run keeps its final model as a peer run does, as a run of its
 * own in the ledger of --data-dir (the daemon's default data directory
 * without it), and with --save also in a safetensors file. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/safetensors.h"
#include "daemon/base/clock.h"
#include "daemon/store/ledger.h"
#include "daemon/settings.h"
#include "daemon/base/log.h"
#include "daemon/node.h"
#include "daemon/run/runspec.h"
#include "daemon/run/standalone.h"
#include "daemon/session/shared.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "dev"
#endif

static void usage(FILE *out) {
  fprintf(out,
          "usage: traind [--config FILE] [--data-dir DIR] [--listen tcp://HOST:PORT]\n"
          "              [--advertise tcp://HOST:PORT]\n"
          "              [--control PATH] [--log-level LEVEL] [--threads N] [--heartbeat-ms MS]\n"
          "              [--link-delay-ms MS] [--uplink-kbit KBIT] [--metrics HOST:PORT]\n"
          "              [--max-model-mb MB] [--max-batch N] [--max-rounds N]\n"
          "              [--max-checkpoint-mb MB] [--data-root DIR]\n"
          "              [--insecure [--insecure-force]]\n"
          "       traind --standalone [RUN.ini] [--set key=value ...] [--json]\n"
          "              [--data-dir DIR] [--save FILE.safetensors]\n"
          "\n"
          "The first form runs the peer daemon in the foreground (logs on stderr; SIGINT\n"
          "or SIGTERM shut it down cleanly); drive it with trainctl. The second trains\n"
          "one node alone (the baseline for multi-node runs) with per-epoch progress;\n"
          "with --json the last line is one JSON object with test_accuracy, train_loss,\n"
          "samples_per_s, epochs and run_id. Its final model is kept as a run in the\n"
          "ledger of DATA_DIR (trainctl model/predict RUN, init = RUN), and with --save\n"
          "also written to FILE.safetensors.\n"
          "\n"
          "Peers are authenticated and encrypted with CURVE by default: the node's key\n"
          "is DATA_DIR/node.key, the keys it admits are in DATA_DIR/allowed_keys\n"
          "(trainctl key / allow / revoke). --insecure: plain TCP, loopback only.\n"
          "\n"
          "daemon settings (flags use dashes; the --config INI file uses these names):\n");
  td_settings_print_help(out);
  fprintf(out, "\nrun keys (trainctl start --set, or --standalone --set), default, meaning:\n");
  td_runspec_print_help(out);
}

/* Where a standalone run keeps its model. */
typedef struct {
  const td_runspec_t *rs;
  char data_dir[512];
  char db_path[600];
  td_ledger_t *ledger; /* DATA_DIR/traind.db, open while training */
  const char *save;    /* --save FILE, or NULL */
  FILE *out;
} standalone_keep_t;

/* --save FILE: a .safetensors name in a folder that exists, checked before
 * any training. */
static int check_save_path(const char *path, char *why, size_t why_len) {
  size_t len = strlen(path);
  static const char ext[] = ".safetensors";
  if (len <= sizeof ext - 1 || strcmp(path + len - (sizeof ext - 1), ext) != 0)
    return td_why(why, why_len, TD_ECONFIG,
                  "--save '%.200s': name a .safetensors file (trainctl model RUN --format onnx "
                  "writes ONNX from the kept run)",
                  path);
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  if (access(dir, W_OK) != 0)
    return td_why(why, why_len, TD_ECONFIG, "--save %.200s: cannot write in %.200s: %s", path,
                  dir, strerror(errno));
  return 0;
}

/* The trained model as a run of its own in the ledger: its runs row, a rounds
 * row per epoch, its models row (round = epochs) and an event, in one
 * transaction written at the end, so a killed run leaves nothing half-made;
 * then --save's file. */
static int keep_standalone_model(td_standalone_end_t *end, void *user, char *why,
                                 size_t why_len) {
  standalone_keep_t *k = user;
  const td_layout_t *layout = td_model_layout(end->model);
  const float *params = td_model_host_params(end->model);
  bool text = td_runspec_is_text(k->rs);
  uint64_t run_id = 0;
  if (getrandom(&run_id, sizeof run_id, 0) != (ssize_t)sizeof run_id || run_id == 0)
    run_id = (uint64_t)getpid() << 32 ^ (uint64_t)(end->started * 1e6) ^ 1;
  snprintf(end->kept_as, sizeof end->kept_as, "%016" PRIx64, run_id);
  size_t spec_len = td_runspec_format(k->rs, NULL, 0) + 1;
  char *spec = malloc(spec_len), *tensors = td__layout_json(layout);
  if (spec == NULL || tensors == NULL) {
    free(spec);
    free(tensors);
    return td_why(why, why_len, TD_ENOMEM, "out of memory keeping the model");
  }
  td_runspec_format(k->rs, spec, spec_len);
  char detail[160];
  snprintf(detail, sizeof detail, "run %s trained alone (traind --standalone): %u epochs, %s %.6f",
           end->kept_as, end->epochs, text ? "test_bpb" : "test_accuracy", end->metric);
  td_ledger_model_t m = {.run_id = run_id, .round = end->epochs, .state = "finished",
                         .metric = end->metric, .model = k->rs->model, .tensors = tensors,
                         .blob = params, .bytes = td_model_numel(end->model) * sizeof(float)};
  double now = td_clock_wall_s();
  int rc = td_ledger_begin(k->ledger);
  if (rc == 0)
    rc = td_ledger_run_start(k->ledger, run_id, spec, end->started);
  for (unsigned e = 0; rc == 0 && e < end->epochs; e++) { /* an epoch is a round */
    const td_standalone_epoch_t *ep = &end->epoch[e];
    td_ledger_round_t r = {.run_id = run_id, .round = e + 1, .started = ep->started,
                           .ended = ep->ended, .local_steps = (uint32_t)ep->steps,
                           .batch = k->rs->batch, .samples = ep->samples, .loss = ep->loss,
                           .eval_acc = ep->eval_acc, .eval_bpb = ep->eval_bpb, .lr = ep->lr,
                           .compute_s = ep->seconds, .wait_s = 0,
                           .capacity = ep->seconds > 0 ? (double)ep->samples / ep->seconds : NAN};
    rc = td_ledger_round_add(k->ledger, &r);
  }
  if (rc == 0 && (rc = td_ledger_model_put(k->ledger, &m)) == 0 &&
      (rc = td_ledger_event_add(k->ledger, now, "standalone", detail)) == 0 &&
      (rc = td_ledger_run_end(k->ledger, run_id, "finished", now, text ? NAN : end->metric)) == 0)
    rc = td_ledger_commit(k->ledger);
  free(spec);
  free(tensors);
  if (rc != 0) {
    td_ledger_fault_t f;
    td_ledger_fault(k->ledger, &f);
    td_ledger_rollback(k->ledger);
    return td_why(why, why_len, rc, "cannot keep the model in %s: %s (%s)", k->db_path, f.cause,
                  f.detail);
  }
  fprintf(k->out, "kept the model as run %s in %s (trainctl model %s -o FILE)\n", end->kept_as,
          k->db_path, end->kept_as);
  if (k->save != NULL) {
    char round_s[16], metric_s[32];
    snprintf(round_s, sizeof round_s, "%u", end->epochs);
    snprintf(metric_s, sizeof metric_s, "%.9g", end->metric);
    td_safetensors_meta_t meta[] = { /* as trainctl model writes them */
        {"format", "pt"},         {"producer", "traind"}, {"model", k->rs->model},
        {"run_id", end->kept_as}, {"round", round_s},     {"state", "finished"},
        {text ? "test_bpb" : "test_accuracy", metric_s}};
    size_t n_meta = sizeof meta / sizeof *meta - (isnan(end->metric) ? 1 : 0);
    if ((rc = td_safetensors_write(k->save, layout, params, meta, n_meta, why, why_len)) != 0)
      return rc;
    fprintf(k->out, "wrote %s\n", k->save);
  }
  fflush(k->out);
  return 0;
}

/* glibc gives each thread that allocates an arena of its own (up to 8 per
 * core), and memory freed into one arena is not reused by the others: the
 * update buffers that the ZeroMQ thread, the decode pool and the loop pass
 * between them raised a many-member node's peak (docs/models-and-data.md#memory-per-node).
 * An operator's own MALLOC_ARENA_MAX or GLIBC_TUNABLES wins. */
static void limit_malloc_arenas(void) {
#ifdef M_ARENA_MAX
  const char *tunables = getenv("GLIBC_TUNABLES");
  if (getenv("MALLOC_ARENA_MAX") == NULL &&
      (tunables == NULL || strstr(tunables, "arena_max") == NULL))
    (void)mallopt(M_ARENA_MAX, 2);
#endif
}

int main(int argc, char **argv) {
  limit_malloc_arenas();
  static const struct option long_opts[] = {
      {"standalone", no_argument, NULL, 'S'}, {"set", required_argument, NULL, 's'},
      {"json", no_argument, NULL, 'j'},       {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},    {"config", required_argument, NULL, 'c'},
      {"data-dir", required_argument, NULL, 'd'}, {"listen", required_argument, NULL, 'l'},
      {"control", required_argument, NULL, 'C'}, {"log-level", required_argument, NULL, 'L'},
      {"threads", required_argument, NULL, 't'}, {"heartbeat-ms", required_argument, NULL, 'H'},
      {"link-delay-ms", required_argument, NULL, 'D'}, {"metrics", required_argument, NULL, 'M'},
      {"max-model-mb", required_argument, NULL, 'm'}, {"max-batch", required_argument, NULL, 'b'},
      {"max-rounds", required_argument, NULL, 'r'}, {"data-root", required_argument, NULL, 'R'},
      {"uplink-kbit", required_argument, NULL, 'U'},
      {"max-checkpoint-mb", required_argument, NULL, 'K'},
      {"insecure", no_argument, NULL, 'I'}, {"insecure-force", no_argument, NULL, 'F'},
      {"advertise", required_argument, NULL, 'A'},
      {"save", required_argument, NULL, 'O'},
      {NULL, 0, NULL, 0},
  };
  static const struct {
    int opt;
    const char *key;
  } flag_keys[] = {{'d', "data_dir"}, {'l', "listen"}, {'C', "control"},
                   {'L', "log_level"}, {'t', "threads"}, {'H', "heartbeat_ms"},
                   {'D', "link_delay_ms"}, {'M', "metrics"}, {'m', "max_model_mb"},
                   {'b', "max_batch"}, {'r', "max_rounds"}, {'R', "data_root"},
                   {'U', "uplink_kbit"}, {'K', "max_checkpoint_mb"}, {'I', "insecure"},
                   {'F', "insecure_force"}, {'A', "advertise"}};
  enum { N_FLAGS = sizeof flag_keys / sizeof *flag_keys };
  const char *config_file = NULL, *save = NULL;
  const char *flag_values[N_FLAGS] = {NULL};
  bool standalone = false, json = false;
  int n_sets = 0;
  const char **sets = calloc((size_t)argc + 1, sizeof *sets);
  if (sets == NULL) {
    fprintf(stderr, "traind: error: out of memory\n");
    return 1;
  }
  int c;
  opterr = 0; /* one line of our own instead of getopt's */
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
    case 'S': standalone = true; break;
    case 's': sets[n_sets++] = optarg; break;
    case 'j': json = true; break;
    case 'h': usage(stdout); free(sets); return 0;
    case 'V': printf("traind %s\n", PACKAGE_VERSION); free(sets); return 0;
    case 'c': config_file = optarg; break;
    case 'O': save = optarg; break;
    case 'd': case 'l': case 'C': case 'L': case 't': case 'H': case 'D': case 'M':
    case 'm': case 'b': case 'r': case 'R': case 'U': case 'K': case 'I': case 'F': case 'A':
      for (size_t k = 0; k < N_FLAGS; k++)
        if (flag_keys[k].opt == c)
          flag_values[k] = optarg != NULL ? optarg : "true";
      break;
    default:
      fprintf(stderr, "traind: error: bad arguments (see traind --help)\n");
      free(sets);
      return 2;
    }
  }
  if (!standalone) {
    free(sets);
    if (n_sets > 0 || optind < argc) {
      fprintf(stderr, "traind: error: run keys and RUN.ini go to trainctl start "
                      "(or traind --standalone)\n");
      return 2;
    }
    if (save != NULL) {
      fprintf(stderr, "traind: error: --save goes with --standalone; a peer run's model is "
                      "written by trainctl model RUN -o FILE\n");
      return 2;
    }
    char why[1024] = "";
    td_settings_t cfg;
    td_settings_defaults(&cfg);
    int rc = config_file ? td_settings_load(&cfg, config_file, why, sizeof why) : 0;
    for (size_t k = 0; rc == 0 && k < N_FLAGS; k++)
      if (flag_values[k] != NULL)
        rc = td_settings_set(&cfg, flag_keys[k].key, flag_values[k], why, sizeof why);
    if (rc != 0) {
      fprintf(stderr, "traind: error: %s\n", why);
      return 2;
    }
    td_log_set_level((td_log_level_t)td_log_parse_level(cfg.log_level));
    int lock_fd; /* held until exit: the kernel drops the lock with the process */
    if ((rc = td_settings_lock_data_dir(cfg.data_dir, &lock_fd, why, sizeof why)) != 0) {
      fprintf(stderr, "traind: error: %s\n", why);
      return 1;
    }
    td_node_opts_t opts = {.data_dir = cfg.data_dir, .listen = cfg.listen,
                           .advertise = cfg.advertise[0] ? cfg.advertise : NULL,
                           .control_path = cfg.control[0] ? cfg.control : NULL,
                           .threads = cfg.threads, .heartbeat_ms = cfg.heartbeat_ms,
                           .link_delay_ms = cfg.link_delay_ms, .uplink_kbit = cfg.uplink_kbit,
                           .metrics = cfg.metrics[0] ? cfg.metrics : NULL,
                           .max_model_mb = cfg.max_model_mb, .max_batch = cfg.max_batch,
                           .max_rounds = cfg.max_rounds,
                           .max_checkpoint_mb = cfg.max_checkpoint_mb,
                           .data_root = cfg.data_root[0] ? cfg.data_root : NULL,
                           .insecure = cfg.insecure, .insecure_force = cfg.insecure_force};
    rc = td_node_main(&opts, why, sizeof why);
    close(lock_fd);
    if (rc != 0) {
      fprintf(stderr, "traind: error: %s\n", why[0] ? why : td_strerror(rc));
      return 1;
    }
    return 0;
  }
  if (argc - optind > 1) {
    fprintf(stderr, "traind: error: expected at most one RUN.ini file, got %d arguments\n",
            argc - optind);
    free(sets);
    return 2;
  }

  char why[1024] = "";
  td_runspec_t rs;
  td_runspec_defaults(&rs);
  int rc = 0;
  if (optind < argc)
    rc = td_runspec_load_ini(&rs, argv[optind], why, sizeof why);
  for (int i = 0; rc == 0 && i < n_sets; i++)
    rc = td_runspec_set_arg(&rs, sets[i], why, sizeof why);
  free(sets);
  if (rc == 0)
    rc = td_runspec_validate(&rs, why, sizeof why);
  if (rc != 0) {
    fprintf(stderr, "traind: error: %s\n", why);
    return 2;
  }
  if (save != NULL && (rc = check_save_path(save, why, sizeof why)) != 0) {
    fprintf(stderr, "traind: error: %s\n", why);
    return 2;
  }
  /* the ledger of --data-dir (or the default one): init = RUN[:ROUND] reads
   * it, and the trained model is kept there */
  standalone_keep_t keep = {.rs = &rs, .save = save, .out = stdout};
  const char *dir_flag = NULL;
  for (size_t k = 0; k < N_FLAGS; k++)
    if (flag_keys[k].opt == 'd')
      dir_flag = flag_values[k];
  if (dir_flag != NULL)
    snprintf(keep.data_dir, sizeof keep.data_dir, "%s", dir_flag);
  else
    td_node_default_data_dir(keep.data_dir, sizeof keep.data_dir);
  uint64_t init_run, init_round;
  if (td_runspec_init_run(rs.init, &init_run, &init_round)) {
    char inner[768];
    if ((rc = td__policy_init_from_run(keep.data_dir, &rs, inner, sizeof inner)) != 0) {
      fprintf(stderr, "traind: error: %s\n", inner);
      return 1;
    }
  }
  /* opened before training, so a ledger that cannot be written fails now */
  if ((rc = td_settings_make_data_dir(keep.data_dir, why, sizeof why)) == 0) {
    snprintf(keep.db_path, sizeof keep.db_path, "%s/traind.db", keep.data_dir);
    rc = td_ledger_open(&keep.ledger, keep.db_path, why, sizeof why);
  }
  if (rc != 0) {
    fprintf(stderr, "traind: error: cannot keep the model: %s (--data-dir DIR names another "
                    "data directory)\n", why);
    return 1;
  }
  rc = td_standalone_run(&rs, json, stdout, keep_standalone_model, &keep, why, sizeof why);
  td_ledger_close(&keep.ledger);
  if (rc != 0) {
    fprintf(stderr, "traind: error: %s\n", why[0] ? why : td_strerror(rc));
    return 1;
  }
  return 0;
}
