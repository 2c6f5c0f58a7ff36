//! The supervisor: a trap costs only the input that trapped, repeated traps on a swapped-in
//! version roll it back, and a swap that cannot be trusted is refused with the old version
//! serving and its state intact.

use clb_guest::tracker::STATE_VERSION;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::supervisor::{CheckpointPolicy, Supervisor, SupervisorError, self_check, version_name};
use clb_sandbox::{Limits, LoadError, LoadedLogic};
use clb_simulator::scenario;
use clb_simulator::simulate;
use clb_tests::*;
use std::sync::OnceLock;

pub(crate) fn next() -> &'static LoadedLogic {
    static LOGIC: OnceLock<LoadedLogic> = OnceLock::new();
    LOGIC.get_or_init(|| runtime().load(NEXT_GUEST, Limits::default()).expect("the next guest loads"))
}

pub(crate) fn node(name: &str, ip: &str) -> wit::Observation {
    wit::Observation::NodeUpserted(wit::Node { name: name.into(), internal_ips: vec![ip.into()] })
}

/// A tick from this time traps the next guest (`tests/next-guest`, `PANIC_TICK_FROM_MS`).
const PANIC_TICK_FROM_MS: u64 = 1 << 61;

/// A LoadBalancer Service; `uid` is a UUID's last digits. The next guest traps on `boom*`.
pub(crate) fn service(name: &str, uid: u32) -> wit::Observation {
    let mut service = read_service("etp-local.yaml");
    service.name = name.into();
    service.uid = format!("6a1f0c8e-2b3d-4e5f-8a9b-{uid:012}");
    if name.starts_with("boom") {
        service.annotations.push(("clb.test/panic-on-observe".into(), "true".into()));
    }
    wit::Observation::ServiceUpserted(service)
}

pub(crate) fn slice(service_name: &str, uid: u32, address: &str, node: &str) -> wit::Observation {
    wit::Observation::SliceUpserted(wit::EndpointSlice {
        namespace: read_service("etp-local.yaml").namespace,
        name: format!("{service_name}-abc"),
        owner_service_uid: Some(format!("6a1f0c8e-2b3d-4e5f-8a9b-{uid:012}")),
        address_type: "IPv4".into(),
        endpoints: vec![wit::Endpoint {
            addresses: vec![address.into()],
            node_name: Some(node.into()),
            ready: Some(true),
        }],
        deleting: false,
    })
}

