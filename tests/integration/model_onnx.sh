#!/usr/bin/env bash
# model_onnx.sh: `trainctl model RUN -o FILE --format onnx`, checked by code
# that did not write the model.
#  - one-node runs of each model family train a few steps: an mlp, the cnn,
#    the resnet (GroupNorm, residual blocks, a strided conv, a global average
#    pool), a layers: list (avgpool, layernorm, gelu, dropout, a residual
#    block over flat features) and a gpt on the fortunes text;
#  - each run's model is exported as ONNX; Debian's onnx checks it
#    (onnx.checker, full_check) and tests/integration/onnx_eval.py, a small
#    numpy interpreter of the operators traind writes, evaluates it: on the
#    raw Fashion-MNIST test images, read from the dataset's own files (the
#    graph applies the training set's mean and std itself), and on byte
#    windows for the gpt; its logits match traind's (td_logits on the
#    safetensors export of the same run) within 1e-4;
#  - a models row whose tensors do not match its model spec is refused with
#    one line naming the first tensor that differs, and so are a run whose
#    dataset is gone (the graph needs its normalisation) and an unknown
#    format.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
LOGITS="${top_builddir:-$(pwd)}/tests/integration/td_logits"
EVAL="${top_srcdir:-.}/tests/integration/onnx_eval.py"
# Debian's python3-onnx lives in /usr/bin/python3's packages
PY=
for p in /usr/bin/python3 python3; do
  command -v "$p" >/dev/null && "$p" -c 'import numpy, onnx, onnx.checker' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { echo "skipped: needs python3 with numpy and onnx (python3-numpy, python3-onnx)"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
MNIST_DIR=${TRAIND_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
ROWS=200
expect_line() { # NAME TEXT: failed (no signal) with exactly TEXT, one line, on stderr
  local rc
  rc=$(rc_of "$1")
  if [ "$rc" != 0 ] && [ "$rc" -lt 128 ] && [ "$(cat "$T/$1.err")" = "trainctl: error: $2" ]; then
    pass "$1: $(cat "$T/$1.err")"
  else
    fail "$1: exit $rc, stderr '$(cat "$T/$1.err")', expected 'trainctl: error: $2'"
  fi
}

# a small IDX dataset under the data root, cut from Fashion-MNIST's own
# files (1,000 training images, ROWS test images: each run's final evaluation
# stays short), and the raw test images as the dataset reader yields them
# (byte / 255) for the ONNX graphs, which normalise their input themselves
mkdir -p "$T/root"
"$PY" - "$MNIST_DIR" "$T/root" "$T/raw.f32" "$ROWS" <<'EOF'
import gzip, sys
import numpy as np
src, root, raw_path, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def cut(name, count, out):
    raw = gzip.open("%s/%s.gz" % (src, name)).read()
    magic = int.from_bytes(raw[:4], "big")
    images = magic == 0x803
    head, size = (16, 784) if images else (8, 1)
    body = raw[head:head + count * size]
    hdr = magic.to_bytes(4, "big") + count.to_bytes(4, "big") + (raw[8:16] if images else b"")
    open("%s/%s" % (root, out), "wb").write(hdr + body)
    return body
cut("train-images-idx3-ubyte", 1000, "train-images.idx")
cut("train-labels-idx1-ubyte", 1000, "train-labels.idx")
body = cut("t10k-images-idx3-ubyte", rows, "test-images.idx")
cut("t10k-labels-idx1-ubyte", rows, "test-labels.idx")
x = np.frombuffer(body, dtype=np.uint8).astype(np.float32) / np.float32(255)
x.astype("<f4").tofile(raw_path)
EOF
SMALL="idx:$T/root/train-images.idx,$T/root/train-labels.idx,$T/root/test-images.idx,$T/root/test-labels.idx"

start_node a --data-root "$T/root" || finish
tcm() { "$TRAINCTL" model "$@" --data-dir "$T/a"; }
w() { echo "printf('%016x', run_id) = '$1'"; }
train() { # MODEL KEY=VALUE...: a finished one-node run with its model kept; its id in $run_id
  local model=$1 out i
  shift
  local sets=() kv
  for kv in "$@"; do sets+=(--set "$kv"); done
  out=$(ctl a start --set model="$model" --set eval_every=1000 --set seed=5 "${sets[@]}") \
    || { fail "start $model: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  wait_run_state a finished 180 || { fail "$model: the run did not finish"; return 1; }
  for i in $(seq 100); do # the models row follows the state through the ledger's queue
    [ "$(sql a "SELECT count(*) FROM models WHERE $(w "$run_id")")" = 1 ] && return 0
    sleep 0.1
  done
  fail "$model: no models row"
  return 1
}

check_family() { # NAME MODEL KIND DATASET
  local name=$1 model=$2 kind=$3 dataset=$4 out
  run "st_$name" tcm "$run_id" -o "$T/$name.safetensors"
  run "onnx_$name" tcm "$run_id" -o "$T/$name.onnx" --format onnx
  if [ "$(rc_of "onnx_$name")" != 0 ] || [ "$(rc_of "st_$name")" != 0 ]; then
    fail "$name: trainctl model: $(cat "$T/onnx_$name.err" "$T/st_$name.err")"
    return 1
  fi
  grep -q "^wrote $T/$name.onnx: model .* of run $run_id, round [0-9]* (finished), [0-9]* tensors, [0-9]* parameters, ONNX opset 17$" \
    "$T/onnx_$name.out" && pass "$name: $(cat "$T/onnx_$name.out")" \
    || fail "$name: trainctl model --format onnx said '$(cat "$T/onnx_$name.out")'"
  mkdir -p "$T/$name.d"
  cp "$T/raw.f32" "$T/$name.d/raw.f32"
  run "logits_$name" "$LOGITS" "$model" "$T/$name.safetensors" "$dataset" "$ROWS" "$T/$name.d"
  [ "$(rc_of "logits_$name")" = 0 ] || { fail "$name: td_logits: $(cat "$T/logits_$name.err")"; return 1; }
  out=$("$PY" "$EVAL" "$T/$name.onnx" "$kind" "$T/$name.d" 2>&1) \
    && pass "$name: checker passes, numpy evaluation matches traind: $out" \
    || fail "$name: $out"
}

train mlp:784-32-10 dataset="$SMALL" rounds=2 local_steps=10 batch=64 lr=0.1 \
  && check_family mlp mlp:784-32-10 flat "$SMALL"
mlp_run=$run_id
train cnn dataset="$SMALL" rounds=1 local_steps=4 batch=32 lr=0.05 \
  && check_family cnn cnn images "$SMALL"
train resnet dataset="$SMALL" rounds=1 local_steps=2 batch=16 lr=0.05 \
  && check_family resnet resnet images "$SMALL"
LAYERS='layers:input(1,28,28) conv(4,3,stride=2) gelu avgpool(2,stride=1) maxpool(2) flatten dense(32) layernorm dropout(0.1) [ dense(32) relu dense(32) ] relu dense(10)'
train "$LAYERS" dataset="$SMALL" rounds=1 local_steps=5 batch=32 lr=0.05 \
  && check_family layers "$LAYERS" images "$SMALL"
GPT=gpt:2-16-2-16
train $GPT rounds=1 local_steps=5 batch=8 lr=0.003 optimizer=adamw && {
  # byte windows for both evaluators: the start of a fortune file
  head -c 4096 /usr/share/games/fortunes/fortunes >"$T/text.bin" 2>/dev/null \
    || "$PY" -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 16)' >"$T/text.bin"
  check_family gpt $GPT tokens "bytes:$T/text.bin"
}
gpt_run=$run_id

# ---- the stored tensors must be the spec's: one line naming the first that differs
sqlite3 "$T/a/traind.db" "UPDATE models SET model = 'gpt:2-16-4-32' WHERE $(w "$gpt_run")"
run bad_shape tcm "$gpt_run" -o "$T/bad.onnx" --format onnx
expect_line bad_shape "run $gpt_run: stored tensor 1 is wpe.weight [16,16], the model 'gpt:2-16-4-32' wants wpe.weight [32,16] there"
[ ! -e "$T/bad.onnx" ] && pass "no file written for a mismatched row" || fail "bad.onnx written"
sqlite3 "$T/a/traind.db" "UPDATE models SET model = 'gpt:1-16-2-16' WHERE $(w "$gpt_run")"
run bad_count tcm "$gpt_run" -o "$T/bad.onnx" --format onnx
expect_line bad_count "run $gpt_run: the stored model has 28 tensors, the model 'gpt:1-16-2-16' lays out 16"
sqlite3 "$T/a/traind.db" "UPDATE models SET model = 'gpt:2-16-2-16', blob = substr(blob, 1, 4000) WHERE $(w "$gpt_run")"
run short tcm "$gpt_run" -o "$T/bad.onnx" --format onnx
grep -q "run $gpt_run: the ledger's tensor list of its model is damaged" "$T/short.err" \
  && [ "$(wc -l <"$T/short.err")" = 1 ] && pass "a truncated blob: $(cat "$T/short.err")" \
  || fail "a truncated blob: $(cat "$T/short.err")"
# the normalisation comes from the run's dataset: gone, it is one line (and
# safetensors, which needs no data, still works)
mv "$T/root/train-images.idx" "$T/train-images.idx"
run nodata tcm "$mlp_run" -o "$T/nodata.onnx" --format onnx
grep -q "^trainctl: error: run $mlp_run: cannot find the input normalisation its training applied (the ONNX graph starts with it): .*train-images.idx" "$T/nodata.err" \
  && [ "$(wc -l <"$T/nodata.err")" = 1 ] && [ ! -e "$T/nodata.onnx" ] \
  && pass "dataset gone: $(cat "$T/nodata.err")" || fail "dataset gone: '$(cat "$T/nodata.err")'"
run nodata_st tcm "$mlp_run" -o "$T/nodata.safetensors"
[ "$(rc_of nodata_st)" = 0 ] && pass "dataset gone: safetensors still exports" \
  || fail "dataset gone: safetensors: $(cat "$T/nodata_st.err")"
run badfmt tcm "$gpt_run" -o "$T/x.bin" --format tflite
expect_line badfmt "unknown model format 'tflite' (safetensors, onnx)"
finish
