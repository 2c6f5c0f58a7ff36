//! The DiffTracker's set/diff core (docs/upstream.md §a, §b.1): what Kubernetes wants at each location
//! against what NRP has been told, and the address-location updates that close the gap.
//!
//! Work is proportional to change: every mutation marks the locations it touched as dirty, and
//! a sync looks only at dirty locations. The NRP mirror changes only when NRP accepted a batch
//! (or a fresh read of NRP replaces it).

use crate::keyed::{Map, Set};
use crate::model::{NrpAddress, NrpListedLocation, NrpLocation, UpdateAction};
use crate::name::{Name, VecMap, VecSet};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How an identity found at an address takes part in a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// One of ours and registered: program it.
    Ready,
    /// One of ours (or unknown) but not to be programmed now: leave it out, which drains it.
    NotReady,
    /// Somebody else's (an outbound identity): keep whatever NRP has.
    Foreign,
}

type Services = VecSet<Name>;

/// The most addresses of one location kept dirty one by one; one more makes the whole location
/// dirty. Past this, syncing the location whole costs about what syncing the addresses would,
/// and a start-up (where every address is new) keeps no set of every pod's address. The update
/// either way makes NRP equal the desired view.
const MAX_DIRTY_ADDRESSES: usize = 16;

/// A view of NRP (location → address → services) in plain strings, for tests and reports.
pub type View = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffTracker {
    /// Kubernetes: location → address → identity → how many EndpointSlices contribute it.
    /// Counting makes an address that two slices list survive the removal from one of them.
    k8s: Map<Name, VecMap<Name, VecMap<Name, u32>>>,
    /// identity → location → number of its addresses there, in `k8s`.
    k8s_by_identity: Map<Name, VecMap<Name, u32>>,
    /// NRP: registered inbound services.
    registered: Set<Name>,
    /// NRP: location → address → services.
    nrp: Map<Name, VecMap<Name, Services>>,
    /// identity → location → number of NRP addresses there that reference it.
    nrp_by_identity: Map<Name, VecMap<Name, u32>>,
    /// Locations whose two views may differ: `None` the whole location, `Some` only those
    /// addresses (so one changed pod costs one address, not the whole node).
    dirty: Map<Name, Option<Set<Name>>>,
    /// Locations a failed batch may or may not have changed, with the identities it named (NRP
    /// may reference them there): the next update states such a location whole, so it is right
    /// whatever NRP did.
    uncertain: Map<Name, Set<Name>>,
}

fn bump(index: &mut Map<Name, VecMap<Name, u32>>, identity: &str, location: &str, up: bool) {
    if up {
        *index.slot(identity, Name::new).slot(location, Name::new) += 1;
        return;
    }
    if let Some(locations) = index.get_mut(identity) {
        if let Some(count) = locations.get_mut(location) {
            *count -= 1;
            if *count == 0 {
                locations.remove(location);
            }
        }
        if locations.is_empty() {
            index.remove(identity);
        }
    }
}

/// The addresses one contributor — an EndpointSlice, an egress pod — puts at locations:
/// address → location.
pub trait Placements {
    fn placements(&self) -> impl Iterator<Item = (&str, &str)>;
    fn location_of(&self, address: &str) -> Option<&str>;
}

impl Placements for VecMap<Name, Name> {
    fn placements(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(a, l)| (a.as_str(), l.as_str()))
    }
    fn location_of(&self, address: &str) -> Option<&str> {
        self.get(address).map(Name::as_str)
    }
}

impl Placements for Map<String, String> {
    fn placements(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(a, l)| (a.as_str(), l.as_str()))
    }
    fn location_of(&self, address: &str) -> Option<&str> {
        self.get(address).map(String::as_str)
    }
}

impl DiffTracker {
    /// One contributor's placements changed from `old`, for `old_identity`, to `new`, for
    /// `new_identity` (`None`: it contributed, or contributes, nothing): folds in only the
    /// difference, so an update that moves one address costs one address.
    pub fn replace_placements(
        &mut self,
        old_identity: Option<&str>,
        old: &impl Placements,
        new_identity: Option<&str>,
        new: &impl Placements,
    ) {
        let same = old_identity == new_identity;
        if let Some(identity) = old_identity {
            for (address, location) in old.placements() {
                if !same || new.location_of(address) != Some(location) {
                    self.remove_endpoint(identity, address, location);
                }
            }
        }
        if let Some(identity) = new_identity {
            for (address, location) in new.placements() {
                if !same || old.location_of(address) != Some(location) {
                    self.add_endpoint(identity, address, location);
                }
            }
        }
    }

