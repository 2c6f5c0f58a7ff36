//! What the tracker does with a Service: admission of each version it reads, the lifecycle it
//! wants, deletion, the commands of its steps and what their answers do; and `Inbound`, its kind
//! for the driver.

use super::cache::*;
use super::driver::*;
use super::egress::outbound::Outbound;
use super::figures::ServiceType;
use super::nrp::*;
use super::outbox::*;
use super::service::*;
use crate::admission::Verdict;
use crate::keyed::Map;
use crate::lifecycle::{Op, WorkSets};
use crate::model::*;
use crate::name::Name;

/// Inbound Services: a lifecycle per identity, and the sets the lifecycle driver looks at for
/// work (and the lifecycle driver's kind for them, `inbound`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Inbound {
    pub(super) lifecycles: Map<String, Lifecycle>,
    pub(super) work: WorkSets<String>,
}

impl Inbound {
    /// Whether a Service has a lifecycle here (so its identity is no egress identity).
    pub(super) fn has(&self, identity: &str) -> bool {
        self.lifecycles.contains_key(identity)
    }

    /// A Service's lifecycle, by identity.
    pub(super) fn lifecycle(&self, identity: &str) -> Option<&Lifecycle> {
        self.lifecycles.get(identity)
    }

    /// Whether a Service's endpoints belong in the Kubernetes side of the DiffTracker.
    pub(super) fn programmable(&self, identity: &str) -> bool {
        self.lifecycles.get(identity).is_some_and(|l| !l.phase.is_deleting())
    }
}

impl Inbound {
    /// A version of a Service read, with the verdict admission reached on it: its record in the
    /// Kubernetes cache, and the lifecycle it wants (or the deletion it starts).
    pub(super) fn upsert_service(
        &mut self,
        service: Service,
        verdict: Verdict,
        kube: &mut KubeCache,
        nrp: &mut Nrp,
        outbox: &mut Outbox,
        step: &mut Step,
    ) {
        let key = service.key();
        let identity = service.identity();
        let previous = kube.take_service(&key);
        if let Some(previous) = previous.as_ref().filter(|p| p.observed.uid != service.uid) {
            // The same name now belongs to a new object: the old one is gone.
            let old = previous.observed.identity();
            kube.forget_identity(&old);
            self.delete_service(&old, true, kube, nrp);
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
            outbox.event(&object_ref(&service), EventType::Warning, &rejection.reason, message, step);
        }
        if let Some(lifecycle) = self.lifecycles.get_mut(&identity) {
            lifecycle.object = ObjectState::of(&service);
            lifecycle.service = object_ref(&service);
        }
        match &verdict {
            Verdict::Admitted => self.want_service(&identity, &service, kube, nrp),
            Verdict::Cleanup | Verdict::Ignored(_) => {
                if !self.lifecycles.contains_key(&identity) && ObjectState::of(&service).has_finalizer {
                    // Ours from before a restart: clean up whatever is left, then release it.
                    self.adopt_for_deletion(&identity, object_ref(&service), ObjectState::of(&service), nrp);
                }
                self.delete_service(&identity, false, kube, nrp)
            }
            Verdict::Rejected(_) | Verdict::NothingToProvision => {}
        }
        kube.put_service(identity, key, ServiceRecord { observed: service, admitted, verdict });
    }

