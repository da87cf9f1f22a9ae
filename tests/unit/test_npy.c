/* test_npy.c: NumPy .npy files (compute/data/npy.h) and the npy:X,Y dataset
 * (td_dataset_load_npy, compute/data/dataset.h).
 *
 * The files are written by NumPy itself (/usr/bin/python3 with Debian's
 * python3-numpy; the tests skip when it is missing) and read back value by
 * value: float32 and uint8 features, int64, int32 and uint8 labels, format
 * versions 1 and 2, an item shape that is flattened. The header parser is
 * then fed hostile headers from memory: Fortran order, big-endian and
 * unsupported dtypes, shapes whose product overflows, a header that lies
 * about its length or about the data, keys repeated or missing. */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/data/dataset.h"
#include "compute/data/npy.h"

#include "tests/unit/tmp_dir.h"

static int have_numpy(void) {
  return system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

/* Run a python snippet with numpy imported as np and D the test directory. */
static void python(const char *code) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && /usr/bin/python3 -c 'import numpy as np, numpy.lib.format as F\n%s'",
           tmp_dir, code);
  ck_assert_msg(system(cmd) == 0, "python failed: %s", code);
}

START_TEST(float32_features_and_int64_labels_read_back_value_by_value) {
  if (!have_numpy())
    return; /* logged by the check below */
  python("x = (np.arange(7*2*3, dtype=np.float32) * 0.5 - 3).reshape(7, 2, 3)\n"
         "np.save(\"x.npy\", x)\n"
         "np.save(\"y.npy\", np.array([0, 2, 1, 2, 0, 1, 4], dtype=np.int64))");
  td_dataset_t *ds = NULL;
  char why[512];
  ck_assert_msg(td_dataset_load_npy(&ds, tmp_path("x.npy"), tmp_path("y.npy"), why, sizeof why) ==
                    0,
                "%s", why);
  ck_assert_uint_eq(td_dataset_rows(ds), 7);
  ck_assert_uint_eq(td_dataset_dim(ds), 6);
  ck_assert_int_eq(td_dataset_classes(ds), 5);
  for (int i = 0; i < 42; i++)
    ck_assert_float_eq(td_dataset_features(ds)[i], (float)i * 0.5f - 3.0f);
  static const int32_t labels[7] = {0, 2, 1, 2, 0, 1, 4};
  for (int i = 0; i < 7; i++)
    ck_assert_int_eq(td_dataset_labels(ds)[i], labels[i]);
  td_dataset_close(&ds);
}
END_TEST

START_TEST(uint8_features_int32_and_uint8_labels_and_format_v2) {
  if (!have_numpy())
    return;
  python("x = np.arange(5*4, dtype=np.uint8).reshape(5, 4) * 13\n"
         "with open(\"x2.npy\", \"wb\") as f: F.write_array(f, x, version=(2, 0))\n"
         "np.save(\"y32.npy\", np.array([3, 0, 1, 1, 2], dtype=np.int32))\n"
         "np.save(\"y8.npy\", np.array([3, 0, 1, 1, 2], dtype=np.uint8))");
  for (int k = 0; k < 2; k++) {
    td_dataset_t *ds = NULL;
    char why[512];
    ck_assert_msg(td_dataset_load_npy(&ds, tmp_path("x2.npy"),
                                      tmp_path(k == 0 ? "y32.npy" : "y8.npy"), why,
                                      sizeof why) == 0,
                  "%s", why);
    ck_assert_uint_eq(td_dataset_rows(ds), 5);
    ck_assert_uint_eq(td_dataset_dim(ds), 4);
    ck_assert(td_dataset_holds_bytes(ds)); /* bytes until a batch gathers them */
    float rows[20];
    const float *got = td_dataset_rows_floats(ds, 0, 5, rows);
    for (int i = 0; i < 20; i++) {
      float want = (float)(uint8_t)(i * 13) / 255.0f;
      ck_assert_mem_eq(&got[i], &want, sizeof want);
    }
    for (int i = 0; i < 20; i++)
      ck_assert_float_eq(td_dataset_features(ds)[i], (float)(uint8_t)(i * 13) / 255.0f);
    ck_assert_int_eq(td_dataset_labels(ds)[0], 3);
    ck_assert_int_eq(td_dataset_labels(ds)[4], 2);
    ck_assert_int_eq(td_dataset_classes(ds), 4);
    td_dataset_close(&ds);
  }
}
END_TEST

