/* test_linkq.c: the send side of a peer link. Control frames overtake queued
 * updates and bulk (waiting at most for the chunk already on the wire) and
 * updates overtake bulk, except that a waiting bulk frame goes after its
 * share of update bytes (a quarter of a full link); each class is FIFO with
 * increasing sequence numbers;
 * the window stops acked frames and acks reopen it; goodput, RTT and the
 * window follow a simulated 1 MB/s, 50 ms link; hostile acks change nothing;
 * expiry frees the window of lost acks; delay_s holds frames back; dropping a
 * class frees its frames. Time is synthetic throughout. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/rng.h"
#include "scheduler/linkq.h"

enum { CHUNK = 64 * 1024, CONTROL_LEN = 64 };

/* A malloc'd frame whose first bytes hold `tag` (when it fits). */
static uint8_t *frame_new(size_t len, uint32_t tag) {
  uint8_t *f = calloc(1, len ? len : 1);
  ck_assert_ptr_nonnull(f);
  if (len >= sizeof tag)
    memcpy(f, &tag, sizeof tag);
  return f;
}

static uint32_t frame_tag(const td_linkq_frame_t *f) {
  uint32_t tag;
  memcpy(&tag, f->frame, sizeof tag);
  return tag;
}

static bool stats_eq(const td_linkq_stats_t *a, const td_linkq_stats_t *b) {
  for (int p = 0; p < TD_PRIO_COUNT; p++)
    if (a->queued_bytes[p] != b->queued_bytes[p] || a->queued_frames[p] != b->queued_frames[p])
      return false;
  return a->goodput_bps == b->goodput_bps && a->rtt_s == b->rtt_s &&
         a->rtt_min_s == b->rtt_min_s && a->window == b->window &&
         a->in_flight == b->in_flight && a->bytes_sent == b->bytes_sent &&
         a->bytes_acked == b->bytes_acked && a->frames_lost == b->frames_lost;
}

START_TEST(open_checks_options) {
  td_linkq_t *q = NULL;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  td_linkq_stats_t st;
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.window, 128 * 1024); /* window_min before any measurement */
  ck_assert_double_eq(st.goodput_bps, 0);
  td_linkq_close(&q);
  ck_assert_ptr_null(q);
  td_linkq_close(&q); /* idempotent */
  td_linkq_opts_t bad[] = {{.window_min = 1000, .window_max = 10},
                           {.rho = 1.5},
                           {.rho = -0.1},
                           {.delay_s = -1},
                           {.window_target_s = NAN}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_int_eq(td_linkq_open(&q, &bad[i]), TD_EINVAL);
}
END_TEST

/* Pops and transmits one frame at a time over a B bytes/s link, acks after a
 * fixed RTT, while updates arrive in bursts, bulk is always waiting and
 * control frames are pushed at random times. Bulk goes past queued updates
 * only once TD_LINKQ_BULK_RATIO times its bytes of updates went past it. */
