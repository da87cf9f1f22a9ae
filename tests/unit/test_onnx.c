/* test_onnx.c: the ONNX writer (compute/onnx.h), read back with the same
 * generated ONNX messages.
 *
 * An mlp's file says what the format needs (IR version, opset 17, a dynamic
 * batch dimension, the documented input, the logits output), starts with the
 * input normalisation it was given, and holds every parameter bit for bit,
 * little-endian, under its layout name; a gpt's reads int64 tokens and has a
 * causal mask. A stored tensor list that is not the spec's (a shape, a name,
 * a count, an offset past the buffer), a bad spec and a path that cannot be
 * written are refused with one line, and no file is left behind. The
 * evaluation of whole graphs against traind's logits is
 * tests/integration/model_onnx.sh's. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "compute/model.h"
#include "compute/onnx.h"
#include "proto/onnx.pb-c.h"

static char tmp_path[256];

static void setup(void) {
  snprintf(tmp_path, sizeof tmp_path, "/tmp/td_onnx_%d.onnx", (int)getpid());
}
static void teardown(void) { unlink(tmp_path); }

typedef struct {
  td_layout_t *layout;
  td_st_tensor_t *tensors;
  size_t n;
  float *params;
  size_t floats;
} stored_t;

/* A model's layout as trainctl sees a models row: its tensor list and a
 * buffer of recognisable floats. */
static void stored_open(stored_t *s, const char *spec) {
  char why[256] = "";
  ck_assert_msg(td_model_spec_layout(spec, &s->layout, why, sizeof why) == 0, "%s", why);
  s->n = td_layout_count(s->layout);
  s->floats = td_layout_numel(s->layout);
  s->tensors = calloc(s->n, sizeof *s->tensors);
  s->params = calloc(s->floats, sizeof *s->params);
  for (size_t i = 0; i < s->n; i++) {
    const td_tensor_info_t *t = td_layout_tensor(s->layout, i);
    s->tensors[i] =
        (td_st_tensor_t){.name = t->name, .ndim = t->ndim, .offset = t->offset, .numel = t->numel};
    for (uint32_t d = 0; d < t->ndim; d++)
      s->tensors[i].shape[d] = t->shape[d];
    for (size_t j = 0; j < t->numel; j++)
      s->params[t->offset + j] = (float)sin((double)(t->offset + j)) * (float)(i + 1);
  }
}

static void stored_close(stored_t *s) {
  free(s->tensors);
  free(s->params);
  td_layout_free(&s->layout);
}

static Onnx__ModelProto *read_back(void) {
  FILE *f = fopen(tmp_path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)len);
  ck_assert_int_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, (size_t)len, buf);
  free(buf);
  ck_assert_ptr_nonnull(m);
  return m;
}

static const char *meta(const Onnx__ModelProto *m, const char *key) {
  for (size_t i = 0; i < m->n_metadata_props; i++)
    if (strcmp(m->metadata_props[i]->key, key) == 0)
      return m->metadata_props[i]->value;
  return NULL;
}

static const Onnx__TensorProto *init_named(const Onnx__GraphProto *g, const char *name) {
  for (size_t i = 0; i < g->n_initializer; i++)
    if (strcmp(g->initializer[i]->name, name) == 0)
      return g->initializer[i];
  return NULL;
}

static void check_batch_dim(const Onnx__ValueInfoProto *v, size_t ndim) {
  const Onnx__TensorShapeProto *shape = v->type->tensor_type->shape;
  ck_assert_uint_eq(shape->n_dim, ndim);
  ck_assert_int_eq(shape->dim[0]->value_case, ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM);
  ck_assert_str_eq(shape->dim[0]->dim_param, "batch");
}

