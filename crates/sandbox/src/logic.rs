//! The logic as its drivers call it: [`Logic`], the guest's `tracker` through whichever
//! implementation — the component behind its supervisor (`Supervisor`, which `clb-host run`
//! drives, and `clb-simulator`'s `ComponentReconciler` around it), or the native library
//! (`clb-simulator`'s `NativeReconciler`, the differential runs). Four calls
//! and the figures, nothing else: what not every implementation has (the backend-pool logic,
//! swaps, a candidate in shadow, traces) is a trait of its own above this one, never a default
//! here that answers "unsupported".

use crate::bindings::clb::reconciler::types as wit;

/// The reconcile logic's calls: a tracker started from a configuration, then fed observations,
/// the outcomes of its commands and the time, each answered with a step.
pub trait Logic {
    /// Why a call failed.
    type Error;
    /// Starts a fresh tracker (at start and on every restart); earlier state is dropped.
    fn start(&mut self, config: &wit::Config) -> Result<(), Self::Error>;
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, Self::Error>;
    /// With ARM's remaining-writes figure on the latest answer among `results` that carried one.
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, Self::Error>;
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, Self::Error>;
    /// What the logic is doing (`tracker.stats`).
    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, Self::Error>;
}
