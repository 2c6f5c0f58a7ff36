use super::*;
use std::collections::BTreeSet;

fn op(service: &str, lb: &str, pool: &str, kind: OperationKind, ips: &[&str]) -> PoolOperation {
    PoolOperation {
        service: service.into(),
        load_balancer: lb.into(),
        pool: pool.into(),
        kind,
        node_ips: ips.iter().map(|s| s.to_string()).collect(),
    }
}

fn add(service: &str, lb: &str, pool: &str, ips: &[&str]) -> PoolOperation {
    op(service, lb, pool, OperationKind::Add, ips)
}

fn remove(service: &str, lb: &str, pool: &str, ips: &[&str]) -> PoolOperation {
    op(service, lb, pool, OperationKind::Remove, ips)
}

fn assign(pairs: &[(&str, &str)]) -> Vec<ServiceAssignment> {
    pairs.iter().map(|(s, lb)| ServiceAssignment { service: s.to_string(), load_balancer: lb.to_string() }).collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn failed(status: u16, retry_after_ms: Option<u64>) -> GroupOutcome {
    GroupOutcome::Failed(Failure { status, code: None, retry_after_ms, message: format!("HTTP {status}") })
}

fn keys(groups: &[PoolGroup]) -> Vec<String> {
    groups.iter().map(|g| format!("{}:{}", g.load_balancer, g.pool)).collect()
}

// Upstream TestGroupOperations "nil input".
#[test]
fn an_empty_queue_drains_to_no_groups() {
    let mut q = PoolQueue::default();
    assert!(q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).is_empty());
    assert_eq!(q.in_flight(), 0);
}

// Upstream TestGroupOperations "single op grouped by pool key";
// TestLoadBalancerBackendPoolUpdater "Add node IPs to backend pool".
#[test]
fn a_single_add_becomes_one_group_for_its_pool() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.2", "10.0.0.1"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!((g.load_balancer.as_str(), g.pool.as_str()), ("lb1", "pool1"));
    assert_eq!(g.add, strings(&["10.0.0.1", "10.0.0.2"]));
    assert!(g.remove.is_empty());
    assert_eq!(g.services, strings(&["ns/a"]));
}

// Upstream TestLoadBalancerBackendPoolUpdater "Remove node IPs from backend pool".
#[test]
fn a_single_remove_becomes_a_group_that_removes() {
    let mut q = PoolQueue::default();
    q.enqueue([remove("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups[0].remove, strings(&["10.0.0.1"]));
    assert!(groups[0].add.is_empty());
}

// Upstream TestGroupOperations "same pool grouped together".
#[test]
fn operations_on_the_same_pool_share_one_group_with_every_service_named_once() {
    let mut q = PoolQueue::default();
    q.enqueue([
        add("ns/a", "lb1", "pool1", &["10.0.0.1"]),
        add("ns/b", "lb1", "pool1", &["10.0.0.2"]),
        add("NS/A", "LB1", "POOL1", &["10.0.0.3"]),
    ]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]));
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].add, strings(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]));
    assert_eq!(groups[0].services, strings(&["ns/a", "ns/b"]), "distinct, in arrival order");
}

// Upstream TestGroupOperations "different pools separate";
// TestLoadBalancerBackendPoolUpdater "Multiple operations targeting different backend pools".
#[test]
fn operations_on_different_pools_give_groups_sorted_by_key() {
    let mut q = PoolQueue::default();
    q.enqueue([
        add("ns/c", "lb2", "pool-c", &["10.0.0.3"]),
        add("ns/a", "lb1", "pool-b", &["10.0.0.1"]),
        add("ns/b", "lb1", "pool-a", &["10.0.0.2"]),
    ]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb1"), ("ns/c", "lb2")]));
    assert_eq!(keys(&groups), strings(&["lb1:pool-a", "lb1:pool-b", "lb2:pool-c"]));
    let ids: BTreeSet<u64> = groups.iter().map(|g| g.id).collect();
    assert_eq!(ids.len(), 3, "every group has its own id");
}

// Upstream TestGroupOperations "skips operations for non-local services";
// TestLoadBalancerBackendPoolUpdater "not local service".
#[test]
fn an_operation_of_a_service_that_is_not_local_is_dropped() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/gone", "lb1", "pool1", &["10.0.0.1"])]);
    assert!(q.drain_and_group(0, &assign(&[("ns/other", "lb1")])).is_empty());
    assert!(q.is_empty(), "a dropped operation is not kept either");
}

