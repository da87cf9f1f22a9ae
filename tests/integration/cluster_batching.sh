#!/usr/bin/env bash
# cluster_batching.sh: weighted dynamic batching on 4 real nodes, two of them
# made 6x slower with the `slowdown` run key (ranks 2 and 3). With
# batching=weighted the plan follows the capacity each node measures and
# reports with its updates: the slow ranks measure a clearly lower capacity
# (a sixth of a fast rank's or less on an idle machine, a few rows cost more
# per row; about a third when the four nodes oversubscribe the cores, since
# slowdown's idle time absorbs a slow node's wait for a core but a fast node's
# wait counts in full) and get a smaller share of the batch (never beyond
# what the capacities say; a plan has a floor), the local batches of every round sum exactly
# to the global batch on every node, the aggregation weights follow the samples
# actually used (none beyond what its plan gave: nobody is clamped), and the
# run still learns. With batching=equal every round
# uses 16 rows everywhere. Timing figures (round times, idle time) are printed
# for information only: speed is measured by `make bench` (bench_batching.sh).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c d; do start_node $n || finish; done
for n in b c d; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c d; do wait_peers $n 3 15 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 4 nodes" || finish

# run_with BATCHING: one run of 24 rounds; leaves its id in $run_id
run_with() {
  local out
  out=$(ctl a start --set batching="$1" --set slowdown=1,1,6,6 --set batch=64 --set lr=0.05 \
        --set local_steps=8 --set rounds=24 --set eval_every=24 --set seed=5) \
    || { fail "start $1: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c d; do wait_run_state $n finished 400 || fail "$n did not finish ($1)"; done
}

# per-rank figures of a run: "rank mean_batch mean_compute_s mean_wait_s
# mean_capacity" (rounds > 4)
figures() {
  local n rank
  for n in a b c d; do
    rank=$(json_field "$(ctl $n status --json)" rank)
    sql $n "SELECT $rank, avg(batch), avg(compute_s), avg(wait_s), avg(capacity) FROM rounds
            WHERE printf('%016x', run_id) = '$run_id' AND round > 4"
  done | sort -n
}

run_with weighted
# every round's local batches sum to the global batch (from round 3 on, a plan
# reported with round r applies from round r + 1 on every node alike)
bad=$(for n in a b c d; do
        sql $n "SELECT round, batch FROM rounds WHERE printf('%016x', run_id) = '$run_id'"
      done | awk -F'|' '{ s[$1] += $2; c[$1]++ } END { for (r in s) if (c[r] == 4 && s[r] != 64) print r ": " s[r] }')
[ -z "$bad" ] && pass "weighted: local batches sum to 64 in every round" \
  || fail "weighted: rounds whose batches do not sum to 64: $bad"
W=$(figures)
echo "weighted (rank|batch|compute_s|wait_s|capacity):"; echo "$W"
fast=$(awk -F'|' '$1 < 2 { s += $2; c++ } END { print s / c }' <<<"$W")
slow=$(awk -F'|' '$1 >= 2 { s += $2; c++ } END { print s / c }' <<<"$W")
cfast=$(awk -F'|' '$1 < 2 { s += $5; c++ } END { print s / c }' <<<"$W")
cslow=$(awk -F'|' '$1 >= 2 { s += $5; c++ } END { print s / c }' <<<"$W")
awk -v f="$cfast" -v s="$cslow" 'BEGIN { exit !(s > 0 && f / s >= 1.5) }' \
  && pass "weighted: slow ranks measure less capacity: fast $cfast, slow $cslow samples/s" \
  || fail "weighted: slowdown 6 does not show in the capacity: fast $cfast slow $cslow"
# the split follows the measured capacities: apart, and not beyond them (the
# slow ranks' batches may sit on the plan's floor, so closer is allowed)
awk -v f="$fast" -v s="$slow" -v cf="$cfast" -v cs="$cslow" \
    'BEGIN { exit !(s > 0 && f / s >= 1.4 && f / s < 1.25 * cf / cs) }' \
  && pass "weighted: fast ranks average batch $fast, slow ranks $slow" \
          "(capacity ratio $cfast / $cslow)" \
  || fail "weighted: batches do not follow capacity: fast $fast slow $slow," \
          "capacities $cfast / $cslow"
# aggregation weights follow samples: a peer's update records the samples it used
upd=$(sql a "SELECT count(*) FROM updates WHERE printf('%016x', run_id) = '$run_id'")
[ "$upd" -eq 72 ] && pass "weighted: node a received 72 updates (3 peers x 24 rounds)" \
  || fail "weighted: node a received $upd updates, expected 72"
for n in a b c d; do
  acc=$(json_field "$(ctl $n status --json)" test_accuracy)
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.70) }' && pass "$n: weighted run learns (test accuracy $acc)" \
    || fail "$n: weighted run test accuracy $acc < 0.70"
done
# every member's samples stay within the plans that gave them (rounds.c bounds them)
for n in a b c d; do
  o=$(ctl $n status --json | sed -E 's/.*"outliers":(\[[^]]*\]).*/\1/')
  [ "$o" = "[]" ] && pass "$n: no member's samples beyond its plan" || fail "$n: refused members: $o"
done

run_with equal
E=$(figures)
echo "equal (rank|batch|compute_s|wait_s|capacity):"; echo "$E"
eq=$(awk -F'|' '$2 != 16 { print }' <<<"$E")
[ -z "$eq" ] && pass "equal: every rank uses 16 rows per step" || fail "equal: batches moved: $eq"
fw=$(awk -F'|' '$1 < 2 { s += $4 } END { print s }' <<<"$W")
fe=$(awk -F'|' '$1 < 2 { s += $4 } END { print s }' <<<"$E")
echo "info: fast ranks' mean wait per round: equal ${fe}s, weighted ${fw}s"
finish
