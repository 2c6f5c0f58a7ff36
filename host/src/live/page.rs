//! The operator page, `GET /`: one HTML document rendered here from an [`Overview`], for a
//! person at a browser during an incident, where `/status` and `/metrics` are for scripts and
//! Prometheus.
//!
//! * **Plain HTML.** No JavaScript, no build step, no external asset (styles inline, charts as
//!   inline SVG): it works from a `kubectl port-forward` on an air-gapped cluster and in a text
//!   browser. It reloads itself every [`REFRESH_SECONDS`] with `<meta http-equiv="refresh">`.
//! * **Read-only**, and open as `/status` is: it shows nothing `/status` and `/metrics` do not
//!   already give, and offers no action (swaps stay `POST /swap`'s, with its checks).
//! * **Escaped.** Every text that comes from outside the host — object names, trap messages,
//!   Azure's errors, swap origins and reasons, bucket names — goes through [`escape`]: a
//!   Service named `<script>` is shown as such, not run.
//! * **Bounded.** It shows the bounded lists [`crate::live::metrics`] keeps (their caps are
//!   documented there), so its size has a ceiling whatever happens.

use crate::live::metrics::{Overview, Sample};
use crate::live::swap::{SwapRecord, SwapResult};
use clb_sandbox::figures::{service_type, state};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// How often the page reloads itself.
pub const REFRESH_SECONDS: u32 = 5;

/// Commands drawn as a line each in the calls chart; the rest are summed as `other`, so that
/// the chart stays readable.
const CHART_LINES: usize = 5;
/// The chart lines' colours, then `other`'s (readable on white, distinct in greyscale too).
const COLOURS: [&str; CHART_LINES + 1] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"];

