//! Ports of upstream's tests of its `difftracker_engine` metrics (metrics_test.go,
//! metrics_exactness_test.go and the metric assertions of the engine's and updater's tests),
//! asserted through `Tracker::stats`, the figures the host renders under upstream's names
//! (crates/sandbox/src/figures.rs). Each test names the upstream test it ports in the comment
//! directly above it (`docs/conformance.md` is generated from those).

use super::upstream_outbound::{
    IDENTITY, drive_until, gone, is_delete, is_outbound, is_pod_finalizer, is_put_nat_gateway, pod, provisioned,
};
use super::*;
use Operation::{Create, Delete, Update};
use ServiceType::{Inbound, Outbound};

/// A second Service, beside the test Service `web`.
const UID2: &str = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e02";

/// The attempts that ended one way, as (operation, type, success, error code, orphan, count).
type Attempt = (Operation, ServiceType, bool, String, bool, u64);

fn attempts(tracker: &Tracker) -> Vec<Attempt> {
    let mut out: Vec<Attempt> = tracker
        .stats(NOW)
        .attempts
        .into_iter()
        .map(|a| (a.operation, a.service_type, a.success, a.error_code, a.orphan, a.count))
        .collect();
    out.sort_by_key(|a| format!("{a:?}"));
    out
}

/// What was counted between `before` and `after`: the series whose count rose, by how much.
fn counted_since(before: &[Attempt], after: &[Attempt]) -> Vec<Attempt> {
    after
        .iter()
        .filter_map(|a| {
            let was =
                before.iter().find(|b| (b.0, b.1, b.2, &b.3, b.4) == (a.0, a.1, a.2, &a.3, a.4)).map_or(0, |b| b.5);
            (a.5 > was).then(|| (a.0, a.1, a.2, a.3.clone(), a.4, a.5 - was))
        })
        .collect()
}

fn success(operation: Operation, service_type: ServiceType) -> Attempt {
    (operation, service_type, true, String::new(), false, 1)
}

fn error(operation: Operation, service_type: ServiceType, code: &str) -> Attempt {
    (operation, service_type, false, code.to_owned(), false, 1)
}

fn histogram(of: &[(Operation, ServiceType, Histogram)], operation: Operation, service_type: ServiceType) -> Histogram {
    of.iter()
        .find(|(o, t, _)| (*o, *t) == (operation, service_type))
        .map(|(_, _, h)| h.clone())
        .expect("every pair listed")
}

/// The pending-operations series that are not zero, as (state, type, count).
fn pending_nonzero(stats: &Stats) -> Vec<(Phase, ServiceType, u32)> {
    assert_eq!(stats.pending.len(), 12, "every state of both types, zeros included");
    stats.pending.iter().filter(|p| p.count > 0).map(|p| (p.phase, p.service_type, p.count)).collect()
}

/// A second Service, `default/api` (port 80 → 8080).
fn api_service() -> Service {
    Service { uid: UID2.into(), name: "api".into(), ..ported(UID2, &[(TCP, 80, to(8080))], &[]) }
}

/// `default/api`'s slice with one ready pod at `address` on `node`.
fn api_slice(address: &str, node: &str) -> Observation {
    Observation::SliceUpserted(EndpointSlice {
        name: "api-1".into(),
        owner_service_uid: Some(UID2.into()),
        ..slice_on(&[(address, node)])
    })
}

fn retyped(service: Service) -> Observation {
    Observation::ServiceUpserted(Service { service_type: Some("ClusterIP".into()), ..service })
}

fn code(status: u16, code: &str) -> Outcome {
    Outcome::Failed(Failure { status, code: Some(code.into()), retry_after_ms: None, message: code.into() })
}

