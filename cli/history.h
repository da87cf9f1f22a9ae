/* history.h: trainctl runs and show, the run history read from ledgers.
 *
 * Both read node ledgers directly through cli/ledgers.h (read-only, no
 * daemon needed); trainctl's command table (cli/trainctl.c) calls them. */
#ifndef TD_CLI_HISTORY_H
#define TD_CLI_HISTORY_H

/* `trainctl runs ARGS...`: every run in the ledgers, oldest first. Returns the
 * exit code (0, 1 with a one-line error, 2 on a usage error). */
int td_history_runs(int argc, char **argv);
/* `trainctl show RUN ARGS...`: one run's spec and outcome; exit code as above. */
int td_history_show(int argc, char **argv);

#endif
