//! Ports of upstream tests about the egress pod finalizer
//! `servicegateway.azure.com/pod-cleanup` (`super::super::egress::finalizers`): when it is added, when it is
//! released (after the drain; for a last pod, after the teardown), UID guards against replacement
//! pods, retries, and recovery after a restart. Each test names the upstream tests it ports in
//! the comment directly above it (`docs/conformance.md` is generated from those).

use super::super::egress::finalizers::Want;
use super::super::egress::finalizers::{FINALIZER, reason::POD_FINALIZER_FAILED};
use super::upstream_outbound::{
    HOST, IDENTITY, drive, drive_keeping, drive_until, gone, is_delete, is_outbound, is_put_nat_gateway, ok, pod,
    position, provisioned, started,
};
use super::*;
use std::collections::BTreeSet;

/// A pod as the API server shows it once it holds the finalizer.
fn holding(pod: Pod) -> Pod {
    Pod { finalizers: vec![FINALIZER.into()], ..pod }
}

/// The pod being deleted, held by the finalizer.
fn deleting(pod: Pod) -> Pod {
    Pod { deleting: true, ..holding(pod) }
}

/// The pod finalizer commands: (pod name, UID, added).
fn finalizers(issued: &[Command]) -> Vec<(String, String, bool)> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::SetFinalizer { service, finalizer, present } if service.kind.as_str() == "Pod" => {
                assert_eq!(finalizer, FINALIZER);
                Some((service.name.to_string(), service.uid.to_string(), *present))
            }
            _ => None,
        })
        .collect()
}

fn is_release_of(name: &str) -> impl Fn(&Command) -> bool + '_ {
    move |c| matches!(c, Command::SetFinalizer { service, present: false, .. } if service.kind.as_str() == "Pod" && service.name.as_str() == name)
}

/// NRP listing the identity as a registered Outbound service (ours from before a restart).
fn registered() -> NrpService {
    NrpService { name: IDENTITY.into(), service_type: "Outbound".into(), backend_pools: vec![], is_default: false }
}

/// An NRP address bound to the identity.
fn listed(address: &str) -> NrpAddress {
    NrpAddress { address: address.into(), services: vec![IDENTITY.into()] }
}

/// The release of a pod's finalizer under `uid`.
fn release_of(name: &str, uid: &str) -> Command {
    Command::SetFinalizer {
        service: ObjectRef { kind: "Pod".into(), namespace: "batch".into(), name: name.into(), uid: uid.into() },
        finalizer: FINALIZER.into(),
        present: false,
    }
}

fn everything_but_events(command: &Command) -> bool {
    !matches!(command, Command::EmitEvent(_))
}

fn failed(status: u16, code: &str) -> Outcome {
    Outcome::Failed(Failure { status, code: Some(code.into()), retry_after_ms: None, message: "refused".into() })
}

/// [`provisioned`] with a second pod, `q`, carrying the identity at another address.
fn two_pods() -> Tracker {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    drive(&mut tracker, NOW + 1, step, ok);
    tracker
}

// Upstream TestAddPodFinalizer and TestHasPodFinalizer: a pod that carries an identity gets the
// finalizer, named by its UID, beside anybody else's; a pod that already has it (alone or among
// others) gets no write.
#[test]
fn a_pod_that_carries_an_identity_gets_the_finalizer_under_its_uid_and_one_that_has_it_gets_no_write() {
    let mut tracker = started();
    let step = tracker.observe(
        NOW,
        vec![
            Observation::PodUpserted(pod("p", "10.244.2.10")),
            Observation::PodUpserted(holding(pod("q", "10.244.2.11"))),
            // Ours among someone else's: held, no write.
            Observation::PodUpserted(Pod {
                finalizers: vec!["example.com/other".into(), FINALIZER.into()],
                ..pod("r", "10.244.2.12")
            }),
            // Someone else's only: not held, ours is added beside it.
            Observation::PodUpserted(Pod { finalizers: vec!["example.com/other".into()], ..pod("s", "10.244.2.13") }),
        ],
    );
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    let added = [("p".to_owned(), "uid-p".to_owned(), true), ("s".to_owned(), "uid-s".to_owned(), true)];
    assert_eq!(finalizers(&issued), added, "{issued:?}");
    assert!(tracker.is_quiet());
}

// Upstream TestGuardNonLastPodFinalizerRemovedOnlyAfterNRPDrain, TestRemovePodFinalizer, TestPodInformerRemovePod,
// TestCheckPendingPodDeletions, TestGuardFinalizers_PositiveStripRemovesFinalizer, TestEngineDeletePod_DuplicateEventKeepsDrainGate,
// TestOutboundAddressInAnyNRPLocationLocked and TestGuardDeletePod_NonLastEnqueuesPendingPodDeletion: a
// pod that is not its identity's last keeps its finalizer while the batch that drains its address is
// in flight, and loses it (its own UID) once NRP has accepted the drain; nothing is torn down.
#[test]
fn a_non_last_pods_finalizer_is_released_only_after_nrp_accepted_the_drain_of_its_address() {
    let mut tracker = two_pods();
    let deleted = Observation::PodUpserted(deleting(pod("p", "10.244.2.10")));
    // The same event twice (a duplicate, or a resync) keeps the drain gate.
    let step = tracker.observe(NOW + 2, vec![deleted.clone(), deleted]);
    let (before, (id, drain)) = drive_until(&mut tracker, NOW + 2, step, is_location_update);
    assert!(finalizers(&before).is_empty(), "nothing released before the drain: {before:?}");
    let Command::UpdateAddressLocations(locations) = &drain else { unreachable!() };
    assert_eq!(locations[0].addresses[0].address, "10.244.2.10");
    let step = tracker.complete(NOW + 3, vec![(id, Outcome::Ok)]);
    let (after, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    assert_eq!(finalizers(&after), [("p".to_owned(), "uid-p".to_owned(), false)]);
    assert_eq!(after.len(), 1, "no teardown: q still carries the identity: {after:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestGuardFinalizers_PositiveStripRemovesFinalizer,
// TestGuardDeleteOutboundService_RemovesLastPodFinalizerOnlyAfterNATGatewayDeletion,
// TestGuardDeletePod_LastPodWithNamespaceNameTracksLastPodEntry,
// TestGuardRemoveLastPodFinalizersIsScopedToItsService, TestCheckPendingPodDeletions ("skips last pod") and
// TestOutboundWorkflow: the last pod's
// finalizer waits for the drain and the whole teardown, then goes; another identity's pod keeps
// its own.
#[test]
fn the_last_pods_finalizer_is_released_only_after_its_nat_gateway_and_public_ip_are_deleted() {
    let mut tracker = provisioned();
    let other = Pod { egress_label: Some("egress-d".into()), ..pod("other", "10.244.2.20") };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(holding(other))]);
    drive(&mut tracker, NOW + 1, step, ok);
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    let delete_nat = position(&issued, |c| is_delete(c, ResourceKind::NatGateway));
    let delete_pip = position(&issued, |c| is_delete(c, ResourceKind::PublicIp));
    let release = position(&issued, is_release_of("p"));
    assert!(delete_nat < release && delete_pip < release, "{issued:?}");
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "only p's: {issued:?}");
    assert!(
        tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none(),
        "the released pod's record is gone"
    );
}

