#!/usr/bin/env bash
# Installs Debian packages at pinned versions, for the tools a test needs:
#
#   harness/apt-pinned.sh "WHAT FOR" PACKAGE=VERSION...
#
# harness/browser/chromium.sh and harness/image/tools.sh call it with the packages they miss, so
# `cargo test --release` passes on a machine where nothing was installed by hand. Installing
# needs root, or sudo without a password; otherwise this fails with what to run. Debian's
# archives keep only their newest build of some packages (the security archive's): where a pinned
# version is no longer served, the archive's candidate is installed and this says so on stderr.
# One install at a time (several test binaries may ask at once, and apt takes one).
set -euo pipefail
why="$1"
shift

if ! command -v apt-get >/dev/null; then
  echo "apt-pinned.sh: $why needs ${*%%=*} and this is not a Debian-based machine (no apt-get): install them" >&2
  exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "apt-pinned.sh: $why needs $* and installing needs root: run \`sudo apt-get install -y $*\` (or as root: bash $0 \"$why\" $*)" >&2
    exit 1
  fi
fi

exec 9>"${TMPDIR:-/tmp}/clb-reconciler-apt.lock"
flock 9
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Dpkg::Use-Pty=0)
"${apt[@]}" update >&2
wanted=()
for pin in "$@"; do
  package="${pin%%=*}" version="${pin#*=}"
  if ! apt-cache madison "$package" | awk -F'|' '{gsub(/ /, "", $2); print $2}' | grep -qxF "$version"; then
    candidate="$(apt-cache policy "$package" | awk '/Candidate:/ { print $2 }')"
    if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
      echo "apt-pinned.sh: no $package package is available from this machine's apt sources" >&2
      exit 1
    fi
    echo "apt-pinned.sh: the pinned $package $version is no longer served; installing the archive's $candidate" >&2
    version="$candidate"
  fi
  wanted+=("$package=$version")
done
echo "apt-pinned.sh: installing ${wanted[*]} for $why" >&2
"${apt[@]}" install -y "${wanted[@]}" >&2
