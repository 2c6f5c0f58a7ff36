//! Per-phase dispatch (upstream engine_state_machine_guards_test.go), start-up adoption from the
//! ARM inventory, and the write budgets.

use super::*;

// ---- Per-phase dispatch (upstream engine_state_machine_guards_test.go) ----

// Upstream TestGuardStateTransitions_DeleteServiceDispatch: deleting the Service in any phase
// before deletion makes it DeletionPending and queues it for the drain (its addresses leave
// NRP before anything is unregistered); an update in flight ends in the deletion, not in a
// status patch; in every phase the load balancer is deleted and the Service forgotten.
// Upstream TestGuardLifecycle_DeleteDuringCreateRoutesToDeletion, TestEngineDeleteService_NoLocations,
// TestEngineDeleteService_DuringUpdate, TestEngineOnServiceCreationComplete_DeletionPendingAfterUpdate,
// TestEngineOnServiceCreationComplete_DeleteDuringCreateRoutesToDeletion,
// TestDeleteService_DuringUpdateNoLocations_DispatchesDelete and
// TestLoadBalancerEnsureDeletedSchedulesTeardown.
#[test]
fn deleting_a_service_in_any_phase_before_deletion_queues_its_drain_and_ends_in_its_deletion() {
    for phase in &PHASES[..4] {
        let (mut tracker, held) = in_phase(*phase);
        let step = tracker.observe(NOW + 1, vec![Observation::ServiceDeleted(ObjectKey::new("default", "web"))]);
        assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending), "{phase:?}");
        assert!(tracker.inbound.work.draining.contains(UID), "{phase:?}: queued for the drain");
        assert!(put_in(&step).is_none(), "{phase:?}");
        let issued = finish(&mut tracker, NOW + 2, held, step);
        assert_eq!(tracker.phase(UID), None, "{phase:?}: forgotten: {issued:?}");
        assert!(
            !issued
                .iter()
                .any(|c| matches!(c, Command::PatchServiceStatus { ingress_ips, .. } if !ingress_ips.is_empty())),
            "{phase:?}: no status patch of an address being deleted: {issued:?}"
        );
        let load_balancer_deleted = issued
            .iter()
            .any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer && r.name == UID));
        assert!(load_balancer_deleted, "{phase:?}: {issued:?}");
    }
}

// ---- Start-up adoption from the ARM inventory ----

// Upstream TestGuardWaitForInitialSync_ReturnsOnCompletion.
#[test]
fn at_start_up_the_tracker_lists_arm_once_the_lists_are_complete_and_nrp_is_read_and_writes_nothing_before() {
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(provisioned_service())]);
    let sent: Vec<&Command> = step.commands.iter().map(|c| &c.command).collect();
    assert_eq!(sent, [&Command::ReadNrp]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
    assert!(step.commands.is_empty() && step.wake_at_ms.is_some_and(|at| at > NOW), "{step:?}");
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let sent: Vec<&Command> = step.commands.iter().map(|c| &c.command).collect();
    assert_eq!(sent, [&Command::ReadArm], "the inventory is read, nothing written yet");
    assert!(!step.idle);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, Outcome::ArmInventory(ArmInventory::default()))]);
    assert!(step.commands.iter().any(|c| matches!(c.command, Command::PutPublicIp(_))), "{step:?}");
}

