#!/usr/bin/env bash
# cluster_security.sh: CURVE peers, keys bound to connections, start/stop by
# admin keys only. Three secure nodes (the default) run a run; then:
#  - an outsider (td_intruder) that reaches a's port, plain or with a CURVE key
#    a has not admitted, cannot connect, join, start, stop, inject an update,
#    spoof a member's id, hijack a member's link, or fill the membership table
#    (each checked on its own; a new node still joins afterwards);
#  - a peer with an admitted key (no admin) that forges its sender field is
#    taken for who its key says: it joins as itself, its stop and start are
#    refused as its own, and the forgery is counted and logged;
#  - a raw capture on loopback (td_sniff) sees the run's traffic but not the
#    marker put in the run spec (seed = 7355608421); the same capture of two
#    --insecure nodes does see it, so the capture itself works;
#  - revoking a key drops its membership; --insecure is refused on a
#    non-loopback address unless forced, and status says curve or insecure.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
INTRUDER="${top_builddir:-$(pwd)}/tests/integration/td_intruder"
SNIFF="${top_builddir:-$(pwd)}/tests/integration/td_sniff"
MARKER=7355608421

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] || finish
id_of() { cat "$T/$1/node_id"; }
port_of() { local ep; ep=$(endpoint_of "$1"); echo "${ep##*:}"; }
st=$(ctl a status --json)
[ "$(json_field "$st" security)" = curve ] && pass "status: security curve by default" \
  || fail "status security: $st"
[ "$(stat -c %a "$T/a/node.key")" = 600 ] && pass "a's node.key has mode 600" \
  || fail "node.key mode $(stat -c %a "$T/a/node.key")"

# ---- the wire: the run spec's marker never appears on loopback -----------------
SNIFF_OK=1
"$SNIFF" 5 "$MARKER" "$(port_of a)" "$(port_of b)" "$(port_of c)" >"$T/sniff.out" 2>"$T/sniff.err" &
SNIFF_PID=$!
for i in $(seq 50); do grep -q listening "$T/sniff.out" && break; sleep 0.1; done
grep -q listening "$T/sniff.out" || SNIFF_OK=0
out=$(ctl a start --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=100000 \
      --set eval_every=1000 --set round_timeout=5 --set seed=$MARKER) || fail "start: $out"
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
wait "$SNIFF_PID"; sniff_rc=$?
if [ "$SNIFF_OK" -eq 1 ] && [ "$sniff_rc" -eq 0 ]; then
  read -r _ packets _ bytes _ hits < <(tail -n1 "$T/sniff.out")
  [ "${bytes:-0}" -gt 10000 ] && [ "${hits:-1}" -eq 0 ] \
    && pass "capture: $packets packets, $bytes payload bytes of secure traffic, marker seen 0 times" \
    || fail "capture of the secure cluster: $(cat "$T/sniff.out")"
else
  echo "skip: no loopback capture here: $(cat "$T/sniff.err")"
fi

round_of() { json_field "$(ctl "$1" status --json)" round; }
for i in $(seq 200); do r=$(round_of a); [ "${r:-0}" -ge 3 ] && break; sleep 0.1; done
[ "${r:-0}" -ge 3 ] && pass "run $run_id under way over CURVE (round $r)" || fail "run did not progress"
running_on() { grep -q "\"state\":\"running\"" <<<"$(ctl "$1" status --json)"; }
# advancing NAME: its run is running and its round moves on
advancing() {
  local r0 r1 i
  r0=$(round_of "$1")
  for i in $(seq 50); do
    r1=$(round_of "$1"); [ "${r1:-0}" -gt "${r0:-0}" ] && running_on "$1" && return 0; sleep 0.1
  done
  return 1
}
peer_field() { # peer_field NAME ID FIELD: FIELD of peer ID in NAME's peers
  ctl "$1" peers --json | grep -o "{\"node_id\":\"$2\"[^}]*" | sed -E "s/.*\"$3\":(\"[^\"]*\"|[^,}]*).*/\1/" | tr -d '"' | sed 's|\\/|/|g'
}
drop_of() { sed -E "s/.*\"$2\":([0-9]+).*/\1/" <<<"$(ctl "$1" status --json)"; }
n_peers() { ctl "$1" peers --json | grep -o '"node_id"' | wc -l; }
b_ep=$(endpoint_of b)
b_id=$(id_of b)

