//! `clb-host explore`: deterministic fault exploration. A scenario runs once as written (the
//! reference), then once per perturbation, each a fresh run through a fresh logic, and the world
//! each run leaves is compared with the reference's.
//!
//! The classes (docs/testing.md, "Exploration"; each perturbation is described in
//! [`crate::perturbation`]):
//!
//! * **crash** — at every command boundary the controller dies and a new one starts from the
//!   cluster and Azure alone: before the command is sent, or after Azure (or the API server)
//!   applied it and before its answer reached the logic. A Kubernetes follow-up (finalizer,
//!   status, Event) is a command of its own, so a crash between an Azure write and its follow-up
//!   is among them. In multi-SLB local-service mode, where the backend-pool updater writes, also
//!   before every tick of it;
//! * **stale** — the controller dies before a delivery of watch events and the new one's lists
//!   are the cluster as it was at any earlier delivery; the watch then brings what changed since;
//! * **unobserved** — a delivery held back and coalesced with the next (intermediate states
//!   never seen), one event lost and a re-list bringing the truth later, a delivery twice, the
//!   objects of a delivery in reverse order;
//! * **swap** — at every call into the logic, the logic is swapped to a rebuilt copy of itself:
//!   the state move must be invisible;
//! * **failover** — at every command boundary the leader loses its lease with that command in
//!   flight; the other replica takes over from the cluster and Azure, and the command lands after
//!   it did. In multi-SLB local-service mode also at every group of every backend-pool tick,
//!   with that group's write in flight, landing after the successor's first tick.
//!
//! Every point is explored up to `budget` per class and scenario; past it, `budget` points drawn
//! by the seed. The oracle: the perturbed run ends (it may not abort); after both runs had the
//! time to settle, Azure's resources and the Kubernetes objects the controller writes equal the
//! reference's ([`World`]); and every invariant of `expect: {invariants: true}` that holds after
//! the reference holds after the perturbed run too (those over the run's history — the outbound
//! order, no service unregistered while addresses reference it, no egress pod released before
//! its addresses left NRP — cover every step, not only the end). A scenario's `expect` steps are
//! not the oracle: a crash makes retries that change counts and timings mid-run, which is
//! allowed; what the world ends as is not.

pub use crate::perturbation::{Class, Perturbation, PerturbationError};
use crate::scenario::Scenario;
use crate::simulate::{Check, Ran, Reconciler, RunOptions, SimulateError, run_with};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Why an exploration could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExploreError {
    #[error(transparent)]
    Simulate(#[from] SimulateError),
    #[error("reproducer file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the reproducer {0} does not read back as a scenario naming its perturbation: {1}")]
    Reproducer(PathBuf, String),
}

/// How to explore.
#[derive(Clone, Debug)]
pub struct Options {
    pub classes: Vec<Class>,
    /// Perturbations per class and scenario; past it, a sample drawn by `seed`.
    pub budget: usize,
    pub seed: u64,
    /// The virtual time every run gets after its last step to settle.
    pub settle_ms: u64,
    /// Only this perturbation (a reproducer), whatever the classes and budget say.
    pub only: Option<Perturbation>,
}

/// The default settling time after the last step: longer than any retry's backoff, and six of
/// the logic's periodic reads of NRP.
pub const DEFAULT_SETTLE_MS: u64 = 30 * 60 * 1000;

/// What one class found on one scenario.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassFigures {
    /// Points of the reference run where a perturbation of the class fits.
    pub points: u64,
    /// Perturbations run.
    pub explored: u64,
    pub divergences: u64,
}

/// A perturbed run whose world is not the reference's, or that did not end.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Divergence {
    pub perturbation: String,
    /// What differs, one line each (at most [`MAX_DIFFERENCES`]), or why the run did not end.
    pub differences: Vec<String>,
}

/// The most differences a divergence lists.
pub const MAX_DIFFERENCES: usize = 20;

