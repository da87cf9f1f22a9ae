# bench/daemons.sh: sourced by the scale benchmarks (bench_scale.sh,
# bench_topology.sh), which set B (the build dir), T (their scratch dir),
# PIDS and HEARTBEAT_MS. start_daemons N starts traind n0 .. n(N-1) on
# loopback (own data dirs, ephemeral ports, control sockets, one BLAS thread
# each) and waits until each has its endpoint and control socket; 1 (with the
# end of its log) when one did not start. Also the helpers both use: ctl I
# ARGS (trainctl on node I), now, alive_of I, ticks_of PID (CPU ticks).
ctl() { local i=$1; shift; "$B/trainctl" --socket "$T/n$i/ctl" "$@"; }
now() { date +%s.%N; }
alive_of() { ctl "$1" peers --json 2>/dev/null | grep -o '"state":"alive"' | wc -l; }
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
start_daemons() {
  local n=$1 i
  for i in $(seq 0 $((n - 1))); do
    mkdir -p "$T/n$i"
    "$B/traind" --data-dir "$T/n$i" --listen tcp://127.0.0.1:0 --control "$T/n$i/ctl" \
      --threads 1 --heartbeat-ms "$HEARTBEAT_MS" --log-level warn 2>"$T/n$i.log" &
    PIDS+=($!)
  done
  for i in $(seq 0 $((n - 1))); do
    for _ in $(seq 300); do [ -s "$T/n$i/endpoint" ] && [ -S "$T/n$i/ctl" ] && break; sleep 0.1; done
    [ -S "$T/n$i/ctl" ] || { echo "node $i did not start:"; tail -5 "$T/n$i.log"; return 1; }
  done
}
