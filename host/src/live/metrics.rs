//! What an operator scrapes, as data: the registry the supervisor publishes into and its
//! OpenMetrics text exposition through `prometheus-client` (docs/design.md §7: metrics per call labelled
//! by logic version), the health and readiness it implies and the `/status` document.
//! [`crate::live::endpoint`] serves them over HTTP.
//!
//! The [`Supervisor`](clb_sandbox::supervisor::Supervisor) serves with `&mut self`, so a scrape cannot
//! ask it; instead it publishes a [`Snapshot`] into [`Metrics`] (through
//! [`Publish`](clb_sandbox::supervisor::Publish)) after every call (a mutex and a few small copies,
//! nothing next to a guest call), and a scrape renders the last one through a collector. The
//! guest's own counters are atomics shared with the [`LoadedLogic`](clb_sandbox::LoadedLogic); the
//! snapshot reads them. Latencies are histograms observed as they happen: each delivered input's
//! guest call (by version), each command `run` carries out (by command and result), each phase
//! of a swap.
//!
//! The metric names and labels are the operators' contract (`docs/operations.md`, "What to
//! scrape"); `tests/it/metrics.rs` pins them.
//!
//! It is longer than 800 lines because the exposition is one contract: every family, its labels
//! and its help text are declared and rendered here side by side, so that a renamed or missing
//! family shows in one diff (the logic's own figures are apart, in `clb_sandbox::figures`).
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
//! * The operator page (`GET /`, [`crate::live::page`]): an [`Overview`] of the above and of
//!   what only the page shows, each kept in a list of fixed length so that a controller running
//!   for months holds no more than a day-one one: the last [`SWAP_HISTORY`] swaps and rollbacks,
//!   the last [`QUARANTINE_HISTORY`] quarantined inputs, the last [`COMMAND_ERRORS`] failed
//!   commands, and [`SERIES_POINTS`] samples (one every [`SAMPLE_EVERY`]) of the sync lag and of
//!   the commands carried out by name. Text from outside (a trap's message, Azure's error) is
//!   cut at [`MAX_TEXT`] bytes.

use crate::clock::epoch_ms;
use crate::live::swap::{SwapRecord, SwapResult};
use clb_sandbox::bindings::clb::reconciler::types::TrackerStats;
use clb_sandbox::figures::{counters, family_of as family};
use clb_sandbox::supervisor::{ShadowState, ShadowStatus, Snapshot, VersionSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Counters of the parts of `run` that a leadership term rebuilds, shared by all terms so that
/// `/metrics` shows process totals.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// The leader-election Lease.
    pub leader: Arc<clb_kube::lease::LeaseStats>,
    /// The Azure resource lock's Lease (multi-SLB local-service mode).
    pub resource_lock: Arc<clb_kube::lease::LeaseStats>,
    /// The backend-pool updater (multi-SLB local-service mode).
    pub pool_updater: Arc<clb_executor::backend_pools::PoolUpdaterStats>,
    /// `--record`: the trace every term's calls into the logic go to.
    pub trace: Option<Arc<clb_sandbox::trace::Recorder>>,
}

impl clb_sandbox::supervisor::Publish for Metrics {
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
    memories: std::sync::OnceLock<Arc<clb_sandbox::linear_memory::RecyclingMemories>>,
    /// `run`'s leases and backend-pool updater, once [`Metrics::track_run`] names them.
    run: std::sync::OnceLock<RunStats>,
    /// The admission webhook's versions and denials, once [`Metrics::track_door`] names them.
    door: std::sync::OnceLock<Arc<crate::admission::Door>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // A panic elsewhere while holding the lock leaves plain counters behind: still valid.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ready once a version serves, the lists are delivered, and the tracker has been idle or
    /// says its start-up has ended (`initialized-after-ms`): a Service that keeps failing, or
    /// one parked, keeps the tracker from idling but must not keep a new leader unready.
    fn is_ready(published: &Published) -> bool {
        let started = published.figures.stats.as_ref().is_some_and(|s| s.initialized_after_ms.is_some());
        (published.last.ready || started)
            && published.last.serving.is_some()
            && !published.lists_pending
            && !published.standing_by
    }
}

