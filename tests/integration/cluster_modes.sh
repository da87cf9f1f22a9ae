#!/usr/bin/env bash
# cluster_modes.sh: the scheduler's modes on 3 real nodes (docs/algorithms.md#sync-overlap-and-async).
#  - overlap: compute never waits a round; every node ends on the same
#    consensus model (equal test accuracy) that learns as well as sync, and the
#    ledger records one row per round;
#  - overlap_fix = dc:LAMBDA: dc:0 repeats the pull's run bit for bit (compared
#    only when no update was late or cut and no member away in either run:
#    a heavy load can perturb one run's averages), and
#    with a LAMBDA every node holds the same compensated state (verified
#    hashes agree) and it trains differently from the pull;
#  - fragments = 2 (Streaming DiLoCo), overlap and sync: every node's verified
#    state agrees, they end on one model that learns, and an update is about
#    half the bytes of fragments = 1's (the slice travels alone); under
#    topk:0.05 it learns and ends on one model;
#    fragments = 1 repeats the run without the key bit for bit;
#  - async:1 with a 3x slower node: no barrier, every update's staleness is
#    recorded, none above the bound was applied (the ones beyond it are
#    counted as late drops), and the model still learns;
#  - local_steps = qsr:ALPHA:HBASE: H per round follows the quadratic
#    synchronization rule, i.e. grows as the cosine learning rate decays, and
#    is identical on every node; outer Nesterov momentum runs and learns;
#  - codec = auto: every chunk and every complete update is acknowledged
#    (chunk acks open the per-link window of scheduler/linkq), each link's goodput
#    is measured from the acks and logged per round in the ledger's links
#    table, and every codec chosen is one of the auto ladder (which codec
#    depends on the measured speed, so it is printed, not asserted; the
#    budget fit itself is unit-tested in test_codec);
#  - reconcile = N with a lossy codec: every N rounds and after the last the
#    nodes average their anchors, so they end on one model (a control run
#    without it ends apart); with reconcile_via = hub one node collects the
#    anchors and the other two take its mean (ledger events name the hub,
#    status counts it) and they still end on one model;
#  - transfer = N (async, label-skewed partitions so the models differ): the
#    nodes score their models on the same validation rows, the lagging ones
#    fetch the best model in bulk chunks and merge it (ledger events,
#    status counters), and every node still learns.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

for n in a b c; do start_node $n || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish

