//! Egress (outbound) identities in the DiffTracker's data model (docs/upstream.md §a.1–§a.3,
//! docs/upstream.md §b.1 `UpdateK8sPod`, §d.2; docs/design.md §4).
//!
//! A pod labelled `kubernetes.azure.com/service-egress-gateway: <id>` wants its traffic to leave
//! through the outbound service (NAT gateway) `<id>`, lower-cased. Each of its IPs contributes
//! the identity at the pod's host IP of the same family, in the DiffTracker's Kubernetes view,
//! beside whatever inbound identities the address has from EndpointSlices. A pod carries at most
//! one egress identity; taking it away (label removed or changed, pod deleted, terminating or
//! terminal) removes only that identity, never the address's inbound ones.
//!
//! The rules, in order: no label or an empty value ⇒ not an egress pod; a value that is not a
//! valid identity ⇒ Warning `ServiceGatewayInvalidEgressLabel`, the reserved `default-natgw` ⇒
//! Warning `ServiceGatewayReservedEgressLabel`, an identity equal to an inbound Service's ⇒
//! Warning `ServiceGatewayEgressLabelCollision` (one key space, docs/upstream.md §i.2.7) — each pod
//! ignored; a pod being deleted or not `Running`/`Pending` carries nothing; an IP that does not
//! parse (`ServiceGatewayInvalidPodIP`) or has no host IP of its family
//! (`ServiceGatewayNoNodeLocation`) is skipped, and a pod whose every IP does not parse carries
//! nothing (as upstream, which does not track it). Warnings are sent when a pod's set of problems
//! changes, not on every update.
//!
//! The collision rule does not depend on which came first. A pod is judged against the inbound
//! identities known when it is read; and when an inbound identity appears (a Service is
//! observed, or start-up finds an orphan registered in NRP), the pods already
//! carrying it are refused then ([`Egress::refuse_identity`]), with the same Warning, so their
//! addresses never become backends of the Service and the state is the one the other order
//! gives. (That Warning names the pod by namespace and name only, and its label lower-cased: a
//! pod's record keeps neither its UID nor its label as written.)
//! When the inbound identity goes away, a refused pod is re-admitted at its next update or
//! re-list, in either order: a refused pod's record keeps neither its label nor its addresses,
//! and keeping them would change state version 2, so there is nothing to re-admit it from before
//! the pod is read again. Re-reading applies the rules to the facts of that moment, as a
//! restarted controller would.
//!
//! A per-identity reference count says how many pods carry each identity (upstream
//! `outboundIdentityPodRefCount`; property P4: never negative, zero exactly when no pod carries
//! it). NRP's side: an identity that a pod carries and that NRP lists as a registered Outbound
//! service is programmed; one a pod carries that NRP does not list is held back (NRP would refuse
//! the reference) while `super::outbound` creates it; one whose pods have all gone is drained.
//! Outbound services that no pod of this cluster has carried (in this state's lifetime) are
//! somebody else's and left alone.
//!
//! Not here: the NAT gateway lifecycle (`super::outbound`) and the pod finalizer
//! `servicegateway.azure.com/pod-cleanup` (`super::finalizers`).

use crate::difftracker::{Class, DiffTracker};
use crate::ip;
use crate::keyed::{Map, Set};
use crate::model::{NrpService, ObjectKey, ObjectRef, Pod};
use serde::{Deserialize, Serialize};

/// The pod label that names a pod's egress identity.
pub const LABEL: &str = "kubernetes.azure.com/service-egress-gateway";
/// The RP's own default outbound service: never a pod's identity.
pub const RESERVED_IDENTITY: &str = "default-natgw";
/// 80 (Azure's resource name limit) less the longest suffix of a derived name (`-pip-v6`).
pub const MAX_IDENTITY_LEN: usize = 73;

/// Event reasons of egress pods. Operators alert on them: never rename one.
pub mod reason {
    pub const INVALID_EGRESS_LABEL: &str = "ServiceGatewayInvalidEgressLabel";
    pub const RESERVED_EGRESS_LABEL: &str = "ServiceGatewayReservedEgressLabel";
    pub const EGRESS_LABEL_COLLISION: &str = "ServiceGatewayEgressLabelCollision";
    pub const INVALID_POD_IP: &str = "ServiceGatewayInvalidPodIP";
    pub const NO_NODE_LOCATION: &str = "ServiceGatewayNoNodeLocation";
}

