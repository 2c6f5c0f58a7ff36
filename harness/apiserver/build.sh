#!/usr/bin/env bash
# Builds clb-test-apiserver (etcd + kube-apiserver in one process, see README.md) into a cache
# outside the clone and prints the binary's path on stdout. The binary is named after a hash of
# the sources (go.mod, go.sum, *.go, this script), so a fresh clone of the same sources builds
# nothing, and clones with different sources do not overwrite each other's binary.
# Environment:
#   CLB_CACHE             cache root (default ${XDG_CACHE_HOME:-~/.cache}/clb-reconciler, the user's
#                         own; CI sets /var/cache/clb-reconciler): bin/, go/mod, go/build
#   GOMODCACHE, GOCACHE   default to $CLB_CACHE/go/mod and $CLB_CACHE/go/build
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CLB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clb-reconciler}"
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}" GOCACHE="${GOCACHE:-$cache/go/build}"
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"

if ! command -v go >/dev/null; then
  echo "build.sh: Go (>= 1.24) is needed to build the test API server and is not on PATH" >&2
  exit 1
fi
hash="$(cd "$here" && cat go.mod go.sum ./*.go build.sh | sha256sum | cut -c1-16)"
bin="$cache/bin/clb-test-apiserver-$hash"

# One build at a time (several test binaries or clones may ask at once).
exec 9>"$cache/bin/.clb-test-apiserver.lock"
flock 9
if [[ ! -x "$bin" ]]; then
  echo "building $bin (the first build downloads and compiles kube-apiserver: minutes)" >&2
  start=$(date +%s)
  # What /version reports (a plain `go build` says v0.0.0-master).
  k8s="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")"
  minor="${k8s#v1.}"; minor="${minor%%.*}"
  ldflags="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$here" && nice go build -ldflags "$ldflags" -o "$bin.tmp.$$" .)
  mv -f "$bin.tmp.$$" "$bin"
  echo "built $bin in $(( $(date +%s) - start ))s" >&2
  # Binaries of other sources unused for two weeks go (150 MB each).
  find "$cache/bin" -maxdepth 1 -name 'clb-test-apiserver-*' ! -name "*-$hash" -atime +14 -delete 2>/dev/null || true
fi
ln -sfn "$(basename "$bin")" "$cache/bin/clb-test-apiserver" # for people: the latest one built
echo "$bin"