# ---- an outsider: plain ZMTP, then CURVE with a key a never admitted -----------
read -r OPUB OSEC <<<"$("$INTRUDER" --keygen)"
plain() { TD_INTRUDER_WAIT_S=1.5 "$INTRUDER" "$(endpoint_of a)" "$(key_of a)" "$@"; }
outsider() {
  TD_PEER_PUBLIC=$OPUB TD_PEER_SECRET=$OSEC TD_INTRUDER_WAIT_S=1.5 \
    "$INTRUDER" "$(endpoint_of a)" "$(key_of a)" "$@"
}
peers0=$(n_peers a)

refused0=$(json_field "$(ctl a status --json)" refused_connections)
p=$(plain hello); o=$(outsider hello)
refused1=$(json_field "$(ctl a status --json)" refused_connections)
oid=$(sed -n 's/^key_id //p' <<<"$o")
if grep -q "handshake refused" <<<"$p" && grep -q "handshake refused" <<<"$o" &&
   [ "$refused1" -gt "$refused0" ]; then
  pass "connect: plain ZMTP and an unadmitted key are refused at the handshake (a refused $refused1 key(s))"
else
  fail "connect: plain: $p / outsider: $o / refused $refused0 -> $refused1"
fi
grep -qF "key $OPUB is not on the allowlist" "$T/a.log" && pass "connect: a logged the refused key" \
  || fail "a did not log the refused key"

[ "$(n_peers a)" -eq "$peers0" ] && [ -z "$(peer_field a "$oid" state)" ] \
  && pass "join: the outsider's hello made nobody a member ($peers0 peers)" \
  || fail "join: a's peers: $(ctl a peers --json)"

outsider start "$(id_of a)" "$b_id" "$(id_of c)" >/dev/null
sleep 0.5
started=0
for n in a b c; do grep -q "1ead1ead1ead1ead" "$T/$n.log" && started=1; done
[ "$started" -eq 0 ] && [ "$(json_field "$(ctl b status --json)" run_id)" = "$run_id" ] \
  && pass "start: no node heard of the outsider's run; b still runs $run_id" \
  || fail "start: the outsider's run reached a node"

outsider stop "$run_id" >/dev/null
advancing a && advancing b && pass "stop: the outsider's stop did nothing; a and b go on" \
  || fail "stop: the run stopped: $(ctl a status --json)"

rej0=$(drop_of a rejected)
outsider inject "$run_id" "$(round_of a)" "$b_id" >/dev/null
advancing a && [ "$(drop_of a rejected)" -eq "$rej0" ] && [ "$(peer_field a "$b_id" state)" = alive ] \
  && pass "inject: updates in b's name never reached a (no rejection, b alive, run on)" \
  || fail "inject: $(ctl a status --json)"

o=$(outsider spoof "$b_id")
[ "$(peer_field a "$b_id" endpoint)" = "$b_ep" ] \
  && pass "spoof: b's id claimed from elsewhere; a still has b at $b_ep" \
  || fail "spoof: b's endpoint on a is now $(peer_field a "$b_id" endpoint)"

sent0=$(peer_field a "$b_id" bytes_sent)
sent1=$sent0 # the run goes on: a's next update to b, however loaded the machine (up to 10 s)
for i in $(seq 100); do
  sent1=$(peer_field a "$b_id" bytes_sent); [ "${sent1:-0}" -gt "$sent0" ] && break; sleep 0.1
