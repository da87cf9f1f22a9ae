/* test_ring.c: the ring all-reduce's arithmetic (scheduler/ring.h). The
 * order is a permutation that starts at 0, the same on every call; up to
 * TD_RING_EXACT_MAX members it is the brute-force optimum of (largest hop,
 * sum); one slow node's slow links never sit back to back where they need
 * not; above the exact limit it is never worse than the identity or nearest
 * neighbour, and usually finds a planted ring of cheap links. The chunks
 * tile the vector; what p sends at each step is what p + 1 expects, no
 * contribution is counted twice, and a whole all-reduce of float vectors
 * run with nothing but these functions leaves every position with the same
 * bits, the sum of all. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/rng.h"
#include "scheduler/ring.h"

#define N_TEST 40 /* the largest matrix most cases build */
#define FAST 1.0
#define SLOW 100.0

static double *matrix(size_t n) {
  double *cost = calloc(n * n, sizeof *cost);
  ck_assert_ptr_nonnull(cost);
  return cost;
}

/* Off-diagonal costs uniform in [1, 2), or drawn from {1, 2, 3} when
 * few_values (ties everywhere, for the tie-breaking). */
static double *random_matrix(td_rng_t *rng, size_t n, bool few_values) {
  double *cost = matrix(n);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++)
      if (i != j)
        cost[i * n + j] = few_values ? 1.0 + td_rng_below(rng, 3) : 1.0 + td_rng_uniform(rng);
  return cost;
}

static bool lex_better(double bottleneck_a, double sum_a, double bottleneck_b, double sum_b) {
  return bottleneck_a < bottleneck_b || (bottleneck_a == bottleneck_b && sum_a < sum_b);
}

static void assert_tour(const size_t *order, size_t n) {
  bool seen[TD_RING_N_MAX] = {false};
  ck_assert_uint_eq(order[0], 0);
  for (size_t k = 0; k < n; k++) {
    ck_assert_uint_lt(order[k], n);
    ck_assert_msg(!seen[order[k]], "n %zu: member %zu twice", n, order[k]);
    seen[order[k]] = true;
  }
}

/* The next permutation of a[1..n-1] in lexicographic order; false after the last. */
static bool next_tour(size_t *a, size_t n) {
  size_t i = n - 1;
  while (i > 1 && a[i - 1] > a[i])
    i--;
  if (i <= 1)
    return false;
  size_t j = n - 1;
  while (a[j] < a[i - 1])
    j--;
  size_t t = a[i - 1];
  a[i - 1] = a[j];
  a[j] = t;
  for (size_t lo = i, hi = n - 1; lo < hi; lo++, hi--) {
    t = a[lo];
    a[lo] = a[hi];
    a[hi] = t;
  }
  return true;
}

static void identity(size_t *order, size_t n) {
  for (size_t k = 0; k < n; k++)
    order[k] = k;
}

/* Slow hops that follow one another around the tour. */
static size_t slow_pairs(const double *cost, size_t n, const size_t *order) {
  size_t pairs = 0;
  for (size_t k = 0; k < n; k++) {
    double in = cost[order[k] * n + order[(k + 1) % n]];
    double out = cost[order[(k + 1) % n] * n + order[(k + 2) % n]];
    pairs += in == SLOW && out == SLOW;
  }
  return pairs;
}

static void nearest_neighbour(const double *cost, size_t n, size_t *order) {
  bool used[TD_RING_N_MAX] = {true};
  order[0] = 0;
  for (size_t k = 1; k < n; k++) {
    size_t pick = n;
    for (size_t j = 1; j < n; j++)
      if (!used[j] && (pick == n || cost[order[k - 1] * n + j] < cost[order[k - 1] * n + pick]))
        pick = j;
    used[pick] = true;
    order[k] = pick;
  }
}

