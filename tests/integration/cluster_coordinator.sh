#!/usr/bin/env bash
# cluster_coordinator.sh: a hostile coordinator cannot part the honest models
# by withholding (issue 37, item 2). Three honest nodes and p, which runs
# tests/integration/traind_poison, in sync runs with aggregate = trimmed:1
# and a fixed deadline, where the run's coordinator (its member of lowest id)
# decides each round's contributors (RoundClose). p is given a key whose id
# is the lowest, so it coordinates. In mode close-withhold:W it trains
# honestly but sends neither its update nor its RoundClose to the honest node
# w (the one of highest id). w asks the members for the close once they have
# moved on and takes the copy signed by p, then asks the lowest other member
# of the set for p's update and takes that signed copy too, so a, b and c
# end on one model (the same final test accuracy to all digits), with
# model-state agreement off so that nothing repairs a split. Before, w closed
# each round without p's update at its deadline and the honest models parted.
# In mode equivocate:W p closes each round twice, signing one set for w and
# another for the rest: the honest nodes see it in each other's next update
# (which echoes the set its sender averaged), put p out of the run and name
# it (close_mismatch), the next member coordinates, and model-state agreement
# (verify_every = 5) repairs the one round that parted them. In mode
# close-self p closes each round on its own (flipped) update alone: a set
# under what trimmed:1 needs puts p out on every honest node (close_refused).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
POISON="${top_builddir:-$(pwd)}/tests/integration/traind_poison"
HONEST=(a b c)
HEARTBEAT_MS=500

grep -q TD_POISON_FILE "$POISON" || fail "traind_poison has no poison hook"

echo none >"$T/poison.mode"
# a node's key is made at its first start, and its id derived from it: p is
# started over with a new key until its id is below 1/16 of the range, then
# each honest node until its id is above p's, so that p has the lowest
restart_rekeyed() {
  kill -9 "$(cat "$T/$1.pid")"
  wait "$(cat "$T/$1.pid")" 2>/dev/null
  rm -rf "${T:?}/$1" "$T/$1.log"
}
start_p() { TD_POISON_FILE="$T/poison.mode" TRAIND="$POISON" start_node p; }
start_p || finish
for try in $(seq 200); do
  [[ "$(cat "$T/p/node_id")" < 1 ]] && break
  restart_rekeyed p
  start_p || finish
done
p_id=$(cat "$T/p/node_id")
for n in a b c; do
  start_node $n || finish
  for try in $(seq 40); do
    [[ "$(cat "$T/$n/node_id")" > "$p_id" ]] && break
    restart_rekeyed $n
    start_node $n || finish
  done
done
lowest=$(cat "$T"/a/node_id "$T"/b/node_id "$T"/c/node_id "$T"/p/node_id | LC_ALL=C sort | head -1)
[ -n "$p_id" ] && [ "$lowest" = "$p_id" ] && pass "p ($p_id) has the lowest id" \
  || { fail "p ($p_id) does not have the lowest id ($lowest)"; finish; }
for n in b c p; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c p; do wait_peers $n 3 20 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] || finish
w=$(for n in "${HONEST[@]}"; do echo "$(cat "$T/$n/node_id") $n"; done | sort | tail -1 | cut -d' ' -f2)
w_id=$(cat "$T/$w/node_id")

RUN=(--set model=mlp:784-32-10 --set batch=64 --set lr=0.05 --set momentum=0.9
     --set local_steps=4 --set rounds=30 --set eval_every=30 --set seed=5 --set batching=equal
     --set aggregate=trimmed:1 --set round_timeout=2 --set verify_every=0)

