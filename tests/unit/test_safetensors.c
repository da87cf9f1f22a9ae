/* test_safetensors.c: the safetensors writer and reader (compute/safetensors.h).
 *
 * A model's layout written and read back is bit-identical, with its names,
 * shapes and metadata, and the file's bytes are the format's (header length,
 * space padding to 8, offsets contiguous from 0). Loading checks the file
 * against a model tensor by tensor and names the first difference. Every
 * hostile header is refused with TD_ECORRUPT: a length past the end, offsets
 * past the end, overlapping or with a gap, a wrong dtype, a shape product
 * that overflows, a name given twice, metadata that is not strings, a file
 * that is not a regular file. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/model.h"
#include "compute/safetensors.h"

static char tmp_path[256];

static void setup(void) {
  snprintf(tmp_path, sizeof tmp_path, "/tmp/td_st_%d.safetensors", (int)getpid());
}
static void teardown(void) { unlink(tmp_path); }

/* A file from a header text and `floats` zero floats of data. */
static uint8_t *make(const char *header, size_t floats, size_t *len) {
  size_t n = strlen(header);
  *len = 8 + n + 4 * floats;
  uint8_t *b = calloc(1, *len);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(b + 8, header, n);
  return b;
}

static int parse_text(const char *header, size_t floats, char *why, size_t why_len) {
  size_t len;
  uint8_t *b = make(header, floats, &len);
  td_safetensors_t *st = NULL;
  int rc = td_safetensors_parse(&st, b, len, why, why_len);
  td_safetensors_close(&st);
  free(b);
  return rc;
}

START_TEST(round_trip_cnn) {
  td_layout_t *layout = NULL;
  char why[256] = "";
  ck_assert_int_eq(td_model_spec_layout("cnn", &layout, why, sizeof why), 0);
  size_t numel = td_layout_numel(layout);
  float *params = td_params_alloc(numel), *back = td_params_alloc(numel);
  for (size_t i = 0; i < td_layout_count(layout); i++) {
    const td_tensor_info_t *t = td_layout_tensor(layout, i);
    for (size_t j = 0; j < t->numel; j++)
      params[t->offset + j] = (float)sin((double)(t->offset + j)) * 1e-3f * (float)(i + 1);
  }
  td_safetensors_meta_t meta[] = {{"model", "cnn"}, {"run_id", "00000000000000ab"}};
  ck_assert_int_eq(td_safetensors_write(tmp_path, layout, params, meta, 2, why, sizeof why), 0);

  /* the bytes: header length, '{', space padding to a multiple of 8 */
  FILE *f = fopen(tmp_path, "rb");
  uint8_t len8[8];
  ck_assert_uint_eq(fread(len8, 1, 8, f), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--)
    n = n << 8 | len8[i];
  ck_assert_uint_eq(n % 8, 0);
  char *header = calloc(1, n + 1);
  ck_assert_uint_eq(fread(header, 1, n, f), n);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  ck_assert_int_eq(header[0], '{');
  ck_assert_ptr_nonnull(strstr(header, "\"conv0.weight\":{\"dtype\":\"F32\",\"shape\":[32,1,3,3],"
                                       "\"data_offsets\":[0,1152]}"));
  ck_assert_ptr_nonnull(strstr(header, "\"__metadata__\":{\"model\":\"cnn\""));
  ck_assert_uint_eq((uint64_t)size, 8 + n + 4 * td_layout_param_count(layout));
  free(header);

  td_safetensors_t *st = NULL;
  ck_assert_int_eq(td_safetensors_open(&st, tmp_path, why, sizeof why), 0);
  ck_assert_uint_eq(td_safetensors_count(st), td_layout_count(layout));
  ck_assert_str_eq(td_safetensors_tensor(st, 0)->name, "conv0.weight");
  ck_assert_uint_eq(td_safetensors_tensor(st, 0)->shape[0], 32);
  ck_assert_uint_eq(td_safetensors_tensor(st, 0)->shape[3], 3);
  ck_assert_str_eq(td_safetensors_meta(st, "run_id"), "00000000000000ab");
  ck_assert_ptr_null(td_safetensors_meta(st, "nope"));
  ck_assert_int_eq(td_safetensors_load(st, layout, back, "F", why, sizeof why), 0);
  ck_assert_int_eq(memcmp(params, back, numel * sizeof(float)), 0);
  /* the hash of what was read is the streamed hash of the file */
  char hex[TD_SAFETENSORS_HASH_HEX];
  ck_assert_int_eq(td_safetensors_file_hash(tmp_path, hex, why, sizeof why), 0);
  ck_assert_uint_eq(strlen(hex), 64);
  ck_assert_str_eq(hex, td_safetensors_hash(st));

  /* the same file into a model of another shape: one line naming the first tensor */
  td_layout_t *other = NULL;
  ck_assert_int_eq(
      td_model_spec_layout("layers:input(1,28,28) conv(16,3,pad=1) relu maxpool(2) flatten "
                           "dense(10)",
                           &other, why, sizeof why),
      0);
  float *third = td_params_alloc(td_layout_numel(other));
  ck_assert_int_eq(td_safetensors_load(st, other, third, "F", why, sizeof why), TD_ESHAPE);
  ck_assert_str_eq(why, "tensor conv0.weight has shape [32,1,3,3] in F, the model wants "
                        "[16,1,3,3]");
  td_params_free(&third);
  td_layout_free(&other);
  td_safetensors_close(&st);
  td_params_free(&params);
  td_params_free(&back);
  td_layout_free(&layout);
}
END_TEST

