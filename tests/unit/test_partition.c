/* test_partition.c: how a dataset's rows are split among the nodes
 * (compute/partition.h), as a reader would use it.
 *
 * Specs parse in their four forms and bad ones are refused with a reason; the
 * partitions are disjoint, cover every row, are reproducible from the seed
 * alone, and show the label skew they promise (iid parts within one row of
 * each other, dirichlet skewed by a small alpha, shard giving each node few
 * classes, all giving every node every row). Every node's label counts agree
 * with its own rows, and the held-out share of a test set follows each node's
 * label skew. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/data/partition.h"

enum { P_ROWS = 1000, P_CLASSES = 10, P_NODES = 5 };
static int32_t p_labels[P_ROWS];

static void make_labels(void) {
  for (int i = 0; i < P_ROWS; i++)
    p_labels[i] = (i * 7) % P_CLASSES;
}

static td_partition_t parse_ok(const char *spec) {
  td_partition_t p;
  char why[256] = "";
  ck_assert_msg(td_partition_parse(&p, spec, why, sizeof why) == 0, "%s: %s", spec, why);
  return p;
}

/* How a split came out: per node, the row count and rows per class. */
typedef struct {
  size_t size[P_NODES];
  int per_class[P_NODES][P_CLASSES];
} split_t;

/* Ask every node for its rows; require them ascending, pairwise disjoint and
 * together covering every row exactly once. */
static split_t split_and_check_cover(const char *spec, uint64_t seed) {
  td_partition_t p = parse_ok(spec);
  static int owner[P_ROWS];
  split_t s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < P_ROWS; i++)
    owner[i] = -1;
  for (unsigned k = 0; k < P_NODES; k++) {
    uint32_t *idx = NULL;
    size_t n = 0;
    ck_assert_int_eq(
        td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, k, P_NODES, seed, &idx, &n), 0);
    s.size[k] = n;
    /* plain ifs in the loop, one assertion per problem: ck_assert costs a syscall */
    for (size_t i = 0; i < n; i++) {
      if (idx[i] >= P_ROWS || (i > 0 && idx[i] <= idx[i - 1]))
        ck_abort_msg("%s: node %u: index %u out of range or not ascending", spec, k, idx[i]);
      if (owner[idx[i]] != -1)
        ck_abort_msg("%s: row %u on nodes %d and %u", spec, idx[i], owner[idx[i]], k);
      owner[idx[i]] = (int)k;
      s.per_class[k][p_labels[idx[i]]]++;
    }
    free(idx);
  }
  for (int i = 0; i < P_ROWS; i++)
    if (owner[i] == -1)
      ck_abort_msg("%s: row %d on no node", spec, i);
  return s;
}

/* Mean over nodes of the largest single-class share of a node's rows
 * (0.1 when every node sees all ten classes equally). */
static double node_top_class_share(const split_t *s) {
  double sum = 0;
  for (int k = 0; k < P_NODES; k++) {
    int top = 0;
    for (int c = 0; c < P_CLASSES; c++)
      top = s->per_class[k][c] > top ? s->per_class[k][c] : top;
    sum += s->size[k] > 0 ? (double)top / (double)s->size[k] : 1.0;
  }
  return sum / P_NODES;
}

/* Mean over classes of the share of a class held by its main node
 * (0.2 when each class is spread evenly over five nodes). */
static double class_top_node_share(const split_t *s) {
  double sum = 0;
  for (int c = 0; c < P_CLASSES; c++) {
    int top = 0, total = 0;
    for (int k = 0; k < P_NODES; k++) {
      top = s->per_class[k][c] > top ? s->per_class[k][c] : top;
      total += s->per_class[k][c];
    }
    sum += (double)top / (double)total;
  }
  return sum / P_CLASSES;
}

static int distinct_classes(const split_t *s, int node) {
  int n = 0;
  for (int c = 0; c < P_CLASSES; c++)
    n += s->per_class[node][c] > 0;
  return n;
}

