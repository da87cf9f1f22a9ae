/* predict.h: trainctl predict and trainctl generate, a model (a run's kept
 * one, or a safetensors file) evaluated over a dataset or sampled from, in
 * trainctl's own process (cli/predict.c). */
#ifndef TD_CLI_PREDICT_H
#define TD_CLI_PREDICT_H

/* `trainctl predict MODEL --data DATASET ...`: prints accuracy and loss (or
 * bits per byte) and writes the predictions. 0, 1 with a one-line error, 2
 * on a usage error. */
int td_predict_main(int argc, char **argv);
/* `trainctl generate MODEL --prompt TEXT ...`: prints the prompt and the
 * bytes sampled after it. Exit codes as td_predict_main. */
int td_generate_main(int argc, char **argv);

#endif
