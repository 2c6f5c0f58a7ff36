//! The inbound lifecycle of a Service: its Azure resources derived from the admitted spec
//! ([`LbConfig`]), its steps ([`OpStep`]: finalizer, public IP, load balancer, NRP registration,
//! status; and the teardown in upstream's order), and what the tracker does when a Service is
//! wanted, changed or deleted and when one of its commands is answered. The scheduling itself is
//! the shared driver's (`lifecycle`).

use super::*;

/// The finalizer that holds a Service until its Azure resources are gone.
pub const FINALIZER: &str = "servicegateway.azure.com/service-cleanup";

/// Event reasons of the lifecycle. Operators alert on them: never rename one.
pub mod reason {
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    pub const LOAD_BALANCER_CONFIGURATION_REJECTED: &str = "LoadBalancerConfigurationRejected";
}

/// Azure error codes that no retry can fix: the Service waits for a new spec.
pub(super) const TERMINAL_CODES: &[&str] = &[
    "RulesUseSameBackendPortProtocolAndPool",
    "QuotaExceeded",
    "PublicIPCountLimitReached",
    "MaxPublicIpCountLimitReached",
    "InvalidParameter",
];
pub(super) const OVERLAY_MAPPINGS_CODE: &str = "ServiceWithOverlayMappingsCannotBeDeleted";
pub(super) const DEFAULT_IDLE_TIMEOUT_MINUTES: u8 = 4;

/// The Azure resources of one Service, derived from its admitted spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbConfig {
    pub public_ip: PublicIp,
    pub load_balancer: LoadBalancer,
}

impl LbConfig {
    /// Names follow upstream (§a.4): LB and pool = UID, PIP = `<uid>-pip`, rules
    /// `rule-<protocol>-<port>`.
    pub fn for_service(service: &Service) -> Self {
        let uid = service.identity();
        let version = match service.ip_families.first().map(String::as_str) {
            Some("IPv6") => IpVersion::Ipv6,
            _ => IpVersion::Ipv4,
        };
        let idle = service
            .annotation(crate::admission::ANNOTATION_IDLE_TIMEOUT)
            .and_then(|v| v.trim().parse::<u8>().ok())
            .unwrap_or(DEFAULT_IDLE_TIMEOUT_MINUTES);
        let rules = service
            .ports
            .iter()
            .filter_map(|port| {
                let protocol = if port.protocol() == "UDP" { LbProtocol::Udp } else { LbProtocol::Tcp };
                let frontend = u16::try_from(port.port).ok()?;
                let backend = u16::try_from(port.backend_port()?).ok()?;
                let proto = if protocol == LbProtocol::Udp { "udp" } else { "tcp" };
                Some(LbRule {
                    name: Name::from(format!("rule-{proto}-{frontend}")),
                    protocol,
                    frontend_port: frontend,
                    backend_port: backend,
                    idle_timeout_minutes: idle,
                    enable_tcp_reset: protocol == LbProtocol::Tcp,
                })
            })
            .collect();
        let public_ip = PublicIp { name: Name::from(format!("{uid}-pip")), version };
        let uid = Name::from(uid);
        let load_balancer =
            LoadBalancer { name: uid.clone(), public_ip: public_ip.name.clone(), backend_pool: uid, rules };
        Self { public_ip, load_balancer }
    }
}


impl Lifecycle {
    /// The Service as last read lacks our finalizer, or the ingress IP this controller gave it,
    /// though both were written: somebody stripped them. A deletion would not wait for the
    /// Azure resources to go without the finalizer.
    pub(super) fn object_needs_repair(&self) -> bool {
        self.object.exists
            && (!self.object.has_finalizer || self.ingress_ip.as_ref().is_some_and(|ip| self.object.ingress != [ip.clone()]))
    }

    /// Puts back what [`Self::object_needs_repair`] found missing: an update of the Service's
    /// object alone (its Azure resources are as applied).
    pub(super) fn repair(&mut self) {
        self.phase = Phase::UpdateInProgress;
        self.steps = [OpStep::AddFinalizer, OpStep::PatchStatus].into();
        self.op_config = self.applied.clone();
        self.attempt.reset();
    }

    /// Not created and not parked (waiting for a new spec): the tracker has steps to run for it.
    pub(super) fn has_work_left(&self) -> bool {
        self.phase != Phase::Created && !self.parked
    }

