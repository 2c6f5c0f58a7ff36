//! The scenario format (docs/design.md §9; documented for users in `docs/scenarios.md`): one YAML file
//! is one story — a cloud configuration, then steps that change the cluster, inject Azure
//! faults, let virtual time pass, restart the controller and check what came of it.
//!
//! Parsing is strict (unknown keys are errors) and every error names the file and the line, as
//! the parser locates it; Kubernetes objects are read with the k8s-openapi types, exactly as
//! `kubectl apply` would take them, and must carry `metadata.name` (and, but for Nodes,
//! `metadata.uid`). Pods are simulated for egress: those with the egress label are watched.
//!
//! It is longer than 800 lines because the format is one contract with its users
//! (`docs/scenarios.md`): every key, its type and its check are here side by side, so that a
//! key added or changed shows in one diff.

use crate::cluster::{Kind, Object};
use crate::perturbation::Perturbation;
use clb_azure::Operation;
use clb_emulator::{ArmLimits, BucketLimits, Fault, FaultMode};
use clb_executor::inputs::{self, CloudConfig, InputError};
use clb_sandbox::bindings::clb::reconciler::types::Config;
use clb_sandbox::bindings::exports::clb::reconciler::backend_pools::SlbConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::de::{self, Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// How long `settle` waits for the guest to go idle when the step does not say.
pub const DEFAULT_SETTLE_MS: u64 = 15 * 60_000;
/// The backend-pool updater's tick interval when the scenario does not say (upstream's
/// `loadBalancerBackendPoolUpdateIntervalInSeconds` default).
pub const DEFAULT_POOL_UPDATE_INTERVAL_MS: u64 = 30_000;

/// Why a scenario file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// A parsed scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub path: PathBuf,
    pub name: String,
    pub description: String,
    pub config: Config,
    /// The entries of `multipleStandardLoadBalancerConfigurations`, as Service placement reads
    /// them.
    pub slb_configurations: Vec<SlbConfiguration>,
    /// The cluster's name as multi-SLB placement reads it: `config.loadBalancerName`, else
    /// `kubernetes`.
    pub cluster_name: String,
    /// What Azure holds before the first step.
    pub azure: AzureSetup,
    pub steps: Vec<Step>,
    /// A fault to inject into the run (`perturbation: crash-after:17`), as `clb-host explore`
    /// writes a divergence's reproducer: `simulate` runs the scenario with it, `explore` runs it
    /// alone and compares the world with the unperturbed run's.
    pub perturbation: Option<Perturbation>,
}

/// `azure:` — the emulated Azure before the first step, and the backend-pool updater's knobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AzureSetup {
    /// Load balancer name → the names of its backend pools (at least one). Each gets a public
    /// IP `<lb>-frontend` for its frontend.
    #[serde(default)]
    pub load_balancers: BTreeMap<String, Vec<String>>,
    /// Load balancer (one of `loadBalancers`) → the names of its load-balancing rules (TCP, on
    /// its first pool): what multi-SLB placement counts, and where it finds a Service's own
    /// (`a<UID without dashes>-…`) when the controller starts.
    #[serde(default)]
    pub load_balancer_rules: BTreeMap<String, Vec<String>>,
    /// Load balancer (one of `loadBalancers`) → its frontends besides `frontend`: one with a
    /// `privateIp` is internal, on that address; one without is on a public IP
    /// `<lb>-<frontend>`. Multi-SLB placement finds a Service's pinned private IP, and its
    /// primary frontend (named `a<UID without dashes>…`), among them.
    #[serde(default)]
    pub frontends: BTreeMap<String, Vec<FrontendSetup>>,
    /// Public IP (one the load balancers' frontends are on) → its tags, e.g.
    /// `k8s-azure-cluster-name`.
    #[serde(default)]
    pub public_ip_tags: BTreeMap<String, BTreeMap<String, String>>,
    /// The backend-pool updater's tick interval (default 30s).
    #[serde(default)]
    pub backend_pool_update_interval: Option<VirtualDuration>,
    /// Outbound services registered in NRP before the first step (as the NAT gateway lifecycle,
    /// which this controller does not build yet, would register them for egress identities).
    #[serde(default)]
    pub outbound_services: Vec<String>,
    /// ARM's subscription throttling in the emulator (default: ARM's published sizes).
    #[serde(default)]
    pub arm_limits: ArmLimitsSetting,
}