START_TEST(control_overtakes_updates_and_updates_overtake_bulk) {
  td_linkq_t *q;
  td_linkq_frame_t f;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  for (uint32_t i = 0; i < 20; i++)
    ck_assert_uint_gt(td_linkq_push(q, TD_PRIO_UPDATE, frame_new(CHUNK, i), CHUNK, true, 0), 0);
  uint64_t ctrl = td_linkq_push(q, TD_PRIO_CONTROL, frame_new(CONTROL_LEN, 99), CONTROL_LEN,
                                false, 0);
  ck_assert(td_linkq_pop(q, 0, &f));
  ck_assert_int_eq(f.prio, TD_PRIO_CONTROL);
  ck_assert_uint_eq(f.seq, ctrl);
  free(f.frame);
  td_linkq_close(&q);

  const double bandwidth = 1e6, rtt = 0.05, chunk_s = CHUNK / bandwidth;
  enum { MAX_ACKS = 4096 };
  static uint64_t ack_seq[MAX_ACKS];
  static double ack_at[MAX_ACKS];
  size_t acks = 0, acks_done = 0;
  td_rng_t rng;
  td_rng_seed(&rng, 11);
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  for (uint32_t i = 0; i < 100; i++)
    td_linkq_push(q, TD_PRIO_BULK, frame_new(CHUNK, i), CHUNK, true, 0);
  double now = 0, link_free = 0, next_updates = 0.3, next_ctrl = 0.01, ctrl_pushed_at = 0;
  double max_wait = 0;
  bool ctrl_pending = false;
  size_t pops[TD_PRIO_COUNT] = {0}, bulk_ahead = 0;
  uint64_t passed = 0; /* update bytes sent past the waiting bulk, less its share */
  while (now < 4.0) {
    while (acks_done < acks && ack_at[acks_done] <= now)
      ck_assert(td_linkq_ack(q, ack_seq[acks_done++], now));
    if (now >= next_updates) {
      for (uint32_t i = 0; i < 5; i++)
        td_linkq_push(q, TD_PRIO_UPDATE, frame_new(CHUNK, i), CHUNK, true, now);
      next_updates += 0.5;
    }
    if (now >= next_ctrl) {
      ck_assert(!ctrl_pending);
      td_linkq_push(q, TD_PRIO_CONTROL, frame_new(CONTROL_LEN, 0), CONTROL_LEN, false, now);
      ctrl_pending = true;
      ctrl_pushed_at = now;
      next_ctrl = now + chunk_s + 0.005 + 0.2 * td_rng_uniform(&rng);
    }
    if (link_free <= now && td_linkq_pop(q, now, &f)) {
      td_linkq_stats_t st;
      td_linkq_stats(q, &st);
      pops[f.prio]++;
      if (f.prio == TD_PRIO_CONTROL) {
        ck_assert(ctrl_pending);
        ctrl_pending = false;
        ck_assert_double_le(now - ctrl_pushed_at, chunk_s + 1e-9);
        max_wait = fmax(max_wait, now - ctrl_pushed_at);
      } else {
        ck_assert_uint_eq(st.queued_frames[TD_PRIO_CONTROL], 0); /* never behind a chunk */
        if (f.prio == TD_PRIO_UPDATE)
          passed += f.len;
        if (f.prio == TD_PRIO_BULK && st.queued_frames[TD_PRIO_UPDATE] > 0) {
          ck_assert_uint_ge(passed, TD_LINKQ_BULK_RATIO * f.len);
          bulk_ahead++;
        }
        if (f.prio == TD_PRIO_BULK)
          passed = passed > TD_LINKQ_BULK_RATIO * f.len ? passed - TD_LINKQ_BULK_RATIO * f.len : 0;
        ck_assert_uint_lt(acks, MAX_ACKS);
        ack_seq[acks] = f.seq;
        ack_at[acks++] = now + f.len / bandwidth + rtt;
      }
      link_free = now + f.len / bandwidth;
      free(f.frame);
    }
    double next = fmin(next_updates, next_ctrl);
    if (link_free > now)
      next = fmin(next, link_free);
    if (acks_done < acks)
      next = fmin(next, ack_at[acks_done]);
    now = next;
  }
  ck_assert_uint_gt(pops[TD_PRIO_CONTROL], 10);
  ck_assert_uint_ge(pops[TD_PRIO_UPDATE], 30); /* every burst went out */
  ck_assert_uint_gt(pops[TD_PRIO_BULK], 10);
  ck_assert_uint_gt(bulk_ahead, 0); /* some bulk went during a burst */
  ck_assert_double_gt(max_wait, 0.5 * chunk_s); /* some did wait behind a chunk */
  td_linkq_close(&q);
}
END_TEST

