/* test_scaffold.c: SCAFFOLD (compute/scaffold.h, the trainer's correction).
 *
 * The rules against a naive double-precision reference: option II's client
 * update, and the global control variate derived from the round's average
 * delta, which must equal c + frac * mean(ci_new - ci_old) computed from the
 * clients themselves (the derivation docs/algorithms.md#scaffold relies on).
 * The headline: two clients with quadratic losses of opposite optima and
 * different curvatures, f1 = h1/2 (w - a)^2 and f2 = h2/2 (w + a)^2, many
 * local steps. FedAvg settles on its closed-form fixed point, far from the
 * global optimum a (h1 - h2) / (h1 + h2); SCAFFOLD reaches the optimum. The
 * trainer's correction: one step with it moves the weights by -lr * corr
 * more than one without, and unset it changes no bit. Virtual clients keep
 * a ci each, updated by option II, and are averaged alike. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compute/clients.h"
#include "compute/rng.h"
#include "compute/scaffold.h"
#include "compute/trainer.h"

START_TEST(client_and_server_updates_match_a_naive_reference) {
  enum { N = 257, CLIENTS = 5 };
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  static float c[N], x[N], y[CLIENTS][N], ci[CLIENTS][N], ci0[CLIENTS][N], avg[N], corr[N];
  for (size_t k = 0; k < N; k++) {
    c[k] = (float)td_rng_normal(&rng);
    x[k] = (float)td_rng_normal(&rng);
  }
  for (int j = 0; j < CLIENTS; j++)
    for (size_t k = 0; k < N; k++) {
      y[j][k] = x[k] + 0.1f * (float)td_rng_normal(&rng);
      ci[j][k] = ci0[j][k] = (float)td_rng_normal(&rng);
    }
  td_scaffold_correction(corr, c, ci[2], N);
  for (size_t k = 0; k < N; k++)
    ck_assert_float_eq(corr[k], c[k] - ci[2][k]);
  const double lr_sum = 0.37, frac = 0.25; /* e.g. 5 sampled of 20 clients */
  for (int j = 0; j < CLIENTS; j++) {
    td_scaffold_client_update(ci[j], c, x, y[j], lr_sum, N);
    for (size_t k = 0; k < N; k++) {
      double want = (double)ci0[j][k] - c[k] + ((double)x[k] - y[j][k]) / lr_sum;
      ck_assert_double_eq_tol(ci[j][k], want, 1e-5 * (1 + fabs(want)));
    }
  }
  for (size_t k = 0; k < N; k++) { /* the round's average delta, as the mesh makes it */
    double s = 0;
    for (int j = 0; j < CLIENTS; j++)
      s += (double)y[j][k] - x[k];
    avg[k] = (float)(s / CLIENTS);
  }
  float c_derived[N];
  memcpy(c_derived, c, sizeof c);
  td_scaffold_server_update(c_derived, avg, lr_sum, frac, N);
  double worst = 0;
  for (size_t k = 0; k < N; k++) { /* the paper's rule, from the clients' own updates */
    double s = 0;
    for (int j = 0; j < CLIENTS; j++)
      s += (double)ci[j][k] - ci0[j][k];
    double want = (double)c[k] + frac * s / CLIENTS, err = fabs(c_derived[k] - want);
    worst = err / (1 + fabs(want)) > worst ? err / (1 + fabs(want)) : worst;
  }
  ck_assert_msg(worst < 1e-5, "derived c differs from c + frac mean(dci) by %g", worst);
}
END_TEST

/* The two-client quadratic, per coordinate k with its own a_k: local steps
 * of gradient descent (lr eta, H steps) from x, corrected by c - ci when
 * scaffold; the server takes the plain mean of the deltas. */
enum { DIM = 3, H = 50, ROUNDS = 400 };
static const double h[2] = {1.0, 4.0}, eta = 0.05;
static const float a[DIM] = {1.0f, -2.0f, 0.5f};

static double optimum(int j, size_t k) { return j == 0 ? a[k] : -a[k]; }

