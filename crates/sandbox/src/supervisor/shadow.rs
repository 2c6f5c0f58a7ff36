//! The live shadow: a candidate version beside the serving one, given every input the serving
//! tracker takes, its answers compared with the serving version's, and nothing it asks for
//! carried out (docs/operations.md, "Canary a version by shadow").
//!
//! * **Fed by the supervisor, heard by nobody.** Each input the serving tracker journals goes to
//!   the shadow with the step the serving version answered ([`Supervisor::shadow`]); quarantined
//!   inputs do not, as the serving state never took them. The candidate's steps are compared and
//!   dropped: nothing else ever sees them, so a shadow writes nothing to Azure or Kubernetes.
//! * **In step, compared.** The candidate starts from the serving version's state and is then
//!   asked what the serving version was asked. For each input its step is compared with the
//!   serving version's: the commands by content (their ids aside), and `wake-at-ms` and `idle`.
//!   A command only one side proposes is a **divergence** of that command's kind
//!   ([`command_name`]); the same commands given other ids, `command-order`; the others
//!   `wake-at` and `idle`.
//! * **Resync.** After a divergence the candidate holds another state than the serving version
//!   (even an extra Event moves its command ids), so it is brought back in step: the serving
//!   version's state as it stands after that input — rebuilt from the supervisor's checkpoint and
//!   journal on the shadow's side, never exported on the serving path — is imported into a fresh
//!   candidate. One difference is thereby counted once, not at every input after it. Inputs that
//!   come while it is out of step are not compared (counted as `resyncing`). A candidate that
//!   traps (a panic, its fuel, its deadline) is counted and resynced the same way; so is one that
//!   fell behind (`behind`: the queue to its thread was full, an input was dropped), one whose
//!   serving version changed (`serving-changed`: a swap or a rollback), and, with `--shadow-record`,
//!   one that compared [`REBASE_AFTER`] inputs since its last resync (`rebase`: the divergence
//!   trace starts at a resync, so it stays bounded).
//! * **Off the serving path.** In `run` the candidate runs on its own thread behind a bounded
//!   queue ([`SHADOW_QUEUE`]); the serving side clones the input (its payload is shared) and the
//!   step, and never waits: a full queue drops the input. In `simulate` the candidate runs after
//!   each input on the same thread, so that its counts are deterministic.
//! * **Promotion.** With `promote_after` N, once the candidate has compared N inputs in a row with
//!   no divergence — or only divergences of the kinds allowed — the promotion is due
//!   ([`ShadowHandle::promotion_due`], [`ShadowEvent::PromotionDue`]); the caller swaps it in by the
//!   normal swap, and it then serves its probation. A divergence of another kind starts the
//!   count again.
//! * **At the door too.** The admission webhook served by `run` asks the candidate each
//!   AdmissionReview's verdict after the serving version answered it ([`ShadowHandle::admit_service`]):
//!   a different verdict (or warnings) is a divergence of kind [`ADMISSION`], held against a promotion like a
//!   step's, though a verdict is no input and is not counted towards one.
//! * **Evidence.** With a record folder, each divergence is written as a trace (docs/traces.md):
//!   the serving version's state at the last resync imported, then every input since with the
//!   serving version's answers. `clb-host replay` of it is identical on the serving version and,
//!   with `--component` the candidate, differs at its last call.

mod compare;

pub use compare::{Answer, Divergence, differences};

use super::instance::{Input, Running, guest, record_input};
use crate::LoadedLogic;
use crate::bindings::clb::reconciler::types as wit;
use crate::bindings::exports::clb::reconciler::validation::Admission;
use crate::trace::{ComponentRef, Ended, RecordOptions, Recorder, Signatures, lazy};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

