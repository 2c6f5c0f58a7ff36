//! `clb-host run`: the live controller's flags, read into its settings, then the controller
//! started (`crate::live`).

use super::args::{
    BudgetArgs, EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, LogicArgs, duration, refuses_config, request_timeout,
};
use super::swap::read_token;
use anyhow::Context as _;
use clap::Args;
use clb_executor::inputs;
use clb_sandbox::Runtime;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Where `run` listens by default: every interface, so that probes and scrapes reach it in a
/// pod; `POST /swap` is still taken only from loopback unless an admin token is set.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:10270";

/// What `run` connects to.
#[derive(Args)]
pub(super) struct RunArgs {
    /// The kubeconfig; default: the in-cluster configuration, else `KUBECONFIG` or
    /// `~/.kube/config`.
    #[arg(long)]
    pub(super) kubeconfig: Option<PathBuf>,
    /// The Azure cloud configuration (azure.json): the mode's keys, and `subscriptionId`,
    /// `resourceGroup`, `location`, `vnetName` (and `vnetResourceGroup`) for the resources.
    #[arg(long)]
    pub(super) cloud_config: PathBuf,
    /// ARM's base URL, or the emulator's (`clb-host emulator` prints it).
    #[arg(long, default_value = clb_arm::DEFAULT_BASE_URL)]
    pub(super) azure_url: String,
    /// The longest one request to ARM (public IPs, load balancers, backend pools) may take.
    #[arg(long, default_value = "60s", value_parser = request_timeout)]
    pub(super) arm_request_timeout: Duration,
    /// The longest one request to NRP (the ServiceGateway's services and address locations)
    /// may take; every Service's endpoint changes wait for a hung one that long.
    #[arg(long, default_value = "20s", value_parser = request_timeout)]
    pub(super) nrp_request_timeout: Duration,
    /// The longest the polling of one asynchronous ARM operation may take.
    #[arg(long, default_value = "5m", value_parser = request_timeout)]
    pub(super) arm_operation_timeout: Duration,
    #[command(flatten)]
    pub(super) budgets: BudgetArgs,
    /// The ARM credential: none (the emulator), a bearer token kept in a file, or workload
    /// identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_FEDERATED_TOKEN_FILE`).
    #[arg(long, value_enum, default_value_t = CredentialKind::WorkloadIdentity)]
    pub(super) credential: CredentialKind,
    /// The file holding the bearer token, for `--credential token-file`.
    #[arg(long, required_if_eq("credential", "token-file"))]
    pub(super) token_file: Option<PathBuf>,
    /// The ServiceGateway's name.
    #[arg(long, default_value = clb_azure::DEFAULT_SERVICE_GATEWAY)]
    pub(super) service_gateway: String,
    /// The cluster's name, as the cloud controller manager's `--cluster-name`: in multi-SLB
    /// local-service mode a public IP tagged with another cluster's name places no Service. The
    /// cloud config's `loadBalancerName` overrides it, as upstream's.
    #[arg(long, default_value = clb_executor::inputs::DEFAULT_CLUSTER_NAME)]
    pub(super) cluster_name: String,
    /// On SIGTERM/SIGINT, how long running commands may finish before they are abandoned.
    #[arg(long, default_value_t = crate::live::settings::SHUTDOWN_GRACE.as_secs())]
    pub(super) shutdown_grace_secs: u64,
    #[command(flatten)]
    pub(super) election: ElectionArgs,
    #[command(flatten)]
    pub(super) resource_lock: ResourceLockArgs,
    #[command(flatten)]
    pub(super) logic: LogicArgs,
    #[command(flatten)]
    pub(super) operations: OperationsArgs,
    #[command(flatten)]
    pub(super) shadow: ShadowArgs,
    #[command(flatten)]
    pub(super) record: super::args::RecordArgs,
    #[command(flatten)]
    pub(super) admission: RunAdmissionArgs,
}

