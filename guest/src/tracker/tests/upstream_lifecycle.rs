//! Ports of upstream engine tests about the lifecycle: endpoint changes and deletes while a
//! command is in flight, repeated and redundant events, names. Each test names the upstream test it
//! ports in the comment directly above it (`docs/conformance.md` is generated from those).

use super::*;
use std::collections::BTreeSet;

fn n1() -> Observation {
    Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] })
}

/// Where the registration of the test Service (not its unlink or unregistration) is among `issued`.
fn registrations(issued: &[Command]) -> Vec<usize> {
    let registers = |r: &NrpServiceRequest| r.name == UID && !r.is_delete && !r.backend_pools.is_empty();
    let at =
        |(i, c): (usize, &Command)| matches!(c, Command::UpdateServices(r) if r.iter().any(registers)).then_some(i);
    issued.iter().enumerate().filter_map(at).collect()
}

/// Whether `command` writes `address` into NRP as backing the test Service.
fn maps_to_the_service(command: &Command, address: &str) -> bool {
    matches!(command, Command::UpdateAddressLocations(locations) if locations
        .iter()
        .flat_map(|l| &l.addresses)
        .any(|a| a.address == address && a.services.iter().any(|s| s == UID)))
}

/// NRP holding only the pod 10.244.0.5 on n1 (10.224.0.4), backing the test Service.
fn the_pod_on_n1_backing_the_service() -> View {
    let addresses = BTreeMap::from([("10.244.0.5".to_owned(), BTreeSet::from([UID.to_owned()]))]);
    View::from([("10.224.0.4".to_owned(), addresses)])
}

fn unregistrations(issued: &[Command]) -> usize {
    issued.iter().filter(|c| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.is_delete))).count()
}

// Upstream TestGuardLifecycle_BufferedEndpointAddRemoveNoLeak, TestEngineUpdateEndpoints_ServiceCreating and
// TestEngineUpdateEndpoints_RemovalDuringCreationIsReplayed: endpoints that come and go while the load balancer
// is being created wait for the registration (no batch meanwhile), and then only the survivor reaches NRP.
#[test]
fn an_endpoint_added_and_removed_while_the_service_is_created_never_reaches_nrp() {
    let (mut tracker, held) = in_phase(Phase::CreationInProgress);
    let both = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.7", "n1")]));
    let mut pending = tracker.observe(NOW + 1, vec![n1(), both]);
    assert!(batch_locations(&pending).is_empty(), "not registered yet: {:?}", pending.commands);
    let survivor = tracker.observe(NOW + 1, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")]))]);
    assert!(batch_locations(&survivor).is_empty(), "{:?}", survivor.commands);
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress));
    pending.commands.extend(survivor.commands);
    let issued = finish(&mut tracker, NOW + 2, held, pending);
    assert_eq!(programmed(&issued), [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned()])], "{issued:?}");
    let batch = issued.iter().position(is_location_update).expect("the survivor is programmed");
    assert_eq!(registrations(&issued).len(), 1, "{issued:?}");
    assert!(registrations(&issued)[0] < batch, "registered before any address names it: {issued:?}");
    assert!(!issued.iter().any(|c| format!("{c:?}").contains("10.244.0.7")), "{issued:?}");
    assert_eq!(tracker.nrp_view(), the_pod_on_n1_backing_the_service());
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestGuardLifecycle_AdditionsDuringDeletionPendingNoLeak and
// TestGuardUpdateEndpoints_DeletionInProgressIgnored: an endpoint added while the Service drains (DeletionPending)
// or is being deleted (DeletionInProgress) sends no batch and never reaches NRP under the Service; the deletion
// still ends with nothing left in NRP.
#[test]
fn endpoints_added_while_a_service_is_deleted_never_reach_nrp() {
    for phase in [Phase::DeletionPending, Phase::DeletionInProgress] {
        let (mut tracker, held) = in_phase(phase);
        let added = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.7", "n1")]));
        let step = tracker.observe(NOW + 1, vec![added]);
        assert!(batch_locations(&step).is_empty(), "{phase:?}: {:?}", step.commands);
        assert_eq!(tracker.phase(UID), Some(phase));
        let issued = finish(&mut tracker, NOW + 2, held, step);
        assert!(!issued.iter().any(|c| maps_to_the_service(c, "10.244.0.7")), "{phase:?}: {issued:?}");
        assert_eq!(tracker.phase(UID), None, "{phase:?}: {issued:?}");
        assert!(tracker.nrp_view().is_empty(), "{phase:?}: {:?}", tracker.nrp_view());
        assert_eq!(unregistrations(&issued), 1, "{phase:?}: {issued:?}");
    }
}

// Upstream TestGuardDeleteService_UnknownInboundUntrackedNoOp and TestDeleteInboundService (its "absent from
// engine and NRP state" case): deleting Services nobody provisioned (Terminating without our finalizer, or
// gone, or never seen) tracks nothing, queues no deletion and writes nothing to Azure or Kubernetes.
#[test]
fn deleting_a_service_nobody_provisioned_writes_nothing() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert!(writes(&issued).is_empty() && last.idle, "{issued:?}");
    let other =
        Service { uid: "6b1c9d0e-2f3a-4b5c-8d7e-9f0a1b2c3d4e".into(), name: "api".into(), ..lb_service("Local") };
    let step = tracker.observe(
        NOW + 1,
        vec![
            Observation::ServiceUpserted(Service { deleting: true, ..lb_service("Cluster") }),
            Observation::ServiceUpserted(Service { deleting: true, ..other }),
            Observation::ServiceDeleted(ObjectKey::new("default", "web")),
            Observation::ServiceDeleted(ObjectKey::new("default", "phantom")),
        ],
    );
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[]));
    assert!(writes(&issued).is_empty(), "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
    assert!(tracker.inbound.lifecycles.is_empty() && tracker.inbound.work.draining.is_empty());
}

