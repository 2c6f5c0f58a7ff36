//! Provisioning end to end: endpoints reaching NRP, deletions and recreations, refused
//! locations, overlay-mapping refusals, and terminal refusals of a spec.

use super::*;

// Ports upstream TestProcessK8sEndpoints_SkipsMalformedAddresses: an endpoint address that
// is not an IP is left out; the slice's other addresses are programmed.
#[test]
fn an_endpoint_address_that_is_not_an_ip_is_skipped_and_the_others_are_programmed() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let slice = slice_on(&[("10.244.0.5", "n1"), ("not-an-ip", "n1"), ("10.244.0.300", "n1"), ("10.244.0.6", "n1")]);
    let step = tracker.observe(
        NOW,
        vec![
            node,
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    assert_eq!(
        programmed(&issued),
        [("10.224.0.4".to_owned(), vec!["10.244.0.5".to_owned(), "10.244.0.6".to_owned()])]
    );
    assert!(last.idle);
}

// Ports upstream TestIsServiceReady_StateUpdateInProgress: while its load balancer is being
// updated, a registered Service is ready: its endpoint changes go to NRP meanwhile.
#[test]
fn endpoint_changes_of_a_service_whose_load_balancer_is_being_updated_reach_nrp_meanwhile() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = respec(&mut tracker, NOW, &[(80, 9090)]);
    assert!(put_in(&step).is_some(), "the update is in flight: {step:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::UpdateInProgress));
    let step =
        tracker.observe(NOW, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.7", "n1")]))]);
    let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
    assert_eq!(programmed(&sent), [("10.224.0.4".to_owned(), vec!["10.244.0.7".to_owned()])], "{sent:?}");
}

// Ports upstream TestCreateInboundService_ServiceGoneNotFoundAbortsWithoutCreatingResources
// and TestCreateInboundServiceClearsBuffersWhenServiceGone: a Service that is gone from the
// API server when its finalizer is added (404) is abandoned before any Azure resource is
// made, and its endpoints never reach NRP.
#[test]
fn a_service_gone_when_its_finalizer_is_added_makes_no_azure_resource_and_none_of_its_endpoints_reach_nrp() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let step = tracker.observe(
        NOW,
        vec![
            node,
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, last) = drive(&mut tracker, NOW, step, |c| match c {
        Command::SetFinalizer { .. } | Command::PatchServiceStatus { .. } => failed(404),
        Command::DeleteResource(_) => failed(404),
        other => answer_ok(&[])(other),
    });
    let made = issued.iter().any(|c| matches!(c, Command::PutPublicIp(_) | Command::PutLoadBalancer(_)));
    assert!(!made, "{issued:?}");
    assert!(programmed(&issued).is_empty() && !issued.iter().any(|c| matches!(c, Command::UpdateServices(_))));
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Ports upstream TestEngineUpdateService_IgnoredDuringDeletion and
// TestGuardStateTransitions_CreateAfterDelete_BuffersRecreate: a spec that asks for the load
// balancer again while it is being deleted does not interrupt the deletion; it is buffered,
// and the Service is provisioned anew once the deletion is done.
// Upstream TestUpdateService_RecreateAfterDeletionReplays, TestUpdateK8sService and
// TestServiceUpdaterDeleteInboundService_Succeeds.
#[test]
fn a_service_wanted_again_during_its_deletion_is_deleted_first_then_provisioned_anew() {
    let mut tracker = created_with(&[(80, 8080)]);
    let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..ported(UID, &[(TCP, 80, to(8080))], &[]) };
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(cluster_ip)]);
    assert!(tracker.phase(UID).is_some_and(Phase::is_deleting), "{step:?}");
    // Wanted again before the first delete command is answered.
    let wanted = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let again = tracker.observe(NOW, vec![Observation::ServiceUpserted(wanted)]);
    assert!(tracker.phase(UID).is_some_and(Phase::is_deleting), "the deletion goes on");
    let mut first = step;
    first.commands.extend(again.commands);
    let (issued, _, last) = drive(&mut tracker, NOW, first, answer_ok(&[UID]));
    let deleted_lb = issued
        .iter()
        .position(|c| matches!(c, Command::DeleteResource(r) if r.kind == ResourceKind::LoadBalancer))
        .expect("the load balancer is deleted");
    let put_again = issued.iter().rposition(|c| matches!(c, Command::PutLoadBalancer(_))).expect("and put again");
    assert!(deleted_lb < put_again, "{issued:?}");
    let reasons: Vec<&str> = issued
        .iter()
        .filter_map(|c| match c {
            Command::EmitEvent(e) => Some(e.reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, [reason::DELETED_LOAD_BALANCER, reason::ENSURED_LOAD_BALANCER]);
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Ports upstream TestLocationsUpdater_TerminalErrorNotRetried, where the project deliberately
// differs (docs/design.md §4: one failing Service never blocks the others): a batch NRP refuses (400)
// is halved until the refused location stands alone; that one is set aside and not retried
// until it changes (or NRP is read again), and every other location is programmed.
#[test]
fn a_location_nrp_refuses_is_isolated_by_halving_and_set_aside_until_it_changes() {
    let (mut tracker, step) = four_locations();
    let bad = "10.224.0.6";
    let mut batches: Vec<Vec<String>> = Vec::new();
    let ok = answer_ok(&[UID]);
    let mut answer = |c: &Command| match c {
        Command::UpdateAddressLocations(ls) => {
            batches.push(ls.iter().map(|l| l.location.clone()).collect());
            if ls.iter().any(|l| l.location == bad) { failed(400) } else { Outcome::Ok }
        }
        other => ok(other),
    };
    drive(&mut tracker, NOW, step, &mut answer);
    let with_bad: Vec<&Vec<String>> = batches.iter().filter(|b| b.iter().any(|l| l == bad)).collect();
    assert_eq!(with_bad.last().map(|b| b.as_slice()), Some([bad.to_owned()].as_slice()), "{batches:?}");
    assert_eq!(with_bad.iter().filter(|b| b.len() == 1).count(), 1, "refused alone once: {batches:?}");
    let view = tracker.nrp_view();
    let programmed: Vec<&String> = view.keys().collect();
    assert_eq!(programmed, ["10.224.0.4", "10.224.0.5", "10.224.0.7"]);
    // Set aside: time passing does not retry it (until the next read of NRP, 5 minutes on,
    // which starts over from what NRP holds).
    let later = tracker.tick(NOW + 60_000);
    assert!(batch_locations(&later).iter().all(|(_, ls)| !ls.iter().any(|l| l == bad)), "{later:?}");
    // A change at that location is a new update: it is tried again.
    let mut endpoints: Vec<(String, String)> = (4..8).map(|i| (format!("10.244.0.{i}"), format!("n{i}"))).collect();
    endpoints.push(("10.244.0.16".into(), "n6".into()));
    let slice = slice_on(&endpoints.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect::<Vec<_>>());
    let step = tracker.observe(NOW + 60_000, vec![Observation::SliceUpserted(slice)]);
    let mut sent = batch_locations(&step);
    sent.extend(batch_locations(&later));
    assert!(sent.iter().any(|(_, ls)| ls.iter().any(|l| l == bad)), "{step:?}");
}

// Ports upstream TestIsTerminalLocationSyncStatus_ClassifiesEveryStatus, with the project's
// classes (docs/design.md §4): 400 and 422 refuse the batch (it is split at once), 429 throttles
// every location for its Retry-After, and any other failure (5xx, or no answer: status 0)
// backs off only the batch's locations.
// Upstream TestLocationsUpdaterRetriesAfterSyncFailure,
// TestLocationsUpdater_DrainKeepsRetryingPastAttemptCap and TestExtractAzureErrorInfo (differs: metrics
// say ok or failed; the guest gets the status and the code).
#[test]
fn each_failure_status_of_an_address_location_batch_gets_its_class() {
    for status in [400u16, 422, 429, 500, 503, 0] {
        let (mut tracker, step) = four_locations();
        let (_, _, step) = drive_holding_batches_until_first(&mut tracker, step);
        let batches = batch_locations(&step);
        assert_eq!(batches.len(), 1, "{status}: one batch of every location: {step:?}");
        let (id, first) = batches[0].clone();
        assert_eq!(first.len(), 4);
        let failure = Outcome::Failed(Failure {
            status,
            code: None,
            retry_after_ms: (status == 429).then_some(5_000),
            message: "no".into(),
        });
        let next = tracker.complete(NOW, vec![(id, failure)]);
        let resent = batch_locations(&next);
        match status {
            400 | 422 => {
                assert_eq!(resent.iter().map(|(_, ls)| ls.len()).collect::<Vec<_>>(), [2], "{status}: halved")
            }
            _ => {
                assert!(resent.is_empty(), "{status}: nothing at once: {next:?}");
                let wake = next.wake_at_ms.expect("a retry is scheduled");
                if status == 429 {
                    assert_eq!(wake, NOW + 5_000, "429 waits its Retry-After");
                } else {
                    assert!((NOW + 1_000..=NOW + 1_200).contains(&wake), "{status}: first backoff: {wake}");
                }
                let retried = batch_locations(&tracker.tick(wake));
                assert_eq!(retried.iter().map(|(_, ls)| ls.len()).sum::<usize>(), 4, "{status}: {retried:?}");
            }
        }
    }
}

// Ports upstream TestEndpointSliceAddresses_ResolvesLocationPerAddressFamily: each endpoint
// address goes under its node's InternalIP of the same family, whatever the slice's
// addressType says; an address whose family the node has no InternalIP of is left out.
// Upstream TestColdStart_DualStackNode_InboundFamilyMatchedLocationKey.
#[test]
fn each_endpoint_address_goes_under_its_nodes_internal_ip_of_the_same_family() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let dual = Node { name: "dual".into(), internal_ips: vec!["10.224.0.4".into(), "fd00::4".into()] };
    let v4_only = Node { name: "v4".into(), internal_ips: vec!["10.224.0.5".into()] };
    let endpoint = |addresses: &[&str], node: &str| Endpoint {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        node_name: Some(node.into()),
        ready: Some(true),
    };
    let slice = EndpointSlice {
        endpoints: vec![
            endpoint(&["10.244.0.5", "fd00:244::5"], "dual"),
            endpoint(&["10.244.0.6", "fd00:244::6"], "v4"),
        ],
        ..slice_on(&[])
    };
    let step = tracker.observe(
        NOW,
        vec![
            Observation::NodeUpserted(dual),
            Observation::NodeUpserted(v4_only),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, last) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
    let mut sent = programmed(&issued);
    sent.sort();
    let expected = [("10.224.0.4", "10.244.0.5"), ("10.224.0.5", "10.244.0.6"), ("fd00::4", "fd00:244::5")];
    let expected: Vec<(String, Vec<String>)> =
        expected.iter().map(|(l, a)| (l.to_string(), vec![a.to_string()])).collect();
    assert_eq!(sent, expected, "fd00:244::6 has no IPv6 location on v4");
    assert!(last.idle);
}

// Ports upstream TestGuardServiceUpdater_BackoffAndTerminalCeiling, where the project
// deliberately differs: upstream parks a Service after 12 failures; here a failure that is
// not a refusal of the spec (TERMINAL_CODES, 422) is retried for as long as it lasts, its
// backoff capped at 30 s, because a controller that stops trying needs an operator to notice
// (docs/design.md §4: backoff per Service, no give-up). A refusal parks at once (tested above).
// Upstream TestEngineOnServiceCreationComplete_Failure and
// TestEngineOnServiceCreationComplete_TransientErrorRetries.
#[test]
fn a_load_balancer_put_that_keeps_failing_is_retried_past_any_ceiling_with_a_capped_backoff() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    let mut now = NOW;
    let mut step = step;
    let mut failures = 0;
    let mut delays = Vec::new();
    while failures < 20 {
        let results: Vec<(u64, Outcome)> = step
            .commands
            .iter()
            .map(|c| match c.command {
                Command::PutLoadBalancer(_) => {
                    failures += 1;
                    (c.id, failed(500))
                }
                _ => (c.id, ok(&c.command)),
            })
            .collect();
        let failed_now = step.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_)));
        let next = tracker.complete(now, results);
        let put = next.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_)));
        assert!(!(failed_now && put), "no PUT again at once: {:?}", next.commands);
        if next.commands.is_empty() {
            let wake = next.wake_at_ms.expect("a retry is always scheduled");
            delays.push(wake - now);
            assert!(tracker.tick(wake - 1).commands.is_empty(), "nothing before the backoff ends");
            now = wake;
            step = tracker.tick(now);
        } else {
            step = next;
        }
    }
    assert!(!tracker.inbound.lifecycles[UID].parked, "never parked");
    assert!(delays[0] > 0 && delays[1] > delays[0] && delays[2] > delays[1], "the backoff grows: {delays:?}");
    assert!(delays.iter().all(|&d| d <= timing::BACKOFF_CAP_MS * 6 / 5), "{delays:?}");
    assert!(delays.iter().rev().take(5).all(|&d| d >= timing::BACKOFF_CAP_MS), "at the cap: {delays:?}");
    assert!(step.commands.iter().any(|c| matches!(c.command, Command::PutLoadBalancer(_))), "still trying");
}

