/* log.c: the stderr logger behind log.h. Lines are formatted into a local
 * buffer and written with a single fputs, so concurrent threads never
 * interleave inside a line. */
#include "daemon/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static td_log_level_t log_level = TD_LOG_INFO;
static char log_tag[48] = "traind";
static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int td_log_parse_level(const char *name) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(name, names[i]) == 0)
      return i;
  return -1;
}

void td_log_set_level(td_log_level_t level) { log_level = level; }

void td_log_set_tag(const char *tag) { snprintf(log_tag, sizeof log_tag, "%s", tag); }

int td_log_enabled(td_log_level_t level) { return level <= log_level; }

void td_log(td_log_level_t level, const char *fmt, ...) {
  if (level > log_level)
    return;
  char line[1024];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %-5s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, log_tag, level_names[level]);
  if (n < 0 || (size_t)n >= sizeof line)
    n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len] = '\n';
  line[len + 1] = '\0';
  fputs(line, stderr);
}