/// One scenario explored.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Exploration {
    pub scenario: String,
    pub path: String,
    /// Why the reference run itself failed (aborted, a check failed): nothing was explored.
    pub reference_failed: Option<String>,
    pub classes: BTreeMap<&'static str, ClassFigures>,
    pub divergences: Vec<Divergence>,
    /// With [`Options::only`], that run's report, as `simulate` shows it.
    #[serde(skip)]
    pub only_report: Option<crate::simulate::ScenarioReport>,
}

/// Explores one scenario; `logic` makes a fresh logic for each run.
pub fn explore<R: Reconciler>(
    scenario: &Scenario,
    mut logic: impl FnMut() -> R,
    options: &Options,
) -> Result<Exploration, ExploreError> {
    let settle = RunOptions { perturbation: None, settle_at_end_ms: Some(options.settle_ms) };
    let reference = run_with(scenario, &mut logic(), &settle)?;
    let mut exploration = Exploration {
        scenario: scenario.name.clone(),
        path: scenario.path.display().to_string(),
        reference_failed: None,
        classes: BTreeMap::new(),
        divergences: Vec::new(),
        only_report: None,
    };
    if let Some(why) = failed(&reference) {
        exploration.reference_failed = Some(why);
        return Ok(exploration);
    }
    let expected = World::of(&reference);
    let only = options.only.or(scenario.perturbation);
    let (chosen, classes): (Vec<Perturbation>, Vec<Class>) = match only {
        Some(only) => (vec![only], vec![Class::of(only)]),
        None => (
            options.classes.iter().flat_map(|class| choose(*class, &reference, options)).collect(),
            options.classes.clone(),
        ),
    };
    for class in &classes {
        let figures = exploration.classes.entry(class.name()).or_default();
        figures.points = points(*class, &reference).len() as u64;
    }
    for perturbation in chosen {
        let run = RunOptions { perturbation: Some(perturbation), ..settle.clone() };
        let ran = run_with(scenario, &mut logic(), &run)?;
        let figures = exploration.classes.entry(Class::of(perturbation).name()).or_default();
        figures.explored += 1;
        let differences = match &ran.report.aborted {
            Some(aborted) => vec![format!("aborted: {aborted}")],
            None if !ran.perturbed => vec![format!("the run never reached {perturbation}")],
            None => {
                let mut differences = broken_invariants(&reference.invariants, &ran.invariants);
                differences.extend(expected.differences(&World::of(&ran)));
                differences.truncate(MAX_DIFFERENCES);
                differences
            }
        };
        if !differences.is_empty() {
            figures.divergences += 1;
            exploration.divergences.push(Divergence { perturbation: perturbation.to_string(), differences });
        }
        if only.is_some() {
            exploration.only_report = Some(ran.report);
        }
    }
    Ok(exploration)
}

/// A divergence's reproducer: the scenario's own text, `perturbation:` added, under a comment
/// that says what it reproduces. `clb-host explore` of it runs that perturbation alone; fixed,
/// it is the defect's regression scenario.
pub fn reproducer(exploration: &Exploration, divergence: &Divergence, scenario_text: &str) -> String {
    let mut text =
        format!("# Reproduces what `clb-host explore` found in {} at {}:\n", exploration.path, divergence.perturbation);
    for line in &divergence.differences {
        text.push_str(&format!("#   {}\n", line.replace('\n', " ")));
    }
    text.push_str(
        "# `clb-host explore` of this file runs that perturbation alone and compares the world with the\n\
         # unperturbed run's; `clb-host simulate` of it shows the perturbed run step by step.\n",
    );
    text.push_str(scenario_text.trim_end());
    text.push_str(&format!("\nperturbation: {}\n", divergence.perturbation));
    text
}

