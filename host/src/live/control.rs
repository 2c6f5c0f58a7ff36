//! Swaps in the running controller (design §7): requests from the HTTP endpoint and the logic
//! sources, carried out by `clb-host run`'s loop, recorded for `/status` and reported as
//! Kubernetes Events.
//!
//! * **One way in.** The [`Supervisor`] serves with `&mut self`, so nothing outside the run loop
//!   may touch it. A [`SwapSender`] (the HTTP endpoint's `POST /swap`, each watched source) sends
//!   a [`SwapRequest`] — a loaded version and where it came from — over a channel that the loop's
//!   `select!` reads ([`Control::next`]); the answer comes back on a oneshot.
//! * **Staged, so inputs wait ~1 ms.** The loop stages the swap ([`Control::begin`]:
//!   [`Supervisor::stage`] hands out the checkpoint) and the state move runs on a blocking
//!   thread ([`Staging::import`](crate::supervisor::Staging::import)) while the old version keeps serving. Its end comes back through
//!   the same [`Control::next`], and [`Control::finish`] switches between two inputs
//!   ([`Supervisor::swap_staged`]: the inputs delivered since the checkpoint replayed into the new
//!   version, then the checks). Watch events that arrive during the switch wait in their streams
//!   and are delivered afterwards, once each, to whichever version then serves. One swap at a
//!   time: while one stages, further requests wait in the channel for their turn.
//! * **Terms.** With leader election a term can end at any moment, the staging in flight with
//!   it. It belongs to the [`Control`], which outlives terms: the next term
//!   ([`Control::start_term`]) drops the stale import and takes that request first, staging it
//!   again against its own supervisor, so the requester gets the answer of the replica that
//!   then leads, as any request still queued does.
//! * **Before the loop.** The sender decompresses gzip or zstd bytes on a blocking thread
//!   ([`crate::compression`], refusing a bad stream with kind `decompress`), refuses a component
//!   whose sha256 — the decompressed one's — differs from the pin (kind `digest`) before anything
//!   compiles it, answers bytes that are the serving version
//!   `unchanged`, and compiles the rest on a blocking thread ([`Loader`]), refusing what does not
//!   load (kind `load`) — so the loop never waits for a compile.
//! * **Records.** Every accepted or refused swap, and every rollback the supervisor does on its
//!   own (seen by [`Metrics::publish`]), becomes a [`SwapRecord`]: the last one is in `/status`,
//!   and each is sent to [`report_events`], which writes one core `v1` Event per record regarding
//!   the well-known ConfigMap ([`EventTarget`]): `LogicSwapped` (Normal), `LogicSwapRefused`,
//!   `LogicRolledBack`, `LogicRollbackFailed` (Warning).

use crate::compression::Compression;
use crate::executor::{KubeApi, KubeError};
use crate::kube::{KubeClient, api_error, error_chain};
use crate::live::metrics::{Metrics, SwapPhase};
use crate::live::swap::{PinError, REFUSED_DECOMPRESS, Sha256Pin, SwapRecord, SwapResult};
use crate::sandbox::bindings::clb::reconciler::types as wit;
use crate::sandbox::{Limits, Loader, Logic, Runtime, sha256_hex};
use crate::supervisor::{Staged, Supervisor, SupervisorError, SwapReport};
use k8s_openapi::api::core::v1::ConfigMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Requests waiting for the loop; a sender beyond it waits for room.
const QUEUE: usize = 8;
/// Event writes tried per record before it is given up on (it stays in the logs and `/status`).
const EVENT_ATTEMPTS: u32 = 4;
const EVENT_BACKOFF: Duration = Duration::from_secs(1);
/// The API server refuses Events whose message is longer (core/v1 with `reportingComponent`).
const MESSAGE_LIMIT: usize = 1024;

