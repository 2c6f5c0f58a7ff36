//! The tracker's side of egress pods (`super::identities`) and their finalizers
//! (`super::finalizers`): a pod read, refused or gone, and when its finalizer is added or
//! released.

use super::super::inbound::Inbound;
use super::super::nrp::*;
use super::super::outbox::*;
use super::finalizers::{self, Want};
use super::*;
use crate::lifecycle::retry_delay;
use crate::model::*;
use crate::name::Name;

impl EgressSide {
    /// An egress pod was created or changed (the rules are in [`super::identities`]).
    /// `inbound`: the Services' lifecycles (an identity that is a Service's is never an egress
    /// identity: one key space, docs/upstream.md §i.2.7).
    pub(in super::super) fn upsert_pod(
        &mut self,
        pod: &Pod,
        inbound: &Inbound,
        out: &mut EgressOut<'_>,
        step: &mut Step,
    ) {
        let key = pod.key();
        if self.finalizers.superseded(pod) {
            return; // a stale deletion of the object a same-name replacement superseded (`super::finalizers`)
        }
        let carried_before = self.identities.carried_by(&key);
        let before = carried_before.as_ref().map(|(identity, _)| identity.clone());
        let kube = out.kube;
        let inbound = |id: &str| inbound.has(id) || kube.knows_identity(id);
        for (regarding, warning) in self.identities.upsert(pod, inbound, out.nrp.desired()) {
            out.outbox.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
        let carried_after = self.identities.carried_by(&key);
        self.finalizers.observe(pod, &carried_before, &carried_after);
        if carried_after.is_none() && pod.finalizers.iter().any(|f| f == finalizers::FINALIZER) {
            // Held by our finalizer from before this state (a restart): what it carried drains.
            let named = finalizers::named_by(pod).filter(|(id, _)| !inbound(id));
            if let Some((identity, _)) = named.filter(|(id, _)| self.identities.know(id)) {
                out.nrp.touch(&identity);
            }
        }
        let after = carried_after.map(|(identity, _)| identity);
        if before != after {
            for identity in before.iter().chain(&after) {
                self.carried_changed(identity, out);
            }
        }
    }

    /// An inbound identity is known now (a Service, an orphan in NRP): egress pods carrying it
    /// are refused, as they would have been had it been known when they were read
    /// ([`super::identities::Egress::refuse_identity`]).
    pub(in super::super) fn refuse_colliding_pods(&mut self, identity: &str, out: &mut EgressOut<'_>, step: &mut Step) {
        let refused = self.identities.refuse_identity(identity, out.nrp.desired());
        if !refused.is_empty() {
            self.carried_changed(identity, out);
        }
        for (regarding, warning, addresses) in refused {
            let key = ObjectKey { namespace: regarding.namespace.clone(), name: regarding.name.clone() };
            self.finalizers.gone(&key, &Some((identity.to_owned(), addresses)), false);
            out.outbox.event(&regarding, EventType::Warning, warning.reason, warning.message, step);
        }
    }

    // ---- Egress pod finalizers (super::finalizers) ----

    /// Adds the finalizer to the pods that carry an identity, and releases it from those that
    /// carry nothing any more once what they carried has left NRP.
    pub(in super::super) fn advance_pod_finalizers(&mut self, now: u64, out: &mut EgressOut<'_>, step: &mut Step) {
        let runnable = self.finalizers.take_runnable(now);
        let due: Vec<(ObjectKey, Want)> =
            runnable.into_iter().filter_map(|key| self.finalizers.due(&key, now).map(|want| (key, want))).collect();
        let writes: Vec<(ObjectKey, bool)> = {
            // The batches in flight's locations, sorted, once per call rather than once per address
            // a releasing pod carried (a mass deletion releases thousands). No location is in two
            // batches in flight (the import check, `format::check`).
            let mut in_flight: Vec<&NrpLocation> = Vec::new();
            if due.iter().any(|(_, want)| *want == Want::Release) {
                in_flight.extend(out.nrp.batches_in_flight(out.outbox.in_flight()).flatten());
                crate::keyed::sort_by(&mut in_flight, |a, b| a.location.cmp(&b.location));
            }
            due.into_iter()
                .filter_map(|(key, want)| match want {
                    Want::Add => Some((key, true)),
                    Want::Release if self.pod_released(&key, &in_flight, out.nrp) => Some((key, false)),
                    // Waits in `draining` until something changes.
                    Want::Release | Want::Nothing => None,
                })
                .collect()
        };
        for (key, present) in writes {
            let id = out.outbox.next_id();
            let pod = self.finalizers.issued(&key, id, present);
            let what = InFlight::PodFinalizer { key, uid: pod.uid.to_string(), present };
            let finalizer = finalizers::FINALIZER.to_owned();
            out.outbox.issue(Command::SetFinalizer { service: pod, finalizer, present }, what, step);
        }
    }

    /// Whether what a pod carried has left NRP: each of its addresses is unmapped for its
    /// identity (or another pod's now), no batch in flight (`in_flight`, sorted by location)
    /// names the identity there, and an identity no pod carries any more has no outbound
    /// lifecycle left (its teardown ended). A pod none of whose addresses was ever read (it had
    /// no IP when it was seen) waits until its identities have no address left in NRP that no
    /// live pod backs: one of those may have been its own.
    pub(in super::super) fn pod_released(&self, key: &ObjectKey, in_flight: &[&NrpLocation], nrp: &Nrp) -> bool {
        let Some(held) = self.finalizers.get(key) else { return true };
        let in_batch = |identity: &str, location: &str, address: &str| {
            let Ok(at) = in_flight.binary_search_by(|l| l.location.as_str().cmp(location)) else { return false };
            in_flight[at].addresses.iter().any(|a| a.address == address && a.services.iter().any(|s| s == identity))
        };
        held.left.iter().all(|(identity, location, address)| {
            !nrp.awaits_drain(identity, location, address) && !in_batch(identity, location, address)
        }) && held.identities.iter().all(|id| self.identities.carries(id) || !self.outbound.lifecycles.contains_key(id))
            && (!held.left.is_empty() || held.identities.iter().all(|id| !nrp.awaits_any_drain(id)))
    }

    #[allow(clippy::too_many_arguments)]
    pub(in super::super) fn pod_finalizer_outcome(
        &mut self,
        outbox: &mut Outbox,
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
        let what = format!(
            "{} finalizer of pod {}/{}",
            if present { "adding the" } else { "releasing the" },
            key.namespace,
            key.name
        );
        let report = self.finalizers.answered(key, uid, id, failure, |retries| {
            let failure = failure.expect("only a failure is retried");
            now.saturating_add(retry_delay(&format!("{}/{}", key.namespace, key.name), retries, failure, &what, step))
        });
        if let Some(failure) = report {
            let code = failure.code.as_deref().map(|c| format!(", {c}")).unwrap_or_default();
            let message =
                format!("{what} failed (HTTP {}{code}): {}; retrying with backoff", failure.status, failure.message);
            step.logs.push(LogLine { level: LogLevel::Warn, message: message.clone() });
            let regarding = ObjectRef {
                kind: "Pod".into(),
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                uid: Name::new(uid),
            };
            outbox.event(&regarding, EventType::Warning, finalizers::reason::POD_FINALIZER_FAILED, message, step);
        }
    }
}
