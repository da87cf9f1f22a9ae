#!/usr/bin/env bash
# standalone_progress.sh: `traind --standalone` draws a progress bar with ETA
# on a terminal (a pty from script(1)) and only plain lines into a pipe; the
# bar changes nothing about training: the epoch lines (all but speed and
# time) are the same both ways.
. "${top_srcdir:-.}/tests/integration/lib.sh"
command -v script >/dev/null || { echo "skipped: needs script(1) (Debian bsdutils)"; exit 77; }
ARGS="--standalone --set model=mlp:784-16-10 --set epochs=2 --set seed=3"
"$TRAIND" $ARGS >"$T/pipe.out" 2>&1 || { fail "standalone into a pipe"; cat "$T/pipe.out"; finish; }
grep -q $'\r' "$T/pipe.out" && fail "carriage returns in piped output" || pass "pipe: no bar redraws"
grep -q 'ETA' "$T/pipe.out" && fail "ETA in piped output" || pass "pipe: no ETA"
[ "$(grep -c '^epoch ' "$T/pipe.out")" = 2 ] && pass "pipe: 2 epoch lines" || fail "pipe epoch lines"
script -qec "$TRAIND $ARGS" /dev/null >"$T/tty.out" 2>&1 </dev/null \
  || { fail "standalone on a pty"; tail -c 500 "$T/tty.out"; finish; }
grep -aq 'ETA [0-9]*:[0-9][0-9]' "$T/tty.out" && grep -aq '\] 100%  1876/1876 steps' "$T/tty.out" \
  && pass "pty: bar with ETA up to 1876/1876 steps" || { fail "pty: no bar"; tail -c 500 "$T/tty.out" | cat -v; }
epochs() { tr '\r' '\n' <"$1" | sed 's/.*\x1b\[K//' | grep -a '^epoch ' | sed -E 's/  [0-9]+ samples\/s  [0-9.]+ s$//'; }
if [ -n "$(epochs "$T/pipe.out")" ] && [ "$(epochs "$T/pipe.out")" = "$(epochs "$T/tty.out")" ]; then
  pass "same epoch figures with and without the bar"
else fail "epoch lines differ:"; epochs "$T/pipe.out"; epochs "$T/tty.out"; fi
finish