// Upstream TestGuardDeleteService_DoubleDeleteIsIdempotent: the Terminating Service seen twice more while its
// addresses drain keeps it DeletionPending, queued once, and sends nothing; the deletion then runs once.
#[test]
fn a_second_delete_while_draining_changes_nothing() {
    let (mut tracker, held) = in_phase(Phase::DeletionPending);
    let again = tracker.observe(
        NOW + 1,
        vec![Observation::ServiceUpserted(terminating_web()), Observation::ServiceUpserted(terminating_web())],
    );
    assert!(again.commands.is_empty(), "{:?}", again.commands);
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending));
    assert_eq!(tracker.inbound.work.draining, BTreeSet::from([UID.to_owned()]));
    let issued = finish(&mut tracker, NOW + 2, held, again);
    assert_eq!(unregistrations(&issued), 1, "{issued:?}");
    for kind in [ResourceKind::LoadBalancer, ResourceKind::PublicIp] {
        let deletes = issued.iter().filter(|c| matches!(c, Command::DeleteResource(r) if r.kind == kind)).count();
        assert_eq!(deletes, 1, "{kind:?}: {issued:?}");
    }
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestGuardStateTransitions_DoubleCreate_DoesNotResetState: the Service seen again while its creation
// backs off keeps its retry count and deadline, so the next failure waits longer (attempt 2), not 1 s again.
// Differs: there is one upsert path, so the changed spec it brings is recorded and is the one created
// (upstream TestEngineUpdateService_OverwritesConfigDuringCreation).
#[test]
fn a_service_seen_again_while_its_creation_backs_off_keeps_its_retries_and_deadline() {
    let (mut tracker, step) = tracker_retrying_its_finalizer();
    let wake = step.wake_at_ms.expect("the finalizer is retried");
    let changed = ported(UID, &[(TCP, 8080, to(8080))], &[]);
    let again = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(changed)]);
    assert_eq!(finalizer_change(&again), None, "{:?}", again.commands);
    assert!(put_in(&again).is_none());
    assert_eq!(again.wake_at_ms, Some(wake));
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress));
    let lifecycle = &tracker.inbound.lifecycles[UID];
    assert_eq!(lifecycle.attempt.retries, 1);
    assert_eq!(lifecycle.desired.as_ref().map(|d| d.load_balancer.rules[0].frontend_port), Some(8080));
    assert_eq!(finalizer_change(&tracker.tick(wake - 1)), None, "the deadline holds");
    let retry = tracker.tick(wake);
    let (id, present) = finalizer_change(&retry).expect("retried at its deadline");
    assert!(present);
    let step = tracker.complete(wake, vec![(id, failed(500))]);
    let next = step.wake_at_ms.expect("retried again");
    assert!(next >= wake + 2_000, "the second backoff, not the first again: {}", next - wake);
    let step = tracker.tick(next);
    let (issued, _, last) = drive(&mut tracker, next, step, answer_ok(&[]));
    let ports: Vec<u16> = load_balancers(&issued).iter().map(|lb| lb.rules[0].frontend_port).collect();
    assert_eq!(ports, [8080], "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestUpdateService_RecreateAfterDeletionPreservesEndpoints: a Service retyped away and back while its
// deletion runs is recreated with its endpoints: its pod is in NRP under it again, written after it is
// registered anew.
#[test]
fn a_service_recreated_after_its_deletion_gets_its_endpoints_back_in_nrp_once_registered_again() {
    let mut tracker = created_with(&[(80, 8080)]);
    let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..ported(UID, &[(TCP, 80, to(8080))], &[]) };
    let mut step = tracker.observe(NOW, vec![Observation::ServiceUpserted(cluster_ip)]);
    let wanted = tracker.observe(NOW, vec![Observation::ServiceUpserted(ported(UID, &[(TCP, 80, to(8080))], &[]))]);
    assert!(tracker.inbound.lifecycles[UID].recreate, "the recreate is armed");
    step.commands.extend(wanted.commands);
    let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    assert_eq!(unregistrations(&issued), 1, "{issued:?}");
    let unregistered = issued.iter().position(|c| matches!(c, Command::UpdateServices(r) if r[0].is_delete)).unwrap();
    let registered = *registrations(&issued).last().expect("registered anew");
    assert!(unregistered < registered, "{issued:?}");
    let reprogrammed = issued.iter().rposition(|c| maps_to_the_service(c, "10.244.0.5")).expect("programmed again");
    assert!(registered < reprogrammed, "{issued:?}");
    assert_eq!(tracker.nrp_view(), the_pod_on_n1_backing_the_service());
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestReconcileInboundService (its port-less cases): a Service with no port is not provisioned (nothing
// written, no lifecycle), and once it gains a port it is created from the start, not updated.
#[test]
fn a_port_less_service_is_not_provisioned_until_it_gains_a_port_and_is_then_created() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let port_less = Service { ports: vec![], ..lb_service("Local") };
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(port_less), Observation::ListsComplete]);
    let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert!(writes(&issued).is_empty() && last.idle, "{issued:?}");
    assert_eq!(tracker.verdict("default", "web"), Some(&Verdict::NothingToProvision));
    assert!(tracker.phase(UID).is_none());
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(lb_service("Local"))]);
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress), "a creation, not an update");
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[]));
    assert!(issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: true, .. })), "{issued:?}");
    assert_eq!(issued.iter().filter(|c| matches!(c, Command::PutPublicIp(_))).count(), 1, "{issued:?}");
    let created = load_balancers(&issued);
    assert_eq!(created.len(), 1, "{issued:?}");
    assert_eq!(created[0].rules, vec![rule(LbProtocol::Tcp, 80, 80, 4)]);
    assert_eq!(registrations(&issued).len(), 1, "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestDeleteService_RedundantDeleteDoesNotResurrectService: a Service wanted again during its deletion
// and then deleted for real (Terminating) is not recreated: the deletion ends, its finalizer is released and
// nothing is put again.
#[test]
fn a_service_deleted_for_real_after_being_wanted_again_during_its_deletion_is_not_recreated() {
    let (mut tracker, held) = in_phase(Phase::DeletionInProgress);
    let mut pending = respec(&mut tracker, NOW + 1, &[(80, 8080)]);
    assert!(tracker.inbound.lifecycles[UID].recreate, "the recreate is armed");
    pending.commands.extend(tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]).commands);
    assert!(!tracker.inbound.lifecycles[UID].recreate, "and disarmed by the deletion");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress));
    let issued = finish(&mut tracker, NOW + 2, held, pending);
    assert!(load_balancers(&issued).is_empty(), "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::PutPublicIp(_))), "{issued:?}");
    let released = issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. }));
    assert!(released, "{issued:?}");
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestReconcileInboundService_SkipsServiceBeingDeleted: the Terminating Service seen during its own
// deletion neither disturbs it nor arms a recreate, so nothing is put again; the control, the same Service
// still live, is recreated.
#[test]
fn a_terminating_service_seen_during_its_deletion_does_not_arm_a_recreate_and_a_live_one_does() {
    for terminates in [true, false] {
        let (mut tracker, held) = in_phase(Phase::DeletionInProgress);
        let seen = if terminates { terminating_web() } else { ported(UID, &[(TCP, 80, to(8080))], &[]) };
        let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(seen)]);
        assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress), "terminating {terminates}");
        assert_eq!(tracker.inbound.lifecycles[UID].recreate, !terminates, "terminating {terminates}");
        let issued = finish(&mut tracker, NOW + 2, held, step);
        assert_eq!(load_balancers(&issued).len(), usize::from(!terminates), "terminating {terminates}: {issued:?}");
        let after = if terminates { None } else { Some(Phase::Created) };
        assert_eq!(tracker.phase(UID), after, "terminating {terminates}: {issued:?}");
    }
}

