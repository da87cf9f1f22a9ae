#!/usr/bin/env bash
# cluster_member.sh: a hostile member with an admitted key (td_member, built
# from the project's sources) costs an honest node a bounded amount (issue 37,
# item 3). Each part runs a fresh node with the hostile member as the only
# other member of its run:
#  - row 5: it says it is idle and never trains: it is marked away and taken
#    back at most TD__AWAY_TIMES_MAX (3) times, then put out of the run, and no
#    round waits for it after that (no `late` event names it);
#  - row 6: it sends update chunks of past rounds, thousands a second: each
#    member gets at most one `updates` row per round; the rest are counted
#    (drops: duplicate);
#  - row 7: it sends SnapshotRequests, hundreds a second, in a run with
#    `transfer`: it is served at most 3 copies of each version of the model
#    (one every `transfer` rounds), the rest counted as duplicates;
#  - row 10: its heartbeats claim the node's round + 1000: in a run of two,
#    one member's claim does not make the node leave its run; it finishes;
#    nor do two colluders' claims in a run of four with two honest nodes, which
#    end on one model.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
MEMBER="${top_builddir:-$(pwd)}/tests/integration/td_member"
SPEC=(--set model=mlp:784-10 --set batch=32 --set local_steps=1 --set eval_every=1000)
MODEL_BYTES=$(((784 * 10 + 10) * 4))

read -r MPUB MSEC <<<"$("$MEMBER" --keygen)"
[ -n "$MSEC" ] || { echo "skip: no CURVE key pair for the member"; exit 77; }
# member NODE ATTACK SECONDS: the hostile member against NODE, in the background
member() {
  ctl "$1" allow "$MPUB" >/dev/null || fail "$1 does not admit the member's key"
  TD_PEER_PUBLIC=$MPUB TD_PEER_SECRET=$MSEC "$MEMBER" "$(endpoint_of "$1")" "$(key_of "$1")" \
    "$2" "$3" >"$T/$1.member" 2>&1 &
  echo $! >"$T/$1.member.pid"
  wait_peers "$1" 1 15 || fail "$1 does not see the member alive"
}
mid() { sed -n 's/^key_id //p' "$T/$1.member"; }
member_out() { sed -n "s/^$2 //p" "$T/$1.member"; }
drop_of() { sed -E "s/.*\"$2\":([0-9]+).*/\1/" <<<"$(ctl "$1" status --json)"; }
start_run() { # start_run NODE SETTINGS...: prints the run id (a failure: its reason on
  # stderr, status 1; the caller counts it, since a fail in $(...) is lost)
  local node=$1 out
  shift
  out=$(ctl "$node" start "${SPEC[@]}" "$@" 2>&1) || { echo "$node start: $out" >&2; return 1; }
  sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out"
}
stop_node() { kill -9 "$(cat "$T/$1.pid")" 2>/dev/null; wait "$(cat "$T/$1.pid")" 2>/dev/null; }

# ---- row 5: idle, never trains ----------------------------------------------------
start_node r5 || finish
member r5 idle 40
t5=$SECONDS
run5=$(start_run r5 --set rounds=150 --set round_timeout=1) || { fail "row 5: the run did not start"; finish; }
wait_run_state r5 finished 40 || fail "row 5: the run did not finish within 40 s"
t5=$((SECONDS - t5))
kill "$(cat "$T/r5.member.pid")"; wait "$(cat "$T/r5.member.pid")"
id5=$(mid r5)
backs=$(sql r5 "SELECT count(*) FROM events WHERE kind='member_back' AND detail LIKE '$id5%'")
aways=$(sql r5 "SELECT count(*) FROM events WHERE kind='member_away' AND detail LIKE '%$id5%'")
out_at=$(sql r5 "SELECT id FROM events WHERE kind='member_out' AND detail LIKE '$id5%'")
late_after=$(sql r5 "SELECT count(*) FROM events WHERE kind='late' AND detail LIKE '%$id5%' \
  AND id > ${out_at:-0}")
echo "row 5: away $aways times, taken back $backs times, out at event ${out_at:-none}; 150 rounds took ~$t5 s"
[ -n "$out_at" ] && [ "$backs" -le 3 ] && [ "$aways" -le 4 ] \
  && pass "row 5: the idle member was taken back $backs times, then put out of the run" \
  || fail "row 5: away $aways, back $backs, out ${out_at:-never}"
[ -n "$out_at" ] && [ "$late_after" -eq 0 ] \
  && pass "row 5: no round waited for it after it was put out" \
  || fail "row 5: $late_after rounds waited for it after it was put out"
stop_node r5

