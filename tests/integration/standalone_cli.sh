#!/usr/bin/env bash
# standalone_cli.sh: `traind --standalone` as a user drives it: --help, an INI
# file overridden by --set, per-epoch progress, the --json summary line, and
# node K/N partitions, on a small synthetic CSV dataset.
. "${top_srcdir:-.}/tests/integration/lib.sh"

run help "$TRAIND" --help
[ "$(rc_of help)" -eq 0 ] && grep -q -- '--standalone' "$T/help.out" && grep -q 'lr_schedule' "$T/help.out" \
  && pass "--help lists options and run keys" || fail "--help"
run version "$TRAIND" --version
grep -qE '^traind [0-9]' "$T/version.out" && pass "--version" || fail "--version"

# 4 well-separated classes in 6 dimensions; train and test files.
awk 'BEGIN { srand(3); for (i = 0; i < 400; i++) { c = i % 4; printf "%d", c;
       for (d = 0; d < 6; d++) printf ",%.4f", (d % 4 == c ? 3 : 0) + rand() - 0.5; printf "\n" } }' >"$T/train.csv"
awk 'BEGIN { srand(4); print "label,f0,f1,f2,f3,f4,f5"; for (i = 0; i < 100; i++) { c = i % 4; printf "%d", c;
       for (d = 0; d < 6; d++) printf ",%.4f", (d % 4 == c ? 3 : 0) + rand() - 0.5; printf "\n" } }' >"$T/test.csv"
cat >"$T/run.ini" <<INI
[run]
model = mlp:6-32-4
dataset = csv:$T/train.csv,$T/test.csv
batch = 16
lr = 0.05
epochs = 2
INI

run train "$TRAIND" --standalone "$T/run.ini" --set epochs=3 --json
if [ "$(rc_of train)" -ne 0 ]; then fail "training run exited $(rc_of train)"; cat "$T/train.err"; finish; fi
[ "$(grep -c '^epoch ' "$T/train.out")" -eq 3 ] && pass "--set epochs=3 overrides the INI (3 progress lines)" \
  || { fail "expected 3 epoch lines"; cat "$T/train.out"; }
json=$(tail -n1 "$T/train.out")
for key in test_accuracy train_loss samples_per_s epochs; do
  grep -q "\"$key\":" <<<"$json" && pass "json has $key" || fail "json lacks $key: $json"
done
grep -q '"epochs":3' <<<"$json" && pass "json epochs = 3" || fail "json epochs: $json"
acc=$(sed -E 's/.*"test_accuracy":([0-9.eE+-]+).*/\1/' <<<"$json")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' && pass "separable data learned (test_accuracy $acc)" \
  || fail "test_accuracy $acc < 0.9"
grep -q '400 training samples, 100 test samples' "$T/train.out" && pass "header shows sample counts" \
  || { fail "header"; head -3 "$T/train.out"; }

# node 1 of 4 trains on a quarter of the rows
run part "$TRAIND" --standalone "$T/run.ini" --set node=1/4 --set partition=iid
[ "$(rc_of part)" -eq 0 ] && grep -q '100 training samples' "$T/part.out" \
  && pass "node=1/4 iid trains on 100 of 400 rows" || { fail "node=1/4"; cat "$T/part.out" "$T/part.err"; }
run shard "$TRAIND" --standalone "$T/run.ini" --set node=0/2 --set partition=shard:1
[ "$(rc_of shard)" -eq 0 ] && grep -q '200 training samples' "$T/shard.out" \
  && pass "node=0/2 shard:1 trains on 200 rows" || { fail "shard"; cat "$T/shard.out" "$T/shard.err"; }

# same seed, same numbers
run again "$TRAIND" --standalone "$T/run.ini" --set epochs=3 --json
a=$(tail -n1 "$T/train.out" | sed -E 's/"(train_seconds|samples_per_s|peak_rss_kb|run_id)":[^,}]*//g')
b=$(tail -n1 "$T/again.out" | sed -E 's/"(train_seconds|samples_per_s|peak_rss_kb|run_id)":[^,}]*//g')
[ "$a" = "$b" ] && pass "same seed reproduces loss and accuracy exactly" || fail "not reproducible: $a vs $b"
finish
