//! The tracker's side of egress identities' outbound lifecycles (`self::outbound`): when pods
//! start or stop carrying an identity, its reconciliation after a read of NRP, the end of an
//! operation and the answers to its commands; and `OutboundIdentity`, its kind for the driver.

pub mod finalizers;
pub mod identities;
pub mod outbound;
mod pods;

use super::cache::KubeCache;
use super::driver::*;
use super::figures::ServiceType;
use super::nrp::*;
use super::outbox::*;
use super::service::*;
use crate::keyed::Map;
use crate::lifecycle::{Op, WorkSets};
use crate::model::*;
use finalizers::PodFinalizers;
use identities::Egress;
use outbound::{OutStep, Outbound, OutboundLifecycle, TornDown};
use std::collections::VecDeque;

/// The egress side: pods and the identities they carry ([`Egress`]), the outbound lifecycle of
/// each identity of ours ([`Outbound`]), the finalizers held on egress pods
/// ([`PodFinalizers`]), and the identities whose teardown ended lately ([`TornDown`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct EgressSide {
    pub(super) identities: Egress,
    pub(super) outbound: Outbound,
    pub(super) finalizers: PodFinalizers,
    pub(super) torn_down: TornDown,
}

/// What the egress side writes through, and what it reads of the rest of the tracker: the NRP
/// part (the mirror of what the identities' pods hold), the outbox (Events, finalizer writes)
/// and the Kubernetes cache (the cluster's families; the Services' identities).
pub(super) struct EgressOut<'a> {
    pub(super) nrp: &'a mut Nrp,
    pub(super) outbox: &'a mut Outbox,
    pub(super) kube: &'a KubeCache,
    /// Start-up reconciliation has run and the tracker provisions (CLB mode): only then does
    /// the egress side decide an identity's outbound lifecycle.
    pub(super) enabled: bool,
}

