/* test_model.c: the model (compute/model.h) against references, written to
 * be read as the API's usage guide.
 *
 * A model's layout and its size estimate; the whole backward pass against
 * central finite differences for every parameter tensor (and the comparison
 * itself against a deliberately wrong gradient, so it is known to bite);
 * init statistics; bit-for-bit determinism; the GEMMs a step makes; and every
 * kind of bad spec or bad batch is answered with an error code, never a
 * crash. (The parameter buffer is tested in test_params.c, the backend's ops
 * in test_backend.c, SGD and the schedules in test_optim.c.)
 *
 * One test looks inside a backend (compute/backend_impl.h, otherwise private to
 * compute/): it wraps the CPU table to count what the model asks of it, which
 * is how "a step runs exactly these GEMMs and allocates nothing" is checked. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/backend_impl.h"
#include "common/error.h"
#include "compute/model.h"
#include "compute/optim.h"
#include "compute/params.h"
#include "compute/rng.h"

static td_backend_t *open_cpu(void) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", 1, why, sizeof why) == 0, "%s", why);
  ck_assert_ptr_nonnull(be);
  return be;
}

static td_model_t *open_model(td_backend_t *be, const char *spec, int max_batch) {
  td_model_t *m = NULL;
  char why[256] = "";
  ck_assert_msg(td_model_open(&m, spec, be, max_batch, why, sizeof why) == 0, "%s: %s", spec,
                why);
  return m;
}

static void fill_normal(float *a, size_t n, td_rng_t *rng) {
  for (size_t i = 0; i < n; i++)
    a[i] = (float)td_rng_normal(rng);
}

static float *alloc_floats(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

START_TEST(mlp_layout_is_weight_then_bias_per_layer) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:784-256-128-10", 64);
  const td_layout_t *lay = td_model_layout(m);
  ck_assert_uint_eq(td_layout_param_count(lay),
                    784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  ck_assert_uint_eq(td_layout_count(lay), 6);
  ck_assert_uint_eq(td_model_numel(m), td_layout_numel(lay));
  ck_assert_uint_ge(td_model_numel(m), td_layout_param_count(lay));
  static const char *names[] = {"fc0.weight", "fc0.bias", "fc1.weight",
                                "fc1.bias",   "fc2.weight", "fc2.bias"};
  static const uint32_t outs[] = {256, 128, 10}, ins[] = {784, 256, 128};
  size_t sum = 0;
  for (size_t i = 0; i < 6; i++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, i);
    ck_assert_str_eq(ti->name, names[i]);
    ck_assert_uint_eq(ti->offset % TD_PARAMS_ALIGN_FLOATS, 0);
    ck_assert_uint_eq(ti->shape[0], outs[i / 2]);
    if (i % 2 == 0) {
      ck_assert_uint_eq(ti->ndim, 2);
      ck_assert_uint_eq(ti->shape[1], ins[i / 2]); /* (out x in), the linear-layer convention */
    } else {
      ck_assert_uint_eq(ti->ndim, 1);
    }
    sum += ti->numel;
  }
  ck_assert_uint_eq(td_layout_param_count(lay), sum);
  ck_assert_int_eq(td_model_input_dim(m), 784);
  ck_assert_int_eq(td_model_classes(m), 10);
  ck_assert_int_eq(td_model_max_batch(m), 64);
  ck_assert_uint_eq((uintptr_t)td_model_params(m) % 64, 0);
  ck_assert_uint_eq((uintptr_t)td_model_grads(m) % 64, 0);
  td_model_close(&m);
  ck_assert_ptr_null(m);
  td_model_close(&m); /* idempotent */
  td_backend_close(&be);
}
END_TEST

/* The policy's estimate must match what td_model_open really builds, and be
 * computed from the spec alone: a model far beyond memory is only counted. */
