#!/usr/bin/env bash
# model_use.sh: a run's model put to use, from the ledger.
#  - `trainctl predict RUN` scores the run's recorded test accuracy bit for
#    bit (and its CSV has one row per test image, whose predictions give the
#    same accuracy); --round R scores round R's evaluation;
#  - init = RUN and init = RUN:ROUND: `traind --standalone` scores the loaded
#    model before any step at predict's accuracy, bit for bit; a peer run
#    from RUN begins at its accuracy (its first evaluation, after one step at
#    a negligible learning rate); a round with no checkpoint, a run the ledger
#    does not hold and a mismatched model are one line each;
#  - a small gpt: predict's bits per byte on the held-out text equal
#    standalone's test_bpb for the same model (init = RUN); generate prints
#    the prompt and the bytes after it, the same for the same seed;
#  - a cnn trained on one node, exported, starts a 4-node run that begins at
#    its accuracy; init = RUN on nodes that do not hold that run is refused
#    with one line naming a member;
#  - with the daemon down predict and generate still work; their errors
#    (unknown run, a model that is not a gpt, missing data) are one line.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
PY=
for p in python3 /usr/bin/python3; do
  command -v "$p" >/dev/null && "$p" -c 'import sys' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { echo "skipped: needs python3"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }

mkdir -p "$T/root"
start_node a --data-root "$T/root" || finish
tcp() { "$TRAINCTL" predict "$@" --data-dir "$T/a"; }
tcg() { "$TRAINCTL" generate "$@" --data-dir "$T/a"; }
w() { echo "printf('%016x', run_id) = '$1'"; }
start() { # NODE ARGS...: run_id of the started run
  local node=$1 out
  shift
  out=$(ctl "$node" start "$@") || { fail "start $*: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
}
# a JSON field with every digit (python's repr)
jf() { "$PY" -c 'import json, sys; print(repr(json.loads(sys.argv[1])[sys.argv[2]]))' "$1" "$2"; }
acc_of() { # RUN: the runs row's test_accuracy, every digit
  "$PY" -c 'import sqlite3, sys
r = sqlite3.connect(sys.argv[1]).execute("SELECT test_accuracy FROM runs WHERE printf(\"%016x\", run_id) = ?", (sys.argv[2],)).fetchone()
print(repr(r[0]) if r and r[0] is not None else "")' "$T/a/traind.db" "$1"
}
eval_of() { # RUN ROUND: that round's evaluation, every digit
  "$PY" -c 'import sqlite3, sys
r = sqlite3.connect(sys.argv[1]).execute("SELECT eval_acc FROM rounds WHERE printf(\"%016x\", run_id) = ? AND round = ?", (sys.argv[2], int(sys.argv[3]))).fetchone()
print(repr(r[0]) if r and r[0] is not None else "")' "$T/a/traind.db" "$1" "$2"
}
standalone_init() { # NAME INIT FIELD ARGS...: what --standalone's loaded model scores
  local name=$1 init=$2 field=$3
  shift 3
  run "sa_$name" "$TRAIND" --standalone --data-dir "$T/a" --set init="$init" --set epochs=1 \
    --set node=0/200 --set partition=iid --set threads=1 --json "$@"
  [ "$(rc_of "sa_$name")" = 0 ] || { cat "$T/sa_$name.err"; echo none; return; }
  jf "$(tail -n1 "$T/sa_$name.out")" "$field"
}

# ---- an mlp, a checkpoint each round
MODEL=mlp:784-64-10
start a --set model=$MODEL --set rounds=3 --set local_steps=30 --set batch=64 --set lr=0.1 \
  --set eval_every=1 --set checkpoint_every=1 --set seed=3 || finish
wait_run_state a finished 120 || { fail "mlp run did not finish"; finish; }
mlp=$run_id
want=$(acc_of "$mlp")
run p tcp "$mlp" --data fashion-mnist --json -o "$T/p.csv"
got=$(jf "$(cat "$T/p.out")" accuracy 2>/dev/null)
[ "$(rc_of p)" = 0 ] && [ -n "$want" ] && [ "$got" = "$want" ] \
  && pass "predict RUN: accuracy $got, the run's recorded test accuracy $want" \
  || { fail "predict RUN: '$got', the run recorded '$want'"; cat "$T/p.out" "$T/p.err"; }
csv=$("$PY" - "$T/p.csv" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, body = rows[0], rows[1:]
assert head == ["index", "predicted", "label"] + ["logit_%d" % k for k in range(10)], head
assert [int(r[0]) for r in body] == list(range(len(body)))
for r in body:
    logits = [float(v) for v in r[3:]]
    assert int(r[1]) == logits.index(max(logits)), r
print(len(body), repr(sum(r[1] == r[2] for r in body) / len(body)))
EOF
)
[ "$csv" = "10000 $want" ] && pass "predict -o: 10000 rows, argmax = predicted, accuracy $want" \
  || fail "predict -o: '$csv' (want 10000 rows, accuracy $want)"
run p2 tcp "$mlp" --round 2 --data fashion-mnist --json
r2=$(jf "$(cat "$T/p2.out")" accuracy 2>/dev/null)
e2=$(eval_of "$mlp" 2)
[ -n "$r2" ] && [ "$r2" = "$e2" ] && pass "predict --round 2: $r2, round 2's evaluation $e2" \
  || fail "predict --round 2: '$r2', round 2 evaluated '$e2'"

# init = RUN and RUN:ROUND in standalone: the loaded model, bit for bit
got=$(standalone_init mlp "$mlp" init_test_accuracy --set model=$MODEL)
[ "$got" = "$want" ] && pass "standalone init=RUN scores $got before any step, predict $want" \
  || fail "standalone init=RUN: '$got', predict '$want'"
got=$(standalone_init mlp2 "$mlp:2" init_test_accuracy --set model=$MODEL)
[ -n "$r2" ] && [ "$got" = "$r2" ] \
  && pass "standalone init=RUN:2 scores $got before any step, predict --round 2 $r2" \
  || fail "standalone init=RUN:2: '$got', predict --round 2 '$r2'"
[ -f "$T/a/models/$mlp-r2.safetensors" ] && pass "init=RUN:2 wrote DATA_DIR/models/$mlp-r2.safetensors" \
  || fail "no DATA_DIR/models/$mlp-r2.safetensors"

# a peer run from RUN begins at its accuracy (one step at lr 1e-9)
start a --set model=$MODEL --set init="$mlp" --set rounds=1 --set local_steps=1 --set lr=1e-9 \
  --set eval_every=1 --set seed=9 || finish
wait_run_state a finished 120 || fail "init=RUN run did not finish"
first=$(eval_of "$run_id" 1)
[ -n "$first" ] && awk -v a="$first" -v b="$want" 'BEGIN { d = a - b; exit !(d <= 0.002 && d >= -0.002) }' \
  && pass "peer run with init=RUN: first evaluation $first, the run's model $want" \
  || fail "peer run with init=RUN: first evaluation '$first', the model $want"
[ "$(sql a "SELECT spec LIKE '%init = $mlp%init_hash = ' || '%' FROM runs WHERE $(w "$run_id")")" = 1 ] \
  && pass "the spec keeps init = RUN and the weights' hash" || fail "spec of the init=RUN run"
err=$(ctl a start --set model=$MODEL --set init="$mlp:9" --set rounds=1 2>&1) \
  && fail "init=RUN:9 started: $err"
[ "$err" = "trainctl: error: init: this node's ledger holds no model of run $mlp round 9 (trainctl model $mlp --round 9 looks for it too)" ] \
  && pass "a round with no checkpoint: $err" || fail "init=RUN:9: '$err'"
err=$(ctl a start --set model=$MODEL --set init=ee00000000000000 --set rounds=1 2>&1) \
  && fail "an unknown run as init started: $err"
[ "$err" = "trainctl: error: init: this node's ledger keeps no model of run ee00000000000000 (trainctl runs lists the runs it holds)" ] \
  && pass "init with an unknown run: $err" || fail "init=unknown run: '$err'"
err=$(ctl a start --set model=mlp:784-32-10 --set init="$mlp" --set rounds=1 2>&1) \
  && fail "a mismatched init=RUN started: $err"
[ "$err" = "trainctl: error: run not started: init: tensor fc0.weight has shape [64,784] in $T/a/models/$mlp-r3.safetensors, the model wants [32,784]" ] \
  && pass "mismatched init=RUN: $err" || fail "mismatched init=RUN: '$err'"
run sa_bad "$TRAIND" --standalone --data-dir "$T/a" --set init=ee00000000000000
[ "$(rc_of sa_bad)" = 1 ] && [ "$(wc -l <"$T/sa_bad.err")" = 1 ] \
  && grep -q "^traind: error: init: this node's ledger keeps no model of run ee00000000000000" "$T/sa_bad.err" \
  && pass "standalone with an unknown run: $(cat "$T/sa_bad.err")" || fail "standalone unknown run: $(cat "$T/sa_bad.err")"

# ---- a small gpt: bits per byte as standalone measures them; generate
GPT=gpt:1-32-2-32
start a --set model=$GPT --set rounds=2 --set local_steps=20 --set batch=16 --set lr=0.01 \
  --set optimizer=adamw --set eval_every=1 --set seed=5 || finish
wait_run_state a finished 120 || { fail "gpt run did not finish"; finish; }
gpt=$run_id
run pg tcp "$gpt" --data text:fortunes --json
bpb=$(jf "$(cat "$T/pg.out")" test_bpb 2>/dev/null)
sbpb=$(standalone_init gpt "$gpt" init_test_bpb --set model=$GPT --set batch=16)
[ -n "$bpb" ] && [ "$bpb" = "$sbpb" ] \
  && pass "gpt: predict's bits per byte $bpb, standalone's test_bpb of the same model $sbpb" \
  || { fail "gpt: predict '$bpb', standalone '$sbpb'"; cat "$T/pg.err"; }

# ---- the daemon down: everything below reads the ledger and runs in trainctl
kill "$(cat "$T/a.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/a.pid")" 2>/dev/null || break; sleep 0.1; done
gen() { # NAME ARGS...
  local name=$1
  shift
  run "$name" tcg "$gpt" --prompt "The " --tokens 40 "$@"
  [ "$(rc_of "$name")" = 0 ] || { fail "generate $*: $(cat "$T/$name.err")"; return 1; }
}
gen g7 --seed 7 && gen g7b --seed 7 && gen g8 --seed 8 && gen t0 --temperature 0 --seed 1 &&
  gen t0b --temperature 0 --seed 2
[ "$(head -c 4 "$T/g7.out")" = "The " ] && [ "$(wc -c <"$T/g7.out")" = 45 ] \
  && pass "generate prints the prompt and 40 bytes: $(head -n1 "$T/g7.out" | tr -cd '[:print:]')" \
  || fail "generate's output: $(od -c "$T/g7.out" | head -3)"
cmp -s "$T/g7.out" "$T/g7b.out" && pass "generate: the same seed, the same text" \
  || fail "generate: seed 7 twice gave two texts"
cmp -s "$T/g7.out" "$T/g8.out" && fail "generate: seeds 7 and 8 gave the same text" \
  || pass "generate: another seed, another text"
cmp -s "$T/t0.out" "$T/t0b.out" && pass "generate --temperature 0: greedy, whatever the seed" \
  || fail "generate --temperature 0 depends on the seed"
run ng tcg "$mlp" --prompt x
expect_error ng "generate: the model $MODEL is not a gpt: generate samples bytes from a gpt model"
run nr tcp ee00000000000000 --data fashion-mnist
expect_error nr "no run 'ee00000000000000' in $T/a/traind.db"
run nd tcp "$mlp" --data "csv:$T/none.csv"
expect_error nd "predict: cannot open $T/none.csv: No such file or directory"
run nu tcp "$mlp"
[ "$(rc_of nu)" = 2 ] && grep -q "usage: trainctl predict MODEL --data DATASET" "$T/nu.err" \
  && pass "predict without --data: usage" || fail "predict without --data: $(cat "$T/nu.err")"

# ---- a cnn trained on one node starts a 4-node run
start_node a --data-root "$T/root" || finish
start a --set model=cnn --set rounds=2 --set local_steps=15 --set batch=32 --set lr=0.05 \
  --set eval_every=1000 --set seed=4 || finish
wait_run_state a finished 300 || { fail "cnn run did not finish"; finish; }
cnn=$run_id
cnn_acc=$(acc_of "$cnn")
"$TRAINCTL" model "$cnn" -o "$T/root/cnn.safetensors" --data-dir "$T/a" >/dev/null \
  || fail "export the cnn"
for n in b c d; do
  mkdir -p "$T/root_$n" && cp "$T/root/cnn.safetensors" "$T/root_$n/"
  start_node $n --data-root "$T/root_$n" || finish
  ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"
done
wait_peers a 3 30 || fail "a does not see b, c and d"
# init = RUN: the others do not hold the cnn run
out=$(ctl a start --set model=cnn --set init="$cnn" --set rounds=1 --set local_steps=1 2>&1)
grep -q "node [0-9a-f]\{16\} refused: init: this node's ledger keeps no model of run $cnn" <<<"$out" \
  && pass "init=RUN where members lack the run: $(head -c 200 <<<"$out")" \
  || fail "init=RUN on members without it: '$out'"
for n in a b c d; do
  for i in $(seq 300); do
    case "$(ctl $n status --json 2>/dev/null)" in *'"state":"running"'*) sleep 0.2 ;; *) break ;; esac
  done
done
# (round_timeout 300: the one round waits for all four members, however slowly
# a loaded machine loads their data)
start a --set model=cnn --set init=cnn.safetensors --set rounds=1 --set local_steps=1 \
  --set batch=32 --set lr=1e-9 --set eval_every=1 --set seed=11 \
  --set round_timeout=300 || finish
wait_run_state a finished 300 || fail "the 4-node run did not finish"
members=$(sql a "SELECT members FROM rounds WHERE $(w "$run_id") AND round = 1" | tr ',' '\n' | wc -l)
first=$(eval_of "$run_id" 1)
[ "$members" = 4 ] && [ -n "$first" ] &&
  awk -v a="$first" -v b="$cnn_acc" 'BEGIN { d = a - b; exit !(d <= 0.002 && d >= -0.002) }' \
  && pass "4-node run from the one-node cnn: first evaluation $first, the cnn's $cnn_acc ($members members)" \
  || fail "4-node run from the cnn: first evaluation '$first' with $members members, the cnn $cnn_acc"
finish
