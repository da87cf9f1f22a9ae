/* test_data.c: random numbers, datasets and partitions.
 *
 * IDX files are written byte by byte (plain and gzip) and read back exactly;
 * truncated, corrupt, hostile and mismatched files are refused with the right
 * code; CSV parsing, normalisation, subsets and shuffles keep every row; the
 * partitions are disjoint, cover every row, and show the label skew they
 * promise. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "compute/dataset.h"
#include "compute/error.h"
#include "compute/partition.h"
#include "compute/rng.h"

static char dir[64];
static char path_buf[4][256];

static const char *tmp_path(int slot, const char *name) {
  if (dir[0] == '\0') {
    strcpy(dir, "/tmp/td-data-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
  }
  snprintf(path_buf[slot], sizeof path_buf[slot], "%s/%s", dir, name);
  return path_buf[slot];
}

static void write_bytes(const char *path, const uint8_t *data, size_t len, int gzip) {
  if (gzip) {
    gzFile g = gzopen(path, "wb");
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(gzwrite(g, data, (unsigned)len), (int)len);
    gzclose(g);
  } else {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(data, 1, len, f);
    fclose(f);
  }
}

/* n images of 3x2 ubyte pixels and n labels (i % 4). */
static size_t make_idx(uint8_t *img, uint8_t *lab, uint32_t n, size_t *lab_len) {
  uint8_t hdr[16] = {0, 0, 8, 3, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                     (uint8_t)n, 0, 0, 0, 3, 0, 0, 0, 2};
  memcpy(img, hdr, 16);
  for (uint32_t i = 0; i < n * 6; i++)
    img[16 + i] = (uint8_t)(i * 37 + 11);
  uint8_t lh[8] = {0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                   (uint8_t)n};
  memcpy(lab, lh, 8);
  for (uint32_t i = 0; i < n; i++)
    lab[8 + i] = (uint8_t)(i % 4);
  *lab_len = 8 + n;
  return 16 + (size_t)n * 6;
}

START_TEST(rng_is_deterministic_and_well_distributed) {
  td_rng_t a, b;
  td_rng_seed(&a, 42);
  td_rng_seed(&b, 42);
  for (int i = 0; i < 100; i++)
    ck_assert_uint_eq(td_rng_next(&a), td_rng_next(&b));
  double s = 0, s2 = 0, n2 = 0, g = 0;
  const int N = 200000;
  for (int i = 0; i < N; i++) {
    double u = td_rng_uniform(&a);
    ck_assert(u >= 0 && u < 1);
    s += u;
    s2 += u * u;
    double z = td_rng_normal(&a);
    n2 += z * z;
    g += td_rng_gamma(&a, 0.5);
    ck_assert_uint_lt(td_rng_below(&a, 7), 7);
  }
  ck_assert_double_eq_tol(s / N, 0.5, 4 * sqrt(1.0 / 12 / N));
  ck_assert_double_eq_tol(s2 / N - (s / N) * (s / N), 1.0 / 12, 0.002);
  ck_assert_double_eq_tol(n2 / N, 1.0, 0.02);
  ck_assert_double_eq_tol(g / N, 0.5, 0.01); /* mean of Gamma(k) is k */
  uint32_t perm[50];
  for (uint32_t i = 0; i < 50; i++)
    perm[i] = i;
  td_rng_shuffle_u32(&a, perm, 50);
  uint64_t sum = 0;
  for (int i = 0; i < 50; i++)
    sum += perm[i];
  ck_assert_uint_eq(sum, 49 * 50 / 2);
}
END_TEST

