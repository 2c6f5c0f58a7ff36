//! The command line: one file per subcommand (`inspect`, `validate`, `simulate`, `replay`,
//! `component`, `schema`, `emulator`, `run`, `swap`), each holding its flags and what it does;
//! [`args`] holds what several share (the logic and its limits, the write budgets, the parsers).
//! This file is the parser's top and the dispatch. Output goes to the writers it is given, so
//! tests run it in-process.

mod admission;
mod args;
mod component;
mod emulator;
mod explore;
mod inspect;
mod replay;
mod run;
mod schema;
mod simulate;
mod swap;
mod validate;

use crate::logging::LogFormat;
use admission::AdmissionArgs;
use args::{BudgetArgs, LogicArgs};
use clap::{Parser, Subcommand};
use component::ComponentArgs;
use emulator::EmulatorArgs;
use explore::ExploreArgs;
use replay::ReplayArgs;
use run::RunArgs;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use swap::SwapArgs;

pub use args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED};
pub use run::DEFAULT_LISTEN;
pub use swap::DEFAULT_ENDPOINT;

#[derive(Parser)]
#[command(name = "clb-host", version, about = "The Container Load Balancer reconciler's host")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines (stderr) are written: `text` for people (coloured only on a terminal),
    /// `json` for log pipelines, one JSON object a line. What is logged: RUST_LOG (default warn).
    /// The binary's; `crate::logging`.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Print a component's sha256, exported interfaces and version, and its imports; from a file
    /// or pulled from an OCI registry (`oci://REF`, with the artifact's digest and annotations).
    ///
    /// Exits 0 when this host would load it, 1 when it would refuse it (or the reference names
    /// no wasm component), 2 when the file cannot be read or is not a component, or the
    /// registry cannot be reached, lacks it or serves other bytes than its digest.
    Inspect {
        /// The component (.wasm), or `oci://REF` (`REGISTRY/REPOSITORY:TAG` or `@sha256:…`).
        file: PathBuf,
        /// Also check that a signature by this public key vouches for it (exits 1 when none
        /// verifies): with `oci://`, a cosign signature of the artifact's digest in the registry;
        /// for a file, its detached signature `FILE.sig` (`cosign sign-blob`).
        #[arg(long, value_name = "KEY")]
        verify_key: Option<PathBuf>,
        #[command(flatten)]
        registry: args::RegistryArgs,
    },
    /// Run the validation rules on a cloud configuration and Services through the component.
    ///
    /// Exits 0 when everything is admitted, 1 when anything is rejected, 2 when an input cannot
    /// be read (with the file, the line and why).
    Validate {
        /// The cloud configuration (azure.json; YAML or JSON).
        config: PathBuf,
        /// Manifests of Services (several documents per file allowed).
        services: Vec<PathBuf>,
        #[command(flatten)]
        logic: LogicArgs,
    },
    /// Replay scenario files against the in-process Azure emulator and an in-memory cluster, on
    /// virtual time, and report the commands, the faults hit, the final NRP state and each
    /// expectation.
    ///
    /// Exits 0 when every expectation holds, 1 when one fails (or the logic traps), 2 when a
    /// scenario file is invalid (with the file, the line and why).
    Simulate {
        /// Scenario files (docs/scenarios.md).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print the reports as one JSON array instead of text.
        #[arg(long)]
        json: bool,
        /// Record a trace of every call into the logic (docs/traces.md): a file for one
        /// scenario; a directory (created if missing) holding `<scenario file>.jsonl` for
        /// several, or when the path ends in `/`.
        #[arg(long, value_name = "FILE|DIR")]
        record: Option<PathBuf>,
        #[command(flatten)]
        logic: LogicArgs,
        #[command(flatten)]
        budgets: BudgetArgs,
    },
    /// Run scenario files once as written and once per perturbation (a crash at every command
    /// boundary, the logic rebuilt from its own state at every input), and compare the world
    /// each run leaves with the unperturbed run's (docs/testing.md, "Exploration").
    ///
    /// Exits 0 when no perturbation changes the world, 1 when one does (each with the command
    /// that reproduces it) or a scenario's own run fails, 2 when an input or flag is invalid.
    Explore(ExploreArgs),
    /// Replay traces through a component and compare every result with the recorded one (the
    /// shadow check; docs/traces.md).
    ///
    /// Exits 0 when every result is identical, 1 when one differs (the first divergence is
    /// printed, or every one with --all-divergences), 2 when a trace cannot be read or replayed
    /// (with the file, the line and why).
    Replay(ReplayArgs),
    /// Write the built-in component (the .wasm this host runs by default) to FILE, for other
    /// hosts (hosts/python, hosts/js) or a ConfigMap; or push it (or another) to an OCI registry.
    ///
    /// Exits 0 when written or pushed (a push prints the manifest's digest), 2 when it cannot be.
    Component(ComponentArgs),
    /// Print the schema of the component's functions that other hosts read
    /// (hosts/schema/clb-reconciler.json; docs/traces.md).
    Schema {
        /// A component instead of the built-in logic (gzip or zstd compressed or not).
        #[arg(long, value_name = "FILE")]
        component: Option<PathBuf>,
    },
    /// Serve the local Azure emulator (NRP serviceGateways, public IPs, load balancers, backend
    /// pools, faults at /emulator/faults, state at /emulator/state) until killed.
    ///
    /// Prints `listening on http://ADDR` once bound; exits 2 when it cannot listen.
    Emulator(EmulatorArgs),
    /// Serve the logic's admission rules as a ValidatingAdmissionWebhook: POST /validate takes
    /// an admission.k8s.io/v1 AdmissionReview and answers with the verdict of `admit-service`
    /// (only CREATE and UPDATE of a v1 Service are judged), over TLS; also /healthz, /readyz and
    /// /metrics (docs/operations.md, "Admission").
    ///
    /// Prints `listening on https://ADDR/validate` once bound; exits 2 when an input cannot be
    /// read or it cannot listen, 1 when the logic refuses the configuration.
    Admission(Box<AdmissionArgs>),
    /// Reconcile a cluster: watch its Services, EndpointSlices and Nodes, and carry out what the
    /// logic asks on Azure (ARM, or the emulator) and on the cluster, until interrupted.
    ///
    /// Several replicas may run: only the leader (a Lease, `--leader-elect-*`) watches and
    /// writes. Serves / (the operator page), /metrics, /healthz, /readyz, /status and POST /swap on --listen (prints
    /// `listening on http://ADDR`). Exits 0 on SIGTERM or SIGINT (after letting running
    /// commands finish, up to --shutdown-grace-secs, then releasing leadership), 2 when it
    /// cannot start (with why), 1 when the logic or the watches fail.
    Run(Box<RunArgs>),
    /// Ask a running `clb-host run` to swap its logic to a component, and print the result.
    ///
    /// Exits 0 when the new version serves (or already served), 1 when the swap is refused (the
    /// running version keeps serving; the reason is printed), 2 when the file cannot be read or
    /// the endpoint cannot be reached or denies the request.
    Swap(SwapArgs),
}

