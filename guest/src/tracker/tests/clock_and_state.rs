//! The clock stepping back or reaching the end of time, and state import: old versions, corrupt
//! payloads, and what an import refuses; what the state holds of a slice updated in place.

use super::super::egress::finalizers::PodFinalizers;
use super::super::egress::identities::Egress;
use super::super::egress::outbound::{Outbound, TornDown};
use super::*;

// Regression: after the clock stepped back, a stale backoff deadline held back the end of a
// deletion after its finalizer was removed, an upsert that re-added the finalizer in that
// window was absorbed, and the lifecycle was dropped with the finalizer still held.
// Upstream TestEngineOnServiceCreationComplete_GenuineDeletionCleansUp and
// TestServiceUpdaterDeleteInboundService_FinalizerFailureRetries.
#[test]
fn after_the_clock_steps_back_a_deletion_ends_when_its_finalizer_is_gone_and_a_finalizer_put_back_is_removed() {
    let mut tracker = created_local();
    let deleting = terminating(lb_service("Local"));
    let t1 = NOW + 60_000;
    let step = tracker.observe(t1, vec![Observation::ServiceUpserted(deleting.clone())]);
    let mut removals = 0;
    drive(&mut tracker, t1, step, |command| match command {
        Command::SetFinalizer { present: false, .. } => {
            removals += 1;
            failed(500)
        }
        other => answer_ok(&[])(other),
    });
    assert_eq!(removals, 1);
    let retry = tracker.tick(t1 + 2_000);
    assert_eq!(finalizer_change(&retry).map(|(_, present)| present), Some(false), "{retry:?}");
    // The finalizer is removed; the answer comes after the host's clock stepped back an hour.
    let back = t1 - 3_600_000;
    let step = tracker.complete(back, vec![(finalizer_change(&retry).unwrap().0, Outcome::Ok)]);
    let deleted = step
        .commands
        .iter()
        .any(|c| matches!(&c.command, Command::EmitEvent(e) if e.reason == reason::DELETED_LOAD_BALANCER));
    assert!(deleted, "the deletion ends at once: {step:?}");
    assert_eq!(tracker.phase(UID), None);
    // Someone puts the finalizer back: it is ours, so it is cleaned up and released again.
    let step = tracker.observe(back + 1, vec![Observation::ServiceUpserted(deleting)]);
    let (issued, _, _) = drive(&mut tracker, back + 1, step, answer_ok(&[]));
    assert!(issued.iter().any(|c| matches!(c, Command::SetFinalizer { present: false, .. })), "{issued:?}");
    assert_eq!(tracker.phase(UID), None);
}

// Regression: after the clock stepped back, absolute deadlines stalled every retry until the
// clock caught up.
#[test]
fn after_the_clock_steps_back_an_hour_a_retry_waits_only_what_was_left_of_its_backoff() {
    let (mut tracker, step) = tracker_retrying_its_finalizer();
    let wake = step.wake_at_ms.unwrap();
    assert!((NOW + 1_000..=NOW + 1_200).contains(&wake), "{wake}");
    let back = NOW - 3_600_000;
    let step = tracker.tick(back);
    assert_eq!(finalizer_change(&step), None);
    assert_eq!(step.wake_at_ms, Some(wake - 3_600_000), "told in the host's clock");
    assert_eq!(finalizer_change(&tracker.tick(wake - 3_600_000 - 1)), None);
    assert_eq!(finalizer_change(&tracker.tick(wake - 3_600_000)).map(|(_, present)| present), Some(true));
    // A step forward is time that passed: the next backoff counts from it.
    let step = tracker.complete(NOW + 7_200_000, vec![]);
    assert!(step.commands.iter().any(|c| c.command == Command::ReadNrp), "the resync is overdue: {step:?}");
}

