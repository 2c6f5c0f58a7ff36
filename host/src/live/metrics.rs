//! What an operator scrapes, as data: the registry the supervisor publishes into and its
//! Prometheus text exposition (format 0.0.4, design §7: metrics per call labelled by logic
//! version), the health and readiness it implies and the `/status` document.
//! [`crate::live::endpoint`] serves them over HTTP.
//!
//! The [`Supervisor`](crate::supervisor::Supervisor) serves with `&mut self`, so a scrape cannot
//! ask it; instead it publishes a [`Snapshot`] into [`Metrics`] (through
//! [`Publish`](crate::supervisor::Publish)) after every call (a mutex and a few small copies,
//! nothing next to a guest call), and a scrape renders the last one. The guest's own counters are
//! atomics shared with the [`Logic`](crate::sandbox::Logic); the snapshot reads them.
//!
//! * Per version (`version` = the first 12 hex digits of the component's sha256, `sha256` = all
//!   of it): calls, fuel used, failures by kind. A version stays in the exposition after it is
//!   swapped out, at its last values, so its counters never go backwards.
//! * The supervisor's counters (inputs, recoveries, quarantined inputs, checkpoints and their
//!   bytes, swaps by result, rollbacks, the state size) are totals over the process; they carry
//!   the labels of the version serving at the scrape.
//! * Healthy while a version serves (the tracker is running); ready once the tracker has
//!   reported `idle` at least once since it started (the first lists are reconciled) — and,
//!   under `clb-host run` ([`Metrics::await_lists`]), once the watchers' initial lists have been
//!   delivered.
//! * The status: the serving version and the one a rollback would return to, the last swap
//!   result ([`SwapRecord`]), swaps by result, quarantined inputs, the state size. A rollback the
//!   supervisor does on its own is noticed here, when the snapshot after it is published, and
//!   recorded like a swap.

use crate::live::swap::{SwapRecord, SwapResult};
use crate::supervisor::{ROLLBACK_AFTER, Snapshot, VersionSnapshot};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

/// Counters of the parts of `run` that a leadership term rebuilds, shared by all terms so that
/// `/metrics` shows process totals.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// The leader-election Lease.
    pub leader: std::sync::Arc<crate::live::lease::LeaseStats>,
    /// The Azure resource lock's Lease (multi-SLB local-service mode).
    pub resource_lock: std::sync::Arc<crate::live::lease::LeaseStats>,
    /// The backend-pool updater (multi-SLB local-service mode).
    pub pool_updater: std::sync::Arc<crate::backend_pools::PoolUpdaterStats>,
    /// `--record`: the trace every term's calls into the logic go to.
    pub trace: Option<std::sync::Arc<crate::trace::Recorder>>,
}

impl crate::supervisor::Publish for Metrics {
    fn publish(&self, snapshot: Snapshot) {
        Metrics::publish(self, snapshot);
    }
}

/// The last published state, and every version ever seen (so swapped-out versions keep their
/// series).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Published>,
    /// The engine's guest memories, once [`Self::track_memories`] names them.
    #[cfg(unix)]
    memories: std::sync::OnceLock<Arc<crate::sandbox::linear_memory::RecyclingMemories>>,
    /// `run`'s leases and backend-pool updater, once [`Self::track_run`] names them.
    run: std::sync::OnceLock<RunStats>,
}

#[derive(Default)]
struct Published {
    last: Snapshot,
    /// By sha256.
    versions: BTreeMap<String, VersionSnapshot>,
    last_swap: Option<SwapRecord>,
    /// Swaps refused before the supervisor saw them (a pin that does not match), by kind.
    refused_before_load: BTreeMap<&'static str, u64>,
    /// Swap Events given up on.
    event_failures: u64,
    /// `POST /swap` requests refused for want of a loopback peer or the token.
    swap_requests_denied: u64,
    /// Set by [`Metrics::await_lists`] until [`Metrics::lists_delivered`].
    lists_pending: bool,
    /// A replica that does not lead (leader election): healthy, not ready.
    standing_by: bool,
    /// Where every [`SwapRecord`] goes, once someone subscribed.
    records: Option<tokio::sync::mpsc::UnboundedSender<SwapRecord>>,
}

impl Published {
    fn record(&mut self, record: SwapRecord) {
        if let Some(records) = &self.records {
            // A closed receiver (the Event task ended) leaves the record in /status and the logs.
            let _ = records.send(record.clone());
        }
        self.last_swap = Some(record);
    }

    /// Swaps by result: the supervisor's and those refused before it.
    fn swaps(&self) -> BTreeMap<&'static str, u64> {
        let mut swaps = self.last.supervisor.swaps.clone();
        for (kind, n) in &self.refused_before_load {
            *swaps.entry(kind).or_default() += n;
        }
        swaps
    }
}