START_TEST(partition_parse_accepts_the_four_forms) {
  ck_assert_int_eq(parse_ok("all").kind, TD_PARTITION_ALL);
  ck_assert_int_eq(parse_ok("iid").kind, TD_PARTITION_IID);
  td_partition_t p = parse_ok("dirichlet:0.5");
  ck_assert_int_eq(p.kind, TD_PARTITION_DIRICHLET);
  ck_assert_double_eq(p.alpha, 0.5);
  ck_assert_double_eq(parse_ok("dirichlet:1e6").alpha, 1e6);
  ck_assert_double_eq(parse_ok("dirichlet:.25").alpha, 0.25);
  p = parse_ok("shard:3");
  ck_assert_int_eq(p.kind, TD_PARTITION_SHARD);
  ck_assert_uint_eq(p.shards_per_node, 3);
  ck_assert_uint_eq(parse_ok("shard:100000").shards_per_node, 100000);
}
END_TEST

START_TEST(partition_parse_rejects_bad_specs_with_a_reason) {
  static const char *bad[] = {"dirichlet:0",   "dirichlet:-1",  "dirichlet:nan", "dirichlet:inf",
                              "dirichlet:",    "dirichlet:1x",  "dirichlet: 1",  "dirichlet:2e6",
                              "dirichlet:1e-999",
                              "shard:0",       "shard:x",       "shard:",        "shard:-2",
                              "shard:1.5",     "shard:100001",  "shard:99999999999999999999",
                              "bogus",         "iid:3",         "all ",          "",
                              "IID"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    td_partition_t p;
    char why[256] = "";
    ck_assert_msg(td_partition_parse(&p, bad[i], why, sizeof why) == TD_ECONFIG, "'%s'", bad[i]);
    ck_assert_msg(why[0] != '\0', "'%s': no reason", bad[i]);
  }
}
END_TEST

START_TEST(partitions_are_disjoint_and_cover_every_row) {
  static const char *specs[] = {"iid", "dirichlet:0.1", "dirichlet:100", "shard:2", "shard:7",
                                "dirichlet:1e-300"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
    for (uint64_t seed = 1; seed <= 3; seed++)
      split_and_check_cover(specs[i], seed);
}
END_TEST

START_TEST(iid_parts_differ_in_size_by_at_most_one) {
  split_t s = split_and_check_cover("iid", 77);
  for (int k = 0; k < P_NODES; k++)
    ck_assert_uint_eq(s.size[k], P_ROWS / P_NODES);
  ck_assert_double_lt(node_top_class_share(&s), 0.2);
  td_partition_t p = parse_ok("iid");
  static const unsigned node_counts[] = {3, 7, 999, 1000, 1001};
  for (size_t t = 0; t < sizeof node_counts / sizeof node_counts[0]; t++) {
    unsigned nodes = node_counts[t];
    size_t lo = SIZE_MAX, hi = 0, total = 0;
    for (unsigned k = 0; k < nodes; k++) {
      uint32_t *idx = NULL;
      size_t n = 0;
      ck_assert_int_eq(
          td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, k, nodes, 5, &idx, &n), 0);
      lo = n < lo ? n : lo;
      hi = n > hi ? n : hi;
      total += n;
      free(idx);
    }
    ck_assert_msg(hi - lo <= 1, "%u nodes: sizes %zu..%zu", nodes, lo, hi);
    ck_assert_uint_eq(total, P_ROWS);
  }
}
END_TEST

START_TEST(dirichlet_small_alpha_skews_labels_large_alpha_does_not) {
  /* Thresholds leave room across seeds: over 2000 seeds, dirichlet:0.1 gave a
   * node-top-share of at least 0.33 and a class-top-share of at least 0.60,
   * dirichlet:100 at most 0.13 and 0.24. */
  for (uint64_t seed = 1; seed <= 3; seed++) {
    split_t skewed = split_and_check_cover("dirichlet:0.1", seed);
    ck_assert_double_gt(node_top_class_share(&skewed), 0.3);
    ck_assert_double_gt(class_top_node_share(&skewed), 0.5);
    split_t even = split_and_check_cover("dirichlet:100", seed);
    ck_assert_double_lt(node_top_class_share(&even), 0.2);
    ck_assert_double_lt(class_top_node_share(&even), 0.3);
  }
  /* alpha so small that every gamma draw underflows: each class goes whole to
   * one node */
  split_t whole = split_and_check_cover("dirichlet:1e-300", 5);
  ck_assert_double_eq(class_top_node_share(&whole), 1.0);
}
END_TEST

