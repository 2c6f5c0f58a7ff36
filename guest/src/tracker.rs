//! The stateful core: observations and outcomes in, commands out (design §4; upstream §b.3,
//! §c.2).
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
//!   ([`crate::outbound`]) on the same machinery: public IP(s), NAT gateway, registration; and
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
use crate::budget::{Buckets, WriteKind};
use crate::config::{Config, ConfigError, Mode, validate_config};
use crate::difftracker::{Class, DiffTracker, View};
use crate::egress::Egress;
use crate::ip;
use crate::model::*;
pub use crate::model::Phase;
use crate::name::{Name, VecMap, VecSet};
use crate::lifecycle::{Attempt, Life, Op, WorkSets, life_fields, retry_delay};
use crate::outbound::{self, OutStep, Outbound, OutboundLifecycle};
use crate::pod_finalizers::{self, PodFinalizers, Want};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use crate::lifecycle::{backoff_ms, timing};


/// The most locations one `update-address-locations` carries.
pub const MAX_LOCATIONS_PER_BATCH: usize = 200;
/// The most Service commands (Azure or Kubernetes) in flight at once.
pub const MAX_SERVICE_COMMANDS_IN_FLIGHT: usize = 16;
/// The most address-location batches in flight at once (each over other locations).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum InFlight {
    Service { identity: String, step: OpStep },
    Locations(Vec<NrpLocation>),
    ReadNrp,
    Event,
    ReadArm,
    /// A command of an egress identity's outbound lifecycle (state version 6).
    Outbound { identity: String, step: OutStep },
    /// The finalizer of an egress pod (state version 7): added (`present`) or released.
    PodFinalizer { key: ObjectKey, uid: String, present: bool },
}

#[derive(Clone, Debug)]
pub struct Tracker {
    config: Config,
    mode: Mode,
    state: State,
    /// Egress pods and identities (state version 2), beside the version-1 [`State`].
    egress: Egress,
    /// The start-up inventory of ARM (state version 4).
    arm: ArmSync,
    /// The write budgets' buckets (state version 5); their shapes are the config's.
    budget: Buckets,
    /// The outbound lifecycles of egress identities (state version 6).
    outbound: Outbound,
    /// The egress pod finalizers (state version 7).
    pods: PodFinalizers,
    /// Time as the tracker counts it: the host's `now`, monotonic (see [`Clock`]). Every
    /// deadline in the state is in this clock's time. Not state: neither exported nor compared.
    clock: Clock,
}

/// Two trackers are equal when their configuration and state are: the clock is not state.
impl PartialEq for Tracker {
    fn eq(&self, other: &Self) -> bool {
        (&self.config, self.mode, &self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods)
            == (
                &other.config,
                other.mode,
                &other.state,
                &other.egress,
                &other.arm,
                &other.budget,
                &other.outbound,
                &other.pods,
            )
    }
}

impl Eq for Tracker {}

impl Tracker {
    /// A tracker with empty state; refuses a configuration [`validate_config`] refuses.
    pub fn create(config: Config) -> Result<Self, ConfigError> {
        let mode = validate_config(&config)?;
        let state =
            State { nrp: NrpSync { batch_limit: MAX_LOCATIONS_PER_BATCH, ..NrpSync::default() }, ..State::default() };
        let budget = Buckets::full(&config.write_budgets());
        Ok(Self {
            config,
            mode,
            state,
            egress: Egress::default(),
            arm: ArmSync::default(),
            budget,
            outbound: Outbound::default(),
            pods: PodFinalizers::default(),
            clock: Clock::default(),
        })
    }


    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict last reached for a Service, if the tracker has seen it.
    pub fn verdict(&self, namespace: &str, name: &str) -> Option<&Verdict> {
        self.state.services.get(&ObjectKey::new(namespace, name)).map(|r| &r.verdict)
    }

    /// The spec the tracker provisions a Service with: the last one admitted.
    pub fn admitted_spec(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.state.services.get(&ObjectKey::new(namespace, name)).and_then(|r| r.admitted.as_ref())
    }

    /// A Service's lifecycle phase, by identity (lower-cased UID).
    pub fn phase(&self, identity: &str) -> Option<Phase> {
        self.state.lifecycles.get(identity).map(|l| l.phase)
    }

    /// The NRP mirror: what NRP has accepted, location → address → services.
    pub fn nrp_view(&self) -> View {
        self.state.diff.nrp_view()
    }

    /// Registered inbound services in the NRP mirror.
    pub fn registered(&self) -> &BTreeSet<Name> {
        self.state.diff.registered()
    }

    /// What NRP should hold once quiet: the ready-filtered Kubernetes state.
    pub fn desired_view(&self) -> View {
        self.state.diff.desired_view(|id| self.class(id))
    }

    /// Whether nothing is in flight, nothing is dirty and no Service has work left.
    pub fn is_quiet(&self) -> bool {
        self.state.in_flight.is_empty() && self.is_quiet_after_events()
    }

    pub fn observe(&mut self, now_ms: u64, batch: Vec<Observation>) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        for observation in batch {
            match observation {
                // A Service's UID names its Azure resources: with none there is nothing to name
                // them by (the API server always sets one; a host that sends none is wrong).
                Observation::ServiceUpserted(service) if service.uid.trim().is_empty() => {
                    let message =
                        format!("Service {}/{} has no UID: it is ignored", service.namespace, service.name);
                    step.logs.push(LogLine { level: LogLevel::Warn, message });
                }
                Observation::ServiceUpserted(service) => self.upsert_service(service, &mut step),
                Observation::ServiceDeleted(key) => self.remove_service_object(&key),
                Observation::SliceUpserted(slice) => {
                    if !programmable(&slice.address_type) && !slice.address_type.eq_ignore_ascii_case("FQDN") {
                        let message = format!(
                            "EndpointSlice {}/{}: addressType {:?} is not IPv4, IPv6 or FQDN; its endpoints are not programmed",
                            slice.namespace, slice.name, slice.address_type
                        );
                        step.logs.push(LogLine { level: LogLevel::Warn, message });
                    }
                    self.upsert_slice(slice)
                }
                Observation::SliceDeleted(key) => self.remove_slice(&key),
                Observation::NodeUpserted(node) => self.upsert_node(node, &mut step),
                Observation::NodeDeleted(name) => self.remove_node(&name),
                Observation::PodUpserted(pod) => self.upsert_pod(&pod, &mut step),
                Observation::PodDeleted(key) => {
                    let before = self.egress.carried_by(&key);
                    self.egress.delete(&key, &mut self.state.diff);
                    self.pods.gone(&key, &before, true);
                    if let Some((identity, _)) = before {
                        self.carried_changed(&identity);
                    }
                }
                Observation::ListsComplete => {
                    self.state.lists_complete = true;
                }
            }
        }
        self.pump(now, &mut step);
        step
    }

    pub fn complete(&mut self, now_ms: u64, results: Vec<(u64, Outcome)>) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        for (id, outcome) in results {
            // An unknown id is a duplicate or stale answer: ignoring it is safe.
            let Some(what) = self.state.in_flight.remove(&id) else { continue };
            match what {
                InFlight::Service { identity, step: op } => {
                    self.state.service_commands_in_flight -= 1;
                    if op.writes_nrp() {
                        self.state.nrp.service_writes_in_flight -= 1;
                    }
                    self.service_outcome(&identity, id, op, outcome, now, &mut step);
                }
                InFlight::Outbound { identity, step: op } => {
                    self.state.service_commands_in_flight -= 1;
                    if op.writes_nrp() {
                        self.state.nrp.service_writes_in_flight -= 1;
                    }
                    self.outbound_outcome(&identity, id, op, outcome, now, &mut step);
                }
                InFlight::PodFinalizer { key, uid, present } => {
                    self.pod_finalizer_outcome(&key, &uid, id, present, outcome, now, &mut step)
                }
                InFlight::Locations(batch) => self.locations_outcome(id, batch, outcome, now, &mut step),
                InFlight::ReadNrp => self.read_outcome(outcome, now, &mut step),
                InFlight::ReadArm => self.arm_outcome(outcome, now, &mut step),
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

    // ---- Commands ----

    fn issue(&mut self, command: Command, what: InFlight, step: &mut Step) -> u64 {
        let id = self.state.next_command_id;
        self.state.next_command_id += 1;
        self.state.in_flight.insert(id, what);
        step.commands.push(Issued { id, command });
        id
    }

    fn event(&mut self, regarding: &ObjectRef, event_type: EventType, reason: &str, message: String, step: &mut Step) {
        if regarding.name.is_empty() {
            return; // an orphan found in NRP has no object to attach an Event to
        }
        let event = Event { regarding: regarding.clone(), event_type, reason: reason.to_owned(), message };
        self.issue(Command::EmitEvent(event), InFlight::Event, step);
    }

    // ---- Write budgets ----

    /// Takes a token of `kind`'s bucket if it has one.
    fn take_token(&mut self, kind: WriteKind, now: u64) -> bool {
        let (bucket, budget) = self.budget.of(&self.config.write_budgets(), kind);
        bucket.try_take(budget, now)
    }

    /// When `kind`'s bucket next has a token, if that is after `now`.
    fn token_due(&self, kind: WriteKind, now: u64) -> Option<u64> {
        Some(self.budget.ready_at(&self.config.write_budgets(), kind, now)).filter(|&at| at > now)
    }

    /// What Azure answered a write of `kind`: a 429 shrinks its budget (and says so), an
    /// accepted write gives some of a shrunk budget back.
    fn budget_answered(&mut self, kind: WriteKind, outcome: &Outcome, now: u64, step: &mut Step) {
        let (bucket, budget) = self.budget.of(&self.config.write_budgets(), kind);
        match outcome {
            Outcome::Failed(f) if f.status == 429 => {
                let per_minute = bucket.throttled(budget, now);
                let message = format!(
                    "{} was throttled (HTTP 429): its write budget shrinks to {per_minute} a minute (configured: {} a \
                     minute) and grows back as writes are accepted",
                    kind.name(),
                    budget.per_minute
                );
                step.logs.push(LogLine { level: LogLevel::Warn, message });
            }
            Outcome::Failed(_) => {}
            _ => bucket.accepted(budget, now),
        }
    }


    fn ready_to_write(&self) -> bool {
        self.state.lists_complete && self.state.nrp.loaded && self.state.reconciled
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
        self.maybe_reconcile(step);
        self.state.work.fire(now);
        self.outbound.work.fire(now);
        // A read scheduled past the end of time (its deadline saturated at `u64::MAX`) never
        // comes: at `now = u64::MAX` it would be due again after every read, a read per answer.
        let scheduled = self.state.nrp.next_read_ms < u64::MAX;
        let read_due = !self.state.nrp.loaded || (scheduled && now >= self.state.nrp.next_read_ms);
        if read_due
            && !self.state.nrp.read_in_flight
            && self.state.nrp.batches_in_flight.is_empty()
            && self.state.nrp.service_writes_in_flight == 0
            && now >= self.state.nrp.next_read_ms
        {
            self.state.nrp.read_in_flight = true;
            self.issue(Command::ReadNrp, InFlight::ReadNrp, step);
        }
        if self.inventory_wanted() && now >= self.arm.next_read_ms {
            self.arm.read_in_flight = true;
            self.issue(Command::ReadArm, InFlight::ReadArm, step);
        }
        if self.ready_to_write() {
            self.check_drained::<Inbound>();
            let hold_nrp_writes = read_due || self.state.nrp.read_in_flight;
            // Outbound first: an inbound Service whose identity an egress identity of ours had
            // waits for that teardown (they share NRP's name and the `-pip` name), and the pass
            // that ends it must let the Service go.
            self.check_drained::<OutboundIdentity>();
            self.run::<OutboundIdentity>(now, hold_nrp_writes, step);
            self.run::<Inbound>(now, hold_nrp_writes, step);
            if !hold_nrp_writes {
                self.sync_locations(now, step);
            }
            self.advance_pod_finalizers(now, step);
        }
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
        let nrp = &mut self.state.nrp;
        nrp.next_read_ms = nrp.next_read_ms.min(latest);
        self.arm.next_read_ms = self.arm.next_read_ms.min(latest);
        nrp.batch_not_before_ms = nrp.batch_not_before_ms.min(latest);
        self.budget.bring_in(now);
        for backoff in nrp.location_backoff.values_mut() {
            backoff.not_before_ms = backoff.not_before_ms.min(latest);
        }
        let lifecycles = &mut self.state.lifecycles;
        self.state.work.bring_in(latest, |identity| {
            if let Some(lifecycle) = lifecycles.get_mut(identity) {
                lifecycle.attempt.bring_in(latest);
            }
        });
        self.pods.bring_in(latest);
        let lifecycles = &mut self.outbound.lifecycles;
        self.outbound.work.bring_in(latest, |identity| {
            if let Some(lifecycle) = lifecycles.get_mut(identity) {
                lifecycle.attempt.bring_in(latest);
            }
        });
    }

    /// Quiet once the Events just issued are counted as done (they need no answer to proceed).
    /// Every unsettled lifecycle is in flight, runnable, waiting on a timer or draining, so
    /// looking at those sets is enough: no scan of all Services.
    fn is_quiet_after_events(&self) -> bool {
        let quiet = self.ready_to_write()
            && !self.state.diff.has_dirty()
            && self.state.work.is_empty()
            && self.outbound.is_quiet()
            && self.pods.is_quiet()
            && self.state.in_flight.values().all(|f| matches!(f, InFlight::Event));
        // Also under the fuzz crate's `invariants` feature, so that fuzzing checks it.
        #[cfg(any(test, feature = "invariants"))]
        if quiet {
            let settled = self.state.lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "a lifecycle with work left is in none of the work sets: {:#?}", self.state.lifecycles);
            let settled = self.outbound.lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "an outbound lifecycle with work left is in no work set: {:#?}", self.outbound.lifecycles);
        }
        quiet
    }

    fn next_wake(&self, now: u64) -> Option<u64> {
        let nrp = &self.state.nrp;
        let mut wake = None;
        let mut consider = |at: u64| wake = Some(wake.map_or(at, |w: u64| w.min(at)));
        let timers = [self.state.work.next_timer(), self.outbound.work.next_timer(), self.pods.next_timer()];
        timers.into_iter().flatten().for_each(&mut consider);
        if !nrp.read_in_flight {
            consider(nrp.next_read_ms.max(now));
        }
        if self.inventory_wanted() {
            consider(self.arm.next_read_ms.max(now));
        }
        if !self.state.work.runnable.is_empty() || !self.outbound.work.runnable.is_empty() {
            // A Service held for a token (or for a read of NRP, or for room in flight, which an
            // answer ends: waking for a token then is only early).
            for kind in [WriteKind::Services, WriteKind::Arm] {
                if let Some(at) = self.token_due(kind, now) {
                    consider(at);
                }
            }
        }
        if self.state.diff.has_dirty() && nrp.batches_in_flight.len() < MAX_BATCHES_IN_FLIGHT {
            if nrp.batch_not_before_ms > now {
                consider(nrp.batch_not_before_ms);
            } else if let Some(at) = self.token_due(WriteKind::AddressLocations, now) {
                consider(at);
            } else {
                // The next batch may go once the youngest in flight is slow, and a location
                // backing off once its delay is over. Past either, only an answer or a change
                // can make a batch: nothing to wake for.
                let slow_at = nrp.batches_in_flight.values().max().map(|at| at.saturating_add(timing::SLOW_BATCH_MS));
                if let Some(at) = slow_at.filter(|&at| at > now) {
                    consider(at);
                }
                if let Some(due) = nrp.location_backoff.values().map(|b| b.not_before_ms).filter(|&at| at > now).min() {
                    consider(due);
                }
            }
        }
        wake
    }
}

