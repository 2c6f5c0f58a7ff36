//! The logic as its drivers call it: [`Logic`], the guest's `tracker` through whichever
//! implementation — the component behind its supervisor (`Supervisor`, which `clb-host run`
//! drives, and `clb-simulator`'s `ComponentReconciler` around it), or the native library
//! (`clb-simulator`'s `NativeReconciler`, the differential runs). Four calls
//! and the figures, nothing else: what not every implementation has (the backend-pool logic,
//! swaps, a candidate in shadow, traces) is a trait of its own above this one, never a default
//! here that answers "unsupported".

use crate::bindings::clb::reconciler::types as wit;

/// The reconcile logic's calls: a tracker started from a configuration, then fed observations,
/// the outcomes of its commands and the time, each answered with a step.
pub trait Logic {
    /// Why a call failed.
    type Error;
    /// Starts a fresh tracker (at start and on every restart); earlier state is dropped.
    fn start(&mut self, config: &wit::Config) -> Result<(), Self::Error>;
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, Self::Error>;
    /// With ARM's remaining-writes figure on the latest answer among `results` that carried one.
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, Self::Error>;
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, Self::Error>;
    /// What the logic is doing (`tracker.stats`).
    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, Self::Error>;
}

/// The most one `observe` call carries, in [`objects`]. A start-up's lists hold the whole
/// cluster (at AKS's 5,000 nodes, 150,000 pods); handed over in one call, that call's work, its
/// copy into the guest's memory and so the memory's high-water mark grow with the cluster until
/// they meet the per-call deadline and the memory cap. In calls of this size the deadline bounds
/// work, not the cluster's size (`lists-complete` may follow any number of calls). What a call of
/// this size costs, and what the start-up costs in such calls: BENCHMARKS.md, "At AKS's sizes".
pub const MAX_OBJECTS_PER_CALL: usize = 10_000;

/// What an observation weighs against [`MAX_OBJECTS_PER_CALL`]: one, and an EndpointSlice one
/// more per endpoint it lists (a slice may list 1,000).
pub fn objects(observation: &wit::Observation) -> usize {
    match observation {
        wit::Observation::SliceUpserted(slice) => 1 + slice.endpoints.len(),
        _ => 1,
    }
}

/// `batch` cut, in order, into calls of at most [`MAX_OBJECTS_PER_CALL`] objects each; an
/// observation heavier than that on its own is a call of its own. An empty batch is one empty
/// call.
pub fn calls(batch: &[wit::Observation]) -> Vec<&[wit::Observation]> {
    let mut calls = Vec::new();
    let (mut start, mut weight) = (0, 0);
    for (at, observation) in batch.iter().enumerate() {
        let objects = objects(observation);
        if at > start && weight + objects > MAX_OBJECTS_PER_CALL {
            calls.push(&batch[start..at]);
            (start, weight) = (at, 0);
        }
        weight += objects;
    }
    calls.push(&batch[start..]);
    calls
}

/// [`Logic::observe`] of `batch` in [`calls`]: the step of each call but the last goes to
/// `absorb`, in order, and the last call's step is returned, so a driver handles it as it handled
/// the one step of a single call. The first call that fails ends it, its error returned.
pub fn observe_in_calls<L: Logic + ?Sized>(
    logic: &mut L,
    now_ms: u64,
    batch: &[wit::Observation],
    mut absorb: impl FnMut(wit::Step),
) -> Result<wit::Step, L::Error> {
    let calls = calls(batch);
    let (last, earlier) = calls.split_last().expect("calls() gives at least one call");
    for call in earlier {
        absorb(logic.observe(now_ms, call)?);
    }
    logic.observe(now_ms, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(endpoints: usize) -> wit::Observation {
        wit::Observation::SliceUpserted(wit::EndpointSlice {
            namespace: "shop".into(),
            name: "web-abcde".into(),
            owner_service_uid: None,
            address_type: "IPv4".into(),
            endpoints: (0..endpoints)
                .map(|_| wit::Endpoint { addresses: vec!["10.0.0.1".into()], node_name: None, ready: Some(true) })
                .collect(),
            deleting: false,
        })
    }

    fn node() -> wit::Observation {
        wit::Observation::NodeUpserted(wit::Node { name: "node-0".into(), internal_ips: vec!["10.1.0.4".into()] })
    }

    #[test]
    fn a_batch_is_cut_into_calls_under_the_bound_that_keep_its_order_and_its_every_observation() {
        let cases: Vec<(&str, Vec<wit::Observation>, usize)> = vec![
            ("an empty batch is one empty call", vec![], 1),
            ("a small batch is one call", vec![node(), slice(30), wit::Observation::ListsComplete], 1),
            ("exactly the bound is one call", (0..MAX_OBJECTS_PER_CALL).map(|_| node()).collect(), 1),
            ("one over the bound is two", (0..=MAX_OBJECTS_PER_CALL).map(|_| node()).collect(), 2),
            ("slices weigh their endpoints", (0..999).map(|_| slice(29)).collect(), 3),
            ("a slice heavier than the bound goes alone", vec![node(), slice(MAX_OBJECTS_PER_CALL), node()], 3),
        ];
        for (what, batch, expected) in cases {
            let calls = calls(&batch);
            assert_eq!(calls.len(), expected, "{what}");
            assert_eq!(calls.concat(), batch, "{what}: every observation once, in order");
            for call in &calls {
                let weight: usize = call.iter().map(objects).sum();
                assert!(weight <= MAX_OBJECTS_PER_CALL || call.len() == 1, "{what}: a call of {weight} objects");
            }
        }
    }
}
