//! A stable, dependency-free smoke run of the targets (no libFuzzer, no coverage feedback) over
//! the inputs of `clb_fuzz::smoke`. Finds shallow crashes without nightly; the real fuzzing is
//! `fuzz/run.sh`. A crashing input is written to `fuzz/artifacts/<target>/`.
//!
//! `cargo run --release -p clb-fuzz --example smoke -- [TARGET|all] [ITERATIONS] [SEED] [--seconds S]`
//!
//! `--seconds S` shares S seconds of wall time among the targets run (CI's per-commit smoke):
//! a target stops at its share of what is left or at ITERATIONS, whichever comes first. A
//! crash prints the command that replays exactly the inputs up to it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut budget: Option<f64> = None;
    if let Some(at) = args.iter().position(|a| a == "--seconds") {
        let seconds = args.get(at + 1).and_then(|s| s.parse().ok()).expect("--seconds takes a number");
        budget = Some(seconds);
        args.drain(at..at + 2);
    }
    let which = args.first().map_or("all", String::as_str).to_owned();
    let iterations: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(2_000);
    let seed: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let message = Arc::new(Mutex::new(String::new()));
    let seen = message.clone();
    std::panic::set_hook(Box::new(move |info| {
        let at = info.location().map(|l| format!(" ({}:{})", l.file(), l.line())).unwrap_or_default();
        let text = info.payload_as_str().unwrap_or("").lines().next().unwrap_or("").to_owned();
        *seen.lock().unwrap() = format!("{text}{at}");
    }));
    let targets: Vec<_> = clb_fuzz::TARGETS.iter().filter(|(n, _)| which == "all" || *n == which).collect();
    if targets.is_empty() {
        eprintln!("no target {which}: the targets are {:?}", clb_fuzz::TARGETS.iter().map(|t| t.0).collect::<Vec<_>>());
        std::process::exit(2);
    }
    let deadline = budget.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let count = targets.len();
    let mut failed = false;
    for (done, (name, target)) in targets.into_iter().enumerate() {
        // What is left is shared among the targets left: a target that ends early gives its
        // time to the ones after it.
        let share = deadline.map(|d| d.saturating_duration_since(Instant::now()) / (count - done) as u32);
        let mut inputs = clb_fuzz::smoke::inputs(name, seed, clb_fuzz::smoke::corpus(&root.join("corpus").join(name)));
        let start = Instant::now();
        let (mut crashes, mut ran) = (0, 0);
        for i in 0..iterations {
            if share.is_some_and(|share| start.elapsed() >= share) {
                break;
            }
            let data = inputs.next().expect("inputs never end");
            ran += 1;
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                crashes += 1;
                let dir = root.join("artifacts").join(name);
                std::fs::create_dir_all(&dir).unwrap();
                let file = dir.join(format!("smoke-{i}"));
                std::fs::write(&file, &data).unwrap();
                if crashes == 1 {
                    println!("{name}: input {i} crashed: {}", message.lock().unwrap());
                    println!("  saved as {}", file.display());
                    println!("  reproduce: cargo run --release -p clb-fuzz --example smoke -- {name} {} {seed}", i + 1);
                    println!(
                        "  show it:   CLB_FUZZ_SHOW=1 cargo run --release -p clb-fuzz --example run -- {name} {}",
                        file.display()
                    );
                }
                failed = true;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{name}: {ran} inputs in {secs:.1} s ({:.0}/s), {crashes} crashes", ran as f64 / secs.max(1e-9));
    }
    if failed {
        std::process::exit(1);
    }
}
