#!/usr/bin/env bash
# lab_example.sh: traind-lab runs the shipped experiment (bench/wan-4.ini: 4
# nodes, 20/20/2/2 Mbit/s, three variants), shrunk to a few rounds of a tiny
# model so that it fits in make check:
#   - as root, on network namespaces with tbf uplinks (skipped without root
#     or namespaces),
#   - as an unprivileged user (setpriv; --loopback when setpriv cannot drop
#     root), on loopback, saying so;
#   - as root again, interrupted with SIGINT in the middle of a variant.
# Each time: the comparison table has every variant, the plots and ledgers
# are written, and afterwards no namespace of the lab, no traind of the test
# and no new qdisc in the root namespace is left.
. "${top_srcdir:-.}/tests/integration/lib.sh"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
B=${top_builddir:-$(pwd)} S=${top_srcdir:-.}
LAB="$B/cli/traind-lab"
export TD_LAB_BINDIR="$B" TD_LAB_NETNS="$S/tests/integration/netns_lib.sh"
SMALL=(--set rounds=3 --set model=mlp:784-16-10 --set round_timeout=20 --set eval_every=1)
EXP="$S/bench/wan-4.ini"
chmod 755 "$T"
qdiscs() { tc qdisc show 2>/dev/null | sort; }
root_qdiscs=$(qdiscs)

# leftovers LABPID: what a lab run may have left behind, one line each
leftovers() {
  local p cmd
  ip netns list 2>/dev/null | grep -E "^tw$1x" | sed 's/^/namespace /'
  for p in /proc/[0-9]*; do
    { cmd=$(tr '\0' ' ' <"$p/cmdline"); } 2>/dev/null || continue
    case $cmd in "$B/traind "*"$T/"*) echo "process ${p#/proc/}: $cmd" ;; esac
  done
  [ "$(qdiscs)" = "$root_qdiscs" ] || echo "root namespace qdiscs changed: $(qdiscs)"
}

# check_run NAME OUTDIR MODE-PATTERN: a finished lab run's output and files
check_run() {
  local name=$1 out=$2 mode=$3 i
  grep -q "$mode" "$T/$name.out" && pass "$name: $(grep -m1 '^network:' "$T/$name.out")" \
    || { fail "$name: no '$mode' in the output"; head -5 "$T/$name.out"; }
  for v in sync_none overlap_auto overlap_nofill; do
    grep -qE "^$v +[0-9a-f]{16} +finished " "$T/$name.out" \
      && pass "$name: $v in the comparison table" || fail "$name: no finished $v row"
  done
  [ "$(wc -l <"$out/summary.csv")" = 4 ] || fail "$name: summary.csv has $(wc -l <"$out/summary.csv") lines"
  grep -q 'codecs chosen per link' "$out/summary.txt" || fail "$name: no codecs in summary.txt"
  # summary.csv: numbers only, with the samples every node trained on
  if ! grep -q '%' "$out/summary.csv" && head -n1 "$out/summary.csv" | grep -q ',rounds,samples,' &&
     awk -F, 'NR > 1 && !($8 > 0) { bad = 1 } END { exit bad }' "$out/summary.csv"; then
    pass "$name: summary.csv holds numbers and a samples column"
  else fail "$name: summary.csv:"; cat "$out/summary.csv"; fi
  grep -qE '^VARIANT .* ROUNDS +SAMPLES ' "$out/summary.txt" \
    || fail "$name: no SAMPLES column in the table: $(head -n3 "$out/summary.txt")"
  for i in 0 1 2 3; do
    [ "$(sqlite3 "$out/n$i/traind.db" 'SELECT count(*) FROM runs WHERE state = "finished"')" = 3 ] \
      || fail "$name: ledger n$i does not hold 3 finished runs"
  done
  if [ -s "$out/accuracy-by-time.png" ] && [ "$(grep -c 'using 1:2' "$out/accuracy-by-time.gp")" = 3 ] \
     && [ "$(grep -c 'using 1:2' "$out/nodes-sync_none-loss.gp")" = 4 ] \
     && [ -s "$out/bytes-by-round.png" ] && [ "$(grep -c 'using 1:2' "$out/bytes-by-round.gp")" = 3 ]; then
    pass "$name: plots (3 variants by time and kB sent by round, 4 nodes of sync_none)"
  else fail "$name: plots missing"; ls "$out"; fi
  # the curves are named by the experiment's [variant] names
  titles=$(grep 'using 1:2' "$out/accuracy-by-time.gp" | grep -o 'title "[^"]*"' | tr '\n' ' ')
  [ "$titles" = 'title "sync_none" title "overlap_auto" title "overlap_nofill" ' ] \
    && pass "$name: plot curves named by variant" || fail "$name: plot titles: $titles"
}

# 1. as root, on namespaces
. "$S/tests/integration/netns_lib.sh"
if td_wan_can_run 2>"$T/why"; then
  "$LAB" "$EXP" -o "$T/ns" "${SMALL[@]}" >"$T/ns.out" 2>&1 &
  pid=$!; wait $pid; rc=$?
  [ $rc = 0 ] && pass "root lab: exit 0" || { fail "root lab: exit $rc"; tail -30 "$T/ns.out"; }
  check_run ns "$T/ns" "network: network namespaces"
  left=$(leftovers $pid)
  [ -z "$left" ] && pass "root lab: nothing left behind" || fail "root lab left: $left"
else
  echo "skipped the namespace run: $(cat "$T/why")"
fi

