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
 * configuration in its own child process so its peak RSS is its own, and
 * the two thread counts alternated over a few rounds so that a machine
 * shared with other work slows both alike (min, median, max reported). At 2
 * threads the sgemm reference is the same calls split the way the backend
 * splits them (row or column blocks, attention heads), on the same pool.
 * On one thread the rate per second of CPU time is printed too: it does
 * not count the time the scheduler gave to other processes, so on a loaded
 * machine it is the better estimate of what a quiet one does.
 * Its figures, and PyTorch's on the same models for scale: bench/RESULTS.md. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/optim.h"
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

/* ---- the sgemm reference: a train step's GEMMs, replayed here ---- */

/* Exactly the GEMM calls of one train step (td_model_train_gemms: shapes,
 * transposes, leading dimensions) on operands of their own: calls made once
 * go through the backend, which splits them over its threads as the model's
 * do; runs of calls repeated per (image, head) are split over the pairs, as
 * the attention kernel splits them. The operands hold zeros (BLAS speed does
 * not depend on values) and are shared by all calls, each repeat on its own
 * slice. */
typedef struct {
  td_backend_t *be;
  td_model_gemm_t *list;
  size_t count;
  float *a, *b, *c;
  size_t a_floats, b_floats, c_floats; /* one repeat's slice */
} gemm_replay_t;

static size_t rows_a(const td_model_gemm_t *g) { return (size_t)(g->trans_a ? g->k : g->m); }
static size_t rows_b(const td_model_gemm_t *g) { return (size_t)(g->trans_b ? g->n : g->k); }

static int gemm_replay_open(gemm_replay_t *r, td_backend_t *be, const td_model_t *m, int rows) {
  *r = (gemm_replay_t){.be = be, .count = td_model_train_gemms(m, rows, NULL, 0)};
  r->list = calloc(r->count, sizeof *r->list);
  if (r->list == NULL)
    return TD_ENOMEM;
  td_model_train_gemms(m, rows, r->list, r->count);
  size_t most_repeat = 1;
  for (size_t i = 0; i < r->count; i++) {
    const td_model_gemm_t *g = &r->list[i];
    size_t a = rows_a(g) * (size_t)g->lda, b = rows_b(g) * (size_t)g->ldb;
    size_t c = (size_t)g->m * (size_t)g->ldc;
    r->a_floats = a > r->a_floats ? a : r->a_floats;
    r->b_floats = b > r->b_floats ? b : r->b_floats;
    r->c_floats = c > r->c_floats ? c : r->c_floats;
    most_repeat = g->repeat > most_repeat ? g->repeat : most_repeat;
  }
  r->a = calloc(r->a_floats * most_repeat, sizeof(float));
  r->b = calloc(r->b_floats * most_repeat, sizeof(float));
  r->c = calloc(r->c_floats * most_repeat, sizeof(float));
  return r->a != NULL && r->b != NULL && r->c != NULL ? 0 : TD_ENOMEM;
}

static void gemm_replay_close(gemm_replay_t *r) {
  free(r->list);
  free(r->a);
  free(r->b);
  free(r->c);
  *r = (gemm_replay_t){0};
}

static void gemm_call(const gemm_replay_t *r, const td_model_gemm_t *g, size_t slice) {
  td_backend_gemm(r->be, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f,
                  r->a + slice * r->a_floats, g->lda, r->b + slice * r->b_floats, g->ldb, 0.0f,
                  r->c + slice * r->c_floats, g->ldc);
}

typedef struct {
  const gemm_replay_t *r;
  size_t first, last; /* a run of repeated calls, [first, last) */
} gemm_run_t;

static void gemm_run_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  const gemm_run_t *run = arg;
  for (size_t slice = begin; slice < end; slice++)
    for (size_t i = run->first; i < run->last; i++)
      gemm_call(run->r, &run->r->list[i], slice);
}

