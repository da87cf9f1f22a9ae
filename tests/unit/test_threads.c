/* test_threads.c: the CPU backend's thread pool (compute/cpu/tpool.h) and the
 * claim it rests on: `threads = N` computes exactly what one thread does.
 *
 * The pool itself: every index of a job runs exactly once, in the documented
 * static chunks (whole grains, chunk k on part k), a job from inside a job
 * runs inline on its own thread, and thousands of back-to-back jobs (the
 * hand-off a training step repeats hundreds of times) lose none.
 * Then the kernels, on 2 and 3 threads against 1 thread. Every op other than
 * the GEMM gives the same bits (tolerance 0; the loss, a double summed per
 * chunk, to 1e-12 relative). A GEMM split into row or column blocks differs
 * from the one call by rounding only: element by element within the
 * a-priori bound of a float dot product of k terms, which a product missing
 * one term exceeds many times. Not bit for bit: OpenBLAS picks its kernel by
 * size, and on an AVX-512 CPU (a Zen 4, which OpenBLAS 0.3.21 runs as
 * Cooper Lake) its small-matrix kernels sum a block in another order than
 * the whole (171 rows on 3 threads differed; an empirical 1e-6 of the
 * largest element for column blocks gave 1.4e-6 there). Whole training
 * steps of each family (mlp, cnn, resnet, gpt, and a layer list with
 * dropout, average pooling and a strided conv): bit for bit where every GEMM
 * splits by rows into large blocks (a gpt of width 128 on 128 positions,
 * with AdamW), else, with SGD, gradients and parameters
 * within 1e-4 of each tensor's largest value over three steps (the gradients
 * differ by about 1e-7, less than a 1-ulp change of the input makes; AdamW
 * is left out there because its first steps turn the sign of a gradient
 * that is zero up to rounding into a full step of lr). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "compute/backend.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/rng.h"
#include "compute/cpu/tpool.h"

/* ---- the pool ---- */

typedef struct {
  atomic_int *hits;       /* per index */
  atomic_int wrong_part;  /* chunks whose bounds do not match their part */
  atomic_int not_in_job;  /* bodies that did not see td_tpool_in_job() */
  size_t chunk;
} count_job_t;

static void count_part(void *arg, size_t begin, size_t end, int part) {
  count_job_t *j = arg;
  if (begin != (size_t)part * j->chunk || (end - begin > j->chunk))
    atomic_fetch_add(&j->wrong_part, 1);
  if (!td_tpool_in_job())
    atomic_fetch_add(&j->not_in_job, 1);
  for (size_t i = begin; i < end; i++)
    atomic_fetch_add(&j->hits[i], 1);
}

START_TEST(every_index_runs_once_in_static_chunks) {
  for (int threads = 1; threads <= 3; threads++) {
    td_tpool_t *pool = NULL;
    ck_assert_int_eq(td_tpool_open(&pool, threads), 0);
    ck_assert_int_eq(td_tpool_threads(pool), threads);
    static const size_t sizes[] = {1, 2, 3, 15, 16, 17, 33, 100, 1000, 4097};
    static const size_t grains[] = {1, 16, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
        size_t n = sizes[s], grain = grains[g];
        atomic_int *hits = calloc(n, sizeof *hits);
        size_t chunk = (n + (size_t)threads - 1) / (size_t)threads;
        chunk = (chunk + grain - 1) / grain * grain;
        count_job_t j = {.hits = hits, .chunk = chunk};
        td_tpool_for(pool, n, grain, count_part, &j);
        for (size_t i = 0; i < n; i++)
          ck_assert_msg(atomic_load(&hits[i]) == 1,
                        "threads %d n %zu grain %zu: index %zu ran %d times", threads, n, grain,
                        i, atomic_load(&hits[i]));
        ck_assert_int_eq(atomic_load(&j.wrong_part), 0);
        /* a one-chunk job runs inline, outside any job; larger ones are jobs */
        ck_assert_int_eq(atomic_load(&j.not_in_job), 0 + (threads == 1 || chunk >= n ? 1 : 0));
        free(hits);
      }
    ck_assert(!td_tpool_in_job());
    td_tpool_close(&pool);
    ck_assert_ptr_null(pool);
    td_tpool_close(&pool); /* idempotent */
  }
  ck_assert_int_eq(td_tpool_open(NULL, 2), TD_EINVAL);
  td_tpool_t *bad = NULL;
  ck_assert_int_eq(td_tpool_open(&bad, 0), TD_EINVAL);
  ck_assert_int_eq(td_tpool_threads(NULL), 1);
}
END_TEST