// ---- The state format: versions, how older ones are read, what an import checks ----

/// The schema version `export_state` writes. Bump it on any change to [`State`] and teach
/// `import_state` to read the old one. Version 2 added the egress side ([`Egress`]) after the
/// version-1 payload; a version-1 state imports with no egress pods. Version 3 keeps several
/// address-location batches in flight and per-location backoff ([`NrpSync`]); a version 1 or 2
/// state's one batch in flight carries over. Version 4 adds the start-up inventory of ARM
/// ([`ArmSync`]) after the version-3 payload; an older state imports with it settled (nothing
/// left to adopt). Version 5 adds the write budgets' buckets ([`Buckets`]) after the version-4
/// payload; an older state imports with full buckets. Version 6 adds the outbound lifecycles
/// ([`Outbound`]) after the version-5 payload; an older state imports with none (its egress
/// identities are somebody else's, as they were to it). Version 7 adds the egress pod
/// finalizers ([`PodFinalizers`]) after the version-6 payload; an older state imports with no
/// pod held (the host's next list or a pod's next update reads each pod's finalizer).
pub const STATE_VERSION: u32 = 7;

/// Why state could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    UnsupportedVersion(u32),
    Corrupt(String),
    InvalidConfig(ConfigError),
}

/// [`NrpSync`] as state versions 1 and 2 have it: at most one batch in flight, one backoff.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct NrpSyncV2 {
    loaded: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
    batch_in_flight: Option<u64>,
    batch_retries: u32,
    batch_not_before_ms: u64,
    batch_limit: usize,
    #[serde(deserialize_with = "crate::name::btree_map")]
    quarantined: BTreeMap<String, NrpLocation>,
    service_writes_in_flight: u32,
    #[serde(deserialize_with = "crate::name::btree_set")]
    foreign: BTreeSet<String>,
}

impl NrpSyncV2 {
    /// The batch in flight keeps its place (issued at time 0: slow, so another may go beside
    /// it); its one backoff, which held every location, still does (as a throttle).
    fn upgrade(self) -> NrpSync {
        NrpSync {
            loaded: self.loaded,
            read_in_flight: self.read_in_flight,
            read_retries: self.read_retries,
            next_read_ms: self.next_read_ms,
            batches_in_flight: self.batch_in_flight.map(|id| (id, 0)).into_iter().collect(),
            batch_retries: self.batch_retries,
            batch_not_before_ms: self.batch_not_before_ms,
            batch_limit: self.batch_limit,
            quarantined: self.quarantined,
            location_backoff: BTreeMap::new(),
            service_writes_in_flight: self.service_writes_in_flight,
            foreign: self.foreign,
        }
    }
}

/// `N`: the NRP bookkeeping of the state version read ([`NrpSyncV2`] for versions 1 and 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct State<N = NrpSync> {
    next_command_id: u64,
    #[serde(deserialize_with = "crate::name::btree_map")]
    services: BTreeMap<ObjectKey, ServiceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    service_by_identity: BTreeMap<String, ObjectKey>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices: BTreeMap<ObjectKey, SliceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices_by_owner: BTreeMap<Name, VecSet<ObjectKey>>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices_by_node: BTreeMap<Name, VecSet<ObjectKey>>,
    /// Node name → its locations per family (computed once per Node change, not per endpoint).
    #[serde(deserialize_with = "crate::name::btree_map")]
    nodes: BTreeMap<String, NodeLocations>,
    diff: DiffTracker,
    #[serde(deserialize_with = "crate::name::btree_map")]
    lifecycles: BTreeMap<String, Lifecycle>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    in_flight: BTreeMap<u64, InFlight>,
    service_commands_in_flight: usize,
    work: WorkSets<String>,
    nrp: N,
    lists_complete: bool,
    /// Start-up reconciliation against NRP has run.
    reconciled: bool,
}

impl Tracker {
    /// A tracker as [`Self::create`], but with its start-up inventory of ARM settled and empty,
    /// as a state from before version 4 imports: for the tests of everything but start-up
    /// adoption, which then see the commands they saw before the inventory existed.
    #[cfg(test)]
    pub(crate) fn create_with_arm_settled(config: Config) -> Result<Self, ConfigError> {
        Ok(Self { arm: ArmSync::settled(), ..Self::create(config)? })
    }

    /// The state as version 3 wrote it (no ARM inventory), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v3(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress)).expect("plain data")
    }

    /// The state as version 4 wrote it (no write budgets), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v4(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm)).expect("plain data")
    }

    /// The state as version 5 wrote it (no outbound lifecycles), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v5(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget)).expect("plain data")
    }

    /// The state as version 6 wrote it (no pod finalizers), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v6(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound)).expect("plain data")
    }

    /// This tracker's current payload with `state` in place of its own, for tests of states that
    /// must be refused.
    #[cfg(test)]
    fn payload_with(&self, state: &State) -> Vec<u8> {
        postcard::to_allocvec(&(state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("plain data")
    }

    // ---- State ----

    /// The whole state: `(version, payload)`. Version 2 is the version-1 payload followed by
    /// the egress side (postcard encodes a pair as one after the other).
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let payload =
            postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("the state is plain data and always encodes");
        (STATE_VERSION, payload)
    }

    /// The schema version [`Self::export_state`] writes.
    pub fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    /// A tracker from exported state. The payload must be exactly one value of its version
    /// (bytes after it are refused: a version-2 payload offered as version 1 would otherwise
    /// import without its egress side), and what [`State::check`] and [`Egress::check`] verify
    /// must hold; anything else is [`StateError::Corrupt`].
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        let mode = validate_config(&config).map_err(StateError::InvalidConfig)?;
        let corrupt = |why: String| StateError::Corrupt(format!("state version {version}: {why}"));
        let full = Buckets::full(&config.write_budgets());
        let none = Outbound::default();
        let no_pods = PodFinalizers::default;
        if !(1..=STATE_VERSION).contains(&version) {
            return Err(StateError::UnsupportedVersion(version));
        }
        // Each part the version has, one after the other (postcard writes a tuple so), then
        // nothing: one decoder per part for every version. A part a version lacks starts as that
        // version implies: no egress pods, the ARM inventory settled, full write budgets, no
        // outbound lifecycles, no pod held.
        let mut rest = payload;
        let state = if version <= 2 {
            take::<State<NrpSyncV2>>(&mut rest).map_err(corrupt)?.upgrade()
        } else {
            take::<State>(&mut rest).map_err(corrupt)?
        };
        let egress = if version >= 2 { take(&mut rest).map_err(corrupt)? } else { Egress::default() };
        let arm = if version >= 4 { take(&mut rest).map_err(corrupt)? } else { ArmSync::settled() };
        let budget = if version >= 5 { take(&mut rest).map_err(corrupt)? } else { full };
        let outbound = if version >= 6 { take(&mut rest).map_err(corrupt)? } else { none };
        let pods = if version >= 7 { take(&mut rest).map_err(corrupt)? } else { no_pods() };
        if !rest.is_empty() {
            return Err(corrupt(format!("{} byte(s) after the payload", rest.len())));
        }
        state.check(&arm, &outbound, &pods).map_err(corrupt)?;
        egress.check().map_err(corrupt)?;
        outbound.check().map_err(corrupt)?;
        Ok(Self { config, mode, state, egress, arm, budget, outbound, pods, clock: Clock::default() })
    }
}

/// The largest next command id an imported state may hold (see [`State::check`]).
const MAX_NEXT_COMMAND_ID: u64 = 1 << 63;

/// The next postcard value of `rest`, which moves past it.
fn take<T: serde::de::DeserializeOwned>(rest: &mut &[u8]) -> Result<T, String> {
    let (value, after) = postcard::take_from_bytes::<T>(rest).map_err(|e| e.to_string())?;
    *rest = after;
    Ok(value)
}

impl State<NrpSyncV2> {
    fn upgrade(self) -> State {
        self.map_nrp(NrpSyncV2::upgrade)
    }
}

impl<N> State<N> {
    fn map_nrp<M>(self, f: impl FnOnce(N) -> M) -> State<M> {
        State {
            next_command_id: self.next_command_id,
            services: self.services,
            service_by_identity: self.service_by_identity,
            slices: self.slices,
            slices_by_owner: self.slices_by_owner,
            slices_by_node: self.slices_by_node,
            nodes: self.nodes,
            diff: self.diff,
            lifecycles: self.lifecycles,
            in_flight: self.in_flight,
            service_commands_in_flight: self.service_commands_in_flight,
            work: self.work,
            nrp: f(self.nrp),
            lists_complete: self.lists_complete,
            reconciled: self.reconciled,
        }
    }
}

impl State {
    /// Whether an identity is an inbound Service's (a lifecycle, or a Service observed): one key
    /// space with egress identities (upstream §i.2.7).
    fn is_inbound(&self, identity: &str) -> bool {
        self.lifecycles.contains_key(identity) || self.service_by_identity.contains_key(identity)
    }

    /// What an import cannot take on trust, checked cheaply (a pass over the commands in flight
    /// and one over the lifecycles): the counters of commands in flight, which `complete`
    /// decrements, against the commands themselves; each Service command against the lifecycle
    /// that waits for it (and no lifecycle waiting for a command that is not in flight: it would
    /// never run again); the one read and the batches in flight against their flags (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two); and every
    /// id in flight below the next id (a new command would take it); and every lifecycle with work
    /// left in a work set (a pass over the timers and one over the lifecycles): the tracker only
    /// ever looks at those sets for work, so a lifecycle outside them would never run again. The
    /// DiffTracker's own counts are not re-derived: that would cost a pass over every address.
    fn check(&self, arm: &ArmSync, outbound: &Outbound, pods: &PodFinalizers) -> Result<(), String> {
        // One id per command, counting up: no real state comes near the end of u64, and
        // refusing the upper half keeps `issue` from ever overflowing.
        if self.next_command_id > MAX_NEXT_COMMAND_ID {
            return Err(format!("the next command id {} is past {MAX_NEXT_COMMAND_ID}", self.next_command_id));
        }
        let (mut service_commands, mut nrp_writes, mut reads, mut arm_reads, mut batches) =
            (0usize, 0u32, 0usize, 0usize, Vec::new());
        let mut pod_commands = BTreeMap::new();
        for (&id, what) in &self.in_flight {
            if id >= self.next_command_id {
                return Err(format!("command {id} is in flight, but the next command id is {}", self.next_command_id));
            }
            match what {
                InFlight::Service { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if self.lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for {identity}, whose lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::Outbound { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if outbound.lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for egress identity {identity}, whose outbound \
                             lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::PodFinalizer { key, .. } => {
                    pod_commands.insert(id, key);
                }
                InFlight::Locations(_) => batches.push(id),
                InFlight::ReadNrp => reads += 1,
                InFlight::ReadArm => arm_reads += 1,
                InFlight::Event => {}
            }
        }
        pods.check(&pod_commands)?;
        let waiting = self.lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count()
            + outbound.lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count();
        let counts = [
            ("Service commands counted", self.service_commands_in_flight, "Service commands", service_commands),
            ("lifecycles wait for a command", waiting, "Service commands", service_commands),
            ("NRP writes counted", self.nrp.service_writes_in_flight as usize, "NRP writes", nrp_writes as usize),
            ("reads of NRP flagged", usize::from(self.nrp.read_in_flight), "reads of NRP", reads),
            ("reads of ARM flagged", usize::from(arm.read_in_flight), "reads of ARM", arm_reads),
        ];
        if arm.settled && arm.read_in_flight {
            return Err("the ARM inventory is settled, but a read of it is in flight".into());
        }
        if self.reconciled && !arm.settled {
            return Err("start-up reconciliation ran, but the ARM inventory is not settled".into());
        }
        for (what, counted, which, in_flight) in counts {
            if counted != in_flight {
                return Err(format!("{counted} {what} in flight, but {in_flight} {which} are in flight"));
            }
        }
        if !batches.iter().eq(self.nrp.batches_in_flight.keys()) {
            return Err(format!(
                "address-location batches in flight {batches:?}, but the batches counted in flight are {:?}",
                self.nrp.batches_in_flight.keys().collect::<Vec<_>>()
            ));
        }
        if batches.len() > MAX_BATCHES_IN_FLIGHT {
            return Err(format!("{} address-location batches in flight, over {MAX_BATCHES_IN_FLIGHT}", batches.len()));
        }
        // No location in two batches in flight: their answers could arrive in either order.
        let mut locations = BTreeSet::new();
        if let Some(twice) = location_batches(&self.nrp.batches_in_flight, &self.in_flight)
            .flatten()
            .find(|l| !locations.insert(l.location.as_str()))
        {
            return Err(format!("location {:?} is in more than one batch in flight", twice.location));
        }
        // Where the tracker looks for each lifecycle's work: a pending deletion waits in
        // `draining` (and only one does, or the tracker would never be idle), any other work left
        // is in flight, runnable or on a timer.
        self.work.check(&self.lifecycles, "lifecycle")
    }
}

// ---- A Service's lifecycle ----

/// The finalizer that holds a Service until its Azure resources are gone.
pub const FINALIZER: &str = "servicegateway.azure.com/service-cleanup";

/// Event reasons of the lifecycle. Operators alert on them: never rename one.
pub mod reason {
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    pub const LOAD_BALANCER_CONFIGURATION_REJECTED: &str = "LoadBalancerConfigurationRejected";
}

/// Azure error codes that no retry can fix: the Service waits for a new spec.
const TERMINAL_CODES: &[&str] = &[
    "RulesUseSameBackendPortProtocolAndPool",
    "QuotaExceeded",
    "PublicIPCountLimitReached",
    "MaxPublicIpCountLimitReached",
    "InvalidParameter",
];
const OVERLAY_MAPPINGS_CODE: &str = "ServiceWithOverlayMappingsCannotBeDeleted";
const DEFAULT_IDLE_TIMEOUT_MINUTES: u8 = 4;

/// The Azure resources of one Service, derived from its admitted spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbConfig {
    pub public_ip: PublicIp,
    pub load_balancer: LoadBalancer,
}

impl LbConfig {
    /// Names follow upstream (§a.4): LB and pool = UID, PIP = `<uid>-pip`, rules
    /// `rule-<protocol>-<port>`.
    pub fn for_service(service: &Service) -> Self {
        let uid = service.identity();
        let version = match service.ip_families.first().map(String::as_str) {
            Some("IPv6") => IpVersion::Ipv6,
            _ => IpVersion::Ipv4,
        };
        let idle = service
            .annotation(crate::admission::ANNOTATION_IDLE_TIMEOUT)
            .and_then(|v| v.trim().parse::<u8>().ok())
            .unwrap_or(DEFAULT_IDLE_TIMEOUT_MINUTES);
        let rules = service
            .ports
            .iter()
            .filter_map(|port| {
                let protocol = if port.protocol() == "UDP" { LbProtocol::Udp } else { LbProtocol::Tcp };
                let frontend = u16::try_from(port.port).ok()?;
                let backend = u16::try_from(port.backend_port()?).ok()?;
                let proto = if protocol == LbProtocol::Udp { "udp" } else { "tcp" };
                Some(LbRule {
                    name: Name::from(format!("rule-{proto}-{frontend}")),
                    protocol,
                    frontend_port: frontend,
                    backend_port: backend,
                    idle_timeout_minutes: idle,
                    enable_tcp_reset: protocol == LbProtocol::Tcp,
                })
            })
            .collect();
        let public_ip = PublicIp { name: Name::from(format!("{uid}-pip")), version };
        let uid = Name::from(uid);
        let load_balancer =
            LoadBalancer { name: uid.clone(), public_ip: public_ip.name.clone(), backend_pool: uid, rules };
        Self { public_ip, load_balancer }
    }
}


impl Lifecycle {
    /// The Service as last read lacks our finalizer, or the ingress IP this controller gave it,
    /// though both were written: somebody stripped them. A deletion would not wait for the
    /// Azure resources to go without the finalizer.
    fn object_needs_repair(&self) -> bool {
        self.object.exists
            && (!self.object.has_finalizer || self.ingress_ip.as_ref().is_some_and(|ip| self.object.ingress != [ip.clone()]))
    }