/// Whether a lower-cased label value is a usable identity: `^[a-z0-9]([a-z0-9._-]{0,71}[a-z0-9_])?$`
/// (an Azure resource name that leaves room for the derived public IP names) and not reserved.
pub fn is_valid_identity(identity: &str) -> bool {
    let bytes = identity.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-');
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else { return false };
    bytes.len() <= MAX_IDENTITY_LEN
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && (bytes.len() == 1 || last.is_ascii_lowercase() || last.is_ascii_digit() || *last == b'_')
        && bytes.iter().all(inner)
        && identity != RESERVED_IDENTITY
}

/// A Warning Event about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub reason: &'static str,
    pub message: String,
}

/// What the rules make of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// The identity the pod carries, if it carries one.
    pub identity: Option<String>,
    /// Canonical pod IP → the canonical host IP of its family (only when `identity` is set).
    pub addresses: Map<String, String>,
    pub warnings: Vec<Warning>,
}

/// Whether a pod in this phase carries its egress identity (upstream: Running or Pending).
fn live_phase(phase: Option<&str>) -> bool {
    phase.is_some_and(|p| p.eq_ignore_ascii_case("Running") || p.eq_ignore_ascii_case("Pending"))
}

/// The egress addresses of a pod: every parseable IP of `status.podIPs` (else `status.podIP`)
/// under the host IP of its family (`status.hostIPs`, else `status.hostIP`; the smallest when
/// several), with the IPs that could not be placed.
pub fn pod_addresses(pod: &Pod) -> (Map<String, String>, Vec<String>, Vec<String>) {
    let or_single = |list: &[String], single: &Option<String>| -> Vec<String> {
        if list.is_empty() { single.iter().cloned().collect() } else { list.to_vec() }
    };
    let host_ips = or_single(&pod.host_ips, &pod.host_ip);
    let locations = [ip::Family::V4, ip::Family::V6].map(|f| ip::same_family_location(&host_ips, f));
    let (mut addresses, mut malformed, mut unplaced) = (Map::new(), Vec::new(), Vec::new());
    for text in or_single(&pod.pod_ips, &pod.pod_ip) {
        let Some((address, family)) = ip::canonical(&text) else {
            malformed.push(text);
            continue;
        };
        match &locations[usize::from(family == ip::Family::V6)] {
            Some(location) => {
                addresses.insert(address.into(), location.to_string());
            }
            None => unplaced.push(address.into()),
        }
    }
    (addresses, malformed, unplaced)
}

/// Applies the rules to a pod. `inbound` says whether an identity is an inbound Service's.
pub fn read_pod(pod: &Pod, inbound: impl Fn(&str) -> bool) -> Reading {
    let Some(label) = pod.egress_label.as_deref().filter(|l| !l.is_empty()) else { return Reading::default() };
    let identity = label.to_ascii_lowercase();
    let refuse = |reason, message| Reading { warnings: vec![Warning { reason, message }], ..Reading::default() };
    if identity == RESERVED_IDENTITY {
        return refuse(
            reason::RESERVED_EGRESS_LABEL,
            format!(
                "egress gateway label {label:?} is reserved for the cluster's default outbound gateway; choose another value"
            ),
        );
    }
    if !is_valid_identity(&identity) {
        return refuse(
            reason::INVALID_EGRESS_LABEL,
            format!(
                "egress gateway label {label:?} is not a valid name: lower-case letters, digits, '.', '_' and '-', \
                 starting with a letter or digit, ending with one or '_', at most {MAX_IDENTITY_LEN} characters"
            ),
        );
    }
    if inbound(&identity) {
        return refuse(reason::EGRESS_LABEL_COLLISION, collision_message(label));
    }
    if pod.deleting || !live_phase(pod.phase.as_deref()) {
        return Reading::default();
    }
    let (addresses, malformed, unplaced) = pod_addresses(pod);
    let mut warnings = Vec::new();
    if !malformed.is_empty() {
        let message = format!("pod IPs {malformed:?} are not IP addresses; they get no egress");
        warnings.push(Warning { reason: reason::INVALID_POD_IP, message });
    }
    if !unplaced.is_empty() {
        let message = format!("pod IPs {unplaced:?} have no host IP of their family; they get no egress");
        warnings.push(Warning { reason: reason::NO_NODE_LOCATION, message });
    }
    // A pod's IPs do not change once assigned, so one whose every IP is malformed never gets an
    // address: counting it would keep its identity (and, with the NAT gateway lifecycle, a NAT
    // gateway) alive for nothing. A pod with no IP yet, or an IP its node may still gain a host
    // IP for, is counted: it is on its way to an address.
    if addresses.is_empty() && unplaced.is_empty() && !malformed.is_empty() {
        return Reading { warnings, ..Reading::default() };
    }
    Reading { identity: Some(identity), addresses, warnings }
}