// Upstream TestGuardMetrics_ServiceOperationTotal_IncrementsOnce: one completed creation counts
// exactly one success attempt (operation create, type inbound, no error code, not an orphan), and a
// second one makes it exactly two, nothing more.
#[test]
fn each_completed_creation_adds_exactly_one_to_the_create_success_series() {
    let mut tracker = created_local();
    assert_eq!(attempts(&tracker), [success(Create, Inbound)]);
    let second = Service { uid: UID2.into(), name: "api".into(), ..lb_service("Local") };
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(second)]);
    drive(&mut tracker, NOW + 1, step, answer_ok(&[]));
    assert_eq!(tracker.phase(UID2), Some(Phase::Created));
    assert_eq!(attempts(&tracker), [(Create, Inbound, true, String::new(), false, 2)]);
}

// Upstream TestGuardMetrics_ServiceOperationTotal_ExactlyOncePerCompletion, its six cases: each
// attempt that ends (an inbound creation, update and deletion that succeed, an inbound creation and
// deletion whose step fails, an outbound creation that succeeds) counts exactly one attempt under
// the operation it performed and its result, and nothing else is counted, in any series.
#[test]
fn every_attempt_that_ends_counts_exactly_once_under_the_operation_it_performed() {
    // create success
    assert_eq!(attempts(&created_local()), [success(Create, Inbound)]);
    // create failure: the first step (adding the finalizer) fails with a 500.
    let (tracker, _) = tracker_retrying_its_finalizer();
    assert_eq!(attempts(&tracker), [error(Create, Inbound, "500")]);
    // update success
    let mut tracker = created_with(&[(80, 8080)]);
    let before = attempts(&tracker);
    // As the API server sends it: with the finalizer and the address the creation wrote (else
    // the object is repaired too, an operation of its own).
    let edited = ported(UID, &[(TCP, 80, to(8081))], &[]);
    let edited = Service { finalizers: vec![FINALIZER.into()], ingress_ips: vec!["20.0.0.1".into()], ..edited };
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(edited)]);
    drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    assert_eq!(counted_since(&before, &attempts(&tracker)), [success(Update, Inbound)]);
    // delete success
    let mut tracker = created_with(&[(80, 8080)]);
    let before = attempts(&tracker);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(tracker.phase(UID), None, "deleted");
    assert_eq!(counted_since(&before, &attempts(&tracker)), [success(Delete, Inbound)]);
    // delete failure: the first delete of the teardown fails; the teardown waits for its retry.
    let mut tracker = created_with(&[(80, 8080)]);
    let before = attempts(&tracker);
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    let ok = answer_ok(&[UID]);
    let (issued, _, _) =
        drive(
            &mut tracker,
            NOW + 1,
            step,
            |c| if matches!(c, Command::DeleteResource(_)) { failed(500) } else { ok(c) },
        );
    assert_eq!(issued.iter().filter(|c| matches!(c, Command::DeleteResource(_))).count(), 1, "{issued:?}");
    assert_eq!(counted_since(&before, &attempts(&tracker)), [error(Delete, Inbound, "500")]);
    // outbound create success
    assert_eq!(attempts(&provisioned()), [success(Create, Outbound)]);
}

// Upstream TestGuardMetrics_ServiceOperationTotal_SeparatesErrorAndSuccess: an outbound deletion's
// failed attempt (Azure's code `TooManyRequests`) counts on the error series with that code and
// not on the success series; its retry that succeeds then counts on the success series only.
#[test]
fn a_failed_attempt_counts_only_as_an_error_with_its_code_and_the_retry_that_succeeds_only_as_a_success() {
    let mut tracker = provisioned();
    let before = attempts(&tracker);
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let refuse = |c: &Command| {
        if is_delete(c, ResourceKind::NatGateway) {
            code(429, "TooManyRequests")
        } else {
            super::upstream_outbound::ok(c)
        }
    };
    let (_, _, last) = drive(&mut tracker, NOW + 1, step, refuse);
    assert_eq!(counted_since(&before, &attempts(&tracker)), [error(Delete, Outbound, "TooManyRequests")]);
    let wake = last.wake_at_ms.expect("the delete is retried");
    let step = tracker.tick(wake);
    drive(&mut tracker, wake, step, super::upstream_outbound::ok);
    assert!(tracker.outbound().lifecycles.is_empty());
    let counted = counted_since(&before, &attempts(&tracker));
    assert_eq!(counted.len(), 2, "{counted:?}");
    assert!(counted.contains(&error(Delete, Outbound, "TooManyRequests")), "still one error: {counted:?}");
    assert!(counted.contains(&success(Delete, Outbound)), "{counted:?}");
}

