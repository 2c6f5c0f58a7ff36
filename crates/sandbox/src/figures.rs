//! The logic's own figures (`tracker.stats`) on `/metrics`: upstream's `difftracker_engine`
//! families by their names and labels, so that upstream's dashboards and alerts work unchanged,
//! and ours (`clb_logic_…`) for what upstream has no name for.
//!
//! * The upstream-named families describe the serving version only and carry no version label:
//!   a dashboard's `sum()` stays right across a swap. Every family is there from the first
//!   figures on, zeros included, as upstream registers them at start-up.
//! * The logic's counts are state: a swap, a checkpoint or a rebuild carries them on. A new
//!   tracker (a new leadership term, a restart of the term's loop, a rollback to a version that
//!   restarts from an older state) counts from zero again; here the counters never go back:
//!   when any count is lower than the last, what was counted before is carried into a base that
//!   every later figure is added to. (What an old tracker counted after its last figures were
//!   read is not seen.)
//! * Ours carry the `version` and `sha256` labels of the version that reported them: the
//!   serving version's, and a candidate's in shadow beside it.
//!
//! Upstream families whose event cannot happen in this controller are shown at zero; each says
//! why in docs/operations.md ("What to scrape").

use crate::bindings::clb::reconciler::types as wit;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::BTreeMap;

type Labels = Vec<(&'static str, String)>;

/// The prefix of every upstream family (upstream's `diffTrackerSubsystem`).
pub const UPSTREAM: &str = "difftracker_engine";

/// Upstream's histogram buckets, in the unit it exposes (seconds; retries).
const DURATION_BOUNDS_S: [f64; 9] = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
const RETRY_BOUNDS: [f64; 7] = [0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0];

/// A family shown at zero: its name, help and the labels of its one series.
type ZeroFamily = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// Counter families of upstream that no event of this controller feeds, with their labels: the
/// tracker retries a write until it succeeds or its object is gone, so nothing is given up on.
const ALWAYS_ZERO: &[ZeroFamily] = &[
    (
        "finalizers_recovered",
        "Stuck pod/service finalizers actually removed (none: finalizers are released by the lifecycle, never recovered).",
        &[],
    ),
    (
        "finalizers_recovery_scheduled",
        "Stuck finalizers scheduled for cleanup by another path at start-up (none here).",
        &[],
    ),
    (
        "service_finalizer_remove_failed",
        "Services left Terminating because finalizer removal failed (none: the tracker retries it).",
        &[],
    ),
    (
        "pod_finalizer_add_failed",
        "Egress pods registered without the cleanup finalizer (none: the tracker retries the add).",
        &[],
    ),
    (
        "pod_finalizer_remove_failed",
        "Egress pods left Terminating because finalizer removal failed (none: the tracker retries it).",
        &[],
    ),
    (
        "outbound_service_updates_skipped",
        "Outbound service updates dropped (none: an egress identity has nothing to update).",
        &[],
    ),
    (
        "service_external_ip_recovery_failed",
        "Services whose External IP could not be recovered at start-up (none: the tracker retries the status write).",
        &[],
    ),
    (
        "location_sync_abandoned",
        "NRP location syncs given up on after their retries (none: the tracker retries without a ceiling).",
        &[("reason", "init_attempts_exhausted")],
    ),
    ("location_sync_abandoned", "", &[("reason", "drain_attempts_exhausted")]),
];

/// One series' counts: `[value]` for a counter, `[bucket counts…, count, sum]` for a histogram.
type Series = BTreeMap<(&'static str, Labels), Vec<u64>>;

/// The figures of the serving version as `/metrics` shows them.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// The version whose figures these are, and when they were read (ms since the epoch).
    pub sha256: String,
    pub read_at_ms: u64,
    pub stats: Option<wit::TrackerStats>,
    /// What earlier trackers had counted (see the module docs).
    base: Series,
    /// The last figures' own counts.
    last: Series,
}

pub fn state(s: wit::OperationState) -> &'static str {
    match s {
        wit::OperationState::NotStarted => "not_started",
        wit::OperationState::CreationInProgress => "creation_in_progress",
        wit::OperationState::Created => "created",
        wit::OperationState::DeletionPending => "deletion_pending",
        wit::OperationState::DeletionInProgress => "deletion_in_progress",
        wit::OperationState::UpdateInProgress => "update_in_progress",
    }
}

pub fn service_type(t: wit::ServiceType) -> &'static str {
    match t {
        wit::ServiceType::Inbound => "inbound",
        wit::ServiceType::Outbound => "outbound",
    }
}

fn operation(o: wit::Operation) -> &'static str {
    match o {
        wit::Operation::Create => "create",
        wit::Operation::Update => "update",
        wit::Operation::Delete => "delete",
    }
}

