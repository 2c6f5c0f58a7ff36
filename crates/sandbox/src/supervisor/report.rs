//! What the supervisor tells: the snapshot it publishes after every call (to the metrics
//! registry, through [`Publish`]) and its counts.

use super::shadow::ShadowHandle;
use crate::LoadedLogic;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The counters of one logic version, read from its [`GuestStats`](crate::GuestStats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionSnapshot {
    pub version: String,
    pub sha256: String,
    pub calls: u64,
    pub fuel_used: u64,
    /// By [`GuestError::kind`](crate::GuestError::kind) (`poisoned` and `instantiate`
    /// are counted together as `other`).
    pub failures: BTreeMap<&'static str, u64>,
    /// Bytes of the linear memory of the instance its tracker runs in: the serving version's,
    /// while a tracker runs; none for a version held for a rollback.
    pub memory_bytes: Option<u64>,
}

impl VersionSnapshot {
    pub fn of(logic: &LoadedLogic) -> Self {
        let stats = logic.stats();
        let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let failures = [
            ("fuel", read(&stats.failures_fuel)),
            ("deadline", read(&stats.failures_deadline)),
            ("memory", read(&stats.failures_memory)),
            ("panic", read(&stats.failures_panic)),
            ("trap", read(&stats.failures_trap)),
            ("other", read(&stats.failures_other)),
        ]
        .into_iter()
        .collect();
        Self {
            version: logic.info().sha256.chars().take(12).collect(),
            sha256: logic.info().sha256.clone(),
            calls: read(&stats.calls),
            fuel_used: read(&stats.fuel_used),
            failures,
            memory_bytes: None,
        }
    }
}

/// What the supervisor publishes after each call.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The version serving, if a tracker runs.
    pub serving: Option<VersionSnapshot>,
    /// Every version the supervisor holds: the serving one first, then the one a rollback would
    /// return to.
    pub versions: Vec<VersionSnapshot>,
    pub supervisor: SupervisorStats,
    /// The tracker has reported `idle` since it started.
    pub ready: bool,
    /// The candidate in shadow, or the last one (stopped or promoted).
    pub shadow: Option<ShadowHandle>,
    /// The schema version of the serving version's state, once known: from its last checkpoint
    /// or the swap that brought it in.
    pub state_version: Option<u32>,
    /// How far the serving version is through its probation, while it serves one.
    pub probation: Option<ProbationSnapshot>,
}

/// A swapped-in version's probation, as far as it has gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbationSnapshot {
    /// Inputs it has served, of the `inputs` it must serve before the previous one is released.
    pub served: usize,
    pub inputs: usize,
    /// Inputs it has quarantined, of the `quarantines` that roll it back.
    pub quarantined: usize,
    pub quarantines: u32,
}

/// Where the supervisor publishes a [`Snapshot`] after every call: the metrics registry
/// (`clb_host::live::metrics::Metrics`) implements it. The supervisor owns the trait so that it knows
/// nothing of the layer that serves its counters.
pub trait Publish: Send + Sync {
    fn publish(&self, snapshot: Snapshot);
    /// How long the serving version (`sha256`) took over one delivered input: the call into
    /// the guest, not the rebuild after a trap nor checkpoints.
    fn guest_call(&self, sha256: &str, took: Duration);
}

/// What the supervisor has done, for metrics.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SupervisorStats {
    pub inputs: u64,
    pub recoveries: u64,
    pub quarantined: u64,
    pub checkpoints: u64,
    /// Bytes of every checkpoint taken, summed.
    pub checkpoint_bytes: u64,
    pub last_checkpoint_bytes: usize,
    #[serde(skip)]
    pub checkpoint_time: Duration,
    /// Swaps by result: `accepted` or the refusal's [`SupervisorError::kind`].
    pub swaps: BTreeMap<&'static str, u64>,
    pub rollbacks: u64,
    pub rollbacks_failed: u64,
    /// Why the last rollback (or failed one) was decided.
    pub last_rollback: Option<String>,
}
