#!/usr/bin/env bash
# docs_refs.sh: every Markdown file that the sources cite exists, and so does
# the section a citation names. A reader who meets `docs/algorithms.md` in a
# comment looks for it from the top of the tree (or, for a bare `NAME.md`,
# beside the file too); `docs/algorithms.md#overlap` names the heading
# "Overlap" the way GitHub anchors it. A dangling one fails with its
# file:line (this script, whose examples are made up, is not scanned).
# Also: README.md stays a short entry point (at most 250 lines).
. "${top_srcdir:-.}/tests/integration/lib.sh"
SRC=$(cd "${top_srcdir:-.}" && pwd)

# The anchors of a Markdown file's headings, as GitHub makes them: lower case,
# punctuation other than - and _ dropped, blanks as -.
anchors() {
  awk '/^```/ { fence = !fence } !fence && /^#+ / {
         h = tolower($0); sub(/^#+ +/, "", h)
         gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h }' "$1"
}

# check_tree DIR: print FILE:LINE: CITATION for each dangling citation under
# DIR; exit status 1 if there is one. Sources are C, CUDA, shell, automake,
# the scripts and the Markdown files themselves; build trees are skipped.
check_tree() {
  local dir=$1 bad=0 file line cite path anchor
  while IFS=: read -r file line cite; do
    path=${cite%%#*}
    anchor=; [ "$path" != "$cite" ] && anchor=${cite#*#}
    local found=
    for base in "$dir" "$(dirname "$dir/$file")"; do
      if [ -f "$base/$path" ]; then found="$base/$path"; break; fi
    done
    if [ -z "$found" ]; then
      echo "$file:$line: $cite (no such file)"; bad=1
    elif [ -n "$anchor" ] && ! anchors "$found" | grep -qxF -- "$anchor"; then
      echo "$file:$line: $cite (no heading with that anchor in $path)"; bad=1
    fi
  done < <(cd "$dir" && find . \( -name build -o -name '_build' -o -name .git -o -name autom4te.cache \
                                   -o -name corpus -o -path ./tests/integration/docs_refs.sh \) -prune -o -type f \
             \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.sh' \
                -o -name '*.am' -o -name '*.in' -o -name '*.md' -o -name '*.ini' -o -path './scripts/*' \) \
             -print | sed 's|^\./||' | sort |
           while read -r f; do
             grep -noE '[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md(#[a-z0-9_-]+)?' "$f" | sed "s|^|$f:|"
           done)
  return $bad
}

# The checker itself catches a dangling file and a dangling section.
mkdir -p "$T/tree/docs" "$T/tree/src"
printf '# Title\n\n## Real section\n' >"$T/tree/docs/real.md"
printf '/* see docs/real.md#real-section */\n/* and docs/real.md */\n' >"$T/tree/src/good.c"
check_tree "$T/tree" >"$T/good.out" && pass "the checker accepts real citations" \
  || { fail "the checker refused real citations:"; cat "$T/good.out"; }
printf '/* fine: docs/real.md */\n/* see docs/bogus.md */\n/* and docs/real.md#no-such-section */\n' \
  >"$T/tree/src/bad.c"
check_tree "$T/tree" >"$T/bad.out"
grep -qx 'src/bad.c:2: docs/bogus.md (no such file)' "$T/bad.out" \
  && grep -q '^src/bad.c:3: docs/real.md#no-such-section (no heading' "$T/bad.out" \
  && [ "$(wc -l <"$T/bad.out")" -eq 2 ] \
  && pass "the checker names a dangling file and a dangling section with file:line" \
  || { fail "the checker missed a dangling citation:"; cat "$T/bad.out"; }

# The tree.
if check_tree "$SRC" >"$T/tree.out"; then
  pass "every *.md cited in the sources exists, with the sections named"
else
  fail "dangling citations of Markdown files:"; cat "$T/tree.out"
fi
for doc in README.md docs/design.md docs/algorithms.md bench/RESULTS.md NEWS; do
  [ -f "$SRC/$doc" ] || fail "$doc is missing"
done
lines=$(wc -l <"$SRC/README.md")
[ "$lines" -le 250 ] && pass "README.md has $lines lines (at most 250)" \
  || fail "README.md has $lines lines; keep it at most 250 and move the rest to docs/"
finish
