/* test_recon.c: the anchor-reconciliation collector against a reference.
 * Four members' anchors reach two collectors in different orders and chunk
 * interleavings; both must produce the same mean bit for bit, equal to the
 * mean of the fp16-rounded anchors computed here from the decoded messages.
 * Gaps are refused and reported for a resume, a malformed message stops
 * counting without blocking the round, a missing member is given up after the
 * timeout, and chunks for a finished round or beyond the slots are refused.
 * Through a hub: the plan picks one only where the uplinks make it faster;
 * members take the hub's fp32 mean and end bit for bit where the hub and a
 * member collecting for itself end; a malformed, NaN or silent hub leaves the
 * round to its own collection. Under a robust rule a poisoned anchor is
 * refused alike on two collectors and no hub's mean is taken. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "common/error.h"
#include "scheduler/recon.h"

#define K 4
#define CHUNK (64u * 1024u)

static td_layout_t *layout;
static size_t numel;
static float *d[K];             /* member i's anchor - init */
static uint8_t *msg[K];         /* member i's message, as its own collector made it */
static size_t msg_len;

static void make_messages(void) {
  for (size_t i = 0; i < K; i++) {
    d[i] = calloc(numel, sizeof(float)); /* padding between tensors stays 0 */
    for (size_t t = 0; t < td_layout_count(layout); t++) {
      const td_tensor_info_t *ti = td_layout_tensor(layout, t);
      for (size_t j = ti->offset; j < ti->offset + ti->numel; j++) /* magnitudes differ */
        d[i][j] = (float)(sin(0.37 * (double)j + (double)i) * 0.05 * (double)(i + 1));
    }
    td_recon_t *c;
    ck_assert_int_eq(td_recon_open(&c, layout), 0);
    const uint8_t *m;
    ck_assert_int_eq(td_recon_own(c, 25, d[i], i, 1u << i, 0, &m, &msg_len, NULL, 0), 0);
    ck_assert_uint_eq(msg_len, td_recon_message_bytes(c));
    msg[i] = malloc(msg_len);
    memcpy(msg[i], m, msg_len);
    td_recon_close(&c);
  }
}

static void setup(void) {
  uint32_t w[2] = {300, 200}, b[1] = {10};
  td_layout_new(&layout);
  td_layout_add(layout, "w", 2, w);
  td_layout_add(layout, "b", 1, b);
  numel = td_layout_numel(layout);
  make_messages();
}

static void teardown(void) {
  for (size_t i = 0; i < K; i++) {
    free(d[i]);
    free(msg[i]);
  }
  td_layout_free(&layout);
}

static td_recon_result_t feed(td_recon_t *c, uint64_t round, size_t member, uint64_t off) {
  td_recon_result_t res;
  size_t len = msg_len - off < CHUNK ? msg_len - off : CHUNK;
  ck_assert_int_eq(td_recon_chunk(c, round, member, off, msg_len, msg[member] + off, len, false,
                                  1.0, &res, NULL, 0), 0);
  return res;
}

static void feed_all(td_recon_t *c, uint64_t round, size_t member) {
  for (uint64_t off = 0; off < msg_len; off += CHUNK)
    feed(c, round, member, off);
}

/* td_recon_take, its result spread out */
static bool take(td_recon_t *c, double now, double timeout, uint64_t *round, float *mean,
                 unsigned *used, unsigned *expected) {
  td_recon_taken_t t;
  if (!td_recon_take(c, now, timeout, mean, &t))
    return false;
  ck_assert_uint_eq(t.hub, TD_RECON_MESH); /* collected here */
  ck_assert_uint_eq(t.want_mean, 0);       /* nobody sent to us as a hub */
  *round = t.round;
  *used = t.used;
  *expected = t.expected;
  return true;
}

