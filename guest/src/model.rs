//! The records the logic reads, as the host copied them from Kubernetes.
//!
//! They mirror the WIT records one to one; enumerations stay the strings the user wrote so that
//! the logic, not the host, decides what an unknown value means.

use crate::name::Name;
use serde::{Deserialize, Serialize};

/// A Service's `spec.ports[].targetPort`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetPort {
    Number(i32),
    Name(String),
}

/// One entry of `spec.ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: i32,
    pub target_port: Option<TargetPort>,
    pub node_port: Option<i32>,
}

impl ServicePort {
    /// The protocol with the API server's default applied.
    pub fn protocol(&self) -> &str {
        self.protocol.as_deref().unwrap_or("TCP")
    }

    /// The backend port: `targetPort` when numeric, else `port` when absent. `None` for a named
    /// target port, which only the kubelet can resolve.
    pub fn backend_port(&self) -> Option<i32> {
        match &self.target_port {
            None => Some(self.port),
            Some(TargetPort::Number(n)) => Some(*n),
            Some(TargetPort::Name(_)) => None,
        }
    }
}

/// A Kubernetes Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub service_type: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub session_affinity: Option<String>,
    pub load_balancer_ip: Option<String>,
    pub load_balancer_class: Option<String>,
    pub ip_families: Vec<String>,
    pub ports: Vec<ServicePort>,
    pub annotations: Vec<(String, String)>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    pub ingress_ips: Vec<String>,
}

impl Service {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The identity NRP knows the Service by: its UID, lower-cased.
    pub fn identity(&self) -> String {
        self.uid.to_ascii_lowercase()
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub addresses: Vec<String>,
    pub node_name: Option<String>,
    pub ready: Option<bool>,
}

/// A discovery.k8s.io/v1 EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSlice {
    pub namespace: String,
    pub name: String,
    pub owner_service_uid: Option<String>,
    pub address_type: String,
    pub endpoints: Vec<Endpoint>,
    pub deleting: bool,
}

impl EndpointSlice {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// A Kubernetes Node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub internal_ips: Vec<String>,
}

/// A Kubernetes Pod, as far as egress reads it: only pods carrying the egress label (any value)
/// are watched.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The value of the label `kubernetes.azure.com/service-egress-gateway`, as written.
    pub egress_label: Option<String>,
    /// `status.phase` as written (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub phase: Option<String>,
    /// `status.podIPs`.
    pub pod_ips: Vec<String>,
    /// `status.podIP`.
    pub pod_ip: Option<String>,
    /// `status.hostIPs`.
    pub host_ips: Vec<String>,
    /// `status.hostIP`.
    pub host_ip: Option<String>,
    pub deleting: bool,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
}

impl Pod {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: "Pod".into(),
            namespace: Name::new(&self.namespace),
            name: Name::new(&self.name),
            uid: Name::new(&self.uid),
        }
    }
}

/// Namespace and name of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: Name,
    pub name: Name,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self { namespace: Name::new(namespace), name: Name::new(name) }
    }
}

/// A namespaced object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub kind: Name,
    pub namespace: Name,
    pub name: Name,
    pub uid: Name,
}

/// Something that happened in Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    ServiceUpserted(Service),
    ServiceDeleted(ObjectKey),
    SliceUpserted(EndpointSlice),
    SliceDeleted(ObjectKey),
    NodeUpserted(Node),
    NodeDeleted(String),
    /// A pod carrying the egress label was created or changed.
    PodUpserted(Pod),
    /// A pod left the API server, or stopped carrying the egress label.
    PodDeleted(ObjectKey),
    ListsComplete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub regarding: ObjectRef,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
}

/// How NRP applies the addresses listed for one location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateAction {
    PartialUpdate,
    FullUpdate,
}

/// A pod IP and the complete set of services it backs (empty: unbind).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpAddress {
    pub address: String,
    pub services: Vec<String>,
}

/// A node IP and the addresses to write under it (none: delete the location).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpLocation {
    pub location: String,
    pub action: UpdateAction,
    pub addresses: Vec<NrpAddress>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NrpServiceType {
    Inbound,
    Outbound,
}

/// A load balancer's backend pool, by names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PoolRef {
    pub load_balancer: String,
    pub pool: String,
}

