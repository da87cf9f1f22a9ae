/* text.h: byte-level text datasets: each byte is a token (vocabulary 256).
 *
 * Resolves `dataset = text:PATH[,VALID_PATH]` and `text:fortunes` (Debian's
 * fortunes package, the default text), draws training windows at seeded random
 * offsets, and cuts a node's partition out of the training text. A text owns
 * its bytes. Files are opened so that nothing blocks (compute/data/file.h): a FIFO,
 * a device or a directory is refused at once.
 *
 * Held-out split: without VALID_PATH the last TD_TEXT_VALID_PERCENT percent of
 * the bytes (rounded down, at least one byte) are the validation text and the
 * rest is the training text, the same split on every node and every run.
 *
 * Partitions (`partition` run key) over the training bytes:
 *   all         every node gets the whole training text
 *   iid         the text is cut into blocks of about TD_TEXT_IID_BLOCK bytes
 *               (N*K near-equal blocks, K = bytes / (N * TD_TEXT_IID_BLOCK), at
 *               least 1) and a seeded permutation deals K of them to each node,
 *               as shard:K does: every node sees every part of a text that is
 *               sorted by topic (the fortunes are, by file name), where N
 *               contiguous ranges would give each node its own topics; a
 *               window may run across the seam of two dealt blocks (about
 *               context / 4096 of them, as it may across two fortune files)
 *   shard:K     the text is cut into N*K near-equal contiguous shards; a seeded
 *               permutation deals K of them to each node, which concatenates
 *               its shards in text order (the topic skew of FedAvg's split:
 *               each node sees K scattered stretches of the text)
 *   dirichlet:A refused: it skews class proportions and bytes of text have no
 *               classes to skew; use iid or shard:K.
 * For one seed every node computes the same assignment, so the partitions are
 * pairwise disjoint and together cover the training text exactly once. */
#ifndef TD_TEXT_H
#define TD_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "compute/data/partition.h"
#include "compute/rng.h"

/* Where Debian's fortunes packages (fortunes, fortunes-min) install their
 * plain-text files. TRAIND_FORTUNES_DIR overrides it (used by tests). */
#define TD_FORTUNES_DIR "/usr/share/games/fortunes"
#define TD_FORTUNES_PKG "fortunes"
/* The spec a text model uses when no dataset is named. */
#define TD_TEXT_DEFAULT_SPEC "text:fortunes"
#define TD_TEXT_VALID_PERCENT 10
/* Block size of the iid text partition: a few fortunes, 32 windows of 128. */
#define TD_TEXT_IID_BLOCK 4096u
/* Hard cap on one text file or the fortunes concatenation: 1 GiB. */
#define TD_TEXT_MAX_BYTES ((size_t)1 << 30)

typedef struct td_text td_text_t;

/* Whether a `dataset` spec names a text dataset (starts with "text:"). */
int td_text_is_spec(const char *spec);

/* Resolve a text spec:
 *   text:fortunes        the concatenation, in sorted name order, of the files
 *                        without a dot in their name in TD_FORTUNES_DIR
 *   text:PATH            PATH, split into training and held-out bytes
 *   text:PATH,VALID_PATH training and validation texts from two files
 * Fails with TD_ECONFIG (bad spec), TD_ENOENT (missing file: names the path,
 * and the Debian package for fortunes), TD_EIO (not a regular file, read
 * error), TD_ECORRUPT (empty, or too short to split), TD_ENOMEM; why holds one
 * line. Caller owns both results. */
int td_text_open(td_text_t **train, td_text_t **valid, const char *spec, char *why,
                 size_t why_len);
/* A text holding a copy of bytes[0..len), len >= 1 (tests, partitions). */
int td_text_from_bytes(td_text_t **out, const uint8_t *bytes, size_t len);
/* NULL-safe; sets *self_p to NULL. */
void td_text_close(td_text_t **self_p);
size_t td_text_bytes(const td_text_t *t);
/* Borrowed until close. */
const uint8_t *td_text_data(const td_text_t *t);

/* TD_ECORRUPT + why (naming `what`, e.g. "training text") when t holds fewer
 * than context + 1 bytes, i.e. not one training window. */
int td_text_check_window(const td_text_t *t, int context, const char *what, char *why,
                         size_t why_len);

/* rows windows of context + 1 bytes at offsets o uniform in
 * [0, bytes - context - 1]: tokens[r][t] = data[o + t], targets[r][t] =
 * data[o + t + 1] (row-major rows x context). Requires bytes >= context + 1. */
void td_text_windows(const uint8_t *data, size_t bytes, int context, int rows, td_rng_t *rng,
                     int32_t *tokens, int32_t *targets);

/* Node `node` of `nodes` share of src's bytes under partition p (see the top of
 * this file), as a new text (a copy). TD_ECONFIG + why for dirichlet or a
 * partition that leaves the node no bytes, TD_EINVAL, TD_ENOMEM. Caller owns
 * *out. */
int td_text_partition(td_text_t **out, const td_text_t *src, const td_partition_t *p,
                      unsigned node, unsigned nodes, uint64_t seed, char *why, size_t why_len);

#endif
