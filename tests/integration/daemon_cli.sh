#!/usr/bin/env bash
# daemon_cli.sh: trainctl and traind as a user meets them: a daemon that is
# not running, unknown commands, bad run specs, bad daemon flags, the control
# socket's mode, status in both forms (with the backend `auto` chose and why),
# join errors, leave, and a second traind on a data directory that one
# already uses.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

run notrunning "$TRAINCTL" --socket "$T/none.sock" status
expect_error notrunning "traind is not running"
run unknown "$TRAINCTL" --socket "$T/none.sock" frobnicate
expect_error unknown "unknown command 'frobnicate'"
[ "$(rc_of unknown)" -eq 2 ] || fail "unknown command should exit 2"
run help "$TRAINCTL" --help
grep -q 'rounds \[--last N\]' "$T/help.out" && pass "trainctl --help" || fail "trainctl --help"
run badlisten "$TRAIND" --data-dir "$T/x" --listen udp://1.2.3.4:5
expect_error badlisten "listen: expected tcp://HOST:PORT"
run badlevel "$TRAIND" --data-dir "$T/x" --log-level loud
expect_error badlevel "log_level"
printf '[daemon]\nthreads = many\n' >"$T/d.ini"
run badini "$TRAIND" --config "$T/d.ini"
expect_error badini "d.ini:2: threads"

start_node a --data-root "$T" || finish
mode=$(stat -c %a "$T/a/ctl")
[ "$mode" = 600 ] && pass "control socket mode 600" || fail "control socket mode $mode"
# a second daemon on a's data directory would share its node id and take its
# control socket over: it is refused, naming the directory and a's pid
run second_daemon timeout 10 "$TRAIND" --data-dir "$T/a" --listen tcp://127.0.0.1:0 --control "$T/a/ctl2"
expect_error second_daemon "data directory $T/a is in use by another traind \(pid $(cat "$T/a.pid")\)"
[ -e "$T/a/ctl2" ] && fail "the refused daemon made a control socket"
ctl a status >/dev/null && pass "a still answers on its control socket" || fail "a lost its control socket"
run bad_spec ctl a start --set model=mlp:784
expect_error bad_spec "model:"
run bad_key ctl a start --set colour=blue
expect_error bad_key "unknown key 'colour'"
run bad_codec ctl a start --set codec=zstd
expect_error bad_codec "codec"
printf '[run]\nbatch = 32\nepochs = many\n' >"$T/bad_run.ini"
run bad_run_ini ctl a start "$T/bad_run.ini"
expect_error bad_run_ini "run file:3: epochs"
run self_join ctl a join "$(endpoint_of a)"
expect_error self_join "own endpoint"
run bad_join ctl a join "http://example"
expect_error bad_join "tcp://HOST:PORT"
run keyless ctl a join tcp://127.0.0.1:9
expect_error keyless "join needs the public key of the node at that endpoint"
run bad_join_key ctl a join tcp://127.0.0.1:9 not-a-key
expect_error bad_join_key "a key is 40 Z85 characters"
run nobody ctl a join tcp://127.0.0.1:9 0000000000000000000000000000000000000000
expect_error nobody "no answer from tcp://127.0.0.1:9"
run stop_idle ctl a stop
expect_error stop_idle "no run"

st=$(ctl a status --json) || fail "status --json"
for key in node_id endpoint peers run run_id state round test_accuracy; do
  grep -q "\"$key\":" <<<"$st" || fail "status --json lacks $key: $st"
done
grep -q '"state":"idle"' <<<"$st" && pass "status --json: idle node" || fail "not idle: $st"
ctl a status | grep -q "^node .* security curve$" && pass "status table (security curve)" || fail "status table"
ctl a rounds | grep -q "no rounds" && pass "rounds before any run" || fail "rounds"

# a single-node run on a tiny CSV dataset finishes and is in the ledger
awk 'BEGIN { srand(2); for (i = 0; i < 200; i++) { c = i % 2; printf "%d,%.3f,%.3f\n", c, c * 2 + rand(), rand() } }' >"$T/tiny.csv"
# (backend = auto: this test machine has no usable GPU, so auto takes the CPU
# and status says so, with why)
ctl a start --set dataset=csv:$T/tiny.csv --set model=mlp:2-8-2 --set batch=16 --set rounds=20 \
  --set local_steps=2 --set eval_every=5 --set backend=auto >/dev/null || fail "single-node start"
wait_run_state a finished 60 && pass "single-node run finished" || fail "single-node run"
st=$(ctl a status --json)
[ "$(json_field "$st" backend)" = cpu ] && pass "status --json: backend cpu" || fail "backend: $st"
reason=$(json_field "$st" backend_reason)
grep -q '^cpu (auto: no usable GPU: ..*)$' <<<"$reason" \
  && pass "status --json: $reason" || fail "backend_reason: $st"
ctl a status | grep -q '^backend cpu (auto: no usable GPU: ' \
  && pass "status table: backend and why" || fail "status table: $(ctl a status)"
[ "$(sql a "SELECT count(*) FROM rounds")" -eq 20 ] && pass "20 rounds in the ledger" || fail "ledger rounds"
[ "$(sql a "SELECT count(*) FROM rounds WHERE eval_acc IS NOT NULL")" -eq 4 ] \
  && pass "evaluated every 5 rounds" || fail "eval rows: $(sql a "SELECT round, eval_acc FROM rounds")"
[ "$(sql a "PRAGMA journal_mode")" = wal ] && pass "ledger in WAL mode" || fail "journal mode"

# a run whose data is not there is refused at start (daemon/session/policy.c) and says why
run missing "$TRAINCTL" --socket "$T/a/ctl" start --set dataset=csv:$T/missing.csv \
  --set model=mlp:2-8-2
expect_error missing "missing.csv' is not a file under the data root"
# a file the loader cannot parse fails the run cleanly, and says why: start
# itself answers with the reason (it waits for this node's data to load)
printf 'not,a\nnumber,here\n' >"$T/bad.csv"
run bad_data ctl a start --set dataset=csv:$T/bad.csv --set model=mlp:2-8-2
expect_error bad_data "^trainctl: error: run not started: .*bad.csv:2: column 1 is not a number$"
wait_run_state a failed 30 && pass "bad dataset: run failed" || fail "run did not fail"
grep -q 'bad.csv' <<<"$(ctl a status --json)" && pass "status names the bad file" || fail "error text"

ctl a leave >/dev/null || fail "leave"
for i in $(seq 50); do kill -0 "$(cat "$T/a.pid")" 2>/dev/null || break; sleep 0.1; done
kill -0 "$(cat "$T/a.pid")" 2>/dev/null && fail "a still running after leave" || pass "leave shut a down"
[ -e "$T/a/ctl" ] && fail "control socket left behind" || pass "control socket removed"
# the lock goes with the process: the same directory is free again
start_node a && pass "a restarts on its data directory after leave" || fail "restart after leave"
finish
