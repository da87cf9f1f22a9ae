/* progress.h: a progress bar with ETA for long loops on a terminal.
 *
 * On a terminal the bar is one line redrawn in place ("\r", erase to end of
 * line), at most ten times a second; permanent lines printed through
 * td_progress_line() appear above it. Off a terminal (a pipe, a log file) the
 * bar is never drawn and td_progress_line() is a plain fprintf, so logs keep
 * one line per event. Used by `traind --standalone`; one thread per bar. */
#ifndef TD_PROGRESS_H
#define TD_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct td_progress td_progress_t;

/* A bar over `total` units ("steps") written to `out` (borrowed); the bar is
 * drawn only when `bar` is true (callers pass isatty(fileno(out))). Caller
 * owns *self; TD_ENOMEM. */
int td_progress_open(td_progress_t **self, FILE *out, uint64_t total, const char *unit, bool bar);
/* `done` of total units are done; `status` (may be NULL) follows the ETA. */
void td_progress_update(td_progress_t *p, uint64_t done, const char *status);
/* A permanent line (a trailing newline is added): the bar is erased, the line
 * printed, the bar redrawn. */
void td_progress_line(td_progress_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Erase the bar and free. NULL-safe. */
void td_progress_close(td_progress_t **self);
/* "1:02:03" or "4:05" for a duration in seconds; "?" when unknown. */
void td_progress_format_eta(char *buf, size_t len, double seconds);

#endif
