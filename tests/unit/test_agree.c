/* test_agree.c: model-state agreement's canonical hash and majority rule
 * (scheduler/agree.h). The hash is BLAKE2b-256 of the tensors' floats as
 * little-endian binary32 in layout order, then the momentum's: checked
 * against digests computed independently (Python's hashlib.blake2b with
 * digest_size=32 over struct.pack('<5f', ...)); the same state hashes the
 * same, one changed float or bit changes it, the padding between tensors
 * does not count. The vote: a hash is agreed only when more than half of the
 * round's members hold it, whoever did not answer; a lone liar is outvoted
 * and a tie repairs nobody. */
#include <check.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/agree.h"

/* Two tensors, w[3] and b[2]; the layout may pad between them. */
static td_layout_t *layout;
static float *state, *mom;

static void hex(const uint8_t *h, char out[65]) {
  for (size_t i = 0; i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Fill the layout's tensors with vals (5 values) and the padding with junk. */
static void fill(float *buf, const float *vals) {
  for (size_t i = 0; i < td_layout_numel(layout); i++)
    buf[i] = 1234.5f + (float)i; /* padding, where there is some */
  size_t k = 0;
  for (size_t t = 0; t < td_layout_count(layout); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(layout, t);
    for (size_t j = 0; j < ti->numel; j++)
      buf[ti->offset + j] = vals[k++];
  }
}

static const float VALS[5] = {1.0f, -2.5f, 0.375f, 3.0f, -0.125f};
static const float MOM[5] = {0.5f, 0.25f, -1.0f, 2.0f, 4.0f};

static void setup(void) {
  uint32_t w[1] = {3}, b[1] = {2};
  td_layout_new(&layout);
  td_layout_add(layout, "w", 1, w);
  td_layout_add(layout, "b", 1, b);
  state = calloc(td_layout_numel(layout), sizeof(float));
  mom = calloc(td_layout_numel(layout), sizeof(float));
  fill(state, VALS);
  fill(mom, MOM);
}

static void teardown(void) {
  free(state);
  free(mom);
  td_layout_free(&layout);
}

START_TEST(hash_is_blake2b_of_little_endian_floats) {
  uint8_t h[TD_AGREE_HASH_BYTES];
  char text[65];
  ck_assert_int_eq(td_agree_hash(layout, state, NULL, h), 0);
  hex(h, text);
  /* hashlib.blake2b(struct.pack('<5f', 1.0, -2.5, 0.375, 3.0, -0.125), digest_size=32) */
  ck_assert_str_eq(text, "9a3ae44aedcc53cfff2fa47a95162465de474f5cc305f834ce1d6fa348dc1a33");
  ck_assert_int_eq(td_agree_hash(layout, state, mom, h), 0);
  hex(h, text);
  /* ... + struct.pack('<5f', 0.5, 0.25, -1.0, 2.0, 4.0): the momentum follows */
  ck_assert_str_eq(text, "49026e37a53ab26e7567b709af2f89c7e68074f0da0c4f6b868d027739aab4c2");
  char shrt[17];
  td_agree_short(h, shrt);
  ck_assert_str_eq(shrt, "49026e37a53ab26e");
}
END_TEST

START_TEST(same_state_same_hash_one_float_differs) {
  uint8_t a[TD_AGREE_HASH_BYTES], b[TD_AGREE_HASH_BYTES];
  float *copy = malloc(td_layout_numel(layout) * sizeof(float));
  fill(copy, VALS);
  for (size_t i = 0; i < td_layout_numel(layout); i++) /* other padding: no matter */
    copy[i] = state[i] == 1234.5f + (float)i ? -7.0f : copy[i];
  ck_assert_int_eq(td_agree_hash(layout, state, mom, a), 0);
  ck_assert_int_eq(td_agree_hash(layout, copy, mom, b), 0);
  ck_assert_mem_eq(a, b, TD_AGREE_HASH_BYTES);
  /* one float of the model, by the smallest step it can take */
  const td_tensor_info_t *last = td_layout_tensor(layout, 1);
  copy[last->offset + 1] = nextafterf(copy[last->offset + 1], 0.0f);
  ck_assert_int_eq(td_agree_hash(layout, copy, mom, b), 0);
  ck_assert(memcmp(a, b, TD_AGREE_HASH_BYTES) != 0);
  /* the same model with another momentum: another state */
  fill(copy, VALS);
  mom[0] = -mom[0];
  ck_assert_int_eq(td_agree_hash(layout, copy, mom, b), 0);
  ck_assert(memcmp(a, b, TD_AGREE_HASH_BYTES) != 0);
  /* +0 and -0 are different bits: the hash is of bits, not of values */
  uint8_t z1[TD_AGREE_HASH_BYTES], z2[TD_AGREE_HASH_BYTES];
  copy[0] = 0.0f;
  td_agree_hash(layout, copy, NULL, z1);
  copy[0] = -0.0f;
  td_agree_hash(layout, copy, NULL, z2);
  ck_assert(memcmp(z1, z2, TD_AGREE_HASH_BYTES) != 0);
  free(copy);
}
END_TEST

/* A model bigger than the hash's conversion block hashes as one stream. */
START_TEST(large_tensor_hashes_like_its_bytes) {
  td_layout_t *big;
  uint32_t shape[1] = {10000};
  td_layout_new(&big);
  td_layout_add(big, "w", 1, shape);
  float *x = malloc(td_layout_numel(big) * sizeof(float));
  for (size_t i = 0; i < 10000; i++)
    x[i] = (float)i * 0.5f - 7.0f;
  uint8_t a[TD_AGREE_HASH_BYTES], b[TD_AGREE_HASH_BYTES];
  ck_assert_int_eq(td_agree_hash(big, x, NULL, a), 0);
  /* the same bytes through libsodium in one call (this host is little-endian
   * where the test runs; the hash converts on a big-endian one) */
  uint8_t bytes[40000];
  for (size_t i = 0; i < 10000; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], 4);
    for (int k = 0; k < 4; k++)
      bytes[4 * i + (size_t)k] = (uint8_t)(bits >> (8 * k));
  }
  ck_assert_int_eq(crypto_generichash(b, sizeof b, bytes, sizeof bytes, NULL, 0), 0);
  ck_assert_mem_eq(a, b, TD_AGREE_HASH_BYTES);
  free(x);
  td_layout_free(&big);
}
END_TEST

