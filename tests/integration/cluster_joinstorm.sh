#!/usr/bin/env bash
# cluster_joinstorm.sh: 16 nodes join one at the same moment, each with an
# invite of its own (issue 39, the join storm). Some dial a member before that
# member has learned their key, and its ZAP handler refuses the handshake;
# libzmq never dials again after that, so on the old build such a node stayed
# "dead" to that member for good (2 nodes of 16 in each of two bed runs) and
# every run's rounds waited out their deadline for it. Asserted: every node
# sees 15 alive within 40 s and still does 8 heartbeats later; the nodes whose
# connection was refused (if the race happened) dialed again.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
N=16
HEARTBEAT_MS=500
for i in $(seq 0 $((N - 1))); do
  mkdir -p "$T/j$i"
  "$TRAIND" --data-dir "$T/j$i" --listen tcp://127.0.0.1:0 --control "$T/j$i/ctl" \
    --heartbeat-ms $HEARTBEAT_MS --threads 1 --log-level info >>"$T/j$i.log" 2>&1 &
  echo $! >"$T/j$i.pid"
  NODES+=("j$i")
done
for i in $(seq 0 $((N - 1))); do
  for _ in $(seq 100); do [ -S "$T/j$i/ctl" ] && [ -s "$T/j$i/endpoint" ] && break; sleep 0.1; done
done
"$TRAINCTL" --socket "$T/j0/ctl" invite --count $((N - 1)) --ttl 10m >"$T/invites" \
  || { fail "invite"; finish; }
k=0
for i in $(seq 1 $((N - 1))); do
  k=$((k + 1))
  "$TRAINCTL" --socket "$T/j$i/ctl" join "$(sed -n "${k}p" "$T/invites")" >"$T/join$i.out" 2>&1 &
done
wait_joins() { local p; for p in $(jobs -p); do grep -qx "$p" "$T"/j*.pid 2>/dev/null || wait "$p"; done; }
wait_joins
alive() { "$TRAINCTL" --socket "$T/j$1/ctl" peers --json 2>/dev/null | grep -o '"state":"alive"' | wc -l; }
all_alive() {
  local i
  for i in $(seq 0 $((N - 1))); do [ "$(alive "$i")" -eq $((N - 1)) ] || return 1; done
}
ok=0
for _ in $(seq 80); do
  if all_alive; then
    sleep 4 # 8 heartbeats: a one-way link shows as a dead peer after 6
    all_alive && { ok=1; break; }
  fi
  sleep 0.5
done
[ "$ok" -eq 1 ] && pass "every node sees $((N - 1)) alive, and still does 8 heartbeats later" \
  || { fail "not every node sees $((N - 1)) alive after 40 s:"; for i in $(seq 0 $((N - 1))); do echo "  j$i: $(alive "$i")"; done; }
refused=$(grep -l "is not on the allowlist" "$T"/j*.log | wc -l)
again=$(grep -l "dialing .* again" "$T"/j*.log | wc -l)
echo "note: $refused nodes refused a handshake during the storm; $again nodes dialed again"
[ "$refused" -eq 0 ] || [ "$again" -gt 0 ] && pass "after refused handshakes, the refused dialed again" \
  || fail "$refused nodes refused handshakes and nobody dialed again"
finish
