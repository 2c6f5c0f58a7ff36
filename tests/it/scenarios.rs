//! The scenarios (`examples/scenarios/`, `tests/scenarios/`) through `simulate`: each holds under
//! the component, the native library issues the very same commands, bad files are refused with
//! the line, and the executor hands every Azure and Kubernetes error to the guest unchanged.

use super::cli::clb_host;
use clb_azure::{AzureError, ErrorKind, Operation};
use clb_emulator::scope;
use clb_emulator::{AsyncOutcome, Emulator, Fault, FaultMode};
use clb_executor::{Executor, INVALID_COMMAND, MAX_BATCH, UID_MISMATCH, azure_failure};
use clb_host::cli::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_simulator::cluster::{Cluster, Object};
use clb_simulator::scenario;
use clb_simulator::simulate::{self, ComponentReconciler, ScenarioReport};
use clb_tests::*;
use std::time::Duration;

fn run_component(path: &std::path::Path) -> ScenarioReport {
    let scenario = scenario::read(path).unwrap_or_else(|e| panic!("{e}"));
    simulate::run(&scenario, &mut component_reconciler()).unwrap_or_else(|e| panic!("{e}"))
}

/// The quick-start story the tests below edit (a CLB-mode Service with an ingress IP).
fn first_service_scenario() -> std::path::PathBuf {
    scenario_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-first-service-with-endpoints-gets-a-load-balancer"))
        .expect("the quick-start scenario")
}

fn rendered(report: &ScenarioReport) -> String {
    let mut text = Vec::new();
    simulate::render(report, &mut text).unwrap();
    String::from_utf8(text).unwrap()
}

#[test]
fn every_scenario_holds_under_the_component() {
    let files = scenario_files();
    assert!(files.len() >= 17, "{files:?}");
    for path in files {
        let report = run_component(&path);
        assert!(report.passed, "{}", rendered(&report));
    }
}

/// The native library has one version and cannot swap: a scenario with a `swap` step is
/// compared up to it. In multi-SLB local-service mode the tracker sends no commands: the work is
/// the backend-pool updater's, which runs the native library's `place-service` and queue here
/// (`NativePools`), so what is compared there is what the producer enqueued and what each tick
/// did, the Azure calls and the Events.
#[test]
fn the_native_library_issues_the_same_command_stream_and_reports_the_same_figures_as_the_component_on_every_scenario() {
    let (mut compared, mut pooled) = (0, 0);
    for path in scenario_files() {
        let mut scenario = scenario::read(&path).unwrap();
        compared += 1;
        if let Some(first) =
            scenario.steps.iter().position(|s| matches!(s, scenario::Step::Swap(_) | scenario::Step::Shadow(_)))
        {
            scenario.steps.truncate(first);
        }
        let component = simulate::run(&scenario, &mut component_reconciler()).unwrap();
        let native = simulate::run(&scenario, &mut NativeReconciler::default()).unwrap();
        if scenario.config.multiple_standard_load_balancers.is_empty() {
            assert!(!component.command_stream().is_empty(), "{}", path.display());
        } else {
            pooled += 1;
            assert!(!component.pool_stream().is_empty(), "{}", path.display());
        }
        assert_eq!(component.command_stream(), native.command_stream(), "{}", path.display());
        assert_eq!(
            component.pool_stream(),
            native.pool_stream(),
            "{}: the pool updater's work differs",
            path.display()
        );
        assert_eq!(component.azure_calls, native.azure_calls, "{}", path.display());
        assert_eq!(component.events, native.events, "{}", path.display());
        assert_eq!(component.passed, native.passed, "{}", path.display());
        assert_eq!(native.aborted, None, "{}", path.display());
        assert!(component.figures.is_some(), "{}", path.display());
        assert_eq!(component.figures, native.figures, "{}: the logic's figures differ", path.display());
    }
    assert!(compared >= 24 && pooled >= 5, "{compared} scenarios, {pooled} in multi-SLB mode");
}

/// A multi-SLB scenario passes under the native library too, on its own (not only as the
/// component does): the native `place-service` and queue carry it.
#[test]
fn every_multi_slb_scenario_passes_under_the_native_library() {
    let mut ran = 0;
    for path in scenario_files() {
        let scenario = scenario::read(&path).unwrap();
        if scenario.config.multiple_standard_load_balancers.is_empty() {
            continue;
        }
        ran += 1;
        let report = simulate::run(&scenario, &mut NativeReconciler::default()).unwrap();
        assert!(report.passed, "{}", rendered(&report));
    }
    assert!(ran >= 5, "{ran}");
}

/// A reconciler with no backend-pool logic (the fuzz seed generator's recorder is one).
struct TrackerOnly(NativeReconciler);

impl clb_sandbox::logic::Logic for TrackerOnly {
    type Error = simulate::LogicError;

