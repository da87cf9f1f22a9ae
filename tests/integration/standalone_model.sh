#!/usr/bin/env bash
# standalone_model.sh: `traind --standalone` keeps its model like a peer run.
#  - a cnn trained alone is a run of its own in the ledger of --data-dir:
#    `trainctl runs` lists it, `trainctl predict RUN` scores its printed final
#    test accuracy bit for bit, `trainctl model RUN` writes the same bytes as
#    --save, and standalone init = RUN scores it before any step;
#  - its --save file starts a 4-node peer run (init = FILE under each node's
#    data root) whose first evaluation is that model's accuracy (one step at
#    a negligible learning rate);
#  - on an images: dataset of RGB files, a cnn (1x28x28) kept by standalone
#    is scored by predict RUN (and td_logits) on the images converted as the
#    run converted them (grey), at standalone's test accuracy; each epoch
#    is a rounds row;
#  - --save refuses a name that is not .safetensors and a folder it cannot
#    write, with one line, before any training; --save without --standalone
#    is refused too.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
PY=
for p in python3 /usr/bin/python3; do
  command -v "$p" >/dev/null && "$p" -c 'import sys' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { echo "skipped: needs python3"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
# a JSON field with every digit (python's repr)
jf() { "$PY" -c 'import json, sys; print(repr(json.loads(sys.argv[1])[sys.argv[2]]))' "$1" "$2"; }
w() { echo "printf('%016x', run_id) = '$1'"; }

# ---- --save's mistakes: one line, before anything trains
run bad_ext "$TRAIND" --standalone --save "$T/cnn.onnx"
expect_error bad_ext "^traind: error: --save '$T/cnn.onnx': name a .safetensors file"
run bad_dir "$TRAIND" --standalone --save "$T/none/cnn.safetensors"
expect_error bad_dir "^traind: error: --save $T/none/cnn.safetensors: cannot write in $T/none: No such file or directory$"
run no_sa "$TRAIND" --save "$T/cnn.safetensors"
expect_error no_sa "^traind: error: --save goes with --standalone"

mkdir -p "$T/a"
# ---- images: predict and td_logits read RGB files as the model's 1x28x28
MKIMAGES="${top_builddir:-$(pwd)}/tests/integration/td_mkimages"
LOGITS="${top_builddir:-$(pwd)}/tests/integration/td_logits"
"$MKIMAGES" "$T/img" 30 28 5 || { fail "td_mkimages"; finish; }
run img "$TRAIND" --standalone --data-dir "$T/a" --save "$T/img.safetensors" --json \
  --set model=cnn --set dataset="images:$T/img" --set epochs=2 --set batch=8 --set lr=0.05 \
  --set threads=1
[ "$(rc_of img)" = 0 ] || { fail "standalone cnn on images: $(cat "$T/img.err")"; finish; }
img_acc=$(jf "$(tail -n1 "$T/img.out")" test_accuracy)
img_run=$(jf "$(tail -n1 "$T/img.out")" run_id | tr -d "'")
run pimg "$TRAINCTL" predict "$img_run" --data "images:$T/img" --json --data-dir "$T/a"
got=$(jf "$(cat "$T/pimg.out")" accuracy 2>/dev/null)
[ "$(rc_of pimg)" = 0 ] && [ -n "$img_acc" ] && [ "$got" = "$img_acc" ] \
  && pass "predict RUN on RGB images (as grey 28x28): $got, standalone's $img_acc" \
  || { fail "predict on images: '$got', standalone '$img_acc'"; cat "$T/pimg.err"; }
rounds=$("$PY" -c 'import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("SELECT round, samples, eval_acc FROM rounds WHERE printf(\"%016x\", run_id) = ? ORDER BY round", (sys.argv[2],)).fetchall()
print(len(rows), [r[0] for r in rows], rows[-1][1], repr(rows[-1][2]))' "$T/a/traind.db" "$img_run")
[ "$rounds" = "2 [1, 2] 72 $img_acc" ] \
  && pass "a rounds row per epoch, the last one's evaluation the test accuracy: $rounds" \
  || fail "rounds rows of the standalone run: '$rounds' (want 2 [1, 2] 72 $img_acc)"
mkdir -p "$T/lg"
run lg "$LOGITS" cnn "$T/img.safetensors" "images:$T/img" 18 "$T/lg"
got=$(sed -nE 's/^rows 18 correct ([0-9]+) .*/\1/p' "$T/lg.out")
[ "$(rc_of lg)" = 0 ] && [ "$(stat -c %s "$T/lg/x.f32")" = $((18 * 784 * 4)) ] &&
  [ "$("$PY" -c "print(repr($got / 18))" 2>/dev/null)" = "$img_acc" ] \
  && pass "td_logits on the images: 18 rows of 784 features, $got correct ($img_acc)" \
  || { fail "td_logits on images: '$(cat "$T/lg.out" "$T/lg.err")'"; }

# ---- a cnn trained alone, kept in a's ledger and in a file
mkdir -p "$T/root_a"
run sa "$TRAIND" --standalone --data-dir "$T/a" --save "$T/root_a/cnn.safetensors" --json \
  --set model=cnn --set epochs=1 --set node=0/60 --set batch=32 --set lr=0.05 --set seed=4 \
  --set threads=1
[ "$(rc_of sa)" = 0 ] || { fail "standalone cnn: $(cat "$T/sa.err")"; finish; }
summary=$(tail -n1 "$T/sa.out")
acc=$(jf "$summary" test_accuracy)
sa_run=$(jf "$summary" run_id | tr -d "'")
grep -q "^kept the model as run $sa_run in $T/a/traind.db (trainctl model $sa_run -o FILE)$" \
  "$T/sa.out" && grep -q "^wrote $T/root_a/cnn.safetensors$" "$T/sa.out" \
  && pass "standalone says where it kept the model: run $sa_run, $T/root_a/cnn.safetensors" \
  || { fail "standalone's output"; cat "$T/sa.out"; }
"$TRAINCTL" runs --data-dir "$T/a" >"$T/runs.out" 2>&1
grep -q "^$sa_run .* cnn .* finished " "$T/runs.out" \
  && pass "trainctl runs lists it: $(grep "^$sa_run" "$T/runs.out" | tr -s ' ')" \
  || { fail "trainctl runs"; cat "$T/runs.out"; }
row=$(sqlite3 "$T/a/traind.db" "SELECT round, state, model FROM models WHERE $(w "$sa_run")")
[ "$row" = "1|finished|cnn" ] && pass "its models row: round = epochs ($row)" \
  || fail "models row: '$row'"

run p "$TRAINCTL" predict "$sa_run" --data fashion-mnist --json --data-dir "$T/a"
got=$(jf "$(cat "$T/p.out")" accuracy 2>/dev/null)
[ "$(rc_of p)" = 0 ] && [ -n "$acc" ] && [ "$got" = "$acc" ] \
  && pass "predict RUN: $got, standalone's final test_accuracy $acc" \
  || { fail "predict RUN: '$got', standalone printed '$acc'"; cat "$T/p.err"; }
run m "$TRAINCTL" model "$sa_run" -o "$T/exported.safetensors" --data-dir "$T/a"
[ "$(rc_of m)" = 0 ] && cmp -s "$T/exported.safetensors" "$T/root_a/cnn.safetensors" \
  && pass "trainctl model RUN writes the bytes of --save" \
  || { fail "trainctl model RUN differs from --save"; cat "$T/m.out" "$T/m.err"; }
run init "$TRAIND" --standalone --data-dir "$T/a" --set init="$sa_run" --set model=cnn \
  --set epochs=1 --set node=0/2000 --set batch=30 --set threads=1 --json
got=$(jf "$(tail -n1 "$T/init.out")" init_test_accuracy 2>/dev/null)
[ "$(rc_of init)" = 0 ] && [ "$got" = "$acc" ] \
  && pass "standalone init=RUN scores $got before any step, as it ended ($acc)" \
  || { fail "standalone init=RUN: '$got', want $acc"; cat "$T/init.err"; }

# ---- a 4-node peer run from the standalone model begins at its accuracy
for n in a b c d; do
  mkdir -p "$T/root_$n"
  [ "$n" = a ] || cp "$T/root_a/cnn.safetensors" "$T/root_$n/"
  start_node $n --data-root "$T/root_$n" || finish
  [ "$n" = a ] || ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"
done
wait_peers a 3 30 || fail "a does not see b, c and d"
# (round_timeout 300: the one round waits for all four members, however slowly
# a loaded machine loads their data)
out=$(ctl a start --set model=cnn --set init=cnn.safetensors --set rounds=1 --set local_steps=1 \
  --set batch=32 --set lr=1e-9 --set eval_every=1 --set seed=11 \
  --set round_timeout=300) || { fail "start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
wait_run_state a finished 300 || fail "the 4-node run did not finish"
members=$(sql a "SELECT members FROM rounds WHERE $(w "$run_id") AND round = 1" | tr ',' '\n' | wc -l)
first=$(sql a "SELECT eval_acc FROM rounds WHERE $(w "$run_id") AND round = 1")
[ "$members" = 4 ] && [ -n "$first" ] &&
  awk -v a="$first" -v b="$acc" 'BEGIN { d = a - b; exit !(d <= 0.002 && d >= -0.002) }' \
  && pass "4-node run from the standalone cnn: first evaluation $first, the model's $acc ($members members)" \
  || fail "4-node run: first evaluation '$first' with $members members, the standalone model $acc"
finish
