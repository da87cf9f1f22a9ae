# tests/integration/netns_lib.sh: a small emulated WAN for tests and benches.
# Source it (bash), then:
#
#   td_wan_can_run || exit 77                  # root, netns, veth, bridge, tbf?
#   trap td_wan_teardown EXIT                  # (chain with your own trap)
#   td_wan_setup "$(td_wan_prefix)" 20 2       # node 0: 20 Mbit/s up, node 1: 2
#   td_wan_exec 1 "$TRAIND" --listen "tcp://$(td_wan_ip 1):0" ... &
#
# Topology. Every node N (0..k-1) is a network namespace "${PREFIX}N" with
# loopback up and one interface "wan" (10.R.0.(N+1)/24). Its peer end "pN"
# is a port of the bridge "${PREFIX}br", which lives in a namespace of its
# own, "${PREFIX}h" (the hub), not in the root namespace: nothing is added to
# the host's interfaces, routes or firewall, so the bed does not depend on
# (or disturb) the host's bridge netfilter (bridge-nf-call-iptables = 1 with
# a DROP forward policy, as Docker installs, would otherwise eat the bridged
# frames), rp_filter or ip_forward; none of these matter inside the hub,
# which only switches frames at L2 and has no iptables rules. Because each
# run has its own namespaces, two runs at once cannot collide on addresses;
# R (TD_WAN_SUBNET, default a hash of PREFIX in 16..239) only keeps logs
# from different runs apart. IPv6 is switched off in the node namespaces so
# that router solicitations and DAD do not add noise to the counters.
# Processes in the root namespace reach a node's control socket (a unix
# socket: a path in the file system, which namespaces share), not its IP:
# run IP clients with td_wan_exec.
#
# Rates. A node's UPLINK (the RATEn given to td_wan_setup, in Mbit/s, decimals
# allowed) is a tbf qdisc on the egress of "wan" inside the node namespace;
# its DOWNLINK (td_wan_shape N down RATE, off by default) is the same qdisc on
# the egress of "pN" in the hub, i.e. on the frames the bridge delivers to N.
# tbf meters whole Ethernet frames (14-byte header included, no preamble/FCS),
# so TCP goodput is at most about 1448/1514 = 95.6% of the rate (measured:
# 1.918 of 2 and 19.13 of 20 Mbit/s). The burst is max(8 KiB, 5 ms at the
# rate) and the queue holds up to 250 ms at the rate (at least 64 KiB), a
# modest "home router" buffer: a latency-sensitive packet queued behind a
# bulk transfer waits up to that long, as on a real uplink (measured: ~250 ms
# during slow start, ~12 ms once BBR settles). GSO is off on "wan"
# (gso_max_segs 1), so the node hands tbf single frames: when the queue is
# full tbf refuses a whole frame and TCP backs off locally (tbf's "dropped"
# counter grows, TCP retransmits nothing), instead of taking the head of a
# 64 KiB super-packet and dropping its tail. Sender and shaper share one
# kernel, so there is no loss on the "wire": the bed models capacity and
# queueing, not a lossy path.
#
# Latency. This kernel has no netem (nor fq, fq_codel, sfq: only tbf, htb,
# pfifo/bfifo and the defaults were found), so the bed cannot add propagation
# delay, jitter or loss in the kernel; the queueing delay above is the only
# delay it creates. Per-link delay is the daemon's job (a user-space option
# that holds each outgoing message for the configured time), so tests that
# need a long fat pipe combine a rate from here with that option.
#
# Names (PREFIX: 1-12 of [a-z0-9], a letter last; td_wan_prefix: "tw<pid>x"):
#   ${PREFIX}N   node namespaces         wan      node-side veth (in ${PREFIX}N)
#   ${PREFIX}h   hub namespace           pN       hub-side veth (in ${PREFIX}h)
#   ${PREFIX}br  the bridge (in the hub)
# Everything created is recorded in TD_WAN_NAMESPACES (hub last); deleting a
# namespace destroys its interfaces, qdiscs and the veth pairs with them, so
# td_wan_teardown only has to kill what runs inside and delete namespaces.
# td_wan_sweep removes namespaces left by a run that was killed -9 (pattern
# tw<pid>x*, owner pid gone).

