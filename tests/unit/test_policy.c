/* test_policy.c: this node's refusals of a run spec (daemon/session/policy.c),
 * checked before anything of a run is allocated: each limit refuses with
 * TD_ERANGE and a reason that names the key, the value and the limit; a
 * dataset that names files is refused without a data root, outside it, or
 * when it is not a regular file (a folder for images:), and accepted under it with its path
 * rewritten to the resolved one; a named dataset needs no root; a path that
 * does not exist and one outside the root read the same. The memory estimate
 * counts the copies of the model a checkpoint holds on its way to the ledger
 * (the compute thread's copy, held in the ledger's queue until written, and
 * SQLite's record of it; the next copy waits for that write). */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/model.h"
#include "daemon/session/shared.h"

static char root[64];

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/td_policy.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
  char path[128];
  snprintf(path, sizeof path, "%s/train.csv", root);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("1,0\n", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/sub", root);
  ck_assert_int_eq(mkdir(path, 0700), 0);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  ck_assert_int_eq(system(cmd), 0);
}

static td__policy_t policy(const td__policy_opts_t *o) {
  td__policy_t p;
  char why[256] = "";
  ck_assert_msg(td__policy_init(&p, o, why, sizeof why) == 0, "%s", why);
  return p;
}

static td_runspec_t small_spec(void) {
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  snprintf(spec.model, sizeof spec.model, "mlp:784-32-10");
  snprintf(spec.dataset, sizeof spec.dataset, "fashion-mnist");
  spec.batch = 64;
  spec.rounds = 10;
  spec.threads = 1;
  return spec;
}

START_TEST(limits_refuse_with_the_key_the_value_and_the_limit) {
  td__policy_t p = policy(&(td__policy_opts_t){.max_model_mb = 64, .max_batch = 100,
                                               .max_rounds = 50});
  char why[256] = "";
  td_runspec_t spec = small_spec();
  ck_assert_msg(td__policy_check(&p, &spec, 3, why, sizeof why) == 0, "%s", why);

  spec.batch = 128;
  ck_assert_int_eq(td__policy_check(&p, &spec, 3, why, sizeof why), TD_ERANGE);
  ck_assert_str_eq(why, "batch 128 is over this node's limit 100 (--max-batch)");

  spec = small_spec();
  spec.rounds = 51;
  ck_assert_int_eq(td__policy_check(&p, &spec, 3, why, sizeof why), TD_ERANGE);
  ck_assert_str_eq(why, "rounds 51 is over this node's limit 50 (--max-rounds)");

  spec = small_spec();
  spec.threads = p.max_threads + 1;
  ck_assert_int_eq(td__policy_check(&p, &spec, 3, why, sizeof why), TD_ERANGE);
  ck_assert_ptr_nonnull(strstr(why, "cores"));

  spec = small_spec();
  snprintf(spec.model, sizeof spec.model, "mlp:784-4096-4096-10"); /* ~20 M parameters */
  ck_assert_int_eq(td__policy_check(&p, &spec, 3, why, sizeof why), TD_ERANGE);
  ck_assert_ptr_nonnull(strstr(why, "over this node's limit of 64 MiB (--max-model-mb)"));
}
END_TEST

START_TEST(file_datasets_need_a_data_root) {
  td__policy_t p = policy(&(td__policy_opts_t){.max_model_mb = 64});
  char why[256] = "";
  td_runspec_t spec = small_spec();
  snprintf(spec.dataset, sizeof spec.dataset, "csv:%s/train.csv", root);
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "set no --data-root"));
  spec = small_spec(); /* a named dataset needs none */
  ck_assert_msg(td__policy_check(&p, &spec, 2, why, sizeof why) == 0, "%s", why);
}
END_TEST

START_TEST(file_datasets_stay_under_the_root) {
  char sub[96];
  snprintf(sub, sizeof sub, "%s/sub", root);
  td__policy_t p = policy(&(td__policy_opts_t){.max_model_mb = 64, .data_root = sub});
  char why[256] = "";
  td_runspec_t spec = small_spec();
  snprintf(spec.dataset, sizeof spec.dataset, "csv:../train.csv"); /* climbs out */
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a file under the data root"));

  p = policy(&(td__policy_opts_t){.max_model_mb = 64, .data_root = root});
  snprintf(spec.dataset, sizeof spec.dataset, "csv:sub");
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a regular file"));
  snprintf(spec.dataset, sizeof spec.dataset, "csv:missing.csv");
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);

  snprintf(spec.dataset, sizeof spec.dataset, "csv:train.csv");
  ck_assert_msg(td__policy_check(&p, &spec, 2, why, sizeof why) == 0, "%s", why);
  /* the loader opens what was checked: the resolved path under the root */
  ck_assert_str_eq(spec.dataset + strlen(spec.dataset) - strlen("/train.csv"), "/train.csv");
  ck_assert_int_eq(strncmp(spec.dataset, "csv:", 4), 0);
  ck_assert_int_eq(strncmp(spec.dataset + 4, p.data_root, strlen(p.data_root)), 0);
  ck_assert_int_eq(spec.dataset[4 + strlen(p.data_root)], '/');
}
END_TEST

