/* bench_codec.c: codec throughput against the memory system's limit.
 *
 * For a 2048 x 2048 fp32 tensor (16 MiB, larger than the caches) it times,
 * in one run: memcpy of the buffer, then encode and decode of every codec
 * through the same path the daemon uses (per-link encoder with error
 * feedback, full message decoder with its checks), and reports GB/s of fp32
 * input and the ratio to memcpy GB/s. Then, on mlp:784-256-128-10, the cost of
 * one PowerSGD encode as a fraction of one training step at batch 64. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/codec.h"
#include "compute/backend.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/rng.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* best of `reps` timings of fn */
#define BEST(reps, stmt)                                                                   \
  ({                                                                                       \
    double best_ = 1e30;                                                                   \
    for (int r_ = 0; r_ < (reps); r_++) {                                                  \
      double t0_ = now_s();                                                                \
      stmt;                                                                                \
      double t_ = now_s() - t0_;                                                           \
      best_ = t_ < best_ ? t_ : best_;                                                     \
    }                                                                                      \
    best_;                                                                                 \
  })

int main(void) {
  enum { N = 2048, M = 2048 };
  td_layout_t *layout = NULL;
  td_layout_new(&layout);
  uint32_t shape[2] = {N, M};
  td_layout_add(layout, "w", 2, shape);
  size_t numel = td_layout_numel(layout), bytes = numel * sizeof(float);
  float *x = td_params_alloc(numel), *copy = td_params_alloc(numel), *y = td_params_alloc(numel);
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  for (size_t i = 0; i < numel; i++)
    x[i] = (float)(0.01 * td_rng_normal(&rng));
  double t_memcpy = BEST(10, memcpy(copy, x, bytes));
  double memcpy_gbs = (double)bytes / t_memcpy * 1e-9;
  printf("codecs on a %d x %d fp32 tensor (%.0f MiB), one thread; memcpy %.1f GB/s\n", N, M,
         (double)bytes / (1 << 20), memcpy_gbs);
  printf("%-14s %9s %10s %8s %10s %8s\n", "codec", "bits/elem", "encode", "/memcpy", "decode",
         "/memcpy");
  static const char *codecs[] = {"none", "fp16", "ternary", "ternary:base3", "topk:0.01",
                                 "qsgd:7", "powersgd:4"};
  for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
    td_codec_spec_t spec;
    char why[256];
    td_codec_parse(&spec, codecs[c], why, sizeof why);
    td_link_codec_t *lc = NULL;
    td_link_codec_open(&lc, &spec, layout, 1, 1);
    const uint8_t *msg = NULL;
    size_t len = 0;
    double te = BEST(5, td_link_codec_encode(lc, x, &msg, &len));
    double td = BEST(5, td_codec_decode_message(layout, msg, len, y, NULL, why, sizeof why));
    double egbs = (double)bytes / te * 1e-9, dgbs = (double)bytes / td * 1e-9;
    printf("%-14s %9.3f %7.2f GB/s %8.2f %7.2f GB/s %8.2f\n", codecs[c],
           8.0 * (double)len / (double)numel, egbs, egbs / memcpy_gbs, dgbs, dgbs / memcpy_gbs);
    td_link_codec_close(&lc);
  }

  /* PowerSGD against one training step of the model it would compress */
  td_backend_t *be = NULL;
  td_backend_open(&be, "cpu", 1, NULL, 0);
  td_model_t *m = NULL;
  td_model_open(&m, "mlp:784-256-128-10", be, 64, NULL, 0);
  td_model_init(m, 1);
  float *in = malloc(64 * 784 * sizeof *in);
  int32_t labels[64];
  for (int i = 0; i < 64 * 784; i++)
    in[i] = (float)td_rng_normal(&rng);
  for (int i = 0; i < 64; i++)
    labels[i] = (int32_t)td_rng_below(&rng, 10);
  double loss;
  int hits;
  double t_step = BEST(50, td_model_train_batch(m, in, labels, 64, &loss, &hits));
  const td_layout_t *ml = td_model_layout(m);
  float *delta = td_params_alloc(td_layout_numel(ml));
  for (size_t i = 0; i < td_layout_numel(ml); i++)
    delta[i] = (float)(0.001 * td_rng_normal(&rng));
  static const char *model_codecs[] = {"powersgd:4", "topk:0.01", "ternary"};
  for (size_t c = 0; c < 3; c++) {
    td_codec_spec_t spec;
    td_codec_parse(&spec, model_codecs[c], NULL, 0);
    td_link_codec_t *lc = NULL;
    td_link_codec_open(&lc, &spec, ml, 1, 1);
    const uint8_t *msg = NULL;
    size_t len;
    double t_enc = BEST(20, td_link_codec_encode(lc, delta, &msg, &len));
    printf("mlp:784-256-128-10 %-11s encode %.3f ms = %.2f training steps at batch 64 "
           "(step %.3f ms); %.0fx fewer bytes than fp32\n",
           model_codecs[c], t_enc * 1e3, t_enc / t_step, t_step * 1e3,
           (double)td_layout_numel(ml) * 4.0 / (double)len);
    td_link_codec_close(&lc);
  }
  free(in);
  td_params_free(&delta);
  td_model_close(&m);
  td_backend_close(&be);
  td_params_free(&x);
  td_params_free(&copy);
  td_params_free(&y);
  td_layout_free(&layout);
  return 0;
}
