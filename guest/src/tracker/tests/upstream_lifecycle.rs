//! Ports of upstream engine tests (issue 17) about the lifecycle: endpoint changes and deletes while a command is in flight, repeated and redundant events, names. Each test names the upstream test
//! it ports in the comment directly above it (`docs/conformance.md` is generated from those).

use super::*;