/// Inputs waiting for a candidate's thread at most (`run`); past it the candidate is behind.
pub const SHADOW_QUEUE: usize = 1_024;
/// Compared inputs kept for a divergence trace before the candidate is resynced to start a new
/// one (only with a record folder).
pub const REBASE_AFTER: usize = 4_096;
/// Divergence traces written at most by one shadow.
pub const MAX_DIVERGENCE_TRACES: u64 = 100;
/// The divergence kind of an AdmissionReview the candidate judged differently
/// ([`ShadowHandle::admit_service`]).
pub const ADMISSION: &str = "admission";
/// Syncs that fail in a row before the shadow stops (the candidate refuses the serving state).
const MAX_FAILED_SYNCS: u32 = 3;

/// Why the candidate is (re)started from the serving version's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resync {
    Start,
    ServingChanged,
    Divergence,
    Trap,
    Behind,
    Rebase,
}

impl Resync {
    pub fn as_str(self) -> &'static str {
        match self {
            Resync::Start => "start",
            Resync::ServingChanged => "serving-changed",
            Resync::Divergence => "divergence",
            Resync::Trap => "trap",
            Resync::Behind => "behind",
            Resync::Rebase => "rebase",
        }
    }
}

/// What a shadow is told to do besides comparing.
#[derive(Clone, Default)]
pub struct ShadowOptions {
    /// Promote after this many compared inputs in a row without a divergence (of a kind not
    /// allowed).
    pub promote_after: Option<u64>,
    /// Divergence kinds that do not hold a promotion back (`emit-event` for a reworded Event).
    pub allow: BTreeSet<String>,
    /// Where each divergence is written as a trace.
    pub record: Option<PathBuf>,
    /// Run the candidate on its own thread behind a queue of this many inputs (`run`); `None`:
    /// after each input on the caller's thread (`simulate`).
    pub queue: Option<usize>,
    /// Told of the first divergence and of a promotion that is due (on the candidate's thread).
    pub on_event: Option<Arc<dyn Fn(ShadowEvent) + Send + Sync>>,
}

/// What a shadow tells [`ShadowOptions::on_event`].
#[derive(Clone, Debug)]
pub enum ShadowEvent {
    /// The candidate diverged for the first time.
    FirstDivergence(ShadowStatus),
    /// It compared enough clean inputs: swap it in.
    PromotionDue(ShadowStatus),
}

/// Where a shadow is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShadowState {
    /// Its state is the serving version's; inputs are compared.
    InStep,
    /// Waiting for the serving version's state.
    Resyncing,
    /// Swapped in (or its swap was tried): no longer a shadow.
    Promoted,
    /// Stopped, by request or because it cannot be kept in step (`stopped` says why).
    Stopped,
}

/// What `/status` shows of a shadow, and what `/metrics` counts.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowStatus {
    pub version: String,
    pub sha256: String,
    pub state: ShadowState,
    /// Inputs compared.
    pub compared: u64,
    /// Compared in a row without a divergence of a kind not allowed: a promotion's count.
    pub clean: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promote_after: Option<u64>,
    /// Inputs not compared because the candidate was out of step.
    pub resyncing: u64,
    /// AdmissionReviews both versions judged ([`ShadowHandle::admit_service`]): not inputs, so
    /// neither in `compared` nor in a promotion's count.
    pub admissions: u64,
    /// Divergences by kind.
    pub divergences: BTreeMap<String, u64>,
    /// Resyncs by reason ([`Resync::as_str`]).
    pub resyncs: BTreeMap<&'static str, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_divergence: Option<Divergence>,
    /// Divergence traces written to the record folder.
    pub traces_written: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The candidate's own figures (`tracker.stats`), read at most once a second before an
    /// input: `/metrics` shows them under its version beside the serving one's.
    #[serde(skip)]
    pub figures: Option<wit::TrackerStats>,
    /// Bytes of the linear memory of the instance the candidate's tracker runs in, read with
    /// its figures: a shadow holds a second guest's memory beside the serving one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// What both sides of a shadow share: its status, a resync it asks for, whether its promotion