// Upstream TestServiceGatewayResourceNaming: a Service's identity is its UID lower-cased, and so are the names of
// its public IP (`<uid>-pip`), load balancer, pool and NRP registration. The nil-Service case has no counterpart.
#[test]
fn an_upper_case_uid_names_every_resource_in_lower_case() {
    let upper = ported("SERVICE-UID", &[(TCP, 80, to(8080))], &[]);
    assert_eq!(upper.identity(), "service-uid");
    let config = LbConfig::for_service(&upper);
    assert_eq!(config.public_ip.name.as_str(), "service-uid-pip");
    assert_eq!(config.load_balancer.name.as_str(), "service-uid");
    assert_eq!(config.load_balancer.backend_pool.as_str(), "service-uid");
    assert_eq!(config.load_balancer.public_ip.as_str(), "service-uid-pip");
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(upper), Observation::ListsComplete]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!(tracker.phase("service-uid"), Some(Phase::Created));
    let registered: Vec<&str> = issued
        .iter()
        .filter_map(|c| if let Command::UpdateServices(r) = c { Some(r) } else { None })
        .flatten()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(registered, ["service-uid"], "{issued:?}");
    // The Kubernetes object keeps its UID as the API server spells it: only Azure's names are lower-cased.
    let kubernetes = |c: &&Command| {
        matches!(c, Command::SetFinalizer { .. } | Command::PatchServiceStatus { .. } | Command::EmitEvent(_))
    };
    let mut azure = issued.iter().filter(|c| !kubernetes(c));
    assert!(!azure.any(|c| format!("{c:?}").contains("SERVICE-UID")), "{issued:?}");
}

