#!/usr/bin/env bash
# lab_federated.sh: traind-lab runs the shipped federated example
# (bench/fed-100.ini: 100 virtual clients on 4 daemons, Dirichlet(0.1),
# participation 0.1, FedAvg / FedProx / SCAFFOLD / FedAdam), shrunk to a few
# rounds of a tiny model on loopback so that it fits in make check. Checks:
# every variant finishes; each round samples 10 of the 100 clients, the same
# ones on every node; every node records the 100 clients' label counts; the
# variants' specs carry their strategy; the per-client accuracy spread and the
# accuracy-by-round plot are drawn.
. "${top_srcdir:-.}/tests/integration/lib.sh"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
B=${top_builddir:-$(pwd)} S=${top_srcdir:-.}
export TD_LAB_BINDIR="$B" TD_LAB_NETNS="$S/tests/integration/netns_lib.sh"
VARIANTS="fedavg fedprox scaffold fedadam"
OUT="$T/fed"

"$B/cli/traind-lab" "$S/bench/fed-100.ini" -o "$OUT" --loopback --set rounds=4 \
  --set model=mlp:784-16-10 --set eval_every=2 >"$T/lab.out" 2>&1
rc=$?
[ $rc = 0 ] && pass "the example ran (exit 0)" || { fail "traind-lab exit $rc"; tail -30 "$T/lab.out"; }
for v in $VARIANTS; do
  grep -qE "^$v +[0-9a-f]{16} +finished " "$T/lab.out" \
    && pass "$v finished" || fail "no finished $v row in the comparison"
done

sql() { sqlite3 "$OUT/n$1/traind.db" "$2" 2>/dev/null; }
# the same 10 of 100 clients on every node, every round of the 4 variants
# (the ledger's events are not keyed by run: 4 x 4 rounds in order)
for i in 0 1 2 3; do
  sql $i "SELECT detail FROM events WHERE kind = 'round_sample' ORDER BY id" >"$T/sample.$i"
done
n=$(grep -c ': sampled 10 of 100 clients: ' "$T/sample.0")
if [ "$n" = 16 ] && cmp -s "$T/sample.0" "$T/sample.1" && cmp -s "$T/sample.0" "$T/sample.2" \
   && cmp -s "$T/sample.0" "$T/sample.3"; then
  pass "16 rounds sampled 10 of 100 clients, the same on every node"
else fail "samples: $n rounds of 10 of 100 on n0 (of $(wc -l <"$T/sample.0")); nodes differ?"
  head -3 "$T/sample."*; fi
for v in $VARIANTS; do
  rid=$(grep -oE "^$v +[0-9a-f]{16}" "$T/lab.out" | awk '{ print $2 }')
  [ -n "$rid" ] || continue
  w="printf('%016x', run_id) = '$rid'"
  labels=$(sql 0 "SELECT count(DISTINCT node * 1000 + client) FROM client_labels WHERE $w")
  [ "$labels" = 100 ] && pass "$v: label counts of 100 clients" || fail "$v: $labels clients with label counts"
  evals=$(sql 0 "SELECT count(*) FROM client_evals WHERE $w")
  [ "${evals:-0}" -gt 0 ] && [ -s "$OUT/clients-$v-accuracy.png" ] \
    && pass "$v: $evals client evaluations on n0, spread plotted" || fail "$v: client evaluations $evals, plot?"
done
spec() { sql 0 "SELECT spec FROM runs WHERE printf('%016x', run_id) = '$(grep -oE "^$1 +[0-9a-f]{16}" "$T/lab.out" | awk '{ print $2 }')'"; }
grep -q 'strategy = scaffold' <<<"$(spec scaffold)" && grep -q 'outer = adam' <<<"$(spec fedadam)" \
  && grep -q 'prox_mu = 0.1' <<<"$(spec fedprox)" && pass "each variant's spec carries its strategy" \
  || fail "variant specs: $(spec scaffold | grep -c strategy) $(spec fedadam | grep -c outer)"
[ -s "$OUT/accuracy-by-round.png" ] && pass "accuracy by round plotted" || fail "no accuracy-by-round.png"
finish
