//! Retries and caps: `Retry-After` at its limits, slices and nodes that do not parse, slow and
//! failing batches, and specs that change while an operation runs.

use super::*;

// Regression: u64 overflow from a Retry-After, in its shortest sequence.
#[test]
fn a_retry_after_of_u64_max_on_a_read_of_nrp_waits_the_cap_instead_of_reading_again_at_once() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.tick(NOW);
    assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, throttled(u64::MAX))]);
    assert!(step.commands.is_empty(), "no read again at once: {:?}", step.commands);
    assert_eq!(step.wake_at_ms, Some(NOW + timing::RETRY_AFTER_CAP_MS));
    assert_eq!(step.logs.len(), 1, "{:?}", step.logs);
    assert_eq!(step.logs[0].level, LogLevel::Warn);
    assert!(step.logs[0].message.contains("read-nrp") && step.logs[0].message.contains("capped at 300000 ms"));
    assert!(tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS - 1).commands.is_empty());
    let step = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS);
    assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
    assert!(step.logs.is_empty());
}

// Regression: u64 overflow from a Retry-After in `service_outcome`.
#[test]
fn a_retry_after_of_u64_max_on_a_service_command_holds_that_service_for_the_cap() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
    let finalizer = step.commands.iter().find(|c| matches!(c.command, Command::SetFinalizer { .. })).unwrap().id;
    let step = tracker.complete(NOW, vec![(finalizer, throttled(u64::MAX))]);
    assert!(step.commands.iter().all(|c| matches!(c.command, Command::EmitEvent(_))), "{:?}", step.commands);
    assert_eq!(step.wake_at_ms, Some(NOW + timing::RETRY_AFTER_CAP_MS));
    assert!(step.logs[0].message.contains("AddFinalizer for load balancer"), "{:?}", step.logs);
    let early = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS - 1);
    assert!(early.commands.iter().all(|c| !matches!(c.command, Command::SetFinalizer { .. })));
    let due = tracker.tick(NOW + timing::RETRY_AFTER_CAP_MS);
    assert!(due.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "{due:?}");
}

// Regression: an EndpointSlice of an addressType Kubernetes does not have was programmed,
// IPv4-mapped IPv6 node IPs became IPv6 locations, and a Node whose InternalIPs do not parse
// left its pods out of NRP without a word. Its FQDN case, at a cold start, ports upstream
// TestColdStart_FQDNEndpointSlice_Skipped.
// Upstream TestSelectSameFamilyNodeIP_DeterministicAndValidated.
#[test]
fn only_ip_slices_are_programmed_and_a_node_with_internal_ips_that_do_not_parse_is_logged() {
    // (address type, the node's InternalIPs, programmed, a WARN line saying)
    let cases: [(&str, &[&str], bool, Option<&str>); 6] = [
        ("IPv4", &["10.224.0.4"], true, None),
        ("IPv5", &["10.224.0.4"], false, Some("addressType \"IPv5\" is not IPv4, IPv6 or FQDN")),
        ("FQDN", &["10.224.0.4"], false, None),
        (
            "IPv4",
            &["10.224.0.4%eth0"],
            false,
            Some("node n1: InternalIPs [\"10.224.0.4%eth0\"] are not IP addresses (0 usable)"),
        ),
        ("IPv4", &["junk", "10.224.0.4"], true, Some("(1 usable); its other InternalIPs are its locations")),
        ("IPv4", &["::ffff:10.224.0.4"], true, None),
    ];
    for (address_type, ips, programmed, warns) in cases {
        let case = format!("{address_type} on {ips:?}");
        let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
        let slice = EndpointSlice {
            namespace: "default".into(),
            name: "web-1".into(),
            owner_service_uid: Some(UID.into()),
            address_type: address_type.into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.244.0.5".into()],
                node_name: Some("n1".into()),
                ready: Some(true),
            }],
            deleting: false,
        };
        let node = Node { name: "n1".into(), internal_ips: ips.iter().map(|ip| ip.to_string()).collect() };
        let step = tracker.observe(
            NOW,
            vec![
                Observation::NodeUpserted(node),
                Observation::ServiceUpserted(lb_service("Local")),
                Observation::SliceUpserted(slice),
                Observation::ListsComplete,
            ],
        );
        let (issued, logs, _) = drive(&mut tracker, NOW, step, answer_ok(&[UID]));
        assert_eq!(issued.iter().any(is_location_update), programmed, "{case}: {issued:?}");
        let warned: Vec<_> = logs.iter().filter(|l| l.level == LogLevel::Warn).map(|l| &l.message).collect();
        match warns {
            Some(text) => assert!(warned.len() == 1 && warned[0].contains(text), "{case}: {warned:?}"),
            None => assert!(warned.is_empty(), "{case}: {warned:?}"),
        }
    }
}

