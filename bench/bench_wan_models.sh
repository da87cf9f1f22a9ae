#!/usr/bin/env bash
# bench/bench_wan_models.sh (`make bench-wan`): does distributing pay on a poor
# WAN? Time to a target on compute-bound models, four traind nodes against one
# node alone and against synchronous data-parallel training on the same links.
#
# Every node runs with slowdown = 4 (an edge device a quarter of this
# machine's core; four of them fit in two cores). The four-node runs use the
# network of bench/wan-cnn.ini: one network namespace per node, tbf-shaped
# uplinks of 20, 20, 2 and 2 Mbit/s, 50 ms added one-way latency. For each
# model (cnn on Fashion-MNIST to 0.90 test accuracy; gpt:4-128-4-128 on the
# fortunes text to a held-out bits-per-byte target) it runs, with traind-lab:
#   (1) one node alone, its own best settings      bench/wan-MODEL-1.ini
#   (s) four nodes, mode=sync codec=none, every step averaged over the mesh
#       (what DDP does), capped                     bench/wan-MODEL.ini [sync_ddp]
#   (b) four nodes, the best configuration found    bench/wan-MODEL.ini [best]
# and prints one table per model: time to the target, the speed-ups, the final
# metric on every node, MB sent per node (whole run, and up to the target),
# compute idle per node and the codecs per link; plus plots (metric against
# time and against bytes) of the three runs side by side.
#
# (s) cannot reach the target inside the bench (a dense round of the cnn is
# ~20 s on the 2 Mbit/s uplinks): it is capped, and its time and bytes to the
# target are projected from its measured seconds and bytes per round and the
# steps (1) needed (with SGD, one averaged step of four quarter batches is one
# step of the whole batch, so (s) needs the steps of (1) at the same batch).
#
# Needs root (namespaces); exits 77 without. Knobs: MODELS ("cnn gpt"), KEEP
# (an output directory to keep; a temporary one otherwise), LOG_LEVEL,
# REPORT_ONLY=1 (with KEEP: print the tables of an earlier run again).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${top_builddir:-$ROOT/build}
. "$ROOT/tests/integration/netns_lib.sh"
[ -n "${REPORT_ONLY:-}" ] || td_wan_can_run || exit 77
export TD_LAB_BINDIR=$B TD_LAB_NETNS=$ROOT/tests/integration/netns_lib.sh
T=$(mktemp -d /tmp/td-wanm-XXXXXX)
trap 'rm -rf "$T"' EXIT
OUT=${KEEP:-$T/out}
mkdir -p "$OUT" || exit 1
RC=0
t_all=$(date +%s)

# lab FILE NAME: run one experiment file into $OUT/NAME
lab() {
  sed -e '/^log_level *=/d' -e "/^\[lab\]/a log_level = ${LOG_LEVEL:-warn}" "$ROOT/bench/$1" >"$T/$2.ini"
  echo "== traind-lab bench/$1"
  # a capped (s) ends "stopped" (the lab's status 1): only an unfinished
  # variant other than sync_ddp fails the bench
  "$B/cli/traind-lab" "$T/$2.ini" -o "$OUT/$2" --keep-going
  awk -F, 'NR > 1 && $1 != "sync_ddp" && $3 != "finished" { bad = 1 } END { exit bad }' \
    "$OUT/$2/summary.csv" 2>/dev/null || RC=1
}
# q DIR NODE SQL: one query on a node's ledger
q() { sqlite3 "$OUT/$1/n$2/traind.db" "$3" 2>/dev/null; }
rid() { awk -F, -v v="$2" '$1 == v { print $2 }' "$OUT/$1/summary.csv"; }
w() { echo "printf('%016x', run_id) = '$1'"; }
# evaluator DIR RUN: the node with the most evaluations of the run (eval_nodes
# = 1 leaves them to rank 0, which need not be node 0); node 0 on a tie
evaluator() {
  local i n best=0 most=-1
  for i in $(ls -d "$OUT/$1"/n[0-9]* 2>/dev/null | grep -o '[0-9]*$' | sort -n); do
    n=$(q "$1" "$i" "SELECT count(*) FROM rounds WHERE $(w "$2") AND coalesce(eval_acc, eval_bpb) IS NOT NULL")
    [ "${n:-0}" -gt "$most" ] && most=${n:-0} best=$i
  done
  echo "$best"
}