/// `text` safe in HTML element content and in quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A time (ms since the epoch) in UTC, to the second.
fn time(ms: u64) -> String {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    match k8s_openapi::jiff::Timestamp::from_millisecond(ms) {
        Ok(at) => at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// A duration in the two largest units that matter.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..60 => format!("{:.1} s", ms as f64 / 1000.0),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `time(at)` and how long ago, at `now`.
fn when(at: u64, now: u64) -> String {
    format!("{} ({} ago)", time(at), age(now.saturating_sub(at)))
}

/// The page.
pub fn render(overview: &Overview) -> String {
    let mut page = String::with_capacity(16 * 1024);
    let status = &overview.status;
    let title = match &status.active {
        Some(active) => format!("CLB reconciler · {}", active.version),
        None => "CLB reconciler".to_owned(),
    };
    // Writing into a String cannot fail.
    let _ = write!(
        page,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; max-width: 80em; }}
h1 {{ font-size: 1.4em; margin-bottom: 0.2em; }}
h2 {{ font-size: 1.1em; border-bottom: 1px solid #ccc; margin-top: 1.4em; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: 0.15em 0.8em 0.15em 0; vertical-align: top; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
code {{ font-size: 0.95em; word-break: break-all; }}
.ok {{ color: #176b21; }} .bad {{ color: #b00020; }} .dim {{ color: #666; }}
.badge {{ display: inline-block; padding: 0 0.5em; border-radius: 0.3em; border: 1px solid; margin-right: 0.4em; }}
svg {{ background: #fafafa; border: 1px solid #ddd; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>{serving}{ready} <span class="dim">read-only · reloads every {REFRESH_SECONDS} s · page taken {now}</span></p>
"#,
        title = escape(&title),
        serving = badge(status.serving, "serving", "not serving"),
        ready = badge(status.ready, "ready", "not ready"),
        now = time(overview.now_ms),
    );
    versions(&mut page, overview);
    swaps(&mut page, overview);
    quarantined(&mut page, overview);
    figures(&mut page, overview);
    denials(&mut page, overview);
    command_errors(&mut page, overview);
    charts(&mut page, &overview.series);
    page.push_str("</body>\n</html>\n");
    page
}

fn badge(good: bool, yes: &str, no: &str) -> String {
    let (class, text) = if good { ("ok", yes) } else { ("bad", no) };
    format!(r#"<span class="badge {class}">{text}</span>"#)
}

/// The serving version, the previous one and its probation, and the supervisor's totals.
fn versions(page: &mut String, overview: &Overview) {
    let status = &overview.status;
    page.push_str("<section id=\"serving\">\n<h2>Serving version</h2>\n<table>\n");
    match &status.active {
        Some(active) => {
            let _ = writeln!(
                page,
                "<tr><th>version</th><td><code id=\"serving-sha256\">{}</code></td></tr>",
                escape(&active.sha256)
            );
        }
        None => page.push_str("<tr><th>version</th><td class=\"bad\">none serving</td></tr>\n"),
    }
    let state_version = overview.state_version.map_or_else(|| "not known yet".to_owned(), |v| format!("v{v}"));
    let since = overview.serving_since_ms.map_or_else(|| "—".to_owned(), |at| when(at, overview.now_ms));
    let _ = write!(
        page,
        "<tr><th>state</th><td>{state_version}, {bytes} bytes at the last checkpoint</td></tr>\n\
         <tr><th>guest memory</th><td>{memory}</td></tr>\n\
         <tr><th>serving since</th><td>{since}</td></tr>\n\
         <tr><th>inputs</th><td>{inputs} delivered, {quarantined} quarantined, {rollbacks} rollbacks</td></tr>\n",
        bytes = status.state_bytes,
        memory =
            status.guest_memory_bytes.map_or_else(|| "—".to_owned(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
        inputs = status.inputs,
        quarantined = status.quarantined_inputs,
        rollbacks = status.rollbacks,
    );
    match (&status.previous, &overview.probation) {
        (Some(previous), probation) => {
            let probation = probation.map_or_else(String::new, |p| {
                format!(
                    "; on probation: {} of {} inputs served, {} of {} quarantines allowed",
                    p.served, p.inputs, p.quarantined, p.quarantines
                )
            });
            let _ = writeln!(
                page,
                "<tr><th>previous</th><td><code>{}</code> kept for a rollback{probation}</td></tr>",
                escape(&previous.sha256)
            );
        }
        (None, _) => page.push_str("<tr><th>previous</th><td class=\"dim\">none kept (no probation)</td></tr>\n"),
    }
    if let Some(shadow) = &status.shadow {
        let _ = writeln!(
            page,
            "<tr><th>shadow</th><td><code>{}</code> {:?}: {} inputs compared, {} divergences</td></tr>",
            escape(&shadow.sha256),
            shadow.state,
            shadow.compared,
            shadow.divergences.values().sum::<u64>(),
        );
    }
    let swaps: Vec<String> = status.swaps.iter().map(|(kind, n)| format!("{} {n}", escape(kind))).collect();
    let swaps = if swaps.is_empty() { "none".to_owned() } else { swaps.join(", ") };
    let _ = writeln!(page, "<tr><th>swaps</th><td>{swaps}</td></tr>\n</table>\n</section>");
}

/// A swap result's name, its versions and what it says, escaped.
fn describe_swap(result: &SwapResult) -> (&'static str, String, String) {
    let short = |sha256: &str| escape(&sha256.chars().take(12).collect::<String>());
    match result {
        SwapResult::Accepted { from, to, state_to_version, state_move_ms, took_ms, replayed_inputs, .. } => {
            let replayed = replayed_inputs.map_or_else(String::new, |n| format!(", {n} inputs replayed"));
            (
                "accepted",
                format!("{} → {}", escape(from), escape(to)),
                format!(
                    "state v{state_to_version} moved in {state_move_ms:.0} ms, inputs waited {took_ms:.0} ms{replayed}"
                ),
            )
        }
        SwapResult::Unchanged { version, .. } => ("unchanged", escape(version), "already serving".to_owned()),
        SwapResult::Adopted { from, to, .. } => {
            ("adopted", format!("{} → {}", escape(from), escape(to)), "judges at the door".to_owned())
        }
        SwapResult::Refused { kind, reason, sha256 } => {
            ("refused", short(sha256), format!("{}: {}", escape(kind), escape(reason)))
        }
        SwapResult::RolledBack { from, to, reason } => {
            ("rolled-back", format!("{} → {}", escape(from), escape(to)), escape(reason))
        }
        SwapResult::RollbackFailed { version, reason } => ("rollback-failed", escape(version), escape(reason)),
        SwapResult::ShadowStarted { version, .. } => ("shadow-started", escape(version), String::new()),
        SwapResult::ShadowDiverged { version, kinds, .. } => {
            ("shadow-diverged", escape(version), escape(&kinds.join(", ")))
        }
    }
}

fn swaps(page: &mut String, overview: &Overview) {
    page.push_str("<section id=\"swaps\">\n<h2>Last swaps and rollbacks</h2>\n");
    if overview.swaps.is_empty() {
        page.push_str("<p class=\"dim\">none since this process started</p>\n</section>\n");
        return;
    }
    page.push_str("<table>\n<tr><th>at</th><th>result</th><th>versions</th><th>from</th><th>details</th></tr>\n");
    for SwapRecord { at, origin, result } in &overview.swaps {
        let (name, versions, details) = describe_swap(result);
        let class = if matches!(
            result,
            SwapResult::Accepted { .. } | SwapResult::Unchanged { .. } | SwapResult::Adopted { .. }
        ) {
            "ok"
        } else {
            "bad"
        };
        let _ = writeln!(
            page,
            "<tr class=\"swap\"><td>{}</td><td class=\"{class}\">{name}</td><td>{versions}</td><td>{}</td><td>{details}</td></tr>",
            escape(at),
            escape(origin),
        );
    }
    page.push_str("</table>\n</section>\n");
}

/// Opens the section `id` titled `title` and its table with `columns`; `false` when there are
/// no rows (the section then says so and is closed).
fn open_table(page: &mut String, id: &str, title: &str, rows: usize, columns: &[&str]) -> bool {
    let _ = writeln!(page, "<section id=\"{id}\">\n<h2>{title}</h2>");
    if rows == 0 {
        page.push_str("<p class=\"dim\">none since this process started</p>\n</section>\n");
        return false;
    }
    let header: String = columns.iter().map(|c| format!("<th>{c}</th>")).collect();
    let _ = writeln!(page, "<table>\n<tr>{header}</tr>");
    true
}

/// One row of cells already escaped.
fn row(page: &mut String, cells: impl IntoIterator<Item = String>) {
    let cells: String = cells.into_iter().map(|c| format!("<td>{c}</td>")).collect();
    let _ = writeln!(page, "<tr>{cells}</tr>");
}

fn quarantined(page: &mut String, overview: &Overview) {
    let columns = ["at", "version", "objects", "input", "trap"];
    if !open_table(page, "quarantined", "Quarantined inputs", overview.quarantined.len(), &columns) {
        return;
    }
    for q in &overview.quarantined {
        let objects = if q.objects.is_empty() {
            "—".to_owned()
        } else {
            q.objects.iter().map(|o| escape(o)).collect::<Vec<_>>().join("<br>")
        };
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{objects}</td><td>{}</td><td>{}</td></tr>",
            when(q.at_ms, overview.now_ms),
            escape(&q.version),
            escape(&q.input),
            escape(&q.error),
        );
    }
    page.push_str("</table>\n</section>\n");
}

/// What the logic's own figures say: Services pending by phase, NRP, the write budgets.
fn figures(page: &mut String, overview: &Overview) {
    let Some((sha256, stats, read_at)) = &overview.figures else {
        page.push_str(
            "<section id=\"services\">\n<h2>Services</h2>\n<p class=\"dim\">the logic's figures are not read yet</p>\n</section>\n",
        );
        return;
    };
    let now = overview.now_ms;
    let _ = write!(
        page,
        "<section id=\"services\">\n<h2>Services</h2>\n\
         <p class=\"dim\">the figures of <code>{}</code>, read {}</p>\n<table>\n\
         <tr><th>provisioned</th><td class=\"n\" id=\"k8s-services\">{}</td></tr>\n\
         <tr><th>pending deletion</th><td class=\"n\">{}</td></tr>\n\
         <tr><th>deletion waits for NRP</th><td class=\"n\">{}</td></tr>\n\
         <tr><th>commands in flight</th><td class=\"n\">{}</td></tr>\n</table>\n",
        escape(&sha256.chars().take(12).collect::<String>()),
        when(*read_at, now),
        stats.k8s_services,
        stats.pending_deletions,
        stats.blocked_by_locations,
        stats.commands_in_flight,
    );
    let pending: Vec<_> = stats.pending.iter().filter(|p| p.count > 0).collect();
    if pending.is_empty() {
        page.push_str("<p id=\"pending\">no operation pending</p>\n");
    } else {
        page.push_str(
            "<table id=\"pending\">\n<tr><th>pending phase</th><th>type</th><th>count</th><th>oldest for</th></tr>\n",
        );
        for p in pending {
            let oldest = p.oldest_began_ms.map_or_else(|| "—".to_owned(), |began| age(now.saturating_sub(began)));
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{oldest}</td></tr>",
                state(p.state),
                service_type(p.service_type),
                p.count,
            );
        }
        page.push_str("</table>\n");
    }
    let _ = write!(
        page,
        "</section>\n<section id=\"nrp\">\n<h2>NRP</h2>\n<table>\n\
         <tr><th>locations</th><td class=\"n\">{}</td></tr>\n\
         <tr><th>addresses</th><td class=\"n\">{}</td></tr>\n\
         <tr><th>load balancers</th><td class=\"n\">{}</td></tr>\n\
         <tr><th>NAT gateways</th><td class=\"n\">{}</td></tr>\n</table>\n</section>\n",
        stats.nrp_locations, stats.nrp_addresses, stats.nrp_load_balancers, stats.nrp_nat_gateways,
    );
    page.push_str("<section id=\"budgets\">\n<h2>Write budgets</h2>\n");
    if stats.budgets.is_empty() {
        page.push_str("<p class=\"dim\">none reported</p>\n</section>\n");
        return;
    }
    page.push_str("<table>\n<tr><th>bucket</th><th>writes allowed now</th><th>per minute</th></tr>\n");
    for b in &stats.budgets {
        let class = if b.tokens <= 0 { "n bad" } else { "n" };
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&b.bucket),
            b.tokens,
            b.per_minute
        );
    }
    page.push_str("</table>\n</section>\n");
}

/// The admission webhook's last denials (with `--admission-listen`).
fn denials(page: &mut String, overview: &Overview) {
    let Some(denials) = &overview.denials else { return };
    let columns = ["at", "request", "Service", "reason", "message", "version"];
    if !open_table(page, "denials", "Last denials at the door", denials.len(), &columns) {
        return;
    }
    for d in denials {
        let version = format!("<code>{}</code>", escape(&d.version));
        let cells = [escape(d.operation), escape(&d.service), escape(&d.reason), escape(&d.message), version];
        row(page, [when(d.at_ms, overview.now_ms)].into_iter().chain(cells));
    }
    page.push_str("</table>\n</section>\n");
}

fn command_errors(page: &mut String, overview: &Overview) {
    let columns = ["at", "command", "subject", "error"];
    if !open_table(page, "errors", "Last failed commands", overview.command_errors.len(), &columns) {
        return;
    }
    for e in &overview.command_errors {
        row(page, [when(e.at_ms, overview.now_ms), escape(e.command), escape(&e.subject), escape(&e.error)]);
    }
    page.push_str("</table>\n</section>\n");
}

/// The two time series as inline SVG: the sync lag, and the commands carried out by name.
fn charts(page: &mut String, series: &[Sample]) {
    page.push_str("<section id=\"charts\">\n<h2>Over the last minutes</h2>\n");
    if series.len() < 2 {
        page.push_str("<p class=\"dim\">not enough samples yet (one every few seconds)</p>\n</section>\n");
        return;
    }
    let span = series[series.len() - 1].at_ms.saturating_sub(series[0].at_ms);
    let lag: Vec<Option<f64>> = series.iter().map(|s| s.lag_ms.map(|ms| ms as f64 / 1000.0)).collect();
    let _ = writeln!(page, "<h3>Sync lag: the oldest pending operation's age, seconds (last {})</h3>", age(span));
    chart(page, "sync-lag", &[("lag", COLOURS[0], lag)]);

    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, n) in series.iter().flat_map(|s| &s.calls) {
        *totals.entry(*name).or_default() += n;
    }
    let mut ranked: Vec<(&str, u64)> = totals.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let drawn: Vec<&str> = ranked.iter().take(CHART_LINES).map(|(name, _)| *name).collect();
    let mut lines: Vec<(&str, &str, Vec<Option<f64>>)> = drawn
        .iter()
        .zip(COLOURS)
        .map(|(name, colour)| {
            (*name, colour, series.iter().map(|s| Some(*s.calls.get(name).unwrap_or(&0) as f64)).collect())
        })
        .collect();
    if ranked.len() > CHART_LINES {
        let other = series
            .iter()
            .map(|s| Some(s.calls.iter().filter(|(name, _)| !drawn.contains(*name)).map(|(_, n)| *n as f64).sum()))
            .collect();
        lines.push(("other", COLOURS[CHART_LINES], other));
    }
    let _ = writeln!(page, "<h3>Commands carried out per sample, by command (last {})</h3>", age(span));
    if lines.is_empty() {
        page.push_str("<p class=\"dim\">no command carried out</p>\n");
    } else {
        chart(page, "calls", &lines);
    }
    page.push_str("</section>\n");
}

/// One chart of `lines` (name, colour, a value per sample; `None` leaves a gap) on a shared
/// scale from zero, with a legend.
fn chart(page: &mut String, id: &str, lines: &[(&str, &str, Vec<Option<f64>>)]) {
    const W: f64 = 640.0;
    const H: f64 = 140.0;
    const LEFT: f64 = 48.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 8.0;
    let points = lines.iter().map(|(_, _, values)| values.len()).max().unwrap_or(0);
    let max = lines.iter().flat_map(|(_, _, values)| values.iter().flatten()).fold(0.0f64, |a, &b| a.max(b));
    let top = if max > 0.0 { max } else { 1.0 };
    let x = |i: usize| LEFT + (W - LEFT - 4.0) * i as f64 / (points.max(2) - 1) as f64;
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - v / top);
    let label: Vec<String> = lines.iter().map(|(name, _, _)| escape(name)).collect();
    let _ = write!(
        page,
        r##"<svg id="{id}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{}">
<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#bbb"/>
<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>
<text x="{}" y="{}" font-size="11" text-anchor="end">0</text>
"##,
        label.join(", "),
        y(0.0),
        W - 4.0,
        y(0.0),
        LEFT - 4.0,
        TOP + 9.0,
        number(top),
        LEFT - 4.0,
        y(0.0),
    );
    for (name, colour, values) in lines {
        // A gap (no figures yet) splits the line rather than drawing it at zero.
        let mut runs: Vec<Vec<(usize, f64)>> = vec![Vec::new()];
        for (i, value) in values.iter().enumerate() {
            match value {
                Some(v) => runs.last_mut().expect("one run at least").push((i, *v)),
                None if runs.last().is_some_and(|run| !run.is_empty()) => runs.push(Vec::new()),
                None => {}
            }
        }
        for run in runs.iter().filter(|run| !run.is_empty()) {
            let coordinates: Vec<String> = run.iter().map(|(i, v)| format!("{:.1},{:.1}", x(*i), y(*v))).collect();
            let _ = writeln!(
                page,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"#,
                coordinates.join(" "),
                escape(name)
            );
        }
    }
    page.push_str("</svg>\n<p>");
    for (name, colour, values) in lines {
        let last = values.iter().rev().flatten().next().map_or_else(|| "—".to_owned(), |v| number(*v));
        let _ = write!(page, r#"<span style="color:{colour}">■</span> {} (now {last}) "#, escape(name));
    }
    page.push_str("</p>\n");
}

/// A figure for an axis or a legend: whole when it is, else to a tenth.
fn number(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.1}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::metrics::{CommandError, QuarantineRecord, Status, VersionRef};
    use clb_sandbox::bindings::clb::reconciler::types as wit;
    use clb_sandbox::supervisor::ProbationSnapshot;

    const NOW: u64 = 1_796_300_000_000;
    const SERVING: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const PREVIOUS: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn stats() -> wit::TrackerStats {
        wit::TrackerStats {
            service_gateway_enabled: true,
            pending: vec![
                wit::PendingOperations {
                    state: wit::OperationState::CreationInProgress,
                    service_type: wit::ServiceType::Inbound,
                    count: 3,
                    oldest_began_ms: Some(NOW - 95_000),
                },
                wit::PendingOperations {
                    state: wit::OperationState::Created,
                    service_type: wit::ServiceType::Outbound,
                    count: 0,
                    oldest_began_ms: None,
                },
            ],
            k8s_services: 42,
            nrp_load_balancers: 40,
            nrp_nat_gateways: 2,
            nrp_locations: 17,
            nrp_addresses: 1234,
            pending_deletions: 1,
            commands_in_flight: 5,
            initialized_after_ms: Some(1200),
            budgets: vec![wit::BudgetLevel { bucket: "arm-writes".into(), tokens: -3, per_minute: 600 }],
            ..clb_sandbox::figures::zero_stats()
        }
    }

    fn overview() -> Overview {
        let hostile = "<script>alert('x')</script>";
        let version = |sha256: &str| VersionRef { version: sha256[..12].to_owned(), sha256: sha256.to_owned() };
        let swap = SwapRecord {
            at: "2026-12-05T03:00:00Z".into(),
            origin: format!("configmap ns/{hostile}:logic"),
            result: SwapResult::Accepted {
                from: PREVIOUS[..12].into(),
                to: SERVING[..12].into(),
                sha256: SERVING.into(),
                state_from_version: 6,
                state_from_bytes: 10,
                state_to_version: 7,
                state_to_bytes: 11,
                state_move_ms: 12.0,
                took_ms: 1.0,
                replayed_inputs: Some(4),
            },
        };
        let refused = SwapRecord {
            at: "2026-12-05T02:59:00Z".into(),
            origin: "endpoint 127.0.0.1:5000".into(),
            result: SwapResult::Refused {
                kind: "self-check".into(),
                reason: format!("deletes {hostile}"),
                sha256: PREVIOUS.into(),
            },
        };
        let mut calls = BTreeMap::new();
        calls.insert("put-load-balancer", 3);
        let series = (0..6)
            .map(|i| Sample {
                at_ms: NOW - 30_000 + i * 5000,
                lag_ms: (i > 0).then_some(i * 1000),
                calls: if i % 2 == 1 { calls.clone() } else { BTreeMap::new() },
            })
            .collect();
        Overview {
            now_ms: NOW,
            status: Status {
                serving: true,
                ready: true,
                active: Some(version(SERVING)),
                previous: Some(version(PREVIOUS)),
                last_swap: Some(swap.clone()),
                swaps: [("accepted", 1), ("self-check", 1)].into_iter().collect(),
                rollbacks: 0,
                quarantined_inputs: 1,
                state_bytes: 4096,
                guest_memory_bytes: Some(36 << 20),
                inputs: 900,
                shadow: None,
                last_denials: None,
            },
            serving_since_ms: Some(NOW - 60_000),
            state_version: Some(7),
            probation: Some(ProbationSnapshot { served: 12, inputs: 1000, quarantined: 1, quarantines: 3 }),
            swaps: vec![swap, refused],
            quarantined: vec![QuarantineRecord {
                at_ms: NOW - 1000,
                version: SERVING[..12].into(),
                objects: vec![format!("Service shop/{hostile}")],
                input: format!("observe at 5ms: Service shop/{hostile}"),
                error: "wasm trap: unreachable".into(),
            }],
            command_errors: vec![CommandError {
                at_ms: NOW - 2000,
                command: "put-load-balancer",
                subject: format!("lb {hostile}"),
                error: "HTTP 409 Conflict: <b>busy</b> & retry".into(),
            }],
            figures: Some((SERVING.into(), stats(), NOW - 500)),
            series,
            denials: Some(vec![crate::admission::door::Denial {
                at_ms: NOW - 3000,
                operation: "UPDATE",
                service: format!("shop/{hostile}"),
                reason: "UnsupportedExternalTrafficPolicy".into(),
                message: format!("service shop/{hostile}: externalTrafficPolicy is Cluster"),
                version: SERVING[..12].into(),
            }]),
        }
    }

    #[test]
    fn the_page_shows_every_section_with_the_figures_it_is_given_and_refreshes_itself() {
        let page = render(&overview());
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert!(page.contains(r#"<meta http-equiv="refresh" content="5">"#));
        for section in ["serving", "swaps", "quarantined", "services", "nrp", "budgets", "denials", "errors", "charts"]
        {
            assert!(page.contains(&format!("<section id=\"{section}\">")), "section {section}: {page}");
        }
        for shown in [
            &format!("<code id=\"serving-sha256\">{SERVING}</code>")[..],
            "v7, 4096 bytes",
            "<tr><th>guest memory</th><td>36.0 MiB</td></tr>",
            "(1 min 0 s ago)",
            "on probation: 12 of 1000 inputs served, 1 of 3 quarantines allowed",
            PREVIOUS,
            "accepted</td><td>fedcba987654 → 0123456789ab",
            "4 inputs replayed",
            "refused</td><td>fedcba987654",
            r#"<td class="n" id="k8s-services">42</td>"#,
            "<td>creation_in_progress</td><td>inbound</td><td class=\"n\">3</td><td class=\"n\">1 min 35 s</td>",
            "<tr><th>locations</th><td class=\"n\">17</td>",
            "<tr><th>addresses</th><td class=\"n\">1234</td>",
            "<tr><th>load balancers</th><td class=\"n\">40</td>",
            "<tr><th>NAT gateways</th><td class=\"n\">2</td>",
            "<td>arm-writes</td><td class=\"n bad\">-3</td><td class=\"n\">600</td>",
            "wasm trap: unreachable",
            "<td>put-load-balancer</td>",
            r#"<svg id="sync-lag""#,
            r#"<svg id="calls""#,
            "put-load-balancer (now 3)",
            "<td>UPDATE</td>",
            "<td>UnsupportedExternalTrafficPolicy</td>",
        ] {
            assert!(page.contains(shown), "{shown:?} in:\n{page}");
        }
        assert!(!page.contains("created</td>"), "phases with nothing pending are left out: {page}");
        assert_eq!(page.matches("<polyline").count(), 2, "a line each; the lag's first gap starts no line: {page}");
        assert!(!page.contains("<script"), "no script, hostile or ours: {page}");
    }

    #[test]
    fn text_from_outside_is_escaped_wherever_it_appears() {
        let page = render(&overview());
        assert!(!page.contains("<script>") && !page.contains("<b>busy</b>"), "{page}");
        let escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;";
        for context in ["configmap ns/", "deletes ", "Service shop/", "lb ", "<td>shop/", "service shop/"] {
            assert!(page.contains(&format!("{context}{escaped}")), "{context:?} escaped in:\n{page}");
        }
        assert!(page.contains("&lt;b&gt;busy&lt;/b&gt; &amp; retry"), "{page}");
        assert_eq!(escape(r#"a"b"#), "a&quot;b");
    }

    #[test]
    fn a_page_before_any_figures_or_samples_says_so_instead_of_showing_zeros() {
        let mut overview = overview();
        overview.figures = None;
        overview.series.truncate(1);
        overview.swaps.clear();
        overview.status.active = None;
        overview.status.previous = None;
        overview.denials = Some(Vec::new());
        let page = render(&overview);
        assert!(page.contains("none serving"), "{page}");
        assert!(page.contains("the logic's figures are not read yet"), "{page}");
        assert!(page.contains("not enough samples yet"), "{page}");
        assert!(!page.contains("<svg"), "{page}");
        assert!(page.contains("<section id=\"swaps\">\n<h2>Last swaps and rollbacks</h2>\n<p class=\"dim\">none"));
        assert!(page.contains("<h2>Last denials at the door</h2>\n<p class=\"dim\">none"), "{page}");
        overview.denials = None;
        assert!(!render(&overview).contains("id=\"denials\""), "no webhook, no section");
    }
}
