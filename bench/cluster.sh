# bench/cluster.sh: sourced by the cluster benchmarks. Starts 4 traind on
# loopback (own data dirs, ephemeral ports, control sockets, one BLAS thread
# each), joins them to node 0, and kills whatever is left on exit.
set -u
B=${top_builddir:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
T=$(mktemp -d /tmp/td-bench-XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$T"' EXIT
ctl() { local i=$1; shift; "$B/trainctl" --socket "$T/n$i/ctl" "$@"; }

start_cluster() {
  local i
  for i in 0 1 2 3; do
    mkdir -p "$T/n$i"
    "$B/traind" --data-dir "$T/n$i" --listen tcp://127.0.0.1:0 --control "$T/n$i/ctl" \
      --threads 1 --log-level warn ${TD_BENCH_INSECURE:+--insecure} 2>"$T/n$i.log" &
    PIDS+=($!)
  done
  for i in 0 1 2 3; do
    for _ in $(seq 100); do [ -s "$T/n$i/endpoint" ] && [ -S "$T/n$i/ctl" ] && break; sleep 0.1; done
  done
  local j
  for i in 0 1 2 3; do # CURVE, as by default: every node admits the others
    [ -n "${TD_BENCH_INSECURE:-}" ] && break # TD_BENCH_INSECURE=1: plain TCP, to compare
    for j in 0 1 2 3; do
      [ "$i" = "$j" ] || ctl $i allow --admin "$(cat "$T/n$j/node.pub")" >/dev/null || exit 1
    done
  done
  for i in 1 2 3; do
    ctl $i join "$(cat "$T/n0/endpoint")" "$(cat "$T/n0/node.pub")" >/dev/null || exit 1
  done
  sleep 1
}

stop_cluster() {
  local i
  for i in 0 1 2 3; do ctl $i leave >/dev/null; done
  wait
}
