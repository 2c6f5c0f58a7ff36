//! `clb-host replay`: traces through a component, every result compared (the shadow check).

use super::args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, LogicArgs, read_component};
use anyhow::Context as _;
use clap::Args;
use clb_sandbox::Runtime;
use std::io::Write;
use std::path::PathBuf;

/// What `replay` compares.
#[derive(Args)]
pub(super) struct ReplayArgs {
    /// Trace files (JSON Lines).
    #[arg(required = true)]
    pub(super) traces: Vec<PathBuf>,
    /// What a `swap` line to component NAME replays into (default: the replayed component).
    #[arg(long, value_name = "NAME=FILE")]
    pub(super) swap_component: Vec<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub(super) json: bool,
    /// Go on past the first divergence and summarise them by command kind.
    #[arg(long)]
    pub(super) all_divergences: bool,
    #[command(flatten)]
    pub(super) logic: LogicArgs,
}

pub(super) fn replay(args: &ReplayArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use clb_sandbox::trace::replay;
    let runtime = Runtime::new()?;
    let limits = args.logic.limits();
    let primary = match args.logic.bytes() {
        Ok(bytes) => runtime.load(&bytes, limits)?,
        Err(e) => {
            writeln!(err, "error: {e:#}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut named = std::collections::BTreeMap::new();
    for pair in &args.swap_component {
        let Some((name, file)) = pair.split_once('=') else {
            writeln!(err, "error: --swap-component {pair:?}: expected NAME=FILE")?;
            return Ok(EXIT_BAD_INPUT);
        };
        let loaded = read_component(std::path::Path::new(file))
            .and_then(|bytes| runtime.load(&bytes, limits).with_context(|| file.to_owned()));
        match loaded {
            Ok(logic) => named.insert(name.to_owned(), logic),
            Err(e) => {
                writeln!(err, "error: {e:#}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        };
    }
    let mut reports = Vec::new();
    for path in &args.traces {
        let components = replay::Components { primary: &primary, named: &named };
        match replay::replay_file(path, components, args.all_divergences) {
            Ok(report) => reports.push(report),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    if args.json {
        writeln!(out, "{}", replay::json_report(&reports, args.all_divergences))?;
    } else {
        replay::text_report(&reports, args.all_divergences, out)?;
    }
    let identical = reports.iter().all(|r| r.divergences.is_empty());
    Ok(if identical { EXIT_OK } else { EXIT_REFUSED })
}
