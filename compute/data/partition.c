/* partition.c: deterministic splits of a labelled dataset across N nodes.
 *
 * Every node computes the same global assignment (an owner for every row)
 * from the shared seed, never from its own rank, and then keeps its own rows.
 * The parts are therefore disjoint and cover every row with no coordination
 * at all. All randomness comes from one td_rng stream derived from the seed,
 * consumed in a fixed order, so the split is the same on every platform. */
#include "compute/data/partition.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/rng.h"

#define TD__PARTITION_MAX_NODES TD_PARTITION_MAX_PARTS
#define TD__PARTITION_MAX_ALPHA 1e6
#define TD__PARTITION_MAX_SHARDS 100000ul
#define TD__PARTITION_STREAM 0x5041525449ull /* "PARTI" */
#define TD__PARTITION_HELDOUT_STREAM 0x48454c44ull /* "HELD" */

#define TD__PARTITION_FORMS "all, iid, dirichlet:ALPHA, shard:K"

/* Strict numbers: digits first (no sign, space or "nan"), nothing after. */
static int parse_alpha(const char *s, double *out) {
  if (!((*s >= '0' && *s <= '9') || *s == '.'))
    return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !isfinite(v) || !(v > 0) ||
      v > TD__PARTITION_MAX_ALPHA)
    return -1;
  *out = v;
  return 0;
}

static int parse_shards(const char *s, unsigned *out) {
  if (!(*s >= '0' && *s <= '9'))
    return -1;
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (*end != '\0' || errno != 0 || v == 0 || v > TD__PARTITION_MAX_SHARDS)
    return -1;
  *out = (unsigned)v;
  return 0;
}

int td_partition_parse(td_partition_t *out, const char *spec, char *why, size_t why_len) {
  if (out == NULL)
    return TD_EINVAL;
  memset(out, 0, sizeof *out);
  if (spec == NULL)
    return td_why(why, why_len, TD_ECONFIG,
                  "no partition given (accepted: " TD__PARTITION_FORMS ")");
  if (strcmp(spec, "all") == 0) {
    out->kind = TD_PARTITION_ALL;
    return 0;
  }
  if (strcmp(spec, "iid") == 0) {
    out->kind = TD_PARTITION_IID;
    return 0;
  }
  if (strncmp(spec, "dirichlet:", 10) == 0) {
    if (parse_alpha(spec + 10, &out->alpha) != 0)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad partition '%s': dirichlet:ALPHA needs a number ALPHA in (0, 1e6]", spec);
    out->kind = TD_PARTITION_DIRICHLET;
    return 0;
  }
  if (strncmp(spec, "shard:", 6) == 0) {
    if (parse_shards(spec + 6, &out->shards_per_node) != 0)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad partition '%s': shard:K needs an integer K in [1, %lu]", spec,
                    TD__PARTITION_MAX_SHARDS);
    out->kind = TD_PARTITION_SHARD;
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG,
                "unknown partition '%s' (accepted: " TD__PARTITION_FORMS ")", spec);
}

/* iid: a seeded permutation dealt into `nodes` contiguous slices; slice k is
 * [floor(k * rows / nodes), floor((k + 1) * rows / nodes)), so sizes differ by
 * at most one. */
static int assign_iid(td_rng_t *rng, size_t rows, unsigned nodes, uint16_t *owner) {
  uint32_t *perm = malloc((rows ? rows : 1) * sizeof *perm);
  if (perm == NULL)
    return TD_ENOMEM;
  for (size_t i = 0; i < rows; i++)
    perm[i] = (uint32_t)i;
  td_rng_shuffle_u32(rng, perm, rows);
  for (unsigned k = 0; k < nodes; k++) {
    size_t from = (size_t)((uint64_t)k * rows / nodes);
    size_t to = (size_t)((uint64_t)(k + 1) * rows / nodes);
    for (size_t i = from; i < to; i++)
      owner[perm[i]] = (uint16_t)k;
  }
  free(perm);
  return 0;
}

/* Row ids grouped by label, in row order within a label (a stable counting
 * sort). start[c] .. start[c + 1] delimit class c; start has classes + 1 slots. */
