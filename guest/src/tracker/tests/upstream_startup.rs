//! Ports of upstream engine tests about deletion checks, finalizers, start-up recovery, status patches
//! and the per-tick dispatch. Each test names the upstream test it ports in the comment directly above it
//! (`docs/conformance.md` is generated from those).

use super::*;

/// The reasons of the Events among `issued`, in order.
fn reasons(issued: &[Command]) -> Vec<&str> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::EmitEvent(e) => Some(e.reason.as_str()),
            _ => None,
        })
        .collect()
}

/// The status patches among `issued`, by the ingress IPs they write.
fn status_patches(issued: &[Command]) -> Vec<&Vec<String>> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::PatchServiceStatus { ingress_ips, .. } => Some(ingress_ips),
            _ => None,
        })
        .collect()
}

/// `identity`'s request among those `command` sends to NRP, if it is an `UpdateServices`.
fn request_for<'c>(command: &'c Command, identity: &str) -> Option<&'c NrpServiceRequest> {
    match command {
        Command::UpdateServices(requests) => requests.iter().find(|r| r.name == identity),
        _ => None,
    }
}

/// Whether `command` writes `identity`'s NRP registration (`Some(is_delete)`: an unregistration or not).
fn writes_registration(command: &Command, identity: &str, is_delete: Option<bool>) -> bool {
    request_for(command, identity).is_some_and(|r| is_delete.is_none_or(|d| r.is_delete == d))
}

fn deletes(kind: ResourceKind, name: &str) -> Command {
    Command::DeleteResource(ResourceRef { kind, name: name.to_owned() })
}

fn commands(step: &Step) -> Vec<Command> {
    step.commands.iter().map(|c| c.command.clone()).collect()
}

// Upstream TestUpdateServiceLoadBalancerStatus_ReplacesStaleSameFamily: a stale IPv4 entry already in the status
// (alone, or beside the allocated one and another family's) is replaced by exactly the allocated public IP.
#[test]
fn a_stale_ingress_ip_of_the_same_family_is_replaced_by_the_allocated_public_ip() {
    for stale in [vec!["10.0.0.9".to_owned()], vec!["10.0.0.9".into(), "2603:1030::9".into(), "20.0.0.1".into()]] {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let service = Service { ingress_ips: stale.clone(), ..lb_service("Local") };
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
        assert_eq!(status_patches(&issued), [&vec!["20.0.0.1".to_owned()]], "{stale:?}: {issued:?}");
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }
}

// Upstream TestCheckPendingServiceDeletions_NoLocations: a deleting Service NRP holds no address of skips the
// drain: in the step that sees the deletion it is DeletionInProgress and its first delete step (the unlink) is
// sent, with no address-location update.
#[test]
fn a_deleting_service_nrp_holds_no_address_of_starts_its_delete_steps_at_once() {
    let mut tracker = created_local();
    let deleting = terminating(lb_service("Local"));
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(deleting)]);
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress));
    assert!(!tracker.inbound.work.draining.contains(UID));
    let sent = commands(&step);
    let unlink = |c: &Command| request_for(c, UID).is_some_and(|r| r.backend_pools.is_empty() && !r.is_delete);
    assert!(sent.iter().any(unlink), "{sent:?}");
    assert!(!sent.iter().any(is_location_update), "{sent:?}");
}

// Upstream TestCheckPendingServiceDeletions_WithLocations: while NRP still holds the Service's address (its drain
// fails), the deletion stays DeletionPending and no delete step runs (no unlink, unregistration or resource
// delete); once the drain lands, the delete steps follow it.
#[test]
fn a_deletion_whose_drain_fails_stays_pending_and_runs_no_delete_step_until_the_drain_lands() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    let ok = answer_ok(&[UID]);
    let mut drains = 0;
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, |c| {
        if is_location_update(c) {
            drains += 1;
            return failed(500);
        }
        ok(c)
    });
    assert_eq!(drains, 1, "{issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending));
    assert!(tracker.inbound.work.draining.contains(UID));
    let delete_step = |c: &&Command| matches!(c, Command::UpdateServices(_) | Command::DeleteResource(_));
    assert_eq!(issued.iter().filter(delete_step).count(), 0, "{issued:?}");
    assert!(tracker.registered().contains(UID));
    let wake = last.wake_at_ms.expect("the drain is retried");
    let step = tracker.tick(wake);
    let (issued, _, last) = drive(&mut tracker, wake, step, &ok);
    let drained = issued.iter().position(is_location_update).expect("drained again");
    let unlinked = issued.iter().position(|c| writes_registration(c, UID, Some(false))).expect("then unlinked");
    assert!(drained < unlinked, "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestCheckPendingServiceDeletions_MultipleServices: deletions are gated one by one: a Service NRP holds
// no address of is deleted and released, and an egress identity whose last pod goes in the same batch has its
// address drained and its NAT gateway and public IP deleted, while another Service's drain keeps being refused,
// and that one stays pending with its registration untouched.
#[test]
fn a_drained_deletion_proceeds_while_another_one_is_still_held_by_its_address_in_nrp() {
    use super::upstream_outbound::{IDENTITY, gone as pod_gone, pod};
    let other = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e02";
    let a = Service { uid: other.into(), name: "api".into(), ..lb_service("Local") };
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![
            Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] }),
            Observation::ServiceUpserted(a.clone()),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::PodUpserted(pod("p", "10.244.2.10")),
            Observation::ListsComplete,
        ],
    );
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!((tracker.phase(other), tracker.phase(UID)), (Some(Phase::Created), Some(Phase::Created)));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    let gone = terminating;
    let step = tracker.observe(
        NOW + 1,
        vec![
            Observation::ServiceUpserted(gone(a)),
            Observation::ServiceUpserted(gone(lb_service("Local"))),
            pod_gone("p"),
        ],
    );
    let ok = answer_ok(&[]);
    // NRP refuses every batch holding B's location (10.224.0.4): it is isolated and set aside.
    let holds_b =
        |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.location == "10.224.0.4"));
    let (issued, _, _) = drive(&mut tracker, NOW + 1, step, |c| if holds_b(c) { refused_for_good() } else { ok(c) });
    assert!(issued.iter().any(holds_b), "B's drain was tried: {issued:?}");
    let drained = |c: &Command| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(|l| l.location == super::upstream_outbound::HOST));
    let drained_at = issued.iter().position(|c| drained(c) && !holds_b(c)).expect("the identity's address drained");
    let nat_at =
        issued.iter().position(|c| *c == deletes(ResourceKind::NatGateway, IDENTITY)).expect("NAT gateway deleted");
    let pip_at =
        issued.iter().position(|c| *c == deletes(ResourceKind::PublicIp, &format!("{IDENTITY}-pip"))).expect("its IP");
    assert!(drained_at < nat_at && nat_at < pip_at, "{issued:?}");
    assert!(!tracker.outbound().lifecycles.contains_key(IDENTITY), "the identity's teardown is done");
    assert!(issued.iter().any(|c| writes_registration(c, other, Some(true))), "A unregistered: {issued:?}");
    let released = |c: &Command| match c {
        Command::SetFinalizer { service, present, .. } => !present && service.uid.as_str() == other,
        _ => false,
    };
    assert!(issued.iter().any(released), "A released: {issued:?}");
    assert_eq!(tracker.phase(other), None);
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionPending));
    assert!(!issued.iter().any(|c| writes_registration(c, UID, None)), "B untouched: {issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.name.starts_with(UID))));
    assert!(tracker.registered().contains(UID));
}