TD_WAN_PREFIX=
TD_WAN__SUBNET_SET=${TD_WAN_SUBNET:-}   # the caller's choice, if any
TD_WAN_SUBNET=
TD_WAN_NAMESPACES=()   # everything to delete, in order (hub last)
TD_WAN_NODES=0         # k
TD_WAN_UP=()           # configured uplink rate of node N, Mbit/s ("" = unshaped)
TD_WAN_DOWN=()         # configured downlink rate of node N

td_wan__err() { echo "td_wan: $*" >&2; }

# td_wan_can_run: 0 if this process can build the bed, else one line on
# stderr saying why and 1. TD_WAN_FORCE_SKIP=1 forces the "no" answer.
td_wan_can_run() {
  if [ -n "${TD_WAN_FORCE_SKIP:-}" ] && [ "${TD_WAN_FORCE_SKIP}" != 0 ]; then
    td_wan__err "skipped: TD_WAN_FORCE_SKIP=$TD_WAN_FORCE_SKIP"; return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then td_wan__err "skipped: needs root (uid $(id -u))"; return 1; fi
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    td_wan__err "skipped: needs ip and tc (Debian package iproute2)"; return 1
  fi
  local p="twc$$x$((RANDOM % 100))" why=
  if ! ip netns add "${p}a" 2>/dev/null; then why="cannot create a network namespace"
  elif ! ip netns add "${p}b" 2>/dev/null; then why="cannot create a second network namespace"
  elif ! ip -n "${p}b" link add name br0 type bridge 2>/dev/null; then why="cannot create a bridge"
  elif ! ip -n "${p}b" link add name p0 type veth peer name wan netns "${p}a" 2>/dev/null; then
    why="cannot create a veth pair across namespaces"
  elif ! ip -n "${p}b" link set p0 master br0 2>/dev/null; then why="cannot add a port to a bridge"
  elif ! ip -n "${p}a" link set wan up 2>/dev/null; then why="cannot bring an interface up"
  elif ! tc -n "${p}a" qdisc add dev wan root handle 1: tbf rate 2mbit burst 8kb limit 64kb 2>/dev/null
  then why="cannot install a tbf qdisc (sch_tbf missing?)"
  fi
  ip netns del "${p}a" 2>/dev/null
  ip netns del "${p}b" 2>/dev/null
  if [ -n "$why" ]; then td_wan__err "skipped: $why"; return 1; fi
  return 0
}

# td_wan_prefix: a prefix unique to this shell (pid) that td_wan_sweep knows.
td_wan_prefix() { echo "tw$$x"; }

