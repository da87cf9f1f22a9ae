/* test_model_device.c: the device-resident model, whole models trained on a
 * device backend against the same models trained on the CPU.
 *
 * A model on a backend with device memory keeps its parameters, gradients,
 * optimizer state and batches on the device and shows the host a pinned copy
 * of its parameters (td_model_host_params, td_model_pull, td_model_push). Each
 * case trains one model family (an MLP with SGD, momentum and clipping that
 * scales; a CNN with GroupNorm and dropout under AdamW with clipping; a
 * residual block with LayerNorm and GELU; a byte-level GPT) for some steps on
 * the CPU and on the device under test from the same seed and data, and
 * compares the losses, the parameters pulled back, an evaluation, and then the
 * same again after the host changed its copy and pushed it (what the daemon
 * does after every round). Before the pull the host copy must still hold what
 * was last pushed: the steps happen on the device, not in the host's buffer.
 *
 * Built twice. test_model_device runs everywhere against the CPU posing as a
 * device (td__backend_open_cpu_as_device): the same code path, checked for any
 * host pointer handed to an op or a transfer going the wrong way, and bit for
 * bit equal to the CPU. test_model_cuda (-DTD_TEST_CUDA) runs it against the
 * GPU, within float rounding, and exits 77 without one. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/backend_impl.h"
#include "compute/trainer.h"

#ifdef TD_TEST_CUDA
#define EXACT false
#else
#define EXACT true
#endif

static td_backend_t *ref, *dut;

static void open_dut(td_backend_t **out, char *why, size_t why_len) {
#ifdef TD_TEST_CUDA
  ck_assert_msg(td_backend_open(out, "cuda", 1, why, why_len) == 0, "%s", why);
#else
  ck_assert_msg(td__backend_open_cpu_as_device(out, 1, why, why_len) == 0, "%s", why);
#endif
}

static void setup(void) {
  char why[512] = "";
  ck_assert_msg(td_backend_open(&ref, "cpu", 1, why, sizeof why) == 0, "%s", why);
  open_dut(&dut, why, sizeof why);
  ck_assert(td_backend_device_memory(dut));
}

static void teardown(void) {
  td_backend_close(&ref);
  td_backend_close(&dut);
}

typedef struct {
  const char *spec;
  int dim; /* features per sample; 0: a text model */
  td_optim_opts_t optim;
  double lr;
} case_t;

static const case_t cases[] = {
    {"mlp:8-16-3", 8,
     {.kind = TD_OPTIM_SGD, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-4, .clip = 0.5},
     0.05},
    {"layers:input(1,6,6) conv(4,3,pad=1) relu maxpool(2) groupnorm(2) flatten dense(8) relu "
     "dropout(0.2) dense(3)",
     36,
     {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
      .clip = 1.0},
     0.003},
    {"layers:input(12) dense(12) [ layernorm dense(12) gelu ] dense(3)", 12,
     {.kind = TD_OPTIM_SGD, .momentum = 0.5}, 0.05},
    {"gpt:1-16-2-8", 0,
     {.kind = TD_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
      .clip = 1.0},
     0.003},
};

/* Three Gaussian blobs in dim dimensions, labels 0..2, as a CSV file. */
static void write_csv(char *path, size_t len, int dim) {
  snprintf(path, len, "/tmp/td-model-device-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  for (int i = 0; i < 200; i++) {
    fprintf(f, "%d", i % 3);
    for (int d = 0; d < dim; d++)
      fprintf(f, ",%.5f", (d % 3 == i % 3 ? 1.5 : 0.0) + 0.5 * td_rng_normal(&rng));
    fputc('\n', f);
  }
  fclose(f);
}

/* Repeating English-like bytes for the text model. */
static uint8_t *make_text(size_t n) {
  static const char words[] = "the quick brown fox jumps over the lazy dog; ";
  uint8_t *t = malloc(n);
  ck_assert_ptr_nonnull(t);
  for (size_t i = 0; i < n; i++)
    t[i] = (uint8_t)words[(i * 7 + i / 13) % (sizeof words - 1)];
  return t;
}

typedef struct {
  td_trainer_t *tr;
  td_dataset_t *ds;
} side_t;

static void open_side(side_t *s, td_backend_t *be, const case_t *c, const char *csv,
                      const uint8_t *text, size_t text_bytes) {
  char why[512] = "";
  td_trainer_opts_t o = {.model_spec = c->spec, .batch = 16, .seed = 5, .lr = c->lr,
                         .lr_schedule = "cosine", .warmup_steps = 2, .total_steps = 40,
                         .optim = c->optim};
  if (c->dim > 0) {
    ck_assert_int_eq(td_dataset_load_csv(&s->ds, csv, why, sizeof why), 0);
    ck_assert_msg(td_trainer_open(&s->tr, be, s->ds, &o, why, sizeof why) == 0, "%s: %s",
                  c->spec, why);
  } else {
    ck_assert_msg(td_trainer_open_text(&s->tr, be, text, text_bytes, &o, why, sizeof why) == 0,
                  "%s: %s", c->spec, why);
  }
}