static void group_by_label(const int32_t *labels, size_t rows, int classes, size_t *start,
                           uint32_t *grouped) {
  memset(start, 0, ((size_t)classes + 1) * sizeof *start);
  for (size_t i = 0; i < rows; i++)
    start[labels[i] + 1]++;
  for (int c = 0; c < classes; c++)
    start[c + 1] += start[c];
  /* start[c] is used as a fill cursor, then restored by shifting back */
  for (size_t i = 0; i < rows; i++)
    grouped[start[labels[i]]++] = (uint32_t)i;
  for (int c = classes; c > 0; c--)
    start[c] = start[c - 1];
  start[0] = 0;
}

/* dirichlet: per class, node shares p ~ Dir(alpha) from normalised gammas; the
 * class's rows, shuffled, are cut at the rounded cumulative shares, so the
 * pieces always add up to the class size exactly. */
static int assign_dirichlet(td_rng_t *rng, const int32_t *labels, size_t rows, int classes,
                            unsigned nodes, double alpha, uint16_t *owner) {
  uint32_t *grouped = malloc((rows ? rows : 1) * sizeof *grouped);
  size_t *start = malloc(((size_t)classes + 1) * sizeof *start);
  double *share = malloc(nodes * sizeof *share);
  int rc = 0;
  if (grouped == NULL || start == NULL || share == NULL) {
    rc = TD_ENOMEM;
    goto done;
  }
  group_by_label(labels, rows, classes, start, grouped);
  for (int c = 0; c < classes; c++) {
    double total = 0;
    for (unsigned k = 0; k < nodes; k++)
      total += share[k] = td_rng_gamma(rng, alpha);
    if (!(total > 0) || !isfinite(total)) {
      /* every draw underflowed (tiny alpha): the class goes to one node */
      for (unsigned k = 0; k < nodes; k++)
        share[k] = 0;
      share[td_rng_below(rng, nodes)] = 1;
      total = 1;
    }
    uint32_t *members = grouped + start[c];
    size_t count = start[c + 1] - start[c];
    td_rng_shuffle_u32(rng, members, count);
    double cumulative = 0;
    size_t from = 0;
    for (unsigned k = 0; k < nodes; k++) {
      cumulative += share[k];
      size_t to = k + 1 == nodes ? count : (size_t)llround((double)count * (cumulative / total));
      if (to > count)
        to = count;
      for (size_t i = from; i < to; i++)
        owner[members[i]] = (uint16_t)k;
      if (to > from)
        from = to;
    }
  }
done:
  free(grouped);
  free(start);
  free(share);
  return rc;
}

/* shard: rows sorted by label (stably) and cut into nodes * K near-equal
 * contiguous shards; a seeded permutation of shard ids gives node k the
 * shards at positions [k * K, (k + 1) * K). */
static int assign_shard(td_rng_t *rng, const int32_t *labels, size_t rows, int classes,
                        unsigned nodes, unsigned per_node, uint16_t *owner) {
  size_t shards = (size_t)nodes * per_node;
  uint32_t *sorted = malloc((rows ? rows : 1) * sizeof *sorted);
  size_t *start = malloc(((size_t)classes + 1) * sizeof *start);
  uint32_t *slot_of = malloc(shards * sizeof *slot_of);
  int rc = 0;
  if (sorted == NULL || start == NULL || slot_of == NULL) {
    rc = TD_ENOMEM;
    goto done;
  }
  group_by_label(labels, rows, classes, start, sorted);
  for (size_t s = 0; s < shards; s++)
    slot_of[s] = (uint32_t)s;
  td_rng_shuffle_u32(rng, slot_of, shards);
  for (size_t i = 0; i < rows; i++) {
    size_t shard = (size_t)((uint64_t)i * shards / rows);
    owner[sorted[i]] = (uint16_t)(slot_of[shard] / per_node);
  }
done:
  free(sorted);
  free(start);
  free(slot_of);
  return rc;
}

/* The arguments every entry point checks; 0 or TD_EINVAL. */
static int check_rule(const td_partition_t *p, const int32_t *labels, size_t rows, int classes,
                      unsigned nodes) {
  if (p == NULL || (labels == NULL && rows > 0) || nodes == 0 ||
      nodes > TD__PARTITION_MAX_NODES || classes <= 0 || rows > UINT32_MAX)
    return TD_EINVAL;
  if ((p->kind == TD_PARTITION_DIRICHLET &&
       (!(p->alpha > 0) || p->alpha > TD__PARTITION_MAX_ALPHA)) ||
      (p->kind == TD_PARTITION_SHARD &&
       (p->shards_per_node == 0 || p->shards_per_node > TD__PARTITION_MAX_SHARDS)) ||
      (unsigned)p->kind > (unsigned)TD_PARTITION_SHARD)
    return TD_EINVAL;
  return 0;
}