// Upstream TestDeleteService_DuringUpdatePreemptKeepsPendingDeletion: a deletion that starts while an update is in
// flight and an address-location batch naming the Service is still unanswered waits in DeletionPending (the batch
// may put addresses under it into NRP); once it lands they are drained, and only then is the Service unregistered
// and its finalizer released.
#[test]
fn a_deletion_during_an_update_and_an_unanswered_batch_waits_for_the_drain_before_unregistering() {
    let (mut tracker, batch) = tracker_with_a_batch_in_flight();
    let update = respec(&mut tracker, NOW + 1, &[(80, 8081)]);
    let (put, _) = put_in(&update).expect("the update is sent");
    assert_eq!(tracker.phase(UID), Some(Phase::UpdateInProgress));
    let deleting = terminating(ported(UID, &[(TCP, 80, to(8081))], &[]));
    let del = tracker.observe(NOW + 2, vec![Observation::ServiceUpserted(deleting)]);
    let sent: Vec<Command> = del.commands.iter().map(|c| c.command.clone()).collect();
    assert_eq!(unregistrations(&sent), 0, "{sent:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending));
    assert!(tracker.inbound.work.draining.contains(UID));
    // The update lands first: the deletion still waits for the batch.
    let step = tracker.complete(NOW + 3, vec![(put, Outcome::Ok)]);
    let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
    assert_eq!(unregistrations(&sent), 0, "{sent:?}");
    assert!(!sent.iter().any(|c| matches!(c, Command::DeleteResource(_))), "{sent:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending));
    let mut pending = step;
    pending.commands.extend(tracker.complete(NOW + 4, vec![(batch, Outcome::Ok)]).commands);
    let (issued, _, last) = drive(&mut tracker, NOW + 4, pending, answer_ok(&[UID]));
    let drains = |l: &NrpLocation| {
        l.location == "10.224.0.4"
            && (l.addresses.is_empty()
                || l.addresses.iter().any(|a| a.address == "10.244.0.5" && a.services.is_empty()))
    };
    let drained = issued
        .iter()
        .position(|c| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(drains)))
        .unwrap_or_else(|| panic!("the address the batch put is drained: {issued:#?}"));
    let unregistered = issued.iter().position(|c| matches!(c, Command::UpdateServices(r) if r[0].is_delete)).unwrap();
    let released = issued.iter().position(|c| matches!(c, Command::SetFinalizer { present: false, .. })).unwrap();
    assert!(drained < unregistered && unregistered < released, "{issued:?}");
    assert!(
        !issued.iter().any(|c| matches!(c, Command::PatchServiceStatus { ingress_ips, .. } if !ingress_ips.is_empty())),
        "{issued:?}"
    );
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
    assert!(tracker.nrp_view().is_empty(), "{:?}", tracker.nrp_view());
}

// Upstream TestServiceUpdaterDeleteOutboundService_StepFailuresRetain, each of its cases: the unregistration, the
// NAT gateway delete, the public IP delete, or every one of them fails (twice each, 500): the failing step is
// retried until it succeeds, no later step runs before it has, the identity stays registered in NRP until its
// unregistration succeeded, and the teardown ends with the identity forgotten.
#[test]
fn a_failing_teardown_step_is_retried_and_no_later_step_runs_before_it_succeeds() {
    use super::upstream_outbound::{IDENTITY, drive, gone, is_delete, is_outbound, ok, provisioned};
    let unregister = |c: &Command| is_outbound(c, None, true);
    let delete_nat = |c: &Command| is_delete(c, ResourceKind::NatGateway);
    let delete_pip = |c: &Command| is_delete(c, ResourceKind::PublicIp);
    let steps: [&dyn Fn(&Command) -> bool; 3] = [&unregister, &delete_nat, &delete_pip];
    for (case, failing) in [
        ("unregister", [true, false, false]),
        ("NAT gateway delete", [false, true, false]),
        ("public IP delete", [false, false, true]),
        ("every step", [true, true, true]),
    ] {
        let mut tracker = provisioned();
        let step = tracker.observe(NOW + 1, vec![gone("p")]);
        let mut left = failing.map(|f| if f { 2 } else { 0 });
        // (the command, whether it succeeded)
        let mut answered: Vec<(Command, bool)> = Vec::new();
        drive(&mut tracker, NOW + 1, step, |c| {
            if let Some(i) = steps.iter().position(|s| s(c))
                && left[i] > 0
            {
                left[i] -= 1;
                answered.push((c.clone(), false));
                return failed(500);
            }
            answered.push((c.clone(), true));
            ok(c)
        });
        for (i, is_step) in steps.iter().enumerate() {
            let tries = answered.iter().filter(|(c, _)| is_step(c)).count();
            assert_eq!(tries, if failing[i] { 3 } else { 1 }, "{case}: step {i}: {answered:?}");
            let succeeded = answered.iter().position(|(c, done)| is_step(c) && *done).expect("succeeded in the end");
            for later in &steps[i + 1..] {
                let first = answered.iter().position(|(c, _)| later(c)).expect("the later step ran");
                assert!(succeeded < first, "{case}: step {i} succeeded before the next one: {answered:?}");
            }
        }
        assert!(tracker.outbound().lifecycles.is_empty(), "{case}");
        assert!(!tracker.egress().is_registered(IDENTITY), "{case}");
    }
}

// Upstream TestServiceUpdaterDeleteOutboundService_StepFailuresRetain, its unregister case: while the
// unregistration fails, NRP's registration is kept (the identity counts as registered) and nothing is deleted.
#[test]
fn while_an_identitys_unregistration_fails_it_stays_registered_and_nothing_is_deleted() {
    use super::upstream_outbound::{IDENTITY, drive, drive_until, gone, is_outbound, ok, provisioned};
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (before, (id, _)) = drive_until(&mut tracker, NOW + 1, step, |c| is_outbound(c, None, true));
    assert!(!before.iter().any(|c| matches!(c, Command::DeleteResource(_))), "{before:?}");
    let step = tracker.complete(NOW + 2, vec![(id, failed(500))]);
    assert!(tracker.egress().is_registered(IDENTITY), "kept registered");
    assert!(!step.commands.iter().any(|c| matches!(c.command, Command::DeleteResource(_))), "{:?}", step.commands);
    assert!(step.wake_at_ms.is_some_and(|at| at > NOW + 2), "retried after a backoff: {:?}", step.wake_at_ms);
    let (issued, _) = drive(&mut tracker, NOW + 2, step, ok);
    assert!(issued.first().is_some_and(|c| is_outbound(c, None, true)), "the unregistration first: {issued:?}");
    assert!(!tracker.egress().is_registered(IDENTITY));
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestServiceUpdaterCreateOutboundService_StepFailuresDoNotRecordNRPState, its public IP case: a failed
// public IP create stops the creation there: no NAT gateway put, no registration, no address sent, the identity
// not registered; the retried create succeeds and the rest follows in order.
#[test]
fn a_failed_public_ip_create_stops_the_identitys_creation_until_its_retry_succeeds() {
    use super::upstream_outbound::{IDENTITY, drive, drive_until, is_outbound, ok, pod, started};
    let mut tracker = started();
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (before, (id, put_pip)) = drive_until(&mut tracker, NOW, step, |c| matches!(c, Command::PutPublicIp(_)));
    assert!(!before.iter().any(|c| matches!(c, Command::PutNatGateway(_) | Command::UpdateServices(_))), "{before:?}");
    let step = tracker.complete(NOW, vec![(id, failed(500))]);
    let writes_on =
        |c: &Command| matches!(c, Command::PutNatGateway(_) | Command::UpdateServices(_)) || is_location_update(c);
    assert!(!step.commands.iter().any(|c| writes_on(&c.command)), "{:?}", step.commands);
    assert!(!tracker.egress().is_registered(IDENTITY));
    assert_ne!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    let at = |what: &dyn Fn(&Command) -> bool| issued.iter().position(what).unwrap_or_else(|| panic!("{issued:?}"));
    let pip = at(&|c| *c == put_pip);
    let nat = at(&|c| matches!(c, Command::PutNatGateway(_)));
    let register = at(&|c| is_outbound(c, Some(IDENTITY), false));
    let address = at(&is_location_update);
    assert!(pip < nat && nat < register && register < address, "{issued:?}");
    assert!(tracker.egress().is_registered(IDENTITY));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
}

// Upstream TestEgressRefCount_Robust, at tracker level: the last pod's delete delivered twice, and again after the
// teardown, starts the identity's teardown exactly once (one NAT gateway delete, one public IP delete); the
// late duplicate issues nothing.
#[test]
fn a_duplicate_delete_of_the_last_pod_starts_the_teardown_once() {
    use super::upstream_outbound::{IDENTITY, drive, gone, is_delete, ok, provisioned};
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p"), gone("p")]);
    let (issued, now) = drive(&mut tracker, NOW + 1, step, ok);
    assert_eq!(issued.iter().filter(|c| is_delete(c, ResourceKind::NatGateway)).count(), 1, "{issued:?}");
    assert_eq!(issued.iter().filter(|c| is_delete(c, ResourceKind::PublicIp)).count(), 1, "{issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    let again = tracker.observe(now + 1, vec![gone("p")]);
    assert!(again.commands.is_empty(), "{:?}", again.commands);
    assert!(!tracker.outbound().lifecycles.contains_key(IDENTITY));
    assert!(tracker.is_quiet());
}

// Upstream TestDeleteOutboundService_CountsSwallowedDisassociationFailure, its control: a teardown whose
// disassociation succeeds logs no swallowed failure.
#[test]
fn a_teardown_whose_disassociation_succeeds_logs_no_swallowed_failure() {
    use super::upstream_outbound::{gone, ok, provisioned};
    let mut tracker = provisioned();
    let mut step = tracker.observe(NOW + 1, vec![gone("p")]);
    let mut logs: Vec<String> = Vec::new();
    let mut issued = Vec::new();
    let mut now = NOW + 1;
    while !step.commands.is_empty() {
        logs.extend(step.logs.iter().map(|l| l.message.clone()));
        let results = step.commands.iter().map(|c| (c.id, ok(&c.command))).collect();
        issued.extend(step.commands.iter().map(|c| c.command.clone()));
        now += 1;
        step = tracker.complete(now, results);
    }
    logs.extend(step.logs.iter().map(|l| l.message.clone()));
    assert!(issued.iter().any(|c| matches!(c, Command::PutNatGateway(n) if !n.associated)), "{issued:?}");
    assert!(!logs.iter().any(|l| l.contains("the teardown goes on")), "{logs:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
}

/// `pod` being deleted, holding the egress pod finalizer.
fn deleting_held_pod(pod: Pod) -> Pod {
    Pod { deleting: true, finalizers: vec![super::super::egress::finalizers::FINALIZER.into()], ..pod }
}

/// The release of the finalizer of pod `name` (any UID).
fn releases_pod(command: &Command, name: &str) -> bool {
    matches!(command, Command::SetFinalizer { service, present: false, .. }
        if service.kind.as_str() == "Pod" && service.name.as_str() == name)
}

/// NRP after a restart: the egress identity registered, `addresses` of it at `location`.
fn nrp_with_identity(location: &str, addresses: &[&str]) -> NrpState {
    use super::upstream_outbound::IDENTITY;
    NrpState {
        services: vec![NrpService {
            name: IDENTITY.into(),
            service_type: "Outbound".into(),
            backend_pools: vec![],
            is_default: false,
        }],
        locations: vec![NrpListedLocation {
            location: location.into(),
            addresses: addresses
                .iter()
                .map(|a| NrpAddress { address: (*a).into(), services: vec![IDENTITY.into()] })
                .collect(),
        }],
    }
}

/// Whether `command` drains `address` at `location`: deletes the whole location, replaces it without
/// the address, or unbinds the address.
fn drains(command: &Command, location: &str, address: &str) -> bool {
    let Command::UpdateAddressLocations(locations) = command else { return false };
    locations.iter().filter(|l| l.location == location).any(|l| {
        l.addresses.is_empty()
            || (l.action == UpdateAction::FullUpdate && !l.addresses.iter().any(|a| a.address == address))
            || l.addresses.iter().any(|a| a.address == address && a.services.is_empty())
    })
}

/// A restarted tracker seeing `pods` (and the lists complete), NRP answering `nrp` and ARM listing the
/// identity's NAT gateway and public IP: every command driven, all going well.
fn restarted_with(pods: Vec<Pod>, nrp: NrpState) -> (Tracker, Vec<Command>) {
    use super::upstream_outbound::{IDENTITY, drive_keeping, ok};
    let mut tracker = Tracker::create(clb()).unwrap();
    let mut observations: Vec<Observation> = pods.into_iter().map(Observation::PodUpserted).collect();
    observations.push(Observation::ListsComplete);
    let step = tracker.observe(NOW, observations);
    let inventory = ArmInventory {
        nat_gateways: vec![ListedNatGateway {
            name: IDENTITY.into(),
            public_ips: vec![format!("{IDENTITY}-pip")],
            public_ips_v6: vec![],
            associated: true,
            as_put: true,
        }],
        public_ips: vec![ListedPublicIp {
            name: format!("{IDENTITY}-pip"),
            version: IpVersion::Ipv4,
            address: Some("20.0.0.8".into()),
            as_put: true,
        }],
        ..ArmInventory::default()
    };
    let answer = |c: &Command| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(nrp.clone()),
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        other => ok(other),
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, answer, |c| !matches!(c, Command::EmitEvent(_)));
    (tracker, issued)
}

// Upstream TestGuardDeletePod_UntrackedAndAbsentFromNRPExplicitlyReleases: after a restart, a deleting pod holding
// the finalizer whose (valid) identity the tracker does not track and NRP does not list is released at once: no
// drain, no teardown, no creation.
#[test]
fn after_a_restart_a_deleting_held_pod_of_an_identity_nrp_does_not_list_is_released_at_once() {
    use super::upstream_outbound::{drive_keeping, ok, pod};
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![Observation::PodUpserted(deleting_held_pod(pod("p", "10.244.2.10"))), Observation::ListsComplete],
    );
    let (issued, _) = drive_keeping(&mut tracker, NOW, step, ok, |c| !matches!(c, Command::EmitEvent(_)));
    let written: Vec<&Command> = issued.iter().filter(|c| **c != Command::ReadNrp).collect();
    assert_eq!(written.len(), 1, "{issued:?}");
    assert!(releases_pod(written[0], "p"), "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestRecoverStuckFinalizers_NoIPPodUsesServiceDrainVerification: after a restart, a Terminating pod with
// no IP, holding the finalizer, whose identity NRP maps at an address no pod backs, keeps its finalizer until
// that address is drained and the identity (carried by no pod) torn down; then it is released.
#[test]
fn after_a_restart_a_deleting_pod_with_no_ip_keeps_its_finalizer_until_its_identitys_stray_address_drains() {
    use super::upstream_outbound::{HOST, pod};
    let no_ip = Pod {
        pod_ips: vec![],
        pod_ip: None,
        phase: Some("Failed".into()),
        ..deleting_held_pod(pod("p", "10.244.2.10"))
    };
    let (tracker, issued) = restarted_with(vec![no_ip], nrp_with_identity(HOST, &["10.244.9.1"]));
    let release = issued.iter().position(|c| releases_pod(c, "p")).unwrap_or_else(|| panic!("released: {issued:?}"));
    let drained =
        issued.iter().position(|c| drains(c, HOST, "10.244.9.1")).unwrap_or_else(|| panic!("drained: {issued:?}"));
    let torn = issued
        .iter()
        .position(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway))
        .unwrap_or_else(|| panic!("torn down: {issued:?}"));
    assert!(drained < release && torn < release, "{issued:?}");
    assert_eq!(issued.iter().filter(|c| releases_pod(c, "p")).count(), 1);
    assert!(tracker.nrp_view().values().all(|a| a.is_empty()), "{:?}", tracker.nrp_view());
}

// Upstream TestGuardDeletePod_LocalStateMissingNRPOnlySurvivorSchedulesServiceCleanup: after a restart, the
// deleting pod is the identity's last although NRP lists another address of it that no pod explains: that
// survivor is drained too, the identity torn down, and the pod released only after both.
#[test]
fn after_a_restart_an_nrp_only_survivor_address_is_drained_with_the_last_pods_and_the_identity_torn_down() {
    use super::upstream_outbound::{HOST, pod};
    let deleting = deleting_held_pod(pod("p", "10.244.2.10"));
    let (tracker, issued) = restarted_with(vec![deleting], nrp_with_identity(HOST, &["10.244.2.10", "10.244.2.99"]));
    let release = issued.iter().position(|c| releases_pod(c, "p")).unwrap_or_else(|| panic!("released: {issued:?}"));
    for address in ["10.244.2.10", "10.244.2.99"] {
        let drained =
            issued.iter().position(|c| drains(c, HOST, address)).unwrap_or_else(|| panic!("{address}: {issued:?}"));
        assert!(drained < release, "{address}: {issued:?}");
    }
    let nat = issued
        .iter()
        .position(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway))
        .unwrap_or_else(|| panic!("torn down: {issued:?}"));
    assert!(nat < release, "{issued:?}");
    assert!(tracker.nrp_view().values().all(|a| a.is_empty()), "{:?}", tracker.nrp_view());
    assert!(tracker.outbound().lifecycles.is_empty());
}

// Upstream TestGuardDeletePod_InvalidParamsIsNoOp, its no-addresses and empty-location cases: beside a live pod of
// the identity, a held pod with no IP, and one whose only IP has no host IP of its family (an IPv6 pod IP on an
// IPv4-only host: no location), are released at once when deleted: no drain and no teardown; the live pod's
// address stays in NRP.
#[test]
fn a_deleted_pod_with_no_address_or_no_location_is_released_at_once_without_a_drain_or_a_teardown() {
    use super::upstream_outbound::{HOST, IDENTITY, drive_keeping, ok, pod, provisioned};
    let no_ip = Pod { pod_ips: vec![], pod_ip: None, ..pod("p2", "10.244.2.12") };
    let no_location = Pod { pod_ips: vec!["fd01::5".into()], ..pod("p3", "10.244.2.13") };
    for (case, other) in [("no IP", no_ip), ("no location", no_location)] {
        let mut tracker = provisioned();
        let held = Pod { finalizers: vec![super::super::egress::finalizers::FINALIZER.into()], ..other };
        let name = held.name.clone();
        let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(held.clone())]);
        let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, ok, |c| !matches!(c, Command::EmitEvent(_)));
        assert!(!issued.iter().any(is_location_update), "{case}: nothing to program: {issued:?}");
        let step = tracker.observe(NOW + 2, vec![Observation::PodUpserted(deleting_held_pod(held))]);
        let (issued, _) = drive_keeping(&mut tracker, NOW + 2, step, ok, |c| !matches!(c, Command::EmitEvent(_)));
        assert_eq!(issued.len(), 1, "{case}: {issued:?}");
        assert!(releases_pod(&issued[0], &name), "{case}: {issued:?}");
        assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", &name)).is_none(), "{case}");
        assert!(tracker.nrp_view()[HOST]["10.244.2.10"].contains(IDENTITY), "{case}");
        assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created, "{case}");
    }
}

