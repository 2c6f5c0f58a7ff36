#!/usr/bin/env bash
# The rustc wrapper of the fuzz build (fuzz/.cargo/config.toml): cargo-fuzz puts its coverage
# instrumentation, and one codegen unit per crate, in RUSTFLAGS, which cargo applies to every
# crate. Instrumenting wasmtime, cranelift and k8s-openapi made a cold build take over 25 minutes
# and adds edges libFuzzer cannot steer by, so only the crates of this checkout (the guest, the
# host's crates, the fuzz crates) keep those flags; every other crate is built without them. Sanitizer
# flags (-Zsanitizer) and `--cfg fuzzing` stay on every crate: mixing sanitized and unsanitized
# crates is refused by rustc.
#
#   rustc-wrapper.sh RUSTC ARGS...   (cargo's calling convention)
set -euo pipefail
rustc=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What to drop: `coverage` (the instrumentation) and/or `units` (the single codegen unit, which
# only buys speed through inlining; the host's crates are large and their speed matters little to
# any target, so they keep their coverage and are compiled in parallel).
drop=
case "${CARGO_MANIFEST_DIR:-}" in
  "$root/host" | "$root"/crates/*) drop=units ;;
  "$root" | "$root"/*) exec "$rustc" "$@" ;;
  *) drop="coverage units" ;;
esac
dropped() {
  case "$1" in
    passes=sancov-module | llvm-args=-sanitizer-coverage* | llvm-args=-simplifycfg-branch-fold-threshold=*)
      [[ $drop == *coverage* ]] ;;
    codegen-units=1) [[ $drop == *units* ]] ;;
    *) false ;;
  esac
}
args=()
split=
for arg in "$@"; do
  if [ -n "$split" ]; then
    split=
    dropped "$arg" || args+=(-C "$arg")
  elif [ "$arg" = -C ]; then
    split=1
  elif [[ $arg == -C* ]]; then
    dropped "${arg#-C}" || args+=("$arg")
  else
    args+=("$arg")
  fi
done
exec "$rustc" "${args[@]}"