// Upstream TestGuardMetrics_PendingServiceOperationsGauge_NeverNegative: every pending operation is
// counted under its state and type (an inbound creation in progress, an outbound deletion pending),
// and every other series of the twelve reads zero, the outbound deletion in progress included.
// Differs: upstream also counts a created Service under `created`; here `pending` counts operations
// under way, so a created Service that is not parked is counted nowhere.
#[test]
fn each_pending_operation_counts_under_its_state_and_type_and_every_other_series_reads_zero() {
    let (tracker, _held) = in_phase(Phase::CreationInProgress);
    assert_eq!(pending_nonzero(&tracker.stats(NOW)), [(Phase::CreationInProgress, Inbound, 1)]);

    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (_, _drain) = drive_until(&mut tracker, NOW + 1, step, is_location_update);
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::DeletionPending);
    assert_eq!(pending_nonzero(&tracker.stats(NOW + 1)), [(Phase::DeletionPending, Outbound, 1)]);

    let tracker = created_with(&[(80, 8080)]);
    assert_eq!(pending_nonzero(&tracker.stats(NOW)), [], "created, nothing under way");
}

// Upstream TestGuardMetrics_PendingServiceDeletionsGauge_NeverNegative and
// TestOnServiceCreationComplete_RefreshesPendingDeletionsGauge: the pending deletions read 0, then
// exactly 2 while two Services wait for NRP to drop their addresses, then 1 once one of them has
// been torn down (not the count of the last delete request), then 0 once both are: the figure is
// read from the lifecycles when asked, so no completion can leave it stale or below zero.
#[test]
fn the_pending_deletions_follow_the_services_waiting_for_their_drain_down_to_zero() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let node =
        |name: &str, ip: &str| Observation::NodeUpserted(Node { name: name.into(), internal_ips: vec![ip.into()] });
    let web = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(
        NOW,
        vec![
            node("n1", "10.224.0.4"),
            node("n2", "10.224.0.5"),
            Observation::ServiceUpserted(web.clone()),
            Observation::ServiceUpserted(api_service()),
            Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1")])),
            api_slice("10.244.0.6", "n2"),
            Observation::ListsComplete,
        ],
    );
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!((tracker.phase(UID), tracker.phase(UID2)), (Some(Phase::Created), Some(Phase::Created)));
    let stats = tracker.stats(NOW);
    assert_eq!((stats.pending_deletions, stats.blocked_by_locations), (0, 0));

    let step = tracker.observe(NOW + 1, vec![retyped(web)]);
    let mut held = drive_holding_batches(&mut tracker, NOW + 1, step);
    let step = tracker.observe(NOW + 1, vec![retyped(api_service())]);
    held.extend(drive_holding_batches(&mut tracker, NOW + 1, step));
    let stats = tracker.stats(NOW + 1);
    assert_eq!((stats.pending_deletions, stats.blocked_by_locations), (2, 2), "{held:?}");

    // web's drain (location n1) is answered: web is torn down, api still waits.
    let (web_drain, rest): (Vec<_>, Vec<_>) = held.into_iter().partition(|(_, l)| l == &["10.224.0.4".to_owned()]);
    assert_eq!(web_drain.len(), 1, "web's drain alone in its batch: {web_drain:?} {rest:?}");
    let step = tracker.complete(NOW + 2, vec![(web_drain[0].0, Outcome::Ok)]);
    let mut held = rest;
    held.extend(drive_holding_batches(&mut tracker, NOW + 2, step));
    assert_eq!(tracker.phase(UID), None, "web torn down");
    assert_eq!(tracker.phase(UID2), Some(Phase::DeletionPending));
    let stats = tracker.stats(NOW + 2);
    assert_eq!((stats.pending_deletions, stats.blocked_by_locations), (1, 1));

    let step = tracker.complete(NOW + 3, held.iter().map(|(id, _)| (*id, Outcome::Ok)).collect());
    drive(&mut tracker, NOW + 3, step, answer_ok(&[]));
    assert_eq!(tracker.phase(UID2), None, "api torn down");
    let stats = tracker.stats(NOW + 3);
    assert_eq!((stats.pending_deletions, stats.blocked_by_locations), (0, 0));
}

