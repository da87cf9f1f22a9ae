/* limits.h: the limits every layer shares, and how transfers are chunked.
 *
 * TD_MAX_NODES bounds a cluster: the membership table, its links and the
 * peer lists on the wire are this size, and a node past it is refused at the
 * door (the invite's grant or the hello's welcome says why). TD_MAX_RUN_MEMBERS
 * bounds one run: a run's members, the peers a round collects from and the
 * member bitmasks of sampling and reconciliation (64-bit words) are this size,
 * and a start on more live members is refused with the reason. Updates (scheduler/round.h) and blobs (models, late-join seeds,
 * reconciliation messages: daemon/session/transfer.c) travel as payloads of at most
 * TD_CHUNK_BYTES, cut at multiples of it from the start of the message, so a
 * resumed transfer asks again from any chunk boundary. Pure arithmetic. */
#ifndef TD_LIMITS_H
#define TD_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* Nodes in one cluster, this one included. */
#define TD_MAX_NODES 256

/* Members of one run (at most 64: sampling and reconciliation keep members in
 * a 64-bit mask); never more than TD_MAX_NODES. */
#define TD_MAX_RUN_MEMBERS 64
_Static_assert(TD_MAX_RUN_MEMBERS <= 64 && TD_MAX_RUN_MEMBERS <= TD_MAX_NODES,
               "a run's members fit a 64-bit mask and the cluster");

/* Largest payload of one UpdateChunk / SnapshotChunk (a multiple of 4). */
#define TD_CHUNK_BYTES (64u * 1024u)

/* Chunks of a message of `total` bytes. */
static inline uint32_t td_chunk_count(uint64_t total) {
  return (uint32_t)((total + TD_CHUNK_BYTES - 1) / TD_CHUNK_BYTES);
}

/* Payload bytes of the chunk that starts at `offset` (0 at or past the end). */
static inline size_t td_chunk_len(uint64_t total, uint64_t offset) {
  if (offset >= total)
    return 0;
  return total - offset < TD_CHUNK_BYTES ? (size_t)(total - offset) : TD_CHUNK_BYTES;
}

#endif
