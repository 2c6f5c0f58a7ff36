//! `/metrics`, `/healthz` and `/readyz`, scraped over loopback while a supervisor serves: the
//! probes follow the tracker's life, and the counters move with inputs, traps and swaps, labelled
//! by logic version.

use crate::supervisor::{next, node, service, start};
use clb_host::live::endpoint::MetricsServer;
use clb_host::live::metrics::Metrics;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::supervisor::{CheckpointPolicy, Supervisor};
use clb_tests::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// A server on a free loopback port, on its own runtime (the test thread scrapes synchronously).
fn serve(metrics: Arc<Metrics>) -> (tokio::runtime::Runtime, MetricsServer) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = runtime.block_on(MetricsServer::start(metrics, "127.0.0.1:0".parse().unwrap())).unwrap();
    (runtime, server)
}

/// `GET path` over a plain TCP connection: (status, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{response}"));
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// The value of the one sample of `name` whose labels contain every fragment of `labels`.
fn value(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|fragment| l.contains(fragment)))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "one sample of {name} with {labels:?} in:\n{exposition}");
    found[0]
}

// Upstream TestGuardWaitForInitialSync_ReturnsOnCompletion.
#[test]
fn the_probes_follow_the_tracker_from_start_to_its_first_idle_step() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    let mut supervisor = Supervisor::new(builtin()).with_metrics(metrics);
    assert_eq!(get(addr, "/healthz").0, 503, "nothing serves before the start");
    assert_eq!(get(addr, "/readyz").0, 503);

    supervisor.start(&read_config("clb.yaml")).unwrap();
    assert_eq!(get(addr, "/healthz").0, 200);
    let step = supervisor.observe(0, &[node("n1", "10.224.0.4"), wit::Observation::ListsComplete]).unwrap();
    assert!(!step.idle);
    assert_eq!(get(addr, "/readyz").0, 503, "not ready while the first NRP read is out");

    let read = step.commands.iter().find(|i| i.command == wit::Command::ReadNrp).unwrap().id;
    let empty = wit::NrpState { services: Vec::new(), locations: Vec::new() };
    let step = supervisor.complete(0, &[(read, wit::Outcome::NrpSnapshot(empty))]).unwrap();
    assert!(!step.idle, "not idle while the ARM inventory is out");
    let list = step.commands.iter().find(|i| i.command == wit::Command::ReadArm).unwrap().id;
    assert_eq!(get(addr, "/readyz").0, 503);
    let nothing = wit::ArmInventory { public_ips: Vec::new(), load_balancers: Vec::new(), nat_gateways: Vec::new() };
    let step = supervisor.complete(0, &[(list, wit::Outcome::ArmInventory(nothing))]).unwrap();
    assert!(step.idle, "{step:?}");
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".into()));
    // Readiness stays once reached, while the tracker works on a new Service.
    let step = supervisor.observe(1, &[service("web", 1)]).unwrap();
    assert!(!step.idle);
    assert_eq!(get(addr, "/readyz").0, 200);
    assert_eq!(get(addr, "/nothing-here").0, 404);
}

/// Answers the read of NRP in `step` (empty), then the read of ARM that follows (nothing).
fn answer_the_start_up_reads(supervisor: &mut Supervisor, step: &wit::Step) -> wit::Step {
    let read = step.commands.iter().find(|i| i.command == wit::Command::ReadNrp).unwrap().id;
    let empty = wit::NrpState { services: Vec::new(), locations: Vec::new() };
    let step = supervisor.complete(0, &[(read, wit::Outcome::NrpSnapshot(empty))]).unwrap();
    let list = step.commands.iter().find(|i| i.command == wit::Command::ReadArm).unwrap().id;
    let nothing = wit::ArmInventory { public_ips: Vec::new(), load_balancers: Vec::new(), nat_gateways: Vec::new() };
    supervisor.complete(0, &[(list, wit::Outcome::ArmInventory(nothing))]).unwrap()
}