# 2. without root, on loopback
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null \
   && setpriv --reuid=nobody --regid=nogroup --clear-groups \
        sh -c 'test -x "$1/traind" && test -x "$1/cli/traind-lab" && test -r "$2"' _ "$B" "$EXP" 2>/dev/null
then   # (a checkout under a private home cannot be run by nobody: --loopback then)
  chmod 777 "$T"
  as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME="$T")
  how="as nobody"
else
  as_user=(); how="with --loopback"; [ "$(id -u)" -eq 0 ] && SMALL+=(--loopback)
fi
"${as_user[@]}" "$LAB" "$EXP" -o "$T/lo" "${SMALL[@]}" >"$T/lo.out" 2>&1 &
pid=$!; wait $pid; rc=$?
[ $rc = 0 ] && pass "lab $how: exit 0" || { fail "lab $how: exit $rc"; tail -30 "$T/lo.out"; }
check_run lo "$T/lo" "network: LOOPBACK .*link rates NOT emulated"
left=$(leftovers $pid)
[ -z "$left" ] && pass "lab $how: nothing left behind" || fail "lab $how left: $left"
chmod 755 "$T"

# experiment-file mistakes: one line naming the file and line, nothing started
printf '[lab]\nnodes = 3\nuplink_mbit = 20, 2\n' >"$T/bad1.ini"
run bad1 "$LAB" "$T/bad1.ini" -o "$T/bad1"
expect_error bad1 "uplink_mbit has 2 values for 3 nodes"
printf '[lab]\nnodes = 2\nbandwidth = 5\n' >"$T/bad2.ini"
run bad2 "$LAB" "$T/bad2.ini" -o "$T/bad2"
expect_error bad2 "bad2.ini:3: unknown \[lab\] key 'bandwidth'"
[ "$(rc_of bad2)" = 2 ] && [ ! -e "$T/bad2" ] || fail "bad2: exit $(rc_of bad2) or output made"

# a rate trace (root only: rates are not emulated on loopback) and latency
if [ "$(id -u)" -eq 0 ] && td_wan_can_run 2>/dev/null; then
  printf '0.5 1 up 1\n' >"$T/trace.txt"
  # (run keys with digits in their names, beta1 and beta2, reach the run)
  printf '[lab]\nnodes = 2\nuplink_mbit = 20, 2\nlatency_ms = 20\nrate_trace = trace.txt\n[run]\nmodel = mlp:784-16-10\nrounds = 3\noptimizer = adamw\nlr = 0.001\nbeta2 = 0.99\n[variant b1]\nbeta1 = 0.8\n' >"$T/trace.ini"
  "$LAB" "$T/trace.ini" -o "$T/trace" >"$T/trace.out" 2>&1 &
  pid=$!; wait $pid; rc=$?
  [ $rc = 0 ] && grep -q 'trace: node 1 up -> 1 Mbit/s' "$T/trace.out" && grep -q 'latency 20 ms' "$T/trace.out" \
    && pass "rate trace applied during the run" || { fail "trace run: exit $rc"; tail -20 "$T/trace.out"; }
  spec=$(sqlite3 "$T/trace/n1/traind.db" 'SELECT spec FROM runs' 2>/dev/null)
  grep -qE '^beta1 = 0\.(8|7999)' <<<"$spec" && grep -qE '^beta2 = 0\.(99|98999)' <<<"$spec" \
    && pass "beta1 / beta2 from the file reach the run's spec" \
    || fail "beta1 / beta2 not in n1's run spec: $(grep beta <<<"$spec" | tr '\n' ' ')"
  left=$(leftovers $pid)
  [ -z "$left" ] || fail "trace run left: $left"
fi

# 3. SIGINT in the middle of a long variant: everything torn down, ledgers kept
if [ "$(id -u)" -eq 0 ] && td_wan_can_run 2>/dev/null; then mode=ns; else mode=lo; fi
set -m   # the lab in its own process group, SIGINT not ignored (as from a terminal)
"$LAB" "$EXP" -o "$T/int" --set rounds=100000 --set model=mlp:784-16-10 \
  $([ $mode = lo ] && echo --loopback) >"$T/int.out" 2>&1 &
pid=$!
set +m
for _ in $(seq 600); do grep -q '^  \[sync_none\] .* running ' "$T/int.out" && break; sleep 0.1; done
grep -q '^  \[sync_none\] .* running ' "$T/int.out" || fail "interrupt: the run never started"
[ $mode = ns ] && [ -z "$(ip netns list | grep -E "^tw${pid}x")" ] && fail "interrupt: no namespaces to tear down"
# a shell started in the background without job control (nohup make check &)
# ignores SIGINT, and so does every bash under it: an ignored-on-entry signal
# cannot be trapped, so there the same teardown is asked for with SIGTERM
sig=INT
[ -n "$(trap -p INT)" ] && sig=TERM
kill -$sig $pid
wait $pid; rc=$?
[ $rc = 130 ] && grep -q 'interrupted: tearing down' "$T/int.out" \
  && pass "SIG$sig ($mode): exit 130, '$(grep -o 'interrupted: [^;]*' "$T/int.out")'" \
  || { fail "SIG$sig: exit $rc"; tail -20 "$T/int.out"; }
left=$(leftovers $pid)
[ -z "$left" ] && pass "SIGINT ($mode): no namespace, traind or qdisc left" || fail "SIGINT left: $left"
[ -s "$T/int/n0/traind.db" ] && pass "SIGINT: ledgers kept" || fail "SIGINT: ledger of n0 gone"
finish
