/* test_backfill.c: what an update's origin signs (daemon/session/backfill.c).
 * An update signed over td__backfill_digest verifies with the origin's key,
 * whoever forwards it; a copy with any byte of its message changed, or named
 * for another run, origin, round or sample count, does not, nor does it
 * under another member's key. The digest is BLAKE2b-256 of the label and
 * the fields, checked against libsodium's own hash of the same bytes. */
#include <check.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/session/shared.h"

#define LEN 1000

static uint8_t msg[LEN], pub[TD__BACKFILL_KEY], sec[crypto_sign_SECRETKEYBYTES],
    other_pub[TD__BACKFILL_KEY], other_sec[crypto_sign_SECRETKEYBYTES];

static void setup(void) {
  ck_assert_int_ge(sodium_init(), 0);
  crypto_sign_keypair(pub, sec);
  crypto_sign_keypair(other_pub, other_sec);
  for (int i = 0; i < LEN; i++)
    msg[i] = (uint8_t)(i * 7 + 3);
}

static void sign(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                 const uint8_t *key, uint8_t sig[TD__BACKFILL_SIG]) {
  uint8_t digest[TD__BACKFILL_DIGEST];
  td__backfill_digest(run, origin, round, samples, msg, LEN, digest);
  crypto_sign_detached(sig, NULL, digest, sizeof digest, key);
}

START_TEST(the_digest_is_blake2b_of_label_and_fields) {
  uint8_t got[TD__BACKFILL_DIGEST], want[TD__BACKFILL_DIGEST];
  td__backfill_digest(0x0102030405060708, 9, 10, 11, msg, LEN, got);
  uint8_t in[14 + 32 + LEN];
  memcpy(in, "traind-update1", 14);
  const uint64_t v[4] = {0x0102030405060708, 9, 10, 11};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 8; i++)
      in[14 + 8 * k + i] = (uint8_t)(v[k] >> (8 * i)); /* little-endian */
  memcpy(in + 46, msg, LEN);
  crypto_generichash(want, sizeof want, in, sizeof in, NULL, 0);
  ck_assert(memcmp(got, want, sizeof got) == 0);
}
END_TEST

START_TEST(a_signed_update_verifies_and_nothing_else_does) {
  uint8_t sig[TD__BACKFILL_SIG];
  sign(1, 2, 3, 64, sec, sig);
  ck_assert(td__backfill_verify(1, 2, 3, 64, msg, LEN, sig, pub, NULL));
  /* the digest it checked, for the coordinator's set to name */
  uint8_t checked[TD__BACKFILL_DIGEST], want[TD__BACKFILL_DIGEST];
  ck_assert(td__backfill_verify(1, 2, 3, 64, msg, LEN, sig, pub, checked));
  td__backfill_digest(1, 2, 3, 64, msg, LEN, want);
  ck_assert(memcmp(checked, want, sizeof want) == 0);
  /* another run, origin, round or sample count */
  ck_assert(!td__backfill_verify(9, 2, 3, 64, msg, LEN, sig, pub, NULL));
  ck_assert(!td__backfill_verify(1, 9, 3, 64, msg, LEN, sig, pub, NULL));
  ck_assert(!td__backfill_verify(1, 2, 9, 64, msg, LEN, sig, pub, NULL));
  ck_assert(!td__backfill_verify(1, 2, 3, 65, msg, LEN, sig, pub, NULL));
  /* another member's key */
  ck_assert(!td__backfill_verify(1, 2, 3, 64, msg, LEN, sig, other_pub, NULL));
  /* any changed byte of the message, or a shorter one */
  for (int i = 0; i < LEN; i += 97) {
    msg[i] ^= 0x10;
    ck_assert(!td__backfill_verify(1, 2, 3, 64, msg, LEN, sig, pub, NULL));
    msg[i] ^= 0x10;
  }
  ck_assert(!td__backfill_verify(1, 2, 3, 64, msg, LEN - 1, sig, pub, NULL));
  /* a signature by another key over the same update */
  uint8_t forged[TD__BACKFILL_SIG];
  sign(1, 2, 3, 64, other_sec, forged);
  ck_assert(!td__backfill_verify(1, 2, 3, 64, msg, LEN, forged, pub, NULL));
  ck_assert(td__backfill_verify(1, 2, 3, 64, msg, LEN, sig, pub, NULL)); /* unchanged after all that */
}
END_TEST

int main(void) {
  Suite *s = suite_create("backfill");
  TCase *tc = tcase_create("backfill");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, the_digest_is_blake2b_of_label_and_fields);
  tcase_add_test(tc, a_signed_update_verifies_and_nothing_else_does);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
