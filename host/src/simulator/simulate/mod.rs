//! `clb-host simulate`: replays a [`Scenario`] with no cluster and no Azure, on virtual time.
//!
//! The pieces are the production ones: a [`Cluster`] of k8s-openapi objects whose changes
//! become WIT observations through `records.rs` (as the watchers' will), the guest behind a
//! [`Reconciler`] (the component through a [`Supervisor`], or — in the test suite — the
//! native library), the [`Executor`] carrying commands to the in-process [`Emulator`] and to the
//! cluster, whose status and finalizer writes come back as new observations.
//!
//! Time is virtual. Steps that change the world (`apply`, `delete`, `fault`, `restart`, `swap`) happen
//! at the current instant and run nothing; `advance` and `settle` run the system. Running at an
//! instant means: deliver pending watch events (`observe`), execute every command issued
//! (in order; the emulator answers at once), hand back all their outcomes (`complete`), and
//! repeat until nothing is pending; then jump to the guest's `wake-at-ms` and `tick`.
//!
//! In multi-SLB local-service mode (the guest's `validate-config` says so), the host's
//! [`PoolUpdater`] runs too, on the same emulator and cluster: whenever watch events arrive, the
//! producer asks the guest where each Service belongs (`place-service`), records the assignment,
//! computes the node IPs of the Service's ready endpoints and enqueues the change against what
//! it enqueued last (upstream's `applyIPChangesAmongLocalServiceBackendPoolsByIPFamily`: a
//! remove of the IPs no longer expected, an add of the whole expected list); a Service new to a
//! load balancer starts from what its pool holds in Azure, as a reconcile that read the load
//! balancer would. The updater ticks every `azure.backendPoolUpdateInterval` of virtual time.
//! The producer is [`crate::pool_producer`], shared with `clb-host run`; here it recomputes
//! every Service whenever anything changed, which a scenario's size makes cheap.

use crate::azure::{
    AzureApi, BackendPool, DEFAULT_SERVICE_GATEWAY, LbRule, LoadBalancerSpec, Operation, PoolRef, PublicIpSpec, Scope,
};
use crate::backend_pools::{
    DEFAULT_MAX_RETRIES, GuestQueue, InMemoryLock, PoolLogic, PoolUpdater, PoolUpdaterConfig, PoolUpdaterError,
    ServiceLock, Tick,
};
use crate::emulator::{Emulator, EmulatorConfig, Resources};
use crate::executor::{Executor, command_name};
use crate::pool_producer::{AzureFacts, PoolProducer, canonical_ip, node_ips, ready_node_ips};
use crate::sandbox::bindings::clb::reconciler::types as wit;
use crate::sandbox::bindings::exports::clb::reconciler::backend_pools::{Placement, SlbConfiguration};
use crate::sandbox::{GuestError, Logic, Runtime};
use crate::simulator::cluster::{Cluster, ClusterError, RecordedEvent};
use crate::simulator::scenario::{
    self, ComponentSource, EventTypeName, Expectation, PodFinalizersExpectation, PoolExpectation, Scenario,
    StatusExpectation, Step, SwapExpect,
};
use crate::supervisor::{ShadowOptions, ShadowState, ShadowStatus, Supervisor, SupervisorError};
use crate::trace::{Ended, Recorder, arg, lazy};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

/// Calls at one instant after which the run is declared a livelock (a guest bug).
const MAX_CALLS_PER_INSTANT: usize = 10_000;

