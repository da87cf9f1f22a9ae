#!/usr/bin/env bash
# policy_limits.sh: every node checks a run spec against its own limits
# (daemon/session/policy.c) before allocating or opening anything, whoever asks.
#  - a member that starts runs without checking them (td_runstart_peer) sends
#    RunStarts over each limit (model memory, batch, threads, rounds) and with
#    datasets outside the data root (/etc/shadow, /dev/zero, a missing path, a FIFO inside the
#    root, a path escaping the root, a symlink out of it): every node refuses
#    with a one-line reason sent back to the starter, no daemon dies, no
#    daemon's peak RSS grows by more than a few MiB, the reason quotes nothing
#    read from a file, and strace sees no open of any of those files;
#  - trainctl start over a limit is refused by the starter itself, one line;
#  - a node with a tighter limit refuses a real run: the others run it without
#    waiting for it (no late peers) and the starter's status names the refusal;
#    in an async run too, and the weighted batch plan counts only those running;
#  - rounds derived from epochs are held to max_rounds like the rounds key;
#  - the checkpoints a run would hold in the ledger at once (checkpoint_keep
#    of them, or every one with checkpoint_keep = 0) are held to
#    max_checkpoint_mb: a peer cannot fill a node's disk with them; a run
#    sized by epochs that keeps every one is held to it once its dataset is
#    loaded, by the rounds it really takes.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
PEER="${top_builddir:-$(pwd)}/tests/integration/td_runstart_peer"

mkdir -p "$T/data"
awk 'BEGIN { srand(2); for (i = 0; i < 200; i++) { c = i % 2; printf "%d,%.3f,%.3f\n", c, c * 2 + rand(), rand() } }' >"$T/data/tiny.csv"
mkfifo "$T/data/fifo"
ln -s /etc/passwd "$T/data/link"
LIMITS=(--data-root "$T/data" --max-model-mb 256 --max-batch 1024 --max-rounds 1000
        --max-checkpoint-mb 64)
for n in a b c; do start_node $n "${LIMITS[@]}" || finish; done
for n in b c; do ctl $n join "$(endpoint_of a)" >/dev/null || fail "$n join a"; done
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done
[ "$failures" -eq 0 ] && pass "full mesh of 3 nodes" || finish

id_of() { ctl "$1" status --json | grep -o '"node_id":"[0-9a-f]*"' | head -n1 | cut -d'"' -f4; }
hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$(cat "$T/$1.pid")/status"; }
# the peer is a member with an admitted admin key (it may start runs): the
# nodes' own limits are what stops it
read -r PPUB PSEC <<<"$("$PEER" --keygen)"
export TD_PEER_PUBLIC=$PPUB TD_PEER_SECRET=$PSEC
for n in a b c; do ctl $n allow --admin "$PPUB" >/dev/null || fail "$n does not admit the peer"; done
TARGETS=()
for n in a b c; do TARGETS+=("$(id_of $n)=$(endpoint_of $n),$(key_of $n)"); done
declare -A HWM0
for n in a b c; do HWM0[$n]=$(hwm_kb $n); done

# strace on a while the file datasets are asked for: nothing outside the root is opened
STRACE_OK=0
if command -v strace >/dev/null && strace -f -e trace=openat -o "$T/strace.out" \
     -p "$(cat "$T/a.pid")" 2>"$T/strace.err" & then
  STRACE_PID=$!
  for i in $(seq 50); do grep -q "attached" "$T/strace.err" 2>/dev/null && break; sleep 0.1; done
  grep -q "attached" "$T/strace.err" && STRACE_OK=1
fi

# refused_everywhere NAME SPEC PATTERN: each of a, b, c answers the RunStart with
# one refusal whose reason matches PATTERN
refused_everywhere() {
  local name=$1 spec=$2 pattern=$3 out n id line
  out=$("$PEER" "$spec" 3 "${TARGETS[@]}")
  for n in a b c; do
    id=$(id_of $n)
    line=$(grep "^refused $id " <<<"$out")
    if [ "$(grep -c "^refused $id " <<<"$out")" -ne 1 ]; then
      fail "$name: $n did not refuse once: $out"
    elif ! grep -qE -- "$pattern" <<<"$line"; then
      fail "$name: $n's reason does not match /$pattern/: $line"
    fi
  done
  [ "$(grep -c '^refused ' <<<"$out")" -eq 3 ] && pass "$name: refused by all 3: ${line#refused * }"
}
refused_everywhere "model over memory" "model = mlp:784-65536-65536-10" \
  "needs about [0-9]+ MiB .* over this node's limit of 256 MiB"