// Upstream TestGuardMetrics_LocationsAndAddressesTotals_ReflectNRPTotalsEveryCycle: the locations and
// addresses NRP holds are the totals, on a cycle with nothing to sync (1 and 1) as after a
// change (a second pod on a second node: 2 and 2, not the 1 and 1 the change itself sent).
#[test]
fn the_locations_and_addresses_are_nrps_totals_on_a_quiet_cycle_and_after_a_change() {
    let mut tracker = created_with(&[(80, 8080)]);
    let stats = tracker.stats(NOW);
    assert_eq!((stats.nrp_locations, stats.nrp_addresses), (1, 1));
    let quiet = tracker.tick(NOW + 1);
    assert!(quiet.commands.is_empty(), "nothing to sync: {:?}", quiet.commands);
    let stats = tracker.stats(NOW + 1);
    assert_eq!((stats.nrp_locations, stats.nrp_addresses), (1, 1), "a quiet cycle still reports the totals");

    let n2 = Observation::NodeUpserted(Node { name: "n2".into(), internal_ips: vec!["10.224.0.5".into()] });
    let slice = Observation::SliceUpserted(slice_on(&[("10.244.0.5", "n1"), ("10.244.0.6", "n2")]));
    let step = tracker.observe(NOW + 2, vec![n2, slice]);
    let (issued, _, _) = drive(&mut tracker, NOW + 2, step, answer_ok(&[UID]));
    assert_eq!(
        programmed(&issued),
        [("10.224.0.5".to_owned(), vec!["10.244.0.6".to_owned()])],
        "the change: one location"
    );
    let stats = tracker.stats(NOW + 2);
    assert_eq!((stats.nrp_locations, stats.nrp_addresses), (2, 2), "the totals, not the change");
}

// Upstream TestTrackedServicesMetric_RefreshedOnServiceCompletion: the services NRP has registered
// follow the completions: one load balancer once the Service is created, none once its deletion
// has completed (and the same for an egress identity's NAT gateway); the figures are read from
// the mirror when asked, so no completion can leave them stale.
#[test]
fn the_tracked_services_follow_the_registrations_up_and_back_down_after_a_deletion() {
    let mut tracker = created_with(&[(80, 8080)]);
    let stats = tracker.stats(NOW);
    assert_eq!((stats.k8s_services, stats.nrp_load_balancers, stats.nrp_nat_gateways), (1, 1, 0));
    let step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(tracker.phase(UID), None);
    let stats = tracker.stats(NOW + 1);
    assert_eq!((stats.k8s_services, stats.nrp_load_balancers, stats.nrp_nat_gateways), (0, 0, 0));

    let mut tracker = provisioned();
    assert_eq!((tracker.stats(NOW).nrp_load_balancers, tracker.stats(NOW).nrp_nat_gateways), (0, 1));
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    drive(&mut tracker, NOW + 1, step, super::upstream_outbound::ok);
    assert!(tracker.outbound().lifecycles.is_empty());
    assert_eq!(tracker.stats(NOW + 1).nrp_nat_gateways, 0);
}