START_TEST(mean_is_identical_in_any_order_and_matches_the_reference) {
  ck_assert_uint_gt(msg_len, CHUNK); /* more than one chunk per message */
  const uint64_t all = (1u << K) - 1;
  /* collector A is member 0: own first, then 1, 2, 3 one after the other */
  td_recon_t *a, *b;
  const uint8_t *m;
  size_t len;
  ck_assert_int_eq(td_recon_open(&a, layout), 0);
  ck_assert_int_eq(td_recon_own(a, 25, d[0], 0, all, 0, &m, &len, NULL, 0), 0);
  ck_assert(memcmp(m, msg[0], len) == 0); /* deterministic encoding */
  for (size_t i = 1; i < K; i++)
    feed_all(a, 25, i);
  /* collector B is member 2: peers' chunks interleaved and before its own */
  ck_assert_int_eq(td_recon_open(&b, layout), 0);
  ck_assert_int_eq(feed(b, 25, 3, 0), TD_RECON_ACCEPTED);
  ck_assert_int_eq(feed(b, 25, 0, 0), TD_RECON_ACCEPTED);
  ck_assert_int_eq(feed(b, 25, 1, 0), TD_RECON_ACCEPTED);
  ck_assert_int_eq(feed(b, 25, 0, CHUNK), TD_RECON_COMPLETED);
  ck_assert_int_eq(feed(b, 25, 3, CHUNK), TD_RECON_COMPLETED);
  float *ma = malloc(numel * sizeof(float)), *mb = malloc(numel * sizeof(float));
  uint64_t round;
  unsigned used, expected;
  ck_assert(!take(b, 2.0, 100, &round, mb, &used, &expected)); /* own not in */
  ck_assert_int_eq(td_recon_own(b, 25, d[2], 2, all, 2.0, &m, &len, NULL, 0), 0);
  ck_assert(!take(b, 2.0, 100, &round, mb, &used, &expected)); /* 1 missing */
  ck_assert_int_eq(feed(b, 25, 1, CHUNK), TD_RECON_COMPLETED);
  ck_assert(take(b, 2.0, 100, &round, mb, &used, &expected));
  ck_assert_uint_eq(round, 25);
  ck_assert_uint_eq(used, K);
  ck_assert_uint_eq(expected, K);
  ck_assert(take(a, 2.0, 100, &round, ma, &used, &expected));
  ck_assert(memcmp(ma, mb, numel * sizeof(float)) == 0);
  /* reference: decode every message, average in double */
  float *x = malloc(numel * sizeof(float));
  double *ref = calloc(numel, sizeof *ref);
  for (size_t i = 0; i < K; i++) {
    ck_assert_int_eq(td_codec_decode_message(layout, msg[i], msg_len, x, NULL, NULL, 0), 0);
    for (size_t j = 0; j < numel; j++)
      ref[j] += x[j];
  }
  double worst_fp16 = 0;
  for (size_t j = 0; j < numel; j++) {
    ck_assert(ma[j] == (float)(ref[j] / K));
    double exact = 0;
    for (size_t i = 0; i < K; i++)
      exact += d[i][j];
    worst_fp16 = fmax(worst_fp16, fabs(ma[j] - exact / K));
  }
  ck_assert_msg(worst_fp16 < 1e-4, "worst %g", worst_fp16); /* fp16 of values under 0.2: half an ulp is < 6.2e-5 */
  /* the round is done: more chunks for it are late */
  ck_assert_int_eq(feed(a, 25, 1, 0), TD_RECON_LATE);
  free(x);
  free(ref);
  free(ma);
  free(mb);
  td_recon_close(&a);
  td_recon_close(&b);
}
END_TEST

/* Under trimmed:1 (norm bound 5) a member whose anchor is its own x -10 is
 * refused by the norm bound on both collectors, whatever the order; both end
 * on the mean of the three others bit for bit, far from the plain mean; a
 * hub's mean is refused and a member asking us to be its hub is not served. */