START_TEST(fifo_within_a_class_and_increasing_seqs) {
  enum { N = 300 };
  td_linkq_t *q;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  /* refused pushes: ownership still passed (valgrind sees no leak), seq 0 */
  ck_assert_uint_eq(td_linkq_push(q, TD_PRIO_UPDATE, NULL, 10, true, 0), 0);
  ck_assert_uint_eq(td_linkq_push(q, TD_PRIO_UPDATE, frame_new(0, 0), 0, true, 0), 0);
  ck_assert_uint_eq(td_linkq_push(q, (td_prio_t)7, frame_new(8, 0), 8, true, 0), 0);
  ck_assert_uint_eq(td_linkq_push(NULL, TD_PRIO_BULK, frame_new(8, 0), 8, true, 0), 0);
  td_rng_t rng;
  td_rng_seed(&rng, 3);
  uint64_t seq[N], last = 0;
  int prio[N];
  for (uint32_t i = 0; i < N; i++) {
    prio[i] = (int)td_rng_below(&rng, TD_PRIO_COUNT);
    size_t len = 4 + td_rng_below(&rng, 100);
    seq[i] = td_linkq_push(q, (td_prio_t)prio[i], frame_new(len, i), len, false, 0);
    ck_assert_uint_gt(seq[i], last);
    last = seq[i];
  }
  /* all were queued before the first pop: the controls first, and each class
   * in push order (how updates and bulk interleave: the next test) */
  size_t next[TD_PRIO_COUNT] = {0}, controls = 0;
  for (int p = 0; p < TD_PRIO_COUNT; p++)
    while (next[p] < N && prio[next[p]] != p)
      next[p]++;
  for (uint32_t popped = 0; popped < N; popped++) {
    td_linkq_frame_t f;
    ck_assert(td_linkq_pop(q, 1, &f));
    uint32_t i = frame_tag(&f);
    ck_assert_uint_lt(i, N);
    ck_assert_int_eq(f.prio, prio[i]);
    ck_assert_uint_eq(i, next[f.prio]); /* the oldest of its class */
    ck_assert_uint_eq(f.seq, seq[i]);
    if (f.prio == TD_PRIO_CONTROL)
      ck_assert_uint_eq(controls++, popped);
    for (next[f.prio]++; next[f.prio] < N && prio[next[f.prio]] != (int)f.prio;)
      next[f.prio]++;
    free(f.frame);
  }
  td_linkq_frame_t f;
  ck_assert(!td_linkq_pop(q, 1, &f));
  td_linkq_close(&q);
}
END_TEST

/* On a link that updates keep full, a waiting bulk frame goes after
 * TD_LINKQ_BULK_RATIO times its bytes of updates, control still first;
 * dropping the bulk class forgets what it had earned. */
START_TEST(bulk_gets_its_share_of_a_full_link) {
  td_linkq_t *q;
  td_linkq_frame_t f;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  for (uint32_t i = 0; i < 30; i++)
    td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, i), 1000, false, 0);
  for (uint32_t i = 0; i < 4; i++)
    td_linkq_push(q, TD_PRIO_BULK, frame_new(i < 2 ? 1000 : 2000, 100 + i), i < 2 ? 1000 : 2000,
                  false, 0);
  /* 1000-byte bulk after every 3 updates, 2000-byte bulk after 6 */
  const char *want = "uuubuuubuuuuuubuuuuuubuuuuuuuuuuuu";
  for (size_t k = 0; want[k]; k++) {
    if (k == 14) /* a control frame pushed while bulk is due still goes first */
      td_linkq_push(q, TD_PRIO_CONTROL, frame_new(CONTROL_LEN, 999), CONTROL_LEN, false, 0);
    ck_assert(td_linkq_pop(q, 0, &f));
    if (k == 14) {
      ck_assert_int_eq(f.prio, TD_PRIO_CONTROL);
      free(f.frame);
      ck_assert(td_linkq_pop(q, 0, &f));
    }
    ck_assert_msg(f.prio == (want[k] == 'b' ? TD_PRIO_BULK : TD_PRIO_UPDATE),
                  "pop %zu: class %d, want %c", k, (int)f.prio, want[k]);
    free(f.frame);
  }
  ck_assert(!td_linkq_pop(q, 0, &f));

  /* earned credit dies with the class */
  for (uint32_t i = 0; i < 8; i++)
    td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, i), 1000, false, 0);
  td_linkq_push(q, TD_PRIO_BULK, frame_new(1000, 100), 1000, false, 0);
  for (int i = 0; i < 3; i++) {
    ck_assert(td_linkq_pop(q, 0, &f));
    ck_assert_int_eq(f.prio, TD_PRIO_UPDATE);
    free(f.frame);
  }
  ck_assert_uint_eq(td_linkq_drop_class(q, TD_PRIO_BULK), 1000);
  td_linkq_push(q, TD_PRIO_BULK, frame_new(1000, 101), 1000, false, 0);
  for (int i = 0; i < 3; i++) {
    ck_assert(td_linkq_pop(q, 0, &f));
    ck_assert_int_eq(f.prio, TD_PRIO_UPDATE);
    free(f.frame);
  }
  ck_assert(td_linkq_pop(q, 0, &f)); /* 2 updates still queued */
  ck_assert_int_eq(f.prio, TD_PRIO_BULK);
  free(f.frame);
  td_linkq_close(&q);
}
END_TEST