typedef struct {
  td_tpool_t *pool;
  atomic_int inner_inline; /* inner jobs that ran as one inline call */
  atomic_int outer;
} nest_job_t;

static void inner_part(void *arg, size_t begin, size_t end, int part) {
  nest_job_t *j = arg;
  if (begin == 0 && end == 64 && part == 0)
    atomic_fetch_add(&j->inner_inline, 1);
}

static void outer_part(void *arg, size_t begin, size_t end, int part) {
  (void)begin;
  (void)end;
  (void)part;
  nest_job_t *j = arg;
  atomic_fetch_add(&j->outer, 1);
  td_tpool_for(j->pool, 64, 1, inner_part, j);
}

START_TEST(a_job_inside_a_job_runs_inline) {
  nest_job_t j = {0};
  ck_assert_int_eq(td_tpool_open(&j.pool, 2), 0);
  td_tpool_for(j.pool, 2, 1, outer_part, &j);
  ck_assert_int_eq(atomic_load(&j.outer), 2);
  ck_assert_int_eq(atomic_load(&j.inner_inline), 2);
  td_tpool_close(&j.pool);
}
END_TEST

static void add_part(void *arg, size_t begin, size_t end, int part) {
  (void)part;
  int64_t *sum = arg;
  for (size_t i = begin; i < end; i++)
    sum[i] += (int64_t)i;
}

START_TEST(back_to_back_jobs_lose_nothing) {
  td_tpool_t *pool = NULL;
  ck_assert_int_eq(td_tpool_open(&pool, 3), 0);
  int64_t sum[48] = {0};
  for (int rep = 0; rep < 20000; rep++)
    td_tpool_for(pool, 48, 1, add_part, sum);
  for (int i = 0; i < 48; i++)
    ck_assert_int_eq(sum[i], (int64_t)i * 20000);
  td_tpool_close(&pool);
}
END_TEST

/* ---- the kernels: N threads give the bits of one ---- */

static td_backend_t *open_cpu(int threads) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", threads, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(td_backend_threads(be), threads);
  return be;
}

/* The backend's CPU clock (slowdown counts work in CPU time): it grows with
 * work done on the caller and on the workers, not with time spent waiting;
 * NAN where BLAS runs threads of its own (threads = 0). */
static double spin_s(double seconds) { /* `seconds` of this thread's CPU */
  struct timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  volatile double x = 0;
  do {
    for (int i = 0; i < 10000; i++)
      x += i * 1e-9;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  } while ((double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9 < seconds);
  return x;
}

static void spin_part(void *arg, size_t begin, size_t end, int part) {
  (void)arg;
  (void)begin;
  (void)end;
  (void)part;
  spin_s(0.05);
}

START_TEST(the_cpu_clock_counts_work_not_waits) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", 0, why, sizeof why) == 0, "%s", why);
  ck_assert(isnan(td_backend_cpu_seconds(be)));
  td_backend_close(&be);
  be = open_cpu(2);
  double c0 = td_backend_cpu_seconds(be);
  ck_assert(isfinite(c0) && c0 >= 0);
  struct timespec nap = {.tv_nsec = 100000000};
  nanosleep(&nap, NULL); /* waiting: no CPU */
  double c1 = td_backend_cpu_seconds(be);
  ck_assert_msg(c1 - c0 < 0.05, "a 0.1 s sleep cost %.3f CPU s", c1 - c0);
  /* two chunks of 50 ms of CPU each, on the caller or the worker: 0.1 CPU s */
  td_backend_parallel_for(be, 2, spin_part, NULL);
  double c2 = td_backend_cpu_seconds(be);
  ck_assert_msg(c2 - c1 > 0.06, "100 ms of work on two threads counted %.3f CPU s", c2 - c1);
  td_backend_close(&be);
}
END_TEST

