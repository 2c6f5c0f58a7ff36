//! What an operator scrapes, as data: the registry the supervisor publishes into and its
//! OpenMetrics text exposition through `prometheus-client` (design §7: metrics per call labelled
//! by logic version), the health and readiness it implies and the `/status` document.
//! [`crate::live::endpoint`] serves them over HTTP.
//!
//! The [`Supervisor`](crate::supervisor::Supervisor) serves with `&mut self`, so a scrape cannot
//! ask it; instead it publishes a [`Snapshot`] into [`Metrics`] (through
//! [`Publish`](crate::supervisor::Publish)) after every call (a mutex and a few small copies,
//! nothing next to a guest call), and a scrape renders the last one through a collector. The
//! guest's own counters are atomics shared with the [`Logic`](crate::sandbox::Logic); the
//! snapshot reads them. Latencies are histograms observed as they happen: each delivered input's
//! guest call (by version), each command `run` carries out (by command and result), each phase
//! of a swap.
//!
//! The metric names and labels are the operators' contract (`docs/operations.md`, "What to
//! scrape"); `tests/it/metrics.rs` pins them.
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
use crate::supervisor::{Snapshot, VersionSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Counters of the parts of `run` that a leadership term rebuilds, shared by all terms so that
/// `/metrics` shows process totals.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// The leader-election Lease.
    pub leader: Arc<crate::live::lease::LeaseStats>,
    /// The Azure resource lock's Lease (multi-SLB local-service mode).
    pub resource_lock: Arc<crate::live::lease::LeaseStats>,
    /// The backend-pool updater (multi-SLB local-service mode).
    pub pool_updater: Arc<crate::backend_pools::PoolUpdaterStats>,
    /// `--record`: the trace every term's calls into the logic go to.
    pub trace: Option<Arc<crate::trace::Recorder>>,
}

impl crate::supervisor::Publish for Metrics {
    fn publish(&self, snapshot: Snapshot) {
        Metrics::publish(self, snapshot);
    }

    fn guest_call(&self, sha256: &str, took: Duration) {
        let labels = vec![("version", sha256.chars().take(12).collect()), ("sha256", sha256.to_owned())];
        self.latency.guest_calls.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

/// The last published state, every version ever seen (so swapped-out versions keep their
/// series), and the registry that renders them with the latency histograms.
pub struct Metrics {
    shared: Arc<Shared>,
    registry: Registry,
    latency: Latency,
}

/// What the scrape's collector reads.
#[derive(Default)]
struct Shared {
    inner: Mutex<Published>,
    /// The engine's guest memories, once [`Metrics::track_memories`] names them.
    #[cfg(unix)]
    memories: std::sync::OnceLock<Arc<crate::sandbox::linear_memory::RecyclingMemories>>,
    /// `run`'s leases and backend-pool updater, once [`Metrics::track_run`] names them.
    run: std::sync::OnceLock<RunStats>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // A panic elsewhere while holding the lock leaves plain counters behind: still valid.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_ready(published: &Published) -> bool {
        published.last.ready && published.last.serving.is_some() && !published.lists_pending && !published.standing_by
    }
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
        // A shadow's records are Events; `/status` shows the shadow itself.
        if !record.result.is_shadow() {
            self.last_swap = Some(record);
        }
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
    /// The candidate in shadow, or the last one (stopped or promoted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::supervisor::ShadowStatus>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let shared = Arc::new(Shared::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SnapshotCollector(shared.clone())));
        let latency = Latency::register(&mut registry);
        Arc::new(Self { shared, registry, latency })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.shared.lock()
    }

    /// Shows the counts of the engine's memory creator (one per process; the first one named
    /// stays).
    #[cfg(unix)]
    pub fn track_memories(&self, memories: Arc<crate::sandbox::linear_memory::RecyclingMemories>) {
        let _ = self.shared.memories.set(memories);
    }

