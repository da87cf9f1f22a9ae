/* test_round.c: update collection and aggregation. Chunked messages assemble
 * and decode into exactly what was encoded; aggregation is the sample-weighted
 * mean (checked against a direct computation); duplicate, late, far-ahead and
 * inconsistent chunks are classified; an update that decodes to NaN is
 * rejected; a dead peer is no longer waited for; an update for the next round
 * is kept across td_round_begin. Decoding is always deferred, as the daemon
 * does it: the message is handed out, decoded elsewhere and the floats handed
 * back, and an update whose entry was recycled meanwhile is dropped as late. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "common/error.h"
#include "scheduler/round.h"

#define ROWS 200
#define COLS 200
#define NUMEL (ROWS * COLS)

static td_layout_t *layout;

static void setup(void) {
  uint32_t shape[2] = {ROWS, COLS};
  td_layout_new(&layout);
  td_layout_add(layout, "w", 2, shape);
}

static void teardown(void) { td_layout_free(&layout); }

/* The message a peer would send for delta with codec none. */
static uint8_t *encode(const float *delta, size_t *len) {
  td_codec_spec_t spec;
  char why[64];
  td_codec_parse(&spec, "none", why, sizeof why);
  td_link_codec_t *lc = NULL;
  ck_assert_int_eq(td_link_codec_open(&lc, &spec, layout, 1, 1), 0);
  const uint8_t *borrowed;
  ck_assert_int_eq(td_link_codec_encode(lc, delta, &borrowed, len), 0);
  uint8_t *msg = malloc(*len);
  memcpy(msg, borrowed, *len);
  td_link_codec_close(&lc);
  return msg;
}

/* Decode a taken message as another thread would: with only the layout. */
static float *decode_elsewhere(const uint8_t *msg, size_t len, unsigned *codec, bool *ok) {
  float *out = td_params_alloc(NUMEL);
  char why[128];
  *ok = out != NULL && td_codec_decode_message(layout, msg, len, out, codec, why, sizeof why) == 0;
  return out;
}

/* Every chunk of msg; the last one's result in *last (ASSEMBLED when it
 * completed the message). */
static void send_chunks(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                        const uint8_t *msg, size_t total, td_chunk_result_t *last) {
  uint32_t chunks = td_round_chunk_count(total);
  for (uint32_t c = 0; c < chunks; c++) {
    uint64_t off = (uint64_t)c * TD_ROUND_CHUNK_BYTES;
    size_t len = c + 1 < chunks ? TD_ROUND_CHUNK_BYTES : (size_t)(total - off);
    ck_assert_int_eq(td_round_add_chunk(r, peer, round, samples, c, chunks, total, msg + off,
                                        len, 0.5, last, NULL),
                     0);
  }
}

/* send_chunks, then, when the message is complete, the round trip the daemon
 * makes: take it, decode it, hand the floats back (*last: COMPLETED or
 * REJECTED). */
static void send_msg(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                     const uint8_t *msg, size_t total, td_chunk_result_t *last) {
  send_chunks(r, peer, round, samples, msg, total, last);
  if (*last != TD_CHUNK_ASSEMBLED)
    return;
  uint8_t *taken;
  size_t len;
  uint64_t ticket;
  ck_assert_int_eq(td_round_take_message(r, round, peer, &taken, &len, &ticket), 0);
  unsigned codec;
  bool ok;
  float *data = decode_elsewhere(taken, len, &codec, &ok);
  td_round_put_decoded(r, round, peer, ticket, &data, codec, ok, last, NULL);
  ck_assert_ptr_null(data);
  free(taken);
}

static void send_update(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                        const float *delta, td_chunk_result_t *last) {
  size_t len;
  uint8_t *msg = encode(delta, &len);
  send_msg(r, peer, round, samples, msg, len, last);
  free(msg);
}

/* anchor += the sample-weighted mean (scheduler/aggregate.h) of own (sender
 * id 1; left out when own_samples is 0) and the round's complete updates, as
 * the daemon closes a round. Returns the number of peer updates used. */
