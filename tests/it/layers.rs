//! ARCHITECTURE.md's layering invariant, checked on the sources: the modules of each of the
//! host's crates (`clb-sandbox` ... `clb-host`) and of `clb-guest` form layers, no module imports
//! one above it, that is the import graph has no cycle. Between crates Cargo refuses a cycle.
//!
//! An edge is any path a module's code names that starts at `crate::`, `super::`, `self::` or
//! one of its own child modules and reaches another module of the crate (the longest prefix that
//! is a module file). Two things are not edges: a folder's `mod.rs` re-exporting its children's
//! items (`pub use child::Item` is the folder's public face, not a dependency of its code), and
//! the `#[cfg(test)] mod tests` at the end of a file (tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every module of the crate whose root is `src`: its path (`[]` for the crate root) and file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).unwrap().with_extension("");
                let mut module: Module = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                match module.last().map(String::as_str) {
                    Some("mod") => _ = module.pop(),
                    Some("lib") if module.len() == 1 => module.clear(),
                    Some("main") if module.len() == 1 => continue,
                    _ => {}
                }
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Semi,
    Punct(char),
}

/// The code's tokens, as far as paths need: comments, strings and the trailing test module gone.
fn tokens(text: &str) -> Vec<Token> {
    let text = text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at]);
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let rest = &bytes[i..];
        let find = |needle: &[u8]| rest.windows(needle.len()).position(|w| w == needle);
        if c.is_ascii_whitespace() || !c.is_ascii() {
            i += 1;
        } else if rest.starts_with(b"//") {
            i += find(b"\n").unwrap_or(rest.len());
        } else if rest.starts_with(b"/*") {
            i += find(b"*/").map_or(rest.len(), |end| end + 2);
        } else if let Some(hashes) = raw_string_at(rest) {
            // `r"…"`, `r#"…"#`, `br#"…"#`: up to the quote followed by as many `#`.
            let open = hashes + if c == b'b' { 3 } else { 2 };
            let close = [b"\"".as_slice(), &vec![b'#'; hashes]].concat();
            let body = &rest[open..];
            i += open + body.windows(close.len()).position(|w| w == close).map_or(body.len(), |at| at + close.len());
            out.push(Token::Punct('"'));
        } else if c == b'"' {
            // A string, its escapes skipped.
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Punct('"'));
        } else if c == b'\'' && bytes.get(i + 2) == Some(&b'\'') {
            i += 3; // a char literal; a lifetime is a Punct below
            out.push(Token::Punct('\''));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(Token::Ident(text[start..i].to_owned()));
        } else {
            out.push(match (c, bytes.get(i + 1)) {
                (b':', Some(b':')) => {
                    i += 1;
                    Token::Sep
                }
                (b'{', _) => Token::Open,
                (b'}', _) => Token::Close,
                (b',', _) => Token::Comma,
                (b';', _) => Token::Semi,
                _ => Token::Punct(c as char),
            });
            i += 1;
        }
    }
    out
}

/// How many `#` open the raw string at the start of `text`, if one starts there.
fn raw_string_at(text: &[u8]) -> Option<usize> {
    let after_r = match text {
        [b'r', rest @ ..] => rest,
        [b'b', b'r', rest @ ..] => rest,
        _ => return None,
    };
    let hashes = after_r.iter().take_while(|b| **b == b'#').count();
    (after_r.get(hashes) == Some(&b'"')).then_some(hashes)
}

/// The paths starting at `tokens[at]`: `a::b::{c, d::{e}}` gives `a::b::c`, `a::b::d::e`, and the
/// index after them.
fn paths(tokens: &[Token], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        match tokens.get(at) {
            Some(Token::Ident(name)) => {
                prefix.push(name.clone());
                at += 1;
            }
            Some(Token::Open) if tokens.get(at.wrapping_sub(1)) == Some(&Token::Sep) => {
                let mut out = Vec::new();
                at += 1;
                while let Some(token) = tokens.get(at) {
                    match token {
                        Token::Close => {
                            at += 1;
                            break;
                        }
                        Token::Comma => at += 1,
                        Token::Ident(_) => {
                            let (inner, next) = paths(tokens, at);
                            out.extend(inner.into_iter().map(|p| [prefix.clone(), p].concat()));
                            at = next;
                        }
                        _ => at += 1,
                    }
                }
                return (out, at);
            }
            _ => return (vec![prefix], at),
        }
        if tokens.get(at) != Some(&Token::Sep) {
            return (vec![prefix], at);
        }
        at += 1;
    }
}

