//! Swaps in the running controller (docs/design.md §7): requests from the HTTP endpoint and the logic
//! sources, carried out by `clb-host run`'s loop, recorded for `/status` and reported as
//! Kubernetes Events.
//!
//! * **One way in.** The [`Supervisor`] serves with `&mut self`, so nothing outside the run loop
//!   may touch it. A [`SwapSender`] (the HTTP endpoint's `POST /swap`, each watched source) sends
//!   a [`SwapRequest`] — a loaded version and where it came from — over a channel that the loop's
//!   `select!` reads ([`Control::next`]); the answer comes back on a oneshot.
//! * **Staged, so inputs wait ~1 ms.** The loop stages the swap ([`Control::begin`]:
//!   [`Supervisor::stage`] hands out the checkpoint) and the state move runs on a blocking
//!   thread ([`Staging::import`](clb_sandbox::supervisor::Staging::import)) while the old version keeps serving. Its end comes back through
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
//! * **Before the loop.** With `--logic-verify-key`, the sender first refuses bytes no signature
//!   by the key vouches for (kind `signature`: [`Signed`]). It decompresses gzip or zstd bytes on a blocking thread
//!   ([`clb_sandbox::compression`], refusing a bad stream with kind `decompress`), refuses a component
//!   whose sha256 — the decompressed one's — differs from the pin (kind `digest`) before anything
//!   compiles it, answers bytes that are the serving version
//!   `unchanged`, and compiles the rest on a blocking thread ([`Loader`]), refusing what does not
//!   load (kind `load`) — so the loop never waits for a compile.
//! * **Shadows.** A second kind of request, from the shadow's source
//!   ([`SwapSender::for_shadow`]): its version is not swapped in but run in shadow beside the
//!   serving one ([`Supervisor::shadow`], on its own thread; `clb_sandbox::supervisor::shadow`), compared
//!   on every input, with the [`ShadowPolicy`] of `run`. Its first divergence is recorded (an
//!   Event); when its promotion is due, [`Control::next`] brings [`ControlEvent::Promote`] and the
//!   candidate is swapped in by the staged swap above, then serves its probation. The candidate
//!   belongs to the [`Control`], so each new term runs it in shadow again
//!   ([`Control::resume_shadow`]).
//! * **Records.** Every accepted or refused swap, and every rollback the supervisor does on its
//!   own (seen by [`Metrics::publish`]), becomes a [`SwapRecord`]: the last one is in `/status`,
//!   and each is sent to [`report_events`], which writes one core `v1` Event per record regarding
//!   the well-known ConfigMap ([`EventTarget`]): `LogicSwapped` (Normal), `LogicSwapRefused`,
//!   `LogicRolledBack`, `LogicRollbackFailed` (Warning).

use crate::live::metrics::{Metrics, SwapPhase};
use crate::live::swap::{PinError, REFUSED_DECOMPRESS, REFUSED_SIGNATURE, Sha256Pin, Signed, SwapRecord, SwapResult};
use clb_executor::{KubeApi, KubeError};
use clb_kube::{KubeClient, api_error};
use clb_oci::signature::PublicKey;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::compression::Compression;
use clb_sandbox::error_text::error_chain;
use clb_sandbox::supervisor::shadow::SHADOW_QUEUE;
use clb_sandbox::supervisor::{
    ShadowEvent, ShadowOptions, Staged, Supervisor, SupervisorError, SwapReport, version_name,
};
use clb_sandbox::{Limits, LoadedLogic, Loader, Runtime, sha256_hex};
use k8s_openapi::api::core::v1::ConfigMap;
use std::collections::BTreeSet;
use std::path::PathBuf;
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
    logic: LoadedLogic,
    origin: String,
    reply: oneshot::Sender<SwapResult>,
    kind: RequestKind,
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RequestKind {
    /// Serve this version.
    Swap,
    /// Run it in shadow beside the serving version.
    Shadow,
}

/// How `run` treats a candidate in shadow (`--promote-after`, `--shadow-allow`,
/// `--shadow-record`).
#[derive(Clone, Debug, Default)]
pub struct ShadowPolicy {
    pub promote_after: Option<u64>,
    pub allow: BTreeSet<String>,
    pub record: Option<PathBuf>,
}

