#!/usr/bin/env bash
# wan_testbed.sh: the emulated WAN of netns_lib.sh works and is honest. Two
# node namespaces with 20 and 2 Mbit/s uplinks: the tbf qdiscs carry the
# configured rates (as tc reports them); TCP connects both ways; a bulk
# transfer each way arrives whole, passes through the sender's shaper (its
# "Sent" counter grows by at least the payload and at most 25% more, the
# receiver's uplink carries only the ACKs) and is throttled by it (tbf
# overlimits > 0); two traind daemons, one per namespace, joined with
# trainctl from the root namespace, see each other alive at their WAN
# addresses, and their own traffic goes through the shapers too. No timing
# assertions: the achieved rates are in the notes, not checked here.
# Skips (77) without root, netns, veth, bridge or tbf (TD_WAN_FORCE_SKIP=1
# forces the skip) and without perl (perl-base: Essential in Debian).
. "${top_srcdir:-.}/tests/integration/netns_lib.sh"
td_wan_can_run || exit 77
command -v perl >/dev/null || { echo "td_wan: skipped: needs perl (Debian perl-base)" >&2; exit 77; }
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
trap 'td_wan_teardown; cleanup_nodes' EXIT

RATES=(20 2)
td_wan_setup "$(td_wan_prefix)" "${RATES[@]}" || { fail "td_wan_setup"; finish; }
pass "bed $TD_WAN_PREFIX: namespaces ${TD_WAN_NAMESPACES[*]}, 10.$TD_WAN_SUBNET.0.0/24"
for ns in "${TD_WAN_NAMESPACES[@]}"; do
  ip netns list | grep -qE "^$ns( |\$)" || fail "namespace $ns missing"
done

# the shapers carry the configured rates, as tc reads them back
for n in 0 1; do
  want=$((RATES[n] * 1000000)) got=$(td_wan_tc_rate $n)
  [ "$got" = "$want" ] && pass "node $n: tbf on wan at $got bit/s" \
    || { fail "node $n: tc says rate '$got' bit/s, configured $want"; td_wan_qdisc $n; }
  [ -z "$(td_wan_tc_rate $n down)" ] || fail "node $n: downlink shaped, none configured"
done

# sink NODE PORT OUT: accept one TCP connection on NODE's address, read to
# EOF, write "BYTES FIRST-64-BYTES" to OUT. Stops after 60 s whatever happens.
sink() {
  td_wan_spawn "$1" "$T/sink.log" timeout 60 perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1],
                                  Listen => 1, ReuseAddr => 1) or die "listen: $!";
    my $c = $s->accept or die "accept: $!"; my ($n, $head, $b) = (0, "");
    while (my $r = sysread($c, $b, 65536)) { $head .= substr($b, 0, 64 - length $head) if length $head < 64; $n += $r }
    open my $o, ">", $ARGV[2] or die; print $o "$n $head";' "$(td_wan_ip "$1")" "$2" "$3"
}
# send NODE DST PORT CMD: run CMD inside NODE with stdout on a TCP connection
# to DST's address (bash /dev/tcp; retries while the sink is not listening).
send() {
  td_wan_exec "$1" timeout 60 bash -c '
    for i in $(seq 100); do { exec 3>"/dev/tcp/$0/$1"; } 2>/dev/null && break; sleep 0.1; done
    [ -e /dev/fd/3 ] || { echo "cannot connect to $0:$1" >&2; exit 1; }
    eval "$2" >&3' "$(td_wan_ip "$2")" "$3" "$4"
}

# connectivity, both ways
for pair in "1 0" "0 1"; do
  set -- $pair
  sink "$2" 5000 "$T/hello.$1"; sp=$TD_WAN_PID
  send "$1" "$2" 5000 "echo hello-from-$1" || fail "connect $1 -> $2"
  wait "$sp"
  [ "$(cat "$T/hello.$1" 2>/dev/null)" = "$(printf '13 hello-from-%s\n' "$1")" ] \
    && pass "TCP $(td_wan_ip "$1") -> $(td_wan_ip "$2")" \
    || { fail "node $1 -> node $2: sink got '$(cat "$T/hello.$1" 2>/dev/null)'"; cat "$T/sink.log"; }
done

