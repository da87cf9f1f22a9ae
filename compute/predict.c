/* predict.c: a trained model's predictions over a dataset, and text sampled
 * from a gpt (compute/predict.h). What `trainctl predict` and `trainctl
 * generate` run in trainctl's own process, so both work with no daemon.
 *
 * Feature models are evaluated here chunk by chunk exactly as
 * td_trainer_evaluate does (the same td_model_eval_batch calls over the same
 * chunks, one running loss sum), which is what makes a run's recorded test
 * accuracy reproducible; a gpt's bits per byte is td_trainer_evaluate_text
 * itself, over the same held-out text a run evaluates. Generation feeds the
 * gpt one window at a time: attention is causal, so the logits at the last
 * byte of a window shorter than CONTEXT do not depend on the padding after
 * it. A dataset held as bytes is converted a chunk at a time. */
#include "compute/predict.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/backend.h"
#include "compute/data/dataset.h"
#include "compute/data/shard.h"
#include "compute/data/text.h"
#include "compute/model.h"
#include "compute/rng.h"
#include "compute/safetensors.h"
#include "compute/trainer.h"

#define DEFAULT_BATCH 64

/* The weights of src into m (file or blob), pushed to its backend. */
static int load_weights(td_model_t *m, const td_predict_model_t *src, char *why,
                        size_t why_len) {
  if (src->file != NULL)
    return td_model_load_safetensors(m, src->file, NULL, why, why_len);
  size_t numel = td_model_numel(m);
  if (src->blob == NULL || src->blob_bytes != numel * sizeof(float))
    return td_why(why, why_len, TD_ESHAPE,
                  "the stored model has %zu bytes, the model %s needs %zu", src->blob_bytes,
                  src->model_spec, numel * sizeof(float));
  float *params = td_model_host_params(m);
  memcpy(params, src->blob, src->blob_bytes);
  for (size_t i = 0; i < numel; i++)
    if (!isfinite(params[i]))
      return td_why(why, why_len, TD_ENUMERIC, "the stored model holds a value that is not finite");
  return td_model_push(m, why, why_len);
}

static int open_backend(td_backend_t **be, const td_predict_model_t *src, char *why,
                        size_t why_len) {
  return td_backend_open(be, "cpu", src->threads > 0 ? src->threads : 1, why, why_len);
}

/* A gpt on the held-out text: td_trainer_evaluate_text, as a run's evaluation. */
static int predict_text(const td_predict_opts_t *o, td_backend_t *be, const td_shard_t *data,
                        unsigned batch, td_predict_result_t *out, char *why, size_t why_len) {
  td_trainer_t *tr = NULL;
  td_trainer_opts_t topts = {.model_spec = o->model.model_spec, .batch = batch,
                             .max_batch = batch, .seed = 1, .lr = 0.1,
                             .lr_schedule = "constant", .epochs = 1};
  int rc = td_trainer_open_text(&tr, be, td_text_data(data->text_train),
                                td_text_bytes(data->text_train), &topts, why, why_len);
  if (rc == 0)
    rc = load_weights(td_trainer_model(tr), &o->model, why, why_len);
  if (rc == 0)
    rc = td_trainer_evaluate_text(tr, td_text_data(data->text_valid),
                                  td_text_bytes(data->text_valid), &out->bits_per_byte, why,
                                  why_len);
  out->text = true;
  out->test_split = true;
  out->classes = 256;
  td_trainer_close(&tr);
  return rc;
}

