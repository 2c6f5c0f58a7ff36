//! `docs/conformance.md`, the table of upstream master's tests and where each one's counterpart
//! is, generated from `docs/conformance/upstream-tests.tsv` (the project's own copy
//! of the audit, one upstream test a line) and the `upstream:` markers in the code, so that it
//! cannot drift.
//!
//! A marker is a `//` comment block that says "upstream" and names upstream tests (`// Upstream
//! TestGroupOperations "nil input".`) in a Rust file under `guest/src`, `crates/`, `host/src` or
//! `tests/`, or a scenario's `description` that does (under `examples/scenarios` or
//! `tests/scenarios`). In Rust, the counterpart is the `fn` right after the block (a test names
//! the upstream test directly above it); in a scenario, the scenario.
//!
//! The `.tsv`'s status is the verdict of a reading of upstream's test against its counterparts:
//! `N` when they assert everything it asserts (its table cases included), `P` when only part
//! (the note says what is missing), `D` when they assert everything it asserts except where the
//! design chose to differ, and there assert the behaviour chosen instead (the note says how and
//! why). A row is shown `N`, `P` or `D` only where a marker names it (one that nothing names is
//! `E`), and a marked row must have one of those verdicts (or `NA` or `U`, whose note says why
//! the counterpart is not the upstream behaviour), so that naming a test never makes it conform
//! by itself.
//!
//! Regenerate with `CLB_BLESS_CONFORMANCE=1 cargo test --release -p clb-tests conformance`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One row of the audit.
struct Row {
    file: String,
    test: String,
    status: String,
    note: String,
}

const STATUSES: [(&str, &str); 7] = [
    ("N", "counterparts name the upstream test and assert everything it asserts, its table cases included"),
    ("P", "counterparts name the upstream test but assert only part of it; the note says what is missing and why"),
    (
        "D",
        "counterparts name the upstream test and assert what it asserts, except where the design chose to differ: there they assert the behaviour chosen instead; the note says how and why",
    ),
    ("E", "an equivalent exists (a scenario, a property, a unit test) but does not name the upstream test yet"),
    ("X", "the behaviour is implemented here, but nothing tests it yet"),
    ("U", "the behaviour is not implemented"),
    (
        "NA",
        "Go plumbing with no counterpart here, or a rule the design replaced on purpose with nothing here to assert in its place",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn audit() -> Vec<Row> {
    let text = std::fs::read_to_string(root().join("docs/conformance/upstream-tests.tsv")).unwrap();
    text.lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "upstream-tests.tsv: four tab-separated fields: {line}");
            assert!(STATUSES.iter().any(|(s, _)| *s == fields[2]), "upstream-tests.tsv: unknown status: {line}");
            Row { file: fields[0].into(), test: fields[1].into(), status: fields[2].into(), note: fields[3].into() }
        })
        .collect()
}

/// The upstream test names in `text`: every word `Test` followed by a capital letter, then
/// letters, digits and underscores.
fn names(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while let Some(at) = text[i..].find("Test").map(|at| at + i) {
        let end = at + bytes[at..].iter().take_while(|b| word(**b)).count();
        let starts_a_word = at == 0 || !word(bytes[at - 1]);
        if starts_a_word && bytes.get(at + 4).is_some_and(u8::is_ascii_uppercase) {
            let name = text[at..end].to_owned();
            if !out.contains(&name) {
                out.push(name);
            }
        }
        i = end.max(at + 4);
    }
    out
}

