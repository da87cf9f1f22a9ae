/* test_text.c: byte-level text datasets: specs, the held-out split, the
 * fortunes concatenation, training windows, partitions and bad input.
 *
 * Paths that would block a careless reader (a FIFO, /dev/zero) are opened in a
 * child process under alarm(), so a regression fails the test instead of
 * hanging `make check`. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/text.h"

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/td-text-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

/* tmpdir/name holding len bytes: byte i is pattern(i). */
static const char *write_file(const char *name, size_t len, unsigned salt) {
  static char path[8][256];
  static int next;
  char *p = path[next++ % 8];
  snprintf(p, 256, "%s/%s", tmpdir, name);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  for (size_t i = 0; i < len; i++)
    fputc((int)((i * 7 + salt) % 251), f);
  fclose(f);
  return p;
}

START_TEST(a_file_splits_into_train_and_the_last_tenth) {
  make_tmpdir();
  const char *path = write_file("corpus.txt", 1000, 0);
  char spec[300], why[512] = "";
  snprintf(spec, sizeof spec, "text:%s", path);
  ck_assert(td_text_is_spec(spec));
  td_text_t *train = NULL, *valid = NULL;
  ck_assert_msg(td_text_open(&train, &valid, spec, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_text_bytes(train), 900);
  ck_assert_uint_eq(td_text_bytes(valid), 100);
  for (size_t i = 0; i < 900; i++)
    ck_assert_uint_eq(td_text_data(train)[i], (i * 7) % 251);
  for (size_t i = 0; i < 100; i++)
    ck_assert_uint_eq(td_text_data(valid)[i], ((900 + i) * 7) % 251);
  td_text_close(&train);
  td_text_close(&valid);
  td_text_close(&valid); /* idempotent */

  /* with a validation file, nothing is held out of the training text */
  const char *vpath = write_file("valid.txt", 77, 3);
  snprintf(spec, sizeof spec, "text:%s,%s", path, vpath);
  ck_assert_msg(td_text_open(&train, &valid, spec, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_text_bytes(train), 1000);
  ck_assert_uint_eq(td_text_bytes(valid), 77);
  ck_assert_uint_eq(td_text_data(valid)[0], 3);
  td_text_close(&train);
  td_text_close(&valid);
  remove_tmpdir();
}
END_TEST

/* text:fortunes reads the dotless regular files of TRAIND_FORTUNES_DIR in
 * sorted name order, skipping .dat indexes, .u8 links and subdirectories. */
START_TEST(fortunes_concatenates_the_plain_files_in_name_order) {
  make_tmpdir();
  char p[512];
  write_file("zebra", 30, 1);
  write_file("apple", 70, 2);
  write_file("apple.dat", 500, 9);
  snprintf(p, sizeof p, "%s/apple.u8", tmpdir);
  ck_assert_int_eq(symlink("apple", p), 0);
  snprintf(p, sizeof p, "%s/off", tmpdir);
  ck_assert_int_eq(mkdir(p, 0755), 0);
  setenv("TRAIND_FORTUNES_DIR", tmpdir, 1);
  td_text_t *train = NULL, *valid = NULL;
  char why[512] = "";
  ck_assert_msg(td_text_open(&train, &valid, "text:fortunes", why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_text_bytes(train) + td_text_bytes(valid), 100);
  ck_assert_uint_eq(td_text_bytes(valid), 10);
  ck_assert_uint_eq(td_text_data(train)[0], 2);          /* apple first */
  ck_assert_uint_eq(td_text_data(train)[70], 1);         /* then zebra */
  ck_assert_uint_eq(td_text_data(valid)[9], (29 * 7 + 1) % 251); /* zebra's last byte */
  td_text_close(&train);
  td_text_close(&valid);

  /* no such directory: the Debian package is named */
  snprintf(p, sizeof p, "%s/nowhere", tmpdir);
  setenv("TRAIND_FORTUNES_DIR", p, 1);
  ck_assert_int_eq(td_text_open(&train, &valid, "text:fortunes", why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "apt-get install fortunes"));
  ck_assert_ptr_null(strchr(why, '\n'));
  unsetenv("TRAIND_FORTUNES_DIR");
  remove_tmpdir();
}
END_TEST

/* The real package (in TD_PACKAGES): about 2.6 MB of text. */
START_TEST(debian_fortunes_package_is_about_2_6_mb) {
  td_text_t *train = NULL, *valid = NULL;
  char why[512] = "";
  unsetenv("TRAIND_FORTUNES_DIR");
  ck_assert_msg(td_text_open(&train, &valid, TD_TEXT_DEFAULT_SPEC, why, sizeof why) == 0, "%s",
                why);
  size_t all = td_text_bytes(train) + td_text_bytes(valid);
  ck_assert_msg(all > 2000000 && all < 3500000, "%zu bytes", all);
  ck_assert_uint_eq(td_text_bytes(valid), all / 10);
  td_text_close(&train);
  td_text_close(&valid);
}
END_TEST

START_TEST(windows_are_shifted_by_one_and_inside_the_text) {
  enum { BYTES = 40, CONTEXT = 8, ROWS = 400 };
  uint8_t data[BYTES];
  for (int i = 0; i < BYTES; i++)
    data[i] = (uint8_t)(i + 100);
  static int32_t tok[ROWS * CONTEXT], tgt[ROWS * CONTEXT];
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  td_text_windows(data, BYTES, CONTEXT, ROWS, &rng, tok, tgt);
  int seen[BYTES] = {0};
  for (int r = 0; r < ROWS; r++) {
    int o = tok[r * CONTEXT] - 100;
    ck_assert(o >= 0 && o <= BYTES - CONTEXT - 1);
    seen[o]++;
    for (int t = 0; t < CONTEXT; t++) {
      ck_assert_int_eq(tok[r * CONTEXT + t], data[o + t]);
      ck_assert_int_eq(tgt[r * CONTEXT + t], data[o + t + 1]);
    }
  }
  for (int o = 0; o <= BYTES - CONTEXT - 1; o++) /* 32 offsets, 400 draws: all hit */
    ck_assert_msg(seen[o] > 0, "offset %d never drawn", o);

  /* exactly one window: offset 0 only; the same seed draws the same windows */
  td_rng_seed(&rng, 2);
  td_text_windows(data, CONTEXT + 1, CONTEXT, 3, &rng, tok, tgt);
  for (int r = 0; r < 3; r++)
    ck_assert_int_eq(tgt[r * CONTEXT + CONTEXT - 1], data[CONTEXT]);
  static int32_t tok2[ROWS * CONTEXT], tgt2[ROWS * CONTEXT];
  td_rng_seed(&rng, 1);
  td_text_windows(data, BYTES, CONTEXT, ROWS, &rng, tok2, tgt2);
  td_rng_seed(&rng, 1);
  td_text_windows(data, BYTES, CONTEXT, ROWS, &rng, tok, tgt);
  ck_assert_int_eq(memcmp(tok, tok2, sizeof tok), 0);
}
END_TEST

static td_text_t *counting_text(size_t n) {
  uint8_t *b = malloc(n);
  for (size_t i = 0; i < n; i++)
    b[i] = (uint8_t)(i % 256);
  td_text_t *t = NULL;
  ck_assert_int_eq(td_text_from_bytes(&t, b, n), 0);
  free(b);
  return t;
}

/* iid: blocks of TD_TEXT_IID_BLOCK bytes dealt by the seed, so a text sorted
 * by topic reaches every node from everywhere; disjoint, covering, equal. */
START_TEST(iid_partitions_deal_scattered_blocks_and_cover_the_text) {
  enum { NODES = 3, BLOCKS = 12 }; /* K = 4 blocks a node */
  size_t bytes = (size_t)BLOCKS * TD_TEXT_IID_BLOCK;
  uint8_t *b = malloc(bytes);
  for (size_t i = 0; i < bytes; i++)
    b[i] = (uint8_t)(i / TD_TEXT_IID_BLOCK); /* the byte names its block */
  td_text_t *src = NULL;
  ck_assert_int_eq(td_text_from_bytes(&src, b, bytes), 0);
  free(b);
  td_partition_t p;
  char why[256] = "";
  ck_assert_int_eq(td_partition_parse(&p, "iid", why, sizeof why), 0);
  int owner[BLOCKS];
  for (int i = 0; i < BLOCKS; i++)
    owner[i] = -1;
  int outside = 0; /* blocks a contiguous cut would have given another node */
  for (unsigned k = 0; k < NODES; k++) {
    td_text_t *part = NULL;
    ck_assert_int_eq(td_text_partition(&part, src, &p, k, NODES, 42, why, sizeof why), 0);
    ck_assert_uint_eq(td_text_bytes(part), 4 * TD_TEXT_IID_BLOCK);
    const uint8_t *d = td_text_data(part);
    for (size_t j = 0; j < td_text_bytes(part); j++)
      ck_assert_uint_eq(d[j], d[j / TD_TEXT_IID_BLOCK * TD_TEXT_IID_BLOCK]); /* whole blocks */
    for (int h = 0; h < 4; h++) {
      uint8_t blk = d[(size_t)h * TD_TEXT_IID_BLOCK];
      ck_assert_int_eq(owner[blk], -1); /* disjoint */
      owner[blk] = (int)k;
      if (blk / 4 != k)
        outside++;
      if (h > 0)
        ck_assert(blk > d[(size_t)(h - 1) * TD_TEXT_IID_BLOCK]); /* in text order */
    }
    td_text_close(&part);
  }
  for (int i = 0; i < BLOCKS; i++)
    ck_assert_int_ge(owner[i], 0); /* covered */
  ck_assert_msg(outside > 0, "the iid deal gave every node its own contiguous third");
  td_text_close(&src);

  /* a text shorter than N blocks: one near-equal block per node, covering it */
  src = counting_text(1000);
  size_t total = 0;
  for (unsigned k = 0; k < NODES; k++) {
    td_text_t *part = NULL;
    ck_assert_int_eq(td_text_partition(&part, src, &p, k, NODES, 42, why, sizeof why), 0);
    size_t n = td_text_bytes(part);
    ck_assert(n == 333 || n == 334);
    total += n;
    td_text_close(&part);
  }
  ck_assert_uint_eq(total, 1000);
  td_text_close(&src);

  /* fewer bytes than nodes: a node would get nothing */
  src = counting_text(2);
  td_text_t *part = NULL;
  ck_assert_int_eq(td_text_partition(&part, src, &p, 0, 3, 1, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "no bytes"));
  td_text_close(&src);
}
END_TEST

/* shard:K: every node gets K whole shards, the shards of all nodes are
 * disjoint and cover the text, and the deal depends on the seed. */
START_TEST(shard_partitions_deal_k_contiguous_shards_per_node) {
  enum { BYTES = 1200, NODES = 3, K = 2 }; /* 6 shards of 200 bytes */
  uint8_t *b = malloc(BYTES);
  for (int i = 0; i < BYTES; i++)
    b[i] = (uint8_t)(i / 200); /* the byte names its shard */
  td_text_t *src = NULL;
  ck_assert_int_eq(td_text_from_bytes(&src, b, BYTES), 0);
  td_partition_t p;
  char why[256] = "";
  ck_assert_int_eq(td_partition_parse(&p, "shard:2", why, sizeof why), 0);
  int owner[6] = {-1, -1, -1, -1, -1, -1};
  char deal[2][8] = {"", ""};
  for (int s = 0; s < 2; s++)
    for (unsigned k = 0; k < NODES; k++) {
      td_text_t *part = NULL;
      ck_assert_int_eq(td_text_partition(&part, src, &p, k, NODES, 7 + (uint64_t)s, why,
                                         sizeof why),
                       0);
      ck_assert_uint_eq(td_text_bytes(part), 400);
      const uint8_t *d = td_text_data(part);
      ck_assert(d[0] < d[200]); /* in text order */
      for (int j = 0; j < 400; j++)
        ck_assert_uint_eq(d[j], d[j / 200 * 200]); /* whole shards */
      for (int h = 0; h < 2; h++) {
        if (s == 0) {
          ck_assert_int_eq(owner[d[h * 200]], -1); /* disjoint */
          owner[d[h * 200]] = (int)k;
        }
        deal[s][d[h * 200]] = (char)('0' + k);
      }
      td_text_close(&part);
    }
  for (int i = 0; i < 6; i++)
    ck_assert_int_ge(owner[i], 0); /* covered */
  ck_assert_msg(strcmp(deal[0], deal[1]) != 0, "seeds 7 and 8 dealt alike: %s", deal[0]);
  /* more shards than bytes cannot be cut */
  ck_assert_int_eq(td_partition_parse(&p, "shard:1000", why, sizeof why), 0);
  td_text_t *part = NULL;
  ck_assert_int_eq(td_text_partition(&part, src, &p, 0, NODES, 1, why, sizeof why), TD_ECONFIG);
  td_text_close(&src);
  free(b);
}
END_TEST

START_TEST(dirichlet_is_refused_for_text) {
  td_text_t *src = counting_text(100), *part = NULL;
  td_partition_t p;
  char why[256] = "";
  ck_assert_int_eq(td_partition_parse(&p, "dirichlet:0.5", why, sizeof why), 0);
  ck_assert_int_eq(td_text_partition(&part, src, &p, 0, 2, 1, why, sizeof why), TD_ECONFIG);
  ck_assert_ptr_nonnull(strstr(why, "text has no classes"));
  ck_assert_ptr_null(part);
  ck_assert_int_eq(td_partition_parse(&p, "all", why, sizeof why), 0);
  ck_assert_int_eq(td_text_partition(&part, src, &p, 1, 2, 1, why, sizeof why), 0);
  ck_assert_uint_eq(td_text_bytes(part), 100);
  td_text_close(&part);
  td_text_close(&src);
}
END_TEST

/* td_text_open in a child under alarm(): returns the code, or fails the test
 * when the child hangs or dies. why gets the child's message. */
static int open_in_child(const char *spec, char *why, size_t why_len) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGALRM, SIG_DFL); /* not an inherited handler: die on the alarm */
    alarm(5);
    td_text_t *train = NULL, *valid = NULL;
    char msg[512] = "";
    int rc = td_text_open(&train, &valid, spec, msg, sizeof msg);
    if (write(fds[1], &rc, sizeof rc) != sizeof rc || write(fds[1], msg, sizeof msg) < 0)
      _exit(2);
    _exit(0);
  }
  close(fds[1]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
                "opening %s hung (killed by alarm)", spec);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed for %s", spec);
  int rc = 0;
  char msg[512] = "";
  ck_assert_int_eq(read(fds[0], &rc, sizeof rc), sizeof rc);
  ck_assert_int_eq(read(fds[0], msg, sizeof msg), sizeof msg);
  close(fds[0]);
  snprintf(why, why_len, "%s", msg);
  return rc;
}