impl EgressSide {
    /// Whether pods carry the identity changed (none to some, some to none). Nothing is decided
    /// before start-up reconciliation, which decides for every carried identity once NRP (which
    /// says which identities are somebody else's) has been read.
    pub(super) fn carried_changed(&mut self, identity: &str, out: &mut EgressOut<'_>) {
        if !out.enabled {
            return;
        }
        let carried = self.identities.carries(identity);
        let Some(lifecycle) = self.outbound.lifecycles.get_mut(identity) else {
            // An identity NRP already lists is somebody else's: programmed, never provisioned.
            if carried && !self.identities.is_registered(identity) {
                self.torn_down.forget(identity);
                let lifecycle = OutboundLifecycle::creating(out.kube.has_ipv6());
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
                out.nrp.touch(identity);
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
                    self.identities.set_registered(identity, true);
                }
                lifecycle.attempt.reset();
                lifecycle.failing = false;
                self.outbound.start_drain(out.nrp, identity);
            }
        }
    }

    /// The pods and the identities they carry.
    pub(super) fn identities(&self) -> &Egress {
        &self.identities
    }

    /// The outbound lifecycles.
    pub(super) fn outbound(&self) -> &Outbound {
        &self.outbound
    }

    /// An egress pod left the API server: it carries nothing any more, and its finalizer is
    /// gone with it. Returns what it carried, if anything (the identity and its addresses).
    pub(super) fn pod_deleted(&mut self, key: &ObjectKey, nrp: &mut Nrp) -> Option<(String, Map<String, String>)> {
        let before = self.identities.carried_by(key);
        self.identities.delete(key, nrp.desired());
        self.finalizers.gone(key, &before, true);
        before
    }

    /// After a read of NRP: the identities NRP registers, and the pods' finalizers, which may
    /// wait for what has left it.
    pub(super) fn nrp_read(&mut self, services: &[NrpService], nrp: &Nrp) {
        self.identities.nrp_read(services, nrp.diff());
        self.finalizers.recheck();
    }

    /// An address-location batch was answered: what a pod's finalizer waits for may have left
    /// NRP.
    pub(super) fn locations_answered(&mut self) {
        self.finalizers.recheck();
    }

    /// Timers that are due make their outbound lifecycles and pods runnable.
    pub(super) fn fire(&mut self, now: u64) {
        self.outbound.fire(now);
    }

    /// An outbound lifecycle is runnable (it may wait for a token).
    pub(super) fn has_runnable(&self) -> bool {
        !self.outbound.work().runnable.is_empty()
    }

    /// No outbound lifecycle has work left and no pod's finalizer is to be written.
    pub(super) fn is_quiet(&self) -> bool {
        self.outbound.is_quiet() && self.finalizers.is_quiet()
    }

    /// When the next timer of an outbound lifecycle or a pod is due.
    pub(super) fn next_timers(&self) -> [Option<u64>; 2] {
        [self.outbound.work().next_timer(), self.finalizers.next_timer()]
    }

    /// Brings every deadline in to `latest` (`Tracker::bring_in_deadlines`).
    pub(super) fn bring_in(&mut self, latest: u64) {
        self.finalizers.bring_in(latest);
        self.outbound.bring_in(latest);
        self.torn_down.bring_in(latest);
    }

    /// Drives the outbound lifecycles: those drained start their teardown, the runnable
    /// advance.
    pub(super) fn run(
        &mut self,
        drive: &mut Drive<'_>,
        kube: &KubeCache,
        now: u64,
        hold_nrp_writes: bool,
        step: &mut Step,
    ) {
        self.outbound.check_drained(drive);
        let (identities, finalizers, torn_down) = (&self.identities, &mut self.finalizers, &mut self.torn_down);
        let mut peers = OutboundPeers { identities, finalizers, torn_down, kube, now };
        self.outbound.run(drive, &mut peers, now, hold_nrp_writes, step);
    }

    /// The egress identities NRP registers (as the mirror has them).
    pub(super) fn registered_count(&self) -> usize {
        self.identities.registered_count()
    }

    /// The egress pods whose finalizer is held.
    pub(super) fn finalizers_held(&self) -> usize {
        self.finalizers.held_count()
    }

    /// How an identity no inbound lifecycle claims takes part in a sync, as its pods say
    /// ([`Egress::class`]).
    pub(super) fn class(&self, identity: &str) -> Option<crate::difftracker::Class> {
        self.identities.class(identity)
    }

    /// Start-up adoption of a NAT gateway of ours named `identity` (`Startup::adopt_from_arm`):
    /// an identity being created whose public IPs and NAT gateway `holds` (ARM lists them as
    /// they would be put) skips those writes; one carried and registered with no lifecycle is
    /// ours, created; one no pod carries is torn down after a drain. `Some(true)`: adopted,
    /// `Some(false)`: to tear down, `None`: nothing done.
    pub(super) fn adopt_nat_gateway(
        &mut self,
        identity: &str,
        v6: bool,
        holds: impl FnOnce() -> bool,
        nrp: &mut Nrp,
    ) -> Option<bool> {
        let (carried, registered) = (self.identities.carries(identity), self.identities.is_registered(identity));
        match self.outbound.lifecycles.get_mut(identity) {
            Some(lifecycle) if lifecycle.phase == Phase::NotStarted => {
                if lifecycle.v6 != v6 || !holds() {
                    return None;
                }
                lifecycle
                    .steps
                    .retain(|s| !matches!(s, OutStep::PutPublicIp | OutStep::PutPublicIpV6 | OutStep::PutNatGateway));
                lifecycle.public_ips_put = true;
                lifecycle.nat_gateway_put = true;
                Some(true)
            }
            Some(_) => None,
            None if carried && registered => {
                let lifecycle = OutboundLifecycle::new(Phase::Created, v6, VecDeque::new());
                self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                nrp.touch(identity);
                Some(true)
            }
            None if carried => None,
            None => {
                let lifecycle = OutboundLifecycle::new(Phase::DeletionPending, v6, VecDeque::new());
                self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                self.outbound.start_drain(nrp, identity);
                Some(false)
            }
        }
    }

    /// Start-up's sweep of the public IPs a teardown cut short left (`Startup::adopt_from_arm`):
    /// only their deletes are left of the identity's teardown (every step before holds already).
    pub(super) fn sweep_public_ips(&mut self, identity: String, v6: bool) {
        let mut lifecycle = OutboundLifecycle::new(Phase::DeletionInProgress, v6, outbound::DELETE.into());
        lifecycle.whole = false;
        lifecycle.nat_gateway_put = false;
        self.outbound.lifecycles.insert(identity.clone(), lifecycle);
        self.outbound.work.runnable.insert(identity);
    }

    /// After every read of NRP: carried identities with no lifecycle (pods seen before the
    /// first read, or an identity whose registration by somebody else went away) are decided
    /// now, one of ours that NRP lost is ensured again (every step is a PUT: idempotent), and
    /// one this tracker tore down lately that NRP registers again with no pod carrying it (a
    /// late write of ours, [`TornDown`]) is torn down again.
    pub(super) fn reconcile_outbound(&mut self, out: &mut EgressOut<'_>, now: u64, step: &mut Step) {
        let undecided: Vec<String> = self
            .identities
            .carried()
            .filter(|id| !self.outbound.lifecycles.contains_key(*id))
            .map(str::to_owned)
            .collect();
        for identity in undecided {
            self.carried_changed(&identity, out);
        }
        for (identity, lifecycle) in self.outbound.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.identities.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.steps = outbound::ENSURE.into();
                self.outbound.work.runnable.insert(identity.clone());
                out.nrp.touch(identity);
            }
        }
        self.tear_down_late_registrations(out.nrp, now, step);
        self.outbound.drain_again_where_referenced(out.nrp);
    }

    /// A registration NRP holds again of an identity whose teardown this tracker finished
    /// lately, that no pod carries and no lifecycle claims, was made by a write of ours that
    /// landed after the teardown. It goes the way of an identity whose last pod went: drained
    /// (a late address-location write may reference it too), then unlinked and unregistered;
    /// the NAT gateway and public IPs are not written again (the teardown deleted them, and a
    /// disassociating PUT would create the NAT gateway anew).
    fn tear_down_late_registrations(&mut self, nrp: &mut Nrp, now: u64, step: &mut Step) {
        let late: Vec<String> = self
            .torn_down
            .identities()
            .filter(|id| self.identities.is_registered(id) && !self.identities.carries(id) && !self.outbound.has(id))
            .map(str::to_owned)
            .collect();
        for identity in late {
            self.torn_down.forget(&identity);
            let mut lifecycle = OutboundLifecycle::new(Phase::DeletionPending, false, VecDeque::new());
            // Nothing of it is left in ARM: no NAT gateway to disassociate or delete, no public IP.
            (lifecycle.public_ips_put, lifecycle.nat_gateway_put) = (false, false);
            self.outbound.lifecycles.insert(identity.clone(), lifecycle);
            self.outbound.start_drain(nrp, &identity);
            let message = format!(
                "egress identity {identity}: NRP registers it again after its teardown ended, and no pod carries it \
                 (a write of ours that landed late: a previous leader's, or a retried command's); unregistering it again"
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
        self.torn_down.expire(now);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn outbound_outcome(
        &mut self,
        identity: &str,
        id: u64,
        op: OutStep,
        outcome: Outcome,
        now: u64,
        drive: &mut Drive<'_>,
        step: &mut Step,
    ) {
        if !self.outbound.answered(drive.budgets, identity, id, op, &outcome, now, step) {
            return;
        }
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("it waited for the answer");
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.outbound_step_succeeded(identity, op, drive.nrp);
                return;
            }
        };
        if failure.status == 404 && op.gone_is_done() {
            self.outbound_step_succeeded(identity, op, drive.nrp);
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            if op == OutStep::Register {
                // It may have taken effect whatever the answer: the teardown unregisters.
                self.identities.set_registered(identity, true);
            }
            return; // a creation pre-empted by the teardown: the teardown carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        let what = format!("{op:?} for egress identity {identity}");
        if op.failure_is_ignored() {
            let message =
                format!("{what} failed (HTTP {} {code}): {}; the teardown goes on", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message });
            let phase = lifecycle.phase;
            drive.figures.disassociation_failed(identity, phase, now);
            self.outbound_step_succeeded(identity, op, drive.nrp);
            return;
        }
        if op == OutStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            self.outbound.drain_again(drive.nrp, identity, now);
        }
        if self.outbound.retry_later(drive.figures, identity, &failure, &what, now, step) {
            let message = format!(
                "{what} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
    }

    pub(super) fn outbound_step_succeeded(&mut self, identity: &str, op: OutStep, nrp: &mut Nrp) {
        match op {
            OutStep::Register => {
                self.identities.set_registered(identity, true);
                nrp.touch(identity);
            }
            OutStep::Unregister => self.identities.set_registered(identity, false),
            _ => {}
        }
        self.outbound.lifecycles.get_mut(identity).expect("caller checked").succeeded(op);
        self.outbound.step_done(identity, op);
    }
}

/// What outbound lifecycles ask of the rest of the tracker: whether NRP registers an identity
/// (the egress side's mirror), whether a pod still carries it, the finalizers a teardown
/// releases, and whether the cluster has IPv6 (a recreated identity's public IPs).
pub(super) struct OutboundPeers<'a> {
    pub(super) identities: &'a Egress,
    pub(super) finalizers: &'a mut PodFinalizers,
    /// Where a finished teardown is remembered, with the time it finished.
    pub(super) torn_down: &'a mut TornDown,
    pub(super) kube: &'a KubeCache,
    pub(super) now: u64,
}