/// One entry of `updateServices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpServiceRequest {
    pub name: String,
    pub service_type: NrpServiceType,
    pub backend_pools: Vec<PoolRef>,
    /// An Outbound service's NAT gateway: set to register it, `None` on a live Outbound request
    /// to clear it (the disassociation).
    pub public_nat_gateway: Option<String>,
    pub is_delete: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IpVersion {
    Ipv4,
    Ipv6,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicIp {
    pub name: Name,
    pub version: IpVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LbProtocol {
    Tcp,
    Udp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbRule {
    pub name: Name,
    pub protocol: LbProtocol,
    pub frontend_port: u16,
    pub backend_port: u16,
    pub idle_timeout_minutes: u8,
    pub enable_tcp_reset: bool,
}

/// A per-Service load balancer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadBalancer {
    pub name: Name,
    pub public_ip: Name,
    pub backend_pool: Name,
    pub rules: Vec<LbRule>,
}

/// An egress identity's NAT gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatGateway {
    pub name: String,
    pub public_ips: Vec<String>,
    pub public_ips_v6: Vec<String>,
    pub associated: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceKind {
    PublicIp,
    LoadBalancer,
    NatGateway,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRef {
    pub kind: ResourceKind,
    pub name: String,
}

/// Something the logic wants done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    EmitEvent(Event),
    ReadNrp,
    ReadArm,
    UpdateServices(Vec<NrpServiceRequest>),
    UpdateAddressLocations(Vec<NrpLocation>),
    PutPublicIp(PublicIp),
    PutLoadBalancer(LoadBalancer),
    PutNatGateway(NatGateway),
    DeleteResource(ResourceRef),
    PatchServiceStatus { service: ObjectRef, ingress_ips: Vec<String> },
    SetFinalizer { service: ObjectRef, finalizer: String, present: bool },
}

impl Command {
    /// Whether ARM counts it as a write (NRP's calls are POST actions through ARM): what its
    /// remaining-writes figure goes down by.
    pub fn writes_arm(&self) -> bool {
        matches!(
            self,
            Command::UpdateServices(_)
                | Command::UpdateAddressLocations(_)
                | Command::PutPublicIp(_)
                | Command::PutLoadBalancer(_)
                | Command::PutNatGateway(_)
                | Command::DeleteResource(_)
        )
    }
}

/// A command with the id its outcome refers to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issued {
    pub id: u64,
    pub command: Command,
}

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub status: u16,
    pub code: Option<String>,
    pub retry_after_ms: Option<u64>,
    pub message: String,
}

/// The host's code for a Kubernetes write refused because the object now has another UID.
pub const UID_MISMATCH: &str = "UIDMismatch";

impl Failure {
    /// Azure's code, else the HTTP status: how the figures name a failure.
    pub fn label(&self) -> String {
        match self.code.as_deref() {
            Some(code) if !code.is_empty() => code.to_owned(),
            _ => self.status.to_string(),
        }
    }

    /// The Kubernetes object a write was for is gone: the API server answered 404, or the
    /// host's UID guard refused the write because the name now holds another object (409
    /// `UIDMismatch`). Either way, what the write was to do to that object has nothing left to do.
    pub fn object_gone(&self) -> bool {
        self.status == 404 || (self.status == 409 && self.code.as_deref() == Some(UID_MISMATCH))
    }
}

/// A service as NRP lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpService {
    pub name: String,
    pub service_type: String,
    pub backend_pools: Vec<PoolRef>,
    pub is_default: bool,
}

/// A location as NRP lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpListedLocation {
    pub location: String,
    pub addresses: Vec<NrpAddress>,
}

/// Everything NRP holds for the cluster's service gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NrpState {
    pub services: Vec<NrpService>,
    pub locations: Vec<NrpListedLocation>,
}

/// A public IP address as ARM lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedPublicIp {
    pub name: String,
    pub version: IpVersion,
    pub address: Option<String>,
    /// SKU StandardV2, static, provisioned: what `PutPublicIp` makes.
    pub as_put: bool,
}

/// A load balancer as ARM lists it: `shape` is `None` when it holds what [`LoadBalancer`]
/// cannot say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedLoadBalancer {
    pub name: String,
    pub shape: Option<LoadBalancer>,
}

/// A NAT gateway as ARM lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedNatGateway {
    pub name: String,
    pub public_ips: Vec<String>,
    pub public_ips_v6: Vec<String>,
    /// Its `serviceGateway` is this cluster's.
    pub associated: bool,
    /// What `PutNatGateway` makes.
    pub as_put: bool,
}

