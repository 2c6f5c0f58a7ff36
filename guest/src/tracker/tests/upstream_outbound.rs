//! Ports of upstream engine and service-updater tests about the outbound lifecycle of
//! egress identities: creation, pods that come and go during it, the teardown and its failures.
//! Each test names the upstream test it ports in the comment directly above it
//! (`docs/conformance.md` is generated from those).

use super::*;
use std::collections::BTreeSet;

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

/// Answers every command but `held` with `answer`, ticking at each wake-up before `until`; returns
/// what was issued meanwhile (`held` stays unanswered: a write that hangs).
pub(super) fn drive_all_but(
    tracker: &mut Tracker,
    mut now: u64,
    mut step: Step,
    held: u64,
    until: u64,
    answer: impl Fn(&Command) -> Outcome,
) -> Vec<Command> {
    let mut meanwhile = Vec::new();
    loop {
        let answered: Vec<(u64, Outcome)> =
            step.commands.iter().filter(|c| c.id != held).map(|c| (c.id, answer(&c.command))).collect();
        meanwhile.extend(step.commands.iter().filter(|c| c.id != held).map(|c| c.command.clone()));
        if !answered.is_empty() {
            step = tracker.complete(now, answered);
            continue;
        }
        match step.wake_at_ms.filter(|&at| at < until) {
            Some(at) => {
                now = now.max(at);
                step = tracker.tick(now);
            }
            None => return meanwhile,
        }
    }
}

/// NRP's refusal to unregister a service that addresses still map to.
pub(super) fn overlay_mappings_refusal() -> Outcome {
    Outcome::Failed(Failure {
        status: 400,
        code: Some(OVERLAY_MAPPINGS_CODE.into()),
        retry_after_ms: None,
        message: "mapped".into(),
    })
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

/// What a creation made (the NAT gateway, its public IP) torn down in order: disassociated,
/// deleted, then its public IP. Returns where the NAT gateway's delete is.
fn assert_made_resources_torn_down_in_order(issued: &[Command]) -> usize {
    let disassociate = position(issued, |c| is_put_nat_gateway(c, false));
    let delete_nat = position(issued, |c| is_delete(c, ResourceKind::NatGateway));
    let delete_pip = position(issued, |c| is_delete(c, ResourceKind::PublicIp));
    assert!(disassociate < delete_nat && delete_nat < delete_pip, "{issued:?}");
    delete_nat
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
// half) is logged and the teardown goes on (its count is asserted in upstream_metrics.rs).
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

// Upstream TestEngineDeletePod_LastBufferedPodBeforeCreateAbortsService and
// TestHandleEmptyOutboundService_FailedCreateSchedulesTeardown (a create never dispatched is aborted): a pod
// that comes and goes before anything was written for its identity leaves nothing to do.
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
    assert_made_resources_torn_down_in_order(&issued);
    assert!(!issued.iter().any(|c| is_put_nat_gateway(c, true)), "not resurrected: {issued:?}");
    assert!(!issued.iter().any(is_location_update), "the address is never sent: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

/// The services each address a location update sends is mapped to, by address.
fn sent_addresses(issued: &[Command]) -> Vec<(String, Vec<String>)> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::UpdateAddressLocations(locations) => Some(locations),
            _ => None,
        })
        .flatten()
        .flat_map(|l| l.addresses.iter().map(|a| (a.address.clone(), a.services.clone())))
        .collect()
}

fn is_teardown_write(command: &Command) -> bool {
    matches!(command, Command::UpdateServices(_) | Command::PutNatGateway(_) | Command::DeleteResource(_))
}

// Upstream TestEngineDeleteService_WithLocations (held and failed drain): while NRP still maps the
// identity's address, no teardown write is issued: not beside the drain, not while it is in
// flight, not after NRP refused it (the drain alone is retried); the teardown starts once NRP
// accepted the drain.
#[test]
fn no_teardown_write_is_issued_until_nrp_accepted_the_drain_of_the_identitys_address() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (before, (id, drain)) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    assert!(!before.iter().any(is_teardown_write), "nothing beside the drain: {before:?}");
    assert!(matches!(&drain, Command::UpdateAddressLocations(l) if l.len() == 1 && l[0].location == HOST), "{drain:?}");
    assert!(tracker.tick(NOW + 1).commands.is_empty(), "nothing while the drain is in flight");
    let step = tracker.complete(NOW + 2, vec![(id, failed(500))]);
    assert!(!step.commands.iter().any(|c| is_teardown_write(&c.command)), "{:?}", step.commands);
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.10"), "still mapped in NRP's mirror");
    assert!(tracker.outbound().lifecycles.contains_key(IDENTITY));
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    assert_eq!(issued.first(), Some(&drain), "the drain again first: {issued:?}");
    assert_torn_down_in_order(&issued);
    assert_eq!(issued.iter().filter(|c| is_location_update(c)).count(), 1, "{issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.nrp_view().is_empty());
}

