//! The `backend_pools` target: enqueue / remove / drain-and-group / report / status sequences
//! on the guest's [`PoolQueue`], natively, against a reference model written from the
//! module's documentation (`guest/src/backend_pools.rs`), not from its code.
//!
//! The invariants, as the module states them:
//! * **Conservation of the net change.** A drained group is the net change of the operations
//!   drained for its pool (`<lb>:<pool>`, case-insensitive): for each pool and each IP
//!   (canonical text; a text that is no IP, trimmed), *the last operation naming it decides* —
//!   an add puts it in `add`, a remove in `remove`, never both. Operations of a Service that is
//!   not assigned to the operation's load balancer at the drain are dropped, except a
//!   `delete-pool`, which is kept whatever the assignment; a `delete-pool` forgets every IP named
//!   before it in the group and marks the group `delete` (its `remove` then empty). A pool whose
//!   net change is empty and that deletes nothing gives no group. Groups come out sorted by key, numbered in order, named
//!   as the pool's first drained operation spells them, with their distinct Services in
//!   arrival order.
//! * **One group per pool in flight.** A pool with a group drained and not yet reported is not
//!   drained again: its operations stay queued, behind whatever the report requeues.
//! * **Reports.** 404 drops the group; 409/412/429 requeue its operations at the head (in
//!   arrival order, each retry counted) while the most-retried has retries left, parking the
//!   pool until `Retry-After` (capped at five minutes; the latest park wins), else abandon it
//!   (as every other failure); a requeue of a group whose Services were all removed drops it.
//!   `remove-operations` cancels a Service's queued adds and removes (never a `delete-pool`) and
//!   keeps its drained ones from being requeued; a parked pool with nothing queued is unparked.
//!   `created` tells every Service of the group, `deleted` and `unchanged` none.
//!
//! The model keeps its own queue; every answer of the real one (groups, dispositions,
//! `not-before`, status) must equal the model's.

use crate::input::{Dec, Enc, IPS};
use clb_guest::backend_pools::{
    Disposition, Failure, GroupOutcome, OperationKind, PoolGroup, PoolOperation, PoolQueue, QueueStatus,
    ServiceAssignment,
};
use clb_guest::ip;
use clb_guest::model::Clock;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The most operations of one run.
pub const MAX_OPS: usize = 120;
const SERVICES: &[&str] = &["ns/a", "NS/A", "ns/b", "ns/c"];
const LBS: &[&str] = &["lb1", "LB1", "lb2"];
const POOLS: &[&str] = &["pool1", "POOL1", "pool2"];
const PARK_CAP_MS: u64 = 5 * 60_000;

#[derive(Clone, Debug)]
pub enum PoolOp {
    Enqueue(Vec<PoolOperation>),
    Remove(String),
    Drain(Vec<ServiceAssignment>),
    /// Reports the in-flight group at this index (in drain order), or an unknown id.
    Report(u8, GroupOutcome),
    Status,
    Advance(u64),
    Back(u64),
}

/// Writes what [`decode`] reads back: the retry budget, then the operations.
pub fn encode(max_retries: u32, ops: &[PoolOp]) -> Vec<u8> {
    let mut e = Enc::default();
    e.byte(max_retries.min(4) as u8);
    let ops = &ops[..ops.len().min(MAX_OPS)];
    e.byte(ops.len() as u8);
    for op in ops {
        match op {
            PoolOp::Enqueue(operations) => {
                e.byte(0);
                let n = e.len(operations.len(), 3);
                for o in &operations[..n] {
                    e.text(&o.service);
                    e.text(&o.load_balancer);
                    e.text(&o.pool);
                    // The low bit as before (add 0, remove 1), so older inputs keep their meaning.
                    e.byte(match o.kind {
                        OperationKind::Add => 0,
                        OperationKind::Remove => 1,
                        OperationKind::DeletePool => 3,
                        OperationKind::EnsurePool => 2,
                    });
                    e.texts(&o.node_ips, 4);
                }
            }
            PoolOp::Remove(service) => {
                e.byte(2);
                e.text(service);
            }
            PoolOp::Drain(assignment) => {
                e.byte(3);
                for s in ["ns/a", "ns/b", "ns/c"] {
                    let lb = assignment.iter().find(|a| a.service == s).map(|a| a.load_balancer.as_str());
                    e.byte(match lb.map(|lb| LBS.iter().position(|l| *l == lb)) {
                        Some(Some(i)) => i as u8,
                        _ => 3,
                    });
                }
            }
            PoolOp::Report(index, outcome) => {
                e.byte(4);
                e.byte(*index);
                match outcome {
                    GroupOutcome::Updated => e.byte(0),
                    GroupOutcome::Unchanged => e.byte(1),
                    GroupOutcome::Created => e.byte(4),
                    GroupOutcome::Deleted => e.byte(5),
                    GroupOutcome::Failed(f) => {
                        e.byte(2);
                        e.failure(&wit_failure(f));
                    }
                }
            }
            PoolOp::Status => e.byte(5),
            PoolOp::Advance(ms) => {
                e.byte(6);
                e.u64(*ms);
            }
            PoolOp::Back(ms) => {
                e.byte(7);
                e.u64(*ms);
            }
        }
    }
    e.bytes
}