// Upstream TestGuardAddService_IdempotentForExistingNRPLB, TestEngineAddService_ExistsInNRP,
// TestEngineUpdateService_NoOpWhenConfigUnchanged, TestEngineUpdateEndpoints_AfterRestart,
// TestEngineAddService_AfterRestart, TestShouldTriggerInitialLocationSync, TestUpdateNRPLoadBalancers
// and TestGetSyncOperations.
#[test]
fn a_restarted_controller_adopts_a_service_whose_azure_resources_registration_and_status_hold_with_no_write_and_no_event()
 {
    let service = provisioned_service();
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
    let config = LbConfig::for_service(&service);
    let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
    let (issued, logs, last) =
        reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
    assert_eq!(issued, [Command::ReadNrp, Command::ReadArm], "nothing written, no second EnsuredLoadBalancer");
    assert!(last.idle);
    assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
    assert!(
        logs.iter()
            .any(|l| l.message.contains("1 Service(s) adopted their public IP, 1 of them with nothing to write"))
    );
    // Adopted as applied: the same spec again writes nothing, a port change puts the LB once.
    let again = tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone())]);
    assert!(again.commands.is_empty(), "{again:?}");
    let changed = Service { ports: vec![ServicePort { port: 8080, ..service.ports[0].clone() }], ..service.clone() };
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(changed)]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[&service.identity()]));
    assert_eq!(load_balancers(&issued).len(), 1, "{issued:?}");
    assert_eq!(writes(&issued).len(), 1, "only the load balancer: {issued:?}");
}

