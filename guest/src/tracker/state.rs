//! The tracker's state, and its format: [`Tracker`] and what it holds ([`State`], the NRP and ARM
//! bookkeeping, the commands in flight), what `export_state` writes ([`STATE_VERSION`]), how
//! each older version reads, and what an import checks before it trusts a payload
//! ([`State::check`]). How an identity takes part in an address-location sync ([`classify`]) is
//! here too: the state's own view of which identities are ready.

use super::cache::*;
use super::figures::Figures;
use super::service::*;
use crate::budget::{ArmPace, Buckets};
use crate::config::{Config, ConfigError, Mode};
use crate::difftracker::{Class, DiffTracker};
use crate::egress::Egress;
use crate::keyed::{Map, Set};
use crate::lifecycle::{Op, WorkSets};
use crate::model::*;
use crate::name::{Name, VecSet};
use crate::outbound::{OutStep, Outbound};
use crate::pod_finalizers::PodFinalizers;
use serde::{Deserialize, Serialize};

/// The most locations one `update-address-locations` carries.
pub const MAX_LOCATIONS_PER_BATCH: usize = 200;
/// The most Service commands (Azure or Kubernetes) in flight at once.
pub const MAX_SERVICE_COMMANDS_IN_FLIGHT: usize = 16;
/// The most address-location batches in flight at once (each over other locations).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum InFlight {
    Service {
        identity: String,
        step: OpStep,
    },
    Locations(Vec<NrpLocation>),
    ReadNrp,
    Event,
    ReadArm,
    /// A command of an egress identity's outbound lifecycle (state version 6).
    Outbound {
        identity: String,
        step: OutStep,
    },
    /// The finalizer of an egress pod (state version 7): added (`present`) or released.
    PodFinalizer {
        key: ObjectKey,
        uid: String,
        present: bool,
    },
}