// Upstream TestCheckInitializationComplete_InProgressOpBlocksCompletion: a Service operation in flight at start-up
// holds the end of initialisation (here readiness, the first idle step) back until it ends.
#[test]
fn a_service_seen_at_start_up_keeps_the_host_unready_until_its_last_command_is_answered() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    let mut supervisor = Supervisor::new(builtin()).with_metrics(metrics);
    supervisor.start(&read_config("clb.yaml")).unwrap();
    let lists = [node("n1", "10.224.0.4"), service("web", 1), wit::Observation::ListsComplete];
    let step = supervisor.observe(0, &lists).unwrap();
    let mut step = answer_the_start_up_reads(&mut supervisor, &step);
    // Both reads are answered: what is out now is the Service's work, and that alone holds readiness.
    assert!(!step.idle && !step.commands.is_empty(), "{step:?}");
    let mut answered = 0;
    // Events are not work in flight: the step that leaves only its EnsuredLoadBalancer Event out is idle.
    while !step.idle {
        assert!(!step.commands.is_empty(), "not idle, with nothing to answer: {step:?}");
        assert_eq!(get(addr, "/readyz").0, 503, "after {answered} of the Service's commands");
        let results: Vec<(u64, wit::Outcome)> =
            step.commands.iter().map(|i| (i.id, clb_tests::cluster::answer(&i.command))).collect();
        answered += results.len();
        step = supervisor.complete(0, &results).unwrap();
    }
    assert!(answered >= 3, "a public IP, a load balancer and the NRP registration: {answered}");
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".into()));
}

// Upstream TestCheckInitializationComplete_ParkedOpDoesNotBlockCompletion: a Service whose
// creation keeps failing keeps the tracker from idling, but not the host from being ready once
// start-up has ended (the logic's `initialized-after-ms`, read as `run` reads it, after each step).
#[test]
fn a_service_whose_creation_keeps_failing_does_not_keep_the_host_unready_once_start_up_has_ended() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    let mut supervisor = Supervisor::new(builtin()).with_metrics(metrics.clone());
    supervisor.start(&read_config("clb.yaml")).unwrap();
    let sha = builtin().info().sha256.clone();
    let publish = |supervisor: &mut Supervisor, now: u64| {
        metrics.publish_figures(&sha, supervisor.logic_stats(now).unwrap(), now, now);
    };
    let lists = [node("n1", "10.224.0.4"), service("web", 1), wit::Observation::ListsComplete];
    let step = supervisor.observe(0, &lists).unwrap();
    publish(&mut supervisor, 0);
    assert_eq!(get(addr, "/readyz").0, 503, "NRP is not read yet");
    let mut step = answer_the_start_up_reads(&mut supervisor, &step);
    publish(&mut supervisor, 0);
    assert_eq!(get(addr, "/readyz").0, 503, "the Service's first command is in flight");
    // Every Azure write fails with a 500, every Kubernetes write succeeds: the Service retries
    // for ever, and the host is ready once it waits out a backoff with nothing in flight.
    let mut now = 0;
    for _ in 0..6 {
        let results: Vec<(u64, wit::Outcome)> = step
            .commands
            .iter()
            .map(|i| match &i.command {
                wit::Command::PutPublicIp(_) | wit::Command::PutLoadBalancer(_) => {
                    let failure =
                        wit::Failure { status: 500, code: None, retry_after_ms: None, message: "boom".into() };
                    (i.id, wit::Outcome::Failed(failure))
                }
                other => (i.id, clb_tests::cluster::answer(other)),
            })
            .collect();
        step = if results.is_empty() {
            now = step.wake_at_ms.expect("a retry is due");
            supervisor.tick(now).unwrap()
        } else {
            supervisor.complete(now, &results).unwrap()
        };
        assert!(!step.idle, "a failing Service never lets the tracker idle");
        publish(&mut supervisor, now);
    }
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".into()));
}

