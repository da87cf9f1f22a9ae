/* file.c: non-blocking, regular-files-only opening of data files (file.h).
 * Called on the compute thread (run loading) and the main thread (standalone). */
#include "compute/data/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

static const char *kind_of(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

static int open_regular(int *fd_out, const char *path, int extra_flags, uint64_t max_bytes,
                        uint64_t *bytes, char *why, size_t why_len) {
  *fd_out = -1;
  *bytes = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | extra_flags);
  if (fd < 0 && errno == ELOOP && (extra_flags & O_NOFOLLOW))
    return td_why(why, why_len, TD_EIO, "cannot read %s: it is a symbolic link", path);
  if (fd < 0)
    return td_why(why, why_len, errno == ENOENT || errno == ENOTDIR ? TD_ENOENT : TD_EIO,
                  "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return td_why(why, why_len, TD_EIO, "cannot stat %s: %s", path, strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return td_why(why, why_len, TD_EIO, "cannot read %s: it is %s, not a regular file", path,
                  kind_of(st.st_mode));
  }
  if (st.st_size < 0 || (uint64_t)st.st_size > max_bytes) {
    close(fd);
    return td_why(why, why_len, TD_ECORRUPT, "%s: %lld bytes, more than the limit of %llu",
                  path, (long long)st.st_size, (unsigned long long)max_bytes);
  }
  *fd_out = fd;
  *bytes = (uint64_t)st.st_size;
  return 0;
}

int td_file_open_regular(int *fd_out, const char *path, uint64_t max_bytes, uint64_t *bytes,
                         char *why, size_t why_len) {
  return open_regular(fd_out, path, 0, max_bytes, bytes, why, why_len);
}

static int read_all(const char *path, int extra_flags, size_t max_bytes, uint8_t **data,
                    size_t *len, char *why, size_t why_len) {
  *data = NULL;
  *len = 0;
  int fd;
  uint64_t size;
  int rc = open_regular(&fd, path, extra_flags, max_bytes, &size, why, why_len);
  if (rc != 0)
    return rc;
  uint8_t *buf = malloc((size_t)size + 1);
  if (buf == NULL) {
    close(fd);
    return td_why(why, why_len, TD_ENOMEM, "out of memory for the %llu bytes of %s",
                  (unsigned long long)size, path);
  }
  /* Read what fstat promised and no more: a file that grows meanwhile cannot
   * overrun the buffer, one that shrinks ends early. */
  size_t got = 0;
  while (got < size) {
    ssize_t k = read(fd, buf + got, (size_t)size - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      int err = errno;
      free(buf);
      close(fd);
      return td_why(why, why_len, TD_EIO, "%s: read error: %s", path, strerror(err));
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  *data = buf;
  *len = got;
  return 0;
}

int td_file_read_all(const char *path, size_t max_bytes, uint8_t **data, size_t *len, char *why,
                     size_t why_len) {
  return read_all(path, 0, max_bytes, data, len, why, why_len);
}

int td_file_read_all_nofollow(const char *path, size_t max_bytes, uint8_t **data, size_t *len,
                              char *why, size_t why_len) {
  return read_all(path, O_NOFOLLOW, max_bytes, data, len, why, why_len);
}
