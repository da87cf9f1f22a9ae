#!/usr/bin/env bash
# cluster_joinstorm.sh: 16 nodes join one at the same moment, each with an
# invite of its own (issue 39, the join storm). Some dial a member before that
# member has learned their key, and its ZAP handler refuses the handshake;
# libzmq never dials again after that, so on the old build such a node stayed
# "dead" to that member for good (2 nodes of 16 in each of two bed runs) and
# every run's rounds waited out their deadline for it. Asserted: every node
# sees 15 alive within 40 s and still does 8 heartbeats later; the nodes whose
# connection was refused (if the race happened) dialed again.
# Then the race made certain, on two more nodes: rb dials ra before ra knows
# its key, so ra refuses both of rb's connections; once ra admits rb and dials
# it, ra's heartbeats say it refused rb, and rb dials again (with only one of
# its two connections refused, nothing else would tell rb), so each sees the
# other alive.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
N=16
HEARTBEAT_MS=500
# launch NAME...: secure nodes on loopback that admit nobody yet; then wait
# until each has its control socket and endpoint
launch() {
  local x
  for x in "$@"; do
    mkdir -p "$T/$x"
    "$TRAIND" --data-dir "$T/$x" --listen tcp://127.0.0.1:0 --control "$T/$x/ctl" \
      --heartbeat-ms $HEARTBEAT_MS --threads 1 --log-level info >>"$T/$x.log" 2>&1 &
    echo $! >"$T/$x.pid"
    NODES+=("$x")
  done
  for x in "$@"; do
    for _ in $(seq 100); do [ -S "$T/$x/ctl" ] && [ -s "$T/$x/endpoint" ] && break; sleep 0.1; done
  done
}
launch $(seq -f 'j%g' 0 $((N - 1)))
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

# ---- ra refuses rb's handshakes, then admits rb ------------------------------
launch ra rb
rctl() { local x=$1; shift; "$TRAINCTL" --socket "$T/$x/ctl" "$@"; }
rctl rb allow --admin "$(cat "$T/ra/node.pub")" >/dev/null
timeout 10 "$TRAINCTL" --socket "$T/rb/ctl" join "$(cat "$T/ra/endpoint")" "$(cat "$T/ra/node.pub")" \
  >"$T/rb-join.out" 2>&1 &
seen=0
for _ in $(seq 100); do
  grep -qF "key $(cat "$T/rb/node.pub") is not on the allowlist" "$T/ra.log" && { seen=1; break; }
  sleep 0.1
done
[ "$seen" -eq 1 ] && pass "ra refused rb's handshake (it did not know rb's key)" \
  || fail "ra never refused rb's handshake: $(tail -5 "$T/ra.log")"
rctl ra allow --admin "$(cat "$T/rb/node.pub")" >/dev/null
rctl ra join "$(cat "$T/rb/endpoint")" "$(cat "$T/rb/node.pub")" >"$T/ra-join.out" 2>&1
sees() { rctl "$1" peers --json 2>/dev/null | grep -o "{\"node_id\":\"$2\"[^}]*" | grep -c '"state":"alive"'; }
node_id() { sed -n 's/.* node \([0-9a-f]\{16\}\) listening on .*/\1/p' "$T/$1.log" | head -1; }
ra_id=$(node_id ra) rb_id=$(node_id rb)
ok=0
for _ in $(seq 80); do
  [ "$(sees ra "$rb_id")" -eq 1 ] && [ "$(sees rb "$ra_id")" -eq 1 ] && { ok=1; break; }
  sleep 0.25
done
grep -q "$ra_id refused [0-9]* handshakes of this node before it knew its key: dialing" "$T/rb.log" \
  && pass "ra's hello told rb it had been refused, and rb dialed again" \
  || fail "rb was not told it had been refused: $(grep -i "refused\|dialing" "$T/rb.log" | tail -3)"
[ "$ok" -eq 1 ] && pass "ra and rb see each other alive" \
  || fail "ra sees rb: $(sees ra "$rb_id"), rb sees ra: $(sees rb "$ra_id")"
finish
