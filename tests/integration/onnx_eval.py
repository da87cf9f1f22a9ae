#!/usr/bin/env python3
"""onnx_eval.py: run an ONNX graph that traind exported with numpy alone, for
model_onnx.sh.

    onnx_eval.py MODEL.onnx KIND DIR

checks the file with onnx.checker (full_check: shape inference too), checks
what the graph says of itself (opset, a dynamic batch dimension, the input's
documented normalisation), then evaluates it node by node in float64 with the
small numpy interpreter below, which knows only the operators traind writes,
and compares the logits with traind's own (td_logits). KIND says which
input DIR holds: `images` (DIR/raw.f32, the dataset's raw features, N x 784),
`flat` (the same, fed as [N, 784]) or `tokens` (DIR/x.i32, N x T byte ids).
DIR/logits.f32 holds traind's logits. Prints one line; exits 1 on a mismatch.
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

path, kind, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
model = onnx.load(path)
onnx.checker.check_model(model, full_check=True)
opset = {o.domain: o.version for o in model.opset_import}
assert opset.get("", 0) >= 13, opset
graph = model.graph
meta = {p.key: p.value for p in model.metadata_props}
assert meta["producer"] == "traind", meta
(inp,) = graph.input
(out,) = graph.output
dims = inp.type.tensor_type.shape.dim
assert dims[0].dim_param and not dims[0].HasField("dim_value"), dims[0]
assert out.type.tensor_type.shape.dim[0].dim_param, out
assert inp.doc_string, "the input is not documented"

values = {t.name: numpy_helper.to_array(t).astype(np.float64)
          if t.data_type == onnx.TensorProto.FLOAT else numpy_helper.to_array(t)
          for t in graph.initializer}

if kind == "tokens":
    assert inp.name == "tokens" and inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
    t = dims[1].dim_value
    x = np.fromfile(outdir + "/x.i32", dtype="<i4").reshape(-1, t).astype(np.int64)
else:
    assert inp.name == "input" and inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    # the graph normalises its input itself, with the figures it states
    mean, std = float(meta["input_mean"]), float(meta["input_std"])
    assert ("(x - %s) / %s" % (meta["input_mean"], meta["input_std"])) in inp.doc_string, \
        inp.doc_string
    assert abs(values["input_mean"] - mean) < 1e-6 and abs(values["input_std"] - std) < 1e-6
    shape = [d.dim_value for d in dims[1:]]
    x = np.fromfile(outdir + "/raw.f32", dtype="<f4").reshape([-1] + shape).astype(np.float64)
values[inp.name] = x


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv(a, w, b, strides, pads):
    n, c, h, wd = a.shape
    o, _, k, _ = w.shape
    s = strides[0]
    a = np.pad(a, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (a.shape[2] - k) // s + 1
    wo = (a.shape[3] - k) // s + 1
    y = np.zeros((n, o, ho, wo))
    for i in range(k):
        for j in range(k):
            patch = a[:, :, i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s]
            y += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return y + b[None, :, None, None]


def pool(a, k, s, reduce):
    n, c, h, w = a.shape
    ho, wo = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    y = np.empty((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            y[:, :, i, j] = reduce(a[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]],
                                   axis=(2, 3))
    return y


def normalize(a, axes, eps):
    mean = a.mean(axis=axes, keepdims=True)
    var = ((a - mean) ** 2).mean(axis=axes, keepdims=True)
    return (a - mean) / np.sqrt(var + eps)


used = set()
for node in graph.node:
    used.add(node.op_type)
    i = [values[name] for name in node.input]
    at = attrs(node)
    op = node.op_type
    if op in ("Add", "Sub", "Mul", "Div", "MatMul"):
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
             "MatMul": np.matmul}[op]
        y = [f(i[0], i[1])]
    elif op == "Gemm":
        b = i[1].T if at.get("transB", 0) else i[1]
        a = i[0].T if at.get("transA", 0) else i[0]
        y = [a @ b + (i[2] if len(i) > 2 else 0)]
    elif op == "Relu":
        y = [np.maximum(i[0], 0)]
    elif op == "Tanh":
        y = [np.tanh(i[0])]
    elif op == "Flatten":
        ax = at.get("axis", 1)
        y = [i[0].reshape(int(np.prod(i[0].shape[:ax])), -1)]
    elif op == "Reshape":
        shape = [i[0].shape[k] if v == 0 else int(v) for k, v in enumerate(i[1])]
        y = [i[0].reshape(shape)]
    elif op == "Transpose":
        y = [np.transpose(i[0], at["perm"])]
    elif op == "Conv":
        y = [conv(i[0], i[1], i[2], at["strides"], at["pads"])]
    elif op == "MaxPool":
        y = [pool(i[0], at["kernel_shape"], at["strides"], np.max)]
    elif op == "AveragePool":
        y = [pool(i[0], at["kernel_shape"], at["strides"], np.mean)]
    elif op == "LayerNormalization":
        ax = at.get("axis", -1) % i[0].ndim
        y = [normalize(i[0], tuple(range(ax, i[0].ndim)), at.get("epsilon", 1e-5)) * i[1] + i[2]]
    elif op == "InstanceNormalization":
        a = i[0]
        extra = (1,) * (a.ndim - 2)
        y = [normalize(a, tuple(range(2, a.ndim)), at.get("epsilon", 1e-5))
             * i[1].reshape((-1,) + extra) + i[2].reshape((-1,) + extra)]
    elif op == "Softmax":
        ax = at.get("axis", -1)
        e = np.exp(i[0] - i[0].max(axis=ax, keepdims=True))
        y = [e / e.sum(axis=ax, keepdims=True)]
    elif op == "Split":
        y = np.split(i[0], len(node.output), axis=at.get("axis", 0))
    elif op == "Gather":
        y = [np.take(i[0], i[1], axis=at.get("axis", 0))]
    else:
        sys.exit("onnx_eval: operator %s is not known here" % op)
    for name, v in zip(node.output, y):
        values[name] = v

logits = values[out.name]
theirs = np.fromfile(outdir + "/logits.f32", dtype="<f4").astype(np.float64)
theirs = theirs.reshape(logits.shape)
diff = float(np.abs(logits - theirs).max())
print("%s: opset %d, %d nodes (%s), %d initializers, %d samples, max |logit diff| %.3g"
      % (path.rsplit("/", 1)[-1], opset[""], len(graph.node), " ".join(sorted(used)),
         len(graph.initializer), x.shape[0], diff))
sys.exit(0 if diff < 1e-4 else 1)
