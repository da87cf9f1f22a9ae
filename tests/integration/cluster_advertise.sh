#!/usr/bin/env bash
# cluster_advertise.sh: nodes on different machines reach each other at the
# addresses they advertise. Five network namespaces of netns_lib.sh stand in
# for five machines on one LAN (10.R.0.0/24, unshaped):
#  - n0, n1, n2 listen on the wildcard tcp://0.0.0.0:7070 with no --advertise,
#    as traind.service's comment suggests. Each advertises its own LAN address
#    (status, endpoint file, log; every peer lists it there), they form a full
#    mesh, and a run started on n1 trains on all three: every node's ledger
#    holds updates from both others in every round, and every node's test
#    accuracy is what cluster_run.sh asks of the loopback cluster (>= 0.82 and
#    within 1.5 points of the standalone baseline).
#  - n3 has a second LAN address and is told (config file key `advertise`) to
#    advertise it: that is the address it shows and every member learns.
#  - n5 (wildcard, no --advertise) has a second address on a second subnet
#    that only n0 shares (10.R.1.0/24) and joins n0 there: n0 lists it at its
#    10.R.1 address, the others at its 10.R.0 one (each peer gets the address
#    of the interface that routes to it, whatever n5 shows by default).
#  - n4 listens on 127.0.0.1 only: its join to n0 is refused with one line
#    saying to set --advertise, instead of handing n0 a loopback address.
#  - --advertise values that are not a tcp:// endpoint with a host and a port
#    (or name a wildcard host) are refused with one line.
# Needs root (network namespaces) and python3 (JSON): skips with 77 otherwise.
. "${top_srcdir:-.}/tests/integration/netns_lib.sh"
td_wan_can_run || exit 77
command -v python3 >/dev/null || { echo "skipped: needs python3" >&2; exit 77; }
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
trap 'td_wan_teardown; cleanup_nodes' EXIT

PORT=7070
td_wan_setup "$(td_wan_prefix)" 0 0 0 0 0 0 || { fail "td_wan_setup"; finish; }
pass "bed $TD_WAN_PREFIX: 6 namespaces on 10.$TD_WAN_SUBNET.0.0/24"
ip_of() { td_wan_ip "${1#n}"; }   # n2 -> 10.R.0.3

# start_ns NAME TRAIND-ARGS...: traind inside namespace NAME's index, its
# control socket and data under $T/NAME (reached from here through the file
# system); waits until it is up.
start_ns() {
  local name=$1 i; shift
  mkdir -p "$T/$name"
  td_wan_spawn "${name#n}" "$T/$name.log" "$TRAIND" --data-dir "$T/$name" \
    --control "$T/$name/ctl" --heartbeat-ms 200 --threads 1 --log-level info "$@"
  echo "$TD_WAN_PID" >"$T/$name.pid"
  NODES+=("$name")
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"; cat "$T/$name.log"; return 1
}
# admit NAME...: every pair of the named nodes admits each other, as admins
admit() {
  local a b
  for a in "$@"; do for b in "$@"; do
    [ "$a" = "$b" ] || ctl "$a" allow --admin "$(key_of "$b")" >/dev/null || fail "$a allow $b"
  done; done
}
# jget JSON-TEXT PYTHON-EXPR: the expression over the parsed text `j`
jget() { python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"; }
own_endpoint() { jget "$(ctl "$1" status --json)" 'j["endpoint"]'; }
node_id_of() { jget "$(ctl "$1" status --json)" 'j["node_id"]'; }
# peer_endpoint NAME OTHER: the endpoint NAME lists for OTHER ("" if none)
peer_endpoint() {
  local peers
  peers=$(ctl "$1" peers --json)
  jget "$peers" "next((p['endpoint'] for p in (j['peers'] if isinstance(j, dict) else j)
                       if p['node_id'] == '$(node_id_of "$2")'), '')"
}

