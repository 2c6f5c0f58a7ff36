//! `clb-host admission`: serves the logic's admission rules as a `ValidatingAdmissionWebhook`
//! until killed (`crate::admission`).

use super::args::{EXIT_BAD_INPUT, EXIT_REFUSED, LogicArgs, refuses_config};
use crate::admission::review::FailurePolicy;
use crate::admission::tls::ReloadingCert;
use crate::admission::{Settings, serve};
use anyhow::Context as _;
use clap::Args;
use clb_executor::inputs;
use clb_sandbox::Runtime;
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
    /// Milliseconds a request may wait for its verdict (below the webhook's `timeoutSeconds`);
    /// past it the failure policy answers.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=30_000))]
    pub(super) admission_timeout_ms: u64,
    /// What a request the logic could not judge in time (a trap, its limits, the timeout)
    /// gets: `open` allows it with a warning naming the cause, `closed` denies it.
    #[arg(long, value_enum, default_value_t = FailurePolicy::Open)]
    pub(super) admission_failure: FailurePolicy,
    #[command(flatten)]
    pub(super) logic: LogicArgs,
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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certified));
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let settings = Settings {
        logic,
        config,
        timeout: Duration::from_millis(args.admission_timeout_ms),
        failure: args.admission_failure,
    };
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
        writeln!(out, "listening on https://{}/validate", listener.local_addr()?)?;
        out.flush()?;
        match serve(listener, Arc::new(tls), settings).await {}
    })
}
