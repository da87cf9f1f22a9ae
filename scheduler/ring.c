/* ring.c: the ring all-reduce's order, chunks and schedule (ring.h).
 *
 * The order: up to TD_RING_EXACT_MAX members, a binary search over the
 * sorted distinct edge costs finds the least bottleneck B (the least cost
 * for which Held-Karp, allowed only edges <= B, closes a tour), and
 * Held-Karp at that B gives the least sum. Above it, nearest-neighbour
 * tours from several starts, each improved by or-opt moves, which keep
 * every hop's direction (the costs are asymmetric: a link's uplink and
 * downlink differ).
 *
 * Determinism across machines: the costs are only compared and added, in
 * fixed orders (no multiply-add a compiler could fuse into one rounding),
 * and strict `<` lets the first (lowest index) of equals win. */
#include "scheduler/ring.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Or-opt passes, the longest segment a move carries, and how many
 * nearest-neighbour starts the heuristic improves (about 0.1 s at n = 256). */
#define RING_PASSES 32
#define RING_SEGMENT_MAX 3u
#define RING_STARTS 16u

static double hop(const double *cost, size_t n, size_t from, size_t to) {
  return cost[from * n + to];
}

void td_ring_tour_cost(const double *cost, size_t n, const size_t *order, double *bottleneck,
                       double *sum) {
  double most = 0, total = 0;
  for (size_t k = 0; n >= 2 && k < n; k++) {
    double c = hop(cost, n, order[k], order[(k + 1) % n]);
    most = c > most ? c : most;
    total += c;
  }
  *bottleneck = most;
  *sum = total;
}

/* Held-Karp over tours from member 0 that use only edges <= limit: the
 * least sum (INFINITY when none closes), and that tour into order unless
 * NULL. dp[S * n + j]: the least cost of a path from 0 through exactly the
 * members of S (bit j - 1 stands for member j) that ends at j; from[] is
 * the member before j on it. The sum grows hop by hop from 0, in the order
 * td_ring_tour_cost adds. */
static double held_karp(const double *cost, size_t n, double limit, double *dp, uint8_t *from,
                        size_t *order) {
  size_t full = ((size_t)1 << (n - 1)) - 1;
  for (size_t set = 1; set <= full; set++)
    for (size_t j = 1; j < n; j++) {
      size_t bit = (size_t)1 << (j - 1), rest = set & ~bit;
      double best = INFINITY;
      if (!(set & bit))
        continue;
      if (rest == 0) {
        best = hop(cost, n, 0, j) <= limit ? hop(cost, n, 0, j) : INFINITY;
        from[set * n + j] = 0;
      }
      for (size_t i = 1; i < n && rest != 0; i++) {
        double c = hop(cost, n, i, j);
        if ((rest & ((size_t)1 << (i - 1))) && c <= limit && dp[rest * n + i] + c < best) {
          best = dp[rest * n + i] + c;
          from[set * n + j] = (uint8_t)i;
        }
      }
      dp[set * n + j] = best;
    }
  double best = INFINITY;
  size_t last = 0;
  for (size_t j = 1; j < n; j++) {
    double c = hop(cost, n, j, 0);
    if (c <= limit && dp[full * n + j] + c < best) {
      best = dp[full * n + j] + c;
      last = j;
    }
  }
  if (order != NULL && best < INFINITY) {
    order[0] = 0;
    for (size_t k = n - 1, set = full, j = last; k >= 1; k--) {
      order[k] = j;
      size_t before = from[set * n + j];
      set &= ~((size_t)1 << (j - 1));
      j = before;
    }
  }
  return best;
}

static int exact(const double *cost, size_t n, size_t *order) {
  double edges[TD_RING_EXACT_MAX * TD_RING_EXACT_MAX];
  size_t count = 0;
  for (size_t i = 0; i < n; i++) /* the distinct off-diagonal costs, ascending */
    for (size_t j = 0; j < n; j++) {
      if (i == j)
        continue;
      double c = hop(cost, n, i, j);
      size_t at = 0;
      while (at < count && edges[at] < c)
        at++;
      if (at < count && edges[at] == c)
        continue;
      memmove(edges + at + 1, edges + at, (count - at) * sizeof edges[0]);
      edges[at] = c;
      count++;
    }
  double *dp = malloc(((size_t)1 << (n - 1)) * n * sizeof *dp);
  uint8_t *from = malloc(((size_t)1 << (n - 1)) * n);
  if (dp == NULL || from == NULL) {
    free(dp);
    free(from);
    return -1;
  }
  size_t lo = 0, hi = count - 1; /* the dearest edge allows every tour */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (held_karp(cost, n, edges[mid], dp, from, NULL) < INFINITY)
      hi = mid;
    else
      lo = mid + 1;
  }
  held_karp(cost, n, edges[lo], dp, from, order);
  free(dp);
  free(from);
  return 0;
}

