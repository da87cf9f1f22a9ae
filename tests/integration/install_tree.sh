#!/usr/bin/env bash
# install_tree.sh: `make install DESTDIR=...` puts every file in its standard
# place; each manual page renders with man(1) without a warning; the systemd
# unit passes `systemd-analyze verify` (ExecStart pointed at the built traind,
# MANPATH at the installed pages, so the Documentation= links are checked
# too); the bash completion completes trainctl's commands and options.
# Parts whose tool is missing (man, systemd-analyze) say so and are skipped.
. "${top_srcdir:-.}/tests/integration/lib.sh"
B=${top_builddir:-$(pwd)}
D="$T/root"

env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$B" install DESTDIR="$D" >"$T/install.log" 2>&1 \
  || { fail "make install:"; tail -20 "$T/install.log"; finish; }
prefix=$(sed -n 's/^prefix = //p' "$B/Makefile")
unitdir=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$B" -f Makefile -f - print-unitdir <<<'print-unitdir: ; @echo $(systemdsystemunitdir)' 2>/dev/null)
compdir=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$B" -f Makefile -f - print-compdir <<<'print-compdir: ; @echo $(bashcompletiondir)' 2>/dev/null)
for f in "$prefix/bin/traind" "$prefix/bin/trainctl" "$prefix/bin/traind-lab" \
         "$prefix/share/man/man8/traind.8" "$prefix/share/man/man1/trainctl.1" \
         "$prefix/share/man/man1/traind-lab.1" "$prefix/share/man/man5/traind-run.5" \
         "$prefix/share/man/man5/traind-lab.5" "$unitdir/traind.service" "$compdir/trainctl" \
         "$prefix/share/traind/netns_lib.sh" "$prefix/share/traind/examples/wan-4.ini" \
         "$prefix/share/traind/examples/fed-100.ini"; do
  [ -s "$D$f" ] && pass "installed $f" || fail "missing $D$f"
done
[ -x "$D$prefix/bin/traind-lab" ] || fail "traind-lab is not executable"
"$D$prefix/bin/traind-lab" --help | grep -q '^usage: traind-lab' || fail "traind-lab --help"
grep -q "^TD_LAB_BINDIR=\${TD_LAB_BINDIR:-$prefix/bin}" "$D$prefix/bin/traind-lab" \
  && grep -q "^TD_LAB_NETNS=\${TD_LAB_NETNS:-$prefix/share/traind/netns_lib.sh}" "$D$prefix/bin/traind-lab" \
  && pass "traind-lab points at the installed traind and netns_lib.sh" || fail "traind-lab paths"
grep -q "^ExecStart=$prefix/bin/traind " "$D$unitdir/traind.service" \
  && pass "unit runs $prefix/bin/traind" || fail "unit ExecStart: $(grep ExecStart= "$D$unitdir/traind.service")"

if command -v man >/dev/null; then
  for page in "$D$prefix"/share/man/man*/*; do
    out=$(MANWIDTH=80 man --warnings -l "$page" 2>"$T/man.err")
    if [ ! -s "$T/man.err" ] && grep -q '^NAME' <<<"$out" && [ "$(wc -l <<<"$out")" -gt 20 ]; then
      pass "man -l $(basename "$page"): $(wc -l <<<"$out") lines, no warnings"
    else fail "man -l $page:"; head -5 "$T/man.err"; fi
  done
else echo "skipped: man pages (no man; Debian man-db)"; fi

if command -v systemd-analyze >/dev/null; then
  mkdir -p "$T/unit"
  sed "s|^ExecStart=[^ ]*|ExecStart=$B/traind|" "$D$unitdir/traind.service" >"$T/unit/traind.service"
  if (cd "$T/unit" && MANPATH="$D$prefix/share/man" systemd-analyze verify ./traind.service) \
       >"$T/verify.out" 2>&1; then
    pass "systemd-analyze verify traind.service"
  else fail "systemd-analyze verify:"; cat "$T/verify.out"; fi
else echo "skipped: unit check (no systemd-analyze; Debian systemd)"; fi

# the completion: commands, options of a command, metric names (the command
# names come from the installed trainctl: `trainctl --commands`)
complete_words() {
  PATH="$D$prefix/bin:$PATH" bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _trainctl; echo "${COMPREPLY[*]}"' \
    _ "$D$compdir/trainctl" "$@"
}
[ "$(complete_words trainctl r)" = "rounds revoke runs" ] \
  && pass "completion: trainctl r -> rounds revoke runs" || fail "completion of 'r': '$(complete_words trainctl r)'"
[ "$(complete_words trainctl plot x --y st)" = staleness ] \
  && pass "completion: plot --y st -> staleness" || fail "completion of --y st: '$(complete_words trainctl plot x --y st)'"
case " $(complete_words trainctl export -) " in *" --table "*) pass "completion: export options" ;;
  *) fail "completion of export -: '$(complete_words trainctl export -)'" ;; esac
# no hand-kept list: every command of the table, and only those, completes
[ "$(complete_words trainctl '')" = "$("$B/trainctl" --commands | tr '\n' ' ')--socket --help --version" ] \
  && pass "completion: the commands of trainctl --commands" || fail "completion of '': '$(complete_words trainctl '')'"
[ "$(complete_words trainctl help ex)" = export ] \
  && pass "completion: help ex -> export" || fail "completion of help ex: '$(complete_words trainctl help ex)'"
finish
