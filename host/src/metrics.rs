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
//!   reconciled), else 503.

use crate::sandbox::Logic;
use crate::supervisor::SupervisorStats;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
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

/// The counters of one logic version, read from its [`GuestStats`](crate::sandbox::GuestStats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionSnapshot {
    pub version: String,
    pub sha256: String,
    pub calls: u64,
    pub fuel_used: u64,
    /// By [`GuestError::kind`](crate::sandbox::GuestError::kind) (`poisoned` and `instantiate`
    /// are counted together as `other`).
    pub failures: BTreeMap<&'static str, u64>,
}

impl VersionSnapshot {
    pub fn of(logic: &Logic) -> Self {
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
}

/// The last published state, and every version ever seen (so swapped-out versions keep their
/// series).
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Published>,
}

#[derive(Default)]
struct Published {
    last: Snapshot,
    /// By sha256.
    versions: BTreeMap<String, VersionSnapshot>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    pub fn publish(&self, snapshot: Snapshot) {
        // A panic elsewhere while holding the lock leaves plain counters behind: still valid.
        let mut published = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for version in &snapshot.versions {
            published.versions.insert(version.sha256.clone(), version.clone());
        }
        published.last = snapshot;
    }

    pub fn healthy(&self) -> bool {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).last.serving.is_some()
    }

    pub fn ready(&self) -> bool {
        let published = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        published.last.ready && published.last.serving.is_some()
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
        family(&mut out, "clb_ready", "gauge", "1 once the tracker has reported idle since it started.");
        sample(&mut out, "clb_ready", "", if last.ready && last.serving.is_some() { 1.0 } else { 0.0 });

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
        for (result, n) in &s.swaps {
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

/// A running `/metrics` server; it stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Listens on `listen` (port 0: any free port) and serves on the current tokio runtime.
    pub async fn start(metrics: Arc<Metrics>, listen: SocketAddr) -> Result<Self, MetricsError> {
        let bind_error = |source| MetricsError::Bind { addr: listen, source };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let task = tokio::spawn(accept_loop(listener, metrics));
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

async fn accept_loop(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "accepting a /metrics connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let metrics = metrics.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&metrics, &request)) }
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

fn handle(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".into());
    }
    match request.uri().path() {
        "/metrics" => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", metrics.render()),
        "/healthz" if metrics.healthy() => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/healthz" => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no logic version serving\n".into()),
        "/readyz" if metrics.ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the tracker has not reported idle since it started\n".into(),
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}