START_TEST(the_spec_form_with_a_test_pair) {
  if (!have_numpy())
    return;
  python("np.save(\"a.npy\", np.ones((6, 3), np.float32))\n"
         "np.save(\"b.npy\", np.arange(6) % 3)\n"
         "np.save(\"c.npy\", np.zeros((2, 3), np.float32))\n"
         "np.save(\"d.npy\", np.array([1, 5]))");
  char spec[2048], why[512];
  snprintf(spec, sizeof spec, "npy:%s,%s,%s,%s", tmp_path("a.npy"), tmp_path("b.npy"),
           tmp_path("c.npy"), tmp_path("d.npy"));
  td_dataset_t *train = NULL, *test = NULL;
  ck_assert_msg(td_dataset_open(&train, &test, spec, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 6);
  ck_assert_uint_eq(td_dataset_rows(test), 2);
  ck_assert_int_eq(td_dataset_classes(train), 6); /* one label space: test has a 5 */
  td_dataset_close(&train);
  td_dataset_close(&test);
  ck_assert_int_eq(td_dataset_open(&train, &test, "npy:only_one.npy", why, sizeof why),
                   TD_ECONFIG);
}
END_TEST

START_TEST(numpy_files_the_loader_must_refuse) {
  if (!have_numpy())
    return;
  python("np.save(\"fortran.npy\", np.asfortranarray(np.ones((3, 2), np.float32)))\n"
         "np.save(\"big.npy\", np.ones((3, 2), \">f4\"))\n"
         "np.save(\"f64.npy\", np.ones((3, 2), np.float64))\n"
         "np.save(\"yf.npy\", np.ones(3, np.float32))\n"
         "np.save(\"y2d.npy\", np.ones((3, 1), np.int64))\n"
         "np.save(\"y4.npy\", np.ones(4, np.int64))\n"
         "np.save(\"yneg.npy\", np.array([0, -1, 2]))\n"
         "np.save(\"x.npy\", np.ones((3, 2), np.float32))\n"
         "np.save(\"xnan.npy\", np.array([[0, 1], [np.nan, 2], [3, 4]], np.float32))\n"
         "np.save(\"y.npy\", np.arange(3))");
  static const struct {
    const char *x, *y;
    int rc;
    const char *says;
  } cases[] = {
      {"fortran.npy", "y.npy", TD_ECORRUPT, "fortran.npy: .npy array is in Fortran order"},
      {"big.npy", "y.npy", TD_ECORRUPT, "big.npy: .npy dtype '>f4' is not read"},
      {"f64.npy", "y.npy", TD_ECORRUPT, "f64.npy: .npy dtype '<f8' is not read"},
      {"x.npy", "yf.npy", TD_ESHAPE, "yf.npy: labels must be a 1-D integer array"},
      {"x.npy", "y2d.npy", TD_ESHAPE, "y2d.npy: labels must be a 1-D integer array"},
      {"x.npy", "y4.npy", TD_ESHAPE, "x.npy has 3 rows but"},
      {"x.npy", "yneg.npy", TD_ECORRUPT, "yneg.npy: label -1 in row 1 is outside"},
      {"xnan.npy", "y.npy", TD_ECORRUPT, "xnan.npy: non-finite value in row 1"},
      {"y.npy", "y.npy", TD_ECORRUPT, "y.npy: features must be float32"},
      {"missing.npy", "y.npy", TD_ENOENT, "missing.npy"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    td_dataset_t *ds = NULL;
    char why[512] = "";
    int rc = td_dataset_load_npy(&ds, tmp_path(cases[i].x), tmp_path(cases[i].y), why,
                                 sizeof why);
    ck_assert_msg(rc == cases[i].rc && strstr(why, cases[i].says) != NULL,
                  "%s,%s: rc %d, why '%s'", cases[i].x, cases[i].y, rc, why);
    ck_assert_ptr_null(ds);
    ck_assert_ptr_null(strchr(why, '\n'));
  }
  /* a directory is no file */
  td_dataset_t *ds = NULL;
  char why[512];
  ck_assert_int_eq(td_dataset_load_npy(&ds, tmp_dir, tmp_path("y.npy"), why, sizeof why), TD_EIO);
}
END_TEST

/* ---- the header parser on hostile bytes ------------------------------------------ */

/* A v1 file in memory: magic, version 1.0, the header padded to 64 with a
 * newline, then data_len zero bytes. Caller frees. */
static uint8_t *npy_bytes(const char *dict, size_t data_len, size_t *len) {
  size_t dict_len = strlen(dict), header = dict_len + 1;
  while ((10 + header) % 64 != 0)
    header++;
  *len = 10 + header + data_len;
  uint8_t *b = calloc(1, *len);
  ck_assert_ptr_nonnull(b);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (uint8_t)header;
  b[9] = (uint8_t)(header >> 8);
  memcpy(b + 10, dict, dict_len);
  memset(b + 10 + dict_len, ' ', header - dict_len - 1);
  b[10 + header - 1] = '\n';
  return b;
}

static int parse(const char *dict, size_t data_len, char *why, size_t why_len) {
  size_t len;
  uint8_t *b = npy_bytes(dict, data_len, &len);
  td_npy_header_t h;
  int rc = td_npy_parse_header(&h, b, len, len, "t.npy", why, why_len);
  free(b);
  return rc;
}

START_TEST(the_header_parser_accepts_what_numpy_writes) {
  char why[256];
  ck_assert_int_eq(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 24, why,
                         sizeof why),
                   0);
  ck_assert_int_eq(parse("{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", 40, why,
                         sizeof why),
                   0);
  /* keys in another order, double quotes, no trailing comma */
  ck_assert_int_eq(parse("{\"shape\": (2, 1, 1), \"fortran_order\": False, \"descr\": \"|u1\"}", 2,
                         why, sizeof why),
                   0);
  size_t len;
  uint8_t *b = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 28, 28), }",
                         4 * 784 * 4, &len);
  td_npy_header_t h;
  ck_assert_int_eq(td_npy_parse_header(&h, b, len, len, "t.npy", why, sizeof why), 0);
  ck_assert_uint_eq(h.rows, 4);
  ck_assert_uint_eq(h.row_values, 784);
  ck_assert_uint_eq(h.header_bytes, 128);
  ck_assert_uint_eq(h.data_bytes, 4 * 784 * 4);
  free(b);
}
END_TEST

