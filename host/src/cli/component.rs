//! `clb-host component`: writes the built-in component, plain or gzip-compressed, or pushes it
//! (or `--component FILE`) to an OCI registry as the CNCF wasm artifact ([`clb_oci::artifact`]).

use super::args::{EXIT_BAD_INPUT, EXIT_OK, RegistryArgs, read_component};
use anyhow::Context as _;
use clap::Args;
use clb_sandbox::supervisor::Supervisor;
use clb_sandbox::{BUILTIN_GUEST, Limits, PACKAGE, Runtime, compression};
use std::io::Write;
use std::path::PathBuf;

/// How `component --compress` writes the built-in component.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum CompressArg {
    Gzip,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("destination").args(["out", "push"]).required(true)))]
pub(super) struct ComponentArgs {
    /// Where to write it.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Write it compressed (gzip: level 9), e.g. for a ConfigMap's binaryData; every way
    /// in takes it so. For zstd, compress the plain file with `zstd -19`.
    #[arg(long, value_enum, value_name = "FORMAT", requires = "out")]
    compress: Option<CompressArg>,
    /// Push it to this OCI reference (`REGISTRY/REPOSITORY:TAG`) as a wasm artifact (config
    /// `application/vnd.wasm.config.v0+json`, one `application/wasm` layer, annotated with its
    /// WIT package and state version) and print the manifest's digest (`sha256:…`).
    #[arg(long, value_name = "REF", value_parser = super::args::oci_reference)]
    push: Option<clb_oci::Reference>,
    /// Push this component (gzip or zstd compressed or not) instead of the built-in one; it
    /// must be one this host loads.
    #[arg(long, value_name = "FILE", requires = "push")]
    component: Option<PathBuf>,
    /// Sign with this key: with --push, the pushed artifact's digest, the signature pushed as
    /// cosign does (`cosign verify --key` accepts it); with --out, the file as written, the
    /// signature written beside it as FILE.sig (`cosign verify-blob --key` accepts it). Cosign's
    /// encrypted key (its password in `COSIGN_PASSWORD`) or a PKCS#8 EC P-256 key (`openssl
    /// genpkey`).
    #[arg(long, value_name = "KEY")]
    sign_key: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub(super) fn component(args: &ComponentArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    match (&args.out, &args.push) {
        (Some(path), _) => write_component(path, args.compress, args.sign_key.as_deref(), out),
        (None, Some(reference)) => push(args, reference, out, err),
        (None, None) => unreachable!("clap requires --out or --push"),
    }
}

/// `component --out FILE [--compress FORMAT]`: the sha256 printed is the component's, which a pin
/// names whether it travels compressed or not.
fn write_component(
    path: &std::path::Path,
    compress: Option<CompressArg>,
    sign_key: Option<&std::path::Path>,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    // A key that cannot be read stops before anything is written.
    let key = sign_key.map(super::args::read_signing_key).transpose()?;
    let sha256 = clb_sandbox::sha256_hex(BUILTIN_GUEST);
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
    if let Some(key) = key {
        let beside = crate::live::sources::detached_signature_path(path);
        std::fs::write(&beside, key.sign(&written)).with_context(|| format!("{}: cannot write", beside.display()))?;
        writeln!(out, "{}: its signature", beside.display())?;
    }
    Ok(EXIT_OK)
}

/// `component --push REF`: what is pushed is uncompressed (a registry compresses nothing, and a
/// digest names the component itself), and only a component this host loads.
fn push(
    args: &ComponentArgs,
    reference: &clb_oci::Reference,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let component = match &args.component {
        Some(path) => read_component(path)?,
        None => BUILTIN_GUEST.to_vec(),
    };
    let description = match describe(&component) {
        Ok(description) => description,
        Err(refusal) => {
            writeln!(err, "error: not pushed: {refusal:#}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    // A key that cannot be read stops the push before anything is written.
    let key = args.sign_key.as_deref().map(super::args::read_signing_key).transpose()?;
    let client = args.registry.client()?;
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let digest = tokio.block_on(clb_oci::artifact::push(&client, reference, &component, &description))?;
    writeln!(out, "{digest}")?;
    tracing::info!(%reference, %digest, bytes = component.len(), "pushed the component");
    if let Some(key) = key {
        let tag = clb_oci::signature::signature_tag(&digest);
        tokio.block_on(clb_oci::signature::push_signature(&client, reference, &digest, &key))?;
        tracing::info!(%reference, %tag, "pushed its signature");
    }
    Ok(EXIT_OK)
}

/// What the artifact says of `component`: its imports and exports, its WIT package, and the
/// state version a tracker of it writes (asked of a tracker started on a minimal configuration).
pub(super) fn describe(component: &[u8]) -> anyhow::Result<clb_oci::Description> {
    let runtime = Runtime::new()?;
    // Loading compiles it and checks its imports and exports, as every way in does.
    let logic = runtime
        .load(component, Limits::default())
        .map_err(|refusal| anyhow::anyhow!("this host would refuse it: {refusal}"))?;
    let info = logic.info();
    let config = clb_executor::inputs::parse_config(
        std::path::Path::new("<minimal configuration>"),
        "loadBalancerBackendPoolConfigurationType: podIP\nloadBalancerSku: standardV2\n",
    )?;
    let mut supervisor = Supervisor::new(&logic);
    supervisor.start(&config).context("starting a tracker to ask its state version")?;
    let state_version = supervisor.export_state().context("asking the tracker's state version")?.version;
    Ok(clb_oci::Description {
        imports: info.imports.iter().map(|(name, _)| name.clone()).collect(),
        exports: info.exports.clone(),
        package: info.package_version().map(|v| format!("{PACKAGE}@{v}")),
        state_version: Some(state_version),
    })
}
