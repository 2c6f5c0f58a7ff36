//! A Service's lifecycle as data: its Azure resources derived from the admitted spec
//! ([`LbConfig`]), its steps ([`OpStep`]: finalizer, public IP, load balancer, NRP registration,
//! status; the teardown in upstream's order), what already holds, the Event reasons and the Azure
//! codes that decide a failure. What the tracker does with it is `inbound`.

use crate::budget::WriteKind;
use crate::lifecycle::{Attempt, Life, Op, life_fields};
use crate::model::*;
use crate::name::Name;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

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
    /// Names follow upstream (docs/upstream.md §a.4): LB and pool = UID, PIP = `<uid>-pip`, rules
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
            && (!self.object.has_finalizer
                || self.ingress_ip.as_ref().is_some_and(|ip| self.object.ingress != [ip.clone()]))
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
    /// Upstream docs/upstream.md §c.2.3: unlink pool → delete LB → unregister → delete PIP → drop finalizer;
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
