#!/usr/bin/env bash
# cluster_poison.sh: robust aggregation against a poisoned member.
# Four nodes train mlp:784-64-10 on Fashion-MNIST; node p is
# tests/integration/traind_poison (the same daemon, its outgoing updates
# passed through tests/integration/td_poison.c, mode read from a file at every
# update). Runs, one after the other on the same cluster:
#   1. clean, aggregate = mean: the reference accuracy; nobody is refused;
#   2. clean, aggregate = trimmed:1: same accuracy, nobody is refused;
#   3-5. p poisons every update (values 1e30; sign-flipped x10; samples 10^9)
#      with aggregate = trimmed:1: every honest node ends within 1 point of
#      both clean runs (p's own data is lost to them all the same), the aggregation
#      refused p (status --json outliers, p flagged suspect, update_outlier /
#      samples_clamped / member_suspect events in the ledger) and no honest
#      node is refused;
#   6. p lies to knowledge transfer (reports loss 0, serves its model x -10):
#      every honest node scores the model, refuses it and stays within 1 point;
#   7. the flip again without the norm bound: the trimming alone keeps the
#      honest nodes within 3 points;
#   8. p sends values of 1e30 with aggregate = mean: the honest nodes do not
#      learn (what robust aggregation prevents), so the poison is real;
#   9. p trains honestly but withholds its updates from one honest node, at
#      a fixed deadline with trimmed:1 and no model-state agreement: that node
#      asks a member that holds each (backfill.c) and takes the copy, so every
#      honest node averages the same updates and all end on one model (before,
#      it closed every round without p's update while the others had it, and
#      they parted).
#  10. p signs two updates each round, one of them (scaled by 1.5) for one
#      member only: the coordinator's set names the copy it averaged, the
#      honest node holding the other drops it for that one, and all three
#      end on one model (update_mismatch events; before, they parted).
#  11. codec fp16, p flips its updates and its anchor at the reconciliation
#      after the last round: the anchors are combined by the run's rule, so
#      every honest node ends within 1 point (before, the plain mean of the
#      anchors took all three to 0.06); reconcile_via = hub is refused.
# Every run's figures are printed (ok: lines).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
POISON="${top_builddir:-$(pwd)}/tests/integration/traind_poison"
HONEST=(a b c)
# 240 rounds per run and eight runs: on a loaded CI machine (sanitizers, two
# tests at once) a node can stall past 6 x 200 ms and be taken for dead, which
# this test is not about; 600 ms beats give it 3.6 s
HEARTBEAT_MS=600

# the hook lives only in the test program
grep -q TD_POISON_FILE "$POISON" || fail "traind_poison has no poison hook"
grep -q -e TD_POISON_FILE -e td__test_poison "$TRAIND" && fail "traind holds the poison hook"

echo none >"$T/poison.mode"
for n in a b c; do start_node $n || finish; done
TD_POISON_FILE="$T/poison.mode" TRAIND="$POISON" start_node p || finish
for n in b c p; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c p; do wait_peers $n 3 20 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "4 nodes, p runs traind_poison" || finish
p_id=$(cat "$T/p/node_id")

RUN=(--set model=mlp:784-64-10 --set batch=64 --set lr=0.05 --set momentum=0.9
     --set local_steps=8 --set rounds=240 --set eval_every=80 --set seed=5 --set batching=equal)
# batching=equal: with every update in every round a run is the same computation each
# time, so runs compare without noise (weighted plans move with measured speed; that
# their sample bounds refuse nobody is checked by cluster_batching.sh)

# events NODE KIND: how many events of KIND about p the node's ledger holds
events() { sql "$1" "SELECT count(*) FROM events WHERE kind = '$2' AND detail LIKE '$p_id %'"; }

