//! Writes of ours that land after the teardown they belonged to: a registration NRP holds again
//! of an egress identity this tracker tore down lately, carried by no pod, is torn down again at
//! the next read of NRP; one found after the window, or one a pod carries, is not.

use super::super::egress::outbound::{TORN_DOWN_WINDOW_MS, TornDown};
use super::upstream_outbound::{IDENTITY, drive, gone, is_outbound, ok, pod, provisioned};
use super::*;

/// NRP's answer to a read after a late unlink landed: the identity registered, with no NAT
/// gateway and no address.
fn registered_again(command: &Command) -> Outcome {
    match command {
        Command::ReadNrp => Outcome::NrpSnapshot(NrpState {
            services: vec![NrpService {
                name: IDENTITY.into(),
                service_type: "Outbound".into(),
                backend_pools: vec![],
                is_default: false,
            }],
            locations: vec![],
        }),
        other => ok(other),
    }
}

/// egress-c created, its one pod gone and the identity torn down; returns the time.
fn torn_down() -> (Tracker, u64) {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (issued, now) = drive(&mut tracker, NOW + 1, step, ok);
    assert!(issued.iter().any(|c| is_outbound(c, None, true)), "torn down: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert_eq!(tracker.egress.torn_down.identities().collect::<Vec<_>>(), [IDENTITY]);
    (tracker, now)
}

/// The commands of the reads of NRP due up to `until`, every read answered by `answer`.
fn reads_until(tracker: &mut Tracker, mut now: u64, until: u64, answer: impl Fn(&Command) -> Outcome) -> Vec<Command> {
    let mut issued = Vec::new();
    while let Some(at) = tracker.tick(now).wake_at_ms.filter(|&at| at <= until) {
        now = now.max(at);
        let step = tracker.tick(now);
        let (more, after) = drive(tracker, now, step, &answer);
        issued.extend(more);
        now = after.max(now + 1);
    }
    issued
}

// Regression: a previous leader's unlink of an egress identity, in flight when it lost its
// lease, landed after its successor had torn the identity down; NRP took it as a registration
// without a NAT gateway, which the successor then left alone for good as somebody else's (found
// by `clb-host explore --classes failover`).
#[test]
fn a_registration_a_late_write_brings_back_after_the_teardown_is_unregistered_at_the_next_read() {
    let (mut tracker, now) = torn_down();
    let issued = reads_until(&mut tracker, now, now + timing::RESYNC_INTERVAL_MS + 1, registered_again);
    assert!(issued.contains(&Command::ReadNrp), "{issued:?}");
    let writes: Vec<&Command> = issued.iter().filter(|c| !matches!(c, Command::ReadNrp)).collect();
    assert!(writes.iter().any(|c| is_outbound(c, None, true)), "unregistered again: {writes:?}");
    assert!(
        writes.iter().all(|c| matches!(c, Command::UpdateServices(_))),
        "nothing but NRP's registration is written again (no NAT gateway PUT, no delete): {writes:?}"
    );
    assert!(tracker.outbound().lifecycles.is_empty() && tracker.is_quiet());
}

#[test]
fn the_teardown_is_remembered_across_a_state_move() {
    let (tracker, now) = torn_down();
    let (version, payload) = tracker.export_state();
    let mut moved = Tracker::import_state(clb(), version, &payload).expect("its own state");
    assert_eq!(moved.egress.torn_down, tracker.egress.torn_down);
    let issued = reads_until(&mut moved, now, now + timing::RESYNC_INTERVAL_MS + 1, registered_again);
    assert!(issued.iter().any(|c| is_outbound(c, None, true)), "{issued:?}");
}

#[test]
fn a_registration_found_once_the_window_has_passed_is_left_alone_as_somebody_elses() {
    let (mut tracker, now) = torn_down();
    let until = now + TORN_DOWN_WINDOW_MS + timing::RESYNC_INTERVAL_MS;
    let quiet = reads_until(&mut tracker, now, until, ok);
    assert!(quiet.iter().all(|c| *c == Command::ReadNrp), "{quiet:?}");
    assert_eq!(tracker.egress.torn_down, TornDown::default(), "forgotten after its window");
    let issued = reads_until(&mut tracker, until, until + timing::RESYNC_INTERVAL_MS + 1, registered_again);
    assert!(issued.iter().all(|c| *c == Command::ReadNrp), "left alone: {issued:?}");
}

#[test]
fn a_pod_that_carries_the_identity_again_makes_it_ours_and_forgets_the_teardown() {
    let (mut tracker, now) = torn_down();
    let step = tracker.observe(now, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let (issued, _) = drive(&mut tracker, now, step, ok);
    assert!(issued.iter().any(|c| is_outbound(c, Some(IDENTITY), false)), "created again: {issued:?}");
    assert_eq!(tracker.egress.torn_down, TornDown::default());
}

#[test]
fn the_identities_remembered_are_bounded_and_the_first_recorded_goes_first() {
    use super::super::egress::outbound::TORN_DOWN_CAP;
    let mut torn_down = TornDown::default();
    for i in 0..=TORN_DOWN_CAP as u64 {
        torn_down.record(&format!("egress-{i}"), NOW + i);
    }
    assert_eq!(torn_down.identities().count(), TORN_DOWN_CAP);
    assert!(!torn_down.identities().any(|id| id == "egress-0"), "the first recorded went first");
    assert!(torn_down.check().is_ok());
    torn_down.expire(NOW + TORN_DOWN_WINDOW_MS + TORN_DOWN_CAP as u64);
    assert_eq!(torn_down, TornDown::default());
}
