/* round.h: collecting the updates of a round and aggregating them.
 *
 * Pure bookkeeping over flat fp32 buffers, driven by events (a chunk arrived,
 * a peer died) and free of sockets, so it is unit-tested without a network.
 * An update is a compressed message (compress/codec.h) cut into chunks; when
 * its last chunk arrives it is handed out to be decoded off the receiving
 * thread and handed back, and any inconsistency discards it.
 * TD_ROUND_SLOTS slots are kept (a window of up to TD_ROUND_SLOTS_MAX when
 * opened with td_round_open_window): the round being collected (t) and the next
 * ones, because a peer that already closed round t may send later updates
 * before our round t closes: one round ahead in sync mode, three in overlap
 * mode (our compute may post t + 1 while t is open; a peer that has it can
 * close t + 1, compute t + 2 and, released, t + 3; it cannot release t + 2
 * before our t + 2 update, which waits for our t to close); with topology
 * gossip or groups the session opens the widest window, as partners drift
 * as far apart as the rounds news takes to cross the run (no barrier: each
 * node waits for its round's partners only; about log2 N, twice that
 * allowed). An entry holds buffers only while a peer's update is in it. A chunk for an
 * older round is reported as late (its staleness is recorded by the caller);
 * one beyond the window is refused. The complete updates of a round are
 * handed to the aggregation (scheduler/aggregate.h) by td_round_collect(). */
#ifndef TD_ROUND_H
#define TD_ROUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/params.h"
#include "scheduler/aggregate.h"
#include "proto/limits.h"

#define TD_ROUND_MAX_PEERS TD_MAX_RUN_MEMBERS
#define TD_ROUND_SLOTS 4
#define TD_ROUND_SLOTS_MAX 16

typedef struct td_round td_round_t;

typedef enum {
  TD_CHUNK_ACCEPTED = 0, /* stored; the update is not complete yet */
  TD_CHUNK_COMPLETED,    /* td_round_put_decoded: the peer's update is complete */
  TD_CHUNK_DUPLICATE,    /* already had it; ignored */
  TD_CHUNK_LATE,         /* for a round already closed */
  TD_CHUNK_AHEAD,        /* beyond the slot window; dropped */
  TD_CHUNK_REJECTED,     /* td_round_put_decoded: it did not decode (malformed, NaN/Inf) */
  TD_CHUNK_ASSEMBLED,    /* this chunk completed the message, which waits for
                            td_round_take_message() / td_round_put_decoded() */
} td_chunk_result_t;

typedef struct {
  uint64_t peer;
  uint64_t round;
  uint64_t samples;
  uint64_t bytes; /* message bytes received for the update */
  double loss;
  unsigned codec; /* codec id of the update's largest tensor */
} td_update_info_t;

/* For a model with this layout (borrowed; must outlive the collector).
 * Caller owns *out. */
int td_round_open(td_round_t **out, const td_layout_t *layout);
/* The same with a window of `slots` rounds (2 to TD_ROUND_SLOTS_MAX; TD_EINVAL
 * otherwise). */
int td_round_open_window(td_round_t **out, const td_layout_t *layout, unsigned slots);
void td_round_close(td_round_t **self_p);

/* Start collecting `round` from the given peers (the local node excluded).
 * Updates already buffered for it and the rounds after it are kept when
 * `round` lies inside the window; any other jump clears every slot. */
void td_round_begin(td_round_t *r, uint64_t round, const uint64_t *peers, size_t n_peers);
uint64_t td_round_current(const td_round_t *r);

/* One chunk of a peer's update message. Checks the chunk index, sizes and
 * offsets against the message bound of the layout and returns TD_EPROTO for
 * anything inconsistent; otherwise *result says what happened (ACCEPTED,
 * DUPLICATE, LATE, AHEAD, or ASSEMBLED when it completed the message) and
 * *info describes the update when the message is complete. */
int td_round_add_chunk(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                       uint32_t chunk, uint32_t chunks, uint64_t total_bytes,
                       const uint8_t *payload, size_t len, double loss,
                       td_chunk_result_t *result, td_update_info_t *info);

/* Decoding runs off the thread that receives: the chunk that completes a
 * message reports TD_CHUNK_ASSEMBLED, and td_round_take_message() hands
 * the message out (caller owns *msg; *ticket names the update); the caller
 * decodes it anywhere with td_codec_decode_message() into td_round_numel()
 * floats it allocated with td_params_alloc(), and td_round_put_decoded()
 * takes them back (*data is consumed) with ok = whether it decoded:
 * *result is then COMPLETED or REJECTED, or LATE when the round has left
 * the window or the entry was recycled meanwhile (the data is dropped). Until
 * then the update counts as not complete. All of these on the collector's
 * thread; nothing here is shared with the decoding thread. */
size_t td_round_numel(const td_round_t *r);
int td_round_take_message(td_round_t *r, uint64_t round, uint64_t peer, uint8_t **msg,
                          size_t *len, uint64_t *ticket);
void td_round_put_decoded(td_round_t *r, uint64_t round, uint64_t peer, uint64_t ticket,
                          float **data, unsigned codec, bool ok, td_chunk_result_t *result,
                          td_update_info_t *info);

/* A peer is no longer waited for in the current round (it died or left). */
void td_round_forget_peer(td_round_t *r, uint64_t peer);
/* What the current round holds of `peer`'s update. */
typedef enum {
  TD_PEER_NONE = 0, /* nothing of it */
  TD_PEER_PARTIAL,  /* some of its chunks */
  TD_PEER_DECODING, /* every chunk: handed out to be decoded */
  TD_PEER_HAVE,     /* complete and decoded: in the average */
  TD_PEER_REFUSED,  /* complete, but it did not decode: never aggregated */
} td_round_peer_state_t;
td_round_peer_state_t td_round_peer_state(const td_round_t *r, uint64_t peer);
/* The current round's update of `peer` starts over and is waited for again:
 * the chunks that came so far, or a message that did not decode, are
 * dropped (it is about to come again by another way, in a copy whose chunks
 * need not match). False, and nothing changes, when it is in the average
 * (HAVE) or being decoded. */
bool td_round_restart_peer(td_round_t *r, uint64_t peer);
/* The current round's decoded update of `peer` is dropped and counts as
 * refused (REFUSED: complete, never aggregated), so that a copy of another
 * origin's choosing may take its place (td_round_restart_peer). False, and
 * nothing changes, unless it is held (HAVE). */
bool td_round_refuse_peer(td_round_t *r, uint64_t peer);
/* True when every expected peer's update for the current round is complete. */
bool td_round_complete(const td_round_t *r);
/* Expected peers whose update is not complete (for "late" records). */
size_t td_round_missing(const td_round_t *r, uint64_t *peers, size_t cap);

/* The complete updates of the current round, as aggregation inputs
 * (scheduler/aggregate.h) with their claimed samples as weight: at most cap,
 * updates without samples left out. The deltas are borrowed and stay unchanged
 * until td_round_begin() moves past the round, so the arithmetic may run on
 * another thread meanwhile. The local update is the caller's to add. */
size_t td_round_collect(const td_round_t *r, td_agg_input_t *out, size_t cap);
/* How many updates td_round_collect() would hand out (with room for all). */
size_t td_round_received(const td_round_t *r);
/* Whether a chunk of the round after the current one came in: in sync mode
 * its sender closed the current round already. */
bool td_round_moved_on(const td_round_t *r);

/* Updates are cut by the one chunker of proto/limits.h. */
#define TD_ROUND_CHUNK_BYTES TD_CHUNK_BYTES
uint32_t td_round_chunk_count(uint64_t total_bytes);

#endif
