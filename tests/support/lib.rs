//! What the integration tests and the benchmarks share: one runtime per process, the built-in
//! and test guests, fixture paths, and the WIT → logic conversion of the differential runs.

pub mod apiserver;
pub mod cluster;
pub mod registry;
pub mod scratch;
pub mod watch_proxy;
pub mod webhook;

pub use scratch::{Scratch, process_dir, scratch};

use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::{Limits, LoadedLogic, Runtime};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const HOSTILE_GUEST: &[u8] = include_bytes!(env!("CLB_HOSTILE_GUEST"));
/// The second version of the logic (`tests/next-guest`): state version 3 (the built-in writes 2), one extra rule, a trap
/// trigger.
pub const NEXT_GUEST: &[u8] = include_bytes!(env!("CLB_NEXT_GUEST"));
/// The next guest built with `destructive-tick`: every tick proposes deleting a load balancer,
/// so the swap self-check refuses it.
pub const DESTRUCTIVE_GUEST: &[u8] = include_bytes!(env!("CLB_DESTRUCTIVE_GUEST"));

/// The test guests by the names scenarios give them in `swap` steps.
pub fn test_guests() -> std::collections::BTreeMap<String, &'static [u8]> {
    [
        ("next-guest".to_owned(), NEXT_GUEST),
        ("hostile-guest".to_owned(), HOSTILE_GUEST),
        ("destructive-guest".to_owned(), DESTRUCTIVE_GUEST),
    ]
    .into_iter()
    .collect()
}

/// The built-in logic behind a supervisor that can swap to the test guests.
pub fn component_reconciler() -> clb_simulator::simulate::ComponentReconciler<'static> {
    clb_simulator::simulate::ComponentReconciler::new(builtin()).with_components(runtime(), test_guests())
}

/// `bytes` as `gzip -9` writes them.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// `bytes` as `zstd -19` writes them (with the content checksum).
pub fn zstd(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = zstd::Encoder::new(Vec::new(), 19).unwrap();
    encoder.include_checksum(true).unwrap();
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// One engine per process, as in production.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::new().expect("the engine starts"))
}

/// The built-in logic, compiled once.
pub fn builtin() -> &'static LoadedLogic {
    static LOGIC: OnceLock<LoadedLogic> = OnceLock::new();
    LOGIC.get_or_init(|| {
        runtime().load(clb_sandbox::BUILTIN_GUEST, Limits::default()).expect("the built-in guest loads")
    })
}

pub fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(relative)
}

pub fn read_service(file: &str) -> wit::Service {
    let path = fixture(&format!("services/{file}"));
    let services = clb_executor::inputs::read_manifests::<k8s_openapi::api::core::v1::Service>(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(services.len(), 1, "{file} holds one Service");
    clb_executor::records::service(&services[0])
}

pub fn read_config(file: &str) -> wit::Config {
    clb_executor::inputs::read_config(&fixture(&format!("configs/{file}"))).unwrap_or_else(|e| panic!("{e}"))
}

// The WIT ↔ logic conversions of the differential runs live in `clb_sandbox::native`, the native
// library behind the simulator's trait in `clb_simulator::native` (the fuzz crate's differential
// target uses them too); re-exported here under their old names.
pub use clb_sandbox::native::{
    command_to_wit, component_admission, component_verdict, config_to_model, native_admission, native_verdict,
    observation_to_model, outcome_to_model, service_to_model, step_to_wit,
};
pub use clb_simulator::native::NativeReconciler;

/// The tool a harness script provides (`harness/cosign/build.sh`, `harness/kustomize/build.sh`,
/// `harness/browser/chromium.sh`: it builds or installs the tool where it is missing and prints
/// its path last), run once per script for the test binary; the scripts serialise builds across
/// binaries themselves. Panics, with the script's own message above, when it cannot.
pub fn harness_tool(script: &str) -> PathBuf {
    static TOOLS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut tools = TOOLS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, path)) = tools.iter().find(|(name, _)| name == script) {
        return path.clone();
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness").join(script);
    let output = std::process::Command::new("bash")
        .arg(&path)
        .env("CLB_CACHE", cache_dir())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("running {}: {error}", path.display()));
    assert!(
        output.status.success(),
        "{} could not provide its tool ({}); see its message above",
        path.display(),
        output.status
    );
    let stdout = String::from_utf8(output.stdout).expect("a path");
    let tool = PathBuf::from(
        stdout
            .lines()
            .last()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .unwrap_or_else(|| panic!("{script} printed no path")),
    );
    tools.push((script.to_owned(), tool.clone()));
    tool
}

