#!/usr/bin/env bash
# cluster_vclients.sh: virtual clients (issue 40, item 1) on 3 real nodes,
# clients = 4 (12 clients), participation = 0.5, a Dirichlet(0.5) split of
# fashion-mnist and client_eval = true. Asserted on the ledgers and trainctl:
#  - every node logs the same round_sample events, each "sampled 6 of 12
#    clients", and each round's average holds exactly the nodes that host a
#    sampled client;
#  - a node's round samples are its sampled clients x H steps x its batch
#    (it trained those clients and no other);
#  - client_labels holds a row per label for every one of the 12 clients
#    (node, client 0-3), the same table on every node, each label adding up
#    to its 6000 rows, each node's counts to the rows it loaded;
#  - client_evals scores every client's held-out share (the shares add up
#    to the test set) and `trainctl show` lists every client;
#  - the run finishes with every node on one model (the same test accuracy);
#  - clients > 1 is refused with a reason in overlap mode and with partition all;
#  - regression: a run sized by epochs (its rounds unknown until the data is
#    loaded) samples its first round too, with one client per node as with
#    four: every node logs round 1's sample, and no round waits out its
#    deadline for a member that was not sampled (no `late` events).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish

out=$(ctl a start --set model=mlp:784-32-10 --set mode=overlap --set clients=4 2>&1) \
  && fail "clients=4 in overlap mode was accepted: $out"
grep -q "clients = 4: needs mode = sync" <<<"$out" && pass "overlap with clients=4 refused" \
  || fail "overlap with clients=4: '$out'"
out=$(ctl a start --set model=mlp:784-32-10 --set clients=4 --set partition=all 2>&1) \
  && fail "clients=4 with partition=all was accepted: $out"
grep -q "clients = 4: needs a partition that splits the data" <<<"$out" \
  && pass "partition=all with clients=4 refused" || fail "partition=all with clients=4: '$out'"
out=$(ctl a start --set model=mlp:784-32-10 --set clients=4 --set fragments=2 2>&1) \
  && fail "clients=4 with fragments=2 was accepted: $out"
grep -q "clients = 4 with fragments = 2: not built" <<<"$out" \
  && pass "fragments=2 with clients=4 refused" || fail "fragments=2 with clients=4: '$out'"