// Upstream TestProcessK8sEgresses_SkipsMalformedIPs, its malformed host IP case: a pod whose pod IP is valid but
// whose host IP is not an IP address is not placed: only the good pod beside it reaches NRP.
#[test]
fn a_pod_with_a_malformed_host_ip_is_not_placed_and_the_good_pod_beside_it_is() {
    use super::upstream_outbound::{HOST, IDENTITY, drive, ok, pod, started};
    let mut tracker = started();
    let bad = Pod { host_ips: vec!["bad-host".into()], ..pod("bad", "10.244.6.3") };
    let step =
        tracker.observe(NOW, vec![Observation::PodUpserted(bad), Observation::PodUpserted(pod("good", "10.244.2.10"))]);
    let (issued, _) = drive(&mut tracker, NOW, step, ok);
    assert!(issued.iter().any(is_location_update), "{issued:?}");
    let view = tracker.nrp_view();
    assert_eq!(view.keys().collect::<Vec<_>>(), [HOST], "{view:?}");
    assert_eq!(view[HOST].keys().collect::<Vec<_>>(), ["10.244.2.10"], "{view:?}");
    assert!(view[HOST]["10.244.2.10"].contains(IDENTITY));
    assert!(!format!("{issued:?}").contains("10.244.6.3"), "{issued:?}");
}

