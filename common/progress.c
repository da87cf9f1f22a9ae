/* progress.c: the terminal progress bar of progress.h.
 *
 * ETA is the mean rate so far applied to what is left: simple, and steady
 * once a few percent are done, which is what a person glancing at it wants. */
#include "common/progress.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"

struct td_progress {
  FILE *out;
  uint64_t total, done;
  char unit[16];
  char status[160];
  bool bar, drawn;
  double started, last_draw;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int td_progress_open(td_progress_t **self, FILE *out, uint64_t total, const char *unit, bool bar) {
  td_progress_t *p = calloc(1, sizeof *p);
  *self = p;
  if (p == NULL)
    return TD_ENOMEM;
  p->out = out;
  p->total = total;
  p->bar = bar;
  snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
  p->started = now_s();
  p->last_draw = -1;
  return 0;
}

void td_progress_format_eta(char *buf, size_t len, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, len, "?");
    return;
  }
  unsigned long t = (unsigned long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, len, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, len, "%lu:%02lu", t / 60, t % 60);
}

static unsigned term_width(FILE *out) {
  struct winsize ws;
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
    return ws.ws_col;
  return 80;
}

static void draw(td_progress_t *p) {
  double el = now_s() - p->started;
  double frac = p->total ? (double)p->done / (double)p->total : 0;
  if (frac > 1)
    frac = 1;
  char eta[32], line[512];
  td_progress_format_eta(eta, sizeof eta,
                         p->done > 0 ? el / (double)p->done * (double)(p->total - p->done) : NAN);
  int cells = 30, full = (int)(frac * cells);
  char bar[64];
  for (int i = 0; i < cells; i++)
    bar[i] = i < full ? '#' : '.';
  bar[cells] = '\0';
  snprintf(line, sizeof line, "[%s] %3.0f%%  %llu/%llu %s  ETA %s  %s", bar, frac * 100,
           (unsigned long long)p->done, (unsigned long long)p->total, p->unit, eta, p->status);
  unsigned w = term_width(p->out);
  if (strlen(line) >= w) /* never wrap: a wrapped line cannot be redrawn in place */
    line[w - 1] = '\0';
  fprintf(p->out, "\r%s\033[K", line);
  fflush(p->out);
  p->drawn = true;
}

void td_progress_update(td_progress_t *p, uint64_t done, const char *status) {
  p->done = done;
  if (status != NULL)
    snprintf(p->status, sizeof p->status, "%s", status);
  if (!p->bar)
    return;
  double t = now_s();
  if (p->last_draw >= 0 && t - p->last_draw < 0.1 && done < p->total)
    return;
  p->last_draw = t;
  draw(p);
}

static void erase(td_progress_t *p) {
  if (p->drawn) {
    fputs("\r\033[K", p->out);
    p->drawn = false;
  }
}

void td_progress_line(td_progress_t *p, const char *fmt, ...) {
  erase(p);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->out, fmt, ap);
  va_end(ap);
  fputc('\n', p->out);
  if (p->bar && p->done > 0 && p->done < p->total)
    draw(p);
  fflush(p->out);
}

void td_progress_close(td_progress_t **self) {
  if (*self == NULL)
    return;
  erase(*self);
  fflush((*self)->out);
  free(*self);
  *self = NULL;
}