START_TEST(bad_text_files_give_one_line_errors_without_hanging) {
  make_tmpdir();
  char spec[512], why[512], path[300];
  struct {
    const char *name; /* created in tmpdir: "missing", "empty", "fifo", "dir", or a path */
    int rc;
    const char *says;
  } cases[] = {
      {"missing", TD_ENOENT, "No such file"},
      {"empty", TD_ECORRUPT, "empty file"},
      {"one-byte", TD_ECORRUPT, "too short to hold"},
      {"fifo", TD_EIO, "it is a FIFO"},
      {"dir", TD_EIO, "it is a directory"},
      {"/dev/zero", TD_EIO, "it is a character device"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].name[0] == '/')
      snprintf(path, sizeof path, "%s", cases[i].name);
    else
      snprintf(path, sizeof path, "%s/%s", tmpdir, cases[i].name);
    if (strcmp(cases[i].name, "empty") == 0)
      write_file("empty", 0, 0);
    if (strcmp(cases[i].name, "one-byte") == 0)
      write_file("one-byte", 1, 0);
    if (strcmp(cases[i].name, "fifo") == 0)
      ck_assert_int_eq(mkfifo(path, 0600), 0);
    if (strcmp(cases[i].name, "dir") == 0)
      ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(spec, sizeof spec, "text:%s", path);
    int rc = open_in_child(spec, why, sizeof why);
    ck_assert_msg(rc == cases[i].rc, "%s: rc %d (%s)", cases[i].name, rc, why);
    ck_assert_msg(strstr(why, cases[i].says) != NULL, "%s: %s", cases[i].name, why);
    ck_assert_msg(strstr(why, path) != NULL || strstr(why, spec) != NULL, "%s: %s",
                  cases[i].name, why);
    ck_assert_ptr_null(strchr(why, '\n'));
  }
  /* a validation path that blocks is refused the same way */
  const char *good = write_file("good", 100, 0);
  snprintf(spec, sizeof spec, "text:%s,%s/fifo", good, tmpdir);
  ck_assert_int_eq(open_in_child(spec, why, sizeof why), TD_EIO);
  /* bad specs */
  const char *bad_specs[] = {"text:", "text:a,", "text:,b", "text:a,b,c", "csv:x"};
  for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
    td_text_t *t = NULL, *v = NULL;
    ck_assert_int_eq(td_text_open(&t, &v, bad_specs[i], why, sizeof why), TD_ECONFIG);
    ck_assert_ptr_null(t);
    ck_assert_ptr_null(v);
  }
  remove_tmpdir();
}
END_TEST

