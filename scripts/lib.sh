# scripts/lib.sh: shared by scripts/demo and scripts/test. Installs what is
# missing with apt-get (idempotent: nothing is installed twice) and builds the
# tree out of source in build/ (override with TRAIND_BUILD_DIR).
set -euo pipefail

TD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TD_BUILD=${TRAIND_BUILD_DIR:-$TD_ROOT/build}

TD_PACKAGES=(
  build-essential autoconf automake libtool pkg-config
  libuv1-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libsqlite3-dev
  libopenblas-dev zlib1g-dev libinih-dev libjson-c-dev libsodium-dev libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev check
  sqlite3 iproute2 procps dataset-fashion-mnist fortunes-min fortunes gnuplot-nox prometheus valgrind
  curl universal-ctags python3 python3-numpy python3-onnx
)

td_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

td_install_deps() {
  local missing=() p
  for p in "${TD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    td_log "dependencies: all ${#TD_PACKAGES[@]} packages present"
    return 0
  fi
  td_log "installing: ${missing[*]}"
  local sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# td_build [configure flags...]: autoreconf when needed, configure when the
# flags changed, then make.
td_build() {
  cd "$TD_ROOT"
  if [ ! -x configure ] || [ configure.ac -nt configure ]; then
    td_log "autoreconf"
    autoreconf -fi >/dev/null
  fi
  mkdir -p "$TD_BUILD"
  local flags="$*"
  if [ ! -f "$TD_BUILD/Makefile" ] || [ "$(cat "$TD_BUILD/.td-flags" 2>/dev/null)" != "$flags" ] \
     || [ configure -nt "$TD_BUILD/Makefile" ]; then
    td_log "configure $flags"
    (cd "$TD_BUILD" && "$TD_ROOT/configure" $flags >/dev/null)
    printf '%s' "$flags" > "$TD_BUILD/.td-flags"
  fi
  td_log "make"
  make -C "$TD_BUILD" -j"$(nproc)" >/dev/null
}