// Upstream TestGuardDeleteOutboundService_NATDeleteFailureRetainsLastPodFinalizer,
// TestGuardDeleteOutboundService_FinalizerReleasedOnRetryAfterNATFailure and
// TestServiceUpdaterDeleteOutboundService_StepFailuresRetain: a NAT gateway delete that fails keeps the
// last pod's finalizer; the retry that succeeds releases it.
#[test]
fn a_failing_nat_gateway_delete_keeps_the_last_pods_finalizer_until_a_retry_succeeds() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let mut nat_deletes = 0;
    let answer = |c: &Command| {
        if is_delete(c, ResourceKind::NatGateway) {
            nat_deletes += 1;
            if nat_deletes == 1 {
                return failed(500, "InternalServerError");
            }
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, answer, everything_but_events);
    let deletes: Vec<usize> =
        issued.iter().enumerate().filter(|(_, c)| is_delete(c, ResourceKind::NatGateway)).map(|(i, _)| i).collect();
    assert_eq!(deletes.len(), 2, "{issued:?}");
    assert!(position(&issued, is_release_of("p")) > deletes[1], "{issued:?}");
}

// Upstream TestGuardNonLastPodFinalizerRetriesOnTransientUpdateError,
// TestPodInformerRemovePod_QueuesRetryWhenFinalizerRemovalFails,
// TestGuardLocationsUpdaterReschedulesOnReadyFinalizerRemovalFailure,
// TestPodInformerRemovePod_CountsForgottenFinalizerRemoval (differs: a failed release is never forgotten, so
// there is nothing to count; it is retried and warned about),
// TestGuardDeleteOutboundService_FinalizerRemovalFailureReportsFailure, TestGuardCheckPendingPodDeletions_TransientGetErrorKeepsEntryForRetry
// and TestRemoveLastPodFinalizers_SurfacesRetryExhaustion (differs: retried with backoff for as long as it fails,
// no budget to exhaust; the Warning surfaces it): a release that fails is retried with backoff,
// and the operator is told once per run of failures (a Warning Event on the pod).
#[test]
fn a_failed_release_is_retried_with_backoff_and_warned_about_once() {
    let mut tracker = two_pods();
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let mut releases = 0;
    let answer = |c: &Command| {
        if is_release_of("p")(c) {
            releases += 1;
            if releases <= 2 {
                return failed(500, "InternalError");
            }
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, answer, |_| true);
    assert_eq!(issued.iter().filter(|c| is_release_of("p")(c)).count(), 3, "{issued:?}");
    let warnings: Vec<&Command> = issued
        .iter()
        .filter(|c| matches!(c, Command::EmitEvent(e) if e.reason == POD_FINALIZER_FAILED && e.regarding.name.as_str() == "p"))
        .collect();
    assert_eq!(warnings.len(), 1, "{issued:?}");
    assert!(tracker.is_quiet());
}

// Upstream TestPodInformerAddPod_FinalizerAddFailureRegistersAndAlerts and
// TestGuardAddPodFinalizerRetriesOnConflict: a finalizer the API server does not take (a conflict) is
// warned about and tried again, and the pod's address reaches NRP all the same.
#[test]
fn a_finalizer_that_cannot_be_added_is_warned_about_and_retried_and_the_pods_address_still_reaches_nrp() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let mut adds = 0;
    let answer = |c: &Command| {
        if matches!(c, Command::SetFinalizer { present: true, .. }) {
            adds += 1;
            if adds == 1 {
                return failed(409, "Conflict");
            }
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, answer, |_| true);
    assert_eq!(finalizers(&issued).len(), 2, "{issued:?}");
    assert_eq!(
        issued.iter().filter(|c| matches!(c, Command::EmitEvent(e) if e.reason == POD_FINALIZER_FAILED)).count(),
        1
    );
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.10"));
}

// Upstream TestGuardPendingPodDeletion_DoesNotStripReplacementPodFinalizer,
// TestGuardLastPodFinalizer_DoesNotStripReplacementPod, TestGuardRemovePodFinalizerByPod_DoesNotStripReplacementPod,
// TestPodInformerAddPod_SkipsStaleReplacedPod, TestEngineDeletePod_ReplacementUIDNotGatedByStaleRecord,
// TestGuardDeletePodWithoutAddresses_StaleUIDDoesNotRemoveReplacement and
// TestDeletePodWithoutAddresses_KeepsReplacementBufferedAddresses: a pod read under the same name with
// another UID replaces the old record. The replacement gets its own finalizer under its own UID and is
// never released for the old pod's sake; the old pod's late answer changes nothing.
#[test]
fn a_replacement_pod_with_the_same_name_is_never_released_or_stripped_for_the_old_pod() {
    let mut tracker = two_pods();
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (_, (drain, _)) = drive_until(&mut tracker, NOW + 2, step, is_location_update);
    let replacement = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.12") };
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(replacement)]);
    let mut all = step.commands;
    all.extend(tracker.complete(NOW + 4, vec![(drain, Outcome::Ok)]).commands);
    let (issued, _) =
        drive_keeping(&mut tracker, NOW + 4, Step { commands: all, ..Step::default() }, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p2".to_owned(), true)], "{issued:?}");
    let held = tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap();
    assert!(held.has && held.live && held.uid.as_str() == "uid-p2");
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.12"));
    assert!(!tracker.nrp_view()[HOST].contains_key("10.244.2.10"));
}

// Upstream TestDeletePod_BufferedStaleDeleteKeepsSameIPReplacement, TestDeletePod_MatchingUIDStillCancelsBufferedAddress,
// TestDeletePod_BufferedDeleteWithoutIdentityCancelsByAddress,
// TestDeletePodWithoutAddresses_MatchingUIDCancelsBufferedAddresses,
// and TestGuardDeletePodForReplacement_DoesNotDeleteSameServiceNATGateway: a pod whose IP another pod of the same
// identity now has is released with no drain (the address stays in NRP for the other pod) and
// without touching the NAT gateway.
#[test]
fn a_pod_whose_address_another_pod_now_carries_is_released_without_a_drain_or_a_teardown() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.10"))]);
    drive(&mut tracker, NOW + 1, step, ok);
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "{issued:?}");
    assert_eq!(issued.len(), 1, "no drain, no teardown: {issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY));
}