    /// Shows the counters of `run`'s leases and backend-pool updater (the first ones named stay).
    pub fn track_run(&self, stats: RunStats) {
        let _ = self.shared.run.set(stats);
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
        let why = after.supervisor.last_rollback.clone().unwrap_or_default();
        if after.supervisor.rollbacks > before.supervisor.rollbacks {
            let from = name(before.serving.as_ref());
            rollbacks.push(SwapResult::RolledBack {
                reason: format!("on {from}, {why}"),
                from,
                to: name(after.serving.as_ref()),
            });
        }
        if after.supervisor.rollbacks_failed > before.supervisor.rollbacks_failed {
            rollbacks.push(SwapResult::RollbackFailed {
                version: name(after.serving.as_ref()),
                reason: format!("{why}, and the previous version could not be rebuilt"),
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
        Shared::is_ready(&self.lock())
    }

    /// What `/status` shows.
    pub fn status(&self) -> Status {
        let published = self.lock();
        let last = &published.last;
        let version = |v: &VersionSnapshot| VersionRef { version: v.version.clone(), sha256: v.sha256.clone() };
        Status {
            serving: last.serving.is_some(),
            ready: Shared::is_ready(&published),
            active: last.serving.as_ref().map(version),
            previous: last.versions.get(1).map(version),
            last_swap: published.last_swap.clone(),
            swaps: published.swaps(),
            rollbacks: last.supervisor.rollbacks,
            quarantined_inputs: last.supervisor.quarantined,
            state_bytes: last.supervisor.last_checkpoint_bytes,
            inputs: last.supervisor.inputs,
            shadow: last.shadow.as_ref().map(|shadow| shadow.status()),
        }
    }

    /// The OpenMetrics text exposition: the last snapshot's counters, then the latency
    /// histograms, then `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String fails only if a collector does, and ours write to it alone.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// How long one command took against Azure or Kubernetes (`clb-host run`), by
    /// [`command_name`](crate::executor::command_name) and whether it failed.
    pub fn observe_command(&self, command: &'static str, failed: bool, took: Duration) {
        let result = if failed { "failed" } else { "ok" };
        self.latency
            .commands
            .get_or_create(&vec![("command", command.to_owned()), ("result", result.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// Azure answered a command 429 (throttled), by [`command_name`](crate::executor::command_name).
    pub fn observe_throttled(&self, command: &'static str) {
        self.latency.throttled.get_or_create(&vec![("command", command.to_owned())]).inc();
    }

    /// What ARM's `x-ms-ratelimit-remaining-subscription-writes` last said.
    pub fn arm_remaining_writes(&self, remaining: u32) {
        self.latency.arm_remaining_writes.set(i64::from(remaining));
    }

    /// How long one phase of a swap took: `load` (decompress, check and compile, off the loop),
    /// `stage` (the state move into the new version, off the loop) or `switch` (the pause of the
    /// loop while the new version takes over).
    pub fn observe_swap_phase(&self, phase: SwapPhase, took: Duration) {
        self.latency.swap_phases.get_or_create(&vec![("phase", phase.as_str().to_owned())]).observe(took.as_secs_f64());
    }
}

/// The phases of a swap that [`Metrics::observe_swap_phase`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapPhase {
    Load,
    Stage,
    Switch,
}

impl SwapPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            SwapPhase::Load => "load",
            SwapPhase::Stage => "stage",
            SwapPhase::Switch => "switch",
        }
    }
}

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The latency histograms, updated as things happen (a snapshot holds counters only).
#[derive(Clone, Debug)]
struct Latency {
    guest_calls: Histograms,
    commands: Histograms,
    swap_phases: Histograms,
    /// Not latencies, but observed as they happen like them: 429s by command, ARM's last figure.
    throttled: Family<Vec<(&'static str, String)>, Counter>,
    arm_remaining_writes: Gauge,
}

impl Latency {
    fn register(registry: &mut Registry) -> Self {
        // A guest call takes from tens of microseconds to the deadline (1 s by default); an Azure
        // call from milliseconds to the request timeout (60 s by default); a swap's phases from a
        // millisecond (a switch) to tens of seconds (compiling a large component on a busy node).
        let latency = Self {
            guest_calls: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.000_05, 4.0, 10))),
            commands: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.5, 11))),
            swap_phases: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 4.0, 9))),
            throttled: Family::default(),
            arm_remaining_writes: Gauge::default(),
        };
        registry.register(
            "clb_azure_throttled",
            "Commands Azure answered 429 (throttled), by command (run).",
            latency.throttled.clone(),
        );
        registry.register(
            "clb_arm_remaining_writes",
            "What ARM's x-ms-ratelimit-remaining-subscription-writes said on the last answer that carried it (run); the logic paces ARM-routed writes by it.",
            latency.arm_remaining_writes.clone(),
        );
        registry.register_with_unit(
            "clb_guest_call",
            "Time the serving version took over one delivered input, by logic version.",
            Unit::Seconds,
            latency.guest_calls.clone(),
        );
        registry.register_with_unit(
            "clb_command",
            "Time one command took against Azure or Kubernetes (run), by command and result (ok, failed).",
            Unit::Seconds,
            latency.commands.clone(),
        );
        registry.register_with_unit(
            "clb_swap_phase",
            "Time one phase of a swap took: load (decompress and compile), stage (state move beside serving), switch (the loop's pause).",
            Unit::Seconds,
            latency.swap_phases.clone(),
        );
        latency
    }
}

