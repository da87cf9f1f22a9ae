/* test_policy.c: this node's refusals of a run spec (daemon/session/policy.c),
 * checked before anything of a run is allocated: each limit refuses with
 * TD_ERANGE and a reason that names the key, the value and the limit; a
 * dataset that names files is refused without a data root, outside it, or
 * when it is not a regular file, and accepted under it with its path
 * rewritten to the resolved one; a named dataset needs no root. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
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
  ck_assert_ptr_nonnull(strstr(why, "is outside the data root"));

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

START_TEST(a_data_root_must_be_a_directory) {
  td__policy_t p;
  char why[256] = "", file[96];
  snprintf(file, sizeof file, "%s/train.csv", root);
  ck_assert_int_eq(td__policy_init(&p, &(td__policy_opts_t){.data_root = file}, why, sizeof why),
                   TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "is not a directory"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("policy");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, limits_refuse_with_the_key_the_value_and_the_limit);
  tcase_add_test(tc, file_datasets_need_a_data_root);
  tcase_add_test(tc, file_datasets_stay_under_the_root);
  tcase_add_test(tc, a_data_root_must_be_a_directory);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