// Upstream TestHandleEmptyOutboundService_FailedCreateSchedulesTeardown (a create that already
// reached Azure): the NAT gateway PUT fails first (the identity backs off, nothing in NRP), then
// the last pod goes: what the creation may have made is still torn down (disassociate, delete the
// NAT gateway, then its public IP), nothing registered, and the identity forgotten.
#[test]
fn the_last_pod_gone_after_a_failed_creation_still_tears_down_what_it_made() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.complete(NOW, vec![(id, failed(500))]);
    assert!(step.commands.is_empty(), "backing off: {:?}", step.commands);
    assert!(step.wake_at_ms.is_some_and(|at| at > NOW), "a retry is scheduled: {:?}", step.wake_at_ms);
    assert!(!tracker.egress().is_registered(IDENTITY));
    assert!(tracker.outbound().lifecycles.contains_key(IDENTITY), "still tracked");
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (issued, _) = drive(&mut tracker, NOW + 1, step, ok);
    assert!(!issued.iter().any(|c| matches!(c, Command::UpdateServices(_))), "never registered: {issued:?}");
    assert!(!issued.iter().any(is_location_update), "{issued:?}");
    assert!(!issued.iter().any(|c| is_put_nat_gateway(c, true)), "not created again: {issued:?}");
    assert_made_resources_torn_down_in_order(&issued);
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestEngineAddPod_DeletedDuringCreationNotResurrected (the creation succeeds): the last
// pod goes while the NAT gateway PUT is in flight, which then succeeds; its address is never sent
// to NRP, the identity counts no pod, and what was made is torn down (unregistered first if it was
// registered), never created again.
#[test]
fn the_last_pod_gone_during_a_creation_that_succeeds_is_not_resurrected() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    assert!(step.commands.is_empty(), "one command at a time: {:?}", step.commands);
    let step = tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    assert!(sent_addresses(&issued).is_empty(), "the address is never sent: {issued:?}");
    assert!(tracker.egress().ref_counts().is_empty(), "{:?}", tracker.egress().ref_counts());
    assert!(tracker.egress().recount().is_empty());
    let delete_nat = assert_made_resources_torn_down_in_order(&issued);
    if let Some(register) = issued.iter().position(|c| is_outbound(c, Some(IDENTITY), false)) {
        let unregister = position(&issued, |c| is_outbound(c, None, true));
        assert!(register < unregister && unregister < delete_nat, "{issued:?}");
    }
    assert_eq!(issued.iter().filter(|c| is_put_nat_gateway(c, true)).count(), 0, "not resurrected: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.nrp_view().is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestDeletePod_MatchingUIDStillCancelsBufferedAddress,
// TestDeletePod_BufferedDeleteWithoutIdentityCancelsByAddress and
// TestDeletePodWithoutAddresses_MatchingUIDCancelsBufferedAddresses (in effect: a deletion here is
// keyed by namespace/name and carries no address, and the tracker finds the pod's addresses
// itself): a pod deleted while its identity is being created, another pod keeping the identity
// wanted, has its address cancelled: once the identity is registered only the other pod's
// address is sent, and the identity counts one pod.
#[test]
fn a_pod_deleted_during_its_identitys_creation_never_has_its_address_sent() {
    let mut tracker = started();
    let pods = [pod("p", "10.244.2.10"), pod("q", "10.244.2.11")].map(Observation::PodUpserted);
    let step = tracker.observe(NOW, pods.into());
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let release = |c: &Issued| matches!(&c.command, Command::SetFinalizer { service, present: false, .. } if service.name.as_str() == "p");
    assert!(step.commands.iter().all(release), "only p's finalizer released: {:?}", step.commands);
    let step = tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.11".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_))), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestDeletePod_BufferedStaleDeleteKeepsSameIPReplacement: two pods carry the identity at
// one address while it is being created; the old one's deletion cancels only its own part: the
// address is still sent, mapped to the identity, once it is registered, and nothing is torn down.
#[test]
fn a_pod_deleted_during_creation_leaves_the_address_another_pod_carries_to_be_sent() {
    let mut tracker = started();
    let pods = [pod("p", "10.244.2.10"), pod("q", "10.244.2.10")].map(Observation::PodUpserted);
    let step = tracker.observe(NOW, pods.into());
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let release = |c: &Issued| matches!(&c.command, Command::SetFinalizer { service, present: false, .. } if service.name.as_str() == "p");
    assert!(step.commands.iter().all(release), "only p's finalizer released: {:?}", step.commands);
    let step = tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.10".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY));
    assert!(
        !issued.iter().any(|c| matches!(c, Command::DeleteResource(_)) || is_put_nat_gateway(c, false)),
        "{issued:?}"
    );
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

/// The pod deleted while the finalizer holds it.
fn deleting_held(pod: Pod) -> Pod {
    Pod { deleting: true, finalizers: vec![super::super::egress::finalizers::FINALIZER.into()], ..pod }
}

fn is_release(command: &Command, name: &str, uid: &str) -> bool {
    matches!(command, Command::SetFinalizer { service, present: false, .. }
        if service.kind.as_str() == "Pod" && service.name.as_str() == name && service.uid.as_str() == uid)
}

// Upstream TestRemoveLastPodFinalizers_SurfacesRetryExhaustion (the last pod's release, after the
// teardown): a failing release of the last pod's finalizer is kept and retried with backoff (the
// tracker is not quiet, the pod still tracked), the operator is warned once, and it ends once the
// release succeeds. Differs: retried for as long as it fails, no budget to exhaust.
#[test]
fn a_failing_release_of_the_last_pods_finalizer_after_the_teardown_is_retried_and_warned_about() {
    use super::super::egress::finalizers::reason::POD_FINALIZER_FAILED;
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")))]);
    let (before, (id, _)) = drive_until(&mut tracker, NOW + 1, step, |c| is_release(c, "p", "uid-p"));
    let delete_nat = position(&before, |c| is_delete(c, ResourceKind::NatGateway));
    assert!(delete_nat < position(&before, |c| is_delete(c, ResourceKind::PublicIp)), "{before:?}");
    let step = tracker.complete(
        NOW + 2,
        vec![(
            id,
            Outcome::Failed(Failure {
                status: 500,
                code: Some("InternalError".into()),
                retry_after_ms: None,
                message: "refused".into(),
            }),
        )],
    );
    assert!(!tracker.is_quiet(), "the failed release is kept for a retry");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_some(), "the pod's record is kept");
    assert!(step.wake_at_ms.is_some_and(|at| at > NOW + 2), "retried after a backoff: {:?}", step.wake_at_ms);
    assert!(!step.commands.iter().any(|c| is_release(&c.command, "p", "uid-p")), "not at once: {:?}", step.commands);
    let mut failures = 1;
    let answer = |c: &Command| {
        if is_release(c, "p", "uid-p") && failures > 0 {
            failures -= 1;
            return failed(500);
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, answer, |_| true);
    assert_eq!(issued.iter().filter(|c| is_release(c, "p", "uid-p")).count(), 2, "{issued:?}");
    let warnings =
        issued.iter().filter(|c| matches!(c, Command::EmitEvent(e) if e.reason == POD_FINALIZER_FAILED)).count();
    assert_eq!(warnings, 1, "warned once: {issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_) | Command::PutNatGateway(_))), "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(tracker.is_quiet());
}

// Upstream TestEngineDeletePod_DuplicateEventKeepsDrainGate: the deleting pod delivered again while
// the drain of its address is in flight changes nothing: no release and no second drain; its
// finalizer is released once, after NRP accepted the drain.
#[test]
fn a_deleting_pod_delivered_again_while_its_drain_is_in_flight_keeps_the_release_behind_it() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    drive(&mut tracker, NOW, step, ok);
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")))]);
    let (before, (id, _)) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    assert!(!before.iter().any(|c| is_release(c, "p", "uid-p")), "{before:?}");
    let again = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")))]);
    assert!(
        !again.commands.iter().any(|c| is_release(&c.command, "p", "uid-p") || is_location_update(&c.command)),
        "{:?}",
        again.commands
    );
    assert!(tracker.tick(NOW + 3).commands.is_empty(), "nothing while the drain is in flight");
    let step = tracker.complete(NOW + 4, vec![(id, Outcome::Ok)]);
    let step = Step { commands: again.commands.into_iter().chain(step.commands).collect(), ..step };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 4, step, ok, |_| true);
    assert_eq!(issued.iter().filter(|c| is_release(c, "p", "uid-p")).count(), 1, "{issued:?}");
    assert!(!issued.iter().any(is_location_update), "drained once: {issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
}

// Upstream TestGuardRemoveLastPodFinalizersIsScopedToItsService: two identities' last pods are
// deleted together; one teardown ends and releases its own pod while the other's NAT gateway
// delete keeps failing: the other last pod's finalizer is not released with it (its record kept);
// it is released only after its own NAT gateway delete succeeds.
#[test]
fn a_teardown_that_ends_releases_only_its_own_last_pod_not_another_identitys() {
    let mut tracker = provisioned();
    let other = || Pod { egress_label: Some("egress-d".into()), ..pod("other", "10.244.2.20") };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(other())]);
    drive(&mut tracker, NOW, step, ok);
    assert_eq!(tracker.outbound().lifecycles["egress-d"].phase, Phase::Created);
    let gone_pods = [deleting_held(pod("p", "10.244.2.10")), deleting_held(other())].map(Observation::PodUpserted);
    let step = tracker.observe(NOW + 1, gone_pods.into());
    let is_other_nat = |c: &Command| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway && r.name == "egress-d");
    let mut failures = 4;
    let answer = |c: &Command| {
        if is_other_nat(c) && failures > 0 {
            failures -= 1;
            return failed(500);
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, answer, |c| !matches!(c, Command::EmitEvent(_)));
    let ours = |c: &Command| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway && r.name == IDENTITY);
    let release = position(&issued, |c| is_release(c, "p", "uid-p"));
    let other_deletes: Vec<usize> = (0..issued.len()).filter(|&i| is_other_nat(&issued[i])).collect();
    assert_eq!(other_deletes.len(), 5, "four failures, then the success: {issued:?}");
    assert!(position(&issued, ours) < release && release < other_deletes[1], "p is not held by egress-d: {issued:?}");
    let other_release = position(&issued, |c| is_release(c, "other", "uid-other"));
    assert!(other_release > other_deletes[4], "released only after its own NAT gateway delete: {issued:?}");
    assert_eq!(issued.iter().filter(|c| is_release(c, "other", "uid-other")).count(), 1, "{issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

/// The finalizer commands about pod `name`: (UID, added).
fn finalizers_of(issued: &[Command], name: &str) -> Vec<(String, bool)> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::SetFinalizer { service, present, .. }
                if service.kind.as_str() == "Pod" && service.name.as_str() == name =>
            {
                Some((service.uid.to_string(), *present))
            }
            _ => None,
        })
        .collect()
}

