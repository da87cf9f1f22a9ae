#!/usr/bin/env bash
# cluster_clients.sh: the per-client view (issue 40, item 4) on 3 real nodes,
# a Dirichlet(0.1) split of fashion-mnist and client_eval = true. Asserted on
# the ledgers and trainctl:
#  - every node records every node's training rows per label (client_labels,
#    client 0), the same table on every node; the nodes' counts of a label add
#    up to the dataset's rows of it, and each node's own counts add up to the
#    rows it loaded (its log line), counted apart from the partition rule;
#  - the split is skewed as Dirichlet(0.1) makes it: the nodes' label
#    distributions differ (each node's largest class is a large share of it);
#  - client_evals has a row per node for every eval_every round and the last,
#    each an accuracy in [0, 1] on a non-empty held-out share; the shares add
#    up to the test set;
#  - `trainctl show` prints the clients, and `trainctl plot --y client_accuracy`
#    draws their spread (when gnuplot is installed).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish

ROUNDS=4
out=$(ctl a start --set model=mlp:784-32-10 --set batch=96 --set local_steps=4 \
      --set rounds=$ROUNDS --set eval_every=2 --set partition=dirichlet:0.1 --set seed=5 \
      --set client_eval=true) || { fail "start: $out"; finish; }
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
for n in a b c; do wait_run_state $n finished 120 || fail "$n did not finish"; done
[ "$failures" -eq 0 ] && pass "run $run_id finished on a, b and c" || finish
w="printf('%016x', run_id) = '$run_id'"

# the same counts on every node
for n in a b c; do
  sql $n "SELECT node, client, label, rows FROM client_labels WHERE $w ORDER BY node, client, label" >"$T/labels.$n"
done
[ "$(wc -l <"$T/labels.a")" -eq 30 ] && pass "a records 3 nodes x 10 labels" \
  || fail "a records $(wc -l <"$T/labels.a") label rows, expected 30"
cmp -s "$T/labels.a" "$T/labels.b" && cmp -s "$T/labels.a" "$T/labels.c" \
  && pass "every node records the same label counts" || fail "the nodes' label counts differ"
# a label's rows over the nodes: fashion-mnist has 6000 training rows of each
bad=$(sql a "SELECT label, sum(rows) FROM client_labels WHERE $w AND client = 0 GROUP BY label
             HAVING sum(rows) <> 6000")
[ -z "$bad" ] && pass "each label's counts add up to its 6000 rows" \
  || fail "labels whose counts do not add up to 6000: $bad"
# each node's own counts against the rows it loaded
for n in a b c; do
  rank=$(json_field "$(ctl $n status --json)" rank)
  loaded=$(grep -o "partition dirichlet:0.1: [0-9]* training rows on rank $rank" "$T/$n.log" |
           tail -1 | awk '{print $3}')
  counted=$(sql $n "SELECT sum(rows) FROM client_labels WHERE $w AND node = $rank AND client = 0")
  [ -n "$loaded" ] && [ "$loaded" = "$counted" ] \
    && pass "$n (rank $rank): its counts add up to the $loaded rows it loaded" \
    || fail "$n (rank $rank): counts add up to $counted, loaded '$loaded'"
done
# Dirichlet(0.1): every node's label mix is far from the whole set's (even:
# 6000 rows of each label): total variation distance over 0.1, where an iid
# split of 20000 rows per node gives about 0.01
tvs=$(sql a "SELECT x.node, 0.5 * sum(abs(x.rows * 1.0 / t.total - 0.1)) FROM client_labels x
             JOIN (SELECT node, sum(rows) AS total FROM client_labels WHERE $w GROUP BY node) t
             ON t.node = x.node WHERE printf('%016x', x.run_id) = '$run_id' GROUP BY x.node")
low=$(awk -F'|' '$2 < 0.1' <<<"$tvs")
[ -n "$tvs" ] && [ -z "$low" ] && pass "every node's labels are skewed (node|TV): $(tr '\n' ' ' <<<"$tvs")" \
  || fail "a node with a near-even label mix under dirichlet:0.1: $tvs"
same=$(sql a "SELECT x.node, y.node FROM client_labels x JOIN client_labels y
              ON x.run_id = y.run_id AND x.label = y.label AND x.node < y.node
              WHERE printf('%016x', x.run_id) = '$run_id'
              GROUP BY x.node, y.node HAVING sum(x.rows <> y.rows) = 0")
[ -z "$same" ] && pass "the nodes' label counts differ pairwise" || fail "identical counts: $same"

# client evaluations: rounds 2 and 4 on every node, in [0, 1]
for n in a b c; do
  got=$(sql $n "SELECT group_concat(round) FROM (SELECT round FROM client_evals WHERE $w
                AND client = 0 ORDER BY round)")
  [ "$got" = "2,4" ] && pass "$n evaluated its held-out share after rounds 2 and 4" \
    || fail "$n: client_evals rounds '$got', expected 2,4"
  bad=$(sql $n "SELECT round, accuracy, rows FROM client_evals WHERE $w
                AND NOT (accuracy BETWEEN 0 AND 1 AND rows > 0)")
  [ -z "$bad" ] && pass "$n: client accuracies in [0, 1] on non-empty shares" \
    || fail "$n: bad client_evals rows: $bad"
done
held=$(( $(sql a "SELECT rows FROM client_evals WHERE $w AND round = 4") +
         $(sql b "SELECT rows FROM client_evals WHERE $w AND round = 4") +
         $(sql c "SELECT rows FROM client_evals WHERE $w AND round = 4") ))
[ "$held" -eq 10000 ] && pass "the held-out shares add up to the 10000 test rows" \
  || fail "the held-out shares add up to $held rows, not 10000"

# trainctl show: a line per client
show=$(ctl a show "$run_id") || fail "show: $show"
lines=$(grep -c '^  node [0-2] client 0 ' <<<"$show")
[ "$lines" -eq 3 ] && pass "show prints a line per client" \
  || { fail "show prints $lines client lines"; echo "$show"; }
grep -q '^clients ' <<<"$show" && pass "show prints the clients' summary" \
  || { fail "show has no clients line"; echo "$show"; }
json=$(ctl a show "$run_id" --json)
grep -q '"clients":\[{"node":0,"client":0,' <<<"$json" && pass "show --json lists the clients" \
  || fail "show --json has no clients: ${json:0:300}"

if command -v gnuplot >/dev/null; then
  plot=$("$TRAINCTL" plot "$run_id" --y client_accuracy --x round --data-dir "$T/a" \
         --data-dir "$T/b" --data-dir "$T/c" -o "$T/spread.png" 2>&1) \
    && [ -s "$T/spread.png" ] && grep -q "median client" "$T/spread.gp" \
    && pass "plot --y client_accuracy draws the spread" || fail "plot: $plot"
  # each round's row: min median max count p10 p90; with 3 clients the sorted
  # accuracies are min, median, max, so p10 = min + 0.2 (median - min) and
  # p90 = median + 0.8 (max - median)
  rows=$(awk '/^\$c0 << EOD/ { on = 1; next } /^EOD/ { on = 0 } on' "$T/spread.gp")
  bad=$(awk 'function d(a, b) { return a > b ? a - b : b - a }
    NF != 7 || $5 != 3 || d($6, $2 + 0.2 * ($3 - $2)) > 1e-9 || d($7, $3 + 0.8 * ($4 - $3)) > 1e-9' <<<"$rows")
  [ -n "$rows" ] && [ -z "$bad" ] && pass "the spread's 10th and 90th percentiles interpolate the 3 clients" \
    || fail "spread rows: ${bad:-none}"
fi
finish