impl InFlight {
    /// Whether ARM counts it as a write (NRP's calls are POST actions through ARM).
    pub(super) fn writes_arm(&self) -> bool {
        match self {
            InFlight::Service { step, .. } => step.write_kind().is_some(),
            InFlight::Outbound { step, .. } => step.write_kind().is_some(),
            InFlight::Locations(_) => true,
            InFlight::ReadNrp | InFlight::Event | InFlight::ReadArm | InFlight::PodFinalizer { .. } => false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Tracker {
    pub(super) config: Config,
    pub(super) mode: Mode,
    pub(super) state: State,
    /// Egress pods and identities (state version 2), beside the version-1 [`State`].
    pub(super) egress: Egress,
    /// The start-up inventory of ARM (state version 4).
    pub(super) arm: ArmSync,
    /// The write budgets' buckets (state version 5); their shapes are the config's.
    pub(super) budget: Buckets,
    /// The outbound lifecycles of egress identities (state version 6).
    pub(super) outbound: Outbound,
    /// The egress pod finalizers (state version 7).
    pub(super) pods: PodFinalizers,
    /// The pace ARM's remaining-writes figures set (state version 8); `None` before the first.
    pub(super) pace: Option<ArmPace>,
    /// Time as the tracker counts it: the host's `now`, monotonic (see [`Clock`]). Every
    /// deadline in the state is in this clock's time. Not state: neither exported nor compared.
    pub(super) clock: Clock,
    /// The counters of `tracker.stats` and when each pending operation began (state version 9).
    pub(super) figures: Figures,
}

/// Two trackers are equal when their configuration and state are: the clock is not state.
impl PartialEq for Tracker {
    fn eq(&self, other: &Self) -> bool {
        (&self.config, self.mode, self.parts_with(&self.state))
            == (&other.config, other.mode, other.parts_with(&other.state))
    }
}

/// The parts of the state, in the order the current version writes them.
pub(super) type Parts<'a> = (
    &'a State,
    &'a Egress,
    &'a ArmSync,
    &'a Buckets,
    &'a Outbound,
    &'a PodFinalizers,
    &'a Option<ArmPace>,
    &'a Figures,
);

impl Tracker {
    /// The parts of this tracker's state, with `state` as its version-1 part.
    pub(super) fn parts_with<'a>(&'a self, state: &'a State) -> Parts<'a> {
        (state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods, &self.pace, &self.figures)
    }
}

impl Eq for Tracker {}

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
/// pod held (the host's next list or a pod's next update reads each pod's finalizer). Version 8
/// adds the pace set by ARM's remaining-writes figures ([`ArmPace`]) after the version-7
/// payload; an older state imports with none (the fixed budgets pace until ARM's next answer).
/// Version 9 adds the figures of `tracker.stats` ([`Figures`]) after the version-8 payload; an
/// older state imports with none (counters at zero, pending operations aged from the next call).
pub const STATE_VERSION: u32 = 9;

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
pub(super) struct NrpSyncV2 {
    pub(super) loaded: bool,
    pub(super) read_in_flight: bool,
    pub(super) read_retries: u32,
    pub(super) next_read_ms: u64,
    pub(super) batch_in_flight: Option<u64>,
    pub(super) batch_retries: u32,
    pub(super) batch_not_before_ms: u64,
    pub(super) batch_limit: usize,
    pub(super) quarantined: Map<String, NrpLocation>,
    pub(super) service_writes_in_flight: u32,
    pub(super) foreign: Set<String>,
}

impl NrpSyncV2 {
    /// The batch in flight keeps its place (issued at time 0: slow, so another may go beside
    /// it); its one backoff, which held every location, still does (as a throttle).
    pub(super) fn upgrade(self) -> NrpSync {
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
            location_backoff: Map::new(),
            service_writes_in_flight: self.service_writes_in_flight,
            foreign: self.foreign,
        }
    }
}

/// `N`: the NRP bookkeeping of the state version read ([`NrpSyncV2`] for versions 1 and 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct State<N = NrpSync> {
    pub(super) next_command_id: u64,
    pub(super) services: Map<ObjectKey, ServiceRecord>,
    pub(super) service_by_identity: Map<String, ObjectKey>,
    pub(super) slices: Map<ObjectKey, SliceRecord>,
    pub(super) slices_by_owner: Map<Name, VecSet<ObjectKey>>,
    pub(super) slices_by_node: Map<Name, VecSet<ObjectKey>>,
    /// Node name → its locations per family (computed once per Node change, not per endpoint).
    pub(super) nodes: Map<String, NodeLocations>,
    pub(super) diff: DiffTracker,
    pub(super) lifecycles: Map<String, Lifecycle>,
    pub(super) in_flight: Map<u64, InFlight>,
    pub(super) service_commands_in_flight: usize,
    pub(super) work: WorkSets<String>,
    pub(super) nrp: N,
    pub(super) lists_complete: bool,
    /// Start-up reconciliation against NRP has run.
    pub(super) reconciled: bool,
}

/// The largest next command id an imported state may hold (see [`State::check`]).
pub(super) const MAX_NEXT_COMMAND_ID: u64 = 1 << 63;

/// The next postcard value of `rest`, which moves past it.
pub(super) fn take<T: serde::de::DeserializeOwned>(rest: &mut &[u8]) -> Result<T, String> {
    let (value, after) = postcard::take_from_bytes::<T>(rest).map_err(|e| e.to_string())?;
    *rest = after;
    Ok(value)
}

impl State<NrpSyncV2> {
    pub(super) fn upgrade(self) -> State {
        self.map_nrp(NrpSyncV2::upgrade)
    }
}

