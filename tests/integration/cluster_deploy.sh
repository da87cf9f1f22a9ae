#!/usr/bin/env bash
# cluster_deploy.sh: the deployment path of docs/deploy.md, as far as it runs
# here (issue 36, item 5). Three network namespaces of netns_lib.sh stand in
# for three machines; each traind is started with the ExecStart line of the
# installed unit (systemd/traind.service.in, read from the file: @bindir@ and
# the state directory point into the test's tree, $TRAIND_OPTS comes from an
# /etc/default/traind written for each machine). n0 and n1 listen on the
# wildcard tcp://0.0.0.0:7070; n2 sits behind a firewall that drops inbound
# TCP (nftables or iptables, whichever is installed; without either, a tc
# classifier on its switch port sends every inbound SYN to a blackhole queue)
# and runs with --listen none.
# n0 makes two invites, n1 and n2 join with them, and a small run trains on
# all three to the accuracy cluster_run.sh asks of the loopback cluster
# (>= 0.82 and within 1.5 points of the standalone baseline); n0 and n1
# answer n2 over the connections n2 opened. Needs root and network
# namespaces: skips with 77 otherwise.
. "${top_srcdir:-.}/tests/integration/netns_lib.sh"
td_wan_can_run || exit 77
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
trap 'td_wan_teardown; cleanup_nodes' EXIT
UNIT="${top_srcdir:-.}/systemd/traind.service.in"

PORT=7070
td_wan_setup "$(td_wan_prefix)" 0 0 0 || { fail "td_wan_setup"; finish; }
ip_of() { td_wan_ip "${1#n}"; }

# The unit's ExecStart line, as systemd would run it on machine NAME:
# EnvironmentFile=-/etc/default/traind gives $TRAIND_OPTS.
exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
case "$exec_start" in
  "@bindir@/traind --data-dir /var/lib/traind "*'$TRAIND_OPTS'*) pass "unit: ExecStart=$exec_start" ;;
  *) fail "unexpected ExecStart line in $UNIT: '$exec_start'"; finish ;;
