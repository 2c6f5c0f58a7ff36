//! The egress pod finalizer `servicegateway.azure.com/pod-cleanup` (docs/upstream.md §b.3
//! "Finalizers", `finalizers.go`, `pods.go`): state version 7's addition.
//!
//! A pod that carries an egress identity gets the finalizer, so that it cannot leave the API
//! server while NRP may still send its traffic out through the identity's NAT gateway. Once it
//! carries nothing (deleted, terminal, its label removed, emptied or refused), the finalizer is
//! released, and only then:
//!
//! * every address it carried an identity at has left NRP for that identity (the NRP mirror no
//!   longer maps it there, nor may a batch whose outcome is unknown), or is another live pod's
//!   now (a replacement with the same IP and identity: nothing to drain);
//! * for each identity it carried that no pod carries any longer, the identity's outbound
//!   teardown has ended (upstream "last pod": released after the NAT gateway is deleted).
//!
//! Every write names the pod's UID, so a replacement pod with the same name is never released
//! or stripped by a stale record: a pod read with another UID than its record's replaces it
//! (the old object is gone, and its addresses drain through the DiffTracker as before). A pod
//! read being deleted under another UID than that of a live pod holding the finalizer is the
//! other way round ([`PodFinalizers::superseded`]): a stale read of the object a replacement
//! superseded, which must not drain, uncount or release the replacement, and is ignored.
//! Upstream also releases the old UID's finalizer then (`ReleaseNoDrain`); here nothing is
//! written: an object that holds a finalizer keeps its name, so while the replacement exists the
//! old object holds none, and a write for it would be repeated by every re-list that shows it
//! again (property P3). A write
//! the API server answers 404, or the host's UID guard refuses (409 `UIDMismatch`), ends the
//! record: the object it was for is gone. Any other failure is retried with the tracker's
//! backoff; the first failure of a run is a Warning Event on the pod
//! ([`reason::POD_FINALIZER_FAILED`]), as upstream alerts when a finalizer cannot be added.
//! Addresses are never held back for the finalizer (upstream registers the pod whether or not
//! the finalizer could be added).
//!
//! After a restart the records are rebuilt from the pods listed: a pod that carries the
//! finalizer and nothing else any more (being deleted, say) is released once what its label
//! and IPs say it carried has left NRP (upstream `recoverStuckFinalizers`), its identity
//! included when it had no IP. The pods this module knows are those that carry an identity or
//! hold the finalizer: the rest cost nothing.

use super::identities as egress;
use crate::keyed::{Map, Set};
use crate::lifecycle::{Attempt, WorkSets};
use crate::model::{Failure, ObjectKey, ObjectRef, Pod};
use crate::name::{Name, VecSet};
use serde::{Deserialize, Serialize};

/// The finalizer that holds an egress pod until its addresses have left NRP.
pub const FINALIZER: &str = "servicegateway.azure.com/pod-cleanup";

/// Event reasons of the pod finalizer. Operators alert on them: never rename one.
pub mod reason {
    /// Adding or releasing the finalizer failed; it is retried with backoff.
    pub const POD_FINALIZER_FAILED: &str = "ServiceGatewayPodFinalizerFailed";
}

/// What a pod carries: its identity and its addresses (address → location).
pub type Carried = Option<(String, Map<String, String>)>;

/// One pod this module holds or is to hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub uid: Name,
    /// The pod as last read (or written) carries the finalizer.
    pub has: bool,
    /// The pod carries an egress identity: it wants the finalizer.
    pub live: bool,
    /// `metadata.deletionTimestamp` is set: the API server takes no new finalizer.
    pub deleting: bool,
    /// (identity, location, address) it carried, which must leave NRP before the release.
    pub left: VecSet<(String, String, String)>,
    /// Identities it carried: where it was the last pod, the release waits for the teardown.
    pub identities: Set<String>,
    /// The command in flight (whether it adds) and the backoff.
    pub attempt: Attempt<bool>,
    /// A Warning was sent for the current run of failures.
    pub failing: bool,
}