START_TEST(idx_plain_and_gzip_round_trip) {
  static uint8_t img[16 + 100 * 6], lab[8 + 100];
  size_t lab_len, img_len = make_idx(img, lab, 100, &lab_len);
  for (int gz = 0; gz < 2; gz++) {
    const char *ip = tmp_path(0, gz ? "img.gz" : "img.idx");
    const char *lp = tmp_path(1, gz ? "lab.gz" : "lab.idx");
    write_bytes(ip, img, img_len, gz);
    write_bytes(lp, lab, lab_len, gz);
    td_dataset_t *ds = NULL;
    char why[256] = "";
    ck_assert_msg(td_dataset_load_idx(&ds, ip, lp, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(td_dataset_rows(ds), 100);
    ck_assert_uint_eq(td_dataset_dim(ds), 6);
    ck_assert_int_eq(td_dataset_classes(ds), 4);
    for (size_t i = 0; i < 600; i++)
      ck_assert_float_eq(td_dataset_features(ds)[i], (float)img[16 + i] * (1.0f / 255.0f));
    for (size_t i = 0; i < 100; i++)
      ck_assert_int_eq(td_dataset_labels(ds)[i], (int)(i % 4));
    td_dataset_close(&ds);
    ck_assert_ptr_null(ds);
  }
}
END_TEST

START_TEST(bad_idx_files_are_refused) {
  static uint8_t img[16 + 100 * 6], lab[8 + 100];
  size_t lab_len, img_len = make_idx(img, lab, 100, &lab_len);
  const char *lp = tmp_path(1, "lab.idx");
  write_bytes(lp, lab, lab_len, 0);
  td_dataset_t *ds = NULL;
  char why[256];
  /* truncated, plain and gzip */
  const char *ip = tmp_path(0, "short.idx");
  write_bytes(ip, img, img_len - 5, 0);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "truncated"));
  ip = tmp_path(0, "short.gz");
  write_bytes(ip, img, img_len - 5, 1);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), TD_ECORRUPT);
  /* a gzip stream cut in the middle, and one with its body overwritten */
  ip = tmp_path(0, "cut.gz");
  write_bytes(ip, img, img_len, 1);
  FILE *f = fopen(ip, "r+b");
  fseek(f, 0, SEEK_END);
  long gz_len = ftell(f);
  fclose(f);
  ck_assert_int_eq(truncate(ip, gz_len / 2), 0);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), TD_ECORRUPT);
  ip = tmp_path(0, "flip.gz");
  write_bytes(ip, img, img_len, 1);
  f = fopen(ip, "r+b");
  fseek(f, 20, SEEK_SET);
  fwrite("\xde\xad\xbe\xef\xde\xad\xbe\xef\xde\xad", 1, 10, f);
  fclose(f);
  ck_assert_int_ne(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), 0);
  ck_assert_ptr_null(ds);
  /* wrong magic, hostile dimensions, count mismatch, missing file */
  ip = tmp_path(0, "magic.idx");
  write_bytes(ip, (const uint8_t *)"\x01\x02\x08\x03", 4, 0);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), TD_ECORRUPT);
  ip = tmp_path(0, "huge.idx");
  write_bytes(ip, (const uint8_t *)"\x00\x00\x08\x03\x7f\xff\xff\xff\x7f\xff\xff\xff\x00\x00\x00\x01", 16, 0);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "limits"));
  ip = tmp_path(0, "img.idx");
  write_bytes(ip, img, img_len, 0);
  lab[7] = 99; /* the label file now claims 99 labels */
  const char *lp2 = tmp_path(2, "lab99.idx");
  write_bytes(lp2, lab, 8 + 99, 0);
  ck_assert_int_eq(td_dataset_load_idx(&ds, ip, lp2, why, sizeof why), TD_ESHAPE);
  ck_assert_int_eq(td_dataset_load_idx(&ds, tmp_path(3, "nope.idx"), lp, why, sizeof why),
                   TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "nope.idx"));
  /* the packaged dataset missing: name the path and the Debian package */
  setenv("TRAIND_FASHION_MNIST_DIR", dir, 1);
  td_dataset_t *test = NULL;
  ck_assert_int_eq(td_dataset_open(&ds, &test, "fashion-mnist", why, sizeof why), TD_ENOENT);
  ck_assert_ptr_nonnull(strstr(why, "dataset-fashion-mnist"));
  ck_assert_ptr_nonnull(strstr(why, dir));
  unsetenv("TRAIND_FASHION_MNIST_DIR");
  ck_assert_int_eq(td_dataset_open(&ds, &test, "idx:onlyone", why, sizeof why), TD_ECONFIG);
  ck_assert_int_eq(td_dataset_open(&ds, &test, "parquet:x", why, sizeof why), TD_ECONFIG);
}
END_TEST

