//! `clb-host explore` and `clb_simulator::explore`: every scenario explored without a
//! divergence, a deliberately broken logic found with a reproducer, a failing reference reported
//! as such, and the command's flags.

use super::cli::clb_host;
use clb_host::cli::{EXIT_BAD_INPUT, EXIT_OK};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_simulator::explore::{self, Class, Options};
use clb_simulator::scenario;
use clb_simulator::simulate::{self, ComponentReconciler, LogicError};
use clb_tests::*;
use std::collections::BTreeMap;

fn options(budget: usize) -> Options {
    Options { classes: Class::ALL.to_vec(), budget, seed: 0, settle_ms: explore::DEFAULT_SETTLE_MS, only: None }
}

/// The built-in logic behind a supervisor.
fn component() -> ComponentReconciler<'static> {
    ComponentReconciler::new(builtin())
}

/// The budget CI explores with: every point of every scenario but the largest two's crashes.
const CI_BUDGET: usize = 200;

/// The product's scenarios, `examples/scenarios/`. Those under `tests/scenarios/` swap versions
/// and run candidates in shadow: a restart keeps the version serving while its probation starts
/// over, and a rebuild is a swap, which ends a probation; both change what those scenarios are
/// about, so they are not explored.
fn example_scenarios() -> Vec<std::path::PathBuf> {
    scenario_files().into_iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("examples/scenarios"))).collect()
}