// Upstream TestGroupOperations "skips operations targeting stale load balancer";
// TestLoadBalancerBackendPoolUpdater "not on this load balancer".
#[test]
fn an_operation_for_a_load_balancer_the_service_left_is_dropped() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    assert!(q.drain_and_group(0, &assign(&[("ns/a", "lb2")])).is_empty());
}

#[test]
fn service_and_load_balancer_names_match_case_insensitively() {
    let mut q = PoolQueue::default();
    q.enqueue([add("NS/A", "LB1", "pool1", &["10.0.0.1"])]);
    assert_eq!(q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).len(), 1);
}

// Upstream TestGroupOperations "keeps valid operation when another is filtered".
#[test]
fn a_valid_operation_survives_when_its_neighbour_is_filtered() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/gone", "lb1", "pool1", &["10.0.0.9"]), add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].add, strings(&["10.0.0.1"]));
    assert_eq!(groups[0].services, strings(&["ns/a"]));
}

// Upstream TestDrainOperations "returns single operation", "returns all operations in
// order" (queue left empty) and TestCountOperations.
#[test]
fn draining_empties_the_queue_and_counting_counts_what_is_queued() {
    let mut q = PoolQueue::default();
    assert_eq!(q.len(), 0);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    assert_eq!(q.len(), 1);
    q.enqueue([remove("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/b", "lb1", "pool2", &["10.0.0.2"])]);
    assert_eq!(q.len(), 3);
    assert_eq!(q.status(0), QueueStatus { queued: 3, ready: true, wake_at_ms: None });
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]));
    assert!(q.is_empty());
    assert_eq!(q.status(0), QueueStatus { queued: 0, ready: false, wake_at_ms: None });
    // The order survives as "last operation wins": add then remove ⇒ removed.
    assert_eq!(groups[0].remove, strings(&["10.0.0.1"]));
}

// Upstream TestLoadBalancerBackendPoolUpdater "Multiple operations in two batches".
#[test]
fn operations_queued_after_a_drain_form_the_next_batch() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let first = q.drain_and_group(0, &a);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.2"])]);
    // The host reports a group before the next tick drains its pool again (a pool with a group in
    // flight is not drained until that group is reported).
    q.report(0, first[0].id, &GroupOutcome::Updated).unwrap();
    let second = q.drain_and_group(0, &a);
    assert_eq!(first[0].add, strings(&["10.0.0.1"]));
    assert_eq!(second[0].add, strings(&["10.0.0.2"]));
    assert_ne!(first[0].id, second[0].id);
}

// Upstream TestLoadBalancerBackendPoolUpdater "add operation deduplicates IPs in empty pool".
#[test]
fn an_add_naming_an_ip_twice_adds_it_once() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1", "10.0.0.1", "FD00::0A", "fd00::a"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups[0].add, strings(&["10.0.0.1", "fd00::a"]));
}

// Upstream TestLoadBalancerBackendPoolUpdater "remove-then-add deduplicates IPs".
#[test]
fn a_remove_then_an_add_of_the_same_ip_leaves_it_in_the_pool_once() {
    let mut q = PoolQueue::default();
    q.enqueue([remove("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/a", "lb1", "pool1", &["10.0.0.1", "10.0.0.1"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups[0].add, strings(&["10.0.0.1"]));
    assert!(groups[0].remove.is_empty());
}

// Upstream TestLoadBalancerBackendPoolUpdater "add-then-remove deduplicates IPs and removes
// target".
#[test]
fn an_add_then_a_remove_of_the_same_ip_removes_it() {
    let mut q = PoolQueue::default();
    q.enqueue([
        add("ns/a", "lb1", "pool1", &["10.0.0.1", "10.0.0.1", "10.0.0.2"]),
        remove("ns/a", "lb1", "pool1", &["10.0.0.1"]),
    ]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1")]));
    assert_eq!(groups[0].add, strings(&["10.0.0.2"]));
    assert_eq!(groups[0].remove, strings(&["10.0.0.1"]));
}

#[test]
fn a_pool_whose_operations_name_no_ip_gives_no_group() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &[])]);
    assert!(q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).is_empty());
    assert_eq!(q.in_flight(), 0);
}