/* max |x - y| over n floats, relative to max |x| */
static double rel_diff(const float *x, const float *y, size_t n) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)x[i] - (double)y[i]));
    scale = fmax(scale, fabs((double)x[i]));
  }
  return diff / scale;
}

/* Two float GEMMs that differ only in rounding: each element of either is
 * within gamma_(k+2) |alpha| (|A||B|)_ij + |beta c0_ij| of the exact value
 * (a dot product of k terms, then the scale and the add; Higham, Accuracy
 * and Stability of Numerical Algorithms, 3.1), so they differ by at most
 * twice that. Returns the largest |x - y| over that bound, in double from
 * the same inputs (c0: C before the call); > 1 is more than rounding. A
 * product missing one of its k terms is far above 1 (checked below). */
static double over_rounding(const float *x, const float *y, const float *a, int lda,
                            const float *b, int ldb, bool ta, bool tb, int m, int n, int k,
                            double alpha, double beta, const float *c0, int ldc) {
  const double u = FLT_EPSILON / 2, gamma = (k + 2) * u / (1 - (k + 2) * u);
  double worst = 0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int l = 0; l < k; l++)
        s += fabs((double)(ta ? a[(size_t)l * lda + i] : a[(size_t)i * lda + l])) *
             fabs((double)(tb ? b[(size_t)j * ldb + l] : b[(size_t)l * ldb + j]));
      size_t at = (size_t)i * ldc + j;
      double bound = 2 * gamma * (fabs(alpha) * s + fabs(beta * c0[at])) + 1e-30;
      worst = fmax(worst, fabs((double)x[at] - (double)y[at]) / bound);
    }
  return worst;
}

START_TEST(a_split_gemm_equals_one_call) {
  /* many rows (split into row blocks), few rows (column blocks) and few of
   * both (small row blocks); every transpose, no dimension a multiple of the
   * blocks */
  static const int shapes[][3] = {{171, 150, 90}, {150, 171, 90}, {40, 3001, 90}, {60, 20, 900}};
  size_t big = (size_t)3100 * 200;
  float *a = malloc(big * sizeof *a), *b = malloc(big * sizeof *b);
  float *c1 = malloc(big * sizeof *c1), *c2 = malloc(big * sizeof *c2);
  float *c0 = malloc(big * sizeof *c0);
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  for (size_t i = 0; i < big; i++) {
    a[i] = (float)td_rng_normal(&rng);
    b[i] = (float)td_rng_normal(&rng);
  }
  td_backend_t *one = open_cpu(1);
  for (int threads = 2; threads <= 3; threads++) {
    td_backend_t *many = open_cpu(threads);
    for (int shape = 0; shape < 4; shape++)
      for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int m = shapes[shape][0], n = shapes[shape][1], k = shapes[shape][2];
        int lda = ta ? m + 3 : k + 3, ldb = tb ? k + 5 : n + 5, ldc = n + 7;
        size_t used = (size_t)m * (size_t)ldc;
        for (size_t i = 0; i < used; i++)
          c0[i] = c1[i] = c2[i] = (float)(i % 7);
        td_backend_gemm(one, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c1, ldc);
        td_backend_gemm(many, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c2, ldc);
        double over = over_rounding(c1, c2, a, lda, b, ldb, ta, tb, m, n, k, 0.5, 0.25, c0, ldc);
        ck_assert_msg(over <= 1, "%d threads, %dx%dx%d, ta %d tb %d: C differs by %g x the "
                      "rounding bound", threads, m, n, k, ta, tb, over);
        /* the bound's power: one call missing the last of the k terms */
        memcpy(c2, c0, used * sizeof *c2);
        td_backend_gemm(one, ta, tb, m, n, k - 1, 0.5f, a, lda, b, ldb, 0.25f, c2, ldc);
        over = over_rounding(c1, c2, a, lda, b, ldb, ta, tb, m, n, k, 0.5, 0.25, c0, ldc);
        ck_assert_msg(over > 10, "%dx%dx%d: a missing term is only %g x the bound", m, n, k,
                      over);
      }
    td_backend_close(&many);
  }
  td_backend_close(&one);
  free(a);
  free(b);
  free(c0);
  free(c1);
  free(c2);
}
END_TEST

/* ---- every other op: bit for bit ---- */