#[test]
fn every_example_scenario_is_explored_with_every_class_and_no_perturbation_changes_the_world() {
    let mut failures = Vec::new();
    let scenarios = example_scenarios();
    assert!(scenarios.len() >= 50, "the example scenarios: {scenarios:?}");
    let (mut failover_explored, mut own) = (0, 0);
    for path in scenarios {
        let scenario = scenario::read(&path).unwrap();
        let exploration = explore::explore(&scenario, component, &options(CI_BUDGET)).unwrap();
        if let Some(why) = &exploration.reference_failed {
            failures.push(format!("{}: the reference failed: {why}", path.display()));
        }
        let explored = |class: Class| exploration.classes.get(class.name()).copied().unwrap_or_default();
        if let Some(perturbation) = scenario.perturbation {
            // A regression scenario of a divergence found once: its own perturbation, alone.
            own += 1;
            if explored(Class::of(perturbation)).explored != 1 || exploration.classes.len() != 1 {
                failures.push(format!("{}: not {perturbation} alone: {:?}", path.display(), exploration.classes));
            }
        } else {
            for class in Class::ALL {
                let figures = explored(class);
                // A scenario that sends no command has no point at which a leader can lose its
                // lease with one in flight; every other class fits every scenario.
                let fits = class != Class::Failover || figures.points > 0;
                if fits && figures.explored == 0 {
                    failures.push(format!("{}: no {} perturbation explored", path.display(), class.name()));
                }
            }
            failover_explored += explored(Class::Failover).explored;
        }
        for divergence in &exploration.divergences {
            failures.push(format!("{}: {}: {:?}", path.display(), divergence.perturbation, divergence.differences));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(failover_explored > 1_000, "{failover_explored} failover points explored");
    assert!(
        own >= 3,
        "the regression scenarios of the late unlink and the late pool creation carry their perturbation"
    );
}

/// The regression scenario of the one divergence exploration found in the product: a deposed
/// leader's `unlink` of an egress identity landed after the new leader had torn the identity
/// down, registering it again without its NAT gateway, which the new leader then took for
/// somebody else's.
fn late_unlink_scenario() -> std::path::PathBuf {
    example_scenarios()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-deposed-leaders-unlink-landing-after-its-successor"))
        .unwrap()
}

// Regression: a deposed leader's unlink landing after its successor's teardown left the
// identity registered for good (found by the failover class).
#[test]
fn a_deposed_leaders_late_unlink_lands_after_the_successor_took_over_says_so_and_changes_nothing_in_the_end() {
    let path = late_unlink_scenario();
    let scenario = scenario::read(&path).unwrap();
    let found = explore::explore(&scenario, component, &options(CI_BUDGET)).unwrap();
    assert!(found.divergences.is_empty(), "{:?}", found.divergences);
    let report = found.only_report.expect("the scenario's own perturbation's report");
    let lines: Vec<&String> = report.steps.iter().flat_map(|s| &s.perturbed).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].contains("loses its lease with update-services egress-b unlink in flight"), "{lines:#?}");
    assert_eq!(lines[1], "the deposed leader's update-services egress-b unlink lands → ok");

    // The command line: the scenario's perturbation alone, its run printed; nothing diverges,
    // so --write-repro writes nothing; a directory it cannot make is refused before any work.
    let scratch = scratch("explore-cli");
    let dir = scratch.join("repro");
    let path = path.to_str().unwrap();
    let (code, out, err) = clb_host(&["explore", path, "--write-repro", dir.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    assert!(out.contains("perturbed: the deposed leader's update-services egress-b unlink lands → ok"), "{out}");
    assert!(out.contains("\n  failover: 1 of ") && out.contains("points explored, 0 divergences"), "{out}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{err}");
    let (code, out, err) = clb_host(&["explore", path, "--write-repro", "/proc/no-such-dir"]);
    assert_eq!(code, EXIT_BAD_INPUT, "{err}");
    assert!(err.contains("reproducer directory /proc/no-such-dir") && out.is_empty(), "{out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

// Regression: a deposed leader's pool creation (a PUT without If-Match) landing after its
// successor wrote the pool replaced the pool's content until the Service changed again (found by
// the failover class within backend-pool ticks).
#[test]
fn a_deposed_leaders_pool_creation_lands_after_the_successors_first_tick_and_the_successors_recheck_puts_the_pool_right()
 {
    let path = example_scenarios()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-deposed-leaders-pool-creation-landing-after"))
        .unwrap();
    let scenario = scenario::read(&path).unwrap();
    let found = explore::explore(&scenario, component, &options(CI_BUDGET)).unwrap();
    assert!(found.divergences.is_empty(), "{:?}", found.divergences);
    assert_eq!(found.classes.get("failover").map(|f| f.explored), Some(1), "{:?}", found.classes);
    let report = found.only_report.expect("the scenario's own perturbation's report");
    let perturbed: Vec<&String> = report.steps.iter().flat_map(|s| &s.perturbed).collect();
    assert_eq!(perturbed.len(), 2, "{perturbed:#?}");
    assert!(
        perturbed[0].contains("its PUT of pool lb2/shop-web [10.224.0.4] (creating it) in flight, applied at 61s"),
        "{perturbed:#?}"
    );
    assert_eq!(
        perturbed[1],
        "the deposed leader's PUT of pool lb2/shop-web [10.224.0.4] (creating it) lands → written without If-Match \
         (created or replaced)"
    );
    let pools = report.pool_stream();
    let recheck = pools.iter().position(|l| l.contains("holds [10.224.0.4] in Azure, not [10.224.0.4, 10.224.0.5]"));
    let tick = pools.iter().position(|l| l.starts_with("tick at 2m: 1 group(s): 1 written"));
    assert!(recheck.is_some() && recheck < tick, "the recheck, then the tick that puts the pool right: {pools:#?}");
}

/// What a deliberately broken logic gets wrong: it filters what the real one is told.
trait Misreads {
    /// A new process starts.
    fn started(&mut self) {}
    /// What of `batch` it passes on.
    fn misread(&mut self, batch: &[wit::Observation]) -> Vec<wit::Observation>;
}

/// The built-in logic behind a supervisor, told only what `M` passes on.
struct Broken<M> {
    inner: ComponentReconciler<'static>,
    misreads: M,
}

impl<M: Misreads> clb_sandbox::logic::Logic for Broken<M> {
    type Error = LogicError;
    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        self.misreads.started();
        self.inner.start(config)
    }
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        let passed = self.misreads.misread(batch);
        self.inner.observe(now_ms, &passed)
    }
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, LogicError> {
        self.inner.complete(now_ms, results, arm_remaining_writes)
    }
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, LogicError> {
        self.inner.tick(now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, LogicError> {
        self.inner.stats(now_ms)
    }
}

impl<M: Misreads> simulate::Reconciler for Broken<M> {
    fn pools(&mut self) -> Option<&mut dyn simulate::PoolReconciler> {
        self.inner.pools()
    }
    fn supervised(&mut self) -> Option<&mut dyn simulate::Supervised> {
        self.inner.supervised()
    }
}

/// After a restart it believes the first lists' EndpointSlices never came (upstream's
/// stale-EndpointSlice defect at start-up: a Service's backends missing until the next event).
/// With `always`, it never sees an EndpointSlice, so the scenario's own checks fail.
#[derive(Default)]
struct ForgetsSlicesAtStart {
    starts: u32,
    always: bool,
    listing: bool,
}

impl ForgetsSlicesAtStart {
    fn new(always: bool) -> Broken<Self> {
        Broken { inner: component(), misreads: Self { always, ..Self::default() } }
    }
}

impl Misreads for ForgetsSlicesAtStart {
    fn started(&mut self) {
        self.starts += 1;
        self.listing = self.starts > 1;
    }
    fn misread(&mut self, batch: &[wit::Observation]) -> Vec<wit::Observation> {
        let forget = std::mem::take(&mut self.listing) || self.always;
        batch.iter().filter(|o| !forget || !matches!(o, wit::Observation::SliceUpserted(_))).cloned().collect()
    }
}

/// It depends on the order of a watch's events: an EndpointSlice that arrives before its Service
/// is dropped instead of kept for it (an informer per kind gives no order between kinds).
#[derive(Default)]
struct DropsSlicesBeforeTheirService {
    services: std::collections::BTreeSet<String>,
}

impl Misreads for DropsSlicesBeforeTheirService {
    fn started(&mut self) {
        self.services.clear();
    }
    fn misread(&mut self, batch: &[wit::Observation]) -> Vec<wit::Observation> {
        let mut passed = Vec::new();
        for observation in batch {
            match observation {
                wit::Observation::ServiceUpserted(s) => drop(self.services.insert(s.uid.to_ascii_lowercase())),
                wit::Observation::SliceUpserted(s)
                    if !s
                        .owner_service_uid
                        .as_ref()
                        .is_some_and(|uid| self.services.contains(&uid.to_ascii_lowercase())) =>
                {
                    continue;
                }
                _ => {}
            }
            passed.push(observation.clone());
        }
        passed
    }
}

fn first_service_scenario() -> scenario::Scenario {
    let path = example_scenarios()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-first-service-with-endpoints-gets-a-load-balancer"))
        .unwrap();
    scenario::read(&path).unwrap()
}

#[test]
fn a_logic_that_forgets_the_slices_listed_after_a_restart_is_found_by_the_crash_class_with_a_reproducer() {
    let scenario = first_service_scenario();
    let broken = || ForgetsSlicesAtStart::new(false);
    let found = explore::explore(&scenario, broken, &options(CI_BUDGET)).unwrap();
    assert_eq!(found.reference_failed, None, "the broken logic passes the scenario as written");
    assert!(found.classes["crash"].divergences > 0, "{found:#?}");
    assert_eq!(found.classes["swap"].divergences, 0, "a rebuild is no restart: {found:#?}");
    let first = &found.divergences[0];
    assert!(first.differences.iter().any(|d| d.contains("nrp location")), "NRP lost the pods: {first:#?}");
    // The reproducer runs that one perturbation, and finds it again.
    let only = Options { only: Some(first.perturbation.parse().unwrap()), ..options(CI_BUDGET) };
    let again = explore::explore(&scenario, broken, &only).unwrap();
    assert_eq!(again.divergences.len(), 1, "{again:#?}");
    assert_eq!(again.divergences[0].differences, first.differences);
    // The real logic at the same point does not diverge.
    let fine = explore::explore(&scenario, component, &only).unwrap();
    assert!(fine.divergences.is_empty(), "{fine:#?}");
}

#[test]
fn a_logic_that_forgets_the_slices_listed_after_a_restart_is_found_by_the_stale_class_too() {
    let stale = Options { classes: vec![Class::Stale], ..options(CI_BUDGET) };
    let found = explore::explore(&first_service_scenario(), || ForgetsSlicesAtStart::new(false), &stale).unwrap();
    assert!(found.classes["stale"].divergences > 0, "{found:#?}");
    assert!(found.divergences.iter().all(|d| d.perturbation.starts_with("stale:")), "{found:#?}");
}

#[test]
fn a_logic_that_depends_on_the_order_of_watch_events_is_found_by_the_unobserved_class_and_its_written_reproducer_finds_it_again()
 {
    let scenario = first_service_scenario();
    let broken = || Broken { inner: component(), misreads: DropsSlicesBeforeTheirService::default() };
    let unobserved = Options { classes: vec![Class::Unobserved], ..options(CI_BUDGET) };
    let found = explore::explore(&scenario, broken, &unobserved).unwrap();
    assert_eq!(found.reference_failed, None, "the broken logic passes the scenario as written");
    let reordered: Vec<_> = found.divergences.iter().filter(|d| d.perturbation.starts_with("reorder:")).collect();
    assert!(!reordered.is_empty(), "{found:#?}");
    assert!(reordered[0].differences.iter().any(|d| d.contains("nrp location")), "NRP lost the pods: {found:#?}");
    // --write-repro: the scenario with the perturbation added, which `explore` runs alone.
    let scratch = scratch("explore-repro");
    let dir = scratch.join("repro");
    let written = explore::write_reproducers(&dir, &found).unwrap();
    assert_eq!(written.len(), found.divergences.len());
    let repro_path = written.iter().find(|p| p.to_string_lossy().contains(".reorder-")).unwrap();
    let repro = scenario::read(repro_path).unwrap();
    assert_eq!(repro.perturbation.map(|p| p.to_string()).as_deref(), Some(reordered[0].perturbation.as_str()));
    let text = std::fs::read_to_string(repro_path).unwrap();
    assert!(text.starts_with("# Reproduces what `clb-host explore` found in "), "{text}");
    // `simulate` runs it perturbed, and says so in the step where it happened.
    let report = simulate::run(&repro, &mut broken()).unwrap();
    let perturbed: Vec<&String> = report.steps.iter().flat_map(|s| &s.perturbed).collect();
    assert!(perturbed.len() == 1 && perturbed[0].contains("in the reverse order of objects"), "{perturbed:?}");
    let again = explore::explore(&repro, broken, &options(CI_BUDGET)).unwrap();
    assert_eq!(again.divergences.len(), 1, "{again:#?}");
    assert_eq!(again.divergences[0].differences, reordered[0].differences);
    let fine = explore::explore(&repro, component, &options(CI_BUDGET)).unwrap();
    assert!(fine.divergences.is_empty() && fine.classes["unobserved"].explored == 1, "{fine:#?}");
}

/// A crash between two groups' writes of a backend-pool tick: the dual-stack local Service's
/// first tick creates three pools (IPv4 and IPv6 on the public load balancer, and one more), and a
/// controller that dies after writing one or two of them leaves a new one to finish from the
/// cluster and Azure alone. Every such point is explored and none changes the world; the run's
/// report says how many groups were written.
#[test]
fn a_crash_between_two_groups_writes_of_a_backend_pool_tick_is_explored_and_the_next_controller_finishes_the_pools() {
    let path = example_scenarios()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-dual-stack-local-service-gets-an-ipv4-and-an-ipv6-pool"))
        .unwrap();
    let scenario = scenario::read(&path).unwrap();
    let crash = Options { classes: vec![Class::Crash], ..options(usize::MAX) };
    let all = explore::explore(&scenario, component, &crash).unwrap();
    assert!(all.divergences.is_empty(), "{:?}", all.divergences);
    for after in [1, 2] {
        let only = Options { only: Some(format!("crash-in-pool-tick:0:{after}").parse().unwrap()), ..crash.clone() };
        let run = explore::explore(&scenario, component, &only).unwrap();
        assert!(run.divergences.is_empty(), "{:?}", run.divergences);
        let report = run.only_report.expect("the perturbed run's report");
        let lines: Vec<&String> = report.steps.iter().flat_map(|s| &s.perturbed).collect();
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains(&format!("dies during the backend-pool tick, {after} of its 3 group(s) carried out")),
            "{lines:#?}"
        );
    }
}

#[test]
fn a_reference_run_that_fails_is_reported_as_such_and_nothing_is_explored() {
    let broken = || ForgetsSlicesAtStart::new(true);
    let found = explore::explore(&first_service_scenario(), broken, &options(CI_BUDGET)).unwrap();
    let why = found.reference_failed.as_deref().expect("the reference fails its checks");
    assert!(why.starts_with("checks failed: "), "{why}");
    assert!(found.divergences.is_empty() && found.classes.values().all(|c| c.explored == 0), "{found:#?}");
}

#[test]
fn past_the_budget_the_points_are_drawn_by_the_seed_the_same_for_the_same_seed() {
    let scenario = first_service_scenario();
    let chosen = |seed| {
        let only_crash = Options { classes: vec![Class::Crash], budget: 5, seed, ..options(5) };
        let broken = || ForgetsSlicesAtStart::new(false);
        let found = explore::explore(&scenario, broken, &only_crash).unwrap();
        assert_eq!(found.classes["crash"].explored, 5, "{found:#?}");
        assert!(found.classes["crash"].points > 5);
        found.divergences.iter().map(|d| d.perturbation.clone()).collect::<Vec<_>>()
    };
    assert_eq!(chosen(7), chosen(7));
}

#[test]
fn clb_host_explore_prints_per_class_figures_as_json_and_refuses_a_class_it_does_not_have_and_a_malformed_perturbation()
{
    let scenario = first_service_scenario();
    let path = scenario.path.to_str().unwrap();
    let (code, out, err) = clb_host(&["explore", path, "--budget", "4", "--json"]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    for class in ["crash", "stale", "unobserved", "swap", "failover"] {
        assert_eq!(json["classes"][class]["explored"], 4, "{out}");
        assert_eq!(json["classes"][class]["divergences"], 0, "{out}");
    }
    let (code, out, _) = clb_host(&["explore", path, "--only", "crash-after:3"]);
    assert_eq!(code, EXIT_OK, "{out}");
    assert!(out.contains("crash: 1 of ") && out.contains("scenario: "), "the reproducer's run is reported: {out}");
    let refusals: BTreeMap<&str, [&str; 3]> = BTreeMap::from([
        ("unknown", ["--classes", "fire", "unknown class"]),
        ("bad perturbation", ["--only", "crash:3", "is not a perturbation"]),
    ]);
    for (what, [flag, value, says]) in refusals {
        let (code, _, err) = clb_host(&["explore", path, flag, value]);
        assert_eq!(code, EXIT_BAD_INPUT, "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    }
}
