/* bench_compute.c: how close a training step gets to the BLAS limit.
 *
 * For mlp:784-256-128-10 at batch 16, 64 and 256 on one thread, it times the
 * full training step (forward, loss, backward, fused SGD update) and, in the
 * same run, exactly the sgemm calls that step makes on the same shapes. The
 * efficiency is training FLOP/s / sgemm FLOP/s (1.0 = every cycle outside the
 * GEMMs is free). Blocks of the two are interleaved and the best block of each
 * is kept, so frequency drift affects both alike. Then one epoch of real
 * Fashion-MNIST training reports samples/s and resident memory before and
 * after (flat memory: no allocation per step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "compute/error.h"
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
                         .sgd = {.momentum = 0.9}};
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

int main(void) {
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
  return rc;
}
