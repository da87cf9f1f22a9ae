#!/usr/bin/env bash
# cluster_metrics.sh: `traind --metrics HOST:PORT`. Two nodes on loopback, a
# with --metrics on an ephemeral port (read back from DATA_DIR/metrics_port),
# run a short sync run; /metrics is scraped with curl during the run and after
# it: the counters move (rounds, samples, bytes sent to b), the figures match
# the ledger once the run is over (and status's last round's bytes are the
# ledger's last row), `promtool check metrics` accepts both
# scrapes (skipped with a message without promtool), and a busy port or a bad
# address stops traind at start with one clear line. Off by default: b, started
# without the flag, has no metrics_port. When a stops, the port is closed.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"

if ! command -v curl >/dev/null; then
  echo "SKIP: curl is not installed"
  exit 77
fi

start_node a --metrics 127.0.0.1:0 || finish
start_node b || finish
port=$(cat "$T/a/metrics_port" 2>/dev/null)
[ -n "$port" ] && pass "a serves metrics on port $port" || { fail "no DATA_DIR/metrics_port"; finish; }
[ -e "$T/b/metrics_port" ] && fail "b serves metrics without --metrics"
URL="http://127.0.0.1:$port/metrics"

# scrape NAME: the body of GET /metrics in $T/NAME.prom
scrape() { curl -sf --max-time 10 -o "$T/$1.prom" "$URL"; }
# value NAME SERIES: the value of one series (exact name and labels) in a scrape
value() { awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print "none" }' "$T/$1.prom"; }
# scrape_until NAME SERIES VALUE: scrape until SERIES reads VALUE (a heartbeat
# publishes the figures; on a loaded machine it may come late), up to 10 s
scrape_until() {
  local i
  for i in $(seq 50); do
    scrape "$1" && [ "$(value "$1" "$2")" = "$3" ] && return 0
    sleep 0.2
  done
  return 1
}

promcheck() {
  if ! command -v promtool >/dev/null; then
    echo "note: promtool not installed (Debian prometheus): skipping the format check of $1"
    return
  fi
  promtool check metrics <"$T/$1.prom" >"$T/$1.promtool" 2>&1 \
    && pass "$1: promtool check metrics passes" \
    || { fail "$1: promtool check metrics:"; cat "$T/$1.promtool"; }
}

# the option is validated, and a busy port is refused at start
run bad_addr "$TRAIND" --data-dir "$T/x" --control "$T/x/ctl" --metrics localhost
expect_error bad_addr "metrics address 'localhost': expected HOST:PORT"
run busy "$TRAIND" --data-dir "$T/y" --control "$T/y/ctl" --listen tcp://127.0.0.1:0 \
  --metrics "127.0.0.1:$port"
expect_error busy "cannot serve metrics on 127.0.0.1:$port: Address already in use"

code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")
[ "$code" = 404 ] && pass "GET / is a 404" || fail "GET / answered $code"

ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
for n in a b; do wait_peers $n 1 15 || fail "$n does not see its peer"; done
b_id=$(cat "$T/b/node_id")
SENT="traind_link_sent_bytes_total{peer=\"$b_id\"}"

scrape_until idle 'traind_peers{state="alive"}' 1 || scrape idle || fail "scrape before the run"
promcheck idle
[ "$(value idle 'traind_peers{state="alive"}')" = 1 ] && pass "idle: 1 peer alive" \
  || fail "idle: peers alive $(value idle 'traind_peers{state="alive"}')"
[ "$(value idle traind_rounds_total)" = 0 ] || fail "idle: rounds_total $(value idle traind_rounds_total)"

out=$(ctl a start --set model=mlp:784-64-10 --set batch=32 --set local_steps=4 --set rounds=200 \
      --set eval_every=50 --set lr=0.05) || fail "start: $out"
run_id=$(sed -E 's/started run ([0-9a-f]+).*/\1/' <<<"$out")

