use super::*;
use crate::config::Config;
use crate::difftracker::View;
use crate::model::*;
use crate::tracker::Tracker;
use std::collections::{BTreeMap, BTreeSet};

const NODE: &str = "10.224.0.4";

fn pod(name: &str, label: Option<&str>, ips: &[&str]) -> Pod {
    Pod {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        egress_label: label.map(Into::into),
        phase: Some("Running".into()),
        pod_ips: ips.iter().map(|s| (*s).to_owned()).collect(),
        host_ips: vec![NODE.into()],
        ..Pod::default()
    }
}

/// The pod once it holds the pod finalizer (`super::super::finalizers`): the tracker writes
/// nothing to it while it carries an identity.
fn held(pod: Pod) -> Pod {
    Pod { finalizers: vec![super::super::finalizers::FINALIZER.into()], ..pod }
}

fn no_inbound(_: &str) -> bool {
    false
}

/// The Kubernetes view as NRP should hold it when every identity is ready.
fn wanted(diff: &DiffTracker) -> View {
    diff.desired_view(|_| Class::Ready)
}

fn at(location: &str, address: &str, ids: &[&str]) -> View {
    let ids = ids.iter().map(|s| (*s).to_owned()).collect();
    BTreeMap::from([(location.to_owned(), BTreeMap::from([(address.to_owned(), ids)]))])
}

// Mirrors upstream TestIsValidEgressIdentity and TestIsValidEgressIdentity_RejectsReservedNames.
// Upstream TestGuardAddPod_InvalidParamsIsNoOp, TestPodInformerAddPod and
// TestPodInformerAddPod_AcceptsOrdinaryEgressLabel.
#[test]
fn valid_identities_follow_the_azure_name_rule_and_default_natgw_is_reserved() {
    let longest = "a".repeat(MAX_IDENTITY_LEN);
    let usable = ["a", "egress-a", "e.g_1", "x_", "0", "e0", "egress-gateway-a", "tenant-a-egress", "my_egress.gw-1"];
    // Names that merely resemble the reserved one stay usable.
    let resembling = ["team-egress", "default-natgw2", "my-default-natgw", "default-natgateway"];
    for ok in usable.into_iter().chain(resembling).chain([longest.as_str()]) {
        assert!(is_valid_identity(ok), "{ok}");
    }
    let (too_long, far_too_long) = ("a".repeat(MAX_IDENTITY_LEN + 1), "a".repeat(81));
    let bad = ["", "-a", "a-", "a.", "_a", "a b", "a/b", "ÄB", "../hijacked-nat", "egress/gateway", ".leading-dot"];
    let more = ["trailing-dot.", "trailing-hyphen-", "has space", "UPPER", &too_long, &far_too_long];
    for bad in bad.into_iter().chain(more).chain(["default-natgw", "Default-NatGW", "DEFAULT-NATGW"]) {
        assert!(!is_valid_identity(bad), "{bad}");
    }
    // The longest identity's public IP names fit Azure's 80 characters, the IPv6 one too.
    for v6 in [false, true] {
        assert!(super::super::outbound::public_ip_name(&longest, v6).len() <= 80);
    }
    let reserved = read_pod(&pod("p", Some("Default-NATGW"), &["10.244.0.5"]), no_inbound);
    assert_eq!(reserved.identity, None);
    assert_eq!(reserved.warnings[0].reason, reason::RESERVED_EGRESS_LABEL);
    let invalid = read_pod(&pod("p", Some("bad label!"), &["10.244.0.5"]), no_inbound);
    assert_eq!(invalid.identity, None);
    assert_eq!(invalid.warnings[0].reason, reason::INVALID_EGRESS_LABEL);
    let upper = read_pod(&pod("p", Some("Egress-A"), &["10.244.0.5"]), no_inbound);
    assert_eq!(upper.identity.as_deref(), Some("egress-a"), "lower-cased");
    assert!(read_pod(&pod("p", Some(""), &["10.244.0.5"]), no_inbound) == Reading::default(), "empty: no egress");
}

// Mirrors upstream TestUpdateK8sPod: add and remove of an egress assignment.
// Upstream TestColdStart_DualStackNode_EgressUsesHostIP, TestPodInformerAddPod,
// TestPodInformerRemovePod, TestPodInformerAddPod_AcceptsOrdinaryEgressLabel and TestUpdateK8sEgress.
#[test]
fn an_egress_pod_adds_its_identity_at_its_host_ip_and_deleting_it_takes_it_away() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("p", Some("egress-a"), &["10.244.0.5"]);
    assert!(egress.upsert(&p, no_inbound, &mut diff).is_empty());
    assert_eq!(wanted(&diff), at(NODE, "10.244.0.5", &["egress-a"]));
    assert_eq!(egress.ref_counts(), &BTreeMap::from([("egress-a".to_owned(), 1)]));
    egress.delete(&p.key(), &mut diff);
    assert!(wanted(&diff).is_empty());
    assert!(egress.ref_counts().is_empty());
}

// Mirrors upstream TestUpdateK8sPodRemovePreservesInboundIdentities (a Design A defect fixed
// in B): egress removal keeps a pod that still backs a LoadBalancer; an egress-only pod goes
// and its count is released.
#[test]
fn removing_the_egress_identity_keeps_the_addresses_inbound_identities() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    diff.add_endpoint("svc-uid", "10.244.0.5", NODE);
    let both = pod("both", Some("egress-a"), &["10.244.0.5"]);
    let only = pod("only", Some("egress-a"), &["10.244.0.6"]);
    egress.upsert(&both, no_inbound, &mut diff);
    egress.upsert(&only, no_inbound, &mut diff);
    assert_eq!(wanted(&diff)[NODE]["10.244.0.5"], BTreeSet::from(["egress-a".into(), "svc-uid".into()]));
    let unlabelled = Pod { egress_label: None, ..both.clone() };
    egress.upsert(&unlabelled, no_inbound, &mut diff);
    egress.delete(&only.key(), &mut diff);
    assert_eq!(wanted(&diff), at(NODE, "10.244.0.5", &["svc-uid"]));
    assert!(egress.ref_counts().is_empty());
}