/* n random floats (normal, a few exactly 0 for the ReLU masks) */
static float *randf(td_rng_t *rng, size_t n) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = i % 17 == 3 ? 0.0f : (float)td_rng_normal(rng);
  return x;
}

static float *copyf(const float *x, size_t n) {
  float *y = malloc((n ? n : 1) * sizeof *y);
  memcpy(y, x, n * sizeof *y);
  return y;
}

#define SAME(what, x, y, n) \
  ck_assert_msg(memcmp((x), (y), (size_t)(n) * sizeof *(x)) == 0, "%d threads: %s differs", \
                threads, what)

START_TEST(every_op_gives_the_bits_of_one_thread) {
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  td_backend_t *one = open_cpu(1);
  /* shapes of a batch of 6: 5 channels of 9x9 images, 37 rows of 70 features */
  int n = 6, c = 5, h = 9, w = 9, rows = 37, cols = 70, hw = h * w;
  size_t img = (size_t)n * c * hw, mat = (size_t)rows * cols;
  float *x = randf(&rng, img), *dy = randf(&rng, img), *wt = randf(&rng, 128),
        *bias = randf(&rng, 128), *xm = randf(&rng, mat), *dym = randf(&rng, mat);
  for (int threads = 2; threads <= 3; threads++) {
    td_backend_t *many = open_cpu(threads);
    td_backend_t *be[2] = {one, many};
    float *out[2], *out2[2], *aux[2], *aux2[2];
    int32_t *idx[2];
    /* element-wise: act forward and backward (acc and not), add, dropout */
    for (int act = TD_ACT_RELU; act <= TD_ACT_GELU; act++) {
      for (int i = 0; i < 2; i++) {
        out[i] = malloc(img * sizeof(float));
        td_backend_act_forward(be[i], out[i], x, img, (td_act_t)act);
        out2[i] = copyf(x, img);
        td_backend_act_backward2(be[i], out2[i], dy, x, img, (td_act_t)act, act == TD_ACT_GELU);
      }
      SAME("act forward", out[0], out[1], img);
      SAME("act backward", out2[0], out2[1], img);
      for (int i = 0; i < 2; i++) {
        free(out[i]);
        free(out2[i]);
      }
    }
    for (int i = 0; i < 2; i++) {
      out[i] = malloc(img * sizeof(float));
      aux[i] = malloc(img * sizeof(float));
      td_backend_add(be[i], out[i], x, dy, img);
      out2[i] = malloc(img * sizeof(float));
      td_backend_dropout_forward(be[i], out2[i], aux[i], x, img, 0.3f, 77);
    }
    SAME("add", out[0], out[1], img);
    SAME("dropout output", out2[0], out2[1], img);
    SAME("dropout mask", aux[0], aux[1], img);
    for (int i = 0; i < 2; i++) {
      td_backend_dropout_backward(be[i], out[i], dy, aux[i], img, true);
      free(out2[i]);
      free(aux[i]);
    }
    SAME("dropout backward", out[0], out[1], img);
    for (int i = 0; i < 2; i++)
      free(out[i]);
    /* dense bias + act, its backward (bias gradient over rows), softmax cross-entropy */
    for (int act = TD_ACT_NONE; act <= TD_ACT_RELU; act++) {
      for (int i = 0; i < 2; i++) {
        out[i] = copyf(xm, mat);
        td_backend_bias_act(be[i], out[i], bias, rows, cols, (td_act_t)act);
        out2[i] = copyf(dym, mat);
        aux[i] = malloc(cols * sizeof(float));
        td_backend_act_backward(be[i], out2[i], out[i], aux[i], rows, cols, (td_act_t)act);
      }
      SAME("bias_act", out[0], out[1], mat);
      SAME("act_backward", out2[0], out2[1], mat);
      SAME("bias gradient", aux[0], aux[1], cols);
      for (int i = 0; i < 2; i++) {
        free(out[i]);
        free(out2[i]);
        free(aux[i]);
      }
    }
    int32_t labels[37];
    for (int r = 0; r < rows; r++)
      labels[r] = (int32_t)td_rng_below(&rng, (uint32_t)cols);
    double loss[2];
    int hits[2];
    for (int i = 0; i < 2; i++) {
      out[i] = malloc(mat * sizeof(float));
      loss[i] = td_backend_softmax_xent(be[i], xm, labels, out[i], 0.5f, rows, cols, &hits[i]);
    }
    SAME("dlogits", out[0], out[1], mat);
    ck_assert_int_eq(hits[0], hits[1]);
    ck_assert_double_eq_tol(loss[0], loss[1], 1e-12 * fabs(loss[0]));
    for (int i = 0; i < 2; i++)
      free(out[i]);
    /* layernorm forward and backward */
    for (int i = 0; i < 2; i++) {
      out[i] = malloc(mat * sizeof(float));
      aux[i] = malloc(2 * rows * sizeof(float));
      td_backend_layernorm_forward(be[i], out[i], aux[i], aux[i] + rows, xm, wt, bias, rows,
                                   cols);
      out2[i] = copyf(dym, mat);
      aux2[i] = malloc(2 * cols * sizeof(float));
      td_backend_layernorm_backward(be[i], out2[i], aux2[i], aux2[i] + cols, dym, xm, wt, aux[i],
                                    aux[i] + rows, rows, cols, true);
    }
    SAME("layernorm forward", out[0], out[1], mat);
    SAME("layernorm statistics", aux[0], aux[1], 2 * rows);
    SAME("layernorm backward", out2[0], out2[1], mat);
    SAME("layernorm parameter gradients", aux2[0], aux2[1], 2 * cols);
    for (int i = 0; i < 2; i++) {
      free(out[i]);
      free(out2[i]);
      free(aux[i]);
      free(aux2[i]);
    }
    /* image ops: groupnorm, channel bias/act and backward, pooling, im2col/col2im, swap */
    td_conv_geom_t pg = {.c = c, .h = h, .w = w, .k = 2, .stride = 2, .ho = 4, .wo = 4};
    td_conv_geom_t cg = {.c = c, .h = h, .w = w, .k = 3, .stride = 2, .pad = 1, .ho = 5, .wo = 5,
                         .ld = n * 25};
    size_t col = (size_t)c * 9 * n * 25, pooled = (size_t)n * c * 16;
    for (int i = 0; i < 2; i++) {
      out[i] = malloc(img * sizeof(float));
      aux[i] = malloc(2 * n * sizeof(float));
      td_backend_groupnorm_forward(be[i], out[i], aux[i], aux[i] + n, x, wt, bias, n, c, hw, 1);
      out2[i] = copyf(dy, img);
      aux2[i] = malloc(2 * c * sizeof(float));
      td_backend_groupnorm_backward(be[i], out2[i], aux2[i], aux2[i] + c, dy, x, wt, aux[i],
                                    aux[i] + n, n, c, hw, 1, false);
    }
    SAME("groupnorm forward", out[0], out[1], img);
    SAME("groupnorm backward", out2[0], out2[1], img);
    SAME("groupnorm parameter gradients", aux2[0], aux2[1], 2 * c);
    for (int i = 0; i < 2; i++) {
      td_backend_channel_bias_act(be[i], out[i], bias, n, c, hw, TD_ACT_RELU);
      td_backend_channel_act_backward(be[i], out2[i], out[i], aux2[i], n, c, hw, TD_ACT_RELU);
      free(aux[i]);
    }
    SAME("channel bias + relu", out[0], out[1], img);
    SAME("channel act backward", out2[0], out2[1], img);
    SAME("channel bias gradient", aux2[0], aux2[1], c);
    for (int i = 0; i < 2; i++) {
      free(out2[i]);
      out2[i] = malloc(img * sizeof(float));
      td_backend_swap01(be[i], out2[i], out[i], n, c, hw);
      free(aux2[i]);
      aux2[i] = malloc(col * sizeof(float));
      td_backend_im2col_batch(be[i], aux2[i], x, n, &cg);
      td_backend_col2im_batch(be[i], out[i], aux2[i], n, &cg, true);
    }
    SAME("swap01", out2[0], out2[1], img);
    SAME("im2col", aux2[0], aux2[1], col);
    SAME("col2im", out[0], out[1], img);
    for (int kind = TD_POOL_MAX; kind <= TD_POOL_AVG; kind++) {
      for (int i = 0; i < 2; i++) {
        free(aux[i] = NULL);
        aux[i] = malloc(pooled * sizeof(float));
        idx[i] = malloc(pooled * sizeof(int32_t));
        td_backend_pool_forward(be[i], aux[i], idx[i], x, n, &pg, (td_pool_t)kind);
        td_backend_pool_backward(be[i], out2[i], dy, idx[i], n, &pg, (td_pool_t)kind, false);
      }
      SAME("pool forward", aux[0], aux[1], pooled);
      SAME("pool backward", out2[0], out2[1], img);
      for (int i = 0; i < 2; i++) {
        free(aux[i]);
        free(idx[i]);
      }
    }
    for (int i = 0; i < 2; i++) {
      free(out[i]);
      free(out2[i]);
      free(aux2[i]);
    }
    /* embedding and attention: 3 sequences of 16 positions, width 32, 4 heads */
    int seq = 3, t = 16, width = 32, heads = 4;
    size_t act_n = (size_t)seq * t * width, qkv_n = 3 * act_n, att_n = (size_t)seq * heads * t * t;
    int32_t tokens[48];
    for (int i = 0; i < seq * t; i++)
      tokens[i] = (int32_t)td_rng_below(&rng, 8); /* repeats: the scatter adds */
    float *wte = randf(&rng, 256 * (size_t)width), *wpe = randf(&rng, (size_t)t * width);
    float *qkv = randf(&rng, qkv_n), *dout = randf(&rng, act_n);
    for (int i = 0; i < 2; i++) {
      out[i] = malloc(act_n * sizeof(float));
      td_backend_embed_forward(be[i], out[i], tokens, wte, wpe, seq, t, width);
      aux[i] = calloc(256 * (size_t)width, sizeof(float));
      aux2[i] = malloc((size_t)t * width * sizeof(float));
      td_backend_embed_backward(be[i], aux[i], aux2[i], dout, tokens, seq, t, width);
    }
    SAME("embedding forward", out[0], out[1], act_n);
    SAME("token table gradient", aux[0], aux[1], 256 * (size_t)width);
    SAME("position table gradient", aux2[0], aux2[1], (size_t)t * width);
    for (int i = 0; i < 2; i++) {
      free(aux[i]);
      free(aux2[i]);
      aux[i] = malloc(att_n * sizeof(float));
      aux2[i] = malloc(att_n * sizeof(float));
      out2[i] = malloc(qkv_n * sizeof(float));
      td_backend_attention_forward(be[i], out[i], aux[i], qkv, seq, t, width, heads);
      td_backend_attention_backward(be[i], out2[i], aux2[i], dout, qkv, aux[i], seq, t, width,
                                    heads);
    }
    SAME("attention output", out[0], out[1], act_n);
    SAME("attention probabilities", aux[0], aux[1], att_n);
    SAME("attention backward", out2[0], out2[1], qkv_n);
    for (int i = 0; i < 2; i++) {
      free(out[i]);
      free(out2[i]);
      free(aux[i]);
      free(aux2[i]);
    }
    free(wte);
    free(wpe);
    free(qkv);
    free(dout);
    /* the optimizers' fused passes, over a length that is not a multiple of 16 */
    size_t np = 10007;
    float *g = randf(&rng, np), *w0 = randf(&rng, np);
    td_sgd_hparams_t sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
    td_adamw_hparams_t adam = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f, .bias1 = 0.1f, .bias2 = 0.05f,
                               .grad_scale = 0.5f};
    for (int i = 0; i < 2; i++) {
      out[i] = copyf(w0, np);
      aux[i] = calloc(np, sizeof(float));
      td_backend_sgd_step(be[i], out[i], g, aux[i], np, &sgd);
      td_backend_sgd_step(be[i], out[i], g, aux[i], np, &sgd);
      out2[i] = copyf(w0, np);
      aux2[i] = calloc(2 * np, sizeof(float));
      td_backend_adamw_step(be[i], out2[i], g, aux2[i], aux2[i] + np, np, &adam);
      td_backend_adamw_step(be[i], out2[i], g, aux2[i], aux2[i] + np, np, &adam);
    }
    SAME("sgd parameters", out[0], out[1], np);
    SAME("sgd velocity", aux[0], aux[1], np);
    SAME("adamw parameters", out2[0], out2[1], np);
    SAME("adamw moments", aux2[0], aux2[1], 2 * np);
    for (int i = 0; i < 2; i++) {
      free(out[i]);
      free(out2[i]);
      free(aux[i]);
      free(aux2[i]);
    }
    free(g);
    free(w0);
    td_backend_close(&many);
  }
  td_backend_close(&one);
  free(x);
  free(dy);
  free(wt);
  free(bias);
  free(xm);
  free(dym);
}
END_TEST

