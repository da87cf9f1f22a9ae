/* linkq.c: per-link send queues, window and ack bookkeeping (see linkq.h).
 *
 * Queued frames sit in one singly linked FIFO per class. Popped acked frames
 * go into one ring per class, in send order; since a class is popped FIFO and
 * sequence numbers grow in push order, each ring is also sorted by seq, so an
 * ack is a binary search in at most three rings and the oldest send of each
 * class is at its tail for td_linkq_expire(). An acked or expired record dies
 * in place and the tail is trimmed past dead records, so acks that arrive
 * roughly in order keep the rings short. */
#include "scheduler/linkq.h"

#include <math.h>
#include <stdlib.h>

#include "common/error.h"
#include "scheduler/plan.h"

/* Chunks in flight a link's ring first makes room for; it doubles from there. */
#define FLIGHT_RING_INITIAL 64

typedef struct linkq_node {
  struct linkq_node *next;
  uint8_t *frame;
  size_t len;
  uint64_t seq;
  double ready_s;
  bool acked;
} linkq_node_t;

typedef struct {
  uint64_t seq;
  size_t len;
  double sent_s;
  uint64_t delivered_at_send;      /* link's delivered bytes when sent */
  double delivered_time_at_send_s; /* link's delivered time when sent */
  bool live;
} flight_t;

typedef struct {
  flight_t *slot; /* capacity is a power of two (or 0) */
  size_t cap, tail, count;
} flight_ring_t;

struct td_linkq {
  td_linkq_opts_t opts;
  linkq_node_t *head[TD_PRIO_COUNT], *last[TD_PRIO_COUNT];
  size_t queued_bytes[TD_PRIO_COUNT], queued_frames[TD_PRIO_COUNT];
  flight_ring_t flight[TD_PRIO_COUNT];
  uint64_t next_seq;
  size_t in_flight, window;
  uint64_t delivered_bytes;
  double delivered_time_s;
  double goodput_bps, rtt_s, rtt_min_s;
  uint64_t bytes_sent, bytes_acked, frames_lost;
  uint64_t bulk_credit; /* update bytes sent past a ready bulk head */
};

int td_linkq_open(td_linkq_t **out, const td_linkq_opts_t *opts) {
  td_linkq_opts_t o = {.window_min = 128 * 1024,
                       .window_max = 4 * 1024 * 1024,
                       .window_target_s = 0.05,
                       .rho = 0.2,
                       .delay_s = 0};
  if (opts != NULL) {
    o.window_target_s = opts->window_target_s;
    o.delay_s = opts->delay_s;
    if (opts->window_min)
      o.window_min = opts->window_min;
    if (opts->window_max)
      o.window_max = opts->window_max;
    if (opts->rho != 0)
      o.rho = opts->rho;
  }
  if (o.window_max < o.window_min || !(o.rho > 0 && o.rho <= 1) ||
      !(isfinite(o.window_target_s) && o.window_target_s >= 0) ||
      !(isfinite(o.delay_s) && o.delay_s >= 0))
    return TD_EINVAL;
  td_linkq_t *q = calloc(1, sizeof *q);
  if (q == NULL)
    return TD_ENOMEM;
  q->opts = o;
  q->next_seq = 1;
  q->window = o.window_min;
  *out = q;
  return 0;
}

void td_linkq_close(td_linkq_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_linkq_t *q = *self_p;
  for (int p = 0; p < TD_PRIO_COUNT; p++) {
    td_linkq_drop_class(q, (td_prio_t)p);
    free(q->flight[p].slot);
  }
  free(q);
  *self_p = NULL;
}

static uint64_t push_node(td_linkq_t *q, td_prio_t prio, uint8_t *frame, size_t len, bool acked,
                          double now, uint64_t seq) {
  linkq_node_t *n = NULL;
  if (q == NULL || frame == NULL || len == 0 || (unsigned)prio >= TD_PRIO_COUNT || seq == 0 ||
      seq >= q->next_seq || (q->last[prio] != NULL && seq <= q->last[prio]->seq) ||
      (n = malloc(sizeof *n)) == NULL) {
    free(frame);
    return 0;
  }
  *n = (linkq_node_t){.frame = frame, .len = len, .seq = seq,
                      .ready_s = now + q->opts.delay_s, .acked = acked};
  if (q->last[prio])
    q->last[prio]->next = n;
  else
    q->head[prio] = n;
  q->last[prio] = n;
  q->queued_bytes[prio] += len;
  q->queued_frames[prio]++;
  return n->seq;
}

uint64_t td_linkq_push(td_linkq_t *q, td_prio_t prio, uint8_t *frame, size_t len, bool acked,
                       double now) {
  return push_node(q, prio, frame, len, acked, now, q != NULL ? q->next_seq++ : 0);
}

