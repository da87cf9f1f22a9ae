#!/usr/bin/env bash
# valgrind_cluster.sh: memory checking that the sanitizers cannot do. Every
# traind of a real three-node cluster runs under valgrind memcheck, which sees
# what ASan misses (writes made inside libuv and libzmq into memory the daemon
# already freed) and checks leaks at exit. The cluster goes through what a
# careful user does: join, a short sync run with a lossy codec (ternary) that
# a third node joins late, status / rounds, an overlap run stopped with
# `trainctl stop`, stop-then-start while updates are being encoded
# (slowdown=20), `leave`, and SIGTERM during a run. Every traind must exit
# by itself with status 0 and a valgrind log of "0 errors" (definite and
# indirect leaks count as errors); tests/valgrind.supp only hides libzmq /
# OpenBLAS / libuv internals.
#
# Slow (valgrind is 20-50 times slower than native), so it is not part of
# `make check`: run it with `make check-valgrind` (.ci/run does). Skips (77)
# when valgrind is not installed.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 77; }
SUPP="${top_srcdir:-.}/tests/valgrind.supp"
# one BLAS thread: the run keys ask for none, and fewer threads keep valgrind's
# serialised scheduler fast
export OPENBLAS_NUM_THREADS=1

# vg_start NAME: traind under memcheck; waits for its control socket (valgrind
# takes seconds to start it). Heartbeats at the default 500 ms: a daemon under
# valgrind is too slow to be judged by 200 ms ones (suspect after 3 missed).
vg_start() {
  local name=$1 i
  mkdir -p "$T/$name"
  valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --suppressions="$SUPP" --num-callers=30 --log-file="$T/$name.vg" \
    "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms 500 --threads 1 --log-level info --data-root "$T" >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  case " ${NODES[*]} " in *" $name "*) ;; *) NODES+=("$name") ;; esac
  for i in $(seq 600); do
    if [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ]; then
      admit_all "$name" # secure, as by default (cluster_lib.sh)
      return 0
    fi
    kill -0 "$(cat "$T/$name.pid")" 2>/dev/null || break
    sleep 0.1
  done
  fail "$name did not start under valgrind"; cat "$T/$name.log" "$T/$name.vg"; return 1
}

# vg_wait_exit NAME HOW: NAME's traind exits by itself (after leave or a
# signal) with status 0, and valgrind found nothing. Prints the error groups
# of the log otherwise.
vg_wait_exit() {
  local name=$1 how=$2 pid rc errs
  pid=$(cat "$T/$name.pid")
  wait "$pid"; rc=$?
  rm -f "$T/$name.pid"
  errs=$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+) errors.*/\1/p' "$T/$name.vg" | tail -n1)
  if [ "$rc" -eq 0 ] && [ "${errs:-x}" = 0 ]; then
    pass "$name ($how): exit 0, valgrind: 0 errors"
  else
    fail "$name ($how): exit $rc, valgrind: ${errs:-no} errors"
    grep -E '^==[0-9]+== (Invalid|Conditional|Syscall|Mismatched|Process terminating|[0-9,]+ .*bytes in|Use of uninit)' \
      "$T/$name.vg" | sort | uniq -c | head -n 20
    echo "----- valgrind log of $name (first errors)"
    awk '/== (Invalid|Conditional|Process terminating|[0-9,]+ .*definitely)/ { p = 1 } p { print; if (++n > 60) exit }' \
      "$T/$name.vg"
  fi
  # TD_VALGRIND_LOGS=DIR keeps every log for a closer look
  [ -z "${TD_VALGRIND_LOGS:-}" ] || cp "$T/$name.vg" "$TD_VALGRIND_LOGS/$name.vg"
}

# wait_round NAME N SECONDS: NAME's ledger has N rounds of the run `run_id`
wait_round() {
  local i
  for i in $(seq $(($3 * 5))); do
    [ "$(sql "$1" "SELECT count(*) FROM rounds WHERE printf('%016x', run_id) = '$run_id'" \
         2>/dev/null || echo 0)" -ge "$2" ] && return 0
    sleep 0.2
  done
  return 1
}

