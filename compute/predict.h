/* predict.h: a trained model put to use, outside any run: its predictions
 * over a dataset's held-out split (`trainctl predict`) and text sampled from
 * a gpt (`trainctl generate`).
 *
 * The weights come from a safetensors file (checked tensor by tensor against
 * the model spec, as init = FILE is) or from a flat buffer in layout order (a
 * ledger's kept model). The data is loaded as a run loads it (td_shard_open:
 * the same normalisation, the same test split or held-out text), and the
 * evaluation goes in chunks of `batch` rows with the same kernels and the
 * same order of sums as a run's evaluations (compute/trainer.c), so with the
 * run's own batch the accuracy, loss and bits per byte are the run's own,
 * bit for bit. Everything runs on the CPU backend, on the caller's thread. */
#ifndef TD_PREDICT_H
#define TD_PREDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where the weights come from: file, or else blob (bytes, layout order,
 * padding included, exactly td_model_numel floats). Both borrowed. */
typedef struct {
  const char *model_spec;
  const char *file;
  const void *blob;
  size_t blob_bytes;
  int threads; /* BLAS threads; 0: 1 */
} td_predict_model_t;

/* One evaluated row: its index in the split, its logits (classes floats,
 * borrowed for the call) and its label. */
typedef int (*td_predict_row_fn)(void *user, size_t index, const float *logits, int classes,
                                 int32_t label);

typedef struct {
  td_predict_model_t model;
  const char *dataset; /* as the run key `dataset` takes it */
  unsigned batch;      /* rows per evaluation chunk (0: 64) */
  td_predict_row_fn row; /* NULL: totals only; nonzero return stops with TD_EIO */
  void *user;
} td_predict_opts_t;

typedef struct {
  bool text;        /* a gpt on text: bits_per_byte is set, no rows */
  bool test_split;  /* the dataset had a test split (else its training rows) */
  size_t rows;
  int classes;
  double loss, accuracy, bits_per_byte;
} td_predict_result_t;

/* Evaluate the model over the dataset's test split (its training rows when
 * it has none; the held-out text for a gpt), calling opts->row per row. 0,
 * or the loaders' and the model's codes with a one-line why (TD_ESHAPE for
 * a dataset the model cannot read). */
int td_predict(const td_predict_opts_t *opts, td_predict_result_t *out, char *why,
               size_t why_len);

typedef struct {
  td_predict_model_t model;
  const uint8_t *prompt; /* at least one byte */
  size_t prompt_len;
  unsigned tokens;       /* bytes to sample */
  double temperature;    /* 0: greedy (argmax); else softmax(logits / T) */
  uint64_t seed;
} td_generate_opts_t;

/* Sample opts->tokens bytes after the prompt from a gpt, each from the
 * logits at the last position of the window of the CONTEXT bytes before it;
 * the same seed gives the same bytes. *out (tokens bytes) is the caller's to
 * free. TD_ECONFIG with why for a model that does not read bytes. */
int td_generate(const td_generate_opts_t *opts, uint8_t **out, char *why, size_t why_len);

#endif