/// The logic version of a `/status`.
#[derive(Clone, Debug, Serialize)]
pub struct VersionRef {
    pub version: String,
    pub sha256: String,
}

/// What `/status` shows.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub serving: bool,
    pub ready: bool,
    pub active: Option<VersionRef>,
    /// The version a rollback would return to, while the active one is on probation.
    pub previous: Option<VersionRef>,
    pub last_swap: Option<SwapRecord>,
    pub swaps: BTreeMap<&'static str, u64>,
    pub rollbacks: u64,
    pub quarantined_inputs: u64,
    /// The tracker's state at the last checkpoint.
    pub state_bytes: usize,
    pub inputs: u64,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // A panic elsewhere while holding the lock leaves plain counters behind: still valid.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shows the counts of the engine's memory creator (one per process; the first one named
    /// stays).
    #[cfg(unix)]
    pub fn track_memories(&self, memories: Arc<crate::sandbox::linear_memory::RecyclingMemories>) {
        let _ = self.memories.set(memories);
    }

    /// Shows the counters of `run`'s leases and backend-pool updater (the first ones named stay).
    pub fn track_run(&self, stats: RunStats) {
        let _ = self.run.set(stats);
    }

    pub fn publish(&self, snapshot: Snapshot) {
        let mut published = self.lock();
        for version in &snapshot.versions {
            published.versions.insert(version.sha256.clone(), version.clone());
        }
        // The supervisor rolls back on its own, inside a call: the counters say it happened,
        // and the version serving before and after say between which versions.
        let name = |v: Option<&VersionSnapshot>| v.map_or_else(|| "none".to_owned(), |v| v.version.clone());
        let (before, after) = (&published.last, &snapshot);
        let mut rollbacks = Vec::new();
        if after.supervisor.rollbacks > before.supervisor.rollbacks {
            let from = name(before.serving.as_ref());
            rollbacks.push(SwapResult::RolledBack {
                reason: format!("{ROLLBACK_AFTER} inputs in a row were quarantined on {from} during its probation"),
                from,
                to: name(after.serving.as_ref()),
            });
        }
        if after.supervisor.rollbacks_failed > before.supervisor.rollbacks_failed {
            rollbacks.push(SwapResult::RollbackFailed {
                version: name(after.serving.as_ref()),
                reason: format!(
                    "{ROLLBACK_AFTER} inputs in a row were quarantined, and the previous version could not be rebuilt"
                ),
            });
        }
        published.last = snapshot;
        for result in rollbacks {
            published.record(SwapRecord::now("supervisor", result));
        }
    }

    /// Records the result of a swap request for `/status` and the Events.
    pub fn record_swap(&self, record: SwapRecord) {
        self.lock().record(record);
    }

    /// Every [`SwapRecord`] from now on (one subscriber: the Event reporter; a second replaces
    /// the first).
    pub fn subscribe_swaps(&self) -> tokio::sync::mpsc::UnboundedReceiver<SwapRecord> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        self.lock().records = Some(sender);
        receiver
    }

    /// Ends the subscription: the subscriber's receiver closes once it has taken what is sent.
    pub fn unsubscribe_swaps(&self) {
        self.lock().records = None;
    }

    /// A swap refused before it reached the supervisor, counted under `kind`.
    pub fn count_refused_before_load(&self, kind: &'static str) {
        *self.lock().refused_before_load.entry(kind).or_default() += 1;
    }

    pub fn count_event_failure(&self) {
        self.lock().event_failures += 1;
    }

    pub(crate) fn count_denied(&self) {
        self.lock().swap_requests_denied += 1;
    }

    /// Whether this replica stands by for leadership: then it is healthy although no version
    /// serves (a probe must not restart it), and not ready.
    pub fn standing_by(&self, standing_by: bool) {
        self.lock().standing_by = standing_by;
    }

    /// Readiness waits, besides the first idle step, for [`Metrics::lists_delivered`].
    pub fn await_lists(&self) {
        self.lock().lists_pending = true;
    }

    /// The watchers' initial lists have been delivered to the logic.
    pub fn lists_delivered(&self) {
        self.lock().lists_pending = false;
    }

    pub fn healthy(&self) -> bool {
        let published = self.lock();
        published.standing_by || published.last.serving.is_some()
    }

    pub fn ready(&self) -> bool {
        Self::is_ready(&self.lock())
    }

    fn is_ready(published: &Published) -> bool {
        published.last.ready && published.last.serving.is_some() && !published.lists_pending && !published.standing_by
    }

    /// What `/status` shows.
    pub fn status(&self) -> Status {
        let published = self.lock();
        let last = &published.last;
        let version = |v: &VersionSnapshot| VersionRef { version: v.version.clone(), sha256: v.sha256.clone() };
        Status {
            serving: last.serving.is_some(),
            ready: Self::is_ready(&published),
            active: last.serving.as_ref().map(version),
            previous: last.versions.get(1).map(version),
            last_swap: published.last_swap.clone(),
            swaps: published.swaps(),
            rollbacks: last.supervisor.rollbacks,
            quarantined_inputs: last.supervisor.quarantined,
            state_bytes: last.supervisor.last_checkpoint_bytes,
            inputs: last.supervisor.inputs,
        }
    }

    /// The Prometheus text exposition of the last snapshot.
    pub fn render(&self) -> String {
        let published = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        let versions: Vec<&VersionSnapshot> = published.versions.values().collect();
        family(&mut out, "clb_guest_calls_total", "counter", "Calls into the guest, by logic version.");
        for v in &versions {
            sample(&mut out, "clb_guest_calls_total", &version_labels(v, &[]), v.calls as f64);
        }
        family(&mut out, "clb_guest_fuel_used_total", "counter", "Fuel the guest's calls used, by logic version.");
        for v in &versions {
            sample(&mut out, "clb_guest_fuel_used_total", &version_labels(v, &[]), v.fuel_used as f64);
        }
        family(&mut out, "clb_guest_failures_total", "counter", "Guest calls that failed, by logic version and kind.");
        for v in &versions {
            for (kind, n) in &v.failures {
                sample(&mut out, "clb_guest_failures_total", &version_labels(v, &[("kind", kind)]), *n as f64);
            }
        }

        let last = &published.last;
        family(&mut out, "clb_logic_serving", "gauge", "1 for the logic version serving now.");
        if let Some(serving) = &last.serving {
            sample(&mut out, "clb_logic_serving", &version_labels(serving, &[]), 1.0);
        }
        let ready = if Self::is_ready(&published) { 1.0 } else { 0.0 };
        single(&mut out, "clb_ready", "gauge", "1 once the tracker has reported idle since it started.", ready);
        single(
            &mut out,
            "clb_swap_events_failed_total",
            "counter",
            "Swap Events that could not be recorded.",
            published.event_failures as f64,
        );
        single(
            &mut out,
            "clb_swap_requests_denied_total",
            "counter",
            "POST /swap requests refused: not from loopback, or without the token.",
            published.swap_requests_denied as f64,
        );
        #[cfg(unix)]
        if let Some(memories) = self.memories.get() {
            let m = memories.stats();
            family(
                &mut out,
                "clb_guest_memories_total",
                "counter",
                "Guest linear memories handed out, by origin: freshly mapped, or recycled (resident and zeroed).",
            );
            sample(&mut out, "clb_guest_memories_total", r#"origin="mapped""#, m.mapped as f64);
            sample(&mut out, "clb_guest_memories_total", r#"origin="recycled""#, m.recycled as f64);
            single(
                &mut out,
                "clb_guest_memory_zeroed_bytes_total",
                "counter",
                "Bytes of dropped guest memories zeroed for reuse.",
                m.zeroed_bytes as f64,
            );
            single(
                &mut out,
                "clb_guest_memories_unmapped_total",
                "counter",
                "Dropped guest memories given back to the kernel (too many or too large to keep).",
                m.unmapped as f64,
            );
        }

        if let Some(run) = self.run.get() {
            render_run(&mut out, run);
        }
        // The supervisor's totals, labelled with the version serving at this scrape.
        let Some(serving) = &last.serving else { return out };
        let s = &last.supervisor;
        let labels = version_labels(serving, &[]);
        let counters: [(&str, &str, f64); 6] = [
            ("clb_supervisor_inputs_total", "Inputs delivered to the tracker.", s.inputs as f64),
            ("clb_supervisor_recoveries_total", "Rebuilds of the tracker after a trap.", s.recoveries as f64),
            (
                "clb_supervisor_quarantined_inputs_total",
                "Observations or outcomes dropped because the logic traps on them.",
                s.quarantined as f64,
            ),
            ("clb_supervisor_checkpoints_total", "Checkpoints (export-state) taken.", s.checkpoints as f64),
            ("clb_supervisor_checkpoint_bytes_total", "Bytes of all checkpoints taken.", s.checkpoint_bytes as f64),
            (
                "clb_supervisor_checkpoint_seconds_total",
                "Time spent taking checkpoints.",
                s.checkpoint_time.as_secs_f64(),
            ),
        ];
        for (name, help, value) in counters {
            family(&mut out, name, "counter", help);
            sample(&mut out, name, &labels, value);
        }
        family(
            &mut out,
            "clb_supervisor_swaps_total",
            "counter",
            "Swap attempts, by result (accepted or the refusal).",
        );
        for (result, n) in &published.swaps() {
            sample(&mut out, "clb_supervisor_swaps_total", &version_labels(serving, &[("result", result)]), *n as f64);
        }
        family(&mut out, "clb_supervisor_rollbacks_total", "counter", "Rollbacks to the previous version, by result.");
        for (result, n) in [("done", s.rollbacks), ("failed", s.rollbacks_failed)] {
            sample(
                &mut out,
                "clb_supervisor_rollbacks_total",
                &version_labels(serving, &[("result", result)]),
                n as f64,
            );
        }
        family(&mut out, "clb_state_bytes", "gauge", "Size of the tracker's state at the last checkpoint.");
        sample(&mut out, "clb_state_bytes", &labels, s.last_checkpoint_bytes as f64);
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The leases' and the backend-pool updater's counters.
fn render_run(out: &mut String, run: &RunStats) {
    let n = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed) as f64;
    family(
        out,
        "clb_lease_operations_total",
        "counter",
        "Operations on the Leases by lease (leader, resource-lock) and result.",
    );
    for (lease, stats) in [("leader", &run.leader), ("resource-lock", &run.resource_lock)] {
        for (result, count) in stats.by_result() {
            let labels = format!("lease=\"{lease}\",result=\"{result}\"");
            sample(out, "clb_lease_operations_total", &labels, count as f64);
        }
    }
    let p = &run.pool_updater;
    family(
        out,
        "clb_pool_updater_ticks_total",
        "counter",
        "Backend-pool updater ticks: busy (wrote or tried), or idle.",
    );
    let busy = (n(&p.ticks) - n(&p.idle_ticks)).max(0.0);
    sample(out, "clb_pool_updater_ticks_total", r#"result="busy""#, busy);
    sample(out, "clb_pool_updater_ticks_total", r#"result="idle""#, n(&p.idle_ticks));
    family(
        out,
        "clb_pool_updater_groups_total",
        "counter",
        "Backend-pool groups (one pool of one load balancer) by result.",
    );
    for (result, counter) in
        [("written", &p.groups_written), ("unchanged", &p.groups_unchanged), ("failed", &p.groups_failed)]
    {
        sample(out, "clb_pool_updater_groups_total", &format!("result=\"{result}\""), n(counter));
    }
    family(
        out,
        "clb_pool_updater_failures_total",
        "counter",
        "Backend-pool updater failures outside a group: the resource lock not taken or not released, an Event not recorded.",
    );
    for (kind, counter) in [("lock", &p.lock_failures), ("unlock", &p.unlock_failures), ("event", &p.event_failures)] {
        sample(out, "clb_pool_updater_failures_total", &format!("kind=\"{kind}\""), n(counter));
    }
    if let Some(trace) = &run.trace {
        let t = trace.stats();
        family(
            out,
            "clb_trace_lines_total",
            "counter",
            "Trace lines (run --record) written, or dropped (a full queue or disk).",
        );
        sample(out, "clb_trace_lines_total", r#"result="written""#, n(&t.lines_written));
        sample(out, "clb_trace_lines_total", r#"result="dropped""#, n(&t.lines_dropped));
        family(out, "clb_trace_bytes_total", "counter", "Bytes written to trace files.");
        sample(out, "clb_trace_bytes_total", "", n(&t.bytes_written));
        family(
            out,
            "clb_trace_write_errors_total",
            "counter",
            "Trace files that could not be opened, written or flushed.",
        );
        sample(out, "clb_trace_write_errors_total", "", n(&t.write_errors));
        family(
            out,
            "clb_trace_files_total",
            "counter",
            "Trace files started (the first one, and one per rotation or loss).",
        );
        sample(out, "clb_trace_files_total", "", n(&t.files));
    }
}

/// A family of one sample without labels.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    family(out, name, kind, help);
    sample(out, name, "", value);
}

fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    let _ =
        if labels.is_empty() { writeln!(out, "{name} {value}") } else { writeln!(out, "{name}{{{labels}}} {value}") };
}

fn version_labels(version: &VersionSnapshot, extra: &[(&str, &str)]) -> String {
    let mut labels = vec![("version", version.version.as_str()), ("sha256", version.sha256.as_str())];
    labels.extend_from_slice(extra);
    labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect::<Vec<_>>().join(",")
}

/// Label values escape `\`, `"` and newlines (exposition format 0.0.4).
fn escape(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', "\\n")
}
