//! The native library (`clb-guest`) seen through the host's WIT types (feature `native`): the
//! conversions the guest's adapter (`guest/src/component.rs`) makes, written from the host's
//! generated types, and [`NativeReconciler`], the library behind the simulator's
//! [`Reconciler`] trait. Differential runs feed the same records to the library and to the
//! component and compare what comes back: the integration tests (`clb-tests`) and the fuzz
//! crate's `differential` target (`fuzz-lib/`).

use crate::sandbox::bindings::clb::reconciler::types as wit;
use crate::sandbox::bindings::exports::clb::reconciler::validation as wit_validation;
use crate::simulate::{LogicError, Reconciler};
use clb_guest::model;

pub fn config_to_model(c: &wit::Config) -> clb_guest::Config {
    clb_guest::Config {
        backend_pool_type: c.backend_pool_type.clone(),
        load_balancer_sku: c.load_balancer_sku.clone(),
        multiple_standard_load_balancers: c.multiple_standard_load_balancers.clone(),
    }
}

pub fn service_to_model(s: &wit::Service) -> model::Service {
    model::Service {
        uid: s.uid.clone(),
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        service_type: s.service_type.clone(),
        external_traffic_policy: s.external_traffic_policy.clone(),
        session_affinity: s.session_affinity.clone(),
        load_balancer_ip: s.load_balancer_ip.clone(),
        load_balancer_class: s.load_balancer_class.clone(),
        ip_families: s.ip_families.clone(),
        ports: s
            .ports
            .iter()
            .map(|p| model::ServicePort {
                name: p.name.clone(),
                protocol: p.protocol.clone(),
                port: p.port,
                target_port: p.target_port.as_ref().map(|t| match t {
                    wit::TargetPort::Number(n) => model::TargetPort::Number(*n),
                    wit::TargetPort::Name(n) => model::TargetPort::Name(n.clone()),
                }),
                node_port: p.node_port,
            })
            .collect(),
        annotations: s.annotations.clone(),
        finalizers: s.finalizers.clone(),
        deleting: s.deleting,
        ingress_ips: s.ingress_ips.clone(),
    }
}