impl Held {
    fn new(uid: &str) -> Self {
        Self {
            uid: Name::new(uid),
            has: false,
            live: false,
            deleting: false,
            left: VecSet::new(),
            identities: Set::new(),
            attempt: Attempt::new(),
            failing: false,
        }
    }

    /// Records what the pod carried as what must leave before the release.
    fn leave(&mut self, identity: &str, addresses: &Map<String, String>) {
        self.identities.insert(identity.to_owned());
        for (address, location) in addresses {
            self.left.insert((identity.to_owned(), location.clone(), address.clone()));
        }
    }

    /// What the pod's finalizer needs now.
    pub fn want(&self) -> Want {
        if self.live && !self.has && !self.deleting {
            Want::Add
        } else if !self.live && self.has {
            Want::Release
        } else {
            Want::Nothing
        }
    }
}

/// What a pod's finalizer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Add,
    /// Once what it carried has left NRP (the tracker decides when).
    Release,
    Nothing,
}

/// The pod finalizers: the pods held and their work sets (as the lifecycles' in the tracker).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodFinalizers {
    pods: Map<ObjectKey, Held>,
    /// `runnable`: pods whose finalizer is to be decided now; `timers`: pods backing off after a
    /// failed write; `draining`: pods whose release waits for what they carried to leave NRP.
    work: WorkSets<ObjectKey>,
    /// NRP's mirror or an outbound teardown moved since the releasing pods were last looked at.
    recheck: bool,
}

/// The identity and addresses a pod's label and IPs name, whatever its phase: what a pod that
/// holds the finalizer may have left in NRP (start-up recovery).
pub fn named_by(pod: &Pod) -> Carried {
    let identity = pod.egress_label.as_deref()?.to_ascii_lowercase();
    egress::is_valid_identity(&identity).then(|| (identity, egress::pod_addresses(pod).0))
}

impl PodFinalizers {
    /// A pod was read. `before` and `after`: what it carried before and after the read.
    pub fn observe(&mut self, pod: &Pod, before: &Carried, after: &Carried) {
        let key = pod.key();
        let has = pod.finalizers.iter().any(|f| f == FINALIZER);
        let replaced = self.pods.get(&key).is_some_and(|h| !h.uid.as_str().eq_ignore_ascii_case(&pod.uid));
        if replaced {
            // The old object is gone, finalizer and all; its addresses drain as any pod's do.
            self.forget(&key);
        }
        if !self.pods.contains_key(&key) && after.is_none() && !has {
            return;
        }
        let held = self.pods.entry(key.clone()).or_insert_with(|| Held::new(&pod.uid));
        // The same object in another spelling: a write is guarded by the UID as the API server
        // gives it now (the host compares it exactly), as a Service's is.
        held.uid = Name::new(&pod.uid);
        held.has = has;
        held.live = after.is_some();
        held.deleting = pod.deleting;
        if let (Some((identity, addresses)), false) = (before, replaced) {
            let moved = |(address, location): (&String, &String)| {
                after.as_ref().is_none_or(|(i, a)| i != identity || a.get(address) != Some(location))
            };
            let gone = Map::from_iter(addresses.iter().filter(|&p| moved(p)).map(|(a, l)| (a.clone(), l.clone())));
            if !gone.is_empty() || after.as_ref().is_none_or(|(i, _)| i != identity) {
                held.leave(identity, &gone);
            }
        }
        if !held.live
            && has
            && let Some((identity, addresses)) = named_by(pod)
        {
            held.leave(&identity, &addresses);
        }
        self.schedule(&key);
    }

    /// Whether a read of a pod is stale: it is being deleted and its key is held under another
    /// UID for a live pod (one that carries an identity) that holds the finalizer, a replacement
    /// read after it (upstream's order: the same name live under a new UID, then a deletion of
    /// the old UID). The tracker then leaves the held record, what it carries and its count alone.
    /// Upstream decides by the UID a live address is held under; a record here is per pod, so
    /// this is the same question for every address the old pod named at once. Any other record
    /// is replaced by the read as before: a record that carries nothing has nothing live at
    /// stake, and one whose finalizer is not confirmed may still end on a write the API server
    /// refuses for its UID (the object gone), after which the ignored read would act only at the
    /// next re-list (property P3: a re-list changes nothing).
    pub fn superseded(&self, pod: &Pod) -> bool {
        pod.deleting
            && !pod.uid.is_empty()
            && self
                .pods
                .get(&pod.key())
                .is_some_and(|h| h.live && h.has && !h.uid.as_str().eq_ignore_ascii_case(&pod.uid))
    }

