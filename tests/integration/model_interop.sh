#!/usr/bin/env bash
# model_interop.sh: the model leaves traind and comes back.
#  - a one-node run of an mlp and of the cnn on Fashion-MNIST, with the
#    default checkpoint_every = 0, keeps its final model in the ledger
#    (models: round, state, metric, tensor names and shapes);
#  - `trainctl model RUN -o FILE` writes safetensors (daemon up, and down for
#    the cnn); python3 reads it with json, struct and numpy only, checks the
#    format (header length, padding, contiguous offsets, metadata), runs the
#    mlp's and the cnn's forward pass in numpy on 1,000 test images and
#    matches the logits traind computes from the same file (td_logits,
#    td_model_eval) and those `trainctl predict FILE -o CSV` writes, within
#    1e-4, and the accuracy exactly;
#  - round trip: `traind --standalone --set init=FILE` scores the loaded model
#    before any step at the run's own final test accuracy, bit for bit;
#  - a peer run with init = FILE starts from it (its first evaluation is at
#    least that accuracy less a margin for one round of training);
#  - on two nodes, the starting node puts its file's BLAKE2b-256 in the spec:
#    a member whose file differs (one float changed) fails the run with one
#    line, and with the same file both end on the same model;
#  - init with another model's file fails the run with one line naming the
#    first tensor that differs; init outside the data root is refused at
#    start; trainctl model's errors are one line (no such run, a round with
#    no model, a file it cannot write).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
LOGITS="${top_builddir:-$(pwd)}/tests/integration/td_logits"
# the first python3 with numpy (Debian's python3-numpy is in /usr/bin's)
PY=
for p in python3 /usr/bin/python3; do
  command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { echo "skipped: needs python3 with numpy (python3-numpy)"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }

