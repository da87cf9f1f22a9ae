#!/usr/bin/env bash
# bench_scale.sh: a join storm of N real traind on loopback (issue 39, "33 ->
# 256"). Starts N daemons (secure, as by default; no run, so no model is
# loaded), lets node 0 make invites and has every other node join with one at
# once (in waves of WAVE, 32: a node holds at most 64 pending invites), then
# measures, from `trainctl peers` on every node:
#   - the time from the first join until every node sees N - 1 peers alive;
#   - each idle node's CPU (utime + stime from /proc over IDLE_S seconds) and
#     resident memory (ps -o rss), median and largest;
#   - the heartbeat traffic: bytes each node sent to all its links per second
#     over the same window (the full mesh's heartbeats carry the whole peer
#     list, so this grows as N^2 per node).
# Environment: N (100), HEARTBEAT_MS (5000), IDLE_S (30), KEEP (set: keep the
# logs and ledgers in /tmp/td-scale-*), CONVERGE_S (600:
# give up after), top_builddir. Prints one summary block; exit 1 when the
# cluster did not converge. `make bench-scale`; never part of `make check`.
set -u
N=${N:-100}
HEARTBEAT_MS=${HEARTBEAT_MS:-5000}
IDLE_S=${IDLE_S:-30}
CONVERGE_S=${CONVERGE_S:-600}
WAVE=${WAVE:-32}
B=${top_builddir:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
[ -x "$B/traind" ] && [ -x "$B/trainctl" ] || { echo "bench_scale: build first (no $B/traind)" >&2; exit 1; }
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 2 ] && [ "$N" -le 256 ] || { echo "bench_scale: N takes 2 to 256" >&2; exit 1; }
T=$(mktemp -d /tmp/td-scale-XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 $p 2>/dev/null; done; wait 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $T" || rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"
sent_of() { ctl "$1" peers --json 2>/dev/null | grep -o '"bytes_sent":[0-9]*' | cut -d: -f2 | paste -sd+ | bc; }
# stats: "median max" of the numbers on stdin
stats() { sort -n | awk '{v[NR]=$1} END {printf "%s %s", v[int((NR+1)/2)], v[NR]}'; }

echo "bench_scale: $N nodes, heartbeat ${HEARTBEAT_MS} ms, descriptors: ulimit -n $(ulimit -n) (hard $(ulimit -Hn))"
t0=$(now)
start_daemons "$N" || { echo "bench_scale: a daemon did not start" >&2; exit 1; }
printf 'started %d daemons in %.1f s\n' "$N" "$(echo "$(now) - $t0" | bc)"

# ---- the storm: every node joins node 0 by invite, a wave at a time --------------------
# join_wave NODE...: each joins at once with an invite of its own; the ones that
# failed are left in FAILED.
join_wave() {
  local k=0 i jpids=()
  ctl 0 invite --count "$#" --ttl 1h >"$T/invites" || { echo "bench_scale: invite failed"; exit 1; }
  for i in "$@"; do
    k=$((k + 1))
    ctl "$i" join "$(sed -n "${k}p" "$T/invites")" >"$T/join$i.out" 2>&1 &
    jpids+=($!)
  done
  k=0
  for i in "$@"; do
    wait "${jpids[$k]}" || { FAILED+=("$i"); echo "  join of node $i: $(cat "$T/join$i.out")"; }
    k=$((k + 1))
  done
}
t_join=$(now)
FAILED=()
next=1
while [ "$next" -lt "$N" ]; do
  count=$((N - next < WAVE ? N - next : WAVE))
  join_wave $(seq "$next" $((next + count - 1)))
  next=$((next + count))
done
first_failed=${#FAILED[@]}
for attempt in 1 2; do # what a user would do: join again
  [ "${#FAILED[@]}" -eq 0 ] && break
  again=("${FAILED[@]}")
  FAILED=()
  echo "  joining ${#again[@]} nodes again (attempt $((attempt + 1)))"
  join_wave "${again[@]}"
done
t_joined=$(now)
printf 'joins answered in %.1f s (%d of %d failed at the first try, %d in the end)\n' \
  "$(echo "$t_joined - $t_join" | bc)" "$first_failed" $((N - 1)) "${#FAILED[@]}"

# ---- convergence: every node sees N - 1 alive ---------------------------------------------
converged=0
sweeps=0
while :; do
  sweeps=$((sweeps + 1))
  short=0 worst=$N
  for i in $(seq 0 $((N - 1))); do
    a=$(alive_of "$i")
    [ "$a" -lt $((N - 1)) ] && short=$((short + 1))
    [ "$a" -lt "$worst" ] && worst=$a
  done
  if [ "$short" -eq 0 ]; then converged=1; break; fi
  elapsed=$(echo "$(now) - $t_join" | bc)
  if [ "$(echo "$elapsed > $CONVERGE_S" | bc)" -eq 1 ]; then break; fi
  [ $((sweeps % 5)) -eq 1 ] && printf '  %.0f s: %d nodes short of %d alive peers (fewest seen: %d)\n' "$elapsed" "$short" $((N - 1)) "$worst"
done
t_conv=$(now)
if [ "$converged" -eq 1 ]; then
  printf 'converged: every node sees %d alive %.1f s after the first join (%d sweeps of trainctl peers)\n' \
    $((N - 1)) "$(echo "$t_conv - $t_join" | bc)" "$sweeps"
else
  echo "NOT converged after ${CONVERGE_S} s: $short nodes short, fewest alive seen $worst"
  shown=0
  for i in $(seq 0 $((N - 1))); do # who is missing where
    [ "$(alive_of "$i")" -ge $((N - 1)) ] && continue
    echo "  node $i ($(cat "$T/n$i/endpoint")) sees $(alive_of "$i") alive; not alive there:"
    ctl "$i" peers | awk 'NR > 1 && $3 != "alive" {print "    " $0}'
    echo "    known: $(ctl "$i" peers | tail -n +2 | wc -l) of $((N - 1))"
    shown=$((shown + 1))
    [ "$shown" -ge 3 ] && break
  done
fi

# ---- idle cost -----------------------------------------------------------------------------
hz=$(getconf CLK_TCK)
declare -A tick0 sent0
for i in $(seq 0 $((N - 1))); do tick0[$i]=$(ticks_of "${PIDS[$i]}"); sent0[$i]=$(sent_of "$i"); done
w0=$(now)
sleep "$IDLE_S"
w1=$(now)
win=$(echo "$w1 - $w0" | bc)
: >"$T/cpu"; : >"$T/rss"; : >"$T/bps"; : >"$T/fds"
for i in $(seq 0 $((N - 1))); do
  p=${PIDS[$i]}
  echo "scale=2; 100 * ($(ticks_of "$p") - ${tick0[$i]}) / $hz / $win" | bc >>"$T/cpu"
  ps -o rss= -p "$p" >>"$T/rss"
  echo "($(sent_of "$i") - ${sent0[$i]}) / $win" | bc >>"$T/bps"
  ls "/proc/$p/fd" 2>/dev/null | wc -l >>"$T/fds"
done
read -r cpu_med cpu_max < <(stats <"$T/cpu")
read -r rss_med rss_max < <(stats <"$T/rss")
read -r bps_med bps_max < <(stats <"$T/bps")
read -r fds_med fds_max < <(stats <"$T/fds")
cpu_sum=$(paste -sd+ "$T/cpu" | bc)
echo "idle, over ${IDLE_S} s after convergence (median / largest of $N nodes):"
echo "  CPU per node: ${cpu_med} % / ${cpu_max} % of a core (all nodes: ${cpu_sum} % of the machine's $(nproc) cores x 100)"
echo "  resident memory per node: ${rss_med} kB / ${rss_max} kB"
echo "  bytes sent per node per second (heartbeats, peer lists): ${bps_med} / ${bps_max}"
echo "  open descriptors per node: ${fds_med} / ${fds_max}"
for i in $(seq 0 $((N - 1))); do ctl "$i" leave >/dev/null 2>&1 & done
sleep 3 # what has not left by then is killed on exit
[ "$converged" -eq 1 ]