/// One of `frontends:`'s entries.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FrontendSetup {
    pub name: String,
    #[serde(default)]
    pub private_ip: Option<String>,
}

/// `armLimits:` — `unlimited`, or `{writes: {burst, perSecond}, reads: {burst, perSecond},
/// otherClientWritesPerSecond}` with every field optional and ARM's published sizes (writes
/// 200 refilled 10 a second, reads 250 refilled 25 a second, no other client) for the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArmLimitsSetting(pub Option<ArmLimits>);

impl Default for ArmLimitsSetting {
    fn default() -> Self {
        ArmLimitsSetting(Some(ArmLimits::default()))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawArmLimits {
    #[serde(default)]
    writes: Option<RawBucket>,
    #[serde(default)]
    reads: Option<RawBucket>,
    #[serde(default)]
    other_client_writes_per_second: Option<u32>,
    #[serde(default)]
    report_remaining: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawBucket {
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    per_second: Option<u32>,
}

impl RawBucket {
    fn or(bucket: Option<RawBucket>, name: &str, default: BucketLimits) -> Result<BucketLimits, String> {
        let Some(raw) = bucket else { return Ok(default) };
        let limits = BucketLimits {
            burst: raw.burst.unwrap_or(default.burst),
            per_second: raw.per_second.unwrap_or(default.per_second),
        };
        // An empty bucket that never refills would refuse every call forever.
        if limits.burst == 0 || limits.per_second == 0 {
            return Err(format!("armLimits.{name}: burst and perSecond must be at least 1"));
        }
        Ok(limits)
    }
}

impl<'de> Deserialize<'de> for ArmLimitsSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = ArmLimitsSetting;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "`unlimited` or {writes: {burst, perSecond}, reads: {burst, perSecond}, otherClientWritesPerSecond, \
                     reportRemaining}",
                )
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ArmLimitsSetting, E> {
                match text {
                    "unlimited" => Ok(ArmLimitsSetting(None)),
                    other => Err(E::custom(format!("armLimits {other:?}: expected `unlimited` or a map"))),
                }
            }
            fn visit_map<M: de::MapAccess<'de>>(self, map: M) -> Result<ArmLimitsSetting, M::Error> {
                let raw = RawArmLimits::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let limits = ArmLimits {
                    writes: RawBucket::or(raw.writes, "writes", ArmLimits::ARM_WRITES).map_err(M::Error::custom)?,
                    reads: RawBucket::or(raw.reads, "reads", ArmLimits::ARM_READS).map_err(M::Error::custom)?,
                    other_client_writes_per_second: raw.other_client_writes_per_second.unwrap_or(0),
                    report_remaining: raw.report_remaining.unwrap_or(true),
                };
                Ok(ArmLimitsSetting(Some(limits)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl AzureSetup {
    pub fn pool_update_interval_ms(&self) -> u64 {
        self.backend_pool_update_interval.map_or(DEFAULT_POOL_UPDATE_INTERVAL_MS, |d| d.0)
    }
}

/// One step of a scenario.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Creates or updates objects, as `kubectl apply`.
    Apply(Objects),
    Delete(DeleteStep),
    Fault(FaultStep),
    ClearFaults,
    /// Another client of the subscription spends ARM tokens at the current instant.
    ArmSpend(ArmSpendStep),
    /// Lets virtual time pass, waking the guest whenever it asked to be.
    Advance(VirtualDuration),
    /// Runs until the guest reports `idle`, within the bound (default [`DEFAULT_SETTLE_MS`]).
    Settle(Option<VirtualDuration>),
    /// The controller restarts: a new tracker with no state; Azure and the cluster keep theirs.
    Restart,
    /// A restart whose first lists miss the objects named (a stale cache), until an event brings
    /// them.
    RestartWithStaleLists(StaleListsStep),
    /// The logic is hot-swapped to another component, keeping its state.
    Swap(SwapStep),
    /// A candidate runs in shadow beside the serving logic: compared, never carried out, and
    /// promoted after `promoteAfter` clean inputs when given.
    Shadow(ShadowStep),
    Expect(Box<Expectation>),
}

impl Step {
    /// One line for reports.
    pub fn summary(&self) -> String {
        match self {
            Step::Apply(objects) => {
                let names: Vec<String> = objects.0.iter().map(object_summary).collect();
                format!("apply {}", names.join(", "))
            }
            Step::Delete(d) => {
                let name = if d.namespace.is_empty() { d.name.clone() } else { format!("{}/{}", d.namespace, d.name) };
                format!("delete {:?} {name}{}", d.kind, if d.force { " (force)" } else { "" })
            }
            Step::Fault(f) => {
                let times = f.fault.count.map(|n| format!("{n}×")).unwrap_or_else(|| "always".into());
                let on = f.fault.resource.as_ref().map(|r| format!(" on {r}")).unwrap_or_default();
                format!("fault {} {times}{on}: {}", f.fault.operation, mode_summary(&f.fault.mode))
            }
            Step::ClearFaults => "clear-faults".into(),
            Step::ArmSpend(spend) => {
                format!("arm-spend: another client spends {} write and {} read tokens", spend.writes, spend.reads)
            }
            Step::Advance(d) => format!("advance {d}"),
            Step::Settle(within) => format!("settle (within {})", within.unwrap_or(VirtualDuration(DEFAULT_SETTLE_MS))),
            Step::Restart => "restart".into(),
            Step::RestartWithStaleLists(stale) => {
                let missed: Vec<String> = stale.missing.iter().map(|o| format!("{:?} {}", o.kind, o.key())).collect();
                format!("restart, its first lists missing {}", missed.join(", "))
            }
            Step::Swap(swap) => format!("swap to {} (expect {})", swap.component, swap.expect),
            Step::Shadow(shadow) => match shadow.promote_after {
                Some(n) => format!("shadow {} (promote after {n} clean inputs)", shadow.component),
                None => format!("shadow {}", shadow.component),
            },
            Step::Expect(_) => "expect".into(),
        }
    }
}

fn object_summary(object: &Object) -> String {
    let (kind, meta) = match object {
        Object::Service(s) => ("Service", &s.metadata),
        Object::EndpointSlice(s) => ("EndpointSlice", &s.metadata),
        Object::Node(n) => ("Node", &n.metadata),
        Object::Pod(p) => ("Pod", &p.metadata),
        Object::Namespace(n) => ("Namespace", &n.metadata),
    };
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None if kind == "Node" || kind == "Namespace" => format!("{kind} {name}"),
        None => format!("{kind} default/{name}"),
    }
}

fn mode_summary(mode: &FaultMode) -> String {
    match mode {
        FaultMode::Status { status, code, retry_after_secs, .. } => {
            let code = if code.is_empty() { String::new() } else { format!(" {code}") };
            let retry = retry_after_secs.map(|s| format!(" Retry-After {s}s")).unwrap_or_default();
            format!("HTTP {status}{code}{retry}")
        }
        FaultMode::Async { outcome, .. } => format!("202, then {outcome:?}"),
        FaultMode::ErrorBody { code, .. } => format!("200 with error {code}"),
        FaultMode::Hang => "hang".into(),
        FaultMode::Drop => "dropped connection".into(),
    }
}

/// The objects of an `apply`: one object, or a list of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects(pub Vec<Object>);

impl<'de> Deserialize<'de> for Objects {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Objects;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes object or a list of them")
            }
            fn visit_map<M: de::MapAccess<'de>>(self, map: M) -> Result<Objects, M::Error> {
                let object = KubeObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Objects(vec![object.0]))
            }
            fn visit_seq<S: de::SeqAccess<'de>>(self, mut seq: S) -> Result<Objects, S::Error> {
                let mut objects = Vec::new();
                while let Some(object) = seq.next_element::<KubeObject>()? {
                    objects.push(object.0);
                }
                if objects.is_empty() {
                    return Err(S::Error::custom("apply: the list of objects is empty"));
                }
                Ok(Objects(objects))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// One object, read by its `kind` with the k8s-openapi type.
