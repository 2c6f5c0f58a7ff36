#!/usr/bin/env bash
# Makes sure Debian's `chromium` is installed and prints its path on stdout: the operator page's
# test (tests/it/page.rs) calls this before it starts the browser, and .ci/run calls it too, so
# `cargo test --release` passes on a machine where nothing was installed by hand. The install
# (root or passwordless sudo; a pinned version, or the archive's candidate where Debian's
# security archive no longer serves it) is harness/apt-pinned.sh's.
#
# The version is pinned to the one the page test was written against (bump it with the test).
set -euo pipefail
pinned="156.0.8078.114-1~deb12u1"

if ! command -v chromium >/dev/null; then
  bash "$(dirname "$0")/../apt-pinned.sh" "the operator page's test" "chromium=$pinned"
fi
command -v chromium