impl Peers<Outbound> for OutboundPeers<'_> {
    fn registered(&self, _: &Nrp, identity: &str) -> bool {
        self.identities.is_registered(identity)
    }
    /// The last step of an outbound operation succeeded.
    fn finish(&mut self, side: &mut Outbound, drive: &mut Drive<'_>, identity: &str, step: &mut Step) {
        let lifecycle = side.lifecycles.get_mut(identity).expect("caller checked");
        let message = match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                lifecycle.phase = Phase::Created;
                lifecycle.whole = true;
                drive.nrp.touch(identity);
                format!(
                    "egress identity {identity}: NAT gateway and public IP(s) in place, Outbound service registered"
                )
            }
            Phase::DeletionInProgress => {
                let recreate = lifecycle.recreate && self.identities.carries(identity);
                side.lifecycles.remove(identity);
                self.finalizers.recheck(); // a last pod's finalizer waited for this
                if recreate {
                    let lifecycle = OutboundLifecycle::creating(self.kube.has_ipv6());
                    side.lifecycles.insert(identity.to_owned(), lifecycle);
                    side.work.runnable.insert(identity.to_owned());
                } else {
                    self.torn_down.record(identity, self.now);
                }
                format!("egress identity {identity}: unregistered, NAT gateway and public IP(s) deleted")
            }
            Phase::Created | Phase::DeletionPending => return,
        };
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }
}

impl Kind for Outbound {
    type Life = OutboundLifecycle;
    const DELETE: &'static [OutStep] = &outbound::DELETE;
    const UNREGISTER: OutStep = OutStep::Unregister;
    const TYPE: ServiceType = ServiceType::Outbound;
    fn lifecycles(&self) -> &Map<String, OutboundLifecycle> {
        &self.lifecycles
    }
    fn work(&self) -> &WorkSets<String> {
        &self.work
    }
    fn sets(&mut self) -> (&mut Map<String, OutboundLifecycle>, &mut WorkSets<String>) {
        (&mut self.lifecycles, &mut self.work)
    }
    /// Records what the step may leave behind as it is sent.
    fn command(&mut self, identity: &str, op: OutStep) -> Command {
        let lifecycle = self.lifecycles.get_mut(identity).expect("the driver checked");
        let command = lifecycle.command(identity, op);
        lifecycle.sending(op);
        command
    }
    fn in_flight(identity: &str, op: OutStep) -> InFlight {
        InFlight::Outbound { identity: identity.to_owned(), step: op }
    }
}
