/* export.h: trainctl export, a run's ledger rows as CSV or JSON (cli/export.c). */
#ifndef TD_CLI_EXPORT_H
#define TD_CLI_EXPORT_H

/* `trainctl export RUN ARGS...`; returns the exit code (0, 1 with a one-line
 * error, 2 on a usage error). A closed stdout (`| head`) ends it quietly. */
int td_export_main(int argc, char **argv);
/* `trainctl rounds --csv`: the rounds of run RUN_HEX (NULL: no run yet, the
 * header alone) in the ledger of DATA_DIR, the last `last` of them (0: all),
 * with exactly the columns of `trainctl export RUN --table rounds`. Returns
 * the exit code, as above. */
int td_export_rounds_csv(const char *data_dir, const char *run_hex, unsigned last);

#endif
