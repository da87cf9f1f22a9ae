/* test_optim.c: the optimizers and gradient clipping against naive references.
 *
 * AdamW runs several steps on the CPU backend beside a double-precision
 * reference written straight from the paper's formulas (bias correction at
 * step 1 and later, weight decay decoupled from the gradient); clipping is
 * checked by its exact invariants (post-clip norm == max_norm when above,
 * bit-for-bit untouched when below); the td_optim_t handle is checked to give
 * the same SGD as td_sgd_t, a reset optimizer (what a late joiner starts
 * with) to take a well-scaled first step, and a backend table without the
 * adamw_step slot to get the CPU loop. SGD (momentum, Nesterov) against
 * hand-computed updates, and the learning-rate schedules at known points. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/backend_impl.h"
#include "common/error.h"
#include "compute/optim.h"
#include "compute/rng.h"

#define N 37

static td_backend_t *cpu(void) {
  td_backend_t *be = NULL;
  char why[128] = "";
  ck_assert_msg(td_backend_open(&be, "cpu", 1, why, sizeof why) == 0, "%s", why);
  return be;
}

static void fill_normal(float *x, size_t n, td_rng_t *rng, double scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(scale * td_rng_normal(rng));
}

typedef struct {
  double w[N], m[N], v[N];
  unsigned long t;
} ref_adamw_t;

/* Loshchilov & Hutter, decoupled decay, bias-corrected moments, in double. */
static void ref_adamw_step(ref_adamw_t *r, const float *g, double lr, double b1, double b2,
                           double eps, double wd) {
  r->t++;
  for (int i = 0; i < N; i++) {
    r->m[i] = b1 * r->m[i] + (1 - b1) * g[i];
    r->v[i] = b2 * r->v[i] + (1 - b2) * (double)g[i] * g[i];
    double mhat = r->m[i] / (1 - pow(b1, (double)r->t));
    double vhat = r->v[i] / (1 - pow(b2, (double)r->t));
    r->w[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * r->w[i]);
  }
}

static td_optim_t *open_adamw(td_backend_t *be, double wd, double clip) {
  td_optim_opts_t o = {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                       .weight_decay = wd, .clip = clip};
  td_optim_t *opt = NULL;
  char why[128] = "";
  ck_assert_msg(td_optim_open(&opt, be, N, &o, why, sizeof why) == 0, "%s", why);
  return opt;
}

START_TEST(adamw_matches_the_reference_over_several_steps) {
  td_backend_t *be = cpu();
  td_optim_t *opt = open_adamw(be, 0.1, 0);
  ck_assert_uint_eq(td_optim_state_count(opt), 2);
  float *w = td_backend_alloc(be, N * sizeof(float)), g[N], g_copy[N];
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  fill_normal(w, N, &rng, 1.0);
  ref_adamw_t ref = {.t = 0};
  for (int i = 0; i < N; i++)
    ref.w[i] = w[i];
  for (int step = 1; step <= 6; step++) {
    double lr = 0.01 * step; /* a changing rate, as under a schedule */
    fill_normal(g, N, &rng, step == 4 ? 1e-3 : 1.0); /* one step of tiny gradients */
    memcpy(g_copy, g, sizeof g);
    ref_adamw_step(&ref, g, lr, 0.9, 0.95, 1e-8, 0.1);
    td_optim_step(opt, w, g_copy, lr);
    const float *m = td_optim_state(opt, 0), *v = td_optim_state(opt, 1);
    for (int i = 0; i < N; i++) {
      ck_assert_msg(fabs(w[i] - ref.w[i]) < 2e-6, "step %d w[%d] %.8f vs %.8f", step, i, w[i],
                    ref.w[i]);
      ck_assert_msg(fabs(m[i] - ref.m[i]) <= 1e-5 * fabs(ref.m[i]) + 1e-9, "m[%d]", i);
      ck_assert_msg(fabs(v[i] - ref.v[i]) <= 1e-5 * fabs(ref.v[i]) + 1e-12, "v[%d]", i);
    }
  }
  ck_assert_uint_eq(td_optim_steps(opt), 6);
  ck_assert_ptr_null(td_optim_state(opt, 2));
  td_backend_free(be, w);
  td_optim_close(&opt);
  td_optim_close(&opt); /* idempotent */
  td_backend_close(&be);
}
END_TEST

