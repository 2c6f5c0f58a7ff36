//! Ports of upstream engine tests about the lifecycle: endpoint changes and deletes while a
//! command is in flight, repeated and redundant events, names. Each test names the upstream test it
//! ports in the comment directly above it (`docs/conformance.md` is generated from those).

use super::*;

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
    assert!(tracker.state.lifecycles.is_empty() && tracker.state.draining.is_empty());
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
    assert_eq!(tracker.state.draining, BTreeSet::from([UID.to_owned()]));
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
    let lifecycle = &tracker.state.lifecycles[UID];
    assert_eq!(lifecycle.retries, 1);
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
    assert!(tracker.state.lifecycles[UID].recreate, "the recreate is armed");
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
    assert!(tracker.state.lifecycles[UID].recreate, "the recreate is armed");
    pending.commands.extend(tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]).commands);
    assert!(!tracker.state.lifecycles[UID].recreate, "and disarmed by the deletion");
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
        assert_eq!(tracker.state.lifecycles[UID].recreate, !terminates, "terminating {terminates}");
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
    assert!(tracker.state.draining.contains(UID));
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
