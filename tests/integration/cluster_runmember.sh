#!/bin/bash
# cluster_runmember.sh: run membership is decided by rule, not by whoever says
# so (issue 37, item 1; rows 1 and 2 of its table). Three honest nodes (every
# key admin) and td_admitter, a member with an admitted key and no admin
# (built from the project's sources) that refuses to train, in sync runs with
# aggregate=trimmed:1, batching=equal and a fixed seed, so that the same run
# computes the same models each time:
#  - the reference: the hostile member only refuses the run;
#  - row 1: it also sends admissions naming ids that have no key: no node
#    takes a phantom in (the run keeps its 4 members), each refusal is
#    counted and logged;
#  - row 2: it readmits honest node b several times a round: no node
#    readmits b (its updates keep coming), so they keep waiting for them, b
#    ends the run with its result and nobody logs b as back;
# and after both, every honest node ends on the model it ended on in the
# reference run (the attacks changed nothing), all three on one model.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
ADMITTER="${top_builddir:-$(pwd)}/tests/integration/td_admitter"
SPEC=(--set model=mlp:784-10 --set batch=32 --set local_steps=1 --set eval_every=1000
  --set aggregate=trimmed:1 --set rounds=300 --set round_timeout=10 --set batching=equal
  --set seed=5)

read -r HPUB HSEC <<<"$("$ADMITTER" --keygen)"
[ -n "$HSEC" ] || { echo "skip: no CURVE key pair for the hostile member"; exit 77; }
id_of() { ctl "$1" key --json | grep -o '"node_id":"[0-9a-f]*"' | head -n 1 | cut -d'"' -f4; }
drop_of() { sed -E "s/.*\"$2\":([0-9]+).*/\1/" <<<"$(ctl "$1" status --json)"; }
# run_field NODE KEY: the first KEY of the run object of NODE's status
run_field() {
  ctl "$1" status --json | grep -o '"run":{.*' | grep -o "\"$2\":[^,}]*" | head -n 1 |
    cut -d: -f2- | tr -d '"'
}
# the run's final test accuracy on NODE, from its status
accuracy() { run_field "$1" test_accuracy; }

# (a slower heartbeat than the tests' default: on a loaded machine a peer
# suspected for a moment is not waited for, and the models would part)
for n in a b c; do start_node "$n" --heartbeat-ms 500 || finish; done
for n in b c; do ctl "$n" join "$(endpoint_of a)" >/dev/null || fail "$n join"; done
for n in a b c; do wait_peers "$n" 2 15 || fail "$n does not see the other two"; done

# runs a run on a, waits for it on a, b and c; prints nothing
run_once() {
  local label=$1 n out
  out=$(ctl a start "${SPEC[@]}") || { fail "$label: start: $out"; return 1; }
  for n in a b c; do
    wait_run_state "$n" finished 60 || fail "$label: the run did not finish on $n ($(run_field "$n" state))"
  done
}

# hostile ATTACK VICTIM: td_admitter against a, b and c, admitted on each without admin
hostile() {
  local n
  for n in a b c; do ctl "$n" allow "$HPUB" >/dev/null || fail "$n does not admit the member"; done
  TD_PEER_PUBLIC=$HPUB TD_PEER_SECRET=$HSEC "$ADMITTER" "$1" "$2" 60 \
    "$(endpoint_of a)" "$(key_of a)" "$(endpoint_of b)" "$(key_of b)" \
    "$(endpoint_of c)" "$(key_of c)" >"$T/$1.out" 2>&1 &
  echo $! >"$T/$1.pid"
  for n in a b c; do wait_peers "$n" 3 15 || fail "$n does not see the hostile member"; done
}
stop_hostile() { kill "$(cat "$T/$1.pid")" 2>/dev/null; wait "$(cat "$T/$1.pid")" 2>/dev/null; }