// Upstream TestHasServiceGatewayFinalizer: our finalizer among others counts as held (nothing added); only
// someone else's, or none, is not (ours is added).
#[test]
fn our_finalizer_is_added_unless_the_service_holds_it_alone_or_among_others() {
    let cases: [(Vec<String>, bool); 4] = [
        (vec!["other-finalizer".into(), FINALIZER.into()], false),
        (vec![FINALIZER.into()], false),
        (vec!["other-finalizer".into()], true),
        (vec![], true),
    ];
    for (finalizers, adds) in cases {
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let service = Service { finalizers: finalizers.clone(), ..lb_service("Local") };
        let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
        let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
        let added = issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: true, .. }));
        assert_eq!(added, adds, "{finalizers:?}: {issued:?}");
        assert!(!issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. })), "{finalizers:?}");
        assert_eq!(tracker.phase(UID), Some(Phase::Created), "{finalizers:?}");
    }
}

// Upstream TestRecoverStuckFinalizers_KeepsFinalizerWhenAzureResourceExists: the crash window, a Service found
// deleting at start-up whose load balancer ARM lists though NRP never registered it, keeps its finalizer until
// that load balancer (and its public IP) is deleted.
#[test]
fn a_service_found_deleting_with_its_load_balancer_in_arm_but_not_in_nrp_keeps_its_finalizer_until_it_is_deleted() {
    let deleting = Service { deleting: true, ..provisioned_service() };
    let config = LbConfig::for_service(&deleting);
    let inventory = inventory_of(&deleting, Some(config.load_balancer.clone()));
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(deleting), Observation::ListsComplete]);
    let (mut load_balancer_there, mut public_ip_there) = (true, true);
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer && load_balancer_there => {
            load_balancer_there = false;
            Outcome::Ok
        }
        Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp && public_ip_there => {
            public_ip_there = false;
            Outcome::Ok
        }
        Command::DeleteResource(_) => failed(404),
        other => answer_ok(&[])(other),
    });
    let position = |wanted: Command| issued.iter().position(|c| *c == wanted);
    let lb_at = position(deletes(ResourceKind::LoadBalancer, UID)).expect("the load balancer is deleted");
    let pip_at = position(deletes(ResourceKind::PublicIp, config.public_ip.name.as_str())).expect("and its IP");
    let released = issued
        .iter()
        .position(|c| matches!(c, Command::SetFinalizer { present: false, .. }))
        .expect("the finalizer is released");
    assert!(lb_at < released && pip_at < released, "{issued:?}");
    assert!(!load_balancer_there && !public_ip_there && last.idle);
    assert!(!issued.iter().any(|c| matches!(c, Command::PutLoadBalancer(_) | Command::PutPublicIp(_))));
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestProcessK8sServices_ForeignServiceBecomesRemoval: a provisioned Service whose
// spec.loadBalancerClass now names another controller has its load balancer, public IP and registration
// relinquished and is never provisioned again: at run time, and when a restart finds it so.
#[test]
fn a_service_handed_to_another_load_balancer_class_is_relinquished_and_never_provisioned_again() {
    let foreign = |s: Service| Service { load_balancer_class: Some("example.com/other-controller".into()), ..s };
    let relinquished = |issued: &[Command], case: &str| {
        for wanted in [deletes(ResourceKind::LoadBalancer, UID), deletes(ResourceKind::PublicIp, &format!("{UID}-pip"))]
        {
            assert!(issued.contains(&wanted), "{case}: {wanted:?} in {issued:?}");
        }
        assert!(issued.iter().any(|c| writes_registration(c, UID, Some(true))), "{case}: {issued:?}");
        assert!(issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. })), "{case}");
        assert!(!issued.iter().any(|c| matches!(c, Command::PutLoadBalancer(_) | Command::PutPublicIp(_))), "{case}");
    };

    let mut tracker = created_with(&[(80, 8080)]);
    let handed = foreign(Service { finalizers: vec![FINALIZER.into()], ..ported(UID, &[(TCP, 80, to(8080))], &[]) });
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(handed.clone())]);
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    relinquished(&issued, "at run time");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
    // The API server's copy once the finalizer is released: a finalizer still listed is cleaned up again.
    let released = Service { finalizers: vec![], ..handed };
    let again = tracker.observe(NOW + 2, vec![Observation::ServiceUpserted(released)]);
    assert!(again.commands.is_empty(), "{again:?}");
    assert_eq!(tracker.phase(UID), None);

    let service = foreign(provisioned_service());
    let config = LbConfig::for_service(&service);
    let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
    let (issued, _, last) = reads_answered(&mut tracker, &step, &[UID], Outcome::ArmInventory(inventory));
    relinquished(&issued, "after a restart");
    assert_eq!(status_patches(&issued), [&Vec::<String>::new()], "its address leaves the status: {issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestRecoverServiceExternalIPs_RetriesTransientPatchFailure: after a restart, a registered Service whose
// status lost its ingress gets its public IP's address back, from the ARM inventory with nothing else written,
// and a failed patch is retried.
#[test]
fn a_restart_puts_back_a_lost_ingress_ip_and_retries_a_failed_patch() {
    let service = Service { ingress_ips: vec![], ..provisioned_service() };
    let config = LbConfig::for_service(&service);
    let inventory = inventory_of(&service, Some(config.load_balancer.clone()));
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
    let nrp = answer_ok(&[UID]);
    let mut patches = 0;
    let mut answer = |c: &Command| match c {
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        Command::PatchServiceStatus { .. } => {
            patches += 1;
            if patches == 1 { failed(503) } else { Outcome::Ok }
        }
        other => nrp(other),
    };
    let (mut issued, _, last) = drive(&mut tracker, NOW, step, &mut answer);
    assert_ne!(tracker.phase(UID), Some(Phase::Created), "not done while the patch failed");
    let wake = last.wake_at_ms.expect("the patch is retried");
    let step = tracker.tick(wake);
    let (more, _, last) = drive(&mut tracker, wake, step, &mut answer);
    issued.extend(more);
    assert_eq!(status_patches(&issued), [&vec![ADDRESS.to_owned()], &vec![ADDRESS.to_owned()]], "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_))));
    assert!(!issued.iter().any(|c| matches!(c, Command::UpdateServices(_) | Command::DeleteResource(_))));
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

/// The ARM inventory of one Service deleted while no controller ran (`gone`): its load balancer and public IP.
fn orphaned(gone: &str) -> ArmInventory {
    ArmInventory {
        nat_gateways: Vec::new(),
        public_ips: vec![ListedPublicIp {
            name: format!("{gone}-pip"),
            version: IpVersion::Ipv4,
            address: Some("20.0.0.9".into()),
            as_put: true,
        }],
        load_balancers: vec![ListedLoadBalancer {
            name: gone.into(),
            shape: Some(LoadBalancer {
                name: gone.into(),
                public_ip: format!("{gone}-pip").into(),
                backend_pool: gone.into(),
                rules: vec![],
            }),
        }],
    }
}

// Upstream TestGuardDefaultNATGatewayIsNeverScheduledForOrphanDeletion: NRP's default outbound service (and an
// address NRP maps to it) is never written or deleted by the start-up sweep, which still deletes a genuine
// orphan. (Upstream's control, a genuine orphan NAT gateway collected, waits for the NAT gateway lifecycle.)
#[test]
fn the_start_up_sweep_never_touches_nrps_default_outbound_service_and_still_deletes_a_genuine_orphan() {
    let gone = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e99";
    let default = NrpService {
        name: "default-natgw".into(),
        service_type: "Outbound".into(),
        backend_pools: vec![],
        is_default: true,
    };
    let location = NrpListedLocation {
        location: "10.224.0.4".into(),
        addresses: vec![NrpAddress { address: "10.244.0.5".into(), services: vec!["default-natgw".into()] }],
    };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let inventory = orphaned(gone);
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadNrp => {
            Outcome::NrpSnapshot(NrpState { services: vec![default.clone()], locations: vec![location.clone()] })
        }
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        _ => Outcome::Ok,
    });
    assert!(!issued.iter().any(|c| format!("{c:?}").contains("default-natgw")), "{issued:?}");
    assert!(!issued.iter().any(is_location_update), "its address stays: {issued:?}");
    assert!(issued.contains(&deletes(ResourceKind::LoadBalancer, gone)), "{issued:?}");
    assert!(issued.contains(&deletes(ResourceKind::PublicIp, &format!("{gone}-pip"))), "{issued:?}");
    assert!(last.idle);
}

// Upstream TestGuardOrphanCleanupSkipsResourcesStillDesiredInKubernetes: the crash-mid-create shape, a Service
// Kubernetes still wants whose load balancer and public IP ARM lists but NRP never registered, is adopted and
// registered, never swept, while a genuine orphan beside it is deleted. (The egress half waits for the NAT
// gateway lifecycle.)
#[test]
fn a_wanted_service_left_unregistered_by_a_crash_is_registered_not_swept_beside_a_genuine_orphan() {
    let gone = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e99";
    let service = provisioned_service();
    let config = LbConfig::for_service(&service);
    let mut inventory = orphaned(gone);
    let wanted = inventory_of(&service, Some(config.load_balancer.clone()));
    inventory.public_ips.extend(wanted.public_ips);
    inventory.load_balancers.extend(wanted.load_balancers);
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
    let (issued, _, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(inventory));
    let names_it = |c: &Command| matches!(c, Command::DeleteResource(r) if r.name.starts_with(UID));
    assert!(!issued.iter().any(names_it), "{issued:?}");
    let registers = |c: &Command| request_for(c, UID).is_some_and(|r| !r.is_delete && !r.backend_pools.is_empty());
    assert!(issued.iter().any(registers), "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_))), "adopted");
    assert!(issued.contains(&deletes(ResourceKind::LoadBalancer, gone)), "{issued:?}");
    assert!(issued.contains(&deletes(ResourceKind::PublicIp, &format!("{gone}-pip"))), "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert!(tracker.registered().contains(UID));
}

// Upstream TestDeleteInboundServiceLastErrMonotonic: a failed load-balancer delete stops the deletion there: no
// later step (public IP delete, finalizer release) runs and it is not reported done; once the retried delete
// succeeds, the rest follows in order.
#[test]
fn a_failed_load_balancer_delete_stops_the_deletion_there_until_its_retry_succeeds() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    let ok = answer_ok(&[UID]);
    let mut refused = 0;
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, |c| match c {
        Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer => {
            refused += 1;
            failed(500)
        }
        other => ok(other),
    });
    assert_eq!(refused, 1, "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp)));
    assert!(!issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. })), "{issued:?}");
    assert!(!reasons(&issued).contains(&reason::DELETED_LOAD_BALANCER), "{issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress));
    let wake = last.wake_at_ms.expect("the delete is retried");
    let step = tracker.tick(wake);
    let (issued, _, last) = drive(&mut tracker, wake, step, &ok);
    let position = |wanted: &dyn Fn(&Command) -> bool| issued.iter().position(wanted);
    let lb = position(&|c| *c == deletes(ResourceKind::LoadBalancer, UID)).expect("retried");
    let pip = position(&|c| *c == deletes(ResourceKind::PublicIp, &format!("{UID}-pip"))).expect("then the IP");
    let released = position(&|c| matches!(c, Command::SetFinalizer { present: false, .. })).expect("released");
    assert!(lb < pip && pip < released, "{issued:?}");
    assert_eq!(reasons(&issued), [reason::DELETED_LOAD_BALANCER]);
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestRemoveServiceGatewayFinalizer, its stale-UID case: the release of a deleted Service's
// finalizer that the host's UID guard refuses (409 UIDMismatch: the name holds a new Service now) is
// done, as a 404 is: the old Service's deletion ends and nothing is retried for it.
#[test]
fn a_finalizer_release_refused_because_the_name_holds_another_service_now_ends_the_deletion() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    let ok = answer_ok(&[UID]);
    let mut releases = 0;
    let (_, _, last) = drive(&mut tracker, NOW + 1, step, |c| match c {
        Command::SetFinalizer { present: false, .. } => {
            releases += 1;
            Outcome::Failed(Failure {
                status: 409,
                code: Some(crate::model::UID_MISMATCH.into()),
                retry_after_ms: None,
                message: "the name holds another object".into(),
            })
        }
        other => ok(other),
    });
    assert_eq!(releases, 1);
    assert_eq!(tracker.phase(UID), None, "the deletion ended");
    assert!(last.idle, "{last:?}");
    let later = tracker.tick(NOW + 60_000);
    assert!(!later.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "no retry: {later:?}");
}