static void run_rounds(bool scaffold, float *x) {
  float c[DIM] = {0}, ci[2][DIM] = {{0}}, y[2][DIM], avg[DIM], corr[DIM];
  memset(x, 0, DIM * sizeof(float));
  for (int r = 0; r < ROUNDS; r++) {
    for (int j = 0; j < 2; j++) {
      td_scaffold_correction(corr, c, ci[j], DIM);
      memcpy(y[j], x, sizeof y[j]);
      for (int s = 0; s < H; s++)
        for (size_t k = 0; k < DIM; k++) {
          double g = h[j] * ((double)y[j][k] - optimum(j, k)) + (scaffold ? corr[k] : 0);
          y[j][k] = (float)(y[j][k] - eta * g);
        }
    }
    for (size_t k = 0; k < DIM; k++)
      avg[k] = (float)(((double)y[0][k] - x[k] + (double)y[1][k] - x[k]) / 2);
    if (scaffold) {
      for (int j = 0; j < 2; j++)
        td_scaffold_client_update(ci[j], c, x, y[j], H * eta, DIM);
      td_scaffold_server_update(c, avg, H * eta, 1.0, DIM);
      for (size_t k = 0; k < DIM; k++) /* c stays the mean of the ci (full participation) */
        ck_assert_double_eq_tol(c[k], ((double)ci[0][k] + ci[1][k]) / 2,
                                1e-4 * (1 + fabs(c[k])));
    }
    for (size_t k = 0; k < DIM; k++)
      x[k] += avg[k];
  }
}

START_TEST(scaffold_reaches_the_optimum_where_fedavg_drifts) {
  float fedavg[DIM], scaffold[DIM];
  run_rounds(false, fedavg);
  run_rounds(true, scaffold);
  double q[2] = {pow(1 - eta * h[0], H), pow(1 - eta * h[1], H)};
  for (size_t k = 0; k < DIM; k++) {
    double global = a[k] * (h[0] - h[1]) / (h[0] + h[1]); /* argmin f1 + f2 */
    /* FedAvg's fixed point: x = mean_j (w_j + q_j (x - w_j)), w_j the optima */
    double drift = (optimum(0, k) * (1 - q[0]) + optimum(1, k) * (1 - q[1])) /
                   (2 - q[0] - q[1]);
    ck_assert_double_eq_tol(fedavg[k], drift, 1e-4);
    ck_assert_msg(fabs(drift - global) > 0.25 * fabs(a[k]),
                  "the problem shows no drift: %g vs %g", drift, global);
    ck_assert_msg(fabs(scaffold[k] - global) < 1e-4,
                  "coordinate %zu: scaffold ends at %g, the optimum is %g (fedavg %g)", k,
                  (double)scaffold[k], global, (double)fedavg[k]);
  }
}
END_TEST

/* With sampling: each round a seeded half of 6 clients trains, frac = 1/2;
 * c stays the mean of all six ci, unsampled ones included. */
START_TEST(sampled_rounds_keep_c_the_mean_of_all_clients) {
  enum { M = 6, N = 16 };
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  float c[N] = {0}, ci[M][N], x[N], y[N], avg[N];
  memset(ci, 0, sizeof ci);
  for (size_t k = 0; k < N; k++)
    x[k] = (float)td_rng_normal(&rng);
  for (int r = 0; r < 30; r++) {
    int picked[M / 2], m = 0;
    for (int j = 0; j < M && m < M / 2; j++)
      if (td_rng_uniform(&rng) < 0.5 || M - j == M / 2 - m)
        picked[m++] = j;
    double sum[N] = {0};
    float c_old[N];
    memcpy(c_old, c, sizeof c);
    for (int i = 0; i < m; i++) {
      for (size_t k = 0; k < N; k++) {
        y[k] = x[k] + 0.05f * (float)td_rng_normal(&rng);
        sum[k] += (double)y[k] - x[k];
      }
      td_scaffold_client_update(ci[picked[i]], c_old, x, y, 0.2, N);
    }
    for (size_t k = 0; k < N; k++)
      avg[k] = (float)(sum[k] / m);
    td_scaffold_server_update(c, avg, 0.2, (double)m / M, N);
    for (size_t k = 0; k < N; k++) {
      double mean = 0;
      for (int j = 0; j < M; j++)
        mean += ci[j][k];
      mean /= M;
      ck_assert_double_eq_tol(c[k], mean, 1e-4 * (1 + fabs(mean)));
      x[k] += avg[k];
    }
  }
}
END_TEST

