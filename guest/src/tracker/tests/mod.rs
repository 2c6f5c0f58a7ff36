//! The tracker's own tests: shared helpers here; each file beside this one is one theme, and the
//! `upstream_*` files port upstream's tests of one area each.

use super::service::*;
use super::startup::ArmSync;
use super::*;
use crate::admission::admit_service;
use crate::budget::Buckets;
use std::collections::BTreeMap;

fn clb() -> Config {
    Config { backend_pool_type: "podIP".into(), load_balancer_sku: "standardV2".into(), ..Config::default() }
}

fn lb_service(etp: &str) -> Service {
    Service {
        uid: "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01".into(),
        namespace: "default".into(),
        name: "web".into(),
        service_type: Some("LoadBalancer".into()),
        external_traffic_policy: Some(etp.into()),
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

/// A LoadBalancer Service of `ports` (protocol, port, target port) and annotations.
fn ported(uid: &str, ports: &[(Option<&str>, i32, Option<TargetPort>)], annotations: &[(&str, &str)]) -> Service {
    Service {
        uid: uid.into(),
        ports: ports
            .iter()
            .map(|(protocol, port, target)| ServicePort {
                name: None,
                protocol: protocol.map(str::to_owned),
                port: *port,
                target_port: target.clone(),
                node_port: None,
            })
            .collect(),
        annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..lb_service("Local")
    }
}

fn rule(proto: LbProtocol, frontend: u16, backend: u16, idle: u8) -> LbRule {
    let name = format!("rule-{}-{frontend}", if proto == LbProtocol::Udp { "udp" } else { "tcp" });
    LbRule {
        name: Name::from(name),
        protocol: proto,
        frontend_port: frontend,
        backend_port: backend,
        idle_timeout_minutes: idle,
        enable_tcp_reset: proto == LbProtocol::Tcp,
    }
}

fn admitted(service: &Service) -> bool {
    admit_service(&clb(), service) == Verdict::Admitted
}

fn refused_for(service: &Service) -> Option<String> {
    match admit_service(&clb(), service) {
        Verdict::Rejected(rejection) => Some(rejection.reason),
        _ => None,
    }
}

const TCP: Option<&str> = Some("TCP");
const UDP: Option<&str> = Some("UDP");
fn to(port: i32) -> Option<TargetPort> {
    Some(TargetPort::Number(port))
}

// Upstream TestExtractInboundConfigFromService_SingleTCPPort,
// TestBuildInboundServiceResources_WithConfig (the names, the pool and the rules; the SKUs and
// floating IP are the host's wire, tests/it/azure.rs), TestBuildInboundServiceResources_TCPHasResetEnabled,
// TestBuildInboundServiceResources_NoProbesForPodIPBackend (the model has no probe at all),
// TestBuildInboundServiceResources_LongServiceUID and TestBuildInboundServiceResources_MultipleConfigs.
// Upstream TestBuildInboundServiceResources_BackendPoolNaming,
// TestBuildInboundServiceResources_ResourceIDs, TestBuildInboundResourceNames,
// TestMultipleServicesIndependence and TestBackendPoolPopulation.
// Upstream TestCompleteServiceCreationWorkflow, its first half: ports 80->8080 and 443->8443
// become rule-tcp-80 and rule-tcp-443 to those backend ports, with public IP `<uid>-pip` and
// load balancer and pool named by the UID (the wire half is tests/it/azure.rs).
#[test]
fn a_service_s_load_balancer_is_named_by_its_uid_with_one_tcp_rule_per_port_to_its_target_port() {
    let long = "very-long-service-uid-that-exceeds-normal-length-abcdef123456789012345678901234567890";
    for (uid, ports, rules) in [
        ("service-uid-123", vec![(TCP, 80, to(8080)), (TCP, 443, to(8443))], vec![(80, 8080), (443, 8443)]),
        (long, vec![(TCP, 80, to(8080))], vec![(80, 8080)]),
        ("service-2", vec![(TCP, 443, to(8443))], vec![(443, 8443)]),
    ] {
        let service = ported(uid, &ports, &[]);
        assert!(admitted(&service));
        let config = LbConfig::for_service(&service);
        assert_eq!(config.public_ip, PublicIp { name: Name::from(format!("{uid}-pip")), version: IpVersion::Ipv4 });
        let expected = LoadBalancer {
            name: Name::from(uid),
            public_ip: Name::from(format!("{uid}-pip")),
            backend_pool: Name::from(uid),
            rules: rules.iter().map(|(f, b)| rule(LbProtocol::Tcp, *f, *b, 4)).collect(),
        };
        assert_eq!(config.load_balancer, expected);
        assert!(config.load_balancer.rules.iter().all(|r| r.enable_tcp_reset));
    }
}

// Upstream TestExtractInboundConfigFromService_MultiplePortsWithUDP,
// TestBuildInboundServiceResources_UDPProtocol, TestWorkflowWithUDPService, TestLBRuleNaming and
// TestRoundTripServiceToResourcesAndBack: rules in spec order, named `rule-<protocol>-<port>`, each
// frontend port to its backend port. A UDP rule has TCP reset off (upstream leaves it unset;
// false is what ARM reads for an unset one).
// Upstream TestBuildInboundServiceResources_SameBackendPortDifferentProtocolAllowed.
// Upstream TestExtractInboundConfigFromService_MixedTargetPorts, its UDP port: a UDP port among
// TCP ones keeps protocol UDP (its numeric, unset and named target ports are in
// a_named_target_port_is_refused_at_admission_and_never_becomes_a_rule).
#[test]
fn tcp_and_udp_ports_become_rules_in_spec_order_named_by_protocol_and_port_udp_without_tcp_reset() {
    let cases = [
        (
            vec![(TCP, 80, to(8080)), (UDP, 53, to(5353)), (TCP, 443, to(8443))],
            vec![
                rule(LbProtocol::Tcp, 80, 8080, 4),
                rule(LbProtocol::Udp, 53, 5353, 4),
                rule(LbProtocol::Tcp, 443, 8443, 4),
            ],
        ),
        (
            vec![(UDP, 53, to(5353)), (TCP, 53, to(5353))],
            vec![rule(LbProtocol::Udp, 53, 5353, 4), rule(LbProtocol::Tcp, 53, 5353, 4)],
        ),
        (
            vec![(TCP, 80, to(3000)), (TCP, 443, to(3443)), (TCP, 50051, to(50051))],
            vec![
                rule(LbProtocol::Tcp, 80, 3000, 4),
                rule(LbProtocol::Tcp, 443, 3443, 4),
                rule(LbProtocol::Tcp, 50051, 50051, 4),
            ],
        ),
    ];
    for (ports, rules) in cases {
        let service = ported("u", &ports, &[]);
        assert!(admitted(&service), "{ports:?}");
        assert_eq!(LbConfig::for_service(&service).load_balancer.rules, rules);
    }
    let udp = rule(LbProtocol::Udp, 53, 5353, 4);
    assert_eq!(udp.name.as_str(), "rule-udp-53");
    assert!(!udp.enable_tcp_reset);
}

// Upstream TestExtractInboundConfigFromService_NoTargetPort, TestExtractInboundConfigFromService_EmptyProtocol:
// no targetPort sends to the port itself, no protocol is TCP (the API server's defaults).
// Upstream TestWorkflowWithMinimalService.
#[test]
fn a_port_without_target_port_sends_to_itself_and_one_without_protocol_is_tcp() {
    let service = ported("u", &[(TCP, 80, None), (None, 81, to(8081))], &[]);
    assert!(admitted(&service));
    let rules = LbConfig::for_service(&service).load_balancer.rules;
    assert_eq!(rules, vec![rule(LbProtocol::Tcp, 80, 80, 4), rule(LbProtocol::Tcp, 81, 8081, 4)]);
}

// Upstream TestExtractInboundConfigFromService_MixedTargetPorts and
// TestWorkflowWithComplexPortMapping. Deliberately different: upstream programs a named
// targetPort as the frontend port (wrong for pod IP backends, which receive on the container
// port); here such a Service is refused at admission, with its reason, and no rule is built.
// Upstream TestExtractInboundConfigFromService_NamedTargetPort (differs: a named targetPort is refused
// at admission), TestExtractInboundConfigFromService_NamedTargetPortRecorded and
// TestBuildInboundServiceResources_NamedTargetPortRejected.
#[test]
fn a_named_target_port_is_refused_at_admission_and_never_becomes_a_rule() {
    let service = ported(
        "u",
        &[(TCP, 80, to(8080)), (TCP, 9090, None), (TCP, 9091, Some(TargetPort::Name("metrics-port".into())))],
        &[],
    );
    assert_eq!(refused_for(&service).as_deref(), Some(crate::admission::reason::UNSUPPORTED_NAMED_TARGET_PORT));
    let rules = LbConfig::for_service(&service).load_balancer.rules;
    assert_eq!(rules, vec![rule(LbProtocol::Tcp, 80, 8080, 4), rule(LbProtocol::Tcp, 9090, 9090, 4)]);
}

// Upstream TestBuildInboundServiceResources_LowercaseUDP. Deliberately different: the API
// server only ever sends `TCP`, `UDP` or `SCTP`, so a lowercase protocol is not a Kubernetes
// Service; admission refuses it rather than guess.
#[test]
fn a_lowercase_protocol_is_refused_at_admission() {
    let service = ported("u", &[(Some("udp"), 53, to(5353))], &[]);
    assert_eq!(refused_for(&service).as_deref(), Some(crate::admission::reason::UNSUPPORTED_PROTOCOL));
}

// Upstream TestBuildInboundServiceResources_AppliesIdleTimeout,
// TestExtractInboundConfigFromService_ExtractsIdleTimeout and TestIdleTimeout_AdmissionAndBuildAgree:
// the annotation sets every rule's idle timeout; absent, Azure's 4 minutes; an unusable value is
// refused with InvalidIdleTimeout, never built with a default; and whatever admission takes the
// build programs exactly. The range here is 4 to 30 minutes (admission::IDLE_TIMEOUT_MINUTES).
// Upstream TestBuildInboundServiceResources_IdleTimeoutOutOfRangeErrors.
#[test]
fn the_idle_timeout_annotation_sets_every_rule_and_admission_and_the_build_agree_on_it() {
    let key = crate::admission::ANNOTATION_IDLE_TIMEOUT;
    let service = ported("u", &[(TCP, 80, to(8080)), (UDP, 53, to(53))], &[(key, "30")]);
    assert!(admitted(&service));
    let rules = LbConfig::for_service(&service).load_balancer.rules;
    assert!(rules.iter().all(|r| r.idle_timeout_minutes == 30), "{rules:?}");
    let plain = ported("u", &[(TCP, 80, to(8080))], &[]);
    assert_eq!(LbConfig::for_service(&plain).load_balancer.rules[0].idle_timeout_minutes, 4);
    for value in ["0", "3", "101", "not-a-number"] {
        let service = ported("u", &[(TCP, 80, to(8080))], &[(key, value)]);
        assert_eq!(refused_for(&service).as_deref(), Some(crate::admission::reason::INVALID_IDLE_TIMEOUT), "{value}");
    }
    for minutes in ["4", "5", "30", "31", "60", "100", "101"] {
        let service = ported("u", &[(TCP, 80, to(8080))], &[(key, minutes)]);
        if admitted(&service) {
            let programmed = LbConfig::for_service(&service).load_balancer.rules[0].idle_timeout_minutes;
            assert_eq!(programmed.to_string(), minutes, "admitted, so built with exactly it");
        } else {
            assert!(
                minutes.parse::<i64>().is_ok_and(|m| !crate::admission::IDLE_TIMEOUT_MINUTES.contains(&m)),
                "{minutes}"
            );
        }
    }
}

// Upstream TestBuildInboundServiceResources_BackendPortMaxIsValid,
// TestBuildInboundServiceResources_BackendPortOutOfRangeErrors and
// TestBuildInboundServiceResources_DistinctBackendPortsAllowed: a backend port of 65535 builds,
// 65536 is refused (here at admission, before anything is written), two ports to distinct
// backend ports of one protocol make two rules.
#[test]
fn backend_ports_up_to_65535_build_one_past_is_refused_and_distinct_backends_make_distinct_rules() {
    let max = ported("u", &[(TCP, 80, to(65535))], &[]);
    assert!(admitted(&max));
    assert_eq!(LbConfig::for_service(&max).load_balancer.rules, vec![rule(LbProtocol::Tcp, 80, 65535, 4)]);
    let past = ported("u", &[(TCP, 80, to(65536))], &[]);
    assert_eq!(refused_for(&past).as_deref(), Some(crate::admission::reason::INVALID_PORT));
    let two = ported("u", &[(TCP, 80, to(8080)), (TCP, 443, to(8443))], &[]);
    assert!(admitted(&two));
    assert_eq!(LbConfig::for_service(&two).load_balancer.rules.len(), 2);
}

// Upstream TestProcessK8sServices_ExcludesServicesNotOwnedByServiceGateway.
#[test]
fn a_service_that_becomes_invalid_keeps_its_last_admitted_spec_and_gets_one_warning() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    assert!(
        tracker
            .observe(0, vec![Observation::ServiceUpserted(lb_service("Local"))])
            .commands
            .iter()
            .all(|c| !matches!(c.command, Command::EmitEvent(_)))
    );
    let step = tracker.observe(1, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
    let events: Vec<&Event> = step
        .commands
        .iter()
        .filter_map(|c| if let Command::EmitEvent(e) = &c.command { Some(e) } else { None })
        .collect();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "UnsupportedExternalTrafficPolicy");
    assert!(events[0].message.contains("keeps its last admitted configuration"));
    assert_eq!(tracker.admitted_spec("default", "web").unwrap().external_traffic_policy.as_deref(), Some("Local"));
    let again = tracker.observe(2, vec![Observation::ServiceUpserted(lb_service("Cluster"))]);
    assert!(again.commands.iter().all(|c| !matches!(c.command, Command::EmitEvent(_))));
}

#[test]
fn nothing_but_a_read_of_nrp_is_sent_before_the_lists_are_complete() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local"))]);
    assert_eq!(step.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), vec![&Command::ReadNrp]);
}