    /// A pod stopped carrying what it carried (`before`): it left the API server or the egress
    /// label's selection (`left`), or its identity became an inbound Service's (the pod is
    /// refused, and read again later).
    pub fn gone(&mut self, key: &ObjectKey, before: &Carried, left: bool) {
        let Some(held) = self.pods.get_mut(key) else { return };
        held.live = false;
        if left {
            held.deleting = true; // no new finalizer: it is not watched any more
        }
        if let Some((identity, addresses)) = before {
            held.leave(identity, addresses);
        }
        self.schedule(key);
    }

    /// Puts a pod in the work set its finalizer needs, or forgets it when it needs nothing.
    fn schedule(&mut self, key: &ObjectKey) {
        let Some(held) = self.pods.get_mut(key) else { return };
        if held.attempt.in_flight.is_some() {
            return; // decided again at its outcome
        }
        match held.want() {
            want @ (Want::Add | Want::Release) => {
                // A releasing pod is filed in `draining` whether it is due now or backing off:
                // that set is what a recheck wakes, so a pod outside it would wait for ever.
                if want == Want::Release {
                    self.work.draining.insert(key.clone());
                } else {
                    self.work.draining.remove(key);
                }
                if held.attempt.retries > 0 {
                    self.work.timers.insert(held.attempt.not_before_ms, key);
                } else {
                    self.work.runnable.insert(key.clone());
                }
            }
            Want::Nothing if held.live => {
                // Held and carrying: nothing to do until it stops carrying.
                self.work.draining.remove(key);
                self.work.runnable.remove(key);
                self.work.timers.remove(held.attempt.not_before_ms, key);
                held.attempt.reset();
                held.failing = false;
            }
            Want::Nothing => self.forget(key),
        }
    }

    fn forget(&mut self, key: &ObjectKey) {
        if let Some(held) = self.pods.remove(key)
            && held.attempt.not_before_ms > 0
        {
            self.work.timers.remove(held.attempt.not_before_ms, key);
        }
        self.work.runnable.remove(key);
        self.work.draining.remove(key);
    }

    /// NRP's mirror or an outbound teardown changed: the releasing pods are looked at again.
    pub fn recheck(&mut self) {
        if !self.work.draining.is_empty() {
            self.recheck = true;
        }
    }

    /// Moves the pods whose backoff is over, and (after a recheck) the releasing ones, to the
    /// work set; takes the work set.
    pub fn take_runnable(&mut self, now: u64) -> Set<ObjectKey> {
        self.work.fire(now);
        if std::mem::take(&mut self.recheck) {
            self.work.runnable.extend(self.work.draining.iter().cloned());
        }
        std::mem::take(&mut self.work.runnable)
    }

    /// The pod, if held.
    pub fn get(&self, key: &ObjectKey) -> Option<&Held> {
        self.pods.get(key)
    }

    /// What a runnable pod needs now, `None` when it waits (for its backoff, or for an answer).
    pub fn due(&mut self, key: &ObjectKey, now: u64) -> Option<Want> {
        let held = self.pods.get_mut(key)?;
        if held.attempt.in_flight.is_some() {
            return None;
        }
        if held.attempt.not_before_ms > now {
            self.work.timers.insert(held.attempt.not_before_ms, key);
            return None;
        }
        Some(held.want())
    }