/// Writes each divergence's [`reproducer`] into `dir` (created if missing), as
/// `<scenario file's stem>.<perturbation>.yaml`, and checks that it reads back as a scenario
/// naming its perturbation.
pub fn write_reproducers(dir: &Path, exploration: &Exploration) -> Result<Vec<PathBuf>, ExploreError> {
    if exploration.divergences.is_empty() {
        return Ok(Vec::new());
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ExploreError::Io { path, source }
    };
    let source = Path::new(&exploration.path);
    let text = std::fs::read_to_string(source).map_err(io(source))?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let stem = source.file_stem().and_then(|s| s.to_str()).unwrap_or("scenario");
    let mut written = Vec::new();
    for divergence in &exploration.divergences {
        let path = dir.join(format!("{stem}.{}.yaml", divergence.perturbation.replace(':', "-")));
        std::fs::write(&path, reproducer(exploration, divergence, &text)).map_err(io(&path))?;
        let named = crate::scenario::read(&path)
            .map_err(|e| ExploreError::Reproducer(path.clone(), e.to_string()))?
            .perturbation
            .map(|p| p.to_string());
        if named.as_deref() != Some(divergence.perturbation.as_str()) {
            let why = format!("it names {named:?} (does the scenario end inside a block?)");
            return Err(ExploreError::Reproducer(path, why));
        }
        written.push(path);
    }
    Ok(written)
}

/// Why the reference run failed: it aborted, or one of its checks failed.
fn failed(ran: &Ran) -> Option<String> {
    if let Some(aborted) = &ran.report.aborted {
        return Some(format!("aborted: {aborted}"));
    }
    let failed: Vec<String> = ran
        .report
        .steps
        .iter()
        .flat_map(|s| s.checks.iter().filter(|c| !c.ok).map(move |c| format!("step {}: {}", s.index, c.what)))
        .collect();
    (!failed.is_empty()).then(|| format!("checks failed: {}", failed.join("; ")))
}

/// The invariants that held after the reference and not after the perturbed run.
fn broken_invariants(reference: &[Check], perturbed: &[Check]) -> Vec<String> {
    let held: BTreeSet<&str> = reference.iter().filter(|c| c.ok).map(|c| c.what.as_str()).collect();
    perturbed
        .iter()
        .filter(|c| !c.ok && held.contains(c.what.as_str()))
        .map(|c| format!("invariant broken: {}: {}", c.what, c.detail.as_deref().unwrap_or("")))
        .collect()
}

/// Every perturbation of `class` the reference run has a point for.
fn points(class: Class, reference: &Ran) -> Vec<Perturbation> {
    use Perturbation::*;
    let points = &reference.points;
    let deliveries = points.deliveries.len() as u64;
    match class {
        Class::Crash => (0..points.commands)
            .flat_map(|n| [CrashBefore(n), CrashAfter(n)])
            .chain((0..points.pool_ticks).map(CrashBeforePoolTick))
            .chain(
                (0..)
                    .zip(&points.pool_groups)
                    .flat_map(|(tick, &groups)| (1..groups).map(move |after| CrashInPoolTick { tick, after })),
            )
            .collect(),
        Class::Stale => (0..deliveries).flat_map(|at| (0..=at).map(move |listed_at| Stale { at, listed_at })).collect(),
        Class::Unobserved => (0..deliveries)
            .zip(&points.deliveries)
            .flat_map(|(n, delivery)| {
                let drops = (0..delivery.events).map(move |event| Drop { delivery: n, event });
                [Coalesce(n), Duplicate(n)].into_iter().chain((delivery.objects > 1).then_some(Reorder(n))).chain(drops)
            })
            .collect(),
        Class::Swap => (0..points.inputs).map(Swap).collect(),
        Class::Failover => (0..points.commands)
            .map(Failover)
            .chain(
                (0..)
                    .zip(&points.pool_groups)
                    .flat_map(|(tick, &groups)| (0..groups).map(move |group| FailoverInPoolTick { tick, group })),
            )
            .collect(),
    }
}