/// Where the tests' caches are: `$CLB_CACHE`, else the user's own
/// `${XDG_CACHE_HOME:-~/.cache}/clb-reconciler`, as `harness/apiserver/build.sh` and
/// `hosts/setup.sh` decide it (CI sets `/var/cache/clb-reconciler`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLB_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    base.join("clb-reconciler")
}

/// `CLB_BENCH_SHRINK=N` (default 1): every benchmark's sizes, counts and repetitions divided by
/// N. CI runs each bench with N = 10, so that none rots (its assertions still run) in a
/// fraction of the time; the figures in BENCHMARKS.md are from N = 1. A value that is not a
/// positive integer is refused, not read as 1.
pub fn shrink() -> usize {
    match std::env::var("CLB_BENCH_SHRINK") {
        Err(_) => 1,
        Ok(v) => {
            v.parse().ok().filter(|n| *n > 0).unwrap_or_else(|| panic!("CLB_BENCH_SHRINK={v}: a positive integer"))
        }
    }
}

/// `CLB_BENCH_SCALE=N` (default 1): the benchmark cluster ([`cluster`]) multiplied by N — nodes
/// and Services × N, 30 pods per Service — for the figures at AKS's sizes (5× is 5,000 nodes and
/// 150,000 pods). Applied after [`shrink`]. A value that is not a positive integer up to 20 is
/// refused, not read as 1.
pub fn bench_scale() -> usize {
    match std::env::var("CLB_BENCH_SCALE") {
        Err(_) => 1,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| (1..=20).contains(n))
            .unwrap_or_else(|| panic!("CLB_BENCH_SCALE={v}: a positive integer up to 20")),
    }
}

/// `n` divided by [`shrink`], at least 1.
pub fn scaled(n: usize) -> usize {
    (n / shrink()).max(1)
}

/// Median time of one iteration of `f` over 15 timed batches of `iterations` (benchmarks), both
/// [`scaled`].
pub fn median_per_iteration(iterations: u32, mut f: impl FnMut()) -> std::time::Duration {
    let batches = scaled(15);
    let iterations = scaled(iterations as usize) as u32;
    let samples: Vec<std::time::Duration> = (0..batches)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed() / iterations
        })
        .collect();
    median(samples)
}

/// The median of `samples` (the upper one of an even count).
pub fn median(mut samples: Vec<std::time::Duration>) -> std::time::Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Limits that never stop a benchmark, while still being metered as the product meters.
pub fn bench_limits() -> Limits {
    Limits { fuel: u64::MAX / 4, deadline: std::time::Duration::from_secs(600), memory_bytes: 4 << 30 }
}

/// Every scenario file under `examples/scenarios/` and `tests/scenarios/`, sorted.
pub fn scenario_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("../examples/scenarios"), root.join("scenarios")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "yaml")));
    }
    files.sort();
    files
}

/// The Azure scope the client and emulator tests use (distinct names, so a test can see which
/// one went where in an ARM ID).
pub fn test_scope() -> clb_azure::Scope {
    clb_azure::Scope {
        subscription: "sub-1".into(),
        resource_group: "rg-1".into(),
        location: "eastus2".into(),
        vnet_resource_group: "rg-net".into(),
        vnet: "vnet-1".into(),
        service_gateway: clb_azure::DEFAULT_SERVICE_GATEWAY.into(),
    }
}

/// Forwards each line written to it (a command's output, for a test that waits for a line
/// such as `listening on …`).
pub struct LineSender(pub std::sync::mpsc::Sender<String>, pub Vec<u8>);

impl std::io::Write for LineSender {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.1.extend_from_slice(bytes);
        while let Some(end) = self.1.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.1.drain(..=end).collect();
            let _ = self.0.send(String::from_utf8_lossy(&line).trim_end().to_owned());
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
