/* test_admission.c: signed admission records, their store, invites and join
 * strings (daemon/net/admission.h), as a reader would use them. A record
 * signed by a node verifies with that node's signing key and with no other;
 * one changed byte breaks it; the store keeps the newest record per key,
 * survives a reopen and calls an older one a replay; an invite's key gets one
 * handshake and one request, then is refused as used; a join string holds
 * only shell-safe characters, round-trips, and a damaged one is refused with
 * a reason. */
#include <check.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/net/admission.h"

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/td-adm-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void keypair(td_keypair_t *kp) {
  char why[128];
  ck_assert_int_eq(zmq_curve_keypair(kp->pub, kp->secret), 0);
  ck_assert_int_eq(td_key_decode(kp->pub, kp->pub_raw, why, sizeof why), 0);
}

START_TEST(records_verify_only_with_their_signers_key) {
  td_keypair_t admin, other;
  keypair(&admin);
  keypair(&other);
  make_dir();
  td__admission_t *a = NULL, *b = NULL;
  char why[256];
  ck_assert_int_eq(td__admission_open(&a, dir, &admin, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_open(&b, "/nonexistent-dir", &other, why, sizeof why), 0);
  uint8_t sign_pub[TD__SIGN_KEY_BYTES], sign_secret[64];
  td__sign_keypair_derive(&admin, sign_pub, sign_secret);
  ck_assert_mem_eq(sign_pub, td__admission_sign_pub(a), TD__SIGN_KEY_BYTES); /* derived alike */
  td__record_t r, back;
  td__admission_sign(a, TD__RECORD_ADMIT, other.pub_raw, td__admission_sign_pub(b), true, &r);
  ck_assert_int_eq(td__record_parse(&back, r.bytes, sizeof r.bytes), 0);
  ck_assert_int_eq(back.kind, TD__RECORD_ADMIT);
  ck_assert(back.admin);
  ck_assert_mem_eq(back.subject, other.pub_raw, TD_KEY_BYTES);
  ck_assert_mem_eq(back.signer, admin.pub_raw, TD_KEY_BYTES);
  ck_assert(td__record_verify(&back, td__admission_sign_pub(a)));
  ck_assert(!td__record_verify(&back, td__admission_sign_pub(b)));
  for (size_t i = 0; i < TD__RECORD_BYTES; i += 13) { /* any changed byte breaks it */
    uint8_t bytes[TD__RECORD_BYTES];
    memcpy(bytes, r.bytes, sizeof bytes);
    bytes[i] ^= 0x40;
    td__record_t t;
    if (td__record_parse(&t, bytes, sizeof bytes) == 0)
      ck_assert(!td__record_verify(&t, td__admission_sign_pub(a)));
  }
  ck_assert_int_eq(td__record_parse(&back, r.bytes, TD__RECORD_BYTES - 1), TD_EPROTO);
  sodium_memzero(sign_secret, sizeof sign_secret);
  td__admission_close(&a);
  td__admission_close(&b);
  ck_assert_ptr_null(a);
  remove_dir();
}
END_TEST

START_TEST(store_keeps_the_newest_and_calls_older_a_replay) {
  td_keypair_t admin, member;
  keypair(&admin);
  keypair(&member);
  make_dir();
  td__admission_t *a = NULL;
  char why[256];
  ck_assert_int_eq(td__admission_open(&a, dir, &admin, why, sizeof why), 0);
  td__record_t admit, revoke;
  td__admission_sign(a, TD__RECORD_ADMIT, member.pub_raw, td__admission_sign_pub(a), false,
                     &admit);
  td__admission_sign(a, TD__RECORD_REVOKE, member.pub_raw, NULL, false, &revoke);
  ck_assert_uint_gt(revoke.issued_us, admit.issued_us);
  ck_assert_int_eq(td__admission_freshness(a, &admit), 1);
  ck_assert_int_eq(td__admission_store(a, &admit, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_freshness(a, &admit), 0); /* the same: a duplicate */
  ck_assert_int_eq(td__admission_freshness(a, &revoke), 1);
  ck_assert_int_eq(td__admission_store(a, &revoke, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_freshness(a, &admit), -1); /* older: a replay */
  ck_assert_uint_eq(td__admission_count(a), 1);
  td__admission_close(&a);
  /* reopened, the revocation is still the newest, and new records sign later */
  ck_assert_int_eq(td__admission_open(&a, dir, &admin, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_freshness(a, &admit), -1);
  const td__record_t *latest = td__admission_latest(a, member.pub_raw);
  ck_assert_ptr_nonnull(latest);
  ck_assert_int_eq(latest->kind, TD__RECORD_REVOKE);
  td__record_t again;
  td__admission_sign(a, TD__RECORD_ADMIT, member.pub_raw, td__admission_sign_pub(a), false,
                     &again);
  ck_assert_uint_gt(again.issued_us, revoke.issued_us);
  ck_assert_int_eq(td__admission_freshness(a, &again), 1); /* re-admission by a new record */
  td__admission_close(&a);
  /* a damaged file is refused with its line */
  char path[128];
  snprintf(path, sizeof path, "%s/" TD__ADMISSIONS_FILE, dir);
  FILE *f = fopen(path, "a");
  fprintf(f, "00ff\n");
  fclose(f);
  ck_assert_int_eq(td__admission_open(&a, dir, &admin, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":3: not an admission record"));
  remove_dir();
}
END_TEST

START_TEST(an_invite_is_good_for_one_handshake_and_one_request) {
  td_keypair_t admin, stranger;
  keypair(&admin);
  keypair(&stranger);
  td__admission_t *a = NULL;
  char why[256];
  ck_assert_int_eq(td__admission_open(&a, "/nonexistent-dir", &admin, why, sizeof why), 0);
  uint8_t secret[TD_KEY_BYTES], pub[TD_KEY_BYTES], derived[TD_KEY_BYTES];
  ck_assert_int_eq(td__admission_invite(a, true, 60, secret, pub, why, sizeof why), 0);
  crypto_scalarmult_base(derived, secret);
  ck_assert_mem_eq(derived, pub, TD_KEY_BYTES); /* the string's secret is the key's */
  ck_assert_int_eq(td__admission_invite_handshake(a, stranger.pub_raw), TD__INVITE_NONE);
  bool admin_mark = false;
  ck_assert(!td__admission_invite_use(a, pub, &admin_mark)); /* no handshake yet */
  ck_assert_int_eq(td__admission_invite_handshake(a, pub), TD__INVITE_OK);
  ck_assert_int_eq(td__admission_invite_handshake(a, pub), TD__INVITE_USED);
  ck_assert(td__admission_invite_use(a, pub, &admin_mark));
  ck_assert(admin_mark);
  ck_assert(!td__admission_invite_use(a, pub, &admin_mark));
  ck_assert_int_eq(td__admission_invite_handshake(a, pub), TD__INVITE_USED);
  td__admission_stats_t st;
  td__admission_stats(a, &st);
  ck_assert_uint_eq(st.invites_used, 1);
  ck_assert_uint_eq(st.invites_refused_used, 2);
  ck_assert_uint_eq(st.invites_pending, 0);
  /* the table is bounded: TD__INVITES_MAX pending, then a refusal */
  for (int i = 0; i < TD__INVITES_MAX - 1; i++)
    ck_assert_int_eq(td__admission_invite(a, false, 60, secret, pub, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_invite(a, false, 60, secret, pub, why, sizeof why), 0);
  ck_assert_int_eq(td__admission_invite(a, false, 60, secret, pub, why, sizeof why), TD_ERANGE);
  ck_assert_ptr_nonnull(strstr(why, "pending already"));
  td__admission_close(&a);
}
END_TEST

START_TEST(join_strings_are_shell_safe_and_checked) {
  uint8_t inviter[TD_KEY_BYTES], sign[TD__SIGN_KEY_BYTES], secret[TD_KEY_BYTES];
  randombytes_buf(inviter, sizeof inviter);
  randombytes_buf(sign, sizeof sign);
  randombytes_buf(secret, sizeof secret);
  const char *endpoints[] = {"tcp://10.0.0.11:7070", "tcp://[::1]:7070", "tcp://node-3.lan:1"};
  for (size_t e = 0; e < 3; e++) {
    char s[TD__JOIN_STRING_MAX], ep[256], why[256];
    uint8_t i2[TD_KEY_BYTES], s2[TD__SIGN_KEY_BYTES], x2[TD_KEY_BYTES];
    td__join_string_format(s, endpoints[e], inviter, sign, secret);
    ck_assert_uint_eq(strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789,.:/_-"), strlen(s));
    ck_assert_int_eq(td__join_string_parse(s, ep, sizeof ep, i2, s2, x2, why, sizeof why), 0);
    ck_assert_str_eq(ep, endpoints[e]);
    ck_assert_mem_eq(i2, inviter, sizeof i2);
    ck_assert_mem_eq(s2, sign, sizeof s2);
    ck_assert_mem_eq(x2, secret, sizeof x2);
    s[strlen(s) - 1] = '\0'; /* cut short */
    ck_assert_int_eq(td__join_string_parse(s, ep, sizeof ep, i2, s2, x2, why, sizeof why),
                     TD_ECONFIG);
    ck_assert_ptr_nonnull(strstr(why, "not a join string"));
  }
  char ep[256], why[256];
  uint8_t k[TD_KEY_BYTES];
  ck_assert_int_eq(td__join_string_parse("tcp://1.2.3.4:5", ep, sizeof ep, k, k, k, why,
                                         sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td__join_string_parse(NULL, ep, sizeof ep, k, k, k, why, sizeof why),
                   TD_ECONFIG);
}
END_TEST

int main(void) {
  Suite *s = suite_create("admission");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, records_verify_only_with_their_signers_key);
  tcase_add_test(tc, store_keeps_the_newest_and_calls_older_a_replay);
  tcase_add_test(tc, an_invite_is_good_for_one_handshake_and_one_request);
  tcase_add_test(tc, join_strings_are_shell_safe_and_checked);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
