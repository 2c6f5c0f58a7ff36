//! The stateful core: observations and outcomes in, commands out (design §4; upstream §b.3,
//! §c.2).
//!
//! * The Kubernetes side is the cache of Services, EndpointSlices and Nodes; the ready endpoints
//!   of every Service being provisioned are folded into the [`DiffTracker`]. That state *is* the
//!   buffer of endpoint changes during creation: they are applied in arrival order and only
//!   reach NRP once the Service is registered, so a pod removed during creation never appears.
//! * Each Service has a lifecycle (NotStarted → CreationInProgress → Created ⇄ UpdateInProgress
//!   → DeletionPending → DeletionInProgress) that runs one command at a time: finalizer, public
//!   IP, load balancer, NRP registration, status; and on deletion, after NRP no longer maps any
//!   address to it: unlink, delete the load balancer, unregister, delete the public IP, release
//!   the finalizer.
//! * Each egress identity a pod carries that NRP does not list gets an outbound lifecycle
//!   ([`crate::outbound`]) on the same machinery: public IP(s), NAT gateway, registration; and
//!   once its last pod has gone and its addresses have drained, the teardown in upstream's order.
//! * An address-location batch carries only registered, live Services, so a failing Service
//!   never blocks another's addresses; and a slow or failing batch costs only the locations it
//!   covers: while one has been in flight for [`timing::SLOW_BATCH_MS`], another may go over
//!   other locations (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two), and a failed
//!   batch's locations back off on their own. Only a throttled batch (429) holds
//!   back every location: the throttle is the subscription's.
//! * Failures back off per Service (1 s doubling to 30 s, deterministic jitter, at least
//!   `Retry-After` up to [`timing::RETRY_AFTER_CAP_MS`]); a periodic read of NRP repairs drift;
//!   nothing is written before the initial lists are complete and NRP has been read.
//! * Every Azure write draws on a token bucket of its kind ([`crate::budget`]): a write with no
//!   token waits, so that a burst of changes coalesces into few calls; a 429 shrinks the bucket's
//!   rate instead of holding everything behind a backoff.
//! * Time is the host's `now`, made monotonic ([`Clock`]); every deadline saturates, and none is
//!   further ahead than [`timing::MAX_DELAY_MS`].

use crate::admission::{Verdict, admit_service};
use crate::budget::{Buckets, WriteKind};
use crate::config::{Config, ConfigError, Mode, validate_config};
use crate::difftracker::{Class, DiffTracker, View};
use crate::egress::Egress;
use crate::ip;
use crate::model::*;
pub use crate::model::Phase;
use crate::name::{Name, VecMap, VecSet};
use crate::outbound::{self, OutStep, Outbound, OutboundLifecycle};
use crate::pod_finalizers::{self, PodFinalizers, Want};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The schema version `export_state` writes. Bump it on any change to [`State`] and teach
/// `import_state` to read the old one. Version 2 added the egress side ([`Egress`]) after the
/// version-1 payload; a version-1 state imports with no egress pods. Version 3 keeps several
/// address-location batches in flight and per-location backoff ([`NrpSync`]); a version 1 or 2
/// state's one batch in flight carries over. Version 4 adds the start-up inventory of ARM
/// ([`ArmSync`]) after the version-3 payload; an older state imports with it settled (nothing
/// left to adopt). Version 5 adds the write budgets' buckets ([`Buckets`]) after the version-4
/// payload; an older state imports with full buckets. Version 6 adds the outbound lifecycles
/// ([`Outbound`]) after the version-5 payload; an older state imports with none (its egress
/// identities are somebody else's, as they were to it). Version 7 adds the egress pod
/// finalizers ([`PodFinalizers`]) after the version-6 payload; an older state imports with no
/// pod held (the host's next list or a pod's next update reads each pod's finalizer).
pub const STATE_VERSION: u32 = 7;

/// The finalizer that holds a Service until its Azure resources are gone.
pub const FINALIZER: &str = "servicegateway.azure.com/service-cleanup";

/// Retry and resync timing (milliseconds).
pub mod timing {
    pub const BACKOFF_BASE_MS: u64 = 1_000;
    pub const BACKOFF_CAP_MS: u64 = 30_000;
    /// Jitter adds up to this share (percent) of the backoff.
    pub const JITTER_PERCENT: u64 = 20;
    /// How often NRP is read back to repair drift.
    pub const RESYNC_INTERVAL_MS: u64 = 5 * 60_000;
    /// The longest `Retry-After` the tracker honours: the resync period. A longer one would
    /// hold a Service's retries, every Service's addresses (the address-location batch) or the
    /// read of NRP past the next periodic resync, which is the slowest the tracker otherwise
    /// ever acts on anything; a server asking for more than that is wrong or the header was
    /// misread (the host turns a `Retry-After` of ~1.8e16 s or more into `u64::MAX`). A capped
    /// value is logged (`Step::logs`).
    pub const RETRY_AFTER_CAP_MS: u64 = RESYNC_INTERVAL_MS;
    /// The longest delay the tracker ever schedules: a backoff (at most 36 s, or a capped
    /// `Retry-After`) or the resync period.
    pub const MAX_DELAY_MS: u64 = RESYNC_INTERVAL_MS;
    /// An address-location batch in flight this long is slow: the next batch need not wait for
    /// it (it goes over other locations). Shorter than NRP's request timeout, so that a hung call
    /// holds the other Services' endpoints this long, not until it times out; long enough that a
    /// batch answered at NRP's usual pace lets the changes behind it coalesce into one batch.
    pub const SLOW_BATCH_MS: u64 = 2_000;
    /// Reads of the ARM inventory at start-up before start-up reconciliation goes on without
    /// it (writing what it cannot adopt, as before version 4): the inventory saves writes, it
    /// is never worth holding every Service for.
    pub const ARM_READ_ATTEMPTS: u32 = 3;
    const _: () = assert!(
        BACKOFF_CAP_MS + BACKOFF_CAP_MS * JITTER_PERCENT / 100 <= MAX_DELAY_MS && RETRY_AFTER_CAP_MS <= MAX_DELAY_MS
    );
}

/// The most locations one `update-address-locations` carries.
pub const MAX_LOCATIONS_PER_BATCH: usize = 200;
/// The most Service commands (Azure or Kubernetes) in flight at once.
pub const MAX_SERVICE_COMMANDS_IN_FLIGHT: usize = 16;
/// The most address-location batches in flight at once (each over other locations).
pub const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// Event reasons of the lifecycle. Operators alert on them: never rename one.
pub mod reason {
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    pub const LOAD_BALANCER_CONFIGURATION_REJECTED: &str = "LoadBalancerConfigurationRejected";
}

/// Azure error codes that no retry can fix: the Service waits for a new spec.
const TERMINAL_CODES: &[&str] = &[
    "RulesUseSameBackendPortProtocolAndPool",
    "QuotaExceeded",
    "PublicIPCountLimitReached",
    "MaxPublicIpCountLimitReached",
    "InvalidParameter",
];
const OVERLAY_MAPPINGS_CODE: &str = "ServiceWithOverlayMappingsCannotBeDeleted";
const DEFAULT_IDLE_TIMEOUT_MINUTES: u8 = 4;