START_TEST(window_stops_acked_frames_and_acks_reopen_it) {
  td_linkq_opts_t o = {.window_min = 100000, .window_max = 100000};
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t st;
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  uint64_t s[4];
  for (uint32_t i = 0; i < 4; i++)
    s[i] = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(40000, i), 40000, true, 0);
  for (int i = 0; i < 2; i++) {
    ck_assert(td_linkq_pop(q, 0, &f));
    ck_assert_uint_eq(f.seq, s[i]);
    free(f.frame);
  }
  ck_assert(!td_linkq_pop(q, 0, &f)); /* 80000 + 40000 > 100000 */
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.in_flight, 80000);
  ck_assert(isinf(td_linkq_next_ready(q))); /* waits on an ack, not on time */
  /* control frames bypass the window */
  td_linkq_push(q, TD_PRIO_CONTROL, frame_new(CONTROL_LEN, 0), CONTROL_LEN, false, 0);
  ck_assert(td_linkq_pop(q, 0, &f));
  ck_assert_int_eq(f.prio, TD_PRIO_CONTROL);
  free(f.frame);
  ck_assert(!td_linkq_pop(q, 0, &f));
  ck_assert(td_linkq_ack(q, s[0], 0.1));
  ck_assert(td_linkq_pop(q, 0.1, &f));
  ck_assert_uint_eq(f.seq, s[2]);
  free(f.frame);
  /* 1000 bytes of bulk would fit, but the held-back update keeps its window */
  td_linkq_push(q, TD_PRIO_BULK, frame_new(1000, 0), 1000, true, 0.1);
  ck_assert(!td_linkq_pop(q, 0.1, &f));
  td_linkq_close(&q);

  /* the first frame always goes, even when larger than the window */
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  td_linkq_push(q, TD_PRIO_BULK, frame_new(250000, 0), 250000, true, 0);
  td_linkq_push(q, TD_PRIO_BULK, frame_new(10, 1), 10, true, 0);
  ck_assert(td_linkq_pop(q, 0, &f));
  ck_assert_uint_eq(f.len, 250000);
  free(f.frame);
  ck_assert(!td_linkq_pop(q, 0, &f));
  td_linkq_close(&q);
}
END_TEST

/* Frames stamped before they are pushed (an update packed on a worker while
 * snapshot chunks are queued) keep their reserved numbers, and the acks the
 * receiver echoes for those numbers free the window. */
START_TEST(reserved_seqs_survive_interleaved_pushes) {
  td_linkq_opts_t o = {.window_min = 100000, .window_max = 100000};
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t st;
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  uint64_t first = td_linkq_reserve(q, 3);
  uint64_t bulk = td_linkq_push(q, TD_PRIO_BULK, frame_new(30000, 9), 30000, true, 0);
  ck_assert_uint_eq(bulk, first + 3);
  ck_assert_uint_eq(td_linkq_push_seq(q, TD_PRIO_UPDATE, frame_new(30000, 0), 30000, true, 0,
                                      first), first);
  ck_assert_uint_eq(td_linkq_push_seq(q, TD_PRIO_UPDATE, frame_new(30000, 1), 30000, true, 0,
                                      first + 1), first + 1);
  /* out of order within a class, or a number never handed out: refused */
  ck_assert_uint_eq(td_linkq_push_seq(q, TD_PRIO_UPDATE, frame_new(10, 2), 10, true, 0, first), 0);
  ck_assert_uint_eq(td_linkq_push_seq(q, TD_PRIO_UPDATE, frame_new(10, 2), 10, true, 0, 999), 0);
  for (uint64_t want = first; want <= first + 1; want++) {
    ck_assert(td_linkq_pop(q, 0, &f));
    ck_assert_uint_eq(f.seq, want);
    free(f.frame);
  }
  ck_assert(td_linkq_pop(q, 0, &f)); /* the bulk frame, 90000 <= 100000 */
  ck_assert_uint_eq(f.seq, bulk);
  free(f.frame);
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.in_flight, 90000);
  ck_assert(td_linkq_ack(q, first + 1, 0.1));
  ck_assert(td_linkq_ack(q, bulk, 0.1));
  ck_assert(td_linkq_ack(q, first, 0.1));
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.in_flight, 0);
  td_linkq_close(&q);
}
END_TEST

