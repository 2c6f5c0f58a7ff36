//! The NRP side: the address-location batches (several in flight over disjoint locations once
//! one is slow, per-location backoff, halving around a refused location, throttling), the
//! periodic read of NRP and the reconciliation after each read (docs/upstream.md §c.2.4).

use super::budgets::Budgets;
use super::egress::identities::Egress;
use super::egress::outbound::Outbound;
use super::figures::Figures;
use super::outbox::*;
use super::service::*;
use crate::budget::WriteKind;
use crate::difftracker::Class;
use crate::difftracker::{DiffTracker, View};
use crate::keyed::{Map, Set};
use crate::lifecycle::{retry_delay, timing};
use crate::model::*;
use crate::name::Name;
use serde::{Deserialize, Serialize};

/// The most locations one `update-address-locations` carries.
pub const MAX_LOCATIONS_PER_BATCH: usize = 200;

/// The most address-location batches in flight at once (each over other locations).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// The NRP side: the mirror of what NRP was told and what Kubernetes wants ([`DiffTracker`]), and
/// the bookkeeping of reads and address-location batches ([`NrpSync`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Nrp {
    pub(super) diff: DiffTracker,
    pub(super) sync: NrpSync,
}

impl Nrp {
    /// The DiffTracker, for the parts that write Kubernetes' side into it (the cache's ready
    /// endpoints, the egress pods' addresses): what NRP was told stays this part's to change.
    pub(super) fn desired(&mut self) -> &mut DiffTracker {
        &mut self.diff
    }

    /// The DiffTracker, read.
    pub(super) fn diff(&self) -> &DiffTracker {
        &self.diff
    }

    /// The identity's addresses are looked at again in the next sync.
    pub(super) fn touch(&mut self, identity: &str) {
        self.diff.touch_identity(identity);
    }

    /// The mirror lists the identity as registered.
    pub(super) fn is_registered(&self, identity: &str) -> bool {
        self.diff.is_registered(identity)
    }

    /// The registered identities, as the mirror has them.
    pub(super) fn registered(&self) -> &Set<Name> {
        self.diff.registered()
    }

    /// A registration (or unregistration) NRP accepted.
    pub(super) fn set_registered(&mut self, identity: &str, registered: bool) {
        self.diff.set_registered(identity, registered);
    }

    /// Some NRP address maps to the identity (as the mirror has it).
    pub(super) fn references(&self, identity: &str) -> bool {
        self.diff.nrp_references(identity)
    }

    /// The identity was another controller's in the last read.
    pub(super) fn is_foreign(&self, identity: &str) -> bool {
        self.sync.foreign.contains(identity)
    }

    /// NRP still maps `address` at `location` to the identity, or is still to be told it no
    /// longer does.
    pub(super) fn awaits_drain(&self, identity: &str, location: &str, address: &str) -> bool {
        self.diff.awaits_drain(identity, location, address)
    }

    /// How many locations and addresses NRP holds (as the mirror has it).
    pub(super) fn totals(&self) -> (usize, usize) {
        self.diff.nrp_totals()
    }

    /// Some address of the identity still awaits its drain ([`Self::awaits_drain`]).
    pub(super) fn awaits_any_drain(&self, identity: &str) -> bool {
        self.diff.awaits_any_drain(identity)
    }

    /// NRP has been read at least once.
    pub(super) fn loaded(&self) -> bool {
        self.sync.loaded
    }

    /// A Service command that writes NRP went out: no read of NRP until it is answered.
    pub(super) fn write_issued(&mut self) {
        self.sync.service_writes_in_flight += 1;
    }

    /// NRP is read back as soon as nothing holds the read (its answer corrects the mirror).
    pub(super) fn read_now(&mut self, now: u64) {
        self.sync.next_read_ms = now;
    }

    /// A new tracker's NRP part: nothing read, nothing mirrored, batches of the full size.
    pub(super) fn new() -> Self {
        let mut nrp = Self::default();
        nrp.sync.batch_limit = MAX_LOCATIONS_PER_BATCH;
        nrp
    }

    /// The mirror: what NRP has accepted, location → address → services.
    pub(super) fn view(&self) -> View {
        self.diff.nrp_view()
    }

    /// What NRP should hold once quiet: the ready-filtered Kubernetes side.
    pub(super) fn desired_view(&self, ready: &Readiness<'_>) -> View {
        self.diff.desired_view(|id| self.class(ready, id))
    }

    /// Some location differs between what Kubernetes wants and what NRP was told.
    pub(super) fn has_dirty(&self) -> bool {
        self.diff.has_dirty()
    }