/* The local search's view of a tour: its bottleneck, how many hops cost
 * exactly that, and its sum. */
typedef struct {
  double bottleneck, sum;
  size_t at_bottleneck;
} score_t;

static score_t score(const double *cost, size_t n, const size_t *order) {
  score_t s = {0, 0, 0};
  td_ring_tour_cost(cost, n, order, &s.bottleneck, &s.sum);
  for (size_t k = 0; k < n; k++)
    s.at_bottleneck += hop(cost, n, order[k], order[(k + 1) % n]) == s.bottleneck;
  return s;
}

static bool lex_less(double bottleneck_a, double sum_a, double bottleneck_b, double sum_b) {
  return bottleneck_a < bottleneck_b || (bottleneck_a == bottleneck_b && sum_a < sum_b);
}

/* Turns the tour so that member 0 leads. */
static void rotate_to_zero(size_t n, size_t *order, size_t *scratch) {
  size_t at = td_ring_position(order, n, 0);
  for (size_t k = 0; k < n; k++)
    scratch[k] = order[(at + k) % n];
  memcpy(order, scratch, n * sizeof *order);
}

/* Or-opt to a fixed bound: the segment at positions i .. i + len - 1 moves
 * between the remaining neighbours a -> b, which removes prev -> first,
 * last -> next, a -> b and adds prev -> next, a -> first, last -> b. A move
 * is taken when it strictly improves (bottleneck, hops at the bottleneck,
 * sum) with by_count, or (bottleneck, sum) without; the count is what moves
 * a flat bottleneck down when many hops share it. Sums count as improved
 * only past a relative 1e-12, so rounding cannot make moves cycle. */
static void or_opt(const double *cost, size_t n, size_t *order, size_t *scratch, bool by_count) {
  score_t cur = score(cost, n, order);
  for (int pass = 0; pass < RING_PASSES; pass++) {
    bool moved = false;
    for (size_t i = 0; i < n; i++)
      for (size_t len = 1; len <= RING_SEGMENT_MAX && len + 2 <= n; len++)
        for (size_t m = 0; m + len + 1 < n; m++) {
          size_t prev = order[(i + n - 1) % n], first = order[i];
          size_t last = order[(i + len - 1) % n], next = order[(i + len) % n];
          size_t a = order[(i + len + m) % n], b = order[(i + len + m + 1) % n];
          double gone[3] = {hop(cost, n, prev, first), hop(cost, n, last, next),
                            hop(cost, n, a, b)};
          double added[3] = {hop(cost, n, prev, next), hop(cost, n, a, first),
                             hop(cost, n, last, b)};
          double delta = (added[0] + added[1] + added[2]) - (gone[0] + gone[1] + gone[2]);
          size_t gone_at = 0, added_at = 0;
          double most = 0;
          for (int e = 0; e < 3; e++) {
            gone_at += gone[e] == cur.bottleneck;
            added_at += added[e] == cur.bottleneck;
            most = added[e] > most ? added[e] : most;
          }
          if (most > cur.bottleneck)
            continue;
          bool lower = gone_at == cur.at_bottleneck && most < cur.bottleneck;
          size_t count = cur.at_bottleneck - gone_at + added_at;
          bool cheaper = delta < -1e-12 * cur.sum;
          if (!(lower || (by_count && count < cur.at_bottleneck) ||
                ((!by_count || count == cur.at_bottleneck) && cheaper)))
            continue;
          /* rebuild: next .. a, the segment, b .. prev */
          size_t k = 0;
          for (size_t r = 0; r <= m; r++)
            scratch[k++] = order[(i + len + r) % n];
          for (size_t r = 0; r < len; r++)
            scratch[k++] = order[(i + r) % n];
          for (size_t r = m + 1; r + len < n; r++)
            scratch[k++] = order[(i + len + r) % n];
          memcpy(order, scratch, n * sizeof *order);
          rotate_to_zero(n, order, scratch);
          cur = score(cost, n, order);
          moved = true;
        }
    if (!moved)
      break;
  }
}

