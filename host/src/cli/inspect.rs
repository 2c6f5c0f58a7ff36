//! `clb-host inspect`: what a component is and whether this host loads it, from a file or from
//! an OCI registry (`oci://REF`).

use super::args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, RegistryArgs, read_component_file};
use anyhow::Context as _;
use clb_sandbox::{ComponentInfo, PACKAGE, Runtime, compression};
use std::io::Write;

pub(super) fn inspect(
    target: &std::path::Path,
    verify_key: Option<&std::path::Path>,
    registry: &RegistryArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    if let Some(reference) = target.to_str().and_then(|t| t.strip_prefix("oci://")) {
        return inspect_oci(reference, verify_key, registry, out, err);
    }
    let key = verify_key.map(super::args::read_public_key).transpose()?;
    let read = read_component_file(target)?;
    writeln!(out, "file:     {}", target.display())?;
    let loadable = describe(&read.bytes, read.compressed, out).with_context(|| target.display().to_string())?;
    let (Some(key), Some(key_path)) = (key, verify_key) else { return Ok(loadable) };
    // The detached signature is of the file as it is (compressed or not), as `run` checks it.
    let raw = clb_sandbox::bounded::read(target, compression::MAX_COMPONENT_BYTES as u64)?;
    let beside = crate::live::sources::detached_signature_path(target);
    let signature = crate::live::sources::read_detached_signature(&beside);
    let signed = crate::live::swap::Signed::detached(signature.as_deref(), beside.display().to_string());
    match signed.refusal(&key, &raw) {
        None => {
            writeln!(out, "signature: verified with {} ({})", key_path.display(), beside.display())?;
            Ok(loadable)
        }
        Some(refusal) => {
            writeln!(out, "signature: NOT verified: {refusal}")?;
            Ok(EXIT_REFUSED)
        }
    }
}

/// Pulls the component (capped as every component source is) and describes it; exits 1 when
/// what the reference names is no component this host loads, 2 when it cannot be pulled.
fn inspect_oci(
    text: &str,
    verify_key: Option<&std::path::Path>,
    registry: &RegistryArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let reference = clb_oci::Reference::parse(text)?;
    let key = verify_key.map(super::args::read_public_key).transpose()?;
    let client = registry.client()?;
    let tokio =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let pulled =
        match tokio.block_on(clb_oci::artifact::pull(&client, &reference, compression::MAX_COMPONENT_BYTES as u64)) {
            Ok(pulled) => pulled,
            // Pulled, and not what this host loads: refused, as a file that is no component is.
            Err(error @ (clb_oci::OciError::NotAComponent { .. } | clb_oci::OciError::TooLarge { .. })) => {
                writeln!(out, "reference: {reference}")?;
                writeln!(out, "verdict:  refused: {}", clb_sandbox::error_text::error_chain(&error))?;
                return Ok(EXIT_REFUSED);
            }
            Err(error) => {
                writeln!(err, "error: {}", clb_sandbox::error_text::error_chain(&error))?;
                return Ok(EXIT_BAD_INPUT);
            }
        };
    writeln!(out, "reference: {reference}")?;
    writeln!(out, "digest:   {}", pulled.digest)?;
    for (key, value) in &pulled.annotations {
        writeln!(out, "annotation: {key}={value}")?;
    }
    let loadable = match describe(&pulled.component, None, out) {
        Ok(code) => code,
        Err(error) => {
            writeln!(out, "verdict:  refused: {error:#}")?;
            return Ok(EXIT_REFUSED);
        }
    };
    let (Some(key), Some(key_path)) = (key, verify_key) else { return Ok(loadable) };
    match tokio.block_on(clb_oci::signature::verify(&client, &reference, &pulled.digest, &key)) {
        Ok(()) => {
            writeln!(out, "signature: verified with {}", key_path.display())?;
            Ok(loadable)
        }
        Err(clb_oci::signature::SignatureError::Registry(error)) => {
            writeln!(err, "error: reading the signatures: {}", clb_sandbox::error_text::error_chain(&error))?;
            Ok(EXIT_BAD_INPUT)
        }
        Err(error) => {
            writeln!(out, "signature: NOT verified: {}", clb_sandbox::error_text::error_chain(&error))?;
            Ok(EXIT_REFUSED)
        }
    }
}

/// Its figures and whether this host loads it (exit 0 or 1); an error when it does not compile.
fn describe(
    bytes: &[u8],
    compressed: Option<(compression::Compression, usize)>,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let runtime = Runtime::new()?;
    let component = runtime.compile(bytes)?;
    let info = ComponentInfo::of(runtime.engine(), &component, bytes);
    writeln!(out, "sha256:   {}", info.sha256)?;
    writeln!(out, "size:     {} bytes", info.size)?;
    if let Some((format, size)) = compressed {
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
