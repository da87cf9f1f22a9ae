/* test_topology.c: the exchange topologies. Every node derives the same
 * partners from the same numbers; what one sends is exactly what the other
 * mixes; the mixing matrix with equal weights is doubly stochastic (so the
 * network mean is kept); one-peer exponential gossip on a power of two and
 * groups on a full grid reach the exact mean in tau (d) rounds, checked
 * against the closed form (1/n) 1 1^T; and consensus distance falls. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "scheduler/topology.h"

#define NMAX 70

static td_topology_t topo(const char *text) {
  td_topology_t t;
  char why[200];
  ck_assert_msg(td_topology_parse(&t, text, why, sizeof why) == 0, "%s: %s", text, why);
  return t;
}

START_TEST(parses_and_refuses) {
  ck_assert_int_eq(topo("mesh").kind, TD_TOPO_MESH);
  ck_assert_int_eq(topo("auto").kind, TD_TOPO_AUTO);
  td_topology_t g = topo("gossip:2");
  ck_assert_int_eq(g.kind, TD_TOPO_GOSSIP);
  ck_assert_uint_eq(g.k, 2);
  ck_assert_uint_eq(topo("groups:8").k, 8);
  const char *bad[] = {"ring:", "gossip:", "gossip:0", "gossip:-1", "groups:1", "groups:x",
                       "gossip:1x", "groups:65", "", "Mesh"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    td_topology_t t;
    char why[200] = "";
    ck_assert_msg(td_topology_parse(&t, bad[i], why, sizeof why) != 0, "accepted '%s'", bad[i]);
    ck_assert_msg(strstr(why, "topology") != NULL, "'%s': %s", bad[i], why);
  }
}
END_TEST

START_TEST(auto_is_the_mesh_for_few_members) {
  td_topology_t a = topo("auto");
  ck_assert_int_eq(td_topology_at(&a, 8).kind, TD_TOPO_MESH);
  ck_assert_int_eq(td_topology_at(&a, 9).kind, TD_TOPO_GROUPS);
  td_topology_t g = topo("groups:8");
  ck_assert_int_eq(td_topology_at(&g, 8).kind, TD_TOPO_MESH); /* one group of all */
  td_topology_t one = topo("gossip:1");
  ck_assert_int_eq(td_topology_at(&one, 2).kind, TD_TOPO_MESH);
  size_t out[NMAX];
  ck_assert_uint_eq(td_topology_sends(&one, 1, 5, 2, 0, out), 1);
  ck_assert_uint_eq(out[0], 1);
}
END_TEST

static const char *const kinds[] = {"mesh", "gossip:1", "gossip:2", "gossip:3", "groups:2",
                                    "groups:3", "groups:4", "groups:8", "auto"};

/* j in sends(i) <=> i in receives(j); no self, no repeats; the same twice. */
START_TEST(sends_and_receives_match) {
  for (size_t t = 0; t < sizeof kinds / sizeof kinds[0]; t++) {
    td_topology_t tp = topo(kinds[t]);
    for (size_t n = 1; n <= NMAX; n += (n < 20 ? 1 : 7))
      for (uint64_t round = 1; round <= 9; round++) {
        static unsigned char sends[NMAX][NMAX], recvs[NMAX][NMAX];
        memset(sends, 0, sizeof sends);
        memset(recvs, 0, sizeof recvs);
        for (size_t i = 0; i < n; i++) {
          size_t out[NMAX], again[NMAX];
          size_t k = td_topology_sends(&tp, 77, round, n, i, out);
          ck_assert_uint_eq(td_topology_sends(&tp, 77, round, n, i, again), k);
          ck_assert(memcmp(out, again, k * sizeof out[0]) == 0);
          for (size_t m = 0; m < k; m++) {
            ck_assert_uint_lt(out[m], n);
            ck_assert_uint_ne(out[m], i);
            ck_assert_msg(!sends[i][out[m]], "%s n %zu: %zu sends twice to %zu", kinds[t], n,
                          i, out[m]);
            sends[i][out[m]] = 1;
          }
          k = td_topology_receives(&tp, 77, round, n, i, out);
          for (size_t m = 0; m < k; m++) {
            ck_assert_uint_ne(out[m], i);
            recvs[out[m]][i] = 1; /* i mixes what out[m] sent */
          }
        }
        ck_assert_msg(memcmp(sends, recvs, sizeof sends) == 0, "%s n %zu round %u", kinds[t],
                      n, (unsigned)round);
      }
  }
}
END_TEST

/* W[i][j]: equal weights 1/(receives + 1) over i itself and what it receives. */
static void mixing(const td_topology_t *tp, uint64_t seed, uint64_t round, size_t n,
                   double w[NMAX][NMAX]) {
  memset(w, 0, sizeof(double) * NMAX * NMAX);
  for (size_t i = 0; i < n; i++) {
    size_t in[NMAX];
    size_t k = td_topology_receives(tp, seed, round, n, i, in);
    w[i][i] = 1.0 / (double)(k + 1);
    for (size_t m = 0; m < k; m++)
      w[i][in[m]] = 1.0 / (double)(k + 1);
  }
}