// Upstream TestRuntimeEnablementAndLoadBalancer (differs: CLB mode comes from podIP and standardV2,
// there is no enable flag).
#[test]
fn outside_clb_mode_the_tracker_sends_nothing_and_is_idle_at_once() {
    let multi_slb = Config {
        backend_pool_type: "nodeIP".into(),
        multiple_standard_load_balancers: vec!["kubernetes".into()],
        ..Config::default()
    };
    let mut tracker = Tracker::create(multi_slb).unwrap();
    let step = tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    assert!(step.commands.is_empty(), "{:?}", step.commands);
    assert!(step.idle);
    assert_eq!(step.wake_at_ms, None);
    assert!(tracker.tick(60_000).idle);
}

#[test]
fn backoff_doubles_from_one_second_to_a_thirty_second_cap_with_bounded_jitter() {
    for (attempt, base) in [(1, 1_000), (2, 2_000), (3, 4_000), (5, 16_000), (6, 30_000), (40, 30_000)] {
        let delay = backoff_ms("uid", attempt, None);
        assert!(delay >= base && delay <= base + base / 5, "attempt {attempt}: {delay}");
        assert_eq!(delay, backoff_ms("uid", attempt, None), "deterministic");
    }
    assert_eq!(backoff_ms("uid", 1, Some(45_000)), 45_000, "Retry-After wins when longer");
}