/// `run`'s admission webhook (docs/operations.md, "Admission"): the serving version's rules at
/// the door.
#[derive(Args)]
pub(super) struct RunAdmissionArgs {
    /// Serve the admission webhook (`POST /validate`, over TLS) on this address, judged by the
    /// version serving and by a candidate in shadow; off by default.
    #[arg(long, value_name = "ADDR", requires_all = ["tls_cert_file", "tls_key_file"])]
    pub(super) admission_listen: Option<std::net::SocketAddr>,
    /// The webhook's serving certificate (PEM; the chain, leaf first), re-read when it changes.
    #[arg(long, value_name = "CERT", requires = "admission_listen")]
    pub(super) tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM), re-read when it changes.
    #[arg(long, value_name = "KEY", requires = "admission_listen")]
    pub(super) tls_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub(super) judging: super::admission::JudgingArgs,
}

/// The webhook `run` serves: on a runtime of its own, so that a long call of the loop's (a
/// start-up's lists) never holds a request past its timeout.
struct Webhook {
    _threads: tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    door: std::sync::Arc<crate::admission::Door>,
    metrics: crate::admission::Metrics,
}

impl Webhook {
    /// Reads the pair and binds the address: `Err` is the line to print (exit 2).
    fn start(
        args: &RunAdmissionArgs,
        logic: &clb_sandbox::LoadedLogic,
        config: &clb_sandbox::bindings::clb::reconciler::types::Config,
    ) -> anyhow::Result<Result<Option<Self>, String>> {
        let (Some(listen), Some(cert), Some(key)) = (args.admission_listen, &args.tls_cert_file, &args.tls_key_file)
        else {
            return Ok(Ok(None));
        };
        let certified = match crate::admission::tls::ReloadingCert::new(cert.clone(), key.clone()) {
            Ok(certified) => certified,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let threads = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("clb-admission")
            .enable_all()
            .build()
            .context("starting the admission webhook's runtime")?;
        let listener = match threads.block_on(tokio::net::TcpListener::bind(listen)) {
            Ok(listener) => listener,
            Err(e) => return Ok(Err(format!("cannot listen on {listen} for the admission webhook: {e}"))),
        };
        let addr = listener.local_addr()?;
        let door = std::sync::Arc::new(crate::admission::Door::new(logic.clone()));
        let metrics = crate::admission::Metrics::new();
        let settings = args.judging.settings(door.clone(), config.clone());
        let served = metrics.clone();
        threads.spawn(async move {
            match crate::admission::serve(listener, certified.server_config(), settings, Some(served)).await {}
        });
        Ok(Ok(Some(Self { _threads: threads, addr, door, metrics })))
    }
}

/// `run`'s candidate in shadow (docs/operations.md, "Canary a version by shadow").
#[derive(Args)]
#[command(group(clap::ArgGroup::new("shadow_source").args(["shadow_logic_file", "shadow_logic_configmap", "shadow_logic_oci"])))]
pub(super) struct ShadowArgs {
    /// Run this component file in shadow beside the serving version: it is given every input and
    /// its answers are compared, but nothing it asks for is carried out. Watched like
    /// --logic-file: a new content replaces the candidate.
    #[arg(long, value_name = "PATH")]
    pub(super) shadow_logic_file: Option<PathBuf>,
    /// Run the component in this ConfigMap key in shadow (as --logic-configmap reads it).
    #[arg(long, value_name = "NAMESPACE/NAME:KEY")]
    pub(super) shadow_logic_configmap: Option<crate::live::sources::ConfigMapKey>,
    /// Run the component at this OCI reference in shadow (as --logic-oci pulls it, with the
    /// same registry flags and --logic-poll).
    #[arg(long, value_name = "REF", value_parser = super::args::oci_reference)]
    pub(super) shadow_logic_oci: Option<clb_oci::Reference>,
    /// Refuse any candidate whose sha256 (decompressed) is not this one.
    #[arg(long, value_name = "HEX", requires = "shadow_source")]
    pub(super) shadow_sha256: Option<crate::live::swap::Sha256Pin>,
    /// Swap the candidate in (a staged swap, then its probation) once it has compared this many
    /// inputs in a row without a divergence; without it, promote by hand with `clb-host swap`.
    #[arg(long, value_name = "N", requires = "shadow_source", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) promote_after: Option<u64>,
    /// Divergence kinds that do not hold a promotion back, comma-separated: a command's name
    /// (emit-event, put-load-balancer, …), command-order, wake-at or idle. They are still
    /// counted.
    #[arg(long, value_name = "KIND,...", value_delimiter = ',', requires = "shadow_source", value_parser = shadow_kind)]
    pub(super) shadow_allow: Vec<String>,
    /// Write each divergence as a trace into this folder (`clb-host replay` reproduces it).
    #[arg(long, value_name = "DIR", requires = "shadow_source")]
    pub(super) shadow_record: Option<PathBuf>,
}

pub(super) fn shadow_kind(text: &str) -> Result<String, String> {
    let text = text.trim();
    if crate::live::control::shadow_kinds().any(|kind| kind == text) {
        Ok(text.to_owned())
    } else {
        let known: Vec<&str> = crate::live::control::shadow_kinds().collect();
        Err(format!("`{text}` is not a divergence kind; one of: {}", known.join(", ")))
    }
}

/// The endpoint and the sources of new logic versions of `run`.
#[derive(Args)]
pub(super) struct OperationsArgs {
    /// Where to serve / (the operator page), /metrics, /healthz, /readyz, /status and POST /swap; port 0 picks a free one.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub(super) listen: std::net::SocketAddr,
    /// A file holding a token: POST /swap is then taken from any peer that presents it as
    /// `Authorization: Bearer TOKEN` (and only then); without it, only from loopback.
    #[arg(long, value_name = "FILE")]
    pub(super) admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub(super) source: super::args::LogicSourceArgs,
    /// The ConfigMap swap Events regard; default: the --logic-configmap one, else
    /// kube-system/clb-reconciler.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub(super) swap_events_configmap: Option<crate::live::control::EventTarget>,
    /// How many inputs a swapped-in version serves on probation: until then, the version it
    /// replaced is kept, and --probation-quarantines inputs it traps on (whatever it served
    /// between them), or two ticks, roll it back (docs/operations.md, "Probation").
    #[arg(long, default_value_t = clb_sandbox::supervisor::PROBATION_INPUTS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(super) probation_inputs: u64,
    /// How many inputs a swapped-in version may quarantine within its probation: the last of
    /// them rolls it back.
    #[arg(long, default_value_t = clb_sandbox::supervisor::PROBATION_QUARANTINES,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub(super) probation_quarantines: u32,
}

/// Leader election among replicas (client-go's flags and defaults).
#[derive(Args)]
pub(super) struct ElectionArgs {
    /// Elect a leader; only the leader watches and writes. `false`: run exactly one replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(super) leader_elect: bool,
    /// How long a standby waits, after it last saw the leader Lease change, before taking it.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub(super) leader_elect_lease_duration: Duration,
    /// How long the leader keeps writing after its last successful renewal; shorter than the
    /// lease duration.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(super) leader_elect_renew_deadline: Duration,
    /// Time between a standby's attempts and between the leader's renewals.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub(super) leader_elect_retry_period: Duration,
    #[arg(long, default_value = clb_kube::lease::LEADER_ELECTION_NAME)]
    pub(super) leader_elect_resource_name: String,
    #[arg(long, default_value = clb_kube::lease::LEADER_ELECTION_NAMESPACE)]
    pub(super) leader_elect_resource_namespace: String,
    /// This replica's holder identity; default: `POD_NAME` (else `HOSTNAME`) and a random
    /// suffix. Also the `reportingInstance` of its Events.
    #[arg(long)]
    pub(super) leader_elect_identity: Option<String>,
}

/// The Azure resource lock of upstream's `AzureResourceLocker` (its Lease, holder and duration).
#[derive(Args)]
pub(super) struct ResourceLockArgs {
    #[arg(long, default_value = clb_kube::lease::RESOURCE_LOCK_NAME)]
    pub(super) azure_resource_lock_name: String,
    #[arg(long, default_value = clb_kube::lease::RESOURCE_LOCK_NAMESPACE)]
    pub(super) azure_resource_lock_namespace: String,
    /// Shared by every replica on purpose: the lock excludes other components (the AKS RP).
    #[arg(long, default_value = clb_kube::lease::RESOURCE_LOCK_HOLDER)]
    pub(super) azure_resource_lock_holder: String,
    #[arg(long, default_value = "900s", value_parser = duration)]
    pub(super) azure_resource_lock_duration: Duration,
    /// Time between renewals while the lock is held.
    #[arg(long, default_value = "300s", value_parser = duration)]
    pub(super) azure_resource_lock_renew_period: Duration,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum CredentialKind {
    None,
    TokenFile,
    WorkloadIdentity,
}

pub(super) fn run_reconciler(args: RunArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use clb_arm::auth::{TokenFile, WorkloadIdentity};
    use clb_arm::{ArmClient, ArmConfig, Credential};
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
    let mut config: clb_sandbox::bindings::clb::reconciler::types::Config = cloud_config.into();
    match args.budgets.write_budgets() {
        Ok(budgets) => config.write_budgets = budgets,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let election = args.election;
    let instance =
        clb_kube::lease::replica_identity(election.leader_elect_identity.as_deref(), |name| std::env::var(name).ok());
    let leader_election = election.leader_elect.then(|| clb_kube::lease::ElectionConfig {
        name: election.leader_elect_resource_name,
        namespace: election.leader_elect_resource_namespace,
        identity: instance.clone(),
        lease_duration: election.leader_elect_lease_duration,
        renew_deadline: election.leader_elect_renew_deadline,
        retry_period: election.leader_elect_retry_period,
    });
    let lock = args.resource_lock;
    let resource_lock = clb_kube::lease::LeaseLockConfig {
        name: lock.azure_resource_lock_name,
        namespace: lock.azure_resource_lock_namespace,
        holder: lock.azure_resource_lock_holder,
        duration: lock.azure_resource_lock_duration,
        renew_period: lock.azure_resource_lock_renew_period,
    };
    let election_valid = leader_election.as_ref().map_or(Ok(()), clb_kube::lease::ElectionConfig::validate);
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
    if refuses_config(&logic, &config, &args.cloud_config, err)? {
        return Ok(EXIT_BAD_INPUT);
    }
    let webhook = match Webhook::start(&args.admission, &logic, &config)? {
        Ok(webhook) => webhook,
        Err(line) => {
            writeln!(err, "error: {line}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let trace = args.record.start(&logic, &args.logic, "run")?;
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let ops = args.operations;
    let admin_token = match &ops.admin_token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    };
    let source = ops.source.source()?;
    let shadow_args = args.shadow;
    let shadow_source =
        match (shadow_args.shadow_logic_file, shadow_args.shadow_logic_configmap, shadow_args.shadow_logic_oci) {
            (Some(path), _, _) => Some(crate::live::sources::LogicSource::File(path)),
            (None, Some(key), _) => Some(crate::live::sources::LogicSource::ConfigMap(key)),
            (None, None, Some(reference)) => Some(ops.source.oci(&reference)?),
            (None, None, None) => None,
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
        pin: ops.source.logic_sha256.clone(),
        verify_key: ops.source.verify_key()?,
        events: ops.swap_events_configmap,
        limits: args.logic.limits(),
        poll: crate::live::sources::FILE_POLL,
        admission: webhook.as_ref().map(|webhook| (webhook.metrics.clone(), webhook.door.clone())),
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
            door: webhook.as_ref().map(|webhook| webhook.door.clone()),
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
        if let Some(webhook) = &webhook {
            writeln!(out, "admission webhook on https://{}/validate", webhook.addr)?;
        }
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
