#!/usr/bin/env bash
# Builds the real kustomize CLI (sigs.k8s.io's, pinned here) from the Go module proxy into the
# cache and prints the binary's path; a second call builds nothing (harness/go-tool.sh). The
# manifest test (tests/it/webhook.rs) builds examples/deploy/ with it, and .ci/run calls it.
exec "$(dirname "${BASH_SOURCE[0]}")/../go-tool.sh" kustomize sigs.k8s.io/kustomize/kustomize/v5 v5.7.1
