//! `clb-host inspect`: what a component is and whether this host loads it.

use super::args::{EXIT_OK, EXIT_REFUSED, read_component_file};
use anyhow::Context as _;
use clb_sandbox::{ComponentInfo, PACKAGE, Runtime};
use std::io::Write;

pub(super) fn inspect(file: &std::path::Path, out: &mut dyn Write) -> anyhow::Result<u8> {
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