// Upstream TestUpdatePendingOperationOldestAgeMetric_IncludesUpdateInProgress: an update in
// progress is listed under `update_in_progress` with when it began, so an update stuck for an
// hour shows an age of over 3,000 s (the host takes the age from `oldest_began_ms`).
#[test]
fn an_update_in_progress_is_listed_with_when_it_began_so_an_hour_later_its_age_is_an_hour() {
    let (tracker, _held) = in_phase(Phase::UpdateInProgress);
    let hour_later = NOW + 3_600_000;
    let stats = tracker.stats(hour_later);
    assert_eq!(pending_nonzero(&stats), [(Phase::UpdateInProgress, Inbound, 1)]);
    let update =
        stats.pending.iter().find(|p| (p.phase, p.service_type) == (Phase::UpdateInProgress, Inbound)).unwrap();
    let began = update.oldest_began_ms.expect("when it began");
    assert_eq!(began, NOW);
    assert!(hour_later - began > 3_000_000);
}

/// The test Service with its `phase` operation's command held, deleted (Terminating) meanwhile,
/// then the held command answered as `answer` says and everything after it run; returns what
/// was counted from the deletion on.
fn preempted(phase: Phase, answer: Outcome) -> (Tracker, Vec<Attempt>) {
    let (mut tracker, held) = in_phase(phase);
    let (id, _) = held.expect("a command in flight");
    let before = attempts(&tracker);
    let mut step = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(terminating_web())]);
    assert!(tracker.phase(UID).is_some_and(Phase::is_deleting), "pre-empted");
    step.commands.extend(tracker.complete(NOW + 1, vec![(id, answer)]).commands);
    drive(&mut tracker, NOW + 1, step, answer_ok(&[UID]));
    assert_eq!(tracker.phase(UID), None, "deleted");
    let counted = counted_since(&before, &attempts(&tracker));
    (tracker, counted)
}

// Upstream TestOnServiceCreationComplete_PreEmptRecordsCompletedInFlightOperation and
// TestOnServiceCreationComplete_PreEmptRecordsInFlightUpdate, their exactly-once parts: a deletion
// that pre-empts a creation or an update in flight counts one deletion when it completes, the
// pre-empted operation's answer is not counted again as anything (no error series either), and
// the retries histogram observes the one operation that ended (the deletion).
// Differs: upstream also counts the pre-empted create/update as one success, its dispatch being
// the whole operation; here an operation is a sequence of steps and a pre-empted one is abandoned
// between them (what it made is torn down), so it ends in no success (`attempt-count` in
// wit/clb.wit: a success is an operation whose last step succeeded).
#[test]
fn a_deletion_that_preempts_a_creation_or_an_update_in_flight_counts_only_the_deletion_once() {
    for phase in [Phase::CreationInProgress, Phase::UpdateInProgress] {
        for answer in [Outcome::Ok, failed(500)] {
            let (tracker, counted) = preempted(phase, answer.clone());
            assert_eq!(counted, [success(Delete, Inbound)], "{phase:?} {answer:?}");
            let stats = tracker.stats(NOW + 1);
            assert_eq!(histogram(&stats.retries, Delete, Inbound).count, 1, "{phase:?}");
            assert_eq!(histogram(&stats.retries, Update, Inbound).count, 0, "{phase:?}");
            let creations = u64::from(phase == Phase::UpdateInProgress);
            assert_eq!(histogram(&stats.retries, Create, Inbound).count, creations, "the creation before the update");
        }
    }
}

// Upstream TestOnServiceCreationComplete_OrphanDeleteSuccessCountsOrphanCleanup: an orphan (a load
// balancer and public IP of a Service deleted while no controller ran) whose deletion completes
// counts exactly one orphan cleaned, and its deletion counts as an orphan's.
#[test]
fn an_orphans_deletion_that_completes_counts_exactly_one_orphan_cleaned() {
    let orphan = "0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e99";
    let inventory = ArmInventory {
        nat_gateways: Vec::new(),
        public_ips: vec![ListedPublicIp {
            name: format!("{orphan}-pip"),
            version: IpVersion::Ipv4,
            address: Some("20.0.0.9".into()),
            as_put: true,
        }],
        load_balancers: vec![ListedLoadBalancer {
            name: orphan.into(),
            shape: Some(LoadBalancer {
                name: orphan.into(),
                public_ip: format!("{orphan}-pip").into(),
                backend_pool: orphan.into(),
                rules: vec![],
            }),
        }],
    };
    let mut tracker = Tracker::create(clb()).unwrap();
    let step = tracker.observe(NOW, vec![Observation::ListsComplete]);
    let (issued, _, last) = reads_answered(&mut tracker, &step, &[], Outcome::ArmInventory(inventory));
    assert_eq!(issued.iter().filter(|c| matches!(c, Command::DeleteResource(_))).count(), 2, "{issued:?}");
    assert!(last.idle);
    let stats = tracker.stats(NOW);
    assert_eq!(stats.orphans_cleaned, 1);
    assert_eq!(attempts(&tracker), [(Delete, Inbound, true, String::new(), true, 1)]);
}

