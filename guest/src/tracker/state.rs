//! The tracker as a whole: [`Tracker`], its configuration and clock beside its parts, each of
//! which owns its data (the outbox, the Kubernetes cache, the inbound part, the NRP part, the
//! egress side, the write budgets, start-up, the figures); and what two trackers being equal
//! means. Only the coordinator (`tracker/mod.rs`) and the state format (`format`) name it: the
//! parts write through the handles they are given.

use super::budgets::Budgets;
use super::cache::KubeCache;
use super::egress::EgressSide;
use super::figures::Figures;
use super::inbound::Inbound;
use super::nrp::Nrp;
use super::outbox::Outbox;
use super::startup::Startup;
use crate::config::{Config, Mode};
use crate::model::Clock;

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
