//! Regenerates the seed corpora, `fuzz/corpus/<target>/seed-*`, from the example scenarios
//! (`examples/scenarios/*.yaml`) and the golden traces (`tests/traces/*.jsonl`):
//!
//! * `scenario` — the scenario files as they are;
//! * `records` — every object the scenarios apply, as JSON (behind the kind byte);
//! * `admission` — the Services of each scenario, with its configuration;
//! * `tracker`, `differential` — each scenario run natively (`simulate` with the library behind
//!   the `Reconciler` trait), its calls encoded as a program: the observations, the answers
//!   (as the world gives them for `tracker`, as recorded for `differential`), ticks and time;
//! * `state_import` — the state each of those runs ends with, and the fixture state of every version;
//! * `commands` — the commands each run issued, sixteen to a file;
//! * `backend_pools` — the pool-queue calls of the golden traces.
//!
//! `cargo run --release -p clb-fuzz --bin seed` (from anywhere in the workspace). Old seeds are
//! removed first; files not named `seed-*` (inputs fuzzing kept) are left alone.

use clb_fuzz::input::Enc;
use clb_fuzz::pools::{self, PoolOp};
use clb_fuzz::program::{Answer, Program, Step, Time};
use clb_guest::backend_pools::{Failure, GroupOutcome, OperationKind, PoolOperation, ServiceAssignment};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::logic::Logic;
use clb_simulator::cluster::Object;
use clb_simulator::native::NativeReconciler;
use clb_simulator::simulate::{LogicError, PoolReconciler, Reconciler, Supervised};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A run's calls, as the simulator made them.
enum Call {
    Observe(u64, Vec<wit::Observation>),
    Complete(u64, Vec<(u64, wit::Outcome)>, Vec<u64>),
    Tick(u64),
}

/// The library, recording every call (one run per `start`).
#[derive(Default)]
struct Recording {
    inner: NativeReconciler,
    runs: Vec<(wit::Config, Vec<Call>, Vec<wit::Command>)>,
    in_flight: Vec<u64>,
}

impl Recording {
    fn note(&mut self, step: &wit::Step) {
        let run = self.runs.last_mut().expect("started");
        for issued in &step.commands {
            self.in_flight.push(issued.id);
            run.2.push(issued.command.clone());
        }
    }
}

impl Logic for Recording {
    type Error = LogicError;

    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        self.inner.start(config)?;
        self.runs.push((config.clone(), Vec::new(), Vec::new()));
        self.in_flight.clear();
        Ok(())
    }

    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        let step = self.inner.observe(now_ms, batch)?;
        self.runs.last_mut().expect("started").1.push(Call::Observe(now_ms, batch.to_vec()));
        self.note(&step);
        Ok(step)
    }

    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, LogicError> {
        // The answers by index into the commands in flight, as the programs pick them.
        let mut indices = Vec::new();
        for (id, _) in results {
            if let Some(i) = self.in_flight.iter().position(|x| x == id) {
                self.in_flight.remove(i);
                indices.push(i as u64);
            } else {
                indices.push(u64::MAX);
            }
        }
        // The figure is not kept: the fuzz targets answer as their own model of ARM's bucket.
        let step = self.inner.complete(now_ms, results, arm_remaining_writes)?;
        self.runs.last_mut().expect("started").1.push(Call::Complete(now_ms, results.to_vec(), indices));
        self.note(&step);
        Ok(step)
    }

    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError> {
        let step = self.inner.tick(now_ms)?;
        self.runs.last_mut().expect("started").1.push(Call::Tick(now_ms));
        self.note(&step);
        Ok(step)
    }

    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, LogicError> {
        self.inner.stats(now_ms)
    }
}

impl Reconciler for Recording {
    /// The programs drive the tracker alone: a multi-SLB scenario stops at its first restart.
    fn pools(&mut self) -> Option<&mut dyn PoolReconciler> {
        None
    }