// Mirrors upstream TestEgressRefCountSoundness and TestGuardConcurrency_AddPodDeletePod_RefCountSymmetry.
// Upstream TestPodInformerRemovePod and TestUpdateK8sEgress.
// Upstream TestGuardLifecycle_StaleDeletePodIsNoOp: the first delete of the only pod releases its
// count and address, the duplicate changes nothing (its IsLastPod signal, the last pod's
// teardown, is the outbound lifecycle's: tracker/tests/upstream_pod_finalizers.rs).
// Upstream TestEgressRefCount_Robust: idempotent add, the last pod's delete drops the count to
// none, a stale duplicate delete is a no-op (the outbound deletion it schedules upstream is not
// built here).
#[test]
fn duplicate_and_out_of_order_pod_events_never_count_twice_or_below_zero() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("p", Some("egress-a"), &["10.244.0.5"]);
    egress.delete(&p.key(), &mut diff); // a delete before its add: nothing to release
    egress.upsert(&p, no_inbound, &mut diff);
    egress.upsert(&p, no_inbound, &mut diff);
    assert_eq!(egress.ref_counts()["egress-a"], 1, "an unchanged pod seen again counts once");
    egress.delete(&p.key(), &mut diff);
    assert!(egress.ref_counts().is_empty() && wanted(&diff).is_empty(), "the first delete releases");
    let before = (egress.clone(), wanted(&diff));
    egress.delete(&p.key(), &mut diff);
    assert_eq!((egress.clone(), wanted(&diff)), before, "the duplicate delete changes nothing");
    assert!(egress.ref_counts().is_empty(), "never below zero");
    assert!(wanted(&diff).is_empty());
    assert_eq!(egress.recount(), *egress.ref_counts());
}

// Upstream TestEngineDeletePod_StaleDuplicateRemovalIsNoOp: deleting a pod nobody tracks leaves
// the live pod's count and address alone, and the live pod's delete still releases them
// (IsLastPod and the pod finalizer are the outbound lifecycle's and the pod finalizer's:
// tracker/tests/upstream_outbound.rs and upstream_pod_finalizers.rs).
#[test]
fn deleting_a_pod_that_is_not_tracked_leaves_another_pods_count_and_address_alone() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("live", Some("egress-a"), &["10.244.0.5"]);
    egress.upsert(&p, no_inbound, &mut diff);
    egress.delete(&ObjectKey::new("shop", "gone"), &mut diff);
    assert_eq!(egress.ref_counts()["egress-a"], 1);
    assert_eq!(wanted(&diff), at(NODE, "10.244.0.5", &["egress-a"]));
    egress.delete(&p.key(), &mut diff);
    assert!(egress.ref_counts().is_empty() && wanted(&diff).is_empty());
}

// Upstream TestEngineDeletePod_DualStackRemovesAllAddressesAtomically: one delete takes both
// families' addresses away and releases the count. Differs: the count is per pod (1), not per
// address (upstream 2), so a dual-stack pod cannot be half-released; the one pending
// pod-finalizer record is the pod finalizer's (tracker/tests/upstream_pod_finalizers.rs).
#[test]
fn deleting_a_dual_stack_pod_removes_both_its_addresses_and_its_one_count() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p =
        Pod { host_ips: vec![NODE.into(), "fd00::4".into()], ..pod("p", Some("egress-a"), &["10.244.0.5", "fd01::5"]) };
    egress.upsert(&p, no_inbound, &mut diff);
    assert_eq!(egress.ref_counts()["egress-a"], 1, "one pod, one count");
    assert_eq!(wanted(&diff).len(), 2, "{:?}", wanted(&diff));
    egress.delete(&p.key(), &mut diff);
    assert!(wanted(&diff).is_empty() && egress.ref_counts().is_empty());
}

#[test]
fn a_label_changed_to_another_identity_moves_the_count_and_the_address() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    egress.upsert(&pod("p", Some("egress-a"), &["10.244.0.5"]), no_inbound, &mut diff);
    egress.upsert(&pod("q", Some("egress-a"), &["10.244.0.6"]), no_inbound, &mut diff);
    egress.upsert(&pod("p", Some("egress-b"), &["10.244.0.5"]), no_inbound, &mut diff);
    assert_eq!(egress.ref_counts(), &BTreeMap::from([("egress-a".into(), 1), ("egress-b".into(), 1)]));
    assert_eq!(wanted(&diff)[NODE]["10.244.0.5"], BTreeSet::from(["egress-b".to_owned()]));
    assert_eq!(egress.identity_of(&ObjectKey::new("shop", "p")), Some("egress-b"));
}

#[test]
fn a_pod_whose_host_ip_changes_moves_its_address_to_the_new_location() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("p", Some("egress-a"), &["10.244.0.5"]);
    egress.upsert(&p, no_inbound, &mut diff);
    let moved = Pod { host_ips: vec!["10.224.0.9".into()], ..p };
    egress.upsert(&moved, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), at("10.224.0.9", "10.244.0.5", &["egress-a"]));
    assert_eq!(egress.ref_counts()["egress-a"], 1);
}

// Upstream TestEgressPodUpdateActions_NodeLocationChange: a dual-stack pod whose IPv6 host IP
// changes, or appears, while its IPv4 one stays has its IPv6 address moved, or added, under
// the new host IP; its IPv4 address stays where it was.
#[test]
fn a_dual_stack_pod_whose_ipv6_host_ip_changes_or_appears_moves_only_its_ipv6_address() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let ds =
        Pod { host_ips: vec![NODE.into(), "fd00::a".into()], ..pod("d", Some("egress-a"), &["10.244.0.6", "fd01::6"]) };
    let both = |v6_location: &str| {
        let mut view = at(NODE, "10.244.0.6", &["egress-a"]);
        view.extend(at(v6_location, "fd01::6", &["egress-a"]));
        view
    };
    egress.upsert(&ds, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), both("fd00::a"));
    egress.upsert(&Pod { host_ips: vec![NODE.into(), "fd00::b".into()], ..ds.clone() }, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), both("fd00::b"), "not under fd00::a any more");
    egress.upsert(&Pod { host_ips: vec![NODE.into()], ..ds.clone() }, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), at(NODE, "10.244.0.6", &["egress-a"]), "no IPv6 host IP: no IPv6 location");
    egress.upsert(&Pod { host_ips: vec![NODE.into(), "fd00::b".into()], ..ds }, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), both("fd00::b"), "the IPv6 host IP appearing adds the IPv6 address");
    assert_eq!(egress.ref_counts()["egress-a"], 1);
}