// Upstream TestLoadBalancerBackendPoolUpdater "remove operations by service name" and
// removeOperation's case-insensitive match.
#[test]
fn removing_a_services_operations_cancels_them_before_the_drain() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/b", "lb1", "pool2", &["10.0.0.2"])]);
    assert_eq!(q.remove_operations("NS/A"), 1);
    assert_eq!(q.remove_operations("ns/a"), 0);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]));
    assert_eq!(keys(&groups), strings(&["lb1:pool2"]));
}

// Upstream TestLoadBalancerBackendPoolUpdater "Backend pool not found".
#[test]
fn a_pool_that_is_not_found_is_dropped_silently() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    let report = q.report(0, g.id, &failed(404, None)).unwrap();
    assert_eq!(report, GroupReport { disposition: Disposition::Dropped, not_before_ms: None, events: vec![] });
    assert!(q.is_empty());
}

// Upstream TestLoadBalancerBackendPoolUpdaterFailed "Non-retriable error when getting
// backend pool" / "… when updating backend pool": dropped with a failure Event — here one
// per distinct Service, where upstream told only the first.
#[test]
fn a_terminal_failure_is_abandoned_with_one_warning_per_distinct_service() {
    let mut q = PoolQueue::default();
    q.enqueue([
        add("ns/a", "lb1", "pool1", &["10.0.0.1"]),
        add("ns/b", "lb1", "pool1", &["10.0.0.2"]),
        remove("ns/a", "lb1", "pool1", &["10.0.0.3"]),
    ]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb1")])).remove(0);
    let report = q.report(0, g.id, &failed(500, None)).unwrap();
    assert_eq!(report.disposition, Disposition::Abandoned);
    let warned: Vec<(&str, EventType, &str)> =
        report.events.iter().map(|e| (e.service.as_str(), e.event_type, e.reason.as_str())).collect();
    assert_eq!(warned, vec![("ns/a", EventType::Warning, REASON_FAILED), ("ns/b", EventType::Warning, REASON_FAILED)]);
    assert!(q.is_empty());
    assert_eq!(q.report(0, g.id, &failed(500, None)), None, "a group is reported once");
}

#[test]
fn a_timeout_without_an_answer_is_terminal() {
    assert_eq!(
        classify(&Failure { status: 0, code: None, retry_after_ms: None, message: String::new() }),
        FailureClass::Terminal
    );
    for status in [409, 412, 429] {
        assert_eq!(
            classify(&Failure { status, code: None, retry_after_ms: None, message: String::new() }),
            FailureClass::Retriable
        );
    }
}

#[test]
fn a_successful_write_tells_every_service_and_an_unchanged_pool_tells_none() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/b", "lb1", "pool1", &["10.0.0.2"])]);
    let g = q.drain_and_group(0, &a).remove(0);
    let report = q.report(0, g.id, &GroupOutcome::Updated).unwrap();
    assert_eq!(report.disposition, Disposition::Done);
    assert_eq!(report.events.iter().map(|e| e.service.as_str()).collect::<Vec<_>>(), vec!["ns/a", "ns/b"]);
    assert!(report.events.iter().all(|e| e.event_type == EventType::Normal && e.reason == REASON_UPDATED));
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(0, &a).remove(0);
    assert!(q.report(0, g.id, &GroupOutcome::Unchanged).unwrap().events.is_empty());
}