    /// Puts back what [`Self::object_needs_repair`] found missing: an update of the Service's
    /// object alone (its Azure resources are as applied).
    fn repair(&mut self) {
        self.phase = Phase::UpdateInProgress;
        self.steps = [OpStep::AddFinalizer, OpStep::PatchStatus].into();
        self.op_config = self.applied.clone();
        self.attempt.reset();
    }

    /// Not created and not parked (waiting for a new spec): the tracker has steps to run for it.
    fn has_work_left(&self) -> bool {
        self.phase != Phase::Created && !self.parked
    }

    /// Whether what `op` would write already holds (`registered`: in NRP), so it is skipped.
    fn holds_already(&self, op: OpStep, registered: bool) -> bool {
        let object = &self.object;
        match op {
            OpStep::AddFinalizer => !object.exists || object.has_finalizer,
            OpStep::PutPublicIp | OpStep::PutLoadBalancer => self.op_config.is_none(),
            OpStep::Register => registered,
            OpStep::PatchStatus => {
                !object.exists || self.ingress_ip.as_ref().is_none_or(|ip| object.ingress == [ip.clone()])
            }
            OpStep::Unlink | OpStep::Unregister => !registered,
            OpStep::DeleteLoadBalancer | OpStep::DeletePublicIp => false,
            OpStep::ClearStatus => !object.exists || object.ingress.is_empty(),
            OpStep::RemoveFinalizer => !object.exists || !object.has_finalizer,
        }
    }

    fn new(service: ObjectRef, phase: Phase, object: ObjectState, desired: Option<LbConfig>) -> Self {
        let steps = if phase == Phase::NotStarted { OpStep::ENSURE.into() } else { VecDeque::new() };
        Self {
            service,
            phase,
            op_config: desired.clone(),
            desired,
            applied: None,
            steps,
            attempt: Attempt::new(),
            parked: false,
            failing: false,
            ingress_ip: None,
            object,
            recreate: false,
        }
    }
}


/// One command of a Service's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpStep {
    AddFinalizer,
    PutPublicIp,
    PutLoadBalancer,
    Register,
    PatchStatus,
    Unlink,
    DeleteLoadBalancer,
    Unregister,
    DeletePublicIp,
    ClearStatus,
    RemoveFinalizer,
}

impl OpStep {
    const ENSURE: [OpStep; 5] =
        [OpStep::AddFinalizer, OpStep::PutPublicIp, OpStep::PutLoadBalancer, OpStep::Register, OpStep::PatchStatus];
    /// Upstream §c.2.3: unlink pool → delete LB → unregister → delete PIP → drop finalizer;
    /// and, before the finalizer, the ingress IP leaves the status of a Service that lives on
    /// (LoadBalancer → ClusterIP), since that address is gone.
    const DELETE: [OpStep; 6] = [
        OpStep::Unlink,
        OpStep::DeleteLoadBalancer,
        OpStep::Unregister,
        OpStep::DeletePublicIp,
        OpStep::ClearStatus,
        OpStep::RemoveFinalizer,
    ];

    fn is_kubernetes(self) -> bool {
        matches!(self, OpStep::AddFinalizer | OpStep::PatchStatus | OpStep::ClearStatus | OpStep::RemoveFinalizer)
    }

}

impl Op for OpStep {
    fn is_delete_step(self) -> bool {
        OpStep::DELETE.contains(&self)
    }

    fn writes_nrp(self) -> bool {
        matches!(self, OpStep::Register | OpStep::Unlink | OpStep::Unregister)
    }

    fn write_kind(self) -> Option<WriteKind> {
        match self {
            OpStep::Register | OpStep::Unlink | OpStep::Unregister => Some(WriteKind::Services),
            OpStep::PutPublicIp | OpStep::PutLoadBalancer | OpStep::DeleteLoadBalancer | OpStep::DeletePublicIp => {
                Some(WriteKind::Arm)
            }
            _ => None,
        }
    }
}

/// What the tracker knows of a Service object in the API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ObjectState {
    exists: bool,
    has_finalizer: bool,
    ingress: Vec<String>,
}

impl ObjectState {
    fn of(service: &Service) -> Self {
        Self {
            exists: true,
            has_finalizer: service.finalizers.iter().any(|f| f == FINALIZER),
            ingress: service.ingress_ips.clone(),
        }
    }

    fn gone() -> Self {
        Self { exists: false, has_finalizer: false, ingress: Vec::new() }
    }
}

/// One Service's lifecycle, keyed by its identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    service: ObjectRef,
    pub phase: Phase,
    /// From the last admitted spec; `None` for an orphan found in NRP or a Service adopted at
    /// start-up whose spec is no longer admitted.
    desired: Option<LbConfig>,
    applied: Option<LbConfig>,
    /// The configuration the running operation applies.
    op_config: Option<LbConfig>,
    steps: VecDeque<OpStep>,
    attempt: Attempt<OpStep>,
    /// A terminal failure: waits for a new spec.
    parked: bool,
    /// A Warning Event was sent for the current run of failures.
    failing: bool,
    ingress_ip: Option<String>,
    object: ObjectState,
    recreate: bool,
}

/// The reference of a Service known only by its identity (found in NRP or ARM, gone from
/// Kubernetes): its Events and Kubernetes writes have no object to go to.
fn orphan(identity: &str) -> ObjectRef {
    ObjectRef { kind: "Service".into(), namespace: Name::new(""), name: Name::new(""), uid: Name::new(identity) }
}

fn object_ref(service: &Service) -> ObjectRef {
    ObjectRef {
        kind: "Service".into(),
        namespace: Name::new(&service.namespace),
        name: Name::new(&service.name),
        uid: Name::new(&service.uid),
    }
}

impl Tracker {
    // ---- Kubernetes side ----

    fn upsert_service(&mut self, service: Service, step: &mut Step) {
        let verdict = admit_service(&self.config, &service);
        let key = service.key();
        let identity = service.identity();
        let previous = self.state.services.remove(&key);
        if let Some(previous) = previous.as_ref().filter(|p| p.observed.uid != service.uid) {
            // The same name now belongs to a new object: the old one is gone.
            let old = previous.observed.identity();
            self.state.service_by_identity.remove(&old);
            self.delete_service(&old, true);
        }
        let same_object = previous.as_ref().is_some_and(|p| p.observed.uid == service.uid);
        let previous_admitted = previous.as_ref().filter(|_| same_object).and_then(|p| p.admitted.clone());
        let verdict_changed = !same_object || previous.as_ref().is_some_and(|p| p.verdict != verdict);
        let admitted = match &verdict {
            Verdict::Admitted | Verdict::NothingToProvision => Some(service.clone()),
            _ => previous_admitted,
        };
        if let (Verdict::Rejected(rejection), true) = (&verdict, verdict_changed) {
            let kept = if admitted.is_some() { "; it keeps its last admitted configuration" } else { "" };
            let message = format!("{}{kept}", rejection.message);
            self.event(&object_ref(&service), EventType::Warning, &rejection.reason, message, step);
        }
        if let Some(lifecycle) = self.state.lifecycles.get_mut(&identity) {
            lifecycle.object = ObjectState::of(&service);
            lifecycle.service = object_ref(&service);
        }
        match &verdict {
            Verdict::Admitted => self.want_service(&identity, &service),
            Verdict::Cleanup | Verdict::Ignored(_) => {
                if !self.state.lifecycles.contains_key(&identity) && ObjectState::of(&service).has_finalizer {
                    // Ours from before a restart: clean up whatever is left, then release it.
                    self.adopt_for_deletion(&identity, object_ref(&service), ObjectState::of(&service));
                }
                self.delete_service(&identity, false)
            }
            Verdict::Rejected(_) | Verdict::NothingToProvision => {}
        }
        self.state.service_by_identity.insert(identity.clone(), key.clone());
        self.state.services.insert(key, ServiceRecord { observed: service, admitted, verdict });
        self.refuse_colliding_pods(&identity, step);
    }

    fn remove_service_object(&mut self, key: &ObjectKey) {
        let Some(record) = self.state.services.remove(key) else { return };
        let identity = record.observed.identity();
        self.state.service_by_identity.remove(&identity);
        self.delete_service(&identity, true);
    }

    /// Whether a Service's endpoints belong in the Kubernetes side of the DiffTracker.
    fn programmable(&self, identity: &str) -> bool {
        self.state.lifecycles.get(identity).is_some_and(|l| !l.phase.is_deleting())
    }

    fn want_service(&mut self, identity: &str, service: &Service) {
        let config = LbConfig::for_service(service);
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else {
            let lifecycle =
                Lifecycle::new(object_ref(service), Phase::NotStarted, ObjectState::of(service), Some(config));
            self.state.lifecycles.insert(identity.to_owned(), lifecycle);
            self.seed(identity);
            self.state.work.runnable.insert(identity.to_owned());
            return;
        };
        let changed = lifecycle.desired.as_ref() != Some(&config);
        lifecycle.desired = Some(config.clone());
        match lifecycle.phase {
            Phase::DeletionPending | Phase::DeletionInProgress => lifecycle.recreate = true,
            Phase::Created if lifecycle.applied.as_ref() != Some(&config) => {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.steps = [OpStep::PutLoadBalancer, OpStep::PatchStatus].into();
                lifecycle.op_config = Some(config);
                lifecycle.attempt.reset();
                lifecycle.parked = false;
            }
            // Someone stripped our finalizer (or the ingress IP) from a Service that is served:
            // put it back, or a deletion would not wait for the Azure resources to go.
            Phase::Created if lifecycle.object_needs_repair() => lifecycle.repair(),
            Phase::Created => {}
            Phase::NotStarted => lifecycle.op_config = Some(config),
            Phase::CreationInProgress | Phase::UpdateInProgress => {
                // A parked operation starts over with the new spec. A running one takes it
                // when what it has not written yet is all the spec changes (the load balancer,
                // and the public IP unless that is unchanged): one PUT instead of a PUT of the
                // old spec and an update (upstream TestEngineUpdateService_OverwritesConfigDuringCreation).
                // Otherwise it notices the drift when it completes.
                let pending = |op: OpStep| {
                    lifecycle.steps.contains(&op) && lifecycle.attempt.in_flight.is_none_or(|(_, running)| running != op)
                };
                let same_ip = lifecycle.op_config.as_ref().is_some_and(|c| c.public_ip == config.public_ip);
                if lifecycle.parked && changed {
                    lifecycle.parked = false;
                    lifecycle.attempt.reset();
                    lifecycle.op_config = Some(config);
                    lifecycle.steps = OpStep::ENSURE.into();
                } else if changed && pending(OpStep::PutLoadBalancer) && (same_ip || pending(OpStep::PutPublicIp)) {
                    lifecycle.op_config = Some(config);
                }
            }
        }
        self.state.work.runnable.insert(identity.to_owned());
    }

