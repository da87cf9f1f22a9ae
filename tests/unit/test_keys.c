/* test_keys.c: the node key file and the allowlist (daemon/net/keys.h), fed
 * hostile input. A key pair is made once and read back the same; a key file
 * others may read, a mismatched pair, a wrong length, characters outside Z85
 * and a truncated file are refused with a reason; the allowlist takes keys,
 * comments (Z85 has '#'), `admin` marks, and refuses bad keys with file:line,
 * unknown words, a world-writable file and too many entries; add, remove and
 * save round-trip; node ids are derived from keys. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/net/keys.h"

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/td-keys-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void write_text(const char *name, const char *text, mode_t mode) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  fchmod(fd, mode);
  close(fd);
}

START_TEST(decode_refuses_bad_keys) {
  char pub[41], secret[41], why[160];
  uint8_t raw[TD_KEY_BYTES], back[TD_KEY_BYTES];
  ck_assert_int_eq(zmq_curve_keypair(pub, secret), 0);
  ck_assert_int_eq(td_key_decode(pub, raw, why, sizeof why), 0);
  zmq_z85_decode(back, pub);
  ck_assert_mem_eq(raw, back, TD_KEY_BYTES);
  char shorter[41];
  snprintf(shorter, sizeof shorter, "%.39s", pub);
  ck_assert_int_eq(td_key_decode(shorter, raw, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "got 39"));
  char longer[64];
  snprintf(longer, sizeof longer, "%sAB", pub);
  ck_assert_int_eq(td_key_decode(longer, raw, why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_key_decode("", raw, why, sizeof why), TD_ECONFIG);
  char bad[41];
  memcpy(bad, pub, sizeof bad);
  bad[7] = ' '; /* not in the Z85 alphabet */
  ck_assert_int_eq(td_key_decode(bad, raw, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "outside Z85 at 8"));
  bad[7] = '\x7f';
  ck_assert_int_eq(td_key_decode(bad, raw, why, sizeof why), TD_ECONFIG);
  bad[7] = '"';
  ck_assert_int_eq(td_key_decode(bad, raw, why, sizeof why), TD_ECONFIG);
  /* node ids: the first 8 bytes, big-endian, never 0 */
  uint8_t zero[TD_KEY_BYTES] = {0}, k[TD_KEY_BYTES] = {0x01, 0x02, 0, 0, 0, 0, 0, 0x03};
  ck_assert_uint_eq(td_key_node_id(zero), 1);
  ck_assert_uint_eq(td_key_node_id(k), 0x0102000000000003ull);
}
END_TEST

START_TEST(key_pair_is_made_once_and_checked) {
  make_dir();
  td_keypair_t a, b;
  char why[256], path[128];
  ck_assert_int_eq(td_keypair_load_or_create(dir, &a, why, sizeof why), 0);
  snprintf(path, sizeof path, "%s/" TD_KEY_FILE, dir);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), 0);
  ck_assert_str_eq(a.pub, b.pub);
  ck_assert_str_eq(a.secret, b.secret);
  ck_assert_mem_eq(a.pub_raw, b.pub_raw, TD_KEY_BYTES);
  /* a secret others may read is refused, not used */
  chmod(path, 0644);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "mode 644"));
  chmod(path, 0600);
  /* a public key that is not the secret key's */
  char pub2[41], sec2[41], text[256];
  zmq_curve_keypair(pub2, sec2);
  snprintf(text, sizeof text, "public %s\nsecret %s\n", pub2, a.secret);
  write_text(TD_KEY_FILE, text, 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "does not belong"));
  /* truncated, bad z85, unknown line, missing line */
  snprintf(text, sizeof text, "public %s\nsecret %.20s\n", a.pub, a.secret);
  write_text(TD_KEY_FILE, text, 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":2: a key is 40"));
  snprintf(text, sizeof text, "public %s\nsecret %.39s~\n", a.pub, a.secret);
  write_text(TD_KEY_FILE, text, 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  write_text(TD_KEY_FILE, "hello world\n", 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  snprintf(text, sizeof text, "public %s\n", a.pub);
  write_text(TD_KEY_FILE, text, 0600);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "needs a 'public' and a 'secret'"));
  /* not a regular file */
  unlink(path);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  ck_assert_int_eq(td_keypair_load_or_create(dir, &b, why, sizeof why), TD_ECONFIG);
  remove_dir();
}
END_TEST

