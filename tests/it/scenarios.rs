//! The scenarios (`examples/scenarios/`, `tests/scenarios/`) through `simulate`: each holds under
//! the component, the native library issues the very same commands, bad files are refused with
//! the line, and the executor hands every Azure and Kubernetes error to the guest unchanged.

use clb_host::azure::{AzureError, ErrorKind, Operation};
use clb_host::cli::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, run};
use clb_host::emulator::{AsyncOutcome, Emulator, Fault, FaultMode};
use clb_host::executor::{Executor, INVALID_COMMAND, MAX_BATCH, UID_MISMATCH, azure_failure};
use clb_host::sandbox::bindings::clb::reconciler::types as wit;
use clb_host::simulator::cluster::{Cluster, Object};
use clb_host::simulator::simulate::{self, ComponentReconciler, ScenarioReport};
use clb_host::simulator::{scenario, simulate::scope};
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
/// compared up to it. Multi-SLB local-service scenarios are skipped: their work is done by the
/// host's backend-pool updater, which runs a `pool-queue` inside a component session (there is
/// no native `PoolUpdater`), and the tracker sends no commands in that mode, so there is no
/// command stream to compare; the guest's queue and placement are unit-tested natively.
#[test]
fn the_native_library_issues_the_same_command_stream_as_the_component_on_every_scenario() {
    let mut compared = 0;
    for path in scenario_files() {
        let mut scenario = scenario::read(&path).unwrap();
        if !scenario.config.multiple_standard_load_balancers.is_empty() {
            continue;
        }
        compared += 1;
        if let Some(first) =
            scenario.steps.iter().position(|s| matches!(s, scenario::Step::Swap(_) | scenario::Step::Shadow(_)))
        {
            scenario.steps.truncate(first);
        }
        let component = simulate::run(&scenario, &mut component_reconciler()).unwrap();
        let native = simulate::run(&scenario, &mut NativeReconciler::default()).unwrap();
        assert!(!component.command_stream().is_empty(), "{}", path.display());
        assert_eq!(component.command_stream(), native.command_stream(), "{}", path.display());
        assert_eq!(component.passed, native.passed, "{}", path.display());
    }
    assert!(compared >= 17, "{compared}");
}

#[test]
fn a_multi_slb_scenario_under_the_native_library_stops_saying_it_needs_the_component() {
    let path = scenario_files()
        .into_iter()
        .find(|p| !scenario::read(p).unwrap().config.multiple_standard_load_balancers.is_empty())
        .expect("a multi-SLB scenario");
    let report = simulate::run(&scenario::read(&path).unwrap(), &mut NativeReconciler::default()).unwrap();
    assert!(!report.passed);
    assert!(report.aborted.as_deref().is_some_and(|why| why.contains("need the component")), "{:?}", report.aborted);
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

fn clb_host(args: &[&str]) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(std::iter::once("clb-host").chain(args.iter().copied()), &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
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
// controller and owns one finalizer, design §4).
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
        clb_host::inputs::from_yaml(std::path::Path::new("web.yaml"), text).unwrap().unwrap();
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
    assert!(clb_guest::model::Failure { status: f.status, code: f.code.clone(), retry_after_ms: None, message: f.message.clone() }.object_gone());
    assert_eq!(finalizers(), both, "the replaced Service's finalizers are not ours to remove");
    assert_eq!(block(executor.execute(&remove("uid-2"))), wit::Outcome::Ok);
    assert_eq!(finalizers(), Some(vec!["other".to_owned()]));
    assert_eq!(block(executor.execute(&remove("uid-2"))), wit::Outcome::Ok, "already gone");
    assert_eq!(finalizers(), Some(vec!["other".to_owned()]));
}