    /// Whether what `op` would write already holds (`registered`: in NRP), so it is skipped.
    pub(super) fn holds_already(&self, op: OpStep, registered: bool) -> bool {
        let object = &self.object;
        match op {
            OpStep::AddFinalizer => !object.exists || object.has_finalizer,
            OpStep::PutPublicIp | OpStep::PutLoadBalancer => self.op_config.is_none(),
            OpStep::Register => registered,
            OpStep::PatchStatus => {
                !object.exists || self.ingress_ip.as_ref().is_none_or(|ip| object.ingress == [ip.clone()])
            }
            OpStep::Unlink | OpStep::Unregister => !registered,
            OpStep::DeleteLoadBalancer | OpStep::DeletePublicIp => false,
            OpStep::ClearStatus => !object.exists || object.ingress.is_empty(),
            OpStep::RemoveFinalizer => !object.exists || !object.has_finalizer,
        }
    }

    pub(super) fn new(service: ObjectRef, phase: Phase, object: ObjectState, desired: Option<LbConfig>) -> Self {
        let steps = if phase == Phase::NotStarted { OpStep::ENSURE.into() } else { VecDeque::new() };
        Self {
            service,
            phase,
            op_config: desired.clone(),
            desired,
            applied: None,
            steps,
            attempt: Attempt::new(),
            parked: false,
            failing: false,
            ingress_ip: None,
            object,
            recreate: false,
        }
    }
}


/// One command of a Service's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpStep {
    AddFinalizer,
    PutPublicIp,
    PutLoadBalancer,
    Register,
    PatchStatus,
    Unlink,
    DeleteLoadBalancer,
    Unregister,
    DeletePublicIp,
    ClearStatus,
    RemoveFinalizer,
}

impl OpStep {
    pub(super) const ENSURE: [OpStep; 5] =
        [OpStep::AddFinalizer, OpStep::PutPublicIp, OpStep::PutLoadBalancer, OpStep::Register, OpStep::PatchStatus];
    /// Upstream §c.2.3: unlink pool → delete LB → unregister → delete PIP → drop finalizer;
    /// and, before the finalizer, the ingress IP leaves the status of a Service that lives on
    /// (LoadBalancer → ClusterIP), since that address is gone.
    pub(super) const DELETE: [OpStep; 6] = [
        OpStep::Unlink,
        OpStep::DeleteLoadBalancer,
        OpStep::Unregister,
        OpStep::DeletePublicIp,
        OpStep::ClearStatus,
        OpStep::RemoveFinalizer,
    ];

    pub(super) fn is_kubernetes(self) -> bool {
        matches!(self, OpStep::AddFinalizer | OpStep::PatchStatus | OpStep::ClearStatus | OpStep::RemoveFinalizer)
    }

}

impl Op for OpStep {
    fn is_delete_step(self) -> bool {
        OpStep::DELETE.contains(&self)
    }

    fn writes_nrp(self) -> bool {
        matches!(self, OpStep::Register | OpStep::Unlink | OpStep::Unregister)
    }

    fn write_kind(self) -> Option<WriteKind> {
        match self {
            OpStep::Register | OpStep::Unlink | OpStep::Unregister => Some(WriteKind::Services),
            OpStep::PutPublicIp | OpStep::PutLoadBalancer | OpStep::DeleteLoadBalancer | OpStep::DeletePublicIp => {
                Some(WriteKind::Arm)
            }
            _ => None,
        }
    }
}

/// What the tracker knows of a Service object in the API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ObjectState {
    pub(super) exists: bool,
    pub(super) has_finalizer: bool,
    pub(super) ingress: Vec<String>,
}

impl ObjectState {
    pub(super) fn of(service: &Service) -> Self {
        Self {
            exists: true,
            has_finalizer: service.finalizers.iter().any(|f| f == FINALIZER),
            ingress: service.ingress_ips.clone(),
        }
    }

    pub(super) fn gone() -> Self {
        Self { exists: false, has_finalizer: false, ingress: Vec::new() }
    }
}

/// One Service's lifecycle, keyed by its identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    pub(super) service: ObjectRef,
    pub phase: Phase,
    /// From the last admitted spec; `None` for an orphan found in NRP or a Service adopted at
    /// start-up whose spec is no longer admitted.
    pub(super) desired: Option<LbConfig>,
    pub(super) applied: Option<LbConfig>,
    /// The configuration the running operation applies.
    pub(super) op_config: Option<LbConfig>,
    pub(super) steps: VecDeque<OpStep>,
    pub(super) attempt: Attempt<OpStep>,
    /// A terminal failure: waits for a new spec.
    pub(super) parked: bool,
    /// A Warning Event was sent for the current run of failures.
    pub(super) failing: bool,
    pub(super) ingress_ip: Option<String>,
    pub(super) object: ObjectState,
    pub(super) recreate: bool,
}

/// The reference of a Service known only by its identity (found in NRP or ARM, gone from
/// Kubernetes): its Events and Kubernetes writes have no object to go to.
pub(super) fn orphan(identity: &str) -> ObjectRef {
    ObjectRef { kind: "Service".into(), namespace: Name::new(""), name: Name::new(""), uid: Name::new(identity) }
}