/* A link of exactly 1 MB/s (frames serialised one after the other) and a
 * 50 ms RTT; the pump sends whatever the window allows at every ack. */
START_TEST(goodput_rtt_and_window_follow_the_link) {
  enum { N = 6000, LEN = 1000 };
  const double bandwidth = 1e6, rtt = 0.05;
  td_linkq_opts_t o = {.window_min = 4 * LEN, .window_target_s = 0.05};
  td_linkq_t *q;
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  static uint64_t ack_seq[N];
  static double ack_at[N];
  size_t pushed = 0, sent = 0, acked = 0;
  double now = 0, link_free = 0;
  while (acked < N) {
    td_linkq_stats_t st;
    td_linkq_frame_t f;
    for (td_linkq_stats(q, &st); st.queued_frames[TD_PRIO_UPDATE] < 32 && pushed < N; pushed++)
      st.queued_frames[TD_PRIO_UPDATE] +=
          td_linkq_push(q, TD_PRIO_UPDATE, frame_new(LEN, 0), LEN, true, now) > 0;
    while (td_linkq_pop(q, now, &f)) {
      link_free = fmax(now, link_free) + f.len / bandwidth;
      ack_seq[sent] = f.seq;
      ack_at[sent++] = link_free + rtt;
      free(f.frame);
    }
    ck_assert_uint_gt(sent, acked); /* something is always in flight */
    now = ack_at[acked];
    ck_assert(td_linkq_ack(q, ack_seq[acked++], now));
  }
  td_linkq_stats_t st;
  td_linkq_stats(q, &st);
  ck_assert_double_eq_tol(st.goodput_bps, bandwidth, 0.1 * bandwidth);
  /* the fastest round trip: an empty link, one frame's serialisation + RTT */
  ck_assert_double_eq_tol(st.rtt_min_s, rtt + LEN / bandwidth, 1e-9);
  ck_assert_double_gt(st.rtt_s, st.rtt_min_s); /* the target keeps a standing queue */
  ck_assert_uint_gt(st.window, o.window_min);
  ck_assert_double_eq_tol((double)st.window, bandwidth * (st.rtt_min_s + 0.05),
                          0.1 * bandwidth * (st.rtt_min_s + 0.05));
  ck_assert_uint_eq(st.bytes_acked, (uint64_t)N * LEN);
  ck_assert_uint_eq(st.in_flight, 0);
  td_linkq_close(&q);
}
END_TEST

/* The delivery-rate samples and EWMAs on hand-computed values. */
START_TEST(delivery_rate_is_sampled_the_bbr_way) {
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t st;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0); /* rho 0.2 */
  uint64_t a = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 0), 1000, true, 0);
  uint64_t b = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 1), 1000, true, 0);
  for (int i = 0; i < 2; i++) {
    ck_assert(td_linkq_pop(q, 0, &f));
    free(f.frame);
  }
  ck_assert(td_linkq_ack(q, a, 0.1)); /* 1000 B / 0.1 s, taken as is */
  td_linkq_stats(q, &st);
  ck_assert_double_eq_tol(st.goodput_bps, 10000, 1e-6);
  ck_assert_double_eq_tol(st.rtt_s, 0.1, 1e-12);
  ck_assert(td_linkq_ack(q, b, 0.15)); /* both frames over 0.15 s: 13333 B/s */
  td_linkq_stats(q, &st);
  ck_assert_double_eq_tol(st.goodput_bps, 0.8 * 10000 + 0.2 * 2000 / 0.15, 1e-6);
  ck_assert_double_eq_tol(st.rtt_s, 0.8 * 0.1 + 0.2 * 0.15, 1e-12);
  ck_assert_double_eq_tol(st.rtt_min_s, 0.1, 1e-12);
  double before = st.goodput_bps;
  /* after 5 s idle a frame takes 0.1 s again: the idle time is not a slow link */
  uint64_t c = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 2), 1000, true, 5.0);
  ck_assert(td_linkq_pop(q, 5.0, &f));
  free(f.frame);
  ck_assert(td_linkq_ack(q, c, 5.1));
  td_linkq_stats(q, &st);
  ck_assert_double_eq_tol(st.goodput_bps, 0.8 * before + 0.2 * 10000, 1e-6);
  td_linkq_close(&q);
}
END_TEST