/// Swaps and rollbacks the operator page lists, the newest first.
pub const SWAP_HISTORY: usize = 10;
/// Quarantined inputs the operator page lists.
pub const QUARANTINE_HISTORY: usize = 20;
/// Failed commands (Azure and Kubernetes) the operator page lists.
pub const COMMAND_ERRORS: usize = 20;
/// Samples of the operator page's time series: five minutes at [`SAMPLE_EVERY`].
pub const SERIES_POINTS: usize = 60;
/// How often [`Metrics::sample`] is meant to be called (`clb-host run` does).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Longest text kept from outside (an error, a trap's message, an input's description), in
/// bytes: an ARM error body can be kilobytes, and twenty of them would make a heavy page.
pub const MAX_TEXT: usize = 512;
/// Objects named per quarantined input at most: one in practice (a quarantine is a single
/// observation), but an input's size is the logic's to choose.
const MAX_OBJECTS: usize = 10;

/// An input the serving logic trapped on, quarantined.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    /// When it was taken from the supervisor, ms since the epoch.
    pub at_ms: u64,
    /// The version it trapped on.
    pub version: String,
    /// The objects it observes, as `Kind namespace/name` (none for outcomes and ticks).
    pub objects: Vec<String>,
    /// The input in one line.
    pub input: String,
    pub error: String,
}

/// A command that failed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandError {
    /// When it failed, ms since the epoch.
    pub at_ms: u64,
    /// [`command_name`](clb_executor::command_name).
    pub command: &'static str,
    /// [`command_subject`](clb_executor::command_subject).
    pub subject: String,
    /// The HTTP status, the code and the message, as the log line has them.
    pub error: String,
}

/// One point of the operator page's time series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// ms since the epoch.
    pub at_ms: u64,
    /// The age of the oldest pending operation (0: none pending); `None` before the logic's
    /// figures were first read.
    pub lag_ms: Option<u64>,
    /// Commands finished since the previous sample, by command name.
    pub calls: BTreeMap<&'static str, u64>,
}

/// The operator page's view of everything published, taken under one lock.
#[derive(Clone, Debug)]
pub struct Overview {
    /// When it was taken, ms since the epoch.
    pub now_ms: u64,
    pub status: Status,
    /// Since when the serving version serves (ms since the epoch), in this process.
    pub serving_since_ms: Option<u64>,
    /// See [`Snapshot::state_version`].
    pub state_version: Option<u32>,
    pub probation: Option<clb_sandbox::supervisor::ProbationSnapshot>,
    /// The newest first.
    pub swaps: Vec<SwapRecord>,
    /// The newest first.
    pub quarantined: Vec<QuarantineRecord>,
    /// The newest first.
    pub command_errors: Vec<CommandError>,
    /// [`Metrics::figures`].
    pub figures: Option<(String, TrackerStats, u64)>,
    /// The oldest first.
    pub series: Vec<Sample>,
    /// The admission webhook's last denials, the newest first; `None` without the webhook.
    pub denials: Option<Vec<crate::admission::door::Denial>>,
}

/// Pushes `item` onto a list of at most `cap`, dropping the oldest.
fn push_bounded<T>(list: &mut VecDeque<T>, cap: usize, item: T) {
    while list.len() >= cap {
        list.pop_front();
    }
    list.push_back(item);
}

/// `text` cut at [`MAX_TEXT`] bytes (on a character boundary), marked when cut.
fn bounded_text(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    /// The serving logic's own figures (`tracker.stats`).
    figures: clb_sandbox::figures::Figures,
    /// The serving version's sha256 and since when it serves (ms since the epoch).
    serving_since: Option<(String, u64)>,
    /// The bounded lists of the module documentation, the oldest first.
    swap_history: VecDeque<SwapRecord>,
    quarantined: VecDeque<QuarantineRecord>,
    command_errors: VecDeque<CommandError>,
    series: VecDeque<Sample>,
    /// Commands finished by name, over the process (the names are a fixed set), and their
    /// values at the last sample.
    calls: BTreeMap<&'static str, u64>,
    calls_sampled: BTreeMap<&'static str, u64>,
}