// Upstream TestAddServiceGatewayFinalizer, its "repairs live finalizers" case: a served Service read
// again without our finalizer (somebody stripped it) gets it back, with nothing else written; one
// read with it writes nothing. Without it a deletion would not wait for the Azure resources to go.
#[test]
fn a_served_service_read_without_its_finalizer_gets_it_back_and_nothing_else() {
    let mut tracker = created_with(&[(80, 8080)]);
    let served = Service {
        finalizers: vec![FINALIZER.into()],
        ingress_ips: vec!["20.0.0.1".into()],
        ..ported(UID, &[(TCP, 80, to(8080))], &[])
    };
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(served.clone())]);
    assert!(step.commands.is_empty(), "as served: {:?}", step.commands);
    let stripped = Service { finalizers: vec!["other".into()], ..served };
    let step = tracker.observe(NOW + 2, vec![Observation::ServiceUpserted(stripped)]);
    let (issued, _, last) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
    let added =
        |c: &Command| matches!(c, Command::SetFinalizer { present: true, service, .. } if service.uid.as_str() == UID);
    assert_eq!(issued.len(), 1, "{issued:?}");
    assert!(added(&issued[0]), "{issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert!(last.idle);
}

// Upstream TestReconcileInboundService and TestDeleteInboundService, their "missing service identity"
// cases: a Service with no UID, live or being deleted, is ignored with a warning; nothing is
// written, since a UID is what its Azure resources are named by.
#[test]
fn a_service_without_a_uid_is_ignored_with_a_warning_and_nothing_is_written() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    for service in [ported("", &[(TCP, 80, to(8080))], &[]), terminating(ported(" ", &[(TCP, 80, to(8080))], &[]))] {
        let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(service)]);
        assert!(step.commands.is_empty(), "{:?}", step.commands);
        assert!(
            step.logs.iter().any(|l| l.level == LogLevel::Warn && l.message.contains("has no UID")),
            "{:?}",
            step.logs
        );
        assert!(tracker.inbound.lifecycles.is_empty());
    }
}