# factors DIR RUN NODES TTT: "samples nodes rate busy" up to the target
# time: samples trained by all nodes, samples per compute second, and compute
# seconds over NODES x TTT
factors() {
  local d=$1 r=$2 n=$3 t=$4 i s=0 c=0 t_abs one
  t_abs=$(q "$d" 0 "SELECT started + $t FROM runs WHERE $(w "$r")")
  for ((i = 0; i < n; i++)); do
    one=$(q "$d" $i "SELECT total(samples) || ' ' || total(compute_s) FROM rounds WHERE $(w "$r") AND ended <= $t_abs + 0.001")
    s=$(awk -v a="$s" -v b="${one% *}" 'BEGIN { print a + b }')
    c=$(awk -v a="$c" -v b="${one#* }" 'BEGIN { print a + b }')
  done
  awk -v s="$s" -v c="$c" -v n="$n" -v t="$t" 'BEGIN { printf "%d %d %.1f %.2f", s, n, s / c, c / (n * t) }'
}

# report MODEL COL OP TARGET: the table for one model
report() {
  local m=$1 col=$2 op=$3 target=$4 unit
  [ "$col" = eval_acc ] && unit="test accuracy" || unit="bits per byte"
  local r1 rs rb
  r1=$(rid "$m-1" one) rs=$(rid "$m-4" sync_ddp) rb=$(rid "$m-4" best)
  [ -n "$r1" ] && [ -n "$rs" ] && [ -n "$rb" ] || { echo "$m: a run is missing; see $OUT"; RC=1; return; }
  # the node that evaluated (eval_nodes = 1: rank 0, whichever node that is)
  local e1 es eb
  e1=$(evaluator "$m-1" "$r1") es=$(evaluator "$m-4" "$rs") eb=$(evaluator "$m-4" "$rb")
  # time to target: the evaluating node's first evaluation at/over the target;
  # its round's end time
  ttt() { q "$1" "$3" "SELECT CASE WHEN count(*) > 0 THEN printf('%.1f', min(r.ended) - u.started) END FROM rounds r, runs u WHERE r.run_id = u.run_id AND printf('%016x', r.run_id) = '$2' AND r.$col $op $target"; }
  local t1 ts tb tvb= t1vb=
  t1=$(ttt "$m-1" "$r1" "$e1") ts=$(ttt "$m-4" "$rs" "$es") tb=$(ttt "$m-4" "$rb" "$eb")
  # (s) projected: (1)'s steps to the target at (s)'s seconds and bytes per step
  local steps1 hs rounds_s wall_s state_s last_s proj_t proj_mb
  steps1=$(q "$m-1" "$e1" "SELECT sum(local_steps) FROM rounds WHERE $(w "$r1") AND round <= (SELECT min(round) FROM rounds WHERE $(w "$r1") AND $col $op $target)")
  hs=$(q "$m-4" 0 "SELECT max(local_steps) FROM rounds WHERE $(w "$rs")")
  rounds_s=$(q "$m-4" 0 "SELECT count(*) FROM rounds WHERE $(w "$rs")")
  wall_s=$(q "$m-4" 0 "SELECT printf('%.1f', max(ended) - (SELECT started FROM runs WHERE $(w "$rs"))) FROM rounds WHERE $(w "$rs")")
  state_s=$(q "$m-4" 0 "SELECT state FROM runs WHERE $(w "$rs")")
  last_s=$(q "$m-4" "$es" "SELECT printf('%.4f', $col) FROM rounds WHERE $(w "$rs") AND $col IS NOT NULL ORDER BY round DESC LIMIT 1")
  echo
  echo "=== $m: time to $target $unit (the first evaluation there) ==="
  if [ -z "$ts" ] && [ -n "$steps1" ] && [ "${rounds_s:-0}" -gt 0 ]; then
    proj_t=$(awk -v s="$steps1" -v h="${hs:-1}" -v n="$rounds_s" -v t="$wall_s" 'BEGIN { printf "%.0f", s / h * t / n }')
    echo "(s) $state_s after $rounds_s rounds in $wall_s s (last evaluation ${last_s:-none}); projected to the target:" \
         "$steps1 steps of (1) at $(awk -v n="$rounds_s" -v t="$wall_s" -v h="${hs:-1}" 'BEGIN { printf "%.2f", t / n / h }') s per step = ${proj_t} s"
  fi
  local ts_eff=${ts:-${proj_t:-}}
  printf '%-26s %10s %9s\n' "run" "time_s" "speed-up"
  printf '%-26s %10s %9s\n' "(1) one node" "${t1:--}" "1.00x"
  printf '%-26s %10s %9s\n' "(s) sync, none, H=1" "${ts:-${proj_t:+~$proj_t}}" \
    "$([ -n "$t1" ] && [ -n "$ts_eff" ] && awk -v a="$t1" -v b="$ts_eff" 'BEGIN { printf "%.2fx", a / b }')"
  printf '%-26s %10s %9s\n' "(b) best" "${tb:--}" \
    "$([ -n "$t1" ] && [ -n "$tb" ] && awk -v a="$t1" -v b="$tb" 'BEGIN { printf "%.2fx", a / b }')"
  if [ -z "$tb" ]; then
    # not reached: compare at the best value (b) did reach
    local vb
    vb=$(q "$m-4" "$eb" "SELECT $([ "$op" = '>=' ] && echo "max($col) - 1e-9" || echo "min($col) + 1e-9") FROM rounds WHERE $(w "$rb")")
    if [ -n "$vb" ]; then
      tvb=$(q "$m-4" "$eb" "SELECT CASE WHEN count(*) > 0 THEN printf('%.1f', min(r.ended) - u.started) END FROM rounds r, runs u WHERE r.run_id = u.run_id AND printf('%016x', r.run_id) = '$rb' AND r.$col $op $vb")
      t1vb=$(q "$m-1" "$e1" "SELECT CASE WHEN count(*) > 0 THEN printf('%.1f', min(r.ended) - u.started) END FROM rounds r, runs u WHERE r.run_id = u.run_id AND printf('%016x', r.run_id) = '$r1' AND r.$col $op $vb")
      awk -v v="$vb" -v a="${t1vb:-}" -v b="$tvb" 'BEGIN {
        printf "(b) did not reach the target; its best, %.4f, at %s s", v, b
        if (a != "") printf "; (1) reached it at %s s: (b) %.2fx sooner", a, a / b
        printf "\n" }'
    fi
  fi
  if [ -n "$tb" ]; then
    [ -n "$t1" ] && awk -v a="$t1" -v b="$tb" 'BEGIN { printf "(b) against (1): %.2fx sooner\n", a / b }'
    [ -n "$ts_eff" ] && awk -v a="$ts_eff" -v b="$tb" -v p="${ts:+measured}" 'BEGIN { printf "(b) against (s): %.1fx sooner (%s)\n", a / b, p == "" ? "projected (s)" : "measured" }'
  fi
  # per node: final metric, MB sent (run, and up to (b)'s target), idle
  echo
  printf '%-8s %-5s %12s %12s %14s %8s\n' run node final "MB sent" "MB to target" idle
  local v r d e i n fin mb mbt idle t_abs nodes
  for v in one sync_ddp best; do
    case $v in one) r=$r1 d=$m-1 e=$e1 ;; sync_ddp) r=$rs d=$m-4 e=$es ;; best) r=$rb d=$m-4 e=$eb ;; esac
    nodes=$(ls -d "$OUT/$d"/n[0-9]* 2>/dev/null | grep -c '/n[0-9]*$')
    t_abs=$(q "$d" "$e" "SELECT min(ended) FROM rounds WHERE $(w "$r") AND $col $op $target")
    for ((i = 0; i < nodes; i++)); do
      if [ "$col" = eval_acc ]; then
        fin=$(q "$d" $i "SELECT printf('%.4f', test_accuracy) FROM runs WHERE $(w "$r") AND test_accuracy IS NOT NULL")
      else
        fin=$(q "$d" $i "SELECT printf('%.4f', eval_bpb) FROM rounds WHERE $(w "$r") AND eval_bpb IS NOT NULL ORDER BY round DESC LIMIT 1")
      fi
      mb=$(q "$d" $i "SELECT printf('%.2f', total(bytes_sent) / 1e6) FROM rounds WHERE $(w "$r")")
      mbt=-
      [ -n "$t_abs" ] && mbt=$(q "$d" $i "SELECT printf('%.2f', total(bytes_sent) / 1e6) FROM rounds WHERE $(w "$r") AND ended <= $t_abs")
      idle=$(q "$d" $i "SELECT printf('%.1f%%', 100.0 * total(wait_s) / (total(wait_s) + total(compute_s))) FROM rounds WHERE $(w "$r")")
      printf '%-8s n%-4s %12s %12s %14s %8s\n' "$v" "$i" "${fin:--}" "${mb:--}" "$mbt" "${idle:--}"
    done
  done
  if [ -z "$ts" ] && [ -n "${proj_t:-}" ]; then
    local per_round
    per_round=$(q "$m-4" 2 "SELECT total(bytes_sent) / count(*) FROM rounds WHERE $(w "$rs")")
    proj_mb=$(awk -v b="$per_round" -v s="$steps1" -v h="${hs:-1}" 'BEGIN { printf "%.0f", b * s / h / 1e6 }')
    echo "(s) projected MB to the target per node: $proj_mb (its measured $(awk -v b="$per_round" 'BEGIN { printf "%.2f", b / 1e6 }') MB per round x $steps1 / ${hs:-1} rounds)"
    # (b)'s bytes up to its target time, per node; the node that sent most
    local mbb most=0 who= t_b
    t_b=$(q "$m-4" "$eb" "SELECT min(ended) FROM rounds WHERE $(w "$rb") AND $col $op $target")
    if [ -n "$t_b" ]; then
      for i in $(ls -d "$OUT/$m-4"/n[0-9]* 2>/dev/null | grep -o '[0-9]*$' | sort -n); do
        mbb=$(q "$m-4" "$i" "SELECT total(bytes_sent) / 1e6 FROM rounds WHERE $(w "$rb") AND ended <= $t_b")
        awk -v a="${mbb:-0}" -v b="$most" 'BEGIN { exit !(a > b) }' && most=$mbb who=$i
      done
      [ -n "$who" ] && awk -v s="$proj_mb" -v b="$most" -v n="$who" \
        'BEGIN { printf "(b) sent %.1fx fewer bytes than (s) up to the target (the node that sent most, n%s: %.1f MB)\n", s / b, n, b }'
    fi
  fi
  # where the time to the target goes: TTT = S / (N x rate x busy), S the
  # samples all nodes trained up to it, rate a node's samples per second of
  # compute (slowdown included), busy the share of the wall time it computed
  local c1=${t1:-} cb=${tb:-} what="the target"
  if [ -z "$tb" ]; then c1=${t1vb:-} cb=${tvb:-} what="(b)'s best"; fi
  if [ -n "$c1" ] && [ -n "$cb" ]; then
    local f1 fb
    f1=$(factors "$m-1" "$r1" 1 "$c1") fb=$(factors "$m-4" "$rb" 4 "$cb")
    echo "breakdown to $what: time = samples / (nodes x rate x busy)"
    printf '  %-4s %10s %6s %12s %7s\n' run samples nodes "rate /s" busy
    printf '  %-4s %10s %6s %12s %7s\n' "(1)" $f1
    printf '  %-4s %10s %6s %12s %7s\n' "(b)" $fb
    awk -v a="$f1" -v b="$fb" 'BEGIN { split(a, x, " "); split(b, y, " ");
      printf "  (b)/(1): %.2fx = samples %.2f x nodes %.0f x rate %.2f x busy %.2f\n",
        (x[1] / (x[2] * x[3] * x[4])) / (y[1] / (y[2] * y[3] * y[4])), x[1] / y[1], y[2] / x[2], y[3] / x[3], y[4] / x[4] }'
  fi
  echo "codecs per link of (b) (sender -> receiver: codec x rounds):"
  grep "^  best " "$OUT/$m-4/summary.txt" | sed 's/^  best /  /'
  # plots: the three runs on one chart
  if command -v gnuplot >/dev/null; then
    local y; [ "$col" = eval_acc ] && y=accuracy || y=bpb
    # the runs that evaluated at all (a capped (s) may have stopped before its first)
    local runs=() spec
    for spec in "$m-1 $e1 $r1" "$m-4 $es $rs" "$m-4 $eb $rb"; do
      set -- $spec
      [ "$(q "$1" "$2" "SELECT count(*) FROM rounds WHERE $(w "$3") AND $col IS NOT NULL")" -gt 0 ] &&
        runs+=("$OUT/$1/n$2:$3")
    done
    for x in time bytes; do
      "$B/trainctl" plot "${runs[@]}" --y "$y" --x "$x" --size 1400x700 \
        -o "$OUT/$m-$y-by-$x.png" >/dev/null 2>&1 && echo "plot: $OUT/$m-$y-by-$x.png"
    done
  fi
}

for m in ${MODELS:-cnn gpt}; do
  [ -r "$ROOT/bench/wan-$m.ini" ] && [ -r "$ROOT/bench/wan-$m-1.ini" ] || { echo "no bench/wan-$m.ini"; exit 2; }
  [ -n "${REPORT_ONLY:-}" ] && continue
  lab "wan-$m-1.ini" "$m-1"
  lab "wan-$m.ini" "$m-4"
done
for m in ${MODELS:-cnn gpt}; do
  tgt=$(sed -n 's/^target = //p' "$ROOT/bench/wan-$m.ini")
  case $tgt in
    bpb:*) report "$m" eval_bpb '<=' "${tgt#bpb:}" ;;
    *) report "$m" eval_acc '>=' "$tgt" ;;
  esac
done
echo
echo "bench-wan: $(( $(date +%s) - t_all )) s in all; output in $OUT"
exit $RC
