//! The NRP side: the address-location batches (several in flight over disjoint locations once
//! one is slow, per-location backoff, halving around a refused location, throttling), the
//! periodic read of NRP and the reconciliation after each read (docs/upstream.md §c.2.4).

use super::driver::Kind;
use super::outbox::*;
use super::service::*;
use super::state::*;
use crate::admission::Verdict;
use crate::budget::WriteKind;
use crate::difftracker::Class;
use crate::keyed::Set;
use crate::lifecycle::{retry_delay, timing};
use crate::model::*;
use crate::name::Name;

impl Tracker {
    // ---- Readiness ----

    pub(super) fn class(&self, identity: &str) -> Class {
        classify(
            &self.inbound.lifecycles,
            &self.nrp.sync.foreign,
            &self.egress.identities,
            &self.egress.outbound,
            &self.nrp.diff,
            identity,
        )
    }

    // ---- Address locations ----

    pub(super) fn sync_locations(&mut self, now: u64, step: &mut Step) {
        let nrp = &self.nrp.sync;
        // Another batch beside those in flight only once they are all slow: a batch answered at
        // NRP's usual pace lets the changes behind it coalesce.
        let all_slow = nrp.batches_in_flight.values().all(|&at| now.saturating_sub(at) >= timing::SLOW_BATCH_MS);
        if nrp.batches_in_flight.len() >= MAX_BATCHES_IN_FLIGHT
            || !all_slow
            || now < nrp.batch_not_before_ms
            || !self.nrp.diff.has_dirty()
            || self.budgets.token_due(WriteKind::AddressLocations, now).is_some()
        {
            return;
        }
        let (diff, lifecycles, nrp, in_flight) =
            (&mut self.nrp.diff, &self.inbound.lifecycles, &mut self.nrp.sync, &self.outbox.in_flight);
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
        let (limit, foreign, egress, outbound) =
            (nrp.batch_limit.max(1), &nrp.foreign, &self.egress.identities, &self.egress.outbound);
        let mut batch =
            diff.take_sync(limit, waits, |diff, id| classify(lifecycles, foreign, egress, outbound, diff, id));
        // A location NRP refused on its own waits until its update changes.
        let quarantined = &mut self.nrp.sync.quarantined;
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
        let taken = self.budgets.take_token(WriteKind::AddressLocations, now);
        // Checked in tests and under the fuzz crate's `invariants` feature (its stable replay
        // of fuzz/regressions/ builds without debug assertions), never in a shipped guest.
        #[cfg(any(test, feature = "invariants"))]
        assert!(taken, "a batch issued without a token: checked by token_due above");
        let _ = taken;
        let id = self.outbox.issue(Command::UpdateAddressLocations(batch.clone()), InFlight::Locations(batch), step);
        self.nrp.sync.batches_in_flight.insert(id, now);
    }