# during the run: a scrape that shows it running with rounds done
mid=0
for i in $(seq 300); do
  if scrape mid && [ "$(value mid "traind_run_running{run_id=\"$run_id\"}")" = 1 ]; then
    mid=$(value mid traind_rounds_total)
    [ "$mid" != none ] && [ "$mid" -ge 1 ] && break
  fi
  mid=0
  sleep 0.1
done
[ "$mid" -ge 1 ] && pass "during the run: traind_rounds_total $mid, running 1" \
  || fail "no scrape saw the run running with a round done"
promcheck mid
grep -q "^traind_link_staleness_rounds{peer=\"$b_id\"} 0$" "$T/mid.prom" \
  && pass "during the run: staleness 0 on the link to b (sync)" \
  || fail "during the run: no staleness 0 for the link to b"
mid_sent=$(value mid "$SENT")
mid_samples=$(value mid traind_samples_total)

wait_run_state a finished 300 || fail "a did not finish"
wait_run_state b finished 60 || fail "b did not finish"
# a heartbeat publishes the last figures
scrape_until end "traind_run_running{run_id=\"$run_id\"}" 0 || scrape end \
  || fail "scrape after the run"
promcheck end
end_rounds=$(value end traind_rounds_total)
end_sent=$(value end "$SENT")
end_samples=$(value end traind_samples_total)

[ "$end_rounds" -gt "$mid" ] && pass "rounds_total moved: $mid -> $end_rounds" \
  || fail "rounds_total did not move: $mid -> $end_rounds"
[ "$end_sent" -gt "$mid_sent" ] && pass "bytes sent to b moved: $mid_sent -> $end_sent" \
  || fail "bytes sent to b did not move: $mid_sent -> $end_sent"
[ "$end_samples" -gt "$mid_samples" ] && pass "samples_total moved: $mid_samples -> $end_samples" \
  || fail "samples_total did not move: $mid_samples -> $end_samples"

# after the run, the counters are the ledger's
nr=$(sql a "SELECT count(*) FROM rounds")
[ "$end_rounds" -eq "$nr" ] && pass "rounds_total $end_rounds = ledger rounds" \
  || fail "rounds_total $end_rounds, ledger $nr rounds"
ns=$(sql a "SELECT sum(samples) FROM rounds")
[ "$end_samples" -eq "$ns" ] && pass "samples_total $end_samples = ledger samples" \
  || fail "samples_total $end_samples, ledger $ns"
[ "$(value end "traind_run_running{run_id=\"$run_id\"}")" = 0 ] || fail "end: still running"
[ "$(value end traind_run_round)" = "$nr" ] || fail "end: run_round $(value end traind_run_round)"
for s in traind_compute_seconds_total traind_run_eval_accuracy traind_run_loss; do
  v=$(value end $s)
  awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || fail "end: $s is $v"
done
acc=$(value end traind_run_eval_accuracy)
st_acc=$(json_field "$(ctl a status --json)" eval_accuracy)
awk -v a="$acc" -v b="$st_acc" 'BEGIN { d = a - b; exit !(d < 1e-9 && d > -1e-9) }' \
  && pass "eval accuracy $acc, as trainctl status says" || fail "eval accuracy $acc, status $st_acc"
# status: the newest round's bytes sent and received are its ledger row's
st_bytes=$(ctl a status --json | python3 -c 'import json, sys
r = json.load(sys.stdin)["run"]
print(r["last_row_round"], r["last_row_bytes_sent"], r["last_row_bytes_recv"])')
row=$(sql a "SELECT round || ' ' || bytes_sent || ' ' || bytes_recv FROM rounds ORDER BY round DESC LIMIT 1")
read -r r_round r_sent r_recv <<<"$row"
line=$(awk -v r="$r_round" -v s="$r_sent" -v v="$r_recv" \
  'BEGIN { printf "bytes   round %s: %.1f kB sent, %.1f kB of updates received", r, s / 1e3, v / 1e3 }')
[ -n "$row" ] && [ "$r_sent" -gt 0 ] && [ "$st_bytes" = "$row" ] && ctl a status | grep -qxF "$line" \
  && pass "status: last round's bytes ($st_bytes) are the ledger's; human: $line" \
  || fail "status last_row_* '$st_bytes', ledger '$row', human line '$line' not in: $(ctl a status | grep '^bytes')"
grep -q "^traind_link_codec_info{peer=\"$b_id\",codec=\"none\"} 1$" "$T/end.prom" \
  && pass "link to b: codec none" || fail "no codec info for the link to b"
grep -q '^traind_dropped_messages_total{kind="malformed"} 0$' "$T/end.prom" \
  || fail "no drop counter by kind"

# shutdown: the server stops with the node
kill -TERM "$(cat "$T/a.pid")"
for i in $(seq 100); do kill -0 "$(cat "$T/a.pid")" 2>/dev/null || break; sleep 0.1; done
curl -s --max-time 2 -o /dev/null "$URL" && fail "metrics still served after a stopped"
[ -e "$T/a/metrics_port" ] && fail "metrics_port left behind"
grep -q "stopped cleanly" "$T/a.log" && pass "a stopped cleanly, port closed" \
  || fail "a did not stop cleanly"
finish
