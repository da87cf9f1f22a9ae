/* log.h: leveled logging to stderr for traind.
 *
 * One line per message: "2026-11-22T17:00:00.123Z traind[node] LEVEL message".
 * The level is process-wide and set once at start-up (--log-level); the
 * functions are safe to call from any thread (each line is one fprintf). */
#ifndef TD_LOG_H
#define TD_LOG_H

typedef enum {
  TD_LOG_ERROR = 0,
  TD_LOG_WARN,
  TD_LOG_INFO,
  TD_LOG_DEBUG,
} td_log_level_t;

/* Parse "error" | "warn" | "info" | "debug"; -1 when unknown. */
int td_log_parse_level(const char *name);
void td_log_set_level(td_log_level_t level);
/* A short tag printed on every line (e.g. the node's port); copied. */
void td_log_set_tag(const char *tag);
int td_log_enabled(td_log_level_t level);
void td_log(td_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define td_log_error(...) td_log(TD_LOG_ERROR, __VA_ARGS__)
#define td_log_warn(...) td_log(TD_LOG_WARN, __VA_ARGS__)
#define td_log_info(...) td_log(TD_LOG_INFO, __VA_ARGS__)
#define td_log_debug(...) \
  do { if (td_log_enabled(TD_LOG_DEBUG)) td_log(TD_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
