/* plot.h: trainctl plot, curves of runs drawn with gnuplot (cli/plot.c). */
#ifndef TD_CLI_PLOT_H
#define TD_CLI_PLOT_H

/* `trainctl plot RUN... ARGS...`; returns the exit code (0, 1 with a one-line
 * error, 2 on a usage error). */
int td_plot_main(int argc, char **argv);

#endif
