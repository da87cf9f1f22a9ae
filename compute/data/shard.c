/* shard.c: load + normalise + partition, once for every caller (shard.h).
 * Labelled sets go through td_partition_indices on the whole set's labels,
 * and only the chosen rows are read into memory (td_dataset_open_rows: a
 * node of N holds 1/N of the training set, never the whole, even while it
 * loads); text goes through td_text_partition. A node whose partition is
 * empty is an error, never a silent zero-sample run. Labelled sets also get
 * every node's label counts (the skew `trainctl show` prints) and, with
 * client_eval, this node's held-out share of the test set: the test rows cut
 * class by class in proportion to each node's training rows of the class,
 * so the share follows the node's own label distribution (a fraction of the
 * training rows held out instead would change what the run trains on). */
#include "compute/data/shard.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/data/partition.h"

/* Most label-count slots (nodes x classes) a shard keeps: 32 MiB of counts. */
#define MAX_COUNT_SLOTS (1u << 22)

static int open_text(td_shard_t *out, const td_shard_opts_t *o, const td_partition_t *part,
                     char *why, size_t why_len) {
  td_text_t *whole = NULL;
  int rc = td_text_open(&whole, &out->text_valid, o->dataset, why, why_len);
  if (rc != 0)
    return rc;
  out->full_count = td_text_bytes(whole);
  if (part->kind == TD_PARTITION_ALL || o->nodes == 1) {
    out->text_train = whole;
    return 0;
  }
  rc = td_text_partition(&out->text_train, whole, part, o->rank, o->nodes, o->seed, why,
                         why_len);
  td_text_close(&whole);
  return rc;
}

/* Parts the rule cuts: one per node, or one per virtual client. */
static unsigned parts_of(const td_shard_opts_t *o) {
  return o->clients > 1 ? o->nodes * o->clients : o->nodes;
}

/* The partition's rows, chosen from the whole training set's labels. */
typedef struct {
  td_shard_t *out;
  const td_shard_opts_t *o;
  const td_partition_t *part;
} pick_ctx_t;

/* This node's share of the (normalised) test set, cut by the label counts. */
static int cut_heldout(td_shard_t *out, const td_shard_opts_t *o, char *why, size_t why_len) {
  if (out->label_counts == NULL)
    return td_why(why, why_len, TD_ECONFIG,
                  "client_eval: this dataset's label counts are not kept (more than %u "
                  "nodes x classes); set client_eval = false",
                  MAX_COUNT_SLOTS);
  if (o->clients > 1) { /* one share per client; a client's may be empty */
    out->client_heldout = calloc(o->clients, sizeof *out->client_heldout);
    if (out->client_heldout == NULL)
      return td_why(why, why_len, TD_ENOMEM, "client_eval: out of memory");
    for (unsigned j = 0; j < o->clients; j++) {
      uint32_t *idx = NULL;
      size_t n = 0;
      int rc = td_partition_heldout(out->label_counts, out->count_nodes, out->classes,
                                    td_dataset_labels_const(out->test),
                                    td_dataset_rows(out->test), o->rank * o->clients + j,
                                    o->seed, &idx, &n);
      if (rc == 0 && n > 0)
        rc = td_dataset_subset(&out->client_heldout[j], out->test, idx, n);
      free(idx);
      if (rc != 0)
        return td_why(why, why_len, rc, "client_eval: cannot cut client %u's held-out share: %s",
                      o->rank * o->clients + j, td_strerror(rc));
    }
    return 0;
  }
  uint32_t *idx = NULL;
  size_t n = 0;
  int rc = td_partition_heldout(out->label_counts, out->count_nodes, out->classes,
                                td_dataset_labels_const(out->test), td_dataset_rows(out->test),
                                o->rank, o->seed, &idx, &n);
  if (rc == 0 && n == 0)
    rc = TD_ECONFIG;
  if (rc == 0)
    rc = td_dataset_subset(&out->heldout, out->test, idx, n);
  free(idx);
  if (rc == TD_ECONFIG)
    return td_why(why, why_len, rc,
                  "client_eval: node %u's held-out share of the test set is empty (a test set "
                  "of %zu rows is too small for %u nodes)",
                  o->rank, td_dataset_rows(out->test), o->nodes);
  if (rc != 0)
    return td_why(why, why_len, rc, "client_eval: cannot cut the held-out share: %s",
                  td_strerror(rc));
  return 0;
}