# td_wan_setup PREFIX RATE0 [RATE1 ...]: k = number of rates nodes, RATEn =
# uplink of node n in Mbit/s ("0" or "-": unshaped). Returns 1 (after undoing
# what it made) on any error. One bed per shell at a time.
td_wan_setup() {
  local prefix=$1; shift
  # ends with a letter: "ab1"+"1" and "ab"+"11" must not both be "ab11"
  if ! [[ $prefix =~ ^[a-z0-9]{0,11}[a-z]$ ]]; then
    td_wan__err "bad prefix '$prefix' (1-12 characters a-z0-9, a letter last)"; return 1
  fi
  if [ $# -lt 1 ] || [ $# -gt 250 ]; then td_wan__err "td_wan_setup: 1 to 250 rates"; return 1; fi
  if [ -n "$TD_WAN_PREFIX" ]; then td_wan__err "a bed ($TD_WAN_PREFIX) is already set up"; return 1; fi
  TD_WAN_PREFIX=$prefix
  TD_WAN_SUBNET=${TD_WAN__SUBNET_SET:-$(( 16 + $(printf '%s' "$prefix" | cksum | cut -d' ' -f1) % 224 ))}
  TD_WAN_NODES=$#
  TD_WAN_UP=(); TD_WAN_DOWN=()
  local hub="${prefix}h" n ns
  ip netns add "$hub" || { td_wan__err "cannot create namespace $hub"; td_wan_teardown; return 1; }
  TD_WAN_NAMESPACES=("$hub")
  td_wan__no_ipv6 "$hub"
  {
    ip -n "$hub" link set lo up &&
    ip -n "$hub" link add name "${prefix}br" type bridge stp_state 0 forward_delay 0 &&
    ip -n "$hub" link set "${prefix}br" up
  } || { td_wan__err "cannot create bridge ${prefix}br"; td_wan_teardown; return 1; }
  for ((n = 0; n < TD_WAN_NODES; n++)); do
    ns="${prefix}$n"
    ip netns add "$ns" || { td_wan__err "cannot create namespace $ns"; td_wan_teardown; return 1; }
    # keep the hub last so that teardown deletes nodes first
    TD_WAN_NAMESPACES=("${TD_WAN_NAMESPACES[@]:0:${#TD_WAN_NAMESPACES[@]}-1}" "$ns" "$hub")
    td_wan__no_ipv6 "$ns"
    {
      ip -n "$ns" link set lo up &&
      ip -n "$hub" link add name "p$n" type veth peer name wan netns "$ns" &&
      ip -n "$hub" link set "p$n" master "${prefix}br" &&
      ip -n "$hub" link set "p$n" up &&
      ip -n "$ns" addr add "$(td_wan_ip "$n")/24" dev wan &&
      ip -n "$ns" link set wan up
    } || { td_wan__err "cannot wire node $n"; td_wan_teardown; return 1; }
    # no GSO super-packets out of the node (best effort, kernel >= 5.19?):
    # a full tbf then refuses whole frames (TCP backs off locally) instead
    # of accepting the head of a 64 KiB packet and dropping its tail (which
    # TCP would have to retransmit); harmless at these rates
    ip -n "$ns" link set dev wan gso_max_segs 1 2>/dev/null
    TD_WAN_UP[n]=; TD_WAN_DOWN[n]=
    td_wan_shape "$n" up "$1" || { td_wan_teardown; return 1; }
    shift
  done
  return 0
}

# td_wan_shape NODE up|down RATE: (re)shape NODE's uplink or downlink to RATE
# Mbit/s ("0" or "-": remove the shaper). Works mid-run (tc replace).
td_wan_shape() {
  local n=$1 dir=$2 rate=$3 ns dev
  td_wan__node_ok "$n" || return 1
  case "$dir" in
    up) ns="${TD_WAN_PREFIX}$n" dev=wan ;;
    down) ns="${TD_WAN_PREFIX}h" dev="p$n" ;;
    *) td_wan__err "td_wan_shape: direction '$dir' (up or down)"; return 1 ;;
  esac
  if [ "$rate" = 0 ] || [ "$rate" = - ]; then
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
    rate=
  else
    if ! [[ $rate =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
      td_wan__err "bad rate '$rate' (Mbit/s, e.g. 20 or 2.5)"; return 1
    fi
    # bytes: burst = max(8 KiB, 5 ms at rate); queue = max(64 KiB, 250 ms at rate)
    local bps burst limit
    bps=$(awk -v r="$rate" 'BEGIN { printf "%d", r * 1000000 / 8 }')
    burst=$(( bps / 200 > 8192 ? bps / 200 : 8192 ))
    limit=$(( bps / 4 > 65536 ? bps / 4 : 65536 ))
    if ! tc -n "$ns" qdisc replace dev "$dev" root handle 1: \
         tbf rate "${rate}mbit" burst "$burst" limit "$limit"; then
      td_wan__err "cannot shape node $n $dir to $rate Mbit/s"; return 1
    fi
  fi
  if [ "$dir" = up ]; then TD_WAN_UP[n]=$rate; else TD_WAN_DOWN[n]=$rate; fi
}

# before the namespace gets interfaces: no IPv6 (no RS, DAD, MLD noise)
td_wan__no_ipv6() {
  ip netns exec "$1" sh -c 'for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 \
    /proc/sys/net/ipv6/conf/default/disable_ipv6; do [ -w $f ] && echo 1 >$f; done; :'
}

td_wan__node_ok() {
  if [ -z "$TD_WAN_PREFIX" ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -ge "$TD_WAN_NODES" ]; then
    td_wan__err "no node '$1' (bed ${TD_WAN_PREFIX:-not set up}, $TD_WAN_NODES nodes)"; return 1
  fi
}

# td_wan_ns NODE: the namespace name. td_wan_ip NODE: the node's address.
td_wan_ns() { td_wan__node_ok "$1" && echo "${TD_WAN_PREFIX}$1"; }
td_wan_ip() { echo "10.${TD_WAN_SUBNET}.0.$(($1 + 1))"; }

# td_wan_exec NODE CMD...: run CMD inside NODE's namespace, in the
# foreground (`td_wan_exec N cmd &` works, but $! is then a subshell's pid).
td_wan_exec() {
  local n=$1; shift
  td_wan__node_ok "$n" || return 127
  ip netns exec "${TD_WAN_PREFIX}$n" "$@"
}

# td_wan_spawn NODE LOG CMD...: start CMD in the background inside NODE's
# namespace, stdout and stderr appended to LOG; TD_WAN_PID = CMD's own pid
# (ip netns exec execs it), for kill/wait. td_wan_teardown kills it anyway.
TD_WAN_PID=
td_wan_spawn() {
  local n=$1 log=$2; shift 2
  td_wan__node_ok "$n" || return 127
  ip netns exec "${TD_WAN_PREFIX}$n" "$@" >>"$log" 2>&1 &
  TD_WAN_PID=$!
}

# td_wan_rate NODE [up|down]: the configured rate in Mbit/s ("" = unshaped).
td_wan_rate() {
  td_wan__node_ok "$1" || return 1
  if [ "${2:-up}" = down ]; then echo "${TD_WAN_DOWN[$1]}"; else echo "${TD_WAN_UP[$1]}"; fi
}

# td_wan_qdisc NODE [up|down]: `tc -s qdisc show` of the shaped interface.
td_wan_qdisc() {
  td_wan__node_ok "$1" || return 1
  if [ "${2:-up}" = down ]; then tc -n "${TD_WAN_PREFIX}h" -s qdisc show dev "p$1"
  else tc -n "${TD_WAN_PREFIX}$1" -s qdisc show dev wan; fi
}

# td_wan_sent_bytes NODE [up|down]: the shaper's "Sent N bytes" counter (bytes
# that left through the tbf; 0 if the link is unshaped).
td_wan_sent_bytes() {
  local out
  out=$(td_wan_qdisc "$@") || return 1
  awk '/^qdisc tbf/ { t = 1 } t && /Sent [0-9]+ bytes/ { print $2; f = 1; exit }
       END { if (!f) print 0 }' <<<"$out"
}

# td_wan_tc_rate NODE [up|down]: the rate the installed tbf really has, in
# bit/s, parsed from `tc qdisc show` ("rate 2Mbit", "2500Kbit", ...; tc's
# units are powers of 1000); empty if no tbf is installed.
td_wan_tc_rate() {
  local out
  out=$(td_wan_qdisc "$@") || return 1
  awk '/^qdisc tbf/ { for (i = 1; i < NF; i++) if ($i == "rate") {
         v = $(i + 1); n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
         m = u == "bit" ? 1 : u == "Kbit" ? 1e3 : u == "Mbit" ? 1e6 : u == "Gbit" ? 1e9 : u == "Tbit" ? 1e12 : -1
         if (m > 0) printf "%.0f\n", n * m; exit } }' <<<"$out"
}