struct KubeObject(Object);

impl<'de> Deserialize<'de> for KubeObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The object as JSON, as the API server would take it, then read by its kind.
        let value = serde_json::Value::deserialize(deserializer)?;
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
        let name =
            value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or_default().to_owned();
        let typed = |e: serde_json::Error| D::Error::custom(format!("{kind} {name}: {e}"));
        let object = match kind.as_str() {
            "Service" => Object::Service(Box::new(serde_json::from_value::<Service>(value).map_err(typed)?)),
            "EndpointSlice" => {
                Object::EndpointSlice(Box::new(serde_json::from_value::<EndpointSlice>(value).map_err(typed)?))
            }
            "Node" => Object::Node(Box::new(serde_json::from_value::<Node>(value).map_err(typed)?)),
            "Pod" => Object::Pod(Box::new(serde_json::from_value::<Pod>(value).map_err(typed)?)),
            "Namespace" => Object::Namespace(Box::new(serde_json::from_value::<Namespace>(value).map_err(typed)?)),
            "" => {
                return Err(D::Error::custom(
                    "an object without `kind` (expected Service, EndpointSlice, Node, Pod or Namespace)",
                ));
            }
            other => {
                return Err(D::Error::custom(format!(
                    "kind {other:?} is not simulated (expected Service, EndpointSlice, Node, Pod or Namespace)"
                )));
            }
        };
        let meta = match &object {
            Object::Service(s) => &s.metadata,
            Object::EndpointSlice(s) => &s.metadata,
            Object::Node(n) => &n.metadata,
            Object::Pod(p) => &p.metadata,
            Object::Namespace(n) => &n.metadata,
        };
        if meta.name.as_deref().is_none_or(str::is_empty) {
            return Err(D::Error::custom(format!("{kind}: metadata.name is missing")));
        }
        if kind != "Node" && kind != "Namespace" && meta.uid.as_deref().is_none_or(str::is_empty) {
            let name = meta.name.as_deref().unwrap_or_default();
            return Err(D::Error::custom(format!("{kind} {name}: metadata.uid is missing (the guest keys on it)")));
        }
        Ok(KubeObject(object))
    }
}