// Regression: u64 overflow from a Retry-After in the address-location batch, which every
// Service's addresses wait for: they wait no longer than the cap.
#[test]
fn a_retry_after_of_u64_max_on_the_address_location_batch_holds_the_addresses_no_longer_than_the_cap() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let slice = EndpointSlice {
        namespace: "default".into(),
        name: "web-1".into(),
        owner_service_uid: Some(UID.into()),
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec!["10.244.0.5".into()],
            node_name: Some("n1".into()),
            ready: Some(true),
        }],
        deleting: false,
    };
    let step = tracker.observe(
        NOW,
        vec![
            Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] }),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice),
            Observation::ListsComplete,
        ],
    );
    let ok = answer_ok(&[UID]);
    let mut batches = 0;
    let (issued, logs, _) = drive(&mut tracker, NOW, step, |command| {
        if is_location_update(command) {
            batches += 1;
            return throttled(u64::MAX);
        }
        ok(command)
    });
    assert_eq!(batches, 1, "{issued:?}");
    assert!(logs.iter().any(|l| l.message.contains("update-address-locations")), "{logs:?}");
    assert!(tracker.tick(NOW + 1).commands.is_empty());
    let wait = timing::RETRY_AFTER_CAP_MS;
    let step = tracker.tick(NOW + wait - 1);
    assert!(!step.commands.iter().any(|c| is_location_update(&c.command)));
    let step = tracker.tick(NOW + wait);
    let (issued, _, _) = drive(&mut tracker, NOW + wait, step, &ok);
    assert!(issued.iter().any(is_location_update), "sent after the cap: {issued:?}");
}

// Upstream TestEngineUpdateService_PortChangeSchedulesUpdate, TestServiceUpdaterUpdateInboundService,
// TestServiceUpdaterUpdateInboundService_PortRemovalDropsOnlyThatRule and
// TestEngineOnServiceCreationComplete_UpdateSuccessPersistsConfig: a spec change of a created
// Service is one PUT of its load balancer with the new rules (nothing else of Azure is
// written: not its public IP, not its NRP registration); removing a port drops only its
// rule; once applied, the same spec again writes nothing.
// Upstream TestEngineUpdateService_NoOpWhenConfigUnchanged and TestReconcileInboundService (its
// "updates an already tracked service" case).
#[test]
fn a_port_change_puts_the_load_balancer_once_with_the_new_rules_and_the_same_spec_again_writes_nothing() {
    let mut tracker = created_with(&[(80, 8080), (443, 8443)]);
    let step = respec(&mut tracker, NOW + 1, &[(80, 8080)]);
    let (issued, _, _) = drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(
        load_balancers(&issued).iter().map(|lb| lb.rules.clone()).collect::<Vec<_>>(),
        [vec![rule(LbProtocol::Tcp, 80, 8080, 4)]]
    );
    let azure_writes =
        |c: &&Command| matches!(c, Command::PutPublicIp(_) | Command::UpdateServices(_) | Command::DeleteResource(_));
    assert_eq!(issued.iter().filter(azure_writes).count(), 0, "{issued:?}");
    let step = respec(&mut tracker, NOW + 2, &[(80, 9090)]);
    let (issued, _, _) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
    assert_eq!(load_balancers(&issued)[0].rules, vec![rule(LbProtocol::Tcp, 80, 9090, 4)]);
    let step = respec(&mut tracker, NOW + 3, &[(80, 9090)]);
    let (issued, _, _) = drive(&mut tracker, NOW + 3, step, answer_ok(&[UID]));
    assert!(load_balancers(&issued).is_empty(), "the applied spec is remembered: {issued:?}");
}

