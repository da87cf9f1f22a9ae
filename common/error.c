/* error.c: strings for the TD_E* table in error.h, and the td_why() helper that
 * every parser uses to return a code together with a one-line explanation. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *td_strerror(int err) {
  switch (err) {
  case TD_OK: return "success";
#define TD__ERR_STR(name, code, msg) case TD_##name: return msg;
    TD_ERRNO_MAP(TD__ERR_STR)
#undef TD__ERR_STR
  default: return "unknown error";
  }
}

const char *td_err_name(int err) {
  switch (err) {
  case TD_OK: return "TD_OK";
#define TD__ERR_NAME(name, code, msg) case TD_##name: return "TD_" #name;
    TD_ERRNO_MAP(TD__ERR_NAME)
#undef TD__ERR_NAME
  default: return "TD_EUNKNOWN";
  }
}

int td_why(char *why, size_t why_len, int err, const char *fmt, ...) {
  if (why != NULL && why_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return err;
}
