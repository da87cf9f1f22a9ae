/* topology.h: which members exchange with which in a round (run key
 * `topology`), computed alike by every node from (seed, round, members).
 *
 * mesh: every member with every other (the average of all). gossip:K: the
 * one-peer exponential graph generalised to K peers (Ying et al. 2021): with
 * tau = ceil(log2 n), round r's shifts are 2^k for the K exponents
 * k = (r K + m) mod tau, m < K; position i sends to i + 2^k and mixes with
 * what it gets from i - 2^k (mod n). groups:M (Moshpit SGD): positions go on a
 * virtual grid of side M and d = ceil(log_M n) dimensions, placed by a
 * permutation drawn from (seed, r / d); round r's groups are the positions
 * that share every grid coordinate but dimension r mod d, and each averages
 * inside its group. auto: mesh up to TD_TOPOLOGY_AUTO_MESH members, groups:4
 * above. Every mixing matrix these give, with the equal weights 1/(partners
 * + 1), is doubly stochastic: the network mean is kept. Positions are
 * 0..n-1 (a node's place among the round's members in rank order). Pure
 * functions, no allocation. */
#ifndef TD_TOPOLOGY_H
#define TD_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TD_TOPO_MESH = 0, TD_TOPO_GOSSIP, TD_TOPO_GROUPS, TD_TOPO_AUTO } td_topo_kind_t;

typedef struct {
  td_topo_kind_t kind;
  unsigned k; /* gossip: peers a round; groups: the group size M */
} td_topology_t;

/* Up to this many members `auto` is the mesh; above, groups of TD_TOPOLOGY_AUTO_GROUP. */
#define TD_TOPOLOGY_AUTO_MESH 8u
#define TD_TOPOLOGY_AUTO_GROUP 4u
/* The most gossip peers or the largest group a topology names. */
#define TD_TOPOLOGY_K_MAX 64u
/* The most positions a round places (the partner lists are bounded by it). */
#define TD_TOPOLOGY_N_MAX 256u

/* "mesh", "gossip:K", "groups:M" or "auto"; 0, or -1 with why set. */
int td_topology_parse(td_topology_t *t, const char *text, char *why, size_t why_len);

/* The kind that round's n positions use: auto resolved, and anything but
 * the mesh with n <= 2 (or a group size of n or more) is the mesh. */
td_topology_t td_topology_at(const td_topology_t *t, size_t n);

/* Positions that `me` (of n) sends its message to in round `round`, into
 * out (room for n - 1); how many. The mesh: every other position. */
size_t td_topology_sends(const td_topology_t *t, uint64_t seed, uint64_t round, size_t n,
                         size_t me, size_t *out);

/* Positions whose messages `me` mixes with its own in round `round`, into
 * out (room for n - 1); how many. For every i and j: j is in i's sends
 * exactly when i is in j's receives. */
size_t td_topology_receives(const td_topology_t *t, uint64_t seed, uint64_t round, size_t n,
                            size_t me, size_t *out);

#endif