// Regression: Retry-After was never capped.
#[test]
fn a_retry_after_is_honoured_up_to_the_resync_period_and_no_further() {
    assert_eq!(backoff_ms("uid", 1, Some(timing::RETRY_AFTER_CAP_MS)), timing::RETRY_AFTER_CAP_MS);
    assert_eq!(backoff_ms("uid", 1, Some(timing::RETRY_AFTER_CAP_MS + 1)), timing::RETRY_AFTER_CAP_MS);
    assert_eq!(backoff_ms("uid", 40, Some(u64::MAX)), timing::RETRY_AFTER_CAP_MS);
    assert_eq!(timing::RETRY_AFTER_CAP_MS, timing::RESYNC_INTERVAL_MS);
}

const NOW: u64 = 1_700_000_000_000;

const UID: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01";

fn throttled(retry_after_ms: u64) -> Outcome {
    Outcome::Failed(Failure {
        status: 429,
        code: None,
        retry_after_ms: Some(retry_after_ms),
        message: "throttled".into(),
    })
}

/// What Azure and the API server answer when all goes well; NRP lists `registered`.
fn answer_ok(registered: &[&str]) -> impl Fn(&Command) -> Outcome {
    let services: Vec<NrpService> = registered
        .iter()
        .map(|name| NrpService {
            name: (*name).into(),
            service_type: "Inbound".into(),
            backend_pools: vec![],
            is_default: false,
        })
        .collect();
    move |command| match command {
        Command::PutPublicIp(_) => Outcome::PublicIpAddress("20.0.0.1".into()),
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState { services: services.clone(), locations: vec![] }),
        _ => Outcome::Ok,
    }
}