START_TEST(small_rings_and_known_costs) {
  size_t order[4] = {9, 9, 9, 9};
  double one = 0;
  ck_assert_int_eq(td_ring_order(&one, 1, order), 0);
  ck_assert_uint_eq(order[0], 0);
  double two[4] = {0, 5, 7, 0};
  ck_assert_int_eq(td_ring_order(two, 2, order), 0);
  ck_assert_uint_eq(order[0], 0);
  ck_assert_uint_eq(order[1], 1);
  double bottleneck, sum;
  td_ring_tour_cost(two, 2, order, &bottleneck, &sum);
  ck_assert(bottleneck == 7 && sum == 12);
  /* a directed ring 0 -> 1 -> 2 -> 3 -> 0 of cost 1, 10 elsewhere: the
   * reverse direction is the worst tour, and the transpose picks it */
  double ring[16], back[16];
  for (size_t i = 0; i < 4; i++)
    for (size_t j = 0; j < 4; j++)
      ring[i * 4 + j] = back[j * 4 + i] = j == (i + 1) % 4 ? 1 : 10;
  ck_assert_int_eq(td_ring_order(ring, 4, order), 0);
  const size_t forward[4] = {0, 1, 2, 3}, reverse[4] = {0, 3, 2, 1};
  ck_assert(memcmp(order, forward, sizeof forward) == 0);
  td_ring_tour_cost(ring, 4, reverse, &bottleneck, &sum);
  ck_assert(bottleneck == 10 && sum == 40);
  ck_assert_int_eq(td_ring_order(back, 4, order), 0);
  ck_assert(memcmp(order, reverse, sizeof reverse) == 0);
  ck_assert_uint_eq(td_ring_position(reverse, 4, 3), 1);
  ck_assert_uint_eq(td_ring_position(reverse, 4, 4), 4);
}
END_TEST

START_TEST(tours_are_permutations_and_repeat) {
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  for (size_t n = 1; n <= N_TEST; n++)
    for (int trial = 0; trial < 3; trial++) {
      double *cost = random_matrix(&rng, n, trial == 2);
      size_t order[N_TEST], again[N_TEST];
      ck_assert_int_eq(td_ring_order(cost, n, order), 0);
      assert_tour(order, n);
      ck_assert_int_eq(td_ring_order(cost, n, again), 0);
      ck_assert_msg(memcmp(order, again, n * sizeof order[0]) == 0, "n %zu: two orders", n);
      for (size_t p = 0; p < n; p++)
        ck_assert_uint_eq(td_ring_position(order, n, order[p]), p);
      free(cost);
    }
}
END_TEST

/* The best (bottleneck, sum) over all (n - 1)! tours. */
static void brute_force(const double *cost, size_t n, double *bottleneck, double *sum) {
  size_t a[TD_RING_EXACT_MAX];
  identity(a, n);
  *bottleneck = INFINITY;
  *sum = INFINITY;
  do {
    double b, s;
    td_ring_tour_cost(cost, n, a, &b, &s);
    if (lex_better(b, s, *bottleneck, *sum)) {
      *bottleneck = b;
      *sum = s;
    }
  } while (next_tour(a, n));
}

START_TEST(exact_orders_match_brute_force) {
  td_rng_t rng;
  td_rng_seed(&rng, 2);
  for (size_t n = 3; n <= TD_RING_EXACT_MAX; n++) {
    int trials = n <= 8 ? 24 : 2;
    for (int trial = 0; trial < trials; trial++) {
      double *cost = random_matrix(&rng, n, trial % 2 == 1);
      size_t order[TD_RING_EXACT_MAX];
      ck_assert_int_eq(td_ring_order(cost, n, order), 0);
      assert_tour(order, n);
      double b, s, best_b, best_s;
      td_ring_tour_cost(cost, n, order, &b, &s);
      brute_force(cost, n, &best_b, &best_s);
      ck_assert_msg(b == best_b, "n %zu trial %d: bottleneck %.17g, best %.17g", n, trial, b,
                    best_b);
      ck_assert_msg(fabs(s - best_s) <= 1e-12 * best_s, "n %zu trial %d: sum %.17g, best %.17g",
                    n, trial, s, best_s);
      free(cost);
    }
  }
}
END_TEST