// Upstream TestEgressPodUpdateActions: updates are state-based here (an upsert replaces the
// pod's reading), so for each of upstream's (old, new) pairs an update from old must leave
// what new alone gives. Differs: a live pod that has (or loses) its IPs still counts, with no
// address, where upstream drops it (it is on its way to an address).
#[test]
fn an_update_from_any_pod_state_leaves_what_the_new_state_alone_gives() {
    let ds = |ips: &[&str]| Pod { host_ips: vec![NODE.into(), "fd00::4".into()], ..pod("p", Some("egress-a"), ips) };
    let at_phase = |p: Pod, phase: &str| Pod { phase: Some(phase.into()), ..p };
    let deleting = |p: Pod| Pod { deleting: true, ..p };
    let a = pod("p", Some("egress-a"), &["10.244.0.5"]);
    let b = pod("p", Some("egress-b"), &["10.244.0.5"]);
    let pending = at_phase(pod("p", Some("egress-a"), &[]), "Pending");
    let elsewhere = Pod { host_ips: vec!["10.224.0.9".into()], ..pod("p", Some("egress-a"), &["10.244.0.6"]) };
    let cases = [
        ("label A to B", a.clone(), b.clone()),
        ("IPs and a label change", pending.clone(), b.clone()),
        ("gets IPs", pending.clone(), a.clone()),
        ("IP change to another node", a.clone(), elsewhere.clone()),
        ("secondary IP changes", ds(&["10.244.0.5", "fd01::old"]), ds(&["10.244.0.5", "fd01::new"])),
        ("secondary IP added", ds(&["10.244.0.5"]), ds(&["10.244.0.5", "fd01::1"])),
        ("secondary IP dropped", ds(&["10.244.0.5", "fd01::1"]), ds(&["10.244.0.5"])),
        ("loses IPs", a.clone(), pod("p", Some("egress-a"), &[])),
        ("label removed", a.clone(), Pod { egress_label: None, ..a.clone() }),
        ("Failed", a.clone(), at_phase(a.clone(), "Failed")),
        ("Succeeded", a.clone(), at_phase(a.clone(), "Succeeded")),
        ("deleting", a.clone(), deleting(a.clone())),
        ("deleting and a label change", a.clone(), deleting(b.clone())),
        ("same state", a.clone(), a.clone()),
        ("pending without IPs stays", pending.clone(), pending.clone()),
        ("IP change on a terminating pod", a.clone(), deleting(elsewhere.clone())),
        ("recovers from Failed", at_phase(a.clone(), "Failed"), a.clone()),
        ("goes Unknown", a.clone(), at_phase(a.clone(), "Unknown")),
        ("recovers from Unknown", at_phase(a.clone(), "Unknown"), a.clone()),
    ];
    for (case, old, new) in cases {
        let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
        egress.upsert(&old, no_inbound, &mut diff);
        egress.upsert(&new, no_inbound, &mut diff);
        let (mut fresh, mut fresh_diff) = (Egress::default(), DiffTracker::default());
        fresh.upsert(&new, no_inbound, &mut fresh_diff);
        assert_eq!(wanted(&diff), wanted(&fresh_diff), "{case}");
        assert_eq!(egress.ref_counts(), fresh.ref_counts(), "{case}");
        assert_eq!(egress.pods, fresh.pods, "{case}");
    }
}

// Mirrors upstream TestProcessK8sEgresses_SkipsTerminatedPhases.
// Upstream TestPodInformerAddPod.
#[test]
fn pods_that_are_not_running_or_pending_or_are_being_deleted_carry_no_identity() {
    for (phase, deleting, carries) in [
        (Some("Running"), false, true),
        (Some("Pending"), false, true),
        (Some("Succeeded"), false, false),
        (Some("Failed"), false, false),
        (Some("Unknown"), false, false),
        (None, false, false),
        (Some("Running"), true, false),
    ] {
        let p = Pod { phase: phase.map(Into::into), deleting, ..pod("p", Some("egress-a"), &["10.244.0.5"]) };
        assert_eq!(read_pod(&p, no_inbound).identity.is_some(), carries, "{phase:?} deleting={deleting}");
    }
    // A pod that turns terminal gives its identity back.
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("p", Some("egress-a"), &["10.244.0.5"]);
    egress.upsert(&p, no_inbound, &mut diff);
    egress.upsert(&Pod { phase: Some("Succeeded".into()), ..p }, no_inbound, &mut diff);
    assert!(egress.ref_counts().is_empty() && wanted(&diff).is_empty());
}

// Mirrors upstream TestProcessK8sEgresses_SkipsMalformedIPs.
// Upstream TestUpdateK8sPodRejectsEmptyLocationOrAddress.
#[test]
fn malformed_pod_ips_are_skipped_with_a_warning_and_the_others_kept() {
    let reading = read_pod(&pod("p", Some("egress-a"), &["10.244.0.500", "10.244.0.5"]), no_inbound);
    assert_eq!(reading.addresses, Map::from([("10.244.0.5".into(), NODE.into())]));
    assert_eq!(reading.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), vec![reason::INVALID_POD_IP]);
}

// Upstream TestPodInformerAddPod_RejectsMalformedPodIP: a pod whose only IP is malformed is
// warned about once and not counted, as upstream does not track it: a pod's IPs do not change
// once assigned, so counting it would keep its identity (and, once the NAT gateway lifecycle
// is built, a NAT gateway) for no address. A later good IP makes it count.
#[test]
fn a_pod_whose_only_ip_is_malformed_is_warned_about_and_not_counted() {
    let bad = pod("p", Some("egress-a"), &["not-an-ip"]);
    let only = read_pod(&bad, no_inbound);
    assert!(only.addresses.is_empty());
    assert_eq!(only.identity, None);
    assert_eq!(only.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), vec![reason::INVALID_POD_IP]);
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let warnings = egress.upsert(&bad, no_inbound, &mut diff);
    assert_eq!(warnings.iter().map(|(_, w)| w.reason).collect::<Vec<_>>(), vec![reason::INVALID_POD_IP]);
    assert!(egress.upsert(&bad, no_inbound, &mut diff).is_empty(), "warned once, not per update");
    assert!(egress.ref_counts().is_empty() && wanted(&diff).is_empty());
    assert_eq!(egress.class("egress-a"), None, "never carried: no identity of this cluster");
    egress.upsert(&pod("p", Some("egress-a"), &["10.244.0.5"]), no_inbound, &mut diff);
    assert_eq!(egress.ref_counts()["egress-a"], 1);
    let unplaced = read_pod(&pod("q", Some("egress-a"), &["fd01::5"]), no_inbound);
    assert_eq!(unplaced.identity.as_deref(), Some("egress-a"), "its node may still gain an IPv6 host IP");
}

