//! What an operator scrapes: `/metrics` (Prometheus text exposition, format 0.0.4), `/healthz`
//! and `/readyz`, on a small hyper server (design §7: metrics per call labelled by logic version).
//!
//! The [`Supervisor`](crate::supervisor::Supervisor) serves with `&mut self`, so a scrape cannot
//! ask it; instead it publishes a [`Snapshot`] into [`Metrics`] after every call (a mutex and a
//! few small copies, nothing next to a guest call), and the server renders the last one. The
//! guest's own counters are atomics shared with the [`Logic`]; the snapshot reads them.
//!
//! * Per version (`version` = the first 12 hex digits of the component's sha256, `sha256` = all
//!   of it): calls, fuel used, failures by kind. A version stays in the exposition after it is
//!   swapped out, at its last values, so its counters never go backwards.
//! * The supervisor's counters (inputs, recoveries, quarantined inputs, checkpoints and their
//!   bytes, swaps by result, rollbacks, the state size) are totals over the process; they carry
//!   the labels of the version serving at the scrape.
//! * `/healthz` is 200 while a version serves (the tracker is running), else 503. `/readyz` is
//!   200 once the tracker has reported `idle` at least once since it started (the first lists are
//!   reconciled) — and, under `clb-host run` ([`Metrics::await_lists`]), once the watchers'
//!   initial lists have been delivered — else 503.
//! * `/status` is JSON for people and scripts: the serving version and the one a rollback would
//!   return to, the last swap result ([`SwapRecord`]), swaps by result, quarantined inputs, the
//!   state size. A rollback the supervisor does on its own is noticed here, when the snapshot
//!   after it is published, and recorded like a swap.
//! * `POST /swap` (only with an [`Admin`]): the body is a component, gzip- or zstd-compressed or
//!   not ([`crate::compression`]); the optional header [`SHA256_HEADER`] pins the digest of the
//!   decompressed component. Accepted only from a loopback peer, or — when the admin
//!   has a token — from any peer presenting `Authorization: Bearer <token>`. The request goes to
//!   the run loop through the [`SwapSender`]; the answer is a [`SwapResult`] as JSON: 200 when
//!   accepted or unchanged, 409 when refused, 400 when refused as compressed bytes that give no
//!   component (kind `decompress`).