fn op_labels(o: wit::Operation, t: wit::ServiceType) -> Labels {
    vec![("operation", operation(o).to_owned()), ("service_type", service_type(t).to_owned())]
}

/// The counting series of `stats`, by family (without `_total`) and labels.
fn counts(stats: &wit::TrackerStats) -> Series {
    let mut series = Series::new();
    for a in &stats.attempts {
        let mut labels = op_labels(a.operation, a.service_type);
        labels.push(("result", if a.success { "success" } else { "error" }.to_owned()));
        labels.push(("error_code", a.error_code.clone()));
        labels.push(("is_orphan", a.orphan.to_string()));
        *series.entry(("service_operations", labels)).or_insert_with(|| vec![0]).first_mut().expect("one") += a.count;
    }
    for (family, histograms) in
        [("service_operation_duration_seconds", &stats.durations), ("service_operation_retries", &stats.retries)]
    {
        for h in histograms.iter() {
            let mut counts = h.counts.clone();
            counts.extend([h.count, h.sum]);
            series.insert((family, op_labels(h.operation, h.service_type)), counts);
        }
    }
    for (family, label, named) in [
        ("service_operations_parked", "reason", &stats.parked),
        ("delete_substep_failures", "step", &stats.delete_substep_failures),
    ] {
        for n in named.iter() {
            series.insert((family, vec![(label, n.name.clone())]), vec![n.count]);
        }
    }
    // Upstream's reason and step that this controller never reaches, shown at zero.
    series
        .entry(("service_operations_parked", vec![("reason", "retries_exceeded".to_owned())]))
        .or_insert_with(|| vec![0]);
    series
        .entry(("delete_substep_failures", vec![("step", "remove_backend_pool".to_owned())]))
        .or_insert_with(|| vec![0]);
    series.insert(("orphaned_resources_cleaned", Labels::new()), vec![stats.orphans_cleaned]);
    series.insert(("location_sync_terminal_errors", Labels::new()), vec![stats.location_sync_terminal_errors]);
    series
}

impl Figures {
    /// The serving version's latest figures, read at `read_at_ms`.
    pub fn update(&mut self, sha256: &str, stats: wit::TrackerStats, read_at_ms: u64) {
        let now = counts(&stats);
        let decreased = self.last.iter().any(|(key, last)| {
            now.get(key).is_none_or(|values| values.len() != last.len() || values.iter().zip(last).any(|(n, l)| n < l))
        });
        if decreased {
            for (key, last) in std::mem::take(&mut self.last) {
                let base = self.base.entry(key).or_insert_with(|| vec![0; last.len()]);
                if base.len() == last.len() {
                    base.iter_mut().zip(&last).for_each(|(b, l)| *b += l);
                }
            }
        }
        self.last = now;
        self.sha256 = sha256.to_owned();
        self.read_at_ms = read_at_ms;
        self.stats = Some(stats);
    }

    /// A series' total: the base carried over plus the latest figures.
    fn totals(&self) -> Series {
        let mut totals = self.base.clone();
        for (key, values) in &self.last {
            let total = totals.entry(key.clone()).or_insert_with(|| vec![0; values.len()]);
            if total.len() == values.len() {
                total.iter_mut().zip(values).for_each(|(t, v)| *t += v);
            } else {
                *total = values.clone();
            }
        }
        totals
    }

