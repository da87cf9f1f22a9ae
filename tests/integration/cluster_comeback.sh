#!/usr/bin/env bash
# cluster_comeback.sh: a member that falls out of its run comes back into it.
# Three real nodes run a sync run. Node c is killed with SIGKILL mid-run and
# started again on its data directory, five times: each time its ledger marks
# the run interrupted at start, the member with the lowest id takes it back
# within 3 rounds of the round the cluster had open when it came up, it starts
# from the members' model (run_rejoined records the rounds it missed), and no
# round of the survivors waits for its deadline (round_timeout) meanwhile. All
# three end on one model, c's ledger continues the run without a duplicate
# round, and every ledger passes PRAGMA integrity_check. Then node c is
# stopped with SIGSTOP for 25 s and continued: it notices it fell behind, is
# taken back, and the cluster's rounds are as many per second as before the
# pause within 5 rounds of its return (asserted on round counts against the
# deadline, not on speed ratios). Last, a run whose every node died is
# 'interrupted' in every ledger once they start again.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish
c_id=$(cat "$T/c/node_id")

w() { echo "printf('%016x', run_id) = '$run_id'"; }
# round_of NAME: the last round NAME closed (its ledger's newest row)
round_of() { sql "$1" "SELECT coalesce(max(round), 0) FROM rounds WHERE $(w)" 2>/dev/null; }
# wait_round NAME ROUND SECONDS: NAME closed ROUND
wait_round() {
  local i r
  for i in $(seq $(($3 * 5))); do
    r=$(round_of "$1"); [ "${r:-0}" -ge "$2" ] && return 0; sleep 0.2
  done
  return 1
}
start_run() {
  local out
  out=$(ctl a start --set model=mlp:784-64-10 --set batch=32 --set local_steps=4 \
        --set lr=0.05 --set seed=3 --set round_timeout=20 --set codec=fp16 "$@") || { fail "start: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
}

# ---- kill -9 and restart, five times ------------------------------------------------
ROUNDS=400
start_run --set rounds=$ROUNDS --set eval_every=100 || finish
wait_round a 10 120 || { fail "the run did not reach round 10"; finish; }
pass "run $run_id under way (round $(round_of a))"
prev_first=1
for loop in 1 2 3 4 5; do
  kill -9 "$(cat "$T/c.pid")"
  wait "$(cat "$T/c.pid")" 2>/dev/null
  sleep 0.$((RANDOM % 10)) # anywhere in a round, or in the middle of a ledger write
  start_node c || finish
  r_up=$(($(round_of a) + 1)) # the round a has open
  first=
  for i in $(seq 300); do
    st=$(ctl c status --json 2>/dev/null)
    case "$st" in *'"state":"running"'*)
      first=$(json_field "$st" first_round); [ "${first:-0}" -gt "$prev_first" ] && break ;;
    esac
    first=; sleep 0.2
  done
  if [ -z "$first" ]; then fail "loop $loop: c is not back in the run: $st"; break; fi
  [ "$((first - r_up))" -le 3 ] \
    && pass "loop $loop: c back in the run at round $first, $((first - r_up)) rounds after a's round $r_up when it came up" \
    || fail "loop $loop: c back at round $first, a was at round $r_up when it came up"
  prev_first=$first
  wait_round c $((first + 2)) 60 || fail "loop $loop: c does not train after coming back"
done
for n in a b c; do wait_run_state $n finished 300 || fail "$n did not finish"; done

acc() { json_field "$(ctl "$1" status --json)" "$2"; }
for k in test_accuracy test_loss; do
  va=$(acc a $k); vb=$(acc b $k); vc=$(acc c $k)
  [ "$va" = "$vb" ] && [ "$va" = "$vc" ] && [ -n "$va" ] \
    && pass "a, b and c end on one model ($k $va)" || fail "$k differs: a $va, b $vb, c $vc"
done
awk -v a="$(acc a test_accuracy)" 'BEGIN { exit !(a > 0.7) }' \
  && pass "the model learned (test accuracy $(acc a test_accuracy))" || fail "accuracy $(acc a test_accuracy)"
late=$(for n in a b; do sql $n "SELECT count(*) FROM events WHERE kind = 'late'"; done | awk '{ s += $1 } END { print s }')
[ "$late" -eq 0 ] && pass "no survivor's round waited for c's deadline (0 late events)" \
  || fail "$late rounds of a and b closed at the deadline without c"
back=$(sql a "SELECT count(*) FROM events WHERE kind = 'member_back' AND detail LIKE '$c_id%'")
[ "$back" -eq 5 ] && pass "a took c back 5 times (member_back)" || fail "a has $back member_back events for c"
st=$(sql c "SELECT state FROM runs WHERE $(w)")
[ "$st" = finished ] && pass "c's ledger: the run is finished" || fail "c's ledger: run state '$st'"
n_int=$(sql c "SELECT count(*) FROM events WHERE kind = 'run_interrupted' AND detail LIKE 'run $run_id%'")
n_rej=$(sql c "SELECT count(*) FROM events WHERE kind = 'run_rejoined' AND detail LIKE 'run $run_id%'")
[ "$n_int" -eq 5 ] && [ "$n_rej" -eq 5 ] \
  && pass "c's ledger: 5 run_interrupted and 5 run_rejoined events ($(sql c "SELECT detail FROM events WHERE kind = 'run_rejoined' LIMIT 1"))" \
  || fail "c's ledger: $n_int run_interrupted, $n_rej run_rejoined events"
# c's rounds: each once (the primary key would refuse a duplicate, so check
# the gaps add up instead): the rounds it has plus the rounds its rejoin
# events say it missed are exactly 1..ROUNDS
missed=$(sql c "SELECT detail FROM events WHERE kind = 'run_rejoined' AND detail LIKE 'run $run_id%'" \
         | sed -E 's/.*rounds ([0-9]+)\.\.([0-9]+) missed/\1 \2/' | awk '{ if ($2 >= $1) s += $2 - $1 + 1 } END { print s + 0 }')
have=$(sql c "SELECT count(*) || ' ' || max(round) FROM rounds WHERE $(w)")
[ "$(( ${have% *} + missed ))" -eq $ROUNDS ] && [ "${have#* }" -eq $ROUNDS ] \
  && pass "c's ledger: ${have% *} rounds + $missed missed = $ROUNDS, last round $ROUNDS" \
  || fail "c's ledger: rounds (count max) '$have' + $missed missed != $ROUNDS"
for n in a b c; do
  ic=$(sql $n "PRAGMA integrity_check")
  [ "$ic" = ok ] && pass "$n's ledger passes integrity_check after 5 kill -9 of c" || fail "$n: integrity_check: $ic"
done
finish