pub(super) fn object_ref(service: &Service) -> ObjectRef {
    ObjectRef {
        kind: "Service".into(),
        namespace: Name::new(&service.namespace),
        name: Name::new(&service.name),
        uid: Name::new(&service.uid),
    }
}

impl Tracker {
    // ---- Kubernetes side ----

    pub(super) fn upsert_service(&mut self, service: Service, step: &mut Step) {
        let verdict = admit_service(&self.config, &service);
        let key = service.key();
        let identity = service.identity();
        let previous = self.state.services.remove(&key);
        if let Some(previous) = previous.as_ref().filter(|p| p.observed.uid != service.uid) {
            // The same name now belongs to a new object: the old one is gone.
            let old = previous.observed.identity();
            self.state.service_by_identity.remove(&old);
            self.delete_service(&old, true);
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
            self.event(&object_ref(&service), EventType::Warning, &rejection.reason, message, step);
        }
        if let Some(lifecycle) = self.state.lifecycles.get_mut(&identity) {
            lifecycle.object = ObjectState::of(&service);
            lifecycle.service = object_ref(&service);
        }
        match &verdict {
            Verdict::Admitted => self.want_service(&identity, &service),
            Verdict::Cleanup | Verdict::Ignored(_) => {
                if !self.state.lifecycles.contains_key(&identity) && ObjectState::of(&service).has_finalizer {
                    // Ours from before a restart: clean up whatever is left, then release it.
                    self.adopt_for_deletion(&identity, object_ref(&service), ObjectState::of(&service));
                }
                self.delete_service(&identity, false)
            }
            Verdict::Rejected(_) | Verdict::NothingToProvision => {}
        }
        self.state.service_by_identity.insert(identity.clone(), key.clone());
        self.state.services.insert(key, ServiceRecord { observed: service, admitted, verdict });
        self.refuse_colliding_pods(&identity, step);
    }

    pub(super) fn remove_service_object(&mut self, key: &ObjectKey) {
        let Some(record) = self.state.services.remove(key) else { return };
        let identity = record.observed.identity();
        self.state.service_by_identity.remove(&identity);
        self.delete_service(&identity, true);
    }

    /// Whether a Service's endpoints belong in the Kubernetes side of the DiffTracker.
    pub(super) fn programmable(&self, identity: &str) -> bool {
        self.state.lifecycles.get(identity).is_some_and(|l| !l.phase.is_deleting())
    }

    pub(super) fn want_service(&mut self, identity: &str, service: &Service) {
        let config = LbConfig::for_service(service);
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else {
            let lifecycle =
                Lifecycle::new(object_ref(service), Phase::NotStarted, ObjectState::of(service), Some(config));
            self.state.lifecycles.insert(identity.to_owned(), lifecycle);
            self.seed(identity);
            self.state.work.runnable.insert(identity.to_owned());
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
                    lifecycle.steps.contains(&op) && lifecycle.attempt.in_flight.is_none_or(|(_, running)| running != op)
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
        self.state.work.runnable.insert(identity.to_owned());
    }

    /// Starts (or keeps) the deletion of a Service's Azure resources. `gone`: the object has
    /// left the API server. Never synthesises a deletion for a Service nobody provisioned.
    pub(super) fn delete_service(&mut self, identity: &str, gone: bool) {
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else { return };
        if gone {
            lifecycle.object.exists = false;
        }
        lifecycle.recreate = false;
        if lifecycle.phase.is_deleting() {
            if lifecycle.parked {
                lifecycle.parked = false;
                self.state.work.runnable.insert(identity.to_owned());
            }
            return;
        }
        lifecycle.attempt.reset();
        lifecycle.parked = false;
        lifecycle.failing = false;
        self.unseed(identity);
        self.start_drain::<Inbound>(identity);
    }

    pub(super) fn command_for(&self, identity: &str, op: OpStep) -> Command {
        let lifecycle = &self.state.lifecycles[identity];
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
    pub(super) fn finish_operation(&mut self, identity: &str, step: &mut Step) {
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("caller checked");
        match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                let created = lifecycle.phase != Phase::UpdateInProgress;
                lifecycle.applied = lifecycle.op_config.clone();
                if lifecycle.desired.is_some() && lifecycle.desired != lifecycle.applied {
                    lifecycle.phase = Phase::UpdateInProgress;
                    lifecycle.op_config = lifecycle.desired.clone();
                    lifecycle.steps = [OpStep::PutLoadBalancer, OpStep::PatchStatus].into();
                    self.state.work.runnable.insert(identity.to_owned());
                } else if lifecycle.object_needs_repair() {
                    // Read without our finalizer (or its ingress IP) after it was written.
                    lifecycle.repair();
                    self.state.work.runnable.insert(identity.to_owned());
                } else {
                    lifecycle.phase = Phase::Created;
                }
                let (service, ip) = (lifecycle.service.clone(), lifecycle.ingress_ip.clone().unwrap_or_default());
                if created {
                    let message = format!("load balancer {identity} is serving at {ip}");
                    self.event(&service, EventType::Normal, reason::ENSURED_LOAD_BALANCER, message, step);
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
                    self.seed(identity);
                    self.state.diff.touch_identity(identity);
                    self.state.work.runnable.insert(identity.to_owned());
                } else {
                    self.state.lifecycles.remove(identity);
                }
                self.event(&service, EventType::Normal, reason::DELETED_LOAD_BALANCER, message, step);
            }
            Phase::Created | Phase::DeletionPending => {}
        }
    }