START_TEST(a_text_shorter_than_one_window_is_refused) {
  td_text_t *t = counting_text(128);
  char why[256] = "";
  ck_assert_int_eq(td_text_check_window(t, 127, "training text", why, sizeof why), 0);
  ck_assert_int_eq(td_text_check_window(t, 128, "training text", why, sizeof why), TD_ECORRUPT);
  ck_assert_str_eq(why, "the training text has 128 bytes, shorter than one window of "
                        "context + 1 = 129 bytes");
  ck_assert_int_eq(td_text_check_window(t, 0, "training text", why, sizeof why), TD_ECONFIG);
  td_text_close(&t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("text");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, a_file_splits_into_train_and_the_last_tenth);
  tcase_add_test(tc, fortunes_concatenates_the_plain_files_in_name_order);
  tcase_add_test(tc, debian_fortunes_package_is_about_2_6_mb);
  tcase_add_test(tc, windows_are_shifted_by_one_and_inside_the_text);
  tcase_add_test(tc, iid_partitions_deal_scattered_blocks_and_cover_the_text);
  tcase_add_test(tc, shard_partitions_deal_k_contiguous_shards_per_node);
  tcase_add_test(tc, dirichlet_is_refused_for_text);
  tcase_add_test(tc, bad_text_files_give_one_line_errors_without_hanging);
  tcase_add_test(tc, a_text_shorter_than_one_window_is_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
