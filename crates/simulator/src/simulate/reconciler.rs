//! The logic as the simulator drives it: the [`Reconciler`] trait (the host's [`Logic`] with the
//! simulator's own parts), what its calls can fail with,
//! and [`ComponentReconciler`], the component behind a [`clb_sandbox::supervisor::Supervisor`] (swaps,
//! shadows and traces included).

use crate::scenario::{self, ComponentSource};
use clb_executor::backend_pools::{GuestQueue, PoolLogic, PoolUpdaterError};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::logic::Logic;
use clb_sandbox::supervisor::{ShadowOptions, ShadowStatus, Supervisor, SupervisorError};
use clb_sandbox::trace::Recorder;
use clb_sandbox::{GuestError, Runtime};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why the logic could not be called.
#[derive(Debug, thiserror::Error)]
pub enum LogicError {
    #[error(transparent)]
    Guest(#[from] GuestError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("the logic refuses the configuration: {reason} ({field}): {message}")]
    ConfigRefused { field: String, reason: String, message: String },
    #[error("the tracker was called before it was started")]
    NotStarted,
    #[error("this reconciler cannot swap its logic")]
    SwapUnsupported,
    #[error("this reconciler cannot run a candidate in shadow")]
    ShadowUnsupported,
    #[error("this reconciler has no backend-pool logic (multi-SLB local-service scenarios need it)")]
    PoolsUnsupported,
    #[error("this reconciler runs its logic without a supervisor ({0} needs one)")]
    Unsupervised(&'static str),
    #[error(transparent)]
    Pools(#[from] PoolUpdaterError),
    #[error("setting up Azure: {0}")]
    AzureSetup(String),
    #[error("the logic refused to be rebuilt from its own state: {0}")]
    RebuildRefused(String),
    #[error(
        "no component is known by the name {0:?} (a path needs a `/` or the `.wasm`, `.wasm.gz` or `.wasm.zst` ending)"
    )]
    UnknownComponent(String),
    #[error("{path}: cannot read the component: {source}")]
    ReadComponent {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The result of a `swap` step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapResult {
    /// The new version serves; the text says what moved. `first_step` is the new version's
    /// first step (its self-check tick), to be carried out like a tick's.
    Accepted { what: String, first_step: wit::Step },
    /// The old version keeps serving; the text says why.
    Refused(String),
}

/// The reconcile logic as the simulator drives it: the guest's `tracker` through the host's
/// [`Logic`] trait, by whichever implementation. [`ComponentReconciler`] runs the WebAssembly
/// component; the test suite also runs the native library behind this trait and compares the
/// command streams. What not every implementation has is a trait of its own, which
/// [`Self::pools`] and [`Self::supervised`] hand out where it exists: a scenario that needs it and
/// finds none stops, saying so.
pub trait Reconciler: Logic<Error = LogicError> {
    /// The backend-pool logic of multi-SLB local-service mode; `None`: this reconciler has none.
    fn pools(&mut self) -> Option<&mut dyn PoolReconciler>;
    /// The supervisor around the logic (swaps, a candidate in shadow, quarantine, traces);
    /// `None`: the logic runs bare.
    fn supervised(&mut self) -> Option<&mut dyn Supervised>;
}

/// The backend-pool side of a [`Reconciler`] (`backend-pools` and `validation` in the WIT).
pub trait PoolReconciler {
    /// The mode the logic reads `config` in (`validate-config`): whether the backend-pool
    /// updater of multi-SLB local-service mode runs.
    fn validate_config(&mut self, config: &wit::Config) -> Result<Result<wit::Mode, wit::ConfigError>, LogicError>;
    /// A new backend-pool logic for that updater: `place-service` and an empty queue that
    /// retries a group at most `max_retries` times.
    fn pool_logic(&mut self, max_retries: u32) -> Result<Box<dyn PoolLogic>, LogicError>;
}

/// The supervisor's side of a [`Reconciler`].
pub trait Supervised {
    /// Replaces the logic, keeping the state. An error aborts the run (the scenario names what
    /// cannot be found); a refusal is a result, checked against the step's `expect`.
    fn swap(&mut self, now_ms: u64, component: &ComponentSource) -> Result<SwapResult, LogicError>;
    /// Swaps the serving version to a copy of itself in a fresh instance (its state exported and
    /// imported, nothing else changed), as `explore`'s swap class does at every input.
    fn rebuild(&mut self, now_ms: u64) -> Result<SwapResult, LogicError>;
    /// Runs a candidate in shadow beside the serving logic: `Ok(Err(why))` when it cannot load.
    fn shadow(&mut self, step: &scenario::ShadowStep) -> Result<Result<String, String>, LogicError>;
    /// What the candidate in shadow, or the last one, found; `None`: none ran.
    fn shadow_status(&self) -> Option<ShadowStatus>;
    /// The inputs dropped because the logic trapped on them, since the last call.
    fn take_quarantined(&mut self) -> Vec<String>;
    /// Which logic serves and what its supervisor did.
    fn logic_status(&self) -> LogicStatus;
    /// The trace being recorded of this run's calls into the logic, if any.
    fn recorder(&self) -> Option<Arc<Recorder>>;
}

/// What [`Supervised::logic_status`] tells: the serving component, as a `swap` step named it
/// (`builtin`, a registered name, a file), and the supervisor's counts since the run began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicStatus {
    pub serving: String,
    pub rollbacks: u64,
    pub quarantined: u64,
}

/// The component behind a [`Supervisor`]: a new instance (as a restarted process has) per
/// start, trap recovery, and swaps to the built-in logic, to files, or to components the caller
/// registered by name (the test guests).
pub struct ComponentReconciler<'a> {
    pub(super) supervisor: Supervisor<'a>,
    pub(super) runtime: Option<&'a Runtime>,
    pub(super) named: BTreeMap<String, &'a [u8]>,
    /// sha256 → the name a `swap` step gave the component (`builtin` for the built-in one).
    pub(super) names: BTreeMap<String, String>,
}

impl<'a> ComponentReconciler<'a> {
    pub fn new(logic: &'a clb_sandbox::LoadedLogic) -> Self {
        let builtin = clb_sandbox::sha256_hex(clb_sandbox::BUILTIN_GUEST);
        let names = BTreeMap::from([(builtin, "builtin".to_owned())]);
        Self { supervisor: Supervisor::new(logic), runtime: None, named: BTreeMap::new(), names }
    }

