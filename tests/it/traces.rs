//! Traces (`docs/traces.md`): the golden traces of every scenario are what `simulate` records,
//! replay identically, and a changed, truncated or malformed trace is reported as the format
//! says; the schema file is what the component says; recording never blocks on a bad disk.

use clb_host::cli::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, run};
use clb_sandbox::trace::{self, ComponentRef, Overflow, RecordOptions, Recorder};
use clb_simulator::simulate;
use clb_tests::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden_dir() -> PathBuf {
    root().join("tests/traces")
}

fn golden(scenario: &Path) -> PathBuf {
    golden_dir().join(format!("{}.jsonl", scenario.file_stem().unwrap().to_string_lossy()))
}

/// The test guests as files, for `--swap-component` (one copy per process).
pub fn guest_files() -> &'static (PathBuf, PathBuf) {
    static FILES: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let dir = process_dir().join("guests");
        std::fs::create_dir_all(&dir).unwrap();
        let (builtin, next) = (dir.join("clb_guest.wasm"), dir.join("next_guest.wasm"));
        std::fs::write(&builtin, clb_sandbox::BUILTIN_GUEST).unwrap();
        std::fs::write(&next, NEXT_GUEST).unwrap();
        (builtin, next)
    })
}

/// The sha256 fields change with any rebuild of a guest, not with its behaviour.
fn without_shas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\"sha256\":\"") {
        let start = at + "\"sha256\":\"".len();
        out.push_str(&rest[..start]);
        let end = rest[start..].find('"').map_or(rest.len(), |e| start + e);
        out.push('…');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn record(scenario_path: &Path, out: &Path) {
    let scenario = clb_simulator::scenario::read(scenario_path).unwrap();
    let recorder = trace::record_scenario(builtin(), "builtin", out, &scenario.name).unwrap();
    let mut reconciler = component_reconciler().with_recorder(recorder.clone());
    simulate::run(&scenario, &mut reconciler).unwrap();
    recorder.flush();
    assert_eq!(recorder.stats().lines_dropped.load(Ordering::Relaxed), 0);
}

fn cli(args: &[&str]) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(std::iter::once("clb-host").chain(args.iter().copied()), &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

/// `clb-host replay` in process, with the next guest given for `swap` lines.
pub fn clb_replay(traces: &[&Path], extra: &[&str]) -> (u8, String, String) {
    let next = format!("next-guest={}", guest_files().1.display());
    let mut args = vec!["replay", "--swap-component", &next];
    args.extend_from_slice(extra);
    let traces: Vec<String> = traces.iter().map(|t| t.display().to_string()).collect();
    args.extend(traces.iter().map(String::as_str));
    cli(&args)
}

/// Regenerate with `CLB_BLESS_TRACES=1 cargo test --release -p clb-tests golden` (docs/traces.md).
// Upstream TestBuildServiceGatewayRemovalDTO (its inbound half; outbound removals are the outbound lifecycle's) and
// TestRemoveBackendPoolReferenceFromServicesDTO.
#[test]
fn golden_traces_are_what_simulate_records_for_every_scenario() {
    let bless = std::env::var_os("CLB_BLESS_TRACES").is_some();
    let dir = scratch("golden");
    let mut stale = Vec::new();
    for scenario in scenario_files() {
        let out = dir.join(golden(&scenario).file_name().unwrap());
        record(&scenario, &out);
        let recorded = std::fs::read_to_string(&out).unwrap();
        let committed = std::fs::read_to_string(golden(&scenario)).unwrap_or_default();
        if without_shas(&recorded) != without_shas(&committed) {
            if bless {
                std::fs::create_dir_all(golden_dir()).unwrap();
                std::fs::write(golden(&scenario), &recorded).unwrap();
            } else {
                stale.push(golden(&scenario).display().to_string());
            }
        }
    }
    let expected: std::collections::BTreeSet<_> = scenario_files().iter().map(|s| golden(s)).collect();
    let present: std::collections::BTreeSet<_> =
        std::fs::read_dir(golden_dir()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(present, expected, "tests/traces/ holds exactly one trace per scenario");
    assert!(
        stale.is_empty(),
        "these golden traces differ from what simulate records now; review the change and run \
         `CLB_BLESS_TRACES=1 cargo test --release -p clb-tests golden`: {stale:#?}"
    );
}

pub fn golden_traces() -> Vec<PathBuf> {
    scenario_files().iter().map(|s| golden(s)).collect()
}

#[test]
fn every_golden_trace_replays_identically_under_clb_host_replay() {
    let traces = golden_traces();
    let refs: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = clb_replay(&refs, &[]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    assert_eq!(out.lines().filter(|l| l.ends_with("calls, identical")).count(), traces.len(), "{out}");
}

/// A copy of the first-service trace with the result of its `at`-th call that returns a step
/// made to say `idle: true` where it said false (or the other way round).
pub fn with_one_result_changed(dir: &Path) -> (PathBuf, u64) {
    let source = golden_traces().into_iter().find(|p| p.to_string_lossy().contains("a-first-service")).unwrap();
    let text = std::fs::read_to_string(source).unwrap();
    let mut changed_seq = None;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if changed_seq.is_none()
                && line.contains("\"call\":\"tracker.complete\"")
                && line.ends_with(",\"idle\":false}}")
            {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                changed_seq = value["seq"].as_u64();
                line.replace(",\"idle\":false}}", ",\"idle\":true}}")
            } else {
                line.to_owned()
            }
        })
        .collect();
    let path = dir.join("changed.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    (path, changed_seq.expect("a complete that is not idle"))
}

#[test]
fn a_trace_with_one_recorded_result_changed_diverges_at_exactly_that_call() {
    let dir = scratch("changed");
    let (path, seq) = with_one_result_changed(&dir);
    let (code, out, err) = clb_replay(&[&path], &["--json"]);
    assert_eq!(code, EXIT_REFUSED, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let divergences = report["traces"][0]["divergences"].as_array().unwrap();
    assert_eq!(divergences.len(), 1, "{out}");
    assert_eq!(divergences[0]["seq"].as_u64(), Some(seq), "{out}");
    assert_eq!(report["identical"], false);
    let (code, out, _) = clb_replay(&[&path], &[]);
    assert_eq!(code, EXIT_REFUSED);
    assert!(out.contains(&format!(": seq {seq}: tracker.complete differs")), "{out}");
    assert!(out.contains("  recorded: ") && out.contains("  replayed: "), "{out}");
}

#[test]
fn a_truncated_or_malformed_trace_exits_2_with_the_file_and_line() {
    let dir = scratch("malformed");
    let source = golden_traces().into_iter().next().unwrap();
    let text = std::fs::read_to_string(source).unwrap();
    let truncated = dir.join("truncated.jsonl");
    std::fs::write(&truncated, &text[..text.len() - 10]).unwrap();
    let lines = text.lines().count();
    let (code, _, err) = clb_replay(&[&truncated], &[]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains(&format!("truncated.jsonl:{lines}: ")), "{err}");

    let mut bad: Vec<&str> = text.lines().collect();
    bad[2] = "{\"seq\":1,\"call\":\"tracker.tick\",\"args\":{\"self\":0,\"now-ms\":5},\"result\":null}";
    let malformed = dir.join("malformed.jsonl");
    std::fs::write(&malformed, bad.join("\n") + "\n").unwrap();
    let (code, _, err) = clb_replay(&[&malformed], &[]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("malformed.jsonl:3: ") && err.contains("now-ms"), "{err}");

    let headless = dir.join("headless.jsonl");
    std::fs::write(&headless, text.lines().skip(1).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let (code, _, err) = clb_replay(&[&headless], &[]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("headless.jsonl:1: "), "{err}");
}

/// The hot-swap scenario without its swaps, recorded through the built-in logic: its Service
/// `api` carries the annotation the next guest warns about.
pub fn legacy_annotation_trace() -> PathBuf {
    static TRACE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TRACE
        .get_or_init(|| {
            let source =
                scenario_files().into_iter().find(|p| p.to_string_lossy().contains("a-hot-swap-mid-stream")).unwrap();
            let text = std::fs::read_to_string(source).unwrap();
            let text: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("- swap:")).collect();
            let dir = process_dir().join("legacy");
            std::fs::create_dir_all(&dir).unwrap();
            let scenario_path = dir.join("legacy.yaml");
            std::fs::write(&scenario_path, text.join("\n") + "\n").unwrap();
            let out = dir.join("legacy.jsonl");
            record(&scenario_path, &out);
            out
        })
        .clone()
}

/// The shadow check: the next guest adds one Warning Event for Services annotated
/// `clb.test/legacy`; replayed over a trace the built-in logic recorded, the only divergences are
/// that Event's — the command ids it shifts are aligned, its Events answered.
#[test]
fn replaying_through_the_next_guest_reports_only_the_divergences_its_new_rule_causes() {
    let source = legacy_annotation_trace();
    let source = source.as_path();
    let next = guest_files().1.display().to_string();
    let (code, out, err) = clb_replay(&[source], &["--component", &next, "--all-divergences", "--json"]);
    assert_eq!(code, EXIT_REFUSED, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let divergences = report["traces"][0]["divergences"].as_array().unwrap();
    assert!(!divergences.is_empty(), "{out}");
    assert_eq!(report["by-kind"], serde_json::json!({"emit-event": divergences.len()}), "{out}");
    for divergence in divergences {
        assert!(divergence["replayed"].to_string().contains("LegacyAnnotation"), "{out}");
        assert!(!divergence["recorded"].to_string().contains("LegacyAnnotation"), "{out}");
    }
}

#[test]
fn the_committed_schema_is_what_the_built_in_component_says() {
    let (code, out, err) = cli(&["schema"]);
    assert_eq!(code, EXIT_OK, "{err}");
    let path = root().join("hosts/schema/clb-reconciler.json");
    if std::env::var_os("CLB_BLESS_TRACES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &out).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == out, "{} is stale: regenerate with `clb-host schema > {}`", path.display(), path.display());
    for call in ["tracker.observe", "tracker.create", "pool-queue.drain-and-group", "validate-config", "place-service"]
    {
        assert!(out.contains(&format!("\"call\": \"{call}\"")), "{call} missing");
    }
}

#[test]
fn simulate_record_writes_one_trace_per_scenario_into_a_directory() {
    let dir = scratch("simulate-record");
    let scenarios: Vec<PathBuf> =
        scenario_files().into_iter().filter(|p| p.starts_with(root().join("examples"))).take(2).collect();
    let out_dir = dir.join("traces/");
    let mut args = vec!["simulate".to_owned(), "--record".to_owned(), out_dir.display().to_string()];
    args.extend(scenarios.iter().map(|p| p.display().to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = cli(&refs);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    for scenario in &scenarios {
        let written = out_dir.join(golden(scenario).file_name().unwrap());
        let text = std::fs::read_to_string(&written).unwrap();
        assert!(text.starts_with("{\"format\":\"clb-trace\",\"version\":1,"), "{text}");
        let (code, out, err) = clb_replay(&[&written], &[]);
        assert_eq!(code, EXIT_OK, "{out}{err}");
    }
}

/// `run --record` must never make a reconcile wait on its disk: a trace that cannot be written
/// costs its lines, counted, and nothing else.
#[test]
fn a_trace_that_cannot_be_written_costs_counted_lines_and_never_a_call() {
    let options = RecordOptions {
        overflow: Overflow::Drop,
        ..RecordOptions::live(PathBuf::from("/nonexistent-clb-dir/trace.jsonl"))
    };
    let recorder =
        Recorder::start(options, clb_sandbox::trace::Signatures::of(builtin()), &ComponentRef::of(builtin(), None))
            .unwrap();
    let mut supervisor = clb_sandbox::supervisor::Supervisor::new(builtin()).with_recorder(recorder.clone());
    supervisor.start(&read_config("clb.yaml")).unwrap();
    for now in 0..50 {
        supervisor.tick(now * 1_000).unwrap();
    }
    recorder.flush();
    let stats = recorder.stats();
    assert!(stats.lines_dropped.load(Ordering::Relaxed) >= 50, "{stats:?}");
    assert_eq!(stats.lines_written.load(Ordering::Relaxed), 0);
    assert!(stats.write_errors.load(Ordering::Relaxed) >= 1);
}

/// A full file goes on in a new one, from a state: each file replays on its own.
#[test]
fn a_rotated_trace_file_begins_from_a_state_and_replays_on_its_own() {
    let dir = scratch("rotate");
    let path = dir.join("run.jsonl");
    let options = RecordOptions { max_file_bytes: 2_000, keep_files: 8, ..RecordOptions::live(path.clone()) };
    let recorder =
        Recorder::start(options, clb_sandbox::trace::Signatures::of(builtin()), &ComponentRef::of(builtin(), None))
            .unwrap();
    let mut supervisor = clb_sandbox::supervisor::Supervisor::new(builtin()).with_recorder(recorder.clone());
    supervisor.start(&read_config("clb.yaml")).unwrap();
    supervisor.observe(0, &[clb_sandbox::bindings::clb::reconciler::types::Observation::ListsComplete]).unwrap();
    let rotated = dir.join("run.jsonl.1");
    for now in 1..200 {
        // The writer learns that its file is full when it writes; let it catch up, so that the
        // next input starts the new file (a live controller does so at a later input).
        recorder.flush();
        supervisor.tick(now * 1_000).unwrap();
        if rotated.exists() && std::fs::read_to_string(&path).is_ok_and(|t| t.lines().count() > 3) {
            break;
        }
    }
    recorder.flush();
    assert!(rotated.exists(), "no rotation happened");
    let current = std::fs::read_to_string(&path).unwrap();
    assert!(current.lines().nth(1).unwrap().contains("\"call\":\"tracker.import-state\""), "{current}");
    for file in [&path, &rotated] {
        let (code, out, err) = clb_replay(&[file], &[]);
        assert_eq!(code, EXIT_OK, "{}: {out}{err}", file.display());
    }
}
