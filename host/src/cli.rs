//! The command line: `clb-host inspect`, `clb-host validate`, `clb-host simulate`, `clb-host emulator`,
//! `clb-host run` and `clb-host swap`. Output goes to the writers it
//! is given, so tests run it in-process.

use crate::logging::LogFormat;
use crate::sandbox::bindings::clb::reconciler::types::{Budget, Mode, WriteBudgets};
use crate::sandbox::bindings::exports::clb::reconciler::validation::Verdict;
use crate::sandbox::{ComponentInfo, Limits, PACKAGE, Runtime};
use crate::{BUILTIN_GUEST, compression, inputs, records};
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::core::v1::Service;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Exit codes shared by the subcommands.
pub const EXIT_OK: u8 = 0;
pub const EXIT_REFUSED: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

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
    /// Print a component's sha256, exported interfaces and version, and its imports.
    ///
    /// Exits 0 when this host would load it, 1 when it would refuse it, 2 when the file cannot
    /// be read or is not a component.
    Inspect {
        /// The component (.wasm).
        file: PathBuf,
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
    /// Replay traces through a component and compare every result with the recorded one (the
    /// shadow check; docs/traces.md).
    ///
    /// Exits 0 when every result is identical, 1 when one differs (the first divergence is
    /// printed, or every one with --all-divergences), 2 when a trace cannot be read or replayed
    /// (with the file, the line and why).
    Replay(ReplayArgs),
    /// Write the built-in component (the .wasm this host runs by default) to FILE, for other
    /// hosts (hosts/python, hosts/js) or a ConfigMap.
    Component {
        /// Where to write it.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Write it compressed (gzip: level 9), e.g. for a ConfigMap's binaryData; every way
        /// in takes it so. For zstd, compress the plain file with `zstd -19`.
        #[arg(long, value_enum, value_name = "FORMAT")]
        compress: Option<CompressArg>,
    },
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

/// What `swap` sends where.
#[derive(Args)]
struct SwapArgs {
    /// The new component (.wasm), gzip or zstd compressed or not; it is sent as it is.
    #[arg(long, value_name = "FILE")]
    to: PathBuf,
    /// The sha256 the component must have (of the decompressed component, when it is
    /// compressed); the running host refuses it otherwise.
    #[arg(long, value_name = "HEX")]
    sha256: Option<crate::live::swap::Sha256Pin>,
    /// The endpoint of the running host (its --listen).
    #[arg(long, value_name = "URL", default_value = DEFAULT_ENDPOINT)]
    endpoint: String,
    /// A file holding the admin token, when the host was started with --admin-token-file.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// What `replay` compares.
#[derive(Args)]
struct ReplayArgs {
    /// Trace files (JSON Lines).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// What a `swap` line to component NAME replays into (default: the replayed component).
    #[arg(long, value_name = "NAME=FILE")]
    swap_component: Vec<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Go on past the first divergence and summarise them by command kind.
    #[arg(long)]
    all_divergences: bool,
    #[command(flatten)]
    logic: LogicArgs,
}

/// Where `run` listens by default: every interface, so that probes and scrapes reach it in a
/// pod; `POST /swap` is still taken only from loopback unless an admin token is set.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:10270";
/// Where `swap` sends by default: the host on the same machine (or in the same pod).
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:10270";

/// What `run` connects to.
#[derive(Args)]
struct RunArgs {
    /// The kubeconfig; default: the in-cluster configuration, else `KUBECONFIG` or
    /// `~/.kube/config`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The Azure cloud configuration (azure.json): the mode's keys, and `subscriptionId`,
    /// `resourceGroup`, `location`, `vnetName` (and `vnetResourceGroup`) for the resources.
    #[arg(long)]
    cloud_config: PathBuf,
    /// ARM's base URL, or the emulator's (`clb-host emulator` prints it).
    #[arg(long, default_value = crate::azure::arm::DEFAULT_BASE_URL)]
    azure_url: String,
    /// The longest one request to ARM (public IPs, load balancers, backend pools) may take.
    #[arg(long, default_value = "60s", value_parser = request_timeout)]
    arm_request_timeout: Duration,
    /// The longest one request to NRP (the ServiceGateway's services and address locations)
    /// may take; every Service's endpoint changes wait for a hung one that long.
    #[arg(long, default_value = "20s", value_parser = request_timeout)]
    nrp_request_timeout: Duration,
    /// The longest the polling of one asynchronous ARM operation may take.
    #[arg(long, default_value = "5m", value_parser = request_timeout)]
    arm_operation_timeout: Duration,
    #[command(flatten)]
    budgets: BudgetArgs,
    /// The ARM credential: none (the emulator), a bearer token kept in a file, or workload
    /// identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_FEDERATED_TOKEN_FILE`).
    #[arg(long, value_enum, default_value_t = CredentialKind::WorkloadIdentity)]
    credential: CredentialKind,
    /// The file holding the bearer token, for `--credential token-file`.
    #[arg(long, required_if_eq("credential", "token-file"))]
    token_file: Option<PathBuf>,
    /// The ServiceGateway's name.
    #[arg(long, default_value = crate::azure::DEFAULT_SERVICE_GATEWAY)]
    service_gateway: String,
    /// The cluster's name, as the cloud controller manager's `--cluster-name`: in multi-SLB
    /// local-service mode a public IP tagged with another cluster's name places no Service. The
    /// cloud config's `loadBalancerName` overrides it, as upstream's.
    #[arg(long, default_value = crate::inputs::DEFAULT_CLUSTER_NAME)]
    cluster_name: String,
    /// On SIGTERM/SIGINT, how long running commands may finish before they are abandoned.
    #[arg(long, default_value_t = crate::live::settings::SHUTDOWN_GRACE.as_secs())]
    shutdown_grace_secs: u64,
    #[command(flatten)]
    election: ElectionArgs,
    #[command(flatten)]
    resource_lock: ResourceLockArgs,
    #[command(flatten)]
    logic: LogicArgs,
    #[command(flatten)]
    operations: OperationsArgs,
    #[command(flatten)]
    shadow: ShadowArgs,
    #[command(flatten)]
    record: RecordArgs,
}

/// `run`'s candidate in shadow (docs/operations.md, "Canary a version by shadow").
#[derive(Args)]
#[command(group(clap::ArgGroup::new("shadow_source").args(["shadow_logic_file", "shadow_logic_configmap"])))]
struct ShadowArgs {
    /// Run this component file in shadow beside the serving version: it is given every input and
    /// its answers are compared, but nothing it asks for is carried out. Watched like
    /// --logic-file: a new content replaces the candidate.
    #[arg(long, value_name = "PATH")]
    shadow_logic_file: Option<PathBuf>,
    /// Run the component in this ConfigMap key in shadow (as --logic-configmap reads it).
    #[arg(long, value_name = "NAMESPACE/NAME:KEY")]
    shadow_logic_configmap: Option<crate::live::sources::ConfigMapKey>,
    /// Refuse any candidate whose sha256 (decompressed) is not this one.
    #[arg(long, value_name = "HEX", requires = "shadow_source")]
    shadow_sha256: Option<crate::live::swap::Sha256Pin>,
    /// Swap the candidate in (a staged swap, then its probation) once it has compared this many
    /// inputs in a row without a divergence; without it, promote by hand with `clb-host swap`.
    #[arg(long, value_name = "N", requires = "shadow_source", value_parser = clap::value_parser!(u64).range(1..))]
    promote_after: Option<u64>,
    /// Divergence kinds that do not hold a promotion back, comma-separated: a command's name
    /// (emit-event, put-load-balancer, …), command-order, wake-at or idle. They are still
    /// counted.
    #[arg(long, value_name = "KIND,...", value_delimiter = ',', requires = "shadow_source", value_parser = shadow_kind)]
    shadow_allow: Vec<String>,
    /// Write each divergence as a trace into this folder (`clb-host replay` reproduces it).
    #[arg(long, value_name = "DIR", requires = "shadow_source")]
    shadow_record: Option<PathBuf>,
}

fn shadow_kind(text: &str) -> Result<String, String> {
    let text = text.trim();
    if crate::live::control::shadow_kinds().any(|kind| kind == text) {
        Ok(text.to_owned())
    } else {
        let known: Vec<&str> = crate::live::control::shadow_kinds().collect();
        Err(format!("`{text}` is not a divergence kind; one of: {}", known.join(", ")))
    }
}

/// `run --record`: a trace of every call into the logic (docs/traces.md, docs/operations.md).
#[derive(Args)]
struct RecordArgs {
    /// Record a trace to this file (off by default). Written in the background: a slow or full
    /// disk costs trace lines (counted in clb_trace_lines_total), never a reconcile.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Start a new file once the current one holds this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256, requires = "record", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    record_max_file_mib: u64,
    /// Older files kept (FILE.1 the newest); 0 keeps only the current one.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "record", value_parser = clap::value_parser!(u32).range(0..=1000))]
    record_keep_files: u32,
}

/// The endpoint and the sources of new logic versions of `run`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("logic_source").args(["logic_file", "logic_configmap"])))]
struct OperationsArgs {
    /// Where to serve / (the operator page), /metrics, /healthz, /readyz, /status and POST /swap; port 0 picks a free one.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// A file holding a token: POST /swap is then taken from any peer that presents it as
    /// `Authorization: Bearer TOKEN` (and only then); without it, only from loopback.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Watch this component file and swap to it at start and whenever its content changes.
    #[arg(long, value_name = "PATH")]
    logic_file: Option<PathBuf>,
    /// Watch this ConfigMap key (binaryData, or base64 in data) and swap to it at start and
    /// whenever it changes.
    #[arg(long, value_name = "NAMESPACE/NAME:KEY")]
    logic_configmap: Option<crate::live::sources::ConfigMapKey>,
    /// Refuse, before loading, any version from the source whose sha256 is not this one (the
    /// sha256 of the decompressed component, when the source holds it compressed).
    #[arg(long, value_name = "HEX", requires = "logic_source")]
    logic_sha256: Option<crate::live::swap::Sha256Pin>,
    /// The ConfigMap swap Events regard; default: the --logic-configmap one, else
    /// kube-system/clb-reconciler.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    swap_events_configmap: Option<crate::live::control::EventTarget>,
    /// How many inputs a swapped-in version serves on probation: until then, the version it
    /// replaced is kept, and --probation-quarantines inputs it traps on (whatever it served
    /// between them), or two ticks, roll it back (docs/operations.md, "Probation").
    #[arg(long, default_value_t = crate::supervisor::PROBATION_INPUTS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    probation_inputs: u64,
    /// How many inputs a swapped-in version may quarantine within its probation: the last of
    /// them rolls it back.
    #[arg(long, default_value_t = crate::supervisor::PROBATION_QUARANTINES,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    probation_quarantines: u32,
}

/// Leader election among replicas (client-go's flags and defaults).
#[derive(Args)]
struct ElectionArgs {
    /// Elect a leader; only the leader watches and writes. `false`: run exactly one replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a standby waits, after it last saw the leader Lease change, before taking it.
    #[arg(long, default_value = "15s", value_parser = duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps writing after its last successful renewal; shorter than the
    /// lease duration.
    #[arg(long, default_value = "10s", value_parser = duration)]
    leader_elect_renew_deadline: Duration,
    /// Time between a standby's attempts and between the leader's renewals.
    #[arg(long, default_value = "2s", value_parser = duration)]
    leader_elect_retry_period: Duration,
    #[arg(long, default_value = crate::live::lease::LEADER_ELECTION_NAME)]
    leader_elect_resource_name: String,
    #[arg(long, default_value = crate::live::lease::LEADER_ELECTION_NAMESPACE)]
    leader_elect_resource_namespace: String,
    /// This replica's holder identity; default: `POD_NAME` (else `HOSTNAME`) and a random
    /// suffix. Also the `reportingInstance` of its Events.
    #[arg(long)]
    leader_elect_identity: Option<String>,
}

/// The Azure resource lock of upstream's `AzureResourceLocker` (its Lease, holder and duration).
#[derive(Args)]
struct ResourceLockArgs {
    #[arg(long, default_value = crate::live::lease::RESOURCE_LOCK_NAME)]
    azure_resource_lock_name: String,
    #[arg(long, default_value = crate::live::lease::RESOURCE_LOCK_NAMESPACE)]
    azure_resource_lock_namespace: String,
    /// Shared by every replica on purpose: the lock excludes other components (the AKS RP).
    #[arg(long, default_value = crate::live::lease::RESOURCE_LOCK_HOLDER)]
    azure_resource_lock_holder: String,
    #[arg(long, default_value = "900s", value_parser = duration)]
    azure_resource_lock_duration: Duration,
    /// Time between renewals while the lock is held.
    #[arg(long, default_value = "300s", value_parser = duration)]
    azure_resource_lock_renew_period: Duration,
}

fn parse_memory_mib(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(mib @ 1..=4096) => Ok(mib),
        _ => Err(format!("{text:?}: give 1 to 4096 MiB (a 32-bit guest addresses at most 4 GiB)")),
    }
}

/// `15s`, `500ms`, `2m`, or plain seconds.
/// A request or operation timeout: from 100 ms to an hour.
fn request_timeout(text: &str) -> Result<Duration, String> {
    let timeout = duration(text)?;
    if (Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&timeout) {
        Ok(timeout)
    } else {
        Err(format!("{text:?}: a timeout is from 100ms to 1h"))
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration such as 15s or 500ms"))?;
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(number * scale).map_err(|e| format!("{text:?}: {e}"))
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CredentialKind {
    None,
    TokenFile,
    WorkloadIdentity,
}

/// Where the emulator listens and which resource group it emulates.
#[derive(Args)]
struct EmulatorArgs {
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    #[arg(long, default_value = "00000000-0000-0000-0000-000000000000")]
    subscription: String,
    #[arg(long, default_value = "rg")]
    resource_group: String,
    #[arg(long, default_value = "eastus")]
    location: String,
    /// The VNet's resource group; default: the resource group.
    #[arg(long)]
    vnet_resource_group: Option<String>,
    #[arg(long, default_value = "vnet")]
    vnet: String,
    #[arg(long, default_value = crate::azure::DEFAULT_SERVICE_GATEWAY)]
    service_gateway: String,
    /// Items per page of the services and addressLocations lists.
    #[arg(long, default_value_t = 100)]
    page_size: usize,
    /// List IPv6 locations and addresses in upper case, as NRP may.
    #[arg(long)]
    echo_ipv6_upper: bool,
    /// ARM's subscription write bucket (PUT, DELETE, POST): tokens when full.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    arm_write_burst: u32,
    /// Write tokens ARM adds a second.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    arm_write_refill_per_second: u32,
    /// ARM's subscription read bucket (GET, lists): tokens when full.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..))]
    arm_read_burst: u32,
    /// Read tokens ARM adds a second.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    arm_read_refill_per_second: u32,
    /// Write tokens another client of the subscription spends a second.
    #[arg(long, default_value_t = 0)]
    arm_other_client_writes_per_second: u32,
    /// Do not throttle as ARM does (every call is answered, with no remaining-tokens headers).
    #[arg(long)]
    no_arm_limits: bool,
}

/// How fast the logic may write to Azure (docs/operations.md, "Write budgets"); the defaults
/// and the limits are the logic's own.
#[derive(Args)]
struct BudgetArgs {
    /// The write budget of OPERATION (update-address-locations, update-services or
    /// arm-writes): RATE as N/s or N/min, then the burst, e.g.
    /// `update-address-locations=10/s:20`. Repeat for each operation; one not named keeps the
    /// logic's default (300/min with a burst of 10, 20 and 100).
    #[arg(long = "write-budget", value_name = "OPERATION=RATE:BURST", value_parser = parse_write_budget)]
    write_budget: Vec<(BudgetOperation, Budget)>,
    /// The writes left to other clients of the subscription while ARM reports its remaining
    /// writes on each answer: the logic spends down to this many, then at ARM's refill rate
    /// (default 40, a fifth of ARM's documented bucket of 200).
    #[arg(long = "arm-write-reserve", value_name = "N")]
    arm_write_reserve: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BudgetOperation {
    UpdateAddressLocations,
    UpdateServices,
    ArmWrites,
}

/// The `field` of the logic's `config-error` for a refused write budget.
const WRITE_BUDGETS_FIELD: &str = "writeBudgets";

impl BudgetOperation {
    fn name(self) -> &'static str {
        match self {
            BudgetOperation::UpdateAddressLocations => "update-address-locations",
            BudgetOperation::UpdateServices => "update-services",
            BudgetOperation::ArmWrites => "arm-writes",
        }
    }
}

impl BudgetArgs {
    /// The budgets to put in the config: `None` when no flag names one (the logic's defaults).
    fn write_budgets(&self) -> Result<Option<WriteBudgets>, String> {
        if self.write_budget.is_empty() && self.arm_write_reserve.is_none() {
            return Ok(None);
        }
        let mut budgets = WriteBudgets {
            update_address_locations: None,
            update_services: None,
            arm_writes: None,
            arm_write_reserve: self.arm_write_reserve,
        };
        for &(operation, budget) in &self.write_budget {
            let slot = match operation {
                BudgetOperation::UpdateAddressLocations => &mut budgets.update_address_locations,
                BudgetOperation::UpdateServices => &mut budgets.update_services,
                BudgetOperation::ArmWrites => &mut budgets.arm_writes,
            };
            if slot.replace(budget).is_some() {
                return Err(format!("--write-budget names {} more than once", operation.name()));
            }
        }
        Ok(Some(budgets))
    }
}

/// `OPERATION=RATE:BURST` with RATE `N/s` or `N/min`. Only the syntax is checked here: which
/// rates and bursts run is the logic's to say (`InvalidWriteBudget`).
fn parse_write_budget(text: &str) -> Result<(BudgetOperation, Budget), String> {
    let syntax = || format!("{text:?} is not OPERATION=RATE:BURST such as update-address-locations=10/s:20");
    let (operation, budget) = text.split_once('=').ok_or_else(syntax)?;
    let operations =
        [BudgetOperation::UpdateAddressLocations, BudgetOperation::UpdateServices, BudgetOperation::ArmWrites];
    let Some(operation) = operations.into_iter().find(|o| o.name() == operation.trim()) else {
        return Err(format!(
            "{operation:?} is not an operation with a write budget: update-address-locations, update-services or \
             arm-writes"
        ));
    };
    let (rate, burst) = budget.split_once(':').ok_or_else(syntax)?;
    let (count, unit) = rate.trim().split_once('/').ok_or_else(syntax)?;
    let count: u32 = count.trim().parse().map_err(|_| syntax())?;
    let per_minute = match unit.trim() {
        "s" => count.checked_mul(60).ok_or_else(|| format!("{text:?}: the rate is too large"))?,
        "min" => count,
        _ => return Err(format!("{text:?}: the rate's unit must be /s or /min")),
    };
    let burst: u32 = burst.trim().parse().map_err(|_| syntax())?;
    Ok((operation, Budget { per_minute, burst }))
}

/// Which logic to run and under which limits.
#[derive(Args)]
struct LogicArgs {
    /// A component to run instead of the built-in logic (gzip or zstd compressed or not).
    #[arg(long, value_name = "FILE")]
    component: Option<PathBuf>,
    /// Fuel (roughly, wasm instructions) one guest call may use; at least 1.
    #[arg(long, default_value_t = Limits::default().fuel, value_parser = clap::value_parser!(u64).range(1..))]
    fuel: u64,
    /// Wall-clock milliseconds one guest call may take: 1 to 3,600,000 (an hour).
    #[arg(long, default_value_t = Limits::default().deadline.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    deadline_ms: u64,
    /// Linear memory the guest may hold, in MiB: 1 to 4,096 (a 32-bit guest addresses 4 GiB).
    #[arg(long, default_value_t = Limits::default().memory_bytes >> 20, value_parser = parse_memory_mib)]
    memory_mib: usize,
}

impl LogicArgs {
    fn limits(&self) -> Limits {
        Limits {
            fuel: self.fuel,
            deadline: Duration::from_millis(self.deadline_ms),
            memory_bytes: self.memory_mib << 20,
        }
    }

    fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        match &self.component {
            Some(path) => read_component(path),
            None => Ok(BUILTIN_GUEST.to_vec()),
        }
    }
}

/// How `component --compress` writes the built-in component.
#[derive(Clone, Copy, clap::ValueEnum)]
enum CompressArg {
    Gzip,
}

/// A component file's bytes and, when it is compressed, its compression and size (a file the
/// command line reads is taken compressed or not: `crate::compression`).
fn read_component_file(path: &std::path::Path) -> anyhow::Result<compression::Decompressed> {
    let bytes = crate::bounded::read(path, compression::MAX_COMPONENT_BYTES as u64)?;
    let _file = tracing::info_span!("component", path = %path.display()).entered();
    compression::decompress(bytes).with_context(|| format!("{}: not a component", path.display()))
}

/// A component file's bytes, decompressed when it is compressed.
fn read_component(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    Ok(read_component_file(path)?.bytes)
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
        Command::Inspect { file } => inspect(&file, out),
        Command::Validate { config, services, logic } => validate(&config, &services, &logic, out, err),
        Command::Simulate { files, json, record, logic, budgets } => {
            simulate(&files, json, record.as_deref(), &logic, &budgets, out, err)
        }
        Command::Replay(args) => replay(&args, out, err),
        Command::Schema { component } => schema(component.as_deref(), out),
        Command::Component { out: path, compress } => write_component(&path, compress, out),
        Command::Emulator(args) => emulator(args, out),
        Command::Run(args) => run_reconciler(*args, out, err),
        Command::Swap(args) => swap(args, out, err),
    };
    result.unwrap_or_else(|e| {
        let _ = writeln!(err, "error: {e:#}");
        EXIT_BAD_INPUT
    })
}

/// `component --out FILE [--compress FORMAT]`: the sha256 printed is the component's, which a pin
/// names whether it travels compressed or not.
fn write_component(path: &std::path::Path, compress: Option<CompressArg>, out: &mut dyn Write) -> anyhow::Result<u8> {
    let sha256 = crate::sandbox::sha256_hex(BUILTIN_GUEST);
    let written = match compress {
        None => std::borrow::Cow::Borrowed(BUILTIN_GUEST),
        Some(CompressArg::Gzip) => std::borrow::Cow::Owned(compression::compress_gzip(BUILTIN_GUEST)),
    };
    std::fs::write(path, &written).with_context(|| format!("{}: cannot write", path.display()))?;
    match compress {
        None => writeln!(out, "{}: {} bytes, sha256 {sha256}", path.display(), written.len())?,
        Some(CompressArg::Gzip) => writeln!(
            out,
            "{}: {} bytes (gzip of {} bytes), sha256 {sha256} (of the decompressed component)",
            path.display(),
            written.len(),
            BUILTIN_GUEST.len()
        )?,
    }
    Ok(EXIT_OK)
}

/// The mode as the WIT spells it.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::ContainerLoadBalancer => "container-load-balancer",
        Mode::MultiSlbLocalServices => "multi-slb-local-services",
        Mode::Inactive => "inactive",
    }
}