// Upstream TestGuardDeletePod_StaleSameIPDeleteDoesNotRemoveReplacementUID: p is replaced by a pod of the same name
// with another UID at the same address, which gets the finalizer; a stale deletion of the old UID read after that
// (with its IPs, then with them cleared) drains nothing and tears nothing down; the replacement stays counted,
// programmed and held under its own UID (no release pending for it). Its own deletion later drains its address and
// releases it. Differs: upstream also releases the old UID's finalizer (ReleaseNoDrain); here the stale read writes
// nothing (see `super::super::egress::finalizers`: the old object holds no finalizer while the replacement exists, and a write
// would be repeated at every re-list, against P3).
#[test]
fn a_stale_deletion_of_a_replaced_pods_old_uid_drains_releases_and_tears_down_nothing() {
    let mut tracker = provisioned();
    let key = ObjectKey::new("batch", "p");
    let replacement = || Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.10") };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(replacement())]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p2".to_owned(), true)], "{issued:?}");
    assert_eq!(issued.len(), 1, "the same address: no drain: {issued:?}");
    let stale = deleting(pod("p", "10.244.2.10"));
    let cleared = Pod { pod_ips: vec![], pod_ip: None, host_ips: vec![], ..stale.clone() };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(stale), Observation::PodUpserted(cleared)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, |_| true);
    assert!(issued.is_empty(), "no drain, release, teardown or Warning: {issued:?}");
    let held = tracker.egress.finalizers.get(&key).expect("the replacement is held");
    assert_eq!((held.uid.as_str(), held.live, held.has, held.want()), ("uid-p2", true, true, Want::Nothing));
    assert_eq!(tracker.egress().identity_of(&key), Some(IDENTITY));
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert!(tracker.is_quiet());

    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(deleting(replacement()))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    let release = position(&issued, |c| *c == release_of("p", "uid-p2"));
    assert!(position(&issued, is_location_update) < release, "{issued:?}");
    assert!(position(&issued, |c| is_delete(c, ResourceKind::NatGateway)) < release, "the last pod: {issued:?}");
    assert!(!issued.iter().any(|c| *c == release_of("p", "uid-p")), "{issued:?}");
}

// Upstream TestRecoverStuckFinalizers_SeedsAllDualStackAddresses, TestCheckInitializationComplete_WaitsForPendingPodDeletions,
// TestFinalizerRecoveryGapClosesOnAsyncRemoval, TestGuardDeletePod_LocalStateMissingNRPDualStackLastReconstructsServiceCleanup,
// TestGuardDeletePod_LocalStateMissingNRPOnlySurvivorSchedulesServiceCleanup,
// TestPodInformerRemovePod_LocalStateMissingButNRPAddressPresentKeepsFinalizer, TestCheckPendingPodDeletions and
// TestGuardDeletePod_RecoveredDeletePreservesInFlightDeletionForLiveReregistration: after a restart (no
// state), a dual-stack pod being deleted that still holds the finalizer (read again, a duplicate, and then with
// its IPs cleared, before NRP drains) is released only once NRP has dropped both its addresses and, its identity being ours and carried by no pod, once the teardown
// the start-up inventory started has ended.
#[test]
fn after_a_restart_a_deleting_pod_holding_the_finalizer_waits_for_both_its_addresses_and_the_teardown() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let dual = Pod {
        pod_ips: vec!["10.244.2.10".into(), "fd00:10::a".into()],
        host_ips: vec![HOST.into(), "fd00::6".into()],
        ..deleting(pod("p", "10.244.2.10"))
    };
    let node = Node { name: "n".into(), internal_ips: vec![HOST.into(), "fd00::6".into()] };
    let step = tracker.observe(
        NOW,
        vec![Observation::NodeUpserted(node), Observation::PodUpserted(dual.clone()), Observation::ListsComplete],
    );
    let read = step.commands[0].id;
    let snapshot = NrpState {
        services: vec![registered()],
        locations: vec![
            NrpListedLocation { location: HOST.into(), addresses: vec![listed("10.244.2.10")] },
            NrpListedLocation { location: "fd00::6".into(), addresses: vec![listed("fd00:10::a")] },
        ],
    };
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    let inventory_read = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("the inventory").id;
    let inventory = ArmInventory {
        nat_gateways: vec![ListedNatGateway {
            name: IDENTITY.into(),
            public_ips: vec![format!("{IDENTITY}-pip")],
            public_ips_v6: vec![format!("{IDENTITY}-pip-v6")],
            associated: true,
            as_put: true,
        }],
        ..ArmInventory::default()
    };
    let mut all = tracker.complete(NOW, vec![(inventory_read, Outcome::ArmInventory(inventory))]).commands;
    // Before NRP drains: the same terminating pod again (a duplicate), then with its IPs cleared by the kubelet.
    let cleared = Pod { pod_ips: vec![], pod_ip: None, ..dual.clone() };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(dual), Observation::PodUpserted(cleared)]);
    all.extend(step.commands);
    let step = Step { commands: all, ..Step::default() };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    let drained: BTreeSet<&str> = issued
        .iter()
        .filter_map(|c| match c {
            Command::UpdateAddressLocations(l) => Some(l),
            _ => None,
        })
        .flatten()
        .map(|l| l.location.as_str())
        .collect();
    assert_eq!(drained, BTreeSet::from([HOST, "fd00::6"]), "both families drained: {issued:?}");
    let release = position(&issued, is_release_of("p"));
    assert!(position(&issued, |c| is_delete(c, ResourceKind::NatGateway)) < release, "{issued:?}");
    assert!(issued.iter().rposition(is_location_update).unwrap() < release, "{issued:?}");
    assert!(tracker.nrp_view().values().all(|a| a.is_empty()));
}

// Upstream TestRecoverStuckFinalizers_NoIPPodUsesServiceDrainVerification, TestPodInformerRemovePod,
// TestPodInformerRemovePod_NoIPPodFinalizerRemovedDirectly,
// TestPodInformerRemovePod_NoIPDeleteKeepsFinalizerWhileDrainPending,
// TestPodInformerRemovePod_NoIPDeleteStripsUntrackedPod and TestPodInformerRemovePod_NoIPLastPodWaitsForServiceDeletion: a pod that
// never had an IP has no address to drain: it is released at once while another pod carries its
// identity and every address of the identity in NRP is a live pod's, and, as the last pod, once
// the identity's teardown has ended.
#[test]
fn a_pod_with_no_ip_is_released_at_once_unless_it_is_the_last_whose_teardown_it_waits_for() {
    let mut tracker = two_pods();
    let no_ip = Pod { pod_ips: vec![], phase: Some("Pending".into()), ..pod("n", "") };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(no_ip.clone())]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("n".to_owned(), "uid-n".to_owned(), true)]);
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(deleting(no_ip.clone()))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    assert_eq!(
        issued,
        [Command::SetFinalizer {
            service: ObjectRef { kind: "Pod".into(), namespace: "batch".into(), name: "n".into(), uid: "uid-n".into() },
            finalizer: FINALIZER.into(),
            present: false,
        }]
    );
    // The last pod with no IP: the others go first, then it waits for the teardown.
    let step = tracker.observe(NOW + 4, vec![gone("n"), Observation::PodUpserted(no_ip.clone())]);
    drive(&mut tracker, NOW + 4, step, ok);
    let step = tracker.observe(NOW + 5, vec![gone("p"), gone("q")]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 5, step, ok, everything_but_events);
    assert!(issued.iter().all(|c| !is_release_of("n")(c)), "n still carries the identity: {issued:?}");
    let step = tracker.observe(NOW + 6, vec![Observation::PodUpserted(deleting(no_ip))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 6, step, ok, everything_but_events);
    assert!(position(&issued, |c| is_delete(c, ResourceKind::NatGateway)) < position(&issued, is_release_of("n")));
}