/// Runs `step`'s commands and every command that follows at `now`, answered by `answer`;
/// returns them all, every log line, and the last step.
fn drive(
    tracker: &mut Tracker,
    now: u64,
    mut step: Step,
    mut answer: impl FnMut(&Command) -> Outcome,
) -> (Vec<Command>, Vec<LogLine>, Step) {
    let (mut issued, mut logs) = (Vec::new(), Vec::new());
    for _ in 0..1_000 {
        logs.extend(step.logs.iter().cloned());
        if step.commands.is_empty() {
            return (issued, logs, step);
        }
        let results = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        issued.extend(step.commands.iter().map(|c| c.command.clone()));
        step = tracker.complete(now, results);
    }
    panic!("the tracker kept issuing commands: {:?}", &issued[issued.len() - 10..]);
}

fn is_location_update(command: &Command) -> bool {
    matches!(command, Command::UpdateAddressLocations(_))
}

/// A slice of the test Service with one ready endpoint per `(address, node)`.
fn slice_on(endpoints: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice {
        namespace: "default".into(),
        name: "web-1".into(),
        owner_service_uid: Some(UID.into()),
        address_type: "IPv4".into(),
        endpoints: endpoints
            .iter()
            .map(|(address, node)| Endpoint {
                addresses: vec![(*address).into()],
                node_name: Some((*node).into()),
                ready: Some(true),
            })
            .collect(),
        deleting: false,
    }
}

