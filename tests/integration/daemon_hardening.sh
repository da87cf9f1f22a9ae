#!/usr/bin/env bash
# daemon_hardening.sh: small holes a user or a hostile member found, each shut:
#  - `trainctl start DIR` (a directory where the run file goes) is one error
#    line and a non-zero exit, and no run starts (it used to start a default
#    run with exit 0);
#  - a NUL byte in a run file is an error naming its line, in `trainctl
#    start` and in `traind --standalone` (the text after it was dropped);
#  - a node whose node.key was deleted starts under a new identity and says
#    so with a WARNING: its old and new node id, the new key, and what peers
#    will do (refuse it until they admit the new key) — it used to be INFO.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

start_node a || finish
mkdir -p "$T/runs.d"
run dir ctl a start "$T/runs.d"
expect_error dir "runs.d is not a file: give a run file"
grep -q '"state":"idle"' <<<"$(ctl a status --json)" && pass "no run started from a directory" \
  || fail "a runs something after start DIR: $(ctl a status --json)"

printf 'batch = 32\nrounds = 3\nlr = 0.1\0rounds = 99\nseed = 4\n' >"$T/nul.ini"
run nul ctl a start "$T/nul.ini"
expect_error nul "nul.ini:3: a NUL byte: a run file is text"
grep -q '"state":"idle"' <<<"$(ctl a status --json)" && pass "no run started from a file with a NUL" \
  || fail "a runs something after start nul.ini"
run nul_standalone "$TRAIND" --standalone "$T/nul.ini"
expect_error nul_standalone "nul.ini:3: a NUL byte"

# a lost key: a new identity, told as a WARNING with what peers will do
old_id=$(tr -d '\n' <"$T/a/node_id")
kill "$(cat "$T/a.pid")"
for i in $(seq 50); do kill -0 "$(cat "$T/a.pid")" 2>/dev/null || break; sleep 0.1; done
rm -f "$T/a/node.key" "$T/a/ctl" "$T/a/endpoint"
start_node a || finish
new_id=$(tr -d '\n' <"$T/a/node_id")
[ "$new_id" != "$old_id" ] && pass "a new key pair, a new node id ($old_id -> $new_id)" \
  || fail "the node id did not change without node.key"
line=$(grep "identity changed" "$T/a.log")
pub=$(tr -d '\n' <"$T/a/node.pub") # a Z85 key holds regex characters: matched as text
if grep -qE "WARN +this node's identity changed: node id $old_id is now $new_id " <<<"$line" &&
   grep -qF "public key $pub" <<<"$line" &&
   grep -qF "Peers that admitted the old key will refuse this node until each of them admits the new one (trainctl allow '$pub')" <<<"$line"; then
  pass "the lost key is a WARNING that says what peers will do: ${line#* WARN  }"
else
  fail "no WARNING about the new identity:"; grep -i "node id" "$T/a.log"
fi
finish