START_TEST(a_robust_rule_combines_the_anchors_and_takes_no_hub) {
  const uint64_t all = (1u << K) - 1;
  td_agg_spec_t rule;
  ck_assert_int_eq(td_agg_parse(&rule, "trimmed:1", NULL, 0), 0);
  rule.norm_bound = -1;
  td_agg_resolve(&rule);
  /* member 3's poisoned message */
  float *bad = malloc(numel * sizeof(float));
  for (size_t j = 0; j < numel; j++)
    bad[j] = -10.0f * d[3][j];
  td_recon_t *tmp;
  const uint8_t *m;
  size_t len;
  ck_assert_int_eq(td_recon_open(&tmp, layout), 0);
  ck_assert_int_eq(td_recon_own(tmp, 25, bad, 3, 1u << 3, 0, &m, &len, NULL, 0), 0);
  uint8_t *bad_msg = malloc(len);
  memcpy(bad_msg, m, len);
  td_recon_close(&tmp);
  td_recon_t *a, *b;
  ck_assert_int_eq(td_recon_open(&a, layout), 0);
  ck_assert_int_eq(td_recon_open(&b, layout), 0);
  td_recon_set_rule(a, &rule);
  td_recon_set_rule(b, &rule);
  ck_assert(td_recon_robust(a));
  td_recon_result_t res;
  /* a is member 0: own, then 1, 2 and the bad 3, which asks a to be its hub */
  ck_assert_int_eq(td_recon_own(a, 25, d[0], 0, all, 0, &m, &len, NULL, 0), 0);
  feed_all(a, 25, 1);
  feed_all(a, 25, 2);
  for (uint64_t off = 0; off < msg_len; off += CHUNK)
    ck_assert_int_eq(td_recon_chunk(a, 25, 3, off, msg_len, bad_msg + off,
                                    msg_len - off < CHUNK ? msg_len - off : CHUNK, true, 1.0,
                                    &res, NULL, 0), 0);
  /* b is member 2: the bad one first, then 1 and 0, its own last */
  for (uint64_t off = 0; off < msg_len; off += CHUNK)
    ck_assert_int_eq(td_recon_chunk(b, 25, 3, off, msg_len, bad_msg + off,
                                    msg_len - off < CHUNK ? msg_len - off : CHUNK, false, 1.0,
                                    &res, NULL, 0), 0);
  feed_all(b, 25, 1);
  feed_all(b, 25, 0);
  /* a hub's mean is never taken under the rule */
  float *fake = calloc(numel, sizeof(float));
  td_recon_t *enc;
  ck_assert_int_eq(td_recon_open(&enc, layout), 0);
  ck_assert_int_eq(td_recon_encode_mean(enc, fake, &m, &len), 0);
  ck_assert_int_eq(td_recon_mean_chunk(b, 25, 3, 0, len, m, len < CHUNK ? len : CHUNK, 4, 4, 1.0,
                                       &res, NULL, 0), 0);
  ck_assert_int_eq(res, TD_RECON_REJECTED);
  td_recon_close(&enc);
  ck_assert_int_eq(td_recon_own(b, 25, d[2], 2, all, 2.0, &m, &len, NULL, 0), 0);
  float *ma = malloc(numel * sizeof(float)), *mb = malloc(numel * sizeof(float));
  td_recon_taken_t ta, tb;
  ck_assert(td_recon_take(a, 2.0, 100, ma, &ta));
  ck_assert(td_recon_take(b, 2.0, 100, mb, &tb));
  ck_assert(memcmp(ma, mb, numel * sizeof(float)) == 0);
  ck_assert_uint_eq(ta.refused, 1u << 3);
  ck_assert_uint_eq(tb.refused, 1u << 3);
  ck_assert_uint_eq(ta.used, 3);
  ck_assert_uint_eq(ta.expected, K);
  ck_assert_uint_eq(ta.want_mean, 0); /* 3 asked a to be its hub: not served */
  ck_assert_uint_eq(ta.hub, TD_RECON_MESH);
  /* reference: the mean of members 0-2 as decoded (fp16 sums are exact in double) */
  float *x = malloc(numel * sizeof(float));
  double *ref = calloc(numel, sizeof *ref), *with_bad = calloc(numel, sizeof *with_bad);
  for (size_t i = 0; i < K; i++) {
    ck_assert_int_eq(td_codec_decode_message(layout, i == 3 ? bad_msg : msg[i], msg_len, x, NULL,
                                             NULL, 0), 0);
    for (size_t j = 0; j < numel; j++) {
      ref[j] += i < 3 ? x[j] : 0;
      with_bad[j] += x[j];
    }
  }
  double far = 0;
  for (size_t j = 0; j < numel; j++) {
    ck_assert(ma[j] == (float)(ref[j] / 3));
    far = fmax(far, fabs(ma[j] - with_bad[j] / K));
  }
  ck_assert_msg(far > 0.1, "the plain mean would be %g away", far);
  free(x);
  free(ref);
  free(with_bad);
  free(fake);
  free(ma);
  free(mb);
  free(bad);
  free(bad_msg);
  td_recon_close(&a);
  td_recon_close(&b);
}
END_TEST