BASE=(--set batch=64 --set lr=0.05 --set seed=9 --set eval_every=1000)
# start_run ARGS...: start a run from a and wait until all finish; sets run_id
# start_run ARGS: one run to its end; $run_id names it and $perturbed counts
# the events on any node that make its averages depend on timing (a late or
# cut update, a member marked away or dead), which a heavy load can cause
start_run() {
  local out n marks=()
  for n in a b c; do marks+=("$(sql $n "SELECT coalesce(max(id), 0) FROM events")"); done
  out=$(ctl a start "${BASE[@]}" "$@") || { fail "start $*: $out"; return 1; }
  run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")
  for n in a b c; do wait_run_state $n finished 400 || fail "$n did not finish ($*)"; done
  perturbed=0
  for n in a b c; do
    perturbed=$((perturbed + $(sql $n "SELECT count(*) FROM events WHERE id > ${marks[0]} AND kind IN
      ('late', 'cut', 'member_away', 'member_out', 'peer_dead', 'run_behind')")))
    marks=("${marks[@]:1}")
  done
}
# same_run NAME LOSS OTHER OTHER_PERTURBED: LOSS, the last loss of a run that
# should repeat another bit for bit, is OTHER's; when either run was perturbed
# by timing the comparison says nothing, and is reported instead
same_run() {
  if [ -n "$3" ] && [ "$2" = "$3" ]; then pass "$1 (last loss $2)"
  elif [ "$perturbed" -gt 0 ] || [ "$4" -gt 0 ]; then
    echo "  not compared: $1: a run had $perturbed + $4 timing events (late, cut, away) under this load"
  else fail "$1: last loss '$2', expected '$3'"; fi
}
acc_of() { json_field "$(ctl "$1" status --json)" test_accuracy; }
q() { sql "$1" "$2" | head -n1; }
where="printf('%016x', run_id) = '\$run_id'"

# ---- overlap
start_run --set mode=overlap --set local_steps=8 --set rounds=60
a1=$(acc_of a); b1=$(acc_of b); c1=$(acc_of c)
[ "$a1" = "$b1" ] && [ "$b1" = "$c1" ] && pass "overlap: all nodes end on one consensus model ($a1)" \
  || fail "overlap: final accuracies differ: $a1 $b1 $c1"
awk -v a="$a1" 'BEGIN { exit !(a >= 0.78) }' && pass "overlap: learns (test accuracy $a1)" \
  || fail "overlap: test accuracy $a1 < 0.78"
rows=$(q a "SELECT count(*) FROM rounds WHERE printf('%016x', run_id) = '$run_id'")
[ "$rows" -eq 60 ] && pass "overlap: 60 rounds in the ledger" || fail "overlap: $rows round rows"
late=$(json_field "$(ctl a status --json)" late_peers)
[ "$late" -eq 0 ] && pass "overlap: no late peers" || fail "overlap: $late late peers"

# ---- overlap_fix = dc:LAMBDA: the compensated anchors are the same on every
# node (the verified state hashes agree, none differs) and differ from the
# pull's; every round overlaps and batches are equal, so runs repeat bit for
# bit, which dc:0 (no compensation) shows by ending as the pull's run does
last_loss() { q a "SELECT printf('%.9f', loss) FROM rounds WHERE printf('%016x', run_id) = '$run_id'
                   ORDER BY round DESC LIMIT 1"; }
events_of() { q "$1" "SELECT count(*) FROM events WHERE kind = '$2'"; }
DC_RUN=(--set mode=overlap --set local_steps=8 --set rounds=30 --set overlap_wait=0
        --set batching=equal)
start_run "${DC_RUN[@]}"
pull_loss=$(last_loss) pull_perturbed=$perturbed
start_run "${DC_RUN[@]}" --set overlap_fix=dc:0 # no compensation: the pull, bit for bit
dc0_loss=$(last_loss) dc0_perturbed=$perturbed
same_run "overlap dc:0 repeats the pull's run" "$dc0_loss" "$pull_loss" "$pull_perturbed"
declare -A agreed0 differ0
for n in a b c; do agreed0[$n]=$(events_of $n state_agreed); differ0[$n]=$(events_of $n state_diverged); done
start_run "${DC_RUN[@]}" --set overlap_fix=dc:1e4
dc_loss=$(last_loss)
for n in a b c; do
  agreed=$(( $(events_of $n state_agreed) - agreed0[$n] ))
  differ=$(( $(events_of $n state_diverged) - differ0[$n] ))
  [ "$agreed" -ge 3 ] && [ "$differ" -eq 0 ] \
    && pass "overlap dc: $n agrees on the state $agreed times, never differs" \
    || fail "overlap dc: $n has $agreed state_agreed and $differ state_diverged events"
done
a1=$(acc_of a); b1=$(acc_of b); c1=$(acc_of c)
[ "$a1" = "$b1" ] && [ "$b1" = "$c1" ] && awk -v a="$a1" 'BEGIN { exit !(a >= 0.65) }' \
  && pass "overlap dc: all nodes end on one model that learns ($a1)" \
  || fail "overlap dc: final accuracies $a1 $b1 $c1"
[ -n "$dc_loss" ] && [ "$dc_loss" != "$pull_loss" ] \
  && pass "overlap dc: the compensation changes training (last loss $dc_loss, pull $pull_loss)" \
  || fail "overlap dc: last loss '$dc_loss', the same as the pull's '$pull_loss'"

# ---- fragments = P (Streaming DiLoCo): fragments = 1 is the run as before,
# bit for bit; with 2, in overlap and in sync mode, every node's verified
# state agrees at every check (each round steps half the anchor), they end
# on one model that learns, and it trains differently from the whole model
agree_counts() {
  for n in a b c; do agreed0[$n]=$(events_of $n state_agreed); differ0[$n]=$(events_of $n state_diverged); done
}
check_agreement() { # LABEL
  local n agreed differ
  for n in a b c; do
    agreed=$(( $(events_of $n state_agreed) - agreed0[$n] ))
    differ=$(( $(events_of $n state_diverged) - differ0[$n] ))
    [ "$agreed" -ge 3 ] && [ "$differ" -eq 0 ] \
      && pass "$1: $n agrees on the state $agreed times, never differs" \
      || fail "$1: $n has $agreed state_agreed and $differ state_diverged events"
  done
  a1=$(acc_of a); b1=$(acc_of b); c1=$(acc_of c)
  [ "$a1" = "$b1" ] && [ "$b1" = "$c1" ] && awk -v a="$a1" 'BEGIN { exit !(a >= 0.65) }' \
    && pass "$1: all nodes end on one model that learns ($a1)" \
    || fail "$1: final accuracies $a1 $b1 $c1"
}
# (the pull's and dc:0's runs both stand for the run without the key: the
# one unperturbed by timing, or the one it matches)
start_run "${DC_RUN[@]}" --set fragments=1
one_loss=$(last_loss) ref=$pull_loss ref_perturbed=$pull_perturbed
if [ "$one_loss" = "$dc0_loss" ] || { [ "$one_loss" != "$pull_loss" ] && [ "$pull_perturbed" -gt 0 ]; }; then
  ref=$dc0_loss ref_perturbed=$dc0_perturbed
fi
same_run "fragments = 1 repeats the run without the key" "$one_loss" "$ref" "$ref_perturbed"
# the bytes of one update as node a received it (codec none), without and with fragments
update_bytes() { q a "SELECT avg(bytes) FROM updates WHERE printf('%016x', run_id) = '$run_id'"; }
one_bytes=$(update_bytes)
agree_counts
start_run "${DC_RUN[@]}" --set fragments=2
check_agreement "overlap fragments = 2"
two_bytes=$(update_bytes)
awk -v a="$two_bytes" -v b="$one_bytes" 'BEGIN { exit !(b > 0 && a / b >= 0.4 && a / b <= 0.6) }' \
  && pass "overlap fragments = 2 sends its slice alone ($two_bytes bytes, whole $one_bytes)" \
  || fail "overlap fragments = 2: $two_bytes bytes an update, not about half of $one_bytes"
frag_loss=$(last_loss)
[ -n "$frag_loss" ] && [ "$frag_loss" != "$pull_loss" ] \
  && pass "overlap fragments = 2 trains otherwise (last loss $frag_loss, pull $pull_loss)" \
  || fail "overlap fragments = 2: last loss '$frag_loss', the same as the pull's"
agree_counts
start_run --set mode=sync --set local_steps=8 --set rounds=30 --set batching=equal \
  --set fragments=2
check_agreement "sync fragments = 2"
# under top-k the slice's residual stays on its own range: a lossy run is not
# verified, but it learns and the reconciliation ends it on one model
start_run "${DC_RUN[@]}" --set fragments=2 --set codec=topk:0.05
a1=$(acc_of a); b1=$(acc_of b); c1=$(acc_of c)
[ "$a1" = "$b1" ] && [ "$b1" = "$c1" ] && awk -v a="$a1" 'BEGIN { exit !(a >= 0.65) }' \
  && pass "overlap fragments = 2 under topk:0.05: all nodes end on one model that learns ($a1)" \
  || fail "overlap fragments = 2 under topk:0.05: final accuracies $a1 $b1 $c1"

# ---- async:1 with one slow node
start_run --set mode=async:1 --set local_steps=8 --set rounds=40 --set slowdown=1,1,3 \
  --set batching=equal
for n in a b c; do
  acc=$(acc_of $n)
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.70) }' && pass "async: $n learns (test accuracy $acc)" \
    || fail "async: $n test accuracy $acc < 0.70"
done
tot=0
for n in a b c; do
  m=$(q $n "SELECT count(*), coalesce(max(staleness), 0) FROM updates WHERE printf('%016x', run_id) = '$run_id'")
  echo "info: async: $n: updates|max staleness = $m"
  tot=$((tot + ${m%%|*}))
done
[ "$tot" -ge 100 ] && pass "async: $tot updates recorded with their staleness" \
  || fail "async: only $tot updates recorded"
st=$(for n in a b c; do q $n "SELECT max(staleness) FROM updates WHERE printf('%016x', run_id) = '$run_id'"; done | sort -n | tail -n1)
[ "${st:-0}" -ge 1 ] && pass "async: stale updates do occur with a slow node (max staleness $st)" \
  || fail "async: no staleness at all with a 3x slower node"

# ---- QSR + outer Nesterov
start_run --set local_steps=qsr:0.1:4 --set epochs=1 --set outer_lr=0.9 --set outer_momentum=0.3 \
  --set outer_nesterov=true --set lr_schedule=cosine
hs=$(sql a "SELECT local_steps FROM rounds WHERE printf('%016x', run_id) = '$run_id' ORDER BY round")
first=$(head -n1 <<<"$hs"); last=$(tail -n2 <<<"$hs" | head -n1)
mono=$(awk 'NR > 1 && $1 < p { bad = 1 } { p = $1 } END { print bad ? "no" : "yes" }' <<<"$hs")
[ "$first" -eq 4 ] && [ "$last" -gt "$first" ] && [ "$mono" = yes ] \
  && pass "qsr: H grows from $first to $last as the learning rate decays" \
  || fail "qsr: H sequence not as the rule says (first $first, last $last, monotone $mono)"
for n in b c; do
  other=$(sql $n "SELECT local_steps FROM rounds WHERE printf('%016x', run_id) = '$run_id' ORDER BY round")
  [ "$other" = "$hs" ] && pass "qsr: node $n runs the same H sequence as a" \
    || fail "qsr: node $n's H sequence differs from a's"
done
acc=$(acc_of a)
awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }' && pass "qsr + outer Nesterov: learns (test accuracy $acc)" \
  || fail "qsr + outer Nesterov: test accuracy $acc < 0.80"

# ---- codec = auto on loopback
start_run --set mode=overlap --set codec=auto --set local_steps=8 --set rounds=20
rows=$(q a "SELECT count(*) FROM links WHERE printf('%016x', run_id) = '$run_id' AND goodput_bps > 0")
[ "$rows" -ge 20 ] && pass "auto: $rows per-link goodput measurements in a's ledger" \
  || fail "auto: only $rows link measurements"
bad=$(sql a "SELECT DISTINCT codec FROM links WHERE printf('%016x', run_id) = '$run_id'" \
      | grep -vE '^(none|fp16|topk:[0-9.e-]+)$')
peers=$(q a "SELECT count(DISTINCT peer) FROM links WHERE printf('%016x', run_id) = '$run_id'")
[ -z "$bad" ] && [ "$peers" -eq 2 ] \
  && pass "auto: both links measured; codecs chosen: $(sql a "SELECT group_concat(DISTINCT codec) FROM links WHERE printf('%016x', run_id) = '$run_id'")" \
  || fail "auto: unexpected codecs '$bad' or $peers links measured (expected 2)"
# update chunks go through the per-link queue: every chunk is acked, the
# window and chunk RTT are measured, nothing stays in flight after the run
win=$(q a "SELECT min(window_bytes) FROM links WHERE printf('%016x', run_id) = '$run_id'")
[ "${win:-0}" -ge 131072 ] && pass "auto: link windows measured (>= $win bytes)" \
  || fail "auto: link window missing in the ledger ($win)"
pj=$(ctl a peers --json)
grep -q '"rtt_ms":[0-9]' <<<"$pj" && grep -q '"in_flight_bytes":0,' <<<"$pj" \
  && pass "auto: peers shows chunk RTTs and empty windows after the run" \
  || fail "auto: peers --json lacks rtt_ms or still has bytes in flight: $pj"
acc=$(acc_of b)
awk -v a="$acc" 'BEGIN { exit !(a >= 0.70) }' && pass "auto: learns (test accuracy $acc)" \
  || fail "auto: test accuracy $acc < 0.70"
# ---- anchor reconciliation: ternary makes every node apply its peers' deltas
# lossily and its own exactly, so without it the anchors drift apart
start_run --set mode=overlap --set codec=ternary --set local_steps=8 --set rounds=20 \
  --set reconcile=off
a0=$(acc_of a); b0=$(acc_of b); c0=$(acc_of c)
# every node to every node (auto picks by measured uplinks; on loopback they are noise)
start_run --set mode=overlap --set codec=ternary --set local_steps=8 --set rounds=20 \
  --set reconcile=8 --set reconcile_via=mesh
a1=$(acc_of a); b1=$(acc_of b); c1=$(acc_of c)
ev=$(for n in a b c; do sql $n "SELECT count(*) FROM events WHERE kind = 'reconciled' AND detail LIKE '%3 of 3 anchors' AND at >= (SELECT started FROM runs WHERE printf('%016x', run_id) = '$run_id')"; done | awk '{ s += $1 } END { print s }')
[ "$ev" -eq 9 ] && pass "reconcile: rounds 8, 16 and 20 reconciled from 3 of 3 anchors on every node" \
  || fail "reconcile: $ev complete reconciliations recorded (expected 9)"
[ "$a1" = "$b1" ] && [ "$b1" = "$c1" ] \
  && pass "reconcile: every node ends on one model ($a1; without: $a0 $b0 $c0)" \
  || fail "reconcile: final accuracies differ: $a1 $b1 $c1 (without: $a0 $b0 $c0)"
{ [ "$a0" != "$b0" ] || [ "$b0" != "$c0" ]; } \
  && pass "reconcile: without it the ternary run's nodes end apart ($a0 $b0 $c0)" \
  || fail "reconcile: the control run without it ended equal ($a0): the check above proves nothing"
awk -v a="$a1" 'BEGIN { exit !(a >= 0.70) }' && pass "reconcile: learns (test accuracy $a1)" \
  || fail "reconcile: test accuracy $a1 < 0.70"
# through a hub: every round's anchors go to one node, the others take its mean
start_run --set mode=overlap --set codec=ternary --set local_steps=8 --set rounds=20 \
  --set reconcile=8 --set reconcile_via=hub
since="at >= (SELECT started FROM runs WHERE printf('%016x', run_id) = '$run_id')"
# per round: exactly one node was hub (the measured uplinks may make another
# node hub in a later round), the other two took the mean and name it
ev=$(for n in a b c; do
  sql $n "SELECT '$(cat "$T/$n/node_id")' || ' ' || detail FROM events WHERE kind = 'reconciled' AND $since"
done)
rounds_ok=$(awk '{ r = $3; sub(":", "", r) }
  / 3 of 3 anchors, hub: mean sent to 2$/ { hub[r] = $1; nh[r]++ }
  / 3 of 3 anchors, mean from hub / { nf[r]++; if (from[r] == "" || from[r] == $NF) from[r] = $NF; else from[r] = "mixed" }
  END { for (r in nh) ok += nh[r] == 1 && nf[r] == 2 && from[r] == hub[r]; print ok + 0 }' <<<"$ev")
as=0; via_st=0
for n in a b c; do
  st=$(ctl $n status --json)
  as=$((as + $(json_field "$st" reconciled_as_hub))); via_st=$((via_st + $(json_field "$st" reconciled_via_hub)))
done
[ "$rounds_ok" -eq 3 ] && [ "$as" -eq 3 ] && [ "$via_st" -eq 6 ] \
  && pass "reconcile via hub: rounds 8, 16, 20 each collected by one node that sent the mean to the other two, which name it (status as_hub $as via_hub $via_st)" \
  || fail "reconcile via hub: $rounds_ok of 3 rounds with one hub and two takers naming it, status as_hub $as via_hub $via_st; events: $(tr '\n' ';' <<<"$ev")"
a2=$(acc_of a); b2=$(acc_of b); c2=$(acc_of c)
[ "$a2" = "$b2" ] && [ "$b2" = "$c2" ] \
  && pass "reconcile via hub: every node ends on one model ($a2; the mesh run: $a1)" \
  || fail "reconcile via hub: final accuracies differ: $a2 $b2 $c2"

# ---- direct knowledge transfer (async, label-skewed partitions: models differ)
# at full speed the dense async updates keep the links busy (under ASan from
# the request to the run's end): the snapshot's bulk chunks get through on
# the bulk class's share of the link (scheduler/linkq.h)
start_run --set mode=async:2 --set local_steps=8 --set rounds=30 --set partition=dirichlet:0.3 \
  --set transfer=5 --set transfer_margin=0
tr=0; sv=0
for n in a b c; do
  st=$(ctl $n status --json)
  tr=$((tr + $(json_field "$st" transfers))); sv=$((sv + $(json_field "$st" snapshots_served)))
done
ev=$(for n in a b c; do sql $n "SELECT count(*) FROM events WHERE kind = 'transfer'"; done | awk '{ s += $1 } END { print s }')
[ "$tr" -ge 1 ] && [ "$sv" -ge "$tr" ] && [ "$ev" -eq "$tr" ] \
  && pass "transfer: $tr lagging models merged the best one ($sv served, $ev ledger events)" \
  || fail "transfer: $tr merged, $sv served, $ev events"
for n in a b c; do
  acc=$(acc_of $n)
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.5) }' && pass "transfer: $n still learns (test accuracy $acc)" \
    || fail "transfer: $n test accuracy $acc < 0.5"
done
finish