fn started(logic: &'static LoadedLogic, policy: CheckpointPolicy) -> Supervisor<'static> {
    start(Supervisor::with_policy(logic, policy))
}

/// Starts `supervisor` on two nodes and an empty NRP, up to its first idle step.
pub(crate) fn start(mut supervisor: Supervisor<'static>) -> Supervisor<'static> {
    supervisor.start(&read_config("clb.yaml")).unwrap();
    let mut issued = supervisor.observe(0, &[node("n1", "10.224.0.4"), node("n2", "10.224.0.5")]).unwrap().commands;
    issued.extend(supervisor.observe(0, &[wit::Observation::ListsComplete]).unwrap().commands);
    // The guest writes nothing before it has read NRP, then listed ARM: answer both, empty.
    let empty = wit::NrpState { services: Vec::new(), locations: Vec::new() };
    let nothing = wit::ArmInventory { public_ips: Vec::new(), load_balancers: Vec::new(), nat_gateways: Vec::new() };
    for (read, answer) in [
        (wit::Command::ReadNrp, wit::Outcome::NrpSnapshot(empty)),
        (wit::Command::ReadArm, wit::Outcome::ArmInventory(nothing)),
    ] {
        let ids: Vec<u64> = issued.iter().filter(|i| i.command == read).map(|i| i.id).collect();
        assert_eq!(ids.len(), 1, "{issued:?}");
        issued = supervisor.complete(0, &[(ids[0], answer)]).unwrap().commands;
    }
    assert!(issued.is_empty(), "{issued:?}");
    supervisor
}

const SMALL: CheckpointPolicy = CheckpointPolicy { every_inputs: 2, journal_items: 100 };

// Upstream TestServiceUpdaterWorker_RecoversFromPanic.
#[test]
fn a_trap_in_the_middle_of_a_batch_loses_nothing_but_the_observation_that_trapped() {
    let mut supervisor = started(next(), SMALL);
    let mut reference = started(next(), SMALL);
    for s in [&mut supervisor, &mut reference] {
        s.observe(10, &[service("web", 1)]).unwrap();
    }
    let checkpoints_before = supervisor.stats().checkpoints;
    let batch = [slice("web", 1, "10.244.1.10", "n1"), service("boom", 9), service("api", 2)];
    let step = supervisor.observe(20, &batch).expect("the trap is recovered from");

    let quarantined = supervisor.take_quarantined();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert!(quarantined[0].input.describe().contains("Service shop/boom"), "{quarantined:?}");
    assert!(quarantined[0].error.contains("asked to trap by service shop/boom"), "{quarantined:?}");
    assert_eq!(supervisor.stats().recoveries, 2, "one rebuild for the batch, one for the observation");
    assert!(supervisor.stats().checkpoints > checkpoints_before);

    // The rest of the batch was delivered, one observation at a time: the same commands and the
    // same state as a run that never saw the trapping Service.
    let mut expected = reference.observe(20, &batch[..1]).unwrap().commands;
    expected.extend(reference.observe(20, &batch[2..]).unwrap().commands);
    assert!(!expected.is_empty());
    assert_eq!(step.commands, expected);
    assert_eq!(supervisor.export_state().unwrap(), reference.export_state().unwrap());
    // And the next input is served normally.
    let next_input = [slice("api", 2, "10.244.2.10", "n2")];
    assert_eq!(supervisor.observe(30, &next_input).unwrap(), reference.observe(30, &next_input).unwrap());
    assert!(supervisor.take_quarantined().is_empty());
}

/// The commands of `steps` about the Services named (their UIDs' last digits), as text.
fn naming(steps: &[wit::Step], uids: &[u32]) -> Vec<String> {
    let uids: Vec<String> = uids.iter().map(|uid| format!("{uid:012}")).collect();
    steps
        .iter()
        .flat_map(|step| &step.commands)
        .map(|issued| format!("{:?}", issued.command))
        .filter(|text| uids.iter().any(|uid| text.contains(uid.as_str())))
        .collect()
}

#[test]
fn three_quarantines_on_a_swapped_in_version_roll_it_back_and_the_previous_one_is_delivered_them() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    let mut reference = started(builtin(), CheckpointPolicy::default());
    supervisor.swap(next(), 0).expect("the next guest is accepted");
    assert_eq!(version_name(supervisor.logic()), version_name(next()));
    supervisor.observe(5, &[service("web", 1)]).unwrap();
    reference.observe(5, &[service("web", 1)]).unwrap();
    let mut steps = Vec::new();
    let mut expected = Vec::new();
    for n in 0..3 {
        let input = [service(&format!("boom-{n}"), 10 + n)];
        steps.push(supervisor.observe(10, &input).unwrap());
        expected.push(reference.observe(10, &input).unwrap());
    }
    assert_eq!(supervisor.stats().quarantined, 3);
    assert_eq!(supervisor.stats().rollbacks, 1);
    assert_eq!(version_name(supervisor.logic()), version_name(builtin()), "back on the built-in logic");
    // The Services the new version trapped on are the previous one's now: what it answers
    // them is handed out with the step of the input that rolled back, as the reference (which
    // never trapped) answered them one by one.
    assert!(naming(&steps[..2], &[10, 11, 12]).is_empty(), "nothing for them before the rollback");
    let boom = naming(&expected, &[10, 11, 12]);
    assert!(!boom.is_empty());
    assert_eq!(naming(&steps[2..], &[10, 11, 12]), boom);
    // The input the new version took before the traps was replayed into the old one.
    let input = [service("api", 2)];
    assert_eq!(supervisor.observe(20, &input).unwrap(), reference.observe(20, &input).unwrap());
    let state = supervisor.export_state().unwrap();
    assert_eq!(state.version, STATE_VERSION);
    assert_eq!(state, reference.export_state().unwrap());
}

// Regression: the rule was three quarantined inputs *in a row*, so a swapped-in version that
// trapped on every third input of a busy controller (other inputs served between the traps, as
// in any real cluster) was never rolled back, and its probation ended with it serving.
#[test]
fn a_swapped_in_version_that_quarantines_three_inputs_with_others_served_between_them_is_rolled_back() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    supervisor.swap(next(), 0).expect("the next guest is accepted");
    supervisor.observe(5, &[service("web", 1)]).unwrap();
    let mut steps = Vec::new();
    for n in 0..3u32 {
        let now = 10 + u64::from(n) * 10;
        steps.push(supervisor.observe(now, &[service(&format!("boom-{n}"), 10 + n)]).unwrap());
        assert_eq!(supervisor.stats().rollbacks, u64::from(n == 2), "after {} quarantines", n + 1);
        // Ordinary inputs between the traps: endpoint changes and a tick.
        let address = format!("10.244.1.{}", 10 + n);
        steps.push(supervisor.observe(now + 1, &[slice("web", 1, &address, "n1")]).unwrap());
        steps.push(supervisor.tick(now + 2).unwrap());
    }
    assert_eq!(supervisor.stats().quarantined, 3);
    assert_eq!(version_name(supervisor.logic()), version_name(builtin()), "rolled back");
    assert!(supervisor.previous_logic().is_none());
    // Each of the three Services was delivered to the built-in logic, which takes it on (its
    // finalizer first).
    for uid in [10, 11, 12] {
        assert!(
            naming(&steps, &[uid]).iter().any(|c| c.starts_with("Command::SetFinalizer")),
            "{uid}: {:?}",
            naming(&steps, &[uid])
        );
    }
}