/// `old` carries the identity and its creation is held at the NAT gateway PUT; `old` is deleted
/// and `new`, a same-name replacement, arrives; then the creation is let through. Returns every
/// command after the held PUT, and the tracker.
fn replaced_during_creation(old: Pod, new: Pod) -> (Vec<Command>, Tracker) {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(old.clone())]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let mut all = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(old))]).commands;
    all.extend(tracker.observe(NOW + 1, vec![Observation::PodUpserted(new)]).commands);
    all.extend(tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]).commands);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, Step { commands: all, ..Step::default() }, ok, |c| {
        !matches!(c, Command::EmitEvent(_))
    });
    (issued, tracker)
}

// Upstream TestDeletePod_StaleDeleteDoesNotDrainReplacementAddress (upstream's order): while the identity is
// created, a same-name replacement (a new UID) carries the pod's address, and only then is a deletion of the old
// UID read (stale): it changes nothing. The replacement keeps the identity counted, so the creation goes on (no
// teardown, one NAT gateway PUT, one registration); the address is sent once, mapped to the identity, after the
// registration; the replacement's finalizer is added and never released. Differs: upstream also releases the old
// UID's finalizer (ReleaseNoDrain); here the stale read writes nothing (see `super::super::egress::finalizers`).
#[test]
fn a_stale_deletion_of_the_old_uid_after_a_same_address_replacement_during_creation_lets_the_creation_go_on() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let new = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.10") };
    // The replacement holds the finalizer (its addition answered) when the stale deletion is read.
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(new)]);
    let mut issued: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
    let mut all = tracker.complete(NOW + 1, step.commands.iter().map(|c| (c.id, ok(&c.command))).collect()).commands;
    let stale = Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")));
    all.extend(tracker.observe(NOW + 1, vec![stale]).commands);
    all.extend(tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]).commands);
    issued.extend(
        drive_keeping(&mut tracker, NOW + 2, Step { commands: all, ..Step::default() }, ok, |c| {
            !matches!(c, Command::EmitEvent(_))
        })
        .0,
    );
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_))), "no teardown: {issued:?}");
    assert!(!issued.iter().any(|c| is_put_nat_gateway(c, true)), "not created again: {issued:?}");
    assert_eq!(issued.iter().filter(|c| is_outbound(c, Some(IDENTITY), false)).count(), 1, "{issued:?}");
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.10".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert_eq!(finalizers_of(&issued, "p"), [("uid-p2".to_owned(), true)], "{issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
    assert!(tracker.is_quiet());
}

// Upstream TestDeletePod_StaleDeleteDoesNotDrainReplacementAddress (the order a watch gives): while the identity
// is created, a pod is deleted and then a same-name replacement (a new UID) carries the same address: the old
// pod's deletion drains nothing; the address is sent, mapped to the identity, once it is registered (again); the
// replacement's finalizer is added and never released, and only the old UID's is. Differs: here the deletion is
// not stale (the old UID is the one held), so the old pod leaving pre-empts the creation (docs/design.md §4, "delete that
// pre-empts an in-flight create") and the identity is torn down and created again for the replacement; the
// outcome is the same. The test above is upstream's order, where the creation goes on.
#[test]
fn a_pod_replaced_at_the_same_address_during_creation_leaves_the_replacements_address_to_be_sent() {
    let new = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.10") };
    let (issued, tracker) = replaced_during_creation(pod("p", "10.244.2.10"), new);
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.10".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY));
    let last_register = issued.iter().rposition(|c| is_outbound(c, Some(IDENTITY), false)).unwrap();
    assert!(last_register < position(&issued, is_location_update), "{issued:?}");
    let finalizers = finalizers_of(&issued, "p");
    assert!(finalizers.contains(&("uid-p2".to_owned(), true)), "{issued:?}");
    assert!(!finalizers.contains(&("uid-p2".to_owned(), false)), "{issued:?}");
    assert!(finalizers.iter().all(|(uid, present)| *present || uid == "uid-p"), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1));
}

