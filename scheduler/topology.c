/* topology.c: the round's exchange partners of each topology (topology.h).
 *
 * The groups' grid placement is a Fisher-Yates permutation of the positions
 * with the project's one PRNG (compute/rng.h) on a stream named by the grid's
 * cycle (round / d), so a cycle of d rounds uses one placement and, with
 * n = M^d members, ends on the exact mean of the models it began with. */
#include "scheduler/topology.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/rng.h"

/* "TOPOLO" in ASCII: keeps the placement stream apart from the run seed's others. */
#define TOPO_STREAM 0x544F504F4C4Full

static int parse_k(const char *v, unsigned lo, unsigned *k) {
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || v[0] == '-' || x < lo || x > TD_TOPOLOGY_K_MAX)
    return -1;
  *k = (unsigned)x;
  return 0;
}

int td_topology_parse(td_topology_t *t, const char *text, char *why, size_t why_len) {
  if (strcmp(text, "mesh") == 0) {
    *t = (td_topology_t){.kind = TD_TOPO_MESH};
    return 0;
  }
  if (strcmp(text, "auto") == 0) {
    *t = (td_topology_t){.kind = TD_TOPO_AUTO, .k = TD_TOPOLOGY_AUTO_GROUP};
    return 0;
  }
  if (strncmp(text, "gossip:", 7) == 0) {
    if (parse_k(text + 7, 1, &t->k) == 0) {
      t->kind = TD_TOPO_GOSSIP;
      return 0;
    }
    return td_why(why, why_len, TD_ECONFIG,
                  "bad topology '%s': gossip:K needs K peers a round, 1 to %u", text,
                  TD_TOPOLOGY_K_MAX);
  }
  if (strncmp(text, "groups:", 7) == 0) {
    if (parse_k(text + 7, 2, &t->k) == 0) {
      t->kind = TD_TOPO_GROUPS;
      return 0;
    }
    return td_why(why, why_len, TD_ECONFIG,
                  "bad topology '%s': groups:M needs a group size M, 2 to %u", text,
                  TD_TOPOLOGY_K_MAX);
  }
  return td_why(why, why_len, TD_ECONFIG,
                "unknown topology '%s' (accepted: mesh, gossip:K, groups:M, auto)", text);
}

td_topology_t td_topology_at(const td_topology_t *t, size_t n) {
  td_topology_t r = *t;
  if (r.kind == TD_TOPO_AUTO)
    r = n <= TD_TOPOLOGY_AUTO_MESH ? (td_topology_t){.kind = TD_TOPO_MESH}
                                   : (td_topology_t){.kind = TD_TOPO_GROUPS,
                                                     .k = TD_TOPOLOGY_AUTO_GROUP};
  if (n <= 2 || n > TD_TOPOLOGY_N_MAX || (r.kind == TD_TOPO_GROUPS && r.k >= n))
    r = (td_topology_t){.kind = TD_TOPO_MESH};
  return r;
}

static size_t mesh(size_t n, size_t me, size_t *out) {
  size_t k = 0;
  for (size_t j = 0; j < n; j++)
    if (j != me)
      out[k++] = j;
  return k;
}

/* ceil(log2 n) for n >= 2 */
static unsigned log2_ceil(size_t n) {
  unsigned tau = 0;
  while (((size_t)1 << tau) < n)
    tau++;
  return tau;
}

/* gossip: the positions `me` reaches with round's shifts, forward (sends)
 * or backward (receives). Distinct exponents below tau give distinct shifts
 * in [1, n): no position twice, never `me`. */
static size_t gossip(unsigned peers, uint64_t round, size_t n, size_t me, bool forward,
                     size_t *out) {
  unsigned tau = log2_ceil(n);
  unsigned k = peers < tau ? peers : tau;
  for (unsigned m = 0; m < k; m++) {
    size_t shift = (size_t)1 << (unsigned)((round * peers + m) % tau);
    out[m] = forward ? (me + shift) % n : (me + n - shift) % n;
  }
  return k;
}

/* groups: the grid's dimensions for side M (M^d >= n) */
static unsigned grid_dims(size_t n, unsigned side) {
  unsigned d = 0;
  for (size_t cells = 1; cells < n; cells *= side)
    d++;
  return d;
}

static size_t groups(unsigned side, uint64_t seed, uint64_t round, size_t n, size_t me,
                     size_t *out) {
  unsigned d = grid_dims(n, side);
  uint32_t place[TD_TOPOLOGY_N_MAX]; /* place[position] = its grid cell */
  for (size_t i = 0; i < n; i++)
    place[i] = (uint32_t)i;
  td_rng_t rng;
  td_rng_seed2(&rng, seed, TOPO_STREAM ^ ((round / d) * 0x9E3779B97F4A7C15ull));
  td_rng_shuffle_u32(&rng, place, n);
  size_t stride = 1;
  for (unsigned dim = 0; dim < (unsigned)(round % d); dim++)
    stride *= side;
  /* the cells that differ from mine in the digit of `stride` alone */
  size_t mine = place[me], digit = mine / stride % side;
  size_t k = 0;
  for (size_t j = 0; j < n; j++) {
    size_t cell = place[j];
    if (j != me && cell - (cell / stride % side) * stride == mine - digit * stride)
      out[k++] = j;
  }
  return k;
}

static size_t partners(const td_topology_t *t, uint64_t seed, uint64_t round, size_t n,
                       size_t me, bool forward, size_t *out) {
  if (me >= n)
    return 0;
  td_topology_t at = td_topology_at(t, n);
  switch (at.kind) {
  case TD_TOPO_GOSSIP: return gossip(at.k, round, n, me, forward, out);
  case TD_TOPO_GROUPS: return groups(at.k, seed, round, n, me, out);
  default: return mesh(n, me, out);
  }
}

size_t td_topology_sends(const td_topology_t *t, uint64_t seed, uint64_t round, size_t n,
                         size_t me, size_t *out) {
  return partners(t, seed, round, n, me, true, out);
}

size_t td_topology_receives(const td_topology_t *t, uint64_t seed, uint64_t round, size_t n,
                            size_t me, size_t *out) {
  return partners(t, seed, round, n, me, false, out);
}
