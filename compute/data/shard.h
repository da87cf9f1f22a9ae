/* shard.h: the data one node trains on, from the run keys to memory.
 *
 * One sequence shared by peer runs (daemon/run/run.c) and the standalone trainer
 * (daemon/run/standalone.c): resolve the `dataset` key, normalise labelled
 * features with the statistics of the WHOLE training set (so every node of a
 * run, and the standalone baseline, sees identically scaled inputs), then cut
 * node `rank` of `nodes`'s partition under the `partition` key and the run
 * seed. Text datasets (`text:`, compute/data/text.h) take the same path and come
 * back as byte ranges instead of rows. Runs on the caller's thread; every file
 * is opened without blocking (compute/data/file.h). */
#ifndef TD_SHARD_H
#define TD_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/data/dataset.h"
#include "compute/data/text.h"

typedef struct {
  const char *dataset;   /* run key `dataset` */
  const char *partition; /* run key `partition` */
  unsigned rank, nodes;  /* this node's place: rank < nodes */
  uint64_t seed;         /* run seed: the partition depends on it and nothing else */
  td_image_shape_t images_as; /* what images:DIR becomes: the model's input(C,H,W);
                                 all zero for a model with flat input (mlp) */
  bool client_eval;      /* also cut this node's held-out share of the test set */
  unsigned clients;      /* virtual clients per node (0 or 1: the node is one client);
                            the partition is cut into nodes x clients parts, and this
                            node's are parts rank x clients + j, j < clients */
} td_shard_opts_t;

/* What a node trains and evaluates on. Exactly one family is set: labelled
 * (train, test) or text (text_train, text_valid). Owned by the shard until
 * td_shard_close(); a caller may take a pointer over and set the field NULL. */
typedef struct {
  td_dataset_t *train;     /* the node's rows (all rows for `all` or one node) */
  td_dataset_t *test;      /* the whole test set; NULL when the spec names none */
  td_text_t *text_train;   /* the node's bytes of the training text */
  td_text_t *text_valid;   /* the whole validation text (held out or VALID_PATH) */
  size_t full_count;       /* rows, or bytes of text, of the whole training set */
  double mean, std;        /* labelled: the whole training set's statistics, which
                              normalised train and test */
  td_image_shape_t images_as; /* the opts' (td_shard_reload_test converts alike) */
  /* labelled: every node's label counts under the partition rule
   * (td_partition_label_counts), label_counts[k * classes + c]; NULL for text
   * and where nodes x classes is over 4M slots (none are kept then) */
  uint64_t *label_counts;
  unsigned count_nodes;
  int classes;
  /* opts.client_eval with a test set: this node's held-out share of it
   * (td_partition_heldout), normalised as the test set; else NULL */
  td_dataset_t *heldout;
  /* clients > 1: this node's clients' rows are consecutive in train, client j's
   * [client_offsets[j], client_offsets[j + 1]) (clients + 1 values); every
   * client's row count of the run, client_rows[rank x clients + j]
   * (nodes x clients values); label_counts and count_nodes are per client
   * (count_nodes = nodes x clients); with client_eval, heldout is NULL and
   * client_heldout[j] is client j's share (NULL where it is empty). */
  unsigned clients;
  size_t *client_offsets;
  uint32_t *client_rows;
  td_dataset_t **client_heldout;
} td_shard_t;

/* Load, normalise and partition. On failure nothing is held and why has one
 * line: the loader's codes (TD_ENOENT, TD_EIO, TD_ECORRUPT, TD_ENOMEM), or
 * TD_ECONFIG for a bad partition or one that leaves this node no data. */
int td_shard_open(td_shard_t *out, const td_shard_opts_t *opts, char *why, size_t why_len);
/* A node that evaluates only after its last round need not hold the test
 * rows while it trains: td_shard_drop_test() frees them, and
 * td_shard_reload_test() reads them again from the `dataset` key's files,
 * normalised as before (the whole training set's statistics); 0 with
 * shard->test NULL when the key names no test set, else the loader's error
 * and why. */
void td_shard_drop_test(td_shard_t *shard);
int td_shard_reload_test(td_shard_t *shard, const char *dataset, char *why, size_t why_len);
/* Close whatever the shard still holds; NULL-safe and idempotent. */
void td_shard_close(td_shard_t *shard);

#endif
