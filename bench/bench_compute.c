/* bench_compute.c: how close a training step gets to the BLAS limit.
 *
 * For mlp:784-256-128-10 at batch 16, 64 and 256 on one thread, it times the
 * full training step (forward, loss, backward, fused SGD update) and, in the
 * same run, exactly the sgemm calls that step makes on the same shapes. The
 * efficiency is training FLOP/s / sgemm FLOP/s (1.0 = every cycle outside the
 * GEMMs is free). Blocks of the two are interleaved and the best block of each
 * is kept, so frequency drift affects both alike. Then one epoch of real
 * Fashion-MNIST training reports samples/s and resident memory before and
 * after (flat memory: no allocation per step).
 *
 * Then, per model family (mlp, cnn, resnet, gpt:4-128-4-128), training
 * throughput at 1 and 2 threads with the same step-vs-sgemm efficiency, each
 * configuration in its own child process so its peak RSS is its own. The
 * PyTorch 1.13 CPU reference on this kind of machine: cnn 790-930 samples/s
 * (1 thread, batch 64, SGD), gpt:4-128-4-128 6,100-7,700 tokens/s (1 thread,
 * batch 16x128, AdamW; here the update is SGD with momentum, which costs the
 * same one pass over the parameters within a few percent of a step). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/rng.h"
#include "compute/trainer.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kb(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f != NULL) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
      resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int bench_batch(td_backend_t *be, int batch) {
  char why[256];
  td_model_t *m = NULL;
  if (td_model_open(&m, "mlp:784-256-128-10", be, batch, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
  td_model_init(m, 1);
  td_sgd_t *sgd = NULL;
  td_sgd_opts_t so = {.momentum = 0.9};
  td_sgd_open(&sgd, be, td_model_numel(m), &so);
  float *x = malloc((size_t)batch * 784 * sizeof *x);
  int32_t *y = malloc((size_t)batch * sizeof *y);
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  for (int i = 0; i < batch * 784; i++)
    x[i] = (float)td_rng_normal(&rng);
  for (int i = 0; i < batch; i++)
    y[i] = (int32_t)td_rng_below(&rng, 10);

  /* ~0.2 s per block at this batch size */
  int reps = (int)(2e9 / td_model_train_gemm_flops(m, batch)) + 1;
  double best_train = 1e30, best_gemm = 1e30;
  for (int block = 0; block < 7; block++) {
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
      double loss;
      int hits;
      td_model_train_batch(m, x, y, batch, &loss, &hits);
      td_sgd_step(sgd, td_model_params(m), td_model_grads(m), 1e-4);
    }
    double t1 = now_s();
    for (int r = 0; r < reps; r++)
      td_model_gemm_only(m, x, batch);
    double t2 = now_s();
    if (block > 0) { /* block 0 warms caches and clocks */
      best_train = t1 - t0 < best_train ? t1 - t0 : best_train;
      best_gemm = t2 - t1 < best_gemm ? t2 - t1 : best_gemm;
    }
  }
  double flops = td_model_train_gemm_flops(m, batch) * reps;
  printf("batch %4d  %9.0f samples/s  train %6.1f GFLOP/s  sgemm %6.1f GFLOP/s  "
         "efficiency %.3f\n",
         batch, batch * reps / best_train, flops / best_train * 1e-9, flops / best_gemm * 1e-9,
         best_gemm / best_train);
  free(x);
  free(y);
  td_sgd_close(&sgd);
  td_model_close(&m);
  return 0;
}

