#!/usr/bin/env bash
# link_delay.sh: `traind --link-delay-ms MS` (the user-space latency of an
# emulated WAN; traind-lab's latency_ms) holds every outgoing frame that long:
# control frames (heartbeats, acks, leave) as well as updates and snapshots,
# as a real path delays them. Each link measures its path round-trip time
# from heartbeat echoes (`trainctl peers`: path_rtt_ms). Two nodes on
# loopback, a holding its frames 150 ms and b none: a round trip either way
# crosses a's 150 ms once, and both nodes see that. With control frames sent
# at once it reads ~1 ms; with the peer's hold not taken off the echo, up to
# a heartbeat period (200 ms) more. A short run trains through the held
# update acks (the ledger records them as goodput samples), and a's leave,
# sent at shutdown while held, still reaches b.
# Overlap mode on the same link (scheduler/overlap.h): with a tiny model a
# round computes in milliseconds and its exchange takes the 150 ms hold, so
# overlapping would hide almost nothing: both nodes start their rounds from
# the predecessor's average instead (logged) and end on one model. With a
# round that computes longer than the exchange (slowdown) they overlap (after
# a start-up wait, where the first node to start waited for the other), and
# with overlap_wait = 0 they never wait.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

start_node a --link-delay-ms 150 || finish
start_node b || finish
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 15 || fail "$n does not see its peer"; done

# path_rtt_ms of NAME's one peer, once measured (up to 10 s of heartbeats)
path_rtt() {
  local i v
  for i in $(seq 50); do
    v=$(json_field "$(ctl "$1" peers --json 2>/dev/null)" path_rtt_ms)
    case "$v" in [0-9]*) echo "$v"; return 0 ;; esac
    sleep 0.2
  done
  echo "-"
}
sleep 2 # a few echoes each way: the windowed minimum settles
for n in a b; do
  rtt=$(path_rtt $n)
  awk -v r="$rtt" 'BEGIN { exit !(r + 0 >= 145 && r + 0 < 400) }' \
    && pass "$n measures a path RTT of $rtt ms across a's 150 ms hold" \
    || fail "$n's path RTT is '$rtt' ms, expected 150 ms plus loopback"
done
table=$(ctl a peers)
rtt=$(awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "RTT_MS") c = i }
           NR == 2 { print $c }' <<<"$table")
awk -v r="$rtt" 'BEGIN { exit !(r + 0 >= 145 && r + 0 < 400) }' \
  && pass "trainctl peers shows it (RTT_MS $rtt)" || fail "trainctl peers: no path RTT in $table"

out=$(ctl a start --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=4 \
      --set mode=sync --set codec=auto --set eval_every=100) || fail "start: $out"
for n in a b; do wait_run_state $n finished 120 || fail "$n did not finish"; done
r=$(sql b "SELECT count(*) FROM rounds")
[ "$r" = 4 ] && pass "b trained 4 rounds with a's frames held" || fail "b has $r rounds, 4 expected"
acks=$(sql a "SELECT count(*) FROM links")
[ "${acks:-0}" -ge 1 ] \
  && pass "a's update acks came back through the delay ($acks goodput samples)" \
  || fail "a recorded no acked update"

# overlap_run NAME KEY=VAL...: an overlap run to the end; its id in $run_id
overlap_run() {
  local out
  out=$(ctl a start --set mode=overlap --set codec=none --set eval_every=100 "$@") \
    || { fail "start overlap: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b; do wait_run_state $n finished 180 || fail "$n did not finish (overlap $*)"; done
}
fresh_from() { grep -h "run $run_id: exchanges take several times the compute" "$T/$1.log"; }
# keeps_overlapping WHAT: no node of the last run waited for its own average
keeps_overlapping() {
  local n
  for n in a b; do
    [ -z "$(fresh_from $n)" ] && pass "$n: $1 keep overlapping" \
      || fail "$n: $1 waited for their own average: $(fresh_from $n)"
  done
}
# ends_overlapping WHAT: every node of the last run overlaps at its end (a
# node that started first may wait in its first rounds: their exchanges hold
# the start-up skew, the peer's RunStart trip and data loading)
ends_overlapping() {
  local n last
  for n in a b; do
    last=$(grep -h "run $run_id: \(exchanges take\|rounds overlap\)" "$T/$n.log" | tail -n1)
    case "$last" in
      *"rounds overlap"* | "") pass "$n: $1 overlap${last:+ (after a start-up wait: ${last##*again })}" ;;
      *) fail "$n: $1 still waited at the end: $last" ;;
    esac
  done
}
overlap_run --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=12
for n in a b; do
  line=$(fresh_from $n | head -n1)
  [ -n "$line" ] && pass "$n: exchange-bound overlap rounds wait for their predecessor's average (${line##*(no delay) })" \
    || fail "$n: an exchange of 150 ms against milliseconds of compute did not stop overlapping"
done
a1=$(json_field "$(ctl a status --json)" test_accuracy)
b1=$(json_field "$(ctl b status --json)" test_accuracy)
[ "$a1" = "$b1" ] && pass "both end on one model ($a1)" || fail "final accuracies differ: $a1 $b1"
overlap_run --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=8 \
  --set overlap_wait=0
keeps_overlapping "with overlap_wait=0, the same exchange-bound rounds"
overlap_run --set model=mlp:784-32-10 --set batch=256 --set local_steps=8 --set rounds=8 \
  --set slowdown=100
ends_overlapping "rounds that compute longer than their exchange"

ctl a leave >/dev/null 2>&1 || true
left=0
for i in $(seq 25); do
  left=$(sql b "SELECT count(*) FROM events WHERE kind = 'peer_left'")
  [ "${left:-0}" -ge 1 ] && break
  sleep 0.2
done
[ "${left:-0}" -ge 1 ] && pass "a's leave, held at shutdown, reached b" \
  || fail "b never heard a leave (the held control frames were lost at shutdown)"
finish
