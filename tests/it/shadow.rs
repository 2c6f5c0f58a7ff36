//! The live shadow (`clb_sandbox::supervisor::shadow`): a candidate beside the serving version is
//! compared on every input, counts a difference once, is resynced after it, never changes what
//! the serving version answers, and is promoted after enough clean inputs.

use super::supervisor::{next, service, slice, start};
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::supervisor::shadow::differences;
use clb_sandbox::supervisor::{CheckpointPolicy, ShadowOptions, ShadowState, ShadowStatus, Supervisor};
use clb_sandbox::{Limits, LoadedLogic};
use clb_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A LoadBalancer Service the next guest warns about (`tests/next-guest`, `LEGACY_ANNOTATION`),
/// and the built-in logic does not.
fn legacy(name: &str, uid: u32) -> wit::Observation {
    let wit::Observation::ServiceUpserted(mut record) = service(name, uid) else { unreachable!() };
    record.annotations.push(("clb.test/legacy".into(), "yes".into()));
    wit::Observation::ServiceUpserted(record)
}

fn own(bytes: &[u8]) -> LoadedLogic {
    runtime().load(bytes, Limits::default()).unwrap()
}

/// The inputs of a small day: Services, their endpoints moving, ticks, and what their commands
/// came back with (all successes), in `supervisor` — the same for every caller.
fn churn(supervisor: &mut Supervisor<'_>, from_ms: u64, services: &[wit::Observation]) -> Vec<wit::Step> {
    let mut steps = Vec::new();
    let mut now = from_ms;
    let mut pending: Vec<wit::Issued> = Vec::new();
    for (n, observation) in services.iter().enumerate() {
        let uid = 100 + n as u32;
        let wit::Observation::ServiceUpserted(record) = observation else { unreachable!() };
        let name = record.name.clone();
        for input in [observation.clone(), slice(&name, uid, &format!("10.244.1.{}", 10 + n), "n1")] {
            now += 10;
            let step = supervisor.observe(now, &[input]).unwrap();
            pending.extend(step.commands.iter().cloned());
            steps.push(step);
        }
        // Every command in flight succeeds.
        while !pending.is_empty() {
            now += 10;
            let results: Vec<(u64, wit::Outcome)> =
                pending.drain(..).map(|issued| (issued.id, success(&issued.command))).collect();
            let step = supervisor.complete(now, &results).unwrap();
            pending.extend(step.commands.iter().cloned());
            steps.push(step);
        }
        now += 1_000;
        let step = supervisor.tick(now).unwrap();
        pending.extend(step.commands.iter().cloned());
        steps.push(step);
    }
    steps
}

/// What Azure or Kubernetes answers a command that went through, enough for the tracker.
fn success(command: &wit::Command) -> wit::Outcome {
    match command {
        wit::Command::PutPublicIp(_) => wit::Outcome::PublicIpAddress("20.1.2.3".into()),
        wit::Command::ReadNrp => wit::Outcome::NrpSnapshot(wit::NrpState { services: vec![], locations: vec![] }),
        wit::Command::ReadArm => wit::Outcome::ArmInventory(wit::ArmInventory {
            public_ips: vec![],
            load_balancers: vec![],
            nat_gateways: vec![],
        }),
        _ => wit::Outcome::Ok,
    }
}

fn services(names: &[&str]) -> Vec<wit::Observation> {
    names.iter().enumerate().map(|(n, name)| service(name, 100 + n as u32)).collect()
}

fn status(supervisor: &Supervisor<'_>) -> ShadowStatus {
    supervisor.shadow_handle().expect("a shadow ran").status()
}

fn started() -> Supervisor<'static> {
    start(Supervisor::new(builtin()))
}

fn inline(promote_after: Option<u64>) -> ShadowOptions {
    ShadowOptions { promote_after, ..Default::default() }
}

#[test]
fn a_shadow_of_the_serving_version_compares_every_input_and_finds_no_divergence() {
    let mut supervisor = started();
    supervisor.shadow(own(clb_sandbox::BUILTIN_GUEST), inline(None)).unwrap();
    let steps = churn(&mut supervisor, 100, &services(&["web", "api", "shop"]));
    let status = status(&supervisor);
    assert_eq!(status.divergences, BTreeMap::new(), "{status:?}");
    assert_eq!(status.compared, steps.len() as u64, "every input was compared: {status:?}");
    assert_eq!(status.resyncing, 0, "{status:?}");
    assert_eq!(status.resyncs, BTreeMap::from([("start", 1)]), "{status:?}");
    assert_eq!(status.state, ShadowState::InStep);
}

