/* partition.c: deterministic splits of a labelled dataset across N nodes.
 *
 * Every node computes the same global assignment from the shared seed (never
 * from its own rank), then keeps its own part, so the parts are disjoint and
 * cover every row without any coordination. */
#include "compute/partition.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"
#include "compute/rng.h"

int td_partition_parse(td_partition_t *out, const char *spec, char *why, size_t why_len) {
  memset(out, 0, sizeof *out);
  char *end;
  if (strcmp(spec, "all") == 0) {
    out->kind = TD_PARTITION_ALL;
    return 0;
  }
  if (strcmp(spec, "iid") == 0) {
    out->kind = TD_PARTITION_IID;
    return 0;
  }
  if (strncmp(spec, "dirichlet:", 10) == 0) {
    const char *p = spec + 10;
    errno = 0;
    double a = strtod(p, &end);
    if (end == p || *end != '\0' || errno != 0 || !isfinite(a) || a <= 0 || a > 1e6)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad partition '%s' (dirichlet:ALPHA needs ALPHA in (0, 1e6])", spec);
    out->kind = TD_PARTITION_DIRICHLET;
    out->alpha = a;
    return 0;
  }
  if (strncmp(spec, "shard:", 6) == 0) {
    const char *p = spec + 6;
    errno = 0;
    unsigned long k = (*p >= '0' && *p <= '9') ? strtoul(p, &end, 10) : 0;
    if (k == 0 || *end != '\0' || errno != 0 || k > 100000)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad partition '%s' (shard:K needs K in [1, 100000])", spec);
    out->kind = TD_PARTITION_SHARD;
    out->shards_per_node = (unsigned)k;
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG,
                "unknown partition '%s' (accepted: all, iid, dirichlet:ALPHA, shard:K)", spec);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* owner[row] = node for every row, from the seed alone */
static int assign(const td_partition_t *p, const int32_t *labels, size_t rows, int classes,
                  unsigned nodes, uint64_t seed, uint16_t *owner) {
  td_rng_t rng;
  td_rng_seed2(&rng, seed, 0x5041525449ull); /* "PARTI" */
  uint32_t *perm = malloc((rows ? rows : 1) * sizeof *perm);
  if (perm == NULL)
    return TD_ENOMEM;
  int rc = 0;
  if (p->kind == TD_PARTITION_IID) {
    for (size_t i = 0; i < rows; i++)
      perm[i] = (uint32_t)i;
    td_rng_shuffle_u32(&rng, perm, rows);
    for (size_t i = 0; i < rows; i++)
      owner[perm[i]] = (uint16_t)((i * nodes) / rows);
  } else if (p->kind == TD_PARTITION_DIRICHLET) {
    /* rows of each class, in a seeded order, cut by Dir(alpha) proportions */
    size_t *count = calloc((size_t)classes, sizeof *count);
    size_t *start = calloc((size_t)classes + 1, sizeof *start);
    double *share = malloc(nodes * sizeof *share);
    if (count == NULL || start == NULL || share == NULL) {
      rc = TD_ENOMEM;
    } else {
      for (size_t i = 0; i < rows; i++)
        count[labels[i]]++;
      for (int c = 0; c < classes; c++)
        start[c + 1] = start[c] + count[c];
      size_t *fill = calloc((size_t)classes, sizeof *fill);
      if (fill == NULL) {
        rc = TD_ENOMEM;
      } else {
        for (size_t i = 0; i < rows; i++)
          perm[start[labels[i]] + fill[labels[i]]++] = (uint32_t)i;
        free(fill);
        for (int c = 0; c < classes; c++) {
          td_rng_shuffle_u32(&rng, perm + start[c], count[c]);
          double total = 0;
          for (unsigned k = 0; k < nodes; k++)
            total += share[k] = td_rng_gamma(&rng, p->alpha);
          if (!(total > 0)) {
            for (unsigned k = 0; k < nodes; k++)
              share[k] = 0;
            share[td_rng_below(&rng, nodes)] = total = 1;
          }
          double cum = 0;
          size_t from = 0;
          for (unsigned k = 0; k < nodes; k++) {
            cum += share[k] / total;
            size_t to = k + 1 == nodes ? count[c] : (size_t)llround(cum * (double)count[c]);
            if (to > count[c])
              to = count[c];
            for (size_t i = from; i < to; i++)
              owner[perm[start[c] + i]] = (uint16_t)k;
            if (to > from)
              from = to;
          }
        }
      }
    }
    free(count);
    free(start);
    free(share);
  } else { /* shard */
    /* stable order by label, then cut into nodes * K shards dealt by a permutation */
    size_t *count = calloc((size_t)classes + 1, sizeof *count);
    size_t shards = (size_t)nodes * p->shards_per_node;
    uint32_t *shard_perm = malloc(shards * sizeof *shard_perm);
    if (count == NULL || shard_perm == NULL) {
      rc = TD_ENOMEM;
    } else {
      for (size_t i = 0; i < rows; i++)
        count[labels[i] + 1]++;
      for (int c = 0; c < classes; c++)
        count[c + 1] += count[c];
      for (size_t i = 0; i < rows; i++)
        perm[count[labels[i]]++] = (uint32_t)i;
      for (size_t s = 0; s < shards; s++)
        shard_perm[s] = (uint32_t)s;
      td_rng_shuffle_u32(&rng, shard_perm, shards);
      for (size_t i = 0; i < rows; i++) {
        size_t shard = (i * shards) / rows;
        owner[perm[i]] = (uint16_t)(shard_perm[shard] / p->shards_per_node);
      }
    }
    free(count);
    free(shard_perm);
  }
  free(perm);
  return rc;
}

int td_partition_indices(const td_partition_t *p, const int32_t *labels, size_t rows,
                         int classes, unsigned node, unsigned nodes, uint64_t seed,
                         uint32_t **idx_out, size_t *n_out) {
  *idx_out = NULL;
  *n_out = 0;
  if (nodes == 0 || nodes > 4096 || node >= nodes || classes <= 0 || rows > UINT32_MAX)
    return TD_EINVAL;
  for (size_t i = 0; i < rows; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return TD_ERANGE;
  uint32_t *idx = malloc((rows ? rows : 1) * sizeof *idx);
  if (idx == NULL)
    return TD_ENOMEM;
  size_t n = 0;
  if (p->kind == TD_PARTITION_ALL || nodes == 1) {
    for (size_t i = 0; i < rows; i++)
      idx[n++] = (uint32_t)i;
  } else {
    uint16_t *owner = malloc((rows ? rows : 1) * sizeof *owner);
    if (owner == NULL) {
      free(idx);
      return TD_ENOMEM;
    }
    int rc = assign(p, labels, rows, classes, nodes, seed, owner);
    if (rc != 0) {
      free(owner);
      free(idx);
      return rc;
    }
    for (size_t i = 0; i < rows; i++)
      if (owner[i] == node)
        idx[n++] = (uint32_t)i;
    free(owner);
  }
  qsort(idx, n, sizeof *idx, cmp_u32); /* already ascending; kept as a guarantee */
  *idx_out = idx;
  *n_out = n;
  return 0;
}
