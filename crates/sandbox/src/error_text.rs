//! How this host writes an error on one line (a log field, an Event's message, a report): the
//! error and each of its sources, `: `-separated.

/// An error and its sources on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
