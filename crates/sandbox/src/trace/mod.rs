//! Traces: every call a host makes into the logic, with its arguments and result, as JSON Lines
//! in the canonical encoding of `docs/traces.md` — recorded by `simulate --record` and
//! `run --record`, compared by `replay` (the shadow check), and replayed by the other hosts
//! (`hosts/python`, `hosts/js`) byte for byte.
//!
//! * [`canonical`] — the encoding of WIT values, driven by the component's own types.
//! * [`schema`] — the component's functions by trace name; the schema file other hosts read.
//! * [`recorder`] — the background writer (bounded, never blocking a live controller).
//! * [`replay`] — reading traces and replaying them through a component, with the divergence
//!   report.

pub mod canonical;
pub mod recorder;
pub mod replay;
pub mod schema;

pub use recorder::{Arg, ComponentRef, Ended, Overflow, RecordOptions, RecordStats, Recorder, arg, lazy};
pub use schema::Signatures;

use crate::{LoadedLogic, PACKAGE};

impl ComponentRef {
    /// `logic` as a trace names it; `name` is how the host knows it, else its short sha256.
    pub fn of(logic: &LoadedLogic, name: Option<&str>) -> Self {
        let info = logic.info();
        Self {
            name: name.map_or_else(|| info.sha256.chars().take(12).collect(), str::to_owned),
            package: info.package_version().map_or_else(|| PACKAGE.to_owned(), |v| format!("{PACKAGE}@{v}")),
            sha256: info.sha256.clone(),
        }
    }
}

/// The schema file's text (`hosts/schema/clb-reconciler.json`).
pub fn schema_text(logic: &LoadedLogic) -> String {
    serde_json::to_string_pretty(&Signatures::of(logic).schema()).expect("a JSON value always prints")
}

/// Where `simulate --record PATH` writes each scenario's trace: PATH itself for one scenario,
/// else (or when PATH ends in `/` or is a directory) `PATH/<scenario file name>.jsonl`.
pub fn trace_paths(
    path: &std::path::Path,
    scenarios: &[std::path::PathBuf],
) -> Result<Vec<std::path::PathBuf>, String> {
    let as_dir = scenarios.len() > 1 || path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/');
    if !as_dir {
        return Ok(vec![path.to_owned()]);
    }
    std::fs::create_dir_all(path).map_err(|e| format!("{}: cannot create the trace directory: {e}", path.display()))?;
    let mut seen = std::collections::BTreeSet::new();
    scenarios
        .iter()
        .map(|scenario| {
            let stem = scenario.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            if !seen.insert(stem.clone()) {
                return Err(format!("{}: two scenarios would write {stem}.jsonl", scenario.display()));
            }
            Ok(path.join(format!("{stem}.jsonl")))
        })
        .collect()
}

/// A whole-file recorder for one scenario run through `logic`.
/// `component` is how the command line named the logic (`builtin` or its file).
pub fn record_scenario(
    logic: &LoadedLogic,
    component: &str,
    path: &std::path::Path,
    name: &str,
) -> Result<std::sync::Arc<Recorder>, recorder::RecordError> {
    let options = RecordOptions::whole(path.to_owned(), format!("simulate {name}"));
    Recorder::start(options, Signatures::of(logic), &ComponentRef::of(logic, Some(component)))
}