# run NAME MODE AGGREGATE [ARGS]: a run with p's poison MODE; leaves each honest node's
# final test accuracy in acc_<node> and its status JSON in $T/<name>.<node>.json
run_case() {
  local name=$1 mode=$2 agg=$3 n out
  shift 3
  echo "$mode" >"$T/poison.mode"
  # (a poison that bites at once can end the run before start answers: that
  # answer is the run's, and the nodes' states below say the rest)
  out=$(ctl a start "${RUN[@]}" --set aggregate="$agg" "$@" 2>&1) \
    || case "$out" in *"the run ended at once"*) ;; *) fail "$name: start: $out"; return 1 ;; esac
  for n in "${HONEST[@]}"; do wait_ended $n 300 || fail "$name: $n did not end the run"; done
  # p outlives honest nodes that failed (it waits round_timeout for them every round)
  wait_ended p 2 || ctl p stop >/dev/null
  wait_ended p 30 || fail "$name: p did not end the run"
  local line="$name ($agg, poison $mode):"
  for n in "${HONEST[@]}"; do
    ctl $n status --json >"$T/$name.$n.json"
    eval "acc_$n=$(json_field "$(cat "$T/$name.$n.json")" test_accuracy | sed 's/null//')"
    eval "state_$n=$(json_field "$(cat "$T/$name.$n.json")" state)"
    line+=" $n $(eval echo "\$state_$n \${acc_$n:-}")"
  done
  pass "$line"
  # every honest node computes the same step from the same updates: one model
  [ "$acc_a" = "$acc_b" ] && [ "$acc_b" = "$acc_c" ] \
    || fail "$name: the honest nodes ended on different models ($acc_a $acc_b $acc_c)"
}

# outliers NAME NODE: the "outliers" array of that node's status after NAME
outliers() { sed -E 's/.*"outliers":(\[[^]]*\]).*/\1/' "$T/$1.$2.json"; }

within() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { exit !(a != "" && a + d >= b) }'; }

run_case clean none mean || finish
ref=$(awk -v a="$acc_a" -v b="$acc_b" -v c="$acc_c" 'BEGIN { printf "%.4f", (a + b + c) / 3 }')
awk -v r="$ref" 'BEGIN { exit !(r >= 0.75) }' && pass "clean reference accuracy $ref" \
  || fail "clean run learned too little: $ref"
for n in "${HONEST[@]}"; do
  [ "$(outliers clean $n)" = "[]" ] || fail "clean mean run: $n refused someone: $(outliers clean $n)"
done

run_case clean_trimmed none trimmed:1
ref_trimmed=$(awk -v a="$acc_a" -v b="$acc_b" -v c="$acc_c" 'BEGIN { printf "%.4f", (a + b + c) / 3 }')
for n in "${HONEST[@]}"; do
  within "$(eval echo "\$acc_$n")" "$ref" 0.01 || fail "clean trimmed:1: $n 1 point below $ref"
  [ "$(outliers clean_trimmed $n)" = "[]" ] \
    || fail "clean trimmed:1 run: $n refused an honest member: $(outliers clean_trimmed $n)"
  grep -q '"aggregate":"trimmed:1, norm bound 5"' "$T/clean_trimmed.$n.json" \
    || fail "$n status does not show the aggregate rule"
done

for mode in huge flip samples; do
  case $mode in
    samples) kind=samples_clamped ;;
    *) kind=update_outlier ;;
  esac
  for n in "${HONEST[@]}"; do eval "k0_$n=$(events $n $kind) s0_$n=$(events $n member_suspect)"; done
  run_case "$mode" "$mode" trimmed:1
  for n in "${HONEST[@]}"; do
    acc=$(eval echo "\$acc_$n")
    within "$acc" "$ref_trimmed" 0.01 && within "$acc" "$ref" 0.01 \
      && pass "$mode: $n within 1 point of the clean runs ($acc; clean trimmed:1 $ref_trimmed, mean $ref)" \
      || fail "$mode: $n test accuracy $acc, clean $ref_trimmed (trimmed:1), $ref (mean)"
    o=$(outliers "$mode" $n)
    grep -q "\"node_id\":\"$p_id\"[^}]*\"suspect\":true" <<<"$o" \
      && pass "$mode: $n reports p suspect: $o" || fail "$mode: $n does not report p: $o"
    [ "$(grep -o '"node_id"' <<<"$o" | wc -l)" -eq 1 ] || fail "$mode: $n refused an honest node: $o"
  done
  for n in "${HONEST[@]}"; do
    k=$(($(events $n $kind) - k0_$n)) s=$(($(events $n member_suspect) - s0_$n))
    [ "$k" -ge 200 ] && [ "$s" -eq 1 ] && pass "$mode: $n ledger: $k $kind events for p, member_suspect" \
      || fail "$mode: $n ledger: $k $kind events, $s member_suspect for p"
  done