#[test]
fn the_counters_move_with_inputs_and_carry_the_serving_version_and_its_digest() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    let policy = CheckpointPolicy { every_inputs: 2, journal_items: 100 };
    let mut supervisor = start(Supervisor::with_policy(builtin(), policy).with_metrics(metrics.clone()));
    let sha = builtin().info().sha256.clone();
    let labels = [format!("version=\"{}\"", &sha[..12]), format!("sha256=\"{sha}\"")];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();

    let (status, before) = get(addr, "/metrics");
    assert_eq!(status, 200, "{before}");
    assert_eq!(value(&before, "clb_logic_serving", &labels), 1.0);
    assert_eq!(value(&before, "clb_supervisor_inputs_total", &labels), supervisor.stats().inputs as f64);
    supervisor.observe(5, &[service("web", 1)]).unwrap();
    supervisor.observe(6, &[service("api", 2)]).unwrap();
    let after = get(addr, "/metrics").1;

    assert_eq!(
        value(&after, "clb_supervisor_inputs_total", &labels),
        value(&before, "clb_supervisor_inputs_total", &labels) + 2.0
    );
    // Other tests share the built-in logic's counters, so these only have to have grown.
    assert!(value(&after, "clb_guest_calls_total", &labels) >= value(&before, "clb_guest_calls_total", &labels) + 2.0);
    assert!(value(&after, "clb_guest_fuel_used_total", &labels) > value(&before, "clb_guest_fuel_used_total", &labels));
    let checkpoints = value(&after, "clb_supervisor_checkpoints_total", &labels);
    assert!(checkpoints > value(&before, "clb_supervisor_checkpoints_total", &labels), "{after}");
    let state = value(&after, "clb_state_bytes", &labels);
    assert_eq!(state, supervisor.stats().last_checkpoint_bytes as f64);
    assert!(state > 0.0);
    assert!(value(&after, "clb_supervisor_checkpoint_bytes_total", &labels) >= state, "the last one included");
    assert_eq!(value(&after, "clb_ready", &[]), 1.0);
    // The serving tracker's linear memory: whole 64 KiB pages, and it only grows.
    let memory = |text: &str| value(text, "clb_guest_memory_bytes", &labels);
    assert!(memory(&before) > 0.0 && memory(&before) % 65_536.0 == 0.0, "{before}");
    assert!(memory(&after) >= memory(&before), "{after}");
    assert_eq!(metrics.status().guest_memory_bytes, Some(memory(&after) as u64), "/status says the same");
}

#[test]
fn a_trap_a_refused_swap_and_an_accepted_one_are_counted_under_their_versions() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    let mut supervisor = start(Supervisor::new(builtin()).with_metrics(metrics));
    let old = builtin().info().sha256.clone();
    let new = next().info().sha256.clone();
    let old_label = format!("sha256=\"{old}\"");
    let new_label = format!("sha256=\"{new}\"");

    let err = supervisor.swap_bytes(runtime(), HOSTILE_GUEST, Default::default(), 1).expect_err("refused");
    let text = get(addr, "/metrics").1;
    assert_eq!(value(&text, "clb_supervisor_swaps_total", &[&old_label, &format!("result=\"{}\"", err.kind())]), 1.0);

    supervisor.swap(next(), 2).expect("accepted");
    supervisor.observe(3, &[service("boom", 9)]).unwrap();
    let text = get(addr, "/metrics").1;
    assert_eq!(value(&text, "clb_logic_serving", &[&new_label]), 1.0);
    assert!(!text.contains(&format!("clb_logic_serving{{version=\"{}\"", &old[..12])), "{text}");
    assert_eq!(value(&text, "clb_supervisor_swaps_total", &[&new_label, "result=\"accepted\""]), 1.0);
    assert_eq!(value(&text, "clb_supervisor_quarantined_inputs_total", &[&new_label]), 1.0);
    assert!(value(&text, "clb_supervisor_recoveries_total", &[&new_label]) >= 1.0);
    assert!(value(&text, "clb_guest_failures_total", &[&new_label, "kind=\"panic\""]) >= 1.0);
    // The previous version is still exposed, with its own calls.
    assert!(value(&text, "clb_guest_calls_total", &[&old_label]) > 0.0);
}

