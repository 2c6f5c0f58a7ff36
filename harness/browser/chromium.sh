#!/usr/bin/env bash
# Makes sure Debian's `chromium` is installed and prints its path on stdout: the operator page's
# test (tests/it/page.rs) calls this before it starts the browser, and .ci/run calls it too, so
# `cargo test --release` passes on a machine where nothing was installed by hand.
#
# Installing needs root, or sudo without a password; otherwise this fails with what to run.
# The version is pinned to the one the page test was written against (bump it with the test).
# Debian's security archive keeps only its newest build: where the pinned one is no longer
# served, the archive's candidate is installed and this says so on stderr.
set -euo pipefail
pinned="156.0.8078.114-1~deb12u1"

if path="$(command -v chromium)"; then
  echo "$path"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "chromium.sh: chromium is not on PATH and this is not a Debian-based machine (no apt-get): install a Chromium that runs as \`chromium --headless\`" >&2
  exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "chromium.sh: chromium is not on PATH and installing it needs root: run \`sudo apt-get install -y chromium=$pinned\` (or as root: bash $0)" >&2
    exit 1
  fi
fi

# One install at a time (several test binaries may ask at once).
lock="${TMPDIR:-/tmp}/clb-reconciler-chromium.lock"
exec 9>"$lock"
flock 9
if ! command -v chromium >/dev/null; then
  echo "chromium.sh: installing Debian's chromium (pinned $pinned) for the operator page's test" >&2
  apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Dpkg::Use-Pty=0)
  "${apt[@]}" update >&2
  version="$pinned"
  if ! apt-cache madison chromium | awk -F'|' '{gsub(/ /, "", $2); print $2}' | grep -qxF "$pinned"; then
    version="$(apt-cache policy chromium | awk '/Candidate:/ { print $2 }')"
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      echo "chromium.sh: no chromium package is available from this machine's apt sources" >&2
      exit 1
    fi
    echo "chromium.sh: the pinned chromium $pinned is no longer served; installing the archive's $version" >&2
  fi
  "${apt[@]}" install -y "chromium=$version" >&2
fi
command -v chromium
