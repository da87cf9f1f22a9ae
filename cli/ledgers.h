/* ledgers.h: the ledger reader under trainctl's history commands.
 *
 * Opens node ledgers (<data_dir>/traind.db) read-only with SQLite, so that
 * `runs`, `show`, `export` and `plot` work while the daemon is down and can
 * never change what it recorded, and reads their runs, rounds and events.
 * Which ledgers: every --db FILE and --data-dir DIR given (repeatable), a RUN
 * argument written DB:RUN (DB a ledger file or a data dir), else the default:
 * the data dir of the daemon at trainctl's --socket when one was given
 * (td__ledgers_use_data_dir), else $TRAIND_DATA_DIR, else
 * ~/.local/share/traind. A run is named by a unique prefix of its
 * 16-hex-digit id; the same run id in several ledgers is the same run seen by
 * several nodes.
 *
 * The commands (cli/history.c, cli/export.c, cli/plot.c) call down into this
 * file, never the other way. Everything runs on trainctl's one thread; errors
 * are one line on stderr. */
#ifndef TD_CLI_LEDGERS_H
#define TD_CLI_LEDGERS_H

#include <json-c/json.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD__LEDGERS_VALUE_MAX 1100 /* a spec value (runspec: 1024 bytes at most) */

typedef struct {
  char path[1024];
  char label[256]; /* the data dir's name, or the file's without .db */
  sqlite3 *db;
  bool has_eval_bpb; /* the rounds table has a bits-per-byte column */
  bool has_consensus; /* ... and a consensus column (topology gossip, groups) */
  char bpb_column[32];
} td__ledgers_db_t;

typedef struct {
  td__ledgers_db_t *ledger; /* borrowed from the set */
  int64_t run_id;
  char id[17];
  char *spec; /* "key = value\n" lines; owned */
  double started, ended; /* ended NaN while running */
  char state[32];
  double test_accuracy; /* NaN when none */
} td__ledgers_run_t;

typedef struct {
  td__ledgers_db_t **dbs; /* each its own allocation: runs keep pointers to them while more
                             ledgers are added */
  size_t n;
} td__ledgers_set_t;

/* What a run's rows add up to (td__ledgers_figures). */
typedef struct {
  int64_t rounds, samples, bytes_sent, bytes_recv, updates, links;
  double last_round_ended, loss, eval_acc, bpb;
  int64_t eval_round;
  double compute_s, wait_s;
  char reason[512]; /* why it ended as it did ("" when the ledger does not say) */
} td__ledgers_figures_t;

/* Print "trainctl: error: ..." and return 1. */
int td__ledgers_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A usage error: prints "usage: TEXT", returns 2. */
int td__ledgers_usage(const char *text);

/* The default ledger is the one in DIR (the daemon's data dir, as its status
 * says) instead of $TRAIND_DATA_DIR or ~/.local/share/traind. */
void td__ledgers_use_data_dir(const char *dir);
/* Open PATH (a ledger file or a data dir) read-only and add it to the set
 * (once). Returns its index, or -1 after printing the reason. */
int td__ledgers_add(td__ledgers_set_t *set, const char *path);
/* Add the default ledger when the set is empty; -1 after printing why. */
int td__ledgers_default(td__ledgers_set_t *set);
void td__ledgers_close(td__ledgers_set_t *set);
/* Takes --db FILE / --data-dir DIR at argv[*a]; 1 if taken, 0 if not, -1 on error. */
int td__ledgers_take_db_opt(td__ledgers_set_t *set, int argc, char **argv, int *a);

/* Every run of one ledger whose id starts with PREFIX (NULL: every run),
 * oldest first, appended to *runs (*n of them). 0, or 1 after printing why. */
int td__ledgers_runs_of(td__ledgers_db_t *d, const char *prefix, td__ledgers_run_t **runs,
                        size_t *n);
/* Every run matching ARG (PREFIX or DB:PREFIX) across the set, one per
 * ledger; a prefix of two different runs is an error. Caller frees with
 * td__ledgers_runs_free. Returns 0, or 1 after printing a one-line error. */
int td__ledgers_resolve(td__ledgers_set_t *set, const char *arg, td__ledgers_run_t **out,
                        size_t *n_out);
/* Resolve ARG to exactly one run in one ledger; 0, or 1 after printing why. */
int td__ledgers_one_run(td__ledgers_set_t *set, const char *arg, td__ledgers_run_t **run);
void td__ledgers_runs_free(td__ledgers_run_t *runs, size_t n);
/* The value of KEY in a spec text (buf gets it); false when absent. */
bool td__ledgers_spec_get(const char *spec, const char *key, char *buf, size_t len);

/* How many nodes the run had as this ledger saw it: the most that its
 * run_start events name ("run ID rank R of N") or that any round's row lists
 * as members; *nodes is 0 when the ledger says neither. 0, or 1 after
 * printing why. */
int td__ledgers_run_nodes(const td__ledgers_run_t *r, unsigned *nodes);

/* The run's figures from its rounds, updates, links and events; 0, or 1 after
 * printing why. */
int td__ledgers_figures(const td__ledgers_run_t *r, td__ledgers_figures_t *f);
/* Seconds from start to end (or to the last round while running); NaN if unknown. */
double td__ledgers_duration_s(const td__ledgers_run_t *r, const td__ledgers_figures_t *f);
/* The run's final metric: test accuracy, else the last evaluated accuracy,
 * else the last bits per byte; *name NULL when none. */
void td__ledgers_final_metric(const td__ledgers_run_t *r, const td__ledgers_figures_t *f,
                              const char **name, double *value);
/* The run as `trainctl show --json` prints it (spec included when with_spec);
 * caller owns the result. */
json_object *td__ledgers_run_json(const td__ledgers_run_t *r, const td__ledgers_figures_t *f,
                                  bool with_spec);
/* Figures and JSON in one; caller owns *out. 0, or 1 after printing why. */
int td__ledgers_run_summary(const td__ledgers_run_t *r, json_object **out);

#endif