/// Runs the command line `args` (the first is the program name); returns the exit code.
pub fn run(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    run_with_logging(args, out, err, |_| {})
}

/// [`run`], calling `init_logging` with the `--log-format` asked for once the command line
/// parsed (before the command runs): the binary sets up its subscriber there; the library's
/// callers (tests) keep theirs.
pub fn run_with_logging(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    init_logging: impl FnOnce(LogFormat),
) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(usage) => {
            // `--help` and `--version` are answers, not errors.
            if usage.use_stderr() {
                let _ = write!(err, "{}", usage.render());
                return EXIT_BAD_INPUT;
            }
            let _ = write!(out, "{}", usage.render());
            return EXIT_OK;
        }
    };
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Inspect { file, verify_key, registry } => {
            inspect::inspect(&file, verify_key.as_deref(), &registry, out, err)
        }
        Command::Validate { config, services, logic } => validate::validate(&config, &services, &logic, out, err),
        Command::Simulate { files, json, record, logic, budgets } => {
            simulate::simulate(&files, json, record.as_deref(), &logic, &budgets, out, err)
        }
        Command::Explore(args) => explore::explore(&args, out, err),
        Command::Replay(args) => replay::replay(&args, out, err),
        Command::Schema { component } => schema::schema(component.as_deref(), out),
        Command::Component(args) => component::component(&args, out, err),
        Command::Emulator(args) => emulator::emulator(args, out),
        Command::Admission(args) => admission::admission(*args, out, err),
        Command::Run(args) => run::run_reconciler(*args, out, err),
        Command::Swap(args) => swap::swap(args, out, err),
    };
    result.unwrap_or_else(|e| {
        let _ = writeln!(err, "error: {e:#}");
        EXIT_BAD_INPUT
    })
}