/* At t = 1 bias correction makes m_hat = g and v_hat = g^2, so each weight
 * moves by lr * g / (|g| + eps) = lr * sign(g) whatever |g| is; without the
 * correction it would move by lr * 0.1 / sqrt(0.05) = 0.447 lr. */
START_TEST(adamw_first_step_is_lr_times_sign_of_g) {
  td_backend_t *be = cpu();
  td_optim_t *opt = open_adamw(be, 0, 0);
  float *w = td_backend_alloc(be, N * sizeof(float)), g[N];
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  fill_normal(g, N, &rng, 1.0);
  for (int i = 0; i < N; i++)
    g[i] *= (float)pow(10, i % 5 - 2); /* magnitudes from 0.01 to 100 */
  double expect[N];
  for (int i = 0; i < N; i++)
    expect[i] = -0.01 * g[i] / (fabs(g[i]) + 1e-8); /* lr * sign(g) but for eps */
  td_optim_step(opt, w, g, 0.01);
  for (int i = 0; i < N; i++) {
    ck_assert_msg(fabs(w[i] - expect[i]) < 5e-9, "w[%d] = %.10g, expected %.10g", i, w[i],
                  expect[i]);
    ck_assert(fabs(fabs(w[i]) - 0.01) < 1e-5); /* not the uncorrected 0.447 lr */
  }
  td_backend_free(be, w);
  td_optim_close(&opt);
  td_backend_close(&be);
}
END_TEST

/* Decoupled decay: with a zero gradient the moments stay zero and the weights
 * shrink by exactly (1 - lr * wd) a step. L2 added to the gradient would
 * instead make Adam move each weight by about lr (its normalised step). And
 * the decay does not depend on the gradient's scale. */
START_TEST(adamw_weight_decay_is_decoupled) {
  td_backend_t *be = cpu();
  td_optim_t *opt = open_adamw(be, 0.1, 0);
  float *w = td_backend_alloc(be, N * sizeof(float)), w0[N], g[N];
  td_rng_t rng;
  td_rng_seed(&rng, 9);
  fill_normal(w, N, &rng, 1.0);
  memcpy(w0, w, sizeof w0);
  for (int step = 0; step < 3; step++) {
    memset(g, 0, sizeof g);
    td_optim_step(opt, w, g, 0.01);
  }
  for (int i = 0; i < N; i++)
    ck_assert_msg(fabs(w[i] - w0[i] * pow(1 - 0.001, 3)) < 1e-6, "w[%d]", i);
  td_optim_close(&opt);

  /* the same first step with g and with 1000 g: Adam normalises the gradient,
   * and the decoupled decay adds the same lr*wd*w to both */
  float *w_big = td_backend_alloc(be, N * sizeof(float));
  memcpy(w, w0, sizeof w0);
  memcpy(w_big, w0, sizeof w0);
  td_optim_t *a = open_adamw(be, 0.1, 0), *b = open_adamw(be, 0.1, 0);
  fill_normal(g, N, &rng, 1.0);
  float g_big[N];
  for (int i = 0; i < N; i++)
    g_big[i] = 1000.0f * g[i];
  td_optim_step(a, w, g, 0.01);
  td_optim_step(b, w_big, g_big, 0.01);
  for (int i = 0; i < N; i++)
    ck_assert_msg(fabs(w[i] - w_big[i]) < 1e-7, "w[%d] %g vs %g", i, w[i], w_big[i]);
  td_optim_close(&a);
  td_optim_close(&b);
  td_backend_free(be, w);
  td_backend_free(be, w_big);
  td_backend_close(&be);
}
END_TEST

static double norm_of(const float *g, size_t n) {
  double sq = 0;
  for (size_t i = 0; i < n; i++)
    sq += (double)g[i] * g[i];
  return sqrt(sq);
}