/* Fast links but for some of node x's uplinks (up), downlinks (down) or
 * both, which are slow, each with probability p; with keep_fast, one uplink
 * and one downlink of x (to different peers) stay fast. */
static double *one_slow_node(td_rng_t *rng, size_t n, size_t x, bool up, bool down, double p,
                             bool keep_fast) {
  double *cost = matrix(n);
  size_t fast_out = (x + 1 + td_rng_below(rng, (uint32_t)(n - 1))) % n, fast_in = fast_out;
  while (fast_in == fast_out || fast_in == x)
    fast_in = td_rng_below(rng, (uint32_t)n);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      bool slow = ((up && i == x) || (down && j == x)) && td_rng_uniform(rng) < p;
      if (keep_fast && ((i == x && j == fast_out) || (i == fast_in && j == x)))
        slow = false;
      cost[i * n + j] = i == j ? 0 : slow ? SLOW : FAST;
    }
  return cost;
}

START_TEST(one_slow_node_never_gets_two_slow_hops_in_a_row) {
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  const double density[] = {0.3, 0.7, 1.0};
  for (size_t n = 3; n <= 8; n++) /* brute force says whether it can be avoided */
    for (size_t x = 0; x < n; x += 2)
      for (int mode = 0; mode < 3; mode++)
        for (int d = 0; d < 3; d++) {
          double *cost = one_slow_node(&rng, n, x, mode != 1, mode != 0, density[d], false);
          size_t order[8], a[8];
          ck_assert_int_eq(td_ring_order(cost, n, order), 0);
          bool avoidable = false;
          identity(a, n);
          do
            avoidable = slow_pairs(cost, n, a) == 0;
          while (!avoidable && next_tour(a, n));
          if (avoidable)
            ck_assert_msg(slow_pairs(cost, n, order) == 0, "n %zu node %zu mode %d", n, x, mode);
          free(cost);
        }
  for (size_t n = 16; n <= 32; n += 16) /* the heuristic, on cases that can avoid it */
    for (size_t x = 0; x < n; x += 5)
      for (int mode = 0; mode < 3; mode++)
        for (int d = 0; d < 3; d++) {
          bool keep_fast = mode == 2 && d == 2; /* else some fast link is left */
          double *cost = one_slow_node(&rng, n, x, mode != 1, mode != 0, density[d], keep_fast);
          size_t order[32];
          ck_assert_int_eq(td_ring_order(cost, n, order), 0);
          assert_tour(order, n);
          ck_assert_msg(slow_pairs(cost, n, order) == 0, "n %zu node %zu mode %d density %g", n,
                        x, mode, density[d]);
          /* with a fast link in and a fast link out to different peers, no slow hop at all */
          double b, s;
          td_ring_tour_cost(cost, n, order, &b, &s);
          if (mode == 2 && keep_fast)
            ck_assert_msg(b == FAST, "n %zu node %zu: a slow hop it could avoid", n, x);
          free(cost);
        }
}
END_TEST

/* A directed ring of cost 1 through the members in a random order, 10
 * elsewhere: the heuristic finds it, and on the transpose its reverse. */
START_TEST(asymmetric_costs_pick_the_direction) {
  td_rng_t rng;
  td_rng_seed(&rng, 4);
  for (size_t n = 16; n <= N_TEST; n += 24) {
    uint32_t hidden[N_TEST];
    for (size_t k = 0; k < n; k++)
      hidden[k] = (uint32_t)k;
    td_rng_shuffle_u32(&rng, hidden + 1, n - 1);
    double *cost = matrix(n), *transpose = matrix(n);
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < n; j++)
        cost[i * n + j] = transpose[j * n + i] = i == j ? 0 : 10;
    for (size_t k = 0; k < n; k++)
      cost[hidden[k] * n + hidden[(k + 1) % n]] = transpose[hidden[(k + 1) % n] * n + hidden[k]] =
          1;
    size_t order[N_TEST], back[N_TEST];
    ck_assert_int_eq(td_ring_order(cost, n, order), 0);
    ck_assert_int_eq(td_ring_order(transpose, n, back), 0);
    for (size_t k = 0; k < n; k++) {
      ck_assert_uint_eq(order[k], hidden[k]);
      ck_assert_uint_eq(back[k], hidden[(n - k) % n]);
    }
    double b, s;
    td_ring_tour_cost(cost, n, back, &b, &s);
    ck_assert(b == 10);
    free(cost);
    free(transpose);
  }
}
END_TEST