fn wit_failure(f: &Failure) -> clb_sandbox::bindings::clb::reconciler::types::Failure {
    clb_sandbox::bindings::clb::reconciler::types::Failure {
        status: f.status,
        code: f.code.clone(),
        retry_after_ms: f.retry_after_ms,
        message: f.message.clone(),
    }
}

fn decode(d: &mut Dec<'_>) -> (u32, Vec<PoolOp>) {
    let max_retries = u32::from(d.byte() % 5);
    let mut ops = Vec::new();
    let count = d.below(MAX_OPS + 1);
    for _ in 0..count {
        if d.is_empty() {
            break;
        }
        let op = match d.byte() % 8 {
            0 | 1 => PoolOp::Enqueue(
                (0..d.len(3))
                    .map(|_| PoolOperation {
                        service: d.text(SERVICES),
                        load_balancer: d.text(LBS),
                        pool: d.text(POOLS),
                        kind: match d.byte() % 4 {
                            3 => OperationKind::DeletePool,
                            2 => OperationKind::EnsurePool,
                            1 => OperationKind::Remove,
                            _ => OperationKind::Add,
                        },
                        node_ips: d.texts(IPS, 4),
                    })
                    .collect(),
            ),
            2 => PoolOp::Remove(d.text(SERVICES)),
            3 => PoolOp::Drain(
                ["ns/a", "ns/b", "ns/c"]
                    .iter()
                    .filter_map(|s| {
                        let lb = d.byte();
                        (lb % 4 != 3).then(|| ServiceAssignment {
                            service: (*s).into(),
                            load_balancer: LBS[usize::from(lb % 4).min(LBS.len() - 1)].into(),
                        })
                    })
                    .collect(),
            ),
            4 => PoolOp::Report(
                d.byte(),
                match d.byte() % 8 {
                    0 => GroupOutcome::Updated,
                    1 => GroupOutcome::Unchanged,
                    4 => GroupOutcome::Created,
                    5 => GroupOutcome::Deleted,
                    _ => {
                        let f = d.failure();
                        GroupOutcome::Failed(Failure {
                            status: f.status,
                            code: f.code,
                            retry_after_ms: f.retry_after_ms,
                            message: f.message,
                        })
                    }
                },
            ),
            5 => PoolOp::Status,
            6 => PoolOp::Advance(d.u64()),
            _ => PoolOp::Back(d.u64()),
        };
        ops.push(op);
    }
    (max_retries, ops)
}

