#!/usr/bin/env bash
# cluster_scaffold.sh: strategy = scaffold (SCAFFOLD's control variates,
# issue 40 item 3) on 3 real nodes, Dirichlet(0.3) fashion-mnist,
# participation 2 of 3. Asserted on the ledgers:
#  - the run finishes on every node, and every node's verification agrees
#    (state_agreed, no state_diverged): the hash covers the model and the
#    outer state, which holds the global control variate c, so c is the same
#    on every node too;
#  - the same run with strategy = fedavg has the same round-1 losses (c and
#    every ci start at 0) and different ones later (the correction acts);
#  - with clients = 2 (a ci per virtual client) the nodes agree on model and c;
#  - a node that joins a running scaffold run late gets c with the anchor:
#    it agrees 4 of 4 at verification, no node diverges, one model at the end;
#  - what scaffold was not built for is refused with its reason.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish

refused() { # refused WHAT EXPECTED KEY=VALUE...
  local what=$1 want=$2 out args=()
  shift 2
  for kv in "$@"; do args+=(--set "$kv"); done
  out=$(ctl a start --set model=mlp:784-32-10 --set strategy=scaffold "${args[@]}" 2>&1) \
    && { fail "$what was accepted: $out"; return; }
  grep -qF "$want" <<<"$out" && pass "$what refused" || fail "$what: '$out'"
}
refused "scaffold with weighted batching" "strategy = scaffold: needs batching = equal" \
  batching=weighted momentum=0
refused "scaffold with momentum" "strategy = scaffold: needs optimizer = sgd with momentum = 0" \
  batching=equal
refused "scaffold with fragments = 2" "strategy = scaffold: needs fragments = 1" \
  batching=equal momentum=0 fragments=2
refused "scaffold in overlap mode" "strategy = scaffold: needs mode = sync" \
  batching=equal momentum=0 mode=overlap
refused "scaffold with min_updates" "needs round_deadline = fixed and no min_updates" \
  batching=equal momentum=0 min_updates=2
refused "scaffold with a lossy codec" "strategy = scaffold: needs codec = none" \
  batching=equal momentum=0 codec=qsgd:4
refused "an unknown strategy" "'fedprox' is not a strategy (accepted: fedavg, scaffold)" \
  batching=equal momentum=0 strategy=fedprox

