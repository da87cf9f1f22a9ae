/* test_fragment.c: Streaming DiLoCo's fragments (scheduler/fragment.h, run
 * keys fragments and fragment_alpha) against references. The slices by hand
 * (sizes, cover, the round that owns each); then whole runs of four nodes,
 * each on its own quadratic f_i(x) = a/2 (x - c_i)^2 in five coordinates
 * with momentum-SGD inner steps, driven as daemon/run/run_fragment.c drives
 * them (the library's slice, update, sgd outer step on the slice and mix, in
 * float), against a naive double-precision rendering of the published rule
 * (Douillard et al. 2025, arXiv 2501.18512): every worker keeps its own
 * model; fragment p is synchronised every P rounds, on rounds r = p mod P,
 * with the outer gradient mean_m (theta_p - x_m,p) over the local steps
 * since its last synchronisation; the outer optimizer steps theta_p; the
 * workers then take theta_p (sync) or, a round later, alpha x_m,p +
 * (1 - alpha) theta_p (overlap). Which coordinate belongs to which fragment
 * the reference decides on its own (equal slices, the remainder to the
 * first). Also: at P = 1 in sync mode the fragment rule is bit for bit the
 * whole-model sync step (td__compute_apply_round's arithmetic), and in the
 * stiff directions (momentum 0.9, H = 8, lr x curvature up to 1) where a
 * guess of the step in flight diverged, what the fragments do. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "scheduler/fragment.h"
#include "scheduler/outer.h"

START_TEST(slices_cover_the_model_once) {
  const size_t sizes[] = {1, 5, 7, 64, 1000, 1001};
  const unsigned parts[] = {1, 2, 3, 4, 7, 64};
  for (unsigned a = 0; a < sizeof sizes / sizeof sizes[0]; a++)
    for (unsigned b = 0; b < sizeof parts / sizeof parts[0]; b++) {
      size_t n = sizes[a];
      unsigned p = parts[b];
      if (p > n)
        continue;
      size_t next = 0, least = n, most = 0;
      for (uint64_t r = 0; r < p; r++) { /* round r owns fragment r mod p */
        size_t off, count;
        td_fragment_span(n, p, r + 5 * p, &off, &count);
        ck_assert_uint_eq(td_fragment_of(r + 5 * p, p), r);
        ck_assert_uint_eq(off, next); /* contiguous, in order */
        next = off + count;
        least = count < least ? count : least;
        most = count > most ? count : most;
      }
      ck_assert_uint_eq(next, n);   /* every float once */
      ck_assert(most - least <= 1); /* equal slices */
    }
  size_t off, count;
  td_fragment_span(7, 3, 3, &off, &count); /* 3, 2, 2: round 3 is fragment 0 */
  ck_assert(off == 0 && count == 3);
  td_fragment_span(7, 3, 5, &off, &count);
  ck_assert(off == 5 && count == 2);
  td_fragment_span(7, 1, 9, &off, &count); /* one fragment: the whole model each round */
  ck_assert(off == 0 && count == 7);
}
END_TEST

