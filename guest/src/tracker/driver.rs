//! The one lifecycle driver: inbound Services and outbound egress identities alike are advanced
//! one command at a time, answered, retried with backoff, drained and torn down here. A side
//! ([`Kind`]: the inbound part, the outbound lifecycles) owns its lifecycles and work sets and
//! says only what is particular to it; the driver writes everything else through one handle
//! ([`Drive`]: the outbox, the write budgets, the NRP part and the figures), and asks the rest of
//! the tracker what it must know through [`Peers`].

use super::budgets::Budgets;
use super::figures::{Figures, ServiceType};
use super::nrp::Nrp;
use super::outbox::*;
use crate::keyed::Map;
use crate::lifecycle::{Life, Op, WorkSets, timing};
use crate::model::*;

/// What the lifecycle driver writes through, besides the lifecycles of the side it drives.
pub(super) struct Drive<'a> {
    pub(super) outbox: &'a mut Outbox,
    pub(super) budgets: &'a mut Budgets,
    pub(super) nrp: &'a mut Nrp,
    pub(super) figures: &'a mut Figures,
}

impl Drive<'_> {
    /// No NRP address maps to the identity, nor may one in a batch whose answer is not in.
    pub(super) fn drained(&self, identity: &str) -> bool {
        self.nrp.drained(self.outbox.in_flight(), identity)
    }
}

/// What the driver asks of the rest of the tracker about a lifecycle of side `K`.
pub(super) trait Peers<K: Kind + ?Sized> {
    /// NRP lists the identity as registered (as the mirror has it).
    fn registered(&self, nrp: &Nrp, identity: &str) -> bool;
    /// Waits for another lifecycle of the same name to end first.
    fn blocked(&self, _identity: &str) -> bool {
        false
    }
    /// Every step of the operation is done.
    fn finish(&mut self, side: &mut K, drive: &mut Drive<'_>, identity: &str, step: &mut Step);
}

pub(super) type OpOf<K> = <<K as Kind>::Life as Life>::Op;

/// A side of lifecycles: its lifecycles and work sets, and what is particular to it; the
/// provided methods are the driver.
pub(super) trait Kind {
    type Life: Life;
    /// Its teardown, run once its addresses have drained.
    const DELETE: &'static [<Self::Life as Life>::Op];
    /// The step that unregisters it from NRP.
    const UNREGISTER: <Self::Life as Life>::Op;
    /// Its side, for the figures.
    const TYPE: ServiceType;
    fn lifecycles(&self) -> &Map<String, Self::Life>;
    /// The sets the driver looks at for work: runnable, on a timer, draining.
    fn work(&self) -> &WorkSets<String>;
    fn sets(&mut self) -> (&mut Map<String, Self::Life>, &mut WorkSets<String>);
    /// It has no Kubernetes object: an orphan found in NRP or ARM.
    fn orphan(&self, _identity: &str) -> bool {
        false
    }
    /// The command that carries out `op`; called as it is sent.
    fn command(&mut self, identity: &str, op: OpOf<Self>) -> Command;
    fn in_flight(identity: &str, op: OpOf<Self>) -> InFlight;

    /// Lifecycles whose timer is due become runnable.
    fn fire(&mut self, now: u64) {
        self.sets().1.fire(now);
    }

    /// Brings every timer, and each lifecycle's own deadline, in to `latest`
    /// (`Tracker::bring_in_deadlines`).
    fn bring_in(&mut self, latest: u64) {
        let (lifecycles, work) = self.sets();
        work.bring_in(latest, |identity| {
            if let Some(lifecycle) = lifecycles.get_mut(identity) {
                lifecycle.attempt_mut().bring_in(latest);
            }
        });
    }

    /// Advances the runnable lifecycles while there is room in flight; those that must wait
    /// for a read of NRP or a token stay runnable.
    #[inline(never)] // one copy per side, not one inlined into the pump (component size)
    fn run(
        &mut self,
        drive: &mut Drive<'_>,
        peers: &mut impl Peers<Self>,
        now: u64,
        hold_nrp_writes: bool,
        step: &mut Step,
    ) {
        let mut held = Vec::new();
        while drive.outbox.has_service_room() {
            let Some(identity) = self.sets().1.runnable.pop_first() else { break };
            if !self.advance(drive, peers, &identity, now, hold_nrp_writes, step) {
                held.push(identity);
            }
        }
        self.sets().1.runnable.extend(held);
    }

