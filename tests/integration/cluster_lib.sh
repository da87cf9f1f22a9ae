# tests/integration/cluster_lib.sh: start real traind processes on loopback,
# each with its own data dir, ephemeral port and control socket, and drive
# them with trainctl. Every process is killed when the test exits; logs are
# printed only when the test fails. Nodes are secure (CURVE) as by default:
# start_node admits every test node's key on every other one, as admins (the
# test may start and stop runs anywhere), and `ctl NAME join ENDPOINT` adds
# the key of the test node at ENDPOINT, so tests exercise the secure path
# without saying so. A node started with --insecure is left out of that.
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
    # TD_TEST_KEEP=DIR: the whole logs and data dirs of a failed test are kept there
    [ -n "${TD_TEST_KEEP:-}" ] && mkdir -p "$TD_TEST_KEEP" && cp -r "$T"/. "$TD_TEST_KEEP"/ 2>/dev/null
  fi
  rm -rf "$T"
}
trap cleanup_nodes EXIT

# start_node NAME [TRAIND ARGS...]: traind in the background (heartbeats every
# HEARTBEAT_MS, 200 unless set: a peer silent for 6 of them is dead); waits for its
# control socket.
start_node() {
  local name=$1
  shift
  mkdir -p "$T/$name"
  "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms "${HEARTBEAT_MS:-200}" --threads 1 --log-level info "$@" >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  case " ${NODES[*]} " in *" $name "*) ;; *) NODES+=("$name") ;; esac
  local i
  for i in $(seq 100); do
    if [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ]; then
      case " $* " in *" --insecure "*) return 0 ;; esac
      admit_all "$name"
      return 0
    fi
    sleep 0.1
  done
  fail "$name did not start"; cat "$T/$name.log"; return 1
}

key_of() { cat "$T/$1/node.pub"; }

# admit_all NAME: NAME and every other running test node admit each other's
# keys, as admins.
admit_all() {
  local name=$1 other
  for other in "${NODES[@]}"; do
    [ "$other" = "$name" ] && continue
    kill -0 "$(cat "$T/$other.pid")" 2>/dev/null || continue
    [ -s "$T/$other/node.pub" ] || continue
    ctl "$other" allow --admin "$(key_of "$name")" >/dev/null 2>&1 || true
    ctl "$name" allow --admin "$(key_of "$other")" >/dev/null 2>&1 || true
  done
}

endpoint_of() { cat "$T/$1/endpoint"; }
# ctl NAME ARGS...: trainctl on NAME's control socket; `join ENDPOINT` of a
# test node gets that node's key.
ctl() {
  local name=$1 other
  shift
  if [ "$#" -eq 2 ] && [ "$1" = join ]; then
    for other in "${NODES[@]}"; do
      if [ -s "$T/$other/endpoint" ] && [ "$(cat "$T/$other/endpoint")" = "$2" ] &&
         [ -s "$T/$other/node.pub" ]; then
        set -- join "$2" "$(key_of "$other")"
        break
      fi
    done
  fi
  "$TRAINCTL" --socket "$T/$name/ctl" "$@"
}

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

# wait_ended NAME SECONDS: the node's run is finished, failed or stopped
wait_ended() {
  local i s
  for i in $(seq $(($2 * 5))); do
    s=$(ctl "$1" status --json 2>/dev/null) || true
    case "$s" in *'"state":"finished"'* | *'"state":"failed"'* | *'"state":"stopped"'*) return 0 ;; esac
    sleep 0.2
  done
  return 1
}