START_TEST(csv_rows_headers_and_errors) {
  const char *p = tmp_path(0, "good.csv");
  FILE *f = fopen(p, "w");
  fputs("label,a,b\n1,0.5,2\n0,-1,3.25\n\n2,4,5\n", f);
  fclose(f);
  td_dataset_t *ds = NULL;
  char why[256] = "";
  ck_assert_msg(td_dataset_load_csv(&ds, p, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(ds), 3);
  ck_assert_uint_eq(td_dataset_dim(ds), 2);
  ck_assert_int_eq(td_dataset_classes(ds), 3);
  ck_assert_float_eq(td_dataset_features(ds)[3], 3.25f);
  ck_assert_int_eq(td_dataset_labels(ds)[1], 0);
  td_dataset_close(&ds);
  static const char *bad[] = {"1,2,3\n1,2\n", "1,2\nx,3\n", "1,nan\n", "-1,2\n", "1.5,2\n", "",
                              "1\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    p = tmp_path(0, "bad.csv");
    f = fopen(p, "w");
    fputs(bad[i], f);
    fclose(f);
    ck_assert_msg(td_dataset_load_csv(&ds, p, why, sizeof why) == TD_ECORRUPT, "case %zu", i);
    ck_assert_ptr_null(ds);
  }
  p = tmp_path(0, "bad.csv");
  f = fopen(p, "w");
  fputs("1,2,3\n0,1\n", f);
  fclose(f);
  td_dataset_load_csv(&ds, p, why, sizeof why);
  ck_assert_ptr_nonnull(strstr(why, ":2:")); /* names the line */
}
END_TEST

/* a labelled synthetic set: row i has features (i, label) and label i % 10 */
static td_dataset_t *synthetic(size_t rows) {
  const char *p = tmp_path(0, "syn.csv");
  FILE *f = fopen(p, "w");
  for (size_t i = 0; i < rows; i++)
    fprintf(f, "%zu,%zu,%zu\n", i % 10, i, i % 10);
  fclose(f);
  td_dataset_t *ds = NULL;
  char why[128];
  ck_assert_int_eq(td_dataset_load_csv(&ds, p, why, sizeof why), 0);
  return ds;
}

START_TEST(normalize_subset_and_shuffle_keep_rows) {
  td_dataset_t *ds = synthetic(1000);
  td_rng_t rng;
  td_rng_seed(&rng, 5);
  td_dataset_shuffle(ds, &rng);
  /* every row still pairs feature 1 with its label, and every row is there */
  static int seen[1000];
  memset(seen, 0, sizeof seen);
  for (size_t i = 0; i < 1000; i++) {
    const float *x = td_dataset_features(ds) + 2 * i;
    ck_assert_float_eq(x[1], (float)td_dataset_labels(ds)[i]);
    seen[(int)x[0]]++;
  }
  for (int i = 0; i < 1000; i++)
    ck_assert_int_eq(seen[i], 1);
  ck_assert_float_ne(td_dataset_features(ds)[0], 0.0f); /* it did move */
  uint32_t idx[3] = {5, 0, 999};
  td_dataset_t *sub = NULL;
  ck_assert_int_eq(td_dataset_subset(&sub, ds, idx, 3), 0);
  ck_assert_float_eq(td_dataset_features(sub)[2], td_dataset_features(ds)[0]);
  ck_assert_int_eq(td_dataset_classes(sub), 10);
  idx[0] = 1000;
  td_dataset_t *bad = NULL;
  ck_assert_int_eq(td_dataset_subset(&bad, ds, idx, 3), TD_ERANGE);
  double mean, std;
  td_dataset_stats(ds, &mean, &std);
  td_dataset_normalize(ds, mean, std);
  td_dataset_stats(ds, &mean, &std);
  ck_assert_double_eq_tol(mean, 0.0, 1e-4);
  ck_assert_double_eq_tol(std, 1.0, 1e-4);
  td_dataset_close(&sub);
  td_dataset_close(&ds);
}
END_TEST

static void check_cover(const td_partition_t *p, const int32_t *labels, size_t rows,
                        unsigned nodes, double *max_share_mean) {
  static int owner[1000];
  for (size_t i = 0; i < rows; i++)
    owner[i] = -1;
  double share_sum = 0;
  for (unsigned k = 0; k < nodes; k++) {
    uint32_t *idx = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    ck_assert_int_eq(td_partition_indices(p, labels, rows, 10, k, nodes, 77, &idx, &n), 0);
    ck_assert_int_eq(td_partition_indices(p, labels, rows, 10, k, nodes, 77, &again, &n2), 0);
    ck_assert_uint_eq(n, n2);
    ck_assert_int_eq(memcmp(idx, again, n * sizeof *idx), 0); /* deterministic */
    int per_class[10] = {0}, top = 0;
    for (size_t i = 0; i < n; i++) {
      ck_assert_msg(owner[idx[i]] == -1, "row %u in two partitions", idx[i]);
      owner[idx[i]] = (int)k;
      if (i > 0)
        ck_assert_uint_gt(idx[i], idx[i - 1]);
      per_class[labels[idx[i]]]++;
    }
    for (int c = 0; c < 10; c++)
      top = per_class[c] > top ? per_class[c] : top;
    share_sum += n ? (double)top / (double)n : 1.0;
    free(idx);
    free(again);
  }
  for (size_t i = 0; i < rows; i++)
    ck_assert_msg(owner[i] != -1, "row %zu in no partition", i);
  *max_share_mean = share_sum / nodes;
}

START_TEST(partitions_are_disjoint_covering_and_skewed_as_promised) {
  int32_t labels[1000];
  for (int i = 0; i < 1000; i++)
    labels[i] = (i * 7) % 10;
  td_partition_t p;
  char why[128];
  double share;
  ck_assert_int_eq(td_partition_parse(&p, "iid", why, sizeof why), 0);
  check_cover(&p, labels, 1000, 5, &share);
  ck_assert_double_lt(share, 0.2);
  uint32_t *idx;
  size_t n;
  for (unsigned k = 0; k < 3; k++) { /* sizes differ by at most one */
    td_partition_indices(&p, labels, 1000, 10, k, 3, 1, &idx, &n);
    ck_assert(n == 333 || n == 334);
    free(idx);
  }
  ck_assert_int_eq(td_partition_parse(&p, "dirichlet:0.1", why, sizeof why), 0);
  check_cover(&p, labels, 1000, 5, &share);
  ck_assert_double_gt(share, 0.3); /* strong label skew: uniform would be 0.1 */
  ck_assert_int_eq(td_partition_parse(&p, "dirichlet:100", why, sizeof why), 0);
  check_cover(&p, labels, 1000, 5, &share);
  ck_assert_double_lt(share, 0.2); /* nearly uniform */
  ck_assert_int_eq(td_partition_parse(&p, "shard:2", why, sizeof why), 0);
  check_cover(&p, labels, 1000, 5, &share);
  ck_assert_double_ge(share, 0.45); /* each node holds about two classes */
  for (unsigned k = 0; k < 5; k++) {
    td_partition_indices(&p, labels, 1000, 10, k, 5, 77, &idx, &n);
    int present[10] = {0}, distinct = 0;
    for (size_t i = 0; i < n; i++)
      present[labels[idx[i]]] = 1;
    for (int c = 0; c < 10; c++)
      distinct += present[c];
    ck_assert_int_le(distinct, 4);
    free(idx);
  }
  ck_assert_int_eq(td_partition_indices(&p, labels, 1000, 10, 5, 5, 1, &idx, &n), TD_EINVAL);
  labels[3] = 10;
  ck_assert_int_eq(td_partition_indices(&p, labels, 1000, 10, 0, 5, 1, &idx, &n), TD_ERANGE);
  static const char *bad[] = {"dirichlet:0", "dirichlet:-1", "dirichlet:nan", "shard:0",
                              "shard:x", "bogus", "iid:3", "dirichlet:", "shard:-2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(td_partition_parse(&p, bad[i], why, sizeof why) == TD_ECONFIG, "%s", bad[i]);
    ck_assert_str_ne(why, "");
  }
}
END_TEST

START_TEST(fashion_mnist_package_loads) {
  td_dataset_t *train = NULL, *test = NULL;
  char why[512];
  int rc = td_dataset_open(&train, &test, "fashion-mnist", why, sizeof why);
  ck_assert_msg(rc == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 60000);
  ck_assert_uint_eq(td_dataset_dim(train), 784);
  ck_assert_uint_eq(td_dataset_rows(test), 10000);
  ck_assert_int_eq(td_dataset_classes(train), 10);
  float lo = 1, hi = 0;
  for (size_t i = 0; i < 784 * 1000; i++) {
    float v = td_dataset_features(train)[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  ck_assert(lo == 0.0f && hi == 1.0f);
  td_dataset_close(&train);
  td_dataset_close(&test);
}
END_TEST

int main(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, rng_is_deterministic_and_well_distributed);
  tcase_add_test(tc, idx_plain_and_gzip_round_trip);
  tcase_add_test(tc, bad_idx_files_are_refused);
  tcase_add_test(tc, csv_rows_headers_and_errors);
  tcase_add_test(tc, normalize_subset_and_shuffle_keep_rows);
  tcase_add_test(tc, partitions_are_disjoint_covering_and_skewed_as_promised);
  tcase_add_test(tc, fashion_mnist_package_loads);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
