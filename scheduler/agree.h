/* agree.h: model-state agreement: the canonical hash of a run's shared state
 * and the majority rule over the members' hashes.
 *
 * The shared state of a sync or overlap run with an exact exchange is the
 * anchor after a round's outer step, and the outer momentum buffer when the
 * run has one: every honest member holds them bit for bit
 * (docs/algorithms.md#model-state-agreement). Its hash is BLAKE2b-256
 * (libsodium's crypto_generichash) of a canonical byte form: the anchor's
 * tensors in layout order, each tensor's floats as little-endian IEEE-754
 * binary32 (the alignment padding between tensors is left out), then the
 * momentum's the same way, so two nodes of any byte order that hold the same
 * state produce the same 32 bytes, and one that differs in one bit does not.
 *
 * The vote: a hash is agreed when more than half of the round's members
 * (not only of those that answered) hold it. So no member alone, whatever it
 * claims, can outvote two honest ones, and a split with no such majority
 * repairs nobody. Pure functions, no sockets: tests/unit/test_agree.c. */
#ifndef TD_AGREE_H
#define TD_AGREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/params.h"

#define TD_AGREE_HASH_BYTES 32
/* td_agree_decide: no hash is held by a majority. */
#define TD_AGREE_NONE ((size_t)-1)

/* BLAKE2b-256 of the canonical form of `anchor` followed by `mom` (NULL:
 * none), both buffers of `layout` (td_layout_numel() floats), into out.
 * Fails (TD_EIO) only when libsodium cannot start. */
int td_agree_hash(const td_layout_t *layout, const float *anchor, const float *mom,
                  uint8_t out[TD_AGREE_HASH_BYTES]);

/* The first 8 bytes of a hash as 16 hex digits (+ NUL) in text[17], for logs,
 * status and the ledger. */
void td_agree_short(const uint8_t hash[TD_AGREE_HASH_BYTES], char text[17]);

/* The index into hashes[0..n) of one holding the hash more than members / 2
 * of the round's `members` hold; TD_AGREE_NONE when there is none (or n >
 * members, which a caller counts wrong). *holders: how many hold it (or the
 * largest group when none is agreed). */
size_t td_agree_decide(const uint8_t (*hashes)[TD_AGREE_HASH_BYTES], size_t n, size_t members,
                       size_t *holders);

#endif