// Upstream TestGuardUpdateService_LBInNRPCreatesTrackingEntry.
#[test]
fn a_restarted_controller_adopts_the_public_ip_and_puts_a_load_balancer_whose_rules_differ_once() {
    let service = provisioned_service();
    let config = LbConfig::for_service(&service);
    for listed in [
        Some(LoadBalancer { rules: vec![], ..config.load_balancer.clone() }),
        None, // ARM lists no load balancer by that name, or one the record cannot say
    ] {
        let mut tracker = Tracker::create(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let inventory = inventory_of(&service, listed.clone());
        let (issued, _, last) =
            reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
        assert_eq!(writes(&issued), [&Command::PutLoadBalancer(config.load_balancer.clone())], "{listed:?}");
        assert!(last.idle);
        assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
    }
}

#[test]
fn a_listed_public_ip_that_is_not_as_put_or_has_no_address_is_put_again() {
    let service = provisioned_service();
    let config = LbConfig::for_service(&service);
    for tamper in [|p: &mut ListedPublicIp| p.as_put = false, |p: &mut ListedPublicIp| p.address = None] {
        let mut inventory = inventory_of(&service, Some(config.load_balancer.clone()));
        tamper(&mut inventory.public_ips[0]);
        let mut tracker = Tracker::create(clb()).unwrap();
        let step =
            tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
        let (issued, _, _) =
            reads_answered(&mut tracker, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
        assert!(matches!(writes(&issued)[0], Command::PutPublicIp(_)), "{issued:?}");
    }
}

// Ports upstream TestScheduleOrphanedResourceDeletions_SkipsNonUUIDLoadBalancers: only
// UID-named load balancers (and `<uid>-pip` public IPs) are ever taken for orphans; here
// `kubernetes` and its public IP stay, as do a UID-named one of another shape and one whose
// shape the host could not say.
// Upstream TestGuardDeleteService_OrphanForcesTrackingEntry,
// TestCheckPendingServiceDeletions_MissingFromPendingServiceOps and TestGetSyncLoadBalancerServices.
#[test]
fn resources_of_services_deleted_while_no_controller_ran_are_deleted_and_nothing_else_is_touched() {
    let gone = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e99";
    let pip_only = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e98";
    let foreign_shape = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e97";
    let ours = |name: &str| LoadBalancer {
        name: name.into(),
        public_ip: format!("{name}-pip").into(),
        backend_pool: name.into(),
        rules: vec![],
    };
    let pip = |name: &str| ListedPublicIp {
        name: name.into(),
        version: IpVersion::Ipv4,
        address: Some("20.0.0.9".into()),
        as_put: true,
    };
    let inventory = ArmInventory {
        nat_gateways: Vec::new(),
        public_ips: vec![pip(&format!("{gone}-pip")), pip(&format!("{pip_only}-pip")), pip("kubernetes-pip")],
        load_balancers: vec![
            ListedLoadBalancer { name: gone.into(), shape: Some(ours(gone)) },
            ListedLoadBalancer { name: "kubernetes".into(), shape: Some(ours("kubernetes")) },
            ListedLoadBalancer {
                name: foreign_shape.into(),
                shape: Some(LoadBalancer { backend_pool: "other".into(), ..ours(foreign_shape) }),
            },
            ListedLoadBalancer { name: "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e96".into(), shape: None },
        ],
    };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let (issued, logs, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(inventory));
    let deleted = |kind: ResourceKind, name: String| Command::DeleteResource(ResourceRef { kind, name });
    let expected = [
        deleted(ResourceKind::LoadBalancer, gone.into()),
        deleted(ResourceKind::PublicIp, format!("{gone}-pip")),
        deleted(ResourceKind::LoadBalancer, pip_only.into()),
        deleted(ResourceKind::PublicIp, format!("{pip_only}-pip")),
    ];
    let mut written: Vec<Command> = writes(&issued).into_iter().cloned().collect();
    written.sort_by_key(|c| format!("{c:?}"));
    let mut expected = expected.to_vec();
    expected.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(written, expected);
    assert!(last.idle);
    assert!(logs.iter().any(|l| l.message.contains("2 orphan(s) of deleted Services to delete")), "{logs:?}");
}

// Ports upstream TestRecoverStuckFinalizers_KeepsFinalizerWhenOnlyPIPExists and
// TestRecoverStuckFinalizers_RemovesFinalizerWhenNoAzureResource: a Service found deleting
// at start-up keeps its finalizer until what is left of its Azure resources is deleted (a
// delete that finds nothing is done), then releases it. A public IP listed with no address
// yet (the crash right after its create), or not as put, still counts as left.
// Upstream TestReconcileInboundService_DeletingServiceIsNotProvisionedFromScratch,
// TestDeletePublicIP_Mock and TestEngineDeleteService_AfterRestart.
#[test]
fn a_service_found_deleting_at_start_up_releases_its_finalizer_only_after_what_is_left_in_azure_is_deleted() {
    let config = LbConfig::for_service(&provisioned_service());
    for (pip_left, address, as_put) in
        [(true, Some(ADDRESS), true), (true, None, true), (true, None, false), (false, None, true)]
    {
        let deleting = Service { deleting: true, ..provisioned_service() };
        let identity = deleting.identity();
        let mut inventory = inventory_of(&deleting, None);
        inventory.public_ips[0].address = address.map(str::to_owned);
        inventory.public_ips[0].as_put = as_put;
        if !pip_left {
            inventory.public_ips.clear();
        }
        let mut tracker = Tracker::create(clb()).unwrap();
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(deleting), Observation::ListsComplete]);
        let mut public_ip_there = pip_left;
        let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
            Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
            Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp && public_ip_there => {
                public_ip_there = false;
                Outcome::Ok
            }
            Command::DeleteResource(_) => failed(404),
            other => answer_ok(&[])(other),
        });
        let deleted_pip = Command::DeleteResource(ResourceRef {
            kind: ResourceKind::PublicIp,
            name: config.public_ip.name.to_string(),
        });
        let pip_at = issued.iter().position(|c| *c == deleted_pip).expect("the public IP is deleted");
        let released = issued
            .iter()
            .position(|c| matches!(c, Command::SetFinalizer { present: false, .. }))
            .expect("the finalizer is released");
        assert!(pip_at < released, "pip left: {pip_left} ({address:?}, as put {as_put}): {issued:?}");
        assert!(!public_ip_there && last.idle);
        assert_eq!(tracker.phase(&identity), None, "the deletion is done");
    }
}

