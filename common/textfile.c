/* textfile.c: a small text file read whole and checked (textfile.h). */
#include "common/textfile.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

int td_textfile_read(const char *path, size_t max_bytes, const char *what, char **text,
                     char *why, size_t why_len) {
  *text = NULL;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return td_why(why, why_len, errno == ENOENT ? TD_ENOENT : TD_EIO, "cannot open %s: %s",
                  path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return td_why(why, why_len, TD_ECONFIG, "%s is not a file: give %s (key = value "
                  "lines), or no file and --set key=value", path, what);
  }
  char *buf = malloc(max_bytes + 1);
  size_t len = buf != NULL ? fread(buf, 1, max_bytes + 1, f) : 0;
  bool bad = buf != NULL && ferror(f);
  fclose(f);
  if (buf == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  int rc = 0;
  if (bad)
    rc = td_why(why, why_len, TD_EIO, "cannot read %s", path);
  else if (len > max_bytes)
    rc = td_why(why, why_len, TD_ECONFIG, "%s is over %zu KiB: too large for %s", path,
                max_bytes >> 10, what);
  const char *nul = rc == 0 ? memchr(buf, '\0', len) : NULL;
  if (nul != NULL) {
    unsigned line = 1;
    for (const char *c = buf; c < nul; c++)
      line += *c == '\n';
    rc = td_why(why, why_len, TD_ECONFIG, "%s:%u: a NUL byte: %s is text (is it the right "
                "file?)", path, line, what);
  }
  if (rc != 0) {
    free(buf);
    return rc;
  }
  buf[len] = '\0';
  *text = buf;
  return 0;
}
