#!/usr/bin/env bash
# history_cli.sh: trainctl runs / show / export / plot against real ledgers.
# td_mkledger writes two node ledgers (n0, n1) of the same three runs with the
# daemon's ledger API; trainctl reads them without any daemon. Checked: the
# run table and its JSON; show; export round-trips (each table's CSV is
# exactly what sqlite3 selects from the ledger, and the JSON has as many
# rows); run id prefixes (unique, ambiguous, missing, DB:RUN); plot writes a
# gnuplot script whose curves and legend match the runs asked for and a PNG
# that decodes (zlib + struct, no PIL) at the requested size; a missing
# metric, a missing run and a missing gnuplot each fail with one line; --y
# bytes and bytes_recv hold the ledgers' per-round figures, and runs of a
# 2-node and a 6-node cluster are told apart by node count; the ledgers are
# never written to.
. "${top_srcdir:-.}/tests/integration/lib.sh"
TRAINCTL="${top_builddir:-$(pwd)}/trainctl"
MK="${top_builddir:-$(pwd)}/tests/integration/td_mkledger"
command -v sqlite3 >/dev/null || { echo "skipped: needs sqlite3"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: needs python3"; exit 77; }

mkdir -p "$T/n0" "$T/n1"
"$MK" "$T/n0/traind.db" 0 && "$MK" "$T/n1/traind.db" 1 || { fail "td_mkledger"; finish; }
# WAL files folded in, so that a read-only reader sees a plain database
sqlite3 "$T/n0/traind.db" 'PRAGMA wal_checkpoint(TRUNCATE)' >/dev/null
sqlite3 "$T/n1/traind.db" 'PRAGMA wal_checkpoint(TRUNCATE)' >/dev/null
sum0=$(cksum <"$T/n0/traind.db")
tc() { "$TRAINCTL" "$@"; }
export TRAIND_DATA_DIR="$T/n0"   # the default ledger
A=ab12000000000001 B=ab34000000000002 C=cd56000000000003

# runs: the three, oldest first, with model, mode, codec, rounds, metric, bytes
run runs tc runs
if [ "$(rc_of runs)" = 0 ] && [ "$(grep -c '^[0-9a-f]\{16\} ' "$T/runs.out")" = 3 ]; then
  pass "runs lists 3 runs"
else fail "runs:"; cat "$T/runs.out" "$T/runs.err"; fi
[ "$(sed -n 2p "$T/runs.out" | cut -c1-16)" = $A ] && [ "$(sed -n 4p "$T/runs.out" | cut -c1-16)" = $C ] \
  && pass "runs: oldest first" || fail "runs order: $(cut -c1-16 "$T/runs.out" | tr '\n' ' ')"
grep -qE "^$B .*mlp:784-64-10 +overlap +topk:0.01 +(mesh +)?12 +finished +test 0\.7700 +600000 " "$T/runs.out" \
  && pass "runs: $B row has model, mode, codec, rounds, state, metric, bytes" \
  || { fail "runs: row of $B:"; cat "$T/runs.out"; }
run runsj tc runs --json
python3 - "$T/runsj.out" <<'EOF' && pass "runs --json: 3 objects with the same figures" || fail "runs --json"
import json, sys
a = json.load(open(sys.argv[1]))
assert [r["run_id"] for r in a] == ["ab12000000000001", "ab34000000000002", "cd56000000000003"], a
b = a[1]
assert b["codec"] == "topk:0.01" and b["mode"] == "overlap" and b["rounds"] == 12, b
assert b["bytes_sent"] == 600000 and abs(b["test_accuracy"] - 0.77) < 1e-9, b
assert a[2]["updates"] == 0 and a[0]["updates"] == 24, a
EOF
run runs2 tc runs --db "$T/n0" --db "$T/n1/traind.db"
[ "$(grep -c '^[0-9a-f]\{16\} ' "$T/runs2.out")" = 6 ] && grep -q ' n1$' "$T/runs2.out" \
  && pass "runs over two ledgers: 6 rows, named by node" || { fail "runs over two ledgers"; cat "$T/runs2.out"; }

# show, by unique prefix
run show tc show cd5
grep -q "^run        $C" "$T/show.out" && grep -q '^rounds     8 ' "$T/show.out" \
  && grep -q '^  codec = none' "$T/show.out" && grep -q '^  seed = 7' "$T/show.out" \
  && pass "show cd5: run $C, 8 rounds, its spec" || { fail "show cd5"; cat "$T/show.out" "$T/show.err"; }
run showj tc show "$T/n1:ab3" --json
python3 -c '
import json, sys; o = json.load(open(sys.argv[1]))
assert o["run_id"] == "ab34000000000002" and o["ledger"].endswith("/n1/traind.db"), o
assert o["spec"]["codec"] == "topk:0.01" and o["rounds"] == 12 and o["bytes_sent"] == 12 * 50100, o
' "$T/showj.out" && pass "show DB:RUN --json reads node n1" || { fail "show n1:ab3 --json"; cat "$T/showj.out" "$T/showj.err"; }

# prefixes that do not name one run: one line each
run amb tc show ab
expect_error amb "ambiguous: ab12000000000001 and ab34000000000002"
run missing tc show ee
expect_error missing "no run 'ee' in .*/n0/traind.db"
run notid tc export xyz
expect_error notid "'xyz' is not a run id"
run twodb tc show ab1 --db "$T/n0" --db "$T/n1"
expect_error twodb "is in 2 ledgers"
run nodb tc runs --db "$T/nope.db"
expect_error nodb "no ledger at .*/nope.db"

# export round-trips: every table's CSV is exactly the ledger's rows
for id in $A $B $C; do
  for tbl in rounds updates links; do
    # every column, ids as the 16 hex digits trainctl shows, reals in their
    # shortest round-trip form (%.15g, %.16g or %.17g: the first that reads
    # back), read by Python's sqlite3 as the exact doubles the ledger holds
    python3 - "$T/n0/traind.db" $tbl $id >"$T/want.$id.$tbl" <<'PY'
import csv, sqlite3, sys
db, tbl, run = sys.argv[1:]
con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
order = "round" if tbl == "rounds" else "id"
cur = con.execute(f"SELECT * FROM {tbl} WHERE printf('%016x', run_id) = ? ORDER BY {order}", (run,))
names = [d[0] for d in cur.description]
def cell(name, v):
    if v is None: return ""
    if name in ("run_id", "peer") and isinstance(v, int): return "%016x" % (v & (2**64 - 1))
    if isinstance(v, float):
        for digits in (15, 16, 17):
            s = "%.*g" % (digits, v)
            if float(s) == v: return s
    return str(v)
w = csv.writer(sys.stdout, lineterminator="\n")
w.writerow(names)
for row in cur: w.writerow([cell(n, v) for n, v in zip(names, row)])
PY
    tc export "${id:0:6}" --table $tbl >"$T/got.$id.$tbl" 2>"$T/got.err"
    n=$(($(wc -l <"$T/got.$id.$tbl") - 1))
    if cmp -s "$T/want.$id.$tbl" "$T/got.$id.$tbl"; then
      pass "export $id $tbl: $n rows, identical to the ledger's"
    else
      fail "export $id $tbl differs from sqlite3:"; diff "$T/want.$id.$tbl" "$T/got.$id.$tbl" | head -5; cat "$T/got.err"
    fi
  done
done
[ "$(wc -l <"$T/got.$A.rounds")" = 13 ] && [ "$(wc -l <"$T/got.$C.updates")" = 1 ] \
  || fail "export row counts: rounds $(wc -l <"$T/got.$A.rounds"), updates of C $(wc -l <"$T/got.$C.updates")"
tc export $B --table events >"$T/ev.csv"
[ "$(wc -l <"$T/ev.csv")" = 4 ] && grep -q '"round 3 peer 00000000feed0001, ""slow"""' "$T/ev.csv" \
  && ! grep -q 'node started' "$T/ev.csv" \
  && pass "export events: the run's 3, quoted, none from outside it" || { fail "export events"; cat "$T/ev.csv"; }
tc export $B >"$T/all.csv"
[ "$(grep -c '^# ' "$T/all.csv")" = 4 ] && [ "$(wc -l <"$T/all.csv")" = $((4 + 3 + 13 + 25 + 13 + 4)) ] \
  && pass "export (all tables): 4 blocks, every row" || { fail "export all: $(wc -l <"$T/all.csv") lines"; }
tc export $B --format json >"$T/all.json"
python3 - "$T/all.json" <<'EOF' && pass "export --format json: 12 rounds, 24 updates, 12 links, 3 events" || fail "export json"
import json, sys
o = json.load(open(sys.argv[1]))
assert [len(o[t]) for t in ("rounds", "updates", "links", "events")] == [12, 24, 12, 3], o.keys()
assert o["run"]["spec"]["mode"] == "overlap" and o["rounds"][0]["run_id"] == "ab34000000000002"
assert o["rounds"][1]["eval_acc"] is not None and o["rounds"][0]["eval_acc"] is None
EOF

# plot: three runs on node n0, and run A on both nodes
cd "$T" || exit 1
run plot tc plot ab1 ab3 cd5 -o "$T/acc.png" --size 800x500
if [ "$(rc_of plot)" = 0 ] && [ -s "$T/acc.png" ] && [ -s "$T/acc.gp" ]; then
  pass "plot: $(cat "$T/plot.out")"
else fail "plot:"; cat "$T/plot.out" "$T/plot.err"; fi
python3 - "$T/acc.png" 800 500 <<'EOF' && pass "acc.png decodes: 800x500, every row inflated" || fail "acc.png does not decode"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "signature"
pos, idat, w = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0], kind
    if kind == b"IHDR":
        w, h, depth, color = struct.unpack(">IIBB", body[:10])
    if kind == b"IDAT":
        idat += body
    pos += 12 + n
