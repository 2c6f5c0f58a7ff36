//! The stateful core: observations and outcomes in, commands out (docs/design.md §4;
//! docs/upstream.md §b.3, §c.2).
//!
//! * The Kubernetes side is the cache of Services, EndpointSlices and Nodes; the ready endpoints
//!   of every Service being provisioned are folded into the [`DiffTracker`]. That state *is* the
//!   buffer of endpoint changes during creation: they are applied in arrival order and only
//!   reach NRP once the Service is registered, so a pod removed during creation never appears.
//! * Each Service has a lifecycle (NotStarted → CreationInProgress → Created ⇄ UpdateInProgress
//!   → DeletionPending → DeletionInProgress) that runs one command at a time: finalizer, public
//!   IP, load balancer, NRP registration, status; and on deletion, after NRP no longer maps any
//!   address to it: unlink, delete the load balancer, unregister, delete the public IP, release
//!   the finalizer.
//! * Each egress identity a pod carries that NRP does not list gets an outbound lifecycle
//!   ([`egress::outbound`]) on the same machinery: public IP(s), NAT gateway, registration; and
//!   once its last pod has gone and its addresses have drained, the teardown in upstream's order.
//! * An address-location batch carries only registered, live Services, so a failing Service
//!   never blocks another's addresses; and a slow or failing batch costs only the locations it
//!   covers: while one has been in flight for [`timing::SLOW_BATCH_MS`], another may go over
//!   other locations (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two), and a failed
//!   batch's locations back off on their own. Only a throttled batch (429) holds
//!   back every location: the throttle is the subscription's.
//! * Failures back off per Service (1 s doubling to 30 s, deterministic jitter, at least
//!   `Retry-After` up to [`timing::RETRY_AFTER_CAP_MS`]); a periodic read of NRP repairs drift;
//!   nothing is written before the initial lists are complete and NRP has been read.
//! * Every Azure write draws on a token bucket of its kind ([`crate::budget`]): a write with no
//!   token waits, so that a burst of changes coalesces into few calls; a 429 shrinks the bucket's
//!   rate instead of holding everything behind a backoff.
//! * Time is the host's `now`, made monotonic ([`Clock`]); every deadline saturates, and none is
//!   further ahead than [`timing::MAX_DELAY_MS`].

use crate::admission::{Verdict, admit_service};
use crate::budget::WriteKind;
use crate::config::{Config, ConfigError, Mode, validate_config};
use crate::difftracker::View;
use crate::keyed::Set;
use crate::lifecycle::Op;
use crate::model::*;
use crate::name::Name;
use budgets::Budgets;
use egress::identities::Egress;
use egress::outbound::Outbound;

// Each below imports only those above it (ARCHITECTURE.md's layering): the data first, then the
// driver, then what the tracker does with each part; this file, the coordination, is on top.
mod budgets;
mod cache;
mod driver;
pub mod egress;
mod figures;
mod format;
mod inbound;
mod kube;
mod nrp;
mod outbox;
mod service;
mod startup;
mod state;
mod stats;

pub use crate::lifecycle::{backoff_ms, timing};
pub use crate::model::Phase;
use cache::{KubeCache, programmable};
use driver::{Drive, Kind};
use egress::{EgressOut, EgressSide};
pub use figures::{
    AttemptCount, BudgetLevel, DURATION_BOUNDS_MS, Histogram, Operation, Pending, RETRY_BOUNDS, ServiceType, Stats,
};
pub use format::{STATE_VERSION, StateError};
use inbound::Inbound;
use inbound::InboundPeers;
use kube::Endpoints;
use nrp::Nrp;
use nrp::Readiness;
pub use nrp::{MAX_BATCHES_IN_FLIGHT, MAX_LOCATIONS_PER_BATCH};
pub use outbox::MAX_SERVICE_COMMANDS_IN_FLIGHT;
use outbox::*;
pub use service::{FINALIZER, LbConfig, Lifecycle, OpStep, reason};
use startup::Adoption;
use startup::Startup;
pub use state::Tracker;
use stats::FiguresView;