/// `delete: {kind: Service, namespace: shop, name: web}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteStep {
    pub kind: Kind,
    /// Ignored for Nodes; default `default` for the others.
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// Strip the finalizers first, so the object goes at once (an operator's forced delete).
    #[serde(default)]
    pub force: bool,
}

impl DeleteStep {
    pub fn namespace(&self) -> &str {
        namespace_of(self.kind, &self.namespace)
    }
}

/// The namespace a step's object is in: none for Nodes and Namespaces, `default` when unsaid.
fn namespace_of(kind: Kind, namespace: &str) -> &str {
    match (kind, namespace.is_empty()) {
        (Kind::Node | Kind::Namespace, _) => "",
        (_, true) => "default",
        (_, false) => namespace,
    }
}

/// `restart-with-stale-lists: {missing: [{kind: EndpointSlice, namespace: shop, name: web-abc12}]}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleListsStep {
    /// Objects the restarted controller's first lists leave out, as an informer cache behind the
    /// API server does; the watch brings them with their next change.
    pub missing: Vec<ObjectOfKind>,
}

/// An object by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectOfKind {
    pub kind: Kind,
    /// Ignored for Nodes; default `default` for the others.
    #[serde(default)]
    pub namespace: String,
    pub name: String,
}

impl ObjectOfKind {
    /// `namespace/name`, or the name alone for a Node.
    pub fn key(&self) -> String {
        match namespace_of(self.kind, &self.namespace) {
            "" => self.name.clone(),
            namespace => format!("{namespace}/{}", self.name),
        }
    }
}

/// `swap: {component, expect}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapStep {
    pub component: ComponentSource,
    pub expect: SwapExpect,
}

/// `shadow: {component, promoteAfter?, allow?}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShadowStep {
    pub component: ComponentSource,
    /// Swap it in once it compared this many inputs in a row without a divergence.
    #[serde(default)]
    pub promote_after: Option<u64>,
    /// Divergence kinds that do not hold the promotion back (`emit-event`, `wake-at`, …).
    #[serde(default)]
    pub allow: BTreeSet<String>,
}

/// Which component a `swap` step loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComponentSource {
    /// `builtin`: the logic this host was built with.
    Builtin,
    /// A name without `/` and not ending in `.wasm` (nor `.wasm.gz`, `.wasm.zst`): a component
    /// the runner registered (the test suite registers its test guests).
    Named(String),
    /// A file, gzip or zstd compressed or not; relative paths are resolved against the scenario
    /// file's folder.
    File(PathBuf),
}