// Upstream TestGuardDeletePod_RecoveredDeletePreservesInFlightDeletionForLiveReregistration: after a restart, the
// teardown of a deleting last pod's identity is in flight (its NAT gateway delete) when a new pod carrying the
// identity arrives: the deletion is not revived as created; the new pod is held (its finalizer added, its address
// not programmed) until the teardown ends and the identity is created again, and only then is its address sent.
#[test]
fn after_a_restart_a_pod_arriving_during_the_recovered_teardown_waits_for_the_identity_to_be_recreated() {
    use super::upstream_outbound::{HOST, IDENTITY, drive_keeping, is_outbound, ok, pod};
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![Observation::PodUpserted(deleting_held_pod(pod("p", "10.244.2.10"))), Observation::ListsComplete],
    );
    let nrp = nrp_with_identity(HOST, &["10.244.2.10"]);
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
    let answer = |c: &Command| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(nrp.clone()),
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        other => ok(other),
    };
    let is_nat_delete = |c: &Command| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::NatGateway);
    // Answer everything up to the NAT gateway delete, which is held in flight.
    let mut step = step;
    let held = loop {
        assert!(!step.commands.is_empty(), "the NAT gateway delete was never issued");
        if let Some(c) = step.commands.iter().find(|c| is_nat_delete(&c.command)) {
            let id = c.id;
            let others: Vec<(u64, Outcome)> =
                step.commands.iter().filter(|c| c.id != id).map(|c| (c.id, answer(&c.command))).collect();
            if !others.is_empty() {
                tracker.complete(NOW, others);
            }
            break id;
        }
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = tracker.complete(NOW, results);
    };
    let arrived = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let sent: Vec<&Command> =
        arrived.commands.iter().map(|c| &c.command).filter(|c| !matches!(c, Command::EmitEvent(_))).collect();
    assert!(!sent.iter().any(|c| is_location_update(c)), "q's address waits: {sent:?}");
    assert!(
        sent.iter()
            .all(|c| matches!(c, Command::SetFinalizer { service, present: true, .. } if service.name.as_str() == "q")),
        "only q's finalizer: {sent:?}"
    );
    assert_ne!(tracker.outbound().lifecycles.get(IDENTITY).map(|l| l.phase), Some(Phase::Created), "not revived");
    let mut commands = arrived.commands;
    commands.extend(tracker.complete(NOW + 2, vec![(held, Outcome::Ok)]).commands);
    let (issued, _) = drive_keeping(&mut tracker, NOW + 2, Step { commands, ..Step::default() }, answer, |c| {
        !matches!(c, Command::EmitEvent(_))
    });
    let at = |what: &dyn Fn(&Command) -> bool| issued.iter().position(what).unwrap_or_else(|| panic!("{issued:?}"));
    let delete_pip = at(&|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp));
    let put_pip = at(&|c| matches!(c, Command::PutPublicIp(_)));
    let put_nat = at(&|c| matches!(c, Command::PutNatGateway(n) if n.associated));
    let register = at(&|c| is_outbound(c, Some(IDENTITY), false));
    let q_address = at(&|c| {
        matches!(c, Command::UpdateAddressLocations(ls)
        if ls.iter().flat_map(|l| &l.addresses).any(|a| a.address == "10.244.2.11" && !a.services.is_empty()))
    });
    assert!(delete_pip < put_pip && put_pip < put_nat && put_nat < register && register < q_address, "{issued:?}");
    assert!(releases_pod(&issued[at(&|c| releases_pod(c, "p"))], "p"));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(tracker.nrp_view()[HOST].keys().collect::<Vec<_>>(), ["10.244.2.11"]);
}