    pub(super) fn want_service(&mut self, identity: &str, service: &Service, kube: &KubeCache, nrp: &mut Nrp) {
        let config = LbConfig::for_service(service);
        let Some(lifecycle) = self.lifecycles.get_mut(identity) else {
            let lifecycle =
                Lifecycle::new(object_ref(service), Phase::NotStarted, ObjectState::of(service), Some(config));
            self.lifecycles.insert(identity.to_owned(), lifecycle);
            kube.seed(identity, nrp.desired());
            self.work.runnable.insert(identity.to_owned());
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
                    lifecycle.steps.contains(&op)
                        && lifecycle.attempt.in_flight.is_none_or(|(_, running)| running != op)
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
        self.work.runnable.insert(identity.to_owned());
    }

    /// Starts (or keeps) the deletion of a Service's Azure resources. `gone`: the object has
    /// left the API server. Never synthesises a deletion for a Service nobody provisioned.
    pub(super) fn delete_service(&mut self, identity: &str, gone: bool, kube: &KubeCache, nrp: &mut Nrp) {
        let Some(lifecycle) = self.lifecycles.get_mut(identity) else { return };
        if gone {
            lifecycle.object.exists = false;
        }
        lifecycle.recreate = false;
        if lifecycle.phase.is_deleting() {
            if lifecycle.parked {
                lifecycle.parked = false;
                self.work.runnable.insert(identity.to_owned());
            }
            return;
        }
        lifecycle.attempt.reset();
        lifecycle.parked = false;
        lifecycle.failing = false;
        kube.unseed(identity, nrp.desired());
        self.start_drain(nrp, identity);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn service_outcome(
        &mut self,
        identity: &str,
        id: u64,
        op: OpStep,
        outcome: Outcome,
        now: u64,
        drive: &mut Drive<'_>,
        kube: &KubeCache,
        step: &mut Step,
    ) {
        if !self.answered(drive.budgets, identity, id, op, &outcome, now, step) {
            return;
        }
        let lifecycle = self.lifecycles.get_mut(identity).expect("it waited for the answer");
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::PublicIpAddress(ip) => {
                lifecycle.ingress_ip = Some(ip);
                self.step_succeeded(identity, op, drive.nrp);
                return;
            }
            Outcome::Ok | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.step_succeeded(identity, op, drive.nrp);
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
            self.step_succeeded(identity, op, drive.nrp);
            if op.is_kubernetes() && !self.lifecycles[identity].phase.is_deleting() {
                // The Service left the API server before we finished: undo what we made.
                self.delete_service(identity, true, kube, drive.nrp);
            }
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            return; // a create or update pre-empted by a delete: the delete carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        if op == OpStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            self.drain_again(drive.nrp, identity, now);
        }
        let lifecycle = self.lifecycles.get_mut(identity).expect("still there");
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
            let phase = lifecycle.phase;
            drive.figures.parked(ServiceType::Inbound, identity, phase, &failure.label(), now);
            let message = format!(
                "Azure refused {op:?} for load balancer {identity}: {} ({}); fix the Service spec to retry",
                failure.message, code
            );
            drive.outbox.event(
                &service,
                EventType::Warning,
                reason::LOAD_BALANCER_CONFIGURATION_REJECTED,
                message,
                step,
            );
            return;
        }
        let what = format!("{op:?} for load balancer {identity}");
        if self.retry_later(drive.figures, identity, &failure, &what, now, step) {
            let message = format!(
                "{op:?} for load balancer {identity} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            drive.outbox.event(&service, EventType::Warning, reason::SYNC_LOAD_BALANCER_FAILED, message, step);
        }
    }

    pub(super) fn step_succeeded(&mut self, identity: &str, op: OpStep, nrp: &mut Nrp) {
        match op {
            OpStep::Register => nrp.set_registered(identity, true),
            OpStep::Unregister => nrp.set_registered(identity, false),
            _ => {}
        }
        let lifecycle = self.lifecycles.get_mut(identity).expect("caller checked");
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
        self.step_done(identity, op);
    }

    /// Start-up adoption (`Startup::adopt_from_arm`): a Service not started whose public IP ARM
    /// already holds as it wants it (`held`: its address, and whether its load balancer holds
    /// too) skips those writes, and one with nothing left to write is created as it is. Returns
    /// (adopted, of them created whole).
    pub(super) fn adopt_held(
        &mut self,
        nrp: &Nrp,
        held: impl Fn(&LbConfig) -> Option<(String, bool)>,
    ) -> (usize, usize) {
        let (mut adopted, mut whole) = (0usize, 0usize);
        for (identity, lifecycle) in self.lifecycles.iter_mut() {
            if lifecycle.phase != Phase::NotStarted {
                continue;
            }
            let Some((address, load_balancer_holds)) = lifecycle.op_config.as_ref().and_then(&held) else { continue };
            lifecycle
                .steps
                .retain(|s| *s != OpStep::PutPublicIp && (*s != OpStep::PutLoadBalancer || !load_balancer_holds));
            adopted += 1;
            lifecycle.ingress_ip = Some(address);
            // Every step left already holds: the Service is as a creation would leave it.
            let registered = nrp.is_registered(identity);
            if lifecycle.steps.iter().all(|&op| lifecycle.holds_already(op, registered)) {
                lifecycle.phase = Phase::Created;
                lifecycle.applied = lifecycle.op_config.clone();
                lifecycle.steps.clear();
                self.work.runnable.remove(identity);
                whole += 1;
            }
        }
        (adopted, whole)
    }

    /// Tracks a Service found registered in NRP or holding our finalizer, only to delete it.
    pub(super) fn adopt_for_deletion(
        &mut self,
        identity: &str,
        service: ObjectRef,
        object: ObjectState,
        nrp: &mut Nrp,
    ) {
        let lifecycle = Lifecycle::new(service, Phase::DeletionPending, object, None);
        self.lifecycles.insert(identity.to_owned(), lifecycle);
        self.work.draining.insert(identity.to_owned());
        nrp.touch(identity);
    }
}

impl Inbound {
    pub(super) fn command_for(&self, identity: &str, op: OpStep) -> Command {
        let lifecycle = &self.lifecycles[identity];
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
    pub(super) fn finish_operation(
        &mut self,
        identity: &str,
        drive: &mut Drive<'_>,
        kube: &KubeCache,
        step: &mut Step,
    ) {
        let lifecycle = self.lifecycles.get_mut(identity).expect("caller checked");
        match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                let created = lifecycle.phase != Phase::UpdateInProgress;
                lifecycle.applied = lifecycle.op_config.clone();
                if lifecycle.desired.is_some() && lifecycle.desired != lifecycle.applied {
                    lifecycle.phase = Phase::UpdateInProgress;
                    lifecycle.op_config = lifecycle.desired.clone();
                    lifecycle.steps = [OpStep::PutLoadBalancer, OpStep::PatchStatus].into();
                    self.work.runnable.insert(identity.to_owned());
                } else if lifecycle.object_needs_repair() {
                    // Read without our finalizer (or its ingress IP) after it was written.
                    lifecycle.repair();
                    self.work.runnable.insert(identity.to_owned());
                } else {
                    lifecycle.phase = Phase::Created;
                }
                let (service, ip) = (lifecycle.service.clone(), lifecycle.ingress_ip.clone().unwrap_or_default());
                if created {
                    let message = format!("load balancer {identity} is serving at {ip}");
                    drive.outbox.event(&service, EventType::Normal, reason::ENSURED_LOAD_BALANCER, message, step);
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
                    kube.seed(identity, drive.nrp.desired());
                    drive.nrp.touch(identity);
                    self.work.runnable.insert(identity.to_owned());
                } else {
                    self.lifecycles.remove(identity);
                }
                drive.outbox.event(&service, EventType::Normal, reason::DELETED_LOAD_BALANCER, message, step);
            }
            Phase::Created | Phase::DeletionPending => {}
        }
    }

