//! The one lifecycle driver: inbound Services and outbound egress identities alike are advanced
//! one command at a time, answered, retried with backoff, drained and torn down here; a kind of
//! lifecycle ([`Kind`]) says only what is particular to it.

use super::figures::ServiceType;
use super::outbox::*;
use super::state::*;
use crate::keyed::Map;
use crate::lifecycle::{Life, Op, WorkSets, timing};
use crate::model::*;

/// A kind of lifecycle: where its lifecycles and work sets live in the tracker, and what is
/// particular to it.
pub(super) trait Kind {
    type Life: Life;
    /// Its teardown, run once its addresses have drained.
    const DELETE: &'static [<Self::Life as Life>::Op];
    /// The step that unregisters it from NRP.
    const UNREGISTER: <Self::Life as Life>::Op;
    /// Its side, for the figures.
    const TYPE: ServiceType;
    fn lifecycles(tracker: &Tracker) -> &Map<String, Self::Life>;
    /// It has no Kubernetes object: an orphan found in NRP or ARM.
    fn orphan(_tracker: &Tracker, _identity: &str) -> bool {
        false
    }
    fn parts(tracker: &mut Tracker) -> (&mut Map<String, Self::Life>, &mut WorkSets<String>);
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

pub(super) type OpOf<K> = <<K as Kind>::Life as Life>::Op;

impl Tracker {
    /// Advances `K`'s runnable lifecycles while there is room in flight; those that must wait
    /// for a read of NRP or a token stay runnable.
    pub(super) fn run<K: Kind>(&mut self, now: u64, hold_nrp_writes: bool, step: &mut Step) {
        let mut held = Vec::new();
        while self.outbox.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT {
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
    pub(super) fn advance<K: Kind>(
        &mut self,
        identity: &str,
        now: u64,
        hold_nrp_writes: bool,
        step: &mut Step,
    ) -> bool {
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
                work.timers.insert(attempt.not_before_ms, identity);
                return true;
            }
            let Some(&next) = lifecycle.steps().front() else {
                let orphan = K::orphan(self, identity);
                self.figures.succeeded(K::TYPE, identity, phase, orphan, now);
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
            if next.write_kind().is_some_and(|kind| !self.budgets.take_token(kind, now)) {
                return false; // `next_wake` wakes for the token
            }
            let command = K::command(self, identity, next);
            let lifecycle = K::parts(self).0.get_mut(identity).expect("checked above");
            if lifecycle.phase() == Phase::NotStarted {
                lifecycle.set_phase(Phase::CreationInProgress);
            }
            if next.writes_nrp() {
                self.nrp.sync.service_writes_in_flight += 1;
            }
            self.outbox.service_commands_in_flight += 1;
            let id = self.outbox.issue(command, K::in_flight(identity, next), step);
            K::parts(self).0.get_mut(identity).expect("checked above").attempt_mut().in_flight = Some((id, next));
            return true;
        }
    }

    /// An answer to one of `K`'s commands. Azure's answer counts for its write budget whether or
    /// not the lifecycle still waits for it; returns whether it does (it is runnable again).
    pub(super) fn answered<K: Kind>(
        &mut self,
        identity: &str,
        id: u64,
        op: OpOf<K>,
        outcome: &Outcome,
        now: u64,
        step: &mut Step,
    ) -> bool {
        if let Some(kind) = op.write_kind() {
            self.budgets.answered(kind, outcome, now, step);
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
    pub(super) fn step_done<K: Kind>(&mut self, identity: &str, op: OpOf<K>) {
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
    pub(super) fn retry_later<K: Kind>(
        &mut self,
        identity: &str,
        failure: &Failure,
        what: &str,
        now: u64,
        step: &mut Step,
    ) -> bool {
        let orphan = K::orphan(self, identity);
        if let Some(life) = K::lifecycles(self).get(identity) {
            let phase = life.phase();
            self.figures.failed(K::TYPE, identity, phase, &failure.label(), orphan, now);
        }
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        let at = lifecycle.attempt_mut().failed(identity, failure, what, now, step);
        work.timers.insert(at, identity);
        !std::mem::replace(lifecycle.failing(), true)
    }

    /// The lifecycle waits, deletion pending, for NRP to map no address to it any more.
    pub(super) fn start_drain<K: Kind>(&mut self, identity: &str) {
        let (lifecycles, work) = K::parts(self);
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        lifecycle.set_phase(Phase::DeletionPending);
        lifecycle.steps().clear();
        work.draining.insert(identity.to_owned());
        self.nrp.diff.touch_identity(identity);
    }

    /// NRP refused to unregister it (`ServiceWithOverlayMappingsCannotBeDeleted`): NRP still
    /// maps addresses to it, so the mirror was wrong. It drains again, and NRP is read back.
    pub(super) fn drain_again<K: Kind>(&mut self, identity: &str, now: u64) {
        self.start_drain::<K>(identity);
        self.nrp.sync.next_read_ms = now;
    }

    /// After a read of NRP: a teardown about to unregister whose drain ended on a mirror NRP now
    /// contradicts (after an overlay-mappings refusal the drain ends before NRP is read back)
    /// drains again before the unregistration.
    pub(super) fn drain_again_where_referenced<K: Kind>(&mut self) {
        let contradicted: Vec<String> = K::lifecycles(self)
            .iter()
            .filter(|(identity, l)| {
                l.phase() == Phase::DeletionInProgress
                    && l.attempt().in_flight.is_none()
                    && self.nrp.diff.nrp_references(identity)
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
    pub(super) fn check_drained<K: Kind>(&mut self) {
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