// Ports upstream TestFetchServiceGatewayServices_MatchesServiceTypeCaseInsensitively: NRP's
// service type is compared in any case, so a registration listed as `INBOUND` is ours and
// the restart adopts it with nothing to write, and one listed as `outbound` is an egress
// identity's. Its `InboundOutbound` and unknown-type cases differ (see below).
#[test]
fn an_nrp_service_type_in_any_case_is_an_inbound_registration() {
    let service = provisioned_service();
    let config = LbConfig::for_service(&service);
    let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
    let listed = NrpService {
        name: service.identity(),
        service_type: "INBOUND".into(),
        backend_pools: vec![],
        is_default: false,
    };
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![listed.clone()], locations: vec![] }),
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        other => answer_ok(&[])(other),
    });
    assert!(writes(&issued).is_empty(), "{issued:?}");
    assert!(last.idle && tracker.registered().contains(service.identity().as_str()));

    // Each type alone in NRP, no Kubernetes object for it. `outbound` in any case is an egress
    // identity's registration. Differs from upstream on purpose (which counts `InboundOutbound`
    // as both and fails start-up on an unknown type, lest it sweep what such a registration
    // uses): any other type is somebody else's, neither inbound nor egress, and nothing is ever
    // written about it, even under a UID-shaped name whose load balancer and public IP ARM
    // lists exactly as this controller makes them (which the sweep deletes for a name NRP
    // does not list).
    let uid_like = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e55";
    let foreign_inventory = {
        let service = Service { uid: uid_like.into(), ..provisioned_service() };
        inventory_of(&service, Some(LbConfig::for_service(&service).load_balancer.clone()))
    };
    for (service_type, name, inbound, outbound) in [
        ("inbound", UID, true, false),
        ("outbound", "egress-n", false, true),
        ("OutBound", "egress-n", false, true),
        ("InboundOutbound", uid_like, false, false),
        ("Sideways", uid_like, false, false),
    ] {
        let mut tracker = Tracker::create(clb()).unwrap();
        let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
        let listed = NrpService {
            name: name.into(),
            service_type: service_type.into(),
            backend_pools: vec![],
            is_default: false,
        };
        let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
            Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![listed.clone()], locations: vec![] }),
            Command::ReadArm if name == uid_like => Outcome::ArmInventory(foreign_inventory.clone()),
            Command::ReadArm => Outcome::ArmInventory(ArmInventory::default()),
            other => answer_ok(&[])(other),
        });
        assert_eq!(tracker.egress().is_registered(name), outbound, "{service_type}");
        if !inbound && !outbound {
            assert!(!tracker.registered().contains(name), "{service_type}");
            assert!(writes(&issued).is_empty(), "{service_type}: foreign, untouched: {issued:?}");
        } else if inbound {
            // Ours with no Service behind it: an orphan registration, unregistered.
            let unregisters = |c: &Command| matches!(c, Command::UpdateServices(r) if r.iter().any(|r| r.name == name && r.is_delete));
            assert!(issued.iter().any(unregisters), "{service_type}: {issued:?}");
        }
        assert!(last.idle, "{service_type}");
    }
    // The control: the same load balancer and public IP with nothing in NRP are an orphan's.
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: vec![], locations: vec![] }),
        Command::ReadArm => Outcome::ArmInventory(foreign_inventory.clone()),
        other => answer_ok(&[])(other),
    });
    let deleted = |kind: ResourceKind| {
        issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.kind == kind && r.name.starts_with(uid_like)))
    };
    assert!(deleted(ResourceKind::LoadBalancer) && deleted(ResourceKind::PublicIp), "{issued:?}");
}

// Ports upstream TestGuardOnServiceCreationComplete_UnknownServiceIsNoOp: an answer to a
// command the tracker did not send (or already had answered) changes nothing.
#[test]
fn an_answer_to_an_unknown_command_changes_nothing() {
    let mut tracker = created_with(&[(80, 8080)]);
    let before = tracker.export_state();
    for outcome in [Outcome::Ok, failed(500), Outcome::PublicIpAddress("20.0.0.9".into())] {
        let step = tracker.complete(NOW, vec![(u64::MAX / 2, outcome)]);
        assert!(step.commands.is_empty(), "{step:?}");
    }
    assert_eq!(tracker.export_state(), before);
}