START_TEST(update_and_mix_hand_values) {
  const float params[5] = {1, 2, 3, 4, 5}, anchor[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  float update[5] = {9, 9, 9, 9, 9};
  td_fragment_delta(update, params, anchor, 5, 1, 2);
  ck_assert(update[0] == 0 && update[1] == 1.5f && update[2] == 2.5f && update[3] == 0 &&
            update[4] == 0);
  float x[3] = {1, 2, 4};
  const float g[3] = {3, 0, 0};
  td_fragment_mix(x, g, 0.5, 3);
  ck_assert(x[0] == 2 && x[1] == 1 && x[2] == 2);
  td_fragment_mix(x, g, 0, 3); /* sync: the anchor exactly */
  ck_assert(x[0] == 3 && x[1] == 0 && x[2] == 0);
  td_fragment_mix(x, anchor, 1, 3); /* alpha 1 keeps the local model */
  ck_assert(x[0] == 3 && x[1] == 0 && x[2] == 0);
}
END_TEST

#define NODES 4
#define DIM 5
/* lr x curvature per coordinate: the stiff ones last */
static const double CURV[DIM] = {0.02, 0.1, 0.3, 0.6, 1.0};
static const double OPT[NODES] = {1.0, -2.0, 0.5, 3.5}; /* c_i (the same in every coordinate) */

typedef struct {
  bool overlap;
  unsigned parts, steps, rounds;
  double alpha, mom;       /* fragment_alpha, inner momentum */
  double outer_mom;        /* outer sgd momentum (lr 1), 0: plain averaging */
  bool outer_nesterov;
} sim_opts_t;

typedef struct {
  float anchor[DIM], params[NODES][DIM];
} sim_out_t;

static void inner_f(float *x, float *v, unsigned i, const sim_opts_t *o) {
  for (unsigned s = 0; s < o->steps; s++)
    for (unsigned d = 0; d < DIM; d++) {
      v[d] = (float)o->mom * v[d] + (float)(CURV[d] * (x[d] - OPT[i]));
      x[d] -= v[d];
    }
}

static void inner_d(double *x, double *v, unsigned i, const sim_opts_t *o) {
  for (unsigned s = 0; s < o->steps; s++)
    for (unsigned d = 0; d < DIM; d++) {
      v[d] = o->mom * v[d] + CURV[d] * (x[d] - OPT[i]);
      x[d] -= v[d];
    }
}

static td_outer_opts_t outer_of(const sim_opts_t *o) {
  return (td_outer_opts_t){.kind = TD_OUTER_SGD, .lr = 1, .momentum = o->outer_mom,
                           .nesterov = o->outer_nesterov};
}

/* td__compute_apply_fragment: the mean of the nodes' updates of round r,
 * the outer step on r's slice (of the anchor and the momentum), the mix. */
static void apply_fragment(const sim_opts_t *o, uint64_t r, float upd[NODES][DIM],
                           float anchor[DIM], float mom[DIM], float x[NODES][DIM],
                           double alpha) {
  size_t off, count;
  td_fragment_span(DIM, o->parts, r, &off, &count);
  float avg[DIM] = {0};
  for (unsigned i = 0; i < NODES; i++)
    for (unsigned d = 0; d < DIM; d++)
      avg[d] += upd[i][d] / NODES;
  td_outer_opts_t oo = outer_of(o);
  td_outer_step(&oo, avg + off, o->outer_mom > 0 ? mom + off : NULL, avg + off, count);
  for (size_t d = off; d < off + count; d++)
    anchor[d] += avg[d];
  for (unsigned i = 0; i < NODES; i++)
    td_fragment_mix(x[i] + off, anchor + off, alpha, count);
}

/* run_fragment.c's sequence with the library calls; every node starts at 0. */
static void run_fragments(const sim_opts_t *o, sim_out_t *out) {
  float x[NODES][DIM] = {{0}}, v[NODES][DIM] = {{0}}, upd[2][NODES][DIM];
  float anchor[DIM] = {0}, mom[DIM] = {0};
  for (unsigned r = 1; r <= o->rounds; r++) {
    size_t off, count;
    td_fragment_span(DIM, o->parts, r, &off, &count);
    for (unsigned i = 0; i < NODES; i++) {
      inner_f(x[i], v[i], i, o);
      td_fragment_delta(upd[r % 2][i], x[i], anchor, DIM, off, count);
    }
    if (!o->overlap) {
      apply_fragment(o, r, upd[r % 2], anchor, mom, x, 0);
    } else {
      if (r > 1) /* round r - 1's average arrived */
        apply_fragment(o, r - 1, upd[(r - 1) % 2], anchor, mom, x, o->alpha);
      if (r == o->rounds) /* the last waits for its own */
        apply_fragment(o, r, upd[r % 2], anchor, mom, x, 0);
    }
  }
  for (unsigned i = 0; i < NODES; i++)
    memcpy(x[i], anchor, sizeof anchor); /* every node ends on the anchor */
  memcpy(out->anchor, anchor, sizeof anchor);
  memcpy(out->params, x, sizeof x);
}

/* The fragment of coordinate d of DIM cut into `parts` equal contiguous
 * slices, the first DIM % parts one longer, found by walking the slices. */
static unsigned fragment_of_coordinate(unsigned d, unsigned parts) {
  unsigned p = 0, end = 0;
  for (; p < parts; p++) {
    end += DIM / parts + (p < DIM % parts ? 1 : 0);
    if (d < end)
      break;
  }
  return p;
}

/* The published rule, naively in double precision (see the file's top).
 * theta: the global model; b: the outer momentum; in overlap mode a
 * fragment's new theta reaches the workers at the end of the next round. */
static void run_reference(const sim_opts_t *o, double theta_out[DIM], double *spread) {
  double x[NODES][DIM] = {{0}}, v[NODES][DIM] = {{0}}, theta[DIM] = {0}, b[DIM] = {0};
  bool pending = false;
  unsigned pending_p = 0;
  double pending_delta[DIM] = {0};
  for (unsigned r = 1; r <= o->rounds; r++) {
    for (unsigned i = 0; i < NODES; i++)
      inner_d(x[i], v[i], i, o);
    unsigned p = r % o->parts;
    double delta[DIM] = {0}; /* outer gradient of fragment p: mean (theta - x) */
    for (unsigned d = 0; d < DIM; d++)
      if (fragment_of_coordinate(d, o->parts) == p)
        for (unsigned i = 0; i < NODES; i++)
          delta[d] += (theta[d] - x[i][d]) / NODES;
    /* in overlap mode the previous round's fragment lands now; in sync
     * mode this round's, and so does the last round's in both */
    for (int pass = 0; pass < 2; pass++) {
      bool now = pass == 0 ? o->overlap && pending : !o->overlap || r == o->rounds;
      if (!now)
        continue;
      unsigned q = pass == 0 ? pending_p : p;
      const double *g = pass == 0 ? pending_delta : delta;
      double mix = pass == 0 ? o->alpha : 0;
      for (unsigned d = 0; d < DIM; d++) {
        if (fragment_of_coordinate(d, o->parts) != q)
          continue;
        b[d] = o->outer_mom * b[d] + g[d];
        double step = o->outer_nesterov ? g[d] + o->outer_mom * b[d] : b[d];
        theta[d] -= step;
        for (unsigned i = 0; i < NODES; i++)
          x[i][d] = mix * x[i][d] + (1 - mix) * theta[d];
      }
    }
    pending = o->overlap;
    pending_p = p;
    memcpy(pending_delta, delta, sizeof delta);
    if (spread != NULL && r + 1 == o->rounds) { /* at the start of the last round */
      *spread = 0;
      for (unsigned d = 0; d < DIM; d++) {
        double mean = 0;
        for (unsigned i = 0; i < NODES; i++)
          mean += x[i][d] / NODES;
        for (unsigned i = 0; i < NODES; i++)
          *spread = fmax(*spread, fabs(x[i][d] - mean));
      }
    }
  }
  memcpy(theta_out, theta, sizeof theta);
}

static double cbar(void) {
  double c = 0;
  for (unsigned i = 0; i < NODES; i++)
    c += OPT[i] / NODES;
  return c;
}

START_TEST(fragments_match_the_published_rule) {
  const sim_opts_t cases[] = {
      {.overlap = false, .parts = 1, .steps = 3, .rounds = 30, .mom = 0.5},
      {.overlap = false, .parts = 2, .steps = 3, .rounds = 30, .mom = 0.5},
      {.overlap = false, .parts = 3, .steps = 4, .rounds = 31, .mom = 0.5, .outer_mom = 0.6},
      {.overlap = true, .parts = 2, .steps = 3, .rounds = 30, .mom = 0.5, .alpha = 0.5},
      {.overlap = true, .parts = 4, .steps = 3, .rounds = 33, .mom = 0.5, .alpha = 0.5},
      {.overlap = true, .parts = 5, .steps = 2, .rounds = 40, .mom = 0.5, .alpha = 0.3,
       .outer_mom = 0.5, .outer_nesterov = true},
      {.overlap = true, .parts = 2, .steps = 3, .rounds = 30, .mom = 0.5, .alpha = 0},
  };
  for (unsigned k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const sim_opts_t *o = &cases[k];
    sim_out_t got;
    double want[DIM];
    run_fragments(o, &got);
    run_reference(o, want, NULL);
    for (unsigned d = 0; d < DIM; d++) {
      ck_assert_msg(fabs(got.anchor[d] - want[d]) < 1e-4 * (1 + fabs(want[d])),
                    "case %u coordinate %u: anchor %g, reference %g", k, d, got.anchor[d],
                    want[d]);
      for (unsigned i = 0; i < NODES; i++)
        ck_assert(got.params[i][d] == got.anchor[d]);
    }
    /* 30 rounds are enough to get near the optimum: the reference is not trivial */
    ck_assert_msg(fabs(want[0]) > 0.1, "case %u: the run moved", k);
  }
}
END_TEST

/* P = 1 in sync mode: the fragment's update, step and mix are the whole
 * model's, float for float, as td__compute_apply_round computes them (delta
 * from the anchor, outer step on the average, anchor += step, params =
 * anchor). */
START_TEST(one_fragment_is_the_whole_model_sync_step) {
  sim_opts_t o = {.parts = 1, .steps = 8, .rounds = 40, .mom = 0.9, .outer_mom = 0.7,
                  .outer_nesterov = true};
  sim_out_t got;
  run_fragments(&o, &got);
  float x[NODES][DIM] = {{0}}, v[NODES][DIM] = {{0}}, anchor[DIM] = {0}, mom[DIM] = {0};
  td_outer_opts_t oo = outer_of(&o);
  for (unsigned r = 1; r <= o.rounds; r++) {
    float avg[DIM] = {0};
    for (unsigned i = 0; i < NODES; i++) {
      inner_f(x[i], v[i], i, &o);
      for (unsigned d = 0; d < DIM; d++)
        avg[d] += (x[i][d] - anchor[d]) / NODES;
    }
    td_outer_step(&oo, avg, mom, avg, DIM);
    for (unsigned d = 0; d < DIM; d++)
      anchor[d] += avg[d];
    for (unsigned i = 0; i < NODES; i++)
      memcpy(x[i], anchor, sizeof anchor);
  }
  ck_assert(memcmp(got.anchor, anchor, sizeof anchor) == 0);
}
END_TEST

/* Momentum 0.9 and H = 8, where a guess of the step in flight diverged in
 * the stiff coordinates (lr x curvature 0.3 to 1) and overlap's default
 * pull holds (test_overlap). Fragments in sync mode converge in every
 * direction at P = 2 and 4 (each slice is DiLoCo with P x H steps); in
 * overlap mode with the default alpha 0.5 the reference and the library
 * agree, and both converge. */
START_TEST(fragments_in_the_stiff_directions) {
  const unsigned parts[] = {2, 4};
  for (int overlap = 0; overlap < 2; overlap++)
    for (unsigned k = 0; k < sizeof parts / sizeof parts[0]; k++) {
      sim_opts_t o = {.overlap = overlap, .parts = parts[k], .steps = 8, .rounds = 300,
                      .mom = 0.9, .alpha = TD_FRAGMENT_ALPHA_DEFAULT};
      sim_out_t got;
      double want[DIM], spread;
      run_fragments(&o, &got);
      run_reference(&o, want, &spread);
      for (unsigned d = 0; d < DIM; d++) {
        ck_assert_msg(fabs(got.anchor[d] - cbar()) < 1e-3,
                      "%s P %u coordinate %u (lr a %g): %g", overlap ? "overlap" : "sync",
                      o.parts, d, CURV[d], got.anchor[d]);
        ck_assert_msg(fabs(want[d] - cbar()) < 1e-3, "reference, coordinate %u: %g", d,
                      want[d]);
      }
      ck_assert_msg(spread < 10, "%s P %u: spread %g", overlap ? "overlap" : "sync", o.parts,
                    spread);
    }
}
END_TEST

static Suite *fragment_suite(void) {
  Suite *s = suite_create("fragment");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, slices_cover_the_model_once);
  tcase_add_test(tc, update_and_mix_hand_values);
  tcase_add_test(tc, fragments_match_the_published_rule);
  tcase_add_test(tc, one_fragment_is_the_whole_model_sync_step);
  tcase_add_test(tc, fragments_in_the_stiff_directions);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(fragment_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
