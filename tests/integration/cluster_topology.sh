#!/usr/bin/env bash
# cluster_topology.sh: exchange topologies (issue 39, item 1) on 5 real
# nodes, the same mlp run three times: topology = mesh, gossip:1, groups:3.
# Asserted on the ledgers:
#  - gossip:1: each round but the last averages exactly two models, a node's
#    own and that of the member 2^(r mod 3) ranks before it (the one-peer
#    exponential graph on 5 positions, tau = 3), and the last round all five;
#  - each node sends one update a round instead of four: its bytes sent over
#    the gossip rounds are under 0.4 of the mesh run's;
#  - groups:3: each round's sets are groups (a with b exactly when b with a),
#    of one to three members;
#  - both record a consensus distance per round (finite, > 0 once the models
#    part), the mesh none;
#  - groups:3 (codec none): after each round a group's members hold one
#    model bit for bit, and members of different groups different ones
#    (their checkpoints);
#  - every node ends on one model (the last round is the mesh, codec none:
#    the same test accuracy on every node, to every digit), within 5 points
#    of the mesh's in these few rounds (40 rounds: mesh 0.813, gossip:1
#    0.783, groups:3 0.788; docs/modes.md#topologies);
#  - a sixth node that joins a gossip:1 run midway mixes two models a round
#    from its first round, and the six end on one model;
#  - what gossip cannot take is refused with a reason (a sparse codec,
#    overlap, a robust rule, a bad value).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

NODES_ALL="a b c d e"
for n in $NODES_ALL; do start_node $n || finish; done
for n in b c d e; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in $NODES_ALL; do wait_peers $n 4 20 || fail "$n does not see 4 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 5 nodes" || finish

refused() { # refused SETTINGS... EXPECTED-TEXT
  local want=${*: -1} out
  out=$(ctl a start --set model=mlp:784-32-10 "${@:1:$#-1}" 2>&1) && {
    fail "accepted ${*:1:$#-1}: $out"; return; }
  grep -qF "$want" <<<"$out" && pass "refused: ${*:1:$#-1}" || fail "${*:1:$#-1}: '$out'"
}
refused --set topology=gossip:1 --set codec=topk:0.01 "topology = gossip:1: needs codec none or fp16"
refused --set topology=groups:4 --set mode=overlap "topology = groups:4: needs mode = sync"
refused --set topology=gossip:1 --set aggregate=trimmed:1 "needs aggregate = mean"
refused --set topology=ring "unknown topology 'ring'"
refused --set topology=gossip:0 "gossip:K needs K peers a round"

ROUNDS=${ROUNDS:-12}
declare -A RUN
for topo in mesh gossip:1 groups:3; do
  extra=()
  [ "$topo" = groups:3 ] && extra=(--set checkpoint_every=1 --set checkpoint_keep=0)
  out=$(ctl a start --set model=mlp:784-32-10 --set batch=64 --set local_steps=8 \
        --set rounds=$ROUNDS --set eval_every=100 --set seed=3 --set batching=equal \
        --set topology=$topo "${extra[@]}") \
    || { fail "start $topo: $out"; finish; }
  RUN[$topo]=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in $NODES_ALL; do wait_run_state $n finished 180 || fail "$topo: $n did not finish"; done
  [ "$failures" -eq 0 ] && pass "$topo run ${RUN[$topo]} finished on all 5" || finish
done
w() { echo "printf('%016x', run_id) = '${RUN[$1]}'"; }

# ranks and ids (a node's id: its log's first line)
id_of() { grep -m1 -oE 'node [0-9a-f]{16} listening' "$T/$1.log" | cut -d' ' -f2; }
declare -A ID_OF RANK_OF
for n in $NODES_ALL; do
  st=$(ctl $n status --json)
  RANK_OF[$n]=$(json_field "$st" rank)
  ID_OF[${RANK_OF[$n]}]=$(id_of $n)
done
[ "${#ID_OF[@]}" -eq 5 ] && pass "ranks 0-4: ${!ID_OF[*]}" || fail "ranks: ${!ID_OF[*]}"

