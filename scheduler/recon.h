/* recon.h: anchor reconciliation, the loop-side collector.
 *
 * With lossy per-link codecs each node applies its own delta exactly and its
 * peers' deltas as its links decoded them, so the anchors of a sync or overlap
 * run drift apart. Every `reconcile` rounds (and after the last round) each
 * node sends its anchor's distance from the shared initial model, D = anchor -
 * init, in fp16 to every member; every node averages the same decoded
 * messages, its own included as decoded, and moves its anchor by mean - D_own.
 * Every node then holds the same consensus for that round plus only the
 * progress made since (the averaging it corrects:
 * docs/algorithms.md#local-sgd-and-the-outer-optimizer).
 *
 * The mean is bit-identical on every node whatever the order the messages
 * arrive in: fp16 values are integer multiples of 2^-24 below 2^16, so their
 * sums in double are exact. Messages come in 64 KiB chunks in order; a gap is
 * dropped and asked for again from the received offset.
 *
 * On uneven links the exchange can instead go through a hub (td_recon_plan):
 * every member sends its message to the member with the best uplink only, the
 * hub collects them all and sends the mean back in fp32 (td_recon_mean_chunk),
 * so a 2 Mbit/s node sends one message instead of k - 1. The hub's mean is the
 * float the members would have computed themselves from the same messages, so
 * a member that falls back to collecting (the hub is slow or gone) ends on the
 * same model.
 *
 * Under a robust aggregate (td_recon_set_rule) the mean would hand any one
 * member the final model: the round's anchors are combined by the run's rule
 * instead (each member weighted 1), and a hub's mean is refused, for it
 * would be taken on trust. Pure bookkeeping, no sockets: unit-tested in
 * tests/unit/test_recon.c. */
#ifndef TD_RECON_H
#define TD_RECON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/params.h"
#include "proto/limits.h"
#include "scheduler/aggregate.h"

#define TD_RECON_SLOTS 2
#define TD_RECON_MAX_MEMBERS TD_MAX_RUN_MEMBERS
#define TD_RECON_MESH ((size_t)-1) /* td_recon_plan: no hub, everyone to everyone */

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

/* The run's aggregate rule (copied). A robust one (a kind other than the
 * mean, or a norm bound) makes td_recon_take combine the anchors by it, keeps
 * each member's message until then (one fp16 model per member), and refuses
 * every hub's mean chunk (REJECTED); NULL or the plain mean: the mean. Set
 * before the first message. */
void td_recon_set_rule(td_recon_t *c, const td_agg_spec_t *rule);
bool td_recon_robust(const td_recon_t *c);

/* Bytes of every member's message (exact: fp16 for the layout). */
size_t td_recon_message_bytes(const td_recon_t *c);
/* Bytes of a hub's mean message (fp32 for the layout). */
size_t td_recon_mean_bytes(const td_recon_t *c);

typedef enum {
  TD_RECON_VIA_AUTO = 0, /* a hub when the reported uplinks make it faster */
  TD_RECON_VIA_MESH,     /* every member sends to every member */
  TD_RECON_VIA_HUB,      /* always through a hub */
} td_recon_via_t;

/* Who reconciles a round among the `expected` members (bit i = index i), from
 * their uplinks in bytes/s (uplink[i], 0 or less: unknown) and the message
 * size. The hub is the lowest index whose uplink is at least half the best
 * (near-equal nodes do not flip the choice between members' views; with no
 * uplink known, the lowest index). auto takes the hub when every uplink is
 * known, there are at least 3 members and its estimate, the slowest other
 * member's message plus (k - 1) fp32 means at the hub's uplink, is under 0.8
 * of the mesh's, k - 1 messages at the slowest uplink. Returns the hub's
 * index or TD_RECON_MESH; *hub_s (may be NULL) gets the hub estimate in
 * seconds (0 when unknown). */
size_t td_recon_plan(const double *uplink, uint64_t expected, td_recon_via_t via,
                     size_t msg_bytes, double *hub_s);

/* Our own contribution for `round`: encodes d (numel floats, anchor - init) in
 * fp16, counts the decoded message as member `self`, and sets the members the
 * round waits for (bit i = member index i, self included). *msg stays valid
 * until the collector forgets it (after four more of our own), so it
 * can be sent and re-sent. TD_ENUMERIC for a non-finite d, TD_ERANGE when
 * both slots hold other unfinished rounds. now: seconds, any monotonic clock. */
int td_recon_own(td_recon_t *c, uint64_t round, const float *d, size_t self, uint64_t expected,
                 double now, const uint8_t **msg, size_t *len, char *why, size_t why_len);
/* The message we sent for `round`, while held (for a resume request). */
bool td_recon_own_message(const td_recon_t *c, uint64_t round, const uint8_t **msg, size_t *len);
/* Through a hub, the other members send us nothing: report no stall for
 * `round` (td_recon_stalled) during the next `seconds`, the time the hub's
 * mean should take; after that every missing message is asked for (the round
 * falls back to the mesh). */
void td_recon_quiet(td_recon_t *c, uint64_t round, double now, double seconds);

/* One chunk of member's message for `round`; `to_hub`: the member sent it to
 * us as its hub and waits for the mean (td_recon_taken_t.want_mean). TD_EPROTO
 * for sizes that do not match the layout; otherwise *result says what
 * happened. */
int td_recon_chunk(td_recon_t *c, uint64_t round, size_t member, uint64_t offset,
                   uint64_t total, const uint8_t *data, size_t len, bool to_hub, double now,
                   td_recon_result_t *result, char *why, size_t why_len);
/* One chunk of the mean that member `hub` collected for `round` from `used`
 * of `expected` anchors (fp32, td_recon_mean_bytes). COMPLETED makes the round
 * ready as soon as our own message is in; REJECTED (not finite fp32 of the
 * layout, used 0 or more than expected): the round waits for its own
 * collection. Results and errors as td_recon_chunk. */
int td_recon_mean_chunk(td_recon_t *c, uint64_t round, size_t hub, uint64_t offset,
                        uint64_t total, const uint8_t *data, size_t len, unsigned used,
                        unsigned expected, double now, td_recon_result_t *result, char *why,
                        size_t why_len);
/* A hub's mean message for mean (numel floats); *msg is valid until the next
 * call. */
int td_recon_encode_mean(td_recon_t *c, const float *mean, const uint8_t **msg, size_t *len);

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

/* A reconciled round, as td_recon_take hands it out. */
typedef struct {
  uint64_t round;
  unsigned used, expected; /* members counted in the mean / waited for */
  size_t hub;              /* the member whose mean this is, TD_RECON_MESH: collected here */
  uint64_t want_mean;      /* collected here: members that sent to us as their hub
                              (never under a robust rule) */
  uint64_t refused;        /* robust rule: members whose anchor it rejected (bit = index) */
} td_recon_taken_t;

/* The oldest round whose messages are all in, whose hub's mean came, or that
 * has waited `timeout` seconds since our own contribution (then with the
 * messages that came): writes the mean (under a robust rule: the anchors
 * combined by it) into mean (numel floats), fills *t and frees the slot.
 * False when none is ready. */
bool td_recon_take(td_recon_t *c, double now, double timeout, float *mean, td_recon_taken_t *t);

#endif
