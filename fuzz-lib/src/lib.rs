//! The fuzz targets of the CLB reconciler (`docs/fuzzing.md`).
//!
//! One function per target, `NAME(data: &[u8])`, that panics when a property is violated: the
//! cargo-fuzz package (`fuzz/`, nightly, libFuzzer) calls it from `fuzz_targets/NAME.rs`, and
//! the stable replay test (`tests/replay.rs`) feeds it every file of `fuzz/corpus/NAME/` and
//! `fuzz/regressions/NAME/`. Structured targets read their input through
//! [`arbitrary::Unstructured`] ([`input`]), so a mutation of the bytes is a mutation of the
//! structure; the seed corpora are encoded runs of the example scenarios (`src/bin/seed.rs`).

pub mod admission;
pub mod differential;
pub mod host_edges;
pub mod input;
pub mod pools;
pub mod program;
pub mod smoke;
pub mod state_import;
pub mod tracker;

pub use admission::admission;
pub use differential::differential;
pub use host_edges::{commands, records, scenario};
pub use pools::backend_pools;
pub use state_import::state_import;
pub use tracker::tracker;

/// A target: one input, any bytes; it panics where the input breaks what the target checks.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/` names them.
pub const TARGETS: &[(&str, Target)] = &[
    ("state_import", state_import),
    ("tracker", tracker),
    ("admission", admission),
    ("backend_pools", backend_pools),
    ("differential", differential),
    ("records", records),
    ("scenario", scenario),
    ("commands", commands),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
