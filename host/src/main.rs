//! `clb-host`: the command line of the CLB reconciler's host.

use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    ExitCode::from(clb_host::cli::run(std::env::args_os(), &mut std::io::stdout(), &mut std::io::stderr()))
}
