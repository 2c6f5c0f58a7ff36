//! What a run reports: the commands and their outcomes, the checks, the NRP view, and the text
//! `clb-host simulate` prints (`--json` prints the same records).

use crate::cluster::RecordedEvent;
use crate::scenario;
use clb_azure::Operation;
use clb_emulator::Resources;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::command_name;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

/// NRP's address locations: location → address → services.
pub type NrpLocations = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// One command the guest issued and what came of it.
#[derive(Clone, Debug, Serialize)]
pub struct CommandRecord {
    pub at_ms: u64,
    pub id: u64,
    /// One line for people.
    pub line: String,
    pub outcome: String,
    /// The whole command, for comparing command streams exactly.
    pub detail: String,
}

/// One expectation and whether it held.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    /// What was found instead, when it did not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub index: usize,
    pub summary: String,
    pub at_ms: u64,
    pub commands: Vec<CommandRecord>,
    /// Emulator requests a fault (or ARM's throttling) answered.
    pub faults_hit: Vec<String>,
    /// What `explore`'s perturbation did in this step (`crate::perturbation`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub perturbed: Vec<String>,
    /// Inputs the logic trapped on, dropped so that the rest could go on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// What the backend-pool producer enqueued and what the updater's ticks did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_pools: Vec<String>,
    pub checks: Vec<Check>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NrpView {
    pub services: BTreeSet<String>,
    pub locations: NrpLocations,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub path: String,
    pub steps: Vec<StepReport>,
    pub final_nrp: NrpView,
    /// Azure calls the emulator answered in the whole run, per operation (faulted ones too).
    pub azure_calls: BTreeMap<String, u64>,
    /// What ARM last reported of the subscription's write tokens left
    /// (`x-ms-ratelimit-remaining-subscription-writes`); absent when unlimited or no write ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm_remaining_writes: Option<u32>,
    /// ARM's 429s for an empty subscription bucket, per operation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub throttled: BTreeMap<String, u64>,
    pub events: Vec<RecordedEvent>,
    /// The logic's own figures at the end of the run (`tracker.stats`), if the logic tells them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<wit::TrackerStats>,
    /// Why the run stopped early (the logic trapped or refused the configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    pub passed: bool,
}

impl ScenarioReport {
    /// Every command of the run, in order: what the differential test compares.
    pub fn command_stream(&self) -> Vec<&str> {
        self.steps.iter().flat_map(|s| &s.commands).map(|c| c.detail.as_str()).collect()
    }

    /// What the backend-pool producer enqueued and what the updater's ticks did, in order: what
    /// the differential test compares in multi-SLB local-service mode, where the tracker sends
    /// no commands.
    pub fn pool_stream(&self) -> Vec<&str> {
        self.steps.iter().flat_map(|s| &s.backend_pools).map(String::as_str).collect()
    }
}

/// Registered inbound services (not the RP's default) and the locations, as NRP holds them.
pub fn nrp_view(resources: &Resources) -> NrpView {
    NrpView {
        services: resources
            .services
            .iter()
            .filter(|(_, s)| s.service_type.eq_ignore_ascii_case("Inbound") && !s.is_default)
            .map(|(name, _)| name.clone())
            .collect(),
        locations: resources.locations.clone(),
    }
}

/// Milliseconds of virtual time, printed as in the scenario files.
pub(super) struct Ms(pub(super) u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        scenario::format_ms(self.0, f)
    }
}

pub(super) fn locations_text(locations: &NrpLocations) -> String {
    if locations.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = locations
        .iter()
        .map(|(location, addresses)| {
            let addresses: Vec<String> = addresses
                .iter()
                .map(|(a, s)| format!("{a}→{}", s.iter().cloned().collect::<Vec<_>>().join("+")))
                .collect();
            format!("{location}: {}", addresses.join(" "))
        })
        .collect();
    format!("{{{}}}", parts.join("; "))
}