/// Answers `step`'s commands and those that follow at `now` as all going well, except the
/// address-location batches: left in flight and returned (id, the locations they cover).
fn drive_holding_batches(tracker: &mut Tracker, now: u64, step: Step) -> Vec<(u64, Vec<String>)> {
    let (ok, mut held, mut step) = (answer_ok(&[UID]), Vec::new(), step);
    while !step.commands.is_empty() {
        let mut results = Vec::new();
        for issued in &step.commands {
            match &issued.command {
                Command::UpdateAddressLocations(batch) => {
                    held.push((issued.id, batch.iter().map(|l| l.location.clone()).collect()));
                }
                command => results.push((issued.id, ok(command))),
            }
        }
        step = tracker.complete(now, results);
    }
    held
}

/// The test Service provisioned with a pod on node n1 (location 10.224.0.4; node n2 is
/// 10.224.0.5), its first address-location batch in flight, unanswered.
fn tracker_with_a_batch_in_flight() -> (Tracker, u64) {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node =
        |name: &str, ip: &str| Observation::NodeUpserted(Node { name: name.into(), internal_ips: vec![ip.into()] });
    let step = tracker.observe(
        NOW,
        vec![
            node("n1", "10.224.0.4"),
            node("n2", "10.224.0.5"),
            Observation::ServiceUpserted(lb_service("Local")),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let held = drive_holding_batches(&mut tracker, NOW, step);
    assert_eq!(held.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(), [vec!["10.224.0.4".to_owned()]]);
    (tracker, held[0].0)
}

fn load_balancers(issued: &[Command]) -> Vec<&LoadBalancer> {
    issued.iter().filter_map(|c| if let Command::PutLoadBalancer(lb) = c { Some(lb) } else { None }).collect()
}

fn put_in(step: &Step) -> Option<(u64, LoadBalancer)> {
    step.commands.iter().find_map(|c| match &c.command {
        Command::PutLoadBalancer(lb) => Some((c.id, lb.clone())),
        _ => None,
    })
}

/// The test Service (ETP Local, no endpoints), created, all commands answered.
fn created_local() -> Tracker {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    tracker
}

/// `service` as the API server sends it once it is Terminating, our finalizer still on it.
fn terminating(service: Service) -> Service {
    Service { deleting: true, finalizers: vec![FINALIZER.into()], ..service }
}

/// [`created_with`]`(&[(80, 8080)])`'s Service, Terminating.
fn terminating_web() -> Service {
    terminating(ported(UID, &[(TCP, 80, to(8080))], &[]))
}

/// The test Service with `ports` (protocol TCP, port, target port), created and in NRP with
/// a pod on n1 (10.224.0.4), all commands answered.
fn created_with(ports: &[(i32, i32)]) -> Tracker {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
    let spec = ported(UID, &ports.iter().map(|(p, t)| (TCP, *p, to(*t))).collect::<Vec<_>>(), &[]);
    let step = tracker.observe(
        NOW,
        vec![
            node,
            Observation::ServiceUpserted(spec),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            Observation::ListsComplete,
        ],
    );
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!(load_balancers(&issued).len(), 1, "{issued:?}");
    tracker
}

fn respec(tracker: &mut Tracker, now: u64, ports: &[(i32, i32)]) -> Step {
    let spec = ported(UID, &ports.iter().map(|(p, t)| (TCP, *p, to(*t))).collect::<Vec<_>>(), &[]);
    tracker.observe(now, vec![Observation::ServiceUpserted(spec)])
}

fn failed(status: u16) -> Outcome {
    Outcome::Failed(Failure { status, code: None, retry_after_ms: None, message: format!("HTTP {status}") })
}

fn finalizer_change(step: &Step) -> Option<(u64, bool)> {
    step.commands.iter().find_map(|c| match c.command {
        Command::SetFinalizer { present, .. } => Some((c.id, present)),
        _ => None,
    })
}

/// A tracker whose Service's first command (adding the finalizer) failed at [`NOW`].
fn tracker_retrying_its_finalizer() -> (Tracker, Step) {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let step = tracker.complete(NOW, vec![(step.commands[0].id, answer_ok(&[])(&Command::ReadNrp))]);
    let (id, _) = finalizer_change(&step).unwrap();
    let step = tracker.complete(NOW, vec![(id, failed(500))]);
    (tracker, step)
}

fn corrupt(result: Result<Tracker, StateError>) -> String {
    match result {
        Err(StateError::Corrupt(why)) => why,
        other => panic!("expected a corrupt state, got {other:?}"),
    }
}

/// A tracker with Service commands, an Event and nothing else in flight: the lists are in,
/// NRP was read, and the Service's first command (its finalizer) waits for its outcome.
fn tracker_with_commands_in_flight() -> Tracker {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).unwrap().id;
    let step = tracker.complete(1, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
    assert!(step.commands.iter().any(|c| matches!(c.command, Command::SetFinalizer { .. })), "{step:?}");
    tracker
}

/// The locations of every address-location update among `issued`, with their addresses.
fn programmed(issued: &[Command]) -> Vec<(String, Vec<String>)> {
    issued
        .iter()
        .filter_map(|c| match c {
            Command::UpdateAddressLocations(locations) => Some(locations),
            _ => None,
        })
        .flatten()
        .map(|l| (l.location.clone(), l.addresses.iter().map(|a| a.address.clone()).collect()))
        .collect()
}

/// A tracker with `lb_service` registered and one endpoint on each of nodes n4…n7
/// (locations 10.224.0.4…7), and the step that starts programming them.
fn four_locations() -> (Tracker, Step) {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let mut observations: Vec<Observation> = (4..8)
        .map(|i| Observation::NodeUpserted(Node { name: format!("n{i}"), internal_ips: vec![format!("10.224.0.{i}")] }))
        .collect();
    let endpoints: Vec<(String, String)> = (4..8).map(|i| (format!("10.244.0.{i}"), format!("n{i}"))).collect();
    let slice = slice_on(&endpoints.iter().map(|(a, n)| (a.as_str(), n.as_str())).collect::<Vec<_>>());
    observations.extend([
        Observation::ServiceUpserted(lb_service("Local")),
        Observation::SliceUpserted(slice),
        Observation::ListsComplete,
    ]);
    let step = tracker.observe(NOW, observations);
    (tracker, step)
}

fn batch_locations(step: &Step) -> Vec<(u64, Vec<String>)> {
    step.commands
        .iter()
        .filter_map(|c| match &c.command {
            Command::UpdateAddressLocations(ls) => Some((c.id, ls.iter().map(|l| l.location.clone()).collect())),
            _ => None,
        })
        .collect()
}

/// Answers everything but address-location batches until the first batch is issued.
fn drive_holding_batches_until_first(tracker: &mut Tracker, mut step: Step) -> (Vec<Command>, Vec<LogLine>, Step) {
    let ok = answer_ok(&[UID]);
    let mut issued = Vec::new();
    for _ in 0..100 {
        if !batch_locations(&step).is_empty() || step.commands.is_empty() {
            return (issued, Vec::new(), step);
        }
        issued.extend(step.commands.iter().map(|c| c.command.clone()));
        let results = step.commands.iter().map(|c| (c.id, ok(&c.command))).collect();
        step = tracker.complete(NOW, results);
    }
    panic!("no address-location batch: {issued:?}");
}

fn refused_for_good() -> Outcome {
    Outcome::Failed(Failure {
        status: 400,
        code: Some("InvalidParameter".into()),
        retry_after_ms: None,
        message: "bad rule".into(),
    })
}

fn warned_rejected(issued: &[Command]) -> bool {
    issued
        .iter()
        .any(|c| matches!(c, Command::EmitEvent(e) if e.reason == reason::LOAD_BALANCER_CONFIGURATION_REJECTED))
}

/// Runs `step` answered by `answer_ok`, holding in flight the first command `hold` matches
/// (the rest are answered); returns that command with its id.
fn drive_holding(tracker: &mut Tracker, now: u64, mut step: Step, hold: impl Fn(&Command) -> bool) -> (u64, Command) {
    let ok = answer_ok(&[]);
    for _ in 0..1_000 {
        assert!(!step.commands.is_empty(), "the command to hold was never issued");
        let held = step.commands.iter().find(|c| hold(&c.command)).map(|c| (c.id, c.command.clone()));
        let results = step.commands.iter().filter(|c| Some(c.id) != held.as_ref().map(|h| h.0));
        let results = results.map(|c| (c.id, ok(&c.command))).collect();
        step = tracker.complete(now, results);
        if let Some(held) = held {
            drive(tracker, now, step, &ok);
            return held;
        }
    }
    panic!("the tracker kept issuing commands");
}

fn is_put_load_balancer(command: &Command) -> bool {
    matches!(command, Command::PutLoadBalancer(_))
}

/// The test Service (port 80 → 8080, a ready pod on n1) brought to `phase`, with the command
/// that keeps it there held in flight (for `NotStarted`, whose lists are not complete, the
/// read of NRP; none for `Created`).
fn in_phase(phase: Phase) -> (Tracker, Option<(u64, Command)>) {
    let (tracker, held) = match phase {
        Phase::NotStarted => {
            let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
            let node = Observation::NodeUpserted(Node { name: "n1".into(), internal_ips: vec!["10.224.0.4".into()] });
            let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
            let slice = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")]));
            let step = tracker.observe(NOW, vec![node, Observation::ServiceUpserted(spec), slice]);
            let read = step.commands.iter().map(|c| (c.id, c.command.clone())).collect::<Vec<_>>();
            assert_eq!(read.iter().map(|(_, c)| c).collect::<Vec<_>>(), [&Command::ReadNrp], "nothing else");
            (tracker, read.into_iter().next())
        }
        Phase::CreationInProgress => {
            let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
            let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
            let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec), Observation::ListsComplete]);
            let held = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
            (tracker, Some(held))
        }
        Phase::Created => (created_with(&[(80, 8080)]), None),
        Phase::UpdateInProgress => {
            let mut tracker = created_with(&[(80, 8080)]);
            let step = respec(&mut tracker, NOW, &[(80, 8081)]);
            let held = drive_holding(&mut tracker, NOW, step, is_put_load_balancer);
            (tracker, Some(held))
        }
        Phase::DeletionPending | Phase::DeletionInProgress => {
            let mut tracker = created_with(&[(80, 8080)]);
            let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
            let cluster_ip = Service { service_type: Some("ClusterIP".into()), ..spec };
            let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(cluster_ip)]);
            let (drain, batch) = drive_holding(&mut tracker, NOW, step, is_location_update);
            if phase == Phase::DeletionPending {
                (tracker, Some((drain, batch)))
            } else {
                let step = tracker.complete(NOW, vec![(drain, Outcome::Ok)]);
                let unlink = drive_holding(&mut tracker, NOW, step, |c| matches!(c, Command::UpdateServices(_)));
                (tracker, Some(unlink))
            }
        }
    };
    assert_eq!(tracker.phase(UID), Some(phase));
    (tracker, held)
}

