/* test_descriptors.c: the descriptor budget (daemon/net/descriptors.c).
 *
 * Asserted: the shares of a limit never add up to more than its cap, and
 * the cap leaves headroom under the limit; one address and the handshakes in
 * progress get a bounded part of the inbound share; the unit's 65,536 gives
 * tens of thousands of inbound connections, 4,096 thousands; the shell's
 * default 1,024 is too low for a full cluster of TD_MAX_NODES; a
 * limit too low to share is flagged `tight` and still serves a full cluster;
 * init raises the soft limit to the hard one and reports what it planned;
 * the open count is this process's descriptors. */
#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/net/net.h"

static void check_shares(uint64_t limit) {
  td__descriptors_t d;
  td__descriptors_plan(&d, limit);
  ck_assert_uint_eq(d.limit, limit);
  ck_assert_uint_lt(d.cap, d.limit);
  if (!d.tight)
    ck_assert_uint_le(d.reserve + d.control_clients + d.inbound, d.cap);
  ck_assert_uint_le(d.per_address, d.inbound);
  ck_assert_uint_le(d.pending, d.inbound);
  ck_assert_uint_gt(d.per_address, 0);
  ck_assert_uint_gt(d.pending, 0);
}

START_TEST(shares_fit_under_the_cap) {
  static const uint64_t limits[] = {64, 256, 512, 1024, 4096, 20000, 65536, 1u << 20};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
    check_shares(limits[i]);
}
END_TEST

START_TEST(the_units_limit_and_the_default) {
  td__descriptors_t unit, dflt, small, low;
  td__descriptors_plan(&unit, 65536);
  td__descriptors_plan(&dflt, 1024);
  td__descriptors_plan(&small, 4096);
  td__descriptors_plan(&low, 256);
  ck_assert(!unit.tight);
  ck_assert_uint_gt(unit.inbound, 50000);
  /* TD_MAX_NODES members need four descriptors each for their outgoing links
   * alone: the shell's default 1,024 cannot hold a full cluster of 256 and is
   * flagged (traind raises the soft limit to the hard one first); 4,096 can */
  ck_assert(dflt.tight);
  ck_assert_uint_ge(dflt.inbound, 2 * TD_MEMBERS_MAX);
  ck_assert(!small.tight);
  ck_assert_uint_gt(small.inbound, 2000);
  ck_assert_uint_lt(small.inbound, 4096);
  /* one address cannot take the inbound share alone */
  ck_assert_uint_lt(small.per_address, small.inbound / 2);
  ck_assert(low.tight);
  ck_assert_uint_ge(low.inbound, 2 * TD_MEMBERS_MAX);
}
END_TEST

START_TEST(init_raises_the_soft_limit) {
  struct rlimit rl;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max < 2048)
    return; /* nothing to show here */
  rl.rlim_cur = 1024;
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  td__descriptors_t d;
  char note[256];
  td__descriptors_init(&d, note, sizeof note);
  ck_assert_str_eq(note, "");
  ck_assert_uint_eq(d.limit, rl.rlim_max);
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  ck_assert_uint_eq(rl.rlim_cur, rl.rlim_max);
}
END_TEST

START_TEST(open_counts_this_process) {
  long before = td__descriptors_open();
  if (before < 0)
    return; /* no /proc */
  int fd = open("/dev/null", O_RDONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(td__descriptors_open(), before + 1);
  close(fd);
  ck_assert_int_eq(td__descriptors_open(), before);
}
END_TEST

int main(void) {
  Suite *s = suite_create("descriptors");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, shares_fit_under_the_cap);
  tcase_add_test(tc, the_units_limit_and_the_default);
  tcase_add_test(tc, init_raises_the_soft_limit);
  tcase_add_test(tc, open_counts_this_process);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