/* A ring of cheap links (cost in [1, 2)) hidden among dear ones ([5, 6)),
 * each member with one cheap decoy link besides. Above the exact limit the
 * heuristic proves nothing, but it should find a cheap ring in most of these
 * cases: it does in 89 of the 120 below, where one nearest-neighbour start
 * alone finds 33 (sparse cheap rings like these are mostly missed from
 * n = 24 on). */
START_TEST(planted_cheap_ring_is_usually_found) {
  td_rng_t rng;
  td_rng_seed(&rng, 7);
  int found = 0, trials = 0;
  for (size_t n = 11; n <= 16; n++)
    for (int trial = 0; trial < 20; trial++, trials++) {
      uint32_t hidden[16];
      for (size_t k = 0; k < n; k++)
        hidden[k] = (uint32_t)k;
      td_rng_shuffle_u32(&rng, hidden + 1, n - 1);
      double *cost = matrix(n);
      for (size_t i = 0; i < n * n; i++)
        cost[i] = 5 + td_rng_uniform(&rng);
      for (size_t k = 0; k < n; k++) {
        cost[hidden[k] * n + hidden[(k + 1) % n]] = 1 + td_rng_uniform(&rng);
        cost[hidden[k] * n + td_rng_below(&rng, (uint32_t)n)] = 1 + td_rng_uniform(&rng);
      }
      size_t order[16];
      double b, s;
      ck_assert_int_eq(td_ring_order(cost, n, order), 0);
      td_ring_tour_cost(cost, n, order, &b, &s);
      found += b < 2;
      free(cost);
    }
  ck_assert_msg(found * 5 >= trials * 3, "a cheap ring in %d of %d", found, trials);
}
END_TEST

START_TEST(heuristic_beats_identity_and_nearest_neighbour) {
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  const size_t sizes[] = {11, 12, 13, 16, 20, 25, 31, 40, 64, 100, 256};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++)
    for (int trial = 0; trial < (sizes[t] <= 40 ? 6 : 1); trial++) {
      size_t n = sizes[t];
      double *cost = random_matrix(&rng, n, trial % 3 == 2);
      size_t order[TD_RING_N_MAX], plain[TD_RING_N_MAX], nn[TD_RING_N_MAX];
      ck_assert_int_eq(td_ring_order(cost, n, order), 0);
      assert_tour(order, n);
      identity(plain, n);
      nearest_neighbour(cost, n, nn);
      double b, s, plain_b, plain_s, nn_b, nn_s;
      td_ring_tour_cost(cost, n, order, &b, &s);
      td_ring_tour_cost(cost, n, plain, &plain_b, &plain_s);
      td_ring_tour_cost(cost, n, nn, &nn_b, &nn_s);
      ck_assert_msg(!lex_better(plain_b, plain_s, b, s), "n %zu: worse than the identity", n);
      ck_assert_msg(!lex_better(nn_b, nn_s, b, s), "n %zu: worse than nearest neighbour", n);
      free(cost);
    }
}
END_TEST