fn collision_message(label: &str) -> String {
    format!("egress gateway label {label:?} is the identity of a LoadBalancer Service; choose another value")
}

/// What one pod contributes now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PodRecord {
    identity: Option<String>,
    addresses: Map<String, String>,
    /// The reasons of the Warnings last sent, so an unchanged pod is not warned again.
    warned: Vec<String>,
}

/// The egress side of the tracker's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Egress-labelled pods by namespace/name (only those that carry something or were warned).
    pods: Map<ObjectKey, PodRecord>,
    /// Identity → how many pods carry it; no entry is zero.
    refs: Map<String, u32>,
    /// Identities a pod has carried while this state lived: ours, so drained when their pods go.
    known: Set<String>,
    /// Outbound services NRP listed as registered at the last read (not the RP's default).
    registered: Set<String>,
}

impl Egress {
    /// A pod was created or changed: applies the difference between what it contributed and what
    /// it contributes now. Returns the Warnings to send.
    pub fn upsert(
        &mut self,
        pod: &Pod,
        inbound: impl Fn(&str) -> bool,
        diff: &mut DiffTracker,
    ) -> Vec<(ObjectRef, Warning)> {
        let reading = read_pod(pod, inbound);
        let key = pod.key();
        let old = self.pods.remove(&key).unwrap_or_default();
        let reasons: Vec<String> = reading.warnings.iter().map(|w| w.reason.to_owned()).collect();
        let warnings = if reasons == old.warned { Vec::new() } else { reading.warnings };
        let new = PodRecord { identity: reading.identity, addresses: reading.addresses, warned: reasons };
        self.change(&old, &new, diff);
        if new != PodRecord::default() {
            self.pods.insert(key, new);
        }
        warnings.into_iter().map(|w| (pod.object_ref(), w)).collect()
    }

    /// An inbound identity appeared (a Service, or an orphan found in NRP): every pod carrying it
    /// as its egress identity is refused now, as it would have been had the identity been known
    /// when the pod was read (see the module's doc). Returns the Warnings to send, each with the
    /// addresses the pod carried the identity at. Costs a look at the reference counts unless a
    /// pod carries the identity, then a pass over the egress pods.
    pub fn refuse_identity(
        &mut self,
        identity: &str,
        diff: &mut DiffTracker,
    ) -> Vec<(ObjectRef, Warning, Map<String, String>)> {
        if !self.refs.contains_key(identity) {
            return Vec::new();
        }
        let carrying: Vec<ObjectKey> =
            self.pods.iter().filter(|(_, p)| p.identity.as_deref() == Some(identity)).map(|(k, _)| k.clone()).collect();
        let reason = reason::EGRESS_LABEL_COLLISION;
        let mut warnings = Vec::new();
        for key in carrying {
            let old = self.pods.remove(&key).expect("listed above");
            let new = PodRecord { identity: None, addresses: Map::new(), warned: vec![reason.to_owned()] };
            self.change(&old, &new, diff);
            self.pods.insert(key.clone(), new);
            let regarding = ObjectRef { kind: "Pod".into(), namespace: key.namespace, name: key.name, uid: "".into() };
            warnings.push((regarding, Warning { reason, message: collision_message(identity) }, old.addresses));
        }
        warnings
    }

    /// A pod left (or stopped carrying the label): its identity leaves its addresses. Deleting
    /// a pod that is not there is a no-op.
    pub fn delete(&mut self, key: &ObjectKey, diff: &mut DiffTracker) {
        if let Some(old) = self.pods.remove(key) {
            self.change(&old, &PodRecord::default(), diff);
        }
    }

    fn change(&mut self, old: &PodRecord, new: &PodRecord, diff: &mut DiffTracker) {
        let (old_identity, new_identity) = (old.identity.as_deref(), new.identity.as_deref());
        diff.replace_placements(old_identity, &old.addresses, new_identity, &new.addresses);
        if old_identity != new_identity {
            if let Some(identity) = &old.identity {
                self.release(identity, diff);
            }
            if let Some(identity) = &new.identity {
                self.retain(identity, diff);
            }
        }
    }