uint64_t td_linkq_reserve(td_linkq_t *q, size_t n) {
  uint64_t first = q->next_seq;
  q->next_seq += n;
  return first;
}

uint64_t td_linkq_push_seq(td_linkq_t *q, td_prio_t prio, uint8_t *frame, size_t len, bool acked,
                           double now, uint64_t seq) {
  return push_node(q, prio, frame, len, acked, now, seq);
}

static flight_t *ring_at(const flight_ring_t *r, size_t i) {
  return &r->slot[(r->tail + i) & (r->cap - 1)];
}

/* Room for one more record; false on ENOMEM. */
static bool ring_reserve(flight_ring_t *r) {
  if (r->count < r->cap)
    return true;
  size_t cap = r->cap ? 2 * r->cap : FLIGHT_RING_INITIAL;
  flight_t *slot = malloc(cap * sizeof *slot);
  if (slot == NULL)
    return false;
  for (size_t i = 0; i < r->count; i++)
    slot[i] = *ring_at(r, i);
  free(r->slot);
  *r = (flight_ring_t){.slot = slot, .cap = cap, .tail = 0, .count = r->count};
  return true;
}

static void ring_trim(flight_ring_t *r) {
  while (r->count > 0 && !ring_at(r, 0)->live) {
    r->tail = (r->tail + 1) & (r->cap - 1);
    r->count--;
  }
}

/* Whether the window lets the head of class p go (ignoring its ready time). */
static bool admits(const td_linkq_t *q, td_prio_t p, const linkq_node_t *n) {
  return p == TD_PRIO_CONTROL || !n->acked || q->in_flight == 0 ||
         q->in_flight + n->len <= q->window;
}

/* The order classes are tried in now: by priority, but a bulk head that has
 * let its share of update bytes pass goes ahead of the updates. */
static const td_prio_t *serve_order(const td_linkq_t *q) {
  static const td_prio_t by_priority[TD_PRIO_COUNT] = {TD_PRIO_CONTROL, TD_PRIO_UPDATE,
                                                       TD_PRIO_BULK};
  static const td_prio_t bulk_due[TD_PRIO_COUNT] = {TD_PRIO_CONTROL, TD_PRIO_BULK,
                                                    TD_PRIO_UPDATE};
  const linkq_node_t *b = q->head[TD_PRIO_BULK];
  return b != NULL && q->bulk_credit >= (uint64_t)TD_LINKQ_BULK_RATIO * b->len ? bulk_due
                                                                               : by_priority;
}

/* Keeps the bulk share's count: update bytes sent while a ready bulk frame
 * waited earn it credit, a bulk frame sent spends its share. */
static void count_share(td_linkq_t *q, td_prio_t p, size_t len, double now) {
  const linkq_node_t *b = q->head[TD_PRIO_BULK];
  if (p == TD_PRIO_UPDATE && b != NULL && b->ready_s <= now)
    q->bulk_credit += len;
  else if (p == TD_PRIO_BULK) {
    uint64_t spent = (uint64_t)TD_LINKQ_BULK_RATIO * len;
    q->bulk_credit = b == NULL || q->bulk_credit < spent ? 0 : q->bulk_credit - spent;
  }
}

bool td_linkq_pop(td_linkq_t *q, double now, td_linkq_frame_t *out) {
  if (q == NULL || out == NULL)
    return false;
  const td_prio_t *order = serve_order(q);
  for (int i = 0; i < TD_PRIO_COUNT; i++) {
    td_prio_t p = order[i];
    linkq_node_t *n = q->head[p];
    if (n == NULL)
      continue;
    if (!admits(q, p, n))
      return false; /* lower classes would only take the window it waits for */
    if (n->ready_s > now)
      continue;
    if (n->acked) {
      flight_ring_t *r = &q->flight[p];
      if (!ring_reserve(r))
        return false;
      if (q->in_flight == 0) /* a send into an empty pipe restarts the rate interval */
        q->delivered_time_s = now;
      *ring_at(r, r->count++) = (flight_t){.seq = n->seq, .len = n->len, .sent_s = now,
                                           .delivered_at_send = q->delivered_bytes,
                                           .delivered_time_at_send_s = q->delivered_time_s,
                                           .live = true};
      q->in_flight += n->len;
    }
    q->head[p] = n->next;
    if (q->head[p] == NULL)
      q->last[p] = NULL;
    q->queued_bytes[p] -= n->len;
    q->queued_frames[p]--;
    q->bytes_sent += n->len;
    count_share(q, p, n->len, now);
    *out = (td_linkq_frame_t){.frame = n->frame, .len = n->len, .prio = p, .seq = n->seq};
    free(n);
    return true;
  }
  return false;
}