/// is due, and the candidate itself.
struct Shared {
    candidate: LoadedLogic,
    status: Mutex<ShadowStatus>,
    /// A resync the candidate's side asks the serving side for.
    wanted: Mutex<Option<Resync>>,
    promotion_due: AtomicBool,
    /// Feeds sent to the candidate's thread and not yet taken: the serving side builds no
    /// resync (a copy of the journal) for a queue that has no room for it.
    queued: AtomicUsize,
    /// Whether it has diverged yet: only the first divergence is told.
    diverged: AtomicBool,
    /// How it is judged: the allowed kinds, the promotion's count, the record folder, who is told.
    /// Shared, because a divergence may be found on either side: a step's on the candidate's
    /// thread, an admission verdict's by the webhook ([`ShadowHandle::admit_service`]).
    options: ShadowOptions,
}

impl Shared {
    fn status(&self) -> std::sync::MutexGuard<'_, ShadowStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn want(&self, reason: Resync) {
        self.wanted.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(reason);
    }

    fn take_wanted(&self) -> Option<Resync> {
        self.wanted.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Counts `divergence`, holds the promotion back unless its kinds are allowed, and tells
    /// the first one. `input`: whether it was one of the tracker's inputs, which a promotion
    /// counts (an admission verdict is not).
    fn diverged(&self, divergence: Divergence, input: bool) {
        let allowed = divergence.kinds.iter().all(|kind| self.options.allow.contains(kind));
        tracing::warn!(input = %divergence.input, kinds = %divergence.kinds.join(","), allowed, "the candidate diverged from the serving version");
        let first = {
            let mut status = self.status();
            if input {
                status.compared += 1;
            } else {
                status.admissions += 1;
            }
            for kind in &divergence.kinds {
                *status.divergences.entry(kind.clone()).or_default() += 1;
            }
            status.clean = match (allowed, input) {
                (false, _) => 0,
                (true, true) => status.clean + 1,
                (true, false) => status.clean,
            };
            status.last_divergence = Some(divergence);
            (!self.diverged.swap(true, Ordering::Relaxed)).then(|| status.clone())
        };
        if let (Some(status), Some(on_event)) = (first, &self.options.on_event) {
            on_event(ShadowEvent::FirstDivergence(status));
        }
        self.check_promotion();
    }

    fn check_promotion(&self) {
        let Some(after) = self.options.promote_after else { return };
        let status = self.status().clone();
        if status.clean >= after && !self.promotion_due.swap(true, Ordering::Relaxed) {
            tracing::info!(candidate = %status.version, clean = status.clean, "the candidate compared enough inputs without a divergence; its promotion is due");
            if let Some(on_event) = &self.options.on_event {
                on_event(ShadowEvent::PromotionDue(status));
            }
        }
    }

    /// Where the next divergence trace goes, if there is a record folder and room for one.
    fn next_trace(&self) -> Option<PathBuf> {
        let dir = self.options.record.as_ref()?;
        let status = self.status();
        if status.traces_written >= MAX_DIVERGENCE_TRACES {
            return None;
        }
        Some(dir.join(format!("shadow-{}-divergence-{:04}.jsonl", status.version, status.traces_written + 1)))
    }

    /// Starts the trace at `path` as `serving` recorded it; counted once written.
    fn start_trace(&self, path: &std::path::Path, serving: &LoadedLogic) -> Option<Arc<Recorder>> {
        let version = self.status().version.clone();
        let options = RecordOptions::whole(path.to_owned(), format!("shadow of {version}"));
        let component = ComponentRef::of(serving, None);
        match Recorder::start(options, Signatures::of(serving), &component) {
            Ok(recorder) => Some(recorder),
            Err(error) => {
                tracing::warn!(%error, "cannot write the divergence trace");
                None
            }
        }
    }

    fn trace_written(&self, recorder: &Recorder) {
        recorder.flush();
        self.status().traces_written += 1;
    }
}

/// A shadow as its callers see it: its candidate and status (cheap to clone; outlives the shadow,
/// so that `/status` still shows what a stopped or promoted one did).
#[derive(Clone)]
pub struct ShadowHandle(Arc<Shared>);