    fn retain(&mut self, identity: &str, diff: &mut DiffTracker) {
        let count = self.refs.entry(identity.to_owned()).or_insert(0);
        *count += 1;
        if *count == 1 {
            self.known.insert(identity.to_owned());
            diff.touch_identity(identity);
        }
    }

    /// One pod fewer carries the identity; never below zero (a count that is not there is left
    /// alone: there is nothing to decrement twice).
    fn release(&mut self, identity: &str, diff: &mut DiffTracker) {
        let Some(count) = self.refs.get_mut(identity) else { return };
        *count -= 1;
        if *count == 0 {
            self.refs.remove(identity);
            diff.touch_identity(identity);
        }
    }

    /// How an identity that is no inbound Service's takes part in a sync; `None` when it is
    /// not an egress identity of this cluster.
    pub fn class(&self, identity: &str) -> Option<Class> {
        if self.refs.contains_key(identity) {
            Some(if self.registered.contains(identity) { Class::Ready } else { Class::NotReady })
        } else if self.known.contains(identity) {
            Some(Class::NotReady)
        } else {
            None
        }
    }

    /// After a read of NRP (and `DiffTracker::replace_nrp`, which marks every location dirty):
    /// the registered Outbound services, and identities no pod carries that NRP no longer
    /// references are forgotten.
    pub fn nrp_read(&mut self, services: &[NrpService], diff: &DiffTracker) {
        self.registered = Set::from_iter(
            services
                .iter()
                .filter(|s| s.service_type.eq_ignore_ascii_case("Outbound") && !s.is_default)
                .map(|s| s.name.to_ascii_lowercase()),
        );
        let refs = &self.refs;
        self.known.retain(|id| refs.contains_key(id) || diff.nrp_references(id));
    }

    /// An identity a pod held by our finalizer carried before this state began (a restart): ours,
    /// so its addresses drain like those of an identity a pod carried in this state's lifetime.
    /// Returns whether it was new.
    pub fn know(&mut self, identity: &str) -> bool {
        !self.known.contains(identity) && self.known.insert(identity.to_owned())
    }

    /// Whether a pod carries the identity.
    pub fn carries(&self, identity: &str) -> bool {
        self.refs.contains_key(identity)
    }

    /// Whether NRP lists the identity as a registered Outbound service, as far as the tracker
    /// knows (its last read, and its own registrations since).
    pub fn is_registered(&self, identity: &str) -> bool {
        self.registered.contains(identity)
    }

    /// How many outbound services NRP listed as registered, as the mirror has it.
    pub fn registered_count(&self) -> usize {
        self.registered.len()
    }

    /// The outbound lifecycle registered or unregistered the identity.
    pub fn set_registered(&mut self, identity: &str, registered: bool) {
        if registered {
            self.registered.insert(identity.to_owned());
        } else {
            self.registered.remove(identity);
        }
    }

    /// Identities pods carry, in order.
    pub fn carried(&self) -> impl Iterator<Item = &str> {
        self.refs.keys().map(String::as_str)
    }

    /// Identity → how many pods carry it (P4).
    pub fn ref_counts(&self) -> &Map<String, u32> {
        &self.refs
    }

    /// What a pod carries now: its identity and its addresses (address → location).
    pub fn carried_by(&self, key: &ObjectKey) -> Option<(String, Map<String, String>)> {
        let pod = self.pods.get(key)?;
        Some((pod.identity.clone()?, pod.addresses.clone()))
    }

    /// The identity a pod carries, if any.
    pub fn identity_of(&self, key: &ObjectKey) -> Option<&str> {
        self.pods.get(key).and_then(|p| p.identity.as_deref())
    }

    /// The reference counts recomputed from the pods: equal to [`Self::ref_counts`] always.
    pub fn recount(&self) -> Map<String, u32> {
        let mut counts = Map::new();
        for identity in self.pods.values().filter_map(|p| p.identity.as_ref()) {
            *counts.entry(identity.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// For a state import: the reference counts are the pods' (P4), so none is zero and none
    /// can be released below zero later. One pass over the egress pods.
    pub fn check(&self) -> Result<(), String> {
        if self.refs != self.recount() {
            return Err(format!(
                "egress reference counts {:?} are not those of the pods, {:?}",
                self.refs,
                self.recount()
            ));
        }
        Ok(())
    }
}

// By path, so that it resolves the same where `tests/next-guest` includes this file by path.
#[cfg(test)]
#[path = "identities/tests.rs"]
mod tests;