START_TEST(hostile_acks_are_ignored) {
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t before, after;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  uint64_t sent = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 0), 1000, true, 0);
  uint64_t queued = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 1), 1000, true, 0);
  uint64_t ctrl = td_linkq_push(q, TD_PRIO_CONTROL, frame_new(10, 2), 10, false, 0);
  for (int i = 0; i < 2; i++) { /* the control frame, then `sent` */
    ck_assert(td_linkq_pop(q, 0, &f));
    free(f.frame);
  }
  ck_assert_uint_eq(f.seq, sent);
  td_linkq_stats(q, &before);
  ck_assert(!td_linkq_ack(q, 0, 0.05));
  ck_assert(!td_linkq_ack(q, 999, 0.05));      /* never pushed */
  ck_assert(!td_linkq_ack(q, queued, 0.05));   /* not sent yet */
  ck_assert(!td_linkq_ack(q, ctrl, 0.05));     /* not an acked frame */
  ck_assert(!td_linkq_ack(q, UINT64_MAX, 0.05));
  ck_assert(!td_linkq_ack(NULL, sent, 0.05));
  td_linkq_stats(q, &after);
  ck_assert(stats_eq(&before, &after));
  ck_assert(td_linkq_ack(q, sent, 0.05));
  td_linkq_stats(q, &before);
  ck_assert_uint_eq(before.bytes_acked, 1000);
  ck_assert(!td_linkq_ack(q, sent, 0.06)); /* duplicate */
  td_linkq_stats(q, &after);
  ck_assert(stats_eq(&before, &after));
  td_linkq_close(&q);
}
END_TEST

START_TEST(expire_frees_the_window_of_lost_acks) {
  td_linkq_opts_t o = {.window_min = 100000, .window_max = 100000};
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t st;
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  uint64_t s[3];
  for (uint32_t i = 0; i < 3; i++)
    s[i] = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(40000, i), 40000, true, 0);
  ck_assert(td_linkq_pop(q, 0.0, &f));
  free(f.frame);
  ck_assert(td_linkq_pop(q, 0.1, &f));
  free(f.frame);
  ck_assert(!td_linkq_pop(q, 0.5, &f)); /* the window is full and no ack comes */
  ck_assert_uint_eq(td_linkq_expire(q, 1.0, 0.95), 1); /* only the one sent at 0 */
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.in_flight, 40000);
  ck_assert_uint_eq(st.frames_lost, 1);
  ck_assert(td_linkq_pop(q, 1.0, &f));
  ck_assert_uint_eq(f.seq, s[2]);
  free(f.frame);
  ck_assert(!td_linkq_ack(q, s[0], 1.1)); /* a late ack for a forgotten frame */
  ck_assert_uint_eq(td_linkq_expire(q, 3.0, 0.95), 2);
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.in_flight, 0);
  ck_assert_uint_eq(st.frames_lost, 3);
  ck_assert_uint_eq(st.bytes_acked, 0);
  ck_assert_uint_eq(td_linkq_expire(q, 10.0, 0.95), 0);
  td_linkq_close(&q);
}
END_TEST

