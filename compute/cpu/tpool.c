/* tpool.c: the persistent thread pool behind the CPU backend's parallel loops.
 *
 * A job is `parts` static chunks. Whoever is running claims the next chunk
 * from one atomic word (generation | parts | next chunk), so the submitter,
 * after its own chunk, takes over the chunks of a worker that has not woken
 * up yet: on a machine shared with other work a descheduled worker delays a
 * job by nothing, instead of by a scheduler quantum. A chunk's work does not
 * depend on which thread runs it, so results do not either. Workers wait for
 * a new generation first spinning briefly (a training step issues a few
 * hundred jobs back to back, and waking a sleeping thread costs more than
 * many of them take), then sleeping on a condition variable so an idle
 * daemon burns no CPU; the submitter waits for the last chunks the same way.
 * The sleep/wake hand-off is the usual one: a sleeper announces itself under
 * the mutex before its last look at the state, and the other side, having
 * published its change with a sequentially consistent store, takes the mutex
 * to signal only when it sees a sleeper. A claim can never take a chunk of a
 * stale job: the word carries the generation, so the compare-and-swap fails
 * once a new job is published, and a job's fields are rewritten only after
 * all its chunks are done, so a claimed chunk reads its own job's fields.
 * Jobs run on the worker threads and the submitting thread (the model's
 * thread); nothing here allocates after open. */
#include "compute/cpu/tpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

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

/* The claim word: generation (32 bits) | parts (16) | next chunk (16). */
#define CLAIM(gen, parts, next) \
  (((uint64_t)(gen) << 32) | ((uint64_t)(parts) << 16) | (uint64_t)(next))
#define CLAIM_GEN(v) ((uint32_t)((v) >> 32))
#define CLAIM_PARTS(v) ((unsigned)(((v) >> 16) & 0xffffu))
#define CLAIM_NEXT(v) ((unsigned)((v) & 0xffffu))

struct td_tpool {
  int threads;
  pthread_t *tids;
  int started; /* workers actually started (for close after a failed open) */
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  _Atomic uint64_t claim;
  atomic_int done;      /* chunks of the current job finished */
  atomic_int sleepers;  /* workers waiting on work_cv */
  atomic_bool waiter;   /* the submitter waits on done_cv */
  atomic_bool stop;
  /* the current job, written before its claim word is published */
  td_tpool_fn fn;
  void *arg;
  size_t n, chunk;
};

static _Thread_local int in_job;

int td_tpool_in_job(void) { return in_job; }

/* Claim and run chunks of the current job until none is left. */
static void run_chunks(td_tpool_t *p) {
  uint64_t v = atomic_load(&p->claim);
  while (CLAIM_NEXT(v) < CLAIM_PARTS(v)) {
    if (!atomic_compare_exchange_weak(&p->claim, &v, v + 1))
      continue; /* v now holds the current word */
    size_t begin = (size_t)CLAIM_NEXT(v) * p->chunk;
    size_t end = begin + p->chunk < p->n ? begin + p->chunk : p->n;
    p->fn(p->arg, begin, end, (int)CLAIM_NEXT(v));
    if (atomic_fetch_add(&p->done, 1) + 1 == (int)CLAIM_PARTS(v) && atomic_load(&p->waiter)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
    v = atomic_load(&p->claim);
  }
}

static void *worker_main(void *opaque) {
  td_tpool_t *p = opaque;
  uint32_t seen = 0;
  in_job = 1; /* a worker only ever runs job bodies */
  for (;;) {
    uint32_t gen = CLAIM_GEN(atomic_load(&p->claim));
    for (int i = 0; gen == seen && i < TD__TPOOL_SPINS && !atomic_load(&p->stop); i++) {
      td__cpu_relax();
      gen = CLAIM_GEN(atomic_load(&p->claim));
    }
    if (gen == seen && !atomic_load(&p->stop)) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while ((gen = CLAIM_GEN(atomic_load(&p->claim))) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->work_cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop))
      return NULL;
    seen = gen;
    run_chunks(p);
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
    p->tids = calloc((size_t)threads, sizeof(pthread_t));
    if (p->tids == NULL) {
      td_tpool_close(&p);
      return TD_ENOMEM;
    }
    for (int i = 1; i < threads; i++) {
      if (pthread_create(&p->tids[i], NULL, worker_main, p) != 0) {
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

#define TD__TPOOL_MIN_FLOATS 8192

size_t td_tpool_grain(size_t item_floats, size_t grain) {
  if (grain == 0)
    grain = 1;
  if (item_floats == 0)
    item_floats = 1;
  size_t items = (TD__TPOOL_MIN_FLOATS + item_floats - 1) / item_floats;
  return (items + grain - 1) / grain * grain;
}

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
  atomic_store(&p->done, 0);
  uint32_t gen = CLAIM_GEN(atomic_load(&p->claim)) + 1;
  atomic_store(&p->claim, CLAIM(gen, parts, 0));
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
  }
  in_job = 1;
  run_chunks(p);
  in_job = 0;
  for (int i = 0; atomic_load(&p->done) < parts && i < TD__TPOOL_SPINS; i++)
    td__cpu_relax();
  if (atomic_load(&p->done) < parts) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->waiter, true);
    while (atomic_load(&p->done) < parts)
      pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->waiter, false);
    pthread_mutex_unlock(&p->mu);
  }
}

double td_tpool_worker_cpu_s(const td_tpool_t *pool) {
  double s = 0;
  for (int i = 1; pool != NULL && i <= pool->started; i++) {
    clockid_t id;
    struct timespec ts;
    if (pthread_getcpuclockid(pool->tids[i], &id) == 0 && clock_gettime(id, &ts) == 0)
      s += (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
  }
  return s;
}
