#!/usr/bin/env bash
# Builds the real cosign CLI (sigstore's, pinned here) from the Go module proxy into the cache and
# prints the binary's path; a second call builds nothing (harness/go-tool.sh). The signature tests
# (tests/it/signatures.rs) call it, and .ci/run.
exec "$(dirname "${BASH_SOURCE[0]}")/../go-tool.sh" cosign github.com/sigstore/cosign/v2/cmd/cosign v2.6.5
