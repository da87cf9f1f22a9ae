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