    pub(super) fn service_outcome(&mut self, identity: &str, id: u64, op: OpStep, outcome: Outcome, now: u64, step: &mut Step) {
        if !self.answered::<Inbound>(identity, id, op, &outcome, now, step) {
            return;
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("it waited for the answer");
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::PublicIpAddress(ip) => {
                lifecycle.ingress_ip = Some(ip);
                self.step_succeeded(identity, op);
                return;
            }
            Outcome::Ok | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.step_succeeded(identity, op);
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
            self.step_succeeded(identity, op);
            if op.is_kubernetes() && !self.state.lifecycles[identity].phase.is_deleting() {
                // The Service left the API server before we finished: undo what we made.
                self.delete_service(identity, true);
            }
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            return; // a create or update pre-empted by a delete: the delete carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        if op == OpStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            self.drain_again::<Inbound>(identity, now);
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("still there");
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
            let message = format!(
                "Azure refused {op:?} for load balancer {identity}: {} ({}); fix the Service spec to retry",
                failure.message, code
            );
            self.event(&service, EventType::Warning, reason::LOAD_BALANCER_CONFIGURATION_REJECTED, message, step);
            return;
        }
        let what = format!("{op:?} for load balancer {identity}");
        if self.retry_later::<Inbound>(identity, &failure, &what, now, step) {
            let message = format!(
                "{op:?} for load balancer {identity} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            self.event(&service, EventType::Warning, reason::SYNC_LOAD_BALANCER_FAILED, message, step);
        }
    }

    pub(super) fn step_succeeded(&mut self, identity: &str, op: OpStep) {
        match op {
            OpStep::Register => self.state.diff.set_registered(identity, true),
            OpStep::Unregister => self.state.diff.set_registered(identity, false),
            _ => {}
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("caller checked");
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
        self.step_done::<Inbound>(identity, op);
    }

    /// Tracks a Service found registered in NRP or holding our finalizer, only to delete it.
    pub(super) fn adopt_for_deletion(&mut self, identity: &str, service: ObjectRef, object: ObjectState) {
        let lifecycle = Lifecycle::new(service, Phase::DeletionPending, object, None);
        self.state.lifecycles.insert(identity.to_owned(), lifecycle);
        self.state.work.draining.insert(identity.to_owned());
        self.state.diff.touch_identity(identity);
    }
}

/// Inbound Services, to the lifecycle driver.
pub(super) struct Inbound;

impl Life for Lifecycle {
    life_fields!(OpStep);
    fn parked(&self) -> bool {
        self.parked
    }
    fn holds_already(&self, op: OpStep, registered: bool) -> bool {
        Lifecycle::holds_already(self, op, registered)
    }
    fn has_work_left(&self) -> bool {
        Lifecycle::has_work_left(self)
    }
}

impl Kind for Inbound {
    type Life = Lifecycle;
    const DELETE: &'static [OpStep] = &OpStep::DELETE;
    const UNREGISTER: OpStep = OpStep::Unregister;
    fn lifecycles(tracker: &Tracker) -> &BTreeMap<String, Lifecycle> {
        &tracker.state.lifecycles
    }
    fn parts(tracker: &mut Tracker) -> (&mut BTreeMap<String, Lifecycle>, &mut WorkSets<String>) {
        (&mut tracker.state.lifecycles, &mut tracker.state.work)
    }
    fn registered(tracker: &Tracker, identity: &str) -> bool {
        tracker.state.diff.is_registered(identity)
    }
    /// An egress identity of the same name is torn down first.
    fn blocked(tracker: &Tracker, identity: &str) -> bool {
        tracker.outbound.lifecycles.contains_key(identity)
    }
    fn command(tracker: &mut Tracker, identity: &str, op: OpStep) -> Command {
        tracker.command_for(identity, op)
    }
    fn in_flight(identity: &str, op: OpStep) -> InFlight {
        InFlight::Service { identity: identity.to_owned(), step: op }
    }
    fn finish(tracker: &mut Tracker, identity: &str, step: &mut Step) {
        tracker.finish_operation(identity, step);
    }
}