/// Why state could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    UnsupportedVersion(u32),
    Corrupt(String),
    InvalidConfig(ConfigError),
}

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
    fn object_needs_repair(&self) -> bool {
        self.object.exists
            && (!self.object.has_finalizer || self.ingress_ip.as_ref().is_some_and(|ip| self.object.ingress != [ip.clone()]))
    }

    /// Puts back what [`Self::object_needs_repair`] found missing: an update of the Service's
    /// object alone (its Azure resources are as applied).
    fn repair(&mut self) {
        self.phase = Phase::UpdateInProgress;
        self.steps = [OpStep::AddFinalizer, OpStep::PatchStatus].into();
        self.op_config = self.applied.clone();
        self.retries = 0;
        self.not_before_ms = 0;
    }

    /// Not created and not parked (waiting for a new spec): the tracker has steps to run for it.
    fn has_work_left(&self) -> bool {
        self.phase != Phase::Created && !self.parked
    }

    /// Whether what `op` would write already holds (`registered`: in NRP), so it is skipped.
    fn holds_already(&self, op: OpStep, registered: bool) -> bool {
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

    fn new(service: ObjectRef, phase: Phase, object: ObjectState, desired: Option<LbConfig>) -> Self {
        let steps = if phase == Phase::NotStarted { OpStep::ENSURE.into() } else { VecDeque::new() };
        Self {
            service,
            phase,
            op_config: desired.clone(),
            desired,
            applied: None,
            steps,
            in_flight: None,
            retries: 0,
            not_before_ms: 0,
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
    const ENSURE: [OpStep; 5] =
        [OpStep::AddFinalizer, OpStep::PutPublicIp, OpStep::PutLoadBalancer, OpStep::Register, OpStep::PatchStatus];
    /// Upstream §c.2.3: unlink pool → delete LB → unregister → delete PIP → drop finalizer;
    /// and, before the finalizer, the ingress IP leaves the status of a Service that lives on
    /// (LoadBalancer → ClusterIP), since that address is gone.
    const DELETE: [OpStep; 6] = [
        OpStep::Unlink,
        OpStep::DeleteLoadBalancer,
        OpStep::Unregister,
        OpStep::DeletePublicIp,
        OpStep::ClearStatus,
        OpStep::RemoveFinalizer,
    ];

    fn is_delete_step(self) -> bool {
        OpStep::DELETE.contains(&self)
    }

    fn writes_nrp(self) -> bool {
        matches!(self, OpStep::Register | OpStep::Unlink | OpStep::Unregister)
    }

    fn is_kubernetes(self) -> bool {
        matches!(self, OpStep::AddFinalizer | OpStep::PatchStatus | OpStep::ClearStatus | OpStep::RemoveFinalizer)
    }

    /// The write budget the step draws on; Kubernetes writes have none.
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
struct ObjectState {
    exists: bool,
    has_finalizer: bool,
    ingress: Vec<String>,
}

impl ObjectState {
    fn of(service: &Service) -> Self {
        Self {
            exists: true,
            has_finalizer: service.finalizers.iter().any(|f| f == FINALIZER),
            ingress: service.ingress_ips.clone(),
        }
    }

    fn gone() -> Self {
        Self { exists: false, has_finalizer: false, ingress: Vec::new() }
    }
}

/// One Service's lifecycle, keyed by its identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    service: ObjectRef,
    pub phase: Phase,
    /// From the last admitted spec; `None` for an orphan found in NRP or a Service adopted at
    /// start-up whose spec is no longer admitted.
    desired: Option<LbConfig>,
    applied: Option<LbConfig>,
    /// The configuration the running operation applies.
    op_config: Option<LbConfig>,
    steps: VecDeque<OpStep>,
    in_flight: Option<(u64, OpStep)>,
    retries: u32,
    not_before_ms: u64,
    /// A terminal failure: waits for a new spec.
    parked: bool,
    /// A Warning Event was sent for the current run of failures.
    failing: bool,
    ingress_ip: Option<String>,
    object: ObjectState,
    recreate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ServiceRecord {
    observed: Service,
    /// The spec last admitted; a live Service that becomes invalid keeps it (design §3).
    admitted: Option<Service>,
    verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SliceRecord {
    slice: StoredSlice,
    owner: Option<Name>,
    /// Ready addresses → their location, as the Nodes resolve them now.
    resolved: VecMap<Name, Name>,
}

/// An EndpointSlice as the tracker keeps it: [`EndpointSlice`] in compact keys, serialized
/// exactly like it (field for field), so the state format does not change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredSlice {
    namespace: Name,
    name: Name,
    owner_service_uid: Option<Name>,
    address_type: Name,
    endpoints: Vec<StoredEndpoint>,
    deleting: bool,
}

/// [`Endpoint`], as [`StoredSlice`] keeps it: nearly always one address, held in place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredEndpoint {
    addresses: SmallVec<[Name; 1]>,
    node_name: Option<Name>,
    ready: Option<bool>,
}

impl StoredSlice {
    fn of(slice: &EndpointSlice) -> Self {
        let endpoints = slice.endpoints.iter().map(|e| StoredEndpoint {
            addresses: e.addresses.iter().map(Name::from).collect(),
            node_name: e.node_name.as_ref().map(Name::from),
            ready: e.ready,
        });
        Self {
            namespace: Name::new(&slice.namespace),
            name: Name::new(&slice.name),
            owner_service_uid: slice.owner_service_uid.as_ref().map(Name::from),
            address_type: Name::new(&slice.address_type),
            endpoints: endpoints.collect(),
            deleting: slice.deleting,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NodeLocations {
    v4: Option<Name>,
    v6: Option<Name>,
}

impl NodeLocations {
    fn of(node: &Node) -> Self {
        Self {
            v4: ip::same_family_location(&node.internal_ips, ip::Family::V4),
            v6: ip::same_family_location(&node.internal_ips, ip::Family::V6),
        }
    }

    fn for_family(&self, family: ip::Family) -> Option<&Name> {
        match family {
            ip::Family::V4 => self.v4.as_ref(),
            ip::Family::V6 => self.v6.as_ref(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum InFlight {
    Service { identity: String, step: OpStep },
    Locations(Vec<NrpLocation>),
    ReadNrp,
    Event,
    ReadArm,
    /// A command of an egress identity's outbound lifecycle (state version 6).
    Outbound { identity: String, step: OutStep },
    /// The finalizer of an egress pod (state version 7): added (`present`) or released.
    PodFinalizer { key: ObjectKey, uid: String, present: bool },
}

/// The start-up inventory of ARM (state version 4): the resource group's public IPs and load
/// balancers, read once so that what already holds what a Service wants is
/// adopted instead of written again, and so that load balancers and public IPs of Services
/// deleted while no controller ran are found. It is read once the lists are complete and NRP is
/// read, and used the moment it arrives (start-up reconciliation waits for it), so the state
/// never holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ArmSync {
    /// Start-up reconciliation may run: the inventory was used, or reading it was given up.
    settled: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
}

impl ArmSync {
    /// A state from before version 4: nothing to read, nothing to adopt.
    fn settled() -> Self {
        Self { settled: true, ..Self::default() }
    }
}

/// NRP-facing bookkeeping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NrpSync {
    /// NRP has been read at least once.
    loaded: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
    /// Address-location batches in flight: command id → when it was issued.
    #[serde(deserialize_with = "crate::name::btree_map")]
    batches_in_flight: BTreeMap<u64, u64>,
    /// Throttled batches in a row (429), and until when every batch waits.
    batch_retries: u32,
    batch_not_before_ms: u64,
    /// Halved after a 400 to isolate the location NRP refuses.
    batch_limit: usize,
    /// Locations NRP refused on their own, with the update refused; skipped until it changes.
    #[serde(deserialize_with = "crate::name::btree_map")]
    quarantined: BTreeMap<String, NrpLocation>,
    /// Locations whose batch failed (not refused, not throttled): failures in a row and until
    /// when they wait; the others' batches go on. Forgotten when the location is next accepted.
    #[serde(deserialize_with = "crate::name::btree_map")]
    location_backoff: BTreeMap<String, Backoff>,
    service_writes_in_flight: u32,
    /// Non-inbound services of the last read: other controllers' identities, left alone.
    #[serde(deserialize_with = "crate::name::btree_set")]
    foreign: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Backoff {
    retries: u32,
    not_before_ms: u64,
}

/// [`NrpSync`] as state versions 1 and 2 have it: at most one batch in flight, one backoff.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct NrpSyncV2 {
    loaded: bool,
    read_in_flight: bool,
    read_retries: u32,
    next_read_ms: u64,
    batch_in_flight: Option<u64>,
    batch_retries: u32,
    batch_not_before_ms: u64,
    batch_limit: usize,
    #[serde(deserialize_with = "crate::name::btree_map")]
    quarantined: BTreeMap<String, NrpLocation>,
    service_writes_in_flight: u32,
    #[serde(deserialize_with = "crate::name::btree_set")]
    foreign: BTreeSet<String>,
}

impl NrpSyncV2 {
    /// The batch in flight keeps its place (issued at time 0: slow, so another may go beside
    /// it); its one backoff, which held every location, still does (as a throttle).
    fn upgrade(self) -> NrpSync {
        NrpSync {
            loaded: self.loaded,
            read_in_flight: self.read_in_flight,
            read_retries: self.read_retries,
            next_read_ms: self.next_read_ms,
            batches_in_flight: self.batch_in_flight.map(|id| (id, 0)).into_iter().collect(),
            batch_retries: self.batch_retries,
            batch_not_before_ms: self.batch_not_before_ms,
            batch_limit: self.batch_limit,
            quarantined: self.quarantined,
            location_backoff: BTreeMap::new(),
            service_writes_in_flight: self.service_writes_in_flight,
            foreign: self.foreign,
        }
    }
}

/// `N`: the NRP bookkeeping of the state version read ([`NrpSyncV2`] for versions 1 and 2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct State<N = NrpSync> {
    next_command_id: u64,
    #[serde(deserialize_with = "crate::name::btree_map")]
    services: BTreeMap<ObjectKey, ServiceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    service_by_identity: BTreeMap<String, ObjectKey>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices: BTreeMap<ObjectKey, SliceRecord>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices_by_owner: BTreeMap<Name, VecSet<ObjectKey>>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    slices_by_node: BTreeMap<Name, VecSet<ObjectKey>>,
    /// Node name → its locations per family (computed once per Node change, not per endpoint).
    #[serde(deserialize_with = "crate::name::btree_map")]
    nodes: BTreeMap<String, NodeLocations>,
    diff: DiffTracker,
    #[serde(deserialize_with = "crate::name::btree_map")]
    lifecycles: BTreeMap<String, Lifecycle>,
    #[serde(deserialize_with = "crate::name::btree_map")]
    in_flight: BTreeMap<u64, InFlight>,
    service_commands_in_flight: usize,
    #[serde(deserialize_with = "crate::name::btree_set")]
    runnable: BTreeSet<String>,
    #[serde(deserialize_with = "crate::name::btree_set")]
    timers: BTreeSet<(u64, String)>,
    #[serde(deserialize_with = "crate::name::btree_set")]
    draining: BTreeSet<String>,
    nrp: N,
    lists_complete: bool,
    /// Start-up reconciliation against NRP has run.
    reconciled: bool,
}

#[derive(Clone, Debug)]
pub struct Tracker {
    config: Config,
    mode: Mode,
    state: State,
    /// Egress pods and identities (state version 2), beside the version-1 [`State`].
    egress: Egress,
    /// The start-up inventory of ARM (state version 4).
    arm: ArmSync,
    /// The write budgets' buckets (state version 5); their shapes are the config's.
    budget: Buckets,
    /// The outbound lifecycles of egress identities (state version 6).
    outbound: Outbound,
    /// The egress pod finalizers (state version 7).
    pods: PodFinalizers,
    /// Time as the tracker counts it: the host's `now`, monotonic (see [`Clock`]). Every
    /// deadline in the state is in this clock's time. Not state: neither exported nor compared.
    clock: Clock,
}

/// Two trackers are equal when their configuration and state are: the clock is not state.
impl PartialEq for Tracker {
    fn eq(&self, other: &Self) -> bool {
        (&self.config, self.mode, &self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods)
            == (
                &other.config,
                other.mode,
                &other.state,
                &other.egress,
                &other.arm,
                &other.budget,
                &other.outbound,
                &other.pods,
            )
    }
}

impl Eq for Tracker {}

/// Capped exponential backoff with deterministic jitter, never shorter than `Retry-After` up to
/// The address types whose endpoints are pod IPs, `IPv4` and `IPv6` (in any case, as the NRP
/// types are read): only their endpoints are programmed; `FQDN` and types Kubernetes does not
/// have are not.
fn programmable(address_type: &str) -> bool {
    address_type.eq_ignore_ascii_case("IPv4") || address_type.eq_ignore_ascii_case("IPv6")
}

/// [`timing::RETRY_AFTER_CAP_MS`].
pub fn backoff_ms(key: &str, attempt: u32, retry_after_ms: Option<u64>) -> u64 {
    let exponent = attempt.saturating_sub(1).min(5);
    let base = (timing::BACKOFF_BASE_MS << exponent).min(timing::BACKOFF_CAP_MS);
    // FNV-1a over the key and the attempt: the same inputs give the same jitter on every host.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes().chain(attempt.to_le_bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let jitter = base * (hash % (timing::JITTER_PERCENT + 1)) / 100;
    (base + jitter).max(retry_after_ms.unwrap_or(0).min(timing::RETRY_AFTER_CAP_MS))
}

/// [`backoff_ms`] after a failure, logging a `Retry-After` longer than the cap: what it was
/// asked for (`what`) and what is honoured instead.
fn retry_delay(key: &str, attempt: u32, failure: &Failure, what: impl std::fmt::Display, step: &mut Step) -> u64 {
    let delay = backoff_ms(key, attempt, failure.retry_after_ms);
    if let Some(asked) = failure.retry_after_ms.filter(|&ms| ms > timing::RETRY_AFTER_CAP_MS) {
        let message = format!(
            "{what}: HTTP {} asked to retry after {asked} ms; retrying after {delay} ms (Retry-After is capped at {} ms)",
            failure.status,
            timing::RETRY_AFTER_CAP_MS
        );
        step.logs.push(LogLine { level: LogLevel::Warn, message });
    }
    delay
}

/// Orphan clean-up touches only names shaped like Kubernetes UIDs, as upstream does.
fn looks_like_uid(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() == 5
        && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(len, part)| part.len() == *len)
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// How an identity found in either view takes part in an address-location sync: ours when
/// registered and live, drained when ours but not, left alone when another controller's.
fn classify(
    lifecycles: &BTreeMap<String, Lifecycle>,
    foreign: &BTreeSet<String>,
    egress: &Egress,
    outbound: &Outbound,
    diff: &DiffTracker,
    id: &str,
) -> Class {
    match lifecycles.get(id) {
        Some(l) if !l.phase.is_deleting() && diff.is_registered(id) => Class::Ready,
        Some(_) => Class::NotReady,
        None => classify_not_inbound(foreign, egress, outbound, diff, id),
    }
}

/// An identity no inbound lifecycle claims: an egress identity of ours (with an outbound
/// lifecycle: programmed only once created and registered, and while a pod carries it), else
/// one a pod carries, else somebody else's (a known foreign service, or a name that is not a UID
/// we could have registered).
fn classify_not_inbound(
    foreign: &BTreeSet<String>,
    egress: &Egress,
    outbound: &Outbound,
    diff: &DiffTracker,
    id: &str,
) -> Class {
    if let Some(ready) = outbound.ready(id, egress.is_registered(id)) {
        return if ready && egress.carries(id) { Class::Ready } else { Class::NotReady };
    }
    if let Some(class) = egress.class(id) {
        return class;
    }
    if foreign.contains(id) || (!diff.is_registered(id) && !looks_like_uid(id)) {
        Class::Foreign
    } else {
        Class::NotReady
    }
}

/// The reference of a Service known only by its identity (found in NRP or ARM, gone from
/// Kubernetes): its Events and Kubernetes writes have no object to go to.
fn orphan(identity: &str) -> ObjectRef {
    ObjectRef { kind: "Service".into(), namespace: Name::new(""), name: Name::new(""), uid: Name::new(identity) }
}

/// Whether a listed load balancer holds what `wanted` says: rules compared as a set (ARM may
/// list them in another order; rule names are unique on a load balancer). A few rules each: a
/// scan, not a sort, which would cost the component a sort's code.
fn same_load_balancer(listed: &LoadBalancer, wanted: &LoadBalancer) -> bool {
    (&listed.name, &listed.public_ip, &listed.backend_pool) == (&wanted.name, &wanted.public_ip, &wanted.backend_pool)
        && listed.rules.len() == wanted.rules.len()
        && wanted.rules.iter().all(|rule| listed.rules.contains(rule))
}

fn object_ref(service: &Service) -> ObjectRef {
    ObjectRef {
        kind: "Service".into(),
        namespace: Name::new(&service.namespace),
        name: Name::new(&service.name),
        uid: Name::new(&service.uid),
    }
}

impl Tracker {
    /// A tracker with empty state; refuses a configuration [`validate_config`] refuses.
    pub fn create(config: Config) -> Result<Self, ConfigError> {
        let mode = validate_config(&config)?;
        let state =
            State { nrp: NrpSync { batch_limit: MAX_LOCATIONS_PER_BATCH, ..NrpSync::default() }, ..State::default() };
        let budget = Buckets::full(&config.write_budgets());
        Ok(Self {
            config,
            mode,
            state,
            egress: Egress::default(),
            arm: ArmSync::default(),
            budget,
            outbound: Outbound::default(),
            pods: PodFinalizers::default(),
            clock: Clock::default(),
        })
    }

    /// A tracker as [`Self::create`], but with its start-up inventory of ARM settled and empty,
    /// as a state from before version 4 imports: for the tests of everything but start-up
    /// adoption, which then see the commands they saw before the inventory existed.
    #[cfg(test)]
    pub(crate) fn create_with_arm_settled(config: Config) -> Result<Self, ConfigError> {
        Ok(Self { arm: ArmSync::settled(), ..Self::create(config)? })
    }

    /// The state as version 3 wrote it (no ARM inventory), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v3(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress)).expect("plain data")
    }

    /// The state as version 4 wrote it (no write budgets), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v4(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm)).expect("plain data")
    }

    /// The state as version 5 wrote it (no outbound lifecycles), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v5(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget)).expect("plain data")
    }

    /// The state as version 6 wrote it (no pod finalizers), for tests of older payloads.
    #[cfg(test)]
    pub(crate) fn export_state_v6(&self) -> Vec<u8> {
        postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound)).expect("plain data")
    }

    /// This tracker's current payload with `state` in place of its own, for tests of states that
    /// must be refused.
    #[cfg(test)]
    fn payload_with(&self, state: &State) -> Vec<u8> {
        postcard::to_allocvec(&(state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("plain data")
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict last reached for a Service, if the tracker has seen it.
    pub fn verdict(&self, namespace: &str, name: &str) -> Option<&Verdict> {
        self.state.services.get(&ObjectKey::new(namespace, name)).map(|r| &r.verdict)
    }

    /// The spec the tracker provisions a Service with: the last one admitted.
    pub fn admitted_spec(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.state.services.get(&ObjectKey::new(namespace, name)).and_then(|r| r.admitted.as_ref())
    }

    /// A Service's lifecycle phase, by identity (lower-cased UID).
    pub fn phase(&self, identity: &str) -> Option<Phase> {
        self.state.lifecycles.get(identity).map(|l| l.phase)
    }

    /// The NRP mirror: what NRP has accepted, location → address → services.
    pub fn nrp_view(&self) -> View {
        self.state.diff.nrp_view()
    }

    /// Registered inbound services in the NRP mirror.
    pub fn registered(&self) -> &BTreeSet<Name> {
        self.state.diff.registered()
    }

    /// What NRP should hold once quiet: the ready-filtered Kubernetes state.
    pub fn desired_view(&self) -> View {
        self.state.diff.desired_view(|id| self.class(id))
    }

    /// Whether nothing is in flight, nothing is dirty and no Service has work left.
    pub fn is_quiet(&self) -> bool {
        self.state.in_flight.is_empty() && self.is_quiet_after_events()
    }

    pub fn observe(&mut self, now_ms: u64, batch: Vec<Observation>) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        for observation in batch {
            match observation {
                // A Service's UID names its Azure resources: with none there is nothing to name
                // them by (the API server always sets one; a host that sends none is wrong).
                Observation::ServiceUpserted(service) if service.uid.trim().is_empty() => {
                    let message =
                        format!("Service {}/{} has no UID: it is ignored", service.namespace, service.name);
                    step.logs.push(LogLine { level: LogLevel::Warn, message });
                }
                Observation::ServiceUpserted(service) => self.upsert_service(service, &mut step),
                Observation::ServiceDeleted(key) => self.remove_service_object(&key),
                Observation::SliceUpserted(slice) => {
                    if !programmable(&slice.address_type) && !slice.address_type.eq_ignore_ascii_case("FQDN") {
                        let message = format!(
                            "EndpointSlice {}/{}: addressType {:?} is not IPv4, IPv6 or FQDN; its endpoints are not programmed",
                            slice.namespace, slice.name, slice.address_type
                        );
                        step.logs.push(LogLine { level: LogLevel::Warn, message });
                    }
                    self.upsert_slice(slice)
                }
                Observation::SliceDeleted(key) => self.remove_slice(&key),
                Observation::NodeUpserted(node) => self.upsert_node(node, &mut step),
                Observation::NodeDeleted(name) => self.remove_node(&name),
                Observation::PodUpserted(pod) => self.upsert_pod(&pod, &mut step),
                Observation::PodDeleted(key) => {
                    let before = self.egress.carried_by(&key);
                    self.egress.delete(&key, &mut self.state.diff);
                    self.pods.gone(&key, &before, true);
                    if let Some((identity, _)) = before {
                        self.carried_changed(&identity);
                    }
                }
                Observation::ListsComplete => {
                    self.state.lists_complete = true;
                }
            }
        }
        self.pump(now, &mut step);
        step
    }

    pub fn complete(&mut self, now_ms: u64, results: Vec<(u64, Outcome)>) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        for (id, outcome) in results {
            // An unknown id is a duplicate or stale answer: ignoring it is safe.
            let Some(what) = self.state.in_flight.remove(&id) else { continue };
            match what {
                InFlight::Service { identity, step: op } => {
                    self.state.service_commands_in_flight -= 1;
                    if op.writes_nrp() {
                        self.state.nrp.service_writes_in_flight -= 1;
                    }
                    self.service_outcome(&identity, id, op, outcome, now, &mut step);
                }
                InFlight::Outbound { identity, step: op } => {
                    self.state.service_commands_in_flight -= 1;
                    if op.writes_nrp() {
                        self.state.nrp.service_writes_in_flight -= 1;
                    }
                    self.outbound_outcome(&identity, id, op, outcome, now, &mut step);
                }
                InFlight::PodFinalizer { key, uid, present } => {
                    self.pod_finalizer_outcome(&key, &uid, id, present, outcome, now, &mut step)
                }
                InFlight::Locations(batch) => self.locations_outcome(id, batch, outcome, now, &mut step),
                InFlight::ReadNrp => self.read_outcome(outcome, now, &mut step),
                InFlight::ReadArm => self.arm_outcome(outcome, now, &mut step),
                // Events are best effort; a lost one is not worth a retry.
                InFlight::Event => {}
            }
        }
        self.pump(now, &mut step);
        step
    }

    pub fn tick(&mut self, now_ms: u64) -> Step {
        let now = self.clock.read(now_ms);
        let mut step = Step::default();
        self.pump(now, &mut step);
        step
    }

    // ---- Kubernetes side ----

    fn upsert_service(&mut self, service: Service, step: &mut Step) {
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

    fn remove_service_object(&mut self, key: &ObjectKey) {
        let Some(record) = self.state.services.remove(key) else { return };
        let identity = record.observed.identity();
        self.state.service_by_identity.remove(&identity);
        self.delete_service(&identity, true);
    }

    /// Whether a Service's endpoints belong in the Kubernetes side of the DiffTracker.
    fn programmable(&self, identity: &str) -> bool {
        self.state.lifecycles.get(identity).is_some_and(|l| !l.phase.is_deleting())
    }

    fn want_service(&mut self, identity: &str, service: &Service) {
        let config = LbConfig::for_service(service);
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else {
            let lifecycle =
                Lifecycle::new(object_ref(service), Phase::NotStarted, ObjectState::of(service), Some(config));
            self.state.lifecycles.insert(identity.to_owned(), lifecycle);
            self.seed(identity);
            self.state.runnable.insert(identity.to_owned());
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
                lifecycle.retries = 0;
                lifecycle.not_before_ms = 0;
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
                    lifecycle.steps.contains(&op) && lifecycle.in_flight.is_none_or(|(_, running)| running != op)
                };
                let same_ip = lifecycle.op_config.as_ref().is_some_and(|c| c.public_ip == config.public_ip);
                if lifecycle.parked && changed {
                    lifecycle.parked = false;
                    lifecycle.retries = 0;
                    lifecycle.not_before_ms = 0;
                    lifecycle.op_config = Some(config);
                    lifecycle.steps = OpStep::ENSURE.into();
                } else if changed && pending(OpStep::PutLoadBalancer) && (same_ip || pending(OpStep::PutPublicIp)) {
                    lifecycle.op_config = Some(config);
                }
            }
        }
        self.state.runnable.insert(identity.to_owned());
    }

    /// Starts (or keeps) the deletion of a Service's Azure resources. `gone`: the object has
    /// left the API server. Never synthesises a deletion for a Service nobody provisioned.
    fn delete_service(&mut self, identity: &str, gone: bool) {
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else { return };
        if gone {
            lifecycle.object.exists = false;
        }
        lifecycle.recreate = false;
        if lifecycle.phase.is_deleting() {
            if lifecycle.parked {
                lifecycle.parked = false;
                self.state.runnable.insert(identity.to_owned());
            }
            return;
        }
        lifecycle.phase = Phase::DeletionPending;
        lifecycle.steps.clear();
        lifecycle.retries = 0;
        lifecycle.not_before_ms = 0;
        lifecycle.parked = false;
        lifecycle.failing = false;
        self.unseed(identity);
        self.state.diff.touch_identity(identity);
        self.state.draining.insert(identity.to_owned());
    }

    fn seed(&mut self, identity: &str) {
        let keys = self.state.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.state.slices.get(&key) {
                for (address, location) in &record.resolved {
                    self.state.diff.add_endpoint(identity, address, location);
                }
            }
        }
    }

    fn unseed(&mut self, identity: &str) {
        let keys = self.state.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.state.slices.get(&key) {
                for (address, location) in &record.resolved {
                    self.state.diff.remove_endpoint(identity, address, location);
                }
            }
        }
    }

    /// Ready addresses of a slice and their same-family node locations.
    fn resolve(&self, slice: &StoredSlice) -> VecMap<Name, Name> {
        if slice.deleting || !programmable(&slice.address_type) {
            return VecMap::default();
        }
        self.resolve_endpoints(slice.endpoints.iter())
    }

    fn resolve_endpoints<'e>(&self, endpoints: impl Iterator<Item = &'e StoredEndpoint>) -> VecMap<Name, Name> {
        let mut resolved = Vec::new();
        for endpoint in endpoints.filter(|e| e.ready != Some(false)) {
            let Some(node) = endpoint.node_name.as_ref().and_then(|n| self.state.nodes.get(n.as_str())) else {
                continue;
            };
            for address in &endpoint.addresses {
                let Some((address, family)) = ip::canonical(address) else { continue };
                if let Some(location) = node.for_family(family) {
                    resolved.push((address, location.clone()));
                }
            }
        }
        resolved.into_iter().collect()
    }

    fn upsert_slice(&mut self, slice: EndpointSlice) {
        let key = slice.key();
        let owner = slice.owner_service_uid.as_ref().map(|u| Name::from(u.to_ascii_lowercase()));
        let slice = StoredSlice::of(&slice);
        if self.update_slice_in_place(&key, &owner, &slice) {
            return;
        }
        let resolved = self.resolve(&slice);
        let record = SliceRecord { slice, owner, resolved };
        let old = self.state.slices.remove(&key);
        self.reindex_slice(&key, old.as_ref(), Some(&record));
        let (old_owner, old_resolved) = old.map(|o| (o.owner, o.resolved)).unwrap_or_default();
        self.apply_slice_change(old_owner.as_deref(), &old_resolved, record.owner.as_deref(), &record.resolved);
        self.state.slices.insert(key, record);
    }

    /// The common update — a few endpoints of a slice changed, nothing else — re-resolves
    /// only those endpoints. Returns false when the update is not of that kind.
    fn update_slice_in_place(&mut self, key: &ObjectKey, owner: &Option<Name>, slice: &StoredSlice) -> bool {
        const MOST_CHANGED: usize = 8;
        let Some(old) = self.state.slices.get(key) else { return false };
        let same_shape = old.owner == *owner
            && old.slice.address_type == slice.address_type
            && !old.slice.deleting
            && !slice.deleting
            && old.slice.endpoints.len() == slice.endpoints.len();
        if !same_shape || !programmable(&slice.address_type) {
            return false;
        }
        let pairs = old.slice.endpoints.iter().zip(&slice.endpoints);
        let changed: Vec<usize> = pairs.enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect();
        if changed.len() > MOST_CHANGED
            || changed.iter().any(|&i| old.slice.endpoints[i].node_name != slice.endpoints[i].node_name)
        {
            return false;
        }
        let before = self.resolve_endpoints(changed.iter().map(|&i| &old.slice.endpoints[i]));
        let after = self.resolve_endpoints(changed.iter().map(|&i| &slice.endpoints[i]));
        // Each address must stand for exactly one resolved entry, in the old slice and in the
        // changed endpoints, and a changed endpoint must not take an address an unchanged one
        // lists: otherwise (a duplicate, an unknown node, a bad IP) the whole slice is re-read.
        let ready_addresses = |endpoints: &mut dyn Iterator<Item = &StoredEndpoint>| -> usize {
            endpoints.filter(|e| e.ready != Some(false)).map(|e| e.addresses.len()).sum()
        };
        if old.resolved.len() != ready_addresses(&mut old.slice.endpoints.iter())
            || after.len() != ready_addresses(&mut changed.iter().map(|&i| &slice.endpoints[i]))
            || after.keys().any(|a| old.resolved.contains_key(a) && !before.contains_key(a))
        {
            return false;
        }
        let owner = owner.clone();
        self.apply_slice_change(owner.as_deref(), &before, owner.as_deref(), &after);
        let record = self.state.slices.get_mut(key).expect("read above");
        for address in before.keys() {
            record.resolved.remove(address);
        }
        record.resolved.extend(after);
        record.slice = slice.clone();
        true
    }

    fn remove_slice(&mut self, key: &ObjectKey) {
        let Some(old) = self.state.slices.remove(key) else { return };
        self.reindex_slice(key, Some(&old), None);
        self.apply_slice_change(old.owner.as_deref(), &old.resolved, None, &VecMap::default());
    }

    /// Folds the change of one slice's contribution into the DiffTracker: only what changed.
    fn apply_slice_change(
        &mut self,
        old_owner: Option<&str>,
        old: &VecMap<Name, Name>,
        new_owner: Option<&str>,
        new: &VecMap<Name, Name>,
    ) {
        let old_owner = old_owner.filter(|o| self.programmable(o));
        let new_owner = new_owner.filter(|o| self.programmable(o));
        self.state.diff.replace_placements(old_owner, old, new_owner, new);
    }

    /// Keeps the owner and node indexes of a slice, touching only what changed between the
    /// old and the new record (an ordinary update changes neither).
    fn reindex_slice(&mut self, key: &ObjectKey, old: Option<&SliceRecord>, new: Option<&SliceRecord>) {
        fn nodes(record: Option<&SliceRecord>) -> BTreeSet<&Name> {
            record.map(|r| r.slice.endpoints.iter().filter_map(|e| e.node_name.as_ref()).collect()).unwrap_or_default()
        }
        fn unlink(index: &mut BTreeMap<Name, VecSet<ObjectKey>>, at: &str, key: &ObjectKey) {
            if let Some(keys) = index.get_mut(at) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(at);
                }
            }
        }
        let (old_owner, new_owner) = (old.and_then(|r| r.owner.as_ref()), new.and_then(|r| r.owner.as_ref()));
        if old_owner != new_owner {
            if let Some(owner) = old_owner {
                unlink(&mut self.state.slices_by_owner, owner, key);
            }
            if let Some(owner) = new_owner {
                self.state.slices_by_owner.entry(owner.clone()).or_default().insert(key.clone());
            }
        }
        let (old_nodes, new_nodes) = (nodes(old), nodes(new));
        for gone in old_nodes.difference(&new_nodes) {
            unlink(&mut self.state.slices_by_node, gone, key);
        }
        for added in new_nodes.difference(&old_nodes) {
            self.state.slices_by_node.entry((*added).clone()).or_default().insert(key.clone());
        }
    }

    /// Re-resolves the slices with endpoints on a node after the node changed.
    fn reresolve_node(&mut self, name: &str) {
        let keys = self.state.slices_by_node.get(name).cloned().unwrap_or_default();
        for key in keys {
            let Some(record) = self.state.slices.get(&key) else { continue };
            let resolved = self.resolve(&record.slice);
            if resolved == record.resolved {
                continue;
            }
            let owner = record.owner.clone();
            let old = std::mem::replace(&mut self.state.slices.get_mut(&key).expect("just read").resolved, resolved);
            let new = self.state.slices[&key].resolved.clone();
            self.apply_slice_change(owner.as_deref(), &old, owner.as_deref(), &new);
        }
    }

    /// A changed Node whose InternalIPs do not all parse is logged (WARN), naming it: the
    /// addresses of its pods reach NRP only through the ones that do, and not at all when none
    /// does.
    fn upsert_node(&mut self, node: Node, step: &mut Step) {
        let name = node.name.clone();
        let locations = NodeLocations::of(&node);
        let unchanged = self.state.nodes.get(&name) == Some(&locations);
        self.state.nodes.insert(name.clone(), locations);
        if unchanged {
            return;
        }
        let bad: Vec<&String> = node.internal_ips.iter().filter(|ip| ip::canonical(ip).is_none()).collect();
        let usable = node.internal_ips.len() - bad.len();
        // A Node with no InternalIP yet (its kubelet has not reported them) is not worth a line.
        if !bad.is_empty() {
            let what = match usable {
                0 => "the addresses of its pods are not programmed in NRP",
                _ => "its other InternalIPs are its locations",
            };
            let message = format!("node {name}: InternalIPs {bad:?} are not IP addresses ({usable} usable); {what}");
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
        self.reresolve_node(&name);
    }

    fn remove_node(&mut self, name: &str) {
        if self.state.nodes.remove(name).is_some() {
            self.reresolve_node(name);
        }
    }

    /// An egress pod was created or changed (the rules are in [`crate::egress`]).
    fn upsert_pod(&mut self, pod: &Pod, step: &mut Step) {
        let key = pod.key();
        if self.pods.superseded(pod) {
            return; // a stale deletion of the object a same-name replacement superseded (`crate::pod_finalizers`)
        }
        let carried_before = self.egress.carried_by(&key);
        let before = carried_before.as_ref().map(|(identity, _)| identity.clone());
        let State { lifecycles, service_by_identity, diff, .. } = &mut self.state;
        let inbound = |id: &str| lifecycles.contains_key(id) || service_by_identity.contains_key(id);
        for (regarding, warning) in self.egress.upsert(pod, inbound, diff) {
            self.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
        let carried_after = self.egress.carried_by(&key);
        self.pods.observe(pod, &carried_before, &carried_after);
        if carried_after.is_none() && pod.finalizers.iter().any(|f| f == pod_finalizers::FINALIZER) {
            // Held by our finalizer from before this state (a restart): what it carried drains.
            let named = pod_finalizers::named_by(pod).filter(|(id, _)| !self.state.is_inbound(id));
            if let Some((identity, _)) = named.filter(|(id, _)| self.egress.know(id)) {
                self.state.diff.touch_identity(&identity);
            }
        }
        let after = carried_after.map(|(identity, _)| identity);
        if before != after {
            for identity in before.iter().chain(&after) {
                self.carried_changed(identity);
            }
        }
    }

    /// An inbound identity is known now (a Service, an orphan in NRP): egress pods carrying it
    /// are refused, as they would have been had it been known when they were read
    /// ([`Egress::refuse_identity`]).
    fn refuse_colliding_pods(&mut self, identity: &str, step: &mut Step) {
        let refused = self.egress.refuse_identity(identity, &mut self.state.diff);
        if !refused.is_empty() {
            self.carried_changed(identity);
        }
        for (regarding, warning, addresses) in refused {
            let key = ObjectKey { namespace: regarding.namespace.clone(), name: regarding.name.clone() };
            self.pods.gone(&key, &Some((identity.to_owned(), addresses)), false);
            self.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
    }

    /// The egress side: the pods, the identities they carry and the reference counts (P4).
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    // ---- Readiness ----

    fn class(&self, identity: &str) -> Class {
        classify(&self.state.lifecycles, &self.state.nrp.foreign, &self.egress, &self.outbound, &self.state.diff, identity)
    }

    // ---- Commands ----

    fn issue(&mut self, command: Command, what: InFlight, step: &mut Step) -> u64 {
        let id = self.state.next_command_id;
        self.state.next_command_id += 1;
        self.state.in_flight.insert(id, what);
        step.commands.push(Issued { id, command });
        id
    }

    fn event(&mut self, regarding: &ObjectRef, event_type: EventType, reason: &str, message: String, step: &mut Step) {
        if regarding.name.is_empty() {
            return; // an orphan found in NRP has no object to attach an Event to
        }
        let event = Event { regarding: regarding.clone(), event_type, reason: reason.to_owned(), message };
        self.issue(Command::EmitEvent(event), InFlight::Event, step);
    }

    // ---- Write budgets ----

    /// Takes a token of `kind`'s bucket if it has one.
    fn take_token(&mut self, kind: WriteKind, now: u64) -> bool {
        let (bucket, budget) = self.budget.of(&self.config.write_budgets(), kind);
        bucket.try_take(budget, now)
    }

    /// When `kind`'s bucket next has a token, if that is after `now`.
    fn token_due(&self, kind: WriteKind, now: u64) -> Option<u64> {
        Some(self.budget.ready_at(&self.config.write_budgets(), kind, now)).filter(|&at| at > now)
    }

    /// What Azure answered a write of `kind`: a 429 shrinks its budget (and says so), an
    /// accepted write gives some of a shrunk budget back.
    fn budget_answered(&mut self, kind: WriteKind, outcome: &Outcome, now: u64, step: &mut Step) {
        let (bucket, budget) = self.budget.of(&self.config.write_budgets(), kind);
        match outcome {
            Outcome::Failed(f) if f.status == 429 => {
                let per_minute = bucket.throttled(budget, now);
                let message = format!(
                    "{} was throttled (HTTP 429): its write budget shrinks to {per_minute} a minute (configured: {} a \
                     minute) and grows back as writes are accepted",
                    kind.name(),
                    budget.per_minute
                );
                step.logs.push(LogLine { level: LogLevel::Warn, message });
            }
            Outcome::Failed(_) => {}
            _ => bucket.accepted(budget, now),
        }
    }

    /// The start-up inventory is to be read: not settled, not out, and asked for only once the
    /// lists are complete and NRP is read (start-up reconciliation uses it the moment it comes).
    fn inventory_wanted(&self) -> bool {
        !self.arm.settled && !self.arm.read_in_flight && self.state.lists_complete && self.state.nrp.loaded
    }

    fn ready_to_write(&self) -> bool {
        self.state.lists_complete && self.state.nrp.loaded && self.state.reconciled
    }

    /// Starts whatever can start now (the tracker's time, [`Clock`]); sets when to be called
    /// again (the host's time).
    fn pump(&mut self, now: u64, step: &mut Step) {
        if self.mode != Mode::ContainerLoadBalancer {
            // Outside CLB mode the tracker provisions nothing (the backend-pool updater serves
            // multi-SLB mode), so it is idle once its Events are sent.
            step.idle = step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_)));
            return;
        }
        self.bring_in_deadlines(now);
        self.maybe_reconcile(step);
        while let Some((at, identity)) = self.state.timers.first().cloned() {
            if at > now {
                break;
            }
            self.state.timers.pop_first();
            self.state.runnable.insert(identity);
        }
        while let Some((at, identity)) = self.outbound.timers.first().cloned() {
            if at > now {
                break;
            }
            self.outbound.timers.pop_first();
            self.outbound.runnable.insert(identity);
        }
        // A read scheduled past the end of time (its deadline saturated at `u64::MAX`) never
        // comes: at `now = u64::MAX` it would be due again after every read, a read per answer.
        let scheduled = self.state.nrp.next_read_ms < u64::MAX;
        let read_due = !self.state.nrp.loaded || (scheduled && now >= self.state.nrp.next_read_ms);
        if read_due
            && !self.state.nrp.read_in_flight
            && self.state.nrp.batches_in_flight.is_empty()
            && self.state.nrp.service_writes_in_flight == 0
            && now >= self.state.nrp.next_read_ms
        {
            self.state.nrp.read_in_flight = true;
            self.issue(Command::ReadNrp, InFlight::ReadNrp, step);
        }
        if self.inventory_wanted() && now >= self.arm.next_read_ms {
            self.arm.read_in_flight = true;
            self.issue(Command::ReadArm, InFlight::ReadArm, step);
        }
        if self.ready_to_write() {
            let draining: Vec<String> = self.state.draining.iter().cloned().collect();
            for identity in draining {
                self.check_drained(&identity);
            }
            let hold_nrp_writes = read_due || self.state.nrp.read_in_flight;
            // Outbound first: an inbound Service whose identity an egress identity of ours had
            // waits for that teardown (they share NRP's name and the `-pip` name), and the pass
            // that ends it must let the Service go.
            let draining: Vec<String> = self.outbound.draining.iter().cloned().collect();
            for identity in draining {
                self.check_outbound_drained(&identity);
            }
            let mut held = Vec::new();
            while self.state.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT {
                let Some(identity) = self.outbound.runnable.pop_first() else { break };
                if !self.advance_outbound(&identity, now, hold_nrp_writes, step) {
                    held.push(identity);
                }
            }
            self.outbound.runnable.extend(held);
            let mut held = Vec::new();
            while self.state.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT {
                let Some(identity) = self.state.runnable.pop_first() else { break };
                if !self.advance(&identity, now, hold_nrp_writes, step) {
                    held.push(identity);
                }
            }
            self.state.runnable.extend(held);
            if !hold_nrp_writes {
                self.sync_locations(now, step);
            }
            self.advance_pod_finalizers(now, step);
        }
        step.wake_at_ms = self.next_wake(now).map(|at| self.clock.to_host(at));
        step.idle =
            step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))) && self.is_quiet_after_events();
    }

    /// No deadline is further ahead than the longest delay the tracker schedules
    /// ([`timing::MAX_DELAY_MS`]), which its own deadlines never are (its clock does not go back).
    /// One that is was set by a clock ahead of this one (a state imported from another host, or
    /// exported before a step back) or by an older version that honoured any `Retry-After`: it
    /// is brought in to now plus that delay, so nothing waits longer. Costs a look at the last
    /// timer unless there is something to bring in; `advance` does the same for a Service's own
    /// deadline.
    fn bring_in_deadlines(&mut self, now: u64) {
        let latest = now.saturating_add(timing::MAX_DELAY_MS);
        let nrp = &mut self.state.nrp;
        nrp.next_read_ms = nrp.next_read_ms.min(latest);
        self.arm.next_read_ms = self.arm.next_read_ms.min(latest);
        nrp.batch_not_before_ms = nrp.batch_not_before_ms.min(latest);
        self.budget.bring_in(now);
        for backoff in nrp.location_backoff.values_mut() {
            backoff.not_before_ms = backoff.not_before_ms.min(latest);
        }
        while let Some((_, identity)) = self.state.timers.last().filter(|(at, _)| *at > latest).cloned() {
            self.state.timers.pop_last();
            if let Some(lifecycle) = self.state.lifecycles.get_mut(&identity) {
                lifecycle.not_before_ms = lifecycle.not_before_ms.min(latest);
            }
            self.state.timers.insert((latest, identity));
        }
        self.pods.bring_in(latest);
        while let Some((_, identity)) = self.outbound.timers.last().filter(|(at, _)| *at > latest).cloned() {
            self.outbound.timers.pop_last();
            if let Some(lifecycle) = self.outbound.lifecycles.get_mut(&identity) {
                lifecycle.not_before_ms = lifecycle.not_before_ms.min(latest);
            }
            self.outbound.timers.insert((latest, identity));
        }
    }

    /// Quiet once the Events just issued are counted as done (they need no answer to proceed).
    /// Every unsettled lifecycle is in flight, runnable, waiting on a timer or draining, so
    /// looking at those sets is enough: no scan of all Services.
    fn is_quiet_after_events(&self) -> bool {
        let quiet = self.ready_to_write()
            && !self.state.diff.has_dirty()
            && self.state.runnable.is_empty()
            && self.state.timers.is_empty()
            && self.state.draining.is_empty()
            && self.outbound.is_quiet()
            && self.pods.is_quiet()
            && self.state.in_flight.values().all(|f| matches!(f, InFlight::Event));
        // Also under the fuzz crate's `invariants` feature, so that fuzzing checks it.
        #[cfg(any(test, feature = "invariants"))]
        if quiet {
            let settled = self.state.lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "a lifecycle with work left is in none of the work sets: {:#?}", self.state.lifecycles);
            let settled = self.outbound.lifecycles.values().all(|l| !l.has_work_left());
            assert!(settled, "an outbound lifecycle with work left is in no work set: {:#?}", self.outbound.lifecycles);
        }
        quiet
    }

    fn next_wake(&self, now: u64) -> Option<u64> {
        let nrp = &self.state.nrp;
        let mut wake = self.state.timers.first().map(|(at, _)| *at);
        let mut consider = |at: u64| wake = Some(wake.map_or(at, |w| w.min(at)));
        if let Some(&(at, _)) = self.outbound.timers.first() {
            consider(at);
        }
        if let Some(at) = self.pods.next_timer() {
            consider(at);
        }
        if !nrp.read_in_flight {
            consider(nrp.next_read_ms.max(now));
        }
        if self.inventory_wanted() {
            consider(self.arm.next_read_ms.max(now));
        }
        if !self.state.runnable.is_empty() || !self.outbound.runnable.is_empty() {
            // A Service held for a token (or for a read of NRP, or for room in flight, which an
            // answer ends: waking for a token then is only early).
            for kind in [WriteKind::Services, WriteKind::Arm] {
                if let Some(at) = self.token_due(kind, now) {
                    consider(at);
                }
            }
        }
        if self.state.diff.has_dirty() && nrp.batches_in_flight.len() < MAX_BATCHES_IN_FLIGHT {
            if nrp.batch_not_before_ms > now {
                consider(nrp.batch_not_before_ms);
            } else if let Some(at) = self.token_due(WriteKind::AddressLocations, now) {
                consider(at);
            } else {
                // The next batch may go once the youngest in flight is slow, and a location
                // backing off once its delay is over. Past either, only an answer or a change
                // can make a batch: nothing to wake for.
                let slow_at = nrp.batches_in_flight.values().max().map(|at| at.saturating_add(timing::SLOW_BATCH_MS));
                if let Some(at) = slow_at.filter(|&at| at > now) {
                    consider(at);
                }
                if let Some(due) = nrp.location_backoff.values().map(|b| b.not_before_ms).filter(|&at| at > now).min() {
                    consider(due);
                }
            }
        }
        wake
    }

    /// Issues the next command of a Service's operation. Returns false when the command must
    /// wait for NRP to be read first.
    fn advance(&mut self, identity: &str, now: u64, hold_nrp_writes: bool, step: &mut Step) -> bool {
        if self.outbound.lifecycles.contains_key(identity) {
            return false; // an egress identity of the same name is torn down first
        }
        loop {
            let diff = &self.state.diff;
            let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else { return true };
            if lifecycle.in_flight.is_some() || lifecycle.parked || lifecycle.phase == Phase::DeletionPending {
                return true;
            }
            if lifecycle.phase == Phase::Created && lifecycle.steps.is_empty() {
                return true;
            }
            if lifecycle.not_before_ms > now {
                // As `bring_in_deadlines`: never further ahead than the longest delay.
                lifecycle.not_before_ms = lifecycle.not_before_ms.min(now.saturating_add(timing::MAX_DELAY_MS));
                self.state.timers.insert((lifecycle.not_before_ms, identity.to_owned()));
                return true;
            }
            let Some(&next) = lifecycle.steps.front() else {
                self.finish_operation(identity, step);
                return true;
            };
            if lifecycle.holds_already(next, diff.is_registered(identity)) {
                lifecycle.steps.pop_front();
                continue;
            }
            if next.writes_nrp() && hold_nrp_writes {
                return false;
            }
            if next.write_kind().is_some_and(|kind| !self.take_token(kind, now)) {
                return false; // `next_wake` wakes for the token
            }
            let command = self.command_for(identity, next);
            let lifecycle = self.state.lifecycles.get_mut(identity).expect("checked above");
            if lifecycle.phase == Phase::NotStarted {
                lifecycle.phase = Phase::CreationInProgress;
            }
            if next.writes_nrp() {
                self.state.nrp.service_writes_in_flight += 1;
            }
            self.state.service_commands_in_flight += 1;
            let id = self.issue(command, InFlight::Service { identity: identity.to_owned(), step: next }, step);
            self.state.lifecycles.get_mut(identity).expect("checked above").in_flight = Some((id, next));
            return true;
        }
    }

    fn command_for(&self, identity: &str, op: OpStep) -> Command {
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
    fn finish_operation(&mut self, identity: &str, step: &mut Step) {
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("caller checked");
        match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                let created = lifecycle.phase != Phase::UpdateInProgress;
                lifecycle.applied = lifecycle.op_config.clone();
                if lifecycle.desired.is_some() && lifecycle.desired != lifecycle.applied {
                    lifecycle.phase = Phase::UpdateInProgress;
                    lifecycle.op_config = lifecycle.desired.clone();
                    lifecycle.steps = [OpStep::PutLoadBalancer, OpStep::PatchStatus].into();
                    self.state.runnable.insert(identity.to_owned());
                } else if lifecycle.object_needs_repair() {
                    // Read without our finalizer (or its ingress IP) after it was written.
                    lifecycle.repair();
                    self.state.runnable.insert(identity.to_owned());
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
                    lifecycle.retries = 0;
                    self.seed(identity);
                    self.state.diff.touch_identity(identity);
                    self.state.runnable.insert(identity.to_owned());
                } else {
                    self.state.lifecycles.remove(identity);
                }
                self.event(&service, EventType::Normal, reason::DELETED_LOAD_BALANCER, message, step);
            }
            Phase::Created | Phase::DeletionPending => {}
        }
    }

    /// A draining Service whose addresses have left NRP moves on to deletion.
    fn check_drained(&mut self, identity: &str) {
        let Some(lifecycle) = self.state.lifecycles.get(identity) else {
            self.state.draining.remove(identity);
            return;
        };
        if lifecycle.phase != Phase::DeletionPending || lifecycle.in_flight.is_some() {
            return;
        }
        if !self.drained(identity) {
            return;
        }
        let lifecycle = self.state.lifecycles.get_mut(identity).expect("read above");
        lifecycle.phase = Phase::DeletionInProgress;
        lifecycle.steps = OpStep::DELETE.into();
        self.state.draining.remove(identity);
        self.state.runnable.insert(identity.to_owned());
    }

    /// No NRP address maps to the identity, nor may one in a batch whose answer is not in.
    fn drained(&self, identity: &str) -> bool {
        !self.state.diff.nrp_references(identity) && !self.batch_in_flight_mentions(identity)
    }

    fn batch_in_flight_mentions(&self, identity: &str) -> bool {
        self.batches_in_flight().flatten().flat_map(|l| &l.addresses).any(|a| a.services.iter().any(|s| s == identity))
    }

    /// The address-location batches in flight.
    fn batches_in_flight(&self) -> impl Iterator<Item = &[NrpLocation]> {
        location_batches(&self.state.nrp.batches_in_flight, &self.state.in_flight)
    }

    fn service_outcome(&mut self, identity: &str, id: u64, op: OpStep, outcome: Outcome, now: u64, step: &mut Step) {
        if let Some(kind) = op.write_kind() {
            // Azure's answer, whether or not the lifecycle still waits for it.
            self.budget_answered(kind, &outcome, now, step);
        }
        let Some(lifecycle) = self.state.lifecycles.get_mut(identity) else { return };
        if lifecycle.in_flight.map(|(i, _)| i) != Some(id) {
            return;
        }
        lifecycle.in_flight = None;
        self.state.runnable.insert(identity.to_owned());
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
            // NRP still maps addresses to it: drain again before unregistering.
            lifecycle.phase = Phase::DeletionPending;
            lifecycle.steps.clear();
            self.state.draining.insert(identity.to_owned());
            self.state.diff.touch_identity(identity);
            self.state.nrp.next_read_ms = now; // our mirror was wrong: read NRP back
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
            lifecycle.retries = 0;
            lifecycle.not_before_ms = 0;
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
        lifecycle.retries = lifecycle.retries.saturating_add(1);
        let what = format!("{op:?} for load balancer {identity}");
        let at = now.saturating_add(retry_delay(identity, lifecycle.retries, &failure, what, step));
        lifecycle.not_before_ms = at;
        self.state.timers.insert((at, identity.to_owned()));
        if !lifecycle.failing {
            lifecycle.failing = true;
            let message = format!(
                "{op:?} for load balancer {identity} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            self.event(&service, EventType::Warning, reason::SYNC_LOAD_BALANCER_FAILED, message, step);
        }
    }

    fn step_succeeded(&mut self, identity: &str, op: OpStep) {
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
        lifecycle.retries = 0;
        lifecycle.not_before_ms = 0;
        lifecycle.failing = false;
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            return; // pre-empted by a delete; its facts are recorded above
        }
        if lifecycle.steps.front() == Some(&op) {
            lifecycle.steps.pop_front();
        }
    }

    // ---- Address locations ----

    fn sync_locations(&mut self, now: u64, step: &mut Step) {
        let nrp = &self.state.nrp;
        // Another batch beside those in flight only once they are all slow: a batch answered at
        // NRP's usual pace lets the changes behind it coalesce.
        let all_slow = nrp.batches_in_flight.values().all(|&at| now.saturating_sub(at) >= timing::SLOW_BATCH_MS);
        if nrp.batches_in_flight.len() >= MAX_BATCHES_IN_FLIGHT
            || !all_slow
            || now < nrp.batch_not_before_ms
            || !self.state.diff.has_dirty()
            || self.token_due(WriteKind::AddressLocations, now).is_some()
        {
            return;
        }
        let State { diff, lifecycles, nrp, in_flight, .. } = &mut self.state;
        let busy: BTreeSet<&str> =
            location_batches(&nrp.batches_in_flight, in_flight).flatten().map(|l| l.location.as_str()).collect();
        // A backoff is kept while its location may fail again: until it is next accepted, or
        // once over, if the location is neither dirty nor in flight (it came back in sync).
        nrp.location_backoff
            .retain(|location, b| b.not_before_ms > now || busy.contains(location.as_str()) || diff.is_dirty(location));
        // A location in flight or backing off stays dirty for a later batch.
        let backoff = &nrp.location_backoff;
        let waits =
            |location: &str| busy.contains(location) || backoff.get(location).is_some_and(|b| b.not_before_ms > now);
        let (limit, foreign, egress, outbound) = (nrp.batch_limit.max(1), &nrp.foreign, &self.egress, &self.outbound);
        let mut batch =
            diff.take_sync(limit, waits, |diff, id| classify(lifecycles, foreign, egress, outbound, diff, id));
        // A location NRP refused on its own waits until its update changes.
        let quarantined = &mut self.state.nrp.quarantined;
        batch.retain(|update| match quarantined.get(&update.location) {
            Some(refused) if refused == update => false,
            Some(_) => {
                quarantined.remove(&update.location);
                true
            }
            None => true,
        });
        if batch.is_empty() {
            return;
        }
        let taken = self.take_token(WriteKind::AddressLocations, now);
        debug_assert!(taken, "checked by token_due above");
        let id = self.issue(Command::UpdateAddressLocations(batch.clone()), InFlight::Locations(batch), step);
        self.state.nrp.batches_in_flight.insert(id, now);
    }

    fn locations_outcome(&mut self, id: u64, batch: Vec<NrpLocation>, outcome: Outcome, now: u64, step: &mut Step) {
        self.state.nrp.batches_in_flight.remove(&id);
        self.pods.recheck();
        self.budget_answered(WriteKind::AddressLocations, &outcome, now, step);
        match outcome {
            Outcome::Failed(failure) => {
                for location in &batch {
                    self.state.diff.mark_uncertain(location);
                }
                let nrp = &mut self.state.nrp;
                if matches!(failure.status, 400 | 422) {
                    // NRP refuses the batch: halve it until the refused location stands alone,
                    // then set that one aside so it cannot block everyone else's addresses.
                    if batch.len() > 1 {
                        nrp.batch_limit = (batch.len() / 2).max(1);
                    } else if let Some(refused) = batch.into_iter().next() {
                        nrp.quarantined.insert(refused.location.clone(), refused);
                        nrp.batch_limit = MAX_LOCATIONS_PER_BATCH;
                    }
                    return;
                }
                let what = "update-address-locations";
                if failure.status == 429 {
                    // Throttled: the subscription's budget, so every batch waits, for its
                    // `Retry-After` (capped) if it has one; the shrunk, emptied write budget
                    // paces the batches after it (`budget_answered`), instead of a backoff.
                    nrp.batch_retries = nrp.batch_retries.saturating_add(1);
                    if failure.retry_after_ms.is_some() {
                        let delay = retry_delay("address-locations", nrp.batch_retries, &failure, what, step);
                        nrp.batch_not_before_ms = now.saturating_add(delay);
                    }
                    return;
                }
                // Failed or timed out: only these locations wait, backing off together.
                let backoff = &mut nrp.location_backoff;
                let retries = batch.iter().filter_map(|l| backoff.get(&l.location)).map(|b| b.retries).max();
                let retries = retries.unwrap_or(0).saturating_add(1);
                let key = batch.first().map_or("address-locations", |l| l.location.as_str());
                let not_before_ms = now.saturating_add(retry_delay(key, retries, &failure, what, step));
                for location in batch {
                    backoff.insert(location.location, Backoff { retries, not_before_ms });
                }
            }
            _ => {
                self.state.diff.apply(&batch);
                let nrp = &mut self.state.nrp;
                for location in &batch {
                    nrp.location_backoff.remove(&location.location);
                }
                nrp.batch_retries = 0;
                nrp.batch_not_before_ms = 0;
                nrp.batch_limit = nrp.batch_limit.saturating_mul(2).min(MAX_LOCATIONS_PER_BATCH);
            }
        }
    }

    // ---- Reading NRP ----

    fn read_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) {
        self.state.nrp.read_in_flight = false;
        let snapshot = match outcome {
            Outcome::NrpSnapshot(snapshot) => snapshot,
            Outcome::Failed(failure) => {
                let nrp = &mut self.state.nrp;
                nrp.read_retries = nrp.read_retries.saturating_add(1);
                let delay = retry_delay("read-nrp", nrp.read_retries, &failure, "read-nrp", step);
                nrp.next_read_ms = now.saturating_add(delay);
                return;
            }
            // Any other answer is a host bug; read again after the shortest backoff.
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::ArmInventory(_) => {
                self.state.nrp.next_read_ms = now.saturating_add(timing::BACKOFF_BASE_MS);
                return;
            }
        };
        let mut inbound = BTreeSet::new();
        let mut foreign = BTreeSet::new();
        for service in &snapshot.services {
            let name = service.name.to_ascii_lowercase();
            if service.service_type.eq_ignore_ascii_case("Inbound") && !service.is_default {
                inbound.insert(name);
            } else {
                foreign.insert(name);
            }
        }
        self.state.diff.replace_nrp(inbound, &snapshot.locations);
        self.egress.nrp_read(&snapshot.services, &self.state.diff);
        self.pods.recheck();
        let nrp = &mut self.state.nrp;
        nrp.foreign = foreign;
        nrp.loaded = true;
        nrp.read_retries = 0;
        // Saturating, like every deadline: near the end of u64 time a wrapped deadline would
        // keep a read always due, and a due read holds every NRP write.
        nrp.next_read_ms = now.saturating_add(timing::RESYNC_INTERVAL_MS);
        nrp.quarantined.clear();
        if self.state.reconciled {
            self.reconcile_with_nrp(step);
        } else {
            self.maybe_reconcile(step);
        }
    }

    fn maybe_reconcile(&mut self, step: &mut Step) {
        if !self.state.reconciled && self.state.lists_complete && self.state.nrp.loaded && self.arm.settled {
            self.state.reconciled = true;
            self.reconcile_with_nrp(step);
        }
    }

    /// After a read of NRP: re-register what NRP lost, adopt or clean up what it has that
    /// Kubernetes does not explain (upstream §c.2.4).
    fn reconcile_with_nrp(&mut self, step: &mut Step) {
        self.reconcile_outbound();
        let registered: Vec<String> = self.state.diff.registered().iter().map(Name::to_string).collect();
        for (identity, lifecycle) in self.state.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.state.diff.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.op_config = lifecycle.desired.clone();
                lifecycle.steps = OpStep::ENSURE.into();
                self.state.runnable.insert(identity.clone());
            } else if lifecycle.phase == Phase::DeletionInProgress
                && lifecycle.in_flight.is_none()
                && lifecycle.steps.contains(&OpStep::Unregister)
                && self.state.diff.nrp_references(identity)
            {
                // Its drain ended on a mirror NRP now shows was wrong (after an overlay-mappings
                // refusal the drain ends before NRP is read back): drain again before unregistering.
                lifecycle.phase = Phase::DeletionPending;
                lifecycle.steps.clear();
                self.state.draining.insert(identity.clone());
                self.state.diff.touch_identity(identity);
            }
        }
        for identity in registered {
            if self.state.lifecycles.contains_key(&identity) || !looks_like_uid(&identity) {
                continue;
            }
            let record =
                self.state.service_by_identity.get(&identity).and_then(|key| self.state.services.get(key)).cloned();
            match record {
                // A live Service that is no longer admitted keeps serving (design §3).
                Some(r) if !matches!(r.verdict, Verdict::Cleanup | Verdict::Ignored(_)) => {
                    let lifecycle =
                        Lifecycle::new(object_ref(&r.observed), Phase::Created, ObjectState::of(&r.observed), None);
                    self.state.lifecycles.insert(identity.clone(), lifecycle);
                    self.seed(&identity);
                    self.state.diff.touch_identity(&identity);
                }
                Some(r) => self.adopt_for_deletion(&identity, object_ref(&r.observed), ObjectState::of(&r.observed)),
                None => {
                    self.adopt_for_deletion(&identity, orphan(&identity), ObjectState::gone());
                    self.refuse_colliding_pods(&identity, step);
                }
            }
        }
    }

    // ---- Egress pod finalizers (crate::pod_finalizers) ----

    /// Adds the finalizer to the pods that carry an identity, and releases it from those that
    /// carry nothing any more once what they carried has left NRP.
    fn advance_pod_finalizers(&mut self, now: u64, step: &mut Step) {
        let runnable = self.pods.take_runnable(now);
        let due: Vec<(ObjectKey, Want)> =
            runnable.into_iter().filter_map(|key| self.pods.due(&key, now).map(|want| (key, want))).collect();
        let writes: Vec<(ObjectKey, bool)> = {
            // The batches in flight's locations, sorted, once per call rather than once per address
            // a releasing pod carried (a mass deletion releases thousands). No location is in two
            // batches in flight (`State::check`).
            let mut in_flight: Vec<&NrpLocation> = Vec::new();
            if due.iter().any(|(_, want)| *want == Want::Release) {
                in_flight.extend(self.batches_in_flight().flatten());
                in_flight.sort_unstable_by(|a, b| a.location.cmp(&b.location));
            }
            due.into_iter()
                .filter_map(|(key, want)| match want {
                    Want::Add => Some((key, true)),
                    Want::Release if self.pod_released(&key, &in_flight) => Some((key, false)),
                    // Waits in `releasing` until something changes.
                    Want::Release | Want::Nothing => None,
                })
                .collect()
        };
        for (key, present) in writes {
            let id = self.state.next_command_id;
            let pod = self.pods.issued(&key, id, present);
            let what = InFlight::PodFinalizer { key, uid: pod.uid.to_string(), present };
            let finalizer = pod_finalizers::FINALIZER.to_owned();
            self.issue(Command::SetFinalizer { service: pod, finalizer, present }, what, step);
        }
    }

    /// Whether what a pod carried has left NRP: each of its addresses is unmapped for its
    /// identity (or another pod's now), no batch in flight (`in_flight`, sorted by location)
    /// names the identity there, and an identity no pod carries any more has no outbound
    /// lifecycle left (its teardown ended). A pod none of whose addresses was ever read (it had
    /// no IP when it was seen) waits until its identities have no address left in NRP that no
    /// live pod backs: one of those may have been its own.
    fn pod_released(&self, key: &ObjectKey, in_flight: &[&NrpLocation]) -> bool {
        let Some(held) = self.pods.get(key) else { return true };
        let in_batch = |identity: &str, location: &str, address: &str| {
            let Ok(at) = in_flight.binary_search_by(|l| l.location.as_str().cmp(location)) else { return false };
            in_flight[at].addresses.iter().any(|a| a.address == address && a.services.iter().any(|s| s == identity))
        };
        held.left.iter().all(|(identity, location, address)| {
            !self.state.diff.awaits_drain(identity, location, address) && !in_batch(identity, location, address)
        }) && held.identities.iter().all(|id| self.egress.carries(id) || !self.outbound.lifecycles.contains_key(id))
            && (!held.left.is_empty() || held.identities.iter().all(|id| !self.state.diff.awaits_any_drain(id)))
    }

    #[allow(clippy::too_many_arguments)]
    fn pod_finalizer_outcome(
        &mut self,
        key: &ObjectKey,
        uid: &str,
        id: u64,
        present: bool,
        outcome: Outcome,
        now: u64,
        step: &mut Step,
    ) {
        let failure = match &outcome {
            Outcome::Failed(f) => Some(f),
            _ => None,
        };
        let what = format!("{} finalizer of pod {}/{}", if present { "adding the" } else { "releasing the" }, key.namespace, key.name);
        let report = self.pods.answered(key, uid, id, failure, |retries| {
            let failure = failure.expect("only a failure is retried");
            now.saturating_add(retry_delay(&format!("{}/{}", key.namespace, key.name), retries, failure, &what, step))
        });
        if let Some(failure) = report {
            let code = failure.code.as_deref().map(|c| format!(", {c}")).unwrap_or_default();
            let message = format!("{what} failed (HTTP {}{code}): {}; retrying with backoff", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message: message.clone() });
            let regarding = ObjectRef { kind: "Pod".into(), namespace: key.namespace.clone(), name: key.name.clone(), uid: Name::new(uid) };
            self.event(&regarding, EventType::Warning, pod_finalizers::reason::POD_FINALIZER_FAILED, message, step);
        }
    }

    // ---- Outbound lifecycles (crate::outbound) ----

    /// Whether a Node of the cluster has an IPv6 address: an identity created now gets an IPv6
    /// public IP too (upstream: the cluster's families, decided once per identity).
    fn cluster_has_ipv6(&self) -> bool {
        self.state.nodes.values().any(|n| n.v6.is_some())
    }

    /// Whether pods carry the identity changed (none to some, some to none). Nothing is decided
    /// before start-up reconciliation, which decides for every carried identity once NRP (which
    /// says which identities are somebody else's) has been read.
    fn carried_changed(&mut self, identity: &str) {
        if !self.state.reconciled || self.mode != Mode::ContainerLoadBalancer {
            return;
        }
        let carried = self.egress.carries(identity);
        let Some(lifecycle) = self.outbound.lifecycles.get_mut(identity) else {
            // An identity NRP already lists is somebody else's: programmed, never provisioned.
            if carried && !self.egress.is_registered(identity) {
                let lifecycle = OutboundLifecycle::creating(self.cluster_has_ipv6());
                self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                self.outbound.runnable.insert(identity.to_owned());
            }
            return;
        };
        match (carried, lifecycle.phase) {
            // Back while its addresses drain, before any teardown step: it stays as it is
            // (upstream: revived only if no delete was attempted).
            (true, Phase::DeletionPending) if lifecycle.whole => {
                lifecycle.phase = Phase::Created;
                self.outbound.draining.remove(identity);
                self.state.diff.touch_identity(identity);
            }
            (true, Phase::DeletionPending | Phase::DeletionInProgress) => lifecycle.recreate = true,
            (true, _) => {}
            (false, Phase::DeletionPending | Phase::DeletionInProgress) => lifecycle.recreate = false,
            // Nothing was written yet: nothing to tear down.
            (false, Phase::NotStarted) => {
                self.outbound.lifecycles.remove(identity);
                self.outbound.runnable.remove(identity);
            }
            // The last pod went: drain, then tear down. A command in flight finishes first.
            (false, _) => {
                if lifecycle.steps.front() == Some(&OutStep::Register) && lifecycle.retries > 0 {
                    // A registration was answered with a failure and waits for its retry: it
                    // may have taken effect all the same (a lost response), so the teardown
                    // unregisters rather than trust the mirror (a read of NRP corrects it).
                    self.egress.set_registered(identity, true);
                }
                lifecycle.phase = Phase::DeletionPending;
                lifecycle.steps.clear();
                lifecycle.retries = 0;
                lifecycle.not_before_ms = 0;
                lifecycle.failing = false;
                self.outbound.draining.insert(identity.to_owned());
                self.state.diff.touch_identity(identity);
            }
        }
    }

    /// After every read of NRP: carried identities with no lifecycle (pods seen before the
    /// first read, or an identity whose registration by somebody else went away) are decided
    /// now, and one of ours that NRP lost is ensured again (every step is a PUT: idempotent).
    fn reconcile_outbound(&mut self) {
        let undecided: Vec<String> =
            self.egress.carried().filter(|id| !self.outbound.lifecycles.contains_key(*id)).map(str::to_owned).collect();
        for identity in undecided {
            self.carried_changed(&identity);
        }
        for (identity, lifecycle) in self.outbound.lifecycles.iter_mut() {
            if lifecycle.phase == Phase::Created && !self.egress.is_registered(identity) {
                lifecycle.phase = Phase::UpdateInProgress;
                lifecycle.steps = outbound::ENSURE.into();
                self.outbound.runnable.insert(identity.clone());
                self.state.diff.touch_identity(identity);
            } else if lifecycle.phase == Phase::DeletionInProgress
                && lifecycle.in_flight.is_none()
                && lifecycle.steps.contains(&OutStep::Unregister)
                && self.state.diff.nrp_references(identity)
            {
                // As an inbound deletion's (`reconcile_with_nrp`): a drain that ended on a mirror
                // NRP now contradicts drains again before the unregistration.
                lifecycle.phase = Phase::DeletionPending;
                lifecycle.steps.clear();
                self.outbound.runnable.remove(identity);
                self.outbound.draining.insert(identity.clone());
                self.state.diff.touch_identity(identity);
            }
        }
    }

    /// An identity whose addresses have left NRP starts its teardown.
    fn check_outbound_drained(&mut self, identity: &str) {
        let Some(lifecycle) = self.outbound.lifecycles.get(identity) else {
            self.outbound.draining.remove(identity);
            return;
        };
        if lifecycle.phase != Phase::DeletionPending || lifecycle.in_flight.is_some() {
            return;
        }
        if !self.drained(identity) {
            return;
        }
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("read above");
        lifecycle.phase = Phase::DeletionInProgress;
        lifecycle.steps = outbound::DELETE.into();
        self.outbound.draining.remove(identity);
        self.outbound.runnable.insert(identity.to_owned());
    }

    /// Issues the next command of an identity's outbound operation. Returns false when it must
    /// wait (for a read of NRP, or for a token).
    fn advance_outbound(&mut self, identity: &str, now: u64, hold_nrp_writes: bool, step: &mut Step) -> bool {
        loop {
            let registered = self.egress.is_registered(identity);
            let Some(lifecycle) = self.outbound.lifecycles.get_mut(identity) else { return true };
            if lifecycle.in_flight.is_some() || lifecycle.phase == Phase::DeletionPending {
                return true;
            }
            if lifecycle.phase == Phase::Created && lifecycle.steps.is_empty() {
                return true;
            }
            if lifecycle.not_before_ms > now {
                lifecycle.not_before_ms = lifecycle.not_before_ms.min(now.saturating_add(timing::MAX_DELAY_MS));
                self.outbound.timers.insert((lifecycle.not_before_ms, identity.to_owned()));
                return true;
            }
            let Some(&next) = lifecycle.steps.front() else {
                self.finish_outbound(identity, step);
                return true;
            };
            if lifecycle.holds_already(next, registered) {
                lifecycle.steps.pop_front();
                continue;
            }
            if next.writes_nrp() && hold_nrp_writes {
                return false;
            }
            let kind = if next.writes_nrp() { WriteKind::Services } else { WriteKind::Arm };
            if !self.take_token(kind, now) {
                return false; // `next_wake` wakes for the token
            }
            let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("checked above");
            let command = lifecycle.command(identity, next);
            if lifecycle.phase == Phase::NotStarted {
                lifecycle.phase = Phase::CreationInProgress;
            }
            lifecycle.sending(next);
            if next.writes_nrp() {
                self.state.nrp.service_writes_in_flight += 1;
            }
            self.state.service_commands_in_flight += 1;
            let id = self.issue(command, InFlight::Outbound { identity: identity.to_owned(), step: next }, step);
            self.outbound.lifecycles.get_mut(identity).expect("checked above").in_flight = Some((id, next));
            return true;
        }
    }

    /// The last step of an outbound operation succeeded.
    fn finish_outbound(&mut self, identity: &str, step: &mut Step) {
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("caller checked");
        let message = match lifecycle.phase {
            Phase::NotStarted | Phase::CreationInProgress | Phase::UpdateInProgress => {
                lifecycle.phase = Phase::Created;
                lifecycle.whole = true;
                self.state.diff.touch_identity(identity);
                format!("egress identity {identity}: NAT gateway and public IP(s) in place, Outbound service registered")
            }
            Phase::DeletionInProgress => {
                let recreate = lifecycle.recreate && self.egress.carries(identity);
                self.outbound.lifecycles.remove(identity);
                self.pods.recheck(); // a last pod's finalizer waited for this
                if recreate {
                    let lifecycle = OutboundLifecycle::creating(self.cluster_has_ipv6());
                    self.outbound.lifecycles.insert(identity.to_owned(), lifecycle);
                    self.outbound.runnable.insert(identity.to_owned());
                }
                format!("egress identity {identity}: unregistered, NAT gateway and public IP(s) deleted")
            }
            Phase::Created | Phase::DeletionPending => return,
        };
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }

    fn outbound_outcome(&mut self, identity: &str, id: u64, op: OutStep, outcome: Outcome, now: u64, step: &mut Step) {
        // Azure's answer, whether or not the lifecycle still waits for it.
        let kind = if op.writes_nrp() { WriteKind::Services } else { WriteKind::Arm };
        self.budget_answered(kind, &outcome, now, step);
        let Some(lifecycle) = self.outbound.lifecycles.get_mut(identity) else { return };
        if lifecycle.in_flight.map(|(i, _)| i) != Some(id) {
            return;
        }
        lifecycle.in_flight = None;
        self.outbound.runnable.insert(identity.to_owned());
        let failure = match outcome {
            Outcome::Failed(f) => f,
            Outcome::Ok | Outcome::PublicIpAddress(_) | Outcome::NrpSnapshot(_) | Outcome::ArmInventory(_) => {
                self.outbound_step_succeeded(identity, op);
                return;
            }
        };
        if failure.status == 404 && op.gone_is_done() {
            self.outbound_step_succeeded(identity, op);
            return;
        }
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            if op == OutStep::Register {
                // It may have taken effect whatever the answer: the teardown unregisters.
                self.egress.set_registered(identity, true);
            }
            return; // a creation pre-empted by the teardown: the teardown carries on
        }
        let code = failure.code.as_deref().unwrap_or("");
        let what = format!("{op:?} for egress identity {identity}");
        if op.failure_is_ignored() {
            let message =
                format!("{what} failed (HTTP {} {code}): {}; the teardown goes on", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message });
            self.outbound_step_succeeded(identity, op);
            return;
        }
        if op == OutStep::Unregister && code == OVERLAY_MAPPINGS_CODE {
            // NRP still maps addresses to it: drain again before unregistering.
            lifecycle.phase = Phase::DeletionPending;
            lifecycle.steps.clear();
            self.outbound.draining.insert(identity.to_owned());
            self.state.diff.touch_identity(identity);
            self.state.nrp.next_read_ms = now; // our mirror was wrong: read NRP back
        }
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("still there");
        lifecycle.retries = lifecycle.retries.saturating_add(1);
        let at = now.saturating_add(retry_delay(identity, lifecycle.retries, &failure, &what, step));
        lifecycle.not_before_ms = at;
        self.outbound.timers.insert((at, identity.to_owned()));
        if !lifecycle.failing {
            lifecycle.failing = true;
            let message = format!(
                "{what} failed (HTTP {}{}): {}; retrying with backoff",
                failure.status,
                if code.is_empty() { String::new() } else { format!(", {code}") },
                failure.message
            );
            step.logs.push(LogLine { level: LogLevel::Warn, message });
        }
    }

    fn outbound_step_succeeded(&mut self, identity: &str, op: OutStep) {
        match op {
            OutStep::Register => {
                self.egress.set_registered(identity, true);
                self.state.diff.touch_identity(identity);
            }
            OutStep::Unregister => self.egress.set_registered(identity, false),
            _ => {}
        }
        let lifecycle = self.outbound.lifecycles.get_mut(identity).expect("caller checked");
        lifecycle.succeeded(op);
        lifecycle.retries = 0;
        lifecycle.not_before_ms = 0;
        lifecycle.failing = false;
        if lifecycle.phase.is_deleting() && !op.is_delete_step() {
            return; // pre-empted by the teardown; its facts are recorded above
        }
        if lifecycle.steps.front() == Some(&op) {
            lifecycle.steps.pop_front();
        }
    }

    /// The outbound side: the lifecycles of the egress identities this tracker provisions.
    pub fn outbound(&self) -> &Outbound {
        &self.outbound
    }

    // ---- The start-up inventory of ARM ----

    fn arm_outcome(&mut self, outcome: Outcome, now: u64, step: &mut Step) {
        let arm = &mut self.arm;
        arm.read_in_flight = false;
        match outcome {
            Outcome::ArmInventory(inventory) => {
                arm.settled = true;
                // Issued only once the lists are complete and NRP is read: start-up
                // reconciliation runs now, with the inventory.
                self.maybe_reconcile(step);
                self.adopt_from_arm(&inventory, step);
                return;
            }
            Outcome::Failed(failure) if arm.read_retries.saturating_add(1) < timing::ARM_READ_ATTEMPTS => {
                arm.read_retries += 1;
                let delay = retry_delay("read-arm", arm.read_retries, &failure, "read-arm", step);
                arm.next_read_ms = now.saturating_add(delay);
            }
            other => {
                // No `Debug` of the answer: it would pull the formatting of every record into the
                // component for one log line.
                let why = match other {
                    Outcome::Failed(f) => format!("HTTP {} {}: {}", f.status, f.code.unwrap_or_default(), f.message),
                    _ => "the host answered with another outcome than an inventory".to_owned(),
                };
                let message = format!(
                    "read-arm failed {} time(s) ({why}); start-up goes on without the ARM inventory: \
                     every Service's public IP and load balancer is written once, none is adopted",
                    arm.read_retries + 1
                );
                step.logs.push(LogLine { level: LogLevel::Warn, message });
                arm.settled = true;
            }
        }
        self.maybe_reconcile(step);
    }

    /// Start-up adoption: a Service not yet provisioned by this tracker whose public IP (and
    /// load balancer) ARM already holds as it wants them skips those writes, and one that needs
    /// nothing written at all is created as it is, with no second `EnsuredLoadBalancer` Event.
    /// Then the sweep: a UID-named load balancer of our shape, or a UID-named `-pip` public IP,
    /// that no Service, NRP registration, egress identity or foreign service explains is ours
    /// from a Service deleted while no controller ran, and is deleted.
    fn adopt_from_arm(&mut self, inventory: &ArmInventory, step: &mut Step) {
        // Names sorted with their index, not maps: each map or sort of another type costs the
        // component kilobytes of code, and both lists share this one.
        fn by_name(mut names: Vec<(&str, usize)>) -> Vec<(&str, usize)> {
            names.sort_unstable();
            names
        }
        let public_ips = by_name(inventory.public_ips.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect());
        let shaped = inventory.load_balancers.iter().enumerate().filter(|(_, l)| l.shape.is_some());
        let load_balancers = by_name(shaped.map(|(i, l)| (l.name.as_str(), i)).collect());
        let find = |sorted: &[(&str, usize)], name: &str| {
            sorted.binary_search_by_key(&name, |(n, _)| n).ok().map(|i| sorted[i].1)
        };
        let public_ip_named = |name: &str| find(&public_ips, name).map(|i| &inventory.public_ips[i]);
        let load_balancer_named =
            |name: &str| find(&load_balancers, name).and_then(|i| inventory.load_balancers[i].shape.as_ref());
        let (mut adopted, mut whole) = (0usize, 0usize);
        for (identity, lifecycle) in self.state.lifecycles.iter_mut() {
            if lifecycle.phase != Phase::NotStarted {
                continue;
            }
            let Some(config) = lifecycle.op_config.as_ref() else { continue };
            let public_ip = public_ip_named(&config.public_ip.name)
                .filter(|p| p.as_put && p.version == config.public_ip.version)
                .and_then(|p| p.address.clone());
            let Some(address) = public_ip else { continue };
            let load_balancer_holds = load_balancer_named(&config.load_balancer.name)
                .is_some_and(|lb| same_load_balancer(lb, &config.load_balancer));
            lifecycle
                .steps
                .retain(|s| *s != OpStep::PutPublicIp && (*s != OpStep::PutLoadBalancer || !load_balancer_holds));
            adopted += 1;
            lifecycle.ingress_ip = Some(address);
            // Every step left already holds: the Service is as a creation would leave it.
            let registered = self.state.diff.is_registered(identity);
            if lifecycle.steps.iter().all(|&op| lifecycle.holds_already(op, registered)) {
                lifecycle.phase = Phase::Created;
                lifecycle.applied = lifecycle.op_config.clone();
                lifecycle.steps.clear();
                self.state.runnable.remove(identity);
                whole += 1;
            }
        }
        let sweepable = |tracker: &Self, identity: &str| {
            looks_like_uid(identity)
                && !tracker.state.lifecycles.contains_key(identity)
                && !tracker.state.service_by_identity.contains_key(identity)
                && !tracker.state.diff.is_registered(identity)
                && !tracker.state.nrp.foreign.contains(identity)
                && tracker.egress.class(identity).is_none()
        };
        let mut orphans = 0usize;
        for &(name, index) in &load_balancers {
            let Some(lb) = inventory.load_balancers[index].shape.as_ref() else { continue };
            let ours = lb.backend_pool == name && lb.public_ip == format!("{name}-pip");
            if ours && sweepable(self, name) {
                self.adopt_for_deletion(name, orphan(name), ObjectState::gone());
                orphans += 1;
            }
        }
        // Then the public IPs left without a load balancer (those with one are adopted above).
        for &(name, _) in &public_ips {
            if let Some(identity) = name.strip_suffix("-pip").filter(|id| sweepable(self, id)) {
                self.adopt_for_deletion(identity, orphan(identity), ObjectState::gone());
                orphans += 1;
            }
        }
        let (outbound_adopted, outbound_orphans) = self.adopt_outbound_from_arm(inventory);
        let message = format!(
            "start-up inventory: {} public IP(s), {} load balancer(s), {} NAT gateway(s); {adopted} Service(s) \
             adopted their public IP, {whole} of them with nothing to write; {} orphan(s) of deleted Services to \
             delete; {outbound_adopted} egress identit(y/ies) adopted, {outbound_orphans} no pod carries to tear down",
            inventory.public_ips.len(),
            inventory.load_balancers.len(),
            inventory.nat_gateways.len(),
            orphans
        );
        step.logs.push(LogLine { level: LogLevel::Info, message });
    }

    /// Start-up adoption of egress identities. A NAT gateway of ours is one named as a valid
    /// identity that is exactly what `PutNatGateway` makes of it (its public IPs `<id>-pip`
    /// and, if any, `<id>-pip-v6`). Carried by a pod and registered: ours, created (no write). Carried
    /// and being created: what already holds is not written again. Carried by no pod: left from
    /// before (its pods went while no controller ran, or a teardown was cut short) and torn down,
    /// after a drain if NRP still maps its addresses. Nothing else is touched, and never the RP's
    /// `default-natgw` (not a valid identity). Public IPs a teardown cut short left after deleting
    /// their NAT gateway are not swept: `<id>-pip` alone does not prove a public IP ours (the
    /// inventory test keeps `kubernetes-pip`). Returns (adopted, torn down).
    fn adopt_outbound_from_arm(&mut self, inventory: &ArmInventory) -> (usize, usize) {
        let (mut adopted, mut orphans) = (0, 0);
        let pip = outbound::public_ip_name;
        for nat in &inventory.nat_gateways {
            let id = nat.name.to_ascii_lowercase();
            let v6 = !nat.public_ips_v6.is_empty();
            let shaped = nat.as_put
                && nat.public_ips == [pip(&id, false)]
                && (!v6 || nat.public_ips_v6 == [pip(&id, true)]);
            if !shaped || !crate::egress::is_valid_identity(&id) || self.state.is_inbound(&id) {
                continue;
            }
            let (carried, registered) = (self.egress.carries(&id), self.egress.is_registered(&id));
            let listed_as_put = |name: &str| inventory.public_ips.iter().any(|p| p.name.eq_ignore_ascii_case(name) && p.as_put);
            match self.outbound.lifecycles.get_mut(&id) {
                Some(lifecycle) if lifecycle.phase == Phase::NotStarted => {
                    let holds = nat.associated
                        && lifecycle.v6 == v6
                        && listed_as_put(&pip(&id, false))
                        && (!v6 || listed_as_put(&pip(&id, true)));
                    if holds {
                        lifecycle.steps.retain(|s| !matches!(s, OutStep::PutPublicIp | OutStep::PutPublicIpV6 | OutStep::PutNatGateway));
                        lifecycle.public_ips_put = true;
                        lifecycle.nat_gateway_put = true;
                        adopted += 1;
                    }
                }
                Some(_) => {}
                None if carried && registered => {
                    let lifecycle = OutboundLifecycle::new(Phase::Created, v6, VecDeque::new());
                    self.outbound.lifecycles.insert(id.clone(), lifecycle);
                    self.state.diff.touch_identity(&id);
                    adopted += 1;
                }
                None if carried => {}
                None => {
                    let mut lifecycle = OutboundLifecycle::new(Phase::DeletionPending, v6, VecDeque::new());
                    lifecycle.whole = false;
                    self.outbound.lifecycles.insert(id.clone(), lifecycle);
                    self.outbound.draining.insert(id.clone());
                    self.state.diff.touch_identity(&id);
                    orphans += 1;
                }
            }
        }
        (adopted, orphans + self.sweep_egress_public_ips(inventory))
    }

    /// The public IPs a teardown cut short left after deleting their NAT gateway (upstream
    /// `TestGuardEgressPublicIPsAreSweptOnceNATGatewayIsGone`): `<id>-pip` / `<id>-pip-v6` of our
    /// shape (StandardV2, static, of their family) for a valid identity that is no Service's, has no
    /// outbound lifecycle (a NAT gateway of ours above made one), no pod carries, NRP neither
    /// registers nor references, and that no load balancer or NAT gateway of the resource group
    /// uses. They go through the outbound teardown, whose other steps hold already. The RP's
    /// `default-natgw-pip` is never one (`default-natgw` is no valid identity); UID-shaped names
    /// are the inbound sweep's. Returns how many identities are swept.
    fn sweep_egress_public_ips(&mut self, inventory: &ArmInventory) -> usize {
        let used = |name: &str| {
            inventory.nat_gateways.iter().any(|n| n.public_ips.iter().chain(&n.public_ips_v6).any(|p| p.eq_ignore_ascii_case(name)))
                || inventory.load_balancers.iter().any(|l| l.shape.as_ref().is_some_and(|s| s.public_ip.eq_ignore_ascii_case(name)))
        };
        let mut found: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for ip in inventory.public_ips.iter().filter(|p| p.as_put) {
            let name = ip.name.to_ascii_lowercase();
            let (id, v6) = match (name.strip_suffix("-pip-v6"), name.strip_suffix("-pip")) {
                (Some(id), _) if ip.version == IpVersion::Ipv6 => (id, true),
                (None, Some(id)) if ip.version == IpVersion::Ipv4 => (id, false),
                _ => continue,
            };
            let ours = crate::egress::is_valid_identity(id)
                && !looks_like_uid(id)
                && !self.state.is_inbound(id)
                && !self.outbound.lifecycles.contains_key(id)
                && !self.egress.carries(id)
                && !self.egress.is_registered(id)
                && !self.state.nrp.foreign.contains(id)
                && !self.state.diff.nrp_references(id)
                && !used(&name);
            if ours {
                let entry = found.entry(id.to_owned()).or_default();
                if v6 { entry.1 = true } else { entry.0 = true }
            }
        }
        let swept = found.len();
        for (id, (_, v6)) in found {
            // Only the public IPs are left: every step before their deletes holds already.
            let mut lifecycle = OutboundLifecycle::new(Phase::DeletionInProgress, v6, outbound::DELETE.into());
            lifecycle.whole = false;
            lifecycle.nat_gateway_put = false;
            self.outbound.lifecycles.insert(id.clone(), lifecycle);
            self.outbound.runnable.insert(id);
        }
        swept
    }

    /// Tracks a Service found registered in NRP or holding our finalizer, only to delete it.
    fn adopt_for_deletion(&mut self, identity: &str, service: ObjectRef, object: ObjectState) {
        let lifecycle = Lifecycle::new(service, Phase::DeletionPending, object, None);
        self.state.lifecycles.insert(identity.to_owned(), lifecycle);
        self.state.draining.insert(identity.to_owned());
        self.state.diff.touch_identity(identity);
    }

    // ---- State ----

    /// The whole state: `(version, payload)`. Version 2 is the version-1 payload followed by
    /// the egress side (postcard encodes a pair as one after the other).
    pub fn export_state(&self) -> (u32, Vec<u8>) {
        let payload =
            postcard::to_allocvec(&(&self.state, &self.egress, &self.arm, &self.budget, &self.outbound, &self.pods))
            .expect("the state is plain data and always encodes");
        (STATE_VERSION, payload)
    }

    /// The schema version [`Self::export_state`] writes.
    pub fn state_version(&self) -> u32 {
        STATE_VERSION
    }

    /// A tracker from exported state. The payload must be exactly one value of its version
    /// (bytes after it are refused: a version-2 payload offered as version 1 would otherwise
    /// import without its egress side), and what [`State::check`] and [`Egress::check`] verify
    /// must hold; anything else is [`StateError::Corrupt`].
    pub fn import_state(config: Config, version: u32, payload: &[u8]) -> Result<Self, StateError> {
        let mode = validate_config(&config).map_err(StateError::InvalidConfig)?;
        let corrupt = |why: String| StateError::Corrupt(format!("state version {version}: {why}"));
        let full = Buckets::full(&config.write_budgets());
        let none = Outbound::default();
        let no_pods = PodFinalizers::default;
        let (state, egress, arm, budget, outbound, pods) = match version {
            // Before egress: no pods.
            1 => {
                let state = decode_exact::<State<NrpSyncV2>>(payload).map_err(corrupt)?.upgrade();
                (state, Egress::default(), ArmSync::settled(), full, none, no_pods())
            }
            2 => {
                let (state, egress) = decode_exact::<(State<NrpSyncV2>, Egress)>(payload).map_err(corrupt)?;
                (state.upgrade(), egress, ArmSync::settled(), full, none, no_pods())
            }
            3 => {
                let (state, egress) = decode_exact::<(State, Egress)>(payload).map_err(corrupt)?;
                (state, egress, ArmSync::settled(), full, none, no_pods())
            }
            4 => {
                let (state, egress, arm) = decode_exact::<(State, Egress, ArmSync)>(payload).map_err(corrupt)?;
                (state, egress, arm, full, none, no_pods())
            }
            5 => {
                let (state, egress, arm, budget) =
                    decode_exact::<(State, Egress, ArmSync, Buckets)>(payload).map_err(corrupt)?;
                (state, egress, arm, budget, none, no_pods())
            }
            6 => {
                let (state, egress, arm, budget, outbound) =
                    decode_exact::<(State, Egress, ArmSync, Buckets, Outbound)>(payload).map_err(corrupt)?;
                (state, egress, arm, budget, outbound, no_pods())
            }
            STATE_VERSION => {
                decode_exact::<(State, Egress, ArmSync, Buckets, Outbound, PodFinalizers)>(payload).map_err(corrupt)?
            }
            other => return Err(StateError::UnsupportedVersion(other)),
        };
        state.check(&arm, &outbound, &pods).map_err(corrupt)?;
        egress.check().map_err(corrupt)?;
        outbound.check().map_err(corrupt)?;
        Ok(Self { config, mode, state, egress, arm, budget, outbound, pods, clock: Clock::default() })
    }
}

