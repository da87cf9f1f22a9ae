#!/usr/bin/env bash
# runkeys_doc.sh: the run-key reference, man/traind-run.5, documents exactly
# the keys of the runspec table that `traind --help` prints, in the table's
# order (the canonical form's), each with the table's default and, for a
# number, its range. A key added to the table without a man entry, a default
# or range changed in one place only, or an entry for a key that no longer
# exists fails here with the key's name.
. "${top_srcdir:-.}/tests/integration/lib.sh"
MAN="${top_srcdir:-.}/man/traind-run.5"

# key default [min max], one line per key, from traind --help.
run help "$TRAIND" --help
[ "$(rc_of help)" -eq 0 ] || fail "traind --help exited $(rc_of help)"
sed -n '/^run keys/,$p' "$T/help.out" | tail -n +2 | awk '
  NF >= 2 {
    range = ""
    if (match($0, /\(range [^ ]+ to [^ ]+\)$/)) {
      split(substr($0, RSTART + 7, RLENGTH - 8), r, " to ")
      range = " " r[1] " " r[2]
    }
    print $1 " " $2 range
  }' >"$T/table.txt"

# The same from the man page's .BR lines in its KEYS section:
#   .BR KEY " (default " VALUE )
#   .BR KEY " (default " VALUE ", range MIN to MAX)"
# with roff's \- read as -.
awk '
  /^\.SH / { in_keys = ($0 == ".SH KEYS") }
  in_keys && /^\.BR [^ ]+ " \(default " / {
    line = $0; gsub(/\\-/, "-", line)
    n = split(line, f, " ")
    key = f[2]; value = f[6]
    if (match(line, /", range [^ ]+ to [^ ]+\)"$/)) {
      split(substr(line, RSTART + 9, RLENGTH - 11), r, " to ")
      print key " " value " " r[1] " " r[2]
    } else if (line ~ / \)$/ && n == 7) {
      print key " " value
    } else {
      print "MALFORMED " line
    }
  }' "$MAN" >"$T/man.txt"

keys=$(wc -l <"$T/table.txt")
[ "$keys" -ge 40 ] || fail "traind --help listed only $keys run keys"
if grep -q '^MALFORMED' "$T/man.txt"; then
  fail "traind-run.5 has key lines it cannot read (want: .BR KEY \" (default \" VALUE ) or .BR KEY \" (default \" VALUE \", range MIN to MAX)\"):"
  grep '^MALFORMED' "$T/man.txt"
fi

# every key of the table: documented, same default, same range
while read -r key value range; do
  doc=$(awk -v k="$key" '$1 == k { $1 = ""; sub(/^ /, ""); print; exit }' "$T/man.txt")
  if [ -z "$doc" ]; then fail "run key '$key' is in the key table but not in traind-run.5"; continue; fi
  want="$value${range:+ $range}"
  [ "$doc" = "$want" ] || fail "run key '$key': traind-run.5 says '$doc', the key table '$want' (default [min max])"
done <"$T/table.txt"

# every key of the man page exists in the table
while read -r key _; do
  [ "$key" = MALFORMED ] && continue
  grep -q "^$key " "$T/table.txt" || fail "traind-run.5 documents '$key', which the key table lacks"
done <"$T/man.txt"

# the same order (the canonical form's, which the page promises)
if ! diff <(cut -d' ' -f1 "$T/table.txt") <(grep -v '^MALFORMED' "$T/man.txt" | cut -d' ' -f1) >"$T/order.diff"; then
  fail "traind-run.5 lists the keys in another order than the key table:"; cat "$T/order.diff"
fi

[ "$failures" -eq 0 ] && pass "traind-run.5 documents the $keys run keys of traind --help with their defaults and ranges"
finish