// Mirrors upstream TestProcessK8sEgresses_ImportsAllDualStackAddresses.
// Upstream TestColdStart_DualStackNode_EgressUsesHostIP and
// TestPodInformerDualStackRegistersEveryFamily.
#[test]
fn a_dual_stack_pod_contributes_each_ip_under_its_same_family_host_ip() {
    let p =
        Pod { host_ips: vec![NODE.into(), "fd00::4".into()], ..pod("p", Some("egress-a"), &["10.244.0.5", "fd01::5"]) };
    let reading = read_pod(&p, no_inbound);
    assert_eq!(
        reading.addresses,
        Map::from([("10.244.0.5".into(), NODE.into()), ("fd01::5".into(), "fd00::4".into())])
    );
    assert!(reading.warnings.is_empty());
}

// Mirrors upstream TestPodEgressAddresses: status.podIPs, else status.podIP; hostIPs, else hostIP.
// Upstream TestGuardAddPod_InvalidParamsIsNoOp, TestUpdateK8sPodRejectsEmptyLocationOrAddress and
// TestPodInformerAddPod (differs: a pod with no HostIP, no PodIP or no IPs still carries its identity,
// with no address; one with a PodIP and no HostIP is warned about).
#[test]
fn pod_ips_fall_back_to_pod_ip_and_host_ips_fall_back_to_host_ip() {
    let p = Pod {
        pod_ips: vec![],
        pod_ip: Some("10.244.0.5".into()),
        host_ips: vec![],
        host_ip: Some("10.224.0.7".into()),
        ..pod("p", Some("egress-a"), &[])
    };
    assert_eq!(pod_addresses(&p).0, Map::from([("10.244.0.5".into(), "10.224.0.7".into())]));
    let both = Pod { pod_ips: vec!["10.244.0.6".into()], host_ips: vec!["10.224.0.8".into()], ..p };
    assert_eq!(pod_addresses(&both).0, Map::from([("10.244.0.6".into(), "10.224.0.8".into())]), "lists win");
    let unscheduled = Pod { pod_ips: vec![], host_ips: vec![], ..pod("p", Some("egress-a"), &[]) };
    let reading = read_pod(&unscheduled, no_inbound);
    assert_eq!(
        (reading.identity.as_deref(), reading.addresses.len()),
        (Some("egress-a"), 0),
        "pending: carries, no address"
    );
    assert!(reading.warnings.is_empty());
    // A HostIP and no PodIP yet: carries, no address, no warning.
    let no_pod_ip = Pod { pod_ips: vec![], pod_ip: None, ..pod("p", Some("egress-a"), &[]) };
    let reading = read_pod(&no_pod_ip, no_inbound);
    assert_eq!((reading.identity.as_deref(), reading.addresses.len()), (Some("egress-a"), 0));
    assert!(reading.warnings.is_empty());
    // A PodIP and no HostIP at all: carries, no address, and a warning.
    let no_host = Pod { host_ips: vec![], host_ip: None, ..pod("p", Some("egress-a"), &["10.0.1.1"]) };
    let reading = read_pod(&no_host, no_inbound);
    assert_eq!((reading.identity.as_deref(), reading.addresses.len()), (Some("egress-a"), 0));
    assert_eq!(reading.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), [reason::NO_NODE_LOCATION]);
}

// Mirrors upstream TestPodNodeLocationsByFamily_CanonicalizesRepresentation.
#[test]
fn host_and_pod_ips_in_any_spelling_become_canonical_keys() {
    let p = Pod { host_ips: vec!["FD00:0::0004".into()], ..pod("p", Some("egress-a"), &["FD01:0:0::5"]) };
    assert_eq!(pod_addresses(&p).0, Map::from([("fd01::5".into(), "fd00::4".into())]));
}

// Mirrors upstream TestColdStart_EgressPodNoSameFamilyLocation_NotDesired, its own case last: a
// pod whose only IP is IPv6 on a node with only an IPv4 host IP. Its address is not registered,
// with a NoNodeLocation warning, as upstream. Differs on purpose: the pod still carries its
// identity (counted, so the identity's NAT gateway is wanted), where upstream marks no NAT
// gateway desired: a pod's IP does not change but its node may still gain an IPv6 host IP, so
// the pod is on its way to an address (read_pod).
// Upstream TestGuardAddPod_InvalidParamsIsNoOp and TestUpdateK8sPodRejectsEmptyLocationOrAddress.
#[test]
fn an_ip_without_a_host_ip_of_its_family_is_not_desired() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let p = pod("p", Some("egress-a"), &["10.244.0.5", "fd01::5"]);
    let warnings = egress.upsert(&p, no_inbound, &mut diff);
    assert_eq!(wanted(&diff), at(NODE, "10.244.0.5", &["egress-a"]));
    assert_eq!(warnings.iter().map(|(_, w)| w.reason).collect::<Vec<_>>(), vec![reason::NO_NODE_LOCATION]);
    assert_eq!(warnings[0].0.kind, "Pod");
    assert!(egress.upsert(&p, no_inbound, &mut diff).is_empty(), "warned once per change, not per update");

    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let v6_only = pod("q", Some("egress-a"), &["fd00::501"]);
    let warnings = egress.upsert(&v6_only, no_inbound, &mut diff);
    assert!(wanted(&diff).is_empty(), "the IPv6 address is not registered");
    assert_eq!(warnings.iter().map(|(_, w)| w.reason).collect::<Vec<_>>(), vec![reason::NO_NODE_LOCATION]);
    assert_eq!(egress.ref_counts(), &BTreeMap::from([("egress-a".to_owned(), 1)]), "the identity is carried");
}

// Mirrors upstream TestAddPod_RejectsEgressIdentityCollidingWithInboundService.
#[test]
fn an_identity_equal_to_an_inbound_service_is_refused_with_a_warning() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let uid = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01";
    let warnings = egress.upsert(&pod("p", Some(&uid.to_uppercase()), &["10.244.0.5"]), |id| id == uid, &mut diff);
    assert_eq!(warnings[0].1.reason, reason::EGRESS_LABEL_COLLISION);
    assert!(egress.ref_counts().is_empty() && wanted(&diff).is_empty());
}

