/* aggregate.h: combining the updates of a round into one step, robustly if asked.
 *
 * A round's updates (the local one and every peer's) are flat fp32 deltas
 * with a sample weight. The run key `aggregate` picks how they are combined
 * (docs/algorithms.md#aggregation):
 *   mean        sample-weighted mean (the default);
 *   clip:C      every update longer than C x the round's median norm is
 *               scaled down to that length, then the weighted mean;
 *   trimmed:B   coordinate-wise trimmed mean for up to B bad members: the
 *               norm bound below may already have rejected r of them, so per
 *               coordinate the B - r largest and B - r smallest values are
 *               dropped and the rest averaged with their weights (with fewer
 *               than 2(B - r) + 1 updates left, (k - 1) / 2 are dropped, which
 *               is the median);
 *   median      coordinate-wise median (unweighted; the mean of the two middle
 *               values for an even count).
 * Before that, a norm bound R (run key `norm_bound`) may reject outright every
 * update longer than R x the median norm of the round. Each input gets a
 * verdict (used, clipped, rejected) and its norm, so the caller can report a
 * member whose updates keep being refused.
 *
 * Every node must compute the same step from the same updates, so the inputs
 * are sorted by sender id and every sum runs in double in a fixed order (id
 * order, or value order with id as tie-break): the result does not depend on
 * the order updates arrived in, nor on which node computes it. Pure
 * arithmetic on borrowed buffers, no allocation: any thread. */
#ifndef TD_AGGREGATE_H
#define TD_AGGREGATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/limits.h"

/* The local update plus one per peer. */
#define TD_AGG_MAX_INPUTS (TD_MAX_RUN_MEMBERS + 1)
/* trimmed:B accepts B up to this (2B + 1 updates needed for the full trim);
 * the range stays what it was when runs held 32 members, so a spec valid
 * then means the same now. */
#define TD_AGG_MAX_TRIM 16
_Static_assert(2 * TD_AGG_MAX_TRIM + 1 <= TD_AGG_MAX_INPUTS, "a full trim fits a run");
/* norm_bound = auto: the bound of trimmed and median (mean and clip: none). */
#define TD_AGG_AUTO_NORM_BOUND 5.0

typedef enum { TD_AGG_MEAN = 0, TD_AGG_CLIP, TD_AGG_TRIMMED, TD_AGG_MEDIAN } td_agg_kind_t;

typedef struct {
  td_agg_kind_t kind;
  double clip;       /* clip:C: at most C x the median norm */
  unsigned trim;     /* trimmed:B */
  double norm_bound; /* > 0: reject updates longer than this x the median norm; 0: none */
} td_agg_spec_t;

typedef enum { TD_AGG_USED = 0, TD_AGG_CLIPPED, TD_AGG_REJECTED } td_agg_verdict_t;

typedef struct {
  uint64_t id;         /* the sender: inputs are combined in id order */
  const float *delta;  /* numel floats, borrowed */
  double weight;       /* > 0: samples, bounded by the caller */
  /* set by td_agg_apply() */
  double norm;         /* L2 norm of delta */
  td_agg_verdict_t verdict;
} td_agg_input_t;

typedef struct {
  double median_norm; /* of every input */
  size_t used;        /* inputs not rejected (clipped ones included) */
  size_t clipped, rejected;
} td_agg_result_t;

/* Parse `aggregate` ("mean", "clip:C" with C in [1, 1000], "trimmed:B" with B
 * in [1, TD_AGG_MAX_TRIM], "median") into kind, clip and trim; norm_bound is
 * left alone. TD_ECONFIG + why. */
int td_agg_parse(td_agg_spec_t *out, const char *text, char *why, size_t why_len);
/* Parse `norm_bound`: "auto" (-1: resolved by td_agg_resolve), "off" (0) or
 * R in [1, 1e6]. TD_ECONFIG + why. */
int td_agg_parse_norm_bound(double *out, const char *text, char *why, size_t why_len);
/* norm_bound -1 (auto) becomes TD_AGG_AUTO_NORM_BOUND for trimmed and median,
 * 0 for mean and clip. */
void td_agg_resolve(td_agg_spec_t *spec);
/* "trimmed:1, norm bound 5" and the like, for logs and status. */
void td_agg_format(const td_agg_spec_t *spec, char *buf, size_t len);

/* out[0..numel) = the aggregate of the n inputs (n <= TD_AGG_MAX_INPUTS,
 * each delta numel floats); zeros when n is 0. Sorts in[] by id and sets
 * each input's norm and verdict; *res (may be NULL) gets the round's figures.
 * Inputs with a non-positive weight are rejected. Returns the number of
 * inputs used. */
size_t td_agg_apply(const td_agg_spec_t *spec, td_agg_input_t *in, size_t n, size_t numel,
                    float *out, td_agg_result_t *res);

#endif
