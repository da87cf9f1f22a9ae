/* test_memtrim.c: memory freed between blocks still in use stays resident
 * until a trim, and td_memtrim_now / td_memtrim_tick give it back: 32 MB of
 * 64 kB blocks, each followed by a small block kept (so no free memory sits
 * at the heap's top, where free() itself would return it), are written and
 * freed; a tick within its period leaves the process's resident memory as
 * it was, a tick past it and td_memtrim_now each return most of the 32 MB.
 * Skipped (77) without glibc's allocator (other libcs, ASan). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/base/memtrim.h"

#define BLOCKS 512
#define BLOCK (64 << 10)
/* above tcache's and the fastbins' sizes: a freed one is merged with its
 * freed neighbours, so the next test's blocks alternate again */
#define KEPT 2048

static void *kept[BLOCKS];

/* resident memory of this process, bytes (proc(5) statm) */
static long rss_bytes(void) {
  long size = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fscanf(f, "%ld %ld", &size, &resident), 2);
  fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

/* 32 MB written and freed, each block between two still held */
static void leave_holes(void) {
  void *big[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    big[i] = malloc(BLOCK);
    kept[i] = malloc(KEPT);
    ck_assert_ptr_nonnull(big[i]);
    ck_assert_ptr_nonnull(kept[i]);
    memset(big[i], 0x5a, BLOCK);
  }
  for (int i = 0; i < BLOCKS; i++)
    free(big[i]);
}

static void free_kept(void) {
  for (int i = 0; i < BLOCKS; i++)
    free(kept[i]);
}

START_TEST(a_tick_trims_only_past_its_period) {
  td_memtrim_now();
  leave_holes();
  long holes = rss_bytes();
  td_memtrim_tick(3600); /* the last trim was just now */
  long after_early = rss_bytes();
  ck_assert_msg(holes - after_early < (8L << 20), "a tick within its period gave back %ld bytes",
                holes - after_early);
  td_memtrim_tick(0);
  long after = rss_bytes();
  ck_assert_msg(holes - after > (24L << 20), "a tick past its period gave back %ld of 32 MB",
                holes - after);
  free_kept();
}
END_TEST

START_TEST(now_trims_at_once) {
  leave_holes();
  long holes = rss_bytes();
  td_memtrim_now();
  long after = rss_bytes();
  ck_assert_msg(holes - after > (24L << 20), "td_memtrim_now gave back %ld of 32 MB",
                holes - after);
  free_kept();
}
END_TEST

int main(void) {
#if !defined(__GLIBC__) || defined(__SANITIZE_ADDRESS__)
  puts("test_memtrim: skipped: not glibc's allocator");
  return 77;
#endif
  Suite *s = suite_create("memtrim");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, a_tick_trims_only_past_its_period);
  tcase_add_test(tc, now_trims_at_once);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* one process: its memory is what is measured */
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
