//! Ports of upstream engine and service-updater tests about the outbound lifecycle of
//! egress identities: creation, pods that come and go during it, the teardown and its failures.
//! Each test names the upstream test it ports in the comment directly above it
//! (`docs/conformance.md` is generated from those).

use super::*;

pub(super) const IDENTITY: &str = "egress-c";
pub(super) const HOST: &str = "10.224.0.6";

pub(super) fn pod(name: &str, ip: &str) -> Pod {
    Pod {
        namespace: "batch".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        egress_label: Some(IDENTITY.into()),
        phase: Some("Running".into()),
        pod_ips: vec![ip.into()],
        host_ips: vec![HOST.into()],
        ..Pod::default()
    }
}

pub(super) fn gone(name: &str) -> Observation {
    Observation::PodDeleted(ObjectKey::new("batch", name))
}

/// A tracker past start-up (NRP read, nothing registered), ready to write.
pub(super) fn started() -> Tracker {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("a read of NRP").id;
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
    assert!(step.commands.is_empty(), "{:?}", step.commands);
    tracker
}

/// What Azure answers when all goes well.
pub(super) fn ok(command: &Command) -> Outcome {
    match command {
        Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState::default()),
        _ => Outcome::Ok,
    }
}

/// Answers every command with `answer` (ticking at each wake-up) until the tracker issues none
/// and asks for no wake-up before the resync; returns the commands (Events and pod finalizers
/// left out: `drive_keeping` keeps what it is told) and the time.
pub(super) fn drive(
    tracker: &mut Tracker,
    now: u64,
    step: Step,
    answer: impl FnMut(&Command) -> Outcome,
) -> (Vec<Command>, u64) {
    drive_keeping(tracker, now, step, answer, |c| !matches!(c, Command::EmitEvent(_)) && !is_pod_finalizer(c))
}

/// A command about an egress pod's finalizer.
pub(super) fn is_pod_finalizer(command: &Command) -> bool {
    matches!(command, Command::SetFinalizer { service, .. } if service.kind.as_str() == "Pod")
}

/// [`drive`], returning the commands `keep` keeps.
pub(super) fn drive_keeping(
    tracker: &mut Tracker,
    mut now: u64,
    mut step: Step,
    mut answer: impl FnMut(&Command) -> Outcome,
    keep: impl Fn(&Command) -> bool,
) -> (Vec<Command>, u64) {
    let mut issued = Vec::new();
    for _ in 0..1_000 {
        if step.commands.is_empty() {
            match step.wake_at_ms.filter(|&at| at < now + timing::RESYNC_INTERVAL_MS / 2) {
                Some(at) => {
                    now = now.max(at);
                    step = tracker.tick(now);
                    continue;
                }
                None => return (issued, now),
            }
        }
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        issued.extend(step.commands.iter().map(|c| c.command.clone()).filter(|c| keep(c)));
        step = tracker.complete(now, results);
    }
    panic!("the tracker kept issuing commands: {issued:?}");
}

/// Issues and answers commands one at a time until `stop` says to hold one; returns the commands
/// before it and the one held (its id and command).
pub(super) fn drive_until(
    tracker: &mut Tracker,
    now: u64,
    mut step: Step,
    stop: impl Fn(&Command) -> bool,
) -> (Vec<Command>, (u64, Command)) {
    let mut issued = Vec::new();
    for _ in 0..100 {
        let Some(held) = step.commands.iter().find(|c| stop(&c.command)).map(|c| (c.id, c.command.clone())) else {
            let results = step.commands.iter().map(|c| (c.id, ok(&c.command))).collect();
            issued.extend(step.commands.iter().map(|c| c.command.clone()));
            step = tracker.complete(now, results);
            continue;
        };
        let others: Vec<(u64, Outcome)> =
            step.commands.iter().filter(|c| c.id != held.0).map(|c| (c.id, ok(&c.command))).collect();
        issued.extend(step.commands.iter().filter(|c| c.id != held.0).map(|c| c.command.clone()));
        if !others.is_empty() {
            let more = tracker.complete(now, others);
            assert!(more.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))), "{:?}", more.commands);
        }
        return (issued, held);
    }
    panic!("never issued the command to hold: {issued:?}");
}