    /// Starts (or keeps) the deletion of a Service's Azure resources. `gone`: the object has
    /// left the API server. Never synthesises a deletion for a Service nobody provisioned.
    fn delete_service(&mut self, identity: &str, gone: bool) {
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else { return };
        if gone {
            lifecycle.object.exists = false;
        }
        lifecycle.recreate = false;
        if lifecycle.phase.is_deleting() {
            if lifecycle.parked {
                lifecycle.parked = false;
                self.state.work.runnable.insert(identity.to_owned());
            }
            return;
        }
        lifecycle.attempt.reset();
        lifecycle.parked = false;
        lifecycle.failing = false;
        self.unseed(identity);
        self.start_drain::<Inbound>(identity);
    }

    fn command_for(&self, identity: &str, op: OpStep) -> Command {
        let lifecycle = &self.state.lifecycles[identity];
        let config = lifecycle.op_config.as_ref();
        let inbound = |backend_pools: Vec<PoolRef>, is_delete: bool| {
            Command::UpdateServices(vec![NrpServiceRequest {
                name: identity.to_owned(),
                service_type: NrpServiceType::Inbound,
                backend_pools,
                public_nat_gateway: None,
                is_delete,
            }])
        };
        match op {
            OpStep::AddFinalizer | OpStep::RemoveFinalizer => Command::SetFinalizer {
                service: lifecycle.service.clone(),
                finalizer: FINALIZER.to_owned(),
                present: op == OpStep::AddFinalizer,
            },
            OpStep::PutPublicIp => Command::PutPublicIp(config.expect("skipped without a config").public_ip.clone()),
            OpStep::PutLoadBalancer => {
                Command::PutLoadBalancer(config.expect("skipped without a config").load_balancer.clone())
            }
            OpStep::Register => {
                inbound(vec![PoolRef { load_balancer: identity.to_owned(), pool: identity.to_owned() }], false)
            }
            OpStep::PatchStatus => Command::PatchServiceStatus {
                service: lifecycle.service.clone(),
                ingress_ips: lifecycle.ingress_ip.iter().cloned().collect(),
            },
            OpStep::ClearStatus => {
                Command::PatchServiceStatus { service: lifecycle.service.clone(), ingress_ips: Vec::new() }
            }
            OpStep::Unlink => inbound(Vec::new(), false),
            OpStep::Unregister => inbound(Vec::new(), true),
            OpStep::DeleteLoadBalancer => {
                Command::DeleteResource(ResourceRef { kind: ResourceKind::LoadBalancer, name: identity.to_owned() })
            }
            OpStep::DeletePublicIp => {
                Command::DeleteResource(ResourceRef { kind: ResourceKind::PublicIp, name: format!("{identity}-pip") })
            }
        }
    }

    /// The last step of an operation succeeded.
    fn finish_operation(&mut self, identity: &str, step: &mut Step) {
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("caller checked");
        match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                let created = lifecycle.phase != Phase::UpdateInProgress;
                lifecycle.applied = lifecycle.op_config.clone();
                if lifecycle.desired.is_some() && lifecycle.desired != lifecycle.applied {
                    lifecycle.phase = Phase::UpdateInProgress;
                    lifecycle.op_config = lifecycle.desired.clone();
                    lifecycle.steps = [OpStep::PutLoadBalancer, OpStep::PatchStatus].into();
                    self.state.work.runnable.insert(identity.to_owned());
                } else if lifecycle.object_needs_repair() {
                    // Read without our finalizer (or its ingress IP) after it was written.
                    lifecycle.repair();
                    self.state.work.runnable.insert(identity.to_owned());
                } else {
                    lifecycle.phase = Phase::Created;
                }
                let (service, ip) = (lifecycle.service.clone(), lifecycle.ingress_ip.clone().unwrap_or_default());
                if created {
                    let message = format!("load balancer {identity} is serving at {ip}");
                    self.event(&service, EventType::Normal, reason::ENSURED_LOAD_BALANCER, message, step);
                }
            }
            Phase::DeletionInProgress => {
                let service = lifecycle.service.clone();
                let message = format!("load balancer {identity} and its public IP are deleted and unregistered");
                if lifecycle.recreate && lifecycle.object.exists && lifecycle.desired.is_some() {
                    lifecycle.phase = Phase::NotStarted;
                    lifecycle.recreate = false;
                    lifecycle.applied = None;
                    lifecycle.ingress_ip = None;
                    lifecycle.op_config = lifecycle.desired.clone();
                    lifecycle.steps = OpStep::ENSURE.into();
                    lifecycle.attempt.retries = 0;
                    self.seed(identity);
                    self.state.diff.touch_identity(identity);
                    self.state.work.runnable.insert(identity.to_owned());
                } else {
                    self.state.lifecycles.remove(identity);
                }
                self.event(&service, EventType::Normal, reason::DELETED_LOAD_BALANCER, message, step);
            }
            Phase::Created | Phase::DeletionPending => {}
        }
    }

    fn service_outcome(&mut self, identity: &str, id: u64, op: OpStep, outcome: Outcome, now: u64, step: &mut Step) {
        if !self.answered::<Inbound>(identity, id, op, &outcome, now, step) {
            return;
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("it waited for the answer");
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::PublicIpAddress(ip) => {
                lifecycle.ingress_ip = Some(ip);
                self.step_succeeded(identity, op);
                return;
            }
            Outcome::Ok | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.step_succeeded(identity, op);
                return;
            }
        };
        // A Kubernetes write refused by the host's UID guard is for a Service replaced under the
        // same name: the object it was for is gone, as with a 404.
        let gone = (op.is_delete_step() && failure.status == 404) || (op.is_kubernetes() && failure.object_gone());
        if gone {
            if op.is_kubernetes() {
                lifecycle.object.exists = false;
            }
            self.step_succeeded(identity, op);
            if op.is_kubernetes() && !self.state.lifecycles[identity].phase.is_deleting() {
                // The Service left the API server before we finished: undo what we made.
                self.delete_service(identity, true);
            }
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            return; // a create or update pre-empted by a delete: the delete carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        if op == OpStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            self.drain_again::<Inbound>(identity, now);
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("still there");
        let terminal = matches!(op, OpStep::PutLoadBalancer | OpStep::PutPublicIp)
            && (TERMINAL_CODES.contains(&code) || failure.status == 422);
        let service = lifecycle.service.clone();
        if terminal && lifecycle.desired.is_some() && lifecycle.desired != lifecycle.op_config {
            // The spec changed while the refused one was in flight: the refusal is of a spec
            // nobody wants any more, so the operation goes on with the current one instead of
            // parking (upstream TestEngineOnServiceCreationComplete_DriftDuringTerminalFailureReDispatches
            // and TestEngineOnServiceCreationComplete_DriftDuringTerminalUpdateReDispatches).
            lifecycle.op_config = lifecycle.desired.clone();
            lifecycle.attempt.reset();
            return;
        }
        if terminal {
            lifecycle.parked = true;
            let message = format!(
                "Azure refused {op:?} for load balancer {identity}: {} ({}); fix the Service spec to retry",
                failure.message, code
            );
            self.event(&service, EventType::Warning, reason::LOAD_BALANCER_CONFIGURATION_REJECTED, message, step);
            return;
        }
        let what = format!("{op:?} for load balancer {identity}");
        if self.retry_later::<Inbound>(identity, &failure, &what, now, step) {
            let message = format!(
                "{op:?} for load balancer {identity} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            self.event(&service, EventType::Warning, reason::SYNC_LOAD_BALANCER_FAILED, message, step);
        }
    }

    fn step_succeeded(&mut self, identity: &str, op: OpStep) {
        match op {
            OpStep::Register => self.state.diff.set_registered(identity, true),
            OpStep::Unregister => self.state.diff.set_registered(identity, false),
            _ => {}
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("caller checked");
        match op {
            OpStep::AddFinalizer => lifecycle.object.has_finalizer = true,
            OpStep::RemoveFinalizer => lifecycle.object.has_finalizer = false,
            OpStep::PatchStatus => lifecycle.object.ingress = lifecycle.ingress_ip.iter().cloned().collect(),
            OpStep::ClearStatus => lifecycle.object.ingress.clear(),
            _ => {}
        }
        // The backoff was for the step that just succeeded: the next step, or the end of the
        // operation, must not wait for it (after the clock stepped back, a stale deadline held
        // `finish_operation` back after the finalizer was removed).
        self.step_done::<Inbound>(identity, op);
    }

    /// Tracks a Service found registered in NRP or holding our finalizer, only to delete it.
    fn adopt_for_deletion(&mut self, identity: &str, service: ObjectRef, object: ObjectState) {
        let lifecycle = Lifecycle::new(service, Phase::DeletionPending, object, None);
        self.state.lifecycles.insert(identity.to_owned(), lifecycle);
        self.state.work.draining.insert(identity.to_owned());
        self.state.diff.touch_identity(identity);
    }
}

/// Inbound Services, to the lifecycle driver.
struct Inbound;

impl Life for Lifecycle {
    life_fields!(OpStep);
    fn parked(&self) -> bool {
        self.parked
    }
    fn holds_already(&self, op: OpStep, registered: bool) -> bool {
        Lifecycle::holds_already(self, op, registered)
    }
    fn has_work_left(&self) -> bool {
        Lifecycle::has_work_left(self)
    }
}

impl Kind for Inbound {
    type Life = Lifecycle;
    const DELETE: &'static [OpStep] = &OpStep::DELETE;
    const UNREGISTER: OpStep = OpStep::Unregister;
    fn lifecycles(tracker: &Tracker) -> &BTreeMap<String, Lifecycle> {
        &tracker.state.lifecycles
    }
    fn parts(tracker: &mut Tracker) -> (&mut BTreeMap<String, Lifecycle>, &mut WorkSets<String>) {
        (&mut tracker.state.lifecycles, &mut tracker.state.work)
    }
    fn registered(tracker: &Tracker, identity: &str) -> bool {
        tracker.state.diff.is_registered(identity)
    }
    /// An egress identity of the same name is torn down first.
    fn blocked(tracker: &Tracker, identity: &str) -> bool {
        tracker.outbound.lifecycles.contains_key(identity)
    }
    fn command(tracker: &mut Tracker, identity: &str, op: OpStep) -> Command {
        tracker.command_for(identity, op)
    }
    fn in_flight(identity: &str, op: OpStep) -> InFlight {
        InFlight::Service { identity: identity.to_owned(), step: op }
    }
    fn finish(tracker: &mut Tracker, identity: &str, step: &mut Step) {
        tracker.finish_operation(identity, step);
    }
}

// ---- The Kubernetes cache ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ServiceRecord {
    observed: Service,
    /// The spec last admitted; a live Service that becomes invalid keeps it (design §3).
    admitted: Option<Service>,
    verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SliceRecord {
    slice: StoredSlice,
    owner: Option<Name>,
    /// Ready addresses → their location, as the Nodes resolve them now.
    resolved: VecMap<Name, Name>,
}

/// An EndpointSlice as the tracker keeps it: [`EndpointSlice`] in compact keys, serialized
/// exactly like it (field for field), so the state format does not change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredSlice {
    namespace: Name,
    name: Name,
    owner_service_uid: Option<Name>,
    address_type: Name,
    endpoints: Vec<StoredEndpoint>,
    deleting: bool,
}

/// [`Endpoint`], as [`StoredSlice`] keeps it: nearly always one address, held in place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredEndpoint {
    addresses: SmallVec<[Name; 1]>,
    node_name: Option<Name>,
    ready: Option<bool>,
}

impl StoredSlice {
    fn of(slice: &EndpointSlice) -> Self {
        let endpoints = slice.endpoints.iter().map(|e| StoredEndpoint {
            addresses: e.addresses.iter().map(Name::from).collect(),
            node_name: e.node_name.as_ref().map(Name::from),
            ready: e.ready,
        });
        Self {
            namespace: Name::new(&slice.namespace),
            name: Name::new(&slice.name),
            owner_service_uid: slice.owner_service_uid.as_ref().map(Name::from),
            address_type: Name::new(&slice.address_type),
            endpoints: endpoints.collect(),
            deleting: slice.deleting,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NodeLocations {
    v4: Option<Name>,
    v6: Option<Name>,
}

impl NodeLocations {
    fn of(node: &Node) -> Self {
        Self {
            v4: ip::same_family_location(&node.internal_ips, ip::Family::V4),
            v6: ip::same_family_location(&node.internal_ips, ip::Family::V6),
        }
    }

    fn for_family(&self, family: ip::Family) -> Option<&Name> {
        match family {
            ip::Family::V4 => self.v4.as_ref(),
            ip::Family::V6 => self.v6.as_ref(),
        }
    }
}

/// The address types whose endpoints are pod IPs, `IPv4` and `IPv6` (in any case, as the NRP
/// types are read): only their endpoints are programmed; `FQDN` and types Kubernetes does not
/// have are not.
fn programmable(address_type: &str) -> bool {
    address_type.eq_ignore_ascii_case("IPv4") || address_type.eq_ignore_ascii_case("IPv6")
}

impl Tracker {
    fn seed(&mut self, identity: &str) {
        let keys = self.state.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.state.slices.get(&key) {
                for (address, location) in &record.resolved {
                    self.state.diff.add_endpoint(identity, address, location);
                }
            }
        }
    }

    fn unseed(&mut self, identity: &str) {
        let keys = self.state.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.state.slices.get(&key) {
                for (address, location) in &record.resolved {
                    self.state.diff.remove_endpoint(identity, address, location);
                }
            }
        }
    }

    /// Ready addresses of a slice and their same-family node locations.
    fn resolve(&self, slice: &StoredSlice) -> VecMap<Name, Name> {
        if slice.deleting || !programmable(&slice.address_type) {
            return VecMap::default();
        }
        self.resolve_endpoints(slice.endpoints.iter())
    }

    fn resolve_endpoints<'e>(&self, endpoints: impl Iterator<Item = &'e StoredEndpoint>) -> VecMap<Name, Name> {
        let mut resolved = Vec::new();
        for endpoint in endpoints.filter(|e| e.ready != Some(false)) {
            let Some(node) = endpoint.node_name.as_ref().and_then(|n| self.state.nodes.get(n.as_str())) else {
                continue;
            };
            for address in &endpoint.addresses {
                let Some((address, family)) = ip::canonical(address) else { continue };
                if let Some(location) = node.for_family(family) {
                    resolved.push((address, location.clone()));
                }
            }
        }
        resolved.into_iter().collect()
    }