/// NRP's address locations: location → address → services.
pub type NrpLocations = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

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
    #[error(transparent)]
    Pools(#[from] PoolUpdaterError),
    #[error("setting up Azure: {0}")]
    AzureSetup(String),
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

/// The reconcile logic as the simulator drives it: the guest's `tracker`, through whichever
/// implementation. [`ComponentReconciler`] runs the WebAssembly component; the test suite
/// also runs the native library behind this trait and compares the command streams.
pub trait Reconciler {
    /// Starts a fresh tracker (at start and on every restart); earlier state is dropped.
    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError>;
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError>;
    /// With ARM's remaining-writes figure on the latest answer among `results` that carried one.
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, LogicError>;
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError>;
    /// Replaces the logic, keeping the state. An error aborts the run (the scenario names what
    /// cannot be found); a refusal is a result, checked against the step's `expect`.
    fn swap(&mut self, _now_ms: u64, _component: &ComponentSource) -> Result<SwapResult, LogicError> {
        Err(LogicError::SwapUnsupported)
    }
    /// Runs a candidate in shadow beside the serving logic: `Ok(Err(why))` when it cannot load.
    fn shadow(&mut self, _step: &scenario::ShadowStep) -> Result<Result<String, String>, LogicError> {
        Err(LogicError::ShadowUnsupported)
    }
    /// What the candidate in shadow, or the last one, found; `None`: none ran.
    fn shadow_status(&self) -> Option<ShadowStatus> {
        None
    }
    /// The inputs dropped because the logic trapped on them, since the last call.
    fn take_quarantined(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Which logic serves and what its supervisor did; `None`: this reconciler has none.
    fn logic_status(&self) -> Option<LogicStatus> {
        None
    }
    /// The mode the logic reads `config` in (`validate-config`): whether the backend-pool
    /// updater of multi-SLB local-service mode runs.
    fn validate_config(&mut self, _config: &wit::Config) -> Result<Result<wit::Mode, wit::ConfigError>, LogicError> {
        Err(LogicError::PoolsUnsupported)
    }
    /// A new backend-pool logic for that updater: `place-service` and an empty queue that
    /// retries a group at most `max_retries` times.
    fn pool_logic(&mut self, _max_retries: u32) -> Result<Box<dyn PoolLogic>, LogicError> {
        Err(LogicError::PoolsUnsupported)
    }
    /// The trace being recorded of this run's calls into the logic, if any.
    fn recorder(&self) -> Option<Arc<Recorder>> {
        None
    }
    /// What the logic is doing (`tracker.stats`); `None`: this reconciler cannot tell.
    fn stats(&mut self, _now_ms: u64) -> Result<Option<wit::TrackerStats>, LogicError> {
        Ok(None)
    }
}

/// What [`Reconciler::logic_status`] tells: the serving component, as a `swap` step named it
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
    supervisor: Supervisor<'a>,
    runtime: Option<&'a Runtime>,
    named: BTreeMap<String, &'a [u8]>,
    /// sha256 → the name a `swap` step gave the component (`builtin` for the built-in one).
    names: BTreeMap<String, String>,
}

impl<'a> ComponentReconciler<'a> {
    pub fn new(logic: &'a Logic) -> Self {
        let builtin = crate::sandbox::sha256_hex(crate::BUILTIN_GUEST);
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

impl Reconciler for ComponentReconciler<'_> {
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

    fn stats(&mut self, now_ms: u64) -> Result<Option<wit::TrackerStats>, LogicError> {
        Ok(Some(self.supervisor.logic_stats(now_ms)?))
    }

    fn swap(&mut self, now_ms: u64, component: &ComponentSource) -> Result<SwapResult, LogicError> {
        let runtime = self.runtime.ok_or(LogicError::SwapUnsupported)?;
        let bytes = match self.component_bytes(component)? {
            Ok(bytes) => bytes,
            Err(why) => return Ok(SwapResult::Refused(why)),
        };
        let limits = self.supervisor.logic().limits();
        match self.supervisor.swap_bytes(runtime, &bytes, limits, now_ms) {
            Ok(report) => Ok(SwapResult::Accepted { what: report.to_string(), first_step: report.first_step }),
            Err(SupervisorError::NotStarted) => Err(LogicError::NotStarted),
            Err(refusal) => Ok(SwapResult::Refused(refusal.to_string())),
        }
    }

    fn shadow(&mut self, step: &scenario::ShadowStep) -> Result<Result<String, String>, LogicError> {
        let runtime = self.runtime.ok_or(LogicError::ShadowUnsupported)?;
        let bytes = match self.component_bytes(&step.component)? {
            Ok(bytes) => bytes,
            Err(why) => return Ok(Err(why)),
        };
        let candidate = match runtime.load(&bytes, self.supervisor.logic().limits()) {
            Ok(candidate) => candidate,
            Err(error) => return Ok(Err(crate::kube::error_chain(&error))),
        };
        let options =
            ShadowOptions { promote_after: step.promote_after, allow: step.allow.clone(), ..Default::default() };
        match self.supervisor.shadow(candidate, options) {
            Ok(handle) => Ok(Ok(format!("candidate {} in shadow", handle.status().version))),
            Err(error) => Ok(Err(crate::kube::error_chain(&error))),
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

    fn validate_config(&mut self, config: &wit::Config) -> Result<Result<wit::Mode, wit::ConfigError>, LogicError> {
        Ok(self.supervisor.logic().session()?.validate_config(config)?)
    }

    fn pool_logic(&mut self, max_retries: u32) -> Result<Box<dyn PoolLogic>, LogicError> {
        Ok(Box::new(GuestQueue::new(self.supervisor.logic(), max_retries)?))
    }

    fn logic_status(&self) -> Option<LogicStatus> {
        let sha256 = &self.supervisor.logic().info().sha256;
        let serving = self.names.get(sha256).cloned().unwrap_or_else(|| sha256.clone());
        let stats = self.supervisor.stats();
        Some(LogicStatus { serving, rollbacks: stats.rollbacks, quarantined: stats.quarantined })
    }

    fn recorder(&self) -> Option<Arc<Recorder>> {
        self.supervisor.recorder().cloned()
    }
}

impl ComponentReconciler<'_> {
    /// The bytes of `component`, decompressed, its name registered for reports and traces;
    /// `Ok(Err(why))` when they give no component.
    fn component_bytes(&mut self, component: &ComponentSource) -> Result<Result<Vec<u8>, String>, LogicError> {
        let bytes: Vec<u8> = match component {
            ComponentSource::Builtin => crate::BUILTIN_GUEST.to_vec(),
            ComponentSource::Named(name) => {
                self.named.get(name).ok_or_else(|| LogicError::UnknownComponent(name.clone()))?.to_vec()
            }
            ComponentSource::File(path) => {
                crate::bounded::read(path, crate::compression::MAX_COMPONENT_BYTES as u64).map_err(|e| {
                    LogicError::ReadComponent { path: path.display().to_string(), source: std::io::Error::other(e) }
                })?
            }
        };
        // Compressed like every component the host takes; a stream that gives none is refused
        // as a file that is no component is.
        let bytes = match crate::compression::decompress(bytes) {
            Ok(decompressed) => decompressed.bytes,
            Err(error) => return Ok(Err(crate::kube::error_chain(&error))),
        };
        let name = match component {
            ComponentSource::Builtin => "builtin".to_owned(),
            ComponentSource::Named(name) => name.clone(),
            ComponentSource::File(path) => path.display().to_string(),
        };
        let sha256 = crate::sandbox::sha256_hex(&bytes);
        self.supervisor.name_component(&sha256, &name);
        self.names.insert(sha256, name);
        Ok(Ok(bytes))
    }

    /// A step of the serving version, followed, when the shadow's promotion became due with it,
    /// by the promoted version's first step: that version took the state with the step's
    /// commands in flight.
    fn promote(&mut self, now_ms: u64, mut step: wit::Step) -> Result<wit::Step, LogicError> {
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

/// Why a scenario could not be run to the end. A refused scenario is the author's error (exit
/// 2); everything the logic does wrong is a failed check instead.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("{path}: step {step}: {source}")]
    Cluster {
        path: String,
        step: usize,
        #[source]
        source: ClusterError,
    },
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// One command the guest issued and what came of it.
#[derive(Clone, Debug, Serialize)]
pub struct CommandRecord {
    pub at_ms: u64,
    pub id: u64,
    /// One line for people.
    pub line: String,
    pub outcome: String,
    /// The whole command, for comparing command streams exactly.
    pub detail: String,
}

/// One expectation and whether it held.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    /// What was found instead, when it did not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub index: usize,
    pub summary: String,
    pub at_ms: u64,
    pub commands: Vec<CommandRecord>,
    /// Emulator requests a fault (or ARM's throttling) answered.
    pub faults_hit: Vec<String>,
    /// Inputs the logic trapped on, dropped so that the rest could go on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// What the backend-pool producer enqueued and what the updater's ticks did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_pools: Vec<String>,
    pub checks: Vec<Check>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NrpView {
    pub services: BTreeSet<String>,
    pub locations: NrpLocations,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub path: String,
    pub steps: Vec<StepReport>,
    pub final_nrp: NrpView,
    /// Azure calls the emulator answered in the whole run, per operation (faulted ones too).
    pub azure_calls: BTreeMap<String, u64>,
    /// What ARM last reported of the subscription's write tokens left
    /// (`x-ms-ratelimit-remaining-subscription-writes`); absent when unlimited or no write ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm_remaining_writes: Option<u32>,
    /// ARM's 429s for an empty subscription bucket, per operation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub throttled: BTreeMap<String, u64>,
    pub events: Vec<RecordedEvent>,
    /// The logic's own figures at the end of the run (`tracker.stats`), if the logic tells them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<wit::TrackerStats>,
    /// Why the run stopped early (the logic trapped or refused the configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    pub passed: bool,
}

impl ScenarioReport {
    /// Every command of the run, in order: what the differential test compares.
    pub fn command_stream(&self) -> Vec<&str> {
        self.steps.iter().flat_map(|s| &s.commands).map(|c| c.detail.as_str()).collect()
    }

    /// What the backend-pool producer enqueued and what the updater's ticks did, in order: what
    /// the differential test compares in multi-SLB local-service mode, where the tracker sends
    /// no commands.
    pub fn pool_stream(&self) -> Vec<&str> {
        self.steps.iter().flat_map(|s| &s.backend_pools).map(String::as_str).collect()
    }
}

/// The emulated Azure the simulator starts with.
pub fn scope() -> Scope {
    Scope {
        subscription: "00000000-0000-0000-0000-000000000000".into(),
        resource_group: "rg".into(),
        location: "eastus".into(),
        vnet_resource_group: "rg".into(),
        vnet: "vnet".into(),
        service_gateway: DEFAULT_SERVICE_GATEWAY.into(),
    }
}

/// Runs one scenario through `logic` against a fresh emulator and cluster.
pub fn run(scenario: &Scenario, logic: &mut dyn Reconciler) -> Result<ScenarioReport, SimulateError> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().map_err(SimulateError::Runtime)?;
    // Azure as the scenario found it is not the controller's doing: it is set up unthrottled,
    // and ARM's limits start, buckets full, with the first step.
    let unlimited = EmulatorConfig { arm_limits: None, ..EmulatorConfig::default() };
    let mut sim = Simulation {
        logic,
        emulator: Arc::new(Emulator::with_config(scope(), unlimited)),
        cluster: Arc::new(Cluster::new()),
        runtime,
        now: 0,
        wake: None,
        idle: false,
        pending: Vec::new(),
        records: Vec::new(),
        pools: None,
        pool_lines: Vec::new(),
        early_releases: Vec::new(),
        figures: Default::default(),
    };
    let mut steps = Vec::new();
    let mut aborted = sim
        .set_up_azure(scenario)
        .and_then(|()| {
            sim.emulator.set_arm_limits(scenario.azure.arm_limits.0);
            sim.restart(scenario)
        })
        .err();
    for (index, step) in scenario.steps.iter().enumerate() {
        if aborted.is_some() {
            break;
        }
        let requests_before = sim.request_count();
        let mut report = StepReport {
            index: index + 1,
            summary: step.summary(),
            at_ms: sim.now,
            commands: Vec::new(),
            faults_hit: Vec::new(),
            quarantined: Vec::new(),
            backend_pools: Vec::new(),
            checks: Vec::new(),
        };
        let cluster_error =
            |source| SimulateError::Cluster { path: scenario.path.display().to_string(), step: index + 1, source };
        let result = match step {
            Step::Apply(objects) => {
                for object in &objects.0 {
                    sim.cluster.apply(object.clone()).map_err(cluster_error)?;
                }
                Ok(())
            }
            Step::Delete(d) => {
                sim.cluster.delete(d.kind, d.namespace(), &d.name, d.force, sim.now).map_err(cluster_error)?;
                Ok(())
            }
            Step::Fault(f) => {
                sim.emulator.set_fault(f.fault.clone());
                Ok(())
            }
            Step::ClearFaults => {
                sim.emulator.clear_faults();
                Ok(())
            }
            Step::ArmSpend(spend) => {
                sim.emulator.set_now_ms(sim.now);
                sim.emulator.arm_spend(spend.writes, spend.reads);
                Ok(())
            }
            Step::Advance(d) => sim.advance(d.0),
            Step::Settle(within) => {
                let within = within.map_or(scenario::DEFAULT_SETTLE_MS, |d| d.0);
                sim.settle(within).map(|check| report.checks.push(check))
            }
            Step::Restart => sim.restart(scenario),
            Step::Swap(swap) => sim.logic.swap(sim.now, &swap.component).map(|result| {
                let (accepted, text) = match result {
                    SwapResult::Accepted { what, first_step } => {
                        sim.absorb(first_step);
                        (true, format!("accepted: {what}"))
                    }
                    SwapResult::Refused(why) => (false, format!("refused: {why}")),
                };
                let ok = accepted == (swap.expect == SwapExpect::Accepted);
                let detail = (!ok).then(|| format!("expected it {}", swap.expect));
                report.checks.push(Check { what: format!("swap to {}: {text}", swap.component), ok, detail });
            }),
            Step::Shadow(shadow) => sim.logic.shadow(shadow).map(|result| {
                let (ok, text) = match result {
                    Ok(what) => (true, what),
                    Err(why) => (false, format!("cannot run: {why}")),
                };
                report.checks.push(Check { what: format!("shadow {}: {text}", shadow.component), ok, detail: None });
            }),
            Step::Expect(expectation) => {
                report.checks = sim.expect(expectation);
                sim.expect_metrics(&expectation.metrics).map(|checks| report.checks.extend(checks))
            }
        };
        report.commands = std::mem::take(&mut sim.records);
        report.faults_hit = sim.faults_since(requests_before);
        report.quarantined = sim.logic.take_quarantined();
        report.backend_pools = std::mem::take(&mut sim.pool_lines);
        steps.push(report);
        aborted = result.err();
    }
    let figures = match aborted {
        None => sim.logic.stats(sim.now).unwrap_or_else(|error| {
            aborted = Some(error);
            None
        }),
        Some(_) => None,
    };
    let passed = aborted.is_none() && steps.iter().flat_map(|s| &s.checks).all(|c| c.ok);
    let state = sim.emulator.state();
    Ok(ScenarioReport {
        name: scenario.name.clone(),
        path: scenario.path.display().to_string(),
        steps,
        final_nrp: nrp_view(&sim.emulator.resources()),
        azure_calls: state.requests,
        arm_remaining_writes: sim.emulator.last_arm_remaining_writes(),
        throttled: state.throttled,
        events: sim.cluster.events(),
        figures,
        aborted: aborted.map(|e| e.to_string()),
        passed,
    })
}

/// The backend-pool updater of multi-SLB local-service mode and its producer's memory.
struct PoolSim {
    updater: PoolUpdater<Arc<Emulator>, InMemoryLock, Arc<Cluster>>,
    configurations: Vec<SlbConfiguration>,
    /// The cluster's name, as placement reads it.
    cluster_name: String,
    interval: u64,
    next_tick: u64,
    producer: PoolProducer,
}

struct Simulation<'l> {
    logic: &'l mut dyn Reconciler,
    emulator: Arc<Emulator>,
    cluster: Arc<Cluster>,
    runtime: tokio::runtime::Runtime,
    now: u64,
    /// When the guest last asked to be called again.
    wake: Option<u64>,
    /// What the guest's last step said.
    idle: bool,
    /// Issued, not yet executed.
    pending: Vec<wit::Issued>,
    records: Vec<CommandRecord>,
    /// The backend-pool updater, in multi-SLB local-service mode only.
    pools: Option<PoolSim>,
    pool_lines: Vec<String>,
    /// Egress pods whose finalizer was released while NRP still sent their traffic out (see
    /// [`Simulation::release_checked`]).
    early_releases: Vec<String>,
    /// The logic's figures as `expect.metrics` last read them.
    figures: crate::figures::Figures,
}

impl Simulation<'_> {
    fn absorb(&mut self, step: wit::Step) {
        self.pending.extend(step.commands);
        self.wake = step.wake_at_ms;
        self.idle = step.idle;
    }

    /// The scenario's `azure:` section: each load balancer with a public IP `<lb>-frontend`,
    /// its other frontends (on a public IP `<lb>-<frontend>` each, or on a private address) and
    /// its pools, the public IPs' tags, and the Outbound services, written through the emulator's
    /// API before the first step.
    fn set_up_azure(&mut self, scenario: &Scenario) -> Result<(), LogicError> {
        use crate::azure::{FRONTEND_NAME, IpVersion, wire};
        let failed = |e: crate::azure::AzureError| LogicError::AzureSetup(e.to_string());
        let scope = self.emulator.scope().clone();
        for (lb, pools) in &scenario.azure.load_balancers {
            let extra = scenario.azure.frontends.get(lb).map(Vec::as_slice).unwrap_or_default();
            let public = std::iter::once(FRONTEND_NAME)
                .chain(extra.iter().filter(|f| f.private_ip.is_none()).map(|f| f.name.as_str()));
            for frontend in public {
                let name = format!("{lb}-{frontend}");
                let mut body = wire::public_ip(&scope, &PublicIpSpec { name: name.clone(), version: IpVersion::IPv4 });
                body.tags = scenario.azure.public_ip_tags.get(&name).cloned();
                self.emulator.put_public_ip_body(&name, &body).map_err(failed)?;
            }
            let public_ip = format!("{lb}-{FRONTEND_NAME}");
            let rules: Vec<LbRule> = (scenario.azure.load_balancer_rules.get(lb).into_iter().flatten().enumerate())
                .map(|(i, name)| LbRule {
                    name: name.clone(),
                    protocol: crate::azure::Protocol::Tcp,
                    frontend_port: u16::try_from(i % 65_000).unwrap_or(0) + 1,
                    backend_port: u16::try_from(i % 65_000).unwrap_or(0) + 1,
                    idle_timeout_minutes: 4,
                    enable_tcp_reset: true,
                })
                .collect();
            let spec = LoadBalancerSpec { name: lb.clone(), public_ip, backend_pool: pools[0].clone(), rules };
            let mut body = wire::load_balancer(&scope, &spec);
            body.properties.frontend_ip_configurations.extend(extra.iter().map(|f| wire::FrontendIpConfiguration {
                name: f.name.clone(),
                properties: wire::FrontendIpProperties {
                    public_ip_address: match f.private_ip {
                        Some(_) => None,
                        None => Some(wire::IdRef { id: scope.public_ip_id(&format!("{lb}-{}", f.name)) }),
                    },
                    private_ip_address: f.private_ip.clone(),
                },
            }));
            self.emulator.put_load_balancer_body(lb, &body).map_err(failed)?;
            for pool in &pools[1..] {
                let pool_ref = PoolRef { load_balancer: lb.clone(), pool: pool.clone() };
                let content = BackendPool { addresses: Vec::new(), other_properties: Default::default() };
                self.runtime.block_on(self.emulator.put_backend_pool(&pool_ref, &content, None)).map_err(failed)?;
            }
        }
        let outbound: Vec<crate::azure::ServiceRequest> = scenario
            .azure
            .outbound_services
            .iter()
            .map(|name| crate::azure::ServiceRequest {
                name: name.clone(),
                service_type: crate::azure::ServiceType::Outbound,
                backend_pools: Vec::new(),
                nat_gateway: crate::azure::NatGatewayLink::Omit,
                is_delete: false,
            })
            .collect();
        if !outbound.is_empty() {
            let action = crate::azure::UpdateAction::PartialUpdate;
            self.runtime.block_on(self.emulator.update_services(action, &outbound)).map_err(failed)?;
        }
        Ok(())
    }

    /// A new tracker; undelivered watch events are dropped and the lists replayed instead. In
    /// multi-SLB local-service mode a new backend-pool updater too: the queue and the
    /// producer's memory die with the process.
    fn restart(&mut self, scenario: &Scenario) -> Result<(), LogicError> {
        self.cluster.drop_watch_events();
        self.pending.clear();
        self.pools = None;
        self.logic.start(&scenario.config)?;
        let step = self.logic.observe(self.now, &self.cluster.list())?;
        self.absorb(step);
        if !scenario.config.multiple_standard_load_balancers.is_empty() {
            let mode = self.logic.validate_config(&scenario.config);
            let recorder = self.logic.recorder();
            if let Some(recorder) = &recorder {
                let ended = match &mode {
                    Ok(mode) => Ended::Returned(lazy(mode.clone())),
                    Err(error) => Ended::Trapped(error.to_string()),
                };
                recorder.call("validate-config", vec![arg(scenario.config.clone())], ended);
            }
            let mode = mode?;
            if mode == Ok(wit::Mode::MultiSlbLocalServices) {
                let interval = scenario.azure.pool_update_interval_ms();
                let config =
                    PoolUpdaterConfig { interval: Duration::from_millis(interval), max_retries: DEFAULT_MAX_RETRIES };
                let mut updater = PoolUpdater::over(
                    self.logic.pool_logic(config.max_retries)?,
                    self.emulator.clone(),
                    InMemoryLock::new(),
                    self.cluster.clone(),
                    ServiceLock::default(),
                    config,
                );
                if let Some(recorder) = recorder {
                    updater = updater.with_recorder(recorder);
                }
                self.pools = Some(PoolSim {
                    updater,
                    configurations: scenario.slb_configurations.clone(),
                    cluster_name: scenario.cluster_name.clone(),
                    interval,
                    next_tick: self.now.saturating_add(interval),
                    producer: PoolProducer::new(),
                });
                self.produce_pool_operations()?;
            }
        }
        Ok(())
    }

    /// The producer: every Service's placement and the node IPs of its ready endpoints, against
    /// what was enqueued for it last. Runs as a reconcile does, under the service reconcile lock.
    fn produce_pool_operations(&mut self) -> Result<(), LogicError> {
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        let node_ips: BTreeMap<String, Vec<String>> = self
            .cluster
            .nodes()
            .iter()
            .map(|n| {
                let record = crate::records::node(n);
                let ips = node_ips(&record);
                (record.name, ips)
            })
            .collect();
        pools.updater.set_nodes(&node_ips);
        let slices: Vec<wit::EndpointSlice> =
            self.cluster.slices().iter().map(crate::records::endpoint_slice).collect();
        let resources = self.emulator.resources();
        // Read as the reconcile's listing of the resource group would, without an Azure call.
        let (load_balancers, public_ips) = self.emulator.listing();
        let resource_group = &self.emulator.scope().resource_group;
        let azure = AzureFacts::listed(load_balancers, public_ips, resource_group, &pools.cluster_name);
        let service_lock = pools.updater.service_lock().clone();
        let reconciling = self.runtime.block_on(service_lock.lock());
        let (mut placed, mut present) = (BTreeSet::new(), BTreeSet::new());
        for service in self.cluster.services() {
            let record = crate::records::service(&service);
            let key = format!("{}/{}", record.namespace, record.name);
            present.insert(key.to_ascii_lowercase());
            let namespace = self.cluster.namespace_labels(&record.namespace);
            let placement = match pools.producer.place(
                &pools.updater,
                &pools.configurations,
                &record,
                namespace,
                &azure,
                &mut self.pool_lines,
            )? {
                (Placement::NotLocal(_), _) => continue,
                (Placement::Refused(message), new) => {
                    // What was enqueued for it stays, as upstream leaves a failed reconcile's work.
                    placed.insert(key.to_ascii_lowercase());
                    if new {
                        self.pool_lines.push(format!("{key} cannot be placed: {message}"));
                        self.runtime.block_on(pools.updater.refuse_placement(&key, &message));
                    }
                    continue;
                }
                (Placement::At(placement), _) => placement,
            };
            placed.insert(key.to_ascii_lowercase());
            let ips = ready_node_ips(&record.uid, &slices, &node_ips);
            let load_balancer = placement.load_balancer.clone();
            let pool_contents = |pool: &str| {
                resources
                    .backend_pools
                    .get(&crate::emulator::core::pool_key(&load_balancer, pool))
                    .map(|p| p.addresses.iter().map(|a| canonical_ip(&a.properties.ip_address)).collect())
            };
            let notes = &mut self.pool_lines;
            pools.producer.update(&pools.updater, &reconciling, &key, placement, ips, pool_contents, notes)?;
        }
        let unplaced: Vec<String> =
            pools.producer.known().filter(|k| !placed.contains(*k)).map(str::to_owned).collect();
        for folded in unplaced {
            pools.producer.forget(&pools.updater, &reconciling, &folded, &mut self.pool_lines)?;
        }
        pools.producer.keep_refused(&placed);
        pools.producer.keep_present(&present);
        Ok(())
    }

    /// One tick of the backend-pool updater at the current instant.
    fn pool_tick(&mut self) -> Result<(), LogicError> {
        let Some(pools) = self.pools.as_mut() else { return Ok(()) };
        pools.next_tick = self.now.saturating_add(pools.interval);
        self.emulator.set_now_ms(self.now);
        match self.runtime.block_on(pools.updater.tick_at(self.now))? {
            Tick::Idle => {}
            Tick::LockFailed(err) => self.pool_lines.push(format!("tick at {}: {err}", Ms(self.now))),
            Tick::Ran(s) => {
                let made = if s.created + s.deleted > 0 {
                    format!(" ({} created, {} deleted)", s.created, s.deleted)
                } else {
                    String::new()
                };
                self.pool_lines.push(format!(
                    "tick at {}: {} group(s): {} written{made}, {} unchanged, {} requeued, {} dropped, {} abandoned",
                    Ms(self.now),
                    s.groups,
                    s.written,
                    s.unchanged,
                    s.requeued,
                    s.dropped,
                    s.abandoned
                ));
            }
        }
        Ok(())
    }

    /// Nothing queued for the backend-pool updater (always, outside multi-SLB mode).
    fn pools_idle(&self) -> Result<bool, LogicError> {
        match &self.pools {
            None => Ok(true),
            Some(pools) => Ok(pools.updater.status_at(self.now)?.queued == 0),
        }
    }

    /// Runs everything due at this instant: watch events, then commands and their outcomes.
    fn run_instant(&mut self) -> Result<(), LogicError> {
        for _ in 0..MAX_CALLS_PER_INSTANT {
            let events = self.cluster.take_watch_events();
            if !events.is_empty() {
                self.produce_pool_operations()?;
                let step = self.logic.observe(self.now, &events)?;
                self.absorb(step);
                continue;
            }
            if self.pending.is_empty() {
                return Ok(());
            }
            let issued = std::mem::take(&mut self.pending);
            // ARM's buckets refill by the virtual time the commands run at.
            self.emulator.set_now_ms(self.now);
            let (emulator, cluster) = (self.emulator.clone(), self.cluster.clone());
            let executor = Executor::new(&*emulator, &*cluster);
            let mut results = Vec::with_capacity(issued.len());
            for command in issued {
                let released = self.pod_release(&command.command);
                let outcome = self.runtime.block_on(executor.execute(&command.command));
                if let (Some(pod), wit::Outcome::Ok) = (released, &outcome) {
                    self.release_checked(&pod);
                }
                self.records.push(CommandRecord {
                    at_ms: self.now,
                    id: command.id,
                    line: describe_command(&command.command),
                    outcome: describe_outcome(&outcome),
                    detail: format!("{} {:?}", command.id, command.command),
                });
                results.push((command.id, outcome));
            }
            let figure = self.emulator.take_arm_remaining_writes();
            let step = self.logic.complete(self.now, &results, figure)?;
            self.absorb(step);
        }
        Err(livelock(self.now))
    }

    /// Wakes the guest at the time it asked for, or ticks the backend-pool updater, whichever
    /// comes first (the guest on a tie), if that is no later than `until`.
    fn wake_before(&mut self, until: u64, ticks_now: &mut usize) -> Result<bool, LogicError> {
        let guest_at = self.wake.filter(|at| *at <= until);
        let pool_at = self.pools.as_ref().map(|p| p.next_tick).filter(|at| *at <= until);
        if let Some(pool_at) = pool_at.filter(|p| guest_at.is_none_or(|g| *p < g)) {
            self.now = self.now.max(pool_at);
            self.pool_tick()?;
            return Ok(true);
        }
        let Some(at) = guest_at else { return Ok(false) };
        if at <= self.now {
            *ticks_now += 1;
            if *ticks_now > MAX_CALLS_PER_INSTANT {
                return Err(livelock(self.now));
            }
        } else {
            *ticks_now = 0;
            self.now = at;
        }
        let step = self.logic.tick(self.now)?;
        self.absorb(step);
        Ok(true)
    }

    fn advance(&mut self, by: u64) -> Result<(), LogicError> {
        let until = self.now.saturating_add(by);
        let mut ticks_now = 0;
        self.run_instant()?;
        while self.wake_before(until, &mut ticks_now)? {
            self.run_instant()?;
        }
        self.now = until;
        Ok(())
    }

    fn settle(&mut self, within: u64) -> Result<Check, LogicError> {
        let (start, until) = (self.now, self.now.saturating_add(within));
        let mut ticks_now = 0;
        loop {
            self.run_instant()?;
            if self.idle && self.pools_idle()? {
                let took = Ms(self.now - start);
                return Ok(Check { what: format!("settled after {took}"), ok: true, detail: None });
            }
            if !self.wake_before(until, &mut ticks_now)? {
                let why = match self.wake {
                    None => "the guest is not idle and asked to be woken at no time".to_owned(),
                    Some(at) => format!("its next wake-up is at {}", Ms(at)),
                };
                self.now = until;
                return Ok(Check {
                    what: format!("settles within {}", Ms(within)),
                    ok: false,
                    detail: Some(format!("not idle at {}: {why}", Ms(until))),
                });
            }
        }
    }

    fn request_count(&self) -> u64 {
        self.emulator.state().requests.values().sum()
    }

    /// The faulted requests among those handled since `before` requests.
    fn faults_since(&self, before: u64) -> Vec<String> {
        let state = self.emulator.state();
        let new = usize::try_from(state.requests.values().sum::<u64>() - before).unwrap_or(usize::MAX);
        let log = &state.log[state.log.len().saturating_sub(new)..];
        log.iter()
            .filter(|e| e.outcome.ends_with("(fault)") || e.outcome.ends_with("(throttled)"))
            .map(|e| format!("{} [{}] → {}", e.operation, e.resources.join(", "), e.outcome))
            .collect()
    }

    /// `expect.metrics`: the logic's figures read now, rendered as `/metrics` renders them (its
    /// counters kept monotonic across restarts and swaps, as there).
    fn expect_metrics(&mut self, want: &BTreeMap<String, f64>) -> Result<Vec<Check>, LogicError> {
        if want.is_empty() {
            return Ok(Vec::new());
        }
        let Some(stats) = self.logic.stats(self.now)? else {
            let detail = Some("this run's reconciler does not report the logic's figures".to_owned());
            return Ok(vec![Check { what: "metrics".into(), ok: false, detail }]);
        };
        self.figures.update("logic", stats, self.now);
        let exposition = self.figures.exposition("logic", self.now);
        Ok(want
            .iter()
            .map(|(sample, value)| {
                let found = exposition
                    .lines()
                    .find_map(|line| line.strip_prefix(sample.as_str())?.strip_prefix(' '))
                    .map(|v| v.split(' ').next().unwrap_or(v).parse::<f64>().unwrap_or(f64::NAN));
                let detail = match found {
                    Some(found) if found == *value => None,
                    Some(found) => Some(format!("found {found}")),
                    None => {
                        let family = sample.split('{').next().unwrap_or(sample);
                        let near: Vec<&str> = exposition.lines().filter(|l| l.starts_with(family)).collect();
                        Some(format!(
                            "no such sample; {family} has: {}",
                            if near.is_empty() { "nothing".into() } else { near.join(", ") }
                        ))
                    }
                };
                Check { what: format!("metric {sample} = {value}"), ok: detail.is_none(), detail }
            })
            .collect())
    }

    fn expect(&self, expectation: &Expectation) -> Vec<Check> {
        let mut checks = Vec::new();
        let resources = self.emulator.resources();
        let view = nrp_view(&resources);
        let mut check = |what: String, found: Option<String>| {
            checks.push(Check { what, ok: found.is_none(), detail: found });
        };
        if let Some(nrp) = &expectation.nrp {
            if let Some(services) = &nrp.services {
                let found = (&view.services != services).then(|| format!("found {:?}", view.services));
                check(format!("nrp.services = {services:?}"), found);
            }
            if let Some(locations) = &nrp.locations {
                let want: NrpLocations = locations
                    .iter()
                    .map(|(l, a)| (l.0.clone(), a.iter().map(|(a, s)| (a.0.clone(), s.clone())).collect()))
                    .collect();
                let found = (view.locations != want).then(|| format!("found {}", locations_text(&view.locations)));
                check(format!("nrp.locations = {}", locations_text(&want)), found);
            }
            if let Some(outbound) = &nrp.outbound_services {
                let found: BTreeSet<String> = resources
                    .services
                    .iter()
                    .filter(|(_, s)| !s.is_default && s.service_type.eq_ignore_ascii_case("Outbound"))
                    .map(|(name, _)| name.clone())
                    .collect();
                let what = format!("nrp.outboundServices = {outbound:?}");
                check(what, (&found != outbound).then(|| format!("found {found:?}")));
            }
        }
        for (object, want) in &expectation.status {
            let service = self.cluster.service(&object.namespace, &object.name);
            let ingress: Vec<String> = service
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
                .unwrap_or_default();
            let holds = match want {
                StatusExpectation::Present => !ingress.is_empty(),
                StatusExpectation::Absent => ingress.is_empty(),
                StatusExpectation::Deleted => service.is_none(),
                StatusExpectation::Ip(ip) => ingress == [ip.clone()],
            };
            let found = match &service {
                None => "the Service does not exist".to_owned(),
                Some(_) if ingress.is_empty() => "no ingress IP".to_owned(),
                Some(_) => format!("ingress {ingress:?}"),
            };
            check(format!("status {object}: {want}"), (!holds).then_some(found));
        }
        let pods = self.cluster.pods();
        for (object, want) in &expectation.pod_finalizers {
            let pod = pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(object.namespace.as_str())
                    && p.metadata.name.as_deref() == Some(object.name.as_str())
            });
            let finalizers: Option<BTreeSet<String>> =
                pod.map(|p| p.metadata.finalizers.clone().unwrap_or_default().into_iter().collect());
            let holds = match want {
                PodFinalizersExpectation::Exactly(want) => finalizers.as_ref() == Some(want),
                PodFinalizersExpectation::Deleted => finalizers.is_none(),
            };
            let found = match &finalizers {
                None => "the Pod does not exist".to_owned(),
                Some(f) => format!("finalizers {f:?}"),
            };
            check(format!("podFinalizers {object}: {want}"), (!holds).then_some(found));
        }
        let events = self.cluster.events();
        for want in &expectation.events {
            let object = want.object.to_string();
            let type_name = want.event_type.map(|t| match t {
                EventTypeName::Normal => "Normal",
                EventTypeName::Warning => "Warning",
            });
            let matching = events
                .iter()
                .filter(|e| {
                    e.reason == want.reason && e.object == object && type_name.is_none_or(|t| e.event_type == t)
                })
                .count();
            let holds = want.count.map_or(matching > 0, |n| matching == n);
            let found = events.iter().filter(|e| e.object == object).map(|e| e.reason.as_str()).collect::<Vec<_>>();
            let times = want.count.map(|n| format!(" ×{n}")).unwrap_or_default();
            let what = format!(
                "event {}{} on {object}{times}",
                type_name.map(|t| format!("{t} ")).unwrap_or_default(),
                want.reason
            );
            check(what, (!holds).then(|| format!("events on {object}: {found:?}")));
        }
        if let Some(want) = &expectation.logic {
            match self.logic.logic_status() {
                None => check("logic".into(), Some("this run's reconciler has no supervised logic".into())),
                Some(status) => {
                    if let Some(serving) = &want.serving {
                        let found =
                            (status.serving != serving.to_string()).then(|| format!("found {}", status.serving));
                        check(format!("logic.serving = {serving}"), found);
                    }
                    if let Some(rollbacks) = want.rollbacks {
                        let found = (status.rollbacks != rollbacks).then(|| format!("found {}", status.rollbacks));
                        check(format!("logic.rollbacks = {rollbacks}"), found);
                    }
                    if let Some(quarantined) = want.quarantined_inputs {
                        let found =
                            (status.quarantined != quarantined).then(|| format!("found {}", status.quarantined));
                        check(format!("logic.quarantinedInputs = {quarantined}"), found);
                    }
                }
            }
        }
        if let Some(want) = &expectation.shadow {
            match self.logic.shadow_status() {
                None => check("shadow".into(), Some("no candidate ran in shadow".into())),
                Some(status) => {
                    if let Some(divergences) = &want.divergences {
                        let found =
                            (&status.divergences != divergences).then(|| format!("found {:?}", status.divergences));
                        check(format!("shadow.divergences = {divergences:?}"), found);
                    }
                    if let Some(promoted) = want.promoted {
                        let is = status.state == ShadowState::Promoted;
                        let found = (is != promoted).then(|| {
                            format!("found {is} ({} inputs compared, the last {} clean)", status.compared, status.clean)
                        });
                        check(format!("shadow.promoted = {promoted}"), found);
                    }
                }
            }
        }
        if !expectation.azure_calls.is_empty() {
            let calls = self.emulator.state().requests;
            for (op, want) in &expectation.azure_calls {
                let made = calls.get(op.name()).copied().unwrap_or(0);
                check(format!("azure calls {op} = {want}"), (made != *want).then(|| format!("found {made}")));
            }
        }
        if let Some(want) = &expectation.resources {
            if let Some(ips) = &want.public_ips {
                let found: BTreeSet<String> = resources.public_ips.keys().cloned().collect();
                check(format!("resources.publicIps = {ips:?}"), (&found != ips).then(|| format!("found {found:?}")));
            }
            if let Some(lbs) = &want.load_balancers {
                let found: BTreeSet<String> = resources.load_balancers.keys().cloned().collect();
                let what = format!("resources.loadBalancers = {lbs:?}");
                check(what, (&found != lbs).then(|| format!("found {found:?}")));
            }
            if let Some(gateways) = &want.nat_gateways {
                let found: BTreeSet<String> = resources.nat_gateways.keys().cloned().collect();
                let what = format!("resources.natGateways = {gateways:?}");
                check(what, (&found != gateways).then(|| format!("found {found:?}")));
            }
        }
        for (name, want) in &expectation.backend_pools {
            let key = crate::emulator::core::pool_key(&name.load_balancer, &name.pool);
            let found: Option<BTreeSet<String>> = resources
                .backend_pools
                .get(&key)
                .map(|p| p.addresses.iter().map(|a| canonical_ip(&a.properties.ip_address)).collect());
            let detail = match (want, found) {
                (PoolExpectation::Deleted, None) => None,
                (PoolExpectation::Deleted, Some(found)) => Some(format!("found a pool holding {found:?}")),
                (PoolExpectation::Holds(_), None) => Some("no such backend pool".to_owned()),
                (PoolExpectation::Holds(ips), Some(found)) => {
                    let ips: BTreeSet<String> = ips.iter().map(|ip| ip.0.clone()).collect();
                    (found != ips).then(|| format!("found {found:?}"))
                }
            };
            check(format!("backendPools {name} = {want}"), detail);
        }
        if expectation.invariants {
            checks.extend(self.invariants(&view));
        }
        checks
    }

    /// P5/P6 of upstream §j, from what NRP refused, and the convergence of NRP to the cluster.
    fn invariants(&self, view: &NrpView) -> Vec<Check> {
        let log = self.emulator.state().log;
        let refused = |code: &str| -> Vec<String> {
            log.iter()
                .filter(|e| !e.outcome.ends_with("(fault)") && e.outcome.split(' ').nth(1) == Some(code))
                .map(|e| format!("{} [{}]", e.operation, e.resources.join(", ")))
                .collect()
        };
        let mut checks = Vec::new();
        for (what, codes) in [
            (
                "no service unregistered while addresses reference it",
                &["ServiceWithOverlayMappingsCannotBeDeleted"][..],
            ),
            ("no address names an unregistered service", &["ServiceNotFound"]),
            (
                "the outbound order held: public IPs before their NAT gateway, the NAT gateway before the \
                 registration, disassociation and unregistering before the deletes",
                &[
                    "InvalidResourceReference",
                    "NatGatewayNotAssociatedWithServiceGateway",
                    "NatGatewayInUseByServiceGateway",
                    "InUseNatGatewayCannotBeDeleted",
                    "PublicIPAddressInUse",
                ],
            ),
        ] {
            let found: Vec<String> = codes.iter().flat_map(|code| refused(code)).collect();
            let detail =
                (!found.is_empty()).then(|| format!("Azure refused with {}: {}", codes.join("/"), found.join("; ")));
            checks.push(Check { what: what.to_owned(), ok: detail.is_none(), detail });
        }
        let (mut expected, strays) = self.ready_view(&view.services);
        self.add_egress(&mut expected);
        let detail = (!strays.is_empty())
            .then(|| format!("registered, but no live Service has the UID: {strays:?}"))
            .or_else(|| {
                (expected != view.locations)
                    .then(|| format!("the cluster's ready endpoints give {}", locations_text(&expected)))
            });
        checks.push(Check {
            what: "NRP holds exactly the ready endpoints of the registered live Services and the egress pods of the \
                   registered Outbound services"
                .into(),
            ok: detail.is_none(),
            detail,
        });
        checks.extend(self.egress_invariants());
        checks
    }

    /// The outbound rules, from the emulator's resources and the cluster: an Outbound service
    /// registered with a NAT gateway has that NAT gateway, associated (NRP refuses the
    /// reference otherwise, but a later delete could break it); every NAT gateway belongs to a
    /// registered Outbound service that names it (none is left behind by a teardown); and an
    /// Outbound service the controller registered with its NAT gateway is carried by a live pod
    /// (the last pod's going tears it down). Outbound services registered before the first step
    /// carry no NAT gateway: somebody else's, left alone.
    fn egress_invariants(&self) -> Vec<Check> {
        let resources = self.emulator.resources();
        let linked: BTreeMap<String, String> = resources
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Outbound") && !s.is_default)
            .filter_map(|(name, s)| {
                let id = s.public_nat_gateway_id.as_ref()?;
                Some((name.to_ascii_lowercase(), id.rsplit('/').next().unwrap_or_default().to_owned()))
            })
            .collect();
        let carried: BTreeSet<String> = self
            .cluster
            .pods()
            .iter()
            .map(crate::records::pod)
            .filter(|p| matches!(p.phase.as_deref(), Some("Running" | "Pending")) && !p.deleting)
            .filter_map(|p| p.egress_label.map(|l| l.to_ascii_lowercase()))
            .collect();
        let broken: Vec<String> = linked
            .iter()
            .filter(|(_, nat)| !resources.nat_gateways.get(*nat).is_some_and(|n| n.associated))
            .map(|(service, nat)| format!("{service} → {nat}"))
            .collect();
        let stray: Vec<&String> =
            resources.nat_gateways.keys().filter(|nat| !linked.values().any(|l| l == *nat)).collect();
        let uncarried: Vec<&String> = linked.keys().filter(|service| !carried.contains(*service)).collect();
        let check = |what: &str, detail: Option<String>| Check { what: what.to_owned(), ok: detail.is_none(), detail };
        let early = &self.early_releases;
        vec![
            check(
                "an egress pod's finalizer was released only after its addresses left NRP (the last pod's, after the teardown)",
                (!early.is_empty()).then(|| early.join("; ")),
            ),
            check(
                "an Outbound service registered with a NAT gateway has it, associated",
                (!broken.is_empty()).then(|| format!("missing or not associated: {broken:?}")),
            ),
            check(
                "every NAT gateway belongs to a registered Outbound service",
                (!stray.is_empty()).then(|| format!("named by no registered Outbound service: {stray:?}")),
            ),
            check(
                "an Outbound service registered with its NAT gateway is carried by a live pod",
                (!uncarried.is_empty()).then(|| format!("no live pod carries {uncarried:?}")),
            ),
        ]
    }

    /// The egress pod a command releases the pod finalizer of, as it is before the release.
    fn pod_release(&self, command: &wit::Command) -> Option<wit::Pod> {
        let wit::Command::SetFinalizer(change) = command else { return None };
        if change.present || change.service.kind != "Pod" {
            return None;
        }
        let (namespace, name) = (&change.service.namespace, &change.service.name);
        let pods = self.cluster.pods();
        let pod = pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str()) && p.metadata.name.as_deref() == Some(name)
        })?;
        Some(crate::records::pod(pod))
    }

    /// The invariant "a pod is released only after its addresses left NRP": once an egress
    /// pod's finalizer is released, NRP maps none of its IPs to the identity its label
    /// names (unless a live pod with that label has the IP now), and an identity no live pod
    /// carries any more has no NAT gateway left (the last pod waits for the teardown).
    fn release_checked(&mut self, pod: &wit::Pod) {
        let Some(identity) = pod.egress_label.as_deref().map(str::to_ascii_lowercase).filter(|l| !l.is_empty()) else {
            return;
        };
        let live: Vec<wit::Pod> = self
            .cluster
            .pods()
            .iter()
            .map(crate::records::pod)
            .filter(|p| matches!(p.phase.as_deref(), Some("Running" | "Pending")) && !p.deleting)
            .filter(|p| p.egress_label.as_deref().is_some_and(|l| l.eq_ignore_ascii_case(&identity)))
            .collect();
        let ips = |p: &wit::Pod| -> BTreeSet<String> {
            p.pod_ips.iter().chain(&p.pod_ip).map(|ip| crate::pool_producer::canonical_ip(ip)).collect()
        };
        let kept: BTreeSet<String> = live.iter().flat_map(ips).collect();
        let view = nrp_view(&self.emulator.resources());
        for ip in ips(pod).difference(&kept) {
            if view.locations.values().filter_map(|a| a.get(ip)).any(|services| services.contains(&identity)) {
                self.early_releases
                    .push(format!("pod {}/{} released while NRP maps {ip} to {identity}", pod.namespace, pod.name));
            }
        }
        if live.is_empty() && self.emulator.resources().nat_gateways.contains_key(&identity) {
            self.early_releases.push(format!(
                "pod {}/{}, the last pod of {identity}, released before its NAT gateway was deleted",
                pod.namespace, pod.name
            ));
        }
    }

    /// Adds what NRP should hold for egress: each IP of a Running or Pending pod, not being
    /// deleted, whose egress label (lower-cased) names a registered Outbound service, under the
    /// pod's smallest host IP of the same family (the checker's own statement of the rule).
    fn add_egress(&self, expected: &mut NrpLocations) {
        let outbound: BTreeSet<String> = self
            .emulator
            .resources()
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Outbound") && !s.is_default)
            .map(|(name, _)| name.to_ascii_lowercase())
            .collect();
        let ips = |list: Vec<String>, single: Option<String>| -> Vec<std::net::IpAddr> {
            let texts = if list.is_empty() { single.into_iter().collect() } else { list };
            texts.iter().filter_map(|ip| ip.trim().parse().ok()).collect()
        };
        for pod in self.cluster.pods() {
            let pod = crate::records::pod(&pod);
            let Some(identity) = pod.egress_label.as_ref().map(|l| l.to_ascii_lowercase()) else { continue };
            let live = matches!(pod.phase.as_deref(), Some("Running" | "Pending")) && !pod.deleting;
            if !live || !outbound.contains(&identity) {
                continue;
            }
            let hosts = ips(pod.host_ips, pod.host_ip);
            for address in ips(pod.pod_ips, pod.pod_ip) {
                let host = hosts.iter().filter(|h| h.is_ipv4() == address.is_ipv4()).map(|h| h.to_string()).min();
                if let Some(location) = host {
                    let services = expected.entry(location).or_default().entry(address.to_string()).or_default();
                    services.insert(identity.clone());
                }
            }
        }
    }

    /// The locations NRP should hold for `registered`, from the cluster's objects: each ready
    /// endpoint of a live Service's slices, under its node's smallest InternalIP of the same
    /// family. This is the checker's own statement of the rule, independent of the guest's.
    /// Also returns the registered services that belong to no live Service.
    fn ready_view(&self, registered: &BTreeSet<String>) -> (NrpLocations, Vec<String>) {
        let live: BTreeSet<String> = self
            .cluster
            .services()
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter_map(|s| s.metadata.uid.as_ref().map(|u| u.to_ascii_lowercase()))
            .collect();
        let strays: Vec<String> = registered.iter().filter(|s| !live.contains(*s)).cloned().collect();
        let nodes: BTreeMap<String, Vec<std::net::IpAddr>> = self
            .cluster
            .nodes()
            .iter()
            .map(|n| {
                let ips = crate::records::node(n).internal_ips.iter().filter_map(|ip| ip.trim().parse().ok()).collect();
                (n.metadata.name.clone().unwrap_or_default(), ips)
            })
            .collect();
        let mut expected = NrpLocations::new();
        for slice in self.cluster.slices() {
            let slice = crate::records::endpoint_slice(&slice);
            let Some(owner) = slice.owner_service_uid.as_ref().map(|u| u.to_ascii_lowercase()) else { continue };
            if slice.deleting || !registered.contains(&owner) || !live.contains(&owner) {
                continue;
            }
            for endpoint in slice.endpoints.iter().filter(|e| e.ready != Some(false)) {
                let Some(node_ips) = endpoint.node_name.as_ref().and_then(|n| nodes.get(n)) else { continue };
                for address in endpoint.addresses.iter().filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok()) {
                    let location =
                        node_ips.iter().filter(|ip| ip.is_ipv4() == address.is_ipv4()).map(|ip| ip.to_string()).min();
                    if let Some(location) = location {
                        let services = expected.entry(location).or_default().entry(address.to_string()).or_default();
                        services.insert(owner.clone());
                    }
                }
            }
        }
        (expected, strays)
    }
}