START_TEST(mixing_is_doubly_stochastic) {
  static double w[NMAX][NMAX];
  for (size_t t = 0; t < sizeof kinds / sizeof kinds[0]; t++) {
    td_topology_t tp = topo(kinds[t]);
    for (size_t n = 1; n <= NMAX; n++)
      for (uint64_t round = 1; round <= 6; round++) {
        mixing(&tp, 5, round, n, w);
        for (size_t j = 0; j < n; j++) {
          double row = 0, col = 0;
          for (size_t i = 0; i < n; i++) {
            row += w[j][i];
            col += w[i][j];
          }
          ck_assert_msg(fabs(row - 1) < 1e-12 && fabs(col - 1) < 1e-12,
                        "%s n %zu round %u: row %zu sums %g, column %g", kinds[t], n,
                        (unsigned)round, j, row, col);
        }
      }
  }
}
END_TEST

/* x <- W x for each round in [first, first + rounds), then every x equals the mean. */
static void exact_mean_after(const char *kind, size_t n, uint64_t first, unsigned rounds) {
  td_topology_t tp = topo(kind);
  static double w[NMAX][NMAX];
  double x[NMAX], y[NMAX], mean = 0;
  for (size_t i = 0; i < n; i++) {
    x[i] = (double)((i * 37) % 11) - 3.5;
    mean += x[i] / (double)n;
  }
  for (unsigned r = 0; r < rounds; r++) {
    mixing(&tp, 9, first + r, n, w);
    for (size_t i = 0; i < n; i++) {
      y[i] = 0;
      for (size_t j = 0; j < n; j++)
        y[i] += w[i][j] * x[j];
    }
    memcpy(x, y, n * sizeof x[0]);
  }
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(fabs(x[i] - mean) < 1e-12, "%s n %zu: node %zu holds %g, the mean is %g", kind,
                  n, i, x[i], mean);
}

START_TEST(full_cycles_reach_the_exact_mean) {
  exact_mean_after("gossip:1", 8, 3, 3);  /* tau = 3 consecutive rounds */
  exact_mean_after("gossip:1", 64, 1, 6); /* tau = 6 */
  exact_mean_after("groups:4", 16, 4, 2); /* one grid cycle: rounds 4 and 5 */
  exact_mean_after("groups:8", 64, 6, 2);
  exact_mean_after("groups:2", 32, 10, 5);
}
END_TEST

/* 64 nodes, gossip:1 and groups:8 from spread-out values: the squared
 * consensus distance never grows, falls by at least half over a cycle, and
 * the mean stays where it was. */
START_TEST(consensus_distance_falls_and_the_mean_stays) {
  const char *which[] = {"gossip:1", "groups:8", "groups:3", "gossip:1"};
  const size_t sizes[] = {64, 64, 50, 50};
  static double w[NMAX][NMAX];
  for (size_t t = 0; t < 4; t++) {
    td_topology_t tp = topo(which[t]);
    size_t n = sizes[t];
    double x[NMAX], y[NMAX], mean0 = 0;
    for (size_t i = 0; i < n; i++) {
      x[i] = sin((double)i * 1.7) * 10;
      mean0 += x[i] / (double)n;
    }
    double last = INFINITY, cycle = INFINITY;
    for (uint64_t r = 1; r <= 24; r++) {
      mixing(&tp, 3, r, n, w);
      double mean = 0, cd = 0;
      for (size_t i = 0; i < n; i++) {
        y[i] = 0;
        for (size_t j = 0; j < n; j++)
          y[i] += w[i][j] * x[j];
        mean += y[i] / (double)n;
      }
      memcpy(x, y, n * sizeof x[0]);
      for (size_t i = 0; i < n; i++)
        cd += (x[i] - mean) * (x[i] - mean) / (double)n;
      ck_assert_msg(fabs(mean - mean0) < 1e-9, "%s: the mean moved", which[t]);
      ck_assert_msg(cd <= last + 1e-12, "%s round %u: distance grew %g -> %g", which[t],
                    (unsigned)r, last, cd);
      if (r % 6 == 0) {
        ck_assert_msg(cd < cycle * 0.5 || cd < 1e-12, "%s round %u: %g after %g six rounds "
                      "before", which[t], (unsigned)r, cd, cycle);
        cycle = cd;
      }
      last = cd;
    }
    ck_assert_msg(last < 1e-3, "%s: still %g apart after 24 rounds", which[t], last);
  }
}
END_TEST

START_TEST(groups_move_with_the_seed_and_the_cycle) {
  td_topology_t g = topo("groups:4");
  size_t a[NMAX], b[NMAX];
  size_t ka = td_topology_receives(&g, 1, 1, 40, 0, a);
  bool differs = false;
  for (uint64_t seed = 2; seed < 8 && !differs; seed++) {
    size_t kb = td_topology_receives(&g, seed, 1, 40, 0, b);
    differs = ka != kb || memcmp(a, b, ka * sizeof a[0]) != 0;
  }
  ck_assert_msg(differs, "groups:4 gives node 0 the same group whatever the seed");
  differs = false;
  for (uint64_t round = 4; round < 40 && !differs; round += 3) {
    size_t kb = td_topology_receives(&g, 1, round, 40, 0, b);
    differs = ka != kb || memcmp(a, b, ka * sizeof a[0]) != 0;
  }
  ck_assert_msg(differs, "groups:4 gives node 0 the same group every cycle");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("topology");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, parses_and_refuses);
  tcase_add_test(tc, auto_is_the_mesh_for_few_members);
  tcase_add_test(tc, sends_and_receives_match);
  tcase_add_test(tc, mixing_is_doubly_stochastic);
  tcase_add_test(tc, full_cycles_reach_the_exact_mean);
  tcase_add_test(tc, consensus_distance_falls_and_the_mean_stays);
  tcase_add_test(tc, groups_move_with_the_seed_and_the_cycle);
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
