#!/usr/bin/env bash
# bench/bench_batching.sh: weighted dynamic batching on 4 loopback nodes, two
# of them 3x slower (slowdown = 1,1,3,3), against equal batches, in one run.
# Reports per rank the mean local batch, compute time and wait per round
# (rounds after the first 4, when the plan has settled), then two ratios:
#   spread = slowest / fastest mean round compute time across nodes
#            (weighted batching aims at 1: everyone finishes together)
#   idle   = fast ranks' mean wait with equal batches / with weighted batches
# Knobs: BATCH (256), H (16), ROUNDS (24).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
BATCH=${BATCH:-256} H=${H:-16} ROUNDS=${ROUNDS:-24}
start_cluster

# one BATCHING: prints "rank|batch|compute_s|wait_s" per rank, sorted
one() {
  local out rid i
  out=$(ctl 0 start --set batching="$1" --set slowdown=1,1,3,3 --set batch="$BATCH" \
        --set local_steps="$H" --set rounds="$ROUNDS" --set eval_every=1000 --set seed=5) || exit 1
  rid=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for i in 0 1 2 3; do
    until ctl $i status --json | grep -q '"state":"finished"'; do sleep 0.5; done
  done
  for i in 0 1 2 3; do
    rank=$(ctl $i status --json | sed -E 's/.*"rank":([0-9]+).*/\1/')
    sqlite3 "$T/n$i/traind.db" "SELECT $rank, printf('%.1f', avg(batch)), printf('%.4f', avg(compute_s)),
      printf('%.4f', avg(wait_s)) FROM rounds WHERE printf('%016x', run_id) = '$rid' AND round > 4"
  done | sort -n
}

E=$(one equal); W=$(one weighted)
echo "== batching: 4 nodes, slowdown 1,1,3,3, global batch $BATCH, H=$H, $ROUNDS rounds"
echo "equal    (rank|batch|compute_s|wait_s):"; echo "$E"
echo "weighted (rank|batch|compute_s|wait_s):"; echo "$W"
spread() { awk -F'|' 'NR == 1 || $3 > mx { mx = $3 } NR == 1 || $3 < mn { mn = $3 } END { printf "%.2f", mx / mn }' <<<"$1"; }
fastwait() { awk -F'|' '$1 < 2 { s += $4; c++ } END { printf "%.4f", s / c }' <<<"$1"; }
echo "compute-time spread across nodes: equal $(spread "$E"), weighted $(spread "$W") (target <= 1.20)"
fe=$(fastwait "$E"); fw=$(fastwait "$W")
awk -v e="$fe" -v w="$fw" 'BEGIN { printf "fast ranks mean wait per round: equal %.4f s, weighted %.4f s: %.1fx less (target >= 2)\n", e, w, (w > 0 ? e / w : 0) }'
stop_cluster