/* Every row's owner under a rule that is not `all` (caller frees *owner_out).
 * Labels are validated here; per-class tables are sized by the labels
 * actually seen, so a huge `classes` cannot make us allocate. */
static int assign_owners(const td_partition_t *p, const int32_t *labels, size_t rows,
                         int classes, unsigned nodes, uint64_t seed, uint16_t **owner_out) {
  *owner_out = NULL;
  int used_classes = 1;
  for (size_t i = 0; i < rows; i++) {
    if (labels[i] < 0 || labels[i] >= classes)
      return TD_ERANGE;
    if (labels[i] >= used_classes)
      used_classes = labels[i] + 1;
  }
  uint16_t *owner = malloc((rows ? rows : 1) * sizeof *owner);
  if (owner == NULL)
    return TD_ENOMEM;
  td_rng_t rng;
  td_rng_seed2(&rng, seed, TD__PARTITION_STREAM);
  int rc;
  if (p->kind == TD_PARTITION_IID)
    rc = assign_iid(&rng, rows, nodes, owner);
  else if (p->kind == TD_PARTITION_DIRICHLET)
    rc = assign_dirichlet(&rng, labels, rows, used_classes, nodes, p->alpha, owner);
  else
    rc = assign_shard(&rng, labels, rows, used_classes, nodes, p->shards_per_node, owner);
  if (rc != 0) {
    free(owner);
    return rc;
  }
  *owner_out = owner;
  return 0;
}