/// The run's Azure writes per operation (what ARM's and NRP's write budgets count), its reads
/// and its Events, on one line.
pub fn calls_text(calls: &BTreeMap<String, u64>, events: usize) -> String {
    let is_write = |name: &str| Operation::ALL.iter().any(|op| op.name() == name && op.is_write());
    let (writes, reads): (Vec<_>, Vec<_>) = calls.iter().partition(|(name, _)| is_write(name));
    let total: u64 = writes.iter().map(|(_, n)| *n).sum();
    let reads: u64 = reads.iter().map(|(_, n)| *n).sum();
    let writes: Vec<String> = writes.iter().map(|(name, n)| format!("{name} {n}")).collect();
    let detail = if writes.is_empty() { String::new() } else { format!(" ({})", writes.join(", ")) };
    format!("Azure writes: {total}{detail}; reads: {reads}; Events: {events}")
}

/// What ARM last reported of the write tokens left and the 429s of its throttling, on one
/// line; `None` when there is neither (an unlimited emulator).
pub fn arm_text(remaining_writes: Option<u32>, throttled: &BTreeMap<String, u64>) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(left) = remaining_writes {
        parts.push(format!("{left} writes left"));
    }
    if !throttled.is_empty() {
        let counts: Vec<String> = throttled.iter().map(|(name, n)| format!("{name} {n}")).collect();
        parts.push(format!("throttled (429): {}", counts.join(", ")));
    }
    (!parts.is_empty()).then(|| format!("ARM: {}", parts.join("; ")))
}

/// One line per command, for the report.
pub fn describe_command(command: &wit::Command) -> String {
    let name = command_name(command);
    let object = |r: &wit::ObjectRef| format!("{}/{}", r.namespace, r.name);
    let rest = match command {
        wit::Command::ReadNrp | wit::Command::ReadArm => String::new(),
        wit::Command::EmitEvent(e) => {
            let kind = if e.event_type == wit::EventType::Warning { "Warning" } else { "Normal" };
            format!("{kind} {} {}", e.reason, object(&e.regarding))
        }
        wit::Command::UpdateServices(u) => u
            .services
            .iter()
            .map(|s| {
                let what = if s.is_delete {
                    "unregister".to_owned()
                } else if let Some(nat) = &s.public_nat_gateway {
                    format!("register → NAT gateway {nat}")
                } else if s.backend_pools.is_empty() {
                    "unlink".to_owned()
                } else {
                    let pools: Vec<String> =
                        s.backend_pools.iter().map(|p| format!("{}/{}", p.load_balancer, p.pool)).collect();
                    format!("register → {}", pools.join(", "))
                };
                format!("{} {what}", s.name)
            })
            .collect::<Vec<_>>()
            .join("; "),
        wit::Command::UpdateAddressLocations(u) => u
            .locations
            .iter()
            .map(|l| {
                let action = match l.action {
                    wit::UpdateAction::PartialUpdate => "",
                    wit::UpdateAction::FullUpdate => " (full)",
                };
                if l.addresses.is_empty() {
                    return format!("{}: remove", l.location);
                }
                let addresses: Vec<String> = l
                    .addresses
                    .iter()
                    .map(|a| {
                        if a.services.is_empty() {
                            format!("{}→∅", a.address)
                        } else {
                            format!("{}→{}", a.address, a.services.join("+"))
                        }
                    })
                    .collect();
                format!("{}{action}: {}", l.location, addresses.join(" "))
            })
            .collect::<Vec<_>>()
            .join("; "),
        wit::Command::PutPublicIp(ip) => {
            format!("{} {}", ip.name, if ip.version == wit::IpVersion::Ipv6 { "IPv6" } else { "IPv4" })
        }
        wit::Command::PutLoadBalancer(lb) => {
            let rules: Vec<String> = lb
                .rules
                .iter()
                .map(|r| {
                    let protocol = if r.protocol == wit::LbProtocol::Udp { "udp" } else { "tcp" };
                    format!("{protocol} {}→{}", r.frontend_port, r.backend_port)
                })
                .collect();
            format!("{} on {} [{}]", lb.name, lb.public_ip, rules.join(", "))
        }
        wit::Command::PutNatGateway(n) => {
            let ips: Vec<&String> = n.public_ips.iter().chain(&n.public_ips_v6).collect();
            let ips: Vec<&str> = ips.iter().map(|s| s.as_str()).collect();
            format!("{} on {} ({})", n.name, ips.join(", "), if n.associated { "associated" } else { "disassociated" })
        }
        wit::Command::DeleteResource(r) => {
            let kind = match r.kind {
                wit::ResourceKind::PublicIp => "public-ip",
                wit::ResourceKind::LoadBalancer => "load-balancer",
                wit::ResourceKind::NatGateway => "nat-gateway",
            };
            format!("{kind} {}", r.name)
        }
        wit::Command::PatchServiceStatus(s) => format!("{} ingress {:?}", object(&s.service), s.ingress_ips),
        wit::Command::SetFinalizer(f) => {
            format!("{} {}{}", object(&f.service), if f.present { "+" } else { "-" }, f.finalizer)
        }
    };
    if rest.is_empty() { name.to_owned() } else { format!("{name} {rest}") }
}