    fn supervised(&mut self) -> Option<&mut dyn Supervised> {
        None
    }
}

/// A run as a program; `literal`: the recorded answers (else the world's, failures kept).
fn program(config: &wit::Config, calls: &[Call], literal: bool) -> Program {
    let mut steps = vec![Step::Time(Time::Set(1_700_000_000_000))];
    let mut now = None;
    let mut time = |steps: &mut Vec<Step>, at: u64| {
        if now != Some(at) {
            steps.push(Step::Time(Time::Set(1_700_000_000_000 + at)));
            now = Some(at);
        }
    };
    for call in calls {
        match call {
            Call::Observe(at, batch) => {
                time(&mut steps, *at);
                steps.push(Step::Observe(batch.clone()));
            }
            Call::Complete(at, results, indices) => {
                time(&mut steps, *at);
                let mut answers = Vec::new();
                let mut stray = Vec::new();
                for ((id, outcome), index) in results.iter().zip(indices) {
                    if *index == u64::MAX || *index > 255 {
                        stray.push((*id, outcome.clone()));
                        continue;
                    }
                    let answer = match (literal, outcome) {
                        (true, o) => Answer::Literal(o.clone()),
                        (false, wit::Outcome::Failed(f)) => Answer::FailBefore(f.clone()),
                        (false, _) => Answer::Truth,
                    };
                    answers.push((*index as u8, answer));
                }
                steps.push(Step::Answer(answers));
                if !stray.is_empty() {
                    steps.push(Step::Stray(stray));
                }
            }
            Call::Tick(at) => {
                time(&mut steps, *at);
                steps.push(Step::Tick);
            }
        }
    }
    Program { config: config.clone(), steps }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Out {
    files: BTreeMap<String, Vec<u8>>,
}

impl Out {
    fn put(&mut self, target: &str, name: &str, bytes: Vec<u8>) {
        let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
        let mut name: String = name.chars().take(64).collect();
        let mut n = 1;
        while self.files.contains_key(&format!("{target}/seed-{name}")) {
            n += 1;
            name = format!("{}-{n}", name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-'));
        }
        self.files.insert(format!("{target}/seed-{name}"), bytes);
    }
}

fn json_u64(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn json_str(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// The pool-queue calls of one trace, with services and pools renamed into the target's pools
/// (`ns/a`.., `lb1`.., `pool1`..) in order of appearance, so that assignments can name them.
fn pool_ops(trace: &str) -> Option<(u32, Vec<PoolOp>)> {
    let mut max_retries = None;
    let mut ops = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut rename = |kind: &str, name: &str, pool: &[&str]| {
        let key = format!("{kind}:{name}");
        let next = names.keys().filter(|k| k.starts_with(&format!("{kind}:"))).count();
        names.entry(key).or_insert_with(|| pool[next.min(pool.len() - 1)].to_owned()).clone()
    };
    let mut drained: Vec<u64> = Vec::new();
    let mut last_now = 0;
    for line in trace.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        let args = &v["args"];
        let now = json_u64(&args["now-ms"]);
        if now > last_now {
            ops.push(PoolOp::Advance(now - last_now));
            last_now = now;
        }
        match v["call"].as_str().unwrap_or_default() {
            "pool-queue.create" => max_retries = Some(json_u64(&args["max-retries"]) as u32),
            "pool-queue.enqueue" => {
                let operations = args["operations"]
                    .as_array()?
                    .iter()
                    .map(|o| PoolOperation {
                        service: rename("s", &json_str(&o["service"]), &["ns/a", "ns/b", "ns/c"]),
                        load_balancer: rename("l", &json_str(&o["load-balancer"]), &["lb1", "lb2"]),
                        pool: rename("p", &json_str(&o["pool"]), &["pool1", "pool2"]),
                        kind: match o["kind"].as_str() {
                            Some("remove") => OperationKind::Remove,
                            Some("delete-pool") => OperationKind::DeletePool,
                            Some("ensure-pool") => OperationKind::EnsurePool,
                            _ => OperationKind::Add,
                        },
                        node_ips: o["node-ips"].as_array().map_or(vec![], |a| a.iter().map(json_str).collect()),
                    })
                    .collect::<Vec<_>>();
                for chunk in operations.chunks(3) {
                    ops.push(PoolOp::Enqueue(chunk.to_vec()));
                }
            }
            "pool-queue.remove-operations" => {
                ops.push(PoolOp::Remove(rename("s", &json_str(&args["service"]), &["ns/a", "ns/b", "ns/c"])))
            }
            "pool-queue.status" => ops.push(PoolOp::Status),
            "pool-queue.drain-and-group" => {
                let assignment = args["assignment"]
                    .as_array()?
                    .iter()
                    .map(|a| ServiceAssignment {
                        service: rename("s", &json_str(&a["service"]), &["ns/a", "ns/b", "ns/c"]),
                        load_balancer: rename("l", &json_str(&a["load-balancer"]), &["lb1", "lb2"]),
                    })
                    .collect();
                ops.push(PoolOp::Drain(assignment));
                if let Some(groups) = v["result"].as_array() {
                    drained.extend(groups.iter().map(|g| json_u64(&g["id"])));
                }
            }
            "pool-queue.report" => {
                let id = json_u64(&args["group"]);
                let Some(index) = drained.iter().position(|g| *g == id) else { continue };
                drained.remove(index);
                let outcome = &args["outcome"];
                let outcome = match outcome["tag"].as_str().unwrap_or_default() {
                    "updated" => GroupOutcome::Updated,
                    "unchanged" => GroupOutcome::Unchanged,
                    "created" => GroupOutcome::Created,
                    "deleted" => GroupOutcome::Deleted,
                    _ => {
                        let f = &outcome["val"];
                        GroupOutcome::Failed(Failure {
                            status: json_u64(&f["status"]) as u16,
                            code: f["code"].as_str().map(str::to_owned),
                            retry_after_ms: f["retry-after-ms"]
                                .as_u64()
                                .or_else(|| f["retry-after-ms"].as_str()?.parse().ok()),
                            message: json_str(&f["message"]),
                        })
                    }
                };
                ops.push(PoolOp::Report(index.min(6) as u8, outcome));
            }
            _ => {}
        }
    }
    let max_retries = max_retries?;
    (!ops.is_empty()).then_some((max_retries, ops))
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// A few property operations for part B of the `tracker` target: nodes, a Service, a slice,
/// a failure, time.
fn part_b(seed: usize) -> Vec<u8> {
    let ops: &[&[u8]] = &[
        &[0, 0, 0],                      // Node 0
        &[0, 1, 1],                      // Node 1
        &[2, 0, 1, 0],                   // Service 0, local, port 80
        &[4, 0, 0, 2, 0, 0, 1, 1, 1, 2], // Slice 0 of Service 0: pods 0, 1 on nodes 0, 1
        &[10, 1, 1, 9, 1, 1],            // Fail
        &[12, 0x10, 0x27, 0, 0],         // Advance 10 s
        &[8, 0, 0, 0, 0],                // an egress pod
        &[15],                           // RoundTrip
        &[14],                           // Restart
        &[3, 0],                         // DeleteService 0
    ];
    let chosen: Vec<&[u8]> = ops.iter().copied().take(3 + seed % (ops.len() - 2)).collect();
    let mut bytes = vec![chosen.len() as u8];
    for op in chosen {
        bytes.extend_from_slice(op);
    }
    bytes
}

fn main() {
    let root = root();
    let corpus = root.join("fuzz/corpus");
    let mut out = Out { files: BTreeMap::new() };

    for (i, path) in files(&root.join("examples/scenarios"), "yaml").iter().enumerate() {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).unwrap();
        out.put("scenario", &stem, text.clone().into_bytes());
        let scenario = clb_simulator::scenario::parse(path, &text).unwrap_or_else(|e| panic!("{e}"));

        let mut services = Vec::new();
        for step in &scenario.steps {
            let clb_simulator::scenario::Step::Apply(objects) = step else { continue };
            for object in &objects.0 {
                let (kind, json) = match object {
                    Object::Service(s) => {
                        services.push(clb_executor::records::service(s));
                        (0u8, serde_json::to_vec(s))
                    }
                    Object::EndpointSlice(s) => (1, serde_json::to_vec(s)),
                    Object::Node(n) => (2, serde_json::to_vec(n)),
                    Object::Pod(p) => (3, serde_json::to_vec(p)),
                    // Not a record the guest observes.
                    Object::Namespace(_) => continue,
                };
                let mut bytes = vec![kind];
                bytes.extend(json.unwrap());
                out.put("records", &stem, bytes);
            }
        }
        let mut e = Enc::default();
        e.config(&scenario.config);
        let n = e.len(services.len(), 4);
        for s in &services[..n] {
            e.service(s);
        }
        out.put("admission", &stem, e.bytes);

        let mut recording = Recording::default();
        let ran = clb_simulator::simulate::run(&scenario, &mut recording);
        if let Err(e) = &ran {
            eprintln!("{stem}: not run natively ({e}); its programs are what ran before");
        }
        if let Some(state) = recording.inner.state() {
            let (version, payload) = state.export_state();
            assert_eq!(version, clb_guest::tracker::STATE_VERSION);
            let clb = scenario.config.backend_pool_type.eq_ignore_ascii_case("podIP");
            let mut bytes = vec![1, if clb { 0 } else { 2 }];
            bytes.extend(payload);
            out.put("state_import", &stem, bytes);
        }
        for (config, calls, commands) in &recording.runs {
            let mut e = Enc::default();
            e.program(&program(config, calls, false));
            e.bytes.extend(part_b(i));
            out.put("tracker", &stem, e.bytes);
            let mut e = Enc::default();
            e.program(&program(config, calls, true));
            out.put("differential", &stem, e.bytes);
            for chunk in commands.chunks(16) {
                let mut e = Enc::default();
                e.len(chunk.len(), 16);
                for c in chunk {
                    e.command(c);
                }
                out.put("commands", &stem, e.bytes);
            }
        }
    }
    let v1 = std::fs::read(root.join("tests/fixtures/state/v1-small-cluster.bin")).unwrap();
    out.put("state_import", "v1-small-cluster", [vec![0, 0], v1].concat());
    // Every later version's fixture, its version spelled out (byte 3, then the version as four
    // little-endian bytes), then configuration 0 (CLB, as the fixtures were exported under).
    for version in 2..=clb_guest::tracker::STATE_VERSION {
        let name = format!("v{version}-every-part");
        let payload = std::fs::read(root.join(format!("tests/fixtures/state/{name}.bin"))).unwrap();
        out.put("state_import", &name, [&[3][..], &version.to_le_bytes(), &[0], &payload].concat());
    }

    for path in files(&root.join("tests/traces"), "jsonl") {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if let Some((max_retries, ops)) = pool_ops(&std::fs::read_to_string(&path).unwrap()) {
            out.put("backend_pools", &stem, pools::encode(max_retries, &ops));
        }
    }

    for (target, _) in clb_fuzz::TARGETS {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for old in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
            if old.file_name().unwrap().to_string_lossy().starts_with("seed-") {
                std::fs::remove_file(old).unwrap();
            }
        }
    }
    let mut total = 0;
    for (name, bytes) in &out.files {
        total += bytes.len();
        std::fs::write(corpus.join(name), bytes).unwrap();
    }
    println!("{} seed files, {total} bytes, under {}", out.files.len(), corpus.display());
}
