//! The other hosts of the same `.wasm` (`hosts/python`, `hosts/js`, `hosts/go`): each replays
//! every golden trace byte-identically, and reports a changed trace and a truncated one exactly
//! as `clb-host replay` does (`docs/traces.md`). `hosts/setup.sh` installs them (a venv,
//! `npm ci` and the Go replay command, cached outside the clone); these tests run it first, so
//! they need nothing set up by hand — only python3 with pip, Node with npm, Go, and the package
//! registries and module proxy.

use super::traces::{golden_traces, guest_files, with_one_result_changed};
use clb_tests::scratch;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv's python, once `hosts/setup.sh` has installed both hosts.
pub(crate) fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let output = Command::new("bash").arg(root().join("hosts/setup.sh")).current_dir(root()).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "hosts/setup.sh failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        PathBuf::from(stdout.lines().last().expect("setup.sh prints the venv's python").trim())
    })
}

/// The Go host's replay command, as `hosts/setup.sh` builds it (static, outside the clone).
pub(crate) fn go_replay() -> PathBuf {
    python(); // setup.sh builds it
    clb_tests::cache_dir().join("bin/clb-replay-go")
}

/// Go's module and build caches, where `hosts/setup.sh` puts them.
pub(crate) fn go_env(command: &mut Command) -> &mut Command {
    let cache = clb_tests::cache_dir().join("go");
    command
        .env("GOMODCACHE", cache.join("mod"))
        .env("GOCACHE", cache.join("build"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-buildvcs=false")
}

/// Which host, and how to start its replay.
#[derive(Clone, Copy)]
pub(crate) enum Host {
    Python,
    Js,
    Go,
}

/// Replays `traces` in `host` through the built-in logic, or `component`.
pub(crate) fn replay(host: Host, traces: &[&Path], component: Option<&Path>, extra: &[&str]) -> (i32, String, String) {
    let (builtin, next) = guest_files();
    let component = component.unwrap_or(builtin);
    let mut command = match host {
        Host::Python => {
            let mut c = Command::new(python());
            c.args(["-m", "clb_reconciler", "replay"]);
            c
        }
        Host::Js => {
            python(); // setup.sh installs both
            let mut c = Command::new("node");
            c.arg(root().join("hosts/js/replay.mjs"));
            c
        }
        Host::Go => Command::new(go_replay()),
    };
    command.args(traces).arg("--component").arg(component);
    command.arg("--swap-component").arg(format!("next-guest={}", next.display()));
    command.args(extra);
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn every_golden_trace_replays_identically(host: Host) {
    let traces = golden_traces();
    let refs: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    let (code, out, err) = replay(host, &refs, None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().filter(|l| l.ends_with("calls, identical")).count(), traces.len(), "{out}");
    let (_, rust, _) = super::traces::clb_replay(&refs, &[]);
    assert_eq!(out, rust, "the same report as clb-host replay");
}

/// Trap texts are each runtime's own; everything else of a report is the same.
fn without_trap_texts(report: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(report).unwrap();
    if let Some(traces) = value["traces"].as_array_mut() {
        for d in traces.iter_mut().flat_map(|t| t["divergences"].as_array_mut().into_iter().flatten()) {
            for side in ["recorded", "replayed"] {
                if d[side].get("trap").is_some() {
                    d[side] = serde_json::json!({"trap": "…"});
                }
            }
        }
    }
    value
}

fn a_changed_trace_is_reported_as_clb_host_reports_it(host: Host) {
    let dir = scratch(&format!("hosts-{}", host as u8));
    let (path, seq) = with_one_result_changed(&dir);
    let (code, out, err) = replay(host, &[&path], None, &["--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let (_, rust, _) = super::traces::clb_replay(&[&path], &["--json"]);
    assert_eq!(without_trap_texts(&out), without_trap_texts(&rust));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["traces"][0]["divergences"][0]["seq"].as_u64(), Some(seq));

    let text = std::fs::read_to_string(&golden_traces()[0]).unwrap();
    let truncated = dir.join("truncated.jsonl");
    std::fs::write(&truncated, &text[..text.len() - 10]).unwrap();
    let (code, _, err) = replay(host, &[&truncated], None, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("truncated.jsonl:{}: ", text.lines().count())), "{err}");
}

#[test]
fn every_golden_trace_replays_identically_under_the_python_host() {
    every_golden_trace_replays_identically(Host::Python);
}

#[test]
fn every_golden_trace_replays_identically_under_the_javascript_host() {
    every_golden_trace_replays_identically(Host::Js);
}

#[test]
fn every_golden_trace_replays_identically_under_the_go_host() {
    every_golden_trace_replays_identically(Host::Go);
}

#[test]
fn the_python_host_reports_a_changed_and_a_truncated_trace_as_clb_host_does() {
    a_changed_trace_is_reported_as_clb_host_reports_it(Host::Python);
}

#[test]
fn the_javascript_host_reports_a_changed_and_a_truncated_trace_as_clb_host_does() {
    a_changed_trace_is_reported_as_clb_host_reports_it(Host::Js);
}

#[test]
fn the_go_host_reports_a_changed_and_a_truncated_trace_as_clb_host_does() {
    a_changed_trace_is_reported_as_clb_host_reports_it(Host::Go);
}

/// The shadow check in another language: the next guest over the hot-swap trace.
#[test]
fn the_other_hosts_find_the_same_divergences_of_the_next_guest_as_clb_host() {
    let source = super::traces::legacy_annotation_trace();
    let source = source.as_path();
    let next = &guest_files().1;
    let next_text = next.display().to_string();
    let args = ["--all-divergences", "--json"];
    let (_, rust, _) = super::traces::clb_replay(&[source], &["--component", &next_text, args[0], args[1]]);
    for host in [Host::Python, Host::Js, Host::Go] {
        let (code, out, err) = replay(host, &[source], Some(next), &args);
        assert_eq!(code, 1, "{out}{err}");
        assert_eq!(without_trap_texts(&out), without_trap_texts(&rust));
    }
}

/// The canonical text (docs/traces.md) of `value`, a JSON value of the schema type `ty`: records'
/// fields in WIT order, where serde_json's maps sort them.
fn canonical(value: &serde_json::Value, ty: &serde_json::Value) -> String {
    use serde_json::Value;
    let Some((kind, arg)) = ty.as_object().and_then(|o| o.iter().next()) else { return value.to_string() };
    let join = |items: Vec<String>, open: &str, close: &str| format!("{open}{}{close}", items.join(","));
    match (kind.as_str(), value) {
        ("record", _) => join(
            arg.as_array()
                .unwrap()
                .iter()
                .map(|f| format!("{}:{}", f["name"], canonical(&value[f["name"].as_str().unwrap()], &f["type"])))
                .collect(),
            "{",
            "}",
        ),
        ("list", Value::Array(items)) => join(items.iter().map(|x| canonical(x, arg)).collect(), "[", "]"),
        ("tuple", Value::Array(items)) => {
            join(items.iter().zip(arg.as_array().unwrap()).map(|(x, t)| canonical(x, t)).collect(), "[", "]")
        }
        ("option", Value::Null) => "null".to_owned(),
        ("option", _) => canonical(value, arg),
        ("variant" | "result", _) => {
            let tag = value["tag"].as_str().unwrap();
            let case = match arg {
                Value::Array(cases) => cases.iter().find(|c| c["name"] == tag).unwrap()["type"].clone(),
                _ => arg[tag].clone(),
            };
            match value.get("val") {
                Some(val) => format!(r#"{{"tag":{},"val":{}}}"#, value["tag"], canonical(val, &case)),
                None => format!(r#"{{"tag":{}}}"#, value["tag"]),
            }
        }
        _ => value.to_string(),
    }
}

/// A trace of the pure functions over every configuration and Service of the golden traces,
/// recorded with no results: every call diverges, and each host's report shows what it replayed.
/// The golden traces hold no `admit-service`, whose arguments are past 16 flat values and so go
/// through the guest's memory in the canonical ABI.
fn pure_calls_trace(dir: &Path) -> PathBuf {
    let schema = std::fs::read_to_string(root().join("hosts/schema/clb-reconciler.json")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&schema).unwrap();
    let admit = schema["functions"].as_array().unwrap().iter().find(|f| f["call"] == "admit-service").unwrap();
    let (config_type, service_type) = (&admit["params"][0]["type"], &admit["params"][1]["type"]);
    let (mut configs, mut services) = (Vec::new(), Vec::new());
    for trace in golden_traces() {
        for line in std::fs::read_to_string(trace).unwrap().lines().skip(1) {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            let args = &line["args"];
            match line["call"].as_str() {
                Some("tracker.create") => configs.push(canonical(&args["config"], config_type)),
                Some("tracker.observe") => services.extend(
                    args["batch"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|o| o["tag"] == "service-upserted")
                        .map(|o| canonical(&o["val"], service_type)),
                ),
                _ => {}
            }
        }
    }
    for list in [&mut configs, &mut services] {
        list.sort();
        list.dedup();
    }
    let mut lines = vec![r#"{"format":"clb-trace","version":1,"source":"pure calls"}"#.to_owned()];
    for config in &configs {
        let seq = lines.len() - 1;
        lines.push(format!(r#"{{"seq":{seq},"call":"validate-config","args":{{"config":{config}}},"result":null}}"#));
        for service in &services {
            let seq = lines.len() - 1;
            lines.push(format!(
                r#"{{"seq":{seq},"call":"admit-service","args":{{"config":{config},"service":{service}}},"result":null}}"#
            ));
        }
    }
    assert!(lines.len() > 100, "configurations and Services to admit: {}", lines.len());
    let path = dir.join("pure-calls.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn every_host_answers_the_pure_functions_as_clb_host_does() {
    let dir = scratch("hosts-pure");
    let trace = pure_calls_trace(&dir);
    let args = ["--all-divergences", "--json"];
    let (code, rust, err) = super::traces::clb_replay(&[&trace], &args);
    assert_eq!(code, 1, "{rust}{err}");
    for host in [Host::Python, Host::Js, Host::Go] {
        let (code, out, err) = replay(host, &[&trace], None, &args);
        assert_eq!(code, 1, "{out}{err}");
        assert_eq!(out, rust, "the same answers as clb-host");
    }
}

/// Each host's own unit tests (codec, line reader, API, replay), given both components so that
/// none is skipped.
fn own_tests(host: Host) -> (bool, String) {
    let (builtin, next) = guest_files();
    let mut command = match host {
        Host::Python => {
            let mut c = Command::new(python());
            c.args(["-m", "unittest", "discover", "-v", "-s"]).arg(root().join("hosts/python/tests"));
            c
        }
        Host::Js => {
            python();
            let mut c = Command::new("node");
            c.arg("--test").arg(root().join("hosts/js/test"));
            c
        }
        Host::Go => {
            python(); // setup.sh downloads the modules
            let mut c = Command::new("go");
            go_env(&mut c).args(["test", "-count=1", "-v", "./..."]).current_dir(root().join("hosts/go"));
            c
        }
    };
    if !matches!(host, Host::Go) {
        command.current_dir(root());
    }
    let output = command
        .env("CLB_GUEST", builtin)
        .env("CLB_COMPONENT", builtin)
        .env("CLB_NEXT_GUEST", next)
        .env("CLB_NEXT_COMPONENT", next)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn the_python_hosts_own_tests_pass_with_none_skipped() {
    let (passed, text) = own_tests(Host::Python);
    assert!(passed, "{text}");
    assert!(!text.contains("skipped"), "{text}");
    assert!(text.contains("\nOK"), "{text}");
}

#[test]
fn the_javascript_hosts_own_tests_pass_with_none_skipped() {
    let (passed, text) = own_tests(Host::Js);
    assert!(passed, "{text}");
    assert!(text.contains("# skipped 0") && text.contains("# fail 0"), "{text}");
}

#[test]
fn the_go_hosts_own_tests_pass_with_none_skipped() {
    let (passed, text) = own_tests(Host::Go);
    assert!(passed, "{text}");
    assert!(!text.contains("--- SKIP") && text.contains("--- PASS"), "{text}");
}

/// Runs `command`, failing the test with its output unless it succeeds; returns its stdout.
fn succeeds(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{command:?} failed ({}):\n{out}{err}", output.status);
    out.into_owned()
}

/// Replays every golden trace with `program` from `dir`, where nothing of the checkout is.
fn replays_every_golden_trace_from(dir: &Path, program: &Path) {
    let (builtin, next) = guest_files();
    let traces = golden_traces();
    let out = succeeds(
        Command::new(program)
            .args(&traces)
            .arg("--component")
            .arg(builtin)
            .arg("--swap-component")
            .arg(format!("next-guest={}", next.display()))
            .current_dir(dir)
            .env_remove("CLB_SCHEMA"),
    );
    assert_eq!(out.lines().filter(|l| l.ends_with("calls, identical")).count(), traces.len(), "{out}");
}

#[test]
fn the_javascript_host_packed_by_npm_installs_into_an_empty_project_and_replays_every_golden_trace_there() {
    python(); // hosts/setup.sh: npm's cache holds the dependencies
    let dir = scratch("hosts-npm");
    let (pack, project) = (dir.join("pack"), dir.join("project"));
    std::fs::create_dir_all(&pack).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    let npm_cache = clb_tests::cache_dir().join("npm");
    // Packed from a copy of hosts/js and hosts/schema: `prepack` copies the schema in for the
    // time of the pack, which the other tests' JavaScript, reading hosts/js, must not see.
    let source = dir.join("hosts");
    std::fs::create_dir_all(source.join("js")).unwrap();
    succeeds(Command::new("cp").arg("-r").arg(root().join("hosts/schema")).arg(&source));
    for entry in std::fs::read_dir(root().join("hosts/js")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "node_modules") {
            succeeds(Command::new("cp").arg("-r").arg(&path).arg(source.join("js")));
        }
    }
    succeeds(
        Command::new("npm")
            .args(["pack", "--loglevel=error", "--pack-destination"])
            .arg(&pack)
            .current_dir(source.join("js")),
    );
    assert!(!source.join("js/schema.json").exists(), "npm pack leaves no copy of the schema behind");
    let tarball =
        std::fs::read_dir(&pack).unwrap().map(|e| e.unwrap().path()).next().expect("npm pack wrote a tarball");
    succeeds(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefer-offline", "--cache"])
            .arg(&npm_cache)
            .arg(&tarball)
            .current_dir(&project),
    );
    replays_every_golden_trace_from(&project, &project.join("node_modules/.bin/clb-replay-js"));
    // The integrator API, imported by the package's name.
    let script = "import { loadComponent, Tracker } from 'clb-reconciler';\n\
                  const component = await loadComponent(process.argv[2]);\n\
                  const { tag, val: tracker } = await Tracker.create(component, { 'backend-pool-type': 'podIP', \
                  'load-balancer-sku': 'standardV2', 'multiple-standard-load-balancers': [], 'write-budgets': null });\n\
                  if (tag !== 'ok') throw new Error('refused');\n\
                  console.log(JSON.stringify(tracker.observe(0n, [{ tag: 'lists-complete' }]).commands));\n";
    std::fs::write(project.join("use.mjs"), script).unwrap();
    let out = succeeds(Command::new("node").arg("use.mjs").arg(&guest_files().0).current_dir(&project));
    assert_eq!(out.trim(), r#"[{"id":"0","command":{"tag":"read-nrp"}}]"#);
}

#[test]
fn the_python_host_installed_by_pip_replays_every_golden_trace_from_a_folder_outside_the_checkout() {
    let venv = python().parent().unwrap().parent().unwrap().to_owned();
    let dir = scratch("hosts-pip");
    let where_from = succeeds(
        Command::new(python())
            .args(["-c", "import clb_reconciler, os; print(os.path.dirname(clb_reconciler.__file__))"])
            .current_dir(&dir),
    );
    let package = PathBuf::from(where_from.trim());
    assert!(package.starts_with(&venv), "imported from the venv, not the checkout: {}", package.display());
    assert!(package.join("schema.json").is_file(), "the installed package carries the schema");
    replays_every_golden_trace_from(&dir, &venv.join("bin/clb-replay-py"));
}

#[test]
fn the_go_hosts_static_replay_command_replays_every_golden_trace_from_a_folder_outside_the_checkout() {
    let dir = scratch("hosts-go");
    replays_every_golden_trace_from(&dir, &go_replay());
}