START_TEST(gaps_are_refused_and_asked_again) {
  td_recon_t *c;
  const uint8_t *m;
  size_t len;
  ck_assert_int_eq(td_recon_open(&c, layout), 0);
  ck_assert_int_eq(td_recon_own(c, 50, d[0], 0, 0x3, 10.0, &m, &len, NULL, 0), 0);
  ck_assert_int_eq(feed(c, 50, 1, CHUNK), TD_RECON_DUPLICATE); /* first chunk lost */
  td_recon_stall_t st[4];
  ck_assert_uint_eq(td_recon_stalled(c, 11.0, 3.0, st, 4), 0);
  ck_assert_uint_eq(td_recon_stalled(c, 13.5, 3.0, st, 4), 1);
  ck_assert_uint_eq(st[0].round, 50);
  ck_assert_uint_eq(st[0].member, 1);
  ck_assert_uint_eq(st[0].offset, 0);
  ck_assert_uint_eq(td_recon_stalled(c, 14.0, 3.0, st, 4), 0); /* its clock restarted */
  ck_assert_int_eq(feed(c, 50, 1, 0), TD_RECON_ACCEPTED);
  ck_assert_int_eq(feed(c, 50, 1, 0), TD_RECON_DUPLICATE);
  ck_assert_int_eq(feed(c, 50, 1, CHUNK), TD_RECON_COMPLETED);
  const uint8_t *held;
  ck_assert(td_recon_own_message(c, 50, &held, &len));
  ck_assert(memcmp(held, msg[0], len) == 0);
  ck_assert(!td_recon_own_message(c, 51, &held, &len));
  /* our last four messages stay held after their rounds are reconciled, for
   * members that are behind; the fifth pushes the oldest out */
  float *mean = malloc(numel * sizeof(float));
  td_recon_taken_t t;
  ck_assert(td_recon_take(c, 14.0, 30, mean, &t)); /* round 50 */
  for (uint64_t r = 60; r <= 90; r += 10) {
    ck_assert_int_eq(td_recon_own(c, r, d[0], 0, 0x1, 14.0, &m, &len, NULL, 0), 0);
    ck_assert(td_recon_take(c, 14.0, 30, mean, &t)); /* alone: complete at once */
    ck_assert_uint_eq(t.round, r);
    ck_assert(td_recon_own_message(c, 60, &held, &len) == true);
  }
  ck_assert(!td_recon_own_message(c, 50, &held, &len)); /* 60, 70, 80, 90 held */
  free(mean);
  td_recon_close(&c);
}
END_TEST

