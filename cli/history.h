/* history.h: trainctl's commands that read ledgers directly (no daemon).
 *
 * `runs`, `show`, `export` (cli/history.c) and `plot` (cli/plot.c) open one or
 * more node ledgers (<data_dir>/traind.db) read-only with SQLite, so they work
 * while the daemon is down and can never change what it recorded. Which
 * ledgers: every --db FILE and --data-dir DIR given (repeatable), a RUN
 * argument written DB:RUN (DB a ledger file or a data dir), else the daemon's
 * default data dir ($TRAIND_DATA_DIR, else ~/.local/share/traind). A run is
 * named by a unique prefix of its 16-hex-digit id. The same run id in several
 * ledgers is the same run seen by several nodes.
 *
 * Everything runs on trainctl's one thread. Errors are one line on stderr. */
#ifndef TD_CLI_HISTORY_H
#define TD_CLI_HISTORY_H

#include <json-c/json.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Run `trainctl CMD ARGS...` for CMD in runs, show, export, plot; returns the
 * process exit code (0, 1 with a one-line error, 2 on a usage error). */
int td_history_main(const char *cmd, int argc, char **argv);
/* Whether CMD is one of the commands above. */
bool td_history_handles(const char *cmd);
/* The lines of `trainctl --help` that describe them. */
const char *td_history_usage(void);

/* What the commands share (internal to cli/). */
#define TD__HIST_VALUE_MAX 1100 /* a spec value (runspec: 1024 bytes at most) */

typedef struct {
  char path[1024];
  char label[256]; /* the data dir's name, or the file's without .db */
  sqlite3 *db;
  bool has_eval_bpb; /* the rounds table has a bits-per-byte column */
  char bpb_column[32];
} td__hist_db_t;

typedef struct {
  td__hist_db_t *ledger; /* borrowed from the set */
  int64_t run_id;
  char id[17];
  char *spec; /* "key = value\n" lines; owned */
  double started, ended; /* ended NaN while running */
  char state[32];
  double test_accuracy; /* NaN when none */
} td__hist_run_t;

typedef struct {
  td__hist_db_t **dbs; /* each its own allocation: runs keep pointers to them while more
                          ledgers are added */
  size_t n;
} td__hist_set_t;

/* Open PATH (a ledger file or a data dir) read-only and add it to the set
 * (once). Returns its index, or -1 after printing the reason. */
int td__hist_add(td__hist_set_t *set, const char *path);
/* Add the default ledger when the set is empty; -1 after printing why. */
int td__hist_default(td__hist_set_t *set);
void td__hist_close(td__hist_set_t *set);
/* Every run matching ARG (PREFIX or DB:PREFIX) across the set, one per
 * ledger; a prefix of two different runs is an error. Caller frees with
 * td__hist_runs_free. Returns 0, or 1 after printing a one-line error. */
int td__hist_resolve(td__hist_set_t *set, const char *arg, td__hist_run_t **out, size_t *n_out);
void td__hist_runs_free(td__hist_run_t *runs, size_t n);
/* The value of KEY in a spec text (buf gets it); false when absent. */
bool td__hist_spec_get(const char *spec, const char *key, char *buf, size_t len);
/* Print "trainctl: error: ..." and return 1. */
int td__hist_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* trainctl plot (cli/plot.c). */
int td__plot_main(int argc, char **argv);
/* The run's spec and figures as `trainctl show --json` prints them; caller
 * owns *out. 0, or 1 after printing why. */
int td__hist_run_summary(const td__hist_run_t *r, json_object **out);
/* `trainctl model` (cli/model.c). */
int td__model_main(int argc, char **argv);
/* `trainctl export` (cli/export.c). */
int td__export_main(int argc, char **argv);
/* A usage error: prints the usage line, returns 2. */
int td__hist_usage(const char *text);
/* Takes --db FILE / --data-dir DIR at argv[*a]; 1 if taken, 0 if not, -1 on error. */
int td__hist_take_db_opt(td__hist_set_t *set, int argc, char **argv, int *a);
/* Resolve ARG to exactly one run in one ledger; 0, or 1 after printing why. */
int td__hist_one_run(td__hist_set_t *set, const char *arg, td__hist_run_t **run);

#endif