refused_everywhere "model over memory at a big batch" "model = mlp:784-16384-10;batch = 1024" \
  "over this node's limit of 256 MiB"
refused_everywhere "batch" "batch = 65536" "batch 65536 is over this node's limit 1024"
refused_everywhere "threads" "threads = 1024" "threads 1024 is more than this node's [0-9]+ cores"
refused_everywhere "rounds" "rounds = 100000" "rounds 100000 is over this node's limit 1000"
refused_everywhere "/etc/shadow" "dataset = csv:/etc/shadow" "'/etc/shadow' is not a file under the data root $T/data\$"
refused_everywhere "/dev/zero" "dataset = csv:/dev/zero" "'/dev/zero' is not a file under the data root $T/data\$"
# a path outside that does not exist gets the same reason as one that does:
# refusals do not tell whether something exists outside the root
refused_everywhere "a missing path outside" "dataset = csv:/etc/no-such-file" "'/etc/no-such-file' is not a file under the data root $T/data\$"
refused_everywhere "a FIFO in the root" "dataset = csv:$T/data/fifo" "fifo' is not a regular file"
refused_everywhere "a relative escape" "dataset = csv:../../../etc/passwd" "is not a file under the data root"
refused_everywhere "a symlink out of the root" "dataset = csv:link" "'link' is not a file under the data root"
refused_everywhere "idx outside" "dataset = idx:/etc/passwd,/etc/group" "not a file under the data root"
# mlp:784-1024-10: 814,090 parameters, 3.1 MiB a checkpoint
refused_everywhere "every checkpoint kept" \
  "model = mlp:784-1024-10;rounds = 1000;checkpoint_every = 1;checkpoint_keep = 0" \
  "checkpoints: 1000 of 3.1 MiB each .* would hold 310[0-9] MiB .* over this node's limit of 64 MiB"
refused_everywhere "checkpoint_keep 100" \
  "model = mlp:784-1024-10;rounds = 1000;checkpoint_every = 1;checkpoint_keep = 100" \
  "checkpoints: 100 of 3.1 MiB each .* limit of 64 MiB \(--max-checkpoint-mb\)"

if [ "$STRACE_OK" -eq 1 ]; then
  kill "$STRACE_PID" 2>/dev/null; wait "$STRACE_PID" 2>/dev/null
  if grep -E 'openat\(.*"(/etc/shadow|/dev/zero|/etc/passwd|/etc/group|[^"]*/fifo)"' "$T/strace.out"; then
    fail "a opened a file outside its data root"
  else
    pass "strace: a opened none of the refused files ($(wc -l <"$T/strace.out") openat lines seen)"
  fi
else
  echo "strace cannot attach here: the open check rests on the policy's own messages"
fi
for n in a b c; do
  kill -0 "$(cat "$T/$n.pid")" 2>/dev/null || fail "$n died"
  grow=$(( $(hwm_kb $n) - HWM0[$n] ))
  [ "$grow" -lt 16384 ] && pass "$n alive, peak RSS grew by $grow KiB (bound 16 MiB)" \
    || fail "$n: peak RSS grew by $grow KiB"
done
events=$(sql a "SELECT group_concat(detail, ' | ') FROM events WHERE kind = 'run_refused'")
grep -q "root:" <<<"$events" && fail "the ledger quotes /etc/shadow or /etc/passwd"
grep -q "not a file under the data root" <<<"$events" && pass "refusals are in a's ledger" \
  || fail "no run_refused events: $events"

# the starter's own check: trainctl start over a limit is one line, nothing runs
run own_model "$TRAINCTL" --socket "$T/a/ctl" start --set model=mlp:784-65536-65536-10
expect_error own_model "over this node's limit of 256 MiB"
run own_data "$TRAINCTL" --socket "$T/a/ctl" start --set dataset=csv:/etc/shadow
expect_error own_data "not a file under the data root"
run own_ckpt "$TRAINCTL" --socket "$T/a/ctl" start --set model=mlp:784-1024-10 \
  --set rounds=100 --set checkpoint_every=1 --set checkpoint_keep=30