impl std::fmt::Debug for ShadowHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShadowHandle").field(&self.0.candidate.info().sha256).finish()
    }
}

impl ShadowHandle {
    pub fn status(&self) -> ShadowStatus {
        self.0.status().clone()
    }

    pub fn candidate(&self) -> &LoadedLogic {
        &self.0.candidate
    }

    /// Whether it compared enough clean inputs to be swapped in.
    pub fn promotion_due(&self) -> bool {
        self.0.promotion_due.load(Ordering::Relaxed)
    }

    /// Whether it still runs beside the serving version (neither stopped nor promoted).
    pub fn is_running(&self) -> bool {
        matches!(self.0.status().state, ShadowState::InStep | ShadowState::Resyncing)
    }

    /// Asks the candidate to judge the Service to which `serving` answered `answered` under
    /// `config` (`admit-service`, on the caller's thread, in an instance of its own) and
    /// compares: a different verdict or different warnings (both reach the user), or a trap, is
    /// a divergence of kind [`ADMISSION`] (`input` names what was judged), counted and told like
    /// a step's and holding a promotion back unless allowed; with a record folder its trace is
    /// the one `admit-service` call with the serving version's answer. The verdict is a pure function of its arguments, so nothing is resynced;
    /// nor does a verdict count towards a promotion, which counts the tracker's inputs.
    pub fn admit_service(
        &self,
        serving: &LoadedLogic,
        config: &wit::Config,
        service: &wit::Service,
        answered: &Admission,
        input: impl FnOnce() -> String,
    ) {
        let judged = self.0.candidate.session().and_then(|mut session| session.admit_service(config, service));
        let candidate = match &judged {
            Ok(theirs) if theirs == answered => {
                self.0.status().admissions += 1;
                return;
            }
            Ok(theirs) => serde_json::to_value(theirs).expect("bindgen types serialize"),
            Err(error) => serde_json::json!({ "trap": error.to_string() }),
        };
        let trace = self.0.next_trace().and_then(|path| {
            let recorder = self.0.start_trace(&path, serving)?;
            recorder.call(
                "admit-service",
                vec![crate::trace::arg(config.clone()), crate::trace::arg(service.clone())],
                Ended::Returned(lazy(answered.clone())),
            );
            self.0.trace_written(&recorder);
            Some(path.display().to_string())
        });
        let answer = |judged: serde_json::Value| Answer { only: vec![judged], more: 0, wake_at_ms: None, idle: None };
        let serving = serde_json::to_value(answered).expect("bindgen types serialize");
        let divergence = Divergence {
            input: input(),
            kinds: vec![ADMISSION.to_owned()],
            serving: answer(serving),
            candidate: answer(candidate),
            trace,
        };
        self.0.diverged(divergence, false);
    }
}

/// The serving version's state after an input, as the supervisor holds it: its checkpoint and
/// the journal since.
pub(super) struct SyncPoint {
    pub reason: Resync,
    pub config: wit::Config,
    pub serving: LoadedLogic,
    pub checkpoint: Arc<wit::VersionedState>,
    pub journal: Vec<Input>,
}

/// What goes from the serving side to the candidate.
enum Feed {
    Sync(Box<SyncPoint>),
    Input { input: Input, step: wit::Step },
}

enum Link {
    Inline { runner: Box<Runner>, queue: VecDeque<Feed> },
    Thread { tx: Option<SyncSender<Feed>>, thread: Option<std::thread::JoinHandle<()>> },
}

/// The serving side of a shadow, owned by the supervisor.
pub(super) struct Tap {
    shared: Arc<Shared>,
    link: Link,
    /// A resync to send at the next chance.
    due: Option<Resync>,
    /// The queue's bound, on a thread of its own.
    bound: Option<usize>,
}