fn livelock(at: u64) -> LogicError {
    LogicError::Guest(GuestError::Trapped {
        call: "tracker",
        trap: format!("livelock: {MAX_CALLS_PER_INSTANT} calls at {} without the guest going quiet", Ms(at)),
    })
}

/// Registered inbound services (not the RP's default) and the locations, as NRP holds them.
pub fn nrp_view(resources: &Resources) -> NrpView {
    NrpView {
        services: resources
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Inbound") && !s.is_default)
            .map(|(name, _)| name.clone())
            .collect(),
        locations: resources.locations.clone(),
    }
}

/// Milliseconds of virtual time, printed as in the scenario files.
struct Ms(u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        scenario::format_ms(self.0, f)
    }
}

fn locations_text(locations: &NrpLocations) -> String {
    if locations.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = locations
        .iter()
        .map(|(location, addresses)| {
            let addresses: Vec<String> = addresses
                .iter()
                .map(|(a, s)| format!("{a}→{}", s.iter().cloned().collect::<Vec<_>>().join("+")))
                .collect();
            format!("{location}: {}", addresses.join(" "))
        })
        .collect();
    format!("{{{}}}", parts.join("; "))
}

/// The run's Azure writes per operation (what ARM's and NRP's write budgets count), its reads
/// and its Events, on one line.
pub fn calls_text(calls: &BTreeMap<String, u64>, events: usize) -> String {
    let is_write = |name: &str| Operation::ALL.iter().any(|op| op.name() == name && op.is_write());
    let (writes, reads): (Vec<_>, Vec<_>) = calls.iter().partition(|(name, _)| is_write(name));
    let total: u64 = writes.iter().map(|(_, n)| *n).sum();
    let reads: u64 = reads.iter().map(|(_, n)| *n).sum();
    let writes: Vec<String> = writes.iter().map(|(name, n)| format!("{name} {n}")).collect();
    let detail = if writes.is_empty() { String::new() } else { format!(" ({})", writes.join(", ")) };
    format!("Azure writes: {total}{detail}; reads: {reads}; Events: {events}")
}

