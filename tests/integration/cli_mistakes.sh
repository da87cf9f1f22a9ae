#!/usr/bin/env bash
# cli_mistakes.sh: the ordinary mistakes a new user makes with trainctl, each
# answered in one line that says what to do (issue 35, item 7), against a
# real daemon, real ledgers and, for a diverged run, a fake control socket:
#  - an unknown run or daemon key lists every key and suggests the nearest;
#  - `status --watch` on a failed run exits 1 and says why; `show` says why;
#  - `--socket S runs|show` reads the ledger of the daemon at S;
#  - numbers print in their shortest round-trip form (lr = 0.05), also from
#    a ledger written with the long form;
#  - a diverged loss does not overflow its column (status, show);
#  - `export RUN | head` ends quietly;
#  - `trainctl key` prints the key single-quoted; allow takes it quoted, and
#    `allow --file` admits a list, reporting each refused line by number;
#  - `rounds --csv` has exactly the columns of `export RUN --table rounds`;
#  - traind-lab takes up to 64 nodes (the run limit) and refuses 65 naming it.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
MK="${top_builddir:-$(pwd)}/tests/integration/td_mkledger"
PEER="${top_builddir:-$(pwd)}/tests/integration/td_control_peer"
KEYGEN="${top_builddir:-$(pwd)}/tests/integration/td_intruder"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
unset TRAIND_SOCKET
export TRAIND_DATA_DIR="$T/elsewhere" # never the ledger these tests mean

# ---- keys ------------------------------------------------------------------------------
start_node a --data-root "$T" || finish
run codc ctl a start --set codc=topk:0.01
expect_error codc "^trainctl: error: unknown key 'codc': did you mean 'codec'\? \(known: model, .*dataset, partition, .*, codec, .*, checkpoint_every, checkpoint_keep, round_timeout\)$"
printf '[daemon]\nthread = 2\n' >"$T/d.ini"
run thread "$TRAIND" --config "$T/d.ini"
expect_error thread "d.ini:2: unknown key 'thread': did you mean 'threads'\? \(known: data_dir, listen, .*, insecure, insecure_force\)$"

# ---- a failed run: status --watch, show, --socket --------------------------------------
printf 'not,a\nnumber,here\n' >"$T/bad.csv"
# start loads the data on the starter first: the bad file is its answer (exit 1)
out=$(ctl a start --set dataset=csv:$T/bad.csv --set model=mlp:2-8-2 2>&1) && fail "start took a bad csv"
grep -q "^trainctl: error: run not started: .*bad.csv:2: column 1 is not a number$" <<<"$out" \
  || fail "start: $out"
wait_run_state a failed 30 || fail "the run on bad.csv did not fail"
st=$(ctl a status --json)
failed_id=$(json_field "$st" run_id)
run watch ctl a status --watch 0.1
expect_error watch "^trainctl: error: run $failed_id failed: .*bad\.csv.*$"
[ "$(rc_of watch)" = 1 ] && pass "status --watch on a failed run exits 1" \
  || fail "status --watch on a failed run: exit $(rc_of watch)"
why=$(sed "s/^trainctl: error: run $failed_id failed: //" "$T/watch.err")
run show_failed ctl a show "$failed_id"
if [ "$(rc_of show_failed)" = 0 ] && grep -qxF "state      failed" "$T/show_failed.out" \
   && grep -qxF "reason     $why" "$T/show_failed.out"; then
  pass "--socket a show: $(grep '^reason' "$T/show_failed.out")"
else fail "show of the failed run:"; cat "$T/show_failed.out" "$T/show_failed.err"; fi
grep -qxF "  lr = 0.05" "$T/show_failed.out" && pass "show: lr = 0.05" \
  || fail "show: $(grep '  lr =' "$T/show_failed.out")"
run runs_sock ctl a runs
grep -q "^$failed_id .* failed " "$T/runs_sock.out" && pass "--socket a runs: a's ledger, not \$TRAIND_DATA_DIR's" \
  || { fail "--socket a runs:"; cat "$T/runs_sock.out" "$T/runs_sock.err"; }
run runs_default "$TRAINCTL" runs
expect_error runs_default "^trainctl: error: no ledger at $T/elsewhere(/traind.db)?: No such file or directory$"
run runs_gone "$TRAINCTL" --socket "$T/gone.sock" runs
expect_error runs_gone "traind is not running"