/// Why a shadow could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShadowError {
    #[error("{path}: cannot create the shadow's record folder")]
    RecordFolder {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the shadow's thread")]
    Thread(#[source] std::io::Error),
}

impl Tap {
    pub(super) fn start(candidate: LoadedLogic, options: ShadowOptions) -> Result<Self, ShadowError> {
        if let Some(dir) = &options.record {
            std::fs::create_dir_all(dir)
                .map_err(|source| ShadowError::RecordFolder { path: dir.display().to_string(), source })?;
        }
        let sha256 = candidate.info().sha256.clone();
        let status = ShadowStatus {
            version: sha256.chars().take(12).collect(),
            sha256,
            state: ShadowState::Resyncing,
            compared: 0,
            clean: 0,
            promote_after: options.promote_after,
            resyncing: 0,
            admissions: 0,
            divergences: BTreeMap::new(),
            resyncs: BTreeMap::new(),
            last_divergence: None,
            traces_written: 0,
            stopped: None,
            figures: None,
            memory_bytes: None,
        };
        let queue = options.queue;
        let shared = Arc::new(Shared {
            candidate: candidate.clone(),
            status: Mutex::new(status),
            wanted: Mutex::new(None),
            promotion_due: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            diverged: AtomicBool::new(false),
            options,
        });
        let runner = Box::new(Runner {
            candidate,
            shared: shared.clone(),
            running: None,
            base: None,
            failed_syncs: 0,
            figures_at: None,
        });
        let link = match queue {
            None => Link::Inline { runner, queue: VecDeque::new() },
            Some(bound) => {
                let (tx, rx) = std::sync::mpsc::sync_channel(bound.max(1));
                let thread = std::thread::Builder::new()
                    .name("clb-shadow".into())
                    .spawn(move || runner.run(rx))
                    .map_err(ShadowError::Thread)?;
                Link::Thread { tx: Some(tx), thread: Some(thread) }
            }
        };
        tracing::info!(candidate = %shared.status().version, "shadow started: the candidate takes every input the serving version takes, and nothing it asks for is carried out");
        Ok(Self { shared, link, due: Some(Resync::Start), bound: queue.map(|b| b.max(1)) })
    }

    pub(super) fn handle(&self) -> ShadowHandle {
        ShadowHandle(self.shared.clone())
    }

    /// Whether a resync is due (then the next input sends the serving state, not the input).
    fn sync_due(&mut self) -> Option<Resync> {
        if let Some(reason) = self.shared.take_wanted() {
            self.due.get_or_insert(reason);
        }
        self.due
    }

    /// The serving tracker took `input` and answered `step`; `sync` gives its state after it when
    /// a resync is due.
    pub(super) fn input(&mut self, input: &Input, step: &wit::Step, sync: impl FnOnce(Resync) -> Option<SyncPoint>) {
        if self.is_stopped() {
            return;
        }
        if self.bound.is_some_and(|bound| self.shared.queued.load(Ordering::Relaxed) >= bound) {
            // Full: neither this input nor a resync fits; nothing is copied to find that out.
            self.due.get_or_insert(Resync::Behind);
            self.shared.status().resyncing += 1;
            return;
        }
        match self.sync_due() {
            Some(reason) => {
                // The state after this input goes instead of it: it is not compared.
                if sync(reason).is_some_and(|point| self.send(Feed::Sync(Box::new(point)))) {
                    self.due = None;
                }
                self.shared.status().resyncing += 1;
            }
            None => {
                if !self.send(Feed::Input { input: input.clone(), step: step.clone() }) {
                    // Dropped: the candidate misses an input, so its state no longer follows.
                    self.due = Some(Resync::Behind);
                    self.shared.status().resyncing += 1;
                }
            }
        }
    }

    /// Tries to send the serving state now (at start, after a swap or a rollback).
    pub(super) fn sync_now(&mut self, reason: Resync, sync: impl FnOnce(Resync) -> Option<SyncPoint>) {
        self.due.get_or_insert(reason);
        let reason = self.sync_due().unwrap_or(reason);
        if let Some(point) = sync(reason)
            && self.send(Feed::Sync(Box::new(point)))
        {
            self.due = None;
        }
    }

    /// The serving version changed (a swap or a rollback): the candidate must start again from
    /// its state.
    pub(super) fn serving_changed(&mut self) {
        self.due = Some(Resync::ServingChanged);
    }

    fn send(&mut self, feed: Feed) -> bool {
        match &mut self.link {
            Link::Inline { queue, .. } => {
                queue.push_back(feed);
                true
            }
            Link::Thread { tx: Some(tx), .. } => {
                // Counted before it can be taken, so that the count never goes below zero.
                self.shared.queued.fetch_add(1, Ordering::Relaxed);
                match tx.try_send(feed) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                        self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                        false
                    }
                }
            }
            Link::Thread { tx: None, .. } => false,
        }
    }

    /// An inline shadow compares what it was sent (after each delivered input).
    pub(super) fn drain(&mut self) {
        if let Link::Inline { runner, queue } = &mut self.link {
            while let Some(feed) = queue.pop_front() {
                runner.handle(feed);
            }
        }
    }

    fn is_stopped(&self) -> bool {
        matches!(self.shared.status().state, ShadowState::Stopped | ShadowState::Promoted)
    }

    /// Ends the shadow (its thread finishes what it holds and exits); the handle keeps its
    /// status, marked with `state`.
    pub(super) fn stop(mut self, state: ShadowState, why: Option<String>) -> ShadowHandle {
        {
            let mut status = self.shared.status();
            status.state = state;
            status.stopped = why;
        }
        if let Link::Thread { tx, thread } = &mut self.link {
            // Dropping the sender ends the thread's loop; it is not waited for.
            tx.take();
            thread.take();
        }
        self.handle()
    }
}