START_TEST(chunks_tile_the_vector) {
  const size_t lens[] = {0, 1, 2, 5, 7, 100, 1001};
  for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
    for (size_t n = 1; n <= 20; n++) {
      size_t len = lens[l], end = 0;
      for (size_t c = 0; c < n; c++) {
        size_t off, cnt;
        td_ring_chunk(len, n, c, &off, &cnt);
        ck_assert_uint_eq(off, end);
        ck_assert_uint_eq(cnt, len / n + (c < len % n));
        end = off + cnt;
      }
      ck_assert_uint_eq(end, len);
      size_t off, cnt;
      td_ring_chunk(len, n, n, &off, &cnt);
      ck_assert(off == len && cnt == 0);
    }
}
END_TEST

/* For every n up to 20 and every step: p's send is p + 1's receive, the
 * sends of a step are n different chunks, and, following which members'
 * contributions each copy of each chunk holds, no addition counts one twice,
 * p owns the whole sum of td_ring_owned_chunk(n, p) after the
 * reduce-scatter, and every copy is whole at the end. */
START_TEST(schedule_is_consistent) {
  for (size_t n = 1; n <= 20; n++) {
    uint32_t holds[20][20], sent[20], full = (uint32_t)((1u << n) - 1);
    for (size_t p = 0; p < n; p++)
      for (size_t c = 0; c < n; c++)
        holds[p][c] = 1u << p;
    for (size_t s = 0; s < TD_RING_STEPS(n); s++) {
      ck_assert_int_eq(td_ring_step_adds(n, s), s < n - 1);
      uint32_t chunks = 0;
      for (size_t p = 0; p < n; p++) {
        size_t out = td_ring_send_chunk(n, p, s);
        ck_assert_uint_lt(out, n);
        ck_assert_uint_eq(out, td_ring_recv_chunk(n, (p + 1) % n, s));
        chunks |= 1u << out;
        sent[p] = holds[p][out];
      }
      ck_assert_uint_eq(chunks, full);
      for (size_t p = 0; p < n; p++) {
        size_t in = td_ring_recv_chunk(n, p, s);
        uint32_t got = sent[(p + n - 1) % n];
        if (td_ring_step_adds(n, s)) {
          ck_assert_msg((got & holds[p][in]) == 0, "n %zu step %zu: counted twice", n, s);
          holds[p][in] |= got;
        } else {
          holds[p][in] = got;
        }
      }
      if (s == n - 2)
        for (size_t p = 0; p < n; p++)
          ck_assert_uint_eq(holds[p][td_ring_owned_chunk(n, p)], full);
    }
    for (size_t p = 0; p < n; p++)
      for (size_t c = 0; c < n; c++)
        ck_assert_msg(holds[p][c] == full, "n %zu: position %zu chunk %zu incomplete", n, p, c);
    ck_assert_uint_eq(td_ring_send_chunk(n, n, 0), n);
    ck_assert_uint_eq(td_ring_recv_chunk(n, 0, TD_RING_STEPS(n)), n);
  }
}
END_TEST

/* A whole all-reduce of float vectors: member m's vector sits at its ring
 * position; each step takes every send from the state before it, then
 * applies every receive. */