/// Renders what the snapshot holds at each scrape.
struct SnapshotCollector(Arc<Shared>);

impl std::fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotCollector")
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let shared = &self.0;
        let published = shared.lock();
        let out = &mut encoder;
        let versions: Vec<&VersionSnapshot> = published.versions.values().collect();
        counters(
            out,
            "clb_guest_calls",
            "Calls into the guest, by logic version.",
            versions.iter().map(|v| (version_labels(v, &[]), v.calls)),
        )?;
        counters(
            out,
            "clb_guest_fuel_used",
            "Fuel the guest's calls used, by logic version.",
            versions.iter().map(|v| (version_labels(v, &[]), v.fuel_used)),
        )?;
        counters(
            out,
            "clb_guest_failures",
            "Guest calls that failed, by logic version and kind.",
            versions.iter().flat_map(|v| v.failures.iter().map(|(kind, n)| (version_labels(v, &[("kind", kind)]), *n))),
        )?;

        let last = &published.last;
        gauges(
            out,
            "clb_logic_serving",
            "1 for the logic version serving now.",
            last.serving.iter().map(|v| (version_labels(v, &[]), 1)),
        )?;
        let ready = i64::from(Shared::is_ready(&published));
        gauges(out, "clb_ready", "1 once the tracker has reported idle since it started.", [(Labels::new(), ready)])?;
        counters(
            out,
            "clb_swap_events_failed",
            "Swap Events that could not be recorded.",
            [(Labels::new(), published.event_failures)],
        )?;
        counters(
            out,
            "clb_swap_requests_denied",
            "POST /swap requests refused: not from loopback, or without the token.",
            [(Labels::new(), published.swap_requests_denied)],
        )?;
        #[cfg(unix)]
        if let Some(memories) = shared.memories.get() {
            let m = memories.stats();
            counters(
                out,
                "clb_guest_memories",
                "Guest linear memories handed out, by origin: freshly mapped, or recycled (resident and zeroed).",
                [(label("origin", "mapped"), m.mapped), (label("origin", "recycled"), m.recycled)],
            )?;
            counters(
                out,
                "clb_guest_memory_zeroed_bytes",
                "Bytes of dropped guest memories zeroed for reuse.",
                [(Labels::new(), m.zeroed_bytes)],
            )?;
            counters(
                out,
                "clb_guest_memories_unmapped",
                "Dropped guest memories given back to the kernel (too many or too large to keep).",
                [(Labels::new(), m.unmapped)],
            )?;
        }
        if let Some(run) = shared.run.get() {
            encode_run(out, run)?;
        }
        if let Some(shadow) = &published.last.shadow {
            encode_shadow(out, &shadow.status())?;
        }

        // The supervisor's totals, labelled with the version serving at this scrape.
        let Some(serving) = &last.serving else { return Ok(()) };
        let s = &last.supervisor;
        let labels = || version_labels(serving, &[]);
        let totals: [(&str, &str, u64); 5] = [
            ("clb_supervisor_inputs", "Inputs delivered to the tracker.", s.inputs),
            ("clb_supervisor_recoveries", "Rebuilds of the tracker after a trap.", s.recoveries),
            (
                "clb_supervisor_quarantined_inputs",
                "Observations or outcomes dropped because the logic traps on them.",
                s.quarantined,
            ),
            ("clb_supervisor_checkpoints", "Checkpoints (export-state) taken.", s.checkpoints),
            ("clb_supervisor_checkpoint_bytes", "Bytes of all checkpoints taken.", s.checkpoint_bytes),
        ];
        for (name, help, value) in totals {
            counters(out, name, help, [(labels(), value)])?;
        }
        let seconds = ConstCounter::new(s.checkpoint_time.as_secs_f64());
        family(
            out,
            "clb_supervisor_checkpoint_seconds",
            "Time spent taking checkpoints.",
            [(labels(), seconds)].into_iter(),
        )?;
        counters(
            out,
            "clb_supervisor_swaps",
            "Swap attempts, by result (accepted or the refusal).",
            published.swaps().into_iter().map(|(result, n)| (version_labels(serving, &[("result", result)]), n)),
        )?;
        counters(
            out,
            "clb_supervisor_rollbacks",
            "Rollbacks to the previous version, by result.",
            [("done", s.rollbacks), ("failed", s.rollbacks_failed)]
                .map(|(result, n)| (version_labels(serving, &[("result", result)]), n)),
        )?;
        gauges(
            out,
            "clb_state_bytes",
            "Size of the tracker's state at the last checkpoint.",
            [(labels(), i64::try_from(s.last_checkpoint_bytes).unwrap_or(i64::MAX))],
        )
    }
}