#[test]
fn a_shadow_changes_nothing_the_serving_version_answers() {
    let mut shadowed = started();
    let mut alone = started();
    shadowed.shadow(next().clone(), inline(None)).unwrap();
    let inputs = [services(&["web"]), vec![legacy("api", 101)], services(&["shop"])].concat();
    let with = churn(&mut shadowed, 100, &inputs);
    let without = churn(&mut alone, 100, &inputs);
    assert_eq!(with, without, "the serving version's steps are the same with a shadow");
    assert_eq!(shadowed.export_state().unwrap(), alone.export_state().unwrap());
    assert!(status(&shadowed).divergences.contains_key("emit-event"), "{:?}", status(&shadowed));
}

#[test]
fn a_candidate_that_emits_an_extra_event_diverges_once_on_that_input_and_is_compared_in_step_after_its_resync() {
    let mut supervisor = started();
    supervisor.shadow(next().clone(), inline(None)).unwrap();
    churn(&mut supervisor, 100, &services(&["web"]));
    let before = status(&supervisor).compared;
    churn(&mut supervisor, 10_000, &[legacy("api", 101)]);
    let after_legacy = status(&supervisor);
    assert_eq!(after_legacy.divergences, BTreeMap::from([("emit-event".to_owned(), 1)]), "{after_legacy:?}");
    let last = after_legacy.last_divergence.as_ref().expect("the divergence is kept");
    assert!(last.input.contains("Service shop/api"), "{last:?}");
    assert!(last.serving.only.is_empty() && last.candidate.only.len() == 1, "{last:?}");
    assert!(last.candidate.only[0].to_string().contains("LegacyAnnotation"), "{last:?}");
    assert_eq!(after_legacy.resyncs.get("divergence"), Some(&1), "{after_legacy:?}");

    // Back in step: what follows is compared again, and agrees.
    churn(&mut supervisor, 20_000, &services(&["shop", "cart"]));
    let end = status(&supervisor);
    assert_eq!(end.divergences, after_legacy.divergences, "counted once, not at every input after it: {end:?}");
    assert!(end.compared > after_legacy.compared && after_legacy.compared > before, "{end:?}");
    assert_eq!(end.state, ShadowState::InStep);
}

#[test]
fn a_candidate_is_promoted_after_its_clean_inputs_and_a_divergence_before_them_starts_the_count_again() {
    let mut supervisor = started();
    supervisor.shadow(next().clone(), inline(Some(6))).unwrap();
    // Three inputs, then the divergence: the count starts again.
    supervisor.observe(100, &[service("web", 100)]).unwrap();
    supervisor.observe(110, &[legacy("api", 101)]).unwrap();
    assert_eq!(status(&supervisor).clean, 0);
    // The resync takes the input after the divergence (not compared), then six are.
    for n in 0..7u64 {
        assert!(supervisor.take_promotion().is_none(), "not yet: {:?}", status(&supervisor));
        supervisor.tick(200 + n).unwrap();
    }
    let due = status(&supervisor);
    assert_eq!((due.clean, due.resyncing), (6, 1), "{due:?}");
    let candidate = supervisor.take_promotion().expect("its promotion is due");
    assert_eq!(candidate.info().sha256, next().info().sha256);
    assert_eq!(status(&supervisor).state, ShadowState::Promoted);
    supervisor.swap(candidate, 300).expect("the promoted candidate swaps in");
    assert_eq!(supervisor.logic().info().sha256, next().info().sha256);
    assert!(supervisor.previous_logic().is_some(), "it serves its probation");
}

#[test]
fn divergences_of_an_allowed_kind_do_not_hold_the_promotion_back() {
    let mut supervisor = started();
    let allow = BTreeSet::from(["emit-event".to_owned()]);
    supervisor.shadow(next().clone(), ShadowOptions { promote_after: Some(3), allow, ..Default::default() }).unwrap();
    supervisor.observe(100, &[legacy("api", 101)]).unwrap();
    let status_now = status(&supervisor);
    assert_eq!(status_now.divergences.get("emit-event"), Some(&1));
    assert_eq!(status_now.clean, 1, "an allowed divergence counts as clean: {status_now:?}");
    supervisor.tick(200).unwrap(); // taken by the resync
    supervisor.tick(201).unwrap();
    supervisor.tick(202).unwrap();
    assert!(supervisor.take_promotion().is_some(), "{:?}", status(&supervisor));
}

