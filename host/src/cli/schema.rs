//! `clb-host schema`: the component's functions and WIT types as JSON, for other hosts.

use super::args::{EXIT_OK, read_component};
use clb_sandbox::BUILTIN_GUEST;
use clb_sandbox::{Limits, Runtime};
use std::io::Write;

pub(super) fn schema(component: Option<&std::path::Path>, out: &mut dyn Write) -> anyhow::Result<u8> {
    let bytes = match component {
        Some(path) => read_component(path)?,
        None => BUILTIN_GUEST.to_vec(),
    };
    let runtime = Runtime::new()?;
    let logic = runtime.load(&bytes, Limits::default())?;
    writeln!(out, "{}", clb_sandbox::trace::schema_text(&logic))?;
    Ok(EXIT_OK)
}
