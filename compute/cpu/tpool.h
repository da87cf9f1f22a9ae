/* tpool.h: a small persistent thread pool with one job, a parallel for.
 *
 * The CPU backend owns one pool of `threads` threads: the caller's thread
 * plus threads - 1 workers started at open and parked between jobs. A job
 * splits the index range [0, n) into at most `threads` contiguous chunks
 * (static: the same n always gives the same chunks), which the caller and
 * the workers claim one at a time, the caller included, so a worker that is
 * slow to wake delays nothing; the call returns when every chunk is done.
 * Work per index is the same whatever thread runs it, so a kernel that
 * writes each output from one index only gives the same bits on 1 and N
 * threads.
 * Jobs do not nest: a job body that calls td_tpool_for again (or a backend op
 * that would) runs that inner range serially on its own thread. One thread at
 * a time submits jobs (the thread that owns the model). Private to compute/. */
#ifndef TD_TPOOL_H
#define TD_TPOOL_H

#include <stddef.h>

typedef struct td_tpool td_tpool_t;

/* fn(arg, begin, end) handles indices [begin, end); `part` is the chunk
 * number in [0, td_tpool_threads()), for per-chunk scratch (any thread may
 * run any chunk). */
typedef void (*td_tpool_fn)(void *arg, size_t begin, size_t end, int part);

/* A pool of `threads` >= 1 threads (threads - 1 workers; 1: none, every job
 * runs inline). TD_ENOMEM or TD_EINVAL; caller owns *out. */
int td_tpool_open(td_tpool_t **out, int threads);
/* Stops and joins the workers. NULL-safe; sets *self_p to NULL. */
void td_tpool_close(td_tpool_t **self_p);
/* CPU seconds the pool's workers have used since they started (their thread
 * clocks; 0 for a NULL or one-thread pool): with the caller's own thread
 * clock, what the pool's jobs cost in CPU. */
double td_tpool_worker_cpu_s(const td_tpool_t *pool);
/* Threads a job is split over (1 for a NULL pool). */
int td_tpool_threads(const td_tpool_t *pool);
/* Run fn over [0, n) in `threads` chunks, each a multiple of `grain` indices
 * long except the last (grain >= 1: whole cache lines, whole tiles), using
 * fewer chunks when n < threads * grain. Returns when all are done. A NULL
 * pool, a one-thread pool or a call from inside a job runs fn(arg, 0, n, 0). */
void td_tpool_for(td_tpool_t *pool, size_t n, size_t grain, td_tpool_fn fn, void *arg);
/* A grain for items of item_floats floats of work each: a multiple of
 * `grain` long enough that a chunk holds at least 8192 floats, so a job too
 * small to repay the hand-off (a few microseconds) runs on the caller's
 * thread alone. */
size_t td_tpool_grain(size_t item_floats, size_t grain);
/* Whether the calling thread is inside a job (a worker, or the submitter
 * while its job runs): nested parallel work must run serially there. */
int td_tpool_in_job(void);

#endif