#[test]
fn a_read_of_arm_that_keeps_failing_is_retried_then_start_up_goes_on_writing_as_before_with_a_warning() {
    let service = provisioned_service();
    let mut tracker = Tracker::create(clb()).unwrap();
    let mut step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).unwrap().id;
    step = tracker.complete(NOW, vec![(read, answer_ok(&[&service.identity()])(&Command::ReadNrp))]);
    let mut now = NOW;
    for attempt in 1..=timing::ARM_READ_ATTEMPTS {
        let arm = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("a read of ARM").id;
        step = tracker.complete(now, vec![(arm, failed(503))]);
        if attempt < timing::ARM_READ_ATTEMPTS {
            assert!(writes(&step.commands.iter().map(|c| c.command.clone()).collect::<Vec<_>>()).is_empty());
            now = step.wake_at_ms.expect("a retry is scheduled");
            step = tracker.tick(now);
        }
    }
    assert!(step.logs.iter().any(|l| l.level == LogLevel::Warn && l.message.contains("read-arm failed 3 time(s)")));
    let (issued, _, _) = drive(&mut tracker, now, step, answer_ok(&[&service.identity()]));
    assert!(issued.iter().any(|c| matches!(c, Command::PutPublicIp(_))), "{issued:?}");
    assert_eq!(tracker.phase(&service.identity()), Some(Phase::Created));
}

#[test]
fn a_state_imported_while_the_arm_inventory_is_read_keeps_the_read_in_flight_and_its_answer_applies() {
    let service = provisioned_service();
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service.clone()), Observation::ListsComplete]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[&service.identity()])(&Command::ReadNrp))]);
    assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), [&Command::ReadArm]);
    let (version, payload) = tracker.export_state();
    let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
    assert_eq!(imported, tracker);
    let config = LbConfig::for_service(&service);
    let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
    let (issued, _, _) = reads_answered(&mut imported, &step, &[&service.identity()], Outcome::ArmInventory(inventory));
    assert!(writes(&issued).is_empty(), "{issued:?}");
    for (mut tampered, expected) in [
        (tracker.clone(), "0 reads of ARM flagged in flight, but 1 reads of ARM are in flight"),
        (imported.clone(), "the ARM inventory is settled, but a read of it is in flight"),
    ] {
        tampered.startup.arm.read_in_flight = !tampered.startup.arm.read_in_flight;
        let (version, payload) = tampered.export_state();
        let why = corrupt(Tracker::import_state(clb(), version, &payload));
        assert!(why.contains(expected), "{why}");
    }
}

// ---- Write budgets ----

#[test]
fn endpoint_changes_made_while_the_address_location_budget_is_spent_wait_for_its_next_token_and_go_in_one_batch() {
    let (mut tracker, step) = with_address_budget(crate::budget::Budget { per_minute: 60, burst: 1 }, 4);
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    assert_eq!(programmed(&issued).len(), 1, "the first batch takes the only token: {issued:?}");
    let mut endpoints = vec![("10.244.0.1", "n1")];
    for (at, endpoint) in [(100, ("10.244.0.2", "n2")), (400, ("10.244.0.3", "n3")), (900, ("10.244.0.4", "n4"))] {
        endpoints.push(endpoint);
        let step = tracker.observe(NOW + at, vec![Observation::SliceUpserted(slice_on(&endpoints))]);
        assert!(batch_locations(&step).is_empty(), "at +{at} ms the budget is spent: {step:?}");
        assert_eq!(step.wake_at_ms, Some(NOW + 1_000), "woken when the next token is due");
    }
    assert!(batch_locations(&tracker.tick(NOW + 999)).is_empty());
    let step = tracker.tick(NOW + 1_000);
    let batches = batch_locations(&step);
    assert_eq!(batches.len(), 1, "{step:?}");
    assert_eq!(batches[0].1, ["10.224.0.2", "10.224.0.3", "10.224.0.4"], "every change since the last batch");
}