#[test]
fn a_candidate_that_traps_is_resynced_and_the_serving_version_never_sees_it() {
    let mut supervisor = started();
    let mut alone = started();
    supervisor.shadow(next().clone(), inline(None)).unwrap();
    // The next guest traps on `boom*`; the built-in logic does not.
    let inputs = services(&["web", "boom", "api"]);
    assert_eq!(churn(&mut supervisor, 100, &inputs), churn(&mut alone, 100, &inputs));
    assert!(supervisor.take_quarantined().is_empty(), "the serving version took every input");
    let status = status(&supervisor);
    assert_eq!(status.resyncs.get("trap"), Some(&1), "{status:?}");
    assert_eq!(status.divergences, BTreeMap::new(), "a trap is no divergence: {status:?}");
    assert_eq!(status.state, ShadowState::InStep, "{status:?}");
}

#[test]
fn a_swap_of_the_serving_version_resyncs_the_shadow_from_the_new_versions_state() {
    let mut supervisor = started();
    supervisor.shadow(next().clone(), inline(None)).unwrap();
    churn(&mut supervisor, 100, &[legacy("web", 100)]);
    assert_eq!(status(&supervisor).divergences.get("emit-event"), Some(&1));
    // The candidate's own version now serves: from its state on, the two agree, legacy or not.
    supervisor.swap(next().clone(), 5_000).unwrap();
    let compared = status(&supervisor).compared;
    churn(&mut supervisor, 10_000, &[legacy("api", 101), service("shop", 102)]);
    let status = status(&supervisor);
    assert_eq!(status.resyncs.get("serving-changed"), Some(&1), "{status:?}");
    assert_eq!(status.divergences.get("emit-event"), Some(&1), "no divergence since the swap: {status:?}");
    assert!(status.compared > compared + 4, "{status:?}");
    assert_eq!(status.state, ShadowState::InStep, "{status:?}");
}

#[test]
fn a_candidate_that_cannot_take_the_serving_versions_state_stops_and_says_why() {
    let mut supervisor = started();
    supervisor.swap(next().clone(), 50).unwrap();
    // The built-in logic reads state versions up to its own; the next guest's is newer.
    supervisor.shadow(own(clb_sandbox::BUILTIN_GUEST), inline(None)).unwrap();
    churn(&mut supervisor, 100, &services(&["web", "api"]));
    let status = status(&supervisor);
    assert_eq!(status.state, ShadowState::Stopped, "{status:?}");
    let why = status.stopped.as_deref().unwrap_or_default();
    assert!(why.contains("cannot take the serving version's state") && why.contains("version"), "{status:?}");
    assert_eq!(status.compared, 0, "{status:?}");
}

#[test]
fn a_shadow_on_its_own_thread_accounts_for_every_input_and_catches_up_once_given_time() {
    let mut supervisor =
        start(Supervisor::with_policy(builtin(), CheckpointPolicy { every_inputs: 64, journal_items: 1_000 }));
    // A queue of two: whenever the candidate is busy (a resync imports a state), inputs beyond it
    // are dropped rather than waited for, and it resyncs.
    let options = ShadowOptions { queue: Some(2), ..Default::default() };
    let handle = supervisor.shadow(own(clb_sandbox::BUILTIN_GUEST), options).unwrap();
    let names: Vec<String> = (0..40).map(|n| format!("s{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut inputs = churn(&mut supervisor, 100, &services(&names)).len() as u64;
    let settled = |inputs: u64| {
        let accounted = |status: &ShadowStatus| status.compared + status.resyncing;
        let status = (0..3_000)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                handle.status()
            })
            .find(|status| accounted(status) == inputs && status.state != ShadowState::Resyncing)
            .unwrap_or_else(|| handle.status());
        assert_eq!(accounted(&status), inputs, "every input was compared or counted as not: {status:?}");
        assert_eq!(status.divergences, BTreeMap::new(), "{status:?}");
        status
    };
    let busy = settled(inputs);
    let dropped = busy.resyncs.get("behind").copied().unwrap_or_default();
    assert!(dropped == 0 || busy.resyncing > 0, "{busy:?}");
    // Idle again: the next input brings it the serving state if it missed one, the one after is
    // compared.
    supervisor.tick(1_000_000).unwrap();
    supervisor.tick(1_000_001).unwrap();
    inputs += 2;
    let caught_up = settled(inputs);
    assert_eq!(caught_up.state, ShadowState::InStep, "{caught_up:?}");
    assert!(caught_up.compared > busy.compared, "{busy:?}\n{caught_up:?}");
}