typedef struct {
  td_model_t *m;
  td_optim_t *opt;
  td_backend_t *be;
} trained_t;

static trained_t open_trained(const char *spec, int threads, int rows, td_optim_kind_t kind) {
  trained_t t = {.be = open_cpu(threads)};
  char why[256] = "";
  ck_assert_msg(td_model_open(&t.m, spec, t.be, rows, why, sizeof why) == 0, "%s: %s", spec,
                why);
  td_model_init(t.m, 21);
  td_optim_opts_t o = {.kind = kind, .momentum = 0.9, .beta1 = 0.9, .beta2 = 0.95,
                       .eps = 1e-8, .weight_decay = 0.01, .clip = 1.0};
  ck_assert_msg(td_optim_open(&t.opt, t.be, td_model_numel(t.m), &o, why, sizeof why) == 0, "%s",
                why);
  return t;
}

static void close_trained(trained_t *t) {
  td_optim_close(&t->opt);
  td_model_close(&t->m);
  td_backend_close(&t->be);
}

/* A batch for m (same seed, same batch for every thread count). */
static td_batch_t make_batch(td_model_t *m, int rows, uint64_t seed) {
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  td_batch_t b = {.rows = rows};
  int t = td_model_context(m);
  int32_t *y = malloc(sizeof(int32_t) * (size_t)(rows * t));
  for (int i = 0; i < rows * t; i++)
    y[i] = (int32_t)td_rng_below(&rng, (uint32_t)td_model_classes(m));
  b.targets = y;
  if (td_model_input_kind(m) == TD_INPUT_TOKENS) {
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(rows * t));
    for (int i = 0; i < rows * t; i++)
      tok[i] = (int32_t)td_rng_below(&rng, 256);
    b.tokens = tok;
  } else {
    size_t n = (size_t)rows * (size_t)td_model_input_dim(m);
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
      x[i] = (float)td_rng_normal(&rng);
    b.x = x;
  }
  return b;
}