/// What ARM last reported of the write tokens left and the 429s of its throttling, on one
/// line; `None` when there is neither (an unlimited emulator).
pub fn arm_text(remaining_writes: Option<u32>, throttled: &BTreeMap<String, u64>) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(left) = remaining_writes {
        parts.push(format!("{left} writes left"));
    }
    if !throttled.is_empty() {
        let counts: Vec<String> = throttled.iter().map(|(name, n)| format!("{name} {n}")).collect();
        parts.push(format!("throttled (429): {}", counts.join(", ")));
    }
    (!parts.is_empty()).then(|| format!("ARM: {}", parts.join("; ")))
}

/// One line per command, for the report.
pub fn describe_command(command: &wit::Command) -> String {
    let name = command_name(command);
    let object = |r: &wit::ObjectRef| format!("{}/{}", r.namespace, r.name);
    let rest = match command {
        wit::Command::ReadNrp | wit::Command::ReadArm => String::new(),
        wit::Command::EmitEvent(e) => {
            let kind = if e.event_type == wit::EventType::Warning { "Warning" } else { "Normal" };
            format!("{kind} {} {}", e.reason, object(&e.regarding))
        }
        wit::Command::UpdateServices(u) => u
            .services
            .iter()
            .map(|s| {
                let what = if s.is_delete {
                    "unregister".to_owned()
                } else if let Some(nat) = &s.public_nat_gateway {
                    format!("register → NAT gateway {nat}")
                } else if s.backend_pools.is_empty() {
                    "unlink".to_owned()
                } else {
                    let pools: Vec<String> =
                        s.backend_pools.iter().map(|p| format!("{}/{}", p.load_balancer, p.pool)).collect();
                    format!("register → {}", pools.join(", "))
                };
                format!("{} {what}", s.name)
            })
            .collect::<Vec<_>>()
            .join("; "),
        wit::Command::UpdateAddressLocations(u) => u
            .locations
            .iter()
            .map(|l| {
                let action = match l.action {
                    wit::UpdateAction::PartialUpdate => "",
                    wit::UpdateAction::FullUpdate => " (full)",
                };
                if l.addresses.is_empty() {
                    return format!("{}: remove", l.location);
                }
                let addresses: Vec<String> = l
                    .addresses
                    .iter()
                    .map(|a| {
                        if a.services.is_empty() {
                            format!("{}→∅", a.address)
                        } else {
                            format!("{}→{}", a.address, a.services.join("+"))
                        }
                    })
                    .collect();
                format!("{}{action}: {}", l.location, addresses.join(" "))
            })
            .collect::<Vec<_>>()
            .join("; "),
        wit::Command::PutPublicIp(ip) => {
            format!("{} {}", ip.name, if ip.version == wit::IpVersion::Ipv6 { "IPv6" } else { "IPv4" })
        }
        wit::Command::PutLoadBalancer(lb) => {
            let rules: Vec<String> = lb
                .rules
                .iter()
                .map(|r| {
                    let protocol = if r.protocol == wit::LbProtocol::Udp { "udp" } else { "tcp" };
                    format!("{protocol} {}→{}", r.frontend_port, r.backend_port)
                })
                .collect();
            format!("{} on {} [{}]", lb.name, lb.public_ip, rules.join(", "))
        }
        wit::Command::PutNatGateway(n) => {
            let ips: Vec<&String> = n.public_ips.iter().chain(&n.public_ips_v6).collect();
            let ips: Vec<&str> = ips.iter().map(|s| s.as_str()).collect();
            format!("{} on {} ({})", n.name, ips.join(", "), if n.associated { "associated" } else { "disassociated" })
        }
        wit::Command::DeleteResource(r) => {
            let kind = match r.kind {
                wit::ResourceKind::PublicIp => "public-ip",
                wit::ResourceKind::LoadBalancer => "load-balancer",
                wit::ResourceKind::NatGateway => "nat-gateway",
            };
            format!("{kind} {}", r.name)
        }
        wit::Command::PatchServiceStatus(s) => format!("{} ingress {:?}", object(&s.service), s.ingress_ips),
        wit::Command::SetFinalizer(f) => {
            format!("{} {}{}", object(&f.service), if f.present { "+" } else { "-" }, f.finalizer)
        }
    };
    if rest.is_empty() { name.to_owned() } else { format!("{name} {rest}") }
}