esac
start_unit() {
  local name=$1 i
  mkdir -p "$T/$name/etc-default" "$T/$name/state"
  printf 'TRAIND_OPTS="%s --heartbeat-ms 200 --threads 1 --log-level info"\n' "$2" \
    >"$T/$name/etc-default/traind"
  local line=${exec_start//@bindir@\/traind/$TRAIND}
  line=${line//\/var\/lib\/traind/$T/$name/state}
  # shellcheck disable=SC1090,SC2086
  td_wan_spawn "${name#n}" "$T/$name.log" bash -c ". '$T/$name/etc-default/traind'; exec $line"
  echo "$TD_WAN_PID" >"$T/$name.pid"
  NODES+=("$name")
  for i in $(seq 100); do
    [ -S "$T/$name/state/control.sock" ] && [ -s "$T/$name/state/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"; cat "$T/$name.log"; return 1
}
uctl() { local n=$1; shift; "$TRAINCTL" --socket "$T/$n/state/control.sock" "$@"; }

# ---- n2's firewall: inbound TCP dropped ---------------------------------------------------
ns2=$(td_wan_ns 2)
if command -v nft >/dev/null; then
  ip netns exec "$ns2" nft -f - <<'EOF' || fail "nft rule"
table inet td_deploy { chain input { type filter hook input priority 0; policy accept;
  iifname "wan" tcp flags & (syn | ack) == syn drop; } }
EOF
  how=nftables
elif command -v iptables >/dev/null; then
  ip netns exec "$ns2" iptables -A INPUT -i wan -p tcp --syn -j DROP || fail "iptables rule"
  how=iptables
else # no packet filter here: the switch port that feeds n2 classifies every TCP segment
  # with SYN set and ACK clear (a connection attempt to n2; IPv4 without options)
  # into a class whose queue is a blackhole; everything else passes (htb, u32)
  hub="${TD_WAN_PREFIX}h"
  { tc -n "$hub" qdisc add dev p2 root handle 1: htb default 1 &&
    tc -n "$hub" class add dev p2 parent 1: classid 1:1 htb rate 10gbit &&
    tc -n "$hub" class add dev p2 parent 1: classid 1:2 htb rate 10gbit &&
    tc -n "$hub" qdisc add dev p2 parent 1:2 handle 20: blackhole &&
    tc -n "$hub" filter add dev p2 parent 1: protocol ip prio 1 u32 \
      match ip protocol 6 0xff match u8 0x02 0x12 at 33 flowid 1:2; } 2>/dev/null \
    || fail "tc drop of inbound SYNs"
  how="tc: SYNs to n2 dropped at its switch port"
fi
# a connection attempt to n2 now times out (dropped) instead of being reset
ip netns exec "$(td_wan_ns 0)" timeout 3 bash -c "echo >/dev/tcp/$(ip_of n2)/$PORT" 2>/dev/null
rc=$?
[ "$rc" -eq 124 ] && pass "n2 drops inbound TCP ($how)" || fail "a connection to n2 ended with rc $rc, not a timeout"

# ---- three machines, started by the unit's line -----------------------------------------
start_unit n0 "--listen tcp://0.0.0.0:$PORT" || finish
start_unit n1 "--listen tcp://0.0.0.0:$PORT" || finish
start_unit n2 "--listen none" || finish
[ "$(cat "$T/n0/state/endpoint")" = "tcp://$(ip_of n0):$PORT" ] \
  && pass "n0 advertises its LAN address" || fail "n0 advertises $(cat "$T/n0/state/endpoint")"
[ "$(cat "$T/n2/state/endpoint")" = none ] && pass "n2 advertises none" \
  || fail "n2 advertises $(cat "$T/n2/state/endpoint")"
uctl n0 invite --admin --count 2 >"$T/invites" || fail "invite"
uctl n1 join "$(sed -n 1p "$T/invites")" >/dev/null || fail "n1 join"
uctl n2 join "$(sed -n 2p "$T/invites")" >/dev/null || fail "n2 join"
alive() { uctl "$1" peers --json | grep -o '"state":"alive"' | wc -l; }
for n in n0 n1 n2; do
  for i in $(seq 100); do [ "$(alive $n)" -eq 2 ] && break; sleep 0.2; done
  [ "$(alive $n)" -eq 2 ] || fail "$n sees $(alive $n) alive peers, not 2"
done
[ "$failures" -eq 0 ] && pass "3 machines joined by invites, n2 behind its firewall" || finish
for n in n0 n1; do
  uctl $n peers | grep -E "^[0-9a-f]{16} +none +alive .* inbound$" >/dev/null \
    && pass "$n reaches n2 over n2's own connection (route inbound)" \
    || { fail "$n does not show n2 as inbound"; uctl $n peers; }
done

# ---- a first run -----------------------------------------------------------------------
RUN=(--set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 --set momentum=0.9
     --set epochs=1 --set local_steps=8 --set eval_every=40 --set seed=3)
out=$(uctl n0 start "${RUN[@]}") || fail "start: $out"
for n in n0 n1 n2; do
  for i in $(seq 2000); do
    case "$(uctl $n status --json 2>/dev/null)" in *'"state":"finished"'*) break ;; esac
    sleep 0.2
  done
done
"$TRAIND" --standalone --json --set model=mlp:784-256-128-10 --set batch=64 --set lr=0.05 \
  --set momentum=0.9 --set epochs=1 --set seed=3 --set threads=1 >"$T/base.out" 2>&1 \
  || fail "standalone baseline"
base=$(json_field "$(tail -n1 "$T/base.out")" test_accuracy)
for n in n0 n1 n2; do
  st=$(uctl $n status --json)
  acc=$(sed -E 's/.*"test_accuracy":([0-9.eE+-]+).*/\1/' <<<"$st")
  nodes=$(sed -E 's/.*"nodes":([0-9]+).*/\1/' <<<"$st")
  [ "$nodes" = 3 ] || fail "$n: the run had $nodes nodes, expected 3"
  awk -v a="$acc" -v b="$base" 'BEGIN { exit !(a >= 0.82 && a >= b - 0.015) }' \
    && pass "$n: test accuracy $acc (standalone baseline $base) on $nodes nodes" \
    || fail "$n: test accuracy $acc vs baseline $base"
done
finish
