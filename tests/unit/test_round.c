/* test_round.c: update collection and aggregation. Chunks assemble into the
 * exact bytes sent; aggregation is the sample-weighted mean (checked against a
 * direct computation); duplicates, late, far-ahead and inconsistent chunks are
 * classified; a NaN update is discarded; a dead peer is no longer waited for;
 * an update for the next round is kept across td_round_begin. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/error.h"
#include "scheduler/round.h"

#define NUMEL 40000 /* 160000 bytes: 3 chunks */

static void send_update(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                        const float *delta, td_chunk_result_t *last) {
  uint64_t total = NUMEL * 4;
  uint32_t chunks = td_round_chunk_count(total);
  for (uint32_t c = 0; c < chunks; c++) {
    uint64_t off = (uint64_t)c * TD_ROUND_CHUNK_BYTES;
    size_t len = c + 1 < chunks ? TD_ROUND_CHUNK_BYTES : (size_t)(total - off);
    ck_assert_int_eq(td_round_add_chunk(r, peer, round, samples, c, chunks, total,
                                        (const uint8_t *)delta + off, len, 0.5, last, NULL),
                     0);
  }
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
  ck_assert_int_eq(td_round_open(&r, NUMEL), 0);
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
  ck_assert_uint_eq(td_round_aggregate(r, own, 100, anchor), 2);
  for (int i = 0; i < NUMEL; i++)
    ck_assert_msg(fabsf(anchor[i] - expect[i]) <= 1e-5f * (1 + fabsf(expect[i])), "i=%d", i);
  td_round_close(&r);
  ck_assert_ptr_null(r);
}
END_TEST

START_TEST(chunks_are_classified_and_checked) {
  static float d[NUMEL];
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, NUMEL), 0);
  uint64_t peers[] = {5};
  td_round_begin(r, 10, peers, 1);
  td_chunk_result_t res;
  uint64_t total = NUMEL * 4;
  uint32_t chunks = td_round_chunk_count(total);
  const uint8_t *p = (const uint8_t *)d;
  /* inconsistent: wrong total, wrong count, index past the end, short chunk */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total + 4, p, 65536, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks + 1, total, p, 65536, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, chunks, chunks, total, p, 10, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, p, 100, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, p, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_ACCEPTED);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 1, 0, chunks, total, p, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_DUPLICATE);
  /* samples must agree across the chunks of one update */
  ck_assert_int_eq(td_round_add_chunk(r, 5, 10, 2, 1, chunks, total, p, 65536, 0, &res, NULL),
                   TD_EPROTO);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 9, 1, 0, chunks, total, p, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_LATE);
  ck_assert_int_eq(td_round_add_chunk(r, 5, 12, 1, 0, chunks, total, p, 65536, 0, &res, NULL), 0);
  ck_assert_int_eq(res, TD_CHUNK_AHEAD);
  /* a dead peer is not waited for */
  ck_assert(!td_round_complete(r));
  td_round_forget_peer(r, 5);
  ck_assert(td_round_complete(r));
  td_round_close(&r);
}
END_TEST

START_TEST(nan_updates_are_discarded_and_next_round_is_kept) {
  static float good[NUMEL], bad[NUMEL], anchor[NUMEL];
  for (int i = 0; i < NUMEL; i++)
    good[i] = 2.0f, bad[i] = 1.0f;
  bad[NUMEL / 2] = NAN;
  td_round_t *r = NULL;
  ck_assert_int_eq(td_round_open(&r, NUMEL), 0);
  uint64_t peers[] = {1, 2};
  td_round_begin(r, 3, peers, 2);
  td_chunk_result_t res;
  send_update(r, 2, 4, 10, good, &res); /* peer 2 is already one round ahead */
  ck_assert_int_eq(res, TD_CHUNK_COMPLETED);
  send_update(r, 1, 3, 10, bad, &res);
  ck_assert_int_eq(res, TD_CHUNK_NONFINITE);
  send_update(r, 2, 3, 10, good, &res);
  ck_assert(td_round_complete(r));
  ck_assert_uint_eq(td_round_aggregate(r, NULL, 0, anchor), 1); /* only peer 2 */
  ck_assert_float_eq(anchor[0], 2.0f);
  ck_assert(isfinite(anchor[NUMEL / 2]));
  td_round_begin(r, 4, peers, 2);
  ck_assert_uint_eq(td_round_current(r), 4);
  uint64_t missing[4];
  ck_assert_uint_eq(td_round_missing(r, missing, 4), 1); /* peer 2's round 4 was kept */
  ck_assert_uint_eq(missing[0], 1);
  td_round_close(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("round");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, weighted_mean_of_complete_updates);
  tcase_add_test(tc, chunks_are_classified_and_checked);
  tcase_add_test(tc, nan_updates_are_discarded_and_next_round_is_kept);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