    pub(super) fn locations_outcome(
        &mut self,
        id: u64,
        batch: Vec<NrpLocation>,
        outcome: Outcome,
        now: u64,
        step: &mut Step,
    ) {
        self.nrp.sync.batches_in_flight.remove(&id);
        self.egress.finalizers.recheck();
        self.budgets.answered(WriteKind::AddressLocations, &outcome, now, step);
        match outcome {
            Outcome::Failed(failure) => {
                for location in &batch {
                    self.nrp.diff.mark_uncertain(location);
                }
                let nrp = &mut self.nrp.sync;
                if matches!(failure.status, 400 | 422) {
                    // NRP refuses the batch: halve it until the refused location stands alone,
                    // then set that one aside so it cannot block everyone else's addresses.
                    if batch.len() > 1 {
                        nrp.batch_limit = (batch.len() / 2).max(1);
                    } else if let Some(refused) = batch.into_iter().next() {
                        nrp.quarantined.insert(refused.location.clone(), refused);
                        self.figures.location_refused();
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
                self.nrp.diff.apply(&batch);
                let nrp = &mut self.nrp.sync;
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

    pub(super) fn read_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) {
        self.nrp.sync.read_in_flight = false;
        let snapshot = match outcome {
            Outcome::NrpSnapshot(snapshot) => snapshot,
            Outcome::Failed(failure) => {
                let nrp = &mut self.nrp.sync;
                nrp.read_retries = nrp.read_retries.saturating_add(1);
                let delay = retry_delay("read-nrp", nrp.read_retries, &failure, "read-nrp", step);
                nrp.next_read_ms = now.saturating_add(delay);
                return;
            }
            // Any other answer is a host bug; read again after the shortest backoff.
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::ArmInventory(_) => {
                self.nrp.sync.next_read_ms = now.saturating_add(timing::BACKOFF_BASE_MS);
                return;
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
        self.nrp.diff.replace_nrp(inbound, &snapshot.locations);
        self.egress.identities.nrp_read(&snapshot.services, &self.nrp.diff);
        self.egress.finalizers.recheck();
        let nrp = &mut self.nrp.sync;
        nrp.foreign = foreign;
        nrp.loaded = true;
        nrp.read_retries = 0;
        // Saturating, like every deadline: near the end of u64 time a wrapped deadline would
        // keep a read always due, and a due read holds every NRP write.
        nrp.next_read_ms = now.saturating_add(timing::RESYNC_INTERVAL_MS);
        nrp.quarantined.clear();
        if self.startup.reconciled {
            self.reconcile_with_nrp(step);
        } else {
            self.maybe_reconcile(step);
        }
    }

    pub(super) fn maybe_reconcile(&mut self, step: &mut Step) {
        if !self.startup.reconciled && self.kube.lists_complete && self.nrp.sync.loaded && self.startup.arm.settled {
            self.startup.reconciled = true;
            self.reconcile_with_nrp(step);
        }
    }

    /// After a read of NRP: re-register what NRP lost, adopt or clean up what it has that
    /// Kubernetes does not explain (docs/upstream.md §c.2.4).
    pub(super) fn reconcile_with_nrp(&mut self, step: &mut Step) {
        let (egress, mut out) = self.egress_side();
        egress.reconcile_outbound(&mut out);
        let registered: Vec<String> = self.nrp.diff.registered().iter().map(Name::to_string).collect();
        for (identity, lifecycle) in self.inbound.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.nrp.diff.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.op_config = lifecycle.desired.clone();
                lifecycle.steps = OpStep::ENSURE.into();
                self.inbound.work.runnable.insert(identity.clone());
            }
        }
        self.inbound.drain_again_where_referenced(&mut self.nrp);
        for identity in registered {
            if self.inbound.lifecycles.contains_key(&identity) || !looks_like_uid(&identity) {
                continue;
            }
            let record =
                self.kube.service_by_identity.get(&identity).and_then(|key| self.kube.services.get(key)).cloned();
            match record {
                // A live Service that is no longer admitted keeps serving (docs/design.md §3).
                Some(r) if !matches!(r.verdict, Verdict::Cleanup | Verdict::Ignored(_)) => {
                    let lifecycle =
                        Lifecycle::new(object_ref(&r.observed), Phase::Created, ObjectState::of(&r.observed), None);
                    self.inbound.lifecycles.insert(identity.clone(), lifecycle);
                    self.kube.seed(&identity, &mut self.nrp.diff);
                    self.nrp.diff.touch_identity(&identity);
                }
                Some(r) => {
                    let (service, object) = (object_ref(&r.observed), ObjectState::of(&r.observed));
                    self.inbound.adopt_for_deletion(&identity, service, object, &mut self.nrp)
                }
                None => {
                    self.inbound.adopt_for_deletion(&identity, orphan(&identity), ObjectState::gone(), &mut self.nrp);
                    let (egress, mut out) = self.egress_side();
                    egress.refuse_colliding_pods(&identity, &mut out, step);
                }
            }
        }
    }
}