#[test]
fn two_ticks_quarantined_roll_a_swapped_in_version_back_and_more_quarantines_may_be_allowed() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    supervisor.swap(next(), 0).expect("the next guest is accepted");
    supervisor.tick(PANIC_TICK_FROM_MS).unwrap();
    assert_eq!((supervisor.stats().quarantined, supervisor.stats().rollbacks), (1, 0));
    supervisor.observe(PANIC_TICK_FROM_MS, &[service("web", 1)]).unwrap();
    supervisor.tick(PANIC_TICK_FROM_MS + 1).unwrap();
    assert_eq!((supervisor.stats().quarantined, supervisor.stats().rollbacks), (2, 1), "a version that traps on time");
    assert_eq!(version_name(supervisor.logic()), version_name(builtin()));
    assert!(
        supervisor.stats().last_rollback.as_deref().is_some_and(|r| r.contains("2 ticks")),
        "{:?}",
        supervisor.stats()
    );

    // With five allowed, four quarantined Services keep the new version serving.
    let mut lenient = start(Supervisor::new(builtin()).with_probation_quarantines(5));
    lenient.swap(next(), 0).expect("the next guest is accepted");
    for n in 0..4 {
        lenient.observe(10, &[service(&format!("boom-{n}"), 10 + n)]).unwrap();
    }
    assert_eq!((lenient.stats().quarantined, lenient.stats().rollbacks), (4, 0));
    lenient.observe(10, &[service("boom-4", 14)]).unwrap();
    assert_eq!((lenient.stats().quarantined, lenient.stats().rollbacks), (5, 1));
}

/// Swaps each refusal case on a supervisor (at `now_ms`), then proves the old version serves
/// with its state.
fn refused(start: &'static LoadedLogic, bytes: &[u8], now_ms: u64) -> SupervisorError {
    let mut supervisor = started(start, CheckpointPolicy::default());
    supervisor.observe(5, &[service("web", 1), slice("web", 1, "10.244.1.10", "n1")]).unwrap();
    let before = supervisor.export_state().unwrap();
    let err = supervisor.swap_bytes(runtime(), bytes, Limits::default(), now_ms).expect_err("the swap is refused");
    assert_eq!(version_name(supervisor.logic()), version_name(start), "{err}");
    assert_eq!(supervisor.export_state().unwrap(), before, "{err}: the state is intact");
    assert_eq!(supervisor.stats().swaps.get(err.kind()), Some(&1), "{err}: counted by result");
    let step = supervisor.observe(20, &[service("api", 2)]).unwrap();
    assert!(!step.commands.is_empty(), "{err}: the old version still serves");
    err
}

#[test]
fn a_swap_to_a_guest_that_would_drop_the_state_is_refused() {
    let err = refused(builtin(), HOSTILE_GUEST, 10);
    assert!(
        matches!(err, SupervisorError::SwapStateRegression { imported, exported: 0 } if imported == STATE_VERSION),
        "{err}"
    );
}

