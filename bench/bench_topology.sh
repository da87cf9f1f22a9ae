#!/usr/bin/env bash
# bench_topology.sh: the topology bed (issue 39, item 6). For each N in NS
# (8 16 32 64) it starts N real traind on loopback (secure, as by default),
# has them join node 0 by invite, measures the time until every node sees
# N - 1 alive and the idle heartbeat CPU per node, then trains the same run
# under each topology in TOPOS (mesh, gossip:1, groups:8) and prints, per N
# and topology: bytes sent per node per round (median over nodes of the mean
# over the rounds between the first and the last, which is the mesh), round
# time (median), the consensus distance (mean over nodes) after round 2 and
# after the last gossip round, CPU per node while training (median), peak
# resident memory per node during that run (largest VmHWM, in MiB; the peak
# is reset before each run, so each topology's is its own), and the final test accuracy
# (every node's; "apart" when they differ).
# The run: MODEL (mlp:784-32-10), fashion-mnist split iid, a global batch of
# 16 per node, LOCAL_STEPS (8) steps, ROUNDS (24), batching = equal, seed 1.
# Environment: NS, TOPOS, ROUNDS, LOCAL_STEPS, MODEL, HEARTBEAT_MS (1000),
# IDLE_S (10), KILL (set: in the last topology of the largest N, kill KILL
# nodes after a third of the rounds and report whether the run finished; the
# run must last some seconds: EXTRA="--set slowdown=20"), EXTRA (more
# --set options for every run), KEEP, top_builddir. `make bench-scale`; never part of `make check`.
set -u
NS=${NS:-8 16 32 64}
TOPOS=${TOPOS:-mesh gossip:1 groups:8}
ROUNDS=${ROUNDS:-24}
LOCAL_STEPS=${LOCAL_STEPS:-8}
MODEL=${MODEL:-mlp:784-32-10}
HEARTBEAT_MS=${HEARTBEAT_MS:-1000}
IDLE_S=${IDLE_S:-10}
KILL=${KILL:-}
B=${top_builddir:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
[ -x "$B/traind" ] && [ -x "$B/trainctl" ] || { echo "bench_topology: build first (no $B/traind)" >&2; exit 1; }
T=$(mktemp -d /tmp/td-topo-XXXXXX)
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }
trap 'stop_all; [ -n "${KEEP:-}" ] && echo "kept $T" || rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"
hwm_of() { awk '/VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# the peak resident memory starts over from the current one (proc(5), clear_refs 5)
hwm_reset() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR ? v[int((NR+1)/2)] : "nan")}'; }
sql() { sqlite3 "$T/n$1/traind.db" "$2"; }
hz=$(getconf CLK_TCK)

# cluster N: N daemons joined to node 0; sets SEE_ALL_S and IDLE_CPU
cluster() {
  local n=$1 i k
  rm -rf "$T"/n*
  start_daemons "$n" || exit 1
  local t0 next=1 count
  t0=$(now) # the first join
  while [ "$next" -lt "$n" ]; do # waves of 32 (a node holds 64 pending invites)
    count=$((n - next < 32 ? n - next : 32))
    ctl 0 invite --count "$count" --ttl 1h >"$T/invites"
    k=0
    for i in $(seq "$next" $((next + count - 1))); do
      k=$((k + 1))
      ctl "$i" join "$(sed -n "${k}p" "$T/invites")" >/dev/null 2>&1 &
    done
    wait_joins=$(jobs -p | grep -v -F -x -f <(printf '%s\n' "${PIDS[@]}") || true)
    [ -n "$wait_joins" ] && wait $wait_joins 2>/dev/null
    next=$((next + count))
  done
  # every node sees n - 1 alive, and still does 8 heartbeats later (a link one
  # way only shows as a dead peer after 6 of them)
  local short=1 seen=""
  while [ "$(echo "$(now) - $t0 < 600" | bc)" -eq 1 ]; do
    short=0
    for i in $(seq 0 $((n - 1))); do [ "$(alive_of "$i")" -lt $((n - 1)) ] && short=$((short + 1)); done
    if [ "$short" -gt 0 ]; then seen=""; continue; fi
    [ -n "$seen" ] && break
    seen=$(printf '%.1f' "$(echo "$(now) - $t0" | bc)")
    sleep "$(echo "8 * $HEARTBEAT_MS / 1000" | bc -l)"
  done
  SEE_ALL_S=${seen:-"no ($short short)"}
  local w0 c0=() c=()
  for i in $(seq 0 $((n - 1))); do c0[$i]=$(ticks_of "${PIDS[$i]}"); done
  w0=$(now)
  sleep "$IDLE_S"
  local win
  win=$(echo "$(now) - $w0" | bc)
  IDLE_CPU=$(for i in $(seq 0 $((n - 1))); do
    echo "scale=2; 100 * ($(ticks_of "${PIDS[$i]}") - ${c0[$i]}) / $hz / $win" | bc; done | median)
}