static size_t aggregate(td_round_t *r, const float *own, uint64_t own_samples, float *anchor) {
  static float mean[NUMEL];
  td_agg_input_t in[TD_AGG_MAX_INPUTS];
  size_t n = td_round_collect(r, in, TD_AGG_MAX_INPUTS - 1), peers = n;
  if (own != NULL && own_samples > 0)
    in[n++] = (td_agg_input_t){.id = 1, .delta = own, .weight = (double)own_samples};
  td_agg_spec_t mean_spec = {.kind = TD_AGG_MEAN};
  ck_assert_uint_eq(td_agg_apply(&mean_spec, in, n, NUMEL, mean, NULL), n);
  for (int i = 0; i < NUMEL; i++)
    anchor[i] += mean[i];
  return peers;
}

START_TEST(weighted_mean_of_complete_updates) {
  static float own[NUMEL], a[NUMEL], b[NUMEL], anchor[NUMEL], expect[NUMEL];
  for (int i = 0; i < NUMEL; i++) {
    own[i] = (float)(i % 7) - 3.0f;
    a[i] = 0.5f * (float)(i % 5);
    b[i] = -1.0f + 0.001f * (float)i;
    anchor[i] = 1.0f;
    expect[i] = 1.0f + (float)((100.0 * own[i] + 300.0 * a[i] + 100.0 * b[i]) / 500.0);
  }
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, layout), 0);
  uint64_t peers[] = {11, 22};
  td_round_begin(r, 1, peers, 2);
  ck_assert(!td_round_complete(r));
  td_chunk_result_t res;
  send_update(r, 11, 1, 300, a, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  ck_assert(!td_round_complete(r));
  uint64_t missing[4];
  ck_assert_uint_eq(td_round_missing(r, missing, 4), 1);
  ck_assert_uint_eq(missing[0], 22);
  send_update(r, 22, 1, 100, b, &res);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(aggregate(r, own, 100, anchor), 2);
  size_t off = 0;
  for (int i = 0; i < NUMEL; i++)
    off += !(fabsf(anchor[i] - expect[i]) <= 1e-5f * (1 + fabsf(expect[i])));
  ck_assert_uint_eq(off, 0);
  td_round_close(&r);
  ck_assert_ptr_null(r);
}
END_TEST

START_TEST(chunks_are_classified_and_checked) {
  static float d[NUMEL];
  size_t total;
  uint8_t *msg = encode(d, &total);
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, layout), 0);
  uint64_t peers[] = {5};
  td_round_begin(r, 10, peers, 1);
  td_chunk_result_t res;
  uint32_t chunks = td_round_chunk_count(total);
  /* inconsistent: too large a total, wrong count, index past the end, short chunk */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, 1u << 30, msg, 65536, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks + 1, total, msg, 65536, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, chunks, chunks, total, msg, 10, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, msg, 100, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, msg, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_ACCEPTED);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, msg, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_DUPLICATE);
  /* samples and total must agree across the chunks of one update */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 2, 1, chunks, total, msg + 65536, 65536, 0, &res,
                                      NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 9, 1, 0, chunks, total, msg, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_LATE);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10 + TD_ROUND_SLOTS, 1, 0, chunks, total, msg, 65536,
                                      0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_AHEAD);
  /* a dead peer is not waited for */
  ck_assert(!td_round_complete(r));
  td_round_forget_peer(r, 5);
  ck_assert(td_round_complete(r));
  td_round_close(&r);
  /* the widest window (gossip and groups) keeps a chunk 15 rounds ahead, a
   * chunk of the round after it buffered across the move, and refuses 16 */
  ck_assert_int_eq(td_round_open_window(&r, layout, 1), TD_EINVAL);
  ck_assert_int_eq(td_round_open_window(&r, layout, TD_ROUND_SLOTS_MAX + 1), TD_EINVAL);
  ck_assert_int_eq(td_round_open_window(&r, layout, TD_ROUND_SLOTS_MAX), 0);
  td_round_begin(r, 10, peers, 1);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10 + TD_ROUND_SLOTS_MAX - 1, 1, 0, chunks, total, msg,
                                      65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_ACCEPTED);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10 + TD_ROUND_SLOTS_MAX, 1, 0, chunks, total, msg,
                                      65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_AHEAD);
  td_round_begin(r, 12, peers, 1);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10 + TD_ROUND_SLOTS_MAX - 1, 1, 0, chunks, total, msg,
                                      65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_DUPLICATE); /* kept across the move */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10 + TD_ROUND_SLOTS_MAX + 1, 1, 0, chunks, total,
                                      msg, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_ACCEPTED);
  td_round_close(&r);
  free(msg);
}
END_TEST