START_TEST(delay_holds_frames_back) {
  td_linkq_opts_t o = {.delay_s = 0.2};
  td_linkq_t *q;
  td_linkq_frame_t f;
  ck_assert_int_eq(td_linkq_open(&q, &o), 0);
  ck_assert(isinf(td_linkq_next_ready(q)));
  uint64_t upd = td_linkq_push(q, TD_PRIO_UPDATE, frame_new(1000, 0), 1000, true, 1.0);
  ck_assert_double_eq_tol(td_linkq_next_ready(q), 1.2, 1e-12);
  ck_assert(!td_linkq_pop(q, 1.19, &f));
  ck_assert_double_gt(td_linkq_next_ready(q), 1.19);
  uint64_t ctrl = td_linkq_push(q, TD_PRIO_CONTROL, frame_new(10, 1), 10, false, 1.1);
  ck_assert_double_eq_tol(td_linkq_next_ready(q), 1.2, 1e-12);
  ck_assert(td_linkq_pop(q, td_linkq_next_ready(q), &f)); /* the control frame is not ready */
  ck_assert_uint_eq(f.seq, upd);
  free(f.frame);
  ck_assert_double_eq_tol(td_linkq_next_ready(q), 1.3, 1e-12);
  ck_assert(!td_linkq_pop(q, 1.29, &f));
  ck_assert(td_linkq_pop(q, 1.3, &f));
  ck_assert_uint_eq(f.seq, ctrl);
  free(f.frame);
  ck_assert(isinf(td_linkq_next_ready(q)));
  td_linkq_close(&q);
}
END_TEST

START_TEST(drop_class_frees_queued_frames) {
  td_linkq_t *q;
  td_linkq_frame_t f;
  td_linkq_stats_t st;
  ck_assert_int_eq(td_linkq_open(&q, NULL), 0);
  td_linkq_push(q, TD_PRIO_BULK, frame_new(50, 0), 50, true, 0);
  ck_assert(td_linkq_pop(q, 0, &f)); /* in flight: not dropped */
  free(f.frame);
  for (uint32_t i = 1; i <= 3; i++)
    td_linkq_push(q, TD_PRIO_BULK, frame_new(100 * i, i), 100 * i, true, 0);
  td_linkq_push(q, TD_PRIO_UPDATE, frame_new(10, 4), 10, true, 0);
  td_linkq_push(q, TD_PRIO_CONTROL, frame_new(20, 5), 20, false, 0);
  ck_assert_uint_eq(td_linkq_drop_class(q, TD_PRIO_BULK), 600);
  ck_assert_uint_eq(td_linkq_drop_class(q, TD_PRIO_BULK), 0);
  ck_assert_uint_eq(td_linkq_drop_class(q, (td_prio_t)9), 0);
  td_linkq_stats(q, &st);
  ck_assert_uint_eq(st.queued_frames[TD_PRIO_BULK], 0);
  ck_assert_uint_eq(st.queued_bytes[TD_PRIO_BULK], 0);
  ck_assert_uint_eq(st.queued_bytes[TD_PRIO_UPDATE], 10);
  ck_assert_uint_eq(st.in_flight, 50);
  ck_assert(td_linkq_pop(q, 0, &f));
  ck_assert_uint_eq(frame_tag(&f), 5);
  free(f.frame);
  ck_assert(td_linkq_pop(q, 0, &f));
  ck_assert_uint_eq(frame_tag(&f), 4);
  free(f.frame);
  ck_assert(!td_linkq_pop(q, 0, &f));
  /* close frees what is still queued (valgrind checks) */
  td_linkq_push(q, TD_PRIO_UPDATE, frame_new(30, 6), 30, true, 0);
  td_linkq_close(&q);
}
END_TEST

int main(void) {
  Suite *s = suite_create("linkq");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, open_checks_options);
  tcase_add_test(tc, control_overtakes_updates_and_updates_overtake_bulk);
  tcase_add_test(tc, fifo_within_a_class_and_increasing_seqs);
  tcase_add_test(tc, bulk_gets_its_share_of_a_full_link);
  tcase_add_test(tc, window_stops_acked_frames_and_acks_reopen_it);
  tcase_add_test(tc, goodput_rtt_and_window_follow_the_link);
  tcase_add_test(tc, delivery_rate_is_sampled_the_bbr_way);
  tcase_add_test(tc, hostile_acks_are_ignored);
  tcase_add_test(tc, expire_frees_the_window_of_lost_acks);
  tcase_add_test(tc, delay_holds_frames_back);
  tcase_add_test(tc, drop_class_frees_queued_frames);
  tcase_add_test(tc, reserved_seqs_survive_interleaved_pushes);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
