/* test_dataset.c: datasets (compute/dataset.h), as a reader would use them.
 *
 * IDX files are written byte by byte here (plain and gzip) and must read back
 * exactly; truncated, corrupt, hostile and mismatched files must be refused
 * with the right code and a reason, and a hostile header must be refused
 * before anything is allocated from it. CSV parsing, the `dataset` run key's
 * specs, statistics, subsets and shuffles must keep every row intact. Each
 * test gets its own temporary directory, removed afterwards. (The generator
 * is tested in test_rng.c, the partitions in test_partition.c.) */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "compute/data/dataset.h"
#include "common/error.h"
#include "compute/rng.h"

/* AddressSanitizer reserves terabytes of address space, so the address-space
 * limit that proves "refused before allocating" is only applied without it. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN 0
#endif

/* ---- per-test temporary directory ------------------------------------------------ */

static char tmp_dir[256];

static void make_tmp_dir(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "%s/td-test-data-XXXXXX",
           getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void remove_tmp_dir(void) {
  DIR *d = opendir(tmp_dir);
  if (d == NULL)
    return;
  struct dirent *e;
  char path[600];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
    if (unlink(path) != 0)
      rmdir(path); /* a test's subdirectory */
  }
  closedir(d);
  rmdir(tmp_dir);
}

/* A path inside the test's directory; eight rotating buffers so a test can
 * hold a handful of paths at once. */
static const char *tmp_file(const char *name) {
  static char slots[8][600];
  static int next;
  char *p = slots[next++ % 8];
  snprintf(p, sizeof slots[0], "%s/%s", tmp_dir, name);
  return p;
}

static void write_file(const char *path, const void *data, size_t len, int gzip) {
  if (gzip) {
    gzFile g = gzopen(path, "wb");
    ck_assert_ptr_nonnull(g);
    if (len > 0)
      ck_assert_int_eq(gzwrite(g, data, (unsigned)len), (int)len);
    ck_assert_int_eq(gzclose(g), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
  }
}

static void write_text(const char *path, const char *text) {
  write_file(path, text, strlen(text), 0);
}

static long file_size(const char *path) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return (long)st.st_size;
}

/* ---- building IDX files -------------------------------------------------------------- */

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* An IDX file in memory: 0 0 TYPE NDIMS, big-endian dims, then the payload.
 * Caller frees the result. */
static uint8_t *idx_file(uint8_t type, int ndims, const uint32_t *dims, const void *payload,
                         size_t payload_len, size_t *len) {
  *len = 4 + 4 * (size_t)ndims + payload_len;
  uint8_t *buf = malloc(*len);
  ck_assert_ptr_nonnull(buf);
  buf[0] = 0;
  buf[1] = 0;
  buf[2] = type;
  buf[3] = (uint8_t)ndims;
  for (int i = 0; i < ndims; i++)
    put_be32(buf + 4 + 4 * i, dims[i]);
  if (payload_len > 0)
    memcpy(buf + 4 + 4 * ndims, payload, payload_len);
  return buf;
}

/* n images of 3x2 ubyte pixels (every byte value occurs once n >= 43) and n
 * labels i % classes, written to img_path and lab_path. */
static void write_ubyte_idx(const char *img_path, const char *lab_path, uint32_t n, int classes,
                            int gzip) {
  uint8_t *pixels = malloc((size_t)n * 6), *labels = malloc(n);
  for (uint32_t i = 0; i < n * 6; i++)
    pixels[i] = (uint8_t)(i * 37 + 11);
  for (uint32_t i = 0; i < n; i++)
    labels[i] = (uint8_t)(i % (uint32_t)classes);
  size_t len;
  uint32_t img_dims[3] = {n, 3, 2}, lab_dims[1] = {n};
  uint8_t *file = idx_file(0x08, 3, img_dims, pixels, (size_t)n * 6, &len);
  write_file(img_path, file, len, gzip);
  free(file);
  file = idx_file(0x08, 1, lab_dims, labels, n, &len);
  write_file(lab_path, file, len, gzip);
  free(file);
  free(pixels);
  free(labels);
}

static float expected_pixel(size_t i) { return (float)(uint8_t)(i * 37 + 11) / 255.0f; }

/* rows x dim float32 features (seeded normals) and labels i % classes, as a
 * 2-dimensional float IDX file; the features are returned for comparison. */
static float *write_float_idx(const char *img_path, const char *lab_path, uint32_t rows,
                              uint32_t dim, int classes, uint64_t seed) {
  float *values = malloc((size_t)rows * dim * sizeof *values);
  uint8_t *payload = malloc((size_t)rows * dim * 4), *labels = malloc(rows);
  td_rng_t rng;
  td_rng_seed(&rng, seed);
  for (size_t i = 0; i < (size_t)rows * dim; i++) {
    values[i] = (float)td_rng_normal(&rng);
    uint32_t bits;
    memcpy(&bits, &values[i], 4);
    put_be32(payload + 4 * i, bits);
  }
  for (uint32_t i = 0; i < rows; i++)
    labels[i] = (uint8_t)(i % (uint32_t)classes);
  size_t len;
  uint32_t img_dims[2] = {rows, dim}, lab_dims[1] = {rows};
  uint8_t *file = idx_file(0x0D, 2, img_dims, payload, (size_t)rows * dim * 4, &len);
  write_file(img_path, file, len, 0);
  free(file);
  file = idx_file(0x08, 1, lab_dims, labels, rows, &len);
  write_file(lab_path, file, len, 0);
  free(file);
  free(payload);
  free(labels);
  return values;
}

static td_dataset_t *load_idx_ok(const char *img, const char *lab) {
  td_dataset_t *ds = NULL;
  char why[512] = "";
  int rc = td_dataset_load_idx(&ds, img, lab, why, sizeof why);
  ck_assert_msg(rc == 0, "load %s: %s (%s)", img, td_err_name(rc), why);
  ck_assert_ptr_nonnull(ds);
  return ds;
}