// Upstream TestDeletePodWithoutAddresses_KeepsReplacementBufferedAddresses: while the identity is
// created, a pod that never had an address is deleted and its same-name replacement (a new UID)
// has one: the replacement's address is sent, mapped to the identity, once it is registered, and
// its finalizer is never released. Differs as the test above: torn down and created again.
#[test]
fn a_pod_without_an_address_replaced_during_creation_leaves_the_replacements_address_to_be_sent() {
    let old = Pod { pod_ips: vec![], phase: Some("Pending".into()), ..pod("p", "") };
    let new = Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.12") };
    let (issued, tracker) = replaced_during_creation(old, new);
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.12".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.12"]);
    assert!(!finalizers_of(&issued, "p").contains(&("uid-p2".to_owned(), false)), "{issued:?}");
    let last_register = issued.iter().rposition(|c| is_outbound(c, Some(IDENTITY), false)).unwrap();
    assert!(last_register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestEngineOnServiceCreationComplete_LateLastPodFinalizerRedispatches (both subtests; the
// snapshot race is Go plumbing): the last pod, holding the finalizer, is deleted while its
// identity is created; the creation succeeds and the teardown follows; a replacement pod arrives
// during the teardown: the teardown still ends and releases the deleted pod's finalizer (once,
// after the NAT gateway delete), then the identity is created again for the replacement, whose
// address is sent last and whose finalizer is kept.
#[test]
fn a_last_pod_deleted_during_creation_is_released_after_the_teardown_and_a_replacement_recreates_the_identity() {
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_put_nat_gateway(c, true));
    let mut all =
        tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")))]).commands;
    all.extend(tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]).commands);
    let step = Step { commands: all, ..Step::default() };
    let (before, (id, _)) = drive_until(&mut tracker, NOW + 2, step, |c| is_delete(c, ResourceKind::NatGateway));
    assert!(!before.iter().any(|c| is_release(c, "p", "uid-p")), "{before:?}");
    let mut all = tracker.observe(NOW + 3, vec![Observation::PodUpserted(pod("r", "10.244.2.12"))]).commands;
    all.extend(tracker.complete(NOW + 4, vec![(id, Outcome::Ok)]).commands);
    let step = Step { commands: all, ..Step::default() };
    let mut issued = before;
    let delete_nat = issued.len();
    issued.push(Command::DeleteResource(ResourceRef { kind: ResourceKind::NatGateway, name: IDENTITY.into() }));
    issued.extend(drive_keeping(&mut tracker, NOW + 4, step, ok, |c| !matches!(c, Command::EmitEvent(_))).0);
    let release = position(&issued, |c| is_release(c, "p", "uid-p"));
    assert!(delete_nat < release, "{issued:?}");
    assert_eq!(issued.iter().filter(|c| is_release(c, "p", "uid-p")).count(), 1, "{issued:?}");
    let delete_pip = position(&issued, |c| is_delete(c, ResourceKind::PublicIp));
    let put_pip = position(&issued, |c| matches!(c, Command::PutPublicIp(_)));
    let recreate = delete_nat + position(&issued[delete_nat..], |c| is_put_nat_gateway(c, true));
    let register = position(&issued, |c| is_outbound(c, Some(IDENTITY), false));
    let address = position(&issued, is_location_update);
    assert!(delete_pip < put_pip && put_pip < recreate && recreate < register && register < address, "{issued:?}");
    assert_eq!(sent_addresses(&issued), [("10.244.2.12".to_owned(), vec![IDENTITY.to_owned()])], "{issued:?}");
    assert!(!finalizers_of(&issued, "r").iter().any(|(_, present)| !present), "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestEngineDeletePod_DualStackRemovesAllAddressesAtomically (the live path): a dual-stack
// pod, its identity's only one, has both addresses in NRP; deleted, both are drained, and its one
// finalizer is released once, after both drains and the teardown.
#[test]
fn a_dual_stack_last_pod_is_drained_of_both_addresses_and_released_once_after_the_teardown() {
    let mut tracker = started();
    let node = Node { name: "n".into(), internal_ips: vec![HOST.into(), "fd00::6".into()] };
    let dual = Pod {
        pod_ips: vec!["10.244.2.10".into(), "fd00:10::a".into()],
        host_ips: vec![HOST.into(), "fd00::6".into()],
        ..pod("p", "10.244.2.10")
    };
    let step = tracker.observe(NOW, vec![Observation::NodeUpserted(node), Observation::PodUpserted(dual.clone())]);
    drive(&mut tracker, NOW, step, ok);
    assert!(tracker.nrp_view()[HOST].contains_key("10.244.2.10"), "{:?}", tracker.nrp_view());
    assert!(tracker.nrp_view()["fd00::6"].contains_key("fd00:10::a"), "{:?}", tracker.nrp_view());
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&1), "one count per pod");
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(dual))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, |c| !matches!(c, Command::EmitEvent(_)));
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
    assert_eq!(finalizers_of(&issued, "p"), [("uid-p".to_owned(), false)], "released once: {issued:?}");
    let release = position(&issued, |c| is_release(c, "p", "uid-p"));
    let last_drain = issued.iter().rposition(is_location_update).unwrap();
    assert!(last_drain < release, "{issued:?}");
    assert!(position(&issued, |c| is_delete(c, ResourceKind::NatGateway)) < release, "{issued:?}");
    assert!(tracker.nrp_view().is_empty(), "{:?}", tracker.nrp_view());
    assert!(tracker.egress().ref_counts().is_empty());
}

