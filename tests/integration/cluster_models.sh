#!/usr/bin/env bash
# cluster_models.sh: the layer models through the whole daemon, on real nodes.
#  - a small CNN (a layer list with two convolutions) on Fashion-MNIST, with
#    codec = powersgd:2 (the second conv's [16, 8, 3, 3] weight travels as a
#    16 x 72 matrix, biases dense) and mode = overlap: every node ends on one
#    model (the run reconciles its anchors after the last round) and it learns
#    far above chance;
#  - a tiny GPT on the fortunes text (dataset left unset: a gpt model trains on
#    text:fortunes) with codec = topk:0.05 and optimizer = adamw (so each
#    link's residual decays with the cosine: ef_decay = auto): held-out bits
#    per byte fall well below the 8 of a uniform byte, every evaluation is in
#    the ledger's eval_bpb (accuracy NULL) and the final figure is in
#    `trainctl status --json` (test_bpb) and the status line;
#  - a third node joins that GPT run late, trains from a later round with a
#    fresh optimizer on the members' model and ends on the same model;
#  - an image model on text data is refused at start with one line.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 15 || fail "$n does not see its peer"; done
[ "$failures" -eq 0 ] && pass "two nodes see each other" || finish

w() { echo "printf('%016x', run_id) = '$run_id'"; }
field() { json_field "$(ctl "$1" status --json)" "$2"; }
start() {
  local out
  out=$(ctl a start "$@") || { fail "start $*: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
}

# ---- a CNN, PowerSGD, overlap
CNN='layers:input(1,28,28) conv(8,3,pad=1) relu maxpool(2) conv(16,3,pad=1) relu maxpool(2) flatten dense(10)'
start --set model="$CNN" --set codec=powersgd:2 --set mode=overlap --set batch=64 --set lr=0.05 \
  --set momentum=0.5 --set local_steps=8 --set rounds=12 --set eval_every=1000 --set seed=5 || finish
for n in a b; do wait_run_state $n finished 120 || fail "cnn: $n did not finish"; done
a1=$(field a test_accuracy); b1=$(field b test_accuracy)
[ -n "$a1" ] && [ "$a1" = "$b1" ] && pass "cnn: both nodes end on one model (test accuracy $a1)" \
  || fail "cnn: final accuracies differ: '$a1' '$b1'"
awk -v a="$a1" 'BEGIN { exit !(a >= 0.5) }' && pass "cnn: learns far above chance ($a1)" \
  || fail "cnn: test accuracy '$a1' < 0.5"
codecs=$(sql a "SELECT group_concat(DISTINCT codec) FROM updates WHERE $(w)")
case ",$codecs," in *,powersgd*) pass "cnn: updates travel as PowerSGD ($codecs)" ;;
  *) fail "cnn: update codecs are '$codecs'" ;; esac

# ---- a wrong pairing is one line at start
out=$(ctl a start --set model=mlp:784-10 --set dataset=text:fortunes 2>&1) \
  && fail "an mlp on text started: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q 'reads float features but dataset text:fortunes is text' <<<"$out" \
  && pass "image model on text refused in one line: $out" || fail "mlp on text: '$out'"

# ---- a tiny GPT on fortunes, top-k, AdamW, and a late joiner
# slowdown 10: at 3 the 40 rounds took 1.3 s on an idle moment of a CI run, and
# ended before c (started at round 4) had joined; eval_nodes=0: a's evaluations
# are counted below, and a need not be rank 0
start --set model=gpt:1-32-2-32 --set codec=topk:0.05 --set optimizer=adamw --set lr=0.003 \
  --set batch=16 --set local_steps=8 --set rounds=40 --set eval_every=5 --set seed=3 \
  --set slowdown=10 --set eval_nodes=0 || finish
for i in $(seq 300); do
  [ "$(sql a "SELECT count(*) FROM rounds WHERE $(w)" 2>/dev/null)" -ge 4 ] && break
  sleep 0.2
done
start_node c || finish
ctl c join "$(endpoint_of a)" >/dev/null || fail "c join a"
for n in a b c; do wait_run_state $n finished 200 || fail "gpt: $n did not finish"; done
ds=$(sql a "SELECT spec FROM runs WHERE $(w)" | sed -n 's/^dataset = //p')
[ "$ds" = auto ] && pass "gpt: dataset left to auto" || fail "gpt: dataset '$ds'"
R=$(field c first_round)
awk -v r="$R" 'BEGIN { exit !(r > 4 && r <= 40) }' && pass "gpt: c joined the run at round $R" \
  || fail "gpt: c's first round is '$R'"
ta=$(field a test_bpb); tb=$(field b test_bpb); tc=$(field c test_bpb)
[ -n "$ta" ] && [ "$ta" = "$tb" ] && [ "$tb" = "$tc" ] \
  && pass "gpt: the three nodes end on one model ($ta bits per byte)" \
  || fail "gpt: final bits per byte differ: '$ta' '$tb' '$tc'"
awk -v b="$ta" 'BEGIN { exit !(b > 0 && b < 6) }' && pass "gpt: held-out bits per byte $ta < 6" \
  || fail "gpt: held-out bits per byte '$ta'"
[ "$(field a test_accuracy)" = null ] && pass "gpt: no accuracy for a text run" \
  || fail "gpt: test_accuracy is '$(field a test_accuracy)'"
ctl a status | grep -q "test_bpb $(printf '%.4f' "$ta")" && pass "gpt: status line shows test_bpb" \
  || fail "gpt: status line: $(ctl a status | grep '^run')"
rows=$(sql a "SELECT count(*), sum(eval_acc IS NULL), max(eval_bpb) < 8.0, min(eval_bpb) FROM rounds
              WHERE $(w) AND eval_bpb IS NOT NULL")
IFS='|' read -r cnt noacc below last <<<"$rows"
[ "$cnt" -ge 7 ] && [ "$noacc" = "$cnt" ] && [ "$below" = 1 ] \
  && pass "gpt: $cnt evaluations in the ledger's eval_bpb, all below 8 (best $last)" \
  || fail "gpt: ledger eval rows (count, without accuracy, all < 8, best): $rows"
crows=$(sql c "SELECT min(round), count(eval_bpb) FROM rounds WHERE $(w)")
[ "${crows%%|*}" = "$R" ] && [ "${crows##*|}" -ge 1 ] \
  && pass "gpt: c trained from round $R and evaluated in bits per byte ($crows)" \
  || fail "gpt: c's rounds (first, evaluations): $crows"
finish