// Regression: a state imported with deadlines further ahead than the tracker ever schedules
// (set under a clock that was ahead, or by a version that honoured any Retry-After) waits no
// longer than the longest delay.
#[test]
fn an_imported_deadline_further_ahead_than_the_longest_delay_is_brought_in_to_it() {
    let (mut tracker, _) = tracker_retrying_its_finalizer();
    let far = NOW + 1_000_000_000_000_000;
    let lifecycle = tracker.inbound.lifecycles.get_mut(UID).unwrap();
    assert!(lifecycle.attempt.not_before_ms > NOW);
    lifecycle.attempt.not_before_ms = far;
    tracker.inbound.work.timers = Default::default();
    tracker.inbound.work.timers.insert(far, UID);
    tracker.nrp.sync.next_read_ms = far;
    let (version, payload) = tracker.export_state();
    let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
    let latest = NOW + 1 + timing::MAX_DELAY_MS;
    let step = imported.tick(NOW + 1);
    assert!(step.commands.is_empty(), "{step:?}");
    assert_eq!(step.wake_at_ms, Some(latest));
    let step = imported.tick(latest - 1);
    assert!(step.commands.is_empty(), "{step:?}");
    let step = imported.tick(latest);
    assert!(step.commands.iter().any(|c| c.command == Command::ReadNrp), "{step:?}");
    assert_eq!(finalizer_change(&step).map(|(_, present)| present), Some(true), "{step:?}");
}

// Regression: fuzz target tracker, a clock at the end of u64 time (now = u64::MAX) made the
// resync always due: every answered read issued the next one and the tracker was never idle.
#[test]
fn at_the_end_of_time_the_tracker_reads_nrp_once_and_is_idle() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step = tracker.observe(u64::MAX, vec![Observation::ListsComplete]);
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).expect("the first read").id;
    let step = tracker.complete(u64::MAX, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
    assert!(step.commands.is_empty(), "{step:?}");
    assert!(step.idle, "{step:?}");
    let step = tracker.tick(u64::MAX);
    assert!(step.commands.is_empty() && step.idle, "{step:?}");
}