static void free_batch(td_batch_t *b) {
  free((void *)b->x);
  free((void *)b->tokens);
  free((void *)b->targets);
}

/* Three training steps on 1 thread and on `threads`: the losses, the
 * gradients of the first step (same parameters) and the parameters after
 * each step agree. exact: bit for bit (every GEMM of the model is split by
 * rows, or not at all); otherwise within `tol` of each tensor's largest
 * value (GEMMs split by columns round differently in the last bits, and
 * training carries that along). */
static void check_same_training(const char *spec, int rows, td_optim_kind_t kind, bool exact,
                                double tol) {
  for (int threads = 2; threads <= 3; threads++) {
    trained_t one = open_trained(spec, 1, rows, kind);
    trained_t many = open_trained(spec, threads, rows, kind);
    size_t numel = td_model_numel(one.m);
    for (int step = 0; step < 3; step++) {
      td_batch_t b = make_batch(one.m, rows, 100 + (uint64_t)step);
      double loss1 = 0, loss2 = 0;
      int hits1 = 0, hits2 = 0;
      ck_assert_int_eq(td_model_train(one.m, &b, &loss1, &hits1), 0);
      ck_assert_int_eq(td_model_train(many.m, &b, &loss2, &hits2), 0);
      ck_assert_msg(fabs(loss1 - loss2) <= (exact ? 1e-12 : tol) * fabs(loss1),
                    "%s, %d threads, step %d: loss %.17g vs %.17g", spec, threads, step, loss1,
                    loss2);
      if (exact)
        ck_assert_int_eq(hits1, hits2);
      const float *g1 = td_model_grads(one.m), *g2 = td_model_grads(many.m);
      if (exact)
        ck_assert_msg(memcmp(g1, g2, numel * sizeof(float)) == 0,
                      "%s, %d threads, step %d: gradients differ from one thread", spec, threads,
                      step);
      else if (step == 0)
        for (size_t t = 0; t < td_layout_count(td_model_layout(one.m)); t++) {
          const td_tensor_info_t *ti = td_layout_tensor(td_model_layout(one.m), t);
          double d = rel_diff(g1 + ti->offset, g2 + ti->offset, ti->numel);
          ck_assert_msg(d <= tol, "%s, %d threads: gradient of %s off by %g", spec, threads,
                        ti->name, d);
        }
      td_optim_step(one.opt, td_model_params(one.m), td_model_grads(one.m), 1e-2);
      td_optim_step(many.opt, td_model_params(many.m), td_model_grads(many.m), 1e-2);
      const float *p1 = td_model_params(one.m), *p2 = td_model_params(many.m);
      if (exact)
        ck_assert_msg(memcmp(p1, p2, numel * sizeof(float)) == 0,
                      "%s, %d threads, step %d: parameters differ from one thread", spec,
                      threads, step);
      else
        for (size_t t = 0; t < td_layout_count(td_model_layout(one.m)); t++) {
          const td_tensor_info_t *ti = td_layout_tensor(td_model_layout(one.m), t);
          double d = rel_diff(p1 + ti->offset, p2 + ti->offset, ti->numel);
          ck_assert_msg(d <= tol, "%s, %d threads, step %d: %s off by %g", spec, threads, step,
                        ti->name, d);
        }
      double sum1 = 0, sum2 = 0;
      ck_assert_int_eq(td_model_eval(one.m, &b, &sum1, NULL), 0);
      ck_assert_int_eq(td_model_eval(many.m, &b, &sum2, NULL), 0);
      ck_assert_msg(fabs(sum1 - sum2) <= (exact ? 1e-12 : tol) * fabs(sum1),
                    "%s: eval loss %.17g vs %.17g", spec, sum1, sum2);
      free_batch(&b);
    }
    close_trained(&many);
    close_trained(&one);
  }
}