/// The tracker with egress-c created and its one pod's address in NRP.
pub(super) fn provisioned() -> Tracker {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    assert!(issued.iter().any(is_location_update), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    tracker
}

pub(super) fn is_put_nat_gateway(command: &Command, associated: bool) -> bool {
    matches!(command, Command::PutNatGateway(n) if n.name == IDENTITY && n.associated == associated)
}

pub(super) fn is_delete(command: &Command, kind: ResourceKind) -> bool {
    matches!(command, Command::DeleteResource(r) if r.kind == kind)
}

pub(super) fn is_outbound(command: &Command, nat: Option<&str>, is_delete: bool) -> bool {
    matches!(command, Command::UpdateServices(r) if r.iter().any(|r| r.name == IDENTITY
        && r.service_type == NrpServiceType::Outbound
        && r.public_nat_gateway.as_deref() == nat
        && r.is_delete == is_delete))
}

pub(super) fn position(issued: &[Command], what: impl Fn(&Command) -> bool) -> usize {
    issued.iter().position(what).unwrap_or_else(|| panic!("not issued: {issued:?}"))
}

/// The teardown's commands, in upstream's order, after the drain.
fn assert_torn_down_in_order(issued: &[Command]) {
    let drain = position(issued, is_location_update);
    let unlink = position(issued, |c| is_outbound(c, None, false));
    let disassociate = position(issued, |c| is_put_nat_gateway(c, false));
    let unregister = position(issued, |c| is_outbound(c, None, true));
    let delete_nat = position(issued, |c| is_delete(c, ResourceKind::NatGateway));
    let delete_pip = position(issued, |c| is_delete(c, ResourceKind::PublicIp));
    assert!(drain < unlink && unlink < disassociate && disassociate < unregister, "{issued:?}");
    assert!(unregister < delete_nat && delete_nat < delete_pip, "{issued:?}");
}

// Upstream TestServiceUpdaterDeleteOutboundService_HappyPath, TestEngineDeleteService_WithLocations (the Outbound case),
// TestDisassociateNatGatewayFromServiceGateway_Mock
// (both halves of the disassociation, NRP's and the NAT gateway's, as commands) and
// TestEngineDeletePod_LastBufferedPodSchedulesDeletion (the last pod's going schedules the teardown):
// drain → clear the NAT gateway reference → disassociate → unregister → delete the NAT gateway →
// delete its public IP, and the identity is forgotten.
#[test]
fn the_last_pod_gone_drains_its_address_then_tears_the_identity_down_in_upstreams_order() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (issued, _) = drive(&mut tracker, NOW + 1, step, ok);
    assert_torn_down_in_order(&issued);
    assert_eq!(issued.len(), 6, "one drain and five teardown writes: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.nrp_view().is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestServiceUpdaterDeleteOutboundService_ToleratesAlreadyDeleted: a 404 on the unregister and
// on either delete counts as done; the teardown ends without a retry.
#[test]
fn a_teardown_whose_resources_are_already_gone_ends_without_a_retry() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let not_found = |c: &Command| match c {
        Command::DeleteResource(_) => failed(404),
        c if is_outbound(c, None, true) => failed(404),
        c => ok(c),
    };
    let (issued, _) = drive(&mut tracker, NOW + 1, step, not_found);
    assert_eq!(issued.iter().filter(|c| matches!(c, Command::DeleteResource(_))).count(), 2, "{issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestServiceUpdaterDeleteOutboundService_StepFailuresRetain: a failed NAT gateway delete keeps the
// teardown where it is (retried with backoff, the public IP not deleted before it), and it finishes
// once the delete succeeds.
#[test]
fn a_failing_nat_gateway_delete_is_retried_and_its_public_ip_waits_for_it() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let mut failures = 3;
    let flaky = |c: &Command| {
        if is_delete(c, ResourceKind::NatGateway) && failures > 0 {
            failures -= 1;
            return failed(500);
        }
        ok(c)
    };
    let (issued, _) = drive(&mut tracker, NOW + 1, step, flaky);
    let deletes: Vec<usize> = (0..issued.len()).filter(|&i| is_delete(&issued[i], ResourceKind::NatGateway)).collect();
    assert_eq!(deletes.len(), 4, "three failures, then the success: {issued:?}");
    assert_eq!(position(&issued, |c| is_delete(c, ResourceKind::PublicIp)), issued.len() - 1, "{issued:?}");
    assert_eq!(issued.iter().filter(|c| is_outbound(c, None, true)).count(), 1, "unregistered once: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestDeleteOutboundService_CountsSwallowedDisassociationFailure: a failed disassociation (either
// half) is logged and the teardown goes on. Differs: a Warn log line, not a counter.
#[test]
fn a_failed_disassociation_is_logged_and_the_teardown_goes_on() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let refuse = |c: &Command| {
        if is_outbound(c, None, false) || is_put_nat_gateway(c, false) { failed(400) } else { ok(c) }
    };
    let mut logs = Vec::new();
    let mut now = NOW + 1;
    let mut step = step;
    let mut issued = Vec::new();
    while !step.commands.is_empty() {
        logs.extend(step.logs.iter().map(|l| l.message.clone()));
        let results = step.commands.iter().map(|c| (c.id, refuse(&c.command))).collect();
        issued.extend(step.commands.iter().map(|c| c.command.clone()));
        now += 1;
        step = tracker.complete(now, results);
    }
    logs.extend(step.logs.iter().map(|l| l.message.clone()));
    assert_torn_down_in_order(&issued);
    assert_eq!(logs.iter().filter(|l| l.contains("the teardown goes on")).count(), 2, "{logs:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestServiceUpdaterCreateOutboundService_StepFailuresDoNotRecordNRPState: a registration that fails
// does not count as registered: the pod's address is not sent, and once the retry succeeds it is.
#[test]
fn a_failed_registration_holds_the_pods_address_until_the_retry_succeeds() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (before, (id, register)) = drive_until(&mut tracker, NOW, step, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(!before.iter().any(is_location_update), "{before:?}");
    let step = tracker.complete(NOW, vec![(id, failed(500))]);
    assert!(!tracker.egress().is_registered(IDENTITY));
    assert!(!step.commands.iter().any(|c| is_location_update(&c.command)), "{:?}", step.commands);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    assert_eq!(issued.first(), Some(&register), "the registration again first: {issued:?}");
    assert!(position(&issued, is_location_update) > 0);
    assert!(tracker.egress().is_registered(IDENTITY));
}

// Upstream TestEngineDeletePod_LastBufferedPodBeforeCreateAbortsService: a pod that comes and goes before
// anything was written for its identity leaves nothing to do.
#[test]
fn a_pod_gone_before_anything_was_written_for_its_identity_leaves_nothing_to_tear_down() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10")), gone("p")]);
    assert!(step.commands.is_empty(), "{:?}", step.commands);
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestEngineAddPod_DeletedDuringCreationNotResurrected and
// TestHandleEmptyOutboundService_FailedCreateSchedulesTeardown: the last pod goes while the NAT gateway PUT is
// in flight (and that PUT fails); the creation stops there, never registers, and what it may have
// made is torn down: the NAT gateway (disassociated, deleted) and the public IP. Nothing of the
// identity is created again.
#[test]
fn the_last_pod_gone_during_creation_stops_it_and_tears_down_what_it_made() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    assert!(step.commands.is_empty(), "one command at a time: {:?}", step.commands);
    let step = tracker.complete(NOW + 2, vec![(id, failed(500))]);
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    assert!(!issued.iter().any(|c| is_outbound(c, Some(IDENTITY), false)), "never registered: {issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::UpdateServices(_))), "nothing to unlink: {issued:?}");
    let disassociate = position(&issued, |c| is_put_nat_gateway(c, false));
    let delete_nat = position(&issued, |c| is_delete(c, ResourceKind::NatGateway));
    let delete_pip = position(&issued, |c| is_delete(c, ResourceKind::PublicIp));
    assert!(disassociate < delete_nat && delete_nat < delete_pip, "{issued:?}");
    assert!(!issued.iter().any(|c| is_put_nat_gateway(c, true)), "not resurrected: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestEngineAddPod_DuringDeletionPendingRevivesService and
// TestGuardStateTransitions_AddPodDuringDeletionPending_RevivesService: a pod that carries the identity again
// while its addresses drain (no teardown step sent yet) keeps it as it is: no Azure write for it.
#[test]
fn a_pod_back_while_the_identity_drains_revives_it_with_no_write() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    let step2 = tracker.complete(NOW + 3, vec![(id, Outcome::Ok)]);
    let mut all = step.commands;
    all.extend(step2.commands);
    let (issued, _) = drive(&mut tracker, NOW + 3, Step { commands: all, ..Step::default() }, ok);
    assert!(issued.iter().all(is_location_update), "only the new pod's address: {issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
    // The revived identity counts its one pod, as a recount from the pods does.
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
    assert_eq!(&tracker.egress().recount(), tracker.egress().ref_counts());
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestAddPod_DoesNotReviveOutboundServiceWhoseDeleteWasAttempted,
// TestEngineAddPod_DuringDeletionInProgressBuffersForRecreate and
// TestGuardStateTransitions_AddPodDuringDeletionInProgress_Buffers: a pod that carries the identity again once
// the teardown has started is held; the teardown finishes, then the identity is created anew
// and only then is the pod's address sent.
#[test]
fn a_pod_back_during_the_teardown_is_held_and_the_identity_created_again_after_it() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW + 1, step, |c| is_delete(c, ResourceKind::NatGateway));
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    assert!(step.commands.iter().all(|c| is_pod_finalizer(&c.command)), "only q's finalizer: {:?}", step.commands);
    let step = tracker.complete(NOW + 3, vec![(id, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, NOW + 3, step, ok);
    let delete_pip = position(&issued, |c| is_delete(c, ResourceKind::PublicIp));
    let put_pip = position(&issued, |c| matches!(c, Command::PutPublicIp(_)));
    let put_nat = position(&issued, |c| is_put_nat_gateway(c, true));
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    let address = position(&issued, is_location_update);
    assert!(delete_pip < put_pip && put_pip < put_nat && put_nat < register && register < address, "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestGuardAddPod_ExistingNRPNATGatewayAddsImmediately and TestGuardAddService_IdempotentForExistingNRPNAT: an identity NRP already lists (somebody
// else's Outbound service) is programmed at once, with nothing created for it.
#[test]
fn an_identity_nrp_already_lists_is_programmed_at_once_and_never_provisioned() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let read = step.commands[0].id;
    let listed =
        NrpService { name: IDENTITY.into(), service_type: "Outbound".into(), backend_pools: vec![], is_default: false };
    let snapshot = NrpState { services: vec![listed], locations: vec![] };
    tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    assert!(issued.iter().all(is_location_update) && !issued.is_empty(), "{issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (issued, _) = drive(&mut tracker, NOW + 1, step, ok);
    assert!(issued.iter().all(is_location_update), "drained, never torn down: {issued:?}");
}

// A state exported with an outbound operation in flight imports as the same tracker (version 6),
// and a version-5 state imports with no outbound lifecycle; a state whose outbound lifecycle
// waits for no work set is refused.
#[test]
fn outbound_lifecycles_survive_a_state_round_trip_and_a_version_5_state_has_none() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let _held = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let (version, payload) = tracker.export_state();
    assert_eq!(version, 7);
    let imported = Tracker::import_state(clb(), version, &payload).unwrap();
    assert_eq!(imported, tracker);
    assert_eq!(Tracker::import_state(clb(), 6, &tracker.export_state_v6()).unwrap().outbound, tracker.outbound);
    let v5 = Tracker::import_state(clb(), 5, &started().export_state_v5()).unwrap();
    assert!(v5.outbound().lifecycles.is_empty());
    let mut broken = tracker.outbound.clone();
    broken.lifecycles.get_mut(IDENTITY).unwrap().in_flight = None;
    let payload =
        postcard::to_allocvec(&(&tracker.state, &tracker.egress, &tracker.arm, &tracker.budget, &broken)).unwrap();
    let why = corrupt(Tracker::import_state(clb(), 6, &payload));
    assert!(why.contains("whose outbound lifecycle does not wait for it"), "{why}");
}

// Upstream TestGuardOrphanedNATGatewayUsesOutboundDeletionPath and
// TestGuardOutboundTeardownRespectsLivePodRefCount: after a restart with no state, a NAT gateway of ours
// (by its shape) that no pod carries is torn down through the outbound path; one a live pod carries,
// registered, is adopted with nothing written; the RP's default and foreign NAT gateways are not
// touched.
#[test]
fn at_start_up_our_nat_gateways_are_adopted_or_torn_down_by_their_pods_and_no_other_is_touched() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let live = Pod { egress_label: Some("egress-live".into()), ..pod("live", "10.244.2.12") };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(live), Observation::ListsComplete]);
    let read = step.commands[0].id;
    let registered = |name: &str| NrpService {
        name: name.into(),
        service_type: "Outbound".into(),
        backend_pools: vec![],
        is_default: name == "default-natgw",
    };
    let services = vec![registered("egress-live"), registered("default-natgw")];
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(NrpState { services, locations: vec![] }))]);
    let inventory_read = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("the inventory").id;
    let nat = |name: &str, ips: &[&str]| ListedNatGateway {
        name: name.into(),
        public_ips: ips.iter().map(|s| (*s).to_owned()).collect(),
        public_ips_v6: vec![],
        associated: true,
        as_put: true,
    };
    let inventory = ArmInventory {
        nat_gateways: vec![
            nat("egress-live", &["egress-live-pip"]),
            nat("egress-old", &["egress-old-pip"]),
            nat("default-natgw", &["default-natgw-pip"]),
            nat("theirs", &["shared-pip"]),
        ],
        ..ArmInventory::default()
    };
    let step = tracker.complete(NOW, vec![(inventory_read, Outcome::ArmInventory(inventory))]);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    let touched: BTreeSet<String> = issued
        .iter()
        .filter_map(|c| match c {
            Command::PutNatGateway(n) => Some(n.name.clone()),
            Command::DeleteResource(r) => Some(r.name.clone()),
            Command::UpdateServices(r) => Some(r[0].name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(touched, BTreeSet::from(["egress-old".to_owned(), "egress-old-pip".to_owned()]), "{issued:?}");
    assert!(issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway)));
    assert_eq!(tracker.outbound().lifecycles.keys().collect::<Vec<_>>(), ["egress-live"]);
    assert_eq!(tracker.outbound().lifecycles["egress-live"].phase, Phase::Created);
}

// Upstream TestGuardEgressPublicIPsAreSweptOnceNATGatewayIsGone, TestGuardDefaultNATGatewayPIPSurvivesOrphanSweep,
// TestCleanupOrphanedPublicIPs_SweepsEveryUnusedManagedAddress, TestPIPNamesInAzureFromList_IncludesAddressLessPIP,
// TestGuardOrphanCleanup_PIPOnlyServiceScheduledForDeletion, TestGuardOrphanCleanup_PIPNotScheduledWhenDesiredOrHasLB,
// TestCleanupOrphanedPublicIPs_KeepsPIPForServiceStillDesiredInKubernetes, TestBuildNRPState_FailsOnPublicIPListError and
// TestInitializeFromCluster_ReusesFetchedPIPListForOrphanCleanup (one inventory, read once, serves the sweep; a
// failed read is retried before anything is swept): after a restart, the public IPs a teardown cut short left
// without their NAT gateway (both families, with or without an address) are deleted, as is a Service's public
// IP left alone; the RP's default's, one a pod's identity still needs, one a load balancer or NAT gateway uses,
// one NRP references, one not of our shape and one of another name are not touched.
#[test]
fn at_start_up_egress_public_ips_left_without_their_nat_gateway_are_swept_and_nothing_else_is() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let live = Pod { egress_label: Some("egress-live".into()), ..pod("live", "10.244.2.12") };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(live), Observation::ListsComplete]);
    let read = step.commands[0].id;
    let theirs =
        NrpService { name: "egress-theirs".into(), service_type: "Outbound".into(), backend_pools: vec![], is_default: false };
    let snapshot = NrpState { services: vec![theirs], locations: vec![] };
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    let inventory_read = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("the inventory").id;
    let failed = Outcome::Failed(Failure { status: 500, code: None, retry_after_ms: None, message: "list failed".into() });
    let step = tracker.complete(NOW, vec![(inventory_read, failed)]);
    assert!(step.commands.is_empty(), "nothing written, nothing swept before the inventory: {:?}", step.commands);
    let ip = |name: &str, version: IpVersion, address: Option<&str>, as_put: bool| ListedPublicIp {
        name: name.into(),
        version,
        address: address.map(Into::into),
        as_put,
    };
    let gone_service = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e77";
    let inventory = ArmInventory {
        public_ips: vec![
            ip("egress-old-pip", IpVersion::Ipv4, Some("20.0.0.5"), true),
            ip("egress-old-pip-v6", IpVersion::Ipv6, None, true),
            ip("default-natgw-pip", IpVersion::Ipv4, Some("20.0.0.6"), true),
            ip("egress-live-pip", IpVersion::Ipv4, Some("20.0.0.7"), true),
            ip("egress-theirs-pip", IpVersion::Ipv4, Some("20.0.0.8"), true),
            ip("egress-basic-pip", IpVersion::Ipv4, Some("20.0.0.9"), false),
            ip("egress-used-pip", IpVersion::Ipv4, Some("20.0.0.10"), true),
            ip("frontend", IpVersion::Ipv4, Some("20.0.0.11"), true),
            ip(&format!("{gone_service}-pip"), IpVersion::Ipv4, None, true),
        ],
        load_balancers: vec![ListedLoadBalancer {
            name: "someone-elses-lb".into(),
            shape: Some(LoadBalancer {
                name: "someone-elses-lb".into(),
                public_ip: "egress-used-pip".into(),
                backend_pool: "pool".into(),
                rules: vec![],
            }),
        }],
        ..ArmInventory::default()
    };
    let step = tracker.tick(NOW + 60_000);
    let answer = |c: &Command| match c {
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        other => ok(other),
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 60_000, step, answer, |c| !matches!(c, Command::EmitEvent(_)));
    let deleted: BTreeSet<String> = issued
        .iter()
        .filter_map(|c| match c {
            Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp => Some(r.name.clone()),
            _ => None,
        })
        .collect();
    let want = ["egress-old-pip", "egress-old-pip-v6", &format!("{gone_service}-pip")].map(|s| s.to_owned());
    assert_eq!(deleted, BTreeSet::from(want), "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway)));
    assert!(!tracker.outbound().lifecycles.contains_key("egress-old"), "the sweep ended");
    assert!(tracker.outbound().lifecycles.contains_key("egress-live"), "the live pod's identity is created");
}

// Regression: fuzz target tracker. A registration of the Outbound service took effect but was
// answered with a failure (its response lost), and the last pod went before the retry: the
// mirror had the identity unregistered, so the teardown skipped the unregister, and the NAT
// gateway delete the RP then refused as in use (`InUseNatGatewayCannotBeDeleted`) was retried
// for ever, the pod held by its finalizer with it. A teardown now unregisters after a
// registration that failed (it may have taken effect), and it ends.
#[test]
fn a_teardown_after_a_registration_whose_answer_was_lost_unregisters_before_deleting_the_nat_gateway() {
    use std::cell::Cell;
    let registered = Cell::new(false);
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (register, _)) = drive_until(&mut tracker, NOW, step, |c| is_outbound(c, Some(IDENTITY), false));
    registered.set(true); // it took effect
    let step = tracker.complete(NOW, vec![(register, failed(500))]);
    let step = {
        let more = tracker.observe(NOW, vec![gone("p")]);
        Step { commands: step.commands.into_iter().chain(more.commands).collect(), ..more }
    };
    let answer = |c: &Command| match c {
        c if is_outbound(c, None, true) => {
            registered.set(false);
            Outcome::Ok
        }
        c if is_delete(c, ResourceKind::NatGateway) && registered.get() => Outcome::Failed(Failure {
            status: 400,
            code: Some("InUseNatGatewayCannotBeDeleted".into()),
            retry_after_ms: None,
            message: "in use".into(),
        }),
        Command::ReadNrp => {
            let services = registered.get().then(|| NrpService {
                name: IDENTITY.into(),
                service_type: "Outbound".into(),
                backend_pools: vec![],
                is_default: false,
            });
            Outcome::NrpSnapshot(NrpState { services: services.into_iter().collect(), locations: vec![] })
        }
        c => ok(c),
    };
    let (issued, _) = drive(&mut tracker, NOW, step, answer);
    let unregister = position(&issued, |c| is_outbound(c, None, true));
    let deletes: Vec<usize> = (0..issued.len()).filter(|&i| is_delete(&issued[i], ResourceKind::NatGateway)).collect();
    assert_eq!(deletes.len(), 1, "deleted once, never refused: {issued:?}");
    assert!(unregister < deletes[0], "unregistered first: {issued:?}");
    assert!(!registered.get());
    assert!(tracker.outbound().lifecycles.is_empty(), "the teardown ended");
}
