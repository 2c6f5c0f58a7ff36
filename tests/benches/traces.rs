//! Traces: what recording costs on the hot path, and what the hosts cost per call.
//! (a) `admit-service`, and one endpoint change through the supervisor on the 1,000-node
//!     cluster, with and without `run --record`'s recorder (target: recording under 10% of
//!     the call);
//! (b) replaying the largest golden trace through `clb-host replay`, and through the Python,
//!     JavaScript and Go hosts when `hosts/setup.sh` has installed them;
//! (c) each other host's own per-call bench (`admit-service`, one `tracker.observe` carrying one
//!     EndpointSlice change, loading the component), run here so that none rots.
//! Run with `cargo bench -p clb-tests --bench traces`; prints a Markdown table.

use clb_sandbox::supervisor::Supervisor;
use clb_sandbox::trace::{ComponentRef, RecordOptions, Recorder};
use clb_tests::cluster::*;
use clb_tests::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let config = read_config("clb.yaml");
    let logic = runtime().load(clb_sandbox::BUILTIN_GUEST, bench_limits()).unwrap();
    let service = read_service("etp-local.yaml");
    let mut session = logic.session().unwrap();
    let admit = median_per_iteration(2_000, || {
        std::hint::black_box(session.admit_service(&config, &service).unwrap());
    });

    let dir = scratch("bench-traces");
    // Wall time per change, and the reconcile thread's own CPU time per change (what recording
    // adds to the loop, whatever other threads and processes take the cores for).
    let change = |record: bool| -> (Duration, Duration) {
        let mut supervisor = Supervisor::new(&logic);
        if record {
            let options = RecordOptions::live(dir.join("run.jsonl"));
            let recorder =
                Recorder::start(options, clb_sandbox::trace::Signatures::of(&logic), &ComponentRef::of(&logic, None))
                    .unwrap();
            supervisor = supervisor.with_recorder(recorder);
        }
        supervisor.start(&config).unwrap();
        let step = supervisor.observe(0, &lists()).unwrap();
        settle(step, |results| supervisor.complete(1, results).unwrap());
        let mut round = 0;
        let cpu_before = thread_cpu();
        let wall = median_per_iteration(2_000, || {
            round += 1;
            let now = 2 + round as u64;
            let step = supervisor.observe(now, &[endpoint_change(round)]).unwrap();
            settle(step, |results| supervisor.complete(now, results).unwrap());
        });
        (wall, (thread_cpu() - cpu_before) / round as u32)
    };
    let plain = change(false);
    let recorded = change(true);
    println!("| call | time |");
    println!("|---|---|");
    println!("| admit-service (component) | {:.1} µs |", micros(admit));
    println!("| one endpoint change, not recorded: wall (median) | {:.1} µs |", micros(plain.0));
    println!("| one endpoint change, `run --record`: wall (median) | {:.1} µs |", micros(recorded.0));
    println!("| one endpoint change, not recorded: reconcile thread CPU (mean) | {:.1} µs |", micros(plain.1));
    println!("| one endpoint change, `run --record`: reconcile thread CPU (mean) | {:.1} µs |", micros(recorded.1));
    println!("| recording overhead, wall | {:.1}% |", (micros(recorded.0) / micros(plain.0) - 1.0) * 100.0);
    println!(
        "| recording overhead, reconcile thread CPU | {:.1}% |",
        (micros(recorded.1) / micros(plain.1) - 1.0) * 100.0
    );

    let largest = largest_golden_trace();
    println!("\n| replay of {} | time |", largest.file_name().unwrap().to_string_lossy());
    println!("|---|---|");
    let guests = dir.join("guests");
    std::fs::create_dir_all(&guests).unwrap();
    let builtin = guests.join("clb_guest.wasm");
    std::fs::write(&builtin, clb_sandbox::BUILTIN_GUEST).unwrap();
    // A trace may swap to the next guest (the largest does): every replay is given it.
    let next = guests.join("next_guest.wasm");
    std::fs::write(&next, NEXT_GUEST).unwrap();
    let swap = format!("next-guest={}", next.display());
    let rust = time(|| {
        let code = clb_host::cli::run(
            ["clb-host", "replay", largest.to_str().unwrap(), "--swap-component", &swap],
            &mut std::io::sink(),
            &mut std::io::sink(),
        );
        assert_eq!(code, 0);
    });
    println!("| clb-host replay (in process, includes compiling the component) | {:.1} ms |", rust.as_secs_f64() * 1e3);
    let hosts = other_hosts();
    for host in &hosts {
        let Some(program) = &host.program else {
            println!("| {} | not installed (run hosts/setup.sh) |", host.replay_name);
            continue;
        };
        let mut args = host.replay_args.clone();
        args.extend([largest.display().to_string(), "--component".into(), builtin.display().to_string()]);
        args.extend(["--swap-component".to_owned(), swap.clone()]);
        let took = time(|| {
            let status = std::process::Command::new(program).args(&args).status().unwrap();
            assert!(status.success(), "{} replay failed", host.replay_name);
        });
        println!("| {} (a new process) | {:.1} ms |", host.replay_name, took.as_secs_f64() * 1e3);
    }

    // (c) Each host's bench prints its own lines; the calls are counted down with the rest.
    let calls = scaled(2_000).to_string();
    for host in &hosts {
        let Some(program) = &host.bench_program else { continue };
        let mut args = host.bench_args.clone();
        args.push(builtin.display().to_string());
        args.extend(host.bench_args_after.iter().cloned());
        args.push(calls.clone());
        let output = std::process::Command::new(program).args(&args).output().unwrap();
        assert!(
            output.status.success(),
            "{}'s bench failed:\n{}{}",
            host.language,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        println!("\n{} ({} {}):", host.language, program.display(), args.join(" "));
        print!("{}", String::from_utf8_lossy(&output.stdout));
    }
}

