/* onnx.h: a trained model as an ONNX inference graph (`trainctl model
 * --format onnx`).
 *
 * One job: the model a spec builds (compute/model.h), with a stored parameter
 * buffer, becomes an ONNX file (opset 17, IR version 8) that any ONNX runtime
 * evaluates to the logits traind computes: the same layers as ONNX operators
 * (Gemm, MatMul, Conv, MaxPool, AveragePool, LayerNormalization, a GroupNorm
 * as Reshape + InstanceNormalization + Mul + Add, GELU in its tanh form from
 * elementary operators, causal attention from MatMul and Softmax, Gather for
 * embeddings), the parameters as initializers under their layout names
 * (fc0.weight, blocks.0.attn.qkv.weight, ...) and the batch dimension
 * dynamic. Feature models take `input` as the dataset reader yields it (an
 * image model [batch, C, H, W], a flat one [batch, F]) and the graph itself
 * applies the training set's normalisation first ((x - mean) / std, both in
 * the graph and in its metadata); gpt takes int64 `tokens` [batch, CONTEXT].
 * The file is written through protobuf-c from proto/onnx.proto, the part of
 * the ONNX schema this needs. Runs on the caller's thread. */
#ifndef TD_ONNX_H
#define TD_ONNX_H

#include <stdbool.h>
#include <stddef.h>

#include "common/safetensors_write.h"

#define TD_ONNX_OPSET 17

typedef struct {
  const char *spec;               /* the model spec the parameters were trained with */
  const td_st_tensor_t *tensors;  /* the stored tensor list (names, shapes, offsets) */
  size_t n_tensors;
  const float *params;            /* the stored buffer the offsets point into */
  size_t floats;                  /* its length in floats */
  bool normalize;                 /* apply (x - mean) / std to the input (feature models) */
  double mean, std;
  const td_st_meta_t *meta;       /* written as the model's metadata_props */
  size_t n_meta;
} td_onnx_opts_t;

/* The input normalisation a run applied: for a feature model, the scalar mean
 * and std of the whole training set of `dataset` (a run's `dataset` key,
 * "auto" meaning fashion-mnist), computed as compute/data/shard.h does, with
 * *normalize true; for a token model, *normalize false. 0, or TD_ECONFIG for
 * a bad spec and the dataset loader's codes, with why. */
int td_onnx_input_stats(const char *spec, const char *dataset, bool *normalize, double *mean,
                        double *std, char *why, size_t why_len);

/* Whether o's stored tensor list is the layout o->spec builds, in order, with
 * its shapes, every tensor inside the buffer (what td_onnx_write checks
 * first; this lets a caller check before it loads a dataset). 0, TD_ESHAPE
 * with why naming the first tensor that differs, TD_ECONFIG for a bad spec. */
int td_onnx_check(const td_onnx_opts_t *o, char *why, size_t why_len);

/* Write the ONNX file of o->spec to path. Every stored tensor must be the one
 * the spec lays out, in order, with its shape, and lie inside the buffer:
 * otherwise TD_ESHAPE with why naming the first that differs. TD_ECONFIG for
 * a bad spec, TD_ERANGE for a model too large for one ONNX file (2 GiB),
 * TD_ENOMEM, TD_EIO ("cannot write PATH: ..."; a partial file is removed). */
int td_onnx_write(const char *path, const td_onnx_opts_t *o, char *why, size_t why_len);

#endif
