#!/usr/bin/env bash
# cluster_consensus.sh: one consensus whatever a member tells each node (issue
# 37, item 2; row 4 of its table). Three honest nodes and p, which runs
# tests/integration/traind_liar (the same daemon, its update chunks passed
# through tests/integration/td_liar.c: the first peer it sends to is told a
# capacity of 1e6 samples/s, the second a capacity of 1), in sync runs with
# batching=weighted and aggregate=trimmed:1, one after the other on the same
# cluster:
#  1. clean: the reference; a, b and c end on one model and name nobody;
#  2. p lies about its capacity: a, b and c still end on one model (same
#     final test accuracy to all digits) within 1 point of the clean run (a
#     gap of exactly 1 point at the 4 digits status prints counts as within:
#     0.8174 against 0.8274 was 0.0100000000000000089 in awk); no
#     honest member's samples were cut to a plan (the batch plans agreed);
#     every honest node names p (status --json outliers: mismatched, a
#     capacity_mismatch event in its ledger; status's text and the log);
#  3. p also lies in the capacities it echoes for the others (x 1000 to one,
#     / 1000 to the other): a, b and c still end on one model;
#  4. p tells one node a quarter of the samples it trained on (a claim below
#     the plan's bound): a, b and c still end on one model (updates weigh
#     what the agreed plan gave their sender).
# Before agreed capacities, run 2 split the models: the told-1e6 node gave p
# most of the batch and cut the others' samples to their small share, the
# told-1 node did not.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
LIAR="${top_builddir:-$(pwd)}/tests/integration/traind_liar"
HONEST=(a b c)
HEARTBEAT_MS=500

# the hook lives only in the test program
grep -q TD_LIAR_FILE "$LIAR" || fail "traind_liar has no lying hook"
grep -q TD_LIAR_FILE "$TRAIND" && fail "traind holds the lying hook"

echo none >"$T/liar.mode"
for n in a b c; do start_node $n || finish; done
TD_LIAR_FILE="$T/liar.mode" TRAIND="$LIAR" start_node p || finish
for n in b c p; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c p; do wait_peers $n 3 20 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "4 nodes, p runs traind_liar" || finish
p_id=$(cat "$T/p/node_id")

RUN=(--set model=mlp:784-10 --set batch=64 --set lr=0.05 --set local_steps=2 --set rounds=120
     --set eval_every=1000 --set seed=5 --set batching=weighted --set aggregate=trimmed:1
     --set round_timeout=10)

# run_case NAME MODE: a run with p lying as MODE; leaves each honest node's final
# test accuracy in acc_<node> and the run's id in run_id
run_case() {
  local name=$1 n out
  echo "$2" >"$T/liar.mode"
  out=$(ctl a start "${RUN[@]}") || { fail "$name: start: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in "${HONEST[@]}" p; do
    wait_run_state $n finished 120 || fail "$name: the run did not finish on $n"
  done
  for n in "${HONEST[@]}"; do
    eval "acc_$n=$(json_field "$(ctl $n status --json)" test_accuracy | sed 's/null//')"
  done
  echo "ok: $name: test accuracy a $acc_a, b $acc_b, c $acc_c"
}

# one_model NAME: a, b and c end on one model
one_model() {
  [ -n "$acc_a" ] && [ "$acc_a" = "$acc_b" ] && [ "$acc_b" = "$acc_c" ] \
    && pass "$1: a, b and c end on one model ($acc_a)" \
    || fail "$1: the honest models parted: a $acc_a, b $acc_b, c $acc_c"
}

# clamped NODE RUN: samples_clamped events of RUN about an honest member, on NODE
clamped_honest() {
  local since
  since=$(sql "$1" "SELECT coalesce(min(started), 0) FROM rounds WHERE run_id = $((16#$2))")
  sql "$1" "SELECT count(*) FROM events WHERE kind = 'samples_clamped' AND at >= $since
            AND detail NOT LIKE '$p_id %'"
}

run_case clean none
one_model clean
clean_acc=$acc_a
for n in "${HONEST[@]}"; do
  e=$(sql $n "SELECT count(*) FROM events WHERE kind = 'capacity_mismatch'")
  [ "$e" = 0 ] && pass "clean: $n names nobody" || fail "clean: $n named a member $e times"
done

run_case capacity capacity
one_model "p lies about its capacity"
awk -v a="$acc_a" -v r="$clean_acc" 'BEGIN { d = a - r; if (d < 0) d = -d; exit !(a != "" && d <= 0.01 + 1e-9) }' \
  && pass "p lies about its capacity: $acc_a, clean $clean_acc (within 1 point)" \
  || fail "p lies about its capacity: $acc_a, clean $clean_acc"
for n in "${HONEST[@]}"; do
  k=$(clamped_honest $n "$run_id")
  [ "$k" = 0 ] && pass "$n cut no honest member's samples" \
    || fail "$n cut honest members' samples $k times (its plan was not the others')"
  m=$(ctl $n status --json | grep -o "\"node_id\":\"$p_id\",[^}]*" | grep -o '"mismatched":[0-9]*' |
    cut -d: -f2)
  e=$(sql $n "SELECT count(*) FROM events WHERE kind = 'capacity_mismatch' AND detail LIKE '$p_id %'")
  [ "${m:-0}" -gt 0 ] && [ "$e" -ge 1 ] \
    && pass "$n named p: capacity heard differently in ${m} rounds, $e ledger event" \
    || fail "$n did not name p (mismatched ${m:-none}, events $e)"
done
ctl b status | grep -q "$p_id: .*; capacity heard differently in [0-9]* rounds" \
  && pass "b's status names p" || fail "b's status does not name p: $(ctl b status)"
grep -q "member $p_id: the members heard different capacities from it" "$T/a.log" \
  && pass "a logged the liar" || fail "a did not log the liar"

run_case echo both
one_model "p lies about its capacity and the others'"
awk -v a="$acc_a" -v r="$clean_acc" 'BEGIN { d = a - r; if (d < 0) d = -d; exit !(a != "" && d <= 0.01 + 1e-9) }' \
  && pass "p lies about everyone's capacity: $acc_a, clean $clean_acc (within 1 point)" \
  || fail "p lies about everyone's capacity: $acc_a, clean $clean_acc"

run_case samples samples
one_model "p claims other samples to each node"
awk -v a="$acc_a" -v r="$clean_acc" 'BEGIN { d = a - r; if (d < 0) d = -d; exit !(a != "" && d <= 0.01 + 1e-9) }' \
  && pass "p claims other samples to each node: $acc_a, clean $clean_acc (within 1 point)" \
  || fail "p claims other samples to each node: $acc_a, clean $clean_acc"
finish
