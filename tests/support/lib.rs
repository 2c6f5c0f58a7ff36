//! What the integration tests and the benchmarks share: one runtime per process, the built-in
//! and test guests, fixture paths, and the WIT → logic conversion of the differential runs.

pub mod apiserver;
pub mod cluster;
pub mod watch_proxy;

use clb_guest::model;
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_host::sandbox::bindings::exports::clb::reconciler::validation as wit_validation;
use clb_host::sandbox::{Limits, Logic, Runtime};
use clb_host::simulate::{LogicError, Reconciler};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const HOSTILE_GUEST: &[u8] = include_bytes!(env!("CLB_HOSTILE_GUEST"));
/// The second version of the logic (`tests/next-guest`): state version 3 (the built-in writes 2), one extra rule, a trap
/// trigger.
pub const NEXT_GUEST: &[u8] = include_bytes!(env!("CLB_NEXT_GUEST"));
/// The next guest built with `destructive-tick`: every tick proposes deleting a load balancer,
/// so the swap self-check refuses it.
pub const DESTRUCTIVE_GUEST: &[u8] = include_bytes!(env!("CLB_DESTRUCTIVE_GUEST"));

/// The test guests by the names scenarios give them in `swap` steps.
pub fn test_guests() -> std::collections::BTreeMap<String, &'static [u8]> {
    [
        ("next-guest".to_owned(), NEXT_GUEST),
        ("hostile-guest".to_owned(), HOSTILE_GUEST),
        ("destructive-guest".to_owned(), DESTRUCTIVE_GUEST),
    ]
    .into_iter()
    .collect()
}

/// The built-in logic behind a supervisor that can swap to the test guests.
pub fn component_reconciler() -> clb_host::simulate::ComponentReconciler<'static> {
    clb_host::simulate::ComponentReconciler::new(builtin()).with_components(runtime(), test_guests())
}

/// One engine per process, as in production.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::new().expect("the engine starts"))
}

/// The built-in logic, compiled once.
pub fn builtin() -> &'static Logic {
    static LOGIC: OnceLock<Logic> = OnceLock::new();
    LOGIC.get_or_init(|| runtime().load(clb_host::BUILTIN_GUEST, Limits::default()).expect("the built-in guest loads"))
}

pub fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(relative)
}

pub fn read_service(file: &str) -> wit::Service {
    let path = fixture(&format!("services/{file}"));
    let services = clb_host::inputs::read_manifests::<k8s_openapi::api::core::v1::Service>(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(services.len(), 1, "{file} holds one Service");
    clb_host::records::service(&services[0])
}

pub fn read_config(file: &str) -> wit::Config {
    clb_host::inputs::read_config(&fixture(&format!("configs/{file}"))).unwrap_or_else(|e| panic!("{e}"))
}

// The conversion below is the guest adapter's, seen from the host's generated types: the
// differential tests feed the same record to the library and to the component.

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

/// Median time of one iteration of `f` over 15 timed batches of `iterations` (benchmarks).
pub fn median_per_iteration(iterations: u32, mut f: impl FnMut()) -> std::time::Duration {
    const BATCHES: usize = 15;
    let mut samples: Vec<std::time::Duration> = (0..BATCHES)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed() / iterations
        })
        .collect();
    samples.sort();
    samples[BATCHES / 2]
}

/// The native library behind the simulator's [`Reconciler`] trait, for the differential runs:
/// the same scenario through this and through the component must give the same commands.
#[derive(Default)]
pub struct NativeReconciler {
    tracker: Option<clb_guest::tracker::Tracker>,
}

impl NativeReconciler {
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

/// Every scenario file under `examples/scenarios/` and `tests/scenarios/`, sorted.
pub fn scenario_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("../examples/scenarios"), root.join("scenarios")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "yaml")));
    }
    files.sort();
    files
}

/// The Azure scope the client and emulator tests use (distinct names, so a test can see which
/// one went where in an ARM ID).
pub fn test_scope() -> clb_host::azure::Scope {
    clb_host::azure::Scope {
        subscription: "sub-1".into(),
        resource_group: "rg-1".into(),
        location: "eastus2".into(),
        vnet_resource_group: "rg-net".into(),
        vnet: "vnet-1".into(),
        service_gateway: clb_host::azure::DEFAULT_SERVICE_GATEWAY.into(),
    }
}