assert (w, h) == (int(sys.argv[2]), int(sys.argv[3])), (w, h)
channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
raw = zlib.decompress(idat)
assert len(raw) == h * (1 + (w * channels * depth + 7) // 8), len(raw)
EOF
# the script: three curves, titled by what differs between the specs
gp="$T/acc.gp"
[ "$(grep -c '^\$s[0-9]* << EOD' "$gp")" = 3 ] && pass "acc.gp: 3 datablocks" || fail "acc.gp datablocks"
gp_titles() { grep 'using 1:2' "$1" | grep -o 'title "[^"]*"' | sed 's/title //' | tr '\n' '|'; }
titles=$(gp_titles "$gp")
[ "$titles" = '"seed=1 mode=sync codec=none"|"seed=1 mode=overlap codec=topk:0.01"|"seed=7 mode=overlap codec=none"|' ] \
  && pass "acc.gp legend: $titles" || fail "acc.gp legend: $titles"
grep -q "size 800,500" "$gp" && grep -q "set output '$T/acc.png'" "$gp" || fail "acc.gp terminal/output"
# points: 6 evaluations of A (rounds 2..12), at the rounds' end times
pts=$(awk '/^\$s0 << EOD/ { on = 1; next } /^EOD/ { on = 0 } on' "$gp" | wc -l)
[ "$pts" = 6 ] && pass "acc.gp: run A has its 6 evaluated rounds" || fail "acc.gp: run A has $pts points"
run plotn tc plot ab12 --db "$T/n0" --db "$T/n1" --x round --y loss -o "$T/nodes.svg"
titles=$(gp_titles "$T/nodes.gp")
[ "$(rc_of plotn)" = 0 ] && [ "$titles" = '"node n0"|"node n1"|' ] && grep -q '<svg' "$T/nodes.svg" \
  && pass "plot one run on two nodes: legend $titles, SVG written" \
  || { fail "plot by node: $titles"; cat "$T/plotn.err"; }
run plotg tc plot ab12 ab34 --y goodput --x bytes -o "$T/goodput.png"
[ "$(rc_of plotg)" = 0 ] && [ -s "$T/goodput.png" ] && pass "plot --y goodput --x bytes" \
  || { fail "plot goodput"; cat "$T/plotg.err"; }

# --y bytes: kB each node sent per round, drawn by round unless --x says
# otherwise; every datablock holds exactly its ledger's bytes_sent / 1000
# (bytes_recv likewise), read by Python's sqlite3 from the ledger the script
# names for the curve
bytes_match() { # GP COLUMN [X]: prints the curves checked, fails on any difference
  python3 - "$1" "$2" "${3:-round}" <<'EOF'
import re, sqlite3, sys
text = open(sys.argv[1]).read()
curves = re.findall(r"^# curve (\d+): run ([0-9a-f]{16}) in (.*)$", text, re.M)
assert curves, "no curves"
for num, rid, path in curves:
    block = re.search(r"^\$s%d << EOD\n(.*?)^EOD$" % (int(num) - 1), text, re.M | re.S).group(1)
    got = [tuple(map(float, line.split())) for line in block.splitlines()]
    sid = int(rid, 16) - (1 << 64 if int(rid, 16) >= 1 << 63 else 0)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    want = [(float(r), b / 1000.0) for r, b in con.execute(
        f"SELECT {sys.argv[3]}, {sys.argv[2]} FROM rounds WHERE run_id = ? ORDER BY round", (sid,))]
    assert want and len(got) == len(want), (rid, path, len(got), len(want))
    for g, w in zip(got, want):
        assert g[0] == w[0] and abs(g[1] - w[1]) <= 1e-9 * w[1], (rid, path, g, w)
print(len(curves))
EOF
}
run plotb tc plot ab12 ab34 --db "$T/n0" --db "$T/n1" --y bytes -o "$T/bytes.png"
curves=$(bytes_match "$T/bytes.gp" bytes_sent 2>"$T/bytes.py.err")
[ "$(rc_of plotb)" = 0 ] && [ -s "$T/bytes.png" ] && [ "$curves" = 4 ] \
  && grep -q '^set xlabel "round"$' "$T/bytes.gp" && grep -q '^set ylabel "kB sent by the node in the round"$' "$T/bytes.gp" \
  && pass "plot --y bytes: $curves curves (2 runs x 2 nodes) by round, in kB, equal to the ledgers' bytes_sent" \
  || { fail "plot bytes: '$curves'"; cat "$T/plotb.err" "$T/bytes.py.err"; }
run plotbr tc plot ab34 --db "$T/n0" --y bytes_recv --x samples -o "$T/recv.png"
curves=$(bytes_match "$T/recv.gp" bytes_recv 'sum(samples) OVER (ORDER BY round)' 2>"$T/recv.py.err")
[ "$(rc_of plotbr)" = 0 ] && [ "$curves" = 1 ] && grep -q '^set xlabel "samples trained by the node"$' "$T/recv.gp" \
  && pass "plot --y bytes_recv --x samples: equal to the ledger's bytes_recv" \
  || { fail "plot bytes_recv: '$curves'"; cat "$T/plotbr.err" "$T/recv.py.err"; }
# a run of a 6-node cluster (its own ledger: every round sends 5 times the
# bytes) beside the 2-node one: the legend tells them apart by node count
mkdir -p "$T/six0" && "$MK" "$T/six0/traind.db" 0 6 \
  && sqlite3 "$T/six0/traind.db" 'PRAGMA wal_checkpoint(TRUNCATE)' >/dev/null || fail "td_mkledger 6 nodes"
run plotc tc plot "$T/n0:ab12" "$T/six0:ab12" --y bytes -o "$T/clusters.png"
titles=$(gp_titles "$T/clusters.gp")
curves=$(bytes_match "$T/clusters.gp" bytes_sent 2>"$T/clusters.py.err")
[ "$(rc_of plotc)" = 0 ] && [ "$titles" = '"nodes=2, node n0"|"nodes=6, node six0"|' ] && [ "$curves" = 2 ] \
  && pass "plot --y bytes across node counts: legend $titles, values from each ledger" \
  || { fail "plot bytes across clusters: $titles '$curves'"; cat "$T/plotc.err" "$T/clusters.py.err"; }

# errors: one line each
run nobpb tc plot ab12 --y bpb -o "$T/x.png"
expect_error nobpb "run ab12000000000001 \(n0\) has no bpb metric"
run nostale tc plot ab12 cd56 --y staleness -o "$T/x.png"
expect_error nostale "run cd56000000000003 \(n0\) has no staleness metric"
# a run with bits-per-byte evaluations (text models; the column since ledger schema 3) plots bpb
mkdir -p "$T/txt" && cp "$T/n0/traind.db" "$T/txt/traind.db"
sqlite3 "$T/txt/traind.db" "UPDATE rounds SET eval_bpb = 8.0 / round WHERE round % 4 = 0"
run bpb tc plot "$T/txt:ab12" --y bpb --x round -o "$T/bpb.png"
pts=$(awk '/^\$s0 << EOD/ { on = 1; next } /^EOD/ { on = 0 } on' "$T/bpb.gp" | tr '\n' ' ')
[ "$(rc_of bpb)" = 0 ] && [ "$pts" = "4 2 8 1 12 0.6666666667 " ] \
  && pass "plot --y bpb reads eval_bpb: $pts" || { fail "plot bpb: '$pts'"; cat "$T/bpb.err"; }
# DB:RUN arguments that open three ledgers one after another (the set grows
# while the runs resolved first still point into it): every curve drawn
run mixed tc plot "$T/n0:ab12" "$T/n1:ab34" "$T/txt:cd56" "$T/n0:cd56" -o "$T/mixed.png"
[ "$(rc_of mixed)" = 0 ] && [ "$(grep -c '^\$s[0-9]* << EOD' "$T/mixed.gp")" = 4 ] \
  && pass "plot over three ledgers by DB:RUN: 4 curves" || { fail "plot DB:RUN over three ledgers"; cat "$T/mixed.err"; }
# a narrow chart: legend titles cut to what gnuplot fits ((400 - 140) / 9 = 28
# characters), or it draws an empty legend
run narrow tc plot ab12 ab34 cd56 -o "$T/narrow.png" --size 400x300
lens=$(grep -o 'pointsize 0.5 title "[^"]*"' "$T/narrow.gp" | sed 's/.*title "//; s/"$//' | awk '{ print length($0) (/\.\.\.$/ ? "c" : "") }' | tr '\n' ' ')
[ "$(rc_of narrow)" = 0 ] && [ -n "$lens" ] && ! grep -qE '(29|[3-9][0-9]|[0-9]{3})' <<<"$lens" && grep -q c <<<"$lens" \
  && pass "narrow plot: legend titles cut to fit ($lens)" || { fail "narrow plot titles: '$lens'"; cat "$T/narrow.err"; }
run norun tc plot ab12 ff -o "$T/x.png"
expect_error norun "no run 'ff'"
run noplot env PATH=/nonexistent "$TRAINCTL" plot ab12 -o "$T/y.png"
expect_error noplot "gnuplot not found .*gnuplot-nox"
run badext tc plot ab12 -o "$T/y.jpg"
expect_error badext "must end in .png or .svg"

# read-only: the ledgers are byte for byte what td_mkledger left
# (a WAL reader may leave an empty -wal and a -shm index: no data)
[ "$(cksum <"$T/n0/traind.db")" = "$sum0" ] && [ ! -s "$T/n0/traind.db-wal" ] \
  && pass "ledger n0 unchanged" || fail "ledger n0 was modified"
finish