    /// Lets `swap` steps load components with `runtime`; `named` are the names besides
    /// `builtin` that a scenario may give instead of a path.
    pub fn with_components(mut self, runtime: &'a Runtime, named: BTreeMap<String, &'a [u8]>) -> Self {
        self.runtime = Some(runtime);
        self.named = named;
        self
    }

    pub fn supervisor(&mut self) -> &mut Supervisor<'a> {
        &mut self.supervisor
    }

    /// Records the run's calls into the logic (`docs/traces.md`).
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.supervisor.record_into(recorder);
        self
    }
}

impl Logic for ComponentReconciler<'_> {
    type Error = LogicError;

    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        self.supervisor.start(config).map_err(|e| match e {
            SupervisorError::ConfigRefused { field, reason, message } => {
                LogicError::ConfigRefused { field, reason, message }
            }
            other => other.into(),
        })
    }

    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        let step = self.supervisor.observe(now_ms, batch)?;
        self.promote(now_ms, step)
    }

    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, LogicError> {
        let step = self.supervisor.complete_paced(now_ms, results, arm_remaining_writes)?;
        self.promote(now_ms, step)
    }

    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError> {
        let step = self.supervisor.tick(now_ms)?;
        self.promote(now_ms, step)
    }

    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, LogicError> {
        Ok(self.supervisor.logic_stats(now_ms)?)
    }
}

impl Reconciler for ComponentReconciler<'_> {
    fn pools(&mut self) -> Option<&mut dyn PoolReconciler> {
        Some(self)
    }

    fn supervised(&mut self) -> Option<&mut dyn Supervised> {
        Some(self)
    }
}

impl Supervised for ComponentReconciler<'_> {
    fn swap(&mut self, now_ms: u64, component: &ComponentSource) -> Result<SwapResult, LogicError> {
        let runtime = self.runtime.ok_or(LogicError::SwapUnsupported)?;
        let bytes = match self.component_bytes(component)? {
            Ok(bytes) => bytes,
            Err(why) => return Ok(SwapResult::Refused(why)),
        };
        let limits = self.supervisor.logic().limits();
        swap_result(self.supervisor.swap_bytes(runtime, &bytes, limits, now_ms))
    }

    fn rebuild(&mut self, now_ms: u64) -> Result<SwapResult, LogicError> {
        let same = self.supervisor.logic().clone();
        swap_result(self.supervisor.swap(same, now_ms))
    }

    fn shadow(&mut self, step: &scenario::ShadowStep) -> Result<Result<String, String>, LogicError> {
        let runtime = self.runtime.ok_or(LogicError::ShadowUnsupported)?;
        let bytes = match self.component_bytes(&step.component)? {
            Ok(bytes) => bytes,
            Err(why) => return Ok(Err(why)),
        };
        let candidate = match runtime.load(&bytes, self.supervisor.logic().limits()) {
            Ok(candidate) => candidate,
            Err(error) => return Ok(Err(clb_sandbox::error_text::error_chain(&error))),
        };
        let options =
            ShadowOptions { promote_after: step.promote_after, allow: step.allow.clone(), ..Default::default() };
        match self.supervisor.shadow(candidate, options) {
            Ok(handle) => Ok(Ok(format!("candidate {} in shadow", handle.status().version))),
            Err(error) => Ok(Err(clb_sandbox::error_text::error_chain(&error))),
        }
    }

    fn shadow_status(&self) -> Option<ShadowStatus> {
        self.supervisor.shadow_handle().map(|handle| handle.status())
    }

    fn take_quarantined(&mut self) -> Vec<String> {
        self.supervisor
            .take_quarantined()
            .into_iter()
            .map(|q| format!("{} (on {}): {}", q.input.describe(), q.version, q.error))
            .collect()
    }

    fn logic_status(&self) -> LogicStatus {
        let sha256 = &self.supervisor.logic().info().sha256;
        let serving = self.names.get(sha256).cloned().unwrap_or_else(|| sha256.clone());
        let stats = self.supervisor.stats();
        LogicStatus { serving, rollbacks: stats.rollbacks, quarantined: stats.quarantined }
    }

    fn recorder(&self) -> Option<Arc<Recorder>> {
        self.supervisor.recorder().cloned()
    }
}