    fn start(&mut self, config: &wit::Config) -> Result<(), simulate::LogicError> {
        self.0.start(config)
    }
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, simulate::LogicError> {
        self.0.observe(now_ms, batch)
    }
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, simulate::LogicError> {
        self.0.complete(now_ms, results, arm_remaining_writes)
    }
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, simulate::LogicError> {
        self.0.tick(now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, simulate::LogicError> {
        self.0.stats(now_ms)
    }
}

impl simulate::Reconciler for TrackerOnly {
    fn pools(&mut self) -> Option<&mut dyn simulate::PoolReconciler> {
        None
    }
    fn supervised(&mut self) -> Option<&mut dyn simulate::Supervised> {
        None
    }
}

#[test]
fn a_multi_slb_scenario_under_a_reconciler_without_pool_logic_stops_saying_so() {
    let path = scenario_files()
        .into_iter()
        .find(|p| !scenario::read(p).unwrap().config.multiple_standard_load_balancers.is_empty())
        .expect("a multi-SLB scenario");
    let report = simulate::run(&scenario::read(&path).unwrap(), &mut TrackerOnly(NativeReconciler::default())).unwrap();
    assert!(!report.passed);
    assert!(
        report.aborted.as_deref().is_some_and(|why| why.contains("has no backend-pool logic")),
        "{:?}",
        report.aborted
    );
}

/// The example scenario whose file name contains `fragment`, with `steps` (YAML at the indent
/// of its step list) appended, run under the component.
fn extended(fragment: &str, steps: &str) -> ScenarioReport {
    let path = scenario_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains(fragment))
        .unwrap_or_else(|| panic!("a scenario named like {fragment}"));
    let mut text = std::fs::read_to_string(&path).unwrap();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(steps);
    let scenario = scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let original = scenario::read(&path).unwrap().steps.len();
    assert!(scenario.steps.len() > original, "the steps were appended");
    simulate::run(&scenario, &mut component_reconciler()).unwrap_or_else(|e| panic!("{e}"))
}

const WEB_UID: &str = "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a01";

/// An `apply` step of shop/web's EndpointSlice `web-abc12` with `endpoints` (`address@node`).
fn web_slice(endpoints: &[&str]) -> String {
    let mut text = format!(
        "  - apply:\n      - apiVersion: discovery.k8s.io/v1\n        kind: EndpointSlice\n        metadata:\n          \
         name: web-abc12\n          namespace: shop\n          uid: 7b2a1d9f-3c4e-4f60-9bac-1d2e3f4a5b01\n          \
         ownerReferences: [{{apiVersion: v1, kind: Service, name: web, uid: {WEB_UID}}}]\n        addressType: IPv4\n        \
         endpoints:\n"
    );
    for endpoint in endpoints {
        let (address, node) = endpoint.split_once('@').unwrap();
        text.push_str(&format!("          - {{addresses: [\"{address}\"], nodeName: {node}}}\n"));
    }
    text
}

// Upstream TestReconcileNodeIPChange "node addition registers a pod dropped while its node was
// uncached": a live Service's slice names a node not known yet; its pod stays out of NRP until the
// Node appears, and is then programmed at the Node's IP.
#[test]
fn a_pod_on_a_node_not_yet_known_is_programmed_once_the_node_appears() {
    let steps = format!(
        "{}  - settle:\n  - expect:\n      nrp:\n        locations:\n          \
         10.224.0.4: {{10.244.1.10: [{WEB_UID}]}}\n          10.224.0.9: {{10.244.2.10: [{WEB_UID}]}}\n      \
         invariants: true\n  - apply:\n      - apiVersion: v1\n        kind: Node\n        metadata: {{name: aks-node-3}}\n        \
         status: {{addresses: [{{type: InternalIP, address: 10.224.0.6}}]}}\n  - settle:\n  - expect:\n      nrp:\n        \
         locations:\n          10.224.0.4: {{10.244.1.10: [{WEB_UID}]}}\n          10.224.0.9: {{10.244.2.10: [{WEB_UID}]}}\n          \
         10.224.0.6: {{10.244.3.10: [{WEB_UID}]}}\n      invariants: true\n",
        web_slice(&["10.244.1.10@aks-node-1", "10.244.2.10@aks-node-2", "10.244.3.10@aks-node-3"])
    );
    let report = extended("a-node-whose-ip-changes-moves-its-pods", &steps);
    assert!(report.passed, "{}", rendered(&report));
}

// Upstream TestReconcileEndpointSlice: an update that swaps one pod for another removes the old
// address and adds the new one in the same write, and deleting the EndpointSlice of a live
// Service takes its pods out of NRP while the Service stays registered.
#[test]
fn a_slice_update_swapping_a_pod_and_the_slices_deletion_are_followed_in_nrp() {
    let steps = format!(
        "{}  - settle:\n  - expect:\n      nrp:\n        locations: {{10.224.0.4: {{10.244.1.12: [{WEB_UID}]}}}}\n      \
         invariants: true\n  - delete: {{kind: EndpointSlice, namespace: shop, name: web-abc12}}\n  - settle:\n  \
         - expect:\n      nrp:\n        services: [{WEB_UID}]\n        locations: {{}}\n      status: {{shop/web: present}}\n      \
         invariants: true\n",
        web_slice(&["10.244.1.12@aks-node-1"])
    );
    let report = extended("scaling-a-deployment-up-and-down", &steps);
    assert!(report.passed, "{}", rendered(&report));
    let swapped = report
        .command_stream()
        .into_iter()
        .filter(|c| {
            c.contains(r#"address: "10.244.1.11", services: []"#)
                && c.contains(&format!(r#"address: "10.244.1.12", services: ["{WEB_UID}"]"#))
        })
        .count();
    assert_eq!(swapped, 1, "one write removes the old pod and adds the new: {:#?}", report.command_stream());
}

// Upstream TestLoadBalancerEmitsWarningEventForRejectedService: a Service with a named targetPort
// and an internal one each get their Warning, and nothing of theirs reaches NRP or Azure.
#[test]
fn a_service_with_a_named_target_port_or_internal_gets_its_warning_and_nothing_in_azure() {
    let service = |name: &str, uid: &str, annotations: &str, target_port: &str| {
        format!(
            "      - apiVersion: v1\n        kind: Service\n        metadata: {{name: {name}, namespace: shop, uid: {uid}{annotations}}}\n        \
             spec:\n          type: LoadBalancer\n          externalTrafficPolicy: Local\n          selector: {{app: {name}}}\n          \
             ports: [{{protocol: TCP, port: 80, targetPort: {target_port}}}]\n"
        )
    };
    let slice = |name: &str, uid: &str, address: &str| {
        format!(
            "      - apiVersion: discovery.k8s.io/v1\n        kind: EndpointSlice\n        metadata:\n          name: {name}-1\n          \
             namespace: shop\n          uid: {uid}-slice\n          ownerReferences: [{{apiVersion: v1, kind: Service, name: {name}, uid: {uid}}}]\n        \
             addressType: IPv4\n        endpoints:\n          - {{addresses: [\"{address}\"], nodeName: aks-node-1}}\n"
        )
    };
    let (named, internal) = ("6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4b01", "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4b02");
    let text = format!(
        "name: rejected\nconfig:\n  loadBalancerBackendPoolConfigurationType: podIP\n  loadBalancerSku: standardV2\nsteps:\n  \
         - apply:\n      - apiVersion: v1\n        kind: Node\n        metadata: {{name: aks-node-1}}\n        \
         status: {{addresses: [{{type: InternalIP, address: 10.224.0.4}}]}}\n{}{}{}{}  - settle:\n  - expect:\n      \
         nrp: {{services: [], locations: {{}}}}\n      status: {{shop/named: absent, shop/internal: absent}}\n      events:\n        \
         - {{reason: UnsupportedNamedTargetPort, object: shop/named, type: Warning, count: 1}}\n        \
         - {{reason: UnsupportedInternalLoadBalancer, object: shop/internal, type: Warning, count: 1}}\n      \
         resources: {{publicIps: [], loadBalancers: []}}\n      invariants: true\n",
        service("named", named, "", "http"),
        service(
            "internal",
            internal,
            ", annotations: {service.beta.kubernetes.io/azure-load-balancer-internal: \"true\"}",
            "8080"
        ),
        slice("named", named, "10.244.1.10"),
        slice("internal", internal, "10.244.1.11"),
    );
    let scenario = scenario::parse(std::path::Path::new("rejected.yaml"), &text).unwrap_or_else(|e| panic!("{e}"));
    let report = simulate::run(&scenario, &mut component_reconciler()).unwrap();
    assert!(report.passed, "{}", rendered(&report));
    let reasons: Vec<(&str, &str)> = report.events.iter().map(|e| (e.reason.as_str(), e.object.as_str())).collect();
    assert_eq!(reasons.len(), 2, "only the two Warnings: {reasons:?}");
    let written = report.azure_calls.keys().filter(|op| op.starts_with("put-") || op.starts_with("update-"));
    assert_eq!(written.count(), 0, "no write reached Azure: {:?}", report.azure_calls);
}

/// A scenario of shop/web (Local, the CLB config) on four nodes `aks-node-1..4` (10.224.0.4..7),
/// the `before` steps first, then the Nodes, the Service and a slice of `endpoints` (YAML flow
/// mappings), then `after`.
fn web_on_four_nodes(before: &str, endpoints: &[&str], after: &str) -> ScenarioReport {
    let mut text =
        "name: web\nconfig:\n  loadBalancerBackendPoolConfigurationType: podIP\n  loadBalancerSku: standardV2\n\
                    steps:\n"
            .to_string();
    text.push_str(before);
    text.push_str("  - apply:\n");
    for n in 1..=4 {
        text.push_str(&format!(
            "      - apiVersion: v1\n        kind: Node\n        metadata: {{name: aks-node-{n}}}\n        \
             status: {{addresses: [{{type: InternalIP, address: 10.224.0.{}}}]}}\n",
            n + 3
        ));
    }
    text.push_str(&format!(
        "      - apiVersion: v1\n        kind: Service\n        metadata: {{name: web, namespace: shop, uid: {WEB_UID}}}\n        \
         spec:\n          type: LoadBalancer\n          externalTrafficPolicy: Local\n          selector: {{app: web}}\n          \
         ports: [{{protocol: TCP, port: 80, targetPort: 8080}}]\n"
    ));
    let slice = web_slice(&[]);
    text.push_str(slice.strip_prefix("  - apply:\n").unwrap());
    for endpoint in endpoints {
        text.push_str(&format!("          - {endpoint}\n"));
    }
    text.push_str(after);
    let scenario = scenario::parse(std::path::Path::new("web.yaml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    simulate::run(&scenario, &mut component_reconciler()).unwrap()
}

/// How many locations each address-location write of the run named, in order.
fn location_writes(report: &ScenarioReport) -> Vec<usize> {
    report
        .command_stream()
        .into_iter()
        .filter(|c| c.contains("Command::UpdateAddressLocations"))
        .map(|c| c.matches("NrpLocation {").count())
        .collect()
}

// Upstream TestIsTerminalLocationSyncStatus_ClassifiesEveryStatus: 404, 409, 401, 403 and 504 on
// an address-location batch are transient, so the whole batch is sent again (a refusal such as
// 400 is halved instead) and all four locations end in NRP.
#[test]
fn an_address_location_batch_failing_404_409_401_403_or_504_is_retried_whole() {
    let four: Vec<String> =
        (1..=4).map(|n| format!("{{addresses: [\"10.244.{n}.10\"], nodeName: aks-node-{n}}}")).collect();
    let four: Vec<&str> = four.iter().map(String::as_str).collect();
    let expect = format!(
        "  - settle:\n  - expect:\n      nrp:\n        locations:\n{}      invariants: true\n",
        (1..=4).map(|n| format!("          10.224.0.{}: {{10.244.{n}.10: [{WEB_UID}]}}\n", n + 3)).collect::<String>()
    );
    for status in [404u16, 409, 401, 403, 504, 400] {
        let fault = format!(
            "  - fault: {{operation: update-address-locations, count: 1, mode: {{kind: status, status: {status}}}}}\n"
        );
        let report = web_on_four_nodes(&fault, &four, &expect);
        assert!(report.passed, "{status}: {}", rendered(&report));
        let writes = location_writes(&report);
        assert_eq!(writes[0], 4, "{status}: one batch of the four locations first: {writes:?}");
        if status == 400 {
            assert_eq!(writes[1], 2, "a refusal is halved: {writes:?}");
        } else {
            assert_eq!(writes, [4, 4], "{status}: the whole batch is sent again, once");
        }
    }
}

// Upstream TestSyncOps_ParkedLiveLBRemainsReadyToSync: shop/web's live load balancer gets an
// update Azure refuses for good, so web is parked (one Warning, the PUT not retried), yet its new
// endpoint is bound to it in NRP and its old one is not drained; shop/broken, a first-time create
// refused the same way, has no load balancer and its pod stays out of NRP.
#[test]
fn a_parked_service_whose_load_balancer_is_live_keeps_its_endpoints_bound_in_nrp() {
    const BROKEN_UID: &str = "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a02";
    let service = |name: &str, uid: &str, target_port: u16| {
        format!(
            "      - apiVersion: v1\n        kind: Service\n        metadata: {{name: {name}, namespace: shop, uid: {uid}}}\n        \
             spec:\n          type: LoadBalancer\n          externalTrafficPolicy: Local\n          selector: {{app: {name}}}\n          \
             ports: [{{protocol: TCP, port: 80, targetPort: {target_port}}}]\n"
        )
    };
    let after = format!(
        "  - settle:\n  - fault: {{operation: put-load-balancer, always: true, mode: {{kind: status, status: 400, code: InvalidParameter}}}}\n  \
         - apply:\n{}{}      - apiVersion: discovery.k8s.io/v1\n        kind: EndpointSlice\n        metadata:\n          \
         name: broken-abc12\n          namespace: shop\n          uid: 7b2a1d9f-3c4e-4f60-9bac-1d2e3f4a5b02\n          \
         ownerReferences: [{{apiVersion: v1, kind: Service, name: broken, uid: {BROKEN_UID}}}]\n        addressType: IPv4\n        \
         endpoints:\n          - {{addresses: [\"10.244.1.20\"], nodeName: aks-node-1}}\n  - settle: 1m\n  - expect:\n      \
         status: {{shop/web: present, shop/broken: absent}}\n      events:\n        \
         - {{reason: LoadBalancerConfigurationRejected, object: shop/web, type: Warning, count: 1}}\n        \
         - {{reason: LoadBalancerConfigurationRejected, object: shop/broken, type: Warning, count: 1}}\n{}  - settle: 1m\n  \
         - expect:\n      nrp:\n        services: [{WEB_UID}]\n        locations:\n          \
         10.224.0.4: {{10.244.1.10: [{WEB_UID}], 10.244.1.11: [{WEB_UID}]}}\n      \
         resources: {{loadBalancers: [{WEB_UID}]}}\n      events:\n        \
         - {{reason: LoadBalancerConfigurationRejected, object: shop/web, count: 1}}\n      invariants: true\n",
        service("web", WEB_UID, 8081),
        service("broken", BROKEN_UID, 8080),
        web_slice(&["10.244.1.10@aks-node-1", "10.244.1.11@aks-node-1"]),
    );
    let report = web_on_four_nodes("", &["{addresses: [\"10.244.1.10\"], nodeName: aks-node-1}"], &after);
    assert!(report.passed, "{}", rendered(&report));
    let stream = report.command_stream();
    let web_puts =
        stream.iter().filter(|c| c.contains(&format!("PutLoadBalancer(LoadBalancer {{ name: \"{WEB_UID}\""))).count();
    assert_eq!(web_puts, 2, "the create, then the refused update, never retried");
    let last = stream.iter().rev().find(|c| c.contains("Command::UpdateAddressLocations")).unwrap();
    assert!(last.contains(&format!(r#"address: "10.244.1.11", services: ["{WEB_UID}"]"#)), "{last}");
    assert!(!last.contains("services: []") && !last.contains("addresses: []"), "nothing drained: {last}");
    assert!(stream.iter().all(|c| !c.contains("10.244.1.20")), "the first-time create's pod never reaches NRP");
}

// Upstream TestDisassociateNatGatewayFromServiceGateway_Mock: when the last pod of egress-b goes,
// Azure answers the Outbound service's unlink and the NAT gateway's disassociation 404 (already
// gone); each is a successful no-op, sent once and not retried, and the teardown goes on:
// unregistered, NAT gateway and public IP deleted.
#[test]
fn a_teardown_whose_unlink_and_disassociation_find_nothing_goes_on_without_a_retry() {
    let marker = "  - delete: {kind: Pod, namespace: batch, name: job-1}\n";
    let path = scenario_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("the-first-pod-of-an-egress-identity-provisions-its-nat-gateway"))
        .expect("the egress lifecycle scenario");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(marker).count(), 1);
    let faults = "  - fault: {operation: update-services, count: 1, mode: {kind: status, status: 404, code: NotFound}}\n  \
                  - fault: {operation: put-nat-gateway, count: 1, mode: {kind: status, status: 404, code: NotFound}}\n";
    let text = text.replace(marker, &format!("{faults}{marker}"));
    let scenario = scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let report = simulate::run(&scenario, &mut component_reconciler()).unwrap();
    // The scenario's own last expectation: outbound gone, nothing left in Azure, and the calls
    // counted exactly (put-nat-gateway 2 and update-services 3: the 404s were not retried).
    let out = rendered(&report);
    assert!(report.passed, "{out}");
    assert!(out.contains("fault hit: update-services") && out.contains("fault hit: put-nat-gateway"), "{out}");
    let tail: Vec<&str> = report
        .command_stream()
        .into_iter()
        .filter(|c| c.contains("UpdateServices") || c.contains("PutNatGateway") || c.contains("DeleteResource"))
        .skip(2)
        .collect();
    let kinds: Vec<&str> = tail
        .iter()
        .map(|c| {
            if c.contains("PutNatGateway") {
                "disassociate"
            } else if c.contains("NatGateway, name") {
                "delete-nat-gateway"
            } else if c.contains("PublicIp, name") {
                "delete-public-ip"
            } else if c.contains("is-delete: true") {
                "unregister"
            } else {
                "unlink"
            }
        })
        .collect();
    assert_eq!(kinds, ["unlink", "disassociate", "unregister", "delete-nat-gateway", "delete-public-ip"], "{tail:#?}");
}

// Upstream TestEgressRefCountSoundness "LastPodRemovalDrivesRefCountToZero": two pods of one
// identity count 2; the first delete is not the last (1, the other pod's address still wanted,
// no teardown: the egress lifecycle scenario's exact call counts after job-0 goes), the second
// is (no count left, nothing wanted, and the scenario's teardown follows).
#[test]
fn the_last_pod_of_an_identity_drops_its_count_to_zero_and_only_it_tears_the_identity_down() {
    use clb_guest::difftracker::{Class, DiffTracker};
    use clb_guest::model::Pod;
    use clb_guest::tracker::egress::identities::Egress;
    let pod = |name: &str, ip: &str| Pod {
        namespace: "batch".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        egress_label: Some("egress-b".into()),
        phase: Some("Running".into()),
        pod_ips: vec![ip.into()],
        host_ips: vec!["10.224.0.6".into()],
        ..Pod::default()
    };
    let (mut egress, mut diff) = (Egress::default(), DiffTracker::default());
    let (p, q) = (pod("job-0", "10.244.2.10"), pod("job-1", "10.244.2.11"));
    egress.upsert(&p, |_| false, &mut diff);
    egress.upsert(&q, |_| false, &mut diff);
    assert_eq!(egress.ref_counts().get("egress-b"), Some(&2));
    egress.delete(&p.key(), &mut diff);
    assert_eq!(egress.ref_counts().get("egress-b"), Some(&1), "not the last pod");
    let wanted = diff.desired_view(|_| Class::Ready);
    assert_eq!(wanted["10.224.0.6"].keys().collect::<Vec<_>>(), ["10.244.2.11"], "{wanted:?}");
    assert!(egress.carries("egress-b"));
    egress.delete(&q.key(), &mut diff);
    assert!(egress.ref_counts().is_empty(), "the last pod drops the count to none");
    assert!(!egress.carries("egress-b"));
    assert!(diff.desired_view(|_| Class::Ready).is_empty());
    assert_eq!(egress.recount(), *egress.ref_counts());

    let report = run_component(
        &scenario_files()
            .into_iter()
            .find(|p| p.to_string_lossy().contains("the-first-pod-of-an-egress-identity-provisions-its-nat-gateway"))
            .expect("the egress lifecycle scenario"),
    );
    assert!(report.passed, "{}", rendered(&report));
}

// Upstream TestEndpointSliceAddresses "malformed address skipped without dropping valid peers" and
// "endpoint without a node is excluded": an endpoint listing a valid address beside one that is
// not an IP programs the valid one, and an endpoint without nodeName programs nothing.
#[test]
fn a_malformed_address_is_skipped_beside_its_valid_peer_and_an_endpoint_without_a_node_is_left_out() {
    let endpoints = [
        "{addresses: [\"10.244.1.10\"], nodeName: aks-node-1}",
        "{addresses: [\"10.244.1.11\", \"not-an-ip\"], nodeName: aks-node-1}",
        "{addresses: [\"10.244.2.10\"]}",
        "{addresses: [\"10.244.2.11\"], nodeName: aks-node-2, conditions: {ready: true}}",
    ];
    let expect = format!(
        "  - settle:\n  - expect:\n      nrp:\n        services: [{WEB_UID}]\n        locations:\n          \
         10.224.0.4: {{10.244.1.10: [{WEB_UID}], 10.244.1.11: [{WEB_UID}]}}\n          \
         10.224.0.5: {{10.244.2.11: [{WEB_UID}]}}\n      status: {{shop/web: present}}\n"
    );
    let report = web_on_four_nodes("", &endpoints, &expect);
    assert!(report.passed, "{}", rendered(&report));
}

#[test]
fn an_azure_section_with_a_load_balancer_without_pools_is_refused() {
    let text = "name: x\nconfig: {}\nazure: {loadBalancers: {lb1: []}}\nsteps:\n  - settle:\n";
    let err = scenario::parse(std::path::Path::new("x.yaml"), text).unwrap_err().to_string();
    assert!(err.contains("azure.loadBalancers.lb1: give at least one backend pool"), "{err}");
}

#[test]
fn a_scenario_whose_expectation_fails_says_which_and_what_was_found_instead() {
    let text =
        std::fs::read_to_string(first_service_scenario()).unwrap().replace("shop/web: 20.0.0.1", "shop/web: 20.0.0.9");
    let scenario = scenario::parse(std::path::Path::new("edited.yaml"), &text).unwrap();
    let report = simulate::run(&scenario, &mut ComponentReconciler::new(builtin())).unwrap();
    assert!(!report.passed);
    let out = rendered(&report);
    assert!(out.contains("✗ status shop/web: 20.0.0.9: ingress [\"20.0.0.1\"]"), "{out}");
    assert!(out.contains("result: FAIL"), "{out}");
}

#[test]
fn a_settle_that_cannot_finish_within_its_bound_is_a_failed_expectation() {
    let mut text = std::fs::read_to_string(first_service_scenario()).unwrap();
    text = text.replace(
        "steps:\n",
        "steps:\n  - fault: {operation: put-load-balancer, always: true, mode: {kind: status, status: 500}}\n",
    );
    text = text.replace("  - settle:\n", "  - settle: 2m\n");
    let scenario = scenario::parse(std::path::Path::new("stuck.yaml"), &text).unwrap();
    let report = simulate::run(&scenario, &mut ComponentReconciler::new(builtin())).unwrap();
    let out = rendered(&report);
    assert!(out.contains("✗ settles within 2m: not idle at 2m"), "{out}");
    assert!(out.contains("fault hit: put-load-balancer"), "{out}");
}

#[test]
fn bad_scenario_files_are_refused_with_the_file_the_line_and_why() {
    let cases = [
        ("unknown-step.yaml", 7, "unknown variant `wait`"),
        ("bad-duration.yaml", 6, "\"5 minutes\" is not a duration"),
        // The line where the fault's mapping begins: the refusal is of the mapping as a whole.
        ("fault-without-count.yaml", 8, "give `count: N` or `always: true`"),
        ("bad-status.yaml", 8, "expected present, absent, deleted or an IP address"),
        // The object's own first line, the second of its `apply` list.
        ("service-without-uid.yaml", 10, "Service web: metadata.uid is missing"),
        ("service-port-not-a-number.yaml", 7, "Service web: invalid type: string \"eighty\", expected i32"),
        ("unknown-kind.yaml", 7, "kind \"Deployment\" is not simulated"),
    ];
    for (file, line, reason) in cases {
        let path = fixture(&format!("scenarios-invalid/{file}"));
        let error = scenario::read(&path).unwrap_err().to_string();
        assert!(error.starts_with(&format!("{}:{line}: ", path.display())), "{error}");
        assert!(error.contains(reason), "{error}");
    }
}

#[test]
fn simulate_exits_zero_when_all_hold_one_when_one_fails_and_two_for_a_bad_file() {
    let good = first_service_scenario();
    let (code, out, _) = clb_host(&["simulate", good.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}");
    assert!(out.contains("1 of 1 scenarios passed"), "{out}");
    let failing = fixture("scenarios-failing/an-expectation-that-does-not-hold.yaml");
    let (code, out, _) = clb_host(&["simulate", good.to_str().unwrap(), failing.to_str().unwrap()]);
    assert_eq!(code, EXIT_REFUSED, "{out}");
    assert!(out.contains("status shop/web: absent"), "{out}");
    let bad = fixture("scenarios-invalid/unknown-step.yaml");
    let (code, _, err) = clb_host(&["simulate", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("unknown-step.yaml:7:"), "{err}");
}

#[test]
fn simulate_json_is_one_array_of_reports_with_commands_checks_and_the_final_nrp() {
    let good = first_service_scenario();
    let (code, out, _) = clb_host(&["simulate", "--json", good.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    let reports: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = &reports[0];
    assert_eq!(report["passed"], true);
    assert_eq!(report["steps"][1]["commands"][0]["line"], "read-nrp");
    assert_eq!(report["final_nrp"]["services"][0], "6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a01");
}

// ---- The executor ----

fn block<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

fn failure(outcome: wit::Outcome) -> wit::Failure {
    match outcome {
        wit::Outcome::Failed(f) => f,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn delete_lb(name: &str) -> wit::Command {
    wit::Command::DeleteResource(wit::ResourceRef { kind: wit::ResourceKind::LoadBalancer, name: name.into() })
}

// Upstream TestExtractAzureErrorInfo (differs: metrics say ok or failed; the guest gets the status and the
// code).
#[test]
fn the_executor_maps_each_azure_error_to_the_failure_the_guest_sees() {
    let emulator = Emulator::new(scope());
    let cluster = Cluster::new();
    let executor = Executor::new(&emulator, &cluster);
    let read = wit::Command::ReadNrp;
    // A 404 is a failure with its status: whether it means done is the guest's call.
    let f = failure(block(executor.execute(&delete_lb("lb-1"))));
    assert_eq!((f.status, f.code.as_deref(), f.retry_after_ms), (404, Some("ResourceNotFound"), None));
    emulator.set_fault(Fault::times(Operation::ListServices, 1, FaultMode::throttled(7)));
    let f = failure(block(executor.execute(&read)));
    assert_eq!((f.status, f.code.as_deref(), f.retry_after_ms), (429, Some("TooManyRequests"), Some(7_000)));
    emulator.set_fault(Fault::times(Operation::ListAddressLocations, 1, FaultMode::Hang));
    let f = failure(block(executor.execute(&read)));
    assert_eq!((f.status, f.code.as_deref()), (0, None), "no answer: status 0");
    assert!(f.message.contains("timeout"), "{}", f.message);
    emulator.set_fault(Fault::times(Operation::DeleteLoadBalancer, 1, FaultMode::Drop));
    let f = failure(block(executor.execute(&delete_lb("lb-1"))));
    assert_eq!((f.status, f.code.as_deref()), (0, None));
    let body = FaultMode::ErrorBody { code: "OperationNotAllowed".into(), message: "busy".into() };
    emulator.set_fault(Fault::times(Operation::DeleteLoadBalancer, 1, body));
    let f = failure(block(executor.execute(&delete_lb("lb-1"))));
    assert_eq!((f.status, f.code.as_deref()), (200, Some("OperationNotAllowed")));
    let failed = FaultMode::async_ending(AsyncOutcome::Failed, 2);
    emulator.set_fault(Fault::times(Operation::DeleteLoadBalancer, 1, failed));
    let f = failure(block(executor.execute(&delete_lb("lb-1"))));
    assert_eq!((f.status, f.code.as_deref()), (200, Some("InternalServerError")));
    // Every field of the error, nothing else.
    let error = AzureError::new(Operation::PutLoadBalancer, ErrorKind::Transport, "reset")
        .with_retry_after(Some(Duration::from_millis(1500)));
    let f = azure_failure(&error);
    assert_eq!((f.status, f.code, f.retry_after_ms), (0, None, Some(1500)));
    assert!(f.message.contains("reset"));
    // The read succeeds once the faults are used up.
    assert!(matches!(block(executor.execute(&read)), wit::Outcome::NrpSnapshot(s) if s.services.len() == 1));
}

// Upstream TestDeletePublicIP_Mock and TestMapLocationDataToDTO.
// Upstream TestCreateOrUpdateLB_Mock: a load balancer PUT with an empty name is refused before any request.
// Upstream TestCreateOrUpdateNatGateway_Mock "empty name": a NAT gateway PUT with an empty name (or no public IP)
// is refused before any request.
// Upstream TestUpdateNRPSGWServices_Mock: an empty services update reaches no API (differs: refused as an invalid
// command, where upstream returns nil without a call).
#[test]
fn the_executor_refuses_invalid_commands_without_sending_them() {
    let emulator = Emulator::new(scope());
    let cluster = Cluster::new();
    let executor = Executor::new(&emulator, &cluster);
    let location = |ip: &str| wit::NrpLocation {
        location: ip.into(),
        action: wit::UpdateAction::PartialUpdate,
        addresses: vec![wit::NrpAddress { address: "10.244.0.1".into(), services: vec!["s".into()] }],
    };
    let invalid = [
        wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations {
            locations: vec![location("10.0.0.1"), location("10.0.0.1")],
        }),
        wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations {
            locations: (0..=MAX_BATCH).map(|i| location(&format!("10.1.{}.{}", i / 256, i % 256))).collect(),
        }),
        wit::Command::UpdateAddressLocations(wit::UpdateAddressLocations { locations: vec![location("node-1")] }),
        wit::Command::UpdateServices(wit::UpdateServices { services: vec![] }),
        delete_lb(""),
        wit::Command::PutLoadBalancer(wit::LoadBalancer {
            name: "".into(),
            public_ip: "p".into(),
            backend_pool: "p".into(),
            rules: vec![],
        }),
        wit::Command::PutNatGateway(wit::NatGateway {
            name: "".into(),
            public_ips: vec!["p".into()],
            public_ips_v6: vec![],
            associated: true,
        }),
        wit::Command::PutNatGateway(wit::NatGateway {
            name: "n".into(),
            public_ips: vec![],
            public_ips_v6: vec![],
            associated: true,
        }),
    ];
    for command in invalid {
        let f = failure(block(executor.execute(&command)));
        assert_eq!((f.status, f.code.as_deref()), (0, Some(INVALID_COMMAND)), "{command:?}");
    }
    assert!(emulator.state().requests.is_empty(), "nothing reached Azure");
}

// Upstream TestGetServiceByUID_UIDMismatchReturnsNotFound (differs: nothing is looked up by UID; a write to
// a same-name object of another UID is refused, 409 UIDMismatch).
// Upstream TestAddServiceGatewayFinalizer: the finalizer is added once, beside the others, and only to the Service
// of its UID (the load-balancer-cleanup cases have no counterpart: this project is not called through the service
// controller and owns one finalizer, docs/design.md §4).
// Upstream TestRemoveServiceGatewayFinalizer: removal keeps the other finalizers, removing an absent one is Ok, and
// a same-name Service of another UID keeps its finalizers.
#[test]
fn kubernetes_writes_are_guarded_by_uid_a_missing_object_is_404_and_a_replaced_one_409() {
    let emulator = Emulator::new(scope());
    let cluster = Cluster::new();
    let executor = Executor::new(&emulator, &cluster);
    let text =
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop, uid: uid-2, finalizers: [other]}\n";
    let service: k8s_openapi::api::core::v1::Service =
        clb_executor::inputs::from_yaml(std::path::Path::new("web.yaml"), text).unwrap().unwrap();
    let reference = |uid: &str| wit::ObjectRef {
        kind: "Service".into(),
        namespace: "shop".into(),
        name: "web".into(),
        uid: uid.into(),
    };
    let change = |uid: &str, present: bool| {
        wit::Command::SetFinalizer(wit::FinalizerChange { service: reference(uid), finalizer: "f".into(), present })
    };
    let finalizer = |uid: &str| change(uid, true);
    let remove = |uid: &str| change(uid, false);
    let finalizers = || cluster.service("shop", "web").unwrap().metadata.finalizers;
    let both = Some(vec!["other".to_owned(), "f".to_owned()]);
    let f = failure(block(executor.execute(&finalizer("uid-1"))));
    assert_eq!((f.status, f.code.as_deref()), (404, Some("NotFound")));
    cluster.apply(Object::Service(Box::new(service))).unwrap();
    let f = failure(block(executor.execute(&finalizer("uid-1"))));
    assert_eq!((f.status, f.code.as_deref()), (409, Some(UID_MISMATCH)));
    assert_eq!(block(executor.execute(&finalizer("uid-2"))), wit::Outcome::Ok);
    assert_eq!(finalizers(), both);
    assert_eq!(block(executor.execute(&finalizer("uid-2"))), wit::Outcome::Ok, "already there");
    assert_eq!(finalizers(), both, "no duplicate");

    let f = failure(block(executor.execute(&remove("uid-1"))));
    assert_eq!((f.status, f.code.as_deref()), (409, Some(UID_MISMATCH)));
    // The guest reads this refusal as "the object is gone" (its deletion ends): the same code.
    assert_eq!(UID_MISMATCH, clb_guest::model::UID_MISMATCH);
    assert!(
        clb_guest::model::Failure {
            status: f.status,
            code: f.code.clone(),
            retry_after_ms: None,
            message: f.message.clone()
        }
        .object_gone()
    );
    assert_eq!(finalizers(), both, "the replaced Service's finalizers are not ours to remove");
    assert_eq!(block(executor.execute(&remove("uid-2"))), wit::Outcome::Ok);
    assert_eq!(finalizers(), Some(vec!["other".to_owned()]));
    assert_eq!(block(executor.execute(&remove("uid-2"))), wit::Outcome::Ok, "already gone");
    assert_eq!(finalizers(), Some(vec!["other".to_owned()]));

    // A status write to the replaced Service is refused the same way and leaves its status alone.
    let patch = |uid: &str| {
        wit::Command::PatchServiceStatus(wit::ServiceStatus {
            service: reference(uid),
            ingress_ips: vec!["20.1.2.3".into()],
        })
    };
    let status = || cluster.service("shop", "web").unwrap().status;
    let before = status();
    let f = failure(block(executor.execute(&patch("uid-1"))));
    assert_eq!((f.status, f.code.as_deref()), (409, Some(UID_MISMATCH)));
    assert_eq!(status(), before, "the replaced Service's status is untouched");
    assert_eq!(block(executor.execute(&patch("uid-2"))), wit::Outcome::Ok);
    let ingress = status().and_then(|s| s.load_balancer).and_then(|lb| lb.ingress).unwrap_or_default();
    assert_eq!(ingress.iter().map(|i| i.ip.clone().unwrap_or_default()).collect::<Vec<_>>(), ["20.1.2.3"]);
}