/* Expect a load to fail with `want`; returns the reason for further checks. */
static const char *load_idx_fails(const char *img, const char *lab, int want) {
  static char why[512];
  why[0] = '\0';
  td_dataset_t *ds = (td_dataset_t *)&why; /* must be reset to NULL on failure */
  int rc = td_dataset_load_idx(&ds, img, lab, why, sizeof why);
  ck_assert_msg(rc == want, "load %s: got %s, want %s (%s)", img, td_err_name(rc),
                td_err_name(want), why);
  ck_assert_ptr_null(ds);
  ck_assert_msg(why[0] != '\0', "no reason given for %s", td_err_name(rc));
  return why;
}

/* ---- IDX -------------------------------------------------------------------------------- */

START_TEST(idx_ubyte_round_trip_plain_and_gzip) {
  for (int gzip = 0; gzip <= 1; gzip++) {
    const char *img = tmp_file(gzip ? "img.gz" : "img.idx");
    const char *lab = tmp_file(gzip ? "lab.gz" : "lab.idx");
    write_ubyte_idx(img, lab, 100, 4, gzip);
    td_dataset_t *ds = load_idx_ok(img, lab);
    ck_assert_uint_eq(td_dataset_rows(ds), 100);
    ck_assert_uint_eq(td_dataset_dim(ds), 6); /* 3x2 items are flattened */
    ck_assert_int_eq(td_dataset_classes(ds), 4);
    const float *x = td_dataset_features_const(ds);
    for (size_t i = 0; i < 600; i++)
      if (x[i] != expected_pixel(i))
        ck_abort_msg("pixel %zu: %.9g, want %.9g", i, (double)x[i], (double)expected_pixel(i));
    for (size_t i = 0; i < 100; i++)
      if (td_dataset_labels_const(ds)[i] != (int32_t)(i % 4))
        ck_abort_msg("label %zu: %d", i, td_dataset_labels_const(ds)[i]);
    td_dataset_close(&ds);
    ck_assert_ptr_null(ds);
    td_dataset_close(&ds); /* idempotent */
  }
}
END_TEST

START_TEST(idx_float32_round_trip_and_any_rank_is_flattened) {
  const char *img = tmp_file("f.idx"), *lab = tmp_file("f-lab.idx");
  float *want = write_float_idx(img, lab, 40, 12, 5, 3);
  td_dataset_t *ds = load_idx_ok(img, lab);
  ck_assert_uint_eq(td_dataset_rows(ds), 40);
  ck_assert_uint_eq(td_dataset_dim(ds), 12);
  ck_assert_mem_eq(td_dataset_features(ds), want, 40 * 12 * sizeof(float));
  td_dataset_close(&ds);
  free(want);
  /* a rank-4 ubyte file: 5 items of 2x2x2 */
  uint8_t pixels[40], labels[5] = {0, 1, 2, 1, 0};
  for (int i = 0; i < 40; i++)
    pixels[i] = (uint8_t)(i * 6);
  uint32_t dims[4] = {5, 2, 2, 2}, lab_dims[1] = {5};
  size_t len;
  uint8_t *file = idx_file(0x08, 4, dims, pixels, sizeof pixels, &len);
  write_file(img, file, len, 1);
  free(file);
  file = idx_file(0x08, 1, lab_dims, labels, sizeof labels, &len);
  write_file(lab, file, len, 0);
  free(file);
  ds = load_idx_ok(img, lab);
  ck_assert_uint_eq(td_dataset_dim(ds), 8);
  ck_assert_float_eq(td_dataset_features(ds)[39], (float)(39 * 6) / 255.0f);
  ck_assert_int_eq(td_dataset_classes(ds), 3);
  td_dataset_close(&ds);
}
END_TEST

START_TEST(idx_truncated_or_overlong_data_is_corrupt) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 100, 4, 0);
  long full = file_size(img); /* 16-byte header + 600 bytes of pixels */
  ck_assert_int_eq(truncate(img, full - 5), 0);
  const char *why = load_idx_fails(img, lab, TD_ECORRUPT);
  ck_assert_msg(strstr(why, "truncated: expected 600 bytes of data, found 595") != NULL, "%s",
                why);
  ck_assert_ptr_nonnull(strstr(why, img));
  /* the same cut inside a valid gzip stream */
  uint8_t *raw = malloc((size_t)full);
  FILE *f = fopen(img, "rb");
  ck_assert_uint_eq(fread(raw, 1, (size_t)full - 5, f), (size_t)full - 5);
  fclose(f);
  const char *gz = tmp_file("short.gz");
  write_file(gz, raw, (size_t)full - 5, 1);
  why = load_idx_fails(gz, lab, TD_ECORRUPT);
  ck_assert_msg(strstr(why, "expected 600 bytes of data, found 595") != NULL, "%s", why);
  free(raw);
  /* a label file cut short, and an image file with bytes left over */
  write_ubyte_idx(img, lab, 100, 4, 0);
  ck_assert_int_eq(truncate(lab, file_size(lab) - 1), 0);
  why = load_idx_fails(img, lab, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "truncated"));
  write_ubyte_idx(img, lab, 100, 4, 0);
  f = fopen(img, "ab");
  fputs("extra", f);
  fclose(f);
  load_idx_fails(img, lab, TD_ECORRUPT);
  /* bytes left over inside a gzip stream are only seen by reading to the end */
  uint8_t *longer = malloc((size_t)full + 5);
  f = fopen(img, "rb");
  ck_assert_uint_eq(fread(longer, 1, (size_t)full + 5, f), (size_t)full + 5);
  fclose(f);
  gz = tmp_file("long.gz");
  write_file(gz, longer, (size_t)full + 5, 1);
  free(longer);
  why = load_idx_fails(gz, lab, TD_ECORRUPT);
  ck_assert_msg(strstr(why, "more data than") != NULL, "%s", why);
  /* a header cut inside its dimensions */
  ck_assert_int_eq(truncate(img, 9), 0);
  why = load_idx_fails(img, lab, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "truncated"));
}
END_TEST