impl Tracker {
    /// A tracker with empty state; refuses a configuration [`validate_config`] refuses.
    pub fn create(config: Config) -> Result<Self, ConfigError> {
        let mode = validate_config(&config)?;
        let nrp = Nrp::new();
        let budgets = Budgets::full(config.write_budgets());
        Ok(Self {
            config,
            mode,
            clock: Clock::default(),
            outbox: Outbox::default(),
            kube: KubeCache::default(),
            inbound: Inbound::default(),
            nrp,
            egress: EgressSide::default(),
            budgets,
            startup: Startup::default(),
            figures: Default::default(),
        })
    }

    /// A tracker as [`Self::create`], but with its start-up inventory of ARM settled and empty,
    /// as a state from before version 4 imports: for the tests of everything but start-up
    /// adoption, which then see the commands they saw before the inventory existed.
    #[cfg(test)]
    pub(crate) fn create_with_arm_settled(config: Config) -> Result<Self, ConfigError> {
        let mut tracker = Self::create(config)?;
        tracker.startup.settle_arm();
        Ok(tracker)
    }

    /// The whole state: `(version, payload)` (the format is `format`'s).
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        (STATE_VERSION, format::export(self))
    }

    /// The state as an older `version` (1 to 8) wrote it, for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_as(&self, version: u32) -> Vec<u8> {
        format::export_older(self, version)
    }

    /// The schema version [`Self::export_state`] writes.
    pub fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    /// A tracker from exported state; anything but one whole, consistent payload of a version
    /// this tracker reads is refused ([`StateError`]).
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        format::import(config, version, payload)
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict last reached for a Service, if the tracker has seen it.
    pub fn verdict(&self, namespace: &str, name: &str) -> Option<&Verdict> {
        self.kube.service(namespace, name).map(|r| &r.verdict)
    }

    /// The spec the tracker provisions a Service with: the last one admitted.
    pub fn admitted_spec(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.kube.service(namespace, name).and_then(|r| r.admitted.as_ref())
    }

    /// A Service's lifecycle phase, by identity (lower-cased UID).
    pub fn phase(&self, identity: &str) -> Option<Phase> {
        self.inbound.lifecycle(identity).map(|l| l.phase)
    }

    /// The NRP mirror: what NRP has accepted, location → address → services.
    pub fn nrp_view(&self) -> View {
        self.nrp.view()
    }

    /// Registered inbound services in the NRP mirror.
    pub fn registered(&self) -> &Set<Name> {
        self.nrp.registered()
    }

    /// What NRP should hold once quiet: the ready-filtered Kubernetes state.
    pub fn desired_view(&self) -> View {
        self.nrp.desired_view(&self.readiness())
    }

    /// Whether nothing is in flight, nothing is dirty and no Service has work left.
    pub fn is_quiet(&self) -> bool {
        self.outbox.in_flight().is_empty() && self.is_quiet_after_events()
    }

    /// The egress side: the pods, the identities they carry and the reference counts (P4).
    pub fn egress(&self) -> &Egress {
        self.egress.identities()
    }

    /// The outbound side: the lifecycles of the egress identities this tracker provisions.
    pub fn outbound(&self) -> &Outbound {
        self.egress.outbound()
    }

    /// What the tracker is doing (WIT `tracker.stats`). `now_ms` is when the write budgets'
    /// levels are taken; nothing changes.
    pub fn stats(&self, now_ms: u64) -> Stats {
        self.figures.stats(self.clock.peek(now_ms), &self.clock, &self.view())
    }

    pub fn observe(&mut self, now_ms: u64, batch: Vec<Observation>) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        for observation in batch {
            match observation {
                // A Service's UID names its Azure resources: with none there is nothing to name
                // them by (the API server always sets one; a host that sends none is wrong).
                Observation::ServiceUpserted(service) if service.uid.trim().is_empty() => {
                    let message = format!("Service {}/{} has no UID: it is ignored", service.namespace, service.name);
                    step.logs.push(LogLine { level: LogLevel::Warn, message });
                }
                Observation::ServiceUpserted(service) => {
                    let verdict = admit_service(&self.config, &service);
                    let identity = service.identity();
                    let (kube, nrp, outbox) = (&mut self.kube, &mut self.nrp, &mut self.outbox);
                    self.inbound.upsert_service(service, verdict, kube, nrp, outbox, &mut step);
                    let (egress, mut out) = self.egress_side();
                    egress.refuse_colliding_pods(&identity, &mut out, &mut step);
                }
                Observation::ServiceDeleted(key) => {
                    if let Some(identity) = self.kube.remove_service(&key) {
                        self.inbound.delete_service(&identity, true, &self.kube, &mut self.nrp);
                    }
                }
                Observation::SliceUpserted(slice) => {
                    if !programmable(&slice.address_type) && !slice.address_type.eq_ignore_ascii_case("FQDN") {
                        let message = format!(
                            "EndpointSlice {}/{}: addressType {:?} is not IPv4, IPv6 or FQDN; its endpoints are not programmed",
                            slice.namespace, slice.name, slice.address_type
                        );
                        step.logs.push(LogLine { level: LogLevel::Warn, message });
                    }
                    self.kube.upsert_slice(slice, &mut Endpoints { diff: self.nrp.desired(), inbound: &self.inbound })
                }
                Observation::SliceDeleted(key) => {
                    self.kube.remove_slice(&key, &mut Endpoints { diff: self.nrp.desired(), inbound: &self.inbound })
                }
                Observation::NodeUpserted(node) => {
                    let mut out = Endpoints { diff: self.nrp.desired(), inbound: &self.inbound };
                    self.kube.upsert_node(node, &mut out, &mut step)
                }
                Observation::NodeDeleted(name) => {
                    self.kube.remove_node(&name, &mut Endpoints { diff: self.nrp.desired(), inbound: &self.inbound })
                }
                Observation::PodUpserted(pod) => {
                    let enabled = self.egress_enabled();
                    let Tracker { egress, inbound, nrp, outbox, kube, .. } = &mut *self;
                    egress.upsert_pod(&pod, inbound, &mut EgressOut { nrp, outbox, kube, enabled }, &mut step)
                }
                Observation::PodDeleted(key) => {
                    if let Some((identity, _)) = self.egress.pod_deleted(&key, &mut self.nrp) {
                        self.carried_changed(&identity);
                    }
                }
                Observation::ListsComplete => {
                    self.kube.complete_lists();
                }
            }
        }
        self.pump(now, &mut step);
        step
    }

    /// [`Self::complete_paced`] with no figure from ARM.
    pub fn complete(&mut self, now_ms: u64, results: Vec<(u64, Outcome)>) -> Step {
        self.complete_paced(now_ms, results, None)
    }

    /// The outcomes of commands, by id, with ARM's remaining-writes figure on the latest of
    /// their answers that carried one.
    pub fn complete_paced(
        &mut self,
        now_ms: u64,
        results: Vec<(u64, Outcome)>,
        arm_remaining_writes: Option<u32>,
    ) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        if let Some(remaining) = arm_remaining_writes {
            // The writes still unanswered after these answers: ARM may not have counted them.
            let answered = |id: &u64| results.iter().any(|(r, _)| r == id);
            let in_flight = self.outbox.arm_writes_unanswered(answered);
            let reserve = self.budgets.arm_write_reserve();
            let in_flight = u32::try_from(in_flight).unwrap_or(u32::MAX);
            self.budgets.reported(remaining, reserve, in_flight, now);
        }
        for (id, outcome) in results {
            // An unknown id is a duplicate or stale answer: ignoring it is safe.
            let Some(what) = self.outbox.answered(id) else { continue };
            match what {
                InFlight::Service { identity, step: op } => {
                    if op.writes_nrp() {
                        self.nrp.write_answered();
                    }
                    let Tracker { outbox, budgets, nrp, figures, inbound, kube, .. } = self;
                    let mut drive = Drive { outbox, budgets, nrp, figures };
                    inbound.service_outcome(&identity, id, op, outcome, now, &mut drive, kube, &mut step);
                }
                InFlight::Outbound { identity, step: op } => {
                    if op.writes_nrp() {
                        self.nrp.write_answered();
                    }
                    let Tracker { outbox, budgets, nrp, figures, egress, .. } = self;
                    let mut drive = Drive { outbox, budgets, nrp, figures };
                    egress.outbound_outcome(&identity, id, op, outcome, now, &mut drive, &mut step);
                }
                InFlight::PodFinalizer { key, uid, present } => self.egress.pod_finalizer_outcome(
                    &mut self.outbox,
                    &key,
                    &uid,
                    id,
                    present,
                    outcome,
                    now,
                    &mut step,
                ),
                InFlight::Locations(batch) => {
                    // What a pod's finalizer waits for may have left NRP.
                    self.egress.locations_answered();
                    let (budgets, figures) = (&mut self.budgets, &mut self.figures);
                    self.nrp.locations_outcome(id, batch, outcome, now, budgets, figures, &mut step)
                }
                InFlight::ReadNrp => {
                    let Some(read) = self.nrp.read_outcome(outcome, now, &mut step) else { continue };
                    self.egress.nrp_read(&read.services, &self.nrp);
                    if self.startup.reconciled() {
                        self.reconcile_with_nrp(now, &mut step);
                    } else {
                        self.maybe_reconcile(now, &mut step);
                    }
                }
                InFlight::ReadArm => {
                    let inventory = self.startup.arm_outcome(outcome, now, &mut step);
                    // Issued only once the lists are complete and NRP is read: start-up
                    // reconciliation runs now, with the inventory (or without it, given up on).
                    self.maybe_reconcile(now, &mut step);
                    if let Some(inventory) = inventory {
                        let Tracker { inbound, egress, kube, nrp, .. } = self;
                        Startup::adopt_from_arm(&inventory, &mut Adoption { inbound, egress, kube, nrp }, &mut step);
                    }
                }
                // Events are best effort; a lost one is not worth a retry.
                InFlight::Event => {}
            }
        }
        self.pump(now, &mut step);
        step
    }

    pub fn tick(&mut self, now_ms: u64) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        self.pump(now, &mut step);
        step
    }

    /// Whether pods carry `identity` changed: the egress side decides, once start-up
    /// reconciliation has run (it decides for every carried identity then) and in CLB mode.
    fn carried_changed(&mut self, identity: &str) {
        let (egress, mut out) = self.egress_side();
        egress.carried_changed(identity, &mut out);
    }

    /// The egress side, and the handle it writes through.
    fn egress_side(&mut self) -> (&mut EgressSide, EgressOut<'_>) {
        let enabled = self.egress_enabled();
        let (nrp, outbox, kube) = (&mut self.nrp, &mut self.outbox, &self.kube);
        (&mut self.egress, EgressOut { nrp, outbox, kube, enabled })
    }

    /// Whether the egress side decides outbound lifecycles: once start-up reconciliation has run
    /// (it decides for every carried identity then), and in CLB mode.
    fn egress_enabled(&self) -> bool {
        self.startup.reconciled() && self.mode == Mode::ContainerLoadBalancer
    }

    /// What the other parts say of an identity's readiness, for the NRP part.
    fn readiness(&self) -> Readiness<'_> {
        let (egress, outbound) = (self.egress.identities(), self.egress.outbound());
        Readiness { lifecycles: self.inbound.lifecycles(), egress, outbound }
    }

    /// Start-up reconciliation runs once: when the lists are complete, NRP has been read and the
    /// ARM inventory is settled.
    fn maybe_reconcile(&mut self, now: u64, step: &mut Step) {
        if self.startup.reconcile_now(&self.kube, &self.nrp) {
            self.reconcile_with_nrp(now, step);
        }
    }

    /// After a read of NRP: re-register what NRP lost, adopt or clean up what it has that
    /// Kubernetes does not explain (docs/upstream.md §c.2.4): the egress side first, then the
    /// inbound one, whose orphans refuse the egress pods that carry their identity.
    fn reconcile_with_nrp(&mut self, now: u64, step: &mut Step) {
        let (egress, mut out) = self.egress_side();
        egress.reconcile_outbound(&mut out, now, step);
        let enabled = self.egress_enabled();
        let Tracker { inbound, egress, kube, nrp, outbox, .. } = self;
        inbound.reconcile_with_nrp(kube, nrp, |identity, nrp| {
            egress.refuse_colliding_pods(identity, &mut EgressOut { nrp, outbox, kube, enabled }, step)
        });
    }

    /// Start-up has ended (upstream's initialization is complete): the lists are in, NRP and ARM
    /// have been read, and no operation is under way — none runnable, no Service or egress
    /// command in flight. An operation parked, or waiting out a retry's backoff, does not hold it
    /// (upstream: a parked or retry-exhausted operation does not block completion), so a Service
    /// that keeps failing does not keep a new leader unready.
    fn start_up_ended(&self) -> bool {
        self.ready_to_write()
            && !self.startup.inventory_wanted(&self.kube, &self.nrp)
            && !self.startup.reading_arm()
            && self.inbound.work().runnable.is_empty()
            && !self.egress.has_runnable()
            && !self.outbox.has_service_command()
    }

    /// What the figures read of the other parts.
    fn view(&self) -> FiguresView<'_> {
        let provisions = self.mode == Mode::ContainerLoadBalancer;
        let (inbound, egress, outbox, nrp, budgets) =
            (&self.inbound, &self.egress, &self.outbox, &self.nrp, &self.budgets);
        FiguresView { inbound, egress, outbox, nrp, budgets, provisions }
    }

    fn ready_to_write(&self) -> bool {
        self.kube.lists_complete() && self.nrp.loaded() && self.startup.reconciled()
    }

    /// Starts whatever can start now (the tracker's time, [`Clock`]); sets when to be called
    /// again (the host's time).
    fn pump(&mut self, now: u64, step: &mut Step) {
        if self.mode != Mode::ContainerLoadBalancer {
            // Outside CLB mode the tracker provisions nothing (the backend-pool updater serves
            // multi-SLB mode), so it is idle once its Events are sent.
            step.idle = step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_)));
            return;
        }
        self.bring_in_deadlines(now);
        self.maybe_reconcile(now, step);
        self.inbound.fire(now);
        self.egress.fire(now);
        let hold_nrp_writes = self.nrp.read_if_due(now, &mut self.outbox, step);
        self.startup.read_arm_if_due(now, &self.kube, &self.nrp, &mut self.outbox, step);
        if self.ready_to_write() {
            let Tracker { outbox, budgets, nrp, figures, inbound, egress, kube, .. } = self;
            let mut drive = Drive { outbox, budgets, nrp, figures };
            inbound.check_drained(&drive);
            // Outbound first: an inbound Service whose identity an egress identity of ours had
            // waits for that teardown (they share NRP's name and the `-pip` name), and the pass
            // that ends it must let the Service go.
            egress.run(&mut drive, kube, now, hold_nrp_writes, step);
            inbound.run(
                &mut drive,
                &mut InboundPeers { outbound: egress.outbound(), kube },
                now,
                hold_nrp_writes,
                step,
            );
            if !hold_nrp_writes {
                let ready = Readiness {
                    lifecycles: self.inbound.lifecycles(),
                    egress: self.egress.identities(),
                    outbound: self.egress.outbound(),
                };
                self.nrp.sync_locations(now, &ready, &mut self.outbox, &mut self.budgets, step);
            }
            let (egress, mut out) = self.egress_side();
            egress.advance_pod_finalizers(now, &mut out, step);
        }
        let ended = self.figures.awaits_start_up_end() && self.start_up_ended();
        // `self.view()` spelled out: it borrows all of `self`, and taking `figures` out around it
        // instead costs the component 1.4 KB (measured).
        let provisions = self.mode == Mode::ContainerLoadBalancer;
        let (inbound, egress, outbox, nrp, budgets) =
            (&self.inbound, &self.egress, &self.outbox, &self.nrp, &self.budgets);
        let view = FiguresView { inbound, egress, outbox, nrp, budgets, provisions };
        self.figures.note(now, &view, ended);
        step.wake_at_ms = self.next_wake(now).map(|at| self.clock.to_host(at));
        step.idle =
            step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))) && self.is_quiet_after_events();
    }

    /// No deadline is further ahead than the longest delay the tracker schedules
    /// ([`timing::MAX_DELAY_MS`]), which its own deadlines never are (its clock does not go back).
    /// One that is was set by a clock ahead of this one (a state imported from another host, or
    /// exported before a step back) or by an older version that honoured any `Retry-After`: it
    /// is brought in to now plus that delay, so nothing waits longer. Costs a look at the last
    /// timer unless there is something to bring in; `advance` does the same for a Service's own
    /// deadline.
    fn bring_in_deadlines(&mut self, now: u64) {
        let latest = now.saturating_add(timing::MAX_DELAY_MS);
        self.nrp.bring_in(latest);
        self.startup.bring_in(latest);
        self.budgets.bring_in(now);
        self.inbound.bring_in(latest);
        self.egress.bring_in(latest);
    }

    /// Quiet once the Events just issued are counted as done (they need no answer to proceed).
    /// Every unsettled lifecycle is in flight, runnable, waiting on a timer or draining, so
    /// looking at those sets is enough: no scan of all Services.
    fn is_quiet_after_events(&self) -> bool {
        let quiet = self.ready_to_write()
            && !self.nrp.has_dirty()
            && self.inbound.work().is_empty()
            && self.egress.is_quiet()
            && self.outbox.only_events();
        // Also under the fuzz crate's `invariants` feature, so that fuzzing checks it.
        #[cfg(any(test, feature = "invariants"))]
        if quiet {
            let lifecycles = self.inbound.lifecycles();
            let settled = lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "a lifecycle with work left is in none of the work sets: {lifecycles:#?}");
            let lifecycles = &self.egress.outbound().lifecycles;
            let settled = lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "an outbound lifecycle with work left is in no work set: {lifecycles:#?}");
        }
        quiet
    }

    fn next_wake(&self, now: u64) -> Option<u64> {
        let mut wake = None;
        let mut consider = |at: u64| wake = Some(wake.map_or(at, |w: u64| w.min(at)));
        let [outbound, pods] = self.egress.next_timers();
        [self.inbound.work().next_timer(), outbound, pods].into_iter().flatten().for_each(&mut consider);
        self.startup.next_read(now, &self.kube, &self.nrp).into_iter().for_each(&mut consider);
        if !self.inbound.work().runnable.is_empty() || self.egress.has_runnable() {
            // A Service held for a token (or for a read of NRP, or for room in flight, which an
            // answer ends: waking for a token then is only early).
            for kind in [WriteKind::Services, WriteKind::Arm] {
                if let Some(at) = self.budgets.token_due(kind, now) {
                    consider(at);
                }
            }
        }
        self.nrp.next_wake(now, &self.budgets, &mut consider);
        wake
    }
}

#[cfg(test)]
mod tests;