/* Three blobs in 8 dimensions, labels 0..2 (as test_trainer.c). */
static char *synthetic_csv(void) {
  static char path[64];
  strcpy(path, "/tmp/td-scaffold-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  td_rng_t rng;
  td_rng_seed(&rng, 7);
  for (int i = 0; i < 300; i++) {
    int label = i % 3;
    fprintf(f, "%d", label);
    for (int d = 0; d < 8; d++)
      fprintf(f, ",%.5f", (d % 3 == label ? 2.0 : 0.0) + 0.5 * td_rng_normal(&rng));
    fputc('\n', f);
  }
  fclose(f);
  return path;
}

/* Three trainers, same seed and data, plain SGD at a constant rate: a
 * plain, b with a correction set and then unset, c with corr = c - ci. After
 * one step c - a = -lr corr; b equals a bit for bit after 1 and 20 steps;
 * Σlr over 10 steps is 10 lr. */
START_TEST(the_trainer_adds_the_correction_to_each_gradient) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, why, sizeof why), 0);
  const char *csv = synthetic_csv();
  td_trainer_opts_t o = {.model_spec = "mlp:8-16-3", .batch = 32, .seed = 5, .lr = 0.1,
                         .lr_schedule = "constant", .epochs = 2};
  td_dataset_t *ds[3] = {NULL};
  td_trainer_t *tr[3] = {NULL};
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(td_dataset_load_csv(&ds[i], csv, why, sizeof why), 0);
    ck_assert_msg(td_trainer_open(&tr[i], be, ds[i], &o, why, sizeof why) == 0, "%s", why);
  }
  size_t n = td_model_numel(td_trainer_model(tr[0]));
  float *cv = malloc(n * sizeof(float)), *ci = malloc(n * sizeof(float)),
        *corr = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    cv[i] = 0.3f * sinf((float)i);
    ci[i] = 0.2f * cosf((float)i);
  }
  td_scaffold_correction(corr, cv, ci, n);
  ck_assert_double_eq_tol(td_trainer_lr_sum(tr[0], 0, 10), 1.0, 1e-12);
  ck_assert_int_eq(td_trainer_set_correction(tr[1], corr, why, sizeof why), 0);
  ck_assert_int_eq(td_trainer_set_correction(tr[1], NULL, why, sizeof why), 0);
  ck_assert_int_eq(td_trainer_set_correction(tr[2], corr, why, sizeof why), 0);
  td_train_stats_t st;
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(td_trainer_steps(tr[i], 1, &st, why, sizeof why), 0);
  const float *a = td_model_params(td_trainer_model(tr[0]));
  const float *b = td_model_params(td_trainer_model(tr[1]));
  const float *c = td_model_params(td_trainer_model(tr[2]));
  ck_assert_int_eq(memcmp(a, b, n * sizeof(float)), 0);
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double want = -0.1 * ((double)cv[i] - ci[i]), err = fabs(((double)c[i] - a[i]) - want);
    worst = err > worst ? err : worst;
  }
  ck_assert_msg(worst < 1e-6, "c - a differs from -lr (c - ci) by up to %g", worst);
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(td_trainer_steps(tr[i], 19, &st, why, sizeof why), 0);
  ck_assert_int_eq(memcmp(a, b, n * sizeof(float)), 0);
  free(cv);
  free(ci);
  free(corr);
  for (int i = 0; i < 3; i++) {
    td_trainer_close(&tr[i]);
    td_dataset_close(&ds[i]);
  }
  td_backend_close(&be);
  unlink(csv);
}
END_TEST

/* Virtual clients (compute/clients.h) with SCAFFOLD: three clients of one
 * node, c and their ci set to known values, one round of 6 steps at a cosine
 * rate. Against a naive reference (each client alone on a second trainer
 * with its correction c - ci_j): every ci_j moves to ci_j - c + (base -
 * y_j) / Σlr, and the node's delta is the plain (unweighted) mean of the
 * y_j - base, whatever rows each client trained. */