# unchanged LABEL: every honest node ended on the model of the reference run
unchanged() {
  local label=$1 n acc ok=0
  for n in a b c; do
    acc=$(accuracy "$n")
    [ -n "$acc" ] && [ "$acc" = "$(eval echo "\$ref_$n")" ] && ok=$((ok + 1))
  done
  [ "$ok" -eq 3 ] && pass "$label: a, b and c end on their reference models ($(accuracy a), $(accuracy b), $(accuracy c))" \
    || fail "$label: accuracies $(accuracy a) $(accuracy b) $(accuracy c), reference $ref_a $ref_b $ref_c"
  [ "$(accuracy a)" = "$(accuracy b)" ] && [ "$(accuracy b)" = "$(accuracy c)" ] \
    && pass "$label: a, b and c end on one model" \
    || fail "$label: a $(accuracy a), b $(accuracy b), c $(accuracy c)"
}

# ---- the reference ----------------------------------------------------------------------------
hostile noop -
run_once reference
stop_hostile noop
ref_a=$(accuracy a) ref_b=$(accuracy b) ref_c=$(accuracy c)
hid=$(sed -n 's/^key_id //p' "$T/noop.out")
awk -v r="$ref_b" 'BEGIN { exit !(r >= 0.6) }' \
  && pass "reference: test accuracy a $ref_a, b $ref_b, c $ref_c" \
  || fail "reference: test accuracy ${ref_b:-none}"
[ "$(run_field a nodes)" = 4 ] && pass "reference: the run has its 4 members" \
  || fail "reference: $(run_field a nodes) members"

# ---- row 1: phantom members ----------------------------------------------------------------
hostile phantom -
f0=$(drop_of a forbidden)
run_once "row 1"
stop_hostile phantom
hid=$(sed -n 's/^key_id //p' "$T/phantom.out")
sent=$(sed -n 's/^sent //p' "$T/phantom.out")
[ "${sent:-0}" -ge 5 ] || fail "row 1: the hostile member sent only ${sent:-0} phantom admissions"
for n in a b c; do
  nodes=$(run_field "$n" nodes)
  [ "$nodes" = 4 ] && pass "row 1: $n kept the run at its 4 members ($sent phantoms named)" \
    || fail "row 1: $n's run has ${nodes:-?} members"
  grep -q "refused an admission of .* from $hid: it names a node whose key is not on this node's allowlist" \
    "$T/$n.log" && pass "row 1: $n logged the refusal" || fail "row 1: $n logged no refusal"
done
f1=$(drop_of a forbidden)
[ "$f1" -gt "$f0" ] && pass "row 1: a counted $((f1 - f0)) forbidden admissions" \
  || fail "row 1: a counted no forbidden admission"
unchanged "row 1"

# ---- row 2: an honest member readmitted every round ----------------------------------------------
bid=$(id_of b)
hostile readmit "$bid"
run_once "row 2"
stop_hostile readmit
sent=$(sed -n 's/^sent //p' "$T/readmit.out")
run2=$(run_field a run_id)
[ "${sent:-0}" -ge 5 ] || fail "row 2: the hostile member sent only ${sent:-0} readmissions"
for n in a c; do
  grep -q "refused an admission of $bid .* from $hid: it \(readmits a member that takes part\|comes from a member that is not the run's admitter\)" \
    "$T/$n.log" && pass "row 2: $n refused and logged the readmissions of b" \
    || fail "row 2: $n logged no refused readmission of b"
  backs=$(sql "$n" "SELECT count(*) FROM events WHERE kind='member_back' AND detail LIKE '$bid%'")
  [ "$backs" -eq 0 ] && pass "row 2: $n never took b 'back' into the run it was in" \
    || fail "row 2: $n logged b back $backs times"
done
rounds=$(run_field a round)
from_b=$(sql a "SELECT count(DISTINCT peer_round) FROM updates WHERE run_id=$((16#$run2)) \
  AND peer=$((16#$bid))" 2>/dev/null || echo 0)
[ "${from_b:-0}" -ge $((rounds - 3)) ] && pass "row 2: a counted b's update in $from_b of $rounds rounds" \
  || fail "row 2: a has b's update in ${from_b:-0} of $rounds rounds"
[ "$(run_field b state)" = finished ] && [ -n "$(accuracy b)" ] \
  && pass "row 2: b finished the run with its result" || fail "row 2: b is $(run_field b state)"
unchanged "row 2"
finish
