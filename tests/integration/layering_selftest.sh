#!/bin/bash
# layering_selftest.sh: scripts/layering finds what it is there to find, on
# small trees made here: a clean tree passes; two files that call each other
# are a cycle (an #include alone is not a use; a prototype is not a
# definition); a declared unit is allowed; a call from a lower layer into a
# higher one is against the order; a file in no layer is named. Skips (77)
# without universal-ctags, as the check itself does.
. "$top_srcdir/tests/integration/lib.sh"
LAYERING="$top_srcdir/scripts/layering"

if ! command -v python3 >/dev/null || ! ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
  echo "SKIP: python3 or universal-ctags is not installed"
  exit 77
fi

# tree DIR: a two-layer tree, low/ under high/, and its rules
tree() {
  mkdir -p "$1/scripts" "$1/common" "$1/cli" "$1/low" "$1/high"
  cat >"$1/scripts/layers.txt" <<'EOF'
scan low high cli
layer low low/
layer high high/
uses high: low
EOF
  cat >"$1/low/a.h" <<'EOF'
#include "high/b.h"
int low_a(int x);
EOF
  cat >"$1/low/a.c" <<'EOF'
#include "low/a.h"
int low_a(int x) { return x + 1; }
EOF
  cat >"$1/high/b.h" <<'EOF'
int high_b(int x);
EOF
  cat >"$1/high/b.c" <<'EOF'
#include "high/b.h"
#include "low/a.h"
int high_b(int x) { return low_a(x) * 2; }
EOF
}

# layering_in NAME DIR: run the check on DIR (its output in $T/NAME.out)
layering_in() { run "$1" python3 "$LAYERING" "$2"; }

tree "$T/clean"
layering_in clean "$T/clean"
if [ "$(rc_of clean)" -eq 0 ] && grep -q '^layering: ok: 4 units' "$T/clean.out"; then
  pass "a clean tree passes (an #include of a higher header alone is no use)"
else
  fail "clean tree: rc $(rc_of clean)"; cat "$T/clean.out"
fi

tree "$T/cycle"
cat >"$T/cycle/high/c.c" <<'EOF'
int high_d(int x);
int high_c(int x) { return high_d(x) - 1; }
EOF
cat >"$T/cycle/high/d.c" <<'EOF'
int high_c(int x);
int high_d(int x) { return x > 0 ? high_c(x - 1) : 0; }
EOF
layering_in cycle "$T/cycle"
if [ "$(rc_of cycle)" -eq 1 ] && grep -q '^layering: cycle of 2 units: high/c.c high/d.c' "$T/cycle.out" &&
   grep -q 'high/c.c -> high/d.c (high_d)' "$T/cycle.out"; then
  pass "two files that call each other are a cycle, with the names that tie them"
else
  fail "cycle: rc $(rc_of cycle)"; cat "$T/cycle.out"
fi

echo "unit high/c.c high/d.c -- one recursion split in two files (test)" >>"$T/cycle/scripts/layers.txt"
layering_in declared "$T/cycle"
if [ "$(rc_of declared)" -eq 0 ]; then
  pass "a declared unit is allowed"
else
  fail "declared unit: rc $(rc_of declared)"; cat "$T/declared.out"
fi

tree "$T/upcall"
cat >"$T/upcall/low/a.c" <<'EOF'
#include "low/a.h"
int low_a(int x) { return high_b(x) + 1; }
EOF
cat >"$T/upcall/high/b.c" <<'EOF'
#include "high/b.h"
int high_b(int x) { return x * 2; }
EOF
layering_in upcall "$T/upcall"
if [ "$(rc_of upcall)" -eq 1 ] &&
   grep -q '^layering: low/a.c (low) uses high/b.c (high) through high_b: against the order' \
     "$T/upcall.out"; then
  pass "a call from a lower layer into a higher one is against the order"
else
  fail "upcall: rc $(rc_of upcall)"; cat "$T/upcall.out"
fi

tree "$T/stray"
echo "int stray(void) { return 0; }" >"$T/stray/cli/stray.c"
layering_in stray "$T/stray"
if [ "$(rc_of stray)" -eq 1 ] && grep -q '^layering: cli/stray.c: in no layer' "$T/stray.out"; then
  pass "a file in no layer is named"
else
  fail "stray: rc $(rc_of stray)"; cat "$T/stray.out"
fi

finish
