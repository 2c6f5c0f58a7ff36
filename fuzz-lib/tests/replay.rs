//! Stable replay: every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`
//! through its target function (no nightly, no libFuzzer). A regression is a file that once
//! crashed its target; the corpus is the seeds and what fuzzing kept.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn replay(kind: &str) -> usize {
    let root = fuzz_dir().join(kind);
    let mut count = 0;
    let Ok(dirs) = std::fs::read_dir(&root) else { return 0 };
    let mut dirs: Vec<PathBuf> = dirs.map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let target = clb_fuzz::target(&name).unwrap_or_else(|| panic!("{}: no target {name}", dir.display()));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files.iter().filter(|f| f.is_file()) {
            let data = std::fs::read(file).unwrap();
            let result = std::panic::catch_unwind(|| target(&data));
            assert!(result.is_ok(), "{} fails its target {name}", file.display());
            count += 1;
        }
    }
    count
}

#[test]
fn every_regression_input_passes_its_target() {
    let count = replay("regressions");
    eprintln!("{count} regression inputs replayed");
}

#[test]
fn every_corpus_input_passes_its_target() {
    let count = replay("corpus");
    eprintln!("{count} corpus inputs replayed");
}

#[test]
fn every_target_takes_empty_and_short_inputs() {
    for (name, target) in clb_fuzz::TARGETS {
        for data in [&[][..], &[0], &[0xff; 7], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]] {
            let result = std::panic::catch_unwind(|| target(data));
            assert!(result.is_ok(), "{name} panics on {data:?}");
        }
    }
}

/// What CI's per-commit smoke prints for a crash (`--example smoke -- TARGET i+1 SEED`) replays
/// the same inputs only if they depend on the seed and the corpus alone.
#[test]
fn the_smoke_runs_inputs_are_the_corpus_in_name_order_then_a_sequence_fixed_by_the_seed() {
    use clb_fuzz::smoke::{corpus, inputs};
    let dir = fuzz_dir().join("corpus").join("tracker");
    let files = corpus(&dir);
    assert!(files.len() > 2, "the tracker corpus has seeds");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    assert_eq!(files, names.iter().map(|n| std::fs::read(n).unwrap()).collect::<Vec<_>>(), "in name order");
    let run = |seed| inputs("tracker", seed, files.clone()).take(files.len() + 200).collect::<Vec<_>>();
    let first = run(42);
    assert_eq!(first[..files.len()], files[..], "the corpus first");
    assert_eq!(first, run(42), "the same seed, the same inputs");
    assert_ne!(first[files.len()..], run(43)[files.len()..], "another seed, other inputs");
    let mutated = first[files.len()..].iter().filter(|input| !files.contains(input)).count();
    assert!(mutated > 150, "mostly new inputs: {mutated} of 200");
}
