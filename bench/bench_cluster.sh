#!/usr/bin/env bash
# bench_cluster.sh: per-round overhead of the peer daemon. Starts 4 traind on
# loopback, runs 200 sync rounds of mlp:784-256-128-10 on Fashion-MNIST (codec
# none) and reports, from the ledgers: wall time per round, time computing,
# time not computing (the overhead: packing, sending, waiting for the slowest
# peer), and update bytes on the wire per model byte (1 + framing for none).
# Also each node's resident memory at rounds 50 and 190 (flatness).
. "$(dirname "$0")/cluster.sh"
start_cluster
ctl 0 start --set rounds=200 --set local_steps=8 --set batch=256 --set eval_every=1000 >/dev/null || exit 1
rss_mid="" rss_late=""
for _ in $(seq 3000); do
  st=$(ctl 0 status --json)
  r=$(sed -E 's/.*"round":([0-9]+).*/\1/' <<<"$st")
  if [ -z "$rss_mid" ] && [ "${r:-0}" -ge 50 ]; then
    rss_mid=$(for p in "${PIDS[@]}"; do ps -o rss= -p $p; done | tr '\n' ' ')
  fi
  if [ -z "$rss_late" ] && [ "${r:-0}" -ge 190 ]; then
    rss_late=$(for p in "${PIDS[@]}"; do ps -o rss= -p $p; done | tr '\n' ' ')
  fi
  case "$st" in *'"state":"finished"'*) break ;; esac
  sleep 0.1
done
numel=$((784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 16))
for i in 0 1 2 3; do
  sqlite3 "$T/n$i/traind.db" "SELECT printf('node %d: %d rounds, %.1f ms/round wall, %.1f ms computing, overhead %.1f ms/round (%.0f%% of wall), update bytes / model bytes = %.4f',
    $i, count(*), 1000 * avg(ended - started), 1000 * avg(compute_s), 1000 * avg(ended - started - compute_s),
    100 * avg(ended - started - compute_s) / avg(ended - started),
    sum(bytes_recv) / ((SELECT count(*) FROM updates) * $numel * 4.0)) FROM rounds"
done
echo "resident memory (kB) of the 4 daemons at round 50: $rss_mid; at round 190: $rss_late"
stop_cluster