// Upstream TestGuardConcurrency_AddPodDeletePod_RefCountSymmetry (the goroutine race is Go plumbing;
// the tracker is single-threaded): twenty pods of one identity over five hosts, some sharing an
// address, all added and then all deleted in another order: the identity counts the twenty, then
// none; nothing is left in NRP's mirror and the identity is torn down.
#[test]
fn many_pods_of_one_identity_added_and_deleted_leave_no_count_and_nothing_behind() {
    let mut tracker = started();
    let many: Vec<Pod> = (0..20)
        .map(|i| Pod {
            host_ips: vec![format!("10.224.0.{}", i % 5 + 1)],
            ..pod(&format!("p-{i}"), &format!("10.244.2.{}", i % 15 + 1))
        })
        .collect();
    let step = tracker.observe(NOW, many.into_iter().map(Observation::PodUpserted).collect());
    drive(&mut tracker, NOW, step, ok);
    assert_eq!(tracker.egress().ref_counts().get(IDENTITY), Some(&20));
    assert_eq!(&tracker.egress().recount(), tracker.egress().ref_counts());
    let mapped: usize = tracker.nrp_view().values().map(BTreeMap::len).sum();
    assert_eq!(mapped, 15, "15 distinct (host, address) pairs: {:?}", tracker.nrp_view());
    let order = (0..20).map(|i| (i * 7) % 20); // 0, 7, 14, 1, 8, ...: every pod once
    let step = tracker.observe(NOW + 1, order.map(|i| gone(&format!("p-{i}"))).collect());
    let (issued, _) = drive(&mut tracker, NOW + 1, step, ok);
    assert!(issued.iter().any(|c| is_delete(c, ResourceKind::NatGateway)), "{issued:?}");
    assert!(tracker.egress().ref_counts().is_empty(), "{:?}", tracker.egress().ref_counts());
    assert!(tracker.egress().recount().is_empty());
    assert!(tracker.nrp_view().is_empty(), "{:?}", tracker.nrp_view());
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestEngineDeletePod_ReplacementUIDNotGatedByStaleRecord: the old pod's drain is in flight
// when its same-name replacement (a new UID, on another host) arrives and is deleted in turn: the
// replacement's finalizer is released after its own drain, without waiting for the old pod's
// (nor is the old UID's released before its drain is accepted); the old drain then completes
// with nothing more released for the replacement.
#[test]
fn a_deleted_replacements_release_does_not_wait_for_the_old_pods_drain() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    drive(&mut tracker, NOW, step, ok);
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held(pod("p", "10.244.2.10")))]);
    let (_, (old_drain, _)) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    let replacement = Pod { uid: "uid-p2".into(), host_ips: vec!["10.224.0.7".into()], ..pod("p", "10.244.2.12") };
    let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(replacement.clone())]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, |_| true);
    assert!(tracker.nrp_view()["10.224.0.7"].contains_key("10.244.2.12"), "{issued:?}");
    let step = tracker.observe(NOW + 3, vec![Observation::PodUpserted(deleting_held(replacement))]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 3, step, ok, |_| true);
    let drain = position(
        &issued,
        |c| matches!(c, Command::UpdateAddressLocations(l) if l.iter().any(|l| l.location == "10.224.0.7")),
    );
    let release = position(&issued, |c| is_release(c, "p", "uid-p2"));
    assert!(drain < release, "{issued:?}");
    assert!(!issued.iter().any(|c| is_release(c, "p", "uid-p")), "the old pod waits for its own drain: {issued:?}");
    let step = tracker.complete(NOW + 4, vec![(old_drain, Outcome::Ok)]);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 4, step, ok, |_| true);
    assert!(!finalizers_of(&issued, "p").iter().any(|(uid, _)| uid == "uid-p2"), "{issued:?}");
    assert_eq!(tracker.nrp_view().values().flat_map(|a| a.keys()).collect::<Vec<_>>(), ["10.244.2.11"]);
}

// Upstream TestCheckInitializationComplete_WaitsForPendingPodDeletions: after a restart (no state), a
// pod being deleted that still holds the finalizer, its identity kept by another pod, leaves the
// tracker busy (not idle, not quiet) while its release is outstanding, and idle once it is done.
#[test]
fn after_a_restart_the_tracker_is_not_idle_while_a_deleting_pods_release_is_outstanding() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let pods = [deleting_held(pod("p", "10.244.2.10")), pod("q", "10.244.2.11")].map(Observation::PodUpserted);
    let step = tracker.observe(NOW, pods.into_iter().chain([Observation::ListsComplete]).collect());
    let read = step.commands[0].id;
    let listed = |address: &str| NrpAddress { address: address.into(), services: vec![IDENTITY.into()] };
    let snapshot = NrpState {
        services: vec![NrpService {
            name: IDENTITY.into(),
            service_type: "Outbound".into(),
            backend_pools: vec![],
            is_default: false,
        }],
        locations: vec![NrpListedLocation {
            location: HOST.into(),
            addresses: vec![listed("10.244.2.10"), listed("10.244.2.11")],
        }],
    };
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    let inventory_read = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("the inventory").id;
    let inventory = ArmInventory {
        nat_gateways: vec![ListedNatGateway {
            name: IDENTITY.into(),
            public_ips: vec![format!("{IDENTITY}-pip")],
            public_ips_v6: vec![],
            associated: true,
            as_put: true,
        }],
        ..ArmInventory::default()
    };
    let step = tracker.complete(NOW, vec![(inventory_read, Outcome::ArmInventory(inventory))]);
    let (before, (id, _)) = drive_until(&mut tracker, NOW, step, |c| is_release(c, "p", "uid-p"));
    assert!(before.iter().any(is_location_update), "drained first: {before:?}");
    assert!(!tracker.is_quiet(), "the release is outstanding");
    let waiting = tracker.tick(NOW + 1);
    assert!(!waiting.idle, "not idle while the release is outstanding: {:?}", waiting.commands);
    assert!(waiting.commands.is_empty(), "{:?}", waiting.commands);
    let step = tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]);
    let (issued, now) = drive(&mut tracker, NOW + 2, step, ok);
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(_))), "the identity is kept: {issued:?}");
    assert!(tracker.is_quiet());
    assert!(tracker.tick(now).idle);
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
}

// Upstream TestIsServiceReady_StateUpdateInProgress (the CreationInProgress and Created checks; the
// UpdateInProgress one is provisioning.rs's endpoint_changes_of_a_service_whose_load_balancer_is_being_updated_reach_nrp_meanwhile),
// for an inbound Service: while its load balancer is being created its endpoints do not reach NRP;
// once it is Created (and registered) they do, and a later change goes at once.
#[test]
fn an_inbound_services_endpoints_wait_while_it_is_created_and_go_at_once_once_it_is() {
    let (mut tracker, held) = in_phase(Phase::CreationInProgress);
    let (id, _) = held.expect("the load balancer PUT in flight");
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress));
    let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let step = tracker.observe(NOW, vec![node, Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")]))]);
    assert!(!step.commands.iter().any(|c| is_location_update(&c.command)), "not ready: {:?}", step.commands);
    assert!(tracker.tick(NOW + 1).commands.iter().all(|c| !is_location_update(&c.command)));
    let step = tracker.complete(NOW + 2, vec![(id, Outcome::Ok)]);
    let (issued, now) = drive(&mut tracker, NOW + 2, step, ok);
    let register = position(
        &issued,
        |c| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == UID && !r.is_delete)),
    );
    assert!(register < position(&issued, is_location_update), "{issued:?}");
    assert_eq!(programmed(&issued), [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned()])], "{issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    let step =
        tracker.observe(now, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.7", "n1")]))]);
    let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
    assert_eq!(programmed(&sent), [("10.224.0.4".to_owned(), vec!["10.244.0.7".to_owned()])], "ready: {sent:?}");
}

