#!/usr/bin/env bash
# cluster_run.sh: 3 traind nodes on loopback train mlp:784-256-128-10 on
# Fashion-MNIST (iid, codec none, sync). Every node's final test accuracy is
# >= 0.82 and within 1.5 points of the standalone baseline on the same number
# of samples; the ledger holds one row per round per node and one row per
# update received (with staleness); `trainctl rounds --csv` matches the ledger;
# a checkpoint every 5 rounds leaves the 3 newest (checkpoint_keep's default).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
ctl c join "$(endpoint_of a)" >/dev/null || fail "c join a"
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes"

RUN=(--set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 --set momentum=0.9
     --set epochs=1 --set local_steps=8 --set eval_every=40 --set seed=3 --set checkpoint_every=5)
out=$(ctl b start "${RUN[@]}") || fail "start: $out"
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
pass "started run $run_id from node b"

for n in a b c; do
  wait_run_state $n finished 400 || fail "$n did not finish"
done
ctl a status --watch 0.2 >/dev/null || fail "status --watch on a finished run"

# baseline: the same hyper-parameters and samples on one node
"$TRAIND" --standalone --json --set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 \
  --set momentum=0.9 --set epochs=1 --set seed=3 --set threads=1 >"$T/base.out" 2>&1 \
  || fail "standalone baseline"
base=$(json_field "$(tail -n1 "$T/base.out")" test_accuracy)
pass "standalone baseline test accuracy $base"

for n in a b c; do
  st=$(ctl $n status --json)
  acc=$(sed -E 's/.*"test_accuracy":([0-9.eE+-]+).*/\1/' <<<"$st")
  rounds=$(sed -E 's/.*"rounds":([0-9]+).*/\1/' <<<"$st")
  awk -v a="$acc" -v b="$base" 'BEGIN { exit !(a >= 0.82 && a >= b - 0.015) }' \
    && pass "$n: test accuracy $acc (baseline $base)" \
    || fail "$n: test accuracy $acc vs baseline $base"
  rid=$(sql $n "SELECT printf('%016x', run_id) FROM runs")
  [ "$rid" = "$run_id" ] || fail "$n: ledger run id $rid != $run_id"
  nr=$(sql $n "SELECT count(*) FROM rounds")
  [ "$nr" -eq "$rounds" ] && pass "$n: $nr rounds in the ledger, one per round" \
    || fail "$n: $nr ledger rounds, expected $rounds"
  nu=$(sql $n "SELECT count(*) FROM updates")
  [ "$nu" -eq $((2 * rounds)) ] && pass "$n: $nu updates recorded (2 peers x $rounds rounds)" \
    || fail "$n: $nu updates, expected $((2 * rounds))"
  bad=$(sql $n "SELECT count(*) FROM updates WHERE staleness IS NULL OR bytes <= 0")
  [ "$bad" -eq 0 ] || fail "$n: updates without staleness"
  st_max=$(sql $n "SELECT max(staleness) FROM updates")
  [ "$st_max" -eq 0 ] && pass "$n: sync rounds: staleness 0 everywhere" || fail "$n: staleness $st_max"
  state=$(sql $n "SELECT state FROM runs")
  [ "$state" = finished ] || fail "$n: run state in the ledger is $state"
  # rounds/5 checkpoints taken, the 3 newest kept, each the whole model: 235,146 parameters,
  # 235,152 floats with the padding that aligns each tensor to 64 bytes
  ck=$(sql $n "SELECT count(*) || ' ' || min(round) || ' ' || max(round) || ' ' || min(length(blob))
               || ' ' || max(length(blob)) FROM checkpoints")
  top=$((rounds / 5 * 5))
  [ "$ck" = "3 $((top - 10)) $top 940608 940608" ] \
    && pass "$n: the 3 newest of $((rounds / 5)) checkpoints kept (rounds $((top - 10))..$top)" \
    || fail "$n: checkpoints (count min max bytes): $ck, expected 3 $((top - 10)) $top 940608"
  # trainctl rounds --csv agrees with the ledger, row for row
  ctl $n rounds --csv | tail -n +2 | cut -d, -f2,7,10,11 >"$T/$n.csv"
  sql $n "SELECT round, samples, bytes_sent, bytes_recv FROM rounds ORDER BY round" | tr '|' , >"$T/$n.sql"
  cmp -s "$T/$n.csv" "$T/$n.sql" && pass "$n: rounds --csv matches the ledger" \
    || { fail "$n: rounds --csv differs from the ledger"; diff "$T/$n.csv" "$T/$n.sql" | head; }
  last=$(ctl $n rounds --last 3 --csv | tail -n +2 | wc -l)
  [ "$last" -eq 3 ] || fail "$n: rounds --last 3 gave $last rows"
done
finish