pub fn describe_outcome(outcome: &wit::Outcome) -> String {
    match outcome {
        wit::Outcome::Ok => "ok".into(),
        wit::Outcome::PublicIpAddress(ip) => ip.clone(),
        wit::Outcome::NrpSnapshot(s) => {
            format!("snapshot: {} services, {} locations", s.services.len(), s.locations.len())
        }
        wit::Outcome::ArmInventory(i) => {
            format!(
                "inventory: {} public IPs, {} load balancers, {} NAT gateways",
                i.public_ips.len(),
                i.load_balancers.len(),
                i.nat_gateways.len()
            )
        }
        wit::Outcome::Failed(f) => {
            let mut text = format!("failed {}", f.status);
            if let Some(code) = &f.code {
                let _ = write!(text, " {code}");
            }
            if let Some(ms) = f.retry_after_ms {
                let _ = write!(text, " (retry after {})", Ms(ms));
            }
            text
        }
    }
}

/// The report as people read it.
/// The logic's own figures at the end of a run, in one line (the `/metrics` families they feed:
/// docs/operations.md, "What to scrape").
pub(super) fn figures_text(figures: &wit::TrackerStats) -> String {
    let pending: u32 = figures.pending.iter().map(|p| p.count).sum();
    let (mut succeeded, mut failed) = (0, 0);
    for attempt in &figures.attempts {
        *if attempt.success { &mut succeeded } else { &mut failed } += attempt.count;
    }
    let parked: u64 = figures.parked.iter().map(|p| p.count).sum();
    format!(
        "logic's figures: {} Services provisioned, {pending} operations pending; NRP holds {} locations, {} addresses; \
         operations: {succeeded} succeeded, {failed} failed attempts, {parked} parked",
        figures.k8s_services, figures.nrp_locations, figures.nrp_addresses
    )
}

pub fn render(report: &ScenarioReport, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(out, "scenario: {}  ({})", report.name, report.path)?;
    for step in &report.steps {
        writeln!(out, "  [{}] t={} {}", step.index, Ms(step.at_ms), step.summary)?;
        for c in &step.commands {
            writeln!(out, "      {:>8} #{} {} → {}", Ms(c.at_ms).to_string(), c.id, c.line, c.outcome)?;
        }
        for fault in &step.faults_hit {
            writeln!(out, "      fault hit: {fault}")?;
        }
        for line in &step.perturbed {
            writeln!(out, "      perturbed: {line}")?;
        }
        for input in &step.quarantined {
            writeln!(out, "      quarantined: {input}")?;
        }
        for line in &step.backend_pools {
            writeln!(out, "      backend pools: {line}")?;
        }
        for check in &step.checks {
            let mark = if check.ok { "✓" } else { "✗" };
            match &check.detail {
                Some(detail) => writeln!(out, "      {mark} {}: {detail}", check.what)?,
                None => writeln!(out, "      {mark} {}", check.what)?,
            }
        }
    }
    writeln!(out, "  final NRP: services {:?}", report.final_nrp.services)?;
    writeln!(out, "             locations {}", locations_text(&report.final_nrp.locations))?;
    writeln!(out, "  {}", calls_text(&report.azure_calls, report.events.len()))?;
    if let Some(line) = arm_text(report.arm_remaining_writes, &report.throttled) {
        writeln!(out, "  {line}")?;
    }
    if let Some(figures) = &report.figures {
        writeln!(out, "  {}", figures_text(figures))?;
    }
    if let Some(why) = &report.aborted {
        writeln!(out, "  ✗ aborted: {why}")?;
    }
    writeln!(out, "  result: {}", if report.passed { "PASS" } else { "FAIL" })
}