// Ports upstream TestUpdateServiceLoadBalancerStatus_PreservesDualStackAndHostname and
// TestUpdateServiceLoadBalancerStatus_DualStackSafeThroughLister (the same, read through
// its lister), where the project deliberately differs: `status.loadBalancer.ingress` is
// exactly the public IP this controller allocated; other entries (another family's IP, a
// stale address) are replaced, not kept, since the Service's load balancer has that one
// frontend and an entry it does not serve would send clients elsewhere (hostnames never
// reach the guest: the host copies IPs only).
// Upstream TestCreateInboundService_PopulatesIngressOnSuccess.
#[test]
fn the_ingress_status_is_set_to_exactly_the_allocated_public_ip() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let service = Service { ingress_ips: vec!["2603:1030::9".into(), "20.0.0.1".into()], ..lb_service("Local") };
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(service), Observation::ListsComplete]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    let patched: Vec<&Vec<String>> = issued
        .iter()
        .filter_map(|c| match c {
            Command::PatchServiceStatus { ingress_ips, .. } => Some(ingress_ips),
            _ => None,
        })
        .collect();
    assert_eq!(patched, [&vec!["20.0.0.1".to_owned()]], "{issued:?}");
}

// Ports upstream TestOnServiceCreationComplete_OverlayMappingsErrorReDrainsLocations and
// TestIsServiceOverlayMappingsError (the project recognises the error by its ARM code,
// `ServiceWithOverlayMappingsCannotBeDeleted`, not by the message text): an unregistration
// NRP refuses because addresses still map to the service sends the deletion back to draining,
// NRP is read again, the addresses the mirror did not know of are removed, and then the
// service is unregistered and the finalizer released.
// Upstream TestGuardCheckPendingServiceDeletions_BlockedWhenLocationsRemain,
// TestGuardCheckPendingServiceDeletions_AdvancesWhenLocationsCleared and
// TestEngineOnServiceCreationComplete_GenuineDeletionCleansUp.
#[test]
fn an_unregistration_refused_for_overlay_mappings_re_reads_nrp_drains_again_and_then_unregisters() {
    let mut tracker = created_with(&[(80, 8080)]);
    let deleting = terminating_web();
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(deleting)]);
    let stray = NrpListedLocation {
        location: "10.224.0.4".into(),
        addresses: vec![NrpAddress { address: "10.244.0.99".into(), services: vec![UID.into()] }],
    };
    let (mut refused, mut reads_after) = (false, 0);
    let registered =
        NrpService { name: UID.into(), service_type: "Inbound".into(), backend_pools: vec![], is_default: false };
    let mut answer = |c: &Command| match c {
        Command::UpdateServices(requests) if requests[0].is_delete && !refused => {
            refused = true;
            Outcome::Failed(Failure {
                status: 400,
                code: Some(OVERLAY_MAPPINGS_CODE.into()),
                retry_after_ms: None,
                message: "mapped".into(),
            })
        }
        Command::ReadNrp => {
            reads_after += 1;
            Outcome::NrpSnapshot(NrpState { services: vec![registered.clone()], locations: vec![stray.clone()] })
        }
        other => answer_ok(&[UID])(other),
    };
    // The refused step backs off (1 s): run on through its retry.
    let (mut issued, mut now, mut step) = (Vec::new(), NOW, step);
    let last = loop {
        let (sent, _, last) = drive(&mut tracker, now, step, &mut answer);
        issued.extend(sent);
        match last.wake_at_ms.filter(|_| !last.idle) {
            Some(at) if at < NOW + 60_000 => {
                now = at;
                step = tracker.tick(now);
            }
            _ => break last,
        }
    };
    assert!(refused && reads_after >= 1, "{issued:?}");
    let position = |want: &dyn Fn(&Command) -> bool| issued.iter().rposition(want);
    let read = issued.iter().position(|c| *c == Command::ReadNrp).expect("NRP read again");
    // The location goes (no addresses: NRP deletes it), or the stray address leaves it.
    let removes_stray = |l: &NrpLocation| {
        l.location == "10.224.0.4"
            && (l.addresses.is_empty()
                || l.addresses.iter().any(|a| a.address == "10.244.0.99" && a.services.is_empty()))
    };
    let drained = position(&|c| matches!(c, Command::UpdateAddressLocations(ls) if ls.iter().any(removes_stray)))
        .unwrap_or_else(|| panic!("the stray address is removed: {issued:#?}"));
    let unregistered = position(&|c| matches!(c, Command::UpdateServices(r) if r[0].is_delete)).unwrap();
    let released = position(&|c| matches!(c, Command::SetFinalizer { present: false, .. })).unwrap();
    assert!(read < drained && drained < unregistered && unregistered < released, "{issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), None);
}