START_TEST(gpt_names_say_the_layer) {
  td_layout_t *layout = NULL;
  char why[256];
  ck_assert_int_eq(td_model_spec_layout("gpt:2-16-2-8", &layout, why, sizeof why), 0);
  const char *want[] = {"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
                        "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
                        "blocks.0.attn.proj.weight"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_str_eq(td_layout_tensor(layout, i)->name, want[i]);
  const td_tensor_info_t *last = td_layout_tensor(layout, td_layout_count(layout) - 1);
  ck_assert_str_eq(last->name, "ln_f.bias");
  ck_assert_uint_eq(td_layout_tensor(layout, 4)->shape[0], 48);
  ck_assert_uint_eq(td_layout_tensor(layout, 4)->shape[1], 16);
  td_layout_free(&layout);
}
END_TEST

START_TEST(missing_and_extra_tensors) {
  char why[256];
  td_layout_t *model = NULL;
  ck_assert_int_eq(td_model_spec_layout("mlp:2-3", &model, why, sizeof why), 0);
  float *p = td_params_alloc(td_layout_numel(model));
  size_t len;
  uint8_t *b = make("{\"fc0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}}",
                    6, &len);
  td_safetensors_t *st = NULL;
  ck_assert_int_eq(td_safetensors_parse(&st, b, len, why, sizeof why), 0);
  ck_assert_int_eq(td_safetensors_load(st, model, p, "F", why, sizeof why), TD_ESHAPE);
  ck_assert_str_eq(why, "tensor fc0.bias [3] is not in F");
  td_safetensors_close(&st);
  free(b);
  b = make("{\"fc0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
           "\"fc0.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]},"
           "\"fc9.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[36,40]}}",
           10, &len);
  ck_assert_int_eq(td_safetensors_parse(&st, b, len, why, sizeof why), 0);
  ck_assert_int_eq(td_safetensors_load(st, model, p, "F", why, sizeof why), TD_ESHAPE);
  ck_assert_str_eq(why, "F has tensor fc9.bias, which the model does not have");
  td_safetensors_close(&st);
  free(b);
  td_params_free(&p);
  td_layout_free(&model);
}
END_TEST

#define T1(offs) "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" offs "}}"

START_TEST(hostile_headers) {
  char why[256];
  /* the good one first: the hostile ones differ from it in one thing */
  ck_assert_int_eq(parse_text(T1("[0,8]"), 2, why, sizeof why), 0);
  ck_assert_int_eq(parse_text(T1("[0,8]") "   ", 2, why, sizeof why), 0);
  /* header length past the end */
  size_t len;
  uint8_t *b = make(T1("[0,8]"), 2, &len);
  b[0] = 0xff;
  b[3] = 0x01;
  td_safetensors_t *st = NULL;
  ck_assert_int_eq(td_safetensors_parse(&st, b, len, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "does not fit"));
  b[7] = 0x80; /* a length near 2^64: no overflow in the check */
  ck_assert_int_eq(td_safetensors_parse(&st, b, len, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(td_safetensors_parse(&st, b, 5, why, sizeof why), TD_ECORRUPT);
  free(b);
  /* offsets past the end of the data */
  ck_assert_int_eq(parse_text(T1("[0,8]"), 1, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "outside the data"));
  ck_assert_int_eq(parse_text(T1("[8,0]"), 2, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text(T1("[0,12]"), 3, why, sizeof why), TD_ECORRUPT); /* != shape */
  ck_assert_int_eq(parse_text(T1("[-8,0]"), 2, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text(T1("[0,18446744073709551615]"), 2, why, sizeof why),
                   TD_ECORRUPT);
  /* overlapping, a gap, not covering the data */
  const char *overlap = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
  ck_assert_int_eq(parse_text(overlap, 3, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "overlap"));
  const char *gap = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}";
  ck_assert_int_eq(parse_text(gap, 4, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "gap"));
  ck_assert_int_eq(parse_text(T1("[0,8]"), 3, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "cover 8 of the 12"));
  /* wrong dtype, overflowing shape, bad shape entries */
  ck_assert_int_eq(parse_text("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                              1, why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "dtype F16"));
  ck_assert_int_eq(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967295,4294967295,"
                              "4294967295,4294967295],\"data_offsets\":[0,0]}}",
                              0, why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "overflows"));
  ck_assert_int_eq(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296],"
                              "\"data_offsets\":[0,0]}}",
                              0, why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_int_eq(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],"
                              "\"data_offsets\":[0,4]}}",
                              1, why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_int_eq(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],"
                              "\"data_offsets\":[0,4]}}",
                              1, why, sizeof why),
                   TD_ECORRUPT);
  /* a name given twice (json-c alone would keep the last one) */
  const char *twice = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
  ck_assert_int_eq(parse_text(twice, 2, why, sizeof why), TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "twice"));
  /* not JSON, not an object, trailing bytes, metadata that is not strings */
  ck_assert_int_eq(parse_text("{\"a\":", 0, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text("[1,2]", 0, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text(T1("[0,8]") "x", 2, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text("{\"__metadata__\":{\"k\":1}}", 0, why, sizeof why), TD_ECORRUPT);
  ck_assert_int_eq(parse_text("{\"__metadata__\":{\"k\":\"v\"}}", 0, why, sizeof why), 0);
}
END_TEST

START_TEST(not_a_regular_file) {
  char why[256];
  td_safetensors_t *st = NULL;
  ck_assert_int_eq(td_safetensors_open(&st, "/tmp", why, sizeof why), TD_EIO);
  ck_assert_str_eq(why, "/tmp is not a regular file");
  ck_assert_int_eq(td_safetensors_open(&st, "/nonexistent/x.safetensors", why, sizeof why),
                   TD_ENOENT);
  ck_assert_ptr_null(st);
  td_layout_t *layout = NULL;
  ck_assert_int_eq(td_model_spec_layout("mlp:2-3", &layout, why, sizeof why), 0);
  float *p = td_params_alloc(td_layout_numel(layout));
  ck_assert_int_eq(td_safetensors_write("/nonexistent/dir/x.safetensors", layout, p, NULL, 0,
                                        why, sizeof why),
                   TD_EIO);
  ck_assert_ptr_nonnull(strstr(why, "cannot write /nonexistent/dir/x.safetensors"));
  td_params_free(&p);
  td_layout_free(&layout);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("all");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, round_trip_cnn);
  tcase_add_test(tc, gpt_names_say_the_layer);
  tcase_add_test(tc, missing_and_extra_tensors);
  tcase_add_test(tc, hostile_headers);
  tcase_add_test(tc, not_a_regular_file);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