use crate::compression::MAX_COMPONENT_BYTES;
use crate::control::SwapSender;
use crate::swap::{REFUSED_DECOMPRESS, Sha256Pin, SwapRecord, SwapResult};
use crate::supervisor::{ROLLBACK_AFTER, Snapshot, VersionSnapshot};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("listening for /metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
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
    memories: std::sync::OnceLock<Arc<crate::linear_memory::RecyclingMemories>>,
    /// `run`'s leases and backend-pool updater, once [`Self::track_run`] names them.
    run: std::sync::OnceLock<crate::run::RunStats>,
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
    pub fn track_memories(&self, memories: Arc<crate::linear_memory::RecyclingMemories>) {
        let _ = self.memories.set(memories);
    }

    /// Shows the counters of `run`'s leases and backend-pool updater (the first ones named stay).
    pub fn track_run(&self, stats: crate::run::RunStats) {
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

    fn count_denied(&self) {
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
fn render_run(out: &mut String, run: &crate::run::RunStats) {
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
        family(out, "clb_trace_lines_total", "counter", "Trace lines (run --record) written, or dropped (a full queue or disk).");
        sample(out, "clb_trace_lines_total", r#"result="written""#, n(&t.lines_written));
        sample(out, "clb_trace_lines_total", r#"result="dropped""#, n(&t.lines_dropped));
        family(out, "clb_trace_bytes_total", "counter", "Bytes written to trace files.");
        sample(out, "clb_trace_bytes_total", "", n(&t.bytes_written));
        family(out, "clb_trace_write_errors_total", "counter", "Trace files that could not be opened, written or flushed.");
        sample(out, "clb_trace_write_errors_total", "", n(&t.write_errors));
        family(out, "clb_trace_files_total", "counter", "Trace files started (the first one, and one per rotation or loss).");
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

/// The header of `POST /swap` that pins the component's sha256.
pub const SHA256_HEADER: &str = "x-clb-sha256";

/// What `POST /swap` needs: where requests go, and who may send them.
#[derive(Clone)]
pub struct Admin {
    pub swaps: SwapSender,
    /// When set, any peer presenting it as a bearer token may swap; else only loopback peers.
    pub token: Option<String>,
}

/// A running `/metrics` server; it stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Listens on `listen` (port 0: any free port) and serves on the current tokio runtime.
    pub async fn start(metrics: Arc<Metrics>, listen: SocketAddr) -> Result<Self, MetricsError> {
        Self::start_with_admin(metrics, listen, None).await
    }

    /// The same, and `POST /swap` when `admin` is given.
    pub async fn start_with_admin(
        metrics: Arc<Metrics>,
        listen: SocketAddr,
        admin: Option<Admin>,
    ) -> Result<Self, MetricsError> {
        let bind_error = |source| MetricsError::Bind { addr: listen, source };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let task = tokio::spawn(accept_loop(listener, metrics, admin));
        Ok(Self { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, admin: Option<Admin>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "accepting a /metrics connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (metrics, admin) = (metrics.clone(), admin.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (metrics, admin) = (metrics.clone(), admin.clone());
                async move { Ok::<_, std::convert::Infallible>(handle(&metrics, admin.as_ref(), peer, request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(error) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(%error, "a /metrics connection ended with an error");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
}

async fn handle(
    metrics: &Metrics,
    admin: Option<&Admin>,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let text = "text/plain";
    match (request.method(), request.uri().path()) {
        (&Method::POST, "/swap") => match admin {
            Some(admin) => swap(metrics, admin, peer, request).await,
            None => reply(StatusCode::NOT_FOUND, text, "this endpoint takes no swaps\n".into()),
        },
        (&Method::GET, "/metrics") => {
            reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", metrics.render())
        }
        (&Method::GET, "/healthz") if metrics.healthy() => reply(StatusCode::OK, text, "ok\n".into()),
        (&Method::GET, "/healthz") => reply(StatusCode::SERVICE_UNAVAILABLE, text, "no logic version serving\n".into()),
        (&Method::GET, "/readyz") if metrics.ready() => reply(StatusCode::OK, text, "ready\n".into()),
        (&Method::GET, "/readyz") => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            text,
            "the initial lists are not delivered, or the tracker has not reported idle since it started\n".into(),
        ),
        (&Method::GET, "/status") => json(StatusCode::OK, &metrics.status()),
        (&Method::GET, _) => reply(StatusCode::NOT_FOUND, text, "not found\n".into()),
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, text, "only GET, and POST /swap\n".into()),
    }
}

/// `POST /swap`; see the module documentation.
async fn swap(metrics: &Metrics, admin: &Admin, peer: SocketAddr, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let text = "text/plain";
    let authorization = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Err(why) = admitted(admin.token.as_deref(), peer, authorization) {
        metrics.count_denied();
        tracing::warn!(%peer, "a swap request was denied: {why}");
        return after_body(request, reply(StatusCode::FORBIDDEN, text, format!("{why}\n"))).await;
    }
    let pin = match request.headers().get(SHA256_HEADER).map(|v| v.to_str().unwrap_or_default()) {
        None => None,
        Some(value) => match Sha256Pin::parse(value) {
            Ok(pin) => Some(pin),
            Err(error) => {
                let refusal = reply(StatusCode::BAD_REQUEST, text, format!("{SHA256_HEADER}: {error}\n"));
                return after_body(request, refusal).await;
            }
        },
    };
    let bytes = match Limited::new(request.into_body(), MAX_COMPONENT_BYTES).collect().await {
        Ok(body) => body.to_bytes().to_vec(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                text,
                format!("a component may be at most {MAX_COMPONENT_BYTES} bytes\n"),
            );
        }
        Err(error) => return reply(StatusCode::BAD_REQUEST, text, format!("reading the body: {error}\n")),
    };
    match admin.swaps.swap(bytes, pin, format!("endpoint {peer}")).await {
        Ok(result) => {
            let status = match &result {
                // Compressed, but not a component: the request is wrong, not the version.
                SwapResult::Refused { kind, .. } if kind == REFUSED_DECOMPRESS => StatusCode::BAD_REQUEST,
                SwapResult::Refused { .. } => StatusCode::CONFLICT,
                _ => StatusCode::OK,
            };
            json(status, &result)
        }
        Err(error) => reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("{error}\n")),
    }
}

/// Whether a `POST /swap` from `peer` carrying `authorization` is taken; else why not.
fn admitted(token: Option<&str>, peer: SocketAddr, authorization: Option<&str>) -> Result<(), &'static str> {
    match token {
        Some(token) => match authorization.and_then(|a| a.strip_prefix("Bearer ")) {
            Some(presented) if same_secret(presented, token) => Ok(()),
            _ => Err("POST /swap needs the admin token (Authorization: Bearer ...)"),
        },
        None if peer.ip().is_loopback() => Ok(()),
        None => Err("POST /swap is taken only from loopback (or with an admin token, see --admin-token-file)"),
    }
}

/// Compares without stopping at the first difference, so the time taken says nothing of the
/// token.
fn same_secret(presented: &str, token: &str) -> bool {
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_string_pretty(value) {
        Ok(body) => reply(status, "application/json", body + "\n"),
        Err(error) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("encoding JSON: {error}\n")),
    }
}

/// `answer`, once the request's body (at most a component's worth) has been read and dropped.
/// Answering a refused upload before reading it closes the connection under a client that is
/// still sending, which then sees a broken pipe instead of the refusal (regression: the admin
/// token test failed this way once the next guest passed ~800 KB).
async fn after_body(request: Request<Incoming>, answer: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let _ = Limited::new(request.into_body(), MAX_COMPONENT_BYTES).collect().await;
    answer
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::admitted;

    #[test]
    fn swap_requests_are_taken_from_loopback_or_with_the_token_and_from_nowhere_else() {
        let (local, local6, remote) =
            ("127.0.0.1:40000".parse().unwrap(), "[::1]:40000".parse().unwrap(), "10.0.0.7:40000".parse().unwrap());
        let cases = [
            (None, local, None, true),
            (None, local6, None, true),
            (None, remote, None, false),
            (None, remote, Some("Bearer anything"), false),
            (Some("s3cret"), remote, Some("Bearer s3cret"), true),
            (Some("s3cret"), local, None, false),
            (Some("s3cret"), local, Some("Bearer s3cre"), false),
            (Some("s3cret"), local, Some("Bearer s3cretx"), false),
            (Some("s3cret"), remote, Some("s3cret"), false),
        ];
        for (token, peer, authorization, expected) in cases {
            assert_eq!(admitted(token, peer, authorization).is_ok(), expected, "{token:?} {peer} {authorization:?}");
        }
    }
}