START_TEST(an_mlp_trains_the_same_on_any_thread_count) {
  check_same_training("mlp:784-256-128-10", 64, TD_OPTIM_SGD, false, 1e-4);
}
END_TEST

START_TEST(the_cnn_trains_the_same_on_any_thread_count) {
  check_same_training("cnn", 8, TD_OPTIM_SGD, false, 1e-4);
}
END_TEST

START_TEST(the_resnet_trains_the_same_on_any_thread_count) {
  check_same_training("resnet", 4, TD_OPTIM_SGD, false, 1e-4);
}
END_TEST

START_TEST(a_gpt_trains_the_same_on_any_thread_count) {
  check_same_training("gpt:2-128-4-32", 4, TD_OPTIM_ADAMW, true, 0);
}
END_TEST

START_TEST(a_layer_list_trains_the_same_on_any_thread_count) {
  /* dropout (its mask by block), average pooling, a strided conv, layernorm */
  check_same_training("layers:input(3,16,16) conv(8,3,stride=2,pad=1) relu avgpool(2) "
                      "dropout(0.3) flatten dense(40) gelu layernorm dense(7)",
                      9, TD_OPTIM_SGD, false, 1e-4);
}
END_TEST

int main(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("threads");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, every_index_runs_once_in_static_chunks);
  tcase_add_test(tc, a_job_inside_a_job_runs_inline);
  tcase_add_test(tc, back_to_back_jobs_lose_nothing);
  tcase_add_test(tc, the_cpu_clock_counts_work_not_waits);
  tcase_add_test(tc, a_split_gemm_equals_one_call);
  tcase_add_test(tc, every_op_gives_the_bits_of_one_thread);
  tcase_add_test(tc, an_mlp_trains_the_same_on_any_thread_count);
  tcase_add_test(tc, the_cnn_trains_the_same_on_any_thread_count);
  tcase_add_test(tc, the_resnet_trains_the_same_on_any_thread_count);
  tcase_add_test(tc, a_gpt_trains_the_same_on_any_thread_count);
  tcase_add_test(tc, a_layer_list_trains_the_same_on_any_thread_count);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
