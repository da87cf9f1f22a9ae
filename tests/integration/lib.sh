# tests/integration/lib.sh: helpers for integration tests. Each test gets its
# own temporary directory (removed on exit), runs the real binaries from the
# build tree, and prints what it ran only when something fails.
set -u
TRAIND="${top_builddir:-$(pwd)}/traind"
T=$(mktemp -d /tmp/td-it-XXXXXX)
trap 'rm -rf "$T"' EXIT
# the default data directory: `traind --standalone` keeps its model in this
# ledger, never in the ledger of the user who runs the tests
export TRAIND_DATA_DIR="$T/default-data"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# run NAME CMD...: run a command, keep its exit code, stdout and stderr.
run() {
  local name=$1; shift
  "$@" >"$T/$name.out" 2>"$T/$name.err"
  echo $? >"$T/$name.rc"
}
rc_of() { cat "$T/$1.rc"; }

# expect_error NAME PATTERN: the command failed cleanly (non-zero, no signal),
# printed exactly one line on stderr, and that line matches PATTERN.
expect_error() {
  local name=$1 pattern=$2 rc
  rc=$(rc_of "$name")
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0, expected an error"; return; fi
  if [ "$rc" -ge 128 ]; then fail "$name: killed by signal $((rc - 128))"; cat "$T/$name.err"; return; fi
  if [ "$(wc -l <"$T/$name.err")" -ne 1 ]; then
    fail "$name: expected one line on stderr, got:"; cat "$T/$name.err"; return
  fi
  if ! grep -qE -- "$pattern" "$T/$name.err"; then
    fail "$name: stderr does not match /$pattern/:"; cat "$T/$name.err"; return
  fi
  pass "$name: $(cat "$T/$name.err")"
}

finish() {
  if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
  exit 0
}