/// The divergence kinds a shadow counts, besides the command names ([`clb_executor::command_name`]).
pub const SHADOW_STEP_KINDS: [&str; 3] = ["command-order", "wake-at", "idle"];

/// The kinds `--shadow-allow` may name.
pub fn shadow_kinds() -> impl Iterator<Item = &'static str> {
    clb_sandbox::COMMAND_NAMES.into_iter().chain(SHADOW_STEP_KINDS)
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
    kind: RequestKind,
    /// When set (`--logic-verify-key`), only versions signed by this key are taken.
    verify: Option<Arc<PublicKey>>,
}

impl SwapSender {
    /// The same sender, taking only versions signed by `key` (from every source, and `POST
    /// /swap`); `None` takes every version.
    pub fn verifying(self, key: Option<PublicKey>) -> Self {
        Self { verify: key.map(Arc::new), ..self }
    }

    /// The key versions must be signed by, if any: an OCI source checks its registry's signatures
    /// with it, the others look for a detached signature beside the component.
    pub fn verify_key(&self) -> Option<&PublicKey> {
        self.verify.as_deref()
    }

    /// The same sender, asking for a shadow instead of a swap (the shadow's source).
    pub fn for_shadow(&self) -> Self {
        Self { kind: RequestKind::Shadow, ..self.clone() }
    }

    /// Whether it asks for shadows.
    pub fn is_shadow(&self) -> bool {
        self.kind == RequestKind::Shadow
    }