START_TEST(estimate_matches_the_built_model_without_building_it) {
  td_backend_t *be = open_cpu();
  static const char *specs[] = {"mlp:784-256-128-10", "mlp:3-5-2", "mlp:1-1",
                                "mlp:100-33-17-9-4", "mlp:784-1000-10", "cnn", "resnet",
                                "gpt:2-32-2-16"};
  static const int batches[] = {64, 7, 1, 33, 256, 8, 4, 3};
  char why[256];
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    uint64_t params = 0, bytes = 0, bytes_more = 0;
    ck_assert_int_eq(td_model_estimate(specs[i], batches[i], &params, &bytes, why, sizeof why), 0);
    td_model_t *m = open_model(be, specs[i], batches[i]);
    ck_assert_uint_eq(params, td_model_numel(m));
    ck_assert_uint_gt(bytes, 2 * params * sizeof(float)); /* params + grads + activations */
    ck_assert_int_eq(
        td_model_estimate(specs[i], batches[i] * 2, &params, &bytes_more, why, sizeof why), 0);
    ck_assert_uint_gt(bytes_more, bytes); /* activations grow with the batch */
    td_model_close(&m);
  }
  /* by hand: mlp:3-5-2, batch 7. Tensors 15, 5, 10, 2 floats, each padded to 16;
   * activations y and dy of 7x5 (35 -> 48) and 7x2 (14 -> 16), the two one-float
   * work areas; input 7x3 floats + 7 labels */
  uint64_t params = 0, bytes = 0;
  ck_assert_int_eq(td_model_estimate("mlp:3-5-2", 7, &params, &bytes, why, sizeof why), 0);
  ck_assert_uint_eq(params, 64);
  ck_assert_uint_eq(bytes, 2 * 64 * 4 + (2 * (48 + 16) + 2) * 4 + 7 * 3 * 4 + 7 * 4);
  /* 784-65536-65536-10: 4.35e9 floats, counted in microseconds, never allocated */
  ck_assert_int_eq(td_model_estimate("mlp:784-65536-65536-10", 64, &params, &bytes, why,
                                     sizeof why), 0);
  ck_assert_uint_eq(params, 784ull * 65536 + 65536 + 65536ull * 65536 + 65536 + 65536 * 10 + 16);
  ck_assert_uint_gt(bytes, 32ull << 30);
  ck_assert_int_eq(td_model_estimate("mlp:784", 64, &params, &bytes, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_int_eq(td_model_estimate("mlp:3-5-2", 0, &params, &bytes, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_int_eq(td_model_estimate("mlp:3-5-2", TD_MODEL_MAX_BATCH + 1, &params, &bytes, why,
                                     sizeof why), TD_ECONFIG);
  td_backend_close(&be);
}
END_TEST

/* ---- the model: gradients, determinism, init ---------------------------- */

static double mean_loss(td_model_t *m, const float *x, const int32_t *y, int rows) {
  double sum = 0;
  int hits = 0;
  ck_assert_int_eq(td_model_eval_batch(m, x, y, rows, &sum, &hits), 0);
  return sum / rows;
}

START_TEST(backward_matches_central_finite_differences) {
  enum { ROWS = 4, IN = 6 };
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:6-5-4-3", ROWS);
  td_model_init(m, 11);
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  float x[ROWS * IN];
  fill_normal(x, ROWS * IN, &rng);
  const int32_t y[ROWS] = {0, 2, 1, 2};
  float *w = td_model_params(m);
  const td_layout_t *lay = td_model_layout(m);
  /* biases off zero, so they are tested too */
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    if (ti->ndim == 1)
      for (size_t i = 0; i < ti->numel; i++)
        w[ti->offset + i] = 0.1f * (float)td_rng_normal(&rng);
  }
  double loss;
  int hits;
  ck_assert_int_eq(td_model_train_batch(m, x, y, ROWS, &loss, &hits), 0);
  ck_assert_double_eq_tol(loss, mean_loss(m, x, y, ROWS), 1e-6);
  size_t numel = td_model_numel(m);
  float *grad = alloc_floats(numel);
  memcpy(grad, td_model_grads(m), numel * sizeof *grad);

  /* Loss in float, differences in double: eps = 1e-3 keeps the truncation
   * error (eps^2) and the float rounding of the loss (~1e-7 / eps) both far
   * below the 2e-2 tolerance, and is small enough that no ReLU of this
   * batch changes side. The step is the one the float parameter really took. */
  const float eps = 1e-3f;
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    double max_err = 0, max_err_wrong = 0, scale = 1e-3, max_grad = 0;
    for (size_t i = 0; i < ti->numel; i++) {
      float *p = &w[ti->offset + i];
      const float keep = *p, up_at = keep + eps, down_at = keep - eps;
      *p = up_at;
      double up = mean_loss(m, x, y, ROWS);
      *p = down_at;
      double down = mean_loss(m, x, y, ROWS);
      *p = keep;
      double fd = (up - down) / ((double)up_at - (double)down_at);
      double g = grad[ti->offset + i];
      scale = fmax(scale, fmax(fabs(fd), fabs(g)));
      max_grad = fmax(max_grad, fabs(g));
      max_err = fmax(max_err, fabs(fd - g));
      max_err_wrong = fmax(max_err_wrong, fabs(fd - 1.1 * g));
    }
    ck_assert_msg(max_grad > 1e-3, "%s: gradient is ~0, the check would be vacuous", ti->name);
    ck_assert_msg(max_err / scale < 2e-2, "%s: relative error %g", ti->name, max_err / scale);
    /* the same comparison flags a gradient that is 10% off */
    ck_assert_msg(max_err_wrong / scale > 2e-2, "%s: check too weak (%g)", ti->name,
                  max_err_wrong / scale);
  }
  /* padding floats of the gradient buffer stay zero */
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    size_t end = t + 1 < td_layout_count(lay) ? td_layout_tensor(lay, t + 1)->offset : numel;
    for (size_t i = ti->offset + ti->numel; i < end; i++)
      ck_assert_float_eq(grad[i], 0.0f);
  }
  free(grad);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

START_TEST(train_batch_overwrites_grads_and_takes_any_row_count) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:8-7-3", 16);
  td_model_init(m, 2);
  td_rng_t rng;
  td_rng_seed(&rng, 6);
  float x[16 * 8];
  int32_t y[16];
  fill_normal(x, 16 * 8, &rng);
  for (int i = 0; i < 16; i++)
    y[i] = (int32_t)td_rng_below(&rng, 3);
  size_t bytes = td_model_numel(m) * sizeof(float);
  float *first = alloc_floats(td_model_numel(m));
  for (int rows = 1; rows <= 16; rows += 5) {
    double loss, loss_again;
    int hits;
    ck_assert_int_eq(td_model_train_batch(m, x, y, rows, &loss, &hits), 0);
    ck_assert_int_ge(hits, 0);
    ck_assert_int_le(hits, rows);
    memcpy(first, td_model_grads(m), bytes);
    ck_assert_int_eq(td_model_train_batch(m, x, y, rows, &loss_again, NULL), 0);
    ck_assert_int_eq(memcmp(first, td_model_grads(m), bytes), 0); /* not accumulated */
    ck_assert_double_eq(loss, loss_again);
    /* eval adds the sum of losses and the hits to what is there */
    double loss_sum = 1.0;
    int eval_hits = 2;
    ck_assert_int_eq(td_model_eval_batch(m, x, y, rows, &loss_sum, &eval_hits), 0);
    ck_assert_double_eq_tol(loss_sum - 1.0, loss * rows, 1e-9 * rows);
    ck_assert_int_eq(eval_hits - 2, hits);
  }
  free(first);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

static void train_steps(td_model_t *m, td_sgd_t *opt, int steps, uint64_t data_seed) {
  td_rng_t rng;
  td_rng_seed(&rng, data_seed);
  int rows = td_model_max_batch(m), dim = td_model_input_dim(m);
  float *x = alloc_floats((size_t)rows * dim);
  int32_t *y = malloc((size_t)rows * sizeof *y);
  for (int step = 0; step < steps; step++) {
    fill_normal(x, (size_t)rows * dim, &rng);
    for (int i = 0; i < rows; i++)
      y[i] = (int32_t)td_rng_below(&rng, (uint32_t)td_model_classes(m));
    double loss;
    ck_assert_int_eq(td_model_train_batch(m, x, y, rows, &loss, NULL), 0);
    td_sgd_step(opt, td_model_params(m), td_model_grads(m), 0.05);
  }
  free(x);
  free(y);
}

START_TEST(same_seed_same_bits_after_training) {
  td_backend_t *be = open_cpu();
  const char *spec = "mlp:64-48-32-10";
  td_model_t *models[3];
  td_sgd_t *opts[3];
  static const uint64_t seeds[3] = {7, 7, 8};
  td_sgd_opts_t so = {.momentum = 0.9, .nesterov = true, .weight_decay = 1e-4};
  for (int i = 0; i < 3; i++) {
    models[i] = open_model(be, spec, 16);
    td_model_init(models[i], seeds[i]);
    ck_assert_int_eq(td_sgd_open(&opts[i], be, td_model_numel(models[i]), &so), 0);
    train_steps(models[i], opts[i], 20, 99);
  }
  size_t bytes = td_model_numel(models[0]) * sizeof(float);
  ck_assert_int_eq(memcmp(td_model_params(models[0]), td_model_params(models[1]), bytes), 0);
  ck_assert_int_eq(memcmp(td_sgd_velocity(opts[0]), td_sgd_velocity(opts[1]), bytes), 0);
  ck_assert_int_ne(memcmp(td_model_params(models[0]), td_model_params(models[2]), bytes), 0);
  for (int i = 0; i < 3; i++) {
    td_sgd_close(&opts[i]);
    td_model_close(&models[i]);
  }
  td_backend_close(&be);
}
END_TEST

START_TEST(init_is_he_normal_then_xavier_uniform_with_zero_biases) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:784-256-10", 1);
  const td_layout_t *lay = td_model_layout(m);
  float *w = td_model_params(m);
  for (size_t i = 0; i < td_model_numel(m); i++)
    w[i] = 1.0f; /* init must overwrite everything, padding included */
  td_model_init(m, 5);

  /* fc0 (784 -> 256) is followed by a ReLU: He-normal, std sqrt(2 / 784) */
  const td_tensor_info_t *fc0 = td_layout_tensor(lay, 0);
  double sum = 0, sum2 = 0;
  for (size_t i = 0; i < fc0->numel; i++) {
    sum += w[fc0->offset + i];
    sum2 += (double)w[fc0->offset + i] * w[fc0->offset + i];
  }
  double mean = sum / fc0->numel, std = sqrt(sum2 / fc0->numel - mean * mean);
  double he = sqrt(2.0 / 784);
  ck_assert_msg(fabs(std - he) < 0.1 * he, "He std %g, want %g", std, he);
  ck_assert_msg(fabs(mean) < 0.05 * he, "He mean %g", mean);

  /* fc1 (256 -> 10) is the output layer: Xavier-uniform in +-sqrt(6 / (256 + 10)) */
  const td_tensor_info_t *fc1 = td_layout_tensor(lay, 2);
  double limit = sqrt(6.0 / (256 + 10)), max_abs = 0;
  sum2 = 0;
  for (size_t i = 0; i < fc1->numel; i++) {
    double v = w[fc1->offset + i];
    ck_assert_msg(fabs(v) <= limit, "xavier %g beyond %g", v, limit);
    max_abs = fmax(max_abs, fabs(v));
    sum2 += v * v;
  }
  ck_assert(max_abs > 0.95 * limit); /* the bound is reached, not just respected */
  double uniform_std = limit / sqrt(3.0);
  ck_assert(fabs(sqrt(sum2 / fc1->numel) - uniform_std) < 0.1 * uniform_std);

  /* biases and padding are zero */
  for (size_t t = 0; t < td_layout_count(lay); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(lay, t);
    size_t end = t + 1 < td_layout_count(lay) ? td_layout_tensor(lay, t + 1)->offset
                                              : td_model_numel(m);
    size_t first_zero = ti->ndim == 1 ? ti->offset : ti->offset + ti->numel;
    for (size_t i = first_zero; i < end; i++)
      ck_assert_msg(w[i] == 0.0f, "%s: float %zu is %g", ti->name, i - ti->offset, w[i]);
  }

  /* the seed alone fixes every bit */
  td_model_t *same = open_model(be, "mlp:784-256-10", 3);
  td_model_t *other = open_model(be, "mlp:784-256-10", 1);
  td_model_init(same, 5);
  td_model_init(other, 6);
  size_t bytes = td_model_numel(m) * sizeof(float);
  ck_assert_int_eq(memcmp(w, td_model_params(same), bytes), 0);
  ck_assert_int_ne(memcmp(w, td_model_params(other), bytes), 0);
  td_model_close(&same);
  td_model_close(&other);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

/* ---- what a step asks of the backend ------------------------------------ */

static struct {
  int gemms, other_ops, allocs;
  double flops;
  td_model_gemm_t seen[16]; /* the first GEMMs' shapes, in order */
} calls;

static void counting_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                          const float *a, int lda, const float *b, int ldb, float beta, float *c,
                          int ldc) {
  if (calls.gemms < 16)
    calls.seen[calls.gemms] = (td_model_gemm_t){ta, tb, m, n, k, lda, ldb, ldc, 1};
  calls.gemms++;
  calls.flops += 2.0 * m * n * k;
  td__backend_cpu.gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static void counting_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                              td_act_t act) {
  calls.other_ops++;
  td__backend_cpu.bias_act(be, y, bias, rows, cols, act);
}
static void counting_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                  int rows, int cols, td_act_t act) {
  calls.other_ops++;
  td__backend_cpu.act_backward(be, dy, y, dbias, rows, cols, act);
}
static double counting_softmax_xent(td_backend_t *be, const float *logits,
                                    const int32_t *labels, float *dlogits, float grad_scale,
                                    int rows, int cols, int *correct) {
  calls.other_ops++;
  return td__backend_cpu.softmax_xent(be, logits, labels, dlogits, grad_scale, rows, cols,
                                      correct);
}
static void *counting_alloc(td_backend_t *be, size_t bytes) {
  calls.allocs++;
  return td__backend_cpu.alloc(be, bytes);
}

