/* error.h: the one table of traind error codes.
 *
 * Every fallible function in traind returns 0 on success or one of the negative
 * TD_E* codes below. The table is an X-macro so the enum, td_strerror() and
 * td_err_name() can never drift apart (the libuv uv-errno.h pattern). Parsers of
 * user input additionally fill a caller-supplied message buffer ("why") because a
 * bare "bad config" helps nobody. */
#ifndef TD_ERROR_H
#define TD_ERROR_H

#include <stddef.h>

#define TD_ERRNO_MAP(X)                                              \
  X(EINVAL, -1, "invalid argument")                                  \
  X(ENOMEM, -2, "out of memory")                                     \
  X(EIO, -3, "input/output error")                                   \
  X(ENOENT, -4, "no such file or directory")                         \
  X(ECORRUPT, -5, "corrupt or truncated data")                       \
  X(ECONFIG, -6, "bad configuration value")                          \
  X(ERANGE, -7, "value out of range")                                \
  X(ESHAPE, -8, "shape mismatch")                                    \
  X(ENUMERIC, -9, "non-finite value (NaN or Inf)")                   \
  X(EDEVICE, -10, "compute device unavailable")                      \
  X(EPROTO, -11, "protocol error")                                   \
  X(ENOTSUP, -12, "operation not supported")

typedef enum {
  TD_OK = 0,
#define TD__ERR_ENUM(name, code, msg) TD_##name = (code),
  TD_ERRNO_MAP(TD__ERR_ENUM)
#undef TD__ERR_ENUM
} td_err_t;

/* Human-readable description of an error code; never NULL. */
const char *td_strerror(int err);
/* Symbolic name ("TD_ECORRUPT") of an error code; never NULL. */
const char *td_err_name(int err);

/* printf into a "why" buffer if it is non-NULL; returns err so callers can
 * `return td_why(why, len, TD_ECONFIG, "...")`. */
int td_why(char *why, size_t why_len, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