    fn upsert_slice(&mut self, slice: EndpointSlice) {
        let key = slice.key();
        let owner = slice.owner_service_uid.as_ref().map(|u| Name::from(u.to_ascii_lowercase()));
        let slice = StoredSlice::of(&slice);
        if self.update_slice_in_place(&key, &owner, &slice) {
            return;
        }
        let resolved = self.resolve(&slice);
        let record = SliceRecord { slice, owner, resolved };
        let old = self.state.slices.remove(&key);
        self.reindex_slice(&key, old.as_ref(), Some(&record));
        let (old_owner, old_resolved) = old.map(|o| (o.owner, o.resolved)).unwrap_or_default();
        self.apply_slice_change(old_owner.as_deref(), &old_resolved, record.owner.as_deref(), &record.resolved);
        self.state.slices.insert(key, record);
    }

    /// The common update — a few endpoints of a slice changed, nothing else — re-resolves
    /// only those endpoints. Returns false when the update is not of that kind.
    fn update_slice_in_place(&mut self, key: &ObjectKey, owner: &Option<Name>, slice: &StoredSlice) -> bool {
        const MOST_CHANGED: usize = 8;
        let Some(old) = self.state.slices.get(key) else { return false };
        let same_shape = old.owner == *owner
            && old.slice.address_type == slice.address_type
            && !old.slice.deleting
            && !slice.deleting
            && old.slice.endpoints.len() == slice.endpoints.len();
        if !same_shape || !programmable(&slice.address_type) {
            return false;
        }
        let pairs = old.slice.endpoints.iter().zip(&slice.endpoints);
        let changed: Vec<usize> = pairs.enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect();
        if changed.len() > MOST_CHANGED
            || changed.iter().any(|&i| old.slice.endpoints[i].node_name != slice.endpoints[i].node_name)
        {
            return false;
        }
        let before = self.resolve_endpoints(changed.iter().map(|&i| &old.slice.endpoints[i]));
        let after = self.resolve_endpoints(changed.iter().map(|&i| &slice.endpoints[i]));
        // Each address must stand for exactly one resolved entry, in the old slice and in the
        // changed endpoints, and a changed endpoint must not take an address an unchanged one
        // lists: otherwise (a duplicate, an unknown node, a bad IP) the whole slice is re-read.
        let ready_addresses = |endpoints: &mut dyn Iterator<Item = &StoredEndpoint>| -> usize {
            endpoints.filter(|e| e.ready != Some(false)).map(|e| e.addresses.len()).sum()
        };
        if old.resolved.len() != ready_addresses(&mut old.slice.endpoints.iter())
            || after.len() != ready_addresses(&mut changed.iter().map(|&i| &slice.endpoints[i]))
            || after.keys().any(|a| old.resolved.contains_key(a) && !before.contains_key(a))
        {
            return false;
        }
        let owner = owner.clone();
        self.apply_slice_change(owner.as_deref(), &before, owner.as_deref(), &after);
        let record = self.state.slices.get_mut(key).expect("read above");
        for address in before.keys() {
            record.resolved.remove(address);
        }
        record.resolved.extend(after);
        record.slice = slice.clone();
        true
    }

    fn remove_slice(&mut self, key: &ObjectKey) {
        let Some(old) = self.state.slices.remove(key) else { return };
        self.reindex_slice(key, Some(&old), None);
        self.apply_slice_change(old.owner.as_deref(), &old.resolved, None, &VecMap::default());
    }

    /// Folds the change of one slice's contribution into the DiffTracker: only what changed.
    fn apply_slice_change(
        &mut self,
        old_owner: Option<&str>,
        old: &VecMap<Name, Name>,
        new_owner: Option<&str>,
        new: &VecMap<Name, Name>,
    ) {
        let old_owner = old_owner.filter(|o| self.programmable(o));
        let new_owner = new_owner.filter(|o| self.programmable(o));
        self.state.diff.replace_placements(old_owner, old, new_owner, new);
    }

    /// Keeps the owner and node indexes of a slice, touching only what changed between the
    /// old and the new record (an ordinary update changes neither).
    fn reindex_slice(&mut self, key: &ObjectKey, old: Option<&SliceRecord>, new: Option<&SliceRecord>) {
        fn nodes(record: Option<&SliceRecord>) -> BTreeSet<&Name> {
            let names = record.into_iter().flat_map(|r| r.slice.endpoints.iter().filter_map(|e| e.node_name.as_ref()));
            crate::name::set_of(names)
        }
        fn unlink(index: &mut BTreeMap<Name, VecSet<ObjectKey>>, at: &str, key: &ObjectKey) {
            if let Some(keys) = index.get_mut(at) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(at);
                }
            }
        }
        let (old_owner, new_owner) = (old.and_then(|r| r.owner.as_ref()), new.and_then(|r| r.owner.as_ref()));
        if old_owner != new_owner {
            if let Some(owner) = old_owner {
                unlink(&mut self.state.slices_by_owner, owner, key);
            }
            if let Some(owner) = new_owner {
                self.state.slices_by_owner.entry(owner.clone()).or_default().insert(key.clone());
            }
        }
        let (old_nodes, new_nodes) = (nodes(old), nodes(new));
        for gone in old_nodes.difference(&new_nodes) {
            unlink(&mut self.state.slices_by_node, gone, key);
        }
        for added in new_nodes.difference(&old_nodes) {
            self.state.slices_by_node.entry((*added).clone()).or_default().insert(key.clone());
        }
    }

    /// Re-resolves the slices with endpoints on a node after the node changed.
    fn reresolve_node(&mut self, name: &str) {
        let keys = self.state.slices_by_node.get(name).cloned().unwrap_or_default();
        for key in keys {
            let Some(record) = self.state.slices.get(&key) else { continue };
            let resolved = self.resolve(&record.slice);
            if resolved == record.resolved {
                continue;
            }
            let owner = record.owner.clone();
            let old = std::mem::replace(&mut self.state.slices.get_mut(&key).expect("just read").resolved, resolved);
            let new = self.state.slices[&key].resolved.clone();
            self.apply_slice_change(owner.as_deref(), &old, owner.as_deref(), &new);
        }
    }

    /// A changed Node whose InternalIPs do not all parse is logged (WARN), naming it: the
    /// addresses of its pods reach NRP only through the ones that do, and not at all when none
    /// does.
    fn upsert_node(&mut self, node: Node, step: &mut Step) {
        let name = node.name.clone();
        let locations = NodeLocations::of(&node);
        let unchanged = self.state.nodes.get(&name) == Some(&locations);
        self.state.nodes.insert(name.clone(), locations);
        if unchanged {
            return;
        }
        let bad: Vec<&String> = node.internal_ips.iter().filter(|ip| ip::canonical(ip).is_none()).collect();
        let usable = node.internal_ips.len() - bad.len();
        // A Node with no InternalIP yet (its kubelet has not reported them) is not worth a line.
        if !bad.is_empty() {
            let what = match usable {
                0 => "the addresses of its pods are not programmed in NRP",
                _ => "its other InternalIPs are its locations",
            };
            let message = format!("node {name}: InternalIPs {bad:?} are not IP addresses ({usable} usable); {what}");
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
        self.reresolve_node(&name);
    }

    fn remove_node(&mut self, name: &str) {
        if self.state.nodes.remove(name).is_some() {
            self.reresolve_node(name);
        }
    }
}

// ---- The NRP side: sync, batches, reads, reconciliation ----

/// NRP-facing bookkeeping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NrpSync {
    /// NRP has been read at least once.
    loaded: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
    /// Address-location batches in flight: command id → when it was issued.
    #[serde(deserialize_with = "crate::name::btree_map")]
    batches_in_flight: BTreeMap<u64, u64>,
    /// Throttled batches in a row (429), and until when every batch waits.
    batch_retries: u32,
    batch_not_before_ms: u64,
    /// Halved after a 400 to isolate the location NRP refuses.
    batch_limit: usize,
    /// Locations NRP refused on their own, with the update refused; skipped until it changes.
    #[serde(deserialize_with = "crate::name::btree_map")]
    quarantined: BTreeMap<String, NrpLocation>,
    /// Locations whose batch failed (not refused, not throttled): failures in a row and until
    /// when they wait; the others' batches go on. Forgotten when the location is next accepted.
    #[serde(deserialize_with = "crate::name::btree_map")]
    location_backoff: BTreeMap<String, Backoff>,
    service_writes_in_flight: u32,
    /// Non-inbound services of the last read: other controllers' identities, left alone.
    #[serde(deserialize_with = "crate::name::btree_set")]
    foreign: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Backoff {
    retries: u32,
    not_before_ms: u64,
}

/// Orphan clean-up touches only names shaped like Kubernetes UIDs, as upstream does.
fn looks_like_uid(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() == 5
        && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(len, part)| part.len() == *len)
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// How an identity found in either view takes part in an address-location sync: ours when
/// registered and live, drained when ours but not, left alone when another controller's.
fn classify(
    lifecycles: &BTreeMap<String, Lifecycle>,
    foreign: &BTreeSet<String>,
    egress: &Egress,
    outbound: &Outbound,
    diff: &DiffTracker,
    id: &str,
) -> Class {
    match lifecycles.get(id) {
        Some(l) if !l.phase.is_deleting() && diff.is_registered(id) => Class::Ready,
        Some(_) => Class::NotReady,
        None => classify_not_inbound(foreign, egress, outbound, diff, id),
    }
}

/// An identity no inbound lifecycle claims: an egress identity of ours (with an outbound
/// lifecycle: programmed only once created and registered, and while a pod carries it), else
/// one a pod carries, else somebody else's (a known foreign service, or a name that is not a UID
/// we could have registered).
fn classify_not_inbound(
    foreign: &BTreeSet<String>,
    egress: &Egress,
    outbound: &Outbound,
    diff: &DiffTracker,
    id: &str,
) -> Class {
    if let Some(ready) = outbound.ready(id, egress.is_registered(id)) {
        return if ready && egress.carries(id) { Class::Ready } else { Class::NotReady };
    }
    if let Some(class) = egress.class(id) {
        return class;
    }
    if foreign.contains(id) || (!diff.is_registered(id) && !looks_like_uid(id)) {
        Class::Foreign
    } else {
        Class::NotReady
    }
}

/// The address-location batches of `ids` (`NrpSync::batches_in_flight`), as `in_flight` holds them (a free
/// function, so that callers holding other fields of the state mutably can use it).
fn location_batches<'a>(
    ids: &'a BTreeMap<u64, u64>,
    in_flight: &'a BTreeMap<u64, InFlight>,
) -> impl Iterator<Item = &'a [NrpLocation]> {
    ids.keys().filter_map(|id| match in_flight.get(id) {
        Some(InFlight::Locations(batch)) => Some(batch.as_slice()),
        _ => None,
    })
}

impl Tracker {
    // ---- Readiness ----

    fn class(&self, identity: &str) -> Class {
        classify(&self.state.lifecycles, &self.state.nrp.foreign, &self.egress, &self.outbound, &self.state.diff, identity)
    }

    /// No NRP address maps to the identity, nor may one in a batch whose answer is not in.
    fn drained(&self, identity: &str) -> bool {
        !self.state.diff.nrp_references(identity) && !self.batch_in_flight_mentions(identity)
    }

    fn batch_in_flight_mentions(&self, identity: &str) -> bool {
        self.batches_in_flight().flatten().flat_map(|l| &l.addresses).any(|a| a.services.iter().any(|s| s == identity))
    }

    /// The address-location batches in flight.
    fn batches_in_flight(&self) -> impl Iterator<Item = &[NrpLocation]> {
        location_batches(&self.state.nrp.batches_in_flight, &self.state.in_flight)
    }

    // ---- Address locations ----

    fn sync_locations(&mut self, now: u64, step: &mut Step) {
        let nrp = &self.state.nrp;
        // Another batch beside those in flight only once they are all slow: a batch answered at
        // NRP's usual pace lets the changes behind it coalesce.
        let all_slow = nrp.batches_in_flight.values().all(|&at| now.saturating_sub(at) >= timing::SLOW_BATCH_MS);
        if nrp.batches_in_flight.len() >= MAX_BATCHES_IN_FLIGHT
            || !all_slow
            || now < nrp.batch_not_before_ms
            || !self.state.diff.has_dirty()
            || self.token_due(WriteKind::AddressLocations, now).is_some()
        {
            return;
        }
        let State { diff, lifecycles, nrp, in_flight, .. } = &mut self.state;
        let busy: BTreeSet<&str> =
            location_batches(&nrp.batches_in_flight, in_flight).flatten().map(|l| l.location.as_str()).collect();
        // A backoff is kept while its location may fail again: until it is next accepted, or
        // once over, if the location is neither dirty nor in flight (it came back in sync).
        nrp.location_backoff
            .retain(|location, b| b.not_before_ms > now || busy.contains(location.as_str()) || diff.is_dirty(location));
        // A location in flight or backing off stays dirty for a later batch.
        let backoff = &nrp.location_backoff;
        let waits =
            |location: &str| busy.contains(location) || backoff.get(location).is_some_and(|b| b.not_before_ms > now);
        let (limit, foreign, egress, outbound) = (nrp.batch_limit.max(1), &nrp.foreign, &self.egress, &self.outbound);
        let mut batch =
            diff.take_sync(limit, waits, |diff, id| classify(lifecycles, foreign, egress, outbound, diff, id));
        // A location NRP refused on its own waits until its update changes.
        let quarantined = &mut self.state.nrp.quarantined;
        batch.retain(|update| match quarantined.get(&update.location) {
            Some(refused) if refused == update => false,
            Some(_) => {
                quarantined.remove(&update.location);
                true
            }
            None => true,
        });
        if batch.is_empty() {
            return;
        }
        let taken = self.take_token(WriteKind::AddressLocations, now);
        debug_assert!(taken, "checked by token_due above");
        let id = self.issue(Command::UpdateAddressLocations(batch.clone()), InFlight::Locations(batch), step);
        self.state.nrp.batches_in_flight.insert(id, now);
    }