/* Nearest neighbour from member `first` (the cheapest next hop, the lowest
 * index of equals), turned to start at 0. */
static void nearest_neighbour(const double *cost, size_t n, size_t first, size_t *order,
                              size_t *scratch) {
  bool used[TD_RING_N_MAX] = {false};
  used[first] = true;
  order[0] = first;
  for (size_t k = 1; k < n; k++) {
    size_t pick = n;
    for (size_t j = 0; j < n; j++)
      if (!used[j] &&
          (pick == n || hop(cost, n, order[k - 1], j) < hop(cost, n, order[k - 1], pick)))
        pick = j;
    used[pick] = true;
    order[k] = pick;
  }
  rotate_to_zero(n, order, scratch);
}

/* Keeps tour in best when it is better; *bottleneck and *sum are best's. */
static void keep_better(const double *cost, size_t n, const size_t *tour, size_t *best,
                        double *bottleneck, double *sum) {
  double b, s;
  td_ring_tour_cost(cost, n, tour, &b, &s);
  if (lex_less(b, s, *bottleneck, *sum)) {
    memcpy(best, tour, n * sizeof *best);
    *bottleneck = b;
    *sum = s;
  }
}

/* The identity, then nearest neighbour from each of the first RING_STARTS
 * members with and without or-opt: the best of them all. Several starts
 * matter more than longer segments: or-opt's local optima differ with the
 * start. The count-first pass may trade sum for fewer bottleneck hops, so
 * each unimproved start competes too. */
static void heuristic(const double *cost, size_t n, size_t *order) {
  size_t start[TD_RING_N_MAX], tour[TD_RING_N_MAX] = {0}, scratch[TD_RING_N_MAX];
  double bottleneck = INFINITY, sum = INFINITY;
  for (size_t k = 0; k < n; k++)
    tour[k] = k;
  keep_better(cost, n, tour, order, &bottleneck, &sum);
  for (size_t first = 0; first < n && first < RING_STARTS; first++) {
    nearest_neighbour(cost, n, first, start, scratch);
    keep_better(cost, n, start, order, &bottleneck, &sum);
    memcpy(tour, start, n * sizeof *tour);
    or_opt(cost, n, tour, scratch, true);
    or_opt(cost, n, tour, scratch, false);
    keep_better(cost, n, tour, order, &bottleneck, &sum);
  }
}

int td_ring_order(const double *cost, size_t n, size_t *order) {
  if (cost == NULL || order == NULL || n == 0 || n > TD_RING_N_MAX)
    return -1;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++)
      if (i != j && !(isfinite(hop(cost, n, i, j)) && hop(cost, n, i, j) >= 0))
        return -1;
  if (n <= 2) {
    for (size_t k = 0; k < n; k++)
      order[k] = k;
    return 0;
  }
  if (n <= TD_RING_EXACT_MAX)
    return exact(cost, n, order);
  heuristic(cost, n, order);
  return 0;
}

void td_ring_chunk(size_t len, size_t n, size_t c, size_t *off, size_t *cnt) {
  if (n == 0 || c >= n) {
    *off = len;
    *cnt = 0;
    return;
  }
  size_t base = len / n, longer = len % n;
  *off = c * base + (c < longer ? c : longer);
  *cnt = base + (c < longer);
}

size_t td_ring_send_chunk(size_t n, size_t p, size_t step) {
  if (n == 0 || p >= n || step >= TD_RING_STEPS(n))
    return n;
  if (step < n - 1)
    return (p + n - step) % n;
  return (p + 1 + n - (step - (n - 1))) % n;
}

size_t td_ring_recv_chunk(size_t n, size_t p, size_t step) {
  if (n == 0 || p >= n || step >= TD_RING_STEPS(n))
    return n;
  if (step < n - 1)
    return (p + n - step - 1) % n;
  return (p + n - (step - (n - 1))) % n;
}

int td_ring_step_adds(size_t n, size_t step) {
  return n >= 1 && step < n - 1;
}

size_t td_ring_owned_chunk(size_t n, size_t p) {
  return n == 0 ? 0 : (p + 1) % n;
}

size_t td_ring_position(const size_t *order, size_t n, size_t member) {
  for (size_t p = 0; p < n; p++)
    if (order[p] == member)
      return p;
  return n;
}