# gossip:1: own + the member 2^(r mod 3) ranks before, the last round all
for n in $NODES_ALL; do
  me=${RANK_OF[$n]}
  for r in $(seq 1 $ROUNDS); do
    got=$(sql $n "SELECT members FROM rounds WHERE $(w gossip:1) AND round = $r" | tr ',' '\n' | sort | paste -sd,)
    if [ "$r" -eq $ROUNDS ]; then
      want=$(for k in 0 1 2 3 4; do echo "${ID_OF[$k]}"; done | sort | paste -sd,)
    else
      from=$(( (me + 5 - (1 << (r % 3))) % 5 ))
      want=$(printf '%s\n%s\n' "${ID_OF[$me]}" "${ID_OF[$from]}" | sort | paste -sd,)
    fi
    [ "$got" = "$want" ] || fail "gossip:1 node $n (rank $me) round $r mixed '$got', want '$want'"
  done
done
[ "$failures" -eq 0 ] && pass "gossip:1: every node mixed with the exponential graph's member each round, all five in the last"

# bytes sent per node over rounds 2..R-1: gossip well under the mesh's
for n in $NODES_ALL; do
  m=$(sql $n "SELECT sum(bytes_sent) FROM rounds WHERE $(w mesh) AND round BETWEEN 2 AND $((ROUNDS - 1))")
  g=$(sql $n "SELECT sum(bytes_sent) FROM rounds WHERE $(w gossip:1) AND round BETWEEN 2 AND $((ROUNDS - 1))")
  awk -v m="$m" -v g="$g" 'BEGIN { exit !(m > 0 && g > 0 && g < 0.4 * m) }' \
    && pass "node $n sent $g bytes in gossip rounds against $m in the mesh's" \
    || fail "node $n sent $g bytes in gossip rounds against $m in the mesh's (want < 0.4x)"
done

# groups:3: symmetric sets of one or two
for r in $(seq 1 $((ROUNDS - 1))); do
  for n in $NODES_ALL; do
    set_n=$(sql $n "SELECT members FROM rounds WHERE $(w groups:3) AND round = $r")
    k=$(tr ',' '\n' <<<"$set_n" | grep -c .)
    [ "$k" -ge 1 ] && [ "$k" -le 3 ] || fail "groups:3 round $r node $n: a set of $k ($set_n)"
    for other in $NODES_ALL; do
      [ "$other" = "$n" ] && continue
      id_o=$(id_of $other)
      if grep -q "$id_o" <<<"$set_n"; then
        sql $other "SELECT members FROM rounds WHERE $(w groups:3) AND round = $r" | grep -q "$(id_of $n)" \
          || fail "groups:3 round $r: $n grouped with $other, not $other with $n"
      fi
    done
  done
done
[ "$failures" -eq 0 ] && pass "groups:3: every round's sets are symmetric groups of one to three"

# groups:3, codec none: a group's members end each round on one model, bit
# for bit (the same mean of the same models), and members of different
# groups on different ones (their checkpoints, one a round)
for r in $(seq 1 $((ROUNDS - 1))); do
  for n in $NODES_ALL; do
    sql $n "SELECT hex(blob) FROM checkpoints WHERE $(w groups:3) AND round = $r" | md5sum >"$T/ck.$n"
  done
  for n in $NODES_ALL; do
    set_n=$(sql $n "SELECT members FROM rounds WHERE $(w groups:3) AND round = $r")
    for other in $NODES_ALL; do
      [ "$other" \< "$n" ] || continue
      if grep -q "$(id_of $other)" <<<"$set_n"; then
        cmp -s "$T/ck.$n" "$T/ck.$other" || fail "groups:3 round $r: $n and $other grouped, models differ"
      else
        cmp -s "$T/ck.$n" "$T/ck.$other" && fail "groups:3 round $r: $n and $other apart, one model"
      fi
    done
  done
done
[ "$failures" -eq 0 ] && pass "groups:3: each group's members hold one model after each round, other groups another"

# consensus distance: recorded for gossip and groups, not for the mesh
for topo in gossip:1 groups:3; do
  k=$(sql a "SELECT count(*) FROM rounds WHERE $(w $topo) AND consensus > 0 AND round < $ROUNDS")
  [ "$k" -ge 4 ] && pass "$topo: a recorded $k positive consensus distances" \
    || fail "$topo: a recorded $k positive consensus distances"
