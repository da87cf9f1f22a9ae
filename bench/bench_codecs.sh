#!/usr/bin/env bash
# bench_codecs.sh: accuracy and update bytes per codec, end to end. Starts 4
# traind on loopback, joins them, and trains mlp:784-256-128-10 on
# Fashion-MNIST for 3 epochs once per codec (none, topk:0.01, ternary,
# powersgd:4). For each: node 0's final test accuracy and the update bytes it
# received, from its ledger, with the reduction against codec none.
. "$(dirname "$0")/cluster.sh"
start_cluster
printf '%-12s %9s %14s %10s %8s\n' codec test_acc update_bytes reduction seconds
base=""
for codec in none topk:0.01 ternary powersgd:4; do
  out=$(ctl 0 start --set codec=$codec --set epochs=3 --set eval_every=1000) || { echo "$out"; exit 1; }
  run=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  t0=$(date +%s.%N)
  for _ in $(seq 6000); do
    st=$(ctl 0 status --json)
    case "$st" in *'"state":"finished"'*|*'"state":"failed"'*) break ;; esac
    sleep 0.2
  done
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  acc=$(sed -E 's/.*"test_accuracy":([0-9.]+).*/\1/' <<<"$st")
  bytes=$(sqlite3 "$T/n0/traind.db" "SELECT sum(bytes) FROM updates WHERE printf('%016x', run_id) = '$run'")
  [ -n "$base" ] || base=$bytes
  printf '%-12s %9.4f %14d %9.1fx %8s\n' "$codec" "$acc" "$bytes" \
    "$(awk -v a="$base" -v b="$bytes" 'BEGIN { print a / b }')" "$secs"
  sleep 1
done
stop_cluster
