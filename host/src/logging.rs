//! Log lines on stderr (`--log-format`): text for people — coloured only on a terminal, so a file
//! or a log collector gets no escape codes — or one JSON object a line for log pipelines. What is
//! logged is RUST_LOG's choice (default `warn`).

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The subscriber for `format`, writing to `writer`, filtered by `filter` (RUST_LOG's syntax);
/// `ansi`: colour the text format.
pub fn subscriber<W>(format: LogFormat, filter: &str, writer: W, ansi: bool) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        // The span a line was logged in (a Service, a component) as a field, not the whole stack.
        LogFormat::Json => Box::new(builder.json().with_current_span(true).with_span_list(false).finish()),
    }
}

/// Makes [`subscriber`] for stderr the process's, filtered by RUST_LOG (default `warn`).
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    let subscriber = subscriber(format, &filter, std::io::stderr, std::io::stderr().is_terminal());
    // Set once, by the binary; a second call (none today) keeps the first.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
