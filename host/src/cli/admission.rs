//! `clb-host admission`: serves the logic's admission rules as a `ValidatingAdmissionWebhook`
//! until killed (`crate::admission`).

use super::args::{EXIT_BAD_INPUT, EXIT_REFUSED, LogicArgs, config_refusal, refuses_config};
use crate::admission::review::FailurePolicy;
use crate::admission::tls::ReloadingCert;
use crate::admission::{Door, Settings, serve};
use crate::live::control::{Control, ControlEvent};
use crate::live::sources::LogicSource;
use anyhow::Context as _;
use clap::Args;
use clb_executor::inputs;
use clb_sandbox::Runtime;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where and how the webhook serves.
#[derive(Args)]
pub(super) struct AdmissionArgs {
    /// The cloud configuration (azure.json; YAML or JSON): only its keys of the mode are needed.
    #[arg(long, value_name = "FILE")]
    pub(super) cloud_config: PathBuf,
    /// The serving certificate (PEM; the chain, leaf first), re-read when it changes.
    #[arg(long, value_name = "CERT")]
    pub(super) tls_cert_file: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1), re-read when it changes.
    #[arg(long, value_name = "KEY")]
    pub(super) tls_key_file: PathBuf,
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "0.0.0.0:10271")]
    pub(super) listen: std::net::SocketAddr,
    #[command(flatten)]
    pub(super) judging: JudgingArgs,
    #[command(flatten)]
    pub(super) record: super::args::RecordArgs,
    #[command(flatten)]
    pub(super) source: super::args::LogicSourceArgs,
    /// The kubeconfig, for --logic-configmap; default: the in-cluster configuration, else
    /// `KUBECONFIG` or `~/.kube/config`.
    #[arg(long, value_name = "FILE")]
    pub(super) kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub(super) logic: LogicArgs,
}

/// How a request is judged: shared by `admission` and `run --admission-listen`.
#[derive(Args)]
pub(super) struct JudgingArgs {
    /// Milliseconds a request may wait for its verdict (below the webhook's `timeoutSeconds`);
    /// past it the failure policy answers.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=30_000))]
    pub(super) admission_timeout_ms: u64,
    /// What a request the logic could not judge in time (a trap, its limits, the timeout)
    /// gets: `open` allows it with a warning naming the cause, `closed` denies it.
    #[arg(long, value_enum, default_value_t = FailurePolicy::Open)]
    pub(super) admission_failure: FailurePolicy,
}

impl JudgingArgs {
    pub(super) fn settings(&self, door: Arc<Door>, config: wit::Config) -> Settings {
        Settings {
            door,
            config,
            timeout: Duration::from_millis(self.admission_timeout_ms),
            failure: self.admission_failure,
            record: None,
        }
    }
}

pub(super) fn admission(args: AdmissionArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    let config = match inputs::read_config(&args.cloud_config) {
        Ok(config) => config,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let certified = match ReloadingCert::new(args.tls_cert_file.clone(), args.tls_key_file.clone()) {
        Ok(certified) => certified,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let runtime = Runtime::new()?;
    let logic = runtime.load(&args.logic.bytes()?, args.logic.limits())?;
    // The configuration is judged once, as `run` judges it: one the logic refuses would have
    // every Service rejected for the configuration's sake, which is no verdict on a Service.
    if refuses_config(&logic, &config, &args.cloud_config, err)? {
        return Ok(EXIT_REFUSED);
    }
    let record = args.record.start(&logic, &args.logic, "admission")?;
    let door = Arc::new(Door::new(logic));
    let settings = Settings { record, ..args.judging.settings(door.clone(), config.clone()) };
    let threads =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    threads.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(e) => {
                writeln!(err, "error: cannot listen on {}: {e}", args.listen)?;
                return Ok(EXIT_BAD_INPUT);
            }
        };
        if let Some(source) = args.source.source()? {
            let client = match &source {
                LogicSource::ConfigMap(_) => match crate::live::settings::connect(args.kubeconfig.as_deref()).await {
                    Ok(client) => Some(client),
                    Err(e) => {
                        writeln!(err, "error: {:#}", anyhow::Error::new(e))?;
                        return Ok(EXIT_BAD_INPUT);
                    }
                },
                LogicSource::File(_) | LogicSource::Oci(_) => None,
            };
            let pin = args.source.logic_sha256.clone();
            // Where the sources' refusals are counted; the webhook's own `/metrics` does not show
            // them, its log does.
            let (control, swaps) = Control::new(&runtime, args.logic.limits(), crate::live::metrics::Metrics::new());
            let swaps = swaps.verifying(args.source.verify_key()?);
            follow_source(source, pin, client, control, swaps, door, config);
        }
        writeln!(out, "listening on https://{}/validate", listener.local_addr()?)?;
        out.flush()?;
        match serve(listener, certified.server_config(), settings, None).await {}
    })
}

/// Watches `source` (as `run` does) and has each version it offers judge from the next request
/// on, once the version takes the configuration: `run`'s decompression, pin and load checks,
/// then [`Control::adopt`], as there is no tracker whose state would move.
fn follow_source(
    source: LogicSource,
    pin: Option<crate::live::swap::Sha256Pin>,
    client: Option<kube::Client>,
    mut control: Control,
    swaps: crate::live::control::SwapSender,
    door: Arc<Door>,
    config: wit::Config,
) {
    tokio::spawn(source.watch(client, pin, swaps, crate::live::sources::FILE_POLL));
    tokio::spawn(async move {
        loop {
            let ControlEvent::Request(request) = control.next().await else { continue };
            let serving = door.judges().serving;
            control.adopt(request, &serving, |logic| match config_refusal(logic, &config) {
                Ok(None) => {
                    door.follow(logic, None);
                    Ok(())
                }
                Ok(Some(refused)) => Err(refused),
                Err(error) => Err(format!("validate-config failed: {error}")),
            });
        }
    });
}
