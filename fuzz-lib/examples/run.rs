//! Runs one target on the given files and shows each panic: what a crash that `fuzz/run.sh`
//! saved, or a regression, does to the current code, without nightly.
//!
//! `cargo run --release -p clb-fuzz --example run -- TARGET FILE...`; with `CLB_FUZZ_SHOW=1`, the
//! `tracker` and `differential` inputs are printed as the programs they decode to.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, files) = args.split_first().expect("usage: run TARGET FILE...");
    let target = clb_fuzz::target(name).unwrap_or_else(|| panic!("no target {name}"));
    let mut failed = 0;
    for file in files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        if std::env::var_os("CLB_FUZZ_SHOW").is_some() && matches!(name.as_str(), "tracker" | "differential") {
            // What the structured targets read: the program (and part B's operations).
            let mut d = clb_fuzz::input::Dec::new(&data);
            println!("{:#?}", d.program());
            println!("{:#?}", clb_fuzz::tracker::ops(&mut d));
        }
        match std::panic::catch_unwind(|| target(&data)) {
            Ok(()) => println!("{file}: ok"),
            Err(_) => {
                println!("{file}: PANICKED");
                failed += 1;
            }
        }
    }
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
