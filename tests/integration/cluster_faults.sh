#!/usr/bin/env bash
# cluster_faults.sh: a run survives a crashed node and hostile input.
# 3 nodes start a run; a hostile peer throws garbage at node a (raw non-ZMTP
# bytes, random and truncated frames, an oversized frame, a wrong version, a
# wrong run id); node c is killed with SIGKILL mid-run. a and b mark c dead
# within a few heartbeats, record the event, count every bad message and still
# finish the run. c restarted on its data dir rejoins the cluster.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
HOSTILE="${top_builddir:-$(pwd)}/tests/integration/td_hostile"

for n in a b c; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
ctl c join "$(endpoint_of b)" >/dev/null || fail "c join b"
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
c_id=$(cat "$T/c/node_id")

out=$(ctl a start --set model=mlp:784-64-10 --set batch=32 --set local_steps=4 \
      --set rounds=150 --set eval_every=50 --set lr=0.05) || fail "start: $out"
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")

# wait until the run is well under way
for i in $(seq 300); do
  r=$(json_field "$(ctl a status --json)" round); [ "${r:-0}" -ge 10 ] && break; sleep 0.2
done
[ "${r:-0}" -ge 10 ] && pass "run $run_id under way (round $r)" || fail "run did not progress"

# the garbage comes from an admitted (authenticated, not admin) key, so it
# reaches the parser; td_intruder.sh covers peers without a key
read -r HPUB HSEC <<<"$("$HOSTILE" --keygen)"
ctl a allow "$HPUB" >/dev/null || fail "a does not admit the hostile peer's key"
TD_PEER_PUBLIC=$HPUB TD_PEER_SECRET=$HSEC "$HOSTILE" "$(endpoint_of a)" "$run_id" "$(key_of a)" \
  >"$T/hostile.out" 2>&1 && pass "hostile peer sent its garbage" \
  || fail "hostile peer: $(cat "$T/hostile.out")"
kill -9 "$(cat "$T/c.pid")"
killed_at=$(date +%s.%N)

for n in a b; do
  for i in $(seq 50); do
    st=$(ctl $n peers --json)
    grep -q "\"node_id\":\"$c_id\"[^}]*\"state\":\"dead\"" <<<"$st" && break
    sleep 0.1
  done
  if grep -q "\"node_id\":\"$c_id\"[^}]*\"state\":\"dead\"" <<<"$st"; then
    secs=$(awk -v a="$killed_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    pass "$n marked c dead ${secs}s after kill -9 (heartbeat 0.2 s)"
  else
    fail "$n did not mark c dead: $st"
  fi
done

for n in a b; do
  wait_run_state $n finished 300 && pass "$n finished the run without c" || fail "$n did not finish"
  ev=$(sql $n "SELECT count(*) FROM events WHERE kind = 'peer_dead' AND detail LIKE '$c_id%'")
  [ "$ev" -ge 1 ] && pass "$n: ledger records c's death" || fail "$n: no peer_dead event"
done
st=$(ctl a status --json)
for kind in malformed version oversized wrong_run handshake; do
  v=$(sed -E "s/.*\"$kind\":([0-9]+).*/\1/" <<<"$st")
  [ "${v:-0}" -ge 1 ] && pass "a counted $v $kind message(s)" || fail "a counted no $kind drop: $st"
done
grep -q 'dropped a peer message' "$T/a.log" && pass "a logged the drops" || fail "no drop in a's log"
kill -0 "$(cat "$T/a.pid")" && pass "a is still serving" || fail "a died"

# c comes back on the same data dir and is readmitted
start_node c || finish
[ "$(cat "$T/c/node_id")" = "$c_id" ] || fail "c changed its node id"
for n in a b; do
  for i in $(seq 75); do
    st=$(ctl $n peers --json)
    grep -q "\"node_id\":\"$c_id\"[^}]*\"state\":\"alive\"" <<<"$st" && break
    sleep 0.2
  done
  grep -q "\"node_id\":\"$c_id\"[^}]*\"state\":\"alive\"" <<<"$st" && pass "$n readmitted c" \
    || fail "$n did not readmit c: $st"
done
wait_peers c 2 15 && pass "c sees a and b again" || fail "c does not see its peers"

# graceful shutdown: SIGTERM flushes the ledger and exits 0
kill -TERM "$(cat "$T/b.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/b.pid")" 2>/dev/null || break; sleep 0.1; done
wait "$(cat "$T/b.pid")" 2>/dev/null; rc=$?
[ "$rc" -eq 0 ] && pass "b exited 0 on SIGTERM" || fail "b exit status $rc on SIGTERM"
grep -q 'stopped cleanly' "$T/b.log" || fail "b did not stop cleanly"
[ "$(sql b "SELECT count(*) FROM events WHERE kind = 'shutdown'")" -ge 1 ] || fail "b: no shutdown event"
finish