// Upstream TestRecordServiceParked_CountsByReason, its terminal_error reason: a creation Azure
// refuses for good is parked and counted once under `terminal_error`, and seeing the same spec
// again does not count it again. Differs: upstream's other reason, `retries_exceeded`, has no
// event here (no retry ceiling, docs/design.md §4); the host shows it at zero.
#[test]
fn a_creation_parked_by_a_refusal_counts_once_under_terminal_error() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let spec = ported(UID, &[(TCP, 80, to(8080))], &[]);
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(spec.clone()), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    drive(&mut tracker, NOW, step, |c| if is_put_load_balancer(c) { refused_for_good() } else { ok(c) });
    assert!(tracker.inbound.lifecycles[UID].parked);
    let stats = tracker.stats(NOW);
    assert_eq!(stats.parked, [(figures::PARKED_TERMINAL.to_owned(), 1)]);
    assert_eq!(attempts(&tracker), [error(Create, Inbound, "InvalidParameter")]);
    let again = tracker.observe(NOW + 1, vec![Observation::ServiceUpserted(spec)]);
    assert!(again.commands.is_empty());
    assert_eq!(tracker.stats(NOW + 1).parked, [(figures::PARKED_TERMINAL.to_owned(), 1)]);
}

// Upstream TestServiceOperationRetries_ObservedOncePerOperation: a creation that fails twice and
// then succeeds is observed once, with 2 retries (not once per failed attempt, nor the sum of
// attempt numbers); a creation that succeeds at once is observed too, with 0.
#[test]
fn the_retries_of_an_operation_are_observed_once_when_it_ends_first_try_successes_as_zero() {
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let mut failures = 2;
    let flaky = |c: &Command| {
        if matches!(c, Command::SetFinalizer { .. }) && failures > 0 {
            failures -= 1;
            return failed(500);
        }
        answer_ok(&[])(c)
    };
    super::upstream_outbound::drive(&mut tracker, NOW, step, flaky);
    assert_eq!(tracker.phase(UID), Some(Phase::Created));
    let created = |tracker: &Tracker| histogram(&tracker.stats(NOW).retries, Create, Inbound);
    let once = created(&tracker);
    assert_eq!((once.count, once.sum), (1, 2), "{once:?}");
    let two_errors: Attempt = (Create, Inbound, false, "500".into(), false, 2);
    assert_eq!(attempts(&tracker), [two_errors, success(Create, Inbound)], "two failed attempts, one success");

    let second = Service { uid: UID2.into(), name: "api".into(), ..lb_service("Local") };
    let step = tracker.observe(NOW, vec![Observation::ServiceUpserted(second)]);
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert_eq!(tracker.phase(UID2), Some(Phase::Created));
    let twice = created(&tracker);
    assert_eq!((twice.count, twice.sum), (2, 2), "a first-try success adds an observation of 0: {twice:?}");
    assert_eq!(twice.counts[0], 1, "in the bucket of 0");
}

