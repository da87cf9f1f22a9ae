#!/usr/bin/env bash
# control_flood.sh: idle connections to the control socket cannot lock the
# operator out (issue 37, row 11: "the control socket keeps working").
# A node runs with a descriptor limit of 192, so its budget gives control
# clients a share of 10 (status --json: descriptors.control_clients_cap). A
# local process opens 200 connections to its control socket and never writes
# a byte; what the node closes it opens again. While they are held:
#  - every `trainctl status` answers (a new client makes room by closing the
#    client idle longest), and the node's open descriptors (/proc/PID/fd) stay
#    under the cap status reports;
#  - status --json shows at most the share of control clients open and counts
#    the idle ones it closed (control_evicted), and the node logged the burst;
#  - a client with a request in flight is never closed for another: a
#    `trainctl join` that waits 5 s for a welcome gets its answer.
# Before the share was enforced, the 200 connections took every descriptor
# the node had: `trainctl status` failed and the cap meant nothing.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
HOLD=${TD_CONTROL_FLOOD:-200}
LIMIT=192
POLLS=10

# the node alone gets the low limit; the test and its holder keep theirs
REAL_TRAIND=$TRAIND
TRAIND="$T/traind-limited"
printf '#!/bin/sh\nulimit -n %s || exit 1\nexec "%s" "$@"\n' "$LIMIT" "$REAL_TRAIND" >"$TRAIND"
chmod +x "$TRAIND"
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt $((HOLD + 64)) ]; then
  echo "skip: the hard descriptor limit ($(ulimit -Hn)) is too low to hold $HOLD connections"; exit 77
fi

start_node a || finish
a_pid=$(cat "$T/a.pid")
descriptors() { sed -E 's/.*"descriptors":\{([^}]*)\}.*/{\1}/' <<<"$1"; }
d=$(descriptors "$(ctl a status --json)")
cap=$(json_field "$d" cap)
share=$(json_field "$d" control_clients_cap)
[ "$(json_field "$d" limit)" = "$LIMIT" ] && [ "${share:-0}" -ge 1 ] && [ "$share" -lt "$HOLD" ] \
  && pass "a plans a cap of $cap descriptors, $share for control clients" \
  || { fail "descriptors in status: $d"; finish; }

# the holder: HOLD connections that never speak, reopened when a closes them,
# until STOP exists; it writes to READY how many it opened at first and, at
# the end, how many it opened in all
cat >"$T/hold.py" <<'EOF'
import os, selectors, socket, struct, sys, time
path, hold, stop, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sel, opened, closed, failed = selectors.DefaultSelector(), 0, 0, 0
def dial():
    global opened, failed
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # a blocking connect waits while the listen backlog is full, 5 s at most
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 5, 0))
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        failed += 1
        return
    opened += 1
    sel.register(s, selectors.EVENT_READ)
for _ in range(hold):
    dial()
open(ready, "w").write("%d\n" % opened)
end = time.time() + 60  # at most, should the test die without saying stop
while time.time() < end and not os.path.exists(stop):
    gone = [k.fileobj for k, _ in sel.select(0.5)]
    for s in gone:  # the node closed it: EOF
        sel.unregister(s)
        s.close()
        closed += 1
    time.sleep(0.5)  # then open as many again, in a burst
    for _ in gone:
        dial()
print("opened %d connections (%d failed to connect), %d closed by the node" % (opened, failed, closed))
EOF
# a request in flight while the share overflows: a join that waits 5 s for a
# welcome from a port where nothing listens, and must get that answer
key=$(python3 -c '
import os
z = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
b = os.urandom(32)
print("".join(z[int.from_bytes(b[i:i + 4], "big") // 85**k % 85] for i in range(0, 32, 4) for k in (4, 3, 2, 1, 0)))')
ctl a join tcp://127.0.0.1:1 "$key" >"$T/join.out" 2>"$T/join.err" &
join_pid=$!
python3 "$T/hold.py" "$T/a/ctl" "$HOLD" "$T/hold.stop" "$T/hold.ready" >"$T/hold.out" 2>&1 &
hold_pid=$!
for i in $(seq 100); do [ -s "$T/hold.ready" ] && break; sleep 0.1; done
[ "$(cat "$T/hold.ready" 2>/dev/null)" = "$HOLD" ] && pass "the holder opened $HOLD connections to a's control socket" \
  || fail "the holder did not open its connections: $(cat "$T/hold.out")"

answered=0 retried=0 most=0 most_open=0
for i in $(seq "$POLLS"); do
  ok=0
  # a trainctl caught between its connect and its request in a burst of
  # reconnections may be closed as idle: it retries, and the retries are shown
  for try in 1 2 3 4 5; do
    if st=$(ctl a status --json 2>"$T/status.err"); then ok=1; break; fi
    retried=$((retried + 1))
    sleep 0.2
  done
  if [ "$ok" -eq 1 ]; then answered=$((answered + 1)); else
    fail "poll $i: trainctl status failed 5 times: $(cat "$T/status.err")"; continue; fi
  open=$(json_field "$(descriptors "$st")" control_clients)
  [[ "$open" =~ ^[0-9]+$ ]] || open=0 # absent: a traind that does not count them
  [ "${open:-0}" -gt "$most_open" ] && most_open=$open
  fds=$(ls "/proc/$a_pid/fd" 2>/dev/null | wc -l)
  [ "$fds" -gt "$most" ] && most=$fds
  sleep 0.5
done
[ "$answered" -eq "$POLLS" ] && pass "trainctl status answered $answered of $POLLS polls ($retried retries)" \
  || fail "trainctl status answered $answered of $POLLS polls"
ctl a status >"$T/text.out" 2>&1 && pass "trainctl status (text) answers too" \
  || fail "trainctl status: $(cat "$T/text.out")"
[ "$most" -gt 0 ] && [ "$most" -lt "$cap" ] && pass "a held at most $most descriptors (cap $cap)" \
  || fail "a held $most descriptors, cap $cap"
[ "$most_open" -ge 1 ] && [ "$most_open" -le "$share" ] \
  && pass "at most $most_open control clients open (share $share)" \
  || fail "$most_open control clients open, share $share"
d=$(descriptors "$(ctl a status --json)")
evicted=$(json_field "$d" control_evicted)
[ "${evicted:-0}" -ge $((HOLD - share)) ] \
  && pass "a closed $evicted idle control clients to make room ($(json_field "$d" control_refused) refused)" \
  || fail "control_evicted '$evicted' after $HOLD idle connections: $d"
n=$(grep -c "control socket: .* closed the client idle longest" "$T/a.log")
[ "$n" -ge 1 ] && [ "$n" -le 3 ] && pass "a logged the burst $n time(s), not once a client" \
  || fail "a logged $n eviction lines"
wait "$join_pid"
grep -q "no answer from tcp://127.0.0.1:1 within 5 s" "$T/join.err" \
  && pass "a join in flight through the flood got its answer: $(cat "$T/join.err")" \
  || fail "the join in flight lost its answer: $(cat "$T/join.out" "$T/join.err")"
touch "$T/hold.stop"
wait "$hold_pid"
echo "  $(cat "$T/hold.out")"
kill -0 "$a_pid" 2>/dev/null && ctl a status >/dev/null && pass "a still runs and answers" \
  || fail "a is gone or silent after the flood"
finish
