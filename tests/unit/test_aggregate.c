/* test_aggregate.c: the aggregation of a round's updates (scheduler/aggregate.h).
 *
 * Every estimator is checked against a naive reference written here
 * (per-coordinate qsort for the median and the trimmed mean, a plain weighted
 * sum for the mean), and against exact invariants: the median or trimmed mean
 * of identical updates is that update, a trimmed mean with B poisoned inputs
 * never leaves the honest inputs' range in any coordinate, clipping bounds the
 * norm of every input and of the result, the norm bound rejects a huge update
 * and leaves the rest as if it had not been sent (a rejected member counts
 * against the trimmed mean's B), and the result does not depend on the order
 * of the inputs (bit for bit). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "scheduler/aggregate.h"

#define NUMEL 257
#define MAXN 10

static float data[MAXN][NUMEL];

/* Deterministic pseudo-random floats in [-1, 1). */
static uint64_t rng = 88172645463325252ull;
static float uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill_random(size_t n) {
  for (size_t j = 0; j < n; j++)
    for (size_t i = 0; i < NUMEL; i++)
      data[j][i] = uniform();
}

/* Inputs over data[0..n) with ids 100 - j (so the given order is not id order). */
static void make_inputs(td_agg_input_t *in, size_t n, const double *weights) {
  for (size_t j = 0; j < n; j++)
    in[j] = (td_agg_input_t){.id = 100 - j, .delta = data[j], .weight = weights ? weights[j] : 1};
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Naive reference: coordinate i of inputs j in keep[] (by data index). */
static double ref_median(const size_t *keep, size_t k, size_t i) {
  double v[MAXN];
  for (size_t j = 0; j < k; j++)
    v[j] = data[keep[j]][i];
  qsort(v, k, sizeof *v, cmp_double);
  return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

typedef struct {
  double v, w;
} vw_t;
static int cmp_vw(const void *a, const void *b) {
  return cmp_double(&((const vw_t *)a)->v, &((const vw_t *)b)->v);
}

static double ref_trimmed(const size_t *keep, size_t k, const double *w, size_t b, size_t i) {
  vw_t v[MAXN];
  for (size_t j = 0; j < k; j++)
    v[j] = (vw_t){data[keep[j]][i], w[keep[j]]};
  qsort(v, k, sizeof *v, cmp_vw);
  double acc = 0, ws = 0;
  for (size_t j = b; j < k - b; j++) {
    acc += v[j].w * v[j].v;
    ws += v[j].w;
  }
  return acc / ws;
}

static double ref_mean(const size_t *keep, size_t k, const double *w, size_t i) {
  double acc = 0, ws = 0;
  for (size_t j = 0; j < k; j++) {
    acc += w[keep[j]] * data[keep[j]][i];
    ws += w[keep[j]];
  }
  return acc / ws;
}

static double norm_of(const float *x) {
  double s = 0;
  for (size_t i = 0; i < NUMEL; i++)
    s += (double)x[i] * x[i];
  return sqrt(s);
}

static void assert_close(const float *out, double want, size_t i) {
  ck_assert_msg(fabs(out[i] - want) <= 1e-6 * (1 + fabs(want)), "coordinate %zu: %.9g, want %.9g",
                i, (double)out[i], want);
}

START_TEST(parse_accepts_the_four_kinds_and_says_why_otherwise) {
  td_agg_spec_t s = {0};
  char why[256];
  ck_assert_int_eq(td_agg_parse(&s, "mean", why, sizeof why), 0);
  ck_assert_int_eq(s.kind, TD_AGG_MEAN);
  ck_assert_int_eq(td_agg_parse(&s, "clip:3.5", why, sizeof why), 0);
  ck_assert_int_eq(s.kind, TD_AGG_CLIP);
  ck_assert(s.clip == 3.5);
  ck_assert_int_eq(td_agg_parse(&s, "trimmed:2", why, sizeof why), 0);
  ck_assert_int_eq(s.kind, TD_AGG_TRIMMED);
  ck_assert_uint_eq(s.trim, 2);
  ck_assert_int_eq(td_agg_parse(&s, "median", why, sizeof why), 0);
  ck_assert_int_eq(s.kind, TD_AGG_MEDIAN);
  const char *bad[] = {"", "avg", "clip:", "clip:0.5", "clip:x", "clip:nan", "trimmed:0",
                       "trimmed:1.5", "trimmed:-1", "trimmed:17", "trimmed: 1", "median:1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    why[0] = '\0';
    ck_assert_int_eq(td_agg_parse(&s, bad[i], why, sizeof why), TD_ECONFIG);
    ck_assert_msg(strstr(why, "accepted") != NULL, "%s: %s", bad[i], why);
  }
  double r = 0;
  ck_assert_int_eq(td_agg_parse_norm_bound(&r, "auto", why, sizeof why), 0);
  ck_assert(r == -1);
  ck_assert_int_eq(td_agg_parse_norm_bound(&r, "off", why, sizeof why), 0);
  ck_assert(r == 0);
  ck_assert_int_eq(td_agg_parse_norm_bound(&r, "8", why, sizeof why), 0);
  ck_assert(r == 8);
  ck_assert_int_eq(td_agg_parse_norm_bound(&r, "0.5", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_agg_parse_norm_bound(&r, "inf", why, sizeof why), TD_ECONFIG);
  /* auto: a bound for trimmed and median, none for mean and clip */
  td_agg_spec_t t = {.kind = TD_AGG_TRIMMED, .trim = 1, .norm_bound = -1};
  td_agg_resolve(&t);
  ck_assert(t.norm_bound == TD_AGG_AUTO_NORM_BOUND);
  td_agg_spec_t m = {.kind = TD_AGG_MEAN, .norm_bound = -1};
  td_agg_resolve(&m);
  ck_assert(m.norm_bound == 0);
  char text[64];
  td_agg_format(&t, text, sizeof text);
  ck_assert_str_eq(text, "trimmed:1, norm bound 5");
  td_agg_format(&m, text, sizeof text);
  ck_assert_str_eq(text, "mean");
}
END_TEST

START_TEST(estimators_match_naive_references) {
  const double w[MAXN] = {3, 1, 2, 5, 1, 4, 2, 7, 1, 6};
  size_t all[MAXN];
  for (size_t j = 0; j < MAXN; j++)
    all[j] = j;
  static float out[NUMEL];
  for (size_t n = 1; n <= MAXN; n++) {
    fill_random(n);
    td_agg_input_t in[TD_AGG_MAX_INPUTS];
    td_agg_spec_t mean = {.kind = TD_AGG_MEAN}, med = {.kind = TD_AGG_MEDIAN};
    make_inputs(in, n, w);
    ck_assert_uint_eq(td_agg_apply(&mean, in, n, NUMEL, out, NULL), n);
    for (size_t i = 0; i < NUMEL; i++)
      assert_close(out, ref_mean(all, n, w, i), i);
    make_inputs(in, n, w);
    ck_assert_uint_eq(td_agg_apply(&med, in, n, NUMEL, out, NULL), n);
    for (size_t i = 0; i < NUMEL; i++)
      assert_close(out, ref_median(all, n, i), i);
    for (unsigned b = 1; b <= 3; b++) {
      td_agg_spec_t tr = {.kind = TD_AGG_TRIMMED, .trim = b};
      size_t eff = n >= 2 * b + 1 ? b : (n - 1) / 2; /* too few: trims down to the median */
      make_inputs(in, n, w);
      ck_assert_uint_eq(td_agg_apply(&tr, in, n, NUMEL, out, NULL), n);
      for (size_t i = 0; i < NUMEL; i++)
        assert_close(out, ref_trimmed(all, n, w, eff, i), i);
    }
  }
}
END_TEST

/* A hand-made set small enough to check by eye. */
START_TEST(hand_made_set) {
  static const float v[5][3] = {{1, 10, -1}, {2, 20, -2}, {3, 30, -3}, {4, 40, -4}, {100, -1e30f, 7}};
  td_agg_input_t in[5];
  for (int j = 0; j < 5; j++)
    in[j] = (td_agg_input_t){.id = (uint64_t)(5 - j), .delta = v[j], .weight = 1};
  float out[3];
  td_agg_spec_t med = {.kind = TD_AGG_MEDIAN};
  td_agg_apply(&med, in, 5, 3, out, NULL);
  ck_assert(out[0] == 3 && out[1] == 20 && out[2] == -2);
  for (int j = 0; j < 5; j++)
    in[j] = (td_agg_input_t){.id = (uint64_t)(5 - j), .delta = v[j], .weight = 1};
  td_agg_spec_t tr = {.kind = TD_AGG_TRIMMED, .trim = 1};
  td_agg_apply(&tr, in, 5, 3, out, NULL);
  ck_assert(out[0] == 3 && out[1] == 20 && out[2] == -2); /* (2+3+4)/3, (10+20+30)/3, ... */
  for (int j = 0; j < 4; j++) /* an even count: the mean of the two middle values */
    in[j] = (td_agg_input_t){.id = (uint64_t)j, .delta = v[j], .weight = 1};
  td_agg_apply(&med, in, 4, 3, out, NULL);
  ck_assert(out[0] == 2.5f && out[1] == 25 && out[2] == -2.5f);
}
END_TEST

START_TEST(identical_updates_give_that_update) {
  fill_random(1);
  for (size_t j = 1; j < 7; j++)
    memcpy(data[j], data[0], sizeof data[0]);
  const double w[MAXN] = {3, 1, 2, 5, 1, 4, 2};
  static float out[NUMEL];
  td_agg_spec_t specs[] = {{.kind = TD_AGG_MEDIAN}, {.kind = TD_AGG_TRIMMED, .trim = 2},
                           {.kind = TD_AGG_MEAN}, {.kind = TD_AGG_CLIP, .clip = 1},
                           {.kind = TD_AGG_MEDIAN, .norm_bound = 1}};
  for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
    for (size_t n = 1; n <= 7; n++) {
      td_agg_input_t in[TD_AGG_MAX_INPUTS];
      make_inputs(in, n, w);
      td_agg_result_t res;
      ck_assert_uint_eq(td_agg_apply(&specs[s], in, n, NUMEL, out, &res), n);
      ck_assert_uint_eq(res.clipped + res.rejected, 0);
      if (specs[s].kind == TD_AGG_MEDIAN)
        ck_assert_int_eq(memcmp(out, data[0], sizeof out), 0);
      else
        for (size_t i = 0; i < NUMEL; i++)
          ck_assert_msg(fabsf(out[i] - data[0][i]) <= 1e-7f * (1 + fabsf(data[0][i])),
                        "spec %zu n %zu coordinate %zu", s, n, i);
    }
  }
}
END_TEST

START_TEST(trimmed_with_b_poisoned_stays_in_honest_range) {
  static float out[NUMEL];
  for (unsigned b = 1; b <= 3; b++) {
    size_t honest = 2 * b + 1, n = honest + b;
    for (int trial = 0; trial < 20; trial++) {
      fill_random(n);
      for (size_t j = honest; j < n; j++) /* poison: huge, flipped x10, or on one side */
        for (size_t i = 0; i < NUMEL; i++)
          data[j][i] = trial % 3 == 0   ? (uniform() < 0 ? -1e30f : 1e30f)
                       : trial % 3 == 1 ? -10 * data[j - honest][i]
                                        : 5 + uniform();
      double w[MAXN];
      for (size_t j = 0; j < n; j++) /* a poisoned member may even weigh the most */
        w[j] = j >= honest ? 1e9 : 1 + (double)j;
      td_agg_input_t in[TD_AGG_MAX_INPUTS];
      make_inputs(in, n, w);
      td_agg_spec_t tr = {.kind = TD_AGG_TRIMMED, .trim = b};
      td_agg_apply(&tr, in, n, NUMEL, out, NULL);
      for (size_t i = 0; i < NUMEL; i++) {
        float lo = data[0][i], hi = data[0][i];
        for (size_t j = 1; j < honest; j++) {
          lo = fminf(lo, data[j][i]);
          hi = fmaxf(hi, data[j][i]);
        }
        ck_assert_msg(out[i] >= lo && out[i] <= hi, "b %u trial %d coordinate %zu: %g not in "
                      "[%g, %g]", b, trial, i, (double)out[i], (double)lo, (double)hi);
      }
    }
  }
}
END_TEST

/* B = 2 bad members: one huge (the norm bound rejects it), one within the
 * bound but the largest value in every coordinate (trimming drops it). */
START_TEST(trimmed_counts_rejected_members_against_b) {
  static float out[NUMEL];
  const double w[MAXN] = {1, 2, 3, 1, 2, 1e9, 1e9};
  fill_random(5);
  for (size_t i = 0; i < NUMEL; i++) {
    data[5][i] = 1e30f;
    data[6][i] = 1.5f; /* norm ~2.6 x an honest one's: under the bound */
  }
  td_agg_input_t in[TD_AGG_MAX_INPUTS];
  make_inputs(in, 7, w);
  td_agg_spec_t tr = {.kind = TD_AGG_TRIMMED, .trim = 2, .norm_bound = 5};
  td_agg_result_t res;
  ck_assert_uint_eq(td_agg_apply(&tr, in, 7, NUMEL, out, &res), 6);
  ck_assert_uint_eq(res.rejected, 1);
  size_t kept[6] = {0, 1, 2, 3, 4, 6};
  for (size_t i = 0; i < NUMEL; i++) {
    assert_close(out, ref_trimmed(kept, 6, w, 1, i), i);
    float lo = data[0][i], hi = data[0][i];
    for (size_t j = 1; j < 5; j++) {
      lo = fminf(lo, data[j][i]);
      hi = fmaxf(hi, data[j][i]);
    }
    ck_assert(out[i] >= lo && out[i] <= hi);
  }
}
END_TEST

START_TEST(clip_bounds_every_norm) {
  const double w[MAXN] = {1, 2, 1, 3, 1};
  static float out[NUMEL];
  fill_random(5);
  for (size_t i = 0; i < NUMEL; i++) {
    data[3][i] *= 50;      /* far too long */
    data[4][i] *= -1e25f;  /* absurdly long */
  }
  double norms[5];
  for (size_t j = 0; j < 5; j++)
    norms[j] = norm_of(data[j]);
  double sorted[5];
  memcpy(sorted, norms, sizeof sorted);
  qsort(sorted, 5, sizeof *sorted, cmp_double);
  double median = sorted[2];
  for (double c = 1; c <= 4; c *= 2) {
    td_agg_input_t in[TD_AGG_MAX_INPUTS];
    make_inputs(in, 5, w);
    td_agg_spec_t clip = {.kind = TD_AGG_CLIP, .clip = c};
    td_agg_result_t res;
    ck_assert_uint_eq(td_agg_apply(&clip, in, 5, NUMEL, out, &res), 5);
    ck_assert(fabs(res.median_norm - median) <= 1e-12 * median);
    ck_assert(norm_of(out) <= c * median * (1 + 1e-6));
    size_t clipped = 0;
    for (size_t j = 0; j < 5; j++) { /* sorted by id: data index 4 - j */
      ck_assert(in[j].norm == norms[4 - j]);
      bool over = norms[4 - j] > c * median;
      ck_assert_int_eq(in[j].verdict, over ? TD_AGG_CLIPPED : TD_AGG_USED);
      clipped += over;
    }
    ck_assert_uint_eq(res.clipped, clipped);
    ck_assert_uint_ge(clipped, 2);
    /* the reference: each input scaled to at most c x median, then the weighted mean */
    for (size_t i = 0; i < NUMEL; i++) {
      double acc = 0, ws = 0;
      for (size_t j = 0; j < 5; j++) {
        double s = norms[j] > c * median ? c * median / norms[j] : 1;
        acc += w[j] * s * data[j][i];
        ws += w[j];
      }
      assert_close(out, acc / ws, i);
    }
  }
}
END_TEST

START_TEST(norm_bound_rejects_and_the_rest_is_unchanged) {
  const double w[MAXN] = {2, 1, 3, 1, 1};
  static float out[NUMEL], without[NUMEL];
  fill_random(4);
  for (size_t i = 0; i < NUMEL; i++)
    data[4][i] = 1e30f;
  td_agg_kind_t kinds[] = {TD_AGG_MEAN, TD_AGG_TRIMMED, TD_AGG_MEDIAN};
  for (size_t k = 0; k < 3; k++) {
    td_agg_spec_t spec = {.kind = kinds[k], .trim = 1, .norm_bound = 5};
    td_agg_input_t in[TD_AGG_MAX_INPUTS];
    make_inputs(in, 5, w);
    td_agg_result_t res;
    ck_assert_uint_eq(td_agg_apply(&spec, in, 5, NUMEL, out, &res), 4);
    ck_assert_uint_eq(res.rejected, 1);
    ck_assert_uint_eq(res.used, 4);
    ck_assert_int_eq(in[0].verdict, TD_AGG_REJECTED); /* id 96 = data[4] comes first */
    ck_assert(in[0].id == 96);
    for (size_t j = 1; j < 5; j++)
      ck_assert_int_eq(in[j].verdict, TD_AGG_USED);
    if (kinds[k] == TD_AGG_TRIMMED) /* trims one fewer: below */
      continue;
    make_inputs(in, 4, w);
    ck_assert_uint_eq(td_agg_apply(&spec, in, 4, NUMEL, without, NULL), 4);
    ck_assert_int_eq(memcmp(out, without, sizeof out), 0);
  }
  /* trimmed:1 counts the rejected member as its one bad member: the weighted
   * mean of the other four */
  {
    td_agg_spec_t spec = {.kind = TD_AGG_TRIMMED, .trim = 1, .norm_bound = 5};
    td_agg_input_t in[TD_AGG_MAX_INPUTS];
    make_inputs(in, 5, w);
    ck_assert_uint_eq(td_agg_apply(&spec, in, 5, NUMEL, out, NULL), 4);
    size_t honest[4] = {0, 1, 2, 3};
    for (size_t i = 0; i < NUMEL; i++)
      assert_close(out, ref_mean(honest, 4, w, i), i);
  }
  /* no bound: the mean is dragged to ~1e30 / 8 */
  td_agg_spec_t plain = {.kind = TD_AGG_MEAN};
  td_agg_input_t in[TD_AGG_MAX_INPUTS];
  make_inputs(in, 5, w);
  td_agg_apply(&plain, in, 5, NUMEL, out, NULL);
  ck_assert(out[0] > 1e28f);
}
END_TEST

START_TEST(non_finite_and_weightless_inputs_are_rejected) {
  const double w[MAXN] = {1, 1, 0, 1};
  static float out[NUMEL];
  fill_random(4);
  data[1][7] = NAN;
  td_agg_input_t in[TD_AGG_MAX_INPUTS];
  make_inputs(in, 4, w);
  td_agg_spec_t mean = {.kind = TD_AGG_MEAN};
  td_agg_result_t res;
  ck_assert_uint_eq(td_agg_apply(&mean, in, 4, NUMEL, out, &res), 2);
  ck_assert_uint_eq(res.rejected, 2);
  size_t all[2] = {0, 3};
  for (size_t i = 0; i < NUMEL; i++)
    assert_close(out, ref_mean(all, 2, w, i), i);
  ck_assert_uint_eq(td_agg_apply(&mean, in, 0, NUMEL, out, &res), 0); /* nothing: zeros */
  for (size_t i = 0; i < NUMEL; i++)
    ck_assert(out[i] == 0);
}
END_TEST

START_TEST(result_does_not_depend_on_input_order) {
  const double w[MAXN] = {3, 1, 2, 5, 1, 4, 2};
  static float first[NUMEL], out[NUMEL];
  fill_random(7);
  td_agg_spec_t specs[] = {{.kind = TD_AGG_MEAN}, {.kind = TD_AGG_CLIP, .clip = 1.1},
                           {.kind = TD_AGG_TRIMMED, .trim = 2}, {.kind = TD_AGG_MEDIAN}};
  for (size_t s = 0; s < 4; s++) {
    td_agg_input_t in[TD_AGG_MAX_INPUTS];
    make_inputs(in, 7, w);
    td_agg_apply(&specs[s], in, 7, NUMEL, first, NULL);
    for (int perm = 0; perm < 10; perm++) {
      make_inputs(in, 7, w);
      for (size_t j = 6; j > 0; j--) { /* Fisher-Yates with the test's generator */
        size_t r = (size_t)((uniform() + 1) / 2 * (double)(j + 1)) % (j + 1);
        td_agg_input_t t = in[j];
        in[j] = in[r];
        in[r] = t;
      }
      td_agg_apply(&specs[s], in, 7, NUMEL, out, NULL);
      ck_assert_int_eq(memcmp(out, first, sizeof out), 0);
    }
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("aggregate");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, parse_accepts_the_four_kinds_and_says_why_otherwise);
  tcase_add_test(tc, estimators_match_naive_references);
  tcase_add_test(tc, hand_made_set);
  tcase_add_test(tc, identical_updates_give_that_update);
  tcase_add_test(tc, trimmed_with_b_poisoned_stays_in_honest_range);
  tcase_add_test(tc, trimmed_counts_rejected_members_against_b);
  tcase_add_test(tc, clip_bounds_every_norm);
  tcase_add_test(tc, norm_bound_rejects_and_the_rest_is_unchanged);
  tcase_add_test(tc, non_finite_and_weightless_inputs_are_rejected);
  tcase_add_test(tc, result_does_not_depend_on_input_order);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