/// Why a swap request could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("the run loop is not taking swap requests (it stopped)")]
    LoopGone,
    #[error("loading the component did not finish")]
    LoadAborted(#[source] tokio::task::JoinError),
    #[error("importing the state into the staged version did not finish")]
    ImportAborted(#[source] tokio::task::JoinError),
    #[error("`{0}` does not name an object as NAMESPACE/NAME")]
    BadObject(String),
    #[error("recording the Event {reason} on ConfigMap {namespace}/{name}")]
    Event {
        reason: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: KubeError,
    },
}

/// A loaded version on its way to the run loop, and where the answer goes.
pub struct SwapRequest {
    logic: Logic,
    origin: String,
    reply: oneshot::Sender<SwapResult>,
}

/// The sending side: cloned into the HTTP endpoint and every source. It checks the pin and
/// compiles the component on a blocking thread before the run loop sees anything, so that the
/// loop holds inputs back only for the state move and the self-check.
#[derive(Clone)]
pub struct SwapSender {
    requests: mpsc::Sender<SwapRequest>,
    loader: Loader,
    limits: Limits,
    metrics: Arc<Metrics>,
}

impl SwapSender {
    /// Asks for a swap to `bytes` and waits for the answer.
    pub async fn swap(
        &self,
        bytes: Vec<u8>,
        pin: Option<Sha256Pin>,
        origin: impl Into<String>,
    ) -> Result<SwapResult, ControlError> {
        let origin = origin.into();
        let span = tracing::info_span!("swap", %origin);
        let started = Instant::now();
        let decompressed = tokio::task::spawn_blocking(move || {
            let _origin = span.entered();
            // The sha256 a refusal names: of the bytes as they came, when they are not the component.
            let received = Compression::detect(&bytes).map(|_| sha256_hex(&bytes));
            crate::compression::decompress(bytes).map_err(|error| (error, received.unwrap_or_default()))
        })
        .await
        .map_err(ControlError::LoadAborted)?;
        let bytes = match decompressed {
            Ok(decompressed) => decompressed.bytes,
            Err((error, received)) => {
                return Ok(self.refused_before_the_loop(origin, REFUSED_DECOMPRESS, error_chain(&error), received));
            }
        };
        // The pin, as every sha256 of a version, is of the decompressed component.
        let sha256 = sha256_hex(&bytes);
        if let Some(pin) = pin.filter(|pin| pin.as_str() != sha256) {
            let error = PinError::DigestMismatch { expected: pin.as_str().to_owned(), actual: sha256.clone() };
            return Ok(self.refused_before_the_loop(origin, "digest", error.to_string(), sha256));
        }
        // Spares a compile; the loop checks again against the version serving when it swaps.
        if self.metrics.status().active.is_some_and(|active| active.sha256 == sha256) {
            tracing::info!(%origin, %sha256, "swap asked for the version already serving; nothing to do");
            return Ok(SwapResult::Unchanged { version: sha256[..12].to_owned(), sha256 });
        }
        let (loader, limits) = (self.loader.clone(), self.limits);
        let loaded = tokio::task::spawn_blocking(move || loader.load(&bytes, limits)).await;
        self.metrics.observe_swap_phase(SwapPhase::Load, started.elapsed());
        let logic = match loaded.map_err(ControlError::LoadAborted)? {
            Ok(logic) => logic,
            Err(error) => {
                let reason = error_chain(&SupervisorError::SwapLoad(error));
                return Ok(self.refused_before_the_loop(origin, "load", reason, sha256));
            }
        };
        let (reply, answer) = oneshot::channel();
        self.requests.send(SwapRequest { logic, origin, reply }).await.map_err(|_| ControlError::LoopGone)?;
        answer.await.map_err(|_| ControlError::LoopGone)
    }

    /// A refusal the supervisor never sees: logged, counted and recorded like its own.
    fn refused_before_the_loop(
        &self,
        origin: String,
        kind: &'static str,
        reason: String,
        sha256: String,
    ) -> SwapResult {
        tracing::warn!(%origin, kind, %reason, "swap refused; the running version keeps serving");
        self.metrics.count_refused_before_load(kind);
        let result = SwapResult::Refused { kind: kind.into(), reason, sha256 };
        self.metrics.record_swap(SwapRecord::now(origin, result.clone()));
        result
    }
}

/// The run loop's side: where loaded versions arrive, and the swap staging, if any.
pub struct Control {
    requests: mpsc::Receiver<SwapRequest>,
    metrics: Arc<Metrics>,
    /// The swap whose state move runs off the loop; at most one.
    staging: Option<InFlight>,
    /// A request whose staging a term left unfinished: the next term takes it first.
    again: Option<SwapRequest>,
}

/// A staged swap whose import runs on a blocking thread.
struct InFlight {
    /// The request, its version kept (a [`Logic`] clone is cheap) so that it can be staged again
    /// or swapped whole.
    request: SwapRequest,
    sha256: String,
    import: JoinHandle<Result<Staged<'static>, SupervisorError>>,
    staged_at: Instant,
}

/// What the loop's [`Control::next`] brings.
#[expect(clippy::large_enum_variant, reason = "one per swap request, moved once: boxing would buy nothing")]
pub enum ControlEvent {
    /// A new request: hand it to [`Control::begin`].
    Request(SwapRequest),
    /// The import of the staged swap ended: hand it to [`Control::finish`].
    Imported(Imported),
}

/// The end of a staged swap's import, for [`Control::finish`].
pub struct Imported {
    in_flight: InFlight,
    import: Result<Result<Staged<'static>, SupervisorError>, tokio::task::JoinError>,
}

impl Control {
    /// A control for `run` and the sender its requests come through. New versions are loaded
    /// with `runtime`'s engine under `limits`; the supervisor publishes to `metrics`.
    pub fn new(runtime: &Runtime, limits: Limits, metrics: Arc<Metrics>) -> (Self, SwapSender) {
        let (requests, receiver) = mpsc::channel(QUEUE);
        let sender = SwapSender { requests, loader: runtime.loader(), limits, metrics: metrics.clone() };
        (Self { requests: receiver, metrics, staging: None, again: None }, sender)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Called when a term starts: a staging the last term left is of its supervisor's
    /// checkpoint, which is gone. Its import is dropped (a running one finishes on its thread
    /// and is discarded) and its request is taken again, first, by [`Self::next`].
    pub fn start_term(&mut self) {
        if let Some(in_flight) = self.staging.take() {
            tracing::info!(
                origin = %in_flight.request.origin,
                sha256 = %in_flight.sha256,
                "a swap was staging when the last term ended; staging it again on this term's version"
            );
            in_flight.import.abort();
            self.again = Some(in_flight.request);
        }
    }

    /// Whether a swap is staging (then [`Self::next`] waits for its import, not for requests).
    pub fn is_staging(&self) -> bool {
        self.staging.is_some()
    }

    /// The end of the staging import when one runs, else the next request; pending forever once
    /// every sender is gone (the loop goes on). Cancel safe: nothing is taken unless this
    /// completes. Requests wait in the channel while a swap stages: one swap at a time.
    pub async fn next(&mut self) -> ControlEvent {
        if let Some(request) = self.again.take() {
            return ControlEvent::Request(request);
        }
        if let Some(in_flight) = &mut self.staging {
            let import = (&mut in_flight.import).await;
            let in_flight = self.staging.take().expect("the staging awaited above");
            return ControlEvent::Imported(Imported { in_flight, import });
        }
        match self.requests.recv().await {
            Some(request) => ControlEvent::Request(request),
            None => std::future::pending().await,
        }
    }

    /// What the loop does with [`Self::next`]'s event; the first step of a version that now
    /// serves, as [`Self::finish`] gives it.
    pub fn handle(&mut self, supervisor: &mut Supervisor<'_>, event: ControlEvent, now_ms: u64) -> Option<wit::Step> {
        match event {
            ControlEvent::Request(request) => self.begin(supervisor, request, now_ms),
            ControlEvent::Imported(imported) => self.finish(supervisor, imported, now_ms),
        }
    }

    /// Starts the request's swap: answers `unchanged` for the version serving, else stages it
    /// ([`Supervisor::stage`], cheap) and imports the state on a blocking thread; the loop serves
    /// on. When staging is refused (the supervisor could not take a checkpoint), a plain swap
    /// decides, so that the refusal is the supervisor's own, counted and recorded; then, when
    /// accepted, its first step is returned as [`Self::finish`] returns it.
    pub fn begin(&mut self, supervisor: &mut Supervisor<'_>, request: SwapRequest, now_ms: u64) -> Option<wit::Step> {
        let sha256 = request.logic.info().sha256.clone();
        if supervisor.logic().info().sha256 == sha256 {
            tracing::info!(origin = %request.origin, %sha256, "swap asked for the version already serving; nothing to do");
            let result = SwapResult::Unchanged { version: sha256[..12].to_owned(), sha256 };
            let _ = request.reply.send(result);
            return None;
        }
        match supervisor.stage(request.logic.clone()) {
            Ok(staging) => {
                tracing::info!(origin = %request.origin, %sha256, "staging the swap: the state moves into the new version beside serving");
                let import = tokio::task::spawn_blocking(move || staging.import());
                self.staging = Some(InFlight { request, sha256, import, staged_at: Instant::now() });
                None
            }
            Err(error) => {
                tracing::warn!(origin = %request.origin, %sha256, error = %error_chain(&error), "staging the swap failed; swapping with the whole state move on the loop");
                self.finish_with(supervisor, request, sha256, now_ms, |supervisor, logic, now_ms| {
                    supervisor.swap(logic, now_ms)
                })
            }
        }
    }

    /// Switches to the staged version once its import ended ([`Supervisor::swap_staged`]),
    /// records the result and answers the request. An accepted swap gives the new version's
    /// first step ([`SwapReport::first_step`]): the caller carries it out like any other step,
    /// since the new version holds its commands in flight.
    ///
    /// [`SwapReport::first_step`]: crate::supervisor::SwapReport::first_step
    pub fn finish(&mut self, supervisor: &mut Supervisor<'_>, imported: Imported, now_ms: u64) -> Option<wit::Step> {
        let Imported { in_flight: InFlight { request, sha256, staged_at, .. }, import } = imported;
        let origin = request.origin.clone();
        tracing::debug!(%origin, %sha256, staging = ?staged_at.elapsed(), "the staged version holds the state; switching");
        self.metrics.observe_swap_phase(SwapPhase::Stage, staged_at.elapsed());
        if supervisor.logic().info().sha256 == sha256 {
            // A rollback while staging went back to the very version asked for.
            tracing::info!(%origin, %sha256, "swap asked for the version already serving; nothing to do");
            let _ = request.reply.send(SwapResult::Unchanged { version: sha256[..12].to_owned(), sha256 });
            return None;
        }
        self.finish_with(supervisor, request, sha256, now_ms, move |supervisor, logic, now_ms| match import {
            Ok(Ok(staged)) => supervisor.swap_staged(staged, now_ms),
            Ok(Err(error)) => Err(supervisor.refuse_staged(error)),
            Err(error) => {
                // The import thread panicked or was cancelled: nothing staged; a plain swap
                // decides on the loop.
                let error = ControlError::ImportAborted(error);
                tracing::error!(error = %error_chain(&error), "swapping with the whole state move on the loop instead");
                supervisor.swap(logic, now_ms)
            }
        })
    }

    /// Runs `swap`, records its result and answers the request; the first step when accepted.
    fn finish_with<'s>(
        &self,
        supervisor: &mut Supervisor<'s>,
        request: SwapRequest,
        sha256: String,
        now_ms: u64,
        swap: impl FnOnce(&mut Supervisor<'s>, Logic, u64) -> Result<SwapReport, SupervisorError>,
    ) -> Option<wit::Step> {
        let SwapRequest { logic, origin, reply } = request;
        let mut first_step = None;
        let result = match swap(supervisor, logic, now_ms) {
            Ok(report) => {
                self.metrics.observe_swap_phase(SwapPhase::Switch, report.took);
                let result = SwapResult::accepted(&report, sha256);
                first_step = Some(report.first_step);
                result
            }
            Err(error) => SwapResult::Refused { kind: error.kind().into(), reason: error_chain(&error), sha256 },
        };
        self.metrics.record_swap(SwapRecord::now(origin, result.clone()));
        // A requester that stopped waiting still finds the result in /status and the Event.
        let _ = reply.send(result);
        first_step
    }
}

/// The ConfigMap swap Events regard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventTarget {
    pub namespace: String,
    pub name: String,
}

impl EventTarget {
    /// Where Events go when no ConfigMap source names one.
    pub const DEFAULT: &str = "kube-system/clb-reconciler";

    pub fn parse(text: &str) -> Result<Self, ControlError> {
        match crate::kube::namespaced(text) {
            Some((namespace, name)) => Ok(Self { namespace: namespace.into(), name: name.into() }),
            None => Err(ControlError::BadObject(text.to_owned())),
        }
    }
}

impl std::str::FromStr for EventTarget {
    type Err = ControlError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl std::fmt::Display for EventTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Writes one Event per record until `records` closes. A write that keeps failing is logged and
/// counted (`clb_swap_events_failed_total`); the record stays in the logs and `/status`.
pub async fn report_events(
    kube: KubeClient,
    target: EventTarget,
    metrics: Arc<Metrics>,
    mut records: mpsc::UnboundedReceiver<SwapRecord>,
) {
    while let Some(record) = records.recv().await {
        let Some((reason, event_type, message)) = record.result.event(&record.origin) else { continue };
        let mut attempt = 1;
        loop {
            match emit(&kube, &target, reason, event_type, &message).await {
                Ok(()) => break,
                Err(error) if attempt < EVENT_ATTEMPTS => {
                    tracing::warn!(error = %error_chain(&error), attempt, "recording a swap Event failed; retrying");
                    tokio::time::sleep(EVENT_BACKOFF * attempt).await;
                    attempt += 1;
                }
                Err(error) => {
                    tracing::error!(error = %error_chain(&error), %message, "recording a swap Event failed; giving up");
                    metrics.count_event_failure();
                    break;
                }
            }
        }
    }
}

async fn emit(
    kube: &KubeClient,
    target: &EventTarget,
    reason: &'static str,
    event_type: wit::EventType,
    message: &str,
) -> Result<(), ControlError> {
    let event_error =
        |source| ControlError::Event { reason, namespace: target.namespace.clone(), name: target.name.clone(), source };
    // The UID, when the ConfigMap exists, lets `kubectl describe configmap` find the Event.
    let uid = kube::Api::<ConfigMap>::namespaced(kube.client().clone(), &target.namespace)
        .get_opt(&target.name)
        .await
        .map_err(|e| event_error(api_error(e)))?
        .and_then(|c| c.metadata.uid)
        .unwrap_or_default();
    let regarding = wit::ObjectRef {
        kind: "ConfigMap".into(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        uid,
    };
    let event = wit::Event { regarding, event_type, reason: reason.into(), message: truncate(message, MESSAGE_LIMIT) };
    kube.emit_event(&event).await.map_err(event_error)
}

/// `text` cut to at most `limit` bytes, at a character boundary, marked with `…` when cut.
fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