done
if grep -q "^received 0$" <<<"$o" && [ "$(peer_field a "$b_id" state)" = alive ] &&
   [ "${sent1:-0}" -gt "$sent0" ]; then
  pass "hijack: a never linked to the impostor (received 0); its link to b still carries traffic"
else
  fail "hijack: impostor got: $o; b on a: $(peer_field a "$b_id" state)"
fi

outsider fill 40 >/dev/null
[ "$(n_peers a)" -eq "$peers0" ] && pass "fill: 40 hellos with invented ids took no slot ($peers0 peers)" \
  || fail "fill: a has $(n_peers a) peers"
start_node d || finish
ctl d join "$(endpoint_of a)" >/dev/null && wait_peers d 3 15 \
  && pass "fill: a new node still joins afterwards" || fail "d could not join after the fill"

# ---- an admitted key (no admin) that forges its sender field --------------------
read -r FPUB FSEC <<<"$("$INTRUDER" --keygen)"
ctl a allow "$FPUB" >/dev/null || fail "a does not admit the forger's key"
forger() {
  TD_PEER_PUBLIC=$FPUB TD_PEER_SECRET=$FSEC TD_INTRUDER_SENDER=$b_id TD_INTRUDER_WAIT_S=${TD_INTRUDER_WAIT_S:-1.5} \
    "$INTRUDER" "$(endpoint_of a)" "$(key_of a)" "$@"
}
forged0=$(json_field "$(ctl a status --json)" forged_senders)
o=$(forger hello)
fid=$(sed -n 's/^key_id //p' <<<"$o")
grep -q "handshake succeeded" <<<"$o" && pass "forger: its admitted key gets through the handshake" \
  || fail "forger could not connect: $o"
# (the forger has left by now: alive, suspect or dead, but a member as itself)
[ -n "$(peer_field a "$fid" state)" ] && [ "$(peer_field a "$b_id" endpoint)" = "$b_ep" ] &&
  [ "$(peer_field a "$b_id" state)" = alive ] \
  && pass "forged hello in b's name: a took in $fid (the key's node), b untouched" \
  || fail "forged hello: a's peers: $(ctl a peers --json)"
forged1=$(json_field "$(ctl a status --json)" forged_senders)
[ "$forged1" -gt "$forged0" ] && grep -q "claims sender $b_id: attributed to its key's node $fid" "$T/a.log" \
  && pass "forgery counted ($forged1) and logged as $fid's" || fail "forgery not counted: $forged1"
forb0=$(json_field "$(ctl a status --json)" forbidden_requests)
forger stop "$run_id" >/dev/null
advancing a && pass "forged stop in b's (an admin's) name: refused, the run goes on" \
  || fail "the forged stop stopped a"
forger start "$(id_of a)" >/dev/null
forb1=$(json_field "$(ctl a status --json)" forbidden_requests)
[ "$forb1" -ge $((forb0 + 2)) ] && grep -q "a run stop from a key without admin (node $fid" "$T/a.log" \
  && pass "stop and start refused as $fid's own (no admin): forbidden $forb0 -> $forb1" \
  || fail "forbidden requests $forb0 -> $forb1"
[ "$(drop_of a forbidden)" -ge 2 ] && pass "a counted $(drop_of a forbidden) forbidden drop(s)" \
  || fail "no forbidden drops"

# ---- revocation -----------------------------------------------------------------
# the forger stays connected and keeps beating while its key is revoked
uk0=$(drop_of a unknown_key)
TD_INTRUDER_WAIT_S=10 forger linger >"$T/linger.out" &
LINGER_PID=$!
for i in $(seq 30); do [ "$(peer_field a "$fid" state)" = alive ] && break; sleep 0.1; done
[ "$(peer_field a "$fid" state)" = alive ] || fail "the lingering forger is not alive on a"
ctl a revoke "$FPUB" >/dev/null || fail "revoke"
# the forger beats every 0.2 s; wait up to 5 s (ASan under make -j2 was
# slower than the 1.5 s this used to allow) for the end and a dropped beat
for i in $(seq 50); do
  [ "$(peer_field a "$fid" state)" = left ] && [ "$(drop_of a unknown_key)" -gt "$uk0" ] && break
  sleep 0.1