// Upstream TestEngineOnServiceCreationComplete_UpdateDriftReschedules and
// TestEngineOnServiceCreationComplete_UpdateFailureKeepsState: a spec that changes while its
// update is in flight is put once that one completes (one PUT of a load balancer at a time);
// a failed update is retried, after its backoff, with the spec it was for, and the Service
// stays registered meanwhile.
// Upstream TestServiceUpdaterUpdateInboundService, its transient-failure case: a failed update
// PUT is retryable, not parked.
#[test]
fn a_spec_changed_during_an_update_is_put_after_it_and_a_failed_update_is_retried_with_its_spec() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = respec(&mut tracker, NOW + 1, &[(80, 8081)]);
    let (first, lb) = put_in(&step).expect("the update is sent");
    assert_eq!(lb.rules[0].backend_port, 8081);
    let step = respec(&mut tracker, NOW + 2, &[(80, 8082)]);
    assert!(put_in(&step).is_none(), "one PUT of a load balancer at a time: {:?}", step.commands);
    let mut step = tracker.complete(NOW + 3, vec![(first, Outcome::Ok)]);
    // The update's status patch first, then the drift.
    while put_in(&step).is_none() && !step.commands.is_empty() {
        let results = step.commands.iter().map(|c| (c.id, answer_ok(&[UID])(&c.command))).collect();
        step = tracker.complete(NOW + 3, results);
    }
    let (second, lb) = put_in(&step).expect("the drift is put next");
    assert_eq!(lb.rules[0].backend_port, 8082);
    let step = tracker.complete(NOW + 4, vec![(second, failed(500))]);
    assert!(put_in(&step).is_none());
    assert!(
        !step
            .commands
            .iter()
            .any(|c| matches!(&c.command, Command::UpdateServices(r) if r.iter().any(|r| r.is_delete)))
    );
    let later = NOW + 4 + 2 * timing::BACKOFF_CAP_MS;
    let step = tracker.tick(later);
    let (_, lb) = put_in(&step).expect("retried after its backoff");
    assert_eq!(lb.rules[0].backend_port, 8082, "with the spec it was for");
    assert!(tracker.nrp.diff.is_registered(&UID.to_ascii_lowercase()), "still registered");
}

// Upstream TestEngineUpdateService_OverwritesConfigDuringCreation: a spec that changes while
// the Service is being created is the one its load balancer is created with.
#[test]
fn a_spec_changed_during_creation_is_the_one_the_load_balancer_is_created_with() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let first = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(first), Observation::ListsComplete]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
    assert!(step.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "creating: {step:?}");
    let changed = ported(UID, &[(TCP, 80, to(9090))], &[]);
    let mut next = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(changed)]);
    next.commands.extend(step.commands);
    let (issued, _, _) = drive(&mut tracker, NOW + 1, next, answer_ok(&[]));
    let created: Vec<_> = load_balancers(&issued).iter().map(|lb| lb.rules[0].backend_port).collect();
    assert_eq!(created, [9090], "{issued:?}");
}