# ---- row 6: update chunks of past rounds -------------------------------------------
start_node r6 || finish
member r6 stale 8
run6=$(start_run r6 --set rounds=100000 --set round_timeout=0.5) || { fail "row 6: the run did not start"; finish; }
wait "$(cat "$T/r6.member.pid")"
sent=$(member_out r6 sent)
id6=$(( 16#$(mid r6) ))
rows=$(sql r6 "SELECT count(*) FROM updates WHERE peer=$id6")
most=$(sql r6 "SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM updates WHERE peer=$id6 \
  GROUP BY peer_round)")
rounds6=$(json_field "$(ctl r6 status --json)" round)
dup6=$(drop_of r6 duplicate)
echo "row 6: $sent stale chunks sent; $rows updates rows (at most $most per round) in $rounds6 rounds; duplicate drops $dup6"
[ "${sent:-0}" -gt 1000 ] || fail "row 6: the member sent only ${sent:-0} stale chunks"
[ "$most" -le 1 ] && [ "$rows" -le "$rounds6" ] \
  && pass "row 6: $sent stale chunks made $rows updates rows, at most one per round" \
  || fail "row 6: $sent stale chunks made $rows updates rows ($most for one round, $rounds6 rounds)"
[ "$dup6" -ge $((sent / 2)) ] && pass "row 6: the stale chunks were counted ($dup6 duplicate drops)" \
  || fail "row 6: only $dup6 duplicate drops for $sent stale chunks"
stop_node r6

# ---- row 7: SnapshotRequests in a run with transfer ---------------------------------
start_node r7 || finish
TD_MEMBER_RATE=500 member r7 snap 8
run7=$(start_run r7 --set rounds=100000 --set round_timeout=0.5 --set transfer=2) || { fail "row 7: the run did not start"; finish; }
wait "$(cat "$T/r7.member.pid")"
sent=$(member_out r7 sent)
got=$(member_out r7 snapshot_bytes)
rounds7=$(json_field "$(ctl r7 status --json)" round)
dup7=$(drop_of r7 duplicate)
bound=$((3 * MODEL_BYTES * (rounds7 / 2 + 2)))
echo "row 7: $sent requests; served $got snapshot bytes (bound $bound, model $MODEL_BYTES) in $rounds7 rounds; duplicate drops $dup7"
[ "${sent:-0}" -gt 500 ] || fail "row 7: the member sent only ${sent:-0} requests"
[ "${got:-0}" -gt 0 ] && [ "$got" -le "$bound" ] \
  && pass "row 7: $sent requests were served $got bytes, within 3 models per version ($bound)" \
  || fail "row 7: $sent requests were served ${got:-0} bytes (bound $bound)"
[ "$dup7" -ge $((sent / 2)) ] && pass "row 7: the extra requests were counted ($dup7 duplicate drops)" \
  || fail "row 7: only $dup7 duplicate drops for $sent requests"
stop_node r7

# ---- row 10: a run of two, the other member claims round + 1000 ----------------------
start_node r10 || finish
member r10 ahead 25
run10=$(start_run r10 --set rounds=12 --set round_timeout=0.5) || { fail "row 10: the run did not start"; finish; }
wait_run_state r10 finished 25 || fail "row 10: the run did not finish"
grep -q "rounds ahead" "$T/r10.log" \
  && fail "row 10: the node left its run: $(grep -m1 'rounds ahead' "$T/r10.log")" \
  || pass "row 10: one member's claim of round + 1000 did not make the node leave its run"
kill "$(cat "$T/r10.member.pid")" 2>/dev/null

# ---- beyond the table: two colluders of four claim round + 1000 -------------------------
# h1 and h2 are honest; two hostile members, keys of their own, claim h1's round + 1000
# in a run of four. Half of the run is no majority (the node's own round counts against
# the claims): h1 stays in its run and both honest nodes finish it on one model. Before,
# the two were a majority of h1's three fellow members and h1 left its run.
start_node h1 || finish
start_node h2 || finish
ctl h2 join "$(endpoint_of h1)" >/dev/null || fail "colluders: h2 does not join h1"
wait_peers h2 1 15 || fail "colluders: h2 does not see h1"
for k in 1 2; do
  read -r cpub csec <<<"$("$MEMBER" --keygen)"
  for n in h1 h2; do ctl "$n" allow "$cpub" >/dev/null || fail "colluders: $n does not admit key $k"; done
  TD_PEER_PUBLIC=$cpub TD_PEER_SECRET=$csec "$MEMBER" "$(endpoint_of h1)" "$(key_of h1)" ahead 40 \
    >"$T/h1.colluder$k" 2>&1 &
  echo $! >"$T/h1.colluder$k.pid"
done
wait_peers h1 3 15 || fail "colluders: h1 does not see h2 and both colluders alive"
runc=$(start_run h1 --set rounds=12 --set round_timeout=5 --set min_updates=2 --set batching=equal) \
  || { fail "colluders: the run did not start"; finish; }
wait_run_state h1 finished 40 || fail "colluders: h1's run did not finish"
wait_run_state h2 finished 20 || fail "colluders: h2's run did not finish"
wc=$(printf "printf('%%016x', run_id) = '%s'" "$runc")
sql h1 "SELECT detail FROM events WHERE kind = 'run_start' AND detail LIKE 'run $runc %'" \
  | grep -q " of 4," || fail "colluders: h1's run does not have 4 members"
grep -q "rounds ahead" "$T/h1.log" \
  && fail "colluders: h1 left its run: $(grep -m1 'rounds ahead' "$T/h1.log")" \
  || pass "colluders: two of four members claiming round + 1000 did not make h1 leave its run"
acc1=$(sql h1 "SELECT test_accuracy FROM runs WHERE $wc")
acc2=$(sql h2 "SELECT test_accuracy FROM runs WHERE $wc")
[ -n "$acc1" ] && [ "$acc1" = "$acc2" ] \
  && pass "colluders: both honest nodes finished the run on one model (test accuracy $acc1)" \
  || fail "colluders: the honest nodes ended apart (h1 ${acc1:-none}, h2 ${acc2:-none})"
for k in 1 2; do kill "$(cat "$T/h1.colluder$k.pid")" 2>/dev/null; done
finish