pub fn describe_outcome(outcome: &wit::Outcome) -> String {
    match outcome {
        wit::Outcome::Ok => "ok".into(),
        wit::Outcome::PublicIpAddress(ip) => ip.clone(),
        wit::Outcome::NrpSnapshot(s) => {
            format!("snapshot: {} services, {} locations", s.services.len(), s.locations.len())
        }
        wit::Outcome::ArmInventory(i) => {
            format!(
                "inventory: {} public IPs, {} load balancers, {} NAT gateways",
                i.public_ips.len(),
                i.load_balancers.len(),
                i.nat_gateways.len()
            )
        }
        wit::Outcome::Failed(f) => {
            let mut text = format!("failed {}", f.status);
            if let Some(code) = &f.code {
                let _ = write!(text, " {code}");
            }
            if let Some(ms) = f.retry_after_ms {
                let _ = write!(text, " (retry after {})", Ms(ms));
            }
            text
        }
    }
}

/// The report as people read it.
/// The logic's own figures at the end of a run, in one line (the `/metrics` families they feed:
/// docs/operations.md, "What to scrape").
fn figures_text(figures: &wit::TrackerStats) -> String {
    let pending: u32 = figures.pending.iter().map(|p| p.count).sum();
    let (mut succeeded, mut failed) = (0, 0);
    for attempt in &figures.attempts {
        *if attempt.success { &mut succeeded } else { &mut failed } += attempt.count;
    }
    let parked: u64 = figures.parked.iter().map(|p| p.count).sum();
    format!(
        "logic's figures: {} Services provisioned, {pending} operations pending; NRP holds {} locations, {} addresses; \
         operations: {succeeded} succeeded, {failed} failed attempts, {parked} parked",
        figures.k8s_services, figures.nrp_locations, figures.nrp_addresses
    )
}