    /// Asks for a swap to `bytes` and waits for the answer. With a key ([`Self::verifying`]),
    /// `signed` must vouch for the bytes as they came, else they are refused with kind
    /// `signature` before anything else is done with them.
    pub async fn swap(
        &self,
        bytes: Vec<u8>,
        signed: Signed,
        pin: Option<Sha256Pin>,
        origin: impl Into<String>,
    ) -> Result<SwapResult, ControlError> {
        let origin = origin.into();
        let span = tracing::info_span!("swap", %origin);
        let started = Instant::now();
        let key = self.verify.clone();
        let decompressed = tokio::task::spawn_blocking(move || {
            let _origin = span.entered();
            // The signature is of the bytes as they came (`cosign sign-blob` of the file).
            if let Some(refusal) = key.and_then(|key| signed.refusal(&key, &bytes)) {
                return Err((REFUSED_SIGNATURE, refusal, sha256_hex(&bytes)));
            }
            // The sha256 a refusal names: of the bytes as they came, when they are not the component.
            let received = Compression::detect(&bytes).map(|_| sha256_hex(&bytes));
            clb_sandbox::compression::decompress(bytes)
                .map_err(|error| (REFUSED_DECOMPRESS, error_chain(&error), received.unwrap_or_default()))
        })
        .await
        .map_err(ControlError::LoadAborted)?;
        let bytes = match decompressed {
            Ok(decompressed) => decompressed.bytes,
            Err((kind, reason, received)) => return Ok(self.refused_before_the_loop(origin, kind, reason, received)),
        };
        // The pin, as every sha256 of a version, is of the decompressed component.
        let sha256 = sha256_hex(&bytes);
        if let Some(pin) = pin.filter(|pin| pin.as_str() != sha256) {
            let error = PinError::DigestMismatch { expected: pin.as_str().to_owned(), actual: sha256.clone() };
            return Ok(self.refused_before_the_loop(origin, "digest", error.to_string(), sha256));
        }
        // Spares a compile; the loop checks again against the version serving when it swaps. A
        // shadow of the serving version is allowed: a check of the shadow itself.
        if self.kind == RequestKind::Swap && self.metrics.status().active.is_some_and(|active| active.sha256 == sha256)
        {
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
        let request = SwapRequest { logic, origin, reply, kind: self.kind };
        self.requests.send(request).await.map_err(|_| ControlError::LoopGone)?;
        answer.await.map_err(|_| ControlError::LoopGone)
    }

    /// A source that gave no component (unreadable, a registry down: kind `source`; unsigned:
    /// `signature`): recorded as a refused swap, so that it is an Event and counted, and the
    /// version serving keeps serving.
    pub fn source_failed(&self, origin: String, kind: &'static str, reason: String) -> SwapResult {
        self.refused_before_the_loop(origin, kind, reason, String::new())
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
    shadow_policy: ShadowPolicy,
    /// The candidate in shadow and where it came from, run again by each new term.
    shadow: Option<(LoadedLogic, String)>,
    /// A shadow's promotion became due (sent from its thread).
    promotions: (mpsc::UnboundedSender<()>, mpsc::UnboundedReceiver<()>),
}

/// A staged swap whose import runs on a blocking thread.
struct InFlight {
    /// The request, its version kept (a [`LoadedLogic`] clone is cheap) so that it can be staged again
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
    /// The shadow's promotion is due: swap it in.
    Promote,
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
        let sender = SwapSender {
            requests,
            loader: runtime.loader(),
            limits,
            metrics: metrics.clone(),
            kind: RequestKind::Swap,
            verify: None,
        };
        let control = Self {
            requests: receiver,
            metrics,
            staging: None,
            again: None,
            shadow_policy: ShadowPolicy::default(),
            shadow: None,
            promotions: mpsc::unbounded_channel(),
        };
        (control, sender)
    }

    /// How candidates in shadow are run and promoted.
    pub fn with_shadow_policy(mut self, policy: ShadowPolicy) -> Self {
        self.shadow_policy = policy;
        self
    }

    /// At the start of a term, once its supervisor started: runs the candidate in shadow again.
    pub fn resume_shadow(&mut self, supervisor: &mut Supervisor<'_>) {
        let Some((logic, origin)) = self.shadow.clone() else { return };
        if let Err(error) = self.attach_shadow(supervisor, logic, &origin) {
            tracing::error!(%origin, error = %error_chain(&error), "the candidate cannot run in shadow on this term");
        }
    }

    fn attach_shadow(
        &self,
        supervisor: &mut Supervisor<'_>,
        logic: LoadedLogic,
        origin: &str,
    ) -> Result<clb_sandbox::supervisor::ShadowHandle, clb_sandbox::supervisor::ShadowError> {
        let (metrics, promotions, origin) = (self.metrics.clone(), self.promotions.0.clone(), origin.to_owned());
        let on_event = move |event: ShadowEvent| match event {
            ShadowEvent::FirstDivergence(status) => {
                metrics.record_swap(SwapRecord::now(origin.clone(), SwapResult::shadow_diverged(&status)));
            }
            ShadowEvent::PromotionDue(_) => {
                // A closed channel: the loop is gone, and the promotion with it.
                let _ = promotions.send(());
            }
        };
        let policy = &self.shadow_policy;
        let options = ShadowOptions {
            promote_after: policy.promote_after,
            allow: policy.allow.clone(),
            record: policy.record.clone(),
            queue: Some(SHADOW_QUEUE),
            on_event: Some(Arc::new(on_event)),
        };
        supervisor.shadow(logic, options)
    }

    /// Runs the request's version in shadow, replacing any candidate in shadow.
    fn start_shadow(&mut self, supervisor: &mut Supervisor<'_>, request: SwapRequest) {
        let SwapRequest { logic, origin, reply, .. } = request;
        let sha256 = logic.info().sha256.clone();
        let result = match self.attach_shadow(supervisor, logic.clone(), &origin) {
            Ok(handle) => {
                let status = handle.status();
                self.shadow = Some((logic, origin.clone()));
                SwapResult::ShadowStarted { version: status.version, sha256, promote_after: status.promote_after }
            }
            Err(error) => {
                tracing::error!(%origin, error = %error_chain(&error), "the candidate cannot run in shadow");
                SwapResult::Refused { kind: "shadow".into(), reason: error_chain(&error), sha256 }
            }
        };
        self.metrics.record_swap(SwapRecord::now(origin, result.clone()));
        let _ = reply.send(result);
    }

    /// The shadow's promotion: its candidate swapped in by the staged swap, as a request would be.
    fn promote(&mut self, supervisor: &mut Supervisor<'_>, now_ms: u64) -> Option<wit::Step> {
        let clean = supervisor.shadow_handle().map(|h| h.status().clean).unwrap_or_default();
        // A stale signal (the shadow was replaced since) finds no promotion due.
        let logic = supervisor.take_promotion()?;
        let origin = match self.shadow.take() {
            Some((_, origin)) => format!("shadow promotion after {clean} clean inputs ({origin})"),
            None => format!("shadow promotion after {clean} clean inputs"),
        };
        tracing::info!(%origin, sha256 = %logic.info().sha256, "promoting the candidate in shadow");
        // Nobody waits for the answer: it goes to /status and the Event.
        let (reply, _) = oneshot::channel();
        self.begin(supervisor, SwapRequest { logic, origin, reply, kind: RequestKind::Swap }, now_ms)
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
        // Waiting promotions are taken first; both channels are cancel safe.
        tokio::select! {
            biased;
            Some(()) = self.promotions.1.recv() => ControlEvent::Promote,
            Some(request) = self.requests.recv() => ControlEvent::Request(request),
            else => std::future::pending().await,
        }
    }

    /// What the loop does with [`Self::next`]'s event; the first step of a version that now
    /// serves, as [`Self::finish`] gives it.
    pub fn handle(&mut self, supervisor: &mut Supervisor<'_>, event: ControlEvent, now_ms: u64) -> Option<wit::Step> {
        match event {
            ControlEvent::Request(request) => self.begin(supervisor, request, now_ms),
            ControlEvent::Imported(imported) => self.finish(supervisor, imported, now_ms),
            ControlEvent::Promote => self.promote(supervisor, now_ms),
        }
    }

    /// Answers `request` without a supervisor, for a host whose versions only judge
    /// (`clb-host admission`): `serving` is the version judging now, and `adopt` takes the new one
    /// or says why not (kind `config`: it refuses the configuration). Logged and answered as a
    /// swap is; nothing to stage, as no state moves.
    pub fn adopt(
        &self,
        request: SwapRequest,
        serving: &LoadedLogic,
        adopt: impl FnOnce(&LoadedLogic) -> Result<(), String>,
    ) {
        let SwapRequest { logic, origin, reply, .. } = request;
        let sha256 = logic.info().sha256.clone();
        let result = if serving.info().sha256 == sha256 {
            SwapResult::Unchanged { version: version_name(&logic), sha256 }
        } else {
            match adopt(&logic) {
                Ok(()) => {
                    tracing::info!(%origin, from = %version_name(serving), to = %version_name(&logic), "the new version judges from the next request on");
                    SwapResult::Adopted { from: version_name(serving), to: version_name(&logic), sha256 }
                }
                Err(reason) => {
                    tracing::warn!(%origin, %reason, "the new version refused; the running version keeps judging");
                    SwapResult::Refused { kind: "config".into(), reason, sha256 }
                }
            }
        };
        self.metrics.record_swap(SwapRecord::now(origin, result.clone()));
        let _ = reply.send(result);
    }

    /// Starts the request's swap: answers `unchanged` for the version serving, else stages it
    /// ([`Supervisor::stage`], cheap) and imports the state on a blocking thread; the loop serves
    /// on. When staging is refused (the supervisor could not take a checkpoint), a plain swap
    /// decides, so that the refusal is the supervisor's own, counted and recorded; then, when
    /// accepted, its first step is returned as [`Self::finish`] returns it.
    pub fn begin(&mut self, supervisor: &mut Supervisor<'_>, request: SwapRequest, now_ms: u64) -> Option<wit::Step> {
        if request.kind == RequestKind::Shadow {
            self.start_shadow(supervisor, request);
            return None;
        }
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
    /// [`SwapReport::first_step`]: clb_sandbox::supervisor::SwapReport::first_step
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
        swap: impl FnOnce(&mut Supervisor<'s>, LoadedLogic, u64) -> Result<SwapReport, SupervisorError>,
    ) -> Option<wit::Step> {
        let SwapRequest { logic, origin, reply, .. } = request;
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
        match clb_executor::records::namespaced(text) {
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