#[test]
fn a_throttled_group_is_requeued_ahead_of_newer_operations_and_parked_until_retry_after() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(1_000, &a).remove(0);
    // Arrived while the group was in flight: newer than the group's operation.
    q.enqueue([remove("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let report = q.report(1_000, g.id, &failed(429, Some(5_000))).unwrap();
    assert_eq!(report.disposition, Disposition::Requeued);
    assert_eq!(report.not_before_ms, Some(6_000));
    assert_eq!(report.events.len(), 1);
    assert_eq!(report.events[0].reason, REASON_RETRYING);
    assert_eq!(q.status(2_000), QueueStatus { queued: 2, ready: false, wake_at_ms: Some(6_000) });
    assert!(q.drain_and_group(2_000, &a).is_empty(), "parked until Retry-After");
    assert_eq!(q.len(), 2, "parked operations stay queued");
    let g = q.drain_and_group(6_000, &a).remove(0);
    // Chronological order kept: the requeued add first, the newer remove last ⇒ removed.
    assert_eq!(g.remove, strings(&["10.0.0.1"]));
    assert!(g.add.is_empty());
}

// Regression: a requeued older add ran after a newer remove.
#[test]
fn a_pool_with_a_group_in_flight_is_not_drained_again_until_that_group_is_reported() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g1 = q.drain_and_group(0, &a).remove(0);
    assert_eq!(g1.add, strings(&["10.0.0.1"]));
    q.enqueue([remove("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/b", "lb1", "pool2", &["10.0.0.2"])]);
    assert!(q.status(0).ready, "another pool is drainable");
    let groups = q.drain_and_group(0, &a);
    assert_eq!(keys(&groups), strings(&["lb1:pool2"]), "pool1 waits for g1's report");
    assert_eq!(q.len(), 1, "the remove stays queued");
    assert_eq!(q.status(0), QueueStatus { queued: 1, ready: false, wake_at_ms: None });
    q.report(0, groups[0].id, &GroupOutcome::Updated).unwrap();
    assert!(q.drain_and_group(0, &a).is_empty(), "still waiting for g1");
    let report = q.report(0, g1.id, &failed(409, None)).unwrap();
    assert_eq!(report.disposition, Disposition::Requeued);
    assert!(q.status(0).ready);
    let g = q.drain_and_group(0, &a).remove(0);
    // The requeued add first, then the newer remove: the net effect is the remove.
    assert_eq!((g.add, g.remove), (vec![], strings(&["10.0.0.1"])));
    assert!(q.is_empty());
}

// Regression: Retry-After was never capped, and a huge one overflowed a u64.
#[test]
fn a_retry_after_longer_than_five_minutes_parks_the_pool_for_five_minutes_and_says_so() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1")]);
    let now = 1_700_000_000_000;
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(now, &a).remove(0);
    let report = q.report(now, g.id, &failed(429, Some(u64::MAX))).unwrap();
    assert_eq!(report.not_before_ms, Some(now + MAX_RETRY_AFTER_MS));
    assert!(report.events[0].message.contains("capped at 300000 ms"), "{}", report.events[0].message);
    assert_eq!(q.status(now).wake_at_ms, Some(now + MAX_RETRY_AFTER_MS));
    assert!(q.drain_and_group(now + MAX_RETRY_AFTER_MS - 1, &a).is_empty());
    let g = q.drain_and_group(now + MAX_RETRY_AFTER_MS, &a).remove(0);
    // At the end of time the park saturates instead of wrapping round to "now".
    let report = q.report(u64::MAX - 1, g.id, &failed(429, Some(10_000))).unwrap();
    assert_eq!(report.not_before_ms, Some(u64::MAX));
    assert!(!report.events[0].message.contains("capped"));
    assert!(!q.status(u64::MAX - 1).ready);
}

// Regression: after the clock stepped back, deadlines waited for it to catch up.
#[test]
fn after_the_clock_steps_back_a_parked_pool_waits_only_what_was_left_of_its_park() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(10_000_000, &a).remove(0);
    let report = q.report(10_000_000, g.id, &failed(429, Some(60_000))).unwrap();
    assert_eq!(report.not_before_ms, Some(10_060_000));
    assert!(q.drain_and_group(10_020_000, &a).is_empty(), "parked");
    // The host's clock steps back an hour: 40 s of the park are left, not 1 h 40 s.
    let back = 10_020_000 - 3_600_000;
    assert_eq!(q.status(back).wake_at_ms, Some(back + 40_000));
    assert!(q.drain_and_group(back, &a).is_empty());
    assert!(q.drain_and_group(back + 39_999, &a).is_empty());
    let g = q.drain_and_group(back + 40_000, &a).remove(0);
    // Times the host is told are in its own clock.
    let report = q.report(back + 40_000, g.id, &failed(429, Some(1_000))).unwrap();
    assert_eq!(report.not_before_ms, Some(back + 41_000));
    assert_eq!(q.status(back + 40_500).wake_at_ms, Some(back + 41_000));
}

