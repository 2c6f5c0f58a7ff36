//! The Kubernetes cache as the tracker keeps it: Services with their verdicts, EndpointSlices in
//! compact keys ([`StoredSlice`]) with their resolved addresses, Nodes' locations per family.

use crate::admission::Verdict;
use crate::ip;
use crate::keyed::Map;
use crate::model::*;
use crate::name::{Name, VecMap, VecSet};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// The Kubernetes side: what the host's watches reported, kept in the shapes the tracker reads
/// them in, and whether the initial lists are complete (nothing is written before they are).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct KubeCache {
    pub(super) services: Map<ObjectKey, ServiceRecord>,
    pub(super) service_by_identity: Map<String, ObjectKey>,
    pub(super) slices: Map<ObjectKey, SliceRecord>,
    pub(super) slices_by_owner: Map<Name, VecSet<ObjectKey>>,
    pub(super) slices_by_node: Map<Name, VecSet<ObjectKey>>,
    /// Node name → its locations per family (computed once per Node change, not per endpoint).
    pub(super) nodes: Map<String, NodeLocations>,
    pub(super) lists_complete: bool,
}

impl KubeCache {
    /// A Service gone from the API server: its record goes; returns its identity.
    pub(super) fn remove_service(&mut self, key: &ObjectKey) -> Option<String> {
        let record = self.services.remove(key)?;
        let identity = record.observed.identity();
        self.service_by_identity.remove(&identity);
        Some(identity)
    }

    /// A Service's record, taken out to be replaced ([`Self::put_service`]); its identity stays
    /// indexed.
    pub(super) fn take_service(&mut self, key: &ObjectKey) -> Option<ServiceRecord> {
        self.services.remove(key)
    }

    /// An identity no Service has any more (its name now belongs to a new object).
    pub(super) fn forget_identity(&mut self, identity: &str) {
        self.service_by_identity.remove(identity);
    }

    /// A Service's record, as read, indexed by its identity.
    pub(super) fn put_service(&mut self, identity: String, key: ObjectKey, record: ServiceRecord) {
        self.service_by_identity.insert(identity, key.clone());
        self.services.insert(key, record);
    }

    /// The record of the Service with this identity, if the cache has one.
    pub(super) fn record_of(&self, identity: &str) -> Option<&ServiceRecord> {
        self.service_by_identity.get(identity).and_then(|key| self.services.get(key))
    }

    /// Whether a Service with this identity is in the cache.
    pub(super) fn knows_identity(&self, identity: &str) -> bool {
        self.service_by_identity.contains_key(identity)
    }

    /// The record of a Service, by namespace and name.
    pub(super) fn service(&self, namespace: &str, name: &str) -> Option<&ServiceRecord> {
        self.services.get(&ObjectKey::new(namespace, name))
    }

    /// The host's initial lists are in.
    pub(super) fn complete_lists(&mut self) {
        self.lists_complete = true;
    }

    /// The initial lists are complete: nothing is written before.
    pub(super) fn lists_complete(&self) -> bool {
        self.lists_complete
    }

    /// Whether a Node of the cluster has an IPv6 address: an identity created now gets an IPv6
    /// public IP too (upstream: the cluster's families, decided once per identity).
    pub(super) fn has_ipv6(&self) -> bool {
        self.nodes.values().any(|n| n.v6.is_some())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ServiceRecord {
    pub(super) observed: Service,
    /// The spec last admitted; a live Service that becomes invalid keeps it (docs/design.md §3).
    pub(super) admitted: Option<Service>,
    pub(super) verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SliceRecord {
    pub(super) slice: StoredSlice,
    pub(super) owner: Option<Name>,
    /// Ready addresses → their location, as the Nodes resolve them now.
    pub(super) resolved: VecMap<Name, Name>,
}

/// An EndpointSlice as the tracker keeps it: [`EndpointSlice`] in compact keys, serialized
/// exactly like it (field for field), so the state format does not change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredSlice {
    pub(super) namespace: Name,
    pub(super) name: Name,
    pub(super) owner_service_uid: Option<Name>,
    pub(super) address_type: Name,
    pub(super) endpoints: Vec<StoredEndpoint>,
    pub(super) deleting: bool,
}

/// [`Endpoint`], as [`StoredSlice`] keeps it: nearly always one address, held in place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredEndpoint {
    pub(super) addresses: SmallVec<[Name; 1]>,
    pub(super) node_name: Option<Name>,
    pub(super) ready: Option<bool>,
}

impl StoredEndpoint {
    pub(super) fn of(endpoint: &Endpoint) -> Self {
        Self {
            addresses: endpoint.addresses.iter().map(Name::from).collect(),
            node_name: endpoint.node_name.as_ref().map(Name::from),
            ready: endpoint.ready,
        }
    }

    /// Whether `endpoint` is this one, as it came (what [`Self::of`] would make of it).
    pub(super) fn is(&self, endpoint: &Endpoint) -> bool {
        self.ready == endpoint.ready
            && self.node_name.as_deref() == endpoint.node_name.as_deref()
            && self.addresses.len() == endpoint.addresses.len()
            && self.addresses.iter().zip(&endpoint.addresses).all(|(a, b)| **a == **b)
    }
}

impl StoredSlice {
    pub(super) fn of(slice: &EndpointSlice) -> Self {
        let endpoints = slice.endpoints.iter().map(StoredEndpoint::of);
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
pub(super) struct NodeLocations {
    pub(super) v4: Option<Name>,
    pub(super) v6: Option<Name>,
}

impl NodeLocations {
    pub(super) fn of(node: &Node) -> Self {
        Self {
            v4: ip::same_family_location(&node.internal_ips, ip::Family::V4),
            v6: ip::same_family_location(&node.internal_ips, ip::Family::V6),
        }
    }

    pub(super) fn for_family(&self, family: ip::Family) -> Option<&Name> {
        match family {
            ip::Family::V4 => self.v4.as_ref(),
            ip::Family::V6 => self.v6.as_ref(),
        }
    }
}

/// The address types whose endpoints are pod IPs, `IPv4` and `IPv6` (in any case, as the NRP
/// types are read): only their endpoints are programmed; `FQDN` and types Kubernetes does not
/// have are not.
pub(super) fn programmable(address_type: &str) -> bool {
    address_type.eq_ignore_ascii_case("IPv4") || address_type.eq_ignore_ascii_case("IPv6")
}
