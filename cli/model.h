/* model.h: trainctl model, a run's kept model (or a checkpoint) from a
 * ledger, written as safetensors (cli/model.c). */
#ifndef TD_CLI_MODEL_H
#define TD_CLI_MODEL_H

/* `trainctl model RUN ARGS...`; returns the exit code (0, 1 with a one-line
 * error, 2 on a usage error). */
int td_model_main(int argc, char **argv);

#endif