/// A verdict as comparable text: `kind` or `rejected:Reason:message`.
pub fn native_verdict(v: &clb_guest::Verdict) -> String {
    match v {
        clb_guest::Verdict::Admitted => "admitted".into(),
        clb_guest::Verdict::NothingToProvision => "nothing-to-provision".into(),
        clb_guest::Verdict::Cleanup => "cleanup".into(),
        clb_guest::Verdict::Ignored(why) => format!("ignored:{why}"),
        clb_guest::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}

pub fn component_verdict(v: &wit_validation::Verdict) -> String {
    match v {
        wit_validation::Verdict::Admitted => "admitted".into(),
        wit_validation::Verdict::NothingToProvision => "nothing-to-provision".into(),
        wit_validation::Verdict::Cleanup => "cleanup".into(),
        wit_validation::Verdict::Ignored(why) => format!("ignored:{why}"),
        wit_validation::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}

/// The library's step as the component would return it, for comparing command streams.
pub fn step_to_wit(step: model::Step) -> wit::Step {
    wit::Step {
        commands: step
            .commands
            .into_iter()
            .map(|i| wit::Issued { id: i.id, command: command_to_wit(i.command) })
            .collect(),
        wake_at_ms: step.wake_at_ms,
        idle: step.idle,
    }
}

fn object_ref_to_wit(r: model::ObjectRef) -> wit::ObjectRef {
    wit::ObjectRef { kind: r.kind.into(), namespace: r.namespace.into(), name: r.name.into(), uid: r.uid.into() }
}

pub fn command_to_wit(command: model::Command) -> wit::Command {
    use model::Command as M;
    match command {
        M::EmitEvent(e) => wit::Command::EmitEvent(wit::Event {
            regarding: object_ref_to_wit(e.regarding),
            event_type: match e.event_type {
                model::EventType::Normal => wit::EventType::Normal,
                model::EventType::Warning => wit::EventType::Warning,
            },
            reason: e.reason,
            message: e.message,
        }),
        M::ReadNrp => wit::Command::ReadNrp,
        M::UpdateServices(services) => wit::Command::UpdateServices(wit::UpdateServices {
            services: services
                .into_iter()
                .map(|s| wit::NrpServiceRequest {
                    name: s.name,
                    service_type: match s.service_type {
                        model::NrpServiceType::Inbound => wit::NrpServiceType::Inbound,
                        model::NrpServiceType::Outbound => wit::NrpServiceType::Outbound,
                    },
                    backend_pools: s
                        .backend_pools
                        .into_iter()
                        .map(|p| wit::PoolRef { load_balancer: p.load_balancer, pool: p.pool })
                        .collect(),
                    is_delete: s.is_delete,
                })
                .collect(),
        }),
        M::UpdateAddressLocations(locations) => wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations {
            locations: locations
                .into_iter()
                .map(|l| wit::NrpLocation {
                    location: l.location,
                    action: match l.action {
                        model::UpdateAction::PartialUpdate => wit::UpdateAction::PartialUpdate,
                        model::UpdateAction::FullUpdate => wit::UpdateAction::FullUpdate,
                    },
                    addresses: l
                        .addresses
                        .into_iter()
                        .map(|a| wit::NrpAddress { address: a.address, services: a.services })
                        .collect(),
                })
                .collect(),
        }),
        M::PutPublicIp(ip) => wit::Command::PutPublicIp(wit::PublicIp {
            name: ip.name.into(),
            version: match ip.version {
                model::IpVersion::Ipv4 => wit::IpVersion::Ipv4,
                model::IpVersion::Ipv6 => wit::IpVersion::Ipv6,
            },
        }),
        M::PutLoadBalancer(lb) => wit::Command::PutLoadBalancer(wit::LoadBalancer {
            name: lb.name.into(),
            public_ip: lb.public_ip.into(),
            backend_pool: lb.backend_pool.into(),
            rules: lb
                .rules
                .into_iter()
                .map(|r| wit::LbRule {
                    name: r.name.into(),
                    protocol: match r.protocol {
                        model::LbProtocol::Tcp => wit::LbProtocol::Tcp,
                        model::LbProtocol::Udp => wit::LbProtocol::Udp,
                    },
                    frontend_port: r.frontend_port,
                    backend_port: r.backend_port,
                    idle_timeout_minutes: r.idle_timeout_minutes,
                    enable_tcp_reset: r.enable_tcp_reset,
                })
                .collect(),
        }),
        M::DeleteResource(r) => wit::Command::DeleteResource(wit::ResourceRef {
            kind: match r.kind {
                model::ResourceKind::PublicIp => wit::ResourceKind::PublicIp,
                model::ResourceKind::LoadBalancer => wit::ResourceKind::LoadBalancer,
            },
            name: r.name,
        }),
        M::PatchServiceStatus { service, ingress_ips } => {
            wit::Command::PatchServiceStatus(wit::ServiceStatus { service: object_ref_to_wit(service), ingress_ips })
        }
        M::SetFinalizer { service, finalizer, present } => {
            wit::Command::SetFinalizer(wit::FinalizerChange { service: object_ref_to_wit(service), finalizer, present })
        }
    }
}

pub fn observation_to_model(o: &wit::Observation) -> model::Observation {
    match o {
        wit::Observation::ServiceUpserted(s) => model::Observation::ServiceUpserted(service_to_model(s)),
        wit::Observation::ServiceDeleted((ns, name)) => {
            model::Observation::ServiceDeleted(model::ObjectKey::new(ns, name))
        }
        wit::Observation::SliceUpserted(s) => model::Observation::SliceUpserted(model::EndpointSlice {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            owner_service_uid: s.owner_service_uid.clone(),
            address_type: s.address_type.clone(),
            endpoints: s
                .endpoints
                .iter()
                .map(|e| model::Endpoint {
                    addresses: e.addresses.clone(),
                    node_name: e.node_name.clone(),
                    ready: e.ready,
                })
                .collect(),
            deleting: s.deleting,
        }),
        wit::Observation::SliceDeleted((ns, name)) => model::Observation::SliceDeleted(model::ObjectKey::new(ns, name)),
        wit::Observation::NodeUpserted(n) => {
            model::Observation::NodeUpserted(model::Node { name: n.name.clone(), internal_ips: n.internal_ips.clone() })
        }
        wit::Observation::NodeDeleted(name) => model::Observation::NodeDeleted(name.clone()),
        wit::Observation::PodUpserted(p) => model::Observation::PodUpserted(model::Pod {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            egress_label: p.egress_label.clone(),
            phase: p.phase.clone(),
            pod_ips: p.pod_ips.clone(),
            pod_ip: p.pod_ip.clone(),
            host_ips: p.host_ips.clone(),
            host_ip: p.host_ip.clone(),
            deleting: p.deleting,
        }),
        wit::Observation::PodDeleted((ns, name)) => model::Observation::PodDeleted(model::ObjectKey::new(ns, name)),
        wit::Observation::ListsComplete => model::Observation::ListsComplete,
    }
}

pub fn outcome_to_model(o: &wit::Outcome) -> model::Outcome {
    let addresses = |addresses: &[wit::NrpAddress]| {
        addresses
            .iter()
            .map(|a| model::NrpAddress { address: a.address.clone(), services: a.services.clone() })
            .collect()
    };
    match o {
        wit::Outcome::Ok => model::Outcome::Ok,
        wit::Outcome::PublicIpAddress(ip) => model::Outcome::PublicIpAddress(ip.clone()),
        wit::Outcome::NrpSnapshot(state) => model::Outcome::NrpSnapshot(model::NrpState {
            services: state
                .services
                .iter()
                .map(|s| model::NrpService {
                    name: s.name.clone(),
                    service_type: s.service_type.clone(),
                    backend_pools: s
                        .backend_pools
                        .iter()
                        .map(|p| model::PoolRef { load_balancer: p.load_balancer.clone(), pool: p.pool.clone() })
                        .collect(),
                    is_default: s.is_default,
                })
                .collect(),
            locations: state
                .locations
                .iter()
                .map(|l| model::NrpListedLocation { location: l.location.clone(), addresses: addresses(&l.addresses) })
                .collect(),
        }),
        wit::Outcome::Failed(f) => model::Outcome::Failed(model::Failure {
            status: f.status,
            code: f.code.clone(),
            retry_after_ms: f.retry_after_ms,
            message: f.message.clone(),
        }),
    }
}

/// The native library behind the simulator's [`Reconciler`] trait, for the differential runs:
/// the same scenario through this and through the component must give the same commands.
#[derive(Default)]
pub struct NativeReconciler {
    tracker: Option<clb_guest::tracker::Tracker>,
}

impl NativeReconciler {
    /// The tracker, once started (the fuzz seeds export its state).
    pub fn state(&self) -> Option<&clb_guest::tracker::Tracker> {
        self.tracker.as_ref()
    }

    fn tracker(&mut self) -> Result<&mut clb_guest::tracker::Tracker, LogicError> {
        self.tracker.as_mut().ok_or(LogicError::NotStarted)
    }
}

impl Reconciler for NativeReconciler {
    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        let tracker = clb_guest::tracker::Tracker::create(config_to_model(config))
            .map_err(|e| LogicError::ConfigRefused { field: e.field, reason: e.reason, message: e.message })?;
        self.tracker = Some(tracker);
        Ok(())
    }

    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        let batch = batch.iter().map(observation_to_model).collect();
        Ok(step_to_wit(self.tracker()?.observe(now_ms, batch)))
    }

    fn complete(&mut self, now_ms: u64, results: &[(u64, wit::Outcome)]) -> Result<wit::Step, LogicError> {
        let results = results.iter().map(|(id, outcome)| (*id, outcome_to_model(outcome))).collect();
        Ok(step_to_wit(self.tracker()?.complete(now_ms, results)))
    }

    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError> {
        Ok(step_to_wit(self.tracker()?.tick(now_ms)))
    }
}