static void all_reduce(td_rng_t *rng, size_t n, size_t len) {
  double *cost = random_matrix(rng, n, false);
  size_t order[16];
  ck_assert_int_eq(td_ring_order(cost, n, order), 0);
  float *buf = malloc(n * len * sizeof *buf + 1), *msg = malloc(n * len * sizeof *msg + 1);
  double *want = calloc(len + 1, sizeof *want), *scale = calloc(len + 1, sizeof *scale);
  ck_assert(buf && msg && want && scale);
  for (size_t m = 0; m < n; m++) {
    float *mine = buf + td_ring_position(order, n, m) * len;
    for (size_t i = 0; i < len; i++) {
      mine[i] = (float)(2 * td_rng_uniform(rng) - 1);
      want[i] += mine[i];
      scale[i] += fabs(mine[i]);
    }
  }
  for (size_t s = 0; s < TD_RING_STEPS(n); s++) {
    for (size_t p = 0; p < n; p++) {
      size_t off, cnt;
      td_ring_chunk(len, n, td_ring_send_chunk(n, p, s), &off, &cnt);
      memcpy(msg + p * len, buf + p * len + off, cnt * sizeof *msg);
    }
    for (size_t p = 0; p < n; p++) {
      size_t off, cnt, from = (p + n - 1) % n;
      td_ring_chunk(len, n, td_ring_recv_chunk(n, p, s), &off, &cnt);
      for (size_t i = 0; i < cnt; i++)
        buf[p * len + off + i] = td_ring_step_adds(n, s)
                                     ? msg[from * len + i] + buf[p * len + off + i]
                                     : msg[from * len + i];
    }
    if (s == n - 2) /* the reduce-scatter is over: each owns one chunk's sum */
      for (size_t p = 0; p < n; p++) {
        size_t off, cnt;
        td_ring_chunk(len, n, td_ring_owned_chunk(n, p), &off, &cnt);
        for (size_t i = off; i < off + cnt; i++)
          ck_assert(fabs(buf[p * len + i] - want[i]) <= 1e-5 * scale[i]);
      }
  }
  for (size_t p = 0; p < n; p++)
    ck_assert_msg(memcmp(buf, buf + p * len, len * sizeof *buf) == 0,
                  "n %zu len %zu: position %zu ends with other bits", n, len, p);
  for (size_t i = 0; i < len; i++)
    ck_assert_msg(fabs(buf[i] - want[i]) <= 1e-5 * scale[i], "n %zu len %zu [%zu]: %g, want %g",
                  n, len, i, buf[i], want[i]);
  free(buf);
  free(msg);
  free(want);
  free(scale);
  free(cost);
}

START_TEST(all_reduce_gives_every_position_the_same_sum) {
  td_rng_t rng;
  td_rng_seed(&rng, 6);
  const size_t sizes[] = {2, 3, 4, 5, 6, 7, 8, 9, 16};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    all_reduce(&rng, sizes[t], 1000);
    all_reduce(&rng, sizes[t], 3);
    all_reduce(&rng, sizes[t], sizes[t] + 1);
  }
}
END_TEST

START_TEST(bad_input_is_refused) {
  size_t order[TD_RING_N_MAX + 1] = {7, 7, 7};
  double *big = matrix(TD_RING_N_MAX + 1);
  ck_assert_int_eq(td_ring_order(big, TD_RING_N_MAX + 1, order), -1);
  ck_assert_int_eq(td_ring_order(big, 0, order), -1);
  ck_assert_int_eq(td_ring_order(NULL, 3, order), -1);
  ck_assert_int_eq(td_ring_order(big, 3, NULL), -1);
  free(big);
  const double bad[] = {NAN, -1.0, INFINITY, -INFINITY};
  for (size_t n = 3; n <= 12; n += 9)
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      double *cost = matrix(n);
      for (size_t i = 0; i < n * n; i++)
        cost[i] = 1;
      cost[0] = bad[b]; /* the diagonal is ignored */
      ck_assert_int_eq(td_ring_order(cost, n, order), 0);
      cost[(n - 1) * n + 1] = bad[b];
      order[0] = 7;
      ck_assert_msg(td_ring_order(cost, n, order) == -1, "n %zu accepted %g", n, bad[b]);
      ck_assert_uint_eq(order[0], 7);
      free(cost);
    }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ring");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, small_rings_and_known_costs);
  tcase_add_test(tc, tours_are_permutations_and_repeat);
  tcase_add_test(tc, exact_orders_match_brute_force);
  tcase_add_test(tc, one_slow_node_never_gets_two_slow_hops_in_a_row);
  tcase_add_test(tc, asymmetric_costs_pick_the_direction);
  tcase_add_test(tc, planted_cheap_ring_is_usually_found);
  tcase_add_test(tc, heuristic_beats_identity_and_nearest_neighbour);
  tcase_add_test(tc, chunks_tile_the_vector);
  tcase_add_test(tc, schedule_is_consistent);
  tcase_add_test(tc, all_reduce_gives_every_position_the_same_sum);
  tcase_add_test(tc, bad_input_is_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