impl<N> State<N> {
    pub(super) fn map_nrp<M>(self, f: impl FnOnce(N) -> M) -> State<M> {
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
    /// space with egress identities (docs/upstream.md §i.2.7).
    pub(super) fn is_inbound(&self, identity: &str) -> bool {
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
    pub(super) fn check(&self, arm: &ArmSync, outbound: &Outbound, pods: &PodFinalizers) -> Result<(), String> {
        // One id per command, counting up: no real state comes near the end of u64, and
        // refusing the upper half keeps `issue` from ever overflowing.
        if self.next_command_id > MAX_NEXT_COMMAND_ID {
            return Err(format!("the next command id {} is past {MAX_NEXT_COMMAND_ID}", self.next_command_id));
        }
        let (mut service_commands, mut nrp_writes, mut reads, mut arm_reads, mut batches) =
            (0usize, 0u32, 0usize, 0usize, Vec::new());
        let mut pod_commands = Map::new();
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
        let mut locations = Set::new();
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

/// NRP-facing bookkeeping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct NrpSync {
    /// NRP has been read at least once.
    pub(super) loaded: bool,
    pub(super) read_in_flight: bool,
    pub(super) read_retries: u32,
    pub(super) next_read_ms: u64,
    /// Address-location batches in flight: command id → when it was issued.
    pub(super) batches_in_flight: Map<u64, u64>,
    /// Throttled batches in a row (429), and until when every batch waits.
    pub(super) batch_retries: u32,
    pub(super) batch_not_before_ms: u64,
    /// Halved after a 400 to isolate the location NRP refuses.
    pub(super) batch_limit: usize,
    /// Locations NRP refused on their own, with the update refused; skipped until it changes.
    pub(super) quarantined: Map<String, NrpLocation>,
    /// Locations whose batch failed (not refused, not throttled): failures in a row and until
    /// when they wait; the others' batches go on. Forgotten when the location is next accepted.
    pub(super) location_backoff: Map<String, Backoff>,
    pub(super) service_writes_in_flight: u32,
    /// Non-inbound services of the last read: other controllers' identities, left alone.
    pub(super) foreign: Set<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Backoff {
    pub(super) retries: u32,
    pub(super) not_before_ms: u64,
}

/// Orphan clean-up touches only names shaped like Kubernetes UIDs, as upstream does.
pub(super) fn looks_like_uid(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() == 5
        && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(len, part)| part.len() == *len)
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// How an identity found in either view takes part in an address-location sync: ours when
/// registered and live, drained when ours but not, left alone when another controller's.
pub(super) fn classify(
    lifecycles: &Map<String, Lifecycle>,
    foreign: &Set<String>,
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
pub(super) fn classify_not_inbound(
    foreign: &Set<String>,
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
pub(super) fn location_batches<'a>(
    ids: &'a Map<u64, u64>,
    in_flight: &'a Map<u64, InFlight>,
) -> impl Iterator<Item = &'a [NrpLocation]> {
    ids.keys().filter_map(|id| match in_flight.get(id) {
        Some(InFlight::Locations(batch)) => Some(batch.as_slice()),
        _ => None,
    })
}

/// The start-up inventory of ARM (state version 4): the resource group's public IPs and load
/// balancers, read once so that what already holds what a Service wants is
/// adopted instead of written again, and so that load balancers and public IPs of Services
/// deleted while no controller ran are found. It is read once the lists are complete and NRP is
/// read, and used the moment it arrives (start-up reconciliation waits for it), so the state
/// never holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ArmSync {
    /// Start-up reconciliation may run: the inventory was used, or reading it was given up.
    pub(super) settled: bool,
    pub(super) read_in_flight: bool,
    pub(super) read_retries: u32,
    pub(super) next_read_ms: u64,
}

impl ArmSync {
    /// A state from before version 4: nothing to read, nothing to adopt.
    pub(super) fn settled() -> Self {
        Self { settled: true, ..Self::default() }
    }
}

/// Whether a listed load balancer holds what `wanted` says: rules compared as a set (ARM may
/// list them in another order; rule names are unique on a load balancer). A few rules each: a
/// scan, not a sort, which would cost the component a sort's code.
pub(super) fn same_load_balancer(listed: &LoadBalancer, wanted: &LoadBalancer) -> bool {
    (&listed.name, &listed.public_ip, &listed.backend_pool) == (&wanted.name, &wanted.public_ip, &wanted.backend_pool)
        && listed.rules.len() == wanted.rules.len()
        && wanted.rules.iter().all(|rule| listed.rules.contains(rule))
}
