#!/usr/bin/env bash
# cluster_verify.sh: model-state agreement. Four nodes train one sync run
# with verify_every = 5; node d is tests/integration/traind_corrupt (the same
# daemon, its outer step passed through tests/integration/td_corrupt.c, which
# moves its anchor once, at a round named in a file).
#   1. a healthy run: `trainctl verify` has every member hash its state a few
#      rounds ahead and reports that the 4 of 4 agree (exit 0);
#   2. then d's model is corrupted: every honest node names d (status --json
#      verify.diverged, a state_diverged event for d), d names itself, fetches
#      the state from the members that agree, checks its hash and adopts it
#      (state_repair, state_repaired events);
#   3. after the repair d's hash is the others' again (a later state_agreed
#      event on d) and the run ends with all four on one model: the same
#      final state hash and the same test accuracy;
#   4. a second run, in overlap mode (whose anchors agree bit for bit too),
#      in which d's model stays honest but d lies about its hash: the honest
#      nodes name d and none of them repairs (one member cannot outvote the
#      others), d does not repair either (its own state is the majority's),
#      and all four end on one model.
# Also: `trainctl verify` without a run says why, and the product's traind
# holds no corruption hook.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
CORRUPT="${top_builddir:-$(pwd)}/tests/integration/traind_corrupt"

# the hook lives only in the test program
grep -q TD_CORRUPT_FILE "$CORRUPT" || fail "traind_corrupt has no corruption hook"
grep -q -e TD_CORRUPT_FILE -e td_corrupt "$TRAIND" && fail "traind holds the corruption hook"

for n in a b c; do start_node $n || finish; done
TD_CORRUPT_FILE="$T/corrupt.round" TRAIND="$CORRUPT" start_node d || finish
for n in b c d; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c d; do wait_peers $n 3 20 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "4 nodes, d runs traind_corrupt" || finish
d_id=$(cat "$T/d/node_id")