START_TEST(hostile_headers_are_refused_with_one_line) {
  static const struct {
    const char *dict;
    size_t data;
    const char *says;
  } cases[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 20, "declares 24 bytes"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 28, "holds 28"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
       "4294967296), }",
       16, "beyond the limits"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 999999999999999999, "
       "999999999999999999), }",
       16, "beyond the limits"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 9999999999999999999), }", 4,
       "'shape' is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, -2), }", 4,
       "'shape' is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0, "is empty"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
       "'shape' is not a tuple"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8, "dtype '<c8'"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", 4, "Fortran order"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4,
       "repeated key 'descr'"},
      {"{'descr': '<f4', 'shape': (1,), }", 4, "lacks 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4,
       "unexpected or repeated key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", 4, "text after the dict"},
      {"{'descr': '<f\\4', 'fortran_order': False, 'shape': (1,), }", 4, "'descr' is not"},
      {"['descr', '<f4']", 4, "not a dict"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char why[256] = "";
    ck_assert_msg(parse(cases[i].dict, cases[i].data, why, sizeof why) == TD_ECORRUPT &&
                      strstr(why, cases[i].says) != NULL && strncmp(why, "t.npy: ", 7) == 0,
                  "case %zu: '%s'", i, why);
  }
  /* the length field lies: longer than the file, and over the limit */
  size_t len;
  uint8_t *b = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, &len);
  td_npy_header_t h;
  char why[256];
  b[9] = 0x7f;
  ck_assert_int_eq(td_npy_parse_header(&h, b, len, len, "t.npy", why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "truncated"));
  b[6] = 2; /* v2: a 4-byte length, here huge */
  b[10] = 0xff;
  b[11] = 0xff;
  ck_assert_int_eq(td_npy_parse_header(&h, b, len, len, "t.npy", why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "over the limit"));
  b[6] = 3;
  ck_assert_int_eq(td_npy_parse_header(&h, b, len, len, "t.npy", why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "version 3.0 is not read"));
  /* every prefix of a good file is refused, never read past */
  b[6] = 1;
  b[9] = 0;
  for (size_t cut = 0; cut < len; cut++)
    ck_assert_int_eq(td_npy_parse_header(&h, b, cut, cut, "t.npy", why, sizeof why),
                     TD_ECORRUPT);
  free(b);
}
END_TEST

static Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *files = tcase_create("files");
  tcase_add_checked_fixture(files, make_tmp_dir, remove_tmp_dir);
  tcase_set_timeout(files, 60);
  tcase_add_test(files, float32_features_and_int64_labels_read_back_value_by_value);
  tcase_add_test(files, uint8_features_int32_and_uint8_labels_and_format_v2);
  tcase_add_test(files, the_spec_form_with_a_test_pair);
  tcase_add_test(files, numpy_files_the_loader_must_refuse);
  suite_add_tcase(s, files);
  TCase *header = tcase_create("header");
  tcase_add_test(header, the_header_parser_accepts_what_numpy_writes);
  tcase_add_test(header, hostile_headers_are_refused_with_one_line);
  suite_add_tcase(s, header);
  return s;
}

int main(void) {
  if (!have_numpy())
    fprintf(stderr, "test_npy: /usr/bin/python3 with numpy is missing (Debian: python3-numpy); "
                    "the tests that read NumPy-written files pass without checking\n");
  SRunner *sr = srunner_create(npy_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