// Upstream TestGuardRemovePodFinalizerByPod_DoesNotStripReplacementPod, its stale-UID half: a release the
// host's UID guard refuses (409 UIDMismatch: the name holds a replacement pod) is done, as a 404 is: the
// record ends, nothing is retried, and nothing is written for the replacement under the old UID.
#[test]
fn a_release_refused_because_the_name_holds_a_replacement_pod_ends_the_record() {
    let mut tracker = two_pods();
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let answer = |c: &Command| if is_release_of("p")(c) { failed(409, crate::model::UID_MISMATCH) } else { ok(c) };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, answer, |_| true);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "once: {issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(!issued.iter().any(|c| matches!(c, Command::EmitEvent(_))), "no Warning: the pod is gone");
    assert!(tracker.is_quiet());
}

// Upstream TestPodInformerRemovePod_NoIPDeleteWaitsForUnbackedNRPAddress: a pod deleted with no IP
// read keeps its finalizer while NRP maps its identity at an address no live pod backs (that
// address may have been its own, cleared by the kubelet before it was read), and is released
// once NRP no longer does.
#[test]
fn a_pod_with_no_ip_waits_while_nrp_maps_its_identity_at_an_address_no_live_pod_backs() {
    let mut tracker = two_pods();
    let no_ip = Pod { pod_ips: vec![], phase: Some("Failed".into()), ..pod("n", "") };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(no_ip.clone())]);
    drive(&mut tracker, NOW + 2, step, ok);
    // q leaves; the batch that drains its address has no answer yet: NRP still maps it.
    let step = tracker.observe(NOW + 3, vec![gone("q")]);
    let (_, (drain, _)) = drive_until(&mut tracker, NOW + 3, step, is_location_update);
    let step = tracker.observe(NOW + 4, vec![Observation::PodUpserted(deleting(no_ip))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 4, step, ok, everything_but_events);
    assert!(finalizers(&issued).is_empty(), "10.244.2.11 is unbacked in NRP: {issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.11"].contains(IDENTITY));
    let step = tracker.complete(NOW + 5, vec![(drain, Outcome::Ok)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 5, step, ok, everything_but_events);
    // q's own release (by its UID) waited for the same drain.
    let released = [("n".to_owned(), "uid-n".to_owned(), false), ("q".to_owned(), "uid-q".to_owned(), false)];
    assert_eq!(finalizers(&issued), released);
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created, "p still carries the identity");
}

// Upstream TestPodInformerRemovePod_ReleasesFinalizerWhenLabelValueEmptied (a pod with an empty label holding only
// someone else's finalizer gets no write), TestPodInformerRemovePod_UntrackedPodFinalizerRemovedDirectly and
// TestCheckPendingPodDeletions ("pod not found cleans up tracking"): a pod whose
// label is emptied is released after its address drains; one that leaves the label's selection
// (the host sees a delete) is released by its UID too, and a release answered 404 (the pod is gone
// already) ends its record.
#[test]
fn a_pod_whose_label_is_emptied_or_removed_is_released_after_its_address_drains() {
    let mut tracker = two_pods();
    // A pod with an empty label that holds only someone else's finalizer is left alone.
    let foreign = Pod {
        egress_label: Some(String::new()),
        finalizers: vec!["example.com/other".into()],
        ..pod("f", "10.244.2.40")
    };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(foreign)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, |_| true);
    assert!(issued.is_empty(), "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "f")).is_none());
    let emptied = Pod { egress_label: Some(String::new()), ..holding(pod("p", "10.244.2.10")) };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(emptied)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    assert!(position(&issued, is_location_update) < position(&issued, is_release_of("p")), "{issued:?}");
    let step = tracker.observe(NOW + 3, vec![gone("q")]);
    let answer = |c: &Command| if is_release_of("q")(c) { failed(404, "NotFound") } else { ok(c) };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, answer, everything_but_events);
    assert_eq!(issued.iter().filter(|c| is_release_of("q")(c)).count(), 1, "a 404 is not retried: {issued:?}");
    assert!(tracker.egress.finalizers.held().next().is_none());
    assert!(tracker.is_quiet());
}

// Upstream TestAddPodPreservesFinalizerOnEgressIdentityChange,
// TestReconcileEgressPodUpdate_LiveReRegistrationKeepsFinalizerAndReAdds and
// TestPodInformerDrainForReplace_LiveReRegistrationDoesNotStripFinalizer: a pod whose label moves to
// another identity keeps its finalizer (it still carries one).
#[test]
fn a_pod_whose_identity_changes_keeps_its_finalizer() {
    let mut tracker = provisioned();
    let moved = Pod { egress_label: Some("egress-d".into()), ..holding(pod("p", "10.244.2.10")) };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(moved)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    assert!(finalizers(&issued).is_empty(), "{issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains("egress-d"));
}

// A state exported with a pod's release waiting and its add in flight imports as the same tracker
// (version 7); a version-6 state imports with no pod held; a state whose pod waits in no work set
// is refused.
#[test]
fn pod_finalizers_survive_a_state_round_trip_and_a_version_6_state_has_none() {
    let mut tracker = two_pods();
    let step = tracker.observe(
        NOW + 2,
        vec![
            Observation::PodUpserted(deleting(pod("p", "10.244.2.10"))),
            Observation::PodUpserted(pod("r", "10.244.2.13")),
        ],
    );
    assert!(!finalizers(&step.commands.iter().map(|c| c.command.clone()).collect::<Vec<_>>()).is_empty());
    let (version, payload) = tracker.export_state();
    assert_eq!(version, STATE_VERSION);
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    let v6 = Tracker::import_state(clb(), 6, &tracker.export_state_as(6)).unwrap();
    assert!(v6.egress.finalizers.held().next().is_none());
    let mut broken = tracker.egress.finalizers.clone();
    broken.unschedule(&ObjectKey::new("batch", "p"));
    let mut state = tracker.clone();
    state.egress.finalizers = broken;
    let payload = state.export_state_as(7);
    let why = corrupt(Tracker::import_state(clb(), 7, &payload));
    assert!(why.contains("is to be released and is not releasing"), "{why}");
    // A command in flight that the pod's record waits for, filed under another pod.
    let mut state = tracker.clone();
    let filed = state.outbox.in_flight.values_mut().find_map(|f| match f {
        InFlight::PodFinalizer { key, .. } if key.name.as_str() == "r" => Some(key),
        _ => None,
    });
    *filed.expect("r's add is in flight") = ObjectKey::new("batch", "q");
    let why = corrupt(Tracker::import_state(clb(), STATE_VERSION, &state.export_state().1));
    assert!(why.contains("pod batch/r: its finalizer command") && why.contains("is not in flight for it"), "{why}");
}

// Upstream TestGuardDeletePod_InvalidParamsIsNoOp and TestGuardDeletePod_UntrackedAndAbsentFromNRPExplicitlyReleases: the
// deletion of a pod the tracker never held writes nothing, and a pod that holds the finalizer but carries
// nothing the tracker could have programmed (its label is no valid identity) is released at once.
#[test]
fn a_pod_never_held_costs_nothing_and_one_holding_the_finalizer_for_nothing_is_released_at_once() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![gone("nobody")]);
    assert!(step.commands.is_empty(), "{:?}", step.commands);
    let untracked = Pod { egress_label: Some("Not A Valid Identity!".into()), ..deleting(pod("u", "10.244.2.30")) };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(untracked)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("u".to_owned(), "uid-u".to_owned(), false)], "{issued:?}");
    assert_eq!(issued.len(), 1, "{issued:?}");
}