START_TEST(a_step_runs_exactly_the_counted_gemms_and_allocates_nothing) {
  td_backend_iface_t iface = td__backend_cpu;
  iface.gemm = counting_gemm;
  iface.bias_act = counting_bias_act;
  iface.act_backward = counting_act_backward;
  iface.softmax_xent = counting_softmax_xent;
  iface.alloc = counting_alloc;
  td_backend_t be = {.iface = &iface, .context = NULL, .threads = 1};
  td_model_t *m = open_model(&be, "mlp:784-256-128-10", 64);
  td_model_init(m, 1);
  float *x = alloc_floats(64 * 784);
  int32_t y[64];
  td_rng_t rng;
  td_rng_seed(&rng, 7);
  fill_normal(x, 64 * 784, &rng);
  for (int i = 0; i < 64; i++)
    y[i] = (int32_t)td_rng_below(&rng, 10);
  double want = 2.0 * 64 * (784 * 256 * 2 + 256 * 128 * 3 + 128 * 10 * 3); /* no dX for fc0 */
  ck_assert_double_eq(td_model_train_gemm_flops(m, 64), want);
  ck_assert_double_eq(td_model_train_gemm_flops(m, 32), want / 2);

  memset(&calls, 0, sizeof calls);
  double loss;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 64, &loss, NULL), 0);
  ck_assert_int_eq(calls.gemms, 3 + 3 + 2);
  ck_assert_double_eq(calls.flops, want);
  ck_assert_int_eq(calls.other_ops, 3 + 1 + 3); /* bias_act, softmax_xent, act_backward */
  ck_assert_int_eq(calls.allocs, 0);

  /* the list the bench replays as its sgemm reference is exactly those calls */
  td_model_gemm_t list[16];
  ck_assert_uint_eq(td_model_train_gemms(m, 64, list, 16), 8);
  double listed = 0.0;
  for (int i = 0; i < 8; i++) {
    const td_model_gemm_t *g = &list[i], *c = &calls.seen[i];
    ck_assert_msg(g->trans_a == c->trans_a && g->trans_b == c->trans_b && g->m == c->m &&
                      g->n == c->n && g->k == c->k && g->lda == c->lda && g->ldb == c->ldb &&
                      g->ldc == c->ldc && g->repeat == 1,
                  "GEMM %d: listed %dx%dx%d, made %dx%dx%d", i, g->m, g->n, g->k, c->m, c->n,
                  c->k);
    listed += 2.0 * g->m * g->n * g->k;
  }
  ck_assert_double_eq(listed, want);
  free(x);
  td_model_close(&m);
}
END_TEST