/* A message that is to come again by another way (backfill: a copy from
 * another member) starts over: its chunks so far, or a message that did
 * not decode, are dropped and it is waited for again; one in the average
 * stays, unless refused first (td_round_refuse_peer). */
START_TEST(a_restarted_update_starts_over) {
  static float d[NUMEL], other[NUMEL];
  for (int i = 0; i < NUMEL; i++) {
    d[i] = 1.0f;
    other[i] = (float)(i % 7);
  }
  size_t total;
  uint8_t *msg = encode(d, &total), *copy = encode(other, &total);
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, layout), 0);
  uint64_t peers[] = {5, 6};
  td_round_begin(r, 3, peers, 2);
  td_chunk_result_t res;
  uint32_t chunks = td_round_chunk_count(total);
  ck_assert_uint_gt(chunks, 1);
  ck_assert_int_eq(td_round_peer_state(r, 5), TD_PEER_NONE);
  ck_assert(td_round_restart_peer(r, 5)); /* nothing came: nothing to drop */
  /* one chunk of peer 5's own message, then the copy from the start */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 3, 4, 0, chunks, total, msg, TD_ROUND_CHUNK_BYTES, 0,
                                      &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_ACCEPTED);
  ck_assert_int_eq(td_round_peer_state(r, 5), TD_PEER_PARTIAL);
  ck_assert(td_round_restart_peer(r, 5));
  ck_assert_int_eq(td_round_peer_state(r, 5), TD_PEER_NONE);
  /* the copy's chunk 0 is taken again (not a duplicate), its samples may differ */
  send_msg(r, 5, 3, 8, copy, total, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  ck_assert(!td_round_restart_peer(r, 5)); /* in the average: it stays */
  ck_assert_int_eq(td_round_peer_state(r, 5), TD_PEER_HAVE);
  /* the average holds the copy, whole */
  td_agg_input_t in[TD_AGG_MAX_INPUTS];
  ck_assert_uint_eq(td_round_collect(r, in, TD_AGG_MAX_INPUTS), 1);
  ck_assert(in[0].weight == 8.0);
  ck_assert(memcmp(in[0].delta, other, sizeof other) == 0);
  ck_assert(!td_round_complete(r)); /* 6 is still waited for */
  /* 6's message does not decode: refused, never aggregated, and the round
   * is complete; restarted, it is waited for again and a good copy counts */
  uint8_t *bad = malloc(total);
  memcpy(bad, copy, total);
  memset(bad + 16, 0xff, 64); /* NaN floats: the decoder refuses them */
  send_msg(r, 6, 3, 4, bad, total, &res);
  ck_assert_int_eq(res, TD_CHUNK_REJECTED);
  ck_assert_int_eq(td_round_peer_state(r, 6), TD_PEER_REFUSED);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(td_round_collect(r, in, TD_AGG_MAX_INPUTS), 1);
  ck_assert(td_round_restart_peer(r, 6));
  ck_assert(!td_round_complete(r));
  send_msg(r, 6, 3, 4, copy, total, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(td_round_collect(r, in, TD_AGG_MAX_INPUTS), 2);
  /* 5's update in the average is not the one the coordinator averaged
   * (another signed copy): refused, out of the average, waited for again
   * once restarted, and the copy that comes then is the one averaged */
  ck_assert(td_round_refuse_peer(r, 5));
  ck_assert_int_eq(td_round_peer_state(r, 5), TD_PEER_REFUSED);
  ck_assert(!td_round_refuse_peer(r, 5)); /* nothing held any more */
  ck_assert_uint_eq(td_round_collect(r, in, TD_AGG_MAX_INPUTS), 1);
  ck_assert(td_round_restart_peer(r, 5));
  ck_assert(!td_round_complete(r));
  send_msg(r, 5, 3, 8, msg, total, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  ck_assert_uint_eq(td_round_collect(r, in, TD_AGG_MAX_INPUTS), 2);
  bool found = false;
  for (int k = 0; k < 2; k++)
    found |= in[k].weight == 8.0 && memcmp(in[k].delta, d, sizeof d) == 0;
  ck_assert(found);
  ck_assert(!td_round_refuse_peer(r, 99)); /* not a member */
  td_round_close(&r);
  free(bad);
  free(msg);
  free(copy);
}
END_TEST

START_TEST(nan_updates_are_rejected_and_next_round_is_kept) {
  static float good[NUMEL], anchor[NUMEL];
  for (int i = 0; i < NUMEL; i++)
    good[i] = 2.0f;
  size_t total;
  uint8_t *bad = encode(good, &total);
  float nan = NAN;
  memcpy(bad + TD_CODEC_HEADER_BYTES + 4 * 123, &nan, 4); /* a NaN smuggled into the payload */
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, layout), 0);
  uint64_t peers[] = {1, 2};
  td_round_begin(r, 3, peers, 2);
  td_chunk_result_t res;
  send_update(r, 2, 4, 10, good, &res); /* peer 2 is already one round ahead */
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  send_msg(r, 1, 3, 10, bad, total, &res);
  ck_assert_int_eq(res, TD_CHUNK_REJECTED);
  send_update(r, 2, 3, 10, good, &res);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(aggregate(r, NULL, 0, anchor), 1); /* only peer 2 */
  ck_assert_float_eq(anchor[0], 2.0f);
  ck_assert(isfinite(anchor[123]));
  td_round_begin(r, 4, peers, 2);
  ck_assert_uint_eq(td_round_current(r), 4);
  uint64_t missing[4];
  ck_assert_uint_eq(td_round_missing(r, missing, 4), 1); /* peer 2's round 4 was kept */
  ck_assert_uint_eq(missing[0], 1);
  td_round_close(&r);
  free(bad);
}
END_TEST