// Upstream TestGuardAddService_EmptyUIDIsNoOp, TestGuardDeleteService_EmptyUIDIsNoOp and
// TestGuardUpdateEndpoints_EmptyUIDIsNoOp: a Service without a UID, live or being deleted, and an
// EndpointSlice whose owner has none (an empty UID, or no owner at all) are tracked nowhere: no
// lifecycle (upstream's pendingServiceOps), no deletion or drain pending (its
// pendingServiceDeletions), nothing for NRP (its pendingEndpoints), nothing runnable and nothing
// sent (no trigger); the Service is warned about. The control: a Service with a UID, seen after
// them, gets its own slice's endpoint into NRP, and the unowned slices' endpoint stays out.
#[test]
fn a_service_or_an_endpoint_slice_without_a_uid_is_tracked_nowhere_and_wakes_nothing() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let step = tracker.observe(NOW, vec![node, Observation::ListsComplete]);
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert!(tracker.is_quiet());

    let unowned = |name: &str, owner: Option<String>| EndpointSlice {
        name: name.into(),
        owner_service_uid: owner,
        ..slice_on(&[("10.244.0.9", "n1")])
    };
    let live = ported("", &[(TCP, 80, to(8080))], &[]);
    let cases = [
        ("a live Service", Observation::ServiceUpserted(live.clone()), true),
        ("a slice owned by an empty UID", Observation::SliceUpserted(unowned("orphan-1", Some(String::new()))), false),
        ("a slice with no owner", Observation::SliceUpserted(unowned("orphan-2", None)), false),
        ("the Service deleting", Observation::ServiceUpserted(terminating(live.clone())), true),
        ("the Service gone", Observation::ServiceDeleted(live.key()), false),
    ];
    for ((case, observation, warned), now) in cases.into_iter().zip(NOW + 1..) {
        let step = tracker.observe(now, vec![observation]);
        assert!(step.commands.is_empty(), "{case}: {:?}", step.commands);
        assert!(step.idle, "{case}: {step:?}");
        let warning = step.logs.iter().any(|l| l.level == LogLevel::Warn && l.message.contains("has no UID"));
        assert_eq!(warning, warned, "{case}: {:?}", step.logs);
        assert!(tracker.inbound.lifecycles.is_empty(), "{case}");
        assert_eq!(tracker.verdict("default", "web"), None, "{case}");
        assert!(tracker.inbound.work.runnable.is_empty() && tracker.inbound.work.draining.is_empty(), "{case}");
        assert!(tracker.desired_view().values().all(|addresses| addresses.is_empty()), "{case}");
        assert!(tracker.is_quiet(), "{case}");
    }

    let step = tracker.observe(
        NOW + 10,
        vec![
            Observation::ServiceUpserted(ported(UID, &[(TCP, 80, to(8080))], &[])),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
        ],
    );
    let (issued, _, last) = drive(&mut tracker, NOW + 10, step, answer_ok(&[]));
    assert!(issued.iter().any(is_location_update), "{issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    let programmed = &tracker.nrp_view()["10.224.0.4"];
    assert_eq!(programmed.keys().collect::<Vec<_>>(), ["10.244.0.5"], "{programmed:?}");
    assert!(last.idle);
}