/// A candidate in shadow's counters, labelled with its version.
fn encode_shadow(out: &mut DescriptorEncoder<'_>, status: &crate::supervisor::ShadowStatus) -> std::fmt::Result {
    let labels = |extra: &[(&'static str, &str)]| {
        let mut labels = vec![("version", status.version.clone()), ("sha256", status.sha256.clone())];
        labels.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        labels
    };
    counters(
        out,
        "clb_shadow_inputs",
        "Inputs the candidate in shadow was given: compared with the serving version's answer, or not (resyncing).",
        [(labels(&[("result", "compared")]), status.compared), (labels(&[("result", "resyncing")]), status.resyncing)],
    )?;
    counters(
        out,
        "clb_shadow_divergences",
        "Inputs the candidate answered differently from the serving version, by kind (a command's name, command-order, wake-at, idle).",
        status.divergences.iter().map(|(kind, n)| (labels(&[("kind", kind)]), *n)),
    )?;
    counters(
        out,
        "clb_shadow_resyncs",
        "Times the candidate was brought back in step with the serving version's state, by reason.",
        status.resyncs.iter().map(|(reason, n)| (labels(&[("reason", reason)]), *n)),
    )?;
    gauges(
        out,
        "clb_shadow_clean_inputs",
        "Inputs compared in a row without a divergence that holds a promotion back.",
        [(labels(&[]), i64::try_from(status.clean).unwrap_or(i64::MAX))],
    )?;
    let state = match status.state {
        crate::supervisor::ShadowState::InStep => "in-step",
        crate::supervisor::ShadowState::Resyncing => "resyncing",
        crate::supervisor::ShadowState::Promoted => "promoted",
        crate::supervisor::ShadowState::Stopped => "stopped",
    };
    gauges(
        out,
        "clb_shadow_state",
        "1 for the state the candidate in shadow is in.",
        [(labels(&[("state", state)]), 1)],
    )
}

/// The leases' and the backend-pool updater's counters.
fn encode_run(out: &mut DescriptorEncoder<'_>, run: &RunStats) -> std::fmt::Result {
    let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    counters(
        out,
        "clb_lease_operations",
        "Operations on the Leases by lease (leader, resource-lock) and result.",
        [("leader", &run.leader), ("resource-lock", &run.resource_lock)].into_iter().flat_map(|(lease, stats)| {
            stats
                .by_result()
                .into_iter()
                .map(move |(result, count)| (vec![("lease", lease.to_owned()), ("result", result.to_string())], count))
        }),
    )?;
    let p = &run.pool_updater;
    counters(
        out,
        "clb_pool_updater_ticks",
        "Backend-pool updater ticks: busy (wrote or tried), or idle.",
        [
            (label("result", "busy"), n(&p.ticks).saturating_sub(n(&p.idle_ticks))),
            (label("result", "idle"), n(&p.idle_ticks)),
        ],
    )?;
    counters(
        out,
        "clb_pool_updater_groups",
        "Backend-pool groups (one pool of one load balancer) by result.",
        [("written", &p.groups_written), ("unchanged", &p.groups_unchanged), ("failed", &p.groups_failed)]
            .map(|(result, c)| (label("result", result), n(c))),
    )?;
    counters(
        out,
        "clb_pool_updater_failures",
        "Backend-pool updater failures outside a group: the resource lock not taken or not released, an Event not recorded.",
        [("lock", &p.lock_failures), ("unlock", &p.unlock_failures), ("event", &p.event_failures)]
            .map(|(kind, c)| (label("kind", kind), n(c))),
    )?;
    if let Some(trace) = &run.trace {
        let t = trace.stats();
        counters(
            out,
            "clb_trace_lines",
            "Trace lines (run --record) written, or dropped (a full queue or disk).",
            [(label("result", "written"), n(&t.lines_written)), (label("result", "dropped"), n(&t.lines_dropped))],
        )?;
        counters(out, "clb_trace_bytes", "Bytes written to trace files.", [(Labels::new(), n(&t.bytes_written))])?;
        counters(
            out,
            "clb_trace_write_errors",
            "Trace files that could not be opened, written or flushed.",
            [(Labels::new(), n(&t.write_errors))],
        )?;
        counters(
            out,
            "clb_trace_files",
            "Trace files started (the first one, and one per rotation or loss).",
            [(Labels::new(), n(&t.files))],
        )?;
    }
    Ok(())
}

/// A counter family (`name` without the `_total` the encoding appends) of these samples.
fn counters(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family(out, name, help, samples.into_iter().map(|(labels, value)| (labels, ConstCounter::new(value))))
}

fn gauges(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, i64)>,
) -> std::fmt::Result {
    family(out, name, help, samples.into_iter().map(|(labels, value)| (labels, ConstGauge::new(value))))
}

/// One family: its descriptor, then a sample per label set (none without labels).
fn family<M: EncodeMetric>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (Labels, M)>,
) -> std::fmt::Result {
    let mut samples = samples.peekable();
    let kind = match samples.peek() {
        Some((_, metric)) => metric.metric_type(),
        None => return Ok(()),
    };
    let mut encoder = out.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in samples {
        metric.encode(encoder.encode_family(&labels)?)?;
    }
    Ok(())
}

fn label(key: &'static str, value: &str) -> Labels {
    vec![(key, value.to_owned())]
}

fn version_labels(version: &VersionSnapshot, extra: &[(&'static str, &str)]) -> Labels {
    let mut labels = vec![("version", version.version.clone()), ("sha256", version.sha256.clone())];
    labels.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    labels
}