/// Answers `held` and the commands of `pending`, and runs everything that follows, the lists
/// completed if they were not; returns every command `pending` and the rest issued.
fn finish(tracker: &mut Tracker, now: u64, held: Option<(u64, Command)>, mut pending: Step) -> Vec<Command> {
    let ok = answer_ok(&[]);
    pending.commands.extend(tracker.observe(now, vec![Observation::ListsComplete]).commands);
    if let Some((id, command)) = held {
        pending.commands.extend(tracker.complete(now, vec![(id, ok(&command))]).commands);
    }
    drive(tracker, now, pending, ok).0
}

const PHASES: [Phase; 6] = [
    Phase::NotStarted,
    Phase::CreationInProgress,
    Phase::Created,
    Phase::UpdateInProgress,
    Phase::DeletionPending,
    Phase::DeletionInProgress,
];

// Upstream TestGuardStateTransitions_UpdateServiceDispatch, TestEngineUpdateService_IgnoredDuringDeletion
// and TestGuardStateTransitions_CreateAfterDelete_BuffersRecreate: a spec change in each
// phase. Every phase records the new spec; only a created Service starts an update at once
// (one PUT of the new spec); a creation or an update in flight keeps its phase and sends
// nothing more; a deletion goes on and remembers to provision the Service again. And in every
// phase the Service ends created with the new spec: nothing serves the old one after an edit.
// Upstream TestUpdateService_RecreateAfterDeletionReplays and TestEngineAddService_AlreadyTracked.
#[test]
fn a_spec_change_in_each_phase_is_recorded_and_only_a_created_service_starts_an_update() {
    for phase in PHASES {
        let (mut tracker, held) = in_phase(phase);
        let step = respec(&mut tracker, NOW + 1, &[(80, 9090)]);
        let after = if phase == Phase::Created { Phase::UpdateInProgress } else { phase };
        assert_eq!(tracker.phase(UID), Some(after), "{phase:?}");
        let put = put_in(&step);
        assert_eq!(put.is_some(), phase == Phase::Created, "{phase:?}: {:?}", step.commands);
        assert!(put.is_none_or(|(_, lb)| lb.rules[0].backend_port == 9090));
        let lifecycle = &tracker.inbound.lifecycles[UID];
        let desired = lifecycle.desired.as_ref().expect("a spec is wanted");
        assert_eq!(desired.load_balancer.rules[0].backend_port, 9090, "{phase:?}: the new spec is recorded");
        assert_eq!(lifecycle.recreate, phase.is_deleting(), "{phase:?}");

        let issued = finish(&mut tracker, NOW + 2, held, step);
        assert_eq!(tracker.phase(UID), Some(Phase::Created), "{phase:?}: {issued:?}");
        let lifecycle = &tracker.inbound.lifecycles[UID];
        assert_eq!(lifecycle.applied, lifecycle.desired, "{phase:?}");
        let last = load_balancers(&issued).last().map(|lb| lb.rules[0].backend_port);
        assert_eq!(last, Some(9090), "{phase:?}: the last PUT is of the new spec: {issued:?}");
    }
}