# ---- bad --advertise values: one line each ---------------------------------------------
run adv_noscheme "$TRAIND" --data-dir "$T/x" --advertise 10.1.2.3:7070
expect_error adv_noscheme "advertise: expected tcp://HOST:PORT"
run adv_noport "$TRAIND" --data-dir "$T/x" --advertise tcp://10.1.2.3
expect_error adv_noport "advertise: expected tcp://HOST:PORT"
run adv_port0 "$TRAIND" --data-dir "$T/x" --advertise tcp://10.1.2.3:0
expect_error adv_port0 "advertise: .*port"
run adv_wild "$TRAIND" --data-dir "$T/x" --advertise "tcp://0.0.0.0:$PORT"
expect_error adv_wild "advertise: .*wildcard"

# ---- three machines, wildcard listen addresses, no --advertise -------------------------
for n in n0 n1 n2; do start_ns $n --listen "tcp://0.0.0.0:$PORT" || finish; done
for n in n0 n1 n2; do
  want="tcp://$(ip_of $n):$PORT" got=$(own_endpoint $n)
  [ "$got" = "$want" ] && pass "$n advertises $got (status)" \
    || fail "$n advertises $got in status, expected $want (its LAN address)"
  [ "$(endpoint_of $n)" = "$want" ] || fail "$n's endpoint file says $(endpoint_of $n)"
  grep -q "advertising $want" "$T/$n.log" && pass "$n's log: $(grep -o "listening on.*advertising [^ ,]*" "$T/$n.log")" \
    || fail "$n's log does not say it advertises $want"
done
ctl n0 status | grep -q "^listen  tcp://0.0.0.0:$PORT (advertising tcp://$(ip_of n0):$PORT)" \
  && pass "status: $(ctl n0 status | grep '^listen')" || fail "status has no listen line: $(ctl n0 status)"
admit n0 n1 n2
for n in n1 n2; do
  out=$(ctl $n join "tcp://$(ip_of n0):$PORT" "$(key_of n0)" 2>&1) || fail "$n join n0: $out"
done
for n in n0 n1 n2; do wait_peers $n 2 20 || fail "$n does not see 2 alive peers"; done
for n in n0 n1 n2; do for o in n0 n1 n2; do
  [ "$n" = "$o" ] && continue
  got=$(peer_endpoint $n $o)
  [ "$got" = "tcp://$(ip_of $o):$PORT" ] || fail "$n lists $o at '$got', expected tcp://$(ip_of $o):$PORT"
done; done
if [ "$failures" -gt 0 ]; then
  ctl n0 peers; fail "no full mesh across the namespaces: not starting the run"; finish
fi
pass "full mesh of 3 namespaces, each peer listed at its LAN address"

RUN=(--set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 --set momentum=0.9
     --set epochs=1 --set local_steps=8 --set eval_every=40 --set seed=3)
out=$(ctl n1 start "${RUN[@]}") || fail "start: $out"
pass "$out"
for n in n0 n1 n2; do wait_run_state $n finished 400 || fail "$n did not finish"; done
"$TRAIND" --standalone --json --set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 \
  --set momentum=0.9 --set epochs=1 --set seed=3 --set threads=1 >"$T/base.out" 2>&1 \
  || fail "standalone baseline"
