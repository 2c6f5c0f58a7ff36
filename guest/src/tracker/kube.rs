//! Changes to the Kubernetes cache (`cache`): each folds only its difference into the
//! DiffTracker's Kubernetes side.

use super::cache::*;
use super::inbound::Inbound;
use crate::difftracker::DiffTracker;
use crate::ip;
use crate::keyed::{Map, Set};
use crate::model::*;
use crate::name::{Name, VecMap, VecSet};

/// Where the cache's changes go: the Kubernetes side of the DiffTracker, for the Services whose
/// endpoints are programmed (an inbound lifecycle not being deleted).
pub(super) struct Endpoints<'a> {
    pub(super) diff: &'a mut DiffTracker,
    pub(super) inbound: &'a Inbound,
}

impl KubeCache {
    pub(super) fn seed(&self, identity: &str, diff: &mut DiffTracker) {
        let keys = self.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.slices.get(&key) {
                for (address, location) in &record.resolved {
                    diff.add_endpoint(identity, address, location);
                }
            }
        }
    }

    pub(super) fn unseed(&self, identity: &str, diff: &mut DiffTracker) {
        let keys = self.slices_by_owner.get(identity).cloned().unwrap_or_default();
        for key in keys {
            if let Some(record) = self.slices.get(&key) {
                for (address, location) in &record.resolved {
                    diff.remove_endpoint(identity, address, location);
                }
            }
        }
    }

    /// Ready addresses of a slice and their same-family node locations.
    pub(super) fn resolve(&self, slice: &StoredSlice) -> VecMap<Name, Name> {
        if slice.deleting || !programmable(&slice.address_type) {
            return VecMap::default();
        }
        self.resolve_endpoints(slice.endpoints.iter())
    }

    pub(super) fn resolve_endpoints<'e>(
        &self,
        endpoints: impl Iterator<Item = &'e StoredEndpoint>,
    ) -> VecMap<Name, Name> {
        let mut resolved = Vec::new();
        for endpoint in endpoints.filter(|e| e.ready != Some(false)) {
            let Some(node) = endpoint.node_name.as_ref().and_then(|n| self.nodes.get(n.as_str())) else {
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

    pub(super) fn upsert_slice(&mut self, slice: EndpointSlice, out: &mut Endpoints<'_>) {
        let key = slice.key();
        let owner = slice.owner_service_uid.as_ref().map(|u| Name::from(u.to_ascii_lowercase()));
        if self.update_slice_in_place(&key, &owner, &slice, out) {
            return;
        }
        let slice = StoredSlice::of(&slice);
        let resolved = self.resolve(&slice);
        let record = SliceRecord { slice, owner, resolved };
        let old = self.slices.remove(&key);
        self.reindex_slice(&key, old.as_ref(), Some(&record));
        let (old_owner, old_resolved) = old.map(|o| (o.owner, o.resolved)).unwrap_or_default();
        apply_slice_change(out, old_owner.as_deref(), &old_resolved, record.owner.as_deref(), &record.resolved);
        self.slices.insert(key, record);
    }

    /// The common update — a few endpoints of a slice changed, nothing else — re-resolves
    /// and re-stores only those endpoints: the rest of the slice is compared as it came, never
    /// copied (this is what one endpoint change costs). Returns false when the update is not
    /// of that kind.
    pub(super) fn update_slice_in_place(
        &mut self,
        key: &ObjectKey,
        owner: &Option<Name>,
        slice: &EndpointSlice,
        out: &mut Endpoints<'_>,
    ) -> bool {
        const MOST_CHANGED: usize = 8;
        let Some(old) = self.slices.get(key) else { return false };
        let same_shape = old.owner == *owner
            && *old.slice.address_type == *slice.address_type
            && !old.slice.deleting
            && !slice.deleting
            && old.slice.endpoints.len() == slice.endpoints.len();
        if !same_shape || !programmable(&slice.address_type) {
            return false;
        }
        let pairs = old.slice.endpoints.iter().zip(&slice.endpoints);
        let changed: Vec<usize> = pairs.enumerate().filter(|(_, (a, b))| !a.is(b)).map(|(i, _)| i).collect();
        if changed.len() > MOST_CHANGED
            || changed
                .iter()
                .any(|&i| old.slice.endpoints[i].node_name.as_deref() != slice.endpoints[i].node_name.as_deref())
        {
            return false;
        }
        let stored: Vec<StoredEndpoint> = changed.iter().map(|&i| StoredEndpoint::of(&slice.endpoints[i])).collect();
        let before = self.resolve_endpoints(changed.iter().map(|&i| &old.slice.endpoints[i]));
        let after = self.resolve_endpoints(stored.iter());
        // Each address must stand for exactly one resolved entry, in the old slice and in the
        // changed endpoints, and a changed endpoint must not take an address an unchanged one
        // lists: otherwise (a duplicate, an unknown node, a bad IP) the whole slice is re-read.
        let ready_addresses = |endpoints: &mut dyn Iterator<Item = &StoredEndpoint>| -> usize {
            endpoints.filter(|e| e.ready != Some(false)).map(|e| e.addresses.len()).sum()
        };
        if old.resolved.len() != ready_addresses(&mut old.slice.endpoints.iter())
            || after.len() != ready_addresses(&mut stored.iter())
            || after.keys().any(|a| old.resolved.contains_key(a) && !before.contains_key(a))
        {
            return false;
        }
        let owner = owner.clone();
        apply_slice_change(out, owner.as_deref(), &before, owner.as_deref(), &after);
        let record = self.slices.get_mut(key).expect("read above");
        for address in before.keys() {
            record.resolved.remove(address);
        }
        record.resolved.extend(after);
        for (at, endpoint) in changed.into_iter().zip(stored) {
            record.slice.endpoints[at] = endpoint;
        }
        // The owner's UID is kept as written (the state holds the slice as it came); its
        // lower-cased form was compared above.
        if record.slice.owner_service_uid.as_deref() != slice.owner_service_uid.as_deref() {
            record.slice.owner_service_uid = slice.owner_service_uid.as_ref().map(Name::from);
        }
        true
    }

    pub(super) fn remove_slice(&mut self, key: &ObjectKey, out: &mut Endpoints<'_>) {
        let Some(old) = self.slices.remove(key) else { return };
        self.reindex_slice(key, Some(&old), None);
        apply_slice_change(out, old.owner.as_deref(), &old.resolved, None, &VecMap::default());
    }

    /// Keeps the owner and node indexes of a slice, touching only what changed between the
    /// old and the new record (an ordinary update changes neither).
    pub(super) fn reindex_slice(&mut self, key: &ObjectKey, old: Option<&SliceRecord>, new: Option<&SliceRecord>) {
        fn nodes(record: Option<&SliceRecord>) -> Set<&str> {
            let names = record.into_iter().flat_map(|r| r.slice.endpoints.iter().filter_map(|e| e.node_name.as_ref()));
            names.map(Name::as_str).collect()
        }
        fn unlink(index: &mut Map<Name, VecSet<ObjectKey>>, at: &str, key: &ObjectKey) {
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
                unlink(&mut self.slices_by_owner, owner, key);
            }
            if let Some(owner) = new_owner {
                self.slices_by_owner.entry(owner.clone()).or_default().insert(key.clone());
            }
        }
        let (old_nodes, new_nodes) = (nodes(old), nodes(new));
        for gone in old_nodes.difference(&new_nodes) {
            unlink(&mut self.slices_by_node, gone, key);
        }
        for added in new_nodes.difference(&old_nodes) {
            self.slices_by_node.slot(*added, Name::new).insert(key.clone());
        }
    }

    /// Re-resolves the slices with endpoints on a node after the node changed.
    pub(super) fn reresolve_node(&mut self, name: &str, out: &mut Endpoints<'_>) {
        let keys = self.slices_by_node.get(name).cloned().unwrap_or_default();
        for key in keys {
            let Some(record) = self.slices.get(&key) else { continue };
            let resolved = self.resolve(&record.slice);
            if resolved == record.resolved {
                continue;
            }
            let owner = record.owner.clone();
            let old = std::mem::replace(&mut self.slices.get_mut(&key).expect("just read").resolved, resolved);
            let new = self.slices[&key].resolved.clone();
            apply_slice_change(out, owner.as_deref(), &old, owner.as_deref(), &new);
        }
    }

    /// A changed Node whose InternalIPs do not all parse is logged (WARN), naming it: the
    /// addresses of its pods reach NRP only through the ones that do, and not at all when none
    /// does.
    pub(super) fn upsert_node(&mut self, node: Node, out: &mut Endpoints<'_>, step: &mut Step) {
        let name = node.name.clone();
        let locations = NodeLocations::of(&node);
        let unchanged = self.nodes.get(&name) == Some(&locations);
        self.nodes.insert(name.clone(), locations);
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
        self.reresolve_node(&name, out);
    }

    pub(super) fn remove_node(&mut self, name: &str, out: &mut Endpoints<'_>) {
        if self.nodes.remove(name).is_some() {
            self.reresolve_node(name, out);
        }
    }
}

/// Folds the change of one slice's contribution into the DiffTracker: only what changed.
fn apply_slice_change(
    out: &mut Endpoints<'_>,
    old_owner: Option<&str>,
    old: &VecMap<Name, Name>,
    new_owner: Option<&str>,
    new: &VecMap<Name, Name>,
) {
    let old_owner = old_owner.filter(|o| out.inbound.programmable(o));
    let new_owner = new_owner.filter(|o| out.inbound.programmable(o));
    out.diff.replace_placements(old_owner, old, new_owner, new);
}
