//! The records of the payload as each state version lays them out, apart from the tracker's
//! parts: [`Core`], the part every version starts with (in version 1 it was the whole state), read
//! owned and written from borrowed parts ([`CoreRef`], the same fields in the same order, so the
//! same bytes); and [`NrpSyncV2`], the NRP bookkeeping of versions 1 and 2.
//!
//! The tracker's parts hold what these records hold, but not in their shape: a record is split
//! into parts on import (`format::import`) and gathered from them on export ([`CoreRef::of`]). The leaves (a lifecycle, the DiffTracker, the egress side…) are written by
//! their own serde derives; a change to one of those is a change of format, which the fixtures
//! of `tests/fixtures/state/` refuse.

use crate::difftracker::DiffTracker;
use crate::keyed::{Map, Set};
use crate::lifecycle::WorkSets;
use crate::model::*;
use crate::name::{Name, VecSet};
use serde::{Deserialize, Serialize};

use super::super::cache::*;
use super::super::nrp::*;
use super::super::outbox::*;
use super::super::service::*;
use super::super::state::*;

/// The part every state version starts with, as read: `N` is the NRP bookkeeping of the version
/// ([`NrpSyncV2`] for versions 1 and 2, [`NrpSync`] after).
#[derive(Deserialize)]
pub(super) struct Core<N> {
    pub(super) next_command_id: u64,
    pub(super) services: Map<ObjectKey, ServiceRecord>,
    pub(super) service_by_identity: Map<String, ObjectKey>,
    pub(super) slices: Map<ObjectKey, SliceRecord>,
    pub(super) slices_by_owner: Map<Name, VecSet<ObjectKey>>,
    pub(super) slices_by_node: Map<Name, VecSet<ObjectKey>>,
    pub(super) nodes: Map<String, NodeLocations>,
    pub(super) diff: DiffTracker,
    pub(super) lifecycles: Map<String, Lifecycle>,
    pub(super) in_flight: Map<u64, InFlight>,
    pub(super) service_commands_in_flight: usize,
    pub(super) work: WorkSets<String>,
    pub(super) nrp: N,
    pub(super) lists_complete: bool,
    pub(super) reconciled: bool,
}

/// [`Core`] as written: the same fields, in the same order, borrowed from the tracker's parts.
#[derive(Serialize)]
pub(super) struct CoreRef<'a, N> {
    next_command_id: u64,
    services: &'a Map<ObjectKey, ServiceRecord>,
    service_by_identity: &'a Map<String, ObjectKey>,
    slices: &'a Map<ObjectKey, SliceRecord>,
    slices_by_owner: &'a Map<Name, VecSet<ObjectKey>>,
    slices_by_node: &'a Map<Name, VecSet<ObjectKey>>,
    nodes: &'a Map<String, NodeLocations>,
    diff: &'a DiffTracker,
    lifecycles: &'a Map<String, Lifecycle>,
    in_flight: &'a Map<u64, InFlight>,
    service_commands_in_flight: usize,
    work: &'a WorkSets<String>,
    nrp: N,
    lists_complete: bool,
    reconciled: bool,
}

impl<'a> CoreRef<'a, &'a NrpSync> {
    pub(super) fn of(tracker: &'a Tracker) -> Self {
        CoreRef::with_nrp(tracker, &tracker.nrp.sync)
    }
}

impl<'a, N> CoreRef<'a, N> {
    /// The record of `tracker` with `nrp` as its NRP bookkeeping (an older version's form).
    pub(super) fn with_nrp(tracker: &'a Tracker, nrp: N) -> Self {
        let (outbox, kube) = (&tracker.outbox, &tracker.kube);
        CoreRef {
            next_command_id: outbox.next_command_id,
            services: &kube.services,
            service_by_identity: &kube.service_by_identity,
            slices: &kube.slices,
            slices_by_owner: &kube.slices_by_owner,
            slices_by_node: &kube.slices_by_node,
            nodes: &kube.nodes,
            diff: &tracker.nrp.diff,
            lifecycles: &tracker.inbound.lifecycles,
            in_flight: &outbox.in_flight,
            service_commands_in_flight: outbox.service_commands_in_flight,
            work: &tracker.inbound.work,
            nrp,
            lists_complete: kube.lists_complete,
            reconciled: tracker.startup.reconciled,
        }
    }
}

impl Core<NrpSyncV2> {
    /// Versions 1 and 2: their NRP bookkeeping upgraded ([`NrpSyncV2::upgrade`]).
    pub(super) fn upgrade(self) -> Core<NrpSync> {
        let Core {
            next_command_id,
            services,
            service_by_identity,
            slices,
            slices_by_owner,
            slices_by_node,
            nodes,
            diff,
            lifecycles,
            in_flight,
            service_commands_in_flight,
            work,
            nrp,
            lists_complete,
            reconciled,
        } = self;
        Core {
            next_command_id,
            services,
            service_by_identity,
            slices,
            slices_by_owner,
            slices_by_node,
            nodes,
            diff,
            lifecycles,
            in_flight,
            service_commands_in_flight,
            work,
            nrp: nrp.upgrade(),
            lists_complete,
            reconciled,
        }
    }
}

/// [`NrpSync`] as state versions 1 and 2 have it: at most one batch in flight, one backoff.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
pub(super) struct NrpSyncV2 {
    loaded: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
    batch_in_flight: Option<u64>,
    batch_retries: u32,
    batch_not_before_ms: u64,
    batch_limit: usize,
    quarantined: Map<String, NrpLocation>,
    service_writes_in_flight: u32,
    foreign: Set<String>,
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
            location_backoff: Map::new(),
            service_writes_in_flight: self.service_writes_in_flight,
            foreign: self.foreign,
        }
    }

    /// The form versions 1 and 2 give `sync`: at most one address-location batch in flight, not
    /// when it was issued, and no per-location backoff. A state holding more than that has no
    /// such form, and this panics (for the tests' exports of older versions).
    #[cfg(test)]
    pub(super) fn downgrade(sync: &NrpSync) -> Self {
        let n = sync.clone();
        assert!(n.batches_in_flight.len() <= 1 && n.location_backoff.is_empty(), "no version-2 form: {n:?}");
        NrpSyncV2 {
            loaded: n.loaded,
            read_in_flight: n.read_in_flight,
            read_retries: n.read_retries,
            next_read_ms: n.next_read_ms,
            batch_in_flight: n.batches_in_flight.keys().next().copied(),
            batch_retries: n.batch_retries,
            batch_not_before_ms: n.batch_not_before_ms,
            batch_limit: n.batch_limit,
            quarantined: n.quarantined,
            service_writes_in_flight: n.service_writes_in_flight,
            foreign: n.foreign,
        }
    }
}