# run_case NAME MODE [ARGS]: a run with p's poison MODE; the honest nodes must
# end it on one model, whose accuracy is left in acc_a
run_case() {
  local name=$1 mode=$2 n s line
  shift 2
  echo "$mode" >"$T/poison.mode"
  ctl a start "${RUN[@]}" "$@" >/dev/null || fail "$name: start"
  for n in "${HONEST[@]}"; do wait_ended $n 300 || fail "$name: $n did not end the run"; done
  wait_ended p 10 || ctl p stop >/dev/null
  line="$name (poison $mode):"
  for n in "${HONEST[@]}"; do
    s=$(ctl $n status --json)
    eval "acc_$n=$(json_field "$s" test_accuracy | sed 's/null//')"
    line+=" $n $(json_field "$s" state) $(eval echo "\${acc_$n:-}")"
  done
  pass "$line"
  [ -n "$acc_a" ] && [ "$acc_a" = "$acc_b" ] && [ "$acc_b" = "$acc_c" ] \
    && pass "$name: a, b and c end on one model ($acc_a)" \
    || fail "$name: the honest models parted: a $acc_a, b $acc_b, c $acc_c"
}

run_case withhold "close-withhold:$w_id"
awk -v a="$acc_a" 'BEGIN { exit !(a >= 0.7) }' || fail "the run learned too little: $acc_a"

# w's ledger: the closes it took from others, and p's updates asked for and taken
closes=$(sql $w "SELECT count(*) FROM events WHERE kind = 'backfill' AND detail LIKE '%the round close of $p_id came from %'")
asked=$(sql $w "SELECT count(*) FROM events WHERE kind = 'backfill' AND detail LIKE '% peer $p_id: asked %'")
came=$(sql $w "SELECT count(*) FROM events WHERE kind = 'backfill' AND detail LIKE '% peer $p_id: its update came from %'")
[ "$closes" -ge 20 ] && pass "$w took p's round close from another member in $closes rounds" \
  || fail "$w took p's round close from another member in $closes rounds (of 30)"
[ "$asked" -ge 20 ] && [ "$came" -ge 20 ] \
  && pass "$w asked for p's update in $asked rounds and took a forwarded copy in $came" \
  || fail "$w asked for p's update in $asked rounds, took a copy in $came (of 30)"
# the others got p's updates and closes from p itself (a copy now and then,
# when one is slow to come, is allowed: the machine may be loaded)
for n in "${HONEST[@]}"; do
  [ $n = $w ] && continue
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'backfill' AND detail LIKE '%$p_id%'")
  [ "$k" -le 10 ] && pass "$n, which p withheld nothing from, has $k backfill events about p" \
    || fail "$n, which p withheld nothing from, has $k backfill events about p"
done

# equivocation: two signed sets for one round
run_case equivocate "equivocate:$w_id" --set verify_every=5
for n in "${HONEST[@]}"; do
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'close_mismatch' AND detail LIKE '$p_id %'")
  [ "$k" -eq 1 ] && pass "equivocate: $n put p out for two sets of one round" \
    || fail "equivocate: $n has $k close_mismatch events for p"
done
r=$(sql $w "SELECT count(*) FROM events WHERE kind = 'state_repaired'")
[ "$r" -ge 1 ] && pass "equivocate: $w's state was repaired $r time(s)" \
  || fail "equivocate: $w's state was never repaired"

# a coordinator that closes every round on its own update alone, flipped and
# scaled by 10: every honest node would average p's update and nothing else
# (0.1004 on all three in a measured run, against 0.8317 clean). A signed set
# under the 3 members trimmed:1 needs puts p out on each honest node, the next
# member coordinates, and the honest nodes learn on one model
run_case close_self close-self
awk -v a="$acc_a" 'BEGIN { exit !(a >= 0.7) }' && pass "close-self: the honest model learned ($acc_a)" \
  || fail "close-self: the honest model learned too little: $acc_a"
for n in "${HONEST[@]}"; do
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'close_refused' AND detail LIKE '$p_id %'")
  [ "$k" -eq 1 ] && pass "close-self: $n put p out for a set of its own update alone" \
    || fail "close-self: $n has $k close_refused events for p"
done
finish