# start_run NAME KEY=VALUE...: start a run, set run_id. A daemon may refuse a
# start while the run it was just told to stop still winds down (its encode
# jobs finish first); that refusal is retried for a while, any other is not.
start_run() {
  local name=$1 out a i; shift
  local args=()
  for a in "$@"; do args+=(--set "$a"); done
  for i in $(seq 150); do
    out=$(ctl "$name" start "${args[@]}" 2>&1) && break
    grep -q 'still running' <<<"$out" || break
    sleep 0.2
  done
  grep -q '^started run ' <<<"$out" || { fail "start: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
}

# a small 4-class problem: a few hundred rows, so valgrind spends its time in
# the daemon's own code, not in BLAS
awk 'BEGIN { srand(5); for (i = 0; i < 400; i++) { c = i % 4; printf "%d", c;
       for (j = 0; j < 16; j++) printf ",%.3f", (j % 4 == c) * 1.5 + rand(); printf "\n" } }' \
  >"$T/train.csv"
DATA="dataset=csv:$T/train.csv"
SMALL=(model=mlp:16-32-4 batch=32 local_steps=2 eval_every=5 "$DATA")

# 1. join (the join command's control connection is where a use-after-free was)
for n in a b; do vg_start $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 60 || fail "$n does not see its peer"; done
[ "$failures" -eq 0 ] && pass "a and b joined under valgrind" || finish

# 2. a short sync run with a lossy codec; c (started beforehand: valgrind
# takes seconds to start a daemon) joins it once it is under way
vg_start c || finish
start_run a "${SMALL[@]}" codec=ternary rounds=100 slowdown=2 || finish
wait_round a 3 120 || fail "no round 3 on a"
ctl c join "$(endpoint_of a)" >/dev/null || fail "c join a"
for n in a b c; do wait_run_state $n finished 300 || fail "ternary run: $n did not finish"; done
R=$(json_field "$(ctl c status --json)" first_round)
awk -v r="$R" 'BEGIN { exit !(r > 3 && r < 100) }' && pass "c joined the running run at round $R" \
  || fail "c's first round is '$R'"
st=$(ctl b status --json) || fail "status --json"
acc=$(json_field "$st" test_accuracy)
awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }' && pass "ternary run learned (accuracy $acc)" \
  || fail "ternary run: accuracy '$acc'"
[ "$(ctl b rounds | grep -c .)" -ge 100 ] && pass "trainctl rounds lists the run" || fail "rounds"

# 3. an overlap run stopped with trainctl stop (its rounds overlap, or wait for
# their own average where an exchange takes 4x the compute)
start_run a "${SMALL[@]}" codec=topk:0.1 mode=overlap rounds=200 || finish
wait_round b 6 120 || fail "topk run: no round 6 on b"
ctl a stop >/dev/null || fail "stop"
stopped=0
for n in a b c; do wait_run_state $n stopped 120 && stopped=$((stopped + 1)) || fail "topk run: $n did not stop"; done
[ $stopped -eq 3 ] && pass "trainctl stop stopped the topk run on every node"

# 4. stop, then start at once, while the last round's update is still being
# encoded: slowdown=20 on a model large enough that its encode outlives the
# stop (this crashed the daemon that freed the run under the encoder)
BIG=(model=mlp:16-512-4 batch=32 local_steps=1 codec=topk:0.1 slowdown=20 "$DATA")
for trial in 1 2 3; do
  start_run a "${BIG[@]}" rounds=100 || break
  wait_round a 1 120 || fail "trial $trial: no round on a"
  ctl a stop >/dev/null || fail "trial $trial: stop"
done
for n in a b c; do wait_run_state $n stopped 120 || fail "stop-then-start: $n did not stop"; done
alive=0
for n in a b c; do kill -0 "$(cat "$T/$n.pid")" 2>/dev/null && alive=$((alive + 1)) || fail "$n died in stop-then-start"; done
[ $alive -eq 3 ] && pass "3 stop-then-start cycles during encodes: every daemon alive"

# 5. c leaves; 6. SIGTERM during a run stops a and b
ctl c leave >/dev/null || fail "c leave"
vg_wait_exit c leave
start_run a "${SMALL[@]}" codec=ternary rounds=500 || finish
wait_round a 2 120 || fail "SIGTERM run: no round 2 on a"
for n in a b; do kill -TERM "$(cat "$T/$n.pid")"; done
for n in a b; do vg_wait_exit $n SIGTERM; done
finish