impl PoolReconciler for ComponentReconciler<'_> {
    fn validate_config(&mut self, config: &wit::Config) -> Result<Result<wit::Mode, wit::ConfigError>, LogicError> {
        Ok(self.supervisor.logic().session()?.validate_config(config)?)
    }

    fn pool_logic(&mut self, max_retries: u32) -> Result<Box<dyn PoolLogic>, LogicError> {
        Ok(Box::new(GuestQueue::new(self.supervisor.logic(), max_retries)?))
    }
}

impl ComponentReconciler<'_> {
    /// The bytes of `component`, decompressed, its name registered for reports and traces;
    /// `Ok(Err(why))` when they give no component.
    pub(super) fn component_bytes(
        &mut self,
        component: &ComponentSource,
    ) -> Result<Result<Vec<u8>, String>, LogicError> {
        let bytes: Vec<u8> = match component {
            ComponentSource::Builtin => clb_sandbox::BUILTIN_GUEST.to_vec(),
            ComponentSource::Named(name) => {
                self.named.get(name).ok_or_else(|| LogicError::UnknownComponent(name.clone()))?.to_vec()
            }
            ComponentSource::File(path) => {
                clb_sandbox::bounded::read(path, clb_sandbox::compression::MAX_COMPONENT_BYTES as u64).map_err(|e| {
                    LogicError::ReadComponent { path: path.display().to_string(), source: std::io::Error::other(e) }
                })?
            }
        };
        // Compressed like every component the host takes; a stream that gives none is refused
        // as a file that is no component is.
        let bytes = match clb_sandbox::compression::decompress(bytes) {
            Ok(decompressed) => decompressed.bytes,
            Err(error) => return Ok(Err(clb_sandbox::error_text::error_chain(&error))),
        };
        let name = match component {
            ComponentSource::Builtin => "builtin".to_owned(),
            ComponentSource::Named(name) => name.clone(),
            ComponentSource::File(path) => path.display().to_string(),
        };
        let sha256 = clb_sandbox::sha256_hex(&bytes);
        self.supervisor.name_component(&sha256, &name);
        self.names.insert(sha256, name);
        Ok(Ok(bytes))
    }

    /// A step of the serving version, followed, when the shadow's promotion became due with it,
    /// by the promoted version's first step: that version took the state with the step's
    /// commands in flight.
    pub(super) fn promote(&mut self, now_ms: u64, mut step: wit::Step) -> Result<wit::Step, LogicError> {
        let Some(candidate) = self.supervisor.take_promotion() else { return Ok(step) };
        match self.supervisor.swap(candidate, now_ms) {
            Ok(report) => {
                step.commands.extend(report.first_step.commands);
                step.wake_at_ms = report.first_step.wake_at_ms;
                step.idle = report.first_step.idle;
            }
            Err(SupervisorError::NotStarted) => return Err(LogicError::NotStarted),
            // Refused: the serving version serves on; the refusal is counted with the swaps.
            Err(_) => {}
        }
        Ok(step)
    }
}

/// A supervisor's swap as a step's result: a refusal is a result, a tracker not started an error.
fn swap_result(
    swapped: Result<clb_sandbox::supervisor::SwapReport, SupervisorError>,
) -> Result<SwapResult, LogicError> {
    match swapped {
        Ok(report) => Ok(SwapResult::Accepted { what: report.to_string(), first_step: report.first_step }),
        Err(SupervisorError::NotStarted) => Err(LogicError::NotStarted),
        Err(refusal) => Ok(SwapResult::Refused(refusal.to_string())),
    }
}