fn inspect(file: &std::path::Path, out: &mut dyn Write) -> anyhow::Result<u8> {
    let read = read_component_file(file)?;
    let bytes = read.bytes;
    let runtime = Runtime::new()?;
    let component = runtime.compile(&bytes).with_context(|| file.display().to_string())?;
    let info = ComponentInfo::of(runtime.engine(), &component, &bytes);
    writeln!(out, "file:     {}", file.display())?;
    writeln!(out, "sha256:   {}", info.sha256)?;
    writeln!(out, "size:     {} bytes", info.size)?;
    if let Some((format, size)) = read.compressed {
        writeln!(out, "compressed: {format}, {size} bytes (sha256 and size are the decompressed component's)")?;
    }
    match info.package_version() {
        Some(version) => writeln!(out, "package:  {PACKAGE}@{version}")?,
        None => writeln!(out, "package:  none (exports no {PACKAGE} interface)")?,
    }
    writeln!(out, "exports:")?;
    for export in &info.exports {
        writeln!(out, "  {export}")?;
    }
    if info.imports.is_empty() {
        writeln!(out, "imports:  none")?;
    } else {
        writeln!(out, "imports:")?;
        for (name, granted) in &info.imports {
            writeln!(out, "  {name}  {}", if *granted { "granted" } else { "NOT GRANTED" })?;
        }
    }
    match info.check() {
        Ok(()) => {
            writeln!(out, "verdict:  this host loads it")?;
            Ok(EXIT_OK)
        }
        Err(refusal) => {
            writeln!(out, "verdict:  refused: {refusal}")?;
            Ok(EXIT_REFUSED)
        }
    }
}

