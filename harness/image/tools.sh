#!/usr/bin/env bash
# Makes sure the tools that build, run and ship the controller's image are installed: Debian's
# buildah (builds the image from deploy/Containerfile as root without a daemon), skopeo
# (inspects and copies images between registries), docker-registry (the CNCF distribution
# registry, served on loopback by the image test), musl-tools (musl-gcc, for the C parts of the
# static build: ring, zstd), openssl (the signature tests' second kind of key pair) and the Rust
# target x86_64-unknown-linux-musl. The image test
# (tests/it/image.rs) and deploy/image.sh call this, and .ci/run too, so `cargo test --release`
# passes on a machine where nothing was installed by hand.
#
# The install (root or passwordless sudo; the pinned versions, or the archive's candidate where
# Debian no longer serves one) is harness/apt-pinned.sh's. The versions are pinned to those the
# image test was written against (bump them with it).
set -euo pipefail
cd "$(dirname "$0")/../.."

pins=(
  "buildah=1.28.2+ds1-3+deb12u1+b3"
  "skopeo=1.9.3+ds1-1+b10"
  "docker-registry=2.8.2+ds1-1"
  "musl-tools=1.2.3-1"
  "openssl=3.0.19-1~deb12u2"
)
# The command each package puts on PATH.
declare -A command_of=([buildah]=buildah [skopeo]=skopeo [docker-registry]=docker-registry [musl-tools]=musl-gcc [openssl]=openssl)

missing=()
for pin in "${pins[@]}"; do
  package="${pin%%=*}"
  command -v "${command_of[$package]}" >/dev/null || missing+=("$pin")
done

if [ "${#missing[@]}" -gt 0 ]; then
  bash harness/apt-pinned.sh "the controller's image" "${missing[@]}"
fi

# The static build's target, for the toolchain rust-toolchain.toml pins.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
  rustup target add x86_64-unknown-linux-musl >&2
fi