// Upstream TestOnServiceCreationComplete_OutboundUpdateRecordsNoAzureWrite: an egress identity has
// nothing to update (a pod more is an address, not a write to its resources), so a change to a
// created identity counts no update attempt and observes no update duration, and the identity
// stays created.
#[test]
fn a_pod_added_to_a_created_egress_identity_counts_no_update_and_observes_no_update_duration() {
    let mut tracker = provisioned();
    let step = tracker.observe(NOW + 1, vec![Observation::PodUpserted(pod("q", "10.244.2.11"))]);
    let (issued, _) = super::upstream_outbound::drive(&mut tracker, NOW + 1, step, super::upstream_outbound::ok);
    assert!(issued.iter().any(is_location_update), "the address is sent: {issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::Created);
    assert_eq!(attempts(&tracker), [success(Create, Outbound)], "the creation only");
    let stats = tracker.stats(NOW + 1);
    assert_eq!(histogram(&stats.durations, Update, Outbound).count, 0);
    assert_eq!(histogram(&stats.retries, Update, Outbound).count, 0);
}

// Upstream TestRefreshOperationGauges_ReflectsPodDrivenAndAbortedOperations: the operation a pod
// starts for its egress identity is counted under `not_started`/outbound while it waits (here for
// an ARM write token, the Service beside it having taken the only one), and once the pod is gone
// before anything was written the identity is forgotten and the count is back to zero, no
// phantom left.
#[test]
fn a_pod_driven_operation_counts_as_not_started_and_an_aborted_one_leaves_no_phantom() {
    let one_a_minute = crate::budget::Budget { per_minute: 1, burst: 1 };
    let mut tracker = Tracker::create_with_arm_settled(budgeted(|b| b.arm_writes = one_a_minute)).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    drive(&mut tracker, NOW, step, answer_ok(&[]));
    let outbound = |stats: &Stats| pending_nonzero(stats).into_iter().filter(|p| p.1 == Outbound).collect::<Vec<_>>();
    assert_eq!(outbound(&tracker.stats(NOW)), []);
    let step = tracker.observe(NOW, vec![Observation::PodUpserted(pod("p", "10.244.2.10"))]);
    let (issued, _, _) = drive(&mut tracker, NOW, step, answer_ok(&[]));
    assert!(issued.iter().all(is_pod_finalizer), "no ARM token, so only the pod's finalizer: {issued:?}");
    assert_eq!(tracker.outbound().lifecycles[IDENTITY].phase, Phase::NotStarted, "the pod made an outbound operation");
    assert_eq!(outbound(&tracker.stats(NOW)), [(Phase::NotStarted, Outbound, 1)]);
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let (issued, _, _) = drive(&mut tracker, NOW + 1, step, answer_ok(&[]));
    assert!(issued.iter().all(is_pod_finalizer), "nothing to tear down: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    assert_eq!(outbound(&tracker.stats(NOW + 1)), []);
}

/// An egress identity's teardown whose disassociation halves fail as told (NRP's: the Outbound
/// service unlinked from its NAT gateway; the NAT gateway's: its ServiceGateway cleared); returns
/// the swallowed failures counted and the attempts the teardown counted.
fn teardown_with_disassociation(nrp_half_fails: bool, nat_half_fails: bool) -> (Vec<(String, u64)>, Vec<Attempt>) {
    let mut tracker = provisioned();
    let before = attempts(&tracker);
    let step = tracker.observe(NOW + 1, vec![gone("p")]);
    let answer = |c: &Command| {
        if (nrp_half_fails && is_outbound(c, None, false)) || (nat_half_fails && is_put_nat_gateway(c, false)) {
            Outcome::Failed(Failure {
                status: 503,
                code: None,
                retry_after_ms: None,
                message: "NRP unavailable".into(),
            })
        } else {
            super::upstream_outbound::ok(c)
        }
    };
    let (issued, _) = super::upstream_outbound::drive(&mut tracker, NOW + 1, step, answer);
    assert!(issued.iter().any(|c| is_delete(c, ResourceKind::NatGateway)), "the teardown went on: {issued:?}");
    assert!(tracker.outbound().lifecycles.is_empty());
    let counted = counted_since(&before, &attempts(&tracker));
    (tracker.stats(NOW + 1).delete_substep_failures, counted)
}

// Upstream TestDeleteOutboundService_CountsSwallowedDisassociationFailure: a teardown whose
// disassociation fails and is gone past counts one `disassociate_nat_gateway` failure (whichever
// half failed, and once when both did: upstream's disassociation is one step), and the deletion
// still counts as one success; the control, a disassociation that succeeds, counts none.
#[test]
fn a_teardown_that_goes_past_a_failed_disassociation_counts_it_once_and_one_that_does_not_counts_none() {
    let step = figures::SUBSTEP_DISASSOCIATE.to_owned();
    for (nrp, nat, expected) in [(true, false, 1), (false, true, 1), (true, true, 1), (false, false, 0)] {
        let (failures, counted) = teardown_with_disassociation(nrp, nat);
        assert_eq!(failures, [(step.clone(), expected)], "NRP's half fails: {nrp}, the NAT gateway's: {nat}");
        assert_eq!(counted, [success(Delete, Outbound)], "the swallowed failure is not an attempt's");
    }
}

// Upstream TestCheckInitializationComplete_ParkedOpDoesNotBlockCompletion: start-up ends (the
// lists are in, NRP was read, ARM was adopted, no operation is under way) although a Service's
// creation keeps failing (never idle: its retry timer runs) or one is parked by a refusal; not
// before NRP's and ARM's reads are answered, nor while the Service's command is in flight.
#[test]
fn start_up_ends_while_a_service_keeps_failing_or_is_parked_but_not_before_nrp_and_arm_are_read() {
    // ARM's inventory still to read: start-up ends with its answer.
    let mut tracker = Tracker::create(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    assert_eq!(tracker.stats(NOW).initialized_after_ms, None, "the lists are in, NRP is not read");
    let read = step.commands.iter().find(|c| c.command == Command::ReadNrp).unwrap().id;
    let step = tracker.complete(NOW + 100, vec![(read, Outcome::NrpSnapshot(NrpState::default()))]);
    assert_eq!(tracker.stats(NOW + 100).initialized_after_ms, None, "ARM not read yet");
    let arm = step.commands.iter().find(|c| c.command == Command::ReadArm).expect("ARM is read").id;
    let mut step = tracker.complete(NOW + 300, vec![(arm, Outcome::ArmInventory(ArmInventory::default()))]);
    // Upstream TestCheckInitializationComplete_InProgressOpBlocksCompletion: the Service's first
    // command is in flight, so start-up has not ended.
    assert!(!step.commands.is_empty());
    assert_eq!(tracker.stats(NOW + 300).initialized_after_ms, None, "the Service's command is in flight");
    // Its first failure leaves it waiting out a backoff: start-up has ended, though it is never idle.
    let results: Vec<(u64, Outcome)> = step.commands.iter().map(|c| (c.id, failed(500))).collect();
    step = tracker.complete(NOW + 500, results);
    assert!(!step.idle);
    assert_eq!(tracker.stats(NOW + 500).initialized_after_ms, Some(500));
    // The Service's creation keeps failing: never idle, start-up stays ended.
    let mut now = NOW + 500;
    for _ in 0..5 {
        let results: Vec<(u64, Outcome)> = step.commands.iter().map(|c| (c.id, failed(500))).collect();
        step = if results.is_empty() {
            tracker.tick(step.wake_at_ms.expect("a retry timer"))
        } else {
            tracker.complete(now, results)
        };
        now = now.max(step.wake_at_ms.unwrap_or(now));
        assert!(!step.idle);
        assert_eq!(tracker.stats(now).initialized_after_ms, Some(500));
    }

    // Parked by a refusal.
    let mut tracker = Tracker::create_with_arm_settled(clb()).unwrap();
    let step =
        tracker.observe(NOW, vec![Observation::ServiceUpserted(lb_service("Local")), Observation::ListsComplete]);
    let ok = answer_ok(&[]);
    drive(&mut tracker, NOW, step, |c| if is_put_load_balancer(c) { refused_for_good() } else { ok(c) });
    assert!(tracker.inbound.lifecycles[UID].parked);
    assert_eq!(tracker.stats(NOW).initialized_after_ms, Some(0));
}
