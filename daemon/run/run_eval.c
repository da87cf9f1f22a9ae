/* run_eval.c: a run's evaluations off the training path.
 *
 * Evaluating the test set takes as long as hundreds of training steps (the
 * cnn's 10,000 test images: about 2 s of a core), and the compute thread used
 * to stop training for it every eval_every rounds, a large share of a WAN
 * run's wall time (bench/RESULTS.md). Here a second thread evaluates a copy of the
 * model on its own replica (its own CPU backend and trainer: nothing of the
 * training model, its buffers or its thread pool is shared) while training
 * goes on. One evaluation at a time: a submission while the last one still
 * runs waits for it, so a slow evaluator delays training at most by what is
 * left of one evaluation and results are never dropped or reordered. The
 * thread runs at a lower priority (nice +10), so on a busy machine it takes
 * the cycles training leaves.
 *
 * The evaluator never posts: the compute thread takes a finished result
 * (td__run_eval_take) and posts it itself, so the mailbox keeps its one
 * writer and an EVAL can never follow the run's STOPPED or FAILED.
 *
 * Ownership: the evaluator owns the replica's trainer and backend given to
 * td__run_eval_open and frees them in td__run_eval_close, after its thread
 * ended; the dataset or text it reads is borrowed and must outlive it.
 * Threads: every call on the compute thread; the evaluator's own thread
 * touches only its replica and the fields under `mu`. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "compute/backend.h"
#include "compute/trainer.h"
#include "common/error.h"
#include "daemon/run/run_internal.h"

/* Niceness of the evaluator thread: training first. */
#define EVAL_NICE 10

struct td__run_eval {
  td_backend_t *be;
  td_trainer_t *tr;
  float *params; /* the replica's parameters (host memory: a CPU backend) */
  size_t numel;
  const td_dataset_t *set; /* images: the eval set; NULL for text */
  const uint8_t *text;     /* text: the held-out bytes */
  size_t text_bytes;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool quit;    /* close: end the thread */
  bool pending; /* a submitted evaluation not yet started or finished */
  bool done;    /* `result` holds a finished evaluation not yet taken */
  td__run_eval_result_t result;
};

/* One evaluation of the replica's parameters. */
static void evaluate(td__run_eval_t *e, td__run_eval_result_t *r) {
  r->loss = r->accuracy = r->bpb = NAN;
  r->why[0] = '\0';
  if (e->text != NULL) {
    r->rc = td_trainer_evaluate_text(e->tr, e->text, e->text_bytes, &r->bpb, r->why,
                                     sizeof r->why);
    r->loss = r->bpb * log(2.0); /* mean cross-entropy in nats, as the classes' test loss */
  } else {
    r->rc = td_trainer_evaluate(e->tr, e->set, &r->loss, &r->accuracy, r->why, sizeof r->why);
  }
}

static void *eval_main(void *arg) {
  td__run_eval_t *e = arg;
  /* per-thread niceness (Linux); failing to lower it is harmless */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), EVAL_NICE);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (!e->quit && !(e->pending && !e->done))
      pthread_cond_wait(&e->cv, &e->mu);
    if (e->quit)
      break;
    uint64_t round = e->result.round;
    pthread_mutex_unlock(&e->mu);
    td__run_eval_result_t r = {.round = round};
    evaluate(e, &r);
    pthread_mutex_lock(&e->mu);
    e->result = r;
    e->pending = false;
    e->done = true;
    pthread_cond_broadcast(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int td__run_eval_open(td__run_eval_t **out, td_backend_t **be, td_trainer_t **tr,
                      const td_dataset_t *set, const uint8_t *text, size_t text_bytes,
                      char *why, size_t why_len) {
  *out = NULL;
  td__run_eval_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory for the evaluator");
  e->set = set;
  e->text = text;
  e->text_bytes = text_bytes;
  e->numel = td_model_numel(td_trainer_model(*tr));
  e->params = td_model_host_params(td_trainer_model(*tr));
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  int rc = pthread_create(&e->thread, NULL, eval_main, e);
  if (rc != 0) {
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
    return td_why(why, why_len, TD_ENOMEM, "cannot start the evaluator thread: %s",
                  strerror(rc));
  }
  e->be = *be; /* owned from here on */
  e->tr = *tr;
  *be = NULL;
  *tr = NULL;
  *out = e;
  return 0;
}

void td__run_eval_wait(td__run_eval_t *e, double *idle_s, double (*clock)(void)) {
  double t0 = clock();
  pthread_mutex_lock(&e->mu);
  while (e->pending)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  if (idle_s != NULL)
    *idle_s += clock() - t0;
}

bool td__run_eval_take(td__run_eval_t *e, td__run_eval_result_t *out) {
  pthread_mutex_lock(&e->mu);
  bool have = e->done;
  if (have) {
    *out = e->result;
    e->done = false;
  }
  pthread_mutex_unlock(&e->mu);
  return have;
}

void td__run_eval_submit(td__run_eval_t *e, uint64_t round, const float *params) {
  pthread_mutex_lock(&e->mu);
  while (e->pending) /* callers wait first (td__run_eval_wait); this only keeps it safe */
    pthread_cond_wait(&e->cv, &e->mu);
  memcpy(e->params, params, e->numel * sizeof(float));
  e->result = (td__run_eval_result_t){.round = round};
  e->done = false; /* an untaken result is replaced */
  e->pending = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

void td__run_eval_close(td__run_eval_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td__run_eval_t *e = *self_p;
  *self_p = NULL;
  pthread_mutex_lock(&e->mu);
  e->quit = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL); /* the replica is freed only after its job ended */
  td_trainer_close(&e->tr);
  td_backend_close(&e->be);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}