START_TEST(an_images_dataset_names_folders_under_the_root) {
  td__policy_t p = policy(&(td__policy_opts_t){.max_model_mb = 64, .data_root = root});
  char why[256] = "";
  td_runspec_t spec = small_spec();
  snprintf(spec.dataset, sizeof spec.dataset, "images:sub,sub");
  ck_assert_msg(td__policy_check(&p, &spec, 2, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(strncmp(spec.dataset, "images:", 7), 0);
  ck_assert_int_eq(strncmp(spec.dataset + 7, p.data_root, strlen(p.data_root)), 0);
  ck_assert_ptr_nonnull(strstr(spec.dataset, "/sub,"));
  snprintf(spec.dataset, sizeof spec.dataset, "images:train.csv"); /* a file, not a folder */
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a folder"));
  snprintf(spec.dataset, sizeof spec.dataset, "images:..");
  ck_assert_int_eq(td__policy_check(&p, &spec, 2, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a file under the data root"));
}
END_TEST

START_TEST(a_data_root_must_be_a_directory) {
  td__policy_t p;
  char why[256] = "", file[96];
  snprintf(file, sizeof file, "%s/train.csv", root);
  ck_assert_int_eq(td__policy_init(&p, &(td__policy_opts_t){.data_root = file}, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a directory"));
}
END_TEST

#define MODEL "mlp:784-2048-2048-10"

/* The MiB the policy says the run needs (a limit of 1 MiB refuses anything). */
static uint64_t needs_mib(unsigned checkpoint_every, size_t members) {
  td__policy_t p;
  td__policy_opts_t o = {.max_model_mb = 1};
  char why[512] = "";
  ck_assert_int_eq(td__policy_init(&p, &o, why, sizeof why), 0);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  ck_assert_int_eq(td_runspec_set_arg(&spec, "model = " MODEL, why, sizeof why), 0);
  spec.checkpoint_every = checkpoint_every;
  ck_assert_int_eq(td__policy_check(&p, &spec, members, why, sizeof why), TD_ERANGE);
  const char *at = strstr(why, "needs about ");
  ck_assert_msg(at != NULL, "%s", why);
  return strtoull(at + strlen("needs about "), NULL, 10);
}

static int check_at(unsigned limit_mb, unsigned checkpoint_every) {
  td__policy_t p;
  td__policy_opts_t o = {.max_model_mb = limit_mb};
  char why[512] = "";
  ck_assert_int_eq(td__policy_init(&p, &o, why, sizeof why), 0);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  ck_assert_int_eq(td_runspec_set_arg(&spec, "model = " MODEL, why, sizeof why), 0);
  spec.checkpoint_every = checkpoint_every;
  return td__policy_check(&p, &spec, 3, why, sizeof why);
}

START_TEST(checkpoints_count_in_the_memory_estimate) {
  uint64_t params = 0, bytes = 0;
  char why[256];
  ck_assert_int_eq(td_model_estimate(MODEL, 64, &params, &bytes, why, sizeof why), 0);
  uint64_t plain = needs_mib(0, 3), with = needs_mib(1, 3), every10 = needs_mib(10, 3);
  double copy_mib = (double)params * sizeof(float) / 1048576.0;
  double extra = (double)(with - plain);
  ck_assert_msg(extra >= 2 * copy_mib - 1 && extra <= 2 * copy_mib + 1,
                "checkpoints add %.0f MiB, 2 copies of %.1f MiB expected", extra, copy_mib);
  ck_assert_uint_eq(every10, with); /* however rare, a checkpoint passes through the same copies */
  /* a limit between the two: the run fits without checkpoints, not with */
  unsigned between = (unsigned)((plain + with) / 2);
  ck_assert_int_eq(check_at(between, 0), 0);
  ck_assert_int_eq(check_at(between, 1), TD_ERANGE);
}
END_TEST

START_TEST(outside_the_root_and_missing_read_the_same) {
  char root[] = "/tmp/td-policy-XXXXXX"; /* its own, outside the fixture */
  ck_assert_ptr_nonnull(mkdtemp(root));
  td__policy_t p;
  td__policy_opts_t o = {.max_model_mb = 4096, .data_root = root};
  char why[512] = "", exists[512] = "", missing[512] = "";
  ck_assert_int_eq(td__policy_init(&p, &o, why, sizeof why), 0);
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  ck_assert_int_eq(td_runspec_set_arg(&spec, "model = mlp:784-8-10", why, sizeof why), 0);
  snprintf(spec.dataset, sizeof spec.dataset, "csv:/etc/passwd");
  ck_assert_int_eq(td__policy_check(&p, &spec, 1, exists, sizeof exists), TD_ECONFIG);
  snprintf(spec.dataset, sizeof spec.dataset, "csv:/etc/no-such-file-here");
  ck_assert_int_eq(td__policy_check(&p, &spec, 1, missing, sizeof missing), TD_ECONFIG);
  /* the same words after the quoted path, whether it exists or not */
  const char *a = strstr(exists, "' "), *b = strstr(missing, "' ");
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_str_eq(a, b);
  ck_assert_ptr_nonnull(strstr(a, "is not a file under the data root"));
  rmdir(root);
}
END_TEST

int main(void) {
  Suite *s = suite_create("policy");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, limits_refuse_with_the_key_the_value_and_the_limit);
  tcase_add_test(tc, file_datasets_need_a_data_root);
  tcase_add_test(tc, file_datasets_stay_under_the_root);
  tcase_add_test(tc, an_images_dataset_names_folders_under_the_root);
  tcase_add_test(tc, a_data_root_must_be_a_directory);
  suite_add_tcase(s, tc);
  TCase *memory = tcase_create("memory");
  tcase_add_test(memory, checkpoints_count_in_the_memory_estimate);
  tcase_add_test(memory, outside_the_root_and_missing_read_the_same);
  suite_add_tcase(s, memory);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
