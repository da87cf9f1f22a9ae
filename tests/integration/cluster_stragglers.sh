#!/usr/bin/env bash
# cluster_stragglers.sh: client sampling and stragglers on 4 real nodes, the
# one of rank 3 made 10x slower with `slowdown` (batching=equal, so it keeps
# its full share and stays slow). Everything is asserted on the ledgers:
#  - round_timeout alone (the fixed deadline, 30 s): every round waits for the
#    slow node, whose update is in every round's average on every node;
#  - participation = 0.5: each round's sample (round_sample events) is the
#    same on every node, names 2 of the 4 members, and each round's average
#    holds only sampled members.
#  - min_updates = 3, then round_deadline = adaptive:1: rounds close without
#    the slow node (min_updates; how often the adaptive deadline cuts it
#    depends on the arrival times, so that is only reported), every node
#    records the same contributors for every round (the coordinator's
#    RoundClose), the nodes end agreeing on one state, and the slow node is
#    never declared dead; it finishes the run too.
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

# stragglers_cut NAME KEY=VALUE: a run where rounds may close without the
# slow node; the same contributors everywhere and one state at the end
stragglers_cut() {
  local name=$1 n without members_a ok=1
  shift
  ROUNDS=10
  run_with "$name" "$@" || return
  without=$(sql "$fast" "SELECT count(*) FROM rounds WHERE $(w) AND members NOT LIKE '%$slow_id%'")
  if [ "$name" = min_updates ]; then
    [ "${without:-0}" -ge 1 ] && pass "$name: $without of $ROUNDS rounds closed without the slow node" \
      || fail "$name: every round waited for the slow node"
  else # how often the deadline cuts depends on the arrival times the load gives
    echo "  $name: $without of $ROUNDS rounds closed without the slow node"
  fi
  members_a=$(sql a "SELECT round, members FROM rounds WHERE $(w) ORDER BY round")
  for n in b c d; do
    [ "$(sql $n "SELECT round, members FROM rounds WHERE $(w) ORDER BY round")" = "$members_a" ] \
      || { ok=0; fail "$name: $n's rounds hold other contributors than a's"; }
  done
  [ $ok -eq 1 ] && [ -n "$members_a" ] && pass "$name: every node averaged the same contributors in every round"
  for n in a b c d; do
    [ "$(events_since $n state_agreed)" -ge 1 ] && [ "$(events_since $n state_diverged)" -eq 0 ] &&
      [ "$(events_since $n state_split)" -eq 0 ] || { ok=0; fail "$name: $n: $(ctl $n status | grep '^verify')"; }
  done
  [ $ok -eq 1 ] && pass "$name: the 4 nodes ended agreeing on one state"
  [ "$(events_since "$fast" peer_dead "AND detail LIKE '$slow_id%'")" -eq 0 ] \
    && pass "$name: the slow node was never declared dead (suspected $(events_since "$fast" peer_suspect "AND detail LIKE '$slow_id%'") times)" \
    || fail "$name: the slow node was declared dead"
}
stragglers_cut min_updates min_updates=3
stragglers_cut adaptive round_deadline=adaptive:1
finish