/// The fuzz target.
pub fn backend_pools(data: &[u8]) {
    let (max_retries, ops) = decode(&mut Dec::new(data));
    let mut real = PoolQueue::new(max_retries);
    let mut model = Model::new(max_retries);
    let mut now: u64 = 1_700_000_000_000;
    // Drained groups not reported yet, in drain order: id → key.
    let mut drained: Vec<(u64, String)> = Vec::new();
    for op in &ops {
        match op {
            PoolOp::Enqueue(operations) => {
                real.enqueue(operations.clone());
                model.enqueue(operations);
            }
            PoolOp::Remove(service) => {
                assert_eq!(real.remove_operations(service), model.remove(service), "remove-operations count");
            }
            PoolOp::Drain(assignment) => {
                let groups = real.drain_and_group(now, assignment);
                let in_flight: BTreeSet<&str> = drained.iter().map(|(_, k)| k.as_str()).collect();
                for g in &groups {
                    let key = key(&g.load_balancer, &g.pool);
                    assert!(!in_flight.contains(key.as_str()), "pool {key} drained again with a group in flight");
                    assert!(g.add.iter().all(|a| !g.remove.contains(a)), "an IP both added and removed: {g:?}");
                    assert!(!g.delete || g.remove.is_empty(), "a deleting group removes nothing: {g:?}");
                    assert!(g.add.windows(2).all(|w| w[0] < w[1]) && g.remove.windows(2).all(|w| w[0] < w[1]));
                }
                let expected = model.drain(now, assignment);
                assert_eq!(groups, expected, "drain-and-group at {now}");
                drained.extend(groups.iter().map(|g| (g.id, key(&g.load_balancer, &g.pool))));
            }
            PoolOp::Report(index, outcome) => {
                let id = if drained.is_empty() || index % 8 == 7 {
                    u64::from(*index) + 1_000_000 // never drained
                } else {
                    drained.remove(usize::from(*index) % drained.len()).0
                };
                let report = real.report(now, id, outcome);
                let expected = model.report(now, id, outcome);
                assert_eq!(
                    report.as_ref().map(|r| (r.disposition, r.not_before_ms, r.events.len())),
                    expected,
                    "report of group {id} at {now}: {outcome:?}"
                );
            }
            PoolOp::Status => assert_eq!(real.status(now), model.status(now), "status at {now}"),
            PoolOp::Advance(ms) => now = now.saturating_add(*ms),
            PoolOp::Back(ms) => now = now.saturating_sub(*ms),
        }
        assert_eq!((real.len(), real.in_flight()), (model.queue.len(), model.in_flight.len()), "after {op:?}");
    }
}

fn key(lb: &str, pool: &str) -> String {
    format!("{}:{}", lb.to_ascii_lowercase(), pool.to_ascii_lowercase())
}

fn canonical(text: &str) -> String {
    ip::canonical(text).map(|(c, _)| String::from(c)).unwrap_or_else(|| text.trim().to_owned())
}

#[derive(Clone)]
struct Queued {
    op: PoolOperation,
    retries: u32,
}

struct Flight {
    lb: String,
    pool: String,
    key: String,
    services: Vec<String>,
    ops: Vec<Queued>,
}

/// The reference queue.
struct Model {
    max_retries: u32,
    queue: VecDeque<Queued>,
    /// key → parked until (queue time).
    parked: BTreeMap<String, u64>,
    in_flight: BTreeMap<u64, Flight>,
    next: u64,
    clock: Clock,
}

impl Model {
    fn new(max_retries: u32) -> Self {
        Self {
            max_retries,
            queue: VecDeque::new(),
            parked: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            next: 1,
            clock: Clock::default(),
        }
    }

    fn enqueue(&mut self, ops: &[PoolOperation]) {
        self.queue.extend(ops.iter().map(|op| Queued { op: op.clone(), retries: 0 }));
    }

    fn remove(&mut self, service: &str) -> usize {
        let cancels = |q: &Queued| q.op.kind != OperationKind::DeletePool && q.op.service.eq_ignore_ascii_case(service);
        let before = self.queue.len();
        self.queue.retain(|q| !cancels(q));
        for f in self.in_flight.values_mut() {
            f.ops.retain(|q| !cancels(q));
        }
        let queued: BTreeSet<String> = self.queue.iter().map(|q| key(&q.op.load_balancer, &q.op.pool)).collect();
        self.parked.retain(|k, _| queued.contains(k));
        before - self.queue.len()
    }

    fn blocked(&self, key: &str, now: u64) -> bool {
        self.parked.get(key).is_some_and(|&until| until > now) || self.in_flight.values().any(|f| f.key == key)
    }

