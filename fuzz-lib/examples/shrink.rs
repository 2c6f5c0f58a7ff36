//! Shrinks a failing `tracker` or `differential` input step by step (drops steps, then part B's
//! operations, while the target still panics with the same first line) and writes the result
//! next to the input as `<file>.min`. Structure-aware, where `cargo fuzz tmin` is byte-wise.
//!
//! `cargo run --release -p clb-fuzz --example shrink -- TARGET FILE`

use clb_fuzz::input::{Dec, Enc};
use clb_fuzz::program::Program;
use std::sync::{Arc, Mutex};

fn encode(program: &Program, ops: &[u8]) -> Vec<u8> {
    let mut e = Enc::default();
    e.program(program);
    e.bytes.extend_from_slice(ops);
    e.bytes
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, file) = (&args[0], &args[1]);
    let target = clb_fuzz::target(name).expect("a target");
    let message = Arc::new(Mutex::new(String::new()));
    let seen = message.clone();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.payload_as_str().unwrap_or("").lines().next().unwrap_or("").to_owned();
        *seen.lock().unwrap() = text;
    }));
    let fails = |data: &[u8]| -> Option<String> {
        std::panic::catch_unwind(|| target(data)).err().map(|_| message.lock().unwrap().clone())
    };
    let data = std::fs::read(file).unwrap();
    let want = fails(&data).expect("the input does not fail");
    println!("fails with: {want}");
    let mut d = Dec::new(&data);
    let mut program = d.program();
    // Part B as bytes: what is left after the program (re-read by the target's decoder).
    let consumed = encode(&program, &[]).len();
    let mut rest: Vec<u8> = if encode(&program, &[]) == data[..consumed.min(data.len())] {
        data[consumed.min(data.len())..].to_vec()
    } else {
        Vec::new()
    };
    let same = |p: &Program, r: &[u8]| fails(&encode(p, r)).is_some_and(|m| m == want);
    if !same(&program, &rest) {
        rest.clear();
        assert!(same(&program, &rest), "the re-encoded input does not fail the same way");
    }
    let mut chunk = program.steps.len().max(1);
    while chunk >= 1 {
        let mut i = 0;
        while i < program.steps.len() {
            let mut candidate = program.clone();
            let end = (i + chunk).min(candidate.steps.len());
            candidate.steps.drain(i..end);
            if same(&candidate, &rest) {
                program = candidate;
            } else {
                i += chunk;
            }
        }
        chunk /= 2;
    }
    if !rest.is_empty() && same(&program, &[]) {
        rest.clear();
    }
    let out = format!("{file}.min");
    std::fs::write(&out, encode(&program, &rest)).unwrap();
    println!("{} steps left; written to {out}\n{program:#?}", program.steps.len());
}