    /// A Service command that wrote NRP was answered.
    pub(super) fn write_answered(&mut self) {
        self.sync.service_writes_in_flight -= 1;
    }

    /// Issues the read of NRP when it is due and nothing holds it: no read, no batch and no
    /// Service write that writes NRP in flight (a read would race them). Returns whether NRP
    /// writes wait (a read is due or in flight: its answer may change what they would write).
    pub(super) fn read_if_due(&mut self, now: u64, outbox: &mut Outbox, step: &mut Step) -> bool {
        let nrp = &mut self.sync;
        // A read scheduled past the end of time (its deadline saturated at `u64::MAX`) never
        // comes: at `now = u64::MAX` it would be due again after every read, a read per answer.
        let scheduled = nrp.next_read_ms < u64::MAX;
        let read_due = !nrp.loaded || (scheduled && now >= nrp.next_read_ms);
        if read_due
            && !nrp.read_in_flight
            && nrp.batches_in_flight.is_empty()
            && nrp.service_writes_in_flight == 0
            && now >= nrp.next_read_ms
        {
            nrp.read_in_flight = true;
            outbox.issue(Command::ReadNrp, InFlight::ReadNrp, step);
        }
        read_due || nrp.read_in_flight
    }

    /// Brings every deadline of this part in to `latest` (`Tracker::bring_in_deadlines`).
    pub(super) fn bring_in(&mut self, latest: u64) {
        let nrp = &mut self.sync;
        nrp.next_read_ms = nrp.next_read_ms.min(latest);
        nrp.batch_not_before_ms = nrp.batch_not_before_ms.min(latest);
        for backoff in nrp.location_backoff.values_mut() {
            backoff.not_before_ms = backoff.not_before_ms.min(latest);
        }
    }