START_TEST(idx_corrupt_gzip_is_refused_without_crashing) {
  /* incompressible pixels so the deflate stream is long */
  enum { ROWS = 2000, DIM = 32 };
  uint8_t *pixels = malloc(ROWS * DIM), labels[ROWS];
  td_rng_t rng;
  td_rng_seed(&rng, 12);
  for (int i = 0; i < ROWS * DIM; i++)
    pixels[i] = (uint8_t)td_rng_next(&rng);
  for (int i = 0; i < ROWS; i++)
    labels[i] = (uint8_t)(i % 10);
  uint32_t dims[2] = {ROWS, DIM}, lab_dims[1] = {ROWS};
  size_t img_len, lab_len;
  uint8_t *img_file = idx_file(0x08, 2, dims, pixels, ROWS * DIM, &img_len);
  uint8_t *lab_file = idx_file(0x08, 1, lab_dims, labels, ROWS, &lab_len);
  const char *img = tmp_file("img.gz"), *lab = tmp_file("lab.idx");
  write_file(lab, lab_file, lab_len, 0);
  write_file(img, img_file, img_len, 1);
  td_dataset_t *ds = load_idx_ok(img, lab); /* the intact file loads */
  td_dataset_close(&ds);
  long gz_len = file_size(img);
  /* overwrite ten bytes at several places inside the compressed body */
  for (int k = 1; k <= 7; k++) {
    write_file(img, img_file, img_len, 1);
    FILE *f = fopen(img, "r+b");
    ck_assert_int_eq(fseek(f, gz_len * k / 8, SEEK_SET), 0);
    fwrite("\xde\xad\xbe\xef\x00\xff\x55\xaa\x12\x34", 1, 10, f);
    fclose(f);
    char why[512] = "";
    int rc = td_dataset_load_idx(&ds, img, lab, why, sizeof why);
    ck_assert_msg(rc == TD_ECORRUPT || rc == TD_EIO, "flip at %d/8: %s", k, td_err_name(rc));
    ck_assert_ptr_null(ds);
    ck_assert_str_ne(why, "");
  }
  /* a stream cut in half */
  write_file(img, img_file, img_len, 1);
  ck_assert_int_eq(truncate(img, gz_len / 2), 0);
  load_idx_fails(img, lab, TD_ECORRUPT);
  free(pixels);
  free(img_file);
  free(lab_file);
}
END_TEST

START_TEST(idx_wrong_magic_or_type_is_corrupt) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 10, 2, 0);
  const char *bad = tmp_file("bad.idx");
  write_file(bad, "\x01\x02\x08\x03\0\0\0\x0a\0\0\0\x03\0\0\0\x02", 16, 0);
  const char *why = load_idx_fails(bad, lab, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "not an IDX file"));
  write_file(bad, "\0\0\x08\0", 4, 0); /* zero dimensions */
  load_idx_fails(bad, lab, TD_ECORRUPT);
  write_file(bad, "\0\0\x0b\x01\0\0\0\x01\0\x07", 10, 0); /* 0x0B: int16, unsupported */
  why = load_idx_fails(bad, lab, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "0x0b"));
  write_file(bad, "", 0, 0); /* empty */
  load_idx_fails(bad, lab, TD_ECORRUPT);
  /* labels must be idx1 ubyte: a 2-dimensional label file is refused */
  write_file(bad, "\0\0\x08\x02\0\0\0\x0a\0\0\0\x01\0\0\0\0\0\0\0\0\0\0", 22, 0);
  why = load_idx_fails(img, bad, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "idx1"));
}
END_TEST

/* Cap the address space near what the process uses now, so any large
 * allocation fails; returns 0 where that cannot be done (under ASan). */
static int limit_address_space(struct rlimit *saved) {
  if (TEST_UNDER_ASAN)
    return 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL)
    return 0;
  unsigned long pages = 0;
  int ok = fscanf(f, "%lu", &pages) == 1;
  fclose(f);
  if (!ok || getrlimit(RLIMIT_AS, saved) != 0)
    return 0;
  struct rlimit tight = *saved;
  tight.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)256 << 20);
  if (saved->rlim_max != RLIM_INFINITY && tight.rlim_cur > saved->rlim_max)
    return 0;
  return setrlimit(RLIMIT_AS, &tight) == 0;
}

START_TEST(idx_hostile_header_is_refused_before_allocating) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 10, 2, 0);
  const char *huge = tmp_file("huge.idx"), *huge_gz = tmp_file("huge.gz");
  /* 2^31 items of 2^31 values: beyond every limit */
  uint32_t dims[2] = {0x80000000u, 0x80000000u};
  size_t len;
  uint8_t *file = idx_file(0x08, 2, dims, NULL, 0, &len);
  write_file(huge, file, len, 0);
  free(file);
  /* within the limits (a million items of 1024 floats, 4 GiB) but the file
   * holds only the header: the bytes are counted before allocating */
  uint32_t big[2] = {1000000u, 1024u};
  file = idx_file(0x0D, 2, big, "\0\0\0\0", 4, &len);
  const char *lying = tmp_file("lying.idx");
  write_file(lying, file, len, 0);
  write_file(huge_gz, file, len, 1);
  free(file);
  /* with labels that match, so nothing but the byte count can stop it */
  uint8_t *labels = calloc(big[0], 1);
  const char *big_lab = tmp_file("big-lab.idx");
  file = idx_file(0x08, 1, big, labels, big[0], &len);
  write_file(big_lab, file, len, 0);
  free(file);
  free(labels);

  struct rlimit saved;
  int limited = limit_address_space(&saved);
  const char *why = load_idx_fails(huge, lab, TD_ECORRUPT);
  ck_assert_msg(strstr(why, "limits") != NULL, "%s", why);
  why = load_idx_fails(lying, big_lab, TD_ECORRUPT);
  ck_assert_msg(strstr(why, "truncated: expected 4096000000 bytes of data, found 4") != NULL,
                "%s", why);
  why = load_idx_fails(huge_gz, big_lab, TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "truncated"));
  if (limited) {
    /* the cap is real: a small dataset still loads, a 4 GiB malloc would not */
    void *volatile probe = malloc((size_t)4 << 30);
    ck_assert_ptr_null(probe);
    free(probe);
    td_dataset_t *ds = load_idx_ok(img, lab);
    td_dataset_close(&ds);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &saved), 0);
  }
}
END_TEST

