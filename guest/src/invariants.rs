//! The model and checker behind the tracker's P1–P6 property tests (`properties.rs`) and the
//! `tracker` fuzz target (`fuzz-lib/`): an independent model of Kubernetes and Azure, the
//! harness that drives a [`Tracker`] against it, and the checks. Public behind the `invariants`
//! feature so that the fuzz crate runs the same checker; compiled for the crate's own tests too.
//!
//! It is longer than 800 lines because the model is written independently of the tracker on
//! purpose: its Kubernetes, its Azure and the checks share no code with what they check, and
//! splitting them would only spread one model over files.
//!
//! Property tests of the tracker (docs/upstream.md §j P1–P6) over random sequences of
//! Kubernetes events, injected Azure failures (before and after the change took effect, some
//! with a `Retry-After`, up to `u64::MAX`), restarts, state round trips and a host clock that
//! jumps forward and steps back, against an independent model of Kubernetes and Azure.
//!
//! * P1 — once quiet, NRP equals the ready-filtered Kubernetes state (and the tracker's mirror
//!   equals NRP);
//! * P2 — equal states give an empty sync: a quiet tracker sends nothing more;
//! * P3 — idempotence: seeing every object again changes nothing;
//! * P4 — the egress reference count is never negative and is zero exactly when no pod carries
//!   the identity: after every step it equals the model's count of pods carrying each identity;
//! * P5 — no service is unregistered while an NRP address references it;
//! * P6 — no address references a service NRP does not have registered (inbound or outbound).
//!
//! Egress pods share pod IPs with the endpoints, so addresses carry inbound and egress identities
//! together; two of the labels are registered Outbound services in NRP (somebody else's), one is
//! not (the tracker provisions it: public IP, NAT gateway, registration, and tears it down when
//! no pod carries it), one is reserved and one invalid. The model checks the outbound order:
//! a NAT gateway only on existing public IPs, a registration only with an existing, associated
//! NAT gateway, no NAT gateway or public IP deleted while in use, no foreign Outbound service
//! touched. An outbound identity of somebody else's that NRP still references when the
//! controller restarts with no pod carrying it is left alone by the new process (egress.rs): the
//! model leaves it out of P1 until a pod carries it again. One a tracker provisioned is found
//! again by its NAT gateway after a restart (start-up adoption) and torn down once no pod
//! carries it, so nothing of it is left behind.

use crate::config::Config;
use crate::difftracker::View;
use crate::model::*;
use crate::tracker::egress::finalizers::FINALIZER as POD_FINALIZER;
use crate::tracker::{FINALIZER, Tracker};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub const NS: &str = "shop";

/// The round-trip invariant, for every state a tracker can reach: its export imports, as the
/// same tracker, whose export is the same bytes (a fixed point); and, where the tracker's clock
/// is the host's (`clock_is_hosts`: it never saw the host's clock step back, after which it runs
/// ahead, while an imported tracker starts from the host's), the imported tracker's next step is
/// the original's. Every path that moves state goes through this import: a hot swap, and the
/// rebuild after a trap from the last checkpoint. Returns the imported tracker.
pub fn assert_round_trip(tracker: &Tracker, config: &Config, now: u64, clock_is_hosts: bool) -> Tracker {
    let (version, payload) = tracker.export_state();
    let imported = Tracker::import_state(config.clone(), version, &payload)
        .unwrap_or_else(|e| panic!("a state the tracker exported does not import: {e:?}"));
    assert_eq!(&imported, tracker, "import(export(state)) is the same state");
    assert_eq!(imported.export_state(), (version, payload), "export is a fixed point");
    if clock_is_hosts {
        let (mut original, mut copy) = (tracker.clone(), imported.clone());
        assert_eq!(copy.tick(now), original.tick(now), "the imported tracker's next step is the original's");
    }
    imported
}

/// One step of a property run: a Kubernetes event, injected failures, time, a restart or a
/// state round trip.
#[derive(Clone, Debug)]
pub enum Op {
    Node {
        node: u8,
        variant: u8,
    },
    DeleteNode {
        node: u8,
    },
    Service {
        service: u8,
        local: bool,
        port: u16,
    },
    DeleteService {
        service: u8,
    },
    Slice {
        slice: u8,
        owner: u8,
        endpoints: Vec<(u8, u8, Option<bool>)>,
    },
    DeleteSlice {
        slice: u8,
    },
    /// One endpoint of a slice turns ready or not-ready: the everyday small update.
    ToggleReady {
        slice: u8,
        endpoint: u8,
    },
    /// An egress pod (same pod IPs as the endpoints) is created or changed.
    EgressPod {
        pod: u8,
        label: u8,
        node: u8,
        phase: u8,
    },
    DeleteEgressPod {
        pod: u8,
    },
    Fail {
        count: u8,
        after: bool,
        status: u16,
        /// Up to `u64::MAX`: the host's reading of an absurd `Retry-After`.
        retry_after_ms: Option<u64>,
    },
    Advance {
        ms: u32,
    },
    /// The host's clock steps back.
    StepBack {
        ms: u32,
    },
    Restart,
    RoundTrip,
}