    /// One EndpointSlice now lists `address` on `location` for `identity`.
    pub fn add_endpoint(&mut self, identity: &str, address: &str, location: &str) {
        let count = self.k8s.slot(location, Name::new).slot(address, Name::new).slot(identity, Name::new);
        *count += 1;
        if *count == 1 {
            bump(&mut self.k8s_by_identity, identity, location, true);
            self.mark_address_dirty(location, address);
        }
    }

    /// One EndpointSlice no longer lists `address` on `location` for `identity`. Removing what
    /// is not there is a no-op: duplicate and out-of-order deletes are harmless.
    pub fn remove_endpoint(&mut self, identity: &str, address: &str, location: &str) {
        let Some(addresses) = self.k8s.get_mut(location) else { return };
        let Some(identities) = addresses.get_mut(address) else { return };
        let Some(count) = identities.get_mut(identity) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        identities.remove(identity);
        if identities.is_empty() {
            addresses.remove(address);
        }
        if addresses.is_empty() {
            self.k8s.remove(location);
        }
        bump(&mut self.k8s_by_identity, identity, location, false);
        self.mark_address_dirty(location, address);
    }

    fn mark_address_dirty(&mut self, location: &str, address: &str) {
        match self.dirty.get_mut(location) {
            Some(None) => {}
            Some(Some(addresses)) if addresses.len() >= MAX_DIRTY_ADDRESSES && !addresses.contains(address) => {
                self.dirty.insert(Name::new(location), None);
            }
            Some(Some(addresses)) => {
                addresses.insert(Name::new(address));
            }
            None => {
                self.dirty.insert(Name::new(location), Some(Set::from([Name::new(address)])));
            }
        }
    }

    /// An identity's class changed: every location where either view mentions it is dirty.
    pub fn touch_identity(&mut self, identity: &str) {
        for index in [&self.k8s_by_identity, &self.nrp_by_identity] {
            if let Some(locations) = index.get(identity) {
                self.dirty.extend(locations.keys().map(|l| (l.clone(), None)));
            }
        }
    }

    pub fn is_registered(&self, identity: &str) -> bool {
        self.registered.contains(identity)
    }

    pub fn registered(&self) -> &Set<Name> {
        &self.registered
    }

    /// NRP accepted the registration (or the unregistration) of an inbound service.
    pub fn set_registered(&mut self, identity: &str, registered: bool) {
        let changed =
            if registered { self.registered.insert(Name::new(identity)) } else { self.registered.remove(identity) };
        if changed {
            self.touch_identity(identity);
        }
    }

    /// Whether any NRP address still references the identity, or may after a failed batch.
    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    pub fn nrp_references(&self, identity: &str) -> bool {
        self.nrp_by_identity.contains_key(identity) || self.uncertain.values().any(|ids| ids.contains(identity))
    }

    /// Whether NRP may still map `identity` at `address` on `location` (the mirror does, or a
    /// batch whose outcome is unknown named it there) while Kubernetes no longer puts it there:
    /// what a departed egress pod's finalizer waits for.
    pub fn awaits_drain(&self, identity: &str, location: &str, address: &str) -> bool {
        let in_nrp = self.nrp.get(location).and_then(|a| a.get(address)).is_some_and(|s| s.contains(identity))
            || self.uncertain.get(location).is_some_and(|ids| ids.contains(identity));
        let in_k8s = self.k8s.get(location).and_then(|a| a.get(address)).is_some_and(|ids| ids.get(identity).is_some());
        in_nrp && !in_k8s
    }

    /// Whether NRP may still map `identity` at any address Kubernetes no longer puts it at, or
    /// a batch whose outcome is unknown named it anywhere: what a departed egress pod whose
    /// addresses were never read waits for, since any such address may have been its own.
    pub fn awaits_any_drain(&self, identity: &str) -> bool {
        let unbacked = self.nrp_by_identity.get(identity).is_some_and(|locations| {
            locations.keys().any(|location| {
                self.nrp.get(location.as_str()).is_some_and(|addresses| {
                    addresses.iter().any(|(address, services)| {
                        services.contains(identity) && self.awaits_drain(identity, location, address)
                    })
                })
            })
        });
        unbacked || self.uncertain.values().any(|identities| identities.contains(identity))
    }

