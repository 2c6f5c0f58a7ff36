//! When the supervisor replaces its checkpoint (the journal holds every input since).

/// When the supervisor replaces its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// After this many inputs.
    pub every_inputs: usize,
    /// Or once the journal holds this many observations and outcomes.
    pub journal_items: usize,
}

impl Default for CheckpointPolicy {
    /// Measured on 1,000 nodes / 30,000 pods / 1,000 Services (`cargo bench -p clb-tests --bench
    /// swap`, BENCHMARKS.md): one checkpoint (`export-state` of 7.3 MB) costs ~38 ms while an
    /// input costs ~29 µs, so the first choice, every 64 inputs, made each input ~22× dearer
    /// (624 µs). Every 4,096 inputs spreads a checkpoint to ~10 µs per input (41 µs against 29 µs
    /// with no checkpoints at all), and still bounds the work after a trap to an import (~115 ms)
    /// plus a replay of at most 4,096 inputs (~120 ms at that rate). The journal bound (16,384
    /// observations and outcomes) caps its memory when inputs are large batches, and takes a
    /// checkpoint right after the start-up lists.
    fn default() -> Self {
        Self { every_inputs: 4_096, journal_items: 16_384 }
    }
}
