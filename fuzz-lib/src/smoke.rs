//! The inputs of the stable smoke run (`examples/smoke.rs`, and CI's per-commit smoke): each
//! corpus file of a target, then random mutations of them (byte flips, insertions, truncations,
//! splices) and random bytes. No coverage feedback; the real fuzzing is `fuzz/run.sh`.
//!
//! The sequence is a function of the seed, the target's name and its corpus alone (its files
//! in name order), never of what a target did with an input: input `i` is the same on every
//! machine and in every run, so the first `i + 1` inputs reproduce a crash at input `i`.

use std::path::Path;

/// The corpus of a target in `dir`, its files in name order (none when there is no folder).
pub fn corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.expect("a readable corpus folder").path()).collect(),
        Err(_) => Vec::new(),
    };
    // The order a file system lists a folder in is no order: the inputs must not depend on it.
    files.sort();
    files.iter().map(|f| std::fs::read(f).expect("a readable corpus file")).collect()
}

/// The inputs of the target `name`: its corpus, then mutations and random bytes, without end.
pub fn inputs(name: &str, seed: u64, corpus: Vec<Vec<u8>>) -> impl Iterator<Item = Vec<u8>> {
    let mut rng = Rng(seed ^ name.len() as u64);
    (0..).map(move |i| {
        if i < corpus.len() {
            corpus[i].clone()
        } else if corpus.is_empty() || rng.below(10) == 0 {
            (0..rng.below(512)).map(|_| rng.next() as u8).collect()
        } else {
            let base = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &corpus, base)
        }
    })
}

/// xorshift64: a seed of 0 stays 0, which still gives a fixed sequence of inputs.
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