    /// Upstream's families and ours, if figures have been read; ages are taken at `now_ms`.
    /// `others` (a candidate in shadow: its figures and sha256) are shown in ours beside the
    /// serving version's, never in upstream's.
    pub fn encode(
        &self,
        out: &mut DescriptorEncoder<'_>,
        version: &str,
        now_ms: u64,
        others: &[(&wit::TrackerStats, &str)],
    ) -> std::fmt::Result {
        let Some(stats) = &self.stats else { return Ok(()) };
        let name = |family: &str| format!("{UPSTREAM}_{family}");
        let by_state = |p: &wit::PendingOperations| {
            vec![("state", state(p.state).to_owned()), ("service_type", service_type(p.service_type).to_owned())]
        };
        gauges(
            out,
            &name("pending_service_operations"),
            "Operations in progress on load balancers and NAT gateways, by state and service type.",
            stats.pending.iter().map(|p| (by_state(p), f64::from(p.count))),
        )?;
        gauges(
            out,
            &name("pending_operation_oldest_age_seconds"),
            "Age in seconds of the oldest pending operation, by state and service type.",
            stats.pending.iter().map(|p| {
                let age = p.oldest_began_ms.map_or(0.0, |began| now_ms.saturating_sub(began) as f64 / 1000.0);
                (by_state(p), age)
            }),
        )?;
        let plain = [
            (
                "pending_deletions",
                "Services pending deletion, waiting for their locations to be cleaned up.",
                f64::from(stats.pending_deletions),
            ),
            (
                "services_blocked_by_locations",
                "Services whose deletion waits for NRP to drop their addresses.",
                f64::from(stats.blocked_by_locations),
            ),
            (
                "locations_total",
                "Locations (nodes) NRP holds, as the tracker's mirror has them.",
                f64::from(stats.nrp_locations),
            ),
            ("addresses_total", "Pod addresses NRP holds across all locations.", f64::from(stats.nrp_addresses)),
            (
                "servicegateway_enabled",
                "Whether the configuration is the Container Load Balancer's (1) or not (0).",
                f64::from(u8::from(stats.service_gateway_enabled)),
            ),
            (
                "initialization_duration_seconds",
                "How long start-up took (0 until it has ended).",
                stats.initialized_after_ms.map_or(0.0, |ms| ms as f64 / 1000.0),
            ),
        ];
        for (family, help, value) in plain {
            gauges(out, &name(family), help, [(Labels::new(), value)])?;
        }
        gauges(
            out,
            &name("tracked_services_total"),
            "Services tracked: k8s_services (provisioned now), nrp_loadbalancers and nrp_natgateways (registered in NRP).",
            [
                ("k8s_services", stats.k8s_services),
                ("nrp_loadbalancers", stats.nrp_load_balancers),
                ("nrp_natgateways", stats.nrp_nat_gateways),
            ]
            .map(|(state, n)| (vec![("state", state.to_owned())], f64::from(n))),
        )?;

        let totals = self.totals();
        let family = |f: &'static str| totals.iter().filter(move |((name, _), _)| *name == f).map(|((_, l), v)| (l, v));
        let counter_families = [
            (
                "service_operations",
                "Service operation attempts by result, error code and orphan status; a retried operation records one attempt per try.",
            ),
            ("service_operations_parked", "Service operations parked without completing, by reason."),
            ("delete_substep_failures", "Delete sub-steps that failed and were gone past, by step."),
            ("orphaned_resources_cleaned", "Orphaned Azure resources (no Service) whose teardown finished."),
            (
                "location_sync_terminal_errors",
                "NRP location syncs set aside because NRP refused them with a code no retry fixes.",
            ),
        ];
        for (f, help) in counter_families {
            counters(out, &name(f), help, family(f).map(|(l, v)| (l.clone(), v[0])))?;
        }
        let mut zero: BTreeMap<&str, (&str, Vec<Labels>)> = BTreeMap::new();
        for (f, help, labels) in ALWAYS_ZERO {
            let entry = zero.entry(f).or_insert((help, Vec::new()));
            entry.1.push(labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect());
        }
        for (f, (help, labels)) in zero {
            counters(out, &name(f), help, labels.into_iter().map(|l| (l, 0)))?;
        }
        for (f, help, bounds, scale) in [
            (
                "service_operation_duration_seconds",
                "Duration of one service operation attempt in seconds.",
                &DURATION_BOUNDS_S[..],
                1000.0,
            ),
            (
                "service_operation_retries",
                "Retries before a service operation succeeded or parked.",
                &RETRY_BOUNDS[..],
                1.0,
            ),
        ] {
            let samples = family(f).filter(|(_, v)| v.len() == bounds.len() + 2).map(|(l, v)| {
                let (count, sum) = (v[bounds.len()], v[bounds.len() + 1]);
                let mut buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(v.iter().copied()).collect();
                let within: u64 = buckets.iter().map(|(_, n)| n).sum();
                buckets.push((f64::INFINITY, count.saturating_sub(within)));
                (l.clone(), ConstHistogram { sum: sum as f64 / scale, count, buckets })
            });
            family_of(out, &name(f), help, samples)?;
        }

        let mut versions = vec![(stats, version.to_owned(), self.sha256.clone())];
        versions.extend(
            others.iter().map(|(stats, sha256)| (*stats, sha256.chars().take(12).collect(), (*sha256).to_owned())),
        );
        encode_ours(out, &versions)
    }
}