impl Published {
    fn record(&mut self, record: SwapRecord) {
        if let Some(records) = &self.records {
            // A closed receiver (the Event task ended) leaves the record in /status and the logs.
            let _ = records.send(record.clone());
        }
        // A shadow's records are Events; `/status` shows the shadow itself.
        if !record.result.is_shadow() {
            push_bounded(&mut self.swap_history, SWAP_HISTORY, record.clone());
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
    /// Bytes of linear memory of the instance the serving version's tracker runs in
    /// (`clb_guest_memory_bytes`); none before a tracker runs.
    pub guest_memory_bytes: Option<u64>,
    pub inputs: u64,
    /// The candidate in shadow, or the last one (stopped or promoted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<clb_sandbox::supervisor::ShadowStatus>,
    /// The admission webhook's last denials, the newest first (with `--admission-listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_denials: Option<Vec<crate::admission::door::Denial>>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Self::registering(|_| {})
    }

    /// Metrics whose registry `extra` adds to: the admission webhook's counters, in `run`.
    pub fn registering(extra: impl FnOnce(&mut Registry)) -> Arc<Self> {
        let shared = Arc::new(Shared::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SnapshotCollector(shared.clone())));
        let latency = Latency::register(&mut registry);
        extra(&mut registry);
        Arc::new(Self { shared, registry, latency })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.shared.lock()
    }

    /// Shows the counts of the engine's memory creator (one per process; the first one named
    /// stays).
    #[cfg(unix)]
    pub fn track_memories(&self, memories: Arc<clb_sandbox::linear_memory::RecyclingMemories>) {
        let _ = self.shared.memories.set(memories);
    }

    /// Shows the counters of `run`'s leases and backend-pool updater (the first ones named stay).
    pub fn track_run(&self, stats: RunStats) {
        let _ = self.shared.run.set(stats);
    }

    /// Shows the admission webhook's last denials in `/status` and on the page (the first door
    /// named stays).
    pub fn track_door(&self, door: Arc<crate::admission::Door>) {
        let _ = self.shared.door.set(door);
    }

    fn last_denials(&self) -> Option<Vec<crate::admission::door::Denial>> {
        self.shared.door.get().map(|door| door.last_denials())
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
        let serving = snapshot.serving.as_ref().map(|v| &v.sha256);
        if serving != published.serving_since.as_ref().map(|(sha256, _)| sha256) {
            published.serving_since = serving.map(|sha256| (sha256.clone(), epoch_ms()));
        }
        published.last = snapshot;
        for result in rollbacks {
            published.record(SwapRecord::now("supervisor", result));
        }
    }

    /// The serving logic's figures (`tracker.stats`), read at `read_at_ms` (ms since the epoch)
    /// when the logic's clock said `logic_now_ms`: the times in them are moved to the epoch.
    pub fn publish_figures(&self, sha256: &str, mut stats: TrackerStats, read_at_ms: u64, logic_now_ms: u64) {
        for pending in &mut stats.pending {
            pending.oldest_began_ms =
                pending.oldest_began_ms.map(|began| read_at_ms.saturating_sub(logic_now_ms.saturating_sub(began)));
        }
        self.lock().figures.update(sha256, stats, read_at_ms);
    }

    /// The serving logic's last figures: its sha256, the figures (their times in ms since the
    /// epoch) and when they were read (ms since the epoch).
    pub fn figures(&self) -> Option<(String, TrackerStats, u64)> {
        Self::figures_of(&self.lock())
    }

    fn figures_of(published: &Published) -> Option<(String, TrackerStats, u64)> {
        let figures = &published.figures;
        figures.stats.clone().map(|stats| (figures.sha256.clone(), stats, figures.read_at_ms))
    }