// Upstream TestOnServiceCreationComplete_TerminalParkEmitsWarningEvent (all three subtests; the
// deadlock guard is Go plumbing), for an inbound Service: a creation and an update Azure refuses
// for good are each parked with one Warning on the Service whose message carries Azure's text and
// that it waits for a spec change; a transient failure (5xx) parks nothing and raises no such
// Warning. Differs: the reason is LoadBalancerConfigurationRejected.
#[test]
fn a_load_balancer_put_refused_for_good_warns_on_the_service_once_and_a_transient_failure_does_not() {
    let rejected = |commands: &[Issued]| -> Vec<Event> {
        commands
            .iter()
            .filter_map(|c| match &c.command {
                Command::EmitEvent(e) if e.reason == reason::LOAD_BALANCER_CONFIGURATION_REJECTED => Some(e.clone()),
                _ => None,
            })
            .collect()
    };
    for (phase, text) in [
        (Phase::CreationInProgress, "frontend port 65535 out of range"),
        (Phase::UpdateInProgress, "unsupported protocol SCTP"),
    ] {
        let (mut tracker, held) = in_phase(phase);
        let (id, _) = held.expect("the load balancer PUT in flight");
        let refused = Outcome::Failed(Failure {
            status: 400,
            code: Some("QuotaExceeded".into()),
            retry_after_ms: None,
            message: text.into(),
        });
        let step = tracker.complete(NOW + 1, vec![(id, refused)]);
        let events = rejected(&step.commands);
        assert_eq!(events.len(), 1, "{phase:?}: {:?}", step.commands);
        assert_eq!(events[0].event_type, EventType::Warning);
        assert_eq!(events[0].regarding.uid.as_str(), UID, "{:?}", events[0]);
        assert!(events[0].message.contains(text), "{:?}", events[0].message);
        assert!(events[0].message.contains("fix the Service spec"), "{:?}", events[0].message);
        let later = tracker.tick(NOW + 60 * 60 * 1000);
        assert!(
            !later.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_))),
            "parked: {:?}",
            later.commands
        );
        assert!(rejected(&later.commands).is_empty(), "warned once");
    }
    let (mut tracker, held) = in_phase(Phase::CreationInProgress);
    let (id, _) = held.expect("the load balancer PUT in flight");
    let step = tracker.complete(NOW + 1, vec![(id, failed(503))]);
    assert!(rejected(&step.commands).is_empty(), "{:?}", step.commands);
    let at = step.wake_at_ms.expect("a retry");
    let retry = tracker.tick(at);
    assert!(
        retry.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_))),
        "retried, not parked: {:?}",
        retry.commands
    );
    assert!(rejected(&retry.commands).is_empty());
}

// Upstream TestOnServiceCreationComplete_OverlayMappingsErrorReDrainsLocations (the state after the
// refusal and its backoff), for an inbound Service being deleted: the unregistration NRP refuses
// because addresses still map to it has NRP read again, nothing unregistered in the same step and
// the retry behind a backoff; while NRP keeps refusing, consecutive unregistrations are at least a
// second apart. With no address of it left in the mirror the drain ends at once, so the phase reads
// DeletionInProgress again until NRP is read back; the re-drain of what NRP still maps is in
// upstream_lifecycle.rs:
// an_unregistration_refused_for_overlay_mappings_waits_for_the_drain_of_what_nrp_still_maps_then_unregisters.
#[test]
fn an_unregistration_refused_for_overlay_mappings_goes_back_to_draining_and_is_retried_after_a_backoff() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(terminating_web())]);
    let is_unregistration =
        |c: &Command| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == UID && r.is_delete));
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, is_unregistration);
    let overlay = overlay_mappings_refusal;
    let step = tracker.complete(NOW + 1, vec![(id, overlay())]);
    // Its mirror holds no address of it, so the drain is done at once and the deletion is back
    // to the unregistration, behind NRP read again and the backoff.
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress));
    assert!(step.commands.iter().any(|c| c.command == Command::ReadNrp), "NRP read again: {:?}", step.commands);
    assert!(step.wake_at_ms.is_some_and(|at| at >= NOW + 1 + 1_000), "a backoff: {:?}", step.wake_at_ms);
    assert!(!step.commands.iter().any(|c| is_unregistration(&c.command)), "{:?}", step.commands);
    let registered =
        NrpService { name: UID.into(), service_type: "Inbound".into(), backend_pools: vec![], is_default: false };
    let answer = |c: &Command| match c {
        c if is_unregistration(c) => overlay(),
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![registered.clone()], locations: vec![] }),
        other => answer_ok(&[UID])(other),
    };
    let mut unregistered_at = vec![NOW];
    let (mut now, mut step) = (NOW + 1, step);
    for _ in 0..200 {
        if unregistered_at.len() == 4 {
            break;
        }
        if step.commands.is_empty() {
            let at = step.wake_at_ms.expect("a retry is scheduled");
            assert!(at > now, "{at} {now}");
            now = at;
            step = tracker.tick(now);
            continue;
        }
        unregistered_at.extend(step.commands.iter().filter(|c| is_unregistration(&c.command)).map(|_| now));
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = tracker.complete(now, results);
    }
    assert_eq!(unregistered_at.len(), 4, "retried: {unregistered_at:?}");
    assert!(unregistered_at.windows(2).all(|w| w[1] >= w[0] + 1_000), "no storm: {unregistered_at:?}");
    assert!(tracker.inbound.lifecycles.contains_key(UID), "kept until NRP lets go");
}

// Upstream TestDeleteInboundService (the lower-casing subtest; the absent one is
// upstream_lifecycle.rs's): a Service deleted under its UID in upper case deletes the identity
// known in lower case (unregistered, its load balancer deleted, no other identity appears).
#[test]
fn a_deleting_service_is_deleted_under_its_lower_cased_uid() {
    let mut tracker = created_with(&[(80, 8080)]);
    let upper = Service { uid: UID.to_ascii_uppercase(), ..terminating_web() };
    assert_ne!(upper.uid, UID);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(upper)]);
    assert!(tracker.phase(UID).is_some_and(|p| p.is_deleting()), "{:?}", tracker.phase(UID));
    let (issued, _, _) = super::drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    let deleted_lb = issued
        .iter()
        .any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer && r.name == UID));
    assert!(deleted_lb, "{issued:?}");
    let unregistered = issued
        .iter()
        .any(|c| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == UID && r.is_delete)));
    assert!(unregistered, "{issued:?}");
    assert!(tracker.phase(UID).is_none(), "deleted and forgotten");
    assert!(tracker.phase(&UID.to_ascii_uppercase()).is_none());
}

