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