/// The modules `module`'s code imports.
fn imports(module: &Module, text: &str, all: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let tokens = tokens(text);
    let is_folder = all.keys().any(|m| m.len() > module.len() && m.starts_with(module));
    let mut out = BTreeSet::new();
    let mut at = 0;
    let mut re_export = false;
    while at < tokens.len() {
        match &tokens[at] {
            Token::Semi => re_export = false,
            Token::Ident(word) if word == "use" => {
                // `pub use` or `pub(crate) use`, `pub(super) use`.
                let pub_at = |back: usize| at >= back && tokens[at - back] == Token::Ident("pub".into());
                re_export = pub_at(1) || (pub_at(4) && tokens[at - 1] == Token::Punct(')'));
            }
            _ => {}
        }
        let starts_path = matches!(&tokens[at], Token::Ident(_))
            && tokens.get(at + 1) == Some(&Token::Sep)
            && !matches!(tokens.get(at.wrapping_sub(1)), Some(Token::Sep));
        if !starts_path {
            at += 1;
            continue;
        }
        let (found, next) = paths(&tokens, at);
        for path in found {
            let (base, rest): (Module, &[String]) = match path[0].as_str() {
                "crate" => (Vec::new(), &path[1..]),
                "self" => (module.clone(), &path[1..]),
                "super" => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    let Some(keep) = module.len().checked_sub(ups) else { continue };
                    (module[..keep].to_vec(), &path[ups..])
                }
                child if all.contains_key(&[module.clone(), vec![child.to_owned()]].concat()) => {
                    (module.clone(), &path[..])
                }
                _ => continue,
            };
            let full = [base, rest.to_vec()].concat();
            let target = (1..=full.len()).rev().map(|n| full[..n].to_vec()).find(|m| all.contains_key(m));
            let Some(target) = target else { continue };
            let facade = re_export && is_folder && target.starts_with(module);
            if &target != module && !facade {
                out.insert(target);
            }
        }
        at = next;
    }
    out
}

/// A cycle of the import graph, if there is one, as `a -> b -> ... -> a`.
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|m| m == node).unwrap();
                return Some([&stack[from..], std::slice::from_ref(node)].concat());
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in &graph[node] {
            if let Some(found) = visit(next, graph, marks, stack) {
                return Some(found);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(found) = visit(node, graph, &mut marks, &mut Vec::new()) {
            let name = |m: &Module| if m.is_empty() { "crate".to_owned() } else { m.join("::") };
            return Some(found.iter().map(name).collect::<Vec<_>>().join(" -> "));
        }
    }
    None
}