START_TEST(hostile_and_missing_members_do_not_block_a_round) {
  td_recon_t *c;
  const uint8_t *m;
  size_t len;
  td_recon_result_t res;
  char why[256];
  ck_assert_int_eq(td_recon_open(&c, layout), 0);
  /* sizes that do not match the layout */
  ck_assert_int_eq(td_recon_chunk(c, 25, 1, 0, msg_len + 4, msg[1], 16, false, 0, &res, why,
                                  sizeof why), TD_EPROTO);
  ck_assert_int_eq(td_recon_chunk(c, 25, 1, msg_len - 8, msg_len, msg[1], 16, false, 0, &res, why,
                                  sizeof why), TD_EPROTO);
  ck_assert_int_eq(td_recon_chunk(c, 25, TD_RECON_MAX_MEMBERS, 0, msg_len, msg[1], 16, false, 0,
                                  &res, why, sizeof why), TD_EPROTO);
  /* NaN in our own anchor: nothing is produced */
  float *bad = malloc(numel * sizeof(float));
  memcpy(bad, d[0], numel * sizeof(float));
  bad[7] = NAN;
  ck_assert_int_eq(td_recon_own(c, 25, bad, 0, 0xf, 0, &m, &len, why, sizeof why), TD_ENUMERIC);
  free(bad);
  ck_assert_int_eq(td_recon_own(c, 25, d[0], 0, 0xf, 0, &m, &len, NULL, 0), 0);
  /* member 1 sends a message whose header is garbage: rejected */
  uint8_t *junk = malloc(msg_len);
  memcpy(junk, msg[1], msg_len);
  memset(junk, 0xff, 16);
  for (uint64_t off = 0; off < msg_len; off += CHUNK) {
    size_t n = msg_len - off < CHUNK ? msg_len - off : CHUNK;
    ck_assert_int_eq(td_recon_chunk(c, 25, 1, off, msg_len, junk + off, n, false, 0, &res, why,
                                    sizeof why), 0);
  }
  ck_assert_int_eq(res, TD_RECON_REJECTED);
  free(junk);
  feed_all(c, 25, 2);
  float *mean = malloc(numel * sizeof(float));
  uint64_t round;
  unsigned used, expected;
  ck_assert(!take(c, 5.0, 30, &round, mean, &used, &expected)); /* 3 still due */
  ck_assert(take(c, 30.0, 30, &round, mean, &used, &expected)); /* timed out */
  ck_assert_uint_eq(used, 2); /* ours and member 2's */
  ck_assert_uint_eq(expected, 4);
  /* the mean of two fp16-rounded anchors */
  float *x0 = malloc(numel * sizeof(float)), *x2 = malloc(numel * sizeof(float));
  td_codec_decode_message(layout, msg[0], msg_len, x0, NULL, NULL, 0);
  td_codec_decode_message(layout, msg[2], msg_len, x2, NULL, NULL, 0);
  for (size_t j = 0; j < numel; j++)
    ck_assert(mean[j] == (float)(((double)x0[j] + x2[j]) / 2));
  free(x0);
  free(x2);
  free(mean);
  td_recon_close(&c);
}
END_TEST

START_TEST(two_rounds_at_most_in_flight) {
  td_recon_t *c;
  const uint8_t *m;
  size_t len;
  char why[128];
  ck_assert_int_eq(td_recon_open(&c, layout), 0);
  ck_assert_int_eq(td_recon_own(c, 25, d[0], 0, 0x3, 0, &m, &len, NULL, 0), 0);
  ck_assert_int_eq(td_recon_own(c, 50, d[0], 0, 0x3, 0, &m, &len, NULL, 0), 0);
  ck_assert_int_eq(td_recon_own(c, 75, d[0], 0, 0x3, 0, &m, &len, why, sizeof why), TD_ERANGE);
  ck_assert_int_eq(feed(c, 75, 1, 0), TD_RECON_AHEAD);
  /* round 50 completes first; 25 is still given out before it is done */
  feed_all(c, 50, 1);
  float *mean = malloc(numel * sizeof(float));
  uint64_t round;
  unsigned used, expected;
  ck_assert(take(c, 1, 30, &round, mean, &used, &expected));
  ck_assert_uint_eq(round, 50);
  ck_assert(!take(c, 1, 30, &round, mean, &used, &expected));
  feed_all(c, 25, 1);
  ck_assert(take(c, 1, 30, &round, mean, &used, &expected));
  ck_assert_uint_eq(round, 25);
  ck_assert_uint_eq(used, 2);
  free(mean);
  td_recon_close(&c);
}
END_TEST