// Upstream TestGuardDeletePod_PodDeletedAfterCreateDispatchIsDrainGated and
// TestGuardDeletePod_NonLastBufferedPodAfterCreateDispatchIsDrainGated: a pod deleted while the batch that adds
// its address is in flight is not released on the strength of NRP's mirror (which does not have the address
// yet): it waits for that batch's answer and for the drain after it.
#[test]
fn a_pod_deleted_while_the_batch_adding_its_address_is_in_flight_waits_for_that_batch_and_the_drain() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(holding(pod("q", "10.244.2.11")))]);
    let (_, (adding, _)) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("q", "10.244.2.11")))]);
    assert!(finalizers(&step.commands.iter().map(|c| c.command.clone()).collect::<Vec<_>>()).is_empty());
    let step = tracker.complete(NOW + 3, vec![(adding, Outcome::Ok)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    let drain = position(&issued, is_location_update);
    assert!(drain < position(&issued, is_release_of("q")), "{issued:?}");
    assert!(!tracker.nrp_view()[HOST].contains_key("10.244.2.11"));
}

// Upstream TestEngineOnServiceCreationComplete_LateLastPodFinalizerRedispatches,
// TestGuardDeletePod_PodDeletedAfterCreateDispatchIsDrainGated, TestEngineDeletePod_LastBufferedPodSchedulesDeletion
// and TestGuardDeletePod_PodDeletedWhileBuffered_EnqueuesNoRecord (differs: the pod is held for the teardown of
// what the creation made, not released at once): the last pod deleted while its identity's NAT gateway is being
// created is released (under its UID) once the creation's command has finished and the teardown that follows it
// has ended; its address, waiting for the creation, is never sent.
#[test]
fn the_last_pod_deleted_during_its_identitys_creation_is_released_after_the_teardown_that_follows() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (put, _)) =
        drive_until(&mut tracker, NOW, step, |c| matches!(c, Command::PutNatGateway(n) if n.associated));
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    assert!(finalizers(&step.commands.iter().map(|c| c.command.clone()).collect::<Vec<_>>()).is_empty());
    let step = tracker.complete(NOW + 2, vec![(put, Outcome::Ok)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    assert!(position(&issued, |c| is_delete(c, ResourceKind::NatGateway)) < position(&issued, is_release_of("p")));
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)]);
    let sent = |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.addresses.iter().any(|a| a.address == "10.244.2.10")));
    assert!(!issued.iter().any(sent), "the address waited for the creation and is never sent: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none(), "no record left");
}

// Upstream TestGuardDeletePod_LocalStateMissingNRPWithLiveOrBufferedPodIsNonLast: after a restart, a deleting pod
// that still holds the finalizer, whose identity a live pod carries, is released once its own address has
// drained; the identity is not torn down.
#[test]
fn after_a_restart_a_held_pod_whose_identity_a_live_pod_carries_is_released_after_its_drain_alone() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let observed = vec![
        Observation::PodUpserted(deleting(pod("p", "10.244.2.10"))),
        Observation::PodUpserted(holding(pod("q", "10.244.2.11"))),
        Observation::ListsComplete,
    ];
    let step = tracker.observe(NOW, observed);
    let snapshot = NrpState {
        services: vec![registered()],
        locations: vec![NrpListedLocation {
            location: HOST.into(),
            addresses: vec![listed("10.244.2.10"), listed("10.244.2.11")],
        }],
    };
    let answer = |c: &Command| if *c == Command::ReadNrp { Outcome::NrpSnapshot(snapshot.clone()) } else { ok(c) };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, answer, everything_but_events);
    assert!(position(&issued, is_location_update) < position(&issued, is_release_of("p")), "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_) | Command::UpdateServices(_))), "{issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
}

// Regression: fuzz target differential (fuzz/regressions/differential/
// finalizer-add-failed-after-the-pod-was-read-deleting-*). The add of a pod's finalizer took
// effect but its answer was a failure (a lost response), and meanwhile the pod was read holding
// the finalizer and being deleted: the failure put the pod on its backoff timer alone, outside the
// releasing set that a change to NRP wakes. The exported state was refused by its own import
// ("is to be released and is not releasing"), and once the backoff was over the pod, still not
// drained, was never looked at again: it stayed Terminating for ever.
#[test]
fn a_pod_whose_finalizer_add_fails_after_it_was_read_holding_it_and_deleting_is_released_after_its_drain() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let is_add_of_q =
        |c: &Command| matches!(c, Command::SetFinalizer { service, present: true, .. } if service.name.as_str() == "q");
    let (_, (add, _)) = drive_until(&mut tracker, NOW + 1, step, is_add_of_q);
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("q", "10.244.2.11")))]);
    let mut pending: Vec<(u64, Command)> = step.commands.iter().map(|c| (c.id, c.command.clone())).collect();
    let step = tracker.complete(NOW + 3, vec![(add, failed(500, "InternalError"))]);
    pending.extend(step.commands.iter().map(|c| (c.id, c.command.clone())));
    let (version, payload) = tracker.export_state();
    let imported = Tracker::import_state(clb(), version, &payload).expect("the exported state imports");
    assert_eq!(imported, tracker);
    // The backoff ends before the drain is answered: the release must still follow the drain.
    let later = NOW + 3 + timing::RESYNC_INTERVAL_MS / 4;
    let step = tracker.tick(later);
    assert!(!step.commands.iter().any(|c| is_release_of("q")(&c.command)), "released before its drain: {step:?}");
    pending.extend(step.commands.iter().map(|c| (c.id, c.command.clone())));
    let results = pending.iter().map(|(id, c)| (*id, ok(c))).collect();
    let step = tracker.complete(later, results);
    let (issued, _) = drive_keeping(&mut tracker, later, step, ok, everything_but_events);
    assert!(issued.iter().any(is_release_of("q")), "q is released once its address left NRP: {issued:?}");
    assert!(!tracker.nrp_view()[HOST].contains_key("10.244.2.11"));
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "q")).is_none(), "nothing left held");
}

// Regression: fuzz smoke, tracker target (fuzz/regressions/tracker/
// a-pod-read-again-with-its-uid-in-another-spelling). A pod was read with its UID in one spelling
// and then, being deleted and holding the finalizer, in another: the tracker took it for the same
// object (UIDs compare case-insensitively) but kept the first spelling, and its release, guarded
// by that UID, was refused by the API server as another object's (409 UIDMismatch). The record
// ended there and the pod stayed Terminating for ever.
#[test]
fn a_pod_read_again_with_its_uid_in_another_spelling_is_released_under_the_spelling_read_last() {
    let mut tracker = provisioned();
    let upper = Pod { uid: "UID-Q".into(), ..pod("q", "10.244.2.11") };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(upper)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("q".to_owned(), "UID-Q".to_owned(), true)]);
    let lower = Pod { uid: "uid-q".into(), ..deleting(pod("q", "10.244.2.11")) };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(lower)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("q".to_owned(), "uid-q".to_owned(), false)], "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "q")).is_none(), "nothing left held");
}