/// The points of `class` to explore: all of them within the budget, else `budget` drawn by the
/// seed (a partial Fisher–Yates shuffle on splitmix64), in the order of the run.
fn choose(class: Class, reference: &Ran, options: &Options) -> Vec<Perturbation> {
    let mut all = points(class, reference);
    if all.len() <= options.budget {
        return all;
    }
    let mut state = options.seed ^ (class as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(state)
    };
    for i in 0..options.budget {
        let j = i + (next() % (all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(options.budget);
    all.sort();
    all
}

/// splitmix64's finaliser: a well-mixed draw from a seed, the same on every machine.
pub fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the oracle compares, one line per fact: Azure's resources as the emulator holds them
/// (etags, which every write changes, left out; a public IP's address too, which the order of
/// allocation decides; a load balancer's pools and a pool's addresses as sets, their order being
/// the order of the writes), and the Kubernetes objects the controller writes (each Service's and
/// Pod's finalizers, whether it is being deleted, and a Service's `status.loadBalancer` as the
/// names of the public IPs its addresses belong to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World(BTreeSet<String>);

impl World {
    pub fn of(ran: &Ran) -> World {
        let resources = ran.emulator.resources();
        let mut lines = BTreeSet::new();
        for (name, service) in &resources.services {
            lines.insert(format!("nrp service {name}: {}", json(service)));
        }
        for (location, addresses) in &resources.locations {
            for (address, services) in addresses {
                lines.insert(format!("nrp location {location} address {address}: {services:?}"));
            }
        }
        let mut ip_names = BTreeMap::new();
        for (name, ip) in &resources.public_ips {
            ip_names.insert(ip.ip_address.clone(), name.clone());
            lines.insert(format!("public ip {name}: {:?} tags {:?}", ip.version, ip.tags));
        }
        for (name, lb) in &resources.load_balancers {
            // The order of a load balancer's pools and of a pool's addresses means nothing to
            // Azure; the order of the writes decides it, and a perturbation may reorder those.
            let pools: BTreeSet<&String> = lb.backend_pools.iter().collect();
            let (frontends, pools, rules) = (json(&lb.frontends), json(&pools), json(&lb.rules));
            lines.insert(format!(
                "load balancer {name} ({}): frontends {frontends} pools {pools} rules {rules}",
                lb.sku
            ));
        }
        for (key, pool) in &resources.backend_pools {
            let addresses: BTreeSet<String> = pool.addresses.iter().map(json).collect();
            lines.insert(format!("backend pool {key}: {addresses:?} {}", json(&pool.other_properties)));
        }
        for (name, gateway) in &resources.nat_gateways {
            lines.insert(format!(
                "nat gateway {name} ({}): {:?} {:?} associated {}",
                gateway.sku, gateway.public_ips, gateway.public_ips_v6, gateway.associated
            ));
        }
        for service in ran.cluster.services() {
            let meta = &service.metadata;
            let ingress: Vec<String> = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .map(|i| {
                    let ip = i.ip.clone().unwrap_or_default();
                    ip_names.get(&ip).cloned().unwrap_or_else(|| format!("{ip} (no public IP has it)"))
                })
                .collect();
            lines.insert(format!("{} ingress {ingress:?}", object_line("service", meta)));
        }
        lines.extend(ran.cluster.pods().iter().map(|pod| object_line("pod", &pod.metadata)));
        World(lines)
    }

    /// What differs from `other`, at most [`MAX_DIFFERENCES`] lines.
    pub fn differences(&self, other: &World) -> Vec<String> {
        let missing = self.0.difference(&other.0).map(|l| format!("only in the reference: {l}"));
        let extra = other.0.difference(&self.0).map(|l| format!("only after the perturbation: {l}"));
        missing.chain(extra).take(MAX_DIFFERENCES).collect()
    }
}

/// What the controller writes on a Kubernetes object, as the start of one line of [`World`].
fn object_line(kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{kind} {}/{}: finalizers {:?} deleting {}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
        meta.finalizers.as_deref().unwrap_or_default(),
        meta.deletion_timestamp.is_some()
    )
}

/// A record of the emulator's as one line of [`World`].
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<{e}>"))
}
