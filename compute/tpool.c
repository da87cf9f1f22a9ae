/* tpool.c: the persistent thread pool behind the CPU backend's parallel loops.
 *
 * Workers are started once at open and wait for a job by watching a
 * generation counter: first spinning briefly (a training step issues a few
 * hundred jobs back to back, and waking a sleeping thread costs more than
 * many of them take), then sleeping on a condition variable so an idle
 * daemon burns no CPU. The submitter runs chunk 0 itself, then waits for the
 * others the same way. The sleep/wake hand-off is the usual one: a sleeper
 * announces itself under the mutex before its last look at the counter, and
 * the other side, having published its change with a sequentially consistent
 * store, takes the mutex to signal only when it sees a sleeper. Jobs run on
 * the worker threads and the submitting thread (the model's thread); nothing
 * here allocates after open. */
#include "compute/tpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define td__cpu_relax() _mm_pause()
#else
#define td__cpu_relax() ((void)0)
#endif

/* Spins before sleeping: roughly 20-50 us, longer than the serial gap
 * between two jobs of a step, far shorter than a scheduler quantum. */
#define TD__TPOOL_SPINS 4096
#define TD__TPOOL_MAX_THREADS 256

struct td_tpool {
  int threads;
  pthread_t *tids;
  int started; /* workers actually started (for close after a failed open) */
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  atomic_uint generation; /* bumped once per job */
  atomic_int remaining;   /* worker chunks of the current job not yet done */
  atomic_int sleepers;    /* workers waiting on work_cv */
  atomic_bool waiter;     /* the submitter waits on done_cv */
  atomic_bool stop;
  /* the current job, written before generation is bumped */
  td_tpool_fn fn;
  void *arg;
  size_t n, chunk;
  int parts;
};

typedef struct {
  td_tpool_t *pool;
  int index; /* chunk number this worker runs, 1..threads-1 */
} worker_arg_t;

static _Thread_local int in_job;

int td_tpool_in_job(void) { return in_job; }

static void run_part(td_tpool_t *p, int part) {
  size_t begin = (size_t)part * p->chunk;
  size_t end = begin + p->chunk < p->n ? begin + p->chunk : p->n;
  p->fn(p->arg, begin, end, part);
}

static void finish_part(td_tpool_t *p) {
  if (atomic_fetch_sub(&p->remaining, 1) == 1 && atomic_load(&p->waiter)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
  }
}

static void *worker_main(void *opaque) {
  worker_arg_t *wa = opaque;
  td_tpool_t *p = wa->pool;
  int index = wa->index;
  unsigned seen = 0;
  in_job = 1; /* a worker only ever runs job bodies */
  for (;;) {
    unsigned gen = atomic_load(&p->generation);
    for (int i = 0; gen == seen && i < TD__TPOOL_SPINS && !atomic_load(&p->stop); i++) {
      td__cpu_relax();
      gen = atomic_load(&p->generation);
    }
    if (gen == seen && !atomic_load(&p->stop)) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->work_cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop))
      return NULL;
    seen = gen;
    if (index < p->parts)
      run_part(p, index);
    finish_part(p);
  }
}

int td_tpool_open(td_tpool_t **out, int threads) {
  if (out == NULL || threads < 1 || threads > TD__TPOOL_MAX_THREADS)
    return TD_EINVAL;
  *out = NULL;
  td_tpool_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return TD_ENOMEM;
  p->threads = threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  if (threads > 1) {
    /* the worker arguments live right after the thread ids */
    p->tids = calloc((size_t)threads, sizeof(pthread_t) + sizeof(worker_arg_t));
    if (p->tids == NULL) {
      td_tpool_close(&p);
      return TD_ENOMEM;
    }
    worker_arg_t *args = (worker_arg_t *)(p->tids + threads);
    for (int i = 1; i < threads; i++) {
      args[i] = (worker_arg_t){.pool = p, .index = i};
      if (pthread_create(&p->tids[i], NULL, worker_main, &args[i]) != 0) {
        td_tpool_close(&p);
        return TD_ENOMEM;
      }
      p->started = i;
    }
  }
  *out = p;
  return 0;
}

void td_tpool_close(td_tpool_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_tpool_t *p = *self_p;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i <= p->started; i++)
    pthread_join(p->tids[i], NULL);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  pthread_mutex_destroy(&p->mu);
  free(p->tids);
  free(p);
  *self_p = NULL;
}

int td_tpool_threads(const td_tpool_t *pool) { return pool != NULL ? pool->threads : 1; }

void td_tpool_for(td_tpool_t *p, size_t n, size_t grain, td_tpool_fn fn, void *arg) {
  if (n == 0)
    return;
  if (grain == 0)
    grain = 1;
  size_t chunk = (n + (size_t)td_tpool_threads(p) - 1) / (size_t)td_tpool_threads(p);
  chunk = (chunk + grain - 1) / grain * grain;
  int parts = (int)((n + chunk - 1) / chunk);
  if (p == NULL || parts <= 1 || in_job) {
    fn(arg, 0, n, 0);
    return;
  }
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  p->chunk = chunk;
  p->parts = parts;
  /* every worker sees the job; those past `parts` only acknowledge it */
  atomic_store(&p->remaining, p->threads - 1);
  atomic_fetch_add(&p->generation, 1);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
  }
  in_job = 1;
  run_part(p, 0);
  in_job = 0;
  for (int i = 0; atomic_load(&p->remaining) > 0 && i < TD__TPOOL_SPINS; i++)
    td__cpu_relax();
  if (atomic_load(&p->remaining) > 0) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->waiter, true);
    while (atomic_load(&p->remaining) > 0)
      pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->waiter, false);
    pthread_mutex_unlock(&p->mu);
  }
}