START_TEST(plan_takes_a_hub_only_where_uplinks_make_it_faster) {
  const double M = 200e3; /* an fp16 message, bytes */
  double hub_s;
  /* 20, 20, 2, 2 Mbit/s: mesh 3 M / 0.25 MB/s = 2.4 s; hub M / 0.25 + 6 M / 2.5 = 1.28 s */
  double wan[4] = {2.5e6, 2.5e6, 2.5e5, 2.5e5};
  ck_assert_uint_eq(td_recon_plan(wan, 0xf, TD_RECON_VIA_AUTO, M, &hub_s), 0);
  ck_assert(fabs(hub_s - 1.28) < 1e-9);
  ck_assert_uint_eq(td_recon_plan(wan, 0xf, TD_RECON_VIA_MESH, M, &hub_s), TD_RECON_MESH);
  /* the slow ones first: the lowest index among the fast */
  double wan2[4] = {2.5e5, 2.4e6, 2.5e6, 2.5e5};
  ck_assert_uint_eq(td_recon_plan(wan2, 0xf, TD_RECON_VIA_AUTO, M, NULL), 1);
  /* the hub is chosen among the members expected only */
  ck_assert_uint_eq(td_recon_plan(wan2, 0xd, TD_RECON_VIA_AUTO, M, NULL), 2);
  /* equal uplinks: the mesh is faster (3 M / u against M / u + 6 M / u) */
  double even[4] = {1e6, 1e6, 1e6, 1e6};
  ck_assert_uint_eq(td_recon_plan(even, 0xf, TD_RECON_VIA_AUTO, M, NULL), TD_RECON_MESH);
  ck_assert_uint_eq(td_recon_plan(even, 0xf, TD_RECON_VIA_HUB, M, &hub_s), 0);
  ck_assert(fabs(hub_s - 7 * M / 1e6) < 1e-9);
  /* ratio 3 with 4 members: 1/u + 6/(3u) = 3/u is not under 0.8 x 3/u */
  double three[4] = {3e6, 3e6, 1e6, 1e6};
  ck_assert_uint_eq(td_recon_plan(three, 0xf, TD_RECON_VIA_AUTO, M, NULL), TD_RECON_MESH);
  /* an unknown (0, negative, NaN) uplink: auto stays on the mesh; hub mode picks among known */
  double unknown[4] = {0, 2.5e6, NAN, -1};
  ck_assert_uint_eq(td_recon_plan(unknown, 0xf, TD_RECON_VIA_AUTO, M, &hub_s), TD_RECON_MESH);
  ck_assert(hub_s == 0);
  ck_assert_uint_eq(td_recon_plan(unknown, 0xf, TD_RECON_VIA_HUB, M, NULL), 1);
  double none[4] = {0, 0, 0, 0};
  ck_assert_uint_eq(td_recon_plan(none, 0xe, TD_RECON_VIA_HUB, M, NULL), 1);
  /* two members or fewer: a swap, never a hub in auto */
  ck_assert_uint_eq(td_recon_plan(wan, 0x5, TD_RECON_VIA_AUTO, M, NULL), TD_RECON_MESH);
  ck_assert_uint_eq(td_recon_plan(wan, 0x1, TD_RECON_VIA_HUB, M, NULL), TD_RECON_MESH);
}
END_TEST

/* The hub's chunks of a mean message into collector c. */
static td_recon_result_t feed_mean(td_recon_t *c, uint64_t round, size_t hub, const uint8_t *m,
                                   size_t len, unsigned used, unsigned expected) {
  td_recon_result_t res = TD_RECON_ACCEPTED;
  for (uint64_t off = 0; off < len; off += CHUNK) {
    size_t n = len - off < CHUNK ? len - off : CHUNK;
    ck_assert_int_eq(td_recon_mean_chunk(c, round, hub, off, len, m + off, n, used, expected, 1.0,
                                         &res, NULL, 0), 0);
    if (off + n < len && res != TD_RECON_ACCEPTED)
      return res; /* only the last chunk completes */
  }
  return res;
}