START_TEST(majority_of_the_members_decides) {
  uint8_t h[5][TD_AGREE_HASH_BYTES];
  memset(h, 0xaa, sizeof h);
  size_t holders;
  /* 4 members agree */
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 4, 4, &holders), 0);
  ck_assert_uint_eq(holders, 4);
  /* one of 4 differs (a corrupted node, or a liar): the other 3 win, whoever answers first */
  h[0][5] ^= 1;
  size_t at = td_agree_decide((const uint8_t(*)[32])h, 4, 4, &holders);
  ck_assert_uint_eq(holders, 3);
  ck_assert(at != TD_AGREE_NONE && memcmp(h[at], h[1], 32) == 0);
  /* 2 against 2: nobody is agreed, nobody repairs */
  h[1][5] ^= 1;
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 4, 4, &holders), TD_AGREE_NONE);
  ck_assert_uint_eq(holders, 2);
  /* 3 members, one silent: the 2 that answered alike are a majority of 3 */
  memset(h, 0xbb, sizeof h);
  ck_assert_uint_ne(td_agree_decide((const uint8_t(*)[32])h, 2, 3, &holders), TD_AGREE_NONE);
  /* 4 members, two silent: 2 alike are not more than half of 4 */
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 2, 4, &holders), TD_AGREE_NONE);
  /* 2 members that differ: neither is right */
  h[1][0] ^= 1;
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 2, 2, &holders), TD_AGREE_NONE);
  /* a lone node's own hash: one of one */
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 1, 1, &holders), 0);
  /* nothing, or more hashes than members (a caller's mistake): none */
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 0, 3, &holders), TD_AGREE_NONE);
  ck_assert_uint_eq(td_agree_decide((const uint8_t(*)[32])h, 3, 2, &holders), TD_AGREE_NONE);
}
END_TEST

int main(void) {
  Suite *s = suite_create("agree");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, hash_is_blake2b_of_little_endian_floats);
  tcase_add_test(tc, same_state_same_hash_one_float_differs);
  tcase_add_test(tc, large_tensor_hashes_like_its_bytes);
  tcase_add_test(tc, majority_of_the_members_decides);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