pub fn render(report: &ScenarioReport, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(out, "scenario: {}  ({})", report.name, report.path)?;
    for step in &report.steps {
        writeln!(out, "  [{}] t={} {}", step.index, Ms(step.at_ms), step.summary)?;
        for c in &step.commands {
            writeln!(out, "      {:>8} #{} {} → {}", Ms(c.at_ms).to_string(), c.id, c.line, c.outcome)?;
        }
        for fault in &step.faults_hit {
            writeln!(out, "      fault hit: {fault}")?;
        }
        for input in &step.quarantined {
            writeln!(out, "      quarantined: {input}")?;
        }
        for line in &step.backend_pools {
            writeln!(out, "      backend pools: {line}")?;
        }
        for check in &step.checks {
            let mark = if check.ok { "✓" } else { "✗" };
            match &check.detail {
                Some(detail) => writeln!(out, "      {mark} {}: {detail}", check.what)?,
                None => writeln!(out, "      {mark} {}", check.what)?,
            }
        }
    }
    writeln!(out, "  final NRP: services {:?}", report.final_nrp.services)?;
    writeln!(out, "             locations {}", locations_text(&report.final_nrp.locations))?;
    writeln!(out, "  {}", calls_text(&report.azure_calls, report.events.len()))?;
    if let Some(line) = arm_text(report.arm_remaining_writes, &report.throttled) {
        writeln!(out, "  {line}")?;
    }
    if let Some(figures) = &report.figures {
        writeln!(out, "  {}", figures_text(figures))?;
    }
    if let Some(why) = &report.aborted {
        writeln!(out, "  ✗ aborted: {why}")?;
    }
    writeln!(out, "  result: {}", if report.passed { "PASS" } else { "FAIL" })
}
