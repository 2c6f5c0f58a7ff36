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
    for path in scenarios {
        let scenario = scenario::read(&path).unwrap();
        let exploration = explore::explore(&scenario, component, &options(CI_BUDGET)).unwrap();
        if let Some(why) = &exploration.reference_failed {
            failures.push(format!("{}: the reference failed: {why}", path.display()));
        }
        for class in Class::ALL {
            let figures = exploration.classes.get(class.name()).copied().unwrap_or_default();
            if figures.explored == 0 {
                failures.push(format!("{}: no {} perturbation explored", path.display(), class.name()));
            }
        }
        for divergence in &exploration.divergences {
            failures.push(format!("{}: {}: {:?}", path.display(), divergence.perturbation, divergence.differences));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A deliberately broken logic: after a restart it believes the first lists' EndpointSlices
/// never came (upstream's stale-EndpointSlice defect at start-up: a Service's backends missing
/// until the next event). With `always`, it never sees an EndpointSlice, so the scenario's own
/// checks fail.
struct ForgetsSlicesAtStart {
    inner: ComponentReconciler<'static>,
    starts: u32,
    always: bool,
    listing: bool,
}

impl ForgetsSlicesAtStart {
    fn new(always: bool) -> Self {
        Self { inner: component(), starts: 0, always, listing: false }
    }
}

impl clb_sandbox::logic::Logic for ForgetsSlicesAtStart {
    type Error = LogicError;
    fn start(&mut self, config: &wit::Config) -> Result<(), LogicError> {
        self.starts += 1;
        self.listing = self.starts > 1;
        self.inner.start(config)
    }
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, LogicError> {
        if !std::mem::take(&mut self.listing) && !self.always {
            return self.inner.observe(now_ms, batch);
        }
        let kept: Vec<wit::Observation> =
            batch.iter().filter(|o| !matches!(o, wit::Observation::SliceUpserted(_))).cloned().collect();
        self.inner.observe(now_ms, &kept)
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

impl simulate::Reconciler for ForgetsSlicesAtStart {
    fn pools(&mut self) -> Option<&mut dyn simulate::PoolReconciler> {
        self.inner.pools()
    }
    fn supervised(&mut self) -> Option<&mut dyn simulate::Supervised> {
        self.inner.supervised()
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
    let only = Options { only: Some(explore::parse_perturbation(&first.perturbation).unwrap()), ..options(CI_BUDGET) };
    let again = explore::explore(&scenario, broken, &only).unwrap();
    assert_eq!(again.divergences.len(), 1, "{again:#?}");
    assert_eq!(again.divergences[0].differences, first.differences);
    // The real logic at the same point does not diverge.
    let fine = explore::explore(&scenario, component, &only).unwrap();
    assert!(fine.divergences.is_empty(), "{fine:#?}");
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
fn clb_host_explore_prints_per_class_figures_as_json_and_refuses_a_class_it_does_not_have() {
    let scenario = first_service_scenario();
    let path = scenario.path.to_str().unwrap();
    let (code, out, err) = clb_host(&["explore", path, "--classes", "crash,swap", "--budget", "4", "--json"]);
    assert_eq!(code, EXIT_OK, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    for class in ["crash", "swap"] {
        assert_eq!(json["classes"][class]["explored"], 4, "{out}");
        assert_eq!(json["classes"][class]["divergences"], 0, "{out}");
    }
    let (code, out, _) = clb_host(&["explore", path, "--only", "crash-after:3"]);
    assert_eq!(code, EXIT_OK, "{out}");
    assert!(out.contains("crash: 1 of ") && out.contains("scenario: "), "the reproducer's run is reported: {out}");
    let refusals: BTreeMap<&str, [&str; 3]> = BTreeMap::from([
        ("stale", ["--classes", "crash,stale", "not built yet"]),
        ("unknown", ["--classes", "fire", "unknown class"]),
        ("bad perturbation", ["--only", "crash:3", "is not a perturbation"]),
    ]);
    for (what, [flag, value, says]) in refusals {
        let (code, _, err) = clb_host(&["explore", path, flag, value]);
        assert_eq!(code, EXIT_BAD_INPUT, "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    }
}