const ADDRESS: &str = "20.0.0.7";

/// `lb_service` as a controller that provisioned it left it: finalizer held, status set.
fn provisioned_service() -> Service {
    Service { finalizers: vec![FINALIZER.into()], ingress_ips: vec![ADDRESS.into()], ..lb_service("Local") }
}

fn inventory_of(service: &Service, load_balancer: Option<LoadBalancer>) -> ArmInventory {
    let config = LbConfig::for_service(service);
    ArmInventory {
        nat_gateways: Vec::new(),
        public_ips: vec![ListedPublicIp {
            name: config.public_ip.name.to_string(),
            version: config.public_ip.version,
            address: Some(ADDRESS.into()),
            as_put: true,
        }],
        load_balancers: load_balancer
            .map(|lb| ListedLoadBalancer { name: lb.name.to_string(), shape: Some(lb) })
            .into_iter()
            .collect(),
    }
}

/// [`drive`] with NRP listing `registered` and ARM answering `arm`.
fn reads_answered(
    tracker: &mut Tracker,
    step: &Step,
    registered: &[&str],
    arm: Outcome,
) -> (Vec<Command>, Vec<LogLine>, Step) {
    let nrp = answer_ok(registered);
    drive(tracker, NOW, step.clone(), |c| if *c == Command::ReadArm { arm.clone() } else { nrp(c) })
}