START_TEST(idx_image_and_label_counts_must_agree) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  const char *lab99 = tmp_file("lab99.idx");
  write_ubyte_idx(img, lab, 100, 4, 0);
  write_ubyte_idx(tmp_file("other.idx"), lab99, 99, 4, 0);
  const char *why = load_idx_fails(img, lab99, TD_ESHAPE);
  ck_assert_ptr_nonnull(strstr(why, "100"));
  ck_assert_ptr_nonnull(strstr(why, "99"));
}
END_TEST

START_TEST(idx_missing_file_is_enoent_naming_the_path) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 10, 2, 0);
  const char *missing = tmp_file("no-such-images.idx");
  const char *why = load_idx_fails(missing, lab, TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, missing));
  missing = tmp_file("no-such-labels.idx");
  why = load_idx_fails(img, missing, TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, missing));
}
END_TEST

/* td_dataset_open(spec) in a child under alarm(): a loader that blocks on a
 * FIFO or reads /dev/zero forever fails the test instead of hanging it.
 * Returns the code; why gets the child's one-line reason. */
static int open_in_child(const char *spec, char *why, size_t why_len) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGALRM, SIG_DFL); /* not an inherited handler: die on the alarm */
    alarm(5);
    td_dataset_t *train = NULL, *test = NULL;
    char msg[512] = "";
    int rc = td_dataset_open(&train, &test, spec, msg, sizeof msg);
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

/* A dataset path that blocks (a FIFO with no writer), never ends (/dev/zero)
 * or is no file (a directory) is refused at once, naming the path and what it
 * is: the compute thread that loads data must always get back to see a stop. */
START_TEST(special_paths_are_refused_at_once_naming_what_they_are) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 10, 2, 0);
  const char *csv = tmp_file("ok.csv");
  write_text(csv, "0,1\n1,2\n");
  const char *fifo = tmp_file("fifo"), *dir = tmp_file("dir");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  struct {
    const char *bad, *says;
  } paths[] = {{fifo, "it is a FIFO"},
               {"/dev/zero", "it is a character device"},
               {dir, "it is a directory"}};
  char spec[2048], why[512];
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    /* as the images, as the labels, as a CSV training file, as a CSV test file */
    for (int f = 0; f < 4; f++) {
      if (f == 0)
        snprintf(spec, sizeof spec, "idx:%s,%s", paths[i].bad, lab);
      else if (f == 1)
        snprintf(spec, sizeof spec, "idx:%s,%s", img, paths[i].bad);
      else if (f == 2)
        snprintf(spec, sizeof spec, "csv:%s", paths[i].bad);
      else
        snprintf(spec, sizeof spec, "csv:%s,%s", csv, paths[i].bad);
      int rc = open_in_child(spec, why, sizeof why);
      ck_assert_msg(rc == TD_EIO, "%s: %s (%s)", spec, td_err_name(rc), why);
      ck_assert_msg(strstr(why, paths[i].says) != NULL && strstr(why, paths[i].bad) != NULL,
                    "%s: %s", spec, why);
      ck_assert_ptr_null(strchr(why, '\n'));
    }
  }
}
END_TEST

/* ---- CSV -------------------------------------------------------------------------------- */

static td_dataset_t *load_csv_ok(const char *text) {
  const char *path = tmp_file("data.csv");
  write_text(path, text);
  td_dataset_t *ds = NULL;
  char why[512] = "";
  int rc = td_dataset_load_csv(&ds, path, why, sizeof why);
  ck_assert_msg(rc == 0, "%s: %s", td_err_name(rc), why);
  return ds;
}

static const char *load_csv_fails(const char *text) {
  static char why[512];
  const char *path = tmp_file("bad.csv");
  write_text(path, text);
  td_dataset_t *ds = NULL;
  why[0] = '\0';
  int rc = td_dataset_load_csv(&ds, path, why, sizeof why);
  ck_assert_msg(rc == TD_ECORRUPT, "'%s': got %s (%s)", text, td_err_name(rc), why);
  ck_assert_ptr_null(ds);
  ck_assert_msg(why[0] != '\0', "'%s': no reason given", text);
  return why;
}

START_TEST(csv_reads_label_first_rows_after_a_header) {
  td_dataset_t *ds = load_csv_ok("label,a,b\r\n1,0.5,2\r\n0, -1 ,3.25\n\n2,4,5e-1\n");
  ck_assert_uint_eq(td_dataset_rows(ds), 3);
  ck_assert_uint_eq(td_dataset_dim(ds), 2);
  ck_assert_int_eq(td_dataset_classes(ds), 3);
  static const float want_x[6] = {0.5f, 2, -1, 3.25f, 4, 0.5f};
  static const int32_t want_y[3] = {1, 0, 2};
  ck_assert_mem_eq(td_dataset_features(ds), want_x, sizeof want_x);
  ck_assert_mem_eq(td_dataset_labels(ds), want_y, sizeof want_y);
  td_dataset_close(&ds);
  /* without a header the first line is data */
  ds = load_csv_ok("3,1\n0,2\n");
  ck_assert_uint_eq(td_dataset_rows(ds), 2);
  ck_assert_int_eq(td_dataset_classes(ds), 4);
  td_dataset_close(&ds);
}
END_TEST

START_TEST(csv_ragged_row_is_corrupt_naming_the_line) {
  const char *why = load_csv_fails("1,2,3\n0,1,2\n4,5\n");
  ck_assert_msg(strstr(why, ":3:") != NULL, "%s", why);
  /* a header narrower than the data must not confuse the column count */
  td_dataset_t *ds = load_csv_ok("y\n1,2,3,4,5,6,7,8\n0,1,2,3,4,5,6,7\n");
  ck_assert_uint_eq(td_dataset_dim(ds), 7);
  td_dataset_close(&ds);
  why = load_csv_fails("y\n1,2,3,4,5,6,7,8\n0,1,2\n");
  ck_assert_msg(strstr(why, ":3:") != NULL, "%s", why);
}
END_TEST