    /// The command for a pod's finalizer was issued as `id`.
    pub fn issued(&mut self, key: &ObjectKey, id: u64, present: bool) -> ObjectRef {
        let held = self.pods.get_mut(key).expect("the caller read it");
        held.attempt.in_flight = Some((id, present));
        ObjectRef {
            kind: "Pod".into(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            uid: held.uid.clone(),
        }
    }

    /// The answer to command `id` for the pod with `uid`. Returns the failure to report (a
    /// Warning on the pod, once per run of failures) and whether to wait `retry` more.
    pub fn answered(
        &mut self,
        key: &ObjectKey,
        uid: &str,
        id: u64,
        failure: Option<&Failure>,
        retry_at: impl FnOnce(u32) -> u64,
    ) -> Option<Failure> {
        let held = self
            .pods
            .get_mut(key)
            .filter(|h| h.uid.as_str().eq_ignore_ascii_case(uid) && h.attempt.in_flight.map(|f| f.0) == Some(id))?;
        let (_, present) = held.attempt.in_flight.take().expect("matched above");
        let Some(failure) = failure else {
            held.has = present;
            held.attempt.retries = 0;
            held.failing = false;
            if !present {
                held.left.clear();
                held.identities.clear();
            }
            self.schedule(key);
            return None;
        };
        let gone = failure.object_gone();
        if gone {
            self.forget(key);
            return None;
        }
        if held.want() == Want::Nothing {
            self.schedule(key);
            return None;
        }
        held.attempt.retry_at(retry_at);
        let first = !std::mem::replace(&mut held.failing, true);
        // What it needs now may differ from what the failed write was for (the pod was read
        // while the write was in flight): it is filed for that.
        self.schedule(key);
        first.then(|| failure.clone())
    }

    /// Nothing to do but wait for an answer or for what a releasing pod waits on.
    /// Pods that carry the finalizer, as last read or written.
    pub fn held_count(&self) -> usize {
        self.pods.values().filter(|held| held.has).count()
    }

    pub fn is_quiet(&self) -> bool {
        self.work.runnable.is_empty() && self.work.timers.is_empty() && !self.recheck
    }

    /// The earliest backoff to wake for.
    pub fn next_timer(&self) -> Option<u64> {
        self.work.next_timer()
    }

    /// No backoff ends later than `latest` (as the tracker's `bring_in_deadlines`).
    pub fn bring_in(&mut self, latest: u64) {
        let pods = &mut self.pods;
        self.work.bring_in(latest, |key| {
            if let Some(held) = pods.get_mut(key) {
                held.attempt.bring_in(latest);
            }
        });
    }

    /// Takes a pod out of every work set, for tests of state checks.
    #[cfg(test)]
    pub(crate) fn unschedule(&mut self, key: &ObjectKey) {
        self.work.runnable.remove(key);
        self.work.draining.remove(key);
        self.work.timers.retain(|_, k| k != key);
    }

    /// The pods held, for reports and the invariant checkers.
    pub fn held(&self) -> impl Iterator<Item = (&ObjectKey, &Held)> {
        self.pods.iter()
    }

    /// For a state import: every pod that needs a write is scheduled; `in_flight` says which
    /// command ids the tracker has in flight for which pod. (A command in flight for a pod no
    /// longer held, or held under another UID, is a stale one whose answer is ignored.)
    pub fn check(&self, in_flight: &Map<u64, &ObjectKey>) -> Result<(), String> {
        let on_timers: VecSet<&ObjectKey> = self.work.timers.iter().map(|(_, k)| k).collect();
        for (key, held) in &self.pods {
            let what = || format!("pod {}/{}", key.namespace, key.name);
            if let Some((id, _)) = held.attempt.in_flight {
                if in_flight.get(&id) != Some(&key) {
                    return Err(format!("{}: its finalizer command {id} is not in flight for it", what()));
                }
                continue;
            }
            let scheduled = self.work.runnable.contains(key) || on_timers.contains(key);
            match held.want() {
                Want::Add if !scheduled => return Err(format!("{} needs its finalizer and is not scheduled", what())),
                Want::Release if !self.work.draining.contains(key) => {
                    return Err(format!("{} is to be released and is not releasing", what()));
                }
                Want::Nothing if !held.live => return Err(format!("{} needs nothing and is still held", what())),
                _ => {}
            }
        }
        for key in self.work.runnable.iter().chain(&self.work.draining).chain(on_timers.iter().copied()) {
            if !self.pods.contains_key(key) {
                return Err(format!("pod {}/{} is in a work set but not held", key.namespace, key.name));
            }
        }
        Ok(())
    }
}