/* Every node's label counts from the whole training set's labels, into the
 * shard (the rule is the same on every node: any node can say them all).
 * Best effort: they are for the ledger and client_eval, so a table too large
 * or no memory for it leaves label_counts NULL rather than fail the load. */
static void count_labels(td_shard_t *out, const td_shard_opts_t *o, const td_partition_t *part,
                         const int32_t *labels, size_t rows, int classes) {
  free(out->label_counts);
  out->label_counts = NULL;
  unsigned parts = parts_of(o);
  if (classes <= 0 || classes > TD_PARTITION_MAX_CLASSES ||
      (size_t)parts * (size_t)classes > MAX_COUNT_SLOTS)
    return;
  uint64_t *counts = calloc((size_t)parts * (size_t)classes, sizeof *counts);
  if (counts == NULL ||
      td_partition_label_counts(part, labels, rows, classes, parts, o->seed, counts) != 0) {
    free(counts);
    return;
  }
  out->label_counts = counts;
  out->count_nodes = parts;
  out->classes = classes;
}

/* Virtual clients: this node's clients' rows, grouped by client, and every
 * client's row count. */
static int pick_clients(const pick_ctx_t *p, const int32_t *labels, size_t rows, int classes,
                        uint32_t **idx, size_t *count, char *why, size_t why_len) {
  const td_shard_opts_t *o = p->o;
  td_shard_t *out = p->out;
  unsigned parts = parts_of(o);
  out->client_offsets = malloc(((size_t)o->clients + 1) * sizeof *out->client_offsets);
  out->client_rows = malloc((size_t)parts * sizeof *out->client_rows);
  if (out->client_offsets == NULL || out->client_rows == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory for %u clients", parts);
  int rc = td_partition_group(p->part, labels, rows, classes, o->rank * o->clients, o->clients,
                              parts, o->seed, idx, out->client_offsets, out->client_rows);
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot partition the dataset into %u clients: %s", parts,
                  td_strerror(rc));
  out->clients = o->clients;
  *count = out->client_offsets[o->clients];
  if (*count == 0)
    return td_why(why, why_len, TD_ECONFIG,
                  "partition %s leaves all %u clients of node %u without samples; use fewer "
                  "clients or another partition",
                  o->partition, o->clients, o->rank);
  return 0;
}

static int pick_partition(const int32_t *labels, size_t rows, int classes, void *user,
                          uint32_t **idx, size_t *count, char *why, size_t why_len) {
  const pick_ctx_t *p = user;
  count_labels(p->out, p->o, p->part, labels, rows, classes);
  if (p->o->clients > 1)
    return pick_clients(p, labels, rows, classes, idx, count, why, why_len);
  int rc = td_partition_indices(p->part, labels, rows, classes, p->o->rank, p->o->nodes,
                                p->o->seed, idx, count);
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot partition the dataset: %s", td_strerror(rc));
  if (*count == 0)
    return td_why(why, why_len, TD_ECONFIG, "partition %s leaves node %u of %u without samples",
                  p->o->partition, p->o->rank, p->o->nodes);
  return 0;
}

