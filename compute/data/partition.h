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

/* Most parts (nodes, or all the virtual clients of a run) a rule splits into. */
#define TD_PARTITION_MAX_PARTS 4096u

/* Virtual clients: the rows of parts [first, first + count) of `parts`, each
 * part exactly what td_partition_indices(p, ..., first + j, parts, ...)
 * gives, grouped by part: part first + j's rows (ascending) are
 * idx[offsets[j] .. offsets[j + 1]). offsets has count + 1 slots; caller
 * owns *idx_out (free()). The rule runs once, not count times. `all` is
 * TD_EINVAL (every part would hold every row). part_rows, when not NULL,
 * gets every part's row count (parts slots). TD_EINVAL / TD_ERANGE /
 * TD_ENOMEM. */
int td_partition_group(const td_partition_t *p, const int32_t *labels, size_t rows, int classes,
                       unsigned first, unsigned count, unsigned parts, uint64_t seed,
                       uint32_t **idx_out, size_t *offsets, uint32_t *part_rows);

/* Most classes td_partition_label_counts and td_partition_heldout accept
 * (their tables are nodes x classes). */
#define TD_PARTITION_MAX_CLASSES 65536

/* Every node's label counts under the rule: counts[k * classes + c] = the
 * training rows of class c that node k of `nodes` holds (`all`: every node
 * the whole set's). counts has nodes * classes slots, filled by the call.
 * Deterministic in seed, the same on every node, so any node knows every
 * node's skew. TD_EINVAL / TD_ERANGE (a label outside [0, classes)) / TD_ENOMEM. */
int td_partition_label_counts(const td_partition_t *p, const int32_t *labels, size_t rows,
                              int classes, unsigned nodes, uint64_t seed, uint64_t *counts);

/* Node `node`'s held-out share of a test set (its rows, ascending): within
 * each class the test rows, shuffled by seed, are cut in proportion to the
 * training rows of that class each node holds (counts, as
 * td_partition_label_counts gives them), so a node's share follows its own
 * label distribution; a class no node trains on is dealt evenly. The shares
 * of the nodes are disjoint and cover the test set. Caller owns *idx_out
 * (free()). TD_EINVAL / TD_ERANGE / TD_ENOMEM. */
int td_partition_heldout(const uint64_t *counts, unsigned nodes, int classes,
                         const int32_t *labels, size_t rows, unsigned node, uint64_t seed,
                         uint32_t **idx_out, size_t *n_out);

#endif