out=$(ctl a verify 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "no run is running" <<<"$out" && pass "verify without a run: $out" \
  || fail "verify without a run: rc $rc: $out"

# verify_of NODE: the "verify" object of NODE's status
verify_of() { ctl "$1" status --json | sed -E 's/.*"verify":(\{[^}]*\}).*/\1/'; }
round_of() { json_field "$(ctl "$1" status --json | sed -E 's/.*"run":\{//')" round; }

out=$(ctl a start --set model=mlp:784-64-10 --set batch=64 --set lr=0.05 --set local_steps=8 \
      --set rounds=60 --set eval_every=60 --set seed=3 --set batching=equal --set slowdown=30 \
      --set verify_every=5) || { fail "start: $out"; finish; }
for i in $(seq 300); do [ "$(round_of a)" -ge 1 ] 2>/dev/null && break; sleep 0.2; done

# 1. healthy: every member agrees
out=$(ctl a verify); rc=$?
[ $rc -eq 0 ] && grep -q "4 of 4 members agree on state [0-9a-f]\{16\}" <<<"$out" \
  && pass "trainctl verify on a healthy run: $out" || fail "verify, healthy: rc $rc: $out"
asked=$(sed -E 's/verify  round ([0-9]+):.*/\1/' <<<"$out")
# (each member decides the vote itself and its ledger writes queue behind
# the answer a gave: wait a little for the row)
agreed_of() { sql "$1" "SELECT count(*) FROM events WHERE kind = 'state_agreed'
                        AND detail LIKE 'round $asked: 4 of 4 members hold state %'"; }
for n in b c d; do
  for i in $(seq 100); do [ "$(agreed_of $n)" -eq 1 ] && break; sleep 0.1; done
  [ "$(agreed_of $n)" -eq 1 ] || fail "$n has no state_agreed event for round $asked"
done

# 2. corrupt d two rounds from now. Status names d from the vote that finds it
# until the repair's vote 3 rounds later (slowdown=30 keeps that window near
# half a second even on a fast machine; polled every 50 ms)
echo $(($(round_of d) + 2)) >"$T/corrupt.round"
seen=""
for i in $(seq 1200); do
  v=$(verify_of a)
  grep -q "\"diverged\":\[\"$d_id\"\]" <<<"$v" && { seen=$v; break; }
  sleep 0.05
done
[ -n "$seen" ] && pass "a's status names d: $seen" || fail "a's status never named d: $(verify_of a)"
grep -q "td_corrupt: outer step" "$T/d.log" || fail "d's model was not corrupted"

for n in a b c d; do wait_run_state $n finished 120 || fail "$n did not finish"; done
for n in a b c; do
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'state_diverged' AND detail LIKE '$d_id %'")
  [ "$k" -ge 1 ] && pass "$n's ledger: $k state_diverged events for d" \
    || fail "$n's ledger has no state_diverged event for d"
  k=$(sql $n "SELECT count(*) FROM events WHERE kind = 'state_diverged' AND detail NOT LIKE '$d_id %'")
  [ "$k" -eq 0 ] || fail "$n named an honest node: $k state_diverged events for others"
  [ "$(sql $n "SELECT count(*) FROM events WHERE kind = 'state_repair'")" -eq 0 ] \
    || fail "$n, honest, repaired itself"
done
sql d "SELECT kind, detail FROM events WHERE kind LIKE 'state_%' AND kind <> 'state_agreed'" \
  | sed 's/^/  d: /'
repaired=$(sql d "SELECT detail FROM events WHERE kind = 'state_repaired'")
[ -n "$repaired" ] && pass "d repaired itself: $repaired" || fail "d has no state_repaired event"
P=$(sed -E 's/.* round ([0-9]+): adopted.*/\1/' <<<"$repaired")

# 3. after the repair d agrees again, and all end on one model
later=$(sql d "SELECT count(*) FROM events WHERE kind = 'state_agreed'
               AND CAST(substr(detail, 7, instr(detail, ':') - 7) AS INTEGER) > ${P:-0}")
[ "$later" -ge 1 ] && pass "d agrees with the members after the repair ($later votes after round $P)" \
  || fail "d never agreed after its repair at round $P"
final="" acc=()
for n in a b c d; do
  v=$(verify_of $n)
  [ "$(json_field "$v" round)" = 60 ] && [ "$(json_field "$v" agree)" = 4 ] \
    || fail "$n: the last round's vote is not 4 of 4: $v"
  final+=" $(json_field "$v" hash)"
  acc[${#acc[@]}]=$(json_field "$(ctl $n status --json)" test_accuracy)
done
grep -q "^verify  round 60: 4 of 4 members agree on state [0-9a-f]\{16\}$" <<<"$(ctl a status)" \
  || fail "trainctl status has no verify line: $(ctl a status)"
[ "$(tr ' ' '\n' <<<"$final" | sort -u | grep -c .)" -eq 1 ] \
  && pass "all four end on state$final" || fail "final states differ:$final"
[ "$(printf '%s\n' "${acc[@]}" | sort -u | wc -l)" -eq 1 ] \
  && pass "all four end with test accuracy ${acc[0]}" || fail "final accuracies differ: ${acc[*]}"

# 4. d lies about its hash
events() { sql "$1" "SELECT count(*) FROM events WHERE kind = '$2'"; }
named_d() { sql "$1" "SELECT count(*) FROM events WHERE kind = 'state_diverged' AND detail LIKE '$d_id %'"; }
for n in a b c d; do eval "div0_$n=$(named_d $n) rep0_$n=$(events $n state_repair)"; done
echo lie >"$T/corrupt.round"
out=$(ctl a start --set mode=overlap --set model=mlp:784-64-10 --set batch=64 --set lr=0.05 \
      --set local_steps=8 --set rounds=30 --set eval_every=30 --set seed=4 --set batching=equal --set slowdown=12 \
      --set verify_every=5) || { fail "start, lying d: $out"; finish; }
for n in a b c d; do wait_run_state $n finished 120 || fail "lying d: $n did not finish"; done
acc=()
for n in a b c; do
  k=$(($(named_d $n) - div0_$n))
  [ "$k" -ge 6 ] && pass "lying d: $n names d in $k votes" || fail "lying d: $n named d $k times"
  [ "$(events $n state_diverged)" -eq "$(named_d $n)" ] || fail "lying d: $n named an honest node"
  [ "$(events $n state_repair)" -eq "$(eval echo "\$rep0_$n")" ] || fail "lying d: honest $n repaired"
  v=$(verify_of $n)
  grep -q "\"agree\":3,.*\"diverged\":\[\"$d_id\"\]" <<<"$v" || fail "lying d: $n's last vote: $v"
done
grep -q "^diverged $d_id: its state differs from the agreed one at round 30$" <<<"$(ctl a status)" \
  && pass "lying d: trainctl status names d" || fail "trainctl status does not name d: $(ctl a status)"
[ "$(events d state_repair)" -eq "$rep0_d" ] && pass "lying d: nobody repaired" \
  || fail "lying d: d repaired itself"
for n in a b c d; do acc[${#acc[@]}]=$(json_field "$(ctl $n status --json)" test_accuracy); done
[ "$(printf '%s\n' "${acc[@]}" | sort -u | wc -l)" -eq 1 ] \
  && pass "lying d: all four end with test accuracy ${acc[0]}" || fail "lying d: accuracies ${acc[*]}"
finish