/// The candidate's side.
struct Runner {
    candidate: LoadedLogic,
    shared: Arc<Shared>,
    /// `None` while out of step.
    running: Option<Running>,
    /// With a record folder: the serving state at the last resync and the inputs since.
    base: Option<Base>,
    failed_syncs: u32,
    /// When its figures were last read.
    figures_at: Option<std::time::Instant>,
}

/// How often the candidate's figures are read at most.
const FIGURES_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

struct Base {
    config: wit::Config,
    serving: LoadedLogic,
    state: Arc<wit::VersionedState>,
    inputs: Vec<(Input, wit::Step)>,
}

impl Runner {
    fn run(mut self, rx: Receiver<Feed>) {
        while let Ok(feed) = rx.recv() {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            if matches!(self.shared.status().state, ShadowState::Stopped | ShadowState::Promoted) {
                break;
            }
            self.handle(feed);
        }
        tracing::debug!(candidate = %self.shared.status().version, "shadow thread ended");
    }

    fn handle(&mut self, feed: Feed) {
        match feed {
            Feed::Sync(point) => self.sync(*point),
            Feed::Input { input, step } => self.compare(input, step),
        }
    }

    fn stop(&mut self, why: String) {
        tracing::error!(candidate = %self.shared.status().version, %why, "shadow stopped");
        let mut status = self.shared.status();
        status.state = ShadowState::Stopped;
        status.stopped = Some(why);
        self.running = None;
    }

    fn sync(&mut self, point: SyncPoint) {
        let SyncPoint { reason, config, serving, checkpoint, journal } = point;
        *self.shared.status().resyncs.entry(reason.as_str()).or_default() += 1;
        self.running = None;
        // The serving version's state after the input, rebuilt here rather than exported on
        // the serving path.
        let state = Running::rebuild(&serving, &config, &checkpoint, &journal).and_then(|mut rebuilt| {
            rebuilt.session.tracker_export(rebuilt.tracker).map_err(guest("export-state (serving, for the shadow)"))
        });
        let state = match state {
            Ok(state) => Arc::new(state),
            Err(error) => return self.stop(format!("the serving version's state cannot be rebuilt: {error}")),
        };
        match Running::rebuild(&self.candidate, &config, &state, &[]) {
            Ok(running) => {
                self.running = Some(running);
                self.failed_syncs = 0;
                self.shared.status().state = ShadowState::InStep;
                if self.shared.options.record.is_some() {
                    self.base = Some(Base { config, serving, state, inputs: Vec::new() });
                }
                tracing::debug!(reason = reason.as_str(), "shadow in step with the serving version");
            }
            Err(error) => {
                self.failed_syncs += 1;
                tracing::warn!(%error, reason = reason.as_str(), failures = self.failed_syncs, "the candidate cannot take the serving version's state");
                if self.failed_syncs >= MAX_FAILED_SYNCS {
                    self.stop(format!("the candidate cannot take the serving version's state: {error}"));
                } else {
                    self.shared.status().state = ShadowState::Resyncing;
                    self.shared.want(Resync::Trap);
                }
            }
        }
    }

