/* recon.h: anchor reconciliation, the loop-side collector.
 *
 * With lossy per-link codecs each node applies its own delta exactly and its
 * peers' deltas as its links decoded them, so the anchors of a sync or overlap
 * run drift apart. Every `reconcile` rounds (and after the last round) each
 * node sends its anchor's distance from the shared initial model, D = anchor -
 * init, in fp16 to every member; every node averages the same decoded
 * messages, its own included as decoded, and moves its anchor by mean - D_own.
 * Every node then holds the same consensus for that round plus only the
 * progress made since (the averaging it corrects is ALGORITHMS.md section 5).
 *
 * The mean is bit-identical on every node whatever the order the messages
 * arrive in: fp16 values are integer multiples of 2^-24 below 2^16, so their
 * sums in double are exact. Messages come in 64 KiB chunks in order; a gap is
 * dropped and asked for again from the received offset. Pure bookkeeping, no
 * sockets: unit-tested in tests/unit/test_recon.c. */
#ifndef TD_RECON_H
#define TD_RECON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/params.h"

#define TD_RECON_SLOTS 2
#define TD_RECON_MAX_MEMBERS 64

typedef struct td_recon td_recon_t;

typedef enum {
  TD_RECON_ACCEPTED = 0, /* stored; the message is not complete yet */
  TD_RECON_COMPLETED,    /* this chunk completed the member's message */
  TD_RECON_DUPLICATE,    /* already had these bytes, or a gap (ask again from the offset) */
  TD_RECON_LATE,         /* for a round already reconciled */
  TD_RECON_AHEAD,        /* no free slot: dropped (asked again later) */
  TD_RECON_REJECTED,     /* completed but did not decode as fp16 (malformed, NaN/Inf):
                            the member no longer counts for the round */
} td_recon_result_t;

/* Collector for a model of this layout (borrowed; must outlive it). Caller
 * owns *out. */
int td_recon_open(td_recon_t **out, const td_layout_t *layout);
void td_recon_close(td_recon_t **self_p);

/* Bytes of every member's message (exact: fp16 for the layout). */
size_t td_recon_message_bytes(const td_recon_t *c);

/* Our own contribution for `round`: encodes d (numel floats, anchor - init) in
 * fp16, counts the decoded message as member `self`, and sets the members the
 * round waits for (bit i = member index i, self included). *msg stays valid
 * until the collector forgets the round (two reconciled rounds later), so it
 * can be sent and re-sent. TD_ENUMERIC for a non-finite d, TD_ERANGE when
 * both slots hold other unfinished rounds. now: seconds, any monotonic clock. */
int td_recon_own(td_recon_t *c, uint64_t round, const float *d, size_t self, uint64_t expected,
                 double now, const uint8_t **msg, size_t *len, char *why, size_t why_len);
/* The message we sent for `round`, while held (for a resume request). */
bool td_recon_own_message(const td_recon_t *c, uint64_t round, const uint8_t **msg, size_t *len);

/* One chunk of member's message for `round`. TD_EPROTO for sizes that do not
 * match the layout; otherwise *result says what happened. */
int td_recon_chunk(td_recon_t *c, uint64_t round, size_t member, uint64_t offset,
                   uint64_t total, const uint8_t *data, size_t len, double now,
                   td_recon_result_t *result, char *why, size_t why_len);

/* Members whose message for a round in progress has not grown for `after`
 * seconds: up to cap (round, member, offset) triples to ask again; their clock
 * restarts, so each is reported at most every `after` seconds. */
typedef struct {
  uint64_t round;
  size_t member;
  uint64_t offset;
} td_recon_stall_t;
size_t td_recon_stalled(td_recon_t *c, double now, double after, td_recon_stall_t *out,
                        size_t cap);

/* The oldest round whose messages are all in, or that has waited `timeout`
 * seconds since our own contribution (then with those that came): writes the
 * mean into mean (numel floats), *used / *expected the members counted and
 * waited for, and frees the slot. False when none is ready. */
bool td_recon_take(td_recon_t *c, double now, double timeout, uint64_t *round, float *mean,
                   unsigned *used, unsigned *expected);

#endif
