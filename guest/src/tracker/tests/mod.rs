//! The tracker's own tests: shared helpers here; each file beside this one is one theme, and the
//! `upstream_*` files port upstream's tests of one area each.

use super::*;

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
        assert_eq!(
            refused_for(&service).as_deref(),
            Some(crate::admission::reason::INVALID_IDLE_TIMEOUT),
            "{value}"
        );
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
    let step =
        tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
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

mod clock_and_state;
mod phases_and_startup;
mod provisioning;
mod retries;
use clock_and_state::*;
use phases_and_startup::*;
use provisioning::*;
use retries::*;

// Ports of upstream tests that pin one lifecycle step or transition, beside the helpers
// above; their own files keep this one readable.
mod upstream_lifecycle;
mod upstream_startup;
mod upstream_outbound;
mod upstream_pod_finalizers;
