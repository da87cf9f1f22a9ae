# tests/integration/cluster_lib.sh: start real traind processes on loopback,
# each with its own data dir, ephemeral port and control socket, and drive
# them with trainctl. Every process is killed when the test exits; logs are
# printed only when the test fails.
. "${top_srcdir:-.}/tests/integration/lib.sh"
TRAINCTL="${top_builddir:-$(pwd)}/trainctl"
NODES=()

cleanup_nodes() {
  local name
  for name in "${NODES[@]}"; do
    [ -f "$T/$name.pid" ] && kill -9 "$(cat "$T/$name.pid")" 2>/dev/null
  done
  if [ "$failures" -gt 0 ]; then
    for name in "${NODES[@]}"; do echo "----- log of $name"; tail -n 40 "$T/$name.log"; done
  fi
  rm -rf "$T"
}
trap cleanup_nodes EXIT

# start_node NAME [TRAIND ARGS...]: traind in the background; waits for its
# control socket.
start_node() {
  local name=$1
  shift
  mkdir -p "$T/$name"
  "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info "$@" >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  case " ${NODES[*]} " in *" $name "*) ;; *) NODES+=("$name") ;; esac
  local i
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"; cat "$T/$name.log"; return 1
}

endpoint_of() { cat "$T/$1/endpoint"; }
ctl() { local name=$1; shift; "$TRAINCTL" --socket "$T/$name/ctl" "$@"; }

# json_field JSON KEY: the first value of "KEY": in a flat JSON text.
json_field() { sed -E "s/.*\"$2\":(\"[^\"]*\"|[^,}]*).*/\1/" <<<"$1" | tr -d '"'; }

# wait_run_state NAME STATE SECONDS
wait_run_state() {
  local name=$1 want=$2 secs=$3 i s
  for i in $(seq $((secs * 5))); do
    s=$(ctl "$name" status --json 2>/dev/null) || true
    case "$s" in *"\"state\":\"$want\""*) return 0 ;; esac
    sleep 0.2
  done
  return 1
}

# wait_peers NAME COUNT SECONDS: NAME sees COUNT alive peers
wait_peers() {
  local name=$1 want=$2 secs=$3 i n
  for i in $(seq $((secs * 5))); do
    n=$(ctl "$name" peers --json 2>/dev/null | grep -o '"state":"alive"' | wc -l)
    [ "$n" -eq "$want" ] && return 0
    sleep 0.2
  done
  return 1
}

sql() { sqlite3 "$T/$1/traind.db" "$2"; }