#[derive(Clone, Debug)]
pub struct ServiceObject {
    pub uid: String,
    pub local: bool,
    pub port: u16,
    pub deleting: bool,
    pub finalizers: BTreeSet<String>,
    pub ingress: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub after: bool,
    pub status: u16,
    pub retry_after_ms: Option<u64>,
}

/// A slice in the model: its Service, and `(pod, node, ready)` per endpoint.
pub type ModelSlice = (String, Vec<(u8, u8, Option<bool>)>);

/// Egress labels: two registered Outbound services (one written in upper case), one NRP does not
/// have, the reserved one, an invalid one, and none (the label taken away).
pub const LABELS: [Option<&str>; 6] =
    [Some("egress-a"), Some("EGRESS-B"), Some("egress-c"), Some("default-natgw"), Some("bad label"), None];
/// The Outbound services NRP has registered (not by this controller: that is later work).
pub const OUTBOUND: [&str; 2] = ["egress-a", "egress-b"];
pub const PHASES: [&str; 4] = ["Running", "Pending", "Succeeded", "Failed"];

/// An egress pod in the model.
#[derive(Clone, Debug)]
pub struct EgressPod {
    pub label: Option<&'static str>,
    pub host_ip: String,
    pub phase: &'static str,
    /// It holds the pod finalizer.
    pub finalizer: bool,
    /// Deleted, held by the finalizer.
    pub deleting: bool,
    /// The identities it carried since it last lost the finalizer: what its release waits for.
    pub carried: BTreeSet<String>,
}

impl EgressPod {
    /// The identity the pod carries, by the rules of docs/upstream.md §d.2 stated again.
    pub fn carries(&self) -> Option<String> {
        self.named().filter(|_| !self.deleting && matches!(self.phase, "Running" | "Pending"))
    }

    /// The identity its label names, whatever its phase.
    pub fn named(&self) -> Option<String> {
        let identity = self.label?.to_ascii_lowercase();
        ["egress-a", "egress-b", "egress-c"].contains(&identity.as_str()).then_some(identity)
    }
}

/// Kubernetes and Azure as the tracker should see them, written from the specs, not from the
/// tracker's code.
#[derive(Default)]
pub struct World {
    pub now: u64,
    pub generation: u32,
    pub nodes: BTreeMap<u8, u8>,
    pub services: BTreeMap<u8, ServiceObject>,
    /// Identities whose spec was admitted at least once (an ETP change keeps the old spec).
    pub ever_admitted: BTreeSet<String>,
    pub slices: BTreeMap<u8, ModelSlice>,
    pub pods: BTreeMap<u8, EgressPod>,
    /// Outbound identities a restarted controller found in NRP with no pod carrying them.
    pub orphaned: BTreeSet<String>,
    pub public_ips: BTreeMap<String, String>,
    pub load_balancers: BTreeMap<String, LoadBalancer>,
    pub registered: BTreeSet<String>,
    /// Outbound services registered by a tracker (beside [`OUTBOUND`], somebody else's), and
    /// those of them whose `publicNatGatewayId` is set.
    pub outbound_registered: BTreeSet<String>,
    pub outbound_linked: BTreeSet<String>,
    /// Egress public IPs a restart found without their NAT gateway (a teardown cut short between
    /// the two deletes): not provably the tracker's, so a new process leaves them.
    pub leftover_public_ips: BTreeSet<String>,
    pub nat_gateways: BTreeMap<String, NatGateway>,
    pub nrp: View,
    pub faults: VecDeque<Fault>,
    pub violations: Vec<String>,
    /// Observations the watchers will deliver next.
    pub pending: Vec<Observation>,
}

pub fn node_ip(node: u8, variant: u8) -> String {
    format!("10.0.{variant}.{}", node + 1)
}

pub fn pod_ip(pod: u8) -> String {
    format!("10.244.0.{}", pod + 1)
}

pub fn uid_of(service: u8, generation: u32) -> String {
    format!("00000000-0000-4000-8000-{:08x}{:04x}", generation, service)
}

impl World {
    pub fn service_record(&self, index: u8) -> Service {
        let s = &self.services[&index];
        Service {
            uid: s.uid.to_ascii_uppercase(),
            namespace: NS.into(),
            name: format!("svc-{index}"),
            service_type: Some("LoadBalancer".into()),
            external_traffic_policy: Some(if s.local { "Local" } else { "Cluster" }.into()),
            ports: vec![ServicePort {
                name: None,
                protocol: Some("TCP".into()),
                port: i32::from(s.port),
                target_port: Some(TargetPort::Number(8080)),
                node_port: None,
            }],
            finalizers: s.finalizers.iter().cloned().collect(),
            deleting: s.deleting,
            ingress_ips: s.ingress.clone(),
            ..Service::default()
        }
    }

    pub fn node_record(&self, node: u8) -> Node {
        Node { name: format!("node-{node}"), internal_ips: vec![node_ip(node, self.nodes[&node])] }
    }