base=$(json_field "$(tail -n1 "$T/base.out")" test_accuracy)
for n in n0 n1 n2; do
  st=$(ctl $n status --json)
  acc=$(sed -E 's/.*"test_accuracy":([0-9.eE+-]+).*/\1/' <<<"$st")
  rounds=$(sed -E 's/.*"rounds":([0-9]+).*/\1/' <<<"$st")
  nodes=$(sed -E 's/.*"nodes":([0-9]+).*/\1/' <<<"$st")
  [ "$nodes" = 3 ] || fail "$n: the run had $nodes nodes, expected 3"
  awk -v a="$acc" -v b="$base" 'BEGIN { exit !(a >= 0.82 && a >= b - 0.015) }' \
    && pass "$n: test accuracy $acc (standalone baseline $base), $rounds rounds on $nodes nodes" \
    || fail "$n: test accuracy $acc vs baseline $base"
  # every other member's update arrived for every round (the peer's round:
  # an early update is recorded under the round open here): all three trained
  per_peer=$(sql $n "SELECT count(DISTINCT peer_round) || ':' || count(*) FROM updates
                     GROUP BY peer" | tr '\n' ' ')
  [ "$per_peer" = "$rounds:$rounds $rounds:$rounds " ] \
    && pass "$n: one update from each of both peers for each of the $rounds rounds" \
    || fail "$n: rounds:updates per peer '$per_peer', expected $rounds:$rounds from each of 2"
done

# ---- explicit advertise (config file key) on a second address --------------------------
extra="10.$TD_WAN_SUBNET.0.100"
ip -n "$(td_wan_ns 3)" addr add "$extra/24" dev wan || fail "second address on n3"
printf '[daemon]\nlisten = tcp://0.0.0.0:%s\nadvertise = tcp://%s:%s\n' "$PORT" "$extra" "$PORT" >"$T/n3.ini"
start_ns n3 --config "$T/n3.ini" || finish
got=$(own_endpoint n3)
[ "$got" = "tcp://$extra:$PORT" ] && pass "n3 advertises $got as configured" \
  || fail "n3 advertises $got, configured tcp://$extra:$PORT"
admit n0 n1 n2 n3
out=$(ctl n3 join "tcp://$(ip_of n0):$PORT" "$(key_of n0)" 2>&1) || fail "n3 join n0: $out"
for n in n0 n1 n2; do
  for i in $(seq 100); do [ "$(peer_endpoint $n n3)" = "tcp://$extra:$PORT" ] && break; sleep 0.2; done
  got=$(peer_endpoint $n n3)
  [ "$got" = "tcp://$extra:$PORT" ] && pass "$n lists n3 at $got" \
    || fail "$n lists n3 at '$got', expected tcp://$extra:$PORT"
done
wait_peers n3 3 20 && pass "n3 sees 3 alive peers" || fail "n3 does not see 3 alive peers"

# ---- two subnets: each peer gets the address that routes to it -------------------------
sub1="10.$TD_WAN_SUBNET.1"
ip -n "$(td_wan_ns 0)" addr add "$sub1.1/24" dev wan || fail "second subnet on n0"
ip -n "$(td_wan_ns 5)" addr add "$sub1.6/24" dev wan || fail "second subnet on n5"
start_ns n5 --listen "tcp://0.0.0.0:$PORT" || finish
[ "$(own_endpoint n5)" = "tcp://$(ip_of n5):$PORT" ] || fail "n5 shows $(own_endpoint n5) by default"
admit n0 n1 n2 n3 n5
out=$(ctl n5 join "tcp://$sub1.1:$PORT" "$(key_of n0)" 2>&1) || fail "n5 join n0 at $sub1.1: $out"
wait_peers n5 4 20 && pass "n5 sees 4 alive peers" || fail "n5 does not see 4 alive peers"
for n in n0 n1 n2 n3; do
  want="tcp://$(ip_of n5):$PORT"
  [ $n = n0 ] && want="tcp://$sub1.6:$PORT"
  for i in $(seq 100); do [ "$(peer_endpoint $n n5)" = "$want" ] && break; sleep 0.2; done
  got=$(peer_endpoint $n n5)
  [ "$got" = "$want" ] && pass "$n lists n5 at $got" || fail "$n lists n5 at '$got', expected $want"
done
# and `peers --json` on n5 says what it advertises to each
adv=$(jget "$(ctl n5 peers --json)" "next(p['advertised'] for p in (j['peers'] if isinstance(j, dict) else j)
                                          if p['node_id'] == '$(node_id_of n0)')")
[ "$adv" = "tcp://$sub1.6:$PORT" ] && pass "n5's peers: advertised to n0: $adv" \
  || fail "n5's peers says it advertises '$adv' to n0"
grep -q "advertising tcp://$sub1.6:$PORT to the peer at tcp://$sub1.1:$PORT" "$T/n5.log" \
  && pass "n5's log says what it advertises to n0" || fail "n5's log does not say what it advertises to n0"

# ---- loopback listener joining another machine: refused, one line ----------------------
start_ns n4 --listen "tcp://127.0.0.1:$PORT" || finish
admit n0 n4
run loopjoin "$TRAINCTL" --socket "$T/n4/ctl" join "tcp://$(ip_of n0):$PORT" "$(key_of n0)"
expect_error loopjoin "127\.0\.0\.1:$PORT.*--advertise"
id4=$(node_id_of n4)
sleep 1
ctl n0 peers --json | grep -q "\"$id4\"" && fail "n0 learned of n4 anyway" \
  || pass "n0 never heard of n4"
finish
