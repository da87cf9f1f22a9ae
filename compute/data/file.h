/* file.h: opening data files so that a read can never block the thread.
 *
 * Datasets are read on the compute thread, which must always see a stop. A
 * path that names a FIFO would block open() until a writer comes and read()
 * forever after; /dev/zero never ends; a directory is no data. So every data
 * file is opened with O_NONBLOCK | O_CLOEXEC, checked with fstat() to be a
 * regular file, and its size bounded before anything is allocated from it. */
#ifndef TD_FILE_H
#define TD_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Open path read-only without blocking and require a regular file of at most
 * max_bytes. On success *fd_out is the descriptor (caller closes it) and
 * *bytes its size. TD_ENOENT (missing), TD_EIO (not a regular file: why says
 * what it is; other open errors), TD_ECORRUPT (larger than max_bytes); why
 * holds one line naming the path. */
int td_file_open_regular(int *fd_out, const char *path, uint64_t max_bytes, uint64_t *bytes,
                         char *why, size_t why_len);

/* Read a whole regular file of at most max_bytes into a new buffer (one
 * allocation of its fstat size, plus one byte so an empty file still gets a
 * buffer). Errors as td_file_open_regular, plus TD_EIO on a read error and
 * TD_ENOMEM. Caller frees *data. */
int td_file_read_all(const char *path, size_t max_bytes, uint8_t **data, size_t *len, char *why,
                     size_t why_len);

/* td_file_read_all, refusing (TD_EIO) a path whose last component is a
 * symbolic link: for files found by listing a folder (images:DIR), where a
 * link swapped in after the listing must not lead out of the data root. */
int td_file_read_all_nofollow(const char *path, size_t max_bytes, uint8_t **data, size_t *len,
                              char *why, size_t why_len);

#endif