/// Replays `trace` through `component` (the built-in logic when `None`); the exit code and report.
fn replay(trace: &Path, component: Option<&Path>) -> (u8, String) {
    let component = component.map(|c| c.display().to_string());
    let extra: Vec<&str> = component.iter().flat_map(|c| ["--component", c.as_str()]).collect();
    let (code, out, err) = super::traces::clb_replay(&[trace], &extra);
    (code, format!("{out}{err}"))
}

#[test]
fn a_divergence_recorded_by_the_shadow_replays_identically_on_the_serving_version_and_differs_at_its_last_call_on_the_candidate()
 {
    let dir = clb_tests::scratch("shadow-record");
    let mut supervisor = started();
    let options = ShadowOptions { record: Some(dir.to_path_buf()), ..Default::default() };
    supervisor.shadow(next().clone(), options).unwrap();
    churn(&mut supervisor, 100, &services(&["web"]));
    churn(&mut supervisor, 10_000, &[legacy("api", 101)]);
    let status = status(&supervisor);
    assert_eq!(status.traces_written, 1, "{status:?}");
    let trace = Path::new(status.last_divergence.as_ref().and_then(|d| d.trace.as_deref()).expect("its trace"));
    let calls = std::fs::read_to_string(trace).unwrap().lines().count() - 1;

    let (code, report) = replay(trace, None);
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("identical"), "{report}");
    let next_file = dir.join("next.wasm");
    std::fs::write(&next_file, NEXT_GUEST).unwrap();
    let (code, report) = replay(trace, Some(&next_file));
    assert_eq!(code, 1, "{report}");
    assert!(report.contains(&format!("seq {}", calls - 1)), "differs at its last call ({calls} calls): {report}");
}

#[test]
fn the_differences_of_two_steps_are_named_by_command_kind_and_ids_alone_are_a_reordering() {
    let event = |reason: &str| {
        wit::Command::EmitEvent(wit::Event {
            regarding: wit::ObjectRef {
                kind: "Service".into(),
                namespace: "ns".into(),
                name: "a".into(),
                uid: "u".into(),
            },
            event_type: wit::EventType::Normal,
            reason: reason.into(),
            message: String::new(),
        })
    };
    let step = |commands: Vec<(u64, wit::Command)>, wake: Option<u64>, idle: bool| wit::Step {
        commands: commands.into_iter().map(|(id, command)| wit::Issued { id, command }).collect(),
        wake_at_ms: wake,
        idle,
    };
    let a = step(vec![(1, event("A")), (2, wit::Command::ReadNrp)], Some(5), false);
    assert!(differences(&a, &a.clone()).0.is_empty());
    let reordered = step(vec![(2, event("A")), (1, wit::Command::ReadNrp)], Some(5), false);
    assert_eq!(differences(&a, &reordered).0, ["command-order"]);
    let other = step(vec![(1, event("B")), (2, wit::Command::ReadNrp)], None, true);
    let (kinds, serving, candidate) = differences(&a, &other);
    assert_eq!(kinds, ["emit-event", "idle", "wake-at"]);
    assert_eq!((serving.only.len(), candidate.only.len()), (1, 1));
    assert_eq!((serving.wake_at_ms, candidate.wake_at_ms), (Some(5), None));
    let fewer = step(vec![(1, event("A"))], Some(5), false);
    assert_eq!(differences(&a, &fewer).0, ["read-nrp"]);
}

#[test]
fn the_shadow_scenario_makes_the_same_commands_and_azure_calls_as_the_same_story_without_the_shadow() {
    use clb_simulator::{scenario, simulate};
    let path = scenario_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("a-candidate-in-shadow-is-compared-on-every-input"))
        .expect("the shadow scenario");
    let with = scenario::read(&path).unwrap();
    let mut without = with.clone();
    without.steps.retain(|step| !matches!(step, scenario::Step::Shadow(_)));
    for step in &mut without.steps {
        if let scenario::Step::Expect(expectation) = step {
            expectation.shadow = None;
        }
    }
    let shadowed = simulate::run(&with, &mut component_reconciler()).unwrap();
    let alone = simulate::run(&without, &mut component_reconciler()).unwrap();
    assert!(shadowed.passed && alone.passed);
    assert!(!alone.command_stream().is_empty());
    assert_eq!(shadowed.command_stream(), alone.command_stream(), "the serving version's commands, and only them");
    assert_eq!(shadowed.azure_calls, alone.azure_calls, "no Azure call of the candidate's");
    assert_eq!(shadowed.events.len(), alone.events.len(), "no Event of the candidate's");
}