/// Ours, with the labels of the version that reported them: the serving version's, and a
/// candidate's in shadow beside it.
fn encode_ours(out: &mut DescriptorEncoder<'_>, versions: &[(&wit::TrackerStats, String, String)]) -> std::fmt::Result {
    let labels = |version: &str, sha256: &str, extra: Option<(&'static str, &str)>| {
        let mut labels: Labels = vec![("version", version.to_owned()), ("sha256", sha256.to_owned())];
        labels.extend(extra.map(|(k, v)| (k, v.to_owned())));
        labels
    };
    gauges(
        out,
        "clb_logic_commands_in_flight",
        "Commands the logic issued that are not answered yet, by logic version.",
        versions.iter().map(|(s, v, sha)| (labels(v, sha, None), f64::from(s.commands_in_flight))),
    )?;
    gauges(
        out,
        "clb_logic_pod_finalizers_held",
        "Egress pods holding the logic's finalizer, by logic version.",
        versions.iter().map(|(s, v, sha)| (labels(v, sha, None), f64::from(s.pod_finalizers_held))),
    )?;
    gauges(
        out,
        "clb_logic_write_budget_tokens",
        "Writes each write budget would allow now (arm-pace: ARM's own figures, below zero when other clients spent ARM's bucket), by logic version.",
        versions.iter().flat_map(|(s, v, sha)| {
            s.budgets.iter().map(move |b| (labels(v, sha, Some(("bucket", &b.bucket))), b.tokens as f64))
        }),
    )?;
    gauges(
        out,
        "clb_logic_write_budget_per_minute",
        "Each write budget's refill rate now (less than configured after a 429), by logic version.",
        versions.iter().flat_map(|(s, v, sha)| {
            s.budgets.iter().map(move |b| (labels(v, sha, Some(("bucket", &b.bucket))), f64::from(b.per_minute)))
        }),
    )
}

impl Figures {
    /// What [`Self::encode`] writes, alone, as `/metrics` prints it (for `simulate`'s
    /// `expect.metrics` and the tests).
    pub fn exposition(&self, version: &str, now_ms: u64) -> String {
        #[derive(Debug)]
        struct Alone(Figures, String, u64);
        impl prometheus_client::collector::Collector for Alone {
            fn encode(&self, mut out: DescriptorEncoder<'_>) -> std::fmt::Result {
                self.0.encode(&mut out, &self.1, self.2, &[])
            }
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Alone(self.clone(), version.to_owned(), now_ms)));
        let mut text = String::new();
        // Encoding into a String fails only if the collector does, and it writes to it alone.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// A histogram whose counts were taken elsewhere. `buckets` are per bucket (not cumulative),
/// the last one `+Inf`.
#[derive(Debug)]
struct ConstHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl prometheus_client::metrics::TypedMetric for ConstHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A counter family (`name` without the `_total` the encoding appends) of these samples.
pub fn counters(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    family_of(out, name, help, samples.into_iter().map(|(labels, value)| (labels, ConstCounter::new(value))))
}

fn gauges(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, f64)>,
) -> std::fmt::Result {
    family_of(out, name, help, samples.into_iter().map(|(labels, value)| (labels, ConstGauge::new(value))))
}

/// One family: its descriptor, then a sample per label set (none without samples).
pub fn family_of<M: EncodeMetric>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (Labels, M)>,
) -> std::fmt::Result {
    let mut samples = samples.peekable();
    let kind = match samples.peek() {
        Some((_, metric)) => metric.metric_type(),
        None => return Ok(()),
    };
    let mut encoder = out.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in samples {
        metric.encode(encoder.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Figures with nothing in them, for tests to fill in (this crate's and the operator page's).
pub fn zero_stats() -> wit::TrackerStats {
    wit::TrackerStats {
        service_gateway_enabled: false,
        pending: Vec::new(),
        k8s_services: 0,
        nrp_load_balancers: 0,
        nrp_nat_gateways: 0,
        nrp_locations: 0,
        nrp_addresses: 0,
        pending_deletions: 0,
        blocked_by_locations: 0,
        pod_finalizers_held: 0,
        commands_in_flight: 0,
        attempts: Vec::new(),
        durations: Vec::new(),
        retries: Vec::new(),
        parked: Vec::new(),
        orphans_cleaned: 0,
        delete_substep_failures: Vec::new(),
        location_sync_terminal_errors: 0,
        initialized_after_ms: None,
        budgets: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(attempts: u64) -> wit::TrackerStats {
        let attempt = wit::AttemptCount {
            operation: wit::Operation::Create,
            service_type: wit::ServiceType::Inbound,
            success: true,
            error_code: String::new(),
            orphan: false,
            count: attempts,
        };
        wit::TrackerStats { service_gateway_enabled: true, attempts: vec![attempt], ..zero_stats() }
    }

    fn successes(figures: &Figures) -> u64 {
        figures.totals().iter().find(|((f, _), _)| *f == "service_operations").map_or(0, |(_, v)| v[0])
    }

    #[test]
    fn the_upstream_counters_never_go_back_when_a_new_tracker_starts_counting_from_zero_and_a_swap_adds_nothing_twice()
    {
        let mut figures = Figures::default();
        figures.update("a", stats(5), 0);
        figures.update("a", stats(7), 1);
        assert_eq!(successes(&figures), 7);
        // A rebuild of the same version: its counts start again.
        figures.update("a", stats(2), 2);
        assert_eq!(successes(&figures), 9);
        // A swap carries the counts on (they are state): nothing is added twice.
        figures.update("b", stats(4), 3);
        assert_eq!(successes(&figures), 11);
        figures.update("b", stats(6), 4);
        assert_eq!(successes(&figures), 13);
    }
}