done
grep -q "^suspect $p_id: " <<<"$(ctl a status)" && pass "trainctl status names the suspect" \
  || fail "trainctl status: $(ctl a status)"

# knowledge transfer: p reports a validation loss of 0 at every probe and
# serves its model scaled by -10. Each honest node fetches it (its own loss
# is higher than p's word), scores it on the probe rows, and refuses it; before
# that check every honest node merged it (a `transfer` event naming p)
for n in "${HONEST[@]}"; do
  eval "t0_$n=$(sql $n "SELECT count(*) FROM events WHERE kind = 'transfer_refused' AND detail LIKE '%$p_id%'")"
  eval "m0_$n=$(sql $n "SELECT count(*) FROM events WHERE kind = 'transfer' AND detail LIKE '%$p_id%'")"
done
run_case transfer transfer trimmed:1 --set transfer=40
for n in "${HONEST[@]}"; do
  t=$(($(sql $n "SELECT count(*) FROM events WHERE kind = 'transfer_refused' AND detail LIKE '%$p_id%'") - t0_$n))
  m=$(($(sql $n "SELECT count(*) FROM events WHERE kind = 'transfer' AND detail LIKE '%$p_id%'") - m0_$n))
  acc=$(eval echo "\$acc_$n")
  [ "$t" -ge 1 ] && [ "$m" -eq 0 ] && within "$acc" "$ref_trimmed" 0.01 \
    && pass "transfer: $n refused p's model $t times, merged it 0 times ($acc)" \
    || fail "transfer: $n refused p's model $t times, merged it $m times, test accuracy $acc (clean $ref_trimmed)"
done

# withholding: p sends its update to every honest node but one, w: the one of
# highest id, so that w is not the coordinator (the member of lowest id, which
# would cut p at its deadline, and all would leave p out). The coordinator's
# set names p (it holds p's update); w, lacking it, asks for it. p also lies
# in each update's echo of the set it averaged for the round before: were an
# echo taken without the coordinator's signature of that set, the honest
# nodes would put the coordinator out (close_mismatch) on p's word alone
w=$(for n in "${HONEST[@]}"; do echo "$(cat "$T/$n/node_id") $n"; done | sort | tail -1 | cut -d' ' -f2)
w_id=$(cat "$T/$w/node_id")
backfills() { sql "$1" "SELECT count(*) FROM events WHERE kind = 'backfill' AND detail LIKE '% peer $p_id: $2%'"; }
asked0=$(backfills $w asked) came0=$(backfills $w "its update came from")
run_case withhold "lie-withhold:$w_id" trimmed:1 --set rounds=30 --set eval_every=30 \
  --set round_timeout=1 --set verify_every=0
asked=$(($(backfills $w asked) - asked0)) came=$(($(backfills $w "its update came from") - came0))
[ "$asked" -ge 20 ] && [ "$came" -ge 20 ] \
  && pass "withhold: $w asked for p's update in $asked rounds and took a forwarded copy in $came" \
  || fail "withhold: $w asked for p's update in $asked rounds, took a copy in $came (of 30)"
# (a node that p sent its updates to asks only when one is slow to come: a
# loaded machine, now and then)
coordinator=$(cat "$T"/{a,b,c,p}/node_id | LC_ALL=C sort | head -1)
for n in "${HONEST[@]}"; do
  [ $n = $w ] && continue
  k=$(backfills $n asked)
  [ "$k" -le 5 ] || fail "withhold: $n, which p sent its updates to, asked for them $k times"
  [ "$(cat "$T/$n/node_id")" = "$coordinator" ] && continue # it checks no echo of its own set
  grep -q "says it averaged another set for round .* without that coordinator's signature" \
    "$T/$n.log" && pass "withhold: $n ignored p's false echo of a round's set" \
    || fail "withhold: $n logged nothing of p's false echoes"
done
for n in "${HONEST[@]}"; do
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'close_mismatch'")
  [ "$k" -eq 0 ] && pass "withhold: $n put no coordinator out on p's echoes" \
    || fail "withhold: $n put a coordinator out $k times on p's unsigned word"
done