/* A feature model over a labelled split, chunk by chunk as td_trainer_evaluate. */
static int predict_rows(const td_predict_opts_t *o, td_backend_t *be, const td_dataset_t *ds,
                        unsigned batch, td_predict_result_t *out, char *why, size_t why_len) {
  td_model_t *m = NULL;
  int rc = td_model_open(&m, o->model.model_spec, be, (int)batch, why, why_len);
  if (rc == 0 && td_model_input_kind(m) != TD_INPUT_FEATURES)
    rc = td_why(why, why_len, TD_ESHAPE,
                "the model %s reads bytes of text, and the dataset holds float features "
                "(give it a text: dataset)",
                o->model.model_spec);
  else if (rc == 0 && td_dataset_dim(ds) != (size_t)td_model_input_dim(m))
    rc = td_why(why, why_len, TD_ESHAPE,
                "the dataset has %zu features per sample, the model %s reads %d",
                td_dataset_dim(ds), o->model.model_spec, td_model_input_dim(m));
  else if (rc == 0 && td_dataset_classes(ds) > td_model_classes(m))
    rc = td_why(why, why_len, TD_ESHAPE, "the dataset has %d classes, the model %s has %d outputs",
                td_dataset_classes(ds), o->model.model_spec, td_model_classes(m));
  if (rc == 0)
    rc = load_weights(m, &o->model, why, why_len);
  size_t rows = td_dataset_rows(ds), dim = td_dataset_dim(ds);
  int classes = rc == 0 ? td_model_classes(m) : 0;
  float *scratch = NULL; /* a byte dataset's chunk as floats */
  if (rc == 0 && td_dataset_holds_bytes(ds) &&
      (scratch = malloc((size_t)batch * dim * sizeof *scratch)) == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for a chunk of %u rows", batch);
  double loss_sum = 0;
  int correct = 0;
  for (size_t r = 0; rc == 0 && r < rows; r += batch) {
    size_t n = rows - r < batch ? rows - r : batch;
    int hits = 0;
    const int32_t *labels = td_dataset_labels_const(ds) + r;
    const float *x = td_dataset_rows_floats(ds, r, n, scratch);
    rc = td_model_eval_batch(m, x, labels, (int)n, &loss_sum, &hits);
    if (rc != 0) {
      td_why(why, why_len, rc, "evaluation failed: %s", td_strerror(rc));
      break;
    }
    correct += hits;
    const float *logits = td_model_logits(m);
    for (size_t i = 0; o->row != NULL && i < n && rc == 0; i++)
      if (o->row(o->user, r + i, logits + i * (size_t)classes, classes, labels[i]) != 0)
        rc = td_why(why, why_len, TD_EIO, "cannot write the predictions");
  }
  free(scratch);
  out->rows = rows;
  out->classes = classes;
  out->loss = rows ? loss_sum / (double)rows : 0;
  out->accuracy = rows ? (double)correct / (double)rows : 0;
  td_model_close(&m);
  return rc;
}

int td_predict(const td_predict_opts_t *o, td_predict_result_t *out, char *why,
               size_t why_len) {
  *out = (td_predict_result_t){.loss = NAN, .accuracy = NAN, .bits_per_byte = NAN};
  unsigned batch = o->batch > 0 ? o->batch : DEFAULT_BATCH;
  if (batch > TD_MODEL_MAX_BATCH)
    return td_why(why, why_len, TD_ERANGE, "batch %u is over %d", batch, TD_MODEL_MAX_BATCH);
  td_backend_t *be = NULL;
  td_shard_t data = {0};
  td_shard_opts_t so = {.dataset = o->dataset, .partition = "all", .rank = 0, .nodes = 1,
                        .seed = 1};
  /* images:DIR becomes the model's input(C,H,W), as in a run */
  td_image_shape_t *as = &so.images_as;
  int rc = td_model_spec_input_shape(o->model.model_spec, &as->channels, &as->height,
                                     &as->width, why, why_len);
  if (rc == 0)
    rc = open_backend(&be, &o->model, why, why_len);
  if (rc == 0)
    rc = td_shard_open(&data, &so, why, why_len);
  if (rc == 0 && data.text_train != NULL) {
    rc = predict_text(o, be, &data, batch, out, why, why_len);
  } else if (rc == 0) {
    out->test_split = data.test != NULL;
    rc = predict_rows(o, be, data.test != NULL ? data.test : data.train, batch, out, why,
                      why_len);
  }
  td_shard_close(&data);
  td_backend_close(&be);
  return rc;
}

/* One byte from logits: argmax at temperature 0, else a draw from
 * softmax(logits / T) (in double, the largest logit subtracted first). */
static uint8_t sample_byte(const float *logits, int vocab, double temperature, td_rng_t *rng,
                           double *p) {
  int best = 0;
  for (int v = 1; v < vocab; v++)
    if (logits[v] > logits[best])
      best = v;
  if (temperature <= 0)
    return (uint8_t)best;
  double sum = 0;
  for (int v = 0; v < vocab; v++)
    sum += p[v] = exp(((double)logits[v] - (double)logits[best]) / temperature);
  double u = td_rng_uniform(rng) * sum;
  for (int v = 0; v < vocab; v++) {
    if (u < p[v])
      return (uint8_t)v;
    u -= p[v];
  }
  return (uint8_t)best; /* rounding left u at the very end */
}

int td_generate(const td_generate_opts_t *o, uint8_t **out, char *why, size_t why_len) {
  *out = NULL;
  if (o->prompt == NULL || o->prompt_len == 0)
    return td_why(why, why_len, TD_EINVAL, "the prompt is empty: give at least one byte");
  if (!(o->temperature >= 0) || !isfinite(o->temperature))
    return td_why(why, why_len, TD_EINVAL, "the temperature must be a finite number >= 0");
  td_backend_t *be = NULL;
  td_model_t *m = NULL;
  int rc = open_backend(&be, &o->model, why, why_len);
  if (rc == 0)
    rc = td_model_open(&m, o->model.model_spec, be, 1, why, why_len);
  if (rc == 0 && (td_model_input_kind(m) != TD_INPUT_TOKENS || td_model_classes(m) != 256))
    rc = td_why(why, why_len, TD_ECONFIG,
                "the model %s is not a gpt: generate samples bytes from a gpt model",
                o->model.model_spec);
  if (rc == 0)
    rc = load_weights(m, &o->model, why, why_len);
  int context = rc == 0 ? td_model_context(m) : 0;
  size_t total = o->prompt_len + o->tokens;
  uint8_t *text = rc == 0 ? malloc(total) : NULL;
  int32_t *tokens = rc == 0 ? calloc((size_t)context, sizeof *tokens) : NULL;
  int32_t *targets = rc == 0 ? calloc((size_t)context, sizeof *targets) : NULL;
  double *p = rc == 0 ? malloc(256 * sizeof *p) : NULL;
  if (rc == 0 && (text == NULL || tokens == NULL || targets == NULL || p == NULL))
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory for %zu bytes of text", total);
  td_rng_t rng;
  td_rng_seed2(&rng, o->seed, 0x47454e45ull); /* "GENE" */
  if (rc == 0)
    memcpy(text, o->prompt, o->prompt_len);
  for (size_t have = o->prompt_len; rc == 0 && have < total; have++) {
    size_t window = have < (size_t)context ? have : (size_t)context;
    for (size_t t = 0; t < (size_t)context; t++)
      tokens[t] = t < window ? text[have - window + t] : 0;
    td_batch_t b = {.rows = 1, .tokens = tokens, .targets = targets};
    double loss_sum = 0;
    rc = td_model_eval(m, &b, &loss_sum, NULL);
    if (rc != 0) {
      td_why(why, why_len, rc, "the gpt's forward pass failed: %s", td_strerror(rc));
      break;
    }
    text[have] = sample_byte(td_model_logits(m) + (window - 1) * 256, 256, o->temperature, &rng,
                             p);
  }
  if (rc == 0) {
    *out = malloc(o->tokens > 0 ? o->tokens : 1);
    if (*out == NULL)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
    else
      memcpy(*out, text + o->prompt_len, o->tokens);
  }
  free(p);
  free(targets);
  free(tokens);
  free(text);
  td_model_close(&m);
  td_backend_close(&be);
  return rc;
}