    pub fn slice_record(&self, slice: u8) -> EndpointSlice {
        let (owner, endpoints) = &self.slices[&slice];
        EndpointSlice {
            namespace: NS.into(),
            name: format!("slice-{slice}"),
            owner_service_uid: Some(owner.clone()),
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(pod, node, ready)| Endpoint {
                    addresses: vec![pod_ip(*pod)],
                    node_name: Some(format!("node-{node}")),
                    ready: *ready,
                })
                .collect(),
            deleting: false,
        }
    }

    pub fn pod_record(&self, pod: u8) -> Pod {
        let p = &self.pods[&pod];
        Pod {
            namespace: NS.into(),
            name: format!("egress-{pod}"),
            uid: format!("pod-uid-{pod}"),
            egress_label: p.label.map(Into::into),
            phase: Some(p.phase.into()),
            pod_ips: vec![pod_ip(pod)],
            host_ips: vec![p.host_ip.clone()],
            deleting: p.deleting,
            finalizers: if p.finalizer { vec![POD_FINALIZER.into()] } else { vec![] },
            ..Pod::default()
        }
    }

    /// Identity → how many pods carry it (P4's reference).
    pub fn carried(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for identity in self.pods.values().filter_map(EgressPod::carries) {
            *counts.entry(identity).or_insert(0) += 1;
        }
        counts
    }

    /// Everything, as the watchers list it at start-up.
    pub fn lists(&self) -> Vec<Observation> {
        let mut all: Vec<Observation> =
            self.nodes.keys().map(|n| Observation::NodeUpserted(self.node_record(*n))).collect();
        all.extend(self.services.keys().map(|s| Observation::ServiceUpserted(self.service_record(*s))));
        all.extend(self.slices.keys().map(|s| Observation::SliceUpserted(self.slice_record(*s))));
        all.extend(self.pods.keys().map(|p| Observation::PodUpserted(self.pod_record(*p))));
        all.push(Observation::ListsComplete);
        all
    }

    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Node { node, variant } => {
                self.nodes.insert(*node, *variant);
                let record = self.node_record(*node);
                self.pending.push(Observation::NodeUpserted(record));
            }
            Op::DeleteNode { node } => {
                if self.nodes.remove(node).is_some() {
                    self.pending.push(Observation::NodeDeleted(format!("node-{node}")));
                }
            }
            Op::Service { service, local, port } => {
                let entry = self.services.get(service).cloned();
                let object = match entry {
                    Some(existing) if !existing.deleting => ServiceObject { local: *local, port: *port, ..existing },
                    Some(_) => return, // a deleting Service cannot be edited back to life
                    None => {
                        self.generation += 1;
                        ServiceObject {
                            uid: uid_of(*service, self.generation),
                            local: *local,
                            port: *port,
                            deleting: false,
                            finalizers: BTreeSet::new(),
                            ingress: Vec::new(),
                        }
                    }
                };
                if object.local {
                    self.ever_admitted.insert(object.uid.clone());
                }
                self.services.insert(*service, object);
                self.pending.push(Observation::ServiceUpserted(self.service_record(*service)));
            }
            Op::DeleteService { service } => {
                let Some(object) = self.services.get_mut(service) else { return };
                object.deleting = true;
                self.settle_deletion(*service);
            }
            Op::Slice { slice, owner, endpoints } => {
                // A slice lists a pod once (other slices may still list it elsewhere).
                let mut seen = BTreeSet::new();
                let endpoints: Vec<_> = endpoints.iter().filter(|(pod, _, _)| seen.insert(*pod)).cloned().collect();
                let owner_uid = self.services.get(owner).map(|s| s.uid.clone()).unwrap_or_else(|| uid_of(*owner, 0));
                self.slices.insert(*slice, (owner_uid, endpoints));
                self.pending.push(Observation::SliceUpserted(self.slice_record(*slice)));
            }
            Op::ToggleReady { slice, endpoint } => {
                let Some((_, endpoints)) = self.slices.get_mut(slice) else { return };
                let Some(target) = endpoints.get_mut(usize::from(*endpoint)) else { return };
                target.2 = Some(target.2 == Some(false));
                self.pending.push(Observation::SliceUpserted(self.slice_record(*slice)));
            }
            Op::DeleteSlice { slice } => {
                if self.slices.remove(slice).is_some() {
                    self.pending.push(Observation::SliceDeleted(ObjectKey::new(NS, &format!("slice-{slice}"))));
                }
            }
            Op::EgressPod { pod, label, node, phase } => {
                // The kubelet publishes the host IP the pod's node has now; a later change of the
                // node's IP reaches the pod only when the pod is updated.
                let host_ip = node_ip(*node, self.nodes.get(node).copied().unwrap_or(0));
                let (finalizer, mut carried) = match self.pods.get(pod) {
                    Some(existing) if existing.deleting => return, // a deleting pod is not edited back to life
                    Some(existing) => (existing.finalizer, existing.carried.clone()),
                    None => (false, BTreeSet::new()),
                };
                let object = EgressPod {
                    label: LABELS[usize::from(*label)],
                    host_ip,
                    phase: PHASES[usize::from(*phase)],
                    finalizer,
                    deleting: false,
                    carried: BTreeSet::new(),
                };
                if let Some(identity) = object.carries() {
                    self.orphaned.remove(&identity);
                    carried.insert(identity);
                }
                self.pods.insert(*pod, EgressPod { carried, ..object });
                self.pending.push(Observation::PodUpserted(self.pod_record(*pod)));
            }
            Op::DeleteEgressPod { pod } => {
                let Some(object) = self.pods.get_mut(pod) else { return };
                if object.finalizer {
                    object.deleting = true;
                    self.pending.push(Observation::PodUpserted(self.pod_record(*pod)));
                } else {
                    self.pods.remove(pod);
                    self.pending.push(Observation::PodDeleted(ObjectKey::new(NS, &format!("egress-{pod}"))));
                }
            }
            Op::Fail { count, after, status, retry_after_ms } => {
                let fault = Fault { after: *after, status: *status, retry_after_ms: *retry_after_ms };
                self.faults.extend((0..*count).map(|_| fault));
            }
            Op::Advance { ms } => self.now += u64::from(*ms),
            Op::StepBack { ms } => self.now -= u64::from(*ms),
            Op::Restart | Op::RoundTrip => {}
        }
    }

    /// The API server removes a deleting object once its finalizers are gone.
    pub fn settle_deletion(&mut self, service: u8) {
        let Some(object) = self.services.get(&service) else { return };
        if object.deleting && object.finalizers.is_empty() {
            self.services.remove(&service);
            self.pending.push(Observation::ServiceDeleted(ObjectKey::new(NS, &format!("svc-{service}"))));
        } else {
            self.pending.push(Observation::ServiceUpserted(self.service_record(service)));
        }
    }

    /// The pod finalizer. A release is checked against NRP: no address of the pod may still
    /// map an identity it carried, and an identity no pod carries any more must have no NAT
    /// gateway left (the last pod waits for the teardown).
    fn set_pod_finalizer(&mut self, pod: &ObjectRef, present: bool) -> Outcome {
        let index = (0..u8::MAX)
            .find(|i| pod.name.as_str() == format!("egress-{i}") && pod.uid.as_str() == format!("pod-uid-{i}"));
        let Some(index) = index.filter(|i| self.pods.contains_key(i)) else { return Self::failed(404, "NotFound") };
        if present {
            let object = self.pods.get_mut(&index).expect("found");
            if object.deleting {
                return Self::failed(422, "Invalid");
            }
            if !object.finalizer {
                object.finalizer = true;
                self.pending.push(Observation::PodUpserted(self.pod_record(index)));
            }
            return Outcome::Ok;
        }
        let carried_now = self.carried();
        let object = &self.pods[&index];
        let address = pod_ip(index);
        for identity in &object.carried {
            if self.nrp.values().filter_map(|a| a.get(&address)).any(|ids| ids.contains(identity)) {
                self.violations.push(format!("egress-{index} released while NRP maps {address} to {identity}"));
            }
            if !carried_now.contains_key(identity) && self.nat_gateways.contains_key(identity) {
                self.violations
                    .push(format!("egress-{index}, the last pod of {identity}, released before its teardown"));
            }
        }
        let object = self.pods.get_mut(&index).expect("found");
        object.carried = object.carries().into_iter().collect();
        if object.deleting {
            self.pods.remove(&index);
            self.pending.push(Observation::PodDeleted(ObjectKey::new(NS, &format!("egress-{index}"))));
        } else if std::mem::replace(&mut object.finalizer, false) {
            self.pending.push(Observation::PodUpserted(self.pod_record(index)));
        }
        Outcome::Ok
    }

    pub fn service_index(&self, uid: &str) -> Option<u8> {
        self.services.iter().find(|(_, s)| s.uid.eq_ignore_ascii_case(uid)).map(|(i, _)| *i)
    }

    pub fn referenced(&self, service: &str) -> bool {
        self.nrp.values().flat_map(|a| a.values()).any(|s| s.contains(service))
    }

    pub fn failed(status: u16, code: &str) -> Outcome {
        Self::failed_retry_after(status, code, None)
    }

    pub fn failed_retry_after(status: u16, code: &str, retry_after_ms: Option<u64>) -> Outcome {
        Outcome::Failed(Failure { status, code: Some(code.into()), retry_after_ms, message: code.into() })
    }

    pub fn execute(&mut self, command: &Command) -> Outcome {
        let fault = match command {
            Command::EmitEvent(_) => None,
            _ => self.faults.pop_front(),
        };
        if let Some(Fault { after: false, status, retry_after_ms }) = fault {
            return Self::failed_retry_after(status, "Injected", retry_after_ms);
        }
        let outcome = self.carry_out(command);
        match fault {
            Some(Fault { status, retry_after_ms, .. }) => {
                Self::failed_retry_after(status, "InjectedAfterApplying", retry_after_ms)
            }
            None => outcome,
        }
    }

    pub fn carry_out(&mut self, command: &Command) -> Outcome {
        match command {
            Command::EmitEvent(_) => Outcome::Ok,
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState {
                services: self
                    .registered
                    .iter()
                    .map(|s| (s.as_str(), "Inbound"))
                    .chain(OUTBOUND.iter().map(|s| (*s, "Outbound")))
                    .chain(self.outbound_registered.iter().map(|s| (s.as_str(), "Outbound")))
                    .map(|(name, kind)| NrpService {
                        name: name.into(),
                        service_type: kind.into(),
                        backend_pools: vec![],
                        is_default: false,
                    })
                    .collect(),
                locations: self
                    .nrp
                    .iter()
                    .map(|(l, a)| NrpListedLocation {
                        location: l.clone(),
                        addresses: a
                            .iter()
                            .map(|(a, s)| NrpAddress { address: a.clone(), services: s.iter().cloned().collect() })
                            .collect(),
                    })
                    .collect(),
            }),
            Command::ReadArm => Outcome::ArmInventory(ArmInventory {
                public_ips: self
                    .public_ips
                    .iter()
                    .map(|(name, address)| ListedPublicIp {
                        name: name.clone(),
                        version: IpVersion::Ipv4,
                        address: Some(address.clone()),
                        as_put: true,
                    })
                    .collect(),
                load_balancers: self
                    .load_balancers
                    .iter()
                    .map(|(name, lb)| ListedLoadBalancer { name: name.clone(), shape: Some(lb.clone()) })
                    .collect(),
                nat_gateways: self
                    .nat_gateways
                    .values()
                    .map(|n| ListedNatGateway {
                        name: n.name.clone(),
                        public_ips: n.public_ips.clone(),
                        public_ips_v6: n.public_ips_v6.clone(),
                        associated: n.associated,
                        as_put: true,
                    })
                    .collect(),
            }),
            Command::UpdateServices(requests) => {
                for request in requests {
                    if request.service_type == NrpServiceType::Outbound {
                        if let Err(outcome) = self.update_outbound(request) {
                            return outcome;
                        }
                        continue;
                    }
                    if request.is_delete {
                        if !self.registered.contains(&request.name) {
                            return Self::failed(404, "NotFound");
                        }
                        if self.referenced(&request.name) {
                            self.violations.push(format!("P5: unregistered {} while referenced", request.name));
                            return Self::failed(400, "ServiceWithOverlayMappingsCannotBeDeleted");
                        }
                        self.registered.remove(&request.name);
                    } else {
                        for pool in &request.backend_pools {
                            if !self.load_balancers.contains_key(&pool.load_balancer) {
                                self.violations.push(format!("registered {} before its load balancer", request.name));
                            }
                        }
                        self.registered.insert(request.name.clone());
                    }
                }
                Outcome::Ok
            }
            Command::UpdateAddressLocations(locations) => {
                let unique: BTreeSet<&str> = locations.iter().map(|l| l.location.as_str()).collect();
                if unique.len() != locations.len() {
                    self.violations.push("duplicate location in one request".into());
                    return Self::failed(400, "DuplicateLocationsInRequest");
                }
                for service in locations.iter().flat_map(|l| &l.addresses).flat_map(|a| &a.services) {
                    if !self.registered.contains(service)
                        && !OUTBOUND.contains(&service.as_str())
                        && !self.outbound_registered.contains(service)
                    {
                        self.violations.push(format!("P6: address references unregistered {service}"));
                        return Self::failed(400, "ServiceNotRegistered");
                    }
                }
                for location in locations {
                    if location.addresses.is_empty() {
                        self.nrp.remove(&location.location);
                        continue;
                    }
                    let entry = self.nrp.entry(location.location.clone()).or_default();
                    if location.action == UpdateAction::FullUpdate {
                        entry.clear();
                    }
                    for address in &location.addresses {
                        if address.services.is_empty() {
                            entry.remove(&address.address);
                        } else {
                            entry.insert(address.address.clone(), address.services.iter().cloned().collect());
                        }
                    }
                    if entry.is_empty() {
                        self.nrp.remove(&location.location);
                    }
                }
                Outcome::Ok
            }
            Command::PutPublicIp(ip) => {
                let next = self.public_ips.len() + 1;
                let address =
                    self.public_ips.entry(ip.name.to_string()).or_insert_with(|| format!("20.0.0.{next}")).clone();
                Outcome::PublicIpAddress(address)
            }
            Command::PutNatGateway(nat) => {
                let ips = nat.public_ips.iter().chain(&nat.public_ips_v6);
                if let Some(missing) = ips.clone().find(|ip| !self.public_ips.contains_key(*ip)) {
                    self.violations.push(format!("NAT gateway {} put before its public IP {missing}", nat.name));
                    return Self::failed(400, "InvalidResourceReference");
                }
                if OUTBOUND.contains(&nat.name.as_str()) {
                    self.violations.push(format!("a NAT gateway for somebody else's {}", nat.name));
                }
                if !nat.associated && self.outbound_linked.contains(&nat.name) {
                    return Self::failed(400, "NatGatewayInUseByServiceGateway");
                }
                self.nat_gateways.insert(nat.name.clone(), nat.clone());
                Outcome::Ok
            }
            Command::PutLoadBalancer(lb) => {
                if !self.public_ips.contains_key(lb.public_ip.as_str()) {
                    return Self::failed(400, "InvalidResourceReference");
                }
                self.load_balancers.insert(lb.name.to_string(), lb.clone());
                Outcome::Ok
            }
            Command::DeleteResource(resource) => {
                let removed = match resource.kind {
                    ResourceKind::LoadBalancer => self.load_balancers.remove(&resource.name).is_some(),
                    ResourceKind::PublicIp => {
                        let owner = resource.name.trim_end_matches("-pip");
                        if self.load_balancers.contains_key(owner) {
                            self.violations.push(format!("deleted public IP {} still used by its LB", resource.name));
                        }
                        let users = self.nat_gateways.values();
                        if users
                            .clone()
                            .any(|n| n.public_ips.iter().chain(&n.public_ips_v6).any(|ip| *ip == resource.name))
                        {
                            self.violations
                                .push(format!("deleted public IP {} still used by a NAT gateway", resource.name));
                            return Self::failed(400, "PublicIPAddressInUse");
                        }
                        self.public_ips.remove(&resource.name).is_some()
                    }
                    ResourceKind::NatGateway => {
                        if self.outbound_registered.contains(&resource.name) {
                            self.violations.push(format!("deleted NAT gateway {} while registered", resource.name));
                            return Self::failed(400, "InUseNatGatewayCannotBeDeleted");
                        }
                        self.nat_gateways.remove(&resource.name).is_some()
                    }
                };
                if removed { Outcome::Ok } else { Self::failed(404, "NotFound") }
            }
            Command::PatchServiceStatus { service, ingress_ips } => {
                let Some(index) = self.service_index(&service.uid) else { return Self::failed(404, "NotFound") };
                self.services.get_mut(&index).expect("found").ingress = ingress_ips.clone();
                self.pending.push(Observation::ServiceUpserted(self.service_record(index)));
                Outcome::Ok
            }
            Command::SetFinalizer { service, present, .. } if service.kind.as_str() == "Pod" => {
                self.set_pod_finalizer(service, *present)
            }
            Command::SetFinalizer { service, finalizer, present } => {
                let Some(index) = self.service_index(&service.uid) else { return Self::failed(404, "NotFound") };
                let object = self.services.get_mut(&index).expect("found");
                if *present {
                    if object.deleting {
                        // The API server refuses new finalizers on a deleting object.
                        return Self::failed(422, "Invalid");
                    }
                    object.finalizers.insert(finalizer.clone());
                } else {
                    object.finalizers.remove(finalizer);
                }
                self.settle_deletion(index);
                Outcome::Ok
            }
        }
    }

    /// An Outbound entry of `updateServices`: somebody else's are never touched; a registration
    /// names an existing, associated NAT gateway; an unregister waits for the drain (P5).
    fn update_outbound(&mut self, request: &NrpServiceRequest) -> Result<(), Outcome> {
        let name = &request.name;
        if OUTBOUND.contains(&name.as_str()) {
            self.violations.push(format!("updated somebody else's Outbound service {name}"));
        }
        if request.is_delete {
            if !self.outbound_registered.contains(name) {
                return Err(Self::failed(404, "NotFound"));
            }
            if self.referenced(name) {
                self.violations.push(format!("P5: unregistered {name} while referenced"));
                return Err(Self::failed(400, "ServiceWithOverlayMappingsCannotBeDeleted"));
            }
            self.outbound_registered.remove(name);
            self.outbound_linked.remove(name);
            return Ok(());
        }
        match &request.public_nat_gateway {
            Some(nat) => {
                if !self.nat_gateways.get(nat).is_some_and(|n| n.associated) {
                    self.violations.push(format!("registered {name} before its NAT gateway {nat} was associated"));
                    return Err(Self::failed(400, "InvalidResourceReference"));
                }
                self.outbound_registered.insert(name.clone());
                self.outbound_linked.insert(name.clone());
            }
            None if self.outbound_registered.contains(name) => {
                self.outbound_linked.remove(name);
            }
            None => return Err(Self::failed(404, "NotFound")),
        }
        Ok(())
    }

    /// Identities pods carry that the model expects a tracker to have provisioned (not somebody
    /// else's): each registered with its NAT gateway once quiet.
    pub fn expected_outbound(&self) -> BTreeSet<String> {
        let carried = self.pods.values().filter_map(EgressPod::carries);
        carried.filter(|id| !OUTBOUND.contains(&id.as_str())).collect()
    }

    /// NRP as it must be once quiet: every ready endpoint of every provisioned Service.
    pub fn expected_nrp(&self) -> View {
        let mut expected: View = BTreeMap::new();
        for uid in self.expected_registered() {
            for (owner, endpoints) in self.slices.values() {
                if *owner != uid {
                    continue;
                }
                for (pod, node, ready) in endpoints {
                    let Some(variant) = self.nodes.get(node) else { continue };
                    if *ready == Some(false) {
                        continue;
                    }
                    expected
                        .entry(node_ip(*node, *variant))
                        .or_default()
                        .entry(pod_ip(*pod))
                        .or_default()
                        .insert(uid.clone());
                }
            }
        }
        for (pod, object) in &self.pods {
            let Some(identity) = object.carries() else { continue };
            expected.entry(object.host_ip.clone()).or_default().entry(pod_ip(*pod)).or_default().insert(identity);
        }
        expected
    }

    /// NRP (or a view of it) without the orphaned outbound identities, which nobody manages.
    pub fn without_orphans(&self, view: &View) -> View {
        let mut stripped = BTreeMap::new();
        for (location, addresses) in view {
            for (address, services) in addresses {
                let kept: BTreeSet<String> = services.difference(&self.orphaned).cloned().collect();
                if !kept.is_empty() {
                    stripped.entry(location.clone()).or_insert_with(BTreeMap::new).insert(address.clone(), kept);
                }
            }
        }
        stripped
    }

    pub fn expected_registered(&self) -> BTreeSet<String> {
        self.services
            .values()
            .filter(|s| !s.deleting && self.ever_admitted.contains(&s.uid))
            .map(|s| s.uid.clone())
            .collect()
    }
}