# two-faced: p signs two updates each round, its own scaled by 1.5 for one
# member and as computed for the others (codec none: each member gets the
# same bytes otherwise). The coordinator's set names the digest of the copy
# it averaged; an honest node holding the other copy drops it and takes the
# coordinator's, so all three average the same (before, the one told
# otherwise averaged its own copy and the honest models parted)
mismatches() { sql "$1" "SELECT count(*) FROM events WHERE kind = 'update_mismatch' AND detail LIKE '% peer $p_id:%'"; }
mm0=0
for n in "${HONEST[@]}"; do mm0=$((mm0 + $(mismatches $n))); done
# (K = 1: p's first link, to the coordinator, the member of lowest id, so
# two honest nodes drop theirs; K = 2: another's, which drops its own)
for k in 1 2; do
  run_case two_faced_$k two-faced:$k trimmed:1 --set rounds=30 --set eval_every=30 \
    --set verify_every=0
  mm=0
  for n in "${HONEST[@]}"; do mm=$((mm + $(mismatches $n))); done
  mm=$((mm - mm0)) mm0=$((mm0 + mm))
  [ "$mm" -ge 20 ] && pass "two-faced:$k: the honest nodes dropped p's other update $mm times (30 rounds)" \
    || fail "two-faced:$k: the honest nodes dropped p's other update $mm times in 30 rounds"
done

# without the norm bound the coordinate-wise trimming alone holds off the flip,
# though not as well: where p's flipped value is not an extreme it is averaged in.
# (verify_every = 0: model-state agreement repairs p to the honest state every
# 10 rounds, which sharpens its flip: 0.8215 against 0.8381 in one measured
# pair; that attacker is the norm bound's to stop, as the runs above show)
run_case flip_unbounded flip trimmed:1 --set norm_bound=off --set verify_every=0
for n in "${HONEST[@]}"; do
  acc=$(eval echo "\$acc_$n")
  within "$acc" "$ref_trimmed" 0.03 && pass "flip, norm_bound=off: $n within 3 points ($acc)" \
    || fail "flip, norm_bound=off: $n test accuracy $acc, clean $ref_trimmed"
done

# a lossy codec: the anchors drift apart and are reconciled after the last
# round. p's anchor is flipped like its updates; the honest nodes combine the
# anchors by the run's rule (the norm bound refuses p's), so all three end on
# one model within 1 point (before, the anchors were averaged: 0.0584 for all
# three against a clean 0.8323). A hub, whose mean every member would take
# on trust, is refused under a robust rule.
anchors() { sql "$1" "SELECT count(*) FROM events WHERE kind = 'anchor_outlier' AND detail LIKE '$p_id %'"; }
for n in "${HONEST[@]}"; do eval "ao0_$n=$(anchors $n)"; done
run_case reconcile flip trimmed:1 --set codec=fp16
for n in "${HONEST[@]}"; do
  acc=$(eval echo "\$acc_$n") ao=$(($(anchors $n) - ao0_$n))
  within "$acc" "$ref_trimmed" 0.01 && [ "$ao" -ge 1 ] \
    && pass "reconcile (fp16): $n within 1 point ($acc), p's anchor refused ($ao anchor_outlier)" \
    || fail "reconcile (fp16): $n test accuracy $acc (clean $ref_trimmed), $ao anchor_outlier for p"
done
out=$(ctl a start "${RUN[@]}" --set aggregate=trimmed:1 --set codec=fp16 --set reconcile_via=hub 2>&1) \
  && fail "reconcile_via = hub under trimmed:1 started: $out"
grep -q "reconcile_via = hub: every member would take the hub's mean on trust" <<<"$out" \
  && pass "reconcile_via = hub refused under trimmed:1" || fail "hub refusal: $out"

# the same poison with a plain mean: the attack is real (POISON_MEAN="huge flip
# samples" also records what the other two do to a mean; make check runs huge)
for mode in ${POISON_MEAN:-huge}; do
  run_case "mean_$mode" $mode mean
  [ "$mode" = huge ] || continue
  for n in "${HONEST[@]}"; do
    acc=$(eval echo "\$acc_$n")
    awk -v a="$acc" -v r="$ref" 'BEGIN { exit !(a == "" || a + 0.2 < r) }' \
      && pass "mean: $n is ruined by p ($(eval echo "\$state_$n"), test accuracy ${acc:-none})" \
      || fail "mean: $n unharmed by 1e30 updates ($acc): the poison did not bite"
  done
done
finish