START_TEST(csv_bad_values_are_corrupt) {
  static const char *bad[] = {
      "",                  /* empty file */
      "\n\n",              /* only blank lines */
      "label,x\n",         /* header only */
      "1,nan\n",           /* NaN feature */
      "1,2\n0,inf\n",      /* Inf feature */
      "1,1e999\n",         /* overflow is Inf */
      "-1,2\n",            /* negative label */
      "1.5,2\n",           /* fractional label */
      "65536,2\n",         /* label beyond TD_DATASET_MAX_CLASSES */
      "1,2\n0,x\n",        /* a word after data has started */
      "0,1,2\n1,2,\n",     /* empty last field */
      "1\n",               /* a label and no features */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    load_csv_fails(bad[i]);
  const char *why = load_csv_fails("1,2\n0,3\n1,nan\n");
  ck_assert_msg(strstr(why, ":3:") != NULL, "%s", why);
}
END_TEST

START_TEST(csv_missing_file_is_enoent) {
  td_dataset_t *ds = NULL;
  char why[512] = "";
  const char *path = tmp_file("absent.csv");
  ck_assert_int_eq(td_dataset_load_csv(&ds, path, why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, path));
}
END_TEST

/* ---- the `dataset` run key -------------------------------------------------------------- */

START_TEST(open_fashion_mnist_without_the_package_names_it) {
  setenv("TRAIND_FASHION_MNIST_DIR", tmp_dir, 1);
  td_dataset_t *train = NULL, *test = NULL;
  char why[1024] = "";
  int rc = td_dataset_open(&train, &test, "fashion-mnist", why, sizeof why);
  unsetenv("TRAIND_FASHION_MNIST_DIR");
  ck_assert_int_eq(rc, TD_ENOENT);
  ck_assert_ptr_null(train);
  ck_assert_ptr_null(test);
  ck_assert_msg(strstr(why, "dataset-fashion-mnist") != NULL, "%s", why);
  ck_assert_msg(strstr(why, "apt-get install") != NULL, "%s", why);
  ck_assert_msg(strstr(why, tmp_dir) != NULL, "%s", why);
}
END_TEST

START_TEST(open_idx_with_a_test_set_shares_one_label_space) {
  const char *tr_img = tmp_file("tr-img.idx"), *tr_lab = tmp_file("tr-lab.idx");
  const char *te_img = tmp_file("te-img.gz"), *te_lab = tmp_file("te-lab.gz");
  write_ubyte_idx(tr_img, tr_lab, 50, 4, 0); /* labels 0..3 */
  write_ubyte_idx(te_img, te_lab, 20, 6, 1); /* labels 0..5 */
  char spec[2600], why[512] = "";
  snprintf(spec, sizeof spec, "idx:%s,%s,%s,%s", tr_img, tr_lab, te_img, te_lab);
  td_dataset_t *train = NULL, *test = NULL;
  ck_assert_msg(td_dataset_open(&train, &test, spec, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 50);
  ck_assert_uint_eq(td_dataset_rows(test), 20);
  ck_assert_int_eq(td_dataset_classes(train), 6);
  ck_assert_int_eq(td_dataset_classes(test), 6);
  td_dataset_close(&train);
  td_dataset_close(&test);
  /* without a test set, *test is NULL */
  snprintf(spec, sizeof spec, "idx:%s,%s", tr_img, tr_lab);
  ck_assert_int_eq(td_dataset_open(&train, &test, spec, why, sizeof why), 0);
  ck_assert_ptr_nonnull(train);
  ck_assert_ptr_null(test);
  td_dataset_close(&train);
  /* a test set whose rows are a different width is a shape error */
  float *v = write_float_idx(te_img, te_lab, 10, 7, 2, 1);
  free(v);
  snprintf(spec, sizeof spec, "idx:%s,%s,%s,%s", tr_img, tr_lab, te_img, te_lab);
  ck_assert_int_eq(td_dataset_open(&train, &test, spec, why, sizeof why), TD_ESHAPE);
  ck_assert_ptr_null(train);
  ck_assert_ptr_null(test);
}
END_TEST

START_TEST(open_csv_train_and_test) {
  const char *tr = tmp_file("train.csv"), *te = tmp_file("test.csv");
  write_text(tr, "0,1,2\n1,3,4\n");
  write_text(te, "y,a,b\n2,5,6\n");
  char spec[1300], why[512] = "";
  snprintf(spec, sizeof spec, "csv:%s,%s", tr, te);
  td_dataset_t *train = NULL, *test = NULL;
  ck_assert_msg(td_dataset_open(&train, &test, spec, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 2);
  ck_assert_uint_eq(td_dataset_rows(test), 1);
  ck_assert_int_eq(td_dataset_classes(train), 3);
  td_dataset_close(&train);
  td_dataset_close(&test);
  write_text(te, "1,5\n");
  ck_assert_int_eq(td_dataset_open(&train, &test, spec, why, sizeof why), TD_ESHAPE);
}
END_TEST

START_TEST(open_rejects_malformed_specs) {
  static const char *bad[] = {"",      "bogus",     "idx:a",     "idx:a,b,c", "idx:a,,c,d",
                              "csv:",  "csv:a,b,c", "mnist",     "idx:a,b,c,d,e"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    td_dataset_t *train = NULL, *test = NULL;
    char why[512] = "";
    ck_assert_msg(td_dataset_open(&train, &test, bad[i], why, sizeof why) == TD_ECONFIG, "'%s'",
                  bad[i]);
    ck_assert_ptr_null(train);
    ck_assert_str_ne(why, "");
  }
  td_dataset_t *train = NULL, *test = NULL;
  char why[512] = "";
  td_dataset_open(&train, &test, "bogus", why, sizeof why);
  ck_assert_msg(strstr(why, "fashion-mnist") && strstr(why, "idx:") && strstr(why, "csv:"),
                "the accepted forms are listed: %s", why);
}
END_TEST

/* ---- statistics, subsets, shuffles ------------------------------------------------------ */

START_TEST(stats_and_normalize_give_zero_mean_unit_std) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  write_ubyte_idx(img, lab, 500, 3, 0);
  td_dataset_t *ds = load_idx_ok(img, lab);
  const float *x = td_dataset_features_const(ds);
  size_t n = 500 * 6;
  double ref_mean = 0, ref_var = 0;
  for (size_t i = 0; i < n; i++)
    ref_mean += x[i];
  ref_mean /= (double)n;
  for (size_t i = 0; i < n; i++)
    ref_var += (x[i] - ref_mean) * (x[i] - ref_mean);
  double mean, std;
  td_dataset_stats(ds, &mean, &std);
  ck_assert_double_eq_tol(mean, ref_mean, 1e-12);
  ck_assert_double_eq_tol(std, sqrt(ref_var / (double)n), 1e-12);
  ck_assert_double_gt(std, 0.1);
  td_dataset_normalize(ds, mean, std);
  td_dataset_stats(ds, &mean, &std);
  ck_assert_double_eq_tol(mean, 0.0, 1e-5);
  ck_assert_double_eq_tol(std, 1.0, 1e-5);
  /* std <= 0 means "leave the scale alone" */
  float before = td_dataset_features(ds)[7];
  td_dataset_normalize(ds, 1.0, 0.0);
  ck_assert_float_eq_tol(td_dataset_features(ds)[7], before - 1.0f, 1e-6f);
  td_dataset_close(&ds);
}
END_TEST

START_TEST(subset_copies_the_requested_rows) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  float *want = write_float_idx(img, lab, 30, 4, 10, 2); /* 30 rows: classes 10 */
  td_dataset_t *ds = load_idx_ok(img, lab);
  const uint32_t idx[4] = {29, 0, 7, 7};
  td_dataset_t *sub = NULL;
  ck_assert_int_eq(td_dataset_subset(&sub, ds, idx, 4), 0);
  ck_assert_uint_eq(td_dataset_rows(sub), 4);
  ck_assert_uint_eq(td_dataset_dim(sub), 4);
  ck_assert_int_eq(td_dataset_classes(sub), 10); /* inherited, never shrunk */
  for (size_t i = 0; i < 4; i++) {
    ck_assert_mem_eq(td_dataset_features(sub) + 4 * i, want + 4 * idx[i], 4 * sizeof(float));
    ck_assert_int_eq(td_dataset_labels(sub)[i], (int)(idx[i] % 10));
  }
  /* a copy: writing to it leaves the source alone */
  td_dataset_features(sub)[0] = 1234.0f;
  ck_assert_float_eq(td_dataset_features(ds)[29 * 4], want[29 * 4]);
  td_dataset_close(&sub);
  /* a subset of two classes still reports the source's label space */
  const uint32_t two[2] = {0, 1};
  ck_assert_int_eq(td_dataset_subset(&sub, ds, two, 2), 0);
  ck_assert_int_eq(td_dataset_classes(sub), 10);
  td_dataset_close(&sub);
  const uint32_t out_of_range[2] = {3, 30};
  ck_assert_int_eq(td_dataset_subset(&sub, ds, out_of_range, 2), TD_ERANGE);
  ck_assert_ptr_null(sub);
  td_dataset_close(&ds);
  free(want);
}
END_TEST

/* The float a byte of write_ubyte_idx's pixel i stands for, by the old
 * float storage's expressions: the IDX conversion, then td_dataset_normalize. */
static float old_expansion(size_t i, double mean, double std) {
  float x = (float)(uint8_t)(i * 37 + 11) / 255.0f;
  return (float)(((double)x - mean) * (1.0 / std));
}

/* Keeps rows 3k of the file's, last first: a partition's shape. */
static int pick_every_third(const int32_t *labels, size_t rows, int classes, void *user,
                            uint32_t **idx, size_t *count, char *why, size_t why_len) {
  (void)labels, (void)classes, (void)user, (void)why, (void)why_len;
  *count = (rows + 2) / 3;
  *idx = malloc(*count * sizeof **idx);
  for (size_t k = 0; k < *count; k++)
    (*idx)[k] = (uint32_t)(3 * (*count - 1 - k));
  return 0;
}

START_TEST(byte_storage_gathers_exactly_the_floats_of_float_storage) {
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  enum { ROWS = 300, DIM = 6 }; /* every byte value occurs */
  write_ubyte_idx(img, lab, ROWS, 5, 0);
  td_dataset_t *bytes = load_idx_ok(img, lab), *floats = load_idx_ok(img, lab);
  ck_assert(td_dataset_holds_bytes(bytes));
  ck_assert_ptr_nonnull(td_dataset_features(floats)); /* expanded: the old storage */
  ck_assert(!td_dataset_holds_bytes(floats));
  double mb, sb, mf, sf;
  td_dataset_stats(bytes, &mb, &sb);
  td_dataset_stats(floats, &mf, &sf);
  ck_assert_mem_eq(&mb, &mf, sizeof mb); /* bit for bit */
  ck_assert_mem_eq(&sb, &sf, sizeof sb);
  td_dataset_normalize(bytes, mb, sb);
  td_dataset_normalize(floats, mf, sf);
  float *scratch = malloc(ROWS * DIM * sizeof *scratch), want[ROWS * DIM];
  for (size_t i = 0; i < ROWS * DIM; i++)
    want[i] = old_expansion(i, mb, sb);
  const float *got = td_dataset_rows_floats(bytes, 0, ROWS, scratch);
  ck_assert_ptr_eq(got, scratch);
  ck_assert_mem_eq(got, want, sizeof want);
  ck_assert_mem_eq(td_dataset_features_const(floats), want, sizeof want);
  /* the float storage hands out its own rows, no copy */
  ck_assert_ptr_eq(td_dataset_rows_floats(floats, 2, 3, scratch),
                   td_dataset_features_const(floats) + 2 * DIM);
  ck_assert_ptr_null(td_dataset_rows_floats(bytes, ROWS - 2, 3, scratch));
  /* shuffles (whole and a range) and subsets move the same rows */
  td_rng_t r1, r2;
  td_rng_seed(&r1, 9);
  td_rng_seed(&r2, 9);
  td_dataset_shuffle(bytes, &r1);
  td_dataset_shuffle(floats, &r2);
  td_dataset_shuffle_rows(bytes, 40, 100, &r1);
  td_dataset_shuffle_rows(floats, 40, 100, &r2);
  const uint32_t idx[5] = {299, 0, 17, 17, 150};
  td_dataset_t *sb_ = NULL, *sf_ = NULL;
  ck_assert_int_eq(td_dataset_subset(&sb_, bytes, idx, 5), 0);
  ck_assert_int_eq(td_dataset_subset(&sf_, floats, idx, 5), 0);
  ck_assert(td_dataset_holds_bytes(sb_));
  ck_assert_mem_eq(td_dataset_rows_floats(bytes, 0, ROWS, scratch),
                   td_dataset_features_const(floats), sizeof want);
  ck_assert_mem_eq(td_dataset_labels_const(bytes), td_dataset_labels_const(floats),
                   ROWS * sizeof(int32_t));
  ck_assert_mem_eq(td_dataset_rows_floats(sb_, 0, 5, scratch), td_dataset_features_const(sf_),
                   5 * DIM * sizeof(float));
  ck_assert_mem_eq(td_dataset_labels_const(sb_), td_dataset_labels_const(sf_),
                   5 * sizeof(int32_t));
  /* expanding a byte dataset in place keeps its floats */
  memcpy(want, td_dataset_rows_floats(bytes, 0, ROWS, scratch), sizeof want);
  ck_assert_mem_eq(td_dataset_features(bytes), want, sizeof want);
  ck_assert(!td_dataset_holds_bytes(bytes));
  td_dataset_close(&sb_);
  td_dataset_close(&sf_);
  td_dataset_close(&bytes);
  /* a partition's rows, read alone, hold bytes standing for the same floats,
   * and the whole file's statistics */
  double mean, std;
  size_t full = 0;
  char why[256] = "";
  int rc = td_dataset_load_idx_rows(&bytes, img, lab, pick_every_third, NULL, &mean, &std,
                                    &full, why, sizeof why);
  ck_assert_msg(rc == 0, "%s", why);
  ck_assert(td_dataset_holds_bytes(bytes));
  ck_assert_uint_eq(full, ROWS);
  ck_assert_mem_eq(&mean, &mb, sizeof mean);
  ck_assert_mem_eq(&std, &sb, sizeof std);
  td_dataset_normalize(bytes, mean, std);
  size_t kept = td_dataset_rows(bytes);
  got = td_dataset_rows_floats(bytes, 0, kept, scratch);
  for (size_t k = 0; k < kept; k++)
    for (size_t d = 0; d < DIM; d++) {
      float w = old_expansion(3 * (kept - 1 - k) * DIM + d, mean, std);
      ck_assert_mem_eq(&got[k * DIM + d], &w, sizeof w);
    }
  td_dataset_close(&bytes);
  td_dataset_close(&floats);
  free(scratch);
}
END_TEST

/* FNV-1a over a row's features (as 32-bit words) and its label: equal
 * multisets of these mean every (row, label) pair survived intact. */
static uint64_t row_checksum(const float *x, size_t dim, int32_t label) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < dim; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return (h ^ (uint32_t)label) * 1099511628211ull;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t *sorted_checksums(td_dataset_t *ds) {
  size_t rows = td_dataset_rows(ds), dim = td_dataset_dim(ds);
  uint64_t *sums = malloc(rows * sizeof *sums);
  for (size_t i = 0; i < rows; i++)
    sums[i] = row_checksum(td_dataset_features(ds) + i * dim, dim, td_dataset_labels(ds)[i]);
  qsort(sums, rows, sizeof *sums, cmp_u64);
  return sums;
}

START_TEST(shuffle_keeps_every_row_intact_and_is_deterministic) {
  enum { ROWS = 2000, DIM = 50 };
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  free(write_float_idx(img, lab, ROWS, DIM, 7, 4));
  td_dataset_t *a = load_idx_ok(img, lab), *b = load_idx_ok(img, lab), *c = load_idx_ok(img, lab);
  uint64_t *before = sorted_checksums(a);
  td_rng_t ra, rb, rc;
  td_rng_seed(&ra, 99);
  td_rng_seed(&rb, 99);
  td_rng_seed(&rc, 100);
  td_dataset_shuffle(a, &ra);
  td_dataset_shuffle(b, &rb);
  td_dataset_shuffle(c, &rc);
  uint64_t *after = sorted_checksums(a);
  ck_assert_mem_eq(before, after, ROWS * sizeof *before);
  /* the same seed gives the same order; another seed another one */
  ck_assert_mem_eq(td_dataset_features(a), td_dataset_features(b), ROWS * DIM * sizeof(float));
  ck_assert_mem_eq(td_dataset_labels(a), td_dataset_labels(b), ROWS * sizeof(int32_t));
  ck_assert_int_ne(memcmp(td_dataset_features(a), td_dataset_features(c),
                          ROWS * DIM * sizeof(float)), 0);
  /* and the rows really moved: few labels stay at i % 7 */
  int unmoved = 0;
  for (int i = 0; i < ROWS; i++)
    unmoved += td_dataset_labels(a)[i] == i % 7;
  ck_assert_int_lt(unmoved, ROWS / 4);
  free(before);
  free(after);
  td_dataset_close(&a);
  td_dataset_close(&b);
  td_dataset_close(&c);
}
END_TEST

START_TEST(shuffle_of_a_fashion_mnist_sized_set_is_fast) {
  enum { ROWS = 60000 };
  const char *img = tmp_file("img.idx"), *lab = tmp_file("lab.idx");
  uint32_t dims[3] = {ROWS, 28, 28}, lab_dims[1] = {ROWS};
  uint8_t *pixels = malloc((size_t)ROWS * 784), *labels = malloc(ROWS);
  for (size_t i = 0; i < (size_t)ROWS * 784; i++)
    pixels[i] = (uint8_t)(i / 784 * 31 + i % 784);
  for (size_t i = 0; i < ROWS; i++)
    labels[i] = (uint8_t)(i % 10);
  size_t len;
  uint8_t *file = idx_file(0x08, 3, dims, pixels, (size_t)ROWS * 784, &len);
  write_file(img, file, len, 0);
  free(file);
  file = idx_file(0x08, 1, lab_dims, labels, ROWS, &len);
  write_file(lab, file, len, 0);
  free(file);
  free(pixels);
  free(labels);
  td_dataset_t *ds = load_idx_ok(img, lab);
  uint64_t *before = sorted_checksums(ds);
  td_rng_t rng;
  td_rng_seed(&rng, 1);
  /* no timing here: speed belongs to make bench, not make check */
  td_dataset_shuffle(ds, &rng);
  uint64_t *after = sorted_checksums(ds);
  ck_assert_mem_eq(before, after, ROWS * sizeof *before);
  free(before);
  free(after);
  td_dataset_close(&ds);
}
END_TEST

/* ---- the packaged dataset ------------------------------------------------------------------ */

START_TEST(fashion_mnist_package_loads_when_installed) {
  const char *dir = getenv("TRAIND_FASHION_MNIST_DIR");
  struct stat st;
  if (stat(dir != NULL && dir[0] != '\0' ? dir : TD_FASHION_MNIST_DIR, &st) != 0) {
    printf("fashion_mnist_package_loads_when_installed: %s not installed, nothing to check\n",
           TD_FASHION_MNIST_PKG);
    return;
  }
  td_dataset_t *train = NULL, *test = NULL;
  char why[1024] = "";
  int rc = td_dataset_open(&train, &test, "fashion-mnist", why, sizeof why);
  ck_assert_msg(rc == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 60000);
  ck_assert_uint_eq(td_dataset_dim(train), 784);
  ck_assert_uint_eq(td_dataset_rows(test), 10000);
  ck_assert_uint_eq(td_dataset_dim(test), 784);
  ck_assert_int_eq(td_dataset_classes(train), 10);
  ck_assert_int_eq(td_dataset_classes(test), 10);
  const float *x = td_dataset_features_const(train);
  float lo = 1, hi = 0;
  for (size_t i = 0; i < (size_t)60000 * 784; i++) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  ck_assert_float_eq(lo, 0.0f);
  ck_assert_float_eq(hi, 1.0f);
  int per_class[11] = {0}; /* [10]: labels outside 0..9 */
  for (size_t i = 0; i < 60000; i++) {
    int32_t y = td_dataset_labels_const(train)[i];
    per_class[y >= 0 && y < 10 ? y : 10]++;
  }
  ck_assert_int_eq(per_class[10], 0);
  for (int c = 0; c < 10; c++)
    ck_assert_int_eq(per_class[c], 6000); /* Fashion-MNIST is balanced */
  td_dataset_close(&train);
  td_dataset_close(&test);
}
END_TEST

static TCase *tcase_with_dir(const char *name, double timeout_s) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, make_tmp_dir, remove_tmp_dir);
  tcase_set_timeout(tc, timeout_s);
  return tc;
}