// Upstream TestReconcileInboundService ('adds a new service with provider identity' and 'rejects an
// internal load balancer'): a Service whose UID comes in upper case is tracked and provisioned
// under the lower-cased identity, its load balancer carrying its port; an internal load balancer
// is refused with one UnsupportedInternalLoadBalancer Warning naming the annotation, and is not
// tracked nor provisioned.
#[test]
fn a_service_is_tracked_under_its_lower_cased_uid_and_an_internal_load_balancer_is_refused() {
    let mut tracker = started();
    let upper = ported(&UID.to_ascii_uppercase(), &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(upper)]);
    assert!(tracker.phase(UID).is_some(), "tracked lower-cased");
    let (issued, _, _) = super::drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    let put = issued.iter().find_map(|c| match c {
        Command::PutLoadBalancer(lb) => Some(lb),
        _ => None,
    });
    let put = put.expect("its load balancer");
    assert_eq!(put.name.as_str(), UID);
    assert_eq!(put.rules.iter().map(|r| r.frontend_port).collect::<Vec<_>>(), [80], "{put:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));

    const INTERNAL: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e55";
    let internal = Service {
        name: "internal".into(),
        ..ported(INTERNAL, &[(TCP, 80, to(8080))], &[(crate::admission::ANNOTATION_INTERNAL_LB, "true")])
    };
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(internal)]);
    let warnings: Vec<&Event> = step
        .commands
        .iter()
        .filter_map(|c| match &c.command {
            Command::EmitEvent(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", step.commands);
    assert_eq!(warnings[0].reason, crate::admission::reason::UNSUPPORTED_INTERNAL_LOAD_BALANCER);
    assert_eq!(warnings[0].event_type, EventType::Warning);
    assert!(warnings[0].message.contains(crate::admission::ANNOTATION_INTERNAL_LB), "{:?}", warnings[0].message);
    assert!(step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))), "{:?}", step.commands);
    assert!(tracker.phase(INTERNAL).is_none());
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
    assert_eq!(version, STATE_VERSION);
    let imported = Tracker::import_state(clb(), version, &payload).unwrap();
    assert_eq!(imported, tracker);
    assert_eq!(
        Tracker::import_state(clb(), 6, &tracker.export_state_as(6)).unwrap().egress.outbound,
        tracker.egress.outbound
    );
    let v5 = Tracker::import_state(clb(), 5, &started().export_state_as(5)).unwrap();
    assert!(v5.outbound().lifecycles.is_empty());
    let mut broken = tracker.egress.outbound.clone();
    broken.lifecycles.get_mut(IDENTITY).unwrap().attempt.in_flight = None;
    let mut state = tracker.clone();
    state.egress.outbound = broken;
    let payload = state.export_state_as(6);
    let why = corrupt(Tracker::import_state(clb(), 6, &payload));
    assert!(why.contains("whose outbound lifecycle does not wait for it"), "{why}");
}

// Upstream TestGuardOrphanedNATGatewayUsesOutboundDeletionPath, TestGuardOutboundTeardownRespectsLivePodRefCount,
// TestGuardDefaultNATGatewayIsNeverScheduledForOrphanDeletion, TestGuardOrphanCleanupSkipsResourcesStillDesiredInKubernetes
// and TestGuardDefaultNATGatewayNeverEntersNRPSnapshotOrRemovalDiff (the removal half): after a restart with
// no state, a NAT gateway of ours (by its shape) that no pod carries is torn down through the
// outbound path (its Outbound service unregistered, NAT gateway and public IP deleted, never as a
// load balancer), while an orphan load balancer beside it goes the
// inbound path (load balancer and `<uid>-pip` deleted); one a live pod carries, registered, is
// adopted with nothing written; one a live pod carries that NRP never registered (a crash
// mid-create) is kept and registered; the RP's default and foreign NAT gateways are not touched.
#[test]
fn at_start_up_our_nat_gateways_are_adopted_or_torn_down_by_their_pods_and_no_other_is_touched() {
    const ORPHAN_LB: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e66";
    let mut tracker = Tracker::create(clb()).unwrap();
    let live = Pod { egress_label: Some("egress-live".into()), ..pod("live", "10.244.2.12") };
    let crashed = Pod { egress_label: Some("egress-crashed".into()), ..pod("crashed", "10.244.2.13") };
    let pods = [live, crashed].map(Observation::PodUpserted);
    let step = tracker.observe(NOW, pods.into_iter().chain([Observation::ListsComplete]).collect());
    let read = step.commands[0].id;
    let registered = |name: &str| NrpService {
        name: name.into(),
        service_type: "Outbound".into(),
        backend_pools: vec![],
        is_default: name == "default-natgw",
    };
    let services = vec![registered("egress-live"), registered("default-natgw"), registered("egress-old")];
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
            nat("egress-crashed", &["egress-crashed-pip"]),
        ],
        public_ips: vec![ListedPublicIp {
            name: format!("{ORPHAN_LB}-pip"),
            version: IpVersion::Ipv4,
            address: Some("20.0.0.9".into()),
            as_put: true,
        }],
        load_balancers: vec![ListedLoadBalancer {
            name: ORPHAN_LB.into(),
            shape: Some(LoadBalancer {
                name: ORPHAN_LB.into(),
                public_ip: format!("{ORPHAN_LB}-pip").into(),
                backend_pool: ORPHAN_LB.into(),
                rules: vec![],
            }),
        }],
    };
    let step = tracker.complete(NOW, vec![(inventory_read, Outcome::ArmInventory(inventory))]);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    let deleted: BTreeSet<(ResourceKind, String)> = issued
        .iter()
        .filter_map(|c| match c {
            Command::DeleteResource(r) => Some((r.kind, r.name.to_string())),
            _ => None,
        })
        .collect();
    let want = [
        (ResourceKind::NatGateway, "egress-old".to_owned()),
        (ResourceKind::PublicIp, "egress-old-pip".to_owned()),
        (ResourceKind::LoadBalancer, ORPHAN_LB.to_owned()),
        (ResourceKind::PublicIp, format!("{ORPHAN_LB}-pip")),
    ];
    assert_eq!(deleted, BTreeSet::from(want), "{issued:?}");
    let written: BTreeSet<String> = issued
        .iter()
        .filter_map(|c| match c {
            Command::PutNatGateway(n) => Some(n.name.clone()),
            Command::UpdateServices(r) => Some(r[0].name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(written, BTreeSet::from(["egress-old".to_owned(), "egress-crashed".to_owned()]), "{issued:?}");
    let registers_crashed = |c: &Command| {
        matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == "egress-crashed"
            && r.service_type == NrpServiceType::Outbound && !r.is_delete))
    };
    assert!(issued.iter().any(registers_crashed), "{issued:?}");
    let unregisters = |name: &str| {
        issued
            .iter()
            .any(|c| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == name && r.is_delete)))
    };
    assert!(unregisters("egress-old"), "ours, no longer wanted, is unregistered: {issued:?}");
    let names_default =
        |c: &Command| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == "default-natgw"));
    assert!(!issued.iter().any(names_default), "{issued:?}");
    assert_eq!(tracker.outbound().lifecycles.keys().collect::<Vec<_>>(), ["egress-crashed", "egress-live"]);
    assert_eq!(tracker.outbound().lifecycles["egress-live"].phase, Phase::Created);
    assert_eq!(tracker.outbound().lifecycles["egress-crashed"].phase, Phase::Created);
    assert!(tracker.egress().is_registered("egress-crashed"));
}

