//! The integrator examples of the READMEs run as written, so that a changed WIT or host API fails
//! here and not in a user's hands. Each ```python and ```js block of `README.md`,
//! `hosts/python/README.md` and `hosts/js/README.md` runs in a fresh folder that holds what the
//! README says to have: `clb_guest.wasm` (as `clb-host component --out clb_guest.wasm` writes
//! it) and `hosts/` (the checkout's, for `./hosts/js/index.mjs`); Python is `hosts/setup.sh`'s
//! venv, where `clb_reconciler` is installed as a user would install it. The ```go block of
//! `hosts/go/README.md` runs there too, as `main.go` of the module its ```sh block makes. The
//! Rust example is the body of a test below, compared line by line with the README's block.

use super::hosts::{go_env, python, root};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_tests::scratch;
use std::path::Path;
use std::process::Command;

/// The fenced blocks of `language` in `markdown`: (the line of the opening fence, the code).
fn fenced(markdown: &str, language: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        match &mut open {
            None if line.trim_start().strip_prefix("```") == Some(language) => open = Some((index + 1, String::new())),
            Some(_) if line.trim_start() == "```" => blocks.extend(open.take()),
            Some((_, code)) => {
                code.push_str(line);
                code.push('\n');
            }
            None => {}
        }
    }
    assert!(open.is_none(), "a ```{language} block is not closed");
    blocks
}

/// A folder as the READMEs assume the user's to be.
fn users_folder(name: &str) -> clb_tests::Scratch {
    let dir = scratch(&format!("examples-{name}"));
    std::fs::write(dir.join("clb_guest.wasm"), clb_sandbox::BUILTIN_GUEST).unwrap();
    std::os::unix::fs::symlink(root().join("hosts"), dir.join("hosts")).unwrap();
    dir
}

/// Runs every block of `language` in the READMEs; returns how many ran and what failed.
fn run_all(language: &str, program: &Path, file_name: &str) -> (usize, Vec<String>) {
    let (mut ran, mut failures) = (0, Vec::new());
    for readme in ["README.md", "hosts/python/README.md", "hosts/js/README.md"] {
        let text = std::fs::read_to_string(root().join(readme)).unwrap();
        for (line, code) in fenced(&text, language) {
            let dir = users_folder(&format!("{language}-{}-{line}", readme.replace('/', "-")));
            std::fs::write(dir.join(file_name), &code).unwrap();
            let output = Command::new(program).arg(file_name).current_dir(&dir).output().unwrap();
            ran += 1;
            if !output.status.success() {
                failures.push(format!(
                    "{readme}:{line}: the ```{language} example failed ({}):\n{code}{}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
    }
    (ran, failures)
}

#[test]
fn every_python_example_of_the_readmes_runs_as_written_against_the_installed_package() {
    let (ran, failures) = run_all("python", python(), "example.py");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 2, "the README and hosts/python/README.md each hold a Python example; ran {ran}");
}

#[test]
fn every_javascript_example_of_the_readmes_runs_as_written() {
    python(); // hosts/setup.sh installs the JavaScript host's packages too
    let (ran, failures) = run_all("js", Path::new("node"), "example.mjs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 2, "the README and hosts/js/README.md each hold a JavaScript example; ran {ran}");
}

#[test]
fn the_go_example_of_its_readme_runs_as_written_in_a_module_of_the_users() {
    python(); // hosts/setup.sh puts the Go modules into the cache
    let text = std::fs::read_to_string(root().join("hosts/go/README.md")).unwrap();
    let setup = fenced(&text, "sh")
        .into_iter()
        .find(|(_, code)| code.contains("go mod init"))
        .expect("a ```sh block that makes the module");
    let blocks = fenced(&text, "go");
    assert!(!blocks.is_empty(), "hosts/go/README.md holds a Go example");
    for (line, code) in blocks {
        let dir = users_folder(&format!("go-{line}"));
        std::fs::write(dir.join("main.go"), &code).unwrap();
        let output = go_env(Command::new("bash").args(["-euc", &setup.1]).current_dir(&dir)).output().unwrap();
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "hosts/go/README.md:{line}: the ```go example failed ({}):\n{code}{out}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(out.contains(r#"{"commands":[{"id":"0","command":{"tag":"read-nrp"}}]"#), "{out}");
    }
}

/// The README's Rust example, between the markers: the test below runs it and checks that the
/// README shows these very lines.
fn the_readmes_rust_example(config: wit::Config, now_ms: u64) -> anyhow::Result<wit::Step> {
    // README: begin
    let runtime = clb_sandbox::Runtime::new()?;
    let logic = runtime.load(clb_sandbox::BUILTIN_GUEST, Default::default())?;
    let mut session = logic.session()?;
    let tracker = session.tracker_create(&config)?.expect("config accepted");
    let step = session.tracker_observe(tracker, now_ms, &[wit::Observation::ListsComplete])?;
    // README: end
    Ok(step)
}

#[test]
fn the_readmes_rust_example_is_code_that_runs() {
    let step = the_readmes_rust_example(clb_tests::read_config("clb.yaml"), 0).unwrap();
    assert_eq!(step.commands.len(), 1, "a tracker told the lists are complete reads NRP first: {step:?}");
    assert!(matches!(step.commands[0].command, wit::Command::ReadNrp), "{step:?}");
    let source = include_str!("examples.rs");
    let body: Vec<&str> = source
        .lines()
        .skip_while(|l| l.trim() != "// README: begin")
        .skip(1)
        .take_while(|l| l.trim() != "// README: end")
        .map(str::trim)
        .collect();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let blocks = fenced(&readme, "rust");
    assert_eq!(blocks.len(), 1, "one Rust example in the README");
    let shown: Vec<&str> = blocks[0].1.lines().map(str::trim).collect();
    assert_eq!(shown, body, "README.md's Rust example is the body of the_readmes_rust_example");
}

#[test]
fn the_fence_reader_finds_each_block_of_a_language_with_its_line() {
    let text = "# t\n```python\na = 1\n```\n```sh\nls\n```\n  ```python\nb = 2\n  ```\n";
    assert_eq!(fenced(text, "python"), [(2, "a = 1\n".to_owned()), (8, "b = 2\n".to_owned())]);
    assert_eq!(fenced(text, "js"), []);
}
