//! `clb-host inspect` and `clb-host validate`, run in-process: output and exit codes, and the
//! README's `validate` example as it shows it.

use clb_host::cli::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, run};
use clb_tests::*;

/// Runs `clb-host` in-process: the exit code, stdout and stderr.
pub(crate) fn clb_host(args: &[&str]) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(std::iter::once("clb-host").chain(args.iter().copied()), &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = process_dir().join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn inspect_shows_the_digest_exports_and_that_the_built_in_guest_imports_only_granted_interfaces() {
    let path = temp_file("builtin.wasm", clb_sandbox::BUILTIN_GUEST);
    let (code, out, _) = clb_host(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}");
    assert!(out.contains(&format!("sha256:   {}", builtin().info().sha256)), "{out}");
    assert!(out.contains("package:  clb:reconciler@0.14.0"), "{out}");
    assert!(out.contains("clb:reconciler/validation@0.14.0"), "{out}");
    assert!(!out.contains("NOT GRANTED"), "{out}");
    assert!(out.contains("verdict:  this host loads it"), "{out}");
}

#[test]
fn inspect_flags_a_wasi_import_and_exits_one() {
    let bytes = wat::parse_str(r#"(component (import "wasi:filesystem/types@0.2.0" (instance)))"#).unwrap();
    let path = temp_file("wasi.wasm", &bytes);
    let (code, out, _) = clb_host(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_REFUSED, "{out}");
    assert!(out.contains("wasi:filesystem/types@0.2.0  NOT GRANTED"), "{out}");
}

#[test]
fn validate_exits_zero_when_everything_is_admitted() {
    let config = fixture("configs/clb.yaml");
    let service = fixture("services/etp-local.yaml");
    let (code, out, err) = clb_host(&["validate", config.to_str().unwrap(), service.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    assert!(out.contains("configuration accepted: container-load-balancer mode"), "{out}");
    assert!(out.contains("service shop/etp-local: admitted"), "{out}");
}

#[test]
fn validate_exits_one_and_prints_the_reason_when_a_service_is_rejected() {
    let config = fixture("configs/clb.yaml");
    let services = [fixture("services/etp-local.yaml"), fixture("services/etp-cluster.yaml")];
    let (code, out, _) =
        clb_host(&["validate", config.to_str().unwrap(), services[0].to_str().unwrap(), services[1].to_str().unwrap()]);
    assert_eq!(code, EXIT_REFUSED, "{out}");
    assert!(out.contains("service shop/etp-cluster: rejected: UnsupportedExternalTrafficPolicy"), "{out}");
}

#[test]
fn validate_exits_one_when_the_configuration_is_refused() {
    let config = fixture("configs/pod-ip-on-standard.yaml");
    let (code, out, _) = clb_host(&["validate", config.to_str().unwrap()]);
    assert_eq!(code, EXIT_REFUSED, "{out}");
    assert!(out.contains("configuration refused: PodIPRequiresStandardV2 (loadBalancerSku)"), "{out}");
}

#[test]
fn validate_reads_several_services_from_one_multi_document_file() {
    let text = [
        std::fs::read_to_string(fixture("services/etp-local.yaml")).unwrap(),
        std::fs::read_to_string(fixture("services/ipv6-single-stack.yaml")).unwrap(),
    ]
    .join("---\n");
    let path = temp_file("two-services.yaml", format!("{text}---\n").as_bytes());
    let config = fixture("configs/clb.yaml");
    let (code, out, _) = clb_host(&["validate", config.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}");
    assert_eq!(out.matches(": admitted").count(), 2, "{out}");
}

#[test]
fn validate_exits_two_naming_the_file_and_line_of_malformed_yaml() {
    let path = temp_file(
        "broken.yaml",
        b"apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n  - port: eighty\n",
    );
    let config = fixture("configs/clb.yaml");
    let (code, _, err) = clb_host(&["validate", config.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains(&format!("{}:7:", path.display())), "{err}");
    assert!(err.contains("invalid i32, found \"eighty\""), "{err}");
}

#[test]
fn validate_exits_two_for_an_object_that_is_not_a_service() {
    let path = temp_file("node.yaml", b"apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n");
    let config = fixture("configs/clb.yaml");
    let (code, _, err) = clb_host(&["validate", config.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("node.yaml:"), "{err}");
}

#[test]
fn validate_exits_two_for_a_missing_file() {
    let (code, _, err) = clb_host(&["validate", "/nonexistent/azure.json"]);
    assert_eq!(code, EXIT_BAD_INPUT);
    assert!(err.contains("/nonexistent/azure.json: cannot read"), "{err}");
}

#[test]
fn validate_exits_two_for_a_malformed_cloud_configuration() {
    let path = temp_file(
        "bad-config.yaml",
        b"loadBalancerSku: standardV2\nmultipleStandardLoadBalancerConfigurations: lb-1\n",
    );
    let (code, _, err) = clb_host(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("bad-config.yaml:2:"), "{err}");
}

#[test]
fn run_exits_two_before_connecting_when_a_lease_setting_is_malformed_or_inconsistent() {
    let cases: &[(&[&str], &str)] = &[
        (&["--leader-elect-renew-deadline", "20s"], "renew deadline must be shorter than its lease duration"),
        (&["--leader-elect-retry-period", "10s"], "retry period must be positive and shorter than its renew deadline"),
        (&["--leader-elect-lease-duration", "15x"], "the unit must be ms, s, m or h"),
        (&["--leader-elect-retry-period", "soon"], "is not a duration"),
        (
            &["--azure-resource-lock-renew-period", "900s"],
            "renew period must be positive and shorter than its duration",
        ),
        (&["--azure-resource-lock-holder", ""], "the azure resource lock's holder is empty"),
    ];
    run_exits_two_before_connecting(cases);
}

/// `run` with each case's flags exits 2 saying its expected text, before it reaches for a
/// cluster (an unreachable kubeconfig would fail differently).
fn run_exits_two_before_connecting(cases: &[(&[&str], &str)]) {
    let config = fixture("configs/clb-azure.json");
    let config = config.to_str().unwrap();
    for (flags, expected) in cases {
        let mut args = vec!["run", "--cloud-config", config, "--credential", "none", "--kubeconfig", "/nonexistent"];
        args.extend_from_slice(flags);
        let (code, _, err) = clb_host(&args);
        assert_eq!(code, EXIT_BAD_INPUT, "{flags:?}: {err}");
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

// Regression: `--deadline-ms 0` and a `--memory-mib` of u64::MAX were accepted.
#[test]
fn limits_outside_their_range_are_refused_with_exit_2() {
    for args in
        [["--deadline-ms", "0"], ["--memory-mib", "18446744073709551615"], ["--memory-mib", "0"], ["--fuel", "0"]]
    {
        let config = fixture("configs/clb.yaml");
        let (code, _, err) = clb_host(&["validate", config.to_str().unwrap(), args[0], args[1]]);
        assert_eq!(code, EXIT_BAD_INPUT, "{args:?}: {err}");
        assert!(err.contains(args[0]), "{args:?}: {err}");
    }
}

// Regression: `run` with a refused cloud config exited 1, not 2: it cannot start.
#[test]
fn run_with_a_cloud_config_the_logic_refuses_cannot_start_and_exits_2() {
    let config = temp_file(
        "refused-cloud-config.yaml",
        b"loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standard\n\
          subscriptionId: s\nresourceGroup: rg\nlocation: eastus\nvnetName: vnet\n",
    );
    let (code, _, err) = clb_host(&[
        "run",
        "--cloud-config",
        config.to_str().unwrap(),
        "--credential",
        "none",
        "--leader-elect",
        "false",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("refuses the configuration"), "{err}");
}

/// A Service manifest, written with `key` twice in its metadata.
const DUPLICATE_KEY: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n  name: api\nspec:\n  type: LoadBalancer\n";

// Regression: each hostile input file is refused with exit 2, a message naming the file (and its
// line where there is one), quickly and in bounded memory.
#[test]
fn hostile_input_files_are_refused_with_exit_2_naming_the_file_and_what_is_wrong() {
    let config = fixture("configs/clb.yaml");
    let config = config.to_str().unwrap();
    let nested_flow = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let nested_block: String = (0..200).map(|depth| format!("{}k{depth}:\n", " ".repeat(depth))).collect();
    let mut not_text = b"apiVersion: v1\nkind: Service\nmetadata:\n  name: ".to_vec();
    not_text.extend([0xff, 0xfe, b'\n']);
    let mut huge = b"apiVersion: v1\nkind: Service\n".to_vec();
    huge.resize(2 << 20, b' ');
    // (what, the Service file's bytes or a path, what the error must say)
    let cases: Vec<(&str, std::path::PathBuf, &str)> = vec![
        (
            "a key twice in one mapping",
            temp_file("dup.yaml", DUPLICATE_KEY.as_bytes()),
            ":6: duplicate mapping key `name` is not allowed here",
        ),
        (
            "flow collections 100,000 deep",
            temp_file("flow.yaml", nested_flow.as_bytes()),
            ":1: nested deeper than 64 levels",
        ),
        (
            "block mappings 200 deep",
            temp_file("block.yaml", nested_block.as_bytes()),
            ":65: nested deeper than 64 levels",
        ),
        ("bytes that are not UTF-8", temp_file("bytes.yaml", &not_text), "not UTF-8 text (at byte 47)"),
        ("2 MiB", temp_file("huge.yaml", &huge), "larger than 1048576 bytes"),
        ("a device that never ends", "/dev/zero".into(), "larger than 1048576 bytes"),
    ];
    for (what, path, says) in cases {
        let (code, _, err) = clb_host(&["validate", config, path.to_str().unwrap()]);
        assert_eq!(code, EXIT_BAD_INPUT, "{what}: {err}");
        assert!(err.contains(&format!("{}:", path.display())) && err.contains(says), "{what}: {err}");
    }
    // And the cloud config is read the same way, and a component file up to 64 MiB.
    let (code, _, err) = clb_host(&["validate", "/dev/zero"]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("/dev/zero: larger than 1048576 bytes"), "{err}");
    let (code, _, err) = clb_host(&["inspect", "/dev/zero"]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("/dev/zero: larger than 67108864 bytes"), "{err}");
}

// Regression: two Services with one UID were accepted.
#[test]
fn validate_exits_two_when_two_services_share_a_uid() {
    let config = fixture("configs/clb.yaml");
    let text = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  uid: 6a1f0c8e-0000-4000-8000-000000000001\nspec:\n  type: LoadBalancer\n"
        )
    };
    let (web, api) =
        (temp_file("uid-web.yaml", text("web").as_bytes()), temp_file("uid-api.yaml", text("api").as_bytes()));
    let (code, _, err) =
        clb_host(&["validate", config.to_str().unwrap(), web.to_str().unwrap(), api.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains(&format!("{}: Service shop/api has UID", api.display())) && err.contains("shop/web"), "{err}");
}

// Regression: a UTF-8 byte order mark before the YAML is ignored, as Kubernetes does, instead of
// failing with a misleading error.
#[test]
fn a_manifest_that_starts_with_a_byte_order_mark_is_read_as_without_it() {
    let config = fixture("configs/clb.yaml");
    let text = std::fs::read(fixture("services/etp-local.yaml")).unwrap();
    let with_bom = temp_file("bom.yaml", &[&[0xef, 0xbb, 0xbf][..], &text].concat());
    let (code, out, err) = clb_host(&["validate", config.to_str().unwrap(), with_bom.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
}

// Regression: a scenario that swaps to a file that is not there, or advances by 10^12 hours, is an
// invalid scenario (exit 2), not a failed expectation or a run that never ends.
#[test]
fn a_scenario_swapping_to_a_missing_file_or_advancing_past_a_week_is_invalid_with_exit_2() {
    let scenario = |name: &str, step: &str| {
        let text = format!(
            "name: {name}\nconfig:\n  loadBalancerSku: standardv2\n  loadBalancerBackendPoolConfigurationType: podIP\nsteps:\n  - {step}\n"
        );
        temp_file(&format!("{name}.yaml"), text.as_bytes())
    };
    let cases = [
        (scenario("missing", "swap: {component: missing.wasm, expect: accepted}"), "step 1: swap to "),
        (scenario("folder", "swap: {component: ./, expect: accepted}"), "not a regular file"),
        (scenario("forever", "advance: 1000000000000h"), "at most 168h"),
        (scenario("week", "advance: 169h"), "at most 168h"),
    ];
    for (path, says) in cases {
        let (code, out, err) = clb_host(&["simulate", path.to_str().unwrap()]);
        assert_eq!(code, EXIT_BAD_INPUT, "{}: {out}{err}", path.display());
        assert!(err.contains(&path.display().to_string()) && err.contains(says), "{}: {err}", path.display());
    }
}

#[test]
fn a_gzip_or_zstd_component_file_is_taken_by_every_command_and_known_by_the_sha256_of_the_component() {
    let sha256 = &builtin().info().sha256;
    let (config, service) = (fixture("configs/clb.yaml"), fixture("services/etp-local.yaml"));
    let (config, service) = (config.to_str().unwrap(), service.to_str().unwrap());
    for (format, compressed) in [("gzip", gzip(clb_sandbox::BUILTIN_GUEST)), ("zstd", zstd(clb_sandbox::BUILTIN_GUEST))]
    {
        let path = temp_file(&format!("builtin.wasm.{format}"), &compressed);
        let path = path.to_str().unwrap();

        let (code, out, err) = clb_host(&["inspect", path]);
        assert_eq!(code, EXIT_OK, "{format}: {out}{err}");
        assert!(out.contains(&format!("sha256:   {sha256}")), "{format}: the decompressed component's: {out}");
        assert!(out.contains(&format!("size:     {} bytes", clb_sandbox::BUILTIN_GUEST.len())), "{format}: {out}");
        assert!(out.contains(&format!("compressed: {format}, {} bytes", compressed.len())), "{format}: {out}");

        let (code, out, err) = clb_host(&["validate", config, service, "--component", path]);
        assert_eq!(code, EXIT_OK, "{format}: {out}{err}");
        assert!(out.contains("admitted"), "{format}: {out}");
        let (code, out, err) = clb_host(&["schema", "--component", path]);
        assert_eq!(code, EXIT_OK, "{format}: {out}{err}");
    }
}

#[test]
fn a_truncated_compressed_component_file_exits_two_naming_the_file_and_the_format() {
    for (format, compressed) in [("gzip", gzip(clb_sandbox::BUILTIN_GUEST)), ("zstd", zstd(clb_sandbox::BUILTIN_GUEST))]
    {
        let path = temp_file(&format!("truncated.wasm.{format}"), &compressed[..compressed.len() / 2]);
        let path = path.to_str().unwrap();
        let config = fixture("configs/clb.yaml");
        for args in [vec!["inspect", path], vec!["validate", config.to_str().unwrap(), "--component", path]] {
            let (code, out, err) = clb_host(&args);
            assert_eq!(code, EXIT_BAD_INPUT, "{args:?}: {out}{err}");
            let expected = format!("{path}: not a component: the {format} stream is truncated or corrupt");
            assert!(err.contains(&expected), "{args:?}: expected {expected:?} in {err}");
        }
    }
}

#[test]
fn component_out_compress_gzip_writes_the_built_in_component_gzipped_and_names_its_sha256() {
    use std::io::Read as _;
    let path = temp_file("written.wasm.gz", b"");
    let (code, out, err) = clb_host(&["component", "--out", path.to_str().unwrap(), "--compress", "gzip"]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    let written = std::fs::read(&path).unwrap();
    assert!(
        out.contains(&format!("{} bytes (gzip of {} bytes)", written.len(), clb_sandbox::BUILTIN_GUEST.len())),
        "{out}"
    );
    assert!(out.contains(&builtin().info().sha256), "{out}");
    let mut decompressed = Vec::new();
    flate2::read::GzDecoder::new(&written[..]).read_to_end(&mut decompressed).unwrap();
    assert!(decompressed == clb_sandbox::BUILTIN_GUEST, "gunzip gives the built-in component back");
}

/// A log sink the tests read back: what the subscriber wrote, shared.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(format: clb_host::logging::LogFormat, ansi: bool) -> String {
    let sink = Captured::default();
    let writer = sink.clone();
    let subscriber = clb_host::logging::subscriber(format, "warn", move || writer.clone(), ansi);
    tracing::subscriber::with_default(subscriber, || {
        let _service = tracing::warn_span!("service", service = "shop/web").entered();
        tracing::warn!(id = 7, "command failed");
        tracing::info!("below the filter");
    });
    String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
}

// Regression: log lines carried ANSI colour codes into files and log collectors, and there was no
// format a log pipeline reads.
#[test]
fn log_lines_off_a_terminal_carry_no_colour_codes_and_log_format_json_writes_one_object_a_line() {
    use clb_host::logging::LogFormat;
    let text = logged(LogFormat::Text, false);
    assert!(text.contains("command failed") && text.contains("id=7") && text.contains("shop/web"), "{text}");
    assert!(!text.contains('\u{1b}') && !text.contains("below the filter"), "{text:?}");
    assert!(logged(LogFormat::Text, true).contains('\u{1b}'), "colour on a terminal");
    let json = logged(LogFormat::Json, false);
    let lines: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(lines.len(), 1, "{json}");
    assert_eq!(lines[0]["level"], "WARN", "{json}");
    assert_eq!(lines[0]["fields"]["message"], "command failed", "{json}");
    assert_eq!(lines[0]["fields"]["id"], 7, "{json}");
    assert_eq!(lines[0]["span"]["name"], "service", "{json}");
    assert_eq!(lines[0]["span"]["service"], "shop/web", "{json}");
}

#[test]
fn log_format_is_taken_by_every_command_and_an_unknown_one_is_refused() {
    let path = temp_file("builtin-for-logs.wasm", clb_sandbox::BUILTIN_GUEST);
    let mut format = None;
    let args = ["clb-host", "inspect", path.to_str().unwrap(), "--log-format", "json"];
    let code = clb_host::cli::run_with_logging(args, &mut Vec::new(), &mut Vec::new(), |f| format = Some(f));
    assert_eq!((code, format), (EXIT_OK, Some(clb_host::logging::LogFormat::Json)));
    let (code, _, err) = clb_host(&["--log-format", "xml", "inspect", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_BAD_INPUT);
    assert!(err.contains("invalid value 'xml' for '--log-format"), "{err}");
}

#[test]
fn a_write_budget_flag_that_is_malformed_repeated_or_refused_by_the_logic_exits_2_saying_why() {
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/scenarios/a-first-service-with-endpoints-gets-a-load-balancer-and-its-pods-in-nrp.yaml");
    let scenario = scenario.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--write-budget", "arm-writes=0/s:1"], "InvalidWriteBudget"),
        (&["--write-budget", "arm-writes=1/s:0"], "the rate must be 1 to 600000 per minute and the burst 1 to 100000"),
        (&["--write-budget", "nrp=1/s:1"], "\"nrp\" is not an operation with a write budget"),
        (&["--write-budget", "arm-writes=5/h:1"], "the rate's unit must be /s or /min"),
        (
            &["--write-budget", "arm-writes=1/s:1", "--write-budget", "arm-writes=2/s:1"],
            "names arm-writes more than once",
        ),
    ];
    for (flags, why) in cases {
        let args: Vec<&str> = ["simulate", scenario].iter().chain(flags).copied().collect();
        let (code, out, err) = clb_host(&args);
        assert_eq!(code, EXIT_BAD_INPUT, "{flags:?}: {out}{err}");
        assert!(err.contains(why), "{flags:?}: {err}");
    }
    let budgets = ["--write-budget", "arm-writes=2/s:5", "--write-budget", "update-address-locations=600/min:2"];
    let (code, out, err) = clb_host(&[&["simulate", scenario][..], &budgets].concat());
    assert_eq!(code, EXIT_OK, "a budget the logic takes: {out}{err}");
}

#[test]
fn run_refuses_an_unknown_divergence_kind_and_shadow_flags_without_a_candidate_with_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--shadow-logic-file", "/nonexistent.wasm", "--shadow-allow", "emit-event,reworded"],
            "`reworded` is not a divergence kind; one of: emit-event, read-nrp",
        ),
        (&["--promote-after", "10"], "--shadow-logic-file"),
        (&["--shadow-allow", "emit-event"], "--shadow-logic-file"),
        (&["--shadow-logic-file", "/nonexistent.wasm", "--promote-after", "0"], "--promote-after"),
        (
            &["--shadow-logic-file", "a.wasm", "--shadow-logic-configmap", "kube-system/clb:logic"],
            "cannot be used with",
        ),
    ];
    run_exits_two_before_connecting(cases);
}

#[test]
fn the_readmes_validate_example_prints_what_the_readme_shows() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let command =
        "$ cargo run --release -q -p clb-host -- validate examples/cloud-config.yaml examples/services/*.yaml";
    let shown: Vec<&str> =
        readme.lines().skip_while(|l| *l != command).skip(1).take_while(|l| !l.starts_with("```")).collect();
    assert!(!shown.is_empty(), "README.md shows `{command}` and its output");
    // The shell's glob, sorted as the shell sorts these names.
    let mut services: Vec<_> = std::fs::read_dir(root.join("examples/services"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    services.sort();
    let mut args = vec![root.join("examples/cloud-config.yaml")];
    args.extend(services);
    let args: Vec<&str> = std::iter::once("validate").chain(args.iter().map(|p| p.to_str().unwrap())).collect();
    let (code, out, err) = clb_host(&args);
    assert_eq!(code, EXIT_REFUSED, "the README says it exits 1: {out}{err}");
    let printed = out.replace(&format!("{}/", root.display()), "");
    assert_eq!(printed.lines().collect::<Vec<_>>(), shown);
}
