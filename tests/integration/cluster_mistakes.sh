#!/usr/bin/env bash
# cluster_mistakes.sh: the ordinary mistakes of a new user of a cluster, each
# answered by trainctl in one line that says what to do.
#  - join with a key the remote has not admitted, with a key that is not the
#    remote's, and into a full cluster: the remote's refusal (or the failed
#    CURVE handshake) reaches the joiner as one line, exit 1, and the key the
#    join admitted here is taken back; a right join afterwards works;
#  - start with what this node can check itself (model vs dataset shape and
#    classes, a CUDA backend without CUDA, this node's limits): exit 1 with the
#    reason, and no other node heard of the run; start waits for every member:
#    a member whose limits refuse the run is named with its reason (the others
#    hold the run when start returns), and when every other member refuses,
#    start exits 1 with their reasons and the run is stopped.
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

# a cluster of 256 (the limit): the intruder's hellos fill plain node f's table
start_loner f --insecure || finish
start_loner g --insecure || finish
EF=$(endpoint_of f)
TD_INTRUDER_WAIT_S=0.5 "$INTRUDER" "$EF" "" fill 255 >/dev/null 2>&1
for _ in $(seq 100); do # f takes each in; then its table is full
  [ "$(ctl f peers --json | grep -o '"node_id"' | wc -l)" -ge 256 ] && break
  sleep 0.2
done
run join_full ctl g join "$EF"
exactly join_full "trainctl: error: join refused by $EF: cluster is full: 256 members, the most traind supports"

# ---- start: a, b (--max-batch 32) and c (--max-batch 8), x gone
ctl x leave >/dev/null || fail "x leave"
mkdir -p "$T/data"
awk 'BEGIN { srand(2); for (i = 0; i < 200; i++) { c = i % 2; printf "%d,%.3f,%.3f\n", c, c * 2 + rand(), rand() } }' >"$T/data/tiny.csv"
for n in a b; do kill -9 "$(cat "$T/$n.pid")"; done
for n in a b; do wait "$(cat "$T/$n.pid")" 2>/dev/null; done
start_node a --data-root "$T/data" || finish
start_node b --data-root "$T/data" --max-batch 32 || finish
start_node c --data-root "$T/data" --max-batch 8 || finish
EA=$(endpoint_of a)
for n in b c; do ctl $n join "$EA" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
id_of() { ctl "$1" status --json | grep -o '"node_id":"[0-9a-f]*"' | head -n1 | cut -d'"' -f4; }
runs_of() { sql "$1" "SELECT count(*) FROM runs"; }
S=(--set "dataset=csv:$T/data/tiny.csv" --set rounds=20 --set local_steps=2)

run start_shape ctl a start "${S[@]}" --set model=mlp:100-10 --set batch=16
exactly start_shape "trainctl: error: run not started: dataset has 2 features per sample but \
the model's input width is 100"
run start_classes ctl a start "${S[@]}" --set model=mlp:2-8-1 --set batch=16
exactly start_classes "trainctl: error: run not started: dataset has 2 classes but the model \
has only 1 outputs"
if grep -q "define HAVE_CUDA 1" "${top_builddir:-.}/config.h" 2>/dev/null; then
  pass "start_cuda: skipped (this build has CUDA)"
else
  run start_cuda ctl a start "${S[@]}" --set model=mlp:2-8-2 --set batch=16 --set backend=cuda
  exactly start_cuda "trainctl: error: run not started: the CUDA backend is not compiled in \
(configure --with-cuda)"
fi
run start_limit ctl c start "${S[@]}" --set model=mlp:2-8-2 --set batch=16
exactly start_limit "trainctl: error: batch 16 is over this node's limit 8 (--max-batch)"
[ "$(runs_of b)" = 0 ] && [ "$(runs_of c)" = 0 ] \
  && pass "no run reached b or c from the refused starts" \
  || fail "runs in b's and c's ledgers: $(runs_of b) $(runs_of c)"

run start_some ctl a start "${S[@]}" --set model=mlp:2-8-2 --set batch=16
rid=$(sed -n 's/^started run \([0-9a-f]*\) .*/\1/p' "$T/start_some.out")
held=$(sql b "SELECT count(*) FROM runs WHERE printf('%016x', run_id) = '$rid'")
want="started run $rid on 2 of 3 nodes; it goes on without those that refused: node $(id_of c) \
refused: batch 16 is over this node's limit 8 (--max-batch)"
[ "$(rc_of start_some)" = 0 ] && [ "$(cat "$T/start_some.out")" = "$want" ] \
  && pass "start_some: $want" || { fail "start_some: exit $(rc_of start_some):"; cat "$T/start_some.out" "$T/start_some.err"; }
[ "$held" = 1 ] && pass "start_some: b holds run $rid when start returns" \
  || fail "start_some: b's ledger has $held rows of run $rid"
for n in a b; do wait_run_state $n finished 60 || fail "start_some: $n did not finish"; done

run start_none ctl a start "${S[@]}" --set model=mlp:2-8-2 --set batch=64
rb="node $(id_of b) refused: batch 64 is over this node's limit 32 (--max-batch)"
rc="node $(id_of c) refused: batch 64 is over this node's limit 8 (--max-batch)"
line=$(cat "$T/start_none.err")
case "$line" in
  "trainctl: error: no other member can run it, so run "*" is stopped: $rb; $rc" | \
  "trainctl: error: no other member can run it, so run "*" is stopped: $rc; $rb")
    [ "$(rc_of start_none)" = 1 ] && pass "start_none: $line" || fail "start_none: exit $(rc_of start_none)" ;;
  *) fail "start_none: exit $(rc_of start_none), stderr: $line" ;;
esac
wait_run_state a stopped 30 && pass "start_none: a stopped the run" || fail "start_none: a's run: $(ctl a status)"
finish