// Ports upstream TestEngineOnServiceCreationComplete_DriftDuringTerminalFailureReDispatches
// and TestEngineOnServiceCreationComplete_DriftDuringTerminalUpdateReDispatches: when Azure
// refuses a load balancer for good but the spec changed while that PUT was in flight, the
// refusal is of a spec nobody wants any more: the current spec is put at once, with no park
// and no Warning — in a creation and in an update alike.
#[test]
fn a_refusal_of_a_spec_that_changed_while_in_flight_puts_the_current_spec_instead_of_parking() {
    for creating in [true, false] {
        let (mut tracker, put) = if creating {
            let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
            let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
            let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
            let (put, _) = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
            (tracker, put)
        } else {
            let mut tracker = created_with(&[(80, 8080)]);
            let step = respec(&mut tracker, NOW, &[(80, 8081)]);
            let (put, _) = put_in(&step).expect("the update is sent");
            (tracker, put)
        };
        // The spec changes while the PUT is in flight; then Azure refuses the old one.
        let changed = respec(&mut tracker, NOW + 1, &[(80, 9090)]);
        assert!(put_in(&changed).is_none(), "one PUT at a time");
        let step = tracker.complete(NOW + 2, vec![(put, refused_for_good())]);
        let sent: Vec<Command> = step.commands.iter().map(|c| c.command.clone()).collect();
        let put_again = load_balancers(&sent);
        assert_eq!(put_again.len(), 1, "creating {creating}: {sent:?}");
        assert_eq!(put_again[0].rules[0].backend_port, 9090, "the current spec");
        assert!(!warned_rejected(&sent), "no Warning for a spec nobody wants: {sent:?}");
        let (issued, _, last) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
        assert!(!warned_rejected(&issued) && last.idle);
        assert_eq!(tracker.phase(UID), Some(Phase::Created));
    }
}

