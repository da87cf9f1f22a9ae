#!/usr/bin/env bash
# daemon_robust.sh: what used to kill or hang the daemon in ordinary use.
#  - `trainctl stop` while an update is being encoded, then `trainctl start`
#    at once (2 nodes, slowdown=20): the stopped run's memory stayed borrowed
#    by the encode job and the daemon died of SIGSEGV; no daemon may die.
#  - SIGTERM during a run exits 0 (it exited 139 for the same reason).
#  - a control client that closes before reading its answer (SIGPIPE: 141).
#  - trainctl against a daemon that never answers gives up with a clear error.
#  - `trainctl rounds` on a run of 20,000 rounds answers, page by page (one
#    answer exceeded the control frame limit).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
PEER="${top_builddir:-$(pwd)}/tests/integration/td_control_peer"
TRIALS=${TD_STOP_START_TRIALS:-3}

alive() { kill -0 "$(cat "$T/$1.pid")" 2>/dev/null; }

for n in a b; do start_node $n || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
wait_peers a 1 15 && wait_peers b 1 15 || fail "a and b do not see each other"

RUN=(--set model=mlp:784-256-128-10 --set batch=64 --set local_steps=4 --set rounds=400
     --set slowdown=20 --set seed=5)
# run_round NAME: rounds done in NAME's run
run_round() { sed -nE 's/.*"run":\{[^}]*"round":([0-9]+).*/\1/p' <<<"$(ctl "$1" status --json 2>/dev/null)"; }
# wait_rounds NAME N: NAME's run has done N rounds (so update encodes are under way)
wait_rounds() {
  local i r
  for i in $(seq 300); do
    r=$(run_round "$1")
    [ "${r:-0}" -ge "$2" ] && return 0
    sleep 0.05
  done
  return 1
}

ctl a start "${RUN[@]}" >/dev/null || fail "first start"
for trial in $(seq "$TRIALS"); do
  wait_rounds a 2 || fail "trial $trial: no rounds done"
  ctl a stop >/dev/null || fail "trial $trial: stop"
  wait_run_state a stopped 30 || fail "trial $trial: a did not stop"
  ctl a start "${RUN[@]}" >/dev/null || fail "trial $trial: start after stop"
  for n in a b; do alive $n || fail "trial $trial: $n died"; done
  [ "$failures" -eq 0 ] || break
done
sleep 0.5
for n in a b; do alive $n || fail "$n died after the last start"; done
ctl a stop >/dev/null
wait_run_state a stopped 30 && wait_run_state b stopped 30 || fail "the last run did not stop"
[ "$failures" -eq 0 ] && pass "$TRIALS trials of stop during an encode, then start: no daemon died"

# SIGTERM during a run: a clean exit
ctl a start "${RUN[@]}" >/dev/null || fail "start before SIGTERM"
wait_rounds b 2 || fail "no rounds before SIGTERM"
kill -TERM "$(cat "$T/b.pid")"
wait "$(cat "$T/b.pid")"
rc=$?
[ "$rc" -eq 0 ] && pass "SIGTERM during a run: exit 0" || fail "SIGTERM during a run: exit $rc"
grep -q 'stopped cleanly' "$T/b.log" || fail "b did not stop cleanly"
ctl a stop >/dev/null 2>&1
wait_run_state a stopped 30 || fail "a did not stop"

# a daemon that never answers
"$PEER" mute "$T/mute.sock" &
mute_pid=$!
for i in $(seq 50); do [ -S "$T/mute.sock" ] && break; sleep 0.1; done
run mute "$TRAINCTL" --socket "$T/mute.sock" --timeout 1 status
kill "$mute_pid" 2>/dev/null
expect_error mute "did not answer within 1.0 s"

# 20,000 rounds in the ledger of the last run: trainctl rounds gets them all
run_id=$(sql a "SELECT run_id FROM runs ORDER BY started DESC LIMIT 1")
sql a "DELETE FROM rounds WHERE run_id = $run_id;
       WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 20000)
       INSERT INTO rounds (run_id, round, started, ended, local_steps, batch, samples, loss,
                           bytes_sent, bytes_recv, compute_s, wait_s)
       SELECT $run_id, i, i, i + 1, 4, 64, 256, 0.5, 1000000, 1000000, 0.25, 0.01 FROM r;"
lines=$(ctl a rounds --csv | wc -l)
[ "$lines" -eq 20001 ] && pass "rounds --csv: 20,000 rounds, paged" || fail "rounds --csv: $lines lines"
[ "$(ctl a rounds --last 3 --csv | tail -n1 | cut -d, -f2)" = 20000 ] \
  && pass "rounds --last 3 ends at round 20000" || fail "rounds --last 3"
# control clients that leave before the answer
"$PEER" rude "$T/a/ctl" 20 status && "$PEER" rude "$T/a/ctl" 20 rounds || fail "rude clients could not connect"
sleep 0.3
alive a && ctl a status >/dev/null && pass "40 clients that closed before the answer" \
  || fail "a died of clients that closed early (exit $(wait "$(cat "$T/a.pid")"; echo $?))"

finish