// Regression: fuzz target tracker (fuzz/regressions/tracker/
// throttled-at-the-end-of-time-holds-its-writes). At the end of u64 time (now = u64::MAX: no
// host's clock gets there, the fuzzer's does) a 429 empties the ARM write budget, and no time
// passes to refill it: the writes it holds wait, as a refused location waits for a read that
// never comes. The harness now allows that wait; this pins that it is the budget's alone and
// loses nothing: the tracker issues no ARM write while it waits, and the same state imported
// by a host whose clock is sane provisions the Service at the budget's pace.
#[test]
fn at_the_end_of_time_a_throttled_write_waits_for_its_budget_and_an_import_with_a_sane_clock_writes_it() {
    let end = u64::MAX;
    let is_public_ip = |c: &Command| matches!(c, Command::PutPublicIp(_));
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let mut step =
        tracker.observe(end, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let mut throttled_once = false;
    for _ in 0..20 {
        let mut answer = |c: &Command| {
            if is_public_ip(c) && !throttled_once {
                throttled_once = true;
                return throttled(0);
            }
            answer_ok(&[])(c)
        };
        let results: Vec<(u64, Outcome)> = step.commands.iter().map(|c| (c.id, answer(&c.command))).collect();
        step = if results.is_empty() { tracker.tick(end) } else { tracker.complete(end, results) };
        assert!(!throttled_once || !step.commands.iter().any(|c| is_public_ip(&c.command)), "{step:?}");
    }
    assert!(throttled_once, "the public IP was put and throttled");
    let (version, payload) = tracker.export_state();
    let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
    let (mut now, mut put) = (NOW, false);
    while !put && now <= NOW + timing::MAX_DELAY_MS + 60_000 {
        let step = imported.tick(now);
        put = step.commands.iter().any(|c| is_public_ip(&c.command));
        now += 1_000;
    }
    assert!(put, "the imported tracker puts the public IP once its budget and backoff allow");
}

// Regression: fuzz target tracker (fuzz/regressions/tracker/an-address-batch-at-the-end-of-
// time-*). At now = u64::MAX the time of a missing token saturated to `now`, so `token_due`,
// which asked whether that time was after `now`, said a write could go, and `take_token` found
// no token: an address-location batch went out past its write budget (or ARM's pace). Whether a
// token is due is now whether one is there, at any time.
#[test]
fn a_token_is_due_exactly_when_one_can_be_taken_even_at_the_end_of_time() {
    use crate::budget::{ArmPace, WriteKind};
    for now in [NOW, u64::MAX - 1, u64::MAX] {
        // No figure from ARM; one that leaves nothing above the reserve; one that leaves five.
        for pace in [None, Some(ArmPace::reported(None, 40, 40, 0, now)), Some(ArmPace::reported(None, 45, 40, 0, now))]
        {
            for kind in [WriteKind::AddressLocations, WriteKind::Services, WriteKind::Arm] {
                let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
                tracker.budgets.pace = pace;
                let mut writes = 0;
                loop {
                    let due = tracker.budgets.token_due(kind, now);
                    let taken = tracker.budgets.take_token(kind, now);
                    assert_eq!(due.is_none(), taken, "{kind:?} at {now} after {writes} writes, pace {pace:?}");
                    if !taken {
                        break;
                    }
                    writes += 1;
                    assert!(writes < 1_000, "{kind:?}: no budget is that large");
                }
            }
        }
    }
}

#[test]
fn import_refuses_a_newer_version_and_a_corrupt_payload() {
    assert_eq!(Tracker::import_state(clb(), 99, &[]), Err(StateError::UnsupportedVersion(99)));
    assert!(matches!(Tracker::import_state(clb(), STATE_VERSION, &[0xff; 3]), Err(StateError::Corrupt(_))));
}

/// Pins the state format across the change to compact keys (`name.rs`): this state was
/// exported by the tracker before it (version 1, at b1976f7), when every key was a `String`
/// and every collection a `BTreeMap`/`BTreeSet` (7 dual-stack nodes with names longer than a
/// `Name` keeps in place, 5 Services, an IPv6 endpoint change in flight and a Service being
/// deleted). Version 2 writes the same bytes, then the egress side.
#[test]
fn a_state_exported_before_the_compact_keys_imports_and_exports_to_the_same_bytes() {
    let before: &[u8] = include_bytes!("../../../../tests/fixtures/state/v1-small-cluster.bin");
    let tracker = Tracker::import_state(clb(), 1, before).expect("a version 1 state");
    assert!(tracker.nrp_view().len() > 1, "the fixture holds a cluster");
    let (version, payload) = tracker.export_state();
    assert_eq!(version, STATE_VERSION);
    // Version 10 writes the same state with its NRP bookkeeping reshaped, then no pods, then
    // an ARM inventory with nothing left to read or adopt, then full write budgets, then no
    // outbound lifecycles, then no pod held by its finalizer, then no pace set by ARM, then no
    // figures counted, then no identity remembered as torn down.
    assert_eq!(tracker.export_state_as(1), before, "version 1 written again is the fixture");
    assert_eq!(tracker.egress.identities, Egress::default());
    let budget = Buckets::full(&clb().write_budgets());
    let figures = super::super::figures::Figures::default();
    let after_egress = (
        &ArmSync::settled(),
        &budget,
        &Outbound::default(),
        &PodFinalizers::default(),
        None::<crate::budget::ArmPace>,
        &figures,
        &TornDown::default(),
    );
    let expected = [tracker.export_state_as(3), postcard::to_allocvec(&after_egress).unwrap()].concat();
    assert_eq!(payload, expected);
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
}

// Regression: state import accepted trailing bytes.
#[test]
fn a_state_payload_with_bytes_after_it_is_refused_as_corrupt() {
    let tracker = tracker_with_commands_in_flight();
    let (version, payload) = tracker.export_state();
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    let longer = [payload.as_slice(), &[0]].concat();
    let why = corrupt(Tracker::import_state(clb(), version, &longer));
    assert!(why.contains("1 byte(s) after the payload"), "{why}");
}

// Regression: a version-2 payload was imported as version 1, without its egress side.
#[test]
fn a_version_2_payload_offered_as_version_1_is_refused_as_corrupt() {
    let payload = tracker_with_commands_in_flight().export_state_as(2);
    let why = corrupt(Tracker::import_state(clb(), 1, &payload));
    assert!(why.starts_with("state version 1:") && why.contains("after the payload"), "{why}");
}

// Regression: counters of commands in flight were not validated on import.
#[test]
fn a_state_whose_counters_disagree_with_its_commands_in_flight_is_refused_as_corrupt() {
    let tracker = tracker_with_commands_in_flight();
    type Tamper = fn(&mut Tracker);
    let tampered: [(&str, Tamper); 7] = [
        ("Service commands counted", |t| t.outbox.service_commands_in_flight += 1),
        ("NRP writes counted", |t| t.nrp.sync.service_writes_in_flight += 1),
        ("reads of NRP flagged", |t| t.nrp.sync.read_in_flight = true),
        ("batches counted in flight are [0]", |t| _ = t.nrp.sync.batches_in_flight.insert(0, 0)),
        ("the next command id is 1", |t| t.outbox.next_command_id = 1),
        ("whose lifecycle does not wait for it", |t| {
            t.inbound.lifecycles.values_mut().for_each(|l| l.attempt.in_flight = None);
        }),
        ("lifecycles wait for a command", |t| {
            let in_flight = &mut t.outbox.in_flight;
            let (&id, _) = in_flight.iter().find(|(_, f)| matches!(f, InFlight::Service { .. })).unwrap();
            in_flight.remove(&id);
            t.outbox.service_commands_in_flight -= 1;
        }),
    ];
    for (expected, tamper) in tampered {
        let mut state = tracker.clone();
        tamper(&mut state);
        let payload = state.export_state().1;
        let why = corrupt(Tracker::import_state(clb(), STATE_VERSION, &payload));
        assert!(why.contains(expected), "{expected:?} not in {why:?}");
    }
}

// Regression: fuzz target state_import, fuzz/regressions/state_import/lifecycle-in-no-work-set-*
// (a state whose unsettled lifecycle was in no work set, or a pending deletion outside
// `draining`, imported, and that Service was never worked on again; under the invariants
// feature the first quiet tick panicked).
// Upstream TestEngineAddService_NewService and TestEngineUpdateService_NewServiceFallsThrough.
#[test]
fn a_state_with_a_lifecycle_outside_the_work_set_its_phase_needs_is_refused_as_corrupt() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let identity = tracker.inbound.lifecycles.keys().next().unwrap().clone();
    assert!(tracker.inbound.work.runnable.contains(&identity) && tracker.inbound.lifecycles[&identity].has_work_left());
    let (version, payload) = tracker.export_state();
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
    type Tamper = fn(&mut Inbound, &str);
    let import = |tamper: Tamper| {
        let mut state = tracker.clone();
        state.inbound.work.runnable.clear();
        tamper(&mut state.inbound, &identity);
        let payload = state.export_state().1;
        Tracker::import_state(clb(), STATE_VERSION, &payload)
    };
    let refused: [(&str, Tamper); 3] = [
        ("(NotStarted): work left, but in no work set", |_, _| {}),
        ("(NotStarted): draining, but no deletion is pending", |s, id| _ = s.work.draining.insert(id.to_owned())),
        ("(DeletionPending): a pending deletion is not draining", |s, id| {
            s.lifecycles.get_mut(id).unwrap().phase = Phase::DeletionPending;
            s.work.runnable.insert(id.to_owned());
        }),
    ];
    for (expected, tamper) in refused {
        let why = corrupt(import(tamper));
        assert!(why.contains(&format!("the lifecycle of {identity:?} {expected}")), "{expected:?} not in {why:?}");
    }
    let accounted: [Tamper; 3] = [
        |s, id| _ = s.work.timers.insert(5_000, id),
        |s, id| s.lifecycles.get_mut(id).unwrap().parked = true,
        |s, id| {
            s.lifecycles.get_mut(id).unwrap().phase = Phase::DeletionPending;
            s.work.draining.insert(id.to_owned());
        },
    ];
    for tamper in accounted {
        import(tamper).unwrap();
    }
}

