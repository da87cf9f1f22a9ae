/* run_sample.c: client sampling, the round's sample of members or of
 * virtual clients (run.h: td_run_sample and its kin).
 *
 * Every member derives a round's sample from (seed, round) alone
 * (scheduler/sample.h): with clients = 1 over the members counted at that
 * round, with clients = K > 1 over the run's clients that hold rows (the
 * compute thread lists them before READY, read-only after), a node then
 * being in the node mask when one of its clients is. Any thread. */
#include <stdint.h>
#include <string.h>

#include "daemon/run/run_internal.h"

unsigned td_run_clients(const td_run_t *run) {
  return run->spec.clients > 1 ? run->spec.clients : 1;
}

unsigned td_run_sample_clients(td_run_t *run, uint64_t round, uint64_t *set) {
  memset(set, 0, TD_SAMPLE_SET_WORDS * sizeof *set);
  if (run->spec.clients <= 1 || run->client_cand == NULL)
    return 0;
  return td_sample_draw_set(run->spec.seed, round, run->client_cand, run->n_cand,
                            td_sample_size(run->spec.participation, run->n_cand), set);
}

/* With clients > 1: the nodes with a client in the sample (bit n: node n). */
static uint64_t nodes_of_clients(td_run_t *run, uint64_t round) {
  uint64_t set[TD_SAMPLE_SET_WORDS], mask = 0;
  td_run_sample_clients(run, round, set);
  unsigned k = run->spec.clients;
  for (unsigned c = 0; c < run->n_clients && c / k < 64; c++)
    if (set[c / 64] >> (c % 64) & 1)
      mask |= UINT64_C(1) << (c / k);
  return mask;
}

unsigned td_run_sampled_of(td_run_t *run, uint64_t round, unsigned rank) {
  if (run->spec.clients <= 1 || run->client_cand == NULL)
    return td_run_in_sample(run, round, rank) ? 1 : 0;
  uint64_t set[TD_SAMPLE_SET_WORDS];
  td_run_sample_clients(run, round, set);
  unsigned n = 0, k = run->spec.clients;
  for (unsigned j = 0; j < k && (size_t)rank * k + j < run->n_clients; j++) {
    unsigned c = rank * k + j;
    n += (unsigned)(set[c / 64] >> (c % 64) & 1);
  }
  return n;
}

uint64_t td_run_sample(td_run_t *run, uint64_t round) {
  if (run->spec.clients > 1 && run->client_cand != NULL)
    return nodes_of_clients(run, round);
  pthread_mutex_lock(&run->mu);
  unsigned n = run->nodes_from && round >= run->nodes_from ? run->nodes_next : run->nodes;
  pthread_mutex_unlock(&run->mu);
  return td__run_sample_of(&run->spec, round, n);
}

bool td_run_in_sample(td_run_t *run, uint64_t round, unsigned rank) {
  return rank < 64 && (td_run_sample(run, round) >> rank & 1);
}
