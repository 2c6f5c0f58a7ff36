#!/usr/bin/env bash
# Builds clb-test-apiserver (etcd + kube-apiserver in one process, see README.md) into a cache
# outside the clone and prints the binary's path on stdout. The binary is named after a hash of
# the sources (go.mod, go.sum, *.go, this script), so a fresh clone of the same sources builds
# nothing, and clones with different sources do not overwrite each other's binary.
# Environment: see ../go-env.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../go-env.sh"
hash="$(cd "$here" && cat go.mod go.sum ./*.go build.sh | sha256sum | cut -c1-16)"
bin="$cache/bin/clb-test-apiserver-$hash"

if needs_build clb-test-apiserver "$bin"; then
  # What /version reports (a plain `go build` says v0.0.0-master).
  k8s="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")"
  minor="${k8s#v1.}"; minor="${minor%%.*}"
  ldflags="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$here" && nice go build -ldflags "$ldflags" -o "$bin.tmp.$$" .)
  mv -f "$bin.tmp.$$" "$bin"
  built "$bin"
  # Binaries of other sources unused for two weeks go (150 MB each).
  find "$cache/bin" -maxdepth 1 -name 'clb-test-apiserver-*' ! -name "*-$hash" -atime +14 -delete 2>/dev/null || true
fi
ln -sfn "$(basename "$bin")" "$cache/bin/clb-test-apiserver" # for people: the latest one built
echo "$bin"