mkdir -p "$T/root"
start_node a --data-root "$T/root" || finish
tcm() { "$TRAINCTL" model "$@" --data-dir "$T/a"; }
w() { echo "printf('%016x', run_id) = '$1'"; }
start() {
  local out
  out=$(ctl a start "$@") || { fail "start $*: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
}
# test_accuracy of a finished run, as the ledger holds it (every digit: repr)
acc_of() {
  "$PY" -c 'import sqlite3, sys
r = sqlite3.connect(sys.argv[1]).execute("SELECT test_accuracy FROM runs WHERE printf(\"%016x\", run_id) = ?", (sys.argv[2],)).fetchone()
print(repr(r[0]) if r and r[0] is not None else "")' "$T/a/traind.db" "$1"
}

# the numpy side: format checks, forward pass, comparison with traind's logits
cat >"$T/check.py" <<'EOF'
import json, struct, sys
import numpy as np

path, kind, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0 and 8 + n <= len(raw), n
header = json.loads(raw[8:8 + n].decode("utf-8"))
assert raw[8:8 + n].rstrip(b" ").endswith(b"}")
meta = header.pop("__metadata__")
assert meta["producer"] == "traind" and all(isinstance(v, str) for v in meta.values()), meta
data = raw[8 + n:]
t, end = {}, 0
for name, info in header.items():  # in file order: contiguous from 0
    b, e = info["data_offsets"]
    assert info["dtype"] == "F32" and b == end, (name, info, end)
    shape = info["shape"]
    assert e - b == 4 * int(np.prod(shape)), (name, info)
    t[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(shape).astype(np.float64)
    end = e
assert end == len(data)

x = np.fromfile(outdir + "/x.f32", dtype="<f4").astype(np.float64)
y = np.fromfile(outdir + "/y.i32", dtype="<i4")
rows = y.shape[0]
x = x.reshape(rows, -1)
relu = lambda a: np.maximum(a, 0)

def dense(a, name):  # PyTorch's nn.Linear: weight [out, in]
    return a @ t[name + ".weight"].T + t[name + ".bias"]

def conv_pad1(a, name):  # weight [OUT, C, K, K], stride 1, padding 1
    wgt, bias = t[name + ".weight"], t[name + ".bias"]
    o, c, k, _ = wgt.shape
    r, _, h, w_ = a.shape
    p = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((r, o, h, w_))
    for i in range(k):
        for j in range(k):
            out += np.einsum("rchw,oc->rohw", p[:, :, i:i + h, j:j + w_], wgt[:, :, i, j])
    return out + bias[None, :, None, None]

def maxpool2(a):
    r, c, h, w_ = a.shape
    return a.reshape(r, c, h // 2, 2, w_ // 2, 2).max(axis=(3, 5))

if kind == "mlp":
    names = sorted({k.split(".")[0] for k in t}, key=lambda s: int(s[2:]))
    a = x
    for i, name in enumerate(names):
        a = dense(a, name)
        if i + 1 < len(names):
            a = relu(a)
    logits = a
else:  # cnn: conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) dense(128) relu dense(10)
    assert list(t["conv0.weight"].shape) == [32, 1, 3, 3], t["conv0.weight"].shape
    a = x.reshape(rows, 1, 28, 28)
    a = maxpool2(relu(conv_pad1(a, "conv0")))
    a = maxpool2(relu(conv_pad1(a, "conv1")))
    a = relu(dense(a.reshape(rows, -1), "fc0"))
    logits = dense(a, "fc1")

theirs = np.fromfile(outdir + "/logits.f32", dtype="<f4").reshape(rows, -1).astype(np.float64)
diff = float(np.abs(logits - theirs).max())
correct = int((logits.argmax(axis=1) == y).sum())
print("%s: %d images, max |logit diff| %.3g, numpy correct %d" % (kind, rows, diff, correct))
assert diff < 1e-4, diff
if len(sys.argv) > 4:  # trainctl predict's CSV: index, predicted, label, logit_0...
    import csv
    body = list(csv.reader(open(sys.argv[4])))[1:rows + 1]
    pred = np.array([[float(v) for v in r[3:]] for r in body])
    assert [int(r[2]) for r in body] == list(y), "predict's labels differ"
    pdiff = float(np.abs(logits - pred).max())
    print("%s: trainctl predict's logits on the same %d images: max |diff| %.3g" % (kind, rows, pdiff))
    assert pdiff < 1e-4, pdiff
EOF

export_and_check() { # NAME KIND RUN FILE
  local name=$1 kind=$2 id=$3 file=$4 out
  run "exp_$name" tcm "$id" -o "$file"
  if [ "$(rc_of "exp_$name")" != 0 ]; then fail "$name: trainctl model"; cat "$T/exp_$name.err"; return 1; fi
  grep -q "^wrote $file: model .* of run $id, round [0-9]* (finished)" "$T/exp_$name.out" \
    && pass "$name: $(cat "$T/exp_$name.out")" || fail "$name: trainctl model said $(cat "$T/exp_$name.out")"
  mkdir -p "$T/$name.pred"
  run "pred_$name" "$LOGITS" "$MODEL" "$file" fashion-mnist 1000 "$T/$name.pred"
  [ "$(rc_of "pred_$name")" = 0 ] || { fail "$name: td_logits"; cat "$T/pred_$name.err"; return 1; }
  run "tcpred_$name" "$TRAINCTL" predict "$file" --data fashion-mnist -o "$T/$name.pred/preds.csv"
  [ "$(rc_of "tcpred_$name")" = 0 ] || { fail "$name: trainctl predict"; cat "$T/tcpred_$name.err"; return 1; }
  out=$("$PY" "$T/check.py" "$file" "$kind" "$T/$name.pred" "$T/$name.pred/preds.csv" 2>&1) \
    && pass "$out (traind: $(cat "$T/pred_$name.out"))" || { fail "$name: numpy check: $out"; return 1; }
  local theirs mine
  theirs=$(sed -E 's/.*correct ([0-9]+).*/\1/' "$T/pred_$name.out")
  mine=$(sed -nE 's/.*numpy correct ([0-9]+).*/\1/p' <<<"$out")
  [ "$theirs" = "$mine" ] && pass "$name: numpy and traind agree on the 1000 predictions' accuracy ($mine)" \
    || fail "$name: numpy correct $mine, traind $theirs"
}

round_trip() { # NAME FILE RUN
  local name=$1 file=$2 id=$3 json init want
  run "rt_$name" "$TRAIND" --standalone --set model="$MODEL" --set init="$file" --set epochs=1 \
    --set node=0/100 --set partition=iid \
    --set batch=64 --set threads=1 --json
  [ "$(rc_of "rt_$name")" = 0 ] || { fail "$name: standalone init"; cat "$T/rt_$name.err"; return 1; }
  json=$(tail -n1 "$T/rt_$name.out")
  init=$("$PY" -c 'import json,sys; print(repr(json.loads(sys.argv[1])["init_test_accuracy"]))' "$json")
  want=$(acc_of "$id")
  [ -n "$want" ] && [ "$init" = "$want" ] \
    && pass "$name: round trip: standalone init= scores $init before any step, the run's own $want" \
    || fail "$name: round trip: init scores '$init', the run ended at '$want'"
}

# ---- mlp: final model kept with checkpoint_every = 0
MODEL=mlp:784-64-10
start --set model=$MODEL --set rounds=3 --set local_steps=30 --set batch=64 --set lr=0.1 \
  --set eval_every=1000 --set seed=3 || finish
wait_run_state a finished 120 || { fail "mlp run did not finish"; finish; }
mlp_run=$run_id
row=$(sql a "SELECT round, state, model, typeof(metric), length(blob) FROM models WHERE $(w $mlp_run)")
[ "$row" = "3|finished|$MODEL|real|$(( (64 * 784 + 64 + 10 * 64 + 16) * 4 ))" ] \
  && pass "mlp: the ledger keeps the final model (round|state|model|metric|bytes: $row)" \
  || fail "mlp: models row '$row'"
[ "$(sql a "SELECT count(*) FROM checkpoints")" = 0 ] && pass "mlp: no checkpoints asked, none written" \
  || fail "mlp: checkpoints written"
tensors=$(sql a "SELECT tensors FROM models WHERE $(w $mlp_run)")
"$PY" -c '
import json, sys; t = json.loads(sys.argv[1])
assert [(x["name"], x["shape"]) for x in t] == [("fc0.weight", [64, 784]), ("fc0.bias", [64]),
    ("fc1.weight", [10, 64]), ("fc1.bias", [10])], t' "$tensors" \
  && pass "mlp: the row names its tensors and shapes" || fail "mlp: tensors $tensors"
export_and_check mlp mlp "$mlp_run" "$T/root/mlp.safetensors"
round_trip mlp "$T/root/mlp.safetensors" "$mlp_run"

# ---- trainctl model's errors: one line each
run nosuch tcm ee00000000000000 -o "$T/x.safetensors"
expect_error nosuch "no run 'ee00000000000000'"
run noround tcm "$mlp_run" --round 2 -o "$T/x.safetensors"
expect_error noround "run $mlp_run has no model of round 2"
run nowrite tcm "$mlp_run" -o "$T/nodir/x.safetensors"
expect_error nowrite "cannot write $T/nodir/x.safetensors: No such file or directory"
run badfmt tcm "$mlp_run" -o "$T/x.tflite" --format tflite
expect_error badfmt "unknown model format 'tflite'"

# ---- a peer run from the exported mlp; a wrong file; a file outside the data root
start --set model=$MODEL --set init=mlp.safetensors --set rounds=1 --set local_steps=5 \
  --set batch=64 --set lr=0.01 --set eval_every=1 --set seed=9 || finish
wait_run_state a finished 120 || fail "init run did not finish"
from=$(acc_of "$mlp_run"); got=$(acc_of "$run_id")
awk -v a="$got" -v b="$from" 'BEGIN { exit !(a >= b - 0.03) }' \
  && pass "peer run with init=: starts from the file (test accuracy $got after one short round; file $from)" \
  || fail "peer run with init=: $got, the file scores $from"
# start loads the model on the starting node before it answers: the
# mismatch is start's own one-line error
err=$(ctl a start --set model=mlp:784-32-10 --set init=mlp.safetensors --set rounds=1 \
  --set local_steps=2 2>&1) && fail "a mismatched init started: $err"
[ "$err" = "trainctl: error: run not started: init: tensor fc0.weight has shape [64,784] in $T/root/mlp.safetensors, the model wants [32,784]" ] \
  && pass "mismatched init: $err" || fail "mismatched init: '$err'"
cp "$T/root/mlp.safetensors" "$T/outside.safetensors"
out=$(ctl a start --set model=$MODEL --set init="$T/outside.safetensors" 2>&1) \
  && fail "init outside the data root started: $out"
grep -q "init path '.*outside.safetensors' is not a file under the data root" <<<"$out" \
  && pass "init outside the data root refused: $out" || fail "init outside the root: '$out'"

# ---- two nodes: every member must hold the same file, checked by hash
mkdir -p "$T/rootb"
start_node b --data-root "$T/rootb" || finish
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
wait_peers a 1 15 || fail "a does not see b"
"$PY" - "$T/root/mlp.safetensors" "$T/rootb/mlp.safetensors" <<'EOF'
import sys
raw = bytearray(open(sys.argv[1], "rb").read())
raw[-1] ^= 0x01  # one float of fc1.bias, a little different
open(sys.argv[2], "wb").write(raw)
EOF
idle() { # NAME: wait until NAME runs nothing
  local i
  for i in $(seq 300); do
    case "$(ctl "$1" status --json 2>/dev/null)" in *'"state":"running"'*) sleep 0.2 ;; *) return 0 ;; esac
  done
}
# start waits for the members and names b's refusal: the run is stopped (no
# other member) or goes on without b, as the answers arrive
out=$(ctl a start --set model=$MODEL --set init=mlp.safetensors --set rounds=1 \
  --set local_steps=2 2>&1)
grep -q "node [0-9a-f]\{16\} refused: init: $T/rootb/mlp.safetensors is not the file the run was started with" <<<"$out" \
  && pass "start names the member with another file: $out" || fail "start with another file on b: '$out'"
wait_run_state b failed 60 || fail "b ran with another file"
err=$(json_field "$(ctl b status --json)" error | sed 's#\\/#/#g')
grep -q "^init: $T/rootb/mlp.safetensors is not the file the run was started with (BLAKE2b-256 [0-9a-f]\{16\}\.\.\. here, [0-9a-f]\{16\}\.\.\. on the starting node): every member needs the same file$" <<<"$err" \
  && pass "another file on a member: $err" || fail "another file on b: '$err'"
idle a; idle b
cp "$T/root/mlp.safetensors" "$T/rootb/mlp.safetensors"
start --set model=$MODEL --set init=mlp.safetensors --set rounds=2 --set local_steps=5 \
  --set lr=0.01 --set eval_every=1 --set checkpoint_every=1 || finish
for n in a b; do wait_run_state $n finished 120 || fail "same file: $n did not finish"; done
[ "$(sql a "SELECT spec LIKE '%init_hash = ' || '%' FROM runs WHERE $(w "$run_id")")" = 1 ] \
  && pass "the spec carries the file's hash" || fail "no init_hash in the spec"
a1=$(json_field "$(ctl a status --json)" test_accuracy); b1=$(json_field "$(ctl b status --json)" test_accuracy)
[ -n "$a1" ] && [ "$a1" = "$b1" ] && pass "same file on both: one model at the end ($a1)" \
  || fail "same file: accuracies '$a1' '$b1'"
# --round R: that round's checkpoint, named and shaped like the final model
run ckpt tcm "$run_id" --round 1 -o "$T/ckpt1.safetensors"
if [ "$(rc_of ckpt)" = 0 ] && grep -q "round 1 (checkpoint), 4 tensors" "$T/ckpt.out" &&
   "$PY" -c '
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); assert h["__metadata__"]["round"] == "1", h["__metadata__"]
assert h["fc0.weight"]["shape"] == [64, 784], h' "$T/ckpt1.safetensors"; then
  pass "--round 1: $(cat "$T/ckpt.out")"
