//! `clb-host`: the command line of the CLB reconciler's host.

use std::process::ExitCode;

fn main() -> ExitCode {
    let (out, err) = (&mut std::io::stdout(), &mut std::io::stderr());
    ExitCode::from(clb_host::cli::run_with_logging(std::env::args_os(), out, err, clb_host::logging::init))
}