    /// Keeps the inputs the supervisor quarantined (its `take_quarantined`) for the page.
    pub fn record_quarantined(&self, quarantined: Vec<clb_sandbox::supervisor::Quarantined>) {
        if quarantined.is_empty() {
            return;
        }
        let at_ms = epoch_ms();
        let mut published = self.lock();
        // Only the last few could be shown anyway: a burst of thousands costs no more.
        let skip = quarantined.len().saturating_sub(QUARANTINE_HISTORY);
        for q in quarantined.into_iter().skip(skip) {
            let objects = q.input.objects();
            let objects =
                objects.iter().take(MAX_OBJECTS).map(|(kind, key)| bounded_text(&format!("{kind} {key}"))).collect();
            let record = QuarantineRecord {
                at_ms,
                version: q.version,
                objects,
                input: bounded_text(&q.input.describe()),
                error: bounded_text(&q.error),
            };
            push_bounded(&mut published.quarantined, QUARANTINE_HISTORY, record);
        }
    }

    /// Keeps a failed command for the page: what it was, about what, and Azure's (or
    /// Kubernetes') answer.
    pub fn record_command_error(&self, command: &'static str, subject: &str, error: &str) {
        let record =
            CommandError { at_ms: epoch_ms(), command, subject: bounded_text(subject), error: bounded_text(error) };
        push_bounded(&mut self.lock().command_errors, COMMAND_ERRORS, record);
    }