// Upstream TestEngineOnServiceCreationComplete_UpdateTerminalErrorParks,
// TestUpdateEndpoints_TerminalUpdateKeepsApplyingToLiveLB and
// TestSyncOps_ParkedLiveLBRemainsReadyToSync: an update Azure refuses for good parks it with a
// Warning, but the load balancer that exists keeps serving: the Service stays registered and
// its endpoint changes still reach NRP.
#[test]
fn an_update_refused_for_good_parks_it_while_the_live_load_balancer_keeps_getting_its_endpoints() {
    let mut tracker = created_with(&[(80, 8080)]);
    let step = respec(&mut tracker, NOW + 1, &[(80, 8081)]);
    let (put, _) = put_in(&step).expect("the update is sent");
    let refused = Outcome::Failed(Failure {
        status: 400,
        code: Some("InvalidParameter".into()),
        retry_after_ms: None,
        message: "bad rule".into(),
    });
    let step = tracker.complete(NOW + 2, vec![(put, refused)]);
    let warned = step.commands.iter().any(
        |c| matches!(&c.command, Command::EmitEvent(e) if e.reason == reason::LOAD_BALANCER_CONFIGURATION_REJECTED),
    );
    assert!(warned, "{:?}", step.commands);
    let (issued, _, _) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
    assert!(load_balancers(&issued).is_empty());
    let later = NOW + 60 * 60 * 1000;
    let step = tracker
        .observe(later, vec![Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n1")]))]);
    let (issued, _, _) = drive(&mut tracker, later, step, answer_ok(&[UID]));
    assert!(load_balancers(&issued).is_empty(), "parked: not retried: {issued:?}");
    let sent: Vec<&str> = issued
        .iter()
        .filter_map(|c| if let Command::UpdateAddressLocations(l) = c { Some(l) } else { None })
        .flatten()
        .flat_map(|l| l.addresses.iter().map(|a| a.address.as_str()))
        .collect();
    assert!(sent.contains(&"10.244.0.6"), "the new endpoint reaches NRP: {issued:?}");
}

// Regression: one hung update-address-locations made every Service's endpoint changes wait for
// it (for NRP's whole request timeout).
// Upstream TestLocationsUpdaterRetriesAfterSyncFailure and
// TestLocationsUpdater_HungSyncTimesOutAndRecovers.
#[test]
fn a_hung_address_location_batch_holds_only_its_own_locations_once_it_is_slow() {
    let (mut tracker, hung) = tracker_with_a_batch_in_flight();
    // A pod on n2 (another location) and one more on n1 (the hung batch's).
    let change =
        Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n1"), ("10.244.1.5", "n2")]));
    let step = tracker.observe(NOW + 100, vec![change]);
    assert!(drive_holding_batches(&mut tracker, NOW + 100, step).is_empty(), "not slow yet: the change coalesces");
    let step = tracker.tick(NOW + 100);
    assert_eq!(step.wake_at_ms, Some(NOW + timing::SLOW_BATCH_MS), "woken when the batch in flight is slow");
    let step = tracker.tick(NOW + timing::SLOW_BATCH_MS);
    let beside = drive_holding_batches(&mut tracker, NOW + timing::SLOW_BATCH_MS, step);
    assert_eq!(beside.len(), 1);
    assert_eq!(beside[0].1, ["10.224.0.5"], "n2 goes beside the hung batch; n1 waits for it");
    let step = tracker.complete(NOW + 2_500, vec![(beside[0].0, Outcome::Ok)]);
    assert!(drive_holding_batches(&mut tracker, NOW + 2_500, step).is_empty(), "n1 still waits for its batch");
    assert!(tracker.nrp_view().contains_key("10.224.0.5"), "{:?}", tracker.nrp_view());
    // The hung batch times out: n1 backs off on its own, then goes with both its pods.
    let timeout =
        Outcome::Failed(Failure { status: 504, code: None, retry_after_ms: None, message: "timed out".into() });
    let step = tracker.complete(NOW + 20_000, vec![(hung, timeout)]);
    assert!(drive_holding_batches(&mut tracker, NOW + 20_000, step).is_empty(), "backing off");
    let due = backoff_ms("10.224.0.4", 1, None);
    let step = tracker.tick(NOW + 20_000 + due);
    let retried = drive_holding_batches(&mut tracker, NOW + 20_000 + due, step);
    assert_eq!(retried.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(), [vec!["10.224.0.4".to_owned()]]);
    let (version, payload) = tracker.export_state();
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
}

// Regression: a failing batch backed off every Service's addresses; only a throttled one (429:
// the subscription's budget) should.
#[test]
fn a_failed_address_location_batch_backs_off_only_its_own_locations_and_a_throttled_one_every_location() {
    for (status, others_wait) in [(500, false), (504, false), (429, true)] {
        let (mut tracker, batch) = tracker_with_a_batch_in_flight();
        let failure = Outcome::Failed(Failure { status, code: None, retry_after_ms: None, message: "no".into() });
        let step = tracker.complete(NOW + 10, vec![(batch, failure)]);
        assert!(drive_holding_batches(&mut tracker, NOW + 10, step).is_empty(), "{status}: n1 backs off");
        let change = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.1.5", "n2")]));
        let step = tracker.observe(NOW + 20, vec![change]);
        let sent = drive_holding_batches(&mut tracker, NOW + 20, step);
        if others_wait {
            assert!(sent.is_empty(), "{status}: every location waits out the throttle: {sent:?}");
        } else {
            assert_eq!(
                sent.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
                [vec!["10.224.0.5".to_owned()]],
                "{status}"
            );
        }
    }
}

// Regression: u64 overflow: a read within five minutes of the end of u64 time set a wrapped
// deadline that kept a read always due, holding NRP writes forever.
#[test]
fn a_read_of_nrp_near_the_end_of_u64_time_does_not_hold_nrp_writes_forever() {
    let now = u64::MAX - 60_000;
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(now, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let (issued, _, last) = drive(&mut tracker, now, step, answer_ok(&[]));
    assert_eq!(issued.iter().filter(|c| **c == Command::ReadNrp).count(), 1, "{issued:?}");
    assert!(issued.iter().any(|c| matches!(c, Command::UpdateServices(_))), "registered: {issued:?}");
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert_eq!(last.wake_at_ms, Some(u64::MAX), "the next resync saturates");
}
