//! The backend-pool updater's queue, grouping and retry policy (multi-SLB local-service mode;
//! docs/upstream.md §e, PR #10328, improved as docs/design.md §5 and docs/upstream.md §i.3 say).
//!
//! Producers [`PoolQueue::enqueue`] node-IP changes for a Service's pool, and the deletion of a
//! pool its Service left (upstream's `cleanupLocalServiceBackendPool`, under the same locks as
//! every other pool write); a reconcile that moves a Service off a load balancer calls
//! [`PoolQueue::remove_operations`]. The host's tick, after
//! taking the service reconcile lock and the Azure resource lease, calls
//! [`PoolQueue::drain_and_group`] with the Service→LB assignment the last reconcile wrote, writes
//! each group's pool, and hands every outcome back through [`PoolQueue::report`].
//!
//! Improvements over upstream, each on purpose:
//! * a group is the **net IP change** of its operations (for each IP the last operation naming
//!   it decides), so add/remove pairs cost nothing and the host writes a pool only when the
//!   change is not already there (docs/upstream.md §i.3 item 5, the direction of PR #10730);
//! * groups come out sorted by key, not in map order (docs/upstream.md §i.3 item 6);
//! * the order of operations per pool is kept across retries: a pool with a group in flight
//!   (drained, not yet reported) is not drained again until that group is reported, so an
//!   operation requeued by the report stays ahead of everything queued for its pool since;
//! * failures are classified (404 stale ⇒ dropped silently; 409/412/429 ⇒ requeued at the head
//!   with a bounded budget, the pool parked until `Retry-After`; anything else ⇒ abandoned)
//!   instead of all dropped (docs/upstream.md §i.3 item 1, DOC-10417);
//! * Events go to every distinct Service of a group, not only the first (docs/upstream.md §i.3 item 2).
//!
//! Service names, load balancer names and pool names compare case-insensitively, as Kubernetes
//! keys in upstream's map and ARM names do; IPs compare in canonical text.

use crate::ip;
use crate::keyed::{Map, Set};
use crate::model::Clock;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Event reason when a group's pool was written.
pub const REASON_UPDATED: &str = "LoadBalancerBackendPoolUpdated";
/// Event reason when a group failed and was requeued.
pub const REASON_RETRYING: &str = "LoadBalancerBackendPoolUpdateRetrying";
/// Event reason when a group failed for good.
pub const REASON_FAILED: &str = "LoadBalancerBackendPoolUpdateFailed";
/// The default retry budget (upstream's `loadBalancerBackendPoolUpdateMaxRetries`, DOC-10417).
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// The longest a pool stays parked after a `Retry-After`: five minutes, the tracker's resync
/// period (`tracker::timing::RETRY_AFTER_CAP_MS`, the same policy). A longer
/// `Retry-After` is wrong or misread (the host turns one of ~1.8e16 s or more into `u64::MAX`)
/// and would hold the pool's node IPs indefinitely; a capped one says so in the
/// `LoadBalancerBackendPoolUpdateRetrying` Event.
pub const MAX_RETRY_AFTER_MS: u64 = 5 * 60_000;

/// Whether an operation puts node IPs into a pool, takes them out of it, or deletes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationKind {
    Add,
    Remove,
    /// The Service left the pool: it goes. Kept whatever the assignment says, and not
    /// cancelled by [`PoolQueue::remove_operations`].
    DeletePool,
    /// The Service is on the load balancer: its pool exists afterwards, created empty when Azure
    /// lacks it (upstream's reconcile makes a local Service's pool before it has a node). Like
    /// an add, dropped when the assignment says otherwise and cancelled by `remove_operations`.
    EnsurePool,
}

/// One change a producer wants made to one Service's backend pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolOperation {
    /// `namespace/name`.
    pub service: String,
    pub load_balancer: String,
    pub pool: String,
    pub kind: OperationKind,
    pub node_ips: Vec<String>,
}

/// Where one local Service lives now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAssignment {
    pub service: String,
    pub load_balancer: String,
}

/// The net change one pool should undergo, and who asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGroup {
    pub id: u64,
    pub load_balancer: String,
    pub pool: String,
    /// Canonical IPs the pool must hold afterwards, sorted.
    pub add: Vec<String>,
    /// Canonical IPs the pool must not hold afterwards, sorted, disjoint from `add`.
    pub remove: Vec<String>,
    /// Distinct Services, in arrival order, as first spelled.
    pub services: Vec<String>,
    /// A [`OperationKind::DeletePool`] is in the group: with `add` empty (and no `ensure`) the
    /// pool goes, else it is made to hold exactly `add` (and `remove` is empty).
    pub delete: bool,
    /// An [`OperationKind::EnsurePool`] came after the group's last deletion: the pool exists
    /// afterwards, created (holding `add`) when missing.
    pub ensure: bool,
}

