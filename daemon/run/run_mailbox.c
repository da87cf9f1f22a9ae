/* run_mailbox.c: the hand-off from a run's compute thread to the loop thread.
 *
 * The event mailbox is a bounded ring under run->mu plus uv_async_send:
 * wake-ups coalesce and the loop drains the ring (td_run_next_event). The
 * compute thread's files (run_compute.c, run_apply.c, run_overlap.c,
 * run_recon.c) post here and read the run's step plan; run.c, which starts
 * that thread, sits above them, so nothing here calls back up into it.
 * Threads: td__run_post, td__run_fail and td__run_post_copy on the compute
 * thread; td_run_next_event on the loop thread; the rest on any thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/run/run_internal.h"

unsigned td_run_steps_of(const td_run_t *run, uint64_t round) {
  if (run->steps_of == NULL || round == 0 || round > run->rounds)
    return run->spec.local_steps;
  return run->steps_of[round - 1];
}

bool td__run_post(td_run_t *run, td_run_event_t *ev) {
  pthread_mutex_lock(&run->mu);
  while (!run->closing && run->mailbox_count == TD_RUN_MAILBOX)
    pthread_cond_wait(&run->cv, &run->mu); /* td_run_next_event() makes room */
  bool ok = run->mailbox_count < TD_RUN_MAILBOX;
  if (ok) {
    run->mailbox[(run->mailbox_head + run->mailbox_count) % TD_RUN_MAILBOX] = *ev;
    run->mailbox_count++;
  }
  pthread_mutex_unlock(&run->mu);
  if (!ok) {
    free(ev->blob);
    ev->blob = NULL;
    return false;
  }
  uv_async_send(&run->async);
  return true;
}

td__run_flow_t td__run_fail(td_run_t *run, const char *why) {
  td_run_event_t ev = {.kind = TD_RUN_FAILED};
  snprintf(ev.message, sizeof ev.message, "%s", why);
  td__run_post(run, &ev); /* when closing, nobody is left to tell */
  return TD__RUN_FAILED;
}

td__run_flow_t td__run_post_copy(td_run_t *run, td_run_event_t *ev, const char *what,
                                 const float *src, size_t n, const float *src2, size_t n2) {
  size_t total = n + (src2 != NULL ? n2 : 0);
  if ((ev->blob = malloc(total * sizeof(float))) == NULL) {
    char why[sizeof ev->message];
    snprintf(why, sizeof why, "out of memory for %s of round %" PRIu64 " (%zu floats)", what,
             ev->round, total);
    return td__run_fail(run, why);
  }
  memcpy(ev->blob, src, n * sizeof(float));
  if (src2 != NULL)
    memcpy(ev->blob + n, src2, n2 * sizeof(float));
  return td__run_post(run, ev) ? TD__RUN_GO_ON : TD__RUN_STOPPED;
}

bool td_run_next_event(td_run_t *run, td_run_event_t *ev) {
  pthread_mutex_lock(&run->mu);
  bool any = run->mailbox_count > 0;
  if (any) {
    *ev = run->mailbox[run->mailbox_head];
    run->mailbox_head = (run->mailbox_head + 1) % TD_RUN_MAILBOX;
    run->mailbox_count--;
    pthread_cond_broadcast(&run->cv); /* a compute thread may wait for room */
  }
  pthread_mutex_unlock(&run->mu);
  return any;
}

bool td__run_stopping(td_run_t *run) {
  pthread_mutex_lock(&run->mu);
  bool s = run->stop;
  pthread_mutex_unlock(&run->mu);
  return s;
}