ROUNDS=6
w() { echo "printf('%016x', run_id) = '$run_id'"; }
run_with() { # run_with STRATEGY [KEY=VALUE...]: leaves the run's id in $run_id, each node's
  local out n s=$1 args=() # last event before it in mark_N
  shift
  for kv in "$@"; do args+=(--set "$kv"); done
  for n in a b c; do eval "mark_$n=$(sql $n "SELECT coalesce(max(id), 0) FROM events")"; done
  out=$(ctl a start --set model=mlp:784-64-10 --set batch=96 --set batching=equal \
        --set momentum=0 --set lr=0.1 --set local_steps=16 --set rounds=$ROUNDS \
        --set eval_every=$ROUNDS --set verify_every=2 \
        --set partition=dirichlet:0.3 --set participation=2 --set seed=9 \
        --set strategy="$s" "${args[@]}") || { fail "$s: start: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c; do wait_run_state $n finished 120 || fail "$s: $n did not finish"; done
}
events_since() { # events_since NODE KIND: NODE's KIND events since its mark
  sql "$1" "SELECT count(*) FROM events WHERE id > $(eval "echo \$mark_$1") AND kind = '$2'"
}

run_with scaffold || finish
ok=1
for n in a b c; do
  [ "$(events_since $n state_agreed)" -ge 1 ] && [ "$(events_since $n state_diverged)" -eq 0 ] \
    && [ "$(events_since $n state_split)" -eq 0 ] \
    || { ok=0; fail "scaffold: $n: $(ctl $n status | grep '^verify')"; }
done
[ $ok -eq 1 ] && pass "scaffold: the 3 nodes' verified states (model and c) agree"
accs=$(for n in a b c; do sql $n "SELECT test_accuracy FROM runs WHERE $(w)"; done | sort -u)
[ "$(wc -l <<<"$accs")" -eq 1 ] && awk -v a="$accs" 'BEGIN { exit !(a > 0.3) }' \
  && pass "scaffold: every node ends on one model (test accuracy $accs)" \
  || fail "scaffold: the nodes' final accuracies: $(tr '\n' ' ' <<<"$accs")"
losses() { sql "$1" "SELECT round, loss FROM rounds WHERE $(w) ORDER BY round"; }
for n in a b c; do losses $n >"$T/scaffold.$n"; done

run_with fedavg || finish
for n in a b c; do losses $n >"$T/fedavg.$n"; done
for n in a b c; do
  first_s=$(grep '^1|' "$T/scaffold.$n") first_f=$(grep '^1|' "$T/fedavg.$n")
  [ -n "$first_s" ] && [ "$first_s" = "$first_f" ] \
    || fail "$n: round 1 differs with c = 0: scaffold '$first_s', fedavg '$first_f'"
done
cat "$T"/scaffold.? | grep -v '^1|' | sort >"$T/s"
cat "$T"/fedavg.? | grep -v '^1|' | sort >"$T/f"
differ=$(comm -3 "$T/s" "$T/f" | wc -l)
[ "$differ" -gt 0 ] && [ "$failures" -eq 0 ] \
  && pass "round 1 is FedAvg's on every node (c = 0); later rounds' losses differ ($differ lines)" \
  || fail "the correction changed nothing after round 1, or round 1 differed"

# virtual clients: 3 nodes x 2 clients, each with its own ci, 2 of the 6 sampled a round
run_with scaffold clients=2 || finish
ok=1
for n in a b c; do
  [ "$(events_since $n state_agreed)" -ge 1 ] && [ "$(events_since $n state_diverged)" -eq 0 ] \
    || { ok=0; fail "clients=2: $n: $(ctl $n status | grep '^verify')"; }
done
accs=$(for n in a b c; do sql $n "SELECT test_accuracy FROM runs WHERE $(w)"; done | sort -u)
[ $ok -eq 1 ] && [ "$(wc -l <<<"$accs")" -eq 1 ] && awk -v a="$accs" 'BEGIN { exit !(a > 0.3) }' \
  && pass "clients=2: the nodes agree on model and c, and end on one model ($accs)" \
  || fail "clients=2: final accuracies $(tr '\n' ' ' <<<"$accs")"

# a late joiner: d joins a running scaffold run and gets c with the anchor
# (the outer state); had it not, its hashed state would differ from the
# members' at the next verification (state_diverged)
start_node d || finish
mark_d=0
for n in a b c; do eval "mark_$n=$(sql $n "SELECT coalesce(max(id), 0) FROM events")"; done
out=$(ctl a start --set model=mlp:784-64-10 --set batch=96 --set batching=equal --set momentum=0 \
      --set lr=0.1 --set local_steps=16 --set rounds=60 --set eval_every=60 --set verify_every=2 \
      --set partition=dirichlet:0.3 --set seed=9 --set slowdown=4 --set strategy=scaffold) \
  || { fail "late join: start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
for i in $(seq 300); do
  [ "$(sql a "SELECT count(*) FROM rounds WHERE $(w)" 2>/dev/null)" -ge 4 ] && break
  sleep 0.2
done
ctl d join "$(endpoint_of a)" >/dev/null || fail "late join: d join"
for n in a b c d; do wait_run_state $n finished 180 || fail "late join: $n did not finish"; done
R=$(json_field "$(ctl d status --json)" first_round)
awk -v r="$R" 'BEGIN { exit !(r > 4 && r < 58) }' && pass "d joined the scaffold run at round $R" \
  || fail "d's first round is '$R'"
ok=1
for n in a b c d; do
  [ "$(events_since $n state_diverged)" -eq 0 ] && [ "$(events_since $n state_split)" -eq 0 ] \
    || { ok=0; fail "late join: $n: $(ctl $n status | grep '^verify')"; }
done
agreed=$(sql d "SELECT count(*) FROM events WHERE kind = 'state_agreed' AND detail LIKE '%4 of 4%'")
[ $ok -eq 1 ] && [ "$agreed" -ge 1 ] \
  && pass "late join: no divergence; d agrees 4 of 4 on model and c ($agreed verifications)" \
  || fail "late join: d's agreements naming 4 of 4: $agreed \
           ($(sql d "SELECT detail FROM events WHERE kind LIKE 'state_%'" | tail -2))"
accs=$(for n in a b c d; do sql $n "SELECT test_accuracy FROM runs WHERE $(w)"; done | sort -u)
[ "$(wc -l <<<"$accs")" -eq 1 ] && [ -n "$(sql d "SELECT test_accuracy FROM runs WHERE $(w)")" ] \
  && awk -v a="$accs" 'BEGIN { exit !(a > 0.3) }' \
  && pass "late join: the 4 nodes end on one model ($accs)" \
  || fail "late join: final accuracies $(tr '\n' ' ' <<<"$accs")"
finish
