# Sourced by the harness's Go builds (apiserver/build.sh, go-tool.sh): where Go keeps its modules
# and its build cache, and that Go is there. Builds go to a cache outside the clone, so a fresh
# clone of the same sources builds nothing.
#   CLB_CACHE             cache root (default ${XDG_CACHE_HOME:-~/.cache}/clb-reconciler, the user's
#                         own; CI sets /var/cache/clb-reconciler): bin/, go/mod, go/build
#   GOMODCACHE, GOCACHE   default to $CLB_CACHE/go/mod and $CLB_CACHE/go/build
cache="${CLB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clb-reconciler}"
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}" GOCACHE="${GOCACHE:-$cache/go/build}"
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"
if ! command -v go >/dev/null; then
  echo "$(basename "$0"): Go (>= 1.24) is needed for this build and is not on PATH" >&2
  exit 1
fi

# needs_build NAME BIN: takes the lock of NAME's builds (several test binaries or clones may ask
# at once; held until the script exits) and succeeds when BIN is still to be built, saying so.
# built BIN: says how long the build took.
needs_build() {
  exec 9>"$cache/bin/.$1.lock"
  flock 9
  [[ -x "$2" ]] && return 1
  echo "building $2 (the first build downloads and compiles $1: minutes)" >&2
  build_started=$(date +%s)
}
built() {
  echo "built $1 in $(( $(date +%s) - build_started ))s" >&2
}
