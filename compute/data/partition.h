/* partition.h: which rows of a shared dataset node k of N trains on.
 *
 * `partition` run key: all | iid | dirichlet:ALPHA | shard:K. iid deals a seeded
 * permutation into N near-equal slices; dirichlet draws per-class node shares
 * from Dir(ALPHA) (label skew: small ALPHA, few classes per node); shard sorts by
 * label, cuts N*K shards and gives each node K of them (the FedAvg paper split).
 * For a fixed seed every node computes the same global assignment, so the N
 * partitions are pairwise disjoint and together cover every row exactly once
 * (except `all`, where every node gets every row). */
#ifndef TD_PARTITION_H
#define TD_PARTITION_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  TD_PARTITION_ALL = 0,
  TD_PARTITION_IID,
  TD_PARTITION_DIRICHLET,
  TD_PARTITION_SHARD,
} td_partition_kind_t;

typedef struct {
  td_partition_kind_t kind;
  double alpha;              /* dirichlet: concentration > 0 */
  unsigned shards_per_node;  /* shard: K >= 1 */
} td_partition_t;

/* Parse a spec string; TD_ECONFIG with a message on anything unknown or out of
 * range (alpha must be finite and in (0, 1e6], K in [1, 100000]). */
int td_partition_parse(td_partition_t *out, const char *spec, char *why, size_t why_len);

/* Row indices (ascending) for node `node` of `nodes` (0 <= node < nodes <= 4096)
 * over `rows` labelled rows with labels in [0, classes). Deterministic in seed.
 * Caller owns *idx_out (release with free()); *n_out may be 0 for a tiny dataset
 * or a skewed split. Fails with TD_EINVAL / TD_ERANGE / TD_ENOMEM. */
int td_partition_indices(const td_partition_t *p, const int32_t *labels, size_t rows,
                         int classes, unsigned node, unsigned nodes, uint64_t seed,
                         uint32_t **idx_out, size_t *n_out);

#endif