START_TEST(allowlist_parses_and_refuses) {
  make_dir();
  char k1[41], k2[41], s[41], text[1024], why[256], path[128];
  zmq_curve_keypair(k1, s);
  zmq_curve_keypair(k2, s);
  snprintf(path, sizeof path, "%s/" TD_ALLOWLIST_FILE, dir);
  td_allowlist_t *al = NULL;
  /* missing: empty */
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), 0);
  ck_assert_uint_eq(td_allowlist_count(al), 0);
  td_allowlist_close(&al);
  ck_assert_ptr_null(al);
  /* comments, blank lines, admin marks, a trailing comment */
  snprintf(text, sizeof text, "# the cluster\n\n  %s admin # the operator's node\n%s\n#\n", k1,
           k2);
  write_text(TD_ALLOWLIST_FILE, text, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), 0);
  ck_assert_uint_eq(td_allowlist_count(al), 2);
  const td_allowed_key_t *e = td_allowlist_find_z85(al, k1);
  ck_assert_ptr_nonnull(e);
  ck_assert(e->admin);
  ck_assert(!td_allowlist_find_z85(al, k2)->admin);
  ck_assert_ptr_eq(td_allowlist_find_id(al, e->node_id), e);
  ck_assert_ptr_eq(td_allowlist_find_raw(al, e->raw), e);
  /* remove, add, save, load back */
  ck_assert_int_eq(td_allowlist_remove(al, k1), 0);
  ck_assert_int_eq(td_allowlist_remove(al, k1), TD_ENOENT);
  ck_assert_int_eq(td_allowlist_add(al, k1, false, why, sizeof why), 0);
  ck_assert_int_eq(td_allowlist_add(al, k2, true, why, sizeof why), 0); /* re-mark */
  ck_assert_int_eq(td_allowlist_add(al, "short", true, why, sizeof why), TD_ECONFIG);
  ck_assert_uint_eq(td_allowlist_count(al), 2);
  ck_assert_int_eq(td_allowlist_save(al, why, sizeof why), 0);
  td_allowlist_close(&al);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), 0);
  ck_assert_uint_eq(td_allowlist_count(al), 2);
  ck_assert(!td_allowlist_find_z85(al, k1)->admin);
  ck_assert(td_allowlist_find_z85(al, k2)->admin);
  td_allowlist_close(&al);
  /* a key starting with '#' is a key, not a comment */
  char hashkey[41];
  do
    zmq_curve_keypair(hashkey, s);
  while (strchr(hashkey, '#') == NULL);
  snprintf(text, sizeof text, "%s\n", hashkey);
  write_text(TD_ALLOWLIST_FILE, text, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), 0);
  ck_assert_ptr_nonnull(td_allowlist_find_z85(al, hashkey));
  td_allowlist_close(&al);
  /* hostile lines: a bad key names file:line, an unknown word, wrong length */
  snprintf(text, sizeof text, "%s\n%.30s\n", k1, k2);
  write_text(TD_ALLOWLIST_FILE, text, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_null(al);
  ck_assert_ptr_nonnull(strstr(why, "allowed_keys:2: a key is 40 Z85 characters, got 30"));
  write_text(TD_ALLOWLIST_FILE, "garbage line\n", 0600); /* the key is judged first */
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":1: a key is 40 Z85 characters, got 7"));
  snprintf(text, sizeof text, "%s root\n", k1);
  write_text(TD_ALLOWLIST_FILE, text, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, ":1: unknown word 'root'"));
  snprintf(text, sizeof text, "%.39s\x01\n", k1);
  write_text(TD_ALLOWLIST_FILE, text, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  /* others may write it: refused */
  snprintf(text, sizeof text, "%s\n", k1);
  write_text(TD_ALLOWLIST_FILE, text, 0666);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "mode 666"));
  /* a line longer than any valid one */
  char *huge = malloc(4096);
  memset(huge, 'a', 4095);
  huge[4095] = '\0';
  write_text(TD_ALLOWLIST_FILE, huge, 0600);
  free(huge);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "line longer"));
  /* more entries than the limit */
  FILE *f = fopen(path, "w");
  for (int i = 0; i < TD_ALLOWLIST_MAX + 1; i++) {
    char p[41];
    zmq_curve_keypair(p, s);
    fprintf(f, "%s\n", p);
  }
  fclose(f);
  chmod(path, 0600);
  ck_assert_int_eq(td_allowlist_load(&al, path, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "at most"));
  remove_dir();
}
END_TEST

int main(void) {
  Suite *s = suite_create("keys");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, decode_refuses_bad_keys);
  tcase_add_test(tc, key_pair_is_made_once_and_checked);
  tcase_add_test(tc, allowlist_parses_and_refuses);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