#[test]
fn a_rollback_the_supervisor_does_on_its_own_is_recorded_for_status_and_the_events() {
    use clb_host::live::swap::SwapResult;
    let metrics = Metrics::new();
    let mut records = metrics.subscribe_swaps();
    let mut supervisor = start(Supervisor::new(builtin()).with_metrics(metrics.clone()));
    // A candidate in shadow that diverges once (the next guest warns about a legacy Service).
    supervisor.shadow(next().clone(), Default::default()).unwrap();
    let wit::Observation::ServiceUpserted(mut legacy) = service("legacy", 8) else { unreachable!() };
    legacy.annotations.push(("clb.test/legacy".into(), "yes".into()));
    supervisor.observe(1, &[wit::Observation::ServiceUpserted(legacy)]).unwrap();
    supervisor.swap(next(), 1).expect("accepted");
    assert!(metrics.status().last_swap.is_none(), "a swap called directly records nothing: the run loop does");
    for n in 0..3 {
        supervisor.observe(10, &[service(&format!("boom-{n}"), 20 + n)]).unwrap();
    }

    let (from, to) = (next().info().sha256[..12].to_owned(), builtin().info().sha256[..12].to_owned());
    let status = metrics.status();
    let record = status.last_swap.expect("the rollback is the last swap result");
    assert_eq!(record.origin, "supervisor");
    assert!(
        matches!(&record.result, SwapResult::RolledBack { from: f, to: t, reason } if *f == from && *t == to && reason.contains("3 inputs were quarantined within its probation")),
        "{record:?}"
    );
    assert_eq!(status.active.map(|a| a.version), Some(to));
    assert_eq!((status.rollbacks, status.quarantined_inputs), (1, 3));
    assert_eq!(records.try_recv().ok(), Some(record), "the Event reporter is sent the same record");
    assert!(records.try_recv().is_err(), "once");
}

#[cfg(unix)]
#[test]
fn the_engine_s_guest_memories_are_counted_by_origin_once_tracked() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    assert!(!get(addr, "/metrics").1.contains("clb_guest_memories_total"), "nothing tracked yet");
    metrics.track_memories(runtime().memories().clone());
    let before = get(addr, "/metrics").1;
    // Other tests share the engine, so the counts only have to have grown.
    drop(start(Supervisor::new(builtin())));
    let after = get(addr, "/metrics").1;
    let handed_out = |text: &str| {
        value(text, "clb_guest_memories_total", &["origin=\"mapped\""])
            + value(text, "clb_guest_memories_total", &["origin=\"recycled\""])
    };
    assert!(handed_out(&after) > handed_out(&before), "{after}");
    for counter in ["clb_guest_memory_zeroed_bytes_total", "clb_guest_memories_unmapped_total"] {
        assert!(value(&after, counter, &[]) >= value(&before, counter, &[]), "{after}");
    }
}