fn graph_of(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let all = modules(src);
    all.iter()
        .map(|(module, file)| (module.clone(), imports(module, &std::fs::read_to_string(file).unwrap(), &all)))
        .collect()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The host's crates (Cargo keeps the graph between crates acyclic) and how many modules each
/// has at least, so that a moved folder is noticed.
const HOST_CRATES: [(&str, usize); 9] = [
    ("crates/sandbox/src", 15),
    ("crates/oci/src", 5),
    ("crates/azure/src", 2),
    ("crates/arm/src", 2),
    ("crates/emulator/src", 9),
    ("crates/executor/src", 5),
    ("crates/kube/src", 2),
    ("crates/simulator/src", 9),
    ("host/src", 20),
];

#[test]
fn host_modules_form_layers_no_module_imports_one_above_it() {
    for (src, least) in HOST_CRATES {
        let graph = graph_of(&workspace().join(src));
        assert!(graph.len() >= least, "the modules of {src} were not found: {:?}", graph.keys());
        assert_eq!(cycle(&graph), None, "an import cycle among the modules of {src} (ARCHITECTURE.md, invariants)");
    }
}

#[test]
fn guest_modules_form_layers_no_module_imports_one_above_it() {
    let graph = graph_of(&workspace().join("guest/src"));
    assert!(graph.len() > 10, "the guest's modules were not found: {:?}", graph.keys());
    assert_eq!(cycle(&graph), None, "an import cycle among clb-guest's modules (ARCHITECTURE.md, invariants)");
}

#[test]
fn the_layer_check_finds_an_import_cycle_through_a_child_a_parent_and_a_grouped_use() {
    let dir = clb_tests::scratch("layers");
    std::fs::create_dir_all(dir.join("outer")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(dir.join(path), text).unwrap();
    write("lib.rs", "pub mod low;\npub mod outer;\n");
    write("low.rs", "// crate::outer::inner here is a comment\npub fn f() -> &'static str { \"crate::outer\" }\n");
    // A raw string holding quotes ends where it ends: the path after it still counts.
    write("outer/other.rs", "const A: &str = r#\"x=\"y\"\"#;\nuse crate::low;\n");
    write("outer/mod.rs", "pub mod inner;\npub mod other;\npub use inner::Thing;\npub struct Face;\n");
    write("outer/inner.rs", "use crate::{low, outer::Face};\npub struct Thing;\n");
    let graph = graph_of(&dir);
    assert!(graph[&vec!["outer".to_owned(), "other".to_owned()]].contains(&vec!["low".to_owned()]), "{graph:?}");
    assert_eq!(cycle(&graph), None, "a re-export is the folder's face, comments and strings are no paths: {graph:?}");
    // The parent's code using its child, whose code uses the parent: a cycle.
    write("outer/mod.rs", "pub mod inner;\nuse self::inner::Thing;\npub struct Face(Thing);\n");
    assert_eq!(cycle(&graph_of(&dir)).as_deref(), Some("outer -> outer::inner -> outer"));
    // A lower module reaching up through `super` from a nested file.
    write("outer/mod.rs", "pub mod inner;\npub struct Face;\n");
    write("low.rs", "pub fn f() -> crate::outer::inner::Thing { crate::outer::inner::Thing }\n");
    write("outer/inner.rs", "use super::super::low::f;\npub struct Thing;\n");
    assert_eq!(cycle(&graph_of(&dir)).as_deref(), Some("low -> outer::inner -> low"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether code names the tracker as a whole: the type `Tracker`, or the module that defines it
/// (`super::state`). Comments and strings do not count.
fn names_the_tracker(text: &str) -> bool {
    let tokens = tokens(text);
    let tracker = |t: &Token| matches!(t, Token::Ident(word) if word == "Tracker");
    let state_module =
        |w: &[Token]| matches!(w, [Token::Ident(s), Token::Sep, Token::Ident(m)] if s == "super" && m == "state");
    tokens.iter().any(tracker) || tokens.windows(3).any(state_module)
}

/// The files of `guest/src/tracker` and its folders that hold its parts, by name relative to it:
/// every file but the coordinator (`mod.rs`), the definition of the whole (`state.rs`), the state
/// format in `format/` (it gathers the parts' data into each version's records) and the tests.
/// (`egress/mod.rs`, the egress side's own face, is a part's file like the rest.)
fn part_files() -> Vec<(String, String)> {
    let dir = workspace().join("guest/src/tracker");
    let mut parts = Vec::new();
    let mut folders = vec![dir.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(&dir).unwrap().to_string_lossy().into_owned();
            let tests = name == "tests" || name.ends_with("/tests.rs");
            if path.is_dir() && name != "format" && !tests {
                folders.push(path);
            } else if path.is_file() && name.ends_with(".rs") && !tests && name != "mod.rs" && name != "state.rs" {
                parts.push((name, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    assert!(parts.len() > 10, "the tracker's parts were not found in {}", dir.display());
    parts
}

/// ARCHITECTURE.md, invariant 13: the tracker's parts own their data and write through the
/// handles the coordinator gives them: none names the tracker, so none can call back into it.
#[test]
fn no_part_of_the_tracker_names_the_tracker_it_writes_through_its_handles() {
    let parts = part_files();
    let naming: Vec<&str> = parts.iter().filter(|(_, text)| names_the_tracker(text)).map(|(n, _)| n.as_str()).collect();
    assert!(naming.is_empty(), "parts of the tracker that name it (give them a handle instead): {naming:?}");
}

#[test]
fn the_part_check_finds_the_tracker_named_in_code_and_not_in_comments_or_strings() {
    let cases = [
        ("impl Tracker {\n    fn f(&self) {}\n}\n", true),
        ("use super::state::*;\n", true),
        ("fn f(t: &mut super::Tracker) {}\n", true),
        ("// the Tracker routes this\n/// see `Tracker::pump`\nfn f() -> &'static str { \"Tracker\" }\n", false),
        ("use super::nrp::Nrp;\nlet state = 1;\n", false),
    ];
    for (text, named) in cases {
        assert_eq!(names_the_tracker(text), named, "{text:?}");
    }
}

/// The tracker's parts, by the name the whole and the handles give each (`Tracker`'s fields),
/// and the files that hold each part (a name ending in `/`: a folder).
const PARTS: &[(&str, &[&str])] = &[
    ("outbox", &["outbox.rs"]),
    ("kube", &["cache.rs", "kube.rs"]),
    ("inbound", &["inbound.rs"]),
    ("nrp", &["nrp.rs"]),
    ("egress", &["egress/"]),
    ("budgets", &["budgets.rs"]),
    ("startup", &["startup.rs"]),
    ("figures", &["figures.rs", "stats.rs"]),
];

/// Where code in `file` reaches into a part that is not its own: `<part>.<field>` with no call
/// after it (`nrp.diff.touch(…)`, `to.inbound.lifecycles`), as opposed to asking the part
/// (`nrp.touch(…)`). Comments and strings do not count.
fn reaches_across(file: &str, text: &str) -> Vec<String> {
    let own = |part: &str| {
        PARTS.iter().any(|(name, files)| {
            *name == part && files.iter().any(|f| if f.ends_with('/') { file.starts_with(f) } else { file == *f })
        })
    };
    let tokens = tokens(text);
    tokens
        .windows(4)
        .filter_map(|w| match w {
            [Token::Ident(part), Token::Punct('.'), Token::Ident(field), next]
                if PARTS.iter().any(|(name, _)| name == part)
                    && !own(part)
                    && !matches!(next, Token::Punct('(') | Token::Sep) =>
            {
                Some(format!("{part}.{field}"))
            }
            _ => None,
        })
        .collect()
}

/// ARCHITECTURE.md, invariant 13: a part's data is its own. Another part, or the coordinator
/// routing an input, asks the part through its methods; neither reads or writes the part's
/// fields, so a part may change its layout without touching any other file but the state format.
#[test]
fn no_part_of_the_tracker_and_not_the_coordinator_reaches_into_a_parts_fields() {
    let coordinator = workspace().join("guest/src/tracker/mod.rs");
    let mut files = part_files();
    files.push(("mod.rs".to_owned(), std::fs::read_to_string(coordinator).unwrap()));
    let reaches: Vec<String> = files
        .iter()
        .flat_map(|(name, text)| reaches_across(name, text).into_iter().map(move |r| format!("{name}: {r}")))
        .collect();
    assert!(reaches.is_empty(), "parts that reach into another part's fields (ask it by a method): {reaches:#?}");
}

#[test]
fn the_reach_check_finds_fields_of_other_parts_and_not_calls_or_a_parts_own_fields() {
    let cases = [
        ("inbound.rs", "fn f(drive: &mut Drive) { drive.nrp.diff.touch_identity(id) }", vec!["nrp.diff"]),
        (
            "startup.rs",
            "fn f(to: &Adoption) -> bool { to.inbound.lifecycles.contains_key(id) }",
            vec!["inbound.lifecycles"],
        ),
        ("driver.rs", "fn f(nrp: &mut Nrp) { nrp.sync.next_read_ms = now; }", vec!["nrp.sync"]),
        ("stats.rs", "fn f(v: &V) { v.egress.outbound.work.draining.len() }", vec!["egress.outbound"]),
        ("inbound.rs", "fn f(drive: &mut Drive) { drive.nrp.touch(id); drive.outbox.issue(c, w, s) }", vec![]),
        ("egress/pods.rs", "fn f(&self) { self.egress.outbound.lifecycles.len() }", vec![]),
        ("nrp.rs", "fn f(&mut self) { let nrp = &mut self.sync; nrp.loaded = true; }", vec![]),
        ("kube.rs", "// reads nrp.diff.registered\nfn f() -> &'static str { \"nrp.sync\" }", vec![]),
        ("stats.rs", "fn f(&self) { self.figures.running.len() }", vec![]),
        ("mod.rs", "fn f(&mut self) { self.startup.arm.next_read_ms = 0; self.nrp.touch(id) }", vec!["startup.arm"]),
    ];
    for (file, text, expected) in cases {
        assert_eq!(reaches_across(file, text), expected, "{file}: {text:?}");
    }
}

/// The product's source files (the guest, the host's crates, `clb-host`, the fuzz library and
/// the build support), by path from the workspace, with their text up to an inline test module
/// (tests kept in files of their own are not product files and count apart).
fn product_sources() -> Vec<(String, String)> {
    let root = workspace();
    let mut roots = vec![root.join("guest/src"), root.join("host/src"), root.join("fuzz-lib/src")];
    roots.push(root.join("build-support/src"));
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        roots.push(entry.unwrap().path().join("src"));
    }
    let mut out = Vec::new();
    while let Some(folder) = roots.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && name != "tests" {
                roots.push(path);
            } else if name.ends_with(".rs") && name != "tests.rs" {
                let text = std::fs::read_to_string(&path).unwrap();
                let product = text.find("#[cfg(test)]\nmod tests {").map_or(text.as_str(), |at| &text[..at]);
                let path = path.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
                out.push((path, product.to_owned()));
            }
        }
    }
    out
}

/// A file of more than this many lines says why in its module doc; none has more than
/// [`MOST_LINES`] (ARCHITECTURE.md, "Conventions").
const LINES_WITHOUT_A_REASON: usize = 800;
const MOST_LINES: usize = 1_000;

/// What is wrong with a product file of `text` as to its length, if anything.
fn length_problem(text: &str) -> Option<String> {
    let lines = text.lines().count();
    let says_why = text.lines().take_while(|l| l.starts_with("//!") || l.is_empty()).any(|l| {
        l.contains(&format!("longer than {LINES_WITHOUT_A_REASON} lines because"))
            || l.contains(&format!("longer than {LINES_WITHOUT_A_REASON} lines on purpose"))
    });
    if lines > MOST_LINES {
        Some(format!("{lines} lines, more than {MOST_LINES}"))
    } else if lines > LINES_WITHOUT_A_REASON && !says_why {
        Some(format!("{lines} lines, and its module doc does not say why it is longer than {LINES_WITHOUT_A_REASON}"))
    } else {
        None
    }
}

#[test]
fn no_product_file_is_over_a_thousand_lines_nor_over_eight_hundred_without_saying_why() {
    let sources = product_sources();
    assert!(sources.len() > 50, "the product's sources were not found under {}", workspace().display());
    let problems: Vec<String> =
        sources.iter().filter_map(|(path, text)| length_problem(text).map(|p| format!("{path}: {p}"))).collect();
    assert!(problems.is_empty(), "files to split (or, between 800 and 1,000 lines, to explain): {problems:#?}");
}

#[test]
fn the_length_check_refuses_a_long_file_and_one_without_its_reason() {
    let body = |n: usize| "fn f() {}\n".repeat(n);
    let why = "//! A file.\n//!\n//! It is longer than 800 lines because its one table is read whole.\n\n";
    let cases = [
        (body(800), false),
        (body(801), true),
        (format!("{why}{}", body(900)), false),
        (format!("//! A file.\n\n{}", body(900)), true),
        (format!("{why}{}", body(1_001)), true),
        // The reason counts only in the module doc, not in a comment further down.
        (format!("//! A file.\n\nfn g() {{}}\n// It is longer than 800 lines because of this.\n{}", body(900)), true),
    ];
    for (text, refused) in cases {
        assert_eq!(length_problem(&text).is_some(), refused, "{} lines", text.lines().count());
    }
}

// The suite runs again and again on one machine's disk: what it writes must not outlive it.
#[test]
fn a_scratch_folder_goes_when_its_test_drops_it_and_an_ended_processs_folder_at_the_next_processs_start() {
    let dir = clb_tests::scratch("scratch-itself");
    std::fs::write(dir.join("file"), b"x").unwrap();
    let kept = dir.to_path_buf();
    drop(dir);
    assert!(!kept.exists(), "{} is left behind", kept.display());

    let temp = clb_tests::scratch("scratch-sweep");
    // No process has a pid above the kernel's pid_max (at most 2^22).
    let ended = temp.join("clb-tests-4000000000");
    let alive = temp.join(format!("clb-tests-{}", std::process::id()));
    let other = temp.join("clb-testsuite");
    for dir in [&ended, &alive, &other] {
        std::fs::create_dir_all(dir.join("inner")).unwrap();
    }
    clb_tests::scratch::remove_ended(&temp);
    assert!(!ended.exists() && alive.exists() && other.exists());
}
