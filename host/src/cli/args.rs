//! What several subcommands share: which logic runs and under which limits, the write budgets,
//! the parsers of durations and sizes, and how a component file is read.

use anyhow::Context as _;
use clap::Args;
use clb_sandbox::Limits;
use clb_sandbox::bindings::clb::reconciler::types::{Budget, WriteBudgets};
use clb_sandbox::{BUILTIN_GUEST, compression};
use std::path::PathBuf;
use std::time::Duration;

/// Exit codes shared by the subcommands.
pub const EXIT_OK: u8 = 0;
pub const EXIT_REFUSED: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

pub(super) fn parse_memory_mib(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(mib @ 1..=4096) => Ok(mib),
        _ => Err(format!("{text:?}: give 1 to 4096 MiB (a 32-bit guest addresses at most 4 GiB)")),
    }
}

/// `15s`, `500ms`, `2m`, or plain seconds.
/// A request or operation timeout: from 100 ms to an hour.
pub(super) fn request_timeout(text: &str) -> Result<Duration, String> {
    let timeout = duration(text)?;
    if (Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&timeout) {
        Ok(timeout)
    } else {
        Err(format!("{text:?}: a timeout is from 100ms to 1h"))
    }
}

pub(super) fn duration(text: &str) -> Result<Duration, String> {
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

/// How fast the logic may write to Azure (docs/operations.md, "Write budgets"); the defaults
/// and the limits are the logic's own.
#[derive(Args)]
pub(super) struct BudgetArgs {
    /// The write budget of OPERATION (update-address-locations, update-services or
    /// arm-writes): RATE as N/s or N/min, then the burst, e.g.
    /// `update-address-locations=10/s:20`. Repeat for each operation; one not named keeps the
    /// logic's default (300/min with a burst of 10, 20 and 100).
    #[arg(long = "write-budget", value_name = "OPERATION=RATE:BURST", value_parser = parse_write_budget)]
    pub(super) write_budget: Vec<(BudgetOperation, Budget)>,
    /// The writes left to other clients of the subscription while ARM reports its remaining
    /// writes on each answer: the logic spends down to this many, then at ARM's refill rate
    /// (default 40, a fifth of ARM's documented bucket of 200).
    #[arg(long = "arm-write-reserve", value_name = "N")]
    pub(super) arm_write_reserve: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BudgetOperation {
    UpdateAddressLocations,
    UpdateServices,
    ArmWrites,
}

/// The `field` of the logic's `config-error` for a refused write budget.
pub(super) const WRITE_BUDGETS_FIELD: &str = "writeBudgets";

impl BudgetOperation {
    pub(super) fn name(self) -> &'static str {
        match self {
            BudgetOperation::UpdateAddressLocations => "update-address-locations",
            BudgetOperation::UpdateServices => "update-services",
            BudgetOperation::ArmWrites => "arm-writes",
        }
    }
}

impl BudgetArgs {
    /// The budgets to put in the config: `None` when no flag names one (the logic's defaults).
    pub(super) fn write_budgets(&self) -> Result<Option<WriteBudgets>, String> {
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
pub(super) fn parse_write_budget(text: &str) -> Result<(BudgetOperation, Budget), String> {
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

/// `--record` of `run` and `admission`: a trace of every call into the logic (docs/traces.md,
/// docs/operations.md).
#[derive(Args)]
pub(super) struct RecordArgs {
    /// Record a trace to this file (off by default). Written in the background: a slow or full
    /// disk costs trace lines (dropped and counted), never an answer.
    #[arg(long, value_name = "FILE")]
    pub(super) record: Option<PathBuf>,
    /// Start a new file once the current one holds this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256, requires = "record", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub(super) record_max_file_mib: u64,
    /// Older files kept (FILE.1 the newest); 0 keeps only the current one.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "record", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub(super) record_keep_files: u32,
}

impl RecordArgs {
    /// The live recorder `--record` asks for, if it does: its header says `source` recorded
    /// `logic`, named as `--component` named it (`builtin` without one).
    pub(super) fn start(
        &self,
        logic: &clb_sandbox::LoadedLogic,
        args: &LogicArgs,
        source: &str,
    ) -> anyhow::Result<Option<std::sync::Arc<clb_sandbox::trace::Recorder>>> {
        use clb_sandbox::trace::{ComponentRef, RecordOptions, Recorder, Signatures};
        let Some(path) = &self.record else { return Ok(None) };
        let options = RecordOptions {
            max_file_bytes: self.record_max_file_mib << 20,
            keep_files: self.record_keep_files,
            source: source.to_owned(),
            ..RecordOptions::live(path.clone())
        };
        let name = args.component.as_ref().map_or_else(|| "builtin".into(), |p| p.display().to_string());
        let component = ComponentRef::of(logic, Some(&name));
        Ok(Some(Recorder::start(options, Signatures::of(logic), &component)?))
    }
}

/// A watched source of new versions (`run`'s, `admission`'s): swapped to at start and whenever
/// its content changes (docs/operations.md, "Swapping the logic").
#[derive(Args)]
#[command(group(clap::ArgGroup::new("logic_source").args(["logic_file", "logic_configmap", "logic_oci"])))]
pub(super) struct LogicSourceArgs {
    /// Watch this component file and swap to it at start and whenever its content changes.
    #[arg(long, value_name = "PATH")]
    pub(super) logic_file: Option<PathBuf>,
    /// Watch this ConfigMap key (binaryData, or base64 in data) and swap to it at start and
    /// whenever it changes.
    #[arg(long, value_name = "NAMESPACE/NAME:KEY")]
    pub(super) logic_configmap: Option<crate::live::sources::ConfigMapKey>,
    /// Pull the component at this OCI reference (`REGISTRY/REPOSITORY:TAG`, or `@sha256:…`) and
    /// swap to it at start and whenever the digest the tag names changes (resolved every
    /// --logic-poll seconds).
    #[arg(long, value_name = "REF", value_parser = oci_reference)]
    pub(super) logic_oci: Option<clb_oci::Reference>,
    /// Seconds between two resolutions of an OCI reference (--logic-oci, --shadow-logic-oci).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) logic_poll: u64,
    #[command(flatten)]
    pub(super) registry: RegistryArgs,
    /// Take only versions signed by this public key (`cosign.pub`, or a PKIX P-256 key), from
    /// every source and `POST /swap`: from a registry, a cosign signature of the artifact's digest
    /// (checked before it is pulled); from a file, its detached signature `PATH.sig` (`cosign
    /// sign-blob`); from a ConfigMap, the key `KEY.sig` beside it; through `POST /swap`, the
    /// x-clb-signature header. An unsigned version, or one signed by another key, is refused.
    #[arg(long, value_name = "KEY")]
    pub(super) logic_verify_key: Option<PathBuf>,
    /// Refuse, before loading, any version from the source whose sha256 is not this one (the
    /// sha256 of the decompressed component, when the source holds it compressed).
    #[arg(long, value_name = "HEX", requires = "logic_source")]
    pub(super) logic_sha256: Option<crate::live::swap::Sha256Pin>,
}

impl LogicSourceArgs {
    pub(super) fn source(&self) -> anyhow::Result<Option<crate::live::sources::LogicSource>> {
        use crate::live::sources::LogicSource;
        Ok(match (&self.logic_file, &self.logic_configmap, &self.logic_oci) {
            (Some(path), _, _) => Some(LogicSource::File(path.clone())),
            (None, Some(key), _) => Some(LogicSource::ConfigMap(key.clone())),
            (None, None, Some(reference)) => Some(self.oci(reference)?),
            (None, None, None) => None,
        })
    }

    /// `reference` as a source, through a registry client of these flags.
    pub(super) fn oci(&self, reference: &clb_oci::Reference) -> anyhow::Result<crate::live::sources::LogicSource> {
        Ok(crate::live::sources::LogicSource::Oci(crate::live::sources::OciSource {
            reference: reference.clone(),
            client: std::sync::Arc::new(self.registry.client()?),
            poll: Duration::from_secs(self.logic_poll),
        }))
    }

    /// The key every version must be signed by (`--logic-verify-key`), read.
    pub(super) fn verify_key(&self) -> anyhow::Result<Option<clb_oci::signature::PublicKey>> {
        self.logic_verify_key.as_deref().map(read_public_key).transpose()
    }
}

pub(super) fn oci_reference(text: &str) -> Result<clb_oci::Reference, String> {
    clb_oci::Reference::parse(text).map_err(|e| e.to_string())
}

/// Which logic to run and under which limits.
#[derive(Args)]
pub(super) struct LogicArgs {
    /// A component to run instead of the built-in logic (gzip or zstd compressed or not).
    #[arg(long, value_name = "FILE")]
    pub(super) component: Option<PathBuf>,
    /// Fuel (roughly, wasm instructions) one guest call may use; at least 1.
    #[arg(long, default_value_t = Limits::default().fuel, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) fuel: u64,
    /// Wall-clock milliseconds one guest call may take: 1 to 3,600,000 (an hour).
    #[arg(long, default_value_t = Limits::default().deadline.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(super) deadline_ms: u64,
    /// Linear memory the guest may hold, in MiB: 1 to 4,096 (a 32-bit guest addresses 4 GiB).
    #[arg(long, default_value_t = Limits::default().memory_bytes >> 20, value_parser = parse_memory_mib)]
    pub(super) memory_mib: usize,
}

/// Whether the logic refuses `config` (read from `path`), saying why on `err` when it does: a
/// controller or a webhook cannot start on a configuration its logic refuses.
pub(super) fn refuses_config(
    logic: &clb_sandbox::LoadedLogic,
    config: &clb_sandbox::bindings::clb::reconciler::types::Config,
    path: &std::path::Path,
    err: &mut dyn std::io::Write,
) -> anyhow::Result<bool> {
    let Some(refused) = config_refusal(logic, config)? else { return Ok(false) };
    writeln!(err, "error: {}: {refused}", path.display())?;
    Ok(true)
}

/// Why `logic` refuses `config` (`validate-config`), in one line; `None` when it takes it.
pub(super) fn config_refusal(
    logic: &clb_sandbox::LoadedLogic,
    config: &clb_sandbox::bindings::clb::reconciler::types::Config,
) -> Result<Option<String>, clb_sandbox::GuestError> {
    let Err(refused) = logic.session()?.validate_config(config)? else { return Ok(None) };
    Ok(Some(format!(
        "the logic refuses the configuration: {} ({}): {}",
        refused.reason, refused.field, refused.message
    )))
}

impl LogicArgs {
    pub(super) fn limits(&self) -> Limits {
        Limits {
            fuel: self.fuel,
            deadline: Duration::from_millis(self.deadline_ms),
            memory_bytes: self.memory_mib << 20,
        }
    }

    pub(super) fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        match &self.component {
            Some(path) => read_component(path),
            None => Ok(BUILTIN_GUEST.to_vec()),
        }
    }
}

/// A component file's bytes and, when it is compressed, its compression and size (a file the
/// command line reads is taken compressed or not: `clb_sandbox::compression`).
pub(super) fn read_component_file(path: &std::path::Path) -> anyhow::Result<compression::Decompressed> {
    let bytes = clb_sandbox::bounded::read(path, compression::MAX_COMPONENT_BYTES as u64)?;
    let _file = tracing::info_span!("component", path = %path.display()).entered();
    compression::decompress(bytes).with_context(|| format!("{}: not a component", path.display()))
}

/// A component file's bytes, decompressed when it is compressed.
pub(super) fn read_component(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    Ok(read_component_file(path)?.bytes)
}

/// How the controller reaches OCI registries (`component --push`, `inspect oci://`).
#[derive(Args, Clone, Default)]
pub(super) struct RegistryArgs {
    /// A docker config file holding the registry's login (`.dockerconfigjson`, as an image pull
    /// Secret mounted as a file gives it); without it, registries are asked anonymously.
    #[arg(long, value_name = "FILE")]
    pub(super) registry_config: Option<PathBuf>,
    /// Speak plain HTTP to this registry (`HOST[:PORT]`; repeat for several). Loopback
    /// registries (`localhost`, 127.0.0.0/8, `::1`) always are, as docker treats them.
    #[arg(long, value_name = "HOST")]
    pub(super) registry_insecure: Vec<String>,
}

impl RegistryArgs {
    pub(super) fn client(&self) -> anyhow::Result<clb_oci::Client> {
        let credentials = match &self.registry_config {
            Some(path) => clb_oci::Credentials::from_file(path)?,
            None => clb_oci::Credentials::anonymous(),
        };
        let options = clb_oci::ClientOptions {
            credentials,
            insecure: self.registry_insecure.iter().cloned().collect(),
            ..Default::default()
        };
        Ok(clb_oci::Client::new(options)?)
    }
}

/// The most a key file may be: a PEM key is a few hundred bytes.
const MAX_KEY_BYTES: u64 = 64 << 10;

/// A cosign public key (`cosign.pub`, or a PKIX P-256 key as `openssl pkey -pubout` writes it).
pub(super) fn read_public_key(path: &std::path::Path) -> anyhow::Result<clb_oci::signature::PublicKey> {
    let text = clb_sandbox::bounded::read(path, MAX_KEY_BYTES)?;
    Ok(clb_oci::signature::PublicKey::from_pem(&path.display().to_string(), &text)?)
}

/// A signing key: cosign's encrypted one (opened with `COSIGN_PASSWORD`, as cosign opens it) or
/// a PKCS#8 P-256 key as `openssl genpkey` writes it.
pub(super) fn read_signing_key(path: &std::path::Path) -> anyhow::Result<clb_oci::signature::SigningKey> {
    let text = clb_sandbox::bounded::read(path, MAX_KEY_BYTES)?;
    let password = std::env::var_os("COSIGN_PASSWORD").map(|p| p.into_encoded_bytes());
    Ok(clb_oci::signature::SigningKey::from_pem(&path.display().to_string(), &text, password.as_deref())?)
}
