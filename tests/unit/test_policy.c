/* test_policy.c: this node's limits over run specs (daemon/policy.c), the
 * memory estimate above all. A run with checkpoints holds copies of the model
 * on their way to the ledger (the compute thread's copy, held in the ledger's
 * queue until written, and SQLite's record of it; the next copy waits for
 * that write): the estimate counts them, so a limit that takes the run
 * without checkpoints refuses it with checkpoint_every = 1, by exactly those
 * two copies. A dataset path that does not exist and
 * one outside the data root are refused with one and the same reason. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/model.h"
#include "daemon/internal.h"

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
  char root[] = "/tmp/td-policy-XXXXXX";
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
  tcase_add_test(tc, checkpoints_count_in_the_memory_estimate);
  tcase_add_test(tc, outside_the_root_and_missing_read_the_same);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
