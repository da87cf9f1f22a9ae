/* linkq.h: the send side of one peer link — priority queues, a byte window
 * sized from measured goodput and RTT, and the acks that open it.
 *
 * The daemon packs outgoing messages into frames and pushes each into one of
 * three classes; the link's pump asks td_linkq_pop() for the next frame it may
 * hand to the socket now. Pure bookkeeping: no sockets, no clocks; every time
 * is a double in seconds supplied by the caller (non-decreasing per link).
 *
 * Order. Classes are served by priority (control, then updates, then bulk),
 * FIFO within a class, with one exception: bulk is never starved. While a
 * ready bulk frame waits, the update bytes sent past it are counted, and once
 * they reach TD_LINKQ_BULK_RATIO times its length it goes ahead of the
 * updates (the count restarts from what is left over). So on a link that
 * updates keep full, bulk (a snapshot for a late joiner or a knowledge
 * transfer) still gets 1 / (1 + ratio) of the bytes, a quarter, and updates
 * the rest; a link with room serves both as before. A frame becomes ready
 * delay_s after its push (user-space added latency); a class whose head is
 * not ready yet is passed over. So a control frame waits at most for the
 * frame the socket is already sending.
 *
 * Window. Acked frames (update and bulk chunks) count as in flight from pop
 * until their ack or their expiry; control frames never wait on the window.
 * An acked frame is admitted when in_flight + len <= window, or when nothing
 * is in flight (so a frame larger than the window still goes, alone). When the
 * window holds back the head of an acked class, lower classes wait too: they
 * would only take the window the higher class is waiting for.
 *   window = clamp(goodput_bps * (rtt_min_s + window_target_s),
 *                  window_min, window_max)
 * and window_min until the first goodput sample. goodput * rtt_min is the
 * bandwidth-delay product; window_target_s adds that much standing queue at
 * the bottleneck, enough to keep it busy while acks are in transit.
 *
 * Measurements. Each ack gives an RTT sample (ack time - send time) and a
 * delivery-rate sample computed the BBR way: at send the frame records the
 * link's (delivered bytes, delivered time); at ack
 *   rate = (delivered_now - delivered_at_send) / (now - delivered_time_at_send)
 * where delivered_now includes this frame. The delivered time restarts at a
 * send into an empty pipe, so idle periods do not dilute the rate. Both feed
 * EWMAs with weight rho (first sample taken as is); rtt_min is the minimum.
 *
 * Sequence numbers are per link, > 0 and increasing in push order; the
 * receiver echoes them in its acks. Acks for unknown, unsent or already acked
 * sequence numbers are ignored, and td_linkq_expire() forgets frames whose ack
 * never came, so neither a hostile peer nor a lost ack can wedge the link.
 * Ack lookup is O(log n) in the frames in flight. */
#ifndef TD_LINKQ_H
#define TD_LINKQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { TD_PRIO_CONTROL = 0, TD_PRIO_UPDATE = 1, TD_PRIO_BULK = 2, TD_PRIO_COUNT } td_prio_t;

typedef struct td_linkq td_linkq_t;

/* Update bytes a waiting bulk frame lets pass, per byte of its own. */
#define TD_LINKQ_BULK_RATIO 3

/* A zero window_min, window_max or rho takes its default (128 KiB, 4 MiB,
 * 0.2); window_target_s and delay_s are used as given (defaults: 0.05, 0). */
typedef struct {
  size_t window_min;      /* bytes in flight always allowed */
  size_t window_max;      /* cap on the window, >= window_min */
  double window_target_s; /* standing queue allowed on top of the BDP, seconds */
  double rho;             /* EWMA weight of goodput and RTT samples, (0, 1] */
  double delay_s;         /* a frame becomes sendable delay_s after its push */
} td_linkq_opts_t;

/* A frame handed out by td_linkq_pop(); the caller owns `frame`. */
typedef struct {
  uint8_t *frame;
  size_t len;
  td_prio_t prio;
  uint64_t seq;
} td_linkq_frame_t;

typedef struct {
  double goodput_bps; /* delivery-rate EWMA, bytes/s; 0 until measured */
  double rtt_s;       /* RTT EWMA; 0 until measured */
  double rtt_min_s;   /* smallest RTT sample; 0 until measured */
  size_t window;      /* bytes */
  size_t in_flight;   /* bytes popped, acked, not yet acked or expired */
  size_t queued_bytes[TD_PRIO_COUNT];
  size_t queued_frames[TD_PRIO_COUNT];
  uint64_t bytes_sent;  /* every popped byte, control included */
  uint64_t bytes_acked;
  uint64_t frames_lost; /* acked frames forgotten by td_linkq_expire() */
} td_linkq_stats_t;

/* NULL opts = defaults. Caller owns *out. TD_EINVAL for inconsistent options
 * (window_max < window_min, rho outside (0, 1], a negative or non-finite
 * time), TD_ENOMEM. */
int td_linkq_open(td_linkq_t **out, const td_linkq_opts_t *opts);
/* Frees the link and every frame still queued; NULL-safe, nulls *self_p.
 * Frames already popped belong to the caller. */
void td_linkq_close(td_linkq_t **self_p);

/* Queue a frame (malloc'd, len bytes); ownership passes to the link in every
 * case. `acked`: the receiver will acknowledge it, so it counts against the
 * window. Returns its sequence number (> 0), or 0 when the frame was refused
 * and freed: NULL or empty frame, bad class, out of memory. */
uint64_t td_linkq_push(td_linkq_t *q, td_prio_t prio, uint8_t *frame, size_t len, bool acked,
                       double now);

/* Reserve n sequence numbers for frames that are stamped before they are
 * pushed (an update packed on a worker thread while other frames are pushed):
 * returns the first, and td_linkq_push_seq() queues a frame under one of them
 * (in increasing order within a class). Unused ones are harmless gaps. */
uint64_t td_linkq_reserve(td_linkq_t *q, size_t n);
uint64_t td_linkq_push_seq(td_linkq_t *q, td_prio_t prio, uint8_t *frame, size_t len, bool acked,
                           double now, uint64_t seq);

/* The next frame to send at `now` (see the order and window rules above). On
 * true the caller owns out->frame, and an acked frame is in flight, sent at
 * `now`. False when nothing may go now (or, rarely, when memory for the
 * in-flight record ran out; the frame then stays queued). */
bool td_linkq_pop(td_linkq_t *q, double now, td_linkq_frame_t *out);

/* When to try td_linkq_pop() again on a timer: the earliest ready time of a
 * class head that the window admits (stopping at a head the window holds
 * back). INFINITY when nothing waits on time: the queues are empty or only
 * an ack (or td_linkq_expire()) can let the next frame go. Right after a pop
 * at `now` returned false, the result is > now. */
double td_linkq_next_ready(const td_linkq_t *q);

/* The receiver acknowledged `seq`. Frees its window and takes an RTT and a
 * delivery-rate sample. Returns false, changing nothing, for a seq that is
 * not in flight (unknown, never sent, unacked, already acked or expired). */
bool td_linkq_ack(td_linkq_t *q, uint64_t seq, double now);

/* Forget frames in flight sent more than timeout_s before `now`: their window
 * is freed and they count as lost. Returns how many. */
size_t td_linkq_expire(td_linkq_t *q, double now, double timeout_s);

/* Drop every queued (not yet popped) frame of a class, e.g. a superseded
 * update; frames in flight are not touched. Returns the bytes dropped. */
size_t td_linkq_drop_class(td_linkq_t *q, td_prio_t prio);

void td_linkq_stats(const td_linkq_t *q, td_linkq_stats_t *out);

#endif