    fn locations_outcome(&mut self, id: u64, batch: Vec<NrpLocation>, outcome: Outcome, now: u64, step: &mut Step) {
        self.state.nrp.batches_in_flight.remove(&id);
        self.pods.recheck();
        self.budget_answered(WriteKind::AddressLocations, &outcome, now, step);
        match outcome {
            Outcome::Failed(failure) => {
                for location in &batch {
                    self.state.diff.mark_uncertain(location);
                }
                let nrp = &mut self.state.nrp;
                if matches!(failure.status, 400 | 422) {
                    // NRP refuses the batch: halve it until the refused location stands alone,
                    // then set that one aside so it cannot block everyone else's addresses.
                    if batch.len() > 1 {
                        nrp.batch_limit = (batch.len() / 2).max(1);
                    } else if let Some(refused) = batch.into_iter().next() {
                        nrp.quarantined.insert(refused.location.clone(), refused);
                        nrp.batch_limit = MAX_LOCATIONS_PER_BATCH;
                    }
                    return;
                }
                let what = "update-address-locations";
                if failure.status == 429 {
                    // Throttled: the subscription's budget, so every batch waits, for its
                    // `Retry-After` (capped) if it has one; the shrunk, emptied write budget
                    // paces the batches after it (`budget_answered`), instead of a backoff.
                    nrp.batch_retries = nrp.batch_retries.saturating_add(1);
                    if failure.retry_after_ms.is_some() {
                        let delay = retry_delay("address-locations", nrp.batch_retries, &failure, what, step);
                        nrp.batch_not_before_ms = now.saturating_add(delay);
                    }
                    return;
                }
                // Failed or timed out: only these locations wait, backing off together.
                let backoff = &mut nrp.location_backoff;
                let retries = batch.iter().filter_map(|l| backoff.get(&l.location)).map(|b| b.retries).max();
                let retries = retries.unwrap_or(0).saturating_add(1);
                let key = batch.first().map_or("address-locations", |l| l.location.as_str());
                let not_before_ms = now.saturating_add(retry_delay(key, retries, &failure, what, step));
                for location in batch {
                    backoff.insert(location.location, Backoff { retries, not_before_ms });
                }
            }
            _ => {
                self.state.diff.apply(&batch);
                let nrp = &mut self.state.nrp;
                for location in &batch {
                    nrp.location_backoff.remove(&location.location);
                }
                nrp.batch_retries = 0;
                nrp.batch_not_before_ms = 0;
                nrp.batch_limit = nrp.batch_limit.saturating_mul(2).min(MAX_LOCATIONS_PER_BATCH);
            }
        }
    }

    // ---- Reading NRP ----

    fn read_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) {
        self.state.nrp.read_in_flight = false;
        let snapshot = match outcome {
            Outcome::NrpSnapshot(snapshot) => snapshot,
            Outcome::Failed(failure) => {
                let nrp = &mut self.state.nrp;
                nrp.read_retries = nrp.read_retries.saturating_add(1);
                let delay = retry_delay("read-nrp", nrp.read_retries, &failure, "read-nrp", step);
                nrp.next_read_ms = now.saturating_add(delay);
                return;
            }
            // Any other answer is a host bug; read again after the shortest backoff.
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::ArmInventory(_) => {
                self.state.nrp.next_read_ms = now.saturating_add(timing::BACKOFF_BASE_MS);
                return;
            }
        };
        let mut inbound = BTreeSet::new();
        let mut foreign = BTreeSet::new();
        for service in &snapshot.services {
            let name = service.name.to_ascii_lowercase();
            if service.service_type.eq_ignore_ascii_case("Inbound") && !service.is_default {
                inbound.insert(name);
            } else {
                foreign.insert(name);
            }
        }
        self.state.diff.replace_nrp(inbound, &snapshot.locations);
        self.egress.nrp_read(&snapshot.services, &self.state.diff);
        self.pods.recheck();
        let nrp = &mut self.state.nrp;
        nrp.foreign = foreign;
        nrp.loaded = true;
        nrp.read_retries = 0;
        // Saturating, like every deadline: near the end of u64 time a wrapped deadline would
        // keep a read always due, and a due read holds every NRP write.
        nrp.next_read_ms = now.saturating_add(timing::RESYNC_INTERVAL_MS);
        nrp.quarantined.clear();
        if self.state.reconciled {
            self.reconcile_with_nrp(step);
        } else {
            self.maybe_reconcile(step);
        }
    }

    fn maybe_reconcile(&mut self, step: &mut Step) {
        if !self.state.reconciled && self.state.lists_complete && self.state.nrp.loaded && self.arm.settled {
            self.state.reconciled = true;
            self.reconcile_with_nrp(step);
        }
    }

    /// After a read of NRP: re-register what NRP lost, adopt or clean up what it has that
    /// Kubernetes does not explain (upstream §c.2.4).
    fn reconcile_with_nrp(&mut self, step: &mut Step) {
        self.reconcile_outbound();
        let registered: Vec<String> = self.state.diff.registered().iter().map(Name::to_string).collect();
        for (identity, lifecycle) in self.state.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.state.diff.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.op_config = lifecycle.desired.clone();
                lifecycle.steps = OpStep::ENSURE.into();
                self.state.work.runnable.insert(identity.clone());
            }
        }
        self.drain_again_where_referenced::<Inbound>();
        for identity in registered {
            if self.state.lifecycles.contains_key(&identity) || !looks_like_uid(&identity) {
                continue;
            }
            let record =
                self.state.service_by_identity.get(&identity).and_then(|key| self.state.services.get(key)).cloned();
            match record {
                // A live Service that is no longer admitted keeps serving (design §3).
                Some(r) if !matches!(r.verdict, Verdict::Cleanup | Verdict::Ignored(_)) => {
                    let lifecycle =
                        Lifecycle::new(object_ref(&r.observed), Phase::Created, ObjectState::of(&r.observed), None);
                    self.state.lifecycles.insert(identity.clone(), lifecycle);
                    self.seed(&identity);
                    self.state.diff.touch_identity(&identity);
                }
                Some(r) => self.adopt_for_deletion(&identity, object_ref(&r.observed), ObjectState::of(&r.observed)),
                None => {
                    self.adopt_for_deletion(&identity, orphan(&identity), ObjectState::gone());
                    self.refuse_colliding_pods(&identity, step);
                }
            }
        }
    }
}

// ---- Start-up: the ARM inventory, adoption and the sweep ----

/// The start-up inventory of ARM (state version 4): the resource group's public IPs and load
/// balancers, read once so that what already holds what a Service wants is
/// adopted instead of written again, and so that load balancers and public IPs of Services
/// deleted while no controller ran are found. It is read once the lists are complete and NRP is
/// read, and used the moment it arrives (start-up reconciliation waits for it), so the state
/// never holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ArmSync {
    /// Start-up reconciliation may run: the inventory was used, or reading it was given up.
    settled: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
}

impl ArmSync {
    /// A state from before version 4: nothing to read, nothing to adopt.
    fn settled() -> Self {
        Self { settled: true, ..Self::default() }
    }
}

/// Whether a listed load balancer holds what `wanted` says: rules compared as a set (ARM may
/// list them in another order; rule names are unique on a load balancer). A few rules each: a
/// scan, not a sort, which would cost the component a sort's code.
fn same_load_balancer(listed: &LoadBalancer, wanted: &LoadBalancer) -> bool {
    (&listed.name, &listed.public_ip, &listed.backend_pool) == (&wanted.name, &wanted.public_ip, &wanted.backend_pool)
        && listed.rules.len() == wanted.rules.len()
        && wanted.rules.iter().all(|rule| listed.rules.contains(rule))
}

impl Tracker {
    /// The start-up inventory is to be read: not settled, not out, and asked for only once the
    /// lists are complete and NRP is read (start-up reconciliation uses it the moment it comes).
    fn inventory_wanted(&self) -> bool {
        !self.arm.settled && !self.arm.read_in_flight && self.state.lists_complete && self.state.nrp.loaded
    }

    // ---- The start-up inventory of ARM ----