START_TEST(shard_gives_each_node_few_classes) {
  for (uint64_t seed = 1; seed <= 5; seed++) {
    split_t s = split_and_check_cover("shard:2", seed);
    for (int k = 0; k < P_NODES; k++) {
      ck_assert_uint_eq(s.size[k], P_ROWS / P_NODES); /* two shards of 100 */
      ck_assert_int_le(distinct_classes(&s, k), 4);
    }
  }
}
END_TEST

START_TEST(partition_depends_on_the_seed_only) {
  static const char *specs[] = {"iid", "dirichlet:0.5", "shard:2"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    td_partition_t p = parse_ok(specs[i]);
    uint32_t *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    const unsigned node = 2;
    ck_assert_int_eq(
        td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, node, P_NODES, 42, &a, &na), 0);
    ck_assert_int_eq(
        td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, node, P_NODES, 42, &b, &nb), 0);
    ck_assert_int_eq(
        td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, node, P_NODES, 43, &c, &nc), 0);
    ck_assert_uint_eq(na, nb);
    ck_assert_mem_eq(a, b, na * sizeof *a);
    ck_assert_msg(na != nc || memcmp(a, c, na * sizeof *a) != 0, "%s ignores the seed",
                  specs[i]);
    free(a);
    free(b);
    free(c);
  }
}
END_TEST

START_TEST(partition_all_gives_every_node_every_row) {
  td_partition_t p = parse_ok("all");
  for (unsigned k = 0; k < 3; k++) {
    uint32_t *idx = NULL;
    size_t n = 0;
    ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, k, 3, 1, &idx, &n), 0);
    ck_assert_uint_eq(n, P_ROWS);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
      wrong += idx[i] != i;
    ck_assert_uint_eq(wrong, 0);
    free(idx);
  }
}
END_TEST

START_TEST(partition_rejects_bad_arguments) {
  td_partition_t p = parse_ok("iid");
  uint32_t *idx = (uint32_t *)&p;
  size_t n = 123;
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 0, 0, 1, &idx, &n),
                   TD_EINVAL);
  ck_assert_ptr_null(idx);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 5, 5, 1, &idx, &n),
                   TD_EINVAL);
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 0, 4097, 1, &idx, &n),
                   TD_EINVAL);
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 4095, 4096, 1, &idx, &n),
                   0);
  free(idx);
  p = parse_ok("dirichlet:1");
  p_labels[3] = P_CLASSES; /* one label outside [0, classes) */
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 0, 5, 1, &idx, &n),
                   TD_ERANGE);
  p_labels[3] = -1;
  ck_assert_int_eq(td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, 0, 5, 1, &idx, &n),
                   TD_ERANGE);
  ck_assert_ptr_null(idx);
  make_labels();
  /* an empty dataset is not an error: every node simply gets nothing */
  ck_assert_int_eq(td_partition_indices(&p, p_labels, 0, P_CLASSES, 0, 5, 1, &idx, &n), 0);
  ck_assert_uint_eq(n, 0);
  free(idx);
}
END_TEST


START_TEST(label_counts_match_each_nodes_own_rows) {
  /* the naive reference: ask every node for its rows and count their labels */
  static const char *const specs[] = {"iid", "dirichlet:0.1", "shard:2", "all"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    td_partition_t p = parse_ok(specs[i]);
    uint64_t counts[P_NODES * P_CLASSES];
    ck_assert_int_eq(
        td_partition_label_counts(&p, p_labels, P_ROWS, P_CLASSES, P_NODES, 7, counts), 0);
    for (unsigned k = 0; k < P_NODES; k++) {
      uint32_t *idx = NULL;
      size_t n = 0;
      ck_assert_int_eq(
          td_partition_indices(&p, p_labels, P_ROWS, P_CLASSES, k, P_NODES, 7, &idx, &n), 0);
      uint64_t naive[P_CLASSES] = {0};
      for (size_t j = 0; j < n; j++)
        naive[p_labels[idx[j]]]++;
      free(idx);
      for (int c = 0; c < P_CLASSES; c++)
        ck_assert_msg(counts[k * P_CLASSES + c] == naive[c], "%s node %u class %d: %llu vs %llu",
                      specs[i], k, c, (unsigned long long)counts[k * P_CLASSES + c],
                      (unsigned long long)naive[c]);
    }
  }
  td_partition_t p = parse_ok("iid");
  uint64_t counts[P_NODES * P_CLASSES];
  int32_t bad[2] = {0, P_CLASSES};
  ck_assert_int_eq(td_partition_label_counts(&p, bad, 2, P_CLASSES, P_NODES, 1, counts),
                   TD_ERANGE);
  ck_assert_int_eq(td_partition_label_counts(&p, p_labels, P_ROWS, P_CLASSES, 0, 1, counts),
                   TD_EINVAL);
}
END_TEST