START_TEST(virtual_clients_each_keep_their_own_control_variate) {
  td_backend_t *be = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_backend_open(&be, "cpu", 1, why, sizeof why), 0);
  const char *csv = synthetic_csv();
  td_trainer_opts_t o = {.model_spec = "mlp:8-16-3", .batch = 16, .seed = 3, .lr = 0.1,
                         .lr_schedule = "cosine", .total_steps = 40};
  td_dataset_t *ds[2] = {NULL};
  td_trainer_t *tr[2] = {NULL};
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(td_dataset_load_csv(&ds[i], csv, why, sizeof why), 0);
    ck_assert_msg(td_trainer_open(&tr[i], be, ds[i], &o, why, sizeof why) == 0, "%s", why);
  }
  enum { K = 3, STEPS = 6, FIRST = 5 };
  const size_t off[K + 1] = {0, 40, 140, 300}; /* 40 rows: short batches at its epoch's end */
  size_t n = td_model_numel(td_trainer_model(tr[0]));
  float *base = malloc(n * sizeof(float)), *delta = malloc(n * sizeof(float));
  float *cv = malloc(n * sizeof(float)), *ci = malloc(K * n * sizeof(float));
  float *ci0 = malloc(K * n * sizeof(float)), *corr = malloc(n * sizeof(float));
  memcpy(base, td_model_host_params(td_trainer_model(tr[0])), n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    cv[i] = 0.2f * sinf((float)i);
    for (int j = 0; j < K; j++)
      ci[j * n + i] = ci0[j * n + i] = 0.1f * cosf((float)(i + 7 * j));
  }
  td_clients_t *cl = NULL;
  ck_assert_int_eq(td_clients_open(&cl, off, K, 0), 0);
  td_clients_set_scaffold(cl, cv, ci, corr);
  unsigned which[K] = {0, 1, 2};
  td_train_stats_t st;
  ck_assert_int_eq(
      td_clients_train(cl, tr[0], which, K, base, FIRST, STEPS, delta, &st, why, sizeof why), 0);
  double lr_sum = td_trainer_lr_sum(tr[0], FIRST, STEPS), worst_ci = 0, worst_delta = 0;
  double *mean = calloc(n, sizeof(double));
  float *my_corr = malloc(n * sizeof(float));
  for (int j = 0; j < K; j++) { /* the reference: client j alone */
    memcpy(td_model_host_params(td_trainer_model(tr[1])), base, n * sizeof(float));
    ck_assert_int_eq(td_trainer_reset_optim(tr[1]), 0);
    td_trainer_seek(tr[1], FIRST);
    td_trainer_rows_t w;
    td_trainer_rows_init(&w, off[j], off[j + 1] - off[j], (uint64_t)j + 1);
    ck_assert_int_eq(td_trainer_bind_rows(tr[1], &w), 0);
    for (size_t i = 0; i < n; i++)
      my_corr[i] = cv[i] - ci0[j * n + i];
    ck_assert_int_eq(td_trainer_set_correction(tr[1], my_corr, why, sizeof why), 0);
    td_train_stats_t sj;
    ck_assert_int_eq(td_trainer_steps(tr[1], STEPS, &sj, why, sizeof why), 0);
    const float *y = td_model_host_params(td_trainer_model(tr[1]));
    for (size_t i = 0; i < n; i++) {
      double want = (double)ci0[j * n + i] - cv[i] + ((double)base[i] - y[i]) / lr_sum;
      double err = fabs(ci[j * n + i] - want) / (1 + fabs(want));
      worst_ci = err > worst_ci ? err : worst_ci;
      mean[i] += ((double)y[i] - base[i]) / K;
    }
  }
  for (size_t i = 0; i < n; i++) {
    double err = fabs(delta[i] - mean[i]);
    worst_delta = err > worst_delta ? err : worst_delta;
  }
  ck_assert_msg(worst_ci < 1e-5, "a client's ci is off option II by %g", worst_ci);
  ck_assert_msg(worst_delta < 1e-6, "the node's delta is off the plain mean by %g", worst_delta);
  td_clients_close(&cl);
  free(mean);
  free(my_corr);
  free(base);
  free(delta);
  free(cv);
  free(ci);
  free(ci0);
  free(corr);
  for (int i = 0; i < 2; i++) {
    td_trainer_close(&tr[i]);
    td_dataset_close(&ds[i]);
  }
  td_backend_close(&be);
  unlink(csv);
}
END_TEST

int main(void) {
  Suite *s = suite_create("scaffold");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, client_and_server_updates_match_a_naive_reference);
  tcase_add_test(tc, scaffold_reaches_the_optimum_where_fedavg_drifts);
  tcase_add_test(tc, sampled_rounds_keep_c_the_mean_of_all_clients);
  tcase_add_test(tc, the_trainer_adds_the_correction_to_each_gradient);
  tcase_add_test(tc, virtual_clients_each_keep_their_own_control_variate);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
