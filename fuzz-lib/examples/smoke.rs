//! A stable, dependency-free smoke run of the targets (no libFuzzer, no coverage feedback):
//! each corpus file of the target, then random mutations of them (byte flips, insertions,
//! truncations, splices) and random bytes. Finds shallow crashes without nightly; the real
//! fuzzing is `fuzz/run.sh`. A crashing input is written to `fuzz/artifacts/<target>/`.
//!
//! `cargo run --release -p clb-fuzz --example smoke -- [TARGET|all] [ITERATIONS] [SEED]`

use std::path::Path;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], mut data: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(8) {
        match rng.below(6) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(data.len() + 1);
                data.insert(i, rng.next() as u8);
            }
            3 if !data.is_empty() => {
                let i = rng.below(data.len());
                data.truncate(i.max(1));
            }
            4 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let (i, j) = (rng.below(data.len() + 1), rng.below(other.len() + 1));
                data.truncate(i);
                data.extend_from_slice(&other[j..]);
            }
            _ => {
                let i = rng.below(data.len() + 1);
                let value = [0u8, 1, 0x7f, 0x80, 0xfe, 0xff][rng.below(6)];
                data.insert(i, value);
            }
        }
    }
    data
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("all", String::as_str);
    let iterations: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(2_000);
    let seed: u64 = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    std::panic::set_hook(Box::new(|_| {}));
    let mut failed = false;
    for (name, target) in clb_fuzz::TARGETS.iter().filter(|(n, _)| which == "all" || *n == which) {
        let mut corpus: Vec<Vec<u8>> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(root.join("corpus").join(name)) {
            corpus.extend(entries.map(|e| std::fs::read(e.unwrap().path()).unwrap()));
        }
        let mut rng = Rng(seed ^ name.len() as u64);
        let start = std::time::Instant::now();
        let mut crashes = 0;
        for i in 0..iterations {
            let data = if i < corpus.len() {
                corpus[i].clone()
            } else if corpus.is_empty() || rng.below(10) == 0 {
                (0..rng.below(512)).map(|_| rng.next() as u8).collect()
            } else {
                let base = corpus[rng.below(corpus.len())].clone();
                mutate(&mut rng, &corpus, base)
            };
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                crashes += 1;
                let dir = root.join("artifacts").join(name);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(format!("smoke-{i}")), &data).unwrap();
                failed = true;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{name}: {iterations} inputs in {secs:.1} s ({:.0}/s), {crashes} crashes", iterations as f64 / secs);
    }
    if failed {
        std::process::exit(1);
    }
}