/// How full the queue is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueStatus {
    pub queued: u32,
    pub ready: bool,
    pub wake_at_ms: Option<u64>,
}

/// Why the host's GET or PUT failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// HTTP status; 0 when no answer arrived.
    pub status: u16,
    pub code: Option<String>,
    pub retry_after_ms: Option<u64>,
    pub message: String,
}

/// What the host did with one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupOutcome {
    Updated,
    /// The pool did not exist and was created.
    Created,
    /// The pool was deleted.
    Deleted,
    Unchanged,
    Failed(Failure),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An Event for one Service (`namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEvent {
    pub service: String,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
}

/// What became of a reported group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    Done,
    Dropped,
    Requeued,
    Abandoned,
}

/// The answer to [`PoolQueue::report`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupReport {
    pub disposition: Disposition,
    pub not_before_ms: Option<u64>,
    pub events: Vec<ServiceEvent>,
}

/// How a failure is treated, by status (DOC-10417's classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// The pool is gone: nothing to write any more.
    Stale,
    /// Someone else wrote first, or ARM throttled us: the same change can succeed later.
    Retriable,
    /// Retrying the same request will not help (or no answer arrived and the outcome is
    /// unknown: the next producer change re-derives the pool, so the guest does not guess).
    Terminal,
}

/// The class of a failure.
pub fn classify(failure: &Failure) -> FailureClass {
    match failure.status {
        404 => FailureClass::Stale,
        409 | 412 | 429 => FailureClass::Retriable,
        _ => FailureClass::Terminal,
    }
}

/// A queued operation with its retry history.
#[derive(Clone, Debug)]
struct Queued {
    op: PoolOperation,
    /// Lower-cased `<lb>:<pool>`, computed once.
    key: String,
    /// Retries already spent on it.
    retries: u32,
}

/// A drained group waiting for its outcome.
#[derive(Debug)]
struct InFlight {
    load_balancer: String,
    pool: String,
    key: String,
    services: Vec<String>,
    /// The operations behind it, in arrival order, for a requeue.
    ops: Vec<Queued>,
}

/// The queue, the parked pools and the groups in flight.
#[derive(Debug)]
pub struct PoolQueue {
    max_retries: u32,
    queue: VecDeque<Queued>,
    /// Pools whose operations stay queued until the time given (from `Retry-After`).
    parked: Map<String, u64>,
    in_flight: Map<u64, InFlight>,
    next_group: u64,
    /// The queue's time: the host's `now-ms`, monotonic ([`Clock`]); `parked` is in it, so a
    /// step back of the host's clock does not stretch a park.
    clock: Clock,
}

impl Default for PoolQueue {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RETRIES)
    }
}

fn group_key(load_balancer: &str, pool: &str) -> String {
    format!("{}:{}", load_balancer.to_ascii_lowercase(), pool.to_ascii_lowercase())
}

/// Canonical IP text, or the trimmed text when it is not an IP: the host's PUT refuses it then,
/// which reports the mistake instead of silently losing the operation.
fn canonical_ip(text: &str) -> String {
    ip::canonical(text).map(|(c, _)| String::from(c)).unwrap_or_else(|| text.trim().to_owned())
}

impl PoolQueue {
    /// An empty queue; a failed group is retried at most `max_retries` times.
    pub fn new(max_retries: u32) -> Self {
        Self {
            max_retries,
            queue: VecDeque::new(),
            parked: Map::new(),
            in_flight: Map::new(),
            next_group: 1,
            clock: Clock::default(),
        }
    }

    /// Queued operations (upstream `countOperations`), parked ones included.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Groups drained but not yet reported.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Appends operations in arrival order.
    pub fn enqueue(&mut self, operations: impl IntoIterator<Item = PoolOperation>) {
        self.queue.extend(operations.into_iter().map(|op| Queued {
            key: group_key(&op.load_balancer, &op.pool),
            op,
            retries: 0,
        }));
    }

    /// Cancels every queued add, remove and ensure of `service` and keeps drained ones of it from
    /// being requeued; returns how many queued operations were removed. Its pool deletions stay:
    /// the pools it left still go (a move calls this and then queues the deletion of the old pool,
    /// and a second move must not cancel the first one's).
    pub fn remove_operations(&mut self, service: &str) -> usize {
        let cancelled =
            |q: &Queued| q.op.kind != OperationKind::DeletePool && q.op.service.eq_ignore_ascii_case(service);
        let before = self.queue.len();
        self.queue.retain(|q| !cancelled(q));
        for group in self.in_flight.values_mut() {
            group.ops.retain(|q| !cancelled(q));
        }
        // A parked pool with nothing left to wait for must not keep a wake-up alive.
        let keys: Set<&str> = self.queue.iter().map(|q| q.key.as_str()).collect();
        self.parked.retain(|k, _| keys.contains(k.as_str()));
        before - self.queue.len()
    }

    fn is_parked(&self, key: &str, now_ms: u64) -> bool {
        self.parked.get(key).is_some_and(|&until| until > now_ms)
    }

    /// The pools with a group drained and not yet reported (a handful: the groups of one tick).
    fn pools_in_flight(&self) -> Set<&str> {
        self.in_flight.values().map(|f| f.key.as_str()).collect()
    }

    /// How full the queue is at `now_ms`; stops at the first drainable operation. An operation
    /// of a pool with a group in flight is not drainable: the report of that group makes it so.
    pub fn status(&self, now_ms: u64) -> QueueStatus {
        let mut clock = self.clock; // as a call now would leave it, without changing it
        let now = clock.read(now_ms);
        let in_flight = self.pools_in_flight();
        QueueStatus {
            queued: u32::try_from(self.queue.len()).unwrap_or(u32::MAX),
            ready: self.queue.iter().any(|q| !self.is_parked(&q.key, now) && !in_flight.contains(q.key.as_str())),
            wake_at_ms: self.parked.values().copied().filter(|&until| until > now).min().map(|at| clock.to_host(at)),
        }
    }

    /// Takes every operation whose pool is neither parked nor has a group in flight, keeps the
    /// adds, removes and ensures whose Service is still assigned to the operation's load balancer
    /// (and every pool deletion), and returns one group per pool, sorted by key.
    ///
    /// A pool with a group drained and not yet [reported](Self::report) keeps its operations
    /// queued: were they drained now, a requeue of the group in flight (409/412/429) would put
    /// its older operations back at the head and a later drain would apply them after these
    /// newer ones (an add of X, then a remove of X, written as add X). Held back, they drain
    /// after the report, behind whatever it requeued, so per pool the last operation still wins.
    /// The host reports every group it drained (`PoolUpdater` does so in the same tick); a
    /// group never reported holds its pool's later operations.
    pub fn drain_and_group(&mut self, now_ms: u64, assignment: &[ServiceAssignment]) -> Vec<PoolGroup> {
        let now = self.clock.read(now_ms);
        self.parked.retain(|_, until| *until > now);
        // Owned: the groups drained below go in flight while this set is read.
        let in_flight: Set<String> = self.in_flight.values().map(|f| f.key.clone()).collect();
        let assigned: Map<String, String> = Map::from_iter(
            assignment.iter().map(|a| (a.service.to_ascii_lowercase(), a.load_balancer.to_ascii_lowercase())),
        );

        struct Building {
            first: Queued,
            ops: Vec<Queued>,
            // canonical IP → present afterwards; the last operation naming it wins.
            net: Map<String, bool>,
            services: Vec<String>,
            seen: Set<String>,
            delete: bool,
            ensure: bool,
        }
        let mut groups: Map<String, Building> = Map::new();
        let mut kept = VecDeque::new();
        for queued in std::mem::take(&mut self.queue) {
            if self.parked.contains_key(&queued.key) || in_flight.contains(&queued.key) {
                kept.push_back(queued);
                continue;
            }
            // Upstream `groupOperations`: not a local Service any more, or moved to another
            // load balancer ⇒ dropped; the reconcile that changed it re-derives its pools. A
            // deletion is what that change asked for, so it stays.
            let service = queued.op.service.to_ascii_lowercase();
            let deletes = queued.op.kind == OperationKind::DeletePool;
            match assigned.get(&service) {
                _ if deletes => {}
                Some(lb) if lb.eq_ignore_ascii_case(&queued.op.load_balancer) => {}
                _ => continue,
            }
            let building = groups.entry(queued.key.clone()).or_insert_with(|| Building {
                first: queued.clone(),
                ops: Vec::new(),
                net: Map::new(),
                services: Vec::new(),
                seen: Set::new(),
                delete: false,
                ensure: false,
            });
            if deletes {
                // What came before no longer counts: the pool goes, or holds only what comes after.
                building.net.clear();
                building.delete = true;
                building.ensure = false;
            } else if queued.op.kind == OperationKind::EnsurePool {
                building.ensure = true;
            } else {
                let present = queued.op.kind == OperationKind::Add;
                for address in &queued.op.node_ips {
                    building.net.insert(canonical_ip(address), present);
                }
            }
            if building.seen.insert(service) {
                building.services.push(queued.op.service.clone());
            }
            building.ops.push(queued);
        }
        self.queue = kept;

        let mut out = Vec::with_capacity(groups.len());
        for (key, building) in groups {
            if building.net.is_empty() && !building.delete && !building.ensure {
                continue;
            }
            let (add, mut remove): (Vec<_>, Vec<_>) = building.net.into_iter().partition(|(_, present)| *present);
            if building.delete {
                // The pool goes or is replaced: nothing in it is left to take out.
                remove.clear();
            }
            let id = self.next_group;
            self.next_group += 1;
            let group = PoolGroup {
                id,
                load_balancer: building.first.op.load_balancer.clone(),
                pool: building.first.op.pool.clone(),
                add: add.into_iter().map(|(ip, _)| ip).collect(),
                remove: remove.into_iter().map(|(ip, _)| ip).collect(),
                services: building.services.clone(),
                delete: building.delete,
                ensure: building.ensure,
            };
            self.in_flight.insert(
                id,
                InFlight {
                    load_balancer: group.load_balancer.clone(),
                    pool: group.pool.clone(),
                    key,
                    services: building.services,
                    ops: building.ops,
                },
            );
            out.push(group);
        }
        out
    }

    /// The outcome of a drained group; `None` when the id is unknown or already reported.
    pub fn report(&mut self, now_ms: u64, group: u64, outcome: &GroupOutcome) -> Option<GroupReport> {
        let now = self.clock.read(now_ms);
        let flight = self.in_flight.remove(&group)?;
        let pool = format!("{}/{}", flight.load_balancer, flight.pool);
        let events = |event_type, reason: &str, message: String| -> Vec<ServiceEvent> {
            flight
                .services
                .iter()
                .map(|service| ServiceEvent {
                    service: service.clone(),
                    event_type,
                    reason: reason.to_owned(),
                    message: message.clone(),
                })
                .collect()
        };
        let report = match outcome {
            GroupOutcome::Updated => GroupReport {
                disposition: Disposition::Done,
                not_before_ms: None,
                events: events(EventType::Normal, REASON_UPDATED, format!("backend pool {pool} updated")),
            },
            GroupOutcome::Created => GroupReport {
                disposition: Disposition::Done,
                not_before_ms: None,
                events: events(EventType::Normal, REASON_UPDATED, format!("backend pool {pool} created")),
            },
            // Its Services left it: nothing to tell them.
            GroupOutcome::Deleted | GroupOutcome::Unchanged => {
                GroupReport { disposition: Disposition::Done, not_before_ms: None, events: vec![] }
            }
            GroupOutcome::Failed(failure) => match classify(failure) {
                // Upstream: "backend pool not found" ⇒ dropped without an Event.
                FailureClass::Stale => {
                    GroupReport { disposition: Disposition::Dropped, not_before_ms: None, events: vec![] }
                }
                FailureClass::Retriable if !flight.ops.is_empty() && spent(&flight.ops) < self.max_retries => {
                    let asked = failure.retry_after_ms.unwrap_or(0);
                    let not_before = now.saturating_add(asked.min(MAX_RETRY_AFTER_MS));
                    let capped = if asked > MAX_RETRY_AFTER_MS {
                        format!(" (Retry-After of {asked} ms capped at {MAX_RETRY_AFTER_MS} ms)")
                    } else {
                        String::new()
                    };
                    let parked = self.parked.entry(flight.key.clone()).or_insert(not_before);
                    *parked = (*parked).max(not_before);
                    // Back at the head, in arrival order: older than anything queued since.
                    for mut queued in flight.ops.iter().rev().cloned() {
                        queued.retries = queued.retries.saturating_add(1);
                        self.queue.push_front(queued);
                    }
                    GroupReport {
                        disposition: Disposition::Requeued,
                        not_before_ms: Some(self.clock.to_host(not_before)),
                        events: events(
                            EventType::Normal,
                            REASON_RETRYING,
                            format!(
                                "updating backend pool {pool} failed with HTTP {}, retrying (attempt {} of {}){capped}: {}",
                                failure.status,
                                spent(&flight.ops).saturating_add(1),
                                self.max_retries,
                                failure.message
                            ),
                        ),
                    }
                }
                // Every Service of a retriable group was cancelled meanwhile: nothing to retry.
                FailureClass::Retriable if flight.ops.is_empty() => {
                    GroupReport { disposition: Disposition::Dropped, not_before_ms: None, events: vec![] }
                }
                FailureClass::Retriable | FailureClass::Terminal => GroupReport {
                    disposition: Disposition::Abandoned,
                    not_before_ms: None,
                    events: events(
                        EventType::Warning,
                        REASON_FAILED,
                        format!(
                            "updating backend pool {pool} failed with HTTP {}: {}",
                            failure.status, failure.message
                        ),
                    ),
                },
            },
        };
        Some(report)
    }
}

/// Retries already spent on a group: its most-retried operation's count.
fn spent(ops: &[Queued]) -> u32 {
    ops.iter().map(|q| q.retries).max().unwrap_or(0)
}

// By path, so that it resolves the same where `tests/next-guest` includes this file by path.
#[cfg(test)]
#[path = "backend_pools/tests.rs"]
mod tests;
