/* shard.c: load + normalise + partition + subset, once for every caller
 * (shard.h). Labelled sets go through td_partition_indices and a subset copy;
 * text goes through td_text_partition. A node whose partition is empty is an
 * error, never a silent zero-sample run. */
#include "compute/data/shard.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/data/partition.h"

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

static int open_labelled(td_shard_t *out, const td_shard_opts_t *o, const td_partition_t *part,
                         char *why, size_t why_len) {
  int rc = td_dataset_open_as(&out->train, &out->test, o->dataset, &o->images_as, why,
                              why_len);
  if (rc != 0)
    return rc;
  double mean, std;
  td_dataset_stats(out->train, &mean, &std);
  td_dataset_normalize(out->train, mean, std);
  if (out->test != NULL)
    td_dataset_normalize(out->test, mean, std);
  out->full_count = td_dataset_rows(out->train);
  if (part->kind == TD_PARTITION_ALL || o->nodes == 1)
    return 0;
  uint32_t *idx = NULL;
  size_t count = 0;
  rc = td_partition_indices(part, td_dataset_labels_const(out->train),
                            td_dataset_rows(out->train), td_dataset_classes(out->train), o->rank,
                            o->nodes, o->seed, &idx, &count);
  if (rc != 0)
    return td_why(why, why_len, rc, "cannot partition the dataset: %s", td_strerror(rc));
  td_dataset_t *sub = NULL;
  if (count == 0)
    rc = td_why(why, why_len, TD_ECONFIG, "partition %s leaves node %u of %u without samples",
                o->partition, o->rank, o->nodes);
  else if ((rc = td_dataset_subset(&sub, out->train, idx, count)) != 0)
    td_why(why, why_len, rc, "cannot copy the partition: %s", td_strerror(rc));
  free(idx);
  if (rc != 0)
    return rc;
  td_dataset_close(&out->train);
  out->train = sub;
  return 0;
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
  if (rc == 0)
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
  td_text_close(&shard->text_train);
  td_text_close(&shard->text_valid);
}