START_TEST(clip_scales_to_max_norm_only_when_above) {
  float g[1000], before[1000];
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  fill_normal(g, 1000, &rng, 0.5); /* norm about 15.8 */
  memcpy(before, g, sizeof g);
  double norm = norm_of(g, 1000);
  ck_assert(norm > 10);

  /* above: returns the norm before, and the norm after is max_norm, same direction */
  double got = td_clip_global_norm(g, 1000, 2.5);
  ck_assert_msg(fabs(got - norm) <= 1e-12 * norm, "%.15g vs %.15g", got, norm);
  ck_assert_msg(fabs(norm_of(g, 1000) - 2.5) < 1e-6, "post-clip norm %.9g", norm_of(g, 1000));
  for (int i = 0; i < 1000; i++)
    ck_assert(fabs(g[i] - before[i] * 2.5 / norm) < 1e-7);

  /* below, equal, and measure-only: untouched to the bit */
  memcpy(g, before, sizeof g);
  ck_assert(fabs(td_clip_global_norm(g, 1000, 100) - norm) <= 1e-12 * norm);
  ck_assert_int_eq(memcmp(g, before, sizeof g), 0);
  ck_assert(fabs(td_clip_global_norm(g, 1000, 0) - norm) <= 1e-12 * norm);
  ck_assert_int_eq(memcmp(g, before, sizeof g), 0);
  float one[1] = {3.0f};
  ck_assert(td_clip_global_norm(one, 1, 3.0) == 3.0);
  ck_assert(one[0] == 3.0f);
  ck_assert(td_clip_global_norm(NULL, 0, 1.0) == 0.0);
}
END_TEST

/* td_optim_step with clip: the update is the unclipped optimizer's update on
 * the pre-scaled gradient, for both kinds, and the pre-clip norm comes back. */
