//! Property tests of the tracker (docs/upstream.md §j P1–P6) over random sequences of
//! Kubernetes events, injected Azure failures (before and after the change took effect, some
//! with a `Retry-After`, up to `u64::MAX`), restarts, state round trips and a host clock that
//! jumps forward and steps back, against an independent model of Kubernetes and Azure.
//!
//! * P1 — once quiet, NRP equals the ready-filtered Kubernetes state (and the tracker's mirror
//!   equals NRP);
//! * P2 — equal states give an empty sync: a quiet tracker sends nothing more;
//! * P3 — idempotence: seeing every object again changes nothing;
//! * P4 — the egress reference count is never negative and is zero exactly when no pod carries
//!   the identity: after every step it equals the model's count of pods carrying each identity;
//! * P5 — no service is unregistered while an NRP address references it;
//! * P6 — no address references a service NRP does not have registered (inbound or outbound);
//! * and after every step, the round trip: the exported state imports as the same tracker, whose
//!   next step is the original's (`invariants::assert_round_trip`).
//!
//! Egress pods share pod IPs with the endpoints, so addresses carry inbound and egress identities
//! together; two of the labels are registered Outbound services in NRP, one is not, one is
//! reserved and one invalid. An outbound identity that NRP still references when the controller
//! restarts with no pod carrying it is somebody else's to the new process (egress.rs): the model
//! leaves it out of P1 until a pod carries it again.
//!
//! The model and the checks live in `invariants.rs`; this file draws the random sequences.

use crate::invariants::*;
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u8, 0..2u8).prop_map(|(node, variant)| Op::Node { node, variant }),
        1 => (0..4u8).prop_map(|node| Op::DeleteNode { node }),
        3 => (0..3u8, prop::bool::weighted(0.8), prop::sample::select(vec![80u16, 443])).prop_map(|(service, local, port)| Op::Service { service, local, port }),
        1 => (0..3u8).prop_map(|service| Op::DeleteService { service }),
        5 => (0..4u8, 0..3u8, prop::collection::vec((0..6u8, 0..4u8, prop::option::of(any::<bool>())), 0..4))
            .prop_map(|(slice, owner, endpoints)| Op::Slice { slice, owner, endpoints }),
        1 => (0..4u8).prop_map(|slice| Op::DeleteSlice { slice }),
        4 => (0..4u8, 0..4u8).prop_map(|(slice, endpoint)| Op::ToggleReady { slice, endpoint }),
        3 => (0..6u8, 0..LABELS.len() as u8, 0..4u8, 0..PHASES.len() as u8)
            .prop_map(|(pod, label, node, phase)| Op::EgressPod { pod, label, node, phase }),
        1 => (0..6u8).prop_map(|pod| Op::DeleteEgressPod { pod }),
        2 => (1..4u8, any::<bool>(), prop::sample::select(vec![0u16, 409, 429, 500, 503]), prop::sample::select(vec![None, None, Some(2_000u64), Some(u64::MAX)]))
            .prop_map(|(count, after, status, retry_after_ms)| Op::Fail { count, after, status, retry_after_ms }),
        2 => prop_oneof![9 => 0..40_000u32, 1 => Just(3_600_000u32)].prop_map(|ms| Op::Advance { ms }),
        1 => prop::sample::select(vec![1_000u32, 60_000, 3_600_000]).prop_map(|ms| Op::StepBack { ms }),
        1 => Just(Op::Restart),
        1 => Just(Op::RoundTrip),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // Upstream TestGuardUpdateEndpoints_BuffersWhenNotStarted,
    // TestUpdateEndpoints_UntrackedServiceIsNotBuffered, TestEngineMultipleOperations_AfterRestart,
    // TestProcessK8sEndpoints_SkipsNotReadyEndpoints,
    // TestDeleteService_DuringUpdateNoLocations_DispatchesDelete, TestInitializeDiffTracker,
    // TestLocationsUpdaterRetriesAfterSyncFailure, TestUpdateNRPLoadBalancers,
    // TestServiceUpdaterDeleteInboundService_FinalizerFailureRetries, TestGetSyncLoadBalancerServices and
    // TestGetSyncOperations.
    #[test]
    fn after_any_event_sequence_with_failures_nrp_converges_to_kubernetes_and_ordering_holds(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let mut harness = Harness::new();
        for op in &ops {
            harness.run(op);
            prop_assert!(harness.world.violations.is_empty(), "after {op:?}: {:?}", harness.world.violations);
            harness.check_ref_counts();
            harness.check_round_trip();
        }
        harness.settle();
        harness.check();
    }
}
