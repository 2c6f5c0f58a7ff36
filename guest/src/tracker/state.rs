//! The tracker's state, and its format: [`Tracker`] and what it holds ([`State`], the NRP and ARM
//! bookkeeping, the commands in flight), what `export_state` writes ([`STATE_VERSION`]), how
//! each older version reads, and what an import checks before it trusts a payload
//! ([`State::check`]). How an identity takes part in an address-location sync ([`classify`]) is
//! here too: the state's own view of which identities are ready.

use super::budgets::Budgets;
use super::cache::*;
use super::figures::Figures;
use super::outbox::*;
use super::service::*;
use crate::config::{Config, Mode};
use crate::difftracker::{Class, DiffTracker};
use crate::egress::Egress;
use crate::keyed::{Map, Set};
use crate::lifecycle::WorkSets;
use crate::model::*;
use crate::outbound::Outbound;
use crate::pod_finalizers::PodFinalizers;
use serde::{Deserialize, Serialize};

/// The most locations one `update-address-locations` carries.
pub const MAX_LOCATIONS_PER_BATCH: usize = 200;
/// The most Service commands (Azure or Kubernetes) in flight at once.
pub const MAX_SERVICE_COMMANDS_IN_FLIGHT: usize = 16;
/// The most address-location batches in flight at once (each over other locations).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// The tracker: its configuration, its clock, and its parts, each owning its own data. The
/// state format (`format`) is apart from this layout: it reads and writes these parts in the
/// order and shapes each state version fixed.
#[derive(Clone, Debug)]
pub struct Tracker {
    pub(super) config: Config,
    pub(super) mode: Mode,
    /// Time as the tracker counts it: the host's `now`, monotonic (see [`Clock`]). Every
    /// deadline in the state is in this clock's time. Not state: neither exported nor compared.
    pub(super) clock: Clock,
    /// The commands in flight and the next id: what every part sends goes out through it.
    pub(super) outbox: Outbox,
    /// The Kubernetes side: Services, EndpointSlices, Nodes, and whether the lists are complete.
    pub(super) kube: KubeCache,
    /// Inbound Services' lifecycles and their work sets.
    pub(super) inbound: Inbound,
    /// The NRP mirror (the DiffTracker) and the bookkeeping of reads and address batches.
    pub(super) nrp: Nrp,
    /// Egress pods and identities, their outbound lifecycles, and the pods' finalizers.
    pub(super) egress: EgressSide,
    /// The write budgets: the fixed buckets and the pace ARM's figures set.
    pub(super) budgets: Budgets,
    /// Start-up: the one read of ARM's inventory, and whether start-up reconciliation ran.
    pub(super) startup: Startup,
    /// The counters of `tracker.stats` and when each pending operation began (state version 9).
    pub(super) figures: Figures,
}

/// Two trackers are equal when their configuration and state are: the clock is not state.
impl PartialEq for Tracker {
    fn eq(&self, other: &Self) -> bool {
        (&self.config, self.mode, &self.outbox, &self.kube, &self.inbound, &self.nrp)
            == (&other.config, other.mode, &other.outbox, &other.kube, &other.inbound, &other.nrp)
            && (&self.egress, &self.budgets, &self.startup, &self.figures)
                == (&other.egress, &other.budgets, &other.startup, &other.figures)
    }
}

impl Eq for Tracker {}

/// Inbound Services: a lifecycle per identity, and the sets the lifecycle driver looks at for
/// work (and the lifecycle driver's kind for them, `inbound`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Inbound {
    pub(super) lifecycles: Map<String, Lifecycle>,
    pub(super) work: WorkSets<String>,
}

impl Inbound {
    /// Whether a Service's endpoints belong in the Kubernetes side of the DiffTracker.
    pub(super) fn programmable(&self, identity: &str) -> bool {
        self.lifecycles.get(identity).is_some_and(|l| !l.phase.is_deleting())
    }
}

/// The NRP side: the mirror of what NRP was told and what Kubernetes wants ([`DiffTracker`]), and
/// the bookkeeping of reads and address-location batches ([`NrpSync`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Nrp {
    pub(super) diff: DiffTracker,
    pub(super) sync: NrpSync,
}

impl Nrp {
    /// No NRP address maps to the identity, nor may one in a batch whose answer is not in
    /// (`in_flight`: the outbox's commands).
    pub(super) fn drained(&self, in_flight: &Map<u64, InFlight>, identity: &str) -> bool {
        let mentions = |l: &NrpLocation| l.addresses.iter().any(|a| a.services.iter().any(|s| s == identity));
        !self.diff.nrp_references(identity) && !self.batches_in_flight(in_flight).flatten().any(mentions)
    }

    /// The address-location batches in flight (`in_flight`: the outbox's commands).
    pub(super) fn batches_in_flight<'a>(
        &'a self,
        in_flight: &'a Map<u64, InFlight>,
    ) -> impl Iterator<Item = &'a [NrpLocation]> {
        location_batches(&self.sync.batches_in_flight, in_flight)
    }
}

/// The egress side: pods and the identities they carry ([`Egress`]), the outbound lifecycle of
/// each identity of ours ([`Outbound`]), and the finalizers held on egress pods
/// ([`PodFinalizers`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct EgressSide {
    pub(super) identities: Egress,
    pub(super) outbound: Outbound,
    pub(super) finalizers: PodFinalizers,
}

/// What the egress side writes through, and what it reads of the rest of the tracker: the NRP
/// part (the mirror of what the identities' pods hold), the outbox (Events, finalizer writes),
/// the Kubernetes cache (the cluster's families; the Services' identities) and the inbound part
/// (an identity that is a Service's is never an egress identity).
pub(super) struct EgressOut<'a> {
    pub(super) nrp: &'a mut Nrp,
    pub(super) outbox: &'a mut Outbox,
    pub(super) kube: &'a KubeCache,
    pub(super) inbound: &'a Inbound,
    /// Start-up reconciliation has run and the tracker provisions (CLB mode): only then does
    /// the egress side decide an identity's outbound lifecycle.
    pub(super) enabled: bool,
}

impl EgressOut<'_> {
    /// Whether an identity is an inbound Service's (a lifecycle, or a Service observed): one key
    /// space with egress identities (docs/upstream.md §i.2.7).
    pub(super) fn is_inbound(&self, identity: &str) -> bool {
        self.inbound.lifecycles.contains_key(identity) || self.kube.service_by_identity.contains_key(identity)
    }
}

/// Start-up: the inventory of ARM, read once ([`ArmSync`]), and whether start-up reconciliation
/// against NRP has run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Startup {
    pub(super) arm: ArmSync,
    pub(super) reconciled: bool,
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