START_TEST(members_end_on_the_hubs_mean_bit_for_bit) {
  const uint64_t all = (1u << K) - 1;
  const uint8_t *m;
  size_t len;
  td_recon_t *hub, *mem, *mesh;
  ck_assert_int_eq(td_recon_open(&hub, layout), 0);
  ck_assert_int_eq(td_recon_open(&mem, layout), 0);
  ck_assert_int_eq(td_recon_open(&mesh, layout), 0);
  /* hub = member 0: the others' messages arrive marked for it */
  ck_assert_int_eq(td_recon_own(hub, 25, d[0], 0, all, 0, &m, &len, NULL, 0), 0);
  for (size_t i = 1; i < K; i++)
    for (uint64_t off = 0; off < msg_len; off += CHUNK) {
      td_recon_result_t res;
      size_t n = msg_len - off < CHUNK ? msg_len - off : CHUNK;
      ck_assert_int_eq(td_recon_chunk(hub, 25, i, off, msg_len, msg[i] + off, n, true, 1.0, &res,
                                      NULL, 0), 0);
    }
  float *mh = malloc(numel * sizeof(float)), *mm = malloc(numel * sizeof(float)),
        *mx = malloc(numel * sizeof(float));
  td_recon_taken_t t;
  ck_assert(td_recon_take(hub, 1.0, 100, mh, &t));
  ck_assert_uint_eq(t.hub, TD_RECON_MESH);
  ck_assert_uint_eq(t.want_mean, all & ~1u); /* all three wait for the mean */
  ck_assert_uint_eq(t.used, K);
  const uint8_t *mean_msg;
  size_t mean_len;
  ck_assert_int_eq(td_recon_encode_mean(hub, mh, &mean_msg, &mean_len), 0);
  ck_assert_uint_eq(mean_len, td_recon_mean_bytes(hub));
  ck_assert_uint_gt(mean_len, 2 * CHUNK);
  /* member 2 sent to the hub and waits: no stall during the quiet time */
  ck_assert_int_eq(td_recon_own(mem, 25, d[2], 2, all, 10.0, &m, &len, NULL, 0), 0);
  td_recon_quiet(mem, 25, 10.0, 5.0);
  td_recon_stall_t st[8];
  ck_assert_uint_eq(td_recon_stalled(mem, 17.9, 3.0, st, 8), 0);
  ck_assert(!td_recon_take(mem, 17.9, 100, mm, &t));
  ck_assert_int_eq(feed_mean(mem, 25, 0, mean_msg, mean_len, K, K), TD_RECON_COMPLETED);
  ck_assert(td_recon_take(mem, 17.9, 100, mm, &t));
  ck_assert_uint_eq(t.round, 25);
  ck_assert_uint_eq(t.hub, 0);
  ck_assert_uint_eq(t.used, K);
  ck_assert_uint_eq(t.expected, K);
  ck_assert(memcmp(mh, mm, numel * sizeof(float)) == 0);
  /* a member that fell back to the mesh computes the same floats */
  ck_assert_int_eq(td_recon_own(mesh, 25, d[3], 3, all, 0, &m, &len, NULL, 0), 0);
  for (size_t i = 0; i < 3; i++)
    feed_all(mesh, 25, i);
  ck_assert(td_recon_take(mesh, 1.0, 100, mx, &t));
  ck_assert(memcmp(mh, mx, numel * sizeof(float)) == 0);
  /* the mean after the round is late */
  ck_assert_int_eq(feed_mean(mem, 25, 0, mean_msg, mean_len, K, K), TD_RECON_LATE);
  free(mh);
  free(mm);
  free(mx);
  td_recon_close(&hub);
  td_recon_close(&mem);
  td_recon_close(&mesh);
}
END_TEST