static void gemm_replay(const gemm_replay_t *r) {
  for (size_t i = 0; i < r->count;) {
    const td_model_gemm_t *g = &r->list[i];
    if (g->repeat == 1) {
      gemm_call(r, g, 0);
      i++;
      continue;
    }
    gemm_run_t run = {.r = r, .first = i, .last = i};
    while (run.last < r->count && r->list[run.last].repeat == g->repeat)
      run.last++;
    td_backend_parallel_for(r->be, g->repeat, gemm_run_part, &run);
    i = run.last;
  }
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

  gemm_replay_t replay;
  if (gemm_replay_open(&replay, be, m, batch) != 0) {
    fprintf(stderr, "bench: out of memory for the sgemm reference\n");
    return 1;
  }
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
      gemm_replay(&replay);
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
  gemm_replay_close(&replay);
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

typedef struct {
  double samples_per_s, tokens_per_s, train_gflops, sgemm_gflops, efficiency;
  double samples_per_cpu_s; /* per second of this process's CPU time */
  long peak_rss_mb;
} family_result_t;

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One family at one thread count, in this (child) process: the training step
 * (forward, loss, backward, optimizer: SGD with momentum 0.9, or AdamW for
 * token models, as the PyTorch reference) against exactly its GEMMs. */
static int bench_family_child(const char *spec, int batch, int threads, family_result_t *res) {
  char why[256];
  td_backend_t *be = NULL;
  td_model_t *m = NULL;
  if (td_backend_open(&be, "cpu", threads, why, sizeof why) != 0 ||
      td_model_open(&m, spec, be, batch, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
  td_model_init(m, 1);
  int t = td_model_context(m), dim = td_model_input_dim(m);
  bool tokens = td_model_input_kind(m) == TD_INPUT_TOKENS;
  td_optim_t *opt = NULL;
  td_optim_opts_t oo = {.kind = tokens ? TD_OPTIM_ADAMW : TD_OPTIM_SGD, .momentum = 0.9,
                        .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                        .weight_decay = tokens ? 0.1 : 0.0};
  if (td_optim_open(&opt, be, td_model_numel(m), &oo, why, sizeof why) != 0) {
    fprintf(stderr, "bench: %s\n", why);
    return 1;
  }
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
  td_model_train(m, &b, NULL, NULL); /* one warm-up step sizes the blocks: ~0.5 s each */
  td_optim_step(opt, td_model_params(m), td_model_grads(m), 1e-4);
  int reps = (int)(0.5 / (now_s() - t0)) + 1;
  /* a step allocates nothing: training's peak RSS is reached by now, before
   * the reference's operands exist */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  gemm_replay_t replay;
  if (gemm_replay_open(&replay, be, m, batch) != 0) {
    fprintf(stderr, "bench: out of memory for the sgemm reference\n");
    return 1;
  }
  double best_train = 1e30, best_gemm = 1e30, best_cpu = 1e30;
  for (int block = 0; block < 4; block++) {
    double t1 = now_s(), c1 = cpu_s();
    for (int r = 0; r < reps; r++) {
      td_model_train(m, &b, NULL, NULL);
      td_optim_step(opt, td_model_params(m), td_model_grads(m), 1e-4);
    }
    double t2 = now_s(), c2 = cpu_s();
    for (int r = 0; r < reps; r++)
      gemm_replay(&replay);
    double t3 = now_s();
    if (block > 0) {
      best_train = t2 - t1 < best_train ? t2 - t1 : best_train;
      best_gemm = t3 - t2 < best_gemm ? t3 - t2 : best_gemm;
      best_cpu = c2 - c1 < best_cpu ? c2 - c1 : best_cpu;
    }
  }
  gemm_replay_close(&replay);
  double flops = td_model_train_gemm_flops(m, batch) * reps;
  *res = (family_result_t){
      .samples_per_cpu_s = batch * reps / best_cpu,
      .samples_per_s = batch * reps / best_train,
      .tokens_per_s = tokens ? (double)batch * t * reps / best_train : 0,
      .train_gflops = flops / best_train * 1e-9,
      .sgemm_gflops = flops / best_gemm * 1e-9,
      .efficiency = best_gemm / best_train,
      .peak_rss_mb = ru.ru_maxrss / 1024,
  };
  free(x);
  free(tok);
  free(y);
  td_optim_close(&opt);
  td_model_close(&m);
  td_backend_close(&be);
  return 0;
}

/* Run the child for (spec, batch, threads) in its own process (its own peak
 * RSS, its own thread pool) and read its result back through a pipe. */
static int run_family(const char *spec, int batch, int threads, family_result_t *res) {
  int fds[2];
  if (pipe(fds) != 0)
    return 1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    return 1;
  if (pid == 0) {
    close(fds[0]);
    family_result_t r;
    int rc = bench_family_child(spec, batch, threads, &r);
    if (rc == 0 && write(fds[1], &r, sizeof r) != (ssize_t)sizeof r)
      rc = 1;
    _exit(rc);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], res, sizeof *res);
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      got != (ssize_t)sizeof *res)
    return 1;
  return 0;
}

static int by_rate(const void *a, const void *b) {
  double x = ((const family_result_t *)a)->samples_per_s;
  double y = ((const family_result_t *)b)->samples_per_s;
  return (x > y) - (x < y);
}

#define TD_BENCH_ROUNDS 3

/* Per family, TD_BENCH_ROUNDS rounds of (1 thread, 2 threads) side by side,
 * so load from elsewhere on the machine hits both alike; min, median and
 * max over the rounds, the median's efficiency, and the 2-thread speed-up of
 * the medians. */
static int bench_families(void) {
  static const struct {
    const char *spec;
    int batch;
  } fam[] = {{"mlp:784-256-128-10", 64}, {"cnn", 64}, {"resnet", 64}, {"gpt:4-128-4-128", 16}};
  double load[3] = {0};
  if (getloadavg(load, 3) < 0)
    load[0] = -1;
  printf("model families: training step (forward, loss, backward, optimizer: SGD momentum 0.9, "
         "AdamW for gpt) vs the same sgemm calls,\n%d rounds of 1 and 2 threads side by side; "
         "load average %.2f at the start\n",
         TD_BENCH_ROUNDS, load[0]);
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
    family_result_t r[2][TD_BENCH_ROUNDS];
    for (int round = 0; round < TD_BENCH_ROUNDS; round++)
      for (int threads = 1; threads <= 2; threads++)
        if (run_family(fam[i].spec, fam[i].batch, threads, &r[threads - 1][round]) != 0)
          return 1;
    double median[2];
    for (int th = 0; th < 2; th++) {
      qsort(r[th], TD_BENCH_ROUNDS, sizeof r[th][0], by_rate);
      const family_result_t *lo = &r[th][0], *med = &r[th][TD_BENCH_ROUNDS / 2],
                            *hi = &r[th][TD_BENCH_ROUNDS - 1];
      median[th] = med->samples_per_s;
      bool tokens = med->tokens_per_s > 0;
      double unit = tokens ? med->tokens_per_s / med->samples_per_s : 1.0;
      printf("%-20s batch %3d  %d thread%s  %s/s min %8.0f  median %8.0f  max %8.0f  "
             "train %5.1f GFLOP/s  sgemm %5.1f GFLOP/s  efficiency %.2f  peak RSS %ld MB",
             fam[i].spec, fam[i].batch, th + 1, th ? "s" : " ", tokens ? "tokens " : "samples",
             lo->samples_per_s * unit, med->samples_per_s * unit, hi->samples_per_s * unit,
             med->train_gflops, med->sgemm_gflops, med->efficiency, med->peak_rss_mb);
      if (th == 0) { /* one thread: CPU time is the work itself, whatever else runs */
        double cpu_best = 0;
        for (int round = 0; round < TD_BENCH_ROUNDS; round++)
          cpu_best = fmax(cpu_best, r[0][round].samples_per_cpu_s);
        printf("  (best %.0f per CPU-second)", cpu_best * unit);
      }
      printf("\n");
    }
    printf("%-20s 2 threads / 1 thread (medians): %.2fx\n", fam[i].spec, median[1] / median[0]);
    fflush(stdout);
  }
  if (getloadavg(load, 3) >= 0)
    printf("load average %.2f at the end\n", load[0]);
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