/// A tracker driven against a [`World`]: every command it issues is carried out by the world.
pub struct Harness {
    pub world: World,
    pub tracker: Tracker,
    pub config: Config,
    /// The tracker's clock is the world's: it has not seen the clock step back since it was
    /// created or imported.
    clock_is_hosts: bool,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A tracker in CLB mode against an empty world, its initial lists delivered.
    pub fn new() -> Self {
        let config =
            Config { backend_pool_type: "podIP".into(), load_balancer_sku: "standardV2".into(), ..Config::default() };
        // A wall clock's time, so that the clock can step back.
        let world = World { now: 1_700_000_000_000, ..World::default() };
        let mut harness =
            Self { world, tracker: Tracker::create(config.clone()).unwrap(), config, clock_is_hosts: true };
        harness.deliver(vec![Observation::ListsComplete]);
        harness
    }

    /// Feeds observations and runs every command the tracker issues until it issues none.
    pub fn deliver(&mut self, observations: Vec<Observation>) {
        let mut step = self.tracker.observe(self.world.now, observations);
        for _ in 0..10_000 {
            if step.commands.is_empty() {
                let pending = std::mem::take(&mut self.world.pending);
                if pending.is_empty() {
                    return;
                }
                step = self.tracker.observe(self.world.now, pending);
                continue;
            }
            let outcomes: Vec<(u64, Outcome)> =
                step.commands.iter().map(|issued| (issued.id, self.world.execute(&issued.command))).collect();
            step = self.tracker.complete(self.world.now, outcomes);
            if let Some(wake) = step.wake_at_ms.filter(|w| *w <= self.world.now) {
                let more = self.tracker.tick(wake.max(self.world.now));
                step.commands.extend(more.commands);
            }
        }
        panic!("the tracker kept issuing commands");
    }

