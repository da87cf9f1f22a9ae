/* run_verify.c: the compute side of model-state agreement (scheduler/agree.h
 * says what is hashed and how the members vote; daemon/session/verify.c runs
 * the vote on the loop thread).
 *
 * After the outer step of a verify round (every verify_every rounds, the
 * last round, and the rounds the loop asks for: a late joiner's first round,
 * `trainctl verify`, a repair) the compute thread hashes its shared state,
 * the anchor and then the outer momentum, and posts TD_RUN_VERIFY with the
 * hash and a copy of that state, which the loop keeps to serve a member that
 * differs. That point is the same on every node and every node holds the
 * state bit for bit there, so honest nodes post the same hash.
 *
 * A node that differs from the majority is repaired at a later verify round
 * P: the loop tells the compute thread first (td_run_want_repair), and after
 * hashing P the thread waits until the loop hands it the members' state of P
 * (td_run_repair; the loop checked its hash against the majority's) or gives
 * up (td_run_repair_cancel), then goes on from it. Its own optimizer state is
 * local and is kept. This file holds the hand-offs; the hashing and the
 * adoption are the compute thread's (td__compute_verify, run_apply.c).
 * Threads: the td_run_* calls on any thread, the td__run_* ones on the
 * compute thread; the fields are guarded by run->mu. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/run/run_internal.h"

void td_run_want_verify(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  size_t k = 0;
  for (size_t i = 1; i < TD_RUN_VERIFY_ASKED; i++) /* a free slot, else the oldest */
    if (run->verify_asked[i] < run->verify_asked[k])
      k = i;
  bool known = false;
  for (size_t i = 0; i < TD_RUN_VERIFY_ASKED; i++)
    known |= run->verify_asked[i] == round;
  if (!known)
    run->verify_asked[k] = round;
  pthread_mutex_unlock(&run->mu);
}

bool td_run_verifies(td_run_t *run, uint64_t round) {
  if (!td_runspec_verifiable(&run->spec, NULL, 0) || round == 0)
    return false;
  unsigned every = run->spec.verify_every;
  if (every > 0 && (round % every == 0 || round == run->rounds))
    return true;
  pthread_mutex_lock(&run->mu);
  bool asked = false;
  for (size_t i = 0; i < TD_RUN_VERIFY_ASKED; i++)
    asked |= run->verify_asked[i] == round;
  pthread_mutex_unlock(&run->mu);
  return asked;
}

void td_run_want_repair(td_run_t *run, uint64_t round) {
  td_run_want_verify(run, round);
  pthread_mutex_lock(&run->mu);
  run->repair_round = round;
  pthread_mutex_unlock(&run->mu);
}

int td_run_repair(td_run_t *run, uint64_t round, const float *state, size_t bytes) {
  if (bytes != (run->numel + run->mom_floats) * sizeof(float)) /* td_run_anchor_bytes */
    return TD_EINVAL;
  float *copy = malloc(bytes);
  if (copy == NULL)
    return TD_ENOMEM;
  memcpy(copy, state, bytes);
  pthread_mutex_lock(&run->mu);
  int rc = TD_EINVAL;
  if (run->repair_round == round && round != 0) {
    free(run->repair_state);
    run->repair_state = copy;
    copy = NULL;
    rc = 0;
  }
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
  free(copy);
  return rc;
}

void td_run_repair_cancel(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  if (run->repair_round == round)
    run->repair_round = 0;
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

float *td__run_wait_repair(td_run_t *run, uint64_t round, bool *stopped) {
  pthread_mutex_lock(&run->mu);
  while (!run->stop && run->repair_round == round && run->repair_state == NULL)
    pthread_cond_wait(&run->cv, &run->mu);
  float *state = run->repair_round == round ? run->repair_state : NULL;
  run->repair_state = NULL;
  run->repair_round = 0;
  *stopped = run->stop;
  pthread_mutex_unlock(&run->mu);
  if (*stopped) {
    free(state);
    state = NULL;
  }
  return state;
}

bool td__run_repairs(td_run_t *run, uint64_t round) {
  pthread_mutex_lock(&run->mu);
  bool repair = run->repair_round == round && round != 0;
  pthread_mutex_unlock(&run->mu);
  return repair;
}