// Upstream TestGuardDeleteOutboundService_FinalizerRemovalFailureReportsFailure: the last pod's release failing
// after its identity's teardown completed is not done: it is retried (here twice refused, then accepted), with
// one Warning, and the teardown is not redone (one NAT gateway and one public IP delete); then all is quiet.
#[test]
fn a_last_pods_release_failing_after_the_teardown_is_retried_without_redoing_the_teardown() {
    use super::super::egress::finalizers::reason::POD_FINALIZER_FAILED;
    use super::upstream_outbound::{drive_keeping, ok, pod, provisioned};
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(deleting_held_pod(pod("p", "10.244.2.10")))]);
    let mut refusals = 2;
    let answer = |c: &Command| {
        if releases_pod(c, "p") && refusals > 0 {
            refusals -= 1;
            return failed(500);
        }
        ok(c)
    };
    let (issued, _) = drive_keeping(&mut tracker, NOW + 1, step, answer, |_| true);
    assert_eq!(issued.iter().filter(|c| releases_pod(c, "p")).count(), 3, "{issued:?}");
    let first_release = issued.iter().position(|c| releases_pod(c, "p")).unwrap();
    let deletes = |kind: ResourceKind| {
        issued.iter().filter(|c| matches!(c, Command::DeleteResource(r) if r.kind == kind)).count()
    };
    assert_eq!((deletes(ResourceKind::NatGateway), deletes(ResourceKind::PublicIp)), (1, 1), "{issued:?}");
    assert!(
        issued[..first_release]
            .iter()
            .any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp)),
        "the release follows the teardown: {issued:?}"
    );
    let warnings =
        issued.iter().filter(|c| matches!(c, Command::EmitEvent(e) if e.reason == POD_FINALIZER_FAILED)).count();
    assert_eq!(warnings, 1, "{issued:?}");
    assert!(tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).is_none());
    assert!(tracker.outbound().lifecycles.is_empty());
    assert!(tracker.is_quiet());
}