    fn drain(&mut self, host_now: u64, assignment: &[ServiceAssignment]) -> Vec<PoolGroup> {
        let now = self.clock.read(host_now);
        self.parked.retain(|_, until| *until > now);
        let assigned: BTreeMap<String, String> =
            assignment.iter().map(|a| (a.service.to_ascii_lowercase(), a.load_balancer.to_ascii_lowercase())).collect();
        // key → the operations drained for it, in arrival order.
        let mut taken: BTreeMap<String, Vec<Queued>> = BTreeMap::new();
        let mut kept = VecDeque::new();
        for q in std::mem::take(&mut self.queue) {
            let k = key(&q.op.load_balancer, &q.op.pool);
            if self.blocked(&k, now) {
                kept.push_back(q);
                continue;
            }
            if q.op.kind != OperationKind::DeletePool
                && assigned.get(&q.op.service.to_ascii_lowercase()) != Some(&q.op.load_balancer.to_ascii_lowercase())
            {
                continue;
            }
            taken.entry(k).or_default().push(q);
        }
        self.queue = kept;
        let mut groups = Vec::new();
        for (k, ops) in taken {
            // The last operation naming an IP decides.
            let mut last: BTreeMap<String, OperationKind> = BTreeMap::new();
            let (mut delete, mut ensure) = (false, false);
            for q in &ops {
                match q.op.kind {
                    OperationKind::DeletePool => {
                        last.clear();
                        (delete, ensure) = (true, false);
                    }
                    OperationKind::EnsurePool => ensure = true,
                    OperationKind::Add | OperationKind::Remove => {
                        for address in &q.op.node_ips {
                            last.insert(canonical(address), q.op.kind);
                        }
                    }
                }
            }
            if last.is_empty() && !delete && !ensure {
                continue;
            }
            let mut services: Vec<String> = Vec::new();
            for q in &ops {
                if !services.iter().any(|s| s.eq_ignore_ascii_case(&q.op.service)) {
                    services.push(q.op.service.clone());
                }
            }
            let id = self.next;
            self.next += 1;
            let pick = |kind| last.iter().filter(|(_, k)| **k == kind).map(|(ip, _)| ip.clone()).collect();
            let group = PoolGroup {
                id,
                load_balancer: ops[0].op.load_balancer.clone(),
                pool: ops[0].op.pool.clone(),
                add: pick(OperationKind::Add),
                remove: if delete { Vec::new() } else { pick(OperationKind::Remove) },
                services: services.clone(),
                delete,
                ensure,
            };
            self.in_flight.insert(
                id,
                Flight { lb: group.load_balancer.clone(), pool: group.pool.clone(), key: k, services, ops },
            );
            groups.push(group);
        }
        groups
    }

    /// `(disposition, not-before, how many Events)`.
    fn report(&mut self, host_now: u64, id: u64, outcome: &GroupOutcome) -> Option<(Disposition, Option<u64>, usize)> {
        let now = self.clock.read(host_now);
        let flight = self.in_flight.remove(&id)?;
        let _ = (&flight.lb, &flight.pool);
        let every = flight.services.len();
        Some(match outcome {
            GroupOutcome::Updated | GroupOutcome::Created => (Disposition::Done, None, every),
            GroupOutcome::Unchanged | GroupOutcome::Deleted => (Disposition::Done, None, 0),
            GroupOutcome::Failed(f) => match f.status {
                404 => (Disposition::Dropped, None, 0),
                409 | 412 | 429 => {
                    let spent = flight.ops.iter().map(|q| q.retries).max().unwrap_or(0);
                    if flight.ops.is_empty() {
                        (Disposition::Dropped, None, 0)
                    } else if spent < self.max_retries {
                        let until = now.saturating_add(f.retry_after_ms.unwrap_or(0).min(PARK_CAP_MS));
                        let parked = self.parked.entry(flight.key.clone()).or_insert(until);
                        *parked = (*parked).max(until);
                        for q in flight.ops.iter().rev() {
                            self.queue.push_front(Queued { op: q.op.clone(), retries: q.retries.saturating_add(1) });
                        }
                        (Disposition::Requeued, Some(self.clock.to_host(until)), every)
                    } else {
                        (Disposition::Abandoned, None, every)
                    }
                }
                _ => (Disposition::Abandoned, None, every),
            },
        })
    }

    fn status(&self, host_now: u64) -> QueueStatus {
        let mut clock = self.clock;
        let now = clock.read(host_now);
        QueueStatus {
            queued: u32::try_from(self.queue.len()).unwrap_or(u32::MAX),
            ready: self.queue.iter().any(|q| !self.blocked(&key(&q.op.load_balancer, &q.op.pool), now)),
            wake_at_ms: self.parked.values().copied().filter(|&u| u > now).min().map(|at| clock.to_host(at)),
        }
    }
}