START_TEST(optimizer_clip_equals_stepping_on_the_clipped_gradient) {
  td_backend_t *be = cpu();
  td_rng_t rng;
  td_rng_seed(&rng, 13);
  float g[N], g_clipped[N];
  fill_normal(g, N, &rng, 3.0);
  memcpy(g_clipped, g, sizeof g);
  double norm = td_clip_global_norm(g_clipped, N, 1.0);
  ck_assert(norm > 1.0);
  for (int kind = 0; kind < 2; kind++) {
    td_optim_opts_t o = {.kind = kind ? TD_OPTIM_ADAMW : TD_OPTIM_SGD, .momentum = 0.9,
                         .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    td_optim_t *plain = NULL, *clipped = NULL;
    ck_assert_int_eq(td_optim_open(&plain, be, N, &o, NULL, 0), 0);
    o.clip = 1.0;
    ck_assert_int_eq(td_optim_open(&clipped, be, N, &o, NULL, 0), 0);
    float *w1 = td_backend_alloc(be, N * sizeof(float));
    float *w2 = td_backend_alloc(be, N * sizeof(float));
    for (int step = 0; step < 3; step++) {
      float a[N], b[N];
      memcpy(a, g_clipped, sizeof a);
      memcpy(b, g, sizeof b);
      ck_assert(td_optim_step(plain, w1, a, 0.05) == -1); /* not measured */
      double seen = td_optim_step(clipped, w2, b, 0.05);
      ck_assert(fabs(seen - norm) < 1e-9 * norm);
    }
    for (int i = 0; i < N; i++)
      ck_assert_msg(fabs(w1[i] - w2[i]) < 1e-6, "%s w[%d] %g vs %g",
                    td_optim_kind_name(o.kind), i, w1[i], w2[i]);
    td_backend_free(be, w1);
    td_backend_free(be, w2);
    td_optim_close(&plain);
    td_optim_close(&clipped);
  }
  td_backend_close(&be);
}
END_TEST

START_TEST(optim_sgd_is_td_sgd) {
  td_backend_t *be = cpu();
  td_sgd_opts_t so = {.momentum = 0.9, .nesterov = true, .weight_decay = 1e-3};
  td_optim_opts_t oo = {.kind = TD_OPTIM_SGD, .momentum = 0.9, .nesterov = true,
                        .weight_decay = 1e-3};
  td_sgd_t *sgd = NULL;
  td_optim_t *opt = NULL;
  ck_assert_int_eq(td_sgd_open(&sgd, be, N, &so), 0);
  ck_assert_int_eq(td_optim_open(&opt, be, N, &oo, NULL, 0), 0);
  ck_assert_uint_eq(td_optim_state_count(opt), 1);
  float *w1 = td_backend_alloc(be, N * sizeof(float));
  float *w2 = td_backend_alloc(be, N * sizeof(float));
  td_rng_t rng;
  td_rng_seed(&rng, 17);
  fill_normal(w1, N, &rng, 1.0);
  memcpy(w2, w1, N * sizeof(float));
  for (int step = 0; step < 4; step++) {
    float g[N];
    fill_normal(g, N, &rng, 1.0);
    td_sgd_step(sgd, w1, g, 0.1);
    td_optim_step(opt, w2, g, 0.1);
  }
  ck_assert_int_eq(memcmp(w1, w2, N * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(td_sgd_velocity(sgd), td_optim_state(opt, 0), N * sizeof(float)), 0);
  td_backend_free(be, w1);
  td_backend_free(be, w2);
  td_sgd_close(&sgd);
  td_optim_close(&opt);
  td_backend_close(&be);
}
END_TEST

/* A late joiner's optimizer state is local and starts fresh: after a reset
 * the state is zero, t is 0, and the next step is a first step again. */
START_TEST(reset_optimizer_takes_a_first_step_again) {
  td_backend_t *be = cpu();
  td_optim_t *opt = open_adamw(be, 0, 0);
  float *w = td_backend_alloc(be, N * sizeof(float)), g[N];
  td_rng_t rng;
  td_rng_seed(&rng, 19);
  for (int step = 0; step < 5; step++) {
    fill_normal(g, N, &rng, 1.0);
    td_optim_step(opt, w, g, 0.01);
  }
  ck_assert_int_eq(td_optim_reset(opt), 0);
  ck_assert_uint_eq(td_optim_steps(opt), 0);
  for (size_t s = 0; s < td_optim_state_count(opt); s++)
    for (int i = 0; i < N; i++)
      ck_assert(td_optim_state(opt, s)[i] == 0.0f);
  float before[N];
  memcpy(before, w, sizeof before);
  fill_normal(g, N, &rng, 1.0);
  float sign[N];
  for (int i = 0; i < N; i++)
    sign[i] = g[i] > 0 ? 1.0f : -1.0f;
  td_optim_step(opt, w, g, 0.01);
  for (int i = 0; i < N; i++)
    ck_assert(fabs(w[i] - (before[i] - 0.01 * sign[i])) < 1e-6);
  td_backend_free(be, w);
  td_optim_close(&opt);
  td_backend_close(&be);
}
END_TEST

static void must_not_run(td_backend_t *be, float *w, const float *g, float *m, float *v,
                         size_t n, const td_adamw_hparams_t *hp) {
  (void)be, (void)w, (void)g, (void)m, (void)v, (void)n, (void)hp;
  ck_abort_msg("a version-1 table's adamw_step slot was called");
}

/* adamw_step is an optional version-2 slot: a table of version 1 (whatever
 * lies past its end) or with a NULL slot gets the CPU loop, same numbers. */
START_TEST(backends_without_adamw_step_fall_back_to_the_cpu_loop) {
  td_backend_t *be = cpu();
  td_backend_iface_t v1 = td__backend_cpu, v2_null = td__backend_cpu;
  v1.version = 1;
  v1.adamw_step = must_not_run;
  v2_null.adamw_step = NULL;
  td_backend_t old = {.iface = &v1}, partial = {.iface = &v2_null};
  float w[3][N], g[N], m[3][N], v[3][N];
  td_rng_t rng;
  td_rng_seed(&rng, 23);
  fill_normal(w[0], N, &rng, 1.0);
  fill_normal(g, N, &rng, 1.0);
  memcpy(w[1], w[0], sizeof w[0]);
  memcpy(w[2], w[0], sizeof w[0]);
  memset(m, 0, sizeof m);
  memset(v, 0, sizeof v);
  td_adamw_hparams_t hp = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .bias1 = 0.1f, .bias2 = 0.05f,
                           .grad_scale = 0.5f};
  td_backend_adamw_step(be, w[0], g, m[0], v[0], N, &hp);
  td_backend_adamw_step(&old, w[1], g, m[1], v[1], N, &hp);
  td_backend_adamw_step(&partial, w[2], g, m[2], v[2], N, &hp);
  ck_assert_int_eq(memcmp(w[0], w[1], sizeof w[0]), 0);
  ck_assert_int_eq(memcmp(w[0], w[2], sizeof w[0]), 0);
  ck_assert_int_eq(memcmp(v[0], v[1], sizeof v[0]), 0);
  /* and grad_scale is applied: m = (1 - b1) * 0.5 g after one step */
  for (int i = 0; i < N; i++)
    ck_assert(fabs(m[0][i] - 0.1 * 0.5 * g[i]) < 1e-6);
  td_backend_close(&be);
}
END_TEST

START_TEST(bad_options_are_refused_with_a_reason) {
  td_backend_t *be = cpu();
  td_optim_t *opt = NULL;
  char why[256] = "";
  td_optim_kind_t kind;
  ck_assert_int_eq(td_optim_kind_parse(&kind, "adamw", why, sizeof why), 0);
  ck_assert_int_eq(kind, TD_OPTIM_ADAMW);
  ck_assert_str_eq(td_optim_kind_name(kind), "adamw");
  ck_assert_int_eq(td_optim_kind_parse(&kind, "adam", why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "unknown optimizer 'adam' (accepted: sgd, adamw)"));
  td_optim_opts_t bad[] = {
      {.kind = TD_OPTIM_ADAMW, .beta1 = 1.0, .beta2 = 0.95, .eps = 1e-8},
      {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = -0.1, .eps = 1e-8},
      {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.95, .eps = 0},
      {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .clip = -1},
      {.kind = TD_OPTIM_SGD, .momentum = 0, .nesterov = true},
      {.kind = TD_OPTIM_SGD, .weight_decay = NAN},
  };
  const char *expect[] = {"betas", "betas", "eps", "clip", "nesterov", "weight_decay"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_int_eq(td_optim_open(&opt, be, N, &bad[i], why, sizeof why), TD_ECONFIG);
    ck_assert_ptr_null(opt);
    ck_assert_msg(strstr(why, expect[i]) != NULL, "case %zu: %s", i, why);
  }
  td_backend_close(&be);
}
END_TEST

static float *alloc_floats(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- SGD and schedules -------------------------------------------------- */

START_TEST(sgd_matches_hand_computed_updates) {
  td_backend_t *be = cpu();
  /* One weight w = 1, gradient 0.5 three times, lr 0.1, mu 0.9:
   *   momentum: v = 0.5, 0.95, 1.355;  w = 0.95, 0.855, 0.7195
   *   nesterov: w -= lr * (g + mu * v): 0.905, 0.7695, 0.59755 */
  static const struct {
    td_sgd_opts_t opts;
    float w3;
  } literal[] = {
      {{.momentum = 0.9}, 0.7195f},
      {{.momentum = 0.9, .nesterov = true}, 0.59755f},
      {{.momentum = 0}, 0.85f},
  };
  for (size_t k = 0; k < sizeof literal / sizeof literal[0]; k++) {
    td_sgd_t *opt = NULL;
    ck_assert_int_eq(td_sgd_open(&opt, be, 1, &literal[k].opts), 0);
    float w = 1.0f;
    const float g = 0.5f;
    for (int step = 0; step < 3; step++)
      td_sgd_step(opt, &w, &g, 0.1);
    ck_assert_msg(fabsf(w - literal[k].w3) < 1e-6f, "case %zu: %.7g vs %.7g", k, w,
                  literal[k].w3);
    td_sgd_close(&opt);
  }

  /* every combination against the formula of td_backend_sgd_step, in double */
  static const td_sgd_opts_t cases[] = {
      {.momentum = 0},
      {.momentum = 0.9},
      {.momentum = 0.9, .weight_decay = 0.1},
      {.momentum = 0.9, .weight_decay = 0.1, .nesterov = true},
      {.momentum = 0, .weight_decay = 0.1},
  };
  enum { COUNT = 19 };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const td_sgd_opts_t *c = &cases[k];
    td_sgd_t *opt = NULL;
    ck_assert_int_eq(td_sgd_open(&opt, be, COUNT, c), 0);
    float w[COUNT], g[COUNT];
    double ref_w[COUNT], ref_v[COUNT];
    td_rng_t rng;
    td_rng_seed(&rng, 8);
    for (int i = 0; i < COUNT; i++)
      ref_w[i] = w[i] = (float)td_rng_normal(&rng);
    memset(ref_v, 0, sizeof ref_v);
    for (int step = 0; step < 3; step++) {
      fill_normal(g, COUNT, &rng, 1.0);
      td_sgd_step(opt, w, g, 0.1);
      for (int i = 0; i < COUNT; i++) {
        double gi = g[i] + c->weight_decay * ref_w[i];
        if (c->momentum > 0) {
          ref_v[i] = c->momentum * ref_v[i] + gi;
          ref_w[i] -= 0.1 * (c->nesterov ? gi + c->momentum * ref_v[i] : ref_v[i]);
        } else {
          ref_w[i] -= 0.1 * gi;
        }
      }
    }
    const float *v = td_sgd_velocity(opt);
    for (int i = 0; i < COUNT; i++) {
      ck_assert_msg(fabs(w[i] - ref_w[i]) < 1e-6, "case %zu w[%d] %.9g vs %.9g", k, i, w[i],
                    ref_w[i]);
      ck_assert_msg(fabs(v[i] - ref_v[i]) < 1e-6, "case %zu v[%d]", k, i);
    }
    td_sgd_close(&opt);
    ck_assert_ptr_null(opt);
  }

  /* options out of range are a configuration error */
  td_sgd_t *opt = NULL;
  static const td_sgd_opts_t bad[] = {
      {.momentum = 1.0}, {.momentum = -0.1}, {.weight_decay = -1}, {.nesterov = true},
      {.momentum = NAN}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    ck_assert_int_eq(td_sgd_open(&opt, be, 3, &bad[k]), TD_ECONFIG);
    ck_assert_ptr_null(opt);
  }
  td_sgd_close(&opt);
  td_backend_close(&be);
}
END_TEST

START_TEST(momentum_zero_is_plain_sgd) {
  td_backend_t *be = cpu();
  enum { COUNT = 1000 };
  td_sgd_t *opt = NULL;
  td_sgd_opts_t so = {.momentum = 0};
  ck_assert_int_eq(td_sgd_open(&opt, be, COUNT, &so), 0);
  float *w = alloc_floats(COUNT), *ref = alloc_floats(COUNT), *g = alloc_floats(COUNT);
  td_rng_t rng;
  td_rng_seed(&rng, 9);
  fill_normal(w, COUNT, &rng, 1.0);
  memcpy(ref, w, COUNT * sizeof *w);
  for (int step = 0; step < 3; step++) {
    fill_normal(g, COUNT, &rng, 1.0);
    td_sgd_step(opt, w, g, 0.25);
    for (int i = 0; i < COUNT; i++)
      ref[i] -= 0.25f * g[i];
  }
  for (int i = 0; i < COUNT; i++) {
    ck_assert_float_eq_tol(w[i], ref[i], 1e-6f);
    ck_assert_float_eq(td_sgd_velocity(opt)[i], 0.0f); /* the velocity is never touched */
  }
  free(w);
  free(ref);
  free(g);
  td_sgd_close(&opt);
  td_backend_close(&be);
}
END_TEST

START_TEST(lr_schedules_at_known_points) {
  td_lr_schedule_t s;
  char why[256] = "";
  /* (spec, base_lr, warmup_steps, steps_per_epoch, total_steps) */
  ck_assert_int_eq(td_lr_schedule_parse(&s, "constant", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_int_eq(s.kind, TD_LR_CONSTANT);
  ck_assert_double_eq(td_lr_at(&s, 0), 0.1);
  ck_assert_double_eq(td_lr_at(&s, 1000000), 0.1);

  ck_assert_int_eq(td_lr_schedule_parse(&s, "cosine", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 0), 0.1, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 50), 0.05, 1e-9);
  ck_assert_double_eq_tol(td_lr_at(&s, 99), 0.1 * 0.5 * (1 + cos(M_PI * 0.99)), 1e-12);
  ck_assert_double_eq_tol(td_lr_at(&s, 100), 0.0, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 5000), 0.0, 1e-15); /* stays at 0 past the end */

  /* step:EPOCHS:GAMMA multiplies by GAMMA every EPOCHS epochs */
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:1:0.5", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_uint_eq(s.step_every, 10);
  ck_assert_double_eq_tol(td_lr_at(&s, 9), 0.1, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 10), 0.05, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 25), 0.025, 1e-15);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:2", 1.0, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 19), 1.0, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 20), 0.1, 1e-15); /* GAMMA defaults to 0.1 */
  ck_assert_double_eq_tol(td_lr_at(&s, 45), 0.01, 1e-15);

  /* warm-up: linear from base/warmup to base, then the schedule over the rest */
  ck_assert_int_eq(td_lr_schedule_parse(&s, "cosine", 0.1, 10, 10, 110, why, sizeof why), 0);
  for (unsigned long step = 0; step < 10; step++)
    ck_assert_double_eq_tol(td_lr_at(&s, step), 0.1 * (step + 1) / 10, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 10), 0.1, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 60), 0.05, 1e-9);
  ck_assert_double_eq_tol(td_lr_at(&s, 110), 0.0, 1e-15);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "constant", 0.2, 4, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 0), 0.05, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 3), 0.2, 1e-15);
  /* cosine with no steps left after the warm-up: base, then 0 */
  ck_assert_int_eq(td_lr_schedule_parse(&s, "cosine", 0.1, 10, 10, 5, why, sizeof why), 0);
  ck_assert_double_eq_tol(td_lr_at(&s, 10), 0.1, 1e-15);
  ck_assert_double_eq_tol(td_lr_at(&s, 11), 0.0, 1e-15);

  static const char *bad[] = {"linear",   "step:",       "step:0",     "step:2:0",
                              "step:2:1.5", "step:x",    "step:2:",    "step:2:0.5x",
                              "step:-1",  "step: 2",     "step:+2",    "step:2:nan",
                              "step:2:1e-1", "step:2:-0.5", "step:99999999999999999999",
                              "cosine2",  "Constant",    "",           "constant "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(td_lr_schedule_parse(&s, bad[i], 0.1, 0, 10, 100, why, sizeof why) ==
                      TD_ECONFIG,
                  "'%s' was accepted", bad[i]);
    ck_assert_msg(why[0] != '\0', "'%s': no reason given", bad[i]);
  }
  ck_assert_int_eq(td_lr_schedule_parse(&s, NULL, 0.1, 0, 10, 100, why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "constant", NAN, 0, 10, 100, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:2:1", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_int_eq(td_lr_schedule_parse(&s, "step:2:.5", 0.1, 0, 10, 100, why, sizeof why), 0);
  ck_assert_double_eq(s.gamma, 0.5);
}
END_TEST


int main(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, adamw_matches_the_reference_over_several_steps);
  tcase_add_test(tc, adamw_first_step_is_lr_times_sign_of_g);
  tcase_add_test(tc, adamw_weight_decay_is_decoupled);
  tcase_add_test(tc, clip_scales_to_max_norm_only_when_above);
  tcase_add_test(tc, optimizer_clip_equals_stepping_on_the_clipped_gradient);
  tcase_add_test(tc, optim_sgd_is_td_sgd);
  tcase_add_test(tc, reset_optimizer_takes_a_first_step_again);
  tcase_add_test(tc, backends_without_adamw_step_fall_back_to_the_cpu_loop);
  tcase_add_test(tc, bad_options_are_refused_with_a_reason);
  suite_add_tcase(s, tc);

  TCase *sgd = tcase_create("sgd");
  tcase_add_test(sgd, sgd_matches_hand_computed_updates);
  tcase_add_test(sgd, momentum_zero_is_plain_sgd);
  tcase_add_test(sgd, lr_schedules_at_known_points);
  suite_add_tcase(s, sgd);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
