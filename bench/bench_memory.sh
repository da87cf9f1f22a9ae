#!/usr/bin/env bash
# bench_memory.sh: resident memory of a traind node, idle and training. For
# the mlp (mlp:784-32-10, the model of issue 39's measurement) and then the
# cnn, starts 4 traind on loopback (bench/cluster.sh), reads each one's VmRSS
# once the cluster is idle, runs 20 sync rounds on Fashion-MNIST (default
# partition iid, eval_nodes 1, no evaluation before the last round) and reads,
# per node, VmRSS in the middle of the run and VmHWM (the peak since the
# process started: the dataset load and the last evaluation) at its end.
# Prints one line per phase: min .. max over the 4 nodes, in MB (10^6 bytes).
. "$(dirname "$0")/cluster.sh"

# rss FIELD: FIELD (VmRSS or VmHWM) of every node, kB, space-separated
rss() { for p in "${PIDS[@]}"; do awk -v f="$1:" '$1 == f { print $2 }' /proc/$p/status; done | tr '\n' ' '; }
# report WHAT KB...: min and max of the nodes' figures
report() {
  local what=$1; shift
  printf '%s\n' "$@" | awk -v w="$what" 'NF { v = $1 / 1000; if (n++ == 0 || v < lo) lo = v; if (v > hi) hi = v }
    END { printf "%-34s %6.1f .. %6.1f MB (4 nodes)\n", w, lo, hi }'
}
# run NAME MODEL [ARGS]: one run; memory mid-run and the peak at its end
run() {
  local name=$1 model=$2 mid="" st r
  shift 2
  ctl 0 start --set model="$model" --set rounds=20 --set local_steps=4 --set batch=64 \
    --set eval_every=1000 "$@" >/dev/null || exit 1
  for _ in $(seq 6000); do
    st=$(ctl 0 status --json)
    r=$(sed -E 's/.*"run":\{[^}]*"round":([0-9]+).*/\1/' <<<"$st")
    [ -z "$mid" ] && [ "${r:-0}" -ge 10 ] && mid=$(rss VmRSS)
    case "$st" in *'"state":"finished"'* | *'"state":"failed"'*) break ;; esac
    sleep 0.1
  done
  report "$name training (VmRSS, round 10)" $mid
  report "$name peak (VmHWM, after the run)" $(rss VmHWM)
}

for m in mlp:784-32-10 cnn; do
  PIDS=()
  start_cluster
  report "idle (VmRSS)" $(rss VmRSS)
  run "${m%%:*}" "$m"
  stop_cluster
done