impl fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ComponentSource::Builtin => f.write_str("builtin"),
            ComponentSource::Named(name) => f.write_str(name),
            ComponentSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

impl<'de> Deserialize<'de> for ComponentSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(match text.as_str() {
            "" => return Err(D::Error::custom("swap: `component` is empty")),
            "builtin" => ComponentSource::Builtin,
            path if path.contains('/') || [".wasm", ".wasm.gz", ".wasm.zst"].iter().any(|end| path.ends_with(end)) => {
                ComponentSource::File(PathBuf::from(path))
            }
            name => ComponentSource::Named(name.to_owned()),
        })
    }
}

/// What a `swap` step expects of the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwapExpect {
    Accepted,
    Refused,
}

impl fmt::Display for SwapExpect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if *self == SwapExpect::Accepted { "accepted" } else { "refused" })
    }
}

/// `arm-spend: {writes: N, reads: M}`: tokens another client of the subscription spends from
/// ARM's buckets, down to empty (not below).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmSpendStep {
    #[serde(default)]
    pub writes: u32,
    #[serde(default)]
    pub reads: u32,
}

/// `fault: {operation, mode, count | always: true, resource?}`.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultStep {
    pub fault: Fault,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    operation: Operation,
    mode: FaultMode,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    always: bool,
    #[serde(default)]
    resource: Option<String>,
}

impl<'de> Deserialize<'de> for FaultStep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawFault::deserialize(deserializer)?;
        let count = match (raw.count, raw.always) {
            (Some(0), _) => return Err(D::Error::custom("fault: count must be at least 1")),
            (Some(n), false) => Some(n),
            (None, true) => None,
            (Some(_), true) => return Err(D::Error::custom("fault: give either `count` or `always: true`, not both")),
            (None, false) => return Err(D::Error::custom("fault: give `count: N` or `always: true`")),
        };
        Ok(FaultStep { fault: Fault { operation: raw.operation, resource: raw.resource, count, mode: raw.mode } })
    }
}

/// A span of virtual time, written `250ms`, `30s`, `5m` or `1h`; at most [`MAX_DURATION_MS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct VirtualDuration(pub u64);

/// The longest span a scenario may give: a week. The simulation jumps from one wake-up of the
/// guest to the next, but an idle tracker still wakes every resync period (5 minutes) to read
/// NRP: a week is ~2,000 wake-ups, 10^12 hours would be ~10^13.
pub const MAX_DURATION_MS: u64 = 7 * 24 * 3_600_000;

impl VirtualDuration {
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit())?;
        let (number, unit) = text.split_at(split);
        let number: u64 = number.parse().ok()?;
        let scale = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return None,
        };
        number.checked_mul(scale).filter(|ms| *ms <= MAX_DURATION_MS).map(VirtualDuration)
    }
}

impl fmt::Display for VirtualDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_ms(self.0, f)
    }
}

/// Milliseconds as the shortest exact text: `1h`, `5m`, `30s`, `1.5s`, `250ms`.
pub fn format_ms(ms: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match ms {
        0 => f.write_str("0s"),
        ms if ms % 3_600_000 == 0 => write!(f, "{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => write!(f, "{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => write!(f, "{}s", ms / 1_000),
        ms if ms >= 1_000 => write!(f, "{}.{:03}s", ms / 1_000, ms % 1_000),
        ms => write!(f, "{ms}ms"),
    }
}

impl<'de> Deserialize<'de> for VirtualDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        VirtualDuration::parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "{text:?} is not a duration (write a whole number and ms, s, m or h: `30s`; at most 168h)"
            ))
        })
    }
}

