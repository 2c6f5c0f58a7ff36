//! A large cluster for the benchmarks: 1,000 nodes, 30,000 ready pods (30 per Service) and
//! 1,000 LoadBalancer Services, as the observations the host would send, the NRP that already
//! holds all of it, and answers to every command. Shared by `benches/difftracker.rs` and
//! `benches/swap.rs` so both measure the same cluster.

use crate::{bench_scale, read_service, scaled};
use clb_sandbox::bindings::clb::reconciler::types as wit;

pub const PODS_PER_SERVICE: usize = 30;

/// The cluster is 1,000 nodes and 1,000 Services, divided by `CLB_BENCH_SHRINK` ([`scaled`]):
/// to check that the cost of one change does not grow with the cluster, and CI's small mode;
/// then multiplied by `CLB_BENCH_SCALE` ([`bench_scale`]), for AKS's sizes.
pub fn node_count() -> usize {
    scaled(1_000) * scale()
}

pub fn service_count() -> usize {
    scaled(1_000) * scale()
}

thread_local! {
    /// [`at_scale`]'s multiplier on this thread, if one is running.
    static SCALE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The multiplier: [`at_scale`]'s on this thread, else `CLB_BENCH_SCALE` ([`bench_scale`]).
fn scale() -> usize {
    SCALE.get().unwrap_or_else(bench_scale)
}

/// Runs `f` with the cluster multiplied by `n` on this thread (a test of a size of its own; the
/// other tests' threads keep theirs).
pub fn at_scale<R>(n: usize, f: impl FnOnce() -> R) -> R {
    let before = SCALE.replace(Some(n));
    let result = f();
    SCALE.set(before);
    result
}

/// `config` with every write budget at its largest: for a benchmark that measures something
/// else than the budgets, whose changes would otherwise wait for tokens.
pub fn unbounded(config: &wit::Config) -> wit::Config {
    let most = wit::Budget { per_minute: 600_000, burst: 100_000 };
    wit::Config {
        write_budgets: Some(wit::WriteBudgets {
            update_address_locations: Some(most),
            update_services: Some(most),
            arm_writes: Some(most),
            arm_write_reserve: Some(0),
        }),
        ..config.clone()
    }
}

/// A random-looking version 4 UUID, as the API server gives (a shared prefix would make every
/// key comparison long, which real clusters never see).
pub fn uid(service: usize) -> String {
    let mut h = (service as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        h ^= h >> 31;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h
    };
    let (a, b, c) = (next(), next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        a & 0xffff,
        b & 0xfff,
        (b >> 16) & 0xfff,
        c & 0xffff_ffff_ffff
    )
}

pub fn node_ip(node: usize) -> String {
    format!("10.{}.{}.4", node / 250, node % 250)
}

pub fn pod_ip(pod: usize) -> String {
    format!("10.{}.{}.{}", 100 + pod / 65_536, (pod / 256) % 256, pod % 256)
}

pub fn pod_node(service: usize, pod: usize) -> usize {
    (service * PODS_PER_SERVICE + pod) % node_count()
}

pub fn slice(service: usize, not_ready: Option<usize>) -> wit::EndpointSlice {
    wit::EndpointSlice {
        namespace: "shop".into(),
        name: format!("svc-{service}-abcde"),
        owner_service_uid: Some(uid(service)),
        address_type: "IPv4".into(),
        endpoints: (0..PODS_PER_SERVICE)
            .map(|pod| wit::Endpoint {
                addresses: vec![pod_ip(service * PODS_PER_SERVICE + pod)],
                node_name: Some(format!("node-{}", pod_node(service, pod))),
                ready: Some(not_ready != Some(pod)),
            })
            .collect(),
        deleting: false,
    }
}

pub fn lists() -> Vec<wit::Observation> {
    let mut template = read_service("etp-local.yaml");
    template.finalizers = vec!["servicegateway.azure.com/service-cleanup".into()];
    let mut all = Vec::new();
    for node in 0..node_count() {
        all.push(wit::Observation::NodeUpserted(wit::Node {
            name: format!("node-{node}"),
            internal_ips: vec![node_ip(node)],
        }));
    }
    for service in 0..service_count() {
        let mut svc = template.clone();
        svc.uid = uid(service);
        svc.name = format!("svc-{service}");
        svc.ingress_ips = vec![format!("20.0.{}.{}", service / 250, service % 250 + 1)];
        all.push(wit::Observation::ServiceUpserted(svc));
        all.push(wit::Observation::SliceUpserted(slice(service, None)));
    }
    all.push(wit::Observation::ListsComplete);
    all
}

/// NRP already holding the whole cluster: a restart, the common start-up.
pub fn nrp_in_sync() -> wit::Outcome {
    let mut locations: Vec<wit::NrpListedLocation> = (0..node_count())
        .map(|node| wit::NrpListedLocation { location: node_ip(node), addresses: Vec::new() })
        .collect();
    for service in 0..service_count() {
        for pod in 0..PODS_PER_SERVICE {
            locations[pod_node(service, pod)].addresses.push(wit::NrpAddress {
                address: pod_ip(service * PODS_PER_SERVICE + pod),
                services: vec![uid(service)],
            });
        }
    }
    let services = (0..service_count())
        .map(|s| wit::NrpService {
            name: uid(s),
            service_type: "Inbound".into(),
            backend_pools: Vec::new(),
            is_default: false,
        })
        .collect();
    wit::Outcome::NrpSnapshot(wit::NrpState { services, locations })
}

/// ARM already holding every Service's public IP (at the address its status shows) and load
/// balancer as the logic builds them: a restart, with nothing to write.
pub fn arm_in_sync() -> wit::Outcome {
    let (mut public_ips, mut load_balancers) = (Vec::new(), Vec::new());
    for observation in lists() {
        let wit::Observation::ServiceUpserted(service) = observation else { continue };
        let address = service.ingress_ips.first().cloned();
        let config = clb_guest::tracker::LbConfig::for_service(&service.into());
        public_ips.push(wit::ListedPublicIp {
            name: config.public_ip.name.to_string(),
            version: wit::IpVersion::Ipv4,
            address,
            as_put: true,
        });
        load_balancers.push(wit::ListedLoadBalancer {
            name: config.load_balancer.name.to_string(),
            shape: Some(config.load_balancer.into()),
        });
    }
    wit::Outcome::ArmInventory(wit::ArmInventory { public_ips, load_balancers, nat_gateways: Vec::new() })
}

/// Egress on top of the cluster: 100 identities carried by 3,000 pods (30 each) that
/// hold the pod finalizer, each pod on the node of its number, with NRP and ARM already holding
/// every identity's Outbound service, NAT gateway and public IP, as a restart finds them.
pub const EGRESS_IDENTITIES: usize = 100;
pub const EGRESS_PODS: usize = 3_000;

pub fn egress_identity(pod: usize) -> String {
    format!("egress-{}", pod % EGRESS_IDENTITIES)
}

pub fn egress_pod_ip(pod: usize) -> String {
    format!("10.{}.{}.{}", 200 + pod / 65_536, (pod / 256) % 256, pod % 256)
}

/// [`lists`] with the egress pods before `lists-complete`.
pub fn lists_with_egress() -> Vec<wit::Observation> {
    let mut all = lists();
    let complete = all.pop();
    for pod in 0..EGRESS_PODS {
        all.push(wit::Observation::PodUpserted(wit::Pod {
            namespace: "batch".into(),
            name: format!("egress-pod-{pod}"),
            uid: uid(1_000_000 + pod),
            egress_label: Some(egress_identity(pod)),
            phase: Some("Running".into()),
            pod_ips: vec![egress_pod_ip(pod)],
            pod_ip: None,
            host_ips: vec![node_ip(pod % node_count())],
            host_ip: None,
            deleting: false,
            finalizers: vec![clb_guest::tracker::egress::finalizers::FINALIZER.into()],
        }));
    }
    all.extend(complete);
    all
}

/// [`nrp_in_sync`] with the egress identities registered and their pods' addresses mapped.
pub fn nrp_in_sync_with_egress() -> wit::Outcome {
    let wit::Outcome::NrpSnapshot(mut state) = nrp_in_sync() else { unreachable!("a snapshot") };
    for pod in 0..EGRESS_PODS {
        state.locations[pod % node_count()]
            .addresses
            .push(wit::NrpAddress { address: egress_pod_ip(pod), services: vec![egress_identity(pod)] });
    }
    state.services.extend((0..EGRESS_IDENTITIES).map(|i| wit::NrpService {
        name: egress_identity(i),
        service_type: "Outbound".into(),
        backend_pools: Vec::new(),
        is_default: false,
    }));
    wit::Outcome::NrpSnapshot(state)
}

/// [`arm_in_sync`] with every identity's NAT gateway and public IP as the logic makes them.
pub fn arm_in_sync_with_egress() -> wit::Outcome {
    let wit::Outcome::ArmInventory(mut inventory) = arm_in_sync() else { unreachable!("an inventory") };
    for i in 0..EGRESS_IDENTITIES {
        let (identity, public_ip) = (egress_identity(i), format!("{}-pip", egress_identity(i)));
        inventory.public_ips.push(wit::ListedPublicIp {
            name: public_ip.clone(),
            version: wit::IpVersion::Ipv4,
            address: Some(format!("20.2.0.{}", i + 1)),
            as_put: true,
        });
        inventory.nat_gateways.push(wit::ListedNatGateway {
            name: identity,
            public_ips: vec![public_ip],
            public_ips_v6: Vec::new(),
            associated: true,
            as_put: true,
        });
    }
    wit::Outcome::ArmInventory(inventory)
}

/// [`answer`] for the cluster with egress.
pub fn answer_with_egress(command: &wit::Command) -> wit::Outcome {
    match command {
        wit::Command::ReadNrp => nrp_in_sync_with_egress(),
        wit::Command::ReadArm => arm_in_sync_with_egress(),
        other => answer(other),
    }
}

/// What Azure and Kubernetes answer in this benchmark: everything succeeds.
pub fn answer(command: &wit::Command) -> wit::Outcome {
    match command {
        wit::Command::ReadNrp => nrp_in_sync(),
        wit::Command::ReadArm => arm_in_sync(),
        wit::Command::PutPublicIp(ip) => wit::Outcome::PublicIpAddress(format!("20.1.0.{}", ip.name.len())),
        _ => wit::Outcome::Ok,
    }
}

/// Answers every command of `step` through `complete` until the tracker has nothing more to
/// send; returns how many commands it answered.
pub fn settle(step: wit::Step, complete: impl FnMut(&[(u64, wit::Outcome)]) -> wit::Step) -> usize {
    settle_commands(step, complete).len()
}

/// [`settle`], returning the commands answered.
pub fn settle_commands(
    step: wit::Step,
    complete: impl FnMut(&[(u64, wit::Outcome)]) -> wit::Step,
) -> Vec<wit::Command> {
    settle_answering(step, answer, complete)
}

/// [`settle_commands`] with other answers.
pub fn settle_answering(
    mut step: wit::Step,
    answer: impl Fn(&wit::Command) -> wit::Outcome,
    mut complete: impl FnMut(&[(u64, wit::Outcome)]) -> wit::Step,
) -> Vec<wit::Command> {
    let mut sent = Vec::new();
    while !step.commands.is_empty() {
        sent.extend(step.commands.iter().map(|c| c.command.clone()));
        let results: Vec<(u64, wit::Outcome)> = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = complete(&results);
    }
    sent
}

/// A pod of the Service in the middle goes not-ready (`round` even) or ready again (odd): one
/// endpoint change, which costs one address-location update.
pub fn endpoint_change(round: usize) -> wit::Observation {
    wit::Observation::SliceUpserted(slice(service_count() / 2, if round.is_multiple_of(2) { Some(7) } else { None }))
}

/// The line both benchmarks print above their table.
pub fn describe(state_bytes: usize) -> String {
    format!(
        "Cluster: {} nodes, {} ready pods, {} LoadBalancer Services; state {state_bytes} bytes.",
        node_count(),
        service_count() * PODS_PER_SERVICE,
        service_count()
    )
}