# ---- rounds --csv has the export's columns ------------------------------------------------
awk 'BEGIN { srand(2); for (i = 0; i < 200; i++) { c = i % 2; printf "%d,%.3f,%.3f\n", c, c * 2 + rand(), rand() } }' >"$T/tiny.csv"
ctl a start --set dataset=csv:$T/tiny.csv --set model=mlp:2-8-2 --set batch=16 --set rounds=6 \
  --set local_steps=2 --set eval_every=3 >/dev/null || fail "start tiny"
wait_run_state a finished 60 || fail "tiny run did not finish"
id=$(json_field "$(ctl a status --json)" run_id)
ctl a rounds --csv >"$T/rounds.csv" || fail "rounds --csv"
ctl a export "$id" --table rounds >"$T/export.csv" || fail "export --table rounds"
if cmp -s "$T/rounds.csv" "$T/export.csv" && [ "$(wc -l <"$T/rounds.csv")" = 7 ]; then
  pass "rounds --csv is export --table rounds: $(head -1 "$T/rounds.csv")"
else fail "rounds --csv differs from export:"; diff "$T/rounds.csv" "$T/export.csv" | head; fi
[ "$(ctl a rounds --last 2 --csv | tail -n +2)" = "$(tail -n 2 "$T/export.csv")" ] \
  && pass "rounds --last 2 --csv: the export's last 2 rows" || fail "rounds --last 2 --csv"

# ---- keys shown quoted, a list admitted ---------------------------------------------------
run key ctl a key
[ "$(cat "$T/key.out")" = "'$(key_of a)'" ] && pass "key: $(cat "$T/key.out")" \
  || fail "key printed as $(cat "$T/key.out")"
if command -v script >/dev/null; then
  script -qec "$TRAINCTL --socket $T/a/ctl key" /dev/null | tr -d '\r' >"$T/key.tty"
  sed -n 2p "$T/key.tty" | grep -qx '(paste it with its single quotes: a key holds characters such as < > & ( # \$ ! that the shell would act on)' \
    && pass "key on a terminal: $(sed -n 2p "$T/key.tty")" || fail "key on a terminal: $(cat "$T/key.tty")"
else echo "skipped: key on a terminal (no script(1))"; fi
read -r k0 _ < <("$KEYGEN" --keygen)
run quoted ctl a allow "'$k0'"
grep -q '^admitted key of node [0-9a-f]\{16\}$' "$T/quoted.out" && pass "allow takes the key with its quotes" \
  || { fail "allow 'KEY':"; cat "$T/quoted.out" "$T/quoted.err"; }
read -r k1 _ < <("$KEYGEN" --keygen)
read -r k2 _ < <("$KEYGEN" --keygen)
read -r k3 _ < <("$KEYGEN" --keygen)
{
  echo "# the cluster's keys"
  echo "'$k1'   # laptop"
  echo "$k2"
  echo
  echo "not-a-key"
  echo "$k3 extra words"
} >"$T/keys.txt"
run file ctl a allow --file "$T/keys.txt"
[ "$(rc_of file)" = 1 ] || fail "allow --file with refused lines: exit $(rc_of file)"
[ "$(grep -c "^admitted key of node [0-9a-f]\{16\} ($T/keys.txt:[23])$" "$T/file.out")" = 2 ] \
  && pass "allow --file: lines 2 and 3 admitted" || { fail "allow --file stdout:"; cat "$T/file.out"; }
sed -n 1p "$T/file.err" | grep -q "^trainctl: error: $T/keys.txt:5: .*40" \
  && sed -n 2p "$T/file.err" | grep -qxF "trainctl: error: $T/keys.txt:6: expected one key per line (then at most a # comment)" \
  && sed -n 3p "$T/file.err" | grep -qxF "trainctl: error: 2 of 4 keys in $T/keys.txt refused (see the lines above); the others are admitted" \
  && [ "$(wc -l <"$T/file.err")" = 3 ] \
  && pass "allow --file: $(tr '\n' '|' <"$T/file.err")" || { fail "allow --file stderr:"; cat "$T/file.err"; }
keys=$(ctl a key --json | sed 's|\\/|/|g') # JSON writes / as \/
grep -qF "\"$k1\"" <<<"$keys" && grep -qF "\"$k2\"" <<<"$keys" && ! grep -qF "\"$k3\"" <<<"$keys" \
  && pass "a admits k1 and k2, not k3" || fail "admitted keys: $keys"

