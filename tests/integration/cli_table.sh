#!/usr/bin/env bash
# cli_table.sh: trainctl's command table is the one list of its commands.
# `trainctl --commands` prints it; the manual page (man/trainctl.1) documents
# every command of it and no command it lacks; `trainctl --help` lists every
# one with its arguments, and `trainctl help CMD` answers for each; an unknown
# command or none at all is one line naming the nearest command and
# `trainctl help`.
. "${top_srcdir:-.}/tests/integration/lib.sh"
TRAINCTL="${top_builddir:-$(pwd)}/trainctl"
MAN="${top_srcdir:-.}/man/trainctl.1"

"$TRAINCTL" --commands >"$T/table" || fail "trainctl --commands"
[ "$(wc -l <"$T/table")" -ge 10 ] && pass "the table has $(wc -l <"$T/table") commands" \
  || fail "table: $(cat "$T/table")"
# the man page's command entries: the first word of the line after each .TP
# in the command sections (.SS ... commands), up to the next .SH
awk '/^\.SH/ { in_cmds = 0 } /^\.SS .*[Cc]ommands/ { in_cmds = 1; next }
     in_cmds && prev == ".TP" && /^\.B/ { print $2 } { prev = $0 }' "$MAN" \
  | sed 's/\\f[A-Z]//g' | sort >"$T/man"
sort "$T/table" >"$T/table.sorted"
if cmp -s "$T/man" "$T/table.sorted"; then
  pass "man/trainctl.1 documents exactly the table's commands: $(tr '\n' ' ' <"$T/man")"
else
  fail "man page and table differ (< man, > table):"; diff "$T/man" "$T/table.sorted"
fi

run help "$TRAINCTL" --help
run help2 "$TRAINCTL" help
cmp -s "$T/help.out" "$T/help2.out" && pass "trainctl help is trainctl --help" || fail "help differs"
while read -r cmd; do
  grep -qE "^  $cmd( |$)" "$T/help.out" || fail "--help does not list $cmd"
  run "help_$cmd" "$TRAINCTL" help "$cmd"
  [ "$(rc_of "help_$cmd")" = 0 ] && head -1 "$T/help_$cmd.out" | grep -qE "^usage: trainctl $cmd( |$)" \
    || fail "trainctl help $cmd: $(cat "$T/help_$cmd.out" "$T/help_$cmd.err")"
done <"$T/table"
pass "--help and help CMD answer for every command"

run none "$TRAINCTL"
expect_error none '^trainctl: error: no command given \(trainctl help lists every command; trainctl status shows this node\)$'
[ "$(rc_of none)" = 2 ] || fail "no command: exit $(rc_of none), expected 2"
run typo "$TRAINCTL" stauts
expect_error typo "^trainctl: error: unknown command 'stauts': did you mean 'status'\? \(trainctl help lists every command\)$"
[ "$(rc_of typo)" = 2 ] || fail "unknown command: exit $(rc_of typo), expected 2"
run typo2 "$TRAINCTL" help exprot
expect_error typo2 "^trainctl: error: unknown command 'exprot': did you mean 'export'\? \(trainctl help lists every command\)$"
run far "$TRAINCTL" frobnicate
expect_error far "^trainctl: error: unknown command 'frobnicate' \(trainctl help lists every command\)$"
run badargs "$TRAINCTL" --socket "$T/none.sock" peers extra
expect_error badargs '^trainctl: error: usage: trainctl peers \[--json\] \(trainctl help peers\)$'
finish