START_TEST(a_bad_or_silent_hub_falls_back_to_the_mesh) {
  const uint64_t all = (1u << K) - 1;
  const uint8_t *m;
  size_t len;
  td_recon_result_t res;
  char why[256];
  td_recon_t *c, *enc;
  ck_assert_int_eq(td_recon_open(&c, layout), 0);
  ck_assert_int_eq(td_recon_open(&enc, layout), 0);
  float *x = malloc(numel * sizeof(float)), *mean = malloc(numel * sizeof(float));
  memcpy(x, d[1], numel * sizeof(float));
  const uint8_t *good;
  size_t mlen;
  ck_assert_int_eq(td_recon_encode_mean(enc, x, &good, &mlen), 0);
  uint8_t *bad = malloc(mlen);
  memcpy(bad, good, mlen);
  ck_assert_int_eq(td_recon_own(c, 25, d[2], 2, all, 0, &m, &len, NULL, 0), 0);
  td_recon_quiet(c, 25, 0, 2.0);
  /* sizes that do not match, a count that cannot be, NaN: nothing taken */
  ck_assert_int_eq(td_recon_mean_chunk(c, 25, 0, 0, mlen + 4, good, 16, 4, 4, 0, &res, why,
                                       sizeof why), TD_EPROTO);
  ck_assert_int_eq(td_recon_mean_chunk(c, 25, TD_RECON_MAX_MEMBERS, 0, mlen, good, 16, 4, 4, 0,
                                       &res, why, sizeof why), TD_EPROTO);
  ck_assert_int_eq(feed_mean(c, 25, 0, good, mlen, 0, 4), TD_RECON_REJECTED);
  ck_assert_int_eq(feed_mean(c, 25, 0, good, mlen, 5, 4), TD_RECON_REJECTED);
  uint32_t nan_bits = 0x7fc00000;
  memcpy(bad + mlen - 4, &nan_bits, 4); /* the last float of the last tensor */
  ck_assert_int_eq(feed_mean(c, 25, 0, bad, mlen, 4, 4), TD_RECON_REJECTED);
  memset(bad, 0xff, 16);
  ck_assert_int_eq(feed_mean(c, 25, 0, bad, mlen, 4, 4), TD_RECON_REJECTED);
  td_recon_taken_t t;
  ck_assert(!td_recon_take(c, 1.0, 30, mean, &t));
  /* a second hub's chunks while the first is midway are dropped */
  ck_assert_int_eq(td_recon_mean_chunk(c, 25, 0, 0, mlen, good, CHUNK, 4, 4, 0, &res, NULL, 0), 0);
  ck_assert_int_eq(res, TD_RECON_ACCEPTED);
  ck_assert_int_eq(td_recon_mean_chunk(c, 25, 1, 0, mlen, good, CHUNK, 4, 4, 0, &res, NULL, 0), 0);
  ck_assert_int_eq(res, TD_RECON_DUPLICATE);
  /* the hub goes silent: after the quiet time and the stall time every
   * missing member is asked for its message, and the mesh completes it */
  td_recon_stall_t st[8];
  ck_assert_uint_eq(td_recon_stalled(c, 4.9, 3.0, st, 8), 0);
  ck_assert_uint_eq(td_recon_stalled(c, 5.1, 3.0, st, 8), 3);
  for (size_t i = 0; i < 3; i++) {
    ck_assert_uint_eq(st[i].member, i == 2 ? 3 : i);
    ck_assert_uint_eq(st[i].offset, 0);
  }
  feed_all(c, 25, 0);
  feed_all(c, 25, 1);
  feed_all(c, 25, 3);
  ck_assert(td_recon_take(c, 6.0, 30, mean, &t));
  ck_assert_uint_eq(t.hub, TD_RECON_MESH);
  ck_assert_uint_eq(t.used, K);
  ck_assert(mean[5] != x[5]); /* the collected mean, not the partial hub message */
  free(x);
  free(mean);
  free(bad);
  td_recon_close(&c);
  td_recon_close(&enc);
}
END_TEST

int main(void) {
  Suite *s = suite_create("recon");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, mean_is_identical_in_any_order_and_matches_the_reference);
  tcase_add_test(tc, a_robust_rule_combines_the_anchors_and_takes_no_hub);
  tcase_add_test(tc, gaps_are_refused_and_asked_again);
  tcase_add_test(tc, hostile_and_missing_members_do_not_block_a_round);
  tcase_add_test(tc, two_rounds_at_most_in_flight);
  tcase_add_test(tc, plan_takes_a_hub_only_where_uplinks_make_it_faster);
  tcase_add_test(tc, members_end_on_the_hubs_mean_bit_for_bit);
  tcase_add_test(tc, a_bad_or_silent_hub_falls_back_to_the_mesh);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