#[test]
fn a_parked_pool_does_not_hold_back_other_pools() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(0, &a).remove(0);
    q.report(0, g.id, &failed(429, Some(10_000))).unwrap();
    q.enqueue([add("ns/b", "lb1", "pool2", &["10.0.0.2"])]);
    assert!(q.status(1).ready);
    assert_eq!(keys(&q.drain_and_group(1, &a)), strings(&["lb1:pool2"]));
    assert_eq!(q.len(), 1);
}

#[test]
fn a_conflict_is_retried_within_the_budget_then_abandoned() {
    let mut q = PoolQueue::new(2);
    let a = assign(&[("ns/a", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let mut dispositions = Vec::new();
    for _ in 0..3 {
        let g = q.drain_and_group(0, &a).remove(0);
        dispositions.push(q.report(0, g.id, &failed(412, None)).unwrap().disposition);
    }
    assert_eq!(dispositions, vec![Disposition::Requeued, Disposition::Requeued, Disposition::Abandoned]);
    assert!(q.is_empty());
}

#[test]
fn a_budget_of_zero_never_retries() {
    let mut q = PoolQueue::new(0);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    assert_eq!(q.report(0, g.id, &failed(409, None)).unwrap().disposition, Disposition::Abandoned);
}

#[test]
fn a_service_removed_while_its_group_is_in_flight_is_not_requeued() {
    let mut q = PoolQueue::default();
    let a = assign(&[("ns/a", "lb1"), ("ns/b", "lb1")]);
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"]), add("ns/b", "lb1", "pool1", &["10.0.0.2"])]);
    let g = q.drain_and_group(0, &a).remove(0);
    q.remove_operations("ns/a");
    assert_eq!(q.report(0, g.id, &failed(412, None)).unwrap().disposition, Disposition::Requeued);
    let g = q.drain_and_group(0, &a).remove(0);
    assert_eq!(g.add, strings(&["10.0.0.2"]));
    assert_eq!(g.services, strings(&["ns/b"]));
    q.remove_operations("ns/b");
    assert_eq!(q.report(0, g.id, &failed(412, None)).unwrap().disposition, Disposition::Dropped);
    assert!(q.is_empty());
}

#[test]
fn a_requeued_operation_is_dropped_when_its_service_moved_meanwhile() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "pool1", &["10.0.0.1"])]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    q.report(0, g.id, &failed(409, None)).unwrap();
    assert!(q.drain_and_group(0, &assign(&[("ns/a", "lb2")])).is_empty());
    assert!(q.is_empty());
}

fn delete(service: &str, lb: &str, pool: &str) -> PoolOperation {
    op(service, lb, pool, OperationKind::DeletePool, &[])
}