    pub fn run(&mut self, op: &Op) {
        match op {
            Op::Restart => {
                // A new process: empty state, rebuilt from the lists and a read of NRP. It no
                // longer knows the admitted spec of a Service that is rejected now, unless NRP
                // shows the Service live (then it keeps serving).
                let world = &mut self.world;
                let local_now: BTreeSet<String> =
                    world.services.values().filter(|s| s.local).map(|s| s.uid.clone()).collect();
                let registered = world.registered.clone();
                world.ever_admitted.retain(|uid| local_now.contains(uid) || registered.contains(uid));
                let carried = world.carried();
                let referenced: BTreeSet<String> =
                    world.nrp.values().flat_map(|a| a.values()).flatten().cloned().collect();
                for identity in OUTBOUND.iter().filter(|id| referenced.contains(**id) && !carried.contains_key(**id)) {
                    world.orphaned.insert((*identity).to_owned());
                }
                let nat_gateways = &world.nat_gateways;
                let leftover = world.public_ips.keys().filter(|name| {
                    name.starts_with("egress-")
                        && !nat_gateways.contains_key(name.trim_end_matches("-v6").trim_end_matches("-pip"))
                });
                world.leftover_public_ips.extend(leftover.cloned().collect::<Vec<_>>());
                // A new process knows what a held pod carried only from its label as it is now.
                for pod in world.pods.values_mut() {
                    let named = pod.named();
                    pod.carried.retain(|id| Some(id) == named.as_ref());
                }
                self.tracker = Tracker::create(self.config.clone()).unwrap();
                self.clock_is_hosts = true;
                self.world.pending.clear();
                let lists = self.world.lists();
                self.deliver(lists);
            }
            Op::RoundTrip => {
                self.tracker = assert_round_trip(&self.tracker, &self.config, self.world.now, self.clock_is_hosts);
                self.clock_is_hosts = true;
            }
            _ => {
                self.clock_is_hosts &= !matches!(op, Op::StepBack { .. });
                self.world.apply(op);
                let pending = std::mem::take(&mut self.world.pending);
                self.deliver(pending);
                let step = self.tracker.tick(self.world.now);
                self.deliver_step(step);
            }
        }
    }

