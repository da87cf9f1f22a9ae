#!/usr/bin/env bash
# cluster_codec.sh: the run key `codec` drives what the daemons send. For each
# codec, 3 nodes train a short run; the ledger records every update with that
# codec and a compression ratio in the expected range, the nodes still learn,
# and `trainctl peers` reports the codec and ratio per link.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
ctl c join "$(endpoint_of a)" >/dev/null || fail "c join a"
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done

# codec, name in the ledger, minimum ratio (dense fp32 bytes / bytes on the wire)
for spec in "topk:0.05 topk 8" "ternary ternary 12" "powersgd:2 powersgd 10" "fp16 fp16 1.9" "qsgd:7 qsgd 6"; do
  set -- $spec
  codec=$1 name=$2 min=$3
  out=$(ctl a start --set model=mlp:784-128-10 --set codec=$codec --set rounds=30 \
        --set local_steps=4 --set batch=96 --set eval_every=30) || { fail "start $codec: $out"; continue; }
  run=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c; do wait_run_state $n finished 120 || fail "$codec: $n did not finish"; done
  st=$(ctl b status --json)
  acc=$(sed -E 's/.*"test_accuracy":([0-9.]+).*/\1/' <<<"$st")
  awk -v a="$acc" 'BEGIN { exit !(a > 0.6) }' && pass "$codec: b learned (test accuracy $acc)" \
    || fail "$codec: test accuracy $acc"
  q="FROM updates WHERE printf('%016x', run_id) = '$run'"
  rows=$(sql b "SELECT count(*) $q")
  other=$(sql b "SELECT count(*) $q AND codec != '$name'")
  ratio=$(sql b "SELECT min(ratio) $q")
  [ "$rows" -eq 60 ] && [ "$other" -eq 0 ] && pass "$codec: 60 updates recorded as $name" \
    || fail "$codec: $rows updates, $other with another codec"
  awk -v r="$ratio" -v m="$min" 'BEGIN { exit !(r >= m) }' && pass "$codec: ratio >= $min (min $ratio)" \
    || fail "$codec: ratio $ratio < $min"
  peers=$(ctl b peers)
  grep -q "$codec" <<<"$peers" || fail "$codec: trainctl peers does not show the codec: $peers"
done
st=$(ctl a status --json)
for kind in rejected malformed; do
  v=$(sed -E "s/.*\"$kind\":([0-9]+).*/\1/" <<<"$st")
  [ "$v" -eq 0 ] || fail "a dropped $v $kind updates from honest peers"
done
finish