// Upstream TestGuardDeletePod_PodDeletedWhileBuffered_EnqueuesNoRecord and
// TestPodInformerRemovePod_BufferedPodFinalizerRemovedByCaller: a pod holding the finalizer that is deleted
// before anything was written for its identity is released at once, not stranded: no drain, no creation,
// no teardown, and no record left.
#[test]
fn a_pod_deleted_before_anything_was_written_for_its_identity_is_released_at_once() {
    let mut tracker = started();
    let observed = vec![
        Observation::PodUpserted(holding(pod("p", "10.244.2.10"))),
        Observation::PodUpserted(deleting(pod("p", "10.244.2.10"))),
    ];
    let step = tracker.observe(NOW, observed);
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "{issued:?}");
    assert_eq!(issued.len(), 1, "nothing but the release: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(tracker.is_quiet());
}

// Upstream TestReconcileEgressPodUpdate_SolePodIPReplacementKeepsNATGateway and
// TestPodInformerDrainForReplace_LiveReRegistrationDoesNotStripFinalizer: a live pod whose IP changes
// within its identity keeps its finalizer and, sole pod or not, its identity: the new address is
// programmed, the old one drained, and nothing is torn down in between.
#[test]
fn a_live_pod_whose_ip_changes_keeps_its_finalizer_and_its_identitys_nat_gateway() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(holding(pod("p", "10.244.2.12")))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, |_| true);
    let teardown = |c: &Command| {
        matches!(c, Command::DeleteResource(_))
            || is_outbound(c, None, true)
            || is_outbound(c, None, false)
            || is_put_nat_gateway(c, false)
    };
    assert!(!issued.iter().any(teardown), "the sole pod's identity stays: {issued:?}");
    assert!(finalizers(&issued).is_empty(), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.12"]);
    let held = tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap();
    assert!(held.has && held.live && held.uid.as_str() == "uid-p");
    // Not the last pod: q carries the identity too; p's address changes again.
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(holding(pod("q", "10.244.2.11")))]);
    drive(&mut tracker, NOW + 2, step, ok);
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(holding(pod("p", "10.244.2.13")))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, |_| true);
    assert!(!issued.iter().any(teardown), "{issued:?}");
    assert!(finalizers(&issued).is_empty(), "the drain of the old address strips nothing: {issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11", "10.244.2.13"]);
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_some_and(|h| h.has && h.live));
}

// Upstream TestCheckPendingPodDeletions_PreservesReplacementPodEntry: the old pod's release is in flight when
// a same-name replacement (another UID) is read; the release's answer does not clobber the replacement's
// record: the replacement gets its own finalizer and its address reaches NRP.
#[test]
fn a_release_answered_after_a_replacement_was_read_leaves_the_replacements_record_alone() {
    let mut tracker = two_pods();
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (_, (release, _)) = drive_until(&mut tracker, NOW + 2, step, is_release_of("p"));
    let replacement = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.12") };
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(replacement)]);
    let mut all = step.commands;
    all.extend(tracker.complete(NOW + 4, vec![(release, Outcome::Ok)]).commands);
    let (issued, _) =
        drive_keeping(&mut tracker, NOW + 4, Step { commands: all, ..Step::default() }, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p2".to_owned(), true)], "{issued:?}");
    let held = tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap();
    assert!(held.has && held.live && held.uid.as_str() == "uid-p2", "{held:?}");
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.12"));
    assert!(tracker.is_quiet());
}

// Upstream TestPodInformerRemovePod_NoIPDeleteKeepsFinalizerWhileDrainPending: a pod deleted with its IP
// (its drain in flight) and then read again deleting with its IPs cleared by the kubelet keeps its
// finalizer until the earlier drain is answered.
#[test]
fn a_deleted_pod_read_again_with_its_ips_cleared_keeps_its_finalizer_until_the_earlier_drain_is_answered() {
    let mut tracker = two_pods();
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (before, (drain, _)) = drive_until(&mut tracker, NOW + 2, step, is_location_update);
    assert!(finalizers(&before).is_empty(), "{before:?}");
    let cleared = Pod { pod_ips: vec![], ..deleting(pod("p", "")) };
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(cleared)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    assert!(finalizers(&issued).is_empty(), "released before the drain: {issued:?}");
    let step = tracker.complete(NOW + 4, vec![(drain, Outcome::Ok)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 4, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "{issued:?}");
    assert!(!tracker.nrp_view()[HOST].contains_key("10.244.2.10"));
}

// Upstream TestPodInformerRemovePod_NoIPLastPodWaitsForServiceDeletion: the last pod of its identity, its
// address in NRP, is deleted with its IPs cleared: its stale address is drained by the pod's record, then
// the identity is torn down, then the finalizer goes.
#[test]
fn the_last_pod_deleted_with_its_ips_cleared_is_drained_torn_down_and_then_released() {
    let mut tracker = provisioned();
    let cleared = Pod { pod_ips: vec![], ..deleting(pod("p", "")) };
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(cleared)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    // Its address was the location's only one: the drain deletes the whole location.
    let drains =
        |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.location == HOST));
    let drain = position(&issued, drains);
    let delete_nat = position(&issued, |c| is_delete(c, ResourceKind::NatGateway));
    let release = position(&issued, is_release_of("p"));
    assert!(drain < delete_nat && delete_nat < release, "{issued:?}");
    assert!(tracker.nrp_view().values().all(|a| a.is_empty()));
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestGuardLastPodFinalizer_DoesNotStripReplacementPod: the old pod is its identity's last and the
// teardown is running when a same-name replacement (another UID) is read: the teardown's end releases
// nothing, for the old pod or the replacement, and the replacement is held under its own UID.
#[test]
fn a_replacement_read_during_the_last_pods_teardown_is_never_stripped_when_the_teardown_ends() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    let (before, (delete, _)) = drive_until(&mut tracker, NOW + 1, step, |c| is_delete(c, ResourceKind::NatGateway));
    assert!(finalizers(&before).is_empty(), "{before:?}");
    let replacement = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.12") };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(replacement)]);
    let mut all = step.commands;
    all.extend(tracker.complete(NOW + 3, vec![(delete, Outcome::Ok)]).commands);
    let (issued, _) =
        drive_keeping(&mut tracker, NOW + 3, Step { commands: all, ..Step::default() }, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p2".to_owned(), true)], "{issued:?}");
    let held = tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap();
    assert!(held.has && held.live && held.uid.as_str() == "uid-p2", "{held:?}");
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.12"), "the identity is made again for the replacement");
    assert!(tracker.is_quiet());
}