fn outbound(name: &str) -> NrpService {
    NrpService { name: name.into(), service_type: "Outbound".into(), backend_pools: vec![], is_default: false }
}

// Upstream TestGuardAddPod_ExistingNRPNATGatewayAddsImmediately.
// Upstream TestGuardDefaultNATGatewayNeverEntersNRPSnapshotOrRemovalDiff: the RP's default
// outbound service listed by NRP is not taken for a registered one of ours.
#[test]
fn an_identity_a_pod_carries_is_ready_only_while_nrp_lists_it_as_a_registered_outbound_service() {
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    egress.upsert(&pod("p", Some("egress-a"), &["10.244.0.5"]), no_inbound, &mut diff);
    assert_eq!(egress.class("egress-a"), Some(Class::NotReady));
    egress.nrp_read(&[outbound("EGRESS-A")], &diff);
    assert_eq!(egress.class("egress-a"), Some(Class::Ready));
    let default = NrpService { is_default: true, ..outbound(RESERVED_IDENTITY) };
    egress.nrp_read(&[default, outbound("egress-a")], &diff);
    assert_eq!(egress.class("egress-a"), Some(Class::Ready));
    assert!(!egress.registered.contains(RESERVED_IDENTITY), "the RP's default is never one of ours");
    egress.delete(&ObjectKey::new("shop", "p"), &mut diff);
    assert_eq!(egress.class("egress-a"), Some(Class::NotReady), "its pods went: drained");
    assert_eq!(egress.class("somebody-elses"), None, "never carried: not ours");
    egress.nrp_read(&[outbound("egress-a")], &diff);
    assert_eq!(egress.class("egress-a"), None, "forgotten once NRP no longer references it");
}

fn clb() -> Config {
    Config { backend_pool_type: "podIP".into(), load_balancer_sku: "standardV2".into(), ..Config::default() }
}

fn updates(step: &Step) -> Vec<NrpLocation> {
    step.commands
        .iter()
        .filter_map(|c| if let Command::UpdateAddressLocations(l) = &c.command { Some(l.clone()) } else { None })
        .flatten()
        .collect()
}

fn read_nrp_id(step: &Step) -> u64 {
    step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("a read of NRP").id
}

/// Through the tracker: an egress identity NRP lists as Outbound is programmed beside a
/// foreign one, and taking the label away drains only the egress identity.
// Upstream TestGuardAddPod_ExistingNRPNATGatewayAddsImmediately and TestEngineAddPod_AfterRestart.
#[test]
fn the_tracker_programs_a_registered_egress_identity_and_drains_it_when_the_label_goes() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(0, vec![Observation::ListsComplete]);
    let snapshot = NrpState {
        services: vec![outbound("egress-a"), outbound("other-natgw")],
        locations: vec![NrpListedLocation {
            location: NODE.into(),
            addresses: vec![NrpAddress { address: "10.244.0.9".into(), services: vec!["other-natgw".into()] }],
        }],
    };
    let step = tracker.complete(1, vec![(read_nrp_id(&step), Outcome::NrpSnapshot(snapshot))]);
    assert!(step.idle, "{step:?}");
    let p = held(pod("p", Some("egress-a"), &["10.244.0.5"]));
    let step = tracker.observe(2, vec![Observation::PodUpserted(p.clone())]);
    let sent = updates(&step);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].addresses, vec![NrpAddress { address: "10.244.0.5".into(), services: vec!["egress-a".into()] }]);
    let id = step.commands[0].id;
    assert!(tracker.complete(3, vec![(id, Outcome::Ok)]).idle);
    assert_eq!(tracker.nrp_view()[NODE]["10.244.0.9"], BTreeSet::from(["other-natgw".to_owned()]));
    let step = tracker.observe(4, vec![Observation::PodUpserted(Pod { egress_label: None, ..p })]);
    assert_eq!(updates(&step)[0].addresses, vec![NrpAddress { address: "10.244.0.5".into(), services: vec![] }]);
    // The drain accepted, the pod's finalizer goes.
    let step = tracker.complete(5, vec![(step.commands[0].id, Outcome::Ok)]);
    assert!(matches!(&step.commands[..], [Issued { command: Command::SetFinalizer { present: false, .. }, .. }]));
    assert!(tracker.complete(5, vec![(step.commands[0].id, Outcome::Ok)]).idle);
    assert!(!tracker.nrp_view()[NODE].contains_key("10.244.0.5"));
    assert!(tracker.nrp_view()[NODE].contains_key("10.244.0.9"), "a foreign identity is left alone");
}

// Upstream TestPodInformerDrainForReplace_SoleDualStackGainKeepsSharedAddress: the sole pod of
// an identity gaining a second family ([v4] → [v4, v6]) keeps its v4 address in NRP and its
// identity's count at one throughout: the update adds only the v6 address, under the v6 host
// IP, and removes nothing (removing the old set first would empty the identity for a moment).
// Upstream TestReconcileEgressPodUpdate_LiveReRegistrationKeepsFinalizerAndReAdds: the pod keeps its
// finalizer (nothing but the update is written) and each family goes under its own family's host IP.
#[test]
fn the_sole_pod_of_an_identity_gaining_a_second_family_adds_only_the_new_address() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(0, vec![Observation::ListsComplete]);
    let snapshot = NrpState { services: vec![outbound("egress-a")], locations: vec![] };
    tracker.complete(1, vec![(read_nrp_id(&step), Outcome::NrpSnapshot(snapshot))]);
    let v4 = held(pod("p", Some("egress-a"), &["10.244.0.5"]));
    let step = tracker.observe(2, vec![Observation::PodUpserted(v4.clone())]);
    assert!(tracker.complete(3, vec![(step.commands[0].id, Outcome::Ok)]).idle);
    let dual = Pod {
        host_ips: vec![NODE.into(), "fd00::4".into()],
        ..held(pod("p", Some("egress-a"), &["10.244.0.5", "fd01::5"]))
    };
    let step = tracker.observe(4, vec![Observation::PodUpserted(dual)]);
    assert_eq!(step.commands.len(), 1, "no finalizer write: {:?}", step.commands);
    assert_eq!(tracker.egress().ref_counts(), &BTreeMap::from([("egress-a".to_owned(), 1)]));
    let sent = updates(&step);
    assert_eq!(sent.len(), 1, "only the new family's location: {sent:?}");
    assert_eq!(sent[0].location, "fd00::4");
    assert_eq!(sent[0].addresses, vec![NrpAddress { address: "fd01::5".into(), services: vec!["egress-a".into()] }]);
    assert!(tracker.complete(5, vec![(step.commands[0].id, Outcome::Ok)]).idle);
    assert_eq!(tracker.nrp_view()[NODE]["10.244.0.5"], BTreeSet::from(["egress-a".to_owned()]));
    assert_eq!(tracker.nrp_view()["fd00::4"]["fd01::5"], BTreeSet::from(["egress-a".to_owned()]));
}