done
[ "$(peer_field a "$fid" state)" = left ] && pass "revoke: the forger's membership ended on a" \
  || fail "revoke: forger is $(peer_field a "$fid" state)"
uk1=$(drop_of a unknown_key)
[ "$uk1" -gt "$uk0" ] && pass "revoke: $((uk1 - uk0)) message(s) on its still-open connection dropped" \
  || fail "revoke: nothing dropped from the open connection ($uk0 -> $uk1)"
wait "$LINGER_PID"
grep -qF -- "$FPUB" "$T/a/allowed_keys" && fail "revoked key still in a's allowlist" \
  || pass "revoke: the key left a's allowlist file"
forger hello >/dev/null
[ "$(peer_field a "$fid" state)" = left ] && pass "revoke: a new hello from the revoked key is refused" \
  || fail "revoked key came back: $(peer_field a "$fid" state)"

# the local operator still stops the run everywhere
ctl a stop >/dev/null || fail "local stop"
for n in a b c; do wait_run_state $n stopped 30 || fail "$n did not stop"; done
pass "local stop: a, b and c stopped"

# ---- --insecure: loopback only, and visible ------------------------------------
run insecure_wan "$TRAIND" --data-dir "$T/w" --listen tcp://0.0.0.0:0 --control "$T/w.ctl" --insecure
expect_error insecure_wan "--insecure on tcp://0.0.0.0:0 .*loopback only .*--insecure-force"
start_node x --insecure || finish
start_node y --insecure || finish
[ "$(json_field "$(ctl x status --json)" security)" = insecure ] && pass "status: security insecure" \
  || fail "x status: $(ctl x status --json)"
grep -q "security: insecure" "$T/x.log" && pass "x logs that it is insecure" || fail "no insecure warning"
ctl y join "$(endpoint_of x)" >/dev/null || fail "y join x"
wait_peers x 1 15 || fail "x does not see y"
if [ "$SNIFF_OK" -eq 1 ]; then
  # a capture that ends without its summary line (the sniffer did not run to
  # its end: seen once in CI, exit status unknown then) or without the marker
  # is taken again once, with a new run.
  # It ends at the marker's first sighting, or after 30 s: a fixed 4 s window
  # once closed on a loaded CI machine before the run's traffic began.
  for attempt in 1 2; do
    "$SNIFF" --until-hit 30 "$MARKER" "$(port_of x)" "$(port_of y)" >"$T/sniff2.out" 2>&1 &
    SNIFF_PID=$!
    for i in $(seq 50); do grep -q listening "$T/sniff2.out" && break; sleep 0.1; done
    ctl x start --set model=mlp:784-10 --set rounds=2 --set seed=$MARKER >/dev/null || fail "x start"
    wait "$SNIFF_PID"; sniff_rc=$?
    read -r _ packets _ bytes _ hits < <(grep "^packets " "$T/sniff2.out" | tail -n1)
    [ "${hits:-0}" -ge 1 ] && break
    # (once, beside a full make check, a capture ended with its summary but
    # without the spec's packet: the capture socket can drop under load)
    echo "capture $attempt saw no marker (exit status $sniff_rc): $(cat "$T/sniff2.out")"
    for n in x y; do wait_run_state $n finished 60 || fail "$n did not finish the control run"; done
  done
  read -r _ packets _ bytes _ hits < <(grep "^packets " "$T/sniff2.out" | tail -n1)
  [ "${hits:-0}" -ge 1 ] && pass "control: the same capture of --insecure nodes sees the marker $hits time(s)" \
    || fail "the capture missed the plaintext marker (exit status $sniff_rc): $(cat "$T/sniff2.out")"
fi
finish