// Ports upstream TestRecreateAfterDeletion_ClearsCreationFailedTerminal: a creation parked
// by a refusal is not parked any more once the Service was deleted and is wanted again: the
// new creation runs from the start.
#[test]
fn a_service_recreated_after_a_parked_creation_is_provisioned_from_the_start() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec.clone()), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, |c| match c {
        Command::PutLoadBalancer(_) => refused_for_good(),
        other => ok(other),
    });
    assert!(warned_rejected(&issued), "parked: {issued:?}");
    // Deleted (retyped away) and wanted again: deletion first, then a creation from scratch.
    let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..spec.clone() };
    let mut step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(cluster_ip)]);
    step.commands.extend(tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(spec)]).commands);
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(load_balancers(&issued).len(), 1, "put again: {issued:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestUpdateService_CreationFailedTerminalRecoversOnSpecChange: a creation parked by
// a refusal is taken up again by a spec change at once, in the step that observes it (no
// tick, no backoff), and its load balancer is put with the new spec.
#[test]
fn a_creation_parked_by_a_refusal_is_put_again_at_once_with_the_spec_that_changed() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    let (issued, _, _) =
        drive(&mut tracker, NOW, step, |c| if is_put_load_balancer(c) { refused_for_good() } else { ok(c) });
    assert!(warned_rejected(&issued), "parked: {issued:?}");
    assert!(tracker.inbound.lifecycles[UID].parked);
    let unchanged = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let same = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(unchanged)]);
    assert!(same.commands.is_empty(), "the same spec stays parked: {same:?}");
    let changed = ported(UID, &[(TCP, 80, to(8081))], &[]);
    let step = tracker.observe(NOW + 2, vec![Observation::ServiceUpserted(changed)]);
    assert!(!step.commands.is_empty(), "dispatched in the step that observes the change: {step:?}");
    assert!(!tracker.inbound.lifecycles[UID].parked);
    // Driven at the same instant: nothing waits for a backoff.
    let (issued, _, last) = drive(&mut tracker, NOW + 2, step, answer_ok(&[]));
    let put = load_balancers(&issued);
    assert_eq!(put.len(), 1, "{issued:?}");
    assert_eq!(put[0].rules, vec![rule(LbProtocol::Tcp, 80, 8081, 4)], "the new spec");
    assert!(!warned_rejected(&issued));
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}