// Upstream TestGuardDeletePodForReplacement_DoesNotDeleteSameServiceNATGateway: the identity's sole pod replaced
// (same name, new UID) at a new address, read as the replacement alone or as the old pod's delete and the
// replacement in one batch: the old address leaves NRP, the new one is added for the identity, the replacement
// is tracked under its UID, and the identity is neither torn down nor written again.
#[test]
fn the_sole_pod_replaced_at_a_new_address_moves_its_address_and_keeps_the_nat_gateway() {
    use super::upstream_outbound::{HOST, IDENTITY, drive, gone, ok, pod, provisioned};
    for with_delete in [false, true] {
        let mut tracker = provisioned();
        let replacement = Observation::PodUpserted(Pod { uid: "uid-p2".into(), ..pod("p", "10.244.2.11") });
        let batch = if with_delete { vec![gone("p"), replacement] } else { vec![replacement] };
        let step = tracker.observe(NOW + 1, batch);
        let (issued, _) = drive(&mut tracker, NOW + 1, step, ok);
        let identity_write = |c: &Command| {
            matches!(
                c,
                Command::DeleteResource(_)
                    | Command::PutNatGateway(_)
                    | Command::PutPublicIp(_)
                    | Command::UpdateServices(_)
            )
        };
        assert!(!issued.iter().any(identity_write), "with delete {with_delete}: {issued:?}");
        let want: View = View::from([(
            HOST.to_owned(),
            BTreeMap::from([("10.244.2.11".to_owned(), BTreeSet::from([IDENTITY.to_owned()]))]),
        )]);
        assert_eq!(tracker.nrp_view(), want, "with delete {with_delete}");
        assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created, "with delete {with_delete}");
        assert_eq!(
            tracker.egress.finalizers.get(&ObjectKey::new("batch", "p")).map(|h| h.uid.as_str()),
            Some("uid-p2")
        );
    }
}

// Upstream TestPodEgressAddresses, its dual-stack, canonical IPv6 and lists-win cases at tracker level: a
// dual-stack pod's every PodIPs entry reaches NRP under its same-family host IP, an IPv6 pod IP written in full
// (FD00:0:0:0:0:0:0:1) is programmed canonical (fd00::1), and PodIPs wins over a different PodIP.
#[test]
fn every_pod_ip_reaches_nrp_canonical_under_its_family_and_pod_ips_win_over_pod_ip() {
    use super::upstream_outbound::{HOST, IDENTITY, drive, ok, pod, started};
    let mut tracker = started();
    let dual = Pod {
        pod_ips: vec!["10.244.2.10".into(), "FD00:0:0:0:0:0:0:1".into()],
        host_ips: vec![HOST.into(), "fd00::6".into()],
        ..pod("dual", "10.244.2.10")
    };
    let listed = Pod { pod_ip: Some("10.244.2.99".into()), ..pod("listed", "10.244.2.11") };
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(dual), Observation::PodUpserted(listed)]);
    drive(&mut tracker, NOW, step, ok);
    let ours = BTreeSet::from([IDENTITY.to_owned()]);
    let want = View::from([
        (
            HOST.to_owned(),
            BTreeMap::from([("10.244.2.10".to_owned(), ours.clone()), ("10.244.2.11".to_owned(), ours.clone())]),
        ),
        ("fd00::6".to_owned(), BTreeMap::from([("fd00::1".to_owned(), ours)])),
    ]);
    assert_eq!(tracker.nrp_view(), want);
}

// Upstream TestOnServiceCreationComplete_OverlayMappingsErrorReDrainsLocations: an unregistration NRP refuses
// because addresses still map to the Service goes back to draining (DeletionPending, in the drain set) once NRP,
// read again, shows such an address; the address is removed (the re-drain), no unregistration is sent while
// that removal is unanswered, even long past the backoff, and once it lands the Service is unregistered, its
// public IP deleted and its finalizer released.
#[test]
fn an_unregistration_refused_for_overlay_mappings_waits_for_the_drain_of_what_nrp_still_maps_then_unregisters() {
    use super::upstream_outbound::{drive, drive_all_but, drive_until, overlay_mappings_refusal};
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(terminating_web())]);
    let is_unregistration =
        |c: &Command| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == UID && r.is_delete));
    let (_, (id, _)) = drive_until(&mut tracker, NOW, step, is_unregistration);
    let step = tracker.complete(NOW + 1, vec![(id, overlay_mappings_refusal())]);
    assert!(!step.commands.iter().any(|c| is_unregistration(&c.command)), "{:?}", step.commands);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("NRP read again").id;
    // A pod address Kubernetes no longer lists, which NRP still maps to the Service.
    let stray = NrpListedLocation {
        location: "10.224.0.4".into(),
        addresses: vec![NrpAddress { address: "10.244.0.99".into(), services: vec![UID.into()] }],
    };
    let registered =
        NrpService { name: UID.into(), service_type: "Inbound".into(), backend_pools: vec![], is_default: false };
    let snapshot = NrpState { services: vec![registered], locations: vec![stray] };
    let step = tracker.complete(NOW + 1, vec![(read, Outcome::NrpSnapshot(snapshot))]);
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending), "{:?}", step.commands);
    assert!(tracker.inbound.work.draining.contains(UID), "back in the drain set");
    let removes_stray = |l: &NrpLocation| {
        l.location == "10.224.0.4"
            && (l.addresses.is_empty()
                || l.addresses.iter().any(|a| a.address == "10.244.0.99" && a.services.is_empty()))
    };
    let redrain = |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(removes_stray));
    let batch = step.commands.iter().find(|c| redrain(&c.command)).expect("the re-drain").id;
    // The removal hangs far past the backoff; everything else is answered: nothing is unregistered meanwhile.
    let late = NOW + 60_000;
    let meanwhile = drive_all_but(&mut tracker, NOW + 1, step, batch, late, answer_ok(&[UID]));
    assert!(!meanwhile.iter().any(is_unregistration), "{meanwhile:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending), "{meanwhile:?}");
    let pending = tracker.complete(late, vec![(batch, Outcome::Ok)]);
    let (issued, _) = drive(&mut tracker, late, pending, answer_ok(&[]));
    let at = |what: &dyn Fn(&Command) -> bool| issued.iter().position(what);
    let unregistered = at(&is_unregistration).unwrap_or_else(|| panic!("unregistered: {issued:?}"));
    let pip = at(&|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp)).expect("its IP");
    let released = at(&|c| matches!(c, Command::SetFinalizer { present: false, .. })).expect("its finalizer");
    assert!(unregistered < pip && pip < released, "{issued:?}");
    assert_eq!(unregistrations(&issued), 1, "{issued:?}");
    assert!(!issued.iter().any(redrain), "drained once: {issued:?}");
    assert_eq!(tracker.phase(UID), None);
}