/* The convolutions' GEMMs too (im2col columns, channel-major output, both
 * backward products): the list a bench replays is what a cnn step makes. */
START_TEST(a_cnn_step_makes_exactly_the_listed_gemms) {
  td_backend_iface_t iface = td__backend_cpu;
  iface.gemm = counting_gemm;
  td_backend_t be = {.iface = &iface, .context = NULL, .threads = 1};
  td_model_t *m = open_model(&be, "cnn", 4);
  td_model_init(m, 1);
  int dim = td_model_input_dim(m);
  float *x = alloc_floats((size_t)4 * (size_t)dim);
  int32_t y[4] = {0, 1, 2, 3};
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  fill_normal(x, (size_t)4 * (size_t)dim, &rng);
  memset(&calls, 0, sizeof calls);
  double loss;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 4, &loss, NULL), 0);
  td_model_gemm_t list[16];
  size_t count = td_model_train_gemms(m, 4, list, 16);
  ck_assert_uint_eq(count, (size_t)calls.gemms);
  ck_assert_uint_le(count, 16);
  for (size_t i = 0; i < count; i++) {
    const td_model_gemm_t *g = &list[i], *c = &calls.seen[i];
    ck_assert_msg(g->trans_a == c->trans_a && g->trans_b == c->trans_b && g->m == c->m &&
                      g->n == c->n && g->k == c->k && g->lda == c->lda && g->ldb == c->ldb &&
                      g->ldc == c->ldc && g->repeat == 1,
                  "GEMM %zu: listed %dx%dx%d, made %dx%dx%d", i, g->m, g->n, g->k, c->m, c->n,
                  c->k);
  }
  ck_assert_double_eq(td_model_train_gemm_flops(m, 4), calls.flops);
  free(x);
  td_model_close(&m);
}
END_TEST

