#!/usr/bin/env bash
# Builds the controller's image: `clb-host` as a static binary (x86_64-unknown-linux-musl; the
# guest component is built into it) in an image FROM scratch with CA certificates and the
# non-root user 65532 (deploy/Containerfile), labelled with the source, revision and version.
#
#   deploy/image.sh [NAME:TAG]        (default clb-reconciler:<version>)
#
# Prints the image's name and its ID (sha256) on stdout, the rest on stderr. The image is built
# with buildah as root, without a daemon (--isolation chroot, --storage-driver vfs); it lands in
# buildah's default storage, or in CLB_BUILDAH_ROOT when that is set (the image test keeps its
# own). Its timestamps are the commit's, so the same commit builds the same layers. Push it with
# `buildah push NAME:TAG docker://REGISTRY/NAME:TAG`. The tools come from harness/image/tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

bash harness/image/tools.sh

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository *= *"\(.*\)"/\1/p' Cargo.toml)
name="${1:-clb-reconciler:$version}"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time makes the build reproducible; outside a checkout, now.
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

target=x86_64-unknown-linux-musl
echo "image.sh: building clb-host for $target (static)" >&2
cargo build --release --locked --target "$target" -p clb-host >&2
binary="${CARGO_TARGET_DIR:-target}/$target/release/clb-host"
if ! ldd "$binary" 2>&1 | grep -q "not a dynamic executable\|statically linked"; then
  echo "image.sh: $binary is not static: $(ldd "$binary" 2>&1 | head -3)" >&2
  exit 1
fi

certs=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$certs" ]; then
  echo "image.sh: no CA bundle at $certs (Debian's ca-certificates package puts it there)" >&2
  exit 1
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$binary" "$context/clb-host"
# Debug symbols are not shipped: the image's size is what every node pulls.
strip "$context/clb-host"
cp "$certs" "$context/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$context/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$context/group"

storage=(--storage-driver vfs)
if [ -n "${CLB_BUILDAH_ROOT:-}" ]; then
  storage+=(--root "$CLB_BUILDAH_ROOT/root" --runroot "$CLB_BUILDAH_ROOT/runroot")
fi
echo "image.sh: building $name with buildah" >&2
buildah "${storage[@]}" bud --isolation chroot --timestamp "$epoch" --layers=false -q \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" --build-arg "CREATED=$created" \
  -f deploy/Containerfile -t "$name" "$context" >&2
id=$(buildah "${storage[@]}" images --no-trunc --format '{{.ID}}' "$name" | head -1)
echo "$name $id"
