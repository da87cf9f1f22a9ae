#!/usr/bin/env bash
# cluster_wakeup.sh: a node that sleeps through a whole run never restarts
# it. Three real nodes; c is stopped (SIGSTOP) just before a starts a run on
# the three of them, so the run's RunStart waits in c's socket. a and b run
# it to the end without c (round_timeout) and record, in every round's row,
# which members and partitions (ranks) took part, and in the run's row (and
# status, show) that c's partition was never trained. Then c is continued
# (SIGCONT): it must neither run the finished run as its rank nor take a or b
# back into it as late joiners; it learns from them that the run ended and
# records it as missed. The finished run's runs row and rounds rows on a and
# b are byte for byte what they were, and neither runs anything again.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish
id_of() { tr -d "\n" <"$T/$1/node_id"; }
# ranks are the places in the sorted member list
rank_of() { for n in a b c; do id_of $n; echo; done | sort | grep -n "$(id_of "$1")" | cut -d: -f1 | awk '{ print $1 - 1 }'; }

kill -STOP "$(cat "$T/c.pid")"
out=$(ctl a start --set model=mlp:784-32-10 --set batch=32 --set local_steps=2 --set rounds=30 \
      --set lr=0.05 --set seed=5 --set round_timeout=1) || { kill -CONT "$(cat "$T/c.pid")"; fail "start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
nodes=$(json_field "$(ctl a status --json)" nodes)
[ "$nodes" = 3 ] && pass "run $run_id started on 3 nodes while c sleeps" \
  || fail "run $run_id started on $nodes nodes (c should be a member)"
for n in a b; do wait_run_state $n finished 120 || fail "$n did not finish run $run_id"; done
[ "$failures" -eq 0 ] && pass "a and b finished the run without c" || { kill -CONT "$(cat "$T/c.pid")"; finish; }

w="printf('%016x', run_id) = '$run_id'"
record() {
  sql "$1" "SELECT state, quote(test_accuracy), ended, quote(untrained), spec FROM runs WHERE $w"
  sql "$1" "SELECT * FROM rounds WHERE $w ORDER BY round"
  sql "$1" "SELECT count(*) FROM updates WHERE $w"
}
for n in a b; do record $n >"$T/$n.before"; done
acc=$(sql a "SELECT test_accuracy FROM runs WHERE $w")

# what the ledger says about who took part
rc=$(rank_of c)
ab=$(for n in a b; do id_of $n; echo; done | sort | paste -sd, -)
parts_ab=$(for n in a b; do rank_of $n; done | sort -n | paste -sd, -)
# (the starter waits, bounded, for every member to hold the run before its
# first round, and c never answers: b's first rounds may close on the round
# timeout without a, and its ledger says so. c's partition is in no round.)
cid=$(id_of c)
for n in a b; do
  bad=$(sql $n "SELECT count(*) FROM rounds WHERE $w AND (instr(members, '$cid') > 0 OR ','||partitions||',' LIKE '%,$rc,%' OR members IS NULL)")
  both=$(sql $n "SELECT count(*) FROM rounds WHERE $w AND members IS '$ab' AND partitions IS '$parts_ab'")
  total=$(sql $n "SELECT count(*) FROM rounds WHERE $w")
  [ "$total" -eq 30 ] && [ "$bad" -eq 0 ] && [ "$both" -ge 25 ] \
    && pass "$n's ledger: no round of 30 records c or partition $rc; $both record members $ab, partitions $parts_ab" \
    || fail "$n's ledger: $bad of $total rounds record c or no members, $both record both a and b: $(sql $n "SELECT round, members, partitions FROM rounds WHERE $w LIMIT 3")"
  u=$(sql $n "SELECT untrained FROM runs WHERE $w")
  [ "$u" = "$rc" ] && pass "$n's ledger: partition $rc (c's) never trained" \
    || fail "$n's ledger: untrained '$u', not c's partition $rc"
done
grep -qE "^untrained partitions no round trained: $rc \(node $(id_of c)\)$" <<<"$(ctl a status)" \
  && pass "a's status says partition $rc (node c) was never trained" \
  || { fail "a's status does not name the untrained partition:"; ctl a status; }
TRAINCTL_OUT=$("$TRAINCTL" show --db "$T/a" "$run_id" 2>&1)
grep -qE "^untrained  partitions $rc: no round trained them$" <<<"$TRAINCTL_OUT" \
  && pass "show says partition $rc was never trained" || { fail "show:"; echo "$TRAINCTL_OUT"; }

# c wakes up: the RunStart of the finished run waits for it
kill -CONT "$(cat "$T/c.pid")"
st=
for i in $(seq 100); do
  st=$(sql c "SELECT state FROM runs WHERE $w" 2>/dev/null)
  [ "$st" = missed ] && break
  sleep 0.2
done
[ "$st" = missed ] && pass "c's ledger records the run as missed" || fail "c's ledger: run state '$st'"
sleep 2 # anything c would do to a and b (a start, an admission) has happened by now
for n in a b; do
  record $n >"$T/$n.after"
  if cmp -s "$T/$n.before" "$T/$n.after"; then
    pass "$n's ledger: run $run_id's runs row and its 30 rounds are unchanged (test_accuracy $acc)"
  else
    fail "$n's ledger: run $run_id's rows changed after c woke up:"
    diff "$T/$n.before" "$T/$n.after" | head -12
  fi
  case "$(ctl $n status --json)" in *'"state":"running"'*) fail "$n runs again after c woke up" ;;
    *) pass "$n runs nothing after c woke up" ;; esac
  joined=$(sql $n "SELECT count(*) FROM events WHERE kind IN ('member_back', 'member_added', 'run_rejoined')")
  [ "$joined" -eq 0 ] || fail "$n was taken into a run again ($joined member/rejoin events)"
done
case "$(ctl c status --json)" in *'"state":"running"'*) fail "c still runs the finished run" ;;
  *) pass "c runs nothing" ;; esac
c_rounds=$(sql c "SELECT count(*) FROM rounds WHERE $w")
[ "$c_rounds" -eq 0 ] && pass "c trained no round of the finished run" \
  || fail "c recorded $c_rounds rounds of the finished run"
grep -q "run $run_id already ended on 2 of its 2 other members while this node was away" "$T/c.log" \
  && pass "c logged why it did not run it" || fail "c's log does not say the run ended elsewhere"
finish
