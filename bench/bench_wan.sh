#!/usr/bin/env bash
# bench/bench_wan.sh: time to a target test accuracy on an emulated WAN, the
# lab experiment bench/wan-4.ini run by traind-lab (cli/traind-lab.in): four
# traind nodes, each in its own network namespace with tbf-shaped uplinks of
# 20, 20, 2 and 2 Mbit/s, train Fashion-MNIST three times:
#   (a)  sync_none       mode=sync    codec=none  batching=equal
#   (b)  overlap_auto    mode=overlap codec=auto  batching=weighted overlap_fill=FILL (1000)
#   (b0) overlap_nofill  as (b) without overlap_fill: the same samples as (a),
#        so its final accuracy is the like-for-like comparison ((b) trains
#        ~30x more samples in its idle time and ends higher)
# The lab prints, side by side, the seconds from start to the first
# evaluation at or above TARGET on node 0, the final accuracy, every node's
# MB sent and compute idle fraction (wait / (compute + wait), the time after
# the last round, e.g. the final anchor reconciliation, counted as waiting)
# and the codecs codec=auto chose per link, and draws the curves; this script
# adds the speed-ups. Needs root (namespaces); exits 77 without.
# Knobs: TARGET (0.85; bpb:X for a text MODEL such as gpt:2-64-2-64, which
# trains on text:fortunes and reaches the target at or below X bits per byte), MODEL, EPOCHS, H, MOMENTUM (the file's by default),
# CAP_S (per-run time limit, 600), LOG_LEVEL, KEEP (output directory to keep;
# a temporary one otherwise), RUNS (which of sync_none overlap_auto
# overlap_nofill to run; all by default), B_ARGS (extra "--set key=value" words
# for (b) only), FILL (overlap_fill of (b): a round
# of this model computes for ~3 ms against a >= 200 ms exchange on the 2
# Mbit/s links, so without it compute idles ~99 %).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${top_builddir:-$ROOT/build}
. "$ROOT/tests/integration/netns_lib.sh"
td_wan_can_run || exit 77
export TD_LAB_BINDIR=$B TD_LAB_NETNS=$ROOT/tests/integration/netns_lib.sh
T=$(mktemp -d /tmp/td-wan-XXXXXX)
trap 'rm -rf "$T"' EXIT
OUT=${KEEP:-$T/lab}
# the experiment, with the knobs that are not run keys applied to a copy
sed -e "s/^target = .*/target = ${TARGET:-0.85}/" -e "s/^timeout_s = .*/timeout_s = ${CAP_S:-600}/" \
    -e "s/^overlap_fill = 1000$/overlap_fill = ${FILL:-1000}/" \
    -e "s/^log_level = .*//" "$ROOT/bench/wan-4.ini" >"$T/wan-4.ini"
echo "log_level = ${LOG_LEVEL:-warn}" >"$T/lab.keys"
sed -i "/^\[lab\]/r $T/lab.keys" "$T/wan-4.ini"
: >"$T/b.keys"
for w in ${B_ARGS:-}; do [ "$w" = --set ] || echo "${w%%=*} = ${w#*=}" >>"$T/b.keys"; done
sed -i "/^\[variant overlap_auto\]/r $T/b.keys" "$T/wan-4.ini"
args=()
[ -n "${MODEL:-}" ] && args+=(--set "model=$MODEL")
[ -n "${EPOCHS:-}" ] && args+=(--set "epochs=$EPOCHS")
[ -n "${H:-}" ] && args+=(--set "local_steps=$H")
[ -n "${MOMENTUM:-}" ] && args+=(--set "momentum=$MOMENTUM")
[ -n "${RUNS:-}" ] && args+=(--only "$(tr ' ' ',' <<<"$RUNS" | sed 's/^,*//; s/,*$//; s/,,*/,/g')")
"$B/cli/traind-lab" "$T/wan-4.ini" -o "$OUT" --keep-going "${args[@]}"
rc=$?
csv="$OUT/summary.csv"
[ -r "$csv" ] || exit 1
col() { awk -F, -v v="$1" -v c="$2" '$1 == v { print $c }' "$csv"; }
a=$(col sync_none 4) b=$(col overlap_auto 4)
if [ -n "$a" ] && [ -n "$b" ]; then
  awk -v a="$a" -v b="$b" 'BEGIN { printf "speed-up of overlap+auto over sync+none to the target: %.2fx\n", a / b }'
else
  echo "speed-up: target not reached by one of the runs (sync+none: ${a:-no}, overlap+auto: ${b:-no})"
fi
aa=$(col sync_none 6)
for r in overlap_auto overlap_nofill; do
  x=$(col $r 6) y=$(col $r 4)
  [ -n "$aa" ] && [ -n "$x" ] && awk -v a="$aa" -v x="$x" -v r="$r" -v t="$a" -v y="$y" 'BEGIN {
    printf "%s: final accuracy %+.2f points against sync+none", r, 100 * (x - a)
    if (t != "" && y != "") printf ", %.2fx faster to the target", t / y
    printf "\n" }'
done
exit $rc