/// The address-location batches of `ids` (`NrpSync::batches_in_flight`), as `in_flight` holds them (a free
/// function, so that callers holding other fields of the state mutably can use it).
fn location_batches<'a>(
    ids: &'a BTreeMap<u64, u64>,
    in_flight: &'a BTreeMap<u64, InFlight>,
) -> impl Iterator<Item = &'a [NrpLocation]> {
    ids.keys().filter_map(|id| match in_flight.get(id) {
        Some(InFlight::Locations(batch)) => Some(batch.as_slice()),
        _ => None,
    })
}

/// The largest next command id an imported state may hold (see [`State::check`]).
const MAX_NEXT_COMMAND_ID: u64 = 1 << 63;

/// One postcard value that is the whole of `payload`.
fn decode_exact<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    let (value, rest) = postcard::take_from_bytes::<T>(payload).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} byte(s) after the payload", rest.len()));
    }
    Ok(value)
}

impl State<NrpSyncV2> {
    fn upgrade(self) -> State {
        self.map_nrp(NrpSyncV2::upgrade)
    }
}

impl<N> State<N> {
    fn map_nrp<M>(self, f: impl FnOnce(N) -> M) -> State<M> {
        State {
            next_command_id: self.next_command_id,
            services: self.services,
            service_by_identity: self.service_by_identity,
            slices: self.slices,
            slices_by_owner: self.slices_by_owner,
            slices_by_node: self.slices_by_node,
            nodes: self.nodes,
            diff: self.diff,
            lifecycles: self.lifecycles,
            in_flight: self.in_flight,
            service_commands_in_flight: self.service_commands_in_flight,
            runnable: self.runnable,
            timers: self.timers,
            draining: self.draining,
            nrp: f(self.nrp),
            lists_complete: self.lists_complete,
            reconciled: self.reconciled,
        }
    }
}