double td_linkq_next_ready(const td_linkq_t *q) {
  double next = INFINITY;
  if (q == NULL)
    return next;
  const td_prio_t *order = serve_order(q);
  for (int i = 0; i < TD_PRIO_COUNT; i++) {
    const linkq_node_t *n = q->head[order[i]];
    if (n == NULL)
      continue;
    if (!admits(q, order[i], n))
      break;
    if (n->ready_s < next)
      next = n->ready_s;
  }
  return next;
}

/* The live in-flight record for seq, or NULL. */
static flight_t *find_flight(td_linkq_t *q, uint64_t seq) {
  for (int p = 0; p < TD_PRIO_COUNT; p++) {
    flight_ring_t *r = &q->flight[p];
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (ring_at(r, mid)->seq < seq)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < r->count && ring_at(r, lo)->seq == seq)
      return ring_at(r, lo)->live ? ring_at(r, lo) : NULL;
  }
  return NULL;
}

static void update_window(td_linkq_t *q) {
  if (!(q->goodput_bps > 0))
    return;
  double w = q->goodput_bps * (q->rtt_min_s + q->opts.window_target_s);
  if (w <= (double)q->opts.window_min)
    q->window = q->opts.window_min;
  else if (w >= (double)q->opts.window_max)
    q->window = q->opts.window_max;
  else
    q->window = (size_t)w;
}

bool td_linkq_ack(td_linkq_t *q, uint64_t seq, double now) {
  flight_t *f = q && seq ? find_flight(q, seq) : NULL;
  if (f == NULL)
    return false;
  f->live = false;
  q->in_flight -= f->len;
  q->bytes_acked += f->len;
  q->delivered_bytes += f->len;
  q->delivered_time_s = now;
  double rtt = now - f->sent_s;
  if (rtt >= 0) {
    q->rtt_s = td_plan_ewma(q->rtt_s, rtt, q->opts.rho);
    if (!(q->rtt_min_s > 0) || rtt < q->rtt_min_s)
      q->rtt_min_s = rtt;
  }
  double interval = now - f->delivered_time_at_send_s;
  if (interval > 0)
    q->goodput_bps = td_plan_ewma(
        q->goodput_bps, (double)(q->delivered_bytes - f->delivered_at_send) / interval,
        q->opts.rho);
  update_window(q);
  for (int p = 0; p < TD_PRIO_COUNT; p++)
    ring_trim(&q->flight[p]);
  return true;
}

size_t td_linkq_expire(td_linkq_t *q, double now, double timeout_s) {
  size_t lost = 0;
  for (int p = 0; q != NULL && p < TD_PRIO_COUNT; p++) {
    flight_ring_t *r = &q->flight[p];
    /* sends are in time order, so the expired ones are a prefix */
    for (size_t i = 0; i < r->count; i++) {
      flight_t *f = ring_at(r, i);
      if (!f->live)
        continue;
      if (!(now - f->sent_s > timeout_s))
        break;
      f->live = false;
      q->in_flight -= f->len;
      lost++;
    }
    ring_trim(r);
  }
  if (q != NULL)
    q->frames_lost += lost;
  return lost;
}

size_t td_linkq_drop_class(td_linkq_t *q, td_prio_t prio) {
  if (q == NULL || (unsigned)prio >= TD_PRIO_COUNT)
    return 0;
  size_t bytes = q->queued_bytes[prio];
  for (linkq_node_t *n = q->head[prio], *next; n != NULL; n = next) {
    next = n->next;
    free(n->frame);
    free(n);
  }
  q->head[prio] = q->last[prio] = NULL;
  q->queued_bytes[prio] = q->queued_frames[prio] = 0;
  if (prio == TD_PRIO_BULK)
    q->bulk_credit = 0;
  return bytes;
}


void td_linkq_stats(const td_linkq_t *q, td_linkq_stats_t *out) {
  *out = (td_linkq_stats_t){0};
  if (q == NULL)
    return;
  out->goodput_bps = q->goodput_bps;
  out->rtt_s = q->rtt_s;
  out->rtt_min_s = q->rtt_min_s;
  out->window = q->window;
  out->in_flight = q->in_flight;
  for (int p = 0; p < TD_PRIO_COUNT; p++) {
    out->queued_bytes[p] = q->queued_bytes[p];
    out->queued_frames[p] = q->queued_frames[p];
  }
  out->bytes_sent = q->bytes_sent;
  out->bytes_acked = q->bytes_acked;
  out->frames_lost = q->frames_lost;
}