/// What must hold at an `expect` step. Every part is optional; what is given is exact.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expectation {
    #[serde(default)]
    pub nrp: Option<NrpExpectation>,
    /// `namespace/name` → what its `status.loadBalancer.ingress` holds.
    #[serde(default)]
    pub status: BTreeMap<ObjectName, StatusExpectation>,
    /// Pod `namespace/name` → its `metadata.finalizers`, exactly, or `deleted` (gone from the
    /// API server).
    #[serde(default)]
    pub pod_finalizers: BTreeMap<ObjectName, PodFinalizersExpectation>,
    /// Events that must have been emitted (others may have been too).
    #[serde(default)]
    pub events: Vec<EventExpectation>,
    #[serde(default)]
    pub resources: Option<ResourcesExpectation>,
    /// `<lb>:<pool>` → the IPs the backend pool holds, exactly (in any spelling), or `deleted`
    /// (no such pool).
    #[serde(default)]
    pub backend_pools: BTreeMap<PoolName, PoolExpectation>,
    /// Azure operation (`put-public-ip`, …) → how many calls of it the emulator answered since
    /// the run began, exactly (faulted calls count).
    #[serde(default)]
    pub azure_calls: BTreeMap<clb_azure::Operation, u64>,
    /// The logic serving and what its supervisor did: rollbacks, quarantined inputs.
    #[serde(default)]
    pub logic: Option<LogicExpectation>,
    /// What the candidate in shadow (or the last one) found.
    #[serde(default)]
    pub shadow: Option<ShadowExpectation>,
    /// A sample of the logic's figures as `/metrics` prints it, name and labels
    /// (`difftracker_engine_tracked_services_total{state="k8s_services"}`) → its value, exactly.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Check the invariants (see `simulate`).
    #[serde(default)]
    pub invariants: bool,
}

/// `logic: {serving, rollbacks, quarantinedInputs}`: each given one must hold exactly.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogicExpectation {
    /// The component serving: `builtin`, a registered name, or a file (as a `swap` names it).
    #[serde(default)]
    pub serving: Option<ComponentSource>,
    /// Rollbacks since the run began.
    #[serde(default)]
    pub rollbacks: Option<u64>,
    /// Inputs quarantined since the run began.
    #[serde(default)]
    pub quarantined_inputs: Option<u64>,
}

/// `shadow: {divergences, promoted}`: each given one must hold exactly.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShadowExpectation {
    /// Divergence kind → how many, exactly; `{}` for none.
    #[serde(default)]
    pub divergences: Option<BTreeMap<String, u64>>,
    /// Whether it was promoted (swapped in).
    #[serde(default)]
    pub promoted: Option<bool>,
}

/// What a backend pool must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolExpectation {
    /// It exists and holds exactly these IPs.
    Holds(BTreeSet<CanonicalIp>),
    /// There is no such pool (never created, or deleted).
    Deleted,
}

impl fmt::Display for PoolExpectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolExpectation::Holds(ips) => write!(f, "{:?}", ips.iter().map(|ip| ip.0.as_str()).collect::<Vec<_>>()),
            PoolExpectation::Deleted => f.write_str("deleted"),
        }
    }
}

impl<'de> Deserialize<'de> for PoolExpectation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(list_or_deleted(deserializer, "backend pool", "IPs")?
            .map_or(PoolExpectation::Deleted, PoolExpectation::Holds))
    }
}

/// A list, or the word `deleted` (`None`); anything else is an error naming `what`.
fn list_or_deleted<'de, D: Deserializer<'de>, T: Deserialize<'de> + Ord>(
    deserializer: D,
    what: &str,
    items: &str,
) -> Result<Option<BTreeSet<T>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw<T: Ord> {
        List(BTreeSet<T>),
        Word(String),
    }
    match Raw::deserialize(deserializer)? {
        Raw::List(list) => Ok(Some(list)),
        Raw::Word(word) if word == "deleted" => Ok(None),
        Raw::Word(other) => Err(D::Error::custom(format!("{what} {other:?}: expected a list of {items} or deleted"))),
    }
}

/// What a Pod's finalizers must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodFinalizersExpectation {
    /// Exactly these, in any order.
    Exactly(BTreeSet<String>),
    /// The Pod is gone from the API server.
    Deleted,
}

impl fmt::Display for PodFinalizersExpectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodFinalizersExpectation::Exactly(finalizers) => write!(f, "{finalizers:?}"),
            PodFinalizersExpectation::Deleted => f.write_str("deleted"),
        }
    }
}