// Upstream TestServiceUpdaterUpdateInboundService, its unsupported-spec case: a created Service
// whose spec turns dual-stack is never put with it (admission refuses it before anything is
// written), gets one Warning and keeps its last admitted spec; its retryable-failure case is
// a_spec_changed_during_an_update_is_put_after_it_and_a_failed_update_is_retried_with_its_spec.
#[test]
fn a_created_service_whose_spec_turns_dual_stack_is_not_put_and_keeps_its_admitted_spec() {
    let mut tracker = created_with(&[(80, 8080)]);
    let dual = Service { ip_families: vec!["IPv4".into(), "IPv6".into()], ..ported(UID, &[(TCP, 80, to(9090))], &[]) };
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(dual)]);
    let (issued, _, last) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert!(load_balancers(&issued).is_empty(), "{issued:?}");
    let events: Vec<&Event> =
        issued.iter().filter_map(|c| if let Command::EmitEvent(e) = c { Some(e) } else { None }).collect();
    assert_eq!(events.len(), 1, "{issued:?}");
    assert_eq!(events[0].reason, crate::admission::reason::UNSUPPORTED_DUAL_STACK);
    assert!(issued.iter().all(|c| matches!(c, Command::EmitEvent(_))), "nothing written: {issued:?}");
    let kept = tracker.admitted_spec("default", "web").unwrap();
    assert!(kept.ip_families.len() <= 1 && kept.ports[0].target_port == to(8080), "{kept:?}");
    assert!(last.idle);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
}