    /// Whether Kubernetes has any address for the identity.
    pub fn has_endpoints(&self, identity: &str) -> bool {
        self.k8s_by_identity.contains_key(identity)
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub fn is_dirty(&self, location: &str) -> bool {
        self.dirty.contains_key(location)
    }

    pub fn mark_dirty(&mut self, location: &str) {
        self.dirty.insert(Name::new(location), None);
    }

    /// A batch carrying this update failed without saying whether NRP applied it.
    pub fn mark_uncertain(&mut self, update: &NrpLocation) {
        let named = update.addresses.iter().flat_map(|a| a.services.iter().map(Name::from));
        self.uncertain.entry(Name::new(&update.location)).or_default().extend(named);
        self.dirty.insert(Name::new(&update.location), None);
    }

    /// Every location either view knows is dirty (after a fresh read of NRP).
    pub fn mark_all_dirty(&mut self) {
        self.dirty.extend(self.k8s.keys().map(|l| (l.clone(), None)));
        self.dirty.extend(self.nrp.keys().map(|l| (l.clone(), None)));
    }

    /// Takes up to `max` dirty locations that need an update, in location order, with their
    /// updates. Dirty locations found in sync are dropped from the dirty set on the way; those
    /// returned leave it until the caller puts them back ([`Self::mark_dirty`]) on failure.
    /// `class` is given the tracker, since registration is part of readiness.
    /// Locations for which `waits` is true are passed over and stay dirty.
    pub fn take_sync(
        &mut self,
        max: usize,
        waits: impl Fn(&str) -> bool,
        class: impl Fn(&DiffTracker, &str) -> Class,
    ) -> Vec<NrpLocation> {
        let mut batch = Vec::new();
        let mut waiting = Vec::new();
        while batch.len() < max {
            let Some((location, scope)) = self.dirty.pop_first() else { break };
            if waits(&location) {
                waiting.push((location, scope));
                continue;
            }
            let class = |id: &str| class(self, id);
            let update = match scope {
                Some(addresses) => self.sync_addresses(&location, &addresses, &class),
                None => self.sync_location(&location, &class),
            };
            if let Some(update) = update {
                batch.push(update);
            }
        }
        self.dirty.extend(waiting);
        batch
    }

    /// The update that makes NRP's view of one location equal the desired one, if any
    /// (upstream `GetSyncLocationsAddresses`, for one location).
    pub fn sync_location(&self, location: &str, class: &impl Fn(&str) -> Class) -> Option<NrpLocation> {
        // Borrowed strings throughout: most locations turn out to be in sync, and checking
        // that must not allocate.
        let empty = VecMap::default();
        let actual = self.nrp.get(location);
        let wanted = self.k8s.get(location).unwrap_or(&empty);
        // Sorted vectors, not trees: built in key order (`wanted` is), and one of them per
        // location at every start-up.
        let mut desired: VecMap<&str, VecSet<&str>> = VecMap::default();
        for (address, identities) in wanted {
            let set: VecSet<&str> =
                identities.keys().map(Name::as_str).filter(|id| class(id) == Class::Ready).collect();
            if !set.is_empty() {
                desired.insert(address.as_str(), set);
            }
        }
        // Other controllers' identities stay as NRP has them.
        for (address, services) in actual.into_iter().flatten() {
            for service in services.iter().map(Name::as_str).filter(|s| class(s) == Class::Foreign) {
                desired.slot(&address.as_str(), |a| *a).insert(service);
            }
        }
        let to_wire = |address: &str, services: &VecSet<&str>| NrpAddress {
            address: address.to_owned(),
            services: services.iter().map(|s| (*s).to_owned()).collect(),
        };
        let uncertain = self.uncertain.contains_key(location);
        let actual = match actual {
            Some(actual) if !uncertain => actual,
            _ if desired.is_empty() && !uncertain => return None,
            _ => {
                let addresses: Vec<NrpAddress> = desired.iter().map(|(a, s)| to_wire(a, s)).collect();
                let action = if addresses.is_empty() { UpdateAction::PartialUpdate } else { UpdateAction::FullUpdate };
                return Some(NrpLocation { location: location.to_owned(), action, addresses });
            }
        };
        if desired.is_empty() {
            // Nothing of ours or anybody's is left: delete the whole location.
            return Some(NrpLocation {
                location: location.to_owned(),
                action: UpdateAction::PartialUpdate,
                addresses: Vec::new(),
            });
        }
        let same = |have: &Services, want: &VecSet<&str>| {
            have.len() == want.len() && have.iter().zip(want.iter()).all(|(h, w)| h == w)
        };
        let mut addresses = Vec::new();
        for (address, services) in desired.iter() {
            if !actual.get(*address).is_some_and(|have| same(have, services)) {
                addresses.push(to_wire(address, services));
            }
        }
        for address in actual.keys().filter(|a| !desired.contains_key(a.as_str())) {
            addresses.push(NrpAddress { address: address.to_string(), services: Vec::new() });
        }
        if addresses.is_empty() {
            return None;
        }
        crate::keyed::sort_by(&mut addresses, |a, b| a.address.cmp(&b.address));
        Some(NrpLocation { location: location.to_owned(), action: UpdateAction::PartialUpdate, addresses })
    }

    /// The update for some addresses of a location, when only they changed. Falls back to the
    /// whole location when NRP does not have it, it is uncertain, or Kubernetes has nothing
    /// left there (then the location itself goes).
    pub fn sync_addresses(
        &self,
        location: &str,
        addresses: &Set<Name>,
        class: &impl Fn(&str) -> Class,
    ) -> Option<NrpLocation> {
        let (Some(actual), Some(wanted)) = (self.nrp.get(location), self.k8s.get(location)) else {
            return self.sync_location(location, class);
        };
        if self.uncertain.contains_key(location) {
            return self.sync_location(location, class);
        }
        let mut updates = Vec::new();
        for address in addresses {
            let mut desired: Services = wanted
                .get(address.as_str())
                .map(|ids| ids.keys().filter(|id| class(id) == Class::Ready).cloned().collect())
                .unwrap_or_default();
            let current = actual.get(address);
            desired.extend(current.into_iter().flatten().filter(|s| class(s) == Class::Foreign).cloned());
            let unchanged = match current {
                Some(current) => *current == desired,
                None => desired.is_empty(),
            };
            if !unchanged {
                updates.push(NrpAddress {
                    address: address.to_string(),
                    services: desired.into_iter().map(String::from).collect(),
                });
            }
        }
        if updates.is_empty() {
            return None;
        }
        Some(NrpLocation { location: location.to_owned(), action: UpdateAction::PartialUpdate, addresses: updates })
    }

    fn set_nrp_address(&mut self, location: &str, address: &str, services: Option<Services>) {
        let addresses = self.nrp.slot(location, Name::new);
        let old = match services {
            Some(services) => addresses.insert(Name::new(address), services),
            None => addresses.remove(address),
        };
        if addresses.is_empty() {
            self.nrp.remove(location);
        }
        let (old, none) = (old.unwrap_or_default(), Services::new());
        let new = self.nrp.get(location).and_then(|a| a.get(address)).unwrap_or(&none);
        for gone in old.difference(new) {
            bump(&mut self.nrp_by_identity, gone, location, false);
        }
        for added in new.difference(&old) {
            bump(&mut self.nrp_by_identity, added, location, true);
        }
    }

    fn remove_nrp_location(&mut self, location: &str) {
        let addresses: Vec<Name> = self.nrp.get(location).map(|a| a.keys().cloned().collect()).unwrap_or_default();
        for address in addresses {
            self.set_nrp_address(location, &address, None);
        }
    }

    /// NRP accepted `batch`: record it in the mirror (upstream `UpdateLocationsAddresses`).
    pub fn apply(&mut self, batch: &[NrpLocation]) {
        for location in batch {
            self.uncertain.remove(location.location.as_str());
            if location.addresses.is_empty() || location.action == UpdateAction::FullUpdate {
                self.remove_nrp_location(&location.location);
            }
            for address in &location.addresses {
                let services: Services = address.services.iter().map(Name::from).collect();
                let services = if services.is_empty() { None } else { Some(services) };
                self.set_nrp_address(&location.location, &address.address, services);
            }
        }
    }

    /// Replaces the NRP mirror with what NRP listed, canonicalising every IP. Returns the
    /// entries that were not IP addresses, which are skipped.
    pub fn replace_nrp(&mut self, registered: Set<String>, locations: &[NrpListedLocation]) -> Vec<String> {
        self.registered = registered.into_iter().map(Name::from).collect();
        self.uncertain.clear();
        self.nrp.clear();
        self.nrp_by_identity.clear();
        let mut skipped = Vec::new();
        for listed in locations {
            let Some((location, _)) = crate::ip::canonical(&listed.location) else {
                skipped.push(listed.location.clone());
                continue;
            };
            for address in &listed.addresses {
                let Some((canonical, _)) = crate::ip::canonical(&address.address) else {
                    skipped.push(address.address.clone());
                    continue;
                };
                let services: Services = address
                    .services
                    .iter()
                    .map(|s| {
                        if s.bytes().any(|b| b.is_ascii_uppercase()) {
                            Name::from(s.to_ascii_lowercase())
                        } else {
                            Name::new(s)
                        }
                    })
                    .collect();
                if !services.is_empty() {
                    self.set_nrp_address(&location, &canonical, Some(services));
                }
            }
        }
        self.mark_all_dirty();
        skipped
    }

    /// How many locations and addresses NRP holds, as the mirror has it.
    pub fn nrp_totals(&self) -> (usize, usize) {
        (self.nrp.len(), self.nrp.values().map(|addresses| addresses.len()).sum())
    }

    /// NRP's view, for tests and reports: location → address → services.
    pub fn nrp_view(&self) -> View {
        let mut view = View::new();
        for (location, addresses) in &self.nrp {
            let addresses = addresses.iter().map(|(a, s)| (a.to_string(), s.iter().map(Name::to_string).collect()));
            view.insert(location.to_string(), addresses.collect());
        }
        view
    }

    /// The Kubernetes view filtered by `class` as NRP should hold it: location → address →
    /// ready identities. Equal to [`Self::nrp_view`] once every sync has been applied.
    pub fn desired_view(&self, class: impl Fn(&str) -> Class) -> View {
        let mut view = View::new();
        for (location, addresses) in &self.k8s {
            for (address, identities) in addresses {
                let ready: BTreeSet<String> =
                    identities.keys().filter(|id| class(id) == Class::Ready).map(Name::to_string).collect();
                if !ready.is_empty() {
                    view.entry(location.to_string()).or_default().insert(address.to_string(), ready);
                }
            }
        }
        for (location, addresses) in &self.nrp {
            for (address, services) in addresses {
                for service in services.iter().filter(|s| class(s) == Class::Foreign) {
                    view.entry(location.to_string())
                        .or_default()
                        .entry(address.to_string())
                        .or_default()
                        .insert(service.to_string());
                }
            }
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_all(_: &DiffTracker, _: &str) -> Class {
        Class::Ready
    }

    fn converge(tracker: &mut DiffTracker, class: impl Fn(&DiffTracker, &str) -> Class + Copy) {
        loop {
            let batch = tracker.take_sync(usize::MAX, |_| false, class);
            if batch.is_empty() {
                break;
            }
            tracker.apply(&batch);
        }
    }

    // Mirrors upstream TestGetSyncLocationsAddresses: a node unknown to NRP is a FullUpdate.
    // Upstream TestUpdateK8sEndpoints, TestLocationsUpdater_SendsExactAddressPayloadToNRP and
    // TestUpdateLocationsAddresses.
    #[test]
    fn a_location_new_to_nrp_is_sent_as_a_full_update_with_its_addresses() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        let batch = t.take_sync(10, |_| false, ready_all);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].action, UpdateAction::FullUpdate);
        assert_eq!(batch[0].addresses, vec![NrpAddress { address: "10.1.0.5".into(), services: vec!["svc-a".into()] }]);
    }