#[test]
fn run_s_lease_and_pool_updater_counters_are_shown_by_lease_and_result_once_tracked() {
    use std::sync::atomic::Ordering;
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let addr = server.local_addr();
    assert!(!get(addr, "/metrics").1.contains("clb_lease_operations_total"), "nothing tracked yet");
    let stats = clb_host::live::metrics::RunStats::default();
    metrics.track_run(stats.clone());
    stats.leader.acquired.fetch_add(2, Ordering::Relaxed);
    stats.leader.lost.fetch_add(1, Ordering::Relaxed);
    stats.resource_lock.conflicts.fetch_add(3, Ordering::Relaxed);
    stats.pool_updater.ticks.fetch_add(10, Ordering::Relaxed);
    stats.pool_updater.idle_ticks.fetch_add(7, Ordering::Relaxed);
    stats.pool_updater.groups_written.fetch_add(4, Ordering::Relaxed);
    stats.pool_updater.unlock_failures.fetch_add(1, Ordering::Relaxed);
    stats.pool_updater.pools_created.fetch_add(2, Ordering::Relaxed);
    stats.pool_updater.recheck_different.fetch_add(1, Ordering::Relaxed);
    stats.pool_updater.recheck_failures.fetch_add(5, Ordering::Relaxed);

    let text = get(addr, "/metrics").1;
    let lease = |lease: &str, result: &str| {
        value(&text, "clb_lease_operations_total", &[&format!("lease=\"{lease}\""), &format!("result=\"{result}\"")])
    };
    assert_eq!(lease("leader", "acquired"), 2.0);
    assert_eq!(lease("leader", "lost"), 1.0);
    assert_eq!(lease("leader", "renewed"), 0.0);
    assert_eq!(lease("resource-lock", "conflict"), 3.0);
    assert_eq!(lease("resource-lock", "acquired"), 0.0);
    assert_eq!(value(&text, "clb_pool_updater_ticks_total", &["result=\"busy\""]), 3.0);
    assert_eq!(value(&text, "clb_pool_updater_ticks_total", &["result=\"idle\""]), 7.0);
    assert_eq!(value(&text, "clb_pool_updater_groups_total", &["result=\"written\""]), 4.0);
    assert_eq!(value(&text, "clb_pool_updater_groups_total", &["result=\"failed\""]), 0.0);
    assert_eq!(value(&text, "clb_pool_updater_failures_total", &["kind=\"unlock\""]), 1.0);
    assert_eq!(value(&text, "clb_pool_updater_pools_total", &["action=\"created\""]), 2.0);
    assert_eq!(value(&text, "clb_pool_updater_pools_total", &["action=\"deleted\""]), 0.0);
    assert_eq!(value(&text, "clb_pool_updater_recheck_pools_total", &["result=\"different\""]), 1.0);
    assert_eq!(value(&text, "clb_pool_updater_recheck_pools_total", &["result=\"same\""]), 0.0);
    assert_eq!(value(&text, "clb_pool_updater_failures_total", &["kind=\"recheck\""]), 5.0);
}

/// `/metrics` moved from exposition text written by hand to `prometheus-client`; the sample
/// names and label keys are the operators' contract and stay exactly as they were
/// (`tests/fixtures/metrics/contract.txt`), the histograms added beside them.
// Upstream TestExtractAzureErrorInfo (differs: metrics say ok or failed; the guest gets the status and the
// code).
#[cfg(unix)]
#[test]
fn every_sample_name_and_label_key_of_a_full_scrape_is_the_documented_contract() {
    use clb_host::live::metrics::{RunStats, SwapPhase};
    use clb_sandbox::trace::{ComponentRef, Overflow, RecordOptions, Recorder, Signatures};
    use std::collections::BTreeSet;
    use std::time::Duration;
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    metrics.track_memories(runtime().memories().clone());
    let options = RecordOptions {
        overflow: Overflow::Drop,
        ..RecordOptions::live(std::path::PathBuf::from("/nonexistent-clb-dir/trace.jsonl"))
    };
    let trace = Recorder::start(options, Signatures::of(builtin()), &ComponentRef::of(builtin(), None)).unwrap();
    metrics.track_run(RunStats { trace: Some(trace), ..RunStats::default() });
    let mut supervisor = start(Supervisor::new(builtin()).with_metrics(metrics.clone()));
    // A candidate in shadow that diverges once (the next guest warns about a legacy Service).
    supervisor.shadow(next().clone(), Default::default()).unwrap();
    let wit::Observation::ServiceUpserted(mut legacy) = service("legacy", 8) else { unreachable!() };
    legacy.annotations.push(("clb.test/legacy".into(), "yes".into()));
    supervisor.observe(1, &[wit::Observation::ServiceUpserted(legacy)]).unwrap();
    supervisor.swap(next(), 1).expect("accepted");
    supervisor.observe(2, &[service("boom", 9)]).unwrap();
    metrics.observe_command("read-nrp", false, Duration::from_millis(3));
    metrics.observe_swap_phase(SwapPhase::Switch, Duration::from_millis(2));
    metrics.observe_throttled("put-load-balancer");
    metrics.observe_throttled("put-load-balancer");
    metrics.arm_remaining_writes(153);
    // The logic's figures, with one attempt so that the attempts family has a sample.
    let mut figures = supervisor.logic_stats(3).expect("the serving version reports its figures");
    figures.attempts.push(wit::AttemptCount {
        operation: wit::Operation::Create,
        service_type: wit::ServiceType::Inbound,
        success: true,
        error_code: String::new(),
        orphan: false,
        count: 1,
    });
    metrics.publish_figures(&next().info().sha256, figures, 3, 3);

    let (status, text) = get(server.local_addr(), "/metrics");
    assert_eq!(status, 200);
    assert_eq!(value(&text, "clb_azure_throttled_total", &["command=\"put-load-balancer\""]), 2.0);
    assert_eq!(value(&text, "clb_arm_remaining_writes", &[]), 153.0);
    assert!(text.ends_with("# EOF\n"), "an OpenMetrics exposition ends with its EOF marker:\n{text}");
    let scraped: BTreeSet<String> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let series = line.rsplit_once(' ').map_or(line, |(series, _value)| series);
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let mut keys: Vec<&str> =
                labels.trim_end_matches('}').split(',').filter_map(|l| l.split_once('=')).map(|(k, _)| k).collect();
            keys.sort_unstable();
            keys.dedup();
            if keys.is_empty() { name.to_owned() } else { format!("{name} {}", keys.join(",")) }
        })
        .collect();
    let contract: BTreeSet<String> = std::fs::read_to_string(fixture("metrics/contract.txt"))
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = contract.difference(&scraped).collect();
    let unknown: Vec<_> = scraped.difference(&contract).collect();
    assert!(missing.is_empty() && unknown.is_empty(), "missing {missing:?}, not in the contract {unknown:?}:\n{text}");
}