    /// After a read of NRP: a Service created here whose registration NRP lost is ensured again,
    /// a teardown NRP contradicts drains again, and a UID-named registration no lifecycle claims
    /// is adopted: as serving while its Service lives and is not to be cleaned up, for deletion
    /// otherwise. `orphan`: an identity adopted with no Service at all (an orphan in NRP), whose
    /// colliding egress pods are refused at once.
    pub(super) fn reconcile_with_nrp(
        &mut self,
        kube: &KubeCache,
        nrp: &mut Nrp,
        mut orphan_found: impl FnMut(&str, &mut Nrp),
    ) {
        let registered: Vec<String> = nrp.registered().iter().map(Name::to_string).collect();
        for (identity, lifecycle) in self.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !nrp.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.op_config = lifecycle.desired.clone();
                lifecycle.steps = OpStep::ENSURE.into();
                self.work.runnable.insert(identity.clone());
            }
        }
        self.drain_again_where_referenced(nrp);
        for identity in registered {
            if self.lifecycles.contains_key(&identity) || !looks_like_uid(&identity) {
                continue;
            }
            let record = kube.record_of(&identity).cloned();
            match record {
                // A live Service that is no longer admitted keeps serving (docs/design.md §3).
                Some(r) if !matches!(r.verdict, Verdict::Cleanup | Verdict::Ignored(_)) => {
                    let lifecycle =
                        Lifecycle::new(object_ref(&r.observed), Phase::Created, ObjectState::of(&r.observed), None);
                    self.lifecycles.insert(identity.clone(), lifecycle);
                    kube.seed(&identity, nrp.desired());
                    nrp.touch(&identity);
                }
                Some(r) => {
                    let (service, object) = (object_ref(&r.observed), ObjectState::of(&r.observed));
                    self.adopt_for_deletion(&identity, service, object, nrp)
                }
                None => {
                    self.adopt_for_deletion(&identity, orphan(&identity), ObjectState::gone(), nrp);
                    orphan_found(&identity, nrp);
                }
            }
        }
    }
}

/// What inbound lifecycles ask of the rest of the tracker: whether an egress identity of the
/// same name is being torn down first, and the Kubernetes cache to seed a Service recreated.
pub(super) struct InboundPeers<'a> {
    pub(super) outbound: &'a Outbound,
    pub(super) kube: &'a KubeCache,
}

impl Peers<Inbound> for InboundPeers<'_> {
    fn registered(&self, nrp: &Nrp, identity: &str) -> bool {
        nrp.is_registered(identity)
    }
    /// An egress identity of the same name is torn down first.
    fn blocked(&self, identity: &str) -> bool {
        self.outbound.has(identity)
    }
    fn finish(&mut self, side: &mut Inbound, drive: &mut Drive<'_>, identity: &str, step: &mut Step) {
        side.finish_operation(identity, drive, self.kube, step);
    }
}

impl Kind for Inbound {
    type Life = Lifecycle;
    const DELETE: &'static [OpStep] = &OpStep::DELETE;
    const UNREGISTER: OpStep = OpStep::Unregister;
    const TYPE: ServiceType = ServiceType::Inbound;
    fn lifecycles(&self) -> &Map<String, Lifecycle> {
        &self.lifecycles
    }
    fn work(&self) -> &WorkSets<String> {
        &self.work
    }
    fn sets(&mut self) -> (&mut Map<String, Lifecycle>, &mut WorkSets<String>) {
        (&mut self.lifecycles, &mut self.work)
    }
    fn orphan(&self, identity: &str) -> bool {
        self.lifecycles.get(identity).is_some_and(|l| l.service.namespace.is_empty())
    }
    fn command(&mut self, identity: &str, op: OpStep) -> Command {
        self.command_for(identity, op)
    }
    fn in_flight(identity: &str, op: OpStep) -> InFlight {
        InFlight::Service { identity: identity.to_owned(), step: op }
    }
}
