/* standalone.c: the single-node trainer behind `traind --standalone`.
 *
 * The data comes from td_shard_open (compute/data/shard.h), the same loading a peer
 * run uses: normalisation statistics from the whole training set before it is
 * partitioned, so every node of a later multi-node run (and this baseline)
 * sees identically scaled inputs. Runs on the main thread. */
#include "daemon/run/standalone.h"

#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/progress.h"

#include "compute/backend.h"
#include "compute/data/dataset.h"
#include "common/error.h"
#include "compute/data/shard.h"
#include "compute/model.h"
#include "compute/safetensors.h"
#include "compute/trainer.h"
#include "daemon/base/clock.h"

static long peak_rss_kb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

int td_standalone_run(const td_runspec_t *rs, bool json, FILE *out, td_standalone_keep_fn keep,
                      void *keep_user, char *why, size_t why_len) {
  td_backend_t *be = NULL;
  td_shard_t data = {0};
  td_trainer_t *tr = NULL;
  td_progress_t *bar = NULL;
  int rc = td_runspec_validate(rs, why, why_len);
  if (rc != 0)
    return rc;
  td_standalone_epoch_t *epoch = calloc(rs->epochs, sizeof *epoch);
  if (epoch == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory for %u epochs", rs->epochs);
  rc = td_backend_open(&be, rs->backend, (int)rs->threads, why, why_len);
  if (rc != 0)
    goto done;
  td_shard_opts_t shard = {.dataset = td_runspec_dataset(rs), .partition = rs->partition,
                           .rank = rs->node_rank, .nodes = rs->node_count, .seed = rs->seed};
  /* images:DIR becomes what the model reads (input(C,H,W)) */
  td_image_shape_t *as = &shard.images_as;
  rc = td_model_spec_input_shape(rs->model, &as->channels, &as->height, &as->width, why,
                                 why_len);
  if (rc == 0)
    rc = td_shard_open(&data, &shard, why, why_len);
  if (rc != 0)
    goto done;
  td_dataset_t *train = data.train, *test = data.test;
  bool text = data.text_train != NULL;

  td_trainer_opts_t opts = {
      .model_spec = rs->model,
      .batch = rs->batch,
      .seed = rs->seed,
      .lr = rs->lr,
      .lr_schedule = rs->lr_schedule,
      .warmup_steps = rs->warmup_steps,
      .epochs = rs->epochs,
  };
  td_runspec_optim_opts(rs, &opts.optim);
  if (text)
    rc = td_trainer_open_text(&tr, be, td_text_data(data.text_train),
                              td_text_bytes(data.text_train), &opts, why, why_len);
  else
    rc = td_trainer_open(&tr, be, train, &opts, why, why_len);
  if (rc != 0)
    goto done;
  const td_dataset_t *eval_set = test != NULL ? test : train;
  if (test != NULL && (rc = td_trainer_check_dataset(tr, test, why, why_len)) != 0)
    goto done;
  /* init = FILE: start from it, and say what it scores before any step */
  double init_loss = NAN, init_acc = NAN, init_bpb = NAN;
  if (strcmp(rs->init, "none") != 0) {
    char inner[512];
    if ((rc = td_model_load_safetensors(td_trainer_model(tr), rs->init, rs->init_hash, inner,
                                        sizeof inner)) !=
        0) {
      td_why(why, why_len, rc, "init: %s", inner);
      goto done;
    }
    rc = text ? td_trainer_evaluate_text(tr, td_text_data(data.text_valid),
                                         td_text_bytes(data.text_valid), &init_bpb, why, why_len)
              : td_trainer_evaluate(tr, eval_set, &init_loss, &init_acc, why, why_len);
    if (rc != 0)
      goto done;
  }
  double started = td_clock_wall_s();
  unsigned long spe = td_trainer_steps_per_epoch(tr);
  size_t params = td_layout_param_count(td_model_layout(td_trainer_model(tr)));
  fprintf(out, "traind standalone: %s (%zu parameters) on %s, partition %s node %u/%u\n", rs->model,
          params, td_runspec_dataset(rs), rs->partition, rs->node_rank, rs->node_count);
  if (text)
    fprintf(out,
            "  %zu training bytes, %zu held-out bytes, batch %u windows, %lu steps/epoch, "
            "backend %s\n",
            td_text_bytes(data.text_train), td_text_bytes(data.text_valid), rs->batch, spe,
            td_backend_name(be));
  else
    fprintf(out,
            "  %zu training samples, %zu %s samples, batch %u, %lu steps/epoch, backend %s\n",
            td_dataset_rows(train), td_dataset_rows(eval_set),
            test ? "test" : "training (no test set)", rs->batch, spe, td_backend_name(be));
  if (strcmp(rs->init, "none") != 0 && text)
    fprintf(out, "  init %s: valid_bpb %.6f before training\n", rs->init, init_bpb);
  else if (strcmp(rs->init, "none") != 0)
    fprintf(out, "  init %s: %s_loss %.6f  %s_acc %.6f before training\n", rs->init,
            test ? "test" : "train", init_loss, test ? "test" : "train", init_acc);
  fflush(out);

  double total_seconds = 0, train_loss = 0, train_acc = 0, eval_loss = 0, eval_acc = 0;
  double eval_bpb = NAN;
  unsigned long total_samples = 0;
  /* on a terminal a bar with ETA moves through each epoch (in ~100 chunks of
   * steps, which train exactly as one call would); elsewhere, plain lines */
  bool tty = isatty(fileno(out)) == 1;
  if ((rc = td_progress_open(&bar, out, (uint64_t)spe * rs->epochs, "steps", tty)) != 0)
    goto done;
  unsigned long chunk = tty ? (spe + 99) / 100 : spe;
  for (unsigned e = 1; e <= rs->epochs; e++) {
    double epoch_started = td_clock_wall_s();
    td_train_stats_t st = {0};
    double loss_sum = 0, hits = 0;
    for (unsigned long done_steps = 0; done_steps < spe;) {
      td_train_stats_t part;
      unsigned long n = spe - done_steps < chunk ? spe - done_steps : chunk;
      rc = td_trainer_steps(tr, n, &part, why, why_len);
      if (rc != 0)
        goto done;
      if (done_steps == 0 && n == spe) {
        st = part;
      } else {
        loss_sum += part.loss * (double)part.samples;
        hits += part.accuracy * (double)part.samples;
        st.steps += part.steps;
        st.samples += part.samples;
        st.seconds += part.seconds;
        st.lr = part.lr;
        st.loss = st.samples ? loss_sum / (double)st.samples : 0;
        st.accuracy = st.samples ? hits / (double)st.samples : 0;
      }
      done_steps += n;
      char status[64];
      snprintf(status, sizeof status, "epoch %u/%u  loss %.4f", e, rs->epochs, part.loss);
      td_progress_update(bar, (uint64_t)(e - 1) * spe + done_steps, status);
    }
    if (text)
      rc = td_trainer_evaluate_text(tr, td_text_data(data.text_valid),
                                    td_text_bytes(data.text_valid), &eval_bpb, why, why_len);
    else
      rc = td_trainer_evaluate(tr, eval_set, &eval_loss, &eval_acc, why, why_len);
    if (rc != 0)
      goto done;
    epoch[e - 1] = (td_standalone_epoch_t){
        .started = epoch_started, .ended = td_clock_wall_s(), .steps = st.steps,
        .samples = st.samples, .loss = st.loss, .eval_acc = text ? NAN : eval_acc,
        .eval_bpb = text ? eval_bpb : NAN, .lr = st.lr, .seconds = st.seconds};
    total_seconds += st.seconds;
    total_samples += st.samples;
    train_loss = st.loss;
    train_acc = st.accuracy;
    if (text)
      td_progress_line(bar,
                       "epoch %3u/%u  train_loss %.4f  valid_bpb %.4f  lr %.4g  %.0f samples/s  "
                       "%.2f s",
                       e, rs->epochs, st.loss, eval_bpb, st.lr,
                       st.seconds > 0 ? (double)st.samples / st.seconds : 0.0, st.seconds);
    else
      td_progress_line(bar,
                       "epoch %3u/%u  train_loss %.4f  train_acc %.4f  %s_loss %.4f  %s_acc %.4f  "
                       "lr %.4g  %.0f samples/s  %.2f s",
                       e, rs->epochs, st.loss, st.accuracy, test ? "test" : "train", eval_loss,
                       test ? "test" : "train", eval_acc, st.lr,
                       st.seconds > 0 ? (double)st.samples / st.seconds : 0.0, st.seconds);
  }
  td_progress_close(&bar);

  td_standalone_end_t end = {.model = td_trainer_model(tr), .epochs = rs->epochs,
                             .epoch = epoch, .metric = text ? eval_bpb : eval_acc,
                             .started = started};
  if (keep != NULL) {
    if ((rc = td_model_pull(end.model, why, why_len)) != 0 ||
        (rc = keep(&end, keep_user, why, why_len)) != 0)
      goto done;
  }
  if (json) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "model", json_object_new_string(rs->model));
    json_object_object_add(o, "dataset", json_object_new_string(td_runspec_dataset(rs)));
    json_object_object_add(o, "epochs", json_object_new_int((int)rs->epochs));
    json_object_object_add(o, "steps",
                           json_object_new_int64((int64_t)td_trainer_global_step(tr)));
    json_object_object_add(o, "train_samples", json_object_new_int64((int64_t)total_samples));
    json_object_object_add(o, "train_loss", json_object_new_double(train_loss));
    if (text) { /* text reports bits per byte on the held-out bytes, not accuracy */
      json_object_object_add(o, "eval_set", json_object_new_string("valid"));
      json_object_object_add(o, "test_bpb", json_object_new_double(eval_bpb));
    } else {
      json_object_object_add(o, "train_accuracy", json_object_new_double(train_acc));
      /* Without a test set the figures are measured on the training partition;
       * eval_set says which. */
      json_object_object_add(o, "eval_set", json_object_new_string(test ? "test" : "train"));
      json_object_object_add(o, "test_loss", json_object_new_double(eval_loss));
      json_object_object_add(o, "test_accuracy", json_object_new_double(eval_acc));
    }
    if (strcmp(rs->init, "none") != 0) { /* the loaded model, before any step */
      json_object_object_add(o, "init", json_object_new_string(rs->init));
      if (text)
        json_object_object_add(o, "init_test_bpb", json_object_new_double(init_bpb));
      else {
        json_object_object_add(o, "init_test_loss", json_object_new_double(init_loss));
        json_object_object_add(o, "init_test_accuracy", json_object_new_double(init_acc));
      }
    }
    if (end.kept_as[0] != '\0')
      json_object_object_add(o, "run_id", json_object_new_string(end.kept_as));
    json_object_object_add(o, "train_seconds", json_object_new_double(total_seconds));
    json_object_object_add(o, "samples_per_s",
                           json_object_new_double(total_seconds > 0
                                                      ? (double)total_samples / total_seconds
                                                      : 0.0));
    json_object_object_add(o, "peak_rss_kb", json_object_new_int64(peak_rss_kb()));
    fprintf(out, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
  }
  rc = 0;
done:
  free(epoch);
  td_progress_close(&bar);
  td_trainer_close(&tr);
  td_shard_close(&data);
  td_backend_close(&be);
  return rc;
}
