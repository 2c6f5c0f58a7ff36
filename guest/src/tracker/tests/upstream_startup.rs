//! Ports of upstream engine tests (issue 17) about deletion checks, finalizers, start-up recovery, status patches and the per-tick dispatch. Each test names the upstream test
//! it ports in the comment directly above it (`docs/conformance.md` is generated from those).

use super::*;