done
k=$(sql a "SELECT count(*) FROM rounds WHERE $(w mesh) AND consensus IS NOT NULL")
[ "$k" -eq 0 ] && pass "the mesh records no consensus distance" || fail "mesh: $k consensus values"

# status: the run's topology and how many members its newest row mixed
st=$(ctl a status --json)
[ "$(json_field "$st" topology)" = groups:3 ] && [ "$(json_field "$st" last_row_mixed)" = 5 ] \
  && pass "status: topology groups:3, the last round mixed 5" \
  || fail "status: topology $(json_field "$st" topology), last_row_mixed $(json_field "$st" last_row_mixed)"
ctl a status | grep -q "(groups:3: 5 in its average" && pass "status text names the topology" \
  || fail "status text: $(ctl a status | grep bytes)"

# one model at the end, near the mesh's accuracy
for topo in mesh gossip:1 groups:3; do
  accs=$(for n in $NODES_ALL; do sql $n "SELECT test_accuracy FROM runs WHERE $(w $topo)"; done | sort -u)
  [ "$(wc -l <<<"$accs")" -eq 1 ] && pass "$topo: every node ended at $accs" \
    || fail "$topo: the nodes ended apart: $(paste -sd' ' <<<"$accs")"
done
m=$(sql a "SELECT test_accuracy FROM runs WHERE $(w mesh)")
for topo in gossip:1 groups:3; do
  g=$(sql a "SELECT test_accuracy FROM runs WHERE $(w $topo)")
  awk -v m="$m" -v g="$g" 'BEGIN { exit !(g >= m - 0.05) }' \
    && pass "$topo ended at $g, the mesh at $m" || fail "$topo ended at $g, the mesh at $m"
done
# late join into a gossip run: f joins once round 4 is done; from its first
# round R every round but the last mixes two models on every node, f's
# included, and all six end on one model
LR=60 # rounds: room for f's start and admission however loaded the machine
out=$(ctl a start --set model=mlp:784-256-10 --set batch=64 --set local_steps=16 --set rounds=$LR \
      --set eval_every=100 --set seed=4 --set slowdown=6 --set topology=gossip:1) \
  || { fail "late join run: $out"; finish; }
RUN[late]=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
for _ in $(seq 300); do
  [ "$(sql a "SELECT count(*) FROM rounds WHERE $(w late)" 2>/dev/null)" -ge 2 ] && break
  sleep 0.2
done
start_node f || finish
ctl f join "$(endpoint_of a)" >/dev/null || fail "f join"
for n in $NODES_ALL f; do wait_run_state $n finished 300 || fail "late join: $n did not finish"; done
R=$(json_field "$(ctl f status --json)" first_round)
awk -v r="$R" -v n=$LR 'BEGIN { exit !(r > 2 && r < n) }' && pass "f joined the gossip run at round $R" \
  || { fail "f's first round is '$R'"; finish; }
for n in $NODES_ALL f; do
  bad=$(sql $n "SELECT group_concat(round) FROM rounds WHERE $(w late) AND round >= $R AND round < $LR
                AND length(members) != 33")
  [ -z "$bad" ] || fail "late join: $n mixed other than two models in rounds $bad"
  [ "$(sql $n "SELECT length(members) FROM rounds WHERE $(w late) AND round = $LR")" -eq $((6 * 17 - 1)) ] \
    || fail "late join: $n's last round did not average all six"
done
got=$(for n in $NODES_ALL; do sql $n "SELECT members FROM rounds WHERE $(w late) AND round >= $R"; done | grep -c "$(id_of f)")
[ "$got" -ge $((LR - R)) ] && pass "late join: f's model was mixed in $got rows of the members from round $R" \
  || fail "late join: f's model is in $got rows of the members, expected >= $((LR - R))"
[ "$failures" -eq 0 ] && pass "late join: every node mixed two models a round from round $R, all six at the end"
accs=$(for n in $NODES_ALL f; do sql $n "SELECT test_accuracy FROM runs WHERE $(w late)"; done | sort -u)
[ "$(wc -l <<<"$accs")" -eq 1 ] && pass "late join: all six ended at $accs" \
  || fail "late join: the nodes ended apart: $(paste -sd' ' <<<"$accs")"
finish
