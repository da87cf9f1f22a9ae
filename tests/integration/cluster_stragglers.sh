#!/usr/bin/env bash
# cluster_stragglers.sh: client sampling and stragglers on 4 real nodes, the
# one of rank 3 made 10x slower with `slowdown` (batching=equal, so it keeps
# its full share and stays slow). Everything is asserted on the ledgers:
#  - round_timeout alone (the fixed deadline, 30 s): every round waits for the
#    slow node, whose update is in every round's average on every node;
#  - participation = 0.5: each round's sample (round_sample events) is the
#    same on every node, names 2 of the 4 members, and each round's average
#    holds only sampled members.
# Not checked here: min_updates and round_deadline = adaptive. With either,
# the slowed node fell more than 4 rounds behind, left the run as a node that
# is behind, was not taken back so near the end, and never finished (on an
# idle CI machine and under the sanitizers; docs/modes.md says so). Until a
# straggler jumps to the members' round instead, they have no passing test.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c d; do start_node $n || finish; done
for n in b c d; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c d; do wait_peers $n 3 15 || fail "$n does not see 3 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 4 nodes" || finish

w() { echo "printf('%016x', run_id) = '$run_id'"; }
ROUNDS=10

# run_with NAME KEY=VALUE...: one run; leaves its id in $run_id and each
# node's last event id before it in mark_<node>
run_with() {
  local name=$1 out n args=()
  shift
  for kv in "$@"; do args+=(--set "$kv"); done
  for n in a b c d; do eval "mark_$n=$(sql $n "SELECT coalesce(max(id), 0) FROM events")"; done
  out=$(ctl a start --set model=mlp:784-256-10 --set batch=256 --set batching=equal \
        --set slowdown=1,1,1,10 --set local_steps=32 --set rounds=$ROUNDS \
        --set eval_every=$ROUNDS --set seed=3 "${args[@]}") || { fail "$name: start: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c d; do wait_run_state $n finished 400 || fail "$name: $n did not finish"; done
}


# rounds of the run on node N whose average holds the slow node's update
with_slow() { sql "$1" "SELECT count(*) FROM rounds WHERE $(w) AND members LIKE '%$slow_id%'"; }
rows() { sql "$1" "SELECT count(*) FROM rounds WHERE $(w)"; }
mark() { eval "echo \$mark_$1"; }
events_since() { sql "$1" "SELECT count(*) FROM events WHERE id > $(mark "$1") AND kind = '$2' ${3:-}"; }

ROUNDS=6
run_with fixed
slow=""
for n in a b c d; do
  [ "$(json_field "$(ctl $n status --json)" rank)" = 3 ] && slow=$n
done
[ -n "$slow" ] || { fail "no node has rank 3"; finish; }
slow_id=$(cat "$T/$slow/node_id")
fast=$(for n in a b c d; do [ $n != "$slow" ] && echo $n; done | head -1)
got=$(with_slow "$fast")
[ "$got" -eq $ROUNDS ] && [ "$(rows "$fast")" -eq $ROUNDS ] \
  && pass "fixed deadline: all $ROUNDS rounds waited for the slow node ($slow)" \
  || fail "fixed deadline: the slow node is in $got of $(rows "$fast") rounds, expected $ROUNDS"

ROUNDS=10
run_with sampled participation=0.5 slowdown=1
samples_of() {
  sql "$1" "SELECT detail FROM events WHERE id > $(mark "$1") AND kind = 'round_sample' ORDER BY id"
}
samples_of a > "$T/sample.a"
ok=1
for n in b c d; do
  samples_of $n > "$T/sample.$n"
  cmp -s "$T/sample.a" "$T/sample.$n" || { ok=0; fail "participation: $n's samples differ from a's"; diff "$T/sample.a" "$T/sample.$n" | head -5; }
done
[ "$(wc -l < "$T/sample.a")" -eq $ROUNDS ] && [ $ok -eq 1 ] \
  && pass "participation=0.5: every node drew the same $ROUNDS samples" \
  || fail "participation=0.5: $(wc -l < "$T/sample.a") samples on a"
bad=$(grep -vc ': sampled 2 of 4: ' "$T/sample.a")
[ "$bad" -eq 0 ] && pass "participation=0.5: each sample names 2 of the 4 members" \
  || fail "participation=0.5: $bad samples of another size: $(head -2 "$T/sample.a")"
# each round's average holds sampled members only
bad=$(sql a "SELECT r.round, r.members, e.detail FROM rounds r JOIN events e
             ON e.id > $(mark a) AND e.kind = 'round_sample' AND e.detail LIKE 'round ' || r.round || ':%'
             WHERE printf('%016x', r.run_id) = '$run_id'" |
      awk -F'|' '{ n = split($2, m, ","); for (i = 1; i <= n; i++) if (index($3, m[i]) == 0) print $1 }')
[ -z "$bad" ] && [ "$(rows a)" -eq $ROUNDS ] \
  && pass "participation=0.5: every round's average holds only its sampled members" \
  || fail "participation=0.5: rounds with unsampled members: $bad"
finish
