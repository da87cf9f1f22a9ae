/* steps.c: run length and per-round local steps (see steps.h). */
#include "scheduler/steps.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/error.h"
#include "scheduler/plan.h"

/* Growth of the QSR plan's array: rounds are not known until planned. */
#define PLAN_INITIAL_ROUNDS 64

unsigned long td_steps_total(const td_steps_opts_t *o) {
  if (o->batch == 0)
    return 0;
  unsigned long per_epoch = (unsigned long)((o->train_rows + o->batch - 1) / o->batch);
  return per_epoch * o->epochs;
}

uint64_t td_steps_round_count(const td_steps_opts_t *o) {
  if (o->rounds > 0)
    return o->rounds;
  if (o->local_steps == 0)
    return 1;
  uint64_t r = (td_steps_total(o) + o->local_steps - 1) / o->local_steps;
  return r ? r : 1;
}

unsigned long td_steps_lr_horizon(const td_steps_opts_t *o) {
  if (o->qsr_alpha > 0)
    return td_steps_total(o);
  return (unsigned long)td_steps_round_count(o) * o->local_steps;
}

int td_steps_plan(const td_steps_opts_t *o, uint64_t *rounds, unsigned **steps_of) {
  *rounds = 0;
  *steps_of = NULL;
  if (o->batch == 0 || o->epochs == 0 || o->local_steps == 0 ||
      (o->qsr_alpha > 0 && o->lr_at == NULL))
    return TD_EINVAL;
  unsigned long h_cap = o->local_steps > UINT_MAX ? UINT_MAX : o->local_steps;
  if (!(o->qsr_alpha > 0)) {
    uint64_t n = td_steps_round_count(o);
    unsigned *h = malloc(n * sizeof *h);
    if (h == NULL)
      return TD_ENOMEM;
    for (uint64_t r = 0; r < n; r++)
      h[r] = (unsigned)h_cap;
    *rounds = n;
    *steps_of = h;
    return 0;
  }
  unsigned long total = td_steps_total(o), step = 0;
  uint64_t n = 0, cap = o->rounds > 0 ? o->rounds : PLAN_INITIAL_ROUNDS;
  unsigned *h = malloc(cap * sizeof *h);
  if (h == NULL)
    return TD_ENOMEM;
  while (o->rounds > 0 ? n < o->rounds : step < total) {
    if (n == cap) {
      unsigned *bigger = realloc(h, 2 * cap * sizeof *h);
      if (bigger == NULL) {
        free(h);
        return TD_ENOMEM;
      }
      h = bigger;
      cap *= 2;
    }
    unsigned long left = total > step ? total - step : 0;
    unsigned long steps = td_plan_qsr(o->qsr_alpha, o->local_steps, o->lr_at(o->lr_ctx, step),
                                      step < o->warmup_steps, left);
    h[n++] = (unsigned)(steps > UINT_MAX ? UINT_MAX : steps);
    step += steps;
  }
  *rounds = n;
  *steps_of = h;
  return 0;
}

unsigned td_steps_split_batch(unsigned batch, unsigned rank, unsigned nodes) {
  if (nodes == 0)
    return batch ? batch : 1;
  unsigned b = batch / nodes + (rank < batch % nodes ? 1 : 0);
  return b ? b : 1;
}