# train N TOPO: one run; prints its row
train() {
  local n=$1 topo=$2 out run t0 c0=() i dur state kill_at=0 killed=0
  for i in $(seq 0 $((n - 1))); do hwm_reset "${PIDS[$i]}"; done
  out=$(ctl 0 start --set model="$MODEL" --set batch=$((16 * n)) --set local_steps="$LOCAL_STEPS" \
        --set rounds="$ROUNDS" --set eval_every=100000 --set batching=equal --set seed=1 \
        --set round_timeout=10 --set topology="$topo" ${EXTRA:-} 2>&1) || { echo "  $topo: start failed: $out"; return; }
  run=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for i in $(seq 0 $((n - 1))); do c0[$i]=$(ticks_of "${PIDS[$i]}"); done
  t0=$(now)
  [ -n "$KILL" ] && [ "$topo" = "${TOPOS##* }" ] && [ "$n" = "${NS##* }" ] && kill_at=$((ROUNDS / 3))
  local w="printf('%016x', run_id) = '$run'"
  while :; do
    state=$(sql 0 "SELECT state FROM runs WHERE $w" 2>/dev/null)
    [ "$state" = finished ] || [ "$state" = failed ] && break
    if [ "$kill_at" -gt 0 ] && [ "$killed" -eq 0 ]; then
      r=$(ctl 0 status --json 2>/dev/null | grep -o '"round":[0-9]*' | head -1 | cut -d: -f2)
      if [ "${r:-0}" -ge "$kill_at" ]; then
        for i in $(seq $((n - KILL)) $((n - 1))); do kill -9 "${PIDS[$i]}"; done
        killed=$KILL
        echo "  killed $KILL nodes after round $r"
      fi
    fi
    [ "$(echo "$(now) - $t0 > 1800" | bc)" -eq 1 ] && { state="timeout"; break; }
    sleep 1
  done
  dur=$(echo "$(now) - $t0" | bc)
  local live=$((n - killed)) cpu hwm bytes rt cd2 cdl acc
  for i in $(seq 0 $((live - 1))); do
    for _ in $(seq 60); do sql "$i" "SELECT state FROM runs WHERE $w" 2>/dev/null | grep -q finished && break; sleep 1; done
  done
  cpu=- # a run of under 5 s gives no CPU figure worth printing
  [ "$(echo "$dur >= 5" | bc)" -eq 1 ] && cpu=$(for i in $(seq 0 $((live - 1))); do
    echo "scale=1; 100 * ($(ticks_of "${PIDS[$i]}") - ${c0[$i]}) / $hz / $dur" | bc; done | median)
  hwm=$(for i in $(seq 0 $((live - 1))); do hwm_of "${PIDS[$i]}"; done | sort -n | tail -1)
  bytes=$(for i in $(seq 0 $((live - 1))); do
    sql "$i" "SELECT avg(bytes_sent) FROM rounds WHERE $w AND round > 1 AND round < $ROUNDS"; done | median)
  rt=$(for i in $(seq 0 $((live - 1))); do
    sql "$i" "SELECT ended - started FROM rounds WHERE $w AND round > 1 AND round < $ROUNDS"; done | median)
  cd2=$(for i in $(seq 0 $((live - 1))); do sql "$i" "SELECT consensus FROM rounds WHERE $w AND round = 2"; done | grep . | awk '{s+=$1} END {print NR ? s/NR : "-"}')
  cdl=$(for i in $(seq 0 $((live - 1))); do sql "$i" "SELECT consensus FROM rounds WHERE $w AND round = $((ROUNDS - 1))"; done | grep . | awk '{s+=$1} END {print NR ? s/NR : "-"}')
  acc=$(for i in $(seq 0 $((live - 1))); do sql "$i" "SELECT test_accuracy FROM runs WHERE $w"; done | sort -u)
  [ "$(grep -c . <<<"$acc")" -gt 1 ] && acc="apart: $(paste -sd' ' <<<"$acc" | cut -c1-40)"
  printf '%4d  %-9s %-9s %12.0f %9.3f %10s %10s %7s %9.1f %8s  %s\n' "$n" "$topo" "$state" "${bytes:-0}" \
    "${rt:-0}" "$cd2" "$cdl" "$cpu" "$(echo "${hwm:-0} / 1024" | bc -l)" "$(printf '%.0f' "$dur")" "${acc:--}"
}

echo "bench_topology: $MODEL, $ROUNDS rounds of $LOCAL_STEPS steps, batch 16 per node, heartbeat ${HEARTBEAT_MS} ms, on $(nproc) cores"
for n in $NS; do
  cluster "$n"
  echo "N = $n: every node saw $((n - 1)) alive after $SEE_ALL_S s; idle heartbeat CPU per node ${IDLE_CPU} % of a core (median)"
  printf '%4s  %-9s %-9s %12s %9s %10s %10s %7s %9s %8s  %s\n' N topology state "bytes/round" round_s \
    cd_round2 cd_last cpu_% hwm_MiB run_s final_accuracy
  for topo in $TOPOS; do train "$n" "$topo"; done
  stop_all
done
