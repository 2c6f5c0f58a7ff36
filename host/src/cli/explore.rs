//! `clb-host explore`: scenario files run once as written and once per perturbation (a crash at
//! every command boundary, stale lists at a restart, watch events coalesced, lost, doubled or
//! reordered, a rebuild of the logic at every input, a deposed leader's late write), each run's
//! world compared with the unperturbed one's (`clb_simulator::explore`; docs/testing.md, "Exploration").

use super::args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, LogicArgs};
use clb_sandbox::Runtime;
use clb_simulator::explore::{self, Class, Exploration, Options};
use clb_simulator::{scenario, simulate};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub(super) struct ExploreArgs {
    /// Scenario files (docs/scenarios.md).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The classes of perturbation, comma-separated: `crash` (the controller dies before a
    /// command is sent, after it was applied and before its answer arrived, before a
    /// backend-pool tick, or within one between two groups' writes), `stale` (a restart whose lists are an earlier state of the cluster),
    /// `unobserved` (watch events coalesced, lost until a re-list, twice, reordered), `swap`
    /// (the logic rebuilt from its own state before a call) and `failover` (the leader loses its
    /// lease with a command in flight, which lands after the other replica took over).
    #[arg(long, value_delimiter = ',', default_value = "crash,stale,unobserved,swap,failover")]
    classes: Vec<String>,
    /// Perturbations per class and scenario; a scenario with more points gets this many, drawn
    /// by --seed.
    #[arg(long, default_value_t = 200)]
    budget: usize,
    /// The seed that draws the points past the budget.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run only this perturbation (`crash-after:17`, `stale:9:4`, `drop:3:0`, …), as a
    /// divergence's reproducer says, and print its run's report. A scenario file with a
    /// `perturbation:` of its own (one --write-repro wrote) runs that one.
    #[arg(long, value_name = "PERTURBATION")]
    only: Option<String>,
    /// Write each divergence's reproducer into this directory: the scenario with the
    /// perturbation added, `<scenario file's stem>.<perturbation>.yaml`.
    #[arg(long, value_name = "DIR")]
    write_repro: Option<PathBuf>,
    /// Print `{"classes": {"<class>": {"explored": N, "divergences": D}}, "scenarios": […]}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    logic: LogicArgs,
}

pub(super) fn explore(args: &ExploreArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    let classes: Result<Vec<Class>, _> = args.classes.iter().map(|c| c.parse()).collect();
    let only = args.only.as_deref().map(str::parse::<explore::Perturbation>).transpose();
    let (classes, only) = match (classes, only) {
        (Ok(classes), Ok(only)) => (classes, only),
        (Err(e), _) | (_, Err(e)) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut scenarios = Vec::new();
    for path in &args.files {
        match scenario::read(path) {
            Ok(s) => scenarios.push(s),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    if let Some(dir) = &args.write_repro {
        // Before the exploration, which may take minutes: a directory that cannot be made is
        // said at once, not after the work whose reproducers it was to hold.
        if let Err(e) = std::fs::create_dir_all(dir) {
            writeln!(err, "error: reproducer directory {}: {e}", dir.display())?;
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let runtime = Runtime::new()?;
    let logic = runtime.load(&args.logic.bytes()?, args.logic.limits())?;
    let options =
        Options { classes, budget: args.budget, seed: args.seed, settle_ms: explore::DEFAULT_SETTLE_MS, only };
    let mut explorations = Vec::new();
    for scenario in &scenarios {
        let fresh = || simulate::ComponentReconciler::new(&logic).with_components(&runtime, BTreeMap::new());
        let exploration = match explore::explore(scenario, fresh, &options) {
            Ok(exploration) => exploration,
            Err(e @ explore::ExploreError::Simulate(simulate::SimulateError::Cluster { .. })) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
            Err(e) => return Err(e.into()),
        };
        if let (Some(report), false) = (&exploration.only_report, args.json) {
            // The reproducer's run, as `simulate` reports it.
            simulate::render(report, out)?;
            writeln!(out)?;
        }
        if !args.json {
            render(&exploration, out)?;
        }
        if let Some(dir) = &args.write_repro {
            for path in explore::write_reproducers(dir, &exploration)? {
                writeln!(err, "wrote {}", path.display())?;
            }
        }
        explorations.push(exploration);
    }
    let mut totals: BTreeMap<&str, explore::ClassFigures> = BTreeMap::new();
    for (class, figures) in explorations.iter().flat_map(|e| &e.classes) {
        let total = totals.entry(class).or_default();
        total.points += figures.points;
        total.explored += figures.explored;
        total.divergences += figures.divergences;
    }
    let failed = explorations.iter().filter(|e| e.reference_failed.is_some() || !e.divergences.is_empty()).count();
    if args.json {
        let json = serde_json::json!({ "classes": totals, "scenarios": explorations });
        serde_json::to_writer_pretty(&mut *out, &json)?;
        writeln!(out)?;
    } else {
        for (class, figures) in &totals {
            writeln!(
                out,
                "{class}: {} of {} points explored, {} divergences",
                figures.explored, figures.points, figures.divergences
            )?;
        }
        writeln!(
            out,
            "{} of {} scenarios explored without a divergence",
            explorations.len() - failed,
            explorations.len()
        )?;
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_REFUSED })
}

fn render(exploration: &Exploration, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "{} ({})", exploration.scenario, exploration.path)?;
    if let Some(why) = &exploration.reference_failed {
        return writeln!(out, "  the reference run failed, so nothing was explored: {why}");
    }
    for (class, figures) in &exploration.classes {
        writeln!(
            out,
            "  {class}: {} of {} points explored, {} divergences",
            figures.explored, figures.points, figures.divergences
        )?;
    }
    for divergence in &exploration.divergences {
        writeln!(out, "  DIVERGES at {}:", divergence.perturbation)?;
        for line in &divergence.differences {
            writeln!(out, "    {line}")?;
        }
        writeln!(out, "    reproduce: clb-host explore {} --only {}", exploration.path, divergence.perturbation)?;
    }
    Ok(())
}