/// Every marker in the sources: upstream test → the counterparts that name it. In Rust, a
/// marker is a block of `//` comments that says "upstream" and names upstream tests: its
/// counterpart is the `fn` right after it (attributes between), or the block's place when it
/// stands inside a function (one case of a table). In a scenario, its `description`.
fn markers() -> BTreeMap<String, Vec<String>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "yaml") {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    for dir in ["guest/src", "crates", "host/src", "tests/it", "tests/support", "examples/scenarios", "tests/scenarios"]
    {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |names: Vec<String>, counterpart: String| {
        for name in names {
            let counterparts = found.entry(name).or_default();
            if !counterparts.contains(&counterpart) {
                counterparts.push(counterpart.clone());
            }
        }
    };
    for path in files {
        if path.ends_with("tests/it/conformance.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let relative = path.strip_prefix(&root).unwrap().display().to_string();
        if !relative.ends_with(".rs") {
            let description = text.split_once("\ndescription:").map_or("", |(_, rest)| rest);
            // The description runs to the next top-level key.
            let description = description
                .split("\n")
                .take_while(|l| l.is_empty() || l.starts_with(' '))
                .collect::<Vec<_>>()
                .join("\n");
            if description.to_lowercase().contains("upstream") {
                add(names(&description), format!("scenario `{relative}`"));
            }
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let mut n = 0;
        while n < lines.len() {
            if !lines[n].trim_start().starts_with("//") {
                n += 1;
                continue;
            }
            let start = n;
            while n < lines.len() && lines[n].trim_start().starts_with("//") {
                n += 1;
            }
            let block = lines[start..n].join("\n");
            if !block.to_lowercase().contains("upstream") {
                continue;
            }
            let function = lines[n..].iter().map(|l| l.trim_start()).find(|l| !l.starts_with("#[")).and_then(|l| {
                let l = l.strip_prefix("pub ").unwrap_or(l);
                let l = l.strip_prefix("async ").unwrap_or(l);
                l.strip_prefix("fn ").map(|rest| rest.split(['(', '<']).next().unwrap_or(rest).to_owned())
            });
            let counterpart = match function {
                Some(function) => format!("`{relative}` `{function}`"),
                None => format!("`{relative}:{}`", start + 1),
            };
            add(names(&block), counterpart);
        }
    }
    found
}

/// The status a row is shown with: the `.tsv`'s verdict, where a marker names the test.
fn status<'r>(row: &'r Row, markers: &BTreeMap<String, Vec<String>>) -> &'r str {
    match (markers.contains_key(&row.test), row.status.as_str()) {
        (true, status @ ("N" | "P" | "D" | "NA" | "U")) => status,
        (true, status) => panic!(
            "upstream-tests.tsv: {} is named by {:?} but its verdict is {status}: read the counterparts against upstream's test and set N, P (saying what is missing), D (saying how and why it differs), NA or U",
            row.test, markers[&row.test]
        ),
        // The audit found a counterpart, but nothing names the upstream test at it.
        (false, "N" | "P" | "D") => "E",
        (false, status) => status,
    }
}

/// The counts of each status, as the README gives them.
fn counts(audit: &[Row], markers: &BTreeMap<String, Vec<String>>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for row in audit {
        *counts.entry(status(row, markers)).or_default() += 1;
    }
    let each: Vec<String> =
        STATUSES.iter().map(|(code, _)| format!("{} {code}", counts.get(code).copied().unwrap_or(0))).collect();
    format!("{} of {} upstream tests", each.join(", "), audit.len())
}

/// README.md's counts sit between these two comments.
const README_COUNTS: (&str, &str) = ("<!-- conformance counts -->", "<!-- /conformance counts -->");

fn render(audit: &[Row], markers: &BTreeMap<String, Vec<String>>) -> String {
    let status = |row| status(row, markers);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for row in audit {
        *counts.entry(status(row)).or_default() += 1;
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Conformance with upstream master\n\n\
         Generated by `CLB_BLESS_CONFORMANCE=1 cargo test --release -p clb-tests conformance`\n\
         (`tests/it/conformance.rs`) from `docs/conformance/upstream-tests.tsv` and the upstream\n\
         markers in the code; do not edit it by hand. An audit mapped every test function of\n\
         upstream master (kubernetes-sigs/cloud-provider-azure at 7b31c76c, B-HEAD in\n\
         `docs/upstream.md`) for the servicegateway DiffTracker, engine and updaters\n\
         and the backend-pool updater. The project owns that list now: a row's status and note change\n\
         in the `.tsv`. A test names its upstream test (a comment directly above it that says\n\
         `upstream TestName`, or a scenario's `description` that does); the `.tsv` says whether the\n\
         tests that name it assert all of it (`N`), part (`P`, with what is missing), or all of it\n\
         but where the design chose to differ, which they assert instead (`D`, with how and why),\n\
         after a reading of upstream's test, its table cases included, against them.\n"
    );
    let _ = writeln!(out, "| status | meaning | count |\n| --- | --- | --- |");
    for (code, meaning) in STATUSES {
        let _ = writeln!(out, "| {code} | {meaning} | {} |", counts.get(code).copied().unwrap_or(0));
    }
    let _ = writeln!(out, "| | all | {} |", audit.len());
    let mut by_file: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for row in audit {
        by_file.entry(&row.file).or_default().push(row);
    }
    for (file, rows) in by_file {
        let _ =
            writeln!(out, "\n## {file}\n\n| upstream test | status | counterpart, or why none |\n| --- | --- | --- |");
        for row in rows {
            let note = row.note.replace('|', "\\|");
            let cell = match (markers.get(&row.test), status(row)) {
                (Some(counterparts), "N") => counterparts.join("; "),
                (Some(counterparts), "P") => format!("{}. **Missing:** {note}", counterparts.join("; ")),
                (Some(counterparts), "D") => format!("{}. **Differs:** {note}", counterparts.join("; ")),
                (Some(counterparts), _) => format!("{note} (named by {})", counterparts.join("; ")),
                (None, _) => note,
            };
            let _ = writeln!(out, "| `{}` | {} | {cell} |", row.test, status(row));
        }
    }
    // Names the audit does not hold: tests of upstream's earlier design (A), or a typo.
    let others: Vec<_> = markers.iter().filter(|(name, _)| !audit.iter().any(|row| &row.test == *name)).collect();
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "\n## Named in the code, not in the audit\n\n\
             Tests of upstream's earlier design (A) or of other files; a name here that upstream never\n\
             had is a typo to fix.\n\n| upstream test | counterpart |\n| --- | --- |"
        );
        for (name, counterparts) in others {
            let _ = writeln!(out, "| `{name}` | {} |", counterparts.join("; "));
        }
    }
    out
}

