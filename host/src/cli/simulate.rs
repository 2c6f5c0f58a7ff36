//! `clb-host simulate`: scenario files against the in-process emulator and an in-memory cluster.

use super::args::{BudgetArgs, EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, LogicArgs, WRITE_BUDGETS_FIELD};
use clb_sandbox::Runtime;
use std::io::Write;
use std::path::PathBuf;

pub(super) fn simulate(
    files: &[PathBuf],
    json: bool,
    record: Option<&std::path::Path>,
    logic: &LogicArgs,
    budgets: &BudgetArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    use clb_simulator::simulate::Supervised as _;
    use clb_simulator::{scenario, simulate};
    // Every file is read first: a typo in the last one should not cost a whole run.
    let write_budgets = match budgets.write_budgets() {
        Ok(b) => b,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut scenarios = Vec::new();
    for path in files {
        match scenario::read(path) {
            Ok(mut s) => {
                if write_budgets.is_some() {
                    s.config.write_budgets = write_budgets;
                }
                scenarios.push(s)
            }
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    let runtime = Runtime::new()?;
    let logic_args = logic;
    let logic = runtime.load(&logic.bytes()?, logic.limits())?;
    if write_budgets.is_some() {
        // A budget the logic refuses is a bad flag, not a failed expectation.
        let mut session = logic.session()?;
        for scenario in &scenarios {
            if let Err(e) = session.validate_config(&scenario.config)?
                && e.field == WRITE_BUDGETS_FIELD
            {
                writeln!(err, "error: --write-budget: {} ({})", e.message, e.reason)?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    let traces = match record {
        Some(path) => match clb_sandbox::trace::trace_paths(path, files) {
            Ok(paths) => paths,
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        },
        None => Vec::new(),
    };
    let mut reports = Vec::new();
    for (index, scenario) in scenarios.iter().enumerate() {
        // `swap` steps may name `builtin` or a file; only the test suite registers other names.
        let mut reconciler =
            simulate::ComponentReconciler::new(&logic).with_components(&runtime, std::collections::BTreeMap::new());
        if let Some(path) = traces.get(index) {
            let component = logic_args.component.as_ref().map_or_else(|| "builtin".into(), |p| p.display().to_string());
            match clb_sandbox::trace::record_scenario(&logic, &component, path, &scenario.name) {
                Ok(recorder) => reconciler = reconciler.with_recorder(recorder),
                Err(e) => {
                    writeln!(err, "error: {e}")?;
                    return Ok(EXIT_BAD_INPUT);
                }
            }
        }
        let report = simulate::run(scenario, &mut reconciler);
        if let Some(recorder) = reconciler.recorder() {
            recorder.flush();
            let stats = recorder.stats();
            let lost = stats.lines_dropped.load(std::sync::atomic::Ordering::Relaxed);
            if lost > 0 {
                writeln!(err, "error: {}: {lost} trace lines could not be written", traces[index].display())?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
        let report = match report {
            Ok(report) => report,
            Err(e @ simulate::SimulateError::Cluster { .. }) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
            Err(e) => return Err(e.into()),
        };
        if !json {
            simulate::render(&report, out)?;
            writeln!(out)?;
        }
        reports.push(report);
    }
    let passed = reports.iter().filter(|r| r.passed).count();
    if json {
        serde_json::to_writer_pretty(&mut *out, &reports)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{passed} of {} scenarios passed", reports.len())?;
    }
    Ok(if passed == reports.len() { EXIT_OK } else { EXIT_REFUSED })
}