/// How to start one other host's replay and its per-call bench.
struct OtherHost {
    language: &'static str,
    replay_name: &'static str,
    /// The replay's program, `None` where `hosts/setup.sh` has not installed the host.
    program: Option<PathBuf>,
    /// The replay's arguments before the trace.
    replay_args: Vec<String>,
    bench_program: Option<PathBuf>,
    /// The bench's arguments before the component, and between it and the number of calls.
    bench_args: Vec<String>,
    bench_args_after: Vec<String>,
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn time(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn largest_golden_trace() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("golden traces")
}

/// The Python, JavaScript and Go hosts, with their programs where installed.
fn other_hosts() -> Vec<OtherHost> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = cache_dir().join("venv/bin/python");
    let python = python.exists().then_some(python);
    let node = root.join("hosts/js/node_modules").is_dir().then(|| PathBuf::from("node"));
    let existing = |p: PathBuf| p.exists().then_some(p);
    let path = |p: &str| root.join(p).display().to_string();
    vec![
        OtherHost {
            language: "Python",
            replay_name: "python -m clb_reconciler replay",
            program: python.clone(),
            replay_args: vec!["-m".into(), "clb_reconciler".into(), "replay".into()],
            bench_program: python,
            bench_args: vec![path("hosts/python/bench.py")],
            bench_args_after: vec![],
        },
        OtherHost {
            language: "JavaScript",
            replay_name: "node hosts/js/replay.mjs",
            program: node.clone(),
            replay_args: vec![path("hosts/js/replay.mjs")],
            bench_program: node,
            bench_args: vec![path("hosts/js/bench.mjs")],
            // Its default trace, then the number of calls.
            bench_args_after: vec![String::new()],
        },
        OtherHost {
            language: "Go",
            replay_name: "clb-replay-go",
            program: existing(cache_dir().join("bin/clb-replay-go")),
            replay_args: vec![],
            bench_program: existing(cache_dir().join("bin/clb-bench-go")),
            bench_args: vec![],
            bench_args_after: vec![],
        },
    ]
}