expect_error own_ckpt "checkpoints: 30 of 3.1 MiB each .* over this node's limit of 64 MiB"
grep -q '"state":"idle"' <<<"$(ctl b status --json)" && pass "b never started a refused run" \
  || fail "b is not idle"

# a node with a tighter limit refuses a real run; the others go on without it
kill "$(cat "$T/c.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/c.pid")" 2>/dev/null || break; sleep 0.1; done
start_node c "${LIMITS[@]/1024/32}" || finish
ctl c join "$(endpoint_of a)" >/dev/null || fail "c rejoins"
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers after c's restart"; done
cid=$(id_of c)
ctl a start --set dataset=csv:$T/data/tiny.csv --set model=mlp:2-8-2 --set batch=64 \
  --set rounds=8 --set local_steps=2 --set round_timeout=30 --set checkpoint_every=1 \
  --set checkpoint_keep=0 >/dev/null || fail "start the real run"
for n in a b; do wait_run_state $n finished 120 || fail "$n did not finish without c"; done
st=$(ctl a status --json)
grep -q "node $cid refused: batch 64 is over this node's limit 32" <<<"$st" \
  && pass "a's status: node $cid refused: batch 64 is over this node's limit 32" \
  || fail "a's status does not name c's refusal: $st"
ctl a status | grep -q "^refused node $cid refused" && pass "trainctl status shows the refusal" \
  || fail "trainctl status: $(ctl a status)"
[ "$(json_field "$st" late_peers)" -eq 0 ] && pass "nobody waited for the refusing node" \
  || fail "late peers: $(json_field "$st" late_peers)"
[ "$(sql a "SELECT count(*) FROM rounds")" -eq 8 ] && pass "8 rounds in a's ledger" \
  || fail "a's rounds: $(sql a "SELECT count(*) FROM rounds")"
[ "$(sql a "SELECT count(*) FROM checkpoints")" -eq 8 ] \
  && pass "8 checkpoints of 8 rounds held (checkpoint_keep = 0, within the limit)" \
  || fail "a's checkpoints: $(sql a "SELECT count(*) FROM checkpoints")"
grep -q '"state":"idle"' <<<"$(ctl c status --json)" && pass "c stayed idle" || fail "c ran"
# replan_keeps_initial_split_after_refusal: the weighted batch plan waited for
# the refusing member's capacity and kept the 3-way split, so a and b trained
# on 43 of 64 rows per step to the end. Now they share the whole batch.
last=$(for n in a b; do sql $n "SELECT batch FROM rounds WHERE round = 8"; done)
[ "$(awk '{ s += $1 } END { print s }' <<<"$last")" -eq 64 ] \
  && pass "the batch plan counts a and b only: round 8's local batches $(echo $last) sum to 64" \
  || fail "a's and b's round-8 local batches are $(echo $last), not 64 in all"

# async_release_waits_for_refused_member: an async member may run only S + 1
# rounds ahead of the slowest member, and one that refused stayed at round 0:
# a and b stopped at round 4 for good. Now they finish.
ctl a start --set dataset=csv:$T/data/tiny.csv --set model=mlp:2-8-2 --set batch=64 \
  --set rounds=30 --set local_steps=2 --set mode=async:2 >/dev/null || fail "start the async run"
for n in a b; do wait_run_state $n finished 120 && pass "async: $n finished without the refusing c" \
  || fail "async: $n did not finish (waiting for the member that refused?)"; done

# rounds_from_epochs_unchecked: max_rounds held only for the rounds key; rounds
# derived from epochs (and their per-round plan) went past it. 6 epochs of
# 200 rows at batch 1, H = 1: 1200 rounds, over every node's 1000.
# trainctl start finds it on the starter once the dataset is loaded, and starts
# nothing; the member that starts runs without checking them sends it to every
# node, and each refuses it by itself.
run own_epochs "$TRAINCTL" --socket "$T/a/ctl" start --set dataset=csv:$T/data/tiny.csv \
  --set model=mlp:2-8-2 --set batch=1 --set local_steps=1 --set epochs=6