static int open_labelled(td_shard_t *out, const td_shard_opts_t *o, const td_partition_t *part,
                         char *why, size_t why_len) {
  double mean, std;
  int rc;
  if (o->clients > 1 && part->kind == TD_PARTITION_ALL)
    return td_why(why, why_len, TD_ECONFIG,
                  "clients = %u needs a partition that splits the data (iid, dirichlet:A or "
                  "shard:S), not all",
                  o->clients);
  if (o->clients > 1 && (size_t)o->nodes * o->clients > TD_PARTITION_MAX_PARTS)
    return td_why(why, why_len, TD_ECONFIG,
                  "%u nodes x clients = %u make %zu clients, over %u; use fewer clients",
                  o->nodes, o->clients, (size_t)o->nodes * o->clients, TD_PARTITION_MAX_PARTS);
  if ((part->kind == TD_PARTITION_ALL || o->nodes == 1) && o->clients <= 1) {
    rc = td_dataset_open_as(&out->train, &out->test, o->dataset, &o->images_as, why,
                            why_len);
    if (rc != 0)
      return rc;
    td_dataset_stats(out->train, &mean, &std);
    out->full_count = td_dataset_rows(out->train);
    count_labels(out, o, part, td_dataset_labels_const(out->train), td_dataset_rows(out->train),
                 td_dataset_classes(out->train));
  } else { /* only this node's rows are ever held (the statistics are the whole set's) */
    pick_ctx_t ctx = {.out = out, .o = o, .part = part};
    rc = td_dataset_open_rows(&out->train, &out->test, o->dataset, &o->images_as,
                              pick_partition, &ctx, &mean, &std, &out->full_count, why,
                              why_len);
    if (rc != 0)
      return rc;
  }
  td_dataset_normalize(out->train, mean, std);
  if (out->test != NULL)
    td_dataset_normalize(out->test, mean, std);
  if (o->client_eval && out->test != NULL && (rc = cut_heldout(out, o, why, why_len)) != 0)
    return rc;
  out->mean = mean;
  out->std = std;
  out->images_as = o->images_as;
  return 0;
}

void td_shard_drop_test(td_shard_t *shard) { td_dataset_close(&shard->test); }

int td_shard_reload_test(td_shard_t *shard, const char *dataset, char *why, size_t why_len) {
  td_dataset_close(&shard->test);
  int rc = td_dataset_open_test(&shard->test, dataset, &shard->images_as, why, why_len);
  if (rc == 0 && shard->test != NULL) {
    if (shard->train != NULL && td_dataset_dim(shard->test) != td_dataset_dim(shard->train)) {
      td_dataset_close(&shard->test);
      return td_why(why, why_len, TD_ESHAPE, "the test set changed since the run started");
    }
    td_dataset_normalize(shard->test, shard->mean, shard->std);
  }
  return rc;
}

int td_shard_open(td_shard_t *out, const td_shard_opts_t *opts, char *why, size_t why_len) {
  if (out == NULL)
    return td_why(why, why_len, TD_EINVAL, "no shard to fill");
  memset(out, 0, sizeof *out);
  if (opts == NULL || opts->dataset == NULL || opts->partition == NULL || opts->nodes == 0 ||
      opts->rank >= opts->nodes)
    return td_why(why, why_len, TD_EINVAL, "bad shard request (node %u of %u)",
                  opts ? opts->rank : 0, opts ? opts->nodes : 0);
  td_partition_t part;
  int rc = td_partition_parse(&part, opts->partition, why, why_len);
  if (rc == 0 && opts->clients > 1 && td_text_is_spec(opts->dataset))
    rc = td_why(why, why_len, TD_ECONFIG,
                "clients = %u: a text dataset cannot be split into virtual clients; set "
                "clients = 1",
                opts->clients);
  else if (rc == 0)
    rc = td_text_is_spec(opts->dataset) ? open_text(out, opts, &part, why, why_len)
                                        : open_labelled(out, opts, &part, why, why_len);
  if (rc != 0)
    td_shard_close(out);
  return rc;
}

void td_shard_close(td_shard_t *shard) {
  if (shard == NULL)
    return;
  td_dataset_close(&shard->train);
  td_dataset_close(&shard->test);
  td_dataset_close(&shard->heldout);
  free(shard->label_counts);
  shard->label_counts = NULL;
  for (unsigned j = 0; shard->client_heldout != NULL && j < shard->clients; j++)
    td_dataset_close(&shard->client_heldout[j]);
  free(shard->client_heldout);
  shard->client_heldout = NULL;
  free(shard->client_offsets);
  shard->client_offsets = NULL;
  free(shard->client_rows);
  shard->client_rows = NULL;
  td_text_close(&shard->text_train);
  td_text_close(&shard->text_valid);
}