impl State {
    /// Whether an identity is an inbound Service's (a lifecycle, or a Service observed): one key
    /// space with egress identities (upstream §i.2.7).
    fn is_inbound(&self, identity: &str) -> bool {
        self.lifecycles.contains_key(identity) || self.service_by_identity.contains_key(identity)
    }

    /// What an import cannot take on trust, checked cheaply (a pass over the commands in flight
    /// and one over the lifecycles): the counters of commands in flight, which `complete`
    /// decrements, against the commands themselves; each Service command against the lifecycle
    /// that waits for it (and no lifecycle waiting for a command that is not in flight: it would
    /// never run again); the one read and the batches in flight against their flags (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two); and every
    /// id in flight below the next id (a new command would take it); and every lifecycle with work
    /// left in a work set (a pass over the timers and one over the lifecycles): the tracker only
    /// ever looks at those sets for work, so a lifecycle outside them would never run again. The
    /// DiffTracker's own counts are not re-derived: that would cost a pass over every address.
    fn check(&self, arm: &ArmSync, outbound: &Outbound, pods: &PodFinalizers) -> Result<(), String> {
        // One id per command, counting up: no real state comes near the end of u64, and
        // refusing the upper half keeps `issue` from ever overflowing.
        if self.next_command_id > MAX_NEXT_COMMAND_ID {
            return Err(format!("the next command id {} is past {MAX_NEXT_COMMAND_ID}", self.next_command_id));
        }
        let (mut service_commands, mut nrp_writes, mut reads, mut arm_reads, mut batches) =
            (0usize, 0u32, 0usize, 0usize, Vec::new());
        let mut pod_commands = BTreeMap::new();
        for (&id, what) in &self.in_flight {
            if id >= self.next_command_id {
                return Err(format!("command {id} is in flight, but the next command id is {}", self.next_command_id));
            }
            match what {
                InFlight::Service { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if self.lifecycles.get(identity).and_then(|l| l.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for {identity}, whose lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::Outbound { identity, step } => {
                    service_commands += 1;
                    nrp_writes += u32::from(step.writes_nrp());
                    if outbound.lifecycles.get(identity).and_then(|l| l.in_flight) != Some((id, *step)) {
                        return Err(format!(
                            "command {id} ({step:?}) is in flight for egress identity {identity}, whose outbound \
                             lifecycle does not wait for it"
                        ));
                    }
                }
                InFlight::PodFinalizer { key, .. } => {
                    pod_commands.insert(id, key);
                }
                InFlight::Locations(_) => batches.push(id),
                InFlight::ReadNrp => reads += 1,
                InFlight::ReadArm => arm_reads += 1,
                InFlight::Event => {}
            }
        }
        pods.check(&pod_commands)?;
        let waiting = self.lifecycles.values().filter(|l| l.in_flight.is_some()).count()
            + outbound.lifecycles.values().filter(|l| l.in_flight.is_some()).count();
        let counts = [
            ("Service commands counted", self.service_commands_in_flight, "Service commands", service_commands),
            ("lifecycles wait for a command", waiting, "Service commands", service_commands),
            ("NRP writes counted", self.nrp.service_writes_in_flight as usize, "NRP writes", nrp_writes as usize),
            ("reads of NRP flagged", usize::from(self.nrp.read_in_flight), "reads of NRP", reads),
            ("reads of ARM flagged", usize::from(arm.read_in_flight), "reads of ARM", arm_reads),
        ];
        if arm.settled && arm.read_in_flight {
            return Err("the ARM inventory is settled, but a read of it is in flight".into());
        }
        if self.reconciled && !arm.settled {
            return Err("start-up reconciliation ran, but the ARM inventory is not settled".into());
        }
        for (what, counted, which, in_flight) in counts {
            if counted != in_flight {
                return Err(format!("{counted} {what} in flight, but {in_flight} {which} are in flight"));
            }
        }
        if !batches.iter().eq(self.nrp.batches_in_flight.keys()) {
            return Err(format!(
                "address-location batches in flight {batches:?}, but the batches counted in flight are {:?}",
                self.nrp.batches_in_flight.keys().collect::<Vec<_>>()
            ));
        }
        if batches.len() > MAX_BATCHES_IN_FLIGHT {
            return Err(format!("{} address-location batches in flight, over {MAX_BATCHES_IN_FLIGHT}", batches.len()));
        }
        // No location in two batches in flight: their answers could arrive in either order.
        let mut locations = BTreeSet::new();
        if let Some(twice) = location_batches(&self.nrp.batches_in_flight, &self.in_flight)
            .flatten()
            .find(|l| !locations.insert(l.location.as_str()))
        {
            return Err(format!("location {:?} is in more than one batch in flight", twice.location));
        }
        // Where the tracker looks for each lifecycle's work: a pending deletion waits in
        // `draining` (and only one does, or the tracker would never be idle), any other work left
        // is in flight, runnable or on a timer.
        let on_timers: BTreeSet<&str> = self.timers.iter().map(|(_, identity)| identity.as_str()).collect();
        for (identity, l) in &self.lifecycles {
            let scheduled =
                l.in_flight.is_some() || self.runnable.contains(identity) || on_timers.contains(identity.as_str());
            if let Some(why) = l.phase.misplaced(l.has_work_left(), scheduled, self.draining.contains(identity)) {
                return Err(format!("the lifecycle of {identity:?} ({:?}): {why}", l.phase));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clb() -> Config {
        Config { backend_pool_type: "podIP".into(), load_balancer_sku: "standardV2".into(), ..Config::default() }
    }

    fn lb_service(etp: &str) -> Service {
        Service {
            uid: "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01".into(),
            namespace: "default".into(),
            name: "web".into(),
            service_type: Some("LoadBalancer".into()),
            external_traffic_policy: Some(etp.into()),
            ports: vec![ServicePort {
                name: None,
                protocol: Some("TCP".into()),
                port: 80,
                target_port: None,
                node_port: None,
            }],
            ..Service::default()
        }
    }

    /// A LoadBalancer Service of `ports` (protocol, port, target port) and annotations.
    fn ported(uid: &str, ports: &[(Option<&str>, i32, Option<TargetPort>)], annotations: &[(&str, &str)]) -> Service {
        Service {
            uid: uid.into(),
            ports: ports
                .iter()
                .map(|(protocol, port, target)| ServicePort {
                    name: None,
                    protocol: protocol.map(str::to_owned),
                    port: *port,
                    target_port: target.clone(),
                    node_port: None,
                })
                .collect(),
            annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..lb_service("Local")
        }
    }

    fn rule(proto: LbProtocol, frontend: u16, backend: u16, idle: u8) -> LbRule {
        let name = format!("rule-{}-{frontend}", if proto == LbProtocol::Udp { "udp" } else { "tcp" });
        LbRule {
            name: Name::from(name),
            protocol: proto,
            frontend_port: frontend,
            backend_port: backend,
            idle_timeout_minutes: idle,
            enable_tcp_reset: proto == LbProtocol::Tcp,
        }
    }

    fn admitted(service: &Service) -> bool {
        admit_service(&clb(), service) == Verdict::Admitted
    }

    fn refused_for(service: &Service) -> Option<String> {
        match admit_service(&clb(), service) {
            Verdict::Rejected(rejection) => Some(rejection.reason),
            _ => None,
        }
    }

    const TCP: Option<&str> = Some("TCP");
    const UDP: Option<&str> = Some("UDP");
    fn to(port: i32) -> Option<TargetPort> {
        Some(TargetPort::Number(port))
    }

    // Upstream TestExtractInboundConfigFromService_SingleTCPPort,
    // TestBuildInboundServiceResources_WithConfig (the names, the pool and the rules; the SKUs and
    // floating IP are the host's wire, tests/it/azure.rs), TestBuildInboundServiceResources_TCPHasResetEnabled,
    // TestBuildInboundServiceResources_NoProbesForPodIPBackend (the model has no probe at all),
    // TestBuildInboundServiceResources_LongServiceUID and TestBuildInboundServiceResources_MultipleConfigs.
    // Upstream TestBuildInboundServiceResources_BackendPoolNaming,
    // TestBuildInboundServiceResources_ResourceIDs, TestBuildInboundResourceNames,
    // TestMultipleServicesIndependence and TestBackendPoolPopulation.
    // Upstream TestCompleteServiceCreationWorkflow, its first half: ports 80->8080 and 443->8443
    // become rule-tcp-80 and rule-tcp-443 to those backend ports, with public IP `<uid>-pip` and
    // load balancer and pool named by the UID (the wire half is tests/it/azure.rs).
    #[test]
    fn a_service_s_load_balancer_is_named_by_its_uid_with_one_tcp_rule_per_port_to_its_target_port() {
        let long = "very-long-service-uid-that-exceeds-normal-length-abcdef123456789012345678901234567890";
        for (uid, ports, rules) in [
            ("service-uid-123", vec![(TCP, 80, to(8080)), (TCP, 443, to(8443))], vec![(80, 8080), (443, 8443)]),
            (long, vec![(TCP, 80, to(8080))], vec![(80, 8080)]),
            ("service-2", vec![(TCP, 443, to(8443))], vec![(443, 8443)]),
        ] {
            let service = ported(uid, &ports, &[]);
            assert!(admitted(&service));
            let config = LbConfig::for_service(&service);
            assert_eq!(config.public_ip, PublicIp { name: Name::from(format!("{uid}-pip")), version: IpVersion::Ipv4 });
            let expected = LoadBalancer {
                name: Name::from(uid),
                public_ip: Name::from(format!("{uid}-pip")),
                backend_pool: Name::from(uid),
                rules: rules.iter().map(|(f, b)| rule(LbProtocol::Tcp, *f, *b, 4)).collect(),
            };
            assert_eq!(config.load_balancer, expected);
            assert!(config.load_balancer.rules.iter().all(|r| r.enable_tcp_reset));
        }
    }

    // Upstream TestExtractInboundConfigFromService_MultiplePortsWithUDP,
    // TestBuildInboundServiceResources_UDPProtocol, TestWorkflowWithUDPService, TestLBRuleNaming and
    // TestRoundTripServiceToResourcesAndBack: rules in spec order, named `rule-<protocol>-<port>`, each
    // frontend port to its backend port. A UDP rule has TCP reset off (upstream leaves it unset;
    // false is what ARM reads for an unset one).
    // Upstream TestBuildInboundServiceResources_SameBackendPortDifferentProtocolAllowed.
    // Upstream TestExtractInboundConfigFromService_MixedTargetPorts, its UDP port: a UDP port among
    // TCP ones keeps protocol UDP (its numeric, unset and named target ports are in
    // a_named_target_port_is_refused_at_admission_and_never_becomes_a_rule).
    #[test]
    fn tcp_and_udp_ports_become_rules_in_spec_order_named_by_protocol_and_port_udp_without_tcp_reset() {
        let cases = [
            (
                vec![(TCP, 80, to(8080)), (UDP, 53, to(5353)), (TCP, 443, to(8443))],
                vec![
                    rule(LbProtocol::Tcp, 80, 8080, 4),
                    rule(LbProtocol::Udp, 53, 5353, 4),
                    rule(LbProtocol::Tcp, 443, 8443, 4),
                ],
            ),
            (
                vec![(UDP, 53, to(5353)), (TCP, 53, to(5353))],
                vec![rule(LbProtocol::Udp, 53, 5353, 4), rule(LbProtocol::Tcp, 53, 5353, 4)],
            ),
            (
                vec![(TCP, 80, to(3000)), (TCP, 443, to(3443)), (TCP, 50051, to(50051))],
                vec![
                    rule(LbProtocol::Tcp, 80, 3000, 4),
                    rule(LbProtocol::Tcp, 443, 3443, 4),
                    rule(LbProtocol::Tcp, 50051, 50051, 4),
                ],
            ),
        ];
        for (ports, rules) in cases {
            let service = ported("u", &ports, &[]);
            assert!(admitted(&service), "{ports:?}");
            assert_eq!(LbConfig::for_service(&service).load_balancer.rules, rules);
        }
        let udp = rule(LbProtocol::Udp, 53, 5353, 4);
        assert_eq!(udp.name.as_str(), "rule-udp-53");
        assert!(!udp.enable_tcp_reset);
    }

    // Upstream TestExtractInboundConfigFromService_NoTargetPort, TestExtractInboundConfigFromService_EmptyProtocol:
    // no targetPort sends to the port itself, no protocol is TCP (the API server's defaults).
    // Upstream TestWorkflowWithMinimalService.
    #[test]
    fn a_port_without_target_port_sends_to_itself_and_one_without_protocol_is_tcp() {
        let service = ported("u", &[(TCP, 80, None), (None, 81, to(8081))], &[]);
        assert!(admitted(&service));
        let rules = LbConfig::for_service(&service).load_balancer.rules;
        assert_eq!(rules, vec![rule(LbProtocol::Tcp, 80, 80, 4), rule(LbProtocol::Tcp, 81, 8081, 4)]);
    }

    // Upstream TestExtractInboundConfigFromService_MixedTargetPorts and
    // TestWorkflowWithComplexPortMapping. Deliberately different: upstream programs a named
    // targetPort as the frontend port (wrong for pod IP backends, which receive on the container
    // port); here such a Service is refused at admission, with its reason, and no rule is built.
    // Upstream TestExtractInboundConfigFromService_NamedTargetPort (differs: a named targetPort is refused
    // at admission), TestExtractInboundConfigFromService_NamedTargetPortRecorded and
    // TestBuildInboundServiceResources_NamedTargetPortRejected.
    #[test]
    fn a_named_target_port_is_refused_at_admission_and_never_becomes_a_rule() {
        let service = ported(
            "u",
            &[(TCP, 80, to(8080)), (TCP, 9090, None), (TCP, 9091, Some(TargetPort::Name("metrics-port".into())))],
            &[],
        );
        assert_eq!(refused_for(&service).as_deref(), Some(crate::admission::reason::UNSUPPORTED_NAMED_TARGET_PORT));
        let rules = LbConfig::for_service(&service).load_balancer.rules;
        assert_eq!(rules, vec![rule(LbProtocol::Tcp, 80, 8080, 4), rule(LbProtocol::Tcp, 9090, 9090, 4)]);
    }

    // Upstream TestBuildInboundServiceResources_LowercaseUDP. Deliberately different: the API
    // server only ever sends `TCP`, `UDP` or `SCTP`, so a lowercase protocol is not a Kubernetes
    // Service; admission refuses it rather than guess.
    #[test]
    fn a_lowercase_protocol_is_refused_at_admission() {
        let service = ported("u", &[(Some("udp"), 53, to(5353))], &[]);
        assert_eq!(refused_for(&service).as_deref(), Some(crate::admission::reason::UNSUPPORTED_PROTOCOL));
    }

    // Upstream TestBuildInboundServiceResources_AppliesIdleTimeout,
    // TestExtractInboundConfigFromService_ExtractsIdleTimeout and TestIdleTimeout_AdmissionAndBuildAgree:
    // the annotation sets every rule's idle timeout; absent, Azure's 4 minutes; an unusable value is
    // refused with InvalidIdleTimeout, never built with a default; and whatever admission takes the
    // build programs exactly. The range here is 4 to 30 minutes (admission::IDLE_TIMEOUT_MINUTES).
    // Upstream TestBuildInboundServiceResources_IdleTimeoutOutOfRangeErrors.
    #[test]
    fn the_idle_timeout_annotation_sets_every_rule_and_admission_and_the_build_agree_on_it() {
        let key = crate::admission::ANNOTATION_IDLE_TIMEOUT;
        let service = ported("u", &[(TCP, 80, to(8080)), (UDP, 53, to(53))], &[(key, "30")]);
        assert!(admitted(&service));
        let rules = LbConfig::for_service(&service).load_balancer.rules;
        assert!(rules.iter().all(|r| r.idle_timeout_minutes == 30), "{rules:?}");
        let plain = ported("u", &[(TCP, 80, to(8080))], &[]);
        assert_eq!(LbConfig::for_service(&plain).load_balancer.rules[0].idle_timeout_minutes, 4);
        for value in ["0", "3", "101", "not-a-number"] {
            let service = ported("u", &[(TCP, 80, to(8080))], &[(key, value)]);
            assert_eq!(
                refused_for(&service).as_deref(),
                Some(crate::admission::reason::INVALID_IDLE_TIMEOUT),
                "{value}"
            );
        }
        for minutes in ["4", "5", "30", "31", "60", "100", "101"] {
            let service = ported("u", &[(TCP, 80, to(8080))], &[(key, minutes)]);
            if admitted(&service) {
                let programmed = LbConfig::for_service(&service).load_balancer.rules[0].idle_timeout_minutes;
                assert_eq!(programmed.to_string(), minutes, "admitted, so built with exactly it");
            } else {
                assert!(
                    minutes.parse::<i64>().is_ok_and(|m| !crate::admission::IDLE_TIMEOUT_MINUTES.contains(&m)),
                    "{minutes}"
                );
            }
        }
    }

    // Upstream TestBuildInboundServiceResources_BackendPortMaxIsValid,
    // TestBuildInboundServiceResources_BackendPortOutOfRangeErrors and
    // TestBuildInboundServiceResources_DistinctBackendPortsAllowed: a backend port of 65535 builds,
    // 65536 is refused (here at admission, before anything is written), two ports to distinct
    // backend ports of one protocol make two rules.
    #[test]
    fn backend_ports_up_to_65535_build_one_past_is_refused_and_distinct_backends_make_distinct_rules() {
        let max = ported("u", &[(TCP, 80, to(65535))], &[]);
        assert!(admitted(&max));
        assert_eq!(LbConfig::for_service(&max).load_balancer.rules, vec![rule(LbProtocol::Tcp, 80, 65535, 4)]);
        let past = ported("u", &[(TCP, 80, to(65536))], &[]);
        assert_eq!(refused_for(&past).as_deref(), Some(crate::admission::reason::INVALID_PORT));
        let two = ported("u", &[(TCP, 80, to(8080)), (TCP, 443, to(8443))], &[]);
        assert!(admitted(&two));
        assert_eq!(LbConfig::for_service(&two).load_balancer.rules.len(), 2);
    }

    // Upstream TestProcessK8sServices_ExcludesServicesNotOwnedByServiceGateway.
    #[test]
    fn a_service_that_becomes_invalid_keeps_its_last_admitted_spec_and_gets_one_warning() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        assert!(
            tracker
                .observe(0, vec![Observation::ServiceUpserted(lb_service("Local"))])
                .commands
                .iter()
                .all(|c| !matches!(c.command, Command::EmitEvent(_)))
        );
        let step = tracker.observe(1, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
        let events: Vec<&Event> = step
            .commands
            .iter()
            .filter_map(|c| if let Command::EmitEvent(e) = &c.command { Some(e) } else { None })
            .collect();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "UnsupportedExternalTrafficPolicy");
        assert!(events[0].message.contains("keeps its last admitted configuration"));
        assert_eq!(tracker.admitted_spec("default", "web").unwrap().external_traffic_policy.as_deref(), Some("Local"));
        let again = tracker.observe(2, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
        assert!(again.commands.iter().all(|c| !matches!(c.command, Command::EmitEvent(_))));
    }

    #[test]
    fn nothing_but_a_read_of_nrp_is_sent_before_the_lists_are_complete() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step = tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local"))]);
        assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
    }

    // Upstream TestRuntimeEnablementAndLoadBalancer (differs: CLB mode comes from podIP and standardV2,
    // there is no enable flag).
    #[test]
    fn outside_clb_mode_the_tracker_sends_nothing_and_is_idle_at_once() {
        let multi_slb = Config {
            backend_pool_type: "nodeIP".into(),
            multiple_standard_load_balancers: vec!["kubernetes".into()],
            ..Config::default()
        };
        let mut tracker = Tracker::create(multi_slb).unwrap();
        let step =
            tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        assert!(step.commands.is_empty(), "{:?}", step.commands);
        assert!(step.idle);
        assert_eq!(step.wake_at_ms, None);
        assert!(tracker.tick(60_000).idle);
    }

    #[test]
    fn backoff_doubles_from_one_second_to_a_thirty_second_cap_with_bounded_jitter() {
        for (attempt, base) in [(1, 1_000), (2, 2_000), (3, 4_000), (5, 16_000), (6, 30_000), (40, 30_000)] {
            let delay = backoff_ms("uid", attempt, None);
            assert!(delay >= base && delay <= base + base / 5, "attempt {attempt}: {delay}");
            assert_eq!(delay, backoff_ms("uid", attempt, None), "deterministic");
        }
        assert_eq!(backoff_ms("uid", 1, Some(45_000)), 45_000, "Retry-After wins when longer");
    }

    // Regression: Retry-After was never capped.
    #[test]
    fn a_retry_after_is_honoured_up_to_the_resync_period_and_no_further() {
        assert_eq!(backoff_ms("uid", 1, Some(timing::RETRY_AFTER_CAP_MS)), timing::RETRY_AFTER_CAP_MS);
        assert_eq!(backoff_ms("uid", 1, Some(timing::RETRY_AFTER_CAP_MS + 1)), timing::RETRY_AFTER_CAP_MS);
        assert_eq!(backoff_ms("uid", 40, Some(u64::MAX)), timing::RETRY_AFTER_CAP_MS);
        assert_eq!(timing::RETRY_AFTER_CAP_MS, timing::RESYNC_INTERVAL_MS);
    }

    const NOW: u64 = 1_700_000_000_000;
    const UID: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01";

    fn throttled(retry_after_ms: u64) -> Outcome {
        Outcome::Failed(Failure {
            status: 429,
            code: None,
            retry_after_ms: Some(retry_after_ms),
            message: "throttled".into(),
        })
    }

    /// What Azure and the API server answer when all goes well; NRP lists `registered`.
    fn answer_ok(registered: &[&str]) -> impl Fn(&Command) -> Outcome {
        let services: Vec<NrpService> = registered
            .iter()
            .map(|name| NrpService {
                name: (*name).into(),
                service_type: "Inbound".into(),
                backend_pools: vec![],
                is_default: false,
            })
            .collect();
        move |command| match command {
            Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: services.clone(), locations: vec![] }),
            _ => Outcome::Ok,
        }
    }

    /// Runs `step`'s commands and every command that follows at `now`, answered by `answer`;
    /// returns them all, every log line, and the last step.
    fn drive(
        tracker: &mut Tracker,
        now: u64,
        mut step: Step,
        mut answer: impl FnMut(&Command) -> Outcome,
    ) -> (Vec<Command>, Vec<LogLine>, Step) {
        let (mut issued, mut logs) = (Vec::new(), Vec::new());
        for _ in 0..1_000 {
            logs.extend(step.logs.iter().cloned());
            if step.commands.is_empty() {
                return (issued, logs, step);
            }
            let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
            issued.extend(step.commands.iter().map(|c| c.command.clone()));
            step = tracker.complete(now, results);
        }
        panic!("the tracker kept issuing commands: {:?}", &issued[issued.len() - 10..]);
    }

    fn is_location_update(command: &Command) -> bool {
        matches!(command, Command::UpdateAddressLocations(_))
    }

    // Regression: u64 overflow from a Retry-After, in its shortest sequence.
    #[test]
    fn a_retry_after_of_u64_max_on_a_read_of_nrp_waits_the_cap_instead_of_reading_again_at_once() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step = tracker.tick(NOW);
        assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, throttled(u64::MAX))]);
        assert!(step.commands.is_empty(), "no read again at once: {:?}", step.commands);
        assert_eq!(step.wake_at_ms, Some(NOW + timing::RETRY_AFTER_CAP_MS));
        assert_eq!(step.logs.len(), 1, "{:?}", step.logs);
        assert_eq!(step.logs[0].level, LogLevel::Warn);
        assert!(step.logs[0].message.contains("read-nrp") && step.logs[0].message.contains("capped at 300000 ms"));
        assert!(tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS - 1).commands.is_empty());
        let step = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS);
        assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
        assert!(step.logs.is_empty());
    }

    // Regression: u64 overflow from a Retry-After in `service_outcome`.
    #[test]
    fn a_retry_after_of_u64_max_on_a_service_command_holds_that_service_for_the_cap() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
        let finalizer = step.commands.iter().find(|c| matches!(c.command, Command::SetFinalizer { .. })).unwrap().id;
        let step = tracker.complete(NOW, vec![(finalizer, throttled(u64::MAX))]);
        assert!(step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))), "{:?}", step.commands);
        assert_eq!(step.wake_at_ms, Some(NOW + timing::RETRY_AFTER_CAP_MS));
        assert!(step.logs[0].message.contains("AddFinalizer for load balancer"), "{:?}", step.logs);
        let early = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS - 1);
        assert!(early.commands.iter().all(|c| !matches!(c.command, Command::SetFinalizer { .. })));
        let due = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS);
        assert!(due.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "{due:?}");
    }

    // Regression: an EndpointSlice of an addressType Kubernetes does not have was programmed,
    // IPv4-mapped IPv6 node IPs became IPv6 locations, and a Node whose InternalIPs do not parse
    // left its pods out of NRP without a word. Its FQDN case, at a cold start, ports upstream
    // TestColdStart_FQDNEndpointSlice_Skipped.
    // Upstream TestSelectSameFamilyNodeIP_DeterministicAndValidated.
    #[test]
    fn only_ip_slices_are_programmed_and_a_node_with_internal_ips_that_do_not_parse_is_logged() {
        // (address type, the node's InternalIPs, programmed, a WARN line saying)
        let cases: [(&str, &[&str], bool, Option<&str>); 6] = [
            ("IPv4", &["10.224.0.4"], true, None),
            ("IPv5", &["10.224.0.4"], false, Some("addressType \"IPv5\" is not IPv4, IPv6 or FQDN")),
            ("FQDN", &["10.224.0.4"], false, None),
            (
                "IPv4",
                &["10.224.0.4%eth0"],
                false,
                Some("node n1: InternalIPs [\"10.224.0.4%eth0\"] are not IP addresses (0 usable)"),
            ),
            ("IPv4", &["junk", "10.224.0.4"], true, Some("(1 usable); its other InternalIPs are its locations")),
            ("IPv4", &["::ffff:10.224.0.4"], true, None),
        ];
        for (address_type, ips, programmed, warns) in cases {
            let case = format!("{address_type} on {ips:?}");
            let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
            let slice = EndpointSlice {
                namespace: "default".into(),
                name: "web-1".into(),
                owner_service_uid: Some(UID.into()),
                address_type: address_type.into(),
                endpoints: vec![Endpoint {
                    addresses: vec!["10.244.0.5".into()],
                    node_name: Some("n1".into()),
                    ready: Some(true),
                }],
                deleting: false,
            };
            let node = Node { name: "n1".into(), internal_ips: ips.iter().map(|ip| ip.to_string()).collect() };
            let step = tracker.observe(
                NOW,
                vec![
                    Observation::NodeUpserted(node),
                    Observation::ServiceUpserted(lb_service("Local")),
                    Observation::SliceUpserted(slice),
                    Observation::ListsComplete,
                ],
            );
            let (issued, logs, _) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
            assert_eq!(issued.iter().any(is_location_update), programmed, "{case}: {issued:?}");
            let warned: Vec<_> = logs.iter().filter(|l| l.level == LogLevel::Warn).map(|l| &l.message).collect();
            match warns {
                Some(text) => assert!(warned.len() == 1 && warned[0].contains(text), "{case}: {warned:?}"),
                None => assert!(warned.is_empty(), "{case}: {warned:?}"),
            }
        }
    }

    // Regression: u64 overflow from a Retry-After in the address-location batch, which every
    // Service's addresses wait for: they wait no longer than the cap.
    #[test]
    fn a_retry_after_of_u64_max_on_the_address_location_batch_holds_the_addresses_no_longer_than_the_cap() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let slice = EndpointSlice {
            namespace: "default".into(),
            name: "web-1".into(),
            owner_service_uid: Some(UID.into()),
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.244.0.5".into()],
                node_name: Some("n1".into()),
                ready: Some(true),
            }],
            deleting: false,
        };
        let step = tracker.observe(
            NOW,
            vec![
                Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] }),
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice),
                Observation::ListsComplete,
            ],
        );
        let ok = answer_ok(&[UID]);
        let mut batches = 0;
        let (issued, logs, _) = drive(&mut tracker, NOW, step, |command| {
            if is_location_update(command) {
                batches += 1;
                return throttled(u64::MAX);
            }
            ok(command)
        });
        assert_eq!(batches, 1, "{issued:?}");
        assert!(logs.iter().any(|l| l.message.contains("update-address-locations")), "{logs:?}");
        assert!(tracker.tick(NOW + 1).commands.is_empty());
        let wait = timing::RETRY_AFTER_CAP_MS;
        let step = tracker.tick(NOW + wait - 1);
        assert!(!step.commands.iter().any(|c| is_location_update(&c.command)));
        let step = tracker.tick(NOW + wait);
        let (issued, _, _) = drive(&mut tracker, NOW + wait, step, &ok);
        assert!(issued.iter().any(is_location_update), "sent after the cap: {issued:?}");
    }

    /// A slice of the test Service with one ready endpoint per `(address, node)`.
    fn slice_on(endpoints: &[(&str, &str)]) -> EndpointSlice {
        EndpointSlice {
            namespace: "default".into(),
            name: "web-1".into(),
            owner_service_uid: Some(UID.into()),
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(address, node)| Endpoint {
                    addresses: vec![(*address).into()],
                    node_name: Some((*node).into()),
                    ready: Some(true),
                })
                .collect(),
            deleting: false,
        }
    }

    /// Answers `step`'s commands and those that follow at `now` as all going well, except the
    /// address-location batches: left in flight and returned (id, the locations they cover).
    fn drive_holding_batches(tracker: &mut Tracker, now: u64, step: Step) -> Vec<(u64, Vec<String>)> {
        let (ok, mut held, mut step) = (answer_ok(&[UID]), Vec::new(), step);
        while !step.commands.is_empty() {
            let mut results = Vec::new();
            for issued in &step.commands {
                match &issued.command {
                    Command::UpdateAddressLocations(batch) => {
                        held.push((issued.id, batch.iter().map(|l| l.location.clone()).collect()));
                    }
                    command => results.push((issued.id, ok(command))),
                }
            }
            step = tracker.complete(now, results);
        }
        held
    }

    /// The test Service provisioned with a pod on node n1 (location 10.224.0.4; node n2 is
    /// 10.224.0.5), its first address-location batch in flight, unanswered.
    fn tracker_with_a_batch_in_flight() -> (Tracker, u64) {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let node =
            |name: &str, ip: &str| Observation::NodeUpserted(Node { name: name.into(), internal_ips: vec![ip.into()] });
        let step = tracker.observe(
            NOW,
            vec![
                node("n1", "10.224.0.4"),
                node("n2", "10.224.0.5"),
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
                Observation::ListsComplete,
            ],
        );
        let held = drive_holding_batches(&mut tracker, NOW, step);
        assert_eq!(held.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(), [vec!["10.224.0.4".to_owned()]]);
        (tracker, held[0].0)
    }

    fn load_balancers(issued: &[Command]) -> Vec<&LoadBalancer> {
        issued.iter().filter_map(|c| if let Command::PutLoadBalancer(lb) = c { Some(lb) } else { None }).collect()
    }

    fn put_in(step: &Step) -> Option<(u64, LoadBalancer)> {
        step.commands.iter().find_map(|c| match &c.command {
            Command::PutLoadBalancer(lb) => Some((c.id, lb.clone())),
            _ => None,
        })
    }

    /// The test Service (ETP Local, no endpoints), created, all commands answered.
    fn created_local() -> Tracker {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        drive(&mut tracker, NOW, step, answer_ok(&[]));
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
        tracker
    }

    /// `service` as the API server sends it once it is Terminating, our finalizer still on it.
    fn terminating(service: Service) -> Service {
        Service { deleting: true, finalizers: vec![FINALIZER.into()], ..service }
    }

    /// [`created_with`]`(&[(80, 8080)])`'s Service, Terminating.
    fn terminating_web() -> Service {
        terminating(ported(UID, &[(TCP, 80, to(8080))], &[]))
    }

    /// The test Service with `ports` (protocol TCP, port, target port), created and in NRP with
    /// a pod on n1 (10.224.0.4), all commands answered.
    fn created_with(ports: &[(i32, i32)]) -> Tracker {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
        let spec = ported(UID, &ports.iter().map(|(p, t)| (TCP, *p, to(*t))).collect::<Vec<_>>(), &[]);
        let step = tracker.observe(
            NOW,
            vec![
                node,
                Observation::ServiceUpserted(spec),
                Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
                Observation::ListsComplete,
            ],
        );
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
        assert_eq!(load_balancers(&issued).len(), 1, "{issued:?}");
        tracker
    }

    fn respec(tracker: &mut Tracker, now: u64, ports: &[(i32, i32)]) -> Step {
        let spec = ported(UID, &ports.iter().map(|(p, t)| (TCP, *p, to(*t))).collect::<Vec<_>>(), &[]);
        tracker.observe(now, vec![Observation::ServiceUpserted(spec)])
    }

    // Upstream TestEngineUpdateService_PortChangeSchedulesUpdate, TestServiceUpdaterUpdateInboundService,
    // TestServiceUpdaterUpdateInboundService_PortRemovalDropsOnlyThatRule and
    // TestEngineOnServiceCreationComplete_UpdateSuccessPersistsConfig: a spec change of a created
    // Service is one PUT of its load balancer with the new rules (nothing else of Azure is
    // written: not its public IP, not its NRP registration); removing a port drops only its
    // rule; once applied, the same spec again writes nothing.
    // Upstream TestEngineUpdateService_NoOpWhenConfigUnchanged and TestReconcileInboundService (its
    // "updates an already tracked service" case).
    #[test]
    fn a_port_change_puts_the_load_balancer_once_with_the_new_rules_and_the_same_spec_again_writes_nothing() {
        let mut tracker = created_with(&[(80, 8080), (443, 8443)]);
        let step = respec(&mut tracker, NOW + 1, &[(80, 8080)]);
        let (issued, _, _) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
        assert_eq!(
            load_balancers(&issued).iter().map(|lb| lb.rules.clone()).collect::<Vec<_>>(),
            [vec![rule(LbProtocol::Tcp, 80, 8080, 4)]]
        );
        let azure_writes = |c: &&Command| {
            matches!(c, Command::PutPublicIp(_) | Command::UpdateServices(_) | Command::DeleteResource(_))
        };
        assert_eq!(issued.iter().filter(azure_writes).count(), 0, "{issued:?}");
        let step = respec(&mut tracker, NOW + 2, &[(80, 9090)]);
        let (issued, _, _) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
        assert_eq!(load_balancers(&issued)[0].rules, vec![rule(LbProtocol::Tcp, 80, 9090, 4)]);
        let step = respec(&mut tracker, NOW + 3, &[(80, 9090)]);
        let (issued, _, _) = drive(&mut tracker, NOW + 3, step, answer_ok(&[UID]));
        assert!(load_balancers(&issued).is_empty(), "the applied spec is remembered: {issued:?}");
    }

    // Upstream TestEngineOnServiceCreationComplete_UpdateDriftReschedules and
    // TestEngineOnServiceCreationComplete_UpdateFailureKeepsState: a spec that changes while its
    // update is in flight is put once that one completes (one PUT of a load balancer at a time);
    // a failed update is retried, after its backoff, with the spec it was for, and the Service
    // stays registered meanwhile.
    // Upstream TestServiceUpdaterUpdateInboundService, its transient-failure case: a failed update
    // PUT is retryable, not parked.
    #[test]
    fn a_spec_changed_during_an_update_is_put_after_it_and_a_failed_update_is_retried_with_its_spec() {
        let mut tracker = created_with(&[(80, 8080)]);
        let step = respec(&mut tracker, NOW + 1, &[(80, 8081)]);
        let (first, lb) = put_in(&step).expect("the update is sent");
        assert_eq!(lb.rules[0].backend_port, 8081);
        let step = respec(&mut tracker, NOW + 2, &[(80, 8082)]);
        assert!(put_in(&step).is_none(), "one PUT of a load balancer at a time: {:?}", step.commands);
        let mut step = tracker.complete(NOW + 3, vec![(first, Outcome::Ok)]);
        // The update's status patch first, then the drift.
        while put_in(&step).is_none() && !step.commands.is_empty() {
            let results = step.commands.iter().map(|c| (c.id, answer_ok(&[UID])(&c.command))).collect();
            step = tracker.complete(NOW + 3, results);
        }
        let (second, lb) = put_in(&step).expect("the drift is put next");
        assert_eq!(lb.rules[0].backend_port, 8082);
        let step = tracker.complete(NOW + 4, vec![(second, failed(500))]);
        assert!(put_in(&step).is_none());
        assert!(
            !step
                .commands
                .iter()
                .any(|c| matches!(&c.command, Command::UpdateServices(r) if r.iter().any(|r| r.is_delete)))
        );
        let later = NOW + 4 + 2 * timing::BACKOFF_CAP_MS;
        let step = tracker.tick(later);
        let (_, lb) = put_in(&step).expect("retried after its backoff");
        assert_eq!(lb.rules[0].backend_port, 8082, "with the spec it was for");
        assert!(tracker.state.diff.is_registered(&UID.to_ascii_lowercase()), "still registered");
    }

    // Upstream TestEngineUpdateService_OverwritesConfigDuringCreation: a spec that changes while
    // the Service is being created is the one its load balancer is created with.
    #[test]
    fn a_spec_changed_during_creation_is_the_one_the_load_balancer_is_created_with() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let first = ported(UID, &[(TCP, 80, to(8080))], &[]);
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(first), Observation::ListsComplete]);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
        assert!(step.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "creating: {step:?}");
        let changed = ported(UID, &[(TCP, 80, to(9090))], &[]);
        let mut next = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(changed)]);
        next.commands.extend(step.commands);
        let (issued, _, _) = drive(&mut tracker, NOW + 1, next, answer_ok(&[]));
        let created: Vec<_> = load_balancers(&issued).iter().map(|lb| lb.rules[0].backend_port).collect();
        assert_eq!(created, [9090], "{issued:?}");
    }

    // Upstream TestEngineOnServiceCreationComplete_UpdateTerminalErrorParks,
    // TestUpdateEndpoints_TerminalUpdateKeepsApplyingToLiveLB and
    // TestSyncOps_ParkedLiveLBRemainsReadyToSync: an update Azure refuses for good parks it with a
    // Warning, but the load balancer that exists keeps serving: the Service stays registered and
    // its endpoint changes still reach NRP.
    #[test]
    fn an_update_refused_for_good_parks_it_while_the_live_load_balancer_keeps_getting_its_endpoints() {
        let mut tracker = created_with(&[(80, 8080)]);
        let step = respec(&mut tracker, NOW + 1, &[(80, 8081)]);
        let (put, _) = put_in(&step).expect("the update is sent");
        let refused = Outcome::Failed(Failure {
            status: 400,
            code: Some("InvalidParameter".into()),
            retry_after_ms: None,
            message: "bad rule".into(),
        });
        let step = tracker.complete(NOW + 2, vec![(put, refused)]);
        let warned = step.commands.iter().any(
            |c| matches!(&c.command, Command::EmitEvent(e) if e.reason == reason::LOAD_BALANCER_CONFIGURATION_REJECTED),
        );
        assert!(warned, "{:?}", step.commands);
        let (issued, _, _) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
        assert!(load_balancers(&issued).is_empty());
        let later = NOW + 60 * 60 * 1000;
        let step = tracker
            .observe(later, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n1")]))]);
        let (issued, _, _) = drive(&mut tracker, later, step, answer_ok(&[UID]));
        assert!(load_balancers(&issued).is_empty(), "parked: not retried: {issued:?}");
        let sent: Vec<&str> = issued
            .iter()
            .filter_map(|c| if let Command::UpdateAddressLocations(l) = c { Some(l) } else { None })
            .flatten()
            .flat_map(|l| l.addresses.iter().map(|a| a.address.as_str()))
            .collect();
        assert!(sent.contains(&"10.244.0.6"), "the new endpoint reaches NRP: {issued:?}");
    }

    // Regression: one hung update-address-locations made every Service's endpoint changes wait for
    // it (for NRP's whole request timeout).
    // Upstream TestLocationsUpdaterRetriesAfterSyncFailure and
    // TestLocationsUpdater_HungSyncTimesOutAndRecovers.
    #[test]
    fn a_hung_address_location_batch_holds_only_its_own_locations_once_it_is_slow() {
        let (mut tracker, hung) = tracker_with_a_batch_in_flight();
        // A pod on n2 (another location) and one more on n1 (the hung batch's).
        let change =
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n1"), ("10.244.1.5", "n2")]));
        let step = tracker.observe(NOW + 100, vec![change]);
        assert!(drive_holding_batches(&mut tracker, NOW + 100, step).is_empty(), "not slow yet: the change coalesces");
        let step = tracker.tick(NOW + 100);
        assert_eq!(step.wake_at_ms, Some(NOW + timing::SLOW_BATCH_MS), "woken when the batch in flight is slow");
        let step = tracker.tick(NOW + timing::SLOW_BATCH_MS);
        let beside = drive_holding_batches(&mut tracker, NOW + timing::SLOW_BATCH_MS, step);
        assert_eq!(beside.len(), 1);
        assert_eq!(beside[0].1, ["10.224.0.5"], "n2 goes beside the hung batch; n1 waits for it");
        let step = tracker.complete(NOW + 2_500, vec![(beside[0].0, Outcome::Ok)]);
        assert!(drive_holding_batches(&mut tracker, NOW + 2_500, step).is_empty(), "n1 still waits for its batch");
        assert!(tracker.nrp_view().contains_key("10.224.0.5"), "{:?}", tracker.nrp_view());
        // The hung batch times out: n1 backs off on its own, then goes with both its pods.
        let timeout =
            Outcome::Failed(Failure { status: 504, code: None, retry_after_ms: None, message: "timed out".into() });
        let step = tracker.complete(NOW + 20_000, vec![(hung, timeout)]);
        assert!(drive_holding_batches(&mut tracker, NOW + 20_000, step).is_empty(), "backing off");
        let due = backoff_ms("10.224.0.4", 1, None);
        let step = tracker.tick(NOW + 20_000 + due);
        let retried = drive_holding_batches(&mut tracker, NOW + 20_000 + due, step);
        assert_eq!(retried.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(), [vec!["10.224.0.4".to_owned()]]);
        let (version, payload) = tracker.export_state();
        assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    }

    // Regression: a failing batch backed off every Service's addresses; only a throttled one (429:
    // the subscription's budget) should.
    #[test]
    fn a_failed_address_location_batch_backs_off_only_its_own_locations_and_a_throttled_one_every_location() {
        for (status, others_wait) in [(500, false), (504, false), (429, true)] {
            let (mut tracker, batch) = tracker_with_a_batch_in_flight();
            let failure = Outcome::Failed(Failure { status, code: None, retry_after_ms: None, message: "no".into() });
            let step = tracker.complete(NOW + 10, vec![(batch, failure)]);
            assert!(drive_holding_batches(&mut tracker, NOW + 10, step).is_empty(), "{status}: n1 backs off");
            let change = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.1.5", "n2")]));
            let step = tracker.observe(NOW + 20, vec![change]);
            let sent = drive_holding_batches(&mut tracker, NOW + 20, step);
            if others_wait {
                assert!(sent.is_empty(), "{status}: every location waits out the throttle: {sent:?}");
            } else {
                assert_eq!(
                    sent.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
                    [vec!["10.224.0.5".to_owned()]],
                    "{status}"
                );
            }
        }
    }

    // Regression: u64 overflow: a read within five minutes of the end of u64 time set a wrapped
    // deadline that kept a read always due, holding NRP writes forever.
    #[test]
    fn a_read_of_nrp_near_the_end_of_u64_time_does_not_hold_nrp_writes_forever() {
        let now = u64::MAX - 60_000;
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(now, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let (issued, _, last) = drive(&mut tracker, now, step, answer_ok(&[]));
        assert_eq!(issued.iter().filter(|c| **c == Command::ReadNrp).count(), 1, "{issued:?}");
        assert!(issued.iter().any(|c| matches!(c, Command::UpdateServices(_))), "registered: {issued:?}");
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
        assert_eq!(last.wake_at_ms, Some(u64::MAX), "the next resync saturates");
    }

    fn failed(status: u16) -> Outcome {
        Outcome::Failed(Failure { status, code: None, retry_after_ms: None, message: format!("HTTP {status}") })
    }

    fn finalizer_change(step: &Step) -> Option<(u64, bool)> {
        step.commands.iter().find_map(|c| match c.command {
            Command::SetFinalizer { present, .. } => Some((c.id, present)),
            _ => None,
        })
    }

    /// A tracker whose Service's first command (adding the finalizer) failed at [`NOW`].
    fn tracker_retrying_its_finalizer() -> (Tracker, Step) {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
        let (id, _) = finalizer_change(&step).unwrap();
        let step = tracker.complete(NOW, vec![(id, failed(500))]);
        (tracker, step)
    }

    // Regression: after the clock stepped back, a stale backoff deadline held back the end of a
    // deletion after its finalizer was removed, an upsert that re-added the finalizer in that
    // window was absorbed, and the lifecycle was dropped with the finalizer still held.
    // Upstream TestEngineOnServiceCreationComplete_GenuineDeletionCleansUp and
    // TestServiceUpdaterDeleteInboundService_FinalizerFailureRetries.
    #[test]
    fn after_the_clock_steps_back_a_deletion_ends_when_its_finalizer_is_gone_and_a_finalizer_put_back_is_removed() {
        let mut tracker = created_local();
        let deleting = terminating(lb_service("Local"));
        let t1 = NOW + 60_000;
        let step = tracker.observe(t1, vec![Observation::ServiceUpserted(deleting.clone())]);
        let mut removals = 0;
        drive(&mut tracker, t1, step, |command| match command {
            Command::SetFinalizer { present: false, .. } => {
                removals += 1;
                failed(500)
            }
            other => answer_ok(&[])(other),
        });
        assert_eq!(removals, 1);
        let retry = tracker.tick(t1 + 2_000);
        assert_eq!(finalizer_change(&retry).map(|(_, present)| present), Some(false), "{retry:?}");
        // The finalizer is removed; the answer comes after the host's clock stepped back an hour.
        let back = t1 - 3_600_000;
        let step = tracker.complete(back, vec![(finalizer_change(&retry).unwrap().0, Outcome::Ok)]);
        let deleted = step
            .commands
            .iter()
            .any(|c| matches!(&c.command, Command::EmitEvent(e) if e.reason == reason::DELETED_LOAD_BALANCER));
        assert!(deleted, "the deletion ends at once: {step:?}");
        assert_eq!(tracker.phase(UID), None);
        // Someone puts the finalizer back: it is ours, so it is cleaned up and released again.
        let step = tracker.observe(back + 1, vec![Observation::ServiceUpserted(deleting)]);
        let (issued, _, _) = drive(&mut tracker, back + 1, step, answer_ok(&[]));
        assert!(issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. })), "{issued:?}");
        assert_eq!(tracker.phase(UID), None);
    }

    // Regression: after the clock stepped back, absolute deadlines stalled every retry until the
    // clock caught up.
    #[test]
    fn after_the_clock_steps_back_an_hour_a_retry_waits_only_what_was_left_of_its_backoff() {
        let (mut tracker, step) = tracker_retrying_its_finalizer();
        let wake = step.wake_at_ms.unwrap();
        assert!((NOW + 1_000..=NOW + 1_200).contains(&wake), "{wake}");
        let back = NOW - 3_600_000;
        let step = tracker.tick(back);
        assert_eq!(finalizer_change(&step), None);
        assert_eq!(step.wake_at_ms, Some(wake - 3_600_000), "told in the host's clock");
        assert_eq!(finalizer_change(&tracker.tick(wake - 3_600_000 - 1)), None);
        assert_eq!(finalizer_change(&tracker.tick(wake - 3_600_000)).map(|(_, present)| present), Some(true));
        // A step forward is time that passed: the next backoff counts from it.
        let step = tracker.complete(NOW + 7_200_000, vec![]);
        assert!(step.commands.iter().any(|c| c.command == Command::ReadNrp), "the resync is overdue: {step:?}");
    }

    // Regression: a state imported with deadlines further ahead than the tracker ever schedules
    // (set under a clock that was ahead, or by a version that honoured any Retry-After) waits no
    // longer than the longest delay.
    #[test]
    fn an_imported_deadline_further_ahead_than_the_longest_delay_is_brought_in_to_it() {
        let (mut tracker, _) = tracker_retrying_its_finalizer();
        let far = NOW + 1_000_000_000_000_000;
        let lifecycle = tracker.state.lifecycles.get_mut(UID).unwrap();
        assert!(lifecycle.not_before_ms > NOW);
        lifecycle.not_before_ms = far;
        tracker.state.timers = BTreeSet::from([(far, UID.to_owned())]);
        tracker.state.nrp.next_read_ms = far;
        let (version, payload) = tracker.export_state();
        let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
        let latest = NOW + 1 + timing::MAX_DELAY_MS;
        let step = imported.tick(NOW + 1);
        assert!(step.commands.is_empty(), "{step:?}");
        assert_eq!(step.wake_at_ms, Some(latest));
        let step = imported.tick(latest - 1);
        assert!(step.commands.is_empty(), "{step:?}");
        let step = imported.tick(latest);
        assert!(step.commands.iter().any(|c| c.command == Command::ReadNrp), "{step:?}");
        assert_eq!(finalizer_change(&step).map(|(_, present)| present), Some(true), "{step:?}");
    }

    // Regression: fuzz target tracker, a clock at the end of u64 time (now = u64::MAX) made the
    // resync always due: every answered read issued the next one and the tracker was never idle.
    #[test]
    fn at_the_end_of_time_the_tracker_reads_nrp_once_and_is_idle() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step = tracker.observe(u64::MAX, vec![Observation::ListsComplete]);
        let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("the first read").id;
        let step = tracker.complete(u64::MAX, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
        assert!(step.commands.is_empty(), "{step:?}");
        assert!(step.idle, "{step:?}");
        let step = tracker.tick(u64::MAX);
        assert!(step.commands.is_empty() && step.idle, "{step:?}");
    }

    // Regression: fuzz target tracker (fuzz/regressions/tracker/
    // throttled-at-the-end-of-time-holds-its-writes). At the end of u64 time (now = u64::MAX: no
    // host's clock gets there, the fuzzer's does) a 429 empties the ARM write budget, and no time
    // passes to refill it: the writes it holds wait, as a refused location waits for a read that
    // never comes. The harness now allows that wait; this pins that it is the budget's alone and
    // loses nothing: the tracker issues no ARM write while it waits, and the same state imported
    // by a host whose clock is sane provisions the Service at the budget's pace.
    #[test]
    fn at_the_end_of_time_a_throttled_write_waits_for_its_budget_and_an_import_with_a_sane_clock_writes_it() {
        let end = u64::MAX;
        let is_public_ip = |c: &Command| matches!(c, Command::PutPublicIp(_));
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let mut step =
            tracker.observe(end, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let mut throttled_once = false;
        for _ in 0..20 {
            let mut answer = |c: &Command| {
                if is_public_ip(c) && !throttled_once {
                    throttled_once = true;
                    return throttled(0);
                }
                answer_ok(&[])(c)
            };
            let results: Vec<(u64, Outcome)> = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
            step = if results.is_empty() { tracker.tick(end) } else { tracker.complete(end, results) };
            assert!(!throttled_once || !step.commands.iter().any(|c| is_public_ip(&c.command)), "{step:?}");
        }
        assert!(throttled_once, "the public IP was put and throttled");
        let (version, payload) = tracker.export_state();
        let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
        let (mut now, mut put) = (NOW, false);
        while !put && now <= NOW + timing::MAX_DELAY_MS + 60_000 {
            let step = imported.tick(now);
            put = step.commands.iter().any(|c| is_public_ip(&c.command));
            now += 1_000;
        }
        assert!(put, "the imported tracker puts the public IP once its budget and backoff allow");
    }

    #[test]
    fn import_refuses_a_newer_version_and_a_corrupt_payload() {
        assert_eq!(Tracker::import_state(clb(), 99, &[]), Err(StateError::UnsupportedVersion(99)));
        assert!(matches!(Tracker::import_state(clb(), STATE_VERSION, &[0xff; 3]), Err(StateError::Corrupt(_))));
    }

    /// Pins the state format across the change to compact keys (`name.rs`): this state was
    /// exported by the tracker before it (version 1, at b1976f7), when every key was a `String`
    /// and every collection a `BTreeMap`/`BTreeSet` (7 dual-stack nodes with names longer than a
    /// `Name` keeps in place, 5 Services, an IPv6 endpoint change in flight and a Service being
    /// deleted). Version 2 writes the same bytes, then the egress side.
    #[test]
    fn a_state_exported_before_the_compact_keys_imports_and_exports_to_the_same_bytes() {
        let before: &[u8] = include_bytes!("../../tests/fixtures/state/v1-small-cluster.bin");
        let tracker = Tracker::import_state(clb(), 1, before).expect("a version 1 state");
        assert!(tracker.nrp_view().len() > 1, "the fixture holds a cluster");
        let (version, payload) = tracker.export_state();
        assert_eq!(version, STATE_VERSION);
        // Version 7 writes the same state with its NRP bookkeeping reshaped, then no pods, then
        // an ARM inventory with nothing left to read or adopt, then full write budgets, then no
        // outbound lifecycles, then no pod held by its finalizer.
        let upgraded = decode_exact::<State<NrpSyncV2>>(before).unwrap().upgrade();
        let budget = Buckets::full(&clb().write_budgets());
        let none = (&Outbound::default(), &PodFinalizers::default());
        let expected = (&upgraded, &Egress::default(), &ArmSync::settled(), &budget, none.0, none.1);
        assert_eq!(payload, postcard::to_allocvec(&expected).unwrap());
        assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    }

    fn corrupt(result: Result<Tracker, StateError>) -> String {
        match result {
            Err(StateError::Corrupt(why)) => why,
            other => panic!("expected a corrupt state, got {other:?}"),
        }
    }

    /// A tracker with Service commands, an Event and nothing else in flight: the lists are in,
    /// NRP was read, and the Service's first command (its finalizer) waits for its outcome.
    fn tracker_with_commands_in_flight() -> Tracker {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).unwrap().id;
        let step = tracker.complete(1, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
        assert!(step.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "{step:?}");
        tracker
    }

    // Regression: state import accepted trailing bytes.
    #[test]
    fn a_state_payload_with_bytes_after_it_is_refused_as_corrupt() {
        let tracker = tracker_with_commands_in_flight();
        let (version, payload) = tracker.export_state();
        assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
        let longer = [payload.as_slice(), &[0]].concat();
        let why = corrupt(Tracker::import_state(clb(), version, &longer));
        assert!(why.contains("1 byte(s) after the payload"), "{why}");
    }

    // Regression: a version-2 payload was imported as version 1, without its egress side.
    #[test]
    fn a_version_2_payload_offered_as_version_1_is_refused_as_corrupt() {
        let (_, payload) = as_versions_1_and_2(&tracker_with_commands_in_flight());
        let why = corrupt(Tracker::import_state(clb(), 1, &payload));
        assert!(why.starts_with("state version 1:") && why.contains("after the payload"), "{why}");
    }

    // Regression: counters of commands in flight were not validated on import.
    #[test]
    fn a_state_whose_counters_disagree_with_its_commands_in_flight_is_refused_as_corrupt() {
        let tracker = tracker_with_commands_in_flight();
        type Tamper = fn(&mut State);
        let tampered: [(&str, Tamper); 7] = [
            ("Service commands counted", |s| s.service_commands_in_flight += 1),
            ("NRP writes counted", |s| s.nrp.service_writes_in_flight += 1),
            ("reads of NRP flagged", |s| s.nrp.read_in_flight = true),
            ("batches counted in flight are [0]", |s| _ = s.nrp.batches_in_flight.insert(0, 0)),
            ("the next command id is 1", |s| s.next_command_id = 1),
            ("whose lifecycle does not wait for it", |s| {
                s.lifecycles.values_mut().for_each(|l| l.in_flight = None);
            }),
            ("lifecycles wait for a command", |s| {
                let (&id, _) = s.in_flight.iter().find(|(_, f)| matches!(f, InFlight::Service { .. })).unwrap();
                s.in_flight.remove(&id);
                s.service_commands_in_flight -= 1;
            }),
        ];
        for (expected, tamper) in tampered {
            let mut state = tracker.state.clone();
            tamper(&mut state);
            let payload = tracker.payload_with(&state);
            let why = corrupt(Tracker::import_state(clb(), STATE_VERSION, &payload));
            assert!(why.contains(expected), "{expected:?} not in {why:?}");
        }
    }

    // Regression: fuzz target state_import, fuzz/regressions/state_import/lifecycle-in-no-work-set-*
    // (a state whose unsettled lifecycle was in no work set, or a pending deletion outside
    // `draining`, imported, and that Service was never worked on again; under the invariants
    // feature the first quiet tick panicked).
    // Upstream TestEngineAddService_NewService and TestEngineUpdateService_NewServiceFallsThrough.
    #[test]
    fn a_state_with_a_lifecycle_outside_the_work_set_its_phase_needs_is_refused_as_corrupt() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let identity = tracker.state.lifecycles.keys().next().unwrap().clone();
        assert!(tracker.state.runnable.contains(&identity) && tracker.state.lifecycles[&identity].has_work_left());
        let (version, payload) = tracker.export_state();
        assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
        type Tamper = fn(&mut State, &str);
        let import = |tamper: Tamper| {
            let mut state = tracker.state.clone();
            state.runnable.clear();
            tamper(&mut state, &identity);
            let payload = tracker.payload_with(&state);
            Tracker::import_state(clb(), STATE_VERSION, &payload)
        };
        let refused: [(&str, Tamper); 3] = [
            ("(NotStarted): work left, but in no work set", |_, _| {}),
            ("(NotStarted): draining, but no deletion is pending", |s, id| _ = s.draining.insert(id.to_owned())),
            ("(DeletionPending): a pending deletion is not draining", |s, id| {
                s.lifecycles.get_mut(id).unwrap().phase = Phase::DeletionPending;
                s.runnable.insert(id.to_owned());
            }),
        ];
        for (expected, tamper) in refused {
            let why = corrupt(import(tamper));
            assert!(why.contains(&format!("the lifecycle of {identity:?} {expected}")), "{expected:?} not in {why:?}");
        }
        let accounted: [Tamper; 3] = [
            |s, id| _ = s.timers.insert((5_000, id.to_owned())),
            |s, id| s.lifecycles.get_mut(id).unwrap().parked = true,
            |s, id| {
                s.lifecycles.get_mut(id).unwrap().phase = Phase::DeletionPending;
                s.draining.insert(id.to_owned());
            },
        ];
        for tamper in accounted {
            import(tamper).unwrap();
        }
    }

    // Regression: fuzz target state_import, fuzz/regressions/state_import/next-command-id-at-u64-max
    // (an imported next command id of u64::MAX overflowed at the first command: a panic with
    // overflow checks, and without them ids wrapped to 0, onto the commands in flight).
    #[test]
    fn a_state_whose_next_command_id_leaves_no_room_to_count_is_refused_as_corrupt() {
        let tracker = tracker_with_commands_in_flight();
        for (next, refused) in [(u64::MAX, true), (MAX_NEXT_COMMAND_ID + 1, true), (MAX_NEXT_COMMAND_ID, false)] {
            let mut state = tracker.state.clone();
            state.next_command_id = next;
            let payload = tracker.payload_with(&state);
            match Tracker::import_state(clb(), STATE_VERSION, &payload) {
                Err(StateError::Corrupt(why)) if refused => assert!(why.contains("the next command id"), "{why}"),
                Ok(mut imported) if !refused => _ = imported.tick(NOW),
                other => panic!("next command id {next}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_version_1_state_imports_as_a_tracker_with_no_egress_pods_and_exports_as_the_current_version() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let (version_1, _) = as_versions_1_and_2(&tracker);
        let imported = Tracker::import_state(clb(), 1, &version_1).unwrap();
        assert_eq!(imported, tracker);
        let (version, payload) = imported.export_state();
        assert_eq!(version, STATE_VERSION);
        assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    }

    #[test]
    fn a_version_2_state_with_its_batch_in_flight_imports_with_that_batch_in_flight_and_its_answer_applies() {
        let (mut tracker, batch) = tracker_with_a_batch_in_flight();
        let (_, version_2) = as_versions_1_and_2(&tracker);
        let mut imported = Tracker::import_state(clb(), 2, &version_2).unwrap();
        // Issued at time 0 as far as version 3 knows, and with full write budgets (version 5):
        // otherwise the same state.
        tracker.state.nrp.batches_in_flight.values_mut().for_each(|at| *at = 0);
        tracker.budget = Buckets::full(&clb().write_budgets());
        assert_eq!(imported, tracker);
        imported.complete(10_000, vec![(batch, Outcome::Ok)]);
        assert!(imported.state.nrp.batches_in_flight.is_empty() && !imported.nrp_view().is_empty());
    }

    /// The locations of every address-location update among `issued`, with their addresses.
    fn programmed(issued: &[Command]) -> Vec<(String, Vec<String>)> {
        issued
            .iter()
            .filter_map(|c| match c {
                Command::UpdateAddressLocations(locations) => Some(locations),
                _ => None,
            })
            .flatten()
            .map(|l| (l.location.clone(), l.addresses.iter().map(|a| a.address.clone()).collect()))
            .collect()
    }

    // Ports upstream TestProcessK8sEndpoints_SkipsMalformedAddresses: an endpoint address that
    // is not an IP is left out; the slice's other addresses are programmed.
    #[test]
    fn an_endpoint_address_that_is_not_an_ip_is_skipped_and_the_others_are_programmed() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
        let slice =
            slice_on(&[("10.244.0.5", "n1"), ("not-an-ip", "n1"), ("10.244.0.300", "n1"), ("10.244.0.6", "n1")]);
        let step = tracker.observe(
            NOW,
            vec![
                node,
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice),
                Observation::ListsComplete,
            ],
        );
        let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
        assert_eq!(
            programmed(&issued),
            [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned(), "10.244.0.6".to_owned()])]
        );
        assert!(last.idle);
    }

    // Ports upstream TestIsServiceReady_StateUpdateInProgress: while its load balancer is being
    // updated, a registered Service is ready: its endpoint changes go to NRP meanwhile.
    #[test]
    fn endpoint_changes_of_a_service_whose_load_balancer_is_being_updated_reach_nrp_meanwhile() {
        let mut tracker = created_with(&[(80, 8080)]);
        let step = respec(&mut tracker, NOW, &[(80, 9090)]);
        assert!(put_in(&step).is_some(), "the update is in flight: {step:?}");
        assert_eq!(tracker.phase(UID), Some(Phase::UpdateInProgress));
        let step = tracker
            .observe(NOW, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.7", "n1")]))]);
        let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
        assert_eq!(programmed(&sent), [("10.224.0.4".to_owned(), vec!["10.244.0.7".to_owned()])], "{sent:?}");
    }

    // Ports upstream TestCreateInboundService_ServiceGoneNotFoundAbortsWithoutCreatingResources
    // and TestCreateInboundServiceClearsBuffersWhenServiceGone: a Service that is gone from the
    // API server when its finalizer is added (404) is abandoned before any Azure resource is
    // made, and its endpoints never reach NRP.
    #[test]
    fn a_service_gone_when_its_finalizer_is_added_makes_no_azure_resource_and_none_of_its_endpoints_reach_nrp() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
        let step = tracker.observe(
            NOW,
            vec![
                node,
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
                Observation::ListsComplete,
            ],
        );
        let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
            Command::SetFinalizer { .. } | Command::PatchServiceStatus { .. } => failed(404),
            Command::DeleteResource(_) => failed(404),
            other => answer_ok(&[])(other),
        });
        let made = issued.iter().any(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_)));
        assert!(!made, "{issued:?}");
        assert!(programmed(&issued).is_empty() && !issued.iter().any(|c| matches!(c, Command::UpdateServices(_))));
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), None);
    }

    // Ports upstream TestEngineUpdateService_IgnoredDuringDeletion and
    // TestGuardStateTransitions_CreateAfterDelete_BuffersRecreate: a spec that asks for the load
    // balancer again while it is being deleted does not interrupt the deletion; it is buffered,
    // and the Service is provisioned anew once the deletion is done.
    // Upstream TestUpdateService_RecreateAfterDeletionReplays, TestUpdateK8sService and
    // TestServiceUpdaterDeleteInboundService_Succeeds.
    #[test]
    fn a_service_wanted_again_during_its_deletion_is_deleted_first_then_provisioned_anew() {
        let mut tracker = created_with(&[(80, 8080)]);
        let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..ported(UID, &[(TCP, 80, to(8080))], &[]) };
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(cluster_ip)]);
        assert!(tracker.phase(UID).is_some_and(Phase::is_deleting), "{step:?}");
        // Wanted again before the first delete command is answered.
        let wanted = ported(UID, &[(TCP, 80, to(8080))], &[]);
        let again = tracker.observe(NOW, vec![Observation::ServiceUpserted(wanted)]);
        assert!(tracker.phase(UID).is_some_and(Phase::is_deleting), "the deletion goes on");
        let mut first = step;
        first.commands.extend(again.commands);
        let (issued, _, last) = drive(&mut tracker, NOW, first, answer_ok(&[UID]));
        let deleted_lb = issued
            .iter()
            .position(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer))
            .expect("the load balancer is deleted");
        let put_again = issued.iter().rposition(|c| matches!(c, Command::PutLoadBalancer(_))).expect("and put again");
        assert!(deleted_lb < put_again, "{issued:?}");
        let reasons: Vec<&str> = issued
            .iter()
            .filter_map(|c| match c {
                Command::EmitEvent(e) => Some(e.reason.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasons, [reason::DELETED_LOAD_BALANCER, reason::ENSURED_LOAD_BALANCER]);
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }

    /// A tracker with `lb_service` registered and one endpoint on each of nodes n4…n7
    /// (locations 10.224.0.4…7), and the step that starts programming them.
    fn four_locations() -> (Tracker, Step) {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let mut observations: Vec<Observation> = (4..8)
            .map(|i| {
                Observation::NodeUpserted(Node { name: format!("n{i}"), internal_ips: vec![format!("10.224.0.{i}")] })
            })
            .collect();
        let endpoints: Vec<(String, String)> = (4..8).map(|i| (format!("10.244.0.{i}"), format!("n{i}"))).collect();
        let slice = slice_on(&endpoints.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect::<Vec<_>>());
        observations.extend([
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice),
            Observation::ListsComplete,
        ]);
        let step = tracker.observe(NOW, observations);
        (tracker, step)
    }

    fn batch_locations(step: &Step) -> Vec<(u64, Vec<String>)> {
        step.commands
            .iter()
            .filter_map(|c| match &c.command {
                Command::UpdateAddressLocations(ls) => Some((c.id, ls.iter().map(|l| l.location.clone()).collect())),
                _ => None,
            })
            .collect()
    }

    // Ports upstream TestLocationsUpdater_TerminalErrorNotRetried, where the project deliberately
    // differs (design §4: one failing Service never blocks the others): a batch NRP refuses (400)
    // is halved until the refused location stands alone; that one is set aside and not retried
    // until it changes (or NRP is read again), and every other location is programmed.
    #[test]
    fn a_location_nrp_refuses_is_isolated_by_halving_and_set_aside_until_it_changes() {
        let (mut tracker, step) = four_locations();
        let bad = "10.224.0.6";
        let mut batches: Vec<Vec<String>> = Vec::new();
        let ok = answer_ok(&[UID]);
        let mut answer = |c: &Command| match c {
            Command::UpdateAddressLocations(ls) => {
                batches.push(ls.iter().map(|l| l.location.clone()).collect());
                if ls.iter().any(|l| l.location == bad) { failed(400) } else { Outcome::Ok }
            }
            other => ok(other),
        };
        drive(&mut tracker, NOW, step, &mut answer);
        let with_bad: Vec<&Vec<String>> = batches.iter().filter(|b| b.iter().any(|l| l == bad)).collect();
        assert_eq!(with_bad.last().map(|b| b.as_slice()), Some([bad.to_owned()].as_slice()), "{batches:?}");
        assert_eq!(with_bad.iter().filter(|b| b.len() == 1).count(), 1, "refused alone once: {batches:?}");
        let view = tracker.nrp_view();
        let programmed: Vec<&String> = view.keys().collect();
        assert_eq!(programmed, ["10.224.0.4", "10.224.0.5", "10.224.0.7"]);
        // Set aside: time passing does not retry it (until the next read of NRP, 5 minutes on,
        // which starts over from what NRP holds).
        let later = tracker.tick(NOW + 60_000);
        assert!(batch_locations(&later).iter().all(|(_, ls)| !ls.iter().any(|l| l == bad)), "{later:?}");
        // A change at that location is a new update: it is tried again.
        let mut endpoints: Vec<(String, String)> = (4..8).map(|i| (format!("10.244.0.{i}"), format!("n{i}"))).collect();
        endpoints.push(("10.244.0.16".into(), "n6".into()));
        let slice = slice_on(&endpoints.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect::<Vec<_>>());
        let step = tracker.observe(NOW + 60_000, vec![Observation::SliceUpserted(slice)]);
        let mut sent = batch_locations(&step);
        sent.extend(batch_locations(&later));
        assert!(sent.iter().any(|(_, ls)| ls.iter().any(|l| l == bad)), "{step:?}");
    }

    // Ports upstream TestIsTerminalLocationSyncStatus_ClassifiesEveryStatus, with the project's
    // classes (design §4): 400 and 422 refuse the batch (it is split at once), 429 throttles
    // every location for its Retry-After, and any other failure (5xx, or no answer: status 0)
    // backs off only the batch's locations.
    // Upstream TestLocationsUpdaterRetriesAfterSyncFailure,
    // TestLocationsUpdater_DrainKeepsRetryingPastAttemptCap and TestExtractAzureErrorInfo (differs: metrics
    // say ok or failed; the guest gets the status and the code).
    #[test]
    fn each_failure_status_of_an_address_location_batch_gets_its_class() {
        for status in [400u16, 422, 429, 500, 503, 0] {
            let (mut tracker, step) = four_locations();
            let (_, _, step) = drive_holding_batches_until_first(&mut tracker, step);
            let batches = batch_locations(&step);
            assert_eq!(batches.len(), 1, "{status}: one batch of every location: {step:?}");
            let (id, first) = batches[0].clone();
            assert_eq!(first.len(), 4);
            let failure = Outcome::Failed(Failure {
                status,
                code: None,
                retry_after_ms: (status == 429).then_some(5_000),
                message: "no".into(),
            });
            let next = tracker.complete(NOW, vec![(id, failure)]);
            let resent = batch_locations(&next);
            match status {
                400 | 422 => {
                    assert_eq!(resent.iter().map(|(_, ls)| ls.len()).collect::<Vec<_>>(), [2], "{status}: halved")
                }
                _ => {
                    assert!(resent.is_empty(), "{status}: nothing at once: {next:?}");
                    let wake = next.wake_at_ms.expect("a retry is scheduled");
                    if status == 429 {
                        assert_eq!(wake, NOW + 5_000, "429 waits its Retry-After");
                    } else {
                        assert!((NOW + 1_000..=NOW + 1_200).contains(&wake), "{status}: first backoff: {wake}");
                    }
                    let retried = batch_locations(&tracker.tick(wake));
                    assert_eq!(retried.iter().map(|(_, ls)| ls.len()).sum::<usize>(), 4, "{status}: {retried:?}");
                }
            }
        }
    }

    /// Answers everything but address-location batches until the first batch is issued.
    fn drive_holding_batches_until_first(tracker: &mut Tracker, mut step: Step) -> (Vec<Command>, Vec<LogLine>, Step) {
        let ok = answer_ok(&[UID]);
        let mut issued = Vec::new();
        for _ in 0..100 {
            if !batch_locations(&step).is_empty() || step.commands.is_empty() {
                return (issued, Vec::new(), step);
            }
            issued.extend(step.commands.iter().map(|c| c.command.clone()));
            let results = step.commands.iter().map(|c| (c.id, ok(&c.command))).collect();
            step = tracker.complete(NOW, results);
        }
        panic!("no address-location batch: {issued:?}");
    }

    // Ports upstream TestEndpointSliceAddresses_ResolvesLocationPerAddressFamily: each endpoint
    // address goes under its node's InternalIP of the same family, whatever the slice's
    // addressType says; an address whose family the node has no InternalIP of is left out.
    // Upstream TestColdStart_DualStackNode_InboundFamilyMatchedLocationKey.
    #[test]
    fn each_endpoint_address_goes_under_its_nodes_internal_ip_of_the_same_family() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let dual = Node { name: "dual".into(), internal_ips: vec!["10.224.0.4".into(), "fd00::4".into()] };
        let v4_only = Node { name: "v4".into(), internal_ips: vec!["10.224.0.5".into()] };
        let endpoint = |addresses: &[&str], node: &str| Endpoint {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            node_name: Some(node.into()),
            ready: Some(true),
        };
        let slice = EndpointSlice {
            endpoints: vec![
                endpoint(&["10.244.0.5", "fd00:244::5"], "dual"),
                endpoint(&["10.244.0.6", "fd00:244::6"], "v4"),
            ],
            ..slice_on(&[])
        };
        let step = tracker.observe(
            NOW,
            vec![
                Observation::NodeUpserted(dual),
                Observation::NodeUpserted(v4_only),
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice),
                Observation::ListsComplete,
            ],
        );
        let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
        let mut sent = programmed(&issued);
        sent.sort();
        let expected = [("10.224.0.4", "10.244.0.5"), ("10.224.0.5", "10.244.0.6"), ("fd00::4", "fd00:244::5")];
        let expected: Vec<(String, Vec<String>)> =
            expected.iter().map(|(l, a)| (l.to_string(), vec![a.to_string()])).collect();
        assert_eq!(sent, expected, "fd00:244::6 has no IPv6 location on v4");
        assert!(last.idle);
    }

    // Ports upstream TestGuardServiceUpdater_BackoffAndTerminalCeiling, where the project
    // deliberately differs: upstream parks a Service after 12 failures; here a failure that is
    // not a refusal of the spec (TERMINAL_CODES, 422) is retried for as long as it lasts, its
    // backoff capped at 30 s, because a controller that stops trying needs an operator to notice
    // (design §4: backoff per Service, no give-up). A refusal parks at once (tested above).
    // Upstream TestEngineOnServiceCreationComplete_Failure and
    // TestEngineOnServiceCreationComplete_TransientErrorRetries.
    #[test]
    fn a_load_balancer_put_that_keeps_failing_is_retried_past_any_ceiling_with_a_capped_backoff() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
        let ok = answer_ok(&[]);
        let mut now = NOW;
        let mut step = step;
        let mut failures = 0;
        let mut delays = Vec::new();
        while failures < 20 {
            let results: Vec<(u64, Outcome)> = step
                .commands
                .iter()
                .map(|c| match c.command {
                    Command::PutLoadBalancer(_) => {
                        failures += 1;
                        (c.id, failed(500))
                    }
                    _ => (c.id, ok(&c.command)),
                })
                .collect();
            let failed_now = step.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_)));
            let next = tracker.complete(now, results);
            let put = next.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_)));
            assert!(!(failed_now && put), "no PUT again at once: {:?}", next.commands);
            if next.commands.is_empty() {
                let wake = next.wake_at_ms.expect("a retry is always scheduled");
                delays.push(wake - now);
                assert!(tracker.tick(wake - 1).commands.is_empty(), "nothing before the backoff ends");
                now = wake;
                step = tracker.tick(now);
            } else {
                step = next;
            }
        }
        assert!(!tracker.state.lifecycles[UID].parked, "never parked");
        assert!(delays[0] > 0 && delays[1] > delays[0] && delays[2] > delays[1], "the backoff grows: {delays:?}");
        assert!(delays.iter().all(|&d| d <= timing::BACKOFF_CAP_MS * 6 / 5), "{delays:?}");
        assert!(delays.iter().rev().take(5).all(|&d| d >= timing::BACKOFF_CAP_MS), "at the cap: {delays:?}");
        assert!(step.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_))), "still trying");
    }

    // Ports upstream TestUpdateServiceLoadBalancerStatus_PreservesDualStackAndHostname, where
    // the project deliberately differs: `status.loadBalancer.ingress` is exactly the public IP
    // this controller allocated; other entries (another family's IP, a stale address) are
    // replaced, not kept, since the Service's load balancer has that one frontend and an entry
    // it does not serve would send clients elsewhere (hostnames never reach the guest: the host
    // copies IPs only).
    // Upstream TestCreateInboundService_PopulatesIngressOnSuccess.
    #[test]
    fn the_ingress_status_is_set_to_exactly_the_allocated_public_ip() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let service = Service { ingress_ips: vec!["2603:1030::9".into(), "20.0.0.1".into()], ..lb_service("Local") };
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
        let patched: Vec<&Vec<String>> = issued
            .iter()
            .filter_map(|c| match c {
                Command::PatchServiceStatus { ingress_ips, .. } => Some(ingress_ips),
                _ => None,
            })
            .collect();
        assert_eq!(patched, [&vec!["20.0.0.1".to_owned()]], "{issued:?}");
    }

    // Ports upstream TestOnServiceCreationComplete_OverlayMappingsErrorReDrainsLocations and
    // TestIsServiceOverlayMappingsError (the project recognises the error by its ARM code,
    // `ServiceWithOverlayMappingsCannotBeDeleted`, not by the message text): an unregistration
    // NRP refuses because addresses still map to the service sends the deletion back to draining,
    // NRP is read again, the addresses the mirror did not know of are removed, and then the
    // service is unregistered and the finalizer released.
    // Upstream TestGuardCheckPendingServiceDeletions_BlockedWhenLocationsRemain,
    // TestGuardCheckPendingServiceDeletions_AdvancesWhenLocationsCleared and
    // TestEngineOnServiceCreationComplete_GenuineDeletionCleansUp.
    #[test]
    fn an_unregistration_refused_for_overlay_mappings_re_reads_nrp_drains_again_and_then_unregisters() {
        let mut tracker = created_with(&[(80, 8080)]);
        let deleting = terminating_web();
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(deleting)]);
        let stray = NrpListedLocation {
            location: "10.224.0.4".into(),
            addresses: vec![NrpAddress { address: "10.244.0.99".into(), services: vec![UID.into()] }],
        };
        let (mut refused, mut reads_after) = (false, 0);
        let registered =
            NrpService { name: UID.into(), service_type: "Inbound".into(), backend_pools: vec![], is_default: false };
        let mut answer = |c: &Command| match c {
            Command::UpdateServices(requests) if requests[0].is_delete && !refused => {
                refused = true;
                Outcome::Failed(Failure {
                    status: 400,
                    code: Some(OVERLAY_MAPPINGS_CODE.into()),
                    retry_after_ms: None,
                    message: "mapped".into(),
                })
            }
            Command::ReadNrp => {
                reads_after += 1;
                Outcome::NrpSnapshot(NrpState { services: vec![registered.clone()], locations: vec![stray.clone()] })
            }
            other => answer_ok(&[UID])(other),
        };
        // The refused step backs off (1 s): run on through its retry.
        let (mut issued, mut now, mut step) = (Vec::new(), NOW, step);
        let last = loop {
            let (sent, _, last) = drive(&mut tracker, now, step, &mut answer);
            issued.extend(sent);
            match last.wake_at_ms.filter(|_| !last.idle) {
                Some(at) if at < NOW + 60_000 => {
                    now = at;
                    step = tracker.tick(now);
                }
                _ => break last,
            }
        };
        assert!(refused && reads_after >= 1, "{issued:?}");
        let position = |want: &dyn Fn(&Command) -> bool| issued.iter().rposition(want);
        let read = issued.iter().position(|c| *c == Command::ReadNrp).expect("NRP read again");
        // The location goes (no addresses: NRP deletes it), or the stray address leaves it.
        let removes_stray = |l: &NrpLocation| {
            l.location == "10.224.0.4"
                && (l.addresses.is_empty()
                    || l.addresses.iter().any(|a| a.address == "10.244.0.99" && a.services.is_empty()))
        };
        let drained = position(&|c| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(removes_stray)))
            .unwrap_or_else(|| panic!("the stray address is removed: {issued:#?}"));
        let unregistered = position(&|c| matches!(c, Command::UpdateServices(r) if r[0].is_delete)).unwrap();
        let released = position(&|c| matches!(c, Command::SetFinalizer { present: false, .. })).unwrap();
        assert!(read < drained && drained < unregistered && unregistered < released, "{issued:?}");
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), None);
    }

    fn refused_for_good() -> Outcome {
        Outcome::Failed(Failure {
            status: 400,
            code: Some("InvalidParameter".into()),
            retry_after_ms: None,
            message: "bad rule".into(),
        })
    }

    fn warned_rejected(issued: &[Command]) -> bool {
        issued
            .iter()
            .any(|c| matches!(c, Command::EmitEvent(e) if e.reason == reason::LOAD_BALANCER_CONFIGURATION_REJECTED))
    }

    // Ports upstream TestEngineOnServiceCreationComplete_DriftDuringTerminalFailureReDispatches
    // and TestEngineOnServiceCreationComplete_DriftDuringTerminalUpdateReDispatches: when Azure
    // refuses a load balancer for good but the spec changed while that PUT was in flight, the
    // refusal is of a spec nobody wants any more: the current spec is put at once, with no park
    // and no Warning — in a creation and in an update alike.
    #[test]
    fn a_refusal_of_a_spec_that_changed_while_in_flight_puts_the_current_spec_instead_of_parking() {
        for creating in [true, false] {
            let (mut tracker, put) = if creating {
                let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
                let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
                let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
                let (put, _) = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
                (tracker, put)
            } else {
                let mut tracker = created_with(&[(80, 8080)]);
                let step = respec(&mut tracker, NOW, &[(80, 8081)]);
                let (put, _) = put_in(&step).expect("the update is sent");
                (tracker, put)
            };
            // The spec changes while the PUT is in flight; then Azure refuses the old one.
            let changed = respec(&mut tracker, NOW + 1, &[(80, 9090)]);
            assert!(put_in(&changed).is_none(), "one PUT at a time");
            let step = tracker.complete(NOW + 2, vec![(put, refused_for_good())]);
            let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
            let put_again = load_balancers(&sent);
            assert_eq!(put_again.len(), 1, "creating {creating}: {sent:?}");
            assert_eq!(put_again[0].rules[0].backend_port, 9090, "the current spec");
            assert!(!warned_rejected(&sent), "no Warning for a spec nobody wants: {sent:?}");
            let (issued, _, last) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
            assert!(!warned_rejected(&issued) && last.idle);
            assert_eq!(tracker.phase(UID), Some(Phase::Created));
        }
    }

    // Ports upstream TestRecreateAfterDeletion_ClearsCreationFailedTerminal: a creation parked
    // by a refusal is not parked any more once the Service was deleted and is wanted again: the
    // new creation runs from the start.
    #[test]
    fn a_service_recreated_after_a_parked_creation_is_provisioned_from_the_start() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec.clone()), Observation::ListsComplete]);
        let ok = answer_ok(&[]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, |c| match c {
            Command::PutLoadBalancer(_) => refused_for_good(),
            other => ok(other),
        });
        assert!(warned_rejected(&issued), "parked: {issued:?}");
        // Deleted (retyped away) and wanted again: deletion first, then a creation from scratch.
        let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..spec.clone() };
        let mut step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(cluster_ip)]);
        step.commands.extend(tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(spec)]).commands);
        let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
        assert_eq!(load_balancers(&issued).len(), 1, "put again: {issued:?}");
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }

    // Upstream TestUpdateService_CreationFailedTerminalRecoversOnSpecChange: a creation parked by
    // a refusal is taken up again by a spec change at once, in the step that observes it (no
    // tick, no backoff), and its load balancer is put with the new spec.
    #[test]
    fn a_creation_parked_by_a_refusal_is_put_again_at_once_with_the_spec_that_changed() {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
        let ok = answer_ok(&[]);
        let (issued, _, _) =
            drive(&mut tracker, NOW, step, |c| if is_put_load_balancer(c) { refused_for_good() } else { ok(c) });
        assert!(warned_rejected(&issued), "parked: {issued:?}");
        assert!(tracker.state.lifecycles[UID].parked);
        let unchanged = ported(UID, &[(TCP, 80, to(8080))], &[]);
        let same = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(unchanged)]);
        assert!(same.commands.is_empty(), "the same spec stays parked: {same:?}");
        let changed = ported(UID, &[(TCP, 80, to(8081))], &[]);
        let step = tracker.observe(NOW + 2, vec![Observation::ServiceUpserted(changed)]);
        assert!(!step.commands.is_empty(), "dispatched in the step that observes the change: {step:?}");
        assert!(!tracker.state.lifecycles[UID].parked);
        // Driven at the same instant: nothing waits for a backoff.
        let (issued, _, last) = drive(&mut tracker, NOW + 2, step, answer_ok(&[]));
        let put = load_balancers(&issued);
        assert_eq!(put.len(), 1, "{issued:?}");
        assert_eq!(put[0].rules, vec![rule(LbProtocol::Tcp, 80, 8081, 4)], "the new spec");
        assert!(!warned_rejected(&issued));
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }

    // Upstream TestServiceUpdaterUpdateInboundService, its unsupported-spec case: a created Service
    // whose spec turns dual-stack is never put with it (admission refuses it before anything is
    // written), gets one Warning and keeps its last admitted spec; its retryable-failure case is
    // a_spec_changed_during_an_update_is_put_after_it_and_a_failed_update_is_retried_with_its_spec.
    #[test]
    fn a_created_service_whose_spec_turns_dual_stack_is_not_put_and_keeps_its_admitted_spec() {
        let mut tracker = created_with(&[(80, 8080)]);
        let dual = Service {
            ip_families: vec!["IPv4".into(), "IPv6".into()],
            ..ported(UID, &[(TCP, 80, to(9090))], &[])
        };
        let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(dual)]);
        let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
        assert!(load_balancers(&issued).is_empty(), "{issued:?}");
        let events: Vec<&Event> =
            issued.iter().filter_map(|c| if let Command::EmitEvent(e) = c { Some(e) } else { None }).collect();
        assert_eq!(events.len(), 1, "{issued:?}");
        assert_eq!(events[0].reason, crate::admission::reason::UNSUPPORTED_DUAL_STACK);
        assert!(issued.iter().all(|c| matches!(c, Command::EmitEvent(_))), "nothing written: {issued:?}");
        let kept = tracker.admitted_spec("default", "web").unwrap();
        assert!(kept.ip_families.len() <= 1 && kept.ports[0].target_port == to(8080), "{kept:?}");
        assert!(last.idle);
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }

    // ---- Per-phase dispatch (upstream engine_state_machine_guards_test.go) ----

    /// Runs `step` answered by `answer_ok`, holding in flight the first command `hold` matches
    /// (the rest are answered); returns that command with its id.
    fn drive_holding(
        tracker: &mut Tracker,
        now: u64,
        mut step: Step,
        hold: impl Fn(&Command) -> bool,
    ) -> (u64, Command) {
        let ok = answer_ok(&[]);
        for _ in 0..1_000 {
            assert!(!step.commands.is_empty(), "the command to hold was never issued");
            let held = step.commands.iter().find(|c| hold(&c.command)).map(|c| (c.id, c.command.clone()));
            let results = step.commands.iter().filter(|c| Some(c.id) != held.as_ref().map(|h| h.0));
            let results = results.map(|c| (c.id, ok(&c.command))).collect();
            step = tracker.complete(now, results);
            if let Some(held) = held {
                drive(tracker, now, step, &ok);
                return held;
            }
        }
        panic!("the tracker kept issuing commands");
    }

    fn is_put_load_balancer(command: &Command) -> bool {
        matches!(command, Command::PutLoadBalancer(_))
    }

    /// The test Service (port 80 → 8080, a ready pod on n1) brought to `phase`, with the command
    /// that keeps it there held in flight (for `NotStarted`, whose lists are not complete, the
    /// read of NRP; none for `Created`).
    fn in_phase(phase: Phase) -> (Tracker, Option<(u64, Command)>) {
        let (tracker, held) = match phase {
            Phase::NotStarted => {
                let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
                let node =
                    Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
                let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
                let slice = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")]));
                let step = tracker.observe(NOW, vec![node, Observation::ServiceUpserted(spec), slice]);
                let read = step.commands.iter().map(|c| (c.id, c.command.clone())).collect::<Vec<_>>();
                assert_eq!(read.iter().map(|(_, c)| c).collect::<Vec<_>>(), [&Command::ReadNrp], "nothing else");
                (tracker, read.into_iter().next())
            }
            Phase::CreationInProgress => {
                let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
                let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
                let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
                let held = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
                (tracker, Some(held))
            }
            Phase::Created => (created_with(&[(80, 8080)]), None),
            Phase::UpdateInProgress => {
                let mut tracker = created_with(&[(80, 8080)]);
                let step = respec(&mut tracker, NOW, &[(80, 8081)]);
                let held = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
                (tracker, Some(held))
            }
            Phase::DeletionPending | Phase::DeletionInProgress => {
                let mut tracker = created_with(&[(80, 8080)]);
                let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
                let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..spec };
                let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(cluster_ip)]);
                let (drain, batch) = drive_holding(&mut tracker, NOW, step, is_location_update);
                if phase == Phase::DeletionPending {
                    (tracker, Some((drain, batch)))
                } else {
                    let step = tracker.complete(NOW, vec![(drain, Outcome::Ok)]);
                    let unlink = drive_holding(&mut tracker, NOW, step, |c| matches!(c, Command::UpdateServices(_)));
                    (tracker, Some(unlink))
                }
            }
        };
        assert_eq!(tracker.phase(UID), Some(phase));
        (tracker, held)
    }

    /// Answers `held` and the commands of `pending`, and runs everything that follows, the lists
    /// completed if they were not; returns every command `pending` and the rest issued.
    fn finish(tracker: &mut Tracker, now: u64, held: Option<(u64, Command)>, mut pending: Step) -> Vec<Command> {
        let ok = answer_ok(&[]);
        pending.commands.extend(tracker.observe(now, vec![Observation::ListsComplete]).commands);
        if let Some((id, command)) = held {
            pending.commands.extend(tracker.complete(now, vec![(id, ok(&command))]).commands);
        }
        drive(tracker, now, pending, ok).0
    }

    const PHASES: [Phase; 6] = [
        Phase::NotStarted,
        Phase::CreationInProgress,
        Phase::Created,
        Phase::UpdateInProgress,
        Phase::DeletionPending,
        Phase::DeletionInProgress,
    ];

    // Upstream TestGuardStateTransitions_UpdateServiceDispatch, TestEngineUpdateService_IgnoredDuringDeletion
    // and TestGuardStateTransitions_CreateAfterDelete_BuffersRecreate: a spec change in each
    // phase. Every phase records the new spec; only a created Service starts an update at once
    // (one PUT of the new spec); a creation or an update in flight keeps its phase and sends
    // nothing more; a deletion goes on and remembers to provision the Service again. And in every
    // phase the Service ends created with the new spec: nothing serves the old one after an edit.
    // Upstream TestUpdateService_RecreateAfterDeletionReplays and TestEngineAddService_AlreadyTracked.
    #[test]
    fn a_spec_change_in_each_phase_is_recorded_and_only_a_created_service_starts_an_update() {
        for phase in PHASES {
            let (mut tracker, held) = in_phase(phase);
            let step = respec(&mut tracker, NOW + 1, &[(80, 9090)]);
            let after = if phase == Phase::Created { Phase::UpdateInProgress } else { phase };
            assert_eq!(tracker.phase(UID), Some(after), "{phase:?}");
            let put = put_in(&step);
            assert_eq!(put.is_some(), phase == Phase::Created, "{phase:?}: {:?}", step.commands);
            assert!(put.is_none_or(|(_, lb)| lb.rules[0].backend_port == 9090));
            let lifecycle = &tracker.state.lifecycles[UID];
            let desired = lifecycle.desired.as_ref().expect("a spec is wanted");
            assert_eq!(desired.load_balancer.rules[0].backend_port, 9090, "{phase:?}: the new spec is recorded");
            assert_eq!(lifecycle.recreate, phase.is_deleting(), "{phase:?}");

            let issued = finish(&mut tracker, NOW + 2, held, step);
            assert_eq!(tracker.phase(UID), Some(Phase::Created), "{phase:?}: {issued:?}");
            let lifecycle = &tracker.state.lifecycles[UID];
            assert_eq!(lifecycle.applied, lifecycle.desired, "{phase:?}");
            let last = load_balancers(&issued).last().map(|lb| lb.rules[0].backend_port);
            assert_eq!(last, Some(9090), "{phase:?}: the last PUT is of the new spec: {issued:?}");
        }
    }

    // Upstream TestGuardStateTransitions_DeleteServiceDispatch: deleting the Service in any phase
    // before deletion makes it DeletionPending and queues it for the drain (its addresses leave
    // NRP before anything is unregistered); an update in flight ends in the deletion, not in a
    // status patch; in every phase the load balancer is deleted and the Service forgotten.
    // Upstream TestGuardLifecycle_DeleteDuringCreateRoutesToDeletion, TestEngineDeleteService_NoLocations,
    // TestEngineDeleteService_DuringUpdate, TestEngineOnServiceCreationComplete_DeletionPendingAfterUpdate,
    // TestEngineOnServiceCreationComplete_DeleteDuringCreateRoutesToDeletion,
    // TestDeleteService_DuringUpdateNoLocations_DispatchesDelete and
    // TestLoadBalancerEnsureDeletedSchedulesTeardown.
    #[test]
    fn deleting_a_service_in_any_phase_before_deletion_queues_its_drain_and_ends_in_its_deletion() {
        for phase in &PHASES[..4] {
            let (mut tracker, held) = in_phase(*phase);
            let step = tracker.observe(NOW + 1, vec![Observation::ServiceDeleted(ObjectKey::new("default", "web"))]);
            assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending), "{phase:?}");
            assert!(tracker.state.draining.contains(UID), "{phase:?}: queued for the drain");
            assert!(put_in(&step).is_none(), "{phase:?}");
            let issued = finish(&mut tracker, NOW + 2, held, step);
            assert_eq!(tracker.phase(UID), None, "{phase:?}: forgotten: {issued:?}");
            assert!(
                !issued
                    .iter()
                    .any(|c| matches!(c, Command::PatchServiceStatus { ingress_ips, .. } if !ingress_ips.is_empty())),
                "{phase:?}: no status patch of an address being deleted: {issued:?}"
            );
            let load_balancer_deleted = issued.iter().any(
                |c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer && r.name == UID),
            );
            assert!(load_balancer_deleted, "{phase:?}: {issued:?}");
        }
    }

    // ---- Start-up adoption from the ARM inventory ----

    const ADDRESS: &str = "20.0.0.7";

    /// `lb_service` as a controller that provisioned it left it: finalizer held, status set.
    fn provisioned_service() -> Service {
        Service { finalizers: vec![FINALIZER.into()], ingress_ips: vec![ADDRESS.into()], ..lb_service("Local") }
    }

    fn inventory_of(service: &Service, load_balancer: Option<LoadBalancer>) -> ArmInventory {
        let config = LbConfig::for_service(service);
        ArmInventory {
            nat_gateways: Vec::new(),
            public_ips: vec![ListedPublicIp {
                name: config.public_ip.name.to_string(),
                version: config.public_ip.version,
                address: Some(ADDRESS.into()),
                as_put: true,
            }],
            load_balancers: load_balancer
                .map(|lb| ListedLoadBalancer { name: lb.name.to_string(), shape: Some(lb) })
                .into_iter()
                .collect(),
        }
    }

    /// [`drive`] with NRP listing `registered` and ARM answering `arm`.
    fn reads_answered(
        tracker: &mut Tracker,
        step: &Step,
        registered: &[&str],
        arm: Outcome,
    ) -> (Vec<Command>, Vec<LogLine>, Step) {
        let nrp = answer_ok(registered);
        drive(tracker, NOW, step.clone(), |c| if *c == Command::ReadArm { arm.clone() } else { nrp(c) })
    }

    fn writes(issued: &[Command]) -> Vec<&Command> {
        issued.iter().filter(|c| !matches!(c, Command::EmitEvent(_) | Command::ReadNrp | Command::ReadArm)).collect()
    }

    // Upstream TestGuardWaitForInitialSync_ReturnsOnCompletion.
    #[test]
    fn at_start_up_the_tracker_lists_arm_once_the_lists_are_complete_and_nrp_is_read_and_writes_nothing_before() {
        let mut tracker = Tracker::create(clb()).unwrap();
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(provisioned_service())]);
        let sent: Vec<&Command> = step.commands.iter().map(|c| &c.command).collect();
        assert_eq!(sent, [&Command::ReadNrp]);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
        assert!(step.commands.is_empty() && step.wake_at_ms.is_some_and(|at| at > NOW), "{step:?}");
        let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
        let sent: Vec<&Command> = step.commands.iter().map(|c| &c.command).collect();
        assert_eq!(sent, [&Command::ReadArm], "the inventory is read, nothing written yet");
        assert!(!step.idle);
        let step = tracker.complete(NOW, vec![(step.commands[0].id, Outcome::ArmInventory(ArmInventory::default()))]);
        assert!(step.commands.iter().any(|c| matches!(c.command, Command::PutPublicIp(_))), "{step:?}");
    }

    // Upstream TestGuardAddService_IdempotentForExistingNRPLB, TestEngineAddService_ExistsInNRP,
    // TestEngineUpdateService_NoOpWhenConfigUnchanged, TestEngineUpdateEndpoints_AfterRestart,
    // TestEngineAddService_AfterRestart, TestShouldTriggerInitialLocationSync, TestUpdateNRPLoadBalancers
    // and TestGetSyncOperations.
    #[test]
    fn a_restarted_controller_adopts_a_service_whose_azure_resources_registration_and_status_hold_with_no_write_and_no_event()
     {
        let service = provisioned_service();
        let mut tracker = Tracker::create(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let config = LbConfig::for_service(&service);
        let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
        let (issued, logs, last) =
            reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
        assert_eq!(issued, [Command::ReadNrp, Command::ReadArm], "nothing written, no second EnsuredLoadBalancer");
        assert!(last.idle);
        assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
        assert!(
            logs.iter()
                .any(|l| l.message.contains("1 Service(s) adopted their public IP, 1 of them with nothing to write"))
        );
        // Adopted as applied: the same spec again writes nothing, a port change puts the LB once.
        let again = tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone())]);
        assert!(again.commands.is_empty(), "{again:?}");
        let changed =
            Service { ports: vec![ServicePort { port: 8080, ..service.ports[0].clone() }], ..service.clone() };
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(changed)]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[&service.identity()]));
        assert_eq!(load_balancers(&issued).len(), 1, "{issued:?}");
        assert_eq!(writes(&issued).len(), 1, "only the load balancer: {issued:?}");
    }

    // Upstream TestGuardUpdateService_LBInNRPCreatesTrackingEntry.
    #[test]
    fn a_restarted_controller_adopts_the_public_ip_and_puts_a_load_balancer_whose_rules_differ_once() {
        let service = provisioned_service();
        let config = LbConfig::for_service(&service);
        for listed in [
            Some(LoadBalancer { rules: vec![], ..config.load_balancer.clone() }),
            None, // ARM lists no load balancer by that name, or one the record cannot say
        ] {
            let mut tracker = Tracker::create(clb()).unwrap();
            let step =
                tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
            let inventory = inventory_of(&service, listed.clone());
            let (issued, _, last) =
                reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
            assert_eq!(writes(&issued), [&Command::PutLoadBalancer(config.load_balancer.clone())], "{listed:?}");
            assert!(last.idle);
            assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
        }
    }

    #[test]
    fn a_listed_public_ip_that_is_not_as_put_or_has_no_address_is_put_again() {
        let service = provisioned_service();
        let config = LbConfig::for_service(&service);
        for tamper in [|p: &mut ListedPublicIp| p.as_put = false, |p: &mut ListedPublicIp| p.address = None] {
            let mut inventory = inventory_of(&service, Some(config.load_balancer.clone()));
            tamper(&mut inventory.public_ips[0]);
            let mut tracker = Tracker::create(clb()).unwrap();
            let step =
                tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
            let (issued, _, _) =
                reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
            assert!(matches!(writes(&issued)[0], Command::PutPublicIp(_)), "{issued:?}");
        }
    }

    // Ports upstream TestScheduleOrphanedResourceDeletions_SkipsNonUUIDLoadBalancers: only
    // UID-named load balancers (and `<uid>-pip` public IPs) are ever taken for orphans; here
    // `kubernetes` and its public IP stay, as do a UID-named one of another shape and one whose
    // shape the host could not say.
    // Upstream TestGuardDeleteService_OrphanForcesTrackingEntry,
    // TestCheckPendingServiceDeletions_MissingFromPendingServiceOps and TestGetSyncLoadBalancerServices.
    #[test]
    fn resources_of_services_deleted_while_no_controller_ran_are_deleted_and_nothing_else_is_touched() {
        let gone = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e99";
        let pip_only = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e98";
        let foreign_shape = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e97";
        let ours = |name: &str| LoadBalancer {
            name: name.into(),
            public_ip: format!("{name}-pip").into(),
            backend_pool: name.into(),
            rules: vec![],
        };
        let pip = |name: &str| ListedPublicIp {
            name: name.into(),
            version: IpVersion::Ipv4,
            address: Some("20.0.0.9".into()),
            as_put: true,
        };
        let inventory = ArmInventory {
            nat_gateways: Vec::new(),
            public_ips: vec![pip(&format!("{gone}-pip")), pip(&format!("{pip_only}-pip")), pip("kubernetes-pip")],
            load_balancers: vec![
                ListedLoadBalancer { name: gone.into(), shape: Some(ours(gone)) },
                ListedLoadBalancer { name: "kubernetes".into(), shape: Some(ours("kubernetes")) },
                ListedLoadBalancer {
                    name: foreign_shape.into(),
                    shape: Some(LoadBalancer { backend_pool: "other".into(), ..ours(foreign_shape) }),
                },
                ListedLoadBalancer { name: "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e96".into(), shape: None },
            ],
        };
        let mut tracker = Tracker::create(clb()).unwrap();
        let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
        let (issued, logs, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(inventory));
        let deleted = |kind: ResourceKind, name: String| Command::DeleteResource(ResourceRef { kind, name });
        let expected = [
            deleted(ResourceKind::LoadBalancer, gone.into()),
            deleted(ResourceKind::PublicIp, format!("{gone}-pip")),
            deleted(ResourceKind::LoadBalancer, pip_only.into()),
            deleted(ResourceKind::PublicIp, format!("{pip_only}-pip")),
        ];
        let mut written: Vec<Command> = writes(&issued).into_iter().cloned().collect();
        written.sort_by_key(|c| format!("{c:?}"));
        let mut expected = expected.to_vec();
        expected.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(written, expected);
        assert!(last.idle);
        assert!(logs.iter().any(|l| l.message.contains("2 orphan(s) of deleted Services to delete")), "{logs:?}");
    }

    // Ports upstream TestRecoverStuckFinalizers_KeepsFinalizerWhenOnlyPIPExists and
    // TestRecoverStuckFinalizers_RemovesFinalizerWhenNoAzureResource: a Service found deleting
    // at start-up keeps its finalizer until what is left of its Azure resources is deleted (a
    // delete that finds nothing is done), then releases it. A public IP listed with no address
    // yet (the crash right after its create), or not as put, still counts as left.
    // Upstream TestReconcileInboundService_DeletingServiceIsNotProvisionedFromScratch,
    // TestDeletePublicIP_Mock and TestEngineDeleteService_AfterRestart.
    #[test]
    fn a_service_found_deleting_at_start_up_releases_its_finalizer_only_after_what_is_left_in_azure_is_deleted() {
        let config = LbConfig::for_service(&provisioned_service());
        for (pip_left, address, as_put) in
            [(true, Some(ADDRESS), true), (true, None, true), (true, None, false), (false, None, true)]
        {
            let deleting = Service { deleting: true, ..provisioned_service() };
            let identity = deleting.identity();
            let mut inventory = inventory_of(&deleting, None);
            inventory.public_ips[0].address = address.map(str::to_owned);
            inventory.public_ips[0].as_put = as_put;
            if !pip_left {
                inventory.public_ips.clear();
            }
            let mut tracker = Tracker::create(clb()).unwrap();
            let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(deleting), Observation::ListsComplete]);
            let mut public_ip_there = pip_left;
            let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
                Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
                Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp && public_ip_there => {
                    public_ip_there = false;
                    Outcome::Ok
                }
                Command::DeleteResource(_) => failed(404),
                other => answer_ok(&[])(other),
            });
            let deleted_pip = Command::DeleteResource(ResourceRef {
                kind: ResourceKind::PublicIp,
                name: config.public_ip.name.to_string(),
            });
            let pip_at = issued.iter().position(|c| *c == deleted_pip).expect("the public IP is deleted");
            let released = issued
                .iter()
                .position(|c| matches!(c, Command::SetFinalizer { present: false, .. }))
                .expect("the finalizer is released");
            assert!(pip_at < released, "pip left: {pip_left} ({address:?}, as put {as_put}): {issued:?}");
            assert!(!public_ip_there && last.idle);
            assert_eq!(tracker.phase(&identity), None, "the deletion is done");
        }
    }

    // Ports upstream TestFetchServiceGatewayServices_MatchesServiceTypeCaseInsensitively: NRP's
    // service type is compared in any case, so a registration listed as `INBOUND` is ours and
    // the restart adopts it with nothing to write, and one listed as `outbound` is an egress
    // identity's. Its `InboundOutbound` and unknown-type cases differ (see below).
    #[test]
    fn an_nrp_service_type_in_any_case_is_an_inbound_registration() {
        let service = provisioned_service();
        let config = LbConfig::for_service(&service);
        let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
        let mut tracker = Tracker::create(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let listed = NrpService {
            name: service.identity(),
            service_type: "INBOUND".into(),
            backend_pools: vec![],
            is_default: false,
        };
        let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![listed.clone()], locations: vec![] }),
            Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
            other => answer_ok(&[])(other),
        });
        assert!(writes(&issued).is_empty(), "{issued:?}");
        assert!(last.idle && tracker.registered().contains(service.identity().as_str()));

        // Each type alone in NRP, no Kubernetes object for it. `outbound` in any case is an egress
        // identity's registration. Differs from upstream on purpose (which counts `InboundOutbound`
        // as both and fails start-up on an unknown type, lest it sweep what such a registration
        // uses): any other type is somebody else's, neither inbound nor egress, and nothing is ever
        // written about it, even under a UID-shaped name whose load balancer and public IP ARM
        // lists exactly as this controller makes them (which the sweep deletes for a name NRP
        // does not list).
        let uid_like = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e55";
        let foreign_inventory = {
            let service = Service { uid: uid_like.into(), ..provisioned_service() };
            inventory_of(&service, Some(LbConfig::for_service(&service).load_balancer.clone()))
        };
        for (service_type, name, inbound, outbound) in [
            ("inbound", UID, true, false),
            ("outbound", "egress-n", false, true),
            ("OutBound", "egress-n", false, true),
            ("InboundOutbound", uid_like, false, false),
            ("Sideways", uid_like, false, false),
        ] {
            let mut tracker = Tracker::create(clb()).unwrap();
            let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
            let listed = NrpService {
                name: name.into(),
                service_type: service_type.into(),
                backend_pools: vec![],
                is_default: false,
            };
            let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
                Command::ReadNrp => {
                    Outcome::NrpSnapshot(NrpState { services: vec![listed.clone()], locations: vec![] })
                }
                Command::ReadArm if name == uid_like => Outcome::ArmInventory(foreign_inventory.clone()),
                Command::ReadArm => Outcome::ArmInventory(ArmInventory::default()),
                other => answer_ok(&[])(other),
            });
            assert_eq!(tracker.egress().is_registered(name), outbound, "{service_type}");
            if !inbound && !outbound {
                assert!(!tracker.registered().contains(name), "{service_type}");
                assert!(writes(&issued).is_empty(), "{service_type}: foreign, untouched: {issued:?}");
            } else if inbound {
                // Ours with no Service behind it: an orphan registration, unregistered.
                let unregisters = |c: &Command| {
                    matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == name && r.is_delete))
                };
                assert!(issued.iter().any(unregisters), "{service_type}: {issued:?}");
            }
            assert!(last.idle, "{service_type}");
        }
        // The control: the same load balancer and public IP with nothing in NRP are an orphan's.
        let mut tracker = Tracker::create(clb()).unwrap();
        let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, |c| match c {
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![], locations: vec![] }),
            Command::ReadArm => Outcome::ArmInventory(foreign_inventory.clone()),
            other => answer_ok(&[])(other),
        });
        let deleted = |kind: ResourceKind| {
            issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.kind == kind && r.name.starts_with(uid_like)))
        };
        assert!(deleted(ResourceKind::LoadBalancer) && deleted(ResourceKind::PublicIp), "{issued:?}");
    }

    // Ports upstream TestGuardOnServiceCreationComplete_UnknownServiceIsNoOp: an answer to a
    // command the tracker did not send (or already had answered) changes nothing.
    #[test]
    fn an_answer_to_an_unknown_command_changes_nothing() {
        let mut tracker = created_with(&[(80, 8080)]);
        let before = tracker.export_state();
        for outcome in [Outcome::Ok, failed(500), Outcome::PublicIpAddress("20.0.0.9".into())] {
            let step = tracker.complete(NOW, vec![(u64::MAX / 2, outcome)]);
            assert!(step.commands.is_empty(), "{step:?}");
        }
        assert_eq!(tracker.export_state(), before);
    }

    #[test]
    fn a_read_of_arm_that_keeps_failing_is_retried_then_start_up_goes_on_writing_as_before_with_a_warning() {
        let service = provisioned_service();
        let mut tracker = Tracker::create(clb()).unwrap();
        let mut step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).unwrap().id;
        step = tracker.complete(NOW, vec![(read, answer_ok(&[&service.identity()])(&Command::ReadNrp))]);
        let mut now = NOW;
        for attempt in 1..=timing::ARM_READ_ATTEMPTS {
            let arm = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("a read of ARM").id;
            step = tracker.complete(now, vec![(arm, failed(503))]);
            if attempt < timing::ARM_READ_ATTEMPTS {
                assert!(writes(&step.commands.iter().map(|c| c.command.clone()).collect::<Vec<_>>()).is_empty());
                now = step.wake_at_ms.expect("a retry is scheduled");
                step = tracker.tick(now);
            }
        }
        assert!(step.logs.iter().any(|l| l.level == LogLevel::Warn && l.message.contains("read-arm failed 3 time(s)")));
        let (issued, _, _) = drive(&mut tracker, now, step, answer_ok(&[&service.identity()]));
        assert!(issued.iter().any(|c| matches!(c, Command::PutPublicIp(_))), "{issued:?}");
        assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
    }

    #[test]
    fn a_state_imported_while_the_arm_inventory_is_read_keeps_the_read_in_flight_and_its_answer_applies() {
        let service = provisioned_service();
        let mut tracker = Tracker::create(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let step =
            tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[&service.identity()])(&Command::ReadNrp))]);
        assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), [&Command::ReadArm]);
        let (version, payload) = tracker.export_state();
        let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
        assert_eq!(imported, tracker);
        let config = LbConfig::for_service(&service);
        let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
        let (issued, _, _) =
            reads_answered(&mut imported, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
        assert!(writes(&issued).is_empty(), "{issued:?}");
        for (mut tampered, expected) in [
            (tracker.clone(), "0 reads of ARM flagged in flight, but 1 reads of ARM are in flight"),
            (imported.clone(), "the ARM inventory is settled, but a read of it is in flight"),
        ] {
            tampered.arm.read_in_flight = !tampered.arm.read_in_flight;
            let (version, payload) = tampered.export_state();
            let why = corrupt(Tracker::import_state(clb(), version, &payload));
            assert!(why.contains(expected), "{why}");
        }
    }

    /// The tracker's state as versions 1 and 2 wrote it (one batch in flight at most).
    fn as_versions_1_and_2(tracker: &Tracker) -> (Vec<u8>, Vec<u8>) {
        let state = tracker.state.clone().map_nrp(|n| {
            assert!(n.batches_in_flight.len() <= 1 && n.location_backoff.is_empty(), "{n:?}");
            NrpSyncV2 {
                loaded: n.loaded,
                read_in_flight: n.read_in_flight,
                read_retries: n.read_retries,
                next_read_ms: n.next_read_ms,
                batch_in_flight: n.batches_in_flight.keys().next().copied(),
                batch_retries: n.batch_retries,
                batch_not_before_ms: n.batch_not_before_ms,
                batch_limit: n.batch_limit,
                quarantined: n.quarantined,
                service_writes_in_flight: n.service_writes_in_flight,
                foreign: n.foreign,
            }
        });
        (postcard::to_allocvec(&state).unwrap(), postcard::to_allocvec(&(&state, &tracker.egress)).unwrap())
    }

    // ---- Write budgets ----

    fn budgeted(change: impl FnOnce(&mut crate::budget::WriteBudgets)) -> Config {
        let mut budgets = crate::budget::WriteBudgets::DEFAULT;
        change(&mut budgets);
        Config { write_budgets: Some(budgets), ..clb() }
    }

    /// A tracker under `locations` as its address-location budget, having seen `nodes` nodes
    /// (n1 at 10.224.0.1, …) and the test Service with one pod on n1, and its first step.
    fn with_address_budget(locations: crate::budget::Budget, nodes: u8) -> (Tracker, Step) {
        let mut tracker =
            Tracker::create_with_arm_settled(budgeted(|b| b.update_address_locations = locations)).unwrap();
        let mut observations: Vec<Observation> = (1..=nodes)
            .map(|i| {
                Observation::NodeUpserted(Node { name: format!("n{i}"), internal_ips: vec![format!("10.224.0.{i}")] })
            })
            .collect();
        observations.extend([
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.1", "n1")])),
            Observation::ListsComplete,
        ]);
        let step = tracker.observe(NOW, observations);
        (tracker, step)
    }

    #[test]
    fn endpoint_changes_made_while_the_address_location_budget_is_spent_wait_for_its_next_token_and_go_in_one_batch() {
        let (mut tracker, step) = with_address_budget(crate::budget::Budget { per_minute: 60, burst: 1 }, 4);
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
        assert_eq!(programmed(&issued).len(), 1, "the first batch takes the only token: {issued:?}");
        let mut endpoints = vec![("10.244.0.1", "n1")];
        for (at, endpoint) in [(100, ("10.244.0.2", "n2")), (400, ("10.244.0.3", "n3")), (900, ("10.244.0.4", "n4"))] {
            endpoints.push(endpoint);
            let step = tracker.observe(NOW + at, vec![Observation::SliceUpserted(slice_on(&endpoints))]);
            assert!(batch_locations(&step).is_empty(), "at +{at} ms the budget is spent: {step:?}");
            assert_eq!(step.wake_at_ms, Some(NOW + 1_000), "woken when the next token is due");
        }
        assert!(batch_locations(&tracker.tick(NOW + 999)).is_empty());
        let step = tracker.tick(NOW + 1_000);
        let batches = batch_locations(&step);
        assert_eq!(batches.len(), 1, "{step:?}");
        assert_eq!(batches[0].1, ["10.224.0.2", "10.224.0.3", "10.224.0.4"], "every change since the last batch");
    }

    #[test]
    fn load_balancer_and_public_ip_writes_keep_to_the_arm_budget_and_every_service_is_provisioned() {
        let two_then_one_a_second = crate::budget::Budget { per_minute: 60, burst: 2 };
        let mut tracker = Tracker::create_with_arm_settled(budgeted(|b| b.arm_writes = two_then_one_a_second)).unwrap();
        let services: Vec<Service> = (1..=3)
            .map(|i| Service {
                uid: format!("0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e0{i}"),
                name: format!("web-{i}"),
                ..lb_service("Local")
            })
            .collect();
        let mut observations: Vec<Observation> = services.iter().cloned().map(Observation::ServiceUpserted).collect();
        observations.push(Observation::ListsComplete);
        let registered: Vec<String> = services.iter().map(|s| s.identity()).collect();
        let registered: Vec<&str> = registered.iter().map(String::as_str).collect();
        let answer = answer_ok(&registered);
        let (mut now, mut step) = (NOW, tracker.observe(NOW, observations));
        let mut arm_writes_at = Vec::new();
        for _ in 0..20 {
            let (issued, _, last) = drive(&mut tracker, now, step, &answer);
            let arm = issued.iter().filter(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_)));
            arm_writes_at.extend(arm.map(|_| now - NOW));
            if services.iter().all(|s| tracker.phase(&s.identity()) == Some(Phase::Created)) {
                break;
            }
            now = last.wake_at_ms.expect("woken for the next token");
            step = tracker.tick(now);
        }
        assert_eq!(arm_writes_at, [0, 0, 1_000, 2_000, 3_000, 4_000], "a burst of 2, then one a second");
        assert!(services.iter().all(|s| tracker.phase(&s.identity()) == Some(Phase::Created)));
    }

    #[test]
    fn a_throttled_address_location_batch_halves_its_budget_instead_of_backing_off_and_accepted_ones_restore_it() {
        let (mut tracker, step) = with_address_budget(crate::budget::Budget { per_minute: 600, burst: 1 }, 1);
        let held = drive_holding_batches(&mut tracker, NOW, step);
        let step = tracker.complete(NOW, vec![(held[0].0, failed(429))]);
        let warned = step.logs.iter().find(|l| l.level == LogLevel::Warn).expect("a warning");
        assert!(warned.message.contains("update-address-locations was throttled (HTTP 429)"), "{}", warned.message);
        assert!(warned.message.contains("shrinks to 300 a minute"), "{}", warned.message);
        assert_eq!(step.wake_at_ms, Some(NOW + 200), "the next token at half the rate, no backoff of a second");
        assert!(batch_locations(&tracker.tick(NOW + 199)).is_empty());
        let step = tracker.tick(NOW + 200);
        let again = batch_locations(&step);
        assert_eq!(again.len(), 1, "{step:?}");
        // The shrunk budget is state: a swap keeps the pace Azure asked for.
        let (version, payload) = tracker.export_state();
        let imported = Tracker::import_state(tracker.config.clone(), version, &payload).unwrap();
        assert_eq!(imported.budget, tracker.budget);
        tracker.complete(NOW + 200, vec![(again[0].0, Outcome::Ok)]);
        assert_eq!(tracker.budget.address_locations.per_minute(), 375, "an eighth of the rate back");
    }

    #[test]
    fn a_version_4_state_imports_with_full_write_budgets() {
        let (mut tracker, _) = tracker_with_a_batch_in_flight();
        let imported = Tracker::import_state(clb(), 4, &tracker.export_state_v4()).unwrap();
        assert_ne!(tracker.budget, Buckets::full(&clb().write_budgets()), "the batch took a token");
        tracker.budget = Buckets::full(&clb().write_budgets());
        assert_eq!(imported, tracker);
    }

    // Ports of upstream tests that pin one lifecycle step or transition, beside the helpers
    // above; their own files keep this one readable.
    mod upstream_lifecycle;
    mod upstream_startup;
    mod upstream_outbound;
    mod upstream_pod_finalizers;
}