// Regression: fuzz target state_import, fuzz/regressions/state_import/next-command-id-at-u64-max
// (an imported next command id of u64::MAX overflowed at the first command: a panic with
// overflow checks, and without them ids wrapped to 0, onto the commands in flight).
#[test]
fn a_state_whose_next_command_id_leaves_no_room_to_count_is_refused_as_corrupt() {
    let tracker = tracker_with_commands_in_flight();
    for (next, refused) in [(u64::MAX, true), ((1 << 63) + 1, true), ((1 << 63), false)] {
        let mut state = tracker.clone();
        state.outbox.next_command_id = next;
        let payload = state.export_state().1;
        match Tracker::import_state(clb(), STATE_VERSION, &payload) {
            Err(StateError::Corrupt(why)) if refused => assert!(why.contains("the next command id"), "{why}"),
            Ok(mut imported) if !refused => _ = imported.tick(NOW),
            other => panic!("next command id {next}: {other:?}"),
        }
    }
}

#[test]
fn a_version_1_state_imports_as_a_tracker_with_no_egress_pods_and_exports_as_the_current_version() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    tracker.observe(0, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let version_1 = tracker.export_state_as(1);
    let imported = Tracker::import_state(clb(), 1, &version_1).unwrap();
    // With nothing counted (version 9): otherwise the same state.
    tracker.figures = Default::default();
    assert_eq!(imported, tracker);
    let (version, payload) = imported.export_state();
    assert_eq!(version, STATE_VERSION);
    assert_eq!(Tracker::import_state(clb(), version, &payload).unwrap(), tracker);
}

