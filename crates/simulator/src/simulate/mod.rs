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
//! [`PoolUpdater`] runs too, on the same emulator and cluster: whenever the logic is handed
//! watch events, the producer first reads the cluster as they tell it (so a stale list or a
//! lost event misleads it as it misleads the logic), asks the guest where each Service belongs
//! (`place-service`), records the assignment, computes the node IPs of the Service's ready
//! endpoints and enqueues the change against what it enqueued last (upstream's `applyIPChangesAmongLocalServiceBackendPoolsByIPFamily`: a
//! remove of the IPs no longer expected, an add of the whole expected list); a Service new to a
//! load balancer starts from what its pool holds in Azure, as a reconcile that read the load
//! balancer would. The updater ticks every `azure.backendPoolUpdateInterval` of virtual time.
//! The producer is [`clb_executor::pool_producer`], shared with `clb-host run`; here it recomputes
//! every Service whenever anything changed, which a scenario's size makes cheap.

mod expect;
mod perturb;
mod pools;
mod reconciler;
mod report;
mod watch;

pub use reconciler::{
    ComponentReconciler, LogicError, LogicStatus, PoolReconciler, Reconciler, Supervised, SwapResult,
};
pub use report::{
    Check, CommandRecord, NrpLocations, NrpView, ScenarioReport, StepReport, arm_text, calls_text, describe_command,
    describe_outcome, nrp_view, render,
};
use report::{Ms, locations_text};

use crate::cluster::{Cluster, ClusterError};
pub use crate::perturbation::Perturbation;
use crate::scenario::{
    self, EventTypeName, Expectation, PodFinalizersExpectation, PoolExpectation, Scenario, StatusExpectation, Step,
    SwapExpect,
};
use clb_azure::{AzureApi, BackendPool, LbRule, LoadBalancerSpec, PoolRef, PublicIpSpec};
use clb_emulator::{Emulator, EmulatorConfig};
use clb_executor::Executor;
use clb_executor::backend_pools::{InMemoryLock, PoolUpdater, PoolWrite};
use clb_executor::pool_producer::{PoolProducer, WatchedCluster};
use clb_sandbox::GuestError;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::SlbConfiguration;
use clb_sandbox::supervisor::ShadowState;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a crash of the crash class says in the step's report.
const CRASHED: &str = "the controller dies; a new one starts from the cluster and Azure";

/// Calls at one instant after which the run is declared a livelock (a guest bug).
const MAX_CALLS_PER_INSTANT: usize = 10_000;

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

/// Runs one scenario through `logic` against a fresh emulator and cluster.
pub fn run(scenario: &Scenario, logic: &mut dyn Reconciler) -> Result<ScenarioReport, SimulateError> {
    let options = RunOptions { perturbation: scenario.perturbation, settle_at_end_ms: None };
    run_with(scenario, logic, &options).map(|ran| ran.report)
}

/// How [`run_with`] runs a scenario.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub perturbation: Option<Perturbation>,
    /// After the last step, run the system for this much virtual time and then until it is idle
    /// (or as long again), so that a run perturbed near its end gets the time to finish what it
    /// began, and the logic's periodic reads of NRP (which repair what a write it did not make
    /// changed) happen.
    pub settle_at_end_ms: Option<u64>,
}

/// The points of a run where a perturbation can be injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Points {
    /// Commands sent (or about to be: a crash before one counts it).
    pub commands: u64,
    /// Calls into the logic.
    pub inputs: u64,
    /// Ticks of the backend-pool updater.
    pub pool_ticks: u64,
    /// How many groups each tick drained, by the tick's index (0 for a tick with nothing to
    /// do): a tick with more than one has a point between two groups' writes.
    pub pool_groups: Vec<u64>,
    /// The watch's deliveries after the start-up lists, in order.
    pub deliveries: Vec<Delivery>,
}

/// One delivery of watch events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    pub events: u64,
    /// The objects its events are about.
    pub objects: u64,
}

/// A run's report, its points, whether its perturbation was reached, and the world it left.
pub struct Ran {
    pub report: ScenarioReport,
    pub points: Points,
    pub perturbed: bool,
    /// With [`RunOptions::settle_at_end_ms`], the invariants of `expect: {invariants: true}` once
    /// the run settled (those over the run's history, such as the outbound order and no egress
    /// pod released early, cover every step).
    pub invariants: Vec<Check>,
    pub emulator: Arc<Emulator>,
    pub cluster: Arc<Cluster>,
}