START_TEST(mlp_graph_says_what_it_is) {
  stored_t s;
  stored_open(&s, "mlp:6-5-3");
  td_st_meta_t kv[] = {{"producer", "traind"}, {"model", "mlp:6-5-3"}};
  td_onnx_opts_t o = {.spec = "mlp:6-5-3",
                      .tensors = s.tensors,
                      .n_tensors = s.n,
                      .params = s.params,
                      .floats = s.floats,
                      .normalize = true,
                      .mean = 0.5,
                      .std = 2.0,
                      .meta = kv,
                      .n_meta = 2};
  char why[256] = "";
  ck_assert_msg(td_onnx_write(tmp_path, &o, why, sizeof why) == 0, "%s", why);
  Onnx__ModelProto *m = read_back();
  ck_assert_int_eq(m->ir_version, 8);
  ck_assert_uint_eq(m->n_opset_import, 1);
  ck_assert_str_eq(m->opset_import[0]->domain, "");
  ck_assert_int_eq(m->opset_import[0]->version, TD_ONNX_OPSET);
  ck_assert_str_eq(meta(m, "producer"), "traind");
  ck_assert_str_eq(meta(m, "input_mean"), "0.5");
  ck_assert_str_eq(meta(m, "input_std"), "2");
  const Onnx__GraphProto *g = m->graph;
  ck_assert_uint_eq(g->n_input, 1);
  ck_assert_str_eq(g->input[0]->name, "input");
  ck_assert_int_eq(g->input[0]->type->tensor_type->elem_type, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  check_batch_dim(g->input[0], 2);
  ck_assert_int_eq(g->input[0]->type->tensor_type->shape->dim[1]->dim_value, 6);
  ck_assert_ptr_nonnull(strstr(g->input[0]->doc_string, "(x - 0.5) / 2"));
  ck_assert_str_eq(g->output[0]->name, "logits");
  check_batch_dim(g->output[0], 2);
  ck_assert_int_eq(g->output[0]->type->tensor_type->shape->dim[1]->dim_value, 3);
  /* normalise, dense + relu, dense: the last node makes the logits */
  static const char *const ops[] = {"Sub", "Div", "Gemm", "Relu", "Gemm"};
  ck_assert_uint_eq(g->n_node, 5);
  for (size_t i = 0; i < 5; i++)
    ck_assert_str_eq(g->node[i]->op_type, ops[i]);
  ck_assert_str_eq(g->node[0]->input[0], "input");
  ck_assert_str_eq(g->node[4]->output[0], "logits");
  ck_assert_str_eq(g->node[2]->attribute[0]->name, "transB");
  ck_assert_int_eq(g->node[2]->attribute[0]->i, 1);
  /* every parameter, bit for bit, little-endian, under its layout name and shape */
  for (size_t i = 0; i < s.n; i++) {
    const Onnx__TensorProto *t = init_named(g, s.tensors[i].name);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
    ck_assert_uint_eq(t->n_dims, s.tensors[i].ndim);
    for (size_t d = 0; d < t->n_dims; d++)
      ck_assert_int_eq(t->dims[d], (int64_t)s.tensors[i].shape[d]);
    ck_assert_uint_eq(t->raw_data.len, 4 * s.tensors[i].numel);
    for (size_t j = 0; j < s.tensors[i].numel; j++) {
      uint32_t want, got = 0;
      memcpy(&want, &s.params[s.tensors[i].offset + j], 4);
      for (int b = 0; b < 4; b++)
        got |= (uint32_t)t->raw_data.data[4 * j + (size_t)b] << (8 * b);
      ck_assert_uint_eq(got, want);
    }
  }
  onnx__model_proto__free_unpacked(m, NULL);
  stored_close(&s);
}
END_TEST

START_TEST(gpt_reads_tokens_through_a_causal_mask) {
  stored_t s;
  stored_open(&s, "gpt:1-8-2-4");
  td_onnx_opts_t o = {.spec = "gpt:1-8-2-4",
                      .tensors = s.tensors,
                      .n_tensors = s.n,
                      .params = s.params,
                      .floats = s.floats};
  char why[256] = "";
  ck_assert_msg(td_onnx_write(tmp_path, &o, why, sizeof why) == 0, "%s", why);
  Onnx__ModelProto *m = read_back();
  const Onnx__GraphProto *g = m->graph;
  ck_assert_ptr_null(meta(m, "input_mean"));
  ck_assert_str_eq(g->input[0]->name, "tokens");
  ck_assert_int_eq(g->input[0]->type->tensor_type->elem_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
  check_batch_dim(g->input[0], 2);
  ck_assert_int_eq(g->input[0]->type->tensor_type->shape->dim[1]->dim_value, 4);
  check_batch_dim(g->output[0], 3);
  ck_assert_int_eq(g->output[0]->type->tensor_type->shape->dim[2]->dim_value, 256);
  ck_assert_str_eq(g->node[0]->op_type, "Gather");
  ck_assert_str_eq(g->node[0]->input[0], "wte.weight");
  ck_assert_str_eq(g->node[0]->input[1], "tokens");
  const Onnx__TensorProto *mask = init_named(g, "causal_mask_4");
  ck_assert_ptr_nonnull(mask);
  ck_assert_uint_eq(mask->raw_data.len, 16 * 4);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      float v;
      memcpy(&v, mask->raw_data.data + 4 * (4 * i + j), 4); /* little-endian hosts */
      ck_assert_msg(j <= i ? v == 0.0f : v < -1e8f, "mask[%d][%d] = %g", i, j, (double)v);
    }
  bool softmax = false;
  for (size_t i = 0; i < g->n_node; i++)
    softmax = softmax || strcmp(g->node[i]->op_type, "Softmax") == 0;
  ck_assert(softmax);
  onnx__model_proto__free_unpacked(m, NULL);
  stored_close(&s);
}
END_TEST

static void expect_refused(const td_onnx_opts_t *o, const char *path, int code, const char *text) {
  char why[256] = "";
  if (code != TD_EIO) { /* td_onnx_check says the same before any file */
    ck_assert_int_eq(td_onnx_check(o, why, sizeof why), code);
    ck_assert_msg(strstr(why, text) != NULL, "'%s' does not say '%s'", why, text);
  }
  ck_assert_int_eq(td_onnx_write(path, o, why, sizeof why), code);
  ck_assert_msg(strstr(why, text) != NULL, "'%s' does not say '%s'", why, text);
  ck_assert_ptr_null(strchr(why, '\n'));
  ck_assert_int_ne(access(path, F_OK), 0);
}

START_TEST(a_row_that_is_not_the_spec_is_refused) {
  stored_t s;
  stored_open(&s, "mlp:6-5-3");
  td_onnx_opts_t o = {.spec = "mlp:6-5-3",
                      .tensors = s.tensors,
                      .n_tensors = s.n,
                      .params = s.params,
                      .floats = s.floats};
  s.tensors[2].shape[0] = 4; /* fc1.weight [4, 5] */
  expect_refused(&o, tmp_path, TD_ESHAPE,
                 "stored tensor 2 is fc1.weight [4,5], the model 'mlp:6-5-3' wants fc1.weight "
                 "[3,5] there");
  s.tensors[2].shape[0] = 3;
  s.tensors[1].name = "fc0.gamma";
  expect_refused(&o, tmp_path, TD_ESHAPE, "stored tensor 1 is fc0.gamma [5]");
  s.tensors[1].name = td_layout_tensor(s.layout, 1)->name;
  o.n_tensors = 3;
  expect_refused(&o, tmp_path, TD_ESHAPE,
                 "the stored model has 3 tensors, the model 'mlp:6-5-3' lays out 4");
  o.n_tensors = s.n;
  o.floats = s.tensors[3].offset + 1; /* fc1.bias runs past the buffer */
  expect_refused(&o, tmp_path, TD_ESHAPE, "stored tensor fc1.bias lies past the end");
  o.floats = s.floats;
  o.spec = "mlp:6-5-3-2";
  expect_refused(&o, tmp_path, TD_ESHAPE, "lays out 6");
  o.spec = "mlp:6-x";
  expect_refused(&o, tmp_path, TD_ECONFIG, "bad layer width 'x'");
  o.spec = "mlp:6-5-3";
  expect_refused(&o, "/nonexistent-dir/m.onnx", TD_EIO, "cannot write /nonexistent-dir/m.onnx");
  char why[256];
  ck_assert_int_eq(td_onnx_write(tmp_path, &o, why, sizeof why), 0);
  stored_close(&s);
}
END_TEST

START_TEST(input_stats_for_tokens_need_no_data) {
  bool normalize = true;
  double mean = -1, std = -1;
  char why[256] = "";
  ck_assert_int_eq(
      td_onnx_input_stats("gpt:1-8-2-4", "/nonexistent", &normalize, &mean, &std, why, sizeof why),
      0);
  ck_assert(!normalize);
  ck_assert_int_eq(td_onnx_input_stats("mlp:4-2", "idx:/nonexistent-a,/nonexistent-b", &normalize,
                                       &mean, &std, why, sizeof why),
                   TD_ENOENT);
  ck_assert(!normalize);
  ck_assert_ptr_nonnull(strstr(why, "/nonexistent-a"));
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("onnx");
  TCase *tc = tcase_create("all");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, mlp_graph_says_what_it_is);
  tcase_add_test(tc, gpt_reads_tokens_through_a_causal_mask);
  tcase_add_test(tc, a_row_that_is_not_the_spec_is_refused);
  tcase_add_test(tc, input_stats_for_tokens_need_no_data);
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