expect_error own_epochs "^trainctl: error: run not started: epochs 6 make 1200 rounds, over \
this node's limit 1000 \(--max-rounds\)$"
TARGETS=()
for n in a b c; do TARGETS+=("$(id_of $n)=$(endpoint_of $n),$(key_of $n)"); done
"$PEER" "dataset = csv:$T/data/tiny.csv;model = mlp:2-8-2;batch = 1;local_steps = 1;epochs = 6" \
  10 "${TARGETS[@]}" >/dev/null
for n in a b c; do
  wait_run_state $n failed 60 || fail "epochs: $n did not refuse the run"
done
err=$(json_field "$(ctl b status --json)" error)
grep -q "epochs 6 make 1200 rounds, over this node's limit 1000 (--max-rounds)" <<<"$err" \
  && pass "epochs: refused before planning: $err" || fail "epochs: b's error is '$err'"
for n in a b c; do # each refused: the others are told (the run_refused event says so)
  [ "$(sql $n "SELECT count(*) FROM events WHERE kind = 'run_refused' AND detail LIKE '%epochs 6 make 1200 rounds%'")" -eq 1 ] \
    || fail "epochs: $n did not send its refusal"
done

# epochs_checkpoints_counted_at_max_rounds: a run sized by epochs that keeps
# every checkpoint was counted as max_rounds / checkpoint_every of them, so
# any such run of a model over 64 KiB was refused here whatever its length.
# Now its rounds are counted once the dataset is loaded. mlp:2-2000-2000-2:
# 4,012,002 parameters, 15.3 MiB a checkpoint; 200 rows (a model that fits
# the 256 MiB limit with its checkpoint copies counted).
BIG=(--set dataset=csv:$T/data/tiny.csv --set model=mlp:2-2000-2000-2 --set local_steps=1
     --set epochs=1 --set checkpoint_every=1 --set checkpoint_keep=0 --set round_timeout=30)
run own_big "$TRAINCTL" --socket "$T/a/ctl" start "${BIG[@]}" --set batch=8
expect_error own_big "^trainctl: error: run not started: checkpoints: 25 of 15.3 MiB each"
"$PEER" "dataset = csv:$T/data/tiny.csv;model = mlp:2-2000-2000-2;local_steps = 1;epochs = 1;\
checkpoint_every = 1;checkpoint_keep = 0;round_timeout = 30;batch = 8" 10 "${TARGETS[@]}" >/dev/null
for n in a b c; do
  wait_run_state $n failed 60 || fail "epochs checkpoints: $n did not refuse the run"
done
err=$(json_field "$(ctl c status --json)" error)
grep -qE "checkpoints: 25 of 15.3 MiB each \(checkpoint_keep 0, checkpoint_every 1\) would hold 38[0-9] MiB .* limit of 64 MiB" <<<"$err" \
  && pass "epochs, every checkpoint: 25 rounds' worth refused once counted: $err" \
  || fail "epochs checkpoints: c's error is '$err'"
[ "$(sql a "SELECT count(*) FROM checkpoints c JOIN runs r USING (run_id) WHERE r.spec LIKE '%2000-2000%'")" -eq 0 ] \
  || fail "epochs checkpoints: the refused run wrote checkpoints"
ctl a start "${BIG[@]}" --set batch=100 >/dev/null || fail "start the 2-round epochs run"
for n in a b; do # (c refuses batch 100, over its 32)
  wait_run_state $n finished 120 || fail "epochs checkpoints: $n did not finish the 2-round run"
done
# (the ledger writes checkpoints in the background: "finished" can come first)
for i in $(seq 150); do
  held=$(sql b "SELECT count(*) || ' checkpoints of ' || max(length(blob)) || ' bytes' FROM checkpoints c JOIN runs r USING (run_id) WHERE r.spec LIKE '%2000-2000%'")
  [ "${held%% *}" -ge 2 ] && break
  sleep 0.2
done
[ "${held%% *}" -eq 2 ] \
  && pass "epochs, every checkpoint: the 2-round run accepted, b holds $held" \
  || fail "epochs checkpoints: b holds $held"
finish
