//! The watch between the cluster and the logic, as `explore` perturbs it: deliveries held back
//! and coalesced with the next, a lost event made good by a re-list, stale lists made good by the
//! changes since. Unperturbed, it hands the cluster's events through untouched.
//!
//! A re-list is delivered as `clb-host run` delivers a watch's: every object the watches select,
//! and the deletion of every object they had brought that the list no longer holds.

use crate::cluster::Cluster;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::supervisor::observed_object;
use std::collections::{BTreeMap, BTreeSet};

/// An object as the logic knows it: its kind, namespace (empty for a Node) and name
/// ([`observed_object`]'s, owned).
pub(super) type ObjectId = (&'static str, String, String);

/// The object an observation is about; `None` for `lists-complete`.
pub(super) fn object_of(observation: &wit::Observation) -> Option<ObjectId> {
    observed_object(observation).map(|(kind, namespace, name)| (kind, namespace.to_owned(), name.to_owned()))
}

fn is_deletion(observation: &wit::Observation) -> bool {
    use wit::Observation as O;
    matches!(observation, O::ServiceDeleted(_) | O::SliceDeleted(_) | O::NodeDeleted(_) | O::PodDeleted(_))
}

fn deletion((kind, namespace, name): ObjectId) -> Option<wit::Observation> {
    use wit::Observation as O;
    match kind {
        "Service" => Some(O::ServiceDeleted((namespace, name))),
        "EndpointSlice" => Some(O::SliceDeleted((namespace, name))),
        "Node" => Some(O::NodeDeleted(name)),
        "Pod" => Some(O::PodDeleted((namespace, name))),
        _ => None,
    }
}

/// Whether an observation is one of the watches' — not a pod that holds the egress finalizer
/// without the label, which start-up lists once and no watch selects (as in `clb-host run`,
/// whose re-lists neither bring such a pod nor report it deleted).
fn watched(observation: &wit::Observation) -> bool {
    !matches!(observation, wit::Observation::PodUpserted(pod) if pod.egress_label.is_none())
}

/// The objects a batch is about.
pub(super) fn objects(events: &[wit::Observation]) -> usize {
    events.iter().filter_map(object_of).collect::<BTreeSet<_>>().len()
}

/// The last event of each object, in the order of those last events.
fn coalesce(events: Vec<wit::Observation>) -> Vec<wit::Observation> {
    let last: BTreeMap<ObjectId, usize> =
        events.iter().enumerate().filter_map(|(i, o)| Some((object_of(o)?, i))).collect();
    let keep: BTreeSet<usize> = last.into_values().collect();
    events.into_iter().enumerate().filter(|(i, _)| keep.contains(i)).map(|(_, o)| o).collect()
}

/// The objects in the reverse order of their first event, each object's events in their own.
pub(super) fn reorder(events: Vec<wit::Observation>) -> Vec<wit::Observation> {
    let mut groups: Vec<(Option<ObjectId>, Vec<wit::Observation>)> = Vec::new();
    for event in events {
        let id = object_of(&event);
        match groups.iter_mut().find(|(g, _)| *g == id) {
            Some((_, group)) => group.push(event),
            None => groups.push((id, vec![event])),
        }
    }
    groups.into_iter().rev().flat_map(|(_, group)| group).collect()
}

/// What changed from the lists `old` to the lists `new`, as a watch from `old`'s point would
/// deliver it coalesced: each object new or different, and the deletion of each one gone.
pub(super) fn changes_since(old: &[wit::Observation], new: &[wit::Observation]) -> Vec<wit::Observation> {
    let before: BTreeMap<ObjectId, &wit::Observation> = old.iter().filter_map(|o| Some((object_of(o)?, o))).collect();
    let after: BTreeSet<ObjectId> = new.iter().filter_map(object_of).collect();
    let gone = before.keys().filter(|id| !after.contains(*id)).cloned().filter_map(deletion);
    let changed = new.iter().filter(|o| object_of(o).is_some_and(|id| before.get(&id) != Some(o))).cloned();
    gone.chain(changed).collect()
}

/// The watch's state in one run.
#[derive(Default)]
pub(super) struct Watch {
    /// Events held back, delivered with the next delivery or at `held_until`.
    held: Vec<wit::Observation>,
    held_until: Option<u64>,
    /// When a re-list delivers the truth.
    relist_at: Option<u64>,
    /// The objects the logic was told of and not told are gone.
    known: BTreeSet<ObjectId>,
    /// The cluster's lists as a stale restart will read them.
    pub(super) snapshot: Option<Vec<wit::Observation>>,
}

impl Watch {
    /// The logic was handed `batch`.
    pub(super) fn told(&mut self, batch: &[wit::Observation]) {
        for observation in batch.iter().filter(|o| watched(o)) {
            if let Some(id) = object_of(observation) {
                if is_deletion(observation) {
                    self.known.remove(&id);
                } else {
                    self.known.insert(id);
                }
            }
        }
    }

    /// A new controller starts: nothing is held or due; the logic knows what it is listed.
    pub(super) fn restarted(&mut self) {
        self.held.clear();
        self.held_until = None;
        self.relist_at = None;
        self.known.clear();
    }

    /// Holds `events` back until the next delivery, or until `until`.
    pub(super) fn hold(&mut self, events: Vec<wit::Observation>, until: u64) {
        if events.is_empty() {
            return;
        }
        self.held.extend(events);
        self.held_until = Some(self.held_until.map_or(until, |at| at.min(until)));
    }

    pub(super) fn relist_at(&mut self, at: u64) {
        self.relist_at = Some(at);
    }

    /// When the watch delivers next of its own accord.
    pub(super) fn due_at(&self) -> Option<u64> {
        self.held_until.into_iter().chain(self.relist_at).min()
    }

    /// Nothing held, no re-list to come.
    pub(super) fn quiet(&self) -> bool {
        self.due_at().is_none()
    }

    /// What to deliver at `now`, the cluster's `fresh` events given: a re-list when one is due
    /// (it holds everything), else the held events with the fresh ones, coalesced, when either
    /// is due, else the fresh ones.
    pub(super) fn take(&mut self, fresh: Vec<wit::Observation>, now: u64, cluster: &Cluster) -> Vec<wit::Observation> {
        if self.relist_at.is_some_and(|at| at <= now) {
            let mut listed = cluster.list();
            listed.retain(|o| !matches!(o, wit::Observation::ListsComplete) && watched(o));
            let listed_ids: BTreeSet<ObjectId> = listed.iter().filter_map(object_of).collect();
            let gone = self.known.iter().filter(|id| !listed_ids.contains(*id)).cloned().filter_map(deletion);
            let relist: Vec<wit::Observation> = gone.collect::<Vec<_>>().into_iter().chain(listed).collect();
            self.held.clear();
            self.held_until = None;
            self.relist_at = None;
            return relist;
        }
        if self.held.is_empty() {
            self.held_until = None;
            return fresh;
        }
        if fresh.is_empty() && self.held_until.is_none_or(|at| at > now) {
            return fresh;
        }
        self.held_until = None;
        let mut all = std::mem::take(&mut self.held);
        all.extend(fresh);
        coalesce(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deleted_node(name: &str) -> wit::Observation {
        wit::Observation::NodeDeleted(name.to_owned())
    }

    fn deleted_pod(name: &str) -> wit::Observation {
        wit::Observation::PodDeleted(("shop".to_owned(), name.to_owned()))
    }

    #[test]
    fn coalescing_keeps_the_last_event_of_each_object_in_the_order_of_those_last_events() {
        let events = vec![deleted_node("a"), deleted_pod("p"), deleted_node("b"), deleted_node("a")];
        assert_eq!(coalesce(events), vec![deleted_pod("p"), deleted_node("b"), deleted_node("a")]);
    }

    #[test]
    fn reordering_reverses_the_objects_and_keeps_each_objects_own_order() {
        let events = vec![deleted_node("a"), deleted_pod("p"), deleted_node("a"), deleted_node("b")];
        let reordered = reorder(events);
        assert_eq!(reordered, vec![deleted_node("b"), deleted_pod("p"), deleted_node("a"), deleted_node("a")]);
    }

    fn pod(name: &str, label: Option<&str>, finalizer: bool) -> crate::cluster::Object {
        let labels = label.map(|value| serde_json::json!({(clb_executor::records::EGRESS_LABEL): value}));
        let finalizers = finalizer.then(|| vec![clb_executor::records::EGRESS_POD_FINALIZER]);
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "uid": name, "labels": labels, "finalizers": finalizers},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.0.5"}], "hostIPs": [{"ip": "10.224.0.4"}]},
        }))
        .unwrap();
        crate::cluster::Object::Pod(Box::new(pod))
    }

    // Regression: the simulator's re-list took the pods start-up lists for holding the egress
    // finalizer without the label for the watch's. It brought such a pod again, which
    // `clb-host run`'s re-list never does; and with those left out of the upserts but still
    // counted as listed, a pod whose label came off (the event lost) was never reported deleted.
    #[test]
    fn a_relist_reports_a_pod_whose_label_came_off_deleted_and_leaves_a_held_pod_to_start_up() {
        let cluster = Cluster::new();
        cluster.apply(pod("labelled", Some("egress-a"), true)).unwrap();
        cluster.apply(pod("held", None, true)).unwrap();
        let mut watch = Watch::default();
        watch.told(&cluster.list());
        // The label comes off; the event saying so is lost.
        cluster.apply(pod("labelled", None, true)).unwrap();
        cluster.take_watch_events();
        watch.relist_at(10);
        assert_eq!(watch.take(Vec::new(), 9, &cluster), Vec::new(), "not due yet");
        assert_eq!(watch.take(Vec::new(), 10, &cluster), vec![deleted_pod("labelled")]);
        assert!(watch.quiet());
    }

    #[test]
    fn the_changes_since_a_list_delete_what_is_gone_and_bring_only_what_differs() {
        let old = vec![deleted_node("kept"), deleted_pod("gone"), wit::Observation::ListsComplete];
        let new = vec![deleted_node("kept"), deleted_pod("new"), wit::Observation::ListsComplete];
        assert_eq!(changes_since(&old, &new), vec![deleted_pod("gone"), deleted_pod("new")]);
    }
}