    fn arm_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) {
        let arm = &mut self.arm;
        arm.read_in_flight = false;
        match outcome {
            Outcome::ArmInventory(inventory) => {
                arm.settled = true;
                // Issued only once the lists are complete and NRP is read: start-up
                // reconciliation runs now, with the inventory.
                self.maybe_reconcile(step);
                self.adopt_from_arm(&inventory, step);
                return;
            }
            Outcome::Failed(failure) if arm.read_retries.saturating_add(1) < timing::ARM_READ_ATTEMPTS => {
                arm.read_retries += 1;
                let delay = retry_delay("read-arm", arm.read_retries, &failure, "read-arm", step);
                arm.next_read_ms = now.saturating_add(delay);
            }
            other => {
                // No `Debug` of the answer: it would pull the formatting of every record into the
                // component for one log line.
                let why = match other {
                    Outcome::Failed(f) => format!("HTTP {} {}: {}", f.status, f.code.unwrap_or_default(), f.message),
                    _ => "the host answered with another outcome than an inventory".to_owned(),
                };
                let message = format!(
                    "read-arm failed {} time(s) ({why}); start-up goes on without the ARM inventory: \
                     every Service's public IP and load balancer is written once, none is adopted",
                    arm.read_retries + 1
                );
                step.logs.push(LogLine { level: LogLevel::Warn, message });
                arm.settled = true;
            }
        }
        self.maybe_reconcile(step);
    }

    /// Start-up adoption: a Service not yet provisioned by this tracker whose public IP (and
    /// load balancer) ARM already holds as it wants them skips those writes, and one that needs
    /// nothing written at all is created as it is, with no second `EnsuredLoadBalancer` Event.
    /// Then the sweep: a UID-named load balancer of our shape, or a UID-named `-pip` public IP,
    /// that no Service, NRP registration, egress identity or foreign service explains is ours
    /// from a Service deleted while no controller ran, and is deleted.
    fn adopt_from_arm(&mut self, inventory: &ArmInventory, step: &mut Step) {
        // Names sorted with their index, not maps: each map or sort of another type costs the
        // component kilobytes of code, and both lists share this one.
        fn by_name(mut names: Vec<(&str, usize)>) -> Vec<(&str, usize)> {
            names.sort_unstable();
            names
        }
        let public_ips = by_name(inventory.public_ips.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect());
        let shaped = inventory.load_balancers.iter().enumerate().filter(|(_, l)| l.shape.is_some());
        let load_balancers = by_name(shaped.map(|(i, l)| (l.name.as_str(), i)).collect());
        let find = |sorted: &[(&str, usize)], name: &str| {
            sorted.binary_search_by_key(&name, |(n, _)| n).ok().map(|i| sorted[i].1)
        };
        let public_ip_named = |name: &str| find(&public_ips, name).map(|i| &inventory.public_ips[i]);
        let load_balancer_named =
            |name: &str| find(&load_balancers, name).and_then(|i| inventory.load_balancers[i].shape.as_ref());
        let (mut adopted, mut whole) = (0usize, 0usize);
        for (identity, lifecycle) in self.state.lifecycles.iter_mut() {
            if lifecycle.phase != Phase::NotStarted {
                continue;
            }
            let Some(config) = lifecycle.op_config.as_ref() else { continue };
            let public_ip = public_ip_named(&config.public_ip.name)
                .filter(|p| p.as_put && p.version == config.public_ip.version)
                .and_then(|p| p.address.clone());
            let Some(address) = public_ip else { continue };
            let load_balancer_holds = load_balancer_named(&config.load_balancer.name)
                .is_some_and(|lb| same_load_balancer(lb, &config.load_balancer));
            lifecycle
                .steps
                .retain(|s| *s != OpStep::PutPublicIp && (*s != OpStep::PutLoadBalancer || !load_balancer_holds));
            adopted += 1;
            lifecycle.ingress_ip = Some(address);
            // Every step left already holds: the Service is as a creation would leave it.
            let registered = self.state.diff.is_registered(identity);
            if lifecycle.steps.iter().all(|&op| lifecycle.holds_already(op, registered)) {
                lifecycle.phase = Phase::Created;
                lifecycle.applied = lifecycle.op_config.clone();
                lifecycle.steps.clear();
                self.state.work.runnable.remove(identity);
                whole += 1;
            }
        }
        let sweepable = |tracker: &Self, identity: &str| {
            looks_like_uid(identity)
                && !tracker.state.lifecycles.contains_key(identity)
                && !tracker.state.service_by_identity.contains_key(identity)
                && !tracker.state.diff.is_registered(identity)
                && !tracker.state.nrp.foreign.contains(identity)
                && tracker.egress.class(identity).is_none()
        };
        let mut orphans = 0usize;
        for &(name, index) in &load_balancers {
            let Some(lb) = inventory.load_balancers[index].shape.as_ref() else { continue };
            let ours = lb.backend_pool == name && lb.public_ip == format!("{name}-pip");
            if ours && sweepable(self, name) {
                self.adopt_for_deletion(name, orphan(name), ObjectState::gone());
                orphans += 1;
            }
        }
        // Then the public IPs left without a load balancer (those with one are adopted above).
        for &(name, _) in &public_ips {
            if let Some(identity) = name.strip_suffix("-pip").filter(|id| sweepable(self, id)) {
                self.adopt_for_deletion(identity, orphan(identity), ObjectState::gone());
                orphans += 1;
            }
        }
        let (outbound_adopted, outbound_orphans) = self.adopt_outbound_from_arm(inventory);
        let message = format!(
            "start-up inventory: {} public IP(s), {} load balancer(s), {} NAT gateway(s); {adopted} Service(s) \
             adopted their public IP, {whole} of them with nothing to write; {} orphan(s) of deleted Services to \
             delete; {outbound_adopted} egress identit(y/ies) adopted, {outbound_orphans} no pod carries to tear down",
            inventory.public_ips.len(),
            inventory.load_balancers.len(),
            inventory.nat_gateways.len(),
            orphans
        );
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }

    /// Start-up adoption of egress identities. A NAT gateway of ours is one named as a valid
    /// identity that is exactly what `PutNatGateway` makes of it (its public IPs `<id>-pip`
    /// and, if any, `<id>-pip-v6`). Carried by a pod and registered: ours, created (no write). Carried
    /// and being created: what already holds is not written again. Carried by no pod: left from
    /// before (its pods went while no controller ran, or a teardown was cut short) and torn down,
    /// after a drain if NRP still maps its addresses. Nothing else is touched, and never the RP's
    /// `default-natgw` (not a valid identity). Public IPs a teardown cut short left after deleting
    /// their NAT gateway are not swept: `<id>-pip` alone does not prove a public IP ours (the
    /// inventory test keeps `kubernetes-pip`). Returns (adopted, torn down).
    fn adopt_outbound_from_arm(&mut self, inventory: &ArmInventory) -> (usize, usize) {
        let (mut adopted, mut orphans) = (0, 0);
        let pip = outbound::public_ip_name;
        for nat in &inventory.nat_gateways {
            let id = nat.name.to_ascii_lowercase();
            let v6 = !nat.public_ips_v6.is_empty();
            let shaped = nat.as_put
                && nat.public_ips == [pip(&id, false)]
                && (!v6 || nat.public_ips_v6 == [pip(&id, true)]);
            if !shaped || !crate::egress::is_valid_identity(&id) || self.state.is_inbound(&id) {
                continue;
            }
            let (carried, registered) = (self.egress.carries(&id), self.egress.is_registered(&id));
            let listed_as_put = |name: &str| inventory.public_ips.iter().any(|p| p.name.eq_ignore_ascii_case(name) && p.as_put);
            match self.outbound.lifecycles.get_mut(&id) {
                Some(lifecycle) if lifecycle.phase == Phase::NotStarted => {
                    let holds = nat.associated
                        && lifecycle.v6 == v6
                        && listed_as_put(&pip(&id, false))
                        && (!v6 || listed_as_put(&pip(&id, true)));
                    if holds {
                        lifecycle.steps.retain(|s| !matches!(s, OutStep::PutPublicIp | OutStep::PutPublicIpV6 | OutStep::PutNatGateway));
                        lifecycle.public_ips_put = true;
                        lifecycle.nat_gateway_put = true;
                        adopted += 1;
                    }
                }
                Some(_) => {}
                None if carried && registered => {
                    let lifecycle = OutboundLifecycle::new(Phase::Created, v6, VecDeque::new());
                    self.outbound.lifecycles.insert(id.clone(), lifecycle);
                    self.state.diff.touch_identity(&id);
                    adopted += 1;
                }
                None if carried => {}
                None => {
                    let mut lifecycle = OutboundLifecycle::new(Phase::DeletionPending, v6, VecDeque::new());
                    lifecycle.whole = false;
                    self.outbound.lifecycles.insert(id.clone(), lifecycle);
                    self.outbound.work.draining.insert(id.clone());
                    self.state.diff.touch_identity(&id);
                    orphans += 1;
                }
            }
        }
        (adopted, orphans + self.sweep_egress_public_ips(inventory))
    }

    /// The public IPs a teardown cut short left after deleting their NAT gateway (upstream
    /// `TestGuardEgressPublicIPsAreSweptOnceNATGatewayIsGone`): `<id>-pip` / `<id>-pip-v6` of our
    /// shape (StandardV2, static, of their family) for a valid identity that is no Service's, has no
    /// outbound lifecycle (a NAT gateway of ours above made one), no pod carries, NRP neither
    /// registers nor references, and that no load balancer or NAT gateway of the resource group
    /// uses. They go through the outbound teardown, whose other steps hold already. The RP's
    /// `default-natgw-pip` is never one (`default-natgw` is no valid identity); UID-shaped names
    /// are the inbound sweep's. Returns how many identities are swept.
    fn sweep_egress_public_ips(&mut self, inventory: &ArmInventory) -> usize {
        let used = |name: &str| {
            inventory.nat_gateways.iter().any(|n| n.public_ips.iter().chain(&n.public_ips_v6).any(|p| p.eq_ignore_ascii_case(name)))
                || inventory.load_balancers.iter().any(|l| l.shape.as_ref().is_some_and(|s| s.public_ip.eq_ignore_ascii_case(name)))
        };
        let mut found: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for ip in inventory.public_ips.iter().filter(|p| p.as_put) {
            let name = ip.name.to_ascii_lowercase();
            let (id, v6) = match (name.strip_suffix("-pip-v6"), name.strip_suffix("-pip")) {
                (Some(id), _) if ip.version == IpVersion::Ipv6 => (id, true),
                (None, Some(id)) if ip.version == IpVersion::Ipv4 => (id, false),
                _ => continue,
            };
            let ours = crate::egress::is_valid_identity(id)
                && !looks_like_uid(id)
                && !self.state.is_inbound(id)
                && !self.outbound.lifecycles.contains_key(id)
                && !self.egress.carries(id)
                && !self.egress.is_registered(id)
                && !self.state.nrp.foreign.contains(id)
                && !self.state.diff.nrp_references(id)
                && !used(&name);
            if ours {
                let entry = found.entry(id.to_owned()).or_default();
                if v6 { entry.1 = true } else { entry.0 = true }
            }
        }
        let swept = found.len();
        for (id, (_, v6)) in found {
            // Only the public IPs are left: every step before their deletes holds already.
            let mut lifecycle = OutboundLifecycle::new(Phase::DeletionInProgress, v6, outbound::DELETE.into());
            lifecycle.whole = false;
            lifecycle.nat_gateway_put = false;
            self.outbound.lifecycles.insert(id.clone(), lifecycle);
            self.outbound.work.runnable.insert(id);
        }
        swept
    }
}

// ---- The lifecycle driver ----

/// A kind of lifecycle: where its lifecycles and work sets live in the tracker, and what is
/// particular to it.
trait Kind {
    type Life: Life;
    /// Its teardown, run once its addresses have drained.
    const DELETE: &'static [<Self::Life as Life>::Op];
    /// The step that unregisters it from NRP.
    const UNREGISTER: <Self::Life as Life>::Op;
    fn lifecycles(tracker: &Tracker) -> &BTreeMap<String, Self::Life>;
    fn parts(tracker: &mut Tracker) -> (&mut BTreeMap<String, Self::Life>, &mut WorkSets<String>);
    /// NRP lists the identity as registered (as the mirror has it).
    fn registered(tracker: &Tracker, identity: &str) -> bool;
    /// Waits for another lifecycle of the same name to end first.
    fn blocked(_tracker: &Tracker, _identity: &str) -> bool {
        false
    }
    /// The command that carries out `op`; called as it is sent.
    fn command(tracker: &mut Tracker, identity: &str, op: <Self::Life as Life>::Op) -> Command;
    fn in_flight(identity: &str, op: <Self::Life as Life>::Op) -> InFlight;
    /// Every step of the operation is done.
    fn finish(tracker: &mut Tracker, identity: &str, step: &mut Step);
}

type OpOf<K> = <<K as Kind>::Life as Life>::Op;

impl Tracker {
    /// Advances `K`'s runnable lifecycles while there is room in flight; those that must wait
    /// for a read of NRP or a token stay runnable.
    fn run<K: Kind>(&mut self, now: u64, hold_nrp_writes: bool, step: &mut Step) {
        let mut held = Vec::new();
        while self.state.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT {
            let Some(identity) = K::parts(self).1.runnable.pop_first() else { break };
            if !self.advance::<K>(&identity, now, hold_nrp_writes, step) {
                held.push(identity);
            }
        }
        K::parts(self).1.runnable.extend(held);
    }

    /// Issues the next command of a lifecycle's operation, skipping the steps that hold
    /// already. Returns false when it must wait (for a read of NRP, a token, or the other
    /// lifecycle of its name).
    fn advance<K: Kind>(&mut self, identity: &str, now: u64, hold_nrp_writes: bool, step: &mut Step) -> bool {
        if K::blocked(self, identity) {
            return false;
        }
        loop {
            let registered = K::registered(self, identity);
            let (lifecycles, work) = K::parts(self);
            let Some(lifecycle) = lifecycles.get_mut(identity) else { return true };
            let phase = lifecycle.phase();
            if lifecycle.attempt().in_flight.is_some() || lifecycle.parked() || phase == Phase::DeletionPending {
                return true;
            }
            if phase == Phase::Created && lifecycle.steps().is_empty() {
                return true;
            }
            let attempt = lifecycle.attempt_mut();
            if attempt.not_before_ms > now {
                // As `bring_in_deadlines`: never further ahead than the longest delay.
                attempt.not_before_ms = attempt.not_before_ms.min(now.saturating_add(timing::MAX_DELAY_MS));
                work.timers.insert((attempt.not_before_ms, identity.to_owned()));
                return true;
            }
            let Some(&next) = lifecycle.steps().front() else {
                K::finish(self, identity, step);
                return true;
            };
            if lifecycle.holds_already(next, registered) {
                lifecycle.steps().pop_front();
                continue;
            }
            if next.writes_nrp() && hold_nrp_writes {
                return false;
            }
            if next.write_kind().is_some_and(|kind| !self.take_token(kind, now)) {
                return false; // `next_wake` wakes for the token
            }
            let command = K::command(self, identity, next);
            let lifecycle = K::parts(self).0.get_mut(identity).expect("checked above");
            if lifecycle.phase() == Phase::NotStarted {
                lifecycle.set_phase(Phase::CreationInProgress);
            }
            if next.writes_nrp() {
                self.state.nrp.service_writes_in_flight += 1;
            }
            self.state.service_commands_in_flight += 1;
            let id = self.issue(command, K::in_flight(identity, next), step);
            K::parts(self).0.get_mut(identity).expect("checked above").attempt_mut().in_flight = Some((id, next));
            return true;
        }
    }

    /// An answer to one of `K`'s commands. Azure's answer counts for its write budget whether or
    /// not the lifecycle still waits for it; returns whether it does (it is runnable again).
    fn answered<K: Kind>(&mut self, identity: &str, id: u64, op: OpOf<K>, outcome: &Outcome, now: u64, step: &mut Step) -> bool {
        if let Some(kind) = op.write_kind() {
            self.budget_answered(kind, outcome, now, step);
        }
        let (lifecycles, work) = K::parts(self);
        let waited = lifecycles.get_mut(identity).is_some_and(|l| l.attempt_mut().answered(id));
        if waited {
            work.runnable.insert(identity.to_owned());
        }
        waited
    }

    /// A step's work is done (the caller recorded its own facts): its backoff ends, and the
    /// operation moves past it unless a teardown pre-empted the operation it was part of.
    fn step_done<K: Kind>(&mut self, identity: &str, op: OpOf<K>) {
        let lifecycle = K::parts(self).0.get_mut(identity).expect("caller checked");
        lifecycle.attempt_mut().reset();
        *lifecycle.failing() = false;
        if lifecycle.phase().is_deleting() && !op.is_delete_step() {
            return;
        }
        if lifecycle.steps().front() == Some(&op) {
            lifecycle.steps().pop_front();
        }
    }

    /// A failed step waits out its backoff. Returns whether the failure starts a run of
    /// failures, which the caller reports (once per run).
    fn retry_later<K: Kind>(&mut self, identity: &str, failure: &Failure, what: &str, now: u64, step: &mut Step) -> bool {
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        let at = lifecycle.attempt_mut().failed(identity, failure, what, now, step);
        work.timers.insert((at, identity.to_owned()));
        !std::mem::replace(lifecycle.failing(), true)
    }

    /// The lifecycle waits, deletion pending, for NRP to map no address to it any more.
    fn start_drain<K: Kind>(&mut self, identity: &str) {
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        lifecycle.set_phase(Phase::DeletionPending);
        lifecycle.steps().clear();
        work.draining.insert(identity.to_owned());
        self.state.diff.touch_identity(identity);
    }

    /// NRP refused to unregister it (`ServiceWithOverlayMappingsCannotBeDeleted`): NRP still
    /// maps addresses to it, so the mirror was wrong. It drains again, and NRP is read back.
    fn drain_again<K: Kind>(&mut self, identity: &str, now: u64) {
        self.start_drain::<K>(identity);
        self.state.nrp.next_read_ms = now;
    }

    /// After a read of NRP: a teardown about to unregister whose drain ended on a mirror NRP now
    /// contradicts (after an overlay-mappings refusal the drain ends before NRP is read back)
    /// drains again before the unregistration.
    fn drain_again_where_referenced<K: Kind>(&mut self) {
        let contradicted: Vec<String> = K::lifecycles(self)
            .iter()
            .filter(|(identity, l)| {
                l.phase() == Phase::DeletionInProgress
                    && l.attempt().in_flight.is_none()
                    && self.state.diff.nrp_references(identity)
            })
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in contradicted {
            let lifecycle = K::parts(self).0.get_mut(&identity).expect("listed above");
            if lifecycle.steps().contains(&K::UNREGISTER) {
                self.start_drain::<K>(&identity);
                K::parts(self).1.runnable.remove(&identity);
            }
        }
    }

    /// The draining lifecycles of `K` whose addresses have left NRP start their teardown.
    fn check_drained<K: Kind>(&mut self) {
        let draining: Vec<String> = K::parts(self).1.draining.iter().cloned().collect();
        for identity in draining {
            let Some(lifecycle) = K::lifecycles(self).get(&identity) else {
                K::parts(self).1.draining.remove(&identity);
                continue;
            };
            if lifecycle.phase() != Phase::DeletionPending
                || lifecycle.attempt().in_flight.is_some()
                || !self.drained(&identity)
            {
                continue;
            }
            let (lifecycles, work) = K::parts(self);
            let lifecycle = lifecycles.get_mut(&identity).expect("read above");
            lifecycle.set_phase(Phase::DeletionInProgress);
            *lifecycle.steps() = K::DELETE.iter().copied().collect();
            work.draining.remove(&identity);
            work.runnable.insert(identity);
        }
    }
}