# ---- old ledgers, diverged losses, closed pipes -------------------------------------------
mkdir -p "$T/old"
"$MK" "$T/old/traind.db" 0 || fail "td_mkledger"
C=cd56000000000003
sqlite3 "$T/old/traind.db" "
  UPDATE runs SET spec = replace(spec, 'lr = 0.05', 'lr = 0.050000000000000003'), state = 'failed'
    WHERE printf('%016x', run_id) = '$C';
  INSERT INTO events (at, kind, detail) VALUES (1790002020.6, 'run_end', 'run $C failed: loss diverged at round 8');
  UPDATE rounds SET loss = 1.2345678901234567e30 WHERE printf('%016x', run_id) = '$C' AND round = 8;
  WITH RECURSIVE n(i) AS (SELECT 100 UNION ALL SELECT i + 1 FROM n WHERE i < 20100)
    INSERT INTO rounds (run_id, round, started, ended, local_steps, batch, samples, bytes_sent, bytes_recv)
    SELECT run_id, i, 0, 0, 1, 1, 1, 0, 0 FROM runs, n WHERE printf('%016x', run_id) = 'ab12000000000001';
  PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
run old "$TRAINCTL" show cd5 --db "$T/old"
grep -qxF "  lr = 0.05" "$T/old.out" && pass "old ledger: lr = 0.050000000000000003 shown as 0.05" \
  || fail "old ledger lr: $(grep '  lr =' "$T/old.out")"
grep -qxF "reason     loss diverged at round 8" "$T/old.out" && pass "show: reason from the run_end event" \
  || { fail "show reason:"; cat "$T/old.out" "$T/old.err"; }
grep -qxF "loss       1.235e+30 (last round)" "$T/old.out" && pass "show: diverged loss 1.235e+30" \
  || fail "show loss: $(grep '^loss' "$T/old.out")"
"$TRAINCTL" show cd5 --db "$T/old" --json | grep -q '"reason":"loss diverged at round 8"' \
  && pass "show --json: reason" || fail "show --json has no reason"
"$TRAINCTL" export ab12 --db "$T/old" --table rounds 2>"$T/pipe.err" | head -n 1 >/dev/null
rc=${PIPESTATUS[0]}
if [ ! -s "$T/pipe.err" ] && { [ "$rc" = 0 ] || [ "$rc" = 141 ]; }; then
  pass "export | head: exit $rc, nothing on stderr"
else fail "export | head: exit $rc:"; cat "$T/pipe.err"; fi

# a daemon whose run diverged: the loss keeps to its column
json='{"node_id":"00000000000000aa","endpoint":"tcp://127.0.0.1:1","security":"curve","peers":[],"drops":{},"run":{"run_id":"00000000000000bb","state":"running","round":5,"rounds":10,"loss":1234567890123456789012345678901.5,"eval_accuracy":0.5,"test_accuracy":null}}'
"$PEER" answer "$T/fake.sock" "$json" >"$T/fake.log" 2>&1 &
echo $! >"$T/fake.pid"
NODES+=(fake)
for i in $(seq 50); do [ -S "$T/fake.sock" ] && break; sleep 0.1; done
run diverged "$TRAINCTL" --socket "$T/fake.sock" status
grep -qxF "run 00000000000000bb  running   round 5/10  loss 1.235e+30  eval_acc 0.5000  test_acc -" "$T/diverged.out" \
  && pass "status after divergence: $(grep '^run' "$T/diverged.out")" \
  || { fail "status after divergence:"; cat "$T/diverged.out" "$T/diverged.err"; }

# ---- traind-lab: nodes up to the run limit ---------------------------------------------------
LAB="${top_builddir:-$(pwd)}/cli/traind-lab"
printf '[lab]\nnodes = 65\n' >"$T/lab65.ini"
run lab65 env TD_LAB_BINDIR="${top_builddir:-$(pwd)}" "$LAB" "$T/lab65.ini"
expect_error lab65 "^traind-lab: error: $T/lab65.ini:2: nodes: an integer in \[1, 64\] \(64: the most nodes a run takes, TD_MAX_RUN_MEMBERS\)$"
# 64 passes the check: the file's next mistake is the one reported
printf '[lab]\nnodes = 64\nbogus = 1\n' >"$T/lab64.ini"
run lab64 env TD_LAB_BINDIR="${top_builddir:-$(pwd)}" "$LAB" "$T/lab64.ini"
expect_error lab64 "^traind-lab: error: $T/lab64.ini:3: unknown \[lab\] key 'bogus'"
finish