    /// Takes one point of the page's time series at `now_ms` (ms since the epoch): the sync
    /// lag as the last figures have it, and the commands finished since the last point.
    pub fn sample(&self, now_ms: u64) {
        let mut published = self.lock();
        let lag_ms = published.figures.stats.as_ref().map(|stats| {
            stats
                .pending
                .iter()
                .filter(|p| p.count > 0)
                .filter_map(|p| p.oldest_began_ms)
                .map(|began| now_ms.saturating_sub(began))
                .max()
                .unwrap_or(0)
        });
        let published = &mut *published;
        let calls = published
            .calls
            .iter()
            .map(|(name, n)| (*name, n - published.calls_sampled.get(name).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        published.calls_sampled = published.calls.clone();
        push_bounded(&mut published.series, SERIES_POINTS, Sample { at_ms: now_ms, lag_ms, calls });
    }

    /// What the operator page shows.
    pub fn overview(&self) -> Overview {
        // One lock: the sections of a page agree with each other.
        let published = self.lock();
        Overview {
            now_ms: epoch_ms(),
            status: Self::status_of(&published),
            serving_since_ms: published.serving_since.as_ref().map(|(_, at)| *at),
            state_version: published.last.state_version,
            probation: published.last.probation,
            swaps: published.swap_history.iter().rev().cloned().collect(),
            quarantined: published.quarantined.iter().rev().cloned().collect(),
            command_errors: published.command_errors.iter().rev().cloned().collect(),
            figures: Self::figures_of(&published),
            series: published.series.iter().cloned().collect(),
            denials: self.last_denials(),
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
        let mut published = self.lock();
        published.lists_pending = true;
        // A new term's tracker starts again: the last one's start-up says nothing of it.
        published.figures.stats = None;
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
        Status { last_denials: self.last_denials(), ..Self::status_of(&self.lock()) }
    }

    fn status_of(published: &Published) -> Status {
        let last = &published.last;
        let version = |v: &VersionSnapshot| VersionRef { version: v.version.clone(), sha256: v.sha256.clone() };
        Status {
            serving: last.serving.is_some(),
            ready: Shared::is_ready(published),
            active: last.serving.as_ref().map(version),
            previous: last.versions.get(1).map(version),
            last_swap: published.last_swap.clone(),
            swaps: published.swaps(),
            rollbacks: last.supervisor.rollbacks,
            quarantined_inputs: last.supervisor.quarantined,
            state_bytes: last.supervisor.last_checkpoint_bytes,
            guest_memory_bytes: last.serving.as_ref().and_then(|v| v.memory_bytes),
            inputs: last.supervisor.inputs,
            shadow: last.shadow.as_ref().map(|shadow| shadow.status()),
            last_denials: None,
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
    /// [`command_name`](clb_executor::command_name) and whether it failed.
    pub fn observe_command(&self, command: &'static str, failed: bool, took: Duration) {
        let result = if failed { "failed" } else { "ok" };
        *self.lock().calls.entry(command).or_default() += 1;
        self.latency
            .commands
            .get_or_create(&vec![("command", command.to_owned()), ("result", result.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// Azure answered a command 429 (throttled), by [`command_name`](clb_executor::command_name).
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
        // The candidate in shadow's beside the serving version's while it runs (a shadow of the
        // serving version itself would repeat its labels: left out).
        let serving_memory =
            last.serving.iter().filter_map(|v| Some((version_labels(v, &[]), i64::try_from(v.memory_bytes?).ok()?)));
        let running = |s: &ShadowStatus| matches!(s.state, ShadowState::InStep | ShadowState::Resyncing);
        let shadow = last.shadow.as_ref().map(|s| s.status()).filter(running);
        let shadow_memory =
            shadow.filter(|s| last.serving.as_ref().is_none_or(|v| v.sha256 != s.sha256)).and_then(|s| {
                Some((vec![("version", s.version), ("sha256", s.sha256)], i64::try_from(s.memory_bytes?).ok()?))
            });
        gauges(
            out,
            "clb_guest_memory_bytes",
            "Bytes of linear memory of the instance the serving version's tracker runs in, and the candidate in shadow's.",
            serving_memory.chain(shadow_memory),
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
        let now_ms = epoch_ms();
        let short: String = published.figures.sha256.chars().take(12).collect();
        let shadow_status = published.last.shadow.as_ref().map(|shadow| shadow.status());
        let shadow = shadow_status.as_ref().and_then(|s| Some((s.figures.as_ref()?, s.sha256.as_str())));
        published.figures.encode(out, &short, now_ms, shadow.as_slice())?;
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
fn encode_shadow(out: &mut DescriptorEncoder<'_>, status: &clb_sandbox::supervisor::ShadowStatus) -> std::fmt::Result {
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
        clb_sandbox::supervisor::ShadowState::InStep => "in-step",
        clb_sandbox::supervisor::ShadowState::Resyncing => "resyncing",
        clb_sandbox::supervisor::ShadowState::Promoted => "promoted",
        clb_sandbox::supervisor::ShadowState::Stopped => "stopped",
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
        "clb_pool_updater_pools",
        "Backend pools the updater made (a local Service's pool that did not exist) or removed (its Service went or moved), also counted as written groups.",
        [("created", &p.pools_created), ("deleted", &p.pools_deleted)]
            .map(|(action, c)| (label("action", action), n(c))),
    )?;
    counters(
        out,
        "clb_pool_updater_failures",
        "Backend-pool updater failures outside a group: the resource lock not taken or not released, an Event not recorded, a local Service that no load balancer may take (once per distinct reason), a pool the recheck could not read.",
        [
            ("lock", &p.lock_failures),
            ("unlock", &p.unlock_failures),
            ("event", &p.event_failures),
            ("placement", &p.placements_refused),
            ("recheck", &p.recheck_failures),
        ]
        .map(|(kind, c)| (label("kind", kind), n(c))),
    )?;
    counters(
        out,
        "clb_pool_updater_recheck_pools",
        "Backend pools a term's recheck (once, after its second tick) found as enqueued (same) or changed by a write the term did not make, or one of its own waiting for a retry (different; put right at the next tick).",
        [("same", &p.recheck_same), ("different", &p.recheck_different)]
            .map(|(result, c)| (label("result", result), n(c))),
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

fn gauges(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, i64)>,
) -> std::fmt::Result {
    family(out, name, help, samples.into_iter().map(|(labels, value)| (labels, ConstGauge::new(value))))
}

fn label(key: &'static str, value: &str) -> Labels {
    vec![(key, value.to_owned())]
}

fn version_labels(version: &VersionSnapshot, extra: &[(&'static str, &str)]) -> Labels {
    let mut labels = vec![("version", version.version.clone()), ("sha256", version.sha256.clone())];
    labels.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    labels
}