// Upstream TestIsServiceOverlayMappingsError, its negative cases: only a 400 carrying the code
// ServiceWithOverlayMappingsCannotBeDeleted sends a deletion back to draining. An unregistration
// refused with another code, by a 409 carrying a similar message, answered 404 or 500 reads NRP
// no second time and drains nothing again, and the Service is unregistered in the end.
#[test]
fn only_the_overlay_mappings_code_sends_a_refused_unregistration_back_to_draining() {
    let cases = [
        (400, Some("InvalidRequestFormat"), "bad request"),
        (409, Some("Conflict"), "ServiceWithOverlayMappingsCannotBeDeleted in the message only"),
        (404, Some("NotFound"), "not found"),
        (500, None, "HTTP 500"),
    ];
    for (status, code, message) in cases {
        let mut tracker = created_with(&[(80, 8080)]);
        let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
        let ok = answer_ok(&[UID]);
        let mut refused = false;
        let (issued, _, _) = drive(&mut tracker, NOW + 1, step, |c| {
            if writes_registration(c, UID, Some(true)) && !refused {
                refused = true;
                return Outcome::Failed(Failure {
                    status,
                    code: code.map(Into::into),
                    retry_after_ms: None,
                    message: message.into(),
                });
            }
            ok(c)
        });
        assert!(refused, "{status}: unregistered once");
        assert!(!tracker.inbound.work.draining.contains(UID), "{status} {code:?}: not sent back to draining");
        let at = issued.iter().position(|c| writes_registration(c, UID, Some(true))).unwrap();
        let after = &issued[at + 1..];
        assert!(!after.iter().any(|c| *c == Command::ReadNrp || is_location_update(c)), "{status} {code:?}: {after:?}");
        let mut now = NOW + 1;
        while tracker.phase(UID).is_some() && now < NOW + 600_000 {
            now += 1_000;
            let step = tracker.tick(now);
            let (issued, _, _) = drive(&mut tracker, now, step, &ok);
            assert!(!issued.iter().any(|c| *c == Command::ReadNrp || is_location_update(c)), "{status}: {issued:?}");
        }
        assert_eq!(tracker.phase(UID), None, "{status} {code:?}: unregistered in the end");
    }
}