START_TEST(heldout_shares_follow_each_nodes_label_skew) {
  /* a test set of 400 rows; the shares must be disjoint, cover it, and give
   * each node about its training share of every class */
  enum { T_ROWS = 400 };
  int32_t test[T_ROWS];
  for (int i = 0; i < T_ROWS; i++)
    test[i] = (i * 3) % P_CLASSES;
  td_partition_t p = parse_ok("dirichlet:0.1");
  uint64_t counts[P_NODES * P_CLASSES];
  ck_assert_int_eq(
      td_partition_label_counts(&p, p_labels, P_ROWS, P_CLASSES, P_NODES, 3, counts), 0);
  int owner[T_ROWS];
  for (int i = 0; i < T_ROWS; i++)
    owner[i] = -1;
  for (unsigned k = 0; k < P_NODES; k++) {
    uint32_t *idx = NULL;
    size_t n = 0;
    ck_assert_int_eq(
        td_partition_heldout(counts, P_NODES, P_CLASSES, test, T_ROWS, k, 3, &idx, &n), 0);
    int per_class[P_CLASSES] = {0};
    for (size_t j = 0; j < n; j++) {
      if (j > 0 && idx[j] <= idx[j - 1])
        ck_abort_msg("node %u: indices not ascending", k);
      if (owner[idx[j]] != -1)
        ck_abort_msg("test row %u on nodes %d and %u", idx[j], owner[idx[j]], k);
      owner[idx[j]] = (int)k;
      per_class[test[idx[j]]]++;
    }
    free(idx);
    /* 40 test rows per class, 100 training rows per class: node k's share of
     * class c is 40 * counts / 100, give or take the rounding of two cuts */
    for (int c = 0; c < P_CLASSES; c++) {
      double expect = 40.0 * (double)counts[k * P_CLASSES + c] / 100.0;
      ck_assert_msg(per_class[c] >= expect - 1 && per_class[c] <= expect + 1,
                    "node %u class %d: %d held out for %.1f expected", k, c, per_class[c],
                    expect);
    }
  }
  for (int i = 0; i < T_ROWS; i++)
    if (owner[i] == -1)
      ck_abort_msg("test row %d on no node", i);
}
END_TEST

int main(void) {
  Suite *s = suite_create("partition");

  TCase *part = tcase_create("partition");
  tcase_add_checked_fixture(part, make_labels, NULL);
  tcase_set_timeout(part, 60);
  tcase_add_test(part, partition_parse_accepts_the_four_forms);
  tcase_add_test(part, partition_parse_rejects_bad_specs_with_a_reason);
  tcase_add_test(part, partitions_are_disjoint_and_cover_every_row);
  tcase_add_test(part, iid_parts_differ_in_size_by_at_most_one);
  tcase_add_test(part, dirichlet_small_alpha_skews_labels_large_alpha_does_not);
  tcase_add_test(part, shard_gives_each_node_few_classes);
  tcase_add_test(part, partition_depends_on_the_seed_only);
  tcase_add_test(part, partition_all_gives_every_node_every_row);
  tcase_add_test(part, partition_rejects_bad_arguments);
  tcase_add_test(part, label_counts_match_each_nodes_own_rows);
  tcase_add_test(part, heldout_shares_follow_each_nodes_label_skew);
  suite_add_tcase(s, part);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