    pub fn deliver_step(&mut self, step: Step) {
        if step.commands.is_empty() {
            return;
        }
        let outcomes: Vec<(u64, Outcome)> =
            step.commands.iter().map(|issued| (issued.id, self.world.execute(&issued.command))).collect();
        let next = self.tracker.complete(self.world.now, outcomes);
        self.deliver_step(next);
        let pending = std::mem::take(&mut self.world.pending);
        if !pending.is_empty() {
            self.deliver(pending);
        }
    }

    /// Faults end; time passes until the tracker has nothing left to do.
    pub fn settle(&mut self) {
        self.world.faults.clear();
        for _ in 0..500 {
            let step = self.tracker.tick(self.world.now);
            let wake = step.wake_at_ms;
            self.deliver_step(step);
            if self.tracker.is_quiet() && self.world.pending.is_empty() {
                return;
            }
            self.world.now =
                wake.filter(|w| *w > self.world.now).unwrap_or(self.world.now + 1_000).min(self.world.now + 60_000);
        }
        panic!("the tracker did not settle: {:#?}", self.tracker);
    }

    /// The round-trip invariant ([`assert_round_trip`]) at this step, the tracker left as it is.
    pub fn check_round_trip(&self) {
        assert_round_trip(&self.tracker, &self.config, self.world.now, self.clock_is_hosts);
    }