#[test]
fn docs_conformance_md_is_the_table_the_audit_and_the_code_s_upstream_markers_give() {
    let audit = audit();
    let markers = markers();
    let path = root().join("docs/conformance.md");
    let expected = render(&audit, &markers);
    if std::env::var_os("CLB_BLESS_CONFORMANCE").is_some() {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/conformance.md is stale: regenerate with `CLB_BLESS_CONFORMANCE=1 cargo test --release -p clb-tests conformance`"
    );
}

#[test]
fn the_readmes_conformance_counts_are_the_tables() {
    let readme_path = root().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let (open, close) = README_COUNTS;
    let start = readme.find(open).expect("README.md gives the conformance counts") + open.len();
    let end = start + readme[start..].find(close).expect("the counts' closing comment");
    let expected = counts(&audit(), &markers());
    if std::env::var_os("CLB_BLESS_CONFORMANCE").is_some() {
        std::fs::write(&readme_path, format!("{}{expected}{}", &readme[..start], &readme[end..])).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..end],
        expected,
        "README.md's conformance counts are stale: `CLB_BLESS_CONFORMANCE=1 cargo test --release -p clb-tests conformance`"
    );
}

#[test]
fn a_marker_names_every_upstream_test_it_mentions_once() {
    assert_eq!(names("Mirrors upstream TestA and TestB_c, TestA."), ["TestA", "TestB_c"]);
    assert_eq!(names("// TestGroupOperations \"nil input\"; not Testing, nor a MyTestX"), ["TestGroupOperations"]);
}

#[test]
fn naming_an_upstream_test_shows_the_audits_verdict_and_never_makes_a_row_conform_by_itself() {
    let row = |status: &str| Row { file: "f".into(), test: "TestA".into(), status: status.into(), note: String::new() };
    let named: BTreeMap<String, Vec<String>> = [("TestA".to_owned(), vec!["`x.rs` `a`".to_owned()])].into();
    let unnamed = BTreeMap::new();
    assert_eq!(status(&row("N"), &named), "N");
    assert_eq!(status(&row("P"), &named), "P");
    assert_eq!(status(&row("D"), &named), "D");
    assert_eq!(status(&row("NA"), &named), "NA");
    assert_eq!(status(&row("N"), &unnamed), "E");
    assert_eq!(status(&row("P"), &unnamed), "E");
    assert_eq!(status(&row("D"), &unnamed), "E");
    assert_eq!(status(&row("X"), &unnamed), "X");
    let unjudged = std::panic::catch_unwind(|| status(&row("E"), &named).to_owned());
    assert!(unjudged.is_err(), "a named row without a verdict is refused");
}