// Upstream TestOnServiceCreationComplete_NonOverlayDeleteErrorRetriesNormally: an unregistration that fails for
// another reason than overlay mappings stays DeletionInProgress and is retried directly: no read of NRP, no
// drain again; the retry sends the same unregistration.
#[test]
fn an_unregistration_failing_for_another_reason_is_retried_directly_without_draining_again() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    let ok = answer_ok(&[UID]);
    let mut failed_at = None;
    let mut seen = 0;
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, |c| {
        seen += 1;
        if writes_registration(c, UID, Some(true)) && failed_at.is_none() {
            failed_at = Some(seen);
            return failed(500);
        }
        ok(c)
    });
    let failed_at = failed_at.expect("unregistered once");
    let unregistration = issued[failed_at - 1].clone();
    let after = &issued[failed_at..];
    assert!(after.iter().all(|c| matches!(c, Command::EmitEvent(_))), "nothing but its Warning: {after:?}");
    assert_eq!(reasons(after), [reason::SYNC_LOAD_BALANCER_FAILED]);
    assert_eq!(tracker.phase(UID), Some(Phase::DeletionInProgress));
    assert!(!tracker.inbound.work.draining.contains(UID));
    assert!(last.wake_at_ms.is_some_and(|at| at <= NOW + 1 + 2_000), "{last:?}");
    let retry = tracker.tick(NOW + 2_000);
    let sent = commands(&retry);
    assert_eq!(sent, [unregistration], "the same unregistration, and only it");
    let (issued, _, last) = drive(&mut tracker, NOW + 2_000, retry, &ok);
    assert!(!issued.iter().any(|c| *c == Command::ReadNrp || is_location_update(c)), "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Upstream TestServiceUpdaterProcessBatchFlow: a tick dispatches nothing for a Service whose command is in flight
// (creation, update, drain, delete step), nor for a created or a parked one, and leaves each in its phase; a
// Service not started is dispatched (its first step) once the lists are complete and NRP is read.
#[test]
fn a_tick_dispatches_only_a_service_with_a_step_due_and_leaves_every_other_phase_as_it_is() {
    for phase in PHASES {
        let (mut tracker, _held) = in_phase(phase);
        let step = tracker.tick(NOW + 1);
        let sent: Vec<&Command> =
            step.commands.iter().map(|c| &c.command).filter(|c| !matches!(c, Command::ReadNrp)).collect();
        assert!(sent.is_empty(), "{phase:?}: nothing dispatched again: {sent:?}");
        assert_eq!(tracker.phase(UID), Some(phase), "{phase:?}");
    }

    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    assert_eq!(tracker.phase(UID), Some(Phase::NotStarted));
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
    assert_eq!(finalizer_change(&step).map(|(_, present)| present), Some(true), "dispatched: {step:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress));

    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    let (issued, _, _) =
        drive(&mut tracker, NOW, step, |c| if is_put_load_balancer(c) { refused_for_good() } else { ok(c) });
    assert!(warned_rejected(&issued), "parked: {issued:?}");
    let later = NOW + 3_600_000;
    let step = tracker.tick(later);
    let (issued, _, last) = drive(&mut tracker, later, step, &ok);
    assert!(!issued.iter().any(|c| matches!(c, Command::PutLoadBalancer(_) | Command::PutPublicIp(_))), "{issued:?}");
    assert!(last.idle);
    assert!(tracker.inbound.lifecycles[UID].parked);
}

// Upstream TestCreateInboundService_StatusUpdateFailureRetriesInsteadOfFalseSuccess: a failed status patch is not
// success (no EnsuredLoadBalancer, not Created, one Warning); only the patch is retried, and its success ends
// the creation. Upstream TestCreateInboundService_StatusPatchFailureKeepsLoadBalancerLive: meanwhile the
// Service stays registered and its endpoints reach NRP.
#[test]
fn a_failed_status_patch_is_retried_alone_and_the_service_is_not_reported_ensured_until_it_lands() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![
            Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] }),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let ok = answer_ok(&[]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, |c| match c {
        Command::PatchServiceStatus { .. } => failed(500),
        other => ok(other),
    });
    assert_eq!(tracker.phase(UID), Some(Phase::CreationInProgress));
    assert_eq!(reasons(&issued), [reason::SYNC_LOAD_BALANCER_FAILED], "{issued:?}");
    assert!(tracker.registered().contains(UID));
    assert!(!issued.iter().any(|c| writes_registration(c, UID, Some(true)) || matches!(c, Command::DeleteResource(_))));
    assert_eq!(programmed(&issued), [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned()])]);
    let retry = tracker.tick(NOW + 2_000);
    let sent = commands(&retry);
    assert_eq!(status_patches(&sent), [&vec!["20.0.0.1".to_owned()]], "{sent:?}");
    let writes_azure =
        |c: &Command| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_) | Command::UpdateServices(_));
    assert!(!sent.iter().any(writes_azure), "{sent:?}");
    let (issued, _, last) = drive(&mut tracker, NOW + 2_000, retry, &ok);
    assert_eq!(reasons(&issued), [reason::ENSURED_LOAD_BALANCER], "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestOutboundIPFamiliesLocked_FollowsClusterAddressFamilies,
// TestSeedClusterAddressFamilies_OnlyIPv6NodeAddressesCount,
// TestInitializeFromCluster_SeedsClusterAddressFamiliesFromNodes and
// TestReconcileServices_OutboundAdditionsCarryClusterIPFamilies: an egress identity gets an IPv6
// public IP (`<id>-pip-v6`, on its NAT gateway's IPv6 list) exactly when a Node of the cluster has
// an IPv6 InternalIP: a dual-stack node, alone or in a mixed pool, yes; IPv4-only nodes, no Nodes,
// an IPv4-mapped or a malformed InternalIP, no. The identity created at start-up (its pod listed
// before the Nodes, all in the initial lists) decides as the one created at run time does.
#[test]
fn an_egress_identity_gets_an_ipv6_public_ip_exactly_when_a_node_has_an_ipv6_internal_ip() {
    use super::upstream_outbound::{IDENTITY, pod, started};
    let node = |name: &str, ips: &[&str]| {
        Observation::NodeUpserted(Node {
            name: name.into(),
            internal_ips: ips.iter().map(|ip| ip.to_string()).collect(),
        })
    };
    let cases: [(&str, Vec<Observation>, bool); 6] = [
        ("dual-stack", vec![node("dual", &["10.0.0.1", "fd00::1"])], true),
        ("IPv4 only", vec![node("v4", &["10.0.0.1"])], false),
        ("mixed pool", vec![node("v4", &["10.0.0.1"]), node("dual", &["10.0.0.2", "fd00::2"])], true),
        ("no Nodes", vec![], false),
        ("IPv4-mapped", vec![node("a", &["::ffff:10.0.0.1"])], false),
        ("malformed", vec![node("a", &["not-an-ip"])], false),
    ];
    let answer = |c: &Command| match c {
        Command::ReadArm => Outcome::ArmInventory(ArmInventory::default()),
        other => super::upstream_outbound::ok(other),
    };
    for (case, nodes, v6) in cases {
        for at_start_up in [true, false] {
            let case = format!("{case}, at start-up {at_start_up}");
            let (mut tracker, step) = if at_start_up {
                let mut tracker = Tracker::create(clb()).unwrap();
                let mut initial = vec![Observation::PodUpserted(pod("p", "10.244.2.10"))];
                initial.extend(nodes.iter().cloned());
                initial.push(Observation::ListsComplete);
                let step = tracker.observe(NOW, initial);
                (tracker, step)
            } else {
                let mut tracker = started();
                let mut batch = nodes.clone();
                batch.push(Observation::PodUpserted(pod("p", "10.244.2.10")));
                let step = tracker.observe(NOW, batch);
                (tracker, step)
            };
            let (issued, _) = super::upstream_outbound::drive(&mut tracker, NOW, step, answer);
            let mut pips: Vec<&str> = issued
                .iter()
                .filter_map(|c| match c {
                    Command::PutPublicIp(p) => Some(p.name.as_str()),
                    _ => None,
                })
                .collect();
            pips.sort_unstable();
            let expected: &[&str] = if v6 { &["egress-c-pip", "egress-c-pip-v6"] } else { &["egress-c-pip"] };
            assert_eq!(pips, expected, "{case}: {issued:?}");
            let nat = issued
                .iter()
                .find_map(|c| match c {
                    Command::PutNatGateway(n) if n.name == IDENTITY => Some(n),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{case}: a NAT gateway is put: {issued:?}"));
            let expected_v6: Vec<String> = if v6 { vec!["egress-c-pip-v6".into()] } else { vec![] };
            assert_eq!(nat.public_ips_v6, expected_v6, "{case}");
            assert_eq!(nat.public_ips, ["egress-c-pip".to_owned()], "{case}");
            assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created, "{case}");
        }
    }
}

// Upstream TestShouldTriggerInitialLocationSync: at a restart NRP's address locations are brought to what the
// cluster wants whenever they differ: an existing registered Service's drifted endpoints are synced even though
// the one new Service's creation is refused for good and parks, and a Service found deleting has the address
// NRP still lists for it drained before its unregistration. (Nothing differing, nothing is written:
// a_restarted_controller_adopts_a_service_whose_azure_resources_registration_and_status_hold_with_no_write_and_no_event.)
#[test]
fn a_restart_syncs_the_address_locations_of_existing_and_deleting_services_even_when_every_addition_parks() {
    let n1 = || Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let listed = |address: &str| NrpListedLocation {
        location: "10.224.0.4".into(),
        addresses: vec![NrpAddress { address: address.into(), services: vec![UID.into()] }],
    };
    let registered =
        NrpService { name: UID.into(), service_type: "Inbound".into(), backend_pools: vec![], is_default: false };
    let want = |addresses: &[&str]| -> View {
        let mut view = View::new();
        if !addresses.is_empty() {
            let at = view.entry("10.224.0.4".to_owned()).or_default();
            for address in addresses {
                at.insert((*address).to_owned(), [UID.to_owned()].into());
            }
        }
        view
    };

    // An existing Service whose endpoint moved while no controller ran, beside a new Service that parks.
    let existing = provisioned_service();
    let config = LbConfig::for_service(&existing);
    let inventory = inventory_of(&existing, Some(config.load_balancer.clone()));
    let new = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e02";
    let parking = Service { uid: new.into(), name: "api".into(), ..lb_service("Local") };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![
            n1(),
            Observation::ServiceUpserted(existing),
            Observation::ServiceUpserted(parking),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let snapshot = NrpState { services: vec![registered.clone()], locations: vec![listed("10.244.0.9")] };
    let ok = answer_ok(&[UID]);
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(snapshot.clone()),
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        Command::PutLoadBalancer(lb) if lb.name.as_str() == new => refused_for_good(),
        other => ok(other),
    });
    assert!(warned_rejected(&issued), "the new Service parks: {issued:?}");
    assert!(tracker.inbound.lifecycles[new].parked);
    assert!(issued.iter().any(is_location_update), "{issued:?}");
    assert!(
        programmed(&issued)
            .iter()
            .any(|(at, addresses)| at == "10.224.0.4" && addresses.contains(&"10.244.0.5".to_owned()))
    );
    assert_eq!(tracker.nrp_view(), want(&["10.244.0.5"]), "synced: the moved endpoint replaces the old one");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert!(!issued.iter().any(|c| matches!(c, Command::PutLoadBalancer(lb) if lb.name.as_str() == UID)), "adopted");
    assert!(last.idle);

    // A Service found deleting whose address NRP still lists: drained, then unregistered.
    let deleting = terminating(provisioned_service());
    let inventory = inventory_of(&deleting, Some(config.load_balancer.clone()));
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![n1(), Observation::ServiceUpserted(deleting), Observation::ListsComplete]);
    let snapshot = NrpState { services: vec![registered], locations: vec![listed("10.244.0.5")] };
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadNrp => Outcome::NrpSnapshot(snapshot.clone()),
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        other => ok(other),
    });
    let drained = issued.iter().position(is_location_update).expect("drained");
    let unregistered = issued.iter().position(|c| writes_registration(c, UID, Some(true))).expect("unregistered");
    assert!(drained < unregistered, "{issued:?}");
    assert!(tracker.nrp_view().is_empty(), "{:?}", tracker.nrp_view());
    assert_eq!(tracker.phase(UID), None);
    assert!(last.idle);
}