/* Overlap mode: a peer may be two rounds ahead of the open round. Its updates
 * for t + 1 and t + 2 survive the window advancing one round at a time, and a
 * jump past the window clears everything. */
START_TEST(window_keeps_updates_two_rounds_ahead) {
  static float d5[NUMEL], d6[NUMEL], anchor[NUMEL];
  for (int i = 0; i < NUMEL; i++) {
    d5[i] = 5.0f;
    d6[i] = 6.0f;
  }
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, layout), 0);
  uint64_t peers[] = {7};
  td_round_begin(r, 4, peers, 1);
  td_chunk_result_t res;
  send_update(r, 7, 6, 10, d6, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  send_update(r, 7, 5, 10, d5, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  ck_assert(!td_round_complete(r)); /* round 4 itself is still missing */
  td_round_begin(r, 5, peers, 1);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(aggregate(r, NULL, 0, anchor), 1);
  ck_assert_float_eq(anchor[17], 5.0f);
  td_round_begin(r, 6, peers, 1);
  ck_assert(td_round_complete(r));
  memset(anchor, 0, sizeof anchor);
  ck_assert_uint_eq(aggregate(r, NULL, 0, anchor), 1);
  ck_assert_float_eq(anchor[17], 6.0f);
  send_update(r, 7, 8, 10, d6, &res);
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  td_round_begin(r, 20, peers, 1); /* far jump: nothing buffered survives */
  ck_assert(!td_round_complete(r));
  td_round_close(&r);
}
END_TEST

/* The message of delta, chunk by chunk, without the decoding round trip. */
static void send_update_undecoded(td_round_t *r, uint64_t peer, uint64_t round,
                                  uint64_t samples, const float *delta,
                                  td_chunk_result_t *last) {
  size_t len;
  uint8_t *msg = encode(delta, &len);
  send_chunks(r, peer, round, samples, msg, len, last);
  free(msg);
}

START_TEST(deferred_decoding_hands_the_message_out_and_takes_the_floats_back) {
  static float own[NUMEL], a[NUMEL], b[NUMEL], deferred[NUMEL];
  for (int i = 0; i < NUMEL; i++) {
    own[i] = 0.25f * (float)(i % 9);
    a[i] = (float)(i % 5) - 2.0f;
    b[i] = 0.002f * (float)i;
    deferred[i] = 0.5f;
  }
  uint64_t peers[] = {11, 22};
  td_chunk_result_t res;
  td_round_t *d = NULL;
  ck_assert_int_eq(td_round_open(&d, layout), 0);
  td_round_begin(d, 1, peers, 2);
  send_update_undecoded(d, 11, 1, 300, a, &res);
  ck_assert_int_eq(res, TD_CHUNK_ASSEMBLED);
  ck_assert(!td_round_complete(d)); /* not complete until the floats come back */
  send_update_undecoded(d, 11, 1, 300, a, &res);
  ck_assert_int_eq(res, TD_CHUNK_DUPLICATE);
  send_update_undecoded(d, 22, 1, 100, b, &res);
  ck_assert_int_eq(res, TD_CHUNK_ASSEMBLED);
  uint8_t *msg[2];
  size_t len[2];
  uint64_t ticket[2];
  ck_assert_int_eq(td_round_take_message(d, 1, 11, &msg[0], &len[0], &ticket[0]), 0);
  ck_assert_int_eq(td_round_take_message(d, 1, 22, &msg[1], &len[1], &ticket[1]), 0);
  ck_assert_int_eq(td_round_take_message(d, 1, 22, &msg[1], &len[1], &ticket[1]), TD_EINVAL);
  for (int k = 1; k >= 0; k--) { /* handed back in another order */
    unsigned codec;
    bool ok;
    float *data = decode_elsewhere(msg[k], len[k], &codec, &ok);
    td_update_info_t info;
    td_round_put_decoded(d, 1, peers[k], ticket[k], &data, codec, ok, &res, &info);
    ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
    ck_assert_ptr_null(data);
    ck_assert_uint_eq(info.samples, k == 0 ? 300 : 100);
    free(msg[k]);
  }
  ck_assert(td_round_complete(d));
  ck_assert_uint_eq(aggregate(d, own, 100, deferred), 2);
  size_t off = 0; /* the sample-weighted mean of own (100), a (300) and b (100) */
  for (int i = 0; i < NUMEL; i++) {
    float expect = 0.5f + (float)((100.0 * own[i] + 300.0 * a[i] + 100.0 * b[i]) / 500.0);
    off += !(fabsf(deferred[i] - expect) <= 1e-5f * (1 + fabsf(expect)));
  }
  ck_assert_uint_eq(off, 0);

  /* an update whose round was left while it decoded is dropped as late */
  td_round_begin(d, 2, peers, 2);
  send_update_undecoded(d, 11, 2, 300, a, &res);
  ck_assert_int_eq(td_round_take_message(d, 2, 11, &msg[0], &len[0], &ticket[0]), 0);
  td_round_begin(d, 9, peers, 2); /* a jump recycles every entry */
  unsigned codec;
  bool ok;
  float *data = decode_elsewhere(msg[0], len[0], &codec, &ok);
  td_round_put_decoded(d, 2, 11, ticket[0], &data, codec, ok, &res, NULL);
  ck_assert_int_eq(res, TD_CHUNK_LATE);
  ck_assert_ptr_null(data);
  free(msg[0]);
  td_round_close(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("round");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, weighted_mean_of_complete_updates);
  tcase_add_test(tc, chunks_are_classified_and_checked);
  tcase_add_test(tc, window_keeps_updates_two_rounds_ahead);
  tcase_add_test(tc, nan_updates_are_rejected_and_next_round_is_kept);
  tcase_add_test(tc, a_restarted_update_starts_over);
  tcase_add_test(tc, deferred_decoding_hands_the_message_out_and_takes_the_floats_back);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