#[test]
fn a_swap_to_a_component_importing_wasi_is_refused_naming_the_import() {
    let bytes = wat::parse_str(r#"(component (import "wasi:filesystem/preopens@0.2.0" (instance)))"#).unwrap();
    let err = refused(builtin(), &bytes, 10);
    assert!(
        matches!(&err, SupervisorError::SwapLoad(LoadError::ForbiddenImport { name }) if name == "wasi:filesystem/preopens@0.2.0"),
        "{err}"
    );
}

#[test]
fn a_swap_to_a_corrupted_file_is_refused() {
    let mut bytes = NEXT_GUEST.to_vec();
    bytes.truncate(bytes.len() / 2);
    let err = refused(builtin(), &bytes, 10);
    assert!(matches!(err, SupervisorError::SwapLoad(LoadError::Invalid(_))), "{err}");
}

#[test]
fn a_swap_to_a_version_whose_import_state_refuses_the_state_is_refused() {
    // The built-in logic reads state versions up to its own; the next guest exports one more.
    let err = refused(next(), clb_sandbox::BUILTIN_GUEST, 10);
    match err {
        SupervisorError::StateRefused { version, reason, .. } if version == STATE_VERSION + 1 => {
            assert!(reason.contains(&format!("unsupported state version {version}")), "{reason}")
        }
        other => panic!("expected a refused state, got {other}"),
    }
}

/// `tests/next-guest`: its ticks from this time on propose deleting a load balancer.
const DESTRUCTIVE_TICK_FROM_MS: u64 = 1 << 62;

#[test]
fn a_swap_to_a_version_whose_first_tick_is_destructive_is_refused_and_the_old_instance_is_rebuilt() {
    // The old version's self-check tick ran on the serving instance (it issued a read of NRP,
    // due by then): `refused` proves the state is the one before that tick.
    let err = refused(builtin(), NEXT_GUEST, DESTRUCTIVE_TICK_FROM_MS);
    match &err {
        SupervisorError::SwapSelfCheck { destructive } => {
            assert_eq!(destructive, &["delete ResourceKind::LoadBalancer next-guest-destructive-tick".to_owned()])
        }
        other => panic!("expected a self-check refusal, got {other}"),
    }
}

/// A logic loaded for one test, so that its call counters are the test's own.
fn own(bytes: &[u8]) -> LoadedLogic {
    runtime().load(bytes, Limits::default()).expect("the guest loads")
}

#[test]
fn a_swap_exports_only_when_the_checkpoint_is_stale_and_the_new_version_imports_once_and_never_exports() {
    // (a checkpoint was taken right before the swap, exports the swap takes from the old version)
    for (fresh, exports) in [(true, 0), (false, 1)] {
        let mut supervisor = start(Supervisor::new(own(clb_sandbox::BUILTIN_GUEST)));
        supervisor.observe(5, &[service("web", 1), slice("web", 1, "10.244.1.10", "n1")]).unwrap();
        if fresh {
            supervisor.export_state().unwrap();
        }
        let (checkpoints, old_calls) = (supervisor.stats().checkpoints, calls(supervisor.logic()));
        let report = supervisor.swap(own(NEXT_GUEST), 10).expect("accepted");
        assert_eq!(supervisor.stats().checkpoints - checkpoints, exports, "fresh checkpoint: {fresh}");
        let old = supervisor.previous_logic().expect("on probation");
        assert_eq!(calls(old) - old_calls, exports, "the old version is only asked to export");
        assert_eq!(calls(supervisor.logic()), 3, "the new version: import-state, state-version, the first tick");
        assert_eq!((report.state_from.0, report.state_to.0), (STATE_VERSION, STATE_VERSION + 1));
    }
}

fn calls(logic: &LoadedLogic) -> u64 {
    logic.stats().calls.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn the_first_step_of_a_swap_is_the_new_versions_tick_and_a_rebuild_replays_it() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    let mut reference = started(builtin(), CheckpointPolicy::default());
    // The periodic read of NRP is due by then, so the tick asks for it.
    let now = 10 * 60_000;
    let report = supervisor.swap(next(), now).expect("accepted");
    let expected = reference.tick(now).unwrap();
    assert_eq!(expected.commands.iter().map(|c| &c.command).collect::<Vec<_>>(), [&wit::Command::ReadNrp]);
    assert_eq!(report.first_step, expected);
    // A trap before the read completes: the new version is rebuilt from the checkpoint and the
    // journal, which holds the first tick, so the read is still in flight in it.
    supervisor.observe(now, &[service("boom", 9)]).unwrap();
    assert_eq!(supervisor.take_quarantined().len(), 1);
    let empty = wit::NrpState { services: Vec::new(), locations: Vec::new() };
    let read = [(expected.commands[0].id, wit::Outcome::NrpSnapshot(empty))];
    let after = supervisor.complete(now, &read).unwrap();
    assert_eq!(after, reference.complete(now, &read).unwrap());
    assert!(after.idle, "{after:?}");
    assert_eq!(after.wake_at_ms, Some(now + 5 * 60_000), "the next read is scheduled: the first one was taken");
}

#[test]
fn a_staged_swap_replays_what_was_delivered_while_it_imported_or_else_moves_the_whole_state() {
    let legacy = || {
        let wit::Observation::ServiceUpserted(mut s) = service("old", 3) else { unreachable!() };
        s.annotations.push(("clb.test/legacy".into(), "true".into()));
        wit::Observation::ServiceUpserted(s)
    };
    let web = || vec![service("web", 1), slice("web", 1, "10.244.1.10", "n1")];
    // (case, checkpoint policy, inputs delivered while the new version imports, inputs replayed
    // at the switch — those delivered after `stage`: the three `start` left in the journal are
    // replayed by the import — and exports at the switch)
    type Case = (&'static str, CheckpointPolicy, Vec<Vec<wit::Observation>>, Option<usize>, u64);
    let cases: [Case; 3] = [
        ("answered alike", CheckpointPolicy::default(), vec![web(), vec![service("api", 2)]], Some(2), 0),
        (
            "answered differently (the next guest warns)",
            CheckpointPolicy::default(),
            vec![web(), vec![legacy()]],
            None,
            1,
        ),
        // `start` leaves no input after its last checkpoint: the second here makes two (a
        // checkpoint), the third one more after it.
        ("a checkpoint since staging", SMALL, vec![web(), vec![service("api", 2)], vec![service("batch", 3)]], None, 1),
    ];
    for (case, policy, inputs, replayed, exports) in cases {
        let mut supervisor = started(builtin(), policy);
        let mut reference = started(builtin(), policy);
        let staging = supervisor.stage(next()).unwrap();
        let staged = std::thread::scope(|scope| {
            let import = scope.spawn(|| staging.import());
            for (n, batch) in inputs.iter().enumerate() {
                let now = 10 + n as u64;
                assert_eq!(supervisor.observe(now, batch).unwrap(), reference.observe(now, batch).unwrap(), "{case}");
            }
            import.join().unwrap().expect("the import succeeds")
        });
        let checkpoints = supervisor.stats().checkpoints;
        let report = supervisor.swap_staged(staged, 20).expect(case);
        assert_eq!(report.replayed, replayed, "{case}");
        assert_eq!(supervisor.stats().checkpoints - checkpoints, exports, "{case}");
        assert_eq!(version_name(supervisor.logic()), version_name(next()), "{case}");
        let plain = reference.swap(next(), 20).expect(case);
        assert_eq!(report.first_step, plain.first_step, "{case}");
        let input = [service("later", 5), slice("later", 5, "10.244.2.10", "n2")];
        assert_eq!(supervisor.observe(30, &input).unwrap(), reference.observe(30, &input).unwrap(), "{case}");
        assert_eq!(supervisor.export_state().unwrap(), reference.export_state().unwrap(), "{case}");
    }
}

#[test]
fn a_long_journal_at_stage_is_replayed_by_the_import_not_checkpointed_and_the_switch_replays_only_what_followed() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    let mut reference = started(builtin(), CheckpointPolicy::default());
    for n in 0..100u32 {
        let batch = [service(&format!("s{n}"), n)];
        assert_eq!(supervisor.observe(1, &batch).unwrap(), reference.observe(1, &batch).unwrap());
    }
    let checkpoints = supervisor.stats().checkpoints;
    let staging = supervisor.stage(next()).unwrap();
    assert_eq!(supervisor.stats().checkpoints, checkpoints, "no export on the serving path");
    let staged = staging.import().expect("the import succeeds");
    let later = [service("later", 200)];
    assert_eq!(supervisor.observe(2, &later).unwrap(), reference.observe(2, &later).unwrap());
    let report = supervisor.swap_staged(staged, 20).expect("accepted");
    assert_eq!(report.replayed, Some(1), "only the input delivered after `stage`");
    assert_eq!(supervisor.stats().checkpoints, checkpoints, "no whole state move either");
    // Regression: the size reported is the state moved (the new version's export after the
    // import's replay), not the checkpoint before the journal.
    assert!(report.state_to.1 > report.state_from.1, "{report}");
    assert_eq!(supervisor.stats().last_checkpoint_bytes, report.state_to.1, "the moved state is the checkpoint now");
    let plain = reference.swap(next(), 20).expect("accepted");
    assert_eq!(report.first_step, plain.first_step);
    assert_eq!(supervisor.export_state().unwrap(), reference.export_state().unwrap());
}

// Regression: a probation began with the previous version's journal, so after a long journal it
// ended at the swap and three traps in a row did not roll back.
#[test]
fn a_staged_swap_after_a_long_journal_serves_its_probation_on_its_own_inputs() {
    const PROBATION: usize = 10;
    let swapped = || {
        let mut supervisor = start(Supervisor::new(builtin()).with_probation_inputs(PROBATION));
        for n in 0..100u32 {
            supervisor.observe(1, &[service(&format!("s{n}"), n)]).unwrap();
        }
        let staged = supervisor.stage(next()).unwrap().import().expect("the import succeeds");
        supervisor.swap_staged(staged, 2).expect("accepted");
        assert!(supervisor.previous_logic().is_some(), "on probation after the swap");
        supervisor
    };

    let mut trapped = swapped();
    for n in 0..3 {
        trapped.observe(3, &[service(&format!("boom-{n}"), 200 + n)]).unwrap();
    }
    assert_eq!((trapped.stats().quarantined, trapped.stats().rollbacks), (3, 1));
    assert_eq!(version_name(trapped.logic()), version_name(builtin()), "rolled back");

    // The self-check tick was the first of its own inputs.
    let mut serving = swapped();
    for n in 1..PROBATION as u32 {
        assert!(serving.previous_logic().is_some(), "still on probation after {n} inputs");
        serving.tick(3 + u64::from(n)).unwrap();
    }
    assert!(serving.previous_logic().is_none(), "released after {PROBATION} inputs of its own");
}

#[test]
fn a_staged_swap_refused_by_the_self_check_leaves_the_old_version_with_every_input_it_took() {
    let mut supervisor = started(builtin(), CheckpointPolicy::default());
    let mut reference = started(builtin(), CheckpointPolicy::default());
    let staging = supervisor.stage(next()).unwrap();
    let staged = staging.import().expect("the import succeeds");
    // Delivered after the staged checkpoint: replayed into the new version at the switch, and
    // still in the old one after the refusal rebuilds it from the checkpoint and the journal.
    let input = [service("web", 1), slice("web", 1, "10.244.1.10", "n1")];
    assert_eq!(supervisor.observe(10, &input).unwrap(), reference.observe(10, &input).unwrap());
    let err = supervisor.swap_staged(staged, DESTRUCTIVE_TICK_FROM_MS).expect_err("the self-check refuses");
    assert!(matches!(err, SupervisorError::SwapSelfCheck { .. }), "{err}");
    assert_eq!(version_name(supervisor.logic()), version_name(builtin()));
    assert_eq!(supervisor.stats().swaps.get("self-check"), Some(&1));
    let next_input = [service("api", 2)];
    assert_eq!(supervisor.observe(20, &next_input).unwrap(), reference.observe(20, &next_input).unwrap());
    assert_eq!(supervisor.export_state().unwrap(), reference.export_state().unwrap());
}

#[test]
fn a_staged_swap_to_a_version_refusing_the_state_is_refused_at_the_import() {
    let mut supervisor = started(next(), CheckpointPolicy::default());
    let err = supervisor.stage(builtin()).unwrap().import().err().expect("refused");
    assert!(matches!(err, SupervisorError::StateRefused { version, .. } if version == STATE_VERSION + 1), "{err}");
    assert_eq!(version_name(supervisor.logic()), version_name(next()));
}

#[test]
fn the_swap_scenario_ends_with_the_same_nrp_as_the_same_events_without_the_swaps() {
    let path = scenario_files().into_iter().find(|p| p.to_string_lossy().contains("a-hot-swap-mid-stream")).unwrap();
    let with_swaps = scenario::read(&path).unwrap();
    let report = simulate::run(&with_swaps, &mut component_reconciler()).unwrap();
    let mut text = Vec::new();
    simulate::render(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(report.passed, "{text}");
    assert!(
        text.contains("swap to next-guest: accepted")
            && text.contains(&format!("state v{STATE_VERSION} ("))
            && text.contains(&format!("bytes) → v{}", STATE_VERSION + 1)),
        "{text}"
    );
    let unsupported = format!("unsupported state version {}", STATE_VERSION + 1);
    assert!(text.contains("swap to builtin: refused") && text.contains(&unsupported), "{text}");

    let mut without = with_swaps.clone();
    without.steps.retain(|s| !matches!(s, scenario::Step::Swap(_) | scenario::Step::Expect(_)));
    let plain = simulate::run(&without, &mut component_reconciler()).unwrap();
    assert_eq!(serde_json::to_value(&report.final_nrp).unwrap(), serde_json::to_value(&plain.final_nrp).unwrap());
    assert!(!plain.final_nrp.locations.is_empty());
}

#[test]
fn a_swap_step_expecting_the_wrong_result_fails_the_scenario() {
    let path = scenario_files().into_iter().find(|p| p.to_string_lossy().contains("a-hot-swap-mid-stream")).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("hostile-guest, expect: refused", "hostile-guest, expect: accepted");
    let scenario = scenario::parse(&path, &text).unwrap();
    let report = simulate::run(&scenario, &mut component_reconciler()).unwrap();
    assert!(!report.passed);
    let check = report.steps.iter().flat_map(|s| &s.checks).find(|c| !c.ok).unwrap();
    assert!(check.what.contains("swap to hostile-guest: refused"), "{check:?}");
    assert_eq!(check.detail.as_deref(), Some("expected it accepted"));
}

#[test]
fn a_swap_step_takes_a_zstd_or_gzip_file_and_refuses_a_truncated_one() {
    let path = scenario_files().into_iter().find(|p| p.to_string_lossy().contains("a-hot-swap-mid-stream")).unwrap();
    let dir = scratch("compressed-swap");
    let truncated = gzip(HOSTILE_GUEST);
    std::fs::write(dir.join("next.wasm.zst"), zstd(NEXT_GUEST)).unwrap();
    std::fs::write(dir.join("destructive.wasm.gz"), gzip(DESTRUCTIVE_GUEST)).unwrap();
    std::fs::write(dir.join("hostile.wasm.gz"), &truncated[..truncated.len() - 3]).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("component: next-guest,", "component: next.wasm.zst,")
        .replace("component: destructive-guest,", "component: destructive.wasm.gz,")
        .replace("component: hostile-guest,", "component: hostile.wasm.gz,");
    let copy = dir.join(path.file_name().unwrap());
    let scenario = scenario::parse(&copy, &text).unwrap();
    let report = simulate::run(&scenario, &mut component_reconciler()).unwrap();
    let mut rendered = Vec::new();
    simulate::render(&report, &mut rendered).unwrap();
    let rendered = String::from_utf8(rendered).unwrap();
    assert!(report.passed, "{rendered}");
    let moved = format!("bytes) → v{}", STATE_VERSION + 1);
    assert!(rendered.contains("next.wasm.zst: accepted") && rendered.contains(&moved), "{rendered}");
    assert!(rendered.contains("the gzip stream is truncated or corrupt"), "{rendered}");
    assert!(rendered.contains("destructive.wasm.gz: refused") && rendered.contains("self-check"), "{rendered}");
}

/// A step that asks NRP to unregister the named Services (`is_delete`), each in its own command.
fn unregistering(names: &[&str]) -> wit::Step {
    let commands = names
        .iter()
        .enumerate()
        .map(|(id, name)| wit::Issued {
            id: id as u64,
            command: wit::Command::UpdateServices(wit::UpdateServices {
                services: vec![wit::NrpServiceRequest {
                    name: (*name).into(),
                    service_type: wit::NrpServiceType::Inbound,
                    backend_pools: Vec::new(),
                    public_nat_gateway: None,
                    is_delete: true,
                }],
            }),
        })
        .collect();
    wit::Step { commands, wake_at_ms: None, idle: false }
}

// No guest shipped with the tests proposes a destructive command the built-in logic would not
// (that needs a dedicated test guest), so the self-check's comparison is tested on its own.

#[test]
fn the_self_check_refuses_a_new_version_that_unregisters_a_service_the_old_one_keeps() {
    let old = unregistering(&[]);
    let new = unregistering(&["6a1f0c8e-2b3d-4e5f-8a9b-000000000001"]);
    let err = self_check(&old, &new).expect_err("an unregister only the new version proposes is refused");
    match &err {
        SupervisorError::SwapSelfCheck { destructive } => {
            assert_eq!(destructive, &["unregister 6a1f0c8e-2b3d-4e5f-8a9b-000000000001".to_owned()])
        }
        other => panic!("expected a self-check refusal, got {other}"),
    }
    assert_eq!(err.kind(), "self-check");
}

#[test]
fn the_self_check_accepts_a_destructive_command_the_old_version_proposes_too() {
    let both = unregistering(&["gone"]);
    self_check(&both, &both).expect("the same unregister on both sides is not new");
    self_check(&unregistering(&["gone", "also-gone"]), &both).expect("proposing less is allowed");
}

#[test]
fn the_self_check_counts_a_repeated_destructive_command_once_per_occurrence() {
    let err = self_check(&unregistering(&["gone"]), &unregistering(&["gone", "gone"]))
        .expect_err("the second unregister is not matched by the old version");
    assert!(matches!(&err, SupervisorError::SwapSelfCheck { destructive } if destructive.len() == 1), "{err}");
}

/// Counts what each `observe` call carries, in objects, on its way to `logic`.
struct Counting<'l, L> {
    logic: &'l mut L,
    calls: Vec<usize>,
}

impl<L: clb_sandbox::logic::Logic> clb_sandbox::logic::Logic for Counting<'_, L> {
    type Error = L::Error;
    fn start(&mut self, config: &wit::Config) -> Result<(), L::Error> {
        self.logic.start(config)
    }
    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, L::Error> {
        self.calls.push(batch.iter().map(clb_sandbox::logic::objects).sum());
        self.logic.observe(now_ms, batch)
    }
    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, L::Error> {
        self.logic.complete(now_ms, results, arm_remaining_writes)
    }
    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, L::Error> {
        self.logic.tick(now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, L::Error> {
        self.logic.stats(now_ms)
    }
}

/// A restart of the benchmark cluster × 20 (20,000 nodes, 20,000 Services, 600,000 pods; four
/// times AKS's 5,000 nodes), through the supervisor, the lists handed over as `clb-host run` and
/// `simulate` hand them: no call into the guest carries more than `MAX_OBJECTS_PER_CALL`
/// objects, and the start-up (lists, NRP's answer, ARM's) and a checkpoint of the whole state
/// end with no call that ran out of fuel, time or memory (the supervisor would have recovered
/// it), under the default fuel and deadline and the 1 GiB `--memory-mib` docs/operations.md
/// gives for this size (the default 512 MiB holds the start-up, not the checkpoint after it).
/// Pins too that a state over wasmtime's default 128 MiB per call reaches the host: with that
/// default every checkpoint of this cluster failed.
#[test]
fn a_start_up_at_twenty_times_the_benchmark_cluster_makes_no_call_over_the_bound_and_checkpoints_in_the_documented_memory()
 {
    use clb_sandbox::logic::{MAX_OBJECTS_PER_CALL, objects, observe_in_calls};
    cluster::at_scale(20, || {
        let lists = cluster::lists();
        let total: usize = lists.iter().map(objects).sum();
        let limits = Limits { memory_bytes: 1 << 30, ..Limits::default() };
        let logic = runtime().load(clb_sandbox::BUILTIN_GUEST, limits).unwrap();
        let mut supervisor = Supervisor::new(&logic);
        supervisor.start(&read_config("clb.yaml")).unwrap();
        let started = std::time::Instant::now();
        let mut counting = Counting { logic: &mut supervisor, calls: Vec::new() };
        let mut issued = Vec::new();
        let last = observe_in_calls(&mut counting, 0, &lists, |step| issued.extend(step.commands)).unwrap();
        issued.extend(last.commands);
        let calls = counting.calls;
        assert!(calls.iter().all(|&n| n <= MAX_OBJECTS_PER_CALL), "largest call: {:?}", calls.iter().max());
        assert!(calls.len() >= total / MAX_OBJECTS_PER_CALL, "{total} objects in {} calls", calls.len());
        drop(lists);
        let answered =
            cluster::settle_commands(wit::Step { commands: issued, wake_at_ms: None, idle: false }, |results| {
                supervisor.complete(0, results).unwrap()
            });
        assert!(answered.contains(&wit::Command::ReadNrp) && answered.contains(&wit::Command::ReadArm));
        let start_up = started.elapsed();
        let memory_started = supervisor.snapshot().serving.and_then(|v| v.memory_bytes).unwrap();
        // A checkpoint of the whole state (as the next policy point or a swap takes it).
        let state = supervisor.export_state().unwrap();
        let errors: Vec<String> = supervisor.take_quarantined().into_iter().map(|q| q.error).collect();
        assert_eq!((supervisor.stats().recoveries, errors.len()), (0, 0), "no call failed: {errors:?}");
        let memory = supervisor.snapshot().serving.and_then(|v| v.memory_bytes).unwrap();
        assert!(memory <= limits.memory_bytes as u64, "{memory} bytes");
        // The figures docs/operations.md gives for this size (informative: nothing here is timed).
        eprintln!(
            "20x start-up: {total} objects in {} calls, {start_up:.1?} (checkpoints included); guest memory {} MiB, \
             {} MiB after a checkpoint of its {} MB state",
            calls.len(),
            memory_started >> 20,
            memory >> 20,
            state.payload.len() / 1_000_000,
        );
    });
}