// Upstream TestCleanupOrphanedPublicIPs_KeepsPIPForServiceStillDesiredInKubernetes: at start-up a detached public
// IP (no address, not as put: the crash right after its create) of a Service Kubernetes still wants, or of an
// egress identity a pod still carries, neither of them in NRP, is never swept: each goes on to be provisioned
// with it put again; a `<uid>-pip` wanted by nobody beside them is deleted.
#[test]
fn a_detached_public_ip_of_a_wanted_service_or_identity_is_not_swept_and_an_unwanted_one_is() {
    use super::upstream_outbound::{IDENTITY, pod};
    let orphan = "22222222-2222-2222-2222-222222222222";
    let detached = |name: String| ListedPublicIp { name, version: IpVersion::Ipv4, address: None, as_put: false };
    let inventory = ArmInventory {
        nat_gateways: Vec::new(),
        public_ips: vec![
            detached(format!("{UID}-pip")),
            detached(format!("{IDENTITY}-pip")),
            detached(format!("{orphan}-pip")),
        ],
        load_balancers: Vec::new(),
    };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::PodUpserted(pod("p", "10.244.2.10")),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(inventory));
    let deleted_pips: Vec<&str> = issued
        .iter()
        .filter_map(|c| match c {
            Command::DeleteResource(r) if r.kind == ResourceKind::PublicIp => Some(r.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted_pips, [format!("{orphan}-pip")], "{issued:?}");
    for wanted in [format!("{UID}-pip"), format!("{IDENTITY}-pip")] {
        assert!(issued.iter().any(|c| matches!(c, Command::PutPublicIp(p) if p.name.as_str() == wanted)), "{wanted}");
    }
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert!(tracker.registered().contains(UID));
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert!(tracker.egress().is_registered(IDENTITY));
    assert!(last.idle);
}

// Upstream TestReconcileServices_AppliesRuntimeAdmissionOnStartup, its positive control beside a refusal: at a
// restart a Service created while no controller ran and admissible is provisioned (public IP, load balancer,
// registration, its endpoint in NRP, its status, EnsuredLoadBalancer), while an internal load balancer found
// beside it is refused with its Warning and gets nothing.
#[test]
fn a_restart_provisions_a_new_admissible_service_and_refuses_an_internal_one_beside_it() {
    let internal_uid = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e03";
    let internal = Service {
        uid: internal_uid.into(),
        name: "internal".into(),
        annotations: [(crate::admission::ANNOTATION_INTERNAL_LB.to_owned(), "true".to_owned())].into_iter().collect(),
        ..lb_service("Local")
    };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(
        NOW,
        vec![
            Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] }),
            Observation::ServiceUpserted(internal),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(ArmInventory::default()));
    assert!(!format!("{:?}", writes(&issued)).contains(internal_uid), "nothing for the internal one: {issued:?}");
    let events: Vec<&str> = reasons(&issued);
    assert_eq!(
        events.iter().filter(|r| **r == crate::admission::reason::UNSUPPORTED_INTERNAL_LOAD_BALANCER).count(),
        1,
        "{events:?}"
    );
    assert!(issued.iter().any(|c| matches!(c, Command::PutPublicIp(p) if p.name.as_str() == format!("{UID}-pip"))));
    assert_eq!(load_balancers(&issued).iter().map(|lb| lb.name.as_str()).collect::<Vec<_>>(), [UID]);
    assert!(issued.iter().any(|c| writes_registration(c, UID, Some(false))), "{issued:?}");
    assert_eq!(programmed(&issued), [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned()])]);
    assert_eq!(status_patches(&issued), [&vec!["20.0.0.1".to_owned()]]);
    assert_eq!(events.iter().filter(|r| **r == reason::ENSURED_LOAD_BALANCER).count(), 1, "{events:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert_eq!(tracker.phase(internal_uid), None);
    assert!(last.idle);
}