fn writes(issued: &[Command]) -> Vec<&Command> {
    issued.iter().filter(|c| !matches!(c, Command::EmitEvent(_) | Command::ReadNrp | Command::ReadArm)).collect()
}

fn budgeted(change: impl FnOnce(&mut crate::budget::WriteBudgets)) -> Config {
    let mut budgets = crate::budget::WriteBudgets::DEFAULT;
    change(&mut budgets);
    Config { write_budgets: Some(budgets), ..clb() }
}

/// A tracker under `locations` as its address-location budget, having seen `nodes` nodes
/// (n1 at 10.224.0.1, …) and the test Service with one pod on n1, and its first step.
fn with_address_budget(locations: crate::budget::Budget, nodes: u8) -> (Tracker, Step) {
    let mut tracker = Tracker::create_with_arm_settled(budgeted(|b| b.update_address_locations = locations)).unwrap();
    let mut observations: Vec<Observation> = (1..=nodes)
        .map(|i| Observation::NodeUpserted(Node { name: format!("n{i}"), internal_ips: vec![format!("10.224.0.{i}")] }))
        .collect();
    observations.extend([
        Observation::ServiceUpserted(lb_service("Local")),
        Observation::SliceUpserted(slice_on(&[("10.244.0.1", "n1")])),
        Observation::ListsComplete,
    ]);
    let step = tracker.observe(NOW, observations);
    (tracker, step)
}

mod arm_pace;
mod clock_and_state;
mod late_writes;
mod phases_and_startup;
mod provisioning;
mod retries;
mod state_fixtures;

// Ports of upstream tests that pin one lifecycle step or transition, beside the helpers
// above; their own files keep this one readable.
mod upstream_lifecycle;
mod upstream_metrics;
mod upstream_outbound;
mod upstream_pod_finalizers;
mod upstream_startup;