    // Mirrors upstream TestUpdateK8sEndpointsRelocation (a Design A defect fixed in B).
    #[test]
    fn a_pod_ip_moving_between_nodes_in_one_update_leaves_the_old_node() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        converge(&mut t, ready_all);
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.5");
        let batch = t.take_sync(10, |_| false, ready_all);
        let old = batch.iter().find(|l| l.location == "10.0.0.4").unwrap();
        assert!(old.addresses.is_empty(), "the old node is deleted: {old:?}");
        t.apply(&batch);
        assert_eq!(t.nrp_view(), t.desired_view(|_| Class::Ready));
        assert!(!t.nrp_view().contains_key("10.0.0.4"));
    }

    // Mirrors upstream TestNRPDrainVsRemoveWireShapes.
    // Upstream TestUpdateK8sEndpoints, TestUpdateLocationsAddresses,
    // TestGuardSyncOps_PerAddressRemoval_EmptyServiceRef and
    // TestGuardSyncOps_WholeNodeRemoval_EmitsEmptyAddresses.
    #[test]
    fn a_removed_pod_is_sent_with_no_services_and_a_gone_node_with_no_addresses() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.add_endpoint("svc-a", "10.1.0.6", "10.0.0.4");
        t.add_endpoint("svc-a", "10.1.0.7", "10.0.0.5");
        converge(&mut t, ready_all);
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.remove_endpoint("svc-a", "10.1.0.7", "10.0.0.5");
        let batch = t.take_sync(10, |_| false, ready_all);
        assert_eq!(
            batch,
            vec![
                NrpLocation {
                    location: "10.0.0.4".into(),
                    action: UpdateAction::PartialUpdate,
                    addresses: vec![NrpAddress { address: "10.1.0.5".into(), services: vec![] }],
                },
                NrpLocation { location: "10.0.0.5".into(), action: UpdateAction::PartialUpdate, addresses: vec![] },
            ]
        );
    }

    // Mirrors upstream TestGuardSyncOps_NoSpuriousLocationEntries.
    // Upstream TestGetSyncOperations.
    #[test]
    fn locations_already_in_sync_produce_no_entries() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        converge(&mut t, ready_all);
        t.mark_all_dirty();
        assert!(t.take_sync(10, |_| false, ready_all).is_empty());
    }

    #[test]
    fn an_address_listed_by_two_slices_survives_the_removal_from_one() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        converge(&mut t, ready_all);
        assert!(t.nrp_view()["10.0.0.4"].contains_key("10.1.0.5"));
    }

    #[test]
    fn duplicate_and_out_of_order_removes_are_harmless() {
        let mut t = DiffTracker::default();
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        t.remove_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        assert!(!t.has_endpoints("svc-a"));
        assert!(t.take_sync(10, |_| false, ready_all).is_empty());
    }

    // Upstream TestServiceHasLocationsInNRP: no reference on an empty tracker; referenced while an
    // NRP address lists it, even beside a location that does not; none once it is drained.
    #[test]
    fn not_ready_identities_are_drained_and_foreign_ones_kept() {
        assert!(!DiffTracker::default().nrp_references("svc-a"));
        let mut t = DiffTracker::default();
        let listed = vec![
            NrpListedLocation {
                location: "10.0.0.4".into(),
                addresses: vec![NrpAddress {
                    address: "10.1.0.5".into(),
                    services: vec!["svc-a".into(), "egress-x".into()],
                }],
            },
            NrpListedLocation {
                location: "10.0.0.5".into(),
                addresses: vec![NrpAddress { address: "10.1.0.9".into(), services: vec!["other".into()] }],
            },
        ];
        t.replace_nrp(Set::from(["svc-a".to_string()]), &listed);
        assert!(t.nrp_references("svc-a") && t.nrp_references("egress-x"));
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        let foreign = ["egress-x", "other"];
        let class = |_: &DiffTracker, id: &str| if foreign.contains(&id) { Class::Foreign } else { Class::NotReady };
        let batch = t.take_sync(10, |_| false, class);
        assert_eq!(batch.len(), 1, "10.0.0.5 holds only a foreign identity: {batch:?}");
        assert_eq!(
            batch[0].addresses,
            vec![NrpAddress { address: "10.1.0.5".into(), services: vec!["egress-x".into()] }]
        );
        t.apply(&batch);
        assert!(!t.nrp_references("svc-a"), "10.0.0.5 does not list it");
        assert!(t.nrp_references("egress-x") && t.nrp_references("other"));
    }

    // Upstream TestUpdateLocationsAddresses "update existing address with new identity": an
    // address NRP has for one service gets a second one and an egress identity in one
    // PartialUpdate that names all three, and the mirror records it.
    #[test]
    fn an_address_nrp_has_gains_a_service_and_an_egress_identity_in_one_partial_update() {
        let mut t = DiffTracker::default();
        t.add_endpoint("svc-a", "10.1.0.5", "10.0.0.4");
        converge(&mut t, ready_all);
        t.add_endpoint("svc-b", "10.1.0.5", "10.0.0.4");
        t.add_endpoint("egress-x", "10.1.0.5", "10.0.0.4");
        let batch = t.take_sync(10, |_| false, ready_all);
        let services = ["egress-x", "svc-a", "svc-b"].map(String::from).to_vec();
        assert_eq!(
            batch,
            vec![NrpLocation {
                location: "10.0.0.4".into(),
                action: UpdateAction::PartialUpdate,
                addresses: vec![NrpAddress { address: "10.1.0.5".into(), services: services.clone() }],
            }]
        );
        t.apply(&batch);
        let expected = View::from([(
            "10.0.0.4".to_string(),
            BTreeMap::from([("10.1.0.5".to_string(), services.into_iter().collect::<BTreeSet<_>>())]),
        )]);
        assert_eq!(t.nrp_view(), expected);
        assert_eq!(t.nrp_view(), t.desired_view(|_| Class::Ready));
    }

    // Upstream TestUpdateLocationsAddresses "sync empty states" and "complex case with multiple
    // operations": from an NRP that lists stale services, addresses and a whole node, one sync
    // and its apply leave the mirror equal to what Kubernetes wants, an inbound service and an
    // egress identity side by side on one address.
    #[test]
    fn one_sync_and_its_apply_make_the_mirror_equal_kubernetes_after_many_kinds_of_change() {
        let mut empty = DiffTracker::default();
        assert!(empty.take_sync(10, |_| false, ready_all).is_empty());
        assert!(empty.nrp_view().is_empty());

        let address = |a: &str, services: &[&str]| NrpAddress {
            address: a.into(),
            services: services.iter().map(|s| s.to_string()).collect(),
        };
        let listed = vec![
            NrpListedLocation {
                location: "10.0.0.4".into(),
                addresses: vec![address("10.1.0.1", &["svc-1", "svc-2"]), address("10.1.0.2", &["svc-4"])],
            },
            NrpListedLocation { location: "10.0.0.5".into(), addresses: vec![address("10.1.0.3", &["svc-3"])] },
        ];
        let mut t = DiffTracker::default();
        let registered = (1..=5).map(|i| format!("svc-{i}")).chain(["egress-1".to_string()]).collect();
        t.replace_nrp(registered, &listed);
        t.add_endpoint("svc-1", "10.1.0.1", "10.0.0.4");
        t.add_endpoint("svc-3", "10.1.0.1", "10.0.0.4");
        t.add_endpoint("egress-1", "10.1.0.1", "10.0.0.4");
        t.add_endpoint("svc-5", "10.1.0.5", "10.0.0.6");
        let batch = t.take_sync(10, |_| false, ready_all);
        assert_eq!(
            batch,
            vec![
                NrpLocation {
                    location: "10.0.0.4".into(),
                    action: UpdateAction::PartialUpdate,
                    addresses: vec![address("10.1.0.1", &["egress-1", "svc-1", "svc-3"]), address("10.1.0.2", &[])],
                },
                NrpLocation { location: "10.0.0.5".into(), action: UpdateAction::PartialUpdate, addresses: vec![] },
                NrpLocation {
                    location: "10.0.0.6".into(),
                    action: UpdateAction::FullUpdate,
                    addresses: vec![address("10.1.0.5", &["svc-5"])],
                },
            ]
        );
        t.apply(&batch);
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let expected = View::from([
            ("10.0.0.4".to_string(), BTreeMap::from([("10.1.0.1".to_string(), set(&["egress-1", "svc-1", "svc-3"]))])),
            ("10.0.0.6".to_string(), BTreeMap::from([("10.1.0.5".to_string(), set(&["svc-5"]))])),
        ]);
        assert_eq!(t.nrp_view(), expected);
        assert_eq!(t.nrp_view(), t.desired_view(|_| Class::Ready));
        assert!(!t.nrp_references("svc-2") && !t.nrp_references("svc-4"), "stale services are gone");
        assert!(t.take_sync(10, |_| false, ready_all).is_empty(), "nothing left to send");
    }

    // Upstream TestConvertLocationDTOsToAddressLocations.
    #[test]
    fn nrp_listings_in_any_ipv6_spelling_become_one_canonical_location() {
        let mut t = DiffTracker::default();
        let listed = vec![NrpListedLocation {
            location: "FD00:0::4".into(),
            addresses: vec![NrpAddress { address: "FD00:1::0005".into(), services: vec!["SVC-A".into()] }],
        }];
        t.replace_nrp(Set::from(["svc-a".to_string()]), &listed);
        t.add_endpoint("svc-a", "fd00:1::5", "fd00::4");
        assert!(t.take_sync(10, |_| false, ready_all).is_empty(), "{:?}", t.nrp_view());
    }
}