// Mirrors upstream TestNewSeedsOutboundRefCount and
// TestInitOutboundRefCount_NotNegativeOnServiceUIDEgressLabelCollision.
// Upstream TestEngineAddPod_AfterRestart.
#[test]
fn a_cold_start_counts_the_listed_egress_pods_and_never_a_pod_whose_label_is_a_services_uid() {
    let uid = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01";
    let service = Service {
        uid: uid.into(),
        namespace: "shop".into(),
        name: "web".into(),
        service_type: Some("LoadBalancer".into()),
        ..Service::default()
    };
    let colliding = pod("c", Some(&uid.to_uppercase()), &["10.244.0.7"]);
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    tracker.observe(
        0,
        vec![
            Observation::ServiceUpserted(service),
            Observation::PodUpserted(pod("a", Some("egress-a"), &["10.244.0.5"])),
            Observation::PodUpserted(pod("b", Some("egress-a"), &["10.244.0.6"])),
            Observation::PodUpserted(colliding.clone()),
            // A mixed-case label counts under its lower-cased identity; a pod with no label not at all.
            Observation::PodUpserted(pod("d", Some("Egress-B"), &["10.244.0.8"])),
            Observation::PodUpserted(pod("e", None, &["10.244.0.9"])),
            Observation::ListsComplete,
        ],
    );
    let counts = BTreeMap::from([("egress-a".to_owned(), 2), ("egress-b".to_owned(), 1)]);
    assert_eq!(tracker.egress().ref_counts(), &counts);
    tracker.observe(1, vec![Observation::PodDeleted(colliding.key()), Observation::PodDeleted(colliding.key())]);
    assert_eq!(tracker.egress().ref_counts(), &counts, "a refused pod's deletion releases nothing");
    assert_eq!(tracker.egress().recount(), counts);
}

const UID: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01";

fn web() -> Service {
    Service {
        uid: UID.into(),
        namespace: "shop".into(),
        name: "web".into(),
        service_type: Some("LoadBalancer".into()),
        external_traffic_policy: Some("Local".into()),
        ports: vec![ServicePort {
            name: None,
            protocol: Some("TCP".into()),
            port: 80,
            target_port: None,
            node_port: None,
        }],
        ..Service::default()
    }
}

/// Runs every command until there are none, answering as Azure and the API server do when
/// all goes well; returns the commands with the UID of the pods they name blanked (the
/// Warning sent when a Service arrives cannot name it; see the module's doc).
fn run(tracker: &mut Tracker, now: u64, step: Step) -> Vec<Command> {
    run_reading(tracker, now, step, &NrpState::default())
}

/// [`run`], NRP's reads answered with `nrp`.
fn run_reading(tracker: &mut Tracker, now: u64, mut step: Step, nrp: &NrpState) -> Vec<Command> {
    let mut issued = Vec::new();
    while !step.commands.is_empty() {
        let results = step
            .commands
            .iter()
            .map(|c| {
                let outcome = match c.command {
                    Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
                    Command::ReadNrp => Outcome::NrpSnapshot(nrp.clone()),
                    _ => Outcome::Ok,
                };
                (c.id, outcome)
            })
            .collect();
        issued.extend(step.commands.into_iter().map(|c| match c.command {
            Command::EmitEvent(mut e) if e.regarding.kind.as_str() == "Pod" => {
                e.regarding.uid = "".into();
                Command::EmitEvent(e)
            }
            other => other,
        }));
        step = tracker.complete(now, results);
    }
    issued
}

/// The story of a pod labelled with a Service's UID, the pod and the Service observed in
/// `batches` (one, or two) in the order given: the commands, the NRP mirror and the state once
/// quiet; then the commands of a re-list of the pod.
fn story(batches: Vec<Vec<Observation>>) -> (Vec<Command>, View, Vec<u8>, Vec<Command>) {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(0, vec![Observation::ListsComplete]);
    let mut commands = run(&mut tracker, 0, step);
    for (now, batch) in (1..).zip(batches) {
        let step = tracker.observe(now, batch);
        commands.extend(run(&mut tracker, now, step));
    }
    // The next resync: a pod that carried the identity for a while left it among the
    // identities this cluster may have written (`known`) until NRP is read again.
    let resync = crate::tracker::timing::RESYNC_INTERVAL_MS + 10;
    let step = tracker.tick(resync);
    commands.extend(run(&mut tracker, resync, step));
    assert!(tracker.is_quiet());
    let (view, (_, state)) = (tracker.nrp_view(), tracker.export_state());
    let step = tracker.observe(resync, vec![Observation::PodUpserted(labelled_with_the_uid())]);
    let relist = run(&mut tracker, resync, step);
    (commands, view, state, relist)
}

fn labelled_with_the_uid() -> Pod {
    pod("c", Some(UID), &["10.244.0.7"])
}