// Upstream TestAddPodFinalizer (a pod re-read without the finalizer gets it again; an add refused for a replaced
// pod is not retried) and TestPodInformerAddPod_SkipsStaleReplacedPod: an add the host's UID guard refuses
// (409 UIDMismatch: the name holds a replacement) ends the stale pod's record; once the replacement is read,
// only its address is in NRP and only its record is held.
#[test]
fn a_pod_read_without_the_finalizer_gets_it_again_and_an_add_refused_for_a_replaced_pod_ends_its_record() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("q".to_owned(), "uid-q".to_owned(), true)]);
    // Read again without it (stripped, or the earlier read was stale): added again.
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events);
    assert_eq!(finalizers(&issued), [("q".to_owned(), "uid-q".to_owned(), true)]);
    // A stale read of p (uid-old) while the API server holds a replacement.
    let stale = Pod { uid: "uid-old".into(), ..pod("p", "10.244.2.10") };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(stale)]);
    let (_, (add, _)) = drive_until(&mut tracker, NOW + 2, step, |c| finalizers(std::slice::from_ref(c)).len() == 1);
    let mut all = tracker.complete(NOW + 3, vec![(add, failed(409, crate::model::UID_MISMATCH))]).commands;
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none(), "the stale record ended");
    let replacement = Pod { uid: "uid-new".into(), ..pod("p", "10.244.2.12") };
    all.extend(tracker.observe(NOW + 3, vec![Observation::PodUpserted(replacement)]).commands);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, Step { commands: all, ..Step::default() }, ok, |_| true);
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-new".to_owned(), true)], "no retry for uid-old: {issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::EmitEvent(_))), "no Warning: the stale pod is gone");
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.12"));
    assert!(!tracker.nrp_view()[HOST].contains_key("10.244.2.10"), "the stale address is not (or no longer) in NRP");
    assert_eq!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap().uid.as_str(), "uid-new");
}

// Upstream TestPodInformerRemovePod: a Failed pod, with its IP, that is deleted goes through the drain gate
// like any other: its finalizer is kept until NRP has accepted the drain of its address; a pod with a PodIP but
// no HostIP (nothing of it was programmed) is released with no drain.
#[test]
fn a_failed_pod_deleted_with_its_ip_is_released_only_after_its_drain() {
    let mut tracker = two_pods();
    let failed_pod = Pod { phase: Some("Failed".into()), ..deleting(pod("p", "10.244.2.10")) };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(failed_pod)]);
    let (before, (id, drain)) = drive_until(&mut tracker, NOW + 2, step, is_location_update);
    assert!(finalizers(&before).is_empty(), "nothing released before the drain: {before:?}");
    let Command::UpdateAddressLocations(locations) = &drain else { unreachable!() };
    assert_eq!(locations[0].addresses[0].address, "10.244.2.10");
    let step = tracker.complete(NOW + 3, vec![(id, Outcome::Ok)]);
    let (after, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, everything_but_events);
    assert_eq!(finalizers(&after), [("p".to_owned(), "uid-p".to_owned(), false)]);
    let no_host = Pod { host_ips: vec![], ..holding(pod("r", "10.244.2.14")) };
    let step = tracker.observe(NOW + 4, vec![Observation::PodUpserted(no_host.clone())]);
    drive(&mut tracker, NOW + 4, step, ok);
    let step = tracker.observe(NOW + 5, vec![Observation::PodUpserted(Pod { deleting: true, ..no_host })]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 5, step, ok, everything_but_events);
    assert_eq!(issued, [release_of("r", "uid-r")], "no drain: {issued:?}");
}

// Upstream TestPodInformerRemovePod_UntrackedPodFinalizerRemovedDirectly: after a restart, a deleting pod
// holding the finalizer whose address NRP does not list and whose identity has nothing in Azure is released at
// once: no drain, no teardown.
#[test]
fn after_a_restart_a_deleting_pod_nrp_does_not_map_is_released_at_once() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let observed = vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10"))), Observation::ListsComplete];
    let step = tracker.observe(NOW, observed);
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    assert_eq!(issued, [Command::ReadNrp, release_of("p", "uid-p")], "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(tracker.is_quiet());
}

// Upstream TestPodInformerAddPod_FinalizerAddFailureRegistersAndAlerts (differs: the Warning's reason is
// ServiceGatewayPodFinalizerFailed and there is no failure counter): while the finalizer cannot be added at
// all, the pod's address is programmed in NRP, and the operator is warned once for the run of failures.
#[test]
fn a_pods_address_reaches_nrp_while_its_finalizer_cannot_be_added_at_all() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let answer = |c: &Command| {
        if matches!(c, Command::SetFinalizer { present: true, .. }) { failed(500, "InternalError") } else { ok(c) }
    };
    // Every add fails (and is retried for ever): answer until the address is in NRP.
    let (mut step, mut now, mut issued) = (step, NOW, Vec::new());
    for _ in 0..100 {
        if tracker.nrp_view().get(HOST).is_some_and(|a| a.contains_key("10.244.2.10")) {
            break;
        }
        if step.commands.is_empty() {
            now = step.wake_at_ms.expect("a retry is due");
            step = tracker.tick(now);
            continue;
        }
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        issued.extend(step.commands.iter().map(|c| c.command.clone()));
        step = tracker.complete(now, results);
    }
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.10"), "{issued:?}");
    assert!(!finalizers(&issued).is_empty(), "{issued:?}");
    let warnings = issued.iter().filter(|c| matches!(c, Command::EmitEvent(e) if e.reason == POD_FINALIZER_FAILED));
    assert_eq!(warnings.count(), 1, "{issued:?}");
    let held = tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).unwrap();
    assert!(!held.has && held.live, "{held:?}");
}

// Upstream TestOutboundAddressInAnyNRPLocationLocked (its "different service" and "services is nil" cases):
// after a restart, deleting pods holding the finalizer whose addresses NRP maps only for another service, or
// for none, are released with no drain: nothing of their identity is in NRP. The other service's mapping
// stays.
#[test]
fn after_a_restart_pods_whose_addresses_nrp_maps_only_for_another_service_or_none_are_released_without_a_drain() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let observed = vec![
        Observation::PodUpserted(deleting(pod("p", "10.244.2.10"))),
        Observation::PodUpserted(deleting(pod("q", "10.244.2.11"))),
        Observation::ListsComplete,
    ];
    let step = tracker.observe(NOW, observed);
    let inbound = NrpService {
        name: "uid-inbound".into(),
        service_type: "LoadBalancer".into(),
        backend_pools: vec![],
        is_default: false,
    };
    let snapshot = NrpState {
        services: vec![inbound],
        locations: vec![NrpListedLocation {
            location: HOST.into(),
            addresses: vec![
                NrpAddress { address: "10.244.2.10".into(), services: vec!["uid-inbound".into()] },
                NrpAddress { address: "10.244.2.11".into(), services: vec![] },
            ],
        }],
    };
    let answer = |c: &Command| if *c == Command::ReadNrp { Outcome::NrpSnapshot(snapshot.clone()) } else { ok(c) };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, answer, |_| true);
    assert_eq!(issued, [Command::ReadNrp, release_of("p", "uid-p"), release_of("q", "uid-q")], "{issued:?}");
    assert_eq!(tracker.nrp_view()[HOST]["10.244.2.10"], BTreeSet::from(["uid-inbound".to_owned()]));
    assert!(tracker.is_quiet());
}

