/* fault_io.h: fail SQLite's writes on demand, for the ledger's fault tests.
 *
 * SQLite's unix VFS calls the system through a table that a program may
 * override (sqlite3_vfs.xSetSystemCall): fault_io_install() puts wrappers
 * around write, pwrite and pwrite64 that fail with fault_io_errno while it is
 * not 0 (ENOSPC: SQLite reports SQLITE_FULL; EIO: SQLITE_IOERR) and call the
 * real ones otherwise. Reads are untouched. Included by one test file each. */
#ifndef TD_TEST_FAULT_IO_H
#define TD_TEST_FAULT_IO_H

#include <check.h>
#include <errno.h>
#include <sqlite3.h>
#include <sys/types.h>

static int fault_io_errno; /* 0: writes go through */
static sqlite3_syscall_ptr fault_io_real[3];

static ssize_t fault_io_write(int fd, const void *buf, size_t n) {
  if (fault_io_errno != 0) {
    errno = fault_io_errno;
    return -1;
  }
  return ((ssize_t(*)(int, const void *, size_t))fault_io_real[0])(fd, buf, n);
}

static ssize_t fault_io_pwrite(int fd, const void *buf, size_t n, off_t at) {
  if (fault_io_errno != 0) {
    errno = fault_io_errno;
    return -1;
  }
  return ((ssize_t(*)(int, const void *, size_t, off_t))fault_io_real[1])(fd, buf, n, at);
}

static ssize_t fault_io_pwrite64(int fd, const void *buf, size_t n, off_t at) {
  if (fault_io_errno != 0) {
    errno = fault_io_errno;
    return -1;
  }
  return ((ssize_t(*)(int, const void *, size_t, off_t))fault_io_real[2])(fd, buf, n, at);
}

/* Once per process (CK_FORK=no runs every test in one). */
static void fault_io_install(void) {
  static int installed_already;
  if (installed_already++)
    return;
  sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
  ck_assert_ptr_nonnull(vfs);
  ck_assert_ptr_nonnull(vfs->xSetSystemCall);
  static const char *const names[3] = {"write", "pwrite", "pwrite64"};
  const sqlite3_syscall_ptr wrappers[3] = {(sqlite3_syscall_ptr)fault_io_write,
                                           (sqlite3_syscall_ptr)fault_io_pwrite,
                                           (sqlite3_syscall_ptr)fault_io_pwrite64};
  int installed = 0;
  for (int i = 0; i < 3; i++) {
    fault_io_real[i] = vfs->xGetSystemCall(vfs, names[i]);
    if (fault_io_real[i] != NULL && vfs->xSetSystemCall(vfs, names[i], wrappers[i]) == SQLITE_OK)
      installed++;
  }
  ck_assert_int_gt(installed, 0);
}

#endif
