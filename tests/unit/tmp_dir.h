/* tmp_dir.h: a scratch folder per test case for the unit tests that write
 * files (test_images, test_npy): made by the checked fixture make_tmp_dir
 * under $TMPDIR (or /tmp), removed with all it holds by remove_tmp_dir, and
 * tmp_path(NAME) for a path inside it (eight rotating buffers, so a call may
 * use a few at once). Included by one test file each. */
#ifndef TD_TEST_TMP_DIR_H
#define TD_TEST_TMP_DIR_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static char tmp_dir[256];

static void make_tmp_dir(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "%s/td-test-XXXXXX",
           getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_tmp_dir(void) { nftw(tmp_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

static const char *tmp_path(const char *name) {
  static char slots[8][600];
  static int next;
  char *p = slots[next++ % 8];
  snprintf(p, sizeof slots[0], "%s/%s", tmp_dir, name);
  return p;
}

#endif