/// The sample dashboard (`examples/deploy/grafana-dashboard.json`) names only metrics the host
/// serves: every `difftracker_engine_…` and `clb_…` name in its queries is in the contract.
#[test]
fn every_metric_the_sample_grafana_dashboard_queries_is_in_the_metrics_contract() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("examples/deploy/grafana-dashboard.json")).unwrap())
            .expect("the dashboard is JSON");
    let contract: std::collections::BTreeSet<String> = std::fs::read_to_string(fixture("metrics/contract.txt"))
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split(' ').next().unwrap().to_owned())
        .collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut named = 0;
    for target in panels.iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().expect("a query");
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("difftracker_engine_") || word.starts_with("clb_") {
                named += 1;
                assert!(contract.contains(word), "the dashboard queries {word}, which /metrics does not serve: {expr}");
            }
        }
    }
    assert!(named >= 10, "the dashboard names {named} metrics");
}

/// A candidate in shadow reads its own figures: `/metrics` shows them in ours (`clb_logic_…`)
/// under its version beside the serving version's, while upstream's families stay the serving
/// version's alone (one series, no version label).
#[test]
fn a_candidate_in_shadow_shows_its_figures_beside_the_serving_versions_and_never_in_upstreams() {
    let metrics = Metrics::new();
    let (_runtime, server) = serve(metrics.clone());
    let mut supervisor = start(Supervisor::new(builtin()).with_metrics(metrics.clone()));
    supervisor.shadow(next().clone(), Default::default()).unwrap();
    supervisor.observe(1, &[service("web", 1)]).unwrap();
    metrics.publish_figures(&builtin().info().sha256, supervisor.logic_stats(1).unwrap(), 1, 1);
    let (_, text) = get(server.local_addr(), "/metrics");
    for sha256 in [&builtin().info().sha256, &next().info().sha256] {
        let labels = [format!("sha256=\"{sha256}\""), "bucket=\"arm-writes\"".to_owned()];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert!(value(&text, "clb_logic_write_budget_per_minute", &labels) > 0.0, "{sha256}:\n{text}");
    }
    // Both guests' memory: the shadow holds a second one.
    for sha256 in [&builtin().info().sha256, &next().info().sha256] {
        let memory = value(&text, "clb_guest_memory_bytes", &[&format!("sha256=\"{sha256}\"")]);
        assert!(memory > 0.0 && memory % 65_536.0 == 0.0, "{sha256}:\n{text}");
    }
    let upstream = text.lines().filter(|l| l.starts_with("difftracker_engine_servicegateway_enabled ")).count();
    assert_eq!(upstream, 1, "{text}");
    assert!(!text.lines().any(|l| l.starts_with("difftracker_engine_") && l.contains("sha256=")), "{text}");
}