static int bench_epoch(td_backend_t *be) {
  char why[512];
  td_dataset_t *train = NULL, *test = NULL;
  if (td_dataset_open(&train, &test, "fashion-mnist", why, sizeof why) != 0) {
    printf("epoch benchmark skipped: %s\n", why);
    return 0;
  }
  double mean, std;
  td_dataset_stats(train, &mean, &std);
  td_dataset_normalize(train, mean, std);
  td_trainer_t *tr = NULL;
  td_trainer_opts_t o = {.model_spec = "mlp:784-256-128-10", .batch = 64, .seed = 1,
                         .lr = 0.05, .lr_schedule = "constant", .epochs = 1,
                         .optim = {.momentum = 0.9}};
  if (td_trainer_open(&tr, be, train, &o, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
  td_train_stats_t st, st2;
  td_trainer_steps(tr, 20, &st, why, sizeof why);
  long rss_start = rss_kb();
  td_trainer_steps(tr, td_trainer_steps_per_epoch(tr) - 20, &st2, why, sizeof why);
  long rss_end = rss_kb();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("fashion-mnist epoch, batch 64, 1 thread: %.0f samples/s (shuffle included), "
         "RSS %ld kB after 20 steps, %ld kB after the epoch (delta %+ld kB), peak %ld kB\n",
         (double)st2.samples / st2.seconds, rss_start, rss_end, rss_end - rss_start,
         ru.ru_maxrss);
  td_trainer_close(&tr);
  td_dataset_close(&train);
  td_dataset_close(&test);
  return 0;
}

/* One family at one thread count, in this (child) process. */
static int bench_family_child(const char *spec, int batch, int threads) {
  char why[256];
  td_backend_t *be = NULL;
  td_model_t *m = NULL;
  if (td_backend_open(&be, "cpu", threads, why, sizeof why) != 0 ||
      td_model_open(&m, spec, be, batch, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
  td_model_init(m, 1);
  td_sgd_t *sgd = NULL;
  td_sgd_opts_t so = {.momentum = 0.9};
  td_sgd_open(&sgd, be, td_model_numel(m), &so);
  int t = td_model_context(m), dim = td_model_input_dim(m);
  bool tokens = td_model_input_kind(m) == TD_INPUT_TOKENS;
  float *x = tokens ? NULL : malloc((size_t)batch * (size_t)dim * sizeof *x);
  int32_t *tok = malloc((size_t)batch * (size_t)t * sizeof *tok);
  int32_t *y = malloc((size_t)batch * (size_t)t * sizeof *y);
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  for (int i = 0; x != NULL && i < batch * dim; i++)
    x[i] = (float)td_rng_normal(&rng);
  for (int i = 0; i < batch * t; i++) {
    tok[i] = (int32_t)td_rng_below(&rng, 256);
    y[i] = (int32_t)td_rng_below(&rng, (uint32_t)td_model_classes(m));
  }
  td_batch_t b = {.rows = batch, .x = x, .tokens = tokens ? tok : NULL, .targets = y};
  double t0 = now_s();
  td_model_train(m, &b, NULL, NULL); /* one warm-up step sizes the blocks: ~1 s each */
  td_sgd_step(sgd, td_model_params(m), td_model_grads(m), 1e-4);
  int reps = (int)(1.0 / (now_s() - t0)) + 1;
  double best_train = 1e30, best_gemm = 1e30;
  for (int block = 0; block < 4; block++) {
    double t1 = now_s();
    for (int r = 0; r < reps; r++) {
      td_model_train(m, &b, NULL, NULL);
      td_sgd_step(sgd, td_model_params(m), td_model_grads(m), 1e-4);
    }
    double t2 = now_s();
    for (int r = 0; r < reps; r++)
      td_model_gemm_only(m, x, batch);
    double t3 = now_s();
    if (block > 0) {
      best_train = t2 - t1 < best_train ? t2 - t1 : best_train;
      best_gemm = t3 - t2 < best_gemm ? t3 - t2 : best_gemm;
    }
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double flops = td_model_train_gemm_flops(m, batch) * reps;
  printf("%-20s batch %3d  %d thread%s  %9.0f samples/s", spec, batch, threads,
         threads > 1 ? "s" : " ", batch * reps / best_train);
  if (tokens)
    printf(" %8.0f tokens/s", (double)batch * t * reps / best_train);
  else
    printf("                 ");
  printf("  train %5.1f GFLOP/s  sgemm %5.1f GFLOP/s  efficiency %.2f  peak RSS %ld MB\n",
         flops / best_train * 1e-9, flops / best_gemm * 1e-9, best_gemm / best_train,
         ru.ru_maxrss / 1024);
  fflush(stdout);
  free(x);
  free(tok);
  free(y);
  td_sgd_close(&sgd);
  td_model_close(&m);
  td_backend_close(&be);
  return 0;
}

static int bench_families(void) {
  static const struct {
    const char *spec;
    int batch;
  } fam[] = {{"mlp:784-256-128-10", 64}, {"cnn", 64}, {"resnet", 64}, {"gpt:4-128-4-128", 16}};
  printf("model families: training step (forward, loss, backward, SGD) vs the same sgemm calls\n");
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
    for (int threads = 1; threads <= 2; threads++) {
      fflush(stdout);
      pid_t pid = fork();
      if (pid < 0)
        return 1;
      if (pid == 0)
        _exit(bench_family_child(fam[i].spec, fam[i].batch, threads));
      int status = 0;
      if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    }
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* children print their own lines in order */
  char why[256];
  td_backend_t *be = NULL;
  if (td_backend_open(&be, "cpu", 1, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
  printf("compute: mlp:784-256-128-10, one thread, training step vs the same sgemm calls\n");
  int rc = 0;
  static const int batches[] = {16, 64, 256};
  for (size_t i = 0; i < sizeof batches / sizeof batches[0] && rc == 0; i++)
    rc = bench_batch(be, batches[i]);
  if (rc == 0)
    rc = bench_epoch(be);
  td_backend_close(&be);
  if (rc == 0)
    rc = bench_families();
  return rc;
}