// Regression: an egress label equal to a Service's UID was treated differently depending on
// event order.
#[test]
fn a_pod_labelled_with_a_services_uid_is_refused_whether_it_is_seen_before_or_after_the_service() {
    let pod_first =
        story(vec![vec![Observation::PodUpserted(labelled_with_the_uid()), Observation::ServiceUpserted(web())]]);
    let service_first =
        story(vec![vec![Observation::ServiceUpserted(web()), Observation::PodUpserted(labelled_with_the_uid())]]);
    let pod_batch_first =
        story(vec![vec![Observation::PodUpserted(labelled_with_the_uid())], vec![Observation::ServiceUpserted(web())]]);
    let service_batch_first =
        story(vec![vec![Observation::ServiceUpserted(web())], vec![Observation::PodUpserted(labelled_with_the_uid())]]);
    let (commands, view, _, relist) = &service_first;
    assert!(!commands.iter().any(|c| matches!(c, Command::UpdateAddressLocations(_))), "{commands:?}");
    assert!(view.is_empty(), "the pod's IP is no backend of the Service: {view:?}");
    let warned = commands.iter().filter(
        |c| matches!(c, Command::EmitEvent(e) if e.reason == reason::EGRESS_LABEL_COLLISION && e.regarding.name == "c"),
    );
    assert_eq!(warned.count(), 1);
    assert!(relist.is_empty(), "a re-list changes nothing: {relist:?}");
    assert_eq!(&pod_first, &service_first, "the same commands, NRP and state in either order");
    // Across batches, the pod came first and was an egress pod until the Service came: its
    // identity was provisioned as an outbound service and is torn down before the
    // Service's load balancer is made (they share NRP's name and the `-pip` name); then the
    // same writes as when the Service came first, and the same NRP.
    let (commands, view, _, relist) = &pod_batch_first;
    assert_eq!((view, relist), (&service_first.1, &service_first.3));
    // The pod held the pod finalizer while it carried the identity: added, then released
    // once the teardown ended (`super::super::finalizers`); the Service's writes are the rest.
    let pod_finalizer = |c: &&Command| matches!(c, Command::SetFinalizer { service, .. } if service.kind == "Pod");
    let finalizers: Vec<bool> = commands
        .iter()
        .filter(pod_finalizer)
        .map(|c| matches!(c, Command::SetFinalizer { present: true, .. }))
        .collect();
    assert_eq!(finalizers, [true, false], "{commands:?}");
    let writes =
        |c: &&Command| !matches!(c, Command::EmitEvent(_) | Command::ReadNrp | Command::ReadArm) && !pod_finalizer(c);
    let (batched, service_batched): (Vec<_>, Vec<_>) =
        (commands.iter().filter(writes).collect(), service_batch_first.0.iter().filter(writes).collect());
    let (egress, rest) = batched.split_at(batched.len() - service_batched.len());
    assert_eq!(rest, service_batched, "after the outbound teardown, the writes of the other order");
    let outbound = |c: &&&Command| match c {
        Command::UpdateServices(s) => s.iter().all(|r| r.service_type == NrpServiceType::Outbound),
        Command::PutLoadBalancer(_) => false,
        _ => true,
    };
    assert!(egress.iter().all(|c| outbound(&c)), "only the egress identity's writes came first: {egress:?}");
    let teardown_ends = matches!(egress.last(), Some(Command::DeleteResource(r)) if r.kind == ResourceKind::PublicIp);
    assert!(teardown_ends, "and its teardown ended before the Service's first write: {egress:?}");
    assert_eq!(&service_batch_first.1, view);
}

/// The decision for a Service that goes away (module doc): a refused pod stays refused until
/// it is read again, whichever order it and the Service came in; then it carries its label.
#[test]
fn a_pod_refused_for_a_services_uid_carries_it_once_it_is_read_again_after_the_service_went() {
    for order in [[0, 1], [1, 0]] {
        let observations = [Observation::PodUpserted(labelled_with_the_uid()), Observation::ServiceUpserted(web())];
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let step = tracker.observe(0, vec![Observation::ListsComplete]);
        run(&mut tracker, 0, step);
        let step = tracker.observe(1, order.map(|i| observations[i].clone()).to_vec());
        run(&mut tracker, 1, step);
        let step = tracker.observe(2, vec![Observation::ServiceDeleted(web().key())]);
        run(&mut tracker, 2, step);
        assert_eq!(tracker.phase(UID), None, "{order:?}");
        assert!(tracker.egress().ref_counts().is_empty(), "{order:?}: refused until read again");
        tracker.observe(3, vec![Observation::PodUpserted(labelled_with_the_uid())]);
        assert_eq!(tracker.egress().ref_counts(), &BTreeMap::from([(UID.to_owned(), 1)]), "{order:?}");
    }
}

// Regression: an imported state's reference counts were not validated.
#[test]
fn a_state_whose_egress_reference_counts_are_not_the_pods_is_refused_as_corrupt() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    tracker.observe(0, vec![Observation::PodUpserted(pod("p", Some("egress-a"), &["10.244.0.5"]))]);
    // Version 3's payload: the state, then the egress side last.
    let (version, payload) = (3, tracker.export_state_as(3));
    let egress_bytes = postcard::to_allocvec(tracker.egress()).unwrap();
    let state_bytes = &payload[..payload.len() - egress_bytes.len()];
    assert!(Tracker::import_state(clb(), version, &payload).is_ok());
    for tamper in [|e: &mut Egress| e.refs.clear(), |e: &mut Egress| *e.refs.get_mut("egress-a").unwrap() = 2] {
        let mut egress = tracker.egress().clone();
        tamper(&mut egress);
        let tampered = [state_bytes, &postcard::to_allocvec(&egress).unwrap()].concat();
        match Tracker::import_state(clb(), version, &tampered) {
            Err(crate::tracker::StateError::Corrupt(why)) => assert!(why.contains("reference counts"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_refused_label_gets_one_warning_event_about_the_pod_and_the_pod_is_ignored() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let p = pod("p", Some("default-natgw"), &["10.244.0.5"]);
    let step = tracker.observe(0, vec![Observation::PodUpserted(p.clone())]);
    let events: Vec<&Event> = step
        .commands
        .iter()
        .filter_map(|c| if let Command::EmitEvent(e) = &c.command { Some(e) } else { None })
        .collect();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].reason.as_str(), events[0].regarding.kind.as_str()), (reason::RESERVED_EGRESS_LABEL, "Pod"));
    assert_eq!(events[0].event_type, EventType::Warning);
    let again = tracker.observe(1, vec![Observation::PodUpserted(p)]);
    assert!(again.commands.iter().all(|c| !matches!(c.command, Command::EmitEvent(_))));
    assert!(tracker.egress().ref_counts().is_empty());
}

/// (location, address, services) of every address-location update in `issued`.
fn sent(issued: &[Command]) -> BTreeSet<(String, String, Vec<String>)> {
    issued
        .iter()
        .filter_map(|c| if let Command::UpdateAddressLocations(l) = c { Some(l) } else { None })
        .flatten()
        .flat_map(|l| l.addresses.iter().map(|a| (l.location.clone(), a.address.clone(), a.services.clone())))
        .collect()
}