#[test]
fn load_balancer_and_public_ip_writes_keep_to_the_arm_budget_and_every_service_is_provisioned() {
    let two_then_one_a_second = crate::budget::Budget { per_minute: 60, burst: 2 };
    let mut tracker = Tracker::create_with_arm_settled(budgeted(|b| b.arm_writes = two_then_one_a_second)).unwrap();
    let services: Vec<Service> = (1..=3)
        .map(|i| Service {
            uid: format!("0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e0{i}"),
            name: format!("web-{i}"),
            ..lb_service("Local")
        })
        .collect();
    let mut observations: Vec<Observation> = services.iter().cloned().map(Observation::ServiceUpserted).collect();
    observations.push(Observation::ListsComplete);
    let registered: Vec<String> = services.iter().map(|s| s.identity()).collect();
    let registered: Vec<&str> = registered.iter().map(String::as_str).collect();
    let answer = answer_ok(&registered);
    let (mut now, mut step) = (NOW, tracker.observe(NOW, observations));
    let mut arm_writes_at = Vec::new();
    for _ in 0..20 {
        let (issued, _, last) = drive(&mut tracker, now, step, &answer);
        let arm = issued.iter().filter(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_)));
        arm_writes_at.extend(arm.map(|_| now - NOW));
        if services.iter().all(|s| tracker.phase(&s.identity()) == Some(Phase::Created)) {
            break;
        }
        now = last.wake_at_ms.expect("woken for the next token");
        step = tracker.tick(now);
    }
    assert_eq!(arm_writes_at, [0, 0, 1_000, 2_000, 3_000, 4_000], "a burst of 2, then one a second");
    assert!(services.iter().all(|s| tracker.phase(&s.identity()) == Some(Phase::Created)));
}

#[test]
fn a_throttled_address_location_batch_halves_its_budget_instead_of_backing_off_and_accepted_ones_restore_it() {
    let (mut tracker, step) = with_address_budget(crate::budget::Budget { per_minute: 600, burst: 1 }, 1);
    let held = drive_holding_batches(&mut tracker, NOW, step);
    let step = tracker.complete(NOW, vec![(held[0].0, failed(429))]);
    let warned = step.logs.iter().find(|l| l.level == LogLevel::Warn).expect("a warning");
    assert!(warned.message.contains("update-address-locations was throttled (HTTP 429)"), "{}", warned.message);
    assert!(warned.message.contains("shrinks to 300 a minute"), "{}", warned.message);
    assert_eq!(step.wake_at_ms, Some(NOW + 200), "the next token at half the rate, no backoff of a second");
    assert!(batch_locations(&tracker.tick(NOW + 199)).is_empty());
    let step = tracker.tick(NOW + 200);
    let again = batch_locations(&step);
    assert_eq!(again.len(), 1, "{step:?}");
    // The shrunk budget is state: a swap keeps the pace Azure asked for.
    let (version, payload) = tracker.export_state();
    let imported = Tracker::import_state(tracker.config.clone(), version, &payload).unwrap();
    assert_eq!(imported.budgets.buckets, tracker.budgets.buckets);
    tracker.complete(NOW + 200, vec![(again[0].0, Outcome::Ok)]);
    assert_eq!(tracker.budgets.buckets.address_locations.per_minute(), 375, "an eighth of the rate back");
}

#[test]
fn a_version_4_state_imports_with_full_write_budgets() {
    let (mut tracker, _) = tracker_with_a_batch_in_flight();
    let imported = Tracker::import_state(clb(), 4, &tracker.export_state_as(4)).unwrap();
    assert_ne!(tracker.budgets.buckets, Buckets::full(&clb().write_budgets()), "the batch took a token");
    tracker.budgets.buckets = Buckets::full(&clb().write_budgets());
    tracker.figures = Default::default();
    assert_eq!(imported, tracker);
}