fn validate(
    config_path: &std::path::Path,
    service_paths: &[PathBuf],
    logic: &LogicArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let config = match inputs::read_config(config_path) {
        Ok(config) => config,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut services = Vec::new();
    for path in service_paths {
        match inputs::read_manifests::<Service>(path) {
            Ok(found) => services.extend(found.into_iter().map(|svc| (path, svc))),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    // No two Kubernetes objects share a UID: such input is no cluster's.
    let mut uids = std::collections::BTreeMap::new();
    for (path, service) in &services {
        let Some(uid) = service.metadata.uid.as_deref().filter(|uid| !uid.is_empty()) else { continue };
        let key = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or("")
        );
        if let Some((first_path, first)) = uids.insert(uid.to_ascii_lowercase(), (path, key.clone()))
            && first != key
        {
            writeln!(
                err,
                "error: {}: Service {key} has UID {uid}, which Service {first} in {} has too; no two objects share a UID",
                path.display(),
                first_path.display()
            )?;
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let runtime = Runtime::new()?;
    let logic = runtime.load(&logic.bytes()?, logic.limits())?;
    let mut session = logic.session()?;
    let mut all_admitted = true;
    match session.validate_config(&config)? {
        Ok(mode) => writeln!(out, "{}: configuration accepted: {} mode", config_path.display(), mode_name(mode))?,
        Err(refusal) => {
            all_admitted = false;
            writeln!(
                out,
                "{}: configuration refused: {} ({}): {}",
                config_path.display(),
                refusal.reason,
                refusal.field,
                refusal.message
            )?;
        }
    }
    for (path, service) in &services {
        let record = records::service(service);
        let verdict = session.admit_service(&config, &record)?;
        let what = match &verdict {
            Verdict::Admitted => "admitted".to_owned(),
            Verdict::NothingToProvision => "admitted, nothing to provision (no ports)".to_owned(),
            Verdict::Cleanup => "being deleted: cleanup proceeds".to_owned(),
            Verdict::Ignored(why) => format!("ignored: {why}"),
            Verdict::Rejected(r) => {
                all_admitted = false;
                format!("rejected: {}: {}", r.reason, r.message)
            }
        };
        writeln!(out, "{}: service {}/{}: {what}", path.display(), record.namespace, record.name)?;
    }
    Ok(if all_admitted { EXIT_OK } else { EXIT_REFUSED })
}

fn simulate(
    files: &[PathBuf],
    json: bool,
    record: Option<&std::path::Path>,
    logic: &LogicArgs,
    budgets: &BudgetArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    use crate::simulator::simulate::Reconciler as _;
    use crate::simulator::{scenario, simulate};
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
        Some(path) => match crate::trace::trace_paths(path, files) {
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
            match crate::trace::record_scenario(&logic, &component, path, &scenario.name) {
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

fn replay(args: &ReplayArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use crate::trace::replay;
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

fn schema(component: Option<&std::path::Path>, out: &mut dyn Write) -> anyhow::Result<u8> {
    let bytes = match component {
        Some(path) => read_component(path)?,
        None => BUILTIN_GUEST.to_vec(),
    };
    let runtime = Runtime::new()?;
    let logic = runtime.load(&bytes, Limits::default())?;
    writeln!(out, "{}", crate::trace::schema_text(&logic))?;
    Ok(EXIT_OK)
}

fn emulator(args: EmulatorArgs, out: &mut dyn Write) -> anyhow::Result<u8> {
    use crate::emulator::{ArmLimits, BucketLimits, Emulator, EmulatorConfig, EmulatorServer};
    let scope = crate::azure::Scope {
        vnet_resource_group: args.vnet_resource_group.unwrap_or_else(|| args.resource_group.clone()),
        subscription: args.subscription,
        resource_group: args.resource_group,
        location: args.location,
        vnet: args.vnet,
        service_gateway: args.service_gateway,
    };
    let config = EmulatorConfig {
        page_size: args.page_size.max(1),
        echo_ipv6_upper: args.echo_ipv6_upper,
        arm_limits: (!args.no_arm_limits).then_some(ArmLimits {
            writes: BucketLimits { burst: args.arm_write_burst, per_second: args.arm_write_refill_per_second },
            reads: BucketLimits { burst: args.arm_read_burst, per_second: args.arm_read_refill_per_second },
            other_client_writes_per_second: args.arm_other_client_writes_per_second,
            report_remaining: true,
        }),
        ..Default::default()
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        let emulator = std::sync::Arc::new(Emulator::with_config(scope, config));
        let server = EmulatorServer::start(emulator, args.listen).await?;
        writeln!(out, "listening on {}", server.url())?;
        out.flush()?;
        std::future::pending::<()>().await;
        Ok(EXIT_OK)
    })
}

fn run_reconciler(args: RunArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use crate::azure::auth::{TokenFile, WorkloadIdentity};
    use crate::azure::{ArmClient, ArmConfig, Credential};
    let config = match inputs::read_cloud_config(&args.cloud_config)
        .and_then(|config| Ok((config, inputs::read_scope(&args.cloud_config, &args.service_gateway)?)))
    {
        Ok(read) => read,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let (cloud_config, scope) = config;
    let (slb_configurations, pool_updater) = (cloud_config.slb_configurations(), cloud_config.pool_updater_config());
    let cluster_name = cloud_config.cluster_name(&args.cluster_name);
    let mut config: crate::sandbox::bindings::clb::reconciler::types::Config = cloud_config.into();
    match args.budgets.write_budgets() {
        Ok(budgets) => config.write_budgets = budgets,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let election = args.election;
    let instance = crate::live::lease::replica_identity(election.leader_elect_identity.as_deref(), |name| {
        std::env::var(name).ok()
    });
    let leader_election = election.leader_elect.then(|| crate::live::lease::ElectionConfig {
        name: election.leader_elect_resource_name,
        namespace: election.leader_elect_resource_namespace,
        identity: instance.clone(),
        lease_duration: election.leader_elect_lease_duration,
        renew_deadline: election.leader_elect_renew_deadline,
        retry_period: election.leader_elect_retry_period,
    });
    let lock = args.resource_lock;
    let resource_lock = crate::live::lease::LeaseLockConfig {
        name: lock.azure_resource_lock_name,
        namespace: lock.azure_resource_lock_namespace,
        holder: lock.azure_resource_lock_holder,
        duration: lock.azure_resource_lock_duration,
        renew_period: lock.azure_resource_lock_renew_period,
    };
    let election_valid = leader_election.as_ref().map_or(Ok(()), crate::live::lease::ElectionConfig::validate);
    if let Err(e) = election_valid.and_then(|()| resource_lock.validate()) {
        writeln!(err, "error: {e}")?;
        return Ok(EXIT_BAD_INPUT);
    }
    let credential = match (args.credential, args.token_file) {
        (CredentialKind::None, _) => Credential::None,
        (CredentialKind::TokenFile, Some(path)) => Credential::TokenFile(TokenFile::new(path)),
        (CredentialKind::TokenFile, None) => anyhow::bail!("--credential token-file needs --token-file"),
        (CredentialKind::WorkloadIdentity, _) => Credential::WorkloadIdentity(
            WorkloadIdentity::from_env(|name| std::env::var(name).ok()).context("workload identity")?,
        ),
    };
    let arm_config = ArmConfig {
        request_timeout: args.arm_request_timeout,
        nrp_request_timeout: args.nrp_request_timeout,
        operation_timeout: args.arm_operation_timeout,
        ..ArmConfig::new(args.azure_url, scope)
    };
    let arm = ArmClient::new(arm_config, credential)?;
    let runtime = Runtime::new()?;
    let logic = runtime.load(&args.logic.bytes()?, args.logic.limits())?;
    // A configuration the logic refuses cannot start a controller: say so before connecting.
    if let Err(refused) = logic.session()?.validate_config(&config)? {
        writeln!(
            err,
            "error: {}: the logic refuses the configuration: {} ({}): {}",
            args.cloud_config.display(),
            refused.reason,
            refused.field,
            refused.message
        )?;
        return Ok(EXIT_BAD_INPUT);
    }
    let trace = match &args.record.record {
        Some(path) => {
            let options = crate::trace::RecordOptions {
                max_file_bytes: args.record.record_max_file_mib << 20,
                keep_files: args.record.record_keep_files,
                ..crate::trace::RecordOptions::live(path.clone())
            };
            let name = args.logic.component.as_ref().map_or_else(|| "builtin".into(), |p| p.display().to_string());
            let component = crate::trace::ComponentRef::of(&logic, Some(&name));
            Some(crate::trace::Recorder::start(options, crate::trace::Signatures::of(&logic), &component)?)
        }
        None => None,
    };
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let ops = args.operations;
    let admin_token = match &ops.admin_token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    };
    let source = match (ops.logic_file, ops.logic_configmap) {
        (Some(path), _) => Some(crate::live::sources::LogicSource::File(path)),
        (None, Some(key)) => Some(crate::live::sources::LogicSource::ConfigMap(key)),
        (None, None) => None,
    };
    let shadow_args = args.shadow;
    let shadow_source = match (shadow_args.shadow_logic_file, shadow_args.shadow_logic_configmap) {
        (Some(path), _) => Some(crate::live::sources::LogicSource::File(path)),
        (None, Some(key)) => Some(crate::live::sources::LogicSource::ConfigMap(key)),
        (None, None) => None,
    };
    let shadow = shadow_source.map(|source| crate::live::operations::ShadowSource {
        source,
        pin: shadow_args.shadow_sha256,
        policy: crate::live::control::ShadowPolicy {
            promote_after: shadow_args.promote_after,
            allow: shadow_args.shadow_allow.into_iter().collect(),
            record: shadow_args.shadow_record,
        },
    });
    let operations = crate::live::operations::OperationsConfig {
        shadow,
        listen: ops.listen,
        admin_token,
        source,
        pin: ops.logic_sha256,
        events: ops.swap_events_configmap,
        limits: args.logic.limits(),
        poll: crate::live::sources::FILE_POLL,
    };
    tokio.block_on(async {
        let interrupted = crate::live::settings::stop_signal().context("installing the SIGTERM/SIGINT handlers")?;
        let kube = crate::live::settings::connect(args.kubeconfig.as_deref()).await?;
        let settings = crate::live::settings::Settings {
            shutdown_grace: std::time::Duration::from_secs(args.shutdown_grace_secs),
            probation_inputs: usize::try_from(ops.probation_inputs).unwrap_or(usize::MAX),
            probation_quarantines: ops.probation_quarantines,
            leader_election,
            resource_lock,
            slb_configurations,
            cluster_name,
            pool_updater,
            ..crate::live::settings::Settings::new(kube, arm, config, instance)
        };
        let settings = crate::live::settings::Settings {
            stats: crate::live::metrics::RunStats { trace, ..settings.stats.clone() },
            ..settings
        };
        let operations = match crate::live::operations::Operations::start(&runtime, &settings, operations).await {
            Ok(operations) => operations,
            Err(e) => {
                writeln!(err, "error: {:#}", anyhow::Error::new(e))?;
                return Ok(EXIT_BAD_INPUT);
            }
        };
        writeln!(out, "listening on http://{}", operations.local_addr())?;
        out.flush()?;
        match operations.run(&logic, settings, interrupted).await {
            Ok(()) => Ok(EXIT_OK),
            Err(e) => {
                writeln!(err, "error: {:#}", anyhow::Error::new(e))?;
                Ok(EXIT_REFUSED)
            }
        }
    })
}

/// A token file's content without surrounding whitespace; an empty token is refused.
fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let token = crate::bounded::read(path, crate::azure::auth::MAX_TOKEN_BYTES)?;
    let token = String::from_utf8(token).with_context(|| format!("{}: the token is not UTF-8", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "{}: the token file is empty", path.display());
    Ok(token.to_owned())
}

fn swap(args: SwapArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use crate::live::swap::SwapResult;
    let bytes = crate::bounded::read(&args.to, compression::MAX_COMPONENT_BYTES as u64)?;
    // A compressed file travels as it is (smaller), and the host decompresses it; one that does
    // not decompress is refused here, as an unreadable file is.
    if compression::Compression::detect(&bytes).is_some() {
        compression::decompress(bytes.clone()).with_context(|| format!("{}: not a component", args.to.display()))?;
    }
    let token = args.token_file.as_deref().map(read_token).transpose()?;
    let url = format!("{}/swap", args.endpoint.trim_end_matches('/'));
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let (status, body) = tokio.block_on(async {
        let mut request = reqwest::Client::new().post(&url).body(bytes);
        if let Some(pin) = &args.sha256 {
            request = request.header(crate::live::endpoint::SHA256_HEADER, pin.as_str());
        }
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("{url}: no answer"))?;
        let status = response.status();
        let body = response.text().await.with_context(|| format!("{url}: reading the answer"))?;
        anyhow::Ok((status, body))
    })?;
    let result: SwapResult = match serde_json::from_str(&body) {
        Ok(result) => result,
        Err(_) => {
            writeln!(err, "error: {url}: {status}: {}", body.trim_end())?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    match result {
        SwapResult::Accepted {
            from,
            to,
            sha256,
            state_from_version,
            state_from_bytes,
            state_to_version,
            state_to_bytes,
            state_move_ms,
            took_ms,
            replayed_inputs,
        } => {
            writeln!(out, "accepted: {from} → {to} (sha256 {sha256})")?;
            let pause = match replayed_inputs {
                Some(n) => format!("beside serving; inputs waited {took_ms:.1} ms ({n} replayed at the switch)"),
                None => format!("the swap took {took_ms:.1} ms"),
            };
            writeln!(
                out,
                "state: v{state_from_version} ({state_from_bytes} bytes) → v{state_to_version} ({state_to_bytes} bytes), moved in {state_move_ms:.1} ms; {pause}"
            )?;
            Ok(EXIT_OK)
        }
        SwapResult::Unchanged { version, .. } => {
            writeln!(out, "unchanged: {version} is already serving")?;
            Ok(EXIT_OK)
        }
        SwapResult::Refused { kind, reason, .. } => {
            writeln!(out, "refused ({kind}): {reason}")?;
            writeln!(out, "the running version keeps serving")?;
            Ok(EXIT_REFUSED)
        }
        other => {
            writeln!(err, "error: {url}: an unexpected answer: {other:?}")?;
            Ok(EXIT_BAD_INPUT)
        }
    }
}