impl<'de> Deserialize<'de> for PodFinalizersExpectation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let expected = list_or_deleted(deserializer, "pod finalizers", "finalizers")?;
        Ok(expected.map_or(PodFinalizersExpectation::Deleted, PodFinalizersExpectation::Exactly))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NrpExpectation {
    /// Registered inbound services, exactly (the RP's default and outbound services excepted).
    #[serde(default)]
    pub services: Option<BTreeSet<String>>,
    /// Node IP → pod IP → service names, exactly.
    #[serde(default)]
    pub locations: Option<BTreeMap<CanonicalIp, BTreeMap<CanonicalIp, BTreeSet<String>>>>,
    /// Registered Outbound services (egress identities), exactly; the RP's default excepted.
    #[serde(default)]
    pub outbound_services: Option<BTreeSet<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesExpectation {
    #[serde(default)]
    pub public_ips: Option<BTreeSet<String>>,
    #[serde(default)]
    pub load_balancers: Option<BTreeSet<String>>,
    #[serde(default)]
    pub nat_gateways: Option<BTreeSet<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventExpectation {
    pub reason: String,
    pub object: ObjectName,
    #[serde(default, rename = "type")]
    pub event_type: Option<EventTypeName>,
    /// Exactly this many such Events; absent: at least one.
    #[serde(default)]
    pub count: Option<usize>,
}

/// `<load balancer>:<pool>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PoolName {
    pub load_balancer: String,
    pub pool: String,
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.load_balancer, self.pool)
    }
}

impl<'de> Deserialize<'de> for PoolName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.split_once(':') {
            Some((lb, pool)) if !lb.is_empty() && !pool.is_empty() && !pool.contains(':') => {
                Ok(PoolName { load_balancer: lb.to_owned(), pool: pool.to_owned() })
            }
            _ => Err(D::Error::custom(format!("{text:?} is not `<load balancer>:<pool>`"))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum EventTypeName {
    Normal,
    Warning,
}

/// An IP address in canonical text, so that `FD00::0A` and `fd00::a` are one key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CanonicalIp(pub String);

impl<'de> Deserialize<'de> for CanonicalIp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let ip: IpAddr = text.trim().parse().map_err(|_| D::Error::custom(format!("{text:?} is not an IP address")))?;
        Ok(CanonicalIp(ip.to_string()))
    }
}

/// `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectName {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl<'de> Deserialize<'de> for ObjectName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match clb_executor::records::namespaced(&text) {
            Some((namespace, name)) => Ok(ObjectName { namespace: namespace.to_owned(), name: name.to_owned() }),
            None => Err(D::Error::custom(format!("{text:?} is not `namespace/name`"))),
        }
    }
}

/// What a Service's status must show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusExpectation {
    /// At least one ingress IP.
    Present,
    /// No ingress IP (or no such Service).
    Absent,
    /// The Service is gone from the API server (its finalizers were released).
    Deleted,
    /// Exactly this one ingress IP.
    Ip(String),
}

impl fmt::Display for StatusExpectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusExpectation::Present => f.write_str("present"),
            StatusExpectation::Absent => f.write_str("absent"),
            StatusExpectation::Deleted => f.write_str("deleted"),
            StatusExpectation::Ip(ip) => f.write_str(ip),
        }
    }
}

impl<'de> Deserialize<'de> for StatusExpectation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "present" => Ok(StatusExpectation::Present),
            "absent" => Ok(StatusExpectation::Absent),
            "deleted" => Ok(StatusExpectation::Deleted),
            other => other.parse::<IpAddr>().map(|ip| StatusExpectation::Ip(ip.to_string())).map_err(|_| {
                D::Error::custom(format!("status {other:?}: expected present, absent, deleted or an IP address"))
            }),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    config: CloudConfig,
    #[serde(default)]
    azure: AzureSetup,
    /// `- apply: …` (a map of one key), or the step's name alone when it takes nothing.
    steps: Vec<Step>,
    #[serde(default)]
    perturbation: Option<String>,
}

/// Reads and checks a scenario file, and that each file a `swap` step names is one (a scenario
/// naming a file that is not there is invalid, not a failed expectation).
pub fn read(path: &Path) -> Result<Scenario, ScenarioError> {
    let scenario = parse(path, &inputs::read(path)?)?;
    for (n, step) in scenario.steps.iter().enumerate() {
        if let Step::Swap(SwapStep { component: ComponentSource::File(file), .. })
        | Step::Shadow(ShadowStep { component: ComponentSource::File(file), .. }) = step
        {
            let problem = match std::fs::metadata(file) {
                Ok(meta) if meta.is_file() => continue,
                Ok(_) => "not a regular file".to_owned(),
                Err(error) => error.to_string(),
            };
            let what = if matches!(step, Step::Shadow(_)) { "shadow" } else { "swap to" };
            let reason = format!("step {}: {what} {}: {problem}", n + 1, file.display());
            return Err(ScenarioError::Invalid { path: path.to_owned(), reason });
        }
    }
    Ok(scenario)
}

pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let invalid = |reason: &str| ScenarioError::Invalid { path: path.to_owned(), reason: reason.to_owned() };
    let raw: RawScenario = inputs::from_yaml(path, text)?.ok_or_else(|| invalid("the file holds no scenario"))?;
    if raw.name.trim().is_empty() {
        return Err(invalid("`name` is empty"));
    }
    if raw.steps.is_empty() {
        return Err(invalid("`steps` is empty"));
    }
    if let Some((lb, _)) = raw.azure.load_balancers.iter().find(|(_, pools)| pools.is_empty()) {
        return Err(invalid(&format!("azure.loadBalancers.{lb}: give at least one backend pool")));
    }
    if let Some(lb) = raw.azure.load_balancer_rules.keys().find(|lb| !raw.azure.load_balancers.contains_key(*lb)) {
        return Err(invalid(&format!("azure.loadBalancerRules.{lb}: not one of azure.loadBalancers")));
    }
    if let Some(lb) = raw.azure.frontends.keys().find(|lb| !raw.azure.load_balancers.contains_key(*lb)) {
        return Err(invalid(&format!("azure.frontends.{lb}: not one of azure.loadBalancers")));
    }
    for (lb, frontends) in &raw.azure.frontends {
        let mut names = BTreeSet::from([clb_azure::FRONTEND_NAME.to_owned()]);
        if let Some(frontend) = frontends.iter().find(|f| f.name.trim().is_empty() || !names.insert(f.name.clone())) {
            return Err(invalid(&format!("azure.frontends.{lb}: {:?} is empty or named twice", frontend.name)));
        }
    }
    let frontend_ips: BTreeSet<String> =
        raw.azure
            .load_balancers
            .keys()
            .map(|lb| format!("{lb}-{}", clb_azure::FRONTEND_NAME))
            .chain(raw.azure.frontends.iter().flat_map(|(lb, fs)| {
                fs.iter().filter(|f| f.private_ip.is_none()).map(move |f| format!("{lb}-{}", f.name))
            }))
            .collect();
    if let Some(ip) = raw.azure.public_ip_tags.keys().find(|ip| !frontend_ips.contains(*ip)) {
        return Err(invalid(&format!("azure.publicIpTags.{ip}: not the public IP of a load balancer's frontend")));
    }
    raw.config.check(path)?;
    if let Some(name) = raw.azure.outbound_services.iter().find(|n| n.trim().is_empty()) {
        return Err(invalid(&format!("azure.outboundServices: {name:?} is not a service name")));
    }
    if raw.azure.backend_pool_update_interval.is_some_and(|d| d.0 == 0) {
        return Err(invalid("azure.backendPoolUpdateInterval must be longer than 0s"));
    }
    let mut steps = raw.steps;
    let folder = path.parent().unwrap_or(Path::new(""));
    for step in &mut steps {
        let file = match step {
            Step::Swap(SwapStep { component: ComponentSource::File(file), .. })
            | Step::Shadow(ShadowStep { component: ComponentSource::File(file), .. }) => file,
            Step::Expect(expectation) => match &mut expectation.logic {
                Some(LogicExpectation { serving: Some(ComponentSource::File(file)), .. }) => file,
                _ => continue,
            },
            _ => continue,
        };
        *file = folder.join(&*file);
    }
    let perturbation = match raw.perturbation.as_deref().map(str::parse::<Perturbation>).transpose() {
        Ok(perturbation) => perturbation,
        Err(error) => return Err(invalid(&format!("perturbation: {error}"))),
    };
    Ok(Scenario {
        perturbation,
        path: path.to_owned(),
        name: raw.name,
        description: raw.description,
        slb_configurations: raw.config.slb_configurations(),
        cluster_name: raw.config.cluster_name(clb_executor::inputs::DEFAULT_CLUSTER_NAME),
        config: raw.config.into(),
        azure: raw.azure,
        steps,
    })
}

#[cfg(test)]
mod tests;
