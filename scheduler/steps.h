/* steps.h: how long a run is: its total local steps, its number of rounds and
 * the local steps of each round (fixed H, or the quadratic synchronization
 * rule, docs/algorithms.md#rounds-and-the-quadratic-synchronization-rule),
 * and each node's share of the global batch.
 *
 * Pure arithmetic on the run spec's numbers and the learning-rate schedule, so
 * every node computes the same plan without negotiating. The daemon's compute
 * thread plans with it (daemon/run/run_compute.c); nothing here touches a thread,
 * a socket or a clock. */
#ifndef TD_STEPS_H
#define TD_STEPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  size_t train_rows;          /* rows of the whole training set (before partitioning) */
  unsigned batch;             /* global batch per step, > 0 */
  unsigned epochs;            /* passes over the data, > 0 */
  uint64_t rounds;            /* the `rounds` key: when > 0, the run has exactly this many */
  unsigned long local_steps;  /* H, or H_base under the QSR, > 0 */
  double qsr_alpha;           /* > 0: H_r = max(H_base, (alpha / lr_r)^2) */
  unsigned long warmup_steps; /* under the QSR, rounds starting in warm-up take H_base */
  /* The learning rate at a global step (QSR only; may be NULL without it). */
  double (*lr_at)(const void *ctx, unsigned long step);
  const void *lr_ctx;
} td_steps_opts_t;

/* Steps of `epochs` passes over the data at the global batch:
 * ceil(train_rows / batch) * epochs. */
unsigned long td_steps_total(const td_steps_opts_t *o);

/* Rounds of a fixed-H run: the `rounds` key when set, else
 * ceil(td_steps_total() / local_steps), at least 1. */
uint64_t td_steps_round_count(const td_steps_opts_t *o);

/* The steps the learning-rate schedule spans: td_steps_total() under the QSR
 * (its rounds follow the schedule), rounds * H otherwise. */
unsigned long td_steps_lr_horizon(const td_steps_opts_t *o);

/* The run's plan: *rounds and, in *steps_of (caller owns, free()), the local
 * steps of round r at [r - 1]. Under the QSR, H_r is td_plan_qsr() at the
 * learning rate of the round's first step, H_base during warm-up, capped by
 * the steps left; rounds follow until the steps of `epochs` passes are done
 * (or until the `rounds` key). TD_ENOMEM; TD_EINVAL for a zero batch, epochs
 * or H, or a QSR without lr_at. */
int td_steps_plan(const td_steps_opts_t *o, uint64_t *rounds, unsigned **steps_of);

/* Local batch of node `rank` of `nodes`: the global batch split evenly, the
 * remainder going to the lowest ranks, so the local batches sum to `batch`
 * (at least 1 each when batch < nodes). */
unsigned td_steps_split_batch(unsigned batch, unsigned rank, unsigned nodes);

#endif
