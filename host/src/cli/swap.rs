//! `clb-host swap`: asks a running `clb-host run` to swap its logic, over its `POST /swap`.

use super::args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED};
use anyhow::Context as _;
use clap::Args;
use clb_sandbox::compression;
use std::io::Write;
use std::path::PathBuf;

/// Where `swap` sends by default: the host on the same machine (or in the same pod).
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:10270";

/// What `swap` sends where.
#[derive(Args)]
pub(super) struct SwapArgs {
    /// The new component (.wasm), gzip or zstd compressed or not; it is sent as it is.
    #[arg(long, value_name = "FILE")]
    pub(super) to: PathBuf,
    /// The sha256 the component must have (of the decompressed component, when it is
    /// compressed); the running host refuses it otherwise.
    #[arg(long, value_name = "HEX")]
    pub(super) sha256: Option<crate::live::swap::Sha256Pin>,
    /// The endpoint of the running host (its --listen).
    #[arg(long, value_name = "URL", default_value = DEFAULT_ENDPOINT)]
    pub(super) endpoint: String,
    /// A detached signature of the file as sent (`cosign sign-blob`), for a host that takes only
    /// signed versions (--logic-verify-key); default: `TO.sig` when there is one.
    #[arg(long, value_name = "FILE")]
    pub(super) signature: Option<PathBuf>,
    /// A file holding the admin token, when the host was started with --admin-token-file.
    #[arg(long, value_name = "FILE")]
    pub(super) token_file: Option<PathBuf>,
}

/// A token file's content without surrounding whitespace; an empty token is refused.
pub(super) fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let token = clb_sandbox::bounded::read(path, clb_arm::auth::MAX_TOKEN_BYTES)?;
    let token = String::from_utf8(token).with_context(|| format!("{}: the token is not UTF-8", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "{}: the token file is empty", path.display());
    Ok(token.to_owned())
}

/// A detached signature file's base64, without the newline an editor or `echo` adds.
fn read_signature(path: &std::path::Path) -> anyhow::Result<String> {
    let text = clb_sandbox::bounded::read(path, crate::live::sources::MAX_SIGNATURE_BYTES)?;
    let text = String::from_utf8(text).with_context(|| format!("{}: not a signature (not text)", path.display()))?;
    Ok(text.trim().to_owned())
}

pub(super) fn swap(args: SwapArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<u8> {
    use crate::live::swap::SwapResult;
    let bytes = clb_sandbox::bounded::read(&args.to, compression::MAX_COMPONENT_BYTES as u64)?;
    // A compressed file travels as it is (smaller), and the host decompresses it; one that does
    // not decompress is refused here, as an unreadable file is.
    if compression::Compression::detect(&bytes).is_some() {
        compression::decompress(bytes.clone()).with_context(|| format!("{}: not a component", args.to.display()))?;
    }
    let token = args.token_file.as_deref().map(read_token).transpose()?;
    let signature = match &args.signature {
        Some(path) => Some(read_signature(path)?),
        None => {
            let beside = crate::live::sources::detached_signature_path(&args.to);
            beside.exists().then(|| read_signature(&beside)).transpose()?
        }
    };
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
        if let Some(signature) = &signature {
            request = request.header(crate::live::endpoint::SIGNATURE_HEADER, signature);
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
