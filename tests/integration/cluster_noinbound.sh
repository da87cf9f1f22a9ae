#!/bin/bash
# cluster_noinbound.sh: nodes that accept no connections (issue 36, item 3).
# Four nodes join by invites and train a sync run and an overlap run with
# every node reachable; then two of them come back with `--listen none` (no
# peer port at all) and the same two runs, same seed, train to within 0.5
# point of the all-reachable ones (overlap: 1 point, see below). The two no-inbound nodes reach the
# reachable members over the connections they open (route "direct" on their
# side, "inbound" on the members'), and each other only through a reachable
# member (route "relayed", via that member), whose relayed frames they
# verify against the origin's signing key. Last, a hostile relay
# (traind_tamper: flips a byte of everything it relays) carries what two
# no-inbound nodes send each other: the targets reject it (bad_relay,
# logged) and take nothing relayed from it.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
TAMPER="${top_builddir:-$(pwd)}/tests/integration/traind_tamper"

# start_bare NAME LISTEN [BINARY]: a node that lists no key (joins by invite).
start_bare() {
  local name=$1 listen=$2 bin=${3:-$TRAIND} i
  mkdir -p "$T/$name"
  rm -f "$T/$name/endpoint"
  "$bin" --data-dir "$T/$name" --listen "$listen" --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  case " ${NODES[*]} " in *" $name "*) ;; *) NODES+=("$name") ;; esac
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"
}
stop_node() {
  kill "$(cat "$T/$1.pid")" 2>/dev/null
  local i
  for i in $(seq 50); do kill -0 "$(cat "$T/$1.pid")" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$(cat "$T/$1.pid")" 2>/dev/null
  wait "$(cat "$T/$1.pid")" 2>/dev/null
}
id_of() { ctl "$1" peers --json | sed -nE 's/^\{"node_id":"([0-9a-f]+)".*/\1/p'; }
# route NAME PEER_NAME: "ROUTE VIA" of NAME's link to PEER_NAME (VIA: null unless relayed)
route() {
  local id line
  id=$(id_of "$2")
  line=$(ctl "$1" peers --json | tr '{' '\n' | grep "\"node_id\":\"$id\"")
  echo "$(grep -oE '"route":"[a-z]+"' <<<"$line" | cut -d'"' -f4)" \
    "$(grep -oE '"via":("[0-9a-f]+"|null)' <<<"$line" | cut -d: -f2 | tr -d '"')"
}
relay_count() { ctl "$1" status --json | sed -E "s/.*\"relay\":\{[^}]*\"$2\":([0-9]+).*/\1/"; }
drops_of() { ctl "$1" status --json | grep -o "\"$2\":[0-9]*" | head -n1 | cut -d: -f2; }

# ---- four nodes joined by invites ---------------------------------------------------------
for n in a b c d; do start_bare $n tcp://127.0.0.1:0; done
ctl a invite --admin --count 3 >"$T/invites" || fail "invite"
i=1
for n in b c d; do
  ctl $n join "$(sed -n "${i}p" "$T/invites")" >/dev/null || fail "$n join"
  i=$((i + 1))
done
for n in a b c d; do wait_peers $n 3 20 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "4 nodes joined by invites" || finish

BASE=(--set batch=64 --set lr=0.05 --set seed=5 --set eval_every=1000 --set rounds=30 --set batching=equal
      --set local_steps=8)
# train MODE: a run from a on all four; prints a's final test accuracy. Overlap
# falls back to no-delay rounds while exchanges take several times the compute,
# which depends on the machine's load: slowdown=3 keeps compute the longer part,
# so that both overlap runs take the same path and compare like with like.
train() {
  local out n extra=()
  [ "$1" = overlap ] && extra=(--set slowdown=3)
  out=$(ctl a start "${BASE[@]}" "${extra[@]}" --set mode="$1") || { fail "start $1: $out"; return 1; }
  for n in a b c d; do wait_run_state $n finished 120 || fail "$n did not finish ($1)"; done
  json_field "$(ctl a status --json)" test_accuracy
}
sync_all=$(train sync)
overlap_all=$(train overlap)
echo "info: all reachable: sync $sync_all, overlap $overlap_all"

