//! `clb-host component`: writes the built-in component, plain or gzip-compressed.

use super::args::EXIT_OK;
use anyhow::Context as _;
use clb_sandbox::{BUILTIN_GUEST, compression};
use std::io::Write;

/// How `component --compress` writes the built-in component.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum CompressArg {
    Gzip,
}

/// `component --out FILE [--compress FORMAT]`: the sha256 printed is the component's, which a pin
/// names whether it travels compressed or not.
pub(super) fn write_component(
    path: &std::path::Path,
    compress: Option<CompressArg>,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
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
    Ok(EXIT_OK)
}