# td_wan_teardown: kill every process inside the bed's namespaces, delete
# them (and with them the veths, bridge and qdiscs). Idempotent; safe in an
# EXIT trap; never fails.
td_wan_teardown() { td_wan__teardown 2>/dev/null; return 0; }
td_wan__teardown() {
  local ns pids all='' i
  [ ${#TD_WAN_NAMESPACES[@]} -eq 0 ] && { TD_WAN_PREFIX=; return 0; }
  for ns in "${TD_WAN_NAMESPACES[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    all="$all $pids"
  done
  for ns in "${TD_WAN_NAMESPACES[@]}"; do
    for i in 1 2 3 4 5 6 7 8 9 10; do   # dying processes first, up to 1 s
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null
  done
  # reap the dead that were our children (td_wan_spawn) quietly, without
  # bash's "Killed" notices (wait on a non-child returns at once)
  for i in $all; do
    grep -qs '^State:[[:space:]]*Z' "/proc/$i/status" && wait "$i"
  done
  TD_WAN_NAMESPACES=(); TD_WAN_PREFIX=; TD_WAN_SUBNET=; TD_WAN_NODES=0
  TD_WAN_UP=(); TD_WAN_DOWN=()
  return 0
}

# td_wan_sweep: delete namespaces named tw<pid>x* (td_wan_prefix) and
# twc<pid>x* (td_wan_can_run) whose creating shell is gone, killing what
# runs in them. For beds left by a test that was killed -9.
td_wan_sweep() {
  local ns pid pids
  for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1); do
    [[ $ns =~ ^twc?([0-9]+)x ]] || continue
    pid=${BASH_REMATCH[1]}
    kill -0 "$pid" 2>/dev/null && continue
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}
