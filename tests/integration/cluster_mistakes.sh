#!/usr/bin/env bash
# cluster_mistakes.sh: the ordinary mistakes of a new user of a cluster, each
# answered by trainctl in one line that says what to do.
#  - join with a key the remote has not admitted, with a key that is not the
#    remote's, and into a full cluster: the remote's refusal (or the failed
#    CURVE handshake) reaches the joiner as one line, exit 1, and the key the
#    join admitted here is taken back; a right join afterwards works.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
INTRUDER="${top_builddir:-$(pwd)}/tests/integration/td_intruder"

# start_loner NAME [ARGS...]: a node whose key nobody admits, admitting nobody
start_loner() {
  local name=$1 i
  shift
  mkdir -p "$T/$name"
  "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info "$@" >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  NODES+=("$name")
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"; return 1
}
# exactly NAME LINE: the command run as NAME exited 1 with LINE alone on stderr
exactly() {
  local name=$1 want=$2
  if [ "$(rc_of "$name")" = 1 ] && [ "$(cat "$T/$name.err")" = "$want" ]; then
    pass "$name: $want"
  else
    fail "$name: exit $(rc_of "$name"), stderr:"; cat "$T/$name.err"; echo "expected: $want"
  fi
}
allowed_of() { ctl "$1" key --json | grep -o '"allowed":\[[^]]*\]'; }

start_node a || finish
start_node b || finish
start_loner x || finish
EA=$(endpoint_of a)

run join_unadmitted ctl x join "$EA" "$(key_of a)"
exactly join_unadmitted "trainctl: error: join refused by $EA: this node's key is not admitted \
there (on that node run: trainctl allow '$(key_of x)')"
[ "$(allowed_of x)" = '"allowed":[]' ] && pass "join_unadmitted: x admitted nothing" \
  || fail "join_unadmitted: x's allowlist is $(allowed_of x)"

ctl a allow "$(key_of x)" >/dev/null || fail "a allow x"
run join_wrong_key ctl x join "$EA" "$(key_of b)"
exactly join_wrong_key "trainctl: error: join failed: $EA dropped the handshake: the server key \
given does not match that node's key (run 'trainctl key' there)"
[ "$(allowed_of x)" = '"allowed":[]' ] && pass "join_wrong_key: x admitted nothing" \
  || fail "join_wrong_key: x's allowlist is $(allowed_of x)"

run join_right ctl x join "$EA" "$(key_of a)"
[ "$(rc_of join_right)" = 0 ] && grep -q "^joined $EA " "$T/join_right.out" \
  && pass "join_right: $(cat "$T/join_right.out")" || fail "join_right: $(cat "$T/join_right.err")"

# a cluster of 32 (the limit): the intruder's hellos fill plain node f's table
start_loner f --insecure || finish
start_loner g --insecure || finish
EF=$(endpoint_of f)
TD_INTRUDER_WAIT_S=0.5 "$INTRUDER" "$EF" "" fill 31 >/dev/null 2>&1
run join_full ctl g join "$EF"
exactly join_full "trainctl: error: join refused by $EF: cluster full (32 nodes, the limit)"
finish