ROUNDS=4
out=$(ctl a start --set model=mlp:784-32-10 --set batch=96 --set local_steps=4 \
      --set rounds=$ROUNDS --set eval_every=2 --set partition=dirichlet:0.5 --set seed=5 \
      --set clients=4 --set participation=0.5 --set client_eval=true) || { fail "start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
for n in a b c; do wait_run_state $n finished 120 || fail "$n did not finish"; done
[ "$failures" -eq 0 ] && pass "run $run_id finished on a, b and c" || finish
w="printf('%016x', run_id) = '$run_id'"

# the samples: the same on every node, 6 of the 12 clients each round
for n in a b c; do
  sql $n "SELECT detail FROM events WHERE kind = 'round_sample' ORDER BY id" >"$T/sample.$n"
done
[ "$(wc -l <"$T/sample.a")" -eq $ROUNDS ] && pass "a logged $ROUNDS samples" \
  || fail "a logged $(wc -l <"$T/sample.a") samples: $(cat "$T/sample.a")"
cmp -s "$T/sample.a" "$T/sample.b" && cmp -s "$T/sample.a" "$T/sample.c" \
  && pass "every node drew the same samples: $(head -1 "$T/sample.a")" \
  || fail "the nodes' samples differ: $(paste -d'|' "$T/sample.a" "$T/sample.b" | head -3)"
bad=$(grep -vc '^round [0-9]*: sampled 6 of 12 clients: [0-9]*\(,[0-9]*\)\{5\}$' "$T/sample.a")
[ "$bad" -eq 0 ] && pass "each sample names 6 of the 12 clients" || fail "$bad malformed samples"

# each round: the nodes hosting a sampled client are its members, and each
# node trained H x batch samples per sampled client of its own
rank_a=$(json_field "$(ctl a status --json)" rank)
steps=$(sql a "SELECT local_steps FROM rounds WHERE $w AND round = 1")
for r in $(seq 1 $ROUNDS); do
  ids=$(grep "^round $r: " "$T/sample.a" | sed 's/.*clients: //')
  hosts=$(tr ',' '\n' <<<"$ids" | awk '{print int($1 / 4)}' | sort -u | wc -l)
  members=$(sql a "SELECT members FROM rounds WHERE $w AND round = $r" | tr ',' '\n' | grep -c .)
  [ "$members" -eq "$hosts" ] || fail "round $r: $members members averaged, $hosts nodes host a sampled client ($ids)"
  mine=$(tr ',' '\n' <<<"$ids" | awk -v k="$rank_a" 'int($1 / 4) == k' | wc -l)
  got=$(sql a "SELECT samples FROM rounds WHERE $w AND round = $r")
  batch=$(sql a "SELECT batch FROM rounds WHERE $w AND round = $r") # weighted batching moves it
  [ "$got" -eq $((mine * steps * batch)) ] \
    || fail "round $r: a (rank $rank_a) trained $got samples for $mine sampled clients x $steps steps x $batch"
done
[ "$failures" -eq 0 ] && pass "each round averaged the nodes of its sampled clients, each trained its own"

# every client's label counts, the same on every node
for n in a b c; do
  sql $n "SELECT node, client, label, rows FROM client_labels WHERE $w ORDER BY node, client, label" >"$T/labels.$n"
done
[ "$(wc -l <"$T/labels.a")" -eq 120 ] && pass "a records 12 clients x 10 labels" \
  || fail "a records $(wc -l <"$T/labels.a") label rows, expected 120"
clients=$(sql a "SELECT count(DISTINCT node * 100 + client) FROM client_labels WHERE $w AND client BETWEEN 0 AND 3")
[ "$clients" -eq 12 ] && pass "the rows name clients 0-3 of each of the 3 nodes" \
  || fail "$clients distinct (node, client) pairs"
cmp -s "$T/labels.a" "$T/labels.b" && cmp -s "$T/labels.a" "$T/labels.c" \
  && pass "every node records the same label counts" || fail "the nodes' label counts differ"
bad=$(sql a "SELECT label, sum(rows) FROM client_labels WHERE $w GROUP BY label HAVING sum(rows) <> 6000")
[ -z "$bad" ] && pass "each label's counts over the 12 clients add up to its 6000 rows" \
  || fail "labels whose counts do not add up to 6000: $bad"
for n in a b c; do
  rank=$(json_field "$(ctl $n status --json)" rank)
  loaded=$(grep -o "partition dirichlet:0.5: [0-9]* training rows on rank $rank" "$T/$n.log" |
           tail -1 | awk '{print $3}')
  counted=$(sql $n "SELECT sum(rows) FROM client_labels WHERE $w AND node = $rank")
  [ -n "$loaded" ] && [ "$loaded" = "$counted" ] \
    || fail "$n (rank $rank): its clients' counts add up to $counted, it loaded '$loaded'"
done
[ "$failures" -eq 0 ] && pass "each node's clients' counts add up to the rows it loaded"

# every client's held-out score, the shares adding up to the test set
held=0
for n in a b c; do
  got=$(sql $n "SELECT count(DISTINCT client) FROM client_evals WHERE $w AND round = $ROUNDS")
  [ "$got" -eq 4 ] || fail "$n scored $got of its 4 clients after round $ROUNDS"
  held=$((held + $(sql $n "SELECT sum(rows) FROM client_evals WHERE $w AND round = $ROUNDS")))
done
[ "$held" -eq 10000 ] && pass "every client is scored; the held-out shares add up to 10000 rows" \
  || fail "the held-out shares add up to $held rows, not 10000"
show=$(ctl a show "$run_id") || fail "show: $show"
lines=$(grep -c '^  node [0-2] client [0-3] ' <<<"$show")
[ "$lines" -eq 12 ] && pass "show lists the 12 clients" \
  || { fail "show lists $lines client lines"; echo "$show"; }

# one model at the end
accs=$(for n in a b c; do sql $n "SELECT test_accuracy FROM runs WHERE $w"; done | sort -u)
[ "$(wc -l <<<"$accs")" -eq 1 ] && awk -v a="$accs" 'BEGIN { exit !(a > 0.5) }' \
  && pass "every node ends on one model (test accuracy $accs)" \
  || fail "the nodes' final accuracies: $(tr '\n' ' ' <<<"$accs")"

# a run sized by epochs: 625 steps of 96 rows / 200 a round = 4 rounds
for k in 1 4; do
  out=$(ctl a start --set model=mlp:784-32-10 --set batch=96 --set local_steps=200 --set epochs=1 \
        --set seed=7 --set clients=$k --set participation=0.5 --set round_timeout=20) \
    || { fail "start (epochs, clients=$k): $out"; continue; }
  rid=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c; do wait_run_state $n finished 120 || fail "$n did not finish run $rid"; done
  for n in a b c; do
    sql $n "SELECT detail FROM events WHERE kind = 'round_sample' AND detail LIKE 'round 1:%'
            AND id > (SELECT coalesce(max(id), 0) FROM events WHERE kind = 'run_start'
                      AND detail LIKE '%$rid%')" >"$T/first.$n"
  done
  cmp -s "$T/first.a" "$T/first.b" && cmp -s "$T/first.a" "$T/first.c" && [ -s "$T/first.a" ] \
    && pass "epochs, clients=$k: every node sampled round 1 alike: $(cat "$T/first.a")" \
    || fail "epochs, clients=$k: round 1's samples: a '$(cat "$T/first.a")' b '$(cat "$T/first.b")' c '$(cat "$T/first.c")'"
  late=$(sql a "SELECT count(*) FROM events WHERE kind = 'late' AND detail LIKE 'round %'
                AND id > (SELECT coalesce(max(id), 0) FROM events WHERE kind = 'run_start'
                          AND detail LIKE '%$rid%')")
  [ "$late" -eq 0 ] && pass "epochs, clients=$k: no round waited for an unsampled member" \
    || fail "epochs, clients=$k: $late late events on a"
done
finish