int td_partition_indices(const td_partition_t *p, const int32_t *labels, size_t rows,
                         int classes, unsigned node, unsigned nodes, uint64_t seed,
                         uint32_t **idx_out, size_t *n_out) {
  if (idx_out == NULL || n_out == NULL)
    return TD_EINVAL;
  *idx_out = NULL;
  *n_out = 0;
  if (check_rule(p, labels, rows, classes, nodes) != 0 || node >= nodes)
    return TD_EINVAL;
  for (size_t i = 0; i < rows; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return TD_ERANGE;
  uint32_t *idx = malloc((rows ? rows : 1) * sizeof *idx);
  if (idx == NULL)
    return TD_ENOMEM;
  size_t n = 0;
  if (p->kind == TD_PARTITION_ALL) {
    for (size_t i = 0; i < rows; i++)
      idx[n++] = (uint32_t)i;
  } else {
    uint16_t *owner;
    int rc = assign_owners(p, labels, rows, classes, nodes, seed, &owner);
    if (rc != 0) {
      free(idx);
      return rc;
    }
    /* walking rows in order yields the indices already ascending */
    for (size_t i = 0; i < rows; i++)
      if (owner[i] == node)
        idx[n++] = (uint32_t)i;
    free(owner);
  }
  if (n < rows) { /* give back what this node does not keep; failure is harmless */
    uint32_t *fit = realloc(idx, (n ? n : 1) * sizeof *idx);
    if (fit != NULL)
      idx = fit;
  }
  *idx_out = idx;
  *n_out = n;
  return 0;
}

int td_partition_group(const td_partition_t *p, const int32_t *labels, size_t rows, int classes,
                       unsigned first, unsigned count, unsigned parts, uint64_t seed,
                       uint32_t **idx_out, size_t *offsets, uint32_t *part_rows) {
  if (idx_out == NULL || offsets == NULL)
    return TD_EINVAL;
  *idx_out = NULL;
  if (check_rule(p, labels, rows, classes, parts) != 0 || p->kind == TD_PARTITION_ALL ||
      count == 0 || first >= parts || count > parts - first)
    return TD_EINVAL;
  uint16_t *owner;
  int rc = assign_owners(p, labels, rows, classes, parts, seed, &owner);
  if (rc != 0)
    return rc;
  memset(offsets, 0, ((size_t)count + 1) * sizeof *offsets);
  if (part_rows != NULL) {
    memset(part_rows, 0, (size_t)parts * sizeof *part_rows);
    for (size_t i = 0; i < rows; i++)
      part_rows[owner[i]]++;
  }
  for (size_t i = 0; i < rows; i++) /* a counting sort by owner, rows ascending within */
    if (owner[i] >= first && owner[i] - first < count)
      offsets[owner[i] - first + 1]++;
  for (unsigned j = 0; j < count; j++)
    offsets[j + 1] += offsets[j];
  uint32_t *idx = malloc((offsets[count] ? offsets[count] : 1) * sizeof *idx);
  size_t *fill = malloc((size_t)count * sizeof *fill);
  if (idx == NULL || fill == NULL) {
    free(idx);
    free(fill);
    free(owner);
    return TD_ENOMEM;
  }
  memcpy(fill, offsets, (size_t)count * sizeof *fill);
  for (size_t i = 0; i < rows; i++)
    if (owner[i] >= first && owner[i] - first < count)
      idx[fill[owner[i] - first]++] = (uint32_t)i;
  free(fill);
  free(owner);
  *idx_out = idx;
  return 0;
}

int td_partition_label_counts(const td_partition_t *p, const int32_t *labels, size_t rows,
                              int classes, unsigned nodes, uint64_t seed, uint64_t *counts) {
  if (counts == NULL || check_rule(p, labels, rows, classes, nodes) != 0 ||
      classes > TD_PARTITION_MAX_CLASSES)
    return TD_EINVAL;
  for (size_t i = 0; i < rows; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return TD_ERANGE;
  memset(counts, 0, (size_t)nodes * (size_t)classes * sizeof *counts);
  if (p->kind == TD_PARTITION_ALL) { /* every node holds every row */
    for (size_t i = 0; i < rows; i++)
      for (unsigned k = 0; k < nodes; k++)
        counts[(size_t)k * (size_t)classes + (size_t)labels[i]]++;
    return 0;
  }
  uint16_t *owner;
  int rc = assign_owners(p, labels, rows, classes, nodes, seed, &owner);
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < rows; i++)
    counts[(size_t)owner[i] * (size_t)classes + (size_t)labels[i]]++;
  free(owner);
  return 0;
}

int td_partition_heldout(const uint64_t *counts, unsigned nodes, int classes,
                         const int32_t *labels, size_t rows, unsigned node, uint64_t seed,
                         uint32_t **idx_out, size_t *n_out) {
  if (idx_out == NULL || n_out == NULL)
    return TD_EINVAL;
  *idx_out = NULL;
  *n_out = 0;
  if (counts == NULL || nodes == 0 || nodes > TD__PARTITION_MAX_NODES || node >= nodes ||
      classes <= 0 || classes > TD_PARTITION_MAX_CLASSES || (labels == NULL && rows > 0) ||
      rows > UINT32_MAX)
    return TD_EINVAL;
  for (size_t i = 0; i < rows; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return TD_ERANGE;
  uint32_t *grouped = malloc((rows ? rows : 1) * sizeof *grouped);
  size_t *start = malloc(((size_t)classes + 1) * sizeof *start);
  uint8_t *mine = calloc(rows ? rows : 1, 1);
  uint32_t *idx = malloc((rows ? rows : 1) * sizeof *idx);
  if (grouped == NULL || start == NULL || mine == NULL || idx == NULL) {
    free(grouped);
    free(start);
    free(mine);
    free(idx);
    return TD_ENOMEM;
  }
  group_by_label(labels, rows, classes, start, grouped);
  td_rng_t rng;
  td_rng_seed2(&rng, seed, TD__PARTITION_HELDOUT_STREAM);
  for (int c = 0; c < classes; c++) {
    uint32_t *members = grouped + start[c];
    size_t count = start[c + 1] - start[c];
    td_rng_shuffle_u32(&rng, members, count);
    /* the class's training rows per node set the cut; a class no node trains
     * on is dealt evenly */
    uint64_t total = 0, before = 0;
    for (unsigned k = 0; k < nodes; k++) {
      uint64_t v = counts[(size_t)k * (size_t)classes + (size_t)c];
      total += v;
      if (k < node)
        before += v;
    }
    uint64_t own = counts[(size_t)node * (size_t)classes + (size_t)c];
    if (total == 0) {
      total = nodes;
      before = node;
      own = 1;
    }
    size_t from = (size_t)llround((double)count * ((double)before / (double)total));
    size_t to = node + 1 == nodes
                    ? count
                    : (size_t)llround((double)count * ((double)(before + own) / (double)total));
    for (size_t i = from; i < to && i < count; i++)
      mine[members[i]] = 1;
  }
  size_t n = 0;
  for (size_t i = 0; i < rows; i++) /* ascending, as td_partition_indices gives them */
    if (mine[i])
      idx[n++] = (uint32_t)i;
  free(grouped);
  free(start);
  free(mine);
  *idx_out = idx;
  *n_out = n;
  return 0;
}