/* ---- refusing bad input -------------------------------------------------- */

START_TEST(bad_model_specs_are_config_errors_with_a_reason) {
  char why[256];
  static const char *bad[] = {
      "mlp:784",       "mlp:784-0-10", "mlp:a-b",      "cnn:1-2",      "mlp:784-256-10x",
      "mlp:",          "mlp",          "",             "mlp:784--10",  "mlp:-784-10",
      "mlp:784-10-",   "mlp:+784-10",  "mlp: 784-10",  "mlp:784-65537", "MLP:784-10",
      "mlp:99999999999999999999-10",   "mlp:0x10-2",   "mlp:784-10\n",
      "mlp:1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1", /* 17 layers */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(td_model_check_spec(bad[i], why, sizeof why) == TD_ECONFIG, "'%s' accepted",
                  bad[i]);
    ck_assert_msg(why[0] != '\0', "'%s': no reason given", bad[i]);
  }
  ck_assert_int_eq(td_model_check_spec(NULL, why, sizeof why), TD_ECONFIG);
  td_model_check_spec("rnn:1-2", why, sizeof why);
  ck_assert_ptr_nonnull(strstr(why, "unknown model 'rnn' (supported: mlp:IN-H1-...-OUT"));
  td_model_check_spec("mlp:784-0-10", why, sizeof why);
  ck_assert_ptr_nonnull(strstr(why, "'0'"));
  static const char *good[] = {"mlp:784-10", "mlp:1-1", "mlp:784-256-128-10", "mlp:2-65536",
                               "mlp:1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1" /* 16 layers */};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_msg(td_model_check_spec(good[i], why, sizeof why) == 0, "'%s': %s", good[i], why);

  td_backend_t *be = open_cpu();
  td_model_t *m = NULL;
  ck_assert_int_eq(td_model_open(&m, "cnn:1-2", be, 4, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(m);
  why[0] = '\0';
  ck_assert_int_eq(td_model_open(&m, "mlp:4-3-2", be, 0, why, sizeof why), TD_ECONFIG);
  ck_assert_str_ne(why, "");
  ck_assert_int_eq(td_model_open(&m, "mlp:4-3-2", be, TD_MODEL_MAX_BATCH + 1, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_ptr_null(m);
  td_backend_close(&be);
}
END_TEST

START_TEST(bad_batches_are_errors_and_the_model_recovers) {
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:4-3-2", 2);
  td_model_init(m, 1);
  float x[3 * 4] = {0.5f, -1, 2, 0, 1, 1, -1, 0.25f, 0, 0, 0, 0};
  int32_t y[3] = {0, 1, 1};
  double loss = -1, loss_sum = 0;
  int hits = 0;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 3, &loss, &hits), TD_EINVAL); /* > max_batch */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 0, &loss, &hits), TD_EINVAL);
  ck_assert_int_eq(td_model_train_batch(m, x, y, -1, &loss, &hits), TD_EINVAL);
  ck_assert_int_eq(td_model_eval_batch(m, x, y, 3, &loss_sum, &hits), TD_EINVAL);
  ck_assert_int_eq(td_model_train_batch(m, NULL, y, 2, &loss, &hits), TD_EINVAL);

  x[1] = NAN; /* a NaN anywhere in the input is a numeric error, not garbage gradients */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ENUMERIC);
  ck_assert_int_eq(td_model_eval_batch(m, x, y, 2, &loss_sum, &hits), TD_ENUMERIC);
  x[1] = INFINITY;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ENUMERIC);
  /* even an Inf that every ReLU clips to 0, leaving the loss finite: fc0's
   * weights on input 1 made positive, so x[1] = -Inf switches all units off,
   * and dW = dYᵀX would still hold 0 * Inf = NaN */
  float *w = td_model_params(m);
  for (int j = 0; j < 3; j++)
    w[j * 4 + 1] = fabsf(w[j * 4 + 1]) + 0.1f;
  x[1] = -INFINITY;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ENUMERIC);
  x[1] = -1;
  float keep = w[0];
  w[0] = NAN; /* so are parameters that went bad: the loss reports them */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ENUMERIC);
  w[0] = keep;

  y[1] = 2; /* a label outside [0, classes) is refused, never used as an index */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ERANGE);
  ck_assert_int_eq(td_model_eval_batch(m, x, y, 2, &loss_sum, &hits), TD_ERANGE);
  y[1] = -7;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ERANGE);
  y[1] = INT32_MAX;
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), TD_ERANGE);
  y[1] = 1;
  ck_assert_double_eq(loss_sum, 0); /* failed calls add nothing */

  /* the NaNs left in the activation buffers do not leak into the next step */
  ck_assert_int_eq(td_model_train_batch(m, x, y, 2, &loss, &hits), 0);
  ck_assert(isfinite(loss));
  for (size_t i = 0; i < td_model_numel(m); i++)
    ck_assert(isfinite(td_model_grads(m)[i]));
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

