#!/usr/bin/env bash
# cluster_replay.sh: history is append-only. Two real nodes finish a run; then
# a member holding an admitted *admin* key (td_runstart_peer) sends each of
# them RunStarts that would rewrite it: the finished run's id with another
# spec, the same id with its own spec (a replay), and run id 0. Each node
# refuses each one with a one-line reason sent back to the sender, logs it
# and counts it (drops.reused_run_id); neither starts a run, and the finished
# run's runs row (state, test_accuracy, spec) and every one of its rounds rows
# are byte for byte what they were.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
PEER="${top_builddir:-$(pwd)}/tests/integration/td_runstart_peer"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }

for n in a b; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 15 || fail "$n does not see its peer"; done
[ "$failures" -eq 0 ] && pass "two nodes" || finish

out=$(ctl a start --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=6 \
      --set lr=0.05 --set seed=5) || { fail "start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
for n in a b; do wait_run_state $n finished 120 || fail "$n did not finish run $run_id"; done
[ "$failures" -eq 0 ] && pass "run $run_id finished on a and b" || finish

w="printf('%016x', run_id) = '$run_id'"
# record NAME: the finished run's rows in NAME's ledger, every column
record() {
  sql "$1" "SELECT state, quote(test_accuracy), ended, spec FROM runs WHERE $w"
  sql "$1" "SELECT * FROM rounds WHERE $w ORDER BY round"
  sql "$1" "SELECT count(*) FROM updates WHERE $w"
}
for n in a b; do record $n >"$T/$n.before"; done
acc_a=$(sql a "SELECT test_accuracy FROM runs WHERE $w")
rounds_a=$(sql a "SELECT count(*) FROM rounds WHERE $w")
[ "$rounds_a" -eq 6 ] && pass "a's ledger: test_accuracy $acc_a, 6 rounds" \
  || fail "a's ledger has $rounds_a rounds of the run"
spec=$(sql a "SELECT replace(spec, char(10), ';') FROM runs WHERE $w") # exactly its text

# the attacker: an admitted admin member (it may start runs anywhere)
read -r PPUB PSEC <<<"$("$PEER" --keygen)"
export TD_PEER_PUBLIC=$PPUB TD_PEER_SECRET=$PSEC
for n in a b; do ctl $n allow --admin "$PPUB" >/dev/null || fail "$n does not admit the peer"; done
id_of() { cat "$T/$1/node_id"; }
TARGETS=()
for n in a b; do TARGETS+=("$(id_of $n)=$(endpoint_of $n),$(key_of $n)"); done
drop_of() { sed -E "s/.*\"$2\":([0-9]+).*/\1/" <<<"$(ctl "$1" status --json)"; }
d0=$(drop_of a reused_run_id)

# replay NAME RUN_ID SPEC PATTERN: both nodes refuse once, with PATTERN
replay() {
  local name=$1 id=$2 spec=$3 pattern=$4 got n line
  got=$(TD_PEER_RUN_ID=$id "$PEER" "$spec" 2 "${TARGETS[@]}")
  for n in a b; do
    line=$(grep "^refused $(id_of $n) " <<<"$got")
    if [ "$(grep -c "^refused $(id_of $n) " <<<"$got")" -ne 1 ]; then
      fail "$name: $n did not refuse once: $got"
    elif ! grep -qE -- "$pattern" <<<"$line"; then
      fail "$name: $n's reason does not match /$pattern/: $line"
    else
      pass "$name: $n refused: ${line#refused * }"
    fi
  done
}
replay "the finished run's id, another spec" "$run_id" "model = mlp:784-16-10;rounds = 3;lr = 0.9" \
  "run $run_id: this node already recorded that run id with another spec"
replay "the finished run's id, its own spec" "$run_id" "$spec" \
  "run $run_id: this node already recorded that run as ended"
replay "run id 0" 0 "model = mlp:784-16-10;rounds = 3" "run 0000000000000000: run id 0 names no run"

sleep 1 # anything the replays started would have written its first rows by now
for n in a b; do
  st=$(ctl $n status --json)
  case "$st" in *'"state":"running"'*) fail "$n runs a replayed run: $st" ;;
    *) pass "$n runs nothing after the replays" ;; esac
  record $n >"$T/$n.after"
  if cmp -s "$T/$n.before" "$T/$n.after"; then
    pass "$n's ledger: run $run_id's runs row and 6 rounds rows unchanged (test_accuracy $(sql $n "SELECT test_accuracy FROM runs WHERE $w"))"
  else
    fail "$n's ledger: run $run_id's rows changed:"; diff "$T/$n.before" "$T/$n.after" | head -20
  fi
  n_runs=$(sql $n "SELECT count(*) FROM runs")
  [ "$n_runs" -eq 1 ] && pass "$n's ledger holds one run" || fail "$n's ledger holds $n_runs runs"
done
d1=$(drop_of a reused_run_id)
[ "$d1" -ge $((d0 + 3)) ] && pass "a counted the 3 refusals (drops.reused_run_id $d0 -> $d1)" \
  || fail "a's drops.reused_run_id $d0 -> $d1"
grep -q "refusing run $run_id: run $run_id: this node already recorded that run id with another spec" "$T/a.log" \
  && pass "a logged the refusal" || fail "a's log has no refusal of run $run_id"
finish