#[test]
fn a_version_2_state_with_its_batch_in_flight_imports_with_that_batch_in_flight_and_its_answer_applies() {
    let (mut tracker, batch) = tracker_with_a_batch_in_flight();
    let version_2 = tracker.export_state_as(2);
    let mut imported = Tracker::import_state(clb(), 2, &version_2).unwrap();
    // Issued at time 0 as far as version 3 knows, with full write budgets (version 5) and
    // nothing counted (version 9): otherwise the same state.
    tracker.nrp.sync.batches_in_flight.values_mut().for_each(|at| *at = 0);
    tracker.budgets.buckets = Buckets::full(&clb().write_budgets());
    tracker.figures = Default::default();
    assert_eq!(imported, tracker);
    imported.complete(10_000, vec![(batch, Outcome::Ok)]);
    assert!(imported.nrp.sync.batches_in_flight.is_empty() && !imported.nrp_view().is_empty());
}

/// The figures travel with the state (version 9), so they are a function of the inputs alone: a
/// tracker exported and imported mid-operation (a swap, a checkpoint and rebuild) counts on
/// exactly as the one that was not, and a version-8 state imports with none counted.
#[test]
fn the_figures_are_state_version_9_and_count_on_across_an_export_and_import() {
    let (mut tracker, step) = tracker_retrying_its_finalizer();
    let stats = tracker.stats(NOW);
    let failed = stats.attempts.iter().find(|a| !a.success).expect("the failed finalizer write is an attempt");
    assert_eq!((failed.error_code.as_str(), failed.count), ("500", 1));
    let (version, payload) = tracker.export_state();
    assert_eq!(version, STATE_VERSION);
    let mut imported = Tracker::import_state(clb(), version, &payload).unwrap();
    assert_eq!(imported, tracker);
    assert_eq!(imported.stats(NOW), stats);
    // Both finish the operation the same way and report the same figures.
    let later = NOW + 60_000;
    let wake = tracker.tick(later);
    drive(&mut tracker, later, wake, answer_ok(&[]));
    let wake = imported.tick(later);
    drive(&mut imported, later, wake, answer_ok(&[]));
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert_eq!(imported.stats(later), tracker.stats(later));
    let succeeded = tracker.stats(later).attempts.iter().filter(|a| a.success).map(|a| a.count).sum::<u64>();
    assert_eq!(succeeded, 1, "one operation succeeded");
    drop(step);
    // A version-8 state imports with no figures: nothing counted yet.
    let v8 = Tracker::import_state(clb(), 8, &tracker.export_state_as(8)).unwrap();
    assert_eq!(
        (&v8.outbox, &v8.kube, &v8.inbound, &v8.nrp),
        (&tracker.outbox, &tracker.kube, &tracker.inbound, &tracker.nrp)
    );
    assert!(v8.stats(later).attempts.is_empty());
}

// Regression guard for the cheap path of a slice update (a few endpoints changed, its shape the
// same), which converts and stores only the changed endpoints: it must still store the slice
// exactly as it came, as the full path would — every changed endpoint, and the owner's UID as
// written (compared lower-cased, so a change of case alone takes that path too).
#[test]
fn a_slice_updated_in_place_is_stored_and_resolved_as_a_fresh_read_of_it_would_be() {
    let node =
        |name: &str, ip: &str| Observation::NodeUpserted(Node { name: name.into(), internal_ips: vec![ip.into()] });
    let nodes = || vec![node("n1", "10.224.0.4"), node("n2", "10.224.0.5")];
    let first = slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n2"), ("10.244.0.7", "n1")]);
    let mut second = first.clone();
    second.endpoints[1].ready = Some(false);
    second.endpoints[2].addresses = vec!["10.244.0.8".into()];
    second.owner_service_uid = Some(UID.to_ascii_uppercase());
    let key = second.key();

    let mut updated = created_local();
    let mut observations = nodes();
    observations.push(Observation::SliceUpserted(first));
    updated.observe(NOW, observations);
    updated.observe(NOW, vec![Observation::SliceUpserted(second.clone())]);
    let mut fresh = created_local();
    let mut observations = nodes();
    observations.push(Observation::SliceUpserted(second));
    fresh.observe(NOW, observations);

    let (updated, fresh) = (&updated.kube.slices[&key], &fresh.kube.slices[&key]);
    assert_eq!(updated, fresh);
    assert_eq!(updated.slice.owner_service_uid.as_deref(), Some(UID.to_ascii_uppercase().as_str()));
    assert_eq!(updated.resolved.len(), 2, "{:?}", updated.resolved);
}