/* ---- it learns ----------------------------------------------------------- */

START_TEST(a_small_mlp_learns_a_separable_set) {
  enum { N = 256, BATCH = 32, STEPS = 300 };
  td_backend_t *be = open_cpu();
  td_model_t *m = open_model(be, "mlp:2-16-2", BATCH);
  td_model_init(m, 3);
  td_sgd_t *opt = NULL;
  td_sgd_opts_t so = {.momentum = 0.9};
  ck_assert_int_eq(td_sgd_open(&opt, be, td_model_numel(m), &so), 0);
  /* class = which side of the line x0 + 0.5 x1 = 0.3, with a margin */
  float x[N * 2];
  int32_t y[N];
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  for (int i = 0; i < N; i++) {
    double side;
    do {
      x[2 * i] = (float)td_rng_normal(&rng);
      x[2 * i + 1] = (float)td_rng_normal(&rng);
      side = x[2 * i] + 0.5 * x[2 * i + 1] - 0.3;
    } while (fabs(side) < 0.1);
    y[i] = side > 0;
  }
  for (int step = 0; step < STEPS; step++) {
    int at = (step * BATCH) % N;
    double loss;
    ck_assert_int_eq(td_model_train_batch(m, x + 2 * at, y + at, BATCH, &loss, NULL), 0);
    td_sgd_step(opt, td_model_params(m), td_model_grads(m), 0.05);
  }
  int correct = 0;
  double loss_sum = 0;
  for (int at = 0; at < N; at += BATCH)
    ck_assert_int_eq(td_model_eval_batch(m, x + 2 * at, y + at, BATCH, &loss_sum, &correct), 0);
  ck_assert_msg(correct > 0.95 * N, "training accuracy %d / %d", correct, N);
  td_sgd_close(&opt);
  td_model_close(&m);
  td_backend_close(&be);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *layout = tcase_create("layout");
  tcase_add_test(layout, mlp_layout_is_weight_then_bias_per_layer);
  tcase_add_test(layout, estimate_matches_the_built_model_without_building_it);
  suite_add_tcase(s, layout);

  TCase *model = tcase_create("model");
  tcase_set_timeout(model, 120);
  tcase_add_test(model, backward_matches_central_finite_differences);
  tcase_add_test(model, train_batch_overwrites_grads_and_takes_any_row_count);
  tcase_add_test(model, same_seed_same_bits_after_training);
  tcase_add_test(model, init_is_he_normal_then_xavier_uniform_with_zero_biases);
  tcase_add_test(model, a_step_runs_exactly_the_counted_gemms_and_allocates_nothing);
  tcase_add_test(model, a_cnn_step_makes_exactly_the_listed_gemms);
  tcase_add_test(model, bad_model_specs_are_config_errors_with_a_reason);
  tcase_add_test(model, bad_batches_are_errors_and_the_model_recovers);
  tcase_add_test(model, a_small_mlp_learns_a_separable_set);
  suite_add_tcase(s, model);

  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