// Upstream TestGuardEgressPublicIPsAreSweptOnceNATGatewayIsGone, TestGuardDefaultNATGatewayPIPSurvivesOrphanSweep,
// TestCleanupOrphanedPublicIPs_SweepsEveryUnusedManagedAddress, TestPIPNamesInAzureFromList_IncludesAddressLessPIP,
// TestGuardOrphanCleanup_PIPOnlyServiceScheduledForDeletion, TestGuardOrphanCleanup_PIPNotScheduledWhenDesiredOrHasLB,
// TestCleanupOrphanedPublicIPs_KeepsPIPForServiceStillDesiredInKubernetes, TestBuildNRPState_FailsOnPublicIPListError and
// TestInitializeFromCluster_ReusesFetchedPIPListForOrphanCleanup (one inventory, read once, serves the sweep; a
// failed read is retried before anything is swept): after a restart, the public IPs a teardown cut short left
// without their NAT gateway (both families, with or without an address) are deleted, as is a Service's public
// IP left alone; the RP's default's, one a pod's identity still needs, one a load balancer or NAT gateway uses,
// one whose identity NRP registers beside a NAT gateway of its name (somebody else's), one not of our shape and
// one of another name are not touched, nor are both families of public IP still attached to a NAT gateway (not
// ours, so never torn down itself). Beyond upstream: one whose identity NRP registers with no NAT gateway of its
// name in the resource group (what a teardown's unlink landing after its unregister leaves) is swept and the
// registration unregistered again.
#[test]
fn at_start_up_egress_public_ips_left_without_their_nat_gateway_are_swept_and_nothing_else_is() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let live = Pod { egress_label: Some("egress-live".into()), ..pod("live", "10.244.2.12") };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(live), Observation::ListsComplete]);
    let read = step.commands[0].id;
    let theirs = NrpService {
        name: "egress-theirs".into(),
        service_type: "Outbound".into(),
        backend_pools: vec![],
        is_default: false,
    };
    let late = NrpService { name: "egress-late".into(), ..theirs.clone() };
    let snapshot = NrpState { services: vec![theirs, late], locations: vec![] };
    let step = tracker.complete(NOW, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    let inventory_read = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("the inventory").id;
    let failed =
        Outcome::Failed(Failure { status: 500, code: None, retry_after_ms: None, message: "list failed".into() });
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
            ip("egress-late-pip", IpVersion::Ipv4, Some("20.0.0.13"), true),
            ip("egress-basic-pip", IpVersion::Ipv4, Some("20.0.0.9"), false),
            ip("egress-used-pip", IpVersion::Ipv4, Some("20.0.0.10"), true),
            ip("frontend", IpVersion::Ipv4, Some("20.0.0.11"), true),
            ip(&format!("{gone_service}-pip"), IpVersion::Ipv4, None, true),
            ip("still-in-use-pip", IpVersion::Ipv4, Some("20.0.0.12"), true),
            ip("still-in-use-pip-v6", IpVersion::Ipv6, Some("2001:db8::12"), true),
        ],
        nat_gateways: vec![
            ListedNatGateway {
                name: "still-in-use".into(),
                public_ips: vec!["still-in-use-pip".into()],
                public_ips_v6: vec!["still-in-use-pip-v6".into()],
                associated: false,
                as_put: false,
            },
            ListedNatGateway {
                name: "egress-theirs".into(),
                public_ips: vec!["theirs-elsewhere".into()],
                public_ips_v6: vec![],
                associated: true,
                as_put: false,
            },
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
    let want = ["egress-old-pip", "egress-old-pip-v6", "egress-late-pip", &format!("{gone_service}-pip")]
        .map(|s| s.to_owned());
    assert_eq!(deleted, BTreeSet::from(want), "{issued:?}");
    let unregistered: Vec<&str> = issued
        .iter()
        .filter_map(|c| match c {
            Command::UpdateServices(r) => r.iter().find(|r| r.is_delete).map(|r| r.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(unregistered, ["egress-late"], "{issued:?}");
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

// Upstream TestOnServiceCreationComplete_OverlayMappingsErrorReDrainsLocations, for an egress identity's
// teardown (upstream's outbound deletion takes the same path): the unregistration NRP refuses because
// addresses still map to the identity has NRP read again; when the read shows such an address the teardown
// goes back to draining, the address is removed, nothing is unregistered while that removal is unanswered,
// and once it lands the identity is unregistered, then its NAT gateway and public IP deleted. Regression:
// the drain ended against the mirror before NRP was read back, so a slow removal let the identity be
// unregistered and its NAT gateway deleted while NRP still mapped its address.
#[test]
fn an_egress_unregistration_refused_for_overlay_mappings_waits_for_the_drain_of_what_nrp_still_maps() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let is_unregistration = |c: &Command| is_outbound(c, None, true);
    let (_, (id, _)) = drive_until(&mut tracker, NOW + 1, step, is_unregistration);
    let step = tracker.complete(NOW + 2, vec![(id, overlay_mappings_refusal())]);
    assert!(!step.commands.iter().any(|c| is_unregistration(&c.command)), "{:?}", step.commands);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("NRP read again").id;
    let stray = NrpListedLocation {
        location: HOST.into(),
        addresses: vec![NrpAddress { address: "10.244.2.99".into(), services: vec![IDENTITY.into()] }],
    };
    let registered =
        NrpService { name: IDENTITY.into(), service_type: "Outbound".into(), backend_pools: vec![], is_default: false };
    let snapshot = NrpState { services: vec![registered], locations: vec![stray] };
    let step = tracker.complete(NOW + 2, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::DeletionPending, "{:?}", step.commands);
    assert!(tracker.outbound().work.draining.contains(IDENTITY), "back in the drain set");
    let removes_stray = |l: &NrpLocation| {
        l.location == HOST
            && (l.addresses.is_empty()
                || l.addresses.iter().any(|a| a.address == "10.244.2.99" && a.services.is_empty()))
    };
    let redrain = |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(removes_stray));
    let batch = step.commands.iter().find(|c| redrain(&c.command)).expect("the re-drain").id;
    let late = NOW + 60_000;
    let meanwhile = drive_all_but(&mut tracker, NOW + 2, step, batch, late, ok);
    assert!(!meanwhile.iter().any(is_unregistration), "{meanwhile:?}");
    assert!(!meanwhile.iter().any(|c| is_delete(c, ResourceKind::NatGateway)), "{meanwhile:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::DeletionPending, "{meanwhile:?}");
    let pending = tracker.complete(late, vec![(batch, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, late, pending, ok);
    let unregistered = position(&issued, is_unregistration);
    let delete_nat = position(&issued, |c| is_delete(c, ResourceKind::NatGateway));
    let delete_pip = position(&issued, |c| is_delete(c, ResourceKind::PublicIp));
    assert!(unregistered < delete_nat && delete_nat < delete_pip, "{issued:?}");
    assert_eq!(issued.iter().filter(|c| is_unregistration(c)).count(), 1, "{issued:?}");
    assert!(!issued.iter().any(redrain), "drained once: {issued:?}");
    assert!(!tracker.outbound().lifecycles.contains_key(IDENTITY), "torn down");
}