    /// Issues the next command of a lifecycle's operation, skipping the steps that hold
    /// already. Returns false when it must wait (for a read of NRP, a token, or the other
    /// lifecycle of its name).
    fn advance(
        &mut self,
        drive: &mut Drive<'_>,
        peers: &mut impl Peers<Self>,
        identity: &str,
        now: u64,
        hold_nrp_writes: bool,
        step: &mut Step,
    ) -> bool {
        if peers.blocked(identity) {
            return false;
        }
        loop {
            let registered = peers.registered(drive.nrp, identity);
            let (lifecycles, work) = self.sets();
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
                let orphan = self.orphan(identity);
                drive.figures.succeeded(Self::TYPE, identity, phase, orphan, now);
                peers.finish(self, drive, identity, step);
                return true;
            };
            if lifecycle.holds_already(next, registered) {
                lifecycle.steps().pop_front();
                continue;
            }
            if next.writes_nrp() && hold_nrp_writes {
                return false;
            }
            if next.write_kind().is_some_and(|kind| !drive.budgets.take_token(kind, now)) {
                return false; // `next_wake` wakes for the token
            }
            let command = self.command(identity, next);
            let lifecycle = self.sets().0.get_mut(identity).expect("checked above");
            if lifecycle.phase() == Phase::NotStarted {
                lifecycle.set_phase(Phase::CreationInProgress);
            }
            if next.writes_nrp() {
                drive.nrp.write_issued();
            }
            let id = drive.outbox.issue_service(command, Self::in_flight(identity, next), step);
            self.sets().0.get_mut(identity).expect("checked above").attempt_mut().in_flight = Some((id, next));
            return true;
        }
    }

    /// An answer to one of its commands. Azure's answer counts for its write budget whether or
    /// not the lifecycle still waits for it; returns whether it does (it is runnable again).
    #[allow(clippy::too_many_arguments)]
    fn answered(
        &mut self,
        budgets: &mut Budgets,
        identity: &str,
        id: u64,
        op: OpOf<Self>,
        outcome: &Outcome,
        now: u64,
        step: &mut Step,
    ) -> bool {
        if let Some(kind) = op.write_kind() {
            budgets.answered(kind, outcome, now, step);
        }
        let (lifecycles, work) = self.sets();
        let waited = lifecycles.get_mut(identity).is_some_and(|l| l.attempt_mut().answered(id));
        if waited {
            work.runnable.insert(identity.to_owned());
        }
        waited
    }

    /// A step's work is done (the caller recorded its own facts): its backoff ends, and the
    /// operation moves past it unless a teardown pre-empted the operation it was part of.
    fn step_done(&mut self, identity: &str, op: OpOf<Self>) {
        let lifecycle = self.sets().0.get_mut(identity).expect("caller checked");
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
    fn retry_later(
        &mut self,
        figures: &mut Figures,
        identity: &str,
        failure: &Failure,
        what: &str,
        now: u64,
        step: &mut Step,
    ) -> bool {
        let orphan = self.orphan(identity);
        if let Some(life) = self.lifecycles().get(identity) {
            let phase = life.phase();
            figures.failed(Self::TYPE, identity, phase, &failure.label(), orphan, now);
        }
        let (lifecycles, work) = self.sets();
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        let at = lifecycle.attempt_mut().failed(identity, failure, what, now, step);
        work.timers.insert(at, identity);
        !std::mem::replace(lifecycle.failing(), true)
    }

    /// The lifecycle waits, deletion pending, for NRP to map no address to it any more.
    fn start_drain(&mut self, nrp: &mut Nrp, identity: &str) {
        let (lifecycles, work) = self.sets();
        let lifecycle = lifecycles.get_mut(identity).expect("caller checked");
        lifecycle.set_phase(Phase::DeletionPending);
        lifecycle.steps().clear();
        work.draining.insert(identity.to_owned());
        nrp.touch(identity);
    }

    /// NRP refused to unregister it (`ServiceWithOverlayMappingsCannotBeDeleted`): NRP still
    /// maps addresses to it, so the mirror was wrong. It drains again, and NRP is read back.
    fn drain_again(&mut self, nrp: &mut Nrp, identity: &str, now: u64) {
        self.start_drain(nrp, identity);
        nrp.read_now(now);
    }

    /// After a read of NRP: a teardown about to unregister whose drain ended on a mirror NRP now
    /// contradicts (after an overlay-mappings refusal the drain ends before NRP is read back)
    /// drains again before the unregistration.
    fn drain_again_where_referenced(&mut self, nrp: &mut Nrp) {
        let contradicted: Vec<String> = self
            .lifecycles()
            .iter()
            .filter(|(identity, l)| {
                l.phase() == Phase::DeletionInProgress && l.attempt().in_flight.is_none() && nrp.references(identity)
            })
            .map(|(identity, _)| identity.clone())
            .collect();
        for identity in contradicted {
            let lifecycle = self.sets().0.get_mut(&identity).expect("listed above");
            if lifecycle.steps().contains(&Self::UNREGISTER) {
                self.start_drain(nrp, &identity);
                self.sets().1.runnable.remove(&identity);
            }
        }
    }

    /// The draining lifecycles whose addresses have left NRP start their teardown.
    fn check_drained(&mut self, drive: &Drive<'_>) {
        let draining: Vec<String> = self.sets().1.draining.iter().cloned().collect();
        for identity in draining {
            let Some(lifecycle) = self.lifecycles().get(&identity) else {
                self.sets().1.draining.remove(&identity);
                continue;
            };
            if lifecycle.phase() != Phase::DeletionPending
                || lifecycle.attempt().in_flight.is_some()
                || !drive.drained(&identity)
            {
                continue;
            }
            let (lifecycles, work) = self.sets();
            let lifecycle = lifecycles.get_mut(&identity).expect("read above");
            lifecycle.set_phase(Phase::DeletionInProgress);
            *lifecycle.steps() = Self::DELETE.iter().copied().collect();
            work.draining.remove(&identity);
            work.runnable.insert(identity);
        }
    }
}