/// Runs one scenario as [`run`] does, with `options`.
pub fn run_with(scenario: &Scenario, logic: &mut dyn Reconciler, options: &RunOptions) -> Result<Ran, SimulateError> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().map_err(SimulateError::Runtime)?;
    // Azure as the scenario found it is not the controller's doing: it is set up unthrottled,
    // and ARM's limits start, buckets full, with the first step.
    let unlimited = EmulatorConfig { arm_limits: None, ..EmulatorConfig::default() };
    let mut sim = Simulation {
        logic,
        emulator: Arc::new(Emulator::with_config(clb_emulator::scope(), unlimited)),
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
        scenario,
        lists_miss: Vec::new(),
        watch: watch::Watch::default(),
        watched: WatchedCluster::default(),
        perturbation: options.perturbation,
        points: Points::default(),
        perturbed: false,
        perturbed_lines: Vec::new(),
        late: None,
        excused: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut aborted = sim
        .set_up_azure(scenario)
        .and_then(|()| {
            sim.emulator.set_arm_limits(scenario.azure.arm_limits.0);
            if let Some(Perturbation::Stale { listed_at: 0, .. }) = sim.perturbation {
                sim.watch.snapshot = Some(sim.cluster.list());
            }
            sim.restart()
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
            perturbed: Vec::new(),
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
            Step::Restart => sim.restart(),
            Step::RestartWithStaleLists(stale) => {
                sim.lists_miss.clone_from(&stale.missing);
                sim.restart()
            }
            Step::Swap(swap) => {
                let now = sim.now;
                sim.supervised("a swap").and_then(|logic| logic.swap(now, &swap.component))
            }
            .map(|result| {
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
            Step::Shadow(shadow) => sim.supervised("a shadow").and_then(|logic| logic.shadow(shadow)).map(|result| {
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
        report.perturbed = std::mem::take(&mut sim.perturbed_lines);
        report.quarantined = sim.logic.supervised().map(Supervised::take_quarantined).unwrap_or_default();
        report.backend_pools = std::mem::take(&mut sim.pool_lines);
        steps.push(report);
        aborted = result.err();
    }
    let mut invariants = Vec::new();
    if aborted.is_none()
        && let Some(within) = options.settle_at_end_ms
    {
        aborted = sim.advance(within).and_then(|()| sim.settle(within)).err();
        invariants = sim.invariants(&nrp_view(&sim.emulator.resources()));
    }
    let figures = match aborted {
        None => sim.logic.stats(sim.now).map(Some).unwrap_or_else(|error| {
            aborted = Some(error);
            None
        }),
        Some(_) => None,
    };
    let passed = aborted.is_none() && steps.iter().flat_map(|s| &s.checks).all(|c| c.ok);
    let state = sim.emulator.state();
    let report = ScenarioReport {
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
    };
    let (points, perturbed, emulator, cluster) = (sim.points, sim.perturbed, sim.emulator, sim.cluster);
    Ok(Ran { report, points, perturbed, invariants, emulator, cluster })
}

/// The backend-pool updater of multi-SLB local-service mode and its producer's memory.
struct PoolSim {
    updater: PoolUpdater<Arc<Emulator>, InMemoryLock, Arc<Cluster>>,
    configurations: Vec<SlbConfiguration>,
    /// The cluster's name, as placement reads it.
    cluster_name: String,
    interval: u64,
    next_tick: u64,
    /// Ticks of this term so far.
    ticks: u64,
    producer: PoolProducer,
}

/// A deposed leader's write in flight (the failover class).
enum Late {
    /// A command of the logic's.
    Command(wit::Command),
    /// A backend-pool write of the updater's tick.
    PoolWrite(PoolWrite),
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
    figures: clb_sandbox::figures::Figures,
    scenario: &'l Scenario,
    /// What the next restart's lists leave out (`restart-with-stale-lists`).
    lists_miss: Vec<scenario::ObjectOfKind>,
    watch: watch::Watch,
    /// The cluster as the logic was told it (the batches it was given since the controller
    /// started): what the backend-pool producer reads, as `clb-host run`'s does.
    watched: WatchedCluster,
    perturbation: Option<Perturbation>,
    points: Points,
    /// Whether the perturbation was reached.
    perturbed: bool,
    /// What it did, for the step's report.
    perturbed_lines: Vec<String>,
    /// A deposed leader's write in flight, and when Azure applies it (the failover class).
    late: Option<(Late, u64)>,
    /// The emulator's log entries of that write, which the invariants do not hold against
    /// this controller.
    excused: Vec<std::ops::Range<usize>>,
}

impl Simulation<'_> {
    /// The supervisor around the logic, for a step that needs one (`what`).
    fn supervised(&mut self, what: &'static str) -> Result<&mut dyn Supervised, LogicError> {
        self.logic.supervised().ok_or(LogicError::Unsupervised(what))
    }

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
        use clb_azure::{FRONTEND_NAME, IpVersion, wire};
        let failed = |e: clb_azure::AzureError| LogicError::AzureSetup(e.to_string());
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
                    protocol: clb_azure::Protocol::Tcp,
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
        let outbound: Vec<clb_azure::ServiceRequest> = scenario
            .azure
            .outbound_services
            .iter()
            .map(|name| clb_azure::ServiceRequest {
                name: name.clone(),
                service_type: clb_azure::ServiceType::Outbound,
                backend_pools: Vec::new(),
                nat_gateway: clb_azure::NatGatewayLink::Omit,
                is_delete: false,
            })
            .collect();
        if !outbound.is_empty() {
            let action = clb_azure::UpdateAction::PartialUpdate;
            self.runtime.block_on(self.emulator.update_services(action, &outbound)).map_err(failed)?;
        }
        Ok(())
    }

    /// A new tracker; undelivered watch events are dropped and the lists replayed instead. In
    /// multi-SLB local-service mode a new backend-pool updater too: the queue and the
    /// producer's memory die with the process.
    fn restart(&mut self) -> Result<(), LogicError> {
        let missing = std::mem::take(&mut self.lists_miss);
        let mut lists = self.cluster.list();
        lists.retain(|o| !missing.iter().any(|m| listed_as(o, m)));
        self.start_from(&lists)
    }

    /// [`Simulation::restart`] with the lists the new controller reads.
    fn start_from(&mut self, lists: &[wit::Observation]) -> Result<(), LogicError> {
        let scenario = self.scenario;
        self.cluster.drop_watch_events();
        self.watch.restarted();
        self.watched = WatchedCluster::default();
        self.pending.clear();
        self.pools = None;
        self.logic.start(&scenario.config)?;
        self.observe(lists)?;
        self.start_pools()?;
        Ok(())
    }

    /// Hands the logic a batch of observations; the backend-pool producer sees the batch
    /// first, as in `clb-host run`.
    fn observe(&mut self, batch: &[wit::Observation]) -> Result<(), LogicError> {
        for observation in batch {
            self.watched.apply(observation);
        }
        self.produce_pool_operations()?;
        self.before_input()?;
        self.watch.told(batch);
        // In calls of bounded size, as `clb-host run` hands them over (a restart's lists are the
        // whole cluster).
        let mut steps = Vec::new();
        let last = clb_sandbox::logic::observe_in_calls(&mut *self.logic, self.now, batch, |step| steps.push(step))?;
        for step in steps.into_iter().chain([last]) {
            self.absorb(step);
        }
        Ok(())
    }

    /// Runs everything due at this instant: watch events, then commands and their outcomes.
    fn run_instant(&mut self) -> Result<(), LogicError> {
        for _ in 0..MAX_CALLS_PER_INSTANT {
            self.land_late()?;
            let fresh = self.cluster.take_watch_events();
            let events = self.watch.take(fresh, self.now, &self.cluster);
            if !events.is_empty() {
                self.deliver(events)?;
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
            let mut crashed = false;
            for command in issued {
                let index = self.points.commands;
                self.points.commands += 1;
                if self.perturbation == Some(Perturbation::CrashBefore(index)) {
                    self.perturb(CRASHED.to_owned());
                    crashed = true;
                    break;
                }
                if self.perturbation == Some(Perturbation::Failover(index)) {
                    self.in_flight(command.command);
                    crashed = true;
                    break;
                }
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
                if self.perturbation == Some(Perturbation::CrashAfter(index)) {
                    self.perturb(CRASHED.to_owned());
                    crashed = true;
                    break;
                }
                results.push((command.id, outcome));
            }
            if crashed {
                // What the dead controller issued and had not sent dies with it; the new one
                // starts from the cluster and Azure, as `restart` does.
                self.restart()?;
                continue;
            }
            let figure = self.emulator.take_arm_remaining_writes();
            self.before_input()?;
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
        // A perturbed watch's held events or re-list, or a deposed leader's late write, before
        // anything else due with them.
        let late_at = self.late.as_ref().map(|(_, at)| *at);
        let perturbed_at = self.watch.due_at().into_iter().chain(late_at).min().filter(|at| *at <= until);
        if let Some(at) = perturbed_at.filter(|w| guest_at.is_none_or(|g| *w <= g) && pool_at.is_none_or(|p| *w <= p)) {
            self.now = self.now.max(at);
            return Ok(true);
        }
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
        self.before_input()?;
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
            if self.idle && self.pools_idle()? && self.watch.quiet() && self.late.is_none() {
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
}

/// Whether a listed observation is of the object `name` names.
fn listed_as(observation: &wit::Observation, name: &scenario::ObjectOfKind) -> bool {
    clb_sandbox::supervisor::observed_object(observation).is_some_and(|(kind, namespace, object)| {
        let key = if namespace.is_empty() { object.to_owned() } else { format!("{namespace}/{object}") };
        kind == name.kind.name() && key == name.key()
    })
}

fn livelock(at: u64) -> LogicError {
    LogicError::Guest(GuestError::Trapped {
        call: "tracker",
        trap: format!("livelock: {MAX_CALLS_PER_INSTANT} calls at {} without the guest going quiet", Ms(at)),
    })
}