    /// Reads the candidate's figures, at most once a second. Returns false when it trapped (the
    /// candidate is then out of step).
    fn read_figures(&mut self, now_ms: u64) -> bool {
        let Some(running) = &mut self.running else { return true };
        if self.figures_at.is_some_and(|at| at.elapsed() < FIGURES_EVERY) {
            return true;
        }
        self.figures_at = Some(std::time::Instant::now());
        match running.session.tracker_stats(running.tracker, now_ms) {
            Ok(stats) => {
                let mut status = self.shared.status();
                status.figures = Some(stats);
                status.memory_bytes = Some(running.session.memory_bytes() as u64);
                true
            }
            Err(error) => {
                tracing::warn!(%error, "the candidate trapped reading its figures; resyncing it");
                self.out_of_step(Resync::Trap);
                false
            }
        }
    }

    fn compare(&mut self, input: Input, serving: wit::Step) {
        if !self.read_figures(input.now_ms()) {
            self.shared.status().resyncing += 1;
            return;
        }
        let Some(running) = &mut self.running else {
            self.shared.status().resyncing += 1;
            return;
        };
        let candidate = match running.call(&input) {
            Ok(step) => step,
            Err(error) => {
                tracing::warn!(input = %input.describe(), %error, "the candidate trapped; resyncing it");
                self.out_of_step(Resync::Trap);
                return;
            }
        };
        let (kinds, serving_only, candidate_only) = differences(&serving, &candidate);
        if kinds.is_empty() {
            let mut status = self.shared.status();
            status.compared += 1;
            status.clean += 1;
            drop(status);
            if let Some(base) = &mut self.base {
                base.inputs.push((input, serving));
                if base.inputs.len() >= REBASE_AFTER {
                    self.shared.want(Resync::Rebase);
                }
            }
            self.shared.check_promotion();
            return;
        }
        let trace = self.write_trace(&input, &serving);
        let divergence =
            Divergence { input: input.describe(), kinds, serving: serving_only, candidate: candidate_only, trace };
        self.shared.diverged(divergence, true);
        self.out_of_step(Resync::Divergence);
    }

    fn out_of_step(&mut self, reason: Resync) {
        self.running = None;
        self.base = None;
        self.shared.status().state = ShadowState::Resyncing;
        self.shared.want(reason);
    }

    /// Writes the divergence on `input` as a trace; its path.
    fn write_trace(&mut self, input: &Input, serving: &wit::Step) -> Option<String> {
        let base = self.base.as_ref()?;
        let path = self.shared.next_trace()?;
        let recorder = self.shared.start_trace(&path, &base.serving)?;
        let handle = recorder.new_handle();
        recorder.call(
            "tracker.import-state",
            vec![crate::trace::arg(base.config.clone()), crate::trace::arg(wit::VersionedState::clone(&base.state))],
            Ended::Returned(Box::new(move || serde_json::json!({ "Ok": handle }))),
        );
        for (earlier, step) in base.inputs.iter().map(|(i, s)| (i, s)).chain([(input, serving)]) {
            record_input(&recorder, handle, earlier, Ended::Returned(lazy(step.clone())));
        }
        self.shared.trace_written(&recorder);
        Some(path.display().to_string())
    }
}