# ---- c and d come back with no inbound connections ------------------------------------------
for n in c d; do stop_node $n; done
for n in c d; do start_bare $n none; done
[ "$(cat "$T/c/endpoint")" = none ] && pass "a --listen none node advertises none" \
  || fail "c advertises $(cat "$T/c/endpoint")"
if command -v ss >/dev/null; then
  ss -ltnp 2>/dev/null | grep -q "pid=$(cat "$T/c.pid")," && fail "c listens on a TCP port" \
    || pass "c binds no TCP port"
fi
for n in a b c d; do wait_peers $n 3 30 || fail "$n does not see 3 alive peers after c, d came back"; done
a_id=$(id_of a)
[ "$(route c a)" = "direct null" ] && pass "c dials a directly" || fail "c reaches a by '$(route c a)'"
[ "$(route a c)" = "inbound null" ] && pass "a answers c over c's own connection" \
  || fail "a reaches c by '$(route a c)'"
r=$(route c d)
case "$r" in
  "relayed $a_id"|"relayed $(id_of b)") pass "c reaches d through a reachable member ($r)" ;;
  *) fail "c reaches d by '$r'" ;;
esac
ctl c peers | grep -q "relayed" && pass "trainctl peers shows the relayed route" \
  || fail "trainctl peers does not show the route"

sync_none=$(train sync)
overlap_none=$(train overlap)
echo "info: c, d --listen none: sync $sync_none, overlap $overlap_none"
# sync with batching=equal is one computation whatever the routes: 0.5 point.
# An overlap run's result moves with timing (which round an update lands in):
# the all-reachable overlap run alone moved 0.4 point between runs on a loaded
# machine, and 0.62 apart was seen here at a load of 15, so make check allows
# it 1 point (the figure measured on a quiet machine is in the issue's note)
for pair in "sync $sync_all $sync_none 0.005" "overlap $overlap_all $overlap_none 0.01"; do
  set -- $pair
  awk -v a="$2" -v b="$3" -v m="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.5 && d <= m) }' \
    && pass "$1: two no-inbound nodes train to $3, all reachable $2 (within $(awk -v m="$4" 'BEGIN { print m * 100 }') point)" \
    || fail "$1: $3 with two no-inbound nodes vs $2 all reachable"
done
for n in c d; do
  [ "$(relay_count $n received)" -gt 0 ] && pass "$n took in relayed frames, verified" \
    || fail "$n received nothing relayed"
  [ "$(drops_of $n bad_relay)" -eq 0 ] && pass "$n rejected no honest relayed frame" \
    || fail "$n rejected $(drops_of $n bad_relay) honest relayed frames"
done
[ "$(($(relay_count a forwarded) + $(relay_count b forwarded)))" -gt 0 ] \
  && pass "the reachable members forwarded the no-inbound nodes' frames" || fail "nothing forwarded"

# ---- a hostile relay: a byte flipped in everything it carries ---------------------------------
# b comes back on its own address as traind_tamper and a goes away, so b is
# the only member c and d reach, and every frame between them passes b
b_ep=$(cat "$T/b/endpoint")
stop_node a
stop_node b
start_bare b "$b_ep" "$TAMPER"
for i in $(seq 100); do
  [ "$(drops_of d bad_relay)" -gt 0 ] && [ "$(drops_of c bad_relay)" -gt 0 ] && break
  sleep 0.2
done
for n in c d; do
  [ "$(drops_of $n bad_relay)" -gt 0 ] && pass "$n rejects what the hostile relay altered ($(drops_of $n bad_relay))" \
    || fail "$n did not reject altered relayed frames"
done
grep -q "fails its origin's signature (altered on the way)" "$T/d.log" \
  && pass "the rejection is logged" || fail "no log line for the altered relay"
before=$(relay_count d received)
sleep 2
[ "$(relay_count d received)" -eq "$before" ] && pass "d took in nothing the hostile relay carried" \
  || fail "d accepted relayed frames through the tampering relay"
finish