    /// When this part next has something to do, told to `consider`: the next read, unless one
    /// is out; and with a location dirty and room for a batch, when a batch may go (its throttle
    /// over, a token, the youngest batch in flight slow, a location's backoff over).
    pub(super) fn next_wake(&self, now: u64, budgets: &Budgets, mut consider: impl FnMut(u64)) {
        let nrp = &self.sync;
        if !nrp.read_in_flight {
            consider(nrp.next_read_ms.max(now));
        }
        if self.diff.has_dirty() && nrp.batches_in_flight.len() < MAX_BATCHES_IN_FLIGHT {
            if nrp.batch_not_before_ms > now {
                consider(nrp.batch_not_before_ms);
            } else if let Some(at) = budgets.token_due(WriteKind::AddressLocations, now) {
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
    }

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

/// What the other parts say of an identity, for a sync: the inbound lifecycles, the egress
/// pods and identities, and the outbound lifecycles ([`classify`]).
pub(super) struct Readiness<'a> {
    pub(super) lifecycles: &'a Map<String, Lifecycle>,
    pub(super) egress: &'a Egress,
    pub(super) outbound: &'a Outbound,
}

impl Nrp {
    /// How an identity takes part in an address-location sync.
    pub(super) fn class(&self, ready: &Readiness<'_>, identity: &str) -> Class {
        classify(ready.lifecycles, &self.sync.foreign, ready.egress, ready.outbound, &self.diff, identity)
    }

    // ---- Address locations ----

    pub(super) fn sync_locations(
        &mut self,
        now: u64,
        ready: &Readiness<'_>,
        outbox: &mut Outbox,
        budgets: &mut Budgets,
        step: &mut Step,
    ) {
        let nrp = &self.sync;
        // Another batch beside those in flight only once they are all slow: a batch answered at
        // NRP's usual pace lets the changes behind it coalesce.
        let all_slow = nrp.batches_in_flight.values().all(|&at| now.saturating_sub(at) >= timing::SLOW_BATCH_MS);
        if nrp.batches_in_flight.len() >= MAX_BATCHES_IN_FLIGHT
            || !all_slow
            || now < nrp.batch_not_before_ms
            || !self.diff.has_dirty()
            || budgets.token_due(WriteKind::AddressLocations, now).is_some()
        {
            return;
        }
        let (diff, lifecycles, nrp, in_flight) = (&mut self.diff, ready.lifecycles, &mut self.sync, outbox.in_flight());
        let busy: Set<&str> =
            location_batches(&nrp.batches_in_flight, in_flight).flatten().map(|l| l.location.as_str()).collect();
        // A backoff is kept while its location may fail again: until it is next accepted, or
        // once over, if the location is neither dirty nor in flight (it came back in sync).
        nrp.location_backoff
            .retain(|location, b| b.not_before_ms > now || busy.contains(location.as_str()) || diff.is_dirty(location));
        // A location in flight or backing off stays dirty for a later batch.
        let backoff = &nrp.location_backoff;
        let waits =
            |location: &str| busy.contains(location) || backoff.get(location).is_some_and(|b| b.not_before_ms > now);
        let (limit, foreign, egress, outbound) = (nrp.batch_limit.max(1), &nrp.foreign, ready.egress, ready.outbound);
        let mut batch =
            diff.take_sync(limit, waits, |diff, id| classify(lifecycles, foreign, egress, outbound, diff, id));
        // A location NRP refused on its own waits until its update changes.
        let quarantined = &mut self.sync.quarantined;
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
        let taken = budgets.take_token(WriteKind::AddressLocations, now);
        // Checked in tests and under the fuzz crate's `invariants` feature (its stable replay
        // of fuzz/regressions/ builds without debug assertions), never in a shipped guest.
        #[cfg(any(test, feature = "invariants"))]
        assert!(taken, "a batch issued without a token: checked by token_due above");
        let _ = taken;
        let id = outbox.issue(Command::UpdateAddressLocations(batch.clone()), InFlight::Locations(batch), step);
        self.sync.batches_in_flight.insert(id, now);
    }

    /// The answer to an address-location batch (the egress side rechecks its pods' finalizers
    /// first: what they waited for may have left NRP).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn locations_outcome(
        &mut self,
        id: u64,
        batch: Vec<NrpLocation>,
        outcome: Outcome,
        now: u64,
        budgets: &mut Budgets,
        figures: &mut Figures,
        step: &mut Step,
    ) {
        self.sync.batches_in_flight.remove(&id);
        budgets.answered(WriteKind::AddressLocations, &outcome, now, step);
        match outcome {
            Outcome::Failed(failure) => {
                for location in &batch {
                    self.diff.mark_uncertain(location);
                }
                let nrp = &mut self.sync;
                if matches!(failure.status, 400 | 422) {
                    // NRP refuses the batch: halve it until the refused location stands alone,
                    // then set that one aside so it cannot block everyone else's addresses.
                    if batch.len() > 1 {
                        nrp.batch_limit = (batch.len() / 2).max(1);
                    } else if let Some(refused) = batch.into_iter().next() {
                        nrp.quarantined.insert(refused.location.clone(), refused);
                        figures.location_refused();
                        nrp.batch_limit = MAX_LOCATIONS_PER_BATCH;
                    }
                    return;
                }
                let what = "update-address-locations";
                if failure.status == 429 {
                    // Throttled: the subscription's budget, so every batch waits, for its
                    // `Retry-After` (capped) if it has one; the shrunk, emptied write budget
                    // paces the batches after it (`Budgets::answered`), instead of a backoff.
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
                self.diff.apply(&batch);
                let nrp = &mut self.sync;
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

    /// The answer to a read of NRP: the mirror replaced by what NRP holds, and the next read
    /// scheduled. Returns what was read, which the egress side and start-up reconciliation use
    /// next; `None` when the read failed.
    pub(super) fn read_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) -> Option<NrpState> {
        self.sync.read_in_flight = false;
        let snapshot = match outcome {
            Outcome::NrpSnapshot(snapshot) => snapshot,
            Outcome::Failed(failure) => {
                let nrp = &mut self.sync;
                nrp.read_retries = nrp.read_retries.saturating_add(1);
                let delay = retry_delay("read-nrp", nrp.read_retries, &failure, "read-nrp", step);
                nrp.next_read_ms = now.saturating_add(delay);
                return None;
            }
            // Any other answer is a host bug; read again after the shortest backoff.
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::ArmInventory(_) => {
                self.sync.next_read_ms = now.saturating_add(timing::BACKOFF_BASE_MS);
                return None;
            }
        };
        let mut inbound = Set::new();
        let mut foreign = Set::new();
        for service in &snapshot.services {
            let name = service.name.to_ascii_lowercase();
            if service.service_type.eq_ignore_ascii_case("Inbound") && !service.is_default {
                inbound.insert(name);
            } else {
                foreign.insert(name);
            }
        }
        self.diff.replace_nrp(inbound, &snapshot.locations);
        let nrp = &mut self.sync;
        nrp.foreign = foreign;
        nrp.loaded = true;
        nrp.read_retries = 0;
        // Saturating, like every deadline: near the end of u64 time a wrapped deadline would
        // keep a read always due, and a due read holds every NRP write.
        nrp.next_read_ms = now.saturating_add(timing::RESYNC_INTERVAL_MS);
        nrp.quarantined.clear();
        Some(snapshot)
    }
}