// Upstream cleanupLocalServiceBackendPool: the pool of a Service that went (or moved) is
// deleted, under the tick's locks like every other pool write.
#[test]
fn the_pool_of_a_service_that_left_is_deleted_whatever_the_assignment_says() {
    let mut q = PoolQueue::default();
    q.enqueue([add("ns/a", "lb1", "ns-a", &["10.0.0.1"]), delete("ns/a", "lb1", "ns-a")]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb2")]));
    assert_eq!(keys(&groups), strings(&["lb1:ns-a"]));
    let g = &groups[0];
    assert!(g.delete && g.add.is_empty() && g.remove.is_empty(), "{g:?}");
    assert_eq!(g.services, strings(&["ns/a"]));
    let report = q.report(0, g.id, &GroupOutcome::Deleted).unwrap();
    assert_eq!(report.disposition, Disposition::Done);
    assert!(report.events.is_empty(), "the Service left the pool: nothing to tell it");
}

#[test]
fn a_service_back_on_a_pool_it_left_makes_the_pool_hold_exactly_what_came_after_the_deletion() {
    let mut q = PoolQueue::default();
    q.enqueue([
        add("ns/a", "lb1", "ns-a", &["10.0.0.1"]),
        delete("ns/a", "lb1", "ns-a"),
        remove("ns/a", "lb1", "ns-a", &["10.0.0.9"]),
        add("ns/a", "lb1", "ns-a", &["10.0.0.2"]),
    ]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    assert!(g.delete, "{g:?}");
    assert_eq!((g.add.clone(), g.remove.clone()), (strings(&["10.0.0.2"]), vec![]));
    let report = q.report(0, g.id, &GroupOutcome::Created).unwrap();
    assert_eq!(report.events.len(), 1);
    assert_eq!(report.events[0].reason, REASON_UPDATED);
    assert!(report.events[0].message.contains("created"), "{:?}", report.events[0]);
}

#[test]
fn removing_a_services_operations_keeps_the_deletion_of_a_pool_it_left() {
    let mut q = PoolQueue::default();
    // Moved lb1 -> lb2, then lb2 -> lb3 before a tick: both old pools go.
    q.enqueue([delete("ns/a", "lb1", "ns-a"), add("ns/a", "lb2", "ns-a", &["10.0.0.1"])]);
    assert_eq!(q.remove_operations("ns/a"), 1, "the add only");
    q.enqueue([delete("ns/a", "lb2", "ns-a"), add("ns/a", "lb3", "ns-a", &["10.0.0.1"])]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb3")]));
    assert_eq!(keys(&groups), strings(&["lb1:ns-a", "lb2:ns-a", "lb3:ns-a"]));
    assert_eq!(groups.iter().map(|g| g.delete).collect::<Vec<_>>(), [true, true, false]);
}

#[test]
fn a_throttled_deletion_is_retried_and_a_failed_one_warns_its_service() {
    let mut q = PoolQueue::new(1);
    q.enqueue([delete("ns/a", "lb1", "ns-a")]);
    let g = q.drain_and_group(0, &[]).remove(0);
    assert_eq!(q.report(0, g.id, &failed(429, None)).unwrap().disposition, Disposition::Requeued);
    let g = q.drain_and_group(0, &[]).remove(0);
    assert!(g.delete);
    let report = q.report(0, g.id, &failed(500, None)).unwrap();
    assert_eq!(report.disposition, Disposition::Abandoned);
    assert_eq!(report.events.iter().map(|e| e.event_type).collect::<Vec<_>>(), [EventType::Warning]);
    assert!(q.is_empty());
}

fn ensure(service: &str, lb: &str, pool: &str) -> PoolOperation {
    op(service, lb, pool, OperationKind::EnsurePool, &["10.0.0.9"])
}

// Upstream's reconcile makes a local Service's pool with its load balancer, before a node
// holds one of its endpoints: an ensure alone gives a group with nothing to add, which the
// host creates empty when Azure lacks the pool; its node IPs are ignored.
#[test]
fn an_ensured_pool_gives_a_group_with_nothing_to_add_and_is_dropped_when_its_service_moved() {
    let mut q = PoolQueue::default();
    q.enqueue([ensure("ns/a", "lb1", "ns-a"), ensure("ns/b", "lb1", "ns-b")]);
    let groups = q.drain_and_group(0, &assign(&[("ns/a", "lb1"), ("ns/b", "lb2")]));
    assert_eq!(keys(&groups), strings(&["lb1:ns-a"]), "ns/b is on lb2 now");
    let g = &groups[0];
    assert!(g.ensure && !g.delete && g.add.is_empty() && g.remove.is_empty(), "{g:?}");
    let report = q.report(0, g.id, &GroupOutcome::Created).unwrap();
    assert_eq!(report.events.len(), 1);
    assert!(report.events[0].message.contains("created"), "{:?}", report.events[0]);
    q.enqueue([ensure("ns/a", "lb1", "ns-a")]);
    assert_eq!(q.remove_operations("ns/a"), 1, "an ensure is cancelled as an add is");
    assert!(q.is_empty());
}

#[test]
fn a_deletion_after_an_ensure_deletes_and_an_ensure_after_a_deletion_keeps_the_pool_empty() {
    let mut q = PoolQueue::default();
    q.enqueue([ensure("ns/a", "lb1", "ns-a"), delete("ns/a", "lb1", "ns-a")]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    assert!(g.delete && !g.ensure && g.add.is_empty(), "the pool goes: {g:?}");
    q.report(0, g.id, &GroupOutcome::Deleted).unwrap();
    q.enqueue([
        add("ns/a", "lb1", "ns-a", &["10.0.0.1"]),
        delete("ns/a", "lb1", "ns-a"),
        ensure("ns/a", "lb1", "ns-a"),
    ]);
    let g = q.drain_and_group(0, &assign(&[("ns/a", "lb1")])).remove(0);
    assert!(g.delete && g.ensure && g.add.is_empty() && g.remove.is_empty(), "kept, emptied: {g:?}");
}