/// The resource group's public IPs, load balancers and NAT gateways.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmInventory {
    pub public_ips: Vec<ListedPublicIp>,
    pub load_balancers: Vec<ListedLoadBalancer>,
    pub nat_gateways: Vec<ListedNatGateway>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok,
    PublicIpAddress(String),
    NrpSnapshot(NrpState),
    ArmInventory(ArmInventory),
    Failed(Failure),
}

/// What one call asks of the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub commands: Vec<Issued>,
    pub wake_at_ms: Option<u64>,
    /// Nothing in flight, nothing left to do but the periodic resync.
    pub idle: bool,
    /// Lines for the host's log, which the adapter sends through the `diagnostics` import (they
    /// are not part of the WIT `step`): what an operator may want to know that is neither a
    /// command nor an Event, e.g. a `Retry-After` the tracker did not honour in full. Computed
    /// from the inputs like everything else, so deterministic.
    pub logs: Vec<LogLine>,
}

/// The host's `now-ms`, made monotonic without freezing.
///
/// The host's clock may step back (a wall clock set back; another host's clock after a state
/// import). Time going back is taken to mean nothing: this clock goes on from the largest time
/// it has given, by as much as the host's clock advances, so after a step back of `d` it runs
/// `d` ahead of the host's. Deadlines kept in its time therefore neither come due again nor wait
/// `d` longer: a retry due in 2 s is still due in 2 s. (Keeping the largest `now` seen, a plain
/// `max`, would instead freeze time until the host's clock caught up, holding every retry and
/// read for `d`.) A step forward is taken as time that passed. Time that passed between the
/// last call and a step back is not counted: the clock cannot see it. Times handed back to the host
/// (`wake-at-ms`, `not-before-ms`) are turned back into its clock with [`Clock::to_host`].
///
/// It lives in memory only, never in exported state (whose bytes per version are fixed): a
/// fresh or imported tracker starts with the host's clock as it is. That loses nothing while
/// the host's clock is monotonic (as `clb-host`'s is); a deadline an imported state holds from
/// a clock that was ahead is bounded by the tracker's own rule (at most its longest delay ahead).
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    /// The largest time given so far (in this clock's time).
    last: Option<u64>,
    /// How far this clock runs ahead of the host's: the sum of the steps back seen.
    ahead: u64,
}

impl Clock {
    /// The time of a call at the host's `host_ms`: never less than the last one given. (A
    /// reader that must not change the clock reads a copy: it is `Copy`.)
    pub fn read(&mut self, host_ms: u64) -> u64 {
        let now = self.peek(host_ms);
        self.ahead = now - host_ms; // never negative: `now` is at least `host_ms`
        self.last = Some(now);
        now
    }

    /// [`Self::read`] without moving the clock.
    pub fn peek(&self, host_ms: u64) -> u64 {
        let ahead = host_ms.saturating_add(self.ahead);
        self.last.map_or(ahead, |last| ahead.max(last))
    }

    /// A time of this clock in the host's clock, for a deadline the host is told.
    pub fn to_host(&self, at: u64) -> u64 {
        at.saturating_sub(self.ahead)
    }
}

/// How much a log line matters: the `diagnostics` import's levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One line for the host's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// Where a lifecycle is in its life (upstream B's `ResourceState`): an inbound Service's
/// (`crate::tracker`) or an egress identity's (`crate::tracker::egress::outbound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    NotStarted,
    CreationInProgress,
    Created,
    UpdateInProgress,
    DeletionPending,
    DeletionInProgress,
}

impl Phase {
    pub fn is_deleting(self) -> bool {
        matches!(self, Phase::DeletionPending | Phase::DeletionInProgress)
    }

    /// For a state import: why a lifecycle in this phase is not where the tracker looks for its
    /// work, if it is not. A pending deletion waits in `draining` (and only one does, or the
    /// tracker would never be idle); any other work left is in flight, runnable or on a timer
    /// (`scheduled`).
    pub fn misplaced(self, work_left: bool, scheduled: bool, draining: bool) -> Option<&'static str> {
        match (self == Phase::DeletionPending, draining) {
            (true, false) => Some("a pending deletion is not draining"),
            (false, true) => Some("draining, but no deletion is pending"),
            (false, false) if work_left && !scheduled => {
                Some("work left, but in no work set (runnable, timers, in flight)")
            }
            _ => None,
        }
    }
}