// Upstream TestGuardOrphanCleanup_PIPNotScheduledWhenDesiredOrHasLB: the start-up sweep of `<uid>-pip` public
// IPs never takes a live Service's. (1) The public IP of a Service Kubernetes still wants (no load balancer, not
// in NRP) is adopted, not deleted. (2) That of a Service NRP still registers as Inbound, gone from Kubernetes, is
// not the sweep's: the registration's own deletion unregisters it and only then deletes the public IP, once.
// (3) An orphan load balancer's public IP is deleted with it, after it, once: the sweep schedules it as one
// orphan, not a second time for its public IP.
#[test]
fn the_public_ip_sweep_leaves_a_wanted_service_s_and_a_registered_one_s_to_them_and_deletes_an_orphan_s_once() {
    let registered = "44444444-4444-4444-4444-444444444444";
    let gone = "33333333-3333-3333-3333-333333333333";
    let service = provisioned_service();
    let mut inventory = orphaned(gone);
    inventory.public_ips.extend(inventory_of(&service, None).public_ips);
    inventory.public_ips.push(ListedPublicIp {
        name: format!("{registered}-pip"),
        version: IpVersion::Ipv4,
        address: Some("20.0.0.8".into()),
        as_put: true,
    });
    let mut still_registered = true;
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
    let (issued, logs, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::ReadArm => Outcome::ArmInventory(inventory.clone()),
        Command::ReadNrp if still_registered => answer_ok(&[registered])(c),
        c if writes_registration(c, registered, Some(true)) => {
            still_registered = false;
            Outcome::Ok
        }
        other => answer_ok(&[])(other),
    });
    let at = |wanted: &Command| issued.iter().position(|c| c == wanted);
    let count = |wanted: &Command| issued.iter().filter(|c| *c == wanted).count();
    // (1)
    assert!(!issued.iter().any(|c| matches!(c, Command::DeleteResource(r) if r.name.starts_with(UID))), "{issued:?}");
    assert!(!issued.iter().any(|c| matches!(c, Command::PutPublicIp(_))), "adopted: {issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert!(tracker.registered().contains(UID));
    // (2)
    let its_pip = deletes(ResourceKind::PublicIp, &format!("{registered}-pip"));
    let unregistered = issued.iter().position(|c| writes_registration(c, registered, Some(true)));
    let unregistered = unregistered.unwrap_or_else(|| panic!("unregistered: {issued:?}"));
    assert!(at(&its_pip).is_some_and(|pip| unregistered < pip), "{issued:?}");
    assert_eq!(count(&its_pip), 1, "{issued:?}");
    // (3)
    let lb = deletes(ResourceKind::LoadBalancer, gone);
    let pip = deletes(ResourceKind::PublicIp, &format!("{gone}-pip"));
    assert!(at(&lb).zip(at(&pip)).is_some_and(|(lb, pip)| lb < pip), "{issued:?}");
    assert_eq!((count(&lb), count(&pip)), (1, 1), "{issued:?}");
    assert!(!issued.iter().any(|c| request_for(c, gone).is_some()), "never in NRP: {issued:?}");
    // Of the three, the sweep schedules the orphan load balancer alone.
    let swept = logs.iter().any(|l| l.message.contains("; 1 orphan(s) of deleted Services to delete"));
    assert!(swept, "{logs:?}");
    assert!(last.idle);
    assert!(tracker.phase(registered).is_none() && tracker.phase(gone).is_none());
}