// Upstream TestCheckPendingPodDeletions ("keeps finalizer until every address of a dual-stack pod drains") and
// TestOutboundAddressInAnyNRPLocationLocked ("finds an address under a later location"): after a restart, a
// deleting dual-stack pod whose IPv4 address has left NRP but whose IPv6 address NRP still maps, under the
// IPv6 location, keeps its finalizer until that drain succeeds (the first attempt fails and is retried); its
// identity, carried by a live pod, is not torn down.
#[test]
fn a_dual_stack_pod_whose_ipv6_address_alone_is_still_in_nrp_is_released_only_once_that_drain_succeeds() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let dual = Pod {
        pod_ips: vec!["10.244.2.10".into(), "fd00:10::a".into()],
        host_ips: vec![HOST.into(), "fd00::6".into()],
        ..deleting(pod("p", "10.244.2.10"))
    };
    let node = Node { name: "n".into(), internal_ips: vec![HOST.into(), "fd00::6".into()] };
    let observed = vec![
        Observation::NodeUpserted(node),
        Observation::PodUpserted(dual),
        Observation::PodUpserted(holding(pod("q", "10.244.2.11"))),
        Observation::ListsComplete,
    ];
    let step = tracker.observe(NOW, observed);
    let snapshot = NrpState {
        services: vec![registered()],
        locations: vec![
            NrpListedLocation { location: HOST.into(), addresses: vec![listed("10.244.2.11")] },
            NrpListedLocation { location: "fd00::6".into(), addresses: vec![listed("fd00:10::a")] },
        ],
    };
    let touches_v6 =
        |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.location == "fd00::6"));
    let mut v6_drains = 0;
    let answer = |c: &Command| {
        if *c == Command::ReadNrp {
            return Outcome::NrpSnapshot(snapshot.clone());
        }
        if touches_v6(c) {
            v6_drains += 1;
            if v6_drains == 1 {
                return failed(500, "InternalServerError");
            }
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, answer, everything_but_events);
    let drains: Vec<usize> = issued.iter().enumerate().filter(|(_, c)| touches_v6(c)).map(|(i, _)| i).collect();
    assert_eq!(drains.len(), 2, "the failed drain is retried: {issued:?}");
    assert!(drains[1] < position(&issued, is_release_of("p")), "released before the v6 drain succeeded: {issued:?}");
    assert_eq!(finalizers(&issued), [("p".to_owned(), "uid-p".to_owned(), false)], "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_))), "{issued:?}");
    assert!(tracker.nrp_view().get("fd00::6").is_none_or(|a| a.is_empty()));
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.11"));
}

// Upstream TestGuardDeletePod_NonLastBufferedPodAfterCreateDispatchIsDrainGated: two pods wait for their
// identity's creation; one is deleted while the NAT gateway PUT is in flight. The creation goes on, nothing is
// torn down, the survivor's address reaches NRP, and the deleted pod, whose address waited for the creation
// and was never sent, is released at once (a release after a batch that sent its address would wait for the
// drain).
#[test]
fn a_non_last_pod_deleted_during_its_identitys_creation_leaves_the_creation_going_and_is_drain_gated() {
    let mut tracker = started();
    let observed =
        vec![Observation::PodUpserted(pod("p", "10.244.2.10")), Observation::PodUpserted(pod("q", "10.244.2.11"))];
    let step = tracker.observe(NOW, observed);
    let (_, (put, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting(pod("q", "10.244.2.11")))]);
    let mut all = step.commands;
    all.extend(tracker.complete(NOW + 2, vec![(put, Outcome::Ok)]).commands);
    let (issued, _) =
        drive_keeping(&mut tracker, NOW + 2, Step { commands: all, ..Step::default() }, ok, everything_but_events);
    let teardown = |c: &Command| {
        matches!(c, Command::DeleteResource(_)) || is_outbound(c, None, true) || is_put_nat_gateway(c, false)
    };
    assert!(!issued.iter().any(teardown), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.10"]);
    let sends_q = |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.addresses.iter().any(|a| a.address == "10.244.2.11" && !a.services.is_empty())));
    assert!(!issued.iter().any(sends_q), "q's address is never sent: {issued:?}");
    assert_eq!(finalizers(&issued), [("q".to_owned(), "uid-q".to_owned(), false)], "{issued:?}");
}

// Upstream TestReconcileEgressPodUpdate_LiveReRegistrationKeepsFinalizerAndReAdds: a live pod, not its
// identity's last, that gains a second family (v4 -> v4+v6) keeps its finalizer (no write) and has each
// address in NRP under its own family's location.
#[test]
fn a_live_pod_gaining_a_second_family_beside_another_pod_keeps_its_finalizer() {
    let mut tracker = two_pods();
    let dual = Pod {
        pod_ips: vec!["10.244.2.10".into(), "fd00:10::a".into()],
        host_ips: vec![HOST.into(), "fd00::6".into()],
        ..holding(pod("p", "10.244.2.10"))
    };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(dual)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, |_| true);
    assert!(finalizers(&issued).is_empty(), "{issued:?}");
    assert!(issued.iter().all(is_location_update), "{issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.10", "10.244.2.11"]);
    assert_eq!(tracker.nrp_view()["fd00::6"].keys().collect::<Vec<_>>(), ["fd00:10::a"]);
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_some_and(|h| h.has && h.live));
}

// Upstream TestFinalizerConstants: the finalizers are a wire contract with what upstream's controller
// wrote on Services and pods (an upgrade must find and release them): every add and every release of a
// Service's finalizer names servicegateway.azure.com/service-cleanup, an egress pod's
// servicegateway.azure.com/pod-cleanup, and the two differ (a Service's cleanup never releases a
// pod's drain).
#[test]
fn the_finalizers_written_on_services_and_pods_are_upstreams_two_distinct_names() {
    let written = |issued: &[Command], kind: &str| -> Vec<(String, bool)> {
        issued
            .iter()
            .filter_map(|c| match c {
                Command::SetFinalizer { service, finalizer, present } if service.kind.as_str() == kind => {
                    Some((finalizer.to_string(), *present))
                }
                _ => None,
            })
            .collect()
    };
    let service_finalizer = "servicegateway.azure.com/service-cleanup";
    let pod_finalizer = "servicegateway.azure.com/pod-cleanup";

    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let web = lb_service("Local");
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(web.clone()), Observation::ListsComplete]);
    let (mut issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating(web))]);
    issued.extend(drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events).0);
    let expected = [(service_finalizer.to_owned(), true), (service_finalizer.to_owned(), false)];
    assert_eq!(written(&issued, "Service"), expected, "{issued:?}");
    assert_eq!(tracker.phase(UID), None, "released");

    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (mut issued, _) = drive_keeping(&mut tracker, NOW, step, ok, everything_but_events);
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting(pod("p", "10.244.2.10")))]);
    issued.extend(drive_keeping(&mut tracker, NOW + 1, step, ok, everything_but_events).0);
    let expected = [(pod_finalizer.to_owned(), true), (pod_finalizer.to_owned(), false)];
    assert_eq!(written(&issued, "Pod"), expected, "{issued:?}");
}
