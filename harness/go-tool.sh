#!/usr/bin/env bash
# go-tool.sh NAME PACKAGE VERSION: builds a Go command (`go install PACKAGE@VERSION`, from the Go
# module proxy) into the cache as bin/NAME-VERSION and prints its path on stdout; a second call
# builds nothing. The tests call it through the tools' own scripts (cosign/build.sh,
# kustomize/build.sh), and .ci/run too, so that `cargo test --release` needs nothing installed by
# hand but Go. Environment: see go-env.sh.
set -euo pipefail
name="$1" package="$2" version="$3"
source "$(dirname "${BASH_SOURCE[0]}")/go-env.sh"
bin="$cache/bin/$name-$version"
if needs_build "$name" "$bin"; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
  GOBIN="$out" nice go install "$package@$version"
  # go install names the command after the package's last element, or the one before a major
  # version's (kustomize/v5 is kustomize).
  command="$(basename "$package")"
  [[ "$command" =~ ^v[0-9]+$ ]] && command="$(basename "$(dirname "$package")")"
  mv -f "$out/$command" "$bin"
  built "$bin"
fi
echo "$bin"