static void close_side(side_t *s) {
  td_trainer_close(&s->tr);
  td_dataset_close(&s->ds);
}

/* Parameters equal: bit for bit on the CPU posing as a device, within float
 * rounding (of a few optimizer steps) on a GPU. */
static void assert_params_match(const float *a, const float *b, size_t n, const char *what) {
  if (EXACT) {
    ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0, "%s: parameters differ", what);
    return;
  }
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabsf(a[i] - b[i]) <= 2e-3f + 1e-2f * fabsf(a[i]), "%s: [%zu] %g vs %g",
                  what, i, (double)a[i], (double)b[i]);
}

static void assert_close(double a, double b, const char *what) {
  if (EXACT)
    ck_assert_msg(a == b, "%s: %.17g vs %.17g", what, a, b);
  else
    ck_assert_msg(fabs(a - b) <= 1e-3 * (1 + fabs(a)), "%s: %.9g vs %.9g", what, a, b);
}

static void train_both(side_t *r, side_t *d, unsigned long steps, const char *what) {
  char why[512] = "";
  td_train_stats_t sr, sd;
  ck_assert_msg(td_trainer_steps(r->tr, steps, &sr, why, sizeof why) == 0, "%s", why);
  ck_assert_msg(td_trainer_steps(d->tr, steps, &sd, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(sr.samples, sd.samples);
  assert_close(sr.loss, sd.loss, what);
}

static void evaluate_both(side_t *r, side_t *d, const case_t *c, const uint8_t *text,
                          size_t text_bytes) {
  char why[512] = "";
  double lr_ = 0, ar = 0, ld = 0, ad = 0;
  if (c->dim > 0) {
    ck_assert_int_eq(td_trainer_evaluate(r->tr, r->ds, &lr_, &ar, why, sizeof why), 0);
    ck_assert_msg(td_trainer_evaluate(d->tr, d->ds, &ld, &ad, why, sizeof why) == 0, "%s", why);
    assert_close(ar, ad, "accuracy");
  } else {
    ck_assert_int_eq(td_trainer_evaluate_text(r->tr, text, text_bytes, &lr_, why, sizeof why), 0);
    ck_assert_msg(td_trainer_evaluate_text(d->tr, text, text_bytes, &ld, why, sizeof why) == 0,
                  "%s", why);
  }
  assert_close(lr_, ld, "evaluation loss");
}

START_TEST(test_training_matches_cpu) {
  const case_t *c = &cases[_i];
  char csv[64] = "", why[512] = "";
  size_t text_bytes = 4096;
  uint8_t *text = make_text(text_bytes);
  if (c->dim > 0)
    write_csv(csv, sizeof csv, c->dim);
  side_t r = {0}, d = {0};
  open_side(&r, ref, c, csv, text, text_bytes);
  open_side(&d, dut, c, csv, text, text_bytes);
  td_model_t *mr = td_trainer_model(r.tr), *md = td_trainer_model(d.tr);
  size_t n = td_model_numel(mr);
  ck_assert_uint_eq(n, td_model_numel(md));
  /* on the device the ops' buffer is not the host's; on the CPU it is */
  ck_assert_ptr_eq(td_model_host_params(mr), td_model_params(mr));
  ck_assert_ptr_ne(td_model_host_params(md), td_model_params(md));
  /* the same init, and the host copy holds it */
  assert_params_match(td_model_params(mr), td_model_host_params(md), n, "init");
  float *before = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(before);
  memcpy(before, td_model_host_params(md), n * sizeof(float));

  train_both(&r, &d, 12, "loss over 12 steps");
  /* the steps changed the device's parameters, not the host copy */
  ck_assert_int_eq(memcmp(before, td_model_host_params(md), n * sizeof(float)), 0);
  ck_assert_int_ne(memcmp(before, td_model_params(mr), n * sizeof(float)), 0);
  ck_assert_msg(td_model_pull(md, why, sizeof why) == 0, "%s", why);
  assert_params_match(td_model_params(mr), td_model_host_params(md), n, "after 12 steps");
  evaluate_both(&r, &d, c, text, text_bytes);

  /* the host changes its copy (an outer step) and pushes it; training goes on from it */
  float *hr = td_model_params(mr), *hd = td_model_host_params(md);
  for (size_t i = 0; i < n; i++) {
    hr[i] = 0.5f * hr[i] + 0.25f * before[i];
    hd[i] = 0.5f * hd[i] + 0.25f * before[i];
  }
  memcpy(before, hd, n * sizeof(float));
  ck_assert_msg(td_model_push(md, why, sizeof why) == 0, "%s", why);
  train_both(&r, &d, 6, "loss after a push");
  ck_assert_int_eq(memcmp(before, td_model_host_params(md), n * sizeof(float)), 0);
  ck_assert_msg(td_model_pull(md, why, sizeof why) == 0, "%s", why);
  assert_params_match(td_model_params(mr), td_model_host_params(md), n, "after a push");
  evaluate_both(&r, &d, c, text, text_bytes);

  /* the GEMMs the bench replays are the model's, on any backend */
  size_t gemms = td_model_train_gemms(mr, 16, NULL, 0);
  ck_assert_uint_eq(td_model_train_gemms(md, 16, NULL, 0), gemms);
  ck_assert_double_eq(td_model_train_gemm_flops(md, 16), td_model_train_gemm_flops(mr, 16));
  /* nothing was misplaced (the CPU posing as a device checks every transfer
   * and the ops that read parameters or batches), and no device failed */
  ck_assert_msg(td_backend_error(dut, why, sizeof why) == 0, "%s", why);
  free(before);
  close_side(&r);
  close_side(&d);
  free(text);
  if (csv[0])
    unlink(csv);
}
END_TEST

#ifndef TD_TEST_CUDA
/* The checks themselves: a host pointer handed to an op, or a transfer whose
 * device side is host memory, is TD_EDEVICE naming the op, as a GPU would
 * fault. Without this the bit-for-bit case above could pass on host pointers. */
START_TEST(test_pretend_device_catches_host_pointers) {
  char why[512] = "";
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4];
  float *dc = td_backend_alloc(dut, sizeof c);
  ck_assert_ptr_nonnull(dc);
  ck_assert_int_eq(td_backend_upload(dut, dc, a, sizeof a), 0);
  ck_assert_int_eq(td_backend_download(dut, c, dc, sizeof c), 0);
  ck_assert(c[3] == 4.0f);
  ck_assert_int_eq(td_backend_error(dut, why, sizeof why), 0);
  td_backend_gemm(dut, false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, dc, 2);
  ck_assert_int_eq(td_backend_error(dut, why, sizeof why), TD_EDEVICE);
  ck_assert_msg(strstr(why, "gemm") != NULL, "%s", why);
  td_backend_free(dut, dc);

  td_backend_t *other = NULL;
  ck_assert_int_eq(td__backend_open_cpu_as_device(&other, 1, why, sizeof why), 0);
  ck_assert_int_ne(td_backend_upload(other, c, a, sizeof a), 0); /* device side is the host's */
  ck_assert_int_eq(td_backend_error(other, why, sizeof why), TD_EDEVICE);
  ck_assert_msg(strstr(why, "upload") != NULL, "%s", why);
  td_backend_close(&other);
  /* pinned host memory is not device memory: usable as a transfer's host side */
  ck_assert_int_eq(td__backend_open_cpu_as_device(&other, 1, why, sizeof why), 0);
  float *pinned = td_backend_host_alloc(other, sizeof a), *dev = td_backend_alloc(other, sizeof a);
  ck_assert(pinned != NULL && dev != NULL);
  memcpy(pinned, a, sizeof a);
  ck_assert_int_eq(td_backend_upload_async(other, dev, pinned, sizeof a), 0);
  td_backend_synchronize(other);
  ck_assert_int_eq(td_backend_download_async(other, c, dev, sizeof c), 0);
  td_backend_synchronize(other);
  ck_assert(c[2] == 3.0f);
  ck_assert_int_eq(td_backend_error(other, why, sizeof why), 0);
  td_backend_host_free(other, pinned);
  td_backend_free(other, dev);
  td_backend_close(&other);
}
END_TEST
#endif

int main(void) {
#ifdef TD_TEST_CUDA
  char why[512] = "";
  td_backend_t *probe = NULL;
  if (td_backend_open(&probe, "cuda", 1, why, sizeof why) != 0) {
    printf("skip: whole-model CUDA parity needs a GPU: %s\n", why);
    return 77;
  }
  td_backend_close(&probe);
#endif
  Suite *s = suite_create("model_device");
  TCase *tc = tcase_create("device");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, test_training_matches_cpu, 0, (int)(sizeof cases / sizeof cases[0]));
#ifndef TD_TEST_CUDA
  tcase_add_test(tc, test_pretend_device_catches_host_pointers);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