else fail "--round 1"; cat "$T/ckpt.out" "$T/ckpt.err"; fi
kill "$(cat "$T/b.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/b.pid")" 2>/dev/null || break; sleep 0.1; done

# a stopped run keeps the model of the last round it applied
start --set model=$MODEL --set rounds=100000 --set local_steps=1 --set eval_every=100000 \
  --set slowdown=20 || finish
for i in $(seq 300); do
  [ "$(sql a "SELECT count(*) FROM rounds WHERE $(w "$run_id")" 2>/dev/null)" -ge 2 ] && break
  sleep 0.1
done
ctl a stop >/dev/null || fail "stop"
wait_run_state a stopped 60 || fail "the run did not stop"
row=$(sql a "SELECT state, round >= 2 FROM models WHERE $(w "$run_id")")
[ "$row" = "stopped|1" ] && pass "a stopped run keeps its last model (state|round >= 2: $row)" \
  || fail "stopped run's models row: '$row'"

# ---- cnn, exported with the daemon down
MODEL=cnn
start --set model=cnn --set rounds=2 --set local_steps=15 --set batch=32 --set lr=0.05 \
  --set eval_every=1000 --set seed=4 || finish
wait_run_state a finished 300 || { fail "cnn run did not finish"; finish; }
cnn_run=$run_id
kill "$(cat "$T/a.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/a.pid")" 2>/dev/null || break; sleep 0.1; done
export_and_check cnn cnn "$cnn_run" "$T/root/cnn.safetensors"
round_trip cnn "$T/root/cnn.safetensors" "$cnn_run"
finish
