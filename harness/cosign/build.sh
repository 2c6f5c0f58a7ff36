#!/usr/bin/env bash
# Builds the real cosign CLI (sigstore's, pinned below) from the Go module proxy into a cache
# outside the clone and prints the binary's path on stdout; a second call builds nothing. The
# signature tests (tests/it/signatures.rs) call it, and .ci/run too, so that `cargo test
# --release` needs nothing installed by hand but Go.
# Environment: CLB_CACHE, GOMODCACHE, GOCACHE as harness/apiserver/build.sh reads them.
set -euo pipefail
version="v2.6.5"
cache="${CLB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clb-reconciler}"
export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}" GOCACHE="${GOCACHE:-$cache/go/build}"
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"

if ! command -v go >/dev/null; then
  echo "build.sh: Go is needed to build cosign and is not on PATH" >&2
  exit 1
fi
bin="$cache/bin/cosign-$version"
exec 9>"$cache/bin/.cosign.lock"
flock 9
if [[ ! -x "$bin" ]]; then
  echo "building $bin (the first build downloads and compiles cosign: minutes)" >&2
  start=$(date +%s)
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
  GOBIN="$out" nice go install "github.com/sigstore/cosign/v2/cmd/cosign@$version"
  mv -f "$out/cosign" "$bin"
  echo "built $bin in $(( $(date +%s) - start ))s" >&2
fi
echo "$bin"