static Suite *dataset_suite(void) {
  Suite *s = suite_create("dataset");

  TCase *idx = tcase_with_dir("idx", 60);
  tcase_add_test(idx, idx_ubyte_round_trip_plain_and_gzip);
  tcase_add_test(idx, idx_float32_round_trip_and_any_rank_is_flattened);
  tcase_add_test(idx, idx_truncated_or_overlong_data_is_corrupt);
  tcase_add_test(idx, idx_corrupt_gzip_is_refused_without_crashing);
  tcase_add_test(idx, idx_wrong_magic_or_type_is_corrupt);
  tcase_add_test(idx, idx_hostile_header_is_refused_before_allocating);
  tcase_add_test(idx, idx_image_and_label_counts_must_agree);
  tcase_add_test(idx, idx_missing_file_is_enoent_naming_the_path);
  suite_add_tcase(s, idx);

  TCase *csv = tcase_with_dir("csv", 60);
  tcase_add_test(csv, csv_reads_label_first_rows_after_a_header);
  tcase_add_test(csv, csv_ragged_row_is_corrupt_naming_the_line);
  tcase_add_test(csv, csv_bad_values_are_corrupt);
  tcase_add_test(csv, csv_missing_file_is_enoent);
  suite_add_tcase(s, csv);

  TCase *open = tcase_with_dir("open", 60);
  tcase_add_test(open, open_fashion_mnist_without_the_package_names_it);
  tcase_add_test(open, open_idx_with_a_test_set_shares_one_label_space);
  tcase_add_test(open, open_csv_train_and_test);
  tcase_add_test(open, open_rejects_malformed_specs);
  tcase_add_test(open, special_paths_are_refused_at_once_naming_what_they_are);
  suite_add_tcase(s, open);

  TCase *rows = tcase_with_dir("rows", 60);
  tcase_add_test(rows, stats_and_normalize_give_zero_mean_unit_std);
  tcase_add_test(rows, subset_copies_the_requested_rows);
  tcase_add_test(rows, byte_storage_gathers_exactly_the_floats_of_float_storage);
  tcase_add_test(rows, shuffle_keeps_every_row_intact_and_is_deterministic);
  tcase_add_test(rows, shuffle_of_a_fashion_mnist_sized_set_is_fast);
  suite_add_tcase(s, rows);

  TCase *fashion = tcase_create("fashion-mnist");
  tcase_set_timeout(fashion, 300);
  tcase_add_test(fashion, fashion_mnist_package_loads_when_installed);
  suite_add_tcase(s, fashion);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(dataset_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