# bulk transfers go through the sender's shaper (and only the ACKs through
# the receiver's), arrive whole, and are throttled
overlimits() { td_wan_qdisc "$1" | sed -nE 's/.*overlimits ([0-9]+).*/\1/p' | head -n1; }
for pair in "1 0 1500000" "0 1 4000000"; do
  set -- $pair
  src=$1 dst=$2 bytes=$3
  s0=$(td_wan_sent_bytes "$src") d0=$(td_wan_sent_bytes "$dst") o0=$(overlimits "$src")
  sink "$dst" 5001 "$T/bulk.$src"; sp=$TD_WAN_PID
  send "$src" "$dst" 5001 "head -c $bytes /dev/zero" || fail "send $bytes bytes $src -> $dst"
  wait "$sp"
  got=$(cut -d' ' -f1 "$T/bulk.$src" 2>/dev/null)
  s1=$(td_wan_sent_bytes "$src") d1=$(td_wan_sent_bytes "$dst") o1=$(overlimits "$src")
  ds=$((s1 - s0)) dd=$((d1 - d0))
  [ "$got" = "$bytes" ] && pass "node $src -> node $dst: $bytes bytes arrived" \
    || fail "node $src -> node $dst: sent $bytes bytes, sink read '$got'"
  [ "$ds" -ge "$bytes" ] && [ "$ds" -le $((bytes * 5 / 4)) ] \
    && pass "node $src uplink shaper sent $ds bytes for $bytes of payload" \
    || { fail "node $src uplink shaper sent $ds bytes for $bytes of payload"; td_wan_qdisc "$src"; }
  [ "$dd" -lt $((bytes / 5)) ] && pass "node $dst uplink carried only $dd bytes (ACKs)" \
    || fail "node $dst uplink carried $dd bytes while receiving $bytes"
  [ "$o1" -gt "$o0" ] && pass "node $src shaper throttled ($((o1 - o0)) overlimits)" \
    || { fail "node $src shaper never throttled"; td_wan_qdisc "$src"; }
done

# two daemons, one per namespace, driven from the root namespace
start_wan_node() {
  local name=$1 node=$2 i
  mkdir -p "$T/$name"
  NODES+=("$name")
  td_wan_spawn "$node" "$T/$name.log" "$TRAIND" --data-dir "$T/$name" \
    --listen "tcp://$(td_wan_ip "$node"):0" --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info
  echo "$TD_WAN_PID" >"$T/$name.pid"
  for i in $(seq 100); do
    if [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ]; then
      admit_all "$name" # CURVE across the emulated WAN, as by default
      return 0
    fi
    sleep 0.1
  done
  fail "$name did not start in node $node"; return 1
}
s0=$(td_wan_sent_bytes 0) s1=$(td_wan_sent_bytes 1)
start_wan_node a 0 && start_wan_node b 1 || finish
for p in "a 0" "b 1"; do
  set -- $p
  case "$(endpoint_of "$1")" in
    "tcp://$(td_wan_ip "$2"):"[0-9]*) pass "$1 listens on $(endpoint_of "$1")" ;;
    *) fail "$1 endpoint $(endpoint_of "$1"), expected tcp://$(td_wan_ip "$2"):PORT" ;;
  esac
done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
wait_peers a 1 15 || fail "a does not see 1 alive peer"
wait_peers b 1 15 || fail "b does not see 1 alive peer"
# peer_rows NAME: each peer as "NODE_ID ENDPOINT STATE BYTES_SENT", one a line
peer_rows() {
  ctl "$1" peers --json | sed 's/\\\//\//g; s/.*"peers":\[//' | tr '}' '\n' |
    sed -nE 's/.*"node_id":"([0-9a-f]+)","endpoint":"([^"]*)","state":"([a-z]+)".*"bytes_sent":([0-9]+).*/\1 \2 \3 \4/p'
}
own_id() { ctl "$1" peers --json | sed -nE 's/^\{"node_id":"([0-9a-f]+)".*/\1/p'; }
id_a=$(own_id a) id_b=$(own_id b)
for p in "a b 0 1 $id_b" "b a 1 0 $id_a"; do
  set -- $p
  rows=$(peer_rows "$1") ip=$(td_wan_ip "$4")
  if [[ $rows =~ ^$5\ tcp://${ip//./\\.}:[0-9]+\ alive\ [0-9]+$ ]]; then
    pass "$1 sees $2 ($5) alive at $(cut -d' ' -f2 <<<"$rows")"
  else
    fail "$1 peers: '$rows', expected $5 at $(td_wan_ip "$4") alive"; ctl "$1" peers --json
  fi
done
# the daemons' own traffic crossed the shapers: each uplink's tbf sent at
# least what its daemon reports sending (payload < frames)
sent_a=$(peer_rows a | cut -d' ' -f4) sent_b=$(peer_rows b | cut -d' ' -f4)
sleep 0.5
for p in "a 0 $sent_a $s0" "b 1 $sent_b $s1"; do
  set -- $p
  q=$(( $(td_wan_sent_bytes "$2") - $4 ))
  [ "${3:-0}" -gt 0 ] && [ "$q" -ge "$3" ] \
    && pass "$1: node $2 shaper sent $q bytes >= the $3 bytes $1 reports" \
    || fail "$1: node $2 shaper sent $q bytes, $1 reports '$3'"
done
finish