// Upstream TestEngineAddPod_ServiceCreating and TestServiceUpdaterCreateOutboundService_HappyPath
// (PIP → NAT gateway → register, in that order): a pod whose identity NRP does not list is
// held back while its outbound service is created, and its address is sent once the service
// is registered, not before.
#[test]
fn a_pod_whose_identity_nrp_does_not_list_is_held_back_until_its_nat_gateway_is_created_and_registered() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let p = held(pod("p", Some("egress-a"), &["10.244.0.5"]));
    let step = tracker.observe(0, vec![Observation::PodUpserted(p), Observation::ListsComplete]);
    let mut step = tracker.complete(1, vec![(read_nrp_id(&step), Outcome::NrpSnapshot(NrpState::default()))]);
    let mut before = Vec::new();
    while updates(&step).is_empty() {
        assert_eq!(step.commands.len(), 1, "one command at a time: {step:?}");
        let issued = step.commands[0].clone();
        let outcome = match issued.command {
            Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
            _ => Outcome::Ok,
        };
        before.push(issued.command);
        step = tracker.complete(2, vec![(issued.id, outcome)]);
    }
    let outbound = |public_nat_gateway: Option<&str>| NrpServiceRequest {
        name: "egress-a".into(),
        service_type: NrpServiceType::Outbound,
        backend_pools: vec![],
        public_nat_gateway: public_nat_gateway.map(Into::into),
        is_delete: false,
    };
    assert_eq!(
        before,
        vec![
            Command::PutPublicIp(PublicIp { name: "egress-a-pip".into(), version: IpVersion::Ipv4 }),
            Command::PutNatGateway(NatGateway {
                name: "egress-a".into(),
                public_ips: vec!["egress-a-pip".into()],
                public_ips_v6: vec![],
                associated: true,
            }),
            Command::UpdateServices(vec![outbound(Some("egress-a"))]),
        ]
    );
    let sent = updates(&step);
    assert_eq!(sent.iter().map(|l| l.location.as_str()).collect::<Vec<_>>(), vec![NODE], "{sent:?}");
    assert_eq!(sent[0].addresses, vec![NrpAddress { address: "10.244.0.5".into(), services: vec!["egress-a".into()] }]);
}

// Upstream TestGuardDefaultNATGatewayNeverEntersNRPSnapshotOrRemovalDiff: the RP's default
// outbound service in NRP's snapshot, even at an address, is never written about while an
// egress identity beside it is programmed and drained. The removal-diff half (an Outbound
// service of ours no longer wanted is unregistered beside it) is not asserted here (P in
// docs/conformance.md).
#[test]
fn the_rps_default_outbound_service_listed_by_nrp_is_left_alone_at_its_address() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let snapshot = NrpState {
        services: vec![NrpService { is_default: true, ..outbound(RESERVED_IDENTITY) }, outbound("egress-a")],
        locations: vec![NrpListedLocation {
            location: NODE.into(),
            addresses: vec![NrpAddress { address: "10.244.0.9".into(), services: vec![RESERVED_IDENTITY.into()] }],
        }],
    };
    let p = pod("p", Some("egress-a"), &["10.244.0.5"]);
    let step = tracker.observe(0, vec![Observation::PodUpserted(p.clone()), Observation::ListsComplete]);
    let mut issued = run_reading(&mut tracker, 0, step, &snapshot);
    assert_eq!(tracker.nrp_view()[NODE]["10.244.0.5"], BTreeSet::from(["egress-a".to_owned()]));
    let step = tracker.observe(1, vec![Observation::PodDeleted(p.key())]);
    issued.extend(run_reading(&mut tracker, 1, step, &snapshot));
    let sent = sent(&issued);
    let expected = [vec!["egress-a".to_owned()], vec![]].map(|s| (NODE.to_owned(), "10.244.0.5".to_owned(), s));
    assert_eq!(sent, BTreeSet::from(expected), "nothing about 10.244.0.9");
    assert!(!issued.iter().any(|c| format!("{c:?}").contains(RESERVED_IDENTITY)), "{issued:?}");
    let default = BTreeSet::from([RESERVED_IDENTITY.to_owned()]);
    assert_eq!(
        tracker.nrp_view(),
        BTreeMap::from([(NODE.to_owned(), BTreeMap::from([("10.244.0.9".into(), default)]))])
    );
}

// Upstream TestColdStart_NonCanonicalIPv6_CanonicalizesLocationKeys: a node's IPv6 InternalIP
// and an endpoint address spelled in upper case with leading zeros are sent in canonical
// text, and so are an egress pod's IPv6 host and pod IPs.
#[test]
fn non_canonical_ipv6_node_endpoint_and_pod_ips_are_sent_in_canonical_text() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node = Node { name: "dual".into(), internal_ips: vec![NODE.into(), "2001:DB8::0010".into()] };
    let slice = EndpointSlice {
        namespace: "shop".into(),
        name: "web-1".into(),
        owner_service_uid: Some(UID.into()),
        address_type: "IPv6".into(),
        endpoints: vec![Endpoint {
            addresses: vec!["2001:DB8::0205".into()],
            node_name: Some("dual".into()),
            ready: Some(true),
        }],
        deleting: false,
    };
    let egress_pod =
        Pod { host_ips: vec![NODE.into(), "2001:DB8::0010".into()], ..pod("e", Some("egress-a"), &["2001:DB8::0206"]) };
    let step = tracker.observe(
        0,
        vec![
            Observation::NodeUpserted(node),
            Observation::ServiceUpserted(web()),
            Observation::SliceUpserted(slice),
            Observation::PodUpserted(egress_pod),
            Observation::ListsComplete,
        ],
    );
    let listed = NrpState { services: vec![outbound("egress-a")], locations: vec![] };
    let issued = run_reading(&mut tracker, 0, step, &listed);
    let location = "2001:db8::10".to_owned();
    let expected = BTreeSet::from([
        (location.clone(), "2001:db8::205".to_owned(), vec![UID.to_owned()]),
        (location.clone(), "2001:db8::206".to_owned(), vec!["egress-a".to_owned()]),
    ]);
    assert_eq!(sent(&issued), expected);
    assert_eq!(tracker.nrp_view().keys().collect::<Vec<_>>(), vec![&location]);
}