// ---- Egress identities' outbound lifecycles (crate::outbound) ----

impl Tracker {
    // ---- Outbound lifecycles (crate::outbound) ----

    /// Whether a Node of the cluster has an IPv6 address: an identity created now gets an IPv6
    /// public IP too (upstream: the cluster's families, decided once per identity).
    fn cluster_has_ipv6(&self) -> bool {
        self.state.nodes.values().any(|n| n.v6.is_some())
    }

    /// Whether pods carry the identity changed (none to some, some to none). Nothing is decided
    /// before start-up reconciliation, which decides for every carried identity once NRP (which
    /// says which identities are somebody else's) has been read.
    fn carried_changed(&mut self, identity: &str) {
        if !self.state.reconciled || self.mode != Mode::ContainerLoadBalancer {
            return;
        }
        let carried = self.egress.carries(identity);
        let Some(lifecycle) = self.outbound.lifecycles.get_mut(identity) else {
            // An identity NRP already lists is somebody else's: programmed, never provisioned.
            if carried && !self.egress.is_registered(identity) {
                let lifecycle = OutboundLifecycle::creating(self.cluster_has_ipv6());
                self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                self.outbound.work.runnable.insert(identity.to_owned());
            }
            return;
        };
        match (carried, lifecycle.phase) {
            // Back while its addresses drain, before any teardown step: it stays as it is
            // (upstream: revived only if no delete was attempted).
            (true, Phase::DeletionPending) if lifecycle.whole => {
                lifecycle.phase = Phase::Created;
                self.outbound.work.draining.remove(identity);
                self.state.diff.touch_identity(identity);
            }
            (true, Phase::DeletionPending | Phase::DeletionInProgress) => lifecycle.recreate = true,
            (true, _) => {}
            (false, Phase::DeletionPending | Phase::DeletionInProgress) => lifecycle.recreate = false,
            // Nothing was written yet: nothing to tear down.
            (false, Phase::NotStarted) => {
                self.outbound.lifecycles.remove(identity);
                self.outbound.work.runnable.remove(identity);
            }
            // The last pod went: drain, then tear down. A command in flight finishes first.
            (false, _) => {
                if lifecycle.steps.front() == Some(&OutStep::Register) && lifecycle.attempt.retries > 0 {
                    // A registration was answered with a failure and waits for its retry: it
                    // may have taken effect all the same (a lost response), so the teardown
                    // unregisters rather than trust the mirror (a read of NRP corrects it).
                    self.egress.set_registered(identity, true);
                }
                lifecycle.attempt.reset();
                lifecycle.failing = false;
                self.start_drain::<OutboundIdentity>(identity);
            }
        }
    }

    /// After every read of NRP: carried identities with no lifecycle (pods seen before the
    /// first read, or an identity whose registration by somebody else went away) are decided
    /// now, and one of ours that NRP lost is ensured again (every step is a PUT: idempotent).
    fn reconcile_outbound(&mut self) {
        let undecided: Vec<String> =
            self.egress.carried().filter(|id| !self.outbound.lifecycles.contains_key(*id)).map(str::to_owned).collect();
        for identity in undecided {
            self.carried_changed(&identity);
        }
        for (identity, lifecycle) in self.outbound.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.egress.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.steps = outbound::ENSURE.into();
                self.outbound.work.runnable.insert(identity.clone());
                self.state.diff.touch_identity(identity);
            }
        }
        self.drain_again_where_referenced::<OutboundIdentity>();
    }

    /// The last step of an outbound operation succeeded.
    fn finish_outbound(&mut self, identity: &str, step: &mut Step) {
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("caller checked");
        let message = match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                lifecycle.phase = Phase::Created;
                lifecycle.whole = true;
                self.state.diff.touch_identity(identity);
                format!("egress identity {identity}: NAT gateway and public IP(s) in place, Outbound service registered")
            }
            Phase::DeletionInProgress => {
                let recreate = lifecycle.recreate && self.egress.carries(identity);
                self.outbound.lifecycles.remove(identity);
                self.pods.recheck(); // a last pod's finalizer waited for this
                if recreate {
                    let lifecycle = OutboundLifecycle::creating(self.cluster_has_ipv6());
                    self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                    self.outbound.work.runnable.insert(identity.to_owned());
                }
                format!("egress identity {identity}: unregistered, NAT gateway and public IP(s) deleted")
            }
            Phase::Created | Phase::DeletionPending => return,
        };
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }

    fn outbound_outcome(&mut self, identity: &str, id: u64, op: OutStep, outcome: Outcome, now: u64, step: &mut Step) {
        if !self.answered::<OutboundIdentity>(identity, id, op, &outcome, now, step) {
            return;
        }
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("it waited for the answer");
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.outbound_step_succeeded(identity, op);
                return;
            }
        };
        if failure.status == 404 && op.gone_is_done() {
            self.outbound_step_succeeded(identity, op);
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            if op == OutStep::Register {
                // It may have taken effect whatever the answer: the teardown unregisters.
                self.egress.set_registered(identity, true);
            }
            return; // a creation pre-empted by the teardown: the teardown carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        let what = format!("{op:?} for egress identity {identity}");
        if op.failure_is_ignored() {
            let message =
                format!("{what} failed (HTTP {} {code}): {}; the teardown goes on", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message });
            self.outbound_step_succeeded(identity, op);
            return;
        }
        if op == OutStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            self.drain_again::<OutboundIdentity>(identity, now);
        }
        if self.retry_later::<OutboundIdentity>(identity, &failure, &what, now, step) {
            let message = format!(
                "{what} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
    }

    fn outbound_step_succeeded(&mut self, identity: &str, op: OutStep) {
        match op {
            OutStep::Register => {
                self.egress.set_registered(identity, true);
                self.state.diff.touch_identity(identity);
            }
            OutStep::Unregister => self.egress.set_registered(identity, false),
            _ => {}
        }
        self.outbound.lifecycles.get_mut(identity).expect("caller checked").succeeded(op);
        self.step_done::<OutboundIdentity>(identity, op);
    }

    /// The outbound side: the lifecycles of the egress identities this tracker provisions.
    pub fn outbound(&self) -> &Outbound {
        &self.outbound
    }
}

/// Egress identities' outbound lifecycles, to the lifecycle driver.
struct OutboundIdentity;

impl Kind for OutboundIdentity {
    type Life = OutboundLifecycle;
    const DELETE: &'static [OutStep] = &outbound::DELETE;
    const UNREGISTER: OutStep = OutStep::Unregister;
    fn lifecycles(tracker: &Tracker) -> &BTreeMap<String, OutboundLifecycle> {
        &tracker.outbound.lifecycles
    }
    fn parts(tracker: &mut Tracker) -> (&mut BTreeMap<String, OutboundLifecycle>, &mut WorkSets<String>) {
        (&mut tracker.outbound.lifecycles, &mut tracker.outbound.work)
    }
    fn registered(tracker: &Tracker, identity: &str) -> bool {
        tracker.egress.is_registered(identity)
    }
    /// Records what the step may leave behind as it is sent.
    fn command(tracker: &mut Tracker, identity: &str, op: OutStep) -> Command {
        let lifecycle = tracker.outbound.lifecycles.get_mut(identity).expect("the driver checked");
        let command = lifecycle.command(identity, op);
        lifecycle.sending(op);
        command
    }
    fn in_flight(identity: &str, op: OutStep) -> InFlight {
        InFlight::Outbound { identity: identity.to_owned(), step: op }
    }
    fn finish(tracker: &mut Tracker, identity: &str, step: &mut Step) {
        tracker.finish_outbound(identity, step);
    }
}

// ---- Egress pods and their finalizers (crate::pod_finalizers) ----

impl Tracker {
    /// An egress pod was created or changed (the rules are in [`crate::egress`]).
    fn upsert_pod(&mut self, pod: &Pod, step: &mut Step) {
        let key = pod.key();
        if self.pods.superseded(pod) {
            return; // a stale deletion of the object a same-name replacement superseded (`crate::pod_finalizers`)
        }
        let carried_before = self.egress.carried_by(&key);
        let before = carried_before.as_ref().map(|(identity, _)| identity.clone());
        let State { lifecycles, service_by_identity, diff, .. } = &mut self.state;
        let inbound = |id: &str| lifecycles.contains_key(id) || service_by_identity.contains_key(id);
        for (regarding, warning) in self.egress.upsert(pod, inbound, diff) {
            self.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
        let carried_after = self.egress.carried_by(&key);
        self.pods.observe(pod, &carried_before, &carried_after);
        if carried_after.is_none() && pod.finalizers.iter().any(|f| f == pod_finalizers::FINALIZER) {
            // Held by our finalizer from before this state (a restart): what it carried drains.
            let named = pod_finalizers::named_by(pod).filter(|(id, _)| !self.state.is_inbound(id));
            if let Some((identity, _)) = named.filter(|(id, _)| self.egress.know(id)) {
                self.state.diff.touch_identity(&identity);
            }
        }
        let after = carried_after.map(|(identity, _)| identity);
        if before != after {
            for identity in before.iter().chain(&after) {
                self.carried_changed(identity);
            }
        }
    }

    /// An inbound identity is known now (a Service, an orphan in NRP): egress pods carrying it
    /// are refused, as they would have been had it been known when they were read
    /// ([`Egress::refuse_identity`]).
    fn refuse_colliding_pods(&mut self, identity: &str, step: &mut Step) {
        let refused = self.egress.refuse_identity(identity, &mut self.state.diff);
        if !refused.is_empty() {
            self.carried_changed(identity);
        }
        for (regarding, warning, addresses) in refused {
            let key = ObjectKey { namespace: regarding.namespace.clone(), name: regarding.name.clone() };
            self.pods.gone(&key, &Some((identity.to_owned(), addresses)), false);
            self.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
    }

    /// The egress side: the pods, the identities they carry and the reference counts (P4).
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    // ---- Egress pod finalizers (crate::pod_finalizers) ----

    /// Adds the finalizer to the pods that carry an identity, and releases it from those that
    /// carry nothing any more once what they carried has left NRP.
    fn advance_pod_finalizers(&mut self, now: u64, step: &mut Step) {
        let runnable = self.pods.take_runnable(now);
        let due: Vec<(ObjectKey, Want)> =
            runnable.into_iter().filter_map(|key| self.pods.due(&key, now).map(|want| (key, want))).collect();
        let writes: Vec<(ObjectKey, bool)> = {
            // The batches in flight's locations, sorted, once per call rather than once per address
            // a releasing pod carried (a mass deletion releases thousands). No location is in two
            // batches in flight (`State::check`).
            let mut in_flight: Vec<&NrpLocation> = Vec::new();
            if due.iter().any(|(_, want)| *want == Want::Release) {
                in_flight.extend(self.batches_in_flight().flatten());
                in_flight.sort_unstable_by(|a, b| a.location.cmp(&b.location));
            }
            due.into_iter()
                .filter_map(|(key, want)| match want {
                    Want::Add => Some((key, true)),
                    Want::Release if self.pod_released(&key, &in_flight) => Some((key, false)),
                    // Waits in `draining` until something changes.
                    Want::Release | Want::Nothing => None,
                })
                .collect()
        };
        for (key, present) in writes {
            let id = self.state.next_command_id;
            let pod = self.pods.issued(&key, id, present);
            let what = InFlight::PodFinalizer { key, uid: pod.uid.to_string(), present };
            let finalizer = pod_finalizers::FINALIZER.to_owned();
            self.issue(Command::SetFinalizer { service: pod, finalizer, present }, what, step);
        }
    }

    /// Whether what a pod carried has left NRP: each of its addresses is unmapped for its
    /// identity (or another pod's now), no batch in flight (`in_flight`, sorted by location)
    /// names the identity there, and an identity no pod carries any more has no outbound
    /// lifecycle left (its teardown ended). A pod none of whose addresses was ever read (it had
    /// no IP when it was seen) waits until its identities have no address left in NRP that no
    /// live pod backs: one of those may have been its own.
    fn pod_released(&self, key: &ObjectKey, in_flight: &[&NrpLocation]) -> bool {
        let Some(held) = self.pods.get(key) else { return true };
        let in_batch = |identity: &str, location: &str, address: &str| {
            let Ok(at) = in_flight.binary_search_by(|l| l.location.as_str().cmp(location)) else { return false };
            in_flight[at].addresses.iter().any(|a| a.address == address && a.services.iter().any(|s| s == identity))
        };
        held.left.iter().all(|(identity, location, address)| {
            !self.state.diff.awaits_drain(identity, location, address) && !in_batch(identity, location, address)
        }) && held.identities.iter().all(|id| self.egress.carries(id) || !self.outbound.lifecycles.contains_key(id))
            && (!held.left.is_empty() || held.identities.iter().all(|id| !self.state.diff.awaits_any_drain(id)))
    }

    #[allow(clippy::too_many_arguments)]
    fn pod_finalizer_outcome(
        &mut self,
        key: &ObjectKey,
        uid: &str,
        id: u64,
        present: bool,
        outcome: Outcome,
        now: u64,
        step: &mut Step,
    ) {
        let failure = match &outcome {
            Outcome::Failed(f) => Some(f),
            _ => None,
        };
        let what = format!("{} finalizer of pod {}/{}", if present { "adding the" } else { "releasing the" }, key.namespace, key.name);
        let report = self.pods.answered(key, uid, id, failure, |retries| {
            let failure = failure.expect("only a failure is retried");
            now.saturating_add(retry_delay(&format!("{}/{}", key.namespace, key.name), retries, failure, &what, step))
        });
        if let Some(failure) = report {
            let code = failure.code.as_deref().map(|c| format!(", {c}")).unwrap_or_default();
            let message = format!("{what} failed (HTTP {}{code}): {}; retrying with backoff", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message: message.clone() });
            let regarding = ObjectRef { kind: "Pod".into(), namespace: key.namespace.clone(), name: key.name.clone(), uid: Name::new(uid) };
            self.event(&regarding, EventType::Warning, pod_finalizers::reason::POD_FINALIZER_FAILED, message, step);
        }
    }
}

#[cfg(test)]
mod tests;