    /// P4, at every step: the tracker counts exactly the pods that carry each identity.
    pub fn check_ref_counts(&self) {
        let egress = self.tracker.egress();
        assert_eq!(egress.ref_counts(), &self.world.carried(), "P4: the reference counts");
        assert_eq!(egress.recount(), *egress.ref_counts(), "P4: the counts agree with the pods");
    }

    pub fn check(&mut self) {
        assert!(self.world.violations.is_empty(), "ordering violated: {:?}", self.world.violations);
        let expected = self.world.expected_registered();
        assert_eq!(self.world.registered, expected, "registered services");
        assert_eq!(
            self.world.without_orphans(&self.world.nrp),
            self.world.expected_nrp(),
            "P1: NRP equals the ready Kubernetes state"
        );
        assert_eq!(self.tracker.nrp_view(), self.world.nrp, "the mirror equals NRP");
        let ours = self.world.expected_outbound();
        assert_eq!(
            self.world.outbound_registered, ours,
            "the egress identities pods carry are registered, and only those"
        );
        assert_eq!(self.world.outbound_linked, ours, "each with its NAT gateway");
        let nat_gateways: BTreeSet<String> = self.world.nat_gateways.keys().cloned().collect();
        assert_eq!(nat_gateways, ours, "a NAT gateway exactly for each egress identity a pod carries");
        let egress_ips: BTreeSet<&String> = self.world.public_ips.keys().filter(|n| n.starts_with("egress-")).collect();
        let wanted: BTreeSet<String> = ours.iter().map(|id| format!("{id}-pip")).collect();
        let leftover = &self.world.leftover_public_ips;
        let stray: Vec<&&String> =
            egress_ips.iter().filter(|n| !wanted.contains(**n) && !leftover.contains(**n)).collect();
        assert!(stray.is_empty(), "egress public IPs of no carried identity: {stray:?}");
        assert!(wanted.iter().all(|n| egress_ips.contains(n)), "a public IP for each of them");
        let lbs: BTreeSet<String> = expected.iter().cloned().collect();
        assert_eq!(
            self.world.load_balancers.keys().cloned().collect::<BTreeSet<_>>(),
            lbs,
            "one load balancer per provisioned Service"
        );
        for (index, object) in &self.world.services {
            if expected.contains(&object.uid) && object.local {
                assert!(object.finalizers.contains(FINALIZER), "svc-{index} holds the finalizer");
                let ip = &self.world.public_ips[&format!("{}-pip", object.uid)];
                assert_eq!(object.ingress, vec![ip.clone()], "svc-{index} shows its public IP");
            }
            assert!(!object.deleting, "svc-{index} was deleted but its finalizer is still held");
        }
        for (index, pod) in &self.world.pods {
            assert!(!pod.deleting, "egress-{index} was deleted but its finalizer is still held");
            if pod.carries().is_some() {
                assert!(pod.finalizer, "egress-{index} carries an identity and holds the pod finalizer");
            }
        }
        // P2: a quiet tracker sends nothing more.
        let step = self.tracker.tick(self.world.now);
        assert!(step.commands.is_empty(), "P2: {:?}", step.commands);
        // P3: every object seen again changes nothing.
        let again = self.world.lists();
        let step = self.tracker.observe(self.world.now, again);
        let writes: Vec<&Command> =
            step.commands.iter().map(|c| &c.command).filter(|c| !matches!(c, Command::EmitEvent(_))).collect();
        assert!(writes.is_empty(), "P3: {writes:?}");
    }
}
