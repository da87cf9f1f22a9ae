#!/usr/bin/env bash
# uplink_cap.sh: `traind --uplink-kbit KBIT` paces a node's queued traffic
# (update chunks, snapshots) in user space, the way a shaped uplink would, so
# an emulated WAN works without root (traind-lab's loopback mode). Two nodes on
# loopback, a capped at 8000 kbit/s (1,000,000 bytes/s), a sync run with dense
# updates (codec none, ~0.8 MB each). Whatever the machine's load, a cannot
# put its bytes on the wire faster than the cap: what a's ledger records as
# sent, divided by the time the run took, stays at or below the cap (the one
# frame that may leave at once adds at most 64 KiB). Without the cap loopback
# moves them at several MB/s (2.7 MB/s
# here with UPLINK_KBIT=0, which makes this test fail). A bad value is refused at start.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

CAP_BPS=1000000
run bad "$TRAIND" --data-dir "$T/x" --control "$T/x/ctl" --uplink-kbit lots
expect_error bad "uplink_kbit"

start_node a --uplink-kbit "${UPLINK_KBIT:-8000}" || finish
start_node b || finish
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 15 || fail "$n does not see its peer"; done

out=$(ctl a start --set model=mlp:784-256-10 --set batch=32 --set local_steps=2 --set rounds=6 \
      --set codec=none --set mode=sync --set eval_every=100) || fail "start: $out"
for n in a b; do wait_run_state $n finished 120 || fail "$n did not finish"; done

read -r sent secs <<<"$(sql a "SELECT sum(bytes_sent), max(ended) - min(started) FROM rounds" | tr '|' ' ')"
awk -v b="$sent" 'BEGIN { exit !(b > 3000000) }' \
  && pass "a sent $sent bytes in 6 rounds (dense updates, ~0.8 MB each)" || fail "a sent only '$sent' bytes"
awk -v b="$sent" -v s="$secs" -v c="$CAP_BPS" 'BEGIN { exit !(s > 0 && (b - 65536) / s <= c) }' \
  && pass "a's rate $(awk -v b="$sent" -v s="$secs" 'BEGIN { printf "%.0f", b / s }') bytes/s over ${secs}s is within the cap ($CAP_BPS)" \
  || fail "a sent $sent bytes in ${secs}s: faster than the cap $CAP_BPS bytes/s"
finish
